//! HTTP/2 (ALPN `h2`) on the h2 crate directly, not through hyper: a paused stream is not an
//! attack (the third review, issue 46), and only the stream's own send half can say so.
//!
//! Each response is sent as its stream's flow control allows: capacity asked for, the file
//! read only as much as was granted (at most [`CHUNK`]), handed to h2 at once, so a stream
//! holds no body bytes beyond its window and a stalled one holds only its file. A response
//! that takes less than `min_bytes` in a `window` (its client stopped reading: a video
//! player's buffer is full) is *parked*: its file is given back. When its window opens again
//! the file is opened again by the site's rules ([`Site::reopen`]), checked against the
//! response's ETag, and the response goes on where it was; a changed or missing file resets
//! the stream (RST_STREAM INTERNAL_ERROR, `http_resume_refused`). One parked for `park` is
//! reset (RST_STREAM CANCEL, `http_stalled`). The connection and its other streams go on in
//! every case; the HTTP/3 responder does the same ([`crate::responder`]).
//!
//! hyper cannot do this: it polls a body only when the stream has capacity, and offers no
//! way to reset one stream of a connection from outside it.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, SendStream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Instant;

use super::activity::Activity;
use super::answer::{answer, Answered, Held};
use super::counters::TcpCounters;
use super::limits::{TcpLimits, H2_PING_INTERVAL, H2_PING_TIMEOUT};
use crate::http::{FileBody, Site, CHUNK};

/// Streams a peer may have open at once (as over HTTP/3).
const MAX_STREAMS: u32 = 100;
/// The largest request field section (as over HTTP/3).
const MAX_HEADER_LIST: u32 = crate::tls::MAX_FIELD_SECTION as u32;

/// What a connection's loop needs.
pub(super) struct Conn {
    pub site: Arc<Site>,
    pub peer: SocketAddr,
    pub activity: Arc<Activity>,
    pub counters: Arc<TcpCounters>,
    pub limits: TcpLimits,
    pub drain: watch::Receiver<Option<Instant>>,
}

/// Serves HTTP/2 on `io` (TLS done, ALPN `h2`) until the connection ends: the peer's end, a
/// drain (GOAWAY, then the deadline), the cap (the idle-longest goes), idleness, or a peer
/// that stops answering PINGs.
pub(super) async fn serve<T: AsyncRead + AsyncWrite + Unpin>(io: T, mut cx: Conn) {
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(CHUNK)
        .handshake::<_, Bytes>(io);
    let mut conn = match tokio::time::timeout(super::HEADER_TIMEOUT, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            log::debug!("udpx-h3: {}: HTTP/2 handshake: {e}", cx.peer);
            return;
        }
        Err(_) => return,
    };
    let mut pings = conn.ping_pong();
    let mut ping_at = Instant::now() + H2_PING_INTERVAL;
    let mut pong_due: Option<Instant> = None;
    let mut check = tokio::time::interval(cx.limits.window);
    check.tick().await;
    let (mut requests_seen, mut active_at) = (0, Instant::now());
    let mut close_at: Option<Instant> = None;
    loop {
        tokio::select! {
            r = conn.accept() => match r {
                Some(Ok((req, respond))) => {
                    cx.activity.requests.fetch_add(1, Ordering::Relaxed);
                    cx.activity.protocol.get_or_init(|| "h2");
                    cx.activity.touch();
                    let (head, _body) = req.into_parts(); // a request body is not read: dropped
                    let a = answer(&cx.site, cx.peer, &head, "h2");
                    tokio::spawn(respond_stream(a, respond, cx.site.clone(), cx.activity.clone(), cx.limits));
                }
                Some(Err(e)) => {
                    log::debug!("udpx-h3: {}: HTTP/2: {e}", cx.peer);
                    return;
                }
                None => return, // ended: the peer's GOAWAY or close, or ours and no stream left
            },
            Ok(deadline) = cx.drain.wait_for(Option::is_some), if close_at.is_none() => {
                close_at = *deadline;
                drop(deadline);
                cx.activity.server_closes();
                conn.graceful_shutdown();
            }
            () = cx.activity.evict.notified(), if close_at.is_none() => {
                log::debug!("udpx-h3: {}: idle at the connection cap: closed", cx.peer);
                cx.activity.server_closes();
                conn.graceful_shutdown();
                close_at = Some(Instant::now() + Duration::from_secs(1));
            }
            () = tokio::time::sleep_until(close_at.unwrap_or_else(Instant::now)), if close_at.is_some() => {
                cx.counters.drain_closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            () = tokio::time::sleep_until(ping_at), if pong_due.is_none() => {
                // Finds a peer that vanished, so its permit comes back.
                match pings.as_mut().map(|p| p.send_ping(h2::Ping::opaque())) {
                    Some(Ok(())) => pong_due = Some(Instant::now() + H2_PING_TIMEOUT),
                    _ => ping_at = Instant::now() + H2_PING_INTERVAL,
                }
            }
            r = std::future::poll_fn(|c| pings.as_mut().expect("pinging").poll_pong(c)), if pong_due.is_some() => {
                if r.is_err() {
                    return;
                }
                pong_due = None;
                ping_at = Instant::now() + H2_PING_INTERVAL;
            }
            () = tokio::time::sleep_until(pong_due.unwrap_or_else(Instant::now)), if pong_due.is_some() => {
                log::debug!("udpx-h3: {}: no PING answer within {H2_PING_TIMEOUT:?}: closed", cx.peer);
                cx.activity.server_closes();
                return;
            }
            _ = check.tick(), if close_at.is_none() => {
                // No request and no response under way for `idle`: GOAWAY, then closed.
                let r = cx.activity.requests.load(Ordering::Relaxed);
                if cx.activity.bodies.load(Ordering::Relaxed) > 0 || r != requests_seen {
                    (requests_seen, active_at) = (r, Instant::now());
                } else if active_at.elapsed() >= cx.limits.idle {
                    cx.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                    log::debug!("udpx-h3: {}: idle for {:?}: closed", cx.peer, cx.limits.idle);
                    cx.activity.server_closes();
                    conn.graceful_shutdown();
                    close_at = Some(Instant::now() + Duration::from_secs(1));
                }
            }
        }
    }
}

