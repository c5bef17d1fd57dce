//! Pacing through the host: with quiche's BBRv2 pacer and its rate capped, quiche releases
//! packets by returning `Done` until the next release time and arming its timer for it; the
//! host serves that timer at nanosecond resolution (ppoll) and the transfer completes byte for
//! byte with nothing lost. quiche's `SendInfo.at` ran at most ~50 us ahead of now in these
//! runs, inside the host's slack (`PACING_SLACK`, 500 us), so the hold path (`paced_holds`)
//! is counted but not forced here. No timing is asserted.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;

use udpx_quic::{client_socket, App, Host, HostSocket, IoMode, Pacing, Server, ServerConfig};

const BODY: usize = 600_000;

mod common;

use common::{Sender, TempCert};

/// The tests' config, paced by quiche's BBRv2 at most `pacing_rate` when given.
fn quiche_config(pem: Option<(&str, &str)>, pacing_rate: Option<u64>) -> quiche::Config {
    let mut c = common::quiche_config(pem, true);
    if let Some(r) = pacing_rate {
        // quiche stamps departure times ahead of now only with its BBRv2 (gcongestion)
        // recovery; CUBIC's `SendInfo.at` is always now.
        c.set_cc_algorithm(quiche::CongestionControlAlgorithm::Bbr2Gcongestion);
        c.set_max_pacing_rate(r);
    }
    c
}

/// Client: sends a request, reads the body to its FIN, closes.
#[derive(Default)]
struct Getter {
    got: usize,
    done: bool,
}

impl App for Getter {
    type State = bool;
    fn accepted(&mut self, _: &udpx_quic::Connection) -> bool {
        false
    }
    fn on_turn(&mut self, conn: &mut udpx_quic::Connection, asked: &mut bool) {
        if !std::mem::replace(asked, true) {
            conn.stream_send(0, b"GET", true).unwrap();
        }
        let mut buf = [0u8; 64 * 1024];
        while let Ok((n, fin)) = conn.stream_recv(0, &mut buf) {
            assert!(buf[..n].iter().all(|&b| b == 0x42));
            self.got += n;
            if fin {
                self.done = true;
                let _ = conn.close(true, 0, b"done");
            }
        }
    }
    fn closed(&mut self, _: &udpx_quic::Connection, _: bool) {}
}

#[test]
fn held_packets_leave_at_their_time_and_nothing_is_lost() {
    let cert = TempCert::new("pacing");
    let pem = cert.pem();

    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    // 3 MB/s: packets of ~1400 bytes every ~470 us.
    let server = Server::start(&cfg, vec![quiche_config(Some(pem), Some(3_000_000))], |_| Sender(BODY)).unwrap();
    let addr: SocketAddr = server.local_addr();
    let socket = client_socket(addr, IoMode::GsoMmsg, true).unwrap();
    let mut client = Host::new(
        HostSocket::Own(Box::new(socket)),
        quiche_config(None, None),
        Getter::default(),
        udpx_quic::Role::Client,
    );
    assert_eq!(client.pacing(), Pacing::Hold);
    client.connect(Some("localhost"), addr, false).unwrap();
    client.run(&AtomicBool::new(false), udpx_quic::Until::Idle, None).unwrap();
    let c = server.stop().unwrap();
    assert!(client.app().done, "the body's FIN arrived");
    assert_eq!(client.app().got, BODY);
    assert_eq!(c.send_errors, 0, "{c:?}");
    assert_eq!(c.lost_packets, 0, "paced, nothing overflows on loopback: {c:?}");
    assert!(c.packets_sent > BODY as u64 / 1500, "{c:?}");
}
