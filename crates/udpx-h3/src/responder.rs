//! The file server on one connection: the [`App`] every shard runs on each of its connections.
//!
//! A connection is touched only when it has news (the host calls [`App::on_turn`] after its
//! packets, its timer, or while it sends): its HTTP/3 events are read (new requests are
//! answered at once, as far as their streams take), then the responses whose streams quiche
//! reports writable again (`stream_writable_next`) go on. A response blocked on flow control
//! or congestion is parked until its stream is writable, never polled.
//!
//! ## A body: one DATA frame, read in large blocks
//! A response body of known length (every file response, ranges too) goes as one HTTP/3 DATA
//! frame: its header first, then the body's bytes as slices of the blocks it is read into,
//! handed to quiche's stream without a copy (`stream_send_zc` on [`udpx_quic::bufs`]), and at
//! the end an empty DATA frame that carries the FIN through quiche's HTTP/3 layer (so it knows
//! the stream is finished). So a slice needs no frame header of its own, and a block is read
//! whatever the stream takes at the moment: [`crate::cache::BLOCK`] (256 KiB) at a time for a
//! body longer than [`crate::http::CHUNK`], the rest of it for a shorter one, in one system
//! call each (it was one read per turn's stream capacity, a few kilobytes toward a client
//! that acknowledges often). The only user-space copy of a body byte after the read is
//! quiche's into a packet. quiche holds each slice until it is acknowledged; the shard then
//! reuses its vector (bounded pools), so in steady state no block is allocated.
//!
//! Memory: a response reading blocks holds at most about two of them (the one it sends from
//! and the last one's unacknowledged tail); a shard lets [`READ_AHEAD`] bytes of such blocks
//! be held at once, and a response past that bound reads [`crate::http::CHUNK`] at a time.
//! Reads stay on the shard thread: from the page cache they do not block; a cold disk would.
//!
//! Bounds: a response with a body holds an open file until it ends; a connection may hold
//! [`crate::ServeConfig::max_open_per_conn`] of them, an address (IPv6: a /64)
//! [`crate::ServeConfig::max_open_per_addr`] on a shard, and a shard [`crate::ServeConfig::max_open_per_shard`];
//! past any of them the answer is 503 with `retry-after`. The count is carried by the open file
//! itself (`OpenFile`) and given back when it is dropped, so every way a response can end
//! (sent, reset by the peer, stalled, its connection closed) gives it back exactly once. A
//! request that arrives in 0-RTT (its address not yet proven: it may be forged and replayed)
//! claims from a smaller budget of its own, an eighth of the shard's (425 Too Early past it,
//! and the client asks again after its handshake). A connection with no response under way
//! and no new request for [`crate::ServeConfig::idle_timeout`] is closed (request heads a peer
//! leaves unfinished are held by quiche until then).
//!
//! ## A paused stream is not an attack
//! A browser's media stack stops reading a video request when its buffer is full, often for
//! longer than the stall timeout, while its other requests on the connection go on. A
//! response that took less than [`MIN_PROGRESS`] bytes in [`crate::ServeConfig::stall_timeout`]
//! is *parked*: it gives its open file back (and the chunk it had read but not sent) and
//! waits without them, costing a few hundred bytes. When the client reads again (quiche
//! reports the stream writable) the file is opened again by the same rules and goes on from
//! where it stopped, if its ETag is still the response's (same inode, size and modification
//! time); if it changed, is gone, or an open-file bound is reached, the stream is reset
//! (counted `resume_refused`). A response parked for [`crate::ServeConfig::park_timeout`] is
//! reset (RESET_STREAM, and STOP_SENDING while its request side is open; counted `stalled`).
//! No other stream of the connection is touched.
//!
//! A stream the server resets stays in quiche's HTTP/3 layer until the transport has
//! forgotten it (the peer acknowledged the reset) and a send on it fails; quiche says nothing
//! when that happens. So each connection keeps its reset streams on a list looked at on its
//! later turns: once the transport no longer knows a stream, one more call makes the HTTP/3
//! layer drop it (`send_body` if its headers went, `send_response` if none did), and it
//! leaves the list (the `streams_resetting` gauge returns to 0). Without this a connection
//! that reset 100 streams could open no more: quiche gives a peer a new stream only for one
//! it has collected.
//!
//! A request stream has one response: a second HEADERS frame on it is the request's trailer
//! section (RFC 9114 4.1), read and ignored (`trailers` on /metrics); quiche refuses a third.
//! The server advertises the flow-control credit a request needs, not a download's: a request
//! stream takes [`crate::server::REQUEST_WINDOW`] and a connection [`crate::server::CONNECTION_WINDOW`] of out-of-order data
//! (see [`crate::tls`]). quiche's HTTP/3 layer copies an unfinished HEADERS frame out of the
//! stream (up to 1.5 x [`crate::server::MAX_FIELD_SECTION`]) and gives its credit back, so what one connection
//! can pin is at most 100 streams x 24 KiB plus the window: about 2.4 MiB, for at most
//! [`crate::ServeConfig::idle_timeout`] unless it also completes requests.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiche::h3::NameValue;
use udpx_quic::bufs::{Buf, BufPool};
use udpx_quic::App;

use crate::cache::BLOCK;
use crate::cache::{BlockCache, FileId, Found};
use crate::disk::Warming;
use crate::goaway::{GoAway, H3_REQUEST_REJECTED};
use crate::heads::{HeadBudget, Heads};
use crate::http::{LogEntry, RequestHead, Site, CHUNK};
use crate::tls::MAX_FIELD_SECTION;

/// The responder of one shard (see the module docs).
pub(crate) struct FileServer {
    /// Where bodies are read into ([`Reader`]).
    reader: Reader,
    site: Arc<Site>,
    scratch: Vec<u8>,
    h3_config: quiche::h3::Config,
    /// The shard's open files, by address and in all.
    budget: Rc<Budget>,
    bounds: Bounds,
    /// The shard is draining (graceful stop) since then, its GOAWAYs spread over how long:
    /// every connection goes through the two-step GOAWAY ([`crate::goaway`]), from its own
    /// moment in the spread on, and closes once its responses are sent.
    draining: Option<(Instant, Duration)>,
    /// Connections accepted so far: each one's place in a drain's spread.
    accepted: u64,
    /// The shard's unfinished request heads ([`crate::heads`]).
    heads: HeadBudget,
}

