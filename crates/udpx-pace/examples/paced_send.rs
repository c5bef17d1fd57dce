//! A paced sender: `udpx-pace` decides when each flow's datagrams leave, a real clock drives it
//! (`CLOCK_MONOTONIC`, the clock of `udpx::Timestamp`), and udpx sends them: at each wake every
//! flow due goes out, each flow's batch as one GSO buffer, all of them in one `sendmmsg`.
//!
//! ```text
//! cargo run -p udpx-pace --example paced_send -- --flows 4 --rate 1200000 --seconds 2
//! ```
//!
//! `--rate` is per flow, in bytes per second of UDP payload. Without `--to` it sends to a
//! receiver of its own on loopback and counts what arrives there. It prints what it sent over
//! the time it measured, the rate that makes, and how late the departures were (the timer's
//! lateness plus up to one 250 us slot). Exit codes: 0 sent, 1 a failure, 2 a bad argument.

use std::error::Error;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use clap::Parser;
use udpx::{Batch, RecvBuffers, SegmentLimits, Timestamp, UdpSocket, Want};
use udpx_pace::{FlowConfig, Pacer, PacerConfig};

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    let own = match args.to {
        Some(_) => None,
        None => Some(UdpSocket::builder("127.0.0.1:0".parse()?).gro(Want::IfAvailable).recv_buffer(4 << 20).bind()?),
    };
    let dst = args.to.or(own.as_ref().map(UdpSocket::local_addr)).expect("a destination");
    let bind: SocketAddr = if dst.is_ipv6() { "[::]:0".parse()? } else { "0.0.0.0:0".parse()? };
    let tx = UdpSocket::bind(bind)?;

    let done = AtomicBool::new(false);
    let received = AtomicU64::new(0);
    let run = std::thread::scope(|s| {
        if let Some(rx) = &own {
            s.spawn(|| count_arrivals(rx, &done, &received));
        }
        let run = pace(&tx, dst, &args);
        // Whatever is still in flight on loopback arrives within a moment.
        std::thread::sleep(Duration::from_millis(200));
        done.store(true, Relaxed);
        run
    })?;
    let (sent, secs) = (run.sent, run.elapsed_ns as f64 / 1e9);
    println!(
        "sent {sent} datagrams of {} B to {dst} over {} flows in {secs:.3} s: {:.0} B/s, asked {} B/s ({} x {})",
        args.size,
        args.flows,
        (sent * u64::from(args.size)) as f64 / secs,
        args.rate * u64::from(args.flows),
        args.flows,
        args.rate
    );
    let c = tx.counters();
    println!(
        "{} wakes, {} send calls, {} GSO buffers; departures late by {:.0} us on average, {:.0} us at most",
        run.wakes,
        c.send_calls,
        c.gso_buffers_sent,
        run.late_sum_ns as f64 / 1e3 / run.releases.max(1) as f64,
        run.late_max_ns as f64 / 1e3
    );
    if own.is_some() {
        println!("received {} of {sent} datagrams", received.load(Relaxed));
    }
    Ok(())
}

/// What one run did.
#[derive(Debug, Default)]
struct Run {
    sent: u64,
    /// From the pacer's start to the last send's end, measured.
    elapsed_ns: u64,
    wakes: u64,
    releases: u64,
    /// Lateness of each release against its departure time, summed and at most.
    late_sum_ns: u64,
    late_max_ns: u64,
}

/// Sends for the asked time: sleep to the pacer's next wake, read the clock, send what it
/// releases.
fn pace(tx: &UdpSocket, dst: SocketAddr, args: &Args) -> Result<Run, Box<dyn Error>> {
    let start = Timestamp::now().as_nanos();
    let end = start + args.seconds * 1_000_000_000;
    let mut pacer = Pacer::new(PacerConfig::default(), start)?;
    for _ in 0..args.flows {
        pacer.add_flow(FlowConfig::new(args.rate, args.size), start)?;
    }
    let mut due = Vec::with_capacity(pacer.max_releases());
    let mut batch = Batch::for_socket(tx);
    let mut datagram = vec![0u8; args.size as usize];
    let mut run = Run::default();
    while let Some(wake) = pacer.next_wakeup() {
        if wake >= end {
            break;
        }
        let now = Timestamp::now().as_nanos();
        if wake > now {
            std::thread::sleep(Duration::from_nanos(wake - now));
        }
        let now = Timestamp::now().as_nanos();
        pacer.advance_to(now, &mut due);
        batch.clear();
        batch.set_limits(SegmentLimits::for_socket(tx));
        for r in &due {
            // Each datagram names its flow and number (a receiver could check the order).
            datagram[..4].copy_from_slice(&r.flow.to_be_bytes());
            for _ in 0..r.datagrams {
                datagram[4..12].copy_from_slice(&run.sent.to_be_bytes());
                batch.push(dst, &datagram)?;
                run.sent += 1;
            }
            let late = now.saturating_sub(r.due_ns);
            run.releases += 1;
            run.late_sum_ns += late;
            run.late_max_ns = run.late_max_ns.max(late);
        }
        tx.send(&batch.transmits())?;
        run.wakes += 1;
    }
    run.elapsed_ns = Timestamp::now().as_nanos() - start;
    Ok(run)
}

/// The own receiver: counts datagrams (GRO buffers split) until `done`.
fn count_arrivals(rx: &UdpSocket, done: &AtomicBool, received: &AtomicU64) {
    rx.set_read_timeout(Some(Duration::from_millis(50))).expect("SO_RCVTIMEO");
    let mut bufs = RecvBuffers::for_socket(rx, 16);
    while !done.load(Relaxed) {
        match rx.recv_into(&mut bufs) {
            Ok(_) => {
                received.fetch_add(bufs.datagrams().count() as u64, Relaxed);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return eprintln!("paced_send: receive: {e}"),
        }
    }
}

/// A paced sender: udpx-pace decides when each flow's datagrams leave, udpx sends them.
#[derive(Parser)]
struct Args {
    /// Where to send (default: a receiver of its own on loopback, which counts what arrives).
    #[arg(long, value_name = "ADDR")]
    to: Option<SocketAddr>,
    /// Flows, each paced on its own.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    flows: u32,
    /// Bytes per second of UDP payload, per flow.
    #[arg(long, value_name = "BYTES_PER_S", default_value_t = 1_200_000)]
    rate: u64,
    /// Bytes per datagram, at least 12 (its flow and sequence number).
    #[arg(long, value_name = "BYTES", default_value_t = 1200, value_parser = clap::value_parser!(u32).range(12..))]
    size: u32,
    /// How long to send.
    #[arg(long, value_name = "S", default_value_t = 2)]
    seconds: u64,
}
