//! GREASE is off by default (`ServeConfig::grease`, `--grease`): the server opens HTTP/3's
//! three unidirectional streams (control, QPACK encoder and decoder) and no fourth of a
//! reserved type; with it on, the fourth is there. A raw quiche client (no HTTP/3 layer)
//! counts the server's unidirectional streams.

mod common;

use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::Site;
use udpx_h3::{serve, ServeConfig};

/// The IDs of the server-initiated unidirectional streams a client sees within a second of
/// the handshake (stream ID's two low bits 0b11).
fn server_uni_streams(grease: bool) -> BTreeSet<u64> {
    let site = Site::new(if grease { "grease-on" } else { "grease-off" });
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.grease = grease;
    let server = serve(&site.root, &cfg).expect("server starts");
    let to = server.local_addr();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let local = s.local_addr().unwrap();
    let mut qc = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    qc.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).unwrap();
    qc.verify_peer(false);
    qc.set_initial_max_streams_uni(100);
    qc.set_initial_max_stream_data_uni(1 << 20);
    qc.set_initial_max_data(1 << 20);
    qc.grease(false);
    let scid = [5u8; 16];
    let mut conn = quiche::connect(None, &quiche::ConnectionId::from_ref(&scid), local, to, &mut qc).unwrap();
    let (mut out, mut buf) = (vec![0u8; 1500], vec![0u8; 65_536]);
    let mut seen = BTreeSet::new();
    let mut settled: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && settled.is_none_or(|t| t.elapsed() < Duration::from_secs(1)) {
        while let Ok((n, info)) = conn.send(&mut out) {
            s.send_to(&out[..n], info.to).unwrap();
        }
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = conn.recv(&mut buf[..n], quiche::RecvInfo { from, to: local });
        }
        conn.on_timeout();
        for id in conn.readable() {
            if id & 0b11 == 0b11 {
                seen.insert(id);
            }
            while let Ok((_, true | false)) = conn.stream_recv(id, &mut buf) {}
        }
        if conn.is_established() && settled.is_none() {
            settled = Some(Instant::now());
        }
    }
    assert!(conn.is_established(), "the handshake completed");
    server.stop().unwrap();
    seen
}

#[test]
fn the_server_greases_only_when_asked() {
    let off = server_uni_streams(false);
    assert_eq!(off, BTreeSet::from([3, 7, 11]), "control, QPACK encoder and decoder only");
    let on = server_uni_streams(true);
    assert_eq!(on.len(), 4, "the three and a GREASE stream: {on:?}");
    assert!(on.is_superset(&off), "{on:?}");
}
