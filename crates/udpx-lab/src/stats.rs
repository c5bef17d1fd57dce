//! How the bench summarizes repeated runs and judges targets: pure functions, no I/O (one knob
//! aside, read once from the environment: [`EXTRA_ROUNDS_ENV`]).
//!
//! - **The median run.** A row's figures come from one run, the median run by cost (CPU-s
//!   per GB), reported whole; a field-wise median would mix runs (throughput of one, cost of
//!   another, loss of a third) into a row no run ever produced. With an even count the lower
//!   middle run is taken (the cheaper of the two), so the choice is a real run.
//! - **Spread.** Every figure carries the minimum and maximum over the runs.
//! - **Ratios and verdicts.** The rows of a ratio ran interleaved (A B C … A B C …), so run
//!   *i* of row A and run *i* of row B saw the same state of the machine: the ratio is taken
//!   per run, and its interval is the min-max of those per-run ratios, with their median as
//!   the point estimate. For *n* paired runs, the min-max of independent ratios covers their
//!   median with probability `1 - 2^(1-n)` whatever their distribution (75 % for 3 runs,
//!   94 % for 5, 98 % for 7). A target `ratio <= t` is **met** when the whole interval is at
//!   or below `t`, **missed** when all of it is above, and **inconclusive** when it straddles
//!   `t` or there are fewer than [`MIN_RUNS_FOR_VERDICT`] paired runs.
//! - **Stolen runs.** A run whose CPUs the hypervisor stole more than
//!   [`STEAL_LIMIT`] of ([`crate::steal`]) is marked ([`Run::Stolen`])
//!   and counts nowhere: not in the median run, not in a spread, not in a pair of a ratio. A
//!   row whose runs are all marked has no figure ([`Kept::no_figure`] says why). Where a bench
//!   has rounds it runs extra ones, at most as many again, while a row is short of clean runs
//!   ([`another_round`]; fewer with [`EXTRA_ROUNDS_ENV`]).

use std::fmt;

use serde::Serialize;

use crate::steal::{Steal, WithSteal, STEAL_LIMIT};

/// Fewest paired runs for a met or missed verdict: with two, min-max covers the median only
/// half the time.
pub const MIN_RUNS_FOR_VERDICT: usize = 3;

/// A figure over runs: the median and the range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// How many values.
    pub n: usize,
}

impl Spread {
    /// Of `values`; NaN for none. Infinite values (a row that delivered nothing costs an
    /// infinite amount per byte) are kept: they sort last.
    pub fn of(values: &[f64]) -> Spread {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return Spread { median: f64::NAN, min: f64::NAN, max: f64::NAN, n: 0 };
        }
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Spread { median, min: v[0], max: v[n - 1], n }
    }

    /// Of the clean runs' values ([`Run::counted`]): failed and stolen runs left out.
    pub fn of_clean(runs: &[Run]) -> Spread {
        Spread::of(&runs.iter().filter_map(|r| r.counted()).collect::<Vec<_>>())
    }

    /// The larger distance from the median to either end, in percent of the median: the
    /// `±` of the tables. NaN when the median is zero or not finite.
    pub fn plus_minus_pct(&self) -> f64 {
        if self.median == 0.0 || !self.median.is_finite() {
            return f64::NAN;
        }
        (self.max - self.median).max(self.median - self.min) / self.median.abs() * 100.0
    }
}

/// Probability that the min-max of `n` independent values covers their median:
/// `1 - 2^(1-n)` (0 for fewer than two).
pub fn minmax_coverage(n: usize) -> f64 {
    if n < 2 {
        0.0
    } else {
        1.0 - 0.5f64.powi(n as i32 - 1)
    }
}

/// The index of the median run by `costs` (one per run): the middle one after sorting, the
/// lower middle for an even count; NaN costs sort last (`total_cmp`). `None` for no runs.
pub fn median_run(costs: &[f64]) -> Option<usize> {
    if costs.is_empty() {
        return None;
    }
    let mut order: Vec<usize> = (0..costs.len()).collect();
    // Stable: equal costs keep run order, so the choice is reproducible.
    order.sort_by(|&a, &b| costs[a].total_cmp(&costs[b]));
    Some(order[(costs.len() - 1) / 2])
}

