//! The main job's matrix: the paper's rows (TCP, UDP, sendmmsg, GSO, cache thrashing, GRO)
//! plus iperf3 as an independent peer, run interleaved (A B C … A B C …) so slow drift of a
//! noisy machine spreads over all rows, and summarized by each row's median run with the
//! range over runs ([`crate::stats`]).

use std::time::Duration;

use serde::Serialize;
use udpx::SendMode;

use crate::raw::Shape;
use crate::run::{per_gb, run_iperf3, run_raw, run_udpx, Kind, Measurement, Path, RawRx, RunConfig};
use crate::stats::{another_round, paired_ratios, Kept, Run, Spread};
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
    /// Run the [`extended_rows`] too.
    pub all_rows: bool,
}

impl Preset {
    /// `udpx bench`: about 3.4 minutes for the two veth profiles with iperf3 (see
    /// [`Preset::estimate`]; 18 rows since the raw reference came in, the [`extended_rows`]
    /// left out).
    pub const DEFAULT: Preset = Preset { runs: 3, row_secs: 1.5, all_rows: false };
    /// `udpx bench --thorough`, for figures to publish: every row, 7 runs (min-max covers the
    /// median ratio 98 % of the time) of 3 s rows; about 30 minutes.
    pub const THOROUGH: Preset = Preset { runs: 7, row_secs: 3.0, all_rows: true };

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

/// A row's receiver: one datagram or a batch per call, coalesced (GRO) or not.
#[derive(Debug, Clone, Copy)]
enum Rx {
    /// `recvmsg`, one datagram per call.
    Recvmsg,
    /// `recvmmsg`, a batch per call.
    Recvmmsg,
    /// `recvmsg` with GRO.
    Gro,
    /// `recvmmsg` with GRO.
    GroMmsg,
}

impl Rx {
    const fn batch(self) -> bool {
        matches!(self, Rx::Recvmmsg | Rx::GroMmsg)
    }

