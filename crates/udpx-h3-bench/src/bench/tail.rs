//! `udpx bench h3 --bottleneck MBIT --rtt MS --viewers N`: the viewers' tail on a path with a
//! round-trip time and a bottleneck, CUBIC against BBRv2 (issue 47's fifth step).
//!
//! **Why.** Over veth the round trip is microseconds, which hides a congestion controller's
//! mistakes: a slow pacing model, a window that outgrows the queue, bursts a shallow queue
//! drops. A player that asks for a segment every interval idles between segments, and each
//! segment starts on what the controller kept from the last.
//!
//! **Where.** [`LineNet`]: server, router, client namespaces. The router delays every packet
//! it forwards by half the RTT each way ([`udpx_lab::netns::DelayLine`], in user space: this
//! kernel has no netem), and its egress toward the client is a token bucket at MBIT with a
//! queue of `--bottleneck-buffer` milliseconds. The server's GSO runs are split in software
//! before the router (`tx-udp-segmentation off`), so bursts arrive as bursts. One
//! `udpx h3 serve` shard in the server's namespace per run; the players in the client's.
//!
//! **Who asks.** quic-go's client ([`crate::clients::quicgo`]) when `scripts/setup.sh` built it:
//! the server is judged by a client it was not built with; otherwise udpx's own
//! ([`crate::clients::own`]), named in the table.
//!
//! **Rows and verdicts.** One row per controller (`--cc cubic`, `--cc bbr2`, each with its own
//! `--burst auto`), and nginx serving the same segment over HTTP/2 on TCP (the kernel's own
//! congestion control and pacing) to the same players when nginx and quic-go's client are
//! installed; rounds interleaved; the median run by segment p99. Per round: CUBIC's p99 over
//! BBRv2's (at most 1.0: CUBIC's tail no longer) and CUBIC's lost packets over BBRv2's, one
//! added to each (at most 1.5: no more loss through the bottleneck); and each controller
//! against nginx as issue 47 asks: segment p50 at most nginx's + 5 ms, p99 at most twice
//! nginx's + 5 ms (each a ratio to that bound, at most 1.0). nginx's lost and packets are the
//! server namespace's TCP retransmitted and sent segments. A run with more than 2 % steal on
//! any online CPU counts in no median or verdict.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use udpx_h3::server::Cc;
use udpx_h3::{serve, ServeConfig};
use udpx_lab::env::Environment;
use udpx_lab::judge::Check;
use udpx_lab::netns::{DelayCounters, LineConfig, LineNet, Node, Port, TbfLimit};
use udpx_lab::stats::{another_round, figures, Kept};
use udpx_lab::steal::{Steal, StealMeter, WithSteal};

use crate::clients::own::{LoadConfig, LoadReport};
use crate::lab::rows::{footer, settle, tally};
use crate::lab::Scratch;

/// The bench's settings.
#[derive(Debug, Clone, Serialize)]
pub struct TailConfig {
    /// The bottleneck's rate, Mbit/s.
    pub mbit: u64,
    /// Its queue, in time at the rate.
    pub buffer: Duration,
    /// The round trip the router adds (half each way).
    pub rtt: Duration,
    /// Players.
    pub viewers: usize,
    /// Bytes per segment.
    pub segment: u64,
    /// Between one request of a player and its next.
    pub interval: Duration,
    /// Player starts are spread over this.
    pub ramp: Duration,
    /// The measured window, after the ramp.
    pub window: Duration,
    /// Rounds.
    pub rounds: usize,
    /// How udpx's rows send (`udpx h3 serve`'s host flags), each row under its own
    /// controller (`--cc` is the row's; an auto `--burst` follows it).
    #[serde(flatten)]
    pub host: udpx_h3::Tuning,
    /// udpx's own client even when quic-go's is installed.
    pub own_client: bool,
}

impl TailConfig {
    /// 20 players x 512 KiB every second (about 84 Mbit/s) through 200 Mbit/s with 10 ms of
    /// queue and a 40 ms round trip; a 5 s ramp, 15 s measured, 3 rounds.
    pub fn new() -> TailConfig {
        TailConfig {
            mbit: 200,
            buffer: Duration::from_millis(10),
            rtt: Duration::from_millis(40),
            viewers: 20,
            segment: 512 << 10,
            interval: Duration::from_secs(1),
            ramp: Duration::from_secs(5),
            window: Duration::from_secs(15),
            rounds: 3,
            host: udpx_h3::Tuning::default(),
            own_client: false,
        }
    }