/// One run's figure as the summaries take it: the steal rule's input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Run {
    /// The run failed: no figure.
    Failed,
    /// Measured while the hypervisor stole more than [`STEAL_LIMIT`] of the run's CPUs: shown,
    /// never counted.
    Stolen(f64),
    /// Measured on a machine that was ours: counted.
    Clean(f64),
}

impl Run {
    /// `value` measured with `steal` over the run's window.
    pub fn of(value: f64, steal: &Steal) -> Run {
        if steal.stolen {
            Run::Stolen(value)
        } else {
            Run::Clean(value)
        }
    }

    /// A run that may have failed (`None`), with its steal.
    pub fn maybe(value: Option<(f64, &Steal)>) -> Run {
        value.map_or(Run::Failed, |(v, s)| Run::of(v, s))
    }

    /// The figure if it counts (a clean run); `None` for a failed or a stolen one.
    pub fn counted(self) -> Option<f64> {
        match self {
            Run::Clean(v) => Some(v),
            Run::Failed | Run::Stolen(_) => None,
        }
    }

    /// Whether the run was measured (clean or stolen).
    pub fn measured(self) -> bool {
        !matches!(self, Run::Failed)
    }
}

/// `f` of each of a row's runs in round order (`None`: failed), marked as the steal rule says.
pub fn figures<T: WithSteal>(runs: &[Option<T>], f: impl Fn(&T) -> f64) -> Vec<Run> {
    runs.iter().map(|r| Run::maybe(r.as_ref().map(|r| (f(r), r.steal())))).collect()
}

/// From a figure whose steal was not measured (a tool that does not measure it yet, tests):
/// `None` is a failed run, `Some` a clean one.
impl From<Option<f64>> for Run {
    fn from(v: Option<f64>) -> Run {
        v.map_or(Run::Failed, Run::Clean)
    }
}

/// What the steal rule leaves of a row's runs: how many were planned, counted, marked and
/// failed, and the median run of those counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Kept {
    /// Runs planned (the bench's rounds, before any extra round).
    pub planned: usize,
    /// Runs counted: measured, not stolen.
    pub clean: usize,
    /// Runs measured but marked stolen: left out.
    pub stolen: usize,
    /// Runs that failed.
    pub failed: usize,
    /// The index (in round order) of the median clean run by cost ([`median_run`]); `None`
    /// when no run is clean.
    pub median_run: Option<usize>,
}

impl Kept {
    /// Of a row's runs in round order, by their costs; `planned`: the rounds the bench meant
    /// to run.
    pub fn of(costs: &[Run], planned: usize) -> Kept {
        let clean: Vec<usize> = (0..costs.len()).filter(|&i| costs[i].counted().is_some()).collect();
        let values: Vec<f64> = clean.iter().filter_map(|&i| costs[i].counted()).collect();
        Kept {
            planned,
            clean: clean.len(),
            stolen: costs.iter().filter(|r| matches!(r, Run::Stolen(_))).count(),
            failed: costs.iter().filter(|r| !r.measured()).count(),
            median_run: median_run(&values).map(|k| clean[k]),
        }
    }

    /// Fewer clean runs than planned because runs were stolen (failed runs are not made up).
    pub fn short(&self) -> bool {
        self.clean + self.failed < self.planned
    }

    /// Why the row has no figure, when its runs were measured but all stolen.
    pub fn no_figure(&self) -> Option<String> {
        (self.clean == 0 && self.stolen > 0).then(|| {
            format!(
                "no figure: all {} measured runs stolen (the hypervisor took more than {:.0} % of their CPUs' time)",
                self.stolen,
                STEAL_LIMIT * 100.0
            )
        })
    }

    /// The table's `runs` cell: the clean runs, `clean/planned` when short of them.
    pub fn cell(&self) -> String {
        if self.short() {
            format!("{}/{}", self.clean, self.planned)
        } else {
            self.clean.to_string()
        }
    }
}