/// The open-file bounds and the stall timeout (from [`crate::ServeConfig`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub per_conn: usize,
    pub per_addr: usize,
    pub per_shard: usize,
    /// Of the shard's, what requests that came in 0-RTT may hold.
    pub per_shard_early: usize,
    pub stall: Duration,
    /// A parked response is reset after this long.
    pub park: Duration,
    /// No response and no request for this long: the connection is closed.
    pub idle: Duration,
    /// The congestion controller's name, for the close line.
    pub cc: &'static str,
}

impl FileServer {
    /// A shard's responder for `site` within `bounds`.
    pub(crate) fn new(site: Arc<Site>, bounds: Bounds, cache: Option<Arc<BlockCache>>) -> FileServer {
        let mut h3_config = quiche::h3::Config::new().expect("quiche's h3::Config::new cannot fail");
        // A request's field section at most this large (quiche refuses a HEADERS frame over
        // 1.5 times it with H3_EXCESSIVE_LOAD before buffering it).
        h3_config.set_max_field_section_size(MAX_FIELD_SECTION);
        FileServer {
            budget: Rc::new(Budget {
                site: site.clone(),
                shard: Cell::new(0),
                early: Cell::new(0),
                by_addr: RefCell::default(),
            }),
            reader: Reader {
                chunks: BufPool::new(CHUNK, BODY_BUFFERS_KEPT),
                blocks: BufPool::new(BLOCK, BLOCKS_KEPT),
                ahead: Rc::new(Cell::new(0)),
                site: Arc::clone(&site),
                cache,
            },
            site,
            scratch: vec![0; CHUNK],
            h3_config,
            bounds,
            draining: None,
            accepted: 0,
            heads: HeadBudget::default(),
        }
    }
}

/// One shard's open files: how many in all and per address. Only [`OpenFile`] changes it.
struct Budget {
    site: Arc<Site>,
    shard: Cell<usize>,
    /// Of them, those taken by requests in 0-RTT.
    early: Cell<usize>,
    /// Addresses holding at least one (an entry leaves at zero: bounded by the files open).
    by_addr: RefCell<HashMap<IpAddr, usize>>,
}

/// A response's claim on the open-file bounds: taken with its file, given back (connection,
/// address, shard, the `open_files` gauge) when dropped, whichever way the response ends.
struct OpenFile {
    budget: Rc<Budget>,
    conn: Rc<Cell<usize>>,
    addr: IpAddr,
    /// Taken by a request in 0-RTT (counted in the early budget too).
    early: bool,
}

impl OpenFile {
    /// Takes one, or `None` when the connection, the address or the shard holds its bound (or,
    /// for a request in 0-RTT, the shard's early budget).
    fn take(budget: &Rc<Budget>, conn: &Rc<Cell<usize>>, addr: IpAddr, b: &Bounds, early: bool) -> Option<OpenFile> {
        let held_by_addr = budget.by_addr.borrow().get(&addr).copied().unwrap_or(0);
        if conn.get() >= b.per_conn
            || held_by_addr >= b.per_addr
            || budget.shard.get() >= b.per_shard
            || (early && budget.early.get() >= b.per_shard_early)
        {
            return None;
        }
        conn.set(conn.get() + 1);
        budget.shard.set(budget.shard.get() + 1);
        if early {
            budget.early.set(budget.early.get() + 1);
        }
        *budget.by_addr.borrow_mut().entry(addr).or_insert(0) += 1;
        budget.site.file_opened();
        Some(OpenFile { budget: budget.clone(), conn: conn.clone(), addr, early })
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        self.conn.set(self.conn.get().saturating_sub(1));
        self.budget.shard.set(self.budget.shard.get().saturating_sub(1));
        if self.early {
            self.budget.early.set(self.budget.early.get().saturating_sub(1));
        }
        let mut by_addr = self.budget.by_addr.borrow_mut();
        if let Some(n) = by_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                by_addr.remove(&self.addr);
            }
        }
        self.budget.site.file_closed();
    }
}

/// A response being sent.
struct Response {
    /// Headers not yet taken by quiche (a full stream refuses them).
    headers: Option<Vec<quiche::h3::Header>>,
    /// The headers end the stream (HEAD, no body, errors).
    fin_with_headers: bool,
    body: Option<Body>,
    /// For the access log (the target cut to [`LOGGED_TARGET`] bytes).
    method: String,
    target: String,
    status: u16,
    started: Instant,
    /// Body bytes quiche took.
    sent: u64,
    /// When it last made progress (headers taken, or [`MIN_PROGRESS`] body bytes since the
    /// last time): the stall timeout counts from here.
    progressed: Instant,
    /// Body bytes taken since `progressed`.
    unstamped: u64,
    /// Parked since then (see the module docs): it holds no file and is reset at the park
    /// timeout unless its client reads again.
    parked_since: Option<Instant>,
}

impl Response {
    /// When the stall rule looks at it next: the park timeout if parked, else the stall
    /// timeout after its last progress.
    fn next_check(&self, b: &Bounds) -> Instant {
        self.parked_since.map_or(self.progressed + b.stall, |t| t + b.park)
    }
}

struct Body {
    /// The file and its claim on the open-file bounds (given back together); `None` while
    /// the response is parked.
    open: Option<(File, OpenFile)>,
    /// The body's length: its one DATA frame's.
    total: u64,
    /// The file's version (the cache's key; a resumed response's file must be the same).
    id: FileId,
    /// The DATA frame's header has gone to quiche.
    framed: bool,
    /// Its share of the shard's read-ahead, while it reads [`BLOCK`]s.
    ahead: Option<Ahead>,
    /// Bytes of the range not yet read.
    left: u64,
    /// The file offset just past the range: the next read starts at `end - left`.
    end: u64,
    /// Read, not yet (all) taken by quiche.
    pending: Option<Buf>,
    /// The request target and the file's ETag, to open it again after a park.
    target: Box<[u8]>,
    etag: String,
    /// The disk thread's read of the range the page cache lacked, while the response waits
    /// for it (`crate::disk`).
    warming: Option<Warming>,
    /// Tries since the page cache last served a read: the wait before the next doubles.
    disk_tries: u32,
}

