//! Forged packets for the attack tests: IPv4 datagrams with any source address, and ICMP
//! errors quoting any datagram, sent from a raw socket (`IPPROTO_RAW`, which implies
//! `IP_HDRINCL`: the header is ours, source address included; raw(7)).
//!
//! What anyone on the internet can do to a server, done here to servers the tests start, on
//! loopback or in the tests' own namespaces: a request whose source address names a victim
//! (a reflection), an ICMP "unreachable" or "fragmentation needed" about a datagram the server
//! never sent to anyone who complained. The builders are pure (checksums included) and
//! table-tested; [`RawSender`] needs root (CAP_NET_RAW).
//!
//! ```text
//!  udp_datagram:  ┌ IPv4 header (20) ┬ UDP header (8) ┬ payload ┐
//!  icmp_error:    ┌ IPv4 header (20) ┬ ICMP (8): type, code, checksum, unused / next-hop MTU
//!                 └ the quoted datagram: its IPv4 header (20) and the first bytes after it ┘
//! ```

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{sendto, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn};

/// ICMP type 3: destination unreachable.
pub const ICMP_DEST_UNREACH: u8 = 3;
/// Codes of type 3 (RFC 792, RFC 1122, RFC 1812).
pub mod unreach {
    /// Network unreachable.
    pub const NET: u8 = 0;
    /// Host unreachable.
    pub const HOST: u8 = 1;
    /// Protocol unreachable.
    pub const PROTOCOL: u8 = 2;
    /// Port unreachable.
    pub const PORT: u8 = 3;
    /// Fragmentation needed and DF set (the next-hop MTU in the second word).
    pub const FRAG_NEEDED: u8 = 4;
    /// Source route failed.
    pub const SOURCE_ROUTE: u8 = 5;
    /// Destination network unknown.
    pub const NET_UNKNOWN: u8 = 6;
    /// Destination host unknown.
    pub const HOST_UNKNOWN: u8 = 7;
    /// Communication with the network administratively prohibited.
    pub const NET_PROHIBITED: u8 = 9;
    /// Communication with the host administratively prohibited.
    pub const HOST_PROHIBITED: u8 = 10;
    /// Communication administratively prohibited (filtered).
    pub const ADMIN_PROHIBITED: u8 = 13;
    /// Every code of type 3 the kernel maps to a distinct errno (and a few that it maps alike).
    pub const ALL: [u8; 11] = [
        NET,
        HOST,
        PROTOCOL,
        PORT,
        FRAG_NEEDED,
        SOURCE_ROUTE,
        NET_UNKNOWN,
        HOST_UNKNOWN,
        NET_PROHIBITED,
        HOST_PROHIBITED,
        ADMIN_PROHIBITED,
    ];
}

/// The Internet checksum (RFC 1071) of `parts` laid end to end.
pub fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &b in *part {
            match odd.take() {
                Some(hi) => sum += u32::from(u16::from_be_bytes([hi, b])),
                None => odd = Some(b),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u32::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 header of 20 bytes (no options, DF set, TTL 64) for `payload_len` bytes of
/// protocol `proto`, with its checksum.
pub fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload_len: usize, id: u16) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + payload_len) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let c = checksum(&[&h]);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

/// A whole IPv4 UDP datagram from `src` to `dst` carrying `payload`, with both checksums: what
/// a host with address `src` would send, whoever sends it.
pub fn udp_datagram(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let mut udp = Vec::with_capacity(udp_len);
    udp.extend_from_slice(&src.port().to_be_bytes());
    udp.extend_from_slice(&dst.port().to_be_bytes());
    udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.ip().octets());
    pseudo[4..8].copy_from_slice(&dst.ip().octets());
    pseudo[9] = 17;
    pseudo[10..12].copy_from_slice(&(udp_len as u16).to_be_bytes());
    let c = match checksum(&[&pseudo, &udp]) {
        0 => 0xffff, // 0 means "no checksum" in UDP over IPv4
        c => c,
    };
    udp[6..8].copy_from_slice(&c.to_be_bytes());
    let mut out = ipv4_header(*src.ip(), *dst.ip(), 17, udp_len, 0x5544).to_vec();
    out.extend_from_slice(&udp);
    out
}

