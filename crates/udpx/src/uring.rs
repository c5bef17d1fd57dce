//! Receive through io_uring: one multishot `IORING_OP_RECVMSG` over a ring of provided
//! buffers, so a busy socket is read with no system call per batch at all (the kernel fills
//! buffers as datagrams arrive; [`UringReceiver::recv`] reaps what is there, and enters the
//! kernel only to wait or to re-arm). The metadata is the
//! same [`RecvMeta`] as the system-call path (GRO segment size, ECN, pktinfo, the drop
//! counter, truncation), parsed from the same control messages.
//!
//! - The ring runs empty when the caller falls behind: the receive ends with ENOBUFS (the
//!   datagrams wait in the socket's queue, nothing is lost there), which is counted
//!   ([`UringRecvStats::no_buffers`]) and re-armed once buffers are back: never a silent stall.
//! - A multishot receive the kernel ends (no `IORING_CQE_F_MORE`) is re-armed at the next call
//!   ([`UringRecvStats::rearms`]).
//! - A datagram larger than the buffer is cut and reported `truncated`, as with `recvmsg`.
//!
//! Each buffer holds the kernel's 16-byte header, a 128-byte name, the control space and the
//! payload; buffers go back to the ring at the next call, so a datagram's bytes are valid only
//! inside the callback.
//!
//! - An ICMP error pending on the socket ends the receive as it fails a `recvmsg`: the error
//!   queue is read (as the system-call path does) and the receive armed again.
//! - For an event loop: [`UringReceiver::eventfd`] is signalled for each completion, and
//!   [`UringReceiver::recv_buffers`] hands over whole GRO buffers, a bounded number per call.
//!   [`UringReceiver::new`] takes the socket by any owner (an `Arc`), so both can live in one
//!   struct (udpx-tokio's socket does this).
//! - For one thread: [`UringReceiver::for_this_thread`] sets the ring up `SINGLE_ISSUER |
//!   DEFER_TASKRUN`, so the kernel does the receive's work only when that thread reaps (no task
//!   work interrupting it per wake-up, no wake-up of it per datagram). Another thread's reap is
//!   refused; the datagrams the ring has not taken stay in the socket for a `recv` there.

use std::io;
use std::ops::Deref;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::error::Error;
use crate::recv::RecvMeta;
use crate::socket::UdpSocket;
use crate::sys::uring::{RecvEvent, RecvRing, RecvSetup};
pub use crate::uring_shard::{QueueError, Replies, UringShard, UringShardConfig, UringShardStats};

/// What a receiver counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringRecvStats {
    /// Completions reaped (one per datagram or GRO buffer, plus ENOBUFS ends).
    pub completions: u64,
    /// Datagrams delivered to the callback (GRO buffers split).
    pub datagrams: u64,
    /// Times the buffer ring ran empty (ENOBUFS) and the receive was re-armed.
    pub no_buffers: u64,
    /// Times the receive had ended and was armed again.
    pub rearms: u64,
    /// Calls that entered the kernel to wait.
    pub waits: u64,
    /// Receives ended by an ICMP error about an earlier datagram (the error queue was read,
    /// as the system-call path does, and the receive armed again).
    pub icmp_errors: u64,
}

/// A multishot io_uring receive on one socket; see the module docs.
///
/// It holds the socket through `S`: a reference ([`UdpSocket::uring_receiver`]) or an owner
/// such as an `Arc` ([`UringReceiver::new`]), for code that keeps both in one place.
#[derive(Debug)]
pub struct UringReceiver<S: Deref<Target = UdpSocket>> {
    socket: S,
    ring: RecvRing,
    stats: UringRecvStats,
    started: bool,
    /// An error the receive ended with after datagrams were delivered: returned next call.
    error: Option<io::Error>,
    /// The one thread that may reap a `SINGLE_ISSUER` ring; `None`: any thread, one at a time.
    owner: Option<std::thread::ThreadId>,
}

impl UdpSocket {
    /// A multishot io_uring receiver on this socket with `buffers` buffers (a power of two,
    /// at most 32,768) of `size` payload bytes each ([`crate::GRO_BUFFER`] for a GRO socket).
    pub fn uring_receiver(&self, buffers: u16, size: usize) -> Result<UringReceiver<&UdpSocket>, Error> {
        UringReceiver::new(self, buffers, size)
    }
}

impl<S: Deref<Target = UdpSocket>> UringReceiver<S> {
    /// A multishot io_uring receiver on `socket`; see [`UdpSocket::uring_receiver`].
    pub fn new(socket: S, buffers: u16, size: usize) -> Result<UringReceiver<S>, Error> {
        UringReceiver::with_setup(socket, buffers, size, RecvSetup::Shared)
    }

