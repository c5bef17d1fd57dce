//! TLS over TCP for the HTTPS-over-TCP listener's tests: a connection offering one protocol
//! by ALPN, trusting one certificate.

use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

/// A TLS connection to `addr` offering only `alpn`, trusting the certificate `cert` (for the
/// name 127.0.0.1).
pub async fn connect(cert: &Path, addr: std::net::SocketAddr, alpn: &[u8]) -> TlsStream<tokio::net::TcpStream> {
    connect_from(cert, addr, alpn, None).await
}

/// [`connect`] from the local address `from` (another loopback address: another peer).
pub async fn connect_from(
    cert: &Path,
    addr: std::net::SocketAddr,
    alpn: &[u8],
    from: Option<std::net::IpAddr>,
) -> TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_file(cert).unwrap()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(ip) = from {
        sock.bind(std::net::SocketAddr::new(ip, 0)).unwrap();
    }
    let tcp = sock.connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap()
}

/// A plain TCP connection to `addr` (no TLS: for what the listener does before any).
pub async fn connect_raw(addr: std::net::SocketAddr, from: std::net::IpAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(std::net::SocketAddr::new(from, 0)).unwrap();
    sock.connect(addr).await.unwrap()
}

/// A TLS connection to `addr` offering only HTTP/2.
pub async fn h2_tls(cert: &Path, addr: std::net::SocketAddr) -> TlsStream<tokio::net::TcpStream> {
    connect(cert, addr, b"h2").await
}

/// One HTTP/1.1 keep-alive GET of `path` on `tls`: the status and the body (by its
/// Content-Length).
pub async fn http1_get(tls: &mut TlsStream<tokio::net::TcpStream>, path: &str) -> (u16, Vec<u8>) {
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tls.read(&mut buf).await.unwrap();
        assert!(n > 0, "the connection closed before the response's head");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let len: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())).unwrap_or(0);
    let mut body = got.split_off(head_end);
    while body.len() < len {
        let n = tls.read(&mut buf).await.unwrap();
        assert!(n > 0, "the connection closed inside the body");
        body.extend_from_slice(&buf[..n]);
    }
    (status, body)
}
