//! Fault paths the kernel cannot produce on demand, injected through the syscall seam
//! (feature `fault-injection`): a GSO EIO, ENOBUFS, a short sendmmsg, EAGAIN, and a segment
//! limit lower than probed. In each, every datagram must arrive exactly once, in order.
#![cfg(feature = "fault-injection")]

mod common;

use std::time::Duration;

use common::*;
use udpx::{Batch, Fault, KernelCaps, SendBuffers, SendCursor, SendErrorKind, SendMode, Transmit, UdpSocket};

struct Pair {
    tx: UdpSocket,
    rx: UdpSocket,
}

fn pair(mode: SendMode) -> Pair {
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(mode).io_uring(send_backend()).bind().unwrap();
    Pair { tx, rx }
}

fn datagrams(n: u32, len: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| payload(i, len)).collect()
}

/// Sends `sent` through `p.tx` with `faults` queued, resending after WouldBlock the way a
/// caller must; returns what arrived.
fn run(p: &Pair, sent: &[Vec<u8>], faults: &[Fault]) -> Received {
    for f in faults {
        p.tx.inject_fault(*f);
    }
    let mut batch = Batch::for_socket(&p.tx);
    for d in sent {
        batch.push(p.rx.local_addr(), d).unwrap();
    }
    let ts = batch.transmits();
    let mut from = 0;
    let mut rounds = 0;
    while from < ts.len() {
        rounds += 1;
        assert!(rounds < 100, "no progress");
        match p.tx.send(&ts[from..]) {
            Ok(n) => from += n,
            Err(e) if e.is_would_block() => from += e.sent,
            Err(e) => panic!("send: {e}"),
        }
    }
    receive(&p.rx, sent.len(), Duration::from_millis(300), Duration::from_secs(5))
}

#[test]
fn gso_eio_falls_back_and_resends_the_batch() {
    if KernelCaps::get().gso_max_segments.is_none() {
        return skip("gso_eio_falls_back_and_resends_the_batch", "no UDP_SEGMENT");
    }
    for mode in [SendMode::GsoSendmsg, SendMode::GsoSendmmsg] {
        let p = pair(mode);
        let sent = datagrams(200, 1000);
        let got = run(&p, &sent, &[Fault::Errno(libc::EIO)]);
        assert_same(&sent, &got, "EIO");
        let c = p.tx.counters();
        assert_eq!((c.gso_fallbacks, c.datagrams_sent), (1, 200));
        let caps = p.tx.capabilities();
        assert_eq!(caps.gso_refused_destinations, 1, "{caps}");
        assert!(caps.gso_off_reason.unwrap().contains("Input/output error"));
    }
}

#[test]
fn gso_einval_then_emsgsize_is_about_size_and_keeps_gso() {
    if KernelCaps::get().gso_max_segments.is_none() {
        return skip("gso_einval_then_emsgsize_is_about_size_and_keeps_gso", "no UDP_SEGMENT");
    }
    let p = pair(SendMode::GsoSendmmsg);
    let sent = datagrams(10, 1000);
    p.tx.inject_fault(Fault::Errno(libc::EINVAL));
    // A size error fails every try; the socket (unconnected) first tries three times whether
    // it was an ICMP error left pending (crate docs, icmp), then believes it.
    for _ in 0..4 {
        p.tx.inject_fault(Fault::Errno(libc::EMSGSIZE));
    }
    let mut batch = Batch::for_socket(&p.tx);
    for d in &sent {
        batch.push(p.rx.local_addr(), d).unwrap();
    }
    let e = p.tx.send(&batch.transmits()).unwrap_err();
    assert_eq!(e.sent, 0);
    assert!(matches!(e.kind, SendErrorKind::MessageTooLarge { segment_size: Some(1000), .. }), "{e}");
    assert!(e.to_string().contains("1000"), "{e}");
    assert!(p.tx.capabilities().gso, "a size problem must not turn GSO off");
    assert_eq!(p.tx.counters().icmp_retries, 3, "tried as a pending ICMP error first, three times");
    // The caller may resend: everything arrives.
    p.tx.send(&batch.transmits()).unwrap();
    assert_same(&sent, &receive(&p.rx, 10, Duration::from_millis(300), Duration::from_secs(2)), "resend");
}

