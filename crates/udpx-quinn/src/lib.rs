//! # udpx-quinn: quinn on udpx against quinn on quinn-udp (`udpx bench quic`)
//!
//! A quinn server sends one file's worth of bytes (1 GB by default) on one stream to a quinn
//! client, over loopback or (root) a veth pair between two namespaces, once per row and round,
//! rounds interleaved:
//!
//! - `quinn-udp`: quinn as shipped (its own `quinn-udp` socket),
//! - `udpx syscalls`: quinn on [`udpx_tokio::UdpxSocket`], system-call backend,
//! - `udpx io_uring`: the same on udpx's io_uring backend (sends as SENDMSG entries, receives
//!   by a multishot RECVMSG into a ring of buffers, copied into quinn's; see `udpx-tokio`).
//!
//! Every row's sockets ask for 4 MiB send and receive buffers (udpx-tokio's default; quinn-udp
//! leaves the system default), so the rows differ in the datapath only.
//!
//! **What is counted.** The server runs on its own thread pinned to one CPU (a current-thread
//! tokio runtime), the client on another; the server's cost is that CPU's busy time (user +
//! system + irq + softirq, `/proc/stat`) from the client's connect to its last byte, so kernel
//! work the server's sends cause on its CPU counts (on loopback that includes delivering its
//! packets to the client's socket), as do io_uring's, which `getrusage` would miss. Per row:
//! CPU-seconds per GB, throughput, the server's datagrams per send call and per receive call
//! (udpx's counters; quinn-udp does not count them; the ring makes no receive calls), quinn's
//! lost packets, the share of the client's datagrams that arrived ECN-marked, and the bytes
//! the client copied out of its io_uring ring per byte received (quinn lends its buffers for
//! one call only).
//!
//! **Targets** ([`QuicBench::checks`]): each udpx row no costlier per byte than quinn-udp
//! (`<= 1.0`); 0.90x is the issue's goal for io_uring, reported whatever it is.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use udpx_lab::cpu::{pin_current_thread, CpuSample, TickRate};
use udpx_lab::env::Environment;
use udpx_lab::judge::{checks_text, verdict_rule, Check};
use udpx_lab::netns::{Profile, Side, TestNet, TestNetConfig};
use udpx_lab::stats::{self, median_run, Spread};
use udpx_tokio::quinn;
use udpx_tokio::quinn::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use udpx_tokio::{tokio, Backend, UdpxSocket};

/// Socket buffers of every row (udpx-tokio's default).
const SOCKET_BUFFER: usize = 4 << 20;

/// Which datapath a row runs quinn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Path {
    /// quinn's own quinn-udp.
    QuinnUdp,
    /// udpx, system calls.
    UdpxSyscall,
    /// udpx, io_uring sends.
    UdpxIoUring,
}

impl Path {
    /// The server thread's name (at most 15 bytes, the kernel's limit).
    fn thread_name(self) -> &'static str {
        match self {
            Path::QuinnUdp => "srv-quinn-udp",
            Path::UdpxSyscall => "srv-udpx-sys",
            Path::UdpxIoUring => "srv-udpx-uring",
        }
    }

    /// The row's label.
    pub fn label(self) -> &'static str {
        match self {
            Path::QuinnUdp => "quinn-udp",
            Path::UdpxSyscall => "udpx syscalls",
            Path::UdpxIoUring => "udpx io_uring",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct QuicBenchConfig {
    /// Bytes sent per row and round.
    pub size: u64,
    /// Rounds (every row once per round).
    pub rounds: usize,
    /// The server's CPU.
    pub server_cpu: usize,
    /// The client's CPU.
    pub client_cpu: usize,
    /// Over a veth pair between two namespaces (root) instead of loopback: the server in one,
    /// the client in the other.
    pub veth: bool,
}

impl Default for QuicBenchConfig {
    /// 1 GB (about a second on loopback: CPU time is read in 10 ms ticks), 3 rounds, server on
    /// CPU 1, client on CPU 0.
    fn default() -> Self {
        QuicBenchConfig { size: 1_000_000_000, rounds: 3, server_cpu: 1, client_cpu: 0, veth: false }
    }
}

/// One transfer.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// Server CPU-seconds per GB sent.
    pub cpu_s_per_gb: f64,
    /// Body throughput seen by the client, Mbit/s.
    pub mbit_per_s: f64,
    /// Packets quinn declared lost on the server's path.
    pub lost_packets: u64,
    /// The server socket's datagrams per send call (udpx rows).
    pub datagrams_per_send: Option<f64>,
    /// The server socket's datagrams per receive call (udpx rows).
    pub datagrams_per_recv: Option<f64>,
    /// What the server's socket said of its backend (udpx rows).
    pub backend: Option<String>,
    /// Share of the datagrams the client received that carried an ECN mark (udpx rows: the
    /// client's adapter counts them).
    pub ecn_marked: Option<f64>,
    /// Bytes the client copied from its io_uring receive ring per byte received (0 on system
    /// calls; udpx rows).
    pub copied_per_byte: Option<f64>,
}

