//! `udpx echo bench`: the table of the NTT talk's steps on this machine. Server and load
//! generator pinned to different CPUs; as root over the veth pair with the `software` profile
//! (the receiving veth's NAPI thread pinned to the server's CPU, as a NIC's interrupt would
//! be), loopback otherwise. Each mode runs the same closed-loop load; sockperf's server runs
//! under the same generator as a reference row.
//!
//! Server cost is the busy time of the server's CPU from `/proc/stat` (its threads, the NAPI
//! thread, softirqs: everything the server's CPU did) per million transactions. Each row is its
//! median run by that cost, reported whole (throughput, latency and losses of the same run),
//! with the range over runs; targets are judged from per-run ratios as the main job does
//! ([`udpx_lab::stats`]). A run whose two CPUs the hypervisor stole more than 2 % of is marked
//! and counts nowhere, and extra passes (at most as many again) make it up
//! ([`udpx_lab::steal`]).
//!
//! Over loopback the generator's replies are received in softirq on the CPU that sent them,
//! the server's: their receive work is charged to the server. The veth path (as root, the
//! default) moves it to the generator's CPU with a threaded NAPI there.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use udpx_lab::cpu::{online_cpus, pin_current_thread, CpuSample, TickRate};
use udpx_lab::judge::{checks_text, steal_note, verdict_rule, Check};
use udpx_lab::netns::{Profile, Side, TestNet, TestNetConfig};
use udpx_lab::stats::{another_round, figures, paired_ratios, Kept, Run, Spread, Verdict};
use udpx_lab::steal::{Steal, WithSteal};

use crate::load::{self, LoadConfig, LoadResult};
use crate::server::{self, Mode, ServeConfig, ShardStats};

/// Bench settings.
#[derive(Debug, Clone, Serialize)]
pub struct EchoBenchConfig {
    /// Seconds of load per row.
    pub duration: Duration,
    /// Flows of the generator.
    pub flows: usize,
    /// Requests outstanding per flow.
    pub outstanding: usize,
    /// Request size.
    pub size: usize,
    /// Use the veth pair (root) rather than loopback.
    pub veth: bool,
    /// Include sockperf's server.
    pub sockperf: bool,
    /// Runs of every row, interleaved (A B C … A B C …); the table shows medians. Passes whose
    /// runs were stolen are made up by at most as many extra passes.
    pub repeat: usize,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct EchoRow {
    /// What ran.
    pub label: String,
    /// Load generator's view.
    pub load: LoadResult,
    /// Busy seconds of the server's CPU per million transactions.
    pub server_cpu_s_per_m: f64,
    /// The hypervisor's steal from the server's and the generator's CPUs over this run.
    #[serde(flatten)]
    pub steal: Steal,
    /// Per-shard counters (udpx rows).
    pub shards: Vec<ShardStats>,
    /// Why the row failed, if it did.
    pub error: Option<String>,
    /// Every run of this row in pass order, `None` where it failed; the figures above are
    /// the median run's (by server cost), `median_run` says which.
    pub runs: Vec<Option<EchoRun>>,
    /// Which pass is the median run (of the clean runs).
    pub median_run: Option<usize>,
    /// Runs planned, clean, stolen and failed.
    pub kept: Kept,
}

/// One run of a row: what the table's `±` and the targets' ranges are made of.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EchoRun {
    /// Transactions per second.
    pub tps: f64,
    /// Server CPU seconds per million transactions.
    pub server_cpu_s_per_m: f64,
    /// Requests unanswered.
    pub lost: u64,
    /// The steal of the server's and the generator's CPUs: `steal_s`, `steal_share`,
    /// `stolen` (a marked run counts in no median, range or ratio).
    #[serde(flatten)]
    pub steal: Steal,
}

impl WithSteal for EchoRun {
    fn steal(&self) -> &Steal {
        &self.steal
    }
}

/// Server cost per run, marked as the steal rule says.
fn costs(runs: &[Option<EchoRun>]) -> Vec<Run> {
    figures(runs, |x| x.server_cpu_s_per_m)
}

