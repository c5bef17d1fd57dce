//! qlog (`--qlog-dir`): one JSON-SEQ file per chosen connection, for qvis or a script to read
//! what happened to one viewer (every packet sent and received, losses, the congestion
//! window, the HTTP/3 frames).
//!
//! quiche (built with its `qlog` feature: this crate's feature `qlog`) writes a connection's
//! events into the writer it is given, on the shard's thread, as they happen. So:
//! - **Which connections**: those from the named addresses ([`QlogPolicy::peers`]) and a
//!   sampled fraction of the rest ([`QlogPolicy::sample`]), chosen at admission, before the
//!   first packet ([`Qlog::writer_for`]); the choice can change while the server runs
//!   ([`Qlog::set_policy`]: new connections follow it).
//! - **Never blocking a shard on disk**: a connection's events go, whole records at a time
//!   ([`crate::records`]), into a queue of [`QlogConfig::queue`] messages that the thread
//!   `udpx-qlog` drains into the files. A record that finds the queue full is dropped and
//!   counted ([`QlogCounters::dropped`]); the shard goes on. A file's records stay whole
//!   JSON-SEQ records (RS, JSON, newline), so a file with drops still parses record by record.
//! - **Bounded**: the network is hostile, and a connection's qlog grows with every packet. At
//!   most [`QlogConfig::max_files`] files are made in a process's life (then connections are
//!   not logged: [`QlogCounters::skipped`]), and at most [`QlogConfig::max_bytes`] written in
//!   all (then records are dropped). A record longer than 64 KiB is dropped.
//! - **The shard's work bounded**: quiche turns each event into JSON on the shard thread before
//!   the writer sees it, so a dropped record has already cost its work. So at most
//!   [`QlogConfig::max_live`] sampled connections log at once; one chosen past it is not
//!   logged ([`QlogCounters::busy`]). Measured (docs/bench.md): 10,000 players all logged
//!   saturated the shard, from 69 % busy without qlog; connections from the named addresses
//!   are always logged (the file bound still holds).
//!
//! Files are named `<UTC time>-<connection ID>.sqlog` (the time the connection was accepted,
//! `2026-11-28T160924.123Z`; the server's connection ID in hex), created 0600, never through a
//! symbolic link.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::records::Records;

/// Whether this build can write qlog (quiche's `qlog` feature, this crate's `qlog`).
pub const AVAILABLE: bool = cfg!(feature = "qlog");

/// Files made at most in a process's life, by default.
pub const DEFAULT_MAX_FILES: u64 = 1_000;
/// Bytes written at most in a process's life, by default.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// Messages (a connection's records of one write each) queued for the writer, by default.
pub const DEFAULT_QUEUE: usize = 8_192;
/// Sampled connections logging at once at most, by default.
pub const DEFAULT_MAX_LIVE: u64 = 64;
/// The longest record kept: a `packet_sent` with many frames is a few KiB.
const MAX_RECORD: usize = 64 << 10;
/// Files the writer keeps open at once (the least recently written is closed past it, and
/// opened again in append mode when its connection writes again).
const MAX_OPEN: usize = 64;
/// How long a flush waits for room in the queue and for the writer.
const WAIT: Duration = Duration::from_secs(5);

/// Which connections are logged.
#[derive(Debug, Clone, PartialEq)]
pub struct QlogPolicy {
    /// The fraction of connections logged, 0 to 1 (besides those of [`QlogPolicy::peers`]).
    pub sample: f64,
    /// Addresses whose every connection is logged (an IPv4-mapped IPv6 address is its IPv4).
    pub peers: Vec<IpAddr>,
}

/// Where qlog goes and its bounds (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct QlogConfig {
    /// The directory of the files (created 0750 if missing).
    pub dir: PathBuf,
    /// Which connections.
    pub policy: QlogPolicy,
    /// Files made at most.
    pub max_files: u64,
    /// Bytes written at most, in all.
    pub max_bytes: u64,
    /// Messages queued for the writer at most.
    pub queue: usize,
    /// Sampled connections logging at once at most (those of the named addresses are not
    /// counted against it).
    pub max_live: u64,
}

impl QlogConfig {
    /// Into `dir`, every connection (`sample` 1), the default bounds.
    pub fn new(dir: PathBuf) -> QlogConfig {
        QlogConfig {
            dir,
            policy: QlogPolicy { sample: 1.0, peers: Vec::new() },
            max_files: DEFAULT_MAX_FILES,
            max_bytes: DEFAULT_MAX_BYTES,
            queue: DEFAULT_QUEUE,
            max_live: DEFAULT_MAX_LIVE,
        }
    }
}

