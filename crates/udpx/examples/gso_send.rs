//! A GSO sender: numbered datagrams coalesced by [`Batch`] into GSO buffers (one stack traversal
//! for up to 64 or 128 of them) and sent with `sendmmsg`, in bursts with a pause between them.
//! Run the receiver first (`gro_recv`), then:
//!
//! ```text
//! cargo run -p udpx --example gso_send -- --to 127.0.0.1:7000 --count 1000 --size 1200
//! ```
//!
//! It prints what it sent and whether GSO carried it; when not, why (this kernel has no
//! `UDP_SEGMENT`, or the path refused it and udpx re-sent the datagrams plain). `--refuse-gso`
//! sets `SO_NO_CHECK`, with which the kernel refuses every GSO send: the fallback at work.
//! Datagram `seq` starts with `seq` (4 bytes, big-endian); every later byte is `seq % 251`.
//! Exit codes: 0 sent, 1 a failure, 2 a bad argument.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use udpx::{Batch, SegmentLimits, SendMode, UdpSocket};

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    let max = udpx::max_payload(&args.to);
    if !(4..=max).contains(&args.size) {
        let why = format!("--size must be 4 to {max} (the largest datagram to {}): {}", args.to, args.size);
        Args::command().error(clap::error::ErrorKind::ValueValidation, why).exit();
    }
    let bind: SocketAddr = if args.to.is_ipv6() { "[::]:0".parse()? } else { "0.0.0.0:0".parse()? };
    let tx = UdpSocket::builder(bind).send_mode(SendMode::GsoSendmmsg).bind()?;
    if args.refuse_gso {
        tx.set_no_check(true)?;
    }
    let mut batch = Batch::for_socket(&tx);
    let mut datagram = vec![0u8; args.size];
    let mut seq = 0u32;
    while seq < args.count {
        // Planned afresh per burst: a refusal may have turned GSO off for this destination.
        batch.clear();
        batch.set_limits(SegmentLimits::for_socket(&tx));
        let end = seq.saturating_add(args.burst).min(args.count);
        for s in seq..end {
            fill(&mut datagram, s);
            batch.push(args.to, &datagram)?;
        }
        // Blocking: continues short sends, backs off on ENOBUFS, re-sends plain what the path
        // refused as GSO. Nothing is dropped on the way.
        tx.send(&batch.transmits())?;
        seq = end;
        std::thread::sleep(Duration::from_millis(args.gap_ms));
    }
    let c = tx.counters();
    println!(
        "sent {} datagrams of {} B to {} in {} send calls ({:.1} datagrams per call), {} GSO buffers",
        c.datagrams_sent,
        args.size,
        args.to,
        c.send_calls,
        c.datagrams_per_send_call(),
        c.gso_buffers_sent
    );
    let caps = tx.capabilities();
    match (c.gso_buffers_sent, caps.kernel.gso_max_segments) {
        (_, None) => println!("gso: not used: this kernel has no UDP_SEGMENT (Linux 4.18); sent plain"),
        (0, Some(_)) if c.gso_fallbacks > 0 => println!(
            "gso: not used: the path refused it ({}); every datagram re-sent plain",
            caps.gso_off_reason.as_deref().unwrap_or("no reason recorded")
        ),
        (0, Some(_)) => println!("gso: not used: no burst had two datagrams of one size (give --burst 2 or more)"),
        (n, Some(max)) => println!("gso: used, {n} buffers of at most {max} segments"),
    }
    if c.gso_fallbacks > 0 && c.gso_buffers_sent > 0 {
        println!("gso: refused {} times, the refused buffers re-sent plain", c.gso_fallbacks);
    }
    Ok(())
}

/// Datagram `seq`: its number, then `seq % 251` repeated (what `gro_recv` checks).
fn fill(d: &mut [u8], seq: u32) {
    d.fill((seq % 251) as u8);
    let n = d.len().min(4);
    d[..n].copy_from_slice(&seq.to_be_bytes()[..n]);
}

/// A GSO sender: numbered datagrams in GSO buffers, in bursts.
#[derive(Parser)]
#[command(name = "gso_send")]
struct Args {
    /// Where to send: the address `gro_recv` printed.
    #[arg(long, value_name = "ADDR")]
    to: SocketAddr,
    /// Datagrams to send.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    count: u32,
    /// Bytes per datagram: 4 to the largest datagram of the address family.
    #[arg(long, value_name = "BYTES", default_value_t = 1200)]
    size: usize,
    /// Datagrams per burst (one `sendmmsg`).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    burst: u32,
    /// Pause between bursts.
    #[arg(long, value_name = "MS", default_value_t = 1)]
    gap_ms: u64,
    /// Set `SO_NO_CHECK`, with which the kernel refuses every GSO send (the fallback at work).
    #[arg(long)]
    refuse_gso: bool,
}
