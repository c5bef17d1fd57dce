//! `udpx stream serve`: flows paced from unconnected sockets, one pacer per shard.
//!
//! ```text
//!   request (client's flow n, rate, size, interval)  ──►  shard k's socket (reuseport hash)
//!                                                           │ add_flow: pacer k, flow table k
//!   shard thread k:                                         ▼
//!     ppoll(socket, until the pacer's next busy slot)   one timed wait per busy slot
//!     read requests; now = CLOCK_MONOTONIC
//!     pacer.advance_to(now [+ look-ahead])  ──► releases: (flow, datagrams, due)
//!     headers stamped into a reused buffer  ──► one transmit per release (GSO when > 1)
//!     try_send: every flow due in the slot in one sendmmsg (of up to 64 messages)
//! ```
//!
//! Nothing is shared between shards: each has its socket, its pacer, its flows, its buffers.
//! In steady state (no flow added or removed) an iteration allocates nothing: the release list,
//! the payload buffer, the transmit list and the send scratch are sized up front and reused
//! (counted per iteration with a per-thread allocation counter where the binary installed one,
//! see [`crate::alloc`]).
//!
//! Pacing is decided per shard by where its first flow goes ([`crate::pacing`]): an fq egress
//! qdisc honours `SCM_TXTIME`, so the shard hands releases to the kernel up to a look-ahead
//! early, each with its departure time; any other qdisc ignores it, so the wheel holds them to
//! their time here.
//!
//! No datagram is dropped silently: EAGAIN waits for writability and resumes at the send
//! cursor; ENOBUFS backs off and resumes; a transmit the kernel refuses for good is counted
//! (`send_errors`, `unsent`) and the flow's End still tells its receiver how many were sent.
//!
//! The network is hostile ([`crate::admission`]): a flow starts only for a request that
//! carries a cookie proving its source address, goes on only while its client sends
//! keepalives with the flow's secret (none for [`CONSENT_TIMEOUT`] ends it), and counts
//! against caps per address and per prefix. Before an address is proven the server sends
//! nothing larger than the request, at a limited rate. An ICMP "port unreachable" ends a flow
//! only when its quote carries that flow's secret (a forged one names the address but cannot
//! know the secret). Every refusal is counted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;
use udpx::{
    RecvBuffers, SendBuffers, SendCursor, SendErrorKind, SendMode, ShardGroup, SocketConfig, Steering, Timestamp,
    Transmit, Want,
};
use udpx_pace::{FlowConfig, Granularity, Pacer, PacerConfig, Release};

use crate::admission::{self, Bucket, Caps, CookieJar, Limits};
use crate::pacing::{Pacing, PacingChoice};
use crate::wire::{self, Message, Request};
use crate::StreamError;

/// Transmits per send call chunk (the library sends up to 64 messages per `sendmmsg`).
const CHUNK_TRANSMITS: usize = 256;
/// Payload bytes per chunk.
const CHUNK_BYTES: usize = 1 << 20;
/// Longest wait when no flow is due (requests and stop are checked at least this often).
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// How long a send waits for the socket to become writable before counting the rest unsent.
const WRITABLE_WAIT: Duration = Duration::from_secs(2);
/// ENOBUFS back-offs in a row before the rest of a chunk is counted unsent.
const NOBUFS_TRIES: u32 = 12;
/// A flow whose client sent no keepalive for this long ends (the default of
/// [`ServeConfig::consent_timeout`]).
pub const CONSENT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a server allows and how it paces.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen.
    pub bind: SocketAddr,
    /// Shards: threads, each with a socket of one reuseport group and a pacer of its own.
    pub shards: usize,
    /// How to pace.
    pub pacing: PacingChoice,
    /// The wheel's slot.
    pub slot: Duration,
    /// Most flows at once, over all shards.
    pub max_flows: u32,
    /// Highest rate a client may ask for, bytes/s per flow.
    pub max_rate: u64,
    /// Longest flow a client may ask for.
    pub max_duration: Duration,
    /// Datagrams per release when a request leaves it to the server.
    pub default_segments: u32,
    /// How far ahead of their departure releases go to a qdisc that paces (kernel pacing).
    pub lookahead: Duration,
    /// Stop serving after this long (`None`: until [`Server::stop`]).
    pub run_for: Option<Duration>,
    /// Stall every shard once, for tests of catch-up behaviour: after `.0` for `.1`.
    pub stall: Option<(Duration, Duration)>,
    /// Send mode of the sockets.
    pub send_mode: SendMode,
    /// Socket send buffer, bytes.
    pub send_buffer: usize,
    /// CPUs to pin the shard threads to, shard `i` on `cpus[i % len]` (empty: not pinned).
    pub cpus: Vec<usize>,
    /// After a late wake, release the backlog at most this fast (percent of the flows' summed
    /// rate; 0: all at once). See [`udpx_pace::PacerConfig::smoothing_pct`].
    pub smoothing_pct: u32,
    /// Run the shard threads under SCHED_FIFO at this priority (1-99; needs CAP_SYS_NICE,
    /// else they stay normal and [`ShardStats::realtime`] says why). A pacer that shares its
    /// CPU with anything at normal priority wakes late whenever the scheduler lets the other
    /// run first: measured here, 5-13 ms late wakes a few times a second at normal priority,
    /// none above 3 ms under SCHED_FIFO. The thread sleeps between slots, so it takes no more
    /// CPU for it (and the kernel's RT throttling bounds a runaway one).
    pub realtime: Option<u8>,
    /// Caps per client address and prefix, and on answers to unproven addresses.
    pub limits: Limits,
    /// A flow whose client sent no keepalive for this long ends (default
    /// [`CONSENT_TIMEOUT`]; clients send one every [`crate::client::KEEPALIVE_INTERVAL`]).
    pub consent_timeout: Duration,
}

