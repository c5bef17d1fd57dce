//! `udpx bench h3`: the Cloudflare post's table on this machine. One file (100 MB by
//! default) is downloaded once per row and round: from [`serve`] in each I/O mode
//! by ngtcp2's `gtlsclient` and by [`get`], and from nginx (HTTPS over TCP, TLS 1.3,
//! the same certificate) by curl. Rounds are interleaved (every row once, then again); each
//! row reports its median run by cost, whole, with the range over runs.
//!
//! **What is counted** (equal footing, issue 28). Over veth (root): the server (udpx's shard
//! threads, started from a thread pinned there, or nginx under `taskset`) on the last CPU,
//! every client on the first; threaded NAPI on both ends of the pair, each pinned to its
//! side's CPU, so receive work, TCP's ACK-clocked sends included, lands on the side that
//! receives. The server's cost is its CPU's busy time from the client's start to its exit
//! ([`udpx_lab::cpu::CpuDelta::busy_time`]: the tick-sampled work or the window less the
//! exactly measured idle, the larger), whoever ran there: for TCP the kernel's softirq work
//! outside nginx's task is counted as quiche's work on the shard thread is. The server's own
//! tasks' share (`schedstat`: the shard threads, nginx's process) is printed beside it. Two
//! profiles ([`Profile`]), run one after the other: `software`, where the server's device
//! offloads neither TCP nor UDP segmentation (the GSO layer splits both in the server's
//! context), and `offload`, where it offloads both (a TSO packet and a UDP GSO run cross the
//! pair whole). On loopback the client's receive work runs in the sender's softirq and is
//! counted with the server, for nginx too. Throughput is the client's: `get`'s own timer, or
//! the wall time from starting `gtlsclient` or curl to its exit (process start and handshake
//! included).
//!
//! **Rows.** `sendmsg`, `sendmmsg`, `gso` and `gso-mmsg` receive without GRO; `gso +GRO` is
//! `gso` with UDP_GRO on: the post's last step. Per client, so that a client's own pace
//! (gtlsclient acknowledges differently from quiche) is compared only with itself. A peer
//! that is not installed leaves its rows out, named in [`H3Bench::left_out`].
//!
//! **Steal** ([`udpx_lab::steal`]). Each run records the hypervisor's steal from the server's
//! and the client's CPUs over its download; a run over 2 % is marked and counts in no median,
//! range or verdict, and extra rounds (at most as many again) make it up. The Chromium pair
//! runs its own number of rounds ([`H3BenchConfig::chromium_repeat`], 5 by default),
//! interleaved with the others.
//!
//! **Targets** ([`judge`]): `gso +GRO` at most 0.5x of `sendmsg` in server CPU per byte, per
//! client; the best udpx row at most 1.0x nginx's in the software profile, 1.2x in the offload
//! profile, 2x on loopback ([`nginx_target`]; the ratio is reported whatever it is).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use udpx_lab::cpu::TickRate;
use udpx_lab::env::Environment;
use udpx_lab::netns::Profile;
use udpx_lab::stats::{another_round, figures, Kept};
use udpx_quic::IoMode;

use udpx_h3::{get, serve, GetConfig, ServeConfig, Tls};

use crate::lab::{write_cert, write_file, Scratch};

mod browser;
mod config;
mod peers;
mod place;
mod runs;

use crate::lab::receive_note;
pub use crate::lab::Programs;
use peers::{equal_footing, gtlsclient, nginx_run, quinn_run};
use udpx_lab::task::threads_named;

mod report;

pub use config::{nginx_target, udpx_servers, Cache, ClientKind, H3BenchConfig, ServerKind};
use config::{server_name, FILE, QUINN};
use place::{Place, ServerMeter};
pub use report::{judge, table};
use runs::{measured, per_mb};
pub use runs::{CacheUse, H3Bench, H3Row, H3Run, LeftOut, Passes, ZerocopyUse};

