//! `udpx echo serve`: an echo server in the modes of the NTT talk (seed 001) and the step after.
//!
//! | mode | sockets | threads | who picks the socket |
//! | --- | --- | --- | --- |
//! | `naive` | 1 | N, sharing it | — (all threads contend for one socket lock) |
//! | `reuseport` | N | 1 per socket | the kernel's flow hash |
//! | `reuseport-cpu` | 1 per CPU | 1 per socket, pinned to its CPU | a cBPF program: the receiving CPU |
//! | `reuseport-cid` | N | 1 per socket | a cBPF program: a QUIC DCID byte |
//!
//! Each with or without batching (recvmmsg/sendmmsg). Replies leave from the local address the
//! request arrived at (pktinfo), so a multi-homed server answers correctly; a reply is the
//! request itself with sockperf's client flag cleared, never larger. Malformed requests are counted and dropped.
//!
//! ## The per-source rate limit
//!
//! A fixed table of 65,536 GCRA cells (a token bucket
//! each, one 8-byte theoretical arrival time, updated lock-free), a source's cell chosen by a
//! keyed hash (SipHash with a random per-process key) of its address.
//!
//! A request costs one token per started `RateLimit::UNIT_BYTES` (256) bytes of its payload:
//! a request of up to 256 bytes (a transaction as [`default_recv_buffer`] sizes them; sockperf's
//! are 14 to 64) costs one, a 60 KiB request 240. The bucket holds `limit` tokens and refills
//! at `limit` a second, so one cell bounds requests and bytes at once, with one cost per
//! request decided by one function for the system-call and the io_uring shard alike.
//!
//! What it guarantees, whatever a flood does:
//! - **Bounded**: 512 KiB, allocated once; no entry per source, so a flood from any number of
//!   forged sources cannot fill it, grow it or evict anyone.
//! - **Reflection**: replies are the size of the request, and the requests of one source
//!   address (a victim whose address is forged) are answered at most `limit` a second and at
//!   most `limit` x 256 bytes of payload a second, with a burst of one second's worth of
//!   either: over `t` seconds at most `limit` x (1 + `t`) requests and `limit` x 256 x (1 +
//!   `t`) bytes (with the defaults, 1,000 requests and 256,000 bytes a second; UDP and IP
//!   headers, 28 to 48 bytes a reply, come on top). The bytes reflected toward any address are
//!   also at most what was forged. A request of more than `limit` x 256 bytes costs more than
//!   a full bucket and is never answered (none exists at the default limit: UDP carries at
//!   most 65,507 bytes).
//! - **Legitimate sources**: sources that share a cell share its budget. The key is secret,
//!   so a flood cannot aim at a chosen client's cell; spread over forged sources, a flood of
//!   `F` tokens a second (a request of up to 256 bytes is one) adds about `F / CELLS` a second
//!   to every cell. A client spending `r` tokens a second keeps every request while
//!   `r + F / CELLS <= limit`: with the defaults (65,536 cells, 1,000/s), a client at 100
//!   small requests a second is untouched until the flood passes about 59 million tokens a
//!   second, more than one server receives. Past that, clients lose requests in proportion,
//!   as every cell is over its budget.

use std::hash::BuildHasher;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use udpx::uring::{QueueError, UringShardConfig};
use udpx::{
    RecvBuffers, RecvMode, SendError, SendErrorKind, SendMode, ShardGroup, SocketConfig, Steering, Transmit, UdpSocket,
    Want,
};
use udpx_lab::cpu::{online_cpus, pin_current_thread, ProcessCpu};

use crate::proto;

/// How the server spreads work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// One socket, N threads.
    Naive,
    /// N sockets in a reuseport group, kernel hash.
    Reuseport,
    /// One socket per CPU, threads pinned, cBPF steering by receiving CPU.
    ReuseportCpu,
    /// N sockets, cBPF steering by byte `cid_byte` of the QUIC destination connection ID.
    ReuseportCid {
        /// Which byte of the DCID (0-19).
        cid_byte: u8,
    },
}

impl Mode {
    /// Stable name.
    pub fn name(&self) -> String {
        match self {
            Mode::Naive => "naive".into(),
            Mode::Reuseport => "reuseport".into(),
            Mode::ReuseportCpu => "reuseport-cpu".into(),
            Mode::ReuseportCid { cid_byte } => format!("reuseport-cid@{cid_byte}"),
        }
    }
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to serve on.
    pub bind: SocketAddr,
    /// Mode.
    pub mode: Mode,
    /// Threads (and sockets, for the reuseport modes); `reuseport-cpu` uses one per online CPU.
    pub threads: usize,
    /// recvmmsg/sendmmsg.
    pub batch: bool,
    /// With `batch`: receive with a multishot io_uring receive over provided buffers and send
    /// the replies through io_uring (one `io_uring_enter` per batch of replies; none to
    /// receive while requests keep arriving). Falls back to system calls where io_uring is
    /// unavailable (the shard counts `io_uring` 0 then).
    pub io_uring: bool,
    /// Requests per second per source address at most, over all shards together, a request
    /// counting once per started 256 bytes (so also at most this x 256 bytes a second; excess
    /// dropped and counted; a burst of up to one second's worth is admitted at once; the
    /// module docs say what it guarantees under a flood). `None`: no limit, an equal-size
    /// reflector for anyone who forges a victim's address: for benches with one source.
    pub rate_limit: Option<u32>,
    /// CPUs the shard threads are pinned to, round robin (`reuseport-cpu` pins each socket's
    /// thread to its own CPU regardless). `None`: not pinned.
    pub cpus: Option<Vec<usize>>,
    /// Receive buffer per shard socket (`SO_RCVBUF`, doubled by the kernel); `None`: sized by
    /// [`default_recv_buffer`].
    pub recv_buffer: Option<usize>,
}

