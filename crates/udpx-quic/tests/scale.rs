//! The event-driven host (correctness, not timing): idle connections cost a turn nothing;
//! a small response is not held up behind a large one by more than a few quanta; every cap
//! refuses with its counter; a handshake that does not finish is dropped at its deadline;
//! Retry sends a client back to the same shard; tokens that are forged, expired or from
//! another address are refused.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use udpx_quic::{
    client_socket, App, Host, HostCounters, HostSocket, IoMode, Limits, RetryPolicy, Server, ServerConfig, ServiceKeys,
};

mod common;

use common::TempCert;

/// A config with a long idle timeout (the tests' connections sit idle for seconds).
fn config(pem: Option<(&str, &str)>) -> quiche::Config {
    let mut c = common::quiche_config(pem, true);
    c.set_max_idle_timeout(60_000);
    c.set_initial_max_streams_bidi(1000);
    c
}

/// Server: a request on a stream names a size ("123"); the answer is that many bytes and FIN.
/// Event-driven: new requests from the readable streams, the rest when a stream is writable.
#[derive(Default)]
struct Bytes;

impl App for Bytes {
    /// Bytes left to send, by stream.
    type State = HashMap<u64, usize>;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> HashMap<u64, usize> {
        HashMap::new()
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, left: &mut HashMap<u64, usize>) {
        let readable: Vec<u64> = conn.readable().collect();
        let mut buf = [0u8; 64];
        for sid in readable {
            while let Ok((n, fin)) = conn.stream_recv(sid, &mut buf) {
                if fin {
                    let size = std::str::from_utf8(&buf[..n]).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
                    left.insert(sid, size);
                }
            }
        }
        let writable: Vec<u64> = std::iter::from_fn(|| conn.stream_writable_next()).collect();
        let chunk = [0x5au8; 16 * 1024];
        for (&sid, n) in left.iter_mut() {
            if *n == 0 && !writable.contains(&sid) {
                continue;
            }
            while *n > 0 {
                match conn.stream_send(sid, &chunk[..chunk.len().min(*n)], chunk.len() >= *n) {
                    Ok(w) => *n -= w,
                    Err(_) => break,
                }
            }
            if *n > 0 {
                let _ = conn.stream_writable(sid, 1);
            }
        }
        left.retain(|_, n| *n > 0);
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: HashMap<u64, usize>) {}
}

/// A loopback server of `shards` shards answering with [`Bytes`].
fn server(cert: &TempCert, shards: usize, limits: Limits, keys: Option<ServiceKeys>) -> Server {
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = shards;
    cfg.host.limits = limits;
    cfg.host.keys = keys;
    let configs = (0..shards).map(|_| config(Some(cert.pem()))).collect();
    Server::start(&cfg, configs, |_| Bytes).unwrap()
}

/// The client side of the tests: per connection, what it asked and got.
#[derive(Default)]
struct Asker {
    /// Connections established.
    established: usize,
    /// Requests to send on the next turn, by connection tag.
    want: HashMap<u32, Vec<usize>>,
    /// Bytes received, by tag.
    got: HashMap<u32, usize>,
    /// Finished responses, by tag: (when, that tag's stream).
    done: Vec<(u32, Instant)>,
    /// Connections the server closed with CONNECTION_REFUSED.
    refused: usize,
}

struct Tag {
    tag: u32,
    established: bool,
    next_stream: u64,
}

impl App for Asker {
    type State = Tag;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> Tag {
        unreachable!("a client")
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, t: &mut Tag) {
        if !t.established {
            t.established = true;
            self.established += 1;
        }
        if let Some(sizes) = self.want.remove(&t.tag) {
            for size in sizes {
                let _ = conn.stream_send(t.next_stream, size.to_string().as_bytes(), true);
                t.next_stream += 4;
            }
        }
        let readable: Vec<u64> = conn.readable().collect();
        let mut buf = [0u8; 64 * 1024];
        for sid in readable {
            while let Ok((n, fin)) = conn.stream_recv(sid, &mut buf) {
                *self.got.entry(t.tag).or_default() += n;
                if fin {
                    self.done.push((t.tag, Instant::now()));
                }
            }
        }
    }
    fn wake_at(&self, t: &Tag) -> Option<Instant> {
        // A request queued from outside the loop goes on the next turn.
        self.want.contains_key(&t.tag).then(Instant::now)
    }
    fn closed(&mut self, conn: &udpx_quic::Connection, _: Tag) {
        if conn.peer_error().is_some_and(|e| !e.is_app && e.error_code == udpx_quic::initial::CONNECTION_REFUSED) {
            self.refused += 1;
        }
    }
}

