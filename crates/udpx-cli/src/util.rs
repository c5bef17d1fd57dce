//! Helpers every subcommand shares.

use std::process::ExitCode;
use std::time::Duration;

/// Prints `udpx <cmd>: <msg>` and returns the usage exit code.
pub fn usage(cmd: &str, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("udpx {cmd}: {msg}");
    ExitCode::from(crate::exit::USAGE)
}

/// Removes the lab's namespaces and processes on Ctrl-C, TERM and HUP (call it before any
/// thread exists); says so where it cannot.
pub fn signal_cleanup(cmd: &str) {
    if let Err(e) = udpx_lab::netns::cleanup_on_signals() {
        eprintln!("udpx {cmd}: warning: no signal cleanup: {e}");
    }
}

/// Raises the open-file limit to its hard limit (a server holds a descriptor per open
/// file and TCP connection) and says what it is: `udpx <cmd>: open files: N`. Where the
/// raise is refused, says so and goes on with the soft limit.
pub fn raise_open_files(cmd: &str) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => eprintln!("udpx {cmd}: open files: {hard} (raised from {soft})"),
            Err(e) => eprintln!("udpx {cmd}: open files: {soft} (raising to {hard} refused: {e})"),
        },
        Ok((soft, _)) => eprintln!("udpx {cmd}: open files: {soft}"),
        Err(e) => eprintln!("udpx {cmd}: open files: unknown ({e})"),
    }
}

/// Says loudly that the metrics endpoint on `addr` can be reached from other hosts.
pub fn warn_if_exposed(cmd: &str, addr: std::net::SocketAddr) {
    if udpx_metrics::is_exposed(addr) {
        eprintln!(
            "udpx {cmd}: WARNING: metrics on {addr} can be reached from other hosts (counters, \
             addresses of ICMP senders); firewall it, or give a port alone to serve 127.0.0.1 only"
        );
    }
}

/// A duration flag: seconds, more than 0 and at most an hour.
pub fn duration(flag: &str, secs: f64) -> Result<Duration, String> {
    if !(secs > 0.0 && secs <= 3600.0) {
        return Err(format!("{flag} {secs}: give a duration in seconds, more than 0 and at most 3600"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A peer named on the command line: `IP`, `IP:PORT` or `[IPv6]:PORT`. The port, when
/// given here, must agree with `-p`/`--port` if that flag was set too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The address.
    pub ip: std::net::IpAddr,
    /// The port, if the argument carried one.
    pub port: Option<u16>,
}

impl std::str::FromStr for Peer {
    type Err = String;
    fn from_str(s: &str) -> Result<Peer, String> {
        if let Ok(ip) = s.parse::<std::net::IpAddr>() {
            return Ok(Peer { ip, port: None });
        }
        match s.parse::<std::net::SocketAddr>() {
            Ok(a) => Ok(Peer { ip: a.ip(), port: Some(a.port()) }),
            Err(_) => Err(format!(
                "{s:?} is not an address: give an IP (127.0.0.1, ::1), IP:PORT (127.0.0.1:9) or [IPv6]:PORT ([::1]:9)"
            )),
        }
    }
}

impl Peer {
    /// The socket address: the port from the argument, else `port_flag`, else `default`.
    /// `port_flag` is `-p` as given (`None` when left at its default); a port in both
    /// places that differs is a usage error.
    pub fn addr(&self, port_flag: Option<u16>, default: u16) -> Result<std::net::SocketAddr, String> {
        let port = match (self.port, port_flag) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!("port {a} in the address and -p {b} disagree: give the port once"))
            }
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => default,
        };
        Ok(std::net::SocketAddr::new(self.ip, port))
    }
}

use nix::sys::signal::{SigSet, Signal};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Blocks `blocked` in this thread (and so in every thread started after it) and starts
/// thread `name`, which calls `on` with each of `waited` (a subset) as it arrives. If the
/// thread cannot start, `waited` is unblocked again (their default actions apply).
fn signal_thread(name: &str, blocked: &[Signal], waited: &[Signal], on: impl Fn(Signal) + Send + 'static) {
    let set = |sigs: &[Signal]| {
        let mut s = SigSet::empty();
        sigs.iter().for_each(|&g| s.add(g));
        s
    };
    let waited = set(waited);
    if set(blocked).thread_block().is_err() {
        return;
    }
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        while let Ok(sig) = waited.wait() {
            on(sig);
        }
    });
    if spawned.is_err() {
        let _ = waited.thread_unblock();
    }
}

/// A flag set by SIGINT or SIGTERM (a thread waits for them; they are blocked in every
/// other thread), so a run stops and still prints its summary.
pub fn stop_on_signals() -> &'static AtomicBool {
    static STOP: AtomicBool = AtomicBool::new(false);
    let sigs = [Signal::SIGINT, Signal::SIGTERM];
    signal_thread("udpx-signals", &sigs, &sigs, |_| STOP.store(true, Relaxed));
    &STOP
}

