//! The receiving role (`udpx bench rx`, and the receiver thread of the main job), an event
//! loop over a non-blocking socket: counts
//! datagrams, bytes, receive calls and GRO buffers; with `verify`, checks every datagram's
//! sequence number and checksum (loss, reordering, corruption); always counts truncation and
//! the kernel's drop counter.

use std::io::{IoSliceMut, Read};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use udpx::{RecvMeta, UdpSocket, GRO_BUFFER};

use crate::cpu::ProcessCpu;
use crate::tx::{Interval, Ticker};
use crate::wire::SeqTracker;

/// Receive buffers per call.
pub const BUFFERS: usize = 32;

/// How to receive.
#[derive(Debug, Clone)]
pub struct RxConfig {
    /// Check sequence numbers and checksums.
    pub verify: bool,
    /// Stop after this long without data, once data has arrived.
    pub idle: Duration,
    /// Stop after this long in any case.
    pub max: Duration,
}

/// What a receiver saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RxResult {
    /// Seconds from the first datagram to the last.
    pub secs: f64,
    /// Payload bytes.
    pub bytes: u64,
    /// Datagrams (each GRO segment counts).
    pub datagrams: u64,
    /// Receive system calls that returned data.
    pub calls: u64,
    /// Buffers that held more than one datagram (GRO).
    pub gro_buffers: u64,
    /// Datagrams cut short by a small buffer.
    pub truncated: u64,
    /// The kernel's drop counter for the socket at the end (SO_RXQ_OVFL).
    pub kernel_drops: u64,
    /// Sequence accounting (with `verify`).
    pub seq: Option<SeqTracker>,
    /// CPU time of the receiving thread: user seconds.
    pub user_secs: f64,
    /// CPU time of the receiving thread: system seconds.
    pub sys_secs: f64,
    /// Per-second progress.
    pub intervals: Vec<Interval>,
}

/// Receives until `stop` is set (and the queue is drained), or idle/max time passes.
pub fn run_rx(
    cfg: &RxConfig,
    sock: Option<&UdpSocket>,
    tcp: Option<TcpStream>,
    stop: &AtomicBool,
    on_interval: &mut dyn FnMut(&Interval),
) -> std::io::Result<RxResult> {
    let cpu0 = ProcessCpu::thread().unwrap_or_default();
    let begin = Instant::now();
    let mut res = RxResult::default();
    let mut first: Option<Instant> = None;
    let mut last_data = Instant::now();
    let mut ticker: Option<Ticker> = None;
    let mut tracker = cfg.verify.then(SeqTracker::default);
    let mut bufs: Vec<Vec<u8>> = (0..BUFFERS).map(|_| vec![0u8; GRO_BUFFER]).collect();
    let mut metas = [RecvMeta::default(); BUFFERS];
    let mut tcp = tcp;
    let mut tcp_buf = if tcp.is_some() { vec![0u8; 256 << 10] } else { Vec::new() };
    // Event-loop style, like udpgso_bench_rx, iperf3 and every epoll server: a non-blocking
    // socket drained until EAGAIN, then poll(2) until readable again.
    if let Some(s) = sock {
        s.set_nonblocking(true)?;
    }
    if let Some(t) = tcp.as_ref() {
        t.set_read_timeout(Some(Duration::from_millis(50)))?;
    }
    let c0 = sock.map(|s| s.counters()).unwrap_or_default();
    loop {
        let now = Instant::now();
        let idle = first.is_some() && now - last_data > cfg.idle;
        if now - begin > cfg.max
            || idle
            || (stop.load(Ordering::Relaxed) && now - last_data > Duration::from_millis(100))
        {
            break;
        }
        let got = if let Some(s) = sock {
            let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            match s.recv(&mut slices, &mut metas) {
                Ok(n) => {
                    for (m, b) in metas[..n].iter().zip(&bufs) {
                        res.bytes += m.len as u64;
                        let segs = m.segment_count() as u64;
                        res.datagrams += segs;
                        res.gro_buffers += (segs > 1) as u64;
                        res.truncated += m.truncated as u64;
                        if let Some(t) = tracker.as_mut() {
                            for d in m.segments(b) {
                                t.see(d);
                            }
                        }
                    }
                    n > 0
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    s.wait_readable(Duration::from_millis(50))?;
                    false
                }
                Err(e) => return Err(e),
            }
        } else if let Some(t) = tcp.as_mut() {
            match t.read(&mut tcp_buf) {
                Ok(0) => break,
                Ok(n) => {
                    res.bytes += n as u64;
                    res.datagrams += 1;
                    res.calls += 1;
                    true
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => false,
                Err(e) => return Err(e),
            }
        } else {
            return Err(std::io::Error::other("receiver needs a UDP socket or a TCP stream"));
        };
        if got {
            let now = Instant::now();
            first.get_or_insert(now);
            ticker.get_or_insert(Ticker::new(now));
            last_data = now;
        }
        if let Some(s) = sock {
            res.calls = s.counters().since(&c0).recv_calls;
        }
        if let Some(iv) = ticker.as_mut().and_then(|t| t.tick(now, res.bytes, res.datagrams, res.calls)) {
            on_interval(&iv);
            res.intervals.push(iv);
        }
    }
    res.secs = match first {
        Some(f) => (last_data - f).as_secs_f64(),
        None => 0.0,
    };
    let cpu = ProcessCpu::thread().unwrap_or_default().diff(&cpu0);
    res.user_secs = cpu.user.as_secs_f64();
    res.sys_secs = cpu.system.as_secs_f64();
    if let Some(s) = sock {
        let c = s.counters().since(&c0);
        res.calls = c.recv_calls;
        res.kernel_drops = s.kernel_drops().map(u64::from).unwrap_or(s.counters().kernel_drops);
    }
    res.seq = tracker;
    Ok(res)
}
