//! `udpx echo load`: the load generator. Many flows (one socket, one source port each, so the
//! kernel's hash spreads them), closed loop (a fixed number of requests outstanding per flow)
//! or open loop (a target rate), bounded in time always. Latency per transaction from the
//! timestamp in the request, into an HDR histogram; a request unanswered within the timeout
//! is a loss, counted, and (closed loop) replaced.

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::Serialize;
use udpx::{RecvMeta, SendMode, Timestamp, Transmit, UdpSocket, Want};

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
    /// Seconds of sending.
    pub secs: f64,
    /// Transactions per second.
    pub tps: f64,
    /// Latency percentiles in microseconds.
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
    Ok(())
}

struct Flow {
    sock: UdpSocket,
    next_seq: u64,
    /// seq -> send time (ns).
    pending: HashMap<u64, u64>,
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
                .buffers(1 << 20, 1 << 20)
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
    let mut rbufs: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 2048.max(cfg.size)]).collect();
    let mut metas = [RecvMeta::default(); 16];
    let start = Instant::now();
    let end = start + cfg.duration;
    let timeout_ns = cfg.timeout.as_nanos() as u64;
    let mut last_sweep = Instant::now();
    let interval_ns = cfg.rate.map(|r| 1_000_000_000 / r.max(1));
    let mut next_open = Timestamp::now().as_nanos();
    let mut rr = 0usize;
    let send = |f: &mut Flow, flow: u32, buf: &mut [u8], res: &mut LoadResult| {
        let now = Timestamp::now().as_nanos();
        let r = Request { seq: f.next_seq, sent_ns: now, flow };
        proto::write(buf, r);
        match f.sock.send(&[Transmit::new(cfg.dst, buf)]) {
            Ok(_) => {
                f.pending.insert(r.seq, now);
                f.next_seq += 1;
                res.sent += 1;
            }
            Err(e) if e.is_would_block() => {}
            Err(_) => {}
        }
    };
    // Closed loop: fill the window of every flow.
    if cfg.rate.is_none() {
        for (i, f) in flows.iter_mut().enumerate() {
            for _ in 0..cfg.outstanding {
                send(f, i as u32, &mut buf, &mut res);
            }
        }
    }
    loop {
        let now_i = Instant::now();
        let sending = now_i < end;
        if !sending && (flows.iter().all(|f| f.pending.is_empty()) || now_i > end + cfg.timeout) {
            break;
        }
        // Open loop: send what the schedule says is due.
        if let (Some(iv), true) = (interval_ns, sending) {
            let now = Timestamp::now().as_nanos();
            let mut budget = 64;
            while next_open <= now && budget > 0 {
                let i = rr % flows.len();
                rr += 1;
                send(&mut flows[i], i as u32, &mut buf, &mut res);
                next_open += iv;
                budget -= 1;
            }
        }
        // Receive whatever is there, on every flow.
        let mut any = false;
        #[allow(clippy::needless_range_loop)] // `send` needs the flow and its index
        for i in 0..flows.len() {
            loop {
                let got = {
                    let mut slices: Vec<IoSliceMut<'_>> = rbufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                    // Nothing queued (EAGAIN) or an ICMP error for a flow: nothing to read now.
                    flows[i].sock.recv(&mut slices, &mut metas).unwrap_or_default()
                };
                if got == 0 {
                    break;
                }
                any = true;
                let now = Timestamp::now().as_nanos();
                for (m, b) in metas[..got].iter().zip(&rbufs) {
                    let matched = proto::parse_reply(&b[..m.len])
                        .filter(|r| r.flow as usize == i)
                        .and_then(|r| flows[i].pending.remove(&r.seq).map(|t| (r, t)));
                    match matched {
                        Some((_, t)) => {
                            res.received += 1;
                            let _ = hist.record((now.saturating_sub(t) / 1000).max(1));
                            if cfg.rate.is_none() && sending {
                                send(&mut flows[i], i as u32, &mut buf, &mut res);
                            }
                        }
                        None => res.unexpected += 1,
                    }
                }
            }
        }
        // Sweep for timeouts every few ms.
        if last_sweep.elapsed() > Duration::from_millis(5) {
            last_sweep = Instant::now();
            let now = Timestamp::now().as_nanos();
            #[allow(clippy::needless_range_loop)] // as above
            for i in 0..flows.len() {
                let expired: Vec<u64> = flows[i]
                    .pending
                    .iter()
                    .filter(|(_, &t)| now.saturating_sub(t) > timeout_ns)
                    .map(|(s, _)| *s)
                    .collect();
                for s in expired {
                    flows[i].pending.remove(&s);
                    res.lost += 1;
                    if cfg.rate.is_none() && Instant::now() < end {
                        send(&mut flows[i], i as u32, &mut buf, &mut res);
                    }
                }
            }
        }
        if !any {
            let wait = if interval_ns.is_some() && sending { 0 } else { 1 };
            let mut fds: Vec<PollFd<'_>> =
                flows.iter().map(|f| PollFd::new(f.sock.as_fd(), PollFlags::POLLIN)).collect();
            let _ = poll(&mut fds, PollTimeout::from(wait as u8));
        }
    }
    // Whatever is still pending after the timeout is lost.
    res.lost += flows.iter().map(|f| f.pending.len() as u64).sum::<u64>();
    res.secs = cfg.duration.as_secs_f64().min(start.elapsed().as_secs_f64());
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
