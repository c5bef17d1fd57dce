//! The HTTP/3 file server: an [`App`] on every connection of every shard.
//!
//! A connection is touched only when it has news (the host calls [`App::on_turn`] after its
//! packets, its timer, or while it sends): its HTTP/3 events are read (new requests are
//! answered at once, as far as their streams take), then the responses whose streams quiche
//! reports writable again (`stream_writable_next`) go on. A response blocked on flow control
//! or congestion is parked until its stream is writable, never polled.
//!
//! A response body is read from disk only as fast as the stream takes it: a response asks
//! quiche for its stream's capacity and reads at most that much, at most [`CHUNK`] bytes,
//! straight into a buffer quiche keeps (`send_body_zc` on [`udpx_quic::bufs`]), with the DATA
//! frame's header written in the room before it: the only user-space copy of a body byte
//! after the read is quiche's into a packet. quiche holds each chunk until it is
//! acknowledged; the shard then reuses its vector (a bounded pool), so in steady state no
//! chunk is allocated.
//!
//! Bounds: a response with a body holds an open file until it ends; a connection may hold
//! [`ServeConfig::max_open_per_conn`] of them, an address (IPv6: a /64)
//! [`ServeConfig::max_open_per_addr`] on a shard, and a shard [`ServeConfig::max_open_per_shard`];
//! past any of them the answer is 503 with `retry-after`. The count is carried by the open file
//! itself (`OpenFile`) and given back when it is dropped, so every way a response can end
//! (sent, reset by the peer, stalled, its connection closed) gives it back exactly once. A
//! request that arrives in 0-RTT (its address not yet proven: it may be forged and replayed)
//! claims from a smaller budget of its own, an eighth of the shard's (425 Too Early past it,
//! and the client asks again after its handshake). A connection one of whose responses took
//! less than [`MIN_PROGRESS`] bytes in [`ServeConfig::stall_timeout`] (a zero flow-control
//! window kept open with PINGs, or credit given a few bytes at a time) is closed
//! (H3_EXCESSIVE_LOAD) and its files with it, as the TCP listener closes a slow reader; so is
//! one with no response under way and no new request for [`IDLE_TIMEOUT`] (request heads a
//! peer leaves unfinished are held by quiche until then).
//!
//! A request stream has one response: a second HEADERS frame on it is the request's trailer
//! section (RFC 9114 4.1), read and ignored (`trailers` on /metrics); quiche refuses a third.
//! The server advertises the flow-control credit a request needs, not a download's: a request
//! stream takes [`REQUEST_WINDOW`] and a connection [`CONNECTION_WINDOW`] of out-of-order data
//! (see [`crate::tls`]). quiche's HTTP/3 layer copies an unfinished HEADERS frame out of the
//! stream (up to 1.5 x [`MAX_FIELD_SECTION`]) and gives its credit back, so what one connection
//! can pin is at most 100 streams x 24 KiB plus the window: about 2.4 MiB, for at most
//! [`IDLE_TIMEOUT`] unless it also completes requests.
//!
//! With early data on ([`ServeConfig::early_data`]), GET and HEAD are answered in 0-RTT and
//! anything else gets 425 Too Early (RFC 8470).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiche::h3::NameValue;
use serde::Serialize;
use udpx_quic::bufs::{Buf, BufPool};
use udpx_quic::{App, HostCounters, Server, ServerConfig};

use crate::http::{HttpSnapshot, LogEntry, RequestHead, Site, SiteOptions};
use crate::tcp::TcpServer;
use crate::tls::{pem_files, server_config, Tls};
use crate::Error;

pub use crate::http::CHUNK;
pub use crate::tls::{CONNECTION_WINDOW, MAX_FIELD_SECTION, REQUEST_WINDOW};

/// How to serve: the QUIC server's settings ([`ServerConfig`], whole) and the HTTP/3 file
/// server's.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The QUIC host and its shards: address, I/O mode, GRO, shards, host ID, keys, caps,
    /// burst, coalescing, the deferred flush, zerocopy, removed hosts.
    pub quic: ServerConfig,
    /// Certificate.
    pub tls: Tls,
    /// Largest UDP payload sent (quiche's `max_send_udp_payload_size`; the peer may ask for
    /// less).
    pub max_udp_payload: usize,
    /// Cache-control and the access log.
    pub site: SiteOptions,
    /// Accept 0-RTT (early data) from resuming clients: GET and HEAD only.
    pub early_data: bool,
    /// Send GREASE (RFC 9114 7.2.8, 6.2.3; RFC 9000 18.1: reserved frame, stream and
    /// parameter values that exercise a peer's handling of unknown ones). Off by default: the
    /// GREASE stream is an idle connection's eighth stream, and quiche's table of streams
    /// doubles at the eighth (about 3 KiB per connection, measured: `scripts/heap-h3.sh`).
    /// What peers send us is handled either way.
    pub grease: bool,
    /// The congestion controller.
    pub cc: Cc,
    /// Responses with an open file one connection may hold (503 past it).
    pub max_open_per_conn: usize,
    /// Responses with an open file one shard may hold (503 past it).
    pub max_open_per_shard: usize,
    /// Responses with an open file the connections of one address (IPv6: one /64) may hold on
    /// a shard (503 past it): one client cannot take the whole shard's bound.
    pub max_open_per_addr: usize,
    /// A connection one of whose responses takes less than [`MIN_PROGRESS`] bytes in this long
    /// is closed, and its files with it.
    pub stall_timeout: Duration,
    /// Also serve HTTPS over TCP here (HTTP/1.1 and HTTP/2, see [`crate::tcp`]) with the same
    /// certificate and rules; its answers' `alt-svc` names the QUIC port: how a browser finds
    /// HTTP/3. `None` (the default): no TCP.
    pub alt_svc_tcp: Option<SocketAddr>,
}

