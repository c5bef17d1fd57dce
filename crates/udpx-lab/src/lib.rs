//! The measurement lab: what every udpx tool measures with, so that their figures are taken
//! the same way and can be compared.
//!
//! - [`cpu`]: CPU time from `/proc/stat` (per CPU, softirq included) and `getrusage` (this
//!   machine has no hardware counters), pinning, online CPUs.
//! - [`stats`]: medians of interleaved runs, spreads, paired ratios and the met / missed /
//!   inconclusive rule.
//! - [`steal`]: the hypervisor's steal over a run's window ([`steal::Steal`]) and the limit
//!   above which a run is marked and counts in no median, range or verdict (the rule is
//!   [`stats`]'s).
//! - [`task`]: what one process or some of its threads used (CPU time, context switches,
//!   resident memory), from `/proc/PID`.
//! - [`judge`]: targets judged by that rule ([`judge::Check`]) and how the reports print them.
//! - [`env`](mod@env): the environment record printed beside every figure (kernel, CPU, qdiscs,
//!   device features, sysctls).
//! - [`chart`]: what the tools' SVG charts share (a monospace font, text widths that size
//!   the canvas, escaping, and a reader of the drawn text for tests).
//! - [`netns`]: network namespaces and veth pairs, removed on drop (the `udpx-netns` crate,
//!   which the datapath library's own tests use directly).
//! - [`browser`]: headless Chromium as a peer: where it is, the flags of a lab run.
//!
//! Tools (echo, stream, h3, lb) depend on this crate and the library, never on each other;
//! a tool's own table lives in its crate (echo's modes in `udpx_echo::bench`), the main job's
//! tables in `udpx-bench`.

pub mod browser;
pub mod chart;
pub mod cpu;
pub mod env;
pub mod judge;
pub mod stats;
pub mod steal;
pub mod task;

pub use udpx_netns as netns;

/// Polls `done` every 20 ms until it holds or `limit` has passed; whether it held (asked once
/// more at the end, so a condition met at the last moment counts).
pub fn wait_until(limit: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    done()
}

/// One of the kernel's UDP counters (`/proc/thread-self/net/snmp`, line "Udp:", e.g.
/// `NoPorts`, `InDatagrams`, `RcvbufErrors`) for the calling thread's network namespace;
/// `None` when it cannot be read.
pub fn udp_counter(name: &str) -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").ok()?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next()?, udp.next()?);
    names.split_whitespace().zip(values.split_whitespace()).find(|(n, _)| *n == name)?.1.parse().ok()
}

/// `len` deterministic bytes from `seed` (xorshift64): test and bench content that is no
/// repeating pattern of a power-of-two period, so a byte out of place changes its digest.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
