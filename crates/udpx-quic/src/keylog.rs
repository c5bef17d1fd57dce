//! The TLS key log (what `SSLKEYLOGFILE` names for curl, Chromium and quiche's own apps): the
//! secrets of every connection, one line each in the NSS key log format
//! (`LABEL <client random, hex> <secret, hex>`), so that Wireshark or tshark can decrypt a
//! capture (`tshark -o tls.keylog_file:PATH`).
//!
//! Whoever reads the file can decrypt every captured connection, so it is opt-in only (a
//! server flag, never the environment), and [`KeyLog::open`] refuses a file that someone
//! else could read or swap under us:
//! - created with mode 0600 (`O_CREAT | O_APPEND`), never opened through a symbolic link
//!   (`O_NOFOLLOW`);
//! - refused when it is not a regular file, belongs to another user, is readable or writable
//!   by group or others, or has other hard links; each message says what to change.
//!
//! One [`KeyLog`] serves every shard and the HTTPS-over-TCP listener: a line is appended with
//! one `write(2)` under a lock (`O_APPEND`: whole lines, in any order), a few lines per
//! connection at its handshake. The network is hostile: a flood of handshakes makes lines too
//! (the admission caps and Retry bound how fast), so the file grows by at most
//! [`KeyLog::max_bytes`] in a process's life; past it lines are dropped and counted.
//!
//! quiche writes a connection's lines through [`KeyLog::writer`] (set in the host's admission,
//! before the connection's first packet), once its configuration has `log_keys()`
//! ([`KeyLog::prepare`]: the host calls it on every configuration it makes connections with).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::records::Records;

/// What a key log writes at most in a process's life, by default: about 200,000 QUIC
/// handshakes' lines (five of about 160 bytes each).
pub const DEFAULT_MAX_BYTES: u64 = 160 << 20;

/// A key log file shared by every connection (see the module docs). Cloning shares it.
#[derive(Clone)]
pub struct KeyLog(Arc<Inner>);

struct Inner {
    path: PathBuf,
    max_bytes: u64,
    /// The file and the bytes written to it so far.
    file: Mutex<(File, u64)>,
    lines: AtomicU64,
    dropped: AtomicU64,
}

impl std::fmt::Debug for KeyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyLog").field("path", &self.0.path).field("lines", &self.lines()).finish()
    }
}

