//! `--metrics ADDR` for udpx's servers: Prometheus text (OpenMetrics) over HTTP, produced at
//! scrape time from the counters the sockets and the server already keep, so serving them
//! costs the data path nothing.
//!
//! A server implements [`Source`]: per shard, the socket's [`CounterSnapshot`] (every field
//! becomes `udpx_<field>_total{shard="i"}`, its documentation the help text) and its own
//! counters ([`Extra`], e.g. `echo_requests_total`). [`MetricsServer::start`] serves
//! `GET /metrics` on a thread of its own until it is dropped.
//!
//! Encoding is prometheus-client's (a `Collector`), the HTTP server tiny_http's: nothing of the
//! exposition format is written here.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use udpx::CounterSnapshot;

/// A counter or gauge of the server's own, for one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extra {
    /// Metric name without `_total` (e.g. `echo_requests`).
    pub name: &'static str,
    /// What it counts.
    pub help: &'static str,
    /// Its value.
    pub value: u64,
    /// A gauge (a level that goes down as well as up) rather than a counter.
    pub gauge: bool,
}

/// What one shard reports at a scrape.
#[derive(Debug, Clone, Default)]
pub struct ShardSample {
    /// The socket's counters.
    pub socket: CounterSnapshot,
    /// The kernel's drop count for the socket (SO_MEMINFO), read at the scrape.
    pub kernel_drops: u64,
    /// The server's own counters for this shard.
    pub extra: Vec<Extra>,
}

/// A server whose counters are served: asked for a sample of every shard at each scrape.
pub trait Source: Send + Sync + 'static {
    /// One sample per shard, in shard order.
    fn sample(&self) -> Vec<ShardSample>;

    /// The server's counters that belong to no one shard (served without a `shard` label).
    fn global(&self) -> Vec<Extra> {
        Vec::new()
    }
}

struct SourceCollector(Arc<dyn Source>);

impl fmt::Debug for SourceCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SourceCollector")
    }
}

impl Collector for SourceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        for e in self.0.global() {
            let ty = if e.gauge { ConstGauge::new(0i64).metric_type() } else { ConstCounter::new(0u64).metric_type() };
            encode_value(&e, encoder.encode_descriptor(e.name, e.help, None, ty)?)?;
        }
        let shards = self.0.sample();
        let label = |i: usize| [("shard", i.to_string())];
        let Some(first) = shards.first() else { return Ok(()) };
        // The library's counters, one family per field.
        for (k, (name, help, _)) in first.socket.fields_with_help().into_iter().enumerate() {
            let metric = format!("udpx_{name}");
            let mut family =
                encoder.encode_descriptor(&metric, help.trim(), None, ConstCounter::new(0u64).metric_type())?;
            for (i, s) in shards.iter().enumerate() {
                let value = s.socket.fields_with_help()[k].2;
                ConstCounter::new(value).encode(family.encode_family(&label(i))?)?;
            }
        }
        let help = "Datagrams the kernel dropped on the shard's socket (receive buffer full), read with SO_MEMINFO";
        let mut family =
            encoder.encode_descriptor("udpx_socket_kernel_drops", help, None, ConstCounter::new(0u64).metric_type())?;
        for (i, s) in shards.iter().enumerate() {
            ConstCounter::new(s.kernel_drops).encode(family.encode_family(&label(i))?)?;
        }
        // The server's own, by the first shard's list of names.
        for (k, e) in first.extra.iter().enumerate() {
            let ty = if e.gauge { ConstGauge::new(0i64).metric_type() } else { ConstCounter::new(0u64).metric_type() };
            let mut family = encoder.encode_descriptor(e.name, e.help, None, ty)?;
            for (i, s) in shards.iter().enumerate() {
                let Some(x) = s.extra.get(k) else { continue };
                encode_value(x, family.encode_family(&label(i))?)?;
            }
        }
        Ok(())
    }
}

/// `GET path` over HTTP/1.0 to `addr`: the whole answer (status line, fields, body). A tiny
/// client for tests and scripts that read a metrics endpoint.
pub fn fetch(addr: SocketAddr, path: &str) -> io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: udpx\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The answer to `GET /metrics` at `addr` (see [`fetch`]).
pub fn scrape(addr: SocketAddr) -> io::Result<String> {
    fetch(addr, "/metrics")
}

/// One value of `e`'s kind.
fn encode_value(e: &Extra, enc: prometheus_client::encoding::MetricEncoder<'_>) -> Result<(), fmt::Error> {
    if e.gauge {
        ConstGauge::new(e.value.min(i64::MAX as u64) as i64).encode(enc)
    } else {
        ConstCounter::new(e.value).encode(enc)
    }
}

/// The text a scrape of `source` returns (OpenMetrics).
pub fn render(source: Arc<dyn Source>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SourceCollector(source)));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        log::warn!("udpx-metrics: encoding failed: {e}");
    }
    out
}

/// An HTTP server answering `GET /metrics`, on its own thread, until dropped.
pub struct MetricsServer {
    http: Arc<tiny_http::Server>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish()
    }
}

impl MetricsServer {
    /// Listens on `addr` (port 0: any free port; see [`MetricsServer::local_addr`]).
    pub fn start(addr: SocketAddr, source: Arc<dyn Source>) -> io::Result<MetricsServer> {
        let http = tiny_http::Server::http(addr).map_err(|e| io::Error::other(format!("metrics on {addr}: {e}")))?;
        let addr = http.server_addr().to_ip().ok_or_else(|| io::Error::other("metrics: not an IP listener"))?;
        let http = Arc::new(http);
        let server = http.clone();
        let thread = std::thread::Builder::new().name("udpx-metrics".into()).spawn(move || {
            let content_type = tiny_http::Header::from_bytes(
                &b"Content-Type"[..],
                &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
            )
            .ok();
            for req in server.incoming_requests() {
                let answer = if req.method() == &tiny_http::Method::Get && req.url() == "/metrics" {
                    let mut r = tiny_http::Response::from_string(render(source.clone()));
                    if let Some(h) = content_type.clone() {
                        r = r.with_header(h);
                    }
                    r
                } else {
                    tiny_http::Response::from_string("udpx: only GET /metrics is served here\n").with_status_code(404)
                };
                let _ = req.respond(answer);
            }
        })?;
        Ok(MetricsServer { http, addr, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.http.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
