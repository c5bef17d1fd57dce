//! `udpx`: thin subcommands over the udpx libraries.
//!
//! Exit codes: 0 success, 1 failure, 2 usage error (a flag out of range: the message names it
//! and what is allowed), 4 skipped (a feature this machine lacks; the message says which).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "udpx",
    version,
    about = "UDP at the cost per byte of TCP: bench, probe and tools"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// What this kernel supports for fast UDP (GSO, GRO, txtime, zerocopy) and what to tune.
    Probe {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.cmd {
        Cmd::Probe { json } => probe(json),
    }
}

fn probe(json: bool) -> ExitCode {
    let k = udpx::KernelCaps::get();
    if json {
        let v = serde_json::json!({
            "gso_max_segments": k.gso_max_segments,
            "gso_limit_measured": k.gso_limit_measured,
            "gro": k.gro,
            "txtime": k.txtime,
            "zerocopy": k.zerocopy,
        });
        println!("{v}");
    } else {
        println!("{k:#?}");
    }
    ExitCode::SUCCESS
}