    /// Refuses settings no run can use, saying what to change.
    pub fn check(&self) -> Result<(), String> {
        if self.mbit == 0 || self.buffer.is_zero() {
            return Err("--bottleneck / --bottleneck-buffer: give a rate and a queue above 0".into());
        }
        if self.rtt.is_zero() || self.rtt > 2 * udpx_lab::netns::MAX_ONE_WAY {
            return Err(format!("--rtt {:?}: give 1 to 2000 ms", self.rtt));
        }
        if self.viewers == 0 || self.viewers > 10_000 {
            return Err(format!("--viewers {}: give 1 to 10000", self.viewers));
        }
        if self.segment == 0 || self.rounds == 0 || self.interval.is_zero() || self.window.is_zero() {
            return Err("--segment, --rounds, --interval and --window: give each above 0".into());
        }
        Ok(())
    }
}

impl Default for TailConfig {
    fn default() -> Self {
        TailConfig::new()
    }
}

/// The controllers compared, in table order.
pub const CCS: [Cc; 2] = [Cc::Cubic, Cc::Bbr2];

/// nginx's row (HTTP/2 over TCP).
pub const NGINX: &str = "nginx-h2";

/// What serves a row: `udpx h3 serve` with a controller, or nginx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Udpx(Cc),
    Nginx,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::Udpx(cc) => cc.name(),
            Server::Nginx => NGINX,
        }
    }
}

/// One run: the players' figures and the server's.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TailRun {
    /// Segment latency (request to last byte), median, ms.
    pub p50_ms: f64,
    /// Its 99th percentile, ms.
    pub p99_ms: f64,
    /// Its largest, ms.
    pub max_ms: f64,
    /// Requests of the window.
    pub requests: u64,
    /// Of them served whole.
    pub served: u64,
    /// Served slower than the interval.
    pub late: u64,
    /// Never answered.
    pub unanswered: u64,
    /// Packets quiche declared lost (the server's count; nginx: TCP segments retransmitted).
    pub lost: u64,
    /// QUIC packets the server sent (nginx: TCP segments).
    pub packets: u64,
    /// The client's CPU over the window, percent of one CPU.
    pub client_cpu_pct: f64,
    /// What the delay line forwarded and dropped.
    pub line_forwarded: u64,
    /// See `line_forwarded`.
    pub line_dropped: u64,
    /// The steal from every online CPU over the window.
    #[serde(flatten)]
    pub steal: Steal,
}

impl WithSteal for TailRun {
    fn steal(&self) -> &Steal {
        &self.steal
    }
}

/// One row's runs.
#[derive(Debug, Clone, Serialize)]
pub struct TailRow {
    /// `--cc` of udpx's rows, or [`NGINX`].
    pub cc: String,
    /// Per round (`None`: the run failed).
    pub runs: Vec<Option<TailRun>>,
    /// The median clean run by p99.
    pub median: Option<TailRun>,
    /// The first failure.
    pub error: Option<String>,
    /// Runs planned, clean, stolen and failed.
    pub kept: Kept,
}

/// The result.
#[derive(Debug, Clone, Serialize)]
pub struct TailBench {
    /// Settings.
    pub config: TailConfig,
    /// The players' client.
    pub client: String,
    /// One row per controller.
    pub rows: Vec<TailRow>,
    /// Per-round ratios, CUBIC over BBRv2.
    pub checks: Vec<Check>,
    /// Kernel, CPU, devices.
    pub environment: Environment,
}

