//! `udpx`: thin subcommands over the udpx libraries.
//!
//! Exit codes: 0 success, 1 failure, 2 usage error (a flag out of range: the message names it
//! and what is allowed), 4 skipped (a feature this machine lacks; the message says which).

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[cfg(all(feature = "mimalloc", not(feature = "count-allocations")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod echo;
pub mod exit;
#[cfg(feature = "quic")]
mod h3;
#[cfg(feature = "quic")]
mod host_flags;
#[cfg(feature = "quic")]
mod lb;
mod logger;
#[cfg(feature = "quic")]
mod notify;
mod stream;
#[cfg(feature = "quic")]
mod supervise;
pub mod util;

#[derive(Parser, Debug)]
#[command(name = "udpx", version, about = "UDP at the cost per byte of TCP: bench, probe and tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Reproduce the paper's tables on this machine: TCP, UDP, sendmmsg, GSO, GRO and iperf3,
    /// side by side over a veth pair between two namespaces (root) or loopback.
    Bench(bench::BenchArgs),
    /// What this kernel and its devices support for fast UDP, and what to tune.
    Probe(ProbeArgs),
    /// UDP transactions at scale: a reuseport-sharded echo server, its load generator, and the
    /// table of modes (with sockperf's server as a reference).
    Echo(echo::EchoArgs),
    /// Paced delivery to many flows: a streaming server, its receiver, and a self-test.
    Stream(stream::StreamArgs),
    /// HTTP/3 on the udpx datapath: a file server (quiche, one event loop per shard, the I/O
    /// modes of the Cloudflare post) and a client.
    #[cfg(feature = "quic")]
    H3(h3::H3Args),
    /// QUIC routed by connection ID across hosts: nftables rules for a Linux balancer, and
    /// where a connection ID or packet goes.
    #[cfg(feature = "quic")]
    Lb(lb::LbArgs),
    /// HTTP/3 (not in this build: see `udpx h3`'s message).
    #[cfg(not(feature = "quic"))]
    #[command(hide = true, disable_help_flag = true)]
    H3(util::WithoutQuic),
    /// QUIC routing (not in this build: see `udpx lb`'s message).
    #[cfg(not(feature = "quic"))]
    #[command(hide = true, disable_help_flag = true)]
    Lb(util::WithoutQuic),
}

#[derive(Args, Debug)]
struct ProbeArgs {
    /// Devices to inspect (default: every device).
    #[arg(short = 'd', long = "dev")]
    devices: Vec<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    logger::init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.cmd {
        Cmd::Bench(args) => bench::main(args),
        Cmd::Echo(args) => echo::main(args),
        Cmd::Stream(args) => stream::main(args),
        #[cfg(feature = "quic")]
        Cmd::H3(args) => h3::main(args),
        #[cfg(feature = "quic")]
        Cmd::Lb(args) => lb::main(args),
        #[cfg(not(feature = "quic"))]
        Cmd::H3(_) => util::without_quic("h3"),
        #[cfg(not(feature = "quic"))]
        Cmd::Lb(_) => util::without_quic("lb"),
        Cmd::Probe(args) => {
            let opts = udpx_bench::probe::ProbeOptions { devices: args.devices, json: args.json };
            udpx_bench::probe::run(&opts)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::util::Peer;

    #[test]
    fn peers_parse_with_and_without_port() {
        let p: Peer = "127.0.0.1".parse().unwrap();
        assert_eq!(p.addr(None, 7).unwrap(), "127.0.0.1:7".parse().unwrap());
        assert_eq!(p.addr(Some(9), 7).unwrap(), "127.0.0.1:9".parse().unwrap());
        let p: Peer = "127.0.0.1:9".parse().unwrap();
        assert_eq!(p.addr(None, 7).unwrap(), "127.0.0.1:9".parse().unwrap());
        assert_eq!(p.addr(Some(9), 7).unwrap(), "127.0.0.1:9".parse().unwrap());
        assert!(p.addr(Some(10), 7).unwrap_err().contains("disagree"));
        let p: Peer = "[::1]:443".parse().unwrap();
        assert_eq!(p.addr(None, 7).unwrap(), "[::1]:443".parse().unwrap());
        let p: Peer = "::1".parse().unwrap();
        assert_eq!(p.addr(None, 7).unwrap(), "[::1]:7".parse().unwrap());
        for bad in ["", "localhost", "1.2.3.4:", "1.2.3.4:70000", "[::1]", "::1:9:x"] {
            assert!(bad.parse::<Peer>().is_err(), "{bad:?} accepted");
        }
    }
}
