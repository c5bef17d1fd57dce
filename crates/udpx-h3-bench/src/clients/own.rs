//! `udpx h3 load`: many HTTP/3 clients in one event loop, each behaving like a video player:
//! it fetches a segment, then the next one interval after it asked for the previous (at once
//! when that one was late), for as long as the run lasts.
//!
//! ```text
//!  one socket bound to the unspecified address, IP_PKTINFO: each connection sends from one of
//!  the given local addresses (round robin), so the server sees many clients
//!  one udpx-quic Host (client side): connections opened over the ramp, served only when they
//!  have news or their next request is due (wake_at)
//! ```
//!
//! Connection `i` starts at `ramp * i / N`. The measured window begins when the ramp ends and
//! lasts `duration`: requests sent in it are counted (served, failed, late: slower than the
//! interval), with their latency (request sent to last body byte). With `interval` zero the
//! connections are idle: they ask for nothing and keep alive with a PING every
//! `keepalive`. The client's own CPU is reported beside the figures: a client near a full CPU
//! measures itself, not the server.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use quiche::h3::NameValue;
use serde::Serialize;
use udpx_quic::{App, Host, HostCounters, HostSocket, IoMode};

use udpx_h3::tls::client_config;
use udpx_h3::Error;

/// What a load run does.
#[derive(Debug, Clone, Serialize)]
pub struct LoadConfig {
    /// The server.
    pub server: SocketAddr,
    /// Connections.
    pub connections: usize,
    /// The path each request asks for.
    pub path: String,
    /// Between one request of a connection and its next; zero: idle connections.
    pub interval: Duration,
    /// Connection starts are spread over this.
    pub ramp: Duration,
    /// The measured window, after the ramp.
    pub duration: Duration,
    /// Local addresses the connections send from, round robin (empty: the kernel's choice).
    pub locals: Vec<IpAddr>,
    /// How packets leave.
    pub io: IoMode,
    /// An idle connection's PING period.
    pub keepalive: Duration,
}

impl LoadConfig {
    /// `connections` players fetching `path` from `server` every `interval`, a ramp of 5 s,
    /// 15 s measured.
    pub fn new(server: SocketAddr, connections: usize, path: &str, interval: Duration) -> LoadConfig {
        LoadConfig {
            server,
            connections,
            path: path.to_string(),
            interval,
            ramp: Duration::from_secs(5),
            duration: Duration::from_secs(15),
            locals: Vec::new(),
            io: IoMode::GsoMmsg,
            keepalive: Duration::from_secs(10),
        }
    }

    /// Refuses numbers no run can use, saying what to change.
    pub fn check(&self) -> Result<(), String> {
        if self.connections == 0 || self.connections > 1_000_000 {
            return Err(format!("--connections {}: give 1 to 1000000", self.connections));
        }
        if self.duration.is_zero() {
            return Err("--duration 0: give a measured window of more than 0 s".into());
        }
        if !self.path.starts_with('/') {
            return Err(format!("--path {:?}: give an absolute path, e.g. /segment", self.path));
        }
        if self.keepalive < Duration::from_millis(100) {
            return Err("--keepalive: give at least 0.1 s".into());
        }
        Ok(())
    }
}

/// Latency figures, milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Latency {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Samples.
    pub n: usize,
}

impl Latency {
    /// The figures of `samples` (microseconds); sorts them.
    pub fn of(samples: &mut [u32]) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let at = |q: f64| f64::from(samples[((samples.len() - 1) as f64 * q).round() as usize]) / 1e3;
        Latency { p50_ms: at(0.5), p99_ms: at(0.99), max_ms: at(1.0), n: samples.len() }
    }
}

