//! `udpx bench h3 --bottleneck MBIT`: how much one connection may write per turn, judged
//! where bursts can hurt: through a router whose egress is a shallow `tbf` (root only).
//!
//! **Where.** [`LineNet`]: server, router, client namespaces; the router's egress toward the
//! client is a token bucket at MBIT with a queue of `--bottleneck-buffer` milliseconds at that
//! rate, so a burst larger than the queue is dropped there, as on a slower link. The server's
//! device splits GSO runs in software (`tx-udp-segmentation off`): runs arrive at the router
//! as the bursts they are. `udpx h3 serve` (one shard) in the server's namespace, `udpx h3
//! get` in the client's, one download of the file per mode and round, modes interleaved.
//!
//! **What is reported per [`Burst`] mode.** Goodput, packets quiche declared lost and
//! retransmitted, send calls and packets per call (larger runs, fewer calls: the point of
//! bursting), medians over the rounds. A rule is safe here when its goodput is no lower than
//! `quantum`'s and its losses no higher (each within the rounds' spread: judged per round).
//!
//! **Steal.** Nothing is pinned here, so a run's steal is that of every online CPU over its
//! download ([`udpx_lab::steal`]); a run over the limit is marked and counts in no median or
//! verdict, and extra rounds (at most as many again) make it up.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use udpx_lab::env::Environment;
use udpx_lab::judge::Check;
use udpx_lab::netns::{LineConfig, LineNet, Node, Port, TbfLimit};
use udpx_lab::stats::{another_round, figures, Kept};
use udpx_lab::steal::{Steal, StealMeter, WithSteal};
use udpx_quic::Burst;

use crate::lab::rows::{footer, settle, tally};
use crate::lab::Scratch;
use udpx_h3::{get, serve, GetConfig, ServeConfig};

/// The bench's settings.
#[derive(Debug, Clone, Serialize)]
pub struct BottleneckConfig {
    /// The bottleneck's rate, Mbit/s.
    pub mbit: u64,
    /// Its queue, in time at the rate.
    pub buffer: Duration,
    /// Bytes downloaded per run.
    pub size: u64,
    /// Rounds.
    pub rounds: usize,
    /// How the server sends (`udpx h3 serve`'s host flags); its burst is each row's mode.
    #[serde(flatten)]
    pub host: udpx_h3::Tuning,
    /// A round trip the router adds (`--rtt`: half each way, [`udpx_lab::netns::DelayLine`]).
    pub rtt: Option<Duration>,
}

impl BottleneckConfig {
    /// 200 Mbit/s, 2 ms of queue (50 KB: about 34 packets), 50 MB, 3 rounds.
    pub fn new() -> BottleneckConfig {
        BottleneckConfig {
            mbit: 200,
            buffer: Duration::from_millis(2),
            size: 50_000_000,
            rounds: 3,
            host: udpx_h3::Tuning::default(),
            rtt: None,
        }
    }
}

impl Default for BottleneckConfig {
    fn default() -> Self {
        BottleneckConfig::new()
    }
}

/// The modes compared, in table order.
pub const MODES: [(Burst, &str); 2] = [(Burst::Quantum, "quantum"), (Burst::Window, "window")];

/// One download.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BurstRun {
    /// Goodput, Mbit/s.
    pub mbit_per_s: f64,
    /// Packets quiche declared lost (the server's count).
    pub lost: u64,
    /// Packets retransmitted.
    pub retransmitted: u64,
    /// QUIC packets sent.
    pub packets: u64,
    /// Send system calls.
    pub send_calls: u64,
    /// Datagrams per send call.
    pub packets_per_call: f64,
    /// The steal from every online CPU over the download (`steal_s`, `steal_share`, `stolen`).
    #[serde(flatten)]
    pub steal: Steal,
}

impl WithSteal for BurstRun {
    fn steal(&self) -> &Steal {
        &self.steal
    }
}

/// One mode's runs.
#[derive(Debug, Clone, Serialize)]
pub struct BurstRow {
    /// `--burst`.
    pub mode: String,
    /// Per round (`None`: the run failed).
    pub runs: Vec<Option<BurstRun>>,
    /// The median clean run by goodput.
    pub median: Option<BurstRun>,
    /// The first failure.
    pub error: Option<String>,
    /// Runs planned, clean, stolen and failed.
    pub kept: Kept,
}

