//! HTTPS over TCP beside the QUIC port (`udpx h3 serve --alt-svc-tcp ADDR`): how a browser
//! finds HTTP/3.
//!
//! A browser's first request to an origin goes over TCP; the answer's `Alt-Svc: h3=":PORT"`
//! (which [`Site::answer`] adds to every response) tells it that the same origin speaks
//! HTTP/3 on that UDP port, and its later requests go there. This listener serves the same
//! files by the same rules: every request is answered by [`Site::answer`] and logged and
//! counted by [`Site::finished`] (protocol `h2` or `http/1.1`), so the two listeners cannot
//! drift apart.
//!
//! ```text
//!  std thread "udpx-h3-tcp": a current_thread tokio runtime
//!    accept loop ── at most max_connections at once (a permit each; at the cap the idle-longest goes)
//!      └─ per connection: TLS handshake (rustls, ALPN h2 / http/1.1, HANDSHAKE_TIMEOUT)
//!           ├─ ALPN h2: h2 itself (http2.rs) ── per stream: Site::answer, reads as its window allows
//!           └─ else hyper (HTTP/1.1) ── per request: Site::answer
//!                └─ body: CHUNK-sized reads on the blocking pool, one in flight
//! ```
//!
//! - HTTP/2 (ALPN `h2`) on the h2 crate directly (`tcp/http2.rs`): each stream's response is read
//!   only as its flow-control window allows, and a stream whose client stops reading is
//!   parked (its file given back), resumed byte-exact, or reset alone at the park timeout; the
//!   connection is never closed for one stream. HTTP/1.1 (and HTTP/2 by prior knowledge,
//!   without ALPN) by hyper (hyper-util's `auto` builder). TLS by rustls on the `ring`
//!   provider, the certificate and key from the same PEM files as the QUIC side.
//! - A body is read from the file [`CHUNK`] bytes at a time on tokio's blocking pool (a disk
//!   read must not stall the runtime's one thread), and the next read starts only when hyper
//!   asks for more: HTTP/2 once the stream's send queue is below one chunk, HTTP/1.1 once
//!   its write queue is. A response so holds a chunk or two in memory (and rustls its 64 KiB
//!   of records), whatever the file size: four downloads of a 200 MB file throttled to
//!   3 MB/s added 2.0 MB (HTTP/2) and 1.5 MB (HTTP/1.1) to the server's RSS, connections,
//!   TLS and read threads included (against 3.5 MB for HTTP/2 with hyper's default queue);
//!   one unthrottled download ran at 0.9-1 GB/s on loopback.
//!   Exactly `len` bytes are sent; a file that shrinks under us fails the response (hyper
//!   then resets the stream or closes the connection) rather than sending a short body.
//! - A failed or slow TLS handshake, or a peer that sends garbage, ends that connection only.
//! - Bounded against its peers ([`TcpLimits`]): `max_connections` at once (at the cap the
//!   connection idle longest is closed to make room, GOAWAY first for HTTP/2, as nginx closes
//!   idle keep-alive connections when it runs short; with every one busy, the new one is
//!   closed, counted), at most `per_source` from one address (more are closed at once,
//!   counted; below the cap, so no one address holds them all), and a minimum rate: an
//!   HTTP/1.1 connection with a response under way that takes fewer than `min_bytes` in a
//!   `window` (a slow reader) is closed, counted, so slow readers cannot hold the permits and
//!   lock everyone out; an HTTP/2 stream that does so is parked (see above). A connection
//!   with no response under way and no new request for `idle` is closed too (counted
//!   `idle_closed`; nginx's `keepalive_timeout` is 75 s): an HTTP/2 peer that only answers
//!   PINGs cannot hold a permit for ever. IPv6 peers count by their /64 (one host's
//!   addresses), as the QUIC side does. An accept error
//!   (EMFILE, ENFILE, ENOMEM) pauses accepting for a moment; it never ends the listener.
//! - It drains with the QUIC server ([`udpx_quic::host::DrainSignal::on_change`]): accepting
//!   stops (the socket closed, never `shutdown()`; in a handover kept open, so that a drain
//!   called off because the successor died accepts again), HTTP/2 connections get GOAWAY and close once
//!   their streams are done, HTTP/1.1 ones close after the response under way (an idle
//!   keep-alive one at once), and the rest are closed at the drain's deadline. In an upgrade
//!   the listening socket itself is passed on to the new process ([`udpx_quic::upgrade`]), so
//!   connections waiting in its accept queue are the new process's.
//! - A connection the server ends is closed lingering, as nginx's `lingering_close`: its side
//!   ended (GOAWAY, TLS close, FIN), it reads and discards its client's late bytes until the
//!   client closes, for at most 2 s and 256 KiB, so that the kernel never answers the frames
//!   that cross the close (an HTTP/2 client's WINDOW_UPDATEs) with a reset that fails the
//!   client and destroys what it had not read. At most `max_connections` linger at once (the
//!   `lingering` gauge); a drain waits for them. Connections refused at once are closed at once.
//! - [`TcpServer::stop`] (or drop) ends the accept loop and the connections, and joins the
//!   thread.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use udpx_quic::host::{DrainEvent, DrainSignal};
use udpx_quic::upgrade::PassOn;

