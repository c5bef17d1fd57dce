//! The io_uring send backend over loopback: it is used when asked for (and says why not when
//! it cannot be), every send mode delivers every byte with one `io_uring_enter` per batch,
//! and a non-blocking socket's full queue answers WouldBlock instead of waiting. The fault and
//! loopback suites run a second time through it (`UDPX_TEST_IO_URING=1`, scripts/test.sh).

mod common;

use std::time::Duration;

use common::*;
use udpx::{Batch, SendBuffers, SendCursor, SendMode, UdpSocket, Want};

fn uring_usable(test: &str) -> bool {
    let probe = UdpSocket::builder(lo4()).io_uring(Want::IfAvailable).bind().unwrap();
    let caps = probe.capabilities();
    match caps.io_uring_off_reason {
        Some(why) => {
            skip(test, &why);
            false
        }
        None => {
            assert!(caps.io_uring, "asked for, available, so in use");
            true
        }
    }
}

#[test]
fn every_send_mode_delivers_every_byte_through_io_uring() {
    if !uring_usable("every_send_mode_delivers_every_byte_through_io_uring") {
        return;
    }
    for mode in SendMode::ALL {
        let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
        let tx = UdpSocket::builder(lo4()).send_mode(mode).io_uring(Want::Required).bind().unwrap();
        assert!(tx.capabilities().io_uring);
        assert!(tx.capabilities().to_string().contains("send backend   io_uring"));
        // 600 datagrams of mixed sizes: GSO runs, a shorter last segment, singles.
        let sent: Vec<Vec<u8>> = (0..600u32).map(|i| payload(i, [1200, 1200, 1200, 700, 64][i as usize % 5])).collect();
        let mut batch = Batch::for_socket(&tx);
        for d in &sent {
            batch.push(rx.local_addr(), d).unwrap();
        }
        let ts = batch.transmits();
        let mut bufs = SendBuffers::new();
        assert_eq!(tx.try_send(&mut bufs, &ts, SendCursor::default()).unwrap(), ts.len(), "{mode}");
        let got = receive(&rx, sent.len(), Duration::from_millis(300), Duration::from_secs(3));
        assert_same(&sent, &got, mode.name());
        let c = tx.counters();
        assert_eq!(c.datagrams_sent, sent.len() as u64, "{mode}");
        if mode.batches() {
            // Up to 64 messages per io_uring_enter, as per sendmmsg.
            assert!(c.send_calls < ts.len() as u64, "{mode}: {} calls for {} transmits", c.send_calls, ts.len());
        }
    }
}

/// A datagram the kernel refuses (larger than the path allows) fails the entry; the chain
/// after it is cancelled, the sends before it went: the same answer as sendmmsg.
#[test]
fn a_refused_message_stops_the_batch_where_sendmmsg_would() {
    if !uring_usable("a_refused_message_stops_the_batch_where_sendmmsg_would") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::Sendmmsg).io_uring(Want::Required).bind().unwrap();
    // loopback's MTU is 65536: a 65,507-byte datagram goes; IP_PMTUDISC_PROBE refuses none.
    // Instead: a connected-to-nothing destination port 0 is refused with EINVAL by udp_sendmsg.
    let good: Vec<Vec<u8>> = (0..5u32).map(|i| payload(i, 100)).collect();
    let mut ts: Vec<udpx::Transmit<'_>> = good.iter().map(|d| udpx::Transmit::new(rx.local_addr(), d)).collect();
    let bad_dst: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    ts.insert(3, udpx::Transmit::new(bad_dst, &good[0]));
    let mut bufs = SendBuffers::new();
    let e = tx.try_send(&mut bufs, &ts, SendCursor::default()).unwrap_err();
    assert_eq!(e.sent, 3, "the three before it went: {e}");
    // Resuming after the refused one sends the rest.
    let n = tx.try_send(&mut bufs, &ts, SendCursor { transmit: 4, segment: 0 }).unwrap();
    assert_eq!(n, ts.len());
    let got = receive(&rx, 5, Duration::from_millis(300), Duration::from_secs(2));
    assert_same(&good, &got, "around the refused one");
}

/// Asked for where it cannot be had: `Required` fails with the reason, `IfAvailable` says why.
#[test]
fn off_is_off_and_the_reason_is_reported() {
    let tx = UdpSocket::builder(lo4()).bind().unwrap();
    let c = tx.capabilities();
    assert!(!c.io_uring && c.io_uring_off_reason.is_none(), "default: system calls, nothing to explain");
    assert!(c.to_string().contains("send backend   system calls"));
}
