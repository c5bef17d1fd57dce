//! The same players as [`crate::clients::own`] on hyperium's HTTP stacks, which this project did
//! not write: hyper over TLS on TCP (HTTP/2 or HTTP/1.1, TLS 1.3) for a server like nginx,
//! side by side with HTTP/3 under the same schedule, and hyperium's `h3` on quinn (quinn's own
//! UDP datapath, its acknowledgement policy untouched) as a second independent HTTP/3 client
//! beside quic-go's ([`crate::clients::quicgo`]).
//!
//! One thread, a current-thread tokio runtime, a task per connection: it connects from its
//! local address (bound before connecting, round robin over the given ones; over QUIC one
//! quinn endpoint, one socket, per address, shared by its players) at its start time, does the
//! TLS handshake (the server's certificate checked against the CA file, name `localhost`),
//! then asks for the segment every interval on one HTTP/2 or HTTP/3 stream or HTTP/1.1
//! request at a time, exactly as the QUIC players do, and records the same figures.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use udpx_tokio::quinn;

use crate::clients::own::{LoadConfig, LoadReport, Tally};
use udpx_h3::Error;

/// Which HTTP, on which hyperium stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HyperHttp {
    /// HTTP/2 (ALPN h2) over TLS on TCP, hyper.
    H2,
    /// HTTP/1.1 (ALPN http/1.1) over TLS on TCP, hyper; one request at a time per connection.
    H1,
    /// HTTP/3 (ALPN h3): hyperium's `h3` on quinn.
    H3,
}

impl HyperHttp {
    /// The client's name in the report.
    pub fn client(self) -> &'static str {
        match self {
            HyperHttp::H2 => "hyper (TCP, h2)",
            HyperHttp::H1 => "hyper (TCP, http/1.1)",
            HyperHttp::H3 => "quinn h3",
        }
    }
}

/// How a player opens its connection: the TLS settings and, over QUIC, the endpoints.
struct Dialer {
    http: HyperHttp,
    tcp: tokio_rustls::TlsConnector,
    /// One quinn endpoint per local address (one when none is given), each with the client
    /// configuration; empty over TCP.
    quic: Vec<quinn::Endpoint>,
}

