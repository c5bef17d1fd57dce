//! rtnetlink (`NETLINK_ROUTE`, see netlink(7) and rtnetlink(7)): the socket, the requests
//! udpx makes, and a parser for the kernel's answers.
//!
//! Only three questions are ever asked: which device a destination leaves by (RTM_GETROUTE),
//! that device's name (RTM_GETLINK), and its qdiscs (an RTM_GETQDISC dump). The wire format
//! is built and read byte by byte here, as pure functions over slices: no struct is cast onto
//! kernel memory, so the parser cannot read out of bounds whatever the bytes say, and it is
//! tested with tables of hand-made buffers.
//!
//! A message, and the attributes inside its payload (both aligned to 4 bytes):
//!
//! ```text
//!  nlmsghdr (16)                                         family header      attributes
//! ┌──────────┬──────────┬───────────┬─────────┬──────────┬─────────────────┬──────────────────┐
//! │ len u32  │ type u16 │ flags u16 │ seq u32 │ pid u32  │ rtmsg (12) /    │ rtattr: len u16, │
//! │ (all of  │          │           │         │          │ ifinfomsg (16) /│ type u16, data,  │
//! │  this)   │          │           │         │          │ tcmsg (20)      │ pad to 4; ...    │
//! └──────────┴──────────┴───────────┴─────────┴──────────┴─────────────────┴──────────────────┘
//! ```
//!
//! An answer is one message, or (a dump) several datagrams of messages flagged NLM_F_MULTI
//! ended by NLMSG_DONE; a failure is NLMSG_ERROR carrying a negative errno (0 is an ACK).

use std::fmt;
use std::io;
use std::mem;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::{cvt, retry};

