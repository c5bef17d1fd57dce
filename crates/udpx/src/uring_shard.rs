//! A server shard on one io_uring: requests in and replies out through one ring that one
//! thread owns, one `io_uring_enter` per turn.
//!
//! ```text
//!  turn(wait, f):
//!    io_uring_enter(submit: the replies queued since the last turn,
//!                   wait: for one completion more than those sends post at once)
//!    send completions: slot free again | EAGAIN: queued again | ENOBUFS: backed off, queued
//!                      again | ICMP left pending by another datagram: error queue read,
//!                      queued again | EMSGSIZE, other errors: dropped, counted by why
//!    receive completions (at most one per free send slot): f(meta, datagram, replies)
//!    replies.queue(t): copied into a free slot, sent by the next turn
//! ```
//!
//! The ring is set up `SINGLE_ISSUER | DEFER_TASKRUN` (Linux 6.1; `COOP_TASKRUN` before):
//! the kernel does a receive's work when this thread enters to collect it, not by waking or
//! interrupting it per datagram, and a request and the reply to the previous one share one
//! system call. With the socket's system calls the same work takes two per batch (`recvmmsg`,
//! `sendmmsg`). Replies are unlinked entries: one that fails does not cancel the next, and none
//! is lost on the way (the sketch above; [`UringShardStats`] counts each path).
//!
//! A shard is bound to the thread that made it (it is not `Send`): the kernel refuses a
//! single-issuer ring's enters from any other thread.
//!
//! What it does not do: GSO (a segmented transmit is refused: send those with
//! [`UdpSocket::send`]) and zerocopy (each reply is copied into its slot, as `sendmmsg` copies
//! it into the kernel anyway).

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::ops::Deref;
use std::time::{Duration, Instant};

use crate::error::{Error, InvalidTransmit};
use crate::recv::RecvMeta;
use crate::socket::UdpSocket;
use crate::sys::uring_shard::{SendSlots, ShardEvent, ShardRing};
use crate::transmit::Transmit;
use crate::uring::{check_recv, Reaped, Tally, UringRecvStats};

/// How a [`UringShard`] is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringShardConfig {
    /// Receive buffers: a power of two, at most 32,768.
    pub recv_buffers: u16,
    /// Payload bytes of each receive buffer (a longer datagram is cut and reported truncated).
    pub recv_size: usize,
    /// Send slots, 1 to 4,096: replies queued or in the kernel at once.
    pub send_slots: u16,
    /// Payload bytes of each send slot: the longest reply.
    pub send_size: usize,
}

impl Default for UringShardConfig {
    fn default() -> Self {
        UringShardConfig { recv_buffers: 64, recv_size: 2048, send_slots: 256, send_size: 2048 }
    }
}

/// What a shard's send side counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringShardStats {
    /// Turns taken.
    pub turns: u64,
    /// Turns that submitted replies (each in the one enter of its turn).
    pub submits: u64,
    /// Replies accepted by `queue`.
    pub queued: u64,
    /// Replies the kernel took.
    pub sent: u64,
    /// Replies queued again after EAGAIN (the socket's send buffer was full).
    pub would_block: u64,
    /// Replies queued again after ENOBUFS (after a back-off, as [`UdpSocket::send`] does).
    pub enobufs_retries: u64,
    /// Replies queued again after an ICMP error left pending by an earlier datagram.
    pub icmp_retries: u64,
    /// Replies dropped: EMSGSIZE (larger than the path allows).
    pub dropped_too_large: u64,
    /// Replies dropped: ENOBUFS more than [`crate::ENOBUFS_RETRIES`] times in a row.
    pub dropped_no_buffers: u64,
    /// Replies dropped: any other error.
    pub dropped_error: u64,
}

impl UringShardStats {
    /// Every reply dropped, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_too_large + self.dropped_no_buffers + self.dropped_error
    }
}

/// Why a reply was not queued (nothing of it was sent).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueError {
    /// Every send slot is queued or in the kernel.
    Full {
        /// The shard's send slots.
        slots: usize,
    },
    /// The transmit is invalid for this socket.
    Invalid(InvalidTransmit),
    /// The datagram is longer than a send slot.
    TooLarge {
        /// Its length.
        len: usize,
        /// A slot's size.
        slot: usize,
    },
    /// The transmit carries more than one segment (GSO).
    Segmented {
        /// Its segments.
        segments: usize,
    },
}

