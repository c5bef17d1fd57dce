//! `udpx bench lb`: the balancer's figures in the lab ([`crate::lab`]), side by side in one
//! run, with the environment recorded.
//!
//! 1. **Cost per packet.** The same short-header packets (1200 bytes, server IDs of the hosts
//!    in turn) are sent from the client namespace through the balancer, alternately with the
//!    generated CID rules and with a CID-blind 4-tuple jhash ruleset, `rounds` times each,
//!    interleaved. Each run's cost is the machine's busy CPU time (user + system + irq +
//!    softirq over every CPU, `/proc/stat`) over its packets: the sender's system calls, both
//!    veth hops, the forwarding and the host's drop are the same for both rulesets, so the
//!    difference of the two is what reading the connection ID costs the balancer. No server
//!    listens while packets are sent: the hosts drop them.
//! 2. **Rebinding.** Downloads whose client moves to a new address and port mid-way (a NAT
//!    rebinding, [`Lab::rebind_client_port`]) through each ruleset: the share that completes.
//!    Goal: 100 % through the CID rules. Through the 4-tuple rules a moved connection survives
//!    only when its new 4-tuple hashes to the same host (by chance); elsewhere it is reset
//!    (the hosts share a reset key), so each try is short.
//! 3. **Spread.** Small downloads through the CID rules: connections per host (the Initials'
//!    4-tuple hash) and the largest host's share over the mean.
//!
//! Timings are reported, never judged: only the rebinding goal has a verdict.
//!
//! Steal: a cost run's cost is the whole machine's, so its steal is every online CPU's over
//! the run ([`udpx_lab::steal`]). A run over the limit is marked and left out of the median
//! and the spread, and extra rounds (at most as many again) make it up.

use std::net::UdpSocket;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use udpx_lab::cpu::{CpuSample, TickRate};
use udpx_lab::env::Environment;
use udpx_lab::netns::Error;
use udpx_lab::stats::{another_round, Kept, Run, Spread};
use udpx_lab::steal::Steal;
use udpx_quic::cid::ServerCid;

use crate::lab::{host_id, Lab, LabConfig, CLIENT_REBOUND, PORT, VIP};
use crate::Mode;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct LbBenchConfig {
    /// The `udpx` binary the servers and clients run.
    pub udpx: PathBuf,
    /// Packets sent per cost run (enough for tens of clock ticks of busy time: fewer leave the
    /// run unmeasured, NaN).
    pub packets: u64,
    /// Cost runs per ruleset, interleaved.
    pub rounds: usize,
    /// Rebinding downloads per ruleset.
    pub rebinds: usize,
    /// Small downloads for the spread.
    pub connections: usize,
}

impl LbBenchConfig {
    /// 200,000 packets per run, 3 rounds, 6 rebinding downloads per ruleset, 30 connections.
    pub fn new(udpx: PathBuf) -> LbBenchConfig {
        LbBenchConfig { udpx, packets: 200_000, rounds: 3, rebinds: 6, connections: 30 }
    }
}

/// One ruleset's cost runs.
#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    /// `cid` or `4-tuple`.
    pub rules: &'static str,
    /// Busy CPU nanoseconds per packet, each run.
    pub ns_per_packet: Vec<f64>,
    /// The steal from every online CPU over each run, in the same order (`steal_s`,
    /// `steal_share`, `stolen`).
    pub steal: Vec<Steal>,
    /// The median and spread of the clean runs.
    pub spread: Spread,
    /// Runs planned, clean, stolen and failed (unmeasured: too short for the clock tick).
    pub kept: Kept,
    /// Packets the balancer forwarded per host, summed over runs (the lab's own counters).
    pub forwarded: Vec<u64>,
}

