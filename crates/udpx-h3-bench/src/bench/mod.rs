//! `udpx bench h3`: the Cloudflare post's table on this machine. One file (100 MB by
//! default) is downloaded once per row and round: from [`serve`] in each I/O mode
//! by ngtcp2's `gtlsclient` and by [`get`], and from nginx (HTTPS over TCP, TLS 1.3,
//! the same certificate) by curl. Rounds are interleaved (every row once, then again); each
//! row reports its median run by cost, whole, with the range over runs.
//!
//! **What is counted** (equal footing, issue 28). Over veth (root): the server (udpx's shard
//! threads, started from a thread pinned there, or nginx under `taskset`) on the last CPU,
//! every client on the first; threaded NAPI on both ends of the pair, each pinned to its
//! side's CPU, so receive work, TCP's ACK-clocked sends included, lands on the side that
//! receives. The server's cost is its CPU's busy time from the client's start to its exit
//! ([`udpx_lab::cpu::CpuDelta::busy_time`]: the tick-sampled work or the window less the
//! exactly measured idle, the larger), whoever ran there: for TCP the kernel's softirq work
//! outside nginx's task is counted as quiche's work on the shard thread is. The server's own
//! tasks' share (`schedstat`: the shard threads, nginx's process) is printed beside it. Two
//! profiles ([`Profile`]), run one after the other: `software`, where the server's device
//! offloads neither TCP nor UDP segmentation (the GSO layer splits both in the server's
//! context), and `offload`, where it offloads both (a TSO packet and a UDP GSO run cross the
//! pair whole). On loopback the client's receive work runs in the sender's softirq and is
//! counted with the server, for nginx too. Throughput is the client's: `get`'s own timer, or
//! the wall time from starting `gtlsclient` or curl to its exit (process start and handshake
//! included).
//!
//! **Rows.** `sendmsg`, `sendmmsg`, `gso` and `gso-mmsg` receive without GRO; `gso +GRO` is
//! `gso` with UDP_GRO on: the post's last step. Per client, so that a client's own pace
//! (gtlsclient acknowledges differently from quiche) is compared only with itself. A peer
//! that is not installed leaves its rows out, named in [`H3Bench::left_out`].
//!
//! **Steal** ([`udpx_lab::steal`]). Each run records the hypervisor's steal from the server's
//! and the client's CPUs over its download; a run over 2 % is marked and counts in no median,
//! range or verdict, and extra rounds (at most as many again) make it up. The Chromium pair
//! runs its own number of rounds ([`H3BenchConfig::chromium_repeat`], 5 by default),
//! interleaved with the others.
//!
//! **Targets** ([`judge`]): `gso +GRO` at most 0.5x of `sendmsg` in server CPU per byte, per
//! client; the best udpx row at most 1.0x nginx's in the software profile, 1.2x in the offload
//! profile, 2x on loopback ([`nginx_target`]; the ratio is reported whatever it is).

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Serialize;
use udpx_lab::cpu::{CpuSample, TickRate};
use udpx_lab::env::Environment;
use udpx_lab::judge::Check;
use udpx_lab::netns::{Namespace, Napi, Profile, Side, TestNet};
use udpx_lab::stats::{another_round, figures, Kept, Run};
use udpx_lab::steal::{Steal, WithSteal};
use udpx_quic::IoMode;

use udpx_h3::{get, serve, GetConfig, ServeConfig, Tls};

mod browser;
pub mod burst;
pub mod flood;
mod peers;
mod process;
pub mod restart;
mod rows;
pub mod scale;
pub mod tail;

use peers::{equal_footing, gtlsclient, nginx_run, quinn_run};
pub(crate) use peers::{receive_note, receive_on_own_cpus};
use udpx_lab::task::{cpu_secs, threads_named};

/// The file's name under the served directory.
const FILE: &str = "file";
/// The nginx row's server column.
const NGINX: &str = "nginx https/tcp";
/// The quinn row's server column.
const QUINN: &str = "quinn h3";

mod report;

pub use report::{judge, table};

/// The external programs, found in `PATH` (or given). `None`: not installed, rows left out.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Programs {
    /// ngtcp2's HTTP/3 client (Debian `ngtcp2-client`).
    pub gtlsclient: Option<PathBuf>,
    /// nginx (Debian `nginx`).
    pub nginx: Option<PathBuf>,
    /// curl (Debian `curl`).
    pub curl: Option<PathBuf>,
    /// The `udpx` binary, which runs quinn with h3 (`udpx h3 quinn-serve`) as a second
    /// HTTP/3 server: set by `udpx bench h3` to itself; `None` leaves that row out.
    pub udpx: Option<PathBuf>,
    /// Chromium (Debian `chromium`): the browser rows (`bench/browser.rs`).
    pub chromium: Option<PathBuf>,
    /// The independent client (`udpx-quicgo-load`, built by `scripts/setup.sh`): quic-go's
    /// HTTP/3 client for udpx, Go's HTTP/2 client for nginx.
    pub independent: Option<PathBuf>,
}