/// What the qlog writer did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QlogCounters {
    /// Connections logged (files made).
    pub files: u64,
    /// Connections chosen but not logged: [`QlogConfig::max_files`] reached.
    pub skipped: u64,
    /// Sampled connections chosen but not logged: [`QlogConfig::max_live`] others were logging.
    pub busy: u64,
    /// Connections logging now (a level).
    pub live: u64,
    /// Records queued for the files.
    pub records: u64,
    /// Records dropped: the queue full, [`QlogConfig::max_bytes`] reached, or longer than
    /// 64 KiB.
    pub dropped: u64,
    /// Bytes queued for the files.
    pub bytes: u64,
    /// Writes that failed (the disk full, the directory gone); their records are lost.
    pub write_errors: u64,
}

/// The qlog writer of a server: its queue, thread and counters, shared by every shard
/// (cloning shares it). See the module docs.
#[derive(Clone)]
pub struct Qlog(Arc<Shared>);

struct Shared {
    dir: PathBuf,
    policy: RwLock<QlogPolicy>,
    max_files: u64,
    max_bytes: u64,
    max_live: u64,
    tx: SyncSender<Msg>,
    files: AtomicU64,
    skipped: AtomicU64,
    busy: AtomicU64,
    live: AtomicU64,
    sampled_live: AtomicU64,
    records: AtomicU64,
    dropped: AtomicU64,
    bytes: AtomicU64,
    write_errors: Arc<AtomicU64>,
    /// The writer waits while set (`Qlog::hold`, feature `fault-injection`).
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    held: Arc<AtomicBool>,
}

enum Msg {
    /// Whole records for file `id` (named `name` in the directory).
    Data { id: u64, name: Arc<str>, bytes: Vec<u8> },
    /// The connection of file `id` is gone: close it.
    Done(u64),
    /// Answer once everything before is written.
    Flush(SyncSender<()>),
    /// Wait while [`Shared::held`] is set (sent by [`Qlog::hold`] only).
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    Hold,
}

impl std::fmt::Debug for Qlog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qlog").field("dir", &self.0.dir).field("counters", &self.counters()).finish()
    }
}

