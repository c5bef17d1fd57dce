//! The HTTP rules of a file response: one implementation for both listeners (HTTP/3 in
//! [`server`](crate::server), HTTPS over TCP for `Alt-Svc` discovery), so a browser gets the
//! same answer whichever way it came.
//!
//! [`Site::answer`] turns a request head into an [`Answer`]: a status, headers and at most one
//! byte range of one file, opened and positioned (the listener streams it at its own pace; no
//! body is ever read whole). [`Site::finished`] is told when the response ended: it counts the
//! bytes and writes the access-log line.
//!
//! ## What is answered
//! - GET and HEAD; other methods 405 with `allow`. A path is resolved by [`crate::files::resolve`]:
//!   400 for a broken escape or a NUL, 403 for a path that leaves the directory, 404 for what is
//!   missing; a directory is served by its `index.html` (a directory path without its trailing
//!   slash gets a 301 to the path with it, so the page's relative links resolve; no listings).
//! - 200 and HEAD carry `content-type` (from the extension, `mime_guess`), `content-length`,
//!   `last-modified`, a strong `etag` (size, modification time in nanoseconds and inode),
//!   `accept-ranges: bytes`, `cache-control`, `date`, and `alt-svc` once the QUIC port is known.
//!
//! ## Conditional requests (RFC 9110 section 13.2.2), evaluated before Range
//! 1. `If-Match` (strong comparison, `*` matches) false -> 412; otherwise, without it,
//!    `If-Unmodified-Since` false -> 412.
//! 2. `If-None-Match` (weak comparison, `*` matches) matched -> 304 for GET and HEAD; only
//!    without it is `If-Modified-Since` looked at (GET, HEAD): not modified since -> 304. A 304
//!    has no body and keeps `etag`, `last-modified` and `cache-control`.
//! 3. A date that does not parse, or lies in the server's future, is ignored.
//!
//! ## Ranges (RFC 9110 section 14), GET only (HEAD ignores Range)
//! | `Range` | answer |
//! | --- | --- |
//! | `bytes=a-b`, `bytes=a-` with `a` < length | 206, `b` clamped to the last byte |
//! | `bytes=-n`, `n` > 0 | 206 of the last `n` bytes, the whole file when `n` >= length |
//! | `bytes=a-…` with `a` >= length, `bytes=-0`, anything but a non-zero suffix on an empty file | 416, `content-range: bytes */length` |
//! | `bytes=-n` on an empty file | 200 with the (empty) file: `content-range` cannot name zero bytes |
//! | `bytes=9-3`, `bytes=x`, another unit, several `Range` fields | ignored as invalid: 200 with the whole file |
//! | several ranges (`bytes=0-1,5-6`) | 200 with the whole file (no multipart answers) |
//!
//! Numbers too large for 64 bits saturate (`bytes=99999999999999999999-` is past the end: 416).
//! `If-Range` (GET with Range) is true only for a strong ETag equal to the current one, or a
//! date equal to `last-modified` that is a strong validator (the file is at least a second
//! older than now); otherwise the Range is ignored and the whole current file is sent, so a
//! client never joins bytes of two versions.

use std::fs::{File, Metadata};
use std::io::{self, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::files::{open, OpenError, Opened, Root};
use crate::Error;

/// Largest read from a file per response and turn over HTTPS/TCP, and HTTP/3's read for a
/// body left at most this long (or when the shard's read-ahead is used up): a response holds
/// at most this much of its file in memory at once.
pub const CHUNK: usize = 64 * 1024;

/// What a [`Site`] is told beyond its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteOptions {
    /// The `cache-control` of every file response (200, 206, 304).
    pub cache_control: String,
    /// Write one line per request here (`-`: standard output); off when `None`.
    pub access_log: Option<PathBuf>,
    /// Which other origins' pages may read the answers (`--cors`, [`crate::cors`]).
    pub cors: crate::cors::Cors,
}

impl Default for SiteOptions {
    /// `no-cache` (a cache keeps the file but asks, with its validators, before each reuse),
    /// no access log.
    fn default() -> Self {
        SiteOptions { cache_control: "no-cache".into(), access_log: None, cors: crate::cors::Cors::Off }
    }
}

/// The files under one directory and the rules that serve them; shared by every listener
/// and shard.
pub struct Site {
    root: Root,
    cache_control: String,
    cors: crate::cors::Cors,
    alt_svc: OnceLock<String>,
    counters: HttpCounters,
    log: Option<crate::accesslog::AccessLog>,
    /// The access log's file (`None`: none, or standard output), for [`Site::reopen_log`].
    log_path: Option<PathBuf>,
    /// The disk thread HTTP/3 bodies' cold reads go to.
    pub(crate) disk: crate::disk::Disk,
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Site")
            .field("root", &self.root.path())
            .field("alt_svc", &self.alt_svc.get())
            .finish_non_exhaustive()
    }
}

/// A request as both listeners see it.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// `GET`, `HEAD`, ...
    pub method: &'a [u8],
    /// The request target (path and query).
    pub path: &'a [u8],
    /// The header fields, names in lower case.
    pub headers: &'a [(&'a [u8], &'a [u8])],
}

