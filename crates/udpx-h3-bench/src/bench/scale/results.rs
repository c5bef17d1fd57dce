//! What the scale table measures: a run of one row (the server's and the client's figures,
//! the host's counts per request, the qlog writer's rates), a row, the bench whole, and the
//! limits its verdicts read.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use udpx_lab::env::Environment;
use udpx_lab::judge::Check;
use udpx_lab::stats::{Kept, Run};
use udpx_lab::steal::{Steal, WithSteal};

use super::config::{LoadClient, ScaleConfig, ScaleServer};
use crate::clients::own::LoadReport;

/// A row whose client used more than this share of its CPU measured the client.
pub const CLIENT_LIMIT_PCT: f64 = 80.0;

/// One row: its runs (one per round) and the median one by server CPU.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    /// Which server.
    pub server: ScaleServer,
    /// Which client.
    pub client: LoadClient,
    /// Connections.
    pub connections: usize,
    /// The idle row.
    pub idle: bool,
    /// Every run, in round order (`None` where it failed).
    pub runs: Vec<Option<RowRun>>,
    /// The median clean run by server CPU per byte (by CPU share for the idle row).
    pub median: Option<RowRun>,
    /// The first failure.
    pub error: Option<String>,
    /// Runs planned, clean, stolen and failed.
    pub kept: Kept,
}

impl ScaleRow {
    pub(super) fn costs(&self) -> Vec<Run> {
        self.per_run(&|r| r.server_cpu_s_per_gb)
    }

    /// `f` of each run (failed where the run failed or has no such figure), marked as the
    /// steal rule says.
    pub(super) fn per_run(&self, f: &dyn Fn(&RowRun) -> Option<f64>) -> Vec<Run> {
        per_run(&self.runs, f)
    }
}

/// `f` of each of `runs` (failed where the run failed or has no such figure), marked as the
/// steal rule says.
pub(super) fn per_run<T: WithSteal>(runs: &[Option<T>], f: &dyn Fn(&T) -> Option<f64>) -> Vec<Run> {
    runs.iter().map(|x| Run::maybe(x.as_ref().and_then(|r| Some((f(r)?, r.steal()))))).collect()
}

/// What a row's median run is chosen by: server CPU per byte, CPU share for the idle row.
pub(super) fn median_key(idle: bool) -> impl Fn(&RowRun) -> Option<f64> {
    move |r: &RowRun| if idle { Some(r.server_cpu_pct) } else { Some(r.server_cpu_s_per_gb.unwrap_or(f64::MAX)) }
}

/// A run whose client dropped more than this share of the datagrams it processed, percent
/// ([`LoadReport::client_dropped`]: quic-go's per-connection queue of 256 unprocessed packets
/// overflowed while a connection's goroutine was behind), measured the client's losses: its
/// latency is not the server's.
pub const CLIENT_DROP_PCT: f64 = 0.1;

/// One run of a row.
#[derive(Debug, Clone, Serialize)]
pub struct RowRun {
    /// The client's figures.
    pub load: LoadReport,
    /// The server CPU's busy share over the window, percent of one CPU.
    pub server_cpu_pct: f64,
    /// The server process's own CPU time over the window (its threads' `schedstat`, to the
    /// nanosecond), percent of one CPU: a cross-check of the CPU's busy share (the rest on that
    /// CPU is softirq and NAPI work for it, or anything else that ran there).
    pub server_process_pct: f64,
    /// Server CPU-seconds per GB of body received by the client.
    pub server_cpu_s_per_gb: Option<f64>,
    /// The same from the process's own CPU time: it leaves out the receive work done outside
    /// the process, and the machine's own agents with it, so it measures rows too light for
    /// the CPU's busy share (the scaling check's small rows).
    pub server_process_s_per_gb: Option<f64>,
    /// Server CPU-microseconds per connection-second.
    pub server_cpu_us_per_conn_s: f64,
    /// The server process's context switches over the window per request sent in it (each
    /// voluntary one a wake-up after a sleep): how often the server had to be woken for the work.
    pub server_switches_per_request: Option<f64>,
    /// The server's resident memory per connection, KiB: the larger of its resident set at the
    /// window's start and end, less before the first connection.
    pub server_kib_per_conn: Option<f64>,
    /// The client was above [`CLIENT_LIMIT_PCT`] of its CPU: this row measured the client.
    pub client_limited: bool,
    /// The client's CPU (all of its work on it) busy while the connections opened, percent.
    pub client_ramp_pct: Option<f64>,
    /// That was above [`CLIENT_LIMIT_PCT`]: the connections' first round trips carry the
    /// client's own queueing (see [`PLAYER_OPENS_PER_SEC`](crate::bench::scale::PLAYER_OPENS_PER_SEC)); the row's latency is not the
    /// server's.
    pub client_ramp_limited: bool,
    /// udpx rows: the server's own counts over the window, per request (its `/metrics`,
    /// read at the window's start and end).
    pub host: Option<HostPerRequest>,
    /// udpx rows: datagrams the server received and sent over the window (its `/metrics`).
    pub datagrams: Option<DatagramRates>,
    /// `udpx h3 +qlog` rows: what the qlog writer did over the window.
    pub qlog: Option<QlogRates>,
    /// The steal from the server's and the client's CPUs over the window (`steal_s`,
    /// `steal_share`, `stolen`).
    #[serde(flatten)]
    pub steal: Steal,
}

