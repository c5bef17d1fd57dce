//! `udpx bench`: the main job (no role), or one side of a measurement (`tx`, `rx`) with flags
//! familiar from the kernel's udpgso_bench_tx/rx.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use udpx::{SendMode, UdpSocket, Want};
use udpx_bench::cpu::{online_cpus, pin_current_thread, CpuSample, TickRate};
use udpx_bench::matrix::{default_rows, left_out, run_matrix, Preset, ProfileResult};
use udpx_bench::run::{Cpus, Kind, Path, RunConfig};
use udpx_bench::rx::{default_rcvbuf, run_rx, rx_socket_config, RxConfig, RxSocket};
use udpx_bench::tx::{run_tx, Interval, Proto, TxConfig};
use udpx_bench::{paced, report};
use udpx_lab::netns::{Profile, TestNet, TestNetConfig};

use crate::exit;
use crate::util::{self, duration, which};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    main: MainArgs,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Send (like udpgso_bench_tx).
    Tx(TxArgs),
    /// Receive (like udpgso_bench_rx).
    Rx(RxArgs),
    /// The paper's Figure 4: pacing interval against CPU and loss at a tbf bottleneck, in three
    /// namespaces (server -> router -> client). Needs root.
    Stream(crate::stream::Fig4Args),
    /// The Cloudflare post's table: a file downloaded over HTTP/3 from `udpx h3 serve` in each
    /// I/O mode (by gtlsclient and `udpx h3 get`) and over HTTPS/TCP from nginx (by curl);
    /// server CPU per byte, throughput, send calls, packets per call, losses.
    #[cfg(feature = "quic")]
    H3(Box<crate::h3::H3BenchArgs>),
    /// QUIC across hosts through an nftables balancer (the lab of `udpx lb`): cost per packet
    /// of routing by connection ID against a 4-tuple hash, connections that survive a NAT
    /// rebinding, spread over hosts. Needs root, nft, tc.
    #[cfg(feature = "quic")]
    Lb(crate::lb::LbBenchArgs),
    /// quinn on udpx against quinn on quinn-udp: a quinn server sends 1 GB to a quinn client per
    /// row (quinn-udp, udpx system calls, udpx io_uring), over veth as root, else loopback;
    /// server CPU per byte.
    #[cfg(feature = "quic")]
    Quic(QuicArgs),
    /// `h3`, `lb` and `quic` in a binary built without the QUIC tools.
    #[cfg(not(feature = "quic"))]
    #[command(name = "h3", aliases = ["lb", "quic"], hide = true, disable_help_flag = true)]
    WithoutQuic(crate::util::WithoutQuic),
}

/// `udpx bench quic`.
#[cfg(feature = "quic")]
#[derive(Args, Debug)]
pub struct QuicArgs {
    /// Bytes per transfer (k, M, G: decimal).
    #[arg(long, value_parser = crate::util::parse_size_arg, default_value = "1G")]
    size: u64,
    /// Rounds, interleaved (every row once per round).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=50))]
    rounds: u64,
    /// On loopback even as root (as root the default is a veth pair between two namespaces,
    /// as for `udpx bench`).
    #[arg(long)]
    loopback: bool,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "quic")]
fn quic(a: QuicArgs) -> ExitCode {
    let veth = udpx_lab::netns::is_root() && !a.loopback;
    if veth {
        crate::util::signal_cleanup("bench quic");
    }
    let cpus = udpx_lab::cpu::online_cpus();
    let (server_cpu, client_cpu) = match cpus[..] {
        [c] => (c, c),
        [a, b, ..] => (b, a),
        [] => (0, 0),
    };
    let cfg = udpx_quinn::QuicBenchConfig { size: a.size, rounds: a.rounds as usize, server_cpu, client_cpu, veth };
    let res = udpx_quinn::run(&cfg, &mut |l| eprintln!("udpx bench quic: {l}"));
    crate::util::print_bench("bench quic", res, a.json, "quic_bench", udpx_quinn::QuicBench::to_markdown)
}

/// How to send: one of the four UDP send modes, or TCP.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ModeArg {
    /// One sendmsg per datagram.
    Sendmsg,
    /// sendmmsg batches.
    Sendmmsg,
    /// UDP GSO super-buffers, one sendmsg each.
    Gso,
    /// UDP GSO super-buffers batched with sendmmsg.
    GsoSendmmsg,
    /// TCP.
    Tcp,
}

impl ModeArg {
    fn proto(self) -> Proto {
        match self {
            ModeArg::Sendmsg => Proto::Udp(SendMode::Sendmsg),
            ModeArg::Sendmmsg => Proto::Udp(SendMode::Sendmmsg),
            ModeArg::Gso => Proto::Udp(SendMode::GsoSendmsg),
            ModeArg::GsoSendmmsg => Proto::Udp(SendMode::GsoSendmmsg),
            ModeArg::Tcp => Proto::Tcp,
        }
    }
}