/// The server's and the generator's CPUs: the last online CPU serves, the first loads.
pub fn cpus() -> (usize, usize) {
    let c = online_cpus();
    (c[c.len() - 1], c[0])
}

/// The rows: (label, mode, batch, io_uring). The io_uring row (issue 12) is the batched
/// CPU-steered server with its receive and send through io_uring, beside the same server on
/// system calls.
pub fn rows() -> Vec<(String, Mode, bool, bool)> {
    let mut v = Vec::new();
    for mode in [Mode::Naive, Mode::Reuseport, Mode::ReuseportCpu] {
        for batch in [false, true] {
            v.push((format!("{}{}", mode.name(), if batch { " +batch" } else { "" }), mode, batch, false));
        }
    }
    if udpx::caps::io_uring_available().is_ok() {
        v.push((format!("{} +io_uring", Mode::ReuseportCpu.name()), Mode::ReuseportCpu, true, true));
    }
    v
}

/// Runs the table. `progress(label)` before each row.
pub fn run(cfg: &EchoBenchConfig, progress: &mut dyn FnMut(&str)) -> Result<(Vec<EchoRow>, String), String> {
    let (srv_cpu, gen_cpu) = cpus();
    let net = if cfg.veth {
        let c = TestNetConfig { profile: Profile::Software, mtu: 1500, tx_cpu: Some(gen_cpu), rx_cpu: Some(srv_cpu) };
        let n = TestNet::setup(&c).map_err(|e| format!("veth pair: {e}"))?;
        // Replies are received on the generator's CPU, as on a real client host; otherwise
        // their receive processing would run on (and be charged to) the server's CPU.
        n.threaded_napi(Side::Tx, Some(gen_cpu)).map_err(|e| format!("generator-side NAPI: {e}"))?;
        Some(n)
    } else {
        None
    };
    let (gen_ip, srv_ip): (IpAddr, IpAddr) = match &net {
        Some(n) => (n.tx_v4.into(), n.rx_v4.into()),
        None => (Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into()),
    };
    let path = match &net {
        Some(_) => format!(
            "veth pair between two namespaces (threaded NAPI on both ends: the server's receive processing on its CPU {srv_cpu}, \
             the generator's on CPU {gen_cpu}); generator on CPU {gen_cpu}, server on CPU {srv_cpu}"
        ),
        None => format!(
            "LOOPBACK (not root); generator on CPU {gen_cpu}, server on CPU {srv_cpu}; the replies' receive \
             processing runs in softirq on the server's CPU and is charged to the server (the veth path as root is not)"
        ),
    };
    // One generator address at full speed: the server's per-source limit (on by default in
    // `udpx echo serve`) is off here, and the report says so.
    let path = format!("{path}; per-source rate limit off (one generator address)");
    let mut runs: Vec<Vec<EchoRow>> = Vec::new();
    let planned = cfg.repeat.max(1);
    while another_round(planned, runs.len(), tallies(&runs, planned)) {
        let mut out = Vec::new();
        for (label, mode, batch, io_uring) in rows() {
            progress(&label);
            let sc = ServeConfig {
                bind: SocketAddr::new(srv_ip, 0),
                mode,
                threads: 1,
                batch,
                io_uring,
                rate_limit: None,
                cpus: Some(vec![srv_cpu]),
                recv_buffer: None,
            };
            let bound = match &net {
                Some(n) => n.ns(Side::Rx).run(move || server::bind(&sc)),
                None => server::bind(&sc),
            };
            let row = match bound {
                Ok(b) => {
                    let srv = server::start(b);
                    let measured = measure(cfg, net.as_ref(), gen_ip, srv.addr, srv_cpu, gen_cpu);
                    let shards = srv.stop();
                    match measured {
                        Ok((load, cpu, steal)) => ok_row(label, load, (cpu, steal), shards),
                        Err(e) => failed(label, e),
                    }
                }
                Err(e) => failed(label, e),
            };
            out.push(row);
        }
        if cfg.sockperf {
            progress("sockperf sr");
            let label = "sockperf server (reference)".to_string();
            out.push(match sockperf_row(cfg, net.as_ref(), gen_ip, srv_ip, srv_cpu, gen_cpu) {
                Ok((load, cpu, steal)) => ok_row(label, load, (cpu, steal), Vec::new()),
                Err(e) => failed(label, e),
            });
        }
        runs.push(out);
    }
    let out = (0..runs[0].len()).map(|i| merge(runs.iter().map(|r| r[i].clone()).collect(), planned)).collect();
    Ok((out, path))
}