impl Programs {
    /// Each program looked up in the directories of `PATH` only (Debian puts nginx in
    /// `/usr/sbin`, which root's `PATH` holds), so a `PATH` without one leaves its rows out;
    /// the independent client, ours, also where `scripts/setup.sh` puts it
    /// ([`crate::independent::find`]).
    pub fn from_path() -> Programs {
        Programs {
            gtlsclient: find_in_path("gtlsclient"),
            nginx: find_in_path("nginx"),
            curl: find_in_path("curl"),
            udpx: None,
            chromium: udpx_lab::browser::find(),
            independent: crate::independent::find(),
        }
    }
}

/// `program` in a directory of `PATH` (the lab's lookup).
pub use udpx_lab::netns::find_in_path;

/// Bench settings.
#[derive(Debug, Clone, Serialize)]
pub struct H3BenchConfig {
    /// Bytes of the file downloaded per row and round.
    pub size: u64,
    /// Rounds, interleaved; the table shows each row's median run.
    pub repeat: usize,
    /// Rounds of the Chromium pair (udpx and nginx serving Chromium), interleaved with the
    /// others: its verdict needs at least 5 (`--chromium-repeat`).
    pub chromium_repeat: usize,
    /// Over a veth pair between two namespaces (root) rather than loopback.
    pub veth: bool,
    /// Over veth: who segments the server's sends. `Software`: neither TCP nor UDP offload
    /// on the server's device (TSO and `tx-udp-segmentation` off: the GSO layer splits both
    /// in the server's context); `Offload`: both on (a TSO super-packet and a UDP GSO run
    /// cross the pair whole). Equal footing either way. (In the JSON: [`H3Bench::profile`].)
    #[serde(skip)]
    pub profile: Profile,
    /// How the udpx servers send (`--cc`, `--burst`, `--coalesce`, `--defer-flush`,
    /// `--ack-defer`, `--zerocopy`; `udpx h3 serve`'s defaults unless given).
    #[serde(flatten)]
    pub host: udpx_h3::Tuning,
    /// The block cache of the `+cache` rows (the pairs of the clients users bring with udpx's
    /// cache on, `--cache-size`); 0: no such rows.
    pub cache_size: usize,
    /// Over veth: where each side's receive work runs (`--napi`, softirq by default).
    #[serde(serialize_with = "scale::as_text")]
    pub napi: Napi,
    /// The peers to run (recorded in the JSON: which binaries ran).
    pub programs: Programs,
}

impl H3BenchConfig {
    /// 100 MB, 3 rounds, loopback, the peers in `PATH`.
    pub fn new() -> H3BenchConfig {
        H3BenchConfig {
            size: 100_000_000,
            repeat: 3,
            chromium_repeat: 5,
            cache_size: 256 << 20,
            veth: false,
            profile: Profile::Software,
            host: udpx_h3::Tuning::default(),
            napi: Napi::Softirq,
            programs: Programs::from_path(),
        }
    }

    /// The longest one download may take before it is stopped and the run counted failed:
    /// 30 s plus 1 s per 2 MB (1 s per 16 Mbit/s).
    pub fn deadline(&self) -> Duration {
        Duration::from_secs(30) + Duration::from_secs_f64(self.size as f64 / 2e6)
    }
}

impl Default for H3BenchConfig {
    fn default() -> Self {
        H3BenchConfig::new()
    }
}

/// Which server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// `udpx h3 serve` in this process.
    Udpx {
        /// How its packets leave.
        io: IoMode,
        /// Whether it receives with UDP_GRO.
        gro: bool,
        /// Whether its block cache is on ([`H3BenchConfig::cache_size`]).
        cache: bool,
    },
    /// nginx, HTTPS over TCP with TLS 1.3.
    Nginx,
    /// quinn with h3 (`udpx h3 quinn-serve`, a child process): the second HTTP/3 server.
    Quinn,
}

/// Which client downloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// ngtcp2's `gtlsclient`, a child process.
    Gtlsclient,
    /// [`get`] in this process (a thread of its own; not counted).
    UdpxGet,
    /// curl, a child process (HTTP/1.1 over TLS 1.3).
    Curl,
    /// Headless Chromium, a child process (`bench/browser.rs`): HTTP/3 from udpx, HTTP/2 from nginx.
    Chromium,
    /// The independent client (`udpx-quicgo-load --get`, a child process): quic-go's HTTP/3
    /// client from udpx, Go's HTTP/2 client from nginx; their acknowledgement policies their own.
    Independent,
}

impl ClientKind {
    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Gtlsclient => "gtlsclient",
            ClientKind::UdpxGet => "udpx h3 get",
            ClientKind::Curl => "curl",
            ClientKind::Chromium => "chromium",
            ClientKind::Independent => "quic-go / Go h2",
        }
    }
}

