//! The streaming server on a hostile network: no flow without a cookie proving the client's
//! address, none that outlives its client's keepalives, caps per address, rate-limited answers
//! to unproven addresses, ICMP errors that end a flow only with its secret, and the attack lab
//! (namespaces: server, attacker, victim, client) where forged requests buy the victim no more
//! bytes than the attacker sent while the legitimate client is served in full. Counts are
//! asserted, never timings; every wait is bounded.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use udpx_lab::netns::forge::{self, RawSender};
use udpx_lab::netns::{Leaf, StarNet};
use udpx_stream::wire::{self, Message, Request};
use udpx_stream::{receive, Limits, Progress, RecvConfig, ServeConfig, Server};

fn loopback_server(cfg: impl FnOnce(&mut ServeConfig)) -> Server {
    let mut c = ServeConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    cfg(&mut c);
    Server::start(c).expect("server starts")
}

fn request(flow: u32, cookie: Option<wire::Cookie>) -> Request {
    Request { flow, size: 1200, rate: 120_000, interval_ns: 0, segments: 1, burst: 0, duration_ms: 60_000, cookie }
}

/// A client that speaks the wire format by hand.
struct Hand {
    sock: UdpSocket,
    server: SocketAddr,
}

impl Hand {
    fn new(server: SocketAddr) -> Hand {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        Hand { sock, server }
    }

    fn send(&self, r: &Request) {
        let mut b = [0u8; wire::REQUEST_LEN];
        let n = wire::write_request(&mut b, r);
        self.sock.send_to(&b[..n], self.server).unwrap();
    }

    /// The next datagram: its length and what it parses to (`None`: nothing within 500 ms).
    fn next(&self) -> Option<(usize, Vec<u8>)> {
        let mut b = [0u8; 2048];
        self.sock.recv_from(&mut b).ok().map(|(n, _)| (n, b[..n].to_vec()))
    }

    /// Asks for a flow and goes through the cookie; returns the flow's secret.
    fn start(&self, flow: u32) -> u64 {
        self.send(&request(flow, None));
        let cookie = loop {
            let (_, b) = self.next().expect("a cookie");
            if let Some(Message::Cookie { cookie, .. }) = wire::parse(&b) {
                break cookie;
            }
        };
        self.send(&request(flow, Some(cookie)));
        loop {
            let (_, b) = self.next().expect("an acceptance");
            if let Some(Message::Accepted { secret, .. }) = wire::parse(&b) {
                return secret;
            }
        }
    }

    fn keepalive(&self, flow: u32, secret: u64) {
        let mut b = [0u8; 32];
        let n = wire::write_keepalive(&mut b, flow, secret);
        self.sock.send_to(&b[..n], self.server).unwrap();
    }
}

#[test]
fn a_request_without_a_cookie_gets_a_cookie_no_larger_than_itself_and_no_flow() {
    let server = loopback_server(|_| {});
    let c = Hand::new(server.local_addr());
    c.send(&request(1, None));
    let (n, b) = c.next().expect("an answer");
    assert!(matches!(wire::parse(&b), Some(Message::Cookie { flow: 1, .. })), "{b:?}");
    assert!(n <= wire::REQUEST_LEN, "the answer ({n} B) is no larger than the request");
    assert!(c.next().is_none(), "nothing more: no data before the cookie comes back");
    assert_eq!(server.live_flows(), 0);
    // With the cookie: the flow starts, the acceptance carries the secret the data carries.
    let secret = c.start(2);
    let data = loop {
        let (_, b) = c.next().expect("data");
        if let Some(Message::Data(d)) = wire::parse(&b) {
            break d;
        }
    };
    assert_eq!(data.secret, secret);
    let rep = server.stop().unwrap();
    assert_eq!((rep.total.flows, rep.total.cookies_sent), (1, 2), "{:?}", rep.total);
}

#[test]
fn a_cookie_is_good_only_for_the_address_and_port_it_was_made_for() {
    let server = loopback_server(|_| {});
    let a = Hand::new(server.local_addr());
    let b = Hand::new(server.local_addr());
    a.send(&request(1, None));
    let cookie = match wire::parse(&a.next().expect("cookie").1) {
        Some(Message::Cookie { cookie, .. }) => cookie,
        other => panic!("{other:?}"),
    };
    b.send(&request(1, Some(cookie)));
    let (_, ans) = b.next().expect("an answer");
    assert!(matches!(wire::parse(&ans), Some(Message::Cookie { .. })), "another port: a fresh cookie, no flow");
    let mut forged = cookie;
    forged[3] ^= 0x40;
    a.send(&request(1, Some(forged)));
    assert!(matches!(wire::parse(&a.next().expect("answer").1), Some(Message::Cookie { .. })));
    assert_eq!(server.live_flows(), 0);
    let rep = server.stop().unwrap();
    assert_eq!((rep.total.bad_cookies, rep.total.flows), (2, 0), "{:?}", rep.total);
}

