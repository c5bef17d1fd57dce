//! The paced phase (`udpx bench --paced`): cost judged at a rate both receivers sustain.
//!
//! Unpaced, a receiver that falls behind loses datagrams, and the cost of the lost ones is
//! charged to the delivered bytes: two receivers of different speed are then compared at
//! different loads. Here, for each shape, the raw sender is paced to one rate for both the
//! raw receiver and udpx's (metadata off), starting at [`START_FRACTION`] of the slower one's
//! unpaced delivered rate; if either delivers less than [`SUSTAINED`] in any run, the rate
//! drops by [`STEP_DOWN`] and both run again, at most [`TRIES`] times. The rate judged at is
//! the first one both sustained: a rate both sustain, not a searched maximum of either.
//!
//! Each receiver's highest sustained rate ([`highest_sustained`]) is the best that is known
//! from these few runs: its unpaced rate as a lower bound (`>=`) when it delivered 99 %
//! unpaced, else the highest paced try it sustained. A bisection to the true limit would take
//! more runs than the default job can spare. The raw sender paces by sleeping 200 us when
//! ahead, so it sends in bursts of up to that long; the receive buffer absorbs them.

use std::fmt::Write as _;

use serde::Serialize;

use crate::matrix::{default_rows, run_matrix, Preset, ProfileResult, RowResult};
use crate::raw::Shape;
use crate::report::Check;
use crate::run::{Path, RunConfig};
use crate::stats::Verdict;

/// Delivered fraction a receiver must reach in every run to count as sustaining the rate.
pub const SUSTAINED: f64 = 0.99;
/// The first rate tried, as a fraction of the slower receiver's unpaced delivered rate.
pub const START_FRACTION: f64 = 0.9;
/// Factor on the rate after a try that was not sustained.
pub const STEP_DOWN: f64 = 0.7;
/// Rates tried at most per shape.
pub const TRIES: usize = 3;

/// The row ids of each shape's pair: (raw receiver, udpx receiver), both behind the raw sender.
pub const PAIRS: [(Shape, &str, &str); 3] = [
    (Shape::Plain, "raw", "raw>udpx"),
    (Shape::Gso, "raw-gso", "raw-gso>udpx"),
    (Shape::GsoGro, "raw-gso-gro", "raw-gso>udpx-gro"),
];

/// One paced rate tried for a pair.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Try {
    /// Payload bytes per second the raw sender was paced to.
    pub rate: u64,
    /// The raw receiver's smallest delivered fraction over the runs.
    pub raw_delivered: f64,
    /// udpx's receiver's smallest delivered fraction over the runs.
    pub udpx_delivered: f64,
}

/// The highest rate known sustained (at least [`SUSTAINED`] delivered in every run), in
/// payload bytes per second, and whether it is only a lower bound: the unpaced run counts
/// when it delivered that much (then the sender, not the receiver, set the rate: the true
/// limit is higher), else the highest paced try that did. `None`: nothing tried was sustained.
pub fn highest_sustained(unpaced: &RowResult, tries: &[Try], udpx: bool) -> Option<(u64, bool)> {
    if !unpaced.runs.is_empty() && unpaced.min.delivered >= SUSTAINED {
        return Some(((unpaced.median.gbits * 1e9 / 8.0) as u64, true));
    }
    tries
        .iter()
        .filter(|t| (if udpx { t.udpx_delivered } else { t.raw_delivered }) >= SUSTAINED)
        .map(|t| t.rate)
        .max()
        .map(|r| (r, false))
}

/// One shape's paced pair.
#[derive(Debug, Clone, Serialize)]
pub struct PacedPair {
    /// Which shape.
    pub shape: Shape,
    /// Rates tried, in order, with each receiver's delivery.
    pub tried: Vec<Try>,
    /// The raw receiver's highest sustained rate ([`highest_sustained`]).
    pub raw_sustains: Option<(u64, bool)>,
    /// udpx's receiver's highest sustained rate.
    pub udpx_sustains: Option<(u64, bool)>,
    /// The last rate tried (the one judged at).
    pub rate: u64,
    /// Both receivers delivered at least [`SUSTAINED`] in every run at `rate`.
    pub sustained: bool,
    /// The raw receiver's runs at `rate`.
    pub raw: RowResult,
    /// udpx's receiver's runs at `rate`.
    pub udpx: RowResult,
}

