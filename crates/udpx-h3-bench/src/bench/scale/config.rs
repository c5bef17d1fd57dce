//! The scale bench's settings: which servers and clients, how many players, what they fetch.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use udpx_lab::netns::Napi;

use crate::lab::Programs;

/// Which server a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ScaleServer {
    /// `udpx h3 serve`, one shard.
    Udpx,
    /// The same with every connection chosen for qlog (`--qlog-dir`, `--qlog-sample 1`, the
    /// default bounds: at most `--qlog-max-live` log at once): what that costs the shard, and
    /// what it leaves out (issue 48).
    /// Its `udpx` must be built with the feature `qlog`; not in [`ScaleServer::ALL`].
    UdpxQlog,
    /// The same serving from its block cache ([`ScaleConfig::cache_size`], `--cache-size`): a
    /// segment many players fetch is read from the file once, not per request. Not in
    /// [`ScaleServer::ALL`]: the scale rows' reference reads the file per request.
    UdpxCache,
    /// quinn with h3 (`udpx h3 quinn-serve`).
    Quinn,
    /// nginx, HTTP/2 over TLS 1.3, one worker.
    NginxH2,
    /// nginx, HTTP/1.1 over TLS 1.3, one worker.
    NginxH1,
}

impl ScaleServer {
    /// Every server, in table order.
    pub const ALL: [ScaleServer; 4] =
        [ScaleServer::Udpx, ScaleServer::Quinn, ScaleServer::NginxH2, ScaleServer::NginxH1];

    /// Whether it is `udpx h3 serve`.
    pub fn is_udpx(self) -> bool {
        matches!(self, ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::UdpxCache)
    }

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            ScaleServer::Udpx => "udpx h3",
            ScaleServer::UdpxQlog => "udpx h3 +qlog",
            ScaleServer::UdpxCache => "udpx h3 +cache",
            ScaleServer::Quinn => "quinn h3",
            ScaleServer::NginxH2 => "nginx h2/tcp",
            ScaleServer::NginxH1 => "nginx http1.1/tcp",
        }
    }
}

/// Which client plays a row's players.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LoadClient {
    /// udpx's own: `udpx h3 load` (quiche, one event loop) for the HTTP/3 servers, its TCP
    /// twin for nginx. It acknowledges least of all clients.
    Own,
    /// The independent one ([`crate::clients::quicgo`]): quic-go's HTTP/3 client, Go's `net/http`
    /// for nginx. The verdicts are judged with it.
    Independent,
    /// A second independent one ([`crate::clients::quinn_hyper`]): quinn with hyperium's `h3` for the
    /// HTTP/3 servers, hyper for nginx (the TCP client udpx's own rows use). The verdicts are
    /// judged with it too.
    Quinn,
}

impl LoadClient {
    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            LoadClient::Own => "udpx",
            LoadClient::Independent => "quic-go / Go",
            LoadClient::Quinn => "quinn / hyper",
        }
    }
}

