//! A paused stream is not an attack (the third review, item 1). A browser's media stack stops
//! reading a video request when its buffer is full, often for longer than the stall timeout,
//! while its other requests go on. The server parks such a response (its file given back),
//! resumes it byte-exact when the client reads again, resets it only after the park timeout
//! or when its file changed meanwhile, and never touches the connection's other streams.
//! Each client is quiche driven by hand over its own loopback socket; no timing is asserted.

mod common;

use std::time::{Duration, Instant};

use common::raw::{client_config, Raw};
use common::{digest, Site};
use udpx_h3::{serve, H3Server, ServeConfig};

fn start(site: &Site, f: impl FnOnce(&mut ServeConfig)) -> H3Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    f(&mut cfg);
    serve(&site.root, &cfg).expect("server starts")
}

/// What a client saw of its streams.
#[derive(Default)]
struct Seen {
    /// Streams whose response ended (fin).
    finished: Vec<u64>,
    /// Streams the server reset, with the code.
    reset: Vec<(u64, u64)>,
    /// Response statuses, by stream.
    status: Vec<(u64, u16)>,
}

/// One turn of `c`: what arrived and its HTTP/3 events; then `read(sid)` body bytes of each
/// stream in `reads` (a stream's window opens only as far as the client reads); what that
/// frees is sent.
fn turn(c: &mut Raw, seen: &mut Seen, reads: &mut [(u64, usize, &mut Vec<u8>)]) {
    c.pump();
    if let Some(h3) = c.h3.as_mut() {
        loop {
            match h3.poll(&mut c.conn) {
                Ok((sid, quiche::h3::Event::Headers { list, .. })) => {
                    use quiche::h3::NameValue;
                    if let Some(s) = list.iter().find(|h| h.name() == b":status") {
                        seen.status.push((sid, std::str::from_utf8(s.value()).unwrap().parse().unwrap()));
                    }
                }
                Ok((sid, quiche::h3::Event::Finished)) => seen.finished.push(sid),
                Ok((sid, quiche::h3::Event::Reset(code))) => seen.reset.push((sid, code)),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    for (sid, budget, body) in reads.iter_mut() {
        let got = c.body(*sid, *budget);
        body.extend_from_slice(&got);
    }
    c.pump();
}

/// Waits (`limit` at most) until `done`, turning `c` with no stream read; PINGs every second
/// keep the connection alive as a browser's do while it has open streams.
fn idle_until(c: &mut Raw, seen: &mut Seen, limit: Duration, mut done: impl FnMut(&Raw, &Seen) -> bool) -> bool {
    let start = Instant::now();
    let mut pinged = Instant::now();
    while start.elapsed() < limit {
        if done(c, seen) {
            return true;
        }
        if pinged.elapsed() > Duration::from_secs(1) {
            let _ = c.conn.send_ack_eliciting();
            pinged = Instant::now();
        }
        turn(c, seen, &mut []);
        std::thread::sleep(Duration::from_millis(5));
    }
    done(c, seen)
}

/// 150 requests on one connection whose client reads nothing, 50 at a time, each parked at
/// the stall timeout and reset at the park timeout. The connection allows 100 streams at
/// once and quiche gives the client a new one only for each it has collected, so the rounds
/// after the second open only if the server's resets are forgotten; both kinds are tried: a
/// zero window (no response headers ever go) and a 2 KiB one (headers and a little body go).
/// The connection is never closed, and the gauge of streams awaiting collection returns to 0.
#[test]
fn more_than_100_stalled_streams_on_one_connection_are_reset_and_collected() {
    let site = Site::new("paused-many");
    let server = start(&site, |c| {
        c.stall_timeout = Duration::from_secs(1);
        c.park_timeout = Duration::from_secs(1);
    });
    let addr = server.local_addr();
    for window in [0u64, 2048] {
        let mut c = Raw::connect("127.0.0.1", addr, &mut client_config(window)).with_h3();
        let mut seen = Seen::default();
        let mut opened = 0;
        for round in 0..3 {
            let mut sids = Vec::new();
            for _ in 0..50 {
                let Some(sid) = c.request("/big", true) else { break };
                sids.push(sid);
            }
            opened += sids.len();
            assert_eq!(sids.len(), 50, "window {window}, round {round}: a new stream for each request");
            let all_reset = idle_until(&mut c, &mut seen, Duration::from_secs(20), |_, s| {
                sids.iter().all(|sid| s.reset.iter().any(|(r, _)| r == sid))
            });
            assert!(all_reset, "window {window}, round {round}: {} of 50 reset", seen.reset.len() % 50);
        }
        // Every reset is acknowledged and forgotten.
        let collected = {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) && server.counters().http.streams_resetting > 0 {
                turn(&mut c, &mut seen, &mut []);
                std::thread::sleep(Duration::from_millis(10));
            }
            server.counters().http
        };
        println!("window {window}: {opened} streams opened, {} reset; {collected:?}", seen.reset.len());
        assert_eq!(opened, 150);
        assert!(seen.reset.iter().all(|&(_, code)| code == 0x10c), "H3_REQUEST_CANCELLED: {:?}", &seen.reset[..3]);
        assert!(seen.finished.is_empty(), "no response finished");
        assert!(!c.conn.is_closed(), "the connection is never closed for its stalled streams");
        assert_eq!(collected.streams_resetting, 0, "quiche forgot every reset stream: {collected:?}");
        assert_eq!(collected.open_files, 0, "{collected:?}");
        c.conn.close(true, 0x100, b"").unwrap();
        c.pump();
    }
    let h = server.stop().unwrap().http;
    assert!(h.parked >= 300 && h.stalled >= 300, "{h:?}");
    assert_eq!(h.resumed, 0, "{h:?}");
}

/// A paused download (the client stops reading it) and an active one on the same connection:
/// the active one completes meanwhile, the paused one is parked (its file given back) and,
/// after a pause well past the stall timeout, resumes byte-exact from where it stopped.
fn pause_and_resume(stall: Duration, pause: Duration) {
    let site = Site::new("paused-resume");
    let want = site.file("big");
    let server = start(&site, |c| c.stall_timeout = stall);
    // 64 KiB per stream, read 16 KiB a turn: a download spans many turns.
    let mut c = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(64 << 10)).with_h3();
    let paused = c.request("/big", true).expect("request");
    let active = c.request("/big", true).expect("request");
    let mut seen = Seen::default();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // Both flow until the paused one has 300 kB.
    let start = Instant::now();
    while a.len() < 300_000 && start.elapsed() < Duration::from_secs(20) {
        turn(&mut c, &mut seen, &mut [(paused, 16 << 10, &mut a), (active, 16 << 10, &mut b)]);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(a.len() >= 300_000, "the paused download flowed first: {} B", a.len());
    // The pause: the active download goes on to its end, the paused one is read no more.
    let start = Instant::now();
    let mut pinged = Instant::now();
    let mut during = None;
    while start.elapsed() < pause {
        turn(&mut c, &mut seen, &mut [(active, 64 << 10, &mut b)]);
        if pinged.elapsed() > Duration::from_secs(1) {
            let _ = c.conn.send_ack_eliciting();
            pinged = Instant::now();
        }
        let h = server.counters().http;
        if h.parked >= 1 && seen.finished.contains(&active) {
            during.get_or_insert(h);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = during.expect("the paused response was parked and the active one finished during the pause");
    assert_eq!(during.open_files, 0, "the parked response gave its file back: {during:?}");
    assert_eq!((b.len(), digest(&b)), (want.len(), digest(&want)), "the active download, whole");
    // The client reads again: the rest of the paused download, byte-exact.
    let start = Instant::now();
    while !seen.finished.contains(&paused) && seen.reset.is_empty() && start.elapsed() < Duration::from_secs(30) {
        turn(&mut c, &mut seen, &mut [(paused, 64 << 10, &mut a)]);
        std::thread::sleep(Duration::from_millis(1));
    }
    let h = server.counters().http;
    println!("pause of {pause:?} (stall {stall:?}): {} B; resets {:?}; {h:?}", a.len(), seen.reset);
    assert!(seen.reset.is_empty(), "no stream was reset: {:?}", seen.reset);
    assert_eq!((a.len(), digest(&a)), (want.len(), digest(&want)), "the paused download resumed byte-exact");
    assert!(!c.conn.is_closed(), "the connection goes on");
    assert_eq!((h.parked, h.resumed, h.resume_refused, h.stalled, h.idle_closed), (1, 1, 0, 0, 0), "{h:?}");
    c.conn.close(true, 0x100, b"").unwrap();
    c.pump();
    server.stop().unwrap();
}

/// The case as a browser meets it: a video request paused for 61 s under the default
/// stall timeout (20 s) resumes byte-exact, its sibling untouched.
#[test]
fn a_video_paused_for_a_minute_resumes_byte_exact_beside_an_active_stream() {
    pause_and_resume(udpx_h3::DEFAULT_STALL_TIMEOUT, Duration::from_secs(61));
}

/// The same mechanism under a 1 s stall timeout, paused 4 s.
#[test]
fn a_paused_stream_resumes_byte_exact_beside_an_active_stream() {
    pause_and_resume(Duration::from_secs(1), Duration::from_secs(4));
}

/// A file replaced (by rename, as operators publish) while a response to it is parked: the
/// response does not join the new bytes to the old ones; when the client reads again its
/// stream is reset (H3_INTERNAL_ERROR, counted `resume_refused`), the connection goes on and
/// serves the new file.
#[test]
fn a_parked_response_whose_file_changed_is_reset_not_joined() {
    let site = Site::new("paused-changed");
    let server = start(&site, |c| c.stall_timeout = Duration::from_secs(1));
    let mut c = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(64 << 10)).with_h3();
    let sid = c.request("/big", true).expect("request");
    let mut seen = Seen::default();
    let mut a = Vec::new();
    let start = Instant::now();
    while a.len() < 100_000 && start.elapsed() < Duration::from_secs(20) {
        turn(&mut c, &mut seen, &mut [(sid, 16 << 10, &mut a)]);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(idle_until(&mut c, &mut seen, Duration::from_secs(10), |_, _| server.counters().http.parked == 1));
    // Published by rename: a new inode under the same name.
    let tmp = site.root.join(".big.new");
    std::fs::write(&tmp, common::content(common::BIG, 9)).unwrap();
    std::fs::rename(&tmp, site.root.join("big")).unwrap();
    let start = Instant::now();
    while seen.reset.is_empty() && !seen.finished.contains(&sid) && start.elapsed() < Duration::from_secs(20) {
        turn(&mut c, &mut seen, &mut [(sid, 64 << 10, &mut a)]);
        std::thread::sleep(Duration::from_millis(1));
    }
    let h = server.counters().http;
    println!("changed: {} B before the reset; resets {:?}; {h:?}", a.len(), seen.reset);
    assert_eq!(seen.reset, vec![(sid, 0x102)], "the stream was reset, not continued from another file");
    assert!(!seen.finished.contains(&sid));
    assert_eq!((h.resumed, h.resume_refused), (0, 1), "{h:?}");
    assert_eq!(h.open_files, 0, "{h:?}");
    // The connection goes on: the new file, whole.
    let next = c.request("/big", true).expect("a new request on the same connection");
    let mut b = Vec::new();
    let start = Instant::now();
    while !seen.finished.contains(&next) && start.elapsed() < Duration::from_secs(30) {
        turn(&mut c, &mut seen, &mut [(next, 64 << 10, &mut b)]);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(digest(&b), digest(&common::content(common::BIG, 9)), "the new file, whole");
    c.conn.close(true, 0x100, b"").unwrap();
    c.pump();
    server.stop().unwrap();
}
