//! Control messages (`cmsg(3)`): one encoder, one decoder.
//!
//! A control buffer holds a sequence of headers, each followed by its data and padded to the
//! platform's alignment (8 bytes on 64-bit Linux):
//!
//! ```text
//!  msg_control ─► ┌──────────────┬───────────┬──────────┬──────┬──────────────┬─ ─ ─
//!                 │ cmsg_len (8) │ level (4) │ type (4) │ data │ pad to 8     │ next…
//!                 └──────────────┴───────────┴──────────┴──────┴──────────────┴─ ─ ─
//!                 ◄──────────── CMSG_LEN(data) ─────────────────►
//!                 ◄──────────── CMSG_SPACE(data) ────────────────────────────►
//! ```
//!
//! The [`Encoder`] writes into a caller's [`CmsgBuf`] and, when dropped, sets `msg_controllen`
//! to exactly the bytes written (and `msg_control` to null when there are none), so a message
//! can never carry stale control data. The decoder walks what the kernel wrote with
//! `CMSG_FIRSTHDR`/`CMSG_NXTHDR` and reads every value with an unaligned read of at most the
//! bytes the header says are there: malformed input yields [`Cmsg::Unknown`], never a panic.

use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{SOL_UDP, SO_RXQ_OVFL, SO_TXTIME, UDP_GRO, UDP_SEGMENT};

/// Most descriptors one [`Cmsg::Rights`] carries.
pub const MAX_RIGHTS: usize = 8;

/// Bytes of control space per message: enough for every cmsg udpx sends or asks to receive
/// (segment size, pktinfo v4 and v6, TOS and TCLASS, txtime, drop counter, receive time) with
/// room to spare.
pub const CMSG_CAP: usize = 256;

/// An 8-byte-aligned control buffer, as `cmsghdr` requires.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct CmsgBuf(pub [u8; CMSG_CAP]);

impl Default for CmsgBuf {
    fn default() -> Self {
        CmsgBuf([0; CMSG_CAP])
    }
}

impl std::fmt::Debug for CmsgBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmsgBuf")
    }
}

/// The control messages udpx speaks, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cmsg {
    /// `SOL_UDP/UDP_SEGMENT` (send): the GSO segment size.
    Segment(u16),
    /// `SOL_UDP/UDP_GRO` (receive): the size of each coalesced segment.
    Gro(u16),
    /// `IPPROTO_IP/IP_TOS`: the TOS byte (ECN in the low two bits). The kernel delivers one
    /// byte on receive and takes an `int` on send.
    Tos(u8),
    /// `IPPROTO_IPV6/IPV6_TCLASS`: the traffic class (ECN in the low two bits).
    TClass(u8),
    /// `IPPROTO_IP/IP_PKTINFO`: interface index and local (destination) address.
    PktInfoV4 {
        /// Interface index (0: any).
        ifindex: u32,
        /// The local address: the destination on receive, the source on send.
        addr: Ipv4Addr,
    },
    /// `IPPROTO_IPV6/IPV6_PKTINFO`.
    PktInfoV6 {
        /// Interface index (0: any).
        ifindex: u32,
        /// The local address: the destination on receive, the source on send.
        addr: Ipv6Addr,
    },
    /// `SOL_SOCKET/SCM_TXTIME`: departure time in ns of the socket's clock.
    TxTime(u64),
    /// `SOL_SOCKET/SO_RXQ_OVFL`: datagrams the kernel dropped on this socket so far.
    RxqOvfl(u32),
    /// `SOL_SOCKET/SCM_TIMESTAMPNS` (receive, with `SO_TIMESTAMPNS`): when the kernel received
    /// the datagram, `CLOCK_REALTIME` as time since the Unix epoch. A negative time or one with
    /// 10^9 nanoseconds or more decodes as [`Cmsg::Unknown`].
    RxTime(std::time::Duration),
    /// `IP_RECVERR` / `IPV6_RECVERR` from the error queue: a `sock_extended_err` (ICMP errors,
    /// and zerocopy completions with origin [`SO_EE_ORIGIN_ZEROCOPY`]).
    ExtErr(ExtErr),
    /// `SOL_SOCKET/SCM_RIGHTS` over a Unix socket: descriptors passed between processes (the
    /// first `count` of `fds`; on receive they are new descriptors of this process, owned by
    /// whoever decoded them).
    Rights {
        /// The descriptors.
        fds: [i32; MAX_RIGHTS],
        /// How many of them are set.
        count: u8,
    },
    /// Anything else, or a known type whose length is wrong.
    Unknown {
        /// `cmsg_level`.
        level: i32,
        /// `cmsg_type`.
        ty: i32,
        /// Bytes of data.
        len: usize,
    },
}