impl PacedPair {
    /// The smallest delivered fraction over the runs of both rows.
    pub fn min_delivered(&self) -> f64 {
        self.raw.min.delivered.min(self.udpx.min.delivered)
    }
}

fn min_delivered(r: &RowResult) -> f64 {
    if r.runs.is_empty() {
        0.0
    } else {
        r.min.delivered
    }
}

/// Runs the paced pairs of `unpaced` (a profile's results, which must hold the raw rows).
pub fn run_paced(
    unpaced: &ProfileResult,
    path: Path<'_>,
    cfg: &RunConfig,
    repeat: usize,
    progress: &mut dyn FnMut(&str),
) -> Vec<PacedPair> {
    let all = default_rows(false, Preset::DEFAULT);
    let mut out = Vec::new();
    for (shape, raw_id, udpx_id) in PAIRS {
        let (Some(a), Some(b)) = (unpaced.get(raw_id), unpaced.get(udpx_id)) else { continue };
        let slower = a.median.gbits.min(b.median.gbits);
        if slower.is_nan() || slower <= 0.0 {
            continue;
        }
        let rows: Vec<_> = all.iter().filter(|r| r.id == raw_id || r.id == udpx_id).cloned().collect();
        let mut rate = (slower * 1e9 / 8.0 * START_FRACTION) as u64;
        let mut tried = Vec::new();
        loop {
            let c = RunConfig { pace: Some(rate), ..cfg.clone() };
            let label = format!("{} paced", unpaced.profile);
            let p = run_matrix(&label, path, &rows, &c, repeat, progress);
            let (Some(raw), Some(udpx)) = (p.get(raw_id).cloned(), p.get(udpx_id).cloned()) else { break };
            tried.push(Try { rate, raw_delivered: min_delivered(&raw), udpx_delivered: min_delivered(&udpx) });
            let sustained = min_delivered(&raw) >= SUSTAINED && min_delivered(&udpx) >= SUSTAINED;
            if sustained || tried.len() >= TRIES {
                out.push(PacedPair {
                    shape,
                    raw_sustains: highest_sustained(a, &tried, false),
                    udpx_sustains: highest_sustained(b, &tried, true),
                    tried,
                    rate,
                    sustained,
                    raw,
                    udpx,
                });
                break;
            }
            rate = (rate as f64 * STEP_DOWN) as u64;
        }
    }
    out
}

/// The targets of the paced pairs: udpx's receiver over the raw receiver at the same paced
/// rate, `<= 1.0`; inconclusive whatever the ratios when the rate was not sustained.
pub fn checks(profile: &str, pairs: &[PacedPair], passes: usize) -> Vec<Check> {
    let mut v = Vec::new();
    for p in pairs {
        // The extra passes that made up stolen runs, too.
        let passes = p.raw.runs.iter().chain(&p.udpx.runs).map(|m| m.run + 1).fold(passes, usize::max);
        let cost = |r: &RowResult| r.per_run(passes, |f| f.cpu_per_gb);
        let what = format!(
            "paced {:.1} Gbit/s: udpx receiver / raw receiver, {}{}",
            p.rate as f64 * 8.0 / 1e9,
            shape_name(p.shape),
            if p.sustained { "" } else { " (NOT sustained: below 99 % delivered)" }
        );
        if let Some(mut c) = Check::judge(profile, &what, &cost(&p.udpx), &cost(&p.raw), 1.0) {
            if !p.sustained {
                c.verdict = Verdict::Inconclusive;
            }
            v.push(c);
        }
    }
    v
}

fn shape_name(s: Shape) -> &'static str {
    match s {
        Shape::Plain => "plain",
        Shape::Gso => "GSO",
        Shape::GsoGro => "GSO+GRO",
    }
}