impl Qlog {
    /// Starts the writer thread for `cfg` (the directory made if missing); the message says
    /// what to change.
    pub fn start(cfg: &QlogConfig) -> Result<Qlog, String> {
        cfg.policy.check()?;
        if cfg.max_files == 0 || cfg.max_bytes == 0 || cfg.queue == 0 || cfg.max_live == 0 {
            return Err("qlog bounds: give at least 1 file, 1 byte, a queue of 1 and 1 live connection".into());
        }
        let shown = cfg.dir.display();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&cfg.dir)
            .map_err(|e| format!("qlog directory {shown}: {e}"))?;
        if !std::fs::symlink_metadata(&cfg.dir).map_err(|e| format!("qlog directory {shown}: {e}"))?.is_dir() {
            return Err(format!("qlog directory {shown} is not a directory (a link is refused): give a directory"));
        }
        let (tx, rx) = mpsc::sync_channel(cfg.queue);
        let write_errors = Arc::new(AtomicU64::new(0));
        let held = Arc::new(AtomicBool::new(false));
        let (dir, errors, hold) = (cfg.dir.clone(), write_errors.clone(), held.clone());
        std::thread::Builder::new()
            .name("udpx-qlog".into())
            .spawn(move || write_files(&dir, &rx, &errors, &hold))
            .map_err(|e| format!("qlog writer thread: {e}"))?;
        Ok(Qlog(Arc::new(Shared {
            dir: cfg.dir.clone(),
            policy: RwLock::new(cfg.policy.clone()),
            max_files: cfg.max_files,
            max_bytes: cfg.max_bytes,
            max_live: cfg.max_live,
            tx,
            files: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            live: AtomicU64::new(0),
            sampled_live: AtomicU64::new(0),
            records: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            write_errors,
            held,
        })))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.0.dir
    }

    /// Which connections are logged now.
    pub fn policy(&self) -> QlogPolicy {
        self.0.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Logs new connections by `policy` from now on (connections being logged go on).
    pub fn set_policy(&self, policy: QlogPolicy) -> Result<(), String> {
        policy.check()?;
        *self.0.policy.write().unwrap_or_else(|e| e.into_inner()) = policy;
        Ok(())
    }

    /// The counters so far.
    pub fn counters(&self) -> QlogCounters {
        let s = &self.0;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        QlogCounters {
            files: l(&s.files),
            skipped: l(&s.skipped),
            busy: l(&s.busy),
            live: l(&s.live),
            records: l(&s.records),
            dropped: l(&s.dropped),
            bytes: l(&s.bytes),
            write_errors: l(&s.write_errors),
        }
    }

    /// A writer for the qlog of a connection from `peer` whose connection ID is `cid`, when
    /// the policy chooses it and the bounds allow (else `None`, counted when a bound refused
    /// it). Called at admission, before the connection's first packet.
    pub fn writer_for(&self, peer: SocketAddr, cid: &[u8], now: SystemTime) -> Option<Box<dyn Write + Send + Sync>> {
        let named = match self.chooses(peer.ip()) {
            Chosen::No => return None,
            Chosen::Named => true,
            Chosen::Sampled => false,
        };
        let s = &self.0;
        // Counted live from here; given back on every way out but a writer made.
        let live = Live::count(&self.0, !named);
        if !named && live.sampled_before >= s.max_live {
            s.busy.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let Ok(n) = s.files.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < s.max_files).then_some(n + 1))
        else {
            s.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let mut hex = String::with_capacity(2 * cid.len());
        for b in cid {
            use std::fmt::Write as _;
            let _ = write!(hex, "{b:02x}");
        }
        let time = humantime::format_rfc3339_millis(now).to_string().replace(':', "");
        let name: Arc<str> = format!("{time}-{hex}.sqlog").into();
        let (shared, id) = (self.0.clone(), n);
        let records = Records::new(MAX_RECORD, move |bytes: &[u8], records| shared.queue(id, &name, bytes, records));
        Some(Box::new(ConnQlog { records, id, shared: self.0.clone(), _live: live }))
    }

    /// Whether the policy chooses a connection from `ip`, and why.
    fn chooses(&self, ip: IpAddr) -> Chosen {
        let p = self.0.policy.read().unwrap_or_else(|e| e.into_inner());
        let ip = ip.to_canonical();
        if p.peers.iter().any(|a| a.to_canonical() == ip) {
            return Chosen::Named;
        }
        let sampled = p.sample >= 1.0 || {
            let mut r = [0u8; 8];
            p.sample > 0.0
                && crate::cid::random_bytes(&mut r).is_ok()
                && (u64::from_ne_bytes(r) as f64) < p.sample * u64::MAX as f64
        };
        if sampled {
            Chosen::Sampled
        } else {
            Chosen::No
        }
    }

    /// Waits (5 s at most) until every record queued before is written.
    pub fn flush(&self) -> Result<(), String> {
        let (ack, done) = mpsc::sync_channel(1);
        let start = Instant::now();
        let mut m = Msg::Flush(ack);
        loop {
            match self.0.tx.try_send(m) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if start.elapsed() < WAIT => {
                    m = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return Err("the qlog writer's queue stayed full for 5 s, or it is gone".into()),
            }
        }
        done.recv_timeout(WAIT).map_err(|_| "the qlog writer did not flush within 5 s".to_string())
    }

    /// Makes the writer wait (a disk that stalls) until the guard is dropped: for tests of
    /// the queue's bound (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn hold(&self) -> QlogHold {
        self.0.held.store(true, Ordering::Release);
        let _ = self.0.tx.send(Msg::Hold);
        QlogHold(self.0.held.clone())
    }
}

/// While alive, the qlog writer waits ([`Qlog::hold`]).
#[cfg(feature = "fault-injection")]
#[derive(Debug)]
pub struct QlogHold(Arc<AtomicBool>);

#[cfg(feature = "fault-injection")]
impl Drop for QlogHold {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl QlogPolicy {
    /// The addresses of a peers file (`--qlog-peers`): IPv4 or IPv6 addresses separated by
    /// commas, white space or lines, `#` comments; the file must end with a newline (one that
    /// does not may be half-written, and is refused).
    pub fn parse_peers(text: &str) -> Result<Vec<IpAddr>, String> {
        Ok(Self::parse_file(text)?.0)
    }

    /// A peers file whole: its addresses ([`QlogPolicy::parse_peers`]) and, if it has one, a
    /// `sample=F` word, the fraction of the other connections logged (0 to 1; at most one), so
    /// SIGHUP can change the sample as it changes the addresses.
    pub fn parse_file(text: &str) -> Result<(Vec<IpAddr>, Option<f64>), String> {
        enum Word {
            Peer(IpAddr),
            Sample(f64),
        }
        let words = crate::reset::list_file(text, |w| match w.strip_prefix("sample=") {
            Some(f) => match f.parse::<f64>() {
                Ok(x) if (0.0..=1.0).contains(&x) => Ok(Word::Sample(x)),
                _ => Err(format!("{w:?}: give sample=F with F from 0 to 1 (the fraction of connections logged)")),
            },
            None => w.parse().map(Word::Peer).map_err(|_| format!("{w:?} is not an IP address (nor sample=F)")),
        })?;
        let (mut peers, mut sample) = (Vec::new(), None);
        for w in words {
            match w {
                Word::Peer(a) => peers.push(a),
                Word::Sample(_) if sample.is_some() => return Err("two sample= words: give one".into()),
                Word::Sample(x) => sample = Some(x),
            }
        }
        Ok((peers, sample))
    }

