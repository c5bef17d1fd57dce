//! `udpx bench h3 --restart PLAYERS`: what a change costs the viewers. Under a player load
//! (PLAYERS players, a 64 KiB segment every 2 s each, [`crate::clients::own`]) one row per way of
//! changing the server, each applied `--restart-changes` times over the window:
//!
//! - **udpx upgrade**: `udpx h3 serve ... --upgrade` started beside the running one
//!   ([`udpx_quic::upgrade`]): it takes new connections, the old one drains and exits;
//! - **udpx h2+h3 upgrade**: the same with HTTPS over TCP on the same port (`--alt-svc-tcp`,
//!   its listener handed over with the QUIC port), half the players over HTTP/2 (hyper) and
//!   half over HTTP/3 (quinn), the downloads curl's over HTTP/2;
//! - **udpx reload**: SIGHUP (the certificate and key read again);
//! - **udpx restart**: the naive way, stop (SIGINT) then start again (what is saved);
//! - **nginx reload** and **nginx binary upgrade** (HTTPS over TCP, HTTP/2, one worker):
//!   SIGHUP; SIGUSR2, then SIGWINCH and SIGQUIT to the old master (nginx's documented
//!   procedure), for reference: over TCP both are known to keep every connection.
//!
//! **Where.** Two namespaces over a veth pair (root only: the upgrade's eBPF steering and the
//! namespaces need it); the servers pinned to the last CPU, the client to the first. Every udpx
//! server of a row shares one key file (what a deployment has: tokens, tickets and resets
//! good across processes).
//!
//! **What is reported per row.** Requests sent, served, failed (an error status, a reset, a
//! connection gone under a request) and unanswered at the end; connections that ended early
//! (broken: not a GOAWAY the client followed); connections the client moved to a new one on a
//! GOAWAY; p99 latency of the requests sent in the 2 s after each change against the p99 of
//! the rest; per change, how long until the process it replaced was gone (the old process's
//! exit for an upgrade, the new one's start for a restart). udpx's own clients play (over
//! QUIC and over TCP): they follow GOAWAY and retry a refused request, as browsers do; the
//! figures are counts, not timings, except the p99 columns.
//!
//! **Steal.** Each row is one run; it records the hypervisor's steal from the server's and the
//! client's CPUs over it ([`udpx_lab::steal`]). A row over the limit keeps its counts, but its
//! p99 columns (timings) are not quoted.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use udpx_lab::env::Environment;
use udpx_lab::netns::{ChildGroup, GroupGuard, Profile, Side, TestNet, TestNetConfig};
use udpx_lab::steal::{Steal, StealMeter};

use crate::clients::own::{self, LoadConfig, LoadReport};
use crate::clients::quinn_hyper::{self, HyperHttp};
use crate::lab::{write_cert, Scratch};

/// The file every player asks for.
const SEGMENT: &str = "segment";
/// The file the rate-limited downloads fetch.
const DOWNLOAD: &str = "download";
/// How long after a change its requests count as "during" it.
pub const NEAR: Duration = Duration::from_secs(2);
/// The servers' port (UDP for udpx, TCP for nginx).
const PORT: u16 = 4433;

/// The bench's settings.
#[derive(Debug, Clone, Serialize)]
pub struct RestartConfig {
    /// Players.
    pub players: usize,
    /// Seconds between a player's requests.
    pub interval: Duration,
    /// The segment, bytes.
    pub segment: usize,
    /// The measured window (the changes fall inside it).
    pub window: Duration,
    /// Changes per row, spread evenly over the window.
    pub changes: usize,
    /// `udpx h3 serve --drain-timeout`: longer than the window, so that an old process keeps
    /// its download to the end.
    pub drain_timeout: Duration,
    /// Downloads through the window, each rate-limited by its client so that it spans every
    /// change.
    pub downloads: usize,
    /// Each download's rate, bytes a second (its file is the rate times the window).
    pub download_rate: u64,
    /// curl, for the downloads from nginx.
    pub curl: Option<PathBuf>,
    /// The `udpx` binary.
    pub udpx: PathBuf,
    /// nginx (`None`: its rows are left out, said in the table).
    pub nginx: Option<PathBuf>,
    /// How the udpx servers send (`udpx h3 serve`'s host flags).
    #[serde(flatten)]
    pub host: udpx_h3::Tuning,
}

