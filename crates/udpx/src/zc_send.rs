//! The socket's zerocopy methods: [`UdpSocket::send_zerocopy`], completions, and the switch
//! that turns zerocopy off where the kernel copies anyway (see [`crate::zerocopy`]).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::{SendError, SendErrorKind};
use crate::socket::UdpSocket;
use crate::sys;
use crate::sys::cmsg::SO_EE_CODE_ZEROCOPY_COPIED;
use crate::transmit::Transmit;
use crate::zerocopy::{Held, ZcBuf, ZcSendError, ZcState, DROP_WAIT};

impl UdpSocket {
    /// Sends `buf` (its first `len` bytes) to `dst`, segmented by `segment_size` if given, with
    /// MSG_ZEROCOPY when zerocopy is on for this socket and the send is at least the
    /// threshold; otherwise by copying. The buffer returns to its pool once the kernel is done
    /// (see [`UdpSocket::reap_completions`]); on error it comes back to the caller unless the
    /// kernel may still read part of it.
    pub fn send_zerocopy(&self, dst: SocketAddr, buf: ZcBuf, segment_size: Option<usize>) -> Result<(), ZcSendError> {
        let t = Transmit { segment_size, ..Transmit::new(dst, &buf) };
        if let Err(reason) = self.validate(&t) {
            let error = SendError { sent: 0, partial_segments: 0, kind: SendErrorKind::Invalid { index: 0, reason } };
            return Err(ZcSendError { buf: Some(buf), error });
        }
        let Some(zc) = self.zc.as_ref() else {
            // Zerocopy not configured: an ordinary send, and the buffer goes back at once.
            return self.send(&[t]).map(drop).map_err(|error| ZcSendError { buf: Some(buf), error });
        };
        // The state stays locked for the whole send: error-queue reads during it (after a
        // failed call) must record completions against this send's open entry. Lock order:
        // the send scratch, then the state.
        let mut scratch = self.send_scratch.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = zc.lock().unwrap_or_else(|e| e.into_inner());
        if !self.caps.zerocopy.load(Ordering::Relaxed) || buf.len() < state.cfg.threshold {
            drop(state);
            let res = self.send_blocking(&mut scratch.0, &[t], None);
            return res.map(drop).map_err(|error| ZcSendError { buf: Some(buf), error });
        }
        // Backpressure: bound the sends in flight.
        let deadline = Instant::now() + Duration::from_secs(2);
        while state.tracker.len() >= state.cfg.max_inflight && Instant::now() < deadline {
            if scratch.0.zc_on_ring() {
                let notifs = scratch.0.zc_notifs(Some(Duration::from_millis(10))).unwrap_or_default();
                self.apply_zc_notifs(&mut state, notifs);
                continue;
            }
            // POLLERR is always reported; asking for no events waits for it alone.
            let _ = sys::poll_one(self.fd_ref(), 0, Duration::from_millis(10));
            let _ = self.drain_error_queue(Some(&mut state), None, &mut |_| {});
        }
        state.tracker.open();
        let res = self.send_blocking(&mut scratch.0, &[t], Some(&mut state));
        match res {
            // The tracker keeps the buffer until every id it consumed completed; one whose ids
            // all completed already (or that went by copying) comes back here and is dropped
            // into its pool.
            Ok(_) => {
                drop(state.tracker.close_open(Held::Own(buf)));
                Ok(())
            }
            // While any id of the send is outstanding (part of it went with MSG_ZEROCOPY), the
            // kernel may read the buffer: the tracker keeps it and the caller gets the error
            // alone. Otherwise (nothing went, or only a refused call's id, already complete)
            // the buffer comes back with the error, to be sent again.
            Err(error) => {
                let buf = match state.tracker.close_open(Held::Own(buf)) {
                    Some(Held::Own(b)) => Some(b),
                    _ => None,
                };
                Err(ZcSendError { buf, error })
            }
        }
    }