/// What a server with a graceful stop was told: `drain` by the first SIGTERM or SIGQUIT,
/// `stop` by SIGINT or a second of those.
#[derive(Debug)]
pub struct StopSignals {
    /// Drain: no new connections, finish what is under way, then end.
    pub drain: AtomicBool,
    /// End now.
    pub stop: AtomicBool,
}

/// [`StopSignals`], set by a thread that waits for SIGINT, SIGTERM and SIGQUIT (blocked in
/// every other thread: call it before starting threads, after `reload_signals`).
pub fn graceful_signals() -> &'static StopSignals {
    static SIGNALS: StopSignals = StopSignals { drain: AtomicBool::new(false), stop: AtomicBool::new(false) };
    let sigs = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGQUIT];
    signal_thread("udpx-signals", &sigs, &sigs, |sig| {
        if sig == Signal::SIGINT || SIGNALS.drain.swap(true, Relaxed) {
            SIGNALS.stop.store(true, Relaxed);
        }
    });
    &SIGNALS
}

/// What a server's reload signals asked for since last looked at.
#[derive(Debug)]
pub struct ReloadSignals {
    /// SIGHUP: read the configuration files again.
    pub hup: AtomicBool,
    /// SIGUSR1: reopen the log files (logrotate).
    pub usr1: AtomicBool,
    /// SIGUSR2: start the upgrade (nginx's binary upgrade signal).
    pub usr2: AtomicBool,
}

/// [`ReloadSignals`], set by a thread that waits for SIGHUP, SIGUSR1 and SIGUSR2 (blocked in every
/// other thread). Call it first, then `stop_on_signals` or `graceful_signals`, before
/// starting threads: it blocks SIGINT, SIGTERM and SIGQUIT too, so that its own thread
/// never takes one of those (their default action would end the process without its clean
/// stop), and the other's thread waits for them.
pub fn reload_signals() -> &'static ReloadSignals {
    static SIGNALS: ReloadSignals =
        ReloadSignals { hup: AtomicBool::new(false), usr1: AtomicBool::new(false), usr2: AtomicBool::new(false) };
    let blocked = [Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGUSR2, Signal::SIGINT, Signal::SIGTERM, Signal::SIGQUIT];
    let taken = [Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGUSR2];
    signal_thread("udpx-sighup", &blocked, &taken, |sig| {
        let flag = match sig {
            Signal::SIGUSR1 => &SIGNALS.usr1,
            Signal::SIGUSR2 => &SIGNALS.usr2,
            _ => &SIGNALS.hup,
        };
        flag.store(true, Relaxed);
    });
    &SIGNALS
}

/// Prints a bench's result, as one JSON object under `key` or as its report, or its error;
/// the exit code to return.
pub fn print_bench<B: serde::Serialize, E: std::fmt::Display>(
    cmd: &str,
    result: Result<B, E>,
    json: bool,
    key: &str,
    report: impl FnOnce(&B) -> String,
) -> ExitCode {
    match result {
        Ok(b) if json => println!("{}", serde_json::json!({ key: b })),
        Ok(b) => println!("{}", report(&b)),
        Err(e) => {
            eprintln!("udpx {cmd}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// A size flag: bytes with k, M or G (decimal: 100M is 10^8 bytes), 1 byte to 100G.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    let v = decimal_suffixed(s).ok_or_else(|| format!("{s:?}: give bytes, with k, M or G allowed (100M)"))?;
    if !(1.0..=1e11).contains(&v) {
        return Err(format!("{s:?}: give 1 byte to 100G"));
    }
    Ok(v as u64)
}

/// A number with an optional decimal suffix: `k` (10^3), `M` (10^6) or `G` (10^9); `None`
/// if it does not parse. The range is the caller's to check.
pub fn decimal_suffixed(s: &str) -> Option<f64> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1e3),
        Some((i, 'M')) => (&s[..i], 1e6),
        Some((i, 'G')) => (&s[..i], 1e9),
        _ => (s, 1.0),
    };
    num.parse::<f64>().ok().map(|v| v * mult)
}

/// Whether `program` is an executable file on PATH.
pub fn which(program: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file())).unwrap_or(false)
}

/// The arguments of a QUIC subcommand in a binary built without the `quic` feature: taken
/// whole, so that the message below is what the user sees, not clap's.
#[cfg(not(feature = "quic"))]
#[derive(clap::Args, Debug)]
pub struct WithoutQuic {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// `udpx <cmd>` in a binary built without the QUIC tools: says how to build them (exit 2).
#[cfg(not(feature = "quic"))]
pub fn without_quic(cmd: &str) -> ExitCode {
    usage(
        cmd,
        "this udpx was built without the QUIC tools (`--no-default-features`, as the README's first \
         command builds it); build them with `cargo build --release -p udpx-cli`",
    )
}