impl RestartConfig {
    /// The schedule: 2,000 players, 64 KiB every 2 s, three changes in 60 s.
    pub fn new(udpx: PathBuf) -> RestartConfig {
        RestartConfig {
            players: 2000,
            interval: Duration::from_secs(2),
            segment: 64 << 10,
            window: Duration::from_secs(60),
            changes: 3,
            drain_timeout: Duration::from_secs(90),
            downloads: 4,
            download_rate: 1 << 20,
            host: udpx_h3::Tuning::default(),
            udpx,
            nginx: crate::lab::Programs::from_path().nginx,
            curl: crate::lab::Programs::from_path().curl,
        }
    }
}

/// A way of changing the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Change {
    /// `udpx h3 serve --upgrade` beside the running one.
    UdpxUpgrade,
    /// The same, the players on quinn's HTTP/3 client (a client udpx did not write,
    /// [`crate::clients::quinn_hyper`]), which follows GOAWAY as browsers do.
    UdpxUpgradeQuinn,
    /// The same with HTTPS over TCP beside (`--alt-svc-tcp` on the same port, handed over with
    /// the QUIC one): half the players on hyper's HTTP/2 client over TCP, half on quinn's
    /// HTTP/3 client, the downloads curl's over HTTP/2 (clients udpx did not write).
    UdpxUpgradeH2H3,
    /// SIGHUP to udpx.
    UdpxReload,
    /// SIGINT to udpx, then the same command again.
    UdpxRestart,
    /// SIGHUP to nginx's master.
    NginxReload,
    /// SIGUSR2, SIGWINCH, SIGQUIT to nginx's master.
    NginxUpgrade,
}

impl Change {
    /// Every row, in table order.
    pub const ALL: [Change; 7] = [
        Change::UdpxUpgrade,
        Change::UdpxUpgradeQuinn,
        Change::UdpxUpgradeH2H3,
        Change::UdpxReload,
        Change::UdpxRestart,
        Change::NginxReload,
        Change::NginxUpgrade,
    ];

    /// The row's name.
    pub fn name(self) -> &'static str {
        match self {
            Change::UdpxUpgrade => "udpx h3: upgrade (--upgrade)",
            Change::UdpxUpgradeQuinn => "udpx h3: upgrade, quinn's client",
            Change::UdpxUpgradeH2H3 => "udpx h2+h3: upgrade, hyper h2 + quinn h3",
            Change::UdpxReload => "udpx h3: reload (SIGHUP)",
            Change::UdpxRestart => "udpx h3: restart (stop, start)",
            Change::NginxReload => "nginx h2: reload (SIGHUP)",
            Change::NginxUpgrade => "nginx h2: binary upgrade (USR2, WINCH, QUIT)",
        }
    }

    fn nginx(self) -> bool {
        matches!(self, Change::NginxReload | Change::NginxUpgrade)
    }

    /// Whether the row's players and downloads go over TCP (all of them, or half the players
    /// and every download in the HTTP/2 + HTTP/3 row).
    fn tcp(self) -> bool {
        self.nginx() || self == Change::UdpxUpgradeH2H3
    }
}

/// One change of a row.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeRun {
    /// When, seconds into the window.
    pub at_s: f64,
    /// How long until the process it replaced was gone (upgrade: the old one's exit; restart:
    /// the new one's start), seconds; `None` for a reload, or when it did not happen.
    pub replaced_after_s: Option<f64>,
    /// What went wrong applying it.
    pub error: Option<String>,
}

/// One row.
#[derive(Debug, Clone, Serialize)]
pub struct RestartRow {
    /// Which change.
    pub change: Change,
    /// The client's figures (in the HTTP/2 + HTTP/3 row, the HTTP/3 half's).
    pub load: Option<LoadReport>,
    /// The HTTP/2 half's, in the HTTP/2 + HTTP/3 row.
    pub load_h2: Option<LoadReport>,
    /// Each change.
    pub changes: Vec<ChangeRun>,
    /// p99 of the requests sent in the [`NEAR`] after a change, ms.
    pub p99_near_ms: Option<f64>,
    /// p99 of the others, ms.
    pub p99_away_ms: Option<f64>,
    /// Requests sent near a change that failed.
    pub failed_near: u64,
    /// Downloads that did not end whole (an error, another status, fewer bytes), of
    /// [`RestartConfig::downloads`].
    pub downloads_broken: usize,
    /// What broke them.
    pub download_errors: Vec<String>,
    /// Why the row did not run, or broke.
    pub error: Option<String>,
    /// The steal from the server's and the client's CPUs over the row (`steal_s`,
    /// `steal_share`, `stolen`: then its p99 columns are not quoted).
    #[serde(flatten)]
    pub steal: Steal,
    /// The share of the row's wall time the server's CPU and the client's CPU were busy
    /// (`/proc/stat`: user, system, irq and softirq), each 0-1: which side limits the row's
    /// timings ([`BUSY_LIMIT`]).
    pub server_busy: Option<f64>,
    pub client_busy: Option<f64>,
}

