//! Stateless resets across hosts: a client's connection to host 1 whose packets then reach
//! host 2 (host 1 gone, host 2 on the same address) ends at once when both hosts share a reset
//! key and host 2 was told host 1 is gone: host 2 answers the unknown connection ID with a
//! reset the client recognizes. Without the shared key, or while host 1 is not listed as
//! removed (its packets may reach host 2 by mistake: it is live), host 2 sends no valid reset
//! and the client waits for its idle timeout. And within one host, a shard resets only its own
//! connection IDs: a GRO train steered by its first datagram draws no reset for the others.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use udpx_quic::{
    client_socket, App, Host, HostSocket, IoMode, RemovedHosts, Server, ServerCid, ServerConfig, ServiceKeys,
};

mod common;

use common::{quiche_config, Quiet, TempCert};

/// Tells the test when the handshake is done, then, once `go` is set, sends on a stream every
/// turn; records how the connection ended.
struct Pinger {
    established: Option<mpsc::Sender<()>>,
    go: Arc<AtomicBool>,
    sent: u64,
    ended: Option<(bool, bool, bool)>,
}

impl App for Pinger {
    type State = ();
    fn accepted(&mut self, _: &udpx_quic::Connection) {}
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, _: &mut ()) {
        if let Some(tx) = self.established.take() {
            let _ = tx.send(());
        }
        if self.go.load(Ordering::Relaxed) && self.sent < 50 {
            let id = self.sent * 4;
            if conn.stream_send(id, b"ping", true).is_ok() {
                self.sent += 1;
            }
        }
    }
    fn wake_at(&self, _: &()) -> Option<Instant> {
        // Waits for `go` (set by the test thread), then pings every millisecond.
        (self.sent < 50).then(|| Instant::now() + Duration::from_millis(1))
    }
    fn closed(&mut self, conn: &udpx_quic::Connection, _: ()) {
        self.ended = Some((conn.is_timed_out(), conn.peer_error().is_some(), conn.local_error().is_some()));
    }
}

fn server(
    cert: &TempCert,
    listen: std::net::SocketAddr,
    host_id: u16,
    key: Option<ServiceKeys>,
    removed: &[u16],
) -> Server {
    let mut cfg = ServerConfig::new(listen);
    cfg.host_id = host_id;
    cfg.host.keys = key;
    cfg.host.removed_hosts.set(removed);
    Server::start(&cfg, vec![quiche_config(Some(cert.pem()), false)], |_| Quiet).unwrap()
}