/// The paced pairs as a table: the rate judged at, each receiver's cost and least delivery.
pub fn table(profile: &str, pairs: &[PacedPair]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:<8} {:>8} {:>9} {:>11} {:>9} {:>11} {:>9} {:>5} {:>10} {:>10}",
        "profile",
        "shape",
        "Gbit/s",
        "sustained",
        "raw CPU/GB",
        "raw dlv",
        "udpx CPU/GB",
        "udpx dlv",
        "tries",
        "raw max",
        "udpx max"
    );
    let max = |m: Option<(u64, bool)>| match m {
        Some((r, lower)) => format!("{}{:.2}", if lower { ">=" } else { "" }, r as f64 * 8.0 / 1e9),
        None => "-".into(),
    };
    for p in pairs {
        let _ = writeln!(
            s,
            "{:<8} {:<8} {:>8.2} {:>9} {:>11.2} {:>8.1}% {:>11.2} {:>8.1}% {:>5} {:>10} {:>10}",
            profile,
            shape_name(p.shape),
            p.rate as f64 * 8.0 / 1e9,
            if p.sustained { "yes" } else { "NO" },
            p.raw.median.cpu_per_gb,
            min_delivered(&p.raw) * 100.0,
            p.udpx.median.cpu_per_gb,
            min_delivered(&p.udpx) * 100.0,
            p.tried.len(),
            max(p.raw_sustains),
            max(p.udpx_sustains)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Measurement;

    fn row(id: &str, runs: &[(f64, u64)]) -> RowResult {
        let r = default_rows(false, Preset::DEFAULT).into_iter().find(|r| r.id == id).unwrap();
        let mut rr = RowResult::new(r);
        rr.runs = runs
            .iter()
            .enumerate()
            .map(|(i, (busy, got))| Measurement {
                run: i,
                busy_secs: *busy,
                recv_bytes: 1_000_000_000,
                sent_datagrams: 1000,
                recv_datagrams: *got,
                send_secs: 1.0,
                ..Measurement::default()
            })
            .collect();
        rr.summarize(runs.len(), runs.len());
        rr
    }

    #[test]
    fn paced_checks_need_the_rate_sustained() {
        let pair = |sustained| PacedPair {
            shape: Shape::GsoGro,
            tried: vec![Try { rate: 1_000_000_000, raw_delivered: 1.0, udpx_delivered: 0.995 }],
            raw_sustains: Some((1_000_000_000, false)),
            udpx_sustains: None,
            rate: 1_000_000_000,
            sustained,
            raw: row("raw-gso-gro", &[(0.2, 1000), (0.2, 1000), (0.2, 1000)]),
            udpx: row("raw-gso>udpx-gro", &[(0.18, 1000), (0.19, 995), (0.2, 1000)]),
        };
        let c = checks("offload", &[pair(true)], 3);
        assert_eq!(c[0].verdict, Verdict::Met, "{c:?}");
        assert!(c[0].what.contains("paced 8.0 Gbit/s") && c[0].what.contains("GSO+GRO"), "{}", c[0].what);
        let c = checks("offload", &[pair(false)], 3);
        assert_eq!(c[0].verdict, Verdict::Inconclusive);
        assert!(c[0].what.contains("NOT sustained"));
        assert!((pair(true).min_delivered() - 0.995).abs() < 1e-9);
        let t = table("offload", &[pair(true)]);
        assert!(t.contains("GSO+GRO") && t.contains("yes"), "{t}");
    }

    #[test]
    fn the_highest_sustained_rate_is_the_best_known() {
        let tries = [
            Try { rate: 900, raw_delivered: 0.95, udpx_delivered: 0.999 },
            Try { rate: 630, raw_delivered: 0.995, udpx_delivered: 1.0 },
        ];
        // Unpaced below 99 %: the highest try each receiver sustained.
        let lossy = row("raw-gso", &[(1.0, 900), (1.0, 950), (1.0, 800)]);
        assert_eq!(highest_sustained(&lossy, &tries, false), Some((630, false)));
        assert_eq!(highest_sustained(&lossy, &tries, true), Some((900, false)));
        assert_eq!(highest_sustained(&lossy, &tries[..1], false), None);
        // Unpaced at 99 % or more in every run: at least its own rate (8 Gbit/s = 1 GB/s).
        let fine = row("raw-gso", &[(1.0, 1000), (1.0, 995), (1.0, 1000)]);
        assert_eq!(highest_sustained(&fine, &tries, false), Some((1_000_000_000, true)));
    }
}