    /// [`UdpSocket::try_send`] for transmits that borrow `storage`, a pooled buffer its owner
    /// fills again and again (an outbox): with zerocopy on for this socket and messages of at
    /// least the threshold on average (from `from` on; a transmit is one message where it goes
    /// as one GSO buffer, one per segment otherwise), the calls carry MSG_ZEROCOPY and the
    /// socket keeps a share of `storage` until every id they consumed has completed.
    /// `Arc::get_mut` on the caller's share fails until then: the caller must not write to
    /// `storage` before it succeeds (take another buffer from the pool meanwhile). Otherwise,
    /// and when more than `max_inflight` sends are in flight, the transmits are copied. Never
    /// waits; errors and the cursor are [`UdpSocket::try_send`]'s.
    pub fn try_send_zerocopy(
        &self,
        bufs: &mut crate::SendBuffers,
        transmits: &[Transmit<'_>],
        from: crate::SendCursor,
        storage: &std::sync::Arc<ZcBuf>,
    ) -> Result<usize, crate::SendError> {
        let Some(zc) = self.zc.as_ref().filter(|_| self.zerocopy_on()) else {
            return self.try_send(bufs, transmits, from);
        };
        // The messages' mean size: a transmit is one message where it goes as one GSO buffer,
        // one per segment otherwise (pinning pages for each small datagram costs more than
        // copying it).
        let rest = transmits.get(from.transmit..).unwrap_or_default();
        let (mut bytes, mut msgs) = (0, 0);
        for t in rest {
            bytes += t.contents.len();
            msgs += if self.caps.gso_for(&t.destination) { 1 } else { t.segments() };
        }
        let mut state = zc.lock().unwrap_or_else(|e| e.into_inner());
        let large = msgs > 0 && bytes / msgs >= state.cfg.threshold;
        if !large {
            drop(state);
            return self.try_send(bufs, transmits, from);
        }
        if state.tracker.len() >= state.cfg.max_inflight {
            // Completions read now may make room; otherwise copy rather than wait.
            let _ = self.drain_error_queue(Some(&mut state), None, &mut |_| {});
            if state.tracker.len() >= state.cfg.max_inflight {
                self.counters.add(&self.counters.zerocopy_inflight_copied, 1);
                drop(state);
                return self.try_send(bufs, transmits, from);
            }
        }
        state.tracker.open();
        let res = self.send_with(&mut bufs.0, transmits, from, Some(&mut state));
        // No id consumed, or all completed already: the share comes back and is dropped.
        drop(state.tracker.close_open(Held::Shared(storage.clone())));
        res
    }

    /// Whether this socket's sends use zerocopy now (asked for, accepted, not turned off).
    pub fn zerocopy_on(&self) -> bool {
        self.zc.is_some() && self.caps.zerocopy.load(Ordering::Relaxed)
    }

    /// Zerocopy sends whose buffers the kernel may still read.
    pub fn zerocopy_in_flight(&self) -> usize {
        // A lock poisoned by a panic still holds the truth about buffers the kernel may read.
        self.zc.as_ref().map_or(0, |z| z.lock().unwrap_or_else(|e| e.into_inner()).tracker.len())
    }

    /// The id the kernel will give the next zerocopy send call (0 on a new socket); with every
    /// completion read, the last completed id is one less.
    pub fn zerocopy_next_id(&self) -> Option<u32> {
        self.zc.as_ref().map(|z| z.lock().unwrap_or_else(|e| e.into_inner()).tracker.next_id())
    }

    /// Reads completions from the error queue (waiting up to `wait` for the first if none is
    /// queued and sends are in flight) and returns finished buffers to their pool. Returns how
    /// many buffers came back. ICMP errors read on the way are counted (see
    /// [`UdpSocket::drain_errors`] to see them).
    pub fn reap_completions(&self, wait: Option<Duration>) -> std::io::Result<usize> {
        let Some(zc) = self.zc.as_ref() else { return Ok(0) };
        if self.uring_send().is_some() {
            let mut scratch = self.send_scratch.lock().unwrap_or_else(|e| e.into_inner());
            if scratch.0.zc_on_ring() {
                // SENDMSG_ZC: the notifications come on the ring (waited for there, holding
                // only the scratch); ICMP errors still come by the error queue.
                let busy = !zc.lock().unwrap_or_else(|e| e.into_inner()).tracker.is_empty();
                let notifs = scratch.0.zc_notifs(wait.filter(|_| busy))?;
                let mut state = zc.lock().unwrap_or_else(|e| e.into_inner());
                let released = self.apply_zc_notifs(&mut state, notifs);
                drop(state);
                drop(scratch);
                self.drain_error_queue(None, None, &mut |_| {})?;
                return Ok(released);
            }
        }
        if let Some(w) = wait {
            if zc.lock().unwrap_or_else(|e| e.into_inner()).tracker.is_empty() {
                return Ok(0);
            }
            // POLLERR is always reported; asking for no events waits for it alone.
            sys::poll_one(self.fd_ref(), 0, w)?;
        }
        Ok(self.drain_error_queue(None, None, &mut |_| {})?.released)
    }

    /// One zerocopy completion (ids `e.info..=e.data`): releases the buffers it finishes and,
    /// with `judge`, tracks the copied streak. Returns (buffers released, zerocopy should turn
    /// off).
    pub(crate) fn zerocopy_completion(
        &self,
        state: &mut ZcState,
        e: &crate::sys::cmsg::ExtErr,
        judge: bool,
    ) -> (usize, bool) {
        let c = &self.counters;
        let n = e.data.wrapping_sub(e.info) as u64 + 1;
        c.add(&c.zerocopy_completed, n);
        let released = state.tracker.complete(e.info, e.data).len(); // dropped: back to the pool
        if !judge {
            (released, false)
        } else if e.code & SO_EE_CODE_ZEROCOPY_COPIED != 0 {
            c.add(&c.zerocopy_copied, n);
            state.copied_in_row += 1;
            let limit = state.cfg.copied_limit;
            (released, limit > 0 && state.zerocopied == 0 && state.copied_in_row >= limit)
        } else {
            state.zerocopied += 1;
            state.copied_in_row = 0;
            (released, false)
        }
    }

    /// Applies io_uring zerocopy notifications (see `sys/uring.rs`) as the error queue's
    /// completions are applied: buffers released, copies judged (not a failed send's).
    /// Returns the buffers released.
    pub(crate) fn apply_zc_notifs(&self, state: &mut ZcState, notifs: Vec<crate::sys::zc::Notif>) -> usize {
        let (mut released, mut off) = (0, false);
        self.counters.add(&self.counters.zerocopy_ring_notifs, notifs.len() as u64);
        for n in notifs {
            let code = if n.copied { SO_EE_CODE_ZEROCOPY_COPIED } else { 0 };
            let e =
                crate::sys::cmsg::ExtErr { errno: 0, origin: 0, ty: 0, code, info: n.id, data: n.id, offender: None };
            let (r, o) = self.zerocopy_completion(state, &e, !n.failed);
            released += r;
            off |= o;
        }
        if off {
            self.turn_off_zerocopy();
        }
        released
    }

    /// Turns zerocopy off for this socket (once): recorded, logged, counted.
    pub(crate) fn turn_off_zerocopy(&self) {
        if self.caps.zerocopy.swap(false, Ordering::Relaxed) {
            let c = &self.counters;
            c.add(&c.zerocopy_turned_off, 1);
            let why = "the kernel copied every zerocopy send so far (local delivery, or a device \
                       without scatter-gather): copying is cheaper"
                .to_string();
            log::warn!("udpx: zerocopy turned off on {}: {why}", self.local);
            let _ = self.caps.zerocopy_off_reason.set(why);
        }
    }

    /// On drop: wait (bounded) for completions, then keep whatever is still in flight alive.
    pub(crate) fn settle_zerocopy(&mut self) {
        let Some(zc) = self.zc.as_ref() else { return };
        let deadline = Instant::now() + DROP_WAIT;
        while self.zerocopy_in_flight() > 0 && Instant::now() < deadline {
            if self.reap_completions(Some(Duration::from_millis(20))).is_err() {
                break;
            }
        }
        let left = zc.lock().unwrap_or_else(|e| e.into_inner()).tracker.take_all();
        if !left.is_empty() {
            self.counters.add(&self.counters.zerocopy_leaked_on_drop, left.len() as u64);
            log::warn!("udpx: {} zerocopy buffers still in flight at close; kept alive (leaked)", left.len());
            for b in left {
                b.leak();
            }
        }
    }
}