/// One cookie does not buy an hour: a flow whose client stops sending keepalives ends at the
/// consent timeout, while a flow whose client keeps them up goes on.
#[test]
fn a_flow_lives_only_while_its_client_keeps_asking() {
    let server = loopback_server(|c| c.consent_timeout = Duration::from_millis(800));
    let quiet = Hand::new(server.local_addr());
    let keen = Hand::new(server.local_addr());
    quiet.start(1);
    let secret = keen.start(2);
    assert_eq!(server.live_flows(), 2);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        keen.keepalive(2, secret);
        std::thread::sleep(Duration::from_millis(150));
    }
    // A keepalive with the wrong secret keeps nothing alive.
    keen.keepalive(2, secret ^ 1);
    assert_eq!(server.live_flows(), 1, "the quiet flow ended, the keen one streams");
    let rep = server.stop().unwrap();
    assert_eq!(rep.total.consent_lapsed, 1, "{:?}", rep.total);
    assert!(rep.total.keepalives >= 10 && rep.total.bad_keepalives >= 1, "{:?}", rep.total);
}

#[test]
fn caps_per_address_refuse_with_the_cap_named() {
    let limits = Limits { flows_per_addr: 3, ..Limits::default() };
    let server = loopback_server(|c| c.limits = limits);
    let recv = RecvConfig::new(server.local_addr(), 5, 24_000, Duration::from_millis(800));
    let r = receive(&recv, &Progress::default()).expect("receive");
    let rep = server.stop().unwrap();
    assert_eq!((r.accepted, r.refused.0), (3, 2), "{:?}", r.refused);
    assert!(r.refused.1.as_deref().unwrap_or("").contains("per address"), "{:?}", r.refused.1);
    assert_eq!(rep.total.capped, 2);
}

#[test]
fn answers_to_unproven_addresses_are_rate_limited() {
    let limits = Limits { unproven_per_sec: 50, ..Limits::default() };
    let server = loopback_server(|c| c.limits = limits);
    let c = Hand::new(server.local_addr());
    for i in 0..500 {
        c.send(&request(i, None));
    }
    let mut cookies = 0;
    while c.next().is_some() {
        cookies += 1;
    }
    let rep = server.stop().unwrap();
    println!("{cookies} cookies for 500 requests: {:?}", rep.total);
    assert!(cookies <= 60, "about one second's worth of the 50/s budget, not 500: {cookies}");
    // What the socket's buffer took of the burst was answered or counted as limited.
    assert!(rep.total.unproven_limited > 0 && rep.total.cookies_sent + rep.total.unproven_limited <= 500);
    assert_eq!(rep.total.cookies_sent as usize, cookies);
}

/// Anyone can forge an ICMP "port unreachable" naming a client's address; only one whose
/// quote carries the flow's secret (what a real error quoting a data datagram holds) ends it.
/// A quote of the UDP header alone ends nothing.
#[test]
fn a_forged_port_unreachable_ends_a_flow_only_with_its_secret() {
    if !udpx_lab::netns::is_root() {
        udpx_lab::netns::record_skip(
            "a_forged_port_unreachable_ends_a_flow_only_with_its_secret",
            "needs a raw socket (root)",
        );
        return;
    }
    let raw = RawSender::new().unwrap();
    let server = loopback_server(|_| {});
    let SocketAddr::V4(srv) = server.local_addr() else { unreachable!() };
    let c = Hand::new(server.local_addr());
    let secret = c.start(7);
    let SocketAddr::V4(client) = c.sock.local_addr().unwrap() else { unreachable!() };
    let quote_of = |secret: u64| {
        let mut d = vec![0u8; wire::HEADER];
        let data =
            wire::Data { flow: 7, secret, size: wire::HEADER as u32, seq: 0, intended_ns: 0, sent_ns: 0, rate: 0 };
        wire::write_data(&mut d, &data);
        forge::udp_datagram(srv, client, &d)
    };
    let unreachable = |quoted: &[u8], payload: usize| {
        forge::icmp_error(
            Ipv4Addr::LOCALHOST,
            *srv.ip(),
            forge::ICMP_DEST_UNREACH,
            forge::unreach::PORT,
            0,
            quoted,
            8 + payload,
        )
    };
    for _ in 0..20 {
        raw.send(&unreachable(&quote_of(secret ^ 0xdead), wire::HEADER)).unwrap(); // a guessed secret
        raw.send(&unreachable(&quote_of(secret), 0)).unwrap(); // the UDP header only
    }
    assert!(
        !udpx_lab::wait_until(Duration::from_millis(500), || server.live_flows() == 0),
        "forged errors ended the flow"
    );
    raw.send(&unreachable(&quote_of(secret), wire::HEADER)).unwrap();
    assert!(
        udpx_lab::wait_until(Duration::from_secs(2), || server.live_flows() == 0),
        "the error with the secret ends it"
    );
    let rep = server.stop().unwrap();
    assert_eq!(rep.total.clients_gone, 1, "{:?}", rep.total);
    assert!(rep.total.icmp_unverified >= 40, "{:?}", rep.total);
}