impl ServeConfig {
    /// `listen`, a self-signed certificate, `gso-mmsg`, GRO on, one shard, under BBRv2 with
    /// the window's burst ([`Cc::safe_burst`]).
    pub fn new(listen: SocketAddr) -> ServeConfig {
        ServeConfig {
            quic: ServerConfig { burst: Cc::Bbr2.safe_burst(), ..ServerConfig::new(listen) },
            tls: Tls::SelfSigned,
            max_udp_payload: DEFAULT_MAX_UDP_PAYLOAD,
            site: SiteOptions::default(),
            early_data: false,
            grease: false,
            cc: Cc::Bbr2,
            max_open_per_conn: crate::tls::MAX_STREAMS as usize,
            max_open_per_shard: DEFAULT_MAX_OPEN_PER_SHARD,
            max_open_per_addr: DEFAULT_MAX_OPEN_PER_ADDR,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            alt_svc_tcp: None,
        }
    }
}

/// The congestion controller quiche runs (`--cc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cc {
    /// CUBIC (quiche's own default): no pacing, `SendInfo.at` is always now.
    Cubic,
    /// BBRv2 on quiche's gcongestion (udpx's default): paces, so packets carry release times;
    /// its recovery state is about 3 KiB smaller per connection than CUBIC's.
    #[default]
    Bbr2,
}

impl Cc {
    /// How much a connection may write per turn under this controller (`--burst auto`):
    /// what the window allows under BBRv2, whose pacing spaces the packets (no loss through
    /// a 1 ms bottleneck queue, `udpx bench h3 --bottleneck 500 --bottleneck-buffer 1 --cc
    /// bbr2`), quiche's quantum under CUBIC, which does not pace (64-packet bursts lost about
    /// 20 times more packets than 10-packet ones there).
    pub fn safe_burst(self) -> udpx_quic::Burst {
        match self {
            Cc::Cubic => udpx_quic::Burst::Quantum,
            Cc::Bbr2 => udpx_quic::Burst::Window,
        }
    }
}

impl std::str::FromStr for Cc {
    type Err = String;
    fn from_str(s: &str) -> Result<Cc, String> {
        match s {
            "cubic" => Ok(Cc::Cubic),
            "bbr2" => Ok(Cc::Bbr2),
            _ => Err(format!("--cc {s:?}: give cubic or bbr2")),
        }
    }
}

impl std::fmt::Display for Cc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cc::Cubic => "cubic",
            Cc::Bbr2 => "bbr2",
        })
    }
}

/// An Ethernet MTU of 1500 less the IPv6 and UDP headers: fits both families on common paths.
pub const DEFAULT_MAX_UDP_PAYLOAD: usize = 1452;

/// Responses with an open file one shard holds at most, by default.
pub const DEFAULT_MAX_OPEN_PER_SHARD: usize = 4096;
/// Of them, what the connections of one address may hold, by default: a quarter, so that at
/// least four clients share a shard's files whatever one of them does.
pub const DEFAULT_MAX_OPEN_PER_ADDR: usize = DEFAULT_MAX_OPEN_PER_SHARD / 4;
/// The window in which a response must take [`MIN_PROGRESS`] bytes, by default: the TCP
/// listener's ([`crate::tcp::TcpLimits`]).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Bytes a response must take in each stall window (or end): the TCP listener's minimum rate
/// (16 KiB every 20 s, 800 B/s). A peer that opens its window a few bytes at a time does not
/// keep a response, and its file, for ever.
pub const MIN_PROGRESS: u64 = 16 << 10;
/// A connection with no response under way and no new request for this long is closed, as the
/// TCP listener closes an idle connection (a client that PINGs keeps a QUIC connection past
/// quiche's 30 s idle timeout).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's counters: QUIC host and HTTP.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServeCounters {
    /// The QUIC hosts, summed over shards.
    pub quic: HostCounters,
    /// HTTP.
    pub http: HttpSnapshot,
    /// The HTTPS-over-TCP listener's connections (`alt_svc_tcp`), if it runs.
    pub tcp: Option<crate::tcp::TcpSnapshot>,
}

