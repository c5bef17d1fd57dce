//! End-to-end over loopback: every send mode, with and without GRO, IPv4 and IPv6, every byte
//! and sequence checked; the GSO edge-case table; receive metadata; the real GSO fallback.

mod common;

use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::time::Duration;

use common::gso_cases::{self, check_plan, check_socket};
use common::*;
use udpx::{
    Batch, DatagramMeta, EcnCodepoint, Error, Family, KernelCaps, RecvMeta, RecvMode, SendErrorKind, SendMode,
    Transmit, UdpSocket, Want,
};

fn kernel_max() -> Option<usize> {
    KernelCaps::get().gso_max_segments
}

fn rx_socket(addr: SocketAddr, gro: bool) -> UdpSocket {
    UdpSocket::builder(addr).gro(if gro { Want::Required } else { Want::Off }).recv_buffer(16 << 20).bind().unwrap()
}

/// A mixed stream: full-size runs, short tails, tiny and empty datagrams.
fn mixed_sizes(n: usize, full: usize) -> Vec<usize> {
    (0..n)
        .map(|i| match i % 97 {
            13 => 0,
            29 => 1,
            41 => full / 3,
            _ => full,
        })
        .collect()
}

fn every_mode(rx_addr: SocketAddr, full: usize) {
    for gro in [false, true] {
        if gro && !KernelCaps::get().gro {
            skip("every_mode gro", "UDP_GRO not supported by this kernel");
            continue;
        }
        for mode in SendMode::ALL {
            let rx = rx_socket(rx_addr, gro);
            let tx = UdpSocket::builder(rx_addr).send_mode(mode).io_uring(send_backend()).bind().unwrap();
            let sizes = mixed_sizes(1500, full);
            let sent: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| payload(i as u32, n)).collect();
            let what = format!("{mode} gro={gro} {}", rx_addr.ip());
            let got = send_paced(&tx, &rx, &sent, 200, Duration::from_millis(2));
            assert_same(&sent, &got, &what);
            let c = tx.counters();
            assert_eq!(c.datagrams_sent, sent.len() as u64, "{what}");
            if mode.segments() && kernel_max().is_some() {
                assert!(c.gso_buffers_sent > 0 && c.datagrams_per_send_call() > 1.0, "{what}: {c:?}");
            }
            if mode == SendMode::Sendmsg {
                assert_eq!(c.send_calls, sent.len() as u64, "{what}: one call per datagram");
            }
            if gro && mode.segments() {
                // Loopback delivers a GSO buffer whole to a GRO socket.
                assert!(got.gro_messages > 0, "{what}: no coalesced buffer seen");
            }
            if !gro {
                assert_eq!(got.gro_messages, 0, "{what}");
            }
        }
    }
}

#[test]
fn every_mode_every_byte_v4() {
    every_mode(lo4(), 1472);
}

#[test]
fn every_mode_every_byte_v6() {
    every_mode(lo6(), 1452);
}

#[test]
fn gso_edge_cases_planning() {
    let max = kernel_max().unwrap_or(64);
    for case in gso_cases::cases(max) {
        check_plan(&case, max, Family::DualStack);
    }
}

#[test]
fn gso_edge_cases_loopback() {
    let Some(max) = kernel_max() else {
        return skip("gso_edge_cases_loopback", "no UDP_SEGMENT in this kernel");
    };
    for connected in [false, true] {
        for case in gso_cases::cases(max).into_iter().filter(|c| !c.mtu1500_only) {
            let addr = if case.v6 { lo6() } else { lo4() };
            let rx = rx_socket(addr, false);
            let mut cfg = UdpSocket::builder(addr).send_mode(SendMode::GsoSendmmsg);
            if connected {
                cfg = cfg.connect(rx.local_addr());
            }
            let tx = cfg.bind().unwrap();
            check_socket(&case, &tx, &rx, rx.local_addr());
        }
    }
}

#[test]
fn wrong_family_is_refused() {
    let tx = UdpSocket::bind(lo4()).unwrap();
    let e = tx.send(&[Transmit::new("[::1]:9".parse().unwrap(), b"x")]).unwrap_err();
    assert!(matches!(e.kind, SendErrorKind::Invalid { index: 0, .. }), "{e}");
    assert!(e.to_string().contains("IPv4"), "{e}");
    let tx6 = UdpSocket::builder(lo6()).v6_only(true).bind().unwrap();
    let e = tx6.send(&[Transmit::new("127.0.0.1:9".parse().unwrap(), b"x")]).unwrap_err();
    assert!(matches!(e.kind, SendErrorKind::Invalid { .. }), "{e}");
}

