//! The QUIC interop runner's `handshakeloss` case against `udpx_h3::serve`: 50 sequential
//! downloads of a 1 KiB file by ngtcp2's client (`gtlsclient`, Debian's `ngtcp2-client`: an
//! implementation nobody here wrote), each on a connection of its own, through a path of
//! 15 ms one-way, 10 Mbit/s and 30 % loss each way ([`common::lossy`]), all within 300 s.
//! Every download must arrive whole.
//!
//! The client runs as ngtcp2's own interop endpoint runs it in this case (the runner calls it
//! `multiconnect` there): handshake and idle timeouts of 180 s ([`CLIENT_TIMEOUTS`]);
//! `UDPX_HANDSHAKELOSS_CLIENT_DEFAULTS=1` runs it at its defaults instead (a 10 s handshake
//! timeout, a 333 ms initial RTT). What failed, from server traces and the client's qlog
//! (issue 46 item 4), and what changed:
//!
//! - quiche 0.30's probe timeout resent one packet number space's data only: after a lost
//!   first flight the ServerHello went alone and the Handshake flight a probe later, twice as
//!   late; a client's probe (its ClientHello again) was only acknowledged. quiche patch 0004
//!   (`third_party/quiche/PATCHES.md`) resends the whole flight, coalesced, at a probe and at
//!   once when the client probes (RFC 9002 6.2.3, 6.2.4).
//! - A server probe repeated its Initial ACK of a ClientHello received seconds before; the
//!   client, which ignores an Initial ACK's delay, took the wait for its RTT (1-3 s seen), so
//!   its own probes came seconds apart and a lost Finished was resent at 4, 11 and 25 s, past
//!   the server's handshake timeout or its own idle timeout (seed 0x06fadeeb8768fe19 attempt
//!   3). Patch 0009 (a server's Initial packets repeat no ACK). Its first form, as 0006, was
//!   withdrawn for a stall that patch 0006 now explains and fixes (a stream with nothing left
//!   to send blocked the others: an upstream race that the probe patches made likelier).
//! - A server whose flight fits one datagram sent one datagram a probe timeout, never the
//!   second probe RFC 9002 allows: five single probes lost in the first 9 s ended a handshake
//!   (seed 0xe67a6e9e45fb3275 attempt 27). Patch 0007: the second probe is the flight again.
//! - After the handshake a lost response was never resent: each probe resent the oldest small
//!   packets (HANDSHAKE_DONE, a ticket, the control stream), the client's acknowledgements of
//!   them were lost too, and the client's idle timeout came first (seed 0xbaa3404f7cac96f8
//!   attempt 39). Patch 0005: a probe carries as much of the oldest data as fits.
//! - Left, and not the server's: the client sends its Initial at 0, 1, 3 and 7 s only, so at its
//!   default 10 s timeout 0.3^4 (1 in 123) of its handshakes fail before the server hears a
//!   word (traced: four datagrams lost, the fifth its CONNECTION_CLOSE); a run of 50 then passes
//!   whole at most 0.992^50 = 2 runs in 3.
//!
//! Measured (`third_party/quiche/PATCHES.md` has the table): with 0004-0005, 0007 and 0009 at
//! the client's defaults, 4 runs of 6 whole (298/300: both failures the floor below); with
//! 0004 and 0005 alone 3 runs of 5 (248/250), and 150/150 at the 180 s timeouts. The test
//! stays out of the suite (run it with `--ignored`):
//! the client's floor fails a run in three at its defaults, and one in about 300 at 180 s (all
//! eight Initials lost), and a test must not fail by chance.
//!
//! `UDPX_LOSS_TRACE=1` writes the server's quiche trace and the relay's fate of each datagram
//! to each attempt's `trace.log` (kept with a failed attempt, and with a pass slower than
//! [`SLOW`]).
//!
//! The coins' seed is fresh each run and printed; `UDPX_LOSS_SEED=<seed>` plays a run's losses
//! again, and with `UDPX_LOSS_ATTEMPT=<n>` only its attempt `n`. A failed attempt's client log
//! and qlog are kept (the path is printed). A missing
//! `gtlsclient` is a SKIP, printed and recorded. Counts are asserted, never times: the 300 s
//! and each attempt's deadline bound the test, they measure nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::lossy::{Coin, Link, PathSpec, Relay, Tally};
use common::{digest, start, Site, TempDir};
use udpx_lab::netns::ChildGroup;
use udpx_quic::IoMode;