/// A running server.
#[derive(Debug)]
pub struct H3Server {
    server: Server,
    site: Arc<Site>,
    generated_cert: bool,
    tcp: Option<TcpServer>,
}

/// Starts serving the files under `dir` (see the crate docs); returns once every shard
/// listens.
pub fn serve(dir: &Path, cfg: &ServeConfig) -> Result<H3Server, Error> {
    let site = Arc::new(Site::new(dir, &cfg.site)?);
    let files = pem_files(&cfg.tls)?;
    let site2 = site.clone();
    let max = cfg.max_udp_payload;
    cfg.quic.check().map_err(|e| Error::Usage(e.to_string()))?;
    if cfg.max_open_per_conn == 0 || cfg.max_open_per_shard == 0 || cfg.max_open_per_addr == 0 {
        return Err(Error::Usage(
            "--max-open-per-conn, --max-open-per-addr, --max-open-per-shard: give each at least 1".into(),
        ));
    }
    if cfg.stall_timeout.is_zero() {
        return Err(Error::Usage("--stall-timeout: give a duration above zero, e.g. 20s".into()));
    }
    let (early, cc, grease) = (cfg.early_data, cfg.cc, cfg.grease);
    let configs = (0..cfg.quic.shards)
        .map(|_| {
            let mut c = server_config(&files, max)?;
            if early {
                c.enable_early_data();
            }
            c.grease(grease);
            c.set_cc_algorithm(match cc {
                Cc::Cubic => quiche::CongestionControlAlgorithm::CUBIC,
                Cc::Bbr2 => quiche::CongestionControlAlgorithm::Bbr2Gcongestion,
            });
            Ok(c)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let bounds = Bounds {
        per_conn: cfg.max_open_per_conn,
        per_addr: cfg.max_open_per_addr,
        per_shard: cfg.max_open_per_shard,
        per_shard_early: (cfg.max_open_per_shard / 8).max(1),
        stall: cfg.stall_timeout,
    };
    let server = Server::start(&cfg.quic, configs, move |_shard| {
        let mut h3_config = quiche::h3::Config::new().expect("quiche's h3::Config::new cannot fail");
        // A request's field section at most this large (quiche refuses a HEADERS frame over
        // 1.5 times it with H3_EXCESSIVE_LOAD before buffering it).
        h3_config.set_max_field_section_size(MAX_FIELD_SECTION);
        FileServer {
            site: site2.clone(),
            scratch: vec![0; CHUNK],
            bodies: BufPool::new(CHUNK, BODY_BUFFERS_KEPT),
            h3_config,
            budget: Rc::new(Budget {
                site: site2.clone(),
                shard: Cell::new(0),
                early: Cell::new(0),
                by_addr: RefCell::default(),
            }),
            bounds,
        }
    })
    .map_err(Error::Quic)?;
    site.set_alt_svc(server.local_addr().port());
    let tcp = match cfg.alt_svc_tcp {
        Some(addr) => Some(TcpServer::start(addr, &files.cert, &files.key, site.clone())?),
        None => None,
    };
    drop(files); // loaded into every configuration: a generated one is removed now
    Ok(H3Server { server, site, generated_cert: cfg.tls == Tls::SelfSigned, tcp })
}

impl H3Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Where HTTPS over TCP listens (`alt_svc_tcp`), if it does.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().map(TcpServer::local_addr)
    }

    /// Whether the certificate was generated (say so to the user).
    pub fn generated_cert(&self) -> bool {
        self.generated_cert
    }

    /// The counters so far (each shard publishes when it is about to wait).
    pub fn counters(&self) -> ServeCounters {
        ServeCounters {
            quic: self.server.counters(),
            http: self.site.counters(),
            tcp: self.tcp.as_ref().map(TcpServer::counters),
        }
    }

    /// Queues a send fault on shard `shard`'s socket (test builds, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, shard: usize, fault: udpx::Fault) {
        self.server.inject_fault(shard, fault);
    }

    /// Serves the counters as Prometheus text on `addr` (`GET /metrics`) until the returned
    /// server is dropped: each shard's socket and QUIC counters, and the HTTP responses by
    /// status class (every listener's).
    pub fn serve_metrics(&self, addr: SocketAddr) -> std::io::Result<udpx_metrics::MetricsServer> {
        let source = MetricsSource {
            probe: self.server.probe(),
            site: self.site.clone(),
            tcp: self.tcp.as_ref().map(TcpServer::probe),
        };
        udpx_metrics::MetricsServer::start(addr, Arc::new(source))
    }

    /// Whether every event loop still runs.
    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }

    /// A flag that stops the server when set (for a signal handler).
    pub fn stop_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.server.stop_flag()
    }

    /// Stops and returns the final counters.
    pub fn stop(self) -> Result<ServeCounters, Error> {
        let tcp = self.tcp.map(TcpServer::stop);
        let quic = self.server.stop().map_err(Error::Quic)?;
        Ok(ServeCounters { quic, http: self.site.counters(), tcp })
    }
}

