//! `udpx stream`: paced delivery to many flows (server, receiver, self-test).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use udpx_stream::{lab, report, PacingChoice, Progress, RecvConfig, ServeConfig, Server, StreamError};

use crate::util::{duration, usage, Peer};

#[derive(Args, Debug)]
pub struct StreamArgs {
    #[command(subcommand)]
    cmd: StreamCmd,
}

#[derive(Subcommand, Debug)]
enum StreamCmd {
    /// Stream paced flows to every client that asks. With --flows it also runs that many
    /// clients itself in another namespace (root) or on loopback, and reports: the self-test.
    Serve(ServeArgs),
    /// Be many clients of a server: one socket per flow; measure every flow.
    Recv(RecvArgs),
}

/// What each flow asks for (the receiver's request; the self-test's flows).
#[derive(Args, Debug, Clone)]
struct FlowArgs {
    /// Bytes per second per flow: a number with an optional k, M or G (4k = 4000).
    #[arg(short = 'r', long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// Bytes per datagram (UDP payload), 56 to the path's maximum [default: 1200].
    #[arg(short = 's', long)]
    size: Option<u32>,
    /// A release every this many ms (the batch follows from rate x interval); default: by
    /// --segments.
    #[arg(short = 'i', long = "interval-ms")]
    interval_ms: Option<f64>,
    /// Datagrams per release [default: the server's, 2].
    #[arg(long)]
    segments: Option<u32>,
    /// Burst allowance in datagrams [default: twice the batch].
    #[arg(long)]
    burst: Option<u32>,
    /// Seconds each flow streams [default: 10].
    #[arg(short = 'l', long)]
    duration: Option<f64>,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write an SVG of the departure error and the 1 ms aggregate rate here.
    #[arg(long, value_name = "FILE")]
    svg: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(short = 'B', long, default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Port.
    #[arg(short = 'p', long, default_value_t = 4500)]
    port: u16,
    /// Shards: threads, each with its own socket (reuseport) and pacer.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Pacing: auto (the kernel where the egress qdisc is fq, else the wheel), wheel, kernel.
    #[arg(long, default_value = "auto")]
    pacing: PacingChoice,
    /// Most flows at once.
    #[arg(long, default_value_t = 16_384)]
    max_flows: u32,
    /// After a late wake, release the flows' backlog at most this fast, in percent of their
    /// summed rate (101-1000; 0: all at once, a lump on the wire).
    #[arg(long, default_value_t = 125)]
    smoothing: u32,
    /// Run the pacer threads under SCHED_FIFO at this priority (1-99; needs root or
    /// CAP_SYS_NICE): far fewer late wakes on a shared CPU.
    #[arg(long, value_name = "PRIO")]
    realtime: Option<u8>,
    /// Highest rate a client may ask for, bytes/s per flow (k, M, G allowed).
    #[arg(long, value_parser = parse_rate, default_value = "1G")]
    max_rate: u64,
    /// Most flows at once from one client address [default: 16; the self-test: its flows].
    #[arg(long)]
    max_flows_per_addr: Option<u32>,
    /// Most flows at once from one /24 (IPv4) or /48 (IPv6) [default: 256].
    #[arg(long)]
    max_flows_per_prefix: Option<u32>,
    /// Most bytes/s of one client address's flows together (k, M, G) [default: 1G].
    #[arg(long, value_parser = parse_rate)]
    max_rate_per_addr: Option<u64>,
    /// Most bytes/s of one prefix's flows together (k, M, G) [default: 4G].
    #[arg(long, value_parser = parse_rate)]
    max_rate_per_prefix: Option<u64>,
    /// Answers per second per shard to addresses that have not proven themselves (cookies,
    /// refusals) [default: 10000].
    #[arg(long)]
    unproven_rate: Option<u32>,
    /// A flow whose client sent no keepalive for this many seconds ends [default: 10].
    #[arg(long)]
    consent_timeout: Option<f64>,
    /// Stop serving after this many seconds (default: until Ctrl-C). Not with --flows.
    #[arg(long = "for")]
    run_for: Option<f64>,
    /// Self-test: run this many clients here too and report.
    #[arg(short = 'n', long)]
    flows: Option<u32>,
    /// Self-test: stall the server once, this many seconds in ...
    #[arg(long, requires = "stall_ms")]
    stall_at: Option<f64>,
    /// ... for this many ms (each flow then sends at most its burst at once).
    #[arg(long, requires = "stall_at")]
    stall_ms: Option<f64>,
    #[command(flatten)]
    flow: FlowArgs,
}

#[derive(Args, Debug)]
struct RecvArgs {
    #[arg(help = "The server: IP, IP:PORT or [IPv6]:PORT.")]
    server: Peer,
    /// Port, if not in the address.
    #[arg(short = 'p', long)]
    port: Option<u16>,
    /// Flows: sockets, each its own client.
    #[arg(short = 'n', long, default_value_t = 100)]
    flows: u32,
    /// Local addresses for the flows' sockets, round robin (needed past 25,000 flows).
    #[arg(long = "local")]
    local: Vec<IpAddr>,
    #[command(flatten)]
    flow: FlowArgs,
}

/// `udpx bench stream`.
#[derive(Args, Debug)]
pub struct Fig4Args {
    /// Flows.
    #[arg(short = 'n', long, default_value_t = 40)]
    flows: u32,
    /// Bytes per second per flow (k, M, G allowed); 1.2M sends one 1200-byte datagram per ms.
    #[arg(short = 'r', long, value_parser = parse_rate, default_value = "1.2M")]
    rate: u64,
    /// Seconds per run.
    #[arg(short = 'l', long, default_value_t = 4.0)]
    duration: f64,
    /// Rounds: each runs every row once.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// The bottleneck's rate as a share of the offered load.
    #[arg(long, default_value_t = 0.9)]
    bottleneck: f64,
    /// tbf's bucket, bytes.
    #[arg(long, default_value_t = 15_000)]
    tbf_burst: u32,
    /// tbf's queue, ms of waiting.
    #[arg(long, default_value_t = 2.0)]
    tbf_latency_ms: f64,
    /// The capacity table's flows (at the paper's 1 MB/s each, over the veth pair).
    #[arg(long, default_value_t = 1000)]
    capacity_flows: u32,
    /// Only one of the two tables.
    #[arg(long, value_parser = ["fig4", "capacity"])]
    only: Option<String>,
    /// One JSON object instead of the tables.
    #[arg(long)]
    json: bool,
}

/// `udpx bench stream`: Figure 4 and the capacity table.
pub fn fig4(a: Fig4Args) -> ExitCode {
    const CMD: &str = "bench stream";
    let d = match duration("--duration", a.duration) {
        Ok(d) => d,
        Err(e) => return usage(CMD, e),
    };
    if !(a.tbf_latency_ms > 0.0 && a.tbf_latency_ms <= 1000.0) {
        return usage(CMD, format!("--tbf-latency-ms {}: give more than 0 and at most 1000", a.tbf_latency_ms));
    }
    let cfg = udpx_stream::fig4::Fig4Config {
        flows: a.flows,
        rate: a.rate,
        duration: d,
        rounds: a.repeat,
        bottleneck: a.bottleneck,
        tbf_burst: a.tbf_burst,
        tbf_latency: Duration::from_secs_f64(a.tbf_latency_ms / 1e3),
        ..Default::default()
    };
    // The flows' own checks (rate, size, flows) before any namespace is made.
    if let Err(e) = cfg.validate() {
        return exit_for(CMD, e);
    }
    let mut probe = RecvConfig::new("127.0.0.1:9".parse().expect("literal"), cfg.flows, cfg.rate, d);
    probe.interval = Some(Duration::from_millis(1));
    if let Err(e) = probe.validate() {
        return exit_for(CMD, e);
    }
    let cap = udpx_stream::capacity::CapacityConfig {
        flows: a.capacity_flows,
        duration: d,
        rounds: a.repeat,
        ..Default::default()
    };
    let cap_probe = RecvConfig::new("127.0.0.1:9".parse().expect("literal"), cap.flows, cap.rate, d);
    if let Err(e) = cap_probe.validate() {
        return exit_for(CMD, e);
    }
    crate::util::signal_cleanup(CMD);
    let mut progress = |l: &str| eprintln!("udpx {CMD}: {l}");
    let want = |t: &str| a.only.as_deref().is_none_or(|o| o == t);
    let f = if want("fig4") {
        match udpx_stream::fig4::run(&cfg, &mut progress) {
            Ok(f) => Some(f),
            Err(e) => return exit_for(CMD, e),
        }
    } else {
        None
    };
    let c = if want("capacity") {
        match udpx_stream::capacity::run(&cap, &mut progress) {
            Ok(c) => Some(c),
            Err(e) => return exit_for(CMD, e),
        }
    } else {
        None
    };
    if a.json {
        println!("{}", serde_json::json!({ "figure4": f, "capacity": c }));
        return ExitCode::SUCCESS;
    }
    if let Some(f) = &f {
        println!("{}", udpx_stream::fig4::text(f));
    }
    if let Some(c) = &c {
        println!("{}", udpx_stream::capacity::text(c));
    }
    if let Some(env) = f.as_ref().map(|f| &f.environment).or(c.as_ref().map(|c| &c.environment)) {
        println!("{}", env.to_markdown());
    }
    ExitCode::SUCCESS
}

fn parse_rate(s: &str) -> Result<u64, String> {
    let r = crate::util::decimal_suffixed(s)
        .ok_or_else(|| format!("{s:?} is not a rate: give bytes/s as 4000, 4k, 1.5M or 1G"))?;
    if !(0.0..1e18).contains(&r) {
        return Err(format!("{s:?}: give a rate from 0 to 1e18 bytes/s"));
    }
    Ok(r.round() as u64)
}

impl FlowArgs {
    /// The self-test flags given (they describe the clients a self-test runs, and mean nothing
    /// to a server alone, which takes each flow's numbers from its client's request).
    fn given(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let flags = [
            (self.rate.is_some(), "--rate"),
            (self.size.is_some(), "--size"),
            (self.interval_ms.is_some(), "--interval-ms"),
            (self.segments.is_some(), "--segments"),
            (self.burst.is_some(), "--burst"),
            (self.duration.is_some(), "--duration"),
            (self.json, "--json"),
            (self.svg.is_some(), "--svg"),
        ];
        for (given, flag) in flags {
            if given {
                v.push(flag);
            }
        }
        v
    }