/// The result.
#[derive(Debug, Clone, Serialize)]
pub struct BottleneckBench {
    /// Settings.
    pub config: BottleneckConfig,
    /// One row per mode.
    pub rows: Vec<BurstRow>,
    /// Per-round ratios against `quantum`.
    pub checks: Vec<Check>,
    /// Kernel, CPU, devices.
    pub environment: Environment,
}

/// Runs the bench. `Ok(None)`: not root.
pub fn run(cfg: &BottleneckConfig, progress: &mut dyn FnMut(&str)) -> Result<Option<BottleneckBench>, String> {
    if !udpx_lab::netns::is_root() {
        return Ok(None);
    }
    if cfg.mbit == 0 || cfg.size == 0 || cfg.rounds == 0 || cfg.buffer.is_zero() {
        return Err("a bottleneck needs a rate, a buffer, a size and a round".into());
    }
    let scratch = Scratch::new()?;
    let www = scratch.0.join("www");
    std::fs::write(www.join("file"), udpx_lab::pattern(cfg.size as usize, 3)).map_err(|e| e.to_string())?;
    let net = LineNet::setup(&LineConfig::default()).map_err(|e| format!("the line: {e}"))?;
    let rate = cfg.mbit * 1_000_000;
    // A bucket of two packets: the rate is the link's, bursts wait in the queue.
    net.tbf(rate, 3_000, TbfLimit::Latency(cfg.buffer)).map_err(|e| format!("tbf: {e}"))?;
    net.set_features(Port::Server, &[("tx-udp-segmentation", "off")]).map_err(|e| format!("offloads: {e}"))?;
    let mut runs: Vec<Vec<Result<BurstRun, String>>> = vec![Vec::new(); MODES.len()];
    let mut round = 0;
    while another_round(cfg.rounds, round, runs.iter().map(|r| tally(r, cfg.rounds, |x| x.mbit_per_s))) {
        for (i, &(mode, name)) in MODES.iter().enumerate() {
            let r = one_run(&net, &www, mode, cfg);
            progress(&match &r {
                Ok(x) => format!(
                    "round {}/{}: --burst {name}: {:.0} Mbit/s, {} lost, {:.1} packets per call{}",
                    round + 1,
                    cfg.rounds,
                    x.mbit_per_s,
                    x.lost,
                    x.packets_per_call,
                    if x.steal.stolen { format!(", STOLEN {} (left out)", x.steal.pct()) } else { String::new() }
                ),
                Err(e) => format!("round {}/{}: --burst {name}: failed: {e}", round + 1, cfg.rounds),
            });
            runs[i].push(r);
        }
        round += 1;
    }
    let rows: Vec<BurstRow> = MODES
        .iter()
        .zip(runs)
        .map(|(&(_, name), r)| {
            let (runs, median, error, kept) = settle(r, cfg.rounds, |x| x.mbit_per_s);
            BurstRow { mode: name.into(), runs, median, error, kept }
        })
        .collect();
    let checks = judge(&rows);
    let environment = Environment::collect(&[
        (Some(net.ns(Node::Server)), net.dev(Port::Server)),
        (Some(net.ns(Node::Router)), net.dev(Port::RouterClient)),
    ]);
    Ok(Some(BottleneckBench { config: cfg.clone(), rows, checks, environment }))
}