impl Cmsg {
    /// Bytes of control space this message takes when encoded (`CMSG_SPACE`).
    #[cfg(any(test, feature = "internals"))]
    pub fn space(&self) -> usize {
        let data = match self {
            Cmsg::Segment(_) => mem::size_of::<u16>(),
            Cmsg::Gro(_) | Cmsg::Tos(_) | Cmsg::TClass(_) => mem::size_of::<libc::c_int>(),
            Cmsg::PktInfoV4 { .. } => mem::size_of::<libc::in_pktinfo>(),
            Cmsg::PktInfoV6 { .. } => mem::size_of::<libc::in6_pktinfo>(),
            Cmsg::TxTime(_) => mem::size_of::<u64>(),
            Cmsg::RxqOvfl(_) => mem::size_of::<u32>(),
            Cmsg::RxTime(_) => mem::size_of::<libc::timespec>(),
            Cmsg::ExtErr(e) => e.encoded_len(),
            Cmsg::Rights { count, .. } => usize::from(*count) * mem::size_of::<i32>(),
            Cmsg::Unknown { len, .. } => *len,
        };
        // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
        unsafe { libc::CMSG_SPACE(data as u32) as usize }
    }
}

/// `SO_EE_ORIGIN_ZEROCOPY` (`include/uapi/linux/errqueue.h`).
pub const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data after all.
pub const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// `struct sock_extended_err` (`include/uapi/linux/errqueue.h`), 16 bytes:
///
/// ```text
///  ee_errno u32 │ ee_origin u8 │ ee_type u8 │ ee_code u8 │ ee_pad u8 │ ee_info u32 │ ee_data u32
/// ```
///
/// For a zerocopy completion `ee_errno` is 0, `ee_origin` [`SO_EE_ORIGIN_ZEROCOPY`], and the
/// completed send ids are the inclusive range `ee_info..=ee_data` (32-bit, wrapping). For an
/// ICMP error the kernel appends the address of the host that sent it (`SO_EE_OFFENDER`: a
/// `sockaddr_in` or `sockaddr_in6` right after the 16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtErr {
    /// The error (0 for a zerocopy completion).
    pub errno: u32,
    /// Where it comes from (ICMP = 2, ICMP6 = 3, zerocopy = 5, ...).
    pub origin: u8,
    /// ICMP type.
    pub ty: u8,
    /// ICMP code, or zerocopy flags.
    pub code: u8,
    /// First id (zerocopy) or extra info.
    pub info: u32,
    /// Last id (zerocopy) or extra data.
    pub data: u32,
    /// Who sent the ICMP error (`SO_EE_OFFENDER`), when the kernel says.
    pub offender: Option<IpAddr>,
}

impl ExtErr {
    const LEN: usize = 16;
    /// `sizeof(struct sockaddr_in)`, `sizeof(struct sockaddr_in6)`.
    const SIN_LEN: usize = 16;
    const SIN6_LEN: usize = 28;

