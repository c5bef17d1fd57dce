//! `udpx echo`: the transaction server, its load generator, and the table of modes.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use udpx_echo::bench::{self as echo_bench, EchoBenchConfig};
use udpx_echo::load::{self, LoadConfig};
use udpx_echo::server::{self, Mode, ServeConfig};

use crate::util::{self, duration, which};

#[derive(Args, Debug)]
pub struct EchoArgs {
    #[command(subcommand)]
    cmd: EchoCmd,
}

#[derive(Subcommand, Debug)]
enum EchoCmd {
    /// Serve: echo every well-formed request (sockperf's ping-pong format) back to its sender.
    Serve(ServeArgs),
    /// Generate load against a server and measure transactions/s and latency percentiles.
    Load(LoadArgs),
    /// Run server and load generator through every mode and print the table (with sockperf).
    Bench(EchoBenchArgs),
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ModeArg {
    /// One socket, N threads (recvfrom/sendto).
    Naive,
    /// One socket per thread, kernel hash.
    Reuseport,
    /// One socket per CPU, threads pinned, cBPF steering by receiving CPU.
    ReuseportCpu,
    /// One socket per thread, cBPF steering by a QUIC DCID byte (--cid-byte).
    ReuseportCid,
}

#[derive(Args, Debug)]
#[allow(clippy::struct_excessive_bools)] // reason: command-line flags, each a switch of its own
struct ServeArgs {
    /// Address to serve on.
    #[arg(short = 'B', long, default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Port.
    #[arg(short = 'p', long, default_value_t = 11111)]
    port: u16,
    /// Mode.
    #[arg(short = 'm', long, value_enum, default_value_t = ModeArg::ReuseportCpu)]
    mode: ModeArg,
    /// Threads (and sockets for the reuseport modes), 1 to 1024.
    #[arg(short = 't', long, default_value_t = 1)]
    threads: usize,
    /// recvmmsg/sendmmsg batching.
    #[arg(long)]
    batch: bool,
    /// With --batch: receive (multishot) and send through io_uring; system calls where
    /// io_uring is unavailable.
    #[arg(long, requires = "batch")]
    io_uring: bool,
    /// For reuseport-cid: which byte of the QUIC destination connection ID picks the shard
    /// (0-19; short and long headers alike).
    #[arg(long, default_value_t = 0)]
    cid_byte: u8,
    /// Requests per second per source address at most, over all threads together, or `off`
    /// (then anyone can make the server reflect equal-size datagrams at a forged address at
    /// any rate: for benches with one source only). A request costs one per started 256 bytes,
    /// so a source also gets at most this x 256 bytes a second.
    #[arg(long, value_parser = parse_rate_limit, default_value = "1000")]
    rate_limit: RateLimitArg,
    /// Receive buffer per shard in bytes (the kernel doubles it); default: room for a burst of
    /// 4 requests from 1,024 clients at once.
    #[arg(long, value_name = "BYTES")]
    rcvbuf: Option<usize>,
    /// Allow more threads than CPUs.
    #[arg(long)]
    allow_oversubscribe: bool,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(short = 'l', long)]
    duration: Option<f64>,
    /// Print per-shard counters as JSON at exit.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics (`GET /metrics`): the library's counters and the server's, per
    /// shard. A port alone listens on 127.0.0.1 (0 picks one, printed); give an address
    /// (0.0.0.0:9100) to let other hosts scrape it.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = udpx_metrics::parse_listen)]
    metrics: Option<SocketAddr>,
}

