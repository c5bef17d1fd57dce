//! # udpx-tokio: udpx under async Rust
//!
//! [`UdpxSocket`] is a UDP socket on the udpx datapath (GSO, GRO, ECN both ways, pktinfo, the
//! no-loss send fallbacks) that a tokio task can await, and it implements quinn's
//! [`AsyncUdpSocket`], so a quinn endpoint runs on udpx with one line: [`endpoint`]. tokio and
//! quinn live in this crate only; the library stays runtime-free.
//!
//! ## Thread model
//! quinn calls [`AsyncUdpSocket::try_send`] and [`AsyncUdpSocket::poll_recv`] from whichever
//! runtime worker runs its endpoint and connection drivers, lending its bytes for the one call
//! only. The socket is non-blocking; readiness comes from tokio's reactor; nothing here waits
//! on a runtime thread (the library's send returns a cursor instead of waiting). Each ring
//! sits behind a mutex with the state it serves, so one thread at a time submits to it. On a
//! multi-thread runtime the rings are not single-issuer (tokio moves tasks between workers);
//! on a current-thread runtime the receive ring is the runtime thread's alone (see Backends).
//!
//! ## What quinn is spared
//! - A GSO refusal costs no packet: udpx re-sends the batch plain (and keeps ECN) before the
//!   call returns. Where that re-send stops part-way (the socket full after `k` of `n`
//!   datagrams), the unsent remainder is copied into a one-transmit queue and the transmit is
//!   reported sent: quinn neither sends the first `k` again (as `WouldBlock` would make it) nor
//!   loses the rest. The queue drains before the next transmit and from the poller; while it
//!   holds a remainder that cannot leave, `try_send` answers `WouldBlock`.
//! - Errors that would end a connection (`try_send`: anything but `WouldBlock`) or the whole
//!   endpoint (`poll_recv`: anything but `ConnectionReset`) for one bad packet or someone
//!   else's ICMP error are counted ([`UdpxSocket::stats`]) and not returned: the datagram is
//!   left to QUIC's loss recovery, as a network drop would be.
//!
//! ## Backends
//! [`Backend::Syscall`]: `sendmsg` with `UDP_SEGMENT`, `recvmmsg` with GRO.
//! [`Backend::IoUring`]: sends as io_uring SENDMSG entries (udpx's io_uring send backend, one
//! `io_uring_enter` per transmit, completed before `try_send` returns: quinn's bytes are not
//! kept, so not copied), receives by a multishot RECVMSG over a ring of provided buffers
//! ([`udpx::uring::UringReceiver`]) whose eventfd tokio waits on. The kernel fills the ring's
//! buffers; quinn lends its own only for one `poll_recv`, so each datagram is copied from the
//! ring into quinn's buffer ([`AdapterStats::bytes_copied`] counts it). Where io_uring is
//! unavailable the socket stays on system calls and says why ([`UdpxSocket::backend_note`]).
//!
//! On a multi-thread runtime the ring's completions are posted by the thread that armed its
//! receive (io_uring task work, `COOP_TASKRUN`): a runtime worker. If that thread exits, the
//! kernel cancels the receive and the next `poll_recv` arms it again. On a current-thread
//! runtime the ring belongs to the runtime's thread ([`UringReceiver::for_this_thread`]:
//! `SINGLE_ISSUER | DEFER_TASKRUN`): the kernel receives into its buffers only when that thread
//! reaps, in one go, instead of interrupting it with task work per wake-up. A receive polled
//! from another thread (the runtime driven from elsewhere) is made by `recvmmsg` there,
//! counted ([`AdapterStats::recvs_off_ring`]); nothing is lost, the ring keeps what it took.
//! Dropping the socket cancels the receive and waits for its end before the ring's buffers
//! are freed (a one-thread ring dropped on another thread leaks them instead).
//!
//! What does not carry over from udpx: zerocopy (quinn's `Transmit` borrows its bytes for one
//! call; zerocopy needs the buffer until the kernel is done) and departure times (quinn paces
//! internally and passes no send time).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use quinn::udp::{EcnCodepoint as QuinnEcn, RecvMeta as QuinnMeta, Transmit as QuinnTransmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::os::fd::AsFd;

use tokio::io::Interest;
use udpx::uring::{UringReceiver, UringRecvStats};
use udpx::{
    EcnCodepoint, RecvMeta, SendBuffers, SendCursor, SendError, SendErrorKind, SendMode, Transmit, UdpSocket, Want,
};