impl ServeConfig {
    /// Defaults for a server on `bind`: one shard, pacing chosen by the egress qdisc, 250 us
    /// slots, 16,384 flows, 1 GB/s per flow at most, flows of up to an hour, a backlog after a
    /// late wake released at 125 % of the flows' rate.
    pub fn new(bind: SocketAddr) -> ServeConfig {
        ServeConfig {
            bind,
            shards: 1,
            pacing: PacingChoice::Auto,
            slot: Duration::from_micros(250),
            max_flows: 16_384,
            max_rate: 1_000_000_000,
            max_duration: Duration::from_secs(3600),
            default_segments: 2,
            lookahead: Duration::from_millis(2),
            run_for: None,
            stall: None,
            send_mode: SendMode::GsoSendmmsg,
            send_buffer: 4 << 20,
            cpus: Vec::new(),
            smoothing_pct: 125,
            realtime: None,
            limits: Limits::default(),
            consent_timeout: CONSENT_TIMEOUT,
        }
    }

    fn validate(&self) -> Result<(), StreamError> {
        let usage = |m: String| Err(StreamError::Usage(m));
        if self.shards == 0 || self.shards > 256 {
            return usage(format!("--shards {}: give 1 to 256", self.shards));
        }
        if self.max_flows == 0 || self.max_flows > 1 << 24 {
            return usage(format!("--max-flows {}: give 1 to {}", self.max_flows, 1 << 24));
        }
        if self.max_rate == 0 || self.max_rate > udpx_pace::MAX_RATE {
            return usage(format!(
                "--max-rate {}: give a rate above 0 and at most {} bytes/s",
                self.max_rate,
                udpx_pace::MAX_RATE
            ));
        }
        if self.slot < Duration::from_micros(10) || self.slot > Duration::from_millis(100) {
            return usage(format!("--slot {:?}: give 10 us to 100 ms", self.slot));
        }
        if self.smoothing_pct != 0 && !(101..=1000).contains(&self.smoothing_pct) {
            return usage(format!(
                "--smoothing {}: give 0 (off) or 101 to 1000 percent of the flows' rate",
                self.smoothing_pct
            ));
        }
        if let Some(p) = self.realtime {
            if !(1..=99).contains(&p) {
                return usage(format!("--realtime {p}: give a SCHED_FIFO priority from 1 to 99"));
            }
        }
        let l = &self.limits;
        if l.flows_per_addr == 0 || l.flows_per_prefix == 0 || l.rate_per_addr == 0 || l.rate_per_prefix == 0 {
            return usage(format!("caps ({}): give every one above 0", l.describe()));
        }
        if l.unproven_per_sec == 0 {
            return usage("--unproven-rate 0 would answer no new client: give at least 1 per second".into());
        }
        if self.consent_timeout < Duration::from_millis(100) || self.consent_timeout > Duration::from_secs(3600) {
            return usage(format!(
                "consent timeout {:?}: give 100 ms to an hour (clients keep their flows alive every {:?})",
                self.consent_timeout,
                crate::client::KEEPALIVE_INTERVAL
            ));
        }
        if self.lookahead > Duration::from_secs(1) {
            return usage(format!(
                "look-ahead {:?}: keep it well inside fq's 10 s horizon (at most 1 s)",
                self.lookahead
            ));
        }
        Ok(())
    }
}