/// The receive buffer a shard asks for by default: room for a burst of 4 requests from each
/// of 1,024 clients at once, of 256 bytes each (sockperf's are 14 to 64), in the kernel's
/// terms ([`udpx::rcvbuf`]); a server that expects more says so with `--rcvbuf`.
pub fn default_recv_buffer() -> usize {
    udpx::rcvbuf::plan(udpx::rcvbuf::RecvRole::Server { clients: 1024, burst: 4, datagram: 256 }).set
}

/// The per-source rate limit `udpx echo serve` applies unless told otherwise, requests/s (of
/// up to `RateLimit::UNIT_BYTES` each: 256,000 bytes/s).
pub const DEFAULT_RATE_LIMIT: u32 = 1_000;

/// Most threads (and sockets) a server may have, oversubscribed or not: far past the CPU count
/// more threads only add contention, and each holds up to 2 MiB of receive buffers.
pub const MAX_THREADS: usize = 1024;

/// Why a configuration is refused (usage errors: the message says what to change).
pub fn check(cfg: &ServeConfig, allow_oversubscribe: bool) -> Result<(), String> {
    let cpus = online_cpus().len();
    if cfg.threads == 0 || cfg.threads > MAX_THREADS {
        return Err(format!("--threads {}: give 1 to {MAX_THREADS} threads", cfg.threads));
    }
    if cfg.threads > cpus && !allow_oversubscribe {
        return Err(format!(
            "--threads {}: more threads than the {cpus} online CPUs; lower it or add --allow-oversubscribe",
            cfg.threads
        ));
    }
    if let Mode::ReuseportCid { cid_byte } = cfg.mode {
        if u32::from(cid_byte) >= udpx::shard::MAX_CID_LEN {
            return Err(format!(
                "--cid-byte {cid_byte}: connection IDs are at most {} bytes; give 0 to {}",
                udpx::shard::MAX_CID_LEN,
                udpx::shard::MAX_CID_LEN - 1
            ));
        }
    }
    Ok(())
}

/// Per-shard counters (one per thread).
#[derive(Debug, Default)]
pub struct ShardCounters {
    /// Well-formed requests.
    pub requests: AtomicU64,
    /// Replies sent.
    pub replies: AtomicU64,
    /// Replies sent a second time after a hard send error: usually a pending ICMP error for
    /// an earlier reply to someone else, reported on whichever send comes next.
    pub send_retries: AtomicU64,
    /// Replies dropped because udpx refused them as invalid.
    pub dropped_invalid: AtomicU64,
    /// Replies dropped because the kernel said they were too large (EMSGSIZE), twice.
    pub dropped_too_large: AtomicU64,
    /// Replies dropped because their send failed twice with another error.
    pub dropped_send_error: AtomicU64,
    /// Malformed or truncated requests dropped.
    pub malformed: AtomicU64,
    /// Requests over the per-source rate limit (in requests or in bytes: one budget), dropped.
    pub rate_limited: AtomicU64,
    /// Receive calls that returned data (with io_uring: reaps that found requests).
    pub recv_calls: AtomicU64,
    /// Receive calls (io_uring: turns) that failed with an error the network or the kernel's
    /// load can cause: counted, serving on. A broken socket (`udpx::recv::is_unusable`) ends
    /// the shard instead, logged.
    pub recv_errors: AtomicU64,
    /// The shard served through io_uring (1) or system calls (0).
    pub io_uring: AtomicU64,
    /// The kernel's drop counter of the shard's socket (SO_MEMINFO, at exit).
    pub kernel_drops: AtomicU64,
    /// Thread CPU seconds (user + system), at exit.
    pub cpu_micros: AtomicU64,
}

/// A snapshot of one shard.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ShardStats {
    /// Well-formed requests.
    pub requests: u64,
    /// Replies.
    pub replies: u64,
    /// Replies sent again after a hard send error.
    pub send_retries: u64,
    /// Replies dropped: invalid.
    pub dropped_invalid: u64,
    /// Replies dropped: too large.
    pub dropped_too_large: u64,
    /// Replies dropped: another send error.
    pub dropped_send_error: u64,
    /// Malformed requests dropped.
    pub malformed: u64,
    /// Rate-limited requests dropped.
    pub rate_limited: u64,
    /// Receive calls.
    pub recv_calls: u64,
    /// Receive calls that failed, counted (the shard served on).
    pub recv_errors: u64,
    /// Requests per receive call.
    pub batch: f64,
    /// Kernel drops.
    pub kernel_drops: u64,
    /// Thread CPU seconds.
    pub cpu_secs: f64,
    /// The shard served through io_uring.
    pub io_uring: bool,
}

