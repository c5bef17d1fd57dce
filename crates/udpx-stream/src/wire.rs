//! What `udpx stream` puts in its datagrams: a client's request, the data a flow carries, the
//! end of a flow, and a refusal. Pure code, table-tested; every parse of network bytes returns
//! `None` rather than panic.
//!
//! ```text
//!  offset  0       4     5      6         8       12        16        24          32        40      48
//!          ├ magic ┼ ver ┼ kind ┼ reserved┼ flow  ┼ (kind) ──┼ (kind) ──┼ (kind) ────┼ (kind) ──┼(kind)─┤
//!  Data              1     2               u32     size u32  seq u64   intended    sent u64  rate u64
//!                                                                      u64 (ns)    (ns)      (B/s)
//!  End               1     3               u32     0         count u64 (datagrams of the flow sent)
//!  Request           1     1               u32     size u32  rate u64  interval    segments  burst u32
//!                                                                      u64 (ns)    u32,      duration
//!                                                                                  0 = auto  ms u32
//!  Refused           1     4               u32     then a UTF-8 reason to the end of the datagram
//!  Accepted          1     5               u32     (12 bytes in all)
//! ```
//!
//! All integers big-endian. Times are ns of `CLOCK_MONOTONIC` on the *server*: `intended` is
//! the departure the pacer scheduled, `sent` the clock read when the release was handed to the
//! kernel, so `sent - intended` is the departure error whatever the receiver's clock. A Data
//! datagram is `size` bytes long, header first, filler after; the smallest is [`HEADER`].

/// "UDXS".
pub const MAGIC: u32 = 0x5544_5853;
/// Format version.
pub const VERSION: u8 = 1;
/// Header bytes, and the smallest datagram a flow may use.
pub const HEADER: usize = 48;
/// Longest refusal reason sent.
pub const MAX_REASON: usize = 200;

/// Kinds of datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A client asks for a flow.
    Request,
    /// A flow's data.
    Data,
    /// A flow ended: how many datagrams it sent.
    End,
    /// The server refused a request.
    Refused,
    /// The server took a request (sent for every copy of it, so a client stops asking).
    Accepted,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Request => 1,
            Kind::Data => 2,
            Kind::End => 3,
            Kind::Refused => 4,
            Kind::Accepted => 5,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Request,
            2 => Kind::Data,
            3 => Kind::End,
            4 => Kind::Refused,
            5 => Kind::Accepted,
            _ => return None,
        })
    }
}

/// A client's request for one flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The client's number for the flow (echoed in every datagram of it).
    pub flow: u32,
    /// Bytes per datagram (UDP payload), at least [`HEADER`].
    pub size: u32,
    /// Bytes per second.
    pub rate: u64,
    /// Release interval, ns; 0: use `segments`.
    pub interval_ns: u64,
    /// Datagrams per release; 0 with `interval_ns` 0: the server's default.
    pub segments: u32,
    /// Burst allowance, datagrams; 0: the pacer's default (twice the batch).
    pub burst: u32,
    /// How long the flow streams, ms.
    pub duration_ms: u32,
}

/// One data datagram's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Data {
    /// The client's flow number.
    pub flow: u32,
    /// Datagram size (the whole UDP payload).
    pub size: u32,
    /// Sequence number in the flow, from 0.
    pub seq: u64,
    /// Departure the pacer scheduled, ns.
    pub intended_ns: u64,
    /// When the server handed the release to the kernel, ns.
    pub sent_ns: u64,
    /// The flow's rate, bytes per second.
    pub rate: u64,
}

/// Any datagram `udpx stream` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// See [`Request`].
    Request(Request),
    /// See [`Data`].
    Data(Data),
    /// A flow ended after sending `count` datagrams.
    End {
        /// The client's flow number.
        flow: u32,
        /// Datagrams the server sent on the flow.
        count: u64,
    },
    /// A request was taken: the flow streams.
    Accepted {
        /// The client's flow number.
        flow: u32,
    },
    /// A request was refused.
    Refused {
        /// The client's flow number.
        flow: u32,
        /// Why, for a person.
        reason: &'a str,
    },
}

