//! Bad input: datagrams that are not QUIC, cut, or an Initial too short, sent straight at the
//! server's port: each dropped and counted, and the server keeps serving. Then the refusals
//! at start: a missing directory or certificate, a port in use.

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::{digest, start, Site, TempDir};
use udpx_h3::{get, serve, GetConfig, ServeConfig, Tls};
use udpx_quic::IoMode;

/// A real first Initial from a quiche client towards `server`.
fn real_initial(server: std::net::SocketAddr, local: std::net::SocketAddr) -> Vec<u8> {
    let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    cfg.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).unwrap();
    cfg.verify_peer(false);
    let scid = [7u8; 16];
    let mut conn = quiche::connect(None, &quiche::ConnectionId::from_ref(&scid), local, server, &mut cfg).unwrap();
    let mut out = vec![0u8; 1500];
    let (n, _) = conn.send(&mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn garbage_cut_and_short_initials_are_dropped_and_counted() {
    let site = Site::new("bad");
    let server = start(&site, IoMode::GsoMmsg, 1);
    let addr = server.local_addr();
    let port = addr.port();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let initial = real_initial(addr, s.local_addr().unwrap());
    assert!(initial.len() >= 1200, "quiche pads a client Initial to 1200");
    let mut corrupt = initial.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff; // breaks the AEAD tag: does not decrypt
    let mut vn_probe = initial.clone();
    vn_probe[1..5].copy_from_slice(&0x1a2a_3a4au32.to_be_bytes()); // an unknown version
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("one byte", vec![0x40]),
        ("long header cut after the version", vec![0xc0, 0, 0, 0, 1]),
        ("DCID length 30", [&[0xc0u8, 0, 0, 0, 1, 30][..], &[1; 60][..]].concat()),
        ("short header, unknown DCID", common::content(200, 9).iter().map(|b| b & 0x7f | 0x40).collect()),
        ("Initial cut to 600 bytes", initial[..600].to_vec()),
        ("Initial cut to 1199 bytes", initial[..1199].to_vec()),
        ("Initial that does not decrypt", corrupt),
        ("Initial of an unknown version", vn_probe),
        ("random", common::content(1300, 11)),
    ];
    for (what, d) in &cases {
        s.send_to(d, addr).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // The unknown version is answered with a version negotiation packet (version 0).
    let mut buf = [0u8; 1500];
    let (n, _) = s.recv_from(&mut buf).expect("a version negotiation packet");
    assert!(n >= 7 && buf[0] & 0x80 != 0 && buf[1..5] == [0, 0, 0, 0], "not a version negotiation packet");
    // The server still serves.
    let out = TempDir::new("bad-out");
    let dst = out.path().join("small");
    let r = get(&format!("https://127.0.0.1:{port}/small"), Some(&dst), &GetConfig::default()).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(digest(&std::fs::read(&dst).unwrap()), digest(&site.file("small")));
    let c = server.stop().unwrap().quic;
    eprintln!("{}", serde_json::to_string(&c).unwrap());
    assert_eq!(c.connections, 1, "only the real client made a connection");
    // Empty, one byte, cut long header, DCID length 30 are unparseable; the unknown DCID is
    // an unknown connection; the random datagram is either, by its first byte.
    assert!(c.dropped_unparseable >= 4, "{}", c.dropped_unparseable);
    assert!(c.dropped_unknown_cid >= 1, "{}", c.dropped_unknown_cid);
    // (At least: a late packet of the real client, after its connection was gone, would be
    // an unknown connection too.)
    assert!(c.dropped_unparseable + c.dropped_unknown_cid >= 6);
    assert_eq!(c.dropped_bad_initial, 2, "Initials under 1200 bytes");
    assert_eq!(c.dropped_by_quic, 1, "the Initial that does not decrypt");
    assert_eq!(c.version_negotiations, 1);
    assert!(c.dropped() >= cases.len() as u64 - 1, "every case but the version probe dropped");
}

#[test]
fn traversal_attempts_are_refused_and_serving_goes_on() {
    let site = Site::new("traverse");
    let server = start(&site, IoMode::Gso, 1);
    let port = server.local_addr().port();
    let out = TempDir::new("traverse-out");
    let dst = out.path().join("x");
    let cfg = GetConfig::default();
    for path in
        ["/../secret", "/%2e%2e/secret", "/sub/..%2f..%2fsecret", "/escape", "/sub%2F..%2F..%2Fsecret", "/./../secret"]
    {
        let r = get(&format!("https://127.0.0.1:{port}{path}"), Some(&dst), &cfg).unwrap();
        assert!(r.status == 403 || r.status == 404, "{path}: {}", r.status);
        assert_eq!(r.bytes, 0, "{path}: a body was sent");
        let r = get(&format!("https://127.0.0.1:{port}/small"), Some(&dst), &cfg).unwrap();
        assert_eq!(r.status, 200, "serving goes on after {path}");
    }
    let c = server.stop().unwrap();
    assert_eq!(c.http.ok, 6);
}

#[test]
fn refusals_at_start() {
    let site = Site::new("refuse");
    let cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    let e = serve(&site.root.join("nope"), &cfg).unwrap_err();
    assert!(e.is_usage() && e.to_string().contains("nope"), "{e}");
    let e = serve(&site.root.join("small"), &cfg).unwrap_err();
    assert!(e.is_usage() && e.to_string().contains("not a directory"), "{e}");
    let mut c2 = cfg.clone();
    c2.tls = Tls::Files { cert: site.root.join("missing.pem"), key: site.root.join("small") };
    let e = serve(&site.root, &c2).unwrap_err();
    assert!(e.is_usage() && e.to_string().contains("certificate file") && e.to_string().contains("missing.pem"), "{e}");
    c2.tls = Tls::Files { cert: site.root.join("small"), key: site.root.join("small") };
    let e = serve(&site.root, &c2).unwrap_err();
    assert!(e.is_usage() && e.to_string().contains("not a PEM certificate"), "{e}");
    // A port in use: by another server of ours (reuseport) and by a plain socket.
    let first = start(&site, IoMode::GsoMmsg, 1);
    let mut c3 = cfg.clone();
    c3.quic.listen = first.local_addr();
    let e = serve(&site.root, &c3).unwrap_err();
    assert!(e.is_usage() && e.to_string().contains("in use"), "{e}");
    drop(first);
    let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
    c3.quic.listen = plain.local_addr().unwrap();
    let e = serve(&site.root, &c3).unwrap_err();
    assert!(e.is_usage() && e.to_string().contains("in use"), "{e}");
}

#[test]
fn get_from_a_port_nobody_listens_on_fails_fast() {
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let t = std::time::Instant::now();
    let e = get(&format!("https://127.0.0.1:{port}/x"), None, &GetConfig::default()).unwrap_err();
    assert!(e.to_string().contains("nothing listens there"), "{e}");
    assert!(!e.is_usage());
    assert!(t.elapsed() < Duration::from_secs(5), "waited {:?} (the idle timeout?)", t.elapsed());
}
