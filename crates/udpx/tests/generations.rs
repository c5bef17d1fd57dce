//! Generation steering on loopback, through the kernel's own verifier and reuseport code: two
//! groups of one port (an old server and its upgrade, here in one process) each get their own
//! connections' packets, new client DCIDs go to the newest, a client's first round trip stays
//! where it began (only a full-sized QUIC v1 Initial takes a flow, so a flood of small long
//! headers evicts none), and a generation that is gone falls to the newest one's shard. Needs
//! CAP_BPF and CAP_NET_ADMIN (root); prints `SKIP:` otherwise.

mod common;

use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use udpx::generations::{recv_fds, send_fds, CidLayout, Generations, FLOW_ENTRIES};
use udpx::{ShardGroup, SocketConfig};

const LAYOUT: CidLayout = CidLayout { len: 12, first_octet: 0x0b, generation_byte: 10, worker_byte: 11 };

/// A server connection ID of the layout.
fn cid(generation: u8, worker: u8, nonce: u8) -> Vec<u8> {
    let mut c = vec![0x0b, 0, 1, nonce, 7, 7, 7, 7, 7, 7, generation, worker];
    c[3] = nonce;
    c
}

/// A short-header packet to `dcid`, tagged.
fn short(dcid: &[u8], tag: u8) -> Vec<u8> {
    [&[0x41u8][..], dcid, &[0xee; 16], &[tag]].concat()
}

/// A long-header packet of `kind` (0 Initial, 1 0-RTT, 2 Handshake; QUIC v1) to `dcid`, tagged.
fn long(kind: u8, dcid: &[u8], tag: u8) -> Vec<u8> {
    [&[0xc0u8 | kind << 4, 0, 0, 0, 1, dcid.len() as u8][..], dcid, &[8], &[0x55; 8], &[0; 40], &[tag]].concat()
}

/// [`long`] padded to `size` bytes before its tag.
fn long_sized(kind: u8, dcid: &[u8], tag: u8, size: usize) -> Vec<u8> {
    let mut p = long(kind, dcid, tag);
    assert!(size >= p.len());
    p.pop();
    p.resize(size - 1, 0);
    p.push(tag);
    p
}

/// A client's first Initial to `dcid`: a datagram of 1,200 bytes (RFC 9000 14.1), tagged.
fn initial(dcid: &[u8], tag: u8) -> Vec<u8> {
    long_sized(0, dcid, tag, 1200)
}

/// Sends `packets` and returns, for each tag, the index (in `sockets`) of the one it reached.
fn landing(sockets: &[&udpx::UdpSocket], to: std::net::SocketAddr, packets: &[Vec<u8>]) -> Vec<Option<usize>> {
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for p in packets {
        tx.send_to(p, to).unwrap();
    }
    let mut at = vec![None; packets.len()];
    let mut seen = 0;
    for (i, s) in sockets.iter().enumerate() {
        let got = receive(s, packets.len(), Duration::from_millis(100), Duration::from_secs(2));
        for d in got.datagrams {
            let tag = usize::from(*d.last().unwrap());
            assert!(at[tag].is_none(), "packet {tag} arrived twice");
            at[tag] = Some(i);
            seen += 1;
        }
    }
    assert_eq!(seen, packets.len(), "every packet arrives once: {at:?}");
    at
}