impl Body {
    /// Gives the file, its claim and the chunk read but not yet taken back: what was not
    /// taken is read again on resuming. (quiche sends every chunk as whole DATA frames, so
    /// no frame is left half-sent.)
    fn park(&mut self) {
        if let Some(p) = self.pending.take() {
            self.left += p.len() as u64;
        }
        self.open = None;
        self.ahead = None;
    }
}

/// Where a shard reads its bodies: vectors quiche takes without copying
/// ([`udpx_quic::bufs`]), reused once acknowledged, [`CHUNK`]-sized and [`BLOCK`]-sized, and
/// the read-ahead the blocks may hold.
struct Reader {
    chunks: BufPool,
    blocks: BufPool,
    /// Responses holding an [`Ahead`] now.
    ahead: Rc<Cell<usize>>,
    site: Arc<Site>,
    /// The server's block cache (`--cache-size`), if on.
    cache: Option<Arc<BlockCache>>,
}

impl Reader {
    /// The next piece of `b`'s range in a buffer quiche can keep: from the block cache if on
    /// (the rest of the cached block that holds it), else read (positionally) a [`BLOCK`]
    /// while more than a [`CHUNK`] is left and the shard's read-ahead allows, else at most a
    /// [`CHUNK`]. `Err` when the file failed, shrank or changed under us.
    ///
    /// Reads come from the page cache only: where it lacks a byte the range goes to the disk
    /// thread and the answer is `Err(WouldBlock)`; the response tries again later
    /// ([`Progress::Disk`]).
    fn read(&mut self, b: &mut Body) -> std::io::Result<Buf> {
        let got = self.read_cached(b);
        match &got {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if b.warming.as_ref().is_none_or(Warming::done) {
                    if let Some((file, _)) = b.open.as_ref() {
                        let offset = b.end - b.left;
                        let start = offset - offset % BLOCK as u64;
                        let len = (BLOCK as u64).min(b.end - start) as usize;
                        b.warming = self.site.disk.warm(file, start, len);
                    }
                }
                b.disk_tries += 1;
            }
            _ => (b.warming, b.disk_tries) = (None, 0),
        }
        got
    }

    fn read_cached(&mut self, b: &mut Body) -> std::io::Result<Buf> {
        let offset = b.end - b.left;
        let counters = &self.site.disk.counters;
        let read = |f: &File, buf: &mut [u8], at: u64| crate::disk::read_cached(f, buf, at, counters);
        if let (Some(cache), Some((file, _))) = (&self.cache, b.open.as_ref()) {
            let block = match cache.block_with(file, &b.id, offset, read)? {
                Found::Block(block) => Some(block),
                Found::Filled(block) => {
                    self.site.count_read(block.len());
                    Some(block)
                }
                Found::NoRoom => None,
            };
            if let Some(block) = block {
                let within = (offset % BLOCK as u64) as usize;
                let n = ((block.len() - within) as u64).min(b.left) as usize;
                let buf =
                    Buf::of(&block, within, n).ok_or_else(|| std::io::Error::other("a block shorter than its file"))?;
                b.left -= n as u64;
                return Ok(buf);
            }
        }
        if b.left > CHUNK as u64 && b.ahead.is_none() && self.ahead.get() < READ_AHEAD / (2 * BLOCK) {
            self.ahead.set(self.ahead.get() + 1);
            b.ahead = Some(Ahead(self.ahead.clone()));
        }
        let (pool, most) = match b.ahead {
            Some(_) if b.left > CHUNK as u64 => (&mut self.blocks, BLOCK),
            _ => (&mut self.chunks, CHUNK),
        };
        let n = (most as u64).min(b.left) as usize;
        let Some((file, _)) = b.open.as_mut() else {
            return Err(std::io::Error::other("the response holds no file"));
        };
        let made = pool.made;
        let buf = pool.fill(n, &[], |s| read(file, s, offset))?;
        self.site.count_read(n);
        if pool.made != made {
            self.site.count_read_buffer_made();
        }
        b.left -= n as u64;
        Ok(buf)
    }
}

/// A response's share of its shard's read-ahead ([`READ_AHEAD`]), given back when dropped.
struct Ahead(Rc<Cell<usize>>);

