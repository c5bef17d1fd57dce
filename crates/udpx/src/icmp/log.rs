//! What the ICMP rule keeps: the kinds of error, the bounded top list of senders, the
//! recent errors for [`UdpSocket::drain_errors`](crate::UdpSocket::drain_errors)(crate::UdpSocket::drain_errors), and how
//! a call goes on after one. The rule itself (the socket's methods) is in [`super`].

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use crate::sys::cmsg::ExtErr;
use crate::sys::errqueue::QUOTE_MAX;

/// ICMP errors one send or receive call meets in a row before it gives the caller back
/// `WouldBlock` (each needs a new ICMP message, so this bounds the work of one call in a
/// flood, not the number of errors the socket survives: that is unbounded).
pub const ICMP_FLOOD_BUDGET: u32 = 64;
/// Addresses kept in a socket's top list of ICMP senders.
pub const OFFENDERS: usize = 16;
/// ICMP errors kept for [`UdpSocket::drain_errors`](crate::UdpSocket::drain_errors) that the library read itself.
pub const RECENT_ERRORS: usize = 64;

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

/// What an ICMP (or local) error says, by the errno the kernel maps it to
/// (`icmp_err_convert`, `icmpv6_err_convert`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IcmpKind {
    /// Port unreachable (ECONNREFUSED): nothing listens at the destination port.
    PortUnreachable,
    /// Host unreachable (EHOSTUNREACH, EHOSTDOWN): also ICMPv6 "address unreachable".
    HostUnreachable,
    /// Network unreachable (ENETUNREACH, ENONET).
    NetUnreachable,
    /// Fragmentation needed / packet too big (EMSGSIZE): `info` holds the next-hop MTU.
    TooBig,
    /// Administratively prohibited (EACCES).
    Prohibited,
    /// Any other (protocol unreachable, source route failed, parameter problem, ...).
    Other,
}

impl IcmpKind {
    /// The kind an errno stands for.
    pub fn of_errno(errno: i32) -> IcmpKind {
        match errno {
            libc::ECONNREFUSED => IcmpKind::PortUnreachable,
            libc::EHOSTUNREACH | libc::EHOSTDOWN => IcmpKind::HostUnreachable,
            libc::ENETUNREACH | libc::ENONET => IcmpKind::NetUnreachable,
            libc::EMSGSIZE => IcmpKind::TooBig,
            libc::EACCES => IcmpKind::Prohibited,
            _ => IcmpKind::Other,
        }
    }
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
    /// The host that sent the ICMP message (`SO_EE_OFFENDER`), when the kernel says. Like
    /// every field here it may be forged.
    pub offender: Option<IpAddr>,
    quote: [u8; QUOTE_MAX],
    quote_len: u8,
}

impl IcmpError {
    pub(super) fn from_ext(e: &ExtErr, destination: Option<SocketAddr>, quoted: &[u8]) -> Self {
        let origin = match e.origin {
            1 => ErrorOrigin::Local,
            2 => ErrorOrigin::Icmp,
            3 => ErrorOrigin::Icmp6,
            o => ErrorOrigin::Other(o),
        };
        let n = quoted.len().min(QUOTE_MAX);
        let mut quote = [0u8; QUOTE_MAX];
        quote[..n].copy_from_slice(&quoted[..n]);
        IcmpError {
            destination,
            errno: e.errno as i32,
            origin,
            icmp_type: e.ty,
            icmp_code: e.code,
            info: e.info,
            offender: e.offender,
            quote,
            quote_len: n as u8,
        }
    }

