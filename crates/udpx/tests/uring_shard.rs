//! The io_uring shard (`udpx::uring::UringShard`): requests in and replies out through one
//! ring. Over loopback: every request answered once from the address it was sent to, replies
//! submitted with the next wait, bad sizes and replies refused with what to change, each
//! send error taken its own way (injected), a reply to a closed port costing the others
//! nothing. Over a veth pair with a token-bucket qdisc (root): real full buffers and ENOBUFS
//! lose nothing, and a shard dropped with sends held in the kernel cancels them and returns.

#![cfg(feature = "io-uring")]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use udpx::uring::{QueueError, UringShardConfig};
use udpx::{Transmit, UdpSocket};

fn usable(test: &str) -> bool {
    match udpx::caps::io_uring_available() {
        Ok(()) => true,
        Err(why) => {
            skip(test, &why);
            false
        }
    }
}

/// Serves echo on `server` until `expect` requests were answered (or `limit` passed), then
/// flushes; returns the shard's send and receive stats.
fn serve(
    server: &UdpSocket,
    cfg: UringShardConfig,
    expect: u64,
    limit: Duration,
) -> (udpx::uring::UringShardStats, udpx::uring::UringRecvStats, bool) {
    let mut shard = server.uring_shard(cfg).unwrap();
    let deadline = Instant::now() + limit;
    let mut answered = 0;
    while answered < expect && Instant::now() < deadline {
        shard
            .turn(Some(Duration::from_millis(20)), |m, data, replies| {
                assert!(!m.truncated);
                replies.queue(&Transmit { src_ip: m.dst_ip, ..Transmit::new(m.addr, data) }).unwrap();
                answered += 1;
            })
            .unwrap();
    }
    assert!(shard.flush(Duration::from_secs(5)).unwrap(), "every reply went");
    (shard.stats(), shard.recv_stats(), shard.is_deferred())
}

