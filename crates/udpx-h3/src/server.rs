//! The HTTP/3 file server: its configuration, its start, its counters and metrics. On every
//! connection of every shard runs the responder (`responder.rs`): requests in,
//! responses out, and the bounds on what one peer can hold.
//!
//! The server advertises the flow-control credit a request needs, not a download's: a request
//! stream takes [`REQUEST_WINDOW`] and a connection [`CONNECTION_WINDOW`] of out-of-order data
//! (see [`crate::tls`]), and reads request field sections of at most [`MAX_FIELD_SECTION`].
//!
//! With early data on ([`ServeConfig::early_data`]), GET and HEAD are answered in 0-RTT and
//! anything else gets 425 Too Early (RFC 8470).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use udpx_quic::{HostCounters, Server, ServerConfig};

use crate::http::{HttpSnapshot, Site, SiteOptions};
use crate::responder::{Bounds, FileServer};
use crate::tcp::TcpServer;
use crate::tls::{pem_files, server_config, Tls};
use crate::Error;

pub use crate::cache::BLOCK;
pub use crate::http::CHUNK;
pub use crate::tls::{CONNECTION_WINDOW, DEFAULT_MAX_UDP_PAYLOAD, MAX_FIELD_SECTION, REQUEST_WINDOW};

/// How to serve: the QUIC server's settings ([`ServerConfig`], whole) and the HTTP/3 file
/// server's.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The QUIC host and its shards: address, I/O mode, GRO, shards, host ID, keys, caps,
    /// burst, coalescing, the deferred flush, zerocopy, removed hosts, the TLS key log
    /// (`host.keylog`, [`udpx_quic::keylog`]), which the HTTPS-over-TCP listener writes to too,
    /// and qlog (`host.qlog`, [`udpx_quic::qlog`]: needs the feature `qlog`).
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
    /// A response that takes less than [`MIN_PROGRESS`] bytes in this long is parked: it gives
    /// its open file back and waits for its client to read again (a paused video), then opens
    /// it again and goes on if the file did not change; parked past [`ServeConfig::park_timeout`],
    /// its stream is reset.
    pub stall_timeout: Duration,
    /// A parked response is reset (RESET_STREAM) after this long; its connection and other
    /// streams go on.
    pub park_timeout: Duration,
    /// A connection with no response under way and no new request for this long is closed
    /// (H3_NO_ERROR); it also bounds how long quiche holds request heads a peer leaves
    /// unfinished.
    pub idle_timeout: Duration,
    /// Also serve HTTPS over TCP here (HTTP/1.1 and HTTP/2, see [`crate::tcp`]) with the same
    /// certificate, rules and key log; its answers' `alt-svc` names the QUIC port: how a browser finds
    /// HTTP/3. `None` (the default): no TCP.
    pub alt_svc_tcp: Option<SocketAddr>,
    /// The HTTPS-over-TCP listener's bounds: connections at once and per address, the
    /// minimum rate (its window, the park and idle timeouts are `stall_timeout`,
    /// `park_timeout` and `idle_timeout`: one rule for both listeners).
    pub tcp_limits: crate::tcp::TcpLimits,
    /// The block cache's bound in bytes (`--cache-size`, [`crate::cache`]): HTTP/3 bodies
    /// read once into 256 KiB blocks shared by every response and shard. 0: off.
    pub cache_size: usize,
}

impl ServeConfig {
    /// `listen`, a self-signed certificate, `gso-mmsg`, GRO on, one shard, under BBRv2 with
    /// the window's burst ([`Cc::safe_burst`]).
    pub fn new(listen: SocketAddr) -> ServeConfig {
        let mut quic = ServerConfig::new(listen);
        quic.host.burst = Cc::Bbr2.safe_burst();
        ServeConfig {
            quic,
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
            park_timeout: DEFAULT_PARK_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            alt_svc_tcp: None,
            tcp_limits: crate::tcp::TcpLimits::default(),
            cache_size: 0,
        }
    }
}

