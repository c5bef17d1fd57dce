//! Shared by the host's tests: a throwaway self-signed certificate and a quiche config.
#![allow(dead_code)]

use std::path::PathBuf;

/// The tests' ALPN.
pub const ALPN: &[&[u8]] = &[b"udpx-test"];

/// A self-signed certificate for `localhost` in a temp directory of its own, removed on drop.
pub struct TempCert {
    pub dir: PathBuf,
    pub cert: String,
    pub key: String,
}

impl TempCert {
    pub fn new(test: &str) -> TempCert {
        // Unique per call: tests of one binary run at once and may share a tag.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("udpx-quic-{test}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
        TempCert { cert: cert.to_str().unwrap().to_owned(), key: key.to_str().unwrap().to_owned(), dir }
    }

    pub fn pem(&self) -> (&str, &str) {
        (&self.cert, &self.key)
    }
}

impl Drop for TempCert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A config for the tests: the certificate when serving, no peer verification, 1 MiB windows
/// (16 MiB with `big_windows`), 10 bidirectional streams.
pub fn quiche_config(pem: Option<(&str, &str)>, big_windows: bool) -> quiche::Config {
    let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    if let Some((cert, key)) = pem {
        c.load_cert_chain_from_pem_file(cert).unwrap();
        c.load_priv_key_from_pem_file(key).unwrap();
    }
    let w = if big_windows { 1 << 24 } else { 1 << 20 };
    c.verify_peer(false);
    c.set_application_protos(ALPN).unwrap();
    c.set_max_idle_timeout(if big_windows { 10_000 } else { 5_000 });
    c.set_initial_max_data(w);
    c.set_initial_max_stream_data_bidi_local(w);
    c.set_initial_max_stream_data_bidi_remote(w);
    c.set_initial_max_streams_bidi(10);
    c
}

/// An application that does nothing with its connections.
pub struct Quiet;

impl udpx_quic::App for Quiet {
    type State = ();
    fn accepted(&mut self, _: &udpx_quic::Connection) {}
    fn on_turn(&mut self, _: &mut udpx_quic::Connection, _: &mut ()) {}
    fn closed(&mut self, _: &udpx_quic::Connection, _: ()) {}
}

/// Server: answers a request on stream 0 with this many bytes of 0x42 and FIN.
pub struct Sender(pub usize);

impl udpx_quic::App for Sender {
    /// Bytes of the body written so far (`None`: no request yet).
    type State = Option<usize>;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> Option<usize> {
        None
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, sent: &mut Option<usize>) {
        let mut buf = [0u8; 64];
        while let Ok((_, _)) = conn.stream_recv(0, &mut buf) {
            sent.get_or_insert(0);
        }
        let Some(n) = sent.as_mut() else { return };
        let chunk = [0x42u8; 16 * 1024];
        while *n < self.0 {
            let len = chunk.len().min(self.0 - *n);
            match conn.stream_send(0, &chunk[..len], *n + len == self.0) {
                Ok(w) => *n += w,
                Err(_) => break,
            }
        }
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: Option<usize>) {}
}