    /// Bytes of cmsg data this error takes: 16, and the offender's sockaddr when it has one.
    #[cfg(any(test, feature = "internals"))]
    fn encoded_len(&self) -> usize {
        Self::LEN
            + match self.offender {
                None => 0,
                Some(IpAddr::V4(_)) => Self::SIN_LEN,
                Some(IpAddr::V6(_)) => Self::SIN6_LEN,
            }
    }

    fn to_bytes(self) -> ([u8; Self::LEN + Self::SIN6_LEN], usize) {
        let mut b = [0u8; Self::LEN + Self::SIN6_LEN];
        b[0..4].copy_from_slice(&self.errno.to_ne_bytes());
        b[4] = self.origin;
        b[5] = self.ty;
        b[6] = self.code;
        b[8..12].copy_from_slice(&self.info.to_ne_bytes());
        b[12..16].copy_from_slice(&self.data.to_ne_bytes());
        let len = match self.offender {
            None => Self::LEN,
            Some(IpAddr::V4(a)) => {
                b[16..18].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
                b[20..24].copy_from_slice(&a.octets());
                Self::LEN + Self::SIN_LEN
            }
            Some(IpAddr::V6(a)) => {
                b[16..18].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
                b[24..40].copy_from_slice(&a.octets());
                Self::LEN + Self::SIN6_LEN
            }
        };
        (b, len)
    }

    fn from_bytes(d: &[u8]) -> Option<Self> {
        let u = |i: usize| d.get(i..i + 4).and_then(|x| x.try_into().ok()).map(u32::from_ne_bytes);
        let family = d.get(16..18).map(|f| u16::from_ne_bytes([f[0], f[1]]));
        let offender = match family.map(i32::from) {
            Some(libc::AF_INET) if d.len() >= Self::LEN + Self::SIN_LEN => arr::<4>(&d[20..]).map(IpAddr::from),
            Some(libc::AF_INET6) if d.len() >= Self::LEN + Self::SIN6_LEN => arr::<16>(&d[24..]).map(IpAddr::from),
            _ => None,
        };
        Some(ExtErr {
            errno: u(0)?,
            origin: *d.get(4)?,
            ty: *d.get(5)?,
            code: *d.get(6)?,
            info: u(8)?,
            data: u(12)?,
            offender,
        })
    }
}

/// Writes control messages into a [`CmsgBuf`] attached to a `msghdr`.
pub struct Encoder<'a> {
    hdr: &'a mut libc::msghdr,
    cmsg: *mut libc::cmsghdr,
    len: usize,
}

impl std::fmt::Debug for Encoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("len", &self.len).finish()
    }
}