/// The server's name for a row.
fn server_name(s: ServerKind) -> String {
    match s {
        ServerKind::Udpx { io, gro, cache } => {
            format!("{}{}{}", io.name(), if gro { " +GRO" } else { "" }, if cache { " +cache" } else { "" })
        }
        ServerKind::Nginx => NGINX.to_string(),
        ServerKind::Quinn => QUINN.to_string(),
    }
}

/// The udpx server's settings of the rows, in table order: the four modes without GRO, then
/// `gso` with GRO.
pub fn udpx_servers() -> Vec<ServerKind> {
    let mut v: Vec<ServerKind> =
        IoMode::ALL.iter().map(|&io| ServerKind::Udpx { io, gro: false, cache: false }).collect();
    v.push(ServerKind::Udpx { io: IoMode::Gso, gro: true, cache: false });
    v
}

/// One download.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct H3Run {
    /// Server CPU seconds (the busy time of its CPU) per 10^9 body bytes.
    pub cpu_s_per_gb: f64,
    /// Server CPU seconds over the download: the busy time of the server's CPU.
    pub server_cpu_s: f64,
    /// Of it, the server's own tasks' time on CPU (`schedstat`): the rest is receive work in
    /// the server's NAPI thread, softirq, and whatever else ran there.
    pub server_task_s: f64,
    /// Body bytes the client received.
    pub bytes: u64,
    /// The client's download time.
    pub seconds: f64,
    /// Body throughput, Mbit/s.
    pub mbit_per_s: f64,
    /// Send system calls of the server (udpx).
    pub send_calls: Option<u64>,
    /// Datagrams per send call (udpx).
    pub packets_per_call: Option<f64>,
    /// Packets quiche declared lost (udpx).
    pub lost_packets: Option<u64>,
    /// Receive buffers that held more than one datagram (udpx, GRO).
    pub gro_buffers: Option<u64>,
    /// Messages that went with MSG_ZEROCOPY, of them those the kernel copied anyway, and
    /// whether zerocopy was turned off for that (udpx, `--zerocopy`).
    pub zerocopy: Option<ZerocopyUse>,
    /// Passes over a body byte (udpx).
    pub passes: Option<Passes>,
    /// The server's loop turns and send calls per MB of body (udpx): what a client's
    /// acknowledgement policy costs in wake-ups and system calls (issue 47 item 6).
    pub turns_per_mb: Option<f64>,
    pub send_calls_per_mb: Option<f64>,
    /// The block cache (udpx `+cache` rows).
    pub cache: Option<CacheUse>,
    /// The hypervisor's steal from the server's and the client's CPUs over the download
    /// (`steal_s`, `steal_share`, `stolen`).
    #[serde(flatten)]
    pub steal: Steal,
}

impl WithSteal for H3Run {
    fn steal(&self) -> &Steal {
        &self.steal
    }
}

/// `n` per 10^6 body bytes, when any were sent.
fn per_mb(n: u64, body: u64) -> Option<f64> {
    (body > 0).then(|| n as f64 / (body as f64 / 1e6))
}

/// The passes over a body byte in one udpx run, each per body byte the server sent: read
/// from files (into blocks or the cache), copied into packets before the seal (quiche's
/// count: since patch 0010 a packet's stream bytes are sealed straight from the response's
/// buffers, and copied only where they lie in more pieces than a seal takes), sealed (every
/// packet byte: headers, acknowledgements and retransmissions included). The kernel's copy
/// into its buffers is one more (none for zerocopy sends).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Passes {
    pub read: f64,
    pub copied: f64,
    pub sealed: f64,
}

impl Passes {
    fn of(c: &udpx_h3::server::ServeCounters) -> Option<Passes> {
        let body = c.http.body_bytes as f64;
        (body > 0.0).then(|| Passes {
            read: c.http.file_bytes_read as f64 / body,
            copied: c.quic.stream_bytes_copied as f64 / body,
            sealed: c.quic.bytes_sent as f64 / body,
        })
    }
}

/// The block cache in one `+cache` run: blocks found over blocks asked for, and the bytes of
/// blocks alive at the end (what the cache costs in memory).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CacheUse {
    pub hit_ratio: f64,
    pub held_mib: f64,
}

/// What zerocopy did in one udpx run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ZerocopyUse {
    /// Messages sent with MSG_ZEROCOPY.
    pub sends: u64,
    /// Their completions that said the kernel copied.
    pub copied: u64,
    /// Zerocopy was turned off (`auto`: the kernel kept copying).
    pub turned_off: bool,
}

/// One row: its median run (by cost), whole, and every run.
#[derive(Debug, Clone, Serialize)]
pub struct H3Row {
    /// Server column.
    pub server: String,
    /// Client column.
    pub client: String,
    /// The median run (by `cpu_s_per_gb`); `None` if every run failed.
    pub median: Option<H3Run>,
    /// Which run that is.
    pub median_run: Option<usize>,
    /// Every run in round order, `None` where it failed.
    pub runs: Vec<Option<H3Run>>,
    /// The first failure, if any run failed.
    pub error: Option<String>,
    /// Runs planned, clean, stolen and failed.
    pub kept: Kept,
}