/// Downloads, each on its own connection.
const ATTEMPTS: u64 = 50;
/// The case's bound on the whole: the runner's.
const BUDGET: Duration = Duration::from_secs(300);
/// One attempt's bound (within what is left of [`BUDGET`]): past the client's own timeouts, so
/// a client that gives up does so by itself; one that does not is killed and fails.
const ATTEMPT_DEADLINE: Duration = Duration::from_secs(200);
/// ngtcp2's interop endpoint's timeouts for this case (`interop/run_endpoint.sh`,
/// `multiconnect`): a client that keeps sending its Initial (at 0, 1, 3, 7, 15, 31, 63 and
/// 127 s) until one gets through (all eight lost: 0.3^8, 1 in 15,000).
const CLIENT_TIMEOUTS: [&str; 2] = ["--handshake-timeout=180s", "--timeout=180s"];
/// A traced pass slower than this is kept (`UDPX_LOSS_TRACE`).
const SLOW: Duration = Duration::from_secs(3);
/// The file: `small`, 1 KiB.
const FILE: &str = "small";

/// The run's seed: `UDPX_LOSS_SEED` (decimal or 0x-hex) to replay one, else a fresh one.
fn base_seed() -> u64 {
    if let Ok(s) = std::env::var("UDPX_LOSS_SEED") {
        let s = s.trim();
        let parsed = match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => s.parse(),
        };
        return parsed.unwrap_or_else(|e| panic!("UDPX_LOSS_SEED={s:?}: {e}"));
    }
    let mut b = [0u8; 8];
    udpx_quic::cid::random_bytes(&mut b).expect("random seed");
    u64::from_ne_bytes(b)
}

/// `UDPX_LOSS_ATTEMPT`: the one attempt to play again, if set.
fn only_attempt() -> Option<u64> {
    let s = std::env::var("UDPX_LOSS_ATTEMPT").ok()?;
    Some(s.trim().parse().unwrap_or_else(|e| panic!("UDPX_LOSS_ATTEMPT={s:?}: {e}")))
}

/// Attempt `i`'s coins: a seed of its own, so one attempt's losses do not depend on how many
/// datagrams the ones before it sent.
fn attempt_seed(base: u64, i: u64) -> u64 {
    Coin(base ^ i.wrapping_mul(0xd6e8_feb8_6659_fd93)).next()
}

/// `UDPX_LOSS_TRACE=1`: the server's quiche trace (and udpx's debug lines) go to `trace.log`
/// in each attempt's directory, kept with it when it fails. Lines start with the milliseconds
/// since the attempt began.
mod trace {
    use std::io::Write;
    use std::sync::Mutex;
    use std::time::Instant;

    static SINK: Mutex<Option<(Instant, std::io::BufWriter<std::fs::File>)>> = Mutex::new(None);

    struct Sink;

    impl log::Log for Sink {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.target().starts_with("quiche") || m.level() <= log::Level::Debug
        }
        fn log(&self, r: &log::Record) {
            if !self.enabled(r.metadata()) {
                return;
            }
            if let Some((t0, w)) = SINK.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                let _ = writeln!(w, "{:10.3} {} {}", t0.elapsed().as_secs_f64() * 1e3, r.target(), r.args());
            }
        }
        fn flush(&self) {
            if let Some((_, w)) = SINK.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                let _ = w.flush();
            }
        }
    }

    /// Whether tracing is on (`UDPX_LOSS_TRACE`); installs the logger once.
    pub fn on() -> bool {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        let on = std::env::var_os("UDPX_LOSS_TRACE").is_some();
        if on {
            INSTALLED.call_once(|| {
                if log::set_logger(&Sink).is_ok() {
                    log::set_max_level(log::LevelFilter::Trace);
                }
            });
        }
        on
    }

    /// Sends what is logged from now on to `path` (`None`: nowhere), flushing the last file.
    pub fn to(path: Option<&std::path::Path>) {
        let mut g = SINK.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, w)) = g.as_mut() {
            let _ = w.flush();
        }
        *g = path.and_then(|p| std::fs::File::create(p).ok()).map(|f| (Instant::now(), std::io::BufWriter::new(f)));
    }
}

/// How an attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    /// The client exited unsuccessfully (its status).
    Failed(String),
    /// The client exited successfully but the file is missing or differs.
    Wrong(String),
    /// Still running at its deadline: killed.
    Hung,
}

