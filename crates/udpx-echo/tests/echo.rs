//! The echo server in every mode over loopback, driven by the load generator from many source
//! ports: every request gets exactly its own reply; malformed requests get none; replies leave
//! from the address asked; steering puts requests on the shard it should; sockperf's server
//! answers the same generator.

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use udpx_echo::load::{self, LoadConfig};
use udpx_echo::proto::{self, Request};
use udpx_echo::server::{self, Mode, ServeConfig, ShardStats};

/// A loopback server's settings: no rate limit, no pinning, the default receive buffer.
fn config(mode: Mode, threads: usize, batch: bool) -> ServeConfig {
    ServeConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        mode,
        threads,
        batch,
        io_uring: false,
        rate_limit: None,
        cpus: None,
        recv_buffer: None,
    }
}

fn serve(mode: Mode, threads: usize, batch: bool, bind: &str) -> server::Server {
    let cfg = ServeConfig { bind: bind.parse().unwrap(), ..config(mode, threads, batch) };
    server::start(server::bind(&cfg).unwrap())
}

/// Half a second of closed-loop load. A request counts as lost only after 5 s without its
/// reply: on a busy machine a reply can be late by far more than a loopback round trip, and a
/// late reply is not a lost one. (Replies that do come are at once: the generator waits that
/// long only for what is missing.)
fn load_cfg(dst: SocketAddr, flows: usize) -> LoadConfig {
    LoadConfig {
        dst,
        bind: "127.0.0.1:0".parse().unwrap(),
        flows,
        size: 100,
        outstanding: 4,
        rate: None,
        duration: Duration::from_millis(500),
        timeout: REPLY_TIMEOUT,
    }
}

/// How long a test waits for a reply before calling it missing.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Datagrams this network namespace received for a port nobody listens on (`Udp: NoPorts`).
fn udp_no_ports() -> u64 {
    udpx_lab::udp_counter("NoPorts").unwrap_or(0)
}

