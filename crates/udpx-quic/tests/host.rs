//! The host's counters tell the truth about what the kernel did: datagrams dropped on a full
//! receive buffer show in `kernel_drops` (read with SO_MEMINFO: the host's socket asks for no
//! per-datagram drop count).

use std::net::UdpSocket as StdUdp;

use udpx_quic::{socket_config, Host, HostSocket, IoMode};

mod common;

use common::Quiet;

#[test]
fn datagrams_dropped_on_a_full_buffer_are_counted() {
    // The smallest receive buffer the kernel allows (it doubles and floors what is asked).
    let socket = socket_config("127.0.0.1:0".parse().unwrap(), IoMode::GsoMmsg, true).buffers(1, 1).bind().unwrap();
    let host = Host::new(HostSocket::Own(Box::new(socket)), common::quiche_config(None, false), Quiet, true, 0, 0);
    assert_eq!(host.counters().kernel_drops, 0);
    let peer = StdUdp::bind("127.0.0.1:0").unwrap();
    // Nothing reads: a few kilobytes fill the buffer and the rest is dropped.
    for _ in 0..200 {
        peer.send_to(&[0u8; 1200], host.local_addr()).unwrap();
    }
    let drops = host.counters().kernel_drops;
    println!("kernel_drops after 200 unread datagrams into a minimal buffer: {drops}");
    assert!(drops > 0 && drops <= 200, "{drops} drops counted");
}