/// The quinn and tokio this crate is built on, for code above it (a tool crate names no
/// runtime of its own).
pub use quinn;
pub use tokio;

/// Messages one receive call takes at most (udpx's `recvmmsg` batch).
const RECV_BATCH: usize = 64;
/// Buffers in an io_uring receive ring, each room for a GRO buffer (64 KiB): 8 MiB a socket.
const RING_BUFFERS: u16 = 128;

/// Which send path the socket uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// System calls (`sendmsg` with GSO, `recvmmsg` with GRO).
    Syscall,
    /// io_uring for sends and receives where available (system calls otherwise, the reason
    /// recorded).
    IoUring,
}

/// Counters of what the adapter kept from quinn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterStats {
    /// Transmits whose datagrams were all handed to the kernel (or queued, see
    /// `remainders_queued`).
    pub transmits: u64,
    /// Transmits refused for good (too large, invalid) or failed by an error: counted, not
    /// returned to quinn; its loss recovery re-sends the data.
    pub send_errors: u64,
    /// Transmits cut short by a full socket after part of them left: the rest was copied and
    /// queued (none sent twice, none dropped).
    pub remainders_queued: u64,
    /// `WouldBlock` answers to quinn (socket full, or a queued remainder not yet out).
    pub would_block: u64,
    /// Receive errors counted and not returned (quinn's endpoint would stop on them).
    pub recv_errors: u64,
    /// Bytes copied from the io_uring receive ring into the caller's buffers (0 on system
    /// calls, which receive straight into them).
    pub bytes_copied: u64,
    /// Receives made by `recvmmsg` on the io_uring backend because the ring belongs to
    /// another thread (a current-thread runtime's ring, polled from elsewhere).
    pub recvs_off_ring: u64,
    /// Datagrams received carrying an ECN codepoint (ECT(0), ECT(1) or CE): whether the
    /// peer's marks arrive, for a bench to report.
    pub ecn_marked: u64,
    /// The io_uring receive's own counts (empty-ring ends, re-arms, waits); zero on system
    /// calls.
    pub ring: UringRecvStats,
}

#[derive(Debug, Default)]
struct Counters {
    transmits: AtomicU64,
    send_errors: AtomicU64,
    remainders_queued: AtomicU64,
    would_block: AtomicU64,
    recv_errors: AtomicU64,
    bytes_copied: AtomicU64,
    recvs_off_ring: AtomicU64,
    ecn_marked: AtomicU64,
}

/// The rest of a transmit the socket stopped taking part-way: its bytes (copied) and where
/// to go on from.
#[derive(Debug)]
struct Remainder {
    destination: SocketAddr,
    contents: Vec<u8>,
    segment_size: Option<usize>,
    src_ip: Option<std::net::IpAddr>,
    ecn: Option<EcnCodepoint>,
    cursor: SendCursor,
}

impl Remainder {
    fn transmit(&self) -> Transmit<'_> {
        Transmit {
            segment_size: self.segment_size,
            src_ip: self.src_ip,
            ecn: self.ecn,
            ..Transmit::new(self.destination, &self.contents)
        }
    }
}

struct SendState {
    bufs: SendBuffers,
    remainder: Option<Remainder>,
}

/// The io_uring receive: the ring (behind a lock: one thread at a time reaps it) and its
/// eventfd, registered with tokio's reactor.
struct RingRecv {
    rx: Mutex<UringReceiver<Arc<UdpSocket>>>,
    ready: tokio::net::unix::pipe::Receiver,
    /// The one thread that may reap a one-thread ring (`None`: any).
    owner: Option<std::thread::ThreadId>,
}

/// A udpx socket a tokio task can await; quinn's [`AsyncUdpSocket`].
///
/// Readiness comes from a tokio socket on a duplicate of the descriptor (the same socket, so
/// the same readiness; no `unsafe` registration), every datagram through the udpx socket; on
/// the io_uring backend, receive readiness from the ring's eventfd.
pub struct UdpxSocket {
    sock: Arc<UdpSocket>,
    io: tokio::net::UdpSocket,
    send: Mutex<SendState>,
    ring: Option<RingRecv>,
    recv_metas: Mutex<Vec<RecvMeta>>,
    counters: Counters,
    gro: bool,
    max_segments: usize,
    backend_note: String,
}

