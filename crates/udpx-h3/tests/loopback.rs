//! `udpx_h3::get` against `udpx_h3::serve` over loopback: every I/O mode, every file size,
//! byte for byte; status codes; many at once.

mod common;

use common::{digest, start, Site, TempDir, BIG};
use udpx_h3::{get, GetConfig};
use udpx_quic::IoMode;

fn fetch(url: &str, io: IoMode, out: &std::path::Path) -> udpx_h3::GetReport {
    let cfg = GetConfig { io, ..GetConfig::default() };
    get(url, Some(out), &cfg).unwrap_or_else(|e| panic!("GET {url} ({io}): {e}"))
}

#[test]
fn every_io_mode_every_size_byte_for_byte() {
    let site = Site::new("modes");
    let out = TempDir::new("modes-out");
    for io in IoMode::ALL {
        let server = start(&site, io, 1);
        let port = server.local_addr().port();
        for name in ["empty", "small", "big"] {
            let dst = out.path().join(format!("{name}-{io}"));
            let r = fetch(&format!("https://127.0.0.1:{port}/{name}"), io, &dst);
            let want = site.file(name);
            assert_eq!(r.status, 200, "{name} {io}");
            assert_eq!(r.bytes as usize, want.len(), "{name} {io}");
            assert_eq!(digest(&std::fs::read(&dst).unwrap()), digest(&want), "{name} {io}: content differs");
            eprintln!("{io} {name}: {r}");
        }
        let c = server.stop().unwrap();
        eprintln!("{io}: {}", serde_json::to_string(&c).unwrap());
        assert_eq!(c.http.ok, 3);
        assert!(c.quic.bytes_sent > BIG as u64);
        // Each body read once, in large blocks whatever the stream took per turn (issue 47):
        // `big` in 256 KiB reads and one for its tail, `small` in one. (One read per turn's
        // stream capacity, at most 64 KiB, made it 150 reads or more.)
        let body: usize = ["empty", "small", "big"].iter().map(|n| site.file(n).len()).sum();
        assert_eq!(c.http.file_bytes_read, body as u64, "{io}: one pass of the read");
        let most = BIG.div_ceil(udpx_h3::server::BLOCK) + 2;
        assert!(c.http.file_reads as usize <= most, "{io}: {} reads, at most {most}", c.http.file_reads);
        // Buffers made, not reused: at least the first, never more than one a read.
        let made = c.http.read_buffers_made;
        assert!(made >= 1 && made <= c.http.file_reads, "{io}: {made} buffers made for {} reads", c.http.file_reads);
        assert!(c.quic.connections >= 3);
        match io {
            IoMode::Sendmsg => {
                assert!((c.quic.packets_per_call - 1.0).abs() < 1e-9, "{io}: {}", c.quic.packets_per_call)
            }
            _ => assert!(c.quic.packets_per_call > 1.0, "{io}: {} packets per call", c.quic.packets_per_call),
        }
        if matches!(io, IoMode::Gso | IoMode::GsoMmsg) {
            assert!(c.quic.gso_runs > 0, "{io}: no GSO run");
        } else {
            assert_eq!(c.quic.gso_runs, 0, "{io}: GSO in a plain mode");
        }
    }
}

#[test]
fn status_codes_head_and_traversal() {
    let site = Site::new("status");
    let server = start(&site, IoMode::GsoMmsg, 2);
    let port = server.local_addr().port();
    let out = TempDir::new("status-out");
    let dst = out.path().join("x");
    let url = |p: &str| format!("https://127.0.0.1:{port}{p}");
    for (path, want) in [
        ("/sub/inner", 200),
        ("/missing", 404),
        ("/sub", 404),
        ("/../secret", 403),
        ("/sub/%2e%2e/%2e%2e/secret", 403),
        ("/sub%2finner", 403),
        ("/escape", 403),
        ("/small", 200),
    ] {
        let r = fetch(&url(path), IoMode::GsoMmsg, &dst);
        assert_eq!(r.status, want, "{path}");
    }
    let c = server.stop().unwrap();
    assert_eq!((c.http.ok, c.http.not_found, c.http.forbidden), (2, 2, 4));
}