/// Runs the bench. `Ok(None)`: not root.
pub fn run(cfg: &TailConfig, progress: &mut dyn FnMut(&str)) -> Result<Option<TailBench>, String> {
    if !udpx_lab::netns::is_root() {
        return Ok(None);
    }
    cfg.check()?;
    let scratch = Scratch::new()?;
    let www = scratch.0.join("www");
    std::fs::write(www.join("segment"), udpx_lab::pattern(cfg.segment as usize, 5)).map_err(|e| e.to_string())?;
    let net = LineNet::setup(&LineConfig::default()).map_err(|e| format!("the line: {e}"))?;
    net.tbf(cfg.mbit * 1_000_000, 3_000, TbfLimit::Latency(cfg.buffer)).map_err(|e| format!("tbf: {e}"))?;
    net.set_features(Port::Server, &[("tx-udp-segmentation", "off")]).map_err(|e| format!("offloads: {e}"))?;
    let quicgo = if cfg.own_client { None } else { crate::clients::quicgo::find() };
    // nginx beside udpx when the players can speak HTTP/2 to it (udpx's own client cannot).
    let nginx = quicgo.as_ref().and(udpx_lab::netns::find_in_path("nginx"));
    let mut servers: Vec<Server> = CCS.iter().map(|&cc| Server::Udpx(cc)).collect();
    if nginx.is_some() {
        servers.push(Server::Nginx);
        let (cert, key) = (scratch.0.join("cert.pem"), scratch.0.join("key.pem"));
        crate::lab::write_cert(&cert, &key)?;
    } else {
        progress("no nginx row: it needs nginx and quic-go's client (scripts/setup.sh installs both)");
    }
    let mut client = String::new();
    let mut runs: Vec<Vec<Result<TailRun, String>>> = vec![Vec::new(); servers.len()];
    let mut round = 0;
    while another_round(cfg.rounds, round, runs.iter().map(|r| tally(r, cfg.rounds, |x| x.p99_ms))) {
        for (i, &server) in servers.iter().enumerate() {
            let cc = match server {
                Server::Udpx(cc) => format!("--cc {}", cc.name()),
                Server::Nginx => NGINX.to_string(),
            };
            let r = match server {
                Server::Udpx(cc) => one_run(&net, &www, cc, cfg, quicgo.as_deref()).map(|(run, who)| {
                    client = who;
                    run
                }),
                Server::Nginx => {
                    nginx_run(&net, &scratch.0, nginx.as_deref(), cfg, quicgo.as_deref()).map(|(run, _)| run)
                }
            };
            progress(&match &r {
                Ok(x) => format!(
                    "round {}/{}: {cc}: p50 {:.1} ms, p99 {:.1} ms, {}/{} served, {} lost{}",
                    round + 1,
                    cfg.rounds,
                    x.p50_ms,
                    x.p99_ms,
                    x.served,
                    x.requests,
                    x.lost,
                    if x.steal.stolen { format!(", STOLEN {} (left out)", x.steal.pct()) } else { String::new() }
                ),
                Err(e) => format!("round {}/{}: {cc}: failed: {e}", round + 1, cfg.rounds),
            });
            runs[i].push(r);
        }
        round += 1;
    }
    let rows: Vec<TailRow> = servers
        .iter()
        .zip(runs)
        .map(|(server, r)| {
            let (runs, median, error, kept) = settle(r, cfg.rounds, |x| x.p99_ms);
            TailRow { cc: server.name().into(), runs, median, error, kept }
        })
        .collect();
    let checks = judge(&rows);
    let environment = Environment::collect(&[
        (Some(net.ns(Node::Server)), net.dev(Port::Server)),
        (Some(net.ns(Node::Router)), net.dev(Port::RouterClient)),
    ]);
    Ok(Some(TailBench { config: cfg.clone(), client, rows, checks, environment }))
}

/// One controller's run: the server started, the line's delay on, the players' window.
fn one_run(
    net: &LineNet,
    www: &std::path::Path,
    cc: Cc,
    cfg: &TailConfig,
    quicgo: Option<&std::path::Path>,
) -> Result<(TailRun, String), String> {
    let mut sc = ServeConfig::new(SocketAddr::from((net.addr(Port::Server), 4433)));
    sc.quic.shards = 1;
    cfg.host.with_cc(cc).apply(&mut sc);
    let root = www.to_path_buf();
    let server = net.ns(Node::Server).try_run(move || serve(&root, &sc)).map_err(|e| e.to_string())?;
    let server = server.map_err(|e| format!("server: {e}"))?;
    let line = net.delay(cfg.rtt / 2).map_err(|e| format!("the delay line: {e}"))?;
    let mut lc = LoadConfig::new(server.local_addr(), cfg.viewers, "/segment", cfg.interval);
    (lc.ramp, lc.duration) = (cfg.ramp, cfg.window);
    let steal = StealMeter::start(&udpx_lab::cpu::online_cpus());
    let report: Result<LoadReport, String> = match quicgo {
        Some(program) => {
            let cmd = net.ns(Node::Client).command(&program.to_string_lossy());
            crate::clients::quicgo::run(cmd, &lc, crate::clients::quicgo::Proto::H3, cfg.segment)
        }
        None => net
            .ns(Node::Client)
            .try_run(move || crate::clients::own::run(&lc).map_err(|e| e.to_string()))
            .map_err(|e| e.to_string())
            .and_then(|r| r),
    };
    let steal = steal.stop().unwrap_or_default();
    let counters = server.stop().map_err(|e| format!("server stop: {e}"))?;
    let line: DelayCounters = line.stop().map_err(|e| e.to_string())?;
    let r = report?;
    if r.requests == 0 {
        return Err(format!("no request in the window: {}", r.summary()));
    }
    let q = &counters.quic;
    Ok((tail_run(&r, (q.lost_packets, q.packets_sent), &line, steal), r.client))
}

