//! Body reads that never wait for the disk on a shard thread (issue 46: "disk reads still run
//! on shard threads"). A shard serves thousands of connections from one thread; one read that
//! waits for a cold disk (milliseconds, seconds on a busy one) stalls every one of them.
//!
//! - A read is tried with `preadv2(RWF_NOWAIT)`: it is served from the page cache, or refused
//!   with `EAGAIN` when any of its bytes would need the disk ([`read_cached`]).
//! - A refused range is handed to the site's disk thread ([`Disk::warm`]), which reads it
//!   into a scratch buffer (the page cache keeps the pages) while the response waits, its
//!   stream untouched. The shard tries again on a timer (the responder's: 1 ms, doubling to
//!   32 ms) until the read goes; a warm-up under way is not asked for twice.
//! - Bounds: the disk thread holds at most [`QUEUE`] ranges of at most a block each; past it
//!   a response waits for a slot (counted). One thread: a disk is the limit, not the CPU.
//! - Where the file system refuses `RWF_NOWAIT` (`EOPNOTSUPP`: some network and FUSE file
//!   systems), the read blocks as before, on the shard thread, and is counted
//!   ([`DiskCounters::blocking_reads`]), so an operator can see it.
//!
//! Opening a file (a path lookup, an `fstat`) still runs on the shard thread: for a served
//! directory the metadata is nearly always cached; the docs say so.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Ranges the disk thread holds at most, queued: past it a response waits for a slot.
pub(crate) const QUEUE: usize = 256;

/// What the disk side counts.
#[derive(Debug, Default)]
pub(crate) struct DiskCounters {
    /// Reads the page cache refused (`RWF_NOWAIT`), handed to the disk thread.
    pub(crate) waits: AtomicU64,
    /// Ranges the disk thread read.
    pub(crate) warmed: AtomicU64,
    /// Warm-ups refused because the disk thread's queue was full (the response waited on).
    pub(crate) queue_full: AtomicU64,
    /// Reads made on a shard thread that could block: the file system refused `RWF_NOWAIT`.
    pub(crate) blocking_reads: AtomicU64,
}

/// Reads `buf.len()` bytes at `offset` from `file` if the page cache holds them all:
/// `Err(WouldBlock)` when any would need the disk, `Err(UnexpectedEof)` past the end. Where
/// the file system does not take `RWF_NOWAIT`, reads as `read_exact_at` does (blocking) and
/// counts it.
pub(crate) fn read_cached(file: &File, buf: &mut [u8], offset: u64, counters: &DiskCounters) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match udpx::file::read_nowait(file, &mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                counters.blocking_reads.fetch_add(1, Relaxed);
                return file.read_exact_at(&mut buf[done..], offset + done as u64);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A range handed to the disk thread: done once the page cache holds it (or the read failed:
/// the shard's own read then says so).
#[derive(Debug, Clone)]
pub(crate) struct Warming(Arc<AtomicBool>);

impl Warming {
    /// Whether the disk thread is done with it.
    pub(crate) fn done(&self) -> bool {
        self.0.load(Relaxed)
    }
}

struct Job {
    file: File,
    offset: u64,
    len: usize,
    done: Arc<AtomicBool>,
}

/// The site's disk thread, started at the first read the page cache refuses; it ends when the
/// site does.
#[derive(Debug, Default)]
pub(crate) struct Disk {
    tx: Mutex<Option<SyncSender<Job>>>,
    pub(crate) counters: Arc<DiskCounters>,
}

impl Disk {
    /// Hands `len` bytes of `file` at `offset` to the disk thread; `None` (counted) when its
    /// queue is full, or no descriptor or thread could be had: the caller waits and asks again.
    pub(crate) fn warm(&self, file: &File, offset: u64, len: usize) -> Option<Warming> {
        self.counters.waits.fetch_add(1, Relaxed);
        let file = file.try_clone().ok()?;
        let done = Arc::new(AtomicBool::new(false));
        let job = Job { file, offset, len, done: done.clone() };
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            let (t, rx) = sync_channel(QUEUE);
            let counters = self.counters.clone();
            std::thread::Builder::new().name("udpx-h3-disk".into()).spawn(move || warm_all(&rx, &counters)).ok()?;
            *tx = Some(t);
        }
        match tx.as_ref()?.try_send(job) {
            Ok(()) => Some(Warming(done)),
            Err(TrySendError::Full(_)) => {
                self.counters.queue_full.fetch_add(1, Relaxed);
                None
            }
            Err(TrySendError::Disconnected(_)) => {
                *tx = None;
                None
            }
        }
    }
}

/// The disk thread: reads each range into a scratch buffer, whose pages the page cache keeps.
fn warm_all(rx: &Receiver<Job>, counters: &DiskCounters) {
    let mut scratch = Vec::new();
    while let Ok(job) = rx.recv() {
        scratch.resize(job.len, 0);
        // A failure is not ours to report: the shard's own read meets it and fails the
        // response.
        let _ = job.file.read_exact_at(&mut scratch[..job.len], job.offset);
        counters.warmed.fetch_add(1, Relaxed);
        job.done.store(true, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::{Duration, Instant};

    use super::*;

    /// A file on the disk (not tmpfs, whose pages never leave memory) dropped from the page
    /// cache: a cached read is refused, the disk thread reads it, then the cached read goes.
    #[test]
    fn a_range_not_in_the_page_cache_is_read_by_the_disk_thread() {
        // The crate's own directory: on the disk the checkout is on (unlinked once open).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(".udpx-disk-{}", std::process::id()));
        let bytes: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
        let mut f = File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.sync_all().unwrap();
        let file = File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        udpx::file::drop_cached(&file).unwrap();
        let disk = Disk::default();
        let mut buf = vec![0u8; 256 << 10];
        match read_cached(&file, &mut buf, 512 << 10, &disk.counters) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok(()) if disk.counters.blocking_reads.load(Relaxed) > 0 => {
                let why = "this file system refuses RWF_NOWAIT (the read blocked, counted)";
                udpx_lab::netns::record_skip("disk thread unit test", why);
                return;
            }
            other => {
                let why = format!("the page cache kept the dropped range ({other:?}): nothing to wait for");
                udpx_lab::netns::record_skip("disk thread unit test", &why);
                return;
            }
        }
        let w = disk.warm(&file, 512 << 10, buf.len()).expect("the disk thread takes it");
        let start = Instant::now();
        while !w.done() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(w.done(), "the disk thread read the range");
        read_cached(&file, &mut buf, 512 << 10, &disk.counters).expect("now from the page cache");
        assert_eq!(buf, bytes[512 << 10..768 << 10]);
        let c = &disk.counters;
        assert_eq!((c.waits.load(Relaxed), c.warmed.load(Relaxed), c.blocking_reads.load(Relaxed)), (1, 1, 0));
    }
}
