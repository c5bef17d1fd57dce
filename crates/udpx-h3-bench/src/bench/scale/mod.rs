//! `udpx bench h3 --connections N,...`: the seed paper's workload. N clients at once, each a
//! video player fetching a segment every interval ([`crate::load`]), against `udpx h3 serve`,
//! a second HTTP/3 server (quinn with h3, [`crate::quinn_server`]), and nginx over TCP (HTTP/2
//! and HTTP/1.1, TLS 1.3, one worker) under the same schedule ([`crate::load_hyper`]), side by
//! side in one run; and a row of idle connections (no requests, a PING every 10 s by
//! default), beside its floor: a bare echo server answering as many datagrams ([`EchoFloor`]).
//!
//! **Where.** Two namespaces over a veth pair (root; loopback otherwise, said in the table):
//! every server runs as its own process pinned to the last CPU, the client on the first;
//! GRO on both ends, and each side's receive work steered to its own CPU (`--napi`: the
//! client's end in a NAPI thread pinned there, the server's in softirq or a thread, RPS for
//! TCP, which veth never hands to the thread), so every packet's receive work (TCP's
//! ACK-clocked sends included) is charged to the side that receives it. The client sends from
//! many addresses of its namespace (one socket, IP_PKTINFO, for QUIC; a bound socket per
//! connection for TCP).
//!
//! **What is counted.** Server CPU: the busy time of the server's CPU over the measured
//! window, whoever ran there: the server, its NAPI thread, the kernel's work for it. Busy is
//! the larger of the tick-sampled work (`/proc/stat`: user, system, irq, softirq) and the
//! window less the CPU's exactly measured idle and steal ([`udpx_lab::cpu::CpuDelta::busy_time`]): an
//! event-driven server wakes for microseconds at a time and the tick alone undercounts it
//! (by about half, measured). Beside it, the server process's own time on CPU (its threads'
//! `schedstat`, to the nanosecond): it leaves out receive work done outside the process and the
//! machine's agents, so the scaling check also judges by it down to the lightest row, where the
//! CPU's busy share is mostly the agents'. Per byte: over the body bytes the client received
//! in the window; per connection: CPU-seconds per connection-second. Server memory: its
//! resident set once every connection is up (the larger of the window's start and end), less
//! before the first one, per connection. The client's CPU is reported beside every row: a row
//! whose client was above 80 % of its CPU judges the client, not the server, and its latency is
//! not judged.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use udpx_lab::cpu::{CpuSample, TickRate};
use udpx_lab::env::Environment;
use udpx_lab::judge::Check;
use udpx_lab::netns::{ChildGroup, Namespace, Profile, Side, TestNet, TestNetConfig};
use udpx_lab::stats::{another_round, Kept, Run};
use udpx_lab::steal::{Steal, WithSteal};

use super::{write_cert, Scratch};
use crate::independent::Proto;
use crate::load::{self, LoadConfig, LoadReport};
use crate::load_hyper::{self, HyperHttp};
use udpx_lab::task::{process_cpu_secs, process_switches, rss};

mod config;
mod report;
mod servers;

pub(crate) use config::as_text;
pub use config::{LoadClient, ScaleConfig, ScaleServer, IDLE_OPENS_PER_SEC, PLAYER_OPENS_PER_SEC};

pub use report::{judge, table};
use servers::{free_port, start_server};
pub(crate) use servers::{nginx_conf, wait_until_up, SINGLE_PROCESS};

/// The file every player asks for.
const SEGMENT: &str = "segment";
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
    fn costs(&self) -> Vec<Run> {
        self.per_run(&|r| r.server_cpu_s_per_gb)
    }

    /// `f` of each run (failed where the run failed or has no such figure), marked as the
    /// steal rule says.
    fn per_run(&self, f: &dyn Fn(&RowRun) -> Option<f64>) -> Vec<Run> {
        per_run(&self.runs, f)
    }
}

