//! Zerocopy send over real sockets: every byte verified at the receiver while buffers are
//! reused only after their completions; the copied-completion detection that turns zerocopy
//! off; the audit (completions == zerocopy sends); ENOBUFS falling back to a copy; bad
//! configuration refused.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use udpx::{Error, KernelCaps, SendMode, UdpSocket, Want, ZcConfig, ZcPool};
use udpx_netns::{skip_unless_capable, Profile, Side, TestNet, TestNetConfig};

const SEG: usize = 1000;
const SEGS: usize = 32;

/// Sends `n` GSO super-buffers through a pool of `pool_size` buffers, each filled with fresh,
/// verifiable datagrams right before its send; a buffer can only be refilled after the kernel
/// released it. Returns the datagrams sent, in order.
fn send_through_pool(tx: &UdpSocket, dst: SocketAddr, pool: &ZcPool, n: usize) -> Vec<Vec<u8>> {
    let mut sent = Vec::new();
    let mut seq = 0u32;
    for _ in 0..n {
        let mut buf = loop {
            if let Some(b) = pool.get() {
                break b;
            }
            tx.reap_completions(Some(Duration::from_millis(50))).unwrap();
        };
        buf.set_len(SEG * SEGS);
        for chunk in buf.chunks_mut(SEG) {
            let d = payload(seq, SEG);
            chunk.copy_from_slice(&d);
            sent.push(d);
            seq += 1;
        }
        tx.send_zerocopy(dst, buf, Some(SEG)).unwrap();
        std::thread::sleep(Duration::from_micros(300));
    }
    while tx.zerocopy_in_flight() > 0 {
        assert!(tx.reap_completions(Some(Duration::from_secs(2))).is_ok());
    }
    sent
}

fn check_run(tx: &UdpSocket, rx: &UdpSocket, copied_limit: u64, what: &str) {
    let pool = ZcPool::new(SEG * SEGS, 4);
    let (sent, got) = std::thread::scope(|s| {
        let h = s.spawn(|| receive(rx, 40 * SEGS, Duration::from_millis(500), Duration::from_secs(10)));
        let sent = send_through_pool(tx, rx.local_addr(), &pool, 40);
        (sent, h.join().unwrap())
    });
    assert_same(&sent, &got, what);
    assert_eq!(pool.free(), 4, "{what}: every buffer came back");
    let c = tx.counters();
    assert_eq!(c.zerocopy_completed, c.zerocopy_sends, "{what}: audit: every zerocopy send completed");
    assert!(c.zerocopy_sends > 0, "{what}");
    // Local delivery always copies: every completion says so.
    assert_eq!(c.zerocopy_copied, c.zerocopy_completed, "{what}");
    // Through io_uring (UDPX_TEST_IO_URING=1) they come as SENDMSG_ZC notifications, where
    // the kernel has that opcode; otherwise from the error queue.
    if tx.capabilities().io_uring && udpx::caps::io_uring_zerocopy_available() {
        assert_eq!(c.zerocopy_ring_notifs, c.zerocopy_completed, "{what}: {c:?}");
    } else {
        assert_eq!(c.zerocopy_ring_notifs, 0, "{what}: {c:?}");
    }
    let caps = tx.capabilities();
    if copied_limit == 0 {
        assert!(caps.zerocopy, "{what}: forced on");
        assert_eq!(c.zerocopy_sends, 40, "{what}: every send zerocopy");
    } else {
        assert!(!caps.zerocopy, "{what}: detection turns it off: {caps}");
        assert!(caps.zerocopy_off_reason.is_some());
        assert_eq!(c.zerocopy_turned_off, 1);
        assert!(c.zerocopy_sends < 40, "{what}: later sends copy");
    }
}

fn zc_socket(addr: SocketAddr, copied_limit: u64) -> udpx::SocketConfig {
    let cfg = ZcConfig { copied_limit, ..ZcConfig::default() };
    UdpSocket::builder(addr)
        .send_mode(SendMode::GsoSendmsg)
        .zerocopy(Want::Required)
        .zerocopy_config(cfg)
        .io_uring(send_backend())
}

