//! A UDP echo on tokio over the udpx datapath ([`UdpxSocket`]): the server awaits batches of
//! datagrams (a GRO buffer whole) and answers each batch with one `send` (a `sendmsg` per
//! message: a GRO buffer goes back as one GSO buffer of the same segment size); the client
//! sends numbered requests of one size in rounds of 10, coalesced by [`udpx::Batch`] into
//! one GSO buffer, and checks every reply.
//!
//! ```text
//! cargo run -p udpx-tokio --example tokio_echo -- --listen 127.0.0.1:7000 --count 100
//! cargo run -p udpx-tokio --example tokio_echo -- --connect 127.0.0.1:7000 --count 100
//! ```
//!
//! The server prints `listening on ADDR` and stops after `--count` requests (0: never) or
//! `--seconds`; the client waits at most 5 s for each round's replies. Both print their
//! socket's counters: how many datagrams went per system call, how many arrived coalesced.
//! `--backend io-uring` sends and receives through io_uring where the kernel allows (the
//! socket says which path it took). Exit codes: 0 done, 1 a failure (a reply missing or
//! wrong), 2 a bad argument.

mod common;

use std::error::Error;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use udpx::{Batch, RecvMeta, Transmit, GRO_BUFFER};
use udpx_tokio::UdpxSocket;

/// Receive buffers per call; each holds a GRO buffer.
const BATCH: usize = 8;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    match args.connect {
        None => serve(&args).await,
        Some(server) => client(&args, server).await,
    }
}

async fn serve(args: &Args) -> Result<(), Box<dyn Error>> {
    let socket = UdpxSocket::bind(args.socket.listen, args.socket.backend)?;
    println!("listening on {} ({})", socket.udpx().local_addr(), socket.backend_note());
    let mut bufs = vec![vec![0u8; GRO_BUFFER]; BATCH];
    let mut meta = [RecvMeta::default(); BATCH];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.seconds);
    let mut served = 0u64;
    while args.count == 0 || served < args.count {
        let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let n = match tokio::time::timeout_at(deadline, socket.recv(&mut slices, &mut meta)).await {
            Ok(n) => n?,
            Err(_) => break,
        };
        // One reply transmit per message: a GRO buffer of several requests goes back as one
        // GSO buffer of the same segment size.
        let replies: Vec<Transmit<'_>> = meta[..n]
            .iter()
            .zip(&bufs)
            .map(|(m, b)| match m.segment_count() {
                1 => Transmit::new(m.addr, &b[..m.len]),
                _ => Transmit::new(m.addr, &b[..m.len]).segmented(m.stride),
            })
            .collect();
        socket.send(&replies).await?;
        served += meta[..n].iter().map(|m| m.segment_count() as u64).sum::<u64>();
    }
    let c = socket.udpx().counters();
    println!(
        "served {served} requests: {} datagrams in {} receive calls ({} GRO buffers), {} sent in {} send calls",
        c.datagrams_received, c.recv_calls, c.gro_buffers_received, c.datagrams_sent, c.send_calls
    );
    Ok(())
}

async fn client(args: &Args, server: SocketAddr) -> Result<(), Box<dyn Error>> {
    let socket = UdpxSocket::bind(common::client_addr(server), args.socket.backend)?;
    println!("client on {} ({})", socket.udpx().local_addr(), socket.backend_note());
    let mut bufs = vec![vec![0u8; GRO_BUFFER]; BATCH];
    let mut meta = [RecvMeta::default(); BATCH];
    let start = Instant::now();
    let mut echoed = 0u64;
    let mut seq = 0u64;
    let mut batch = Batch::for_socket(socket.udpx());
    while seq < args.count {
        // Requests of one size (the number zero-padded): one GSO buffer per round.
        let round: Vec<Vec<u8>> =
            (seq..(seq + 10).min(args.count)).map(|i| format!("request {i:010}").into_bytes()).collect();
        seq += round.len() as u64;
        batch.clear();
        for r in &round {
            batch.push(server, r)?;
        }
        socket.send(&batch.transmits()).await?;
        let mut replies: Vec<Vec<u8>> = Vec::new();
        while replies.len() < round.len() {
            let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let n = match tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut slices, &mut meta)).await {
                Ok(n) => n?,
                Err(_) => return Err(format!("{} of {} replies within 5 s", replies.len(), round.len()).into()),
            };
            for (m, b) in meta[..n].iter().zip(&bufs) {
                replies.extend(m.segments(b).map(<[u8]>::to_vec));
            }
        }
        replies.sort();
        let mut want = round.clone();
        want.sort();
        if replies != want {
            return Err(format!("replies differ from the requests: sent {want:?}, got {replies:?}").into());
        }
        echoed += replies.len() as u64;
    }
    let c = socket.udpx().counters();
    println!(
        "{echoed} of {} requests echoed intact in {:.1} ms: {} datagrams in {} send calls ({} GSO buffers), \
         {} received in {} receive calls ({} GRO buffers)",
        args.count,
        start.elapsed().as_secs_f64() * 1e3,
        c.datagrams_sent,
        c.send_calls,
        c.gso_buffers_sent,
        c.datagrams_received,
        c.recv_calls,
        c.gro_buffers_received
    );
    Ok(())
}

/// A UDP echo server on tokio over the udpx datapath, or its client (`--connect`).
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    socket: common::SocketArgs,
    /// Be the client of the server there (the address it printed).
    #[arg(long, value_name = "ADDR")]
    connect: Option<SocketAddr>,
    /// Requests to serve (0: no limit) or to send.
    #[arg(long, value_name = "N", default_value_t = 100)]
    count: u64,
    /// The server stops after this long.
    #[arg(long, value_name = "S", default_value_t = 60)]
    seconds: u64,
}