/// `f` of each of `runs` (failed where the run failed or has no such figure), marked as the
/// steal rule says.
fn per_run<T: WithSteal>(runs: &[Option<T>], f: &dyn Fn(&T) -> Option<f64>) -> Vec<Run> {
    runs.iter().map(|x| Run::maybe(x.as_ref().and_then(|r| Some((f(r)?, r.steal()))))).collect()
}

/// What a row's median run is chosen by: server CPU per byte, CPU share for the idle row.
fn median_key(idle: bool) -> impl Fn(&RowRun) -> Option<f64> {
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
    /// client's own queueing (see [`PLAYER_OPENS_PER_SEC`]); the row's latency is not the
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
    fn from_scrapes(a: &HashMap<String, f64>, b: &HashMap<String, f64>, secs: f64) -> Option<DatagramRates> {
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
    fn from_scrapes(a: &HashMap<String, f64>, b: &HashMap<String, f64>, secs: f64) -> Option<QlogRates> {
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
}

impl HostPerRequest {
    /// From two scrapes of `quic_*` counters (summed over shards) and the window's requests.
    fn from_scrapes(a: &HashMap<String, f64>, b: &HashMap<String, f64>, requests: u64) -> Option<HostPerRequest> {
        if requests == 0 {
            return None; // the idle row: no requests to count per
        }
        let d = |k: &str| counter_delta(a, b, k);
        let per = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
        let (send, dgs, runs) = (d("send_calls")?, d("datagrams_sent")?, d("transmits")?);
        let (recv, dgr, waits, turns, served) =
            (d("recv_calls")?, d("datagrams_received")?, d("waits")?, d("turns")?, d("served")?);
        let (fired, held) = (d("timers_fired")?, d("paced_holds")?);
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
        })
    }
}

/// How much the host counter `quic_<name>_total` grew from scrape `a` to scrape `b`.
fn counter_delta(a: &HashMap<String, f64>, b: &HashMap<String, f64>, name: &str) -> Option<f64> {
    let key = format!("quic_{name}_total");
    Some(b.get(&key)? - a.get(&key)?)
}

/// `GET /metrics` from `addr` (in the server's namespace): every sample's value summed by
/// name over its labels (the shards).
fn scrape(place: &Place, addr: SocketAddr) -> Option<HashMap<String, f64>> {
    let f = move || -> Option<String> {
        use std::io::{Read, Write};
        let mut t = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        t.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        t.write_all(b"GET /metrics HTTP/1.0\r\nhost: bench\r\n\r\n").ok()?;
        let mut body = String::new();
        t.read_to_string(&mut body).ok()?;
        Some(body)
    };
    let text = match place.server_ns() {
        Some(ns) => ns.try_run(f).ok()??,
        None => f()?,
    };
    let mut out: HashMap<String, f64> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        let name = name.split('{').next().unwrap_or(name);
        if let Ok(v) = value.parse::<f64>() {
            *out.entry(name.to_string()).or_default() += v;
        }
    }
    Some(out)
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

/// Where the ends are: the namespaces (root) or loopback.
struct Place {
    net: Option<TestNet>,
    server_ip: IpAddr,
    client_ips: Vec<IpAddr>,
    server_cpu: usize,
    client_cpu: usize,
}

impl Place {
    fn server_ns(&self) -> Option<&Namespace> {
        self.net.as_ref().map(|n| n.ns(Side::Rx))
    }

    fn client_ns(&self) -> Option<&Namespace> {
        self.net.as_ref().map(|n| n.ns(Side::Tx))
    }

    /// `taskset -c CPU program`, in the server's namespace on the server's CPU.
    fn server_command(&self, program: &Path) -> Command {
        Self::pinned(self.server_ns(), self.server_cpu, program)
    }

    /// The same in the client's namespace, on the client's CPU.
    fn client_command(&self, program: &Path) -> Command {
        Self::pinned(self.client_ns(), self.client_cpu, program)
    }

    fn pinned(ns: Option<&Namespace>, cpu: usize, program: &Path) -> Command {
        let mut c = match ns {
            Some(ns) => ns.command("taskset"),
            None => Command::new("taskset"),
        };
        c.args(["-c", &cpu.to_string()]).arg(program);
        c
    }
}