/// A response: status, header fields, and the body's bytes of one file.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// Header fields (lower-case names), `content-length` among them.
    pub headers: Vec<(&'static str, String)>,
    /// The body, for GET with a non-empty body.
    pub body: Option<FileBody>,
}

/// The bytes to send: `len` bytes of `file` from its current position.
#[derive(Debug)]
pub struct FileBody {
    /// Opened and positioned at the first byte to send.
    pub file: File,
    /// How many bytes to send.
    pub len: u64,
    /// The file's offset just past them (where the range ends).
    pub end: u64,
    /// The file's strong validator as the response's headers carry it: a response that gave
    /// its file back ([`Site::reopen`]) goes on only from a file with the same one.
    pub etag: String,
    /// The version of the file opened (what its cached blocks are keyed by).
    pub id: crate::cache::FileId,
}

/// Why a response that gave its file back cannot go on ([`Site::reopen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reopen {
    /// The path no longer names a file this site serves (removed, renamed, now refused).
    Gone,
    /// It names another file, or the same one changed: its ETag differs.
    Changed,
    /// Opening or positioning it failed (out of descriptors, an I/O error).
    Failed,
}

/// A response that ended, for the counters and the access log.
#[derive(Debug, Clone)]
pub struct LogEntry<'a> {
    /// The client.
    pub peer: SocketAddr,
    /// The request method.
    pub method: &'a str,
    /// The request target.
    pub path: &'a str,
    /// The status sent.
    pub status: u16,
    /// Body bytes the transport took.
    pub bytes: u64,
    /// From the request's head to the response's end.
    pub duration: Duration,
    /// `h3`, `h2` or `http/1.1`.
    pub protocol: &'static str,
    /// Whether the whole response was sent (false: the peer reset the stream or went away,
    /// or the file failed).
    pub complete: bool,
}

/// What the access log says of a QUIC connection when it closes (one line each).
#[derive(Debug, Clone)]
pub struct ConnClose<'a> {
    /// `h3`, or over TCP `h2`, `http/1.1`, `tls` (no request: the handshake failed or the
    /// client asked nothing).
    pub protocol: &'static str,
    /// The client (its address when the connection closed).
    pub peer: SocketAddr,
    /// From its acceptance to its close.
    pub duration: Duration,
    /// Smoothed and minimum round-trip time of its path.
    pub rtt: Duration,
    pub min_rtt: Option<Duration>,
    /// Packets sent, declared lost, retransmitted (over TCP: segments sent, counted lost at
    /// the close, retransmitted).
    pub sent: u64,
    pub lost: u64,
    pub retransmitted: u64,
    /// Its congestion controller and final window, bytes.
    pub cc: &'a str,
    pub cwnd: u64,
    /// Bytes sent and received (UDP payload; over TCP, the kernel's TCP byte counts).
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Requests it made.
    pub requests: u64,
    /// `server`, `client`, or `idle` (no packet for its idle timeout: nobody sent a close).
    /// Over TCP: `client` when the client's FIN came first, else `server`.
    pub closed_by: &'static str,
    /// The CONNECTION_CLOSE's error code (`app:` for an application's) and reason.
    pub error: Option<(bool, u64, &'a [u8])>,
    /// What made the server close it, where the wire code says less (QUIC: quiche's error,
    /// such as `OutOfIdentifiers` behind a PROTOCOL_VIOLATION).
    pub cause: Option<quiche::Error>,
}

/// Counters shared by every listener.
#[derive(Debug, Default)]
struct HttpCounters {
    requests: AtomicU64,
    classes: [AtomicU64; 5],
    ok: AtomicU64,
    partial: AtomicU64,
    no_content: AtomicU64,
    not_modified: AtomicU64,
    redirects: AtomicU64,
    bad_request: AtomicU64,
    forbidden: AtomicU64,
    not_found: AtomicU64,
    method_not_allowed: AtomicU64,
    precondition_failed: AtomicU64,
    range_not_satisfiable: AtomicU64,
    server_error: AtomicU64,
    unavailable: AtomicU64,
    too_early: AtomicU64,
    early_data: AtomicU64,
    body_bytes: AtomicU64,
    file_reads: AtomicU64,
    file_bytes_read: AtomicU64,
    read_buffers_made: AtomicU64,
    incomplete: AtomicU64,
    open_files: AtomicU64,
    stalled: AtomicU64,
    parked: AtomicU64,
    resumed: AtomicU64,
    resume_refused: AtomicU64,
    resetting: AtomicU64,
    trailers: AtomicU64,
    idle_closed: AtomicU64,
    rejected: AtomicU64,
    unfinished_heads: AtomicU64,
    heads_refused: AtomicU64,
    heads_timed_out: AtomicU64,
    log_dropped: AtomicU64,
}

