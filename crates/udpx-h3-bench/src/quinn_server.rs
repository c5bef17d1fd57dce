//! A second HTTP/3 file server, not ours: quinn with hyperium's `h3` and `h3-quinn`, on quinn's
//! own UDP datapath (quinn-udp), as a QUIC peer in `udpx bench h3`'s table (`udpx h3
//! quinn-serve`). It answers GET for the files under a directory (200 with the whole file,
//! 404, 403, 405) and nothing more: enough for a video player's segments, so that "no costlier
//! than the best other QUIC server" is judged in the same run as "at TCP's cost". Paths
//! follow the file server's rules ([`udpx_h3::files::open`]: nothing outside the directory, no
//! symlink out of it, no FIFO or device).
//!
//! One current-thread tokio runtime (one core, like `udpx h3 serve --shards 1` and nginx with
//! one worker), a task per connection and per request; bodies read in [`udpx_h3::http::CHUNK`]
//! pieces.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use udpx_tokio::quinn;
use udpx_tokio::tokio;

use udpx_h3::files::{OpenError, Opened, Root};
use udpx_h3::Error;

/// Serves the files under `dir` on `listen` until `stop` is set (checked every 50 ms).
pub fn serve(dir: &Path, listen: SocketAddr, cert: &Path, key: &Path, stop: &AtomicBool) -> Result<(), Error> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::Usage(format!("certificate {}: {e}", cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| Error::Usage(format!("key {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Error::Usage(format!("certificate and key: {e}")))?;
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| Error::Tls(e.to_string()))?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(udpx_h3::tls::MAX_STREAMS.try_into().unwrap_or(100u32.into()));
    transport.max_idle_timeout(Some(
        Duration::from_millis(udpx_h3::tls::IDLE_TIMEOUT_MS)
            .try_into()
            .map_err(|_| Error::Usage("idle timeout".into()))?,
    ));
    sc.transport_config(Arc::new(transport));
    let root = Root::open(dir).map_err(|e| Error::Usage(format!("{}: {e}", dir.display())))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Io)?;
    let dir: Arc<Root> = Arc::new(root);
    rt.block_on(async {
        let ep = quinn::Endpoint::server(sc, listen).map_err(Error::Io)?;
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let incoming = tokio::select! {
                i = ep.accept() => i,
                _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
            };
            let Some(incoming) = incoming else { break };
            let dir = dir.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok(mut h3c) = h3::server::Connection::new(h3_quinn::Connection::new(conn)).await else { return };
                while let Ok(Some(resolver)) = h3c.accept().await {
                    let dir = dir.clone();
                    tokio::spawn(async move {
                        if let Ok((req, stream)) = resolver.resolve_request().await {
                            let _ = answer(&dir, req, stream).await;
                        }
                    });
                }
            });
        }
        ep.close(0u32.into(), b"stopping");
        Ok(())
    })
}

/// One request: the file under `dir` named by the path, whole, or 404 / 403 / 405.
async fn answer<S>(
    dir: &Root,
    req: http::Request<()>,
    mut stream: h3::server::RequestStream<S, bytes::Bytes>,
) -> Result<(), h3::error::StreamError>
where
    S: h3::quic::BidiStream<bytes::Bytes>,
{
    let status_only = |code: u16| http::Response::builder().status(code).body(()).expect("a valid response");
    if req.method() != http::Method::GET {
        stream.send_response(status_only(405)).await?;
        return stream.finish().await;
    }
    // The file server's rules: under `dir` only, no symlink out, regular files only.
    let (mut file, len) = match udpx_h3::files::open(dir, req.uri().path()) {
        Ok(Opened::File { file, meta, .. }) => (file, meta.len()),
        Ok(Opened::AddSlash) => {
            stream.send_response(status_only(404)).await?;
            return stream.finish().await;
        }
        Err(OpenError::Refused(r)) => {
            stream.send_response(status_only(r.status())).await?;
            return stream.finish().await;
        }
        Err(OpenError::Io(_)) => {
            stream.send_response(status_only(503)).await?;
            return stream.finish().await;
        }
    };
    let resp = http::Response::builder()
        .status(200)
        .header("content-length", len)
        .header("content-type", "application/octet-stream")
        .body(())
        .expect("a valid response");
    stream.send_response(resp).await?;
    let mut left = len;
    while left > 0 {
        let n = left.min(udpx_h3::http::CHUNK as u64) as usize;
        let mut buf = vec![0u8; n];
        if std::io::Read::read_exact(&mut file, &mut buf).is_err() {
            break;
        }
        left -= n as u64;
        stream.send_data(bytes::Bytes::from(buf)).await?;
    }
    stream.finish().await
}
