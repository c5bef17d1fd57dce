//! I/O modes and the outbox: how the packets quiche writes become `Transmit`s.
//!
//! quiche hands out one packet per `send()` call. The outbox appends each to one flat buffer
//! and groups consecutive packets to the same peer of equal size into a run, which the udpx
//! socket sends as one GSO buffer (or, in the plain modes, as one datagram per packet):
//!
//! ```text
//!  buf: ├ p0 1350 ┼ p1 1350 ┼ p2 1350 ┼ p3 400 ┤├ p4 1350 (other peer) ┤├ p5 1350 ┼ …
//!       └──────────── run 0: seg 1350, 4 packets ┘└─────── run 1 ───────┘└ run 2 …
//!                 (a shorter packet ends its run)
//! ```
//!
//! A run ends at a shorter packet (GSO allows only the last segment to be shorter), at a
//! change of peer or of connection, at [`MAX_RUN_SEGMENTS`] packets or at the largest UDP
//! payload. Runs never mix connections, even to one peer address (a client socket carrying
//! several connections): a receiver steering by connection ID may see a GSO buffer whole
//! (on loopback the kernel looks the socket up once for the unsegmented buffer, and GRO
//! merges by address, not by ID), so every packet of a run must belong to one connection. When the
//! socket cannot take more (`EAGAIN`, or `ENOBUFS` from a full device queue) the outbox keeps
//! the unsent packets and the exact [`SendCursor`], and the next flush resumes there: nothing
//! quiche produced is dropped, and no new packet is produced until the old ones are gone.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use udpx::{SendBuffers, SendCursor, SendErrorKind, SendMode, Transmit, UdpSocket};

use crate::counters::HostCounters;

/// Most packets in one GSO run: what every kernel since 4.18 takes (6.9 takes 128).
pub const MAX_RUN_SEGMENTS: usize = 64;
/// Departure times this close (ns) go out in one GSO run: quiche's `ReleaseDecision`
/// treats releases within 50 us as one burst.
const SAME_DEPARTURE_NS: u64 = 50_000;
/// Bytes the outbox holds before it must be flushed.
pub const OUTBOX_BYTES: usize = 512 * 1024;

/// How packets leave: the four rows of the Cloudflare post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoMode {
    /// One `sendmsg` per packet.
    Sendmsg,
    /// `sendmmsg`: many packets per call, one stack traversal each.
    Sendmmsg,
    /// `sendmsg` with `UDP_SEGMENT`: one GSO run per call.
    Gso,
    /// `sendmmsg` of GSO runs: several runs per call.
    #[default]
    GsoMmsg,
}

impl IoMode {
    /// All four, in the post's order.
    pub const ALL: [IoMode; 4] = [IoMode::Sendmsg, IoMode::Sendmmsg, IoMode::Gso, IoMode::GsoMmsg];

    /// The udpx socket send mode that implements it.
    pub fn send_mode(self) -> SendMode {
        match self {
            IoMode::Sendmsg => SendMode::Sendmsg,
            IoMode::Sendmmsg => SendMode::Sendmmsg,
            IoMode::Gso => SendMode::GsoSendmsg,
            IoMode::GsoMmsg => SendMode::GsoSendmmsg,
        }
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Sendmsg => "sendmsg",
            IoMode::Sendmmsg => "sendmmsg",
            IoMode::Gso => "gso",
            IoMode::GsoMmsg => "gso-mmsg",
        }
    }
}

impl FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<IoMode, String> {
        IoMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown I/O mode {s:?}: use one of sendmsg, sendmmsg, gso, gso-mmsg"))
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Consecutive packets to one peer, all `seg` bytes but possibly the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub to: SocketAddr,
    /// The source address to send from (`IP_PKTINFO`); `None`: the socket's.
    pub from: Option<IpAddr>,
    /// The connection (the host's slot) whose packets these are.
    pub conn: usize,
    pub start: usize,
    pub len: usize,
    pub seg: usize,
    pub packets: usize,
    /// A shorter packet ended it.
    pub closed: bool,
    /// Departure time of the run's first packet (kernel pacing): the run leaves as one burst.
    pub departure: Option<udpx::Timestamp>,
}

