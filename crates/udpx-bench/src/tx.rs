//! The sending role (`udpx bench tx`, and the sender thread of the main job).
//!
//! Like the kernel's `udpgso_bench_tx`: the same buffer is sent over and over (or, with cache
//! thrashing, a working set larger than the last-level cache is rotated through), so what is
//! measured is the stack, not the program. Each loop iteration hands the library
//! [`PER_ITERATION`] datagrams; the send mode decides how many system calls that takes.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use udpx::{max_payload, CounterSnapshot, SegmentLimits, SendMode, Transmit, UdpSocket, ZcPool};

use crate::cpu::ProcessCpu;
use crate::wire;

/// Datagrams handed to one `UdpSocket::send` call.
pub const PER_ITERATION: usize = 256;
/// Smallest working set for cache thrashing.
pub const THRASH_MIN: usize = 64 << 20;
/// Largest working set for cache thrashing (memory is allocated and touched before each run).
pub const THRASH_MAX: usize = 1 << 30;

/// The last-level cache's size, from sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/`).
pub fn llc_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let mut best: Option<(u32, usize)> = None;
    for e in dir.flatten() {
        let p = e.path();
        let level = std::fs::read_to_string(p.join("level")).ok().and_then(|l| l.trim().parse::<u32>().ok());
        let size = std::fs::read_to_string(p.join("size")).ok().and_then(|s| parse_cache_size(&s));
        if let (Some(l), Some(sz)) = (level, size) {
            if best.is_none_or(|(bl, _)| l > bl) {
                best = Some((l, sz));
            }
        }
    }
    best.map(|b| b.1)
}

/// Parses sysfs cache sizes: `32768K`, `2M`, `512`.
pub fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

/// Working set for cache thrashing: twice the last-level cache, at least [`THRASH_MIN`] and at
/// most [`THRASH_MAX`] (a VM may report its host's whole L3, hundreds of MiB).
pub fn thrash_bytes() -> usize {
    llc_bytes().map_or(THRASH_MIN, |l| (2 * l).clamp(THRASH_MIN, THRASH_MAX))
}
/// TCP write size (iperf3's default).
pub const TCP_WRITE: usize = 128 << 10;

/// UDP with one of the four send modes, or TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Proto {
    /// UDP, sent with this mode.
    Udp(#[serde(serialize_with = "ser_mode")] SendMode),
    /// TCP (the kernel's segmentation offload; the yardstick).
    Tcp,
}

fn ser_mode<S: serde::Serializer>(m: &SendMode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(m.name())
}

/// What to send.
#[derive(Debug, Clone)]
pub struct TxConfig {
    /// Destination.
    pub dst: SocketAddr,
    /// Protocol and send mode.
    pub proto: Proto,
    /// Datagram size (UDP payload bytes).
    pub size: usize,
    /// How long to send.
    pub duration: Duration,
    /// Rotate over [`thrash_bytes`] of buffers instead of reusing one.
    pub cache_thrash: bool,
    /// Stamp a sequence number and checksum in every datagram.
    pub verify: bool,
    /// Bytes per second at most (`None`: as fast as possible).
    pub rate: Option<u64>,
    /// Segments per GSO send at most (zerocopy sends); `None`: as many as the kernel and the
    /// payload ceiling allow.
    pub max_segments: Option<usize>,
    /// Bytes per send call (`bench tx -s N -S SEG`, as `udpgso_bench_tx`): every call hands
    /// the library one buffer of exactly this many bytes cut into `size`-byte segments,
    /// `ceil(N / size)` of them, the last shorter when `size` does not divide it
    /// ([`plan_send_size`]). `None`: [`PER_ITERATION`] datagrams per loop, planned by
    /// [`plan_uniform`].
    pub send_size: Option<usize>,
    /// Send with MSG_ZEROCOPY from owned buffers (the socket must have zerocopy configured).
    pub zerocopy: bool,
}

/// Zerocopy on a sender: off, on with udpx's detection (turns off where the kernel copies),
/// or forced on (what a program without detection pays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Zc {
    /// Copy.
    Off,
    /// MSG_ZEROCOPY, turned off after copied completions.
    Auto,
    /// MSG_ZEROCOPY always.
    Forced,
}