impl Drop for Ahead {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

pub(crate) struct ConnState {
    h3: Option<quiche::h3::Connection>,
    peer: SocketAddr,
    /// The address its files count against (IPv6: the /64).
    addr: IpAddr,
    /// Responses under way, by stream.
    responses: HashMap<u64, Response>,
    /// Request streams whose request was answered and whose request side has not ended: a
    /// HEADERS frame on one of them is a trailer section. At most the streams the peer may
    /// have open (an entry leaves at `Finished`, `Reset` or with the connection).
    requests: Vec<u64>,
    /// Of the responses, those with an open file.
    open: Rc<Cell<usize>>,
    /// When the stall rule next looks at its responses: the earliest stall or park timeout
    /// (`None`: no response waits).
    stall_check: Option<Instant>,
    /// When the last request head arrived or the last response was taken whole (or the
    /// connection was accepted): with no response under way, the connection is closed at the
    /// idle timeout after it. (Counted from the last request alone, a response that ended after
    /// a long pause would have its connection, and its last bytes in flight, closed at once.)
    last_active: Instant,
    /// We closed it (idle, its HTTP/3 setup failed, a drain's end): it only drains now, and
    /// asks for no more turns.
    closing: bool,
    /// The highest request stream ID seen (for the final GOAWAY).
    last_request_id: Option<u64>,
    /// Responses waiting for the disk thread ([`Progress::Disk`]), tried again at `disk_at`.
    disk: Vec<u64>,
    disk_at: Option<Instant>,
    /// The graceful stop's GOAWAY frames.
    goaway: GoAway,
    /// Streams whose response quiche has taken whole but may not have delivered yet (pruned
    /// once quiche has collected them, acknowledged): a draining connection closes only after.
    sent: Vec<u64>,
    /// Its place in a drain's spread, 0 to 1 (evenly spread over the connections: the golden
    /// ratio's multiples modulo 1).
    spread_at: f64,
    /// The first error quiche closed it for ([`udpx_quic::App::failed`]), for its close line.
    failure: Option<quiche::Error>,
    /// Streams the server reset that quiche's HTTP/3 layer still holds.
    resets: Resets,
    /// Its request streams with data and no whole head yet.
    heads: Heads,
    /// When it was accepted, and the requests it made: for its close line.
    opened: Instant,
    served: u64,
}

impl FileServer {
    /// When connection `st` begins its GOAWAY: `None` unless draining.
    fn goaway_from(&self, st: &ConnState) -> Option<Instant> {
        self.draining.map(|(since, spread)| since + spread.mul_f64(st.spread_at))
    }
}

/// Bytes a response must take in each stall window (or end): the TCP listener's minimum rate
/// (16 KiB every 20 s, 800 B/s). A peer that opens its window a few bytes at a time does not
/// keep a response, and its file, for ever.
pub const MIN_PROGRESS: u64 = 16 << 10;

/// Finished responses a connection remembers before it drops those quiche has collected.
const SENT_KEPT: usize = 16;

/// Bytes of a request target kept for the access log.
const LOGGED_TARGET: usize = 1024;

/// H3_NO_ERROR (RFC 9114 8.1): an idle connection closed.
const H3_NO_ERROR: u64 = 0x100;
/// H3_REQUEST_CANCELLED (RFC 9114 8.1): the peer reset its request, or the server gave up
/// on a parked response; the response goes too.
const H3_REQUEST_CANCELLED: u64 = 0x10c;
/// H3_EXCESSIVE_LOAD (RFC 9114 8.1): more unfinished request heads than a cap allows.
const H3_EXCESSIVE_LOAD: u64 = 0x107;
/// H3_REQUEST_INCOMPLETE (RFC 9114 8.1): a request head unfinished past its deadline.
const H3_REQUEST_INCOMPLETE: u64 = 0x10d;
/// H3_INTERNAL_ERROR (RFC 9114 8.1): the file failed under a response, or changed before a
/// parked one could go on.
const H3_INTERNAL_ERROR: u64 = 0x102;

impl App for FileServer {
    type State = ConnState;

    fn accepted(&mut self, conn: &udpx_quic::Connection) -> ConnState {
        let peer = conn.path_stats().next().map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |p| p.peer_addr);
        ConnState {
            h3: None,
            peer,
            addr: udpx_quic::admission::ip_key(peer.ip()),
            responses: HashMap::new(),
            requests: Vec::new(),
            open: Rc::new(Cell::new(0)),
            stall_check: None,
            last_active: Instant::now(),
            closing: false,
            last_request_id: None,
            disk: Vec::new(),
            disk_at: None,
            goaway: GoAway::None,
            sent: Vec::new(),
            spread_at: {
                self.accepted += 1;
                (self.accepted as f64 * 0.618_033_988_749_895).fract()
            },
            resets: Resets::default(),
            heads: Heads::default(),
            opened: Instant::now(),
            served: 0,
            failure: None,
        }
    }

    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, st: &mut ConnState) {
        if st.closing {
            return;
        }
        if st.h3.is_none() {
            match quiche::h3::Connection::with_transport(conn, &self.h3_config) {
                Ok(h) => st.h3 = Some(h),
                Err(e) => {
                    log::debug!("udpx-h3: {}: HTTP/3 refused: {e}", conn.trace_id());
                    let _ = conn.close(false, 0x101, b"h3 setup failed");
                    st.closing = true;
                    return;
                }
            }
        }
        let now = Instant::now();
        // The host may fire a deadline up to its pacing slack early: a check due within it is
        // due now (else the same deadline comes back at once, a spin).
        let due = now + udpx_quic::PACING_SLACK;
        if st.stall_check.is_some_and(|t| t <= due) {
            self.park_or_reset_stalled(conn, st, now);
        }
        if st.heads.deadline().is_some_and(|t| t <= due) {
            // A request head unfinished for HEAD_DEADLINE: quiche holds what came of it.
            self.site.count_heads_closed(false);
            let _ = conn.close(true, H3_REQUEST_INCOMPLETE, b"request head unfinished");
            st.closing = true;
            return;
        }
        if st.responses.is_empty() && st.last_active + self.bounds.idle <= due {
            self.site.count_idle_closed();
            let _ = conn.close(true, H3_NO_ERROR, b"idle");
            st.closing = true;
            return;
        }
        let goaway_due = self.goaway_from(st).is_some_and(|t| t <= due);
        // Taken for the turn (put back below), so that the connection's state stays free to
        // borrow whole.
        let Some(mut h3) = st.h3.take() else { return };
        st.resets.collect(&mut h3, conn, &self.site);
        if goaway_due {
            st.goaway.step(&mut h3, conn, st.last_request_id, now);
        }
        // New requests and stream events (`poll_requests`). Every HTTP/3 event comes from
        // stream data, and the loop polls until quiche has no event left (its queue of finished
        // streams included): with no stream readable (the turn of a PING or an acknowledgement)
        // there is nothing to poll, and `poll` would still look up the peer's three control
        // streams. Request streams with data this turn (`arrived`): those still without a head
        // after the poll are unfinished heads (quiche holds their partial HEADERS frames).
        let (arrived, fresh) = if conn.is_readable() {
            let arrived: Vec<u64> = conn.readable().filter(|&sid| sid % 4 == 0).collect();
            (arrived, self.poll_requests(conn, st, &mut h3, now))
        } else {
            (Vec::new(), Vec::new())
        };
        if !self.count_unfinished(conn, st, &arrived, now) {
            st.h3 = Some(h3);
            return;
        }
        // The new responses go as far as their streams take them; then the parked ones whose
        // streams quiche says are writable again, and those that waited for the disk when
        // their time has come. No other response is looked at.
        let writable = std::iter::from_fn(|| conn.stream_writable_next()).collect::<Vec<u64>>();
        let disk = if st.disk_at.is_some_and(|t| t <= due) {
            st.disk_at = None;
            std::mem::take(&mut st.disk)
        } else {
            Vec::new()
        };
        for sid in fresh.into_iter().chain(writable).chain(disk) {
            let Some(r) = st.responses.get_mut(&sid) else { continue };
            // A parked response whose client reads again: its file opened again, or the
            // stream reset.
            let outcome = match resume(&self.budget, &self.bounds, &st.open, st.addr, r, now) {
                Ok(()) => progress(&mut h3, conn, sid, r, &mut self.reader, now),
                Err(()) => Progress::Failed,
            };
            match outcome {
                Progress::Disk => {
                    let tries = r.body.as_ref().map_or(1, |b| b.disk_tries);
                    let at = now + disk_wait(tries);
                    st.disk_at = Some(st.disk_at.map_or(at, |t| t.min(at)));
                    if !st.disk.contains(&sid) {
                        st.disk.push(sid);
                    }
                    let check = r.next_check(&self.bounds);
                    st.stall_check = Some(st.stall_check.map_or(check, |t| t.min(check)));
                }
                Progress::Waiting => {
                    // It must move again within the stall timeout.
                    let check = r.next_check(&self.bounds);
                    st.stall_check = Some(st.stall_check.map_or(check, |t| t.min(check)));
                }
                Progress::Done => {
                    if let Some(r) = st.responses.remove(&sid) {
                        self.finish(st.peer, r, true);
                    }
                    st.last_active = now;
                    st.sent.push(sid);
                    if st.sent.len() > SENT_KEPT {
                        st.sent.retain(|&s| conn.stream_capacity(s).is_ok());
                    }
                }
                Progress::Failed => self.abandon(conn, st, sid, H3_INTERNAL_ERROR),
            }
        }
        st.h3 = Some(h3);
        if st.responses.is_empty() && st.goaway.done(|| conn.stats().sent as u64) && {
            // A stream quiche still holds has data not yet acknowledged (or its request side
            // open): closing now would cut its end off.
            st.sent.retain(|&s| conn.stream_capacity(s).is_ok());
            st.sent.is_empty()
        } {
            // Draining, and the last response is sent: the connection ends cleanly.
            let _ = conn.close(true, H3_NO_ERROR, b"shutting down");
            st.closing = true;
        }
    }

    fn wake_at(&self, st: &ConnState) -> Option<Instant> {
        if st.closing {
            return None;
        }
        let idle = st.responses.is_empty().then_some(st.last_active + self.bounds.idle);
        let goaway = if st.goaway == GoAway::None { self.goaway_from(st) } else { st.goaway.due() };
        [st.stall_check, idle, goaway, st.heads.deadline(), st.disk_at].into_iter().flatten().min()
    }

    fn drain(&mut self, spread: Duration) {
        self.draining.get_or_insert((Instant::now(), spread));
    }

    fn undrain(&mut self) {
        // Connections whose GOAWAY began finish it (their clients come back on new ones); the
        // others, and new ones, are served as before.
        self.draining = None;
    }

    fn drain_deadline(&mut self, conn: &mut udpx_quic::Connection, st: &mut ConnState) {
        // Its responses end unsent (counted in `incomplete` when it is dropped).
        let _ = conn.close(true, H3_NO_ERROR, b"shutting down");
        st.closing = true;
    }

    fn failed(&mut self, _: &udpx_quic::Connection, st: &mut ConnState, err: &quiche::Error) {
        st.failure.get_or_insert(*err);
    }

    fn closed(&mut self, conn: &udpx_quic::Connection, mut state: ConnState) {
        self.log_close(conn, &state);
        // Responses still under way when the connection ended were not sent whole.
        for (_, r) in state.responses.drain() {
            self.finish(state.peer, r, false);
        }
        // Its reset streams went with it, and its unfinished heads.
        state.resets.forget_all(&self.site);
        let n = self.heads.count();
        self.heads.end_all(&mut state.heads, state.addr);
        self.site.unfinished_heads(false, (n - self.heads.count()) as u64);
    }
}