/// The congestion controller quiche runs (`--cc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cc {
    /// CUBIC (quiche's own default), paced since quiche patch 0008 (`SendInfo.at` spaces a
    /// window's packets past a burst of ten; quiche 0.30 as published never paced it).
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
    /// bbr2`), quiche's quantum under CUBIC (unpaced, 64-packet bursts lost about 20 times
    /// more packets than 10-packet ones there; CUBIC paces since quiche patch 0008, not yet
    /// measured through that bottleneck with the window).
    pub fn safe_burst(self) -> udpx_quic::Burst {
        match self {
            Cc::Cubic => udpx_quic::Burst::Quantum,
            Cc::Bbr2 => udpx_quic::Burst::Window,
        }
    }

    /// Its name (`--cc`).
    pub fn name(self) -> &'static str {
        match self {
            Cc::Cubic => "cubic",
            Cc::Bbr2 => "bbr2",
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
        f.write_str(self.name())
    }
}

/// Responses with an open file one shard holds at most, by default.
pub const DEFAULT_MAX_OPEN_PER_SHARD: usize = 4096;
/// Of them, what the connections of one address may hold, by default: a sixteenth (256: a
/// household or a small NAT of players, each with a response or two under way), so that a
/// few addresses cannot hold a shard's files (with a quarter, four could: the third review).
/// A response that takes less than 16 KiB in the stall window gives its file back (parked), so
/// holding one costs a client at least 800 B/s of download.
pub const DEFAULT_MAX_OPEN_PER_ADDR: usize = DEFAULT_MAX_OPEN_PER_SHARD / 16;
/// The window in which a response must take [`MIN_PROGRESS`] bytes, by default: the TCP
/// listener's ([`crate::tcp::TcpLimits`]).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a parked response waits for its client, by default: a paused video resumes
/// within it; a parked response costs a few hundred bytes and no file.
pub const DEFAULT_PARK_TIMEOUT: Duration = Duration::from_secs(300);
pub use crate::responder::MIN_PROGRESS;
/// A connection with no response under way and no new request for this long is closed, by
/// default ([`ServeConfig::idle_timeout`]), as the TCP listener closes an idle connection (a
/// client that PINGs keeps a QUIC connection past quiche's 30 s idle timeout); nginx's
/// `keepalive_timeout` is 75 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's counters: QUIC host and HTTP.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServeCounters {
    /// The QUIC hosts, summed over shards.
    pub quic: HostCounters,
    /// HTTP.
    pub http: HttpSnapshot,
    /// The HTTPS-over-TCP listener's connections (`alt_svc_tcp`), if it runs.
    pub tcp: Option<crate::tcp::TcpSnapshot>,
    /// The block cache (`cache_size`), if on.
    pub cache: Option<crate::cache::CacheCounters>,
    /// The qlog writer (`quic.host.qlog`), if on.
    pub qlog: Option<udpx_quic::qlog::QlogCounters>,
}

/// A running server.
#[derive(Debug)]
pub struct H3Server {
    server: Server,
    site: Arc<Site>,
    generated_cert: bool,
    tcp: Option<TcpServer>,
    /// How the shards' quiche configurations are made, for a reload.
    quic_settings: QuicSettings,
    cache: Option<Arc<crate::cache::BlockCache>>,
    keylog: Option<udpx_quic::KeyLog>,
    qlog: Option<udpx_quic::Qlog>,
}

/// What a shard's quiche configuration is made from, besides the certificate.
#[derive(Debug, Clone)]
struct QuicSettings {
    tls: Tls,
    max_udp_payload: usize,
    early_data: bool,
    cc: Cc,
    grease: bool,
    shards: usize,
    /// How far ahead of its pacing time the host sends (its pacing slack).
    pacing_slack: std::time::Duration,
}