#[derive(Args, Debug)]
struct LoadArgs {
    // The help as an attribute, not a doc comment: rustdoc would read `[IPv6]` as a link.
    #[arg(short = 'D', long, help = "Server: IP, IP:PORT or [IPv6]:PORT.")]
    dst: util::Peer,
    /// Server port (default 11111).
    #[arg(short = 'p', long)]
    port: Option<u16>,
    /// Flows (source ports).
    #[arg(short = 'f', long, default_value_t = 64)]
    flows: usize,
    /// Request size in bytes (26 to 65507).
    #[arg(short = 's', long, default_value_t = 100)]
    size: usize,
    /// Closed loop: requests outstanding per flow.
    #[arg(short = 'o', long, default_value_t = 4)]
    outstanding: usize,
    /// Open loop: requests per second in all.
    #[arg(short = 'r', long)]
    rate: Option<u64>,
    /// Seconds of load.
    #[arg(short = 'l', long, default_value_t = 5.0)]
    duration: f64,
    /// Milliseconds after which an unanswered request counts as lost (1 to 60000).
    #[arg(long, default_value_t = 200)]
    timeout_ms: u64,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct EchoBenchArgs {
    /// Seconds of load per mode.
    #[arg(short = 'l', long, default_value_t = 2.0)]
    duration: f64,
    /// Flows.
    #[arg(short = 'f', long, default_value_t = 64)]
    flows: usize,
    /// Requests outstanding per flow.
    #[arg(short = 'o', long, default_value_t = 4)]
    outstanding: usize,
    /// Request size.
    #[arg(short = 's', long, default_value_t = 100)]
    size: usize,
    /// Runs of every mode, interleaved; the table shows medians.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Loopback even as root.
    #[arg(long)]
    loopback: bool,
    /// Leave out sockperf.
    #[arg(long)]
    no_sockperf: bool,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    util::usage("echo", msg)
}

pub fn main(a: EchoArgs) -> ExitCode {
    match a.cmd {
        EchoCmd::Serve(s) => serve(s),
        EchoCmd::Load(l) => load_main(l),
        EchoCmd::Bench(b) => bench(b),
    }
}

fn serve(a: ServeArgs) -> ExitCode {
    let mode = match a.mode {
        ModeArg::Naive => Mode::Naive,
        ModeArg::Reuseport => Mode::Reuseport,
        ModeArg::ReuseportCpu => Mode::ReuseportCpu,
        ModeArg::ReuseportCid => Mode::ReuseportCid { cid_byte: a.cid_byte },
    };
    let cfg = ServeConfig {
        bind: SocketAddr::new(a.bind, a.port),
        mode,
        threads: a.threads,
        batch: a.batch,
        io_uring: a.io_uring,
        rate_limit: a.rate_limit.0,
        cpus: None,
        recv_buffer: a.rcvbuf,
    };
    if let Err(e) = server::check(&cfg, a.allow_oversubscribe) {
        return usage(e);
    }

    let dur = match a.duration.map(|d| duration("--duration", d)).transpose() {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    // SIGINT and SIGTERM are blocked before any thread starts, so every thread inherits the
    // mask and the signal waits for the one thread that takes it (below), instead of killing
    // the process from whichever thread the kernel picks.
    crate::util::raise_open_files("echo serve");
    let stop = crate::util::stop_on_signals();
    let bound = match server::bind(&cfg) {
        Ok(b) => b,
        Err(e) if e.contains("Address in use") => return usage(format!("-p {}: port in use; pick another", a.port)),
        Err(e) => {
            eprintln!("udpx echo serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rcvbuf = bound.recv_buffer();
    let srv = server::start(bound);
    eprintln!(
        "udpx echo serve: {} on {} ({} shards, receive buffer {} KiB each, {})",
        mode.name(),
        srv.addr,
        srv.stats().len(),
        rcvbuf >> 10,
        match a.rate_limit.0 {
            Some(n) => format!("at most {n} requests/s and {} kB/s per source address", u64::from(n) * 256 / 1000),
            None => "NO per-source rate limit (--rate-limit off): a reflector for forged sources".into(),
        }
    );
    let metrics = match a.metrics.map(|addr| srv.serve_metrics(addr)).transpose() {
        Ok(m) => m,
        Err(e) => {
            srv.stop();
            return usage(format!("--metrics: {e}; pick another address"));
        }
    };
    if let Some(m) = &metrics {
        eprintln!("udpx echo serve: metrics on http://{}/metrics", m.local_addr());
        crate::util::warn_if_exposed("echo serve", m.local_addr());
    }
    let start = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) && dur.is_none_or(|d| start.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = srv.stop();
    drop(metrics);
    if a.json {
        println!("{}", serde_json::json!({ "mode": mode.name(), "shards": stats }));
    } else {
        for (i, s) in stats.iter().enumerate() {
            let dropped = s.dropped_invalid + s.dropped_too_large + s.dropped_send_error;
            println!(
                "shard {i}: {} requests, {} replies ({} resent after a send error, {dropped} dropped: {} invalid, {} too large, {} send error), {} malformed, {} rate-limited, {:.1} requests/recv call, {} kernel drops",
                s.requests, s.replies, s.send_retries, s.dropped_invalid, s.dropped_too_large, s.dropped_send_error,
                s.malformed, s.rate_limited, s.batch, s.kernel_drops
            );
        }
    }
    ExitCode::SUCCESS
}

fn load_main(a: LoadArgs) -> ExitCode {
    let dur = match duration("--duration", a.duration) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let dst = match a.dst.addr(a.port, 11111) {
        Ok(d) => d,
        Err(e) => return usage(format!("-D: {e}")),
    };
    let bind: SocketAddr = if dst.is_ipv6() {
        "[::]:0".parse().unwrap_or(SocketAddr::from(([0; 16], 0)))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    };
    let cfg = LoadConfig {
        dst,
        bind,
        flows: a.flows,
        size: a.size,
        outstanding: a.outstanding,
        rate: a.rate,
        duration: dur,
        timeout: Duration::from_millis(a.timeout_ms),
    };
    if let Err(e) = load::check(&cfg) {
        return usage(e);
    }
    let res = load::bind_flows(&cfg).and_then(|s| load::run(&cfg, s));
    let r = match res {
        Ok(r) => r,
        Err(e) => {
            eprintln!("udpx echo load: {e}");
            return ExitCode::FAILURE;
        }
    };
    if a.json {
        println!("{}", serde_json::json!({ "load": r }));
    } else {
        println!(
            "{:.0} transactions/s; latency p50 {:.0} us, p90 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us; sent {}, answered {}, lost {}, unexpected {}, failed sends {}, unsent {}",
            r.tps, r.p50_us, r.p90_us, r.p99_us, r.p999_us, r.max_us, r.sent, r.received, r.lost, r.unexpected,
            r.send_failures, r.unsent
        );
    }
    if r.received == 0 {
        // A run in which nothing answered measured nothing: say so and fail, not "0 transactions/s".
        let why = if r.refused > 0 {
            format!("{} ICMP port-unreachable reports: nothing listens there", r.refused)
        } else {
            format!("{} requests sent, none answered within {} ms", r.sent, a.timeout_ms)
        };
        eprintln!("udpx echo load: nothing answered at {dst} ({why})");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn bench(a: EchoBenchArgs) -> ExitCode {
    let dur = match duration("--duration", a.duration) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let veth = !a.loopback && udpx_lab::netns::check_capable().is_ok();
    if veth {
        crate::util::signal_cleanup("echo bench");
    }
    let cfg = EchoBenchConfig {
        duration: dur,
        flows: a.flows,
        outstanding: a.outstanding,
        size: a.size,
        veth,
        sockperf: !a.no_sockperf && which("sockperf") && which("taskset"),
        repeat: a.repeat,
    };
    if a.repeat == 0 || a.repeat > 20 {
        return usage(format!("--repeat {}: give 1 to 20 runs", a.repeat));
    }
    let probe = LoadConfig {
        dst: SocketAddr::from(([127, 0, 0, 1], 1)),
        bind: SocketAddr::from(([127, 0, 0, 1], 0)),
        flows: cfg.flows,
        size: cfg.size,
        outstanding: cfg.outstanding,
        rate: None,
        duration: dur,
        timeout: Duration::from_millis(200),
    };
    if let Err(e) = load::check(&probe) {
        return usage(e);
    }
    let mut progress = |l: &str| {
        if !a.json {
            eprintln!("udpx echo bench: {l}");
        }
    };
    match echo_bench::run(&cfg, &mut progress) {
        Ok((rows, path)) => {
            // The table prints the judged targets itself (met / MISSED / inconclusive, with
            // their ranges); the JSON carries the same checks.
            let checks = echo_bench::judge(&rows);
            if a.json {
                println!("{}", serde_json::json!({ "path": path, "config": cfg, "rows": rows, "checks": checks }));
            } else {
                println!(
                    "Path: {path}; {} flows x {} outstanding, {} B requests, {} s per mode, median of {} interleaved runs.\n",
                    cfg.flows, cfg.outstanding, cfg.size, a.duration,
                    a.repeat
                );
                println!("{}", echo_bench::table(&rows));
            }
            if rows.iter().any(|r| r.error.is_some()) {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("udpx echo bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--rate-limit`: requests per second per source, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RateLimitArg(Option<u32>);

fn parse_rate_limit(s: &str) -> Result<RateLimitArg, String> {
    if s == "off" {
        return Ok(RateLimitArg(None));
    }
    match s.parse::<u32>() {
        Ok(0) | Err(_) => Err(format!(
            "--rate-limit {s}: give requests per second per source address (at least 1), or `off` for no limit"
        )),
        Ok(n) => Ok(RateLimitArg(Some(n))),
    }
}