impl FileServer {
    /// Polls `h3` until quiche has no event left: new requests get their responses made
    /// (returned, in order, to go as far as their streams take them), trailers and bodies are
    /// read and dropped, finished and reset requests leave the connection's list.
    fn poll_requests(
        &mut self,
        conn: &mut udpx_quic::Connection,
        st: &mut ConnState,
        h3: &mut quiche::h3::Connection,
        now: Instant,
    ) -> Vec<u64> {
        let mut fresh: Vec<u64> = Vec::new();
        loop {
            match h3.poll(conn) {
                Ok((sid, quiche::h3::Event::Headers { list, .. })) => {
                    self.heads_end(st, sid);
                    if st.requests.contains(&sid) {
                        // The request's trailers (RFC 9114 4.1): its response is made.
                        self.site.count_trailers();
                        continue;
                    }
                    if st.goaway.rejects(sid) {
                        // Past the final GOAWAY: not processed, safe to send again
                        // elsewhere (RFC 9114 5.2).
                        self.site.count_rejected();
                        let _ = conn.stream_shutdown(sid, quiche::Shutdown::Read, H3_REQUEST_REJECTED);
                        st.resets.reset(conn, &self.site, sid, H3_REQUEST_REJECTED, false);
                        continue;
                    }
                    st.last_request_id = Some(st.last_request_id.map_or(sid, |m| m.max(sid)));
                    st.requests.push(sid);
                    st.served += 1;
                    st.last_active = now;
                    let r = self.respond(&list, conn.is_in_early_data(), &st.open, st.addr, now);
                    st.responses.insert(sid, r);
                    fresh.push(sid);
                }
                Ok((sid, quiche::h3::Event::Data)) => {
                    // A request body: not used by GET or HEAD; read and dropped.
                    while let Ok(n) = h3.recv_body(conn, sid, &mut self.scratch) {
                        if n == 0 {
                            break;
                        }
                    }
                }
                Ok((sid, quiche::h3::Event::Finished)) => {
                    self.heads_end(st, sid);
                    st.requests.retain(|&s| s != sid);
                }
                Ok((sid, quiche::h3::Event::Reset(_))) => {
                    self.heads_end(st, sid);
                    // The peer's side ended; ours ends too (a response still under way,
                    // or one quiche still holds).
                    st.requests.retain(|&s| s != sid);
                    self.abandon(conn, st, sid, H3_REQUEST_CANCELLED);
                }
                Ok(_) => {}
                Err(quiche::h3::Error::Done) => break,
                Err(e) => {
                    log::debug!("udpx-h3: {}: {e}", conn.trace_id());
                    break;
                }
            }
        }
        fresh
    }