impl fmt::Debug for UdpxSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpxSocket").field("local", &self.sock.local_addr()).finish_non_exhaustive()
    }
}

impl UdpxSocket {
    /// Binds `addr` with GSO, GRO, ECN and pktinfo where the kernel has them, non-blocking,
    /// on `backend`. Must be called inside a tokio runtime (it registers with its reactor).
    pub fn bind(addr: SocketAddr, backend: Backend) -> io::Result<UdpxSocket> {
        let cfg = UdpSocket::builder(addr)
            .send_mode(SendMode::GsoSendmsg)
            .gro(Want::IfAvailable)
            .ecn(Want::IfAvailable)
            .pktinfo(Want::IfAvailable)
            .nonblocking(true)
            .buffers(4 << 20, 4 << 20)
            .io_uring(match backend {
                Backend::Syscall => Want::Off,
                Backend::IoUring => Want::IfAvailable,
            });
        let sock = cfg.bind().map_err(io::Error::from)?;
        UdpxSocket::from_udpx(sock)
    }

    /// Wraps a bound udpx socket (made non-blocking here). Inside a tokio runtime.
    pub fn from_udpx(sock: UdpSocket) -> io::Result<UdpxSocket> {
        sock.set_nonblocking(true)?;
        let caps = sock.capabilities();
        let max_segments = if caps.gso { caps.gso_max_segments.max(1) } else { 1 };
        let dup = std::net::UdpSocket::from(sock.as_fd().try_clone_to_owned()?);
        dup.set_nonblocking(true)?;
        let io = tokio::net::UdpSocket::from_std(dup)?;
        let sock = Arc::new(sock);
        let (ring, backend_note) = match (caps.io_uring, &caps.io_uring_off_reason) {
            (true, _) => match RingRecv::new(&sock) {
                Ok(r) if r.owner.is_some() => {
                    (Some(r), "io_uring sends and receives (the receive ring the runtime thread's)".to_string())
                }
                Ok(r) => (Some(r), "io_uring sends and receives".to_string()),
                Err(e) => (None, format!("io_uring sends, recvmmsg receives: {e}")),
            },
            (false, Some(why)) => (None, format!("system calls: {why}")),
            (false, None) => (None, "system calls".to_string()),
        };
        Ok(UdpxSocket {
            sock,
            io,
            send: Mutex::new(SendState { bufs: SendBuffers::new(), remainder: None }),
            ring,
            recv_metas: Mutex::new(vec![RecvMeta::default(); RECV_BATCH]),
            counters: Counters::default(),
            gro: caps.gro,
            max_segments,
            backend_note,
        })
    }

    /// The udpx socket (its counters and capabilities).
    pub fn udpx(&self) -> &UdpSocket {
        &self.sock
    }

    /// Which send path is in use, and why not io_uring when it was asked for.
    pub fn backend_note(&self) -> &str {
        &self.backend_note
    }

    /// What the adapter kept from quinn.
    pub fn stats(&self) -> AdapterStats {
        let c = &self.counters;
        AdapterStats {
            transmits: c.transmits.load(Relaxed),
            send_errors: c.send_errors.load(Relaxed),
            remainders_queued: c.remainders_queued.load(Relaxed),
            would_block: c.would_block.load(Relaxed),
            recv_errors: c.recv_errors.load(Relaxed),
            bytes_copied: c.bytes_copied.load(Relaxed),
            recvs_off_ring: c.recvs_off_ring.load(Relaxed),
            ecn_marked: c.ecn_marked.load(Relaxed),
            ring: self.ring.as_ref().map(|r| lock(&r.rx).stats()).unwrap_or_default(),
        }
    }