    /// A receiver for the calling thread only: its ring is set up `SINGLE_ISSUER |
    /// DEFER_TASKRUN` (Linux 6.1), so the kernel receives into the buffers only when this
    /// thread reaps (or waits), in one go, instead of as task work at its every kernel entry;
    /// the socket is registered with the ring as a fixed file. Another thread's reap is refused
    /// with an error (see [`UringReceiver::owner_thread`]): datagrams the ring has not taken
    /// stay in the socket's queue, for a `recv` from that thread. Where the kernel lacks
    /// `DEFER_TASKRUN` the ring is the shared kind (`owner_thread` is then `None`).
    ///
    /// Drop it on its thread: the receive can be cancelled only from there; dropped on
    /// another, its buffers are leaked (never freed while the kernel may write them).
    pub fn for_this_thread(socket: S, buffers: u16, size: usize) -> Result<UringReceiver<S>, Error> {
        UringReceiver::with_setup(socket, buffers, size, RecvSetup::OneThread { extra: 0 })
    }

    fn with_setup(socket: S, buffers: u16, size: usize, setup: RecvSetup) -> Result<UringReceiver<S>, Error> {
        check_recv(buffers, size)?;
        let ring = RecvRing::with_setup(socket.as_raw_fd(), buffers, size, setup).map_err(|e| Error::Unsupported {
            feature: crate::Feature::IoUring,
            why: format!("io_uring receive: {e}"),
        })?;
        let owner = ring.is_deferred().then(|| std::thread::current().id());
        Ok(UringReceiver { socket, ring, stats: UringRecvStats::default(), started: false, error: None, owner })
    }

    /// The only thread that may reap this receiver ([`UringReceiver::for_this_thread`] on a
    /// kernel with `DEFER_TASKRUN`); `None` when any thread may (one at a time).
    pub fn owner_thread(&self) -> Option<std::thread::ThreadId> {
        self.owner
    }

    /// Calls `f` for every datagram that arrived (a GRO buffer's datagrams one by one, each
    /// with the buffer's metadata). With `wait`, when nothing is there, waits at most that long
    /// for something (one `io_uring_enter`); without, never enters the kernel unless the
    /// receive must be armed again. Returns the datagrams delivered.
    pub fn recv(
        &mut self,
        wait: Option<std::time::Duration>,
        mut f: impl FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        let mut n = 0;
        self.reap(wait, usize::MAX, |meta, payload| {
            for d in meta.segments(payload) {
                let one = RecvMeta { len: d.len(), stride: d.len(), ..*meta };
                f(&one, d);
                n += 1;
            }
        })?;
        Ok(n)
    }

    /// Calls `f` for each buffer that arrived, at most `max` of them, whole: a GRO buffer is
    /// one call whose metadata has the segment size in `stride`, as [`UdpSocket::recv`] gives
    /// it (the rest stay queued for the next call). `wait` as for [`UringReceiver::recv`].
    /// Returns the buffers delivered. For a caller that copies them into buffers of its own.
    pub fn recv_buffers(
        &mut self,
        wait: Option<std::time::Duration>,
        max: usize,
        f: impl FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        self.reap(wait, max, f)
    }

    /// Arms the receive now (it is armed at the first receive otherwise): the kernel starts
    /// filling buffers, and an [`UringReceiver::eventfd`] is signalled, before anyone reaps.
    pub fn arm(&mut self) -> io::Result<()> {
        self.reap(None, 0, |_, _| {}).map(|_| ())
    }

    /// An eventfd the kernel signals whenever a completion is posted, for an event loop to
    /// wait on instead of [`UringReceiver::recv`]'s `wait`. Read it (8 bytes, non-blocking)
    /// before each reap, and reap until nothing is left, so that no completion goes unnoticed.
    /// Completions are posted by the thread that armed the receive (io_uring task work), so
    /// that thread must keep running; if it exits, the receive is cancelled and armed again
    /// at the next reap.
    pub fn eventfd(&mut self) -> io::Result<OwnedFd> {
        self.ring.register_eventfd()
    }

