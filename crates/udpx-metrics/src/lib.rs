//! `--metrics ADDR` for udpx's servers: Prometheus text (OpenMetrics) over HTTP, produced at
//! scrape time from the counters the sockets and the server already keep, so serving them
//! costs the data path nothing.
//!
//! A server implements [`Source`]: per shard, the socket's [`CounterSnapshot`] (every field
//! becomes `udpx_<field>_total{shard="i"}`, its documentation the help text) and its own
//! counters ([`Extra`], e.g. `echo_requests_total`). [`MetricsServer::start`] serves
//! `GET /metrics` on a thread of its own until it is dropped, bounded against whoever can
//! reach it (see [`MetricsServer`]); the tools bind it to loopback unless told otherwise.
//!
//! Encoding is prometheus-client's (a `Collector`): nothing of the exposition format is
//! written here. The HTTP side is a small `poll` loop of our own: it must never give a peer a
//! thread or an unbounded wait, which a general-purpose embedded server did.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

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
    /// The hosts that sent the shard's socket the most ICMP errors, with their counts
    /// ([`udpx::UdpSocket::icmp_offenders`]: 16 at most).
    pub icmp_offenders: Vec<(std::net::IpAddr, u64)>,
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

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).finish_non_exhaustive()
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
                let mut value = s.socket.fields_with_help()[k].2;
                if name == "kernel_drops" {
                    // The receive path's count moves only on a socket that asked for
                    // SO_RXQ_OVFL; SO_MEMINFO's, read at the scrape, holds on every socket.
                    value = value.max(s.kernel_drops);
                }
                ConstCounter::new(value).encode(family.encode_family(&label(i))?)?;
            }
        }
        let help = "Datagrams the kernel dropped on the shard's socket (receive buffer full), read with SO_MEMINFO";
        let mut family =
            encoder.encode_descriptor("udpx_socket_kernel_drops", help, None, ConstCounter::new(0u64).metric_type())?;
        for (i, s) in shards.iter().enumerate() {
            ConstCounter::new(s.kernel_drops).encode(family.encode_family(&label(i))?)?;
        }
        // The ICMP senders' top list: at most 16 series per shard, so bounded cardinality.
        let help =
            "ICMP errors from the hosts that sent the shard's socket the most (top 16, counts never under the truth)";
        let mut family =
            encoder.encode_descriptor("udpx_icmp_offender_errors", help, None, ConstGauge::new(0i64).metric_type())?;
        for (i, s) in shards.iter().enumerate() {
            for (ip, n) in &s.icmp_offenders {
                let labels = [("shard", i.to_string()), ("addr", ip.to_string())];
                ConstGauge::new((*n).min(i64::MAX as u64) as i64).encode(family.encode_family(&labels)?)?;
            }
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

/// Connections served at once; past it, a new connection is answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections at once from one source address; past it, 503.
pub const MAX_PER_SOURCE: usize = 4;
/// How long a connection may take, from accept to the last byte of the answer: a peer that
/// sends its request or reads the answer more slowly is cut off.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(3);
/// Largest request head read.
const MAX_REQUEST: usize = 8 * 1024;
/// How often the thread looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);

/// What the endpoint itself counts (served as `udpx_metrics_http_*`).
#[derive(Debug, Default)]
struct HttpCounters {
    accepted: AtomicU64,
    refused: AtomicU64,
    timed_out: AtomicU64,
    accept_errors: AtomicU64,
}

/// An HTTP/1.x server answering `GET /metrics`, on one thread of its own, until dropped.
///
/// It is bounded in every way a client can push: [`MAX_CONNECTIONS`] at once and
/// [`MAX_PER_SOURCE`] from one address (more are answered `503` and closed), a request head of
/// at most 8 KiB, and [`CONNECTION_DEADLINE`] from accept to the answer's last byte (a slow
/// reader or writer is cut off). One thread, `poll(2)` over non-blocking sockets, no thread or
/// buffer per idle peer beyond its slot. Running out of descriptors (EMFILE) pauses accepting
/// for a moment and is counted; nothing ends the thread but the server's drop.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish()
    }
}

/// One connection being served.
struct Conn {
    stream: TcpStream,
    peer: IpAddr,
    deadline: Instant,
    head: Vec<u8>,
    /// The answer, once the head is read, and how much of it is written.
    answer: Option<(Vec<u8>, usize)>,
}

impl MetricsServer {
    /// Listens on `addr` (port 0: any free port; see [`MetricsServer::local_addr`]). An
    /// address other than loopback is allowed (a scraper on another host needs it); the
    /// caller should say so loudly, as [`is_exposed`] tells.
    pub fn start(addr: SocketAddr, source: Arc<dyn Source>) -> io::Result<MetricsServer> {
        let listener =
            TcpListener::bind(addr).map_err(|e| io::Error::new(e.kind(), format!("metrics on {addr}: {e}")))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread =
            std::thread::Builder::new().name("udpx-metrics".into()).spawn(move || serve(listener, source, &flag))?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether metrics on `addr` can be reached from other hosts (not loopback).
pub fn is_exposed(addr: SocketAddr) -> bool {
    !addr.ip().to_canonical().is_loopback()
}

/// A `--metrics` value: `PORT` (on 127.0.0.1), or `ADDR:PORT` / `[IPv6]:PORT`.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        format!(
            "{s:?}: give a port (served on 127.0.0.1) or an address with a port (0.0.0.0:9100 to serve other hosts)"
        )
    })
}

