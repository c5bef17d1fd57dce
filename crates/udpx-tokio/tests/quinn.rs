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

/// What goes wrong on the udpx server's socket after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trouble {
    None,
    /// Every GSO send refused (`SO_NO_CHECK`: the kernel answers EINVAL to a segmented send
    /// without checksums).
    RefuseGso,
    /// One GSO send refused (EIO) and its plain re-send stopped by a full socket (EAGAIN)
    /// after two datagrams (the test-only fault seam).
    CutResend,
}

#[derive(Clone, Copy, Debug)]
enum Side {
    Udpx(Backend),
    Stock,
}

/// An endpoint's socket, for the test to reach: udpx's, or (a stock quinn endpoint on
/// quinn-udp) a second handle on the same kernel socket, for setting options on it.
#[derive(Clone)]
enum Handle {
    Udpx(Arc<udpx_tokio::UdpxSocket>),
    Stock(Arc<udpx::UdpSocket>),
}

impl Handle {
    fn udpx(&self) -> Option<&Arc<udpx_tokio::UdpxSocket>> {
        match self {
            Handle::Udpx(s) => Some(s),
            Handle::Stock(_) => None,
        }
    }

    fn kernel_socket(&self) -> &udpx::UdpSocket {
        match self {
            Handle::Udpx(s) => s.udpx(),
            Handle::Stock(s) => s,
        }
    }
}

fn make(side: Side, server: Option<quinn::ServerConfig>) -> (quinn::Endpoint, Handle) {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    match side {
        Side::Udpx(b) => {
            let (ep, s) = endpoint(addr, b, quinn::EndpointConfig::default(), server).unwrap();
            (ep, Handle::Udpx(s))
        }
        Side::Stock => {
            // quinn-udp gets its own descriptor (a dup) of a socket the test keeps a handle on;
            // the handle does no I/O, it only sets SO_NO_CHECK when a test asks.
            let keep = udpx::UdpSocket::builder(addr).bind().unwrap();
            let std = std::net::UdpSocket::from(std::os::fd::AsFd::as_fd(&keep).try_clone_to_owned().unwrap());
            let runtime = Arc::new(quinn::TokioRuntime);
            let ep = quinn::Endpoint::new(quinn::EndpointConfig::default(), server, std, runtime).unwrap();
            (ep, Handle::Stock(Arc::new(keep)))
        }
    }
}

/// The server (on `server_side`) sends the content on one uni stream to the client (on
/// `client_side`); returns the bytes the client read. `trouble` (a udpx server) is made on the
/// server's socket once the handshake is done.
async fn transfer(server_side: Side, client_side: Side, trouble: Trouble) -> Vec<u8> {
    let c = certs();
    let data = Arc::new(content());
    let (server, ssock) = make(server_side, Some(server_config(&c)));
    let addr = server.local_addr().unwrap();
    let data2 = data.clone();
    let ssock2 = ssock.clone();
    let serve = tokio::spawn(async move {
        let conn = server.accept().await.expect("a connection").await.expect("handshake");
        match trouble {
            Trouble::None => {}
            Trouble::RefuseGso => ssock2.kernel_socket().set_no_check(true).unwrap(),
            Trouble::CutResend => inject_cut_resend(ssock2.udpx().expect("a udpx server")),
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
    match (trouble, &ssock) {
        (Trouble::RefuseGso, Handle::Udpx(s)) => {
            let c = s.udpx().counters();
            assert!(c.gso_fallbacks >= 1, "the refusal happened and was answered by plain re-sends: {c:?}");
            assert_eq!(lost, 0, "every refused batch re-sent plain: quinn lost nothing to it");
        }
        (Trouble::RefuseGso, Handle::Stock(_)) => {
            // quinn-udp logs the refused transmit and reports it sent: its packets are gone,
            // and quinn's loss recovery finds them lost.
            assert!(lost >= 1, "quinn-udp dropped the refused GSO transmit (lost {lost})");
        }
        _ => {}
    }
    if trouble == Trouble::CutResend {
        let s = ssock.udpx().unwrap();
        let (st, c) = (s.stats(), s.udpx().counters());
        // The EAGAIN stopped the re-send after two datagrams: the rest was queued, and quinn
        // lost nothing (each datagram left once).
        assert_eq!((st.remainders_queued, c.would_block), (1, 1), "{st:?} {c:?}");
        assert_eq!(lost, 0, "nothing dropped or doubled");
    }
    for (who, s) in [("server", ssock), ("client", csock)] {
        if let Handle::Udpx(s) = s {
            let st = s.stats();
            eprintln!("{who} on udpx ({}): {st:?}; {:?}", s.backend_note(), s.udpx().counters());
            assert_eq!(st.send_errors, 0, "{who}: {st:?}");
        }
    }
    got
}

async fn check(server: Side, client: Side) {
    check_with(server, client, Trouble::None).await;
}

async fn check_with(server: Side, client: Side, trouble: Trouble) {
    let got =
        tokio::time::timeout(Duration::from_secs(60), transfer(server, client, trouble)).await.expect("within 60 s");
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

/// Both endpoints on one current-thread runtime: each socket's receive ring is that thread's
/// (`SINGLE_ISSUER | DEFER_TASKRUN`).
#[tokio::test]
async fn both_ends_on_udpx_io_uring_one_thread() {
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
/// so quinn loses no packet to it and no transmit fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gso_refusal_costs_quinn_no_packet() {
    check_with(Side::Udpx(Backend::Syscall), Side::Udpx(Backend::Syscall), Trouble::RefuseGso).await;
}

/// The same refusal on stock quinn-udp, for the record: it turns GSO off and drops the refused
/// transmit (reported sent), which quinn then finds lost; the transfer still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_quinn_udp_a_gso_refusal_drops_a_transmit() {
    check_with(Side::Stock, Side::Stock, Trouble::RefuseGso).await;
}

#[cfg(feature = "fault-injection")]
fn inject_cut_resend(s: &udpx_tokio::UdpxSocket) {
    use udpx::Fault;
    // The next GSO call fails with EIO; its plain re-send (one sendmsg per datagram) passes
    // two calls (a Short fault changes nothing on a plain sendmsg) and then meets EAGAIN.
    for f in [Fault::ErrnoOnGso(libc::EIO), Fault::Short(64), Fault::Short(64), Fault::Errno(libc::EAGAIN)] {
        s.udpx().inject_fault(f);
    }
}

#[cfg(not(feature = "fault-injection"))]
fn inject_cut_resend(_: &udpx_tokio::UdpxSocket) {
    unreachable!("the cut re-send test needs the fault-injection feature");
}

/// A GSO refusal whose plain re-send stops part-way: the datagrams that left are not sent
/// again (quinn is told the transmit went) and the rest is queued and sent, not dropped.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_resend_is_neither_repeated_nor_dropped() {
    check_with(Side::Udpx(Backend::Syscall), Side::Udpx(Backend::Syscall), Trouble::CutResend).await;
}

/// ECN: the codepoint quinn sets on its packets is on the wire (a udpx receiver reads it from
/// IP_TOS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quinn_ecn_marks_are_on_the_wire() {
    let rx = udpx::UdpSocket::builder("127.0.0.1:0".parse().unwrap()).ecn(udpx::Want::Required).bind().unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let target = rx.local_addr();
    let (mut client, _s) = make(Side::Udpx(Backend::Syscall), None);
    client.set_default_client_config(client_config(&certs()));
    // Nobody answers: the client's Initials are all the test needs.
    let _connecting = client.connect(target, "localhost").unwrap();
    let got = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; 65536];
        let mut bufs = [std::io::IoSliceMut::new(&mut buf)];
        let mut meta = [udpx::RecvMeta::default()];
        let n = rx.recv(&mut bufs, &mut meta).expect("an Initial");
        (n, meta[0])
    })
    .await
    .unwrap();
    assert_eq!(got.0, 1);
    assert_eq!(
        got.1.ecn,
        Some(udpx::EcnCodepoint::Ect0),
        "quinn marks ECT(0) and udpx puts it on the wire: {:?}",
        got.1
    );
    client.close(0u32.into(), b"");
}