/// What one shard did. Times in ns, CPU in seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ShardStats {
    /// The shard's index.
    pub shard: usize,
    /// How it paced, and why.
    pub pacing: String,
    /// Flows accepted.
    pub flows: u64,
    /// Requests refused (limits, bad numbers).
    pub refused: u64,
    /// Datagrams that were not a well-formed request.
    pub malformed: u64,
    /// Flows ended early because their client went away (an ICMP port unreachable whose
    /// quote carried the flow's secret).
    pub clients_gone: u64,
    /// Cookies sent (the answer to a request without a valid one).
    pub cookies_sent: u64,
    /// Requests whose cookie was wrong or expired (answered with a fresh cookie).
    pub bad_cookies: u64,
    /// Answers to unproven addresses (cookies, refusals) not sent: over the rate limit.
    pub unproven_limited: u64,
    /// Requests refused by a cap per address or per prefix (also in `refused`).
    pub capped: u64,
    /// Keepalives that carried their flow's secret.
    pub keepalives: u64,
    /// Keepalives for no flow of that address, or with the wrong secret (dropped).
    pub bad_keepalives: u64,
    /// Flows ended because their client sent no keepalive for the consent timeout.
    pub consent_lapsed: u64,
    /// ICMP errors about a flow's address whose quote did not carry its secret (too short,
    /// or forged): counted, the flow goes on.
    pub icmp_unverified: u64,
    /// Receive errors counted and served on.
    pub recv_errors: u64,
    /// Consent sweeps (one pass over the shard's flow table each, at most once a second).
    pub sweeps: u64,
    /// Data datagrams sent.
    pub datagrams: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Releases (one per flow per departure; a GSO transmit when more than one datagram).
    pub releases: u64,
    /// Wake-ups that released something.
    pub busy_wakes: u64,
    /// Send system calls (from the socket's counters).
    pub send_calls: u64,
    /// Times the socket was full (EAGAIN) and the shard waited.
    pub would_block: u64,
    /// ENOBUFS back-offs.
    pub no_buffers: u64,
    /// Transmits the kernel refused for good (each counted, never silent).
    pub send_errors: u64,
    /// Datagrams not sent because of those errors or a wait that ran out.
    pub unsent: u64,
    /// Control datagrams (Accepted, Refused, End) the socket did not take (full): counted;
    /// a client repeats its request until it hears, and a receiver without an End counts
    /// loss up to the highest sequence number it saw.
    pub control_unsent: u64,
    /// The shard thread's CPU time, user + system, seconds.
    pub cpu_s: f64,
    /// The thread's scheduling: `normal`, `SCHED_FIFO N`, or why the asked-for real-time
    /// priority was not granted.
    pub realtime: String,
    /// Allocations in iterations that added or removed no flow (`None`: not counted, the
    /// binary has no counting allocator).
    pub steady_allocations: Option<u64>,
    /// Iterations counted in `steady_allocations`.
    pub steady_iterations: u64,
}

/// The whole server's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerReport {
    /// Address served.
    pub addr: String,
    /// Per shard.
    pub shards: Vec<ShardStats>,
    /// Sums over shards (the `shard` and `pacing` fields are those of shard 0).
    pub total: ShardStats,
    /// The caps the server ran with ([`Limits::describe`]).
    pub caps: String,
}

impl ServerReport {
    fn from_shards(addr: SocketAddr, shards: Vec<ShardStats>, limits: &Limits) -> ServerReport {
        let mut t = shards.first().cloned().unwrap_or_default();
        for s in shards.iter().skip(1) {
            t.flows += s.flows;
            t.refused += s.refused;
            t.malformed += s.malformed;
            t.clients_gone += s.clients_gone;
            t.cookies_sent += s.cookies_sent;
            t.bad_cookies += s.bad_cookies;
            t.unproven_limited += s.unproven_limited;
            t.capped += s.capped;
            t.keepalives += s.keepalives;
            t.bad_keepalives += s.bad_keepalives;
            t.consent_lapsed += s.consent_lapsed;
            t.icmp_unverified += s.icmp_unverified;
            t.recv_errors += s.recv_errors;
            t.sweeps += s.sweeps;
            t.datagrams += s.datagrams;
            t.bytes += s.bytes;
            t.releases += s.releases;
            t.busy_wakes += s.busy_wakes;
            t.send_calls += s.send_calls;
            t.would_block += s.would_block;
            t.no_buffers += s.no_buffers;
            t.send_errors += s.send_errors;
            t.unsent += s.unsent;
            t.control_unsent += s.control_unsent;
            t.cpu_s += s.cpu_s;
            t.steady_allocations = match (t.steady_allocations, s.steady_allocations) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
            t.steady_iterations += s.steady_iterations;
        }
        ServerReport { addr: addr.to_string(), shards, total: t, caps: limits.describe() }
    }