/// Runs gtlsclient once through a fresh relay seeded with `seed`; its output and qlog go
/// to `dir`.
fn attempt(
    client: &Path,
    server: std::net::SocketAddr,
    seed: u64,
    dir: &Path,
    deadline: Duration,
    want: &[u8],
) -> (Outcome, Tally) {
    if trace::on() {
        trace::to(Some(&dir.join("trace.log")));
    }
    let relay = Relay::start(server, PathSpec::handshakeloss(), seed).expect("relay starts");
    let port = relay.addr().port().to_string();
    // gtlsclient makes no directory for its qlog.
    std::fs::create_dir_all(dir.join("qlog")).expect("qlog directory");
    let log = std::fs::File::create(dir.join("gtlsclient.log")).expect("log file");
    let mut cmd = Command::new(client);
    cmd.args(["-q", "--exit-on-all-streams-close"]);
    if std::env::var_os("UDPX_HANDSHAKELOSS_CLIENT_DEFAULTS").is_none() {
        cmd.args(CLIENT_TIMEOUTS);
    }
    cmd.arg(format!("--download={}", dir.display()))
        .arg(format!("--qlog-dir={}", dir.join("qlog").display()))
        .args(["127.0.0.1", &port, &format!("https://127.0.0.1:{port}/{FILE}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log);
    let status = ChildGroup::spawn(&mut cmd).expect("spawn gtlsclient").wait_timeout(deadline).expect("wait");
    let tally = relay.stop().expect("relay ran");
    // The server's last words on the connection (its drop, a timeout) are in by now or lost.
    trace::to(None);
    let outcome = match status {
        None => Outcome::Hung,
        Some(s) if !s.success() => Outcome::Failed(s.to_string()),
        Some(_) => match std::fs::read(dir.join(FILE)) {
            Ok(got) if got.len() == want.len() && digest(&got) == digest(want) => Outcome::Pass,
            Ok(got) => Outcome::Wrong(format!("{} bytes, not the file's {}", got.len(), want.len())),
            Err(e) => Outcome::Wrong(format!("not downloaded: {e}")),
        },
    };
    (outcome, tally)
}

/// Copies a failed attempt's directory where it outlives the test.
fn keep(dir: &Path, i: u64) -> PathBuf {
    let to =
        std::env::temp_dir().join(format!("udpx-handshakeloss-{}", std::process::id())).join(format!("attempt-{i}"));
    let _ = std::fs::create_dir_all(to.join("qlog"));
    for sub in ["", "qlog"] {
        if let Ok(entries) = std::fs::read_dir(dir.join(sub)) {
            for e in entries.flatten().filter(|e| e.path().is_file()) {
                let _ = std::fs::copy(e.path(), to.join(sub).join(e.file_name()));
            }
        }
    }
    to
}

/// Not passing in every run (issue 46, item 4): at the client's defaults about 1 attempt in
/// At the client's defaults one run in three fails by the client's floor (all four of its
/// Initials lost, which no server can help; see the module docs); at the 180 s timeouts one in
/// about 300 by the same floor (eight Initials). Ignored so that the suite does not fail by
/// chance: run it with `--ignored`.
#[test]
#[ignore = "issue 46 item 4: the client's floor fails a run now and then (1 in 3 at its defaults); run with --ignored"]
fn gtlsclient_handshakes_through_30_percent_loss() {
    let Some(client) = common::ngtcp2("gtlsclient", "gtlsclient_handshakes_through_30_percent_loss") else { return };
    let base = base_seed();
    let timeouts = match std::env::var_os("UDPX_HANDSHAKELOSS_CLIENT_DEFAULTS") {
        None => CLIENT_TIMEOUTS.join(" "),
        Some(_) => "the client's defaults".to_string(),
    };
    println!("handshakeloss: seed {base:#018x} (replay: UDPX_LOSS_SEED={base:#018x}), timeouts: {timeouts}");
    let site = Site::new("handshakeloss");
    let want = site.file(FILE);
    let server = start(&site, IoMode::GsoMmsg, 1);
    let began = Instant::now();
    let only = only_attempt();
    let attempts = if only.is_some() { 1 } else { ATTEMPTS };
    let mut failed = Vec::new();
    let (mut passed, mut dropped_up, mut dropped_down) = (0, 0, 0);
    for i in (1..=ATTEMPTS).filter(|i| only.is_none_or(|o| o == *i)) {
        let left = BUDGET.saturating_sub(began.elapsed());
        if left.is_zero() {
            failed.push(format!("attempt {i}: not run, the {BUDGET:?} were spent"));
            continue;
        }
        let seed = attempt_seed(base, i);
        let dir = TempDir::new("handshakeloss");
        let t = Instant::now();
        let (outcome, tally) =
            attempt(&client, server.local_addr(), seed, dir.path(), ATTEMPT_DEADLINE.min(left), &want);
        let (up, down) = (tally.up.lost + tally.up.tail_dropped, tally.down.lost + tally.down.tail_dropped);
        dropped_up += up;
        dropped_down += down;
        let verdict = if outcome == Outcome::Pass { "pass".to_string() } else { format!("FAIL {outcome:?}") };
        println!(
            "attempt {i:2} seed {seed:#018x}: {verdict} in {:.2} s; dropped up {up}/{} ({} by the queue), down {down}/{} ({} by the queue)",
            t.elapsed().as_secs_f64(),
            tally.up.offered,
            tally.up.tail_dropped,
            tally.down.offered,
            tally.down.tail_dropped,
        );
        if outcome == Outcome::Pass {
            passed += 1;
            // Traced: a slow pass is kept too (its trace shows what the losses cost).
            if trace::on() && t.elapsed() > SLOW {
                println!("  slow: kept in {}", keep(dir.path(), i).display());
            }
        } else {
            let kept = keep(dir.path(), i);
            let log = std::fs::read_to_string(kept.join("gtlsclient.log")).unwrap_or_default();
            println!("  kept in {}; the client said:\n{}", kept.display(), log.trim_end());
            failed.push(format!("attempt {i} (seed {seed:#018x}): {outcome:?}, kept in {}", kept.display()));
        }
    }
    let c = server.stop().expect("server stops");
    println!(
        "handshakeloss: {passed}/{attempts} in {:.1} s, seed {base:#018x}; relay dropped {dropped_up} up, {dropped_down} \
         down; server: {} connections, {} ok, {} handshake timeouts, {} refused (cap/half-open/per-ip {}/{}/{}), {} \
         retries sent, {} dropped by quiche, {} lost packets",
        began.elapsed().as_secs_f64(),
        c.quic.connections,
        c.http.ok,
        c.quic.handshake_timeouts,
        c.quic.refused_connections + c.quic.refused_half_open + c.quic.refused_per_ip,
        c.quic.refused_connections,
        c.quic.refused_half_open,
        c.quic.refused_per_ip,
        c.quic.retries_sent,
        c.quic.dropped_by_quic,
        c.quic.lost_packets,
    );
    assert!(dropped_up > 0 && dropped_down > 0, "the path dropped datagrams both ways");
    assert_eq!(passed, attempts, "every download through the lossy path (seed {base:#018x}):\n{}", failed.join("\n"));
    assert_eq!(c.quic.handshake_timeouts, 0, "the server gave up no handshake");
    assert_eq!(
        c.quic.refused_connections + c.quic.refused_half_open + c.quic.refused_per_ip,
        0,
        "the server refused no connection"
    );
}

#[test]
fn link_serialises_delays_and_tail_drops() {
    let spec = PathSpec { delay: Duration::from_millis(15), rate_bps: 8_000_000, queue_bytes: 3000, loss_pct: 0 };
    let mut l = Link::new(1);
    let t0 = Instant::now();
    // 1000 bytes on the wire (payload and 28 of headers) take 1 ms at 8 Mbit/s: three fit
    // in the 3000-byte queue, the fourth is tail-dropped.
    for _ in 0..4 {
        l.offer(&spec, t0, &[0u8; 972]);
    }
    assert_eq!((l.tally.offered, l.tally.tail_dropped, l.tally.lost), (4, 1, 0));
    let mut arrivals = Vec::new();
    while let Some(at) = l.next_due() {
        arrivals.push(at - t0);
        assert!(l.due(at - Duration::from_nanos(1)).is_none(), "not before its time");
        assert!(l.due(at).is_some());
    }
    assert_eq!(arrivals, [16, 17, 18].map(Duration::from_millis), "serialised one after another, then delayed");
    // Once the link has drained, a datagram goes at once.
    let later = t0 + Duration::from_millis(10);
    l.offer(&spec, later, &[0u8; 972]);
    assert_eq!(l.next_due(), Some(later + Duration::from_millis(16)));
}

#[test]
fn coin_loses_its_share_and_replays() {
    let draws = |seed| {
        let mut c = Coin(seed);
        (0..10_000).map(|_| c.lose(30)).collect::<Vec<bool>>()
    };
    let lost = draws(7).iter().filter(|&&l| l).count();
    assert!((2700..3300).contains(&lost), "{lost} of 10000 lost at 30 %");
    assert_eq!(draws(7), draws(7), "a seed replays");
    assert_ne!(draws(7), draws(8));
}