/// Sends one answer on its stream (see the module docs), then reports it (its `log`, dropped).
async fn respond_stream(
    a: Answered,
    mut respond: SendResponse<Bytes>,
    site: Arc<Site>,
    activity: Arc<Activity>,
    limits: TcpLimits,
) {
    let Answered { status, headers, body, mut log } = a;
    let mut head = http::Response::new(());
    *head.status_mut() = status;
    *head.headers_mut() = headers;
    let Some(FileBody { file, len, end, etag, .. }) = body.filter(|b| b.len > 0) else {
        log.complete = respond.send_response(head, true).is_ok();
        return;
    };
    let Ok(mut send) = respond.send_response(head, false) else { return };
    let _busy = Busy::count(&activity);
    let target = log.path.clone();
    let mut file = Some(Held::new(file, &site));
    let mut left = len;
    // The stall rule: at least `min_bytes` taken in every `window`, else parked; parked for
    // `park`, reset.
    let (mut taken, mut check_at, mut parked_at) = (0u64, Instant::now() + limits.window, None::<Instant>);
    while left > 0 {
        send.reserve_capacity(left.min(CHUNK as u64) as usize);
        let granted = tokio::select! {
            c = std::future::poll_fn(|cx| send.poll_capacity(cx)) => match c {
                Some(Ok(n)) => n,
                // The peer reset the stream, or the connection is gone.
                _ => return,
            },
            () = tokio::time::sleep_until(check_at) => {
                let now = Instant::now();
                if taken < limits.min_bytes {
                    match parked_at {
                        None => {
                            // Paused: the file goes back; the stream waits for its window.
                            file = None;
                            parked_at = Some(now);
                            site.count_parked();
                        }
                        Some(t) if now >= t + limits.park => {
                            site.count_stalled();
                            send.send_reset(Reason::CANCEL);
                            return;
                        }
                        Some(_) => {}
                    }
                }
                taken = 0;
                check_at = match parked_at {
                    Some(t) => (now + limits.window).min(t + limits.park),
                    None => now + limits.window,
                };
                continue;
            }
        };
        if granted == 0 {
            continue;
        }
        if file.is_none() {
            // Its client reads again: the same file, or the stream reset.
            match site.reopen(target.as_bytes(), &etag, end - left) {
                Ok(f) => {
                    site.count_resumed(true);
                    file = Some(Held::new(f, &site));
                    parked_at = None;
                    check_at = Instant::now() + limits.window;
                }
                Err(_) => {
                    site.count_resumed(false);
                    send.send_reset(Reason::INTERNAL_ERROR);
                    return;
                }
            }
        }
        let n = (granted as u64).min(left).min(CHUNK as u64) as usize;
        let Some(f) = file.take() else { return };
        let (f, read) = match tokio::task::spawn_blocking(move || read_exactly(f, n)).await {
            Ok(r) => r,
            Err(_) => return,
        };
        let Ok(chunk) = read else {
            // Shorter than announced: reset rather than end with a body that looks whole.
            log::warn!("udpx-h3: {}: reading the file failed", log.path);
            send.send_reset(Reason::INTERNAL_ERROR);
            return;
        };
        file = Some(f);
        left -= n as u64;
        taken += n as u64;
        log.bytes += n as u64;
        if send_data(&mut send, chunk, left == 0).is_err() {
            return;
        }
    }
    log.complete = true;
}

fn send_data(send: &mut SendStream<Bytes>, chunk: Vec<u8>, last: bool) -> Result<(), h2::Error> {
    send.send_data(Bytes::from(chunk), last)
}

fn read_exactly(mut f: Held, n: usize) -> (Held, std::io::Result<Vec<u8>>) {
    let mut buf = vec![0; n];
    let r = f.file.read_exact(&mut buf).map(|()| buf);
    (f, r)
}

/// A body under way on its connection (counted while it is), its end an activity.
struct Busy(Arc<Activity>);

impl Busy {
    fn count(a: &Arc<Activity>) -> Busy {
        a.bodies.fetch_add(1, Ordering::Relaxed);
        Busy(a.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.bodies.fetch_sub(1, Ordering::Relaxed);
    }
}