/// The rows to run and those left out.
fn plan(cfg: &H3BenchConfig) -> (Vec<(ServerKind, ClientKind)>, Vec<LeftOut>) {
    let (p, cache, chromium) = (&cfg.programs, cfg.cache_size > 0, cfg.chromium_repeat > 0);
    let mut rows = Vec::new();
    let mut left = Vec::new();
    for client in [ClientKind::Gtlsclient, ClientKind::UdpxGet] {
        if client == ClientKind::Gtlsclient && p.gtlsclient.is_none() {
            left.push(LeftOut {
                rows: "every udpx row with gtlsclient".into(),
                why: "gtlsclient not found in PATH (Debian package ngtcp2-client; scripts/setup.sh installs it)".into(),
            });
            continue;
        }
        rows.extend(udpx_servers().into_iter().map(|s| (s, client)));
    }
    let missing: Vec<&str> =
        [("nginx", &p.nginx), ("curl", &p.curl)].iter().filter(|(_, p)| p.is_none()).map(|(n, _)| *n).collect();
    if p.udpx.is_some() {
        rows.push((ServerKind::Quinn, ClientKind::UdpxGet));
    } else {
        left.push(LeftOut {
            rows: format!("{QUINN} / udpx h3 get"),
            why: "no udpx binary to run `udpx h3 quinn-serve` (`udpx bench h3` gives itself)".into(),
        });
    }
    if missing.is_empty() {
        rows.push((ServerKind::Nginx, ClientKind::Curl));
    } else {
        left.push(LeftOut {
            rows: "nginx https/tcp / curl".into(),
            why: format!(
                "{} not found in PATH (Debian packages nginx, curl; scripts/setup.sh installs them)",
                missing.join(" and ")
            ),
        });
    }
    // The clients users bring, each a pair: udpx over HTTP/3, nginx over HTTP/2.
    let pairs = [
        (
            &p.chromium,
            ClientKind::Chromium,
            "the chromium rows",
            "chromium not found in PATH (Debian package chromium; scripts/setup.sh installs it)".to_string(),
        ),
        (
            &p.independent,
            ClientKind::Independent,
            "the independent client's rows",
            format!(
                "{} not found (scripts/setup.sh builds it from peers/quicgo-load)",
                crate::clients::quicgo::PROGRAM
            ),
        ),
    ];
    for (program, client, what, why) in pairs {
        if client == ClientKind::Chromium && !chromium {
            left.push(LeftOut { rows: what.into(), why: "--chromium-repeat 0".into() });
            continue;
        }
        if program.is_none() {
            left.push(LeftOut { rows: what.into(), why });
            continue;
        }
        let udpx = |cache| (ServerKind::Udpx { io: IoMode::GsoMmsg, gro: true, cache }, client);
        rows.push(udpx(Cache::Off));
        if cache {
            rows.push(udpx(Cache::On));
            // Chromium fetches the file again and again: a cache of half of it shows what the
            // cache costs where it cannot help (issue 47). quic-go's client fetches once.
            if client == ClientKind::Chromium {
                rows.push(udpx(Cache::Half));
            }
        }
        if p.nginx.is_some() {
            rows.push((ServerKind::Nginx, client));
        }
    }
    (rows, left)
}