impl KeyLog {
    /// Opens (or creates, mode 0600) `path` for appending, refusing what the module docs
    /// say; the message names the path and what to change.
    pub fn open(path: &Path, max_bytes: u64) -> Result<KeyLog, String> {
        let shown = path.display();
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            // O_NONBLOCK: a FIFO without a reader fails here (ENXIO) instead of hanging.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => format!(
                    "key log {shown} is a symbolic link: give the path of a file itself (a key log is never \
                     written through a link)"
                ),
                _ => format!("key log {shown}: {e}"),
            })?;
        let m = file.metadata().map_err(|e| format!("key log {shown}: {e}"))?;
        let me = nix::unistd::geteuid().as_raw();
        if !m.file_type().is_file() {
            return Err(format!("key log {shown} is not a regular file: give the path of a file"));
        }
        if m.uid() != me {
            return Err(format!(
                "key log {shown} belongs to uid {}, not to this user (uid {me}): remove it, or give a path of \
                 your own",
                m.uid()
            ));
        }
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "key log {shown} has mode {mode:04o}: others could read the secrets; `chmod 600 {shown}`, or \
                 give a new path (it is created 0600)"
            ));
        }
        if m.nlink() > 1 {
            return Err(format!(
                "key log {shown} has {} hard links: give a file of its own (a new path is created 0600)",
                m.nlink()
            ));
        }
        Ok(KeyLog(Arc::new(Inner {
            path: path.to_owned(),
            max_bytes,
            file: Mutex::new((file, 0)),
            lines: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })))
    }

    /// Turns quiche's key logging on for connections made with `config` (when there is a key
    /// log): without it quiche never calls a connection's key log writer.
    pub fn prepare(keylog: Option<&KeyLog>, config: &mut quiche::Config) {
        if keylog.is_some() {
            config.log_keys();
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// The bytes it writes at most.
    pub fn max_bytes(&self) -> u64 {
        self.0.max_bytes
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.0.lines.load(Ordering::Relaxed)
    }

    /// Lines dropped so far (past [`KeyLog::max_bytes`], or a write that failed).
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }

    /// What to warn of while it is on (at start, and periodically).
    pub fn warning(&self) -> String {
        format!(
            "WARNING: the TLS secrets of every new connection are written to {} ({} lines so far): whoever reads it \
             can decrypt their captured traffic; restart without --keylog-file to stop",
            self.0.path.display(),
            self.lines()
        )
    }

    /// A writer for one quiche connection ([`quiche::Connection::set_keylog`]): each line it
    /// is given is appended whole.
    pub fn writer(&self) -> Box<dyn Write + Send + Sync> {
        let log = self.clone();
        Box::new(Records::new(MAX_LINE, move |lines: &[u8], n| match lines {
            [] => {
                log.0.dropped.fetch_add(n, Ordering::Relaxed);
            }
            _ => log.append(lines),
        }))
    }

    /// Appends one line in the NSS format: `label`, the client random and the secret in hex
    /// (what rustls's `KeyLog::log` is given).
    pub fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        let mut line = String::with_capacity(label.len() + 2 * (client_random.len() + secret.len()) + 3);
        line.push_str(label);
        for part in [client_random, secret] {
            line.push(' ');
            for b in part {
                use std::fmt::Write as _;
                let _ = write!(line, "{b:02x}");
            }
        }
        line.push('\n');
        self.append(line.as_bytes());
    }

    /// Appends `lines` (whole lines, each ending in a newline) with one write, within the
    /// bound; counts them written or dropped.
    fn append(&self, lines: &[u8]) {
        let n = lines.iter().filter(|&&b| b == b'\n').count() as u64;
        let inner = &self.0;
        let mut f = inner.file.lock().unwrap_or_else(|e| e.into_inner());
        let (file, written) = &mut *f;
        if *written + lines.len() as u64 > inner.max_bytes {
            if inner.dropped.fetch_add(n, Ordering::Relaxed) == 0 {
                log::warn!(
                    "udpx-quic: key log {} reached its bound of {} bytes: later lines are dropped (counted)",
                    inner.path.display(),
                    inner.max_bytes
                );
            }
            return;
        }
        match file.write_all(lines) {
            Ok(()) => {
                *written += lines.len() as u64;
                inner.lines.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                if inner.dropped.fetch_add(n, Ordering::Relaxed) == 0 {
                    log::warn!("udpx-quic: key log {}: {e}", inner.path.display());
                }
            }
        }
    }
}