impl H3Row {
    /// `server / client`.
    pub fn label(&self) -> String {
        format!("{} / {}", self.server, self.client)
    }

    fn costs(&self) -> Vec<Run> {
        figures(&self.runs, |r| r.cpu_s_per_gb)
    }

    fn is_udpx(&self) -> bool {
        self.server != NGINX && self.server != QUINN
    }

    fn is_cached(&self) -> bool {
        self.server.ends_with("+cache")
    }
}

/// A row not run, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LeftOut {
    /// Which rows.
    pub rows: String,
    /// Why.
    pub why: String,
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct H3Bench {
    /// Settings.
    pub config: H3BenchConfig,
    /// `software`, `offload` (veth) or `loopback`.
    pub profile: String,
    /// The path the packets took, in words.
    pub path: String,
    /// The rows, in table order.
    pub rows: Vec<H3Row>,
    /// Rows not run (a peer missing).
    pub left_out: Vec<LeftOut>,
    /// The targets, judged.
    pub checks: Vec<Check>,
    /// Kernel, CPU, devices.
    pub environment: Environment,
    /// Built with debug assertions (quiche's own consistency checks run on every packet): its
    /// CPU figures are not the server's.
    pub debug_build: bool,
}

/// The temporary directory of a bench: the file, the certificate, nginx's files; removed on
/// drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, String> {
        let mut nonce = [0u8; 8];
        udpx_quic::cid::random_bytes(&mut nonce).map_err(|e| e.to_string())?;
        let d = std::env::temp_dir().join(format!(
            "udpx-bench-h3-{}-{:016x}",
            std::process::id(),
            u64::from_ne_bytes(nonce)
        ));
        std::fs::create_dir_all(d.join("www")).map_err(|e| format!("{}: {e}", d.display()))?;
        Ok(Scratch(d))
    }
}

