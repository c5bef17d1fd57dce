//! quinn endpoints on udpx: a server sends 10 MB + 1 byte on one stream and the client gets
//! it intact, with both ends on udpx (each backend), and with a stock quinn (quinn-udp) peer on
//! either side.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use udpx_tokio::{endpoint, Backend};

const LEN: usize = 10_000_001;

fn content() -> Vec<u8> {
    udpx_lab::pattern(LEN, 1)
}

struct Certs {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

fn certs() -> Certs {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    Certs { cert: ck.cert.der().clone(), key: ck.key_pair.serialize_der() }
}

fn server_config(c: &Certs) -> quinn::ServerConfig {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(c.key.clone()));
    quinn::ServerConfig::with_single_cert(vec![c.cert.clone()], key).unwrap()
}

fn client_config(c: &Certs) -> quinn::ClientConfig {
    let mut roots = quinn::rustls::RootCertStore::empty();
    roots.add(c.cert.clone()).unwrap();
    quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Side {
    Udpx(Backend),
    Stock,
}

fn make(side: Side, server: Option<quinn::ServerConfig>) -> (quinn::Endpoint, Option<Arc<udpx_tokio::UdpxSocket>>) {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    match side {
        Side::Udpx(b) => {
            let (ep, s) = endpoint(addr, b, quinn::EndpointConfig::default(), server).unwrap();
            (ep, Some(s))
        }
        Side::Stock => match server {
            Some(cfg) => (quinn::Endpoint::server(cfg, addr).unwrap(), None),
            None => (quinn::Endpoint::client(addr).unwrap(), None),
        },
    }
}

/// The server (on `server_side`) sends the content on one uni stream to the client (on
/// `client_side`); returns the bytes the client read. With `refuse_gso` (a udpx server) the
/// server's socket refuses every GSO send from the handshake on (`SO_NO_CHECK`: the kernel
/// answers EINVAL to a segmented send without checksums).
async fn transfer(server_side: Side, client_side: Side, refuse_gso: bool) -> Vec<u8> {
    let c = certs();
    let data = Arc::new(content());
    let (server, ssock) = make(server_side, Some(server_config(&c)));
    let addr = server.local_addr().unwrap();
    let data2 = data.clone();
    let ssock2 = ssock.clone();
    let serve = tokio::spawn(async move {
        let conn = server.accept().await.expect("a connection").await.expect("handshake");
        if refuse_gso {
            ssock2.as_ref().expect("a udpx server").udpx().set_no_check(true).unwrap();
        }
        let mut s = conn.open_uni().await.unwrap();
        s.write_all(&data2).await.unwrap();
        s.finish().unwrap();
        // Until the client has read it all and closed.
        let _ = conn.closed().await;
        server.wait_idle().await;
        (ssock, conn.stats().path.lost_packets)
    });
    let (mut client, csock) = make(client_side, None);
    client.set_default_client_config(client_config(&c));
    let conn = client.connect(addr, "localhost").unwrap().await.expect("client handshake");
    let mut r = conn.accept_uni().await.unwrap();
    let got = r.read_to_end(LEN + 1).await.unwrap();
    conn.close(0u32.into(), b"done");
    client.wait_idle().await;
    let (ssock, lost) = tokio::time::timeout(Duration::from_secs(20), serve).await.expect("server ends").unwrap();
    eprintln!("server lost packets (quinn's path stats): {lost}");
    if refuse_gso {
        let c = ssock.as_ref().unwrap().udpx().counters();
        assert!(c.gso_fallbacks >= 1, "the refusal happened and was answered by plain re-sends: {c:?}");
    }
    for (who, s) in [("server", ssock), ("client", csock)] {
        if let Some(s) = s {
            let st = s.stats();
            eprintln!("{who} on udpx ({}): {st:?}; {:?}", s.backend_note(), s.udpx().counters());
            assert_eq!(st.send_errors, 0, "{who}: {st:?}");
        }
    }
    got
}

async fn check(server: Side, client: Side) {
    check_with(server, client, false).await;
}

async fn check_with(server: Side, client: Side, refuse_gso: bool) {
    let got =
        tokio::time::timeout(Duration::from_secs(60), transfer(server, client, refuse_gso)).await.expect("within 60 s");
    assert!(got == content(), "{server:?} -> {client:?}: {} bytes, content differs", got.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ends_on_udpx_system_calls() {
    check(Side::Udpx(Backend::Syscall), Side::Udpx(Backend::Syscall)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ends_on_udpx_io_uring() {
    check(Side::Udpx(Backend::IoUring), Side::Udpx(Backend::IoUring)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udpx_server_stock_client() {
    check(Side::Udpx(Backend::Syscall), Side::Stock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_server_udpx_client() {
    check(Side::Stock, Side::Udpx(Backend::Syscall)).await;
}

/// GSO refused mid-transfer: udpx re-sends each refused batch plain before `try_send` returns,
/// so quinn loses no packet to it and no transmit fails (quinn-udp turns GSO off and drops the
/// refused transmit: see the README).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gso_refusal_costs_quinn_no_packet() {
    check_with(Side::Udpx(Backend::Syscall), Side::Udpx(Backend::Syscall), true).await;
}
