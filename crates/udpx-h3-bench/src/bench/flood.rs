//! `udpx bench h3 --flood RATE`: an Initial flood from forged addresses against `udpx h3
//! serve`, while a legitimate client downloads (the QUIC-at-scale issue's figure).
//!
//! **Where.** The attack lab ([`StarNet`]: server, attacker, victim and client namespaces
//! around a forwarding hub; root only). The server runs as its own process, one shard, pinned
//! to the last CPU. The attacker sends RATE real client Initials a second for the flood's
//! length, each under fresh connection IDs (`lab::forge`) and from a random address
//! and port of 10.128.0.0/9, through a raw socket. The hub routes that whole range to the
//! victim's namespace, which forwards nothing: every byte the server sends toward a forged
//! address is counted on the victim's device (UDP payload: the device's bytes less 42 per
//! packet for the Ethernet, IPv4 and UDP headers, a GSO train counting once). The client
//! downloads a file over and over through the flood, then once after it.
//!
//! **What is reported per `--retry` mode.** Initials sent and the rate reached; bytes toward
//! the forged addresses over bytes forged (RFC 9000 8.1: at most 3x before an address is
//! validated; with Retry a forged address gets one Retry per Initial, smaller than the
//! Initial); the legitimate downloads, completed and their times; the server's resident
//! memory before, at its peak and after, sampled every 250 ms, and whether it stopped growing
//! (the peak of the last third of the flood within 10 % and 8 MiB of the peak before it, judged
//! for floods of 15 s or more: three handshake deadlines); the
//! server CPU's busy share; the server's own counts (Retries, refusals by cap, handshakes
//! timed out, kernel drops). Bounds, not timings, are judged: they hold in every run or not.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use udpx_lab::cpu::{CpuSample, TickRate};
use udpx_lab::env::Environment;
use udpx_lab::netns::forge::{self, RawSender};
use udpx_lab::netns::{ChildGroup, Leaf, StarNet};

use crate::lab::{write_cert, Scratch};
use udpx_h3::{get, GetConfig};

/// The range forged sources come from (the hub routes it to the victim).
const FORGED_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 128, 0, 0), 9);
/// The server's port.
const PORT: u16 = 4433;
/// The file the legitimate client downloads.
const FILE: &str = "video";
/// The shortest flood whose memory growth is judged: three handshake deadlines.
const PLATEAU_AFTER: Duration = Duration::from_secs(15);
/// Ethernet, IPv4 and UDP headers: what a device counts per packet beyond the UDP payload.
const HEADERS: u64 = 14 + 20 + 8;

/// The flood's settings.
#[derive(Debug, Clone, Serialize)]
pub struct FloodConfig {
    /// Forged Initials per second.
    pub rate: u64,
    /// How long the flood lasts.
    pub duration: Duration,
    /// `udpx h3 serve --retry` modes, one row each.
    pub retry: Vec<String>,
    /// Bytes of the file the legitimate client downloads.
    pub file: usize,
    /// The `udpx` binary that runs the server.
    pub udpx: PathBuf,
    /// How the server sends (`udpx h3 serve`'s host flags).
    #[serde(flatten)]
    pub host: udpx_h3::Tuning,
}

impl FloodConfig {
    /// 10,000 Initials a second for 30 s, rows for `--retry never` and `auto` (the default),
    /// a 1 MB file.
    pub fn new(udpx: PathBuf) -> FloodConfig {
        FloodConfig {
            rate: 10_000,
            duration: Duration::from_secs(30),
            retry: vec!["never".into(), "auto".into()],
            file: 1_000_000,
            host: udpx_h3::Tuning::default(),
            udpx,
        }
    }
}

/// A bound that holds or not.
#[derive(Debug, Clone, Serialize)]
pub struct Bound {
    /// What is bounded.
    pub what: String,
    /// The measured value.
    pub value: f64,
    /// Its bound (`value <= at_most`).
    pub at_most: f64,
    /// Whether it held.
    pub met: bool,
}

impl Bound {
    fn new(what: impl Into<String>, value: f64, at_most: f64) -> Bound {
        Bound { what: what.into(), value, at_most, met: value <= at_most }
    }
}

