//! ICMP errors at a server: clients that close their ports after a request make the kernel
//! answer the server's replies with ICMP port unreachable. With IP_RECVERR (udpx's default,
//! which keeps qdisc drops visible) every such error leaves a pending socket error that fails
//! the server's next call and raises POLLERR. The server must keep serving everyone else,
//! losing nothing, and count what it read.

mod common;

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::time::Duration;

use common::*;
use udpx::{ErrorOrigin, Transmit, UdpSocket};

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
    let srv = UdpSocket::builder(lo4()).bind().unwrap();
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
    assert_eq!(seen.len(), 1, "{seen:?}");
    let e = seen[0];
    assert_eq!((e.destination, e.errno, e.origin), (Some(dst), libc::ECONNREFUSED, ErrorOrigin::Icmp));
    assert_eq!((e.icmp_type, e.icmp_code), (3, 3), "destination unreachable, port unreachable");
    // The queue is empty and the pending error gone: the next send is unaffected.
    srv.send(&[Transmit::new(dst, b"again")]).unwrap();
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