/// One second's worth (or less, at the end) of progress.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Interval {
    /// Seconds since the start, at the end of the interval.
    pub at: f64,
    /// Length of the interval in seconds.
    pub secs: f64,
    /// Payload bytes.
    pub bytes: u64,
    /// Datagrams (or TCP writes).
    pub datagrams: u64,
    /// System calls.
    pub calls: u64,
}

/// Cuts running totals into one [`Interval`] per second (both roles use it).
#[derive(Debug, Clone, Copy)]
pub struct Ticker {
    origin: Instant,
    last: (Instant, u64, u64, u64),
}

impl Ticker {
    /// Starts counting at `origin` (totals zero).
    pub fn new(origin: Instant) -> Self {
        Ticker { origin, last: (origin, 0, 0, 0) }
    }

    /// The interval since the last one, if a second has passed by `now`.
    pub fn tick(&mut self, now: Instant, bytes: u64, datagrams: u64, calls: u64) -> Option<Interval> {
        if now.duration_since(self.last.0) < Duration::from_secs(1) {
            return None;
        }
        let (t, b, d, c) = self.last;
        self.last = (now, bytes, datagrams, calls);
        Some(Interval {
            at: (now - self.origin).as_secs_f64(),
            secs: (now - t).as_secs_f64(),
            bytes: bytes - b,
            datagrams: datagrams - d,
            calls: calls - c,
        })
    }
}

/// What a sender did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TxResult {
    /// Seconds spent sending.
    pub secs: f64,
    /// Payload bytes sent.
    pub bytes: u64,
    /// Datagrams sent (TCP: writes).
    pub datagrams: u64,
    /// Send system calls.
    pub calls: u64,
    /// GSO super-buffers sent.
    pub gso_buffers: u64,
    /// CPU time of the sending thread: user seconds.
    pub user_secs: f64,
    /// CPU time of the sending thread: system seconds (includes softirq work done in it).
    pub sys_secs: f64,
    /// The socket's counters (UDP).
    #[serde(skip)]
    pub counters: Option<CounterSnapshot>,
    /// GSO fallbacks taken.
    pub gso_fallbacks: u64,
    /// Zerocopy audit: sends made with MSG_ZEROCOPY.
    pub zerocopy_sends: u64,
    /// Zerocopy audit: ids completed.
    pub zerocopy_completed: u64,
    /// Zerocopy audit: completions that copied.
    pub zerocopy_copied: u64,
    /// Zerocopy was turned off during the run.
    pub zerocopy_turned_off: bool,
    /// Per-second progress.
    pub intervals: Vec<Interval>,
}

/// Buffers (and the zerocopy pool) made and touched before the clock starts, so a large
/// cache-thrashing working set costs nothing inside the measurement.
#[derive(Debug)]
pub struct TxPrepared {
    buf: Vec<u8>,
    sums: Vec<u32>,
    region: usize,
    regions: usize,
    zc_pool: Option<(ZcPool, usize)>,
}

/// Sends until `cfg.duration` passes or `stop` is set. `sock` is the UDP socket to use
/// (created by the caller, possibly inside a namespace); for TCP, `tcp` is a connected stream.
pub fn run_tx(
    cfg: &TxConfig,
    sock: Option<&UdpSocket>,
    tcp: Option<TcpStream>,
    stop: &AtomicBool,
    on_interval: &mut dyn FnMut(&Interval),
) -> std::io::Result<TxResult> {
    let prepared = prepare(cfg, sock);
    run_prepared(cfg, prepared, sock, tcp, stop, on_interval)
}

/// Makes the buffers [`run_prepared`] sends from.
pub fn prepare(cfg: &TxConfig, sock: Option<&UdpSocket>) -> TxPrepared {
    let region = match cfg.proto {
        Proto::Udp(_) => cfg.send_size.unwrap_or(PER_ITERATION * cfg.size),
        Proto::Tcp => TCP_WRITE,
    };
    let regions = if cfg.cache_thrash { (thrash_bytes() / region).max(2) } else { 1 };
    let mut buf = vec![0u8; region * regions];
    let mut sums = Vec::new();
    if cfg.verify && matches!(cfg.proto, Proto::Udp(_)) {
        // Datagram by datagram within each region (a region need not be a multiple of size).
        let mut i = 0u64;
        for reg in buf.chunks_mut(region) {
            for d in reg.chunks_mut(cfg.size) {
                wire::stamp(d, i);
                sums.push(wire::fnv1a(d.get(wire::HEADER..).unwrap_or(&[])));
                i += 1;
            }
        }
    } else {
        // Not all zeros: no page or compression trick may make the copy cheaper than real data.
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
    }
    let zc_pool = match (cfg.zerocopy, cfg.proto, sock) {
        (true, Proto::Udp(_), Some(s)) => Some(zc_pool_for(cfg, s, regions)),
        _ => None,
    };
    TxPrepared { buf, sums, region, regions, zc_pool }
}

