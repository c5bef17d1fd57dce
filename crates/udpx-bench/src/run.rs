//! One measured row: a sender and a receiver, pinned to different CPUs, over loopback or the
//! veth pair, with CPU time taken from `/proc/stat` (both CPUs, softirq included) and from each
//! thread's `getrusage`.
//!
//! On a veth pair the receive stack of a default (`offload`) path runs in the *sender's*
//! softirq, on the sender's CPU; that is why the headline cost is the busy time of both CPUs
//! per delivered gigabyte, with each side shown beside it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use udpx::{SendMode, UdpSocket, Want, ZcConfig};
use udpx_lab::netns::{run_bounded, Side, TestNet};

use crate::cpu::{pin_current_thread, CpuSample, TickRate};
use crate::raw::{self, Shape};
use crate::rx::{run_rx, rx_socket_config, RxConfig, RxResult, RxSocket};
use crate::tx::{prepare, run_prepared, Proto, TxConfig, TxResult, Zc};

/// Where the traffic goes.
#[derive(Debug, Clone, Copy)]
pub enum Path<'a> {
    /// 127.0.0.1 in this namespace.
    Loopback,
    /// The veth pair: sender in `tx`, receiver in `rx`.
    Veth(&'a TestNet),
}

impl Path<'_> {
    fn addrs(&self, v6: bool) -> (IpAddr, IpAddr) {
        match (self, v6) {
            (Path::Loopback, false) => (Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into()),
            (Path::Loopback, true) => (std::net::Ipv6Addr::LOCALHOST.into(), std::net::Ipv6Addr::LOCALHOST.into()),
            (Path::Veth(n), false) => (n.tx_v4.into(), n.rx_v4.into()),
            (Path::Veth(n), true) => (n.tx_v6.into(), n.rx_v6.into()),
        }
    }

    /// Runs `f` in the namespace of `side` (on loopback: here, on a fresh thread).
    fn run<T: Send + 'static>(&self, side: Side, f: impl FnOnce() -> T + Send + 'static) -> T {
        match self {
            Path::Loopback => std::thread::spawn(f).join().expect("socket setup thread panicked"),
            Path::Veth(n) => n.ns(side).run(f),
        }
    }

    fn command(&self, side: Side, program: &str) -> Command {
        match self {
            Path::Loopback => Command::new(program),
            Path::Veth(n) => n.ns(side).command(program),
        }
    }
}

/// What one row sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    /// udpx's own sender and receiver.
    Udpx {
        /// Protocol and send mode.
        proto: Proto,
        /// UDP_GRO on the receiving socket.
        gro: bool,
        /// The receiver batches with recvmmsg (else one recvmsg per datagram or GRO buffer).
        batch_rx: bool,
        /// Rotate the send buffers over 64 MiB.
        cache_thrash: bool,
        /// Zerocopy send.
        zerocopy: Zc,
        /// This receive buffer (the value to set) instead of the run's
        /// ([`RunConfig::rcvbuf`]): the rows that show what the size does.
        rcvbuf: Option<usize>,
        /// The sender sends through io_uring ([`udpx::SocketConfig::io_uring`]).
        io_uring: bool,
    },
    /// The raw reference sender ([`crate::raw`]) of one shape, into the raw receiver or into
    /// udpx's receiver of the same shape (one `recvmsg` per call, GRO as the shape says).
    Raw {
        /// Which shape.
        shape: Shape,
        /// Which receiver.
        rx: RawRx,
    },
    /// iperf3 client and server (an independent peer).
    Iperf3 {
        /// UDP (`-u -b 0 -l <size>`) rather than TCP.
        udp: bool,
    },
}

/// The receiver of a [`Kind::Raw`] row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum RawRx {
    /// The raw `recv` loop.
    Raw,
    /// udpx's receiver (`recvmsg` mode), with or without pktinfo and ECN.
    Udpx {
        /// Ask for pktinfo and ECN on every datagram (what the QUIC host reads).
        pktinfo_ecn: bool,
    },
}

/// The CPUs each side is pinned to.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Cpus {
    /// Sender.
    pub tx: usize,
    /// Receiver.
    pub rx: usize,
}

