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
    ] {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    assert!(body.contains("# HELP udpx_datagrams_sent Datagrams"), "help text from the field docs:\n{body}");
    // A second scrape reads the counters again.
    assert!(get(srv.local_addr(), "/metrics").contains("udpx_datagrams_received_total{shard=\"0\"} 101"));
    assert!(get(srv.local_addr(), "/other").contains(" 404 "));
    let addr = srv.local_addr();
    drop(srv);
    // tiny_http's accept thread closes the listener right after the server is dropped.
    let closed = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::net::TcpStream::connect(addr).is_err()
    });
    assert!(closed, "the listener closes with the server");
}
