//! The send mechanism: [`UdpSocket::try_send`] turns transmits into `sendmsg`/`sendmmsg`
//! calls and deals at once with every kernel answer that needs no waiting: a short
//! `sendmmsg` (continued), EINTR (retried), GSO refused by the path (the transmit re-sent
//! plain, see `GsoRefusals`), the kernel's segment limit (lowered, re-sent), ENOBUFS on a
//! zerocopy send (copied instead), a pending ICMP error (queue read, sent again). When it must
//! stop (EAGAIN, ENOBUFS from a full device queue, a hard error) it returns the exact
//! [`SendCursor`]: what went, what is left, why. It never sleeps, never polls, and takes no
//! lock for its scratch space, which is the caller's [`SendBuffers`]. Waiting and back-off
//! are policy, above it: [`UdpSocket::send`] in `blocking.rs`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use crate::error::{InvalidTransmit, SendError, SendErrorKind};
use crate::socket::UdpSocket;
use crate::sys::mmsg::{MsgMeta, OutMsg, SendScratch, BATCH};
use crate::transmit::{chunk, validate_transmit, PathLimits, SendBuffers, SendCursor, Transmit};
use crate::txtime::TxClock;
use crate::zerocopy::ZcState;

impl UdpSocket {
    /// Checks a transmit against the socket and the kernel's limits without sending.
    pub fn validate(&self, t: &Transmit<'_>) -> Result<(), InvalidTransmit> {
        let limits = PathLimits {
            family: self.family,
            path_mtu: self.path_mtu(),
            max_segments: self.caps.kernel.gso_max_segments,
        };
        validate_transmit(t, &limits, self.peer == Some(t.destination))
    }
}

