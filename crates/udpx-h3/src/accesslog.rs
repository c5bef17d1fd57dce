//! The access log, written by a thread of its own (the third review, issue 46: log writes off
//! the shard thread).
//!
//! A response's line is queued ([`LOG_QUEUE`] lines at most) and written by the thread
//! `udpx-h3-log`, which flushes whenever the queue is empty: a slow or stuck disk (or a pipe
//! nobody reads) never blocks a shard or the TCP listener. A line that finds the queue full is
//! dropped and counted (`http_log_dropped`), as a bounded buffer must. A reopen (logrotate) and
//! a flush (at stop, or for a test that reads the file) go through the same queue, in order
//! with the lines.

use std::io::{BufWriter, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Lines queued at most (about 120 bytes each: 0.5 MB).
pub const LOG_QUEUE: usize = 4096;

/// How long a reopen or a flush waits for room in the queue, or for the writer.
const WAIT: Duration = Duration::from_secs(5);

enum Msg {
    Line(String),
    Reopen(Box<dyn Write + Send>),
    Flush(SyncSender<()>),
}

/// The queue to the writer thread.
pub(crate) struct AccessLog {
    tx: SyncSender<Msg>,
    /// Detached on drop.
    thread: Option<JoinHandle<()>>,
}

impl AccessLog {
    /// Starts the writer on `out`.
    pub(crate) fn start(out: Box<dyn Write + Send>) -> std::io::Result<AccessLog> {
        let (tx, rx) = mpsc::sync_channel(LOG_QUEUE);
        let thread = std::thread::Builder::new().name("udpx-h3-log".into()).spawn(move || write_all(out, rx))?;
        Ok(AccessLog { tx, thread: Some(thread) })
    }

    /// Queues `line`; false when the queue is full (the line is dropped).
    pub(crate) fn line(&self, line: String) -> bool {
        !matches!(self.tx.try_send(Msg::Line(line)), Err(TrySendError::Full(_)))
    }

    /// Later lines go to `out` (those queued before go where they were going).
    pub(crate) fn reopen(&self, out: Box<dyn Write + Send>) -> Result<(), String> {
        self.send(Msg::Reopen(out))
    }

    /// Waits (5 s at most) until every line queued before is written and flushed.
    pub(crate) fn flush(&self) -> Result<(), String> {
        let (ack, done) = mpsc::sync_channel(1);
        self.send(Msg::Flush(ack))?;
        done.recv_timeout(WAIT).map_err(|_| "the access log's writer did not flush within 5 s".to_string())
    }

    /// Sends a control message, waiting up to [`WAIT`] for room.
    fn send(&self, mut m: Msg) -> Result<(), String> {
        let start = Instant::now();
        loop {
            match self.tx.try_send(m) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(_)) => return Err("the access log's writer is gone".into()),
                Err(TrySendError::Full(back)) if start.elapsed() < WAIT => {
                    m = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return Err("the access log's queue stayed full for 5 s".into()),
            }
        }
    }
}

impl Drop for AccessLog {
    /// Not joined: a writer stuck on a full pipe or a dead disk must not hold the process at
    /// its exit. The sender goes, so a writer that can write ends once the queue is empty;
    /// [`AccessLog::flush`] before is how a stop keeps its last lines.
    fn drop(&mut self) {
        drop(self.thread.take());
    }
}

/// The writer: every message in order, a flush whenever nothing more is waiting.
fn write_all(out: Box<dyn Write + Send>, rx: Receiver<Msg>) {
    let mut w = BufWriter::with_capacity(64 << 10, out);
    let mut warned = false;
    while let Ok(mut m) = rx.recv() {
        loop {
            match m {
                Msg::Line(l) => {
                    if let Err(e) = w.write_all(l.as_bytes()) {
                        if !warned {
                            log::warn!("udpx-h3: access log: {e}");
                            warned = true;
                        }
                    }
                }
                Msg::Reopen(out) => {
                    let _ = w.flush();
                    w = BufWriter::with_capacity(64 << 10, out);
                    warned = false;
                }
                Msg::Flush(ack) => {
                    let _ = w.flush();
                    let _ = ack.try_send(());
                }
            }
            match rx.try_recv() {
                Ok(next) => m = next,
                Err(_) => break,
            }
        }
        let _ = w.flush();
    }
    let _ = w.flush();
}
