//! The echo server in the attack lab (namespaces: server, attacker, victim, client): requests
//! forged with the victim's address reflect at most the per-source limit, never more bytes than
//! the attacker sent; an ICMP flood of every "unreachable" code ends nothing; the legitimate
//! client, under the limit, gets every reply. Counts are asserted, never timings.

use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Duration;

use udpx_echo::proto::{self, Request};
use udpx_echo::server::{self, Mode, ServeConfig, DEFAULT_RATE_LIMIT};
use udpx_lab::netns::forge::{self, RawSender};
use udpx_lab::netns::{Leaf, StarNet};

const SIZE: usize = 100;

fn request(seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; SIZE];
    proto::write(&mut b, Request { seq, sent_ns: 0, flow: 0 });
    b
}

#[test]
fn the_attack_lab_forged_requests_and_icmp_floods() {
    if udpx_lab::netns::skip_unless_capable("echo: the_attack_lab_forged_requests_and_icmp_floods") {
        return;
    }
    let net = StarNet::setup().expect("the attack lab");
    let cfg = ServeConfig {
        bind: SocketAddr::from((Leaf::Server.v4(), 11111)),
        mode: Mode::Reuseport,
        threads: 1,
        batch: true,
        io_uring: false,
        rate_limit: Some(DEFAULT_RATE_LIMIT),
        cpus: None,
        recv_buffer: None,
    };
    let srv = net.ns(Leaf::Server).run(move || server::start(server::bind(&cfg).expect("bind")));
    let addr = srv.addr;
    let counter = net.victim_listens(7001, Duration::from_secs(4), |_| false).expect("the victim");
    // The client: 500 requests at about 250 a second (a quarter of the limit), each answered.
    let client = net.ns(Leaf::Client).spawn(move || {
        let s = UdpSocket::bind(SocketAddr::from((Leaf::Client.v4(), 0))).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut got = std::collections::BTreeSet::new();
        let mut buf = [0u8; 2048];
        for seq in 0..500u64 {
            s.send_to(&request(seq), addr).unwrap();
            // Read what has come, then pace.
            s.set_nonblocking(true).unwrap();
            while s.recv_from(&mut buf).is_ok() {
                got.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
            }
            s.set_nonblocking(false).unwrap();
            std::thread::sleep(Duration::from_millis(4));
        }
        while got.len() < 500 {
            let Ok(_) = s.recv_from(&mut buf) else { break };
            got.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
        }
        got.len()
    });
    const FORGED: usize = 20_000;
    let forged_bytes = net.ns(Leaf::Attacker).spawn(move || {
        let raw = RawSender::new().unwrap();
        let SocketAddr::V4(srv) = addr else { unreachable!() };
        let victim = SocketAddrV4::new(Leaf::Victim.v4(), 7001);
        let mut sent = 0;
        for i in 0..FORGED {
            let r = request(i as u64);
            raw.send(&forge::udp_datagram(victim, srv, &r)).unwrap();
            sent += r.len();
            let code = forge::unreach::ALL[i % forge::unreach::ALL.len()];
            let quoted = forge::udp_datagram(srv, SocketAddrV4::new(Leaf::Client.v4(), 40_000), &r);
            let mtu = if code == forge::unreach::FRAG_NEEDED { 1280 } else { 0 };
            raw.send(&forge::icmp_error(Leaf::Attacker.v4(), *srv.ip(), 3, code, mtu, &quoted, 48)).unwrap();
            if i % 1000 == 999 {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        sent
    });
    let forged_bytes = forged_bytes.join().unwrap();
    let answered = client.join().unwrap();
    let victim_bytes = counter.join().unwrap().0;
    let running = srv.stats();
    let shards = srv.stop();
    let limited: u64 = shards.iter().map(|s| s.rate_limited).sum();
    println!("echo attack lab: forged {forged_bytes} B, victim got {victim_bytes} B, client {answered}/500, {limited} rate-limited; {running:?}");
    assert_eq!(answered, 500, "the client under the limit got every reply");
    assert!(victim_bytes <= forged_bytes, "at most 1x toward the victim");
    // The limit: a second's burst and at most the attack's span at the rate (the attack ends
    // within 3 s), of 100-byte replies.
    assert!(victim_bytes <= (DEFAULT_RATE_LIMIT as usize) * 4 * SIZE, "{victim_bytes} B: more than the limit allows");
    assert!(limited > 0);
    drop(net);
}