#[test]
fn enobufs_is_retried_with_backoff() {
    for mode in SendMode::ALL {
        let p = pair(mode);
        let sent = datagrams(300, 500);
        let faults = [Fault::Errno(libc::ENOBUFS); 3];
        let got = run(&p, &sent, &faults);
        assert_same(&sent, &got, mode.name());
        assert_eq!(p.tx.counters().enobufs_retries, 3, "{mode}");
    }
}

#[test]
fn enobufs_that_persists_is_reported_with_the_count_sent() {
    let p = pair(SendMode::Sendmmsg);
    let sent = datagrams(100, 100);
    let mut batch = Batch::for_socket(&p.tx);
    for d in &sent {
        batch.push(p.rx.local_addr(), d).unwrap();
    }
    let ts = batch.transmits();
    p.tx.inject_fault(Fault::Short(10));
    for _ in 0..=udpx::ENOBUFS_RETRIES {
        p.tx.inject_fault(Fault::Errno(libc::ENOBUFS));
    }
    let e = p.tx.send(&ts).unwrap_err();
    assert_eq!(e.sent, 10, "{e}");
    assert!(matches!(&e.kind, SendErrorKind::NoBuffers), "{e}");
    assert_eq!(p.tx.counters().enobufs_retries, udpx::ENOBUFS_RETRIES as u64);
    // Resending from `sent` delivers everything exactly once.
    p.tx.send(&ts[e.sent..]).unwrap();
    assert_same(&sent, &receive(&p.rx, 100, Duration::from_millis(300), Duration::from_secs(2)), "after ENOBUFS");
}

#[test]
fn short_sendmmsg_is_continued() {
    for mode in [SendMode::Sendmmsg, SendMode::GsoSendmmsg] {
        let p = pair(mode);
        let sent = datagrams(500, 700);
        let faults = [Fault::Short(1), Fault::Short(3), Fault::Short(2), Fault::Short(1)];
        let got = run(&p, &sent, &faults);
        assert_same(&sent, &got, mode.name());
        assert!(p.tx.counters().partial_sends >= 1, "{mode}");
    }
}

#[test]
fn eagain_returns_would_block_with_exact_count() {
    for mode in SendMode::ALL {
        let p = pair(mode);
        let sent = datagrams(400, 300);
        // EAGAIN at the start, then after a partial batch.
        let faults = [Fault::Errno(libc::EAGAIN), Fault::Short(2), Fault::Errno(libc::EAGAIN)];
        let got = run(&p, &sent, &faults);
        assert_same(&sent, &got, mode.name());
        assert!(p.tx.counters().would_block >= 1);
    }
}

#[test]
fn eagain_inside_a_split_transmit_finishes_it() {
    // GSO off (plain mode) and a segmented transmit: it is split into one message per
    // segment; EAGAIN in the middle must not return with half of it sent.
    let p = pair(SendMode::Sendmmsg);
    let data: Vec<u8> = (0..10).flat_map(|i| payload(i, 100)).collect();
    let t = udpx::Transmit::new(p.rx.local_addr(), &data).segmented(100);
    p.tx.inject_fault(Fault::Short(4));
    p.tx.inject_fault(Fault::Errno(libc::EAGAIN));
    assert_eq!(p.tx.send(&[t]).unwrap(), 1);
    let got = receive(&p.rx, 10, Duration::from_millis(300), Duration::from_secs(2));
    let want: Vec<Vec<u8>> = (0..10).map(|i| payload(i, 100)).collect();
    assert_same(&want, &got, "split transmit");
}