    const fn gro(self) -> bool {
        matches!(self, Rx::Gro | Rx::GroMmsg)
    }
}

/// How a row's sender makes its calls.
#[derive(Debug, Clone, Copy)]
enum Sender {
    /// System calls.
    Syscalls,
    /// io_uring entries.
    IoUring,
}

const fn udpx(id: &'static str, label: &'static str, proto: Proto, rx: Rx, cache_thrash: bool) -> Row {
    let (gro, batch_rx) = (rx.gro(), rx.batch());
    Row {
        id,
        label,
        kind: Kind::Udpx { proto, gro, batch_rx, cache_thrash, zerocopy: Zc::Off, rcvbuf: None, io_uring: false },
    }
}

/// A row like [`udpx`]'s whose sender goes through io_uring (issue 12: beside the same row on
/// system calls).
const fn uring(id: &'static str, label: &'static str, proto: Proto, rx: Rx) -> Row {
    let (gro, batch_rx) = (rx.gro(), rx.batch());
    Row {
        id,
        label,
        kind: Kind::Udpx { proto, gro, batch_rx, cache_thrash: false, zerocopy: Zc::Off, rcvbuf: None, io_uring: true },
    }
}

const fn raw(id: &'static str, label: &'static str, shape: Shape, rx: RawRx) -> Row {
    Row { id, label, kind: Kind::Raw { shape, rx } }
}

const fn zc(id: &'static str, label: &'static str, cache_thrash: bool, zerocopy: Zc, sender: Sender) -> Row {
    let proto = Proto::Udp(SendMode::GsoSendmsg);
    let io_uring = matches!(sender, Sender::IoUring);
    Row {
        id,
        label,
        kind: Kind::Udpx { proto, gro: false, batch_rx: false, cache_thrash, zerocopy, rcvbuf: None, io_uring },
    }
}

/// The receive buffer of the `rcvbuf-32m` row: the old forced default (64 MiB effective).
pub const RCVBUF_32M: usize = 32 << 20;

/// The rows of the main job under `preset`. `iperf3`: include the iperf3 rows; with
/// [`Preset::all_rows`], also the rows the default leaves out to stay near 3 minutes
/// ([`extended_rows`]).
///
/// The baseline `udp` is the stock program: one `sendmsg` and one `recvmsg` per datagram, as
/// the kernel's udpgso_bench and iperf3 do. Rows that change the sender keep that receiver, so
/// each row isolates one mechanism (the paper's Figure 1); the batched rows batch both sides;
/// the GRO rows change the receiver (Figure 5). The `raw` rows are the bare system calls of
/// the same shapes ([`crate::raw`]); `raw …>udpx` rows put udpx's receiver behind the raw
/// sender, to judge the receiver alone.
pub fn default_rows(iperf3: bool, preset: Preset) -> Vec<Row> {
    use Proto::{Tcp, Udp};
    use SendMode::*;
    let mut rows = vec![
        udpx("tcp", TCP_LABEL, Tcp, Rx::Recvmsg, false),
        udpx("udp", "UDP sendmsg>recvmsg", Udp(Sendmsg), Rx::Recvmsg, false),
        udpx("udp-mmsg", "UDP sendmmsg>recvmmsg", Udp(Sendmmsg), Rx::Recvmmsg, false),
        udpx("udp-gso", "UDP GSO>recvmsg", Udp(GsoSendmsg), Rx::Recvmsg, false),
        udpx("udp-gso-mmsg", "UDP GSO+mmsg>recvmmsg", Udp(GsoSendmmsg), Rx::Recvmmsg, false),
        udpx("udp-gso-gro", "UDP GSO>GRO", Udp(GsoSendmsg), Rx::Gro, false),
        udpx("udp-gso-mmsg-gro", "UDP GSO+mmsg>GRO+mmsg", Udp(GsoSendmmsg), Rx::GroMmsg, false),
        Row {
            id: "udp-gso-gro-32m",
            label: "UDP GSO>GRO rcvbuf 32M",
            kind: Kind::Udpx {
                proto: Udp(GsoSendmsg),
                gro: true,
                batch_rx: false,
                cache_thrash: false,
                zerocopy: Zc::Off,
                rcvbuf: Some(RCVBUF_32M),
                io_uring: false,
            },
        },
        zc("udp-gso-zc", "UDP GSO+zerocopy", false, Zc::Auto, Sender::Syscalls),
        raw("raw", "raw send>recv", Shape::Plain, RawRx::Raw),
        raw("raw-gso", "raw GSO>recv", Shape::Gso, RawRx::Raw),
        raw("raw-gso-gro", "raw GSO>GRO recv", Shape::GsoGro, RawRx::Raw),
        raw("raw>udpx", "raw send>udpx recvmsg", Shape::Plain, RawRx::Udpx { pktinfo_ecn: false }),
        raw("raw-gso>udpx", "raw GSO>udpx recvmsg", Shape::Gso, RawRx::Udpx { pktinfo_ecn: false }),
        raw("raw-gso>udpx-gro", "raw GSO>udpx GRO", Shape::GsoGro, RawRx::Udpx { pktinfo_ecn: false }),
        raw("raw-gso>udpx-gro-meta", "raw GSO>udpx GRO+pktinfo+ECN", Shape::GsoGro, RawRx::Udpx { pktinfo_ecn: true }),
    ];
    if preset.all_rows {
        rows.extend(extended_rows());
    }
    if iperf3 {
        rows.insert(1, Row { id: "iperf3-tcp", label: "TCP (iperf3)", kind: Kind::Iperf3 { udp: false } });
        rows.push(Row { id: "iperf3-udp", label: "UDP (iperf3)", kind: Kind::Iperf3 { udp: true } });
    }
    rows
}

/// The label of udpx's TCP row, with its write size.
pub const TCP_LABEL: &str = "TCP (udpx, 128K writes)";
const _: () = assert!(crate::tx::TCP_WRITE == 128 << 10, "TCP_LABEL names the write size");

/// Rows run only with `--all-rows` (and `--thorough`): cache thrashing, plain UDP into a GRO
/// socket, forced or cache-thrashing zerocopy, and the io_uring send backend beside its
/// system-call rows (`uring`: linked SENDMSG entries, one `io_uring_enter` per batch; zerocopy as
/// SENDMSG_ZC). They were the least informative for the
/// default job once the raw rows came in (each measured a mechanism once: cache thrashing
/// costs the GSO sender about 28 % per byte; forced zerocopy 21-29 % on lo and veth, where
/// the kernel always copies).
pub fn extended_rows() -> Vec<Row> {
    use Proto::Udp;
    use SendMode::*;
    vec![
        udpx("udp-ct", "UDP (CT)", Udp(Sendmsg), Rx::Recvmsg, true),
        udpx("udp-gso-ct", "UDP GSO (CT)", Udp(GsoSendmsg), Rx::Recvmsg, true),
        udpx("udp-gro", "UDP>GRO", Udp(Sendmsg), Rx::Gro, false),
        zc("udp-gso-zc-forced", "UDP GSO+zerocopy forced", false, Zc::Forced, Sender::Syscalls),
        zc("udp-gso-ct-zc", "UDP GSO (CT)+zerocopy", true, Zc::Auto, Sender::Syscalls),
        zc("udp-gso-ct-zc-forced", "UDP GSO (CT)+zc forced", true, Zc::Forced, Sender::Syscalls),
        // The forced zerocopy row through io_uring: SENDMSG_ZC entries, completions from the
        // ring's notifications instead of the error queue.
        zc("udp-gso-zc-forced-uring", "UDP GSO+zc forced+uring", false, Zc::Forced, Sender::IoUring),
        uring("udp-uring", "UDP uring>recvmsg", Udp(Sendmsg), Rx::Recvmsg),
        uring("udp-mmsg-uring", "UDP uring-mmsg>recvmmsg", Udp(Sendmmsg), Rx::Recvmmsg),
        uring("udp-gso-mmsg-uring", "UDP GSO+uring>recvmmsg", Udp(GsoSendmmsg), Rx::Recvmmsg),
        uring("udp-gso-mmsg-gro-uring", "UDP GSO+uring>GRO+mmsg", Udp(GsoSendmmsg), Rx::GroMmsg),
    ]
}

/// A row the job did not run, and why (printed and in the JSON, so a missing peer is never
/// silent).
#[derive(Debug, Clone, Serialize)]
pub struct LeftOut {
    /// The row's id.
    pub id: &'static str,
    /// Its label.
    pub label: &'static str,
    /// Why.
    pub why: String,
}

/// The rows left out of a job: the iperf3 peers when `iperf3_why` says why (not on `PATH`,
/// or `--no-iperf3`), and the [`extended_rows`] unless `all`.
pub fn left_out(iperf3_why: Option<&str>, all: bool) -> Vec<LeftOut> {
    let mut v = Vec::new();
    if let Some(why) = iperf3_why {
        for (id, label) in [("iperf3-tcp", "TCP (iperf3)"), ("iperf3-udp", "UDP (iperf3)")] {
            v.push(LeftOut { id, label, why: why.to_string() });
        }
    }
    if !all {
        for r in extended_rows() {
            v.push(LeftOut { id: r.id, label: r.label, why: "not in the default job (run with --all-rows)".into() });
        }
    }
    v
}

/// The raw row of the same shape as row `kind`, by id: the plain, GSO and GSO+GRO udpx rows
/// (sendmmsg and GSO+sendmmsg map to the shape of their receiver), and the raw>udpx rows
/// (judged against the raw receiver behind the same sender). `None` for the others (TCP,
/// cache thrashing, zerocopy, plain into GRO, iperf3, the raw rows themselves).
pub fn raw_ref(kind: &Kind) -> Option<&'static str> {
    let id = |shape: Shape| match shape {
        Shape::Plain => "raw",
        Shape::Gso => "raw-gso",
        Shape::GsoGro => "raw-gso-gro",
    };
    match *kind {
        Kind::Udpx { proto: Proto::Udp(mode), gro, cache_thrash: false, zerocopy: Zc::Off, .. } => {
            let gso = matches!(mode, SendMode::GsoSendmsg | SendMode::GsoSendmmsg);
            match (gso, gro) {
                (false, false) => Some(id(Shape::Plain)),
                (true, false) => Some(id(Shape::Gso)),
                (true, true) => Some(id(Shape::GsoGro)),
                (false, true) => None,
            }
        }
        Kind::Raw { shape, rx: RawRx::Udpx { .. } } => Some(id(shape)),
        _ => None,
    }
}