/// Sends from prepared buffers until `cfg.duration` passes or `stop` is set.
pub fn run_prepared(
    cfg: &TxConfig,
    prepared: TxPrepared,
    sock: Option<&UdpSocket>,
    tcp: Option<TcpStream>,
    stop: &AtomicBool,
    on_interval: &mut dyn FnMut(&Interval),
) -> std::io::Result<TxResult> {
    let TxPrepared { mut buf, sums, region, regions, zc_pool } = prepared;
    let cpu0 = ProcessCpu::thread().unwrap_or_default();
    let start = Instant::now();
    let mut res = TxResult::default();
    let mut ticker = Ticker::new(start);
    let mut seq: u64 = 0;
    let mut r = 0;
    let mut tcp = tcp;
    let c0 = sock.map(|s| s.counters()).unwrap_or_default();
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) || now - start >= cfg.duration {
            break;
        }
        if let Some(rate) = cfg.rate {
            let allowed = rate as f64 * (now - start).as_secs_f64();
            if res.bytes as f64 > allowed {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
        }
        let off = r * region;
        r = (r + 1) % regions;
        match cfg.proto {
            Proto::Udp(_) if cfg.zerocopy => {
                let sock = sock.ok_or_else(|| std::io::Error::other("UDP mode needs a socket"))?;
                let pool = zc_pool.as_ref().ok_or_else(|| std::io::Error::other("zerocopy needs a prepared pool"))?;
                // An iteration sends whole buffers: count what it sent, not PER_ITERATION.
                let first = seq;
                seq = send_zerocopy_iteration(cfg, sock, pool, seq)?;
                res.bytes += (seq - first) * cfg.size as u64;
                res.datagrams += seq - first;
            }
            Proto::Udp(_) => {
                let sock = sock.ok_or_else(|| std::io::Error::other("UDP mode needs a socket"))?;
                let per_region = region.div_ceil(cfg.size);
                if cfg.verify {
                    let first = off / region * per_region;
                    for (i, d) in buf[off..off + region].chunks_mut(cfg.size).enumerate() {
                        wire::restamp_header(d, seq + i as u64, sums[first + i]);
                    }
                }
                let data = &buf[off..off + region];
                // Built per iteration: it borrows the buffer that the next iteration stamps.
                let mut transmits: Vec<Transmit<'_>> =
                    Vec::with_capacity(if cfg.send_size.is_some() { 1 } else { PER_ITERATION });
                if cfg.send_size.is_some() {
                    plan_send_size(&mut transmits, cfg.dst, data, cfg.size);
                } else {
                    let mut limits = SegmentLimits::for_socket(sock);
                    if let Some(m) = cfg.max_segments {
                        limits.max_segments = limits.max_segments.min(m.max(1));
                    }
                    plan_uniform(&mut transmits, cfg.dst, data, cfg.size, limits);
                }
                sock.send(&transmits).map_err(std::io::Error::from)?;
                seq += per_region as u64;
                res.bytes += region as u64;
                res.datagrams += per_region as u64;
            }
            Proto::Tcp => {
                let s = tcp.as_mut().ok_or_else(|| std::io::Error::other("TCP mode needs a stream"))?;
                s.write_all(&buf[off..off + region])?;
                res.bytes += region as u64;
                res.datagrams += 1;
                res.calls += 1;
            }
        }
        if let Some(s) = sock {
            res.calls = s.counters().since(&c0).send_calls;
        }
        if let Some(iv) = ticker.tick(now, res.bytes, res.datagrams, res.calls) {
            on_interval(&iv);
            res.intervals.push(iv);
        }
    }
    if let (Some(s), Some(_)) = (sock, zc_pool.as_ref()) {
        // Every buffer back before the books close (bounded).
        let deadline = Instant::now() + Duration::from_secs(2);
        while s.zerocopy_in_flight() > 0 && Instant::now() < deadline {
            s.reap_completions(Some(Duration::from_millis(20)))?;
        }
    }
    res.secs = start.elapsed().as_secs_f64();
    let cpu = ProcessCpu::thread().unwrap_or_default().diff(&cpu0);
    res.user_secs = cpu.user.as_secs_f64();
    res.sys_secs = cpu.system.as_secs_f64();
    if let Some(s) = sock {
        let c = s.counters().since(&c0);
        res.calls = c.send_calls;
        res.gso_buffers = c.gso_buffers_sent;
        res.gso_fallbacks = c.gso_fallbacks;
        res.zerocopy_sends = c.zerocopy_sends;
        res.zerocopy_completed = c.zerocopy_completed;
        res.zerocopy_copied = c.zerocopy_copied;
        res.zerocopy_turned_off = c.zerocopy_turned_off > 0;
        res.counters = Some(c);
    }
    Ok(res)
}