/// A key log line is under 300 bytes (a label, 32 bytes of random and a secret of at most 48,
/// in hex).
const MAX_LINE: usize = 512;

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::SocketAddr;

    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("udpx-keylog-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn created_0600_and_refused_when_others_could_reach_it() {
        let d = Dir::new("open");
        let p = d.0.join("keys.log");
        let k = KeyLog::open(&p, DEFAULT_MAX_BYTES).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        k.log("CLIENT_RANDOM", &[1, 2], &[0xab]);
        k.writer().write_all(b"SERVER_TRAFFIC_SECRET_0 0102 cdef\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "CLIENT_RANDOM 0102 ab\nSERVER_TRAFFIC_SECRET_0 0102 cdef\n");
        assert_eq!((k.lines(), k.dropped()), (2, 0));
        drop(k);
        // Appended to, not truncated.
        KeyLog::open(&p, DEFAULT_MAX_BYTES).unwrap().log("X", &[], &[]);
        assert_eq!(std::fs::read_to_string(&p).unwrap().lines().count(), 3);

        let link = d.0.join("link.log");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(KeyLog::open(&link, DEFAULT_MAX_BYTES).unwrap_err().contains("symbolic link"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(KeyLog::open(&p, DEFAULT_MAX_BYTES).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let hard = d.0.join("hard.log");
        std::fs::hard_link(&p, &hard).unwrap();
        assert!(KeyLog::open(&p, DEFAULT_MAX_BYTES).unwrap_err().contains("hard links"));
        assert!(KeyLog::open(&d.0, DEFAULT_MAX_BYTES).is_err(), "a directory");
        if nix::unistd::geteuid().is_root() {
            let other = d.0.join("other.log");
            std::fs::write(&other, b"").unwrap();
            std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
            nix::unistd::chown(&other, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            assert!(KeyLog::open(&other, DEFAULT_MAX_BYTES).unwrap_err().contains("belongs to uid 65534"));
        }
    }

    #[test]
    fn the_bound_drops_and_counts_lines() {
        let d = Dir::new("bound");
        let p = d.0.join("keys.log");
        let k = KeyLog::open(&p, 100).unwrap();
        for _ in 0..10 {
            k.log("CLIENT_TRAFFIC_SECRET_0", &[7; 8], &[9; 8]);
        }
        let kept = std::fs::read_to_string(&p).unwrap();
        assert!(kept.len() <= 100 && kept.ends_with('\n'), "{kept:?}");
        assert_eq!(k.lines() + k.dropped(), 10);
        assert_eq!(k.lines(), kept.lines().count() as u64);
        assert!(k.dropped() > 0);
    }

    /// A server and a client connection of quiche, the server's packets handed to the client
    /// and back in memory until both are established; the server's key log writer is set
    /// whatever `keylog` says (only [`KeyLog::prepare`] differs). Returns what it was given.
    fn handshake(keylog: Option<&KeyLog>) -> Vec<u8> {
        let d = Dir::new(if keylog.is_some() { "hs-on" } else { "hs-off" });
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (c, k) = (d.0.join("c.pem"), d.0.join("k.pem"));
        std::fs::write(&c, ck.cert.pem()).unwrap();
        std::fs::write(&k, ck.key_pair.serialize_pem()).unwrap();
        let mut scfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
        scfg.load_cert_chain_from_pem_file(c.to_str().unwrap()).unwrap();
        scfg.load_priv_key_from_pem_file(k.to_str().unwrap()).unwrap();
        let mut ccfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
        ccfg.verify_peer(false);
        for cfg in [&mut scfg, &mut ccfg] {
            cfg.set_application_protos(&[b"udpx-test"]).unwrap();
            cfg.set_initial_max_data(1 << 20);
        }
        KeyLog::prepare(keylog, &mut scfg);
        let (ca, sa): (SocketAddr, SocketAddr) = (([127, 0, 0, 1], 1000).into(), ([127, 0, 0, 1], 2000).into());
        let mut client =
            quiche::connect(Some("localhost"), &quiche::ConnectionId::from_ref(&[1; 16]), ca, sa, &mut ccfg).unwrap();
        let mut server: Option<quiche::Connection> = None;
        let seen = Arc::new(Mutex::new(Vec::new()));
        struct Probe(Arc<Mutex<Vec<u8>>>);
        impl Write for Probe {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut buf = [0u8; 65535];
        for _ in 0..50 {
            while let Ok((n, _)) = client.send(&mut buf) {
                let s = server.get_or_insert_with(|| {
                    let mut s =
                        quiche::accept(&quiche::ConnectionId::from_ref(&[2; 16]), None, sa, ca, &mut scfg).unwrap();
                    s.set_keylog(match keylog {
                        Some(k) => Box::new(TeeWriter(k.writer(), Box::new(Probe(seen.clone())))),
                        None => Box::new(Probe(seen.clone())),
                    });
                    s
                });
                let _ = s.recv(&mut buf[..n], quiche::RecvInfo { from: ca, to: sa });
            }
            if let Some(s) = server.as_mut() {
                while let Ok((n, _)) = s.send(&mut buf) {
                    let _ = client.recv(&mut buf[..n], quiche::RecvInfo { from: sa, to: ca });
                }
                if s.is_established() && client.is_established() {
                    break;
                }
            }
        }
        assert!(client.is_established(), "the in-memory handshake completes");
        let got = seen.lock().unwrap().clone();
        got
    }

    struct TeeWriter(Box<dyn Write + Send + Sync>, Box<dyn Write + Send + Sync>);

    impl Write for TeeWriter {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.write_all(b)?;
            self.1.write_all(b)?;
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Without a key log quiche's `log_keys` stays off: a connection's writer is never called
    /// (the probe would see the secrets otherwise). With one, the handshake's secrets are
    /// written in the NSS format, the labels Wireshark needs for QUIC among them.
    #[test]
    fn quiche_logs_keys_only_with_a_key_log() {
        assert!(handshake(None).is_empty(), "log_keys is off without a key log");
        let d = Dir::new("hs-file");
        let k = KeyLog::open(&d.0.join("keys.log"), DEFAULT_MAX_BYTES).unwrap();
        let seen = String::from_utf8(handshake(Some(&k))).unwrap();
        let file = std::fs::read_to_string(k.path()).unwrap();
        assert_eq!(seen, file, "the file holds what quiche wrote");
        for label in [
            "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
            "SERVER_HANDSHAKE_TRAFFIC_SECRET",
            "CLIENT_TRAFFIC_SECRET_0",
            "SERVER_TRAFFIC_SECRET_0",
        ] {
            let line = file.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("{label} in {file}"));
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 3, "{line}");
            assert_eq!(f[1].len(), 64, "a 32-byte client random: {line}");
            assert!(f[2].len() >= 64 && f[2].bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
        }
    }
}