impl<'a> Encoder<'a> {
    /// Attaches `buf` to `hdr` and starts encoding at its beginning.
    ///
    /// The buffer is borrowed for as long as the encoder lives; the caller must keep it alive
    /// (and unmoved) until the message has been passed to the kernel, which every caller in
    /// this crate does by owning both in one frame or one struct.
    pub fn new(hdr: &'a mut libc::msghdr, buf: &'a mut CmsgBuf) -> Self {
        hdr.msg_control = buf.0.as_mut_ptr().cast();
        hdr.msg_controllen = CMSG_CAP as _;
        // SAFETY: msg_control points at CMSG_CAP valid, 8-byte-aligned bytes (CmsgBuf's repr),
        // and msg_controllen says so; CMSG_FIRSTHDR only reads those two fields.
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(hdr) };
        Encoder { hdr, cmsg, len: 0 }
    }

    /// Appends one control message.
    ///
    /// # Panics
    /// If the buffer is full. [`CMSG_CAP`] is sized for every combination udpx sends, so this
    /// is a bug in udpx, not a condition the network can cause.
    pub fn push(&mut self, msg: &Cmsg) {
        match *msg {
            Cmsg::Segment(v) => self.push_raw(SOL_UDP, UDP_SEGMENT, v),
            Cmsg::Gro(v) => self.push_raw(SOL_UDP, UDP_GRO, v as libc::c_int),
            Cmsg::Tos(v) => self.push_raw(libc::IPPROTO_IP, libc::IP_TOS, v as libc::c_int),
            Cmsg::TClass(v) => self.push_raw(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, v as libc::c_int),
            Cmsg::PktInfoV4 { ifindex, addr } => {
                let info = libc::in_pktinfo {
                    ipi_ifindex: ifindex as libc::c_int,
                    // ipi_spec_dst sets the source address of the outgoing datagram.
                    ipi_spec_dst: libc::in_addr { s_addr: u32::from_ne_bytes(addr.octets()) },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                self.push_raw(libc::IPPROTO_IP, libc::IP_PKTINFO, info)
            }
            Cmsg::PktInfoV6 { ifindex, addr } => {
                let info =
                    libc::in6_pktinfo { ipi6_addr: libc::in6_addr { s6_addr: addr.octets() }, ipi6_ifindex: ifindex };
                self.push_raw(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info)
            }
            Cmsg::TxTime(t) => self.push_raw(libc::SOL_SOCKET, SO_TXTIME, t),
            Cmsg::RxqOvfl(v) => self.push_raw(libc::SOL_SOCKET, SO_RXQ_OVFL, v),
            // Only the kernel sends this one; encoded for tests.
            Cmsg::RxTime(t) => {
                let ts = libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos().into() };
                self.push_raw(libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS, ts)
            }
            // Only the kernel sends these; encoded for tests (IPv4 level).
            Cmsg::ExtErr(e) => {
                let (b, len) = e.to_bytes();
                self.push_bytes(libc::IPPROTO_IP, libc::IP_RECVERR, &b[..len])
            }
            Cmsg::Rights { fds, count } => {
                let n = usize::from(count).min(MAX_RIGHTS);
                let mut b = [0u8; MAX_RIGHTS * 4];
                for (chunk, fd) in b.chunks_exact_mut(4).zip(&fds[..n]) {
                    chunk.copy_from_slice(&fd.to_ne_bytes());
                }
                self.push_bytes(libc::SOL_SOCKET, libc::SCM_RIGHTS, &b[..n * 4])
            }
            Cmsg::Unknown { level, ty, len } => {
                // Only used by tests: data of `len` zero bytes.
                let zeros = [0u8; 64];
                assert!(len <= zeros.len(), "test cmsg too long");
                self.push_bytes(level, ty, &zeros[..len])
            }
        }
    }

    fn push_raw<T: Copy>(&mut self, level: libc::c_int, ty: libc::c_int, value: T) {
        // SAFETY: T is one of the plain-old-data types above (integers, in_pktinfo,
        // in6_pktinfo, timespec); viewing its bytes is sound (no padding in any of them).
        let bytes = unsafe { std::slice::from_raw_parts((&value as *const T).cast::<u8>(), mem::size_of::<T>()) };
        self.push_bytes(level, ty, bytes)
    }

    fn push_bytes(&mut self, level: libc::c_int, ty: libc::c_int, data: &[u8]) {
        // SAFETY: CMSG_SPACE is pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(data.len() as u32) };
        // SAFETY: CMSG_LEN is pure arithmetic.
        let clen = unsafe { libc::CMSG_LEN(data.len() as u32) };
        assert!(
            !self.cmsg.is_null() && self.len + space as usize <= CMSG_CAP,
            "udpx bug: control buffer of {CMSG_CAP} bytes too small"
        );
        // SAFETY: self.cmsg points into the attached CmsgBuf at offset self.len, and the
        // assertion above guarantees CMSG_SPACE(data) bytes from there are inside it; the
        // header is 8-byte aligned (CMSG_FIRSTHDR/CMSG_NXTHDR align it), so a unique
        // reference to it is valid for this block.
        let hdr = unsafe { &mut *self.cmsg };
        hdr.cmsg_level = level;
        hdr.cmsg_type = ty;
        hdr.cmsg_len = clen as _;
        // SAFETY: CMSG_DATA is pointer arithmetic to just past the header, inside the buffer.
        let dst = unsafe { libc::CMSG_DATA(self.cmsg) };
        // SAFETY: dst..dst+data.len() is inside the buffer (assertion above); the byte-wise
        // copy needs no alignment; the source is a separate Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        self.len += space as usize;
        // SAFETY: hdr still describes the whole buffer (msg_controllen = CMSG_CAP) and the
        // current header's cmsg_len was just set, which is all CMSG_NXTHDR reads; it returns
        // null when no further header fits.
        self.cmsg = unsafe { libc::CMSG_NXTHDR(self.hdr, self.cmsg) };
    }
}

