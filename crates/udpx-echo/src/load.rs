//! `udpx echo load`: the load generator. Many flows (one socket, one source port each, so the
//! kernel's hash spreads them), closed loop (a fixed number of requests outstanding per flow)
//! or open loop (a target rate), bounded in time always. Latency per transaction into an HDR
//! histogram; a request unanswered within the timeout is a loss, counted, and (closed loop)
//! replaced.
//!
//! Closed loop, every flow's window is kept full: a reply, a loss or a failed send (the server
//! not up yet, a full send buffer) leaves a slot that the next pass fills, so the load offered
//! is `flows x outstanding` whatever happened before. Open loop, latency counts from the time
//! the schedule said a request was due, not from when it actually left (which would hide the
//! generator's own queueing under overload: coordinated omission); a request that cannot be
//! sent stays due and is tried again, and one still unsent when the run ends is counted.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use hdrhistogram::Histogram;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::Serialize;
use udpx::{RecvBuffers, SendErrorKind, SendMode, Timestamp, Transmit, UdpSocket, Want};

use crate::proto::{self, Request};

/// Load settings.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Server address.
    pub dst: SocketAddr,
    /// Local address to send from (port 0 per flow).
    pub bind: SocketAddr,
    /// Flows (sockets).
    pub flows: usize,
    /// Request size in bytes.
    pub size: usize,
    /// Closed loop: requests outstanding per flow.
    pub outstanding: usize,
    /// Open loop: requests per second in all (overrides `outstanding`).
    pub rate: Option<u64>,
    /// How long to send.
    pub duration: Duration,
    /// A request unanswered this long is lost.
    pub timeout: Duration,
}

/// What the generator measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadResult {
    /// Requests sent.
    pub sent: u64,
    /// Matching replies received in time.
    pub received: u64,
    /// Requests unanswered within the timeout.
    pub lost: u64,
    /// Replies that matched no outstanding request (late, duplicated, or foreign).
    pub unexpected: u64,
    /// Send calls that failed (EAGAIN, ECONNREFUSED from an earlier ICMP error, ...); each
    /// request is tried again.
    pub send_failures: u64,
    /// ECONNREFUSED reports on the flows' sockets: ICMP port unreachable, nothing listening.
    pub refused: u64,
    /// Open loop: requests the schedule called for that had not gone out when sending ended.
    pub unsent: u64,
    /// Requests outstanding when sending ended (closed loop: flows x outstanding when every
    /// window is full).
    pub in_flight_at_end: u64,
    /// Seconds of sending.
    pub secs: f64,
    /// Transactions per second.
    pub tps: f64,
    /// Latency percentiles in microseconds: reply time minus the time the request was due
    /// (open loop: its scheduled time; closed loop: when it was sent).
    pub p50_us: f64,
    /// p90.
    pub p90_us: f64,
    /// p99.
    pub p99_us: f64,
    /// p99.9.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
}

/// Why a load configuration is refused.
pub fn check(cfg: &LoadConfig) -> Result<(), String> {
    if cfg.size < proto::HEADER || cfg.size > udpx::MAX_PAYLOAD_V4 {
        return Err(format!("--size {}: requests are {} to {} bytes", cfg.size, proto::HEADER, udpx::MAX_PAYLOAD_V4));
    }
    if cfg.flows == 0 || cfg.flows > 4096 {
        return Err(format!("--flows {}: give 1 to 4096 flows", cfg.flows));
    }
    if cfg.rate.is_none() && (cfg.outstanding == 0 || cfg.outstanding > 1024) {
        return Err(format!("--outstanding {}: give 1 to 1024 requests per flow", cfg.outstanding));
    }
    if cfg.rate == Some(0) {
        return Err("--rate 0: give a positive rate, or leave it out for closed loop".into());
    }
    if cfg.duration.is_zero() || cfg.duration > Duration::from_secs(3600) {
        return Err("--duration: more than 0 and at most 3600 seconds".into());
    }
    if cfg.timeout.is_zero() || cfg.timeout > Duration::from_secs(60) {
        return Err(format!("--timeout-ms {}: give 1 to 60000 milliseconds", cfg.timeout.as_millis()));
    }
    Ok(())
}

