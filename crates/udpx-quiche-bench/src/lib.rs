//! A microbench of quiche's send path, without sockets: a server connection sends one stream's
//! bytes to a client connection through memory, and the bench counts the time and the heap
//! allocations per full packet sent (`send` on the server) and per acknowledgement processed
//! (`recv` of the client's ACK-only packets on the server), in steady state (after the
//! handshake and a warm-up).
//!
//! What it is for: the quiche patch series (`third_party/quiche/PATCHES.md`) keeps a patch only
//! for what it measurably removes; this counts the per-packet work that a patch touches, apart
//! from the kernel and the network. Two sources: `hot` (the application writes the same 64 KiB
//! again and again: it stays in the cache) and `cold` (it walks a buffer larger than the last
//! level cache, 256 MiB by default).
//!
//! Allocations are counted by the binary's global allocator ([`COUNTING`], stats_alloc's),
//! which the caller installs; time by [`std::time::Instant`] around the calls only (the copying between
//! the two connections is not counted).

use std::time::{Duration, Instant};

/// The allocator the binary and the tests install (`#[global_allocator] static A: &Counting =
/// udpx_quiche_bench::COUNTING;`): the system's, counting.
pub type Counting = stats_alloc::StatsAlloc<std::alloc::System>;

/// The one instance.
pub static COUNTING: &Counting = &stats_alloc::INSTRUMENTED_SYSTEM;

/// Allocations so far, reallocations included (with [`COUNTING`] installed; else 0).
pub fn allocations() -> u64 {
    let s = COUNTING.stats();
    (s.allocations + s.reallocations) as u64
}

/// Where the stream's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Source {
    /// The same 64 KiB again and again.
    Hot,
    /// A walk through a buffer of this many bytes.
    Cold(usize),
}

/// What one run measured, per packet sent and per ACK packet processed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured {
    pub source: Source,
    pub cc: String,
    pub packets_sent: u64,
    pub acks_processed: u64,
    pub bytes_sent: u64,
    /// Nanoseconds of `stream_send` + `send` per packet sent.
    pub ns_per_packet: f64,
    /// Nanoseconds of `recv` per ACK packet processed.
    pub ns_per_ack: f64,
    /// Heap allocations in `stream_send` + `send` per packet sent.
    pub allocs_per_packet: f64,
    /// ... of which in `stream_send` (the application's bytes into quiche's send buffer).
    pub stream_send_allocs_per_packet: f64,
    /// Heap allocations in `recv` per ACK packet processed.
    pub allocs_per_ack: f64,
}

/// A client and a server connection joined in memory.
struct Pair {
    client: quiche::Connection,
    server: quiche::Connection,
    caddr: std::net::SocketAddr,
    saddr: std::net::SocketAddr,
}

fn config(server: bool, cc: &str, files: Option<(&std::path::Path, &std::path::Path)>) -> quiche::Config {
    let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION).expect("a config");
    if let Some((cert, key)) = files.filter(|_| server) {
        c.load_cert_chain_from_pem_file(cert.to_str().expect("a UTF-8 path")).expect("the certificate");
        c.load_priv_key_from_pem_file(key.to_str().expect("a UTF-8 path")).expect("the key");
    }
    c.verify_peer(false);
    c.set_application_protos(&[b"bench"]).expect("ALPN");
    c.set_max_idle_timeout(60_000);
    c.set_max_recv_udp_payload_size(1350);
    c.set_max_send_udp_payload_size(1350);
    c.set_initial_max_data(1 << 30);
    c.set_initial_max_stream_data_bidi_local(1 << 30);
    c.set_initial_max_stream_data_bidi_remote(1 << 30);
    c.set_initial_max_streams_bidi(16);
    c.set_cc_algorithm_name(cc).expect("a congestion controller quiche knows");
    // A window large enough that congestion control never holds the sender back here: the
    // bench measures the per-packet work, not a controller's schedule.
    c.set_initial_congestion_window_packets(1 << 16);
    c.set_max_connection_window(1 << 31);
    c.set_max_stream_window(1 << 31);
    c
}

impl Pair {
    fn new(cc: &str, dir: &std::path::Path) -> Pair {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("a certificate");
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, ck.cert.pem()).expect("write the certificate");
        std::fs::write(&key, ck.key_pair.serialize_pem()).expect("write the key");
        let caddr: std::net::SocketAddr = "127.0.0.1:40000".parse().expect("an address");
        let saddr: std::net::SocketAddr = "127.0.0.1:443".parse().expect("an address");
        let mut cc_cfg = config(false, cc, None);
        let mut sc_cfg = config(true, cc, Some((&cert, &key)));
        let scid = quiche::ConnectionId::from_ref(&[1; 16]);
        let client = quiche::connect(Some("localhost"), &scid, caddr, saddr, &mut cc_cfg).expect("connect");
        let sid = quiche::ConnectionId::from_ref(&[2; 16]);
        let server = quiche::accept(&sid, None, saddr, caddr, &mut sc_cfg).expect("accept");
        let mut p = Pair { client, server, caddr, saddr };
        for _ in 0..32 {
            p.exchange();
            if p.client.is_established() && p.server.is_established() {
                break;
            }
        }
        assert!(p.client.is_established() && p.server.is_established(), "the handshake completes in memory");
        // The client opens stream 0 (a request), so the server may answer on it.
        p.client.stream_send(0, b"GET /", true).expect("the request");
        p.exchange();
        p
    }

    /// Everything each side has to send, delivered to the other (a few rounds).
    fn exchange(&mut self) {
        let mut buf = [0u8; 1500];
        loop {
            let mut moved = false;
            while let Ok((n, _)) = self.client.send(&mut buf) {
                let info = quiche::RecvInfo { from: self.caddr, to: self.saddr };
                let _ = self.server.recv(&mut buf[..n], info);
                moved = true;
            }
            while let Ok((n, _)) = self.server.send(&mut buf) {
                let info = quiche::RecvInfo { from: self.saddr, to: self.caddr };
                let _ = self.client.recv(&mut buf[..n], info);
                moved = true;
            }
            if !moved {
                break;
            }
        }
    }
}