    /// Refuses a sample outside 0 to 1, saying so.
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.sample) {
            return Err(format!("--qlog-sample {}: give 0 to 1 (the fraction of connections logged)", self.sample));
        }
        Ok(())
    }
}

impl Shared {
    /// Queues whole `records` (their count) for file `id`, or drops them (counted): never
    /// waits. An empty `bytes` is an overlong record dropped.
    fn queue(&self, id: u64, name: &Arc<str>, bytes: &[u8], records: u64) {
        let len = bytes.len() as u64;
        let fits = !bytes.is_empty()
            && self
                .bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| (b + len <= self.max_bytes).then_some(b + len))
                .is_ok();
        if !fits {
            self.dropped.fetch_add(records, Ordering::Relaxed);
            return;
        }
        match self.tx.try_send(Msg::Data { id, name: name.clone(), bytes: bytes.to_vec() }) {
            Ok(()) => {
                self.records.fetch_add(records, Ordering::Relaxed);
            }
            Err(_) => {
                self.bytes.fetch_sub(len, Ordering::Relaxed);
                self.dropped.fetch_add(records, Ordering::Relaxed);
            }
        }
    }
}

/// Why a connection is logged.
enum Chosen {
    No,
    /// Its address is named.
    Named,
    /// The sample chose it.
    Sampled,
}

/// A connection counted in [`QlogCounters::live`] (and, sampled, against
/// [`QlogConfig::max_live`]) while this lives.
struct Live {
    shared: Arc<Shared>,
    sampled: bool,
    /// Sampled connections logging before this one.
    sampled_before: u64,
}

