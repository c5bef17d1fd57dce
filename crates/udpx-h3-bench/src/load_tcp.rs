//! The same players as [`crate::load`] over HTTPS on TCP (HTTP/2 or HTTP/1.1, TLS 1.3): for a
//! server like nginx, side by side with HTTP/3 under the same schedule.
//!
//! One thread, a current-thread tokio runtime, a task per connection: it connects from its
//! local address (bound before connecting, round robin over the given ones) at its start
//! time, does the TLS handshake (the server's certificate checked against the CA file, name
//! `localhost`), then asks for the segment every interval on one HTTP/2 stream or HTTP/1.1
//! request at a time, exactly as the QUIC players do, and records the same figures.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::load::{LoadConfig, LoadReport, Tally};
use udpx_h3::Error;

/// HTTP over TCP: which version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpHttp {
    /// HTTP/2 (ALPN h2).
    H2,
    /// HTTP/1.1 (ALPN http/1.1), one request at a time per connection.
    H1,
}

/// Runs the players over TCP against `cfg.server` (see the module docs), trusting the
/// certificate in `ca` for the name `localhost`.
pub fn run(cfg: &LoadConfig, http: TcpHttp, ca: &Path) -> Result<LoadReport, Error> {
    cfg.check().map_err(Error::Usage)?;
    if cfg.interval.is_zero() {
        return Err(Error::Usage("idle connections are an HTTP/3 row only".into()));
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
        TcpHttp::H2 => b"h2".to_vec(),
        TcpHttp::H1 => b"http/1.1".to_vec(),
    }];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Io)?;
    let start = Instant::now();
    let window = (start + cfg.ramp, start + cfg.ramp + cfg.duration);
    let tally = Rc::new(RefCell::new(Tally::default()));
    let cpu = rt.block_on(async {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let n = cfg.connections;
                for i in 0..n {
                    let due = start + cfg.ramp.mul_f64(i as f64 / n as f64);
                    let from = (!cfg.locals.is_empty()).then(|| cfg.locals[i % cfg.locals.len()]);
                    let (connector, tally, cfg) = (connector.clone(), tally.clone(), cfg.clone());
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep_until(due.into()).await;
                        player(&cfg, http, from, &connector, window, &tally).await;
                    });
                }
                tokio::time::sleep_until(window.0.into()).await;
                let cpu0 = udpx_lab::cpu::ProcessCpu::thread().ok();
                // The window, then the last answers (10 s at most).
                tokio::time::sleep_until(window.1.into()).await;
                let end = window.1 + Duration::from_secs(10);
                loop {
                    let waiting = tally.borrow().waiting();
                    if waiting == 0 || Instant::now() >= end {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let cpu1 = udpx_lab::cpu::ProcessCpu::thread().ok();
                match (cpu0, cpu1) {
                    (Some(a), Some(b)) => b.diff(&a).total().as_secs_f64(),
                    _ => 0.0,
                }
            })
            .await
    });
    // Dropping the runtime ends every task and connection.
    drop(rt);
    let client = match http {
        TcpHttp::H2 => "udpx load (TCP, h2)",
        TcpHttp::H1 => "udpx load (TCP, http/1.1)",
    };
    let report = tally.borrow_mut().report(client, cfg, cpu, None, Default::default());
    Ok(report)
}

/// One player: connect, handshake, then a request every interval until the window ends.
async fn player(
    cfg: &LoadConfig,
    http: TcpHttp,
    from: Option<IpAddr>,
    connector: &tokio_rustls::TlsConnector,
    window: (Instant, Instant),
    tally: &Rc<RefCell<Tally>>,
) {
    let began = Instant::now();
    let Some(mut send) = open(cfg, http, from, connector).await else {
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
                TcpHttp::H2 => hyper::Request::get(&uri),
                TcpHttp::H1 => hyper::Request::get(cfg.path.as_str()).header("host", "localhost"),
            }
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        };
        let Ok(req) = request() else { break };
        let mut result = tokio::time::timeout_at(end.into(), send.send(req)).await;
        // The server closed the connection between requests (nginx's reload and binary
        // upgrade close idle connections, HTTP/2 with a GOAWAY): connect again and send once
        // more, as browsers do; the latency counts from the first attempt.
        if matches!(result, Ok(None)) && send.is_closed() {
            if let (Some(fresh), Ok(req)) = (open(cfg, http, from, connector).await, request()) {
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
            Ok(Some((status, bytes))) => (status == 200, bytes),
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

/// A TLS connection to the server, HTTP/2 or HTTP/1.1 set up on it; `None` if any step fails.
async fn open(
    cfg: &LoadConfig,
    http: TcpHttp,
    from: Option<IpAddr>,
    connector: &tokio_rustls::TlsConnector,
) -> Option<Sender> {
    let tcp = connect(cfg.server, from).await.ok()?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from("localhost").expect("a valid name");
    let io = TokioIo::new(connector.connect(name, tcp).await.ok()?);
    Some(match http {
        TcpHttp::H2 => {
            let (s, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.ok()?;
            tokio::task::spawn_local(conn);
            Sender::H2(s)
        }
        TcpHttp::H1 => {
            let (s, conn) = hyper::client::conn::http1::handshake(io).await.ok()?;
            tokio::task::spawn_local(conn);
            Sender::H1(s)
        }
    })
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
    H2(hyper::client::conn::http2::SendRequest<http_body_util::Empty<hyper::body::Bytes>>),
    H1(hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>),
}

impl Sender {
    /// Whether the connection under it is gone.
    fn is_closed(&self) -> bool {
        match self {
            Sender::H2(s) => s.is_closed(),
            Sender::H1(s) => s.is_closed(),
        }
    }

    /// Sends `req` and reads the whole body: (status, body bytes), or `None` on any failure.
    async fn send(&mut self, req: hyper::Request<http_body_util::Empty<hyper::body::Bytes>>) -> Option<(u16, u64)> {
        let resp = match self {
            Sender::H2(s) => s.send_request(req).await.ok()?,
            Sender::H1(s) => {
                s.ready().await.ok()?;
                s.send_request(req).await.ok()?
            }
        };
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut bytes = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.ok()?;
            if let Some(d) = frame.data_ref() {
                bytes += d.len() as u64;
            }
        }
        Some((status, bytes))
    }
}
