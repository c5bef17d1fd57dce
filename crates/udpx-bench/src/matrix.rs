//! The main job's matrix: the paper's rows (TCP, UDP, sendmmsg, GSO, cache thrashing, GRO)
//! plus iperf3 as an independent peer, run interleaved (A B C … A B C …) so slow drift of a
//! noisy machine spreads over all rows, and summarized by each row's median run with the
//! range over runs ([`crate::stats`]).

use std::time::Duration;

use serde::Serialize;
use udpx::SendMode;

use crate::run::{per_gb, run_iperf3, run_udpx, Kind, Measurement, Path, RunConfig};
use crate::stats::median_run;
use crate::tx::{Proto, Zc};

/// How long the main job measures: passes over the matrix and seconds per row. The one place
/// to calibrate the defaults (on a quiet machine, so that the targets' intervals are narrow
/// enough to judge, about ±5 %).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Preset {
    /// Interleaved passes over every row (3: a median is a median, and min-max covers the
    /// median ratio 75 % of the time; see [`crate::stats`]).
    pub runs: usize,
    /// Seconds each row sends.
    pub row_secs: f64,
}

impl Preset {
    /// `udpx bench`: about 3 minutes for the two veth profiles with iperf3 (see
    /// [`Preset::estimate`]).
    pub const DEFAULT: Preset = Preset { runs: 3, row_secs: 1.5 };
    /// `udpx bench --thorough`, for figures to publish: 7 runs (min-max covers the median
    /// ratio 98 % of the time) of 3 s rows; about 13 minutes.
    pub const THOROUGH: Preset = Preset { runs: 7, row_secs: 3.0 };

    /// Estimated wall time of `rows` rows (`iperf3_rows` of them iperf3, which runs whole
    /// seconds) over `profiles` profiles: the sending time plus [`SETUP_SECS_PER_ROW`] per
    /// measurement. An estimate to print before a long run, not a measurement.
    pub fn estimate(&self, rows: usize, iperf3_rows: usize, profiles: usize) -> Duration {
        let iperf3_secs = self.row_secs.ceil().max(1.0);
        let per_pass = (rows - iperf3_rows.min(rows)) as f64 * self.row_secs
            + iperf3_rows as f64 * iperf3_secs
            + rows as f64 * SETUP_SECS_PER_ROW;
        Duration::from_secs_f64(per_pass * self.runs as f64 * profiles as f64)
    }
}

// The default must be able to reach a verdict at all.
const _: () = assert!(Preset::DEFAULT.runs >= crate::stats::MIN_RUNS_FOR_VERDICT);

/// Seconds of setup per measurement outside the sending time (sockets, the cache-thrash
/// buffers touched before the clock, the receiver draining, iperf3 starting). Estimated from
/// a whole run (2 minutes for 2 runs of 1.5 s rows, 2 profiles, 16 rows); re-measure when the
/// defaults are calibrated.
pub const SETUP_SECS_PER_ROW: f64 = 0.35;

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Stable key (JSON, checks).
    pub id: &'static str,
    /// What the table says.
    pub label: &'static str,
    /// What runs.
    pub kind: Kind,
}

const fn udpx(
    id: &'static str,
    label: &'static str,
    proto: Proto,
    batch_rx: bool,
    gro: bool,
    cache_thrash: bool,
) -> Row {
    Row { id, label, kind: Kind::Udpx { proto, gro, batch_rx, cache_thrash, zerocopy: Zc::Off } }
}

const fn zc(id: &'static str, label: &'static str, cache_thrash: bool, zerocopy: Zc) -> Row {
    let proto = Proto::Udp(SendMode::GsoSendmsg);
    Row { id, label, kind: Kind::Udpx { proto, gro: false, batch_rx: false, cache_thrash, zerocopy } }
}