/// One `--retry` mode's run.
#[derive(Debug, Clone, Serialize)]
pub struct FloodRow {
    /// `udpx h3 serve --retry`.
    pub retry: String,
    /// Forged Initials sent.
    pub initials: u64,
    /// Their UDP payload bytes.
    pub forged_bytes: u64,
    /// Initials per second reached.
    pub rate: f64,
    /// Packets toward forged addresses (as the victim's device counts: a GSO train once).
    pub victim_packets: u64,
    /// Their UDP payload bytes.
    pub victim_bytes: u64,
    /// `victim_bytes / forged_bytes`.
    pub amplification: f64,
    /// Legitimate downloads started during the flood.
    pub downloads: usize,
    /// Of those, completed whole.
    pub downloads_ok: usize,
    /// Why the others failed (the client's error), each once with its count.
    pub download_failures: Vec<(String, usize)>,
    /// Median and longest time of the completed ones, ms.
    pub download_p50_ms: f64,
    /// See `download_p50_ms`.
    pub download_max_ms: f64,
    /// The download after the flood completed whole.
    pub served_after: bool,
    /// Server resident memory before the flood, MiB.
    pub rss_before_mib: f64,
    /// Its peak during the flood, MiB.
    pub rss_peak_mib: f64,
    /// After the flood and the handshake deadline, MiB.
    pub rss_after_mib: f64,
    /// The peak of the flood's last third, MiB.
    pub rss_last_third_mib: f64,
    /// The peak before it, MiB.
    pub rss_first_two_thirds_mib: f64,
    /// The server CPU's busy share over the flood, percent of one CPU.
    pub server_cpu_pct: f64,
    /// The steal from the attacker's and the server's CPUs over the flood (`steal_s`,
    /// `steal_share`, `stolen`: then its CPU share and download times are not quoted).
    #[serde(flatten)]
    pub steal: udpx_lab::steal::Steal,
    /// The server's own counts (`udpx h3 serve`'s final JSON, `quic` part).
    pub counters: serde_json::Value,
    /// The bounds, judged.
    pub bounds: Vec<Bound>,
}

/// The flood bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct FloodBench {
    /// Settings.
    pub config: FloodConfig,
    /// Rows (`Err`: the run failed, why).
    pub rows: Vec<Result<FloodRow, String>>,
    /// Kernel, CPU, devices.
    pub environment: Environment,
}

/// Runs one row per `--retry` mode. `Ok(None)`: not root (the lab needs namespaces and raw
/// sockets).
pub fn run(cfg: &FloodConfig, progress: &mut dyn FnMut(&str)) -> Result<Option<FloodBench>, String> {
    if !udpx_lab::netns::is_root() {
        return Ok(None);
    }
    if cfg.rate == 0 || cfg.duration.is_zero() || cfg.retry.is_empty() {
        return Err("a flood needs a rate, a duration and a --retry mode".into());
    }
    let forger = Arc::new(crate::lab::forge::InitialForger::new("localhost")?);
    let scratch = Scratch::new()?;
    let www = scratch.0.join("www");
    std::fs::write(www.join(FILE), udpx_lab::pattern(cfg.file, 7)).map_err(|e| e.to_string())?;
    let (cert, key) = (scratch.0.join("cert.pem"), scratch.0.join("key.pem"));
    write_cert(&cert, &key)?;
    let mut rows = Vec::new();
    let mut environment = None;
    for mode in &cfg.retry {
        let net = StarNet::setup().map_err(|e| format!("the attack lab: {e}"))?;
        let (net_s, hub) = (FORGED_NET.0.to_string() + "/" + &FORGED_NET.1.to_string(), Leaf::Victim.v4().to_string());
        net.hub().exec(&["ip", "route", "add", &net_s, "via", &hub]).map_err(|e| format!("the hub's route: {e}"))?;
        let r = one_run(cfg, &net, &forger, &scratch.0, (&cert, &key), mode);
        progress(&match &r {
            Ok(x) => format!(
                "--retry {mode}: {} Initials ({:.0}/s), {:.2}x toward forged addresses, {}/{} downloads, RSS peak {:.0} MiB, server CPU {:.0} %",
                x.initials, x.rate, x.amplification, x.downloads_ok, x.downloads, x.rss_peak_mib, x.server_cpu_pct
            ),
            Err(e) => format!("--retry {mode}: failed: {e}"),
        });
        if environment.is_none() {
            environment = Some(Environment::collect(&[
                (Some(net.ns(Leaf::Server)), net.dev(Leaf::Server)),
                (Some(net.ns(Leaf::Victim)), net.dev(Leaf::Victim)),
            ]));
        }
        rows.push(r);
    }
    Ok(Some(FloodBench { config: cfg.clone(), rows, environment: environment.expect("a row ran") }))
}

