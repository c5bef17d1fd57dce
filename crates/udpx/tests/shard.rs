//! Reuseport shard groups over loopback: the CPU steering program puts every datagram on the
//! socket of the CPU that processed it (on loopback, the sender's CPU); the QUIC connection-ID
//! program on the socket its DCID byte names; the kernel hash spreads flows and loses none.

mod common;

use std::time::Duration;

use common::*;
use udpx::{ShardGroup, SocketConfig, Steering, Transmit, UdpSocket};

fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

/// Which socket of the group got each datagram, draining all of them.
fn collect(group: &ShardGroup, expect: usize) -> Vec<Vec<Vec<u8>>> {
    collect_from(&group.sockets().iter().collect::<Vec<_>>(), expect)
}

fn collect_from<S: std::ops::Deref<Target = UdpSocket>>(sockets: &[S], expect: usize) -> Vec<Vec<Vec<u8>>> {
    let per: Vec<Vec<Vec<u8>>> = sockets
        .iter()
        .map(|s| receive(s, expect, Duration::from_millis(150), Duration::from_secs(2)).datagrams)
        .collect();
    assert_eq!(per.iter().map(Vec::len).sum::<usize>(), expect, "every datagram arrives exactly once");
    per
}

#[test]
fn cpu_steering_lands_on_the_senders_cpu() {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let group = ShardGroup::bind(SocketConfig::new(lo4()), cpus, Steering::Cpu).unwrap();
    let dst = group.local_addr();
    for k in 0..cpus {
        std::thread::scope(|s| {
            s.spawn(|| {
                pin(k);
                let tx = UdpSocket::bind(lo4()).unwrap();
                let d = [k as u8; 64];
                let ts: Vec<Transmit<'_>> = (0..40).map(|_| Transmit::new(dst, &d)).collect();
                tx.send(&ts).unwrap();
            });
        });
        let per = collect(&group, 40);
        assert_eq!(
            per[k].len(),
            40,
            "CPU {k}: datagrams per socket {:?}",
            per.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
}

/// A QUIC v1 long-header packet (an Initial) with destination connection ID `dcid`.
fn long_header(dcid: &[u8]) -> Vec<u8> {
    [&[0xc0u8, 0, 0, 0, 1, dcid.len() as u8][..], dcid, &[4, 9, 9, 9, 9], &[0u8; 40]].concat()
}

#[test]
fn quic_cid_steering_follows_the_connection_id() {
    let group = ShardGroup::bind(SocketConfig::new(lo4()), 4, Steering::QuicCid { cid_byte: 0 }).unwrap();
    let dst = group.local_addr();
    let tx = UdpSocket::bind(lo4()).unwrap();
    for cid in 0u8..8 {
        // Short header, then a long header of the same connection: both on shard cid % 4.
        for pkt in [vec![0x41, cid, 0xaa, 0xbb, 0xcc], long_header(&[cid, 1, 2, 3, 4, 5, 6, 7])] {
            tx.send(&[Transmit::new(dst, &pkt)]).unwrap();
            let per = collect(&group, 1);
            assert_eq!(per[(cid % 4) as usize].len(), 1, "DCID byte {cid}, first byte {:#x}", pkt[0]);
        }
    }
    // Too short for the byte, or a long header with an empty DCID: the kernel falls back to
    // its hash; each still arrives once.
    tx.send(&[Transmit::new(dst, &[0x41])]).unwrap();
    collect(&group, 1);
    tx.send(&[Transmit::new(dst, &long_header(&[]))]).unwrap();
    collect(&group, 1);
}

/// The steering program counts the group's sockets. Shard handles keep every socket open
/// after the group value is gone, so no slot is refilled and no connection moves.
#[test]
fn shards_keep_their_slots_when_the_group_value_is_dropped() {
    let group = ShardGroup::bind(SocketConfig::new(lo4()), 3, Steering::QuicCid { cid_byte: 2 }).unwrap();
    let dst = group.local_addr();
    let shards = group.shards();
    drop(group);
    assert_eq!(shards.iter().map(|s| s.index()).collect::<Vec<_>>(), vec![0, 1, 2]);
    let tx = UdpSocket::bind(lo4()).unwrap();
    for b in 0u8..6 {
        tx.send(&[Transmit::new(dst, &long_header(&[7, 7, b, 7]))]).unwrap();
        let per = collect_from(&shards, 1);
        assert_eq!(per[(b % 3) as usize].len(), 1, "CID byte {b}");
    }
}

#[test]
fn hash_steering_spreads_flows_and_loses_nothing() {
    let group = ShardGroup::bind(SocketConfig::new(lo4()), 4, Steering::Hash).unwrap();
    let dst = group.local_addr();
    let senders: Vec<UdpSocket> = (0..64).map(|_| UdpSocket::bind(lo4()).unwrap()).collect();
    for s in &senders {
        s.send(&[Transmit::new(dst, b"flow")]).unwrap();
    }
    let per = collect(&group, 64);
    assert!(per.iter().filter(|v| !v.is_empty()).count() >= 2, "64 flows all hashed to one socket");
}

#[test]
fn bad_steering_is_refused() {
    let e = ShardGroup::bind(SocketConfig::new(lo4()), 0, Steering::Hash).unwrap_err();
    assert!(e.to_string().contains("at least 1"), "{e}");
    let e = ShardGroup::bind(SocketConfig::new(lo4()), 2, Steering::QuicCid { cid_byte: 20 }).unwrap_err();
    assert!(e.to_string().contains("byte 20") && e.to_string().contains("0 to 19"), "{e}");
    let e = ShardGroup::bind(SocketConfig::new(lo4()), 70_000, Steering::Hash).unwrap_err();
    assert!(e.to_string().contains("at most 65535"), "{e}");
}

/// A port already held, even by another reuseport group of this user (which the kernel would
/// let new sockets join), is refused instead of joined.
#[test]
fn a_taken_port_is_refused_not_joined() {
    let first = ShardGroup::bind(SocketConfig::new(lo4()), 2, Steering::Hash).unwrap();
    let taken = first.local_addr();
    let e = ShardGroup::bind(SocketConfig::new(taken), 2, Steering::Hash).unwrap_err();
    assert!(e.to_string().contains("the port is taken"), "{e}");
    assert!(matches!(&e, udpx::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse), "{e:?}");
    let plain = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let e = ShardGroup::bind(SocketConfig::new(plain.local_addr().unwrap()), 1, Steering::Hash).unwrap_err();
    assert!(e.to_string().contains("the port is taken"), "{e}");
}
