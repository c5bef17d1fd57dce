//! Stateless resets across hosts: a client's connection to host 1 whose packets then reach
//! host 2 (host 1 gone, host 2 on the same address) ends at once when both hosts share a reset
//! key: host 2 answers the unknown connection ID with a reset the client recognizes. Without
//! the shared key host 2 stays silent and the client waits for its idle timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use udpx_quic::{client_socket, App, Host, HostSocket, IoMode, Server, ServerConfig, ServiceKeys};

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

fn server(cert: &TempCert, listen: std::net::SocketAddr, host_id: u16, key: Option<ServiceKeys>) -> Server {
    let mut cfg = ServerConfig::new(listen);
    cfg.host_id = host_id;
    cfg.keys = key;
    Server::start(&cfg, vec![quiche_config(Some(cert.pem()), false)], |_| Quiet).unwrap()
}

/// Connects to host 1, replaces it by host 2 on the same address, pings: how long the client
/// lived after the switch, how it ended, and host 2's counters.
fn switch_hosts(key1: Option<ServiceKeys>, key2: Option<ServiceKeys>) -> (Duration, (bool, bool, bool), u64, u64) {
    let cert = TempCert::new("reset");
    let one = server(&cert, "127.0.0.1:0".parse().unwrap(), 1, key1);
    let addr = one.local_addr();
    let (tx, rx) = mpsc::channel();
    let go = Arc::new(AtomicBool::new(false));
    let app = Pinger { established: Some(tx), go: go.clone(), sent: 0, ended: None };
    let client = std::thread::spawn(move || {
        let socket = client_socket(addr, IoMode::GsoMmsg, true).unwrap();
        let mut h = Host::new(HostSocket::Own(Box::new(socket)), quiche_config(None, false), app, false, 0, 0);
        h.connect(Some("localhost"), addr, ()).unwrap();
        h.run(&AtomicBool::new(false), true, None).unwrap();
        h.app().ended
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("handshake");
    one.stop().unwrap();
    let two = server(&cert, addr, 2, key2);
    let switched = Instant::now();
    go.store(true, Ordering::Relaxed);
    let ended = client.join().unwrap().expect("the connection ended");
    let lived = switched.elapsed();
    let c = two.stop().unwrap();
    (lived, ended, c.stateless_resets, c.dropped_unknown_cid)
}

#[test]
fn a_host_that_shares_the_key_resets_connections_it_does_not_have() {
    let key = || Some(ServiceKeys::shared(&[7; udpx_quic::reset::KEY_LEN]));
    let (lived, (timed_out, peer_err, local_err), resets, unknown) = switch_hosts(key(), key());
    eprintln!("shared key: lived {lived:?}, resets {resets}, unknown {unknown}");
    assert!(resets >= 1 && unknown >= 1, "host 2 answered the unknown ID: {resets} resets, {unknown} unknown");
    assert!(!timed_out && !peer_err && !local_err, "ended by the reset: no timeout, no error frame");
    assert!(lived < Duration::from_secs(4), "ended by the reset, not the 5 s idle timeout: {lived:?}");
}

#[test]
fn without_the_shared_key_the_client_waits_for_its_idle_timeout() {
    let (lived, (timed_out, ..), resets, unknown) =
        switch_hosts(None, Some(ServiceKeys::shared(&[9; udpx_quic::reset::KEY_LEN])));
    eprintln!("other key: lived {lived:?}, resets {resets}, unknown {unknown}");
    // Host 2 sends resets, but with tokens of its own key: the client ignores them.
    assert!(unknown >= 1, "host 2 got the client's packets");
    assert!(timed_out, "a reset the client cannot check does not end the connection");
}
