//! Network namespaces and veth pairs for udpx tests and benchmarks, removed on drop.
//!
//! # Why
//!
//! Loopback hides most of what a UDP datapath does: no device features, no GSO split, no GRO.
//! A veth pair between two network namespaces is a real device path that needs no hardware and
//! reaches no outside network, and its offloads can be switched to mimic a NIC with or without
//! UDP segmentation offload ([`Profile`]). Tests and `udpx bench` build one per run with
//! [`TestNet::setup`] and drive both ends from one process: a thread that has entered a
//! namespace ([`Namespace::run`]) creates sockets that belong to it.
//!
//! # Layers
//!
//! - [`Namespace`]: one `ip netns` namespace, entered per thread with setns(2), removed on drop
//!   (also while unwinding from a test's panic).
//! - [`TestNet`]: two namespaces, a veth pair, documentation-range addresses, a [`Profile`].
//! - [`LineNet`]: server → router → client, two veth pairs, forwarding, and the lab's knobs:
//!   a `tbf` bottleneck on the router's egress, device features, RPS.
//! - [`StarNet`]: the attack lab, a hub forwarding between a server, an attacker, a victim and
//!   a client, with no source-address filtering (what a forged source reaches).
//! - Cleanup outside `Drop`: [`cleanup_on_signals`] / [`remove_all_live`] for Ctrl-C,
//!   [`cleanup_stale`] for namespaces left by a process that was killed.
//! - [`ChildGroup`]: a peer process (iperf3, sockperf) in a process group of its own, killed
//!   with its group when dropped and by the signal cleanup.
//! - [`examples`](mod@examples): a package's examples run by its tests as a user runs them (the binary cargo
//!   built, or built on demand; output read as it comes; killed and reaped on drop).
//! - [`micro`]: the micro benchmarks' timer (nanoseconds per operation, printed).
//! - [`forge`]: forged packets for the attack tests (a request with a victim's source address,
//!   ICMP errors quoting any datagram), sent from a raw socket.
//! - [`run_bounded`]: every external command here (`ip`, `ethtool`, `sh`) runs with a time
//!   limit, and a failure carries its stderr.
//!
//! # Names
//!
//! Namespaces are `udpx-<pid>-<n>-tx` / `-rx` and veth ends `ux<pid>t<n>` / `ux<pid>r<n>`,
//! with `n` a per-process counter (a [`LineNet`]: `-srv`, `-rtr`, `-cli` and `ux<pid>s<n>`,
//! `a`, `b`, `c`), so parallel tests and processes never collide and a stale name says which
//! process left it.
//!
//! # Privileges
//!
//! Everything needs root. Tests start with
//!
//! ```no_run
//! if udpx_netns::skip_unless_capable("gso over veth") {
//!     return;
//! }
//! ```
//!
//! which prints `SKIP: <test>: <why>` when root, `ip`, `ethtool` or network namespaces are
//! missing.

#![forbid(unsafe_code)]

mod child;
mod command;
pub mod delay;
mod error;
pub mod examples;
pub mod forge;
mod line;
mod link;
pub mod micro;
mod namespace;
mod star;
mod testnet;

use std::path::Path;
use std::sync::OnceLock;

use nix::sched::{unshare, CloneFlags};
use nix::unistd::geteuid;

pub use child::{is_running, kill_all_live, ChildGroup, GroupGuard};
pub use command::{display_command, run_bounded};
pub use delay::{DelayCounters, DelayLine, MAX_ONE_WAY};
pub use error::Error;
pub use line::{
    LineConfig, LineNet, Node, Port, TbfLimit, LINE_CLIENT_V4, LINE_PREFIX, LINE_ROUTER_CLIENT_V4,
    LINE_ROUTER_SERVER_V4, LINE_SERVER_V4,
};
pub use namespace::{
    cleanup_on_signals, cleanup_stale, live_namespaces, remove_all_live, unique_name, Namespace, EXEC_TIMEOUT,
    NAME_PREFIX, NETNS_RUN_DIR,
};
pub use star::{Leaf, StarNet};
pub use testnet::{
    parse_drop_counts, parse_features, DropCounts, Napi, NapiThread, Profile, Side, TestNet, TestNetConfig,
    MAX_IFNAME_LEN, MAX_MTU, MIN_MTU, RX_V4, RX_V6, TX_V4, TX_V6, V4_PREFIX, V6_PREFIX,
};