#[test]
fn segment_limit_lowered_when_kernel_refuses_more_than_64() {
    let Some(max) = KernelCaps::get().gso_max_segments else {
        return skip("segment_limit_lowered_when_kernel_refuses_more_than_64", "no UDP_SEGMENT");
    };
    if max <= 64 {
        return skip("segment_limit_lowered_when_kernel_refuses_more_than_64", "kernel limit is already 64");
    }
    let p = pair(SendMode::GsoSendmmsg);
    let sent = datagrams(100, 10);
    let got = run(&p, &sent, &[Fault::Errno(libc::EINVAL)]);
    assert_same(&sent, &got, "limit 64");
    let caps = p.tx.capabilities();
    assert_eq!(caps.gso_max_segments, 64);
    assert!(caps.gso, "GSO itself stays on");
    assert_eq!(p.tx.counters().segment_limit_lowered, 1);
}

#[test]
fn other_errors_are_reported_not_swallowed() {
    let p = pair(SendMode::Sendmmsg);
    let sent = datagrams(5, 10);
    let mut batch = Batch::for_socket(&p.tx);
    for d in &sent {
        batch.push(p.rx.local_addr(), d).unwrap();
    }
    p.tx.inject_fault(Fault::Errno(libc::EPERM));
    let e = p.tx.send(&batch.transmits()).unwrap_err();
    assert_eq!(e.sent, 0);
    assert!(matches!(&e.kind, SendErrorKind::Io(io) if io.raw_os_error() == Some(libc::EPERM)));
    assert_eq!(p.tx.counters().send_errors, 1);
}

#[test]
fn hard_error_inside_a_split_transmit_reports_the_segments_sent() {
    // A segmented transmit sent as plain datagrams (GSO off), a short batch, then a hard
    // error: the error says how many of its segments went, and resending from there delivers
    // every datagram exactly once.
    let p = pair(SendMode::Sendmmsg);
    let segs: Vec<Vec<u8>> = (0..10).map(|i| payload(i, 100)).collect();
    let data = segs.concat();
    let t = udpx::Transmit::new(p.rx.local_addr(), &data).segmented(100);
    p.tx.inject_fault(Fault::Short(4));
    p.tx.inject_fault(Fault::Errno(libc::EPERM));
    let e = p.tx.send(&[t]).unwrap_err();
    assert_eq!((e.sent, e.partial_segments), (0, 4), "{e}");
    assert!(e.to_string().contains("4 segments"), "{e}");
    let rest = udpx::Transmit::new(p.rx.local_addr(), &data[4 * 100..]).segmented(100);
    p.tx.send(&[rest]).unwrap();
    assert_same(
        &segs,
        &receive(&p.rx, 10, Duration::from_millis(300), Duration::from_secs(2)),
        "resent from segment 4",
    );
}

/// The kernel cuts control data it has no room for (MSG_CTRUNC). On a GRO socket that can
/// take the segment size with it: the buffer then holds several datagrams of unknown size.
/// udpx must not hand it out as one datagram: it reports the cut, counts it, and yields no
/// datagrams from that buffer; with room again, the next train splits correctly.
#[test]
fn cut_control_data_is_reported_and_never_mis_split() {
    let Some(_) = KernelCaps::get().gso_max_segments.filter(|_| KernelCaps::get().gro) else {
        return skip("cut_control_data_is_reported_and_never_mis_split", "no UDP GSO/GRO");
    };
    let rx = UdpSocket::builder(lo4()).gro(udpx::Want::Required).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::GsoSendmsg).bind().unwrap();
    let train: Vec<u8> = (0..4).flat_map(|i| payload(i, 1000)).collect();
    let send = || tx.send(&[udpx::Transmit::new(rx.local_addr(), &train).segmented(1000)]).unwrap();
    // Room for a cmsghdr but not for the 4-byte GRO size behind it.
    rx.limit_recv_control(16);
    send();
    let got = receive(&rx, 1, Duration::from_millis(300), Duration::from_secs(2));
    assert_eq!(got.messages, 1, "one coalesced buffer");
    let m = got.metas[0];
    assert!(m.control_truncated, "MSG_CTRUNC not reported: {m:?}");
    assert_eq!((m.len, m.stride, m.segment_count()), (4000, 0, 0), "{m:?}");
    assert!(got.datagrams.is_empty(), "a cut buffer was handed out as {} datagrams", got.datagrams.len());
    assert_eq!(rx.counters().control_truncated, 1);
    rx.limit_recv_control(0);
    send();
    let got = receive(&rx, 4, Duration::from_millis(300), Duration::from_secs(2));
    assert_eq!(got.datagrams, (0..4).map(|i| payload(i, 1000)).collect::<Vec<_>>());
    assert!(!got.metas[0].control_truncated);
}