// Values from the kernel's uapi headers (`linux/netlink.h`, `linux/rtnetlink.h`,
// `linux/pkt_sched.h`, `linux/if_link.h`), stable ABI.
/// `NLM_F_REQUEST`.
const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`: part of a multi-message answer, ended by NLMSG_DONE.
const NLM_F_MULTI: u16 = 0x2;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
const NLM_F_DUMP: u16 = 0x300;
/// `NLMSG_NOOP`.
const NLMSG_NOOP: u16 = 1;
/// `NLMSG_ERROR`.
const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
const NLMSG_DONE: u16 = 3;
/// `NLMSG_OVERRUN`.
const NLMSG_OVERRUN: u16 = 4;
/// `RTM_NEWLINK` / `RTM_GETLINK`.
pub(crate) const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
/// `RTM_NEWROUTE` / `RTM_GETROUTE`.
pub(crate) const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
/// `RTM_NEWQDISC` / `RTM_GETQDISC`.
pub(crate) const RTM_NEWQDISC: u16 = 36;
const RTM_GETQDISC: u16 = 38;
/// `RTA_DST`, `RTA_OIF` (route attributes).
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
/// `IFLA_IFNAME` (link attribute).
const IFLA_IFNAME: u16 = 3;
/// `TCA_KIND` (qdisc attribute: its name, NUL-terminated).
const TCA_KIND: u16 = 1;
/// `TCA_DUMP_INVISIBLE` (since 4.15): a flag asking the dump to include the qdiscs the kernel
/// attaches by itself (a classful root's default leaves), so the children listed are all of
/// them. Older kernels ignore the unknown attribute.
const TCA_DUMP_INVISIBLE: u16 = 10;
/// `TC_H_ROOT`: the parent of a device's root qdisc.
pub const TC_H_ROOT: u32 = 0xFFFF_FFFF;

const NLMSG_HDRLEN: usize = 16;
const RTMSG_LEN: usize = 12;
const IFINFOMSG_LEN: usize = 16;
const TCMSG_LEN: usize = 20;
const RTA_HDRLEN: usize = 4;

/// Bytes of receive buffer: a dump datagram is at most a page or two (`NLMSG_GOODSIZE`) on
/// every kernel seen; 64 KiB leaves room, and a longer one is reported, not cut silently.
pub(crate) const RECV_BUF: usize = 64 * 1024;

/// How long to wait for the kernel's answer. It answers at once; the bound only keeps a
/// broken kernel or seccomp filter from hanging the caller.
const RECV_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a buffer from the kernel could not be read, or what the kernel refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// A header or attribute claims more bytes than the buffer holds, or fewer than its own
    /// header: the answer is cut or corrupt.
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Its offset in the buffer.
        at: usize,
    },
    /// NLMSG_ERROR with this (positive) errno: the kernel refused the request.
    Errno(i32),
    /// NLMSG_OVERRUN: the kernel lost part of the answer.
    Overrun,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Truncated { what, at } => write!(f, "netlink answer truncated: {what} at byte {at}"),
            ParseError::Errno(e) => write!(f, "the kernel refused: {}", io::Error::from_raw_os_error(*e)),
            ParseError::Overrun => f.write_str("netlink overrun: the kernel lost part of its answer"),
        }
    }
}

impl std::error::Error for ParseError {}

impl From<ParseError> for io::Error {
    fn from(e: ParseError) -> io::Error {
        match e {
            ParseError::Errno(errno) => io::Error::from_raw_os_error(errno),
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// Where a datagram of an answer leaves the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// More datagrams follow (a dump without its NLMSG_DONE yet).
    More,
    /// The answer is complete.
    Done,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2)?.try_into().ok().map(u16::from_ne_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)?.try_into().ok().map(u32::from_ne_bytes)
}

fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

/// Walks one datagram of an answer to request `seq`: calls `f(type, payload)` for every data
/// message (the payload starts at the family header), skips messages of other sequence
/// numbers and NLMSG_NOOP, and says whether the answer is complete: at NLMSG_DONE, at an ACK,
/// or after a message without NLM_F_MULTI. Never panics, whatever the bytes.
pub(crate) fn walk(buf: &[u8], seq: u32, mut f: impl FnMut(u16, &[u8])) -> Result<Step, ParseError> {
    let mut at = 0;
    let mut step = Step::More;
    while at < buf.len() {
        let trunc = ParseError::Truncated { what: "message header", at };
        let len = u32_at(buf, at).ok_or(trunc.clone())? as usize;
        if len < NLMSG_HDRLEN || len > buf.len() - at {
            return Err(trunc);
        }
        let ty = u16_at(buf, at + 4).ok_or(trunc.clone())?;
        let flags = u16_at(buf, at + 6).ok_or(trunc.clone())?;
        let mseq = u32_at(buf, at + 8).ok_or(trunc)?;
        let payload = &buf[at + NLMSG_HDRLEN..at + len];
        if mseq == seq {
            match ty {
                NLMSG_NOOP => {}
                NLMSG_DONE => return Ok(Step::Done),
                NLMSG_OVERRUN => return Err(ParseError::Overrun),
                NLMSG_ERROR => {
                    let err = u32_at(payload, 0)
                        .ok_or(ParseError::Truncated { what: "nlmsgerr", at: at + NLMSG_HDRLEN })?
                        as i32;
                    if err == 0 {
                        return Ok(Step::Done); // an ACK
                    }
                    // The kernel sends -errno; a positive value would be a corrupt answer.
                    return Err(ParseError::Errno(err.checked_neg().filter(|e| *e > 0).unwrap_or(libc::EPROTO)));
                }
                _ => {
                    f(ty, payload);
                    if flags & NLM_F_MULTI == 0 {
                        step = Step::Done;
                    }
                }
            }
        }
        at += align4(len).min(buf.len() - at);
    }
    Ok(step)
}

/// The attributes after a family header of `fixed` bytes, as (type, data); the nested and
/// byte-order flags are masked off the type. Stops at the first attribute that does not fit,
/// returning the error in its place.
pub(crate) fn attrs(payload: &[u8], fixed: usize) -> impl Iterator<Item = Result<(u16, &[u8]), ParseError>> {
    let mut at = fixed;
    let mut failed = payload.len() < fixed;
    let mut first_error = failed.then_some(ParseError::Truncated { what: "family header", at: 0 });
    std::iter::from_fn(move || {
        if let Some(e) = first_error.take() {
            return Some(Err(e));
        }
        if failed || at >= payload.len() {
            return None;
        }
        let trunc = ParseError::Truncated { what: "attribute", at };
        let (Some(len), Some(ty)) = (u16_at(payload, at), u16_at(payload, at + 2)) else {
            failed = true;
            return Some(Err(trunc));
        };
        let len = len as usize;
        if len < RTA_HDRLEN || len > payload.len() - at {
            failed = true;
            return Some(Err(trunc));
        }
        let data = &payload[at + RTA_HDRLEN..at + len];
        at += align4(len).min(payload.len() - at);
        // NLA_F_NESTED and NLA_F_NET_BYTEORDER are the top two bits of the type.
        Some(Ok((ty & 0x3FFF, data)))
    })
}

/// A NUL-terminated string attribute (the NUL and anything after it dropped; invalid UTF-8
/// replaced).
fn attr_str(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

/// The output interface of an RTM_NEWROUTE payload (`RTA_OIF`), if it names one (a route of
/// type unreachable or blackhole does not).
pub(crate) fn parse_route(payload: &[u8]) -> Result<Option<u32>, ParseError> {
    let mut oif = None;
    for a in attrs(payload, RTMSG_LEN) {
        let (ty, data) = a?;
        if ty == RTA_OIF {
            oif = u32_at(data, 0);
        }
    }
    Ok(oif)
}

/// (ifindex, name) of an RTM_NEWLINK payload.
pub(crate) fn parse_link(payload: &[u8]) -> Result<(u32, Option<String>), ParseError> {
    let index = u32_at(payload, 4).ok_or(ParseError::Truncated { what: "ifinfomsg", at: 0 })?;
    let mut name = None;
    for a in attrs(payload, IFINFOMSG_LEN) {
        let (ty, data) = a?;
        if ty == IFLA_IFNAME {
            name = Some(attr_str(data));
        }
    }
    Ok((index, name))
}

/// One qdisc of an RTM_NEWQDISC payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QdiscMsg {
    /// The device's index (`tcm_ifindex`).
    pub ifindex: u32,
    /// Its handle, `major:minor` in the high and low 16 bits (`tcm_handle`).
    pub handle: u32,
    /// Its parent: [`TC_H_ROOT`] for the root, a class or the root's `major:queue` otherwise.
    pub parent: u32,
    /// `TCA_KIND`: "fq", "mq", "noqueue", ... (empty if the kernel sent none).
    pub kind: String,
}

/// Reads an RTM_NEWQDISC payload (`tcmsg` then attributes).
pub(crate) fn parse_qdisc(payload: &[u8]) -> Result<QdiscMsg, ParseError> {
    let t = ParseError::Truncated { what: "tcmsg", at: 0 };
    let ifindex = u32_at(payload, 4).ok_or(t.clone())?;
    let handle = u32_at(payload, 8).ok_or(t.clone())?;
    let parent = u32_at(payload, 12).ok_or(t)?;
    let mut kind = String::new();
    for a in attrs(payload, TCMSG_LEN) {
        let (ty, data) = a?;
        if ty == TCA_KIND {
            kind = attr_str(data);
        }
    }
    Ok(QdiscMsg { ifindex, handle, parent, kind })
}

/// Builds a request: header, family header, attributes.
fn request(ty: u16, flags: u16, seq: u32, fixed: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&[0; NLMSG_HDRLEN]);
    b.extend_from_slice(fixed);
    b.resize(align4(b.len()), 0);
    for (ty, data) in attrs {
        b.extend_from_slice(&((RTA_HDRLEN + data.len()) as u16).to_ne_bytes());
        b.extend_from_slice(&ty.to_ne_bytes());
        b.extend_from_slice(data);
        b.resize(align4(b.len()), 0);
    }
    let len = b.len() as u32;
    b[0..4].copy_from_slice(&len.to_ne_bytes());
    b[4..6].copy_from_slice(&ty.to_ne_bytes());
    b[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
    b[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in our port id.
    b
}

/// RTM_GETROUTE for one destination: `rtmsg` with the family and a full-length `rtm_dst_len`,
/// and the address in `RTA_DST`. The kernel answers with the route it would use (as `ip route
/// get` shows), in the calling thread's network namespace.
pub(crate) fn route_request(seq: u32, dst: IpAddr) -> Vec<u8> {
    let (family, bits, addr) = match dst {
        IpAddr::V4(a) => (libc::AF_INET as u8, 32u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, 128u8, a.octets().to_vec()),
    };
    let mut rtm = [0u8; RTMSG_LEN];
    rtm[0] = family;
    rtm[1] = bits;
    request(RTM_GETROUTE, 0, seq, &rtm, &[(RTA_DST, &addr)])
}