/// A CPU busy this share of a row or more limits that side: its p99 columns are the machine's.
pub const BUSY_LIMIT: f64 = 0.95;

/// The bench.
#[derive(Debug, Clone, Serialize)]
pub struct RestartBench {
    /// The machine and the path.
    pub environment: Environment,
    /// The settings.
    pub config: RestartConfig,
    /// One row per change.
    pub rows: Vec<RestartRow>,
}

/// Runs every row; `None` without root (the namespaces and the eBPF steering need it).
pub fn run(cfg: &RestartConfig, progress: &mut dyn FnMut(&str)) -> Result<Option<RestartBench>, String> {
    if !udpx_lab::netns::is_root() {
        return Ok(None);
    }
    if cfg.players == 0 || cfg.changes == 0 || cfg.window < Duration::from_secs(4) {
        return Err("give at least one player, one change and a window of 4 s or more".into());
    }
    let net = TestNet::setup(&TestNetConfig::new(Profile::Offload)).map_err(|e| format!("veth pair: {e}"))?;
    let environment = Environment::collect(&[(Some(&net.rx), &net.rx_dev), (Some(&net.tx), &net.tx_dev)]);
    let scratch = Scratch::new()?;
    let dir = scratch.0.as_path();
    let www = dir.join("www");
    std::fs::create_dir_all(&www).map_err(|e| e.to_string())?;
    std::fs::write(www.join(SEGMENT), vec![0x5a; cfg.segment]).map_err(|e| e.to_string())?;
    let download_size = cfg.download_rate.saturating_mul(cfg.window.as_secs()).max(1);
    std::fs::write(www.join(DOWNLOAD), vec![0xa5; download_size as usize]).map_err(|e| e.to_string())?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    write_cert(&cert, &key)?;
    let key_file = dir.join("service.key");
    let mut secret = [0u8; 32];
    udpx_quic::cid::random_bytes(&mut secret).map_err(|e| e.to_string())?;
    std::fs::write(&key_file, secret.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .map_err(|e| e.to_string())?;
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| e.to_string())?;
    let cpus = udpx_lab::cpu::online_cpus();
    let (client_cpu, server_cpu) = (cpus[0], *cpus.last().unwrap_or(&0));
    let lab = Lab { net: &net, dir, www: &www, cert: &cert, key: &key, key_file: &key_file, server_cpu, client_cpu };
    let mut rows = Vec::new();
    for change in Change::ALL {
        if change.nginx() && cfg.nginx.is_none() {
            rows.push(RestartRow::failed(change, "nginx not found (scripts/setup.sh installs it)".into()));
            continue;
        }
        progress(&format!(
            "{} x{} under {} players for {} s",
            change.name(),
            cfg.changes,
            cfg.players,
            cfg.window.as_secs()
        ));
        let meter = StealMeter::start(&[server_cpu, client_cpu]);
        let mut row = one_row(cfg, &lab, change).unwrap_or_else(|e| RestartRow::failed(change, e));
        // One reading of /proc/stat for the row's steal and both CPUs' busy shares.
        if let Some((steal, d, rate)) = meter.stop_with_times() {
            row.steal = steal;
            let busy = |cpu: usize| {
                let wall = d.elapsed.as_secs_f64();
                (wall > 0.0).then(|| d.busy_time(&[cpu], rate).as_secs_f64() / wall)
            };
            (row.server_busy, row.client_busy) = (busy(server_cpu), busy(client_cpu));
        }
        if let Some(l) = &row.load {
            progress(&format!("  {}", l.summary()));
        }
        rows.push(row);
    }
    Ok(Some(RestartBench { environment, config: cfg.clone(), rows }))
}

