//! Certificates and the quiche configurations of both ends.
//!
//! quiche (BoringSSL) loads PEM files by path, so a generated certificate is written to a
//! private temporary directory, loaded into every shard's configuration at start, and the
//! directory removed right after.

use std::path::{Path, PathBuf};

use crate::Error;

/// The largest UDP payload either end sends by default (quiche's `max_send_udp_payload_size`):
/// an Ethernet MTU of 1500 less the IPv6 and UDP headers, which fits both families on common
/// paths.
pub const DEFAULT_MAX_UDP_PAYLOAD: usize = 1452;

/// Where the server's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    /// PEM files: the certificate chain and its private key.
    Files {
        /// Certificate chain (PEM).
        cert: PathBuf,
        /// Private key (PEM).
        key: PathBuf,
    },
    /// A self-signed certificate for `localhost`, 127.0.0.1 and ::1, made at start (rcgen):
    /// for local use; clients must not verify it.
    SelfSigned,
}

/// A client's flow-control windows: what a download needs (`h3 get`, `h3 load`).
pub(crate) const MAX_DATA: u64 = 32 << 20;
pub(crate) const STREAM_WINDOW: u64 = 8 << 20;
/// The idle timeout both ends advertise, ms.
pub const IDLE_TIMEOUT_MS: u64 = 30_000;

/// The largest request field section the server reads (quiche's SETTINGS_MAX_FIELD_SECTION_SIZE;
/// nginx reads 4 x 8 KiB of HTTP/1.1 header lines by default).
pub const MAX_FIELD_SECTION: u64 = 16 << 10;
/// The flow-control credit the server gives a request stream: a HEADERS frame of the largest
/// field section (quiche takes up to 1.5 times it, for Huffman coding) and its frame header,
/// and room for trailers. The server reads no request body it keeps (a body is read and
/// dropped, so the credit comes back as it is read).
pub const REQUEST_WINDOW: u64 = 32 << 10;
/// The server's connection-level credit, over every stream the peer opens (request streams,
/// its control and QPACK streams): what a peer can make the server buffer out of order on one
/// connection. Requests are a few hundred bytes each (QPACK); quiche gives credit back as the
/// server reads them, and never grows the window past this (`set_max_connection_window`).
pub const CONNECTION_WINDOW: u64 = 64 << 10;

/// PEM files to load, and a directory to remove once they are loaded.
#[derive(Debug)]
pub(crate) struct PemFiles {
    /// Where every configuration loads them from: a private copy made by one read of each
    /// given file (so every shard, and the TCP listener, get the same bytes even while the
    /// files are being replaced), or the generated ones.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// What to call them in messages: the files given.
    pub cert_name: PathBuf,
    pub key_name: PathBuf,
    pub temp_dir: Option<PathBuf>,
}