fn client(addr: SocketAddr) -> Host<Asker> {
    let socket = client_socket(addr, IoMode::GsoMmsg, true).unwrap();
    Host::new(HostSocket::Own(Box::new(socket)), config(None), Asker::default(), udpx_quic::Role::Client)
}

/// Runs `h` until `done` or `limit` passes; whether `done`.
fn run_until(h: &mut Host<Asker>, limit: Duration, mut done: impl FnMut(&Host<Asker>) -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done(h) {
            return true;
        }
        h.step(Duration::from_millis(5)).unwrap();
    }
    done(h)
}

fn connect(h: &mut Host<Asker>, addr: SocketAddr, tag: u32) {
    h.connect(Some("localhost"), addr, Tag { tag, established: false, next_stream: 0 }).unwrap();
}

/// The server's per-shard counters once every shard has published them anew since this call
/// (each loop publishes every 100 ms at most, and its `turns` count up between publications,
/// idle or not: a changed count is a later publication, which has everything the shard did
/// before this call) and `settled` holds for them. Polls for 5 s at most; at the deadline the
/// last read is returned for the caller's assertions to judge, once every shard published.
fn shard_counters_when(srv: &Server, settled: impl Fn(&[HostCounters]) -> bool) -> Vec<HostCounters> {
    let stale: Vec<u64> = srv.shard_counters().iter().map(|c| c.turns).collect();
    let start = Instant::now();
    loop {
        let now = srv.shard_counters();
        let fresh = now.iter().zip(&stale).all(|(c, t)| c.turns != *t);
        if fresh && (settled(&now) || start.elapsed() > Duration::from_secs(5)) {
            return now;
        }
        assert!(start.elapsed() < Duration::from_secs(5) || fresh, "a shard published no counters within 5 s: {now:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`shard_counters_when`], summed over the shards.
fn counters_when(srv: &Server, settled: impl Fn(&HostCounters) -> bool) -> HostCounters {
    let sum = |s: &[HostCounters]| s.iter().fold(HostCounters::default(), |a, c| a.add(c));
    sum(&shard_counters_when(srv, |s| settled(&sum(s))))
}

/// 10,000 connections sit idle while one of them asks and gets 100 small answers: the
/// server's turns in that time serve about one connection each, not ten thousand.
#[test]
fn idle_connections_cost_a_turn_nothing() {
    let cert = TempCert::new("idle");
    // Every connection comes from 127.0.0.1: the cap per address is raised past them.
    let srv = server(&cert, 1, Limits { max_per_ip: 20_000, ..Limits::default() }, None);
    let addr = srv.local_addr();
    let mut c = client(addr);
    const N: u32 = 10_000;
    let start = Instant::now();
    // Opened in waves, so handshakes do not pile up past their deadline on a slow machine.
    for wave in 0..N / 500 {
        for k in 0..500 {
            connect(&mut c, addr, wave * 500 + k);
        }
        let want = ((wave + 1) * 500) as usize;
        let ok = run_until(&mut c, Duration::from_secs(60), |h| h.app().established >= want);
        assert!(
            ok,
            "wave {wave}: {} established; client {:?}; server {:?}",
            c.app().established,
            c.counters(),
            srv.counters()
        );
    }
    println!("{N} handshakes in {:?}", start.elapsed());
    // Quiet: the handshakes' last acknowledgements and timers settle.
    run_until(&mut c, Duration::from_millis(500), |_| false);
    let before = counters_when(&srv, |k| k.open_connections == u64::from(N));
    assert_eq!(before.open_connections, u64::from(N));
    for round in 0..100 {
        c.app_mut().want.insert(0, vec![100]);
        c.wake(udpx_quic::Slot(0));
        let want = round + 1;
        assert!(run_until(&mut c, Duration::from_secs(5), |h| h.app().done.len() >= want), "answer {round}");
    }
    // Published after the last answer arrived: every turn that served the 100 requests.
    let after = counters_when(&srv, |_| true);
    let (turns, served) = (after.turns - before.turns, after.served - before.served);
    println!(
        "100 exchanges beside {N} idle connections: {turns} turns, {served} connections served, {} deadlines fired",
        after.timers_fired - before.timers_fired
    );
    assert!(turns >= 100, "one turn at least per request");
    assert!(served <= 3 * turns, "a turn served only the connection with work: {served} in {turns} turns");
    assert!(served < u64::from(N), "no turn walked the idle connections");
    srv.stop().unwrap();
}

/// A server host (with the deferred flush on or off) and a client host of it, both for this
/// thread to step in turn ([`lockstep`]).
fn lockstep_pair(cert: &TempCert, defer_flush: bool) -> (Host<Bytes>, Host<Asker>, SocketAddr) {
    let socket = udpx_quic::socket_config("127.0.0.1:0".parse().unwrap(), IoMode::GsoMmsg, true).bind().unwrap();
    let s = Host::with_config(
        HostSocket::Own(Box::new(socket)),
        config(Some(cert.pem())),
        Bytes,
        udpx_quic::Role::Server { host_id: 0, worker: 0, shards: 1 },
        udpx_quic::HostConfig { defer_flush, ..udpx_quic::HostConfig::default() },
    );
    let addr = s.local_addr();
    (s, client(addr), addr)
}

/// One turn each, the client first, until `done` holds: after how many turns (`None`: not
/// within `limit`).
fn lockstep(c: &mut Host<Asker>, s: &mut Host<Bytes>, limit: u32, done: &dyn Fn(&Asker) -> bool) -> Option<u32> {
    for n in 0..limit {
        if done(c.app()) {
            return Some(n);
        }
        c.step(Duration::from_millis(1)).unwrap();
        s.step(Duration::from_millis(1)).unwrap();
    }
    None
}

/// A 50 MB answer and a 10 KB one on two connections of one client, the small one asked once
/// the large one is flowing: the small one is answered within a few of the server's turns, and
/// the large one gets at most a few quanta meanwhile (each connection writes at most its
/// quantum per turn, round robin).
///
/// The server's host and the client's take turns on this thread (loopback delivers a datagram
/// within the sender's call), so what is counted is the server's scheduling in turns, not the
/// operating system's: with each on its own thread, a loop descheduled for a few milliseconds
/// on a busy machine let the large download pour a whole window meanwhile (1.5-2.1 MB seen in
/// the full suite, with no datagram lost), whatever the server's order.
#[test]
fn a_large_download_delays_a_small_one_by_a_few_quanta() {
    let cert = TempCert::new("fair");
    let (mut s, mut c, addr) = lockstep_pair(&cert, false);
    let turns = lockstep;
    connect(&mut c, addr, 0);
    connect(&mut c, addr, 1);
    assert!(turns(&mut c, &mut s, 1_000, &|a| a.established == 2).is_some(), "handshakes");
    c.app_mut().want.insert(0, vec![50_000_000]);
    c.wake(udpx_quic::Slot(0));
    let flowing = turns(&mut c, &mut s, 20_000, &|a| a.got.get(&0).copied().unwrap_or(0) > 2_000_000);
    assert!(flowing.is_some(), "the large download flows");
    let big_before = c.app().got[&0];
    c.app_mut().want.insert(1, vec![10_000]);
    c.wake(udpx_quic::Slot(1));
    let took = turns(&mut c, &mut s, 1_000, &|a| a.done.iter().any(|d| d.0 == 1));
    let big_meanwhile = c.app().got[&0] - big_before;
    let quantum = udpx_quic::QUANTUM_PACKETS * 1350;
    println!(
        "the large download got {big_meanwhile} B while the small one was answered in {took:?} turns (a quantum: ~{quantum} B)"
    );
    assert!(took.is_some_and(|n| n <= 3), "the small response took {took:?} turns of each side");
    assert!(big_meanwhile <= 6 * quantum, "{big_meanwhile} B: more than a few quanta");
}

/// With the deferred flush on: a response a little larger than the connection's quantum
/// (quiche's 10-packet `send_quantum()` under CUBIC) leaves in one send call: the turn that wrote the quantum
/// keeps its packets while the connection is still ready, and the next turn's join them. In
/// lockstep, the server stepping alone (no ACK reaches it meanwhile), after a warm-up that
/// opened the congestion window past the response.
#[test]
fn a_response_past_the_quantum_leaves_in_one_send_call() {
    let cert = TempCert::new("defer");
    let (mut s, mut c, addr) = lockstep_pair(&cert, true);
    let both =
        |c: &mut Host<Asker>, s: &mut Host<Bytes>, done: &dyn Fn(&Asker) -> bool| lockstep(c, s, 5_000, done).is_some();
    connect(&mut c, addr, 0);
    assert!(both(&mut c, &mut s, &|a| a.established == 1), "handshake");
    c.app_mut().want.insert(0, vec![1_000_000]);
    c.wake(udpx_quic::Slot(0));
    assert!(both(&mut c, &mut s, &|a| a.done.len() == 1), "the warm-up download");
    // Everything acknowledged: the server has nothing in flight.
    for _ in 0..50 {
        c.step(Duration::from_millis(1)).unwrap();
        s.step(Duration::from_millis(1)).unwrap();
    }
    const SIZE: usize = 16 * 1024;
    c.app_mut().want.insert(0, vec![SIZE]);
    c.wake(udpx_quic::Slot(0));
    c.step(Duration::from_millis(1)).unwrap(); // the request leaves
    let before = s.counters();
    for _ in 0..4 {
        s.step(Duration::from_millis(1)).unwrap();
    }
    let after = s.counters();
    let (calls, packets) = (after.send_calls - before.send_calls, after.packets_sent - before.packets_sent);
    println!("{packets} packets in {calls} send calls, {} deferred", after.deferred_flushes - before.deferred_flushes);
    assert!(packets > 10, "more than the quantum was written: {packets}");
    assert_eq!(calls, 1, "{packets} packets");
    assert!(after.deferred_flushes > before.deferred_flushes);
    assert!(both(&mut c, &mut s, &|a| a.done.len() == 2), "the response arrives whole");
    assert_eq!(c.app().got[&0], 1_000_000 + SIZE);
}

/// Each cap refuses what passes it, counted: connections per shard, and per address; each
/// refused Initial is answered with CONNECTION_REFUSED, and its client closes at once.
#[test]
fn caps_refuse_with_their_counters() {
    let cert = TempCert::new("caps");
    for (limits, what) in [
        (Limits { max_connections: 3, retry: RetryPolicy::Never, ..Limits::default() }, "connections"),
        (Limits { max_per_ip: 2, retry: RetryPolicy::Never, ..Limits::default() }, "per address"),
    ] {
        let srv = server(&cert, 1, limits, None);
        let addr = srv.local_addr();
        let mut c = client(addr);
        for tag in 0..5 {
            connect(&mut c, addr, tag);
        }
        let cap = limits.max_connections.min(limits.max_per_ip);
        // The refused two hear so at once (a server Initial with CONNECTION_REFUSED), not
        // by a handshake that times out: draining, or closed after it.
        let refused_seen = |c: &Host<Asker>| {
            let mut n = c.app().refused;
            c.for_each_connection(|conn, _| {
                let e = conn.peer_error();
                n += usize::from(e.is_some_and(|e| e.error_code == udpx_quic::initial::CONNECTION_REFUSED));
            });
            n
        };
        run_until(&mut c, Duration::from_secs(2), |c| c.app().established == cap && refused_seen(c) == 5 - cap);
        let k = counters_when(&srv, |k| k.refusals_sent >= 2);
        assert_eq!((c.app().established, refused_seen(&c)), (cap, 5 - cap), "{what}: {k:?}");
        let refused = match what {
            "connections" => k.refused_connections,
            _ => k.refused_per_ip,
        };
        assert!(refused >= 2, "{what}: two clients refused: {k:?}");
        assert_eq!(k.refusals_sent, refused, "{what}: each refusal answered: {k:?}");
        srv.stop().unwrap();
    }
}

/// A client Initial (quiche's first datagram of a fresh connection from `local`).
fn initial(local: SocketAddr, server: SocketAddr) -> Vec<u8> {
    let mut cfg = config(None);
    let mut scid = [0u8; 16];
    udpx_quic::cid::random_bytes(&mut scid).unwrap();
    let mut conn =
        quiche::connect(Some("localhost"), &quiche::ConnectionId::from_ref(&scid), local, server, &mut cfg).unwrap();
    let mut out = vec![0u8; 1500];
    let (n, _) = conn.send(&mut out).unwrap();
    out.truncate(n);
    out
}

/// `initial` with `token` in its (empty) token field: the long header's token length is the
/// byte after the source connection ID.
fn with_token(initial: &[u8], token: &[u8]) -> Vec<u8> {
    let dcil = initial[5] as usize;
    let scil = initial[6 + dcil] as usize;
    let at = 7 + dcil + scil;
    assert_eq!(initial[at], 0, "a fresh client's Initial has no token");
    assert!(token.len() < 64, "a one-byte varint length");
    let mut out = initial[..at].to_vec();
    out.push(token.len() as u8);
    out.extend_from_slice(token);
    out.extend_from_slice(&initial[at + 1..]);
    out
}

/// Half-open handshakes are capped and dropped at their deadline (nothing sent to the
/// address after it): a raw socket sends Initials and never answers.
#[test]
fn half_open_handshakes_are_capped_and_dropped_at_their_deadline() {
    let cert = TempCert::new("halfopen");
    let limits = Limits {
        max_half_open: 3,
        handshake_timeout: Duration::from_millis(500),
        retry: RetryPolicy::Never,
        ..Limits::default()
    };
    let srv = server(&cert, 1, limits, None);
    let raw = StdUdp::bind("127.0.0.1:0").unwrap();
    for _ in 0..5 {
        raw.send_to(&initial(raw.local_addr().unwrap(), srv.local_addr()), srv.local_addr()).unwrap();
    }
    // All five handled: admitted (half-open until their deadline, then timed out) or refused.
    // Three admitted and two refused, whenever the counters are read.
    let k = counters_when(&srv, |k| k.half_open + k.handshake_timeouts + k.refused_half_open >= 5);
    assert_eq!((k.half_open + k.handshake_timeouts, k.refused_half_open), (3, 2), "{k:?}");
    assert_eq!(k.open_connections, k.half_open, "no handshake finished: {k:?}");
    let k = counters_when(&srv, |k| k.half_open == 0 && k.handshake_timeouts >= 3);
    assert_eq!((k.handshake_timeouts, k.half_open, k.open_connections), (3, 0, 0), "{k:?}");
    srv.stop().unwrap();
}

/// Under an Initial flood the half-open slots turn over: a handshake that began while a
/// quarter of the cap was in use gets the flood deadline, the first ones the long one. Without
/// it, forged handshakes held every slot for the whole `handshake_timeout` (30 s by default)
/// and every real client was refused meanwhile.
#[test]
fn handshakes_begun_under_a_flood_get_the_short_deadline() {
    let cert = TempCert::new("flooddeadline");
    let limits = Limits {
        max_half_open: 4, // a quarter: 1
        handshake_timeout: Duration::from_secs(60),
        flood_handshake_timeout: Duration::from_millis(300),
        retry: RetryPolicy::Never,
        ..Limits::default()
    };
    let srv = server(&cert, 1, limits, None);
    let raw = StdUdp::bind("127.0.0.1:0").unwrap();
    for _ in 0..4 {
        raw.send_to(&initial(raw.local_addr().unwrap(), srv.local_addr()), srv.local_addr()).unwrap();
    }
    // The first began with no handshake under way: 60 s. The other three under the flood
    // level: dropped after 300 ms, which frees their slots for the next client.
    let k = counters_when(&srv, |k| k.handshake_timeouts >= 3);
    assert_eq!((k.handshake_timeouts, k.half_open, k.refused_half_open), (3, 1, 0), "{k:?}");
    raw.send_to(&initial(raw.local_addr().unwrap(), srv.local_addr()), srv.local_addr()).unwrap();
    let k = counters_when(&srv, |k| k.connections >= 5);
    assert_eq!((k.connections, k.refused_half_open), (5, 0), "a slot was free again: {k:?}");
    srv.stop().unwrap();
}

/// Retry, always: the client's Initial (steered to shard 1 by its DCID's worker byte) gets a
/// Retry whose ID makes the second Initial come back to shard 1, which makes the connection.
#[test]
fn a_retried_client_lands_on_the_same_shard() {
    let cert = TempCert::new("retry");
    let limits = Limits { retry: RetryPolicy::Always, ..Limits::default() };
    let srv = server(&cert, 2, limits, None);
    let addr = srv.local_addr();
    let mut c = client(addr);
    let mut dcid = [7u8; 12];
    dcid[udpx_quic::WORKER_BYTE as usize] = 1;
    c.connect_with(Some("localhost"), addr, Tag { tag: 0, established: false, next_stream: 0 }, None, Some(&dcid))
        .unwrap();
    assert!(run_until(&mut c, Duration::from_secs(5), |h| h.app().established == 1), "established after a Retry");
    c.app_mut().want.insert(0, vec![5_000]);
    c.wake(udpx_quic::Slot(0));
    assert!(run_until(&mut c, Duration::from_secs(5), |h| !h.app().done.is_empty()));
    let shards = shard_counters_when(&srv, |s| s[1].connections >= 1 && s[1].validated_by_retry >= 1);
    println!("{:?}", shards.iter().map(|s| (s.retries_sent, s.validated_by_retry, s.connections)).collect::<Vec<_>>());
    // quiche's first flight may be two Initials (a large ClientHello): a Retry each.
    assert!(shards[1].retries_sent >= 1, "{:?}", shards[1]);
    assert_eq!((shards[1].validated_by_retry, shards[1].connections), (1, 1));
    assert_eq!((shards[0].retries_sent, shards[0].connections), (0, 0), "nothing reached shard 0");
    srv.stop().unwrap();
}

/// Tokens that are forged, expired, or replayed from another address are refused (counted),
/// and no connection is made for them.
#[test]
fn bad_tokens_are_refused() {
    let cert = TempCert::new("tokens");
    let secret = [5u8; 32];
    let limits = Limits { retry: RetryPolicy::Always, ..Limits::default() };
    let srv = server(&cert, 1, limits, Some(ServiceKeys::shared(&secret)));
    let addr = srv.local_addr();
    let a = StdUdp::bind("127.0.0.1:0").unwrap();
    let b = StdUdp::bind("127.0.0.1:0").unwrap();
    a.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    // A real Retry token, for a's address.
    a.send_to(&initial(a.local_addr().unwrap(), addr), addr).unwrap();
    let mut buf = [0u8; 1500];
    let (n, _) = a.recv_from(&mut buf).expect("a Retry");
    let hdr = quiche::Header::from_slice(&mut buf[..n], 16).unwrap();
    assert_eq!(hdr.ty, quiche::Type::Retry);
    let token = hdr.token.clone().unwrap();
    // Replayed from b.
    b.send_to(&with_token(&initial(b.local_addr().unwrap(), addr), &token), addr).unwrap();
    // Replayed from a itself, in another handshake (a new DCID, not the Retry's).
    a.send_to(&with_token(&initial(a.local_addr().unwrap(), addr), &token), addr).unwrap();
    // Forged.
    b.send_to(&with_token(&initial(b.local_addr().unwrap(), addr), &[0x52; 40]), addr).unwrap();
    // Expired: sealed with the service's key a minute ago, for this Initial's own DCID.
    let ib = initial(b.local_addr().unwrap(), addr);
    let dcid = ib[6..6 + usize::from(ib[5])].to_vec();
    let old = ServiceKeys::shared(&secret).token_key().seal(
        b.local_addr().unwrap(),
        &[1; 16],
        &dcid,
        SystemTime::now() - Duration::from_secs(60),
    );
    b.send_to(&with_token(&ib, &old), addr).unwrap();
    // All four Initials handled (a token refused, counted by kind), then judged.
    let k = counters_when(&srv, |k| k.tokens_invalid + k.tokens_expired >= 4);
    assert_eq!((k.tokens_invalid, k.tokens_expired, k.connections, k.retries_sent), (3, 1, 0, 1), "{k:?}");
    srv.stop().unwrap();
    let _ = AtomicBool::new(false);
}
