//! `udpx echo bench`: the table of the NTT talk's steps on this machine. Server and load
//! generator pinned to different CPUs; as root over the veth pair with the `software` profile
//! (the receiving veth's NAPI thread pinned to the server's CPU, as a NIC's interrupt would
//! be), loopback otherwise. Each mode runs the same closed-loop load; sockperf's server runs
//! under the same generator as a reference row.
//!
//! Server cost is the busy time of the server's CPU from `/proc/stat` (its threads, the NAPI
//! thread, softirqs: everything the server's CPU did) per million transactions.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use udpx_bench::cpu::{online_cpus, pin_current_thread, CpuSample, TickRate};
use udpx_netns::{Profile, Side, TestNet, TestNetConfig};

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
    /// Runs of every row, interleaved (A B C … A B C …); the table shows medians.
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
    /// Per-shard counters (udpx rows).
    pub shards: Vec<ShardStats>,
    /// Why the row failed, if it did.
    pub error: Option<String>,
}

/// The server's and the generator's CPUs: the last online CPU serves, the first loads.
pub fn cpus() -> (usize, usize) {
    let c = online_cpus();
    (c[c.len() - 1], c[0])
}

/// The rows: (label, mode, batch).
pub fn rows() -> Vec<(String, Mode, bool)> {
    let mut v = Vec::new();
    for mode in [Mode::Naive, Mode::Reuseport, Mode::ReuseportCpu] {
        for batch in [false, true] {
            v.push((format!("{}{}", mode.name(), if batch { " +batch" } else { "" }), mode, batch));
        }
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
        None => format!("LOOPBACK (not root); generator on CPU {gen_cpu}, server on CPU {srv_cpu}"),
    };
    let mut runs: Vec<Vec<EchoRow>> = Vec::new();
    for _ in 0..cfg.repeat.max(1) {
        let mut out = Vec::new();
        for (label, mode, batch) in rows() {
            progress(&label);
            let sc = ServeConfig {
                bind: SocketAddr::new(srv_ip, 0),
                mode,
                threads: 1,
                batch,
                rate_limit: None,
                cpus: Some(vec![srv_cpu]),
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
                        Ok((load, cpu)) => EchoRow { label, load, server_cpu_s_per_m: cpu, shards, error: None },
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
                Ok((load, cpu)) => EchoRow { label, load, server_cpu_s_per_m: cpu, shards: Vec::new(), error: None },
                Err(e) => failed(label, e),
            });
        }
        runs.push(out);
    }
    let out = (0..runs[0].len()).map(|i| merge(runs.iter().map(|r| r[i].clone()).collect())).collect();
    Ok((out, path))
}

/// Field-wise medians of one row's runs; losses add up; the first error wins.
fn merge(rows: Vec<EchoRow>) -> EchoRow {
    use udpx_bench::matrix::median;
    let ok: Vec<&EchoRow> = rows.iter().filter(|r| r.error.is_none()).collect();
    let Some(first) = ok.first() else {
        return rows.into_iter().next().unwrap_or_else(|| failed(String::new(), "no run".into()));
    };
    let med = |f: fn(&EchoRow) -> f64| median(ok.iter().map(|r| f(r)).collect());
    let mut load = first.load.clone();
    load.tps = med(|r| r.load.tps);
    load.p50_us = med(|r| r.load.p50_us);
    load.p90_us = med(|r| r.load.p90_us);
    load.p99_us = med(|r| r.load.p99_us);
    load.p999_us = med(|r| r.load.p999_us);
    load.max_us = ok.iter().map(|r| r.load.max_us).fold(0.0, f64::max);
    load.sent = ok.iter().map(|r| r.load.sent).sum();
    load.received = ok.iter().map(|r| r.load.received).sum();
    load.lost = ok.iter().map(|r| r.load.lost).sum();
    load.unexpected = ok.iter().map(|r| r.load.unexpected).sum();
    let mut shards = first.shards.clone();
    for r in &ok[1..] {
        for (a, b) in shards.iter_mut().zip(&r.shards) {
            a.requests += b.requests;
            a.recv_calls += b.recv_calls;
            a.replies += b.replies;
            a.malformed += b.malformed;
            a.kernel_drops += b.kernel_drops;
        }
    }
    EchoRow {
        label: first.label.clone(),
        load,
        server_cpu_s_per_m: med(|r| r.server_cpu_s_per_m),
        shards,
        error: rows.iter().find_map(|r| r.error.clone()),
    }
}

