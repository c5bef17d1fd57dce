//! The socket's error queue as a caller sees it: ICMP errors (with `IP_RECVERR`, which is
//! opt-in) and, on a zerocopy socket, send completions. One drain reads both, so neither can
//! hide the other and `POLLERR` never stays raised.
//!
//! ## `IP_RECVERR`: on, and made harmless
//!
//! udpx turns it on by default ([`SocketConfig::recv_err`](crate::SocketConfig::recv_err)),
//! because without it the kernel hides a datagram the egress qdisc dropped: `udp_send_skb`
//! turns that ENOBUFS into success unless the socket has `IP_RECVERR`, and the drop is silent.
//! With it, the kernel queues every ICMP error about a datagram this socket sent *and* sets a
//! pending socket error (`sk_err`, in `__udp4_lib_err` / `__udp6_lib_err`) whether the socket
//! is connected or not. The queue entry is dropped when the receive buffer is full
//! (`sock_queue_err_skb`), the pending error is set anyway. Left alone, the next send or
//! receive fails with that error (ECONNREFUSED, EHOSTUNREACH, EMSGSIZE, ...) though it has
//! nothing to do with it, the queued errors are charged to the receive buffer, and `POLLERR`
//! stays raised so a `poll` loop spins. Anyone on the path, or anyone who can forge a
//! source address, can send such errors at any rate.
//!
//! ## The rule
//!
//! On an **unconnected** socket an error an ICMP message caused is never returned as the
//! failure of a send or a receive:
//! - **Receive.** On an unconnected UDP socket every ICMP kind of errno from `recvmsg` is a
//!   pending error (`__skb_recv_udp` checks `sk_err` before the queue, and clears it): the
//!   call received nothing. udpx reads the error queue (counting what is there) and receives
//!   again. A flood can keep one call meeting new errors; after [`ICMP_FLOOD_BUDGET`] of them
//!   in a row the call returns `WouldBlock` (counted, `icmp_flood_yields`), as if nothing had
//!   arrived, so an event loop goes on with its other work and comes back.
//! - **Send.** A pending error fails the next send before it builds anything
//!   (`sock_alloc_send_pskb` checks and clears `sk_err`), and `sendmmsg` leaves the error of a
//!   message it stopped at in `sk_err` for the next call. But a send can also fail with the
//!   same errnos for reasons of its own (no route: ENETUNREACH or EHOSTUNREACH; a datagram over
//!   the path MTU: EMSGSIZE; a prohibit route: EACCES), and those fail every time. So a failed
//!   transmit is sent again at once (the pending error is gone now), again and again while
//!   each failure brings new ICMP errors from the network to the queue (a flood, not the
//!   transmit, failed it), up to [`ICMP_FLOOD_BUDGET`] tries, after which the send returns
//!   `WouldBlock` with its cursor (nothing lost; counted). A failure that queued a *local*
//!   error (the kernel's own report on the call, `SO_EE_ORIGIN_LOCAL`: EMSGSIZE over the
//!   route's MTU) and no ICMP error is the transmit's own at once. Failures with no new error
//!   at all are retried twice more (a flood whose queue entries the kernel dropped on a full
//!   receive buffer still sets the pending error), then the error is the transmit's own and
//!   is reported as that transmit's (EMSGSIZE as `MessageTooLarge`, the others as `Io`),
//!   never as the socket's.
//! - **Waiting.** [`UdpSocket::wait_readable`] / [`UdpSocket::wait_writable`] read the queue
//!   when `POLLERR` shows up and go on waiting; a pending error whose queue entry was dropped
//!   is read with `SO_ERROR` (which clears it) and counted.
//!
//! A **connected** socket gets the error returned (after the queue is read), as it would
//! without `IP_RECVERR`: there it is about its one peer.
//!
//! Everything read is counted in the socket's counters by kind ([`IcmpKind`]:
//! `icmp_port_unreachable`, `icmp_host_unreachable`, ... ) and by offending address in a
//! bounded top list ([`UdpSocket::icmp_offenders`]: the host that sent the ICMP message, as
//! the kernel reports it, [`OFFENDERS`] addresses at most, kept by the space-saving
//! algorithm so a heavy sender is never pushed out by many light ones). The last
//! [`RECENT_ERRORS`] errors the library read while retrying are kept for
//! [`UdpSocket::drain_errors`], so an application that acts on them (a server ending a flow
//! whose client went away) sees them too: a flood only overwrites the oldest.
//!
//! A socket that turns `IP_RECVERR` off never sees ICMP errors when unconnected (a connected
//! one sees the hard errors about its peer), and a qdisc drop goes unreported.

pub(crate) mod log;

pub use log::*;

use std::io;
use std::net::IpAddr;