    /// The access log's line of a connection that closed.
    fn log_close(&self, conn: &udpx_quic::Connection, st: &ConnState) {
        // Its figures are gathered only when there is a log to write them to.
        if !self.site.logs() {
            return;
        }
        let s = conn.stats();
        let path = conn.path_stats().find(|p| p.active);
        let (closed_by, error) = match (conn.local_error(), conn.peer_error()) {
            (Some(e), _) => ("server", Some((e.is_app, e.error_code, &e.reason[..]))),
            (None, Some(e)) => ("client", Some((e.is_app, e.error_code, &e.reason[..]))),
            (None, None) if conn.is_timed_out() => ("idle", None),
            (None, None) => ("server", None),
        };
        self.site.connection_closed(&crate::http::ConnClose {
            protocol: "h3",
            peer: path.as_ref().map_or(st.peer, |p| p.peer_addr),
            duration: st.opened.elapsed(),
            rtt: path.as_ref().map_or(Duration::ZERO, |p| p.rtt),
            min_rtt: path.as_ref().and_then(|p| p.min_rtt),
            sent: s.sent as u64,
            lost: s.lost as u64,
            retransmitted: s.retrans as u64,
            cc: self.bounds.cc,
            cwnd: path.as_ref().map_or(0, |p| p.cwnd as u64),
            bytes_sent: s.sent_bytes,
            bytes_received: s.recv_bytes,
            requests: st.served,
            closed_by,
            error,
            cause: st.failure,
        });
    }

    /// Stream `sid`'s head arrived, or the stream ended: no longer an unfinished head.
    fn heads_end(&self, st: &mut ConnState, sid: u64) {
        if st.heads.has(sid) {
            self.heads.end(&mut st.heads, st.addr, sid);
            self.site.unfinished_heads(false, 1);
        }
    }

    /// Counts the request streams of `arrived` (readable this turn) that still have no head
    /// after the poll: data came and quiche holds it as a partial HEADERS frame. Over a cap
    /// the connection is closed (H3_EXCESSIVE_LOAD); whether it goes on.
    fn count_unfinished(
        &mut self,
        conn: &mut udpx_quic::Connection,
        st: &mut ConnState,
        arrived: &[u64],
        now: Instant,
    ) -> bool {
        for &sid in arrived {
            let headed = st.requests.contains(&sid) || st.responses.contains_key(&sid) || st.resets.has(sid);
            if headed || st.heads.has(sid) || conn.stream_finished(sid) {
                continue;
            }
            match self.heads.begin(&mut st.heads, st.addr, sid, now) {
                Ok(()) => self.site.unfinished_heads(true, 1),
                Err(over) => {
                    log::debug!("udpx-h3: {}: unfinished request heads over the {over:?} cap: closed", conn.trace_id());
                    self.site.count_heads_closed(true);
                    let _ = conn.close(true, H3_EXCESSIVE_LOAD, b"too many unfinished request heads");
                    st.closing = true;
                    return false;
                }
            }
        }
        true
    }

    /// The response to a request head: `early`, it came in 0-RTT; `conn_open` and `addr`, what
    /// its connection and address hold of the open-file bounds.
    fn respond(
        &self,
        list: &[quiche::h3::Header],
        early: bool,
        conn_open: &Rc<Cell<usize>>,
        addr: IpAddr,
        now: Instant,
    ) -> Response {
        let (mut method, mut path) = (None, None);
        let mut fields = Vec::with_capacity(list.len());
        for h in list {
            match h.name() {
                b":method" => method = Some(h.value()),
                b":path" => path = Some(h.value()),
                n if n.starts_with(b":") => {}
                n => fields.push((n, h.value())),
            }
        }
        let text = |b: Option<&[u8]>| {
            let b = b.unwrap_or(b"-");
            String::from_utf8_lossy(&b[..b.len().min(LOGGED_TARGET)]).into_owned()
        };
        let safe = matches!(method, Some(b"GET" | b"HEAD"));
        // A claim on the bounds first, so that no file is opened past them.
        let claim = OpenFile::take(&self.budget, conn_open, addr, &self.bounds, early);
        let mut answer = match (method, path) {
            // Early data can be replayed: only safe methods are answered from it (RFC 8470),
            // and only within the early budget (the client asks again after its handshake).
            _ if early && !safe => self.site.refuse(425, &fields),
            (Some(_), Some(_)) if early && claim.is_none() => self.site.refuse(425, &fields),
            (Some(_), Some(_)) if claim.is_none() => self.site.refuse(503, &fields),
            (Some(m), Some(p)) => self.site.answer(&RequestHead { method: m, path: p, headers: &fields }),
            // Without :method or :path the request is malformed (RFC 9114 4.3.1).
            _ => self.site.answer(&RequestHead { method: b"GET", path: b"", headers: &[] }),
        };
        if early {
            self.site.count_early();
        }
        let status = answer.status;
        let mut headers = Vec::with_capacity(answer.headers.len() + 1);
        headers.push(quiche::h3::Header::new(b":status", status.to_string().as_bytes()));
        for (n, v) in &answer.headers {
            headers.push(quiche::h3::Header::new(n.as_bytes(), v.as_bytes()));
        }
        // The claim goes with a body; a response without one gives it back here.
        let body = match (answer.body.take(), claim, path) {
            (Some(b), Some(claim), Some(p)) => Some(Body {
                open: Some((b.file, claim)),
                total: b.len,
                id: b.id,
                framed: false,
                ahead: None,
                left: b.len,
                end: b.end,
                pending: None,
                target: p.into(),
                etag: b.etag,
                warming: None,
                disk_tries: 0,
            }),
            _ => None,
        };
        Response {
            headers: Some(headers),
            fin_with_headers: body.is_none(),
            body,
            method: text(method),
            target: text(path),
            status,
            started: now,
            sent: 0,
            progressed: now,
            unstamped: 0,
            parked_since: None,
        }
    }

