//! Shared by the udpx-h3 tests: a served directory of known files in a temp dir, digests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use udpx_h3::{serve, H3Server, ServeConfig};
use udpx_quic::IoMode;

pub mod lossy;
pub mod raw;
pub mod tls;

/// 10 MB + 1 byte.
pub const BIG: usize = 10_000_001;

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let mut n = [0u8; 8];
        udpx_quic::cid::random_bytes(&mut n).unwrap();
        let p =
            std::env::temp_dir().join(format!("udpx-h3-{tag}-{}-{:016x}", std::process::id(), u64::from_ne_bytes(n)));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic content that is not a repeating pattern of a power-of-two period.
pub fn content(len: usize, seed: u64) -> Vec<u8> {
    udpx_lab::pattern(len, seed)
}

/// FNV-1a 64 over the bytes (a digest to compare downloads by; not cryptographic).
pub fn digest(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ u64::from(c)).wrapping_mul(0x0100_0000_01b3))
}

/// `www/` with `empty`, `small` (1 KiB) and `big` (10 MB + 1), plus `secret` beside it.
pub struct Site {
    pub tmp: TempDir,
    pub root: PathBuf,
}

impl Site {
    pub fn new(tag: &str) -> Site {
        let tmp = TempDir::new(tag);
        let root = tmp.path().join("www");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("empty"), b"").unwrap();
        std::fs::write(root.join("small"), content(1024, 1)).unwrap();
        std::fs::write(root.join("big"), content(BIG, 2)).unwrap();
        std::fs::write(root.join("sub/inner"), content(3000, 3)).unwrap();
        std::fs::write(tmp.path().join("secret"), b"not for you").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), root.join("escape")).unwrap();
        Site { tmp, root }
    }

    pub fn file(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.root.join(name)).unwrap()
    }
}

/// An ngtcp2 program (`gtlsclient`, `gtlsserver`: Debian's `ngtcp2-client` and
/// `ngtcp2-server`, which scripts/setup.sh installs) in PATH or the sbin directories (Debian
/// puts gtlsserver in /usr/sbin); else `test`'s SKIP is printed and recorded, and `None`.
pub fn ngtcp2(program: &str, test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file());
    if found.is_none() {
        let package = if program.ends_with("server") { "ngtcp2-server" } else { "ngtcp2-client" };
        udpx_lab::netns::record_skip(
            test,
            &format!("{program} not found (Debian package {package}; scripts/setup.sh installs it)"),
        );
    }
    found
}

/// A server on an ephemeral loopback port.
pub fn start(site: &Site, io: IoMode, shards: usize) -> H3Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.quic.io = io;
    cfg.quic.shards = shards;
    serve(&site.root, &cfg).expect("server starts")
}
