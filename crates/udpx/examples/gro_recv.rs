//! A GRO receiver: `UDP_GRO` lets the kernel hand a train of datagrams of one flow over as one
//! buffer; `recvmmsg` takes up to 16 such buffers per call, and [`RecvBuffers::datagrams`]
//! splits them again. It checks every datagram `gso_send` numbered and stops when it has
//! `--count` of them, or after `--timeout-ms` with nothing arriving.
//!
//! ```text
//! cargo run -p udpx --example gro_recv -- --listen 127.0.0.1:7000 --count 1000
//! ```
//!
//! It prints `listening on ADDR` first, then what arrived, how many buffers GRO coalesced and,
//! when it coalesced none, why; and the datagrams the kernel dropped on the socket (a full
//! receive buffer), read with `SO_MEMINFO`. Exit codes: 0 every datagram arrived, intact; 1
//! some are missing or damaged; 2 a bad argument.

use std::error::Error;
use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use udpx::{RecvBuffers, UdpSocket, Want};

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    // A receive buffer for a burst of GRO buffers: 4 MiB asked, capped by net.core.rmem_max
    // unless privileged (the effective size is printed).
    let rx = UdpSocket::builder(args.listen).gro(Want::IfAvailable).recv_buffer(4 << 20).bind()?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))?;
    let caps = rx.capabilities();
    println!("listening on {} (receive buffer {} B)", rx.local_addr(), caps.recv_buffer);
    std::io::stdout().flush()?;

    let mut bufs = RecvBuffers::for_socket(&rx, 16);
    let mut seen = vec![false; args.count as usize];
    let (mut got, mut duplicates, mut damaged, mut most_per_buffer) = (0u32, 0u32, 0u32, 0usize);
    let mut last = Instant::now();
    let timeout = Duration::from_millis(args.timeout_ms);
    while got < args.count && last.elapsed() < timeout {
        match rx.recv_into(&mut bufs) {
            Ok(_) => last = Instant::now(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(format!("receive on {}: {e}", rx.local_addr()).into()),
        }
        for (meta, _) in bufs.messages() {
            most_per_buffer = most_per_buffer.max(meta.segment_count());
        }
        for (_, d) in bufs.datagrams() {
            match check(d) {
                Some(seq) if (seq as usize) < seen.len() => {
                    if std::mem::replace(&mut seen[seq as usize], true) {
                        duplicates += 1;
                    } else {
                        got += 1;
                    }
                }
                _ => damaged += 1,
            }
        }
    }

    let c = rx.counters();
    println!(
        "received {got} of {} datagrams ({damaged} damaged, {duplicates} duplicates) in {} messages, \
         {} of them GRO buffers (up to {most_per_buffer} datagrams each), {} receive calls",
        args.count, c.messages_received, c.gro_buffers_received, c.recv_calls
    );
    if !caps.gro {
        println!("gro: not used: this kernel has no UDP_GRO (Linux 5.0); one datagram per buffer");
    } else if c.gro_buffers_received == 0 {
        println!("gro: on, but no buffer held more than one datagram (the sender sent no GSO buffers, or the path split them)");
    } else {
        println!("gro: used, {} coalesced buffers", c.gro_buffers_received);
    }
    println!("kernel drops: {}", rx.kernel_drops()?);
    if got < args.count || damaged > 0 {
        eprintln!("gro_recv: {} datagrams missing, {damaged} damaged", args.count - got);
        std::process::exit(1);
    }
    Ok(())
}

/// The sequence number of an intact datagram of `gso_send` (its number, then `seq % 251`).
fn check(d: &[u8]) -> Option<u32> {
    let seq = u32::from_be_bytes(d.get(..4)?.try_into().ok()?);
    d[4..].iter().all(|&b| b == (seq % 251) as u8).then_some(seq)
}

/// A GRO receiver: checks every datagram `gso_send` numbered.
#[derive(Parser)]
struct Args {
    /// The address to receive on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Datagrams to wait for.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    count: u32,
    /// Stop after this long with nothing arriving.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    timeout_ms: u64,
}
