//! `get`: one HTTP/3 request on the same datapath as the server (a udpx socket, the same host
//! loop and I/O modes), for tests and the bench.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use quiche::h3::NameValue;
use serde::Serialize;
use udpx_quic::{client_socket, App, Host, HostCounters, HostSocket, IoMode};

use crate::tls::client_config;
use crate::tls::DEFAULT_MAX_UDP_PAYLOAD;
use crate::Error;

/// How to fetch.
#[derive(Debug, Clone)]
pub struct GetConfig {
    /// How packets leave.
    pub io: IoMode,
    /// Receive with GRO where available.
    pub gro: bool,
    /// Largest UDP payload sent.
    pub max_udp_payload: usize,
    /// HEAD instead of GET.
    pub head: bool,
    /// Request header fields added after the pseudo-headers (names are sent in lower case, as
    /// HTTP/3 requires).
    pub headers: Vec<(String, String)>,
    /// Another method than GET (or HEAD with `head`).
    pub method: Option<String>,
    /// A session from an earlier connection's report ([`GetReport::session`]): resume it, and
    /// send the request in 0-RTT when the server allows early data.
    pub session: Option<Vec<u8>>,
    /// The destination connection ID of the first Initial (e.g. to land on a given shard of
    /// the server through its steering byte); `None`: random.
    pub dcid: Option<Vec<u8>>,
    /// Read the body at most this many bytes a second (curl's `--limit-rate`): what is not read
    /// stays in quiche, and flow control holds the server back. `None`: as fast as it comes.
    pub limit_rate: Option<u64>,
}

impl Default for GetConfig {
    fn default() -> Self {
        GetConfig {
            io: IoMode::GsoMmsg,
            gro: true,
            max_udp_payload: DEFAULT_MAX_UDP_PAYLOAD,
            head: false,
            headers: Vec::new(),
            method: None,
            session: None,
            dcid: None,
            limit_rate: None,
        }
    }
}

/// What a fetch did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GetReport {
    /// HTTP status.
    pub status: u16,
    /// The response's header fields (without `:status`), in the order received.
    pub headers: Vec<(String, String)>,
    /// Body bytes received.
    pub bytes: u64,
    /// From the first packet to the end of the body.
    pub seconds: f64,
    /// Body bits per second over `seconds`, in Mbit/s.
    pub mbit_per_s: f64,
    /// The client host's counters.
    pub quic: HostCounters,
    /// The session the server gave (a ticket to resume with), if any.
    #[serde(skip)]
    pub session: Option<Vec<u8>>,
    /// The connection resumed a session.
    pub resumed: bool,
    /// The request went in early data (0-RTT).
    pub early_data: bool,
    /// PINGs sent because no part of the response arrived for [`QUIET_PING`] while it was
    /// incomplete.
    pub quiet_pings: u64,
}

/// While a response is incomplete and no part of it (header fields, body bytes) has arrived
/// for this long, the client sends a PING (once per such interval). quiche sends nothing when it has nothing in flight, so a
/// client waiting on a server whose packets no longer reach it (a NAT that dropped its
/// mapping) would stay silent until its idle timeout; the PING makes the NAT map it again, and
/// the server, seeing the client at a new address, carries on there (RFC 9000 9.3). It does
/// not extend the wait without bound: after [`QUIET_LIMIT`] without any part of the response
/// the fetch gives up (a server that acknowledges each PING restarts the idle timeout each
/// time, RFC 9000 10.1).
pub const QUIET_PING: Duration = Duration::from_secs(1);

/// The longest a fetch waits with no part of its response arriving: the connection's idle
/// timeout ([`crate::tls::IDLE_TIMEOUT_MS`]), which the quiet PINGs would otherwise defeat.
pub const QUIET_LIMIT: Duration = Duration::from_millis(crate::tls::IDLE_TIMEOUT_MS);

impl std::fmt::Display for GetReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {}, {} bytes in {:.3} s, {:.1} Mbit/s",
            self.status, self.bytes, self.seconds, self.mbit_per_s
        )
    }
}

/// A parsed `https://host[:port]/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// Host name or address (without brackets).
    pub host: String,
    /// Port (443 when absent).
    pub port: u16,
    /// Path and query, `/` when absent.
    pub path: String,
}