#[derive(Args, Debug)]
#[allow(clippy::struct_excessive_bools)] // reason: command-line flags, each a switch of its own
struct MainArgs {
    /// Seconds each row sends (default: the preset's, printed at the start; see --thorough).
    #[arg(short = 'l', long)]
    duration: Option<f64>,
    /// Runs of every row, interleaved; each row shows its median run and the spread over
    /// runs; too few runs leave every target inconclusive (default: the preset's).
    #[arg(long, visible_alias = "runs")]
    repeat: Option<usize>,
    /// The longer preset for figures to publish: more runs of longer rows (the start of the
    /// run prints how many and the estimated time).
    #[arg(long)]
    thorough: bool,
    /// Datagram size in bytes (UDP payload).
    #[arg(short = 's', long, default_value_t = 1472)]
    size: usize,
    /// Leave out the iperf3 rows.
    #[arg(long)]
    no_iperf3: bool,
    /// Path profiles to run over the veth pair (offload, software).
    #[arg(long, value_delimiter = ',', default_value = "offload,software")]
    profiles: Vec<String>,
    /// Measure over loopback even as root.
    #[arg(long)]
    loopback: bool,
    /// Folder for the results (a timestamped subfolder is made in it).
    #[arg(long, default_value = "results")]
    out: String,
    /// Print the whole result as one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Verify sequence numbers and checksums in every datagram (slower).
    #[arg(long)]
    verify: bool,
    /// Receive buffer of every UDP receiver, raw and udpx alike, in bytes (the value set; the
    /// kernel doubles it). Default: sized from the expected burst (printed at the start).
    #[arg(long)]
    rcvbuf: Option<usize>,
    /// After the main rows, judge each raw/udpx receiver pair at a paced rate both sustain
    /// with at least 99 % delivered (2 rows, up to 3 rates, per shape and profile: adds about
    /// a third to the run).
    #[arg(long)]
    paced: bool,
    /// Run every row, also those the default job leaves out to stay near 3 minutes (cache
    /// thrashing, plain into GRO, forced and cache-thrashing zerocopy); --thorough implies it.
    #[arg(long)]
    all_rows: bool,
}

/// The port of `bench tx`/`bench rx` when `-p` is not given.
const DEFAULT_PORT: u16 = 8000;

/// MTU of the main job's veth pair: the common Ethernet MTU, so a GSO segment is a real
/// wire-sized datagram.
const VETH_MTU: u32 = 1500;

/// IPv4 and UDP headers: a datagram (or GSO segment) over a path of MTU `m` carries at most
/// `m - 28` bytes without fragmenting (IPv6: 48).
fn max_datagram(mtu: u32, v6: bool) -> usize {
    let headers = if v6 { 48 } else { 28 };
    let ceiling = if v6 { udpx::MAX_PAYLOAD_V6 } else { udpx::MAX_PAYLOAD_V4 };
    (mtu as usize).saturating_sub(headers).min(ceiling)
}

/// The loopback device's MTU from sysfs; `None` if it cannot be read.
fn loopback_mtu() -> Option<u32> {
    std::fs::read_to_string("/sys/class/net/lo/mtu").ok()?.trim().parse().ok()
}

/// `-p 0` would bind an ephemeral port nobody can know (rx) or send to port 0 (tx).
fn check_port(port: Option<u16>) -> Result<(), String> {
    match port {
        Some(0) => Err(format!("-p 0: give a fixed port both sides know (default {DEFAULT_PORT})")),
        _ => Ok(()),
    }
}