impl fmt::Display for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueError::Full { slots } => write!(
                f,
                "all {slots} send slots are queued or in flight: take a turn to complete them, or make the shard with more send_slots"
            ),
            QueueError::Invalid(why) => write!(f, "{why}"),
            QueueError::TooLarge { len, slot } => write!(
                f,
                "a reply of {len} B does not fit a send slot of {slot} B: make the shard with send_size of at least {len}"
            ),
            QueueError::Segmented { segments } => write!(
                f,
                "a transmit of {segments} segments: the shard sends single datagrams; send GSO transmits with UdpSocket::send"
            ),
        }
    }
}

impl std::error::Error for QueueError {}

/// A slot's reply, kept for its retries.
#[derive(Debug, Clone, Copy, Default)]
struct SlotInfo {
    enobufs: u32,
    icmp: crate::icmp::log::IcmpRetry,
}

/// The send side's bookkeeping (safe code; the slots' memory is in `sys`).
#[derive(Debug)]
struct SendSide {
    free: Vec<u16>,
    /// Filled, to be submitted by the next enter.
    ready: Vec<u16>,
    info: Box<[SlotInfo]>,
    slot_size: usize,
    /// ENOBUFS retries of the worst slot queued again: back off this long before the next
    /// submit.
    backoff: Option<u32>,
    stats: UringShardStats,
}

impl SendSide {
    fn queue(&mut self, sock: &UdpSocket, slots: &mut SendSlots, t: &Transmit<'_>) -> Result<(), QueueError> {
        let segments = t.segments();
        if segments > 1 {
            return Err(QueueError::Segmented { segments });
        }
        sock.validate(t).map_err(QueueError::Invalid)?;
        if t.contents.len() > self.slot_size {
            return Err(QueueError::TooLarge { len: t.contents.len(), slot: self.slot_size });
        }
        let Some(slot) = self.free.pop() else {
            return Err(QueueError::Full { slots: self.info.len() });
        };
        let m = sock.out_msg(t, sock.txtime_offset(std::slice::from_ref(t)));
        if slots.fill(slot, &m, sock.family.is_v6()).is_err() {
            self.free.push(slot);
            return Err(QueueError::TooLarge { len: t.contents.len(), slot: self.slot_size });
        }
        self.info[usize::from(slot)] = SlotInfo::default();
        self.ready.push(slot);
        self.stats.queued += 1;
        Ok(())
    }

    /// A send completed with `result` (bytes, or -errno): see the module docs.
    fn completed(&mut self, sock: &UdpSocket, slot: u16, result: i32) {
        let c = &sock.counters;
        let info = &mut self.info[usize::from(slot)];
        if result >= 0 {
            self.stats.sent += 1;
            c.add(&c.datagrams_sent, 1);
            c.add(&c.bytes_sent, result as u64);
            self.free.push(slot);
            return;
        }
        let errno = -result;
        if sock.icmp_pending(errno) {
            // Someone else's ICMP error left pending (sent nothing), or this datagram's own
            // (crate::icmp): the same rule as the system-call path. A flood keeps the slot
            // queued for the next enter.
            let drained = sock.drain_error_queue(None, None, &mut |_| {}).unwrap_or_default();
            let step = sock.icmp_send_step(&mut info.icmp, &drained);
            if step != crate::icmp::log::IcmpStep::Own {
                self.stats.icmp_retries += u64::from(step == crate::icmp::log::IcmpStep::Retry);
                self.ready.push(slot);
                return;
            }
        }
        match errno {
            libc::EAGAIN | libc::EINTR => {
                self.stats.would_block += 1;
                c.add(&c.would_block, 1);
                self.ready.push(slot);
                return;
            }
            libc::ENOBUFS if info.enobufs < crate::ENOBUFS_RETRIES => {
                self.backoff = Some(self.backoff.unwrap_or(0).max(info.enobufs));
                info.enobufs += 1;
                self.stats.enobufs_retries += 1;
                c.add(&c.enobufs_retries, 1);
                self.ready.push(slot);
                return;
            }
            libc::ENOBUFS => {
                self.stats.dropped_no_buffers += 1;
                c.add(&c.no_buffers, 1);
            }
            libc::EMSGSIZE => {
                self.stats.dropped_too_large += 1;
                c.add(&c.emsgsize, 1);
            }
            _ => {
                self.stats.dropped_error += 1;
                c.add(&c.send_errors, 1);
                log::debug!("udpx: io_uring reply dropped: {}", io::Error::from_raw_os_error(errno));
            }
        }
        self.free.push(slot);
    }

