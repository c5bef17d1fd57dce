//! The streaming server and its receivers over real sockets: every datagram exactly once on
//! veth (1,000 flows) and loopback, bursts bounded after a stall, refusals reach the client,
//! and bad numbers are refused with what to change. Timings are reported, never asserted.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use udpx_stream::{lab, receive, PacingChoice, Progress, RecvConfig, ServeConfig, Server, StreamError};

/// The veth tests (1,000 flows, Figure 4) load both CPUs: one at a time, or one starves the
/// other's receiver and its loss is the neighbour's doing.
static VETH: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn loopback_server(cfg: impl FnOnce(&mut ServeConfig)) -> Server {
    let mut c = ServeConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    // The tests' clients share 127.0.0.1: caps raised past what any test here asks.
    c.limits = udpx_stream::Limits::raised_for(2_000, 1_000_000_000);
    cfg(&mut c);
    Server::start(c).expect("server starts")
}

/// The check: 1,000 flows on veth, every datagram arrives exactly once, and the
/// server's steady state allocates nothing.
#[test]
#[ignore = "exact delivery over veth: needs both CPUs to itself (scripts/test.sh runs it alone)"]
fn a_thousand_flows_on_veth_arrive_exactly_once() {
    if udpx_lab::netns::skip_unless_capable("a_thousand_flows_on_veth_arrive_exactly_once") {
        return;
    }
    let _alone = VETH.lock().unwrap_or_else(|e| e.into_inner());
    // 24 kB/s in two 1200-byte datagrams per release: a release every 100 ms per flow,
    // 10,000 releases a second in all.
    let recv = RecvConfig::new(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), 1000, 24_000, Duration::from_secs(3));
    let st = lab::self_test(ServeConfig::new(recv.server), recv, Arc::new(Progress::default())).expect("self-test");
    let s = &st.receiver.summary;
    // Exactly once, unless the kernel reports drops that cover the loss: the receiving
    // sockets' buffers, and the veth pair's own (a full NAPI ring: the sender's software GSO
    // learns only the last segment's fate). The pair also counts drops that are not the run's
    // datagrams (6-7 in runs that lost none), so its count only excuses a loss, never hides one.
    let socket_drops = st.receiver.socket_drops;
    let drops = socket_drops.unwrap_or(0) + st.link_drops.unwrap_or(0);
    println!(
        "{:?} server {:?} receiving sockets dropped {socket_drops:?}, the veth pair {:?}",
        s, st.server.total, st.link_drops
    );
    assert_eq!(st.path, lab::Path::Veth);
    assert_eq!(st.receiver.accepted, 1000);
    let sent = st.server.total.datagrams;
    if drops > 0 && !st.exactly_once() {
        udpx_lab::netns::record_skip(
            "a_thousand_flows_on_veth_arrive_exactly_once (exactly once)",
            &format!(
                "the kernel dropped {drops} datagrams (sockets {socket_drops:?}, veth {:?}); judged: loss at most those",
                st.link_drops
            ),
        );
        assert_eq!((s.duplicates, st.server.total.unsent), (0, 0), "{s:?}");
        assert!(s.datagrams <= sent, "received {} of {sent}", s.datagrams);
        assert!(sent - s.datagrams <= drops, "{} of {sent} missing, {drops} dropped by the kernel", sent - s.datagrams);
        assert!(s.lost <= drops, "lost {} of {sent}, {drops} dropped by the kernel", s.lost);
    } else {
        assert!(
            st.exactly_once(),
            "sent {sent} received {} lost {} dup {} (socket drops {socket_drops:?}, veth drops {:?})",
            s.datagrams,
            s.lost,
            s.duplicates,
            st.link_drops
        );
    }
    // 1000 flows x 3 s x 20 datagrams/s, give or take the release in flight at the end, is
    // the most the pacer may send. How near it comes is timing: a server whose CPU was taken
    // for a while releases its backlog at 125 % of the rate and is still behind when the 3 s
    // end (52,831 under `scripts/neighbour.py --share 0.3`, 28,914 at 0.5); every flow released
    // at least once.
    assert!(sent <= 65_000, "paced at most at the flows' rate: {sent}");
    assert!(sent >= 2 * 1000, "every flow released: {sent}");
    if sent < 55_000 {
        println!("behind the flows' rate: {sent} of about 60,000 sent (a stall; not judged)");
    }
    assert_eq!(st.server.total.steady_allocations, Some(0), "iterations {}", st.server.total.steady_iterations);
    assert!(st.server.total.steady_iterations > 100);
    assert!(st.server.total.pacing.starts_with("wheel"), "no fq here: {}", st.server.total.pacing);
}