/// Runs the players over `http` against `cfg.server` (see the module docs), trusting the
/// certificate in `ca` for the name `localhost`.
pub fn run(cfg: &LoadConfig, http: HyperHttp, ca: &Path) -> Result<LoadReport, Error> {
    cfg.check().map_err(Error::Usage)?;
    if cfg.interval.is_zero() {
        return Err(Error::Usage("idle connections are udpx's own client's rows only".into()));
    }
    let roots = {
        let mut r = rustls::RootCertStore::empty();
        let cert =
            CertificateDer::from_pem_file(ca).map_err(|e| Error::Usage(format!("CA file {}: {e}", ca.display())))?;
        r.add(cert).map_err(|e| Error::Tls(e.to_string()))?;
        r
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![match http {
        HyperHttp::H2 => b"h2".to_vec(),
        HyperHttp::H1 => b"http/1.1".to_vec(),
        HyperHttp::H3 => b"h3".to_vec(),
    }];
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Io)?;
    let start = Instant::now();
    let window = (start + cfg.ramp, start + cfg.ramp + cfg.duration);
    let tally = Rc::new(RefCell::new(Tally::default()));
    let conns: Rc<RefCell<Vec<quinn::Connection>>> = Rc::default();
    let (cpu, packets, dropped) = rt.block_on(async {
        // quinn's endpoints: one socket per local address, as the QUIC players have.
        let mut quic = Vec::new();
        if http == HyperHttp::H3 {
            let qc = quinn::crypto::rustls::QuicClientConfig::try_from(tls.clone())
                .map_err(|e| Error::Tls(e.to_string()))?;
            let client = quinn::ClientConfig::new(Arc::new(qc));
            let any = if cfg.server.is_ipv4() { IpAddr::from([0u8; 4]) } else { IpAddr::from([0u16; 8]) };
            let ips = if cfg.locals.is_empty() { vec![any] } else { cfg.locals.clone() };
            for ip in ips {
                let mut ep = quinn_endpoint(SocketAddr::new(ip, 0)).map_err(Error::Io)?;
                ep.set_default_client_config(client.clone());
                quic.push(ep);
            }
        }
        let dialer = Rc::new(Dialer { http, tcp: tokio_rustls::TlsConnector::from(Arc::new(tls)), quic });
        let local = tokio::task::LocalSet::new();
        let figures = local
            .run_until(async {
                let n = cfg.connections;
                for i in 0..n {
                    let due = start + cfg.ramp.mul_f64(i as f64 / n as f64);
                    let (dialer, tally, conns, cfg) = (dialer.clone(), tally.clone(), conns.clone(), cfg.clone());
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep_until(due.into()).await;
                        player(&cfg, &dialer, i, window, &tally, &conns).await;
                    });
                }
                tokio::time::sleep_until(window.0.into()).await;
                let cpu0 = udpx_lab::cpu::ProcessCpu::thread().ok();
                let packets0 = datagrams(&conns.borrow());
                let dropped0 = udpx_lab::udp_counter("RcvbufErrors");
                // The window, then the last answers (10 s at most).
                tokio::time::sleep_until(window.1.into()).await;
                let packets1 = datagrams(&conns.borrow());
                let dropped1 = udpx_lab::udp_counter("RcvbufErrors");
                let end = window.1 + Duration::from_secs(10);
                loop {
                    let waiting = tally.borrow().waiting();
                    if waiting == 0 || Instant::now() >= end {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let cpu1 = udpx_lab::cpu::ProcessCpu::thread().ok();
                let cpu = match (cpu0, cpu1) {
                    (Some(a), Some(b)) => b.diff(&a).total().as_secs_f64(),
                    _ => 0.0,
                };
                let packets = (http == HyperHttp::H3)
                    .then(|| (packets1.0.saturating_sub(packets0.0), packets1.1.saturating_sub(packets0.1)));
                let dropped =
                    dropped0.zip(dropped1).filter(|_| http == HyperHttp::H3).map(|(a, b)| b.saturating_sub(a));
                (cpu, packets, dropped)
            })
            .await;
        for ep in &dialer.quic {
            ep.close(0u32.into(), b"done");
        }
        Ok::<_, Error>(figures)
    })?;
    // Dropping the runtime ends every task and connection.
    drop(rt);
    let mut report = tally.borrow_mut().report(http.client(), cfg, cpu, packets, Default::default());
    report.client_dropped = dropped;
    Ok(report)
}

/// The receive buffer quinn's sockets ask for (the kernel caps it at `rmem_max`): quinn-udp
/// leaves the system's default (208 KiB here), which a 1 MiB response to a busy player
/// overflows; quic-go asks for 7 MiB, Chromium for 1 MiB.
const QUINN_RCVBUF: usize = 4 << 20;

/// A quinn client endpoint on its own UDP socket at `local`, with [`QUINN_RCVBUF`].
fn quinn_endpoint(local: SocketAddr) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(local)?;
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &QUINN_RCVBUF)
        .map_err(std::io::Error::from)?;
    quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, Arc::new(quinn::TokioRuntime))
}

/// The datagrams quinn's connections sent and received so far (closed ones keep theirs).
fn datagrams(conns: &[quinn::Connection]) -> (u64, u64) {
    conns.iter().map(|c| c.stats()).fold((0, 0), |(s, r), st| (s + st.udp_tx.datagrams, r + st.udp_rx.datagrams))
}