/// What a load run measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Which client ran: `udpx h3 load`, `udpx h3 load (TCP h2)`, `quic-go v0.65.0`, ...
    pub client: String,
    /// The settings.
    pub config: LoadConfig,
    /// Connections whose handshake completed.
    pub established: usize,
    /// Connections that ended before the run did (closed by the server, timed out, failed).
    pub ended_early: usize,
    /// Connections that asked in the window and got no complete response in it.
    pub never_served: usize,
    /// Requests sent in the measured window.
    pub requests: u64,
    /// Of them, answered whole (status 200, the whole body) by the end of the run.
    pub served: u64,
    /// Answered otherwise (another status, a reset, the connection gone).
    pub failed: u64,
    /// Served, but slower than the interval (a video player would have stalled).
    pub late: u64,
    /// Body bytes received in the window.
    pub bytes: u64,
    /// Request to last body byte.
    pub latency: Latency,
    /// Connect to handshake done.
    pub handshake: Latency,
    /// The client's CPU time over the window, seconds (its thread: user + system).
    pub client_cpu_s: f64,
    /// The window's length, seconds.
    pub window_s: f64,
    /// Requests of the window with no answer at all by the end of the run (neither served nor
    /// failed): what no player forgives.
    pub unanswered: u64,
    /// Packets (datagrams for udpx's client) the client sent over the window (`None`: not
    /// counted, the TCP clients).
    pub packets_sent: Option<u64>,
    /// Packets (datagrams) it received over the window.
    pub packets_received: Option<u64>,
    /// Datagrams that reached the client's host over the window and were lost there: the
    /// kernel dropped them for a full socket receive buffer, or (quic-go's client) they were
    /// delivered and never processed, its per-connection queue of 256 unprocessed packets
    /// overflowed while a connection's goroutine was behind. `None`: not counted (udpx's own
    /// client, the TCP clients). A loss the server sees that happened after the network.
    pub client_dropped: Option<u64>,
    /// The client host's counters (udpx's own client; zero for the others).
    pub quic: HostCounters,
    /// Connections left for a new one after the server's GOAWAY (udpx's own client).
    pub moved_on_goaway: usize,
    /// Requests the server refused past its GOAWAY (H3_REQUEST_REJECTED) and that were sent
    /// again on a new connection (udpx's own client).
    pub retried: u64,
    /// Each served request of the window: when it was sent (ms into the window) and its
    /// latency (µs); for per-moment figures (`udpx bench h3 --restart`). Not serialized.
    #[serde(skip)]
    pub timeline: Vec<(u32, u32)>,
    /// When each failed request of the window was sent (ms into the window). Not serialized.
    #[serde(skip)]
    pub failed_at: Vec<u32>,
}

impl LoadReport {
    /// Share of the requests served, percent.
    pub fn served_pct(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.served as f64 * 100.0 / self.requests as f64
    }

    /// Packets the client sent per packet it received over the window: its requests and,
    /// mostly, its acknowledgements (Chromium about 1 in 8 in a bulk download, udpx's own
    /// client 1 in 73): how often it wakes the server.
    pub fn sent_per_received(&self) -> Option<f64> {
        let (s, r) = (self.packets_sent?, self.packets_received?);
        (r > 0).then(|| s as f64 / r as f64)
    }

    /// The datagrams the client dropped itself, percent of those it processed.
    pub fn client_dropped_pct(&self) -> Option<f64> {
        let (d, r) = (self.client_dropped?, self.packets_received?);
        (r > 0).then(|| d as f64 * 100.0 / r as f64)
    }

    /// One line: the client, the counts, the latencies, the client's CPU and packets.
    pub fn summary(&self) -> String {
        format!(
            "{}: {} requests, {} served, {} failed, {} unanswered, {} late, latency {:?}, handshake {:?}, client CPU \
             {:.1} %, {} packets sent per received",
            self.client,
            self.requests,
            self.served,
            self.failed,
            self.unanswered,
            self.late,
            self.latency,
            self.handshake,
            self.client_cpu_pct(),
            self.sent_per_received().map_or("-".into(), |v| format!("{v:.3}"))
        )
    }

    /// The client's CPU over the window, percent of one CPU.
    pub fn client_cpu_pct(&self) -> f64 {
        if self.window_s <= 0.0 {
            return 0.0;
        }
        self.client_cpu_s * 100.0 / self.window_s
    }
}

/// What the players saw, counted the same way over QUIC and over TCP ([`crate::clients::quinn_hyper`]).
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) requests: u64,
    pub(crate) served: u64,
    pub(crate) failed: u64,
    pub(crate) late: u64,
    pub(crate) bytes: u64,
    pub(crate) latencies: Vec<u32>,
    pub(crate) handshakes: Vec<u32>,
    pub(crate) established: usize,
    pub(crate) ended: usize,
    pub(crate) never_served: usize,
    pub(crate) moved: usize,
    pub(crate) retried: u64,
    pub(crate) timeline: Vec<(u32, u32)>,
    pub(crate) failed_at: Vec<u32>,
}