#[derive(Args, Debug)]
#[allow(clippy::struct_excessive_bools)] // reason: command-line flags, each a switch of its own
struct Common {
    /// IPv4 (default).
    #[arg(short = '4', conflicts_with = "ipv6")]
    ipv4: bool,
    /// IPv6.
    #[arg(short = '6')]
    ipv6: bool,
    /// Port (default 8000).
    #[arg(short = 'p', long)]
    port: Option<u16>,
    /// Pin to this CPU.
    #[arg(short = 'C', long)]
    cpu: Option<usize>,
    /// Seconds to run (tx: sending time; rx: longest wait).
    #[arg(short = 'l', long, default_value_t = 5.0)]
    duration: f64,
    /// Check sequence numbers and checksums.
    #[arg(long)]
    verify: bool,
    /// One JSON object at the end instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[allow(clippy::struct_excessive_bools)] // reason: command-line flags, each a switch of its own
struct TxArgs {
    #[command(flatten)]
    common: Common,
    // The help as an attribute, not a doc comment: rustdoc would read `[IPv6]` as a link.
    #[arg(short = 'D', long, help = "Destination: IP, IP:PORT or [IPv6]:PORT.")]
    dst: util::Peer,
    /// How to send.
    #[arg(short = 'm', long, value_enum, default_value_t = ModeArg::Sendmsg)]
    mode: ModeArg,
    /// Datagram size (with -S: bytes per send call, exactly, as udpgso_bench_tx).
    #[arg(short = 's', long, default_value_t = 1472)]
    size: usize,
    /// GSO segment size: every call sends one buffer of exactly --size bytes cut into
    /// ceil(size / S) segments of this size (the last shorter if S does not divide it).
    #[arg(short = 'S', long)]
    gso_size: Option<usize>,
    /// Rotate over a working set larger than the last-level cache.
    #[arg(short = 'c', long)]
    cache_thrash: bool,
    /// MSG_ZEROCOPY from owned buffers, turned off by udpx where the kernel copies anyway
    /// (exits 4 on a kernel without SO_ZEROCOPY).
    #[arg(short = 'z', long)]
    zerocopy: bool,
    /// With -z: keep zerocopy on even when every completion says copied (to measure its cost).
    #[arg(long, requires = "zerocopy")]
    zerocopy_forced: bool,
    /// Send through io_uring (linked SENDMSG entries, one io_uring_enter per batch); exits 4
    /// where io_uring is unavailable. Not with -z (zerocopy sends use system calls).
    #[arg(long, conflicts_with = "zerocopy")]
    io_uring: bool,
    /// Bytes per second at most.
    #[arg(long)]
    rate: Option<u64>,
}

#[derive(Args, Debug)]
struct RxArgs {
    #[command(flatten)]
    common: Common,
    /// UDP GRO on the socket.
    #[arg(short = 'g', long)]
    gro: bool,
    /// TCP instead of UDP.
    #[arg(short = 't', long)]
    tcp: bool,
    /// Receive buffer in bytes (the value set; the kernel doubles it). Default: sized from
    /// the expected burst; the summary reports the effective size.
    #[arg(long)]
    rcvbuf: Option<usize>,
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    util::usage("bench", msg)
}

fn check_cpu(cpu: Option<usize>) -> Result<(), String> {
    if let Some(c) = cpu {
        let online = online_cpus();
        if !online.contains(&c) {
            return Err(format!("-C {c}: no such CPU; online CPUs are {online:?}"));
        }
    }
    Ok(())
}

fn check_size(flag: &str, size: usize, v6: bool) -> Result<(), String> {
    let max = if v6 { udpx::MAX_PAYLOAD_V6 } else { udpx::MAX_PAYLOAD_V4 };
    if size == 0 || size > max {
        return Err(format!("{flag} {size}: the datagram size must be from 1 to {max} bytes"));
    }
    Ok(())
}

pub fn main(args: BenchArgs) -> ExitCode {
    match args.role {
        Some(Role::Tx(a)) => tx(a),
        Some(Role::Rx(a)) => rx(a),
        Some(Role::Stream(a)) => crate::stream::fig4(a),
        #[cfg(feature = "quic")]
        Some(Role::H3(a)) => crate::h3::bench(*a),
        #[cfg(feature = "quic")]
        Some(Role::Lb(a)) => crate::lb::bench(a),
        #[cfg(feature = "quic")]
        Some(Role::Quic(a)) => quic(a),
        #[cfg(not(feature = "quic"))]
        Some(Role::WithoutQuic(_)) => crate::util::without_quic("bench h3|lb|quic"),
        None => main_job(args.main),
    }
}

/// The pinned CPU's busy time over a role's run, from /proc/stat (user, system, irq and
/// softirq: on a veth or loopback path the receive stack runs in softirq on the sender's CPU;
/// steal apart).
struct CpuWatch {
    cpu: usize,
    before: CpuSample,
}

impl CpuWatch {
    fn start(cpu: Option<usize>) -> Option<CpuWatch> {
        Some(CpuWatch { cpu: cpu?, before: CpuSample::now().ok()? })
    }

    /// (busy seconds, of which softirq seconds, stolen seconds: not in busy).
    fn finish(&self) -> Option<(f64, f64, f64)> {
        let d = CpuSample::now().ok()?.diff(&self.before);
        let rate = TickRate::system().ok()?;
        let soft = d.times(Some(self.cpu)).map(|t| rate.to_secs_f64(t.softirq)).unwrap_or(0.0);
        let steal = d.steal_time(&[self.cpu], rate).as_secs_f64();
        Some((d.busy_time(&[self.cpu], rate).as_secs_f64(), soft, steal))
    }

    fn json(&self, bytes: u64) -> serde_json::Value {
        match self.finish() {
            Some((busy, soft, steal)) => serde_json::json!({
                "cpu": self.cpu, "busy_secs": busy, "softirq_secs": soft, "steal_secs": steal,
                "busy_cpu_secs_per_gb": udpx_bench::run::per_gb(busy, bytes)
            }),
            None => serde_json::Value::Null,
        }
    }

