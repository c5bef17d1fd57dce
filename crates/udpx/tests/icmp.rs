//! ICMP errors at a server: clients that close their ports after a request make the kernel
//! answer the server's replies with ICMP port unreachable. With IP_RECVERR (udpx's default,
//! which keeps qdisc drops visible) every such error leaves a pending socket error that fails
//! the server's next call and raises POLLERR. The server must keep serving everyone else,
//! losing nothing, and count what it read.

mod common;

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::time::Duration;

use common::*;
use udpx::{ErrorOrigin, Transmit, UdpSocket, Want};

/// A closed port: bound once, then closed.
fn dead_port() -> SocketAddr {
    StdUdp::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn a_server_keeps_serving_when_clients_close_their_ports() {
    for recv_err in [true, false] {
        let srv = UdpSocket::builder(lo4()).recv_err(recv_err).bind().unwrap();
        srv.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let steady = StdUdp::bind("127.0.0.1:0").unwrap();
        steady.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 64];
        for round in 0u8..20 {
            // A client that asks and leaves before the answer.
            let gone = StdUdp::bind("127.0.0.1:0").unwrap();
            gone.send_to(&[round], srv.local_addr()).unwrap();
            steady.send_to(&[100 + round], srv.local_addr()).unwrap();
            drop(gone);
            let got = receive(&srv, 2, Duration::from_millis(500), Duration::from_secs(2));
            assert_eq!(got.datagrams.len(), 2, "recv_err {recv_err}, round {round}: a request was lost");
            // One call per reply: the first, to the closed port, draws an ICMP error that
            // fails the next call unless udpx deals with it.
            for (m, d) in got.metas.iter().zip(&got.datagrams) {
                srv.send(&[Transmit::new(m.addr, d)])
                    .unwrap_or_else(|e| panic!("recv_err {recv_err}, round {round}: reply to {}: {e}", m.addr));
            }
            let (n, _) = steady.recv_from(&mut buf).expect("the steady client's reply");
            assert_eq!(&buf[..n], &[100 + round]);
        }
        let c = srv.counters();
        if recv_err {
            assert!(c.icmp_errors > 0, "the port-unreachable errors were read and counted: {c:?}");
        } else {
            assert_eq!(c.icmp_errors, 0, "without IP_RECVERR nothing is queued: {c:?}");
        }
    }
}