/// A row: its runs and their medians.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The datapath.
    pub path: Path,
    /// Every run, in round order (`None`: failed).
    pub runs: Vec<Option<Run>>,
    /// CPU-seconds per GB over runs.
    pub cost: Spread,
    /// Throughput over runs.
    pub mbit: Spread,
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct QuicBench {
    /// What ran.
    pub config: QuicBenchConfig,
    /// The machine.
    pub env: Environment,
    /// quinn-udp first.
    pub rows: Vec<Row>,
    /// The targets.
    pub checks: Vec<Check>,
}

/// Runs the bench on loopback; `log` gets progress lines.
pub fn run(cfg: &QuicBenchConfig, log: &mut dyn FnMut(&str)) -> Result<QuicBench, String> {
    if cfg.size == 0 || cfg.rounds == 0 {
        return Err("size and rounds must be at least 1".into());
    }
    let cpus = udpx_lab::cpu::online_cpus();
    for c in [cfg.server_cpu, cfg.client_cpu] {
        if !cpus.contains(&c) {
            return Err(format!("CPU {c} is not online (online: {cpus:?})"));
        }
    }
    let rate = TickRate::system().map_err(|e| e.to_string())?;
    let net = if cfg.veth {
        Some(TestNet::setup(&TestNetConfig::new(Profile::Software)).map_err(|e| format!("veth pair: {e}"))?)
    } else {
        None
    };
    let env = match &net {
        Some(n) => {
            Environment::collect(&[(Some(n.ns(Side::Rx)), n.dev(Side::Rx)), (Some(n.ns(Side::Tx)), n.dev(Side::Tx))])
        }
        None => Environment::collect(&[(None, "lo")]),
    };
    let profile = if net.is_some() { "veth" } else { "loopback" };
    let paths = [Path::QuinnUdp, Path::UdpxSyscall, Path::UdpxIoUring];
    let mut runs: Vec<Vec<Option<Run>>> = vec![Vec::new(); paths.len()];
    for round in 0..cfg.rounds {
        for (i, &p) in paths.iter().enumerate() {
            let r = transfer(p, cfg, rate, net.as_ref());
            match &r {
                Ok(r) => log(&format!(
                    "round {}: {}: {:.3} CPU-s/GB, {:.0} Mbit/s, {} lost",
                    round + 1,
                    p.label(),
                    r.cpu_s_per_gb,
                    r.mbit_per_s,
                    r.lost_packets
                )),
                Err(e) => log(&format!("round {}: {}: failed: {e}", round + 1, p.label())),
            }
            runs[i].push(r.ok());
        }
    }
    let rows: Vec<Row> = paths
        .iter()
        .zip(runs)
        .map(|(&path, runs)| {
            let costs: Vec<f64> = runs.iter().flatten().map(|r| r.cpu_s_per_gb).collect();
            let mbits: Vec<f64> = runs.iter().flatten().map(|r| r.mbit_per_s).collect();
            Row { path, cost: Spread::of(&costs), mbit: Spread::of(&mbits), runs }
        })
        .collect();
    // This bench does not measure steal yet (issue 47): every measured run counts as clean.
    let per_run =
        |r: &Row| r.runs.iter().map(|x| stats::Run::from(x.as_ref().map(|x| x.cpu_s_per_gb))).collect::<Vec<_>>();
    let base = per_run(&rows[0]);
    let mut checks = Vec::new();
    for (row, at_most, what) in [
        (&rows[1], 1.0, "udpx syscalls / quinn-udp, server CPU per byte"),
        (&rows[2], 1.0, "udpx io_uring / quinn-udp, server CPU per byte"),
        (&rows[2], 0.9, "udpx io_uring / quinn-udp, server CPU per byte (goal)"),
    ] {
        checks.extend(Check::judge(profile, what, &per_run(row), &base, at_most));
    }
    Ok(QuicBench { config: cfg.clone(), env, rows, checks })
}

