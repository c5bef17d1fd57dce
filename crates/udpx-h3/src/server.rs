//! The HTTP/3 file server: an [`App`] on every connection of every shard.
//!
//! A response body is read from disk only as fast as the stream takes it: each turn, a
//! stream with a body asks quiche for its capacity (flow control and congestion window) and
//! reads at most that much, at most [`CHUNK`] bytes, into its own buffer; what `send_body`
//! does not take stays there for the next turn. A response therefore holds at most one chunk
//! in memory, whatever the file size.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quiche::h3::NameValue;
use serde::Serialize;
use udpx_quic::{App, HostCounters, IoMode, Server, ServerConfig};

use crate::files::{resolve, Refusal};
use crate::tls::{pem_files, server_config, Tls};
use crate::Error;

/// Largest read from a file per stream and turn.
pub const CHUNK: usize = 64 * 1024;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Certificate.
    pub tls: Tls,
    /// How packets leave.
    pub io: IoMode,
    /// Receive with GRO where available.
    pub gro: bool,
    /// Event loops (one socket and thread each).
    pub shards: usize,
    /// QUIC-LB host ID in the connection IDs.
    pub host_id: u16,
    /// Largest UDP payload sent (quiche's `max_send_udp_payload_size`; the peer may ask for
    /// less).
    pub max_udp_payload: usize,
}

impl ServeConfig {
    /// Port 4433 on loopback, a self-signed certificate, `gso-mmsg`, GRO on, one shard.
    pub fn new(listen: SocketAddr) -> ServeConfig {
        ServeConfig {
            listen,
            tls: Tls::SelfSigned,
            io: IoMode::GsoMmsg,
            gro: true,
            shards: 1,
            host_id: 0,
            max_udp_payload: DEFAULT_MAX_UDP_PAYLOAD,
        }
    }
}

/// An Ethernet MTU of 1500 less the IPv6 and UDP headers: fits both families on common paths.
pub const DEFAULT_MAX_UDP_PAYLOAD: usize = 1452;

/// HTTP counters, shared by the shards.
#[derive(Debug, Default)]
pub struct HttpCounters {
    requests: AtomicU64,
    ok: AtomicU64,
    bad_request: AtomicU64,
    forbidden: AtomicU64,
    not_found: AtomicU64,
    method_not_allowed: AtomicU64,
    body_bytes: AtomicU64,
    streams_reset: AtomicU64,
}

/// A snapshot of [`HttpCounters`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HttpSnapshot {
    /// Requests whose headers arrived.
    pub requests: u64,
    /// 200 responses.
    pub ok: u64,
    /// 400 responses.
    pub bad_request: u64,
    /// 403 responses (paths leaving the directory).
    pub forbidden: u64,
    /// 404 responses.
    pub not_found: u64,
    /// 405 responses.
    pub method_not_allowed: u64,
    /// Body bytes quiche took.
    pub body_bytes: u64,
    /// Responses abandoned because the peer reset or stopped the stream.
    pub streams_reset: u64,
}

impl HttpCounters {
    fn snapshot(&self) -> HttpSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HttpSnapshot {
            requests: g(&self.requests),
            ok: g(&self.ok),
            bad_request: g(&self.bad_request),
            forbidden: g(&self.forbidden),
            not_found: g(&self.not_found),
            method_not_allowed: g(&self.method_not_allowed),
            body_bytes: g(&self.body_bytes),
            streams_reset: g(&self.streams_reset),
        }
    }
}

/// The server's counters: QUIC host and HTTP.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServeCounters {
    /// The QUIC hosts, summed over shards.
    pub quic: HostCounters,
    /// HTTP.
    pub http: HttpSnapshot,
}

/// A running server.
#[derive(Debug)]
pub struct H3Server {
    server: Server,
    http: Arc<HttpCounters>,
    generated_cert: bool,
}