impl Drop for Scratch {
    /// Removes the directory, unless `UDPX_BENCH_KEEP` is set (its servers' logs, to read
    /// what happened in a row): then says where it is.
    fn drop(&mut self) {
        if std::env::var_os("UDPX_BENCH_KEEP").is_some() {
            eprintln!("udpx bench h3: kept {} (UDPX_BENCH_KEEP)", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the two ends are.
struct Place<'a> {
    net: Option<&'a TestNet>,
    server_ip: IpAddr,
    /// The server's CPU (the last online one) and the client's (the first).
    server_cpu: usize,
    client_cpu: usize,
}

impl Place<'_> {
    fn client_ns(&self) -> Option<&Namespace> {
        self.net.map(|n| n.ns(Side::Tx))
    }

    fn server_ns(&self) -> Option<&Namespace> {
        self.net.map(|n| n.ns(Side::Rx))
    }

    /// `taskset -c CPU program` in namespace `ns` (or here); without `taskset` in `PATH`
    /// (util-linux), the program unpinned.
    fn command(&self, ns: Option<&Namespace>, cpu: usize, program: &Path) -> Command {
        let Some(taskset) = find_in_path("taskset") else {
            return match ns {
                Some(ns) => ns.command(&program.to_string_lossy()),
                None => Command::new(program),
            };
        };
        let mut c = match ns {
            Some(ns) => ns.command(&taskset.to_string_lossy()),
            None => Command::new(taskset),
        };
        c.args(["-c", &cpu.to_string()]).arg(program);
        c
    }

    /// Runs `f` on a thread pinned to `cpu` in namespace `ns` (or here); threads it starts
    /// inherit the pinning.
    fn run_on<T: Send + 'static>(
        &self,
        ns: Option<&Namespace>,
        cpu: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        let g = move || {
            let _ = udpx_lab::cpu::pin_current_thread(cpu);
            f()
        };
        match ns {
            Some(ns) => ns.try_run(g).map_err(|e| e.to_string()),
            None => std::thread::spawn(g).join().map_err(|_| "a bench thread panicked".to_string()),
        }
    }
}

/// The rows to run and those left out.
fn plan(p: &Programs, cache: bool) -> (Vec<(ServerKind, ClientKind)>, Vec<LeftOut>) {
    let mut rows = Vec::new();
    let mut left = Vec::new();
    for client in [ClientKind::Gtlsclient, ClientKind::UdpxGet] {
        if client == ClientKind::Gtlsclient && p.gtlsclient.is_none() {
            left.push(LeftOut {
                rows: "every udpx row with gtlsclient".into(),
                why: "gtlsclient not found in PATH (Debian package ngtcp2-client; scripts/setup.sh installs it)".into(),
            });
            continue;
        }
        rows.extend(udpx_servers().into_iter().map(|s| (s, client)));
    }
    let missing: Vec<&str> =
        [("nginx", &p.nginx), ("curl", &p.curl)].iter().filter(|(_, p)| p.is_none()).map(|(n, _)| *n).collect();
    if p.udpx.is_some() {
        rows.push((ServerKind::Quinn, ClientKind::UdpxGet));
    } else {
        left.push(LeftOut {
            rows: format!("{QUINN} / udpx h3 get"),
            why: "no udpx binary to run `udpx h3 quinn-serve` (`udpx bench h3` gives itself)".into(),
        });
    }
    if missing.is_empty() {
        rows.push((ServerKind::Nginx, ClientKind::Curl));
    } else {
        left.push(LeftOut {
            rows: "nginx https/tcp / curl".into(),
            why: format!(
                "{} not found in PATH (Debian packages nginx, curl; scripts/setup.sh installs them)",
                missing.join(" and ")
            ),
        });
    }
    // The clients users bring, each a pair: udpx over HTTP/3, nginx over HTTP/2.
    let pairs = [
        (
            &p.chromium,
            ClientKind::Chromium,
            "the chromium rows",
            "chromium not found in PATH (Debian package chromium; scripts/setup.sh installs it)".to_string(),
        ),
        (
            &p.independent,
            ClientKind::Independent,
            "the independent client's rows",
            format!("{} not found (scripts/setup.sh builds it from peers/quicgo-load)", crate::independent::PROGRAM),
        ),
    ];
    for (program, client, what, why) in pairs {
        if program.is_none() {
            left.push(LeftOut { rows: what.into(), why });
            continue;
        }
        rows.push((ServerKind::Udpx { io: IoMode::GsoMmsg, gro: true, cache: false }, client));
        if cache {
            rows.push((ServerKind::Udpx { io: IoMode::GsoMmsg, gro: true, cache: true }, client));
        }
        if p.nginx.is_some() {
            rows.push((ServerKind::Nginx, client));
        }
    }
    (rows, left)
}

/// Runs the bench. `progress` gets a line per run.
pub fn run(cfg: &H3BenchConfig, progress: &mut dyn FnMut(&str)) -> Result<H3Bench, String> {
    if cfg.size == 0 || cfg.repeat == 0 || cfg.chromium_repeat == 0 {
        return Err("the file size and the rounds must be at least 1".into());
    }
    let scratch = Scratch::new()?;
    let file = scratch.0.join("www").join(FILE);
    write_file(&file, cfg.size).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let (cert, key) = (scratch.0.join("cert.pem"), scratch.0.join("key.pem"));
    let pin = write_cert(&cert, &key)?;
    browser::write_page(&scratch.0.join("www"))?;
    let cpus = udpx_lab::cpu::online_cpus();
    let (client_cpu, server_cpu) = (cpus[0], *cpus.last().unwrap_or(&0));
    let net = if cfg.veth { Some(equal_footing(cfg.profile, cfg.napi, server_cpu, client_cpu)?) } else { None };
    let place = Place {
        net: net.as_ref(),
        server_ip: net.as_ref().map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |n| IpAddr::V4(n.rx_v4)),
        server_cpu,
        client_cpu,
    };
    let profile = if cfg.veth { cfg.profile.as_str() } else { "loopback" };
    let path = match &net {
        Some(n) => format!(
            "{profile} profile: veth pair between two namespaces ({} -> {}; {}); {}; servers pinned to CPU \
             {server_cpu}, clients to CPU {client_cpu}; server CPU = CPU {server_cpu}'s busy time, its own tasks' share \
             beside it",
            n.rx_dev,
            n.tx_dev,
            match cfg.profile {
                Profile::Software =>
                    "TSO and tx-udp-segmentation off on the server's device: TCP and UDP GSO both \
                                      split in the server's context",
                Profile::Offload => "TSO and tx-udp-segmentation on: TCP segments and UDP GSO runs cross whole",
            },
            receive_note(cfg.napi)
        ),
        None => format!(
            "LOOPBACK: the client's receive processing runs in the sender's softirq on CPU {server_cpu} and is \
             counted with the server (for nginx too)"
        ),
    };
    let path = format!(
        "{path}; udpx under --cc {}{}{}, --zerocopy {}; each udpx connection writes per turn {}",
        cfg.host.cc,
        if cfg.host.defer_flush { "" } else { " with --defer-flush off" },
        if cfg.host.coalesce.is_zero() {
            String::new()
        } else {
            format!(", --coalesce {}", cfg.host.coalesce.as_micros())
        } + &format!(", --ack-defer {}", cfg.host.ack_defer.as_micros()),
        cfg.host.zerocopy,
        match cfg.host.burst() {
            udpx_quic::Burst::Quantum => "its send_quantum() (--burst quantum)",
            udpx_quic::Burst::Window => "what its window allows, at most 64 packets (--burst window)",
        }
    );
    let (plan, left_out) = plan(&cfg.programs, cfg.cache_size > 0);
    let rate = TickRate::system().map_err(|e| e.to_string())?;
    let planned: Vec<usize> = plan.iter().map(|&(_, c)| cfg.rounds_of(c)).collect();
    let mut runs: Vec<Vec<Result<H3Run, String>>> = vec![Vec::new(); plan.len()];
    for round in 0.. {
        let due = due_rows(&planned, &runs);
        if !due.contains(&true) {
            break;
        }
        for (i, &(server, client)) in plan.iter().enumerate().filter(|(i, _)| due[*i]) {
            let label = format!("{} / {}", server_name(server), client.name());
            let r = one_run(cfg, &place, &scratch.0, (&cert, &key, &pin), server, client, rate);
            let of = planned[i];
            progress(&match &r {
                Ok(x) => format!(
                    "round {}/{of}: {label}: {:.3} CPU-s/GB, {:.0} Mbit/s{}",
                    round + 1,
                    x.cpu_s_per_gb,
                    x.mbit_per_s,
                    if x.steal.stolen { format!(", STOLEN {} (left out)", x.steal.pct()) } else { String::new() }
                ),
                Err(e) => format!("round {}/{of}: {label}: failed: {e}", round + 1),
            });
            runs[i].push(r);
        }
    }
    let rows: Vec<H3Row> = plan
        .iter()
        .zip(runs)
        .zip(&planned)
        .map(|((&(s, c), r), &n)| merge(server_name(s), c.name().to_string(), r, n))
        .collect();
    let environment = match &net {
        Some(n) => Environment::collect(&[(Some(&n.rx), &n.rx_dev), (Some(&n.tx), &n.tx_dev)]),
        None => Environment::collect(&[(None, "lo")]),
    };
    let checks = judge(&rows, nginx_target(cfg));
    let debug_build = cfg!(debug_assertions);
    Ok(H3Bench { config: cfg.clone(), profile: profile.into(), path, rows, left_out, checks, environment, debug_build })
}