    fn text(&self, bytes: u64) -> String {
        match self.finish() {
            Some((busy, soft, steal)) => format!(
                "; pinned CPU {}: {busy:.2}s busy ({soft:.2}s softirq), {:.2} CPU-s/GB{}",
                self.cpu,
                udpx_bench::run::per_gb(busy, bytes),
                if steal > 0.0 {
                    format!(" ({steal:.2}s stolen by the hypervisor, not counted)")
                } else {
                    String::new()
                }
            ),
            None => String::new(),
        }
    }
}

fn print_interval(side: &str, iv: &Interval) {
    let s = iv.secs.max(1e-9);
    println!(
        "{side} {:>5.1}s  {:>8.1} MB/s  {:>6.2} Gbit/s  {:>9.0} calls/s  {:>9.0} datagrams/s  {:>5.1} dg/call",
        iv.at,
        iv.bytes as f64 / s / 1e6,
        iv.bytes as f64 * 8.0 / s / 1e9,
        iv.calls as f64 / s,
        iv.datagrams as f64 / s,
        if iv.calls > 0 { iv.datagrams as f64 / iv.calls as f64 } else { 0.0 }
    );
}

/// What -S (the GSO segment size) makes of the send: the protocol (GSO where the mode was
/// not), the datagram size, the segments per zerocopy buffer and the bytes per send call;
/// without -S, the mode's protocol and -s. Err: what is wrong with -S.
fn tx_shape(a: &TxArgs) -> Result<(Proto, usize, Option<usize>, Option<usize>), String> {
    let mut proto = a.mode.proto();
    let Some(s) = a.gso_size else { return Ok((proto, a.size, None, None)) };
    if s == 0 || s >= a.size {
        return Err(format!("-S {s}: the GSO segment size must be at least 1 and smaller than -s {}", a.size));
    }
    if a.mode == ModeArg::Tcp {
        return Err("-S: GSO applies to UDP, not -m tcp".into());
    }
    let segments = a.size.div_ceil(s);
    let kernel_max = udpx::KernelCaps::get().gso_max_segments.unwrap_or(0);
    if segments > kernel_max {
        return Err(format!(
            "-s {} -S {s}: {segments} segments per send; this kernel takes at most {kernel_max}",
            a.size
        ));
    }
    if !matches!(proto, Proto::Udp(SendMode::GsoSendmmsg)) {
        proto = Proto::Udp(SendMode::GsoSendmsg);
    }
    // Zerocopy sends keep their own pool of whole segments (at most this many each).
    Ok((proto, s, Some(a.size / s), Some(a.size)))
}

/// The sender's UDP socket on `local`, connected to `dst`, sending by `mode` with zerocopy and
/// io_uring as the flags ask. Err: how the command ends (skipped without io_uring).
fn tx_socket(a: &TxArgs, local: SocketAddr, dst: SocketAddr, mode: SendMode) -> Result<UdpSocket, ExitCode> {
    let zc_cfg = udpx::ZcConfig {
        copied_limit: if a.zerocopy_forced { 0 } else { udpx::zerocopy::COPIED_LIMIT },
        ..udpx::ZcConfig::default()
    };
    let builder = UdpSocket::builder(local)
        .send_mode(mode)
        .send_buffer(4 << 20)
        .zerocopy(if a.zerocopy { Want::Required } else { Want::Off })
        .zerocopy_config(zc_cfg)
        .io_uring(if a.io_uring { Want::Required } else { Want::Off })
        .connect(dst);
    match builder.bind() {
        Ok(s) => Ok(s),
        Err(udpx::Error::Unsupported { feature: udpx::Feature::IoUring, why }) => {
            eprintln!("udpx bench tx: --io-uring: {why}");
            Err(ExitCode::from(exit::SKIPPED))
        }
        Err(e) => Err(failure(format!("socket: {e}"))),
    }
}

fn tx(a: TxArgs) -> ExitCode {
    let v6 = a.common.ipv6 || a.dst.ip.is_ipv6();
    let dur = match duration("-l", a.common.duration) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    if let Err(e) = check_size("-s", a.size, v6).and(check_cpu(a.common.cpu)).and(check_port(a.common.port)) {
        return usage(e);
    }
    if a.rate == Some(0) {
        return usage(
            "--rate 0: that sends nothing; give bytes per second above 0, or leave --rate out for full speed",
        );
    }
    if a.zerocopy && a.mode == ModeArg::Tcp {
        return usage("-z: zerocopy here is for UDP; TCP zerocopy is not measured by udpx");
    }
    if a.zerocopy && !udpx::KernelCaps::get().zerocopy {
        eprintln!("udpx bench tx: -z: this kernel does not accept SO_ZEROCOPY");
        return ExitCode::from(exit::SKIPPED);
    }
    let (proto, size, max_segments, send_size) = match tx_shape(&a) {
        Ok(x) => x,
        Err(e) => return usage(e),
    };
    if let Some(c) = a.common.cpu {
        let _ = pin_current_thread(c);
    }
    let dst = match a.dst.addr(a.common.port, DEFAULT_PORT) {
        Ok(d) if d.port() == 0 => {
            return usage(format!("-D {d}: port 0 reaches no receiver; give the receiver's port"))
        }
        Ok(d) => d,
        Err(e) => return usage(format!("-D: {e}")),
    };
    let local: SocketAddr = if v6 { (Ipv6Addr::UNSPECIFIED, 0).into() } else { (Ipv4Addr::UNSPECIFIED, 0).into() };
    let cfg = TxConfig {
        dst,
        proto,
        size,
        duration: dur,
        cache_thrash: a.cache_thrash,
        verify: a.common.verify,
        rate: a.rate,
        max_segments,
        send_size,
        zerocopy: a.zerocopy,
    };
    let stop = AtomicBool::new(false);
    let json = a.common.json;
    let mut on = |iv: &Interval| {
        if !json {
            print_interval("tx", iv)
        }
    };
    let watch = CpuWatch::start(a.common.cpu);
    let res = match proto {
        Proto::Udp(mode) => {
            let sock = match tx_socket(&a, local, dst, mode) {
                Ok(s) => s,
                Err(code) => return code,
            };
            run_tx(&cfg, Some(&sock), None, &stop, &mut on)
        }
        Proto::Tcp => match std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(3)) {
            Ok(s) => run_tx(&cfg, None, Some(s), &stop, &mut on),
            Err(e) => return failure(format!("connect {dst}: {e} (is `udpx bench rx -t` running?)")),
        },
    };
    match res {
        Ok(r) => {
            let cpu = r.user_secs + r.sys_secs;
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "role": "tx", "dst": dst.to_string(), "mode": format!("{:?}", a.mode), "io_uring": a.io_uring, "size": size, "send_size": send_size, "result": r, "cpu_secs_per_gb": udpx_bench::run::per_gb(cpu, r.bytes), "pinned_cpu": watch.as_ref().map(|w| w.json(r.bytes)) })
                );
            } else {
                println!(
                    "tx summary: {:.1} MB/s, {:.2} Gbit/s, {:.0} calls/s, {:.0} datagrams/s, {:.1} datagrams/call, {:.2} CPU-s/GB (this thread: {:.2}s user + {:.2}s sys), {} GSO fallbacks{}",
                    r.bytes as f64 / r.secs / 1e6,
                    r.bytes as f64 * 8.0 / r.secs / 1e9,
                    r.calls as f64 / r.secs,
                    r.datagrams as f64 / r.secs,
                    if r.calls > 0 { r.datagrams as f64 / r.calls as f64 } else { 0.0 },
                    udpx_bench::run::per_gb(cpu, r.bytes),
                    r.user_secs,
                    r.sys_secs,
                    r.gso_fallbacks,
                    watch.as_ref().map(|w| w.text(r.bytes)).unwrap_or_default()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(format!("send: {e}")),
    }
}