impl Drop for Encoder<'_> {
    fn drop(&mut self) {
        // Finalize: the kernel must see exactly what was written.
        self.hdr.msg_controllen = self.len as _;
        if self.len == 0 {
            self.hdr.msg_control = std::ptr::null_mut();
        }
    }
}

/// Decodes every control message of a `msghdr` the kernel filled.
///
/// `hdr.msg_control` must be null or point at `msg_controllen` readable, 8-byte-aligned bytes,
/// as it does after `recvmsg`/`recvmmsg` into a [`CmsgBuf`].
/// `msg_controllen` as usize (it is `size_t` on glibc, `socklen_t` on musl).
#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
fn controllen(hdr: &libc::msghdr) -> usize {
    hdr.msg_controllen as usize
}

pub(crate) fn decode(hdr: &libc::msghdr, mut f: impl FnMut(Cmsg)) {
    if hdr.msg_control.is_null() || controllen(hdr) < mem::size_of::<libc::cmsghdr>() {
        return;
    }
    // SAFETY: the function's contract: msg_control/msg_controllen describe readable aligned
    // memory. CMSG_FIRSTHDR/NXTHDR return null rather than step outside it.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    let end = hdr.msg_control as usize + controllen(hdr);
    while !cmsg.is_null() {
        // SAFETY: non-null headers returned by CMSG_FIRSTHDR/NXTHDR lie inside the buffer.
        let c = unsafe { &*cmsg };
        // SAFETY: CMSG_LEN is arithmetic.
        let hdr_len = unsafe { libc::CMSG_LEN(0) } as usize;
        // SAFETY: CMSG_DATA is pointer arithmetic to just past a header inside the buffer.
        let data = unsafe { libc::CMSG_DATA(cmsg) };
        let claimed = (c.cmsg_len as usize).saturating_sub(hdr_len);
        // Never read past the buffer, whatever cmsg_len claims.
        let avail = end.saturating_sub(data as usize);
        if claimed > avail {
            // A header that claims more than the buffer holds (truncated control data).
            f(Cmsg::Unknown { level: c.cmsg_level, ty: c.cmsg_type, len: avail });
            return;
        }
        // SAFETY: `claimed` bytes from `data` are inside the control buffer (checked above).
        let bytes = unsafe { std::slice::from_raw_parts(data, claimed) };
        f(classify(c.cmsg_level, c.cmsg_type, bytes));
        // SAFETY: as for CMSG_FIRSTHDR; NXTHDR checks the next header fits and returns null
        // otherwise (including for a cmsg_len too small to advance).
        cmsg = unsafe { libc::CMSG_NXTHDR(hdr, cmsg) };
    }
}

/// Decodes a raw control buffer (as tests and fuzzers produce them).
#[cfg(any(test, feature = "internals"))]
pub fn decode_bytes(control: &[u8]) -> Vec<Cmsg> {
    let mut buf = CmsgBuf::default();
    let n = control.len().min(CMSG_CAP);
    buf.0[..n].copy_from_slice(&control[..n]);
    // SAFETY: an all-zero msghdr is a valid empty message header.
    let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
    hdr.msg_control = buf.0.as_mut_ptr().cast();
    hdr.msg_controllen = n as _;
    let mut out = Vec::new();
    decode(&hdr, |c| out.push(c));
    out
}