    /// Queues the ready slots' sends on the ring (after the back-off an ENOBUFS asked for);
    /// an injected fault (tests) completes one at once instead.
    fn submit(&mut self, sock: &UdpSocket, ring: &mut ShardRing) -> io::Result<()> {
        if self.ready.is_empty() {
            return Ok(());
        }
        if let Some(retry) = self.backoff.take() {
            std::thread::sleep(crate::enobufs_backoff(retry));
        }
        let ready = std::mem::take(&mut self.ready);
        let mut submitted = 0;
        let mut res = Ok(());
        for (k, &slot) in ready.iter().enumerate() {
            if let Some(crate::sys::fault::Fault::Errno(e) | crate::sys::fault::Fault::ErrnoOnGso(e)) =
                sock.faults.next(false)
            {
                self.completed(sock, slot, -e);
                continue;
            }
            if let Err(e) = ring.submit(slot, 0) {
                // Kept for the next turn, not lost (the queue has room for every slot, so
                // this is not expected).
                self.ready.extend_from_slice(&ready[k..]);
                res = Err(e);
                break;
            }
            submitted += 1;
        }
        if submitted > 0 {
            self.stats.submits += 1;
            sock.counters.add(&sock.counters.send_calls, 1);
        }
        res
    }
}

/// The replies of one turn: [`Replies::queue`] from inside [`UringShard::turn`]'s callback.
pub struct Replies<'t> {
    sock: &'t UdpSocket,
    side: &'t mut SendSide,
    slots: &'t mut SendSlots,
}

impl Replies<'_> {
    /// Copies a single datagram into a free send slot; the next turn sends it.
    pub fn queue(&mut self, t: &Transmit<'_>) -> Result<(), QueueError> {
        self.side.queue(self.sock, self.slots, t)
    }

    /// Free send slots.
    pub fn free(&self) -> usize {
        self.side.free.len()
    }
}

impl fmt::Debug for Replies<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replies").field("free", &self.side.free.len()).finish()
    }
}

/// One socket's receive and send on one io_uring, for one thread; see the module docs.
pub struct UringShard<S: Deref<Target = UdpSocket>> {
    // The ring first: its Drop cancels what is in flight before anything else goes.
    ring: ShardRing,
    socket: S,
    side: SendSide,
    rx: UringRecvStats,
    started: bool,
    /// An error the receive ended with after datagrams were delivered: returned next turn.
    error: Option<io::Error>,
    /// Not `Send`: a single-issuer ring answers only the thread that made it.
    _one_thread: PhantomData<*const ()>,
}

impl<S: Deref<Target = UdpSocket>> fmt::Debug for UringShard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringShard").field("ring", &self.ring).field("stats", &self.side.stats).finish()
    }
}

impl UdpSocket {
    /// A shard on this socket, receiving and replying through one io_uring owned by the
    /// calling thread ([`UringShard`]).
    pub fn uring_shard(&self, cfg: UringShardConfig) -> Result<UringShard<&UdpSocket>, Error> {
        UringShard::new(self, cfg)
    }
}

