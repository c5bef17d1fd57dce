//! A quinn endpoint on the udpx datapath ([`udpx_tokio::endpoint`]): the server echoes what a
//! client sends on a bidirectional stream; the client sends `--bytes`, reads them back and
//! checks them. The server makes a self-signed certificate for `localhost` and writes it (DER)
//! where `--cert-out` says, for the client's `--cert`; both ends print their socket's path and
//! counters.
//!
//! ```text
//! cargo run -p udpx-tokio --example quinn_endpoint -- --role server --listen 127.0.0.1:4433 --cert-out /tmp/cert.der
//! cargo run -p udpx-tokio --example quinn_endpoint -- --role client --connect 127.0.0.1:4433 --cert /tmp/cert.der
//! cargo run -p udpx-tokio --example quinn_endpoint      # both, in one process, over loopback
//! ```
//!
//! The server stops after `--connections` connections (0: never), everything after
//! `--seconds`. `--backend io-uring` puts the endpoint's socket on io_uring where the kernel
//! allows. Exit codes: 0 done, 1 a failure (handshake, a stream, the echo differs, the time
//! limit), 2 a bad argument.

mod common;

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use quinn::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use udpx_tokio::{endpoint, quinn, UdpxSocket};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The most one stream may bring to the server: the echo holds it in memory.
const MAX_ECHO: usize = 64 << 20;

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let limit = Duration::from_secs(args.seconds);
    match tokio::time::timeout(limit, run(&args)).await {
        Ok(done) => done,
        Err(_) => Err(format!("not done within {limit:?}").into()),
    }
}

async fn run(args: &Args) -> Result<()> {
    match args.role {
        Role::Server => {
            let (server, cert) = server(args)?;
            if let Some(path) = &args.cert_out {
                std::fs::write(path, &cert).map_err(|e| format!("write the certificate to {}: {e}", path.display()))?;
            }
            println!("listening on {} ({})", server.0.local_addr()?, server.1.backend_note());
            serve(server, args.connections).await
        }
        Role::Client => {
            let to = args.connect.ok_or("a client needs --connect ADDR (the server's)")?;
            let path = args.cert.as_ref().ok_or("a client needs --cert FILE (what the server's --cert-out wrote)")?;
            let cert = std::fs::read(path).map_err(|e| format!("read the certificate {}: {e}", path.display()))?;
            client(args, to, CertificateDer::from(cert)).await
        }
        Role::Both => {
            let (server, cert) = server(args)?;
            let to = server.0.local_addr()?;
            println!("listening on {to} ({})", server.1.backend_note());
            let served = tokio::spawn(async move { serve(server, 1).await.map_err(|e| e.to_string()) });
            client(args, to, cert).await?;
            Ok(served.await?.map_err(|e| format!("server: {e}"))?)
        }
    }
}

/// The server endpoint and its certificate (self-signed, for `localhost`).
fn server(args: &Args) -> Result<((quinn::Endpoint, Arc<UdpxSocket>), CertificateDer<'static>)> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let cert = ck.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()));
    let config = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key)?;
    Ok((endpoint(args.socket.listen, args.socket.backend, quinn::EndpointConfig::default(), Some(config))?, cert))
}

/// Accepts `connections` connections (0: no limit), one at a time; on each, echoes every
/// bidirectional stream (up to [`MAX_ECHO`] bytes) until the client closes.
async fn serve((ep, socket): (quinn::Endpoint, Arc<UdpxSocket>), connections: u64) -> Result<()> {
    let (mut served, mut echoed) = (0u64, 0u64);
    while connections == 0 || served < connections {
        let Some(incoming) = ep.accept().await else { break };
        let conn = incoming.await?;
        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
            let data = recv.read_to_end(MAX_ECHO).await?;
            send.write_all(&data).await?;
            send.finish()?;
            echoed += data.len() as u64;
        }
        served += 1;
    }
    ep.wait_idle().await;
    println!("served {served} connection(s), echoed {echoed} bytes; {}", counters(&socket));
    Ok(())
}

async fn client(args: &Args, to: SocketAddr, cert: CertificateDer<'static>) -> Result<()> {
    let local = common::client_addr(to);
    let (mut ep, socket) = endpoint(local, args.socket.backend, quinn::EndpointConfig::default(), None)?;
    let mut roots = quinn::rustls::RootCertStore::empty();
    roots.add(cert)?;
    ep.set_default_client_config(quinn::ClientConfig::with_root_certificates(Arc::new(roots))?);
    let start = Instant::now();
    let conn = ep.connect(to, "localhost")?.await?;
    let data: Vec<u8> = (0..args.bytes).map(|i| (i % 251) as u8).collect();
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(&data).await?;
    send.finish()?;
    let back = recv.read_to_end(data.len() + 1).await?;
    conn.close(0u32.into(), b"done");
    ep.wait_idle().await;
    if back != data {
        return Err(format!("sent {} bytes, got {} back, and they differ", data.len(), back.len()).into());
    }
    println!(
        "{} bytes echoed intact in {:.1} ms ({}); {}",
        data.len(),
        start.elapsed().as_secs_f64() * 1e3,
        socket.backend_note(),
        counters(&socket)
    );
    Ok(())
}

/// A socket's datapath counters in one line.
fn counters(socket: &UdpxSocket) -> String {
    let c = socket.udpx().counters();
    format!(
        "{} datagrams sent in {} calls ({} GSO buffers), {} received ({} GRO buffers)",
        c.datagrams_sent, c.send_calls, c.gso_buffers_sent, c.datagrams_received, c.gro_buffers_received
    )
}

/// A quinn endpoint on the udpx datapath: an echo server, its client, or both in one process.
#[derive(Parser)]
struct Args {
    /// Which end(s) to run.
    #[arg(long, value_enum, default_value_t = Role::Both)]
    role: Role,
    #[command(flatten)]
    socket: common::SocketArgs,
    /// The server a client connects to (the address it printed).
    #[arg(long, value_name = "ADDR", required_if_eq("role", "client"))]
    connect: Option<SocketAddr>,
    /// Where the server writes its certificate (DER), for the client's `--cert`.
    #[arg(long, value_name = "FILE")]
    cert_out: Option<PathBuf>,
    /// The certificate a client trusts: what the server's `--cert-out` wrote.
    #[arg(long, value_name = "FILE", required_if_eq("role", "client"))]
    cert: Option<PathBuf>,
    /// Bytes the client sends and reads back.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    bytes: usize,
    /// The server stops after this many connections (0: never).
    #[arg(long, value_name = "N", default_value_t = 1)]
    connections: u64,
    /// Everything stops after this long.
    #[arg(long, value_name = "S", default_value_t = 30)]
    seconds: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Role {
    /// A server and its client in one process, over loopback.
    Both,
    /// An echo server (it writes its certificate where `--cert-out` says).
    Server,
    /// A client of the server at `--connect`, trusting the certificate `--cert`.
    Client,
}