/// Encodes messages into a fresh buffer and returns the bytes the kernel would see.
#[cfg(any(test, feature = "internals"))]
pub fn encode_bytes(msgs: &[Cmsg]) -> Vec<u8> {
    let mut buf = CmsgBuf::default();
    // SAFETY: an all-zero msghdr is a valid empty message header.
    let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
    {
        let mut enc = Encoder::new(&mut hdr, &mut buf);
        for m in msgs {
            enc.push(m);
        }
    }
    let len = hdr.msg_controllen as usize;
    buf.0[..len].to_vec()
}

/// The first `N` bytes of `d`, if it has them.
fn arr<const N: usize>(d: &[u8]) -> Option<[u8; N]> {
    d.get(..N)?.try_into().ok()
}

fn classify(level: i32, ty: i32, d: &[u8]) -> Cmsg {
    let unknown = Cmsg::Unknown { level, ty, len: d.len() };
    let int = || arr::<4>(d).map(i32::from_ne_bytes);
    match (level, ty) {
        (libc::SOL_SOCKET, libc::SCM_RIGHTS) if d.len() % 4 == 0 && d.len() / 4 <= MAX_RIGHTS => {
            let mut fds = [-1i32; MAX_RIGHTS];
            for (fd, chunk) in fds.iter_mut().zip(d.chunks_exact(4)) {
                *fd = i32::from_ne_bytes(arr::<4>(chunk).unwrap_or([0xff; 4]));
            }
            Cmsg::Rights { fds, count: (d.len() / 4) as u8 }
        }
        (SOL_UDP, UDP_SEGMENT) if d.len() == 2 => Cmsg::Segment(u16::from_ne_bytes([d[0], d[1]])),
        // The kernel writes UDP_GRO as an int; accept a u16 too.
        (SOL_UDP, UDP_GRO) => match d.len() {
            2 => Cmsg::Gro(u16::from_ne_bytes([d[0], d[1]])),
            4 => int().and_then(|v| u16::try_from(v).ok()).map_or(unknown, Cmsg::Gro),
            _ => unknown,
        },
        (libc::IPPROTO_IP, libc::IP_TOS) => match d.len() {
            1 => Cmsg::Tos(d[0]),
            4 => Cmsg::Tos(int().unwrap_or(0) as u8),
            _ => unknown,
        },
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if d.len() == 4 => Cmsg::TClass(int().unwrap_or(0) as u8),
        (libc::IPPROTO_IP, libc::IP_PKTINFO) if d.len() == mem::size_of::<libc::in_pktinfo>() => {
            // in_pktinfo: ifindex (4), spec_dst (4), addr (4). On receive `ipi_addr` is the
            // header's destination address; on send `ipi_spec_dst` is the source. The decoder
            // reports the destination (receive direction) unless it is unset.
            let ifindex = i32::from_ne_bytes(arr::<4>(d).unwrap_or_default()) as u32;
            let spec = Ipv4Addr::from(arr::<4>(&d[4..]).unwrap_or_default());
            let dst = Ipv4Addr::from(arr::<4>(&d[8..]).unwrap_or_default());
            let addr = if dst.is_unspecified() { spec } else { dst };
            Cmsg::PktInfoV4 { ifindex, addr }
        }
        (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if d.len() == mem::size_of::<libc::in6_pktinfo>() => {
            let addr = Ipv6Addr::from(arr::<16>(d).unwrap_or_default());
            let ifindex = u32::from_ne_bytes(arr::<4>(&d[16..]).unwrap_or_default());
            Cmsg::PktInfoV6 { ifindex, addr }
        }
        (libc::SOL_SOCKET, SO_TXTIME) if d.len() == 8 => {
            Cmsg::TxTime(u64::from_ne_bytes(arr::<8>(d).unwrap_or_default()))
        }
        (libc::IPPROTO_IP, libc::IP_RECVERR) | (libc::IPPROTO_IPV6, libc::IPV6_RECVERR) if d.len() >= ExtErr::LEN => {
            // The extended error may be followed by the offender's address.
            ExtErr::from_bytes(d).map_or(unknown, Cmsg::ExtErr)
        }
        (libc::SOL_SOCKET, SO_RXQ_OVFL) if d.len() == 4 => {
            Cmsg::RxqOvfl(u32::from_ne_bytes(arr::<4>(d).unwrap_or_default()))
        }
        // struct timespec on 64-bit Linux: tv_sec (i64), tv_nsec (i64).
        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) if d.len() == 16 => {
            let secs = i64::from_ne_bytes(arr::<8>(d).unwrap_or_default());
            let nanos = i64::from_ne_bytes(arr::<8>(&d[8..]).unwrap_or_default());
            match (u64::try_from(secs), u32::try_from(nanos)) {
                (Ok(s), Ok(n)) if n < 1_000_000_000 => Cmsg::RxTime(std::time::Duration::new(s, n)),
                _ => unknown,
            }
        }
        _ => unknown,
    }
}