/// `(packets, bytes)` a device of the calling thread's namespace received.
fn rx_counts(dev: &str) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev").ok()?;
    let line = text.lines().find(|l| l.trim_start().starts_with(&format!("{dev}:")))?;
    let f: Vec<u64> = line.split_once(':')?.1.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    Some((*f.get(1)?, *f.first()?))
}

fn victim_rx(net: &StarNet) -> Result<(u64, u64), String> {
    let dev = net.dev(Leaf::Victim).to_string();
    net.ns(Leaf::Victim)
        .try_run(move || rx_counts(&dev))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "the victim's device counters could not be read".into())
}

fn rss_mib(pid: u32) -> Option<f64> {
    udpx_lab::task::rss(pid).map(|b| b as f64 / (1 << 20) as f64)
}

/// The attacker: `rate` forged Initials a second for `duration` from random addresses of
/// [`FORGED_NET`]. Returns `(Initials, UDP payload bytes)`.
fn flood(forger: &crate::lab::forge::InitialForger, srv: SocketAddrV4, rate: u64, duration: Duration) -> (u64, u64) {
    let raw = RawSender::new().expect("a raw socket (root)");
    let (mut sent, mut bytes, mut p) = (0u64, 0u64, Vec::with_capacity(1500));
    let mut rnd = [0u8; 6 * 64];
    let start = Instant::now();
    while start.elapsed() < duration {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        if sent >= due {
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        for chunk in 0..(due - sent).min(64) as usize {
            if chunk == 0 {
                let _ = udpx_quic::cid::random_bytes(&mut rnd);
            }
            let r = &rnd[chunk * 6..chunk * 6 + 6];
            let host = u32::from_be_bytes([0, r[0], r[1], r[2]]) & (u32::MAX >> FORGED_NET.1);
            let ip = Ipv4Addr::from(u32::from(FORGED_NET.0) | host);
            let port = 1024 + u16::from_be_bytes([r[3], r[4]]) % 64_000;
            forger.forge(&mut p);
            if raw.send(&forge::udp_datagram(SocketAddrV4::new(ip, port), srv, &p)).is_ok() {
                bytes += p.len() as u64;
            }
            sent += 1;
        }
    }
    (sent, bytes)
}

/// The legitimate client: downloads `url` whole, one after another, until `stop`. Returns
/// `(started, durations of the whole ones)`.
/// Downloads until `stop`: how many started, the times of the whole ones, and why each of the
/// others failed.
fn downloads(url: &str, size: usize, stop: &AtomicBool) -> (usize, Vec<Duration>, Vec<String>) {
    let (mut started, mut ok, mut failed) = (0, Vec::new(), Vec::new());
    while !stop.load(Ordering::Relaxed) {
        started += 1;
        let t = Instant::now();
        match get(url, None, &GetConfig::default()) {
            Ok(r) if r.status == 200 && r.bytes == size as u64 => ok.push(t.elapsed()),
            Ok(r) => failed.push(format!("status {}, {} of {size} bytes", r.status, r.bytes)),
            Err(e) => failed.push(e.to_string()),
        }
    }
    (started, ok, failed)
}

/// Starts `udpx h3 serve` in the server's namespace on `cpu`, with `--retry mode`, its output
/// into `log`, and waits until it serves.
fn start_server(
    cfg: &FloodConfig,
    net: &StarNet,
    dir: &Path,
    (cert, key): (&Path, &Path),
    mode: &str,
    cpu: usize,
    log: &Path,
) -> Result<ChildGroup, String> {
    let srv = SocketAddrV4::new(Leaf::Server.v4(), PORT);
    let logf = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let mut cmd = net.ns(Leaf::Server).command("taskset");
    cmd.args(["-c", &cpu.to_string()])
        .arg(&cfg.udpx)
        .args(["h3", "serve"])
        .arg(dir.join("www"))
        .args(["--listen", &srv.to_string(), "--shards", "1", "--retry", mode, "--cert"])
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["-l", &(cfg.duration.as_secs() + 120).to_string()])
        .args(cfg.host.serve_args())
        .stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    let server = ChildGroup::spawn(&mut cmd).map_err(|e| format!("starting the server: {e}"))?;
    crate::lab::process::wait_until_up("udpx h3 serve", log, || {
        std::fs::read_to_string(log).unwrap_or_default().contains(" on https://")
    })?;
    Ok(server)
}

/// Each distinct failure with how many times it came, in the order first seen.
fn count_each(failed: &[String]) -> Vec<(String, usize)> {
    failed.iter().fold(Vec::new(), |mut v: Vec<(String, usize)>, e| {
        match v.iter_mut().find(|(x, _)| x == e) {
            Some((_, n)) => *n += 1,
            None => v.push((e.clone(), 1)),
        }
        v
    })
}

