//! The shard group over real sockets: connections from one client socket spread over the
//! shards by the client's DCID, and every packet of a connection reaches the shard that
//! issued its connection ID (the worker byte), so handshakes complete and no shard sees a
//! packet for a connection it does not have. Connection IDs issued after the handshake carry
//! the same host ID and worker byte: a client that moves to one stays on its shard.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    fn accepted(&mut self, conn: &udpx_quic::Connection) {
        self.seen.lock().unwrap().push((self.shard, conn.source_id().to_vec()));
    }
    fn on_turn(&mut self, _: &mut udpx_quic::Connection, _: &mut ()) {}
    fn closed(&mut self, _: &udpx_quic::Connection, _: ()) {}
}

/// Client side: closes each connection the turn after it is established (closing in the
/// very turn the handshake completes makes quiche send nothing at all: its application
/// close needs a 1-RTT packet, and the client's Finished is not sent while closing, so the
/// connection would only end at its idle timeout), and counts them. It asks for that next
/// turn with `wake_at` (the host calls an application only when it has news or asks).
#[derive(Default)]
struct Closer {
    established: usize,
}

impl App for Closer {
    /// Turns the connection had while established: 1 after the first, 2 once closed.
    type State = u8;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> u8 {
        0
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, turns: &mut u8) {
        match *turns {
            0 => self.established += 1,
            1 => {
                let _ = conn.close(true, 0, b"done");
            }
            _ => {}
        }
        *turns = turns.saturating_add(1);
    }
    fn wake_at(&self, turns: &u8) -> Option<std::time::Instant> {
        (*turns == 1).then(std::time::Instant::now)
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: u8) {}
}

/// A loopback server of `shards` shards with host ID `host_id` (the certificate lives as long
/// as the test holds it).
fn start<A: App + 'static>(
    tag: &str,
    shards: usize,
    host_id: u16,
    make_app: impl Fn(usize) -> A + Send + Sync + 'static,
) -> (TempCert, Server) {
    let cert = TempCert::new(tag);
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = shards;
    cfg.host_id = host_id;
    cfg.io = IoMode::GsoMmsg;
    let configs = (0..shards).map(|_| quiche_config(Some(cert.pem()), false)).collect();
    let server = Server::start(&cfg, configs, make_app).unwrap();
    (cert, server)
}

/// A client host on its own socket towards `addr`.
fn client<A: App>(addr: SocketAddr, app: A) -> Host<A> {
    let socket = client_socket(addr, IoMode::GsoMmsg, true).unwrap();
    Host::new(HostSocket::Own(Box::new(socket)), quiche_config(None, false), app, udpx_quic::Role::Client)
}

#[test]
fn connections_stay_on_the_shard_of_their_worker_byte() {
    let shards = 4;
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let (_cert, server) = start("shards", shards, 0x1234, move |shard| Recorder { shard, seen: seen2.clone() });
    let addr: SocketAddr = server.local_addr();

    let conns = 32;
    let mut client = client(addr, Closer::default());
    for _ in 0..conns {
        client.connect(Some("localhost"), addr, 0).unwrap();
    }
    let t0 = std::time::Instant::now();
    client.run(&AtomicBool::new(false), udpx_quic::Until::Idle, None).unwrap();
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

/// Server side: every source connection ID each connection ever had, by shard.
type Ids = Arc<Mutex<Vec<(usize, std::collections::BTreeSet<Vec<u8>>)>>>;

struct IdRecorder {
    shard: usize,
    ids: Ids,
    /// Connections the client closed (its close arrived: on a new ID).
    closed_by_client: Arc<AtomicUsize>,
}

impl App for IdRecorder {
    /// The index of this connection's entry in `ids`.
    type State = usize;
    fn accepted(&mut self, conn: &udpx_quic::Connection) -> usize {
        let mut ids = self.ids.lock().unwrap();
        ids.push((self.shard, [conn.source_id().to_vec()].into()));
        ids.len() - 1
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, at: &mut usize) {
        let mut ids = self.ids.lock().unwrap();
        for id in conn.source_ids() {
            ids[*at].1.insert(id.to_vec());
        }
    }
    fn closed(&mut self, conn: &udpx_quic::Connection, _: usize) {
        if conn.peer_error().is_some_and(|e| e.reason == b"done") {
            self.closed_by_client.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Client side: once a new connection ID has arrived, retires the one it started with (so
/// every later packet carries the new one), sends on a stream, then closes.
#[derive(Default)]
struct Mover {
    moved: usize,
    closed_after_move: usize,
}

#[derive(Default)]
struct MoverState {
    retired: bool,
    pinged: bool,
    closed: bool,
}

impl App for Mover {
    type State = MoverState;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> MoverState {
        MoverState::default()
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, st: &mut MoverState) {
        if !st.retired {
            if conn.available_dcids() > 0 && conn.retire_dcid(0).is_ok() {
                st.retired = true;
                self.moved += 1;
            }
            return;
        }
        if !st.pinged {
            st.pinged = conn.stream_send(0, b"ping", true).is_ok();
            return;
        }
        if !st.closed && conn.close(true, 0, b"done").is_ok() {
            st.closed = true;
            self.closed_after_move += 1;
        }
    }
    fn wake_at(&self, st: &MoverState) -> Option<std::time::Instant> {
        // Each step on the next turn once the first (a new ID to move to) has happened.
        (st.retired && !st.closed).then(std::time::Instant::now)
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: MoverState) {}
}

#[test]
fn new_connection_ids_keep_the_host_and_the_shard() {
    let ids: Ids = Arc::new(Mutex::new(Vec::new()));
    let (ids2, by_client) = (ids.clone(), Arc::new(AtomicUsize::new(0)));
    let by_client2 = by_client.clone();
    let (_cert, server) = start("new-cids", 3, 0x0b0b, move |shard| IdRecorder {
        shard,
        ids: ids2.clone(),
        closed_by_client: by_client2.clone(),
    });
    let addr = server.local_addr();
    let conns = 12;
    let mut client = client(addr, Mover::default());
    for _ in 0..conns {
        client.connect(Some("localhost"), addr, MoverState::default()).unwrap();
    }
    let t0 = std::time::Instant::now();
    client.run(&AtomicBool::new(false), udpx_quic::Until::Idle, None).unwrap();
    let took = t0.elapsed();
    // The clients' closes are on their way: the server reads them on its own thread (on a
    // busy machine after the client has ended), so wait for them before stopping it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while by_client.load(Ordering::Relaxed) < conns && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let total = server.stop().unwrap();
    let ids = ids.lock().unwrap();
    eprintln!("took {took:?}; server {total:?}");
    assert_eq!((client.app().moved, client.app().closed_after_move), (conns, conns), "every client moved, then closed");
    assert!(took < std::time::Duration::from_secs(10), "closed by the idle timeout, not by the close");
    assert!(total.cids_issued >= conns as u64, "a new ID for each connection: {total:?}");
    for (shard, set) in ids.iter() {
        assert!(set.len() >= 2, "a connection never had a second ID: {set:02x?}");
        for id in set {
            let cid = ServerCid::parse(id).unwrap();
            assert_eq!((cid.host_id, usize::from(cid.worker)), (0x0b0b, *shard), "{id:02x?}");
        }
    }
    assert_eq!(total.dropped_unknown_cid, 0, "a packet on a new ID missed its shard or connection");
    assert_eq!(by_client.load(Ordering::Relaxed), conns, "every client's close arrived (on its new ID)");
}