impl Url {
    /// Parses `s`.
    pub fn parse(s: &str) -> Result<Url, Error> {
        let bad = |why: &str| Error::Usage(format!("URL {s:?}: {why}; write it as https://HOST[:PORT]/PATH"));
        let rest = s.strip_prefix("https://").ok_or_else(|| bad("it does not start with https://"))?;
        let (auth, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = if let Some(v6) = auth.strip_prefix('[') {
            let end = v6.find(']').ok_or_else(|| bad("an IPv6 address lacks its ']'"))?;
            let port = v6[end + 1..].strip_prefix(':');
            (&v6[..end], port)
        } else {
            match auth.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (auth, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| bad("the port is not a number from 1 to 65535"))?,
            None => 443,
        };
        Ok(Url { host: host.to_string(), port, path: path.to_string() })
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Fetches `url`, writing the body to `out` (or discarding it), and reports.
pub fn get(url: &str, out: Option<&Path>, cfg: &GetConfig) -> Result<GetReport, Error> {
    let url = Url::parse(url)?;
    let peer: SocketAddr = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| Error::Usage(format!("host {:?}: {e}", url.host)))?
        .next()
        .ok_or_else(|| Error::Usage(format!("host {:?} has no address", url.host)))?;
    let sink: Box<dyn Write> = match out {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).map_err(|e| Error::Usage(format!("output file {}: {e}", p.display())))?,
        )),
        None => Box::new(std::io::sink()),
    };
    let socket = client_socket(peer, cfg.io, cfg.gro).map_err(Error::Quic)?;
    let mut config = client_config(cfg.max_udp_payload)?;
    if let Some(rate) = cfg.limit_rate.filter(|&r| r > 0) {
        // A rate-limited body holds the server back only if the window is small too: about a
        // quarter second of the rate (as a TCP receive buffer does for curl --limit-rate),
        // else quiche takes the whole body at once and the limit only paces the reading.
        let window = (rate / 4).clamp(RATE_BURST, crate::tls::STREAM_WINDOW);
        config.set_initial_max_stream_data_bidi_local(window);
        config.set_max_stream_window(window);
        config.set_initial_max_data(2 * window);
        config.set_max_connection_window(2 * window);
    }
    let method = match (&cfg.method, cfg.head) {
        (Some(m), _) => m.as_bytes().to_vec(),
        (None, true) => b"HEAD".to_vec(),
        (None, false) => b"GET".to_vec(),
    };
    let mut request = vec![
        quiche::h3::Header::new(b":method", &method),
        quiche::h3::Header::new(b":scheme", b"https"),
        quiche::h3::Header::new(b":authority", url.authority().as_bytes()),
        quiche::h3::Header::new(b":path", url.path.as_bytes()),
        quiche::h3::Header::new(b"user-agent", b"udpx-h3"),
    ];
    for (n, v) in &cfg.headers {
        request.push(quiche::h3::Header::new(n.to_ascii_lowercase().as_bytes(), v.as_bytes()));
    }
    let app = Fetch {
        request,
        h3: None,
        stream: None,
        status: None,
        headers: Vec::new(),
        body: Body {
            bytes: 0,
            sink,
            write_error: None,
            buf: vec![0; 64 * 1024],
            limit_rate: cfg.limit_rate.filter(|&r| r > 0),
            requested: Instant::now(),
        },
        done: false,
        close_reason: None,
        session: None,
        resumed: false,
        early_data: false,
        close_at: None,
        quiet_since: Instant::now(),
        heard_at: Instant::now(),
        quiet_pings: 0,
    };
    let mut host = Host::new(HostSocket::Own(Box::new(socket)), config, app, udpx_quic::Role::Client);
    let sni = url.host.parse::<std::net::IpAddr>().is_err().then_some(url.host.as_str());
    let start = Instant::now();
    host.connect_with(sni, peer, (), cfg.session.as_deref(), cfg.dcid.as_deref()).map_err(Error::Quic)?;
    host.run(&AtomicBool::new(false), udpx_quic::Until::Idle, None).map_err(Error::Quic)?;
    let seconds = start.elapsed().as_secs_f64();
    let quic = host.counters();
    let app = host.app_mut();
    if let Some(e) = app.body.write_error.take() {
        return Err(Error::Usage(format!("writing the body: {e}")));
    }
    app.body.sink.flush().map_err(|e| Error::Usage(format!("writing the body: {e}")))?;
    if !app.done && quic.datagrams_received == 0 && quic.icmp_errors > 0 {
        return Err(Error::Failed(format!(
            "{peer}: nothing listens there (ICMP port unreachable); is the server running on that port?"
        )));
    }
    if !app.done {
        let why = app.close_reason.clone().unwrap_or_else(|| "no reason given".into());
        return Err(Error::Failed(format!(
            "{}: the connection ended before the response was complete ({} body bytes): {why}",
            url.authority(),
            app.body.bytes
        )));
    }
    let bytes = app.body.bytes;
    Ok(GetReport {
        status: app.status.unwrap_or(0),
        headers: std::mem::take(&mut app.headers),
        bytes,
        seconds,
        mbit_per_s: bytes as f64 * 8.0 / seconds.max(1e-9) / 1e6,
        quic,
        session: app.session.take(),
        resumed: app.resumed,
        early_data: app.early_data,
        quiet_pings: app.quiet_pings,
    })
}