    /// CPU per datagram sent, ns.
    pub fn cpu_per_datagram_ns(&self) -> f64 {
        if self.total.datagrams == 0 {
            return 0.0;
        }
        self.total.cpu_s * 1e9 / self.total.datagrams as f64
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    limits: Limits,
    stop: Arc<AtomicBool>,
    live: Arc<AtomicU64>,
    threads: Vec<JoinHandle<Result<ShardStats, StreamError>>>,
}

impl Server {
    /// Binds the shard group and starts one thread per shard.
    pub fn start(cfg: ServeConfig) -> Result<Server, StreamError> {
        cfg.validate()?;
        let sock = SocketConfig::new(cfg.bind)
            .send_mode(cfg.send_mode)
            .txtime(Want::IfAvailable)
            .nonblocking(true)
            .send_buffer(cfg.send_buffer);
        let group = ShardGroup::bind(sock, cfg.shards, Steering::Hash)
            .map_err(|e| StreamError::Setup(format!("binding {}: {e}", cfg.bind)))?;
        let addr = group.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(AtomicU64::new(0));
        let per_shard = cfg.max_flows.div_ceil(cfg.shards as u32);
        let shared = Shared {
            live: live.clone(),
            cookies: Arc::new(CookieJar::new().map_err(StreamError::Setup)?),
            caps: Arc::new(Caps::new(cfg.limits)),
        };
        let mut threads = Vec::new();
        for shard in group.shards() {
            let (cfg, stop, shared) = (cfg.clone(), stop.clone(), shared.clone());
            let t = std::thread::Builder::new()
                .name(format!("stream-{}", shard.index()))
                .spawn(move || ShardLoop::new(shard, &cfg, per_shard, shared)?.run(&cfg, &stop))
                .map_err(|e| StreamError::Setup(format!("starting a shard thread: {e}")))?;
            threads.push(t);
        }
        Ok(Server { addr, limits: cfg.limits, stop, live, threads })
    }

    /// The address clients send requests to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Flows streaming now, over all shards.
    pub fn live_flows(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Whether every shard thread has ended (a `run_for` ran out, or an error).
    pub fn finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Ends every flow (each receiver gets its End) and returns the figures.
    pub fn stop(self) -> Result<ServerReport, StreamError> {
        self.stop.store(true, Ordering::Relaxed);
        let mut shards = Vec::new();
        for t in self.threads {
            shards.push(t.join().map_err(|_| StreamError::Setup("a shard thread panicked".into()))??);
        }
        Ok(ServerReport::from_shards(self.addr, shards, &self.limits))
    }
}

/// What the shards of one server share: the live count, the cookie key, the caps.
#[derive(Debug, Clone)]
struct Shared {
    live: Arc<AtomicU64>,
    cookies: Arc<CookieJar>,
    caps: Arc<Caps>,
}

/// One flow in a shard's table, indexed like the pacer's flows.
#[derive(Debug, Clone, Copy)]
struct Flow {
    addr: SocketAddr,
    client_flow: u32,
    secret: u64,
    size: u32,
    rate: u64,
    seq: u64,
    end_ns: u64,
    /// When its client was last heard from (request or keepalive), ns.
    heard_ns: u64,
}

/// Where one release's bytes are in the payload buffer.
#[derive(Debug, Clone, Copy)]
struct Planned {
    dst: SocketAddr,
    off: usize,
    len: usize,
    size: usize,
    due_ns: u64,
}

struct ShardLoop {
    shard: udpx::Shard,
    pacer: Pacer,
    flows: Vec<Option<Flow>>,
    by_addr: HashMap<SocketAddr, u32>,
    releases: Vec<Release>,
    planned: Vec<Planned>,
    payload: Vec<u8>,
    transmits: Vec<Transmit<'static>>,
    bufs: SendBuffers,
    rx: RecvBuffers,
    ctrl: Vec<u8>,
    pacing: Option<Pacing>,
    pacing_choice: PacingChoice,
    stats: ShardStats,
    gone: Vec<u32>,
    shared: Shared,
    /// Answers to addresses not yet proven.
    unproven: Bucket,
    next_sweep_ns: u64,
    /// Consent timeout and the sweep's period (a tenth of it, at most a second), ns.
    consent_ns: u64,
    sweep_ns: u64,
    changed: bool,
}

impl ShardLoop {
    fn new(shard: udpx::Shard, cfg: &ServeConfig, max_flows: u32, shared: Shared) -> Result<Self, StreamError> {
        let now = Timestamp::now().as_nanos();
        let pcfg = PacerConfig {
            slot_ns: cfg.slot.as_nanos() as u64,
            max_flows,
            seed: 0x5eed ^ shard.index() as u64,
            smoothing_pct: cfg.smoothing_pct,
            ..PacerConfig::default()
        };
        let pacer = Pacer::new(pcfg, now).map_err(|e| StreamError::Usage(e.to_string()))?;
        let index = shard.index();
        Ok(ShardLoop {
            releases: Vec::with_capacity(pacer.max_releases()),
            pacer,
            flows: vec![None; max_flows as usize],
            by_addr: HashMap::with_capacity(max_flows as usize),
            planned: Vec::with_capacity(CHUNK_TRANSMITS),
            payload: vec![0x5a; CHUNK_BYTES],
            transmits: Vec::with_capacity(CHUNK_TRANSMITS),
            bufs: SendBuffers::new(),
            rx: RecvBuffers::new(32, 2048),
            ctrl: vec![0; wire::REQUEST_LEN],
            pacing: None,
            pacing_choice: cfg.pacing,
            stats: ShardStats { shard: index, pacing: "no flow yet".into(), ..ShardStats::default() },
            gone: Vec::with_capacity(64),
            shared,
            unproven: Bucket::new(cfg.limits.unproven_per_sec),
            next_sweep_ns: now,
            consent_ns: cfg.consent_timeout.as_nanos() as u64,
            sweep_ns: (cfg.consent_timeout.as_nanos() as u64 / 10).min(1_000_000_000),
            changed: false,
            shard,
        })
    }