struct Flow {
    sock: UdpSocket,
    next_seq: u64,
    pending: HashMap<u64, Pending>,
}

/// An outstanding request: latency counts from `due`, the timeout from `sent`.
#[derive(Clone, Copy)]
struct Pending {
    due: u64,
    sent: u64,
}

impl Flow {
    /// Sends the next request of flow number `flow`, due at `due` (ns); false if the send
    /// failed (counted; the caller tries again later).
    fn send(&mut self, flow: u32, due: u64, dst: SocketAddr, buf: &mut [u8], res: &mut LoadResult) -> bool {
        let now = Timestamp::now().as_nanos();
        let r = Request { seq: self.next_seq, sent_ns: now, flow };
        proto::write(buf, r);
        match self.sock.send(&[Transmit::new(dst, buf)]) {
            Ok(_) => {
                self.pending.insert(r.seq, Pending { due, sent: now });
                self.next_seq += 1;
                res.sent += 1;
                true
            }
            Err(e) => {
                res.send_failures += 1;
                if matches!(&e.kind, SendErrorKind::Io(io) if io.kind() == io::ErrorKind::ConnectionRefused) {
                    res.refused += 1;
                }
                false
            }
        }
    }

    /// Closed loop: sends until `outstanding` requests are in flight or a send fails.
    fn fill(&mut self, flow: u32, outstanding: usize, dst: SocketAddr, buf: &mut [u8], res: &mut LoadResult) {
        while self.pending.len() < outstanding && self.send(flow, Timestamp::now().as_nanos(), dst, buf, res) {}
    }
}

/// Binds the flows' sockets (call inside the client's namespace).
pub fn bind_flows(cfg: &LoadConfig) -> Result<Vec<UdpSocket>, String> {
    (0..cfg.flows)
        .map(|_| {
            UdpSocket::builder(cfg.bind)
                .send_mode(SendMode::Sendmsg)
                .pktinfo(Want::Off)
                .ecn(Want::Off)
                .rxq_ovfl(Want::Off)
                // Replies of one flow in flight at once: its window (a burst of at least 64 in
                // the open loop), sized in the kernel's terms.
                .buffers(1 << 20, {
                    let burst = if cfg.rate.is_some() { 64 } else { cfg.outstanding.max(64) };
                    let role = udpx::rcvbuf::RecvRole::Server { clients: 1, burst, datagram: cfg.size };
                    udpx::rcvbuf::plan(role).set
                })
                .nonblocking(true)
                .connect(cfg.dst)
                .bind()
                .map_err(|e| format!("load generator socket: {e}"))
        })
        .collect()
}