    fn recv_config(&self, server: SocketAddr, flows: u32) -> Result<RecvConfig, String> {
        let rate = self.rate.ok_or("--rate is needed: bytes/s per flow, e.g. 4k")?;
        let mut c = RecvConfig::new(server, flows, rate, duration("--duration", self.duration.unwrap_or(10.0))?);
        c.size = self.size.unwrap_or(1200);
        c.segments = self.segments.unwrap_or(0);
        c.burst = self.burst.unwrap_or(0);
        if let Some(ms) = self.interval_ms {
            if !(ms.is_finite() && ms > 0.0 && ms <= 10_000.0) {
                return Err(format!("--interval-ms {ms}: give more than 0 and at most 10000"));
            }
            c.interval = Some(Duration::from_secs_f64(ms / 1e3));
        }
        if self.interval_ms.is_some() && c.segments > 0 {
            return Err("--interval-ms and --segments both set the batch: give one".into());
        }
        Ok(c)
    }
}

pub fn main(args: StreamArgs) -> ExitCode {
    match args.cmd {
        StreamCmd::Serve(a) => serve(a),
        StreamCmd::Recv(a) => recv(a),
    }
}

fn exit_for(cmd: &str, e: StreamError) -> ExitCode {
    match e {
        StreamError::Usage(m) => usage(cmd, m),
        StreamError::Skip(m) => {
            eprintln!("udpx {cmd}: SKIP: {m}");
            ExitCode::from(crate::exit::SKIPPED)
        }
        e => {
            eprintln!("udpx {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(a: ServeArgs) -> ExitCode {
    const CMD: &str = "stream serve";
    let mut cfg = ServeConfig::new(SocketAddr::new(a.bind, a.port));
    cfg.shards = a.shards;
    cfg.pacing = a.pacing;
    cfg.max_flows = a.max_flows;
    cfg.max_rate = a.max_rate;
    cfg.smoothing_pct = a.smoothing;
    cfg.realtime = a.realtime;
    if let (Some(at), Some(ms)) = (a.stall_at, a.stall_ms) {
        if !((0.0..3600.0).contains(&at) && ms > 0.0 && ms <= 10_000.0) {
            return usage(CMD, "--stall-at S --stall-ms MS: give 0 <= S < 3600 and 0 < MS <= 10000");
        }
        cfg.stall = Some((Duration::from_secs_f64(at), Duration::from_secs_f64(ms / 1e3)));
    }
    let limits = udpx_stream::Limits::default();
    cfg.limits = udpx_stream::Limits {
        flows_per_addr: a.max_flows_per_addr.unwrap_or(limits.flows_per_addr),
        flows_per_prefix: a.max_flows_per_prefix.unwrap_or(limits.flows_per_prefix),
        rate_per_addr: a.max_rate_per_addr.unwrap_or(limits.rate_per_addr),
        rate_per_prefix: a.max_rate_per_prefix.unwrap_or(limits.rate_per_prefix),
        unproven_per_sec: a.unproven_rate.unwrap_or(limits.unproven_per_sec),
    };
    if let Some(t) = a.consent_timeout {
        match duration("--consent-timeout", t) {
            Ok(d) => cfg.consent_timeout = d,
            Err(e) => return usage(CMD, e),
        }
    }
    let Some(flows) = a.flows else {
        if a.stall_at.is_some() {
            return usage(CMD, "--stall-at is for the self-test: give --flows too");
        }
        if let Some(flag) = a.flow.given().first() {
            return usage(
                CMD,
                format!(
                    "{flag} describes the self-test's clients: give --flows N too, or leave it out (a server \
                     takes each flow's numbers from its client's request; --max-rate caps them)"
                ),
            );
        }
        return serve_forever(cfg, a.run_for);
    };
    if a.run_for.is_some() {
        return usage(CMD, "--for is for a server alone; the self-test runs for --duration");
    }
    let recv = match a.flow.recv_config(cfg.bind, flows) {
        Ok(r) => r,
        Err(e) => return usage(CMD, e),
    };
    if udpx_lab::netns::is_root() {
        crate::util::signal_cleanup(CMD);
    }
    let slot = cfg.slot;
    let progress = Arc::new(Progress::default());
    let bar = progress_bar(&recv);
    let ticker = {
        let (p, bar, total) = (progress.clone(), bar.clone(), recv.duration);
        std::thread::spawn(move || tick(&p, &bar, total))
    };
    let res = lab::self_test(cfg, recv.clone(), progress.clone());
    progress.cancel.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    bar.finish_and_clear();
    let st = match res {
        Ok(s) => s,
        Err(e) => return exit_for(CMD, e),
    };
    let path = match st.path {
        lab::Path::Veth => "veth between two namespaces",
        lab::Path::Loopback => "loopback",
    };
    output(&a.flow, &recv, path, Some(&st.server), &st.receiver, slot);
    if let Some(d) = st.link_drops.filter(|&d| d > 0) {
        eprintln!("udpx {CMD}: the veth pair itself dropped {d} packets (its NAPI ring or backlog was full)");
    }
    if !st.exactly_once() {
        eprintln!("udpx {CMD}: not every datagram arrived exactly once (see lost / duplicates / unsent above)");
    }
    ExitCode::SUCCESS
}

fn serve_forever(cfg: ServeConfig, run_for: Option<f64>) -> ExitCode {
    const CMD: &str = "stream serve";
    let run_for = match run_for.map(|d| duration("--for", d)).transpose() {
        Ok(d) => d,
        Err(e) => return usage(CMD, e),
    };
    crate::util::raise_open_files("stream serve");
    let stop = crate::util::stop_on_signals();
    let port = cfg.bind.port();
    let server = match Server::start(cfg) {
        Ok(s) => s,
        Err(StreamError::Setup(m)) if m.contains("in use") => {
            return usage(CMD, format!("-p {port}: port in use; pick another ({m})"))
        }
        Err(e) => return exit_for(CMD, e),
    };
    eprintln!("udpx {CMD}: serving on {}", server.local_addr());
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) && run_for.is_none_or(|d| start.elapsed() < d) && !server.finished() {
        std::thread::sleep(Duration::from_millis(50));
    }
    match server.stop() {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => exit_for(CMD, e),
    }
}

fn recv(a: RecvArgs) -> ExitCode {
    const CMD: &str = "stream recv";
    let server = match a.server.addr(a.port, 4500) {
        Ok(s) => s,
        Err(e) => return usage(CMD, e),
    };
    let mut cfg = match a.flow.recv_config(server, a.flows) {
        Ok(c) => c,
        Err(e) => return usage(CMD, e),
    };
    cfg.local = a.local.clone();
    if let Err(e) = cfg.validate() {
        return exit_for(CMD, e);
    }
    let progress = Arc::new(Progress::default());
    let bar = progress_bar(&cfg);
    let ticker = {
        let (p, bar, total) = (progress.clone(), bar.clone(), cfg.duration);
        std::thread::spawn(move || tick(&p, &bar, total))
    };
    let stop = crate::util::stop_on_signals();
    let canceller = {
        let p = progress.clone();
        std::thread::spawn(move || {
            while !p.cancel.load(Ordering::Relaxed) {
                if stop.load(Ordering::Relaxed) {
                    p.cancel.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let res = udpx_stream::receive(&cfg, &progress);
    progress.cancel.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    let _ = canceller.join();
    bar.finish_and_clear();
    match res {
        Ok(r) => {
            output(&a.flow, &cfg, &format!("to {server}"), None, &r, Duration::from_micros(250));
            ExitCode::SUCCESS
        }
        Err(e) => exit_for(CMD, e),
    }
}

fn output(
    f: &FlowArgs,
    cfg: &RecvConfig,
    path: &str,
    server: Option<&udpx_stream::ServerReport>,
    r: &udpx_stream::RecvReport,
    slot: Duration,
) {
    if f.json {
        println!("{}", serde_json::to_string(&report::json(cfg, path, server, r, slot)).unwrap_or_default());
    } else {
        print!("{}", report::text(cfg, path, server, r, slot));
    }
    if let Some(p) = &f.svg {
        let title = format!("udpx stream: {} flows x {} B/s, {path}", cfg.flows, cfg.rate);
        match std::fs::write(p, report::svg(&r.tally, &title)) {
            Ok(()) => eprintln!("udpx stream: wrote {}", p.display()),
            Err(e) => eprintln!("udpx stream: could not write {}: {e}", p.display()),
        }
    }
}

fn progress_bar(cfg: &RecvConfig) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(cfg.duration.as_millis() as u64);
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_style(
            indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

fn tick(p: &Progress, bar: &indicatif::ProgressBar, total: Duration) {
    let start = Instant::now();
    while !p.cancel.load(Ordering::Relaxed) {
        bar.set_position((start.elapsed().min(total)).as_millis() as u64);
        bar.set_message(format!(
            "{} flows, {} datagrams, {:.1} MB",
            p.accepted.load(Ordering::Relaxed),
            p.datagrams.load(Ordering::Relaxed),
            p.bytes.load(Ordering::Relaxed) as f64 / 1e6
        ));
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("4000"), Ok(4000));
        assert_eq!(parse_rate("4k"), Ok(4000));
        assert_eq!(parse_rate("1.5M"), Ok(1_500_000));
        assert_eq!(parse_rate("1G"), Ok(1_000_000_000));
        for bad in ["", "k", "-1", "1T", "nan", "1e30"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }
}