/// A snapshot of the HTTP counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HttpSnapshot {
    /// Requests whose heads arrived.
    pub requests: u64,
    /// Responses by status class: 1xx (never sent), 2xx, 3xx, 4xx, 5xx.
    pub by_class: [u64; 5],
    /// 200 responses.
    pub ok: u64,
    /// 206 responses.
    pub partial: u64,
    /// 204 responses: CORS preflights and OPTIONS (`--cors`).
    pub no_content: u64,
    /// 304 responses.
    pub not_modified: u64,
    /// 301 responses (a directory without its slash).
    pub redirects: u64,
    /// 400 responses.
    pub bad_request: u64,
    /// 403 responses (paths leaving the directory, unreadable files).
    pub forbidden: u64,
    /// 404 responses.
    pub not_found: u64,
    /// 405 responses.
    pub method_not_allowed: u64,
    /// 412 responses.
    pub precondition_failed: u64,
    /// 416 responses.
    pub range_not_satisfiable: u64,
    /// 500 responses (a file that could not be read).
    pub server_error: u64,
    /// 503 responses: out of file descriptors (or memory) for the moment, or the bound on
    /// open responses reached.
    pub unavailable: u64,
    /// 425 responses: a request that is not safe to replay came in early data.
    pub too_early: u64,
    /// Requests that arrived in early data (0-RTT), whatever the answer.
    pub early_data: u64,
    /// Body bytes the transports took.
    pub body_bytes: u64,
    /// Reads from files for HTTP/3 bodies (system calls).
    pub file_reads: u64,
    /// Bytes read from files for HTTP/3 bodies: against `body_bytes`, the passes of the read
    /// (above 1 where a parked response read again what it had not sent).
    pub file_bytes_read: u64,
    /// Buffers allocated to read bodies into because none in the shard's pools was free: it
    /// grows until the pools hold as many as the responses keep at once (each a new buffer's
    /// pages faulted in), then stays, unless the pools' bound is reached (then every read
    /// allocates, `BLOCKS_KEPT` in `responder.rs`).
    pub read_buffers_made: u64,
    /// Responses not sent whole: the peer reset or stopped the stream, the connection went
    /// away, or the file failed under us.
    pub incomplete: u64,
    /// HTTP/3 responses holding an open file now, every shard's (a level, not a count): back
    /// to 0 once every response has ended, however it ended (sent, reset, stalled, its
    /// connection closed).
    pub open_files: u64,
    /// Responses ended for taking too little: HTTP/3 ones whose stream was reset after they
    /// stayed parked for the park timeout (`ServeConfig::park_timeout`), the connection kept;
    /// over TCP, those whose connection was closed for taking less than the minimum rate.
    pub stalled: u64,
    /// HTTP/3 responses parked: they took less than `MIN_PROGRESS` bytes in the stall timeout
    /// (`ServeConfig::stall_timeout`; a paused video, a client that stopped reading), so
    /// they gave their open file back and wait, without it, for the client to read again.
    pub parked: u64,
    /// Parked responses that went on: the client read again, the file was opened again and
    /// its ETag was the response's.
    pub resumed: u64,
    /// Parked responses that could not go on when the client read again (the file changed
    /// or is gone, or an open-file bound was reached): their stream was reset.
    pub resume_refused: u64,
    /// HTTP/3 streams reset by the server and not yet forgotten by quiche (a level: back to 0
    /// once the peers have acknowledged every reset, or their connections ended).
    pub streams_resetting: u64,
    /// Trailer sections (a second HEADERS frame on a request, RFC 9114 4.1) read and ignored.
    pub trailers: u64,
    /// HTTP/3 connections closed after the idle timeout (`ServeConfig::idle_timeout`) with no
    /// request and no response.
    pub idle_closed: u64,
    /// HTTP/3 requests refused with H3_REQUEST_REJECTED while draining: their stream was at or
    /// past the final GOAWAY's ID (the client may send them again on a new connection).
    pub rejected: u64,
    /// HTTP/3 request streams with data and no whole head yet, now (a level; see
    /// `crate::heads`).
    pub unfinished_heads: u64,
    /// HTTP/3 connections closed (H3_EXCESSIVE_LOAD) for an unfinished head over a cap (per
    /// connection, per address, per shard).
    pub heads_refused: u64,
    /// HTTP/3 connections closed (H3_REQUEST_INCOMPLETE) for a head unfinished past its
    /// deadline.
    pub heads_timed_out: u64,
    /// Access-log lines dropped: the writer's queue was full (a disk or pipe slower than the
    /// responses).
    pub log_dropped: u64,
    /// HTTP/3 body reads the page cache could not serve: handed to the disk thread while the
    /// response waited (`crate::disk`), never read on a shard thread.
    pub disk_waits: u64,
    /// Of them, those the disk thread's full queue refused (the response waited on).
    pub disk_queue_full: u64,
    /// Body reads made on a shard thread that could block: the file system refused
    /// `RWF_NOWAIT`.
    pub disk_blocking_reads: u64,
}