fn setup(cfg: &ScaleConfig) -> Result<Place, String> {
    let cpus = udpx_lab::cpu::online_cpus();
    let (client_cpu, server_cpu) = (cpus[0], *cpus.last().unwrap_or(&0));
    if !udpx_lab::netns::is_root() {
        return Ok(Place {
            net: None,
            server_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            client_ips: (0..cfg.addresses)
                .map(|k| IpAddr::V4(Ipv4Addr::new(127, 0, 1 + (k / 250) as u8, 1 + (k % 250) as u8)))
                .collect(),
            server_cpu,
            client_cpu,
        });
    }
    let net = TestNet::setup(&TestNetConfig::new(Profile::Offload)).map_err(|e| format!("veth pair: {e}"))?;
    super::receive_on_own_cpus(&net, cfg.napi, server_cpu, client_cpu)?;
    let mut client_ips = vec![IpAddr::V4(net.tx_v4)];
    let o = net.tx_v4.octets();
    for k in 1..cfg.addresses.clamp(1, 200) {
        let ip = Ipv4Addr::new(o[0], o[1], o[2], 10 + k as u8);
        net.tx
            .exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", &net.tx_dev])
            .map_err(|e| format!("client address {ip}: {e}"))?;
        client_ips.push(IpAddr::V4(ip));
    }
    Ok(Place { server_ip: IpAddr::V4(net.rx_v4), net: Some(net), client_ips, server_cpu, client_cpu })
}