/// RTM_GETLINK for one interface index.
pub(crate) fn link_request(seq: u32, ifindex: u32) -> Vec<u8> {
    let mut ifi = [0u8; IFINFOMSG_LEN];
    ifi[0] = libc::AF_UNSPEC as u8;
    ifi[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    request(RTM_GETLINK, 0, seq, &ifi, &[])
}

/// RTM_GETQDISC dump. `tcm_ifindex` names the device (kernels that filter dumps use it; the
/// caller filters the answer by ifindex either way), with TCA_DUMP_INVISIBLE.
pub(crate) fn qdisc_dump_request(seq: u32, ifindex: u32) -> Vec<u8> {
    let mut tcm = [0u8; TCMSG_LEN];
    tcm[0] = libc::AF_UNSPEC as u8;
    tcm[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    request(RTM_GETQDISC, NLM_F_DUMP, seq, &tcm, &[(TCA_DUMP_INVISIBLE, &[])])
}

/// A `NETLINK_ROUTE` socket of the calling thread's network namespace.
#[derive(Debug)]
pub(crate) struct NlSocket {
    fd: OwnedFd,
    seq: u32,
}

impl NlSocket {
    /// socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE), with a receive timeout. Unbound: the
    /// kernel binds it to a port id of its own on the first send.
    pub(crate) fn open() -> io::Result<NlSocket> {
        // SAFETY: socket(2) takes plain integers and returns a new descriptor or -1.
        let fd = cvt(unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `fd` was just returned by socket(2), is valid and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        super::set_timeout(fd.as_fd(), libc::SO_RCVTIMEO, Some(RECV_TIMEOUT))?;
        Ok(NlSocket { fd, seq: 0 })
    }

    /// Sends a request built by `build(seq)` (to the kernel: an unconnected netlink socket's
    /// default destination is port 0) and feeds every datagram of the answer to `walk`, with
    /// `on_msg` for each data message, until the answer is complete. `buf` is the receive
    /// buffer ([`RECV_BUF`] bytes).
    pub(crate) fn exchange(
        &mut self,
        build: impl FnOnce(u32) -> Vec<u8>,
        buf: &mut [u8],
        mut on_msg: impl FnMut(u16, &[u8]),
    ) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let req = build(seq);
        // SAFETY: `req` is a live buffer of req.len() bytes for the duration of the call.
        retry(|| cvt(unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) }))?;
        loop {
            // recv(2) with MSG_TRUNC: a netlink socket then returns the datagram's real length,
            // so an answer longer than `buf` is detected rather than cut.
            let n = retry(|| {
                // SAFETY: `buf` is a live, exclusively borrowed buffer of buf.len() bytes.
                cvt(unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_TRUNC) })
            })? as usize;
            if n > buf.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("netlink datagram of {n} bytes exceeds the {} byte buffer", buf.len()),
                ));
            }
            if walk(&buf[..n], seq, &mut on_msg)? == Step::Done {
                return Ok(());
            }
        }
    }
}