fn put_head(buf: &mut [u8], kind: Kind, flow: u32) {
    buf[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    buf[4] = VERSION;
    buf[5] = kind.code();
    buf[6..8].fill(0);
    buf[8..12].copy_from_slice(&flow.to_be_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Writes a request into the first [`HEADER`] bytes of `buf` (which must be that long) and
/// returns its length.
pub fn write_request(buf: &mut [u8], r: &Request) -> usize {
    put_head(buf, Kind::Request, r.flow);
    buf[12..16].copy_from_slice(&r.size.to_be_bytes());
    buf[16..24].copy_from_slice(&r.rate.to_be_bytes());
    buf[24..32].copy_from_slice(&r.interval_ns.to_be_bytes());
    buf[32..36].copy_from_slice(&r.segments.to_be_bytes());
    buf[36..40].copy_from_slice(&r.burst.to_be_bytes());
    buf[40..44].copy_from_slice(&r.duration_ms.to_be_bytes());
    buf[44..48].fill(0);
    HEADER
}

/// Writes a data header into the first [`HEADER`] bytes of `buf`.
pub fn write_data(buf: &mut [u8], d: &Data) {
    put_head(buf, Kind::Data, d.flow);
    buf[12..16].copy_from_slice(&d.size.to_be_bytes());
    buf[16..24].copy_from_slice(&d.seq.to_be_bytes());
    buf[24..32].copy_from_slice(&d.intended_ns.to_be_bytes());
    buf[32..40].copy_from_slice(&d.sent_ns.to_be_bytes());
    buf[40..48].copy_from_slice(&d.rate.to_be_bytes());
}

/// Writes an end-of-flow datagram and returns its length.
pub fn write_end(buf: &mut [u8], flow: u32, count: u64) -> usize {
    put_head(buf, Kind::End, flow);
    buf[12..16].fill(0);
    buf[16..24].copy_from_slice(&count.to_be_bytes());
    buf[24..48].fill(0);
    HEADER
}

/// Writes a refusal (the reason cut to [`MAX_REASON`] bytes at a character boundary) and
/// returns its length. `buf` must hold `12 + MAX_REASON` bytes.
pub fn write_refused(buf: &mut [u8], flow: u32, reason: &str) -> usize {
    put_head(buf, Kind::Refused, flow);
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    buf[12..12 + end].copy_from_slice(&reason.as_bytes()[..end]);
    12 + end
}

/// Writes an acceptance and returns its length (12 bytes).
pub fn write_accepted(buf: &mut [u8], flow: u32) -> usize {
    put_head(buf, Kind::Accepted, flow);
    12
}

/// Parses a datagram; `None` for anything that is not a well-formed `udpx stream` message.
pub fn parse(b: &[u8]) -> Option<Message<'_>> {
    if b.len() < 12 || u32_at(b, 0) != MAGIC || b[4] != VERSION {
        return None;
    }
    let kind = Kind::from_code(b[5])?;
    let flow = u32_at(b, 8);
    if kind == Kind::Refused {
        let reason = std::str::from_utf8(&b[12..b.len().min(12 + MAX_REASON)]).ok()?;
        return Some(Message::Refused { flow, reason });
    }
    if kind == Kind::Accepted {
        return Some(Message::Accepted { flow });
    }
    if b.len() < HEADER {
        return None;
    }
    Some(match kind {
        Kind::Request => Message::Request(Request {
            flow,
            size: u32_at(b, 12),
            rate: u64_at(b, 16),
            interval_ns: u64_at(b, 24),
            segments: u32_at(b, 32),
            burst: u32_at(b, 36),
            duration_ms: u32_at(b, 40),
        }),
        Kind::Data => {
            let size = u32_at(b, 12);
            if size as usize != b.len() {
                return None;
            }
            Message::Data(Data {
                flow,
                size,
                seq: u64_at(b, 16),
                intended_ns: u64_at(b, 24),
                sent_ns: u64_at(b, 32),
                rate: u64_at(b, 40),
            })
        }
        Kind::End => Message::End { flow, count: u64_at(b, 16) },
        Kind::Refused | Kind::Accepted => unreachable!("handled above"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut b = [0u8; 1200];
        let r = Request { flow: 7, size: 1200, rate: 4000, interval_ns: 0, segments: 2, burst: 0, duration_ms: 60_000 };
        let n = write_request(&mut b, &r);
        assert_eq!(parse(&b[..n]), Some(Message::Request(r)));

        let d = Data { flow: 9, size: 1200, seq: 1 << 40, intended_ns: 5, sent_ns: 6, rate: 1_000_000 };
        write_data(&mut b, &d);
        assert_eq!(parse(&b), Some(Message::Data(d)));

        let n = write_end(&mut b, 3, 42);
        assert_eq!(parse(&b[..n]), Some(Message::End { flow: 3, count: 42 }));

        let n = write_accepted(&mut b, 5);
        assert_eq!(parse(&b[..n]), Some(Message::Accepted { flow: 5 }));

        let n = write_refused(&mut b, 4, "rate too high");
        assert_eq!(parse(&b[..n]), Some(Message::Refused { flow: 4, reason: "rate too high" }));
    }

    #[test]
    fn refusal_reason_is_cut_at_a_character_boundary() {
        let mut b = [0u8; 12 + MAX_REASON];
        let long = "é".repeat(MAX_REASON); // 2 bytes each
        let n = write_refused(&mut b, 1, &long);
        assert_eq!(n, 12 + MAX_REASON);
        match parse(&b[..n]) {
            Some(Message::Refused { reason, .. }) => assert_eq!(reason.len(), MAX_REASON),
            other => panic!("{other:?}"),
        }
        let n = write_refused(&mut b, 1, &format!("x{}", "é".repeat(MAX_REASON)));
        assert_eq!(n, 12 + MAX_REASON - 1, "a cut inside a character backs off to its start");
    }

    /// Garbage, truncation and lies are refused, never a panic.
    #[test]
    fn malformed() {
        let mut b = [0u8; 1200];
        let d = Data { flow: 1, size: 1200, seq: 0, intended_ns: 0, sent_ns: 0, rate: 1 };
        write_data(&mut b, &d);
        assert_eq!(parse(&b[..1199]), None, "length differs from the size field");
        assert_eq!(parse(&b[..40]), None, "shorter than the header");
        assert_eq!(parse(&[]), None);
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(parse(&bad), None, "magic");
        let mut bad = b;
        bad[4] = 2;
        assert_eq!(parse(&bad), None, "version");
        let mut bad = b;
        bad[5] = 9;
        assert_eq!(parse(&bad), None, "kind");
        let n = write_refused(&mut bad, 1, "ok");
        bad[12] = 0xff;
        assert_eq!(parse(&bad[..n]), None, "reason not UTF-8");
        for len in 0..64 {
            let _ = parse(&b[..len]);
        }
    }
}