#[test]
fn a_release_below_one_datagram_is_refused_by_the_server() {
    let server = loopback_server(|_| {});
    let mut recv = RecvConfig::new(server.local_addr(), 50, 48_000, Duration::from_secs(2));
    recv.interval = Some(Duration::from_millis(5)); // 48 kB/s x 5 ms = 240 B: below a datagram
    let r = receive(&recv, &Progress::default()).expect("receive returns");
    server.stop().expect("stop");
    assert_eq!(r.refused.0, 50);
    let why = r.refused.1.unwrap_or_default();
    assert!(why.contains("batch") || why.contains("datagrams per release"), "{why}");
}

#[test]
fn loopback_two_shards_exact_counts() {
    let server = loopback_server(|c| c.shards = 2);
    let mut recv = RecvConfig::new(server.local_addr(), 64, 48_000, Duration::from_secs(2));
    recv.interval = Some(Duration::from_millis(50)); // 2 datagrams per release
    recv.local = vec!["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()];
    let r = receive(&recv, &Progress::default()).expect("receive");
    let rep = server.stop().expect("stop");
    let s = &r.summary;
    assert_eq!(r.accepted, 64);
    assert_eq!(s.flows_ended, 64, "every flow got its End");
    assert_eq!((s.lost, s.duplicates, s.malformed), (0, 0, 0));
    assert_eq!(s.datagrams, rep.total.datagrams, "what the server sent arrived");
    assert_eq!(rep.shards.len(), 2);
    assert_eq!(rep.total.flows, 64);
    // Each flow at 48 kB/s for 2 s: 80 datagrams, +1 release at the ends at most: the pacer
    // never sends a flow faster than its rate. Fewer is the machine's timing, not a fault (a
    // suite run on a VM whose neighbour stole a quarter of a CPU saw 75), and timings are not
    // judged here.
    for f in r.tally.flows() {
        assert!((1..=84).contains(&f.received), "{}", f.received);
    }
}

/// After a stall every flow owes many releases; it sends at most its burst at once.
#[test]
fn after_a_stall_no_flow_sends_more_than_its_burst() {
    let server = loopback_server(|c| c.stall = Some((Duration::from_millis(700), Duration::from_millis(30))));
    // A release every 1 ms of one datagram; a 30 ms stall owes 30; the burst is 4.
    let mut recv = RecvConfig::new(server.local_addr(), 20, 1_200_000, Duration::from_millis(1500));
    recv.segments = 1;
    recv.burst = 4;
    let r = receive(&recv, &Progress::default()).expect("receive");
    server.stop().expect("stop");
    let s = &r.summary;
    println!(
        "max back to back {} burstiness {}, lost {}, receiving sockets dropped {:?}",
        s.max_back_to_back, s.burstiness, s.lost, r.socket_drops
    );
    match r.socket_drops {
        Some(d) if d > 0 => {
            udpx_lab::netns::record_skip(
                "after_a_stall_no_flow_sends_more_than_its_burst (no loss)",
                &format!("the receiving sockets themselves dropped {d} datagrams; judged: loss at most those"),
            );
            assert!(s.lost <= d, "lost {}, {d} dropped at the receivers", s.lost);
        }
        _ => assert_eq!(s.lost, 0, "receiving sockets dropped {:?}", r.socket_drops),
    }
    assert!(s.max_back_to_back <= 5, "burst 4 (+1 for a release that follows within 100 us): {}", s.max_back_to_back);
    assert!(s.max_back_to_back >= 3, "the stall made flows catch up with their burst: {}", s.max_back_to_back);
}

#[test]
fn refusals_reach_the_client_with_the_reason() {
    let server = loopback_server(|c| c.max_rate = 10_000);
    let recv = RecvConfig::new(server.local_addr(), 5, 20_000, Duration::from_secs(5));
    let r = receive(&recv, &Progress::default()).expect("receive returns");
    let rep = server.stop().expect("stop");
    assert_eq!(r.refused.0, 5);
    assert!(r.refused.1.as_deref().unwrap_or("").contains("--max-rate"), "{:?}", r.refused.1);
    assert!(r.elapsed_s < 4.0, "no waiting out the duration when everything is refused");
    assert_eq!(rep.total.refused, 5);
    assert_eq!(rep.total.datagrams, 0);
}

#[test]
fn garbage_to_the_server_is_counted_and_serving_goes_on() {
    let server = loopback_server(|_| {});
    let junk = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for b in [&b""[..], b"x", &[0u8; 48], &[0x55, 0x44, 0x58, 0x53, 1, 1, 0, 0, 0, 0, 0, 0]] {
        junk.send_to(b, server.local_addr()).unwrap();
    }
    let recv = RecvConfig::new(server.local_addr(), 3, 24_000, Duration::from_millis(500));
    let r = receive(&recv, &Progress::default()).expect("receive");
    let rep = server.stop().expect("stop");
    assert_eq!(r.accepted, 3);
    assert_eq!(rep.total.malformed, 4, "{:?}", rep.total);
}

#[test]
fn bad_numbers_are_refused_with_what_to_change() {
    let srv: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let d = Duration::from_secs(1);
    let cases: Vec<(RecvConfig, &str)> = vec![
        (RecvConfig::new(srv, 10, 0, d), "--rate 0"),
        (RecvConfig::new(srv, 0, 4000, d), "--flows 0"),
        (RecvConfig::new(srv, 10, 60_000_000_000, d), "no machine"),
        (RecvConfig::new(srv, 100_000, 1_000_000, d), "no machine"),
        (RecvConfig { interval: Some(Duration::from_micros(100)), ..RecvConfig::new(srv, 10, 4000, d) }, "250 us"),
        (RecvConfig { size: 10, ..RecvConfig::new(srv, 10, 4000, d) }, "--size 10"),
        (RecvConfig::new(srv, 60_000, 4000, d), "local addresses"),
        (RecvConfig::new(srv, 10, 4000, Duration::ZERO), "--duration"),
    ];
    for (c, needle) in cases {
        match c.validate() {
            Err(StreamError::Usage(m)) => assert!(m.contains(needle), "{m:?} should mention {needle:?}"),
            other => panic!("{needle}: {other:?}"),
        }
    }
    let mut s = ServeConfig::new(srv);
    s.shards = 0;
    assert!(matches!(Server::start(s), Err(StreamError::Usage(m)) if m.contains("--shards 0")));
    let mut s = ServeConfig::new(srv);
    s.pacing = PacingChoice::Wheel;
    s.max_rate = 0;
    assert!(matches!(Server::start(s), Err(StreamError::Usage(m)) if m.contains("--max-rate 0")));
}

#[test]
fn the_fd_limit_is_raised_or_named() {
    // Raising to what we already have always works; an absurd need names the limit.
    udpx_stream::client::raise_fd_limit(16).expect("16 files");
    match udpx_stream::client::raise_fd_limit(u64::MAX / 2) {
        Err(StreamError::Usage(m)) => assert!(m.contains("ulimit -n"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// Kernel pacing asked for on a path whose qdisc ignores it: every release goes a look-ahead
/// early with its departure time (SCM_TXTIME), the report says it is not enforced, and the
/// departure-error checks are not judged. Datagrams arriving before their departure time
/// show the kernel did not hold them; how many do is the scheduler's business (a loaded
/// machine hands some over late), so any count above zero passes.
#[test]
fn kernel_pacing_hands_releases_over_early_and_says_it_is_not_enforced() {
    let server = loopback_server(|c| c.pacing = PacingChoice::Kernel);
    let recv = RecvConfig::new(server.local_addr(), 10, 24_000, Duration::from_secs(1));
    let r = receive(&recv, &Progress::default()).expect("receive");
    let rep = server.stop().expect("stop");
    assert!(rep.total.pacing.contains("NOT enforced"), "{}", rep.total.pacing);
    let s = &r.summary;
    assert_eq!(s.lost, 0);
    assert!(s.early > 0, "early {} of {}: none came before its departure time", s.early, s.datagrams);
    assert!(s.early_by_ns.max <= 2_500_000.0, "within the 2 ms look-ahead: {:?}", s.early_by_ns);
    let checks = udpx_stream::report::checks(s, Some(&rep), Duration::from_micros(250));
    assert_eq!(checks[0].met, None, "{:?}", checks[0]);
}

/// Figure 4's bench, small: every row runs, loss is exact (every End arrived), the unpaced
/// row's releases are bursts and the 1 ms row's are single datagrams. No timing is judged.
#[test]
fn figure4_runs_every_row_with_exact_loss() {
    if udpx_lab::netns::skip_unless_capable("figure4_runs_every_row_with_exact_loss") {
        return;
    }
    let _alone = VETH.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = udpx_stream::fig4::Fig4Config {
        flows: 8,
        duration: Duration::from_millis(2500),
        rounds: 1,
        ..Default::default()
    };
    let f = udpx_stream::fig4::run(&cfg, &mut |l| println!("{l}")).expect("bench runs");
    assert!(f.failures.is_empty(), "{:?}", f.failures);
    assert_eq!(f.rows.len(), 5);
    // The median run, or (every run stolen by the hypervisor: no median, by the steal rule)
    // the first run, the skip recorded. Each run carries its steal, never negative.
    let measured = |r: &udpx_stream::fig4::Row| {
        r.median.unwrap_or_else(|| {
            let why = r.kept.no_figure().unwrap_or_else(|| panic!("{} has no run", r.label));
            udpx_lab::netns::record_skip(&format!("figure4_runs_every_row_with_exact_loss ({})", r.label), &why);
            r.runs.iter().flatten().next().copied().expect("a measured run")
        })
    };
    for r in &f.rows {
        let m = measured(r);
        assert!(m.sent > 0 && m.lost <= m.sent, "{}: {m:?}", r.label);
        assert_eq!(m.unsent, 0, "{}: nothing refused by the kernel", r.label);
        assert!((1..=2).contains(&r.runs.len()), "one round, one extra at most: {}", r.label);
        for run in r.runs.iter().flatten() {
            assert!(run.steal.steal_s >= 0.0 && run.steal.steal_share >= 0.0, "{}: {:?}", r.label, run.steal);
        }
    }
    let json = serde_json::to_value(&f.rows[0]).unwrap();
    assert!(json["runs"][0]["steal_share"].is_number() && json["kept"]["planned"] == 1, "{json}");
    let one_ms = measured(&f.rows[0]);
    let unpaced = measured(&f.rows[4]);
    assert!(one_ms.burstiness < 0.5, "one datagram per ms per flow: {}", one_ms.burstiness);
    assert!(unpaced.burstiness > 0.9, "54 per release: {}", unpaced.burstiness);
    assert!(udpx_stream::fig4::text(&f).contains("| paced, 2 ms |"));
}

/// A client that goes away (its port closed: a real ICMP port unreachable, which quotes the
/// data datagram and so its secret) has its flow ended, not streamed into for the rest of its
/// minute.
#[test]
fn a_client_that_goes_away_has_its_flow_ended() {
    let server = loopback_server(|_| {});
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let r = udpx_stream::wire::Request {
        flow: 0,
        size: 1200,
        rate: 240_000, // 2 datagrams every 10 ms
        interval_ns: 0,
        segments: 2,
        burst: 0,
        duration_ms: 60_000,
        cookie: None,
    };
    let mut buf = [0u8; 2048];
    let mut req = [0u8; udpx_stream::wire::REQUEST_LEN];
    let mut cookie = None;
    let mut data = 0;
    while data < 5 {
        let n = udpx_stream::wire::write_request(&mut req, &udpx_stream::wire::Request { cookie, ..r });
        client.send_to(&req[..n], server.local_addr()).unwrap();
        loop {
            let (len, _) = client.recv_from(&mut buf).expect("an answer");
            match udpx_stream::wire::parse(&buf[..len]) {
                Some(udpx_stream::wire::Message::Cookie { cookie: c, .. }) => {
                    cookie = Some(c);
                    break;
                }
                Some(udpx_stream::wire::Message::Data(_)) => data += 1,
                _ => {}
            }
            if data >= 5 {
                break;
            }
        }
    }
    assert_eq!(server.live_flows(), 1);
    drop(client);
    let start = std::time::Instant::now();
    while server.live_flows() > 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let rep = server.stop().expect("stop");
    assert_eq!(rep.total.clients_gone, 1, "{:?}", rep.total);
    assert!(start.elapsed() < Duration::from_secs(5), "ended long before its 60 s");
}