/// The default rows. `iperf3`: include the iperf3 rows.
///
/// The baseline `udp` is the stock program: one `sendmsg` and one `recvmsg` per datagram, as
/// the kernel's udpgso_bench and iperf3 do. Rows that change the sender keep that receiver, so
/// each row isolates one mechanism (the paper's Figure 1); the batched rows batch both sides;
/// the GRO rows change the receiver (Figure 5).
pub fn default_rows(iperf3: bool) -> Vec<Row> {
    use Proto::{Tcp, Udp};
    use SendMode::*;
    let mut rows = vec![
        udpx("tcp", "TCP (udpx)", Tcp, false, false, false),
        udpx("udp", "UDP sendmsg>recvmsg", Udp(Sendmsg), false, false, false),
        udpx("udp-mmsg", "UDP sendmmsg>recvmmsg", Udp(Sendmmsg), true, false, false),
        udpx("udp-gso", "UDP GSO>recvmsg", Udp(GsoSendmsg), false, false, false),
        udpx("udp-gso-mmsg", "UDP GSO+mmsg>recvmmsg", Udp(GsoSendmmsg), true, false, false),
        udpx("udp-ct", "UDP (CT)", Udp(Sendmsg), false, false, true),
        udpx("udp-gso-ct", "UDP GSO (CT)", Udp(GsoSendmsg), false, false, true),
        udpx("udp-gro", "UDP>GRO", Udp(Sendmsg), false, true, false),
        udpx("udp-gso-gro", "UDP GSO>GRO", Udp(GsoSendmsg), false, true, false),
        udpx("udp-gso-mmsg-gro", "UDP GSO+mmsg>GRO+mmsg", Udp(GsoSendmmsg), true, true, false),
        zc("udp-gso-zc", "UDP GSO+zerocopy", false, Zc::Auto),
        zc("udp-gso-zc-forced", "UDP GSO+zerocopy forced", false, Zc::Forced),
        zc("udp-gso-ct-zc", "UDP GSO (CT)+zerocopy", true, Zc::Auto),
        zc("udp-gso-ct-zc-forced", "UDP GSO (CT)+zc forced", true, Zc::Forced),
    ];
    if iperf3 {
        rows.insert(1, Row { id: "iperf3-tcp", label: "TCP (iperf3)", kind: Kind::Iperf3 { udp: false } });
        rows.push(Row { id: "iperf3-udp", label: "UDP (iperf3)", kind: Kind::Iperf3 { udp: true } });
    }
    rows
}

/// The figures of one measurement, derived.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Figures {
    /// Delivered Gbit/s.
    pub gbits: f64,
    /// Busy CPU seconds per delivered GB, both CPUs.
    pub cpu_per_gb: f64,
    /// Busy seconds on the sender's CPU per GB.
    pub tx_cpu_per_gb: f64,
    /// Busy seconds on the receiver's CPU per GB.
    pub rx_cpu_per_gb: f64,
    /// Busy seconds on the sender's CPU per GB *sent* (the paper's Figure 1 measures the
    /// sender alone; on the `software` profile the receive stack runs on the other CPU, so
    /// this is the sender's own cost, independent of what the receiver drops).
    pub tx_cpu_per_gb_sent: f64,
    /// Send calls per second.
    pub send_calls_per_s: f64,
    /// Datagrams per send call.
    pub datagrams_per_call: f64,
    /// Receive calls per second.
    pub recv_calls_per_s: f64,
    /// Datagrams per receive call.
    pub datagrams_per_recv: f64,
    /// Fraction of sent datagrams delivered.
    pub delivered: f64,
}

impl Figures {
    /// From one measurement.
    pub fn of(m: &Measurement) -> Self {
        let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        Figures {
            gbits: m.gbits(),
            cpu_per_gb: m.cpu_per_gb(),
            tx_cpu_per_gb: per_gb(m.busy_tx_cpu_secs, m.recv_bytes),
            rx_cpu_per_gb: per_gb(m.busy_rx_cpu_secs, m.recv_bytes),
            tx_cpu_per_gb_sent: per_gb(m.busy_tx_cpu_secs, m.sent_bytes),
            send_calls_per_s: div(m.send_calls as f64, m.send_secs),
            datagrams_per_call: div(m.sent_datagrams as f64, m.send_calls as f64),
            recv_calls_per_s: div(m.recv_calls as f64, m.send_secs),
            datagrams_per_recv: div(m.recv_datagrams as f64, m.recv_calls as f64),
            delivered: m.delivered(),
        }
    }

