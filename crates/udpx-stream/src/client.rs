//! `udpx stream recv`: many real clients in one process. Each flow is its own socket, bound to
//! its own port (and, past the ports one address has, to further local addresses), so the
//! server, the kernel and any qdisc in between see separate flows, as they would see separate
//! viewers. One epoll set watches them all; a readable socket is drained with `recvmmsg`.
//!
//! Each flow asks with a request datagram and repeats it every [`REQUEST_RETRY`] until the
//! server accepts or refuses it (a request can be lost like any datagram). The server's first
//! answer is a cookie, which the flow's next request carries (it proves the flow receives at
//! its address); once streaming, the flow sends a keepalive with its secret every
//! [`KEEPALIVE_INTERVAL`], or the server ends it. The server ends each flow with an End
//! datagram carrying how many it sent, so loss is exact where it arrives.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use udpx::{RecvBuffers, SocketConfig, Timestamp, Transmit, UdpSocket};

use crate::tally::{Summary, Tally};
use crate::wire::{self, Message, Request};
use crate::StreamError;

/// How often an unanswered request is repeated.
pub const REQUEST_RETRY: Duration = Duration::from_millis(250);
/// How often a streaming flow tells the server it still wants its data (the server ends a
/// flow after [`crate::server::CONSENT_TIMEOUT`] without one).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// Keepalives sent per loop turn at most (the rest wait for the next turns).
const KEEPALIVE_BURST: usize = 512;
/// Requests sent per flow before the server counts as not answering.
pub const REQUEST_TRIES: u32 = 20;
/// Requests sent at once before the receiver lets the server catch up (its receive queue
/// holds a few hundred small datagrams).
const REQUEST_BURST: usize = 200;
/// Ports one local address offers for client sockets (the default ephemeral range, with margin).
pub const PORTS_PER_ADDRESS: u32 = 25_000;
/// How long after its duration the receiver waits for the last data and the Ends.
pub const GRACE: Duration = Duration::from_secs(2);

/// What the receiver asks for.
#[derive(Debug, Clone)]
pub struct RecvConfig {
    /// The server's address.
    pub server: SocketAddr,
    /// Flows (sockets).
    pub flows: u32,
    /// Bytes per second per flow.
    pub rate: u64,
    /// Bytes per datagram.
    pub size: u32,
    /// Release interval (`None`: by segments).
    pub interval: Option<Duration>,
    /// Datagrams per release (0: the server's default).
    pub segments: u32,
    /// Burst allowance, datagrams (0: the pacer's default).
    pub burst: u32,
    /// How long each flow streams.
    pub duration: Duration,
    /// Local addresses to bind the flows' sockets to, round robin (empty: the unspecified
    /// address of the server's family).
    pub local: Vec<IpAddr>,
}

impl RecvConfig {
    /// `flows` flows of `rate` bytes/s in 1200-byte datagrams for `duration`.
    pub fn new(server: SocketAddr, flows: u32, rate: u64, duration: Duration) -> RecvConfig {
        RecvConfig {
            server,
            flows,
            rate,
            size: 1200,
            interval: None,
            segments: 0,
            burst: 0,
            duration,
            local: Vec::new(),
        }
    }