/// A GSO refusal belongs to the route it happened on: another destination keeps GSO, the
/// refused one goes plain until its back-off ends and then gets GSO again; a second refusal
/// doubles the back-off. Nothing is lost on the way.
#[test]
fn gso_refusal_is_per_destination_and_retried_after_its_back_off() {
    if KernelCaps::get().gso_max_segments.is_none() {
        return skip("gso_refusal_is_per_destination_and_retried_after_its_back_off", "no UDP_SEGMENT");
    }
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::GsoSendmsg).bind().unwrap();
    // Refusals are kept per destination address (a route property), so the other receiver
    // listens on another loopback address.
    let (a, b) = (UdpSocket::bind(lo4()).unwrap(), UdpSocket::bind("127.0.0.2:0".parse().unwrap()).unwrap());
    let mut seq = 0u32;
    let mut send_four = |dst: &UdpSocket| {
        let train: Vec<Vec<u8>> = (seq..seq + 4).map(|i| payload(i, 500)).collect();
        seq += 4;
        tx.send(&[udpx::Transmit::new(dst.local_addr(), &train.concat()).segmented(500)]).unwrap();
        let got = receive(dst, 4, Duration::from_millis(300), Duration::from_secs(2));
        assert_same(&train, &got, "train");
        tx.counters()
    };
    tx.inject_fault(Fault::Errno(libc::EIO));
    let c = send_four(&a);
    assert_eq!((c.gso_fallbacks, c.gso_buffers_sent), (1, 0), "refused and re-sent plain: {c:?}");
    let c = send_four(&b);
    assert_eq!((c.gso_fallbacks, c.gso_buffers_sent), (1, 1), "another destination keeps GSO: {c:?}");
    let c = send_four(&a);
    assert_eq!((c.gso_fallbacks, c.gso_buffers_sent), (1, 1), "plain during the back-off: {c:?}");
    std::thread::sleep(udpx::caps::GSO_RETRY_FIRST + Duration::from_millis(100));
    let c = send_four(&a);
    assert_eq!((c.gso_fallbacks, c.gso_buffers_sent), (1, 2), "GSO again after the back-off: {c:?}");
    tx.inject_fault(Fault::Errno(libc::EIO));
    let c = send_four(&a);
    assert_eq!(c.gso_fallbacks, 2, "{c:?}");
    let caps = tx.capabilities();
    assert!(caps.gso_off_reason.as_deref().unwrap_or("").contains("for 2s"), "back-off doubled: {caps}");
}