fn one_run(net: &LineNet, www: &std::path::Path, mode: Burst, cfg: &BottleneckConfig) -> Result<BurstRun, String> {
    let size = cfg.size;
    let mut sc = ServeConfig::new(SocketAddr::from((net.addr(Port::Server), 4433)));
    sc.quic.shards = 1;
    udpx_h3::Tuning { burst: Some(mode), ..cfg.host }.apply(&mut sc);
    let root = www.to_path_buf();
    let server = net.ns(Node::Server).try_run(move || serve(&root, &sc)).map_err(|e| e.to_string())?;
    let server = server.map_err(|e| format!("server: {e}"))?;
    let url = format!("https://{}/file", server.local_addr());
    let line = cfg.rtt.map(|rtt| net.delay(rtt / 2)).transpose().map_err(|e| format!("the delay line: {e}"))?;
    let steal = StealMeter::start(&udpx_lab::cpu::online_cpus());
    let got = net.ns(Node::Client).try_run(move || get(&url, None, &GetConfig::default()));
    let steal = steal.stop().unwrap_or_default();
    let counters = server.stop().map_err(|e| format!("server stop: {e}"))?;
    if let Some(line) = line {
        let c = line.stop().map_err(|e| e.to_string())?;
        if c.dropped > 0 {
            return Err(format!(
                "the delay line dropped {} packets (it holds at most {} B)",
                c.dropped,
                udpx_lab::netns::delay::MAX_HELD_BYTES
            ));
        }
    }
    let got = got.map_err(|e| e.to_string())?.map_err(|e| format!("download: {e}"))?;
    if got.status != 200 || got.bytes != size {
        return Err(format!("download: status {}, {} of {size} B", got.status, got.bytes));
    }
    let q = &counters.quic;
    Ok(BurstRun {
        mbit_per_s: got.mbit_per_s,
        lost: q.lost_packets,
        retransmitted: q.retransmitted,
        packets: q.packets_sent,
        send_calls: q.send_calls,
        packets_per_call: q.packets_per_call,
        steal,
    })
}

/// Per round, each mode against `quantum`: goodput ratio (quantum over the mode: at most 1
/// when the mode is no slower) and lost packets (the mode's over quantum's plus one packet,
/// so a round that lost nothing compares).
fn judge(rows: &[BurstRow]) -> Vec<Check> {
    let Some(base) = rows.iter().find(|r| r.mode == "quantum") else { return Vec::new() };
    let mut out = Vec::new();
    let field = |r: &BurstRow, f: &dyn Fn(&BurstRun) -> f64| figures(&r.runs, f);
    for r in rows.iter().filter(|r| r.mode != "quantum") {
        out.extend(Check::judge(
            "bottleneck",
            &format!("goodput quantum / {}", r.mode),
            &field(base, &|x| x.mbit_per_s),
            &field(r, &|x| x.mbit_per_s),
            1.05,
        ));
        out.extend(Check::judge(
            "bottleneck",
            &format!("lost packets +1, {} / quantum", r.mode),
            &field(r, &|x| x.lost as f64 + 1.0),
            &field(base, &|x| x.lost as f64 + 1.0),
            1.5,
        ));
    }
    out
}

/// The report.
pub fn table(b: &BottleneckBench) -> String {
    use std::fmt::Write as _;
    let c = &b.config;
    let mut s = format!(
        "Burst rules through a bottleneck: {} Mbit/s tbf with {} ms of queue on a router's egress (LineNet, \
         namespaces){}, the server's GSO runs split in software before it; --cc {}; {} B per download, {} rounds, \
         modes interleaved; medians by goodput.\n\n",
        c.mbit,
        c.buffer.as_millis(),
        c.rtt.map_or(String::new(), |r| format!(
            ", {} ms of round trip added by the router (a user-space delay line)",
            r.as_millis()
        )),
        c.host.cc,
        c.size,
        c.rounds
    );
    let _ = writeln!(s, "| --burst | Mbit/s | lost | retransmitted | packets | send calls | packets per call | runs |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for r in &b.rows {
        match &r.median {
            Some(m) => {
                let _ = writeln!(
                    s,
                    "| {} | {:.0} | {} | {} | {} | {} | {:.1} | {} |",
                    r.mode,
                    m.mbit_per_s,
                    m.lost,
                    m.retransmitted,
                    m.packets,
                    m.send_calls,
                    m.packets_per_call,
                    r.kept.cell()
                );
            }
            None => {
                let why =
                    r.kept.no_figure().unwrap_or_else(|| format!("failed: {}", r.error.as_deref().unwrap_or("?")));
                let _ = writeln!(s, "| {} | {why} |", r.mode);
            }
        }
    }
    let extra = b.rows.iter().map(|r| r.runs.len().saturating_sub(c.rounds)).max().unwrap_or(0);
    let steals = b.rows.iter().flat_map(|r| r.runs.iter().flatten()).map(|x| &x.steal);
    footer(&mut s, steals, extra, &b.checks, c.rounds, &b.environment);
    s
}