impl HttpCounters {
    fn count(&self, status: u16) {
        if let Some(c) = self.classes.get(usize::from(status / 100).wrapping_sub(1)) {
            c.fetch_add(1, Relaxed);
        }
        let specific = match status {
            200 => &self.ok,
            204 => &self.no_content,
            206 => &self.partial,
            301 => &self.redirects,
            304 => &self.not_modified,
            400 => &self.bad_request,
            403 => &self.forbidden,
            404 => &self.not_found,
            405 => &self.method_not_allowed,
            412 => &self.precondition_failed,
            416 => &self.range_not_satisfiable,
            503 => &self.unavailable,
            425 => &self.too_early,
            _ => &self.server_error,
        };
        specific.fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> HttpSnapshot {
        let g = |a: &AtomicU64| a.load(Relaxed);
        HttpSnapshot {
            requests: g(&self.requests),
            by_class: std::array::from_fn(|i| g(&self.classes[i])),
            ok: g(&self.ok),
            partial: g(&self.partial),
            no_content: g(&self.no_content),
            not_modified: g(&self.not_modified),
            redirects: g(&self.redirects),
            bad_request: g(&self.bad_request),
            forbidden: g(&self.forbidden),
            not_found: g(&self.not_found),
            method_not_allowed: g(&self.method_not_allowed),
            precondition_failed: g(&self.precondition_failed),
            range_not_satisfiable: g(&self.range_not_satisfiable),
            server_error: g(&self.server_error),
            unavailable: g(&self.unavailable),
            too_early: g(&self.too_early),
            early_data: g(&self.early_data),
            body_bytes: g(&self.body_bytes),
            file_reads: g(&self.file_reads),
            file_bytes_read: g(&self.file_bytes_read),
            read_buffers_made: g(&self.read_buffers_made),
            incomplete: g(&self.incomplete),
            open_files: g(&self.open_files),
            stalled: g(&self.stalled),
            parked: g(&self.parked),
            resumed: g(&self.resumed),
            resume_refused: g(&self.resume_refused),
            streams_resetting: g(&self.resetting),
            trailers: g(&self.trailers),
            idle_closed: g(&self.idle_closed),
            rejected: g(&self.rejected),
            unfinished_heads: g(&self.unfinished_heads),
            heads_refused: g(&self.heads_refused),
            heads_timed_out: g(&self.heads_timed_out),
            log_dropped: g(&self.log_dropped),
            // The disk's: Site::counters fills them in.
            ..HttpSnapshot::default()
        }
    }
}

impl Site {
    /// The site of the files under `dir`; opens the access log, if any, for appending.
    pub fn new(dir: &Path, opts: &SiteOptions) -> Result<Site, Error> {
        let root = Root::open(dir).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) => {
                Error::Usage(format!("{} is not a directory: give the directory to serve", dir.display()))
            }
            _ => Error::Usage(format!("directory {}: {e}", dir.display())),
        })?;
        if !root.path().is_dir() {
            return Err(Error::Usage(format!("{} is not a directory: give the directory to serve", dir.display())));
        }
        let cc = &opts.cache_control;
        if cc.is_empty() || cc.bytes().any(|b| !(b == b' ' || b.is_ascii_graphic())) {
            return Err(Error::Usage(format!(
                "cache-control {cc:?}: give a non-empty value of printable ASCII, e.g. \"no-cache\" or \"max-age=60\""
            )));
        }
        let log_path = opts.access_log.clone().filter(|p| p.as_os_str() != "-");
        let log = match (&opts.access_log, &log_path) {
            (None, _) => None,
            (Some(_), None) => Some(Box::new(io::stdout()) as Box<dyn Write + Send>),
            (Some(_), Some(p)) => Some(Box::new(open_log(p)?) as Box<dyn Write + Send>),
        };
        Ok(Site {
            root,
            cache_control: cc.clone(),
            cors: opts.cors.clone(),
            alt_svc: OnceLock::new(),
            counters: HttpCounters::default(),
            log: log.map(crate::accesslog::AccessLog::start).transpose().map_err(Error::Io)?,
            log_path,
            disk: crate::disk::Disk::default(),
        })
    }

    /// Opens the access log's file again (after logrotate moved it): later lines go to a file
    /// of that name, created if need be. The one in use stays if it cannot be opened. Whether
    /// there was a file to reopen.
    pub fn reopen_log(&self) -> Result<bool, Error> {
        let (Some(log), Some(p)) = (&self.log, &self.log_path) else { return Ok(false) };
        let file = open_log(p)?;
        log.reopen(Box::new(file)).map_err(|e| Error::Usage(format!("access log {}: {e}", p.display())))?;
        Ok(true)
    }

    /// Waits (5 s at most) until every access-log line of a response finished before is
    /// written to the file and flushed (the lines are written by a thread of their own).
    pub fn flush_log(&self) -> Result<(), Error> {
        match &self.log {
            Some(log) => log.flush().map_err(Error::Usage),
            None => Ok(()),
        }
    }

    /// Announces HTTP/3 on `udp_port` of the same host in every later response (`alt-svc`).
    pub fn set_alt_svc(&self, udp_port: u16) {
        let _ = self.alt_svc.set(format!("h3=\":{udp_port}\"; ma=86400"));
    }

    /// The counters so far.
    pub fn counters(&self) -> HttpSnapshot {
        let d = &self.disk.counters;
        HttpSnapshot {
            disk_waits: d.waits.load(Relaxed),
            disk_queue_full: d.queue_full.load(Relaxed),
            disk_blocking_reads: d.blocking_reads.load(Relaxed),
            ..self.counters.snapshot()
        }
    }

    /// The answer to `req` (counted by status).
    pub fn answer(&self, req: &RequestHead<'_>) -> Answer {
        self.counters.requests.fetch_add(1, Relaxed);
        let preflight = (req.method == b"OPTIONS").then(|| self.cors.preflight(req.headers)).flatten();
        let a = match preflight {
            // A preflight carries its own CORS headers.
            Some((status, h)) => self.empty(status, h),
            None => {
                let mut a = if req.method == b"OPTIONS" && self.cors.is_on() {
                    self.empty(204, vec![("allow", "GET, HEAD, OPTIONS".into())])
                } else {
                    self.answer_uncounted(req)
                };
                self.cors.decorate(req.headers, &mut a.headers);
                a
            }
        };
        self.counters.count(a.status);
        a
    }

    /// A request answered without looking at its target: 503 (the server holds as many open
    /// responses as it may; with `retry-after: 1`) or 425 (early data that is not safe to
    /// replay), with the CORS headers its `headers` call for. Counted like any answer.
    pub fn refuse(&self, status: u16, headers: &[(&[u8], &[u8])]) -> Answer {
        self.counters.requests.fetch_add(1, Relaxed);
        let extra = if status == 503 { vec![("retry-after", "1".to_string())] } else { vec![] };
        let mut a = self.empty(status, extra);
        self.cors.decorate(headers, &mut a.headers);
        self.counters.count(status);
        a
    }

    /// A response took an open file (the [`Site::file_closed`] that follows gives it back).
    pub fn file_opened(&self) {
        self.counters.open_files.fetch_add(1, Relaxed);
    }

    /// A response gave its open file back.
    pub fn file_closed(&self) {
        self.counters.open_files.fetch_sub(1, Relaxed);
    }

    /// Counts a read of `bytes` from a file for an HTTP/3 body.
    pub(crate) fn count_read(&self, bytes: usize) {
        self.counters.file_reads.fetch_add(1, Relaxed);
        self.counters.file_bytes_read.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts a buffer made to read a body into (none of the pool's was free).
    pub(crate) fn count_read_buffer_made(&self) {
        self.counters.read_buffers_made.fetch_add(1, Relaxed);
    }

    /// Counts a response reset because its peer stopped taking it.
    pub fn count_stalled(&self) {
        self.counters.stalled.fetch_add(1, Relaxed);
    }

    /// Counts a response that gave its file back to wait for its client.
    pub(crate) fn count_parked(&self) {
        self.counters.parked.fetch_add(1, Relaxed);
    }

    /// Counts a parked response that went on, or (`false`) one that could not.
    pub(crate) fn count_resumed(&self, ok: bool) {
        let c = if ok { &self.counters.resumed } else { &self.counters.resume_refused };
        c.fetch_add(1, Relaxed);
    }

    /// A stream reset by the server waits (`true`) for quiche to forget it, or (`false`) no
    /// longer does.
    pub(crate) fn stream_resetting(&self, waiting: bool) {
        if waiting {
            self.counters.resetting.fetch_add(1, Relaxed);
        } else {
            self.counters.resetting.fetch_sub(1, Relaxed);
        }
    }

    /// The file of request target `target` opened again and positioned at `offset`, for a
    /// response that gave its file back: by the same rules as [`Site::answer`] (so a path
    /// the site refuses now is refused), and only if its ETag is still `etag` (same inode,
    /// size and modification time: a file replaced by rename, or rewritten in place, is not
    /// joined to the bytes already sent).
    pub fn reopen(&self, target: &[u8], etag: &str, offset: u64) -> Result<File, Reopen> {
        let target = std::str::from_utf8(target).map_err(|_| Reopen::Gone)?;
        let mut file = match open(&self.root, target) {
            Ok(Opened::File { file, meta, .. }) if Validators::of(&meta, SystemTime::now()).etag == etag => file,
            Ok(Opened::File { .. }) => return Err(Reopen::Changed),
            Ok(Opened::AddSlash) | Err(OpenError::Refused(_)) => return Err(Reopen::Gone),
            Err(OpenError::Io(_)) => return Err(Reopen::Failed),
        };
        file.seek(SeekFrom::Start(offset)).map_err(|_| Reopen::Failed)?;
        Ok(file)
    }

    /// The shard's unfinished request heads went up (`true`) or down by `n`.
    pub(crate) fn unfinished_heads(&self, up: bool, n: u64) {
        if up {
            self.counters.unfinished_heads.fetch_add(n, Relaxed);
        } else {
            self.counters.unfinished_heads.fetch_sub(n, Relaxed);
        }
    }

    /// Counts an HTTP/3 connection closed for its unfinished heads: over a cap (`true`) or
    /// past the deadline.
    pub(crate) fn count_heads_closed(&self, over_cap: bool) {
        let c = if over_cap { &self.counters.heads_refused } else { &self.counters.heads_timed_out };
        c.fetch_add(1, Relaxed);
    }

    /// Counts an HTTP/3 connection closed for idleness.
    pub fn count_idle_closed(&self) {
        self.counters.idle_closed.fetch_add(1, Relaxed);
    }

    /// Counts a request refused past the final GOAWAY.
    pub fn count_rejected(&self) {
        self.counters.rejected.fetch_add(1, Relaxed);
    }

    /// Counts a trailer section read and ignored.
    pub fn count_trailers(&self) {
        self.counters.trailers.fetch_add(1, Relaxed);
    }

    /// Counts a request that arrived in early data (0-RTT).
    pub fn count_early(&self) {
        self.counters.early_data.fetch_add(1, Relaxed);
    }

    /// Counts the end of a response and writes its access-log line.
    pub fn finished(&self, e: &LogEntry<'_>) {
        self.counters.body_bytes.fetch_add(e.bytes, Relaxed);
        if !e.complete {
            self.counters.incomplete.fetch_add(1, Relaxed);
        }
        if let Some(log) = &self.log {
            let line = format!(
                "{} {} {} \"{}\" {} {} {:.3}ms {}{}\n",
                humantime::format_rfc3339_millis(SystemTime::now()),
                e.peer,
                e.method.escape_default(),
                e.path.escape_default(),
                e.status,
                e.bytes,
                e.duration.as_secs_f64() * 1e3,
                e.protocol,
                if e.complete { "" } else { " incomplete" },
            );
            // Queued for the writer thread: a full queue drops the line (counted), never
            // blocks a shard on the disk.
            if !log.line(line) {
                self.counters.log_dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// Whether an access log is on (a connection's figures are gathered only then).
    pub fn logs(&self) -> bool {
        self.log.is_some()
    }

    /// Writes the access-log line of a connection that closed, QUIC or TCP (when the log is
    /// on).
    pub fn connection_closed(&self, c: &ConnClose<'_>) {
        let Some(log) = &self.log else { return };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let error = match c.error {
            Some((app, code, reason)) => {
                let reason = String::from_utf8_lossy(&reason[..reason.len().min(64)]).escape_default().to_string();
                format!(" error={}{code:#x} reason=\"{reason}\"", if app { "app:" } else { "" })
            }
            None => String::new(),
        };
        let cause = c.cause.map_or(String::new(), |e| format!(" cause=\"{e:?}\""));
        let line = format!(
            "{} {} CONNECTION {} closed_by={} duration={:.3}ms requests={} rtt={:.3}ms min_rtt={} \
             sent={} lost={} retransmitted={} cc={} cwnd={} bytes_sent={} bytes_received={}{error}{cause}\n",
            humantime::format_rfc3339_millis(SystemTime::now()),
            c.peer,
            c.protocol,
            c.closed_by,
            ms(c.duration),
            c.requests,
            ms(c.rtt),
            c.min_rtt.map_or("-".into(), |d| format!("{:.3}ms", ms(d))),
            c.sent,
            c.lost,
            c.retransmitted,
            c.cc,
            c.cwnd,
            c.bytes_sent,
            c.bytes_received,
        );
        if !log.line(line) {
            self.counters.log_dropped.fetch_add(1, Relaxed);
        }
    }

    fn answer_uncounted(&self, req: &RequestHead<'_>) -> Answer {
        let head = match req.method {
            b"GET" => false,
            b"HEAD" => true,
            _ => {
                let allow = if self.cors.is_on() { "GET, HEAD, OPTIONS" } else { "GET, HEAD" };
                return self.empty(405, vec![("allow", allow.into())]);
            }
        };
        let Ok(target) = std::str::from_utf8(req.path) else { return self.empty(400, vec![]) };
        let (mut file, meta, path) = match open(&self.root, target) {
            Ok(Opened::File { file, meta, path }) => (file, meta, path),
            Ok(Opened::AddSlash) => return self.empty(301, vec![("location", slash_location(target))]),
            Err(OpenError::Refused(r)) => return self.empty(r.status(), vec![]),
            // Out of descriptors or memory: the server is full for a moment, not broken; the
            // client may come back (503 with Retry-After), and service resumes as files close.
            Err(OpenError::Io(e)) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)) => {
                log::debug!("udpx-h3: {target}: {e}: 503");
                return self.empty(503, vec![("retry-after", "1".into())]);
            }
            Err(OpenError::Io(e)) => {
                log::warn!("udpx-h3: {target}: {e}");
                return self.empty(500, vec![]);
            }
        };
        let now = SystemTime::now();
        let v = Validators::of(&meta, now);
        let cond = Conditions::from_headers(req.headers);
        let len = meta.len();
        let outcome = evaluate(&cond, &v, len, !head, now);
        let mut h = Vec::with_capacity(12);
        match outcome {
            Outcome::PreconditionFailed => return self.empty(412, vec![]),
            Outcome::NotSatisfiable => {
                return self.empty(416, vec![("content-range", format!("bytes */{len}"))]);
            }
            Outcome::NotModified => {
                self.validators(&mut h, &v);
                self.common(&mut h, now);
                return Answer { status: 304, headers: h, body: None };
            }
            Outcome::Whole | Outcome::Part { .. } => {}
        }
        let (status, start, n) = match outcome {
            Outcome::Part { start, len: n } => {
                h.push(("content-range", format!("bytes {}-{}/{len}", start, start + n - 1)));
                (206, start, n)
            }
            _ => (200, 0, len),
        };
        h.push(("content-type", content_type(&path)));
        h.push(("content-length", n.to_string()));
        h.push(("accept-ranges", "bytes".into()));
        self.validators(&mut h, &v);
        self.common(&mut h, now);
        let body = if head || n == 0 {
            None
        } else {
            if start > 0 {
                if let Err(e) = file.seek(SeekFrom::Start(start)) {
                    log::warn!("udpx-h3: {}: {e}", path.display());
                    return self.empty(500, vec![]);
                }
            }
            Some(FileBody { file, len: n, end: start + n, etag: v.etag.clone(), id: crate::cache::FileId::of(&meta) })
        };
        Answer { status, headers: h, body }
    }

    fn validators(&self, h: &mut Vec<(&'static str, String)>, v: &Validators) {
        h.push(("etag", v.etag.clone()));
        h.push(("last-modified", httpdate::fmt_http_date(v.last_modified)));
        h.push(("cache-control", self.cache_control.clone()));
    }

    fn common(&self, h: &mut Vec<(&'static str, String)>, now: SystemTime) {
        h.push(("date", httpdate::fmt_http_date(now)));
        if let Some(a) = self.alt_svc.get() {
            h.push(("alt-svc", a.clone()));
        }
        h.push(("server", "udpx-h3".into()));
    }

    /// A response without a body.
    fn empty(&self, status: u16, mut extra: Vec<(&'static str, String)>) -> Answer {
        let mut h = vec![("content-length", "0".to_string())];
        h.append(&mut extra);
        self.common(&mut h, SystemTime::now());
        Answer { status, headers: h, body: None }
    }
}

/// The media type for a file name's extension: `mime_guess`'s table, but for the three
/// segmented-video types it lacks or names otherwise than HLS and DASH players expect.
/// The access log's file, for appending.
fn open_log(p: &Path) -> Result<std::fs::File, Error> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| Error::Usage(format!("access log {}: {e}", p.display())))
}

fn content_type(path: &Path) -> String {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("m4s") => "video/iso.segment".into(),
        Some("ts") => "video/mp2t".into(),
        Some("m3u8") => "application/vnd.apple.mpegurl".into(),
        _ => mime_guess::from_path(path).first_or_octet_stream().essence_str().to_string(),
    }
}

/// A file's validators.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Validators {
    /// Quoted, strong.
    etag: String,
    /// The modification time in whole seconds (never in the future).
    last_modified: SystemTime,
    /// Whether `last_modified` is a strong validator: the file is at least a second older
    /// than now, so a change within the same second cannot hide behind it (RFC 9110 8.8.2.2).
    date_is_strong: bool,
}

impl Validators {
    fn of(meta: &Metadata, now: SystemTime) -> Validators {
        let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
        let ns = mtime.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let etag = format!("\"{:x}-{:x}-{:x}\"", meta.len(), ns, meta.ino());
        Validators::new(etag, mtime, now)
    }

    fn new(etag: String, mtime: SystemTime, now: SystemTime) -> Validators {
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let last_modified = UNIX_EPOCH + Duration::from_secs(secs(mtime).min(secs(now)));
        let date_is_strong = mtime + Duration::from_secs(1) <= now;
        Validators { etag, last_modified, date_is_strong }
    }
}

/// The request's conditional and range fields (a list field given on several lines is
/// joined with commas, as RFC 9110 section 5.3 allows).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Conditions {
    if_match: Option<String>,
    if_none_match: Option<String>,
    if_modified_since: Option<String>,
    if_unmodified_since: Option<String>,
    /// `Some(None)`: more than one `Range` field (invalid: ignored).
    range: Option<Option<String>>,
    if_range: Option<String>,
}

