//! Acknowledgement-clocked deferral (`HostConfig::ack_defer`): a client that acknowledges
//! every packet gets its download whole while the server lets the few packets each
//! acknowledgement frees wait for the next ones' (counted); off, nothing waits; and a
//! response's first flight on a quiet connection leaves in the turn that wrote it. The server
//! steps on this thread in turn with a hand-driven quiche client, so what is counted is the
//! host's decisions, not the scheduler's. No timing is asserted.

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::time::{Duration, Instant};

use udpx_quic::{Host, HostConfig, HostCounters, HostSocket, IoMode};

mod common;

use common::{Sender, TempCert};

/// A quiche client driven by hand that answers every datagram as it reads it: quiche does not
/// delay acknowledgements, so each data packet gets one (chattier than Chromium, which
/// acknowledges every second packet early on and about every tenth later).
struct Chatty {
    sock: StdUdp,
    conn: quiche::Connection,
    local: SocketAddr,
    got: usize,
    fin: bool,
    acks: u64,
}

impl Chatty {
    fn connect(server: SocketAddr) -> Chatty {
        let sock = StdUdp::bind("127.0.0.1:0").unwrap();
        sock.set_nonblocking(true).unwrap();
        let local = sock.local_addr().unwrap();
        let mut scid = [0u8; 16];
        getrandom::getrandom(&mut scid).unwrap();
        let mut cfg = common::quiche_config(None, true);
        let scid = quiche::ConnectionId::from_ref(&scid);
        let conn = quiche::connect(Some("localhost"), &scid, local, server, &mut cfg).unwrap();
        let mut c = Chatty { sock, conn, local, got: 0, fin: false, acks: 0 };
        c.flush();
        c
    }

    fn flush(&mut self) {
        let mut out = [0u8; 1500];
        loop {
            match self.conn.send(&mut out) {
                Ok((n, info)) => {
                    self.sock.send_to(&out[..n], info.to).unwrap();
                    self.acks += 1;
                }
                Err(quiche::Error::Done) => break,
                Err(e) => panic!("client send: {e}"),
            }
        }
    }

    /// Reads at most `max` datagrams, answering each at once; how many it read.
    fn take(&mut self, max: usize) -> usize {
        if self.conn.timeout_instant().is_some_and(|t| t <= Instant::now()) {
            self.conn.on_timeout();
            self.flush();
        }
        let (mut buf, mut body) = (vec![0u8; 65536], vec![0u8; 65536]);
        let mut n = 0;
        while n < max {
            let Ok((len, from)) = self.sock.recv_from(&mut buf) else { break };
            n += 1;
            let _ = self.conn.recv(&mut buf[..len], quiche::RecvInfo { from, to: self.local });
            while let Ok((k, fin)) = self.conn.stream_recv(0, &mut body) {
                assert!(body[..k].iter().all(|&b| b == 0x42), "the body's bytes");
                self.got += k;
                self.fin |= fin;
            }
            self.flush();
        }
        n
    }

    fn ask(&mut self) {
        self.conn.stream_send(0, b"GET", true).unwrap();
        self.flush();
    }
}

fn server(cert: &TempCert, ack_defer: Duration, body: usize) -> Host<Sender> {
    let socket = udpx_quic::socket_config("127.0.0.1:0".parse().unwrap(), IoMode::GsoMmsg, true).bind().unwrap();
    Host::with_config(
        HostSocket::Own(Box::new(socket)),
        common::quiche_config(Some(cert.pem()), true),
        Sender(body),
        udpx_quic::Role::Server { host_id: 0, worker: 0, shards: 1 },
        HostConfig { ack_defer, ..HostConfig::server() },
    )
}

/// Handshake in lockstep, then quiet long enough that the connection is not mid-transfer.
fn established(s: &mut Host<Sender>) -> Chatty {
    let mut c = Chatty::connect(s.local_addr());
    let start = Instant::now();
    while !c.conn.is_established() || s.counters().open_connections == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "handshake: server {:?}", s.counters());
        c.take(usize::MAX);
        s.step(Duration::from_millis(1)).unwrap();
    }
    for _ in 0..20 {
        c.take(usize::MAX);
        s.step(Duration::from_millis(1)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    c
}

/// A 1 MB download read one datagram per server turn, each acknowledged at once: whole, and
/// what the server counted.
fn chatty_download(ack_defer: Duration) -> (Chatty, HostCounters) {
    const BODY: usize = 1_000_000;
    let cert = TempCert::new("ackclock");
    let mut s = server(&cert, ack_defer, BODY);
    let mut c = established(&mut s);
    let before = s.counters();
    c.ask();
    let start = Instant::now();
    while !c.fin {
        assert!(start.elapsed() < Duration::from_secs(60), "got {} of {BODY}: server {:?}", c.got, s.counters());
        c.take(1);
        s.step(Duration::from_millis(1)).unwrap();
    }
    assert_eq!(c.got, BODY);
    let after = s.counters();
    let d = |f: fn(&HostCounters) -> u64| f(&after) - f(&before);
    println!(
        "ack_defer {ack_defer:?}: {} datagrams received, {} sent in {} send calls; {} turns kept their packets, {} of \
         those flushes at the time limit",
        d(|k| k.datagrams_received),
        d(|k| k.datagrams_sent),
        d(|k| k.send_calls),
        d(|k| k.ack_defers),
        d(|k| k.ack_defer_expired)
    );
    (c, after)
}

#[test]
fn a_chatty_client_gets_its_download_whole_while_freed_windows_wait() {
    let (_, on) = chatty_download(Duration::from_millis(2));
    assert!(on.ack_defers > 0, "one acknowledgement per turn frees a packet or two: {on:?}");
    assert!(on.datagrams_sent > 700, "{on:?}");
    let (_, off) = chatty_download(Duration::ZERO);
    assert_eq!((off.ack_defers, off.ack_defer_expired), (0, 0), "off: {off:?}");
}

#[test]
fn a_first_flight_on_a_quiet_connection_leaves_at_once() {
    let cert = TempCert::new("ackclock-first");
    // A few packets: under the quantum and under what acknowledgement-clocked packets wait for.
    let mut s = server(&cert, Duration::from_millis(2), 4_000);
    let mut c = established(&mut s);
    c.ask();
    let before = s.counters();
    s.step(Duration::from_millis(100)).unwrap();
    let after = s.counters();
    assert!(after.datagrams_received > before.datagrams_received, "the request arrived: {after:?}");
    assert!(after.packets_sent - before.packets_sent >= 3, "the response was written: {after:?}");
    assert_eq!(after.send_calls - before.send_calls, 1, "and sent in that turn: {after:?}");
    assert_eq!(after.ack_defers, before.ack_defers);
    let start = Instant::now();
    while !c.fin {
        assert!(start.elapsed() < Duration::from_secs(10), "got {}", c.got);
        c.take(usize::MAX);
        s.step(Duration::from_millis(1)).unwrap();
    }
    assert_eq!(c.got, 4_000);
}
