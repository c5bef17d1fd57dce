//! Targets judged from per-run ratios, and how the reports print them: the [`Check`] every
//! table's targets come to, the paragraph that says how they are judged ([`verdict_rule`]) and
//! their text lines ([`checks_text`]). The rule itself is [`crate::stats`]'s.

use std::fmt::Write as _;

use serde::Serialize;

use crate::stats::{minmax_coverage, paired_ratios, verdict, Spread, Verdict, MIN_RUNS_FOR_VERDICT};

/// A target from the issues, judged from the per-run ratios ([`crate::stats`]).
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Which profile.
    pub profile: String,
    /// What is compared.
    pub what: String,
    /// Median of the per-run ratios.
    pub ratio: f64,
    /// Smallest per-run ratio.
    pub min: f64,
    /// Largest per-run ratio.
    pub max: f64,
    /// The per-run ratios (run *i* of one row over run *i* of the other), in pass order.
    pub ratios: Vec<f64>,
    /// The target the ratio must meet (`≤` target).
    pub at_most: f64,
    /// Met, missed or inconclusive.
    pub verdict: Verdict,
}

impl Check {
    /// Judges `a / b <= at_most` from per-pass figures (`None` where a pass failed).
    pub fn judge(profile: &str, what: &str, a: &[Option<f64>], b: &[Option<f64>], at_most: f64) -> Option<Check> {
        let ratios = paired_ratios(a, b);
        let s = Spread::of(&ratios);
        (s.n > 0).then(|| Check {
            profile: profile.to_string(),
            what: what.to_string(),
            ratio: s.median,
            min: s.min,
            max: s.max,
            verdict: verdict(&ratios, at_most),
            ratios,
            at_most,
        })
    }
}

/// How the targets are judged, for the reports (one paragraph).
pub fn verdict_rule(passes: usize) -> String {
    format!(
        "Each ratio is taken per run (run i of one row over run i of the other: they ran side by side in the same \
         pass); the figure is the median of those ratios and [min-max] their range, which covers the median ratio \
         with probability 1 - 2^(1-n) for n runs ({:.0} % for the {passes} runs here). A target is met when the whole \
         range is at or below it, MISSED when all of it is above, and inconclusive when the range straddles it or \
         fewer than {MIN_RUNS_FOR_VERDICT} runs paired up.",
        minmax_coverage(passes) * 100.0
    )
}

/// `±x%`: the larger distance from the reported value `v` (the median run's) to the smallest
/// or largest over the runs, in percent of `v`; `-` when it cannot be said.
pub fn pm(v: f64, lo: f64, hi: f64) -> String {
    let d = (hi - v).max(v - lo) / v * 100.0;
    if d.is_finite() && v > 0.0 {
        format!("±{d:.0}%")
    } else {
        "-".into()
    }
}

/// Checks as text lines: verdict, profile, what, median ratio, [min-max], runs, target.
pub fn checks_text(cs: &[Check]) -> String {
    let mut s = String::new();
    for c in cs {
        let _ = writeln!(
            s,
            "  {:<14} {:<8} {:<56} {:>6.3} [{:.3}-{:.3}, {} runs, {}] (target <= {:.3})",
            format!("[{}]", c.verdict),
            c.profile,
            c.what,
            c.ratio,
            c.min,
            c.max,
            c.ratios.len(),
            pm(c.ratio, c.min, c.max),
            c.at_most
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_pairs_runs_and_prints_its_range() {
        let a = [Some(1.0), Some(1.2), None, Some(0.9)];
        let b = [Some(2.0), Some(2.0), Some(2.0), Some(2.0)];
        let c = Check::judge("echo", "a / b", &a, &b, 0.5).unwrap();
        // Three pairs (pass 2 failed on one side): 0.5, 0.6, 0.45 straddle 0.5.
        assert_eq!(c.ratios, vec![0.5, 0.6, 0.45]);
        assert_eq!((c.ratio, c.min, c.max, c.verdict), (0.5, 0.45, 0.6, Verdict::Inconclusive));
        let t = checks_text(&[c]);
        assert!(t.starts_with("  [inconclusive] echo     a / b"), "{t}");
        assert!(t.contains("0.500 [0.450-0.600, 3 runs, ±20%] (target <= 0.500)"), "{t}");
        // No pass paired up: no check at all.
        assert!(Check::judge("echo", "a / b", &[None], &[Some(1.0)], 1.0).is_none());
        assert_eq!(pm(0.0, 0.0, 1.0), "-");
        assert!(verdict_rule(3).contains("(75 % for the 3 runs here)"));
    }
}