    /// Refuses numbers no run can use, with what to change.
    pub fn validate(&self) -> Result<(), StreamError> {
        let usage = |m: String| Err(StreamError::Usage(m));
        if self.flows == 0 || self.flows > 1_000_000 {
            return usage(format!("--flows {}: give 1 to 1000000", self.flows));
        }
        if self.rate == 0 {
            return usage("--rate 0: give a rate above 0 bytes/s (e.g. 4k, 1M)".into());
        }
        if self.rate > udpx_pace::MAX_RATE {
            return usage(format!(
                "--rate {}: no machine sends that per flow; give at most {} bytes/s",
                self.rate,
                udpx_pace::MAX_RATE
            ));
        }
        let total = u128::from(self.rate) * u128::from(self.flows);
        if total > u128::from(udpx_pace::MAX_RATE) {
            return usage(format!(
                "--flows {} x --rate {} = {total} bytes/s: no machine sends that; lower either",
                self.flows, self.rate
            ));
        }
        if (self.size as usize) < wire::HEADER || self.size as usize > udpx::max_payload(&self.server) {
            return usage(format!(
                "--size {}: give {} to {} bytes",
                self.size,
                wire::HEADER,
                udpx::max_payload(&self.server)
            ));
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(24 * 3600) {
            return usage(format!("--duration {:?}: give more than 0 and at most a day", self.duration));
        }
        if let Some(i) = self.interval {
            if i < Duration::from_micros(250) {
                return usage(format!("--interval {i:?} is below the pacer's 250 us slot: give at least 0.25 ms"));
            }
        }
        let addrs = self.local.len().max(1) as u64;
        if u64::from(self.flows) > addrs * u64::from(PORTS_PER_ADDRESS) {
            return usage(format!(
                "{} flows need {} local addresses at {PORTS_PER_ADDRESS} ports each; {} given (--local)",
                self.flows,
                u64::from(self.flows).div_ceil(u64::from(PORTS_PER_ADDRESS)),
                self.local.len()
            ));
        }
        Ok(())
    }

    fn request(&self, flow: u32, cookie: Option<wire::Cookie>) -> Request {
        Request {
            cookie,
            flow,
            size: self.size,
            rate: self.rate,
            interval_ns: self.interval.map_or(0, |i| i.as_nanos() as u64),
            segments: self.segments,
            burst: self.burst,
            duration_ms: self.duration.as_millis().min(u128::from(u32::MAX)) as u32,
        }
    }
}

/// Live counts, for a progress display in another thread.
#[derive(Debug, Default)]
pub struct Progress {
    /// Datagrams received.
    pub datagrams: AtomicU64,
    /// Bytes received.
    pub bytes: AtomicU64,
    /// Flows the server accepted.
    pub accepted: AtomicU64,
    /// Set by the caller to end the run early.
    pub cancel: AtomicBool,
}

/// What the receiver measured.
#[derive(Debug)]
pub struct RecvReport {
    /// The aggregate.
    pub summary: Summary,
    /// Everything, for plots.
    pub tally: Tally,
    /// Flows the server accepted.
    pub accepted: u32,
    /// Flows the server refused, and the first reason given.
    pub refused: (u32, Option<String>),
    /// Seconds from the first request to the end.
    pub elapsed_s: f64,
    /// Datagrams the receiving sockets' buffers dropped (the kernel's per-socket count,
    /// SO_MEMINFO, summed at the end): loss at the receiver, not on the way. `None` where the
    /// kernel does not say.
    pub socket_drops: Option<u64>,
}

/// Raises the open-file limit to `need` descriptors, or says what to change.
pub fn raise_fd_limit(need: u64) -> Result<(), StreamError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| StreamError::Setup(format!("getrlimit: {e}")))?;
    if soft >= need {
        return Ok(());
    }
    if hard < need {
        // Root may raise the hard limit too, up to fs.nr_open.
        if setrlimit(Resource::RLIMIT_NOFILE, need, need).is_ok() {
            return Ok(());
        }
        return Err(StreamError::Usage(format!(
            "{need} open files needed (one socket per flow) but the limit is {hard}: \
             raise it (ulimit -n {need}) or use fewer flows"
        )));
    }
    setrlimit(Resource::RLIMIT_NOFILE, need, hard).map_err(|e| StreamError::Setup(format!("setrlimit: {e}")))
}

