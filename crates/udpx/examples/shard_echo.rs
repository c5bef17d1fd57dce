//! A batched echo server on a reuseport shard group: one thread per socket, each taking up to
//! 64 requests per `recvmmsg` and answering all of them with one `sendmmsg`.
//!
//! ```text
//! cargo run -p udpx --example shard_echo -- --listen 127.0.0.1:7000 --shards 2 --steering cpu
//! ```
//!
//! `--steering cpu` gives each datagram to the socket of the CPU that received it, `hash` leaves
//! it to the kernel's flow hash. Stops after `--count` requests (0: no limit) or `--seconds`.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use clap::Parser;
use udpx::{RecvBuffers, Shard, ShardGroup, SocketConfig, Steering, Transmit};

/// A batched echo server on a reuseport shard group.
#[derive(Parser)]
struct Args {
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[arg(long, value_name = "N", default_value_t = 2)]
    shards: usize,
    /// cpu: the socket of the CPU that received the datagram; hash: the kernel's flow hash.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "hash"])]
    steering: String,
    /// Stop after this many requests (0: no limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    count: u64,
    #[arg(long, value_name = "S", default_value_t = 60)]
    seconds: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args { listen, shards, steering, count, seconds } = Args::parse();
    let steering = if steering == "cpu" { Steering::Cpu } else { Steering::Hash };
    let group = ShardGroup::bind(SocketConfig::new(listen), shards, steering)?;
    println!("listening on {} with {} shards, steering by {}", group.local_addr(), group.len(), group.steering());
    let served = &AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    std::thread::scope(|s| {
        for shard in group.shards() {
            s.spawn(move || serve(shard, served, count, deadline));
        }
    });
    println!("served {} requests", served.load(Relaxed));
    Ok(())
}

/// One shard's loop: receive a batch, echo it in one call, until the count or the deadline.
fn serve(shard: Shard, served: &AtomicU64, count: u64, deadline: Instant) {
    // Wakes every 50 ms to look at the count and the clock.
    shard.set_read_timeout(Some(Duration::from_millis(50))).expect("SO_RCVTIMEO");
    let mut bufs = RecvBuffers::for_socket(&shard, 64);
    while (count == 0 || served.load(Relaxed) < count) && Instant::now() < deadline {
        match shard.recv_into(&mut bufs) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return eprintln!("shard {}: receive: {e}", shard.index()),
        }
        // Each request goes back to its sender, all in one sendmmsg (GRO is off: a message is
        // one datagram). A reply to a vanished client costs nothing: its ICMP error is read
        // and counted, never returned.
        let replies: Vec<Transmit<'_>> = bufs.messages().map(|(m, d)| Transmit::new(m.addr, d)).collect();
        if let Err(e) = shard.send(&replies) {
            eprintln!("shard {}: reply: {e}", shard.index());
        }
        served.fetch_add(replies.len() as u64, Relaxed);
    }
    let c = shard.counters();
    println!(
        "shard {}: {} requests in {} receive calls, {} replies in {} send calls",
        shard.index(),
        c.datagrams_received,
        c.recv_calls,
        c.datagrams_sent,
        c.send_calls
    );
}