impl Tally {
    /// A request of the window sent at `sent` ended at `now`: whole with 200 (`ok`: its
    /// latency, and late past `interval`) or failed; kept on the timeline too, by when it was
    /// sent (ms after `window_start`). Whether it was served.
    pub(crate) fn answer(
        &mut self,
        ok: bool,
        sent: Instant,
        now: Instant,
        interval: Duration,
        window_start: Instant,
    ) -> bool {
        let at = sent.saturating_duration_since(window_start).as_millis().min(u128::from(u32::MAX)) as u32;
        if ok {
            self.served += 1;
            let lat = now.duration_since(sent);
            let us = lat.as_micros().min(u128::from(u32::MAX)) as u32;
            self.latencies.push(us);
            self.timeline.push((at, us));
            if lat > interval {
                self.late += 1;
            }
        } else {
            self.failed += 1;
            self.failed_at.push(at);
        }
        ok
    }

    /// Requests of the window still without an answer.
    pub(crate) fn waiting(&self) -> u64 {
        self.requests - self.served - self.failed
    }

    /// The report of `client`'s run, which used `client_cpu_s` over the window and sent and
    /// received `packets` in it.
    pub(crate) fn report(
        &mut self,
        client: &str,
        cfg: &LoadConfig,
        client_cpu_s: f64,
        packets: Option<(u64, u64)>,
        quic: HostCounters,
    ) -> LoadReport {
        LoadReport {
            client: client.to_string(),
            unanswered: self.waiting(),
            packets_sent: packets.map(|p| p.0),
            packets_received: packets.map(|p| p.1),
            client_dropped: None,
            config: cfg.clone(),
            established: self.established,
            ended_early: self.ended,
            never_served: self.never_served,
            requests: self.requests,
            served: self.served,
            failed: self.failed,
            late: self.late,
            bytes: self.bytes,
            latency: Latency::of(&mut self.latencies),
            handshake: Latency::of(&mut self.handshakes),
            client_cpu_s,
            window_s: cfg.duration.as_secs_f64(),
            quic,
            moved_on_goaway: self.moved,
            retried: self.retried,
            timeline: std::mem::take(&mut self.timeline),
            failed_at: std::mem::take(&mut self.failed_at),
        }
    }
}

/// One player's state.
struct Player {
    started: Instant,
    established: bool,
    h3: Option<quiche::h3::Connection>,
    /// When the next request is due (or the next PING, when idle).
    next: Instant,
    /// The request under way: stream, when it was sent, whether it counts (sent in the
    /// window), body bytes so far, status.
    inflight: Option<(u64, Instant, bool, u64, u16)>,
    /// Requests it sent in the window, and answered whole.
    asked: u32,
    served: u32,
    /// The local address it connects from (`None`: the kernel's choice).
    from: Option<IpAddr>,
    /// The server sent GOAWAY: no new request here; the player moves to a new connection
    /// once its request under way has ended.
    goaway: bool,
}

impl Player {
    fn new(from: Option<IpAddr>, next: Instant) -> Player {
        Player {
            started: Instant::now(),
            established: false,
            h3: None,
            next,
            inflight: None,
            asked: 0,
            served: 0,
            from,
            goaway: false,
        }
    }
}

/// H3_NO_ERROR (RFC 9114 8.1).
const H3_NO_ERROR: u64 = 0x100;
/// H3_REQUEST_REJECTED (RFC 9114 8.1): not processed, safe to send again.
const H3_REQUEST_REJECTED: u64 = 0x10b;

/// The players' application (see the module docs).
struct Players {
    request: Vec<quiche::h3::Header>,
    interval: Duration,
    keepalive: Duration,
    window: (Instant, Instant),
    buf: Vec<u8>,
    t: Tally,
    h3_config: quiche::h3::Config,
    /// Players whose connection ended after a GOAWAY, to connect again.
    moving: Vec<Player>,
}

impl Players {
    fn in_window(&self, t: Instant) -> bool {
        t >= self.window.0 && t < self.window.1
    }

    /// A response ended: `ok` whole with 200.
    fn done(&mut self, p: &mut Player, ok: bool, now: Instant) {
        let Some((_, sent, counts, bytes, _)) = p.inflight.take() else { return };
        if counts && self.t.answer(ok, sent, now, self.interval, self.window.0) {
            p.served += 1;
        }
        if self.in_window(now) {
            self.t.bytes += bytes;
        }
        // The next one interval after this was asked for: at once when this one was late.
        p.next = sent + self.interval;
    }
}

impl App for Players {
    type State = Player;