/// Player `i`: connect, handshake, then a request every interval until the window ends.
async fn player(
    cfg: &LoadConfig,
    dialer: &Dialer,
    i: usize,
    window: (Instant, Instant),
    tally: &Rc<RefCell<Tally>>,
    conns: &RefCell<Vec<quinn::Connection>>,
) {
    let http = dialer.http;
    let open = || dialer.open(cfg, i, conns);
    let began = Instant::now();
    let Some(mut send) = open().await else {
        tally.borrow_mut().ended += 1;
        return;
    };
    {
        let mut t = tally.borrow_mut();
        t.established += 1;
        t.handshakes.push(began.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
    }
    let uri = format!("https://localhost{}", cfg.path);
    let (mut asked, mut served) = (0u32, 0u32);
    let mut next = Instant::now().max(began);
    let end = window.1 + Duration::from_secs(10);
    loop {
        tokio::time::sleep_until(next.into()).await;
        let sent = Instant::now();
        if sent >= window.1 {
            break;
        }
        let counts = sent >= window.0;
        if counts {
            tally.borrow_mut().requests += 1;
            asked += 1;
        }
        let request = || {
            match http {
                HyperHttp::H2 | HyperHttp::H3 => hyper::Request::get(&uri),
                HyperHttp::H1 => hyper::Request::get(cfg.path.as_str()).header("host", "localhost"),
            }
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        };
        let Ok(req) = request() else { break };
        let mut result = tokio::time::timeout_at(end.into(), send.send(req)).await;
        // The server closed the connection between requests or said it would not process
        // this one (nginx's reload and binary upgrade close idle connections; HTTP/2's GOAWAY,
        // RFC 9113 6.8; HTTP/3's, RFC 9114 5.2) and no part of an answer came: connect again
        // and send once more, as browsers do (a GET is idempotent, RFC 9110 9.2.2); the
        // latency counts from the first attempt. A response broken after its head is a
        // failure, never retried.
        if matches!(result, Ok(Err(Failure::Unanswered))) && send.is_closed() {
            if let (Some(fresh), Ok(req)) = (open().await, request()) {
                send = fresh;
                {
                    let mut t = tally.borrow_mut();
                    t.moved += 1;
                    t.retried += 1;
                }
                result = tokio::time::timeout_at(end.into(), send.send(req)).await;
            }
        }
        let (ok, bytes) = match result {
            Ok(Ok((status, bytes))) => (status == 200, bytes),
            _ => (false, 0),
        };
        let now = Instant::now();
        let mut t = tally.borrow_mut();
        if now >= window.0 && now < window.1 {
            t.bytes += bytes;
        }
        if counts && t.answer(ok, sent, now, cfg.interval, window.0) {
            served += 1;
        }
        if result.is_err() || !ok {
            if now < window.1 {
                t.ended += 1;
            }
            break;
        }
        next = sent + cfg.interval;
    }
    if asked > 0 && served == 0 {
        tally.borrow_mut().never_served += 1;
    }
}

impl Dialer {
    /// Player `i`'s connection to the server, its HTTP set up on it (a QUIC one is kept in
    /// `conns` for its packet counts); `None` if any step fails.
    async fn open(&self, cfg: &LoadConfig, i: usize, conns: &RefCell<Vec<quinn::Connection>>) -> Option<Sender> {
        if self.http == HyperHttp::H3 {
            let ep = &self.quic[i % self.quic.len()];
            let conn = ep.connect(cfg.server, "localhost").ok()?.await.ok()?;
            conns.borrow_mut().push(conn.clone());
            let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await.ok()?;
            tokio::task::spawn_local(async move {
                let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
            });
            return Some(Sender::H3 { send, conn, left: false });
        }
        let from = (!cfg.locals.is_empty()).then(|| cfg.locals[i % cfg.locals.len()]);
        let tcp = connect(cfg.server, from).await.ok()?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from("localhost").expect("a valid name");
        let io = TokioIo::new(self.tcp.connect(name, tcp).await.ok()?);
        Some(match self.http {
            HyperHttp::H2 | HyperHttp::H3 => {
                let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.ok()?;
                tokio::task::spawn_local(conn);
                Sender::H2 { send, left: false }
            }
            HyperHttp::H1 => {
                let (s, conn) = hyper::client::conn::http1::handshake(io).await.ok()?;
                tokio::task::spawn_local(conn);
                Sender::H1(s)
            }
        })
    }
}

/// A TCP connection to `to`, from `from` when given.
async fn connect(to: SocketAddr, from: Option<IpAddr>) -> std::io::Result<tokio::net::TcpStream> {
    let sock = if to.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    if let Some(ip) = from {
        sock.bind(SocketAddr::new(ip, 0))?;
    }
    sock.connect(to).await
}

enum Sender {
    H2 {
        send: hyper::client::conn::http2::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
        /// The server's GOAWAY came: a request refused by it (a new one, or one above its last
        /// stream) was not processed (RFC 9113 6.8) and may be sent on a new connection.
        left: bool,
    },
    H1(hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>),
    H3 {
        send: h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
        conn: quinn::Connection,
        /// The server said it will process no more requests here (GOAWAY, a request rejected
        /// with H3_REQUEST_REJECTED, or a graceful close before the answer): the request may be
        /// sent again on a new connection (RFC 9114 5.2), as browsers do.
        left: bool,
    },
}

/// Whether hyper's error is h2's for a stream the server's GOAWAY left unprocessed (a request
/// sent after it, or one above its last stream id: RFC 9113 6.8) or refused (REFUSED_STREAM).
fn refused_by_goaway(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<h2::Error>() {
            return (h.is_go_away() && h.is_remote()) || h.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        cause = c.source();
    }
    false
}

/// How a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// No part of the answer came (sent on a connection that went away, refused by GOAWAY,
    /// left unprocessed): retried once on a new connection when the old one is gone.
    Unanswered,
    /// The answer broke after its head: a failure.
    Broken,
}