#[test]
fn zerocopy_over_loopback_detects_copies() {
    if !KernelCaps::get().zerocopy {
        return skip("zerocopy_over_loopback_detects_copies", "no SO_ZEROCOPY");
    }
    for limit in [udpx::zerocopy::COPIED_LIMIT, 0] {
        let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
        let tx = zc_socket(lo4(), limit).bind().unwrap();
        check_run(&tx, &rx, limit, &format!("loopback limit {limit}"));
    }
}

#[test]
fn zerocopy_over_veth_reuses_buffers_only_after_completion() {
    if skip_unless_capable("zerocopy_over_veth_reuses_buffers_only_after_completion") {
        return;
    }
    let net = TestNet::setup(&TestNetConfig::new(Profile::Offload)).unwrap();
    for limit in [udpx::zerocopy::COPIED_LIMIT, 0] {
        let rx_ip = net.rx_v4;
        let tx_ip = net.tx_v4;
        let rx = net
            .ns(Side::Rx)
            .run(move || UdpSocket::builder(SocketAddr::from((rx_ip, 0))).recv_buffer(16 << 20).bind().unwrap());
        let tx = net.ns(Side::Tx).run(move || zc_socket(SocketAddr::from((tx_ip, 0)), limit).bind().unwrap());
        check_run(&tx, &rx, limit, &format!("veth limit {limit}"));
    }
}

#[test]
fn small_sends_copy_and_return_at_once() {
    let rx = UdpSocket::bind(lo4()).unwrap();
    let tx = zc_socket(lo4(), 0).zerocopy_threshold(4096).bind().unwrap();
    let pool = ZcPool::new(1000, 1);
    let mut b = pool.get().unwrap();
    b.copy_from_slice(&payload(1, 1000));
    tx.send_zerocopy(rx.local_addr(), b, None).unwrap();
    assert_eq!(pool.free(), 1, "below the threshold: copied, buffer back at once");
    assert_eq!(tx.counters().zerocopy_sends, 0);
    assert_eq!(receive(&rx, 1, Duration::from_millis(300), Duration::from_secs(2)).datagrams, vec![payload(1, 1000)]);
}

#[test]
fn bad_zerocopy_config_is_refused() {
    for threshold in [0usize, 65528] {
        let e = zc_socket(lo4(), 8).zerocopy_threshold(threshold).bind().unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(e.to_string().contains("threshold"), "{e}");
    }
    // Not configured for zerocopy: send_zerocopy simply copies.
    let rx = UdpSocket::bind(lo4()).unwrap();
    let tx = UdpSocket::bind(lo4()).unwrap();
    let pool = ZcPool::new(20000, 1);
    let mut b = pool.get().unwrap();
    b.fill(3);
    tx.send_zerocopy(rx.local_addr(), b, Some(1000)).unwrap();
    assert_eq!(pool.free(), 1);
    assert_eq!(receive(&rx, 20, Duration::from_millis(300), Duration::from_secs(2)).datagrams.len(), 20);
}