    /// Whether receives go through the io_uring ring.
    pub fn receives_by_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// Sends `transmits` in order, waiting (asynchronously) for room when the socket is full;
    /// nothing is sent twice or dropped on the way (udpx's cursor). An error says how far it
    /// got ([`SendError::sent`]). ENOBUFS (a full device queue) is retried after
    /// [`udpx::enobufs_backoff`], at most [`udpx::ENOBUFS_RETRIES`] times in a row, as the
    /// library's blocking send does.
    pub async fn send(&self, transmits: &[Transmit<'_>]) -> Result<usize, SendError> {
        let mut cursor = SendCursor::default();
        let mut enobufs = 0u32;
        loop {
            // The send itself inside tokio's readiness loop: its WouldBlock clears the
            // writability it was tried on, and the next edge wakes this task.
            let tried = self
                .io
                .async_io(Interest::WRITABLE, || {
                    let mut st = lock(&self.send);
                    // Whatever a quinn transmit left queued goes first.
                    if !self.drain(&mut st) {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    match self.udpx().try_send(&mut st.bufs, transmits, cursor) {
                        Ok(n) => Ok(Ok(n)),
                        Err(e) => {
                            if e.cursor() != cursor {
                                enobufs = 0; // progress since the last stop
                            }
                            cursor = e.cursor();
                            match e.kind {
                                SendErrorKind::WouldBlock => Err(io::ErrorKind::WouldBlock.into()),
                                _ => Ok(Err(e)),
                            }
                        }
                    }
                })
                .await;
            match tried {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if matches!(e.kind, SendErrorKind::NoBuffers) && enobufs < udpx::ENOBUFS_RETRIES => {
                    // A full device queue raises no writability edge: back off and retry.
                    tokio::time::sleep(udpx::enobufs_backoff(enobufs)).await;
                    enobufs += 1;
                }
                Ok(Err(e)) => return Err(e),
                Err(e) => {
                    return Err(SendError {
                        sent: cursor.transmit,
                        partial_segments: cursor.segment,
                        kind: SendErrorKind::Io(e),
                    })
                }
            }
        }
    }

    /// Receives at least one datagram (waiting for it) into `bufs`, its metadata in `meta`, as
    /// [`UdpSocket::recv`] does: GRO buffers whole, with `stride`. Receive errors are returned
    /// here (unlike quinn's path, which counts them).
    pub async fn recv(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_recv_udpx(cx, bufs, meta, false)).await
    }

    /// One receive: a batch from the ring, or a `recvmmsg`. With `count_errors`, receive
    /// errors (an ICMP error, a bad datagram) are counted and the next datagram read instead.
    fn poll_recv_udpx(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
        count_errors: bool,
    ) -> Poll<io::Result<usize>> {
        let n = bufs.len().min(meta.len());
        // Refused before any wait (`UdpSocket::recv` would say so only once a datagram came).
        if self.gro {
            if let Some(b) = bufs[..n].iter().find(|b| b.len() < udpx::GRO_BUFFER) {
                return Poll::Ready(Err(
                    udpx::Error::RecvBufferTooSmall { len: b.len(), need: udpx::GRO_BUFFER }.into()
                ));
            }
        }
        // A one-thread ring polled from another thread: receive by system call here.
        let ring = self.ring.as_ref().filter(|r| r.owner.is_none_or(|o| o == std::thread::current().id()));
        let off_ring = ring.is_none() && self.ring.is_some();
        loop {
            let got = match ring {
                Some(r) => match self.reap(r, &mut bufs[..n], &mut meta[..n]) {
                    // Nothing in the ring (reaping it costs no system call): wait on the
                    // eventfd. A completion posted since it was last read leaves it readable:
                    // read it and reap again; otherwise the read clears the readiness, and
                    // the next completion wakes this task.
                    Ok(0) => {
                        match r.ready.try_read(&mut [0u8; 8]) {
                            Ok(_) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(r.ready.poll_read_ready(cx))?,
                            Err(e) => return Poll::Ready(Err(e)),
                        }
                        continue;
                    }
                    got => got,
                },
                None => {
                    ready!(self.io.poll_recv_ready(cx))?;
                    // try_io clears the readiness when the call says WouldBlock.
                    match self.io.try_io(Interest::READABLE, || match self.sock.recv(&mut bufs[..n], &mut meta[..n]) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(e),
                        other => Ok(other),
                    }) {
                        Ok(got) => got,
                        Err(_would_block) => continue,
                    }
                }
            };
            match got {
                Ok(k) => {
                    if off_ring {
                        self.counters.recvs_off_ring.fetch_add(1, Relaxed);
                    }
                    let marked: usize = meta[..k].iter().filter(|m| m.ecn.is_some()).map(|m| m.segment_count()).sum();
                    if marked > 0 {
                        self.counters.ecn_marked.fetch_add(marked as u64, Relaxed);
                    }
                    return Poll::Ready(Ok(k));
                }
                // Buffers sized too small for a GRO buffer: a configuration error, said.
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => return Poll::Ready(Err(e)),
                Err(e) if count_errors => {
                    // One bad datagram or someone else's ICMP error must not stop quinn's
                    // endpoint: counted, and the next one read.
                    log::debug!("udpx-tokio: receive error (counted, not returned): {e}");
                    self.counters.recv_errors.fetch_add(1, Relaxed);
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Copies what the ring holds (whole buffers, at most one per destination) into `bufs`.
    fn reap(&self, r: &RingRecv, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        let mut rx = lock(&r.rx);
        let (mut k, mut copied) = (0, 0u64);
        rx.recv_buffers(None, bufs.len(), |m, payload| {
            // Ring buffers hold at most a GRO buffer, and `bufs` were checked to hold one
            // (a GRO socket), or hold what a datagram may be cut to, as recvmsg cuts it.
            let dst = &mut bufs[k];
            let len = payload.len().min(dst.len());
            dst[..len].copy_from_slice(&payload[..len]);
            meta[k] = RecvMeta { len, truncated: m.truncated || len < payload.len(), ..*m };
            copied += len as u64;
            k += 1;
        })?;
        self.counters.bytes_copied.fetch_add(copied, Relaxed);
        Ok(k)
    }

    /// Sends what is left of a cut transmit. `Ok(true)`: nothing is left; `Ok(false)`: the
    /// socket is full (try again when writable).
    fn drain(&self, st: &mut SendState) -> bool {
        let Some(r) = st.remainder.as_mut() else { return true };
        match self.udpx().try_send(&mut st.bufs, &[r.transmit()], r.cursor) {
            Ok(_) => {
                st.remainder = None;
                true
            }
            Err(e) if matches!(e.kind, SendErrorKind::WouldBlock | SendErrorKind::NoBuffers) => {
                r.cursor = e.cursor();
                false
            }
            Err(e) => {
                log::debug!("udpx-tokio: the rest of a transmit to {} failed: {e}", r.destination);
                self.counters.send_errors.fetch_add(1, Relaxed);
                st.remainder = None;
                true
            }
        }
    }

    fn would_block(&self) -> io::Error {
        self.counters.would_block.fetch_add(1, Relaxed);
        io::ErrorKind::WouldBlock.into()
    }
}

impl RingRecv {
    /// On a current-thread runtime the ring is that thread's (`SINGLE_ISSUER |
    /// DEFER_TASKRUN`: the kernel does the receive's work when the thread reaps); shared
    /// otherwise (tokio moves tasks between workers).
    fn new(sock: &Arc<UdpSocket>) -> Result<RingRecv, udpx::Error> {
        let one_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        let mut rx = if one_thread {
            UringReceiver::for_this_thread(sock.clone(), RING_BUFFERS, udpx::GRO_BUFFER)?
        } else {
            UringReceiver::new(sock.clone(), RING_BUFFERS, udpx::GRO_BUFFER)?
        };
        let efd = rx.eventfd().map_err(|e| udpx::Error::Io { op: "io_uring eventfd".into(), source: e })?;
        // Armed here so the eventfd has something to say before the first poll.
        rx.arm().map_err(|e| udpx::Error::Io { op: "arm the io_uring receive".into(), source: e })?;
        // Watched as tokio watches a pipe's reading end: epoll readiness, and read(2) of 8
        // bytes (the eventfd's counter) or EAGAIN, which clears the readiness. (tokio's
        // AsyncFd would need `unsafe` here; the pipe type takes an owned descriptor.)
        let ready = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(efd)
            .map_err(|e| udpx::Error::Io { op: "register the eventfd".into(), source: e })?;
        let owner = rx.owner_thread();
        Ok(RingRecv { rx: Mutex::new(rx), ready, owner })
    }
}

/// A lock that a panic elsewhere does not poison for good (the state stays consistent: every
/// change under it is a whole assignment).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_udpx_ecn(e: QuinnEcn) -> EcnCodepoint {
    match e {
        QuinnEcn::Ect0 => EcnCodepoint::Ect0,
        QuinnEcn::Ect1 => EcnCodepoint::Ect1,
        QuinnEcn::Ce => EcnCodepoint::Ce,
    }
}

fn to_quinn_ecn(e: EcnCodepoint) -> QuinnEcn {
    match e {
        EcnCodepoint::Ect0 => QuinnEcn::Ect0,
        EcnCodepoint::Ect1 => QuinnEcn::Ect1,
        EcnCodepoint::Ce => QuinnEcn::Ce,
    }
}

impl AsyncUdpSocket for UdpxSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Poller { socket: self })
    }