impl UdpSocket {
    /// Sends `transmits` from `from` on, in order, as many per system call as the send mode
    /// allows, and returns instead of waiting.
    ///
    /// `Ok(n)`: everything went (`n` = `transmits.len()`). Otherwise the error's
    /// [`SendError::cursor`] says exactly what went, and its kind why it stopped:
    /// [`SendErrorKind::WouldBlock`] (wait for writability) or [`SendErrorKind::NoBuffers`]
    /// (back off), after which the caller continues with `try_send(.., cursor)`; any other kind
    /// is final for the transmit at the cursor. The cursor can stop inside a transmit that goes
    /// as several messages; continuing from it sends the rest, never a datagram twice. Invalid
    /// transmits are refused before anything is sent.
    pub fn try_send(
        &self,
        bufs: &mut SendBuffers,
        transmits: &[Transmit<'_>],
        from: SendCursor,
    ) -> Result<usize, SendError> {
        self.send_with(&mut bufs.0, transmits, from, None)
    }

    /// The loop behind [`UdpSocket::try_send`]. With `zc` (a zerocopy send, its state locked
    /// and an entry open in its tracker) every call carries MSG_ZEROCOPY, and every id the
    /// kernel consumes is added to the open entry: one per message it took, and one per failed
    /// call that used one (found by reading the error queue right after the failure, where the
    /// kernel has already queued that id's completion).
    pub(crate) fn send_with(
        &self,
        scratch: &mut SendScratch,
        transmits: &[Transmit<'_>],
        from: SendCursor,
        mut zc: Option<&mut ZcState>,
    ) -> Result<usize, SendError> {
        let mut flags = if zc.is_some() { libc::MSG_ZEROCOPY } else { 0 };
        // Pending ICMP errors met at the current position (see crate::icmp).
        let mut icmp = crate::icmp::log::IcmpRetry::default();
        for (index, t) in transmits.iter().enumerate().skip(from.transmit) {
            self.validate(t).map_err(|reason| SendError {
                sent: from.transmit,
                partial_segments: from.segment,
                kind: SendErrorKind::Invalid { index, reason },
            })?;
        }
        let batched = self.send_mode.batches();
        let txtime_offset = self.txtime_offset(&transmits[from.transmit.min(transmits.len())..]);
        let mut cur = from;
        // A transmit being re-sent plain after its GSO send was refused: (index, errno).
        let mut gso_suspect: Option<(usize, i32)> = None;
        let c = &self.counters;
        while cur.transmit < transmits.len() {
            self.plan(
                transmits,
                cur,
                if batched { BATCH } else { 1 },
                gso_suspect.map(|s| s.0),
                txtime_offset,
                scratch,
            );
            let zc_call = flags & libc::MSG_ZEROCOPY != 0;
            let first_id = zc.as_deref().filter(|_| zc_call).map(|z| z.tracker.next_id());
            let res = scratch.send_filled(self.fd_ref(), batched, flags, &self.faults, self.uring_send(), first_id);
            c.add(&c.send_calls, 1);
            // Zerocopy through io_uring: the ids are ours and their notifications come on the
            // ring, not the error queue.
            let ring_zc = scratch.last_zc();
            if let (Some(b), Some(z)) = (ring_zc, zc.as_deref_mut()) {
                // One id per entry that went, and one for the entry that failed after taking
                // one (its notification completes it, unjudged: nothing went).
                z.tracker.extend_open(b.sent as u32 + u32::from(b.failed_took_id));
                if b.failed_took_id {
                    c.add(&c.zerocopy_failed_ids, 1);
                }
                let notifs = scratch.zc_notifs(None).unwrap_or_default();
                self.apply_zc_notifs(z, notifs);
            }
            match res {
                Ok(n) => {
                    // The retry budget bounds a flood against one stuck position, not a long
                    // send.
                    icmp = Default::default();
                    if let (true, Some(z)) = (zc_call, zc.as_deref_mut()) {
                        if ring_zc.is_none() {
                            z.tracker.extend_open(n as u32);
                        }
                        c.add(&c.zerocopy_sends, n as u64);
                    }
                    if n < scratch.len() {
                        c.add(&c.partial_sends, 1);
                        if zc_call && ring_zc.is_none() {
                            // The message the kernel stopped at may have failed after taking
                            // an id.
                            self.after_failed_call(zc.as_deref_mut(), true);
                        }
                    }
                    self.account_sent(&scratch.metas()[..n], transmits, &mut cur, &mut gso_suspect);
                }
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(0);
                    let icmp_kind = self.icmp_pending(errno);
                    let drained = if zc_call || (self.caps.recv_err && crate::icmp::log::is_icmp_errno(errno)) {
                        self.after_failed_call(zc.as_deref_mut(), zc_call && ring_zc.is_none())
                    } else {
                        Default::default()
                    };
                    if icmp_kind {
                        // Someone else's ICMP error, or this transmit's own? (crate::icmp)
                        match self.icmp_send_step(&mut icmp, &drained) {
                            crate::icmp::log::IcmpStep::Retry => continue,
                            crate::icmp::log::IcmpStep::Yield => return Err(fail(cur, SendErrorKind::WouldBlock)),
                            crate::icmp::log::IcmpStep::Own => {}
                        }
                    }
                    let first_span = scratch.metas()[0];
                    let first_seg = first_span.segment_size;
                    match errno {
                        libc::EAGAIN => {
                            c.add(&c.would_block, 1);
                            return Err(fail(cur, SendErrorKind::WouldBlock));
                        }
                        libc::ENOBUFS if zc_call => {
                            // optmem exhausted by zerocopy notifications: copy instead, now.
                            flags &= !libc::MSG_ZEROCOPY;
                            c.add(&c.zerocopy_enobufs_copied, 1);
                        }
                        libc::ENOBUFS => {
                            c.add(&c.no_buffers, 1);
                            return Err(fail(cur, SendErrorKind::NoBuffers));
                        }
                        libc::EINVAL
                            if first_seg.is_some() && first_span.segs > 64 && self.caps.max_segments() > 64 =>
                        {
                            self.caps.gso_max_segments.store(64, Ordering::Relaxed);
                            c.add(&c.segment_limit_lowered, 1);
                            log::warn!("udpx: kernel refused {} GSO segments; limit lowered to 64", first_span.segs);
                        }
                        libc::EIO | libc::EINVAL if first_seg.is_some() => {
                            // Re-send this transmit plain at once; decide after.
                            gso_suspect = Some((first_span.t, errno));
                        }
                        libc::EMSGSIZE => {
                            c.add(&c.emsgsize, 1);
                            // A plain re-send after a GSO refusal failed on size: the refusal
                            // was about size, not the device. GSO stays on.
                            let seg = first_seg
                                .map(usize::from)
                                .or_else(|| gso_suspect.and_then(|(t, _)| transmits[t].segment_size));
                            return Err(fail(
                                cur,
                                SendErrorKind::MessageTooLarge {
                                    len: first_span.len.max(transmits[first_span.t].contents.len()),
                                    segment_size: seg,
                                    path_mtu: self.path_mtu(),
                                },
                            ));
                        }
                        _ => {
                            c.add(&c.send_errors, 1);
                            return Err(fail(cur, SendErrorKind::Io(e)));
                        }
                    }
                }
            }
        }
        Ok(transmits.len())
    }

    /// After a send call: counts the messages the kernel took (`sent`, in order), moves `cur`
    /// past them, and, when the plain re-send of the transmit in `gso_suspect` went through
    /// whole, records that the path refuses GSO and clears `gso_suspect`.
    fn account_sent(
        &self,
        sent: &[MsgMeta],
        transmits: &[Transmit<'_>],
        cur: &mut SendCursor,
        gso_suspect: &mut Option<(usize, i32)>,
    ) {
        let c = &self.counters;
        let (mut dgrams, mut bytes, mut gso) = (0, 0, 0);
        for s in sent {
            dgrams += s.segs as u64;
            bytes += s.len as u64;
            gso += s.segment_size.is_some() as u64;
            *cur = if s.last {
                SendCursor { transmit: s.t + 1, segment: 0 }
            } else {
                SendCursor { transmit: s.t, segment: s.first_seg + s.segs }
            };
            if let Some((t, errno)) = *gso_suspect {
                if s.t == t && s.last {
                    // The plain re-send went through: the path refuses GSO.
                    *gso_suspect = None;
                    self.gso_refused(&transmits[t].destination, errno);
                }
            }
        }
        c.add(&c.datagrams_sent, dgrams);
        c.add(&c.bytes_sent, bytes);
        c.add(&c.gso_buffers_sent, gso);
    }

    /// What to add to the transmits' `CLOCK_MONOTONIC` departures to put them on the socket's
    /// `SO_TXTIME` clock: read once per send call, and only when the socket's clock is not
    /// `CLOCK_MONOTONIC` and some transmit carries a departure (see [`crate::txtime`]).
    pub(crate) fn txtime_offset(&self, transmits: &[Transmit<'_>]) -> i64 {
        let c = &self.caps;
        if c.txtime && c.txtime_clock != TxClock::Monotonic && transmits.iter().any(|t| t.departure.is_some()) {
            c.txtime_clock.offset_from_monotonic_ns()
        } else {
            0
        }
    }

    /// Builds the next batch of messages from `cur`: GSO messages of at most the segment limit
    /// where segmenting is on for the destination, one message per segment where it is off
    /// (or `plain_t` says this transmit must go plain), whole contents otherwise. Departures
    /// are shifted by `txtime_offset` onto the socket's clock.
    pub(crate) fn plan(
        &self,
        transmits: &[Transmit<'_>],
        mut cur: SendCursor,
        cap: usize,
        plain_t: Option<usize>,
        txtime_offset: i64,
        out: &mut SendScratch,
    ) {
        out.clear();
        let v6 = self.family.is_v6();
        let max_segs = self.caps.max_segments().max(1);
        while out.len() < cap && cur.transmit < transmits.len() {
            let t = &transmits[cur.transmit];
            let base = self.out_msg(t, txtime_offset);
            let total = t.segments();
            let per_msg = if plain_t != Some(cur.transmit) && self.caps.gso_for(&t.destination) { max_segs } else { 1 };
            while out.len() < cap && cur.segment < total {
                let (range, n, seg) = chunk(t, cur.segment, per_msg);
                let msg = OutMsg { payload: &t.contents[range], segment_size: seg.map(|s| s as u16), ..base };
                let last = cur.segment + n == total;
                let meta = MsgMeta { t: cur.transmit, first_seg: cur.segment, segs: n, last, ..MsgMeta::default() };
                out.push(&msg, v6, meta);
                if last {
                    cur = SendCursor { transmit: cur.transmit + 1, segment: 0 };
                    break;
                }
                cur.segment += n;
            }
        }
    }

    /// The message for the whole of transmit `t` (no segment size: the planner adds it),
    /// departures shifted by `txtime_offset` onto the socket's clock.
    pub(crate) fn out_msg<'a>(&self, t: &Transmit<'a>, txtime_offset: i64) -> OutMsg<'a> {
        OutMsg {
            dst: t.destination,
            to_peer: self.peer == Some(t.destination),
            payload: t.contents,
            segment_size: None,
            src_ip: t.src_ip,
            ecn: t.ecn.map(|e| e as u8),
            txtime: t.departure.map(|d| TxClock::convert(d.as_nanos(), txtime_offset)),
        }
    }

    /// After a send call failed (or a sendmmsg stopped short): reads the error queue. With
    /// `zc_call`, a completion covering the next zerocopy id means the failed call consumed it
    /// (the kernel built the packet, then refused it): the id joins the send's open entry,
    /// already complete, so later ids line up with the kernel's.
    fn after_failed_call(&self, mut zc: Option<&mut ZcState>, zc_call: bool) -> crate::icmp::log::Drained {
        let watch = zc.as_deref().filter(|_| zc_call).map(|z| z.tracker.next_id());
        let d = self.drain_error_queue(zc.as_deref_mut(), watch, &mut |_| {}).unwrap_or_default();
        if let (Some(id), true, Some(z)) = (watch, d.watched_completed, zc) {
            z.tracker.extend_open(1);
            drop(z.tracker.complete(id, id));
            self.counters.add(&self.counters.zerocopy_failed_ids, 1);
        }
        d
    }

    /// Records that the path to `dst` refused GSO (see `GsoRefusals`): counted, logged once
    /// per socket at warn level (every time at debug).
    fn gso_refused(&self, dst: &SocketAddr, errno: i32) {
        self.counters.add(&self.counters.gso_fallbacks, 1);
        let why = self.caps.gso_refused(dst, errno);
        if !self.logged_gso_off.swap(true, Ordering::Relaxed) {
            log::warn!("udpx: GSO refused on {}: {why}", self.local);
        } else {
            log::debug!("udpx: GSO refused on {}: {why}", self.local);
        }
    }

    pub(crate) fn fd_ref(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

fn fail(cur: SendCursor, kind: SendErrorKind) -> SendError {
    SendError { sent: cur.transmit, partial_segments: cur.segment, kind }
}

#[cfg(test)]
mod tests {
    use std::io::IoSliceMut;
    use std::time::Duration;

    use super::*;
    use crate::sys::cmsg::Cmsg;
    use crate::{Error, RecvMeta, Timestamp, Want};

    /// A transmit's departure reaches the kernel as SCM_TXTIME on the socket's clock: as given
    /// on a MONOTONIC socket, shifted by CLOCK_TAI − CLOCK_MONOTONIC on a TAI socket. Then the
    /// real send over loopback (noqueue: the time is ignored) delivers the datagram.
    #[test]
    fn departure_becomes_scm_txtime_on_the_socket_clock() {
        let lo = "127.0.0.1:0".parse().unwrap();
        let rx = UdpSocket::bind(lo).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        for clock in [TxClock::Monotonic, TxClock::Tai] {
            let tx = match UdpSocket::builder(lo).txtime(Want::Required).txtime_clock(clock).bind() {
                Ok(s) => s,
                Err(Error::Unsupported { why, .. }) if clock == TxClock::Tai => {
                    // CLOCK_TAI needs CAP_NET_ADMIN.
                    println!("SKIP: SO_TXTIME with CLOCK_TAI: {why}");
                    continue;
                }
                Err(e) => panic!("{clock}: {e}"),
            };
            assert_eq!(tx.capabilities().txtime_clock, Some(clock));
            let payload = [9u8; 100];
            let departure = Timestamp::now() + Duration::from_millis(1);
            let t = Transmit { departure: Some(departure), ..Transmit::new(rx.local_addr(), &payload) };
            let offset = tx.txtime_offset(&[t]);
            let independent = clock.offset_from_monotonic_ns();
            match clock {
                TxClock::Monotonic => assert_eq!(offset, 0),
                _ => assert!((offset - independent).abs() < 1_000_000, "offset {offset} vs {independent}"),
            }
            assert_eq!(tx.txtime_offset(&[Transmit::new(rx.local_addr(), &payload)]), 0, "no departure, no clock read");
            let mut scratch = SendScratch::new();
            tx.plan(&[t], SendCursor::default(), BATCH, None, offset, &mut scratch);
            let want = departure.as_nanos().checked_add_signed(offset).unwrap();
            assert_eq!(scratch.control(0), vec![Cmsg::TxTime(want)], "{clock}");

            assert_eq!(tx.send(&[t]).unwrap(), 1);
            let mut buf = [0u8; 200];
            let mut meta = [RecvMeta::default()];
            let n = rx.recv(&mut [IoSliceMut::new(&mut buf)], &mut meta).expect("datagram within 1 s");
            assert_eq!((n, meta[0].len), (1, payload.len()), "{clock}");
        }
        let plain = UdpSocket::bind(lo).unwrap();
        assert_eq!(plain.capabilities().txtime_clock, None);
    }
}