/// Runs the bench. `progress` gets a line per run.
pub fn run(cfg: &H3BenchConfig, progress: &mut dyn FnMut(&str)) -> Result<H3Bench, String> {
    if cfg.size == 0 || cfg.repeat == 0 {
        return Err("the file size and the rounds must be at least 1".into());
    }
    let scratch = Scratch::new()?;
    let file = scratch.0.join("www").join(FILE);
    write_file(&file, cfg.size).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let (cert, key) = (scratch.0.join("cert.pem"), scratch.0.join("key.pem"));
    let pin = write_cert(&cert, &key)?;
    browser::write_page(&scratch.0.join("www"))?;
    let cpus = udpx_lab::cpu::online_cpus();
    let (client_cpu, server_cpu) = (cpus[0], *cpus.last().unwrap_or(&0));
    let net = if cfg.veth { Some(equal_footing(cfg.profile, cfg.napi, server_cpu, client_cpu)?) } else { None };
    let place = Place {
        net: net.as_ref(),
        server_ip: net.as_ref().map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |n| IpAddr::V4(n.rx_v4)),
        server_cpu,
        client_cpu,
    };
    let profile = if cfg.veth { cfg.profile.as_str() } else { "loopback" };
    let path = match &net {
        Some(n) => format!(
            "{profile} profile: veth pair between two namespaces ({} -> {}; {}); {}; servers pinned to CPU \
             {server_cpu}, clients to CPU {client_cpu}; server CPU = CPU {server_cpu}'s busy time, its own tasks' share \
             beside it",
            n.rx_dev,
            n.tx_dev,
            match cfg.profile {
                Profile::Software =>
                    "TSO and tx-udp-segmentation off on the server's device: TCP and UDP GSO both \
                                      split in the server's context",
                Profile::Offload => "TSO and tx-udp-segmentation on: TCP segments and UDP GSO runs cross whole",
            },
            receive_note(cfg.napi)
        ),
        None => format!(
            "LOOPBACK: the client's receive processing runs in the sender's softirq on CPU {server_cpu} and is \
             counted with the server (for nginx too)"
        ),
    };
    // The udpx servers' settings as the flags of `udpx h3 serve` that give them.
    let path = format!(
        "{path}; udpx under {}; each udpx connection writes per turn {}",
        cfg.host.serve_args().join(" "),
        match cfg.host.burst() {
            udpx_quic::Burst::Quantum => "its send_quantum() (--burst quantum)",
            udpx_quic::Burst::Window => "what its window allows, at most 64 packets (--burst window)",
        }
    );
    let (plan, left_out) = plan(cfg);
    let rate = TickRate::system().map_err(|e| e.to_string())?;
    let planned: Vec<usize> = plan.iter().map(|&(_, c)| cfg.rounds_of(c)).collect();
    let mut runs: Vec<Vec<Result<H3Run, String>>> = vec![Vec::new(); plan.len()];
    for round in 0.. {
        let due = due_rows(&planned, &runs);
        if !due.contains(&true) {
            break;
        }
        for (i, &(server, client)) in plan.iter().enumerate().filter(|(i, _)| due[*i]) {
            let label = format!("{} / {}", server_name(server), client.name());
            let r = one_run(cfg, &place, &scratch.0, (&cert, &key, &pin), server, client, rate);
            let of = planned[i];
            progress(&match &r {
                Ok(x) => format!(
                    "round {}/{of}: {label}: {:.3} CPU-s/GB, {:.0} Mbit/s{}",
                    round + 1,
                    x.cpu_s_per_gb,
                    x.mbit_per_s,
                    if x.steal.stolen { format!(", STOLEN {} (left out)", x.steal.pct()) } else { String::new() }
                ),
                Err(e) => format!("round {}/{of}: {label}: failed: {e}", round + 1),
            });
            runs[i].push(r);
        }
    }
    let rows: Vec<H3Row> = plan
        .iter()
        .zip(runs)
        .zip(&planned)
        .map(|((&(s, c), r), &n)| merge(server_name(s), c.name().to_string(), r, n))
        .collect();
    let environment = match &net {
        Some(n) => Environment::collect(&[(Some(&n.rx), &n.rx_dev), (Some(&n.tx), &n.tx_dev)]),
        None => Environment::collect(&[(None, "lo")]),
    };
    let checks = judge(&rows, nginx_target(cfg));
    let debug_build = cfg!(debug_assertions);
    Ok(H3Bench { config: cfg.clone(), profile: profile.into(), path, rows, left_out, checks, environment, debug_build })
}

/// Which rows run in the next round: the rows of each number of planned rounds (the Chromium
/// pair's, the others') run together, so their runs stay paired round by round, while
/// [`another_round`] says so for them.
fn due_rows(planned: &[usize], runs: &[Vec<Result<H3Run, String>>]) -> Vec<bool> {
    let kept: Vec<Kept> = runs
        .iter()
        .zip(planned)
        .map(|(r, &n)| {
            let ok: Vec<Option<H3Run>> = r.iter().map(|x| x.as_ref().ok().copied()).collect();
            Kept::of(&figures(&ok, |x| x.cpu_s_per_gb), n)
        })
        .collect();
    (0..planned.len())
        .map(|i| {
            let group = (0..planned.len()).filter(|&j| planned[j] == planned[i]).map(|j| kept[j]);
            another_round(planned[i], runs[i].len(), group)
        })
        .collect()
}

/// A row from its runs: the median clean run by cost, every run beside it, the first error;
/// `planned`: its rounds before any extra one.
fn merge(server: String, client: String, runs: Vec<Result<H3Run, String>>, planned: usize) -> H3Row {
    let error = runs.iter().find_map(|r| r.as_ref().err().cloned());
    let runs: Vec<Option<H3Run>> = runs.into_iter().map(Result::ok).collect();
    let kept = Kept::of(&figures(&runs, |r| r.cpu_s_per_gb), planned);
    let median_run = kept.median_run;
    H3Row { server, client, median: median_run.and_then(|i| runs[i]), median_run, runs, error, kept }
}