#[test]
fn drain_errors_names_the_unreachable_destination() {
    // With receive times on, the kernel stamps the error queue's messages too: the error is
    // read the same.
    for rx_time in [Want::Off, Want::Required] {
        let srv = UdpSocket::builder(lo4()).rx_time(rx_time).bind().unwrap();
        let dst = dead_port();
        srv.send(&[Transmit::new(dst, b"anyone there?")]).unwrap();
        let mut seen = Vec::new();
        for _ in 0..100 {
            srv.drain_errors(|e| seen.push(*e)).unwrap();
            if !seen.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(seen.len(), 1, "rx_time {rx_time:?}: {seen:?}");
        let e = seen[0];
        assert_eq!((e.destination, e.errno, e.origin), (Some(dst), libc::ECONNREFUSED, ErrorOrigin::Icmp));
        assert_eq!((e.icmp_type, e.icmp_code), (3, 3), "destination unreachable, port unreachable");
        // The queue is empty and the pending error gone: the next send is unaffected.
        srv.send(&[Transmit::new(dst, b"again")]).unwrap();
    }
}

/// An ICMP error on the queue raises POLLERR; a wait must read it and go on waiting, not
/// return at once over and over.
#[test]
fn waits_read_the_error_queue_instead_of_spinning() {
    let srv = UdpSocket::builder(lo4()).bind().unwrap();
    srv.send(&[Transmit::new(dead_port(), b"x")]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!srv.wait_readable(Duration::from_millis(100)).unwrap(), "nothing to read");
    assert_eq!(srv.counters().icmp_errors, 1, "the wait read the queued error");
    assert!(srv.wait_writable(Duration::from_millis(100)).unwrap());
}

/// The raw socket the forged-ICMP tests send from, or `None` (skip recorded) when not root.
fn raw_sender(what: &str) -> Option<udpx_netns::forge::RawSender> {
    if !udpx_netns::is_root() {
        udpx_netns::record_skip(what, "forging ICMP errors needs a raw socket (root)");
        return None;
    }
    Some(udpx_netns::forge::RawSender::new().expect("raw socket as root"))
}

/// An ICMP error of `code` (type 3) from `offender`, about a datagram `server` sent to
/// `victim` whose payload began with `payload`.
fn forged_unreachable(
    server: SocketAddr,
    victim: std::net::SocketAddrV4,
    offender: std::net::Ipv4Addr,
    code: u8,
    payload: &[u8],
) -> Vec<u8> {
    use udpx_netns::forge::*;
    let SocketAddr::V4(server) = server else { panic!("IPv4 server") };
    let quoted = udp_datagram(server, victim, payload);
    let mtu = if code == unreach::FRAG_NEEDED { 1280 } else { 0 };
    icmp_error(offender, *server.ip(), ICMP_DEST_UNREACH, code, mtu, &quoted, 8 + payload.len())
}

/// A flood of forged ICMP errors of every "unreachable" code (fragmentation needed included)
/// about datagrams the server never sent, while a client asks and the server answers on a
/// non-blocking event loop: no call returns an ICMP error, every request is answered, and the
/// errors are counted by kind and by sender. (Before this rule, 1,000 such errors in a burst
/// made a receive return EHOSTUNREACH after 8 retries, and the QUIC host ended on it.)
///
/// Flood, client and server take turns on this thread, so what is judged does not depend on
/// how the machine schedules threads (a server thread that fell behind a flood thread found
/// its buffer full of queued errors, and requests were dropped before it could read them).
/// Each round queues a burst of errors with the round's requests among them, then runs the
/// server's loop until those requests are answered, queuing more errors between each receive
/// and its replies (so the sends meet pending errors too), then collects the replies.
#[test]
fn a_forged_icmp_flood_never_fails_a_call_and_every_request_is_answered() {
    let Some(raw) = raw_sender("a forged ICMP flood never fails a call") else { return };
    let srv = UdpSocket::builder(lo4()).nonblocking(true).buffers(4 << 20, 4 << 20).bind().unwrap();
    let server = srv.local_addr();
    let victim = "127.0.0.9:9999".parse().unwrap();
    let offender: std::net::Ipv4Addr = "127.0.0.7".parse().unwrap();
    const ROUNDS: u32 = 100;
    /// Requests per round, one after every `BURST / PER_ROUND` errors of the round's burst.
    const PER_ROUND: u32 = 20;
    /// Errors queued with a round's requests: far more than any retry budget.
    const BURST: usize = 200;
    /// Errors queued between a receive and the sending of its replies.
    const BETWEEN: usize = 10;
    let packets: Vec<Vec<u8>> = udpx_netns::forge::unreach::ALL
        .iter()
        .map(|&code| forged_unreachable(server, victim, offender, code, b"not ours"))
        .collect();
    let mut forged = 0usize;
    let mut forge = |n: usize| {
        for _ in 0..n {
            raw.send(&packets[forged % packets.len()]).unwrap();
            forged += 1;
        }
    };
    let client = UdpSocket::builder(lo4()).buffers(1 << 20, 4 << 20).bind().unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut bufs = udpx::RecvBuffers::new(16, 2048);
    let mut client_bufs = udpx::RecvBuffers::new(16, 64);
    let mut send_bufs = udpx::SendBuffers::new();
    let mut got = std::collections::BTreeSet::new();
    let (mut answered, mut yields) = (0u32, 0u32);
    // A bound on the whole run (it takes well under a second), not a judgement.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for round in 0..ROUNDS {
        for k in 0..PER_ROUND {
            forge(BURST / PER_ROUND as usize);
            let seq = round * PER_ROUND + k;
            client.send(&[Transmit::new(server, &seq.to_be_bytes())]).unwrap();
        }
        let want = (round + 1) * PER_ROUND;
        while answered < want {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: {answered} of {want} requests reached the server; {:?}, kernel drops {:?}",
                srv.counters(),
                srv.kernel_drops()
            );
            let n = match srv.try_recv_into(&mut bufs) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    yields += 1;
                    let _ = srv.wait_readable(Duration::from_millis(10)).expect("a wait never fails on ICMP");
                    continue;
                }
                Err(e) => panic!("a receive returned {e} during the flood"),
            };
            forge(BETWEEN);
            let replies: Vec<(SocketAddr, Vec<u8>)> = (0..n)
                .map(|i| {
                    let (m, d) = bufs.message(i);
                    (m.addr, d.to_vec())
                })
                .collect();
            let transmits: Vec<Transmit<'_>> = replies.iter().map(|(a, d)| Transmit::new(*a, d)).collect();
            let mut cur = udpx::SendCursor::default();
            loop {
                match srv.try_send(&mut send_bufs, &transmits, cur) {
                    Ok(_) => break,
                    Err(e) if e.is_would_block() => {
                        cur = e.cursor();
                        srv.wait_writable(Duration::from_millis(100)).expect("a wait never fails on ICMP");
                    }
                    Err(e) => panic!("a reply failed with {e} during the flood"),
                }
            }
            answered += n as u32;
        }
        while got.len() < want as usize {
            let n = client
                .recv_into(&mut client_bufs)
                .unwrap_or_else(|e| panic!("round {round}: {} of {want} replies reached the client: {e}", got.len()));
            for i in 0..n {
                got.insert(u32::from_be_bytes(client_bufs.message(i).1.try_into().unwrap()));
            }
        }
    }
    let c = srv.counters();
    println!(
        "{forged} forged errors: {} replies, {c:?}, {yields} waits, offenders {:?}, kernel drops {:?}",
        got.len(),
        srv.icmp_offenders(),
        srv.kernel_drops()
    );
    assert_eq!(answered, ROUNDS * PER_ROUND, "every request reached the server");
    assert_eq!(got.len(), (ROUNDS * PER_ROUND) as usize, "every reply reached the client");
    assert!(c.icmp_errors > 0 && c.icmp_retries > 0, "{c:?}");
    for (kind, n) in [
        ("port unreachable", c.icmp_port_unreachable),
        ("host unreachable", c.icmp_host_unreachable),
        ("net unreachable", c.icmp_net_unreachable),
        ("fragmentation needed", c.icmp_too_big),
        ("prohibited", c.icmp_prohibited),
        ("other (protocol, source route)", c.icmp_other),
    ] {
        assert!(n > 0, "{kind} errors were read and counted by kind: {c:?}");
    }
    let top = srv.icmp_offenders();
    assert_eq!(top.first().map(|t| t.0), Some(offender.into()), "the flood's sender heads the list: {top:?}");
}

