//! The video-player load (`udpx h3 load`) against the server on loopback: every connection is
//! established and every request in the window is answered whole, over HTTP/3 and (against the
//! server's HTTPS-over-TCP listener) over HTTP/2 and HTTP/1.1. Counts are asserted; latencies
//! are printed, never judged.

#[path = "../../udpx-h3/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{content, TempDir};
use udpx_h3::{serve, ServeConfig};
use udpx_h3_bench::clients::own::{self, LoadConfig};
use udpx_h3_bench::clients::quinn_hyper::{self, HyperHttp};

fn site() -> TempDir {
    let tmp = TempDir::new("load");
    std::fs::create_dir_all(tmp.path().join("www")).unwrap();
    std::fs::write(tmp.path().join("www/seg"), content(16 * 1024, 3)).unwrap();
    tmp
}

/// A self-signed certificate for `localhost` in `tmp`, served by `sc`: the CA file the
/// hyperium clients check it against.
fn tls_files(tmp: &TempDir, sc: &mut ServeConfig) -> std::path::PathBuf {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (tmp.path().join("cert.pem"), tmp.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    sc.tls = udpx_h3::Tls::Files { cert: cert.clone(), key };
    cert
}

/// `n` players asking `/seg` every `interval`, started over `ramp`, measured for 2 s.
fn players(server: std::net::SocketAddr, n: usize, interval: Duration, ramp: Duration) -> LoadConfig {
    let mut cfg = LoadConfig::new(server, n, "/seg", interval);
    cfg.ramp = ramp;
    cfg.duration = Duration::from_secs(2);
    cfg
}

#[test]
fn players_over_http3_are_all_served() {
    let tmp = site();
    let server = serve(&tmp.path().join("www"), &ServeConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let mut cfg = players(server.local_addr(), 200, Duration::from_millis(300), Duration::from_secs(1));
    // Four source addresses of loopback: the server sees four clients' worth of connections.
    cfg.locals = (1..=4).map(|i| std::net::IpAddr::from([127, 0, 0, i])).collect();
    let r = own::run(&cfg).unwrap();
    let c = server.stop().unwrap();
    println!("{}; server {:?}", r.summary(), c.quic);
    assert_eq!(r.established, 200);
    assert!(r.requests >= 200 * 2, "each asks every 300 ms over 2 s: {}", r.requests);
    assert_eq!((r.served, r.failed, r.never_served, r.ended_early), (r.requests, 0, 0, 0));
    assert_eq!(r.bytes % (16 * 1024), 0, "whole segments");
    assert_eq!(c.quic.connections, 200);
}

#[test]
fn players_over_tcp_are_all_served() {
    let tmp = site();
    let mut sc = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    sc.alt_svc_tcp = Some("127.0.0.1:0".parse().unwrap());
    let cert = tls_files(&tmp, &mut sc);
    let server = serve(&tmp.path().join("www"), &sc).unwrap();
    let tcp = server.tcp_addr().unwrap();
    for http in [HyperHttp::H2, HyperHttp::H1] {
        let mut cfg = LoadConfig::new(tcp, 100, "/seg", Duration::from_millis(300));
        cfg.ramp = Duration::from_millis(500);
        cfg.duration = Duration::from_secs(2);
        cfg.locals = (1..=8).map(|i| std::net::IpAddr::from([127, 0, 1, i])).collect();
        let r = quinn_hyper::run(&cfg, http, &cert).unwrap();
        println!("{http:?} load: {} requests, {} served, latency {:?}", r.requests, r.served, r.latency);
        assert_eq!(r.established, 100, "{http:?}");
        assert!(r.requests >= 100 * 2, "{http:?}: {}", r.requests);
        assert_eq!((r.served, r.failed, r.never_served, r.ended_early), (r.requests, 0, 0, 0), "{http:?}");
    }
    server.stop().unwrap();
}

/// The second independent HTTP/3 client (quinn with hyperium's h3, issue 39): its players on
/// four sockets, every request answered whole, its datagrams and its host's drops counted.
#[test]
fn quinn_players_over_http3_are_all_served() {
    let tmp = site();
    let mut sc = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    let cert = tls_files(&tmp, &mut sc);
    let server = serve(&tmp.path().join("www"), &sc).unwrap();
    let mut cfg = players(server.local_addr(), 200, Duration::from_millis(300), Duration::from_secs(1));
    cfg.locals = (1..=4).map(|i| std::net::IpAddr::from([127, 0, 4, i])).collect();
    let r = quinn_hyper::run(&cfg, HyperHttp::H3, &cert).unwrap();
    let c = server.stop().unwrap();
    println!("{}; server {:?}", r.summary(), c.quic);
    assert_eq!(r.client, "quinn h3");
    assert_eq!(r.established, 200);
    assert!(r.requests >= 200 * 2, "each asks every 300 ms over 2 s: {}", r.requests);
    assert_eq!((r.served, r.failed, r.unanswered, r.never_served, r.ended_early), (r.requests, 0, 0, 0, 0));
    assert_eq!(r.bytes % (16 * 1024), 0, "whole segments");
    assert!(r.packets_received.unwrap() > 0 && r.packets_sent.unwrap() > 0, "the client's datagrams counted");
    assert!(r.client_dropped.is_some(), "the client host's receive-buffer drops read");
    assert_eq!(c.quic.connections, 200);
    assert!(c.http.requests >= r.requests, "the server answered what the client counted");
}

/// udpx's own load client honours GOAWAY (issue 40): when the server drains, each player
/// finishes its request under way, sends nothing more on that connection, closes it and opens
/// a new one for its next request (which the draining server refuses: no second server here).
/// No request goes unanswered or is refused past GOAWAY.
#[test]
fn players_leave_a_draining_server_for_a_new_connection() {
    let tmp = site();
    let server = serve(&tmp.path().join("www"), &ServeConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let cfg = players(server.local_addr(), 20, Duration::from_millis(200), Duration::from_millis(300));
    let r = std::thread::scope(|s| {
        let run = s.spawn(|| own::run(&cfg).unwrap());
        std::thread::sleep(Duration::from_millis(1200));
        server.drain(Duration::from_secs(30));
        run.join().unwrap()
    });
    let c = server.stop().unwrap();
    println!("{}; moved {}, retried {}; server {:?}", r.summary(), r.moved_on_goaway, r.retried, c.quic);
    assert_eq!(r.established, 20, "the first connections");
    assert!(r.requests >= 20, "{}", r.requests);
    assert_eq!((r.served, r.failed, r.unanswered, r.retried), (r.requests, 0, 0, 0), "every request sent was answered");
    assert_eq!(r.moved_on_goaway, 20, "every player left its connection after GOAWAY");
    assert_eq!((c.quic.drained, c.quic.drain_closed), (20, 0), "each connection ended during the drain");
}