/// One socket per flow (bound to the flow's local address, or the unspecified one), each
/// registered for reading with the flow's index, and the epoll instance they are in.
fn flow_sockets(cfg: &RecvConfig) -> Result<(Vec<UdpSocket>, Epoll), StreamError> {
    let unspecified: IpAddr = match cfg.server {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let mut sockets = Vec::with_capacity(cfg.flows as usize);
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| StreamError::Setup(format!("epoll: {e}")))?;
    for i in 0..cfg.flows {
        let ip = if cfg.local.is_empty() { unspecified } else { cfg.local[i as usize % cfg.local.len()] };
        let s = SocketConfig::new(SocketAddr::new(ip, 0))
            .nonblocking(true)
            .bind()
            .map_err(|e| StreamError::Setup(format!("flow {i}'s socket on {ip}: {e}")))?;
        epoll
            .add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, u64::from(i)))
            .map_err(|e| StreamError::Setup(format!("epoll_ctl: {e}")))?;
        sockets.push(s);
    }
    Ok((sockets, epoll))
}

/// Asks (again) for flows not yet answered, a burst at a time from `next`, which moves on
/// round the flows. Returns how many requests went; fails once a flow has asked
/// [`REQUEST_TRIES`] times unanswered.
fn ask(
    cfg: &RecvConfig,
    sockets: &[UdpSocket],
    state: &mut [FlowState],
    next: &mut usize,
    now: Instant,
) -> Result<usize, StreamError> {
    let mut req = [0u8; wire::REQUEST_LEN];
    let mut asked = 0;
    for _ in 0..state.len() {
        if asked >= REQUEST_BURST {
            break;
        }
        let i = *next;
        *next = (*next + 1) % state.len();
        if let FlowState::Asking { tries, last, cookie } = &mut state[i] {
            if last.is_some_and(|l: Instant| now.duration_since(l) < REQUEST_RETRY) {
                continue;
            }
            let cookie = *cookie;
            if *tries >= REQUEST_TRIES {
                return Err(StreamError::Io(format!(
                    "the server at {} did not answer flow {i}'s {REQUEST_TRIES} requests",
                    cfg.server
                )));
            }
            *tries += 1;
            *last = Some(now);
            asked += 1;
            let n = wire::write_request(&mut req, &cfg.request(i as u32, cookie));
            send_ignoring_refusals(&sockets[i], cfg.server, &req[..n])?;
        }
    }
    Ok(asked)
}

/// Sends the keepalives of the streaming flows that are due, a bounded number per turn from
/// `next`, which moves on round the flows.
fn send_keepalives(
    cfg: &RecvConfig,
    sockets: &[UdpSocket],
    state: &mut [FlowState],
    next: &mut usize,
    now: Instant,
) -> Result<(), StreamError> {
    let mut req = [0u8; wire::REQUEST_LEN];
    let mut sent = 0;
    for _ in 0..state.len() {
        if sent >= KEEPALIVE_BURST {
            break;
        }
        let i = *next;
        *next = (*next + 1) % state.len();
        if let FlowState::Streaming { secret, last_keepalive } = &mut state[i] {
            if now.duration_since(*last_keepalive) >= KEEPALIVE_INTERVAL {
                *last_keepalive = now;
                sent += 1;
                let n = wire::write_keepalive(&mut req, i as u32, *secret);
                send_ignoring_refusals(&sockets[i], cfg.server, &req[..n])?;
            }
        }
    }
    Ok(())
}