// The hand-written header size agrees with libc's.
const _: () = assert!(mem::size_of::<libc::nlmsghdr>() == NLMSG_HDRLEN);

#[cfg(test)]
mod tests {
    use super::*;

    /// A message as the kernel would send it: header, payload, padded.
    fn msg(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = request(ty, 0, seq, payload, &[]);
        // request() pads the family header; restore the exact length and the given flags.
        let len = (NLMSG_HDRLEN + payload.len()) as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b[6..8].copy_from_slice(&flags.to_ne_bytes());
        b
    }

    fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut b = ((RTA_HDRLEN + data.len()) as u16).to_ne_bytes().to_vec();
        b.extend_from_slice(&ty.to_ne_bytes());
        b.extend_from_slice(data);
        b.resize(align4(b.len()), 0);
        b
    }

    fn tcmsg(ifindex: u32, handle: u32, parent: u32, kind: &str) -> Vec<u8> {
        let mut p = vec![0u8; TCMSG_LEN];
        p[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        p[8..12].copy_from_slice(&handle.to_ne_bytes());
        p[12..16].copy_from_slice(&parent.to_ne_bytes());
        let mut k = kind.as_bytes().to_vec();
        k.push(0);
        p.extend(attr(TCA_KIND, &k));
        p
    }

    /// The walk's verdict and how many data messages it handed on.
    fn collect(buf: &[u8], seq: u32) -> (Result<Step, ParseError>, usize) {
        let mut got = 0;
        let r = walk(buf, seq, |_, _| got += 1);
        (r, got)
    }

    /// (case, datagram, expected step, expected data messages).
    type WalkCase = (&'static str, Vec<u8>, Result<Step, ParseError>, usize);

    #[test]
    fn requests_are_well_formed() {
        let r = route_request(7, "10.1.2.3".parse().unwrap());
        assert_eq!(r.len() as u32, u32_at(&r, 0).unwrap());
        assert_eq!(u16_at(&r, 4), Some(RTM_GETROUTE));
        assert_eq!(u16_at(&r, 6), Some(NLM_F_REQUEST));
        assert_eq!(u32_at(&r, 8), Some(7));
        assert_eq!(r[NLMSG_HDRLEN], libc::AF_INET as u8);
        assert_eq!(r[NLMSG_HDRLEN + 1], 32);
        let a: Vec<_> = attrs(&r[NLMSG_HDRLEN..], RTMSG_LEN).collect::<Result<_, _>>().unwrap();
        assert_eq!(a, vec![(RTA_DST, &[10u8, 1, 2, 3][..])]);
        let r6 = route_request(1, "::1".parse().unwrap());
        assert_eq!(r6[NLMSG_HDRLEN + 1], 128);
        assert_eq!(r6.len(), NLMSG_HDRLEN + RTMSG_LEN + RTA_HDRLEN + 16);
        let q = qdisc_dump_request(3, 9);
        assert_eq!(u16_at(&q, 6), Some(NLM_F_REQUEST | NLM_F_DUMP));
        assert_eq!(u32_at(&q, NLMSG_HDRLEN + 4), Some(9));
        assert_eq!(q.len() % 4, 0);
        assert_eq!(u32_at(&link_request(2, 5), NLMSG_HDRLEN + 4), Some(5));
    }

    #[test]
    fn walk_table() {
        let q = tcmsg(2, 0, TC_H_ROOT, "fq");
        let multi = |seq| msg(RTM_NEWQDISC, NLM_F_MULTI, seq, &q);
        let done = msg(NLMSG_DONE, NLM_F_MULTI, 1, &0i32.to_ne_bytes());
        let err = |e: i32| msg(NLMSG_ERROR, 0, 1, &[e.to_ne_bytes().to_vec(), vec![0; 16]].concat());
        let cases: Vec<WalkCase> = vec![
            ("empty datagram", vec![], Ok(Step::More), 0),
            ("one part of a dump", [multi(1), multi(1)].concat(), Ok(Step::More), 2),
            ("dump ends", [multi(1), done.clone()].concat(), Ok(Step::Done), 1),
            ("done alone", done.clone(), Ok(Step::Done), 0),
            ("single answer", msg(RTM_NEWROUTE, 0, 1, &[0; RTMSG_LEN]), Ok(Step::Done), 1),
            ("other sequence skipped", [multi(9), msg(RTM_NEWROUTE, 0, 9, &[0; 12])].concat(), Ok(Step::More), 0),
            ("noop skipped", msg(NLMSG_NOOP, 0, 1, &[]), Ok(Step::More), 0),
            ("ack", err(0), Ok(Step::Done), 0),
            ("errno", err(-libc::ENODEV), Err(ParseError::Errno(libc::ENODEV)), 0),
            ("positive errno is corrupt", err(5), Err(ParseError::Errno(libc::EPROTO)), 0),
            (
                "error without its code",
                msg(NLMSG_ERROR, 0, 1, &[1, 2]),
                Err(ParseError::Truncated { what: "nlmsgerr", at: 16 }),
                0,
            ),
            ("overrun", msg(NLMSG_OVERRUN, 0, 1, &[]), Err(ParseError::Overrun), 0),
            ("cut header", multi(1)[..10].to_vec(), Err(ParseError::Truncated { what: "message header", at: 0 }), 0),
            (
                "length past the end",
                multi(1)[..30].to_vec(),
                Err(ParseError::Truncated { what: "message header", at: 0 }),
                0,
            ),
            (
                "length below the header",
                {
                    let mut m = multi(1);
                    m[0..4].copy_from_slice(&8u32.to_ne_bytes());
                    m
                },
                Err(ParseError::Truncated { what: "message header", at: 0 }),
                0,
            ),
            (
                "second message cut",
                [multi(1), multi(1)[..20].to_vec()].concat(),
                Err(ParseError::Truncated { what: "message header", at: q.len() + 16 }),
                1,
            ),
        ];
        for (name, buf, step, n) in cases {
            let (r, got) = collect(&buf, 1);
            assert_eq!(r, step, "{name}");
            assert_eq!(got, n, "{name}");
        }
    }

    #[test]
    fn payload_parsers() {
        let q = parse_qdisc(&tcmsg(3, 0x8001_0000, TC_H_ROOT, "mq")).unwrap();
        assert_eq!(q, QdiscMsg { ifindex: 3, handle: 0x8001_0000, parent: TC_H_ROOT, kind: "mq".into() });
        // A kind without its NUL, and one with junk after it.
        let mut p = tcmsg(1, 0, 0, "");
        p.truncate(TCMSG_LEN);
        p.extend(attr(TCA_KIND, b"fq"));
        assert_eq!(parse_qdisc(&p).unwrap().kind, "fq");
        p.truncate(TCMSG_LEN);
        p.extend(attr(TCA_KIND, b"etf\0xx"));
        assert_eq!(parse_qdisc(&p).unwrap().kind, "etf");
        // Cut inside the tcmsg, inside an attribute header, inside an attribute's data.
        assert!(parse_qdisc(&p[..10]).is_err());
        assert!(parse_qdisc(&p[..TCMSG_LEN + 2]).is_err());
        assert!(parse_qdisc(&p[..TCMSG_LEN + 5]).is_err());
        // Attribute length below its header.
        let mut bad = p.clone();
        bad[TCMSG_LEN..TCMSG_LEN + 2].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(parse_qdisc(&bad), Err(ParseError::Truncated { what: "attribute", at: TCMSG_LEN }));

        let mut r = vec![0u8; RTMSG_LEN];
        r.extend(attr(RTA_DST, &[127, 0, 0, 1]));
        assert_eq!(parse_route(&r), Ok(None));
        r.extend(attr(RTA_OIF | 0x8000, &1u32.to_ne_bytes()));
        assert_eq!(parse_route(&r), Ok(Some(1)), "the nested flag is masked");
        assert!(parse_route(&r[..RTMSG_LEN - 1]).is_err());

        let mut l = vec![0u8; IFINFOMSG_LEN];
        l[4..8].copy_from_slice(&7u32.to_ne_bytes());
        l.extend(attr(IFLA_IFNAME, b"veth0\0"));
        assert_eq!(parse_link(&l), Ok((7, Some("veth0".into()))));
        assert_eq!(parse_link(&l[..IFINFOMSG_LEN]), Ok((7, None)));
        assert!(parse_link(&l[..3]).is_err());
    }

    #[test]
    fn whole_answers() {
        let dump = [
            msg(RTM_NEWQDISC, NLM_F_MULTI, 4, &tcmsg(2, 0x8001_0000, TC_H_ROOT, "mq")),
            msg(RTM_NEWQDISC, NLM_F_MULTI, 3, &tcmsg(2, 0, 0x8001_0001, "stale")),
            msg(RTM_NEWQDISC, NLM_F_MULTI, 4, &tcmsg(2, 0, 0x8001_0001, "fq")),
            msg(NLMSG_DONE, NLM_F_MULTI, 4, &[0; 4]),
        ]
        .concat();
        let got = crate::qdisc::parse_qdisc_dump(&dump, 4).unwrap();
        assert_eq!(got.iter().map(|q| q.kind.as_str()).collect::<Vec<_>>(), ["mq", "fq"]);
        // A qdisc message whose attribute is cut spoils the dump.
        let mut bad = msg(RTM_NEWQDISC, NLM_F_MULTI, 4, &tcmsg(2, 0, TC_H_ROOT, "fq"));
        let l = bad.len() as u32 - 2;
        bad[0..4].copy_from_slice(&l.to_ne_bytes());
        assert!(crate::qdisc::parse_qdisc_dump(&bad[..l as usize], 4).is_err());

        let mut r = vec![0u8; RTMSG_LEN];
        r.extend(attr(RTA_OIF, &5u32.to_ne_bytes()));
        assert_eq!(crate::qdisc::parse_route_reply(&msg(RTM_NEWROUTE, 0, 1, &r), 1), Ok(Some(5)));
        let unreachable = msg(NLMSG_ERROR, 0, 1, &[(-libc::ENETUNREACH).to_ne_bytes().to_vec(), vec![0; 16]].concat());
        assert_eq!(crate::qdisc::parse_route_reply(&unreachable, 1), Err(ParseError::Errno(libc::ENETUNREACH)));
    }

    #[test]
    fn garbage_never_panics() {
        // Every prefix and a spread of corruptions of a real-shaped dump.
        let dump = [
            msg(RTM_NEWQDISC, NLM_F_MULTI, 1, &tcmsg(2, 0x8001_0000, TC_H_ROOT, "mq")),
            msg(RTM_NEWQDISC, NLM_F_MULTI, 1, &tcmsg(2, 0, 0x8001_0001, "fq")),
            msg(NLMSG_DONE, NLM_F_MULTI, 1, &[0; 4]),
        ]
        .concat();
        let mut seed = 0x9E37_79B9u32;
        for cut in 0..=dump.len() {
            let mut b = dump[..cut].to_vec();
            for _ in 0..4 {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                if !b.is_empty() {
                    let i = seed as usize % b.len();
                    b[i] = (seed >> 24) as u8;
                }
            }
            for buf in [&dump[..cut], &b[..]] {
                let _ = crate::qdisc::parse_qdisc_dump(buf, 1);
                let _ = crate::qdisc::parse_route_reply(buf, 1);
                let _ = walk(buf, 1, |_, p| {
                    let _ = parse_qdisc(p);
                    let _ = parse_route(p);
                    let _ = parse_link(p);
                });
            }
        }
    }
}
