//! `sockaddr_storage` <-> `std::net::SocketAddr`.
//!
//! A dual-stack (AF_INET6) socket sees IPv4 peers as v4-mapped IPv6 addresses
//! (`::ffff:a.b.c.d`); [`SockAddr::to_std`] turns those back into plain IPv4 so callers see one
//! spelling of an address, and [`SockAddr::for_socket`] maps IPv4 destinations for v6 sockets.

use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// An owned, initialized socket address as the kernel takes it.
#[derive(Clone, Copy)]
pub(crate) struct SockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl SockAddr {
    pub(crate) fn empty() -> Self {
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (AF_UNSPEC) value.
        let storage = unsafe { mem::zeroed::<libc::sockaddr_storage>() };
        SockAddr { storage, len: mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t }
    }

    /// The address as given, in its own family.
    pub(crate) fn from_std(addr: &SocketAddr) -> Self {
        let mut out = Self::empty();
        out.len = write(addr, &mut out.storage);
        out
    }

    /// The address in the family of a socket: IPv4 destinations become v4-mapped for AF_INET6.
    pub(crate) fn for_socket(addr: &SocketAddr, v6_socket: bool) -> Self {
        Self::from_std(&map_for_socket(addr, v6_socket))
    }

    pub(crate) fn as_ptr(&self) -> *const libc::sockaddr {
        (&self.storage as *const libc::sockaddr_storage).cast()
    }

    /// The room for an address: what to offer the kernel as `msg_namelen`.
    pub(crate) fn capacity(&self) -> libc::socklen_t {
        mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t
    }

    pub(crate) fn len(&self) -> libc::socklen_t {
        self.len
    }

    pub(crate) fn as_mut_parts(&mut self) -> (*mut libc::sockaddr, *mut libc::socklen_t) {
        ((&mut self.storage as *mut libc::sockaddr_storage).cast(), &mut self.len)
    }

    /// The address the kernel wrote, given the length it reported.
    pub(crate) fn with_len(&self, len: libc::socklen_t) -> Option<SocketAddr> {
        read(&self.storage, len.min(self.len))
    }

    pub(crate) fn to_std(self) -> Option<SocketAddr> {
        read(&self.storage, self.len)
    }
}

/// Whether `addr` is an IPv4 destination, written plain or v4-mapped.
pub(crate) fn is_v4(addr: &SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    }
}

/// `::ffff:a.b.c.d` as `a.b.c.d`; every other address as it is.
pub(crate) fn unmapped(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    }
}

/// Maps an IPv4 address to `::ffff:a.b.c.d` for an AF_INET6 socket; leaves others alone.
pub(crate) fn map_for_socket(addr: &SocketAddr, v6_socket: bool) -> SocketAddr {
    match addr {
        SocketAddr::V4(v4) if v6_socket => SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0)),
        other => *other,
    }
}

/// Writes `addr` into `storage`, returning the length used.
pub(crate) fn write(addr: &SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned at least as strictly as
            // sockaddr_in (both are kernel ABI types designed for this cast).
            unsafe { (storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>().write(sin) };
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { (storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>().write(sin6) };
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads a socket address the kernel wrote; `None` for families other than IPv4/IPv6 or a
/// length too short for the family. v4-mapped IPv6 addresses come back as IPv4.
pub(crate) fn read(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match storage.ss_family as libc::c_int {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says sockaddr_in and the length covers one; storage is
            // suitably aligned for it.
            let sin = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id)),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_v4_v6_and_mapped() {
        let cases: [SocketAddr; 3] =
            ["192.0.2.7:4433".parse().unwrap(), "[2001:db8::9]:53".parse().unwrap(), "[fe80::1%3]:1".parse().unwrap()];
        for a in cases {
            assert_eq!(SockAddr::from_std(&a).to_std(), Some(a));
            // A v6 socket sees v4 as mapped; reading back gives plain v4 again.
            assert_eq!(SockAddr::for_socket(&a, true).to_std(), Some(a));
        }
    }

    #[test]
    fn short_length_is_rejected() {
        let a: SocketAddr = "[2001:db8::1]:9".parse().unwrap();
        let mut s = SockAddr::from_std(&a);
        s.len = 8;
        assert_eq!(s.to_std(), None);
    }
}
