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

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use udpx::{RecvMeta, RecvMode, SendMode, ShardGroup, SocketConfig, Steering, Transmit, UdpSocket, Want};
use udpx_bench::cpu::{online_cpus, pin_current_thread, ProcessCpu};

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
    /// Requests per second per source address at most (excess dropped and counted).
    pub rate_limit: Option<u32>,
    /// CPUs the shard threads are pinned to, round robin (`reuseport-cpu` pins each socket's
    /// thread to its own CPU regardless). `None`: not pinned.
    pub cpus: Option<Vec<usize>>,
}

/// Why a configuration is refused (usage errors: the message says what to change).
pub fn check(cfg: &ServeConfig, allow_oversubscribe: bool) -> Result<(), String> {
    let cpus = online_cpus().len();
    if cfg.threads == 0 {
        return Err("--threads 0: give at least 1 thread".into());
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
    /// Malformed or truncated requests dropped.
    pub malformed: AtomicU64,
    /// Requests over the per-source rate limit, dropped.
    pub rate_limited: AtomicU64,
    /// Receive calls that returned data.
    pub recv_calls: AtomicU64,
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
    /// Malformed requests dropped.
    pub malformed: u64,
    /// Rate-limited requests dropped.
    pub rate_limited: u64,
    /// Receive calls.
    pub recv_calls: u64,
    /// Requests per receive call.
    pub batch: f64,
    /// Kernel drops.
    pub kernel_drops: u64,
    /// Thread CPU seconds.
    pub cpu_secs: f64,
}

impl ShardCounters {
    fn snapshot(&self) -> ShardStats {
        let req = self.requests.load(Relaxed);
        let calls = self.recv_calls.load(Relaxed);
        ShardStats {
            requests: req,
            replies: self.replies.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            rate_limited: self.rate_limited.load(Relaxed),
            recv_calls: calls,
            batch: if calls > 0 { (req + self.malformed.load(Relaxed)) as f64 / calls as f64 } else { 0.0 },
            kernel_drops: self.kernel_drops.load(Relaxed),
            cpu_secs: self.cpu_micros.load(Relaxed) as f64 / 1e6,
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
        .buffers(4 << 20, 4 << 20);
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
    for (sock, cpu) in bound.shards {
        let c = Arc::new(ShardCounters::default());
        counters.push(c.clone());
        let (stop, cfg) = (stop.clone(), cfg.clone());
        threads.push(std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                let _ = pin_current_thread(cpu);
            }
            let t0 = ProcessCpu::thread().unwrap_or_default();
            serve_shard(&sock, &cfg, &stop, &c);
            let t = ProcessCpu::thread().unwrap_or_default().diff(&t0);
            c.cpu_micros.store(t.total().as_micros() as u64, Relaxed);
            c.kernel_drops.store(sock.kernel_drops().unwrap_or(0) as u64, Relaxed);
        }));
    }
    Server { stop, threads, counters, addr, mode: cfg.mode }
}

impl Server {
    /// Counters now (CPU seconds are filled in when the server stops).
    pub fn stats(&self) -> Vec<ShardStats> {
        self.counters.iter().map(|c| c.snapshot()).collect()
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

/// A token bucket per source address.
struct RateLimit {
    per_sec: u32,
    buckets: HashMap<IpAddr, (f64, Instant)>,
}

impl RateLimit {
    fn allow(&mut self, src: IpAddr) -> bool {
        let now = Instant::now();
        let cap = self.per_sec as f64;
        let e = self.buckets.entry(src).or_insert((cap, now));
        e.0 = (e.0 + now.duration_since(e.1).as_secs_f64() * cap).min(cap);
        e.1 = now;
        if self.buckets.len() > 100_000 {
            // Bounded memory under a spoofed-source flood: forget everyone, start over.
            self.buckets.clear();
            return true;
        }
        match self.buckets.get_mut(&src) {
            Some(b) if b.0 >= 1.0 => {
                b.0 -= 1.0;
                true
            }
            _ => false,
        }
    }
}

fn serve_shard(sock: &UdpSocket, cfg: &ServeConfig, stop: &AtomicBool, c: &ShardCounters) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    let n = if cfg.batch { 32 } else { 1 };
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 1 << 16]).collect();
    let mut metas = vec![RecvMeta::default(); n];
    let mut limit = cfg.rate_limit.map(|per_sec| RateLimit { per_sec, buckets: HashMap::new() });
    let mut keep = Vec::with_capacity(n);
    while !stop.load(Relaxed) {
        let got = {
            let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            match sock.recv(&mut slices, &mut metas) {
                Ok(k) => k,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
                Err(_) => continue,
            }
        };
        c.recv_calls.fetch_add(1, Relaxed);
        keep.clear();
        for (i, m) in metas[..got].iter().enumerate() {
            if m.truncated || !proto::is_request(&bufs[i][..m.len]) {
                c.malformed.fetch_add(1, Relaxed);
                continue;
            }
            if let Some(l) = limit.as_mut() {
                if !l.allow(m.addr.ip()) {
                    c.rate_limited.fetch_add(1, Relaxed);
                    continue;
                }
            }
            proto::make_reply(&mut bufs[i][..m.len]);
            keep.push(i);
        }
        c.requests.fetch_add(keep.len() as u64, Relaxed);
        let replies: Vec<Transmit<'_>> = keep
            .iter()
            .map(|&i| {
                let m = &metas[i];
                // The request itself goes back: a reply is never larger than its request.
                Transmit { src_ip: m.dst_ip, ..Transmit::new(m.addr, &bufs[i][..m.len]) }
            })
            .collect();
        let (mut from, mut ok) = (0, 0);
        while from < replies.len() {
            match sock.send(&replies[from..]) {
                Ok(k) => (from, ok) = (from + k, ok + k),
                Err(e) if e.is_would_block() => {
                    (from, ok) = (from + e.sent, ok + e.sent);
                    let _ = sock.wait_writable(Duration::from_millis(10));
                }
                Err(e) => {
                    // Counted by the socket's error counters; skip the one that failed.
                    (from, ok) = (from + e.sent + 1, ok + e.sent);
                }
            }
        }
        c.replies.fetch_add(ok as u64, Relaxed);
    }
}
