//! The coalescer: turns an ordered stream of datagrams into GSO super-buffers.
//!
//! A GSO send carries one destination, one segment size, and segments that are all that size
//! except the last, which may be shorter (the kernel's rule; see `udp_send_skb` and the
//! selftest `udpgso.c`). So consecutive datagrams join one transmit while:
//!
//! - they go to the same destination with the same source, ECN and departure time;
//! - each is exactly the first one's size — a shorter one joins as the last and closes it;
//! - the transmit stays within the segment limit (probed: 128, else 64) and the payload
//!   ceiling (65,507 B over IPv4, 65,527 B over IPv6).
//!
//! A transmit of one datagram is sent without `UDP_SEGMENT` (some devices fail a
//! single-segment GSO send with EIO). A zero-length datagram is legal UDP: it never joins a
//! group (it would be a segment of size 0) and is sent on its own.
//!
//! ```text
//!  push: A1200 A1200 A1200 A700 A1200 B1200 B1200 A0
//!  out : [A 1200×3 + 700] [A 1200] [B 1200×2] [A 0]
//!          gso=1200          plain    gso=1200  plain
//! ```
//!
//! [`Batch`] owns one contiguous buffer; [`Batch::transmits`] lends [`Transmit`]s into it.

use std::net::{IpAddr, SocketAddr};

use crate::error::InvalidTransmit;
use crate::transmit::{max_payload, EcnCodepoint, Transmit};
use crate::txtime::Timestamp;
use crate::UdpSocket;

/// What bounds a GSO transmit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentLimits {
    /// Whether to coalesce at all (false: every datagram is its own transmit).
    pub segmenting: bool,
    /// Segments per transmit.
    pub max_segments: usize,
}

impl SegmentLimits {
    /// The limits of a socket now: its send mode, and its probed (possibly lowered) limit.
    pub fn for_socket(s: &UdpSocket) -> Self {
        SegmentLimits { segmenting: s.caps.gso_enabled(), max_segments: s.caps.max_segments() }
    }
}

/// Per-datagram metadata beyond the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DatagramMeta {
    /// Source address to send from.
    pub src_ip: Option<IpAddr>,
    /// ECN codepoint.
    pub ecn: Option<EcnCodepoint>,
    /// Departure time.
    pub departure: Option<Timestamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    dst: SocketAddr,
    meta: DatagramMeta,
    start: usize,
    len: usize,
    /// The first datagram's size.
    seg: usize,
    count: usize,
    /// A shorter datagram ended it, or it is a zero-length datagram.
    closed: bool,
}

/// An ordered batch of datagrams, coalesced into GSO transmits as they are pushed.
#[derive(Debug, Clone)]
pub struct Batch {
    limits: SegmentLimits,
    buf: Vec<u8>,
    groups: Vec<Group>,
    datagrams: usize,
}

/// One planned transmit, as numbers (for tests and tools that plan without a buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Destination.
    pub dst: SocketAddr,
    /// Payload bytes.
    pub len: usize,
    /// Segment size when more than one segment; `None` for a plain datagram.
    pub segment_size: Option<usize>,
    /// Datagrams.
    pub segments: usize,
}

impl Batch {
    /// An empty batch with the given limits.
    pub fn new(limits: SegmentLimits) -> Self {
        Batch { limits, buf: Vec::new(), groups: Vec::new(), datagrams: 0 }
    }

    /// An empty batch planned for `socket` (its send mode and current GSO state).
    pub fn for_socket(socket: &UdpSocket) -> Self {
        Self::new(SegmentLimits::for_socket(socket))
    }