fn rx(a: RxArgs) -> ExitCode {
    let dur = match duration("-l", a.common.duration) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    if let Err(e) = check_cpu(a.common.cpu).and(check_port(a.common.port)) {
        return usage(e);
    }
    if let Some(c) = a.common.cpu {
        let _ = pin_current_thread(c);
    }
    let v6 = a.common.ipv6;
    let ip: IpAddr = if v6 { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
    let port = a.common.port.unwrap_or(DEFAULT_PORT);
    let local = SocketAddr::new(ip, port);
    if a.rcvbuf == Some(0) {
        return usage("--rcvbuf 0: give a receive buffer size in bytes, or leave it out to size it from the burst");
    }
    let rcvbuf = a.rcvbuf.unwrap_or_else(|| default_rcvbuf(1472).set);
    let cfg = RxConfig { verify: a.common.verify, idle: Duration::from_secs(2), max: dur };
    let json = a.common.json;
    let mut on = |iv: &Interval| {
        if !json {
            print_interval("rx", iv)
        }
    };
    let watch = CpuWatch::start(a.common.cpu);
    let res = if a.tcp {
        let l = match std::net::TcpListener::bind(local) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return usage(format!("-p {port}: port in use; pick another with -p"))
            }
            Err(e) => return failure(format!("bind {local}: {e}")),
        };
        match l.accept() {
            // From here SIGINT and SIGTERM end the run, and the summary is still printed.
            Ok((s, _)) => run_rx(&cfg, None, Some(s), util::stop_on_signals(), &mut on),
            Err(e) => return failure(format!("accept: {e}")),
        }
    } else {
        // No per-datagram control message this role does not read (see rx_socket_config).
        let sock = match rx_socket_config(local, RxSocket { gro: a.gro, batch: true, meta: false, rcvbuf }).bind() {
            Ok(s) => s,
            Err(udpx::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AddrInUse => {
                return usage(format!("-p {port}: port in use; pick another with -p"))
            }
            Err(e @ udpx::Error::Unsupported { .. }) => {
                eprintln!("udpx bench rx: {e}");
                return ExitCode::from(exit::SKIPPED);
            }
            Err(e) => return failure(format!("socket: {e}")),
        };
        run_rx(&cfg, Some(&sock), None, util::stop_on_signals(), &mut on)
    };
    match res {
        Ok(r) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "role": "rx", "gro": a.gro, "rcvbuf_set": (!a.tcp).then_some(rcvbuf), "result": r, "pinned_cpu": watch.as_ref().map(|w| w.json(r.bytes)) })
                );
            } else {
                let s = r.secs.max(1e-9);
                println!(
                    "rx summary: {:.1} MB/s, {:.2} Gbit/s, {} datagrams, {:.0} calls/s, {:.1} datagrams/call, {} GRO buffers, {} truncated, {} kernel drops{}{}, this thread {:.2}s user + {:.2}s sys{}",
                    r.bytes as f64 / s / 1e6,
                    r.bytes as f64 * 8.0 / s / 1e9,
                    r.datagrams,
                    r.calls as f64 / s,
                    if r.calls > 0 { r.datagrams as f64 / r.calls as f64 } else { 0.0 },
                    r.gro_buffers,
                    r.truncated,
                    r.kernel_drops,
                    r.seq.as_ref().map(|t| format!(", lost {}, reordered {}, duplicates {}, corrupt {}", t.lost(), t.reordered, t.duplicates, t.corrupt)).unwrap_or_default(),
                    r.rcvbuf_effective.map(|b| format!(", receive buffer {b} B effective ({rcvbuf} set)")).unwrap_or_default(),
                    r.user_secs,
                    r.sys_secs,
                    watch.as_ref().map(|w| w.text(r.bytes)).unwrap_or_default()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(format!("receive: {e}")),
    }
}