impl H3BenchConfig {
    /// The rounds planned for a row of `client`'s: [`H3BenchConfig::chromium_repeat`] for the
    /// Chromium pair, [`H3BenchConfig::repeat`] for the others.
    pub fn rounds_of(&self, client: ClientKind) -> usize {
        if client == ClientKind::Chromium {
            self.chromium_repeat
        } else {
            self.repeat
        }
    }
}

/// Which rows run in the next round: the rows of each number of planned rounds (the Chromium
/// pair's, the others') run together, so their runs stay paired round by round, while
/// [`another_round`] says so for them.
fn due_rows(planned: &[usize], runs: &[Vec<Result<H3Run, String>>]) -> Vec<bool> {
    let kept: Vec<Kept> = runs
        .iter()
        .zip(planned)
        .map(|(r, &n)| {
            let ok: Vec<Option<H3Run>> = r.iter().map(|x| x.as_ref().ok().copied()).collect();
            Kept::of(&figures(&ok, |x| x.cpu_s_per_gb), n)
        })
        .collect();
    (0..planned.len())
        .map(|i| {
            let group = (0..planned.len()).filter(|&j| planned[j] == planned[i]).map(|j| kept[j]);
            another_round(planned[i], runs[i].len(), group)
        })
        .collect()
}

/// A row from its runs: the median clean run by cost, every run beside it, the first error;
/// `planned`: its rounds before any extra one.
fn merge(server: String, client: String, runs: Vec<Result<H3Run, String>>, planned: usize) -> H3Row {
    let error = runs.iter().find_map(|r| r.as_ref().err().cloned());
    let runs: Vec<Option<H3Run>> = runs.into_iter().map(Result::ok).collect();
    let kept = Kept::of(&figures(&runs, |r| r.cpu_s_per_gb), planned);
    let median_run = kept.median_run;
    H3Row { server, client, median: median_run.and_then(|i| runs[i]), median_run, runs, error, kept }
}

/// The best udpx row's CPU per byte over nginx's, at most (issue 28): 1.0 where both
/// segment in software, 1.2 where neither does (QUIC pays per packet what TCP pays per
/// super-packet); on loopback the old 2.0.
pub fn nginx_target(cfg: &H3BenchConfig) -> f64 {
    match (cfg.veth, cfg.profile) {
        (false, _) => 2.0,
        (true, Profile::Software) => 1.0,
        (true, Profile::Offload) => 1.2,
    }
}

/// Writes `size` bytes of a fixed pseudo-random sequence (xorshift64: nothing compresses it).
fn write_file(path: &Path, size: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut left = size;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        for c in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
}

/// A self-signed certificate for both servers (the clients do not verify it).
fn write_cert(cert: &Path, key: &Path) -> Result<String, String> {
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    let ck = rcgen::generate_simple_self_signed(names).map_err(|e| format!("generating a certificate: {e}"))?;
    std::fs::write(cert, ck.cert.pem()).map_err(|e| format!("{}: {e}", cert.display()))?;
    std::fs::write(key, ck.key_pair.serialize_pem()).map_err(|e| format!("{}: {e}", key.display()))?;
    // Its SPKI pin (base64 of the SHA-256 of its SubjectPublicKeyInfo), as Chromium takes it.
    let spki = ck.key_pair.public_key_der();
    Ok(base64::engine::general_purpose::STANDARD.encode(ring::digest::digest(&ring::digest::SHA256, &spki)))
}