impl RestartRow {
    fn failed(change: Change, error: String) -> RestartRow {
        RestartRow {
            change,
            load: None,
            load_h2: None,
            changes: Vec::new(),
            p99_near_ms: None,
            p99_away_ms: None,
            failed_near: 0,
            downloads_broken: 0,
            download_errors: Vec::new(),
            error: Some(error),
            steal: Steal::default(),
            server_busy: None,
            client_busy: None,
        }
    }
}

/// How a row's udpx server starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// On its own.
    Fresh,
    /// Taking over from the one running (`--upgrade`).
    Upgrade,
}

struct Lab<'a> {
    net: &'a TestNet,
    dir: &'a Path,
    www: &'a Path,
    cert: &'a Path,
    key: &'a Path,
    key_file: &'a Path,
    server_cpu: usize,
    client_cpu: usize,
}

impl Lab<'_> {
    fn addr(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.net.rx_v4), PORT)
    }

    /// `udpx h3 serve` on the server's CPU in its namespace, its output in `log`, started as
    /// `start` says. With `tcp`: HTTPS over TCP on the same address (`--alt-svc-tcp`).
    fn udpx(&self, cfg: &RestartConfig, log: &Path, start: Start, tcp: bool) -> Result<ChildGroup, String> {
        let upgrade = start == Start::Upgrade;
        let mut c = self.net.ns(Side::Rx).command("taskset");
        c.args(["-c", &self.server_cpu.to_string()]).arg(&cfg.udpx);
        c.args(["h3", "serve"]).arg(self.www).args(["--listen", &self.addr().to_string()]);
        c.arg("--cert").arg(self.cert).arg("--key").arg(self.key).arg("--key-file").arg(self.key_file);
        c.args(["--shards", "1", "--drain-timeout", &cfg.drain_timeout.as_secs().to_string()]);
        c.args(cfg.host.serve_args());
        c.arg("--upgrade-socket").arg(self.dir.join("handover.sock"));
        c.args(["-l", &(cfg.window + Duration::from_secs(120)).as_secs().to_string()]);
        // Every player and download comes from the client's one address. The per-address
        // bound on open files is meant for a household or a small NAT (256 by default); here
        // it refused the lab's own players with 503 whenever the server fell behind by a
        // quarter second (1,000 requests a second): thousands of failures a row that were
        // the lab's, not the upgrade's. The address's share is all of them.
        let files = (cfg.players + cfg.downloads + 16).max(udpx_h3::DEFAULT_MAX_OPEN_PER_SHARD);
        c.args(["--max-open-per-addr", &files.to_string(), "--max-open-per-shard", &files.to_string()]);
        if upgrade {
            c.arg("--upgrade");
        }
        if tcp {
            // Every player and download comes from the client's one address: its share of
            // the TCP connections is all of them (nginx has no per-address cap either).
            let cap = (cfg.players + cfg.downloads + 16).max(1024).to_string();
            c.args(["--alt-svc-tcp", &self.addr().to_string()]);
            c.args(["--tcp-max-connections", &cap, "--tcp-per-source", &cap]);
        }
        let child = spawn(&mut c, log)?;
        let ready = if upgrade { "took new connections over" } else { " on https://" };
        crate::lab::process::wait_until_up("udpx h3 serve", log, || {
            std::fs::read_to_string(log).unwrap_or_default().contains(ready)
        })?;
        Ok(child)
    }

    /// nginx with a master and one worker, HTTP/2 over TLS on the port. A binary upgrade needs
    /// `daemon on` (a master whose parent never changed ignores SIGUSR2, taking itself for the
    /// new binary): the daemon's group is then adopted by its pid file.
    fn nginx(&self, nginx: &Path, log: &Path, daemon: bool) -> Result<Server, String> {
        let ndir = self.dir.join("nginx");
        let _ = std::fs::remove_dir_all(&ndir);
        std::fs::create_dir_all(&ndir).map_err(|e| e.to_string())?;
        let processes = format!("daemon {};\nmaster_process on;\n", if daemon { "on" } else { "off" });
        let conf = crate::lab::nginx::nginx_conf(&ndir, self.www, self.addr(), (self.cert, self.key), &processes);
        std::fs::write(ndir.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
        let mut c = self.net.ns(Side::Rx).command("taskset");
        c.args(["-c", &self.server_cpu.to_string()]).arg(nginx);
        c.arg("-p").arg(&ndir).arg("-c").arg(ndir.join("nginx.conf")).arg("-e").arg(ndir.join("error.log"));
        let child = spawn(&mut c, log)?;
        let addr = self.addr();
        let ns = self.net.ns(Side::Tx);
        crate::lab::process::wait_until_up("nginx", log, || {
            ns.try_run(move || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
                .unwrap_or(false)
        })?;
        if !daemon {
            return Ok(Server { pid: child.id(), _child: Some(child), _daemon: None });
        }
        // The daemon writes its pid file after it detached (its sockets listen before that).
        if !udpx_lab::wait_until(Duration::from_secs(5), || master_pid(&ndir, 0).is_some()) {
            return Err("nginx wrote no pid file in 5 s".into());
        }
        let pid = master_pid(&ndir, 0).ok_or("nginx's pid file")?;
        Ok(Server { pid, _child: Some(child), _daemon: Some(GroupGuard::adopt(pid)) })
    }
}

/// A server of a row: the process to signal and what ends it.
struct Server {
    pid: u32,
    _child: Option<ChildGroup>,
    _daemon: Option<GroupGuard>,
}

impl Server {
    fn of(child: ChildGroup) -> Server {
        Server { pid: child.id(), _child: Some(child), _daemon: None }
    }
}

/// The pid in nginx's pid file under `ndir`, if it is not `not`.
fn master_pid(ndir: &Path, not: u32) -> Option<u32> {
    std::fs::read_to_string(ndir.join("nginx.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .filter(|&p| p != not)
}

fn spawn(c: &mut Command, log: &Path) -> Result<ChildGroup, String> {
    let f = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| e.to_string())?;
    c.stdin(Stdio::null()).stdout(f.try_clone().map_err(|e| e.to_string())?).stderr(f);
    ChildGroup::spawn(c).map_err(|e| format!("start: {e}"))
}

fn signal(pid: u32, s: Signal) -> Result<(), String> {
    kill(Pid::from_raw(pid as i32), s).map_err(|e| format!("{s} to {pid}: {e}"))
}

/// Waits for `child` to exit (up to `limit`, then kills its group) in a thread; the thread's
/// answer: when it exited.
fn exit_watch(child: ChildGroup, limit: Duration) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || match child.wait_timeout(limit) {
        Ok(Some(_)) => Some(Instant::now()),
        _ => None,
    })
}

