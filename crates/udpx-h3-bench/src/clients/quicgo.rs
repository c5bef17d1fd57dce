//! The independent load client: `udpx-quicgo-load` (`peers/quicgo-load`, a Go program of ours on
//! quic-go's HTTP/3 client, and on Go's own `net/http` for HTTP/2 and HTTP/1.1), built by
//! `scripts/setup.sh`. It plays the same players as [`crate::clients::own`] (the same schedule, window,
//! counts and JSON fields) on a stack udpx did not write, whose acknowledgement policy is its
//! own: quic-go acknowledges about one packet in 26 in a bulk download, udpx's own client one in
//! 73. The scale bench judges servers with it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use crate::clients::own::{Latency, LoadConfig, LoadReport};

/// The program's name in `PATH`.
pub const PROGRAM: &str = "udpx-quicgo-load";

/// The program, if `scripts/setup.sh` built it: in `PATH`, `/usr/local/bin` (as root), or
/// `target/peers` (not root) above this executable.
pub fn find() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    let beside = exe.iter().flat_map(|e| e.ancestors().skip(1).take(3)).map(|d| d.join("peers").join(PROGRAM));
    udpx_lab::netns::find_in_path(PROGRAM)
        .into_iter()
        .chain(std::iter::once(Path::new("/usr/local/bin").join(PROGRAM)))
        .chain(beside)
        .find(|p| p.is_file())
}

/// The protocol the independent client speaks to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/3 (quic-go).
    H3,
    /// HTTP/2 over TLS (Go's `net/http`).
    H2,
    /// HTTP/1.1 over TLS (Go's `net/http`).
    H1,
}

impl Proto {
    fn flag(self) -> &'static str {
        match self {
            Proto::H3 => "h3",
            Proto::H2 => "h2",
            Proto::H1 => "http1.1",
        }
    }
}

/// The program's report (its JSON: the fields of [`LoadReport`] it can fill).
#[derive(Debug, Deserialize)]
struct Report {
    client: String,
    established: usize,
    ended_early: usize,
    never_served: usize,
    requests: u64,
    served: u64,
    failed: u64,
    late: u64,
    unanswered: u64,
    bytes: u64,
    latency: Latency,
    handshake: Latency,
    client_cpu_s: f64,
    window_s: f64,
    packets_sent: u64,
    packets_received: u64,
    /// Datagrams the kernel delivered to the client's namespace over the window; -1: unread.
    udp_delivered: i64,
    /// Datagrams it dropped there for a full socket receive buffer; -1: unread.
    udp_rcvbuf_errors: i64,
    errors: Vec<String>,
}

/// Runs `cmd` (the program, wrapped as the caller places it: a namespace, a CPU) with the
/// players of `cfg` over `proto`, each body `size` bytes, and returns its report. The run is
/// bounded: the ramp, the window, the program's 10 s of grace and 30 s more.
pub fn run(mut cmd: Command, cfg: &LoadConfig, proto: Proto, size: u64) -> Result<LoadReport, String> {
    cfg.check()?;
    let secs = |d: Duration| format!("{:.3}", d.as_secs_f64());
    cmd.args(["--server", &cfg.server.to_string(), "--proto", proto.flag()])
        .args(["--connections", &cfg.connections.to_string(), "--path", &cfg.path])
        .args(["--interval", &secs(cfg.interval), "--ramp", &secs(cfg.ramp), "--duration", &secs(cfg.duration)])
        .args(["--keepalive", &secs(cfg.keepalive), "--size", &size.to_string()]);
    if !cfg.locals.is_empty() {
        let locals: Vec<String> = cfg.locals.iter().map(ToString::to_string).collect();
        cmd.args(["--locals", &locals.join(",")]);
    }
    let limit = cfg.ramp + cfg.duration + Duration::from_secs(40);
    let out = udpx_lab::netns::run_bounded(&mut cmd, limit).map_err(|e| format!("{PROGRAM}: {e}"))?;
    let r: Report = serde_json::from_str(out.trim()).map_err(|e| format!("{PROGRAM}'s report: {e}: {out:.200}"))?;
    if !r.errors.is_empty() {
        log::info!("{PROGRAM}: {}", r.errors.join("; "));
    }
    // A connection that ended before the window's end, or a failed request: its cause, where
    // a test's output (and the bench's) shows it, whatever the logger.
    if r.ended_early > 0 || r.failed > 0 {
        eprintln!("{PROGRAM}: {} ended early, {} failed: {}", r.ended_early, r.failed, r.errors.join("; "));
    }
    Ok(LoadReport {
        client: r.client,
        config: cfg.clone(),
        established: r.established,
        ended_early: r.ended_early,
        never_served: r.never_served,
        requests: r.requests,
        served: r.served,
        failed: r.failed,
        late: r.late,
        bytes: r.bytes,
        latency: r.latency,
        handshake: r.handshake,
        client_cpu_s: r.client_cpu_s,
        window_s: r.window_s,
        unanswered: r.unanswered,
        packets_sent: (proto == Proto::H3).then_some(r.packets_sent),
        packets_received: (proto == Proto::H3).then_some(r.packets_received),
        // Short-header packets are one per datagram: what was delivered and not processed
        // was dropped in the client (handshakes, whose datagrams coalesce packets, end before
        // the window), and the kernel dropped what no receive buffer held.
        client_dropped: (proto == Proto::H3 && r.udp_delivered >= 0 && r.udp_rcvbuf_errors >= 0)
            .then(|| (r.udp_delivered as u64).saturating_sub(r.packets_received) + r.udp_rcvbuf_errors as u64),
        quic: Default::default(),
        moved_on_goaway: 0,
        retried: 0,
        timeline: Vec::new(),
        failed_at: Vec::new(),
    })
}

/// What one download by the program (`--get`) reports.
#[derive(Debug, Clone, Deserialize)]
pub struct GetReport {
    /// The client stack and its version.
    pub client: String,
    /// The response's status.
    pub status: u16,
    /// Body bytes read.
    pub bytes: u64,
    /// From the request to the body's last byte, seconds.
    pub seconds: f64,
    /// The program's CPU seconds.
    pub client_cpu_s: f64,
    /// Packets its QUIC connection sent and received (HTTP/3 only).
    pub packets_sent: u64,
    /// See `packets_sent`.
    pub packets_received: u64,
}

/// One download of `path` from `server` over `proto` on one connection, by `cmd` (the program,
/// placed by the caller: a namespace, a CPU), within `limit`.
pub fn get(
    mut cmd: Command,
    server: SocketAddr,
    path: &str,
    proto: Proto,
    limit: Duration,
) -> Result<GetReport, String> {
    cmd.args(["--get", "--server", &server.to_string(), "--proto", proto.flag(), "--path", path])
        .args(["--duration", &format!("{:.3}", limit.as_secs_f64())]);
    let out = udpx_lab::netns::run_bounded(&mut cmd, limit + Duration::from_secs(10))
        .map_err(|e| format!("{PROGRAM} --get: {e}"))?;
    serde_json::from_str(out.trim()).map_err(|e| format!("{PROGRAM} --get's report: {e}: {out:.200}"))
}