/// Packets waiting to be sent, grouped into runs (see the module docs).
pub(crate) struct Outbox {
    buf: Vec<u8>,
    runs: Vec<Run>,
    cursor: SendCursor,
    bufs: SendBuffers,
    /// The list of transmits a flush hands the socket, kept empty between flushes so its
    /// allocation serves every flush (see [`recycle`]).
    spare: Vec<Transmit<'static>>,
}

/// An empty vector of another lifetime on the same allocation: collecting a vector's own
/// `into_iter()` reuses its buffer when the element layouts match (here the same type but for
/// a lifetime), so the transmit list borrowing the outbox's bytes costs no allocation per
/// flush once it has grown.
fn recycle<'a, 'b>(mut v: Vec<Transmit<'a>>) -> Vec<Transmit<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!("the vector is empty")).collect()
}

/// What [`Outbox::flush`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    /// Everything went.
    Done,
    /// The socket is full (EAGAIN): wait for writability.
    WouldBlock,
    /// The device queue is full (ENOBUFS): back off briefly.
    NoBuffers,
}

impl Outbox {
    pub fn new() -> Outbox {
        Outbox {
            buf: vec![0; OUTBOX_BYTES],
            runs: Vec::new(),
            cursor: SendCursor::default(),
            bufs: SendBuffers::new(),
            spare: Vec::new(),
        }
    }

    fn end(&self) -> usize {
        self.runs.last().map_or(0, |r| r.start + r.len)
    }

    /// Free space for one more packet of up to `max` bytes, or `None` when full.
    pub fn space(&mut self, max: usize) -> Option<&mut [u8]> {
        let end = self.end();
        (end + max <= self.buf.len()).then(|| &mut self.buf[end..end + max])
    }

    /// Whether packets wait to be sent.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Bytes of the packets that wait to be sent.
    pub fn pending_bytes(&self) -> usize {
        self.runs.first().map_or(0, |f| self.end() - f.start)
    }

    /// Appends the `len`-byte packet of connection `conn` just written into
    /// [`Outbox::space`], for `to` from `from`. A run is cut where the departure time moves
    /// more than quiche's own tolerance for one burst (50 us).
    pub fn commit(
        &mut self,
        conn: usize,
        to: SocketAddr,
        from: Option<IpAddr>,
        len: usize,
        departure: Option<udpx::Timestamp>,
    ) {
        let start = self.end();
        if let Some(r) = self.runs.last_mut() {
            let same_time = match (r.departure, departure) {
                (Some(a), Some(b)) => a.as_nanos().abs_diff(b.as_nanos()) <= SAME_DEPARTURE_NS,
                (a, b) => a.is_none() == b.is_none(),
            };
            let fits = r.to == to
                && r.from == from
                && same_time
                && r.conn == conn
                && !r.closed
                && len <= r.seg
                && len > 0
                && r.packets < MAX_RUN_SEGMENTS
                && r.len + len <= udpx::max_payload(&to);
            if fits {
                r.len += len;
                r.packets += 1;
                r.closed = len < r.seg;
                return;
            }
        }
        self.runs.push(Run { to, from, conn, start, len, seg: len, packets: 1, closed: false, departure });
    }

