//! The io_uring send backend over loopback: it is used when asked for (and says why not when
//! it cannot be), every send mode delivers every byte with one `io_uring_enter` per batch,
//! and a non-blocking socket's full queue answers WouldBlock instead of waiting. The fault and
//! loopback suites run a second time through it (`UDPX_TEST_IO_URING=1`, scripts/test.sh).

#![cfg(feature = "io-uring")]

mod common;

use std::time::Duration;

use common::*;
use udpx::{Batch, SendBuffers, SendCursor, SendMode, UdpSocket, Want};

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

/// Receives through `r` until `expect` datagrams or `limit`.
fn drain(
    r: &mut udpx::uring::UringReceiver<&UdpSocket>,
    expect: usize,
    limit: Duration,
) -> Vec<(udpx::RecvMeta, Vec<u8>)> {
    let start = std::time::Instant::now();
    let mut got = Vec::new();
    while got.len() < expect && start.elapsed() < limit {
        r.recv(Some(Duration::from_millis(20)), |m, d| got.push((*m, d.to_vec()))).unwrap();
    }
    got
}

#[test]
fn multishot_receive_delivers_every_datagram_with_its_sender() {
    if !uring_usable("multishot_receive_delivers_every_datagram_with_its_sender") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::Sendmmsg).bind().unwrap();
    let mut r = rx.uring_receiver(64, 2048).unwrap();
    let sent: Vec<Vec<u8>> = (0..1000u32).map(|i| payload(i, 100 + (i as usize % 900))).collect();
    let ts: Vec<udpx::Transmit<'_>> = sent.iter().map(|d| udpx::Transmit::new(rx.local_addr(), d)).collect();
    // Sent in pieces smaller than the ring, reaped in between: buffers are recycled many times.
    let mut got = Vec::new();
    for chunk in ts.chunks(50) {
        tx.send(chunk).unwrap();
        got.extend(drain(&mut r, chunk.len(), Duration::from_secs(2)).into_iter().map(|(m, d)| {
            assert_eq!(m.addr, tx.local_addr());
            assert!(!m.truncated);
            d
        }));
    }
    assert_eq!(got.len(), sent.len());
    assert_eq!(got, sent, "every datagram, in order, byte for byte");
    assert_eq!(r.stats().datagrams, 1000);
    assert_eq!(rx.counters().datagrams_received, 1000);
}

/// A receiver for one thread (`SINGLE_ISSUER | DEFER_TASKRUN`) delivers on its thread;
/// another thread's reap is refused, naming the owner, and the datagrams the ring has not
/// taken are there for that thread's `recvmsg`; back on its thread the ring goes on.
#[test]
fn a_one_thread_receiver_is_reaped_on_its_thread_only() {
    let test = "a_one_thread_receiver_is_reaped_on_its_thread_only";
    if !uring_usable(test) {
        return;
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::Sendmmsg).bind().unwrap();
    let mut r = udpx::uring::UringReceiver::for_this_thread(&rx, 64, 2048).unwrap();
    let Some(owner) = r.owner_thread() else {
        skip(test, "no DEFER_TASKRUN in this kernel: the ring is the shared kind");
        return;
    };
    assert_eq!(owner, std::thread::current().id());
    let send = |from: u32| {
        let sent: Vec<Vec<u8>> = (from..from + 100).map(|i| payload(i, 200)).collect();
        let ts: Vec<udpx::Transmit<'_>> = sent.iter().map(|d| udpx::Transmit::new(rx.local_addr(), d)).collect();
        tx.send(&ts).unwrap();
        sent
    };
    let sent = send(0);
    let got: Vec<Vec<u8>> = drain(&mut r, 100, Duration::from_secs(2)).into_iter().map(|(_, d)| d).collect();
    assert_eq!(got, sent, "on its thread, through the ring");

    let sent = send(100);
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            let e = r.recv(None, |_, _| panic!("delivered on another thread")).unwrap_err();
            assert!(e.to_string().contains("belongs to thread"), "{e}");
            receive(&rx, 100, Duration::from_millis(300), Duration::from_secs(3)).datagrams
        })
        .join()
        .unwrap()
    });
    assert_eq!(got, sent, "the other thread got them by recvmsg, in order");

    let sent = send(200);
    let got: Vec<Vec<u8>> = drain(&mut r, 100, Duration::from_secs(2)).into_iter().map(|(_, d)| d).collect();
    assert_eq!(got, sent, "back on its thread, through the ring");
    assert_eq!(r.stats().datagrams, 200);
}