/// What an ICMP error quotes of the datagram reaches the application, so a server can check
/// a secret it put there; errors the library read itself while retrying are kept for it.
#[test]
fn drain_errors_gives_the_quoted_payload_even_when_the_library_read_it_first() {
    let Some(raw) = raw_sender("the quoted payload reaches drain_errors") else { return };
    let srv = UdpSocket::builder(lo4()).nonblocking(true).bind().unwrap();
    let victim = "127.0.0.9:9999".parse().unwrap();
    let p = forged_unreachable(srv.local_addr(), victim, "127.0.0.8".parse().unwrap(), 3, b"secret-0123456789");
    raw.send(&p).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // A receive meets the pending error: the library reads the queue, keeps the error.
    let mut bufs = udpx::RecvBuffers::new(4, 2048);
    assert_eq!(srv.try_recv_into(&mut bufs).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    let mut seen = Vec::new();
    srv.drain_errors(|e| seen.push(*e)).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let e = seen[0];
    assert_eq!(e.destination, Some(SocketAddr::V4(victim)));
    assert_eq!(e.offender, Some("127.0.0.8".parse().unwrap()));
    assert_eq!(e.quoted(), b"secret-0123456789");
    assert_eq!(srv.counters().icmp_port_unreachable, 1);
    // Seen once: the next drain finds nothing.
    assert_eq!(srv.drain_errors(|_| {}).unwrap(), 0);
}