impl WithSteal for RowRun {
    fn steal(&self) -> &Steal {
        &self.steal
    }
}

impl RowRun {
    /// The client's host lost more than [`CLIENT_DROP_PCT`] as many datagrams as it processed.
    pub fn client_dropped(&self) -> bool {
        self.load.client_dropped_pct().is_some_and(|p| p > CLIENT_DROP_PCT)
    }

    /// Neither the client's CPU (in the window or while the connections opened) nor its own
    /// queues limited this run: its latency is the server's and the path's.
    pub fn client_free(&self) -> bool {
        !self.client_limited && !self.client_ramp_limited && !self.client_dropped()
    }

    /// What limited the run on the client's side, for the table (empty: nothing).
    pub fn client_limit_note(&self) -> &'static str {
        match (self.client_limited, self.client_ramp_limited, self.client_dropped()) {
            (true, _, _) => " (client-limited)",
            (false, true, _) => " (client-limited while opening)",
            (false, false, true) => " (client-limited: it dropped datagrams)",
            _ => "",
        }
    }
}

/// What the udpx server received and sent over a row's window: the idle row's load, the rate
/// its echo floor ([`EchoFloor`]) is measured at.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DatagramRates {
    /// Datagrams received per second.
    pub received_per_s: f64,
    /// Datagrams sent per second.
    pub sent_per_s: f64,
    /// Mean UDP payload of a received datagram, bytes.
    pub received_size: f64,
}

impl DatagramRates {
    pub(super) fn from_scrapes(a: &HashMap<String, f64>, b: &HashMap<String, f64>, secs: f64) -> Option<DatagramRates> {
        let d = |k: &str| counter_delta(a, b, k);
        let (rx, tx, bytes) = (d("datagrams_received")?, d("datagrams_sent")?, d("bytes_received")?);
        Some(DatagramRates {
            received_per_s: rx / secs,
            sent_per_s: tx / secs,
            received_size: if rx > 0.0 { bytes / rx } else { 0.0 },
        })
    }
}

/// What the qlog writer did over a `udpx h3 +qlog` row's window (its `/metrics`).
///
/// Its connections are all chosen (`--qlog-sample 1`), at most `--qlog-max-live` of them log at
/// once (the server's default).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QlogRates {
    /// Records queued for the files, per second.
    pub records_per_s: f64,
    /// Records dropped (the writer's queue full, or the byte bound reached), per second.
    pub dropped_per_s: f64,
    /// Bytes queued, per second.
    pub bytes_per_s: f64,
    /// Files made by the window's end.
    pub files: f64,
    /// Connections not logged by then: others logging (`--qlog-max-live`).
    pub busy: f64,
    /// Connections not logged by then: the file bound.
    pub skipped: f64,
}

impl QlogRates {
    pub(super) fn from_scrapes(a: &HashMap<String, f64>, b: &HashMap<String, f64>, secs: f64) -> Option<QlogRates> {
        let d = |k: &str| Some(b.get(&format!("qlog_{k}_total"))? - a.get(&format!("qlog_{k}_total"))?);
        Some(QlogRates {
            records_per_s: d("records")? / secs,
            dropped_per_s: d("dropped")? / secs,
            bytes_per_s: d("bytes")? / secs,
            files: *b.get("qlog_files_total")?,
            busy: b.get("qlog_busy_total").copied().unwrap_or(0.0),
            skipped: *b.get("qlog_skipped_total")?,
        })
    }

    /// The share of records dropped, percent.
    pub fn dropped_pct(&self) -> f64 {
        let all = self.records_per_s + self.dropped_per_s;
        if all > 0.0 {
            self.dropped_per_s * 100.0 / all
        } else {
            0.0
        }
    }
}

/// The floor under the idle row: a bare echo server (sockperf's, in C: one blocking receive and
/// one send per datagram) answering datagrams of the idle row's mean size at the rate the udpx
/// server received them, on the same CPU, path and meter. An event-driven server that wakes
/// once per datagram cannot cost less than this; below it only batching across datagrams
/// (waiting for several: `--coalesce`) goes.
#[derive(Debug, Clone, Serialize)]
pub struct EchoFloor {
    /// The round.
    pub round: usize,
    /// Datagrams per second sent to it.
    pub rate: u64,
    /// Their size, bytes.
    pub size: usize,
    /// The server CPU's busy share over the window, percent (as a row's).
    pub server_cpu_pct: f64,
    /// sockperf's server process, percent of one CPU.
    pub server_process_pct: f64,
    /// Datagrams sent and answered, from sockperf's client.
    pub sent: u64,
    /// Answers received.
    pub answered: u64,
    /// The steal from the server's and the client's CPUs over the window.
    #[serde(flatten)]
    pub steal: Steal,
}