impl Live {
    fn count(shared: &Arc<Shared>, sampled: bool) -> Live {
        shared.live.fetch_add(1, Ordering::Relaxed);
        let sampled_before = if sampled { shared.sampled_live.fetch_add(1, Ordering::Relaxed) } else { 0 };
        Live { shared: shared.clone(), sampled, sampled_before }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, Ordering::Relaxed);
        if self.sampled {
            self.shared.sampled_live.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The writer quiche holds for one connection: whole records into the queue; when quiche
/// drops it (the connection is gone), its file is closed.
struct ConnQlog<F: FnMut(&[u8], u64)> {
    records: Records<F>,
    id: u64,
    shared: Arc<Shared>,
    _live: Live,
}

impl<F: FnMut(&[u8], u64)> Write for ConnQlog<F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.records.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<F: FnMut(&[u8], u64)> Drop for ConnQlog<F> {
    fn drop(&mut self) {
        // Best effort: past a full queue the writer closes it among the least recently used.
        let _ = self.shared.tx.try_send(Msg::Done(self.id));
    }
}

/// The writer thread: every message in order; files opened on their first record, at most
/// [`MAX_OPEN`] at once.
fn write_files(dir: &Path, rx: &Receiver<Msg>, errors: &AtomicU64, held: &AtomicBool) {
    let mut open: HashMap<u64, (File, u64)> = HashMap::new();
    let mut turn = 0u64;
    let mut warned = false;
    while let Ok(m) = rx.recv() {
        turn += 1;
        match m {
            Msg::Data { id, name, bytes } => {
                if !open.contains_key(&id) {
                    if open.len() >= MAX_OPEN {
                        let oldest = open.iter().min_by_key(|(_, (_, t))| *t).map(|(&k, _)| k);
                        open.remove(&oldest.unwrap_or(id));
                    }
                    let f = std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .mode(0o600)
                        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                        .open(dir.join(&*name));
                    match f {
                        Ok(f) => {
                            open.insert(id, (f, turn));
                        }
                        Err(e) => {
                            failed(errors, &mut warned, dir, &e);
                            continue;
                        }
                    }
                }
                if let Some((f, t)) = open.get_mut(&id) {
                    *t = turn;
                    if let Err(e) = f.write_all(&bytes) {
                        failed(errors, &mut warned, dir, &e);
                    }
                }
            }
            Msg::Done(id) => {
                open.remove(&id);
            }
            Msg::Flush(ack) => {
                let _ = ack.try_send(());
            }
            Msg::Hold => {
                while held.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
}

fn failed(errors: &AtomicU64, warned: &mut bool, dir: &Path, e: &std::io::Error) {
    errors.fetch_add(1, Ordering::Relaxed);
    if !*warned {
        log::warn!("udpx-quic: qlog in {}: {e} (records lost, counted)", dir.display());
        *warned = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("udpx-qlog-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn chosen_by_address_and_sample_bounded_in_files_and_bytes() {
        let d = dir("bounds");
        let mut cfg = QlogConfig::new(d.clone());
        cfg.policy = QlogPolicy { sample: 0.0, peers: vec!["192.0.2.7".parse().unwrap()] };
        cfg.max_files = 2;
        cfg.max_bytes = 30;
        let q = Qlog::start(&cfg).unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_345_600_123);
        assert!(q.writer_for("192.0.2.8:443".parse().unwrap(), &[1], now).is_none(), "not named, sample 0");
        let mut w = q.writer_for("[::ffff:192.0.2.7]:443".parse().unwrap(), &[0xab, 0xcd], now).expect("named");
        w.write_all(b"\x1e{\"a\":1}\n").unwrap(); // 9 bytes
        w.write_all(b"\x1e{\"b\":").unwrap();
        w.write_all(b"2}\n\x1e{\"c\":3}\n").unwrap(); // 18 bytes: 27 in all
        w.write_all(b"\x1e{\"d\":4}\n").unwrap(); // past 30: dropped
        drop(w);
        q.flush().unwrap();
        let f = d.join("2025-11-28T160000.123Z-abcd.sqlog");
        assert_eq!(std::fs::read(&f).unwrap(), b"\x1e{\"a\":1}\n\x1e{\"b\":2}\n\x1e{\"c\":3}\n");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        q.set_policy(QlogPolicy { sample: 1.0, peers: vec![] }).unwrap();
        assert!(q.writer_for("192.0.2.8:443".parse().unwrap(), &[2], now).is_some(), "sample 1: every one");
        assert!(q.writer_for("192.0.2.8:443".parse().unwrap(), &[3], now).is_none(), "past 2 files");
        let c = q.counters();
        assert_eq!((c.files, c.skipped, c.records, c.dropped, c.bytes), (2, 1, 3, 1, 27));
        assert!(q.set_policy(QlogPolicy { sample: 1.5, peers: vec![] }).unwrap_err().contains("0 to 1"));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(QlogPolicy::parse_peers("192.0.2.7, ::1 # a viewer\n").unwrap(), [ip("192.0.2.7"), ip("::1")]);
        assert!(QlogPolicy::parse_peers("192.0.2.7").unwrap_err().contains("newline"));
        assert!(QlogPolicy::parse_peers("192.0.2\n").unwrap_err().contains("not an IP address"));
        // The sample in the file, for SIGHUP: one at most, in range.
        assert_eq!(QlogPolicy::parse_file("sample=0.25 ::1\n").unwrap(), (vec![ip("::1")], Some(0.25)));
        assert_eq!(QlogPolicy::parse_file("::1\n").unwrap(), (vec![ip("::1")], None));
        for bad in ["sample=2\n", "sample=x\n", "sample=NaN\n"] {
            assert!(QlogPolicy::parse_file(bad).unwrap_err().contains("0 to 1"), "{bad}");
        }
        assert!(QlogPolicy::parse_file("sample=0 sample=1\n").unwrap_err().contains("give one"));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// At most `max_live` sampled connections log at once; one that ends makes room; a named
    /// address always logs.
    #[test]
    fn at_most_max_live_sampled_connections_log_at_once() {
        let d = dir("live");
        let mut cfg = QlogConfig::new(d.clone());
        cfg.policy = QlogPolicy { sample: 1.0, peers: vec!["192.0.2.7".parse().unwrap()] };
        cfg.max_live = 2;
        let q = Qlog::start(&cfg).unwrap();
        let (now, peer) = (SystemTime::now(), "192.0.2.8:443".parse().unwrap());
        let a = q.writer_for(peer, &[1], now).expect("first");
        let b = q.writer_for(peer, &[2], now).expect("second");
        assert!(q.writer_for(peer, &[3], now).is_none(), "a third while two log");
        let named = q.writer_for("192.0.2.7:443".parse().unwrap(), &[4], now).expect("a named address always logs");
        assert_eq!((q.counters().live, q.counters().busy), (3, 1));
        drop(a);
        let c = q.writer_for(peer, &[5], now).expect("room again once one ended");
        drop((b, c, named));
        let k = q.counters();
        assert_eq!((k.live, k.busy, k.files, k.skipped), (0, 1, 4, 0), "{k:?}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