fn one_run(
    cfg: &FloodConfig,
    net: &StarNet,
    forger: &Arc<crate::lab::forge::InitialForger>,
    dir: &Path,
    (cert, key): (&Path, &Path),
    mode: &str,
) -> Result<FloodRow, String> {
    let cpus = udpx_lab::cpu::online_cpus();
    let (attacker_cpu, server_cpu) = (cpus[0], *cpus.last().unwrap_or(&0));
    let srv = SocketAddrV4::new(Leaf::Server.v4(), PORT);
    let log = dir.join(format!("flood-{mode}.log"));
    let server = start_server(cfg, net, dir, (cert, key), mode, server_cpu, &log)?;
    let pid = server.id();
    let url = format!("https://{srv}/{FILE}");
    // One download before the flood: the server's memory with its first connection served.
    let u = url.clone();
    net.ns(Leaf::Client)
        .try_run(move || get(&u, None, &GetConfig::default()))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the download before the flood: {e}"))?;
    let rss_before = rss_mib(pid).ok_or("the server's memory could not be read")?;
    let rx0 = victim_rx(net)?;
    let rate = TickRate::system().map_err(|e| e.to_string())?;
    let cpu0 = CpuSample::now().map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let (f, d, r) = (forger.clone(), cfg.duration, cfg.rate);
    let attacker = net
        .ns(Leaf::Attacker)
        .try_spawn(move || {
            let _ = udpx_lab::cpu::pin_current_thread(attacker_cpu);
            flood(&f, srv, r, d)
        })
        .map_err(|e| e.to_string())?;
    let (u, s2, size) = (url.clone(), stop.clone(), cfg.file);
    let client = net.ns(Leaf::Client).try_spawn(move || downloads(&u, size, &s2)).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut samples: Vec<(Duration, f64)> = Vec::new();
    while start.elapsed() < cfg.duration {
        if let Some(m) = rss_mib(pid) {
            samples.push((start.elapsed(), m));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // The client stops with the flood (its download under way finishes first), whatever
    // happens below: no thread outlives the run.
    stop.store(true, Ordering::Relaxed);
    let cpu1 = CpuSample::now();
    let attacked = attacker.join();
    let flood_secs = start.elapsed().as_secs_f64();
    let client = client.join();
    let (initials, forged_bytes) = attacked.map_err(|_| "the attacker panicked")?;
    let (started, times, failed) = client.map_err(|_| "the client panicked")?;
    let cpu1 = cpu1.map_err(|e| e.to_string())?;
    // The server's answers to the last Initials, their retransmissions and the handshake
    // deadline (5 s) end before the victim's count and the memory after.
    std::thread::sleep(Duration::from_secs(7));
    let u = url.clone();
    let served_after = net
        .ns(Leaf::Client)
        .try_run(move || get(&u, None, &GetConfig::default()))
        .map_err(|e| e.to_string())?
        .is_ok_and(|r| r.status == 200 && r.bytes == size as u64);
    let rss_after = rss_mib(pid).unwrap_or(f64::NAN);
    let rx1 = victim_rx(net)?;
    let alive = rss_mib(pid).is_some();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT);
    let exited = server.wait().map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let counters = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("h3_serve").and_then(|s| s.get("quic")).cloned())
        .unwrap_or(serde_json::Value::Null);
    let d = cpu1.diff(&cpu0);
    let busy = d.busy_time(&[server_cpu], rate).as_secs_f64();
    let steal = udpx_lab::steal::Steal::of(&d, &[attacker_cpu, server_cpu], rate);
    let (victim_packets, raw_bytes) = (rx1.0 - rx0.0, rx1.1 - rx0.1);
    let victim_bytes = raw_bytes.saturating_sub(victim_packets * HEADERS);
    let amplification = victim_bytes as f64 / forged_bytes.max(1) as f64;
    let third = cfg.duration.mul_f64(2.0 / 3.0);
    let peak = |keep: &dyn Fn(Duration) -> bool| {
        samples.iter().filter(|(t, _)| keep(*t)).map(|s| s.1).fold(f64::NAN, f64::max)
    };
    let (early, late) = (peak(&|t| t < third), peak(&|t| t >= third));
    let mut times = times;
    times.sort();
    let ms = |d: Option<&Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    let limit = if mode == "never" { 3.0 } else { 1.0 };
    let mut bounds = vec![
        Bound::new("bytes toward forged addresses / bytes forged", amplification, limit),
        Bound::new("legitimate downloads that did not complete", (started - times.len()) as f64, 0.0),
        Bound::new("download after the flood failed", f64::from(u8::from(!served_after)), 0.0),
        Bound::new(
            "server ended (1: it did, or exited uncleanly)",
            f64::from(u8::from(!alive || !exited.success())),
            0.0,
        ),
    ];
    // Half-open connections live until the handshake deadline (5 s): a flood shorter than
    // three deadlines has not reached its plateau yet, and its growth is not judged.
    if cfg.duration >= PLATEAU_AFTER {
        bounds.push(Bound::new(
            "memory still growing: last third's peak, MiB (the peak before it + 10 % + 8)",
            late,
            early * 1.1 + 8.0,
        ));
    }
    Ok(FloodRow {
        retry: mode.to_string(),
        initials,
        forged_bytes,
        rate: initials as f64 / flood_secs,
        victim_packets,
        victim_bytes,
        amplification,
        downloads: started,
        downloads_ok: times.len(),
        download_failures: count_each(&failed),
        download_p50_ms: ms(times.get(times.len() / 2)),
        download_max_ms: ms(times.last()),
        served_after,
        rss_before_mib: rss_before,
        rss_peak_mib: early.max(late),
        rss_after_mib: rss_after,
        rss_last_third_mib: late,
        rss_first_two_thirds_mib: early,
        server_cpu_pct: busy * 100.0 / flood_secs,
        steal,
        counters,
        bounds,
    })
}