/// A row against the raw row of its shape: per-run ratios of cost (CPU-s per delivered GB,
/// both CPUs) and of delivery (delivered fraction), median with min-max ([`crate::stats`]).
#[derive(Debug, Clone, Serialize)]
pub struct VsRaw {
    /// The raw row's id.
    pub raw: &'static str,
    /// This row's cost over the raw row's, per run.
    pub cost: Spread,
    /// This row's delivered fraction over the raw row's, per run.
    pub delivered: Spread,
}

/// Fills [`RowResult::vs_raw`] for every row that has a raw row of its shape in `p`.
pub fn attach_vs_raw(p: &mut ProfileResult) {
    let passes = p.passes;
    type PerRun = Vec<Run>;
    let figures: Vec<(PerRun, PerRun)> =
        p.rows.iter().map(|r| (r.per_run(passes, |f| f.cpu_per_gb), r.per_run(passes, |f| f.delivered))).collect();
    for i in 0..p.rows.len() {
        let Some(raw) = raw_ref(&p.rows[i].row.kind) else { continue };
        let Some(j) = p.rows.iter().position(|r| r.row.id == raw && !r.runs.is_empty()) else { continue };
        let cost = Spread::of(&paired_ratios(&figures[i].0, &figures[j].0));
        let delivered = Spread::of(&paired_ratios(&figures[i].1, &figures[j].1));
        if cost.n > 0 {
            p.rows[i].vs_raw = Some(VsRaw { raw, cost, delivered });
        }
    }
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
    /// Runs planned, clean, stolen (each run's steal is in `runs[]`: `steal_s`,
    /// `steal_share`, `stolen`) and failed; the median and the ranges are of the clean runs.
    pub kept: Kept,
    /// Why a repetition failed, if one did.
    pub errors: Vec<String>,
    /// Against the raw row of the same shape, when there is one ([`attach_vs_raw`]).
    pub vs_raw: Option<VsRaw>,
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
            kept: Kept::default(),
            errors: Vec::new(),
            vs_raw: None,
        }
    }

    /// Sets `median`, `min` and `max` from the clean runs, and `kept`; `planned`: the passes
    /// meant, `passes`: the passes run (extra ones made up stolen runs).
    pub fn summarize(&mut self, planned: usize, passes: usize) {
        let costs = self.per_run(passes, |f| f.cpu_per_gb);
        self.kept = Kept::of(&costs, planned);
        let clean: Vec<&Measurement> = self.runs.iter().filter(|m| !m.steal.stolen).collect();
        let figs: Vec<Figures> = clean.iter().map(|m| Figures::of(m)).collect();
        let at = self.kept.median_run.and_then(|pass| clean.iter().position(|m| m.run == pass));
        self.median = at.map(|i| figs[i]).unwrap_or_default();
        self.median_run = self.kept.median_run;
        (self.min, self.max) = Figures::range(&figs);
    }

    /// One figure per pass `0..passes`: failed where that pass failed, marked where it was
    /// stolen ([`Run`]).
    pub fn per_run(&self, passes: usize, f: impl Fn(&Figures) -> f64) -> Vec<Run> {
        (0..passes)
            .map(|i| {
                self.runs.iter().find(|m| m.run == i).map_or(Run::Failed, |m| Run::of(f(&Figures::of(m)), &m.steal))
            })
            .collect()
    }
}