/// A pool of GSO-sized send buffers, filled once (and stamped for `verify`): enough for the
/// sends in flight, or with cache thrashing as much memory as the copy mode rotates over.
fn zc_pool_for(cfg: &TxConfig, sock: &UdpSocket, regions: usize) -> (ZcPool, usize) {
    let limits = SegmentLimits::for_socket(sock);
    let per =
        limits.max_segments.min(cfg.max_segments.unwrap_or(usize::MAX)).min(max_payload(&cfg.dst) / cfg.size).max(1);
    let buf_size = per * cfg.size;
    // Without cache thrashing, about the copy mode's working set (PER_ITERATION datagrams):
    // buffers in flight wait for completions, which on lo/veth come back within the send.
    let count = if regions > 1 { (thrash_bytes() / buf_size).max(2) } else { (PER_ITERATION / per).max(1) + 2 };
    let pool = ZcPool::new(buf_size, count);
    // Fill every buffer once: take them all, fill, return.
    let mut all = Vec::with_capacity(count);
    while let Some(mut b) = pool.get() {
        for (i, d) in b.chunks_mut(cfg.size).enumerate() {
            if cfg.verify {
                wire::stamp(d, i as u64);
            } else {
                for (j, x) in d.iter_mut().enumerate() {
                    *x = (i * 7 + j * 3 + 1) as u8;
                }
            }
        }
        all.push(b);
    }
    drop(all);
    (pool, per)
}

/// One iteration's worth (at least [`PER_ITERATION`] datagrams, in whole buffers) of zerocopy
/// GSO sends.
fn send_zerocopy_iteration(
    cfg: &TxConfig,
    sock: &UdpSocket,
    pool: &(ZcPool, usize),
    mut seq: u64,
) -> std::io::Result<u64> {
    let (pool, per) = pool;
    // Whole buffers only: every call carries the same size, as the copy rows' calls do.
    let mut left = PER_ITERATION.div_ceil(*per) * *per;
    while left > 0 {
        let n = left.min(*per);
        let mut buf = loop {
            if let Some(b) = pool.get() {
                break b;
            }
            sock.reap_completions(Some(Duration::from_millis(5)))?;
        };
        buf.set_len(n * cfg.size);
        if cfg.verify {
            for (i, d) in buf.chunks_mut(cfg.size).enumerate() {
                let sum = wire::fnv1a(d.get(wire::HEADER..).unwrap_or(&[]));
                wire::restamp_header(d, seq + i as u64, sum);
            }
        }
        let seg = (n > 1).then_some(cfg.size);
        sock.send_zerocopy(cfg.dst, buf, seg).map_err(|e| std::io::Error::other(e.to_string()))?;
        seq += n as u64;
        left -= n;
    }
    // Collect what completed, without waiting.
    sock.reap_completions(None)?;
    Ok(seq)
}