/// Connects to host 1, replaces it by host 2 on the same address (told that the hosts in
/// `removed` are gone), pings: how long the client lived after the switch, how it ended, and
/// host 2's counters (resets sent, unknown IDs, resets withheld as not its own).
fn switch_hosts(
    key1: Option<ServiceKeys>,
    key2: Option<ServiceKeys>,
    removed: &[u16],
) -> (Duration, (bool, bool, bool), u64, u64, u64) {
    let cert = TempCert::new("reset");
    let one = server(&cert, "127.0.0.1:0".parse().unwrap(), 1, key1, &[]);
    let addr = one.local_addr();
    let (tx, rx) = mpsc::channel();
    let go = Arc::new(AtomicBool::new(false));
    let app = Pinger { established: Some(tx), go: go.clone(), sent: 0, ended: None };
    let client = std::thread::spawn(move || {
        let socket = client_socket(addr, IoMode::GsoMmsg, true).unwrap();
        let mut h =
            Host::new(HostSocket::Own(Box::new(socket)), quiche_config(None, false), app, udpx_quic::Role::Client);
        h.connect(Some("localhost"), addr, ()).unwrap();
        h.run(&AtomicBool::new(false), udpx_quic::Until::Idle, None).unwrap();
        h.app().ended
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("handshake");
    one.stop().unwrap();
    let two = server(&cert, addr, 2, key2, removed);
    let switched = Instant::now();
    go.store(true, Ordering::Relaxed);
    let ended = client.join().unwrap().expect("the connection ended");
    let lived = switched.elapsed();
    let c = two.stop().unwrap();
    (lived, ended, c.stateless_resets, c.dropped_unknown_cid, c.resets_not_ours)
}

#[test]
fn a_host_that_shares_the_key_resets_connections_it_does_not_have() {
    let key = || Some(ServiceKeys::shared(&[7; udpx_quic::reset::KEY_LEN]));
    let (lived, (timed_out, peer_err, local_err), resets, unknown, _) = switch_hosts(key(), key(), &[1]);
    eprintln!("shared key: lived {lived:?}, resets {resets}, unknown {unknown}");
    assert!(resets >= 1 && unknown >= 1, "host 2 answered the unknown ID: {resets} resets, {unknown} unknown");
    assert!(!timed_out && !peer_err && !local_err, "ended by the reset: no timeout, no error frame");
    assert!(lived < Duration::from_secs(4), "ended by the reset, not the 5 s idle timeout: {lived:?}");
}

#[test]
fn without_the_shared_key_the_client_waits_for_its_idle_timeout() {
    let (lived, (timed_out, ..), resets, unknown, _) =
        switch_hosts(None, Some(ServiceKeys::shared(&[9; udpx_quic::reset::KEY_LEN])), &[1]);
    eprintln!("other key: lived {lived:?}, resets {resets}, unknown {unknown}");
    // Host 2 sends resets, but with tokens of its own key: the client ignores them.
    assert!(unknown >= 1, "host 2 got the client's packets");
    assert!(timed_out, "a reset the client cannot check does not end the connection");
}

/// The same key, but host 1 not listed as removed: for host 2 its IDs are a live host's, whose
/// packets reach it by mistake (a balancer between two rule sets, DNAT, direct server
/// return). It sends no reset (counted) and the client waits for its idle timeout.
#[test]
fn a_live_hosts_ids_draw_no_reset() {
    let key = || Some(ServiceKeys::shared(&[7; udpx_quic::reset::KEY_LEN]));
    let (lived, (timed_out, ..), resets, unknown, not_ours) = switch_hosts(key(), key(), &[]);
    eprintln!("live host: lived {lived:?}, resets {resets}, unknown {unknown}, not ours {not_ours}");
    assert_eq!(resets, 0, "no reset for another live host's connection");
    assert!(unknown >= 1 && not_ours >= 1, "its packets arrived and were counted: {unknown} {not_ours}");
    assert!(timed_out, "the client ended at its idle timeout");
}

/// Two shards, one key: a GSO train of two short-header datagrams, the first for a shard-0
/// connection ID, the second for a shard-1 ID, arrives whole (GRO) at shard 0, steered by its
/// first datagram. Shard 0 resets the first and not the second.
#[test]
fn a_gro_train_draws_no_reset_for_another_shards_id() {
    let cert = TempCert::new("reset-gro");
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = 2;
    cfg.host.keys = Some(ServiceKeys::shared(&[7; udpx_quic::reset::KEY_LEN]));
    cfg.host.removed_hosts = RemovedHosts::default();
    let configs = (0..2).map(|_| quiche_config(Some(cert.pem()), false)).collect();
    let srv = Server::start(&cfg, configs, |_| Quiet).unwrap();
    let addr = srv.local_addr();
    let sock = client_socket(addr, IoMode::GsoMmsg, false).unwrap();
    const SEG: usize = 100;
    let mut train = Vec::new();
    for worker in [0u8, 1] {
        let cid = ServerCid { host_id: 0, nonce: [worker + 1; 7], generation: 0, worker }.to_bytes();
        let mut d = vec![0x40u8];
        d.extend_from_slice(&cid);
        d.resize(SEG, 0x33);
        train.extend_from_slice(&d);
    }
    // One send of 2 x 100 bytes with UDP_SEGMENT 100: two datagrams on the wire, one GRO
    // buffer at the server (loopback keeps the train whole for a GRO socket).
    sock.send(&[udpx::Transmit::new(addr, &train).segmented(SEG)]).unwrap();
    let mut rb = udpx::RecvBuffers::for_socket(&sock, 8);
    let mut resets = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        match sock.try_recv_into(&mut rb) {
            Ok(n) if n > 0 => resets += rb.datagrams().count(),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    let shards = srv.shard_counters();
    srv.stop().unwrap();
    let sum = |f: fn(&udpx_quic::HostCounters) -> u64| shards.iter().map(f).sum::<u64>();
    eprintln!(
        "gro train: {resets} resets received; shards {:?}",
        shards.iter().map(|c| (c.stateless_resets, c.resets_not_ours, c.gro_buffers)).collect::<Vec<_>>()
    );
    assert_eq!(sum(|c| c.datagrams_received), 2, "both datagrams arrived");
    assert_eq!((sum(|c| c.stateless_resets), sum(|c| c.resets_not_ours)), (1, 1), "one reset, one withheld");
    assert_eq!(resets, 1, "the client got one reset");
}

/// The third review: Version Negotiation, refusals and resets each have a budget of their own.
/// With 100 answers a second, 150 Initials of an unknown version (1,200 bytes each) use up the
/// shard's Version Negotiation budget; a short-header packet for an unknown ID of this shard
/// that follows them in the socket's queue still draws its stateless reset. (With one budget
/// for all, the reset was withheld: `resets_limited`.)
#[test]
fn a_version_negotiation_flood_does_not_starve_resets() {
    let cert = TempCert::new("reset-budget");
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.host.keys = Some(ServiceKeys::shared(&[7; udpx_quic::reset::KEY_LEN]));
    cfg.host.limits.answers_per_sec = 100;
    let srv = Server::start(&cfg, vec![quiche_config(Some(cert.pem()), false)], |_| Quiet).unwrap();
    let addr = srv.local_addr();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    // A long-header Initial of version 0x1a2a3a4a (reserved to force negotiation).
    let mut initial = vec![0xc0u8, 0x1a, 0x2a, 0x3a, 0x4a, 8];
    initial.extend_from_slice(&[0x11; 8]);
    initial.push(8);
    initial.extend_from_slice(&[0x22; 8]);
    initial.resize(1200, 0);
    let start = Instant::now();
    for _ in 0..150 {
        sock.send_to(&initial, addr).unwrap();
    }
    let cid = ServerCid { host_id: 0, nonce: [4; 7], generation: 0, worker: 0 }.to_bytes();
    let mut short = vec![0x40u8];
    short.extend_from_slice(&cid);
    short.resize(100, 0x33);
    sock.send_to(&short, addr).unwrap();
    let sent_within = start.elapsed();
    let mut buf = [0u8; 2048];
    let (mut negotiations, mut resets) = (0, 0);
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_millis(500) {
        match sock.recv_from(&mut buf) {
            // Version Negotiation: a long header with version 0; a reset: a short header.
            Ok((n, _)) if n >= 5 && buf[0] & 0x80 != 0 && buf[1..5] == [0; 4] => negotiations += 1,
            Ok((n, _)) if n < 100 && buf[0] & 0x80 == 0 => resets += 1,
            _ => {}
        }
    }
    let k = srv.stop().unwrap();
    println!(
        "flood: {negotiations} negotiations and {resets} resets received (sent within {sent_within:?}); \
         server: {} negotiations, {} limited, {} resets, {} resets limited",
        k.version_negotiations, k.answers_limited, k.stateless_resets, k.resets_limited
    );
    assert!(k.answers_limited >= 1, "the negotiation budget was used up: {k:?}");
    assert_eq!((k.stateless_resets, k.resets_limited), (1, 0), "the reset still went: {k:?}");
    assert_eq!(resets, 1, "and arrived");
}