/// All rows of one path profile.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileResult {
    /// `offload`, `software` or `loopback`.
    pub profile: String,
    /// Passes over the rows run (runs per row, if none failed), extra ones included.
    pub passes: usize,
    /// Passes planned: `passes` less the extra ones that made up stolen runs.
    pub planned: usize,
    /// Rows in table order.
    pub rows: Vec<RowResult>,
}

impl ProfileResult {
    /// The row with this id.
    pub fn get(&self, id: &str) -> Option<&RowResult> {
        self.rows.iter().find(|r| r.row.id == id && !r.runs.is_empty())
    }
}

/// Runs `rows` `repeat` times, interleaved, over `path`, and then extra passes (at most
/// `repeat`) while a row is short of clean runs ([`another_round`]); `progress(label)` before
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
    let mut pass = 0;
    while another_round(repeat, pass, results.iter().map(|r| Kept::of(&r.per_run(pass, |f| f.cpu_per_gb), repeat))) {
        for r in results.iter_mut() {
            progress(&format!("{profile}: {}", r.row.label));
            let m = match r.row.kind {
                k @ Kind::Udpx { .. } => run_udpx(path, k, cfg),
                k @ Kind::Raw { .. } => run_raw(path, k, cfg),
                Kind::Iperf3 { udp } => run_iperf3(path, udp, cfg),
            };
            match m {
                Ok(m) => r.runs.push(Measurement { run: pass, ..m }),
                Err(e) => r.errors.push(format!("run {}: {e}", pass + 1)),
            }
        }
        pass += 1;
    }
    results.iter_mut().for_each(|r| r.summarize(repeat, pass));
    let mut p = ProfileResult { profile: profile.to_string(), passes: pass, planned: repeat, rows: results };
    attach_vs_raw(&mut p);
    p
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
            ..Measurement::default()
        };
        let mut r = RowResult::new(default_rows(false, Preset::DEFAULT)[0].clone());
        r.runs = vec![run(0, 1.2, 3.0), run(1, 0.8, 4.0), run(2, 1.0, 2.0)];
        r.summarize(3, 3);
        assert_eq!(r.median_run, Some(2));
        assert!((r.median.cpu_per_gb - 1.0).abs() < 1e-9);
        assert!((r.median.gbits - 2.0).abs() < 1e-9, "the same run's throughput");
        assert!((r.min.cpu_per_gb - 0.8).abs() < 1e-9 && (r.max.cpu_per_gb - 1.2).abs() < 1e-9);
        assert!((r.min.gbits - 2.0).abs() < 1e-9 && (r.max.gbits - 4.0).abs() < 1e-9);
        // Pass 1 failed in another row: figures per pass line up by pass, not by position.
        r.runs.remove(1);
        assert_eq!(
            r.per_run(3, |f| f.cpu_per_gb).iter().map(|x| x.measured()).collect::<Vec<_>>(),
            [true, false, true]
        );
        // Pass 2 (the median) stolen: a fourth pass made it up; the median of the clean runs
        // 1.2 and 0.9 is the cheaper, pass 3, and pass 2 is in no range.
        r.runs[1].steal = udpx_lab::steal::Steal { steal_s: 0.5, steal_share: 0.1, stolen: true };
        r.runs.push(run(3, 0.9, 5.0));
        r.summarize(3, 4);
        assert_eq!((r.kept.clean, r.kept.stolen, r.kept.failed, r.kept.short()), (2, 1, 1, false));
        assert_eq!(r.median_run, Some(3));
        assert!((r.median.gbits - 5.0).abs() < 1e-9);
        assert!((r.min.gbits - 3.0).abs() < 1e-9 && (r.max.gbits - 5.0).abs() < 1e-9, "{:?}", (r.min, r.max));
    }

    #[test]
    fn presets_estimate_their_wall_time() {
        // The default rows with iperf3, 2 profiles: the default stays under 3.5 minutes,
        // thorough (every row) is longer.
        let (d, t) = (default_rows(true, Preset::DEFAULT).len(), default_rows(true, Preset::THOROUGH).len());
        let default = Preset::DEFAULT.estimate(d, 2, 2).as_secs_f64();
        let thorough = Preset::THOROUGH.estimate(t, 2, 2).as_secs_f64();
        assert!((150.0..=210.0).contains(&default), "{default}");
        assert!(thorough > 3.0 * default, "{thorough}");
    }

    #[test]
    fn udpx_rows_map_to_their_raw_shape() {
        let rows = default_rows(true, Preset::THOROUGH);
        let refs: Vec<(&str, Option<&str>)> = rows.iter().map(|r| (r.id, raw_ref(&r.kind))).collect();
        let want = [
            ("udp", Some("raw")),
            ("udp-mmsg", Some("raw")),
            ("udp-gso", Some("raw-gso")),
            ("udp-gso-mmsg", Some("raw-gso")),
            ("udp-gso-gro", Some("raw-gso-gro")),
            ("udp-gso-mmsg-gro", Some("raw-gso-gro")),
            ("udp-gso-gro-32m", Some("raw-gso-gro")),
            ("raw>udpx", Some("raw")),
            ("raw-gso>udpx", Some("raw-gso")),
            ("raw-gso>udpx-gro", Some("raw-gso-gro")),
            ("raw-gso>udpx-gro-meta", Some("raw-gso-gro")),
            ("tcp", None),
            ("raw", None),
            ("udp-gro", None),
            ("udp-gso-ct", None),
            ("udp-gso-zc", None),
            ("iperf3-udp", None),
        ];
        for (id, r) in want {
            assert_eq!(refs.iter().find(|x| x.0 == id).map(|x| x.1), Some(r), "{id}");
        }
    }

    #[test]
    fn vs_raw_pairs_runs() {
        let run = |pass, busy: f64, got: u64| Measurement {
            run: pass,
            busy_secs: busy,
            recv_bytes: 1_000_000_000,
            sent_bytes: 1_000_000_000,
            sent_datagrams: 100,
            recv_datagrams: got,
            send_secs: 1.0,
            ..Measurement::default()
        };
        let rows = default_rows(false, Preset::DEFAULT);
        let mut p = ProfileResult { profile: "offload".into(), passes: 3, planned: 3, rows: Vec::new() };
        for id in ["udp", "raw", "tcp"] {
            let mut r = RowResult::new(rows.iter().find(|r| r.id == id).unwrap().clone());
            r.runs = match id {
                "udp" => vec![run(0, 1.2, 90), run(1, 1.0, 100), run(2, 1.5, 100)],
                "raw" => vec![run(0, 1.0, 100), run(1, 1.0, 100), run(2, 1.0, 80)],
                _ => vec![run(0, 1.0, 100)],
            };
            r.summarize(3, 3);
            p.rows.push(r);
        }
        attach_vs_raw(&mut p);
        let v = p.get("udp").unwrap().vs_raw.as_ref().unwrap();
        assert_eq!(v.raw, "raw");
        assert_eq!((v.cost.median, v.cost.min, v.cost.max, v.cost.n), (1.2, 1.0, 1.5, 3));
        assert_eq!((v.delivered.min, v.delivered.max), (0.9, 1.25));
        assert!(p.get("raw").unwrap().vs_raw.is_none() && p.get("tcp").unwrap().vs_raw.is_none());
    }

    #[test]
    fn left_out_rows_are_named_with_a_reason() {
        let l = left_out(Some("iperf3 is not on PATH"), false);
        assert!(l.iter().any(|x| x.id == "iperf3-tcp" && x.why.contains("PATH")));
        assert!(l.iter().any(|x| x.id == "iperf3-udp"));
        assert_eq!(l.len(), 2 + extended_rows().len());
        assert!(left_out(None, true).is_empty());
    }

    #[test]
    fn rows_are_unique_and_iperf3_optional() {
        let rows = default_rows(true, Preset::THOROUGH);
        let mut ids: Vec<_> = rows.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), rows.len());
        assert_eq!(default_rows(false, Preset::THOROUGH).len() + 2, rows.len());
        assert_eq!(default_rows(true, Preset::DEFAULT).len() + extended_rows().len(), rows.len());
    }
}