/// Runs the bench: `packets` full packets of stream 0 from server to client after a warm-up
/// of `packets / 4`, the client acknowledging as quiche does (each ACK packet it sends goes
/// back to the server), under controller `cc` ("cubic", "bbr2", "reno"), in a temporary
/// directory `dir` (for the certificate).
pub fn run(source: Source, cc: &str, packets: u64, dir: &std::path::Path) -> Measured {
    let data: Vec<u8> = match source {
        Source::Hot => (0..64 * 1024).map(|i| i as u8).collect(),
        Source::Cold(n) => (0..n).map(|i| (i * 7) as u8).collect(),
    };
    let mut p = Pair::new(cc, dir);
    let mut at = 0usize;
    let mut buf = vec![0u8; 1500];
    let mut acks: Vec<Vec<u8>> = Vec::new();
    let (mut sent, mut acked, mut bytes) = (0u64, 0u64, 0u64);
    let (mut send_time, mut ack_time) = (Duration::ZERO, Duration::ZERO);
    let (mut send_allocs, mut ack_allocs, mut stream_send_allocs) = (0u64, 0u64, 0u64);
    let warmup = packets / 4;
    let mut round = 0u64;
    let mut pool: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 1500]).collect();
    let mut lens = [0usize; 32];
    while sent < warmup + packets {
        round += 1;
        let measuring = sent >= warmup;
        // The application keeps the stream's buffer at 64 KiB ahead of the sender.
        let a0 = allocations();
        let t0 = Instant::now();
        let mut queued = 0;
        while queued < 64 * 1024 {
            let end = (at + 16 * 1024).min(data.len());
            match p.server.stream_send(0, &data[at..end], false) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    queued += n;
                    at = if at + n >= data.len() { 0 } else { at + n };
                }
            }
        }
        let queued_allocs = allocations() - a0;
        // A flight of up to 32 packets (what one send call of the host takes).
        // (The flight's buffers are ours: taken from a pool, not counted.)
        let mut flight = std::mem::take(&mut pool);
        let mut sent_now = 0;
        let mut send_allocs_now = 0;
        for f in flight.iter_mut() {
            let a = allocations();
            let r = p.server.send(f);
            send_allocs_now += allocations() - a;
            match r {
                Ok((n, _)) => {
                    lens[sent_now] = n;
                    sent_now += 1;
                }
                Err(_) => break,
            }
        }
        let dt = t0.elapsed();
        let da = queued_allocs + send_allocs_now;
        if measuring {
            send_time += dt;
            send_allocs += da;
            stream_send_allocs += queued_allocs;
            bytes += lens[..sent_now].iter().map(|&n| n as u64).sum::<u64>();
        }
        sent += sent_now as u64;
        // The client reads what arrived (not counted) and acknowledges.
        for (f, &n) in flight.iter_mut().zip(&lens[..sent_now]) {
            let info = quiche::RecvInfo { from: p.saddr, to: p.caddr };
            let _ = p.client.recv(&mut f[..n], info);
        }
        pool = flight;
        let mut sink = [0u8; 65536];
        while let Ok((_, _)) = p.client.stream_recv(0, &mut sink) {}
        acks.clear();
        while let Ok((n, _)) = p.client.send(&mut buf) {
            acks.push(buf[..n].to_vec());
        }
        let a0 = allocations();
        let t0 = Instant::now();
        let n_acks = acks.len() as u64;
        for a in acks.iter_mut() {
            let info = quiche::RecvInfo { from: p.caddr, to: p.saddr };
            let _ = p.server.recv(a, info);
        }
        let dt = t0.elapsed();
        let da = allocations() - a0;
        if measuring {
            ack_time += dt;
            ack_allocs += da;
            acked += n_acks;
        }
        assert!(round < 10 * (warmup + packets), "the sender stalled");
    }
    let per = |x: f64, n: u64| if n == 0 { 0.0 } else { x / n as f64 };
    Measured {
        source,
        cc: cc.to_string(),
        packets_sent: sent - warmup,
        acks_processed: acked,
        bytes_sent: bytes,
        ns_per_packet: per(send_time.as_nanos() as f64, sent - warmup),
        ns_per_ack: per(ack_time.as_nanos() as f64, acked),
        allocs_per_packet: per(send_allocs as f64, sent - warmup),
        stream_send_allocs_per_packet: per(stream_send_allocs as f64, sent - warmup),
        allocs_per_ack: per(ack_allocs as f64, acked),
    }
}