/// Starts serving the files under `dir` (see the crate docs); returns once every shard
/// listens.
pub fn serve(dir: &Path, cfg: &ServeConfig) -> Result<H3Server, Error> {
    let root = dir.canonicalize().map_err(|e| Error::Usage(format!("directory {}: {e}", dir.display())))?;
    if !root.is_dir() {
        return Err(Error::Usage(format!("{} is not a directory: give the directory to serve", dir.display())));
    }
    let files = pem_files(&cfg.tls)?;
    let http = Arc::new(HttpCounters::default());
    let scfg = ServerConfig { listen: cfg.listen, shards: cfg.shards, io: cfg.io, gro: cfg.gro, host_id: cfg.host_id };
    let (root2, http2) = (Arc::new(root), http.clone());
    let max = cfg.max_udp_payload;
    if !(1..=256).contains(&cfg.shards) {
        return Err(Error::Usage(format!(
            "{} shards: give 1 to 256 (the connection ID's worker byte numbers them)",
            cfg.shards
        )));
    }
    let configs = (0..cfg.shards).map(|_| server_config(&files, max)).collect::<Result<Vec<_>, _>>()?;
    let server = Server::start(&scfg, configs, move |_shard| FileServer {
        root: root2.clone(),
        http: http2.clone(),
        scratch: vec![0; CHUNK],
        h3_config: quiche::h3::Config::new().expect("quiche's h3::Config::new cannot fail"),
    })
    .map_err(Error::Quic)?;
    drop(files); // loaded into every configuration: a generated one is removed now
    Ok(H3Server { server, http, generated_cert: cfg.tls == Tls::SelfSigned })
}

impl H3Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Whether the certificate was generated (say so to the user).
    pub fn generated_cert(&self) -> bool {
        self.generated_cert
    }

    /// The counters so far (each shard publishes when it is about to wait).
    pub fn counters(&self) -> ServeCounters {
        ServeCounters { quic: self.server.counters(), http: self.http.snapshot() }
    }

    /// Queues a send fault on shard `shard`'s socket (test builds, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, shard: usize, fault: udpx::Fault) {
        self.server.inject_fault(shard, fault);
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
        let quic = self.server.stop().map_err(Error::Quic)?;
        Ok(ServeCounters { quic, http: self.http.snapshot() })
    }
}

struct FileServer {
    root: Arc<PathBuf>,
    http: Arc<HttpCounters>,
    scratch: Vec<u8>,
    h3_config: quiche::h3::Config,
}

/// A response being sent.
struct Response {
    /// Headers not yet taken by quiche (a full stream refuses them).
    headers: Option<Vec<quiche::h3::Header>>,
    /// The headers end the stream (HEAD, empty body, errors).
    fin_with_headers: bool,
    body: Option<Body>,
}

struct Body {
    file: File,
    /// Bytes of the file not yet read.
    left: u64,
    buf: Vec<u8>,
    /// Bytes of `buf` already taken.
    off: usize,
}

struct ConnState {
    h3: Option<quiche::h3::Connection>,
    responses: HashMap<u64, Response>,
}

impl App for FileServer {
    type State = ConnState;

    fn accepted(&mut self, _conn: &quiche::Connection) -> ConnState {
        ConnState { h3: None, responses: HashMap::new() }
    }