    /// A response is over: logged and counted; dropping it closes its file and gives back its
    /// claim.
    fn finish(&mut self, peer: SocketAddr, r: Response, complete: bool) {
        self.site.finished(&LogEntry {
            peer,
            method: &r.method,
            path: &r.target,
            status: r.status,
            bytes: r.sent,
            duration: r.started.elapsed(),
            protocol: "h3",
            complete,
        });
    }

    /// The stall rule, on connection `st`'s responses (see the module docs): one that made no
    /// progress for the stall timeout is parked, one parked for the park timeout is reset;
    /// then the next check is set. Runs only when a check is due (its `wake_at`), over that
    /// connection's responses only.
    fn park_or_reset_stalled(&mut self, conn: &mut udpx_quic::Connection, st: &mut ConnState, now: Instant) {
        let due = now + udpx_quic::PACING_SLACK;
        let mut given_up = Vec::new();
        for (&sid, r) in st.responses.iter_mut() {
            if r.next_check(&self.bounds) > due {
                continue;
            }
            if r.parked_since.is_some() {
                given_up.push(sid);
                continue;
            }
            if let Some(b) = r.body.as_mut() {
                b.park();
            }
            r.parked_since = Some(now);
            self.site.count_parked();
        }
        for sid in given_up {
            self.site.count_stalled();
            self.abandon(conn, st, sid, H3_REQUEST_CANCELLED);
        }
        st.stall_check = st.responses.values().map(|r| r.next_check(&self.bounds)).min();
    }

    /// Ends stream `sid`'s response unsent (when one is under way: logged, counted, its file
    /// given back) and resets the stream with `code`, STOP_SENDING too while its request side
    /// is open; the stream stays on the connection's [`Resets`] until quiche forgot it.
    fn abandon(&mut self, conn: &mut udpx_quic::Connection, st: &mut ConnState, sid: u64, code: u64) {
        // No response under way: it was sent whole (its headers went).
        let headers_sent = match st.responses.remove(&sid) {
            Some(r) => {
                let sent = r.headers.is_none();
                self.finish(st.peer, r, false);
                sent
            }
            None => true,
        };
        if st.requests.contains(&sid) {
            let _ = conn.stream_shutdown(sid, quiche::Shutdown::Read, code);
            st.requests.retain(|&s| s != sid);
        }
        st.resets.reset(conn, &self.site, sid, code, headers_sent);
    }
}

/// The streams of one connection that the server reset and quiche's HTTP/3 layer still holds,
/// each with whether its response headers went (which call makes the layer drop it): see the
/// module docs. At most the streams the peer may have open; counted in the site's
/// `streams_resetting` gauge while listed.
#[derive(Debug, Default)]
struct Resets(Vec<(u64, bool)>);

impl Resets {
    /// Resets stream `sid`'s sending side with `code` and lists it; a stream the transport no
    /// longer has is not listed, one listed already not twice.
    fn reset(&mut self, conn: &mut udpx_quic::Connection, site: &Site, sid: u64, code: u64, headers_sent: bool) {
        let known =
            conn.stream_shutdown(sid, quiche::Shutdown::Write, code).is_ok() || conn.stream_capacity(sid).is_ok();
        if known && !self.0.iter().any(|&(s, _)| s == sid) {
            self.0.push((sid, headers_sent));
            site.stream_resetting(true);
        }
    }

    /// Whether stream `sid` is listed.
    fn has(&self, sid: u64) -> bool {
        self.0.iter().any(|&(s, _)| s == sid)
    }

    /// Drops from quiche's HTTP/3 layer the listed streams the transport has forgotten (the
    /// peer acknowledged the reset, and its side ended): one failing call each, which the layer
    /// answers by forgetting a stream the transport no longer has. The others stay listed.
    fn collect(&mut self, h3: &mut quiche::h3::Connection, conn: &mut udpx_quic::Connection, site: &Site) {
        self.0.retain(|&(sid, headers_sent)| {
            if !matches!(conn.stream_capacity(sid), Err(quiche::Error::InvalidStreamState(_))) {
                return true;
            }
            if headers_sent {
                let _ = h3.send_body(conn, sid, &[], true);
            } else {
                let _ = h3.send_response(conn, sid, &[] as &[quiche::h3::Header], true);
            }
            site.stream_resetting(false);
            false
        });
    }

    /// The connection ended: its streams with it.
    fn forget_all(&mut self, site: &Site) {
        for _ in self.0.drain(..) {
            site.stream_resetting(false);
        }
    }
}

/// A parked response whose client reads again takes a claim on the open-file bounds and its
/// file again (by the same rules, same ETag) and goes on from where it stopped; `Err` when it
/// cannot (counted): its stream is to be reset. A response that is not parked passes as is.
fn resume(
    budget: &Rc<Budget>,
    bounds: &Bounds,
    conn_open: &Rc<Cell<usize>>,
    addr: IpAddr,
    r: &mut Response,
    now: Instant,
) -> Result<(), ()> {
    if r.parked_since.is_none() {
        return Ok(());
    }
    if let Some(b) = r.body.as_mut().filter(|b| b.open.is_none()) {
        let Some(claim) = OpenFile::take(budget, conn_open, addr, bounds, false) else {
            budget.site.count_resumed(false);
            return Err(());
        };
        match budget.site.reopen(&b.target, &b.etag, b.end - b.left) {
            Ok(file) => {
                // Same ETag; its change time may differ (a chmod): the cache keys this version.
                if let Ok(meta) = file.metadata() {
                    b.id = FileId::of(&meta);
                }
                b.open = Some((file, claim));
            }
            Err(why) => {
                log::debug!("udpx-h3: a parked response cannot go on: {why:?}");
                budget.site.count_resumed(false);
                return Err(());
            }
        }
        budget.site.count_resumed(true);
    }
    (r.parked_since, r.progressed, r.unstamped) = (None, now, 0);
    Ok(())
}

/// The longest HTTP/3 DATA frame header: its type (one byte) and its length (a varint, at
/// most 8 bytes).
const DATA_HEADER_MAX: usize = 9;

/// Body chunk vectors a shard keeps for reuse (each [`CHUNK`] bytes: 16 MiB); past them a
/// chunk is a vector of its own, freed once acknowledged.
const BODY_BUFFERS_KEPT: usize = 256;

