//! Targets judged from per-run ratios, and how the reports print them: the [`Check`] every
//! table's targets come to, the paragraph that says how they are judged ([`verdict_rule`]) and
//! their text lines ([`checks_text`]), and the line under every table that says which runs the
//! steal rule left out ([`steal_note`]). The rule itself is [`crate::stats`]'s.

use std::fmt::Write as _;

use serde::Serialize;

use crate::stats::{minmax_coverage, paired_ratios, stolen_pairs, verdict, Run, Spread, Verdict, MIN_RUNS_FOR_VERDICT};
use crate::steal::{Steal, STEAL_LIMIT};

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
    /// The per-run ratios (run *i* of one row over run *i* of the other), in pass order; the
    /// passes in which either run was stolen are left out.
    pub ratios: Vec<f64>,
    /// Passes left out because either run was stolen ([`crate::steal`]).
    pub stolen: usize,
    /// The target the ratio must meet (`≤` target).
    pub at_most: f64,
    /// Met, missed or inconclusive.
    pub verdict: Verdict,
}

impl Check {
    /// Judges `a / b <= at_most` from per-pass figures: failed and stolen passes left out.
    /// `None` when no pass was measured on both sides; when every such pass was stolen, a
    /// check with no ratio (NaN), inconclusive, that says so.
    pub fn judge(profile: &str, what: &str, a: &[Run], b: &[Run], at_most: f64) -> Option<Check> {
        let ratios = paired_ratios(a, b);
        let stolen = stolen_pairs(a, b);
        let s = Spread::of(&ratios);
        (s.n > 0 || stolen > 0).then(|| Check {
            profile: profile.to_string(),
            what: what.to_string(),
            ratio: s.median,
            min: s.min,
            max: s.max,
            verdict: verdict(&ratios, at_most),
            ratios,
            stolen,
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

/// Checks as text lines: verdict, profile, what, median ratio, [min-max], runs, target, and
/// the passes left out for steal.
pub fn checks_text(cs: &[Check]) -> String {
    let mut s = String::new();
    for c in cs {
        let stolen = if c.stolen > 0 { format!(", {} stolen left out", c.stolen) } else { String::new() };
        let figure = if c.ratios.is_empty() {
            format!("no ratio: all {} paired runs stolen", c.stolen)
        } else {
            let (n, spread) = (c.ratios.len(), pm(c.ratio, c.min, c.max));
            format!("{:>6.3} [{:.3}-{:.3}, {n} runs{stolen}, {spread}]", c.ratio, c.min, c.max)
        };
        let verdict = format!("[{}]", c.verdict);
        let _ = writeln!(s, "  {verdict:<14} {:<8} {:<56} {figure} (target <= {:.3})", c.profile, c.what, c.at_most);
    }
    s
}

/// The line under a table about steal ([`crate::steal`]): how many of its runs were marked
/// and left out, the largest share, and the extra rounds run to make them up (`extra`: `None`
/// for a bench without rounds). Always a line when there are runs, so a reader sees the rule
/// was applied; `None` for no runs.
pub fn steal_note<'a>(runs: impl IntoIterator<Item = &'a Steal>, extra: Option<usize>) -> Option<String> {
    let runs: Vec<&Steal> = runs.into_iter().collect();
    if runs.is_empty() {
        return None;
    }
    let marked = runs.iter().filter(|s| s.stolen).count();
    let worst = runs.iter().map(|s| s.steal_share).fold(0.0, f64::max);
    let mut s = format!(
        "steal: {marked} of {} runs over the {:.0} % limit (the most the hypervisor took from one run: {:.1} % of its \
         CPUs' time)",
        runs.len(),
        STEAL_LIMIT * 100.0,
        worst * 100.0
    );
    if marked > 0 {
        s += "; marked runs are left out of every median, range and verdict";
        match extra {
            Some(0) | None => {}
            Some(n) => s += &format!("; {n} extra round{} run to make them up", if n == 1 { "" } else { "s" }),
        }
        if extra.is_some() {
            s += "; a row short of clean runs shows runs as clean/planned";
        }
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(v: &[Option<f64>]) -> Vec<Run> {
        v.iter().map(|&x| Run::from(x)).collect()
    }

    #[test]
    fn a_check_pairs_runs_and_prints_its_range() {
        let a = runs(&[Some(1.0), Some(1.2), None, Some(0.9)]);
        let b = runs(&[Some(2.0), Some(2.0), Some(2.0), Some(2.0)]);
        let c = Check::judge("echo", "a / b", &a, &b, 0.5).unwrap();
        // Three pairs (pass 2 failed on one side): 0.5, 0.6, 0.45 straddle 0.5.
        assert_eq!(c.ratios, vec![0.5, 0.6, 0.45]);
        assert_eq!((c.ratio, c.min, c.max, c.verdict), (0.5, 0.45, 0.6, Verdict::Inconclusive));
        let t = checks_text(&[c]);
        assert!(t.starts_with("  [inconclusive] echo     a / b"), "{t}");
        assert!(t.contains("0.500 [0.450-0.600, 3 runs, ±20%] (target <= 0.500)"), "{t}");
        // No pass paired up: no check at all.
        assert!(Check::judge("echo", "a / b", &[Run::Failed], &[Run::Clean(1.0)], 1.0).is_none());
        assert_eq!(pm(0.0, 0.0, 1.0), "-");
        assert!(verdict_rule(3).contains("(75 % for the 3 runs here)"));
    }

    #[test]
    fn a_check_leaves_stolen_passes_out_and_says_so() {
        let st = Steal { steal_s: 0.3, steal_share: 0.06, stolen: true };
        let ok = Steal::default();
        let a = [Run::of(1.0, &ok), Run::of(9.0, &st), Run::of(1.1, &ok), Run::of(0.9, &ok)];
        let b = runs(&[Some(2.0), Some(2.0), Some(2.0), Some(2.0)]);
        let c = Check::judge("h3", "a / b", &a, &b, 0.6).unwrap();
        assert_eq!((c.ratios.clone(), c.stolen, c.verdict), (vec![0.5, 0.55, 0.45], 1, Verdict::Met));
        assert!(checks_text(&[c]).contains("3 runs, 1 stolen left out, ±"));
        // Every pass stolen: a check with no ratio, inconclusive, that says why.
        let all = [Run::of(1.0, &st), Run::of(1.0, &st), Run::of(1.0, &st)];
        let c = Check::judge("h3", "a / b", &all, &b[..3], 0.6).unwrap();
        assert!(c.ratio.is_nan() && c.ratios.is_empty());
        assert_eq!((c.stolen, c.verdict), (3, Verdict::Inconclusive));
        assert!(checks_text(&[c]).contains("no ratio: all 3 paired runs stolen"));
    }

    #[test]
    fn the_steal_note_counts_marked_runs() {
        let ok = Steal { steal_s: 0.01, steal_share: 0.004, stolen: false };
        let st = Steal { steal_s: 0.4, steal_share: 0.071, stolen: true };
        assert_eq!(steal_note([], Some(0)), None);
        let n = steal_note([&ok, &ok], Some(0)).unwrap();
        assert!(n.starts_with("steal: 0 of 2 runs over the 2 % limit") && n.contains("0.4 % of its CPUs' time"), "{n}");
        assert!(!n.contains("left out"), "{n}");
        let n = steal_note([&ok, &st, &ok], Some(1)).unwrap();
        assert!(n.contains("1 of 3 runs") && n.contains("7.1 %") && n.contains("left out of every median"), "{n}");
        assert!(n.contains("1 extra round run") && n.contains("clean/planned"), "{n}");
        assert!(!steal_note([&st], None).unwrap().contains("extra"));
    }
}