/// What the udpx server's host did per request over the measured window (issue 27 asks for
/// messages and datagrams per call at 10,000 connections).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct HostPerRequest {
    /// Requests the client sent in the window.
    pub requests: u64,
    /// Send system calls per request.
    pub send_calls: f64,
    /// Datagrams per send call.
    pub datagrams_per_send: f64,
    /// GSO runs (transmits) per send call: messages per `sendmmsg`.
    pub runs_per_send: f64,
    /// Receive system calls per request.
    pub recv_calls: f64,
    /// Datagrams per receive call.
    pub datagrams_per_recv: f64,
    /// Times the loop waited in `ppoll` (wake-ups), per request.
    pub wakeups: f64,
    /// Loop turns per request.
    pub turns: f64,
    /// Connections served per turn.
    pub served_per_turn: f64,
    /// Deadlines that came due (quiche's timers, pacing releases), per request.
    pub timers_fired: f64,
    /// Packets held back until their pacing release time, per request.
    pub paced_holds: f64,
    /// Bytes read from files per request (`http_file_bytes_read`): a segment's size when each
    /// request reads the file, near none when the block cache serves it (`udpx h3 +cache`);
    /// `None` from a server that does not export it.
    pub file_bytes_read: Option<f64>,
}

impl HostPerRequest {
    /// From two scrapes of `quic_*` counters (summed over shards) and the window's requests.
    pub(super) fn from_scrapes(
        a: &HashMap<String, f64>,
        b: &HashMap<String, f64>,
        requests: u64,
    ) -> Option<HostPerRequest> {
        if requests == 0 {
            return None; // the idle row: no requests to count per
        }
        let d = |k: &str| counter_delta(a, b, k);
        let per = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
        let (send, dgs, runs) = (d("send_calls")?, d("datagrams_sent")?, d("transmits")?);
        let (recv, dgr, waits, turns, served) =
            (d("recv_calls")?, d("datagrams_received")?, d("waits")?, d("turns")?, d("served")?);
        let (fired, held) = (d("timers_fired")?, d("paced_holds")?);
        let read = delta(a, b, "http_file_bytes_read_total");
        let r = requests as f64;
        Some(HostPerRequest {
            requests,
            send_calls: send / r,
            datagrams_per_send: per(dgs, send),
            runs_per_send: per(runs, send),
            recv_calls: recv / r,
            datagrams_per_recv: per(dgr, recv),
            wakeups: waits / r,
            turns: turns / r,
            served_per_turn: per(served, turns),
            timers_fired: fired / r,
            paced_holds: held / r,
            file_bytes_read: read.map(|x| x / r),
        })
    }
}

/// How much the host counter `quic_<name>_total` grew from scrape `a` to scrape `b`.
pub(super) fn counter_delta(a: &HashMap<String, f64>, b: &HashMap<String, f64>, name: &str) -> Option<f64> {
    delta(a, b, &format!("quic_{name}_total"))
}

/// How much the sample `key` grew from scrape `a` to scrape `b`.
fn delta(a: &HashMap<String, f64>, b: &HashMap<String, f64>, key: &str) -> Option<f64> {
    Some(b.get(key)? - a.get(key)?)
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleBench {
    /// Settings.
    pub config: ScaleConfig,
    /// The path, in words.
    pub path: String,
    /// The rows.
    pub rows: Vec<ScaleRow>,
    /// Rows not run, and why.
    pub left_out: Vec<String>,
    /// The server's CPU busy share with nothing of the bench running on it (sampled for
    /// [`BASELINE`] before the rows), percent: this VM's own agents and timers. A row's server
    /// CPU includes it.
    pub baseline_pct: Option<f64>,
    /// The idle row's echo floor, per round ([`EchoFloor`]).
    pub idle_floor: Vec<EchoFloor>,
    /// Why a round has no echo floor.
    pub idle_floor_errors: Vec<String>,
    /// The targets, judged.
    pub checks: Vec<Check>,
    /// Kernel, CPU, devices.
    pub environment: Environment,
}

/// How long the server CPU's baseline is sampled.
pub const BASELINE: Duration = Duration::from_secs(3);
/// A baseline above this share of the server CPU is sampled again (what ran just before, a
/// test suite or a build, may still be settling), for at most [`SETTLE_MAX`].
pub const SETTLED_PCT: f64 = 2.0;
/// The longest the bench waits for the baseline to settle before it goes on with it as it is.
pub const SETTLE_MAX: Duration = Duration::from_secs(15);
/// The scaling check compares the top row with the smallest row whose udpx server CPU is at
/// least this many times the baseline: below that it would measure the baseline.
pub const ABOVE_BASELINE: f64 = 10.0;
