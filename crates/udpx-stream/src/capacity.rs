//! The capacity figure: many flows at the paper's per-client rate (1,000 x 1 MB/s by default)
//! over the veth pair, the paced server against an unpaced GSO sender of the same flows in the
//! same run. Server CPU per delivered GB is the cost of pacing; delivered / offered says whether
//! this machine keeps up at all (the ask is 8 Gbit/s: on a 2-core VM it does not, and the table
//! says how far it gets).

use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;
use udpx_lab::env::Environment;
use udpx_lab::netns::{TestNet, TestNetConfig};
use udpx_lab::stats::{self, another_round, Kept, Spread};

use crate::client::RecvConfig;
use crate::fig4::{run_between, unpaced_segments, Run};
use crate::StreamError;

/// What the capacity table runs.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityConfig {
    /// Flows.
    pub flows: u32,
    /// Bytes per second per flow.
    pub rate: u64,
    /// Bytes per datagram.
    pub size: u32,
    /// Seconds per run.
    pub duration: Duration,
    /// Rounds (each runs both rows).
    pub rounds: usize,
}

impl Default for CapacityConfig {
    /// 1,000 flows x 1 MB/s in 1200-byte datagrams, 4 s per run, 3 rounds.
    fn default() -> Self {
        CapacityConfig { flows: 1000, rate: 1_000_000, size: 1200, duration: Duration::from_secs(4), rounds: 3 }
    }
}

/// One row.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityRow {
    /// What it is.
    pub label: String,
    /// Runs by round.
    pub runs: Vec<Option<Run>>,
    /// Server CPU-seconds per delivered GB, per run.
    pub cpu_per_gb: Spread,
    /// Delivered / offered, per run.
    pub delivered: Spread,
    /// This row's CPU per GB / the unpaced row's, per round.
    pub vs_unpaced: Spread,
    /// Runs planned, clean, stolen and failed (the spreads are of the clean runs).
    pub kept: Kept,
}

/// The capacity table.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    /// What ran.
    pub config: CapacityConfig,
    /// Paced, then unpaced.
    pub rows: Vec<CapacityRow>,
    /// Where.
    pub environment: Environment,
    /// Errors of failed runs.
    pub failures: Vec<String>,
}

/// Runs the table (root: a veth pair between two namespaces).
pub fn run(cfg: &CapacityConfig, progress: &mut dyn FnMut(&str)) -> Result<Capacity, StreamError> {
    if cfg.rounds == 0 || cfg.rounds > 20 {
        return Err(StreamError::Usage(format!("--repeat {}: give 1 to 20 rounds", cfg.rounds)));
    }
    if let Err(e) = udpx_lab::netns::check_capable() {
        return Err(StreamError::Skip(format!("the capacity table needs network namespaces: {e}")));
    }
    let net =
        TestNet::setup(&TestNetConfig::default()).map_err(|e| StreamError::Setup(format!("the veth pair: {e}")))?;
    let environment = Environment::collect(&[(Some(&net.tx), &net.tx_dev), (Some(&net.rx), &net.rx_dev)]);
    let unpaced = unpaced_segments(cfg.size);
    let shapes = [
        ("paced, 2 per release (udpx stream)".to_string(), 2u32),
        (format!("unpaced GSO, {unpaced} per release"), unpaced),
    ];
    let mut runs: Vec<Vec<Option<Run>>> = vec![Vec::new(); shapes.len()];
    let mut failures = Vec::new();
    let offered = cfg.rate as f64 * f64::from(cfg.flows);
    let per_gb = |rs: &[Option<Run>]| {
        stats::figures(rs, |r| if r.bytes > 0 { r.cpu_s / (r.bytes as f64 / 1e9) } else { f64::INFINITY })
    };
    let mut round = 0;
    while another_round(cfg.rounds, round, runs.iter().map(|rs| Kept::of(&per_gb(rs), cfg.rounds))) {
        for (i, (label, segs)) in shapes.iter().enumerate() {
            let mut recv = RecvConfig::new("0.0.0.0:0".parse().expect("literal"), cfg.flows, cfg.rate, cfg.duration);
            recv.size = cfg.size;
            recv.segments = *segs;
            recv.burst = (*segs).max(4);
            let smoothing = if i == 0 { 125 } else { 0 };
            let r = run_between((&net.tx, IpAddr::V4(net.tx_v4)), (&net.rx, IpAddr::V4(net.rx_v4)), recv, smoothing);
            match &r {
                Ok(run) => progress(&format!(
                    "capacity round {}/{} {label}: {:.0} MB/s delivered, cpu {:.3} s",
                    round + 1,
                    cfg.rounds,
                    run.goodput / 1e6,
                    run.cpu_s
                )),
                Err(e) => {
                    progress(&format!("capacity round {}/{} {label}: FAILED {e}", round + 1, cfg.rounds));
                    failures.push(format!("{label}, round {}: {e}", round + 1));
                }
            }
            runs[i].push(r.ok());
        }
        round += 1;
    }
    let base = per_gb(&runs[1]);
    let rows = shapes
        .into_iter()
        .zip(runs)
        .map(|((label, _), rs)| {
            let cost = per_gb(&rs);
            CapacityRow {
                label,
                cpu_per_gb: Spread::of_clean(&cost),
                delivered: Spread::of_clean(&stats::figures(&rs, |r| r.goodput / offered)),
                vs_unpaced: Spread::of(&stats::paired_ratios(&cost, &base)),
                kept: Kept::of(&cost, cfg.rounds),
                runs: rs,
            }
        })
        .collect();
    Ok(Capacity { config: cfg.clone(), rows, environment, failures })
}

/// The table.
pub fn text(c: &Capacity) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let cfg = &c.config;
    let _ = writeln!(
        o,
        "Capacity: {} flows x {:.2} MB/s ({:.0} Mbit/s offered), {} B datagrams, veth pair, {} rounds x {:.0} s",
        cfg.flows,
        cfg.rate as f64 / 1e6,
        cfg.rate as f64 * f64::from(cfg.flows) * 8.0 / 1e6,
        cfg.size,
        cfg.rounds,
        cfg.duration.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "(the clients share one address: the server's caps raised to {})",
        crate::Limits::raised_for(cfg.flows, cfg.rate).describe()
    );
    let _ = writeln!(o, "\n| row | server CPU-s per GB | vs unpaced | delivered / offered | runs |");
    let _ = writeln!(o, "| --- | --- | --- | --- | --- |");
    let f = |s: &Spread, p: usize| {
        if s.n == 0 || !s.median.is_finite() {
            "n/a".into()
        } else {
            format!("{:.p$} ({:.p$}-{:.p$})", s.median, s.min, s.max)
        }
    };
    for r in &c.rows {
        if let Some(why) = r.kept.no_figure() {
            let _ = writeln!(o, "| {} | {why} | | | |", r.label);
            continue;
        }
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            r.label,
            f(&r.cpu_per_gb, 2),
            f(&r.vs_unpaced, 2),
            f(&r.delivered, 3),
            r.kept.cell()
        );
    }
    let passes = c.rows.iter().map(|r| r.runs.len()).max().unwrap_or(0);
    let steals = c.rows.iter().flat_map(|r| r.runs.iter().flatten()).map(|x| &x.steal);
    if let Some(note) = udpx_lab::judge::steal_note(steals, Some(passes.saturating_sub(cfg.rounds))) {
        let _ = writeln!(o, "{note} (every online CPU: nothing is pinned)");
    }
    for e in &c.failures {
        let _ = writeln!(o, "failed: {e}");
    }
    o
}
