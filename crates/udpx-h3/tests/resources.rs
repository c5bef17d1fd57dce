//! What one peer can hold of the HTTP/3 server, and that it always comes back (the second
//! security review): trailers on requests, stalled responses, flow-control credit. Each
//! attacker is a quiche client driven by hand over its own loopback socket (no retransmission
//! games, no timing in the assertions); after each attack a fresh client gets 200.

mod common;

use std::time::{Duration, Instant};

use common::raw::{client_config, drive, fresh_get, Raw};
use common::Site;
use udpx_h3::{serve, H3Server, ServeConfig};

/// Waits (15 s at most) until the server's `open_files` gauge is `n`; its last value.
fn open_files_reach(server: &H3Server, n: u64) -> u64 {
    let start = Instant::now();
    loop {
        let open = server.counters().http.open_files;
        if open == n || start.elapsed() > Duration::from_secs(15) {
            return open;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(site: &Site, f: impl FnOnce(&mut ServeConfig)) -> H3Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    f(&mut cfg);
    serve(&site.root, &cfg).expect("server starts")
}

/// Review item 1: a GET followed by a trailer section (a second HEADERS frame, valid HTTP/3)
/// on 150 streams, against a shard bound of 20 open files. The trailers are read and ignored,
/// each stream has one response, and every open file comes back when the clients close: a
/// fresh GET then gets 200 (before the fix, the shard answered 503 to everyone for good).
#[test]
fn trailers_leak_no_open_file() {
    let site = Site::new("trailers");
    let server = start(&site, |c| c.max_open_per_shard = 20);
    let addr = server.local_addr();
    let mut clients: Vec<Raw> =
        (0..5).map(|_| Raw::connect("127.0.0.1", addr, &mut client_config(1 << 20)).with_h3()).collect();
    let trailers = [quiche::h3::Header::new(b"x-checksum", b"abc")];
    let mut sent = 0;
    for c in &mut clients {
        for _ in 0..30 {
            let Some(sid) = c.request("/big", false) else { continue };
            let h3 = c.h3.as_mut().unwrap();
            if h3.send_additional_headers(&mut c.conn, sid, &trailers, true, true).is_ok() {
                sent += 1;
            }
        }
    }
    assert!(sent >= 100, "trailer sections sent: {sent}");
    // The requests and trailers reach the server; nothing is read of the responses.
    drive(&mut clients, Duration::from_millis(500), |_| {});
    let during = server.counters().http;
    assert!(during.open_files <= 20, "the shard's bound holds: {during:?}");
    for c in &mut clients {
        let _ = c.conn.close(true, 0x100, b"bye");
        c.pump();
    }
    let open = open_files_reach(&server, 0);
    assert_eq!(fresh_get("127.0.0.1", addr, "/small"), Some(200), "a fresh client is served");
    let c = server.stop().unwrap().http;
    println!("trailers: {sent} sent; during {during:?}; after {c:?}");
    assert_eq!(open, 0, "every open file came back: {c:?}");
    assert_eq!(c.trailers, sent as u64, "every trailer section was read and ignored: {c:?}");
    assert!(c.unavailable > 0, "the bound was reached (503s): {c:?}");
}

/// Review item 2, as the third review left it: 50 connections from one address ask for files
/// over a zero stream window and keep the connections alive with PINGs. They hold at most the
/// address's share of the shard's files; a second address is still served; at the stall
/// timeout every response is parked and gives its file back (a paused stream is not an attack:
/// the connections are not closed), and at the park timeout every stream is reset and
/// forgotten by quiche (the `streams_resetting` gauge returns to 0).
#[test]
fn stalled_connections_from_one_address_hold_only_its_share_then_give_their_files_back() {
    let site = Site::new("stall");
    let server = start(&site, |c| {
        c.max_open_per_shard = 200;
        c.max_open_per_addr = 50;
        c.stall_timeout = Duration::from_secs(4);
        c.park_timeout = Duration::from_secs(2);
    });
    let addr = server.local_addr();
    let mut stalled: Vec<Raw> =
        (0..50).map(|_| Raw::connect("127.0.0.1", addr, &mut client_config(0)).with_h3()).collect();
    for c in &mut stalled {
        for _ in 0..4 {
            c.request("/big", true);
        }
    }
    // PINGs every 300 ms keep the connections alive (an idle timeout would end them anyway).
    let ping = |all: &mut [Raw]| {
        drive(all, Duration::from_millis(300), |c| {
            let _ = c.statuses();
        });
        for c in all.iter_mut() {
            let _ = c.conn.send_ack_eliciting();
        }
    };
    ping(&mut stalled);
    ping(&mut stalled);
    let held = server.counters().http;
    let other = fresh_get("127.0.0.2", addr, "/small");
    // Past the stall timeout, still PINGing: the files come back.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) && server.counters().http.open_files > 0 {
        ping(&mut stalled);
    }
    let parked = server.counters().http;
    // Past the park timeout: every stream reset, and forgotten once the resets are acknowledged.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) && {
        let h = server.counters().http;
        h.stalled < 50 || h.streams_resetting > 0
    } {
        ping(&mut stalled);
    }
    let after = server.counters().http;
    let closed = stalled.iter().filter(|c| c.conn.is_closed()).count();
    let again = fresh_get("127.0.0.1", addr, "/small");
    server.stop().unwrap();
    println!("stall: held {held:?}; other address {other:?}; parked {parked:?}; after {after:?}; closed {closed}");
    assert_eq!(held.open_files, 50, "one address holds its share and no more: {held:?}");
    assert!(held.unavailable >= 100, "the rest were refused with 503: {held:?}");
    assert_eq!(other, Some(200), "a second address is served meanwhile");
    assert_eq!(parked.open_files, 0, "the stalled responses gave their files back: {parked:?}");
    assert!(parked.parked >= 50, "counted: {parked:?}");
    assert_eq!(closed, 0, "no connection was closed for a stalled stream");
    assert!(after.stalled >= 50, "the parked streams were reset at the park timeout: {after:?}");
    assert_eq!(after.streams_resetting, 0, "and quiche forgot every one: {after:?}");
    assert_eq!(again, Some(200), "the address is served again");
}