#[test]
fn each_generation_gets_its_own_and_new_flows_go_to_the_newest() {
    let gens = match Generations::create(LAYOUT) {
        Ok(g) => g,
        Err(e) => return skip("each_generation_gets_its_own_and_new_flows_go_to_the_newest", &e.to_string()),
    };
    // Generation 4 (the old server): two workers, published.
    let old = ShardGroup::bind_generation(SocketConfig::new(lo4()), 2, &gens, 4, false).unwrap();
    gens.publish(4, 2).unwrap();
    let to = old.local_addr();
    // A second group may not take the port without asking to join.
    let refused = ShardGroup::bind_generation(SocketConfig::new(to), 1, &gens, 9, false);
    assert!(refused.is_err(), "a taken port is refused unless joining");
    let olds: Vec<&udpx::UdpSocket> = old.sockets().iter().collect();
    // Before the upgrade: a client's first Initial (its own 8-byte DCID) goes to generation 4.
    let early = [9u8, 8, 7, 6, 5, 4, 3, 2];
    let got = landing(&olds, to, &[initial(&early, 0)]);
    assert!(got[0].is_some());
    let early_at = got[0];

    // Generation 5 (the upgrade) gets the maps and the program over a Unix socket, as the
    // next process would: three workers, joins the port, then takes new connections.
    let (a, b) = UnixStream::pair().unwrap();
    send_fds(&a, b"generations", &gens.fds()).unwrap();
    let mut buf = [0u8; 64];
    let (n, fds) = recv_fds(&b, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"generations");
    let gens = Generations::from_fds(fds).unwrap();
    let new = ShardGroup::bind_generation(SocketConfig::new(to), 3, &gens, 5, true).unwrap();
    gens.publish(5, 3).unwrap();
    assert_eq!(gens.newest(), (5, 3));
    assert!(gens.is_live(4, 1) && gens.is_live(5, 2) && !gens.is_live(5, 3) && !gens.is_live(6, 0));
    let mut all: Vec<&udpx::UdpSocket> = old.sockets().iter().collect();
    all.extend(new.sockets().iter());
    let fresh = [1u8, 1, 2, 3, 5, 8, 13, 21, 34];
    let packets = vec![
        short(&cid(4, 0, 1), 0),   // generation 4's worker 0
        short(&cid(4, 1, 2), 1),   // generation 4's worker 1
        short(&cid(5, 2, 3), 2),   // generation 5's worker 2
        long(2, &cid(4, 1, 4), 3), // a Handshake to generation 4's worker 1
        long(0, &early, 4),        // the early client's retransmitted Initial
        long(1, &early, 5),        // and its 0-RTT
        initial(&fresh, 6),        // a new client: the newest generation
        long(1, &fresh, 7),        // its 0-RTT follows it
        long(0, &cid(4, 0, 5), 8), // an Initial after generation 4's Retry: generation 4
        short(&cid(7, 4, 6), 9),   // generation 7 never lived: the newest's worker 4 % 3
        short(&cid(4, 9, 7), 10),  // a worker generation 4 lacks: the newest's 9 % 3
    ];
    let got = landing(&all, to, &packets);
    assert_eq!(got[0], Some(0));
    assert_eq!(got[1], Some(1));
    assert_eq!(got[2], Some(2 + 2));
    assert_eq!(got[3], Some(1));
    assert_eq!(got[4], early_at, "a first round trip stays on the generation it began on");
    assert_eq!(got[5], early_at);
    assert!(matches!(got[6], Some(2..=4)), "a new client goes to the newest generation: {got:?}");
    assert_eq!(got[7], got[6]);
    assert_eq!(got[8], Some(0));
    assert_eq!(got[9], Some(2 + 1));
    assert_eq!(got[10], Some(2));

    // The old generation ends: its IDs now reach the newest generation's shard for their
    // worker byte (which answers with a stateless reset), never a socket of a live one's.
    drop(olds);
    drop(all);
    drop(old);
    assert!(!gens.is_live(4, 0), "a closed socket leaves the array");
    let news: Vec<&udpx::UdpSocket> = new.sockets().iter().collect();
    let got = landing(&news, to, &[short(&cid(4, 1, 1), 0), short(&cid(5, 0, 1), 1), long(0, &early, 2)]);
    assert_eq!(got[0], Some(1));
    assert_eq!(got[1], Some(0));
    assert!(got[2].is_some());
}

/// Receives and drops whatever is queued on `sockets` (a flood's datagrams).
fn drain(sockets: &[&udpx::UdpSocket]) -> usize {
    sockets
        .iter()
        .map(|s| receive(s, usize::MAX, Duration::from_millis(200), Duration::from_secs(10)).datagrams.len())
        .sum()
}