impl QuicSettings {
    /// One configuration per shard with the certificate and key of `files`.
    fn configs(&self, files: &crate::tls::PemFiles) -> Result<Vec<quiche::Config>, Error> {
        (0..self.shards)
            .map(|_| {
                let mut c = server_config(files, self.max_udp_payload)?;
                if self.early_data {
                    c.enable_early_data();
                }
                c.grease(self.grease);
                c.set_cc_algorithm(match self.cc {
                    Cc::Cubic => quiche::CongestionControlAlgorithm::CUBIC,
                    Cc::Bbr2 => quiche::CongestionControlAlgorithm::Bbr2Gcongestion,
                });
                if self.cc == Cc::Bbr2 && self.pacing_slack > udpx_quic::PACING_SLACK {
                    // A host that sends ahead of its pacer to serve fewer turns: BBRv2's
                    // window holds that much more at its bandwidth, or it limits each turn
                    // (quiche patch 0013).
                    let us = u64::try_from(self.pacing_slack.as_micros()).unwrap_or(u64::MAX);
                    c.set_custom_bbr_params(quiche::BbrParams {
                        ack_processing_delay_us: Some(us),
                        ..Default::default()
                    });
                }
                Ok(c)
            })
            .collect()
    }
}

/// Starts serving the files under `dir` (see the crate docs); returns once every shard
/// listens.
pub fn serve(dir: &Path, cfg: &ServeConfig) -> Result<H3Server, Error> {
    let site = Arc::new(Site::new(dir, &cfg.site)?);
    let files = pem_files(&cfg.tls)?;
    let site2 = site.clone();
    let max = cfg.max_udp_payload;
    cfg.quic.check().map_err(|e| Error::Usage(e.to_string()))?;
    if cfg.quic.host.qlog.is_some() && !udpx_quic::qlog::AVAILABLE {
        return Err(Error::Usage(
            "--qlog-dir: this udpx was built without qlog; build it with `--features qlog` (quiche's qlog costs an \
             allocation per packet sent even when no connection logs)"
                .into(),
        ));
    }
    if cfg.max_open_per_conn == 0 || cfg.max_open_per_shard == 0 || cfg.max_open_per_addr == 0 {
        return Err(Error::Usage(
            "--max-open-per-conn, --max-open-per-addr, --max-open-per-shard: give each at least 1".into(),
        ));
    }
    if cfg.stall_timeout.is_zero() || cfg.park_timeout.is_zero() || cfg.idle_timeout.is_zero() {
        return Err(Error::Usage(
            "--stall-timeout, --park-timeout, --idle-timeout: give a duration above zero, e.g. 20".into(),
        ));
    }
    let t = &cfg.tcp_limits;
    if t.max_connections == 0 || t.per_source == 0 || t.per_source > t.max_connections {
        return Err(Error::Usage(format!(
            "--tcp-max-connections {}, --tcp-per-source {}: give each at least 1, and the share of one address \
             at most the whole",
            t.max_connections, t.per_source
        )));
    }
    let quic_settings = QuicSettings {
        tls: cfg.tls.clone(),
        max_udp_payload: max,
        early_data: cfg.early_data,
        cc: cfg.cc,
        grease: cfg.grease,
        shards: cfg.quic.shards,
        pacing_slack: cfg.quic.host.pacing_slack,
    };
    let configs = quic_settings.configs(&files)?;
    let bounds = Bounds {
        per_conn: cfg.max_open_per_conn,
        per_addr: cfg.max_open_per_addr,
        per_shard: cfg.max_open_per_shard,
        per_shard_early: (cfg.max_open_per_shard / 8).max(1),
        stall: cfg.stall_timeout,
        park: cfg.park_timeout,
        idle: cfg.idle_timeout,
        cc: cfg.cc.name(),
    };
    // Everything that can fail must fail before an upgrade takes new connections over: the
    // HTTPS-over-TCP listener (the predecessor's socket, passed on, or a new one) is made and
    // its certificate loaded between asking for the handover and taking it.
    let mut starting = Server::prepare(&cfg.quic, cfg.alt_svc_tcp.is_some()).map_err(Error::Quic)?;
    let tcp = match cfg.alt_svc_tcp {
        Some(addr) => {
            let limits = crate::tcp::TcpLimits {
                window: cfg.stall_timeout,
                park: cfg.park_timeout,
                idle: cfg.idle_timeout,
                ..cfg.tcp_limits
            };
            Some(tcp_listener(&mut starting, addr, &files, limits, cfg.quic.host.keylog.clone())?)
        }
        None => None,
    };
    let pass_on = starting.pass_on();
    let cache = (cfg.cache_size > 0).then(|| Arc::new(crate::cache::BlockCache::new(cfg.cache_size)));
    let shared = cache.clone();
    let server = starting
        .start(configs, move |_shard| FileServer::new(site2.clone(), bounds, shared.clone()))
        .map_err(Error::Quic)?;
    site.set_alt_svc(server.local_addr().port());
    // Accepting from here: an upgrade's predecessor stops accepting from the same queue when
    // it drains.
    let tcp = match tcp {
        Some(ready) => Some(ready.run(site.clone(), &server.drain_signal(), pass_on)?),
        None => None,
    };
    drop(files); // loaded into every configuration: a generated one is removed now
    let (keylog, qlog) = (cfg.quic.host.keylog.clone(), cfg.quic.host.qlog.clone());
    Ok(H3Server { server, site, generated_cert: cfg.tls == Tls::SelfSigned, tcp, quic_settings, cache, keylog, qlog })
}