#[test]
fn dual_stack_reaches_ipv4_and_reports_plain_v4() {
    let rx4 = rx_socket(lo4(), false);
    let rx6 = rx_socket(lo6(), false);
    let tx = UdpSocket::builder("[::]:0".parse().unwrap()).bind().unwrap();
    assert_eq!(tx.family(), Family::DualStack);
    tx.send(&[Transmit::new(rx4.local_addr(), b"four"), Transmit::new(rx6.local_addr(), b"six")]).unwrap();
    let g4 = receive(&rx4, 1, Duration::from_millis(300), Duration::from_secs(2));
    let g6 = receive(&rx6, 1, Duration::from_millis(300), Duration::from_secs(2));
    assert_eq!(g4.datagrams, vec![b"four".to_vec()]);
    assert_eq!(g6.datagrams, vec![b"six".to_vec()]);
    assert!(g4.metas[0].addr.is_ipv4(), "sender seen as {}", g4.metas[0].addr);
}

#[test]
fn truncation_is_reported_not_hidden() {
    let rx = UdpSocket::builder(lo4()).recv_mode(RecvMode::Recvmsg).bind().unwrap();
    let tx = UdpSocket::bind(lo4()).unwrap();
    tx.send(&[Transmit::new(rx.local_addr(), &[7u8; 500])]).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 100];
    let mut meta = [RecvMeta::default()];
    let n = rx.recv(&mut [IoSliceMut::new(&mut buf)], &mut meta).unwrap();
    assert_eq!(n, 1);
    assert!(meta[0].truncated);
    assert_eq!(meta[0].len, 100);
    assert_eq!(rx.counters().truncated, 1);
}

#[test]
fn gro_refuses_small_buffers() {
    if !KernelCaps::get().gro {
        return skip("gro_refuses_small_buffers", "no UDP_GRO");
    }
    let rx = rx_socket(lo4(), true);
    let mut buf = [0u8; 2048];
    let err = rx.recv(&mut [IoSliceMut::new(&mut buf)], &mut [RecvMeta::default()]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let inner = err.get_ref().and_then(|e| e.downcast_ref::<Error>());
    assert!(matches!(inner, Some(Error::RecvBufferTooSmall { len: 2048, need: 65536 })), "{err}");
}

#[test]
fn pktinfo_and_ecn_round_trip() {
    for addr in [lo4(), lo6()] {
        let rx = UdpSocket::builder(addr).pktinfo(Want::Required).ecn(Want::Required).bind().unwrap();
        let tx = UdpSocket::builder(addr).pktinfo(Want::Required).bind().unwrap();
        let meta = DatagramMeta { src_ip: Some(addr.ip()), ecn: Some(EcnCodepoint::Ect0), departure: None };
        let mut batch = Batch::for_socket(&tx);
        for i in 0..3u32 {
            batch.push_with(rx.local_addr(), meta, &payload(i, 100)).unwrap();
        }
        tx.send(&batch.transmits()).unwrap();
        let got = receive(&rx, 3, Duration::from_millis(300), Duration::from_secs(2));
        assert_eq!(got.datagrams.len(), 3);
        for m in &got.metas {
            assert_eq!(m.dst_ip, Some(addr.ip()), "{addr}");
            assert_eq!(m.ecn, Some(EcnCodepoint::Ect0), "{addr}");
            assert_eq!(m.addr, tx.local_addr());
        }
    }
}

/// A dual-stack socket sending to an IPv4 peer written v4-mapped (`::ffff:127.0.0.1`): the
/// datagram takes the IPv4 path, so ECN and the source address must travel as IP_TOS and
/// IP_PKTINFO (an IPV6_TCLASS cmsg is ignored there and the mark would be lost).
#[test]
fn ecn_and_source_reach_a_v4_mapped_destination() {
    let rx = UdpSocket::builder(lo4()).pktinfo(Want::Required).ecn(Want::Required).bind().unwrap();
    let tx = UdpSocket::builder("[::]:0".parse().unwrap()).pktinfo(Want::Required).bind().unwrap();
    assert_eq!(tx.family(), Family::DualStack);
    let SocketAddr::V4(v4) = rx.local_addr() else { unreachable!() };
    let mapped = SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port());
    let src: std::net::IpAddr = std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().into();
    for (ecn, src_ip) in [(EcnCodepoint::Ect0, None), (EcnCodepoint::Ce, Some(src))] {
        let t = Transmit { ecn: Some(ecn), src_ip, ..Transmit::new(mapped, b"mapped") };
        tx.send(&[t]).unwrap();
        let got = receive(&rx, 1, Duration::from_millis(300), Duration::from_secs(2));
        assert_eq!(got.datagrams.len(), 1);
        assert_eq!(got.metas[0].ecn, Some(ecn), "ECN mark lost on the IPv4 path (src {src_ip:?})");
        assert_eq!(got.metas[0].dst_ip, Some(std::net::Ipv4Addr::LOCALHOST.into()));
    }
}