#[test]
fn only_full_sized_initials_take_a_flow_and_a_flood_of_small_ones_evicts_none() {
    let name = "only_full_sized_initials_take_a_flow_and_a_flood_of_small_ones_evicts_none";
    let gens = match Generations::create(LAYOUT) {
        Ok(g) => g,
        Err(e) => return skip(name, &e.to_string()),
    };
    let old = ShardGroup::bind_generation(SocketConfig::new(lo4()), 2, &gens, 4, false).unwrap();
    gens.publish(4, 2).unwrap();
    let to = old.local_addr();
    // While generation 4 is the newest: a handshake's first Initial (exactly 1,200 bytes), and
    // long headers that must not take a flow, each with a DCID never seen: an Initial of 1,199
    // bytes, a Handshake and a 0-RTT packet of 1,200, and a 1,200-byte Initial of QUIC v2 (type
    // bits 01, version 0x6b3343cf), which udpx does not speak (it answers Version Negotiation).
    let kept = [0xa1u8, 2, 3, 4, 5, 6, 7, 8];
    let small = [0xb1u8, 2, 3, 4, 5, 6, 7, 8];
    let handshake = [0xc1u8, 2, 3, 4, 5, 6, 7, 8];
    let zero_rtt = [0xd1u8, 2, 3, 4, 5, 6, 7, 8];
    let v2 = [0xe1u8, 2, 3, 4, 5, 6, 7, 8];
    let mut v2_initial = long_sized(1, &v2, 4, 1200);
    v2_initial[1..5].copy_from_slice(&0x6b33_43cfu32.to_be_bytes());
    let olds: Vec<&udpx::UdpSocket> = old.sockets().iter().collect();
    let first = [
        initial(&kept, 0),
        long_sized(0, &small, 1, 1199),
        long_sized(2, &handshake, 2, 1200),
        long_sized(1, &zero_rtt, 3, 1200),
        v2_initial,
    ];
    let kept_at = landing(&olds, to, &first)[0];
    assert!(kept_at.is_some());

    // The upgrade takes new connections: what took no flow now goes to generation 5.
    let new = ShardGroup::bind_generation(SocketConfig::new(to), 3, &gens, 5, true).unwrap();
    gens.publish(5, 3).unwrap();
    let mut all: Vec<&udpx::UdpSocket> = old.sockets().iter().collect();
    all.extend(new.sockets().iter());
    let next = [long(0, &small, 0), long(2, &handshake, 1), long(1, &zero_rtt, 2), long(0, &v2, 3)];
    let got = landing(&all, to, &next);
    for (i, what) in ["a 1,199-byte Initial", "a Handshake", "a 0-RTT packet", "a QUIC v2 Initial"].iter().enumerate() {
        assert!(matches!(got[i], Some(2..=4)), "{what} took a flow to generation 4: {got:?}");
    }

    // A flood of 20-byte long headers (Initial, 0-RTT and Handshake types), each with a DCID
    // of its own, three times the flow table's entries. The handshake's entry is not looked up
    // before it (the kernel's LRU gives an entry looked up since its insertion a second chance):
    // a handshake whose retransmitted Initial is still to come is the one a flood would evict.
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..3 * u64::from(FLOW_ENTRIES) {
        let dcid = (0x7700_0000_0000_0000u64 | i).to_be_bytes();
        tx.send_to(&long(i as u8 % 3, &dcid, 0)[..20], to).unwrap();
    }
    assert!(drain(&all) > 0, "the flood reached the port");
    let got = landing(&all, to, &[initial(&kept, 0), long(1, &kept, 1)]);
    assert_eq!(got[0], kept_at, "the handshake's retransmitted Initial, after the flood: where its first went");
    assert_eq!(got[1], kept_at, "its 0-RTT too");
}