    fn try_send(&self, t: &QuinnTransmit<'_>) -> io::Result<()> {
        let mut st = lock(&self.send);
        if !self.drain(&mut st) {
            return Err(self.would_block());
        }
        let ut = Transmit {
            segment_size: t.segment_size.filter(|&s| s < t.contents.len()),
            src_ip: t.src_ip,
            ecn: t.ecn.map(to_udpx_ecn),
            ..Transmit::new(t.destination, t.contents)
        };
        let SendState { bufs, remainder } = &mut *st;
        match self.udpx().try_send(bufs, &[ut], SendCursor::default()) {
            Ok(_) => {
                self.counters.transmits.fetch_add(1, Relaxed);
                Ok(())
            }
            Err(e) if matches!(e.kind, SendErrorKind::WouldBlock | SendErrorKind::NoBuffers) => {
                let cursor = e.cursor();
                if cursor == SendCursor::default() {
                    // Nothing left: quinn keeps the transmit and tries again when writable.
                    return Err(self.would_block());
                }
                // Part of it left: keep the rest (a copy), report the transmit sent.
                *remainder = Some(Remainder {
                    destination: ut.destination,
                    contents: t.contents.to_vec(),
                    segment_size: ut.segment_size,
                    src_ip: ut.src_ip,
                    ecn: ut.ecn,
                    cursor,
                });
                self.counters.remainders_queued.fetch_add(1, Relaxed);
                self.counters.transmits.fetch_add(1, Relaxed);
                Ok(())
            }
            Err(e) => {
                log::debug!("udpx-tokio: a transmit to {} failed: {e}", t.destination);
                self.counters.send_errors.fetch_add(1, Relaxed);
                Ok(())
            }
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [QuinnMeta],
    ) -> Poll<io::Result<usize>> {
        let mut metas = lock(&self.recv_metas);
        let n = bufs.len().min(meta.len()).min(metas.len());
        let k = ready!(self.poll_recv_udpx(cx, &mut bufs[..n], &mut metas[..n], true))?;
        for (q, m) in meta.iter_mut().zip(metas.iter()).take(k) {
            *q = QuinnMeta {
                addr: m.addr,
                len: m.len,
                stride: if m.stride == 0 { m.len } else { m.stride },
                ecn: m.ecn.map(to_quinn_ecn),
                dst_ip: m.dst_ip,
            };
        }
        Poll::Ready(Ok(k))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.udpx().local_addr())
    }

