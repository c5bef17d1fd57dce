//! The shard group over real sockets: connections from one client socket spread over the
//! shards by the client's DCID, and every packet of a connection reaches the shard that
//! issued its connection ID (the worker byte), so handshakes complete and no shard sees a
//! packet for a connection it does not have.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use udpx_quic::{client_socket, App, Host, HostSocket, IoMode, Server, ServerCid, ServerConfig};

mod common;

use common::{quiche_config, TempCert};

/// (shard, source connection ID) of each accepted connection.
type Seen = Arc<Mutex<Vec<(usize, Vec<u8>)>>>;

/// Server side: records (shard, source connection ID) of every accepted connection.
struct Recorder {
    shard: usize,
    seen: Seen,
}

impl App for Recorder {
    type State = ();
    fn accepted(&mut self, conn: &quiche::Connection) {
        self.seen.lock().unwrap().push((self.shard, conn.source_id().to_vec()));
    }
    fn on_turn(&mut self, _: &mut quiche::Connection, _: &mut ()) {}
    fn closed(&mut self, _: &quiche::Connection, _: ()) {}
}

/// Client side: closes each connection the turn after it is established (closing in the
/// very turn the handshake completes makes quiche send nothing at all: its application
/// close needs a 1-RTT packet, and the client's Finished is not sent while closing, so the
/// connection would only end at its idle timeout), and counts them.
#[derive(Default)]
struct Closer {
    established: usize,
}

impl App for Closer {
    /// Whether the connection had its first established turn.
    type State = bool;
    fn accepted(&mut self, _: &quiche::Connection) -> bool {
        false
    }
    fn on_turn(&mut self, conn: &mut quiche::Connection, seen: &mut bool) {
        if !std::mem::replace(seen, true) {
            self.established += 1;
        } else {
            let _ = conn.close(true, 0, b"done");
        }
    }
    fn closed(&mut self, _: &quiche::Connection, _: bool) {}
}

#[test]
fn connections_stay_on_the_shard_of_their_worker_byte() {
    let cert = TempCert::new("shards");
    let pem = cert.pem();

    let shards = 4;
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = shards;
    cfg.host_id = 0x1234;
    cfg.io = IoMode::GsoMmsg;
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let server = Server::start(&cfg, (0..shards).map(|_| quiche_config(Some(pem), false)).collect(), move |shard| {
        Recorder { shard, seen: seen2.clone() }
    })
    .unwrap();
    let addr: SocketAddr = server.local_addr();

    let conns = 32;
    let socket = client_socket(addr, IoMode::GsoMmsg, true).unwrap();
    let mut client =
        Host::new(HostSocket::Own(Box::new(socket)), quiche_config(None, false), Closer::default(), false, 0, 0);
    for _ in 0..conns {
        client.connect(Some("localhost"), addr, false).unwrap();
    }
    let t0 = std::time::Instant::now();
    client.run(&AtomicBool::new(false), true, None).unwrap();
    assert!(t0.elapsed() < std::time::Duration::from_secs(4), "closed by idle timeout, not by the close");
    assert_eq!(client.app().established, conns, "every handshake completed");

    let per_shard = server.shard_counters();
    let total = server.stop().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), conns);
    let mut used = std::collections::HashSet::new();
    for (shard, scid) in seen.iter() {
        let cid = ServerCid::parse(scid).unwrap();
        assert_eq!(cid.host_id, 0x1234);
        assert_eq!(usize::from(cid.worker), *shard, "worker byte = the shard that issued it");
        used.insert(*shard);
    }
    let dist: Vec<usize> = (0..shards).map(|s| seen.iter().filter(|(x, _)| *x == s).count()).collect();
    eprintln!("connections per shard: {dist:?}");
    assert!(used.len() >= 2, "32 connections all on one of 4 shards: {used:?}");
    assert_eq!(total.dropped_unknown_cid, 0, "a packet reached a shard without its connection: {per_shard:?}");
    assert_eq!(total.connections, conns as u64);
}