#[test]
fn multishot_receive_splits_gro_buffers() {
    if !uring_usable("multishot_receive_splits_gro_buffers") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).gro(Want::Required).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::GsoSendmmsg).bind().unwrap();
    let mut r = rx.uring_receiver(16, udpx::GRO_BUFFER).unwrap();
    let sent: Vec<Vec<u8>> = (0..400u32).map(|i| payload(i, 1200)).collect();
    let mut batch = Batch::for_socket(&tx);
    for d in &sent {
        batch.push(rx.local_addr(), d).unwrap();
    }
    tx.send(&batch.transmits()).unwrap();
    let got = drain(&mut r, sent.len(), Duration::from_secs(2));
    let data: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
    assert_eq!(data, sent);
    assert!(rx.counters().gro_buffers_received > 0, "GRO buffers arrived and were split");
}

/// A ring of 2 buffers and 200 datagrams queued before anyone reaps: the receive runs out of
/// buffers (ENOBUFS, counted), is re-armed as buffers come back, and every datagram still
/// arrives (they waited in the socket's queue).
#[test]
fn an_empty_buffer_ring_is_refilled_and_counted_not_a_stall() {
    if !uring_usable("an_empty_buffer_ring_is_refilled_and_counted_not_a_stall") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::bind(lo4()).unwrap();
    let mut r = rx.uring_receiver(2, 1500).unwrap();
    r.recv(None, |_, _| {}).unwrap(); // armed, nothing yet
    let sent: Vec<Vec<u8>> = (0..200u32).map(|i| payload(i, 500)).collect();
    let ts: Vec<udpx::Transmit<'_>> = sent.iter().map(|d| udpx::Transmit::new(rx.local_addr(), d)).collect();
    tx.send(&ts).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let got: Vec<Vec<u8>> = drain(&mut r, sent.len(), Duration::from_secs(3)).into_iter().map(|(_, d)| d).collect();
    assert_eq!(got, sent, "nothing lost while the ring was empty");
    let s = r.stats();
    assert!(s.no_buffers >= 1, "the ring ran empty: {s:?}");
    assert!(s.rearms >= 1, "and the receive was armed again: {s:?}");
}

/// Reaped one buffer at a time (`recv_buffers(.., 1, ..)`, as an event loop with one slot
/// does) while more wait than the ring holds: every datagram arrives in order, and the ends of
/// the receive (ENOBUFS) are not held back with the datagrams: an earlier version queued them
/// behind the datagrams and re-armed into a ring whose every buffer was held, which ended the
/// receive again at every reap and grew the queue without end (a spinning task under tokio).
#[test]
fn reaped_one_at_a_time_past_an_empty_ring_everything_arrives() {
    if !uring_usable("reaped_one_at_a_time_past_an_empty_ring_everything_arrives") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::bind(lo4()).unwrap();
    let mut r = rx.uring_receiver(4, 1500).unwrap();
    r.arm().unwrap();
    let sent: Vec<Vec<u8>> = (0..64u32).map(|i| payload(i, 300)).collect();
    let ts: Vec<udpx::Transmit<'_>> = sent.iter().map(|d| udpx::Transmit::new(rx.local_addr(), d)).collect();
    tx.send(&ts).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut got = Vec::new();
    let mut reaps = 0;
    while got.len() < sent.len() && reaps < 1000 {
        reaps += 1;
        let k = r.recv_buffers(Some(Duration::from_millis(20)), 1, |_, d| got.push(d.to_vec())).unwrap();
        assert!(k <= 1);
    }
    assert_eq!(got, sent, "after {reaps} reaps: {:?}", r.stats());
    let s = r.stats();
    // One datagram per reap, and the receive ended (ENOBUFS) at most once per reap.
    assert!(reaps <= 2 * sent.len(), "{reaps} reaps: {s:?}");
    assert!(s.no_buffers <= reaps as u64, "{s:?} in {reaps} reaps");
    assert!(s.no_buffers >= 1, "the ring ran empty: {s:?}");
}

#[test]
fn a_datagram_larger_than_the_buffer_is_reported_truncated() {
    if !uring_usable("a_datagram_larger_than_the_buffer_is_reported_truncated") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).bind().unwrap();
    let tx = UdpSocket::bind(lo4()).unwrap();
    let mut r = rx.uring_receiver(4, 100).unwrap();
    let big = payload(1, 500);
    tx.send(&[udpx::Transmit::new(rx.local_addr(), &big)]).unwrap();
    let got = drain(&mut r, 1, Duration::from_secs(2));
    assert_eq!(got.len(), 1);
    assert!(got[0].0.truncated, "cut at the buffer: {:?}", got[0].0);
    assert_eq!(got[0].1, big[..100].to_vec());
    assert_eq!(rx.counters().truncated, 1);
}