/// The HTTPS-over-TCP listener for `addr`: the one the predecessor passed on (an upgrade),
/// checked, or a new one; passed on in turn to this server's successor.
fn tcp_listener(
    starting: &mut udpx_quic::Starting,
    addr: SocketAddr,
    files: &crate::tls::PemFiles,
    limits: crate::tcp::TcpLimits,
    keylog: Option<udpx_quic::KeyLog>,
) -> Result<crate::tcp::PreparedTcp, Error> {
    let mut passed = starting.take_passed();
    let listener = match passed.len() {
        0 => crate::tcp::bind(addr)?,
        1 => crate::tcp::adopt(passed.remove(0), addr)?,
        n => {
            return Err(Error::Usage(format!(
                "upgrade: the running server passed {n} listening sockets on; this one takes one (--alt-svc-tcp)"
            )))
        }
    };
    let copy = listener.try_clone().map_err(Error::Io)?;
    let at = listener.local_addr().map_err(Error::Io)?;
    starting.pass_on().put(copy.into(), format!("its HTTPS-over-TCP listener on {at}")).map_err(Error::Quic)?;
    crate::tcp::PreparedTcp::new(listener, &files.cert, &files.key, limits, keylog)
}

impl H3Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The QUIC server underneath (its generation, whether it can be or was upgraded).
    pub fn quic(&self) -> &udpx_quic::Server {
        &self.server
    }

    /// Where HTTPS over TCP listens (`alt_svc_tcp`), if it does.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().map(TcpServer::local_addr)
    }

    /// The TLS key log both listeners write to, if on (to warn of it while it is).
    pub fn keylog(&self) -> Option<&udpx_quic::KeyLog> {
        self.keylog.as_ref()
    }

    /// The qlog writer, if on (to change which connections it logs: [`udpx_quic::Qlog::set_policy`]).
    pub fn qlog(&self) -> Option<&udpx_quic::Qlog> {
        self.qlog.as_ref()
    }

    /// Whether the certificate was generated (say so to the user).
    pub fn generated_cert(&self) -> bool {
        self.generated_cert
    }

    /// The counters so far (each shard publishes at most every 100 ms while it runs, and when
    /// it ends).
    pub fn counters(&self) -> ServeCounters {
        ServeCounters {
            quic: self.server.counters(),
            http: self.site.counters(),
            tcp: self.tcp.as_ref().map(TcpServer::counters),
            cache: self.cache.as_ref().map(|c| c.counters()),
            qlog: self.qlog.as_ref().map(udpx_quic::Qlog::counters),
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
        let source = crate::metrics::MetricsSource {
            probe: self.server.probe(),
            site: self.site.clone(),
            tcp: self.tcp.as_ref().map(TcpServer::probe),
            cache: self.cache.clone(),
            keylog: self.keylog.clone(),
            qlog: self.qlog.clone(),
        };
        udpx_metrics::MetricsServer::start(addr, Arc::new(source))
    }

    /// Whether every event loop still runs.
    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }

    /// Reads the certificate and key files again and gives every shard configurations made
    /// with them: connections made from then on get the new certificate, open ones carry on,
    /// and session tickets stay good (the ticket key is the service's, not the certificate's).
    /// A file that does not load leaves the one in force serving, and the error says why.
    /// (HTTPS over TCP keeps the certificate it started with.)
    pub fn reload_tls(&self) -> Result<(), Error> {
        if self.quic_settings.tls == Tls::SelfSigned {
            return Err(Error::Usage("no --cert/--key: the generated certificate has no files to read again".into()));
        }
        let files = pem_files(&self.quic_settings.tls)?;
        let configs = self.quic_settings.configs(&files)?;
        self.server.reload(configs).map_err(Error::Quic)
    }

    /// Opens the access log's file again (for logrotate; see [`Site::reopen_log`]): whether
    /// there was a file to reopen.
    pub fn reopen_log(&self) -> Result<bool, Error> {
        self.site.reopen_log()
    }

    /// Starts the graceful stop of the HTTP/3 listener ([`udpx_quic::Server::drain`]): no new
    /// connection is admitted (CONNECTION_REFUSED), each connection gets the two-step GOAWAY,
    /// finishes its responses and closes; the loops end when none is left or at `timeout`.
    /// [`H3Server::finished`] says when; then [`H3Server::stop`]. HTTPS over TCP, if on, drains
    /// with it: no longer accepting, GOAWAY to each HTTP/2 connection, each HTTP/1.1 one closed
    /// after its response, the rest closed at `timeout`. (A handover to an upgrade drains both
    /// the same way.)
    pub fn drain(&self, timeout: std::time::Duration) {
        self.server.drain(timeout);
    }

    /// Whether every HTTP/3 event loop has ended (after a drain: drained) and HTTPS over TCP,
    /// if on, has drained.
    pub fn finished(&self) -> bool {
        self.server.finished() && self.tcp.as_ref().is_none_or(TcpServer::drained)
    }

    /// A flag that stops the server when set (for a signal handler).
    pub fn stop_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.server.stop_flag()
    }

    /// Stops and returns the final counters.
    pub fn stop(self) -> Result<ServeCounters, Error> {
        let tcp = self.tcp.map(TcpServer::stop);
        let quic = self.server.stop().map_err(Error::Quic)?;
        if let Err(e) = self.site.flush_log() {
            log::warn!("udpx-h3: {e}");
        }
        // The shards are gone, and with them every connection's qlog writer: what they queued
        // is written now.
        if let Some(Err(e)) = self.qlog.as_ref().map(udpx_quic::Qlog::flush) {
            log::warn!("udpx-h3: {e}");
        }
        Ok(ServeCounters {
            quic,
            http: self.site.counters(),
            tcp,
            cache: self.cache.as_ref().map(|c| c.counters()),
            qlog: self.qlog.as_ref().map(udpx_quic::Qlog::counters),
        })
    }

    /// Waits (5 s at most) until the access log holds the line of every response finished so
    /// far (its lines are written by a thread of their own).
    pub fn flush_log(&self) -> Result<(), Error> {
        self.site.flush_log()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The third review: at the defaults no fewer than 16 addresses (IPv6: /64s) can hold a
    /// shard's open files (with a quarter each, four could).
    #[test]
    fn a_few_addresses_cannot_hold_a_shards_files_by_default() {
        let c = ServeConfig::new("127.0.0.1:443".parse().unwrap());
        assert!(
            c.max_open_per_addr * 16 <= c.max_open_per_shard,
            "{} of {}",
            c.max_open_per_addr,
            c.max_open_per_shard
        );
    }
}