    fn run(mut self, cfg: &ServeConfig, stop: &AtomicBool) -> Result<ShardStats, StreamError> {
        self.stats.realtime = match cfg.realtime {
            None => "normal".into(),
            Some(prio) => set_realtime(prio),
        };
        if !cfg.cpus.is_empty() {
            let cpu = cfg.cpus[self.stats.shard % cfg.cpus.len()];
            udpx_lab::cpu::pin_current_thread(cpu)
                .map_err(|e| StreamError::Setup(format!("pinning shard {} to CPU {cpu}: {e}", self.stats.shard)))?;
        }
        // 1 ns timer slack: the default 50 us would add to every wake's lateness.
        let _ = nix::sys::prctl::set_timerslack(1);
        let cpu0 = udpx_lab::cpu::ProcessCpu::thread().ok();
        let start = Timestamp::now().as_nanos();
        let stop_at = cfg.run_for.map(|d| start.saturating_add(d.as_nanos() as u64));
        let mut stall = cfg.stall.map(|(after, len)| (start + after.as_nanos() as u64, len));
        let mut steady = crate::alloc::counting().then_some(0u64);
        while !stop.load(Ordering::Relaxed) && stop_at.is_none_or(|t| Timestamp::now().as_nanos() < t) {
            self.changed = false;
            let (res, allocs) = crate::alloc::measure(|| self.iterate(cfg, &mut stall));
            res?;
            if !self.changed {
                if let (Some(s), Some(a)) = (steady.as_mut(), allocs) {
                    *s += a;
                }
                self.stats.steady_iterations += 1;
            }
        }
        let now = Timestamp::now().as_nanos();
        let live: Vec<u32> = self.by_addr.values().copied().collect();
        for idx in live {
            self.end_flow(idx, now);
        }
        self.stats.steady_allocations = steady;
        self.stats.send_calls = self.shard.counters().send_calls;
        if let (Some(c0), Ok(c1)) = (cpu0, udpx_lab::cpu::ProcessCpu::thread()) {
            self.stats.cpu_s = c1.diff(&c0).total().as_secs_f64();
        }
        Ok(self.stats)
    }

    /// One wait and what follows it.
    fn iterate(&mut self, cfg: &ServeConfig, stall: &mut Option<(u64, Duration)>) -> Result<(), StreamError> {
        let now = Timestamp::now().as_nanos();
        let lookahead = self.lookahead(cfg);
        let wait = match self.pacer.next_wakeup() {
            Some(w) => Duration::from_nanos(w.saturating_sub(now + lookahead)).min(IDLE_WAIT),
            None => IDLE_WAIT,
        };
        let (readable, error) = self.poll(wait)?;
        if error {
            self.clients_gone();
        }
        if readable {
            self.read_requests(cfg)?;
        }
        let now = Timestamp::now().as_nanos();
        if now >= self.next_sweep_ns {
            self.sweep(now);
        }
        if let Some((at, len)) = *stall {
            if Timestamp::now().as_nanos() >= at {
                std::thread::sleep(len);
                *stall = None;
            }
        }
        let now = Timestamp::now().as_nanos();
        self.pacer.advance_to(now + lookahead, &mut self.releases);
        if !self.releases.is_empty() {
            self.stats.busy_wakes += 1;
            self.send_releases(now);
        }
        Ok(())
    }

    fn lookahead(&self, cfg: &ServeConfig) -> u64 {
        match self.pacing {
            Some(Pacing::Kernel { .. }) => cfg.lookahead.as_nanos() as u64,
            _ => 0,
        }
    }

    /// Waits up to `wait` for a request; returns (readable, an error is queued).
    fn poll(&self, wait: Duration) -> Result<(bool, bool), StreamError> {
        let r = self.shard.poll(libc::POLLIN, wait).map_err(|e| StreamError::Io(format!("ppoll: {e}")))?;
        Ok((r & libc::POLLIN != 0, r & libc::POLLERR != 0))
    }

    /// Ends the flows whose client answered with "port unreachable" (it went away): a server
    /// does not stream into nothing for the rest of a flow's duration. Only an error whose
    /// quote carries the flow's secret counts: anyone can forge a "port unreachable" naming a
    /// client's address, but only a host that saw the flow's data knows the secret. (The
    /// library keeps the errors it read while retrying a call for this drain.)
    fn clients_gone(&mut self) {
        let (flows, by_addr, gone) = (&self.flows, &self.by_addr, &mut self.gone);
        let mut unverified = 0;
        let _ = self.shard.drain_errors(|e| {
            if e.errno != libc::ECONNREFUSED {
                return;
            }
            let Some(&idx) = e.destination.and_then(|d| by_addr.get(&d)) else { return };
            let Some(f) = flows[idx as usize] else { return };
            if wire::quoted_secret(e.quoted()) == Some(f.secret) {
                if !gone.contains(&idx) {
                    gone.push(idx);
                }
            } else {
                unverified += 1;
            }
        });
        self.stats.icmp_unverified += unverified;
        let now = Timestamp::now().as_nanos();
        while let Some(idx) = self.gone.pop() {
            self.stats.clients_gone += 1;
            self.end_flow(idx, now);
        }
    }