    fn max_transmit_segments(&self) -> usize {
        self.max_segments
    }

    fn max_receive_segments(&self) -> usize {
        // quinn sizes each receive buffer as the payload size times this: 64 x 1200 bytes
        // and more holds any GRO buffer (at most 64 KiB).
        if self.gro {
            64
        } else {
            1
        }
    }

    fn may_fragment(&self) -> bool {
        // udpx sets IP_PMTUDISC_PROBE / IPV6_PMTUDISC_PROBE: DF, never fragmented.
        false
    }
}

/// quinn's writability poller: ready when the socket is writable and no remainder is stuck.
struct Poller {
    socket: Arc<UdpxSocket>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Poller")
    }
}

impl UdpPoller for Poller {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let s = &self.socket;
        loop {
            ready!(s.io.poll_send_ready(cx))?;
            // A remainder that still cannot leave clears the readiness (try_io): wait for the
            // next writability edge.
            let drained = s.io.try_io(Interest::WRITABLE, || {
                let mut st = lock(&s.send);
                if s.drain(&mut st) {
                    Ok(())
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                }
            });
            if drained.is_ok() {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// A quinn endpoint on a [`UdpxSocket`] bound to `addr` (inside a tokio runtime): a client
/// when `server` is `None`, a server otherwise. Returns the socket too, for its counters.
pub fn endpoint(
    addr: SocketAddr,
    backend: Backend,
    config: quinn::EndpointConfig,
    server: Option<quinn::ServerConfig>,
) -> io::Result<(quinn::Endpoint, Arc<UdpxSocket>)> {
    let socket = Arc::new(UdpxSocket::bind(addr, backend)?);
    let runtime = Arc::new(quinn::TokioRuntime);
    let ep = quinn::Endpoint::new_with_abstract_socket(config, server, socket.clone(), runtime)?;
    Ok((ep, socket))
}
