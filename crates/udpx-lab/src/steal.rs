//! When the machine was not ours: the hypervisor's steal over a run, and the limit above which
//! a run is marked.
//!
//! This VM has neighbours. While the hypervisor runs another guest on one of our virtual CPUs,
//! that CPU's `steal` column in `/proc/stat` grows (proc(5): "stolen time, which is the time
//! spent in other operating systems when running in a virtualized environment"); a quarter of
//! a CPU stolen for minutes made runs 2-3x costlier (issue 47). Steal is not counted as busy
//! ([`crate::cpu::CpuTimes::busy`]), but the run's work still pays for it in cold caches and
//! in the wall time of everything that waited.
//!
//! So every bench measures, over each run's window, the steal of the CPUs the run uses (the
//! server's and the client's: the benches pin them) as [`Steal`]: seconds, and their share of
//! the CPUs' time, `steal / (wall seconds x number of CPUs)`. A run whose share is over
//! [`STEAL_LIMIT`] is *marked* ([`Steal::stolen`]): it is kept in the JSON, shown in the
//! table, and left out of its row's median and spread and of every ratio and verdict. That
//! rule lives in [`crate::stats`] ([`crate::stats::Run`], [`crate::stats::Kept`],
//! [`crate::stats::paired_ratios`]) and [`crate::judge`], so no tool applies it on its own.

use std::time::Duration;

use serde::Serialize;

use crate::cpu::{CpuDelta, CpuSample, TickRate};

/// The share of a run's CPU time the hypervisor may steal before the run is marked: 2 %.
pub const STEAL_LIMIT: f64 = 0.02;

/// The hypervisor's steal from the CPUs of one run, over its window. Serialized flat beside a
/// run's figures (`#[serde(flatten)]`): `steal_s`, `steal_share`, `stolen`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Steal {
    /// Seconds stolen from the run's CPUs, summed over them.
    pub steal_s: f64,
    /// `steal_s / (wall seconds x number of CPUs)`; 0 for an empty window. Steal is counted in
    /// 10 ms ticks, so over a window of a few ticks the share is coarse (and may pass 1).
    pub steal_share: f64,
    /// `steal_share` is over [`STEAL_LIMIT`]: the run is marked and its figures are left out
    /// of every median, range and verdict.
    pub stolen: bool,
}

impl Steal {
    /// `stolen` out of `wall` on each of `cpus` CPUs.
    pub fn new(stolen: Duration, wall: Duration, cpus: usize) -> Steal {
        let steal_s = stolen.as_secs_f64();
        let capacity = wall.as_secs_f64() * cpus as f64;
        let steal_share = if capacity > 0.0 { steal_s / capacity } else { 0.0 };
        Steal { steal_s, steal_share, stolen: steal_share > STEAL_LIMIT }
    }

    /// The steal of `cpus` (each counted once; CPUs the delta did not sample add nothing but
    /// still count in the share's denominator) over the delta's wall-clock window.
    pub fn of(d: &CpuDelta, cpus: &[usize], rate: TickRate) -> Steal {
        let mut cpus = cpus.to_vec();
        cpus.sort_unstable();
        cpus.dedup();
        Steal::new(d.steal_time(&cpus, rate), d.elapsed, cpus.len())
    }

    /// The share in percent, for tables: `0.4%`.
    pub fn pct(&self) -> String {
        format!("{:.1}%", self.steal_share * 100.0)
    }
}

/// A bench's run that carries its steal, so the summaries can mark it
/// ([`crate::stats::figures`]).
pub trait WithSteal {
    /// The steal over the run's window.
    fn steal(&self) -> &Steal;
}

/// Steal measured over a window: [`StealMeter::start`] before a run, [`StealMeter::stop`]
/// after it.
#[derive(Debug, Clone)]
pub struct StealMeter {
    cpus: Vec<usize>,
    before: Option<CpuSample>,
}

impl StealMeter {
    /// Starts the window on `cpus` (the run's: server and client).
    pub fn start(cpus: &[usize]) -> StealMeter {
        StealMeter { cpus: cpus.to_vec(), before: CpuSample::now().ok() }
    }

    /// The steal since [`StealMeter::start`]; `None` when `/proc/stat` or the tick rate could
    /// not be read (then no CPU figure of the run can be either).
    pub fn stop(&self) -> Option<Steal> {
        self.stop_with_times().map(|(steal, _, _)| steal)
    }

    /// [`StealMeter::stop`], with the window's CPU times and the tick rate they were read
    /// with: one reading of `/proc/stat` for a run's steal and its busy times alike.
    pub fn stop_with_times(&self) -> Option<(Steal, CpuDelta, TickRate)> {
        let d = CpuSample::now().ok()?.diff(self.before.as_ref()?);
        let rate = TickRate::system().ok()?;
        Some((Steal::of(&d, &self.cpus, rate), d, rate))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn the_share_is_of_the_runs_cpus_and_window() {
        // 0.2 s stolen over 5 s on 2 CPUs: 2 %, on the limit, not over it.
        let s = Steal::new(Duration::from_millis(200), Duration::from_secs(5), 2);
        assert_eq!((s.steal_s, s.steal_share, s.stolen), (0.2, 0.02, false));
        let s = Steal::new(Duration::from_millis(210), Duration::from_secs(5), 2);
        assert!(s.stolen && s.steal_share > STEAL_LIMIT, "{s:?}");
        assert_eq!(s.pct(), "2.1%");
        // No window or no CPUs: no share, never marked.
        assert_eq!(Steal::new(Duration::from_secs(1), Duration::ZERO, 2).steal_share, 0.0);
        assert_eq!(
            Steal::new(Duration::from_secs(1), Duration::from_secs(1), 0),
            Steal { steal_s: 1.0, ..Steal::default() }
        );
    }

    #[test]
    fn steal_of_a_delta_counts_each_cpu_once() {
        let t0 = Instant::now();
        let a = CpuSample::from_proc_stat("cpu0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\n", t0).unwrap();
        let b =
            CpuSample::from_proc_stat("cpu0 0 0 0 90 0 0 0 10\ncpu1 0 0 0 100 0 0 0 0\n", t0 + Duration::from_secs(1))
                .unwrap();
        let d = b.diff(&a);
        let rate = TickRate::new(100).unwrap();
        // 10 ticks (0.1 s) stolen from CPU 0; over 1 s of 2 CPUs that is 5 %.
        let s = Steal::of(&d, &[1, 0, 0], rate);
        assert_eq!((s.steal_s, s.steal_share, s.stolen), (0.1, 0.05, true));
        // CPU 1 alone: nothing stolen.
        assert_eq!(Steal::of(&d, &[1], rate), Steal::default());
    }

    #[test]
    fn a_meter_measures_this_machine() {
        let m = StealMeter::start(&crate::cpu::online_cpus());
        let s = m.stop().expect("/proc/stat");
        // Whatever the machine's load: figures, never negative (no bound on their size: tests
        // do not depend on the neighbours, and one 10 ms tick over a short window is a large
        // share).
        assert!(s.steal_s >= 0.0 && s.steal_share >= 0.0, "{s:?}");
    }
}