    /// Ends the flows whose client has not been heard from for the consent timeout: one pass
    /// over the flow table, ten times per timeout and at most once a second (counted in
    /// `sweeps`).
    fn sweep(&mut self, now: u64) {
        self.next_sweep_ns = now + self.sweep_ns;
        self.stats.sweeps += 1;
        let timeout = self.consent_ns;
        for idx in 0..self.flows.len() {
            if self.flows[idx].is_some_and(|f| now.saturating_sub(f.heard_ns) > timeout) {
                self.stats.consent_lapsed += 1;
                self.end_flow(idx as u32, now);
            }
        }
    }

    /// Reads one batch of requests and keepalives (at most the receive buffers' 32): a burst
    /// of thousands of clients asking at once is taken a batch per iteration, between
    /// releases, so the flows already streaming keep their schedule (the next poll returns at
    /// once while more wait).
    fn read_requests(&mut self, cfg: &ServeConfig) -> Result<(), StreamError> {
        loop {
            match self.shard.try_recv_into(&mut self.rx) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    for i in 0..n {
                        let (meta, bytes) = self.rx.message(i);
                        let (addr, len) = (meta.addr, bytes.len());
                        match wire::parse(bytes) {
                            Some(Message::Request(r)) => {
                                self.changed = true;
                                self.request(cfg, addr, r, len);
                            }
                            Some(Message::Keepalive { flow, secret }) => self.keepalive(addr, flow, secret),
                            _ => self.stats.malformed += 1,
                        }
                    }
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Nothing a datagram or an ICMP message causes ends the shard (the library
                // keeps ICMP errors out of receives); only a broken socket does.
                Err(e) if udpx::recv::is_unusable(&e) => {
                    return Err(StreamError::Io(format!("receiving requests: {e}")))
                }
                Err(e) => {
                    self.stats.recv_errors += 1;
                    log::debug!("udpx stream: receive failed (counted, serving on): {e}");
                    return Ok(());
                }
            }
        }
    }

    /// A keepalive: the client still wants its flow (it must know the flow's secret).
    fn keepalive(&mut self, addr: SocketAddr, flow: u32, secret: u64) {
        let Some(&idx) = self.by_addr.get(&addr) else {
            self.stats.bad_keepalives += 1;
            return;
        };
        match self.flows[idx as usize].as_mut() {
            Some(f) if f.secret == secret && f.client_flow == flow => {
                f.heard_ns = Timestamp::now().as_nanos();
                self.stats.keepalives += 1;
            }
            _ => self.stats.bad_keepalives += 1,
        }
    }

    /// Sends `bytes` to an address not yet proven, if the rate allows (counted either way).
    fn send_unproven(&mut self, addr: SocketAddr, len: usize) -> bool {
        if !self.unproven.take(Timestamp::now().as_nanos()) {
            self.stats.unproven_limited += 1;
            return false;
        }
        if self.shard.send(&[Transmit::new(addr, &self.ctrl[..len])]).is_err() {
            self.stats.control_unsent += 1;
        }
        true
    }

