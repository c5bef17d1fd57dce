//! What `udpx stream` puts in its datagrams. Pure code, table-tested; every parse of network
//! bytes returns `None` rather than panic.
//!
//! A flow starts only for a client that can receive at the address it sends from, and goes on
//! only while it keeps saying so (see [`crate::server`]):
//!
//! ```text
//!  client                                   server
//!  Request (64 B, no cookie)        ──►
//!                                   ◄──     Cookie (28 B): a MAC of the client's address, port
//!                                           and a coarse time; nothing else, no state kept
//!  Request (64 B, with the cookie)  ──►     valid: the flow starts
//!                                   ◄──     Accepted (20 B): the flow's secret
//!                                   ◄──     Data (size B each): the secret in every one
//!  Keepalive (20 B, the secret)     ──►     every 2 s; none for 10 s ends the flow
//!                                   ◄──     End (28 B): how many datagrams the flow sent
//! ```
//!
//! Nothing the server sends before the cookie comes back is larger than the request it
//! answers (the Cookie is 28 bytes, a Refused is cut to the request's length), so a forged
//! request buys its victim at most its own size in bytes.
//!
//! ```text
//!  offset  0       4     5      6         8       12
//!          ├ magic ┼ ver ┼ kind ┼ reserved┼ flow  ┼ (by kind) ...
//!  Request   1       2     1               u32     size u32, rate u64, interval ns u64,
//!                                                  segments u32 (0 = auto), burst u32,
//!                                                  duration ms u32, reserved u32,
//!                                                  cookie 16 B at 48 (zeros: none)   = 64 B
//!  Cookie    1       2     6               u32     cookie 16 B                       = 28 B
//!  Accepted  1       2     5               u32     secret u64                        = 20 B
//!  Data      1       2     2               u32     secret u64 at 12, size u32, seq u64,
//!                                                  intended ns u64, sent ns u64,
//!                                                  rate u64 (B/s)                    = 56 B header
//!  Keepalive 1       2     7               u32     secret u64                        = 20 B
//!  End       1       2     3               u32     secret u64, count u64             = 28 B
//!  Refused   1       2     4               u32     a UTF-8 reason to the end of the datagram
//! ```
//!
//! All integers big-endian. The secret sits at bytes 12-19 of every Data datagram, where an
//! ICMP error that quotes more than the UDP header (Linux and most routers quote up to 576
//! bytes of the packet) carries it back: the server believes a "port unreachable" about a
//! flow only if its quote holds the flow's secret. Times are ns of `CLOCK_MONOTONIC` on the
//! *server*: `intended` is the departure the pacer scheduled, `sent` the clock read when the
//! release was handed to the kernel, so `sent - intended` is the departure error whatever the
//! receiver's clock. A Data datagram is `size` bytes long, header first, filler after; the
//! smallest is [`HEADER`].

/// "UDXS".
pub const MAGIC: u32 = 0x5544_5853;
/// Format version: 2 added the cookie, the secret and the keepalive.
pub const VERSION: u8 = 2;
/// Data header bytes, and the smallest datagram a flow may use.
pub const HEADER: usize = 56;
/// A request's length: a shorter one is refused unread, so that no answer is larger.
pub const REQUEST_LEN: usize = 64;
/// Bytes of a cookie.
pub const COOKIE_LEN: usize = 16;
/// Longest refusal reason sent (less when the request was shorter than 12 + this).
pub const MAX_REASON: usize = REQUEST_LEN - 12;
/// Where the secret sits in a Data datagram (and in an ICMP error's quote of one).
pub const SECRET_AT: usize = 12;

/// A cookie: the server's proof that a request came from the address it names.
pub type Cookie = [u8; COOKIE_LEN];

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
    /// The server's answer to a request without a valid cookie.
    Cookie,
    /// A client still wants its flow.
    Keepalive,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Request => 1,
            Kind::Data => 2,
            Kind::End => 3,
            Kind::Refused => 4,
            Kind::Accepted => 5,
            Kind::Cookie => 6,
            Kind::Keepalive => 7,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Request,
            2 => Kind::Data,
            3 => Kind::End,
            4 => Kind::Refused,
            5 => Kind::Accepted,
            6 => Kind::Cookie,
            7 => Kind::Keepalive,
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
    /// The cookie the server gave this address (`None` on the first request).
    pub cookie: Option<Cookie>,
}