/// Rebinding through one ruleset.
#[derive(Debug, Clone, Serialize)]
pub struct RebindRow {
    /// `cid` or `4-tuple`.
    pub rules: &'static str,
    /// Downloads that completed byte for byte.
    pub survived: usize,
    /// Downloads tried.
    pub tried: usize,
    /// Downloads whose packets reached another host after the rebinding (the lab's own
    /// forwarding counters).
    pub reached_another_host: usize,
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct LbBench {
    /// What ran.
    pub config: LbBenchConfig,
    /// The machine and the balancer's device.
    pub env: Environment,
    /// Cost per packet, CID rules first.
    pub cost: Vec<CostRow>,
    /// Median CID cost over median 4-tuple cost.
    pub cost_ratio: f64,
    /// Median CID cost less median 4-tuple cost, ns per packet.
    pub cost_delta_ns: f64,
    /// Rebinding, CID rules first.
    pub rebinding: Vec<RebindRow>,
    /// Connections per host for the spread.
    pub spread: Vec<u64>,
    /// The largest host's connections over the mean.
    pub spread_max_over_mean: f64,
}

/// Runs the bench (needs root, `nft`, `tc`, `ss`); `log` gets progress lines.
pub fn run(cfg: &LbBenchConfig, log: &mut dyn FnMut(&str)) -> Result<LbBench, Error> {
    let bad = |why: String| Error::InvalidConfig { why };
    if cfg.packets == 0 || cfg.rounds == 0 || cfg.rebinds == 0 || cfg.connections == 0 {
        return Err(bad("packets, rounds, rebinds and connections must each be at least 1".into()));
    }
    let scratch = std::env::temp_dir().join(udpx_lab::netns::unique_name("lb-bench"));
    std::fs::create_dir_all(scratch.join("www")).map_err(|e| bad(format!("{}: {e}", scratch.display())))?;
    let _cleanup = RemoveDir(scratch.clone());
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for (name, len) in [("file", big.len()), ("small", 20_000)] {
        std::fs::write(scratch.join("www").join(name), &big[..len]).map_err(|e| bad(format!("{name}: {e}")))?;
    }
    let rate = TickRate::system().map_err(cpu_error)?;

    log("cost per packet: CID rules against 4-tuple rules, interleaved");
    let lab = Lab::setup(&LabConfig { hosts: 3, mode: Mode::Stateless })?;
    let env = Environment::collect(&[(Some(lab.balancer()), lab.balancer_client_dev())]);
    let cost = measure_cost(&lab, cfg, rate, log)?;
    let (cid, four) = (cost[0].spread.median, cost[1].spread.median);

    log("rebinding mid-download through each ruleset");
    let mut lab = lab;
    lab.limit_client_rate(4_000_000)?;
    lab.start_servers(&cfg.udpx, &scratch.join("www"), 600)?;
    let mut rebinding = Vec::new();
    for (rules, four_tuple) in [("cid", false), ("4-tuple", true)] {
        if four_tuple {
            lab.use_four_tuple_rules()?;
        } else {
            lab.use_cid_rules()?;
        }
        let (mut survived, mut moved_host) = (0, 0);
        for k in 0..cfg.rebinds {
            let out = scratch.join(format!("rebind-{rules}-{k}"));
            let p0 = lab.host_packets()?;
            let g = lab.download("file", &out)?;
            std::thread::sleep(Duration::from_millis(700));
            // A fresh address and port each time: each try is a new draw of the 4-tuple hash.
            let addr = std::net::Ipv4Addr::new(10, 78, 0, CLIENT_REBOUND.octets()[3] + (k % 200) as u8);
            let p1 = lab.host_packets()?;
            let moved = lab.rebind_client_port(addr, 40_000 + k as u16);
            let ok = g.wait().map(|s| s.success()).unwrap_or(false);
            moved?;
            let p2 = lab.host_packets()?;
            lab.undo_rebind()?;
            let home: Vec<bool> = p1.iter().zip(&p0).map(|(a, b)| a > b).collect();
            if p2.iter().zip(&p1).zip(&home).any(|((a, b), h)| a > b && !h) {
                moved_host += 1;
            }
            if ok && std::fs::read(&out).is_ok_and(|b| b == big) {
                survived += 1;
            } else {
                let why = std::fs::read_to_string(out.with_extension("err")).unwrap_or_default();
                log(&format!("{rules} rules: download {k} did not arrive whole: {}", why.trim()));
            }
        }
        log(&format!(
            "{rules} rules: {survived} of {} downloads survived the rebinding; {moved_host} reached another host",
            cfg.rebinds
        ));
        rebinding.push(RebindRow { rules, survived, tried: cfg.rebinds, reached_another_host: moved_host });
    }

    log("spread of new connections over the hosts");
    lab.use_cid_rules()?;
    lab.stop_servers();
    lab.start_servers(&cfg.udpx, &scratch.join("www"), 600)?;
    for k in 0..cfg.connections.div_ceil(3) {
        let clients: Vec<_> = (0..3)
            .filter(|j| 3 * k + j < cfg.connections)
            .map(|j| lab.download("small", &scratch.join(format!("small-{k}-{j}"))))
            .collect::<Result<_, _>>()?;
        for c in clients {
            let _ = c.wait();
        }
    }
    let spread: Vec<u64> = lab
        .stop_servers()
        .iter()
        .map(|(out, _)| {
            let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
            v["h3_serve"]["quic"]["connections"].as_u64().unwrap_or(0)
        })
        .collect();
    let mean = spread.iter().sum::<u64>() as f64 / spread.len() as f64;
    let max = spread.iter().copied().max().unwrap_or(0) as f64;
    Ok(LbBench {
        config: cfg.clone(),
        env,
        cost,
        cost_ratio: cid / four,
        cost_delta_ns: cid - four,
        rebinding,
        spread_max_over_mean: if mean > 0.0 { max / mean } else { f64::NAN },
        spread,
    })
}

/// The cost phase: `cfg.rounds` rounds (more while [`another_round`] asks) of `cfg.packets`
/// packets through the CID rules and the 4-tuple rules in turn; one row per ruleset, CID
/// first, with its runs, what each host was forwarded, and the spread of its clean runs.
fn measure_cost(
    lab: &Lab,
    cfg: &LbBenchConfig,
    rate: TickRate,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<CostRow>, Error> {
    let mut cost: Vec<CostRow> = ["cid", "4-tuple"]
        .into_iter()
        .map(|rules| CostRow {
            rules,
            ns_per_packet: Vec::new(),
            steal: Vec::new(),
            spread: Spread::of(&[]),
            kept: Kept::default(),
            forwarded: vec![0; 3],
        })
        .collect();
    let mut round = 0;
    while another_round(cfg.rounds, round, cost.iter().map(|r| r.tally(cfg.rounds))) {
        for row in cost.iter_mut() {
            if row.rules == "cid" {
                lab.use_cid_rules()?;
            } else {
                lab.use_four_tuple_rules()?;
            }
            let before_fwd = lab.host_packets()?;
            let (ns, sent, steal) = send_packets(lab, cfg.packets, rate)?;
            let after_fwd = lab.host_packets()?;
            for (f, (a, b)) in row.forwarded.iter_mut().zip(after_fwd.iter().zip(&before_fwd)) {
                *f += a - b;
            }
            // /proc/stat counts in clock ticks: a run shorter than 20 of them is not measured.
            let v = if ns >= 20.0 * 1e9 / rate.hz() as f64 { ns / sent as f64 } else { f64::NAN };
            row.ns_per_packet.push(v);
            row.steal.push(steal);
            let mark = if steal.stolen { format!(", STOLEN {} (left out)", steal.pct()) } else { String::new() };
            log(&format!("round {}: {} rules {v:.0} ns/packet{mark}", round + 1, row.rules));
        }
        round += 1;
    }
    for row in cost.iter_mut() {
        row.kept = row.tally(cfg.rounds);
        row.spread = Spread::of_clean(&row.runs());
    }
    Ok(cost)
}

impl CostRow {
    /// Each run's cost, failed where unmeasured (NaN), marked where stolen.
    fn runs(&self) -> Vec<Run> {
        self.ns_per_packet
            .iter()
            .zip(&self.steal)
            .map(|(&v, s)| if v.is_nan() { Run::Failed } else { Run::of(v, s) })
            .collect()
    }

    fn tally(&self, planned: usize) -> Kept {
        Kept::of(&self.runs(), planned)
    }
}

/// Sends `n` short-header packets (1200 bytes, the hosts' server IDs in turn) from the
/// client's namespace to the VIP; the machine's busy CPU nanoseconds, the packets sent and
/// the steal from every online CPU meanwhile.
fn send_packets(lab: &Lab, n: u64, rate: TickRate) -> Result<(f64, u64, Steal), Error> {
    let before = CpuSample::now().map_err(cpu_error)?;
    let sent = lab.client().try_run(move || -> std::io::Result<u64> {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.connect((VIP, PORT))?;
        let mut pkts: Vec<Vec<u8>> = (1..=3)
            .map(|i| {
                let cid = ServerCid { host_id: host_id(i), nonce: [i as u8; 7], generation: 0, worker: 0 }.to_bytes();
                let mut p = vec![0x41u8];
                p.extend_from_slice(&cid);
                p.resize(1200, 0x5a);
                p
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut sent = 0;
        while sent < n && Instant::now() < deadline {
            let p = &mut pkts[(sent % 3) as usize];
            match s.send(p) {
                Ok(_) => sent += 1,
                // The hosts answer with port unreachable (rate-limited by the kernel): a
                // connected socket reports it on a later send; it is not a lost packet here.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    })?;
    let sent = sent.map_err(|e| Error::InvalidConfig { why: format!("sending through the balancer: {e}") })?;
    let delta = CpuSample::now().map_err(cpu_error)?.diff(&before);
    let cpus: Vec<usize> = udpx_lab::cpu::online_cpus();
    Ok((delta.busy_time(&cpus, rate).as_nanos() as f64, sent.max(1), Steal::of(&delta, &cpus, rate)))
}

impl LbBench {
    /// The report: tables, the rebinding verdict, the environment.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let fmt = |v: f64| format!("{v:.0}");
        s.push_str("### Balancer cost per packet (busy CPU of the whole machine, ns per packet)\n\n");
        s.push_str("| rules | median | spread over runs | runs | forwarded to hosts 1/2/3 |\n| --- | ---: | ---: | ---: | --- |\n");
        for r in &self.cost {
            if let Some(why) = r.kept.no_figure() {
                s.push_str(&format!("| {} | {why} | | | |\n", r.rules));
                continue;
            }
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                r.rules,
                fmt(r.spread.median),
                udpx_lab::judge::pm(r.spread.median, r.spread.min, r.spread.max),
                r.kept.cell(),
                r.forwarded.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ")
            ));
        }
        let extra = self.cost.iter().map(|r| r.steal.len().saturating_sub(r.kept.planned)).max().unwrap_or(0);
        if let Some(note) = udpx_lab::judge::steal_note(self.cost.iter().flat_map(|r| &r.steal), Some(extra)) {
            s.push_str(&format!("\n{note} (every online CPU)\n"));
        }
        s.push_str(&format!(
            "\nCID rules / 4-tuple rules: {:.3}x ({:+.0} ns per packet: what reading the connection ID costs, \
             beside the whole path's cost)\n\n",
            self.cost_ratio, self.cost_delta_ns
        ));
        s.push_str("### Connections that survive a NAT rebinding (address and port) mid-download\n\n");
        s.push_str(
            "| rules | survived | tried | reached another host | share |\n| --- | ---: | ---: | ---: | ---: |\n",
        );
        for r in &self.rebinding {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.0} % |\n",
                r.rules,
                r.survived,
                r.tried,
                r.reached_another_host,
                100.0 * r.survived as f64 / r.tried.max(1) as f64
            ));
        }
        let cid = &self.rebinding[0];
        s.push_str(&format!(
            "\nGoal: 100 % through the CID rules: {}\n\n",
            if cid.survived == cid.tried { "met" } else { "MISSED" }
        ));
        s.push_str(&format!(
            "### Spread of {} new connections over 3 hosts (CID rules)\n\nper host {:?}; largest / mean {:.2}\n\n",
            self.spread.iter().sum::<u64>(),
            self.spread,
            self.spread_max_over_mean
        ));
        s.push_str(&self.env.to_markdown());
        s
    }
}

fn cpu_error(e: udpx_lab::cpu::Error) -> Error {
    Error::InvalidConfig { why: format!("CPU accounting: {e}") }
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the tools the bench needs are on `PATH` (`None`) or which is missing.
pub fn missing_tool() -> Option<&'static str> {
    ["nft", "tc", "ss", "ip"].into_iter().find(|t| !udpx_lab::netns::on_path(t))
}
