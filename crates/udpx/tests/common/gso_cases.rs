//! The kernel's UDP GSO edge cases as a named table, written from the documented rules
//! (the udpgso paper and `UDP_SEGMENT` semantics): segment size 1, exact multiples, a short
//! last segment, payload at or below the segment size, the segment limit and one past it,
//! the payload ceilings, and MTU boundaries. Each runs three ways: pure planning, over
//! loopback, and over a veth pair at MTU 1500 (tests/veth.rs).
#![allow(dead_code)]

use std::net::SocketAddr;

use udpx::{messages, validate_transmit, Family, InvalidTransmit, PathLimits, SendErrorKind, Transmit, UdpSocket};

use super::{payload, receive, Received};

/// What should happen.
#[derive(Debug, Clone)]
pub enum Expect {
    /// Sent as these messages: (bytes, segments, UDP_SEGMENT).
    Sent(Vec<(usize, usize, Option<usize>)>),
    /// Refused before sending.
    Invalid(fn(&InvalidTransmit) -> bool),
    /// Larger than the path allows: refused by validation (connected, MTU known) or by the
    /// kernel with EMSGSIZE (unconnected) — a typed error either way.
    TooBigForPath,
}

#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    pub v6: bool,
    pub seg: Option<usize>,
    pub len: usize,
    /// Only meaningful on a path with MTU 1500 (the veth); skipped on loopback.
    pub mtu1500_only: bool,
    /// Only on a path whose MTU exceeds 64 KiB (loopback): a plain datagram that large is
    /// refused (PMTU probe mode sets DF) where the MTU is 1500.
    pub big_mtu_only: bool,
    pub expect: Expect,
}

/// The table, for a kernel limit of `max` segments.
pub fn cases(max: usize) -> Vec<Case> {
    let c = |name, v6, seg, len, expect| Case { name, v6, seg, len, mtu1500_only: false, big_mtu_only: false, expect };
    let mtu = |name, v6, seg, len, expect| Case { name, v6, seg, len, mtu1500_only: true, big_mtu_only: false, expect };
    let big = |name, v6, seg, len, expect| Case { name, v6, seg, len, mtu1500_only: false, big_mtu_only: true, expect };
    use Expect::*;
    let plain = |n| Sent(vec![(n, 1, None)]);
    vec![
        c("seg 1, 1 byte: one plain datagram", false, Some(1), 1, plain(1)),
        c("seg 1, 2 bytes", false, Some(1), 2, Sent(vec![(2, 2, Some(1))])),
        c("seg 1, max segments", false, Some(1), max, Sent(vec![(max, max, Some(1))])),
        c(
            "seg 1, max + 1 segments",
            false,
            Some(1),
            max + 1,
            Invalid(|e| matches!(e, InvalidTransmit::TooManySegments { .. })),
        ),
        c("exact multiple", false, Some(1000), 4000, Sent(vec![(4000, 4, Some(1000))])),
        c("short last segment", false, Some(1000), 3100, Sent(vec![(3100, 4, Some(1000))])),
        c("last segment of 1 byte", false, Some(1000), 1001, Sent(vec![(1001, 2, Some(1000))])),
        c("payload equal to segment size: plain", false, Some(1000), 1000, plain(1000)),
        c("payload smaller than segment size: plain", false, Some(1000), 10, plain(10)),
        c("zero-length datagram", false, None, 0, plain(0)),
        c("zero-length with a segment size", false, Some(100), 0, plain(0)),
        c("segment size 0", false, Some(0), 100, Invalid(|e| matches!(e, InvalidTransmit::SegmentSizeZero))),
        c("IPv4 payload ceiling 65507", false, Some(1400), 65507, Sent(vec![(65507, 47, Some(1400))])),
        c(
            "IPv4 ceiling + 1",
            false,
            Some(1400),
            65508,
            Invalid(|e| matches!(e, InvalidTransmit::PayloadTooLarge { max: 65507, .. })),
        ),
        big("IPv4 plain datagram at ceiling", false, None, 65507, plain(65507)),
        c(
            "IPv4 plain datagram over ceiling",
            false,
            None,
            65508,
            Invalid(|e| matches!(e, InvalidTransmit::PayloadTooLarge { .. })),
        ),
        c("IPv6 payload ceiling 65527", true, Some(1400), 65527, Sent(vec![(65527, 47, Some(1400))])),
        c(
            "IPv6 ceiling + 1",
            true,
            Some(1400),
            65528,
            Invalid(|e| matches!(e, InvalidTransmit::PayloadTooLarge { max: 65527, .. })),
        ),
        c("IPv6 exact multiple", true, Some(1232), 1232 * 10, Sent(vec![(12320, 10, Some(1232))])),
        mtu("IPv4 segment = MTU - 28", false, Some(1472), 1472 * 3, Sent(vec![(4416, 3, Some(1472))])),
        mtu("IPv4 segment = MTU - 27", false, Some(1473), 1473 * 3, TooBigForPath),
        mtu("IPv6 segment = MTU - 48", true, Some(1452), 1452 * 3, Sent(vec![(4356, 3, Some(1452))])),
        mtu("IPv6 segment = MTU - 47", true, Some(1453), 1453 * 3, TooBigForPath),
        mtu("IPv4 plain datagram over MTU", false, None, 1473, TooBigForPath),
    ]
}