impl ShardCounters {
    fn snapshot(&self) -> ShardStats {
        let req = self.requests.load(Relaxed);
        let calls = self.recv_calls.load(Relaxed);
        ShardStats {
            requests: req,
            replies: self.replies.load(Relaxed),
            send_retries: self.send_retries.load(Relaxed),
            dropped_invalid: self.dropped_invalid.load(Relaxed),
            dropped_too_large: self.dropped_too_large.load(Relaxed),
            dropped_send_error: self.dropped_send_error.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            rate_limited: self.rate_limited.load(Relaxed),
            recv_calls: calls,
            recv_errors: self.recv_errors.load(Relaxed),
            batch: if calls > 0 { (req + self.malformed.load(Relaxed)) as f64 / calls as f64 } else { 0.0 },
            kernel_drops: self.kernel_drops.load(Relaxed),
            cpu_secs: self.cpu_micros.load(Relaxed) as f64 / 1e6,
            io_uring: self.io_uring.load(Relaxed) == 1,
        }
    }
}

/// The socket one server thread reads: its own, or its slot of a reuseport group (which keeps
/// the whole group open, so the steering program's socket count stays true).
#[derive(Debug)]
enum ServerSocket {
    Own(Box<UdpSocket>),
    Shard(udpx::Shard),
}

impl std::ops::Deref for ServerSocket {
    type Target = UdpSocket;
    fn deref(&self) -> &UdpSocket {
        match self {
            ServerSocket::Own(s) => s,
            ServerSocket::Shard(s) => s,
        }
    }
}

/// Sockets bound, threads not yet started (so sockets can be made inside a namespace).
#[derive(Debug)]
pub struct Bound {
    cfg: ServeConfig,
    /// One entry per thread: the socket it serves and the CPU to pin to.
    shards: Vec<(ServerSocket, Option<usize>)>,
    addr: SocketAddr,
}

impl Bound {
    /// The address clients send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Each shard's effective receive buffer (what the kernel reports: twice what was set).
    pub fn recv_buffer(&self) -> usize {
        self.shards.first().map_or(0, |(s, _)| s.capabilities().recv_buffer)
    }

    /// Queues a fault for the next send on shard `shard`'s socket (tests only).
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, shard: usize, fault: udpx::Fault) {
        self.shards[shard].0.inject_fault(fault);
    }
}

/// Binds the sockets of a server.
pub fn bind(cfg: &ServeConfig) -> Result<Bound, String> {
    let send_mode = if cfg.batch { SendMode::Sendmmsg } else { SendMode::Sendmsg };
    let recv_mode = if cfg.batch { RecvMode::Recvmmsg } else { RecvMode::Recvmsg };
    // Bound to a wildcard address, a reply must name the address the request reached (pktinfo),
    // or a multi-homed host answers from the wrong one; bound to one address, that address is
    // the source already, and the per-datagram control messages would be pure cost.
    let pktinfo = if cfg.bind.ip().is_unspecified() { Want::Required } else { Want::Off };
    let sock_cfg = SocketConfig::new(cfg.bind)
        .send_mode(send_mode)
        .recv_mode(recv_mode)
        .pktinfo(pktinfo)
        .ecn(Want::Off)
        // Drops are read once with SO_MEMINFO at exit, not as a cmsg on every datagram.
        .rxq_ovfl(Want::Off)
        .io_uring(if cfg.batch && cfg.io_uring { Want::IfAvailable } else { Want::Off })
        .buffers(4 << 20, cfg.recv_buffer.unwrap_or_else(default_recv_buffer));
    let group = |n: usize, steering: Steering| {
        ShardGroup::bind(sock_cfg.clone(), n, steering).map_err(|e| format!("bind {}: {e}", cfg.bind))
    };
    let shards: Vec<(ServerSocket, Option<usize>)> = match cfg.mode {
        Mode::Naive => {
            let one = sock_cfg.clone().bind().map_err(|e| format!("bind {}: {e}", cfg.bind))?;
            // Each thread gets its own handle (a dup of the same kernel socket), so the threads
            // contend in the kernel as a naive server's do, not on a lock of ours.
            let mut v = Vec::with_capacity(cfg.threads);
            for _ in 1..cfg.threads {
                let dup = UdpSocket::adopt(&one, sock_cfg.clone()).map_err(|e| e.to_string())?;
                v.push((ServerSocket::Own(Box::new(dup)), None));
            }
            v.insert(0, (ServerSocket::Own(Box::new(one)), None));
            v
        }
        Mode::Reuseport => {
            group(cfg.threads, Steering::Hash)?.shards().into_iter().map(|s| (ServerSocket::Shard(s), None)).collect()
        }
        Mode::ReuseportCid { cid_byte } => group(cfg.threads, Steering::QuicCid { cid_byte })?
            .shards()
            .into_iter()
            .map(|s| (ServerSocket::Shard(s), None))
            .collect(),
        Mode::ReuseportCpu => {
            // The program returns cpu % n: socket i must belong to CPU i, for every CPU.
            let cpus = online_cpus();
            let n = cpus.iter().max().map_or(1, |m| m + 1);
            group(n, Steering::Cpu)?
                .shards()
                .into_iter()
                .map(|s| (Some(s.index()), ServerSocket::Shard(s)))
                .map(|(c, s)| (s, c))
                .collect()
        }
    };
    let mut shards = shards;
    if let (Some(cpus), false) = (cfg.cpus.as_ref().filter(|c| !c.is_empty()), cfg.mode == Mode::ReuseportCpu) {
        for (i, s) in shards.iter_mut().enumerate() {
            s.1 = Some(cpus[i % cpus.len()]);
        }
    }
    let addr = shards[0].0.local_addr();
    Ok(Bound { cfg: cfg.clone(), shards, addr })
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counters: Vec<Arc<ShardCounters>>,
    sockets: Vec<Arc<ServerSocket>>,
    /// The address clients send to.
    pub addr: SocketAddr,
    /// The mode.
    pub mode: Mode,
}