/// Settings shared by every row of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunConfig {
    /// Seconds each row sends.
    pub duration: Duration,
    /// Datagram size.
    pub size: usize,
    /// IPv6 instead of IPv4.
    pub v6: bool,
    /// Verify sequence numbers and checksums at the receiver.
    pub verify: bool,
    /// Pinning.
    pub cpus: Cpus,
    /// Receive buffer of every UDP receiver, the value to set (the kernel doubles it): from
    /// `--rcvbuf`, else [`crate::rx::default_rcvbuf`]. The same for the raw and the udpx
    /// receivers, so rows compare the code, not the queue.
    pub rcvbuf: usize,
    /// Pace the raw sender to this many payload bytes per second (the paced phase,
    /// [`crate::paced`]); `None`: as fast as it can. udpx's own sender is never paced here.
    pub pace: Option<u64>,
}

/// One measurement of one row.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Measurement {
    /// Which pass of the matrix (0-based): runs of different rows with the same number ran
    /// in the same pass, side by side, and are compared with each other.
    pub run: usize,
    /// Seconds from the start of sending to the end of receiving.
    pub wall_secs: f64,
    /// Busy CPU seconds over the run, both CPUs (user, system, irq, softirq; /proc/stat).
    pub busy_secs: f64,
    /// Of which on the sender's CPU.
    pub busy_tx_cpu_secs: f64,
    /// Of which on the receiver's CPU.
    pub busy_rx_cpu_secs: f64,
    /// Softirq seconds, both CPUs.
    pub softirq_secs: f64,
    /// The hypervisor's steal from the two CPUs over the run (`steal_s`, `steal_share`,
    /// `stolen`): not in `busy_secs`, since nothing of ours ran then; a run over the limit is
    /// marked and counts in no median, range or ratio ([`udpx_lab::steal`]).
    #[serde(flatten)]
    pub steal: udpx_lab::steal::Steal,
    /// Bytes the sender sent.
    pub sent_bytes: u64,
    /// Datagrams the sender sent.
    pub sent_datagrams: u64,
    /// Bytes the receiver got.
    pub recv_bytes: u64,
    /// Datagrams the receiver got.
    pub recv_datagrams: u64,
    /// Send system calls.
    pub send_calls: u64,
    /// Receive system calls.
    pub recv_calls: u64,
    /// Sending seconds.
    pub send_secs: f64,
    /// Sender thread CPU seconds (user + system; getrusage), when the sender is ours.
    pub tx_thread_secs: Option<f64>,
    /// Receiver thread CPU seconds, when the receiver is ours.
    pub rx_thread_secs: Option<f64>,
    /// The receive buffer in effect (`SO_RCVBUF` as the kernel reports it: twice the value
    /// set), UDP rows.
    pub rcvbuf_effective: Option<usize>,
    /// The udpx sender's details.
    pub tx: Option<TxResult>,
    /// The udpx receiver's details.
    pub rx: Option<RxResult>,
}

impl Measurement {
    /// Delivered Gbit/s over the sending time.
    pub fn gbits(&self) -> f64 {
        if self.send_secs > 0.0 {
            self.recv_bytes as f64 * 8.0 / self.send_secs / 1e9
        } else {
            0.0
        }
    }

    /// CPU seconds (both CPUs) per delivered GB.
    pub fn cpu_per_gb(&self) -> f64 {
        per_gb(self.busy_secs, self.recv_bytes)
    }

    /// Fraction of sent datagrams the receiver got.
    pub fn delivered(&self) -> f64 {
        if self.sent_datagrams == 0 {
            0.0
        } else {
            (self.recv_datagrams as f64 / self.sent_datagrams as f64).min(1.0)
        }
    }
}

/// Seconds per GB, infinite when nothing arrived.
pub fn per_gb(secs: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        f64::INFINITY
    } else {
        secs / (bytes as f64 / 1e9)
    }
}

/// Errors of a run, with what was being done.
pub type Result<T> = std::result::Result<T, String>;