/// The environment variable that bounds the extra rounds below `planned`: a number (0: a
/// stolen run is never made up). The test command sets 0: its tests of the benches check what
/// the rows carry, not their figures, and a made-up round only doubled their time on a
/// machine a neighbour steals from.
pub const EXTRA_ROUNDS_ENV: &str = "UDPX_BENCH_EXTRA_ROUNDS";

/// Whether a bench with rounds runs another: always until `planned` rounds have run; then an
/// extra one (at most `planned` extra, or what [`EXTRA_ROUNDS_ENV`] says if less) while a row
/// is short of clean runs ([`Kept::short`]), `rows` giving each row's tally so far.
pub fn another_round(planned: usize, done: usize, rows: impl IntoIterator<Item = Kept>) -> bool {
    static LIMIT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let limit = *LIMIT.get_or_init(|| std::env::var(EXTRA_ROUNDS_ENV).ok().and_then(|v| v.trim().parse().ok()));
    another_round_within(planned, limit.map_or(planned, |l| l.min(planned)), done, rows)
}

/// [`another_round`] with at most `extra` extra rounds.
fn another_round_within(planned: usize, extra: usize, done: usize, rows: impl IntoIterator<Item = Kept>) -> bool {
    done < planned || (done < planned + extra && rows.into_iter().any(|k| k.short()))
}

/// What a target comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The whole interval is at or below the target.
    Met,
    /// The whole interval is above the target.
    Missed,
    /// The interval straddles the target, or too few paired runs to say.
    Inconclusive,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Verdict::Met => "met",
            Verdict::Missed => "MISSED",
            Verdict::Inconclusive => "inconclusive",
        })
    }
}

/// Judges `ratio <= at_most` from the per-run ratios (see the module docs for the rule). A
/// non-finite ratio (a run that delivered nothing) makes it inconclusive.
pub fn verdict(ratios: &[f64], at_most: f64) -> Verdict {
    if ratios.len() < MIN_RUNS_FOR_VERDICT || ratios.iter().any(|r| !r.is_finite()) {
        return Verdict::Inconclusive;
    }
    let s = Spread::of(ratios);
    if s.max <= at_most {
        Verdict::Met
    } else if s.min > at_most {
        Verdict::Missed
    } else {
        Verdict::Inconclusive
    }
}

/// Per-run ratios `a[i] / b[i]` of the runs both count: a pair with a failed or a stolen
/// run is left out ([`stolen_pairs`] counts those left out for steal).
pub fn paired_ratios(a: &[Run], b: &[Run]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter_map(|(x, y)| match (x.counted(), y.counted()) {
            (Some(x), Some(y)) if x.is_finite() && y.is_finite() && y > 0.0 => Some(x / y),
            // A pass in which one side delivered nothing (an infinite cost), or whose
            // reference cost read zero (a meter that saw no work: no ratio, not infinity):
            // it stays in the pairing as NaN, so [`verdict`] says inconclusive rather than
            // judge the others.
            (Some(_), Some(_)) => Some(f64::NAN),
            _ => None,
        })
        .collect()
}