#[test]
fn bad_receiver_sizes_are_refused() {
    let rx = UdpSocket::builder(lo4()).bind().unwrap();
    assert!(rx.uring_receiver(3, 1500).unwrap_err().to_string().contains("power of two"));
    assert!(rx.uring_receiver(8, 0).unwrap_err().to_string().contains("give 1 to"));
}

/// Waiting has a bound: with nothing coming, `recv` returns after its timeout.
#[test]
fn a_wait_with_nothing_coming_ends_at_its_timeout() {
    if !uring_usable("a_wait_with_nothing_coming_ends_at_its_timeout") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).bind().unwrap();
    let mut r = rx.uring_receiver(4, 1500).unwrap();
    let t = std::time::Instant::now();
    assert_eq!(r.recv(Some(Duration::from_millis(50)), |_, _| {}).unwrap(), 0);
    assert!(t.elapsed() < Duration::from_secs(5), "returned: {:?}", t.elapsed());
}

/// Reads the eventfd until it says something (true) or `limit` passes (false).
fn signalled(efd: &mut std::fs::File, limit: Duration) -> bool {
    use std::io::Read;
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if efd.read(&mut [0u8; 8]).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// For an event loop: the eventfd is signalled when datagrams arrive, `recv_buffers` hands
/// over whole GRO buffers (segment size in `stride`) and no more than asked for, the rest
/// staying queued.
#[test]
fn whole_buffers_a_bounded_number_at_a_time_after_an_eventfd() {
    if !uring_usable("whole_buffers_a_bounded_number_at_a_time_after_an_eventfd") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).gro(Want::Required).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::GsoSendmsg).bind().unwrap();
    let mut r = rx.uring_receiver(16, udpx::GRO_BUFFER).unwrap();
    let mut efd = std::fs::File::from(r.eventfd().unwrap());
    r.arm().unwrap();
    assert!(!signalled(&mut efd, Duration::from_millis(20)), "nothing arrived, nothing said");
    // Three GSO transmits of 10 x 1200 bytes: on loopback each arrives as one GRO buffer.
    let data: Vec<Vec<u8>> = (0..3u32).map(|i| payload(i, 12_000)).collect();
    for d in &data {
        let t = udpx::Transmit { segment_size: Some(1200), ..udpx::Transmit::new(rx.local_addr(), d) };
        tx.send(&[t]).unwrap();
    }
    assert!(signalled(&mut efd, Duration::from_secs(2)), "the eventfd said so");
    let mut got: Vec<(udpx::RecvMeta, Vec<u8>)> = Vec::new();
    let start = std::time::Instant::now();
    while got.len() < 3 && start.elapsed() < Duration::from_secs(2) {
        let before = got.len();
        let n = r.recv_buffers(None, 2, |m, d| got.push((*m, d.to_vec()))).unwrap();
        assert!(n <= 2 && got.len() - before == n, "at most 2 a call: {n}");
    }
    assert_eq!(got.len(), 3);
    for ((m, d), sent) in got.iter().zip(&data) {
        assert_eq!((m.len, m.stride), (12_000, 1200), "a whole GRO buffer: {m:?}");
        assert_eq!(d, sent);
    }
    assert_eq!(r.stats().datagrams, 30);
    assert_eq!(rx.counters().gro_buffers_received, 3);
}

/// An ICMP error about an earlier datagram ends a receive as it fails `recvmsg`: the receiver
/// reads the error queue, counts it, arms again, and the next datagram arrives.
#[test]
fn an_icmp_error_ends_the_receive_and_receiving_goes_on() {
    if !uring_usable("an_icmp_error_ends_the_receive_and_receiving_goes_on") {
        return;
    }
    let rx = UdpSocket::builder(lo4()).bind().unwrap();
    if !rx.capabilities().recv_err {
        skip("an_icmp_error_ends_the_receive_and_receiving_goes_on", "IP_RECVERR not set on this socket");
        return;
    }
    let tx = UdpSocket::bind(lo4()).unwrap();
    let mut r = rx.uring_receiver(4, 1500).unwrap();
    r.arm().unwrap();
    // A closed port on loopback: the kernel answers with ICMP port unreachable.
    let gone = UdpSocket::bind(lo4()).unwrap().local_addr();
    rx.send(&[udpx::Transmit::new(gone, b"anyone?")]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let after = payload(7, 300);
    tx.send(&[udpx::Transmit::new(rx.local_addr(), &after)]).unwrap();
    let got = drain(&mut r, 1, Duration::from_secs(2));
    assert_eq!(got.len(), 1, "the datagram after the error arrived: {:?}", r.stats());
    assert_eq!(got[0].1, after);
    assert_eq!(r.stats().icmp_errors, 1, "{:?}", r.stats());
    assert!(rx.counters().icmp_errors >= 1, "the error queue was read: {:?}", rx.counters());
}