#[cfg(feature = "fault-injection")]
#[test]
fn enobufs_on_zerocopy_copies_instead() {
    if !KernelCaps::get().zerocopy {
        return skip("enobufs_on_zerocopy_copies_instead", "no SO_ZEROCOPY");
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(16 << 20).bind().unwrap();
    let tx = zc_socket(lo4(), 0).bind().unwrap();
    let pool = ZcPool::new(SEG * SEGS, 1);
    let mut b = pool.get().unwrap();
    let sent: Vec<Vec<u8>> = (0..SEGS as u32).map(|i| payload(i, SEG)).collect();
    b.copy_from_slice(&sent.concat());
    tx.inject_fault(udpx::Fault::Errno(libc::ENOBUFS));
    tx.send_zerocopy(rx.local_addr(), b, Some(SEG)).unwrap();
    let c = tx.counters();
    assert_eq!((c.zerocopy_enobufs_copied, c.zerocopy_sends), (1, 0));
    assert_eq!(pool.free(), 1, "copied: the kernel holds no reference, the buffer is back");
    assert_same(&sent, &receive(&rx, SEGS, Duration::from_millis(300), Duration::from_secs(2)), "ENOBUFS copy");
}

/// A GSO zerocopy send the kernel refuses after it built the packet (SO_NO_CHECK: EINVAL in
/// `udp_send_skb`) still consumes a zerocopy id and completes it; udpx re-sends the segments
/// plain, with MSG_ZEROCOPY. The tracker must count that id too, or every later buffer is
/// released one completion early (on a NIC that reads memory after the call: corruption) and
/// the last one never comes back.
#[test]
fn a_refused_zerocopy_call_keeps_the_ids_in_step() {
    let k = KernelCaps::get();
    if !k.zerocopy || k.gso_max_segments.is_none() {
        return skip("a_refused_zerocopy_call_keeps_the_ids_in_step", "no SO_ZEROCOPY or no UDP GSO");
    }
    let rx = UdpSocket::builder(lo4()).recv_buffer(4 << 20).bind().unwrap();
    let tx = zc_socket(lo4(), 0).zerocopy_threshold(1).bind().unwrap();
    tx.set_no_check(true).unwrap();
    let pool = ZcPool::new(3 * SEG, 2);
    let fill = |first: u32, segs: usize| {
        let mut b = pool.get().expect("a free buffer");
        b.set_len(segs * SEG);
        for (i, chunk) in b.chunks_mut(SEG).enumerate() {
            chunk.copy_from_slice(&payload(first + i as u32, SEG));
        }
        b
    };
    tx.send_zerocopy(rx.local_addr(), fill(0, 3), Some(SEG)).unwrap();
    let c = tx.counters();
    assert_eq!(c.gso_fallbacks, 1, "the GSO send was refused and re-sent plain: {c:?}");
    assert_eq!((c.zerocopy_failed_ids, c.zerocopy_sends), (1, 3), "{c:?}");
    // A good send after the fallback (GSO allowed again, one more id).
    tx.set_no_check(false).unwrap();
    tx.send_zerocopy(rx.local_addr(), fill(3, 1), None).unwrap();
    while tx.zerocopy_in_flight() > 0 {
        tx.reap_completions(Some(Duration::from_secs(2))).unwrap();
    }
    let c = tx.counters();
    assert_eq!(c.zerocopy_completed, c.zerocopy_sends + c.zerocopy_failed_ids, "every id completed: {c:?}");
    assert_eq!(tx.zerocopy_next_id(), Some(5), "ids 0 (refused), 1-3 (plain re-send), 4 (the next send)");
    assert_eq!(pool.free(), 2, "both buffers came back, neither early nor never");
    let got = receive(&rx, 4, Duration::from_millis(300), Duration::from_secs(2));
    assert_same(&(0..4).map(|i| payload(i, SEG)).collect::<Vec<_>>(), &got, "refused zerocopy");
    // The refused call's completion says "not copied" (nothing was delivered): that is no
    // evidence that zerocopy works here, so detection still turns zerocopy off.
    let tx = zc_socket(lo4(), 2).zerocopy_threshold(1).bind().unwrap();
    tx.set_no_check(true).unwrap();
    for first in [10, 20, 30] {
        let mut b = pool.get().expect("a free buffer");
        b.set_len(2 * SEG);
        b.fill(first as u8);
        tx.send_zerocopy(rx.local_addr(), b, Some(SEG)).unwrap();
        while tx.zerocopy_in_flight() > 0 {
            tx.reap_completions(Some(Duration::from_secs(2))).unwrap();
        }
    }
    assert!(!tx.capabilities().zerocopy, "copied completions turn zerocopy off: {:?}", tx.counters());
}