/// A row's requests split by whether they were sent within [`NEAR`] after a change.
struct ByNearness {
    /// Latencies (µs) of the requests sent near a change.
    near: Vec<u32>,
    /// Latencies (µs) of the others.
    away: Vec<u32>,
    /// Requests sent near a change that failed.
    failed_near: u64,
}

impl ByNearness {
    /// Splits the window's requests of the clients' `loads` by the `changes`' times.
    fn of<'a>(changes: &[ChangeRun], loads: impl Iterator<Item = &'a LoadReport> + Clone) -> ByNearness {
        let near = |ms: u32| {
            changes.iter().any(|c| {
                let t = c.at_s * 1000.0;
                f64::from(ms) >= t && f64::from(ms) < t + NEAR.as_secs_f64() * 1000.0
            })
        };
        let (mut inside, mut outside): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
        for &(at, us) in loads.clone().flat_map(|l| &l.timeline) {
            if near(at) {
                inside.push(us);
            } else {
                outside.push(us);
            }
        }
        let failed_near = loads.flat_map(|l| &l.failed_at).filter(|&&ms| near(ms)).count() as u64;
        ByNearness { near: inside, away: outside, failed_near }
    }
}

fn one_row(cfg: &RestartConfig, lab: &Lab<'_>, change: Change) -> Result<RestartRow, String> {
    let log = lab.dir.join(format!("{change:?}.log"));
    let _ = std::fs::remove_file(&log);
    let mut server = if change.nginx() {
        lab.nginx(cfg.nginx.as_deref().ok_or("nginx not found")?, &log, change == Change::NginxUpgrade)?
    } else {
        Server::of(lab.udpx(cfg, &log, Start::Fresh, change == Change::UdpxUpgradeH2H3)?)
    };
    let mut lc = LoadConfig::new(lab.addr(), cfg.players, &format!("/{SEGMENT}"), cfg.interval);
    lc.ramp = Duration::from_secs(5);
    lc.duration = cfg.window;
    // The HTTP/2 + HTTP/3 row: the players split, each half on its own client thread.
    let both = change == Change::UdpxUpgradeH2H3;
    let h2_players = if both { cfg.players / 2 } else { 0 };
    lc.connections = cfg.players - h2_players;
    let mut lc_h2 = lc.clone();
    lc_h2.connections = h2_players;
    let (lc2, ca, client_cpu) = (lc.clone(), lab.cert.to_path_buf(), lab.client_cpu);
    let ca_h2 = ca.clone();
    let tcp = change.tcp();
    let job = move || {
        let _ = udpx_lab::cpu::pin_current_thread(client_cpu);
        if change.nginx() {
            quinn_hyper::run(&lc2, HyperHttp::H2, &ca).map_err(|e| e.to_string())
        } else if matches!(change, Change::UdpxUpgradeQuinn | Change::UdpxUpgradeH2H3) {
            quinn_hyper::run(&lc2, HyperHttp::H3, &ca).map_err(|e| e.to_string())
        } else {
            own::run(&lc2).map_err(|e| e.to_string())
        }
    };
    let job_h2 = move || {
        let _ = udpx_lab::cpu::pin_current_thread(client_cpu);
        quinn_hyper::run(&lc_h2, HyperHttp::H2, &ca_h2).map_err(|e| e.to_string())
    };
    let start = Instant::now();
    let window_start = start + lc.ramp;
    let client = lab.net.ns(Side::Tx).try_spawn(job).map_err(|e| e.to_string())?;
    let client_h2 = if both { Some(lab.net.ns(Side::Tx).try_spawn(job_h2).map_err(|e| e.to_string())?) } else { None };
    std::thread::sleep(window_start.saturating_duration_since(Instant::now()));
    let downloads = start_downloads(cfg, lab, tcp)?;
    let mut changes = Vec::new();
    let mut watchers = Vec::new();
    // nginx's master: the process started, then each binary upgrade's new one.
    let mut master = server.pid;
    for k in 1..=cfg.changes {
        let at = window_start + cfg.window.mul_f64(k as f64 / (cfg.changes + 1) as f64);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let at = Instant::now();
        let at_s = at.duration_since(window_start).as_secs_f64();
        let result: Result<Option<f64>, String> = (|| match change {
            Change::UdpxReload => signal(server.pid, Signal::SIGHUP).map(|()| None),
            Change::NginxReload => signal(master, Signal::SIGHUP).map(|()| None),
            Change::UdpxUpgrade | Change::UdpxUpgradeQuinn | Change::UdpxUpgradeH2H3 => {
                let next = Server::of(lab.udpx(cfg, &log, Start::Upgrade, both)?);
                let old = std::mem::replace(&mut server, next);
                let old = old._child.ok_or("the old server's process")?;
                watchers.push((changes.len(), at, exit_watch(old, cfg.drain_timeout + Duration::from_secs(10))));
                Ok(None)
            }
            Change::UdpxRestart => {
                signal(server.pid, Signal::SIGINT)?;
                let old = std::mem::replace(&mut server, Server::of(lab.udpx_after(cfg, &log)?));
                drop(old);
                Ok(Some(at.elapsed().as_secs_f64()))
            }
            Change::NginxUpgrade => {
                let ndir = lab.dir.join("nginx");
                signal(master, Signal::SIGUSR2)?;
                // The old master renames its pid file to .oldbin; the new one writes its own.
                let oldbin = ndir.join("nginx.pid.oldbin");
                let new_master = || master_pid(&ndir, master);
                if !udpx_lab::wait_until(Duration::from_secs(10), || oldbin.exists() && new_master().is_some()) {
                    return Err("nginx started no new master in 10 s (no nginx.pid.oldbin)".into());
                }
                let next = new_master().ok_or("the new master's pid")?;
                signal(master, Signal::SIGWINCH)?;
                std::thread::sleep(Duration::from_millis(500));
                signal(master, Signal::SIGQUIT)?;
                // The new master is in the old one's process group (nginx forks it), which the
                // row's guard (the adopted daemon group) kills at its end; the old master's exit
                // is watched by its pid.
                let old = std::mem::replace(&mut master, next);
                let gone = udpx_lab::wait_until(cfg.drain_timeout + Duration::from_secs(10), || {
                    !udpx_lab::netns::is_running(old)
                });
                Ok(gone.then(|| at.elapsed().as_secs_f64()))
            }
        })();
        changes.push(match result {
            Ok(r) => ChangeRun { at_s, replaced_after_s: r, error: None },
            Err(e) => ChangeRun { at_s, replaced_after_s: None, error: Some(e) },
        });
    }
    let load = client.join().map_err(|_| "the client panicked".to_string()).and_then(|r| r);
    let load_h2 = client_h2.map(|c| c.join().map_err(|_| "the HTTP/2 client panicked".to_string()).and_then(|r| r));
    let download_errors: Vec<String> = downloads
        .into_iter()
        .filter_map(|d| d.join().unwrap_or_else(|_| Some("the download panicked".into())))
        .collect();
    for (i, at, w) in watchers {
        if let Ok(Some(t)) = w.join() {
            changes[i].replaced_after_s = Some(t.duration_since(at).as_secs_f64());
        } else {
            changes[i].error.get_or_insert("the old process did not exit in time".into());
        }
    }
    drop(server);
    let load = load?;
    let load_h2 = load_h2.transpose()?;
    let mut by_nearness = ByNearness::of(&changes, std::iter::once(&load).chain(load_h2.as_ref()));
    Ok(RestartRow {
        change,
        p99_near_ms: p99_ms(&mut by_nearness.near),
        p99_away_ms: p99_ms(&mut by_nearness.away),
        failed_near: by_nearness.failed_near,
        downloads_broken: download_errors.len(),
        download_errors,
        load: Some(load),
        load_h2,
        changes,
        error: None,
        steal: Steal::default(),
        server_busy: None,
        client_busy: None,
    })
}