    fn on_turn(&mut self, conn: &mut quiche::Connection, st: &mut ConnState) {
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
        let Some(h3) = st.h3.as_mut() else { return };
        loop {
            match h3.poll(conn) {
                Ok((sid, quiche::h3::Event::Headers { list, .. })) => {
                    self.http.requests.fetch_add(1, Ordering::Relaxed);
                    let r = self.respond(&list);
                    st.responses.insert(sid, r);
                }
                Ok((sid, quiche::h3::Event::Data)) => {
                    // A request body: not used by GET or HEAD; read and dropped.
                    while let Ok(n) = h3.recv_body(conn, sid, &mut self.scratch) {
                        if n == 0 {
                            break;
                        }
                    }
                }
                Ok((sid, quiche::h3::Event::Reset(_))) => {
                    if st.responses.remove(&sid).is_some() {
                        self.http.streams_reset.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(_) => {}
                Err(quiche::h3::Error::Done) => break,
                Err(e) => {
                    log::debug!("udpx-h3: {}: {e}", conn.trace_id());
                    break;
                }
            }
        }
        let mut finished = Vec::new();
        for (&sid, r) in st.responses.iter_mut() {
            match progress(h3, conn, sid, r, &self.http.body_bytes) {
                Ok(true) => finished.push(sid),
                Ok(false) => {}
                Err(()) => {
                    self.http.streams_reset.fetch_add(1, Ordering::Relaxed);
                    finished.push(sid);
                }
            }
        }
        for sid in finished {
            st.responses.remove(&sid);
        }
    }

    fn closed(&mut self, _conn: &quiche::Connection, _state: ConnState) {}
}

impl FileServer {
    fn respond(&self, list: &[quiche::h3::Header]) -> Response {
        let mut method = None;
        let mut path = None;
        for h in list {
            match h.name() {
                b":method" => method = Some(h.value().to_vec()),
                b":path" => path = Some(h.value().to_vec()),
                _ => {}
            }
        }
        let (Some(method), Some(path)) = (method, path) else {
            self.http.bad_request.fetch_add(1, Ordering::Relaxed);
            return status_only(400, &[]);
        };
        let head = match method.as_slice() {
            b"GET" => false,
            b"HEAD" => true,
            _ => {
                self.http.method_not_allowed.fetch_add(1, Ordering::Relaxed);
                return status_only(405, &[("allow", "GET, HEAD")]);
            }
        };
        let refused = |r: Refusal| {
            let c = match r {
                Refusal::BadRequest => &self.http.bad_request,
                Refusal::Forbidden => &self.http.forbidden,
                Refusal::NotFound => &self.http.not_found,
            };
            c.fetch_add(1, Ordering::Relaxed);
            status_only(r.status(), &[])
        };
        let Ok(path) = std::str::from_utf8(&path) else { return refused(Refusal::BadRequest) };
        let file = match resolve(&self.root, path) {
            Ok(f) => f,
            Err(r) => return refused(r),
        };
        let Ok(file) = File::open(&file) else { return refused(Refusal::NotFound) };
        let Ok(len) = file.metadata().map(|m| m.len()) else { return refused(Refusal::NotFound) };
        self.http.ok.fetch_add(1, Ordering::Relaxed);
        let headers = vec![
            quiche::h3::Header::new(b":status", b"200"),
            quiche::h3::Header::new(b"content-length", len.to_string().as_bytes()),
            quiche::h3::Header::new(b"server", b"udpx-h3"),
        ];
        let body = (!head && len > 0).then(|| Body { file, left: len, buf: Vec::new(), off: 0 });
        Response { headers: Some(headers), fin_with_headers: body.is_none(), body }
    }
}

fn status_only(status: u16, extra: &[(&str, &str)]) -> Response {
    let mut headers = vec![
        quiche::h3::Header::new(b":status", status.to_string().as_bytes()),
        quiche::h3::Header::new(b"content-length", b"0"),
        quiche::h3::Header::new(b"server", b"udpx-h3"),
    ];
    for (n, v) in extra {
        headers.push(quiche::h3::Header::new(n.as_bytes(), v.as_bytes()));
    }
    Response { headers: Some(headers), fin_with_headers: true, body: None }
}

/// Moves a response on as far as the stream takes it, adding the body bytes taken to `sent`.
/// `Ok(true)`: done; `Err(())`: the stream is gone (reset, stopped) or the file failed.
fn progress(
    h3: &mut quiche::h3::Connection,
    conn: &mut quiche::Connection,
    sid: u64,
    r: &mut Response,
    sent: &AtomicU64,
) -> Result<bool, ()> {
    if let Some(h) = r.headers.take() {
        match h3.send_response(conn, sid, &h, r.fin_with_headers) {
            Ok(()) => {}
            Err(quiche::h3::Error::StreamBlocked | quiche::h3::Error::Done) => {
                r.headers = Some(h);
                return Ok(false);
            }
            Err(_) => return Err(()),
        }
    }
    let Some(b) = r.body.as_mut() else { return Ok(true) };
    loop {
        if b.off == b.buf.len() {
            if b.left == 0 {
                return Ok(true);
            }
            let cap = match conn.stream_capacity(sid) {
                Ok(c) => c,
                Err(_) => return Err(()),
            };
            if cap == 0 {
                return Ok(false);
            }
            let n = (cap.min(CHUNK) as u64).min(b.left) as usize;
            b.buf.resize(n, 0);
            if b.file.read_exact(&mut b.buf).is_err() {
                // The file shrank or failed under us: the stream cannot be completed honestly.
                let _ = conn.stream_shutdown(sid, quiche::Shutdown::Write, 0x102);
                return Err(());
            }
            b.left -= n as u64;
            b.off = 0;
        }
        let fin = b.left == 0;
        match h3.send_body(conn, sid, &b.buf[b.off..], fin) {
            Ok(w) => {
                b.off += w;
                sent.fetch_add(w as u64, Ordering::Relaxed);
                if b.off < b.buf.len() {
                    return Ok(false);
                }
                if fin {
                    b.buf = Vec::new();
                    return Ok(true);
                }
            }
            Err(quiche::h3::Error::Done | quiche::h3::Error::StreamBlocked) => return Ok(false),
            Err(_) => return Err(()),
        }
    }
}