fn failed(label: String, e: String) -> EchoRow {
    EchoRow { label, load: LoadResult::default(), server_cpu_s_per_m: f64::NAN, shards: Vec::new(), error: Some(e) }
}

/// Runs the generator against `dst` and measures the server CPU's busy time.
fn measure(
    cfg: &EchoBenchConfig,
    net: Option<&TestNet>,
    gen_ip: IpAddr,
    dst: SocketAddr,
    srv_cpu: usize,
    gen_cpu: usize,
) -> Result<(LoadResult, f64), String> {
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
    let busy = after.diff(&before).busy_time(&[srv_cpu], rate).as_secs_f64();
    let per_m = if res.received > 0 { busy / (res.received as f64 / 1e6) } else { f64::INFINITY };
    Ok((res, per_m))
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sockperf_row(
    cfg: &EchoBenchConfig,
    net: Option<&TestNet>,
    gen_ip: IpAddr,
    srv_ip: IpAddr,
    srv_cpu: usize,
    gen_cpu: usize,
) -> Result<(LoadResult, f64), String> {
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
    let child = Killed(cmd.spawn().map_err(|e| format!("start sockperf (scripts/setup.sh installs it): {e}"))?);
    std::thread::sleep(Duration::from_millis(500));
    let r = measure(cfg, net, gen_ip, SocketAddr::new(srv_ip, port), srv_cpu, gen_cpu);
    drop(child);
    r
}

/// The table as text, with ratios against `naive`.
pub fn table(rows: &[EchoRow]) -> String {
    use std::fmt::Write;
    let base = rows.first().map(|r| r.server_cpu_s_per_m).unwrap_or(f64::NAN);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<28} {:>9} {:>10} {:>7} {:>7} {:>8} {:>6} {:>8} {:>8}",
        "mode", "trans/s", "CPU-s/M", "p50 us", "p99 us", "p99.9 us", "lost", "req/recv", "vs naive"
    );
    for r in rows {
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
        let _ = writeln!(
            s,
            "{:<28} {:>9.0} {:>10.2} {:>7.0} {:>7.0} {:>8.0} {:>6} {:>8} {:>7.2}x",
            r.label,
            r.load.tps,
            r.server_cpu_s_per_m,
            r.load.p50_us,
            r.load.p99_us,
            r.load.p999_us,
            r.load.lost,
            batch,
            r.server_cpu_s_per_m / base
        );
    }
    s
}

/// The targets: `reuseport-cpu +batch` at most half of `naive` per transaction, and no
/// more than sockperf's server.
pub fn checks(rows: &[EchoRow]) -> Vec<(String, f64, f64, bool)> {
    let get = |l: &str| rows.iter().find(|r| r.label.starts_with(l) && r.error.is_none()).map(|r| r.server_cpu_s_per_m);
    let mut out = Vec::new();
    if let (Some(best), Some(naive)) = (get("reuseport-cpu +batch"), get("naive")) {
        out.push(("reuseport-cpu +batch / naive".to_string(), best / naive, 0.5, best / naive <= 0.5));
    }
    if let (Some(best), Some(sp)) = (get("reuseport-cpu +batch"), get("sockperf")) {
        out.push(("reuseport-cpu +batch / sockperf".to_string(), best / sp, 1.0, best / sp <= 1.0));
    }
    out
}
