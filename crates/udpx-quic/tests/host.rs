//! The host's counters tell the truth about what the kernel did: datagrams dropped on a full
//! receive buffer show in `kernel_drops` (read with SO_MEMINFO: the host's socket asks for no
//! per-datagram drop count). Coalesced turns serve everyone and say they gathered.

use std::net::UdpSocket as StdUdp;
use std::time::{Duration, Instant};

use udpx_quic::{client_socket, socket_config, App, Host, HostSocket, IoMode, Server, ServerConfig};

mod common;

use common::Quiet;

#[test]
fn datagrams_dropped_on_a_full_buffer_are_counted() {
    // The smallest receive buffer the kernel allows (it doubles and floors what is asked).
    let socket = socket_config("127.0.0.1:0".parse().unwrap(), IoMode::GsoMmsg, true).buffers(1, 1).bind().unwrap();
    let host = Host::new(
        HostSocket::Own(Box::new(socket)),
        common::quiche_config(None, false),
        Quiet,
        udpx_quic::Role::Server { host_id: 0, worker: 0, shards: 1 },
    );
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

/// Server: echoes each stream's bytes back and finishes it.
struct Echo;

impl App for Echo {
    type State = ();
    fn accepted(&mut self, _: &udpx_quic::Connection) {}
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, _: &mut ()) {
        let readable: Vec<u64> = conn.readable().collect();
        let mut buf = [0u8; 4096];
        for sid in readable {
            while let Ok((n, fin)) = conn.stream_recv(sid, &mut buf) {
                // Small requests within the windows: written whole.
                let _ = conn.stream_send(sid, &buf[..n], fin);
            }
        }
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: ()) {}
}

/// Client: once established, sends `SIZE` bytes on stream 0 with FIN; counts what comes back.
#[derive(Default)]
struct Sender {
    established: usize,
    echoed: usize,
    done: usize,
}

const SIZE: usize = 3000;

impl App for Sender {
    type State = bool;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> bool {
        unreachable!("a client")
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, sent: &mut bool) {
        if !*sent && conn.is_established() {
            *sent = true;
            self.established += 1;
            conn.stream_send(0, &[7u8; SIZE], true).unwrap();
        }
        let mut buf = [0u8; 4096];
        while let Ok((n, fin)) = conn.stream_recv(0, &mut buf) {
            self.echoed += n;
            self.done += usize::from(fin);
        }
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: bool) {}
}

/// With turns coalesced (at least 5 ms apart while work keeps coming) every handshake
/// finishes and every request is answered whole; the loop did gather.
#[test]
fn coalesced_turns_serve_everyone() {
    let cert = common::TempCert::new("coalesce");
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.host.coalesce = Duration::from_millis(5);
    let srv = Server::start(&cfg, vec![common::quiche_config(Some(cert.pem()), false)], |_| Echo).unwrap();
    let addr = srv.local_addr();
    let socket = client_socket(addr, IoMode::GsoMmsg, true).unwrap();
    let mut c = Host::new(
        HostSocket::Own(Box::new(socket)),
        common::quiche_config(None, false),
        Sender::default(),
        udpx_quic::Role::Client,
    );
    const N: usize = 100;
    for _ in 0..N {
        c.connect(Some("localhost"), addr, false).unwrap();
    }
    let start = Instant::now();
    while c.app().done < N && start.elapsed() < Duration::from_secs(30) {
        c.step(Duration::from_millis(5)).unwrap();
    }
    let (app, server) = (c.app(), srv.stop().unwrap());
    println!(
        "{} established, {} answered, {} B echoed; server: {} turns, {} coalesced, {} datagrams received in {} calls",
        app.established,
        app.done,
        app.echoed,
        server.turns,
        server.coalesced,
        server.datagrams_received,
        server.recv_calls
    );
    assert_eq!((app.established, app.done, app.echoed), (N, N, N * SIZE));
    assert!(server.coalesced > 0, "the loop never gathered");
}