/// A run's row from the players' report, the server's (lost, sent) and the delay line's counts.
fn tail_run(r: &LoadReport, (lost, packets): (u64, u64), line: &DelayCounters, steal: Steal) -> TailRun {
    TailRun {
        p50_ms: r.latency.p50_ms,
        p99_ms: r.latency.p99_ms,
        max_ms: r.latency.max_ms,
        requests: r.requests,
        served: r.served,
        late: r.late,
        unanswered: r.unanswered,
        lost,
        packets,
        client_cpu_pct: r.client_cpu_pct(),
        line_forwarded: line.forwarded,
        line_dropped: line.dropped,
        steal,
    }
}

/// nginx's run: HTTP/2 over TLS on TCP in the server's namespace, one worker, the same segment,
/// the same players over HTTP/2; its lost and packets the namespace's TCP segments
/// retransmitted and sent over the run.
fn nginx_run(
    net: &LineNet,
    dir: &std::path::Path,
    nginx: Option<&std::path::Path>,
    cfg: &TailConfig,
    quicgo: Option<&std::path::Path>,
) -> Result<(TailRun, String), String> {
    let (Some(nginx), Some(program)) = (nginx, quicgo) else {
        return Err("nginx and quic-go's client are both needed".into());
    };
    let addr = SocketAddr::from((net.addr(Port::Server), 8443));
    let ndir = dir.join("nginx");
    let _ = std::fs::remove_dir_all(&ndir);
    std::fs::create_dir_all(&ndir).map_err(|e| e.to_string())?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let conf =
        crate::lab::nginx::nginx_conf(&ndir, &dir.join("www"), addr, (&cert, &key), crate::lab::nginx::SINGLE_PROCESS);
    std::fs::write(ndir.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
    let log = ndir.join("out.log");
    let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let mut c = net.ns(Node::Server).command(&nginx.to_string_lossy());
    c.arg("-p").arg(&ndir).arg("-c").arg(ndir.join("nginx.conf")).arg("-e").arg(ndir.join("error.log"));
    c.stdin(std::process::Stdio::null()).stdout(logf.try_clone().map_err(|e| e.to_string())?).stderr(logf);
    let _server = udpx_lab::netns::ChildGroup::spawn(&mut c).map_err(|e| format!("starting nginx: {e}"))?;
    let ns = net.ns(Node::Client);
    crate::lab::process::wait_until_up("nginx", &log, || {
        ns.try_run(move || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
            .unwrap_or(false)
    })?;
    let line = net.delay(cfg.rtt / 2).map_err(|e| format!("the delay line: {e}"))?;
    let before = tcp_segments(net)?;
    let mut lc = LoadConfig::new(addr, cfg.viewers, "/segment", cfg.interval);
    (lc.ramp, lc.duration) = (cfg.ramp, cfg.window);
    let steal = StealMeter::start(&udpx_lab::cpu::online_cpus());
    let cmd = net.ns(Node::Client).command(&program.to_string_lossy());
    let report = crate::clients::quicgo::run(cmd, &lc, crate::clients::quicgo::Proto::H2, cfg.segment);
    let steal = steal.stop().unwrap_or_default();
    let after = tcp_segments(net)?;
    let line: DelayCounters = line.stop().map_err(|e| e.to_string())?;
    let r = report?;
    if r.requests == 0 {
        return Err(format!("no request in the window: {}", r.summary()));
    }
    let segments = (after.1.saturating_sub(before.1), after.0.saturating_sub(before.0));
    Ok((tail_run(&r, segments, &line, steal), r.client))
}

/// The server namespace's TCP segments sent and retransmitted (`/proc/net/snmp` as the
/// namespace sees it).
fn tcp_segments(net: &LineNet) -> Result<(u64, u64), String> {
    let text = net
        .ns(Node::Server)
        .try_run(|| std::fs::read_to_string("/proc/thread-self/net/snmp"))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("/proc/net/snmp: {e}"))?;
    parse_tcp_segments(&text).ok_or_else(|| "/proc/net/snmp: no Tcp OutSegs and RetransSegs".into())
}

/// OutSegs and RetransSegs from the text of `/proc/net/snmp` (a `Tcp:` line of names, then one
/// of values).
fn parse_tcp_segments(text: &str) -> Option<(u64, u64)> {
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let pairs: Vec<(&str, &str)> = names.split_whitespace().zip(values.split_whitespace()).collect();
    let get = |k: &str| pairs.iter().find(|(n, _)| *n == k).and_then(|(_, v)| v.parse().ok());
    Some((get("OutSegs")?, get("RetransSegs")?))
}

/// Per round, CUBIC over BBRv2: segment p99, and lost packets plus one; each controller
/// against nginx (when it ran): p50 over nginx's + 5 ms, p99 over twice nginx's + 5 ms.
fn judge(rows: &[TailRow]) -> Vec<Check> {
    let (Some(cubic), Some(bbr2)) = (rows.iter().find(|r| r.cc == "cubic"), rows.iter().find(|r| r.cc == "bbr2"))
    else {
        return Vec::new();
    };
    let field = |r: &TailRow, f: &dyn Fn(&TailRun) -> f64| figures(&r.runs, f);
    let mut out = Vec::new();
    out.extend(Check::judge(
        "tail",
        "segment p99, cubic / bbr2",
        &field(cubic, &|x| x.p99_ms),
        &field(bbr2, &|x| x.p99_ms),
        1.0,
    ));
    out.extend(Check::judge(
        "tail",
        "lost packets +1, cubic / bbr2",
        &field(cubic, &|x| x.lost as f64 + 1.0),
        &field(bbr2, &|x| x.lost as f64 + 1.0),
        1.5,
    ));
    if let Some(nginx) = rows.iter().find(|r| r.cc == NGINX) {
        for udpx in [cubic, bbr2] {
            out.extend(Check::judge(
                "tail",
                &format!("segment p50, {} / (nginx + 5 ms)", udpx.cc),
                &field(udpx, &|x| x.p50_ms),
                &field(nginx, &|x| x.p50_ms + 5.0),
                1.0,
            ));
            out.extend(Check::judge(
                "tail",
                &format!("segment p99, {} / (2 x nginx + 5 ms)", udpx.cc),
                &field(udpx, &|x| x.p99_ms),
                &field(nginx, &|x| 2.0 * x.p99_ms + 5.0),
                1.0,
            ));
        }
    }
    out
}

/// The report.
pub fn table(b: &TailBench) -> String {
    use std::fmt::Write as _;
    let c = &b.config;
    let mut s = format!(
        "The viewers' tail through a bottleneck with a round trip: {} players x {} B every {:?} ({} ramp, {} \
         measured) by {} (nginx's by the same program over HTTP/2), through {} Mbit/s (tbf, {} ms of queue) and {} ms of round trip added by the router (a \
         user-space delay line); one server shard (nginx: one worker, HTTP/2 over TCP); {} rounds, rows \
         interleaved; medians by p99.\n\n",
        c.viewers,
        c.segment,
        c.interval,
        format_args!("{:?}", c.ramp),
        format_args!("{:?}", c.window),
        b.client,
        c.mbit,
        c.buffer.as_millis(),
        c.rtt.as_millis(),
        c.rounds
    );
    let _ = writeln!(
        s,
        "| server | p50 ms | p99 ms | max ms | served | late | lost | packets | client CPU | line dropped | runs |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &b.rows {
        match &r.median {
            Some(m) => {
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {:.1} | {:.1} | {}/{} | {} | {} | {} | {:.0} % | {} | {} |",
                    r.cc,
                    m.p50_ms,
                    m.p99_ms,
                    m.max_ms,
                    m.served,
                    m.requests,
                    m.late,
                    m.lost,
                    m.packets,
                    m.client_cpu_pct,
                    m.line_dropped,
                    r.kept.cell()
                );
            }
            None => {
                let why =
                    r.kept.no_figure().unwrap_or_else(|| format!("failed: {}", r.error.as_deref().unwrap_or("?")));
                let _ = writeln!(s, "| {} | {why} |", r.cc);
            }
        }
    }
    let extra = b.rows.iter().map(|r| r.runs.len().saturating_sub(c.rounds)).max().unwrap_or(0);
    let steals = b.rows.iter().flat_map(|r| r.runs.iter().flatten()).map(|x| &x.steal);
    footer(&mut s, steals, extra, &b.checks, c.rounds, &b.environment);
    s
}

#[cfg(test)]
mod tests {
    use super::parse_tcp_segments;

    #[test]
    fn tcp_segments_are_read_by_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin OutSegs RetransSegs InErrs\n\
                    Tcp: 1 200 12345 67 0\nUdp: InDatagrams\nUdp: 5\n";
        assert_eq!(parse_tcp_segments(snmp), Some((12345, 67)));
        assert_eq!(parse_tcp_segments("Tcp: OutSegs\nTcp: x\n"), None);
        assert_eq!(parse_tcp_segments(""), None);
    }
}