fn failure(msg: String) -> ExitCode {
    eprintln!("udpx bench: {msg}");
    ExitCode::FAILURE
}

/// UTC `YYYYmmdd-HHMMSS` without a date library.
fn stamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn main_job(a: MainArgs) -> ExitCode {
    let (preset, dur, profiles, veth) = match main_settings(&a) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let repeat = preset.runs;
    if veth {
        // Before any thread exists: Ctrl-C, TERM and HUP remove our namespaces, then exit.
        crate::util::signal_cleanup("bench");
    }
    let cpus_online = online_cpus();
    let cpus = Cpus { tx: cpus_online[0], rx: *cpus_online.get(1).unwrap_or(&cpus_online[0]) };
    let iperf3_why = iperf3_missing(&a);
    let rows = default_rows(iperf3_why.is_none(), preset);
    let left_out = left_out(iperf3_why.as_deref(), preset.all_rows);
    if a.rcvbuf == Some(0) {
        return usage("--rcvbuf 0: give a receive buffer size in bytes, or leave it out to size it from the burst");
    }
    let plan = default_rcvbuf(a.size);
    let rcvbuf = a.rcvbuf.unwrap_or(plan.set);
    let rcvbuf_text = rcvbuf_text(&a, &plan);
    let cfg = RunConfig { duration: dur, size: a.size, v6: false, verify: a.verify, cpus, rcvbuf, pace: None };
    let n_profiles = if veth { profiles.len() } else { 1 };
    let total = (rows.len() * repeat * n_profiles) as u64;
    let iperf3_rows = rows.iter().filter(|r| matches!(r.kind, Kind::Iperf3 { .. })).count();
    let secs = preset.estimate(rows.len(), iperf3_rows, n_profiles).as_secs_f64();
    let estimate = if secs < 90.0 { format!("{secs:.0} s") } else { format!("{:.0} min", secs / 60.0) };
    if !a.json {
        eprintln!(
            "udpx bench: {} rows x {repeat} runs x {} s x {n_profiles} profile(s): about {estimate}",
            rows.len(),
            preset.row_secs
        );
    }
    // Also with --json: a missing peer is never silent.
    eprint!("{}", report::left_out_text(&left_out));
    let bar = progress_bar(total, a.json);
    let mut progress = |label: &str| {
        bar.set_message(label.to_string());
        bar.inc(1);
    };
    let mut results: Vec<ProfileResult> = Vec::new();
    let mut paced_results: Vec<(String, Vec<paced::PacedPair>)> = Vec::new();
    let mut devices: Vec<String> = Vec::new();
    let path_text;
    if veth {
        path_text = veth_path_text(cpus, preset, &rcvbuf_text);
        for p in &profiles {
            let net = match TestNet::setup(&TestNetConfig {
                profile: *p,
                mtu: VETH_MTU,
                tx_cpu: Some(cpus.tx),
                rx_cpu: Some(cpus.rx),
            }) {
                Ok(n) => n,
                Err(e) => return failure(format!("setting up the {p} path: {e}")),
            };
            devices.extend(device_features(&net, *p));
            let sized = udpx_bench::rx::default_rcvbuf_for(*p, a.size);
            let cfg = RunConfig { rcvbuf: a.rcvbuf.unwrap_or(sized.set), ..cfg.clone() };
            let r = run_matrix(p.as_str(), Path::Veth(&net), &rows, &cfg, repeat, &mut progress);
            if a.paced {
                bar.inc_length((2 * paced::PAIRS.len() * repeat) as u64);
                paced_results
                    .push((r.profile.clone(), paced::run_paced(&r, Path::Veth(&net), &cfg, repeat, &mut progress)));
            }
            results.push(r);
        }
    } else {
        path_text = loopback_path_text(&a, cpus, preset, &rcvbuf_text);
        let r = run_matrix("loopback", Path::Loopback, &rows, &cfg, repeat, &mut progress);
        if a.paced {
            bar.inc_length((2 * paced::PAIRS.len() * repeat) as u64);
            paced_results.push((r.profile.clone(), paced::run_paced(&r, Path::Loopback, &cfg, repeat, &mut progress)));
        }
        results.push(r);
    }
    bar.finish_and_clear();
    let mut checks: Vec<report::Check> = results.iter().flat_map(report::checks).collect();
    for (profile, pairs) in &paced_results {
        checks.extend(paced::checks(profile, pairs, repeat));
    }
    let paced_text: String = paced_results.iter().map(|(profile, pairs)| paced::table(profile, pairs)).collect();
    let env_text = environment_text(&devices);
    let dir = format!("{}/{}", a.out, stamp());
    let json = serde_json::json!({
        "path": path_text,
        "config": cfg,
        "preset": preset,
        "verdict_rule": report::verdict_rule(repeat),
        "rcvbuf_set": rcvbuf,
        "left_out": left_out,
        "paced": paced_results.iter().map(|(profile, pairs)| serde_json::json!({ "profile": profile, "pairs": pairs })).collect::<Vec<_>>(),
        "profiles": results,
        "checks": checks,
        "environment": env_text,
    });
    let mut md = report::markdown("udpx bench", &path_text, &results, &checks, &env_text, &left_out);
    if !paced_results.is_empty() {
        md.push_str(&format!(
            "\n## Paced pairs (raw sender paced; both receivers must deliver >= 99 % in every run)\n\n```\n{paced_text}```\n"
        ));
    }
    let write = write_files(&dir, &json, &md, &results);
    if a.json {
        println!("{json}");
    } else {
        let paced = (!paced_results.is_empty()).then_some(paced_text.as_str());
        print_text(&path_text, &left_out, &results, paced, repeat, &checks, &env_text);
    }
    match write {
        Ok(()) => eprintln!("udpx bench: results in {dir}/ (report.md, report.json, cost.svg)"),
        Err(e) => eprintln!("udpx bench: could not write {dir}: {e}"),
    }
    let failed_rows = results.iter().flat_map(|p| &p.rows).filter(|r| r.runs.is_empty()).count();
    if failed_rows > 0 {
        eprintln!("udpx bench: {failed_rows} rows failed (see the tables)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Why the iperf3 rows are left out, if they are.
fn iperf3_missing(a: &MainArgs) -> Option<String> {
    if a.no_iperf3 {
        Some("--no-iperf3 given".to_string())
    } else if !which("iperf3") {
        Some("iperf3 is not on PATH (scripts/setup.sh installs it)".to_string())
    } else {
        None
    }
}

/// The report's "Path:" line for the veth pair.
fn veth_path_text(cpus: Cpus, preset: Preset, rcvbuf_text: &str) -> String {
    format!(
        "Path: veth pair between two network namespaces, MTU {VETH_MTU}; sender pinned to CPU {}, receiver to CPU {}; {} s per row, median run of {} interleaved runs; cache-thrash working set {} MiB (last-level cache {}); {rcvbuf_text} (effective size per run in report.json).",
        cpus.tx,
        cpus.rx,
        preset.row_secs,
        preset.runs,
        udpx_bench::tx::thrash_bytes() >> 20,
        udpx_bench::tx::llc_bytes().map_or("unknown".to_string(), |l| format!("{} MiB", l >> 20))
    )
}

/// The report's "Path:" line for loopback, with why it is not the veth pair (also said on
/// standard error now).
fn loopback_path_text(a: &MainArgs, cpus: Cpus, preset: Preset, rcvbuf_text: &str) -> String {
    let why = if a.loopback {
        "--loopback given".to_string()
    } else {
        udpx_lab::netns::check_capable().err().map(|e| e.to_string()).unwrap_or_default()
    };
    eprintln!("udpx bench: measuring over LOOPBACK ({why}); run as root for the veth path between two namespaces");
    format!(
        "Path: LOOPBACK (not a device path: {why}); sender on CPU {}, receiver on CPU {}; {} s per row, median run of {} interleaved runs; {rcvbuf_text} (effective size per run in report.json).",
        cpus.tx, cpus.rx, preset.row_secs, preset.runs
    )
}

/// Writes report.json, report.md and cost.svg into `dir` (made if missing).
fn write_files(dir: &str, json: &serde_json::Value, md: &str, results: &[ProfileResult]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir).and_then(|_| {
        std::fs::write(format!("{dir}/report.json"), serde_json::to_string_pretty(json).unwrap_or_default())?;
        std::fs::write(format!("{dir}/report.md"), md)?;
        std::fs::write(format!("{dir}/cost.svg"), report::svg_chart(results))
    })
}

/// The job's settings from the flags: the preset with the flags given on top of it, the time
/// per row, the profiles, and whether the path is a veth pair (root) rather than loopback.
/// Err: how the command ends (a usage error).
fn main_settings(a: &MainArgs) -> Result<(Preset, Duration, Vec<Profile>, bool), ExitCode> {
    // The preset, then any flag given on top of it.
    let preset = if a.thorough { Preset::THOROUGH } else { Preset::DEFAULT };
    let preset = Preset {
        runs: a.repeat.unwrap_or(preset.runs),
        row_secs: a.duration.unwrap_or(preset.row_secs),
        all_rows: preset.all_rows || a.all_rows,
    };
    let dur = match duration("--duration", preset.row_secs) {
        Ok(d) => d,
        Err(e) => return Err(usage(e)),
    };
    let repeat = preset.runs;
    if repeat == 0 || repeat > 20 {
        return Err(usage(format!("--repeat {repeat}: give 1 to 20 runs (3 or more for a verdict on the targets)")));
    }
    if let Err(e) = check_size("--size", a.size, false) {
        return Err(usage(e));
    }
    let mut profiles = Vec::new();
    for p in &a.profiles {
        match p.parse::<Profile>() {
            Ok(p) => profiles.push(p),
            Err(_) => return Err(usage(format!("--profiles {p}: use offload, software or both (offload,software)"))),
        }
    }
    let veth = !a.loopback && udpx_lab::netns::check_capable().is_ok();
    // Every UDP row sends datagrams (or GSO segments) of --size: over the path used, not
    // fragmented, or every row would fail with EMSGSIZE after the whole job's setup.
    let (mtu, path_name) = if veth { (Some(VETH_MTU), "veth pair") } else { (loopback_mtu(), "loopback") };
    if let Some(mtu) = mtu {
        let max = max_datagram(mtu, false);
        if a.size > max {
            return Err(usage(format!(
                "--size {}: the {path_name}'s MTU is {mtu}, so a datagram is at most {max} bytes over IPv4; give --size {max} or less",
                a.size
            )));
        }
    }
    Ok((preset, dur, profiles, veth))
}

/// How the receive buffer was chosen, for the report.
fn rcvbuf_text(a: &MainArgs, plan: &udpx::rcvbuf::RcvbufPlan) -> String {
    match a.rcvbuf {
        Some(n) => format!("receive buffer {n} B set (--rcvbuf)"),
        None => {
            let shared = udpx_bench::rx::default_rcvbuf_for(udpx_lab::netns::Profile::Software, a.size);
            format!(
                "receive buffer sized by udpx::rcvbuf::plan: {} B set for {} datagrams of {} B arriving at {} GB/s \
                 during {} us (offload, loopback); {} B set for {} GB/s during {} ms (software: the receiver \
                 shares its CPU with the NAPI thread)",
                plan.set,
                plan.datagrams,
                a.size,
                udpx_bench::rx::BULK_RATE / 1_000_000_000,
                udpx_bench::rx::BULK_GAP.as_micros(),
                shared.set,
                udpx_bench::rx::SHARED_RATE / 1_000_000_000,
                udpx_bench::rx::SHARED_GAP.as_millis()
            )
        }
    }
}

/// The job's progress bar over `total` row runs (hidden with --json).
fn progress_bar(total: u64, json: bool) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

/// The offloads that matter of each end of the `p` path's veth pair, one line per end.
fn device_features(net: &TestNet, p: Profile) -> Vec<String> {
    let mut out = Vec::new();
    for side in [udpx_lab::netns::Side::Tx, udpx_lab::netns::Side::Rx] {
        let f = net.features(side).unwrap_or_default();
        let pick = ["tx-udp-segmentation", "tx-checksumming", "generic-receive-offload", "rx-udp-gro-forwarding"]
            .iter()
            .map(|k| format!("{k} {}", f.get(*k).map(String::as_str).unwrap_or("?")))
            .collect::<Vec<_>>()
            .join(", ");
        out.push(format!("{p} {side:?} veth ({}): {pick}", net.dev(side)));
    }
    out
}

/// The job's report as text, on standard output.
fn print_text(
    path_text: &str,
    left_out: &[udpx_bench::matrix::LeftOut],
    results: &[ProfileResult],
    paced_text: Option<&str>,
    repeat: usize,
    checks: &[report::Check],
    env_text: &str,
) {
    println!("{path_text}\n");
    if !left_out.is_empty() {
        println!("== rows left out\n{}", report::left_out_text(left_out));
    }
    for p in results {
        println!("== {} profile: send side (paper Figure 1)\n{}", p.profile, report::send_table(p));
        println!("== {} profile: receive side (paper Figure 5)\n{}", p.profile, report::recv_table(p));
        println!(
            "== {} profile: against the raw reference (same shape, same receive buffer)\n{}",
            p.profile,
            report::raw_table(p)
        );
    }
    if let Some(paced_text) = paced_text {
        println!(
            "== paced pairs: the raw sender paced to a rate both receivers sustain (>= 99 % delivered in every run; \
             started at 90 % of the slower one's unpaced rate, 0.7x per failed try, 3 tries at most)\n{paced_text}"
        );
    }
    println!(
        "== targets (cost per delivered byte, both CPUs)\n{}\n{}",
        report::verdict_rule(repeat),
        report::checks_text(checks)
    );
    let audit: String = results.iter().map(report::zerocopy_audit).collect();
    println!("== zerocopy audit\n{audit}");
    if let Some(note) = report::steal_note(results) {
        println!("{note}\n");
    }
    println!("== environment\n{env_text}\n");
}

fn environment_text(devices: &[String]) -> String {
    let mut s = udpx_bench::env::Environment::collect(&[]).to_string();
    for d in devices {
        s.push_str(&format!("\n- {d}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_limits_follow_the_mtu() {
        assert_eq!(max_datagram(1500, false), 1472);
        assert_eq!(max_datagram(1500, true), 1452);
        // Loopback's 65536: the IPv4 UDP ceiling, not MTU - 28; IPv6 has a 40-byte header.
        assert_eq!(max_datagram(65536, false), udpx::MAX_PAYLOAD_V4);
        assert_eq!(max_datagram(65536, true), 65536 - 48);
        assert_eq!(max_datagram(20, false), 0);
    }
}