#[test]
fn kernel_drops_are_surfaced() {
    // A receiver with a tiny buffer that nobody drains: the kernel drops, and says so.
    let rx = UdpSocket::builder(lo4()).recv_buffer(4096).rxq_ovfl(Want::Required).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::Sendmmsg).bind().unwrap();
    let d = vec![1u8; 1000];
    let ts: Vec<Transmit<'_>> = (0..200).map(|_| Transmit::new(rx.local_addr(), &d)).collect();
    tx.send(&ts).unwrap();
    let got = receive(&rx, 200, Duration::from_millis(200), Duration::from_secs(2));
    assert!(got.datagrams.len() < 200);
    // The kernel stamps its drop count on datagrams queued after the drops: send one more.
    tx.send(&[Transmit::new(rx.local_addr(), b"after")]).unwrap();
    let after = receive(&rx, 1, Duration::from_millis(200), Duration::from_secs(2));
    assert_eq!(after.datagrams, vec![b"after".to_vec()]);
    let drops = after.metas[0].kernel_drops.unwrap_or(0);
    assert_eq!(drops as usize, 200 - got.datagrams.len(), "SO_RXQ_OVFL must account for every lost datagram");
    assert_eq!(rx.counters().kernel_drops, drops as u64);
}

#[test]
fn gso_refused_falls_back_and_loses_nothing() {
    // SO_NO_CHECK makes this kernel refuse GSO sends with EINVAL: the real fallback path.
    if kernel_max().is_none() {
        return skip("gso_refused_falls_back_and_loses_nothing", "no UDP_SEGMENT");
    }
    for mode in [SendMode::GsoSendmsg, SendMode::GsoSendmmsg] {
        let rx = rx_socket(lo4(), false);
        let tx = UdpSocket::builder(lo4()).send_mode(mode).bind().unwrap();
        tx.set_no_check(true).unwrap();
        assert!(tx.capabilities().gso);
        let sent: Vec<Vec<u8>> = (0..300).map(|i| payload(i, 1200)).collect();
        let mut batch = Batch::for_socket(&tx);
        for d in &sent {
            batch.push(rx.local_addr(), d).unwrap();
        }
        let got = std::thread::scope(|s| {
            let h = s.spawn(|| receive(&rx, sent.len(), Duration::from_millis(500), Duration::from_secs(5)));
            tx.send(&batch.transmits()).unwrap();
            h.join().unwrap()
        });
        assert_same(&sent, &got, mode.name());
        let caps = tx.capabilities();
        assert_eq!(caps.gso_refused_destinations, 1, "{caps}");
        assert!(caps.gso, "the refusal belongs to one destination, not the socket: {caps}");
        assert!(caps.gso_off_reason.as_deref().unwrap_or("").contains("Invalid argument"), "{caps}");
        let c = tx.counters();
        assert_eq!(c.gso_fallbacks, 1);
        assert_eq!(c.datagrams_sent, 300);
        // Later sends to that destination go plain from the start: no second fallback.
        batch = Batch::for_socket(&tx);
        batch.push(rx.local_addr(), &[1; 100]).unwrap();
        batch.push(rx.local_addr(), &[2; 100]).unwrap();
        tx.send(&batch.transmits()).unwrap();
        let c2 = tx.counters();
        assert_eq!((c2.gso_fallbacks, c2.gso_buffers_sent), (1, c.gso_buffers_sent), "{c2:?}");
        assert_eq!(receive(&rx, 2, Duration::from_millis(300), Duration::from_secs(2)).datagrams.len(), 2);
    }
}