/// [`BLOCK`] vectors a shard keeps for reuse (16 MiB).
const BLOCKS_KEPT: usize = 64;

/// The [`BLOCK`]s a shard's responses may hold at once, in bytes (each response reading them
/// counts two: the one it sends from and the last one's unacknowledged tail); past it a
/// response reads a [`CHUNK`] at a time.
pub(crate) const READ_AHEAD: usize = 64 << 20;

/// The DATA frame header of a `len`-byte body chunk, as quiche writes it (type 0x00, then the
/// length as a QUIC varint): its bytes and how many.
fn data_header(len: u64) -> ([u8; DATA_HEADER_MAX], usize) {
    let mut h = [0u8; DATA_HEADER_MAX];
    let n = if len < 1 << 6 {
        h[1] = len as u8;
        1
    } else if len < 1 << 14 {
        h[1..3].copy_from_slice(&((len as u16) | 0x4000).to_be_bytes());
        2
    } else if len < 1 << 30 {
        h[1..5].copy_from_slice(&((len as u32) | 0x8000_0000).to_be_bytes());
        4
    } else {
        h[1..9].copy_from_slice(&(len | 0xc000_0000_0000_0000).to_be_bytes());
        8
    };
    (h, 1 + n)
}

/// How long a response waits for the disk thread before it tries the page cache again, after
/// `tries` refusals: 1 ms, doubling to 32 ms (a disk read takes from a tenth of a millisecond
/// to tens; the tries are a few a response, not a spin).
fn disk_wait(tries: u32) -> Duration {
    Duration::from_millis(1 << tries.saturating_sub(1).min(5))
}

/// Where a response stands after [`progress`] (or a refused resume).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Sent whole.
    Done,
    /// The stream takes no more for now; quiche reports it writable again.
    Waiting,
    /// The page cache lacks the next bytes: the disk thread reads them, and the response is
    /// tried again after `disk_wait` (quiche knows nothing of it).
    Disk,
    /// The stream is gone (reset, stopped), the file failed, or a parked response could not
    /// go on: it ends unsent and its stream is reset.
    Failed,
}

/// Moves a response on as far as the stream takes it, counting the body bytes taken in
/// `r.sent`. A response that is parked must be resumed first ([`resume`]). The body goes as
/// one DATA frame (see the module docs): its header, then slices of the blocks `reader`
/// reads, then an empty DATA frame with the FIN.
fn progress(
    h3: &mut quiche::h3::Connection,
    conn: &mut udpx_quic::Connection,
    sid: u64,
    r: &mut Response,
    reader: &mut Reader,
    now: Instant,
) -> Progress {
    if let Some(h) = r.headers.take() {
        match h3.send_response(conn, sid, &h, r.fin_with_headers) {
            Ok(()) => r.progressed = now,
            Err(quiche::h3::Error::StreamBlocked | quiche::h3::Error::Done) => {
                r.headers = Some(h);
                return Progress::Waiting;
            }
            Err(_) => return Progress::Failed,
        }
    }
    let Some(b) = r.body.as_mut() else { return Progress::Done };
    if !b.framed && b.total > 0 {
        let (header, hlen) = data_header(b.total);
        match conn.stream_capacity(sid) {
            Ok(cap) if cap > hlen => {}
            Ok(_) => {
                // quiche reports the stream writable again once it can take the header whole.
                let _ = conn.stream_writable(sid, hlen + 1);
                return Progress::Waiting;
            }
            Err(_) => return Progress::Failed,
        }
        match conn.stream_send(sid, &header[..hlen], false) {
            Ok(n) if n == hlen => b.framed = true,
            _ => return Progress::Failed,
        }
    }
    loop {
        let buf = match b.pending.take() {
            Some(buf) => buf,
            None if b.left == 0 => {
                // The end: an empty DATA frame carries the FIN through quiche's HTTP/3 layer,
                // which then knows the stream is finished (its bookkeeping, as for any body).
                return match h3.send_body(conn, sid, &[], true) {
                    Ok(_) => Progress::Done,
                    Err(quiche::h3::Error::Done | quiche::h3::Error::StreamBlocked) => Progress::Waiting,
                    Err(_) => Progress::Failed,
                };
            }
            None => match reader.read(b) {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Progress::Disk,
                // The file shrank or failed under us: the stream cannot be completed honestly.
                Err(_) => return Progress::Failed,
            },
        };
        let len = buf.len();
        // A clone shares the vector (a count, not a copy): kept if quiche takes nothing.
        match conn.stream_send_zc(sid, buf.clone(), false) {
            Ok((w, rest)) => {
                r.sent += w as u64;
                r.unstamped += w as u64;
                if r.unstamped >= MIN_PROGRESS {
                    (r.progressed, r.unstamped) = (now, 0);
                }
                if w < len {
                    // What it did not take comes back split off (all of it when `w` is 0).
                    let Some(rest) = rest.filter(|rest| rest.len() == len - w) else { return Progress::Failed };
                    b.pending = Some(rest);
                    // quiche reports the stream writable again once it takes a byte more.
                    let _ = conn.stream_writable(sid, 1);
                    return Progress::Waiting;
                }
            }
            Err(quiche::Error::Done) => {
                b.pending = Some(buf);
                let _ = conn.stream_writable(sid, 1);
                return Progress::Waiting;
            }
            Err(_) => return Progress::Failed,
        }
    }
}

#[cfg(test)]
mod body_tests {
    use super::data_header;

    #[test]
    fn data_headers_are_quiches_varints() {
        let h = |n| {
            let (b, len) = data_header(n);
            b[..len].to_vec()
        };
        assert_eq!(h(0u64), [0x00, 0x00]);
        assert_eq!(h(63), [0x00, 0x3f]);
        assert_eq!(h(64), [0x00, 0x40, 0x40]);
        assert_eq!(h(16_383), [0x00, 0x7f, 0xff]);
        assert_eq!(h(16_384), [0x00, 0x80, 0x00, 0x40, 0x00]);
        assert_eq!(h(65_536), [0x00, 0x80, 0x01, 0x00, 0x00]);
    }
}