/// The rate-limited downloads, each in a thread of the client's namespace: over HTTP/3 with
/// udpx's client, over HTTP/2 with curl (`--limit-rate`) for nginx. Each thread's answer: what
/// broke it, or `None` when it ended whole.
fn start_downloads(
    cfg: &RestartConfig,
    lab: &Lab<'_>,
    tcp: bool,
) -> Result<Vec<std::thread::JoinHandle<Option<String>>>, String> {
    let size = cfg.download_rate.saturating_mul(cfg.window.as_secs()).max(1);
    let url = format!("https://{}/{DOWNLOAD}", lab.addr());
    let limit = cfg.window + Duration::from_secs(60);
    let mut out = Vec::new();
    for _ in 0..cfg.downloads {
        let (url, rate) = (url.clone(), cfg.download_rate);
        let handle = if tcp {
            let curl = cfg.curl.clone().ok_or("curl not found (scripts/setup.sh installs it)")?;
            let mut c = lab.net.ns(Side::Tx).command(&curl.to_string_lossy());
            c.args(["-sk", "--http2", "--limit-rate", &rate.to_string(), "-o", "/dev/null"]);
            c.args(["-w", "%{http_code} %{size_download}", &url]);
            std::thread::spawn(move || {
                let out = udpx_lab::netns::run_bounded(&mut c, limit);
                match out {
                    Ok(text) if text.trim() == format!("200 {size}") => None,
                    Ok(text) => Some(format!("curl: {}", text.trim())),
                    Err(e) => Some(format!("curl: {e}")),
                }
            })
        } else {
            lab.net
                .ns(Side::Tx)
                .try_spawn(move || {
                    let gc = udpx_h3::GetConfig { limit_rate: Some(rate), ..udpx_h3::GetConfig::default() };
                    match udpx_h3::get(&url, None, &gc) {
                        Ok(r) if r.status == 200 && r.bytes == size => None,
                        Ok(r) => Some(format!("status {}, {} of {size} bytes", r.status, r.bytes)),
                        Err(e) => Some(e.to_string()),
                    }
                })
                .map_err(|e| e.to_string())?
        };
        out.push(handle);
    }
    Ok(out)
}