/// Starts one thread per shard.
pub fn start(bound: Bound) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut counters = Vec::new();
    let (cfg, addr) = (bound.cfg.clone(), bound.addr);
    // One limiter for the whole server: per shard, a source that varies its port over N shards
    // would get N times the limit.
    let limit = cfg.rate_limit.map(|per_sec| Arc::new(RateLimit::new(per_sec, RateLimit::CELLS)));
    let mut sockets = Vec::new();
    for (sock, cpu) in bound.shards {
        let c = Arc::new(ShardCounters::default());
        counters.push(c.clone());
        let sock = Arc::new(sock);
        sockets.push(sock.clone());
        let (stop, cfg, limit) = (stop.clone(), cfg.clone(), limit.clone());
        threads.push(std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                let _ = pin_current_thread(cpu);
            }
            let t0 = ProcessCpu::thread().unwrap_or_default();
            if cfg.batch && cfg.io_uring && sock.capabilities().io_uring {
                serve_shard_uring(&sock, &cfg, limit.as_deref(), &stop, &c);
            } else {
                serve_shard(&sock, &cfg, limit.as_deref(), &stop, &c);
            }
            let t = ProcessCpu::thread().unwrap_or_default().diff(&t0);
            c.cpu_micros.store(t.total().as_micros() as u64, Relaxed);
            c.kernel_drops.store(sock.kernel_drops().unwrap_or(0) as u64, Relaxed);
        }));
    }
    Server { stop, threads, counters, sockets, addr, mode: cfg.mode }
}

/// The echo server's counters at scrape time (`--metrics`): each shard's socket counters and
/// its own.
struct MetricsSource {
    shards: Vec<(Arc<ServerSocket>, Arc<ShardCounters>)>,
}

impl udpx_metrics::Source for MetricsSource {
    fn sample(&self) -> Vec<udpx_metrics::ShardSample> {
        use udpx_metrics::Extra;
        let counter = |name, help, value| Extra { name, help, value, gauge: false };
        self.shards
            .iter()
            .map(|(sock, c)| {
                let s = c.snapshot();
                udpx_metrics::ShardSample {
                    socket: sock.counters(),
                    kernel_drops: sock.kernel_drops().map(u64::from).unwrap_or(0),
                    icmp_offenders: sock.icmp_offenders(),
                    extra: vec![
                        counter("echo_requests", "Well-formed requests", s.requests),
                        counter("echo_replies", "Replies sent", s.replies),
                        counter("echo_send_retries", "Replies sent again after a hard send error", s.send_retries),
                        counter("echo_dropped_invalid", "Replies dropped: refused as invalid", s.dropped_invalid),
                        counter("echo_dropped_too_large", "Replies dropped: EMSGSIZE twice", s.dropped_too_large),
                        counter(
                            "echo_dropped_send_error",
                            "Replies dropped: another error twice",
                            s.dropped_send_error,
                        ),
                        counter("echo_malformed", "Malformed or truncated requests dropped", s.malformed),
                        counter(
                            "echo_rate_limited",
                            "Requests over the per-source rate limit, dropped",
                            s.rate_limited,
                        ),
                        counter("echo_recv_calls", "Receive calls that returned data", s.recv_calls),
                        counter("echo_recv_errors", "Receive calls that failed, counted; serving on", s.recv_errors),
                    ],
                }
            })
            .collect()
    }
}

impl Server {
    /// Counters now (CPU seconds are filled in when the server stops).
    pub fn stats(&self) -> Vec<ShardStats> {
        self.counters.iter().map(|c| c.snapshot()).collect()
    }

    /// Serves this server's counters as Prometheus text on `addr` (`GET /metrics`) until the
    /// returned server is dropped.
    pub fn serve_metrics(&self, addr: SocketAddr) -> std::io::Result<udpx_metrics::MetricsServer> {
        let shards = self.sockets.iter().cloned().zip(self.counters.iter().cloned()).collect();
        udpx_metrics::MetricsServer::start(addr, Arc::new(MetricsSource { shards }))
    }

    /// Stops every thread and returns the final per-shard counters.
    pub fn stop(self) -> Vec<ShardStats> {
        self.stop.store(true, Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.counters.iter().map(|c| c.snapshot()).collect()
    }
}

/// Requests and bytes per second per source address, one limiter shared by every shard of a
/// server.
///
/// A fixed table of cells indexed by a keyed hash of the source address, each an `AtomicU64`
/// holding a GCRA "theoretical arrival time" (ns since the limiter started): a request of cost
/// `c` tokens ([`RateLimit::cost`]: one per started `RateLimit::UNIT_BYTES`) moves that time
/// `c` intervals on, and is admitted if that keeps it at most one second's worth of tokens
/// ahead of now, which is a token bucket of `per_sec` tokens refilled at `per_sec` a second,
/// without a lock. Memory is fixed when the server starts and nothing is ever cleared, so no number of
/// (spoofed) sources resets anyone's bucket. Sources whose hashes collide share a cell and so
/// a limit: a collision makes the limit stricter, never looser, and the random key (one per
/// server) keeps a sender from choosing whose cell it lands in.
/// The module docs say what it guarantees.
#[derive(Debug)]
pub(crate) struct RateLimit {
    interval_ns: u64,
    burst_ns: u64,
    cells: Box<[AtomicU64]>,
    key: std::collections::hash_map::RandomState,
    start: Instant,
}

impl RateLimit {
    /// Cells of a server's limiter: 512 KiB; about 65k sources before two share a limit.
    pub(crate) const CELLS: usize = 1 << 16;

