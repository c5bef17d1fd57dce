//! A scrape over real HTTP: every library counter and the server's own appear per shard with
//! their values; other paths are refused; the server stops when dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use udpx::CounterSnapshot;
use udpx_metrics::{Extra, MetricsServer, ShardSample, Source};

struct Fake(AtomicU64);

impl Source for Fake {
    fn sample(&self) -> Vec<ShardSample> {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        (0..2)
            .map(|i| {
                let mut socket = CounterSnapshot::default();
                socket.datagrams_received = 100 * (i + 1) + n;
                ShardSample {
                    socket,
                    kernel_drops: i,
                    extra: vec![
                        Extra { name: "echo_requests", help: "Requests.", value: 7 + i, gauge: false },
                        Extra { name: "echo_in_flight", help: "Level.", value: 3, gauge: true },
                    ],
                    icmp_offenders: vec![("192.0.2.9".parse().unwrap(), 5 + i)],
                }
            })
            .collect()
    }
}

pub fn get(addr: std::net::SocketAddr, path: &str) -> String {
    udpx_metrics::fetch(addr, path).unwrap()
}

#[test]
fn scrape_serves_every_counter_per_shard() {
    let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::new(Fake(AtomicU64::new(0)))).unwrap();
    let body = get(srv.local_addr(), "/metrics");
    assert!(body.starts_with("HTTP/1.1 200") || body.starts_with("HTTP/1.0 200"), "{body}");
    assert!(body.contains("openmetrics-text"), "{body}");
    for line in [
        "udpx_datagrams_received_total{shard=\"0\"} 100",
        "udpx_datagrams_received_total{shard=\"1\"} 200",
        "udpx_socket_kernel_drops_total{shard=\"1\"} 1",
        "echo_requests_total{shard=\"1\"} 8",
        "echo_in_flight{shard=\"0\"} 3",
        "# TYPE udpx_gso_fallbacks counter",
        "udpx_icmp_offender_errors{shard=\"1\",addr=\"192.0.2.9\"} 6",
        "udpx_icmp_port_unreachable_total{shard=\"0\"} 0",
    ] {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    assert!(body.contains("# HELP udpx_datagrams_sent Datagrams"), "help text from the field docs:\n{body}");
    // A second scrape reads the counters again.
    assert!(get(srv.local_addr(), "/metrics").contains("udpx_datagrams_received_total{shard=\"0\"} 101"));
    assert!(get(srv.local_addr(), "/other").contains(" 404 "));
    let addr = srv.local_addr();
    drop(srv);
    let closed = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::net::TcpStream::connect(addr).is_err()
    });
    assert!(closed, "the listener closes with the server");
}

/// A TCP connection to `to` from `from` (a loopback address of the test's choosing), so tests
/// can play many sources.
fn connect_from(from: std::net::Ipv4Addr, to: std::net::SocketAddr) -> std::net::TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(from, 0))).unwrap();
    let std::net::SocketAddr::V4(to) = to else { panic!("IPv4") };
    connect(fd.as_raw_fd(), &SockaddrIn::from(to)).unwrap();
    std::net::TcpStream::from(fd)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Idle connections (a slow-loris flood) take no thread and no unbounded wait: four per source
/// at most, 503 for the rest, each cut off at the deadline; a scrape from another address is
/// answered throughout, and the endpoint counts what it refused and cut off.
#[test]
fn idle_connections_are_capped_and_cut_off() {
    let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::new(Fake(AtomicU64::new(0)))).unwrap();
    let addr = srv.local_addr();
    let before = threads();
    let attacker: std::net::Ipv4Addr = "127.0.0.2".parse().unwrap();
    let idle: Vec<_> = (0..300).map(|_| connect_from(attacker, addr)).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Other tests of this binary may start a thread meanwhile; 300 connections would be 300.
    assert!(threads() < before + 10, "no thread per connection: {} then {}", before, threads());
    // The ones over the cap got a 503 and were closed.
    let mut refused = 0;
    for mut c in idle.iter().skip(udpx_metrics::MAX_PER_SOURCE) {
        use std::io::Read;
        c.set_read_timeout(Some(std::time::Duration::from_millis(200))).unwrap();
        let mut b = String::new();
        let _ = c.read_to_string(&mut b);
        refused += b.starts_with("HTTP/1.1 503") as usize;
    }
    assert_eq!(refused, 300 - udpx_metrics::MAX_PER_SOURCE);
    let body = get(addr, "/metrics");
    assert!(body.contains(" 200 "), "a scrape from 127.0.0.1 is served meanwhile: {body}");
    // The held ones are cut off at the deadline.
    std::thread::sleep(udpx_metrics::CONNECTION_DEADLINE + std::time::Duration::from_millis(300));
    let body = get(addr, "/metrics");
    assert!(body.contains("udpx_metrics_http_refused_total 296"), "{body}");
    assert!(body.contains("udpx_metrics_http_timed_out_total 4"), "{body}");
    drop(idle);
}

/// A request that never ends its head is cut off too, and a huge one is refused unread.
#[test]
fn slow_and_oversized_requests_are_cut_off() {
    use std::io::{Read, Write};
    let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::new(Fake(AtomicU64::new(0)))).unwrap();
    let mut slow = std::net::TcpStream::connect(srv.local_addr()).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    slow.set_read_timeout(Some(udpx_metrics::CONNECTION_DEADLINE * 2)).unwrap();
    let start = std::time::Instant::now();
    let mut b = Vec::new();
    let _ = slow.read_to_end(&mut b);
    assert!(b.is_empty(), "no answer to half a request");
    assert!(start.elapsed() < udpx_metrics::CONNECTION_DEADLINE * 2, "closed at the deadline, not waited on");
    let mut big = std::net::TcpStream::connect(srv.local_addr()).unwrap();
    let _ = big.write_all(&vec![b'x'; 20_000]);
    let mut b = String::new();
    let _ = big.read_to_string(&mut b);
    assert!(b.starts_with("HTTP/1.1 431"), "{b}");
}

#[test]
fn listen_addresses_default_to_loopback() {
    assert_eq!(udpx_metrics::parse_listen("9100"), Ok("127.0.0.1:9100".parse().unwrap()));
    assert_eq!(udpx_metrics::parse_listen("0.0.0.0:9100"), Ok("0.0.0.0:9100".parse().unwrap()));
    assert!(udpx_metrics::parse_listen("metrics").unwrap_err().contains("127.0.0.1"));
    assert!(!udpx_metrics::is_exposed("127.0.0.1:1".parse().unwrap()));
    assert!(!udpx_metrics::is_exposed("[::1]:1".parse().unwrap()));
    assert!(udpx_metrics::is_exposed("0.0.0.0:1".parse().unwrap()));
}