impl Conditions {
    fn from_headers(headers: &[(&[u8], &[u8])]) -> Conditions {
        let mut c = Conditions::default();
        for &(name, value) in headers {
            let Ok(value) = std::str::from_utf8(value) else { continue };
            let value = value.trim();
            let join = |slot: &mut Option<String>| match slot {
                Some(s) => {
                    s.push_str(", ");
                    s.push_str(value);
                }
                None => *slot = Some(value.to_string()),
            };
            match name {
                b"if-match" => join(&mut c.if_match),
                b"if-none-match" => join(&mut c.if_none_match),
                b"if-modified-since" => c.if_modified_since = Some(value.to_string()),
                b"if-unmodified-since" => c.if_unmodified_since = Some(value.to_string()),
                b"if-range" => c.if_range = Some(value.to_string()),
                b"range" => c.range = Some(if c.range.is_some() { None } else { Some(value.to_string()) }),
                _ => {}
            }
        }
        c
    }
}

/// What the rules decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Whole,
    Part { start: u64, len: u64 },
    NotModified,
    PreconditionFailed,
    NotSatisfiable,
}

/// RFC 9110 section 13.2.2's order, then the range (GET only).
fn evaluate(c: &Conditions, v: &Validators, len: u64, get: bool, now: SystemTime) -> Outcome {
    let date = |s: &Option<String>| {
        s.as_deref().and_then(|s| httpdate::parse_http_date(s).ok()).filter(|d| *d <= now + Duration::from_secs(1))
    };
    if let Some(list) = &c.if_match {
        if !etag_list_matches(list, &v.etag, true) {
            return Outcome::PreconditionFailed;
        }
    } else if let Some(d) = date(&c.if_unmodified_since) {
        if v.last_modified > d {
            return Outcome::PreconditionFailed;
        }
    }
    if let Some(list) = &c.if_none_match {
        if etag_list_matches(list, &v.etag, false) {
            return Outcome::NotModified;
        }
    } else if let Some(d) = date(&c.if_modified_since) {
        if v.last_modified <= d {
            return Outcome::NotModified;
        }
    }
    let Some(Some(range)) = &c.range else { return Outcome::Whole };
    if !get {
        return Outcome::Whole;
    }
    if let Some(ir) = &c.if_range {
        let fresh = if ir.starts_with('"') || ir.starts_with("W/") {
            !ir.starts_with("W/") && ir == &v.etag
        } else {
            v.date_is_strong && httpdate::parse_http_date(ir).is_ok_and(|d| d == v.last_modified)
        };
        if !fresh {
            return Outcome::Whole;
        }
    }
    parse_range(range, len)
}