    /// Field-wise minimum and maximum over `all` (the range beside the median run's figures).
    pub fn range(all: &[Figures]) -> (Figures, Figures) {
        let fold = |f: fn(&Figures) -> f64, pick: fn(f64, f64) -> f64, init: f64| {
            all.iter().map(f).filter(|x| !x.is_nan()).fold(init, pick)
        };
        let lo = |f: fn(&Figures) -> f64| fold(f, f64::min, f64::INFINITY);
        let hi = |f: fn(&Figures) -> f64| fold(f, f64::max, f64::NEG_INFINITY);
        let each = |g: &dyn Fn(fn(&Figures) -> f64) -> f64| Figures {
            gbits: g(|x| x.gbits),
            cpu_per_gb: g(|x| x.cpu_per_gb),
            tx_cpu_per_gb: g(|x| x.tx_cpu_per_gb),
            rx_cpu_per_gb: g(|x| x.rx_cpu_per_gb),
            tx_cpu_per_gb_sent: g(|x| x.tx_cpu_per_gb_sent),
            send_calls_per_s: g(|x| x.send_calls_per_s),
            datagrams_per_call: g(|x| x.datagrams_per_call),
            recv_calls_per_s: g(|x| x.recv_calls_per_s),
            datagrams_per_recv: g(|x| x.datagrams_per_recv),
            delivered: g(|x| x.delivered),
        };
        (each(&lo), each(&hi))
    }
}

/// Median (mean of the middle two for an even count; NaN for none).
pub fn median(v: Vec<f64>) -> f64 {
    crate::stats::Spread::of(&v).median
}

/// A row's results in one profile.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    /// The row.
    pub row: Row,
    /// Every repetition that succeeded (each says which pass it was in, `run`).
    pub runs: Vec<Measurement>,
    /// The figures of the median run by cost per delivered byte, whole (not mixed from
    /// several runs).
    pub median: Figures,
    /// Which pass that was (`run` of the measurement); `None` if every run failed.
    pub median_run: Option<usize>,
    /// Field-wise smallest figures over the runs.
    pub min: Figures,
    /// Field-wise largest figures over the runs.
    pub max: Figures,
    /// Seconds the hypervisor stole from the two CPUs, all runs together (each run's is in
    /// `runs[].steal_secs`); not counted as busy.
    pub steal_secs: f64,
    /// Why a repetition failed, if one did.
    pub errors: Vec<String>,
}

impl RowResult {
    /// A row before it has run.
    pub fn new(row: Row) -> RowResult {
        let f = Figures::default();
        RowResult {
            row,
            runs: Vec::new(),
            median: f,
            median_run: None,
            min: f,
            max: f,
            steal_secs: 0.0,
            errors: Vec::new(),
        }
    }

    /// Sets `median`, `min` and `max` from the runs.
    pub fn summarize(&mut self) {
        let figs: Vec<Figures> = self.runs.iter().map(Figures::of).collect();
        let costs: Vec<f64> = figs.iter().map(|f| f.cpu_per_gb).collect();
        let at = median_run(&costs);
        self.median = at.map(|i| figs[i]).unwrap_or_default();
        self.median_run = at.map(|i| self.runs[i].run);
        (self.min, self.max) = Figures::range(&figs);
        self.steal_secs = self.runs.iter().map(|m| m.steal_secs).sum();
    }

    /// One figure per pass `0..passes`: `None` where that pass failed.
    pub fn per_run(&self, passes: usize, f: impl Fn(&Figures) -> f64) -> Vec<Option<f64>> {
        (0..passes).map(|i| self.runs.iter().find(|m| m.run == i).map(|m| f(&Figures::of(m)))).collect()
    }
}

