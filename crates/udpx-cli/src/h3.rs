//! `udpx h3`: the HTTP/3 file server and client (crates udpx-h3 and udpx-quic).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use udpx_h3::{GetConfig, ServeConfig, SiteOptions, Tls};
use udpx_quic::IoMode;

use crate::util::{self, duration};

#[derive(Args, Debug)]
pub struct H3Args {
    #[command(subcommand)]
    cmd: H3Cmd,
}

#[derive(Subcommand, Debug)]
enum H3Cmd {
    /// Serve the files under DIR over HTTP/3 (GET, HEAD), one event loop per shard.
    Serve(ServeArgs),
    /// Fetch one URL over HTTP/3 and print status, bytes, time and throughput.
    Get(GetArgs),
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Io {
    /// One sendmsg per packet.
    Sendmsg,
    /// sendmmsg: many packets per call.
    Sendmmsg,
    /// One GSO run (equal-size packets to one peer) per sendmsg.
    Gso,
    /// Several GSO runs per sendmmsg.
    GsoMmsg,
}

impl From<Io> for IoMode {
    fn from(i: Io) -> IoMode {
        match i {
            Io::Sendmsg => IoMode::Sendmsg,
            Io::Sendmmsg => IoMode::Sendmmsg,
            Io::Gso => IoMode::Gso,
            Io::GsoMmsg => IoMode::GsoMmsg,
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum OnOff {
    On,
    Off,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The directory to serve.
    dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:4433")]
    listen: SocketAddr,
    /// Certificate chain (PEM); with --key. Without both, a self-signed certificate is made.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM); with --cert.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// How packets leave.
    #[arg(long, value_enum, default_value_t = Io::GsoMmsg)]
    io: Io,
    /// Receive with UDP_GRO where the kernel has it.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    gro: OnOff,
    /// Event loops, one socket and thread each (1 to 256; default: one per CPU).
    #[arg(long)]
    shards: Option<usize>,
    /// QUIC-LB host ID written into every connection ID (0 to 65535).
    #[arg(long, default_value_t = 0)]
    host_id: u16,
    /// Largest UDP payload to send (1200 to 65527).
    #[arg(long, default_value_t = udpx_h3::server::DEFAULT_MAX_UDP_PAYLOAD)]
    max_udp_payload: usize,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(short = 'l', long)]
    duration: Option<f64>,
    /// Append a line per request to this file (`-`: standard output): time, client, method,
    /// path, status, body bytes, duration, protocol.
    #[arg(long, value_name = "FILE")]
    access_log: Option<PathBuf>,
    /// The cache-control of file responses (200, 206, 304).
    #[arg(long, default_value = "no-cache")]
    cache_control: String,
    /// Also serve the same files over HTTPS on TCP at this address (HTTP/1.1 and HTTP/2, the
    /// same certificate), every answer announcing HTTP/3 with `alt-svc`: a browser that starts
    /// on TCP moves to HTTP/3 by itself.
    #[arg(long, value_name = "ADDR")]
    alt_svc_tcp: Option<SocketAddr>,
    /// A file holding the stateless reset key (64 hex digits) that every host of the service
    /// shares: a host then ends, with a stateless reset, connections a balancer sends it that it
    /// does not have (their host was removed or restarted), instead of leaving the client to its
    /// idle timeout.
    #[arg(long, value_name = "FILE")]
    reset_key_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (`GET /metrics`): each shard's socket and QUIC
    /// counters, and the HTTP responses by status class.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
}

#[derive(Args, Debug)]
struct GetArgs {
    // The help as an attribute, not a doc comment: rustdoc would read `[:PORT]` as a link.
    #[arg(help = "https://HOST[:PORT]/PATH")]
    url: String,
    /// Write the body here (default: count it and discard it).
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
    /// How packets leave.
    #[arg(long, value_enum, default_value_t = Io::GsoMmsg)]
    io: Io,
    /// Receive with UDP_GRO where the kernel has it.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    gro: OnOff,
    /// Largest UDP payload to send (1200 to 65527).
    #[arg(long, default_value_t = udpx_h3::server::DEFAULT_MAX_UDP_PAYLOAD)]
    max_udp_payload: usize,
    /// One JSON object (with the client's counters) instead of the line.
    #[arg(long)]
    json: bool,
    /// Send HEAD instead of GET.
    #[arg(long)]
    head: bool,
    /// Add a request header field, `NAME: VALUE` (repeatable), e.g. -H 'range: bytes=0-99'.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Print the response's header fields (to standard error).
    #[arg(short = 'i', long)]
    include: bool,
}

/// `udpx bench h3`.
#[derive(Args, Debug)]
pub struct H3BenchArgs {
    /// Bytes of the file downloaded per row and round (k, M, G: decimal; 100M = 10^8 bytes).
    #[arg(long, value_parser = util::parse_size_arg, default_value = "100M")]
    size: u64,
    /// Rounds: each downloads once per row, interleaved; the table shows medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    repeat: u64,
    /// Over a veth pair between two namespaces (needs root). As root this is the default,
    /// as for `udpx bench`; without root the bench runs on loopback.
    #[arg(long, conflicts_with = "loopback")]
    veth: bool,
    /// On loopback even as root (there the client's receive work is charged to the server).
    #[arg(long)]
    loopback: bool,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// `udpx bench h3`: runs [`udpx_h3::bench`] and prints its table or JSON.
pub fn bench(a: H3BenchArgs) -> ExitCode {
    const CMD: &str = "bench h3";
    let root = udpx_lab::netns::is_root();
    if a.veth && !root {
        eprintln!("udpx {CMD}: --veth needs root (network namespaces): skipped");
        return ExitCode::from(crate::exit::SKIPPED);
    }
    let veth = a.veth || (root && !a.loopback);
    if veth {
        if let Err(e) = udpx_lab::netns::cleanup_on_signals() {
            eprintln!("udpx {CMD}: warning: no signal cleanup: {e}");
        }
    }
    let cfg = udpx_h3::bench::H3BenchConfig {
        size: a.size,
        repeat: a.repeat as usize,
        veth,
        ..udpx_h3::bench::H3BenchConfig::new()
    };
    let b = match udpx_h3::bench::run(&cfg, &mut |l| eprintln!("udpx {CMD}: {l}")) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("udpx {CMD}: {e}");
            return ExitCode::FAILURE;
        }
    };
    for l in &b.left_out {
        eprintln!("udpx {CMD}: left out {}: {}", l.rows, l.why);
    }
    if a.json {
        println!("{}", serde_json::json!({ "h3_bench": b }));
    } else {
        println!("{}", udpx_h3::bench::table(&b));
        println!("{}", b.environment.to_markdown());
    }
    ExitCode::SUCCESS
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    util::usage("h3", msg)
}

pub fn main(a: H3Args) -> ExitCode {
    match a.cmd {
        H3Cmd::Serve(s) => serve(s),
        H3Cmd::Get(g) => get(g),
    }
}

fn check_payload(n: usize) -> Result<(), String> {
    if !(1200..=65_527).contains(&n) {
        return Err(format!("--max-udp-payload {n}: give 1200 (QUIC's minimum) to 65527"));
    }
    Ok(())
}

fn serve(a: ServeArgs) -> ExitCode {
    let shards = a.shards.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(256));
    if !(1..=256).contains(&shards) {
        return usage(format!("--shards {shards}: give 1 to 256 (the connection ID's worker byte numbers them)"));
    }
    if let Err(e) = check_payload(a.max_udp_payload) {
        return usage(e);
    }
    let dur = match a.duration.map(|d| duration("--duration", d)).transpose() {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let tls = match (a.cert, a.key) {
        (Some(cert), Some(key)) => Tls::Files { cert, key },
        _ => Tls::SelfSigned,
    };
    let reset_key = match &a.reset_key_file {
        None => None,
        Some(p) => {
            match std::fs::read_to_string(p).map_err(|e| e.to_string()).and_then(|t| udpx_quic::ResetKey::from_hex(&t))
            {
                Ok(k) => Some(k),
                Err(e) => return usage(format!("--reset-key-file {}: {e}", p.display())),
            }
        }
    };
    let cfg = ServeConfig {
        listen: a.listen,
        tls,
        io: a.io.into(),
        gro: a.gro == OnOff::On,
        shards,
        host_id: a.host_id,
        max_udp_payload: a.max_udp_payload,
        site: SiteOptions { cache_control: a.cache_control, access_log: a.access_log },
        reset_key,
        alt_svc_tcp: a.alt_svc_tcp,
    };
    // SIGINT and SIGTERM are blocked before the shard threads start (they inherit the mask),
    // and one thread below takes them: the server then stops cleanly and prints its counters.
    let stop = crate::util::stop_on_signals();
    let server = match udpx_h3::serve(&a.dir, &cfg) {
        Ok(s) => s,
        Err(e) if e.is_usage() => return util::usage("h3 serve", e),
        Err(e) => {
            eprintln!("udpx h3 serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    if server.generated_cert() {
        eprintln!(
            "udpx h3 serve: no --cert/--key: generated a self-signed certificate for localhost, 127.0.0.1 \
             and ::1 (for local use; clients must skip verification)"
        );
    }
    eprintln!(
        "udpx h3 serve: {} on https://{} ({} shards, I/O {}, GRO {}, host ID {})",
        a.dir.display(),
        server.local_addr(),
        shards,
        cfg.io,
        if cfg.gro { "on" } else { "off" },
        cfg.host_id
    );
    if let Some(t) = server.tcp_addr() {
        eprintln!("udpx h3 serve: also HTTPS over TCP on https://{t} (HTTP/1.1, HTTP/2; alt-svc names the QUIC port)");
    }
    let metrics = match a.metrics.map(|addr| server.serve_metrics(addr)).transpose() {
        Ok(m) => m,
        Err(e) => {
            drop(server.stop());
            return usage(format!("--metrics: {e}; pick another address"));
        }
    };
    if let Some(m) = &metrics {
        eprintln!("udpx h3 serve: metrics on http://{}/metrics", m.local_addr());
    }
    let start = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) && dur.is_none_or(|d| start.elapsed() < d) && server.is_running() {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(metrics);
    match server.stop() {
        Ok(c) => {
            println!("{}", serde_json::json!({ "h3_serve": c }));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("udpx h3 serve: {e}");
            ExitCode::FAILURE
        }
    }
}

fn get(a: GetArgs) -> ExitCode {
    if let Err(e) = check_payload(a.max_udp_payload) {
        return usage(e);
    }
    let mut headers = Vec::with_capacity(a.headers.len());
    for h in &a.headers {
        match h.split_once(':') {
            Some((n, v)) if !n.trim().is_empty() && !n.starts_with(':') => {
                headers.push((n.trim().to_string(), v.trim().to_string()));
            }
            _ => return usage(format!("-H {h:?}: write a header field as 'NAME: VALUE', e.g. -H 'range: bytes=0-99'")),
        }
    }
    let cfg = GetConfig {
        io: a.io.into(),
        gro: a.gro == OnOff::On,
        max_udp_payload: a.max_udp_payload,
        head: a.head,
        headers,
    };
    let r = match udpx_h3::get(&a.url, a.output.as_deref(), &cfg) {
        Ok(r) => r,
        Err(e) if e.is_usage() => return util::usage("h3 get", e),
        Err(e) => {
            eprintln!("udpx h3 get: {e}");
            return ExitCode::FAILURE;
        }
    };
    if a.include {
        eprintln!("status: {}", r.status);
        for (n, v) in &r.headers {
            eprintln!("{n}: {v}");
        }
    }
    if a.json {
        println!("{}", serde_json::json!({ "h3_get": r }));
    } else {
        println!("{}: {r}", a.url);
    }
    if r.status >= 400 {
        eprintln!("udpx h3 get: {} answered {}", a.url, r.status);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use crate::util::parse_size_arg as parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100M"), Ok(100_000_000));
        assert_eq!(parse_size("2k"), Ok(2000));
        assert_eq!(parse_size("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_size("7"), Ok(7));
        for bad in ["0", "-1M", "M", "1T", "200G", ""] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
