//! What every lab of `udpx bench h3` stands on, below the tables: a scratch directory removed
//! on drop, the file and certificate the servers serve, peers run as bounded processes
//! ([`process`]) and rows of interleaved runs settled into medians ([`rows`]). The tables
//! (`crate::bench::*`) use it; it uses none of them.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Serialize;
use udpx_lab::netns::{find_in_path, Napi, Side, TestNet};

pub(crate) mod forge;
pub(crate) mod nginx;
pub(crate) mod process;
pub(crate) mod rows;

/// The temporary directory of a bench: the file, the certificate, nginx's files; removed on
/// drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new() -> Result<Scratch, String> {
        let mut nonce = [0u8; 8];
        udpx_quic::cid::random_bytes(&mut nonce).map_err(|e| e.to_string())?;
        let d = std::env::temp_dir().join(format!(
            "udpx-bench-h3-{}-{:016x}",
            std::process::id(),
            u64::from_ne_bytes(nonce)
        ));
        std::fs::create_dir_all(d.join("www")).map_err(|e| format!("{}: {e}", d.display()))?;
        Ok(Scratch(d))
    }
}

impl Drop for Scratch {
    /// Removes the directory, unless `UDPX_BENCH_KEEP` is set (its servers' logs, to read
    /// what happened in a row): then says where it is.
    fn drop(&mut self) {
        if std::env::var_os("UDPX_BENCH_KEEP").is_some() {
            eprintln!("udpx bench h3: kept {} (UDPX_BENCH_KEEP)", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `size` bytes of a fixed pseudo-random sequence (xorshift64: nothing compresses it).
pub(crate) fn write_file(path: &Path, size: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut left = size;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        for c in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
}

/// A self-signed certificate for both servers (the clients do not verify it).
pub(crate) fn write_cert(cert: &Path, key: &Path) -> Result<String, String> {
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    let ck = rcgen::generate_simple_self_signed(names).map_err(|e| format!("generating a certificate: {e}"))?;
    std::fs::write(cert, ck.cert.pem()).map_err(|e| format!("{}: {e}", cert.display()))?;
    std::fs::write(key, ck.key_pair.serialize_pem()).map_err(|e| format!("{}: {e}", key.display()))?;
    // Its SPKI pin (base64 of the SHA-256 of its SubjectPublicKeyInfo), as Chromium takes it.
    let spki = ck.key_pair.public_key_der();
    Ok(base64::engine::general_purpose::STANDARD.encode(ring::digest::digest(&ring::digest::SHA256, &spki)))
}

/// The external programs, found in `PATH` (or given). `None`: not installed, rows left out.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Programs {
    /// ngtcp2's HTTP/3 client (Debian `ngtcp2-client`).
    pub gtlsclient: Option<PathBuf>,
    /// nginx (Debian `nginx`).
    pub nginx: Option<PathBuf>,
    /// curl (Debian `curl`).
    pub curl: Option<PathBuf>,
    /// The `udpx` binary, which runs quinn with h3 (`udpx h3 quinn-serve`) as a second
    /// HTTP/3 server: set by `udpx bench h3` to itself; `None` leaves that row out.
    pub udpx: Option<PathBuf>,
    /// Chromium (Debian `chromium`): the browser rows (`bench/bulk/browser.rs`).
    pub chromium: Option<PathBuf>,
    /// The independent client (`udpx-quicgo-load`, built by `scripts/setup.sh`): quic-go's
    /// HTTP/3 client for udpx, Go's HTTP/2 client for nginx.
    pub independent: Option<PathBuf>,
}

impl Programs {
    /// Each program looked up in the directories of `PATH` only (Debian puts nginx in
    /// `/usr/sbin`, which root's `PATH` holds), so a `PATH` without one leaves its rows out;
    /// the independent client, ours, also where `scripts/setup.sh` puts it
    /// ([`crate::clients::quicgo::find`]).
    pub fn from_path() -> Programs {
        Programs {
            gtlsclient: find_in_path("gtlsclient"),
            nginx: find_in_path("nginx"),
            curl: find_in_path("curl"),
            udpx: None,
            chromium: udpx_lab::browser::find(),
            independent: crate::clients::quicgo::find(),
        }
    }
}

/// Each side's receive work on its own CPU, the server's (namespace `Rx`) on `server_cpu` in
/// the `server` mode and the client's on `client_cpu` in a NAPI thread, so a packet's protocol
/// work (TCP's ACK-clocked sends included) is charged to the side that receives it, for TCP as
/// for UDP (see [`Napi`]). The client's side is threaded so that the GRO of the responses runs
/// on the client's CPU, as on a client host: in softirq veth would run it in the server's send.
pub(crate) fn receive_on_own_cpus(
    net: &TestNet,
    server: Napi,
    server_cpu: usize,
    client_cpu: usize,
) -> Result<(), String> {
    net.receive_on(Side::Rx, server_cpu, server).map_err(|e| format!("server-side receive ({server} NAPI): {e}"))?;
    net.receive_on(Side::Tx, client_cpu, Napi::Threaded).map_err(|e| format!("client-side receive: {e}"))?;
    Ok(())
}

/// How the report names the server's [`Napi`] mode.
pub(crate) fn receive_note(server: Napi) -> &'static str {
    match server {
        Napi::Softirq => {
            "the server's receive work in softirq steered (RPS) to its CPU (--napi softirq: UDP's veth poll and GRO \
             of the requests and acknowledgements run on the client's CPU), the client's in a NAPI thread on its CPU"
        }
        Napi::Threaded => {
            "receive work in a NAPI thread on each side's CPU for UDP (a thread switch per poll), TCP's in softirq \
             steered (RPS) there (--napi threaded)"
        }
    }
}

/// A value as its text (`Display`) in the JSON: `#[serde(serialize_with = "crate::lab::as_text")]`.
pub(crate) fn as_text<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}