/// What the kernel reported about one received message.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawRecv {
    pub len: usize,
    pub flags: i32,
    pub addr: Option<SocketAddr>,
    pub gro: Option<u16>,
    pub dst_ip: Option<IpAddr>,
    pub ifindex: u32,
    pub tos: Option<u8>,
    pub drops: Option<u32>,
    pub rx_time: Option<std::time::Duration>,
}

/// Decodes the control messages of a received message into `r` (GRO size, TOS/TCLASS,
/// pktinfo, the drop counter, the receive time). `hdr` as for [`decode`].
pub(crate) fn decode_control(hdr: &libc::msghdr, r: &mut RawRecv) {
    decode(hdr, |c| match c {
        Cmsg::Gro(s) => r.gro = Some(s),
        Cmsg::Tos(t) | Cmsg::TClass(t) => r.tos = Some(t),
        Cmsg::PktInfoV4 { ifindex, addr } => {
            r.dst_ip = Some(IpAddr::V4(addr));
            r.ifindex = ifindex;
        }
        Cmsg::PktInfoV6 { ifindex, addr } => {
            r.dst_ip = Some(match addr.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(addr),
            });
            r.ifindex = ifindex;
        }
        Cmsg::RxqOvfl(d) => r.drops = Some(d),
        Cmsg::RxTime(t) => r.rx_time = Some(t),
        _ => {}
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_cmsg() -> impl Strategy<Value = Cmsg> {
        prop_oneof![
            (1u16..).prop_map(Cmsg::Segment),
            any::<u16>().prop_map(Cmsg::Gro),
            any::<u8>().prop_map(Cmsg::Tos),
            any::<u8>().prop_map(Cmsg::TClass),
            (any::<u32>(), any::<[u8; 4]>().prop_filter("set", |a| *a != [0; 4]))
                .prop_map(|(i, a)| Cmsg::PktInfoV4 { ifindex: i & 0x7fff_ffff, addr: Ipv4Addr::from(a) }),
            (any::<u32>(), any::<[u8; 16]>())
                .prop_map(|(i, a)| Cmsg::PktInfoV6 { ifindex: i, addr: Ipv6Addr::from(a) }),
            any::<u64>().prop_map(Cmsg::TxTime),
            any::<u32>().prop_map(Cmsg::RxqOvfl),
            (0u64..i64::MAX as u64, 0u32..1_000_000_000)
                .prop_map(|(s, n)| Cmsg::RxTime(std::time::Duration::new(s, n))),
            (
                any::<u32>(),
                any::<u8>(),
                any::<u8>(),
                any::<u8>(),
                any::<u32>(),
                any::<u32>(),
                0u8..3,
                any::<[u8; 16]>()
            )
                .prop_map(|(errno, origin, ty, code, info, data, fam, a)| {
                    let offender = match fam {
                        0 => None,
                        1 => Some(IpAddr::from([a[0], a[1], a[2], a[3]])),
                        _ => Some(IpAddr::from(a)),
                    };
                    Cmsg::ExtErr(ExtErr { errno, origin, ty, code, info, data, offender })
                }),
            (0usize..40).prop_map(|len| Cmsg::Unknown { level: 9999, ty: 7, len }),
        ]
    }

    proptest! {
        /// Whatever fits in the buffer comes back exactly as encoded, in order.
        #[test]
        fn encode_decode_round_trip(msgs in proptest::collection::vec(any_cmsg(), 0..8)) {
            let mut fit = Vec::new();
            let mut used = 0;
            for m in msgs {
                if used + m.space() <= CMSG_CAP { used += m.space(); fit.push(m); }
            }
            let bytes = encode_bytes(&fit);
            prop_assert_eq!(bytes.len(), used);
            prop_assert_eq!(decode_bytes(&bytes), fit);
        }

        /// Arbitrary bytes never panic the decoder, and it never reports more data than given.
        #[test]
        fn decoder_survives_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..CMSG_CAP)) {
            for c in decode_bytes(&bytes) {
                if let Cmsg::Unknown { len, .. } = c { prop_assert!(len <= bytes.len()); }
            }
        }
    }

    #[test]
    fn empty_encoder_clears_control() {
        assert!(encode_bytes(&[]).is_empty());
        assert!(decode_bytes(&[]).is_empty());
    }

    #[test]
    fn kernel_shapes() {
        // The kernel writes IP_TOS as one byte and UDP_GRO as an int.
        let mut raw = encode_bytes(&[Cmsg::Gro(1200)]);
        assert_eq!(decode_bytes(&raw), vec![Cmsg::Gro(1200)]);
        // Negative or oversized GRO sizes are not trusted.
        raw[16..20].copy_from_slice(&(-5i32).to_ne_bytes());
        assert!(matches!(decode_bytes(&raw)[0], Cmsg::Unknown { .. }));
        let mut tos = encode_bytes(&[Cmsg::Tos(0)]);
        tos[0..8].copy_from_slice(&(17u64).to_ne_bytes()); // cmsg_len = CMSG_LEN(1)
        tos[16] = 0x03;
        assert_eq!(decode_bytes(&tos), vec![Cmsg::Tos(3)]);
    }

    #[test]
    fn a_receive_time_out_of_range_is_not_trusted() {
        let t = std::time::Duration::new(1_764_460_800, 123_456_789);
        let mut raw = encode_bytes(&[Cmsg::RxTime(t)]);
        assert_eq!(decode_bytes(&raw), vec![Cmsg::RxTime(t)]);
        // 10^9 nanoseconds, then a negative second: neither is a time.
        raw[24..32].copy_from_slice(&1_000_000_000i64.to_ne_bytes());
        assert!(matches!(decode_bytes(&raw)[0], Cmsg::Unknown { len: 16, .. }));
        raw[24..32].copy_from_slice(&0i64.to_ne_bytes());
        raw[16..24].copy_from_slice(&(-1i64).to_ne_bytes());
        assert!(matches!(decode_bytes(&raw)[0], Cmsg::Unknown { len: 16, .. }));
    }

    #[test]
    fn lying_length_is_bounded() {
        let mut raw = encode_bytes(&[Cmsg::TxTime(5)]);
        raw[0..8].copy_from_slice(&(4096u64).to_ne_bytes());
        let got = decode_bytes(&raw);
        assert_eq!(got.len(), 1);
        assert!(matches!(got[0], Cmsg::Unknown { len, .. } if len <= raw.len()));
    }
}