#[test]
fn adopt_existing_socket() {
    let std_rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let rx = UdpSocket::adopt(&std_rx, udpx::SocketConfig::new(lo4())).unwrap();
    assert_eq!(rx.local_addr(), std_rx.local_addr().unwrap());
    let tx = UdpSocket::bind(lo4()).unwrap();
    tx.send(&[Transmit::new(rx.local_addr(), b"adopted")]).unwrap();
    let got = receive(&rx, 1, Duration::from_millis(300), Duration::from_secs(2));
    assert_eq!(got.datagrams, vec![b"adopted".to_vec()]);
    // A TCP socket is refused with a clear error.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = UdpSocket::adopt(&l, udpx::SocketConfig::new(lo4())).unwrap_err();
    assert!(e.to_string().contains("not a UDP socket"), "{e}");
}

#[test]
fn required_feature_missing_is_a_clear_error() {
    // pktinfo on IPv6 is universal, so use a feature we can make fail: GRO on a kernel without
    // it. Where the kernel has everything, check instead that Required succeeds and is on.
    let caps = KernelCaps::get();
    let r = UdpSocket::builder(lo4()).gro(Want::Required).bind();
    if caps.gro {
        assert!(r.unwrap().capabilities().gro);
    } else {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("IfAvailable"), "{e}");
    }
}

#[test]
fn nonblocking_empty_receive_would_block() {
    let rx = UdpSocket::builder(lo4()).nonblocking(true).bind().unwrap();
    let mut buf = [0u8; 64];
    let e = rx.recv(&mut [IoSliceMut::new(&mut buf)], &mut [RecvMeta::default()]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
}

#[test]
fn kernel_drops_readable_without_cmsgs() {
    let rx = UdpSocket::builder(lo4()).recv_buffer(4096).rxq_ovfl(Want::Off).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).send_mode(SendMode::Sendmmsg).bind().unwrap();
    let d = vec![1u8; 1000];
    let ts: Vec<Transmit<'_>> = (0..200).map(|_| Transmit::new(rx.local_addr(), &d)).collect();
    tx.send(&ts).unwrap();
    let got = receive(&rx, 200, Duration::from_millis(200), Duration::from_secs(2));
    assert_eq!(rx.kernel_drops().unwrap() as usize, 200 - got.datagrams.len());
}

#[test]
fn adopted_socket_wide_udp_segment_is_cleared() {
    // The socket option variant of UDP_SEGMENT: set socket-wide, the kernel would cut every
    // plain send into segments. udpx segments per message (cmsg), so adopting clears it.
    use nix::sys::socket::{setsockopt, sockopt::UdpGsoSegment};
    let std_tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    setsockopt(&std_tx, UdpGsoSegment, &100).unwrap();
    let rx = rx_socket(lo4(), false);
    // Before adopting, the kernel segments a plain 1000-byte send into 10 datagrams.
    std_tx.send_to(&payload(1, 1000), rx.local_addr()).unwrap();
    assert_eq!(receive(&rx, 10, Duration::from_millis(200), Duration::from_secs(2)).datagrams.len(), 10);
    let tx = UdpSocket::adopt(&std_tx, udpx::SocketConfig::new(lo4())).unwrap();
    tx.send(&[Transmit::new(rx.local_addr(), &payload(2, 1000))]).unwrap();
    let got = receive(&rx, 1, Duration::from_millis(200), Duration::from_secs(2));
    assert_eq!(got.datagrams, vec![payload(2, 1000)], "one datagram, as sent");
    // And a segmented transmit still segments, per message.
    let data: Vec<u8> = (0..4).flat_map(|i| payload(i, 300)).collect();
    tx.send(&[Transmit::new(rx.local_addr(), &data).segmented(300)]).unwrap();
    assert_eq!(receive(&rx, 4, Duration::from_millis(200), Duration::from_secs(2)).datagrams.len(), 4);
}

/// The receive-buffer sizing rule counts in the kernel's terms: what a queued datagram costs
/// (`udpx::rcvbuf::truesize`) is what the kernel charges here.
#[test]
fn rcvbuf_model_matches_what_the_kernel_charges() {
    for size in [1usize, 100, 1000, 1472, 4000, 32000, 60000] {
        let rx = UdpSocket::builder(lo4()).recv_buffer(8 << 20).bind().unwrap();
        let tx = UdpSocket::builder(lo4()).send_mode(SendMode::Sendmmsg).bind().unwrap();
        let d = vec![7u8; size];
        let ts: Vec<Transmit<'_>> = (0..20).map(|_| Transmit::new(rx.local_addr(), &d)).collect();
        tx.send(&ts).unwrap();
        let charged = rx.queued_bytes().unwrap() / 20;
        let model = udpx::rcvbuf::truesize(size);
        let off = charged.abs_diff(model) as f64 / model as f64;
        assert!(off <= 0.1, "payload {size}: the kernel charges {charged} B per datagram, the model says {model}");
        // And the plan for a burst of them fits that burst.
        let p = udpx::rcvbuf::plan(udpx::rcvbuf::RecvRole::Server { clients: 20, burst: 1, datagram: size });
        assert!(p.effective >= 20 * charged, "{p:?}");
    }
}