/// All rows of one path profile.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileResult {
    /// `offload`, `software` or `loopback`.
    pub profile: String,
    /// Passes over the rows (runs per row, if none failed).
    pub passes: usize,
    /// Rows in table order.
    pub rows: Vec<RowResult>,
}

impl ProfileResult {
    /// The row with this id.
    pub fn get(&self, id: &str) -> Option<&RowResult> {
        self.rows.iter().find(|r| r.row.id == id && !r.runs.is_empty())
    }
}

/// Runs `rows` `repeat` times, interleaved, over `path`; `progress(done, total, label)` after
/// each measurement. A failing measurement is recorded and the run goes on.
pub fn run_matrix(
    profile: &str,
    path: Path<'_>,
    rows: &[Row],
    cfg: &RunConfig,
    repeat: usize,
    progress: &mut dyn FnMut(&str),
) -> ProfileResult {
    let mut results: Vec<RowResult> = rows.iter().cloned().map(RowResult::new).collect();
    for pass in 0..repeat {
        for r in results.iter_mut() {
            progress(&format!("{profile}: {}", r.row.label));
            let m = match r.row.kind {
                k @ Kind::Udpx { .. } => run_udpx(path, k, cfg),
                Kind::Iperf3 { udp } => run_iperf3(path, udp, cfg),
            };
            match m {
                Ok(m) => r.runs.push(Measurement { run: pass, ..m }),
                Err(e) => r.errors.push(format!("run {}: {e}", pass + 1)),
            }
        }
    }
    results.iter_mut().for_each(RowResult::summarize);
    ProfileResult { profile: profile.to_string(), passes: repeat, rows: results }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn a_row_reports_its_median_run_whole() {
        // Three runs; by cost the median is the run with 1.0 CPU-s/GB (pass 2), and its
        // throughput (2 Gbit/s) is reported beside it, not the median throughput (3).
        let run = |pass, busy: f64, gbits: f64| Measurement {
            run: pass,
            busy_secs: busy,
            recv_bytes: 1_000_000_000,
            sent_bytes: 1_000_000_000,
            send_secs: 8.0 / gbits,
            steal_secs: 0.25,
            ..Measurement::default()
        };
        let mut r = RowResult::new(default_rows(false)[0].clone());
        r.runs = vec![run(0, 1.2, 3.0), run(1, 0.8, 4.0), run(2, 1.0, 2.0)];
        r.summarize();
        assert_eq!(r.median_run, Some(2));
        assert!((r.median.cpu_per_gb - 1.0).abs() < 1e-9);
        assert!((r.median.gbits - 2.0).abs() < 1e-9, "the same run's throughput");
        assert!((r.min.cpu_per_gb - 0.8).abs() < 1e-9 && (r.max.cpu_per_gb - 1.2).abs() < 1e-9);
        assert!((r.min.gbits - 2.0).abs() < 1e-9 && (r.max.gbits - 4.0).abs() < 1e-9);
        assert_eq!(r.steal_secs, 0.75, "stolen time of every run, reported per row");
        // Pass 1 failed in another row: figures per pass line up by pass, not by position.
        r.runs.remove(1);
        assert_eq!(r.per_run(3, |f| f.cpu_per_gb).iter().map(Option::is_some).collect::<Vec<_>>(), [true, false, true]);
    }

    #[test]
    fn presets_estimate_their_wall_time() {
        // 16 rows (2 iperf3), 2 profiles: the default stays near 3 minutes, thorough is longer.
        let default = Preset::DEFAULT.estimate(16, 2, 2).as_secs_f64();
        let thorough = Preset::THOROUGH.estimate(16, 2, 2).as_secs_f64();
        assert!((150.0..=210.0).contains(&default), "{default}");
        assert!(thorough > 3.0 * default, "{thorough}");
    }

    #[test]
    fn rows_are_unique_and_iperf3_optional() {
        let rows = default_rows(true);
        let mut ids: Vec<_> = rows.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), rows.len());
        assert_eq!(default_rows(false).len() + 2, rows.len());
    }
}
