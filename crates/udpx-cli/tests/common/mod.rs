//! What the `udpx` binary's tests share.
// Each test binary uses some of these.
#![allow(dead_code)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs the `udpx` binary with `args` and waits for it.
pub fn udpx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_udpx")).args(args).output().expect("run udpx")
}

/// Each command line exits 2 with a short message (at most 6 lines) on stderr that contains
/// its needle: what to change.
pub fn assert_usage_errors(cases: &[(&[&str], &str)]) {
    for (args, needle) in cases {
        let o = udpx(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
        assert!(err.lines().count() <= 6, "{args:?}: a short message, got {err}");
    }
}

/// Waits (10 s at most) until a UDP socket of this network namespace is bound to local port
/// `port`, on any address, as /proc/net/udp and udp6 list it. Read there rather than probed
/// with a bind of the test's own, which would hold the port for a moment and could make the
/// server's own bind fail.
pub fn wait_bound(port: u16) {
    wait_port(port, &["/proc/net/udp", "/proc/net/udp6"], None);
}

/// Waits (10 s at most) until a TCP socket of this network namespace listens on local port
/// `port` (/proc/net/tcp and tcp6, state LISTEN).
pub fn wait_listening(port: u16) {
    wait_port(port, &["/proc/net/tcp", "/proc/net/tcp6"], Some("0A"));
}

fn wait_port(port: u16, tables: &[&str], state: Option<&str>) {
    let start = Instant::now();
    while !tables.iter().any(|t| port_listed(&std::fs::read_to_string(t).unwrap_or_default(), port, state)) {
        assert!(start.elapsed() < Duration::from_secs(10), "nothing bound port {port} ({tables:?}) within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a /proc/net/{udp,tcp}[6] table lists a socket on local port `port` (in `state`,
/// hex as the table shows it, when given).
fn port_listed(table: &str, port: u16, state: Option<&str>) -> bool {
    table.lines().skip(1).any(|l| {
        // sl, local_address (ADDR:PORT in hex), rem_address, st, ...
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = f.get(1).and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
        local_port == Some(port) && state.is_none_or(|s| f.get(3) == Some(&s))
    })
}

/// The steal fields of one run in a bench's JSON (`udpx_lab::steal::Steal`, flat): numbers
/// never negative and a mark. Never their size: the tests do not depend on the neighbours.
pub fn assert_steal(run: &serde_json::Value) {
    for f in ["steal_s", "steal_share"] {
        assert!(run[f].as_f64().is_some_and(|v| v >= 0.0), "{f}: {run}");
    }
    assert!(run["stolen"].is_boolean(), "stolen: {run}");
}

/// Every measured run of a row carries its steal, and the row its tally (`kept`).
pub fn assert_row_steal(row: &serde_json::Value) {
    for run in row["runs"].as_array().expect("runs").iter().filter(|r| !r.is_null()) {
        assert_steal(run);
    }
    for f in ["planned", "clean", "stolen", "failed"] {
        assert!(row["kept"][f].as_u64().is_some(), "kept.{f}: {row}");
    }
}

/// A row's median run, or, when the steal rule left it none (every run stolen: a loaded
/// machine, not a fault), its first measured run, the skip recorded: `test` names it.
pub fn median_or_run<'a>(test: &str, row: &'a serde_json::Value) -> &'a serde_json::Value {
    if !row["median"].is_null() {
        return &row["median"];
    }
    assert!(row["kept"]["stolen"].as_u64() > Some(0), "no median and no stolen run: {row}");
    udpx_lab::netns::record_skip(test, "every run of a row was stolen by the hypervisor: its first run checked");
    row["runs"].as_array().and_then(|r| r.iter().find(|x| !x.is_null())).expect("a measured run")
}