    /// A request of `len` bytes from `addr` (see the module docs for the order of checks).
    fn request(&mut self, cfg: &ServeConfig, addr: SocketAddr, r: Request, len: usize) {
        let now = Timestamp::now().as_nanos();
        let now_s = now / 1_000_000_000;
        let proven = r.cookie.is_some_and(|c| self.shared.cookies.check(addr, &c, now_s));
        if !proven {
            // No state, and an answer no larger than the request: a cookie to ask again with.
            self.stats.bad_cookies += u64::from(r.cookie.is_some());
            let cookie = self.shared.cookies.make(addr, now_s);
            let n = wire::write_cookie(&mut self.ctrl, r.flow, &cookie);
            if self.send_unproven(addr, n) {
                self.stats.cookies_sent += 1;
            }
            return;
        }
        if let Some(&idx) = self.by_addr.get(&addr) {
            // A repeated request (the acceptance was lost): accept again, change nothing.
            if let Some(f) = self.flows[idx as usize].as_mut() {
                f.heard_ns = now;
                let secret = f.secret;
                self.accept(addr, r.flow, secret);
            }
            return;
        }
        if self.pacing.is_none() {
            let p = crate::pacing::decide(self.pacing_choice, addr.ip());
            self.stats.pacing = p.to_string();
            self.pacing = Some(p);
        }
        // Refusals go to a proven address, still no larger than the request and rate-limited.
        let refuse = |s: &mut Self, why: String| {
            s.stats.refused += 1;
            let n = wire::write_refused(&mut s.ctrl, r.flow, &why, len);
            s.send_unproven(addr, n);
        };
        if r.rate > cfg.max_rate {
            return refuse(self, format!("rate {} B/s is above this server's --max-rate {}", r.rate, cfg.max_rate));
        }
        if (r.size as usize) < wire::HEADER || r.size as usize > udpx::max_payload(&addr) {
            return refuse(
                self,
                format!("datagram size {}: give {} to {} bytes", r.size, wire::HEADER, udpx::max_payload(&addr)),
            );
        }
        let duration = Duration::from_millis(u64::from(r.duration_ms));
        if duration.is_zero() || duration > cfg.max_duration {
            return refuse(self, format!("duration {duration:?}: give more than 0 and at most {:?}", cfg.max_duration));
        }
        let granularity = match (r.interval_ns, r.segments) {
            (0, 0) => Granularity::Segments(cfg.default_segments),
            (0, n) => Granularity::Segments(n),
            (i, _) => Granularity::IntervalNs(i),
        };
        let fc = FlowConfig {
            rate: r.rate,
            datagram_size: r.size,
            granularity,
            burst: (r.burst > 0).then_some(r.burst),
            source: udpx_pace::Source::Streaming,
        };
        match fc.validate(self.pacer.config().slot_ns) {
            Ok(p)
                if p.burst as usize * p.size as usize > CHUNK_BYTES
                    || (p.burst as usize).div_ceil(udpx::max_payload(&addr) / p.size as usize) > CHUNK_TRANSMITS =>
            {
                return refuse(
                    self,
                    format!(
                        "a burst of {} x {} B exceeds this server's {} KiB send buffer: lower the burst, the interval or the size",
                        p.burst,
                        p.size,
                        CHUNK_BYTES >> 10
                    ),
                )
            }
            Ok(_) => {}
            Err(e) => return refuse(self, e.to_string()),
        }
        if let Err(why) = self.shared.caps.admit(addr.ip(), r.rate) {
            self.stats.capped += 1;
            return refuse(self, why);
        }
        match self.pacer.add_flow(fc, now) {
            Ok(idx) => {
                let secret = admission::flow_secret();
                self.flows[idx as usize] = Some(Flow {
                    addr,
                    client_flow: r.flow,
                    secret,
                    size: r.size,
                    rate: r.rate,
                    seq: 0,
                    end_ns: now.saturating_add(duration.as_nanos() as u64),
                    heard_ns: now,
                });
                self.by_addr.insert(addr, idx);
                self.stats.flows += 1;
                // Counted live before the client can hear it is.
                self.shared.live.fetch_add(1, Ordering::Relaxed);
                self.accept(addr, r.flow, secret);
            }
            Err(e) => {
                self.shared.caps.release(addr.ip(), r.rate);
                refuse(self, e.to_string())
            }
        }
    }

    fn accept(&mut self, addr: SocketAddr, flow: u32, secret: u64) {
        let n = wire::write_accepted(&mut self.ctrl, flow, secret);
        if self.shard.send(&[Transmit::new(addr, &self.ctrl[..n])]).is_err() {
            // The client asks again until it hears (its requests repeat): counted, not lost.
            self.stats.control_unsent += 1;
        }
    }

    fn end_flow(&mut self, idx: u32, _now: u64) {
        self.changed = true;
        let Some(f) = self.flows[idx as usize].take() else { return };
        let _ = self.pacer.remove_flow(idx);
        self.by_addr.remove(&f.addr);
        self.shared.caps.release(f.addr.ip(), f.rate);
        self.shared.live.fetch_sub(1, Ordering::Relaxed);
        // Twice: the End tells the receiver its exact loss, so it is worth a spare.
        let n = wire::write_end(&mut self.ctrl, f.client_flow, f.secret, f.seq);
        let t = Transmit::new(f.addr, &self.ctrl[..n]);
        match self.shard.send(&[t, t]) {
            Ok(2) => {}
            Ok(n) => self.stats.control_unsent += 2 - n as u64,
            // Without its End the receiver counts loss up to the highest sequence it saw.
            Err(e) => self.stats.control_unsent += 2 - e.sent.min(2) as u64,
        }
    }