/// The server did not process the request and said so (RFC 9114 5.2): a GOAWAY before it was
/// sent, H3_REQUEST_REJECTED, or the connection closed gracefully (H3_NO_ERROR) under it.
fn unprocessed(e: &h3::error::StreamError) -> bool {
    use h3::error::{Code, StreamError};
    match e {
        StreamError::RemoteClosing { .. } => true,
        StreamError::RemoteTerminate { code, .. } => *code == Code::H3_REQUEST_REJECTED,
        _ => e.is_h3_no_error(),
    }
}

impl Sender {
    /// Whether the connection under it is gone.
    fn is_closed(&self) -> bool {
        match self {
            Sender::H2 { send, left } => *left || send.is_closed(),
            Sender::H1(s) => s.is_closed(),
            Sender::H3 { conn, left, .. } => *left || conn.close_reason().is_some(),
        }
    }

    /// Sends `req` and reads the whole body: (status, body bytes), or how it failed.
    async fn send(
        &mut self,
        req: hyper::Request<http_body_util::Empty<hyper::body::Bytes>>,
    ) -> Result<(u16, u64), Failure> {
        let resp = match self {
            Sender::H3 { send, left, .. } => {
                let (parts, _) = req.into_parts();
                let mut stream = match send.send_request(http::Request::from_parts(parts, ())).await {
                    Ok(s) => s,
                    Err(e) => {
                        *left = unprocessed(&e);
                        return Err(Failure::Unanswered);
                    }
                };
                stream.finish().await.map_err(|_| Failure::Unanswered)?;
                let status = match stream.recv_response().await {
                    Ok(r) => r.status().as_u16(),
                    Err(e) => {
                        // Nothing of the answer came: the server may not have processed it.
                        *left = unprocessed(&e);
                        return Err(Failure::Unanswered);
                    }
                };
                let mut bytes = 0u64;
                while let Some(chunk) = stream.recv_data().await.map_err(|_| Failure::Broken)? {
                    bytes += chunk.remaining() as u64;
                }
                return Ok((status, bytes));
            }
            // hyper fails a request the server refused by GOAWAY (a stream above its last
            // one) or sent on a connection that went away before any answer: no head came.
            Sender::H2 { send, left } => match send.send_request(req).await {
                Ok(r) => r,
                Err(e) => {
                    *left = refused_by_goaway(&e);
                    return Err(Failure::Unanswered);
                }
            },
            Sender::H1(s) => {
                s.ready().await.map_err(|_| Failure::Unanswered)?;
                s.send_request(req).await.map_err(|_| Failure::Unanswered)?
            }
        };
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut bytes = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| Failure::Broken)?;
            if let Some(d) = frame.data_ref() {
                bytes += d.len() as u64;
            }
        }
        Ok((status, bytes))
    }
}
