//! What quiche's `qlog` feature costs a server that logs no connection: a bulk transfer
//! between two quiche connections in memory (no sockets), the CPU time of the sender's
//! `send()` calls per packet (batches of up to 64 calls, each batch timed by this thread's CPU
//! clock, whose reading costs the same in both builds). Run it twice, the feature off and on, and compare:
//!
//! ```sh
//! cargo run -p udpx-quic --example qlog_cost
//! cargo run -p udpx-quic --example qlog_cost --features qlog
//! ```
//!
//! It prints the median of 7 runs of 64 MB each (with the spread); docs/operations.md quotes
//! the figures.

use std::net::SocketAddr;
use std::time::Duration;

const BYTES: usize = 64 << 20;
const RUNS: usize = 7;

/// This thread's CPU time so far (`/proc/thread-self/schedstat`'s first field, ns): time on a
/// CPU only, whatever else the machine runs.
fn cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    Duration::from_nanos(s.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0))
}

fn configs(dir: &std::path::Path) -> (quiche::Config, quiche::Config) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
    std::fs::write(&c, ck.cert.pem()).unwrap();
    std::fs::write(&k, ck.key_pair.serialize_pem()).unwrap();
    let mut s = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    s.load_cert_chain_from_pem_file(c.to_str().unwrap()).unwrap();
    s.load_priv_key_from_pem_file(k.to_str().unwrap()).unwrap();
    let mut cl = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    cl.verify_peer(false);
    for cfg in [&mut s, &mut cl] {
        cfg.set_application_protos(&[b"bench"]).unwrap();
        cfg.set_initial_max_data(1 << 30);
        cfg.set_initial_max_stream_data_bidi_local(1 << 30);
        cfg.set_initial_max_stream_data_bidi_remote(1 << 30);
        cfg.set_initial_max_streams_bidi(10);
        cfg.set_max_idle_timeout(30_000);
    }
    (s, cl)
}

/// One transfer of [`BYTES`] from server to client: the server's send() CPU time per packet.
fn transfer(scfg: &mut quiche::Config, ccfg: &mut quiche::Config) -> (f64, u64) {
    let (ca, sa): (SocketAddr, SocketAddr) = (([127, 0, 0, 1], 1000).into(), ([127, 0, 0, 1], 2000).into());
    let mut client =
        quiche::connect(Some("localhost"), &quiche::ConnectionId::from_ref(&[1; 16]), ca, sa, ccfg).unwrap();
    let mut server: Option<quiche::Connection> = None;
    let mut buf = vec![0u8; 65535];
    let chunk = vec![0x42u8; 1 << 20];
    let (mut written, mut received) = (0usize, 0usize);
    let (mut send_cpu, mut packets) = (Duration::ZERO, 0u64);
    let mut turns = 0u64;
    while received < BYTES {
        turns += 1;
        assert!(turns < 10_000_000, "the transfer stalls");
        while let Ok((n, _)) = client.send(&mut buf) {
            let s = server.get_or_insert_with(|| {
                quiche::accept(&quiche::ConnectionId::from_ref(&[2; 16]), None, sa, ca, scfg).unwrap()
            });
            let _ = s.recv(&mut buf[..n], quiche::RecvInfo { from: ca, to: sa });
        }
        let Some(s) = server.as_mut() else { continue };
        if s.is_established() && written < BYTES {
            if let Ok(n) = s.stream_send(1, &chunk[..chunk.len().min(BYTES - written)], written + chunk.len() >= BYTES)
            {
                written += n;
            }
        }
        // A window's worth of packets, timed, then the client reads and acknowledges them.
        let mut out = Vec::new();
        let t = cpu();
        for _ in 0..64 {
            match s.send(&mut buf) {
                Ok((n, _)) => out.push(buf[..n].to_vec()),
                Err(_) => break,
            }
        }
        send_cpu += cpu() - t;
        packets += out.len() as u64;
        for mut p in out {
            let _ = client.recv(&mut p, quiche::RecvInfo { from: sa, to: ca });
        }
        while let Ok((n, _)) = client.stream_recv(1, &mut buf) {
            received += n;
        }
        // Time passes for the pacer and the loss timers: none is simulated (no loss).
        s.on_timeout();
        client.on_timeout();
    }
    (send_cpu.as_nanos() as f64 / packets as f64, packets)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("udpx-qlog-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut s, mut c) = configs(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let mut per_packet: Vec<f64> = (0..RUNS).map(|_| transfer(&mut s, &mut c).0).collect();
    per_packet.sort_by(f64::total_cmp);
    println!(
        "qlog feature {}: server send() {:.0} ns per packet (median of {RUNS} x {} MB; {:.0} to {:.0})",
        if cfg!(feature = "qlog") { "on " } else { "off" },
        per_packet[RUNS / 2],
        BYTES >> 20,
        per_packet[0],
        per_packet[RUNS - 1]
    );
}