/// Programs this crate runs.
const TOOLS: [&str; 2] = ["ip", "ethtool"];

/// Whether the effective user is root.
pub fn is_root() -> bool {
    geteuid().is_root()
}

/// What stops this crate from working here, found once per process.
#[derive(Debug, Clone, Copy)]
enum Missing {
    Root,
    Tool(&'static str),
    /// `unshare(CLONE_NEWNET)` failed with this errno.
    Namespaces(i32),
}

/// Checks that namespaces and veth pairs can be made here: root, `ip` and `ethtool` on `PATH`,
/// and a kernel that lets this process create a network namespace (probed once, on a
/// throwaway thread with unshare(2), since a root user in a container may still lack
/// CAP_SYS_ADMIN).
pub fn check_capable() -> Result<(), Error> {
    static PROBE: OnceLock<Option<Missing>> = OnceLock::new();
    let missing = *PROBE.get_or_init(|| {
        if !is_root() {
            return Some(Missing::Root);
        }
        if let Some(tool) = TOOLS.into_iter().find(|t| !on_path(t)) {
            return Some(Missing::Tool(tool));
        }
        // The new namespace belongs to the thread alone and is freed when it exits.
        let probe = std::thread::spawn(|| unshare(CloneFlags::CLONE_NEWNET)).join();
        match probe {
            Ok(Ok(())) => None,
            Ok(Err(errno)) => Some(Missing::Namespaces(errno as i32)),
            Err(_) => Some(Missing::Namespaces(nix::errno::Errno::ECHILD as i32)),
        }
    });
    match missing {
        None => Ok(()),
        Some(Missing::Root) => Err(Error::NotRoot),
        Some(Missing::Tool(tool)) => Err(Error::ToolMissing { tool }),
        Some(Missing::Namespaces(errno)) => {
            Err(Error::NamespacesUnavailable { source: std::io::Error::from_raw_os_error(errno) })
        }
    }
}

/// For tests: prints `SKIP: <what>: <why>` to stdout and returns true when [`check_capable`]
/// fails, so the test can return early and be seen as skipped rather than silently passing.
pub fn skip_unless_capable(what: &str) -> bool {
    match check_capable() {
        Ok(()) => false,
        Err(why) => {
            record_skip(what, &why.to_string());
            true
        }
    }
}

/// Prints `SKIP: <what>: <why>` and, when `UDPX_SKIP_LOG` names a file, appends the same line
/// there, so the test runner (scripts/test.sh) reports the test as skipped, not passed.
pub fn record_skip(what: &str, why: &str) {
    println!("SKIP: {what}: {why}");
    if let Some(path) = std::env::var_os("UDPX_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            // One write of the whole line: tests that skip at the same moment append whole
            // lines (O_APPEND), never interleaved pieces.
            let _ = f.write_all(format!("{what}: {why}\n").as_bytes());
        }
    }
}

/// This process's resident memory (`VmRSS` of `/proc/self/status`), bytes: what the attack
/// tests report (and bound) of a server that runs inside the test process.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").trim().to_owned()))
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Whether an executable file named `program` is in one of the `PATH` directories.
pub fn on_path(program: &str) -> bool {
    find_in_path(program).is_some()
}

/// The executable file named `program` in the first `PATH` directory that has one.
pub fn find_in_path(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| Path::new(&dir).join(program))
        .find(|candidate| candidate.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sh_not_nonsense() {
        assert!(on_path("sh"));
        assert!(!on_path("udpx-netns-no-such-program"));
    }

    #[test]
    fn errors_say_what_to_do() {
        let e = Error::Exists { name: "x".to_owned() };
        assert!(e.to_string().contains("ip netns del x"), "{e}");
        assert!(Error::NotRoot.to_string().contains("run as root"));
    }
}