fn serve(listener: TcpListener, source: Arc<dyn Source>, stop: &AtomicBool) {
    let counters = Arc::new(HttpCounters::default());
    let source: Arc<dyn Source> = Arc::new(WithHttp { inner: source, http: counters.clone() });
    let mut conns: Vec<Conn> = Vec::new();
    let mut accept_paused_until: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let accepting = accept_paused_until.map_or(true, |t| now >= t);
        let mut fds = Vec::with_capacity(conns.len() + 1);
        fds.push(PollFd::new(listener.as_fd(), if accepting { PollFlags::POLLIN } else { PollFlags::empty() }));
        for c in &conns {
            let ev = if c.answer.is_some() { PollFlags::POLLOUT } else { PollFlags::POLLIN };
            fds.push(PollFd::new(c.stream.as_fd(), ev));
        }
        let timeout = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .chain([TICK])
            .min()
            .unwrap_or(TICK)
            .as_millis()
            .clamp(1, 100) as u16;
        let ready: Vec<PollFlags> = match poll(&mut fds, PollTimeout::from(timeout)) {
            Ok(_) => fds.iter().map(|f| f.revents().unwrap_or(PollFlags::empty())).collect(),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                log::warn!("udpx-metrics: poll: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        drop(fds);
        // Connections first (their indices are the poll's), then new ones.
        let mut keep = Vec::with_capacity(conns.len());
        for (c, rev) in conns.drain(..).zip(ready.iter().skip(1)) {
            if let Some(c) = step(c, *rev, &source, &counters) {
                keep.push(c);
            }
        }
        conns = keep;
        if ready[0].contains(PollFlags::POLLIN) {
            accept_all(&listener, &mut conns, &counters, &mut accept_paused_until);
        }
    }
}

/// Accepts what waits: each connection gets a slot, or a 503 when the server or its source
/// has no slot left.
fn accept_all(listener: &TcpListener, conns: &mut Vec<Conn>, counters: &HttpCounters, paused: &mut Option<Instant>) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let peer = peer.ip().to_canonical();
                let from_peer = conns.iter().filter(|c| c.peer == peer).count();
                if conns.len() >= MAX_CONNECTIONS || from_peer >= MAX_PER_SOURCE {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    // Best effort, without waiting: the socket's buffer takes this at once.
                    let _ = stream.set_nonblocking(true);
                    let _ = (&stream)
                        .write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    continue;
                }
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                counters.accepted.fetch_add(1, Ordering::Relaxed);
                conns.push(Conn {
                    stream,
                    peer,
                    deadline: Instant::now() + CONNECTION_DEADLINE,
                    head: Vec::new(),
                    answer: None,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors or memory, or a peer gone before accept: never fatal. A
                // pause keeps EMFILE from spinning (the pending connection stays queued).
                counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                log::debug!("udpx-metrics: accept: {e}");
                *paused = Some(Instant::now() + TICK);
                return;
            }
        }
    }
}

/// Moves one connection on after `rev`; `None` when it is finished or cut off.
fn step(mut c: Conn, rev: PollFlags, source: &Arc<dyn Source>, counters: &HttpCounters) -> Option<Conn> {
    if Instant::now() >= c.deadline {
        counters.timed_out.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    if rev.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL) {
        return None;
    }
    if c.answer.is_none() && rev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) {
        let mut buf = [0u8; 2048];
        loop {
            match (&c.stream).read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => {
                    c.head.extend_from_slice(&buf[..n]);
                    if c.head.len() > MAX_REQUEST {
                        c.answer = Some((status(431, "request head too large\n"), 0));
                        break;
                    }
                    if c.head.windows(4).any(|w| w == b"\r\n\r\n") || c.head.windows(2).any(|w| w == b"\n\n") {
                        c.answer = Some((answer(&c.head, source), 0));
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
    }
    if let Some((bytes, off)) = c.answer.as_mut() {
        loop {
            match (&c.stream).write(&bytes[*off..]) {
                Ok(0) => return None,
                Ok(n) => {
                    *off += n;
                    if *off == bytes.len() {
                        return None; // answered; closed on drop
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
    }
    Some(c)
}

/// The answer to a request head.
fn answer(head: &[u8], source: &Arc<dyn Source>) -> Vec<u8> {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if method != b"GET" || path != b"/metrics" {
        return status(404, "udpx: only GET /metrics is served here\n");
    }
    let body = render(source.clone());
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn status(code: u16, body: &str) -> Vec<u8> {
    let reason = match code {
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The server's source and the endpoint's own counters, served together.
struct WithHttp {
    inner: Arc<dyn Source>,
    http: Arc<HttpCounters>,
}

impl Source for WithHttp {
    fn sample(&self) -> Vec<ShardSample> {
        self.inner.sample()
    }

    fn global(&self) -> Vec<Extra> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = |name, help, value| Extra { name, help, value, gauge: false };
        let mut v = self.inner.global();
        v.extend([
            c("udpx_metrics_http_accepted", "Connections the metrics endpoint served", g(&self.http.accepted)),
            c(
                "udpx_metrics_http_refused",
                "Connections answered 503: over the endpoint's connection caps",
                g(&self.http.refused),
            ),
            c(
                "udpx_metrics_http_timed_out",
                "Connections cut off at the deadline (slow or idle peers)",
                g(&self.http.timed_out),
            ),
            c(
                "udpx_metrics_http_accept_errors",
                "Accept failures (out of descriptors), accepting paused",
                g(&self.http.accept_errors),
            ),
        ]);
        v
    }
}