/// Runs the sweep and the idle row. `progress` gets a line per row.
pub fn run(cfg: &ScaleConfig, progress: &mut dyn FnMut(&str)) -> Result<ScaleBench, String> {
    if cfg.connections.is_empty() && cfg.idle.is_none() {
        return Err("give at least one connection count".into());
    }
    let scratch = Scratch::new()?;
    let www = scratch.0.join("www");
    std::fs::write(www.join(SEGMENT), udpx_lab::pattern(cfg.segment, 1)).map_err(|e| e.to_string())?;
    let (cert, key) = (scratch.0.join("cert.pem"), scratch.0.join("key.pem"));
    write_cert(&cert, &key)?;
    let place = setup(cfg)?;
    let rate = TickRate::system().map_err(|e| e.to_string())?;
    let baseline_pct = settled_baseline(place.server_cpu, rate, progress);
    let mut rows = Vec::new();
    let mut left_out = Vec::new();
    let plan = plan(cfg, &mut left_out);
    let mut runs: Vec<Vec<Result<RowRun, String>>> = vec![Vec::new(); plan.len()];
    let (mut idle_floor, mut idle_floor_errors) = (Vec::new(), Vec::new());
    let planned = cfg.rounds.max(1);
    let tally = |r: &[Result<RowRun, String>], idle: bool| {
        let runs: Vec<Option<RowRun>> = r.iter().map(|x| x.as_ref().ok().cloned()).collect();
        Kept::of(&per_run(&runs, &median_key(idle)), planned)
    };
    let mut round = 0;
    while another_round(planned, round, plan.iter().zip(&runs).map(|(p, r)| tally(r, p.3))) {
        for (i, &(server, client, n, idle)) in plan.iter().enumerate() {
            let r = one_run(cfg, &place, &scratch.0, (&cert, &key), (server, client), n, idle, rate);
            let label = format!(
                "round {}/{}: {} x {n}{} ({} client)",
                round + 1,
                cfg.rounds.max(1),
                server.name(),
                if idle { " idle" } else { "" },
                client.name()
            );
            progress(&match &r {
                Err(e) => format!("{label}: failed: {e}"),
                Ok(x) => format!(
                    "{label}: {:.1} % served, {} unanswered, p99 {:.1} ms, server CPU {:.1} %, client CPU {:.1} % ({} while opening){}",
                    x.load.served_pct(),
                    x.load.unanswered,
                    x.load.latency.p99_ms,
                    x.server_cpu_pct,
                    x.load.client_cpu_pct(),
                    x.client_ramp_pct.map_or("-".into(), |p| format!("{p:.0} % of its CPU")),
                    x.load.client_dropped.map_or(String::new(), |d| format!(", {d} datagrams dropped in the client"))
                ) + &if x.steal.stolen { format!(", STOLEN {} (left out)", x.steal.pct()) } else { String::new() },
            });
            if let (true, Ok(x)) = (idle, &r) {
                match echo_floor(cfg, &place, &scratch.0, x.datagrams, rate) {
                    Ok(mut f) => {
                        f.round = round + 1;
                        progress(&format!(
                            "round {}/{}: echo floor at {} datagrams/s of {} B: server CPU {:.1} %",
                            round + 1,
                            cfg.rounds.max(1),
                            f.rate,
                            f.size,
                            f.server_cpu_pct
                        ));
                        idle_floor.push(f);
                    }
                    Err(e) => {
                        progress(&format!("round {}: echo floor: {e}", round + 1));
                        idle_floor_errors.push(format!("round {}: {e}", round + 1));
                    }
                }
            }
            runs[i].push(r);
        }
        round += 1;
    }
    for (&(server, client, n, idle), r) in plan.iter().zip(runs) {
        let error = r.iter().find_map(|x| x.as_ref().err().cloned());
        let kept = tally(&r, idle);
        let runs: Vec<Option<RowRun>> = r.into_iter().map(Result::ok).collect();
        let median = kept.median_run.and_then(|i| runs[i].clone());
        rows.push(ScaleRow { server, client, connections: n, idle, runs, median, error, kept });
    }
    let path = match &place.net {
        Some(n) => format!(
            "veth pair between two namespaces ({} on the server's side; MTU 1500; GRO on both ends; {}); servers \
             pinned to CPU {}, the client to CPU {}; {} client addresses",
            n.rx_dev,
            super::receive_note(cfg.napi),
            place.server_cpu,
            place.client_cpu,
            place.client_ips.len()
        ),
        None => "LOOPBACK (not root): the client's receive work is charged to the server's CPU; veth figures need root"
            .into(),
    };
    let environment = match &place.net {
        Some(n) => Environment::collect(&[(Some(&n.rx), &n.rx_dev), (Some(&n.tx), &n.tx_dev)]),
        None => Environment::collect(&[(None, "lo")]),
    };
    let checks = judge(&rows, baseline_pct, cfg.segment);
    Ok(ScaleBench {
        config: cfg.clone(),
        path,
        rows,
        left_out,
        baseline_pct,
        idle_floor,
        idle_floor_errors,
        checks,
        environment,
    })
}

/// The server CPU's busy share with nothing of ours running, sampled over [`BASELINE`] again
/// while it is above [`SETTLED_PCT`] (for [`SETTLE_MAX`] at most); `progress` says so.
fn settled_baseline(server_cpu: usize, rate: TickRate, progress: &mut dyn FnMut(&str)) -> Option<f64> {
    let sample_baseline = || {
        let a = CpuSample::now().ok();
        std::thread::sleep(BASELINE);
        a.zip(CpuSample::now().ok()).map(|(a, b)| {
            let d = b.diff(&a);
            d.busy_time(&[server_cpu], rate).as_secs_f64() * 100.0 / d.elapsed.as_secs_f64().max(1e-9)
        })
    };
    let settle = Instant::now();
    let mut baseline_pct = sample_baseline();
    while let Some(b) = baseline_pct.filter(|&b| b > SETTLED_PCT && settle.elapsed() < SETTLE_MAX) {
        progress(&format!("CPU {server_cpu} is {b:.1} % busy with nothing of ours running: waiting for it to settle"));
        baseline_pct = sample_baseline();
    }
    if let Some(b) = baseline_pct {
        progress(&format!("CPU {server_cpu} with nothing of ours running: {b:.1} % busy (in every row's server CPU)"));
    }
    baseline_pct
}

