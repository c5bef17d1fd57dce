//! What the bulk table measures: a download (its cost, passes and counts), a row of them, the
//! bench whole.

use serde::Serialize;
use udpx_lab::env::Environment;
use udpx_lab::judge::Check;
use udpx_lab::stats::{figures, Kept, Run};
use udpx_lab::steal::{Steal, WithSteal};

use super::config::{H3BenchConfig, NGINX, QUINN};
use super::place::Cost;

/// One download.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct H3Run {
    /// Server CPU seconds (the busy time of its CPU) per 10^9 body bytes.
    pub cpu_s_per_gb: f64,
    /// Server CPU seconds over the download: the busy time of the server's CPU.
    pub server_cpu_s: f64,
    /// Of it, the server's own tasks' time on CPU (`schedstat`): the rest is receive work in
    /// the server's NAPI thread, softirq, and whatever else ran there.
    pub server_task_s: f64,
    /// Body bytes the client received.
    pub bytes: u64,
    /// The client's download time.
    pub seconds: f64,
    /// Body throughput, Mbit/s.
    pub mbit_per_s: f64,
    /// Send system calls of the server (udpx).
    pub send_calls: Option<u64>,
    /// Datagrams per send call (udpx).
    pub packets_per_call: Option<f64>,
    /// Packets quiche declared lost (udpx).
    pub lost_packets: Option<u64>,
    /// Receive buffers that held more than one datagram (udpx, GRO).
    pub gro_buffers: Option<u64>,
    /// Messages that went with MSG_ZEROCOPY, of them those the kernel copied anyway, and
    /// whether zerocopy was turned off for that (udpx, `--zerocopy`).
    pub zerocopy: Option<ZerocopyUse>,
    /// Passes over a body byte (udpx).
    pub passes: Option<Passes>,
    /// The server's loop turns and send calls per MB of body (udpx): what a client's
    /// acknowledgement policy costs in wake-ups and system calls (issue 47 item 6).
    pub turns_per_mb: Option<f64>,
    pub send_calls_per_mb: Option<f64>,
    /// The server's own tasks' context switches per MB of body (every server: a sleeping
    /// thread's each wake-up is one; nginx's kernel TCP answers acknowledgements without one).
    pub switches_per_mb: Option<f64>,
    /// Packets the server sent per datagram it received (udpx): for a download, how many
    /// packets each of the client's acknowledgements covers, about (issue 47 assumed ten for
    /// Chromium after its first hundred).
    pub packets_per_datagram_in: Option<f64>,
    /// Buffers the server allocated to read bodies into, none in its pools being free (udpx):
    /// each one's pages are faulted in as the read writes them.
    pub read_buffers_made: Option<u64>,
    /// The block cache (udpx `+cache` rows).
    pub cache: Option<CacheUse>,
    /// The hypervisor's steal from the server's and the client's CPUs over the download
    /// (`steal_s`, `steal_share`, `stolen`).
    #[serde(flatten)]
    pub steal: Steal,
}

impl WithSteal for H3Run {
    fn steal(&self) -> &Steal {
        &self.steal
    }
}

/// `n` per 10^6 body bytes, when any were sent.
pub(super) fn per_mb(n: u64, body: u64) -> Option<f64> {
    (body > 0).then(|| n as f64 / (body as f64 / 1e6))
}

/// The passes over a body byte in one udpx run, each per body byte the server sent: read
/// from files (into blocks or the cache), copied into packets before the seal (quiche's
/// count: since patch 0010 a packet's stream bytes are sealed straight from the response's
/// buffers, and copied only where they lie in more pieces than a seal takes), sealed (every
/// packet byte: headers, acknowledgements and retransmissions included). The kernel's copy
/// into its buffers is one more (none for zerocopy sends).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Passes {
    pub read: f64,
    pub copied: f64,
    pub sealed: f64,
}

