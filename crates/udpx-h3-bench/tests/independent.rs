//! The independent load client (`udpx-quicgo-load`: quic-go's HTTP/3 client, Go's net/http)
//! against the server on loopback: many connections at once over a few sockets, every
//! connection established, every request of the window answered whole, none unanswered, and
//! the client's packet counts read. Counts are asserted; latencies are printed, never judged.
//! Without the program (scripts/setup.sh builds it from peers/quicgo-load) the tests SKIP.

#[path = "../../udpx-h3/tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Duration;

use common::{content, TempDir};
use udpx_h3::{serve, ServeConfig};
use udpx_h3_bench::clients::own::LoadConfig;
use udpx_h3_bench::clients::quicgo::{self, Proto};

const SIZE: usize = 48 * 1024;

fn site() -> TempDir {
    let tmp = TempDir::new("independent");
    std::fs::create_dir_all(tmp.path().join("www")).unwrap();
    std::fs::write(tmp.path().join("www/seg"), content(SIZE, 5)).unwrap();
    tmp
}

fn program(test: &str) -> Option<std::path::PathBuf> {
    let p = quicgo::find();
    if p.is_none() {
        udpx_lab::netns::record_skip(test, "udpx-quicgo-load not built (scripts/setup.sh builds it with Go)");
    }
    p
}

#[test]
fn independent_players_over_http3_are_all_served() {
    let Some(prog) = program("independent_players_over_http3_are_all_served") else { return };
    let tmp = site();
    let mut sc = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    sc.quic.shards = 2;
    let server = serve(&tmp.path().join("www"), &sc).unwrap();
    let mut cfg = LoadConfig::new(server.local_addr(), 300, "/seg", Duration::from_millis(400));
    cfg.ramp = Duration::from_secs(1);
    cfg.duration = Duration::from_secs(2);
    // Four source addresses, one socket each, 75 connections per socket.
    cfg.locals = (1..=4).map(|i| std::net::IpAddr::from([127, 0, 2, i])).collect();
    let r = quicgo::run(Command::new(prog), &cfg, Proto::H3, SIZE as u64).unwrap();
    let c = server.stop().unwrap();
    println!("{}; server {:?}", r.summary(), c.http);
    assert_eq!(r.established, 300);
    // How many each asks (every 400 ms over 2 s) is the loaded machine's business, not a
    // pass/fail: each asked at least once, and every request was answered.
    assert!(r.requests >= 300, "every player asked: {}", r.requests);
    assert_eq!((r.served, r.failed, r.unanswered, r.never_served, r.ended_early), (r.requests, 0, 0, 0, 0));
    assert!(r.packets_received.unwrap() > 0 && r.packets_sent.unwrap() > 0, "the client's packets counted");
    assert!(r.client_dropped.is_some(), "what the client's host dropped counted (its /proc/net/snmp read)");
    assert_eq!(c.quic.connections, 300);
    assert!(c.http.requests >= r.requests, "the server answered what the client counted");
}

#[test]
fn independent_players_over_http2_are_all_served() {
    let Some(prog) = program("independent_players_over_http2_are_all_served") else { return };
    let tmp = site();
    let mut sc = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    sc.alt_svc_tcp = Some("127.0.0.1:0".parse().unwrap());
    let server = serve(&tmp.path().join("www"), &sc).unwrap();
    let mut cfg = LoadConfig::new(server.tcp_addr().unwrap(), 100, "/seg", Duration::from_millis(400));
    cfg.ramp = Duration::from_millis(500);
    cfg.duration = Duration::from_secs(2);
    cfg.locals = (1..=8).map(|i| std::net::IpAddr::from([127, 0, 3, i])).collect();
    let r = quicgo::run(Command::new(prog), &cfg, Proto::H2, SIZE as u64).unwrap();
    server.stop().unwrap();
    println!("{}: {} requests, {} served, latency {:?}", r.client, r.requests, r.served, r.latency);
    assert_eq!(r.established, 100);
    assert!(r.requests >= 100, "every player asked: {}", r.requests);
    assert_eq!((r.served, r.failed, r.unanswered, r.never_served, r.ended_early), (r.requests, 0, 0, 0, 0));
}

#[test]
fn a_short_body_is_not_served() {
    // The client checks the length it was told: a server that cut a body short would show as
    // failed, not served (this file is not SIZE long).
    let Some(prog) = program("a_short_body_is_not_served") else { return };
    let tmp = site();
    std::fs::write(tmp.path().join("www/short"), content(SIZE - 1, 5)).unwrap();
    let server = serve(&tmp.path().join("www"), &ServeConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let mut cfg = LoadConfig::new(server.local_addr(), 5, "/short", Duration::from_millis(300));
    cfg.ramp = Duration::from_millis(100);
    cfg.duration = Duration::from_secs(1);
    let r = quicgo::run(Command::new(prog), &cfg, Proto::H3, SIZE as u64).unwrap();
    server.stop().unwrap();
    assert!(r.requests > 0);
    assert_eq!((r.served, r.failed), (0, r.requests));
}