#[test]
fn a_shard_answers_every_request_once_from_the_address_asked() {
    if !usable("a_shard_answers_every_request_once_from_the_address_asked") {
        return;
    }
    for any in [lo4(), lo6()] {
        let server = UdpSocket::builder(any).recv_buffer(4 << 20).bind().unwrap();
        let client = UdpSocket::builder(any).recv_buffer(4 << 20).bind().unwrap();
        let sent: Vec<Vec<u8>> = (0..600).map(|i| payload(i, 40 + (i as usize * 13) % 1400)).collect();
        let (stats, rx, deferred, got) = std::thread::scope(|s| {
            let h = s.spawn(|| serve(&server, UringShardConfig::default(), sent.len() as u64, Duration::from_secs(20)));
            let r = s.spawn(|| receive(&client, sent.len(), Duration::from_secs(2), Duration::from_secs(20)));
            for part in sent.chunks(50) {
                let ts: Vec<Transmit<'_>> = part.iter().map(|d| Transmit::new(server.local_addr(), d)).collect();
                client.send(&ts).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            let (st, rx, d) = h.join().unwrap();
            (st, rx, d, r.join().unwrap())
        });
        println!("{any}: deferred task run {deferred}; {stats:?}; {rx:?}");
        assert_same_set(&sent, &got, &format!("echo through a shard on {any}"));
        assert!(got.metas.iter().all(|m| m.addr == server.local_addr()), "replies come from the address asked");
        assert_eq!((stats.queued, stats.sent, stats.dropped()), (600, 600, 0), "{stats:?}");
        assert_eq!(rx.datagrams, 600);
        assert_eq!(server.counters().datagrams_sent, 600);
        // Replies go out with the enter that waits for the next requests: never more enters
        // with replies than turns.
        assert!(stats.submits <= stats.turns, "{stats:?}");
    }
}

#[test]
fn bad_shard_sizes_and_replies_are_refused_with_what_to_change() {
    if !usable("bad_shard_sizes_and_replies_are_refused_with_what_to_change") {
        return;
    }
    let server = UdpSocket::bind(lo4()).unwrap();
    let d = UringShardConfig::default();
    let refused = |cfg: UringShardConfig| server.uring_shard(cfg).unwrap_err().to_string();
    assert!(refused(UringShardConfig { send_slots: 0, ..d }).contains("give 1 to 4096"));
    assert!(refused(UringShardConfig { send_size: 0, ..d }).contains("give 1 to"));
    assert!(refused(UringShardConfig { send_size: 70_000, ..d }).contains("give 1 to"));
    assert!(refused(UringShardConfig { recv_buffers: 3, ..d }).contains("power of two"));

    let client = UdpSocket::bind(lo4()).unwrap();
    let to = client.local_addr();
    let mut shard = server.uring_shard(UringShardConfig { send_slots: 2, send_size: 100, ..d }).unwrap();
    let big = [7u8; 101];
    let e = shard.queue(&Transmit::new(to, &big)).unwrap_err();
    assert_eq!(e, QueueError::TooLarge { len: 101, slot: 100 });
    assert!(e.to_string().contains("send_size of at least 101"), "{e}");
    let e = shard.queue(&Transmit::new(to, &[1u8; 90]).segmented(30)).unwrap_err();
    assert_eq!(e, QueueError::Segmented { segments: 3 });
    assert!(e.to_string().contains("UdpSocket::send"), "{e}");
    let v6: SocketAddr = "[::1]:9".parse().unwrap();
    assert!(matches!(shard.queue(&Transmit::new(v6, b"x")), Err(QueueError::Invalid(_))));
    shard.queue(&Transmit::new(to, b"one")).unwrap();
    shard.queue(&Transmit::new(to, b"two")).unwrap();
    let e = shard.queue(&Transmit::new(to, b"three")).unwrap_err();
    assert_eq!(e, QueueError::Full { slots: 2 });
    assert!(e.to_string().contains("more send_slots"), "{e}");
    assert_eq!(shard.pending(), 2);
    assert!(shard.flush(Duration::from_secs(5)).unwrap());
    assert_eq!(shard.pending(), 0);
    let got = receive(&client, 2, Duration::from_secs(2), Duration::from_secs(5));
    assert_eq!(got.datagrams, vec![b"one".to_vec(), b"two".to_vec()]);
    assert_eq!((shard.stats().queued, shard.stats().sent), (2, 2));
}

/// Each send error the kernel can answer a reply with, injected on its first try (the
/// test-only seam): EAGAIN, ENOBUFS and an ICMP error left by another datagram are sent
/// again; EMSGSIZE on every try (a size error is deterministic: tried three times more as a
/// possible pending ICMP error first) and anything else are dropped and counted by why.
#[cfg(feature = "fault-injection")]
#[test]
fn each_send_error_is_retried_or_counted_as_dropped() {
    use udpx::Fault;
    if !usable("each_send_error_is_retried_or_counted_as_dropped") {
        return;
    }
    let server = UdpSocket::bind(lo4()).unwrap();
    let client = UdpSocket::bind(lo4()).unwrap();
    let mut shard = server.uring_shard(UringShardConfig::default()).unwrap();
    for e in [libc::EAGAIN, libc::ENOBUFS, libc::ECONNREFUSED, libc::EMSGSIZE, libc::EPERM] {
        server.inject_fault(Fault::Errno(e));
    }
    // The second round re-sends replies 0-3 in order: 0-2 go, 3 fails again, and twice more
    // on its own after that.
    for f in [Fault::Pass, Fault::Pass, Fault::Pass] {
        server.inject_fault(f);
    }
    for _ in 0..3 {
        server.inject_fault(Fault::Errno(libc::EMSGSIZE));
    }
    let sent: Vec<Vec<u8>> = (0..5).map(|i| payload(i, 64)).collect();
    for d in &sent {
        shard.queue(&Transmit::new(client.local_addr(), d)).unwrap();
    }
    assert!(shard.flush(Duration::from_secs(5)).unwrap());
    let st = shard.stats();
    assert_eq!(
        (st.sent, st.would_block, st.enobufs_retries, st.icmp_retries, st.dropped_too_large, st.dropped_error),
        (3, 1, 1, 4, 1, 1),
        "{st:?}"
    );
    let got = receive(&client, 3, Duration::from_millis(500), Duration::from_secs(5));
    assert_same_set(&sent[..3], &got, "the retried replies");
    let c = server.counters();
    assert_eq!((c.would_block, c.enobufs_retries, c.icmp_retries, c.emsgsize, c.send_errors), (1, 1, 4, 1, 1));
}

/// Replies to a client that closed its port: the kernel answers them with ICMP port
/// unreachable, which leaves an error pending on the server's socket for whichever call comes
/// next (a receive, or another client's reply). The other client gets every reply.
#[test]
fn a_reply_to_a_closed_port_costs_the_others_nothing() {
    if !usable("a_reply_to_a_closed_port_costs_the_others_nothing") {
        return;
    }
    let server = UdpSocket::builder(lo4()).recv_buffer(4 << 20).bind().unwrap();
    if !server.capabilities().recv_err {
        return skip("a_reply_to_a_closed_port_costs_the_others_nothing", "IP_RECVERR not set on this socket");
    }
    let stay = UdpSocket::builder(lo4()).recv_buffer(4 << 20).bind().unwrap();
    let sent: Vec<Vec<u8>> = (0..300).map(|i| payload(i, 100)).collect();
    {
        let gone = UdpSocket::bind(lo4()).unwrap();
        for (i, d) in sent.iter().enumerate() {
            let from = if i % 2 == 0 { &gone } else { &stay };
            from.send(&[Transmit::new(server.local_addr(), d)]).unwrap();
        }
    } // `gone` closes here, before any reply to it.
    let (stats, rx, _) = serve(&server, UringShardConfig::default(), 300, Duration::from_secs(20));
    let got = receive(&stay, 150, Duration::from_secs(1), Duration::from_secs(10));
    let theirs: Vec<Vec<u8>> = sent.iter().skip(1).step_by(2).cloned().collect();
    assert_same_set(&theirs, &got, "the replies to the client that stayed");
    assert_eq!(stats.dropped(), 0, "{stats:?}");
    // The ICMP errors were met, by a reply's send or by the receive, and read.
    assert!(stats.icmp_retries + rx.icmp_errors > 0, "{stats:?} {rx:?}");
    assert!(server.counters().icmp_errors > 0);
}

mod veth {
    use super::*;
    use udpx_netns::{skip_unless_capable, Profile, Side, TestNet, TestNetConfig};

    fn net_with_tbf(args: &str) -> TestNet {
        let n = TestNet::setup(&TestNetConfig { profile: Profile::Offload, mtu: 1500, tx_cpu: None, rx_cpu: None })
            .expect("set up veth pair");
        let mut cmd = vec!["tc", "qdisc", "replace", "dev", &n.tx_dev, "root", "tbf"];
        cmd.extend(args.split(' '));
        n.tx.exec(&cmd).expect("tbf qdisc");
        n
    }

    /// Queues `sent` to `to` through a shard on `tx`, as slots free up, until all went.
    fn flood(tx: &UdpSocket, to: SocketAddr, sent: &[Vec<u8>]) -> udpx::uring::UringShardStats {
        let mut shard = tx.uring_shard(UringShardConfig { send_size: 1500, ..UringShardConfig::default() }).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut next = 0;
        while next < sent.len() && Instant::now() < deadline {
            while next < sent.len() {
                match shard.queue(&Transmit::new(to, &sent[next])) {
                    Ok(()) => next += 1,
                    Err(QueueError::Full { .. }) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            shard.turn(Some(Duration::from_millis(5)), |_, _, _| {}).unwrap();
        }
        assert!(shard.flush(Duration::from_secs(30)).unwrap(), "every reply went");
        shard.stats()
    }

    #[test]
    fn real_full_buffers_and_enobufs_lose_nothing_through_a_shard() {
        if skip_unless_capable("real_full_buffers_and_enobufs_lose_nothing_through_a_shard") {
            return;
        }
        // A 4 MB queue and a 16 KiB send buffer: the socket fills (the kernel holds sends
        // until there is room). An 8 KB queue: the qdisc refuses (ENOBUFS).
        for (limit, sndbuf) in [("4mb", 16 << 10), ("8kb", 1 << 20)] {
            let n = net_with_tbf(&format!("rate 200mbit burst 128kb limit {limit}"));
            let rx = n.ns(Side::Rx).run({
                let cfg = UdpSocket::builder(SocketAddr::new(n.rx_v4.into(), 0)).recv_buffer(16 << 20);
                move || cfg.bind().unwrap()
            });
            let tx = n.ns(Side::Tx).run({
                let cfg = UdpSocket::builder(SocketAddr::new(n.tx_v4.into(), 0)).send_buffer(sndbuf);
                move || cfg.bind().unwrap()
            });
            let sent: Vec<Vec<u8>> = (0..3000).map(|i| payload(i, 1000)).collect();
            let (stats, got) = std::thread::scope(|s| {
                let h = s.spawn(|| receive(&rx, sent.len(), Duration::from_secs(1), Duration::from_secs(30)));
                let st = flood(&tx, rx.local_addr(), &sent);
                (st, h.join().unwrap())
            });
            println!("tbf limit {limit}, send buffer {sndbuf}: {stats:?}");
            assert_same_set(&sent, &got, &format!("tbf limit {limit}"));
            assert_eq!((stats.sent, stats.dropped()), (3000, 0), "{stats:?}");
            if limit == "8kb" {
                assert!(stats.enobufs_retries > 0, "the qdisc never refused: {stats:?}");
            }
        }
    }

    #[test]
    fn a_shard_dropped_with_sends_in_the_kernel_cancels_them() {
        if skip_unless_capable("a_shard_dropped_with_sends_in_the_kernel_cancels_them") {
            return;
        }
        // 1 Mbit/s and an 8 KiB send buffer: most of 200 replies wait in the kernel for room.
        let n = net_with_tbf("rate 1mbit burst 4kb limit 1mb");
        let rx = n.ns(Side::Rx).run({
            let cfg = UdpSocket::builder(SocketAddr::new(n.rx_v4.into(), 0)).recv_buffer(4 << 20);
            move || cfg.bind().unwrap()
        });
        let tx = n.ns(Side::Tx).run({
            let cfg = UdpSocket::builder(SocketAddr::new(n.tx_v4.into(), 0)).send_buffer(8 << 10);
            move || cfg.bind().unwrap()
        });
        let to = rx.local_addr();
        let mut shard = tx.uring_shard(UringShardConfig { send_size: 1500, ..UringShardConfig::default() }).unwrap();
        let sent: Vec<Vec<u8>> = (0..200).map(|i| payload(i, 1000)).collect();
        for d in &sent {
            shard.queue(&Transmit::new(to, d)).unwrap();
        }
        shard.turn(Some(Duration::from_millis(20)), |_, _, _| {}).unwrap();
        let held = shard.pending();
        assert!(held > 100, "sends held in the kernel: {held}; {:?}", shard.stats());
        drop(shard);
        // Cancelled, not waited for: what was already in the qdisc arrives (the send buffer
        // bounds it), the rest never leaves. A drop that waited would deliver all 200.
        let got = receive(&rx, sent.len(), Duration::from_secs(1), Duration::from_secs(10));
        println!("dropped with {held} of 200 sends in the kernel: {} arrived", got.datagrams.len());
        assert!(got.datagrams.len() <= 200 - held + 20, "{} arrived", got.datagrams.len());
        assert!(got.datagrams.iter().all(|d| sent.contains(d)), "nothing corrupted");
        // The socket still sends.
        tx.send(&[Transmit::new(to, b"after")]).unwrap();
        let after = receive(&rx, 1, Duration::from_secs(2), Duration::from_secs(5));
        assert_eq!(after.datagrams, vec![b"after".to_vec()]);
    }
}