use crate::socket::UdpSocket;
use crate::sys;
use crate::sys::cmsg::SO_EE_ORIGIN_ZEROCOPY;
use crate::zerocopy::ZcState;
impl UdpSocket {
    /// Whether `errno` from a send or receive may be an error an ICMP message left pending,
    /// which this socket does not return (unconnected, with `IP_RECVERR`).
    pub(crate) fn icmp_pending(&self, errno: i32) -> bool {
        self.caps.recv_err && self.peer.is_none() && is_icmp_errno(errno)
    }

    /// The step for a send that failed with an ICMP kind of errno, after the error queue was
    /// read: `d` says what it held (ICMP errors from the network; local errors, which the
    /// kernel queues for the failed call itself, such as EMSGSIZE over the route's MTU).
    pub(crate) fn icmp_send_step(&self, r: &mut IcmpRetry, d: &Drained) -> IcmpStep {
        let c = &self.counters;
        let (remote, local) = (d.remote, d.icmp - d.remote);
        let step = if r.tries >= ICMP_FLOOD_BUDGET {
            IcmpStep::Yield
        } else if remote == 0 && local > 0 {
            // The kernel queued an error for this very call: its own.
            IcmpStep::Own
        } else if r.tries == 0 || remote > 0 {
            IcmpStep::Retry
        } else if r.blind < BLIND_RETRIES {
            // No ICMP error in the queue, yet the call failed again: a flood whose queue
            // entries the kernel dropped (full receive buffer) sets the pending error all the
            // same, so try a little more before calling it the transmit's own.
            r.blind += 1;
            IcmpStep::Retry
        } else {
            IcmpStep::Own
        };
        match step {
            IcmpStep::Retry => {
                r.tries += 1;
                c.add(&c.icmp_retries, 1);
            }
            IcmpStep::Yield => {
                *r = IcmpRetry::default();
                c.add(&c.icmp_flood_yields, 1);
            }
            IcmpStep::Own => *r = IcmpRetry::default(),
        }
        step
    }

    /// A receive failed with `errno`, an ICMP error pending on this unconnected socket: reads
    /// the queue and says whether to receive again (`false`: the flood budget is spent, the
    /// call returns `WouldBlock`). `retries` counts this call's retries.
    pub(crate) fn icmp_recv_retry(&self, retries: &mut u32) -> bool {
        let c = &self.counters;
        // What the queue holds is counted there; nothing in it (an entry dropped on a full
        // receive buffer) changes nothing: the pending error is gone either way.
        let _ = self.drain_error_queue(None, None, &mut |_| {});
        *retries += 1;
        if *retries > ICMP_FLOOD_BUDGET {
            c.add(&c.icmp_flood_yields, 1);
            return false;
        }
        c.add(&c.icmp_retries, 1);
        true
    }

    /// Reads the error queue without waiting: ICMP errors go to `f`, the ones the library
    /// read itself since the last call first (the newest [`RECENT_ERRORS`]); zerocopy
    /// completions release their buffers. Returns how many ICMP errors `f` saw. Errors arrive
    /// only with [`SocketConfig::recv_err`](crate::SocketConfig::recv_err).
    pub fn drain_errors(&self, mut f: impl FnMut(&IcmpError)) -> io::Result<usize> {
        let earlier: Vec<IcmpError> = {
            let mut log = self.icmp_log.lock().unwrap_or_else(|e| e.into_inner());
            log.recent.drain(..).collect()
        };
        for e in &earlier {
            f(e);
        }
        let mut now = 0;
        self.drain_with_log(None, None, false, &mut |e| {
            now += 1;
            f(e)
        })?;
        Ok(earlier.len() + now)
    }

    /// The hosts that sent this socket the most ICMP errors, most first, with a count that is
    /// never below the true one (see [`OFFENDERS`]).
    pub fn icmp_offenders(&self) -> Vec<(IpAddr, u64)> {
        self.icmp_log.lock().unwrap_or_else(|e| e.into_inner()).offenders.sorted()
    }

    /// The one reader of the error queue for the library's own use: what it reads is counted
    /// and kept for [`UdpSocket::drain_errors`]. `zc`: the zerocopy state when the caller
    /// holds its lock already (a zerocopy send in progress); otherwise it is locked here.
    /// `watch`: a zerocopy id to report on (did a completion cover it?).
    pub(crate) fn drain_error_queue(
        &self,
        zc: Option<&mut ZcState>,
        watch: Option<u32>,
        on_icmp: &mut dyn FnMut(&IcmpError),
    ) -> io::Result<Drained> {
        self.drain_with_log(zc, watch, true, on_icmp)
    }