/// The mechanism never waits: EAGAIN and ENOBUFS come straight back with the exact cursor
/// (after one system call), also in the middle of a transmit that goes as several messages;
/// continuing from the cursor sends every datagram exactly once, in order.
#[test]
fn try_send_returns_at_once_with_an_exact_cursor() {
    let p = pair(SendMode::Sendmmsg);
    let sent = datagrams(40, 300);
    // One transmit of 40 segments that goes plain (sendmmsg mode: a message per segment).
    let train = sent.concat();
    let ts = [Transmit::new(p.rx.local_addr(), &train).segmented(300)];
    let mut bufs = SendBuffers::new();
    p.tx.inject_fault(Fault::Short(7));
    p.tx.inject_fault(Fault::Errno(libc::EAGAIN));
    let e = p.tx.try_send(&mut bufs, &ts, SendCursor::default()).unwrap_err();
    assert!(e.is_would_block(), "{e}");
    assert_eq!(e.cursor(), SendCursor { transmit: 0, segment: 7 }, "stopped inside the transmit");
    assert_eq!(p.tx.counters().send_calls, 2, "returned after the EAGAIN, no wait");
    p.tx.inject_fault(Fault::Errno(libc::ENOBUFS));
    let e = p.tx.try_send(&mut bufs, &ts, e.cursor()).unwrap_err();
    assert!(matches!(e.kind, SendErrorKind::NoBuffers), "{e}");
    assert_eq!(e.cursor(), SendCursor { transmit: 0, segment: 7 });
    let c = p.tx.counters();
    assert_eq!((c.send_calls, c.no_buffers, c.enobufs_retries), (3, 1, 0), "no back-off inside the mechanism");
    assert_eq!(p.tx.try_send(&mut bufs, &ts, e.cursor()).unwrap(), 1);
    let got = receive(&p.rx, sent.len(), Duration::from_millis(300), Duration::from_secs(2));
    assert_same(&sent, &got, "resumed from the cursor");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 24, ..Default::default() })]
    /// Any sequence of stops and kernel answers (EAGAIN, ENOBUFS, short sendmmsg counts, a GSO
    /// refusal) with the caller continuing from the cursor each time: every datagram arrives
    /// exactly once, in order.
    #[test]
    fn resuming_from_the_cursor_never_loses_or_repeats(
        faults in proptest::collection::vec(0u8..5, 0..12),
        gso in proptest::bool::ANY,
        n in 1u32..120,
    ) {
        let mode = if gso && KernelCaps::get().gso_max_segments.is_some() { SendMode::GsoSendmmsg } else { SendMode::Sendmmsg };
        let p = pair(mode);
        let sent = datagrams(n, 200);
        let mut batch = Batch::for_socket(&p.tx);
        for d in &sent {
            batch.push(p.rx.local_addr(), d).unwrap();
        }
        let ts = batch.transmits();
        for (i, f) in faults.iter().enumerate() {
            p.tx.inject_fault(match f {
                0 => Fault::Errno(libc::EAGAIN),
                1 => Fault::Errno(libc::ENOBUFS),
                2 => Fault::Short(1),
                3 => Fault::Short(3),
                // A device refuses GSO on a segmented message: the first call of a GSO send
                // of at least two datagrams is one. (EIO on a plain message is a hard error.)
                _ if i == 0 && mode == SendMode::GsoSendmmsg && n >= 2 => Fault::Errno(libc::EIO),
                _ => Fault::Short(2),
            });
        }
        let mut bufs = SendBuffers::new();
        let mut cur = SendCursor::default();
        let mut stops = 0;
        loop {
            match p.tx.try_send(&mut bufs, &ts, cur) {
                Ok(_) => break,
                Err(e) if e.is_would_block() || matches!(e.kind, SendErrorKind::NoBuffers) => {
                    cur = e.cursor();
                    stops += 1;
                    proptest::prop_assert!(stops <= faults.len(), "more stops than faults");
                }
                Err(e) => proptest::prop_assert!(false, "unexpected: {}", e),
            }
        }
        let got = receive(&p.rx, sent.len(), Duration::from_millis(200), Duration::from_secs(3));
        assert_same(&sent, &got, "resumed sends");
    }
}