/// The bench's settings.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleConfig {
    /// Connection counts of the sweep.
    pub connections: Vec<usize>,
    /// Idle connections of the idle row (`None`: no idle row).
    pub idle: Option<usize>,
    /// Segment bytes.
    pub segment: usize,
    /// The block cache of [`ScaleServer::UdpxCache`] (`udpx h3 serve --cache-size`); the
    /// other servers read the file per request.
    pub cache_size: usize,
    /// Between a player's requests.
    pub interval: Duration,
    /// Connection starts spread over at least this; a row opens at most
    /// [`PLAYER_OPENS_PER_SEC`] players (or [`IDLE_OPENS_PER_SEC`] idle connections) a second
    /// unless [`ScaleConfig::ramp_fixed`].
    pub ramp: Duration,
    /// `ramp` as given, for every row of players, whatever their number (`--ramp`).
    pub ramp_fixed: bool,
    /// The measured window.
    pub window: Duration,
    /// Client addresses.
    pub addresses: usize,
    /// The servers of the sweep.
    pub servers: Vec<ScaleServer>,
    /// The clients of the sweep: every row runs with each (the idle row with udpx's own).
    pub clients: Vec<LoadClient>,
    /// The independent client's program (`None`: not built; its rows left out).
    pub independent: Option<PathBuf>,
    /// The `udpx` binary that runs the HTTP/3 servers (this one, usually).
    pub udpx: PathBuf,
    /// nginx's path (`None`: its rows left out).
    pub nginx: Option<PathBuf>,
    /// Rounds: every row once per round, interleaved; a row shows its median run, the
    /// targets are judged on per-round ratios (3 rounds at least give a verdict).
    pub rounds: usize,
    /// How the udpx rows send: `udpx h3 serve`'s host flags, given to every udpx server.
    #[serde(flatten)]
    pub host: udpx_h3::Tuning,
    /// The idle row's PING period per connection.
    pub keepalive: Duration,
    /// Over veth: where each side's receive work runs (`--napi`, softirq by default).
    #[serde(serialize_with = "crate::lab::as_text")]
    pub napi: Napi,
}

/// Players a row opens per second at most (the ramp stretches to fit): one client process
/// stands for thousands of players, and while it is saturated opening them its
/// acknowledgements wait in its own queues. A QUIC server's congestion controller takes that
/// wait for the path's (kernel TCP acknowledges in softirq, out of the client's queues), and
/// BBRv2 paces those connections' next responses by it. Measured with quic-go's client (5,000
/// players, `udpx bench h3 --connections 5000 --interval 10 --servers udpx,nginx-h2 --clients
/// independent --napi threaded`, 2026-11-27): opening 1,000 a second its CPU was 75-93 % busy,
/// the server's 31-40 %, and udpx's p99 25-47 ms against nginx's 1.6-2.3 ms, every pacing hold
/// in a connection's second response; at 500 a second (`--ramp 10`) 40-68 %, p99 3.8 against
/// 1.1 ms, 0.008 holds per request instead of 0.28.
pub const PLAYER_OPENS_PER_SEC: u64 = 500;
/// Idle connections opened per second in the idle row (the ramp stretches to fit).
pub const IDLE_OPENS_PER_SEC: u64 = 1_000;

impl ScaleConfig {
    /// The ramp of a row of `n` connections (`idle`: the idle row's): the idle row's always
    /// fits [`IDLE_OPENS_PER_SEC`]; players' fit [`PLAYER_OPENS_PER_SEC`] unless the ramp was
    /// given.
    pub fn ramp_for(&self, n: usize, idle: bool) -> Duration {
        let fit = |per_sec: u64| self.ramp.max(Duration::from_secs_f64(n as f64 / per_sec as f64));
        match (idle, self.ramp_fixed) {
            (true, _) => fit(IDLE_OPENS_PER_SEC),
            (false, true) => self.ramp,
            (false, false) => fit(PLAYER_OPENS_PER_SEC),
        }
    }

    /// 100, 1,000 and 10,000 players of 16 KiB every 2 s, 50,000 idle, 64 addresses, a 5 s
    /// ramp and 15 s measured, every server; `udpx` the binary that runs the servers.
    pub fn new(udpx: PathBuf) -> ScaleConfig {
        ScaleConfig {
            connections: vec![100, 1_000, 10_000],
            idle: Some(50_000),
            segment: 16 * 1024,
            cache_size: crate::DEFAULT_CACHE_SIZE,
            interval: Duration::from_secs(2),
            ramp: Duration::from_secs(5),
            ramp_fixed: false,
            window: Duration::from_secs(15),
            addresses: 64,
            servers: ScaleServer::ALL.to_vec(),
            clients: vec![LoadClient::Own, LoadClient::Independent],
            independent: crate::clients::quicgo::find(),
            udpx,
            nginx: Programs::from_path().nginx,
            rounds: 1,
            host: udpx_h3::Tuning::default(),
            keepalive: Duration::from_secs(10),
            napi: Napi::Softirq,
        }
    }
}