    /// What it says: by ICMP type and code for a message from the network (the kernel maps
    /// "administratively prohibited" to EHOSTUNREACH or ENETUNREACH over IPv4), by errno for a
    /// local error.
    pub fn kind(&self) -> IcmpKind {
        match (self.origin, self.icmp_type, self.icmp_code) {
            // RFC 792 / RFC 1812 destination unreachable.
            (ErrorOrigin::Icmp, 3, 0 | 6 | 11) => IcmpKind::NetUnreachable,
            (ErrorOrigin::Icmp, 3, 1 | 7 | 8 | 12) => IcmpKind::HostUnreachable,
            (ErrorOrigin::Icmp, 3, 3) => IcmpKind::PortUnreachable,
            (ErrorOrigin::Icmp, 3, 4) => IcmpKind::TooBig,
            (ErrorOrigin::Icmp, 3, 9 | 10 | 13) => IcmpKind::Prohibited,
            (ErrorOrigin::Icmp, _, _) => IcmpKind::Other,
            // RFC 4443 destination unreachable (1) and packet too big (2).
            (ErrorOrigin::Icmp6, 1, 0) => IcmpKind::NetUnreachable,
            (ErrorOrigin::Icmp6, 1, 3) => IcmpKind::HostUnreachable,
            (ErrorOrigin::Icmp6, 1, 4) => IcmpKind::PortUnreachable,
            (ErrorOrigin::Icmp6, 1, 1 | 5 | 6) => IcmpKind::Prohibited,
            (ErrorOrigin::Icmp6, 2, _) => IcmpKind::TooBig,
            (ErrorOrigin::Icmp6, _, _) => IcmpKind::Other,
            _ => IcmpKind::of_errno(self.errno),
        }
    }

    /// Whether it came from the network (an ICMP or ICMPv6 message), not the local stack.
    pub fn is_remote(&self) -> bool {
        matches!(self.origin, ErrorOrigin::Icmp | ErrorOrigin::Icmp6)
    }

    /// The start of the payload of the datagram it is about, as the ICMP message quoted it
    /// (up to 64 bytes; empty when the sender quoted only the UDP header, as RFC 792 allows).
    /// It proves nothing by itself: whoever forged the ICMP message wrote it. A server that
    /// puts a secret in its datagrams can check it here.
    pub fn quoted(&self) -> &[u8] {
        &self.quote[..usize::from(self.quote_len)]
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

/// The ICMP senders seen most, by the space-saving algorithm (Metwally et al.): at most
/// [`OFFENDERS`] entries; a new address takes the place of the least counted one and inherits
/// its count, so an address's count is never under its true count and any address that sent
/// more than 1/[`OFFENDERS`] of all errors is in the list.
#[derive(Debug, Default)]
pub(crate) struct Offenders {
    top: Vec<(IpAddr, u64)>,
}

impl Offenders {
    pub(crate) fn count(&mut self, ip: IpAddr) {
        if let Some(e) = self.top.iter_mut().find(|e| e.0 == ip) {
            e.1 += 1;
        } else if self.top.len() < OFFENDERS {
            self.top.push((ip, 1));
        } else if let Some(min) = self.top.iter_mut().min_by_key(|e| e.1) {
            *min = (ip, min.1 + 1);
        }
    }

    pub(crate) fn sorted(&self) -> Vec<(IpAddr, u64)> {
        let mut v = self.top.clone();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// What a socket keeps of the ICMP errors it read, beside its counters.
#[derive(Debug, Default)]
pub(crate) struct IcmpLog {
    /// Errors the library read while retrying a call, for [`UdpSocket::drain_errors`](crate::UdpSocket::drain_errors).
    pub(super) recent: VecDeque<IcmpError>,
    pub(super) offenders: Offenders,
}

/// Where one send stands against pending ICMP errors: one per transmit position (or per
/// queued datagram, io_uring), reset by the caller when it moves on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IcmpRetry {
    pub(super) tries: u32,
    /// Retries with no ICMP error read since the failure before.
    pub(super) blind: u32,
}

/// Failures at one transmit with no ICMP error read meanwhile that are still sent again
/// before the error counts as the transmit's own (a deterministic error costs this many
/// extra calls).
pub(super) const BLIND_RETRIES: u32 = 2;

/// What to do with a send that failed with an ICMP kind of errno (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcmpStep {
    /// Send it again now.
    Retry,
    /// A flood: give the caller `WouldBlock`, keep the transmit.
    Yield,
    /// The transmit's own error: report it as that transmit's.
    Own,
}