/// The attack lab: while a legitimate client streams 40 flows, the attacker sends 4,000
/// requests forged with the victim's address and a flood of ICMP errors of every
/// "unreachable" code about the client's address. The victim receives at most what the
/// attacker sent (cookies, never data), the client's every datagram arrives exactly once and
/// every flow ends with its End, the server never stops, and it serves a new client after.
#[test]
fn the_attack_lab_forged_requests_and_icmp_floods() {
    if udpx_lab::netns::skip_unless_capable("the_attack_lab_forged_requests_and_icmp_floods") {
        return;
    }
    let net = StarNet::setup().expect("the attack lab");
    let mut cfg = ServeConfig::new(SocketAddr::from((Leaf::Server.v4(), 4500)));
    cfg.limits = Limits::raised_for(40, 24_000);
    let server = Arc::new(net.ns(Leaf::Server).run(move || Server::start(cfg).expect("server")));
    let srv = server.local_addr();
    let counter = net
        .victim_listens(7001, Duration::from_secs(6), |d| matches!(wire::parse(d), Some(Message::Data(_))))
        .expect("the victim");
    let mut recv = RecvConfig::new(srv, 40, 24_000, Duration::from_secs(3));
    recv.local = vec![Leaf::Client.v4().into()];
    let client = net.ns(Leaf::Client).spawn(move || receive(&recv, &Progress::default()));
    let rss0 = udpx_lab::netns::rss_bytes();
    const FORGED: usize = 4_000;
    let forged_bytes = net.ns(Leaf::Attacker).spawn(move || {
        let raw = RawSender::new().unwrap();
        let SocketAddr::V4(srv) = srv else { unreachable!() };
        let victim = SocketAddrV4::new(Leaf::Victim.v4(), 7001);
        let mut b = [0u8; wire::REQUEST_LEN];
        let mut sent = 0;
        for i in 0..FORGED {
            let n = wire::write_request(&mut b, &request(i as u32, None));
            raw.send(&forge::udp_datagram(victim, srv, &b[..n])).unwrap();
            sent += n;
            // And ICMP errors about datagrams "to" the client, every code.
            let code = forge::unreach::ALL[i % forge::unreach::ALL.len()];
            let to = SocketAddrV4::new(Leaf::Client.v4(), 30_000 + (i % 1000) as u16);
            let quoted = forge::udp_datagram(srv, to, &[0u8; 40]);
            let mtu = if code == forge::unreach::FRAG_NEEDED { 1280 } else { 0 };
            raw.send(&forge::icmp_error(Leaf::Attacker.v4(), *srv.ip(), 3, code, mtu, &quoted, 48)).unwrap();
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        sent
    });
    let forged_bytes = forged_bytes.join().unwrap();
    let r = client.join().unwrap().expect("the client's run");
    let (victim_bytes, victim_data) = counter.join().unwrap();
    let grown = udpx_lab::netns::rss_bytes().saturating_sub(rss0);
    assert!(!server.finished(), "the server still runs");
    assert!(grown < 64 << 20, "4,000 forged requests keep no state: RSS grew {} MB", grown >> 20);
    // After the attack a new client is served.
    let mut after = RecvConfig::new(srv, 2, 24_000, Duration::from_millis(500));
    after.local = vec![Leaf::Client.v4().into()];
    let later = net.ns(Leaf::Client).run(move || receive(&after, &Progress::default())).expect("a later client");
    let server = Arc::try_unwrap(server).expect("one owner");
    let rep = server.stop().unwrap();
    let s = &r.summary;
    println!(
        "attack lab: forged {forged_bytes} B, victim got {victim_bytes} B ({victim_data} data); RSS grew {} KB; client: {} flows, {} datagrams, lost {}; server: {:?}",
        grown >> 10,
        r.accepted, s.datagrams, s.lost, rep.total
    );
    assert_eq!(victim_data, 0, "no data to an unproven address");
    assert!(victim_bytes <= forged_bytes, "at most 1x toward the victim: {victim_bytes} > {forged_bytes}");
    assert_eq!((r.accepted, s.lost, s.duplicates, s.flows_ended), (40, 0, 0, 40), "the client served in full");
    assert_eq!(later.accepted, 2);
    assert_eq!(rep.total.clients_gone, 0, "no flow ended by a forged ICMP error");
    drop(net);
}
