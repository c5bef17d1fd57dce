//! The graceful stop (issue 40, item 1): a draining server sends GOAWAY twice, finishes the
//! response under way and then closes the connection cleanly, refuses a new connection with
//! CONNECTION_REFUSED, and its loops end once no connection is left; at the drain deadline
//! what is left is closed with H3_NO_ERROR. The clients are quiche driven by hand, reading
//! slowly so that a response spans the drain. No timing is asserted.

mod common;

use std::time::{Duration, Instant};

use common::raw::{client_config, Raw};
use common::{digest, Site};
use udpx_h3::{serve, H3Server, ServeConfig};

/// H3_NO_ERROR: the server's clean close.
const H3_NO_ERROR: u64 = 0x100;
/// CONNECTION_REFUSED (RFC 9000 20.1).
const CONNECTION_REFUSED: u64 = 0x2;

fn start(site: &Site) -> H3Server {
    serve(&site.root, &ServeConfig::new("127.0.0.1:0".parse().unwrap())).expect("server starts")
}

/// What a client saw of one response and of the server's GOAWAY frames.
#[derive(Default)]
struct Seen {
    body: Vec<u8>,
    fin: bool,
    goaways: Vec<u64>,
}

/// One turn of `c`: what arrived, its HTTP/3 events (GOAWAY IDs, the response's end), at most
/// `budget` body bytes read from stream 0 (its window opens only as far as the client reads),
/// what that frees sent.
fn turn(c: &mut Raw, seen: &mut Seen, budget: usize) {
    c.pump();
    let Some(h3) = c.h3.as_mut() else { return };
    loop {
        match h3.poll(&mut c.conn) {
            // quiche names a GOAWAY's ID where other events name their stream.
            Ok((id, quiche::h3::Event::GoAway)) => seen.goaways.push(id),
            Ok((_, quiche::h3::Event::Finished)) => seen.fin = true,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let got = c.body(0, budget);
    seen.body.extend_from_slice(&got);
    c.pump();
}

/// Turns of `c` until `done` or `limit`; whether `done`.
fn until(c: &mut Raw, seen: &mut Seen, budget: usize, limit: Duration, done: impl Fn(&Raw, &Seen) -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done(c, seen) {
            return true;
        }
        turn(c, seen, budget);
        std::thread::sleep(Duration::from_millis(2));
    }
    done(c, seen)
}

fn waits_for(server: &H3Server, limit: Duration) -> bool {
    let start = Instant::now();
    while !server.finished() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.finished()
}

#[test]
fn a_draining_server_finishes_the_response_then_closes_and_refuses_new_connections() {
    let site = Site::new("drain");
    let want = site.file("big");
    let server = start(&site);
    let addr = server.local_addr();
    // A 64 KiB stream window, read 16 KiB a turn: the 10 MB response spans the drain.
    let mut c = Raw::connect("127.0.0.1", addr, &mut client_config(64 << 10)).with_h3();
    assert_eq!(c.request("/big", true), Some(0));
    let mut seen = Seen::default();
    assert!(until(&mut c, &mut seen, 16 << 10, Duration::from_secs(10), |_, s| s.body.len() > 200_000), "flowing");

    server.drain(Duration::from_secs(60));
    // Both GOAWAY frames: the first with the largest ID, the second naming stream 4 (stream 0
    // was the last request).
    let two = until(&mut c, &mut seen, 16 << 10, Duration::from_secs(10), |_, s| s.goaways.len() >= 2);
    assert!(two, "GOAWAY frames seen: {:?}", seen.goaways);
    assert_eq!(seen.goaways, vec![(1 << 62) - 4, 4]);
    assert!(!seen.fin && c.conn.peer_error().is_none(), "the response goes on after GOAWAY");

    // A new connection meanwhile is refused, visibly.
    let refused = Raw::attempt("127.0.0.1", addr, &mut client_config(1 << 20));
    let e = refused.conn.peer_error().map(|e| (e.is_app, e.error_code));
    assert_eq!(e, Some((false, CONNECTION_REFUSED)), "a new connection while draining");

    // The response finishes whole, then the server closes the connection cleanly.
    let whole = until(&mut c, &mut seen, 64 << 10, Duration::from_secs(60), |c, s| s.fin && c.conn.is_closed());
    assert!(whole, "got {} of {} B, fin {}, closed {}", seen.body.len(), want.len(), seen.fin, c.conn.is_closed());
    assert_eq!((seen.body.len(), digest(&seen.body)), (want.len(), digest(&want)));
    let e = c.conn.peer_error().map(|e| (e.is_app, e.error_code));
    assert_eq!(e, Some((true, H3_NO_ERROR)), "closed by the server after its last response");

    assert!(waits_for(&server, Duration::from_secs(10)), "the loops end once no connection is left");
    let k = server.stop().expect("stop").quic;
    assert_eq!((k.drained, k.drain_closed), (1, 0), "{k:?}");
    assert!(k.refused_draining >= 1, "{k:?}");
}

#[test]
fn the_drain_deadline_closes_what_is_left() {
    let site = Site::new("drain-deadline");
    let server = start(&site);
    // A client that reads nothing: its response stays parked on a shut window.
    let mut c = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(16 << 10)).with_h3();
    c.request("/big", true).expect("request");
    let mut seen = Seen::default();
    assert!(until(&mut c, &mut seen, 0, Duration::from_secs(5), |c, _| c.conn.stats().recv > 10), "response started");
    server.drain(Duration::from_millis(500));
    let closed = until(&mut c, &mut seen, 0, Duration::from_secs(10), |c, _| c.conn.is_closed());
    assert!(closed, "closed at the deadline");
    assert!(!seen.fin);
    let e = c.conn.peer_error().map(|e| (e.is_app, e.error_code));
    assert_eq!(e, Some((true, H3_NO_ERROR)));
    assert!(waits_for(&server, Duration::from_secs(10)), "the loops end after the deadline");
    let k = server.stop().expect("stop");
    assert_eq!((k.quic.drained, k.quic.drain_closed), (0, 1), "{:?}", k.quic);
    assert_eq!(k.http.incomplete, 1, "the parked response ended unsent");
}