/// What a scrape of `serve_metrics` reads.
struct MetricsSource {
    probe: udpx_quic::ServerProbe,
    site: Arc<Site>,
    tcp: Option<crate::tcp::TcpProbe>,
}

/// `quic_<name>` for every host count, made once: metric names are `'static` (a bounded set,
/// the host's fields).
static QUIC_NAMES: std::sync::OnceLock<HashMap<&'static str, &'static str>> = std::sync::OnceLock::new();

fn quic_names(h: &HostCounters) -> HashMap<&'static str, &'static str> {
    h.fields_with_help().into_iter().map(|(n, _, _)| (n, &*Box::leak(format!("quic_{n}").into_boxed_str()))).collect()
}

impl udpx_metrics::Source for MetricsSource {
    fn sample(&self) -> Vec<udpx_metrics::ShardSample> {
        self.probe
            .sample()
            .into_iter()
            .map(|s| {
                let h = &s.host;
                let names = QUIC_NAMES.get_or_init(|| quic_names(h));
                udpx_metrics::ShardSample {
                    socket: s.socket,
                    kernel_drops: s.kernel_drops,
                    icmp_offenders: s.icmp_offenders,
                    // Every host count, as `quic_<name>` (levels as gauges): one list, the
                    // host's own, so a counter added there is served here.
                    extra: h
                        .fields_with_help()
                        .into_iter()
                        .map(|(name, help, value)| udpx_metrics::Extra {
                            name: names.get(name).copied().unwrap_or("quic_unnamed"),
                            help: help.trim(),
                            value,
                            gauge: HostCounters::is_level(name),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn global(&self) -> Vec<udpx_metrics::Extra> {
        let h = self.site.counters();
        let c = |name, help, value| udpx_metrics::Extra { name, help, value, gauge: false };
        let mut out = vec![
            c("http_requests", "HTTP requests whose head arrived (every listener)", h.requests),
            c("http_responses_1xx", "Responses with a 1xx status", h.by_class[0]),
            c("http_responses_2xx", "Responses with a 2xx status (200, 206)", h.by_class[1]),
            c("http_responses_3xx", "Responses with a 3xx status (301, 304)", h.by_class[2]),
            c("http_responses_4xx", "Responses with a 4xx status", h.by_class[3]),
            c("http_responses_5xx", "Responses with a 5xx status", h.by_class[4]),
            c("http_partial", "206 responses (byte ranges)", h.partial),
            c("http_not_modified", "304 responses", h.not_modified),
            c("http_range_not_satisfiable", "416 responses", h.range_not_satisfiable),
            c("http_body_bytes", "Body bytes the transports took", h.body_bytes),
            c("http_incomplete", "Responses not sent whole (reset, stopped, connection gone)", h.incomplete),
            c(
                "http_unavailable",
                "503 responses: out of file descriptors, or an open-file bound reached",
                h.unavailable,
            ),
            udpx_metrics::Extra {
                name: "open_files",
                help: "HTTP/3 responses holding an open file now",
                value: h.open_files,
                gauge: true,
            },
            c(
                "http_stalled",
                "HTTP/3 responses ended with their connection: one stalled (too few bytes taken)",
                h.stalled,
            ),
            c("http_trailers", "Trailer sections on requests, read and ignored", h.trailers),
            c(
                "http_idle_closed",
                "HTTP/3 connections closed after the idle timeout (no request, no response)",
                h.idle_closed,
            ),
        ];
        if let Some(t) = self.tcp.as_ref().map(crate::tcp::TcpProbe::snapshot) {
            out.extend([
                c("tcp_connections", "HTTPS-over-TCP connections accepted (--alt-svc-tcp)", t.connections),
                c("tcp_tls_failed", "HTTPS-over-TCP connections whose TLS handshake failed", t.tls_failed),
                c("tcp_http2_connections", "HTTPS-over-TCP connections that chose HTTP/2", t.http2),
                c(
                    "tcp_per_source_refused",
                    "HTTPS-over-TCP connections closed at once: their address had its share",
                    t.per_source_refused,
                ),
                c("tcp_too_slow", "HTTPS-over-TCP connections closed for taking a response too slowly", t.too_slow),
                c("tcp_idle_closed", "HTTPS-over-TCP connections closed after the idle timeout", t.idle_closed),
                c("tcp_accept_errors", "HTTPS-over-TCP accepts that failed (out of descriptors)", t.accept_errors),
            ]);
        }
        out
    }
}

struct FileServer {
    /// Body chunks quiche takes without copying ([`udpx_quic::bufs`]), reused once acknowledged.
    bodies: BufPool,
    site: Arc<Site>,
    scratch: Vec<u8>,
    h3_config: quiche::h3::Config,
    /// The shard's open files, by address and in all.
    budget: Rc<Budget>,
    bounds: Bounds,
}

/// The open-file bounds and the stall timeout ([`ServeConfig`]).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    per_conn: usize,
    per_addr: usize,
    per_shard: usize,
    /// Of the shard's, what requests that came in 0-RTT may hold.
    per_shard_early: usize,
    stall: Duration,
}

/// One shard's open files: how many in all and per address. Only [`OpenFile`] changes it.
struct Budget {
    site: Arc<Site>,
    shard: Cell<usize>,
    /// Of them, those taken by requests in 0-RTT.
    early: Cell<usize>,
    /// Addresses holding at least one (an entry leaves at zero: bounded by the files open).
    by_addr: RefCell<HashMap<IpAddr, usize>>,
}

/// A response's claim on the open-file bounds: taken with its file, given back (connection,
/// address, shard, the `open_files` gauge) when dropped, whichever way the response ends.
struct OpenFile {
    budget: Rc<Budget>,
    conn: Rc<Cell<usize>>,
    addr: IpAddr,
    /// Taken by a request in 0-RTT (counted in the early budget too).
    early: bool,
}

impl OpenFile {
    /// Takes one, or `None` when the connection, the address or the shard holds its bound (or,
    /// for a request in 0-RTT, the shard's early budget).
    fn take(budget: &Rc<Budget>, conn: &Rc<Cell<usize>>, addr: IpAddr, b: &Bounds, early: bool) -> Option<OpenFile> {
        let held_by_addr = budget.by_addr.borrow().get(&addr).copied().unwrap_or(0);
        if conn.get() >= b.per_conn
            || held_by_addr >= b.per_addr
            || budget.shard.get() >= b.per_shard
            || (early && budget.early.get() >= b.per_shard_early)
        {
            return None;
        }
        conn.set(conn.get() + 1);
        budget.shard.set(budget.shard.get() + 1);
        if early {
            budget.early.set(budget.early.get() + 1);
        }
        *budget.by_addr.borrow_mut().entry(addr).or_insert(0) += 1;
        budget.site.file_opened();
        Some(OpenFile { budget: budget.clone(), conn: conn.clone(), addr, early })
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        self.conn.set(self.conn.get().saturating_sub(1));
        self.budget.shard.set(self.budget.shard.get().saturating_sub(1));
        if self.early {
            self.budget.early.set(self.budget.early.get().saturating_sub(1));
        }
        let mut by_addr = self.budget.by_addr.borrow_mut();
        if let Some(n) = by_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                by_addr.remove(&self.addr);
            }
        }
        self.budget.site.file_closed();
    }
}

/// A response being sent.
struct Response {
    /// Headers not yet taken by quiche (a full stream refuses them).
    headers: Option<Vec<quiche::h3::Header>>,
    /// The headers end the stream (HEAD, no body, errors).
    fin_with_headers: bool,
    body: Option<Body>,
    /// For the access log (the target cut to [`LOGGED_TARGET`] bytes).
    method: String,
    target: String,
    status: u16,
    started: Instant,
    /// Body bytes quiche took.
    sent: u64,
    /// When it last made progress (headers taken, or [`MIN_PROGRESS`] body bytes since the
    /// last time): the stall timeout counts from here.
    progressed: Instant,
    /// Body bytes taken since `progressed`.
    unstamped: u64,
}

struct Body {
    file: File,
    /// Bytes of the range not yet read.
    left: u64,
    /// Read, not yet (all) taken by quiche.
    pending: Option<Buf>,
    /// Given back with the file.
    _claim: OpenFile,
}

struct ConnState {
    h3: Option<quiche::h3::Connection>,
    peer: SocketAddr,
    /// The address its files count against (IPv6: the /64).
    addr: IpAddr,
    /// Responses under way, by stream.
    responses: HashMap<u64, Response>,
    /// Request streams whose request was answered and whose request side has not ended: a
    /// HEADERS frame on one of them is a trailer section. At most the streams the peer may
    /// have open (an entry leaves at `Finished`, `Reset` or with the connection).
    requests: Vec<u64>,
    /// Of the responses, those with an open file.
    open: Rc<Cell<usize>>,
    /// When the earliest parked response may pass the stall timeout (`None`: none parked).
    stall_check: Option<Instant>,
    /// When the last request head arrived (or the connection was accepted): with no response
    /// under way, the connection is closed at [`IDLE_TIMEOUT`] after it.
    last_request: Instant,
}

/// Bytes of a request target kept for the access log.
const LOGGED_TARGET: usize = 1024;

/// H3_NO_ERROR (RFC 9114 8.1): an idle connection closed.
const H3_NO_ERROR: u64 = 0x100;
/// H3_EXCESSIVE_LOAD (RFC 9114 8.1): a connection closed for a stalled response.
const H3_EXCESSIVE_LOAD: u64 = 0x107;
/// H3_REQUEST_CANCELLED (RFC 9114 8.1): the peer reset its request; the response goes too.
const H3_REQUEST_CANCELLED: u64 = 0x10c;

impl App for FileServer {
    type State = ConnState;

    fn accepted(&mut self, conn: &udpx_quic::Connection) -> ConnState {
        let peer = conn.path_stats().next().map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |p| p.peer_addr);
        ConnState {
            h3: None,
            peer,
            addr: udpx_quic::admission::ip_key(peer.ip()),
            responses: HashMap::new(),
            requests: Vec::new(),
            open: Rc::new(Cell::new(0)),
            stall_check: None,
            last_request: Instant::now(),
        }
    }

    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, st: &mut ConnState) {
        if st.h3.is_none() {
            match quiche::h3::Connection::with_transport(conn, &self.h3_config) {
                Ok(h) => st.h3 = Some(h),
                Err(e) => {
                    log::debug!("udpx-h3: {}: HTTP/3 refused: {e}", conn.trace_id());
                    let _ = conn.close(false, 0x101, b"h3 setup failed");
                    return;
                }
            }
        }
        let now = Instant::now();
        // The host may fire a deadline up to its pacing slack early: a check due within it is
        // due now (else the same deadline comes back at once, a spin).
        let due = now + udpx_quic::PACING_SLACK;
        if st.stall_check.is_some_and(|t| t <= due) && self.close_if_stalled(conn, st, now) {
            return;
        }
        if st.responses.is_empty() && st.last_request + IDLE_TIMEOUT <= due {
            self.site.count_idle_closed();
            let _ = conn.close(true, H3_NO_ERROR, b"idle");
            return;
        }
        let Some(h3) = st.h3.as_mut() else { return };
        // New requests and stream events. Every HTTP/3 event comes from stream data, and the
        // loop polls until quiche has no event left (its queue of finished streams included):
        // with no stream readable (the turn of a PING or an acknowledgement) there is nothing
        // to poll, and `poll` would still look up the peer's three control streams.
        let mut fresh: Vec<u64> = Vec::new();
        if conn.is_readable() {
            loop {
                match h3.poll(conn) {
                    Ok((sid, quiche::h3::Event::Headers { list, .. })) => {
                        if st.requests.contains(&sid) {
                            // The request's trailers (RFC 9114 4.1): its response is made.
                            self.site.count_trailers();
                            continue;
                        }
                        st.requests.push(sid);
                        st.last_request = now;
                        let r = self.respond(&list, conn.is_in_early_data(), &st.open, st.addr, now);
                        st.responses.insert(sid, r);
                        fresh.push(sid);
                    }
                    Ok((sid, quiche::h3::Event::Data)) => {
                        // A request body: not used by GET or HEAD; read and dropped.
                        while let Ok(n) = h3.recv_body(conn, sid, &mut self.scratch) {
                            if n == 0 {
                                break;
                            }
                        }
                    }
                    Ok((sid, quiche::h3::Event::Finished)) => st.requests.retain(|&s| s != sid),
                    Ok((sid, quiche::h3::Event::Reset(_))) => {
                        st.requests.retain(|&s| s != sid);
                        if let Some(r) = st.responses.remove(&sid) {
                            self.finish(st.peer, r, false);
                        }
                        // Our side of the stream ends too, and quiche's HTTP/3 layer forgets
                        // it (it does so only on a send that fails on a finished stream).
                        let _ = conn.stream_shutdown(sid, quiche::Shutdown::Write, H3_REQUEST_CANCELLED);
                        let _ = h3.send_body(conn, sid, &[], true);
                    }
                    Ok(_) => {}
                    Err(quiche::h3::Error::Done) => break,
                    Err(e) => {
                        log::debug!("udpx-h3: {}: {e}", conn.trace_id());
                        break;
                    }
                }
            }
        }
        // The new responses go as far as their streams take them; then the parked ones whose
        // streams quiche says are writable again. No other response is looked at.
        let writable = std::iter::from_fn(|| conn.stream_writable_next()).collect::<Vec<u64>>();
        for sid in fresh.into_iter().chain(writable) {
            let Some(r) = st.responses.get_mut(&sid) else { continue };
            let outcome = progress(h3, conn, sid, r, &mut self.bodies, now);
            match outcome {
                Ok(false) => {
                    // Parked: it must move again within the stall timeout.
                    let check = r.progressed + self.bounds.stall;
                    st.stall_check = Some(st.stall_check.map_or(check, |t| t.min(check)));
                }
                _ => {
                    if let Some(r) = st.responses.remove(&sid) {
                        self.finish(st.peer, r, outcome.is_ok());
                    }
                }
            }
        }
    }

    fn wake_at(&self, st: &ConnState) -> Option<Instant> {
        let idle = st.responses.is_empty().then_some(st.last_request + IDLE_TIMEOUT);
        [st.stall_check, idle].into_iter().flatten().min()
    }

    fn closed(&mut self, _conn: &udpx_quic::Connection, mut state: ConnState) {
        // Responses still under way when the connection ended were not sent whole.
        for (_, r) in state.responses.drain() {
            self.finish(state.peer, r, false);
        }
    }
}

impl FileServer {
    /// The response to a request head: `early`, it came in 0-RTT; `conn_open` and `addr`, what
    /// its connection and address hold of the open-file bounds.
    fn respond(
        &self,
        list: &[quiche::h3::Header],
        early: bool,
        conn_open: &Rc<Cell<usize>>,
        addr: IpAddr,
        now: Instant,
    ) -> Response {
        let (mut method, mut path) = (None, None);
        let mut fields = Vec::with_capacity(list.len());
        for h in list {
            match h.name() {
                b":method" => method = Some(h.value()),
                b":path" => path = Some(h.value()),
                n if n.starts_with(b":") => {}
                n => fields.push((n, h.value())),
            }
        }
        let text = |b: Option<&[u8]>| {
            let b = b.unwrap_or(b"-");
            String::from_utf8_lossy(&b[..b.len().min(LOGGED_TARGET)]).into_owned()
        };
        let safe = matches!(method, Some(b"GET" | b"HEAD"));
        // A claim on the bounds first, so that no file is opened past them.
        let claim = OpenFile::take(&self.budget, conn_open, addr, &self.bounds, early);
        let mut answer = match (method, path) {
            // Early data can be replayed: only safe methods are answered from it (RFC 8470),
            // and only within the early budget (the client asks again after its handshake).
            _ if early && !safe => self.site.refuse(425),
            (Some(_), Some(_)) if early && claim.is_none() => self.site.refuse(425),
            (Some(_), Some(_)) if claim.is_none() => self.site.refuse(503),
            (Some(m), Some(p)) => self.site.answer(&RequestHead { method: m, path: p, headers: &fields }),
            // Without :method or :path the request is malformed (RFC 9114 4.3.1).
            _ => self.site.answer(&RequestHead { method: b"GET", path: b"", headers: &[] }),
        };
        if early {
            self.site.count_early();
        }
        let status = answer.status;
        let mut headers = Vec::with_capacity(answer.headers.len() + 1);
        headers.push(quiche::h3::Header::new(b":status", status.to_string().as_bytes()));
        for (n, v) in &answer.headers {
            headers.push(quiche::h3::Header::new(n.as_bytes(), v.as_bytes()));
        }
        // The claim goes with a body; a response without one gives it back here.
        let body = match (answer.body.take(), claim) {
            (Some(b), Some(claim)) => Some(Body { file: b.file, left: b.len, pending: None, _claim: claim }),
            _ => None,
        };
        Response {
            headers: Some(headers),
            fin_with_headers: body.is_none(),
            body,
            method: text(method),
            target: text(path),
            status,
            started: now,
            sent: 0,
            progressed: now,
            unstamped: 0,
        }
    }