/// A client that goes away mid-transfer (its port closed: the server's next packets draw ICMP
/// port unreachable) must not stop a server endpoint whose payloads are 1200 bytes: the next
/// client gets its whole download.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_icmp_error_and_small_payloads_leave_the_endpoint_serving() {
    let c = certs();
    let data = Arc::new(content());
    let mut ecfg = quinn::EndpointConfig::default();
    ecfg.max_udp_payload_size(1200).unwrap();
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (server, ssock) = endpoint(addr, Backend::Syscall, ecfg, Some(server_config(&c))).unwrap();
    let saddr = server.local_addr().unwrap();
    let srv = server.clone();
    let accept = tokio::spawn(async move {
        while let Some(incoming) = srv.accept().await {
            let data = data.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok(mut s) = conn.open_uni().await else { return };
                let _ = s.write_all(&data).await;
                let _ = s.finish();
                let _ = conn.closed().await;
            });
        }
    });
    // The first client reads a little, then vanishes without a word: its runtime is shut down
    // before its drivers can send a close, then its socket is closed.
    let cc = client_config(&c);
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let kept = rt.block_on(async move {
            let (mut gone, s) = make(Side::Udpx(Backend::Syscall), None);
            gone.set_default_client_config(cc);
            let conn = gone.connect(saddr, "localhost").unwrap().await.unwrap();
            let mut r = conn.accept_uni().await.unwrap();
            let mut buf = vec![0u8; 100_000];
            r.read_exact(&mut buf).await.unwrap();
            (gone, conn, r, s)
        });
        rt.shutdown_background();
        drop(kept);
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The next one is served in full.
    let (mut next, _s) = make(Side::Udpx(Backend::Syscall), None);
    next.set_default_client_config(client_config(&c));
    let conn = tokio::time::timeout(Duration::from_secs(10), async {
        next.connect(saddr, "localhost").unwrap().await.expect("the endpoint still accepts")
    })
    .await
    .unwrap();
    let mut r = conn.accept_uni().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), r.read_to_end(LEN + 1)).await.unwrap().unwrap();
    assert!(got == content(), "the second download differs");
    conn.close(0u32.into(), b"done");
    let c = ssock.udpx().counters();
    eprintln!("server: {:?}; {c:?}", ssock.stats());
    assert!(c.icmp_errors >= 1, "the vanished client's port answered with ICMP: {c:?}");
    assert!(c.datagrams_sent > 0 && ssock.stats().send_errors == 0);
    accept.abort();
    server.close(0u32.into(), b"");
}