    /// Payload bytes one token pays for: a typical transaction (the 256 bytes
    /// [`default_recv_buffer`] sizes a request at) costs one, as before bytes were counted.
    pub const UNIT_BYTES: usize = 256;

    fn new(per_sec: u32, cells: usize) -> RateLimit {
        let interval_ns = (1_000_000_000 / u64::from(per_sec.max(1))).max(1);
        RateLimit {
            interval_ns,
            burst_ns: interval_ns * u64::from(per_sec.max(1)),
            cells: (0..cells.max(1)).map(|_| AtomicU64::new(0)).collect(),
            key: Default::default(),
            start: Instant::now(),
        }
    }

    /// Tokens a request of `len` payload bytes costs: one per started [`Self::UNIT_BYTES`],
    /// one at least.
    fn cost(len: usize) -> u64 {
        len.div_ceil(Self::UNIT_BYTES).max(1) as u64
    }

    fn allow(&self, src: IpAddr, len: usize) -> bool {
        self.allow_at(src, len, self.start.elapsed().as_nanos() as u64)
    }

    /// The cell of `src`.
    fn cell(&self, src: IpAddr) -> usize {
        // An IPv4 client of a dual-stack socket is the same source as over a v4 socket.
        (self.key.hash_one(src.to_canonical()) % self.cells.len() as u64) as usize
    }

    /// Whether a request of `len` payload bytes from `src` at `now` (ns since start) is
    /// admitted; admitting it takes its cost from the cell.
    fn allow_at(&self, src: IpAddr, len: usize, now: u64) -> bool {
        // At most 256 tokens (a 64 KiB datagram) of at most 1 s each: no overflow.
        let step = Self::cost(len).saturating_mul(self.interval_ns);
        let cell = &self.cells[self.cell(src)];
        let mut tat = cell.load(Relaxed);
        loop {
            let next = tat.max(now).saturating_add(step);
            if next - now > self.burst_ns {
                return false;
            }
            match cell.compare_exchange_weak(tat, next, Relaxed, Relaxed) {
                Ok(_) => return true,
                Err(t) => tat = t,
            }
        }
    }
}

/// What became of one batch of replies.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sent {
    ok: usize,
    retries: usize,
    dropped_invalid: usize,
    dropped_too_large: usize,
    dropped_send_error: usize,
}

/// Sends every reply of a batch with `send`, dropping only a reply that is itself at fault.
///
/// A hard error on the first message of a send call is usually not about that message: the
/// kernel reports a pending socket error (`sk_err`, set by an ICMP error for an earlier reply
/// to someone else) on the next send call, whoever it is for, and clears it. So the message
/// is sent once more, and dropped only if that fails too. An invalid transmit makes udpx
/// refuse the whole call with nothing sent: that one is dropped and the rest, before and after
/// it, sent. `wait` is called when the socket's buffer is full.
fn send_replies<T>(
    replies: &mut Vec<T>,
    mut send: impl FnMut(&[T]) -> Result<usize, SendError>,
    mut wait: impl FnMut(),
) -> Sent {
    let mut out = Sent::default();
    let (mut from, mut retried) = (0, None);
    while from < replies.len() {
        let e = match send(&replies[from..]) {
            Ok(k) => {
                (from, out.ok) = (from + k, out.ok + k);
                continue;
            }
            Err(e) => e,
        };
        (from, out.ok) = (from + e.sent, out.ok + e.sent);
        match e.kind {
            SendErrorKind::WouldBlock => wait(),
            SendErrorKind::Invalid { index, .. } => {
                // Nothing of the call went out; only the transmit at `index` is wrong.
                replies.remove(from + index);
                (out.dropped_invalid, retried) = (out.dropped_invalid + 1, None);
            }
            _ if retried != Some(from) => {
                retried = Some(from);
                out.retries += 1;
            }
            kind => {
                match kind {
                    SendErrorKind::MessageTooLarge { .. } => out.dropped_too_large += 1,
                    _ => out.dropped_send_error += 1,
                }
                from += 1;
            }
        }
    }
    out
}

/// Whether a received datagram is answered, the one rule of both shards (system calls and
/// io_uring): a whole, well-formed request (else counted malformed) within its source's
/// budget, which it then pays for by its size (else counted rate-limited).
fn admit(data: &[u8], truncated: bool, src: IpAddr, limit: Option<&RateLimit>, c: &ShardCounters) -> bool {
    if truncated || !proto::is_request(data) {
        c.malformed.fetch_add(1, Relaxed);
        return false;
    }
    if limit.is_some_and(|l| !l.allow(src, data.len())) {
        c.rate_limited.fetch_add(1, Relaxed);
        return false;
    }
    true
}