/// `io_uring_enter` failing in the middle of an io_uring send (the wait after the kernel took
/// the entries, or the submission itself): the send returns only once the completion of
/// every entry the kernel took has been read, so nothing it may still read goes back to the
/// caller (the ring is quiet after every call), and it reports what went: continuing from
/// there, every datagram arrives exactly once. An enter that keeps failing before the kernel
/// took anything gives the ring up, reports the error with nothing sent, and the socket goes
/// on by system calls.
#[test]
fn a_failed_io_uring_enter_waits_for_its_entries() {
    if let Err(why) = udpx::caps::io_uring_available() {
        return skip("a_failed_io_uring_enter_waits_for_its_entries", &why);
    }
    let cases = [(true, 1), (false, 1), (false, 3), (true, u32::MAX), (false, u32::MAX)];
    for mode in [SendMode::Sendmmsg, SendMode::Sendmsg] {
        for (after_submit, times) in cases {
            let what = format!("{mode}: after_submit {after_submit}, {times} failed enters");
            let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
            let tx = UdpSocket::builder(lo4()).send_mode(mode).io_uring(udpx::Want::Required).bind().unwrap();
            let sent = datagrams(100, 200);
            let mut batch = Batch::for_socket(&tx);
            for d in &sent {
                batch.push(rx.local_addr(), d).unwrap();
            }
            let ts = batch.transmits();
            tx.inject_fault(Fault::UringEnter { errno: libc::EBADR, after_submit, times });
            let (mut from, mut errors, mut rounds) = (0, 0, 0);
            while from < ts.len() {
                rounds += 1;
                assert!(rounds < 100, "{what}: no progress");
                match tx.send(&ts[from..]) {
                    Ok(n) => from += n,
                    Err(e) => {
                        assert!(
                            matches!(&e.kind, SendErrorKind::Io(io) if io.raw_os_error() == Some(libc::EBADR)),
                            "{what}: {e}"
                        );
                        errors += 1;
                        from += e.sent;
                    }
                }
                assert!(tx.io_uring_send_quiet(), "{what}: returned with entries queued or unread");
            }
            // Only an enter that never lets the kernel take the entries is an error the
            // caller sees: every other failure was waited out.
            let given_up = !after_submit && times == u32::MAX;
            assert_eq!(errors, u32::from(given_up), "{what}");
            let got = receive(&rx, sent.len(), Duration::from_millis(300), Duration::from_secs(5));
            assert_same(&sent, &got, &what);
        }
    }
}

/// The same for zerocopy entries (`IORING_OP_SENDMSG_ZC`): a failed enter after the kernel
/// took them is waited out, every buffer comes back after its notification, and every
/// datagram arrives exactly once.
#[test]
fn a_failed_io_uring_enter_waits_for_its_zerocopy_entries() {
    if !KernelCaps::get().zerocopy || !udpx::caps::io_uring_zerocopy_available() {
        return skip("a_failed_io_uring_enter_waits_for_its_zerocopy_entries", "no io_uring SENDMSG_ZC");
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let cfg = udpx::ZcConfig { copied_limit: 0, ..udpx::ZcConfig::default() };
    let tx = UdpSocket::builder(lo4())
        .send_mode(SendMode::GsoSendmsg)
        .zerocopy(udpx::Want::Required)
        .zerocopy_config(cfg)
        .io_uring(udpx::Want::Required)
        .bind()
        .unwrap();
    let pool = udpx::ZcPool::new(1000 * 8, 2);
    let mut sent = Vec::new();
    for k in 0..6u32 {
        if k % 2 == 0 {
            tx.inject_fault(Fault::UringEnter { errno: libc::EBADR, after_submit: true, times: 1 });
        }
        let mut buf = loop {
            if let Some(b) = pool.get() {
                break b;
            }
            tx.reap_completions(Some(Duration::from_millis(50))).unwrap();
        };
        buf.set_len(8 * 1000);
        for (i, chunk) in buf.chunks_mut(1000).enumerate() {
            let d = payload(k * 8 + i as u32, 1000);
            chunk.copy_from_slice(&d);
            sent.push(d);
        }
        tx.send_zerocopy(rx.local_addr(), buf, Some(1000)).unwrap();
        assert!(tx.io_uring_send_quiet(), "send {k}: returned with entries queued or unread");
    }
    for _ in 0..100 {
        if tx.zerocopy_in_flight() == 0 {
            break;
        }
        tx.reap_completions(Some(Duration::from_millis(50))).unwrap();
    }
    assert_eq!((tx.zerocopy_in_flight(), pool.free()), (0, 2), "every buffer back");
    let got = receive(&rx, sent.len(), Duration::from_millis(300), Duration::from_secs(5));
    assert_same(&sent, &got, "zerocopy through a failed enter");
    let c = tx.counters();
    assert_eq!(c.zerocopy_completed, c.zerocopy_sends, "{c:?}");
}