    fn send_releases(&mut self, now: u64) {
        let kernel = matches!(self.pacing, Some(Pacing::Kernel { .. }));
        let releases = std::mem::take(&mut self.releases);
        let mut i = 0;
        while i < releases.len() {
            self.planned.clear();
            let mut off = 0;
            while i < releases.len() && self.planned.len() < CHUNK_TRANSMITS {
                let r = releases[i];
                let Some(f) = self.flows[r.flow as usize] else {
                    i += 1;
                    continue;
                };
                if now >= f.end_ns {
                    i += 1;
                    self.end_flow(r.flow, now);
                    continue;
                }
                let size = f.size as usize;
                let len = size * r.datagrams as usize;
                // One GSO buffer holds at most one UDP datagram's worth of bytes (and 64
                // segments, which the library splits itself): a larger release goes as several.
                let per_buffer = (udpx::max_payload(&f.addr) / size).clamp(1, udpx_pace::MAX_SEGMENTS as usize);
                let buffers = (r.datagrams as usize).div_ceil(per_buffer);
                if off + len > self.payload.len() || self.planned.len() + buffers > CHUNK_TRANSMITS {
                    if self.planned.is_empty() {
                        // Cannot happen for a flow the request check let in (a burst fits an
                        // empty chunk); counted rather than trusted.
                        self.stats.unsent += u64::from(r.datagrams);
                        i += 1;
                        continue;
                    }
                    break;
                }
                for k in 0..r.datagrams as usize {
                    let d = wire::Data {
                        flow: f.client_flow,
                        secret: f.secret,
                        size: f.size,
                        seq: f.seq + k as u64,
                        intended_ns: r.due_ns,
                        sent_ns: now,
                        rate: f.rate,
                    };
                    wire::write_data(&mut self.payload[off + k * size..], &d);
                }
                if let Some(live) = self.flows[r.flow as usize].as_mut() {
                    live.seq += u64::from(r.datagrams);
                }
                for b in 0..buffers {
                    let first = b * per_buffer;
                    let n = per_buffer.min(r.datagrams as usize - first);
                    self.planned.push(Planned {
                        dst: f.addr,
                        off: off + first * size,
                        len: n * size,
                        size,
                        due_ns: r.due_ns,
                    });
                }
                self.stats.releases += 1;
                self.stats.datagrams += u64::from(r.datagrams);
                self.stats.bytes += len as u64;
                off += len;
                i += 1;
            }
            self.send_planned(kernel);
        }
        self.releases = releases;
        self.releases.clear();
    }

    /// Sends the planned chunk, resuming at the cursor after every stop that is not final.
    fn send_planned(&mut self, kernel: bool) {
        let mut txs = udpx::recycle_transmits(std::mem::take(&mut self.transmits));
        for p in &self.planned {
            let mut t = Transmit::new(p.dst, &self.payload[p.off..p.off + p.len]);
            if p.len > p.size {
                t = t.segmented(p.size);
            }
            if kernel {
                t.departure = Some(Timestamp::from_nanos(p.due_ns));
            }
            txs.push(t);
        }
        let mut cur = SendCursor::default();
        let mut nobufs = 0u32;
        let mut backoff = Duration::from_micros(50);
        while cur.transmit < txs.len() {
            let e = match self.shard.try_send(&mut self.bufs, &txs, cur) {
                Ok(_) => break,
                Err(e) => e,
            };
            if e.cursor() != cur {
                nobufs = 0;
            }
            cur = e.cursor();
            let give_up = match &e.kind {
                SendErrorKind::WouldBlock => {
                    self.stats.would_block += 1;
                    !matches!(self.shard.wait_writable(WRITABLE_WAIT), Ok(true))
                }
                SendErrorKind::NoBuffers => {
                    self.stats.no_buffers += 1;
                    nobufs += 1;
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(10));
                    nobufs > NOBUFS_TRIES
                }
                _ => {
                    // Final for this transmit: count it and go on with the next.
                    self.stats.send_errors += 1;
                    let t = &txs[cur.transmit];
                    self.stats.unsent += (t.segments() - cur.segment) as u64;
                    log::warn!("udpx stream: a transmit to {} failed: {}", t.destination, e);
                    cur = SendCursor { transmit: cur.transmit + 1, segment: 0 };
                    false
                }
            };
            if give_up {
                let left: usize = txs[cur.transmit..].iter().map(|t| t.segments()).sum::<usize>() - cur.segment;
                self.stats.unsent += left as u64;
                log::warn!("udpx stream: {left} datagrams not sent: the socket stayed full ({:?})", e.kind);
                break;
            }
        }
        txs.clear();
        self.transmits = udpx::recycle_transmits(txs);
    }
}

/// Puts the calling thread under SCHED_FIFO at `prio`; says what it got.
fn set_realtime(prio: u8) -> String {
    use thread_priority::{
        set_thread_priority_and_policy, thread_native_id, RealtimeThreadSchedulePolicy, ThreadPriority,
        ThreadPriorityValue, ThreadSchedulePolicy,
    };
    let Ok(value) = ThreadPriorityValue::try_from(prio) else {
        return format!("normal (priority {prio} refused)");
    };
    let policy = ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo);
    match set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Crossplatform(value), policy) {
        Ok(()) => format!("SCHED_FIFO {prio}"),
        Err(e) => {
            log::warn!("udpx stream: SCHED_FIFO {prio} not granted ({e:?}); the pacer runs at normal priority");
            format!("normal (SCHED_FIFO {prio} not granted: {e:?})")
        }
    }
}