#[test]
fn fifty_concurrent_downloads() {
    let site = Site::new("fifty");
    let server = start(&site, IoMode::GsoMmsg, 2);
    let port = server.local_addr().port();
    let out = TempDir::new("fifty-out");
    let want = digest(&site.file("sub/inner"));
    let small = digest(&site.file("small"));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let dst = out.path().join(format!("d{i}"));
                s.spawn(move || {
                    let name = if i % 2 == 0 { "sub/inner" } else { "small" };
                    let r = fetch(&format!("https://127.0.0.1:{port}/{name}"), IoMode::GsoMmsg, &dst);
                    (i, r.status, digest(&std::fs::read(&dst).unwrap()))
                })
            })
            .collect();
        for h in handles {
            let (i, status, d) = h.join().expect("download thread");
            assert_eq!(status, 200);
            assert_eq!(d, if i % 2 == 0 { want } else { small }, "download {i}");
        }
    });
    let c = server.stop().unwrap();
    assert_eq!(c.http.ok, 50);
    assert_eq!(c.quic.connections, 50);
    assert_eq!(c.quic.dropped_unknown_cid, 0, "a packet reached a shard without its connection");
}

#[test]
fn ipv6_loopback() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        udpx_lab::netns::record_skip("ipv6_loopback", "no IPv6 loopback (::1) on this machine");
        return;
    }
    let site = Site::new("v6");
    let mut cfg = udpx_h3::ServeConfig::new("[::1]:0".parse().unwrap());
    cfg.quic.io = IoMode::GsoMmsg;
    let server = udpx_h3::serve(&site.root, &cfg).unwrap();
    let port = server.local_addr().port();
    let out = TempDir::new("v6-out");
    let dst = out.path().join("big");
    let r = fetch(&format!("https://[::1]:{port}/big"), IoMode::Gso, &dst);
    assert_eq!(r.status, 200);
    assert_eq!(digest(&std::fs::read(&dst).unwrap()), digest(&site.file("big")));
    server.stop().unwrap();
}

