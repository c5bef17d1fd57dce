//! How the bench summarizes repeated runs and judges targets: pure functions, no I/O.
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

use std::fmt;

use serde::Serialize;

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

/// Per-run ratios `a[i] / b[i]` of the runs both have (`None` where a run failed).
pub fn paired_ratios(a: &[Option<f64>], b: &[Option<f64>]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter_map(|(x, y)| match (*x, *y) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_that_delivered_nothing_blocks_the_verdict() {
        let a = [Some(1.0), Some(f64::INFINITY), Some(1.0), Some(1.0)];
        let b = [Some(2.0), Some(2.0), Some(2.0), None];
        let r = paired_ratios(&a, &b);
        assert_eq!(r.len(), 3, "a missing run drops out; an infinite one does not");
        assert!(r[1].is_nan());
        assert_eq!(verdict(&r, 1.0), Verdict::Inconclusive);
    }

    #[test]
    fn a_reference_that_read_zero_gives_no_ratio() {
        let r = paired_ratios(&[Some(1.0), Some(1.0), Some(1.0)], &[Some(2.0), Some(0.0), Some(2.0)]);
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
        let a = [Some(2.0), None, Some(3.0), Some(4.0)];
        let b = [Some(1.0), Some(1.0), None, Some(2.0)];
        assert_eq!(paired_ratios(&a, &b), vec![2.0, 2.0]);
        assert!((minmax_coverage(3) - 0.75).abs() < 1e-12);
        assert!((minmax_coverage(7) - 0.984375).abs() < 1e-12);
        assert_eq!(minmax_coverage(1), 0.0);
    }
}