/// Review item 3: the server advertises the credit a request needs, not a download's; 100
/// connections that each push a HEADERS frame larger than the field-section limit are closed
/// (H3_EXCESSIVE_LOAD), and 100 that each send one connection window's worth of unfinished
/// HEADERS frames on 50 streams pin that window (64 KiB): the process's RSS (server and these
/// clients) grows by less than 32 MiB once they are connected. At the old windows (32 MiB a
/// connection, 8 MiB a stream) the same pinners held 800 KiB each (80 MB). (A peer that keeps
/// sending as quiche's HTTP/3 layer copies its unfinished frames out and gives the credit back
/// can hold up to 24 KiB per stream, 2.4 MiB a connection, until the idle timeout: documented,
/// not measured here.)
#[test]
fn a_peer_pins_at_most_the_connection_window() {
    let site = Site::new("window");
    let server = start(&site, |_| {});
    let addr = server.local_addr();
    let mut closers = Vec::new();
    let mut pinners = Vec::new();
    let mut cfg = client_config(1 << 20);
    for k in 0..200 {
        let c = Raw::connect("127.0.0.1", addr, &mut cfg);
        if k == 0 {
            let p = c.conn.peer_transport_params().expect("the server's transport parameters");
            assert!(p.initial_max_data <= udpx_h3::server::CONNECTION_WINDOW, "{}", p.initial_max_data);
            assert!(p.initial_max_stream_data_bidi_remote <= udpx_h3::server::REQUEST_WINDOW);
            assert!(p.initial_max_stream_data_uni <= udpx_h3::server::REQUEST_WINDOW);
        }
        if k % 2 == 0 {
            closers.push(c);
        } else {
            pinners.push(c);
        }
    }
    // What the connections hold before the attack (both ends: about 30 KiB each at the
    // server) is not what the attack pins.
    let rss0 = udpx_lab::netns::rss_bytes();
    // A HEADERS frame (type 0x01) declaring 4 MiB, then as much of it as the window takes.
    let junk = vec![0x55u8; 256 << 10];
    for c in &mut closers {
        let mut frame = vec![0x01, 0x80, 0x40, 0x00, 0x00];
        frame.extend_from_slice(&junk);
        let _ = c.conn.stream_send(0, &frame, false);
    }
    // HEADERS frames declaring 20 KiB (under the limit), 16 KiB of each sent, on 50 streams.
    for c in &mut pinners {
        for s in 0..50u64 {
            let mut frame = vec![0x01, 0x80, 0x00, 0x50, 0x00];
            frame.extend_from_slice(&junk[..16 << 10]);
            let _ = c.conn.stream_send(s * 4, &frame, false);
        }
    }
    let mut all: Vec<Raw> = closers.into_iter().chain(pinners).collect();
    drive(&mut all, Duration::from_secs(3), |_| {});
    let grown = udpx_lab::netns::rss_bytes().saturating_sub(rss0);
    let refused = all.iter().filter(|c| c.conn.peer_error().is_some_and(|e| e.is_app && e.error_code == 0x107)).count();
    let fresh = fresh_get("127.0.0.1", addr, "/small");
    server.stop().unwrap();
    println!("window: RSS grew {} KiB; {refused} connections closed for H3_EXCESSIVE_LOAD", grown >> 10);
    assert!(refused >= 100, "the oversized HEADERS frames closed their connections: {refused}");
    assert!(grown < 32 << 20, "RSS grew {} MiB", grown >> 20);
    assert_eq!(fresh, Some(200));
}