/// Each row's tally over the passes so far (for [`another_round`]).
fn tallies(passes: &[Vec<EchoRow>], planned: usize) -> Vec<Kept> {
    let rows = passes.first().map_or(0, Vec::len);
    (0..rows).map(|i| Kept::of(&costs(&passes.iter().map(|p| as_run(&p[i])).collect::<Vec<_>>()), planned)).collect()
}

/// One measurement's figures, `None` if it failed.
fn as_run(r: &EchoRow) -> Option<EchoRun> {
    r.error.is_none().then_some(EchoRun {
        tps: r.load.tps,
        server_cpu_s_per_m: r.server_cpu_s_per_m,
        lost: r.load.lost,
        steal: r.steal,
    })
}

/// One row from its runs (in pass order): the median clean run by server cost, whole, with
/// every run's figures beside it. A row with no clean run keeps the first run's error (none
/// when its runs were all stolen: `kept` says so, and a loaded machine is no failure).
fn merge(rows: Vec<EchoRow>, planned: usize) -> EchoRow {
    let runs: Vec<Option<EchoRun>> = rows.iter().map(as_run).collect();
    let kept = Kept::of(&costs(&runs), planned);
    let Some(at) = kept.median_run else {
        // No figure of a run is the row's: not a failed one's, nor a stolen one's.
        let error = if kept.no_figure().is_some() { None } else { rows.iter().find_map(|r| r.error.clone()) };
        let label = rows.into_iter().next().map(|r| r.label).unwrap_or_default();
        return EchoRow { runs, kept, error, ..failed(label, String::new()) };
    };
    let mut row = rows.into_iter().nth(at).unwrap_or_else(|| failed(String::new(), "no run".into()));
    row.runs = runs;
    row.median_run = Some(at);
    row.kept = kept;
    row
}

/// A measured row: `(cpu, steal)` are the server cost per million and the steal of the run's
/// CPUs.
fn ok_row(label: String, load: LoadResult, (cpu, steal): (f64, Steal), shards: Vec<ShardStats>) -> EchoRow {
    EchoRow {
        label,
        load,
        server_cpu_s_per_m: cpu,
        steal,
        shards,
        error: None,
        runs: Vec::new(),
        median_run: None,
        kept: Kept::default(),
    }
}

fn failed(label: String, e: String) -> EchoRow {
    EchoRow {
        label,
        load: LoadResult::default(),
        server_cpu_s_per_m: f64::NAN,
        steal: Steal::default(),
        shards: Vec::new(),
        error: Some(e),
        runs: Vec::new(),
        median_run: None,
        kept: Kept::default(),
    }
}