mod activity;
mod answer;
mod counters;
mod http2;
mod limits;

use activity::{Activity, Registry};
use answer::{answer, Answered, Finish, Held};
use counters::{snapshot, TcpCounters};
pub use counters::{TcpProbe, TcpSnapshot};
pub use limits::TcpLimits;
use limits::{H2_PING_INTERVAL, H2_PING_TIMEOUT};

use crate::http::CHUNK;
use crate::http::{FileBody, Site};
use crate::Error;

/// How long a connection accepted at the cap waits for a permit (the oldest idle connection
/// told to go) before it is closed.
const CAP_WAIT: Duration = Duration::from_secs(2);

/// How long a peer has to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1.1 peer has to send a request's headers (also between keep-alive
/// requests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Threads for file reads (tokio's blocking pool): a read is one chunk from the page cache
/// or the disk.
const READ_THREADS: usize = 4;

/// A running HTTPS-over-TCP listener (see the module docs).
#[derive(Debug)]
pub struct TcpServer {
    addr: SocketAddr,
    counters: Arc<TcpCounters>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpServer {
    /// A view of the counters for another thread.
    pub fn probe(&self) -> TcpProbe {
        TcpProbe(self.counters.clone())
    }

    /// Listens on `listen` with the certificate chain and key in the PEM files `cert` and
    /// `key`, answering from `site`. Returns once the socket listens (the certificate is
    /// loaded by then, so the files may be removed).
    pub fn start(listen: SocketAddr, cert: &Path, key: &Path, site: Arc<Site>) -> Result<TcpServer, Error> {
        TcpServer::start_with(listen, cert, key, site, TcpLimits::default())
    }

    /// [`TcpServer::start`] with limits other than the defaults.
    pub fn start_with(
        listen: SocketAddr,
        cert: &Path,
        key: &Path,
        site: Arc<Site>,
        limits: TcpLimits,
    ) -> Result<TcpServer, Error> {
        let ready = PreparedTcp::new(bind(listen)?, cert, key, limits, None)?;
        ready.run(site, &Arc::new(DrainSignal::default()), PassOn::default())
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection counters so far.
    pub fn counters(&self) -> TcpSnapshot {
        snapshot(&self.counters)
    }

    /// Whether the listener's thread still runs.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Whether a drain has ended here: no longer accepting and no connection left, lingering
    /// ones included (an exit would reset those).
    pub fn drained(&self) -> bool {
        let c = &self.counters;
        !c.accepting.load(Ordering::Acquire)
            && c.open.load(Ordering::Acquire) == 0
            && c.lingering.load(Ordering::Acquire) == 0
    }

    /// Stops accepting, ends the connections and joins the thread; returns the final counters.
    pub fn stop(mut self) -> TcpSnapshot {
        self.shut_down();
        self.counters()
    }

    fn shut_down(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::warn!("udpx-h3: the HTTPS-over-TCP thread panicked");
            }
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Binds the listening socket for `listen` (what a server that inherited none does).
pub fn bind(listen: SocketAddr) -> Result<std::net::TcpListener, Error> {
    std::net::TcpListener::bind(listen).map_err(|e| Error::Usage(format!("HTTPS over TCP on {listen}: {e}")))
}

/// Takes a listening socket a predecessor passed on in an upgrade ([`udpx_quic::upgrade`]),
/// checked to be what it must be: a listening TCP socket bound to `want` (a port of 0 in
/// `want` takes the passed socket's port).
pub fn adopt(fd: OwnedFd, want: SocketAddr) -> Result<std::net::TcpListener, Error> {
    use nix::sys::socket::{getsockopt, sockopt, SockType};
    let stream = getsockopt(&fd, sockopt::SockType).is_ok_and(|t| t == SockType::Stream);
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    let l = std::net::TcpListener::from(fd);
    let at = l.local_addr().ok();
    let matches = at.is_some_and(|a| a.ip() == want.ip() && (want.port() == 0 || a.port() == want.port()));
    if !stream || !listening || !matches {
        let what = match at {
            Some(a) if stream && listening => format!("a TCP listener on {a}"),
            _ => "not a listening TCP socket".to_string(),
        };
        return Err(Error::Usage(format!(
            "upgrade: the running server passed {what} on, and this one is to serve HTTPS over TCP on {want}: \
             give the upgrade the running server's --alt-svc-tcp"
        )));
    }
    Ok(l)
}

/// A listener ready to serve: its socket, TLS configuration and runtime made (what can fail
/// has), not accepting yet ([`PreparedTcp::run`]). For an upgrade: made before the new
/// process takes over, run after.
pub struct PreparedTcp {
    rt: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    addr: SocketAddr,
    limits: TcpLimits,
}

impl std::fmt::Debug for PreparedTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTcp").field("addr", &self.addr).field("limits", &self.limits).finish_non_exhaustive()
    }
}

impl PreparedTcp {
    /// Prepares serving on `listener` with the certificate chain and key in the PEM files
    /// `cert` and `key` (loaded now, so the files may then be removed); with `keylog`, the
    /// TLS secrets of every connection are appended to it (rustls's `KeyLog`).
    pub fn new(
        listener: std::net::TcpListener,
        cert: &Path,
        key: &Path,
        limits: TcpLimits,
        keylog: Option<udpx_quic::KeyLog>,
    ) -> Result<PreparedTcp, Error> {
        let mut tls = tls_config(cert, key)?;
        if let Some(k) = keylog {
            tls.key_log = Arc::new(KeyLogTo(k));
        }
        let tls = Arc::new(tls);
        listener.set_nonblocking(true).map_err(Error::Io)?;
        let addr = listener.local_addr().map_err(Error::Io)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(READ_THREADS)
            .thread_name("udpx-h3-tcp-read")
            .build()
            .map_err(Error::Io)?;
        let listener = {
            let _in_rt = rt.enter();
            tokio::net::TcpListener::from_std(listener).map_err(Error::Io)?
        };
        Ok(PreparedTcp { rt, listener, acceptor: tokio_rustls::TlsAcceptor::from(tls), addr, limits })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts accepting, answering from `site`. When `drain` starts, the listener stops
    /// accepting, ends its HTTP/2 connections with GOAWAY and its HTTP/1.1 ones after the
    /// response under way, and closes what is left at the drain's deadline. A plain drain
    /// withdraws what it passed on (`pass_on`) and closes its socket (not `shutdown()`); a
    /// handover's keeps the socket open but does not accept from it (the successor accepts from
    /// the same queue), so that if the drain is called off (the successor died) it accepts again.
    pub fn run(self, site: Arc<Site>, drain: &Arc<DrainSignal>, pass_on: PassOn) -> Result<TcpServer, Error> {
        let PreparedTcp { rt, listener, acceptor, addr, limits } = self;
        let counters = Arc::new(TcpCounters::default());
        counters.accepting.store(true, Ordering::Release);
        let (stop, stopped) = oneshot::channel::<()>();
        let (drain_tx, drain_rx) = watch::channel(None);
        let (accept_tx, accept_rx) = watch::channel(Accept::Yes);
        drain.on_change(Box::new(move |e| {
            let (deadline, accept) = match e {
                DrainEvent::Started { timeout, handover } => (
                    Some(tokio::time::Instant::now() + timeout),
                    if handover { Accept::Paused } else { Accept::Closed },
                ),
                DrainEvent::Cancelled => (None, Accept::Yes),
            };
            let _ = drain_tx.send(deadline);
            let _ = accept_tx.send(accept);
        }));
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name("udpx-h3-tcp".into())
            .spawn(move || {
                rt.block_on(async move {
                    let l = Listener { listener, acceptor, site, counters: c, limits, accept: accept_rx, pass_on };
                    tokio::spawn(accept_loop(l, drain_rx));
                    // A send or a dropped sender: either way, stop.
                    let _ = stopped.await;
                });
                // Drops the accept loop and every connection; a file read in flight has
                // this long to return.
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .map_err(Error::Io)?;
        Ok(TcpServer { addr, counters, stop: Some(stop), thread: Some(thread) })
    }
}

/// Whether the listener accepts (see [`PreparedTcp::run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accept {
    Yes,
    /// A handover's drain: not accepting, the socket kept (the drain may be called off).
    Paused,
    /// A drain: the socket closed.
    Closed,
}

/// What the accept loop holds.
struct Listener {
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    site: Arc<Site>,
    counters: Arc<TcpCounters>,
    limits: TcpLimits,
    accept: watch::Receiver<Accept>,
    pass_on: PassOn,
}

/// rustls on `ring`, TLS 1.3 and 1.2, ALPN `h2` then `http/1.1`.
fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, Error> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::Usage(format!("certificate {}: not a PEM certificate chain ({e})", cert.display())))?;
    if certs.is_empty() {
        return Err(Error::Usage(format!("certificate {}: no certificate in the file", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::Usage(format!("key {}: not a PEM private key ({e})", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(format!("TLS over TCP: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Error::Usage(format!("certificate and key for TLS over TCP: {e}")))?;
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(c)
}

/// rustls's key log, into the file the QUIC side writes too.
#[derive(Debug)]
struct KeyLogTo(udpx_quic::KeyLog);

impl rustls::KeyLog for KeyLogTo {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        self.0.log(label, client_random, secret);
    }

    fn will_log(&self, _label: &str) -> bool {
        true
    }
}

async fn accept_loop(l: Listener, drain: watch::Receiver<Option<tokio::time::Instant>>) {
    let Listener { listener, acceptor, site, counters, limits, mut accept, pass_on } = l;
    let limit = Arc::new(Semaphore::new(limits.max_connections));
    let sources: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let registry = Arc::new(Registry::new());
    loop {
        let now = *accept.borrow_and_update();
        counters.accepting.store(now == Accept::Yes, Ordering::Release);
        match now {
            Accept::Yes => {}
            Accept::Paused => {
                log::debug!("udpx-h3: HTTPS over TCP: handed over, no longer accepting");
                if accept.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Accept::Closed => {
                // Our copies closed, never shut down: a successor may accept from this very
                // queue.
                pass_on.withdraw();
                log::debug!("udpx-h3: HTTPS over TCP: draining, no longer accepting");
                return;
            }
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            // (A closed channel, a drain that can no longer come, disables this.)
            Ok(()) = accept.changed() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors or memory, or the peer gave up before accept: none of
                // these ends the listener. A pause keeps EMFILE from spinning.
                counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                log::debug!("udpx-h3: accept over TCP: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(share) = SourceShare::take(&sources, peer.ip(), limits.per_source) else {
            counters.per_source_refused.fetch_add(1, Ordering::Relaxed);
            drop(tcp); // closed at once
            continue;
        };
        let permit = match limit.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // At the cap: the connection idle longest is told to go (nginx closes its
                // idle keep-alive connections the same way when it runs short), and this one
                // waits a moment for its permit; with every connection busy it is closed.
                if let Some(idle) = registry.oldest_idle() {
                    counters.evicted.fetch_add(1, Ordering::Relaxed);
                    idle.evict.notify_one();
                }
                match tokio::time::timeout(CAP_WAIT, limit.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        counters.full_refused.fetch_add(1, Ordering::Relaxed);
                        drop(tcp);
                        continue;
                    }
                }
            }
        };
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new(registry.epoch));
        let open = Open::count(&counters, &registry, activity.clone());
        let drain = drain.clone();
        let _ = tcp.set_nodelay(true);
        let written = Arc::new(AtomicU64::new(0));
        let linger_cap = limits.max_connections;
        let line = CloseLine { site: site.clone(), peer, opened: Instant::now(), activity: activity.clone() };
        let tcp = Metered { inner: Some(tcp), written: written.clone(), counters: counters.clone(), linger_cap, line };
        let (acceptor, site, counters) = (acceptor.clone(), site.clone(), counters.clone());
        tokio::spawn(async move {
            let _held = (permit, share, open);
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    counters.tls_failed.fetch_add(1, Ordering::Relaxed);
                    log::debug!("udpx-h3: {peer}: TLS handshake over TCP: {e}");
                    return;
                }
                Err(_) => {
                    counters.tls_failed.fetch_add(1, Ordering::Relaxed);
                    activity.server_closes();
                    log::debug!("udpx-h3: {peer}: no TLS handshake within {HANDSHAKE_TIMEOUT:?}");
                    return;
                }
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            activity.touch();
            activity.ready.store(true, Ordering::Release);
            let conn = http2::Conn { site, peer, activity, counters, limits, drain };
            if h2 {
                // HTTP/2 by ALPN: on h2 itself, each stream parked or reset alone.
                conn.counters.http2.fetch_add(1, Ordering::Relaxed);
                http2::serve(tls, conn).await;
                return;
            }
            serve_hyper(tls, conn, &written).await;
        });
    }
}

/// Serves HTTP/1.1 (and HTTP/2 sniffed from its preface where the peer gave no ALPN) on `tls`
/// with hyper until the connection ends: the peer's end, a drain (GOAWAY or `Connection:
/// close`, then the deadline), the cap (the idle-longest goes), a response moving too little
/// per window (`written`: the bytes the connection wrote), or idleness.
async fn serve_hyper(tls: tokio_rustls::server::TlsStream<Metered>, cx: http2::Conn, written: &AtomicU64) {
    let http2::Conn { site, peer, activity, counters, limits, mut drain } = cx;
    let mut b = auto::Builder::new(TokioExecutor::new());
    // hyper's HTTP/1 write queue takes body chunks until it holds max_buf_size bytes
    // (400 KB by default): one chunk is enough to keep the socket busy.
    b.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(CHUNK);
    // HTTP/2 polls a body while the stream has flow-control window, which a client
    // may make 32 MB (curl does): h2 then queues up to max_send_buf_size per stream
    // (400 KB by default) ahead of the socket; one chunk is enough. An HTTP/2
    // connection may idle for long (browsers keep them); pings find the peers that
    // vanished, so their permits come back.
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(100)
        .max_send_buf_size(CHUNK)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    // ALPN decided; a peer without ALPN gets hyper's sniffing of the HTTP/2 preface.
    let b = match tls.get_ref().1.alpn_protocol() {
        Some(b"h2") => b.http2_only(),
        Some(b"http/1.1") => b.http1_only(),
        _ => b,
    };
    // Bodies under way (while any is, it must keep taking bytes) and requests (none
    // new and no body under way for `idle`, and it is closed); idle, it may be evicted.
    let on_req = activity.clone();
    let service = hyper::service::service_fn(move |req| {
        on_req.requests.fetch_add(1, Ordering::Relaxed);
        on_req.touch();
        let resp = respond(&site, peer, req, &on_req);
        async move { Ok::<_, Infallible>(resp) }
    });
    let conn = b.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    // A drain: GOAWAY (HTTP/2) or `Connection: close` after the response under way
    // (HTTP/1.1; an idle one closes at once), then the deadline.
    let mut close_at = None;
    let mut check = tokio::time::interval(limits.window);
    check.tick().await; // the first tick is now
    let mut seen = written.load(Ordering::Relaxed);
    let mut busy_since_check = false;
    let (mut requests_seen, mut active_at) = (0, Instant::now());
    loop {
        tokio::select! {
            r = &mut conn => {
                if let Err(e) = r {
                    log::debug!("udpx-h3: {peer}: HTTP over TCP: {e}");
                }
                return;
            }
            Ok(deadline) = drain.wait_for(Option::is_some), if close_at.is_none() => {
                close_at = *deadline;
                drop(deadline);
                activity.server_closes();
                conn.as_mut().graceful_shutdown();
            }
            () = activity.evict.notified(), if close_at.is_none() => {
                // Idle at the cap: closed to make room (GOAWAY first for HTTP/2).
                log::debug!("udpx-h3: {peer}: idle at the connection cap: closed");
                activity.server_closes();
                conn.as_mut().graceful_shutdown();
                close_at = Some(tokio::time::Instant::now() + Duration::from_secs(1));
            }
            () = tokio::time::sleep_until(close_at.unwrap_or_else(tokio::time::Instant::now)), if close_at.is_some() => {
                counters.drain_closed.fetch_add(1, Ordering::Relaxed);
                log::debug!("udpx-h3: {peer}: still open at the drain's deadline: closed");
                return;
            }
            _ = check.tick() => {
                let now = written.load(Ordering::Relaxed);
                let busy = activity.bodies.load(Ordering::Relaxed) > 0;
                // A response under way at both ends of the window that moved too
                // little: a slow reader or a stalled window. Closed (the connection
                // future is dropped), counted.
                if busy && busy_since_check && now - seen < limits.min_bytes {
                    counters.too_slow.fetch_add(1, Ordering::Relaxed);
                    activity.server_closes();
                    log::debug!("udpx-h3: {peer}: {} B in {:?} with a response under way: closed", now - seen, limits.window);
                    return;
                }
                busy_since_check = busy;
                seen = now;
                let r = activity.requests.load(Ordering::Relaxed);
                if busy || r != requests_seen {
                    (requests_seen, active_at) = (r, Instant::now());
                } else if active_at.elapsed() >= limits.idle {
                    counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                    activity.server_closes();
                    log::debug!("udpx-h3: {peer}: idle for {:?}: closed", limits.idle);
                    return;
                }
            }
        }
    }
}

/// One open connection in the gauge and the registry, taken off on drop.
struct Open {
    counters: Arc<TcpCounters>,
    registry: Arc<Registry>,
    id: u64,
}

impl Open {
    fn count(c: &Arc<TcpCounters>, registry: &Arc<Registry>, activity: Arc<Activity>) -> Open {
        c.open.fetch_add(1, Ordering::AcqRel);
        let id = registry.add(activity);
        Open { counters: c.clone(), registry: registry.clone(), id }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.registry.remove(self.id);
        self.counters.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One connection's share of its address's cap, given back on drop.
struct SourceShare {
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl SourceShare {
    fn take(sources: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, cap: usize) -> Option<SourceShare> {
        // IPv4 as is (a v4-mapped IPv6 address too), IPv6 by its /64.
        let ip = udpx_quic::admission::ip_key(ip.to_canonical());
        let mut m = sources.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(SourceShare { sources: sources.clone(), ip })
    }
}

impl Drop for SourceShare {
    fn drop(&mut self) {
        let mut m = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// A socket that counts the bytes written to it (under TLS: the records), for the minimum
/// rate, and that is closed lingering when the connection is done with it (see [`linger`]).
struct Metered {
    inner: Option<tokio::net::TcpStream>,
    written: Arc<AtomicU64>,
    counters: Arc<TcpCounters>,
    /// At most this many sockets linger at once (more are closed at once).
    linger_cap: usize,
    /// For its line in the access log at the close.
    line: CloseLine,
}

/// What a TCP connection's close line needs beside the kernel's figures.
struct CloseLine {
    site: Arc<Site>,
    peer: SocketAddr,
    opened: Instant,
    activity: Arc<Activity>,
}

impl CloseLine {
    /// Writes the line (when the site logs), with `tcp`'s `TCP_INFO`.
    fn write(&self, tcp: &tokio::net::TcpStream) {
        use std::os::fd::AsFd;
        if !self.site.logs() {
            return;
        }
        let fd = tcp.as_fd();
        let i = udpx::tcp::info(fd).unwrap_or_default();
        let cc = udpx::tcp::congestion(fd).unwrap_or_else(|_| "-".into());
        self.site.connection_closed(&crate::http::ConnClose {
            protocol: self.activity.protocol.get().copied().unwrap_or("tls"),
            peer: self.peer,
            duration: self.opened.elapsed(),
            rtt: i.rtt,
            min_rtt: Some(i.min_rtt).filter(|d| !d.is_zero()),
            sent: i.segs_out,
            lost: i.lost,
            retransmitted: i.total_retrans,
            cc: &cc,
            cwnd: i.cwnd,
            bytes_sent: i.bytes_sent,
            bytes_received: i.bytes_received,
            requests: self.activity.requests.load(Ordering::Relaxed),
            closed_by: if self.activity.server_closed.load(Ordering::Relaxed) { "server" } else { "client" },
            error: None,
            cause: None,
        });
    }
}

impl Metered {
    fn io(&mut self) -> Pin<&mut tokio::net::TcpStream> {
        Pin::new(self.inner.as_mut().expect("taken only on drop"))
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        let Some(tcp) = self.inner.take() else { return };
        self.line.write(&tcp);
        // Dropped outside the runtime (it is shutting down): closed at once.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let c = &self.counters;
        if c.lingering.fetch_add(1, Ordering::Relaxed) as usize >= self.linger_cap {
            c.lingering.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        rt.spawn(linger(tcp, Lingering(self.counters.clone())));
    }
}

/// How long a closed connection reads and discards its client's late bytes at most, and how
/// many it discards at most (nginx: `lingering_time` 30 s, `lingering_timeout` 5 s).
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 * 1024;

/// A lingering close. The HTTP layer has ended its side (HTTP/2's GOAWAY, TLS's close_notify);
/// this sends the FIN behind the last bytes written, then reads and discards what the client
/// still sends until it closes, or for [`LINGER_TIME`], or [`LINGER_BYTES`]. Closed at once,
/// a socket answers the client's late bytes (the WINDOW_UPDATEs that cross a GOAWAY) with a
/// reset: the client's next write fails, and what it had not read yet is lost.
async fn linger(mut tcp: tokio::net::TcpStream, _gauge: Lingering) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = tokio::time::Instant::now() + LINGER_TIME;
    if tokio::time::timeout_at(deadline, tcp.shutdown()).await.is_ok_and(|r| r.is_ok()) {
        let mut buf = vec![0u8; 16 * 1024];
        let mut left = LINGER_BYTES;
        while let Ok(Ok(n @ 1..)) = tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            let Some(l) = left.checked_sub(n) else { break };
            left = l;
        }
    }
}

/// One lingering socket in the gauge, taken off on drop (also when the runtime stops).
struct Lingering(Arc<TcpCounters>);

impl Drop for Lingering {
    fn drop(&mut self) {
        self.0.lingering.fetch_sub(1, Ordering::Relaxed);
    }
}

impl tokio::io::AsyncRead for Metered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io().poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Metered {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = self.io().poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = self.io().poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|t| t.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io().poll_shutdown(cx)
    }
}

/// One request over hyper (HTTP/1.1, or HTTP/2 a peer chose without ALPN).
fn respond(
    site: &Arc<Site>,
    peer: SocketAddr,
    req: Request<Incoming>,
    activity: &Arc<Activity>,
) -> Response<FileStream> {
    let protocol = if req.version() == Version::HTTP_2 { "h2" } else { "http/1.1" };
    activity.protocol.get_or_init(|| protocol);
    let (head, _) = req.into_parts();
    let Answered { status, headers, body, log } = answer(site, peer, &head, protocol);
    let mut resp = Response::new(FileStream::new(body, log, activity.clone()));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// A response body: the file, read [`CHUNK`] bytes at a time on the blocking pool, one read
/// in flight; or nothing. Dropping it (hyper does once the body is sent or the peer left)
/// reports the response to [`Site::finished`].
struct FileStream {
    read: Reading,
    /// Bytes still to send.
    left: u64,
    log: Finish,
    /// The connection's activity: its count of bodies under way (this one counts while bytes
    /// are left).
    activity: Arc<Activity>,
    counted: bool,
}

impl Drop for FileStream {
    fn drop(&mut self) {
        if self.counted {
            self.activity.touch();
            self.activity.bodies.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

enum Reading {
    /// Between reads (`None`: no body, or it failed).
    Idle(Option<Held>),
    /// A chunk being read; the file comes back with it.
    Busy(JoinHandle<(Held, io::Result<Vec<u8>>)>),
}

impl FileStream {
    fn new(body: Option<FileBody>, mut log: Finish, activity: Arc<Activity>) -> FileStream {
        let (read, left) = match body {
            Some(FileBody { file, len, .. }) => (Reading::Idle(Some(Held::new(file, &log.site))), len),
            None => (Reading::Idle(None), 0),
        };
        log.complete = left == 0;
        let counted = left > 0;
        if counted {
            activity.bodies.fetch_add(1, Ordering::Relaxed);
        }
        FileStream { read, left, log, activity, counted }
    }
}

impl Body for FileStream {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            match &mut this.read {
                Reading::Idle(file) => {
                    if this.left == 0 {
                        return Poll::Ready(None);
                    }
                    let Some(mut file) = file.take() else { return Poll::Ready(None) };
                    let n = this.left.min(CHUNK as u64) as usize;
                    this.read = Reading::Busy(tokio::task::spawn_blocking(move || {
                        let mut buf = vec![0; n];
                        let r = file.file.read_exact(&mut buf).map(|()| buf);
                        (file, r)
                    }));
                }
                Reading::Busy(job) => {
                    let done = ready!(Pin::new(job).poll(cx));
                    this.read = Reading::Idle(None);
                    let (file, r) = match done {
                        Ok(d) => d,
                        Err(e) => return Poll::Ready(Some(Err(io::Error::other(e)))),
                    };
                    return Poll::Ready(Some(match r {
                        Ok(buf) => {
                            this.read = Reading::Idle(Some(file));
                            this.left -= buf.len() as u64;
                            this.log.bytes += buf.len() as u64;
                            this.log.complete = this.left == 0;
                            Ok(Frame::data(Bytes::from(buf)))
                        }
                        Err(e) => {
                            // Shorter than announced: fail the response rather than end it
                            // early with a body that looks complete.
                            log::warn!("udpx-h3: {}: reading the file failed: {e}", this.log.path);
                            Err(e)
                        }
                    }));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