/// Runs the flows to their end and measures them.
pub fn receive(cfg: &RecvConfig, progress: &Progress) -> Result<RecvReport, StreamError> {
    cfg.validate()?;
    raise_fd_limit(u64::from(cfg.flows) + 64)?;
    let (sockets, epoll) = flow_sockets(cfg)?;
    let mut state = vec![FlowState::Asking { tries: 0, last: None, cookie: None }; cfg.flows as usize];
    let mut tally = Tally::new(cfg.flows as usize);
    let mut rx = RecvBuffers::new(16, (cfg.size as usize).max(2048));
    let mut events = vec![EpollEvent::empty(); 1024];
    let mut next_keepalive = 0usize;
    let start = Instant::now();
    let mut deadline = start + cfg.duration + GRACE;
    let mut refused = (0u32, None);
    let mut accepted = 0u32;
    let mut next_ask = 0usize;
    loop {
        let now = Instant::now();
        if now >= deadline || progress.cancel.load(Ordering::Relaxed) {
            break;
        }
        let asked = ask(cfg, &sockets, &mut state, &mut next_ask, now)?;
        send_keepalives(cfg, &sockets, &mut state, &mut next_keepalive, now)?;
        let wait = if asked >= REQUEST_BURST { 1u16 } else { 5 };
        let n = match epoll.wait(&mut events, EpollTimeout::from(wait)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(StreamError::Io(format!("epoll_wait: {e}"))),
        };
        for ev in &events[..n] {
            let i = ev.data() as usize;
            loop {
                match sockets[i].try_recv_into(&mut rx) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // An ICMP error from a request the server was not ready for: ask again.
                    Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => break,
                    Err(e) => return Err(StreamError::Io(format!("flow {i}: receiving: {e}"))),
                };
                let t = Timestamp::now().as_nanos();
                for (meta, bytes) in rx.datagrams() {
                    if meta.addr != cfg.server {
                        tally.malformed += 1;
                        continue;
                    }
                    let streaming = |secret| FlowState::Streaming { secret, last_keepalive: Instant::now() };
                    match wire::parse(bytes) {
                        Some(Message::Data(d)) => {
                            if matches!(state[i], FlowState::Asking { .. }) {
                                state[i] = streaming(d.secret);
                                accepted += 1;
                                progress.accepted.fetch_add(1, Ordering::Relaxed);
                            }
                            tally.data(i, &d, t);
                            progress.datagrams.fetch_add(1, Ordering::Relaxed);
                            progress.bytes.fetch_add(u64::from(d.size), Ordering::Relaxed);
                        }
                        Some(Message::Accepted { secret, .. }) => {
                            if matches!(state[i], FlowState::Asking { .. }) {
                                state[i] = streaming(secret);
                                accepted += 1;
                                progress.accepted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Some(Message::Cookie { cookie, .. }) => {
                            // Ask again at once, with the cookie that proves this address.
                            if let FlowState::Asking { cookie: c, last, .. } = &mut state[i] {
                                *c = Some(cookie);
                                *last = None;
                            }
                        }
                        Some(Message::End { count, .. }) => {
                            tally.end(i, count);
                            state[i] = FlowState::Done;
                        }
                        Some(Message::Refused { reason, .. }) => {
                            if !matches!(state[i], FlowState::Done) {
                                refused.0 += 1;
                                refused.1.get_or_insert_with(|| reason.to_owned());
                                state[i] = FlowState::Done;
                            }
                        }
                        _ => tally.malformed += 1,
                    }
                }
            }
        }
        if state.iter().all(|s| matches!(s, FlowState::Done)) {
            break;
        }
        // Every flow refused or ended: no reason to wait out the duration.
        if refused.0 == cfg.flows {
            deadline = Instant::now();
        }
    }
    // SO_MEMINFO per socket, read once at the end.
    let socket_drops = sockets.iter().map(|s| s.kernel_drops().ok().map(u64::from)).sum::<Option<u64>>();
    Ok(RecvReport {
        summary: tally.summary(),
        tally,
        accepted,
        refused,
        elapsed_s: start.elapsed().as_secs_f64(),
        socket_drops,
    })
}

fn send_ignoring_refusals(s: &UdpSocket, to: SocketAddr, bytes: &[u8]) -> Result<(), StreamError> {
    match s.send(&[Transmit::new(to, bytes)]) {
        Ok(_) => Ok(()),
        // Nothing listens yet, or the queue is full: the retry asks again.
        Err(e) if e.is_would_block() => Ok(()),
        Err(e) if matches!(&e.kind, udpx::SendErrorKind::Io(io) if io.raw_os_error() == Some(libc::ECONNREFUSED)) => {
            Ok(())
        }
        Err(e) => Err(StreamError::Io(format!("sending a request to {to}: {e}"))),
    }
}

#[derive(Debug, Clone, Copy)]
enum FlowState {
    Asking { tries: u32, last: Option<Instant>, cookie: Option<wire::Cookie> },
    Streaming { secret: u64, last_keepalive: Instant },
    Done,
}