fn serve_shard(sock: &UdpSocket, cfg: &ServeConfig, limit: Option<&RateLimit>, stop: &AtomicBool, c: &ShardCounters) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    let n = if cfg.batch { 32 } else { 1 };
    // Buffers, metadata and message vectors set up once: a receive allocates nothing.
    let mut bufs = RecvBuffers::new(n, 1 << 16);
    let mut keep = Vec::with_capacity(n);
    while !stop.load(Relaxed) {
        let got = match sock.recv_into(&mut bufs) {
            Ok(k) => k,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(e) if serves_on(&e, c) => continue,
            Err(_) => return,
        };
        c.recv_calls.fetch_add(1, Relaxed);
        keep.clear();
        for i in 0..got {
            let (m, data) = bufs.message_mut(i);
            if !admit(data, m.truncated, m.addr.ip(), limit, c) {
                continue;
            }
            proto::make_reply(data);
            keep.push(i);
        }
        c.requests.fetch_add(keep.len() as u64, Relaxed);
        let mut replies: Vec<Transmit<'_>> = keep
            .iter()
            .map(|&i| {
                let (m, data) = bufs.message(i);
                // The request itself goes back: a reply is never larger than its request.
                Transmit { src_ip: m.dst_ip, ..Transmit::new(m.addr, data) }
            })
            .collect();
        send_and_count(sock, &mut replies, c);
    }
}

/// A shard through io_uring ([`udpx::uring::UringShard`]): requests from a multishot receive,
/// replies copied into the ring's send slots and submitted by the same `io_uring_enter` that
/// waits for the next requests; the shard's retry and drop rules are the library's (counted
/// here as the system-call shard counts its own).
fn serve_shard_uring(
    sock: &UdpSocket,
    cfg: &ServeConfig,
    limit: Option<&RateLimit>,
    stop: &AtomicBool,
    c: &ShardCounters,
) {
    let shard_cfg = UringShardConfig { recv_buffers: 64, recv_size: 2048, send_slots: 256, send_size: 2048 };
    let mut shard = match sock.uring_shard(shard_cfg) {
        Ok(s) => {
            c.io_uring.store(1, Relaxed);
            s
        }
        Err(e) => {
            log::warn!("udpx echo: io_uring unavailable ({e}); serving with system calls");
            return serve_shard(sock, cfg, limit, stop, c);
        }
    };
    // Replies that found no slot: one reply per request and one request per free slot are
    // delivered, so none should.
    let mut unqueued = 0u64;
    let publish = |st: &udpx::uring::UringShardStats, unqueued: u64| {
        c.replies.store(st.sent, Relaxed);
        c.send_retries.store(st.would_block + st.enobufs_retries + st.icmp_retries, Relaxed);
        c.dropped_too_large.store(st.dropped_too_large, Relaxed);
        c.dropped_send_error.store(st.dropped_no_buffers + st.dropped_error + unqueued, Relaxed);
    };
    while !stop.load(Relaxed) {
        let mut requests = 0u64;
        let res = shard.turn(Some(Duration::from_millis(100)), |m, data, replies| {
            if !admit(data, m.truncated, m.addr.ip(), limit, c) {
                return;
            }
            requests += 1;
            let mut reply = [0u8; 2048];
            let reply = &mut reply[..data.len()];
            reply.copy_from_slice(data);
            proto::make_reply(reply);
            let t = Transmit { src_ip: m.dst_ip, ..Transmit::new(m.addr, reply) };
            match replies.queue(&t) {
                Ok(()) => {}
                Err(QueueError::Invalid(_)) => {
                    c.dropped_invalid.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    log::warn!("udpx echo: reply not queued: {e}");
                    unqueued += 1;
                }
            }
        });
        match res {
            Err(e) if serves_on(&e, c) => continue,
            Err(_) => break,
            Ok(_) => {}
        }
        if requests > 0 {
            c.recv_calls.fetch_add(1, Relaxed);
            c.requests.fetch_add(requests, Relaxed);
        }
        publish(&shard.stats(), unqueued);
    }
    // Replies already accepted go out before the shard ends.
    let _ = shard.flush(Duration::from_secs(1));
    publish(&shard.stats(), unqueued);
}

/// Whether a shard serves on after receive error `e` (counted): not when its socket is broken
/// (its loop would spin on it; logged).
fn serves_on(e: &std::io::Error, c: &ShardCounters) -> bool {
    if udpx::recv::is_unusable(e) {
        log::error!("udpx echo: a shard's socket cannot be read ({e}); that shard stops");
        return false;
    }
    c.recv_errors.fetch_add(1, Relaxed);
    log::debug!("udpx echo: receive failed (counted, serving on): {e}");
    true
}