/// The runs of one round, in order: each connection count for each server and client there is
/// (those left out said in `left_out`), then the idle row; each as (server, client,
/// connections, idle).
fn plan(cfg: &ScaleConfig, left_out: &mut Vec<String>) -> Vec<(ScaleServer, LoadClient, usize, bool)> {
    let servers: Vec<ScaleServer> = cfg
        .servers
        .iter()
        .copied()
        .filter(|s| {
            let nginx = matches!(s, ScaleServer::NginxH2 | ScaleServer::NginxH1);
            if nginx && cfg.nginx.is_none() {
                left_out.push(format!("{}: nginx not found in PATH (scripts/setup.sh installs it)", s.name()));
            }
            !(nginx && cfg.nginx.is_none())
        })
        .collect();
    let clients: Vec<LoadClient> = cfg
        .clients
        .iter()
        .copied()
        .filter(|&c| {
            let missing = c == LoadClient::Independent && cfg.independent.is_none();
            if missing {
                left_out.push(format!(
                    "the independent client's rows: {} not found (scripts/setup.sh builds it from peers/quicgo-load)",
                    crate::independent::PROGRAM
                ));
            }
            !missing
        })
        .collect();
    let mut plan: Vec<(ScaleServer, LoadClient, usize, bool)> = Vec::new();
    for &n in &cfg.connections {
        for &s in &servers {
            for &c in &clients {
                plan.push((s, c, n, false));
            }
        }
    }
    if let Some(n) = cfg.idle {
        plan.push((ScaleServer::Udpx, LoadClient::Own, n, true));
    }
    plan
}

/// A running server: its process, what it serves on.
struct Running {
    process: ChildGroup,
    addr: SocketAddr,
    /// The udpx server's `/metrics`.
    metrics: Option<SocketAddr>,
}