/// The client side: one request, its body into the sink.
struct Fetch {
    request: Vec<quiche::h3::Header>,
    h3: Option<quiche::h3::Connection>,
    stream: Option<u64>,
    status: Option<u16>,
    headers: Vec<(String, String)>,
    body: Body,
    done: bool,
    close_reason: Option<String>,
    session: Option<Vec<u8>>,
    resumed: bool,
    early_data: bool,
    /// When to close, once the response is whole.
    close_at: Option<Instant>,
    /// Since when no part of the response has arrived (the request's sending, at first), or
    /// the last quiet PING.
    quiet_since: Instant,
    /// When a part of the response last arrived (the request's sending, at first).
    heard_at: Instant,
    quiet_pings: u64,
}

/// The response body as it is read: where it goes, how much, how fast.
struct Body {
    bytes: u64,
    sink: Box<dyn Write>,
    write_error: Option<std::io::Error>,
    buf: Vec<u8>,
    /// The rate limit, bytes a second, and since when it counts (the request).
    limit_rate: Option<u64>,
    requested: Instant,
}

/// Bytes a rate-limited body may run ahead of its rate (one read's worth).
const RATE_BURST: u64 = 64 * 1024;
/// How often a rate-limited fetch looks for more of its body.
const RATE_TICK: Duration = Duration::from_millis(10);

impl Body {
    /// Bytes of body it may read now (all of them without a rate limit).
    fn allowance(&self, now: Instant) -> usize {
        match self.limit_rate {
            None => usize::MAX,
            Some(r) => {
                let allowed = (r as f64 * now.duration_since(self.requested).as_secs_f64()) as u64 + RATE_BURST;
                allowed.saturating_sub(self.bytes).min(usize::MAX as u64) as usize
            }
        }
    }

    /// Reads what stream `sid` holds, within the allowance, into the sink (a sink that fails
    /// cancels the request); whether anything came.
    fn read(&mut self, h3: &mut quiche::h3::Connection, conn: &mut udpx_quic::Connection, sid: u64) -> bool {
        let mut progress = false;
        loop {
            let want = self.buf.len().min(self.allowance(Instant::now()));
            if want == 0 {
                return progress;
            }
            let Ok(n) = h3.recv_body(conn, sid, &mut self.buf[..want]) else { return progress };
            progress = true;
            self.bytes += n as u64;
            if self.write_error.is_none() {
                if let Err(e) = self.sink.write_all(&self.buf[..n]) {
                    self.write_error = Some(e);
                    let _ = conn.close(true, 0x10c, b""); // H3_REQUEST_CANCELLED
                }
            }
        }
    }
}

impl Fetch {
    /// After a turn that brought part of the response (`progress`), restarts the quiet
    /// interval; past [`QUIET_PING`] without any, asks quiche for a PING and starts the next.
    fn ping_if_quiet(&mut self, conn: &mut udpx_quic::Connection, progress: bool) {
        let now = Instant::now();
        if progress {
            (self.quiet_since, self.heard_at) = (now, now);
        } else if now >= self.heard_at + QUIET_LIMIT {
            // A server that acknowledges each PING and sends nothing else would keep the
            // connection alive for ever: the fetch gives up.
            self.close_reason = Some(format!("no part of the response for {} s", QUIET_LIMIT.as_secs()));
            let _ = conn.close(true, 0x10c, b""); // H3_REQUEST_CANCELLED
        } else if now >= self.quiet_since + QUIET_PING {
            let _ = conn.send_ack_eliciting();
            self.quiet_since = now;
            self.quiet_pings += 1;
        }
    }
}

impl App for Fetch {
    type State = ();