    /// A response is over: logged and counted; dropping it closes its file and gives back its
    /// claim.
    fn finish(&mut self, peer: SocketAddr, r: Response, complete: bool) {
        self.site.finished(&LogEntry {
            peer,
            method: &r.method,
            path: &r.target,
            status: r.status,
            bytes: r.sent,
            duration: r.started.elapsed(),
            protocol: "h3",
            complete,
        });
    }

    /// Closes the connection when one of its responses made no progress for the stall timeout
    /// (its responses end now, their files closed; true); else sets the next check. Runs at
    /// most once per stall timeout per connection with parked responses (its `wake_at`), over
    /// that connection's responses only. Closing, not resetting the stream: quiche's HTTP/3
    /// layer would keep a reset stream's state.
    fn close_if_stalled(&mut self, conn: &mut udpx_quic::Connection, st: &mut ConnState, now: Instant) -> bool {
        let stall = self.bounds.stall;
        let due = now + udpx_quic::PACING_SLACK;
        if st.responses.values().any(|r| r.progressed + stall <= due) {
            for (_, r) in st.responses.drain() {
                self.site.count_stalled();
                self.finish(st.peer, r, false);
            }
            st.requests.clear();
            st.stall_check = None;
            let _ = conn.close(true, H3_EXCESSIVE_LOAD, b"response stalled");
            return true;
        }
        st.stall_check = st.responses.values().map(|r| r.progressed + stall).min();
        false
    }
}

/// The longest HTTP/3 DATA frame header: its type (one byte) and its length (a varint, at
/// most 8 bytes).
const DATA_HEADER_MAX: usize = 9;

/// Body chunk vectors a shard keeps for reuse (each [`CHUNK`] bytes: 16 MiB); past them a
/// chunk is a vector of its own, freed once acknowledged.
const BODY_BUFFERS_KEPT: usize = 256;

/// The DATA frame header of a `len`-byte body chunk, as quiche writes it (type 0x00, then the
/// length as a QUIC varint): its bytes and how many.
fn data_header(len: usize) -> ([u8; DATA_HEADER_MAX], usize) {
    let mut h = [0u8; DATA_HEADER_MAX];
    let len = len as u64;
    let n = if len < 1 << 6 {
        h[1] = len as u8;
        1
    } else if len < 1 << 14 {
        h[1..3].copy_from_slice(&((len as u16) | 0x4000).to_be_bytes());
        2
    } else if len < 1 << 30 {
        h[1..5].copy_from_slice(&((len as u32) | 0x8000_0000).to_be_bytes());
        4
    } else {
        h[1..9].copy_from_slice(&(len | 0xc000_0000_0000_0000).to_be_bytes());
        8
    };
    (h, 1 + n)
}

/// Moves a response on as far as the stream takes it, counting the body bytes taken in
/// `r.sent`. `Ok(true)`: done; `Err(())`: the stream is gone (reset, stopped) or the file
/// failed.
fn progress(
    h3: &mut quiche::h3::Connection,
    conn: &mut udpx_quic::Connection,
    sid: u64,
    r: &mut Response,
    pool: &mut BufPool,
    now: Instant,
) -> Result<bool, ()> {
    if let Some(h) = r.headers.take() {
        match h3.send_response(conn, sid, &h, r.fin_with_headers) {
            Ok(()) => r.progressed = now,
            Err(quiche::h3::Error::StreamBlocked | quiche::h3::Error::Done) => {
                r.headers = Some(h);
                return Ok(false);
            }
            Err(_) => return Err(()),
        }
    }
    let Some(b) = r.body.as_mut() else { return Ok(true) };
    loop {
        if b.pending.is_none() {
            if b.left == 0 {
                return Ok(true);
            }
            let cap = match conn.stream_capacity(sid) {
                Ok(c) => c,
                Err(_) => return Err(()),
            };
            // Room for the DATA frame's header too, so the chunk goes whole, in one frame.
            if cap <= DATA_HEADER_MAX {
                // Parked: quiche reports the stream writable again once it can take this.
                let _ = conn.stream_writable(sid, DATA_HEADER_MAX + 1);
                return Ok(false);
            }
            let n = ((cap - DATA_HEADER_MAX).min(pool.size()) as u64).min(b.left) as usize;
            let (header, hlen) = data_header(n);
            // The file read straight into the buffer quiche keeps: no copy before the packet.
            match pool.fill(n, &header[..hlen], |s| b.file.read_exact(s)) {
                Ok(buf) => b.pending = Some(buf),
                Err(_) => {
                    // The file shrank or failed under us: the stream cannot be completed honestly.
                    let _ = conn.stream_shutdown(sid, quiche::Shutdown::Write, 0x102);
                    return Err(());
                }
            }
            b.left -= n as u64;
        }
        let fin = b.left == 0;
        let buf = b.pending.as_mut().expect("filled above");
        let len = buf.len();
        match h3.send_body_zc(conn, sid, buf, fin) {
            Ok(w) => {
                r.sent += w as u64;
                r.unstamped += w as u64;
                if r.unstamped >= MIN_PROGRESS {
                    (r.progressed, r.unstamped) = (now, 0);
                }
                if w < len {
                    return Ok(false); // `buf` is what is left of the chunk
                }
                b.pending = None;
                if fin {
                    return Ok(true);
                }
            }
            Err(quiche::h3::Error::Done | quiche::h3::Error::StreamBlocked) => return Ok(false),
            Err(_) => return Err(()),
        }
    }
}

#[cfg(test)]
mod body_tests {
    use super::data_header;

    #[test]
    fn data_headers_are_quiches_varints() {
        let h = |n| {
            let (b, len) = data_header(n);
            b[..len].to_vec()
        };
        assert_eq!(h(0), [0x00, 0x00]);
        assert_eq!(h(63), [0x00, 0x3f]);
        assert_eq!(h(64), [0x00, 0x40, 0x40]);
        assert_eq!(h(16_383), [0x00, 0x7f, 0xff]);
        assert_eq!(h(16_384), [0x00, 0x80, 0x00, 0x40, 0x00]);
        assert_eq!(h(65_536), [0x00, 0x80, 0x01, 0x00, 0x00]);
    }
}
