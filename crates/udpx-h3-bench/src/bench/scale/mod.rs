//! `udpx bench h3 --connections N,...`: the seed paper's workload. N clients at once, each a
//! video player fetching a segment every interval ([`crate::clients::own`]), against `udpx h3 serve`,
//! a second HTTP/3 server (quinn with h3, [`crate::quinn_server`]), and nginx over TCP (HTTP/2
//! and HTTP/1.1, TLS 1.3, one worker) under the same schedule ([`crate::clients::quinn_hyper`]), side by
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

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use udpx_lab::cpu::{CpuSample, TickRate};
use udpx_lab::env::Environment;
use udpx_lab::netns::ChildGroup;
use udpx_lab::stats::{another_round, Kept};
use udpx_lab::steal::Steal;

use crate::clients::own::{self, LoadConfig};
use crate::clients::quicgo::Proto;
use crate::clients::quinn_hyper::{self, HyperHttp};
use crate::lab::{write_cert, Scratch};
use udpx_lab::task::{process_cpu_secs, process_switches, rss};

mod config;
mod place;
mod report;
mod results;
mod servers;

pub use config::{LoadClient, ScaleConfig, ScaleServer, IDLE_OPENS_PER_SEC, PLAYER_OPENS_PER_SEC};

use place::{scrape, setup, Place};
pub use report::{judge, table};
use results::{median_key, per_run};
pub use results::{
    DatagramRates, EchoFloor, HostPerRequest, QlogRates, RowRun, ScaleBench, ScaleRow, ABOVE_BASELINE, BASELINE,
    CLIENT_DROP_PCT, CLIENT_LIMIT_PCT, SETTLED_PCT, SETTLE_MAX,
};
use servers::{free_port, start_server};

/// The file every player asks for.
const SEGMENT: &str = "segment";
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
            crate::lab::receive_note(cfg.napi),
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
                    crate::clients::quicgo::PROGRAM
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
                ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::UdpxCache | ScaleServer::Quinn => Proto::H3,
                ScaleServer::NginxH2 => Proto::H2,
                ScaleServer::NginxH1 => Proto::H1,
            };
            let size = cfg.segment as u64;
            std::thread::spawn(move || crate::clients::quicgo::run(cmd, &lc2, proto, size))
        }
        (LoadClient::Independent, None) => return Err(format!("{} not found", crate::clients::quicgo::PROGRAM)),
        (LoadClient::Own | LoadClient::Quinn, _) => {
            let job = move || {
                let _ = udpx_lab::cpu::pin_current_thread(client_cpu);
                match server {
                    ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::UdpxCache | ScaleServer::Quinn
                        if client == LoadClient::Quinn =>
                    {
                        quinn_hyper::run(&lc2, HyperHttp::H3, &ca).map_err(|e| e.to_string())
                    }
                    ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::UdpxCache | ScaleServer::Quinn => {
                        own::run(&lc2).map_err(|e| e.to_string())
                    }
                    ScaleServer::NginxH2 => quinn_hyper::run(&lc2, HyperHttp::H2, &ca).map_err(|e| e.to_string()),
                    ScaleServer::NginxH1 => quinn_hyper::run(&lc2, HyperHttp::H1, &ca).map_err(|e| e.to_string()),
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
