//! `udpx lb`: rules for a Linux balancer that routes QUIC by connection ID (crate udpx-lb),
//! and an explainer of where a connection ID or packet goes.

use std::net::Ipv4Addr;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use udpx_lb::{check, Balancer, Host, Mode};

use crate::util;

#[derive(Args, Debug)]
pub struct LbArgs {
    #[command(subcommand)]
    cmd: LbCmd,
}

#[derive(Subcommand, Debug)]
enum LbCmd {
    /// Print an nftables ruleset (for `nft -f`) that routes QUIC to hosts by the server ID in
    /// their connection IDs, and the `ip rule`/`ip route` lines of the stateless mode.
    Nft(NftArgs),
    /// Explain which host a connection ID or a captured UDP payload reaches, and why.
    Check(CheckArgs),
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ModeArg {
    /// Mark and policy-route, no conntrack; every host holds the VIP (direct server return).
    Stateless,
    /// DNAT each new flow to its host's address; conntrack keeps the state.
    Dnat,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Stateless => Mode::Stateless,
            ModeArg::Dnat => Mode::Dnat,
        }
    }
}

#[derive(Args, Debug)]
struct NftArgs {
    /// The service address clients send to (IPv4).
    #[arg(long)]
    vip: Ipv4Addr,
    /// The service's UDP port.
    #[arg(long, default_value_t = 443)]
    port: u16,
    /// A host: its server ID (`udpx h3 serve --host-id`, decimal or 0x hex) = its address
    /// seen from the balancer. Repeat for each host; a host's firewall mark and routing table
    /// are 0x10000 + its ID, so taking one out moves no other.
    #[arg(long = "host", value_name = "ID=NEXTHOP", value_parser = parse_host)]
    hosts: Vec<Host>,
    /// A host being drained (its server ID, as in --host): it keeps every packet its connection
    /// IDs name and gets no new connection. Repeat for each; remove its --host once its
    /// connections have ended.
    #[arg(long = "draining", value_name = "ID", value_parser = udpx_lb::nft::parse_id)]
    draining: Vec<u16>,
    /// How packets reach the hosts.
    #[arg(long, value_enum, default_value_t = ModeArg::Stateless)]
    mode: ModeArg,
    /// The hash seed (hex, e.g. 0x1234abcd) for Initials and the 4-tuple fallback: give the
    /// one printed in the last rules' head when regenerating them, so a reload keeps hashed
    /// packets on their hosts. Without it a random one is drawn (and printed).
    #[arg(long, value_parser = parse_seed)]
    seed: Option<u32>,
}

fn parse_seed(s: &str) -> Result<u32, String> {
    let hex = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    u32::from_str_radix(hex, 16).map_err(|_| format!("--seed {s:?}: give 1 to 8 hex digits, e.g. 0x1234abcd"))
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["cid", "packet"]))]
struct CheckArgs {
    /// The hosts, as for `udpx lb nft`.
    #[arg(long = "host", value_name = "ID=NEXTHOP", value_parser = parse_host)]
    hosts: Vec<Host>,
    /// The draining hosts, as for `udpx lb nft`.
    #[arg(long = "draining", value_name = "ID", value_parser = udpx_lb::nft::parse_id)]
    draining: Vec<u16>,
    /// A connection ID in hex (as a short header's DCID).
    #[arg(long)]
    cid: Option<String>,
    /// A UDP payload in hex, as captured (the QUIC packet, without IP and UDP headers).
    #[arg(long)]
    packet: Option<String>,
}

fn parse_host(s: &str) -> Result<Host, String> {
    s.parse()
}

fn usage(sub: &str, msg: impl std::fmt::Display) -> ExitCode {
    util::usage(&format!("lb {sub}"), msg)
}

pub fn main(a: LbArgs) -> ExitCode {
    match a.cmd {
        LbCmd::Nft(n) => nft(n),
        LbCmd::Check(c) => check(c),
    }
}