/// An ICMP error from `from` to `to` of `icmp_type`/`code` quoting `quoted` (an IPv4 datagram
/// as [`udp_datagram`] builds it) cut to its IP header and `quote_payload` bytes after it
/// (8: only the UDP header, as RFC 792 asks; more: as Linux and most routers quote). `mtu` is
/// the next-hop MTU of a "fragmentation needed" (code 4), else 0.
pub fn icmp_error(
    from: Ipv4Addr,
    to: Ipv4Addr,
    icmp_type: u8,
    code: u8,
    mtu: u16,
    quoted: &[u8],
    quote_payload: usize,
) -> Vec<u8> {
    let cut = quoted.len().min(20 + quote_payload);
    let mut icmp = vec![icmp_type, code, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(&quoted[..cut]);
    let c = checksum(&[&icmp]);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut out = ipv4_header(from, to, 1, icmp.len(), 0x4943).to_vec();
    out.extend_from_slice(&icmp);
    out
}

/// A raw IPv4 socket that sends packets whose header is the caller's (root only).
#[derive(Debug)]
pub struct RawSender {
    fd: OwnedFd,
}

impl RawSender {
    /// The socket, in the calling thread's network namespace.
    pub fn new() -> io::Result<RawSender> {
        let fd = socket(AddressFamily::Inet, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Raw)?;
        Ok(RawSender { fd })
    }

    /// Sends one whole IPv4 packet (from one of the builders) to the destination in its
    /// header.
    pub fn send(&self, packet: &[u8]) -> io::Result<()> {
        if packet.len() < 20 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an IPv4 packet has a 20-byte header"));
        }
        let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
        let to = SockaddrIn::from(SocketAddrV4::new(dst, 0));
        loop {
            match sendto(self.fd.as_raw_fd(), packet, &to, MsgFlags::empty()) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071's own example sum, and a header whose checksum verifies to 0.
    #[test]
    fn checksums() {
        // 0001 f203 f4f5 f6f7 sums to ddf2 (RFC 1071, 3.); the checksum is its complement.
        assert_eq!(checksum(&[&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]]), !0xddf2);
        assert_eq!(checksum(&[&[0x00, 0x01, 0xf2], &[0x03, 0xf4, 0xf5, 0xf6, 0xf7]]), !0xddf2, "split oddly");
        let h = ipv4_header(Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(198, 51, 100, 2), 17, 100, 7);
        assert_eq!(checksum(&[&h]), 0, "a header with its checksum sums to all ones");
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 120);
    }

    #[test]
    fn udp_and_icmp_layouts() {
        let src = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 4433);
        let dst = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 2), 53);
        let d = udp_datagram(src, dst, b"hello");
        assert_eq!(d.len(), 20 + 8 + 5);
        assert_eq!(&d[20..22], &4433u16.to_be_bytes());
        assert_eq!(&d[22..24], &53u16.to_be_bytes());
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&src.ip().octets());
        pseudo[4..8].copy_from_slice(&dst.ip().octets());
        pseudo[9] = 17;
        pseudo[10..12].copy_from_slice(&13u16.to_be_bytes());
        assert_eq!(checksum(&[&pseudo, &d[20..]]), 0, "the UDP checksum verifies");

        let e = icmp_error(*dst.ip(), *src.ip(), ICMP_DEST_UNREACH, unreach::FRAG_NEEDED, 1280, &d, 8);
        assert_eq!(e.len(), 20 + 8 + 20 + 8, "IP + ICMP + quoted IP header + 8 bytes");
        assert_eq!((e[20], e[21]), (3, 4));
        assert_eq!(&e[26..28], &1280u16.to_be_bytes());
        assert_eq!(checksum(&[&e[20..]]), 0, "the ICMP checksum verifies");
        assert_eq!(&e[28..48], &d[..20], "the quote starts with the datagram's header");
        let long = icmp_error(*dst.ip(), *src.ip(), 3, 3, 0, &d, 64);
        assert_eq!(long.len(), 20 + 8 + d.len(), "a quote never runs past the datagram");
    }
}