/// Waits (10 s at most) until a UDP socket is bound to local port `port` (/proc/net/udp), read
/// rather than probed with a bind of the test's own, which could make the server's bind fail.
fn wait_bound(port: u16) {
    let listed = || {
        std::fs::read_to_string("/proc/net/udp").unwrap_or_default().lines().skip(1).any(|l| {
            let local = l.split_whitespace().nth(1).and_then(|a| a.rsplit(':').next());
            local.and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
        })
    };
    let start = Instant::now();
    while !listed() {
        assert!(start.elapsed() < Duration::from_secs(10), "nothing bound UDP port {port} within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn request(seq: u64, size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    proto::write(&mut b, Request { seq, sent_ns: 0, flow: 0 });
    b
}

#[test]
fn every_mode_answers_every_request_exactly_once() {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    for mode in [Mode::Naive, Mode::Reuseport, Mode::ReuseportCpu, Mode::ReuseportCid { cid_byte: 7 }] {
        for batch in [false, true] {
            let threads = if mode == Mode::Naive { cpus } else { 4 };
            let srv = serve(mode, threads, batch, "127.0.0.1:0");
            let cfg = load_cfg(srv.addr, 32);
            let res = load::run(&cfg, load::bind_flows(&cfg).unwrap()).unwrap();
            let stats = srv.stop();
            let what = format!("{} batch={batch}", mode.name());
            assert!(res.sent > 100, "{what}: {res:?}");
            assert_eq!(res.lost, 0, "{what}: {res:?}");
            assert_eq!(res.unexpected, 0, "{what}: a reply matched no request of its flow");
            assert_eq!(res.received, res.sent, "{what}");
            let served: u64 = stats.iter().map(|s| s.requests).sum();
            let replied: u64 = stats.iter().map(|s| s.replies).sum();
            assert_eq!((served, replied), (res.sent, res.sent), "{what}: {stats:?}");
            let expect_shards = match mode {
                Mode::Naive => cpus,
                Mode::ReuseportCpu => udpx_lab::cpu::online_cpus().iter().max().unwrap() + 1,
                _ => 4,
            };
            assert_eq!(stats.len(), expect_shards, "{what}");
            if mode == Mode::Reuseport {
                assert!(
                    stats.iter().filter(|s| s.requests > 0).count() >= 2,
                    "{what}: 32 flows on one shard: {stats:?}"
                );
            }
            assert!(res.p99_us > 0.0 && res.p50_us <= res.p99_us, "{what}: {res:?}");
        }
    }
}

/// The generator starts before the server: its first sends meet ICMP port unreachable
/// (ECONNREFUSED). They are counted, and every flow's window is full again once the server
/// answers, instead of settling near one request outstanding.
///
/// The requests sent before the server was up are never answered: their slots come back
/// when they time out (1 s), well before sending ends (3 s), and a request answered by the
/// running server would have to be a second late to be taken for lost.
#[test]
fn closed_loop_refills_the_window_after_failed_sends() {
    let port = StdUdp::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dst = SocketAddr::from(([127, 0, 0, 1], port));
    let cfg = LoadConfig { duration: Duration::from_secs(3), timeout: Duration::from_secs(1), ..load_cfg(dst, 8) };
    let socks = load::bind_flows(&cfg).unwrap();
    let no_ports = udp_no_ports();
    let gen = std::thread::spawn({
        let cfg = cfg.clone();
        move || load::run(&cfg, socks)
    });
    // The server starts once the generator's first requests met the closed port (counted
    // as NoPorts: each draws the ICMP error that fails its flow's next send).
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    while udp_no_ports() < no_ports + 8 {
        assert!(start.elapsed() < Duration::from_secs(10), "the generator sent nothing within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let srv = serve(Mode::Reuseport, 1, true, &dst.to_string());
    let res = gen.join().unwrap().unwrap();
    let stats = srv.stop();
    assert!(res.send_failures > 0 && res.refused > 0, "the early sends failed and were counted: {res:?}");
    assert_eq!(res.in_flight_at_end, 8 * 4, "every window full when sending ended: {res:?}");
    assert!(res.received > 0, "{res:?}");
    assert_eq!(res.sent, res.received + res.lost, "every request sent is answered or lost: {res:?}");
    let served: u64 = stats.iter().map(|s| s.requests).sum();
    assert!(served >= res.received, "{stats:?}");
}

/// Open loop at a rate no generator reaches: latency counts from each request's scheduled
/// time, so the generator's own backlog shows (from the actual send, it would be a loopback
/// round trip), and requests due but never sent are counted, not silently skipped.
#[test]
fn open_loop_latency_counts_from_the_schedule() {
    let srv = serve(Mode::Reuseport, 1, true, "127.0.0.1:0");
    let rate = 2_000_000;
    let cfg = LoadConfig { rate: Some(rate), duration: Duration::from_millis(300), ..load_cfg(srv.addr, 4) };
    let res = load::run(&cfg, load::bind_flows(&cfg).unwrap()).unwrap();
    srv.stop();
    assert_eq!(res.sent + res.unsent, rate * 3 / 10, "every scheduled request is sent or counted: {res:?}");
    assert!(res.unsent > 0, "{res:?}");
    assert!(res.max_us > 50_000.0, "a backlog of more than 50 ms hidden from the latency: {res:?}");
}

/// Send failures in the open loop (injected ECONNREFUSED on every flow's socket) leave the
/// scheduled request due: it is sent on a later pass, and the failures are counted.
#[cfg(feature = "fault-injection")]
#[test]
fn open_loop_retries_a_failed_send() {
    let srv = serve(Mode::Reuseport, 1, true, "127.0.0.1:0");
    let cfg = LoadConfig { rate: Some(1000), duration: Duration::from_millis(500), ..load_cfg(srv.addr, 4) };
    let socks = load::bind_flows(&cfg).unwrap();
    for s in &socks {
        for _ in 0..3 {
            s.inject_fault(udpx::Fault::Errno(nix::errno::Errno::ECONNREFUSED as i32));
        }
    }
    let res = load::run(&cfg, socks).unwrap();
    srv.stop();
    assert_eq!(res.send_failures, 12, "{res:?}");
    assert_eq!(res.sent + res.unsent, 500, "{res:?}");
    assert_eq!((res.received, res.lost), (res.sent, 0), "{res:?}");
}

/// Malformed requests, then a good one, to a one-shard server: it handles them in order, so
/// a reply to any malformed one would arrive before the good one's. The first reply is the
/// good one's, and nothing else came.
#[test]
fn malformed_requests_get_no_reply() {
    let srv = serve(Mode::Reuseport, 1, true, "127.0.0.1:0");
    let c = StdUdp::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    let mut no_pong = request(1, 100);
    no_pong[9] = 0x01;
    let mut wrong_len = request(2, 100);
    wrong_len[13] = 99;
    let bad: Vec<Vec<u8>> =
        vec![vec![], vec![1, 2, 3], request(3, 100)[..50].to_vec(), no_pong, wrong_len, vec![0xff; 100]];
    for b in &bad {
        c.send_to(b, srv.addr).unwrap();
    }
    // A good one still is answered, and the reply is exactly as long as the request.
    c.send_to(&request(9, 60), srv.addr).unwrap();
    let mut buf = [0u8; 256];
    let (n, _) = c.recv_from(&mut buf).expect("the good request's reply");
    assert_eq!(n, 60, "a malformed request was answered: {:?}", &buf[..n]);
    assert_eq!(proto::parse_reply(&buf[..n]).map(|r| r.seq), Some(9), "a malformed request was answered");
    assert_eq!(&buf[8..10], &[0, 2], "client flag cleared");
    let stats = srv.stop();
    c.set_nonblocking(true).unwrap();
    assert!(c.recv_from(&mut buf).is_err(), "a reply after the good one's: {:?}", &buf[..]);
    assert_eq!(stats[0].malformed, bad.len() as u64);
    assert_eq!((stats[0].requests, stats[0].replies), (1, 1));
}

#[test]
fn replies_leave_from_the_address_asked() {
    // Bound to the wildcard, asked at 127.0.0.2: a connected client only accepts replies from
    // 127.0.0.2, so every reply arriving proves the source was chosen by pktinfo.
    let srv = serve(Mode::Reuseport, 2, true, "0.0.0.0:0");
    let dst: SocketAddr = SocketAddr::new("127.0.0.2".parse().unwrap(), srv.addr.port());
    let cfg = load_cfg(dst, 8);
    let res = load::run(&cfg, load::bind_flows(&cfg).unwrap()).unwrap();
    srv.stop();
    assert!(res.sent > 0 && res.received == res.sent && res.lost == 0, "{res:?}");
}

#[test]
fn cid_steering_picks_the_shard_named_by_the_cid_byte() {
    // A short header (first bit 0): DCID byte 0 is payload byte 1.
    let srv = serve(Mode::ReuseportCid { cid_byte: 0 }, 4, false, "127.0.0.1:0");
    let c = StdUdp::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    let mut buf = [0u8; 256];
    for k in 0u64..8 {
        // Byte 1 of the message is byte 1 of the big-endian sequence number.
        c.send_to(&request(k << 48, 64), srv.addr).unwrap();
        c.recv_from(&mut buf).unwrap();
        let per: Vec<u64> = srv.stats().iter().map(|s| s.requests).collect();
        assert_eq!(per.iter().sum::<u64>(), k + 1);
        assert_eq!(per[(k % 4) as usize], k / 4 + 1, "CID byte {k}: {per:?}");
    }
    srv.stop();
}

#[test]
fn cpu_steering_puts_requests_on_the_receiving_cpus_shard() {
    let srv = serve(Mode::ReuseportCpu, 0, true, "127.0.0.1:0");
    let cpus = udpx_lab::cpu::online_cpus();
    for &k in &cpus {
        let before: Vec<u64> = srv.stats().iter().map(|s| s.requests).collect();
        let addr = srv.addr;
        std::thread::spawn(move || {
            udpx_lab::cpu::pin_current_thread(k).unwrap();
            let c = StdUdp::bind("127.0.0.1:0").unwrap();
            c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
            let mut buf = [0u8; 256];
            for i in 0..20 {
                c.send_to(&request(i, 64), addr).unwrap();
                c.recv_from(&mut buf).unwrap();
            }
        })
        .join()
        .unwrap();
        let after: Vec<u64> = srv.stats().iter().map(|s| s.requests).collect();
        assert_eq!(after[k] - before[k], 20, "sender on CPU {k}: {before:?} -> {after:?}");
    }
    srv.stop();
}

/// A send that fails with someone else's pending ICMP error (here injected: ECONNREFUSED on
/// the next send syscall) costs a retry, not the reply: the library sends it again itself (the
/// socket's `icmp_retries`), so the server never sees the error.
#[cfg(feature = "fault-injection")]
#[test]
fn a_failed_send_is_retried_and_the_reply_arrives() {
    for batch in [false, true] {
        let cfg = config(Mode::Reuseport, 1, batch);
        let bound = server::bind(&cfg).unwrap();
        bound.inject_fault(0, udpx::Fault::Errno(nix::errno::Errno::ECONNREFUSED as i32));
        let srv = server::start(bound);
        let c = StdUdp::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        c.send_to(&request(1, 64), srv.addr).unwrap();
        let mut buf = [0u8; 256];
        let got = c.recv_from(&mut buf);
        let s = srv.stop();
        assert_eq!(got.map(|(n, _)| n).ok(), Some(64), "batch={batch}: no reply: {s:?}");
        assert_eq!((s[0].replies, s[0].send_retries, s[0].dropped_send_error), (1, 0, 0), "batch={batch}");
    }
}

/// Stops `srv` once its shards have accounted for `sent` requests (admitted or rate-limited),
/// waiting 10 s at most; the final counters, and the time from `start` (taken before the
/// first request was sent) until they were all accounted for: every admission was decided
/// within it.
fn stop_when_accounted(srv: server::Server, sent: u64, start: Instant) -> (Vec<ShardStats>, Duration) {
    let accounted = |s: &[ShardStats]| s.iter().map(|x| x.requests + x.rate_limited).sum::<u64>();
    while accounted(&srv.stats()) < sent && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let span = start.elapsed();
    (srv.stop(), span)
}

/// Judges a limit of 10/s per source against `sent` requests from one address: each request
/// admitted or limited (unless the server's sockets dropped some: then that count is not
/// judged, and `SKIP` says so); a full bucket of 10 admitted at once, and at most 10 more a
/// second over `span`, the time requests were decided in.
fn judge_limit_of_10(what: &str, s: &[ShardStats], sent: u64, span: Duration) {
    let admitted: u64 = s.iter().map(|x| x.requests).sum();
    let limited: u64 = s.iter().map(|x| x.rate_limited).sum();
    let drops: u64 = s.iter().map(|x| x.kernel_drops).sum();
    if drops == 0 {
        assert_eq!(admitted + limited, sent, "{what}: {s:?}");
        assert!(admitted >= 10, "{what}: a full bucket admits 10 at once: {s:?}");
    } else {
        udpx_lab::netns::record_skip(
            &format!("{what} (every request admitted or limited)"),
            &format!("the server's sockets dropped {drops} requests"),
        );
        assert_eq!(admitted + limited + drops, sent, "{what}: {s:?}");
    }
    let most = 10 + (10.0 * span.as_secs_f64()).ceil() as u64;
    assert!(admitted <= most, "{what}: {admitted} admitted in {span:?}, at most {most} for 10/s: {s:?}");
}

#[test]
fn rate_limit_per_source() {
    let cfg = ServeConfig { rate_limit: Some(10), ..config(Mode::Reuseport, 1, true) };
    let srv = server::start(server::bind(&cfg).unwrap());
    let c = StdUdp::bind("127.0.0.1:0").unwrap();
    let start = Instant::now();
    for i in 0..100 {
        c.send_to(&request(i, 64), srv.addr).unwrap();
    }
    let (s, span) = stop_when_accounted(srv, 100, start);
    judge_limit_of_10("rate_limit_per_source", &s, 100, span);
}

/// One limit per source address for the whole server: a source that varies its port, and so
/// its reuseport shard, gets the limit once, not once per shard.
#[test]
fn rate_limit_holds_across_shards() {
    let cfg = ServeConfig { rate_limit: Some(10), ..config(Mode::Reuseport, 4, true) };
    let srv = server::start(server::bind(&cfg).unwrap());
    let ports: Vec<StdUdp> = (0..40).map(|_| StdUdp::bind("127.0.0.1:0").unwrap()).collect();
    let start = Instant::now();
    for (i, c) in ports.iter().enumerate() {
        for k in 0..25 {
            c.send_to(&request((i * 100 + k) as u64, 64), srv.addr).unwrap();
        }
    }
    let (s, span) = stop_when_accounted(srv, 1000, start);
    assert!(s.iter().filter(|x| x.requests + x.rate_limited > 0).count() >= 2, "one shard only: {s:?}");
    // One limit for the address, not one per shard: 10 at once, plus what refills meanwhile.
    judge_limit_of_10("rate_limit_holds_across_shards", &s, 1000, span);
}

/// Replies waiting on `s`: how many and their bytes (non-blocking: the server has stopped,
/// so every reply it sent over loopback is already queued).
fn drain_replies(s: &StdUdp) -> (u64, u64) {
    s.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let (mut n, mut bytes) = (0, 0);
    while let Ok(len) = s.recv(&mut buf) {
        n += 1;
        bytes += len as u64;
    }
    (n, bytes)
}

/// The limit counts bytes: a source sending large requests as fast as it can is answered at
/// most 1,000 x 256 bytes a second (plus a second's burst) however many it sends, while a
/// source of 100-byte requests beside it keeps every one; on both shards, the io_uring one
/// with requests of the size its receive buffers take (2 KiB). Bytes are judged over `span`,
/// the time the server took to decide every request (an upper bound, so never a flake).
#[test]
fn rate_limit_counts_bytes() {
    use nix::sys::socket::{setsockopt, sockopt};
    let limit = server::DEFAULT_RATE_LIMIT;
    for (io_uring, big_len, big_n) in [(false, 60 * 1024, 300u64), (true, 1_800, 2_000)] {
        let what = if io_uring { "rate_limit_counts_bytes +io_uring" } else { "rate_limit_counts_bytes" };
        if let (true, Err(why)) = (io_uring, udpx::caps::io_uring_available()) {
            udpx_lab::netns::record_skip(what, &why);
            continue;
        }
        let cfg = ServeConfig {
            rate_limit: Some(limit),
            io_uring,
            // Room for every request: a drop is not the limit.
            recv_buffer: Some(32 << 20),
            ..config(Mode::Reuseport, 1, true)
        };
        let srv = server::start(server::bind(&cfg).unwrap());
        // Two source addresses: two budgets.
        let big = StdUdp::bind("127.0.0.1:0").unwrap();
        let small = StdUdp::bind("127.0.0.2:0").unwrap();
        for s in [&big, &small] {
            setsockopt(s, sockopt::RcvBufForce, &(32 << 20)).unwrap();
        }
        let start = Instant::now();
        for i in 0..big_n {
            big.send_to(&request(i, big_len), srv.addr).unwrap();
            // 200 small requests spread over the large ones.
            if i * 200 / big_n != (i + 1) * 200 / big_n {
                small.send_to(&request(i, 100), srv.addr).unwrap();
            }
        }
        let (s, span) = stop_when_accounted(srv, big_n + 200, start);
        let drops: u64 = s.iter().map(|x| x.kernel_drops).sum();
        let admitted: u64 = s.iter().map(|x| x.requests).sum();
        let limited: u64 = s.iter().map(|x| x.rate_limited).sum();
        assert_eq!((admitted + limited, drops), (big_n + 200, 0), "{what}: every request decided: {s:?}");
        let (small_got, _) = drain_replies(&small);
        let (big_got, big_bytes) = drain_replies(&big);
        assert_eq!(small_got, 200, "{what}: the small source keeps every request: {s:?}");
        assert_eq!(admitted, small_got + big_got, "{what}: a reply per admitted request: {s:?}");
        let tokens = big_len.div_ceil(256) as u64;
        let most_bytes = (f64::from(limit) * 256.0 * (1.0 + span.as_secs_f64())) as u64;
        println!("{what}: {big_got} of {big_n} requests of {big_len} B answered ({big_bytes} B) in {span:?}");
        assert!(big_got >= u64::from(limit) / tokens, "{what}: a full bucket's worth at once: {big_got}");
        assert!(
            big_bytes <= most_bytes,
            "{what}: {big_bytes} B answered in {span:?}, at most {most_bytes} B at {limit} x 256 B/s"
        );
    }
}

#[test]
fn bad_configuration_is_refused() {
    let base = config(Mode::Reuseport, 0, true);
    assert!(server::check(&base, false).unwrap_err().contains("--threads 0"));
    let many = ServeConfig { threads: server::MAX_THREADS, ..base.clone() };
    assert!(server::check(&many, false).unwrap_err().contains("--allow-oversubscribe"));
    assert!(server::check(&many, true).is_ok());
    for threads in [server::MAX_THREADS + 1, usize::MAX] {
        let absurd = ServeConfig { threads, ..base.clone() };
        assert!(server::check(&absurd, true).unwrap_err().contains("give 1 to 1024"), "{threads}");
    }
    let far = ServeConfig { threads: 1, mode: Mode::ReuseportCid { cid_byte: 20 }, ..base };
    assert!(server::check(&far, false).unwrap_err().contains("--cid-byte 20"));
    let mut l = load_cfg("127.0.0.1:9".parse().unwrap(), 1);
    l.size = 10;
    assert!(load::check(&l).unwrap_err().contains("--size 10"));
    l.size = 65508;
    assert!(load::check(&l).is_err());
}

#[test]
fn sockperf_server_answers_the_same_generator() {
    if Command::new("sockperf").arg("--version").output().is_err() {
        return udpx_lab::netns::record_skip(
            "sockperf_server_answers_the_same_generator",
            "sockperf not installed (scripts/setup.sh)",
        );
    }
    let port = StdUdp::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // `timeout -s KILL` bounds sockperf even if this test process is killed outright (sockperf
    // ignores SIGTERM); the guard ends it, and `timeout` with it, when the test ends or fails.
    let _server = Group::spawn(
        Command::new("timeout")
            .args(["-s", "KILL", "30", "sockperf", "sr", "-i", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_bound(port);
    let cfg = load_cfg(SocketAddr::from(([127, 0, 0, 1], port)), 8);
    let res = load::run(&cfg, load::bind_flows(&cfg).unwrap()).unwrap();
    assert!(res.sent > 0 && res.received == res.sent && res.unexpected == 0 && res.lost == 0, "{res:?}");
}

/// A child process started in a process group of its own; dropping it (also on a failed
/// assertion) kills the whole group with SIGKILL, so nothing it started outlives the test, and
/// reaps the child.
struct Group(Child);

impl Group {
    fn spawn(cmd: &mut Command) -> Group {
        Group(cmd.process_group(0).spawn().expect("spawn"))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // The group's id is the child's pid, and it stays reserved until the child is reaped
        // below, so this cannot hit an unrelated group.
        let _ = killpg(Pid::from_raw(self.0.id() as i32), Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// Sums a counter over the shards in a Prometheus scrape.
fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn scrape(addr: SocketAddr) -> String {
    udpx_metrics::scrape(addr).unwrap()
}

/// `--metrics` under load: the counters move while the load runs, and at the end the
/// library's and the server's counters agree with each other and with the load generator.
#[test]
fn metrics_move_under_load_and_agree_with_the_generator() {
    let srv = serve(Mode::Reuseport, 2, true, "127.0.0.1:0");
    let m = srv.serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut cfg = load_cfg(srv.addr, 8);
    cfg.duration = Duration::from_millis(800);
    let res = std::thread::scope(|s| {
        let h = s.spawn(|| load::run(&cfg, load::bind_flows(&cfg).unwrap()).unwrap());
        std::thread::sleep(Duration::from_millis(200));
        let a = metric(&scrape(m.local_addr()), "echo_requests_total");
        std::thread::sleep(Duration::from_millis(300));
        let b = metric(&scrape(m.local_addr()), "echo_requests_total");
        assert!(b > a && a > 0, "requests did not move under load: {a} then {b}");
        h.join().unwrap()
    });
    let body = scrape(m.local_addr());
    let (requests, replies) = (metric(&body, "echo_requests_total"), metric(&body, "echo_replies_total"));
    assert_eq!(requests, res.sent, "every request sent reached the server (loopback): {res:?}");
    assert_eq!(replies, requests, "every request answered");
    assert_eq!(metric(&body, "udpx_datagrams_sent_total"), replies, "library and server agree on replies");
    assert_eq!(metric(&body, "udpx_datagrams_received_total"), requests);
    assert!(res.received <= replies && res.received + res.lost >= replies.min(res.sent), "{res:?}");
    drop(m);
    srv.stop();
}

/// The receive buffer is sized from the burst by default (no fixed megabytes) and `--rcvbuf`
/// is honoured; the kernel reports twice what was set.
#[test]
fn receive_buffer_default_and_override() {
    let base = config(Mode::Reuseport, 2, true);
    let b = server::bind(&base).unwrap();
    assert_eq!(b.recv_buffer(), 2 * server::default_recv_buffer(), "as root the size is set exactly");
    let b = server::bind(&ServeConfig { recv_buffer: Some(300_000), ..base }).unwrap();
    assert_eq!(b.recv_buffer(), 600_000);
}

/// The io_uring shard (multishot receive, io_uring send) answers every request exactly once,
/// in every reuseport mode; where io_uring is unavailable it is recorded as skipped.
#[test]
fn the_io_uring_shard_answers_every_request_exactly_once() {
    if let Err(why) = udpx::caps::io_uring_available() {
        udpx_lab::netns::record_skip("the_io_uring_shard_answers_every_request_exactly_once", &why);
        return;
    }
    let uring = |mode, threads| ServeConfig { io_uring: true, ..config(mode, threads, true) };
    for mode in [Mode::Reuseport, Mode::ReuseportCpu] {
        let cfg = uring(mode, 2);
        let srv = server::start(server::bind(&cfg).unwrap());
        let lc = load_cfg(srv.addr, 32);
        let res = load::run(&lc, load::bind_flows(&lc).unwrap()).unwrap();
        let stats = srv.stop();
        let what = format!("{} +io_uring", mode.name());
        assert!(res.sent > 100, "{what}: {res:?}");
        assert_eq!((res.lost, res.unexpected, res.received), (0, 0, res.sent), "{what}: {res:?}");
        let served: u64 = stats.iter().map(|s| s.requests).sum();
        let replied: u64 = stats.iter().map(|s| s.replies).sum();
        assert_eq!((served, replied), (res.sent, res.sent), "{what}: {stats:?}");
        assert!(stats.iter().all(|s| s.io_uring), "{what}: every shard on io_uring: {stats:?}");
    }
    // A malformed request gets no reply and is counted, as on the system-call shard.
    let srv = server::start(server::bind(&uring(Mode::Reuseport, 1)).unwrap());
    let c = StdUdp::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    c.send_to(b"garbage", srv.addr).unwrap();
    c.send_to(&request(1, 100), srv.addr).unwrap();
    let mut buf = [0u8; 256];
    let (n, _) = c.recv_from(&mut buf).expect("the valid request is answered");
    assert_eq!(n, 100);
    let stats = srv.stop();
    assert_eq!(stats.iter().map(|s| s.malformed).sum::<u64>(), 1);
}