/// An HTTP/3 connection that made its request and then only PINGs (quiche's own idle timeout
/// never fires) is closed at `--idle-timeout` with H3_NO_ERROR and counted; one that keeps
/// asking is not.
#[test]
fn an_idle_connection_is_closed_at_the_idle_timeout() {
    let site = Site::new("idle");
    let server = start(&site, |c| c.idle_timeout = Duration::from_secs(2));
    let addr = server.local_addr();
    let mut cfg = client_config(1 << 20);
    let mut idle = Raw::connect("127.0.0.1", addr, &mut cfg).with_h3();
    let mut busy = Raw::connect("127.0.0.1", addr, &mut cfg).with_h3();
    idle.request("/small", true);
    let start = Instant::now();
    let mut asked = 0;
    while start.elapsed() < Duration::from_secs(6) {
        for c in [&mut idle, &mut busy] {
            c.pump();
            let _ = c.statuses();
            let _ = c.conn.send_ack_eliciting();
        }
        // The busy one asks every 500 ms.
        if start.elapsed() > Duration::from_millis(500 * asked) {
            busy.request("/small", true);
            asked += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = server.stop().unwrap().http;
    let idle_err = idle.conn.peer_error().map(|e| (e.is_app, e.error_code));
    println!("idle: {idle_err:?}; busy closed {}; {c:?}", busy.conn.is_closed());
    assert_eq!(idle_err, Some((true, 0x100)), "the idle connection was closed with H3_NO_ERROR");
    assert!(busy.conn.peer_error().is_none(), "the one that keeps asking was not");
    assert_eq!(c.idle_closed, 1, "counted once");
}

/// The third review's unfinished heads: quiche's HTTP/3 layer copies an unfinished HEADERS
/// frame out of its stream and gives the credit back, so a peer that keeps sending pins up to
/// 24 KiB a stream, whatever the windows. 400 connections from 20 addresses each open 16
/// streams with a HEADERS frame declaring 20 KiB and send 16 KiB of it (100 MiB in all, were
/// it held): the caps (16 a connection, 64 an address, 1,024 a shard) close the connections
/// that go over them (H3_EXCESSIVE_LOAD), the gauge never passes 1,024, the process's RSS
/// (server and these 400 clients) grows by less than 100 MiB (14-64 MiB in four runs; 199 MiB
/// and 6,400 heads held with the caps lifted), and a fresh GET is answered meanwhile. Then one
/// unfinished head on a fresh connection is closed at the head deadline (10 s,
/// H3_REQUEST_INCOMPLETE) and the gauge returns to 0. Prints the RSS growth (the figure).
#[test]
fn unfinished_request_heads_are_bounded_and_time_out() {
    let site = Site::new("heads");
    let server = start(&site, |_| {});
    let addr = server.local_addr();
    let mut cfg = client_config(1 << 20);
    let mut pinners: Vec<(Raw, Vec<usize>)> = Vec::new();
    for a in 1..=20 {
        for _ in 0..20 {
            pinners.push((Raw::connect(&format!("127.0.1.{a}"), addr, &mut cfg), vec![0; 16]));
        }
    }
    let rss0 = udpx_lab::netns::rss_bytes();
    // Each stream: a HEADERS frame (type 0x01) declaring 20 KiB (under the server's limit),
    // then 16 KiB of it, sent as the credit comes back.
    let mut frame = vec![0x01, 0x80, 0x00, 0x50, 0x00];
    frame.extend_from_slice(&vec![0x55u8; 16 << 10]);
    let feed = |c: &mut Raw, sent: &mut [usize]| {
        for (i, done) in sent.iter_mut().enumerate() {
            if *done < frame.len() {
                *done += c.conn.stream_send(i as u64 * 4, &frame[*done..], false).unwrap_or(0);
            }
        }
        c.pump();
    };
    let (start_at, mut most) = (Instant::now(), 0);
    while start_at.elapsed() < Duration::from_secs(4) {
        for (c, sent) in &mut pinners {
            feed(c, sent);
        }
        most = most.max(server.counters().http.unfinished_heads);
        std::thread::sleep(Duration::from_millis(5));
    }
    let grown = udpx_lab::netns::rss_bytes().saturating_sub(rss0);
    let fresh = fresh_get("127.0.0.1", addr, "/small");
    let refused =
        pinners.iter().filter(|(c, _)| c.conn.peer_error().is_some_and(|e| e.is_app && e.error_code == 0x107)).count();
    println!(
        "unfinished heads: RSS grew {} KiB; {refused} of 400 connections closed over a cap; at most {most} held",
        grown >> 10
    );
    // The pinners leave, closing their connections (one not closed over a cap would otherwise
    // reach its own head deadline during the next part and be counted there too).
    for (c, _) in &mut pinners {
        let _ = c.conn.close(true, 0x100, b"done");
        c.pump();
    }
    drop(pinners);
    let gone = Instant::now();
    while server.counters().http.unfinished_heads > 0 && gone.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let timed_out_before = server.counters().http.heads_timed_out;

    // One unfinished head, from an address of its own: closed at the deadline.
    let mut slow = (Raw::connect("127.0.2.1", addr, &mut cfg), vec![0; 1]);
    let closed = Instant::now();
    while slow.0.conn.peer_error().is_none() && closed.elapsed() < Duration::from_secs(15) {
        feed(&mut slow.0, &mut slow.1);
        std::thread::sleep(Duration::from_millis(5));
    }
    // (Counted down once the connection is gone, after its draining period.)
    let waited = Instant::now();
    while server.counters().http.unfinished_heads > 0 && waited.elapsed() < Duration::from_secs(10) {
        slow.0.pump();
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = server.counters().http;
    server.stop().unwrap();
    assert!(most <= 1024, "the shard's cap: {most}");
    assert!(refused >= 300, "the connections over the caps were closed: {refused}");
    assert!(grown < 100 << 20, "RSS grew {} MiB", grown >> 20);
    assert_eq!(fresh, Some(200), "a fresh GET is answered during the attack");
    assert_eq!(slow.0.conn.peer_error().map(|e| (e.is_app, e.error_code)), Some((true, 0x10d)), "{after:?}");
    assert!(closed.elapsed() >= Duration::from_secs(9), "closed at the deadline, not before");
    assert_eq!((after.heads_timed_out - timed_out_before, after.unfinished_heads), (1, 0), "{after:?}");
}