    fn accepted(&mut self, _conn: &udpx_quic::Connection) -> Player {
        unreachable!("a client host accepts nothing")
    }

    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, p: &mut Player) {
        let now = Instant::now();
        if !p.established {
            p.established = true;
            self.t.established += 1;
            self.t.handshakes.push(now.duration_since(p.started).as_micros().min(u128::from(u32::MAX)) as u32);
            match quiche::h3::Connection::with_transport(conn, &self.h3_config) {
                Ok(h) => p.h3 = Some(h),
                Err(e) => {
                    log::debug!("udpx h3 load: HTTP/3 setup failed: {e}");
                    let _ = conn.close(true, 0x101, b"");
                    return;
                }
            }
        }
        let Some(h3) = p.h3.as_mut() else { return };
        // Read what came.
        let mut outcome = None;
        loop {
            match h3.poll(conn) {
                Ok((sid, quiche::h3::Event::Headers { list, .. })) => {
                    if let Some(f) = p.inflight.as_mut().filter(|f| f.0 == sid) {
                        for h in &list {
                            if h.name() == b":status" {
                                f.4 = std::str::from_utf8(h.value()).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
                            }
                        }
                    }
                }
                Ok((sid, quiche::h3::Event::Data)) => {
                    while let Ok(n) = h3.recv_body(conn, sid, &mut self.buf) {
                        if let Some(f) = p.inflight.as_mut().filter(|f| f.0 == sid) {
                            f.3 += n as u64;
                        }
                    }
                }
                Ok((sid, quiche::h3::Event::Finished)) => {
                    if p.inflight.is_some_and(|f| f.0 == sid) {
                        outcome = Some(p.inflight.is_some_and(|f| f.4 == 200));
                    }
                }
                Ok((sid, quiche::h3::Event::Reset(code))) => {
                    if p.inflight.is_some_and(|f| f.0 == sid) {
                        if code == H3_REQUEST_REJECTED {
                            // Not processed (RFC 9114 5.2): asked again on a new connection.
                            if let Some((_, _, true, _, _)) = p.inflight.take() {
                                self.t.requests -= 1;
                                p.asked -= 1;
                            }
                            self.t.retried += 1;
                            p.next = now;
                            p.goaway = true;
                        } else {
                            outcome = Some(false);
                        }
                    }
                }
                Ok((_, quiche::h3::Event::GoAway)) => p.goaway = true,
                Ok(_) => {}
                Err(quiche::h3::Error::Done) => break,
                Err(e) => {
                    log::debug!("udpx h3 load: {e}");
                    break;
                }
            }
        }
        if let Some(ok) = outcome {
            self.done(p, ok, now);
        }
        if p.goaway && p.inflight.is_none() {
            // The server asked for no more here: this connection ends, the next one takes over.
            let _ = conn.close(true, H3_NO_ERROR, b"goaway");
            return;
        }
        if p.inflight.is_some() || now < p.next {
            return;
        }
        let Some(h3) = p.h3.as_mut() else { return };
        if self.interval.is_zero() {
            // Idle: keep alive.
            let _ = conn.send_ack_eliciting();
            p.next = now + self.keepalive;
            return;
        }
        match h3.send_request(conn, &self.request, true) {
            Ok(sid) => {
                let counts = self.in_window(now);
                if counts {
                    self.t.requests += 1;
                    p.asked += 1;
                }
                p.inflight = Some((sid, now, counts, 0, 0));
            }
            // No stream credit yet: try again on the next news.
            Err(quiche::h3::Error::StreamBlocked) => {}
            Err(e) => log::debug!("udpx h3 load: request refused: {e}"),
        }
    }

    fn wake_at(&self, p: &Player) -> Option<Instant> {
        p.inflight.is_none().then_some(p.next)
    }

    fn closed(&mut self, conn: &udpx_quic::Connection, mut p: Player) {
        let now = Instant::now();
        // A server that closes with H3_NO_ERROR (after its GOAWAY, RFC 9114 5.2) has answered
        // every request it took: one still in flight was not processed, so it is asked again
        // on the next connection, as browsers do.
        let graceful = conn.peer_error().is_some_and(|e| e.is_app && e.error_code == H3_NO_ERROR);
        if graceful {
            p.goaway = true;
            if let Some((_, _, counts, _, _)) = p.inflight.take() {
                if counts {
                    self.t.requests -= 1;
                    p.asked -= 1;
                }
                self.t.retried += 1;
                p.next = now;
            }
        }
        if p.inflight.is_some() {
            self.done(&mut p, false, now);
        }
        if p.goaway {
            self.t.moved += 1;
            let mut next = Player::new(p.from, p.next);
            (next.asked, next.served) = (p.asked, p.served);
            self.moving.push(next);
            return;
        }
        if now < self.window.1 {
            self.t.ended += 1;
        }
        if p.asked > 0 && p.served == 0 {
            self.t.never_served += 1;
        }
    }
}