/// Pairs both measured but left out of [`paired_ratios`] because either run was stolen.
pub fn stolen_pairs(a: &[Run], b: &[Run]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.measured() && y.measured() && (x.counted().is_none() || y.counted().is_none()))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(v: &[Option<f64>]) -> Vec<Run> {
        v.iter().map(|&x| Run::from(x)).collect()
    }

    #[test]
    fn a_pass_that_delivered_nothing_blocks_the_verdict() {
        let a = runs(&[Some(1.0), Some(f64::INFINITY), Some(1.0), Some(1.0)]);
        let b = runs(&[Some(2.0), Some(2.0), Some(2.0), None]);
        let r = paired_ratios(&a, &b);
        assert_eq!(r.len(), 3, "a missing run drops out; an infinite one does not");
        assert!(r[1].is_nan());
        assert_eq!(verdict(&r, 1.0), Verdict::Inconclusive);
    }

    #[test]
    fn a_reference_that_read_zero_gives_no_ratio() {
        let r = paired_ratios(&runs(&[Some(1.0), Some(1.0), Some(1.0)]), &runs(&[Some(2.0), Some(0.0), Some(2.0)]));
        assert!(r[1].is_nan(), "not infinity: {r:?}");
        assert_eq!(verdict(&r, 1.0), Verdict::Inconclusive);
    }

    #[test]
    fn spread_of_runs() {
        let s = Spread::of(&[1.1, 0.9, 1.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (1.0, 0.9, 1.1, 3));
        assert!((s.plus_minus_pct() - 10.0).abs() < 1e-9);
        let s = Spread::of(&[4.0, 1.0]);
        assert_eq!(s.median, 2.5);
        let s = Spread::of(&[2.0, f64::INFINITY, f64::NAN]);
        assert_eq!((s.min, s.max, s.n), (2.0, f64::INFINITY, 2));
        assert!(Spread::of(&[]).median.is_nan());
        assert!(Spread::of(&[0.0, 1.0, 0.0]).plus_minus_pct().is_nan());
    }

    #[test]
    fn median_run_is_one_real_run() {
        // Costs per run: the median cost is run 2's (1.0), and that run is reported whole.
        assert_eq!(median_run(&[1.2, 0.8, 1.0]), Some(2));
        // Even count: the lower middle (the cheaper of the middle two), never an average.
        assert_eq!(median_run(&[3.0, 1.0, 4.0, 2.0]), Some(3));
        assert_eq!(median_run(&[5.0]), Some(0));
        assert_eq!(median_run(&[]), None);
        // A run that delivered nothing costs infinity: never the median of three.
        assert_eq!(median_run(&[f64::INFINITY, 2.0, 1.0]), Some(1));
        // Ties keep run order.
        assert_eq!(median_run(&[1.0, 1.0, 1.0]), Some(1));
    }

    #[test]
    fn verdicts_need_the_interval_clear_of_the_target() {
        let t = 1.02;
        // The case: two runs of the same commit gave 0.78 and 1.07 (and 0.97, 1.28).
        assert_eq!(verdict(&[0.78, 1.07, 0.95], t), Verdict::Inconclusive);
        assert_eq!(verdict(&[0.97, 1.28, 1.1], t), Verdict::Inconclusive);
        assert_eq!(verdict(&[0.97, 0.99, 1.01], t), Verdict::Met);
        assert_eq!(verdict(&[1.03, 1.05, 1.2], t), Verdict::Missed);
        // On the threshold counts as met (`<=`); just above it does not.
        assert_eq!(verdict(&[1.02, 1.0, 0.99], t), Verdict::Met);
        assert_eq!(verdict(&[1.021, 1.0, 0.99], t), Verdict::Inconclusive);
        // Too few runs: no verdict, however clear they look.
        assert_eq!(verdict(&[0.5, 0.5], t), Verdict::Inconclusive);
        assert_eq!(verdict(&[], t), Verdict::Inconclusive);
        // A run that delivered nothing: no verdict.
        assert_eq!(verdict(&[0.5, f64::INFINITY, 0.5], t), Verdict::Inconclusive);
        assert_eq!(format!("[{:^8}]", Verdict::Met), "[  met   ]");
    }

    #[test]
    fn ratios_pair_runs_by_index() {
        let a = runs(&[Some(2.0), None, Some(3.0), Some(4.0)]);
        let b = runs(&[Some(1.0), Some(1.0), None, Some(2.0)]);
        assert_eq!(paired_ratios(&a, &b), vec![2.0, 2.0]);
        assert!((minmax_coverage(3) - 0.75).abs() < 1e-12);
        assert!((minmax_coverage(7) - 0.984375).abs() < 1e-12);
        assert_eq!(minmax_coverage(1), 0.0);
    }

    #[test]
    fn stolen_runs_count_in_no_median_spread_or_ratio() {
        let clean = Steal::default();
        let stolen = Steal { steal_s: 0.5, steal_share: 0.1, stolen: true };
        // Run 1 is the cheapest but stolen: the median of the clean runs 2.0, 3.0, 4.0 is
        // run 2 (3.0), not the median of all four (the lower middle, 2.0).
        let a = vec![Run::of(2.0, &clean), Run::of(0.5, &stolen), Run::of(3.0, &clean), Run::of(4.0, &clean)];
        let k = Kept::of(&a, 3);
        assert_eq!((k.clean, k.stolen, k.failed, k.median_run), (3, 1, 0, Some(2)));
        assert!(!k.short() && k.no_figure().is_none());
        assert_eq!(k.cell(), "3");
        let s = Spread::of_clean(&a);
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 2.0, 4.0, 3));
        // Paired with a clean row: pass 1 is left out of the ratios, and counted as such.
        let b = runs(&[Some(4.0), Some(4.0), Some(4.0), Some(4.0)]);
        assert_eq!(paired_ratios(&a, &b), vec![0.5, 0.75, 1.0]);
        assert_eq!(stolen_pairs(&a, &b), 1);
        // Stolen on the other side counts too; a failed run is no stolen pair.
        assert_eq!(stolen_pairs(&b, &a), 1);
        assert_eq!(stolen_pairs(&runs(&[None]), &[Run::Stolen(1.0)]), 0);
    }

    #[test]
    fn a_verdict_is_judged_without_the_stolen_runs() {
        let st = Steal { stolen: true, ..Steal::default() };
        let ok = Steal::default();
        // Clean ratios 0.8, 0.9, 0.85 are met against 1.0; the stolen pass (2.5: a neighbour
        // made it costlier) would have made the range straddle the target.
        let a = vec![Run::of(0.8, &ok), Run::of(2.5, &st), Run::of(0.9, &ok), Run::of(0.85, &ok)];
        let b = runs(&[Some(1.0), Some(1.0), Some(1.0), Some(1.0)]);
        assert_eq!(verdict(&paired_ratios(&a, &b), 1.0), Verdict::Met);
        let all = runs(&[Some(0.8), Some(2.5), Some(0.9), Some(0.85)]);
        assert_eq!(verdict(&paired_ratios(&all, &b), 1.0), Verdict::Inconclusive);
    }

    #[test]
    fn a_row_whose_runs_are_all_stolen_has_no_figure_and_says_why() {
        let st = Steal { steal_s: 1.0, steal_share: 0.2, stolen: true };
        let a = vec![Run::of(1.0, &st), Run::Failed, Run::of(2.0, &st)];
        let k = Kept::of(&a, 3);
        assert_eq!((k.clean, k.stolen, k.failed, k.median_run), (0, 2, 1, None));
        assert!(k.short());
        assert_eq!(k.cell(), "0/3");
        let why = k.no_figure().unwrap();
        assert!(why.contains("all 2 measured runs stolen") && why.contains("2 %"), "{why}");
        assert!(Spread::of_clean(&a).median.is_nan());
        // All failed: no figure either, but not for steal.
        assert_eq!(Kept::of(&[Run::Failed], 1).no_figure(), None);
    }

    #[test]
    fn extra_rounds_run_while_a_row_is_short_of_clean_runs_at_most_as_many_again() {
        let k = |clean, stolen, failed| Kept { planned: 3, clean, stolen, failed, median_run: None };
        // The planned rounds always run.
        assert!(another_round_within(3, 3, 2, [k(2, 0, 0)]));
        // All clean, or short only of failed runs: done.
        assert!(!another_round_within(3, 3, 3, [k(3, 0, 0), k(2, 0, 1)]));
        // One stolen: another round; once it is made up, done.
        assert!(another_round_within(3, 3, 3, [k(3, 0, 0), k(2, 1, 0)]));
        assert!(!another_round_within(3, 3, 4, [k(3, 1, 0)]));
        // The bound: 3 extra rounds at most, however stolen the machine.
        assert!(another_round_within(3, 3, 5, [k(0, 5, 0)]));
        assert!(!another_round_within(3, 3, 6, [k(0, 6, 0)]));
        // Fewer when the environment says so (the test command: none).
        assert!(another_round_within(3, 1, 3, [k(2, 1, 0)]));
        assert!(!another_round_within(3, 1, 4, [k(2, 2, 0)]));
        assert!(!another_round_within(3, 0, 3, [k(0, 3, 0)]));
        assert!(another_round_within(3, 0, 2, [k(0, 2, 0)]));
    }
}
