//! What a send is: [`Transmit`], the four [`SendMode`]s, checking a transmit against the
//! path, and cutting it into messages (pure; the system calls are in `send.rs`).
//!
//! The send loop's promise: a datagram handed to [`UdpSocket::try_send`](crate::UdpSocket::try_send) or
//! [`UdpSocket::send`](crate::UdpSocket::send) is sent, or the call returns an error whose cursor says exactly which
//! datagrams went out: never a silent drop.
//!
//! | kernel answer | what udpx does |
//! | --- | --- |
//! | short `sendmmsg` count | continues from the first unsent message |
//! | EINTR | retries the call |
//! | EAGAIN | `try_send` returns `WouldBlock` with the exact cursor; `send` returns it between transmits and waits (bounded) to finish a split transmit, so it never leaves one half-sent |
//! | ENOBUFS | `try_send` returns `NoBuffers` with the cursor; `send` backs off (50 us doubling to 10 ms, at most [`ENOBUFS_RETRIES`](crate::blocking::ENOBUFS_RETRIES) times), counted |
//! | a pending ICMP error (IP_RECVERR, unconnected socket) | reads the error queue, sends again (counted) |
//! | ENOBUFS on a zerocopy send (optmem) | sends the same data by copying, at once |
//! | EINVAL on more than 64 segments | lowers the segment limit to 64, re-sends |
//! | EIO / EINVAL on a GSO message | re-sends that transmit at once as plain datagrams; if that works, datagrams to that destination go plain for a back-off (1 s, doubling to 5 min, then GSO is tried again; recorded with the errno, logged once, counted); if the plain send says EMSGSIZE, the problem was size: GSO stays on and EMSGSIZE is reported |
//! | EMSGSIZE | reported with the sizes involved |

use std::net::{IpAddr, SocketAddr};

use crate::error::InvalidTransmit;
use crate::sys::mmsg::SendScratch;
use crate::txtime::Timestamp;

/// Largest UDP payload over IPv4: 65,535 − 20 (IP header) − 8 (UDP header).
pub const MAX_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6: the 16-bit payload length covers the UDP header but not the
/// IPv6 header, so 65,535 − 8.
pub const MAX_PAYLOAD_V6: usize = 65_527;

/// The largest UDP payload to `dst`.
pub fn max_payload(dst: &SocketAddr) -> usize {
    match dst {
        SocketAddr::V4(_) => MAX_PAYLOAD_V4,
        SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_some() => MAX_PAYLOAD_V4,
        SocketAddr::V6(_) => MAX_PAYLOAD_V6,
    }
}

/// The ECN codepoint of a datagram (RFC 3168), the low two bits of TOS / traffic class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EcnCodepoint {
    /// ECT(0).
    Ect0 = 0b10,
    /// ECT(1).
    Ect1 = 0b01,
    /// Congestion experienced.
    Ce = 0b11,
}

impl EcnCodepoint {
    /// From the TOS / traffic-class byte; `None` for Not-ECT.
    pub fn from_bits(tos: u8) -> Option<Self> {
        match tos & 0b11 {
            0b10 => Some(EcnCodepoint::Ect0),
            0b01 => Some(EcnCodepoint::Ect1),
            0b11 => Some(EcnCodepoint::Ce),
            _ => None,
        }
    }
}

/// How a socket sends. The bench compares all four; real programs want [`SendMode::GsoSendmmsg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendMode {
    /// One `sendmsg` per datagram: the baseline every UDP program starts from.
    Sendmsg,
    /// `sendmmsg`: up to 64 datagrams per call (fewer syscalls, same stack traversals).
    Sendmmsg,
    /// `sendmsg` with `UDP_SEGMENT`: one call and one stack traversal per super-buffer of up
    /// to 64 KiB.
    GsoSendmsg,
    /// `sendmmsg` of GSO super-buffers: both savings.
    GsoSendmmsg,
}

impl SendMode {
    /// All four, in the order the bench reports them.
    pub const ALL: [SendMode; 4] = [SendMode::Sendmsg, SendMode::Sendmmsg, SendMode::GsoSendmsg, SendMode::GsoSendmmsg];