    #[cfg(test)]
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Sends what waits, from where the last flush stopped. Hard errors (the kernel refused a
    /// transmit for good) skip that transmit, counted in `send_errors`: QUIC's loss recovery
    /// re-sends its frames.
    pub fn flush(&mut self, socket: &UdpSocket, c: &mut HostCounters) -> Flush {
        while !self.runs.is_empty() {
            let mut transmits: Vec<Transmit<'_>> = recycle(std::mem::take(&mut self.spare));
            transmits.extend(self.runs.iter().map(|r| {
                let mut t = Transmit::new(r.to, &self.buf[r.start..r.start + r.len]);
                t.departure = r.departure;
                t.src_ip = r.from;
                if r.packets > 1 {
                    t.segmented(r.seg)
                } else {
                    t
                }
            }));
            let sent = socket.try_send(&mut self.bufs, &transmits, self.cursor);
            self.spare = recycle(transmits);
            match sent {
                Ok(_) => {
                    c.transmits += self.runs.len() as u64;
                    c.multi_packet_runs += self.runs.iter().filter(|r| r.packets > 1).count() as u64;
                    self.runs.clear();
                    self.cursor = SendCursor::default();
                }
                Err(e) => {
                    self.cursor = e.cursor();
                    match e.kind {
                        SendErrorKind::WouldBlock => {
                            c.send_blocked += 1;
                            return Flush::WouldBlock;
                        }
                        SendErrorKind::NoBuffers => {
                            c.send_blocked += 1;
                            return Flush::NoBuffers;
                        }
                        _ => {
                            c.send_errors += 1;
                            log::warn!("udpx-quic: send failed, transmit skipped: {e}");
                            self.cursor = SendCursor { transmit: self.cursor.transmit + 1, segment: 0 };
                            if self.cursor.transmit >= self.runs.len() {
                                self.runs.clear();
                                self.cursor = SendCursor::default();
                            }
                        }
                    }
                }
            }
        }
        Flush::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(o: &mut Outbox, to: SocketAddr, len: usize) {
        o.space(len).unwrap();
        o.commit(0, to, None, len, None);
    }

    #[test]
    fn runs_group_equal_sizes_to_one_peer() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let mut o = Outbox::new();
        for len in [1350, 1350, 1350, 400, 1350, 1350] {
            push(&mut o, a, len);
        }
        push(&mut o, b, 1350);
        push(&mut o, b, 1400); // larger than the run's segment: a new run
        let got: Vec<(u16, usize, usize, usize)> =
            o.runs().iter().map(|r| (r.to.port(), r.len, r.seg, r.packets)).collect();
        assert_eq!(got, vec![(1, 3 * 1350 + 400, 1350, 4), (1, 2700, 1350, 2), (2, 1350, 1350, 1), (2, 1400, 1400, 1)]);
    }

    #[test]
    fn runs_stop_at_the_segment_limit_and_the_largest_payload() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut o = Outbox::new();
        for _ in 0..MAX_RUN_SEGMENTS + 1 {
            push(&mut o, a, 1000);
        }
        assert_eq!(o.runs().iter().map(|r| r.packets).collect::<Vec<_>>(), vec![64, 1]);
        let mut o = Outbox::new();
        for _ in 0..40 {
            push(&mut o, a, 1700); // 38 * 1700 > 65507
        }
        assert!(o.runs().iter().all(|r| r.len <= udpx::MAX_PAYLOAD_V4));
        assert_eq!(o.runs().iter().map(|r| r.packets).sum::<usize>(), 40);
    }

    #[test]
    fn full_outbox_refuses_space() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut o = Outbox::new();
        let mut n = 0;
        while o.space(1500).is_some() {
            o.commit(0, a, None, 1500, None);
            n += 1;
        }
        assert_eq!(n, OUTBOX_BYTES / 1500);
    }

    #[test]
    fn flushes_reuse_one_transmit_list() {
        let (rx, rx2) =
            (std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let tx = udpx::UdpSocket::builder("127.0.0.1:0".parse().unwrap()).nonblocking(true).bind().unwrap();
        let (to, other) = (rx.local_addr().unwrap(), rx2.local_addr().unwrap());
        let mut o = Outbox::new();
        let mut c = HostCounters::default();
        let mut capacity = None;
        for _ in 0..3 {
            // Two peers: two runs, a list of two transmits.
            push(&mut o, to, 1200);
            push(&mut o, other, 700);
            assert_eq!(o.flush(&tx, &mut c), Flush::Done);
            assert!(o.spare.is_empty());
            let cap = o.spare.capacity();
            assert!(cap >= 2, "the list's allocation is kept: capacity {cap}");
            // The same allocation every time: the capacity never changes once grown.
            assert_eq!(*capacity.get_or_insert(cap), cap);
        }
        assert_eq!(c.transmits, 6);
    }

    #[test]
    fn io_mode_names_round_trip() {
        for m in IoMode::ALL {
            assert_eq!(m.name().parse::<IoMode>(), Ok(m));
        }
        assert!("gso-sendmmsg".parse::<IoMode>().unwrap_err().contains("gso-mmsg"));
    }
}