    fn drain_with_log(
        &self,
        zc: Option<&mut ZcState>,
        watch: Option<u32>,
        keep: bool,
        on_icmp: &mut dyn FnMut(&IcmpError),
    ) -> io::Result<Drained> {
        match (zc, self.zc.as_ref()) {
            (Some(state), _) => self.drain_with(Some(state), watch, keep, on_icmp),
            (None, Some(m)) => {
                let mut state = m.lock().unwrap_or_else(|e| e.into_inner());
                self.drain_with(Some(&mut state), watch, keep, on_icmp)
            }
            (None, None) => self.drain_with(None, watch, keep, on_icmp),
        }
    }

    fn drain_with(
        &self,
        mut zc: Option<&mut ZcState>,
        watch: Option<u32>,
        keep: bool,
        on_icmp: &mut dyn FnMut(&IcmpError),
    ) -> io::Result<Drained> {
        let mut d = Drained::default();
        let mut turn_off = false;
        let mut errors: Vec<IcmpError> = Vec::new();
        d.read = sys::errqueue::drain(self.fd_ref(), 1024, |e, dst, quoted| {
            if e.origin == SO_EE_ORIGIN_ZEROCOPY && e.errno == 0 {
                if let Some(w) = watch {
                    d.watched_completed |= w.wrapping_sub(e.info) <= e.data.wrapping_sub(e.info);
                }
                if let Some(state) = zc.as_deref_mut() {
                    // The watched id alone is a refused call's: nothing was sent, so whether
                    // it says "copied" tells nothing about the path.
                    let judge = !(e.info == e.data && Some(e.info) == watch);
                    let (released, off) = self.zerocopy_completion(state, &e, judge);
                    d.released += released;
                    turn_off |= off;
                }
                return;
            }
            let err = IcmpError::from_ext(&e, dst, quoted);
            d.icmp += 1;
            d.remote += err.is_remote() as usize;
            errors.push(err);
        })?;
        if turn_off {
            self.turn_off_zerocopy();
        }
        if !errors.is_empty() {
            self.count_icmp(&errors, keep);
            for e in &errors {
                on_icmp(e);
            }
        }
        Ok(d)
    }