    /// Whether this mode segments (uses GSO).
    pub fn segments(self) -> bool {
        matches!(self, SendMode::GsoSendmsg | SendMode::GsoSendmmsg)
    }

    /// Whether this mode batches system calls (sendmmsg).
    pub fn batches(self) -> bool {
        matches!(self, SendMode::Sendmmsg | SendMode::GsoSendmmsg)
    }

    /// A short stable name (`sendmsg`, `sendmmsg`, `gso`, `gso-sendmmsg`).
    pub fn name(self) -> &'static str {
        match self {
            SendMode::Sendmsg => "sendmsg",
            SendMode::Sendmmsg => "sendmmsg",
            SendMode::GsoSendmsg => "gso",
            SendMode::GsoSendmmsg => "gso-sendmmsg",
        }
    }
}

impl std::str::FromStr for SendMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SendMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown send mode {s:?}: use one of sendmsg, sendmmsg, gso, gso-sendmmsg"))
    }
}

impl std::fmt::Display for SendMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One send: a datagram, or with `segment_size` a run of datagrams to one destination that the
/// kernel segments (all `segment_size` long but the last, which may be shorter).
#[derive(Debug, Clone, Copy)]
pub struct Transmit<'a> {
    /// Where it goes.
    pub destination: SocketAddr,
    /// The payload: one datagram, or consecutive segments.
    pub contents: &'a [u8],
    /// GSO segment size; `None` sends `contents` as one datagram.
    pub segment_size: Option<usize>,
    /// Source address (needs pktinfo; `None`: the kernel picks by route).
    pub src_ip: Option<IpAddr>,
    /// ECN codepoint to set.
    pub ecn: Option<EcnCodepoint>,
    /// Departure time (`SCM_TXTIME`), honoured only by an fq or etf qdisc.
    pub departure: Option<Timestamp>,
}

impl<'a> Transmit<'a> {
    /// One datagram to `destination`.
    pub fn new(destination: SocketAddr, contents: &'a [u8]) -> Self {
        Transmit { destination, contents, segment_size: None, src_ip: None, ecn: None, departure: None }
    }

    /// With a GSO segment size.
    pub fn segmented(mut self, segment_size: usize) -> Self {
        self.segment_size = Some(segment_size);
        self
    }

    /// Datagrams this transmit puts on the wire.
    pub fn segments(&self) -> usize {
        segment_count(self.contents.len(), self.segment_size)
    }
}

/// Datagrams a payload of `len` makes in segments of `seg` (a zero-length datagram is one).
pub(crate) fn segment_count(len: usize, seg: Option<usize>) -> usize {
    match seg {
        Some(s) if s > 0 && len > s => len.div_ceil(s),
        _ => 1,
    }
}

/// The socket's address family, as it matters for sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// AF_INET.
    V4,
    /// AF_INET6 with `IPV6_V6ONLY`, or bound to a specific IPv6 address.
    V6Only,
    /// AF_INET6 bound to `[::]` without `IPV6_V6ONLY`: reaches IPv4 and IPv6.
    DualStack,
}

impl Family {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6Only => "IPv6-only",
            Family::DualStack => "dual-stack",
        }
    }

    pub(crate) fn is_v6(self) -> bool {
        self != Family::V4
    }

    /// Whether a datagram to `dst` can leave this socket.
    pub(crate) fn reaches(self, dst: &SocketAddr) -> bool {
        match (self, dst) {
            (Family::V4, SocketAddr::V4(_)) | (Family::DualStack, _) => true,
            (Family::V6Only, SocketAddr::V6(a)) => a.ip().to_ipv4_mapped().is_none(),
            _ => false,
        }
    }
}

/// Caller-owned scratch space for sending: the message vectors of one system call (about
/// 30 KiB), reused by every call so that sending allocates nothing. Keep one per sending
/// thread (or per event loop) and pass it to [`UdpSocket::try_send`](crate::UdpSocket::try_send).
pub struct SendBuffers(pub(crate) Box<SendScratch>);

impl SendBuffers {
    /// Fresh scratch space.
    pub fn new() -> Self {
        SendBuffers(SendScratch::new())
    }
}

impl Default for SendBuffers {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for SendBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SendBuffers")
    }
}