#[allow(clippy::too_many_arguments)]
fn one_run(
    cfg: &ScaleConfig,
    place: &Place,
    dir: &Path,
    (cert, key): (&Path, &Path),
    (server, client): (ScaleServer, LoadClient),
    n: usize,
    idle: bool,
    rate: TickRate,
) -> Result<RowRun, String> {
    // Idle connections are measured established: their handshakes (a few hundred
    // microseconds of each side's CPU apiece) must end before the window, at a rate both
    // sides keep up with on this machine.
    let ramp = cfg.ramp_for(n, idle);
    let lifetime = ramp + cfg.window + Duration::from_secs(60);
    let running = start_server(cfg, place, dir, (cert, key), server, lifetime)?;
    let rss0 = rss(running.process.id());
    let mut lc =
        LoadConfig::new(running.addr, n, &format!("/{SEGMENT}"), if idle { Duration::ZERO } else { cfg.interval });
    lc.ramp = ramp;
    lc.duration = cfg.window;
    lc.keepalive = cfg.keepalive;
    lc.locals = place.client_ips.clone();
    let client_cpu = place.client_cpu;
    let start = Instant::now();
    let ramp0 = CpuSample::now().ok();
    let window_start = start + lc.ramp;
    let lc2 = lc.clone();
    let ca = cert.to_path_buf();
    let handle = match (client, &cfg.independent) {
        (LoadClient::Independent, Some(program)) => {
            // A process of its own, in the client's namespace on the client's CPU.
            let cmd = place.client_command(program);
            let proto = match server {
                ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::Quinn => Proto::H3,
                ScaleServer::NginxH2 => Proto::H2,
                ScaleServer::NginxH1 => Proto::H1,
            };
            let size = cfg.segment as u64;
            std::thread::spawn(move || crate::independent::run(cmd, &lc2, proto, size))
        }
        (LoadClient::Independent, None) => return Err(format!("{} not found", crate::independent::PROGRAM)),
        (LoadClient::Own | LoadClient::Quinn, _) => {
            let job = move || {
                let _ = udpx_lab::cpu::pin_current_thread(client_cpu);
                match server {
                    ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::Quinn if client == LoadClient::Quinn => {
                        load_hyper::run(&lc2, HyperHttp::H3, &ca).map_err(|e| e.to_string())
                    }
                    ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::Quinn => {
                        load::run(&lc2).map_err(|e| e.to_string())
                    }
                    ScaleServer::NginxH2 => load_hyper::run(&lc2, HyperHttp::H2, &ca).map_err(|e| e.to_string()),
                    ScaleServer::NginxH1 => load_hyper::run(&lc2, HyperHttp::H1, &ca).map_err(|e| e.to_string()),
                }
            };
            match place.client_ns() {
                Some(ns) => ns.try_spawn(job).map_err(|e| e.to_string())?,
                None => std::thread::spawn(job),
            }
        }
    };
    // The server's CPU and memory over the window, sampled from here.
    std::thread::sleep(window_start.saturating_duration_since(Instant::now()));
    // The client's CPU while the connections opened (all of it: the client process and its
    // receive work there).
    let client_ramp_pct = ramp0.zip(CpuSample::now().ok()).map(|(a, b)| {
        let d = b.diff(&a);
        d.busy_time(&[client_cpu], rate).as_secs_f64() * 100.0 / d.elapsed.as_secs_f64().max(1e-9)
    });
    let scrape0 = running.metrics.and_then(|m| scrape(place, m));
    let meter = Meter::start(running.process.id(), rate);
    let rss1 = rss(running.process.id());
    std::thread::sleep((window_start + lc.duration).saturating_duration_since(Instant::now()));
    let spent = meter.stop(place, rate);
    // The larger of the window's two ends: what the connections first did in the window (an
    // idle connection's first PING, a player's next segment) may have allocated more.
    let rss2 = rss(running.process.id());
    let rss1 = rss1.max(rss2);
    let scrape1 = running.metrics.and_then(|m| scrape(place, m));
    let result = handle.join().map_err(|_| "the client panicked".to_string()).and_then(|r| r);
    drop(running);
    let load = result?;
    let Metered { busy, own, switches, steal } = spent?;
    let secs = lc.duration.as_secs_f64();
    Ok(RowRun {
        server_cpu_pct: busy * 100.0 / secs,
        server_process_pct: own * 100.0 / secs,
        server_cpu_s_per_gb: (load.bytes > 0).then(|| busy / (load.bytes as f64 / 1e9)),
        server_process_s_per_gb: (load.bytes > 0 && own > 0.0).then(|| own / (load.bytes as f64 / 1e9)),
        server_cpu_us_per_conn_s: busy * 1e6 / (n as f64 * secs),
        server_switches_per_request: switches.filter(|_| load.requests > 0).map(|w| w as f64 / load.requests as f64),
        server_kib_per_conn: rss0.zip(rss1).map(|(a, b)| b.saturating_sub(a) as f64 / 1024.0 / n as f64),
        client_limited: load.client_cpu_pct() > CLIENT_LIMIT_PCT,
        client_ramp_limited: client_ramp_pct.is_some_and(|p| p > CLIENT_LIMIT_PCT),
        client_ramp_pct,
        host: scrape0
            .as_ref()
            .zip(scrape1.as_ref())
            .and_then(|(a, b)| HostPerRequest::from_scrapes(a, b, load.requests)),
        qlog: scrape0.as_ref().zip(scrape1.as_ref()).and_then(|(a, b)| QlogRates::from_scrapes(a, b, secs)),
        datagrams: scrape0.zip(scrape1).and_then(|(a, b)| DatagramRates::from_scrapes(&a, &b, secs)),
        load,
        steal,
    })
}