/// Runs one udpx row.
pub fn run_udpx(path: Path<'_>, kind: Kind, cfg: &RunConfig) -> Result<Measurement> {
    let Kind::Udpx { proto, gro, batch_rx, cache_thrash, zerocopy, rcvbuf, io_uring } = kind else {
        return Err("run_udpx needs a udpx row".into());
    };
    let (tx_ip, rx_ip) = path.addrs(cfg.v6);
    let rx_cfg =
        RxConfig { verify: cfg.verify, idle: Duration::from_secs(2), max: cfg.duration + Duration::from_secs(10) };
    let tx_base = TxConfig {
        dst: SocketAddr::new(rx_ip, 0),
        proto,
        size: cfg.size,
        duration: cfg.duration,
        cache_thrash,
        verify: cfg.verify,
        rate: None,
        // Zerocopy rows send buffers of the raw GSO sender's 42 segments too, so "zerocopy / copy"
        // compares calls of the same size.
        max_segments: (zerocopy != Zc::Off).then_some(crate::raw::GSO_SEGMENTS),
        // A GSO sendmsg row sends what the raw GSO sender does, one buffer of 42 segments per
        // call (udpgso_bench_tx's 61,824 bytes at 1,472), so the two compare the same calls.
        // GSO+sendmmsg keeps its batch of PER_ITERATION datagrams: batching is its mechanism.
        send_size: (proto == Proto::Udp(SendMode::GsoSendmsg) && zerocopy == Zc::Off)
            .then(|| Shape::Gso.send_bytes(cfg.size)),
        zerocopy: zerocopy != Zc::Off,
    };
    // Sockets, made in their namespaces: (UDP socket, TCP stream) for each end.
    type Ends = (Option<UdpSocket>, Option<TcpStream>);
    let (txc, rx_end, tx_end): (TxConfig, Ends, Ends) = match proto {
        Proto::Udp(mode) => {
            let set = rcvbuf.unwrap_or(cfg.rcvbuf);
            let rx_sock = path
                .run(Side::Rx, move || {
                    // No receive metadata the bench does not read: each is a cmsg per datagram.
                    let rx = RxSocket { gro, batch: batch_rx, meta: false, rcvbuf: set };
                    rx_socket_config(SocketAddr::new(rx_ip, 0), rx).bind()
                })
                .map_err(|e| format!("receiver socket: {e}"))?;
            let dst = rx_sock.local_addr();
            let tx_sock = path
                .run(Side::Tx, move || {
                    let zc_cfg = ZcConfig {
                        copied_limit: if zerocopy == Zc::Forced { 0 } else { udpx::zerocopy::COPIED_LIMIT },
                        ..ZcConfig::default()
                    };
                    UdpSocket::builder(SocketAddr::new(tx_ip, 0))
                        .zerocopy(if zerocopy == Zc::Off { Want::Off } else { Want::Required })
                        .io_uring(if io_uring { Want::Required } else { Want::Off })
                        .zerocopy_config(zc_cfg)
                        .send_mode(mode)
                        .send_buffer(4 << 20)
                        .connect(dst)
                        .bind()
                })
                .map_err(|e| format!("sender socket: {e}"))?;
            (TxConfig { dst, ..tx_base }, (Some(rx_sock), None), (Some(tx_sock), None))
        }
        Proto::Tcp => {
            let listener = path
                .run(Side::Rx, move || TcpListener::bind(SocketAddr::new(rx_ip, 0)))
                .map_err(|e| format!("TCP listener: {e}"))?;
            let dst = listener.local_addr().map_err(|e| e.to_string())?;
            let stream =
                path.run(Side::Tx, move || TcpStream::connect(dst)).map_err(|e| format!("TCP connect: {e}"))?;
            let (conn, _) = listener.accept().map_err(|e| format!("TCP accept: {e}"))?;
            (TxConfig { dst, ..tx_base }, (None, Some(conn)), (None, Some(stream)))
        }
    };
    let mut m = side_by_side(
        cfg.cpus,
        move |go, stop| {
            go();
            run_rx(&rx_cfg, rx_end.0.as_ref(), rx_end.1, stop, &mut |_| {})
        },
        move |go, stop| {
            // Buffers are made and touched before the clock starts.
            let prepared = prepare(&txc, tx_end.0.as_ref());
            go();
            run_prepared(&txc, prepared, tx_end.0.as_ref(), tx_end.1, stop, &mut |_| {})
        },
    )?;
    if proto == Proto::Tcp {
        // A TCP "datagram" is a write on one side and a read on the other: compare bytes.
        m.recv_datagrams = if m.sent_bytes == 0 { 0 } else { (m.recv_bytes * m.sent_datagrams).div_ceil(m.sent_bytes) };
    }
    Ok(m)
}