impl Lab<'_> {
    /// The naive restart's second half: the same command once the port is free again.
    fn udpx_after(&self, cfg: &RestartConfig, log: &Path) -> Result<ChildGroup, String> {
        let start = Instant::now();
        loop {
            match self.udpx(cfg, log, Start::Fresh, false) {
                Ok(c) => return Ok(c),
                Err(e) if start.elapsed() > Duration::from_secs(10) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

fn p99_ms(v: &mut [u32]) -> Option<f64> {
    (!v.is_empty()).then(|| crate::clients::own::Latency::of(v).p99_ms)
}

/// The table.
pub fn table(b: &RestartBench) -> String {
    use std::fmt::Write;
    let c = &b.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "udpx bench h3 --restart: {} players x {} KiB every {} s and {} downloads at {} KiB/s, {} changes in {} s \
         per row (veth, own clients but for the quinn and h2+h3 rows; curl for the TCP rows' downloads)",
        c.players,
        c.segment >> 10,
        c.interval.as_secs_f64(),
        c.downloads,
        c.download_rate >> 10,
        c.changes,
        c.window.as_secs()
    );
    let _ = writeln!(
        s,
        "{:<45} {:>8} {:>7} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9} {:>8} {:>10}  replaced after (s)",
        "row",
        "requests",
        "failed",
        "unansw",
        "broken",
        "moved",
        "fnear",
        "p99 near",
        "p99 away",
        "dl broke",
        "busy s/c"
    );
    for r in &b.rows {
        let Some(l) = &r.load else {
            let _ = writeln!(s, "{:<45} {}", r.change.name(), r.error.as_deref().unwrap_or("did not run"));
            continue;
        };
        // A stolen row's timings are not quoted.
        let ms = |v: Option<f64>| match v {
            Some(_) if r.steal.stolen => "stolen".into(),
            Some(v) => format!("{v:.1} ms"),
            None => "-".into(),
        };
        let replaced: Vec<String> = r
            .changes
            .iter()
            .map(|c| match (&c.error, c.replaced_after_s) {
                (Some(e), _) => format!("error: {e}"),
                (None, Some(t)) => format!("{t:.1}"),
                (None, None) => "-".into(),
            })
            .collect();
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}", v * 100.0));
        let busy = format!("{}/{} %", pct(r.server_busy), pct(r.client_busy));
        let _ = writeln!(
            s,
            "{:<45} {:>8} {:>7} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9} {:>8} {:>10}  {}",
            r.change.name(),
            l.requests,
            l.failed,
            l.unanswered,
            l.ended_early,
            l.moved_on_goaway,
            r.failed_near,
            ms(r.p99_near_ms),
            ms(r.p99_away_ms),
            format!("{}/{}", r.downloads_broken, c.downloads),
            busy,
            replaced.join(", ")
        );
        if let Some(h) = &r.load_h2 {
            let _ = writeln!(
                s,
                "{:<45} {:>8} {:>7} {:>6} {:>6} {:>6}   (the HTTP/2 half, over TCP; {} of the requests asked again on a \
                 new connection, no answer begun)",
                "  its HTTP/2 half (hyper h2)",
                h.requests,
                h.failed,
                h.unanswered,
                h.ended_early,
                h.moved_on_goaway,
                h.retried
            );
        }
        for e in &r.download_errors {
            let _ = writeln!(s, "    download broken: {e}");
        }
    }
    if let Some(note) = udpx_lab::judge::steal_note(b.rows.iter().filter(|r| r.load.is_some()).map(|r| &r.steal), None)
    {
        let _ = writeln!(
            s,
            "{note}; one run per row: a marked row's p99 columns say `stolen` (the server's and the client's CPUs)"
        );
    }
    let _ = writeln!(
        s,
        "failed: an error status, a reset or the connection gone under a request; unansw: no answer by the end; \
         broken: connections that ended early (not a GOAWAY the client followed); moved: connections left for a new \
         one on GOAWAY; fnear: failures in the 2 s after a change; p99 near/away: requests sent in the 2 s after a \
         change, and the rest; dl broke: rate-limited downloads spanning every change that did not end whole; busy \
         s/c: the share of the row the server's CPU and the client's CPU were busy (/proc/stat, softirq included): \
         at {:.0} % or more that side limits the row, and its p99 columns are the machine's. Counts are the verdict; \
         the p99 columns are timings of this run. The h2+h3 row: its first line is the HTTP/3 half \
         (quinn), the next its HTTP/2 half (hyper over TCP, the listener handed over with the QUIC port); its \
         downloads are curl's over HTTP/2, and its clients ask again only what RFC 9113 6.8 (GOAWAY) and RFC 9110 \
         9.2.2 (a GET with no answer begun on a connection that closed) allow.",
        BUSY_LIMIT * 100.0
    );
    let _ = write!(s, "\n{}", b.environment.to_markdown());
    s
}