/// Measures the [`EchoFloor`] at the rate and size of `load` (the idle row's): sockperf's
/// server pinned to the server's CPU, its ping-pong client (one datagram answered before the
/// next, sent at the rate) on the client's, the server CPU's busy share over the same window.
fn echo_floor(
    cfg: &ScaleConfig,
    place: &Place,
    dir: &Path,
    load: Option<DatagramRates>,
    rate: TickRate,
) -> Result<EchoFloor, String> {
    let load = load.ok_or("the idle row's datagram counts could not be read from the server")?;
    let mps = load.received_per_s.round() as u64;
    if mps == 0 {
        return Err("the idle row's server received no datagrams in the window".into());
    }
    // sockperf's header is 14 bytes; its largest datagram 65,507.
    let size = (load.received_size.round() as usize).clamp(14, 65_507);
    let port = free_port(place, true)?;
    let mut srv = place.server_command(Path::new("sockperf"));
    srv.args(["sr", "-i", &place.server_ip.to_string(), "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Its own process group: dropped, it is killed with SIGKILL (sockperf ignores SIGTERM).
    let server =
        ChildGroup::spawn(&mut srv).map_err(|e| format!("start sockperf (scripts/setup.sh installs it): {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    // The client runs a second longer at each end than the window measured.
    let secs = cfg.window.as_secs().max(1) + 2;
    let log = dir.join("sockperf-client.log");
    let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let mut cli = place.client_command(Path::new("sockperf"));
    cli.args(["ping-pong", "-i", &place.server_ip.to_string(), "-p", &port.to_string()])
        .args(["-t", &secs.to_string(), "--mps", &mps.to_string(), "-m", &size.to_string()])
        .stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    let client = ChildGroup::spawn(&mut cli).map_err(|e| format!("start sockperf's client: {e}"))?;
    std::thread::sleep(Duration::from_secs(1));
    let meter = Meter::start(server.id(), rate);
    std::thread::sleep(cfg.window);
    let spent = meter.stop(place, rate);
    let ended = client.wait_timeout(Duration::from_secs(secs + 10)).map_err(|e| format!("sockperf's client: {e}"))?;
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if ended.is_none() {
        return Err(format!("sockperf's client did not end in {} s: {}", secs + 10, text.trim()));
    }
    let count = |key: &str| -> Option<u64> {
        let at = text.find(key)? + key.len();
        text[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let (Some(sent), Some(answered)) = (count("SentMessages="), count("ReceivedMessages=")) else {
        return Err(format!("sockperf's client printed no totals: {}", text.trim()));
    };
    let Metered { busy, own, steal, .. } = spent?;
    let window = cfg.window.as_secs_f64();
    Ok(EchoFloor {
        round: 0,
        rate: mps,
        size,
        server_cpu_pct: busy * 100.0 / window,
        server_process_pct: own * 100.0 / window,
        sent,
        answered,
        steal,
    })
}

/// A measured window: the server CPU's busy time (the rows' meter, see the module docs) and a
/// process's own CPU time, from `start` to `stop`.
struct Meter {
    cpu: Option<CpuSample>,
    pid: u32,
    own: Option<f64>,
    switches: Option<u64>,
}

/// What a [`Meter`] measured: seconds of the server CPU busy and of the process on CPU, the
/// process's context switches, and the steal from the server's and the client's CPUs.
struct Metered {
    busy: f64,
    own: f64,
    switches: Option<u64>,
    steal: Steal,
}

impl Meter {
    fn start(pid: u32, rate: TickRate) -> Meter {
        Meter { cpu: CpuSample::now().ok(), pid, own: process_cpu_secs(pid, rate), switches: process_switches(pid) }
    }

    /// What happened since `start`.
    fn stop(self, place: &Place, rate: TickRate) -> Result<Metered, String> {
        let (cpu, own, switches) =
            (CpuSample::now().ok(), process_cpu_secs(self.pid, rate), process_switches(self.pid));
        let (Some(a), Some(b)) = (self.cpu, cpu) else { return Err("/proc/stat could not be read".into()) };
        let d = b.diff(&a);
        let busy = d.busy_time(&[place.server_cpu], rate).as_secs_f64();
        let steal = Steal::of(&d, &[place.server_cpu, place.client_cpu], rate);
        let own = self.own.zip(own).map_or(0.0, |(a, b)| (b - a).max(0.0));
        let switches = self.switches.zip(switches).map(|(a, b)| b.saturating_sub(a));
        Ok(Metered { busy, own, switches, steal })
    }
}
