//! `udpx`: thin subcommands over the udpx libraries.
//!
//! Exit codes: 0 success, 1 failure, 2 usage error (a flag out of range: the message names it
//! and what is allowed), 4 skipped (a feature this machine lacks; the message says which).

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod bench;
mod echo;

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

/// Helpers every subcommand shares.
pub mod util {
    use std::process::ExitCode;
    use std::time::Duration;

    /// Prints `udpx <cmd>: <msg>` and returns the usage exit code.
    pub fn usage(cmd: &str, msg: impl std::fmt::Display) -> ExitCode {
        eprintln!("udpx {cmd}: {msg}");
        ExitCode::from(super::exit::USAGE)
    }

    /// A duration flag: seconds, more than 0 and at most an hour.
    pub fn duration(flag: &str, secs: f64) -> Result<Duration, String> {
        if !(secs > 0.0 && secs <= 3600.0) {
            return Err(format!("{flag} {secs}: give a duration in seconds, more than 0 and at most 3600"));
        }
        Ok(Duration::from_secs_f64(secs))
    }

    /// Whether `program` is an executable file on PATH.
    pub fn which(program: &str) -> bool {
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file())).unwrap_or(false)
    }
}

/// Exit codes.
pub mod exit {
    /// A flag out of range or a malformed command line.
    pub const USAGE: u8 = 2;
    /// A feature this machine lacks.
    pub const SKIPPED: u8 = 4;
}

fn main() -> ExitCode {
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
        Cmd::Probe(args) => {
            let opts = udpx_bench::probe::ProbeOptions { devices: args.devices, json: args.json };
            udpx_bench::probe::run(&opts)
        }
    }
}