/// Contents of a case: the segments, each verifiable.
pub fn contents(case: &Case) -> (Vec<u8>, Vec<Vec<u8>>) {
    let segs: Vec<Vec<u8>> = match case.seg {
        Some(s) if s > 0 && case.len > s => {
            let n = case.len.div_ceil(s);
            (0..n).map(|i| payload(i as u32, if i + 1 == n { case.len - s * (n - 1) } else { s })).collect()
        }
        _ => vec![payload(0, case.len)],
    };
    (segs.concat(), segs)
}

/// Pure planning: validation and the messages udpx would build (GSO on).
pub fn check_plan(case: &Case, max: usize, family: Family) {
    let (data, _) = contents(case);
    let dst: SocketAddr = if case.v6 { "[2001:db8::2]:9".parse().unwrap() } else { "192.0.2.2:9".parse().unwrap() };
    let t = Transmit { segment_size: case.seg, ..Transmit::new(dst, &data) };
    let limits = PathLimits { family, path_mtu: None, max_segments: Some(max) };
    let v = validate_transmit(&t, &limits, false);
    match &case.expect {
        Expect::Invalid(pred) => {
            assert!(matches!(&v, Err(e) if pred(e)), "{}: got {v:?}", case.name)
        }
        Expect::Sent(want) => {
            assert_eq!(v, Ok(()), "{}", case.name);
            let got: Vec<_> =
                messages(&t, true, max).into_iter().map(|m| (m.range.len(), m.segments, m.segment_size)).collect();
            assert_eq!(&got, want, "{}", case.name);
        }
        // Needs a path MTU: the planner alone has none, so it accepts.
        Expect::TooBigForPath => assert_eq!(v, Ok(()), "{}", case.name),
    }
}

/// Over real sockets: `tx` sends the case to `rx` (at `dst`) and the receiver checks every
/// byte, or the send must fail with the expected typed error.
pub fn check_socket(case: &Case, tx: &UdpSocket, rx: &UdpSocket, dst: SocketAddr) {
    let (data, segs) = contents(case);
    let t = Transmit { segment_size: case.seg, ..Transmit::new(dst, &data) };
    let res = tx.send(&[t]);
    match &case.expect {
        Expect::Sent(want) => {
            assert!(res.is_ok(), "{}: {:?}", case.name, res.err());
            let got: Received =
                receive(rx, segs.len(), std::time::Duration::from_millis(300), std::time::Duration::from_secs(3));
            super::assert_same(&segs, &got, case.name);
            let _ = want;
        }
        Expect::Invalid(pred) => {
            let e = res.expect_err(case.name);
            assert!(matches!(&e.kind, SendErrorKind::Invalid { reason, .. } if pred(reason)), "{}: {e}", case.name);
            assert_eq!(e.sent, 0);
        }
        Expect::TooBigForPath => {
            let e = res.expect_err(case.name);
            let ok = matches!(&e.kind, SendErrorKind::MessageTooLarge { .. })
                || matches!(&e.kind, SendErrorKind::Invalid { reason: InvalidTransmit::SegmentTooLarge { .. }, .. });
            assert!(ok, "{}: {e}", case.name);
            // Nothing of it arrived.
            let got = receive(rx, 1, std::time::Duration::from_millis(100), std::time::Duration::from_millis(300));
            assert_eq!(got.datagrams.len(), 0, "{}", case.name);
        }
    }
}