/// Caller-owned receive buffers: GRO trains split into their datagrams, plain datagrams one per
/// buffer, metadata beside each, data writable in place; `try_recv_into` never waits, even on
/// a blocking socket.
#[test]
fn recv_into_caller_owned_buffers() {
    use udpx::RecvBuffers;
    let gro = KernelCaps::get().gro && kernel_max().is_some();
    let rx = UdpSocket::builder(lo4()).gro(if gro { Want::Required } else { Want::Off }).bind().unwrap();
    let tx = UdpSocket::builder(lo4()).bind().unwrap();
    let mut bufs = RecvBuffers::for_socket(&rx, 8);
    // Nothing queued: WouldBlock at once although the socket blocks (a hang here is the bug).
    let e = rx.try_recv_into(&mut bufs).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    assert!(bufs.is_empty());
    let sent: Vec<Vec<u8>> = (0..10).map(|i| payload(i, 1000)).collect();
    let mut batch = Batch::for_socket(&tx);
    for d in &sent {
        batch.push(rx.local_addr(), d).unwrap();
    }
    tx.send(&batch.transmits()).unwrap();
    tx.send(&[Transmit::new(rx.local_addr(), b"last")]).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut got: Vec<Vec<u8>> = Vec::new();
    while got.len() < 11 {
        let n = rx.recv_into(&mut bufs).unwrap();
        assert_eq!(n, bufs.len());
        got.extend(bufs.datagrams().map(|(m, d)| {
            assert_eq!(m.addr, tx.local_addr());
            d.to_vec()
        }));
        if n > 0 {
            // In place: the first message's bytes are the caller's to change.
            let before = bufs.message(0).1[0];
            bufs.message_mut(0).1[0] ^= 0xff;
            assert_eq!(bufs.message(0).1[0], before ^ 0xff);
        }
    }
    let mut want = sent.clone();
    want.push(b"last".to_vec());
    assert_eq!(got, want);
    if gro {
        assert!(rx.counters().gro_buffers_received >= 1, "{:?}", rx.counters());
    }
    // GRO needs GRO-sized buffers.
    if gro {
        let e = rx.recv_into(&mut udpx::RecvBuffers::new(4, 2048)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }
}

#[test]
fn receive_times_are_the_kernels_and_only_when_asked() {
    let wall = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    for gro in [false, true] {
        if gro && !KernelCaps::get().gro {
            skip("receive_times gro", "UDP_GRO not supported by this kernel");
            continue;
        }
        let rx = UdpSocket::builder(lo4())
            .gro(if gro { Want::Required } else { Want::Off })
            .rx_time(Want::Required)
            .bind()
            .unwrap();
        assert!(rx.capabilities().rx_time);
        let tx = UdpSocket::builder(lo4()).send_mode(SendMode::Sendmmsg).bind().unwrap();
        let mut before = Vec::new();
        for i in 0..3u8 {
            before.push(wall());
            tx.send(&[Transmit::new(rx.local_addr(), &[i; 100])]).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        let got = receive(&rx, 3, Duration::from_millis(300), Duration::from_secs(2));
        let read = wall();
        assert_eq!(got.datagrams.len(), 3, "gro {gro}");
        for (i, m) in got.metas.iter().enumerate() {
            let t = m.rx_time.expect("SO_TIMESTAMPNS on: every datagram carries its receive time");
            assert!(
                t >= before[i] && t <= read,
                "gro {gro}: datagram {i} stamped {t:?}, sent at {:?}, read by {read:?}",
                before[i]
            );
        }
    }
    // Off (the default): no time, and no control space cut for it.
    let rx = UdpSocket::builder(lo4()).bind().unwrap();
    assert!(!rx.capabilities().rx_time);
    let tx = UdpSocket::builder(lo4()).bind().unwrap();
    tx.send(&[Transmit::new(rx.local_addr(), b"x")]).unwrap();
    let got = receive(&rx, 1, Duration::from_millis(300), Duration::from_secs(2));
    assert_eq!(got.metas[0].rx_time, None);
    assert!(!got.metas[0].control_truncated);
}