impl Drop for PemFiles {
    fn drop(&mut self) {
        if let Some(d) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The files of `tls`, each read once into a private copy, or the generated ones. Prints
/// nothing; the caller says that it generated one.
pub(crate) fn pem_files(tls: &Tls) -> Result<PemFiles, Error> {
    match tls {
        Tls::Files { cert, key } => {
            let read = |what: &str, p: &Path| {
                std::fs::read(p).map_err(|e| Error::Usage(format!("{what} file {}: {e}", p.display())))
            };
            let (cert_pem, key_pem) = (read("certificate", cert)?, read("key", key)?);
            let dir = private_temp_dir()?;
            let files = PemFiles {
                cert: dir.join("cert.pem"),
                key: dir.join("key.pem"),
                cert_name: cert.clone(),
                key_name: key.clone(),
                temp_dir: Some(dir),
            };
            std::fs::write(&files.cert, cert_pem).map_err(Error::Io)?;
            std::fs::write(&files.key, key_pem).map_err(Error::Io)?;
            Ok(files)
        }
        Tls::SelfSigned => {
            let names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
            let ck = rcgen::generate_simple_self_signed(names)
                .map_err(|e| Error::Tls(format!("generating a self-signed certificate: {e}")))?;
            let dir = private_temp_dir()?;
            let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
            let files =
                PemFiles { cert: cert.clone(), key: key.clone(), cert_name: cert, key_name: key, temp_dir: Some(dir) };
            std::fs::write(&files.cert, ck.cert.pem()).map_err(Error::Io)?;
            std::fs::write(&files.key, ck.key_pair.serialize_pem()).map_err(Error::Io)?;
            Ok(files)
        }
    }
}

fn private_temp_dir() -> Result<PathBuf, Error> {
    use std::os::unix::fs::DirBuilderExt;
    let mut nonce = [0u8; 8];
    udpx_quic::cid::random_bytes(&mut nonce).map_err(Error::Io)?;
    let dir =
        std::env::temp_dir().join(format!("udpx-h3-cert-{}-{:016x}", std::process::id(), u64::from_ne_bytes(nonce)));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(Error::Io)?;
    Ok(dir)
}

/// Request streams a client may have open at once on one connection.
pub const MAX_STREAMS: u64 = 100;

/// What both ends share; `windows`: the connection's and each stream's initial flow-control
/// credit.
fn common(c: &mut quiche::Config, max_udp_payload: usize, windows: (u64, u64)) -> Result<(), quiche::Error> {
    let (conn, stream) = windows;
    c.set_application_protos(quiche::h3::APPLICATION_PROTOCOL)?;
    c.set_max_idle_timeout(IDLE_TIMEOUT_MS);
    c.set_max_recv_udp_payload_size(65_527);
    c.set_max_send_udp_payload_size(max_udp_payload);
    c.set_initial_max_data(conn);
    c.set_initial_max_stream_data_bidi_local(stream);
    c.set_initial_max_stream_data_bidi_remote(stream);
    c.set_initial_max_stream_data_uni(stream.min(1 << 20));
    // Like nginx (128) and h2o (100): with the open-response bound, what one connection may
    // hold (a stream whose response stalls keeps its credit until it ends).
    c.set_initial_max_streams_bidi(MAX_STREAMS);
    c.set_initial_max_streams_uni(100);
    c.set_disable_active_migration(true);
    Ok(())
}

/// A server configuration with `files` loaded.
pub(crate) fn server_config(files: &PemFiles, max_udp_payload: usize) -> Result<quiche::Config, Error> {
    let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION).map_err(|e| Error::Tls(e.to_string()))?;
    c.load_cert_chain_from_pem_file(&path_str(&files.cert)?).map_err(|e| {
        Error::Usage(format!("certificate {}: not a PEM certificate chain ({e})", files.cert_name.display()))
    })?;
    c.load_priv_key_from_pem_file(&path_str(&files.key)?).map_err(|e| {
        Error::Usage(format!("key {}: not a PEM private key for the certificate ({e})", files.key_name.display()))
    })?;
    common(&mut c, max_udp_payload, (CONNECTION_WINDOW, REQUEST_WINDOW)).map_err(|e| Error::Tls(e.to_string()))?;
    // quiche's autotuning grows a window that is used up quickly (up to 24 MiB and 16 MiB by
    // default): the server's stay what it advertised.
    c.set_max_connection_window(CONNECTION_WINDOW);
    c.set_max_stream_window(REQUEST_WINDOW);
    Ok(c)
}

/// A client configuration. It does not verify the server's certificate: the client is a
/// test and measurement tool for servers with self-signed certificates.
pub fn client_config(max_udp_payload: usize) -> Result<quiche::Config, Error> {
    let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION).map_err(|e| Error::Tls(e.to_string()))?;
    c.verify_peer(false);
    // A resumed connection sends its request in 0-RTT where the server takes early data.
    c.enable_early_data();
    common(&mut c, max_udp_payload, (MAX_DATA, STREAM_WINDOW)).map_err(|e| Error::Tls(e.to_string()))?;
    Ok(c)
}

fn path_str(p: &Path) -> Result<String, Error> {
    p.to_str().map(str::to_owned).ok_or_else(|| Error::Usage(format!("{}: not a UTF-8 path", p.display())))
}
