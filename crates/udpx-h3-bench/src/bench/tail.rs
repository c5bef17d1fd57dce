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
//! **Who asks.** quic-go's client ([`crate::independent`]) when `scripts/setup.sh` built it:
//! the server is judged by a client it was not built with; otherwise udpx's own
//! ([`crate::load`]), named in the table.
//!
//! **Rows and verdicts.** One row per controller (`--cc cubic`, `--cc bbr2`, each with its own
//! `--burst auto`), rounds interleaved; the median run by segment p99. Per round: CUBIC's p99
//! over BBRv2's (at most 1.0: CUBIC's tail no longer) and CUBIC's lost packets over BBRv2's,
//! one added to each (at most 1.5: no more loss through the bottleneck). A run with more than
//! 2 % steal on any online CPU counts in no median or verdict.

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

use super::rows::{footer, settle, tally};
use super::Scratch;
use crate::load::{LoadConfig, LoadReport};

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
    /// `--defer-flush` for the server.
    pub defer_flush: bool,
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
            defer_flush: true,
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
    /// Packets quiche declared lost (the server's count).
    pub lost: u64,
    /// QUIC packets the server sent.
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

/// One controller's runs.
#[derive(Debug, Clone, Serialize)]
pub struct TailRow {
    /// `--cc`.
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
    let quicgo = if cfg.own_client { None } else { crate::independent::find() };
    let mut client = String::new();
    let mut runs: Vec<Vec<Result<TailRun, String>>> = vec![Vec::new(); CCS.len()];
    let mut round = 0;
    while another_round(cfg.rounds, round, runs.iter().map(|r| tally(r, cfg.rounds, |x| x.p99_ms))) {
        for (i, &cc) in CCS.iter().enumerate() {
            let r = one_run(&net, &www, cc, cfg, quicgo.as_deref()).map(|(run, who)| {
                client = who;
                run
            });
            progress(&match &r {
                Ok(x) => format!(
                    "round {}/{}: --cc {cc}: p50 {:.1} ms, p99 {:.1} ms, {}/{} served, {} lost{}",
                    round + 1,
                    cfg.rounds,
                    x.p50_ms,
                    x.p99_ms,
                    x.served,
                    x.requests,
                    x.lost,
                    if x.steal.stolen { format!(", STOLEN {} (left out)", x.steal.pct()) } else { String::new() }
                ),
                Err(e) => format!("round {}/{}: --cc {cc}: failed: {e}", round + 1, cfg.rounds),
            });
            runs[i].push(r);
        }
        round += 1;
    }
    let rows: Vec<TailRow> = CCS
        .iter()
        .zip(runs)
        .map(|(cc, r)| {
            let (runs, median, error, kept) = settle(r, cfg.rounds, |x| x.p99_ms);
            TailRow { cc: cc.name().into(), runs, median, error, kept }
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
    sc.cc = cc;
    sc.quic.host.burst = cc.safe_burst();
    sc.quic.host.defer_flush = cfg.defer_flush;
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
            crate::independent::run(cmd, &lc, crate::independent::Proto::H3, cfg.segment)
        }
        None => net
            .ns(Node::Client)
            .try_run(move || crate::load::run(&lc).map_err(|e| e.to_string()))
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
    let run = TailRun {
        p50_ms: r.latency.p50_ms,
        p99_ms: r.latency.p99_ms,
        max_ms: r.latency.max_ms,
        requests: r.requests,
        served: r.served,
        late: r.late,
        unanswered: r.unanswered,
        lost: q.lost_packets,
        packets: q.packets_sent,
        client_cpu_pct: r.client_cpu_pct(),
        line_forwarded: line.forwarded,
        line_dropped: line.dropped,
        steal,
    };
    Ok((run, r.client))
}

/// Per round, CUBIC over BBRv2: segment p99, and lost packets plus one.
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
    out
}

/// The report.
pub fn table(b: &TailBench) -> String {
    use std::fmt::Write as _;
    let c = &b.config;
    let mut s = format!(
        "The viewers' tail through a bottleneck with a round trip: {} players x {} B every {:?} ({} ramp, {} \
         measured) by {}, through {} Mbit/s (tbf, {} ms of queue) and {} ms of round trip added by the router (a \
         user-space delay line); one server shard; {} rounds, controllers interleaved; medians by p99.\n\n",
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
        "| --cc | p50 ms | p99 ms | max ms | served | late | lost | packets | client CPU | line dropped | runs |"
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