impl<S: Deref<Target = UdpSocket>> UringShard<S> {
    /// A shard on `socket`, sized by `cfg`, bound to the calling thread.
    pub fn new(socket: S, cfg: UringShardConfig) -> Result<UringShard<S>, Error> {
        check_recv(cfg.recv_buffers, cfg.recv_size)?;
        if cfg.send_slots == 0 || cfg.send_slots > 4096 {
            return Err(Error::Config(format!("{} io_uring send slots: give 1 to 4096", cfg.send_slots)));
        }
        let max = crate::MAX_PAYLOAD_V6;
        if cfg.send_size == 0 || cfg.send_size > max {
            return Err(Error::Config(format!("io_uring send slots of {} B: give 1 to {max}", cfg.send_size)));
        }
        use std::os::fd::AsRawFd;
        let ring = ShardRing::new(socket.as_raw_fd(), cfg.recv_buffers, cfg.recv_size, cfg.send_slots, cfg.send_size)
            .map_err(|e| Error::Unsupported {
            feature: crate::Feature::IoUring,
            why: format!("io_uring shard: {e}"),
        })?;
        let side = SendSide {
            free: (0..cfg.send_slots).rev().collect(),
            ready: Vec::with_capacity(usize::from(cfg.send_slots)),
            info: vec![SlotInfo::default(); usize::from(cfg.send_slots)].into_boxed_slice(),
            slot_size: cfg.send_size,
            backoff: None,
            stats: UringShardStats::default(),
        };
        Ok(UringShard {
            ring,
            socket,
            side,
            rx: UringRecvStats::default(),
            started: false,
            error: None,
            _one_thread: PhantomData,
        })
    }

    /// One turn: submits the replies queued so far and, with `wait`, waits at most that long
    /// for a completion when none is there (one `io_uring_enter` for both); handles the
    /// replies' completions; calls `f` for every datagram that arrived, at most one per free
    /// send slot (the rest wait, their buffers held, for the next turn), with a [`Replies`] to
    /// queue answers on. Returns the receive completions handled.
    pub fn turn(
        &mut self,
        wait: Option<Duration>,
        mut f: impl FnMut(&RecvMeta, &[u8], &mut Replies<'_>),
    ) -> io::Result<usize> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let sock = &*self.socket;
        self.side.submit(sock, &mut self.ring)?;
        let budget = self.side.free.len();
        let mut tally = Tally::new(sock);
        let was_armed = self.started;
        let side = &mut self.side;
        let n = self.ring.reap(wait, budget, |ev, slots| match ev {
            ShardEvent::Sent { slot, result } => side.completed(sock, slot, result),
            ShardEvent::Recv(ev) => tally.on(sock, ev, &mut |m, d| f(m, d, &mut Replies { sock, side, slots })),
        })?;
        self.started = true;
        self.side.stats.turns += 1;
        let rearmed = was_armed && n > 0 && !self.ring.is_armed();
        let reap = Reaped { completions: n, waited: wait.is_some(), rearmed };
        tally.finish(sock, reap, &mut self.rx, &mut self.error)
    }

    /// Queues a reply outside a turn (sent by the next turn).
    pub fn queue(&mut self, t: &Transmit<'_>) -> Result<(), QueueError> {
        self.side.queue(&self.socket, self.ring.slots(), t)
    }

    /// Sends what is queued and waits, at most `timeout`, until no reply is queued or in the
    /// kernel; receives that arrive meanwhile wait for the next turn. Returns whether all went
    /// (sent or dropped and counted). Call it before dropping a shard whose replies matter:
    /// a drop cancels what is still in flight.
    pub fn flush(&mut self, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        let sock = &*self.socket;
        loop {
            self.side.submit(sock, &mut self.ring)?;
            if self.pending() == 0 {
                return Ok(true);
            }
            if self.ring.busy() == 0 {
                continue; // queued again at once (an injected fault): nothing to wait for
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let side = &mut self.side;
            self.ring.wait_for_any();
            self.ring.reap(Some(left), 0, |ev, _| {
                if let ShardEvent::Sent { slot, result } = ev {
                    side.completed(sock, slot, result);
                }
            })?;
        }
    }

    /// Replies queued or in the kernel.
    pub fn pending(&self) -> usize {
        self.side.ready.len() + self.ring.busy()
    }

    /// What the send side counted.
    pub fn stats(&self) -> UringShardStats {
        self.side.stats
    }

    /// What the receive side counted.
    pub fn recv_stats(&self) -> UringRecvStats {
        self.rx
    }

    /// Whether the ring defers the kernel's completion work to this thread's enters
    /// (`DEFER_TASKRUN`, Linux 6.1); `false`: set up `COOP_TASKRUN` instead.
    pub fn is_deferred(&self) -> bool {
        self.ring.is_deferred()
    }
}