/// The receiving side of a [`Kind::Raw`] row: the raw socket or udpx's.
enum RawEnd {
    Raw(std::net::UdpSocket, usize),
    Udpx(Box<UdpSocket>),
}

/// Runs one [`Kind::Raw`] row: the raw sender of `shape` into the raw receiver or udpx's.
pub fn run_raw(path: Path<'_>, kind: Kind, cfg: &RunConfig) -> Result<Measurement> {
    let Kind::Raw { shape, rx } = kind else {
        return Err("run_raw needs a raw row".into());
    };
    let (tx_ip, rx_ip) = path.addrs(cfg.v6);
    let (set, size) = (cfg.rcvbuf, cfg.size);
    let end = path
        .run(Side::Rx, move || -> std::io::Result<RawEnd> {
            let bind = SocketAddr::new(rx_ip, 0);
            Ok(match rx {
                RawRx::Raw => {
                    let (s, eff) = raw::rx_socket(bind, shape.gro(), set)?;
                    RawEnd::Raw(s, eff)
                }
                RawRx::Udpx { pktinfo_ecn } => {
                    let rx = RxSocket { gro: shape.gro(), batch: false, meta: pktinfo_ecn, rcvbuf: set };
                    RawEnd::Udpx(Box::new(rx_socket_config(bind, rx).bind()?))
                }
            })
        })
        .map_err(|e| format!("receiver socket: {e}"))?;
    let dst = match &end {
        RawEnd::Raw(s, _) => s.local_addr().map_err(|e| e.to_string())?,
        RawEnd::Udpx(s) => s.local_addr(),
    };
    let tx_sock = path
        .run(Side::Tx, move || raw::tx_socket(SocketAddr::new(tx_ip, 0), dst))
        .map_err(|e| format!("sender socket: {e}"))?;
    let (idle, max) = (Duration::from_secs(2), cfg.duration + Duration::from_secs(10));
    let (duration, pace) = (cfg.duration, cfg.pace);
    side_by_side(
        cfg.cpus,
        move |go, stop| {
            go();
            match end {
                RawEnd::Raw(s, eff) => {
                    // Never verified while timed: `--verify` slows udpx's receivers, and the
                    // raw receiver it is compared with must not be slowed alone (its bytes are
                    // checked by the raw module's own test).
                    let (mut r, _) = raw::run_rx(&s, size, false, idle, max, stop)?;
                    r.rcvbuf_effective = Some(eff);
                    Ok(r)
                }
                RawEnd::Udpx(s) => {
                    let rx_cfg = RxConfig { verify: false, idle, max };
                    run_rx(&rx_cfg, Some(&s), None, stop, &mut |_| {})
                }
            }
        },
        move |go, stop| {
            go();
            raw::run_tx(&tx_sock, shape, size, duration, pace, stop)
        },
    )
}