    /// Counts errors read from the queue (by kind, by offender) and, with `keep`, keeps them
    /// for [`UdpSocket::drain_errors`].
    fn count_icmp(&self, errors: &[IcmpError], keep: bool) {
        let c = &self.counters;
        c.add(&c.icmp_errors, errors.len() as u64);
        let mut log = self.icmp_log.lock().unwrap_or_else(|e| e.into_inner());
        for e in errors {
            let counter = match e.kind() {
                IcmpKind::PortUnreachable => &c.icmp_port_unreachable,
                IcmpKind::HostUnreachable => &c.icmp_host_unreachable,
                IcmpKind::NetUnreachable => &c.icmp_net_unreachable,
                IcmpKind::TooBig => &c.icmp_too_big,
                IcmpKind::Prohibited => &c.icmp_prohibited,
                IcmpKind::Other => &c.icmp_other,
            };
            c.add(counter, 1);
            if let Some(ip) = e.offender {
                log.offenders.count(ip);
            }
            if keep {
                if log.recent.len() == RECENT_ERRORS {
                    log.recent.pop_front();
                    c.add(&c.icmp_unseen, 1);
                }
                log.recent.push_back(*e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::cmsg::ExtErr;
    use crate::sys::errqueue::QUOTE_MAX;
    use std::net::SocketAddr;

    #[test]
    fn icmp_errnos() {
        for e in [libc::ECONNREFUSED, libc::EHOSTUNREACH, libc::EMSGSIZE] {
            assert!(is_icmp_errno(e));
        }
        for e in [libc::EAGAIN, libc::ENOBUFS, libc::EINVAL, libc::EIO] {
            assert!(!is_icmp_errno(e), "{e}");
        }
    }

    #[test]
    fn kinds_by_errno() {
        let cases = [
            (libc::ECONNREFUSED, IcmpKind::PortUnreachable),
            (libc::EHOSTUNREACH, IcmpKind::HostUnreachable),
            (libc::EHOSTDOWN, IcmpKind::HostUnreachable),
            (libc::ENETUNREACH, IcmpKind::NetUnreachable),
            (libc::ENONET, IcmpKind::NetUnreachable),
            (libc::EMSGSIZE, IcmpKind::TooBig),
            (libc::EACCES, IcmpKind::Prohibited),
            (libc::EPROTO, IcmpKind::Other),
            (libc::ENOPROTOOPT, IcmpKind::Other),
        ];
        for (errno, kind) in cases {
            assert_eq!(IcmpKind::of_errno(errno), kind, "{errno}");
        }
    }

    #[test]
    fn origins_fields_and_quote() {
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        let e =
            ExtErr { errno: libc::EMSGSIZE as u32, origin: 2, ty: 3, code: 4, info: 1400, data: 0, offender: Some(ip) };
        let dst: SocketAddr = "192.0.2.1:443".parse().unwrap();
        let i = IcmpError::from_ext(&e, Some(dst), b"abc");
        assert_eq!(
            (i.origin, i.errno, i.icmp_type, i.icmp_code, i.info),
            (ErrorOrigin::Icmp, libc::EMSGSIZE, 3, 4, 1400)
        );
        assert_eq!(
            (i.destination, i.offender, i.quoted(), i.kind()),
            (Some(dst), Some(ip), &b"abc"[..], IcmpKind::TooBig)
        );
        let v4 = |code| {
            IcmpError::from_ext(&ExtErr { errno: libc::EHOSTUNREACH as u32, ty: 3, code, ..e }, None, &[]).kind()
        };
        assert_eq!(
            [v4(3), v4(1), v4(0), v4(13), v4(10), v4(2)],
            [
                IcmpKind::PortUnreachable,
                IcmpKind::HostUnreachable,
                IcmpKind::NetUnreachable,
                IcmpKind::Prohibited,
                IcmpKind::Prohibited,
                IcmpKind::Other
            ]
        );
        let v6 = |ty, code| IcmpError::from_ext(&ExtErr { origin: 3, ty, code, ..e }, None, &[]).kind();
        assert_eq!(
            [v6(1, 4), v6(1, 1), v6(2, 0), v6(3, 0)],
            [IcmpKind::PortUnreachable, IcmpKind::Prohibited, IcmpKind::TooBig, IcmpKind::Other]
        );
        assert!(i.is_remote());
        let local = IcmpError::from_ext(&ExtErr { origin: 1, ..e }, None, &[7; 100]);
        assert!(!local.is_remote());
        assert_eq!(local.quoted(), &[7; QUOTE_MAX][..], "a long quote is cut to 64 bytes");
        assert_eq!(IcmpError::from_ext(&ExtErr { origin: 9, ..e }, None, &[]).origin, ErrorOrigin::Other(9));
    }

    /// The space-saving list: bounded, the heavy hitter kept however many light ones pass, and
    /// no count below the truth.
    #[test]
    fn offenders_keep_the_heavy_hitters() {
        let mut o = Offenders::default();
        let heavy: IpAddr = "203.0.113.1".parse().unwrap();
        let mut sent_by_heavy = 0;
        for i in 0..10_000u32 {
            if i % 4 == 0 {
                o.count(heavy);
                sent_by_heavy += 1;
            } else {
                o.count(IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
            }
        }
        let top = o.sorted();
        assert_eq!(top.len(), OFFENDERS);
        assert_eq!(top[0].0, heavy, "{top:?}");
        assert!(top[0].1 >= sent_by_heavy);
    }

    /// The retry rule for sends: the first failure is retried, a second one only with new
    /// ICMP errors read, a flood yields after the budget, and no evidence means the error is
    /// the transmit's own.
    #[test]
    fn send_steps() {
        let s = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let none = Drained::default();
        let flood = Drained { read: 1, icmp: 1, remote: 1, ..Drained::default() };
        let local = Drained { read: 1, icmp: 1, remote: 0, ..Drained::default() };
        assert_eq!(s.icmp_send_step(&mut IcmpRetry::default(), &local), IcmpStep::Own, "the call's own local error");
        let mut r = IcmpRetry::default();
        assert_eq!(s.icmp_send_step(&mut r, &none), IcmpStep::Retry, "the first failure: a pending error");
        for _ in 0..BLIND_RETRIES {
            assert_eq!(s.icmp_send_step(&mut r, &none), IcmpStep::Retry, "no ICMP read: maybe a dropped entry");
        }
        assert_eq!(s.icmp_send_step(&mut r, &none), IcmpStep::Own, "again, and no ICMP came: the transmit's own");
        assert_eq!(s.icmp_send_step(&mut r, &none), IcmpStep::Retry, "reset for the next transmit");
        let before = s.counters().icmp_retries;
        let mut r = IcmpRetry::default();
        let mut steps = vec![];
        for _ in 0..=ICMP_FLOOD_BUDGET {
            steps.push(s.icmp_send_step(&mut r, &flood));
        }
        assert!(steps[..ICMP_FLOOD_BUDGET as usize].iter().all(|s| *s == IcmpStep::Retry));
        assert_eq!(steps.last(), Some(&IcmpStep::Yield), "a flood: the caller gets WouldBlock");
        let c = s.counters();
        assert_eq!((c.icmp_retries - before, c.icmp_flood_yields), (u64::from(ICMP_FLOOD_BUDGET), 1));
    }
}