/// Runs the generator against `dst` and measures the server CPU's busy time, and the steal of
/// both CPUs.
fn measure(
    cfg: &EchoBenchConfig,
    net: Option<&TestNet>,
    gen_ip: IpAddr,
    dst: SocketAddr,
    srv_cpu: usize,
    gen_cpu: usize,
) -> Result<(LoadResult, f64, Steal), String> {
    let lc = LoadConfig {
        dst,
        bind: SocketAddr::new(gen_ip, 0),
        flows: cfg.flows,
        size: cfg.size,
        outstanding: cfg.outstanding,
        rate: None,
        duration: cfg.duration,
        timeout: Duration::from_millis(200),
    };
    load::check(&lc)?;
    let lc2 = lc.clone();
    let socks = match net {
        Some(n) => n.ns(Side::Tx).run(move || load::bind_flows(&lc2)),
        None => load::bind_flows(&lc2),
    }?;
    let before = CpuSample::now().map_err(|e| e.to_string())?;
    let res = std::thread::spawn(move || {
        let _ = pin_current_thread(gen_cpu);
        load::run(&lc, socks)
    })
    .join()
    .map_err(|_| "load generator panicked".to_string())??;
    let after = CpuSample::now().map_err(|e| e.to_string())?;
    let rate = TickRate::system().map_err(|e| e.to_string())?;
    let d = after.diff(&before);
    let busy = d.busy_time(&[srv_cpu], rate).as_secs_f64();
    let steal = Steal::of(&d, &[srv_cpu, gen_cpu], rate);
    let per_m = if res.received > 0 { busy / (res.received as f64 / 1e6) } else { f64::INFINITY };
    Ok((res, per_m, steal))
}

fn sockperf_row(
    cfg: &EchoBenchConfig,
    net: Option<&TestNet>,
    gen_ip: IpAddr,
    srv_ip: IpAddr,
    srv_cpu: usize,
    gen_cpu: usize,
) -> Result<(LoadResult, f64, Steal), String> {
    let port = 11111u16;
    let port = match net {
        Some(_) => port,
        None => std::net::UdpSocket::bind((srv_ip, 0))
            .and_then(|s| s.local_addr())
            .map(|a| a.port())
            .map_err(|e| e.to_string())?,
    };
    let args = ["-c", &srv_cpu.to_string(), "sockperf", "sr", "-i", &srv_ip.to_string(), "-p", &port.to_string()]
        .map(String::from);
    let mut cmd = match net {
        Some(n) => n.ns(Side::Rx).command("taskset"),
        None => Command::new("taskset"),
    };
    cmd.args(&args).stdout(Stdio::null()).stderr(Stdio::null());
    // In a process group of its own: dropped (also on an error or a panic) or on Ctrl-C, the
    // group is killed with SIGKILL (sockperf ignores SIGTERM).
    let child = udpx_lab::netns::ChildGroup::spawn(&mut cmd)
        .map_err(|e| format!("start sockperf (scripts/setup.sh installs it): {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let r = measure(cfg, net, gen_ip, SocketAddr::new(srv_ip, port), srv_cpu, gen_cpu);
    drop(child);
    r
}

/// `±x%` of `v`: the larger distance to the smallest or largest of `all`; `-` if unknown.
fn pm(v: f64, all: impl Iterator<Item = f64>) -> String {
    let s = Spread::of(&all.collect::<Vec<_>>());
    udpx_lab::judge::pm(v, s.min, s.max)
}

/// The table as text, with ratios against `naive` (each row its median run; `lost` is that
/// run's), followed by the judged targets ([`judge`]).
pub fn table(rows: &[EchoRow]) -> String {
    use std::fmt::Write;
    let base = rows.first().map(|r| r.server_cpu_s_per_m).unwrap_or(f64::NAN);
    // `vs naive` per pass, for its `±`: pass i of a row over pass i of `naive`.
    let cost = |r: &EchoRow| costs(&r.runs);
    let base_runs = rows.first().map(cost).unwrap_or_default();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<28} {:>9} {:>5} {:>10} {:>5} {:>7} {:>7} {:>8} {:>6} {:>8} {:>8} {:>5} {:>4}",
        "mode",
        "trans/s",
        "±",
        "CPU-s/M",
        "±",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "lost",
        "req/recv",
        "vs naive",
        "±",
        "runs"
    );
    for r in rows {
        if let Some(why) = r.kept.no_figure() {
            let _ = writeln!(s, "{:<28} {why}", r.label);
            continue;
        }
        if let Some(e) = &r.error {
            let _ = writeln!(s, "{:<28} failed: {e}", r.label);
            continue;
        }
        let batch = if r.shards.is_empty() {
            "-".to_string()
        } else {
            let req: u64 = r.shards.iter().map(|x| x.requests).sum();
            let calls: u64 = r.shards.iter().map(|x| x.recv_calls).sum();
            format!("{:.1}", req as f64 / calls.max(1) as f64)
        };
        let ok = || r.runs.iter().flatten().filter(|x| !x.steal.stolen);
        let _ = writeln!(
            s,
            "{:<28} {:>9.0} {:>5} {:>10.2} {:>5} {:>7.0} {:>7.0} {:>8.0} {:>6} {:>8} {:>7.2}x {:>5} {:>4}",
            r.label,
            r.load.tps,
            pm(r.load.tps, ok().map(|x| x.tps)),
            r.server_cpu_s_per_m,
            pm(r.server_cpu_s_per_m, ok().map(|x| x.server_cpu_s_per_m)),
            r.load.p50_us,
            r.load.p99_us,
            r.load.p999_us,
            r.load.lost,
            batch,
            r.server_cpu_s_per_m / base,
            pm(r.server_cpu_s_per_m / base, paired_ratios(&cost(r), &base_runs).into_iter()),
            r.kept.cell()
        );
    }
    let passes = rows.iter().map(|r| r.runs.len()).max().unwrap_or(0);
    let planned = rows.iter().map(|r| r.kept.planned).max().unwrap_or(0);
    let steals = rows.iter().flat_map(|r| r.runs.iter().flatten()).map(|x| &x.steal);
    if let Some(note) = steal_note(steals, Some(passes.saturating_sub(planned))) {
        let _ = writeln!(s, "\n{note} (the server's and the generator's CPUs; steal_share per run in the JSON)");
    }
    let judged = judge(rows);
    if !judged.is_empty() {
        let _ = write!(s, "\n{}\n{}", verdict_rule(passes), checks_text(&judged));
    }
    s
}