fn nft(a: NftArgs) -> ExitCode {
    let seed = match a.seed {
        Some(s) => s,
        None => {
            let mut b = [0u8; 4];
            if let Err(e) = udpx_quic::cid::random_bytes(&mut b) {
                eprintln!("udpx lb nft: no random seed ({e}); give --seed");
                return ExitCode::FAILURE;
            }
            u32::from_ne_bytes(b)
        }
    };
    let b = match Balancer::new(a.vip, a.port, a.hosts, a.mode.into()).and_then(|b| b.with_draining(&a.draining)) {
        Ok(b) => b.with_seed(seed),
        Err(e) => return usage("nft", e),
    };
    print!("{}", b.ruleset());
    let routes = b.routes();
    if !routes.is_empty() {
        println!();
        // Commented out: the file stays loadable by `nft -f`; run these lines in a shell.
        for line in routes.lines() {
            if line.starts_with('#') {
                println!("{line}");
            } else {
                println!("#   {line}");
            }
        }
        println!("# Every host: ip addr add {}/32 dev lo (the VIP, for direct server return)", b.vip());
    }
    ExitCode::SUCCESS
}

fn check(a: CheckArgs) -> ExitCode {
    // The VIP and port do not change the answer: any will do.
    let b = match Balancer::new(Ipv4Addr::UNSPECIFIED, 443, a.hosts, Mode::Stateless)
        .and_then(|b| b.with_draining(&a.draining))
    {
        Ok(b) => b,
        Err(e) => return usage("check", e),
    };
    let (flag, text) = match (&a.cid, &a.packet) {
        (Some(c), _) => ("--cid", c),
        (None, Some(p)) => ("--packet", p),
        (None, None) => return usage("check", "give --cid HEX or --packet HEX"),
    };
    let bytes = match check::parse_hex(text) {
        Ok(b) => b,
        Err(e) => return usage("check", format!("{flag} {e}")),
    };
    let route = if a.cid.is_some() { check::cid(&b, &bytes) } else { check::packet(&b, &bytes) };
    println!("{route}");
    let ids = |hosts: &[Host]| hosts.iter().map(|h| h.id.to_string()).collect::<Vec<_>>().join(", ");
    match route.host() {
        Some(h) if b.is_draining(h.id) => {
            println!("host {} is draining: its connections carry on there; it gets no new connection", h.id)
        }
        Some(h) => println!("host {} takes new connections", h.id),
        None => println!("hashed over the hosts that take new connections: {}", ids(&b.taking())),
    }
    ExitCode::SUCCESS
}

/// `udpx bench lb`.
#[derive(Args, Debug)]
pub struct LbBenchArgs {
    /// Packets sent through the balancer per cost run (50,000 at least: CPU time is read in
    /// 10 ms clock ticks).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(50_000..=10_000_000))]
    packets: u64,
    /// Cost runs per ruleset, interleaved.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=50))]
    rounds: u64,
    /// Downloads rebound mid-way, per ruleset.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=100))]
    rebinds: u64,
    /// Small downloads for the spread over hosts.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..=1000))]
    connections: u64,
    /// One JSON object instead of the tables.
    #[arg(long)]
    json: bool,
}

/// `udpx bench lb`: runs [`udpx_lb::bench`] and prints its tables or JSON.
pub fn bench(a: LbBenchArgs) -> ExitCode {
    const CMD: &str = "bench lb";
    if !udpx_lab::netns::is_root() {
        eprintln!("udpx {CMD}: needs root (network namespaces and nft): skipped");
        return ExitCode::from(crate::exit::SKIPPED);
    }
    if let Some(t) = udpx_lb::bench::missing_tool() {
        eprintln!("udpx {CMD}: {t} is not installed (scripts/setup.sh installs it): skipped");
        return ExitCode::from(crate::exit::SKIPPED);
    }
    crate::util::signal_cleanup(CMD);
    let udpx = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("udpx {CMD}: where is this binary? {e}");
            return ExitCode::FAILURE;
        }
    };
    let cfg = udpx_lb::bench::LbBenchConfig {
        packets: a.packets,
        rounds: a.rounds as usize,
        rebinds: a.rebinds as usize,
        connections: a.connections as usize,
        ..udpx_lb::bench::LbBenchConfig::new(udpx)
    };
    let res = udpx_lb::bench::run(&cfg, &mut |l| eprintln!("udpx {CMD}: {l}"));
    util::print_bench(CMD, res, a.json, "lb_bench", udpx_lb::bench::LbBench::to_markdown)
}
