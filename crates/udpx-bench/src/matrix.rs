//! The main job's matrix: the paper's rows (TCP, UDP, sendmmsg, GSO, cache thrashing, GRO)
//! plus iperf3 as an independent peer, run interleaved (A B C … A B C …) so slow drift of a
//! noisy machine spreads over all rows, and summarized by medians.

use serde::Serialize;
use udpx::SendMode;

use crate::run::{per_gb, run_iperf3, run_udpx, Kind, Measurement, Path, RunConfig};
use crate::tx::{Proto, Zc};

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

    /// Field-wise median.
    pub fn median(all: &[Figures]) -> Figures {
        let med = |f: fn(&Figures) -> f64| median(all.iter().map(f).collect());
        Figures {
            gbits: med(|x| x.gbits),
            cpu_per_gb: med(|x| x.cpu_per_gb),
            tx_cpu_per_gb: med(|x| x.tx_cpu_per_gb),
            rx_cpu_per_gb: med(|x| x.rx_cpu_per_gb),
            tx_cpu_per_gb_sent: med(|x| x.tx_cpu_per_gb_sent),
            send_calls_per_s: med(|x| x.send_calls_per_s),
            datagrams_per_call: med(|x| x.datagrams_per_call),
            recv_calls_per_s: med(|x| x.recv_calls_per_s),
            datagrams_per_recv: med(|x| x.datagrams_per_recv),
            delivered: med(|x| x.delivered),
        }
    }
}

/// Median (mean of the middle two for an even count; NaN for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A row's results in one profile.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    /// The row.
    pub row: Row,
    /// Every repetition.
    pub runs: Vec<Measurement>,
    /// Medians of the repetitions' figures.
    pub median: Figures,
    /// Why a repetition failed, if one did.
    pub errors: Vec<String>,
}

/// All rows of one path profile.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileResult {
    /// `offload`, `software` or `loopback`.
    pub profile: String,
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
    let mut results: Vec<RowResult> = rows
        .iter()
        .map(|r| RowResult { row: r.clone(), runs: Vec::new(), median: Figures::default(), errors: Vec::new() })
        .collect();
    for _ in 0..repeat {
        for r in results.iter_mut() {
            progress(&format!("{profile}: {}", r.row.label));
            let m = match r.row.kind {
                k @ Kind::Udpx { .. } => run_udpx(path, k, cfg),
                Kind::Iperf3 { udp } => run_iperf3(path, udp, cfg),
            };
            match m {
                Ok(m) => r.runs.push(m),
                Err(e) => r.errors.push(e),
            }
        }
    }
    for r in results.iter_mut() {
        let figs: Vec<Figures> = r.runs.iter().map(Figures::of).collect();
        r.median = Figures::median(&figs);
    }
    ProfileResult { profile: profile.to_string(), rows: results }
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
    fn rows_are_unique_and_iperf3_optional() {
        let rows = default_rows(true);
        let mut ids: Vec<_> = rows.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), rows.len());
        assert_eq!(default_rows(false).len() + 2, rows.len());
    }
}