/// One transfer of `cfg.size` bytes on `path`: over `net` (the server in its receiving
/// namespace, the client in the other) or on loopback.
fn transfer(path: Path, cfg: &QuicBenchConfig, rate: TickRate, net: Option<&TestNet>) -> Result<Run, String> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).map_err(|e| e.to_string())?;
    let cert: CertificateDer<'static> = ck.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()));
    let server_cfg = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key).map_err(|e| e.to_string())?;
    let mut roots = quinn::rustls::RootCertStore::empty();
    roots.add(cert).map_err(|e| e.to_string())?;
    let client_cfg = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).map_err(|e| e.to_string())?;
    let size = cfg.size;
    let (addr_tx, addr_rx) = mpsc::channel();
    let server_cpu = cfg.server_cpu;
    let server_ip: IpAddr = net.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |n| IpAddr::V4(n.rx_v4));
    let client_ip: IpAddr = net.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |n| IpAddr::V4(n.tx_v4));
    let server_job = move || -> Result<ServerOut, String> {
        pin_current_thread(server_cpu).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(serve(path, server_cfg, size, SocketAddr::new(server_ip, 0), addr_tx))
    };
    // Named by row, so a profile of the server CPU tells the rows apart.
    let server = match net {
        Some(n) => n.ns(Side::Rx).spawn(server_job),
        None => {
            std::thread::Builder::new().name(path.thread_name().into()).spawn(server_job).map_err(|e| e.to_string())?
        }
    };
    let addr: SocketAddr = addr_rx.recv_timeout(Duration::from_secs(10)).map_err(|_| "the server did not start")?;
    let client_cpu = cfg.client_cpu;
    let before = CpuSample::now().map_err(|e| e.to_string())?;
    let client_job = move || -> Result<Fetched, String> {
        pin_current_thread(client_cpu).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(fetch(path, client_cfg, SocketAddr::new(client_ip, 0), addr))
    };
    let client = match net {
        Some(n) => n.ns(Side::Tx).spawn(client_job),
        None => std::thread::spawn(client_job),
    };
    let got = client.join().map_err(|_| "the client panicked")?;
    let after = CpuSample::now().map_err(|e| e.to_string())?;
    let out = server.join().map_err(|_| "the server panicked")??;
    let Fetched { bytes, took, client } = got?;
    if bytes != size {
        return Err(format!("the client got {bytes} of {size} bytes"));
    }
    let busy = after.diff(&before).busy_time(&[server_cpu], rate).as_secs_f64();
    // /proc/stat counts in clock ticks: fewer than 50 of them is too coarse to report.
    if busy < 50.0 / rate.hz() as f64 {
        return Err(format!("the server was busy {busy:.3} s: too short to measure; send more (--size)"));
    }
    Ok(Run {
        cpu_s_per_gb: busy / (size as f64 / 1e9),
        mbit_per_s: size as f64 * 8.0 / took.as_secs_f64() / 1e6,
        lost_packets: out.lost,
        datagrams_per_send: out.counters.map(|c| c.datagrams_sent as f64 / c.send_calls.max(1) as f64),
        // The ring makes no receive calls: nothing to divide by.
        datagrams_per_recv: out
            .counters
            .filter(|c| c.recv_calls > 0)
            .map(|c| c.datagrams_received as f64 / c.recv_calls as f64),
        backend: out.backend,
        ecn_marked: client.map(|(st, c)| st.ecn_marked as f64 / c.datagrams_received.max(1) as f64),
        copied_per_byte: client.map(|(st, c)| st.bytes_copied as f64 / c.bytes_received.max(1) as f64),
    })
}

/// What the client got: bytes, time, and (udpx rows) its adapter's and socket's counters.
struct Fetched {
    bytes: u64,
    took: Duration,
    client: Option<(udpx_tokio::AdapterStats, udpx::CounterSnapshot)>,
}

struct ServerOut {
    lost: u64,
    counters: Option<udpx::CounterSnapshot>,
    backend: Option<String>,
}

fn endpoint(
    path: Path,
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> Result<(quinn::Endpoint, Option<Arc<UdpxSocket>>), String> {
    let backend = match path {
        Path::QuinnUdp => {
            // quinn's own socket, with the socket buffers udpx's rows ask for (4 MiB), so the
            // rows differ in the datapath only.
            let sock = std::net::UdpSocket::bind(addr).map_err(|e| e.to_string())?;
            let r = socket2::SockRef::from(&sock);
            r.set_recv_buffer_size(SOCKET_BUFFER).map_err(|e| e.to_string())?;
            r.set_send_buffer_size(SOCKET_BUFFER).map_err(|e| e.to_string())?;
            let ep =
                quinn::Endpoint::new(quinn::EndpointConfig::default(), server, sock, Arc::new(quinn::TokioRuntime));
            return ep.map(|e| (e, None)).map_err(|e| e.to_string());
        }
        Path::UdpxSyscall => Backend::Syscall,
        Path::UdpxIoUring => Backend::IoUring,
    };
    let (ep, s) =
        udpx_tokio::endpoint(addr, backend, quinn::EndpointConfig::default(), server).map_err(|e| e.to_string())?;
    Ok((ep, Some(s)))
}

async fn serve(
    path: Path,
    cfg: quinn::ServerConfig,
    size: u64,
    bind: SocketAddr,
    addr_tx: mpsc::Sender<SocketAddr>,
) -> Result<ServerOut, String> {
    let (ep, sock) = endpoint(path, bind, Some(cfg))?;
    addr_tx.send(ep.local_addr().map_err(|e| e.to_string())?).map_err(|_| "the bench went away")?;
    let accept = tokio::time::timeout(Duration::from_secs(20), ep.accept()).await.map_err(|_| "no connection")?;
    let conn = accept.ok_or("the endpoint closed")?.await.map_err(|e| e.to_string())?;
    let mut s = conn.open_uni().await.map_err(|e| e.to_string())?;
    let chunk = udpx_lab::pattern(1 << 20, 7);
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n]).await.map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    s.finish().map_err(|e| e.to_string())?;
    let _ = tokio::time::timeout(Duration::from_secs(60), conn.closed()).await;
    let lost = conn.stats().path.lost_packets;
    ep.wait_idle().await;
    Ok(ServerOut {
        lost,
        counters: sock.as_ref().map(|s| s.udpx().counters()),
        backend: sock.as_ref().map(|s| s.backend_note().to_string()),
    })
}