/// One data datagram's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Data {
    /// The client's flow number.
    pub flow: u32,
    /// The flow's secret (the client echoes it in its keepalives).
    pub secret: u64,
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
        /// The flow's secret.
        secret: u64,
        /// Datagrams the server sent on the flow.
        count: u64,
    },
    /// A request was taken: the flow streams.
    Accepted {
        /// The client's flow number.
        flow: u32,
        /// The flow's secret.
        secret: u64,
    },
    /// Ask again with this cookie.
    Cookie {
        /// The client's flow number.
        flow: u32,
        /// The cookie.
        cookie: Cookie,
    },
    /// The client still wants flow `flow`.
    Keepalive {
        /// The client's flow number.
        flow: u32,
        /// The flow's secret, as the client learned it.
        secret: u64,
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

/// Writes a request into the first [`REQUEST_LEN`] bytes of `buf` and returns that length.
pub fn write_request(buf: &mut [u8], r: &Request) -> usize {
    put_head(buf, Kind::Request, r.flow);
    buf[12..16].copy_from_slice(&r.size.to_be_bytes());
    buf[16..24].copy_from_slice(&r.rate.to_be_bytes());
    buf[24..32].copy_from_slice(&r.interval_ns.to_be_bytes());
    buf[32..36].copy_from_slice(&r.segments.to_be_bytes());
    buf[36..40].copy_from_slice(&r.burst.to_be_bytes());
    buf[40..44].copy_from_slice(&r.duration_ms.to_be_bytes());
    buf[44..48].fill(0);
    buf[48..64].copy_from_slice(&r.cookie.unwrap_or([0; COOKIE_LEN]));
    REQUEST_LEN
}

/// Writes a data header into the first [`HEADER`] bytes of `buf`.
pub fn write_data(buf: &mut [u8], d: &Data) {
    put_head(buf, Kind::Data, d.flow);
    buf[12..20].copy_from_slice(&d.secret.to_be_bytes());
    buf[20..24].copy_from_slice(&d.size.to_be_bytes());
    buf[24..32].copy_from_slice(&d.seq.to_be_bytes());
    buf[32..40].copy_from_slice(&d.intended_ns.to_be_bytes());
    buf[40..48].copy_from_slice(&d.sent_ns.to_be_bytes());
    buf[48..56].copy_from_slice(&d.rate.to_be_bytes());
}

/// Writes an end-of-flow datagram and returns its length (28 bytes).
pub fn write_end(buf: &mut [u8], flow: u32, secret: u64, count: u64) -> usize {
    put_head(buf, Kind::End, flow);
    buf[12..20].copy_from_slice(&secret.to_be_bytes());
    buf[20..28].copy_from_slice(&count.to_be_bytes());
    28
}

/// Writes a refusal of at most `max_len` bytes in all (the length of the request it answers:
/// never larger), the reason cut at a character boundary, and returns its length.
pub fn write_refused(buf: &mut [u8], flow: u32, reason: &str, max_len: usize) -> usize {
    put_head(buf, Kind::Refused, flow);
    let room = max_len.clamp(12, 12 + MAX_REASON).min(buf.len()) - 12;
    let mut end = reason.len().min(room);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    buf[12..12 + end].copy_from_slice(&reason.as_bytes()[..end]);
    12 + end
}

/// Writes an acceptance and returns its length (20 bytes).
pub fn write_accepted(buf: &mut [u8], flow: u32, secret: u64) -> usize {
    put_head(buf, Kind::Accepted, flow);
    buf[12..20].copy_from_slice(&secret.to_be_bytes());
    20
}

/// Writes a cookie answer and returns its length (28 bytes).
pub fn write_cookie(buf: &mut [u8], flow: u32, cookie: &Cookie) -> usize {
    put_head(buf, Kind::Cookie, flow);
    buf[12..28].copy_from_slice(cookie);
    28
}

/// Writes a keepalive and returns its length (20 bytes).
pub fn write_keepalive(buf: &mut [u8], flow: u32, secret: u64) -> usize {
    put_head(buf, Kind::Keepalive, flow);
    buf[12..20].copy_from_slice(&secret.to_be_bytes());
    20
}

/// The secret in the quoted start of a Data datagram (what an ICMP error carries back), if
/// the quote is long enough and is one.
pub fn quoted_secret(quote: &[u8]) -> Option<u64> {
    if quote.len() < SECRET_AT + 8 || u32_at(quote, 0) != MAGIC || quote[4] != VERSION || quote[5] != Kind::Data.code()
    {
        return None;
    }
    Some(u64_at(quote, SECRET_AT))
}

/// Parses a datagram; `None` for anything that is not a well-formed `udpx stream` message.
pub fn parse(b: &[u8]) -> Option<Message<'_>> {
    if b.len() < 12 || u32_at(b, 0) != MAGIC || b[4] != VERSION {
        return None;
    }
    let kind = Kind::from_code(b[5])?;
    let flow = u32_at(b, 8);
    let need = match kind {
        Kind::Refused => 12,
        Kind::Accepted | Kind::Keepalive => 20,
        Kind::End | Kind::Cookie => 28,
        Kind::Data => HEADER,
        Kind::Request => REQUEST_LEN,
    };
    if b.len() < need {
        return None;
    }
    Some(match kind {
        Kind::Refused => {
            let reason = std::str::from_utf8(&b[12..b.len().min(12 + MAX_REASON)]).ok()?;
            Message::Refused { flow, reason }
        }
        Kind::Accepted => Message::Accepted { flow, secret: u64_at(b, 12) },
        Kind::Keepalive => Message::Keepalive { flow, secret: u64_at(b, 12) },
        Kind::Cookie => Message::Cookie { flow, cookie: b[12..28].try_into().expect("16 bytes") },
        Kind::End => Message::End { flow, secret: u64_at(b, 12), count: u64_at(b, 20) },
        Kind::Request => {
            let cookie: Cookie = b[48..64].try_into().expect("16 bytes");
            Message::Request(Request {
                flow,
                size: u32_at(b, 12),
                rate: u64_at(b, 16),
                interval_ns: u64_at(b, 24),
                segments: u32_at(b, 32),
                burst: u32_at(b, 36),
                duration_ms: u32_at(b, 40),
                cookie: (cookie != [0; COOKIE_LEN]).then_some(cookie),
            })
        }
        Kind::Data => {
            let size = u32_at(b, 20);
            if size as usize != b.len() {
                return None;
            }
            Message::Data(Data {
                flow,
                secret: u64_at(b, 12),
                size,
                seq: u64_at(b, 24),
                intended_ns: u64_at(b, 32),
                sent_ns: u64_at(b, 40),
                rate: u64_at(b, 48),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut b = [0u8; 1200];
        for cookie in [None, Some([7u8; COOKIE_LEN])] {
            let r = Request {
                flow: 7,
                size: 1200,
                rate: 4000,
                interval_ns: 0,
                segments: 2,
                burst: 0,
                duration_ms: 60_000,
                cookie,
            };
            let n = write_request(&mut b, &r);
            assert_eq!(n, REQUEST_LEN);
            assert_eq!(parse(&b[..n]), Some(Message::Request(r)));
        }

        let d = Data { flow: 9, secret: 0xfeed, size: 1200, seq: 1 << 40, intended_ns: 5, sent_ns: 6, rate: 1_000_000 };
        write_data(&mut b, &d);
        assert_eq!(parse(&b), Some(Message::Data(d)));
        assert_eq!(quoted_secret(&b[..20]), Some(0xfeed), "an ICMP quote of 20 bytes holds the secret");
        assert_eq!(quoted_secret(&b[..19]), None, "a shorter quote does not");
        assert_eq!(quoted_secret(&[]), None, "nor the 8 bytes of UDP header alone (an empty payload quote)");

        let n = write_end(&mut b, 3, 11, 42);
        assert_eq!(parse(&b[..n]), Some(Message::End { flow: 3, secret: 11, count: 42 }));

        let n = write_accepted(&mut b, 5, 99);
        assert_eq!(parse(&b[..n]), Some(Message::Accepted { flow: 5, secret: 99 }));

        let n = write_keepalive(&mut b, 5, 99);
        assert_eq!(parse(&b[..n]), Some(Message::Keepalive { flow: 5, secret: 99 }));

        let n = write_cookie(&mut b, 6, &[3; COOKIE_LEN]);
        assert_eq!(parse(&b[..n]), Some(Message::Cookie { flow: 6, cookie: [3; COOKIE_LEN] }));

        let n = write_refused(&mut b, 4, "rate too high", REQUEST_LEN);
        assert_eq!(parse(&b[..n]), Some(Message::Refused { flow: 4, reason: "rate too high" }));
    }

    /// Before a client proves its address, nothing the server sends is larger than what it
    /// answers: a full request.
    #[test]
    fn unvalidated_answers_are_no_larger_than_the_request() {
        let mut b = [0u8; 512];
        assert!(write_cookie(&mut b, 1, &[0; COOKIE_LEN]) <= REQUEST_LEN);
        assert!(write_refused(&mut b, 1, &"x".repeat(500), REQUEST_LEN) <= REQUEST_LEN);
        assert_eq!(write_refused(&mut b, 1, &"x".repeat(500), 30), 30, "cut to the length it answers");
        assert_eq!(write_refused(&mut b, 1, "why", 0), 12, "never less than the head");
    }

    #[test]
    fn refusal_reason_is_cut_at_a_character_boundary() {
        let mut b = [0u8; 12 + MAX_REASON];
        let long = "é".repeat(MAX_REASON); // 2 bytes each
        let n = write_refused(&mut b, 1, &long, REQUEST_LEN);
        assert_eq!(n, 12 + MAX_REASON);
        match parse(&b[..n]) {
            Some(Message::Refused { reason, .. }) => assert_eq!(reason.len(), MAX_REASON),
            other => panic!("{other:?}"),
        }
        let n = write_refused(&mut b, 1, &format!("x{}", "é".repeat(MAX_REASON)), REQUEST_LEN);
        assert_eq!(n, 12 + MAX_REASON - 1, "a cut inside a character backs off to its start");
    }

    /// Garbage, truncation and lies are refused, never a panic.
    #[test]
    fn malformed() {
        let mut b = [0u8; 1200];
        let d = Data { flow: 1, secret: 2, size: 1200, seq: 0, intended_ns: 0, sent_ns: 0, rate: 1 };
        write_data(&mut b, &d);
        assert_eq!(parse(&b[..1199]), None, "length differs from the size field");
        assert_eq!(parse(&b[..40]), None, "shorter than the header");
        assert_eq!(parse(&[]), None);
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(parse(&bad), None, "magic");
        let mut bad = b;
        bad[4] = 1;
        assert_eq!(parse(&bad), None, "version 1 (no cookie) is not spoken any more");
        let mut bad = b;
        bad[5] = 9;
        assert_eq!(parse(&bad), None, "kind");
        let n = write_refused(&mut bad, 1, "ok", REQUEST_LEN);
        bad[12] = 0xff;
        assert_eq!(parse(&bad[..n]), None, "reason not UTF-8");
        let r = Request {
            flow: 1,
            size: 100,
            rate: 1,
            interval_ns: 0,
            segments: 0,
            burst: 0,
            duration_ms: 1,
            cookie: None,
        };
        let n = write_request(&mut b, &r);
        assert_eq!(parse(&b[..n - 1]), None, "a short request is not read (no answer larger than it)");
        for len in 0..64 {
            let _ = parse(&b[..len]);
        }
    }
}