/// Runs the load on sockets from [`bind_flows`].
pub fn run(cfg: &LoadConfig, socks: Vec<UdpSocket>) -> Result<LoadResult, String> {
    let mut flows: Vec<Flow> =
        socks.into_iter().map(|sock| Flow { sock, next_seq: 0, pending: HashMap::new() }).collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    let mut res = LoadResult::default();
    let mut buf = vec![0u8; cfg.size];
    let mut rbufs = RecvBuffers::new(16, 2048.max(cfg.size));
    let (dst, closed) = (cfg.dst, cfg.rate.is_none());
    let start = Timestamp::now().as_nanos();
    let end = start + cfg.duration.as_nanos() as u64;
    let timeout_ns = cfg.timeout.as_nanos() as u64;
    let mut last_sweep = start;
    let interval_ns = cfg.rate.map(|r| (1_000_000_000 / r.max(1)).max(1));
    // Open loop: when the next request is due, and on which flow.
    let (mut next_due, mut rr) = (start, 0usize);
    let mut sending = true;
    loop {
        let now = Timestamp::now().as_nanos();
        if sending && now >= end {
            sending = false;
            res.in_flight_at_end = flows.iter().map(|f| f.pending.len() as u64).sum();
            if let Some(iv) = interval_ns {
                res.unsent = end.saturating_sub(next_due).div_ceil(iv);
            }
        }
        if !sending && (flows.iter().all(|f| f.pending.is_empty()) || now > end + timeout_ns) {
            break;
        }
        if sending {
            match interval_ns {
                // Closed loop: top up every window (slots left by failed sends and losses).
                None => {
                    for (i, f) in flows.iter_mut().enumerate() {
                        f.fill(i as u32, cfg.outstanding, dst, &mut buf, &mut res);
                    }
                }
                // Open loop: send what the schedule says is due, a bounded burst per pass so
                // replies are read; a failed send leaves the request due for the next pass.
                Some(iv) => {
                    for _ in 0..64 {
                        if next_due > now || next_due >= end {
                            break;
                        }
                        let i = rr % flows.len();
                        rr += 1;
                        if !flows[i].send(i as u32, next_due, dst, &mut buf, &mut res) {
                            break;
                        }
                        next_due += iv;
                    }
                }
            }
        }
        // Receive whatever is there, on every flow.
        let mut any = false;
        for (i, f) in flows.iter_mut().enumerate() {
            loop {
                let got = match f.sock.recv_into(&mut rbufs) {
                    Ok(n) => n,
                    // An ICMP error for this flow, reported once: nothing to read now.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        res.refused += 1;
                        0
                    }
                    // Nothing queued (EAGAIN).
                    Err(_) => 0,
                };
                if got == 0 {
                    break;
                }
                any = true;
                let now = Timestamp::now().as_nanos();
                for (_, b) in rbufs.messages() {
                    let matched =
                        proto::parse_reply(b).filter(|r| r.flow as usize == i).and_then(|r| f.pending.remove(&r.seq));
                    match matched {
                        Some(p) => {
                            res.received += 1;
                            hist.saturating_record((now.saturating_sub(p.due) / 1000).max(1));
                        }
                        None => res.unexpected += 1,
                    }
                }
                if closed && sending {
                    f.fill(i as u32, cfg.outstanding, dst, &mut buf, &mut res);
                }
            }
        }
        // Sweep for timeouts every few ms (closed loop: the next pass refills the slots).
        let now = Timestamp::now().as_nanos();
        if now.saturating_sub(last_sweep) > 5_000_000 {
            last_sweep = now;
            for f in &mut flows {
                let before = f.pending.len();
                f.pending.retain(|_, p| now.saturating_sub(p.sent) <= timeout_ns);
                res.lost += (before - f.pending.len()) as u64;
            }
        }
        if !any {
            let wait = if interval_ns.is_some() && sending { 0u8 } else { 1 };
            let mut fds: Vec<PollFd<'_>> =
                flows.iter().map(|f| PollFd::new(f.sock.as_fd(), PollFlags::POLLIN)).collect();
            let _ = poll(&mut fds, PollTimeout::from(wait));
        }
    }
    // Whatever is still pending after the timeout is lost.
    res.lost += flows.iter().map(|f| f.pending.len() as u64).sum::<u64>();
    let elapsed = Duration::from_nanos(Timestamp::now().as_nanos().saturating_sub(start));
    res.secs = cfg.duration.as_secs_f64().min(elapsed.as_secs_f64());
    res.tps = res.received as f64 / res.secs.max(1e-9);
    let q = |p: f64| hist.value_at_quantile(p) as f64;
    if !hist.is_empty() {
        res.p50_us = q(0.5);
        res.p90_us = q(0.9);
        res.p99_us = q(0.99);
        res.p999_us = q(0.999);
        res.max_us = hist.max() as f64;
    }
    Ok(res)
}