/// Runs a receiver and a sender on their own threads, each pinned, released together once
/// both are ready (`go()` waits for the start: the sender makes its buffers before it), with
/// the CPU clock read between ready and go. The sender sets `stop` when it is done; the
/// receiver drains and returns.
fn side_by_side<R, T>(cpus: Cpus, rx: R, tx: T) -> Result<Measurement>
where
    R: FnOnce(&dyn Fn(), &AtomicBool) -> std::io::Result<RxResult> + Send + 'static,
    T: FnOnce(&dyn Fn(), &AtomicBool) -> std::io::Result<TxResult> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(3));
    let (s1, b1, s2, b2) = (stop.clone(), barrier.clone(), stop.clone(), barrier.clone());
    let rx_handle = std::thread::spawn(move || {
        let _ = pin_current_thread(cpus.rx);
        let go = || {
            b1.wait(); // ready
            b1.wait(); // go
        };
        rx(&go, &s1)
    });
    let tx_handle = std::thread::spawn(move || {
        let _ = pin_current_thread(cpus.tx);
        let go = || {
            b2.wait();
            b2.wait();
        };
        let r = tx(&go, &s2);
        s2.store(true, Ordering::Relaxed);
        r
    });
    // Both threads ready (buffers made, sockets pinned); then the clock starts, then they go.
    barrier.wait();
    let before = CpuSample::now().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    barrier.wait();
    let tx = tx_handle.join().map_err(|_| "sender thread panicked".to_string())?.map_err(|e| format!("sender: {e}"))?;
    let rx =
        rx_handle.join().map_err(|_| "receiver thread panicked".to_string())?.map_err(|e| format!("receiver: {e}"))?;
    let wall = t0.elapsed();
    let after = CpuSample::now().map_err(|e| e.to_string())?;
    let mut m = cpu_fields(&before, &after, cpus)?;
    m.wall_secs = wall.as_secs_f64();
    m.sent_bytes = tx.bytes;
    m.sent_datagrams = tx.datagrams;
    m.send_calls = tx.calls;
    m.send_secs = tx.secs;
    m.recv_bytes = rx.bytes;
    m.recv_datagrams = rx.datagrams;
    m.recv_calls = rx.calls;
    m.tx_thread_secs = Some(tx.user_secs + tx.sys_secs);
    m.rx_thread_secs = Some(rx.user_secs + rx.sys_secs);
    m.rcvbuf_effective = rx.rcvbuf_effective;
    m.tx = Some(tx);
    m.rx = Some(rx);
    Ok(m)
}

fn cpu_fields(before: &CpuSample, after: &CpuSample, cpus: Cpus) -> Result<Measurement> {
    let d = after.diff(before);
    let rate = TickRate::system().map_err(|e| e.to_string())?;
    let both = if cpus.tx == cpus.rx { vec![cpus.tx] } else { vec![cpus.tx, cpus.rx] };
    let softirq: u64 = both.iter().filter_map(|c| d.times(Some(*c))).map(|t| t.softirq).sum();
    Ok(Measurement {
        busy_secs: d.busy_time(&both, rate).as_secs_f64(),
        busy_tx_cpu_secs: d.busy_time(&[cpus.tx], rate).as_secs_f64(),
        busy_rx_cpu_secs: d.busy_time(&[cpus.rx], rate).as_secs_f64(),
        softirq_secs: rate.to_secs_f64(softirq),
        steal: udpx_lab::steal::Steal::of(&d, &both, rate),
        ..Measurement::default()
    })
}

/// Runs one iperf3 row: server in the receiving namespace, client in the sending one, each
/// pinned with `-A`. Figures from the client's JSON (which carries the server's counts).
pub fn run_iperf3(path: Path<'_>, udp: bool, cfg: &RunConfig) -> Result<Measurement> {
    let (_, rx_ip) = path.addrs(cfg.v6);
    let port = match path {
        Path::Veth(_) => 5201,
        Path::Loopback => {
            TcpListener::bind((rx_ip, 0)).and_then(|l| l.local_addr()).map(|a| a.port()).map_err(|e| e.to_string())?
        }
    };
    let secs = cfg.duration.as_secs_f64().ceil().max(1.0) as u64;
    let mut server = path.command(Side::Rx, "iperf3");
    server
        .args(["-s", "-1", "-B", &rx_ip.to_string(), "-p", &port.to_string(), "-A", &cfg.cpus.rx.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Ended with its process group on every way out of this function, errors and panics too.
    let child = udpx_lab::netns::ChildGroup::spawn(&mut server)
        .map_err(|e| format!("start iperf3 server (is iperf3 installed? scripts/setup.sh): {e}"))?;
    let mut client = path.command(Side::Tx, "iperf3");
    client.args([
        "-c",
        &rx_ip.to_string(),
        "-p",
        &port.to_string(),
        "-t",
        &secs.to_string(),
        "-A",
        &cfg.cpus.tx.to_string(),
        "-J",
    ]);
    if udp {
        client.args(["-u", "-b", "0", "-l", &cfg.size.to_string()]);
    }
    // The server needs a moment to listen; the client retries a refused connection.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut result = None;
    let mut before = CpuSample::now().map_err(|e| e.to_string())?;
    let mut t0 = Instant::now();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        before = CpuSample::now().map_err(|e| e.to_string())?;
        t0 = Instant::now();
        match run_bounded(&mut client, Duration::from_secs(secs + 15)) {
            Ok(out) => {
                result = Some(out);
                break;
            }
            Err(e) if e.to_string().contains("refused") || e.to_string().contains("unable to connect") => continue,
            Err(e) => return Err(format!("iperf3 client: {e}")),
        }
    }
    let wall = t0.elapsed();
    let after = CpuSample::now().map_err(|e| e.to_string())?;
    drop(child);
    let out = result.ok_or("iperf3 server did not accept connections within 3 s")?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("iperf3 JSON: {e}"))?;
    let mut m = cpu_fields(&before, &after, cfg.cpus)?;
    m.wall_secs = wall.as_secs_f64();
    parse_iperf3(&v, udp, cfg.size, &mut m)?;
    Ok(m)
}