impl Passes {
    pub(super) fn of(c: &udpx_h3::server::ServeCounters) -> Option<Passes> {
        let body = c.http.body_bytes as f64;
        (body > 0.0).then(|| Passes {
            read: c.http.file_bytes_read as f64 / body,
            copied: c.quic.stream_bytes_copied as f64 / body,
            sealed: c.quic.bytes_sent as f64 / body,
        })
    }
}

/// The block cache in one `+cache` or `+half cache` run: blocks found over blocks asked for,
/// the bytes of blocks alive at the end (what the cache costs in memory) and its bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CacheUse {
    pub hit_ratio: f64,
    pub held_mib: f64,
    pub capacity_mib: f64,
}

/// What zerocopy did in one udpx run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ZerocopyUse {
    /// Messages sent with MSG_ZEROCOPY.
    pub sends: u64,
    /// Their completions that said the kernel copied.
    pub copied: u64,
    /// Zerocopy was turned off (`auto`: the kernel kept copying).
    pub turned_off: bool,
}

/// One row: its median run (by cost), whole, and every run.
#[derive(Debug, Clone, Serialize)]
pub struct H3Row {
    /// Server column.
    pub server: String,
    /// Client column.
    pub client: String,
    /// The median run (by `cpu_s_per_gb`); `None` if every run failed.
    pub median: Option<H3Run>,
    /// Which run that is.
    pub median_run: Option<usize>,
    /// Every run in round order, `None` where it failed.
    pub runs: Vec<Option<H3Run>>,
    /// The first failure, if any run failed.
    pub error: Option<String>,
    /// Runs planned, clean, stolen and failed.
    pub kept: Kept,
}

impl H3Row {
    /// `server / client`.
    pub fn label(&self) -> String {
        format!("{} / {}", self.server, self.client)
    }

    pub(super) fn costs(&self) -> Vec<Run> {
        figures(&self.runs, |r| r.cpu_s_per_gb)
    }

    pub(super) fn is_udpx(&self) -> bool {
        self.server != NGINX && self.server != QUINN
    }

    pub(super) fn is_cached(&self) -> bool {
        // " +cache" or " +half cache" ([`Cache`](super::Cache)'s suffixes).
        self.server.ends_with("cache")
    }
}

/// A row not run, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LeftOut {
    /// Which rows.
    pub rows: String,
    /// Why.
    pub why: String,
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct H3Bench {
    /// Settings.
    pub config: H3BenchConfig,
    /// `software`, `offload` (veth) or `loopback`.
    pub profile: String,
    /// The path the packets took, in words.
    pub path: String,
    /// The rows, in table order.
    pub rows: Vec<H3Row>,
    /// Rows not run (a peer missing).
    pub left_out: Vec<LeftOut>,
    /// The targets, judged.
    pub checks: Vec<Check>,
    /// Kernel, CPU, devices.
    pub environment: Environment,
    /// Built with debug assertions (quiche's own consistency checks run on every packet): its
    /// CPU figures are not the server's.
    pub debug_build: bool,
}

pub(super) fn measured(Cost { busy: cpu, task, switches, steal }: Cost, bytes: u64, seconds: f64) -> H3Run {
    H3Run {
        cpu_s_per_gb: if bytes > 0 { cpu / (bytes as f64 / 1e9) } else { f64::INFINITY },
        server_cpu_s: cpu,
        server_task_s: task,
        bytes,
        seconds,
        mbit_per_s: bytes as f64 * 8.0 / seconds.max(1e-9) / 1e6,
        send_calls: None,
        packets_per_call: None,
        lost_packets: None,
        gro_buffers: None,
        zerocopy: None,
        passes: None,
        turns_per_mb: None,
        send_calls_per_mb: None,
        packets_per_datagram_in: None,
        switches_per_mb: switches.and_then(|n| per_mb(n, bytes)),
        read_buffers_made: None,
        cache: None,
        steal,
    }
}
