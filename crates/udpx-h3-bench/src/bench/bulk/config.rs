//! The bulk table's settings: what runs (servers, clients, the programs found), how many
//! rounds, and its target against nginx.

use std::time::Duration;

use serde::Serialize;
use udpx_lab::netns::{Napi, Profile};

use udpx_quic::IoMode;

use crate::lab::Programs;

/// The file's name under the served directory.
pub(super) const FILE: &str = "file";
/// The nginx row's server column.
pub(super) const NGINX: &str = "nginx https/tcp";
/// The quinn row's server column.
pub(super) const QUINN: &str = "quinn h3";

/// Bench settings.
#[derive(Debug, Clone, Serialize)]
pub struct H3BenchConfig {
    /// Bytes of the file downloaded per row and round.
    pub size: u64,
    /// Rounds, interleaved; the table shows each row's median run.
    pub repeat: usize,
    /// Rounds of the Chromium pair (udpx and nginx serving Chromium), interleaved with the
    /// others: its verdict needs at least 5 (`--chromium-repeat`); 0 leaves the pair out.
    pub chromium_repeat: usize,
    /// Over a veth pair between two namespaces (root) rather than loopback.
    pub veth: bool,
    /// Over veth: who segments the server's sends. `Software`: neither TCP nor UDP offload
    /// on the server's device (TSO and `tx-udp-segmentation` off: the GSO layer splits both
    /// in the server's context); `Offload`: both on (a TSO super-packet and a UDP GSO run
    /// cross the pair whole). Equal footing either way. (In the JSON: [`H3Bench::profile`](crate::bench::H3Bench::profile).)
    #[serde(skip)]
    pub profile: Profile,
    /// How the udpx servers send (`--cc`, `--burst`, `--coalesce`, `--defer-flush`,
    /// `--ack-defer`, `--zerocopy`; `udpx h3 serve`'s defaults unless given).
    #[serde(flatten)]
    pub host: udpx_h3::Tuning,
    /// The block cache of the `+cache` rows (the pairs of the clients users bring with udpx's
    /// cache on, `--cache-size`); 0: no such rows.
    pub cache_size: usize,
    /// Over veth: where each side's receive work runs (`--napi`, softirq by default).
    #[serde(serialize_with = "crate::lab::as_text")]
    pub napi: Napi,
    /// The peers to run (recorded in the JSON: which binaries ran).
    pub programs: Programs,
}

impl H3BenchConfig {
    /// 100 MB, 3 rounds, loopback, the peers in `PATH`.
    pub fn new() -> H3BenchConfig {
        H3BenchConfig {
            size: 100_000_000,
            repeat: 3,
            chromium_repeat: 5,
            cache_size: crate::DEFAULT_CACHE_SIZE,
            veth: false,
            profile: Profile::Software,
            host: udpx_h3::Tuning::default(),
            napi: Napi::Softirq,
            programs: Programs::from_path(),
        }
    }

    /// The longest one download may take before it is stopped and the run counted failed:
    /// 30 s plus 1 s per 2 MB (1 s per 16 Mbit/s).
    pub fn deadline(&self) -> Duration {
        Duration::from_secs(30) + Duration::from_secs_f64(self.size as f64 / 2e6)
    }
}

impl Default for H3BenchConfig {
    fn default() -> Self {
        H3BenchConfig::new()
    }
}

/// Which server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// `udpx h3 serve` in this process.
    Udpx {
        /// How its packets leave.
        io: IoMode,
        /// Whether it receives with UDP_GRO.
        gro: bool,
        /// Its block cache.
        cache: Cache,
    },
    /// nginx, HTTPS over TCP with TLS 1.3.
    Nginx,
    /// quinn with h3 (`udpx h3 quinn-serve`, a child process): the second HTTP/3 server.
    Quinn,
}

/// The block cache of a udpx row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// None (`--cache-size 0`).
    Off,
    /// [`H3BenchConfig::cache_size`]: room for the file (`+cache`).
    On,
    /// Half the file: a working set twice the cache (`+half cache`), what the cache costs
    /// where it cannot help (a recency list over a scan finds nothing).
    Half,
}

impl Cache {
    /// Its bound in bytes in a bench of `cfg` (its file of `cfg.size` bytes).
    pub fn bytes(self, cfg: &H3BenchConfig) -> usize {
        match self {
            Cache::Off => 0,
            Cache::On => cfg.cache_size,
            Cache::Half => usize::try_from(cfg.size / 2).unwrap_or(usize::MAX),
        }
    }

    /// The suffix of its rows' server name.
    fn suffix(self) -> &'static str {
        match self {
            Cache::Off => "",
            Cache::On => " +cache",
            Cache::Half => " +half cache",
        }
    }
}

/// Which client downloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// ngtcp2's `gtlsclient`, a child process.
    Gtlsclient,
    /// [`get`](udpx_h3::get) in this process (a thread of its own; not counted).
    UdpxGet,
    /// curl, a child process (HTTP/1.1 over TLS 1.3).
    Curl,
    /// Headless Chromium, a child process (`bench/bulk/browser.rs`): HTTP/3 from udpx, HTTP/2 from nginx.
    Chromium,
    /// The independent client (`udpx-quicgo-load --get`, a child process): quic-go's HTTP/3
    /// client from udpx, Go's HTTP/2 client from nginx; their acknowledgement policies their own.
    Independent,
}

impl ClientKind {
    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Gtlsclient => "gtlsclient",
            ClientKind::UdpxGet => "udpx h3 get",
            ClientKind::Curl => "curl",
            ClientKind::Chromium => "chromium",
            ClientKind::Independent => "quic-go / Go h2",
        }
    }
}

/// The server's name for a row.
pub(super) fn server_name(s: ServerKind) -> String {
    match s {
        ServerKind::Udpx { io, gro, cache } => {
            format!("{}{}{}", io.name(), if gro { " +GRO" } else { "" }, cache.suffix())
        }
        ServerKind::Nginx => NGINX.to_string(),
        ServerKind::Quinn => QUINN.to_string(),
    }
}

/// The udpx server's settings of the rows, in table order: the four modes without GRO, then
/// `gso` with GRO.
pub fn udpx_servers() -> Vec<ServerKind> {
    let mut v: Vec<ServerKind> =
        IoMode::ALL.iter().map(|&io| ServerKind::Udpx { io, gro: false, cache: Cache::Off }).collect();
    v.push(ServerKind::Udpx { io: IoMode::Gso, gro: true, cache: Cache::Off });
    v
}

impl H3BenchConfig {
    /// The rounds planned for a row of `client`'s: [`H3BenchConfig::chromium_repeat`] for the
    /// Chromium pair, [`H3BenchConfig::repeat`] for the others.
    pub fn rounds_of(&self, client: ClientKind) -> usize {
        if client == ClientKind::Chromium {
            self.chromium_repeat
        } else {
            self.repeat
        }
    }
}

/// The best udpx row's CPU per byte over nginx's, at most (issue 28): 1.0 where both
/// segment in software, 1.2 where neither does (QUIC pays per packet what TCP pays per
/// super-packet); on loopback the old 2.0.
pub fn nginx_target(cfg: &H3BenchConfig) -> f64 {
    match (cfg.veth, cfg.profile) {
        (false, _) => 2.0,
        (true, Profile::Software) => 1.0,
        (true, Profile::Offload) => 1.2,
    }
}