/// The report.
pub fn table(b: &FloodBench) -> String {
    use std::fmt::Write as _;
    let c = &b.config;
    let mut s = format!(
        "Initial flood: {} forged client Initials/s for {} s from random addresses of {}/{} (attack lab, namespaces), \
         against `udpx h3 serve --shards 1`; a legitimate client downloads {} B over and over meanwhile.\n\n",
        c.rate,
        c.duration.as_secs(),
        FORGED_NET.0,
        FORGED_NET.1,
        c.file
    );
    let _ = writeln!(
        s,
        "| --retry | Initials (/s) | toward forged / forged | downloads whole | p50 / max ms | RSS before / peak / after MiB | server CPU | Retries | refused half-open | handshake timeouts | kernel drops |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &b.rows {
        match r {
            Err(e) => {
                let _ = writeln!(s, "| failed: {e} |");
            }
            Ok(r) => {
                let n = |k: &str| r.counters.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                // A stolen run's timings and CPU share are not quoted.
                let timed = |v: f64, unit: &str| {
                    if r.steal.stolen {
                        format!("stolen ({})", r.steal.pct())
                    } else {
                        format!("{v:.0}{unit}")
                    }
                };
                let _ = writeln!(
                    s,
                    "| {} | {} ({:.0}) | {:.3}x ({} B / {} B) | {}/{}{} | {} / {} | {:.0} / {:.0} / {:.0} | {} | {} | {} | {} | {} |",
                    r.retry,
                    r.initials,
                    r.rate,
                    r.amplification,
                    r.victim_bytes,
                    r.forged_bytes,
                    r.downloads_ok,
                    r.downloads,
                    if r.served_after { ", then 1/1" } else { ", then 0/1" },
                    timed(r.download_p50_ms, ""),
                    timed(r.download_max_ms, ""),
                    r.rss_before_mib,
                    r.rss_peak_mib,
                    r.rss_after_mib,
                    timed(r.server_cpu_pct, " %"),
                    n("retries_sent"),
                    n("refused_half_open"),
                    n("handshake_timeouts"),
                    n("kernel_drops"),
                );
            }
        }
    }
    for r in b.rows.iter().flatten() {
        for (why, n) in &r.download_failures {
            let _ = writeln!(s, "\n--retry {}: {n} legitimate download(s) failed: {why}", r.retry);
        }
    }
    if let Some(note) = udpx_lab::judge::steal_note(b.rows.iter().flatten().map(|r| &r.steal), None) {
        let _ = writeln!(s, "\n{note}; one run per mode: a marked run's CPU share and download times say `stolen`");
    }
    s.push_str("\nBounds (each must hold in every run):\n");
    for r in b.rows.iter().flatten() {
        for x in &r.bounds {
            let _ = writeln!(
                s,
                "  [{}] --retry {}: {}: {:.3} (at most {:.3})",
                if x.met { "met" } else { "MISSED" },
                r.retry,
                x.what,
                x.value,
                x.at_most
            );
        }
    }
    let _ = write!(s, "\n{}", b.environment.to_markdown());
    s
}
