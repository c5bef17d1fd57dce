//! A QUIC and HTTP/3 stack this project did not write (quinn with hyperium's `h3` and
//! `h3-quinn`), running on udpx's datapath through `udpx-tokio`, downloads from `udpx h3
//! serve`'s server byte for byte: both backends, a whole file and a range.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use udpx_h3::{serve, ServeConfig, Tls};
use udpx_tokio::quinn;
use udpx_tokio::quinn::rustls;
use udpx_tokio::{tokio, Backend};

const LEN: usize = 3_000_001;

struct Tmp(std::path::PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GETs `path` (with `range`, if any) over h3-quinn on a udpx socket: status and body.
async fn fetch(addr: SocketAddr, cert: &[u8], backend: Backend, path: &str, range: Option<&str>) -> (u16, Vec<u8>) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(cert.to_vec())).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let qc = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (mut ep, socket) = udpx_tokio::endpoint(local, backend, quinn::EndpointConfig::default(), None).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(qc)));
    let conn = ep.connect(addr, "localhost").unwrap().await.expect("handshake with udpx h3 serve");
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn)).await.unwrap();
    let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let mut req = http::Request::get(format!("https://localhost:{}{path}", addr.port()));
    if let Some(r) = range {
        req = req.header("range", r);
    }
    let mut stream = send.send_request(req.body(()).unwrap()).await.unwrap();
    stream.finish().await.unwrap();
    let resp = stream.recv_response().await.unwrap();
    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        while chunk.has_remaining() {
            let c = chunk.chunk();
            body.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    drop(send);
    drive.abort();
    ep.close(0u32.into(), b"done");
    assert_eq!(socket.stats().send_errors, 0, "{:?}", socket.stats());
    (resp.status().as_u16(), body)
}

#[test]
fn h3_quinn_on_udpx_downloads_from_udpx_h3_serve() {
    let dir = Tmp(std::env::temp_dir().join(format!("udpx-h3-quinn-{}", std::process::id())));
    std::fs::create_dir_all(dir.0.join("www")).unwrap();
    let content = udpx_lab::pattern(LEN, 5);
    std::fs::write(dir.0.join("www/file"), &content).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.0.join("cert.pem"), ck.cert.pem()).unwrap();
    std::fs::write(dir.0.join("key.pem"), ck.key_pair.serialize_pem()).unwrap();
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = Tls::Files { cert: dir.0.join("cert.pem"), key: dir.0.join("key.pem") };
    cfg.quic.shards = 1;
    let server = serve(&dir.0.join("www"), &cfg).unwrap();
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for backend in [Backend::Syscall, Backend::IoUring] {
        let cert = ck.cert.der().to_vec();
        let (status, body) = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), fetch(addr, &cert, backend, "/file", None)).await.unwrap()
        });
        assert_eq!((status, body.len()), (200, LEN), "{backend:?}");
        assert!(body == content, "{backend:?}: the body differs");
        let (status, body) = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), fetch(addr, &cert, backend, "/file", Some("bytes=-1000")))
                .await
                .unwrap()
        });
        assert_eq!(status, 206, "{backend:?}");
        assert!(body == content[LEN - 1000..], "{backend:?}: the range differs");
    }
    let c = server.stop().unwrap();
    assert_eq!((c.http.ok, c.http.partial), (2, 2), "{:?}", c.http);
}