    /// Empties the batch, keeping its memory; re-reads limits that may have changed.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.groups.clear();
        self.datagrams = 0;
    }

    /// Replaces the limits (e.g. after [`SegmentLimits::for_socket`] changed); applies to
    /// datagrams pushed from now on.
    pub fn set_limits(&mut self, limits: SegmentLimits) {
        self.limits = limits;
    }

    /// Appends one datagram to `dst`.
    pub fn push(&mut self, dst: SocketAddr, datagram: &[u8]) -> Result<(), InvalidTransmit> {
        self.push_with(dst, DatagramMeta::default(), datagram)
    }

    /// Appends one datagram with source, ECN or departure time.
    pub fn push_with(&mut self, dst: SocketAddr, meta: DatagramMeta, datagram: &[u8]) -> Result<(), InvalidTransmit> {
        let len = datagram.len();
        let ceiling = max_payload(&dst);
        if len > ceiling {
            return Err(InvalidTransmit::PayloadTooLarge { len, max: ceiling });
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(datagram);
        self.datagrams += 1;
        if let Some(g) = self.groups.last_mut() {
            let fits = self.limits.segmenting
                && !g.closed
                && g.dst == dst
                && g.meta == meta
                && len > 0
                && len <= g.seg
                && g.count < self.limits.max_segments
                && g.len + len <= ceiling;
            if fits {
                g.len += len;
                g.count += 1;
                g.closed = len < g.seg;
                return Ok(());
            }
        }
        self.groups.push(Group { dst, meta, start, len, seg: len, count: 1, closed: len == 0 });
        Ok(())
    }

    /// Datagrams pushed.
    pub fn datagrams(&self) -> usize {
        self.datagrams
    }

    /// Transmits planned.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Nothing pushed.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Payload bytes pushed.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// The plan as numbers.
    pub fn plan(&self) -> Vec<Planned> {
        self.groups
            .iter()
            .map(|g| Planned {
                dst: g.dst,
                len: g.len,
                segment_size: (g.count > 1).then_some(g.seg),
                segments: g.count,
            })
            .collect()
    }

    /// The transmits, borrowing the batch's buffer.
    pub fn transmits(&self) -> Vec<Transmit<'_>> {
        let mut out = Vec::with_capacity(self.groups.len());
        self.transmits_into(&mut out);
        out
    }

    /// Like [`Batch::transmits`], into a vector the caller reuses.
    pub fn transmits_into<'a>(&'a self, out: &mut Vec<Transmit<'a>>) {
        out.clear();
        out.extend(self.groups.iter().map(|g| Transmit {
            destination: g.dst,
            contents: &self.buf[g.start..g.start + g.len],
            segment_size: (g.count > 1).then_some(g.seg),
            src_ip: g.meta.src_ip,
            ecn: g.meta.ecn,
            departure: g.meta.departure,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a() -> SocketAddr {
        "192.0.2.1:1000".parse().unwrap()
    }
    fn b() -> SocketAddr {
        "192.0.2.2:1000".parse().unwrap()
    }
    fn v6() -> SocketAddr {
        "[2001:db8::2]:1000".parse().unwrap()
    }
    const GSO: SegmentLimits = SegmentLimits { segmenting: true, max_segments: 128 };

    /// (destination, size) in; (destination, segment size, segments, bytes) out.
    fn run(limits: SegmentLimits, input: &[(SocketAddr, usize)]) -> Vec<(SocketAddr, Option<usize>, usize, usize)> {
        let mut batch = Batch::new(limits);
        for (d, n) in input {
            batch.push(*d, &vec![7u8; *n]).unwrap();
        }
        let plan = batch.plan();
        // Conservation: every byte and datagram is in exactly one transmit.
        assert_eq!(plan.iter().map(|p| p.segments).sum::<usize>(), input.len());
        assert_eq!(plan.iter().map(|p| p.len).sum::<usize>(), input.iter().map(|x| x.1).sum::<usize>());
        plan.into_iter().map(|p| (p.dst, p.segment_size, p.segments, p.len)).collect()
    }

    type Row = (&'static str, SegmentLimits, Vec<(SocketAddr, usize)>, Vec<(SocketAddr, Option<usize>, usize, usize)>);

    #[test]
    fn truth_table() {
        let cases: Vec<Row> = vec![
            ("empty", GSO, vec![], vec![]),
            ("single datagram is plain", GSO, vec![(a(), 1200)], vec![(a(), None, 1, 1200)]),
            ("equal sizes coalesce", GSO, vec![(a(), 1200); 3], vec![(a(), Some(1200), 3, 3600)]),
            (
                "short last joins and closes",
                GSO,
                vec![(a(), 1200), (a(), 1200), (a(), 700), (a(), 1200)],
                vec![(a(), Some(1200), 3, 3100), (a(), None, 1, 1200)],
            ),
            ("larger breaks", GSO, vec![(a(), 700), (a(), 1200)], vec![(a(), None, 1, 700), (a(), None, 1, 1200)]),
            ("short pair", GSO, vec![(a(), 1200), (a(), 1)], vec![(a(), Some(1200), 2, 1201)]),
            (
                "destination change breaks",
                GSO,
                vec![(a(), 100), (b(), 100), (b(), 100), (a(), 100)],
                vec![(a(), None, 1, 100), (b(), Some(100), 2, 200), (a(), None, 1, 100)],
            ),
            (
                "zero length alone",
                GSO,
                vec![(a(), 0), (a(), 0), (a(), 10), (a(), 0)],
                vec![(a(), None, 1, 0), (a(), None, 1, 0), (a(), None, 1, 10), (a(), None, 1, 0)],
            ),
            ("segment size 1", GSO, vec![(a(), 1); 5], vec![(a(), Some(1), 5, 5)]),
            (
                "max segments then a new group",
                GSO,
                vec![(a(), 10); 130],
                vec![(a(), Some(10), 128, 1280), (a(), Some(10), 2, 20)],
            ),
            (
                "limit 64",
                SegmentLimits { segmenting: true, max_segments: 64 },
                vec![(a(), 10); 65],
                vec![(a(), Some(10), 64, 640), (a(), None, 1, 10)],
            ),
            (
                "v4 payload ceiling",
                GSO,
                vec![(a(), 1472); 45],
                vec![(a(), Some(1472), 44, 64768), (a(), None, 1, 1472)],
            ),
            ("exact v4 ceiling", GSO, vec![(a(), 65507 / 7); 7], vec![(a(), Some(9358), 7, 65506)]),
            ("v6 ceiling is larger", GSO, vec![(v6(), 9361); 7], vec![(v6(), Some(9361), 7, 65527)]),
            (
                "v4 same sizes split at ceiling",
                GSO,
                vec![(a(), 9361); 7],
                vec![(a(), Some(9361), 6, 56166), (a(), None, 1, 9361)],
            ),
            (
                "segmenting off",
                SegmentLimits { segmenting: false, max_segments: 128 },
                vec![(a(), 100); 3],
                vec![(a(), None, 1, 100); 3],
            ),
        ];
        for (name, limits, input, want) in cases {
            assert_eq!(run(limits, &input), want, "case {name:?}");
        }
    }

    #[test]
    fn meta_breaks_groups() {
        let mut batch = Batch::new(GSO);
        let ect = DatagramMeta { ecn: Some(EcnCodepoint::Ect0), ..Default::default() };
        batch.push(a(), &[1; 10]).unwrap();
        batch.push_with(a(), ect, &[2; 10]).unwrap();
        batch.push_with(a(), ect, &[3; 10]).unwrap();
        let t = batch.transmits();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].ecn, Some(EcnCodepoint::Ect0));
        assert_eq!(t[1].contents, &[2; 10].iter().chain(&[3; 10]).copied().collect::<Vec<_>>()[..]);
    }

    #[test]
    fn too_large_is_refused_and_nothing_added() {
        let mut batch = Batch::new(GSO);
        let err = batch.push(a(), &vec![0; 65508]).unwrap_err();
        assert_eq!(err, InvalidTransmit::PayloadTooLarge { len: 65508, max: 65507 });
        assert!(batch.is_empty());
        batch.push(v6(), &vec![0; 65527]).unwrap();
        assert_eq!(batch.datagrams(), 1);
    }

    #[test]
    fn contents_are_in_order() {
        let mut batch = Batch::new(GSO);
        for i in 0..10u8 {
            batch.push(a(), &[i; 4]).unwrap();
        }
        let t = batch.transmits();
        assert_eq!(t.len(), 1);
        let expect: Vec<u8> = (0..10u8).flat_map(|i| [i; 4]).collect();
        assert_eq!(t[0].contents, &expect[..]);
        assert_eq!(t[0].segment_size, Some(4));
    }
}