/// Where a send stands in the caller's transmits: `transmit` is the first one not sent whole,
/// `segment` how many of its segments went already (nonzero only when a transmit goes as
/// several messages: GSO off towards its destination, or more segments than one GSO call
/// takes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SendCursor {
    /// Index of the first transmit not sent whole.
    pub transmit: usize,
    /// Its segments already sent.
    pub segment: usize,
}

/// What a transmit is checked against: the socket's family and the kernel's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathLimits {
    /// The sending socket's family.
    pub family: Family,
    /// Path MTU towards the connected peer, where known.
    pub path_mtu: Option<usize>,
    /// Most segments per GSO send on this kernel (`None`: no GSO).
    pub max_segments: Option<usize>,
}

/// Checks a transmit without sending. `to_peer`: it goes to the connected peer, whose path MTU
/// is in `limits`.
pub fn validate_transmit(t: &Transmit<'_>, limits: &PathLimits, to_peer: bool) -> Result<(), InvalidTransmit> {
    if !limits.family.reaches(&t.destination) {
        return Err(InvalidTransmit::WrongFamily { destination: t.destination, socket: limits.family.name() });
    }
    let ceiling = max_payload(&t.destination);
    if t.segment_size == Some(0) {
        return Err(InvalidTransmit::SegmentSizeZero);
    }
    if t.contents.len() > ceiling {
        return Err(InvalidTransmit::PayloadTooLarge { len: t.contents.len(), max: ceiling });
    }
    let Some(seg) = t.segment_size else {
        return Ok(());
    };
    if t.segments() <= 1 {
        return Ok(()); // sent as one plain datagram
    }
    if let (Some(mtu), true) = (limits.path_mtu, to_peer) {
        let hdr = if max_payload(&t.destination) == MAX_PAYLOAD_V4 { 28 } else { 48 };
        let max = mtu.saturating_sub(hdr);
        if seg > max {
            return Err(InvalidTransmit::SegmentTooLarge { segment_size: seg, max, limit: "the path MTU" });
        }
    }
    if let Some(kmax) = limits.max_segments {
        if t.segments() > kmax {
            return Err(InvalidTransmit::TooManySegments { segments: t.segments(), max: kmax });
        }
    }
    Ok(())
}

/// One message a transmit becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Byte range of the transmit's contents.
    pub range: std::ops::Range<usize>,
    /// Datagrams on the wire.
    pub segments: usize,
    /// `UDP_SEGMENT` attached (never for a single segment).
    pub segment_size: Option<usize>,
}

/// The messages a transmit becomes: with GSO, super-buffers of at most `max_segments`;
/// without, one message per segment; a transmit of one datagram, one plain message.
pub fn messages(t: &Transmit<'_>, gso: bool, max_segments: usize) -> Vec<Message> {
    let total = t.segments();
    let mut out = Vec::new();
    let mut first = 0;
    while first < total {
        let (range, n, seg) = chunk(t, first, if gso { max_segments } else { 1 });
        out.push(Message { range, segments: n, segment_size: seg });
        first += n;
    }
    out
}

/// The message of `t` starting at segment `first`, of at most `per_msg` segments.
pub(crate) fn chunk(t: &Transmit<'_>, first: usize, per_msg: usize) -> (std::ops::Range<usize>, usize, Option<usize>) {
    match t.segment_size {
        Some(seg) if t.segments() > 1 => {
            let n = per_msg.max(1).min(t.segments() - first);
            let start = first * seg;
            let end = (start + n * seg).min(t.contents.len());
            // Never UDP_SEGMENT on a single segment: some devices fail it with EIO.
            (start..end, n, (n > 1).then_some(seg))
        }
        _ => (0..t.contents.len(), 1, None),
    }
}

/// An empty transmit list of another lifetime on `v`'s allocation: collecting a vector's own
/// `into_iter()` reuses its buffer when the element layouts match (here the same type but for
/// a lifetime), so a list that borrows a loop's bytes anew each round costs no allocation once
/// it has grown.
pub fn recycle_transmits<'a, 'b>(mut v: Vec<Transmit<'a>>) -> Vec<Transmit<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!("the vector is empty")).collect()
}