/// Third review: a draining server whose GOAWAY quiche cannot send (a client that paused its
/// download keeps the connection's credit shut, and quiche's send capacity is the smaller of
/// the congestion window and that credit) tries again later, not at once: its loop does not
/// turn without waiting for the whole drain. When the client reads again, both GOAWAY frames
/// go, the response finishes whole and the connection closes cleanly. (Before the fix the
/// retry time stayed in the past and the shards turned hundreds of thousands of times in the
/// watched seconds.)
/// A connection whose last response has ended still gets both GOAWAY frames before its
/// close: the close waits for a packet to carry the second (a closing connection sends no
/// stream data), where a close in the turn that wrote the frame lost it.
#[test]
fn an_idle_connection_sees_both_goaways_before_the_close() {
    let site = Site::new("drain-idle");
    let want = site.file("small");
    let server = start(&site);
    let mut c = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(1 << 20)).with_h3();
    assert_eq!(c.request("/small", true), Some(0));
    let mut seen = Seen::default();
    let whole = until(&mut c, &mut seen, 1 << 20, Duration::from_secs(10), |_, s| s.fin);
    assert!(whole && seen.body == want, "the response ended: {} of {} B", seen.body.len(), want.len());
    // Its acknowledgement reaches the server before the drain.
    until(&mut c, &mut seen, 1 << 20, Duration::from_millis(200), |_, _| false);
    server.drain(Duration::from_secs(60));
    let closed = until(&mut c, &mut seen, 1 << 20, Duration::from_secs(10), |c, _| c.conn.is_closed());
    assert!(closed, "the server closed the connection; GOAWAYs seen {:?}", seen.goaways);
    assert_eq!(seen.goaways, vec![(1 << 62) - 4, 4], "both GOAWAY frames before the close");
    let e = c.conn.peer_error().map(|e| (e.is_app, e.error_code));
    assert_eq!(e, Some((true, H3_NO_ERROR)));
    assert!(waits_for(&server, Duration::from_secs(10)), "the loops end once no connection is left");
    server.stop().expect("stop");
}

#[test]
fn a_goaway_that_cannot_go_waits_and_goes_once_the_client_reads_again() {
    let site = Site::new("drain-paused");
    let want = site.file("big");
    let server = start(&site);
    let mut cfg = client_config(1 << 20);
    // The connection's credit: the download takes it all, and the client reads nothing yet.
    cfg.set_initial_max_data(64 << 10);
    let mut c = Raw::connect("127.0.0.1", server.local_addr(), &mut cfg).with_h3();
    assert_eq!(c.request("/big", true), Some(0));
    let mut seen = Seen::default();
    let full = until(&mut c, &mut seen, 0, Duration::from_secs(10), |c, _| c.conn.stats().recv_bytes > 64 << 10);
    assert!(full, "the server filled the connection's credit: {:?}", c.conn.stats());
    server.drain(Duration::from_secs(60));
    // The GOAWAY is due at once (no handover spread) and cannot go while the client reads nothing.
    until(&mut c, &mut seen, 0, Duration::from_millis(500), |_, _| false);
    let before = server.counters().quic;
    until(&mut c, &mut seen, 0, Duration::from_secs(3), |_, _| false);
    let after = server.counters().quic;
    let turns = after.turns - before.turns;
    println!(
        "paused drain: {turns} loop turns and {} waits in 3 s; GOAWAYs seen {:?}",
        after.waits - before.waits,
        seen.goaways
    );
    assert!(seen.goaways.is_empty(), "no room for a GOAWAY while the client reads nothing: {:?}", seen.goaways);
    assert!(turns < 500, "the loops turned {turns} times in 3 s with nothing to do: a spin");
    // The client reads again: credit returns, both frames go, the response ends, then the close.
    let whole = until(&mut c, &mut seen, 1 << 20, Duration::from_secs(60), |c, s| s.fin && c.conn.is_closed());
    assert!(whole, "got {} of {} B, fin {}, closed {}", seen.body.len(), want.len(), seen.fin, c.conn.is_closed());
    assert_eq!((seen.body.len(), digest(&seen.body)), (want.len(), digest(&want)));
    assert_eq!(seen.goaways, vec![(1 << 62) - 4, 4], "both GOAWAY frames went once there was room");
    let e = c.conn.peer_error().map(|e| (e.is_app, e.error_code));
    assert_eq!(e, Some((true, H3_NO_ERROR)), "closed by the server after its last response");
    assert!(waits_for(&server, Duration::from_secs(10)), "the loops end once no connection is left");
    let k = server.stop().expect("stop").quic;
    assert_eq!((k.drained, k.drain_closed), (1, 0), "{k:?}");
}