/// A rate-limited fetch (`GetConfig::limit_rate`, a small window) still gets the whole body,
/// byte for byte, also when the server closes the connection while part of the body is still
/// unread in the client (the server's stop after its last acknowledged response).
#[test]
fn a_rate_limited_fetch_gets_the_whole_body() {
    let site = Site::new("rate");
    let server = start(&site, IoMode::GsoMmsg, 1);
    let tmp = TempDir::new("rate-out");
    let out = tmp.path().join("big");
    let cfg = GetConfig { limit_rate: Some(40 << 20), ..GetConfig::default() };
    let url = format!("https://{}/big", server.local_addr());
    let r = get(&url, Some(&out), &cfg).expect("fetch");
    assert_eq!((r.status, r.bytes), (200, BIG as u64), "{r:?}");
    assert_eq!(digest(&std::fs::read(&out).unwrap()), digest(&site.file("big")));
    // The drain closes the connection once the response is acknowledged, with the rest of the
    // body still in the client: it is read before the connection goes.
    let url2 = url.clone();
    let slow = std::thread::spawn(move || {
        let cfg = GetConfig { limit_rate: Some(4 << 20), ..GetConfig::default() };
        get(&url2, None, &cfg)
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    server.drain(std::time::Duration::from_secs(60));
    let r = slow.join().unwrap().expect("fetch across the drain");
    assert_eq!((r.status, r.bytes), (200, BIG as u64), "{r:?}");
}

/// A server on a site of its own whose access log is `access.log` in the returned directory.
fn logging_server(name: &str) -> (Site, TempDir, udpx_h3::H3Server) {
    let site = Site::new(name);
    let log = TempDir::new(&format!("{name}-log"));
    let mut cfg = udpx_h3::ServeConfig::new("127.0.0.1:0".parse().unwrap());
    let access_log = Some(log.path().join("access.log"));
    cfg.site = udpx_h3::SiteOptions { access_log, ..udpx_h3::SiteOptions::default() };
    let server = udpx_h3::serve(&site.root, &cfg).unwrap();
    (site, log, server)
}

/// Issue 48: every connection has its line in the access log when it closes: who closed it,
/// its requests, RTT, packets, congestion controller and bytes each way.
#[test]
fn every_connection_has_its_close_line() {
    let (_site, log, server) = logging_server("closeline");
    let path = log.path().join("access.log");
    let port = server.local_addr().port();
    let out = TempDir::new("closeline-out");
    for name in ["small", "big", "nope"] {
        let _ = get(&format!("https://127.0.0.1:{port}/{name}"), Some(&out.path().join(name)), &GetConfig::default())
            .unwrap();
    }
    // The client closes each connection; the server's line is written when quiche has drained
    // it (three times its probe timeout, a few milliseconds here).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.counters().quic.closed < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.flush_log().unwrap();
    let c = server.stop().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(" CONNECTION h3 ")).collect();
    eprintln!("{}", lines.join("\n"));
    assert_eq!(lines.len() as u64, c.quic.connections, "one line a connection: {text}");
    assert_eq!(lines.len(), 3);
    for l in &lines {
        for field in
            ["closed_by=client", "requests=1", "rtt=", "min_rtt=", "sent=", "lost=", "cc=bbr2", "cwnd=", "bytes_sent="]
        {
            assert!(l.contains(field), "{field} in {l}");
        }
        assert!(l.contains(" error=app:0x100 "), "the client's H3_NO_ERROR: {l}");
    }
    let big =
        lines.iter().map(|l| l.split("bytes_sent=").nth(1).unwrap().split(' ').next().unwrap().parse::<u64>().unwrap());
    assert!(big.max().unwrap() > BIG as u64, "the big download's connection sent it all");
}

/// A handshake quiche refuses after the first datagram (here no protocol in common, in a
/// ClientHello spread over two Initials) is closed by the server, and its close line names
/// quiche's error, which the wire code (TLS's alert, 0x178) does not.
#[test]
fn a_close_line_names_what_quiche_refused() {
    let (_site, log, server) = logging_server("cause");
    let path = log.path().join("access.log");
    let addr = server.local_addr();
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_millis(50))).unwrap();
    let mut qc = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    // Eight 200-byte protocol names, none of them h3: the ClientHello outgrows one Initial.
    let names: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 200]).collect();
    qc.set_application_protos(&names.iter().map(Vec::as_slice).collect::<Vec<_>>()).unwrap();
    qc.verify_peer(false);
    let mut conn =
        quiche::connect(None, &quiche::ConnectionId::from_ref(&[9u8; 16]), s.local_addr().unwrap(), addr, &mut qc)
            .unwrap();
    let (mut out, mut buf) = ([0u8; 1500], [0u8; 1500]);
    let mut datagrams = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !conn.is_closed() && std::time::Instant::now() < deadline {
        while let Ok((n, info)) = conn.send(&mut out) {
            s.send_to(&out[..n], info.to).unwrap();
            datagrams += 1;
        }
        match s.recv_from(&mut buf) {
            Ok((n, from)) => {
                let _ = conn.recv(&mut buf[..n], quiche::RecvInfo { from, to: s.local_addr().unwrap() });
            }
            Err(_) => conn.on_timeout(),
        }
    }
    assert!(datagrams >= 2, "the ClientHello took {datagrams} datagram(s): the test needs two");
    let wire = conn.peer_error().map(|e| e.error_code);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.counters().quic.closed < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.flush_log().unwrap();
    server.stop().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    eprintln!("the client saw {wire:?}\n{text}");
    let line = text.lines().find(|l| l.contains(" CONNECTION h3 ")).expect("a close line");
    assert!(line.contains("closed_by=server"), "{line}");
    assert!(line.contains(" cause=\"TlsFail\""), "quiche's error named: {line}");
}