    fn accepted(&mut self, _conn: &udpx_quic::Connection) {}

    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, _: &mut ()) {
        if self.done {
            // An answer that came in the server's first flight (0.5-RTT) can be whole in the
            // very turn the handshake completes: the close waits a turn, so the client's
            // Finished leaves first (closed at once, quiche sent neither and the connection
            // sat until its idle timeout).
            if conn.is_established() && !conn.is_closed() && self.close_at.is_some_and(|t| Instant::now() >= t) {
                let _ = conn.close(true, 0x100, b""); // H3_NO_ERROR
            }
            return;
        }
        if self.h3.is_none() {
            match quiche::h3::Connection::with_transport(
                conn,
                &quiche::h3::Config::new().expect("quiche's h3::Config::new cannot fail"),
            ) {
                Ok(h) => self.h3 = Some(h),
                Err(e) => {
                    self.close_reason = Some(format!("HTTP/3 setup failed: {e}"));
                    let _ = conn.close(true, 0x101, b"");
                    return;
                }
            }
        }
        let Some(h3) = self.h3.as_mut() else { return };
        if self.stream.is_none() {
            match h3.send_request(conn, &self.request, true) {
                Ok(id) => {
                    self.stream = Some(id);
                    (self.quiet_since, self.heard_at) = (Instant::now(), Instant::now());
                    self.body.requested = Instant::now();
                    self.early_data = conn.is_in_early_data();
                }
                Err(quiche::h3::Error::StreamBlocked) => return,
                Err(e) => {
                    self.close_reason = Some(format!("request refused: {e}"));
                    let _ = conn.close(true, 0x101, b"");
                    return;
                }
            }
        }
        let mut progress = false;
        // Data events come once per arrival: a rate-limited body left unread is read here, on
        // the fetch's own ticks, as its allowance grows.
        if let (Some(_), Some(sid)) = (self.body.limit_rate, self.stream) {
            // The server closed the connection (its response acknowledged whole): what quiche
            // holds of the body is read now, past the limit, before the connection is gone.
            if conn.is_draining() {
                self.body.limit_rate = None;
            }
            progress |= self.body.read(h3, conn, sid);
        }
        loop {
            match h3.poll(conn) {
                Ok((_, quiche::h3::Event::Headers { list, .. })) => {
                    progress = true;
                    for h in &list {
                        if h.name() == b":status" {
                            self.status = std::str::from_utf8(h.value()).ok().and_then(|s| s.parse().ok());
                        } else {
                            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                            self.headers.push((text(h.name()), text(h.value())));
                        }
                    }
                }
                Ok((sid, quiche::h3::Event::Data)) => {
                    progress |= self.body.read(h3, conn, sid);
                }
                Ok((_, quiche::h3::Event::Finished)) => {
                    self.done = true;
                    self.close_at = Some(Instant::now() + Duration::from_millis(1));
                    break;
                }
                Ok((_, quiche::h3::Event::Reset(code))) => {
                    self.close_reason = Some(format!("the server reset the stream (code {code:#x})"));
                    let _ = conn.close(true, 0x10c, b"");
                    break;
                }
                Ok(_) => {}
                Err(quiche::h3::Error::Done) => break,
                Err(e) => {
                    self.close_reason = Some(format!("HTTP/3: {e}"));
                    break;
                }
            }
        }
        if !self.done {
            self.ping_if_quiet(conn, progress);
        }
    }

    fn wake_at(&self, _: &()) -> Option<Instant> {
        // Done: the close is due (see on_turn). Waiting on the response: the next quiet PING.
        if self.done {
            return self.close_at;
        }
        let tick = self.body.limit_rate.map(|_| Instant::now() + RATE_TICK);
        self.stream.map(|_| tick.map_or(self.quiet_since + QUIET_PING, |t| t.min(self.quiet_since + QUIET_PING)))
    }

    fn closed(&mut self, conn: &udpx_quic::Connection, _: ()) {
        self.session = conn.session().map(<[u8]>::to_vec);
        self.resumed = conn.is_resumed();
        if self.close_reason.is_none() {
            self.close_reason = Some(if conn.is_timed_out() {
                format!(
                    "no answer within the idle timeout ({} s)",
                    Duration::from_millis(crate::tls::IDLE_TIMEOUT_MS).as_secs()
                )
            } else if let Some(e) = conn.peer_error() {
                format!("the peer closed it: error {:#x} {}", e.error_code, String::from_utf8_lossy(&e.reason))
            } else if let Some(e) = conn.local_error() {
                format!("closed here: error {:#x} {}", e.error_code, String::from_utf8_lossy(&e.reason))
            } else {
                // quiche ends a connection without an error frame on a stateless reset.
                "the server reset it (a stateless reset: the host that answered no longer has this \
                 connection)"
                    .into()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Url::parse("https://127.0.0.1:4433/a/b?c").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("127.0.0.1", 4433, "/a/b?c"));
        let u = Url::parse("https://[::1]:8443").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("::1", 8443, "/"));
        assert_eq!(u.authority(), "[::1]:8443");
        assert_eq!(Url::parse("https://example.org/x").unwrap().port, 443);
        for bad in ["http://x/", "https://:1/", "https://h:99999/", "https://[::1/"] {
            let e = Url::parse(bad).unwrap_err().to_string();
            assert!(e.contains("https://HOST[:PORT]/PATH"), "{e}");
        }
    }
}