async fn fetch(path: Path, cfg: quinn::ClientConfig, bind: SocketAddr, addr: SocketAddr) -> Result<Fetched, String> {
    let (mut ep, sock) = endpoint(path, bind, None)?;
    ep.set_default_client_config(cfg);
    let start = Instant::now();
    let conn = ep.connect(addr, "localhost").map_err(|e| e.to_string())?.await.map_err(|e| e.to_string())?;
    let mut r = conn.accept_uni().await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), r.read(&mut buf)).await {
            Ok(Ok(Some(n))) => got += n as u64,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err(format!("stalled after {got} bytes")),
        }
    }
    let took = start.elapsed();
    conn.close(0u32.into(), b"done");
    ep.wait_idle().await;
    let client = sock.map(|s| (s.stats(), s.udpx().counters()));
    Ok(Fetched { bytes: got, took, client })
}

impl QuicBench {
    /// The table, the targets and how they are judged.
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "quinn server -> quinn client on {}, {} MB per transfer, server on CPU {}, client on CPU {}, {} \
             interleaved rounds; each row its median run by cost, with the range over runs.\n\n```\n",
            if self.config.veth {
                "a veth pair between two namespaces (tx-udp-segmentation off; the client's receive in its NAPI \
                 thread)"
            } else {
                "loopback (the client's receive processing runs in the server's softirq: counted with the server)"
            },
            self.config.size / 1_000_000,
            self.config.server_cpu,
            self.config.client_cpu,
            self.config.rounds
        );
        s.push_str(&format!(
            "{:<16} {:>9} {:>5} {:>8} {:>5} {:>8} {:>8} {:>6} {:>5} {:>6} {:>8}  backend\n",
            "datapath", "CPU-s/GB", "±", "Mbit/s", "±", "dg/send", "dg/recv", "lost", "ECN", "copied", "vs udp"
        ));
        let base = self.rows.first().map(|r| r.cost.median).unwrap_or(f64::NAN);
        for r in &self.rows {
            let costs: Vec<f64> = r.runs.iter().flatten().map(|x| x.cpu_s_per_gb).collect();
            let m = median_run(&costs).and_then(|i| r.runs.iter().flatten().nth(i));
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
            let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
            s.push_str(&format!(
                "{:<16} {:>9.3} {:>5} {:>8.0} {:>5} {:>8} {:>8} {:>6} {:>5} {:>6} {:>7.2}x  {}\n",
                r.path.label(),
                r.cost.median,
                udpx_lab::judge::pm(r.cost.median, r.cost.min, r.cost.max),
                r.mbit.median,
                udpx_lab::judge::pm(r.mbit.median, r.mbit.min, r.mbit.max),
                f(m.and_then(|x| x.datagrams_per_send)),
                f(m.and_then(|x| x.datagrams_per_recv)),
                m.map_or("-".into(), |x| x.lost_packets.to_string()),
                pct(m.and_then(|x| x.ecn_marked)),
                pct(m.and_then(|x| x.copied_per_byte)),
                r.cost.median / base,
                m.and_then(|x| x.backend.clone()).unwrap_or_else(|| "quinn-udp".into()),
            ));
        }
        s.push_str(
            "(dg/send, dg/recv: the server socket's datagrams per call, '-' where uncounted or, on the ring, no \
             receive calls; ECN: share of the client's datagrams that arrived ECN-marked; copied: bytes the \
             client copied out of its io_uring ring per byte received)\n",
        );
        s.push_str(&checks_text(&self.checks));
        s.push_str("```\n\n");
        s.push_str(&verdict_rule(self.config.rounds));
        s.push_str("\n\n");
        s.push_str(&self.env.to_markdown());
        s
    }
}
