//! Resumption and 0-RTT across shards, and the bound on open responses.
//!
//! - A client resumes on another shard than the one that gave it its ticket (the shards derive
//!   one ticket key from the service's keys), and with early data on, its GET is answered from
//!   0-RTT; a POST in 0-RTT gets 425 Too Early. Without early data on the server, the resumed
//!   request waits for the handshake.
//! - A client that never opens its stream windows holds at most the bound of open files: the
//!   requests past it are answered 503 without opening anything.

mod common;

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::{content, TempDir};
use udpx_h3::{get, serve, GetConfig, ServeConfig};
use udpx_quic::{App, Host, HostSocket, IoMode};

/// A DCID whose worker byte names `shard` (the steering program reads it).
fn dcid_for(shard: u8) -> Vec<u8> {
    let mut d = vec![0x42; 12];
    d[udpx_quic::WORKER_BYTE as usize] = shard;
    d
}

fn site() -> TempDir {
    let tmp = TempDir::new("early");
    std::fs::create_dir_all(tmp.path().join("www")).unwrap();
    std::fs::write(tmp.path().join("www/seg"), content(20_000, 9)).unwrap();
    tmp
}

#[test]
fn zero_rtt_get_is_answered_across_shards_and_unsafe_methods_wait() {
    let tmp = site();
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.quic.shards = 2;
    cfg.early_data = true;
    let server = serve(&tmp.path().join("www"), &cfg).unwrap();
    let url = format!("https://{}/seg", server.local_addr());
    // First visit on shard 0: a full handshake, a ticket.
    let first = get(&url, None, &GetConfig { dcid: Some(dcid_for(0)), ..GetConfig::default() }).unwrap();
    assert_eq!((first.status, first.resumed, first.early_data), (200, false, false));
    let session = first.session.clone().expect("the server sent a session ticket");
    // Back on shard 1, in 0-RTT.
    let again =
        get(&url, None, &GetConfig { dcid: Some(dcid_for(1)), session: Some(session.clone()), ..GetConfig::default() })
            .unwrap();
    assert_eq!((again.status, again.bytes), (200, 20_000));
    assert!(again.resumed, "resumed on another shard");
    assert!(again.early_data, "the GET went in 0-RTT");
    // A POST in 0-RTT: 425. The server judges a request when it reads it: when the client's
    // Finished was read first (a loaded machine, the two in one turn), the handshake is done, the
    // request no longer early, and POST is simply not allowed (405). Never served, either way;
    // a few tries see the 425.
    let mut posts = 0;
    let post = loop {
        posts += 1;
        let cfg = GetConfig {
            dcid: Some(dcid_for(1)),
            session: Some(session.clone()),
            method: Some("POST".into()),
            ..GetConfig::default()
        };
        let post = get(&url, None, &cfg).unwrap();
        assert!([425, 405].contains(&post.status), "a POST in 0-RTT answered {}", post.status);
        if post.status == 425 || posts == 3 {
            break post;
        }
        println!("0-RTT POST {posts} read after the handshake: 405 (early data sent: {})", post.early_data);
    };
    assert_eq!(post.status, 425);
    println!("seconds: first {:.3}, 0-RTT GET {:.3}, 0-RTT POST {:.3}", first.seconds, again.seconds, post.seconds);
    let c = server.stop().unwrap();
    assert_eq!((c.http.early_data, c.http.too_early), (2, 1), "{:?}", c.http);
    assert_eq!(c.quic.connections, 2 + posts);
}

#[test]
fn without_early_data_on_the_server_a_resumed_request_waits_for_the_handshake() {
    let tmp = site();
    let server = serve(&tmp.path().join("www"), &ServeConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let url = format!("https://{}/seg", server.local_addr());
    let first = get(&url, None, &GetConfig::default()).unwrap();
    let again = get(&url, None, &GetConfig { session: first.session, ..GetConfig::default() }).unwrap();
    assert_eq!(again.status, 200);
    assert!(again.resumed, "resumption works without early data");
    let c = server.stop().unwrap();
    assert_eq!(c.http.early_data, 0, "nothing was answered from 0-RTT");
}

/// A client that opens no stream window: sends `n` requests for `path`, reads nothing.
struct Stalled {
    n: usize,
    sent: usize,
    h3: Option<quiche::h3::Connection>,
    authority: String,
}

impl App for Stalled {
    type State = ();
    fn accepted(&mut self, _: &udpx_quic::Connection) {}
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, _: &mut ()) {
        if self.h3.is_none() {
            self.h3 = quiche::h3::Connection::with_transport(conn, &quiche::h3::Config::new().unwrap()).ok();
        }
        let Some(h3) = self.h3.as_mut() else { return };
        while self.sent < self.n {
            let req = [
                quiche::h3::Header::new(b":method", b"GET"),
                quiche::h3::Header::new(b":scheme", b"https"),
                quiche::h3::Header::new(b":authority", self.authority.as_bytes()),
                quiche::h3::Header::new(b":path", b"/seg"),
            ];
            if h3.send_request(conn, &req, true).is_err() {
                break;
            }
            self.sent += 1;
        }
        while h3.poll(conn).is_ok() {}
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: ()) {}
}