/// The targets: `reuseport-cpu +batch` at most half of `naive` per transaction, and no
/// more than sockperf's server; judged from per-run ratios (met, MISSED or inconclusive).
pub fn judge(rows: &[EchoRow]) -> Vec<Check> {
    let per_run = |l: &str| -> Option<Vec<Run>> {
        let r = rows.iter().find(|r| r.label.starts_with(l))?;
        Some(costs(&r.runs))
    };
    let mut out = Vec::new();
    for (what, row, other, at_most) in [
        ("reuseport-cpu +batch / naive", "reuseport-cpu +batch", "naive", 0.5),
        ("reuseport-cpu +batch / sockperf", "reuseport-cpu +batch", "sockperf", 1.0),
        // Issue 12: io_uring takes the per-call cost the batched server still pays.
        ("reuseport-cpu +io_uring / naive", "reuseport-cpu +io_uring", "naive", 0.5),
        ("reuseport-cpu +io_uring / +batch", "reuseport-cpu +io_uring", "reuseport-cpu +batch", 1.0),
    ] {
        if let (Some(a), Some(b)) = (per_run(row), per_run(other)) {
            out.extend(Check::judge("echo", what, &a, &b, at_most));
        }
    }
    out
}

/// The decided targets as `(what, median ratio, target, met)`: only those met or missed
/// ([`judge`] has all three verdicts, with ranges; [`table`] prints them).
pub fn checks(rows: &[EchoRow]) -> Vec<(String, f64, f64, bool)> {
    judge(rows)
        .into_iter()
        .filter(|c| c.verdict != Verdict::Inconclusive)
        .map(|c| (c.what, c.ratio, c.at_most, c.verdict == Verdict::Met))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(label: &str, tps: f64, cost: f64, lost: u64) -> EchoRow {
        let load = LoadResult { tps, lost, ..LoadResult::default() };
        ok_row(label.to_string(), load, (cost, Steal::default()), Vec::new())
    }

    #[test]
    fn a_row_is_its_median_run_whole() {
        // By cost the median is pass 0 (3.0); its throughput and its losses are reported, not
        // the median throughput (300) nor the losses summed over runs (12).
        let row =
            merge(vec![run("naive", 250.0, 3.0, 2), run("naive", 300.0, 2.0, 0), run("naive", 400.0, 4.0, 10)], 3);
        assert_eq!(row.median_run, Some(0));
        assert_eq!((row.load.tps, row.server_cpu_s_per_m, row.load.lost), (250.0, 3.0, 2));
        assert_eq!(row.runs.len(), 3);
        // A failed run is skipped but keeps its place.
        let row =
            merge(vec![failed("naive".into(), "x".into()), run("naive", 300.0, 2.0, 0), run("naive", 1.0, 5.0, 0)], 3);
        assert_eq!((row.median_run, row.error.is_none()), (Some(1), true));
        assert!(row.runs[0].is_none());
        let row = merge(vec![failed("naive".into(), "x".into())], 1);
        assert!(row.error.is_some() && row.median_run.is_none());
    }

    #[test]
    fn targets_are_judged_per_run() {
        let merged = |label: &str, costs: &[f64]| merge(costs.iter().map(|c| run(label, 1.0, *c, 0)).collect(), 3);
        let rows = vec![
            merged("naive", &[3.5, 3.6, 3.4]),
            merged("reuseport-cpu +batch", &[2.5, 2.6, 2.4]),
            merged("sockperf server (reference)", &[2.4, 2.7, 2.5]),
        ];
        let j = judge(&rows);
        // 2.5/3.5 .. : all above 0.5: missed. 2.5/2.4, 2.6/2.7, 2.4/2.5 straddle 1.0.
        assert_eq!(j[0].verdict, Verdict::Missed);
        assert_eq!(j[1].verdict, Verdict::Inconclusive);
        let decided = checks(&rows);
        assert_eq!(decided.len(), 1, "inconclusive targets are not reported as met or missed");
        assert!(!decided[0].3);
        let t = table(&rows);
        assert!(t.contains("[inconclusive]"));
        // naive's cost: median run 3.5, runs 3.4-3.6.
        assert!(t.contains("3.50   ±3%"), "{t}");
    }

    #[test]
    fn a_stolen_run_is_shown_but_counts_nowhere() {
        let stolen = |mut r: EchoRow| {
            r.steal = Steal { steal_s: 0.3, steal_share: 0.05, stolen: true };
            r
        };
        // The stolen pass is the cheapest (1.0): the median of the clean ones is pass 2 (3.0).
        let row = merge(
            vec![
                run("naive", 1.0, 2.0, 0),
                stolen(run("naive", 1.0, 1.0, 0)),
                run("naive", 1.0, 3.0, 0),
                run("naive", 1.0, 4.0, 0),
            ],
            3,
        );
        assert_eq!((row.median_run, row.kept.clean, row.kept.stolen), (Some(2), 3, 1));
        assert_eq!(row.server_cpu_s_per_m, 3.0);
        let batch = merge((0..4).map(|_| run("reuseport-cpu +batch", 1.0, 1.0, 0)).collect(), 3);
        let j = judge(&[row.clone(), batch.clone()]);
        assert_eq!((j[0].ratios.len(), j[0].stolen), (3, 1), "{j:?}");
        let t = table(&[row, batch]);
        assert!(t.contains("steal: 1 of 8 runs over the 2 % limit"), "{t}");
        assert!(t.contains("1 extra round run"), "{t}");
        // All stolen: no figure, and the table says why.
        let all = merge(vec![stolen(run("naive", 1.0, 1.0, 0)), stolen(run("naive", 1.0, 1.0, 0))], 1);
        assert!(all.median_run.is_none() && all.kept.short());
        let t = table(&[all]);
        assert!(t.contains("no figure: all 2 measured runs stolen"), "{t}");
        // The run's steal is in its JSON, flat.
        let v = serde_json::to_value(EchoRun { tps: 1.0, server_cpu_s_per_m: 1.0, lost: 0, steal: Steal::default() })
            .unwrap();
        assert!(v["steal_s"].is_number() && v["steal_share"].is_number() && v["stolen"].is_boolean(), "{v}");
    }
}