/// One download of one row.
fn one_run(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    (cert, key, pin): (&Path, &Path, &str),
    server: ServerKind,
    client: ClientKind,
    rate: TickRate,
) -> Result<H3Run, String> {
    match server {
        ServerKind::Udpx { io, gro, cache } => {
            udpx_run(cfg, place, dir, (cert, key, pin), (io, gro, cache), client, rate)
        }
        ServerKind::Nginx => nginx_run(cfg, place, dir, (cert, key, pin), client, rate),
        ServerKind::Quinn => quinn_run(cfg, place, dir, (cert, key), rate),
    }
}

#[allow(clippy::too_many_arguments)]
fn udpx_run(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    (cert, key, pin): (&Path, &Path, &str),
    (io, gro, cache): (IoMode, bool, bool),
    client: ClientKind,
    rate: TickRate,
) -> Result<H3Run, String> {
    let mut sc = ServeConfig::new(SocketAddr::new(place.server_ip, 0));
    sc.cache_size = if cache { cfg.cache_size } else { 0 };
    sc.tls = Tls::Files { cert: cert.to_path_buf(), key: key.to_path_buf() };
    cfg.host.apply(&mut sc);
    (sc.quic.io, sc.quic.gro) = (io, gro);
    let before = threads_named("udpx-quic-");
    let shards = sc.quic.shards;
    let www = dir.join("www");
    // Started from a thread pinned to the server's CPU: the shard threads inherit it.
    let server = place
        .run_on(place.server_ns(), place.server_cpu, move || serve(&www, &sc))?
        .map_err(|e| format!("udpx server: {e}"))?;
    // A shard thread names itself when it starts, which may be just after `serve` returns.
    let named = Instant::now();
    let threads = loop {
        let t: Vec<u32> = threads_named("udpx-quic-").into_iter().filter(|t| !before.contains(t)).collect();
        if t.len() >= shards || named.elapsed() > Duration::from_secs(2) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    if threads.len() != shards {
        let _ = server.stop();
        return Err(format!("{} server threads found in /proc/self/task, {shards} expected", threads.len()));
    }
    let tasks: Vec<String> = threads.iter().map(|t| format!("/proc/self/task/{t}")).collect();
    let addr = server.local_addr();
    let url = format!("https://{addr}/{FILE}");
    let meter = ServerMeter::start(tasks, place, rate);
    let got = match client {
        ClientKind::Gtlsclient => gtlsclient(cfg, place, dir, addr, &url),
        ClientKind::UdpxGet => {
            let u = url.clone();
            let f = move || get(&u, None, &GetConfig::default()).map(|r| (r.bytes, r.seconds));
            place.run_on(place.client_ns(), place.client_cpu, f)?.map_err(|e| format!("udpx h3 get: {e}"))
        }
        ClientKind::Curl => Err("curl is not an HTTP/3 client here".into()),
        ClientKind::Chromium => browser::fetch(cfg, place, dir, addr, true, pin).map(|f| (f.bytes, f.seconds)),
        ClientKind::Independent => peers::independent(cfg, place, addr, crate::independent::Proto::H3),
    };
    let cost = meter.stop();
    let counters = server.stop().map_err(|e| format!("udpx server: {e}"))?;
    let (bytes, seconds) = got?;
    // Chromium's page and its fetches: the file FETCHES times, the page once (and maybe a
    // favicon, 404).
    let (files, extra) = if client == ClientKind::Chromium { (browser::FETCHES, 1) } else { (1, 0) };
    let body_ok = counters.http.body_bytes >= files * cfg.size && counters.http.body_bytes < (files + 1) * cfg.size;
    if bytes != files * cfg.size || counters.http.ok != files + extra || !body_ok {
        return Err(format!(
            "{bytes} bytes received, {} sent in {} responses; the file has {}",
            counters.http.body_bytes, counters.http.ok, cfg.size
        ));
    }
    let Some(cost) = cost else {
        return Err("the server's threads (/proc/self/task) or /proc/stat could not be read".into());
    };
    let q = &counters.quic;
    Ok(H3Run {
        send_calls: Some(q.send_calls),
        packets_per_call: Some(q.packets_per_call),
        lost_packets: Some(q.lost_packets),
        gro_buffers: Some(q.gro_buffers),
        zerocopy: Some(ZerocopyUse {
            sends: q.zerocopy_sends,
            copied: q.zerocopy_copied,
            turned_off: q.zerocopy_turned_off > 0,
        }),
        passes: Passes::of(&counters),
        turns_per_mb: per_mb(q.turns, counters.http.body_bytes),
        send_calls_per_mb: per_mb(q.send_calls, counters.http.body_bytes),
        cache: counters.cache.map(|k| CacheUse {
            hit_ratio: k.hits as f64 / (k.hits + k.misses + k.uncached).max(1) as f64,
            held_mib: k.held as f64 / (1u64 << 20) as f64,
        }),
        ..measured(cost, bytes, seconds)
    })
}

/// What [`ServerMeter`] measured over one download.
#[derive(Debug, Clone, Copy)]
struct Cost {
    /// Busy seconds of the server's CPU.
    busy: f64,
    /// Seconds of the server's own tasks.
    task: f64,
    /// The steal from the server's and the client's CPUs.
    steal: Steal,
}

/// A server's cost over one download: its CPU's busy time (see
/// [`udpx_lab::cpu::CpuDelta::busy_time`]) and its own tasks' time on CPU; and the steal of
/// both ends' CPUs over the same window.
struct ServerMeter {
    tasks: Vec<String>,
    cpus: [usize; 2],
    rate: TickRate,
    task0: Option<f64>,
    busy0: Option<CpuSample>,
}

impl ServerMeter {
    /// Starts measuring the server's CPU, the tasks (`/proc/...` directories) and the steal of
    /// the server's and the client's CPUs.
    fn start(tasks: Vec<String>, place: &Place<'_>, rate: TickRate) -> ServerMeter {
        let task0 = cpu_secs(&tasks, rate);
        let cpus = [place.server_cpu, place.client_cpu];
        ServerMeter { tasks, cpus, rate, task0, busy0: CpuSample::now().ok() }
    }

    /// What was spent since the start; `None` if `/proc` could not be read.
    fn stop(&self) -> Option<Cost> {
        let d = CpuSample::now().ok()?.diff(self.busy0.as_ref()?);
        let busy = d.busy_time(&self.cpus[..1], self.rate).as_secs_f64();
        let task = (cpu_secs(&self.tasks, self.rate)? - self.task0?).max(0.0);
        Some(Cost { busy, task, steal: Steal::of(&d, &self.cpus, self.rate) })
    }
}

fn measured(Cost { busy: cpu, task, steal }: Cost, bytes: u64, seconds: f64) -> H3Run {
    H3Run {
        cpu_s_per_gb: if bytes > 0 { cpu / (bytes as f64 / 1e9) } else { f64::INFINITY },
        server_cpu_s: cpu,
        server_task_s: task,
        bytes,
        seconds,
        mbit_per_s: bytes as f64 * 8.0 / seconds.max(1e-9) / 1e6,
        send_calls: None,
        packets_per_call: None,
        lost_packets: None,
        gro_buffers: None,
        zerocopy: None,
        passes: None,
        turns_per_mb: None,
        send_calls_per_mb: None,
        cache: None,
        steal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_peers_are_named() {
        let (rows, left) = plan(&Programs::default(), false);
        assert_eq!(rows.len(), udpx_servers().len(), "udpx h3 get needs no peer");
        assert!(rows.iter().all(|r| r.1 == ClientKind::UdpxGet));
        assert_eq!(left.len(), 5);
        assert!(left[0].why.contains("gtlsclient") && left[1].why.contains("udpx binary"), "{left:?}");
        assert!(left[2].why.contains("nginx and curl") && left[3].why.contains("chromium"), "{left:?}");
        assert!(left[4].why.contains(crate::independent::PROGRAM), "{left:?}");
        let with_udpx = Programs { udpx: Some("/bin/true".into()), ..Programs::default() };
        let (rows, _) = plan(&with_udpx, false);
        assert_eq!(rows.last(), Some(&(ServerKind::Quinn, ClientKind::UdpxGet)));
        // The independent client's pair: udpx over HTTP/3, nginx over HTTP/2.
        let both =
            Programs { independent: Some("/bin/true".into()), nginx: Some("/bin/true".into()), ..Programs::default() };
        let (rows, _) = plan(&both, false);
        let udpx = ServerKind::Udpx { io: IoMode::GsoMmsg, gro: true, cache: false };
        assert_eq!(
            rows[rows.len() - 2..],
            [(udpx, ClientKind::Independent), (ServerKind::Nginx, ClientKind::Independent)]
        );
    }

    fn cost(c: f64, stolen: bool) -> Cost {
        Cost { busy: c, task: c, steal: Steal { stolen, ..Steal::default() } }
    }

    #[test]
    fn rows_are_median_runs_and_targets_paired() {
        let run = |c: f64| Ok(measured(cost(c, false), 1_000_000_000, 1.0));
        let rows = vec![
            merge("sendmsg".into(), "gtlsclient".into(), vec![run(2.0), run(2.2), run(1.8)], 3),
            merge("gso +GRO".into(), "gtlsclient".into(), vec![run(0.8), Err("x".into()), run(0.9)], 3),
            merge("nginx https/tcp".into(), "curl".into(), vec![run(0.5), run(0.5), run(0.5)], 3),
        ];
        assert_eq!(rows[0].median_run, Some(0));
        assert_eq!((rows[1].median_run, rows[1].error.as_deref()), (Some(0), Some("x")));
        let c = judge(&rows, 2.0);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0].ratios, vec![0.4, 0.5]);
        assert!(c[1].what.contains("gso +GRO / gtlsclient"), "{}", c[1].what);
        assert_eq!(c[1].ratios, vec![1.6, 1.8]);
    }
}