/// Whether `current` is in the entity-tag list `list` (or the list is `*`); `strong`: weak
/// tags never match (If-Match), else the `W/` prefixes are ignored (If-None-Match). A list
/// that does not parse matches nothing.
fn etag_list_matches(list: &str, current: &str, strong: bool) -> bool {
    if list.trim() == "*" {
        return true;
    }
    let cur = current.strip_prefix("W/").unwrap_or(current);
    let current_weak = cur.len() != current.len();
    let mut rest = list;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return false;
        }
        let weak = rest.starts_with("W/");
        let tag_start = if weak { &rest[2..] } else { rest };
        let Some(body) = tag_start.strip_prefix('"') else { return false };
        let Some(end) = body.find('"') else { return false };
        let tag = &tag_start[..end + 2];
        if tag == cur && !(strong && (weak || current_weak)) {
            return true;
        }
        rest = &body[end + 1..];
    }
}

/// A `Range` field against a representation of `len` bytes.
fn parse_range(field: &str, len: u64) -> Outcome {
    let Some((unit, set)) = field.split_once('=') else { return Outcome::Whole };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return Outcome::Whole;
    }
    let mut specs = set.split(',').map(str::trim).filter(|s| !s.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else { return Outcome::Whole };
    let Some((first, last)) = spec.split_once('-') else { return Outcome::Whole };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        let Some(n) = number(last) else { return Outcome::Whole };
        return match (n, len) {
            (0, _) => Outcome::NotSatisfiable,
            (_, 0) => Outcome::Whole,
            (n, len) => Outcome::Part { start: len - n.min(len), len: n.min(len) },
        };
    }
    let Some(a) = number(first) else { return Outcome::Whole };
    let b = if last.is_empty() {
        u64::MAX
    } else {
        match number(last) {
            Some(b) if b >= a => b,
            _ => return Outcome::Whole,
        }
    };
    if a >= len {
        return Outcome::NotSatisfiable;
    }
    let end = b.min(len - 1);
    Outcome::Part { start: a, len: end - a + 1 }
}

/// ASCII digits as a number, saturating at `u64::MAX`; `None` for anything else.
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
}

/// The `location` of a directory's 301: the request's path with its slash, and its query, as
/// nginx answers. Built from the request, so made safe for a header and a redirect: every byte
/// outside RFC 3986's path and query characters (controls, CR and LF, space, quotes, non-ASCII)
/// is percent-encoded, and a path that starts with `//` starts with one slash (`//evil.example`
/// would be a scheme-relative redirect to another host).
fn slash_location(target: &str) -> String {
    let (path, query) = target.split_once('?').map_or((target, None), |(p, q)| (p, Some(q)));
    let path = format!("/{}", path.trim_start_matches('/'));
    let mut out = String::with_capacity(target.len() + 2);
    let mut push = |s: &str, also: &[u8]| {
        for &b in s.as_bytes() {
            if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b) || also.contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    };
    push(&path, b"");
    push("/", b"");
    if let Some(q) = query {
        push("?", b"?");
        push(q, b"?");
    }
    out
}

#[cfg(test)]
mod tests;