/// One download of one row.
fn one_run(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    (cert, key, pin): (&Path, &Path, &str),
    server: ServerKind,
    client: ClientKind,
    rate: TickRate,
) -> Result<H3Run, String> {
    match server {
        ServerKind::Udpx { io, gro, cache } => {
            udpx_run(cfg, place, dir, (cert, key, pin), (io, gro, cache), client, rate)
        }
        ServerKind::Nginx => nginx_run(cfg, place, dir, (cert, key, pin), client, rate),
        ServerKind::Quinn => quinn_run(cfg, place, dir, (cert, key), rate),
    }
}

#[allow(clippy::too_many_arguments)]
fn udpx_run(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    (cert, key, pin): (&Path, &Path, &str),
    (io, gro, cache): (IoMode, bool, Cache),
    client: ClientKind,
    rate: TickRate,
) -> Result<H3Run, String> {
    let mut sc = ServeConfig::new(SocketAddr::new(place.server_ip, 0));
    sc.cache_size = cache.bytes(cfg);
    sc.tls = Tls::Files { cert: cert.to_path_buf(), key: key.to_path_buf() };
    cfg.host.apply(&mut sc);
    (sc.quic.io, sc.quic.gro) = (io, gro);
    let before = threads_named("udpx-quic-");
    let shards = sc.quic.shards;
    let www = dir.join("www");
    // Started from a thread pinned to the server's CPU: the shard threads inherit it.
    let server = place
        .run_on(place.server_ns(), place.server_cpu, move || serve(&www, &sc))?
        .map_err(|e| format!("udpx server: {e}"))?;
    // A shard thread names itself when it starts, which may be just after `serve` returns.
    let named = Instant::now();
    let threads = loop {
        let t: Vec<u32> = threads_named("udpx-quic-").into_iter().filter(|t| !before.contains(t)).collect();
        if t.len() >= shards || named.elapsed() > Duration::from_secs(2) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    if threads.len() != shards {
        let _ = server.stop();
        return Err(format!("{} server threads found in /proc/self/task, {shards} expected", threads.len()));
    }
    let tasks: Vec<String> = threads.iter().map(|t| format!("/proc/self/task/{t}")).collect();
    let addr = server.local_addr();
    let url = format!("https://{addr}/{FILE}");
    let meter = ServerMeter::start(tasks, place, rate);
    let got = match client {
        ClientKind::Gtlsclient => gtlsclient(cfg, place, dir, addr, &url),
        ClientKind::UdpxGet => {
            let u = url.clone();
            let f = move || get(&u, None, &GetConfig::default()).map(|r| (r.bytes, r.seconds));
            place.run_on(place.client_ns(), place.client_cpu, f)?.map_err(|e| format!("udpx h3 get: {e}"))
        }
        ClientKind::Curl => Err("curl is not an HTTP/3 client here".into()),
        ClientKind::Chromium => browser::fetch(cfg, place, dir, addr, true, pin).map(|f| (f.bytes, f.seconds)),
        ClientKind::Independent => peers::independent(cfg, place, addr, crate::clients::quicgo::Proto::H3),
    };
    let cost = meter.stop();
    let counters = server.stop().map_err(|e| format!("udpx server: {e}"))?;
    let (bytes, seconds) = got?;
    // Chromium's page and its fetches: the file FETCHES times, the page once (and maybe a
    // favicon, 404).
    let (files, extra) = if client == ClientKind::Chromium { (browser::FETCHES, 1) } else { (1, 0) };
    let body_ok = counters.http.body_bytes >= files * cfg.size && counters.http.body_bytes < (files + 1) * cfg.size;
    if bytes != files * cfg.size || counters.http.ok != files + extra || !body_ok {
        return Err(format!(
            "{bytes} bytes received, {} sent in {} responses; the file has {}",
            counters.http.body_bytes, counters.http.ok, cfg.size
        ));
    }
    let Some(cost) = cost else {
        return Err("the server's threads (/proc/self/task) or /proc/stat could not be read".into());
    };
    let q = &counters.quic;
    Ok(H3Run {
        send_calls: Some(q.send_calls),
        packets_per_call: Some(q.packets_per_call),
        lost_packets: Some(q.lost_packets),
        gro_buffers: Some(q.gro_buffers),
        zerocopy: Some(ZerocopyUse {
            sends: q.zerocopy_sends,
            copied: q.zerocopy_copied,
            turned_off: q.zerocopy_turned_off > 0,
        }),
        passes: Passes::of(&counters),
        read_buffers_made: Some(counters.http.read_buffers_made),
        turns_per_mb: per_mb(q.turns, counters.http.body_bytes),
        send_calls_per_mb: per_mb(q.send_calls, counters.http.body_bytes),
        packets_per_datagram_in: (q.datagrams_received > 0)
            .then(|| q.packets_sent as f64 / q.datagrams_received as f64),
        cache: counters.cache.map(|k| CacheUse {
            hit_ratio: k.hits as f64 / (k.hits + k.misses + k.uncached).max(1) as f64,
            held_mib: k.held as f64 / (1u64 << 20) as f64,
            capacity_mib: k.capacity as f64 / (1u64 << 20) as f64,
        }),
        ..measured(cost, bytes, seconds)
    })
}

#[cfg(test)]
mod tests {
    use udpx_lab::steal::Steal;

    use super::place::Cost;
    use super::*;

    #[test]
    fn missing_peers_are_named() {
        let of = |programs: Programs, cache_size: usize, chromium_repeat: usize| H3BenchConfig {
            programs,
            cache_size,
            chromium_repeat,
            ..H3BenchConfig::new()
        };
        let (rows, left) = plan(&of(Programs::default(), 0, 5));
        assert_eq!(rows.len(), udpx_servers().len(), "udpx h3 get needs no peer");
        assert!(rows.iter().all(|r| r.1 == ClientKind::UdpxGet));
        assert_eq!(left.len(), 5);
        assert!(left[0].why.contains("gtlsclient") && left[1].why.contains("udpx binary"), "{left:?}");
        assert!(left[2].why.contains("nginx and curl") && left[3].why.contains("chromium"), "{left:?}");
        assert!(left[4].why.contains(crate::clients::quicgo::PROGRAM), "{left:?}");
        let with_udpx = Programs { udpx: Some("/bin/true".into()), ..Programs::default() };
        let (rows, _) = plan(&of(with_udpx, 0, 5));
        assert_eq!(rows.last(), Some(&(ServerKind::Quinn, ClientKind::UdpxGet)));
        // The independent client's pair: udpx over HTTP/3, nginx over HTTP/2.
        let both =
            Programs { independent: Some("/bin/true".into()), nginx: Some("/bin/true".into()), ..Programs::default() };
        let (rows, _) = plan(&of(both, 0, 5));
        let udpx = ServerKind::Udpx { io: IoMode::GsoMmsg, gro: true, cache: Cache::Off };
        assert_eq!(
            rows[rows.len() - 2..],
            [(udpx, ClientKind::Independent), (ServerKind::Nginx, ClientKind::Independent)]
        );
    }

    #[test]
    fn chromium_repeat_0_leaves_the_chromium_pair_out() {
        let all =
            Programs { chromium: Some("/bin/true".into()), nginx: Some("/bin/true".into()), ..Programs::default() };
        let of = |chromium_repeat| H3BenchConfig { programs: all.clone(), chromium_repeat, ..H3BenchConfig::new() };
        let (with, _) = plan(&of(5));
        assert!(with.iter().any(|r| r.1 == ClientKind::Chromium), "{with:?}");
        let (rows, left) = plan(&of(0));
        assert!(rows.iter().all(|r| r.1 != ClientKind::Chromium), "{rows:?}");
        assert!(left.iter().any(|l| l.rows == "the chromium rows" && l.why == "--chromium-repeat 0"), "{left:?}");
    }

    fn cost(c: f64, stolen: bool) -> Cost {
        Cost { busy: c, task: c, switches: None, steal: Steal { stolen, ..Steal::default() } }
    }

    #[test]
    fn rows_are_median_runs_and_targets_paired() {
        let run = |c: f64| Ok(measured(cost(c, false), 1_000_000_000, 1.0));
        let rows = vec![
            merge("sendmsg".into(), "gtlsclient".into(), vec![run(2.0), run(2.2), run(1.8)], 3),
            merge("gso +GRO".into(), "gtlsclient".into(), vec![run(0.8), Err("x".into()), run(0.9)], 3),
            merge("nginx https/tcp".into(), "curl".into(), vec![run(0.5), run(0.5), run(0.5)], 3),
        ];
        assert_eq!(rows[0].median_run, Some(0));
        assert_eq!((rows[1].median_run, rows[1].error.as_deref()), (Some(0), Some("x")));
        let c = judge(&rows, 2.0);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0].ratios, vec![0.4, 0.5]);
        assert!(c[1].what.contains("gso +GRO / gtlsclient"), "{}", c[1].what);
        assert_eq!(c[1].ratios, vec![1.6, 1.8]);
    }
}
