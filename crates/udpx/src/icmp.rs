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
//! is connected or not. Left alone, the next send or receive fails with that error
//! (ECONNREFUSED, EHOSTUNREACH, EMSGSIZE, ...) though it has nothing to do with it, the queued
//! errors are charged to the receive buffer, and `POLLERR` stays raised so a `poll` loop
//! spins; anyone on the path can send such errors. udpx therefore:
//! - on an unconnected socket, retries a send or receive that fails with an ICMP kind of
//!   errno while ICMP errors are queued, after reading the queue: the pending error is
//!   checked before any work (`sock_alloc_send_pskb`, `__skb_recv_udp`), so the failed call
//!   moved nothing. The errors are counted (`icmp_errors`, `icmp_retries`), not returned. A
//!   connected socket gets the error returned (after the queue is read), as it would without
//!   `IP_RECVERR`: there it is about its one peer;
//! - in its waits ([`UdpSocket::wait_readable`], [`UdpSocket::wait_writable`]) reads the queue
//!   when `POLLERR` shows up and goes on waiting, instead of returning at once;
//! - offers [`UdpSocket::drain_errors`] to a caller that wants the errors themselves (an
//!   unreachable peer, a path MTU), each with the destination of the datagram that caused it.
//!
//! A socket that turns it off never sees ICMP errors when unconnected (a connected one sees
//! the hard errors about its peer), and a qdisc drop goes unreported.

use std::io;
use std::net::SocketAddr;

use crate::socket::UdpSocket;
use crate::sys;
use crate::sys::cmsg::{ExtErr, SO_EE_ORIGIN_ZEROCOPY};
use crate::zerocopy::ZcState;

/// Times one send or receive is retried after draining ICMP errors, before the error is
/// reported (each retry needs newly queued errors, so this only bounds a flood).
pub(crate) const ICMP_RETRIES: u32 = 8;

/// Where an error-queue entry came from (`ee_origin`, `include/uapi/linux/errqueue.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorOrigin {
    /// Raised by the local stack (`SO_EE_ORIGIN_LOCAL`), e.g. a datagram over the local MTU.
    Local,
    /// An ICMP message (`SO_EE_ORIGIN_ICMP`).
    Icmp,
    /// An ICMPv6 message (`SO_EE_ORIGIN_ICMP6`).
    Icmp6,
    /// Anything else, with its number.
    Other(u8),
}

/// One ICMP (or local) error about a datagram this socket sent, read from the error queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct IcmpError {
    /// The destination of the datagram that caused it (`msg_name` of the error-queue read).
    pub destination: Option<SocketAddr>,
    /// The errno the kernel maps it to: ECONNREFUSED for port unreachable, EMSGSIZE for
    /// "fragmentation needed" / "packet too big", EHOSTUNREACH, ...
    pub errno: i32,
    /// Where it came from.
    pub origin: ErrorOrigin,
    /// ICMP type.
    pub icmp_type: u8,
    /// ICMP code.
    pub icmp_code: u8,
    /// `ee_info`: the next-hop MTU for EMSGSIZE errors, 0 otherwise.
    pub info: u32,
}

impl IcmpError {
    fn from_ext(e: &ExtErr, destination: Option<SocketAddr>) -> Self {
        let origin = match e.origin {
            1 => ErrorOrigin::Local,
            2 => ErrorOrigin::Icmp,
            3 => ErrorOrigin::Icmp6,
            o => ErrorOrigin::Other(o),
        };
        IcmpError { destination, errno: e.errno as i32, origin, icmp_type: e.ty, icmp_code: e.code, info: e.info }
    }
}

/// Errnos an ICMP error can leave pending on a socket (`icmp_err_convert`, `icmpv6_err_convert`).
pub(crate) fn is_icmp_errno(errno: i32) -> bool {
    matches!(
        errno,
        libc::ECONNREFUSED
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::EHOSTDOWN
            | libc::ENONET
            | libc::EMSGSIZE
            | libc::ENOPROTOOPT
            | libc::EPROTO
            | libc::EACCES
            | libc::EOPNOTSUPP
    )
}

/// What one drain of the error queue found.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Drained {
    /// Entries read.
    pub read: usize,
    /// ICMP or local errors among them.
    pub icmp: usize,
    /// Of those, errors that came from the network (ICMP, ICMPv6): the ones that leave a
    /// pending error on the socket for some later, unrelated call. A local error
    /// (`SO_EE_ORIGIN_LOCAL`, e.g. EMSGSIZE for a datagram over the route's MTU) belongs to the
    /// call that just failed and must not make it retry.
    pub remote: usize,
    /// Zerocopy buffers released.
    pub released: usize,
    /// A completion covered the watched zerocopy id.
    pub watched_completed: bool,
}

impl UdpSocket {
    /// Reads the error queue without waiting: ICMP errors go to `f` (and the `icmp_errors`
    /// counter), zerocopy completions release their buffers. Returns how many ICMP errors were
    /// read. Errors arrive only with [`SocketConfig::recv_err`](crate::SocketConfig::recv_err).
    pub fn drain_errors(&self, mut f: impl FnMut(&IcmpError)) -> io::Result<usize> {
        Ok(self.drain_error_queue(None, None, &mut f)?.icmp)
    }

    /// The one reader of the error queue. `zc`: the zerocopy state when the caller holds its
    /// lock already (a zerocopy send in progress); otherwise it is locked here. `watch`: a
    /// zerocopy id to report on (did a completion cover it?).
    pub(crate) fn drain_error_queue(
        &self,
        zc: Option<&mut ZcState>,
        watch: Option<u32>,
        on_icmp: &mut dyn FnMut(&IcmpError),
    ) -> io::Result<Drained> {
        match (zc, self.zc.as_ref()) {
            (Some(state), _) => self.drain_with(Some(state), watch, on_icmp),
            (None, Some(m)) => {
                let mut state = m.lock().unwrap_or_else(|e| e.into_inner());
                self.drain_with(Some(&mut state), watch, on_icmp)
            }
            (None, None) => self.drain_with(None, watch, on_icmp),
        }
    }

    fn drain_with(
        &self,
        mut zc: Option<&mut ZcState>,
        watch: Option<u32>,
        on_icmp: &mut dyn FnMut(&IcmpError),
    ) -> io::Result<Drained> {
        let c = &self.counters;
        let mut d = Drained::default();
        let mut turn_off = false;
        d.read = sys::errqueue::drain(self.fd_ref(), 1024, |e, dst| {
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
            d.icmp += 1;
            d.remote += matches!(e.origin, 2 | 3) as usize;
            c.add(&c.icmp_errors, 1);
            on_icmp(&IcmpError::from_ext(&e, dst));
        })?;
        if turn_off {
            self.turn_off_zerocopy();
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn origins_and_fields() {
        let e = ExtErr { errno: libc::EMSGSIZE as u32, origin: 2, ty: 3, code: 4, info: 1400, data: 0 };
        let dst: SocketAddr = "192.0.2.1:443".parse().unwrap();
        let i = IcmpError::from_ext(&e, Some(dst));
        assert_eq!(
            (i.origin, i.errno, i.icmp_type, i.icmp_code, i.info),
            (ErrorOrigin::Icmp, libc::EMSGSIZE, 3, 4, 1400)
        );
        assert_eq!(i.destination, Some(dst));
        assert_eq!(IcmpError::from_ext(&ExtErr { origin: 9, ..e }, None).origin, ErrorOrigin::Other(9));
    }
}