/// Runs the players (see the module docs) until the window ends and the last requests are
/// answered (or 10 s more pass), and reports.
pub fn run(cfg: &LoadConfig) -> Result<LoadReport, Error> {
    cfg.check().map_err(Error::Usage)?;
    let bind: SocketAddr = if cfg.server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("literal");
    let socket = udpx_quic::server::socket_config(bind, cfg.io, true)
        .bind()
        .map_err(|e| Error::Quic(udpx_quic::Error::Socket(e)))?;
    let mut qc = client_config(udpx_h3::server::DEFAULT_MAX_UDP_PAYLOAD)?;
    // Handshakes of many connections at once: quiche's default of 3 s is tight on a loaded
    // machine, and a lost Initial is resent after 1 s.
    qc.set_max_idle_timeout(60_000);
    let authority = cfg.server.to_string();
    let request = vec![
        quiche::h3::Header::new(b":method", b"GET"),
        quiche::h3::Header::new(b":scheme", b"https"),
        quiche::h3::Header::new(b":authority", authority.as_bytes()),
        quiche::h3::Header::new(b":path", cfg.path.as_bytes()),
        quiche::h3::Header::new(b"user-agent", b"udpx-h3-load"),
    ];
    let start = Instant::now();
    let window = (start + cfg.ramp, start + cfg.ramp + cfg.duration);
    let app = Players {
        request,
        interval: cfg.interval,
        keepalive: cfg.keepalive,
        window,
        buf: vec![0; 64 * 1024],
        t: Tally::default(),
        h3_config: quiche::h3::Config::new().map_err(|e| Error::Tls(e.to_string()))?,
        moving: Vec::new(),
    };
    let mut host = Host::new(HostSocket::Own(Box::new(socket)), qc, app, udpx_quic::Role::Client);
    let n = cfg.connections;
    let mut opened = 0;
    let mut cpu0 = None;
    let mut at_end: Option<HostCounters> = None;
    let stop_at = window.1 + Duration::from_secs(10);
    loop {
        let now = Instant::now();
        // Open the connections due by now.
        while opened < n {
            let due = start + cfg.ramp.mul_f64(opened as f64 / n as f64);
            if due > now {
                break;
            }
            let from = (!cfg.locals.is_empty()).then(|| cfg.locals[opened % cfg.locals.len()]);
            let first = if cfg.interval.is_zero() { now + cfg.keepalive } else { due };
            host.connect_from(from, None, cfg.server, Player::new(from, first), None, None).map_err(Error::Quic)?;
            opened += 1;
        }
        // Players whose server sent GOAWAY go on on new connections.
        for p in std::mem::take(&mut host.app_mut().moving) {
            host.connect_from(p.from, None, cfg.server, p, None, None).map_err(Error::Quic)?;
        }
        if cpu0.is_none() && now >= window.0 {
            cpu0 = Some((udpx_lab::cpu::ProcessCpu::thread().ok(), host.counters()));
        }
        if now >= window.1 {
            if at_end.is_none() {
                at_end = Some(host.counters());
            }
            let waiting = host.app().t.waiting();
            if waiting == 0 || now >= stop_at {
                break;
            }
        }
        let next_open = (opened < n).then(|| start + cfg.ramp.mul_f64(opened as f64 / n as f64));
        let wait = next_open.map_or(Duration::from_millis(50), |t| t.saturating_duration_since(now));
        host.step(wait.min(Duration::from_millis(50))).map_err(Error::Quic)?;
    }
    let cpu1 = udpx_lab::cpu::ProcessCpu::thread().ok();
    let client_cpu_s = match (cpu0.as_ref().and_then(|c| c.0), cpu1) {
        (Some(a), Some(b)) => b.diff(&a).total().as_secs_f64(),
        _ => 0.0,
    };
    let quic = host.counters();
    // Over the window.
    let packets = cpu0
        .as_ref()
        .zip(at_end.as_ref())
        .map(|((_, c0), c1)| (c1.datagrams_sent - c0.datagrams_sent, c1.datagrams_received - c0.datagrams_received));
    // Connections still open that asked in the window and got nothing whole.
    let mut open_unserved = 0;
    host.for_each_connection(|_, p| open_unserved += usize::from(p.asked > 0 && p.served == 0));
    let t = &mut host.app_mut().t;
    t.never_served += open_unserved;
    Ok(t.report("udpx h3 load", cfg, client_cpu_s, packets, quic))
}