/// Sends a shard's replies (waiting for writability where the socket is full) and counts
/// what went, what was retried and what was dropped, by why.
fn send_and_count(sock: &UdpSocket, replies: &mut Vec<Transmit<'_>>, c: &ShardCounters) {
    let s = send_replies(
        replies,
        |r| sock.send(r),
        || {
            let _ = sock.wait_writable(Duration::from_millis(10));
        },
    );
    c.replies.fetch_add(s.ok as u64, Relaxed);
    c.send_retries.fetch_add(s.retries as u64, Relaxed);
    c.dropped_invalid.fetch_add(s.dropped_invalid as u64, Relaxed);
    c.dropped_too_large.fetch_add(s.dropped_too_large as u64, Relaxed);
    c.dropped_send_error.fetch_add(s.dropped_send_error as u64, Relaxed);
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::Ipv4Addr;

    use udpx::InvalidTransmit;

    use super::*;

    fn err(sent: usize, kind: SendErrorKind) -> SendError {
        SendError { sent, partial_segments: 0, kind }
    }

    fn refused() -> SendErrorKind {
        SendErrorKind::Io(io::Error::from_raw_os_error(nix::errno::Errno::ECONNREFUSED as i32))
    }

    /// Runs `send_replies` over replies 0..n against a fake socket: `fail(i, attempt)` says
    /// how the send of reply `i` fails on its `attempt`-th try (a sendmmsg: the first failing
    /// message ends the call, a hard error on the first message fails the call).
    fn run(n: u32, fail: impl Fn(u32, usize) -> Option<SendErrorKind>) -> (Vec<u32>, Sent) {
        let mut replies: Vec<u32> = (0..n).collect();
        let mut wire = Vec::new();
        let mut tries = std::collections::HashMap::<u32, usize>::new();
        let s = send_replies(
            &mut replies,
            |batch: &[u32]| {
                // udpx checks every transmit before sending any.
                if let Some(i) = batch.iter().position(|&r| matches!(fail(r, 0), Some(SendErrorKind::Invalid { .. }))) {
                    let reason = InvalidTransmit::SegmentSizeZero;
                    return Err(err(0, SendErrorKind::Invalid { index: i, reason }));
                }
                for (k, &r) in batch.iter().enumerate() {
                    let t = tries.entry(r).or_default();
                    *t += 1;
                    if let Some(kind) = fail(r, *t) {
                        return Err(err(k, kind));
                    }
                    wire.push(r);
                }
                Ok(batch.len())
            },
            || {},
        );
        (wire, s)
    }

    #[test]
    fn a_pending_error_costs_a_retry_not_a_reply() {
        // Reply 0's first try meets someone else's ICMP error: sent on the second.
        let (wire, s) = run(3, |r, t| (r == 0 && t == 1).then(refused));
        assert_eq!(wire, [0, 1, 2]);
        assert_eq!(s, Sent { ok: 3, retries: 1, ..Sent::default() });
        // The same in the middle of a batch.
        let (wire, s) = run(4, |r, t| (r == 2 && t == 1).then(refused));
        assert_eq!(wire, [0, 1, 2, 3]);
        assert_eq!(s, Sent { ok: 4, retries: 1, ..Sent::default() });
    }

    #[test]
    fn only_the_reply_at_fault_is_dropped() {
        // Fails every time: retried once, then dropped alone.
        let (wire, s) = run(3, |r, _| (r == 1).then(refused));
        assert_eq!(wire, [0, 2]);
        assert_eq!(s, Sent { ok: 2, retries: 1, dropped_send_error: 1, ..Sent::default() });
        let too_large = || SendErrorKind::MessageTooLarge { len: 9000, segment_size: None, path_mtu: None };
        let (wire, s) = run(2, |r, _| (r == 0).then(too_large));
        assert_eq!(wire, [1]);
        assert_eq!(s, Sent { ok: 1, retries: 1, dropped_too_large: 1, ..Sent::default() });
        // Invalid: nothing of the call went out; the valid replies before and after it do.
        let invalid = || SendErrorKind::Invalid { index: 0, reason: InvalidTransmit::SegmentSizeZero };
        let (wire, s) = run(5, |r, _| (r == 2 || r == 4).then(invalid));
        assert_eq!(wire, [0, 1, 3]);
        assert_eq!(s, Sent { ok: 3, dropped_invalid: 2, ..Sent::default() });
    }

    #[test]
    fn would_block_waits_and_resends_the_rest() {
        let (wire, s) = run(3, |r, t| (r == 1 && t == 1).then_some(SendErrorKind::WouldBlock));
        assert_eq!(wire, [0, 1, 2]);
        assert_eq!(s, Sent { ok: 3, ..Sent::default() });
    }

    /// The guarantee under a flood of forged sources (see [`RateLimit`]), on a table small
    /// enough to flood in a test: 1,024 cells at 100/s. A client at 20/s keeps every request
    /// while a flood spread over random sources stays under (100 - 20) x 1,024 a second, and
    /// loses some once the flood is well past that bound.
    #[test]
    fn a_flood_of_forged_sources_leaves_a_modest_client_alone_within_the_bound() {
        let run = |flood_per_sec: u64| {
            let l = RateLimit::new(100, 1024);
            let client: IpAddr = "192.0.2.77".parse().unwrap();
            let mut rng = 0x1234_5678_9abc_def0u64;
            let (mut kept, mut asked) = (0, 0);

            let secs = 3u64;
            let flood_step = 1_000_000_000 / flood_per_sec;
            let mut next_client = 0u64;
            let mut t = 0u64;
            while t < secs * 1_000_000_000 {
                // xorshift: forged sources from all of 10/8.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let forged = IpAddr::from((0x0a00_0000u32 | (rng as u32 & 0x00ff_ffff)).to_be_bytes());
                let _ = l.allow_at(forged, 100, t);
                if t >= next_client {
                    asked += 1;
                    kept += l.allow_at(client, 100, t) as u32;
                    // 20 a second, give or take a few ms.
                    next_client += 45_000_000 + rng % 10_000_000;
                }
                // Arrivals at random gaps around the flood's mean.
                t += 1 + rng % (2 * flood_step);
            }

            (kept, asked)
        };
        let (kept, asked) = run(60_000); // 58.6/s per cell: inside the bound
        assert_eq!(kept, asked, "within the bound every request of the client is kept");
        let (kept, asked) = run(400_000); // 390/s per cell: far past it
        assert!(kept < asked / 2, "past the bound the client shares the loss: {kept} of {asked}");
    }

    #[test]
    fn rate_limit_is_a_bucket_per_source() {
        let l = RateLimit::new(10, 1024);
        let a = IpAddr::from(Ipv4Addr::new(10, 0, 0, 1));
        let t0 = 5_000_000_000;
        assert_eq!((0..100).filter(|_| l.allow_at(a, 100, t0)).count(), 10, "a full bucket: 10 at once");
        assert!(!l.allow_at(a, 100, t0 + 50_000_000), "half a token later");
        assert!(l.allow_at(a, 100, t0 + 100_000_000), "one token later");
        assert_eq!((0..100).filter(|_| l.allow_at(a, 100, t0 + 2_000_000_000)).count(), 10, "refilled, not beyond");
        // The same source seen through a dual-stack socket shares the bucket.
        let mapped = IpAddr::from(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        assert!(!l.allow_at(mapped, 100, t0 + 2_000_000_000));
    }

    /// A request costs a token per started 256 bytes: a source of large requests empties its
    /// bucket (and waits for the refill) in proportion to their size, within the same bytes a
    /// second; a source of small requests keeps its requests a second, whatever the large one
    /// does.
    #[test]
    fn large_requests_spend_the_budget_by_their_size() {
        assert_eq!(
            [1, 256, 257, 512, 1500, 61_440, 65_507].map(RateLimit::cost),
            [1, 1, 2, 2, 6, 240, 256],
            "one token per started 256 bytes"
        );
        let l = RateLimit::new(100, 1024);
        let big = IpAddr::from(Ipv4Addr::new(10, 0, 0, 1));
        // Another cell (the key is random: pick an address that does not share it).
        let small = (2..=255u8)
            .map(|b| IpAddr::from(Ipv4Addr::new(10, 0, 0, b)))
            .find(|&a| l.cell(a) != l.cell(big))
            .expect("1,024 cells");
        let t0 = 5_000_000_000;
        // A full bucket: 100 tokens, 25,600 bytes.
        let admitted = |src, len, now| (0..1000).filter(|_| l.allow_at(src, len, now)).count();
        assert_eq!(admitted(big, 2_560, t0), 10, "10 tokens each: a tenth as many as small ones");
        assert_eq!(admitted(small, 100, t0), 100, "the small source keeps its 100 at once");
        // 100 ms refill 10 tokens: one more large request, ten more small ones.
        assert_eq!(admitted(big, 2_560, t0 + 100_000_000), 1);
        assert_eq!(admitted(small, 100, t0 + 100_000_000), 10);
        // A second later: a whole bucket again, of any size mix, never more bytes than 25,600.
        assert_eq!(admitted(big, 25_600, t0 + 1_100_000_000), 1, "100 tokens: the whole bucket");
        assert_eq!(admitted(big, 100, t0 + 1_100_000_000), 0, "and nothing left");
        assert_eq!(admitted(big, 25_601, t0 + 9_000_000_000), 0, "more than a full bucket: never");

        // Over 10 s of a flood of large requests from one source (a new one every 100 us),
        // the bytes admitted stay within 100 x 256 a second and a second's burst; the small
        // source in another cell keeps every one of its 50 requests a second throughout.
        let l = RateLimit::new(100, 1024);
        // A new limiter, a new random key: pick the small source again for a cell of its own.
        let small =
            (2..=255u8).map(|a| IpAddr::from([192, 0, 2, a])).find(|&a| l.cell(a) != l.cell(big)).expect("1,024 cells");
        let (mut bytes, mut kept, mut asked) = (0usize, 0, 0);
        let sizes = [61_440, 1_500, 9_000, 300];
        for k in 0..100_000u64 {
            let t = t0 + k * 100_000;
            let len = sizes[k as usize % sizes.len()];
            if l.allow_at(big, len, t) {
                bytes += len;
            }
            if k % 200 == 0 {
                asked += 1;
                kept += l.allow_at(small, 100, t) as u32;
            }
        }
        assert!(bytes <= 100 * RateLimit::UNIT_BYTES * 11, "{bytes} B admitted in 10 s: more than 25,600 B/s");
        assert!(bytes >= 100 * RateLimit::UNIT_BYTES * 9 / 2, "{bytes} B: the large source still gets its share");
        assert_eq!((kept, asked), (500, 500), "the small source is unaffected");
    }

    #[test]
    fn a_flood_of_sources_neither_grows_the_table_nor_resets_it() {
        let l = RateLimit::new(1, 1024);
        let now = 3_000_000_000;
        let victim = IpAddr::from(Ipv4Addr::new(192, 0, 2, 1));
        assert!(l.allow_at(victim, 100, now));
        assert!(!l.allow_at(victim, 100, now));
        // 200k distinct sources at the same instant: each cell admits its one token at most.
        let admitted =
            (0u32..200_000).filter(|&i| l.allow_at(IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i)), 100, now)).count();
        assert!(admitted <= 1024, "{admitted} admitted past 1024 one-token cells");
        assert_eq!(l.cells.len(), 1024, "the table is fixed");
        // Nobody's bucket was refilled by the flood.
        assert!(!l.allow_at(victim, 100, now), "the flood reset the victim's bucket");
        assert!(l.allow_at(victim, 100, now + 1_000_000_000), "a second later it has a token again");
    }
}
