//! What the labs with rows of interleaved runs share (the bottleneck's burst rules and the
//! viewers' tail): a row's runs settled into its median run and tally, and the table's end.

use udpx_lab::env::Environment;
use udpx_lab::judge::{checks_text, steal_note, verdict_rule, Check};
use udpx_lab::stats::{figures, Kept};
use udpx_lab::steal::{Steal, WithSteal};

/// A row's runs (`Err`: a run that failed), settled: every run (`None` where one failed), the
/// median clean run by `key`, the first failure, and the tally against `planned` rounds.
pub(crate) type Settled<T> = (Vec<Option<T>>, Option<T>, Option<String>, Kept);

/// Settles a row's runs: see [`Settled`].
pub(crate) fn settle<T: Copy + WithSteal>(
    runs: Vec<Result<T, String>>,
    planned: usize,
    key: impl Fn(&T) -> f64,
) -> Settled<T> {
    let error = runs.iter().find_map(|x| x.as_ref().err().cloned());
    let runs: Vec<Option<T>> = runs.into_iter().map(Result::ok).collect();
    let kept = Kept::of(&figures(&runs, key), planned);
    let median = kept.median_run.and_then(|k| runs[k]);
    (runs, median, error, kept)
}

/// A row's tally by `key` so far, for [`udpx_lab::stats::another_round`].
pub(crate) fn tally<T: Copy + WithSteal>(runs: &[Result<T, String>], planned: usize, key: impl Fn(&T) -> f64) -> Kept {
    Kept::of(&figures(&runs.iter().map(|x| x.as_ref().ok().copied()).collect::<Vec<_>>(), key), planned)
}

/// The end of a table: the steal note (every online CPU: nothing is pinned), the checks, the
/// verdict rule and the environment. `extra`: rounds run beyond the `planned` ones.
pub(crate) fn footer<'a>(
    s: &mut String,
    steals: impl IntoIterator<Item = &'a Steal>,
    extra: usize,
    checks: &[Check],
    planned: usize,
    environment: &Environment,
) {
    use std::fmt::Write as _;
    if let Some(note) = steal_note(steals, Some(extra)) {
        let _ = writeln!(s, "\n{note} (every online CPU: nothing is pinned)");
    }
    let _ = write!(s, "\n{}\n{}\n{}", checks_text(checks), verdict_rule(planned), environment.to_markdown());
}