    fn reap(
        &mut self,
        wait: Option<std::time::Duration>,
        max: usize,
        mut f: impl FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        if let Some(owner) = self.owner.filter(|&o| o != std::thread::current().id()) {
            // The kernel would refuse the entry (EEXIST); say what to do instead.
            return Err(io::Error::other(format!(
                "this io_uring receive belongs to thread {owner:?} (SINGLE_ISSUER): reap it there, \
                 or receive by system call from this thread"
            )));
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let sock = &*self.socket;
        let mut tally = Tally::new(sock);
        let was_armed = self.started;
        let n = self.ring.reap(wait, max, |ev| tally.on(sock, ev, &mut f))?;
        self.started = true;
        let rearmed = was_armed && n > 0 && !self.ring.is_armed();
        let reap = Reaped { completions: n, waited: wait.is_some(), rearmed };
        tally.finish(sock, reap, &mut self.stats, &mut self.error)
    }

    /// What it counted so far.
    pub fn stats(&self) -> UringRecvStats {
        self.stats
    }
}

/// Checks a receive ring's sizes and that io_uring may be used here.
pub(crate) fn check_recv(buffers: u16, size: usize) -> Result<(), Error> {
    if !buffers.is_power_of_two() || buffers > 32_768 {
        return Err(Error::Config(format!("{buffers} io_uring receive buffers: give a power of two up to 32768")));
    }
    if size == 0 || size > crate::GRO_BUFFER {
        return Err(Error::Config(format!("io_uring receive buffers of {size} B: give 1 to {}", crate::GRO_BUFFER)));
    }
    crate::caps::io_uring_available().map_err(|why| Error::Unsupported { feature: crate::Feature::IoUring, why })
}

/// What one reap of the ring did, beside what it delivered ([`Tally::finish`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reaped {
    /// Completions reaped.
    pub completions: usize,
    /// The call was allowed to wait for a completion.
    pub waited: bool,
    /// The receive had ended and was armed again.
    pub rearmed: bool,
}

/// What one reap delivered, counted once it is over (shared by [`UringReceiver`] and
/// [`UringShard`]).
pub(crate) struct Tally {
    fallback: std::net::SocketAddr,
    dgrams: u64,
    bytes: u64,
    bufs: u64,
    gro_bufs: u64,
    trunc: u64,
    empty: u64,
    icmp: u64,
    error: Option<io::Error>,
}

impl Tally {
    pub(crate) fn new(sock: &UdpSocket) -> Tally {
        Tally {
            fallback: sock.peer_addr().unwrap_or(sock.local_addr()),
            dgrams: 0,
            bytes: 0,
            bufs: 0,
            gro_bufs: 0,
            trunc: 0,
            empty: 0,
            icmp: 0,
            error: None,
        }
    }

    /// One receive event: counted; a datagram (or GRO buffer) handed to `f`.
    pub(crate) fn on(&mut self, sock: &UdpSocket, ev: RecvEvent<'_>, f: &mut impl FnMut(&RecvMeta, &[u8])) {
        match ev {
            RecvEvent::NoBuffers => self.empty += 1,
            RecvEvent::Error(errno) => {
                // An ICMP error about an earlier datagram, pending on an unconnected socket
                // with IP_RECVERR: read the error queue (counted there), go on receiving.
                if sock.caps.recv_err && sock.peer.is_none() && crate::icmp::log::is_icmp_errno(errno) {
                    self.icmp += 1;
                } else if self.error.is_none() {
                    self.error = Some(io::Error::from_raw_os_error(errno));
                }
            }
            RecvEvent::Datagram { raw, payload } => {
                let meta = RecvMeta::from_raw(&raw, self.fallback, sock.caps.gro);
                self.bufs += 1;
                self.bytes += payload.len() as u64;
                self.trunc += u64::from(meta.truncated);
                let segs = meta.segment_count() as u64;
                self.gro_bufs += u64::from(segs > 1);
                self.dgrams += segs;
                f(&meta, payload);
            }
            RecvEvent::Other { .. } => {}
        }
    }

    /// After a reap: the error queue read if ICMP errors ended the receive, the counts added
    /// to `stats` and the socket's counters. An error the receive ended with is returned now
    /// when nothing was delivered, else kept in `later` for the next call.
    pub(crate) fn finish(
        self,
        sock: &UdpSocket,
        reap: Reaped,
        stats: &mut UringRecvStats,
        later: &mut Option<io::Error>,
    ) -> io::Result<usize> {
        if self.icmp > 0 {
            sock.drain_error_queue(None, None, &mut |_| {})?;
        }
        stats.rearms += u64::from(reap.rearmed);
        stats.completions += reap.completions as u64;
        stats.datagrams += self.dgrams;
        stats.no_buffers += self.empty;
        stats.icmp_errors += self.icmp;
        stats.waits += u64::from(reap.waited);
        let c = &sock.counters;
        c.add(&c.messages_received, self.bufs);
        c.add(&c.datagrams_received, self.dgrams);
        c.add(&c.bytes_received, self.bytes);
        c.add(&c.gro_buffers_received, self.gro_bufs);
        c.add(&c.truncated, self.trunc);
        match self.error {
            Some(e) if self.bufs == 0 => Err(e),
            Some(e) => {
                *later = Some(e);
                Ok(self.bufs as usize)
            }
            None => Ok(self.bufs as usize),
        }
    }
}
