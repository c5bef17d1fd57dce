//! The request format of `udpx echo`: sockperf's ping-pong message, so the same load generator
//! drives udpx's server and sockperf's (an independent peer) and the table compares like with
//! like.
//!
//! ```text
//!  0          8        10         14          22        26                     len
//!  ├─ seq ────┼─ flags ┼─ length ─┼─ sent ────┼─ flow ──┼─ padding ──────────────┤
//!    u64 BE     u16 BE   u32 BE     u64 LE      u32 LE
//!    └──────── sockperf's header ─┘ └── udpx's payload: send time (ns, CLOCK_MONOTONIC
//!                                       of the generator) and flow number ──┘
//! ```
//!
//! Flags: 0x0001 "from a client", 0x0002 "reply wanted". A request carries both (0x0003); the
//! server sends the whole message back with 0x0001 cleared (0x0002), as sockperf 3.7's server
//! does (verified against the installed binary). `length` must equal the datagram's size. The
//! reply is never larger than the request: no amplification. Anything else is malformed: the
//! server counts it and does not answer.

/// sockperf's header.
pub const SOCKPERF_HEADER: usize = 14;
/// Bytes of header including udpx's timestamp and flow; also the smallest request.
pub const HEADER: usize = 26;
/// Flag: sent by a client.
pub const FLAG_CLIENT: u16 = 0x0001;
/// Flag: a reply is wanted.
pub const FLAG_PONG: u16 = 0x0002;

/// A parsed request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Sequence number within the flow.
    pub seq: u64,
    /// Send time, ns of CLOCK_MONOTONIC.
    pub sent_ns: u64,
    /// Which flow (socket) of the generator sent it.
    pub flow: u32,
}

/// Writes a request (flags 0x0003, length = `buf.len()`) into `buf`, at least [`HEADER`] long.
pub fn write(buf: &mut [u8], r: Request) {
    let len = buf.len() as u32;
    buf[0..8].copy_from_slice(&r.seq.to_be_bytes());
    buf[8..10].copy_from_slice(&(FLAG_CLIENT | FLAG_PONG).to_be_bytes());
    buf[10..14].copy_from_slice(&len.to_be_bytes());
    buf[14..22].copy_from_slice(&r.sent_ns.to_le_bytes());
    buf[22..26].copy_from_slice(&r.flow.to_le_bytes());
}

fn flags(buf: &[u8]) -> u16 {
    u16::from_be_bytes([buf[8], buf[9]])
}

fn length_ok(buf: &[u8]) -> bool {
    u32::from_be_bytes([buf[10], buf[11], buf[12], buf[13]]) as usize == buf.len()
}

/// Whether `buf` is a request the server must answer: a whole sockperf message asking for a
/// reply.
pub fn is_request(buf: &[u8]) -> bool {
    buf.len() >= SOCKPERF_HEADER && flags(buf) & (FLAG_CLIENT | FLAG_PONG) == FLAG_CLIENT | FLAG_PONG && length_ok(buf)
}

/// Turns a request into its reply in place (clears the client flag), as sockperf does.
pub fn make_reply(buf: &mut [u8]) {
    let f = flags(buf) & !FLAG_CLIENT;
    buf[8..10].copy_from_slice(&f.to_be_bytes());
}

/// Parses a reply as the generator sees it; `None` for anything that is not a whole reply
/// carrying udpx's payload.
pub fn parse_reply(buf: &[u8]) -> Option<Request> {
    if buf.len() < HEADER || !length_ok(buf) || flags(buf) & (FLAG_CLIENT | FLAG_PONG) != FLAG_PONG {
        return None;
    }
    let seq = u64::from_be_bytes(buf[0..8].try_into().ok()?);
    let sent_ns = u64::from_le_bytes(buf[14..22].try_into().ok()?);
    let flow = u32::from_le_bytes(buf[22..26].try_into().ok()?);
    Some(Request { seq, sent_ns, flow })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_reply_round_trip_and_malformed() {
        let mut b = vec![0u8; 100];
        let r = Request { seq: 7, sent_ns: 123_456, flow: 3 };
        write(&mut b, r);
        // sockperf's bytes for seq 7, 100 bytes: 0000000000000007 0003 00000064.
        assert_eq!(&b[..14], &[0, 0, 0, 0, 0, 0, 0, 7, 0, 3, 0, 0, 0, 0x64]);
        assert!(is_request(&b));
        assert_eq!(parse_reply(&b), None, "a request is not a reply");
        make_reply(&mut b);
        assert_eq!(&b[8..10], &[0, 2]);
        assert_eq!(parse_reply(&b), Some(r));
        assert!(!is_request(&b), "a reply is not answered again");
        // Truncated: the length field no longer matches.
        let mut c = vec![0u8; 100];
        write(&mut c, r);
        assert!(!is_request(&c[..60]));
        assert!(!is_request(&c[..10]));
        // No reply wanted.
        c[9] = 0x01;
        assert!(!is_request(&c));
        assert!(!is_request(&[]));
    }
}