/// Fills byte and datagram counts from iperf3's `-J` output.
pub fn parse_iperf3(v: &serde_json::Value, udp: bool, size: usize, m: &mut Measurement) -> Result<()> {
    let end = &v["end"];
    if let Some(err) = v["error"].as_str() {
        return Err(format!("iperf3: {err}"));
    }
    let f = |x: &serde_json::Value| x.as_f64().unwrap_or(0.0);
    if udp {
        let sum = &end["sum"];
        let packets = f(&sum["packets"]) as u64;
        let lost = f(&sum["lost_packets"]).max(0.0) as u64;
        m.send_secs = f(&sum["seconds"]);
        m.sent_datagrams = packets;
        m.sent_bytes = f(&sum["bytes"]) as u64;
        m.recv_datagrams = packets.saturating_sub(lost);
        m.recv_bytes = m.recv_datagrams * size as u64;
        m.send_calls = packets; // iperf3 writes one datagram per call
    } else {
        m.send_secs = f(&end["sum_sent"]["seconds"]);
        m.sent_bytes = f(&end["sum_sent"]["bytes"]) as u64;
        m.recv_bytes = f(&end["sum_received"]["bytes"]) as u64;
        m.sent_datagrams = 1;
        m.recv_datagrams = 1;
    }
    if m.send_secs <= 0.0 {
        return Err("iperf3 reported no sending time".into());
    }
    Ok(())
}

/// A short stable label for a send mode or TCP.
pub fn proto_label(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "tcp",
        Proto::Udp(SendMode::Sendmsg) => "udp",
        Proto::Udp(SendMode::Sendmmsg) => "udp sendmmsg",
        Proto::Udp(SendMode::GsoSendmsg) => "udp gso",
        Proto::Udp(SendMode::GsoSendmmsg) => "udp gso+sendmmsg",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_udp_json() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"end":{"sum":{"seconds":2.0,"bytes":294400,"packets":200,"lost_packets":10}}}"#)
                .unwrap();
        let mut m = Measurement::default();
        parse_iperf3(&v, true, 1472, &mut m).unwrap();
        assert_eq!((m.sent_datagrams, m.recv_datagrams, m.recv_bytes), (200, 190, 190 * 1472));
        assert!((m.delivered() - 0.95).abs() < 1e-9);
        let e: serde_json::Value = serde_json::from_str(r#"{"error":"unable to connect"}"#).unwrap();
        assert!(parse_iperf3(&e, true, 1472, &mut m).is_err());
    }

    #[test]
    fn per_gb_math() {
        assert_eq!(per_gb(1.0, 2_000_000_000), 0.5);
        assert!(per_gb(1.0, 0).is_infinite());
        let m = Measurement { recv_bytes: 1_000_000_000, send_secs: 2.0, busy_secs: 0.6, ..Default::default() };
        assert!((m.gbits() - 4.0).abs() < 1e-9);
        assert!((m.cpu_per_gb() - 0.6).abs() < 1e-9);
    }
}