/// The file's descriptors open in this process (the server runs here).
fn open_fds_to(path: &std::path::Path) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else { return 0 };
    rd.flatten().filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path)).count()
}

#[test]
fn a_client_that_opens_no_window_holds_at_most_the_bound_of_files() {
    let tmp = site();
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.max_open_per_conn = 5;
    let root = tmp.path().join("www");
    let server = serve(&root, &cfg).unwrap();
    let addr = server.local_addr();
    let socket = udpx_quic::client_socket(addr, IoMode::GsoMmsg, true).unwrap();
    let mut qc = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    qc.verify_peer(false);
    qc.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).unwrap();
    qc.set_max_idle_timeout(10_000);
    qc.set_initial_max_data(1 << 20);
    // Our request streams accept nothing from the server: not even response headers.
    qc.set_initial_max_stream_data_bidi_local(0);
    qc.set_initial_max_stream_data_uni(1 << 16);
    qc.set_initial_max_streams_uni(16);
    let app = Stalled { n: 20, sent: 0, h3: None, authority: addr.to_string() };
    let mut c = Host::new(HostSocket::Own(Box::new(socket)), qc, app, udpx_quic::Role::Client);
    c.connect(Some("localhost"), addr, ()).unwrap();
    let start = Instant::now();
    let mut most = 0;
    while start.elapsed() < Duration::from_secs(2) {
        c.step(Duration::from_millis(10)).unwrap();
        most = most.max(open_fds_to(&std::fs::canonicalize(root.join("seg")).unwrap()));
    }
    assert_eq!(c.app().sent, 20);
    let _ = AtomicBool::new(false);
    drop(c);
    let s = server.stop().unwrap();
    println!("at most {most} files open; {:?}", s.http);
    assert!(most <= 5, "{most} files open for one stalled connection");
    assert_eq!((s.http.requests, s.http.unavailable), (20, 15), "past the bound: 503 without a file");
}

/// Requests in 0-RTT (their source not proven: forged or replayed 0-RTT could come from
/// anywhere) claim open files from an eighth of the shard's bound: a resumed client that sends
/// 12 GETs in 0-RTT over a shard bound of 16 gets 2 files (the early budget) and 10 answers of
/// 425 Too Early, which a client repeats after its handshake (fewer when the last GETs reach
/// the server after the handshake: those are proven); the rest of the shard's files stay for
/// proven clients, and a fresh client is served.
#[test]
fn zero_rtt_requests_claim_only_the_early_budget() {
    let tmp = site();
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.early_data = true;
    cfg.max_open_per_shard = 16;
    let root = tmp.path().join("www");
    let server = serve(&root, &cfg).unwrap();
    let addr = server.local_addr();
    let url = format!("https://{addr}/seg");
    let session = get(&url, None, &GetConfig::default()).unwrap().session.expect("a session ticket");
    let before = server.counters().http;
    let socket = udpx_quic::client_socket(addr, IoMode::GsoMmsg, true).unwrap();
    let mut qc = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    qc.verify_peer(false);
    qc.enable_early_data();
    qc.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).unwrap();
    qc.set_max_idle_timeout(10_000);
    qc.set_initial_max_data(1 << 20);
    qc.set_initial_max_stream_data_bidi_local(0); // the responses park: their files stay open
    qc.set_initial_max_stream_data_uni(1 << 16);
    qc.set_initial_max_streams_uni(16);
    let app = Stalled { n: 12, sent: 0, h3: None, authority: addr.to_string() };
    let mut c = Host::new(HostSocket::Own(Box::new(socket)), qc, app, udpx_quic::Role::Client);
    c.connect_with(Some("localhost"), addr, (), Some(&session), None).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) && server.counters().http.requests < before.requests + 12 {
        c.step(Duration::from_millis(10)).unwrap();
    }
    let during = server.counters().http;
    let fresh = get(&url, None, &GetConfig::default()).unwrap();
    drop(c);
    server.stop().unwrap();
    let early = during.early_data - before.early_data;
    let too_early = during.too_early - before.too_early;
    println!("0-RTT budget: {early} early requests, {too_early} answered 425, {} files open", during.open_files);
    // The client writes all 12 before its handshake ends, but the server's reply can come
    // between its first two sends (seen: 3 send calls instead of 2, in about 1 run in 8): the
    // GETs still unsent then go in 1-RTT, proven, and claim from the shard's bound.
    assert_eq!(during.requests - before.requests, 12, "the 12 GETs arrived");
    assert!(early > 2, "more GETs in 0-RTT ({early}) than the early budget");
    assert_eq!(too_early, early - 2, "past the early budget (an eighth of 16), 425 Too Early");
    assert_eq!(during.open_files, 2 + (12 - early), "2 early files and one per proven request");
    assert_eq!(fresh.status, 200, "a proven client is served meanwhile");
}
