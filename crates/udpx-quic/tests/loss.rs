//! Handshakes through lossy paths: a relay between client and server drops 30 % of the
//! datagrams each way (a generator seeded per path, as the interop runner's `handshakeloss`
//! does with its own), over 60 handshakes at once: the server must not give up on a handshake
//! whose client still retries (with the old 5 s deadline it dropped one in every run), and
//! all but the unluckiest paths' handshakes complete within 20 s. Counts are asserted, never
//! times.

mod common;

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TempCert;
use udpx_quic::{client_socket, App, Host, HostSocket, IoMode, Server, ServerConfig};

/// Connections opened through the relay.
const HANDSHAKES: usize = 60;
/// The relay's loss, percent, each way.
const LOSS_PCT: u64 = 30;
/// How long a client keeps trying without hearing from the server.
const CLIENT_IDLE: Duration = Duration::from_secs(60);
/// How long the test watches: well inside the server's 30 s deadline, well past the 5 s one.
const WATCH: Duration = Duration::from_secs(20);

/// A server application that accepts and does nothing.
struct Quiet;

impl App for Quiet {
    type State = ();
    fn accepted(&mut self, _: &udpx_quic::Connection) {}
    fn on_turn(&mut self, _: &mut udpx_quic::Connection, _: &mut ()) {}
    fn closed(&mut self, _: &udpx_quic::Connection, _: ()) {}
}

/// A client application that counts established connections.
#[derive(Default)]
struct Count {
    established: usize,
    /// Closed by the client's own idle timeout before its handshake completed.
    gave_up: usize,
    /// Closed otherwise before it completed.
    closed_early: usize,
}

impl App for Count {
    type State = bool;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> bool {
        unreachable!("a client")
    }
    fn on_turn(&mut self, _: &mut udpx_quic::Connection, seen: &mut bool) {
        if !*seen {
            *seen = true;
            self.established += 1;
        }
    }
    fn closed(&mut self, conn: &udpx_quic::Connection, seen: bool) {
        if !seen {
            // Only the client's own giving up (its idle timeout) is expected: a path whose
            // losses outlast it.
            if conn.is_timed_out() && conn.peer_error().is_none() {
                self.gave_up += 1;
            } else {
                self.closed_early += 1;
            }
        }
    }
}

/// xorshift64*: the relay's seeded coin.
struct Coin(u64);

impl Coin {
    fn keep(&mut self) -> bool {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % 100 >= LOSS_PCT
    }
}

/// One lossy path: its own sockets, its own seeded coins.
struct Path {
    front: StdUdp,
    back: StdUdp,
    client: Option<SocketAddr>,
    up: Coin,
    down: Coin,
}

/// Relays datagrams on each path between the one client that speaks to its front socket and
/// `server`, dropping [`LOSS_PCT`] % each way with the path's own coins (so what a connection
/// loses depends on its own datagrams only, not on how the others interleave), until `stop`;
/// counts what it dropped.
fn relay(mut paths: Vec<Path>, stop: Arc<AtomicBool>, dropped: Arc<AtomicU64>) {
    let mut buf = [0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let mut moved = false;
        for p in &mut paths {
            while let Ok((n, from)) = p.front.recv_from(&mut buf) {
                moved = true;
                p.client = Some(from);
                if p.up.keep() {
                    let _ = p.back.send(&buf[..n]);
                } else {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            while let Ok(n) = p.back.recv(&mut buf) {
                moved = true;
                match p.client {
                    Some(c) if p.down.keep() => {
                        let _ = p.front.send_to(&buf[..n], c);
                    }
                    _ => {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if !moved {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// A path to `server` whose coins start from `seed`.
fn path(server: SocketAddr, seed: u64) -> Path {
    let front = StdUdp::bind("127.0.0.1:0").unwrap();
    let back = StdUdp::bind("127.0.0.1:0").unwrap();
    back.connect(server).unwrap();
    front.set_nonblocking(true).unwrap();
    back.set_nonblocking(true).unwrap();
    let mix = |x: u64| (x ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1;
    Path { front, back, client: None, up: Coin(mix(2 * seed + 1)), down: Coin(mix(2 * seed + 2)) }
}

#[test]
fn handshakes_through_30_percent_loss_complete() {
    let cert = TempCert::new("loss");
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    let srv = Server::start(&cfg, vec![common::quiche_config(Some(cert.pem()), false)], |_| Quiet).unwrap();
    let paths: Vec<Path> = (0..HANDSHAKES as u64).map(|i| path(srv.local_addr(), i)).collect();
    let vias: Vec<SocketAddr> = paths.iter().map(|p| p.front.local_addr().unwrap()).collect();
    let (stop, dropped) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let relay_thread = {
        let (stop, dropped) = (stop.clone(), dropped.clone());
        std::thread::spawn(move || relay(paths, stop, dropped))
    };
    let socket = client_socket(vias[0], IoMode::GsoMmsg, true).unwrap();
    let mut qc = common::quiche_config(None, false);
    // A client that keeps trying for a minute (its idle timeout), backing off as quiche does.
    qc.set_max_idle_timeout(CLIENT_IDLE.as_millis() as u64);
    let mut c = Host::new(HostSocket::Own(Box::new(socket)), qc, Count::default(), udpx_quic::Role::Client);
    for via in &vias {
        c.connect(Some("localhost"), *via, false).unwrap();
    }
    let start = Instant::now();
    while start.elapsed() < WATCH {
        let a = c.app();
        if a.established + a.gave_up + a.closed_early == HANDSHAKES {
            break;
        }
        c.step(Duration::from_millis(50)).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    relay_thread.join().unwrap();
    let k = srv.stop().unwrap();
    let a = c.app();
    println!(
        "{} of {HANDSHAKES} established, {} given up by the client, {} closed otherwise, {} datagrams dropped; \
         server: {} handshake timeouts",
        a.established,
        a.gave_up,
        a.closed_early,
        dropped.load(Ordering::Relaxed),
        k.handshake_timeouts
    );
    assert!(dropped.load(Ordering::Relaxed) > 0, "the relay dropped datagrams");
    // In 20 s the server gave up on no handshake whose client still tried (with a 5 s deadline
    // it dropped one in every run of these paths), none ended otherwise, and all but the
    // unluckiest paths' completed.
    assert_eq!(k.handshake_timeouts, 0, "the server dropped a handshake its client still tried: {k:?}");
    assert_eq!(a.closed_early, 0, "no handshake ended otherwise");
    assert!(a.established >= HANDSHAKES - 2, "nearly every handshake completed: {}", a.established);
}