/// Transmits for a buffer of equal-size datagrams to one destination: GSO runs as long as the
/// limits allow, or one transmit per datagram.
pub fn plan_uniform<'a>(
    out: &mut Vec<Transmit<'a>>,
    dst: SocketAddr,
    data: &'a [u8],
    size: usize,
    limits: SegmentLimits,
) {
    let per = if limits.segmenting && size > 0 { limits.max_segments.min(max_payload(&dst) / size).max(1) } else { 1 };
    if size == 0 {
        out.push(Transmit::new(dst, data));
        return;
    }
    for run in data.chunks(per * size) {
        let t = Transmit::new(dst, run);
        out.push(if run.len() > size { t.segmented(size) } else { t });
    }
}

/// The transmit of one `udpgso_bench_tx`-style send: all of `data` (N bytes) in one buffer
/// cut into `seg`-byte segments, `ceil(N / seg)` of them (the last shorter when `seg` does not
/// divide N); a plain datagram when N fits one segment. The caller keeps N within the payload
/// ceiling and the segment count within the kernel's limit (`bench tx` checks both).
pub fn plan_send_size<'a>(out: &mut Vec<Transmit<'a>>, dst: SocketAddr, data: &'a [u8], seg: usize) {
    let t = Transmit::new(dst, data);
    out.push(if seg > 0 && data.len() > seg { t.segmented(seg) } else { t });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticker_cuts_seconds() {
        let t0 = Instant::now();
        let mut t = Ticker::new(t0);
        assert!(t.tick(t0 + Duration::from_millis(500), 10, 1, 1).is_none());
        let iv = t.tick(t0 + Duration::from_millis(1200), 100, 10, 5).unwrap();
        assert_eq!((iv.bytes, iv.datagrams, iv.calls), (100, 10, 5));
        assert!((iv.secs - 1.2).abs() < 1e-9);
        let iv = t.tick(t0 + Duration::from_millis(2300), 150, 12, 6).unwrap();
        assert_eq!((iv.bytes, iv.datagrams, iv.calls), (50, 2, 1));
        assert!((iv.at - 2.3).abs() < 1e-9);
    }

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("2M"), Some(2 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("lots"), None);
        assert_eq!(parse_cache_size(""), None);
        let t = thrash_bytes();
        assert!((THRASH_MIN..=THRASH_MAX).contains(&t));
    }

    #[test]
    fn send_size_plans_exactly_ceil_n_over_seg_segments_per_call() {
        let dst: SocketAddr = "192.0.2.2:1".parse().unwrap();
        // (N, SEG): udpgso_bench_tx's 61,824 = 42 x 1,472; a ragged tail; N = SEG + 1; one
        // segment; the IPv4 ceiling in 1,000-byte segments.
        for (n, seg) in [(61_824, 1472), (61_000, 1472), (1473, 1472), (1000, 1472), (65_507, 1000), (10, 3)] {
            let data = vec![0u8; n];
            let mut out = Vec::new();
            plan_send_size(&mut out, dst, &data, seg);
            assert_eq!(out.len(), 1, "one call's worth: one buffer (N {n}, SEG {seg})");
            assert_eq!(out[0].segments(), n.div_ceil(seg), "N {n}, SEG {seg}");
            assert_eq!(out[0].contents.len(), n, "exactly N bytes");
        }
    }

    #[test]
    fn uniform_plans() {
        let dst: SocketAddr = "192.0.2.2:1".parse().unwrap();
        let data = vec![0u8; 256 * 1472];
        let mut out = Vec::new();
        plan_uniform(&mut out, dst, &data, 1472, SegmentLimits { segmenting: true, max_segments: 128 });
        // 44 × 1472 = 64,768 ≤ 65,507 < 45 × 1472.
        assert_eq!(out.len(), 6);
        assert_eq!(out[0].segments(), 44);
        assert_eq!(out.iter().map(|t| t.segments()).sum::<usize>(), 256);
        out.clear();
        plan_uniform(&mut out, dst, &data, 1472, SegmentLimits { segmenting: false, max_segments: 128 });
        assert_eq!(out.len(), 256);
        assert!(out.iter().all(|t| t.segment_size.is_none()));
        out.clear();
        plan_uniform(&mut out, dst, &[0u8; 100], 10, SegmentLimits { segmenting: true, max_segments: 4 });
        assert_eq!(out.iter().map(|t| t.segments()).collect::<Vec<_>>(), vec![4, 4, 2]);
    }
}
