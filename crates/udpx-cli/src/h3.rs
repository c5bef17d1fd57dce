//! `udpx h3`: the HTTP/3 file server and client (crates udpx-h3 and udpx-quic).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use udpx_h3::{GetConfig, ServeConfig, SiteOptions, Tls};
use udpx_quic::IoMode;

use crate::host_flags::{HostFlags, OnOff};
use crate::util::{self, duration};

#[derive(Args, Debug)]
pub struct H3Args {
    #[command(subcommand)]
    cmd: H3Cmd,
}

#[derive(Subcommand, Debug)]
enum H3Cmd {
    /// Serve the files under DIR over HTTP/3 (GET, HEAD), one event loop per shard.
    Serve(Box<ServeArgs>),
    /// Fetch one URL over HTTP/3 and print status, bytes, time and throughput.
    Get(GetArgs),
    /// Many clients in one event loop, each a video player fetching a segment every interval:
    /// requests served, latency, lateness, handshake time, the client's CPU.
    Load(LoadArgs),
    /// The bench's second HTTP/3 server: quinn with hyperium's h3 (not udpx's datapath).
    #[command(hide = true)]
    QuinnServe(QuinnServeArgs),
}

#[derive(Args, Debug)]
struct LoadArgs {
    #[arg(help = "The server: IP:PORT (HTTP/3), or HTTPS over TCP with --tcp.")]
    server: SocketAddr,
    /// Connections (players).
    #[arg(short = 'n', long, default_value_t = 1000)]
    connections: usize,
    /// The path each player asks for.
    #[arg(long, default_value = "/segment")]
    path: String,
    /// Seconds between a player's requests (0: idle connections that only keep alive).
    #[arg(long, default_value_t = 2.0)]
    interval: f64,
    /// Seconds over which the connections start.
    #[arg(long, default_value_t = 5.0)]
    ramp: f64,
    /// Seconds measured, after the ramp.
    #[arg(short = 'l', long, default_value_t = 15.0)]
    duration: f64,
    /// Local addresses to send from, round robin (repeatable); default: the kernel's choice.
    #[arg(long = "local")]
    locals: Vec<std::net::IpAddr>,
    /// HTTPS over TCP instead of HTTP/3: h2 or http1.1 (the server's certificate from --ca,
    /// checked for the name localhost).
    #[arg(long, value_parser = ["h2", "http1.1"], requires = "ca")]
    tcp: Option<String>,
    /// The CA (or self-signed certificate) to trust over TCP.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// One JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct QuinnServeArgs {
    dir: PathBuf,
    #[arg(long)]
    listen: SocketAddr,
    #[arg(long)]
    cert: PathBuf,
    #[arg(long)]
    key: PathBuf,
    /// Stop after this many seconds.
    #[arg(short = 'l', long, default_value_t = 60.0)]
    duration: f64,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Io {
    /// One sendmsg per packet.
    Sendmsg,
    /// sendmmsg: many packets per call.
    Sendmmsg,
    /// One GSO run (equal-size packets to one peer) per sendmsg.
    Gso,
    /// Several GSO runs per sendmmsg.
    GsoMmsg,
}

impl From<Io> for IoMode {
    fn from(i: Io) -> IoMode {
        match i {
            Io::Sendmsg => IoMode::Sendmsg,
            Io::Sendmmsg => IoMode::Sendmmsg,
            Io::Gso => IoMode::Gso,
            Io::GsoMmsg => IoMode::GsoMmsg,
        }
    }
}

#[derive(Args, Debug)]
#[allow(clippy::struct_excessive_bools)] // reason: command-line flags, each a switch of its own
struct ServeArgs {
    /// The directory to serve.
    dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:4433")]
    listen: SocketAddr,
    /// Certificate chain (PEM); with --key. Without both, a self-signed certificate is made.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM); with --cert.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// How packets leave.
    #[arg(long, value_enum, default_value_t = Io::GsoMmsg)]
    io: Io,
    /// Receive with UDP_GRO where the kernel has it.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    gro: OnOff,
    /// Event loops, one socket and thread each (1 to 256; default: one per CPU).
    #[arg(long)]
    shards: Option<usize>,
    /// QUIC-LB host ID written into every connection ID (0 to 65535).
    #[arg(long, default_value_t = 0)]
    host_id: u16,
    /// Largest UDP payload to send (1200 to 65527).
    #[arg(long, default_value_t = udpx_h3::server::DEFAULT_MAX_UDP_PAYLOAD)]
    max_udp_payload: usize,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(short = 'l', long)]
    duration: Option<f64>,
    /// Append a line per request to this file (`-`: standard output): time, client, method,
    /// path, status, body bytes, duration, protocol.
    #[arg(long, value_name = "FILE")]
    access_log: Option<PathBuf>,
    /// The cache-control of file responses (200, 206, 304).
    #[arg(long, default_value = "no-cache")]
    cache_control: String,
    /// Let pages of this origin read the answers (CORS: a web player on another site fetching
    /// segments and ranges): `https://player.example` as a browser sends it, repeatable, or
    /// `*` for any origin. Preflights are answered; every answer carries the headers.
    #[arg(long, value_name = "ORIGIN")]
    cors: Vec<String>,
    /// Also serve the same files over HTTPS on TCP at this address (HTTP/1.1 and HTTP/2, the
    /// same certificate), every answer announcing HTTP/3 with `alt-svc`: a browser that starts
    /// on TCP moves to HTTP/3 by itself.
    #[arg(long, value_name = "ADDR")]
    alt_svc_tcp: Option<SocketAddr>,
    /// HTTPS over TCP: connections at once; at the cap the one idle longest is closed to make
    /// room (GOAWAY first for HTTP/2), and with every one busy a new one is closed.
    #[arg(long, value_name = "N", default_value_t = udpx_h3::tcp::TcpLimits::default().max_connections,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    tcp_max_connections: usize,
    /// HTTPS over TCP: connections at once from one address (an IPv6 /64); at most
    /// --tcp-max-connections, so that no one address can hold them all.
    #[arg(long, value_name = "N", default_value_t = udpx_h3::tcp::TcpLimits::default().per_source,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    tcp_per_source: usize,
    /// A file holding the secret (64 hex digits) every host of the service shares: stateless
    /// resets (a host ends connections a balancer sends it that it does not have, instead of
    /// leaving the client to its idle timeout), Retry tokens and session tickets (resumption
    /// and 0-RTT on any host) are derived from it. Without it they are this process's own.
    #[arg(long, value_name = "FILE", alias = "reset-key-file")]
    key_file: Option<PathBuf>,
    /// Send no stateless resets even with --key-file: behind a balancer that pins a client's
    /// 4-tuple to a host whatever its connection IDs say (dnat with conntrack), answering
    /// another host's IDs with resets would hand an attacker their tokens (RFC 9000 21.11).
    #[arg(long, requires = "key_file")]
    no_stateless_resets: bool,
    /// A file of host IDs taken out of the service (decimal or 0x hex, separated by commas,
    /// spaces or lines; `#` starts a comment; it must end with a newline, and a file that does
    /// not is refused as half-written: publish it by rename), read at start and again on
    /// SIGHUP. Stateless
    /// resets (with --key-file) answer only this host's own connection IDs and those of the
    /// hosts listed here: never a live host's, whose packets may reach this one by mistake.
    #[arg(long, value_name = "FILE", requires = "key_file")]
    removed_hosts: Option<PathBuf>,
    /// Address validation with Retry: `always`, `never`, or `auto` (while half-open handshakes
    /// pass a quarter of --max-half-open: under an Initial flood).
    #[arg(long, default_value = "auto")]
    retry: udpx_quic::RetryPolicy,
    /// Connections per shard at most (Initials past it are dropped, counted).
    #[arg(long, default_value_t = udpx_quic::Limits::default().max_connections)]
    max_connections: usize,
    /// Handshakes under way per shard at most.
    #[arg(long, default_value_t = udpx_quic::Limits::default().max_half_open)]
    max_half_open: usize,
    /// Connections per shard from one address (IPv6: one /64) at most.
    #[arg(long, default_value_t = udpx_quic::Limits::default().max_per_ip)]
    max_per_ip: usize,
    /// Seconds a handshake may take before the connection is dropped (long enough for a
    /// client's backed-off retransmissions on a lossy path).
    #[arg(long, default_value_t = udpx_quic::Limits::default().handshake_timeout.as_secs_f64())]
    handshake_timeout: f64,
    /// Seconds a handshake may take if it began while a quarter of --max-half-open was in use
    /// (an Initial flood: the half-open slots must turn over); at most --handshake-timeout.
    #[arg(long, default_value_t = udpx_quic::Limits::default().flood_handshake_timeout.as_secs_f64())]
    flood_handshake_timeout: f64,
    /// Accept 0-RTT from resuming clients: GET and HEAD answered from early data, other
    /// methods 425 Too Early.
    #[arg(long)]
    early_data: bool,
    /// Send GREASE (reserved frame, stream and transport parameter values that exercise a
    /// peer's handling of unknown ones). Off by default: it costs about 3 KiB per connection
    /// (quiche's table of streams doubles at the eighth). What peers send is handled either way.
    #[arg(long)]
    grease: bool,
    /// The QUIC host's settings (shared with `udpx bench h3`).
    #[command(flatten)]
    host: HostFlags,
    /// Responses with an open file one connection may hold (503 past it; a client has at most
    /// 100 request streams open at once).
    #[arg(long, default_value_t = 100)]
    max_open_per_conn: usize,
    /// Responses with an open file one shard may hold (503 past it).
    #[arg(long, default_value_t = udpx_h3::DEFAULT_MAX_OPEN_PER_SHARD)]
    max_open_per_shard: usize,
    /// Of them, what the connections of one address (IPv6: one /64) may hold on a shard (503
    /// past it), so that one client cannot take every file of the shard.
    #[arg(long, default_value_t = udpx_h3::DEFAULT_MAX_OPEN_PER_ADDR)]
    max_open_per_addr: usize,
    /// A block cache of this many bytes (k, M, G): HTTP/3 bodies read once into 256 KiB
    /// blocks that every response and shard share and send without a copy (the same segment to
    /// many viewers comes from the file once). It counts blocks packets still hold; a file
    /// larger than it streams. Publish files by rename. 0 (the default): off.
    #[arg(long, default_value = "0", value_parser = parse_cache_size, value_name = "BYTES")]
    cache_size: u64,
    /// An HTTP/3 response that takes less than 16 KiB in this many seconds (a paused video, a
    /// shut flow-control window) is parked: it closes its file and waits for the client to
    /// read again, then reopens it and goes on if the file is unchanged (same ETag), else its
    /// stream is reset. Its connection and other streams go on. 1 to 3600.
    #[arg(long, value_name = "SECS", default_value_t = udpx_h3::DEFAULT_STALL_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    stall_timeout: u64,
    /// A parked HTTP/3 response whose client has not read again for this many seconds is
    /// reset (RESET_STREAM; the connection and its other streams go on). 1 to 86400.
    #[arg(long, value_name = "SECS", default_value_t = udpx_h3::DEFAULT_PARK_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    park_timeout: u64,
    /// An HTTP/3 connection with no request and no response under way for this many seconds
    /// is closed (a client that PINGs would keep it for ever). 1 to 86400.
    #[arg(long, value_name = "SECS", default_value_t = udpx_h3::DEFAULT_IDLE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_timeout: u64,
    /// The graceful stop (SIGTERM or SIGQUIT; a second signal or SIGINT stops at once): no new
    /// connection is admitted, every connection gets GOAWAY and finishes its responses, and
    /// what is left after this many seconds is closed cleanly (CONNECTION_CLOSE). 0 to 86400.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    drain_timeout: u64,
    /// Start as the upgrade of the server running on the same address: take over its new
    /// connections (it keeps every packet of its own until they end, then exits after its
    /// drain). Give the same arguments as the running server. Needs eBPF (CAP_BPF and
    /// CAP_NET_ADMIN, or root), as the running server did.
    #[arg(long)]
    upgrade: bool,
    /// The Unix socket where this server waits for its upgrade (and, with --upgrade, finds the
    /// server it upgrades); `off` for none (classic-BPF steering, no upgrade). Default:
    /// /run/udpx/h3-ADDR-PORT.sock as root, else under $XDG_RUNTIME_DIR/udpx or /tmp/udpx-UID.
    #[arg(long, value_name = "PATH|off")]
    upgrade_socket: Option<String>,
    /// Append the TLS secrets of every new connection, HTTP/3 and HTTPS over TCP, to this file
    /// (the NSS key log format that SSLKEYLOGFILE names for curl and browsers), so that
    /// Wireshark or tshark can decrypt a capture: `tshark -r cap.pcapng -o
    /// tls.keylog_file:FILE`. Whoever reads it can decrypt the captured traffic: it is created
    /// 0600, and a path that is a symbolic link, someone else's, or readable by others is
    /// refused. The server warns of it at start and every minute; at most 160 MiB is written
    /// (later lines are dropped, counted in keylog_dropped). The SSLKEYLOGFILE variable itself
    /// is ignored (and said so).
    #[arg(long, value_name = "FILE")]
    keylog_file: Option<PathBuf>,
    /// Write a qlog file (JSON-SEQ, for qvis or a script: every packet, loss, window and
    /// HTTP/3 frame) for each chosen connection into this directory (made 0750 if missing),
    /// named by the time it began and its connection ID. Chosen: the connections from
    /// --qlog-peer addresses, and a --qlog-sample fraction of the rest (every one when neither
    /// is given). Written by a thread of its own through a bounded queue: a shard never waits
    /// for the disk; a record that finds the queue full is dropped (qlog_dropped). Needs a
    /// build with `--features qlog`.
    #[arg(long, value_name = "DIR")]
    qlog_dir: Option<PathBuf>,
    /// With --qlog-dir: the fraction of connections logged, 0 to 1 (default: 1 without
    /// --qlog-peer(s), 0 with them). To change it on SIGHUP, give it in the --qlog-peers file
    /// instead (`sample=F`).
    #[arg(long, value_name = "F", requires = "qlog_dir")]
    qlog_sample: Option<f64>,
    /// With --qlog-dir: log every connection from this address (repeatable): how to take the
    /// qlog of one viewer.
    #[arg(long, value_name = "IP", requires = "qlog_dir")]
    qlog_peer: Vec<std::net::IpAddr>,
    /// With --qlog-dir: a file of addresses to log every connection of, besides --qlog-peer
    /// (separated by commas, spaces or lines; `#` comments; it must end with a newline: publish
    /// it by rename), and optionally `sample=F`, the fraction of the other connections logged;
    /// read at start and again on SIGHUP: start or stop following a viewer, or change the
    /// sample, without a restart.
    #[arg(long, value_name = "FILE", requires = "qlog_dir")]
    qlog_peers: Option<PathBuf>,
    /// With --qlog-dir: files made at most in the process's life; connections chosen past it
    /// are not logged (qlog_skipped).
    #[arg(long, value_name = "N", default_value_t = udpx_quic::qlog::DEFAULT_MAX_FILES,
          value_parser = clap::value_parser!(u64).range(1..))]
    qlog_max_files: u64,
    /// With --qlog-dir: sampled connections logging at once at most; one chosen past it is not
    /// logged (qlog_busy). quiche turns every event into JSON on the shard's thread: 10,000
    /// players all logged saturate a shard. Connections of --qlog-peer(s) always log.
    #[arg(long, value_name = "N", default_value_t = udpx_quic::qlog::DEFAULT_MAX_LIVE,
          value_parser = clap::value_parser!(u64).range(1..))]
    qlog_max_live: u64,
    /// With --qlog-dir: bytes written at most in all (k, M, G); records past it are dropped
    /// (qlog_dropped).
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = util::parse_size_arg)]
    qlog_max_bytes: u64,
    /// Serve Prometheus metrics (`GET /metrics`): each shard's socket and QUIC counters, and
    /// the HTTP responses by status class. A port alone listens on 127.0.0.1; give an address
    /// (0.0.0.0:9100) to let other hosts scrape it.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = udpx_metrics::parse_listen)]
    metrics: Option<SocketAddr>,
}

#[derive(Args, Debug)]
struct GetArgs {
    // The help as an attribute, not a doc comment: rustdoc would read `[:PORT]` as a link.
    #[arg(help = "https://HOST[:PORT]/PATH")]
    url: String,
    /// Write the body here (default: count it and discard it).
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
    /// How packets leave.
    #[arg(long, value_enum, default_value_t = Io::GsoMmsg)]
    io: Io,
    /// Receive with UDP_GRO where the kernel has it.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    gro: OnOff,
    /// Largest UDP payload to send (1200 to 65527).
    #[arg(long, default_value_t = udpx_h3::server::DEFAULT_MAX_UDP_PAYLOAD)]
    max_udp_payload: usize,
    /// One JSON object (with the client's counters) instead of the line.
    #[arg(long)]
    json: bool,
    /// Send HEAD instead of GET.
    #[arg(long)]
    head: bool,
    /// Read the body at most this fast, bytes a second (K, M, G: powers of 1024), as curl's
    /// --limit-rate: flow control holds the server back.
    #[arg(long, value_parser = util::parse_size_arg, value_name = "BYTES")]
    limit_rate: Option<u64>,
    /// Add a request header field, `NAME: VALUE` (repeatable), e.g. -H 'range: bytes=0-99'.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Print the response's header fields (to standard error).
    #[arg(short = 'i', long)]
    include: bool,
}

/// `udpx bench h3`.
#[derive(Args, Debug)]
pub struct H3BenchArgs {
    /// Bytes of the file downloaded per row and round (k, M, G: decimal; 100M = 10^8 bytes).
    #[arg(long, value_parser = util::parse_size_arg, default_value = "100M")]
    size: u64,
    /// Rounds: each downloads once per row, interleaved; the table shows medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    repeat: u64,
    /// Rounds of the Chromium pair (udpx and nginx serving Chromium), interleaved with the
    /// others' rounds: its verdict needs at least 5; 0 leaves the pair out.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=100))]
    chromium_repeat: u64,
    /// The block cache of the `+cache` rows (udpx serving the clients users bring with
    /// `--cache-size` on, beside the same without it, and Chromium's `+half cache` row with a
    /// cache of half the file): default 256M; 0 leaves them out. With --connections: the
    /// cache of the `udpx-cache` server (default 256M); the others read the file per request.
    #[arg(long, value_parser = parse_cache_size, value_name = "BYTES")]
    cache_size: Option<u64>,
    /// Over a veth pair between two namespaces (needs root). As root this is the default,
    /// as for `udpx bench`; without root the bench runs on loopback.
    #[arg(long, conflicts_with = "loopback")]
    veth: bool,
    /// On loopback even as root (there the client's receive work is charged to the server).
    #[arg(long)]
    loopback: bool,
    /// Over veth: who segments the server's sends. software: TSO and UDP segmentation offload
    /// off on the server's device (both split in the server's context); offload: both on (they
    /// cross the pair whole); both: one table each.
    #[arg(long, value_enum, default_value = "both", conflicts_with = "loopback")]
    profile: BenchProfile,
    /// Over veth, the bulk and scale tables: where the server's receive work runs on its CPU.
    /// softirq: in softirq, steered (RPS) there, TCP and UDP alike, as after a NIC's interrupt
    /// (UDP's veth poll and GRO stay on the client's CPU); threaded: UDP's in a NAPI thread
    /// pinned there (a thread switch per poll a NIC does not make), TCP's still in softirq
    /// (veth never hands TCP from a TSO end to the thread). The client's is threaded in both.
    #[arg(long, default_value = "softirq", value_name = "softirq|threaded")]
    napi: udpx_lab::netns::Napi,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// The scale table instead: this many concurrent players per row (comma-separated), each
    /// fetching a segment every --interval, against udpx, quinn with h3, and nginx over TCP
    /// (HTTP/2, HTTP/1.1).
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    connections: Vec<usize>,
    /// With --connections: also a row of this many idle connections (0: none).
    #[arg(long, default_value_t = 50_000, requires = "connections")]
    idle: usize,
    /// With --connections: seconds between a player's requests.
    #[arg(long, default_value_t = 2.0, requires = "connections")]
    interval: f64,
    /// With --connections or --viewers: seconds over which every row's players start.
    /// Default: 5 s, or with --connections longer so that a row opens at most 500 players
    /// (1,000 idle connections) a second: one client process opening more is saturated, and
    /// its late acknowledgements teach the server's congestion controller a wrong path.
    #[arg(long)]
    ramp: Option<f64>,
    /// With --connections or --viewers: seconds measured per row (default 15).
    #[arg(long)]
    window: Option<f64>,
    /// With --connections: rounds (a verdict needs 3).
    #[arg(long, default_value_t = 1, requires = "connections")]
    rounds: usize,
    /// With --connections: seconds between an idle connection's PINGs (the idle row's load).
    #[arg(long, default_value_t = 10.0, requires = "connections")]
    keepalive: f64,
    /// With --connections: the segment each player fetches, bytes (the seeds' video rate: 1 MiB
    /// every --interval 1).
    #[arg(long, default_value_t = 16 * 1024, requires = "connections", value_name = "BYTES")]
    segment: usize,
    /// With --connections: which clients play every row (comma-separated): own (`udpx h3
    /// load`), independent (quic-go's HTTP/3 client and Go's net/http, built by
    /// scripts/setup.sh), quinn (quinn with hyperium's h3; hyper for nginx), both (own and
    /// independent) or all. The verdicts are judged with each independent one that ran.
    #[arg(
        long,
        default_value = "both",
        requires = "connections",
        value_delimiter = ',',
        value_name = "own|independent|quinn|both|all"
    )]
    clients: Vec<ClientChoice>,
    /// With --connections: the servers of the sweep (comma-separated; default all but
    /// udpx-qlog, udpx with a qlog of every connection, for which this udpx must be built with
    /// `--features qlog`, and udpx-cache, udpx serving from a block cache of --cache-size).
    #[arg(
        long,
        value_delimiter = ',',
        requires = "connections",
        value_name = "udpx,udpx-qlog,udpx-cache,quinn,nginx-h2,nginx-h1",
        default_value = "udpx,quinn,nginx-h2,nginx-h1"
    )]
    servers: Vec<ServerChoice>,
    /// The udpx servers' settings, as `udpx h3 serve`'s (every table; quinn and nginx keep
    /// their own).
    #[command(flatten, next_help_heading = "The udpx servers (as udpx h3 serve)")]
    host: HostFlags,
    /// The Initial flood instead (root: the attack lab's namespaces): this many forged client
    /// Initials a second from random addresses against `udpx h3 serve`, while a legitimate
    /// client downloads; one row per --flood-retry mode.
    #[arg(long, value_name = "PER_SEC", conflicts_with = "connections",
          value_parser = clap::value_parser!(u64).range(1..=200_000))]
    flood: Option<u64>,
    /// The burst rules through a bottleneck instead (root: namespaces and a router): a tbf
    /// of this many Mbit/s on the router's egress, one --size download per --burst mode
    /// (quantum, window: each row's, whatever --burst says) and --repeat round, losses and
    /// packets per call side by side.
    #[arg(long, value_name = "MBIT", conflicts_with_all = ["connections", "flood"],
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    bottleneck: Option<u64>,
    /// With --bottleneck: milliseconds of queue at the bottleneck's rate (tbf's latency).
    #[arg(long, default_value_t = 2, requires = "bottleneck", value_parser = clap::value_parser!(u64).range(1..=1000))]
    bottleneck_buffer: u64,
    /// With --bottleneck: milliseconds of round trip the router adds, half each way (a
    /// user-space delay line: no netem needed).
    #[arg(long, value_name = "MS", requires = "bottleneck", value_parser = clap::value_parser!(u64).range(1..=2000))]
    rtt: Option<u64>,
    /// With --bottleneck and --rtt: the viewers' tail instead of one download: this many
    /// players, each a 512 KiB segment every second, CUBIC against BBRv2 and nginx (HTTP/2
    /// over TCP), --repeat rounds (each udpx row under its controller, whatever --cc says; the
    /// other host flags apply); quic-go's client when scripts/setup.sh built it (nginx's row
    /// needs it), else udpx's own.
    #[arg(long, value_name = "N", requires = "rtt", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    viewers: Option<u64>,
    /// The upgrade, reload and restart table instead (root: namespaces and eBPF): this many
    /// players (a 64 KiB segment every 2 s each) while udpx is upgraded, reloaded and
    /// restarted, and nginx over TCP reloaded and binary-upgraded, --restart-changes times a row.
    #[arg(long, value_name = "PLAYERS", conflicts_with_all = ["connections", "flood", "bottleneck"],
          value_parser = clap::value_parser!(u64).range(1..=20_000))]
    restart: Option<u64>,
    /// With --restart: seconds measured per row (the changes fall evenly inside).
    #[arg(long, default_value_t = 60, requires = "restart", value_parser = clap::value_parser!(u64).range(4..=600))]
    restart_seconds: u64,
    /// With --restart: changes per row.
    #[arg(long, default_value_t = 3, requires = "restart", value_parser = clap::value_parser!(u64).range(1..=20))]
    restart_changes: u64,
    /// With --flood: seconds the flood lasts.
    #[arg(long, default_value_t = 30, requires = "flood", value_parser = clap::value_parser!(u64).range(1..=600))]
    flood_seconds: u64,
    /// With --flood: the `udpx h3 serve --retry` modes, one row each.
    #[arg(long, value_delimiter = ',', default_value = "never,auto", requires = "flood", value_parser = ["never", "auto", "always"])]
    flood_retry: Vec<String>,
}

/// A root-only lab's ending: SKIP without root (`needs`: what for), its table or its JSON
/// under `key`, or its error.
fn lab_report<T: serde::Serialize>(
    cmd: &str,
    needs: &str,
    key: &str,
    json: bool,
    result: Result<Option<T>, String>,
    table: fn(&T) -> String,
) -> ExitCode {
    match result {
        Ok(None) => {
            eprintln!("udpx {cmd}: SKIP: {needs}");
            ExitCode::from(crate::exit::SKIPPED)
        }
        Ok(Some(b)) => {
            if json {
                println!("{}", serde_json::json!({ key: b }));
            } else {
                println!("{}", table(&b));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("udpx {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Removes the lab's namespaces and processes on Ctrl-C (as root; the lab needs it).
fn lab_cleanup(cmd: &str) {
    if udpx_lab::netns::is_root() {
        crate::util::signal_cleanup(cmd);
    }
}

/// `--servers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ServerChoice {
    Udpx,
    /// `udpx h3 serve` with a qlog of every connection (this udpx built with `--features
    /// qlog`): what logging them all costs (not in the default list).
    UdpxQlog,
    /// `udpx h3 serve` serving from its block cache (--cache-size, default 256M): a segment
    /// many players fetch is read once (not in the default list).
    UdpxCache,
    Quinn,
    NginxH2,
    NginxH1,
}

/// `--clients`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ClientChoice {
    Own,
    Independent,
    Quinn,
    Both,
    All,
}

/// `udpx bench h3 --bottleneck`: the burst rules through a shallow bottleneck.
fn bench_bottleneck(a: H3BenchArgs, mbit: u64) -> ExitCode {
    const CMD: &str = "bench h3 --bottleneck";
    lab_cleanup(CMD);
    if let (Some(viewers), Some(rtt)) = (a.viewers, a.rtt) {
        let mut cfg = udpx_h3_bench::bench::tail::TailConfig::new();
        (cfg.mbit, cfg.buffer, cfg.rtt) =
            (mbit, Duration::from_millis(a.bottleneck_buffer), Duration::from_millis(rtt));
        (cfg.viewers, cfg.rounds, cfg.host) = (viewers as usize, a.repeat as usize, a.host.tuning());
        for (flag, given, to) in [("--ramp", a.ramp, &mut cfg.ramp), ("--window", a.window, &mut cfg.window)] {
            match given.map(|v| duration(flag, v)) {
                Some(Ok(d)) => *to = d,
                Some(Err(e)) => return usage(e),
                None => {}
            }
        }
        if let Err(e) = cfg.check() {
            return usage(e);
        }
        let r = udpx_h3_bench::bench::tail::run(&cfg, &mut |l| eprintln!("udpx {CMD} --viewers: {l}"));
        let needs = "the bottleneck lab needs root (network namespaces)";
        return lab_report(CMD, needs, "h3_tail", a.json, r, udpx_h3_bench::bench::tail::table);
    }
    let cfg = udpx_h3_bench::bench::burst::BottleneckConfig {
        mbit,
        buffer: Duration::from_millis(a.bottleneck_buffer),
        size: a.size,
        rounds: a.repeat as usize,
        host: a.host.tuning(),
        rtt: a.rtt.map(Duration::from_millis),
    };
    let r = udpx_h3_bench::bench::burst::run(&cfg, &mut |l| eprintln!("udpx {CMD}: {l}"));
    let needs = "the bottleneck lab needs root (network namespaces)";
    lab_report(CMD, needs, "h3_bottleneck", a.json, r, udpx_h3_bench::bench::burst::table)
}

/// `udpx bench h3 --flood`: the Initial flood table.
fn bench_flood(a: H3BenchArgs, rate: u64) -> ExitCode {
    const CMD: &str = "bench h3 --flood";
    let Ok(udpx) = std::env::current_exe() else {
        return usage("cannot find this program's path to start the server");
    };
    lab_cleanup(CMD);
    let mut cfg = udpx_h3_bench::bench::flood::FloodConfig::new(udpx);
    cfg.host = a.host.tuning();
    (cfg.rate, cfg.duration, cfg.retry) = (rate, Duration::from_secs(a.flood_seconds), a.flood_retry.clone());
    let r = udpx_h3_bench::bench::flood::run(&cfg, &mut |l| eprintln!("udpx {CMD}: {l}"));
    let needs = "the attack lab needs root (network namespaces, raw sockets)";
    lab_report(CMD, needs, "h3_flood", a.json, r, udpx_h3_bench::bench::flood::table)
}

/// `--cache-size`: 0 (off), or 1 MB to 100 GB.
fn parse_cache_size(s: &str) -> Result<u64, String> {
    if s == "0" {
        return Ok(0);
    }
    let v = util::parse_size_arg(s)?;
    if v < 1_000_000 {
        return Err(format!("{s:?}: give 0 (off) or at least 1M (a block is 256 KiB)"));
    }
    Ok(v)
}

/// `udpx bench h3 --restart`: the upgrade, reload and restart table.
fn bench_restart(a: H3BenchArgs, players: u64) -> ExitCode {
    const CMD: &str = "bench h3 --restart";
    let Ok(udpx) = std::env::current_exe() else {
        return usage("cannot find this program's path to start the server");
    };
    lab_cleanup(CMD);
    let mut cfg = udpx_h3_bench::bench::restart::RestartConfig::new(udpx);
    cfg.host = a.host.tuning();
    cfg.players = players as usize;
    cfg.window = Duration::from_secs(a.restart_seconds);
    cfg.changes = a.restart_changes as usize;
    let r = udpx_h3_bench::bench::restart::run(&cfg, &mut |l| eprintln!("udpx {CMD}: {l}"));
    let needs = "the restart lab needs root (network namespaces, eBPF steering)";
    lab_report(CMD, needs, "h3_restart", a.json, r, udpx_h3_bench::bench::restart::table)
}

/// `udpx bench h3 --connections`: the scale table.
fn bench_scale(a: H3BenchArgs) -> ExitCode {
    const CMD: &str = "bench h3";
    let secs = |flag: &str, v: f64| duration(flag, v);
    let (interval, ramp, window) = match (
        secs("--interval", a.interval),
        secs("--ramp", a.ramp.unwrap_or(5.0)),
        secs("--window", a.window.unwrap_or(15.0)),
    ) {
        (Ok(i), Ok(r), Ok(w)) => (i, r, w),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return usage(e),
    };
    if !(a.keepalive >= 0.1 && a.keepalive <= 3600.0) {
        return usage("--keepalive: give 0.1 to 3600 seconds");
    }
    if a.connections.iter().any(|&n| n == 0 || n > 200_000) || a.idle > 200_000 {
        return usage("--connections / --idle: give 1 to 200000 each");
    }
    if a.rounds == 0 || a.rounds > 20 {
        return usage("--rounds: give 1 to 20");
    }
    let Ok(udpx) = std::env::current_exe() else {
        return usage("cannot find this program's path to start the servers");
    };
    let mut cfg = udpx_h3_bench::bench::scale::ScaleConfig::new(udpx);
    cfg.connections = a.connections.clone();
    cfg.idle = (a.idle > 0).then_some(a.idle);
    (cfg.interval, cfg.ramp, cfg.window, cfg.rounds) = (interval, ramp, window, a.rounds);
    cfg.ramp_fixed = a.ramp.is_some();
    cfg.host = a.host.tuning();
    cfg.keepalive = Duration::from_secs_f64(a.keepalive);
    cfg.napi = a.napi;
    if !(1..=64 << 20).contains(&a.segment) {
        return usage("--segment: give 1 to 67108864 bytes");
    }
    cfg.segment = a.segment;
    use udpx_h3_bench::bench::scale::ScaleServer;
    cfg.servers = a
        .servers
        .iter()
        .map(|s| match s {
            ServerChoice::Udpx => ScaleServer::Udpx,
            ServerChoice::UdpxQlog => ScaleServer::UdpxQlog,
            ServerChoice::UdpxCache => ScaleServer::UdpxCache,
            ServerChoice::Quinn => ScaleServer::Quinn,
            ServerChoice::NginxH2 => ScaleServer::NginxH2,
            ServerChoice::NginxH1 => ScaleServer::NginxH1,
        })
        .collect();
    cfg.servers.dedup();
    match (a.cache_size, cfg.servers.contains(&ScaleServer::UdpxCache)) {
        (Some(0), true) => {
            return usage("--cache-size 0 with --servers udpx-cache: give that server's cache a size (1M or more)")
        }
        (Some(1..), false) => {
            return usage(
                "--cache-size with --connections sizes the udpx-cache server's cache: add udpx-cache to --servers",
            )
        }
        (Some(bytes), true) => cfg.cache_size = bytes as usize,
        (Some(0) | None, _) => {}
    }
    use udpx_h3_bench::bench::scale::LoadClient;
    cfg.clients = Vec::new();
    for c in &a.clients {
        let these: &[LoadClient] = match c {
            ClientChoice::Own => &[LoadClient::Own],
            ClientChoice::Independent => &[LoadClient::Independent],
            ClientChoice::Quinn => &[LoadClient::Quinn],
            ClientChoice::Both => &[LoadClient::Own, LoadClient::Independent],
            ClientChoice::All => &[LoadClient::Own, LoadClient::Independent, LoadClient::Quinn],
        };
        for &x in these {
            if !cfg.clients.contains(&x) {
                cfg.clients.push(x);
            }
        }
    }
    if a.clients == [ClientChoice::Independent] && cfg.independent.is_none() {
        return usage(format!(
            "--clients independent: {} is not installed: run scripts/setup.sh (it builds peers/quicgo-load)",
            udpx_h3_bench::clients::quicgo::PROGRAM
        ));
    }
    lab_cleanup(CMD);
    crate::util::raise_open_files(CMD);
    let b = match udpx_h3_bench::bench::scale::run(&cfg, &mut |l| eprintln!("udpx {CMD}: {l}")) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("udpx {CMD}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if a.json {
        println!("{}", serde_json::json!({ "h3_scale": b }));
    } else {
        println!("{}", udpx_h3_bench::bench::scale::table(&b));
    }
    ExitCode::SUCCESS
}

/// `udpx h3 load`.
fn load(a: LoadArgs) -> ExitCode {
    const CMD: &str = "h3 load";
    let (ramp, dur) = match (duration("--ramp", a.ramp.max(1e-9)), duration("--duration", a.duration)) {
        (Ok(r), Ok(d)) => (if a.ramp == 0.0 { std::time::Duration::ZERO } else { r }, d),
        (Err(e), _) | (_, Err(e)) => return util::usage(CMD, e),
    };
    if !(a.interval >= 0.0 && a.interval <= 3600.0) {
        return util::usage(CMD, format!("--interval {}: give 0 (idle) to 3600 seconds", a.interval));
    }
    crate::util::raise_open_files(CMD);
    let mut cfg = udpx_h3_bench::clients::own::LoadConfig::new(
        a.server,
        a.connections,
        &a.path,
        std::time::Duration::from_secs_f64(a.interval),
    );
    (cfg.ramp, cfg.duration, cfg.locals) = (ramp, dur, a.locals);
    let r = match (a.tcp.as_deref(), a.ca.as_deref()) {
        (None, _) => udpx_h3_bench::clients::own::run(&cfg),
        (Some(v), Some(ca)) => {
            let http = if v == "h2" {
                udpx_h3_bench::clients::quinn_hyper::HyperHttp::H2
            } else {
                udpx_h3_bench::clients::quinn_hyper::HyperHttp::H1
            };
            udpx_h3_bench::clients::quinn_hyper::run(&cfg, http, ca)
        }
        (Some(_), None) => return util::usage(CMD, "--tcp needs --ca"),
    };
    let r = match r {
        Ok(r) => r,
        Err(e) if e.is_usage() => return util::usage(CMD, e),
        Err(e) => {
            eprintln!("udpx {CMD}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if a.json {
        println!("{}", serde_json::json!({ "h3_load": r }));
    } else {
        println!(
            "{} connections ({} established, {} ended early): {} requests, {:.2} % served, {} failed, {} late, {} never served; latency p50 {:.1} / p99 {:.1} / max {:.1} ms; handshake p50 {:.1} ms; {:.1} MB; client CPU {:.0} %{}",
            a.connections,
            r.established,
            r.ended_early,
            r.requests,
            r.served_pct(),
            r.failed,
            r.late,
            r.never_served,
            r.latency.p50_ms,
            r.latency.p99_ms,
            r.latency.max_ms,
            r.handshake.p50_ms,
            r.bytes as f64 / 1e6,
            r.client_cpu_pct(),
            if r.client_cpu_pct() > 80.0 { " (the client is the limit)" } else { "" }
        );
    }
    ExitCode::SUCCESS
}

/// `udpx h3 quinn-serve` (hidden: the bench's second server).
fn quinn_serve(a: QuinnServeArgs) -> ExitCode {
    let dur = match duration("--duration", a.duration) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        std::thread::sleep(dur);
        s2.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    eprintln!("udpx h3 quinn-serve: {} on https://{}", a.dir.display(), a.listen);
    match udpx_h3_bench::quinn_server::serve(&a.dir, a.listen, &a.cert, &a.key, &stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udpx h3 quinn-serve: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `udpx bench h3 --profile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BenchProfile {
    /// Both segment in software.
    Software,
    /// Neither segments: the device offloads.
    Offload,
    /// Both tables.
    Both,
}

/// `udpx bench h3`: runs [`udpx_h3_bench::bench`] and prints its table or JSON (`h3_bench`: one
/// object per profile).
pub fn bench(a: H3BenchArgs) -> ExitCode {
    const CMD: &str = "bench h3";
    if (a.ramp.is_some() || a.window.is_some()) && a.connections.is_empty() && a.viewers.is_none() {
        return usage(
            "--ramp and --window: give them with --connections (the scale table) or --viewers (the viewers' tail)",
        );
    }
    if !a.connections.is_empty() {
        return bench_scale(a);
    }
    if a.cache_size.is_some() && (a.restart.is_some() || a.flood.is_some() || a.bottleneck.is_some()) {
        return usage(
            "--cache-size sizes the bulk table's +cache rows or, with --connections, the udpx-cache server: \
             leave it out with --restart, --flood and --bottleneck",
        );
    }
    if let Some(players) = a.restart {
        return bench_restart(a, players);
    }
    if let Some(rate) = a.flood {
        return bench_flood(a, rate);
    }
    if let Some(mbit) = a.bottleneck {
        return bench_bottleneck(a, mbit);
    }
    let root = udpx_lab::netns::is_root();
    if a.veth && !root {
        eprintln!("udpx {CMD}: --veth needs root (network namespaces): skipped");
        return ExitCode::from(crate::exit::SKIPPED);
    }
    let veth = a.veth || (root && !a.loopback);
    if veth {
        crate::util::signal_cleanup(CMD);
    }
    use udpx_lab::netns::Profile;
    let profiles: &[Profile] = match (veth, a.profile) {
        (false, _) => &[Profile::Software], // loopback: one table, no profile
        (true, BenchProfile::Software) => &[Profile::Software],
        (true, BenchProfile::Offload) => &[Profile::Offload],
        (true, BenchProfile::Both) => &[Profile::Software, Profile::Offload],
    };
    let mut benches = Vec::new();
    for &profile in profiles {
        let mut cfg = udpx_h3_bench::bench::H3BenchConfig {
            size: a.size,
            repeat: a.repeat as usize,
            chromium_repeat: a.chromium_repeat as usize,
            cache_size: a.cache_size.map_or(udpx_h3_bench::DEFAULT_CACHE_SIZE, |b| b as usize),
            veth,
            profile,
            host: a.host.tuning(),
            napi: a.napi,
            ..udpx_h3_bench::bench::H3BenchConfig::new()
        };
        // This binary runs the second HTTP/3 server (quinn with h3).
        cfg.programs.udpx = std::env::current_exe().ok();
        let b = match udpx_h3_bench::bench::run(&cfg, &mut |l| eprintln!("udpx {CMD}: {l}")) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("udpx {CMD}: {e}");
                return ExitCode::FAILURE;
            }
        };
        for l in &b.left_out {
            eprintln!("udpx {CMD}: left out {}: {}", l.rows, l.why);
        }
        if !a.json {
            println!("{}", udpx_h3_bench::bench::table(&b));
            println!("{}", b.environment.to_markdown());
        }
        benches.push(b);
    }
    if a.json {
        println!("{}", serde_json::json!({ "h3_bench": benches }));
    }
    ExitCode::SUCCESS
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    util::usage("h3", msg)
}

pub fn main(a: H3Args) -> ExitCode {
    match a.cmd {
        H3Cmd::Serve(s) => serve(*s),
        H3Cmd::Get(g) => get(g),
        H3Cmd::Load(l) => load(l),
        H3Cmd::QuinnServe(q) => quinn_serve(q),
    }
}

/// The service key file must be the owner's alone: its secret makes every host's reset tokens,
/// Retry tokens and session ticket keys.
fn key_file_private(p: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(p).map_err(|e| e.to_string())?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "group or others may read or write it (mode {:04o}): the secret must be the owner's alone; \
             run chmod 600 {}",
            mode & 0o7777,
            p.display()
        ));
    }
    Ok(())
}

fn check_payload(n: usize) -> Result<(), String> {
    if !(1200..=65_527).contains(&n) {
        return Err(format!("--max-udp-payload {n}: give 1200 (QUIC's minimum) to 65527"));
    }
    Ok(())
}

/// `udpx h3 serve`: the flags read into a [`ServeConfig`], the server started, then supervised
/// until it stops ([`crate::supervise`]).
fn serve(a: ServeArgs) -> ExitCode {
    let mut prepared = match serve_config(&a) {
        Ok(p) => p,
        Err(e) => return usage(e),
    };
    // SIGHUP, SIGINT, SIGTERM and SIGQUIT are blocked before the shard threads start (they
    // inherit the mask), and a thread each takes them: SIGHUP reads the files again (today the
    // removed hosts); SIGTERM and SIGQUIT drain (a second one stops at once), SIGINT stops;
    // either way the server prints its counters.
    crate::util::raise_open_files("h3 serve");
    // The program's path now, before a package upgrade may replace the file: SIGUSR2 starts
    // whatever is at that path then (the new binary).
    let exe = std::env::current_exe().ok();
    let reload = crate::util::reload_signals();
    let signals = crate::util::graceful_signals();
    // The qlog writer's thread after the signals are blocked: it inherits the mask (a thread
    // that did not would take SIGINT's default action and end the process).
    match prepared.qlog.as_ref().map(udpx_quic::Qlog::start).transpose() {
        Ok(q) => prepared.cfg.quic.host.qlog = q,
        Err(e) => return usage(format!("--qlog-dir: {e}")),
    }
    let server = match udpx_h3::serve(&a.dir, &prepared.cfg) {
        Ok(s) => s,
        Err(e) if e.is_usage() => return util::usage("h3 serve", e),
        Err(e) => {
            eprintln!("udpx h3 serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    announce(&a, &prepared.cfg, &server);
    let metrics = match a.metrics.map(|addr| server.serve_metrics(addr)).transpose() {
        Ok(m) => m,
        // An upgrade: the server it took over from holds the port until it exits; this one
        // takes it then (below). Refusing now would leave nobody serving: the takeover is done.
        Err(e) if a.upgrade && e.kind() == std::io::ErrorKind::AddrInUse => {
            eprintln!("udpx h3 serve: --metrics: the port is the running server's until it exits; taken then");
            None
        }
        Err(e) => {
            drop(server.stop());
            return usage(format!("--metrics: {e}; pick another address"));
        }
    };
    if let Some(m) = &metrics {
        eprintln!("udpx h3 serve: metrics on http://{}/metrics", m.local_addr());
        crate::util::warn_if_exposed("h3 serve", m.local_addr());
    }
    let running = Running { a: &a, prepared: &prepared, server, exe: exe.as_deref() };
    running.supervise(metrics, signals, reload)
}

/// What `serve` takes from its flags: the server's configuration, and what it reads again on
/// SIGHUP.
struct Prepared {
    cfg: ServeConfig,
    /// `--qlog-dir`'s writer, started once the signals are blocked.
    qlog: Option<udpx_quic::QlogConfig>,
    /// `--removed-hosts`, shared with the shards (SIGHUP sets it again).
    removed_hosts: udpx_quic::RemovedHosts,
    /// `--duration`.
    duration: Option<Duration>,
}

/// The flags of `udpx h3 serve` as a [`ServeConfig`]: a flag out of its range, a file that does
/// not read or a combination that cannot work is refused with what to change.
fn serve_config(a: &ServeArgs) -> Result<Prepared, String> {
    let shards = a.shards.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(256));
    if !(1..=256).contains(&shards) {
        return Err(format!("--shards {shards}: give 1 to 256 (the connection ID's worker byte numbers them)"));
    }
    check_payload(a.max_udp_payload)?;
    let run_for = a.duration.map(|d| duration("--duration", d)).transpose()?;
    let tls = match (a.cert.clone(), a.key.clone()) {
        (Some(cert), Some(key)) => Tls::Files { cert, key },
        _ => Tls::SelfSigned,
    };
    let keys = match &a.key_file {
        None => None,
        Some(p) => {
            let secret = key_file_private(p)
                .and_then(|()| std::fs::read_to_string(p).map_err(|e| e.to_string()))
                .and_then(|t| udpx_quic::reset::parse_secret(&t))
                .map_err(|e| format!("--key-file {}: {e}", p.display()))?;
            let keys = udpx_quic::ServiceKeys::shared(&secret);
            Some(if a.no_stateless_resets { keys.without_resets() } else { keys })
        }
    };
    if a.keylog_file.is_none() && std::env::var_os("SSLKEYLOGFILE").is_some() {
        eprintln!(
            "udpx h3 serve: SSLKEYLOGFILE is set and ignored: a server writes its TLS secrets only with --keylog-file"
        );
    }
    let keylog = a
        .keylog_file
        .as_deref()
        .map(|p| udpx_quic::KeyLog::open(p, udpx_quic::keylog::DEFAULT_MAX_BYTES))
        .transpose()
        .map_err(|e| format!("--keylog-file: {e}"))?;
    let qlog = qlog_config(a)?;
    let removed_hosts = udpx_quic::RemovedHosts::default();
    if let Some(p) = &a.removed_hosts {
        removed_hosts.set(&read_removed(p)?);
    }
    let limits = udpx_quic::Limits {
        max_connections: a.max_connections,
        max_half_open: a.max_half_open,
        max_per_ip: a.max_per_ip,
        handshake_timeout: duration("--handshake-timeout", a.handshake_timeout)?,
        flood_handshake_timeout: duration("--flood-handshake-timeout", a.flood_handshake_timeout)?,
        retry: a.retry,
        ..udpx_quic::Limits::default()
    };
    limits.check()?;
    let cors = udpx_h3::cors::Cors::parse(&a.cors)?;
    let handover = handover(a)?;
    let quic = udpx_quic::ServerConfig {
        handover,
        listen: a.listen,
        shards,
        io: a.io.into(),
        gro: a.gro == OnOff::On,
        host_id: a.host_id,
        zerocopy: udpx_quic::Zerocopy::default(),
        host: udpx_quic::HostConfig {
            keys,
            limits,
            removed_hosts: removed_hosts.clone(),
            keylog,
            ..udpx_quic::HostConfig::server()
        },
    };
    let mut cfg = ServeConfig {
        quic,
        tls,
        max_udp_payload: a.max_udp_payload,
        site: SiteOptions { cache_control: a.cache_control.clone(), access_log: a.access_log.clone(), cors },
        early_data: a.early_data,
        grease: a.grease,
        cc: udpx_h3::server::Cc::default(),
        max_open_per_conn: a.max_open_per_conn,
        max_open_per_shard: a.max_open_per_shard,
        max_open_per_addr: a.max_open_per_addr,
        cache_size: a.cache_size as usize,
        stall_timeout: std::time::Duration::from_secs(a.stall_timeout),
        park_timeout: std::time::Duration::from_secs(a.park_timeout),
        idle_timeout: std::time::Duration::from_secs(a.idle_timeout),
        alt_svc_tcp: a.alt_svc_tcp,
        tcp_limits: udpx_h3::tcp::TcpLimits {
            max_connections: a.tcp_max_connections,
            per_source: a.tcp_per_source,
            ..udpx_h3::tcp::TcpLimits::default()
        },
    };
    a.host.tuning().apply(&mut cfg);
    Ok(Prepared { cfg, qlog, removed_hosts, duration: run_for })
}

/// `--qlog-dir` and its choice of connections, checked; `None` without the flag.
fn qlog_config(a: &ServeArgs) -> Result<Option<udpx_quic::QlogConfig>, String> {
    let Some(dir) = &a.qlog_dir else { return Ok(None) };
    let mut q = udpx_quic::QlogConfig::new(dir.clone());
    q.policy = qlog_policy(a)?;
    q.max_files = a.qlog_max_files;
    q.max_bytes = a.qlog_max_bytes;
    q.max_live = a.qlog_max_live;
    q.policy.check()?;
    if !udpx_quic::qlog::AVAILABLE {
        return Err("--qlog-dir: this udpx was built without qlog; build it with `--features qlog`".into());
    }
    Ok(Some(q))
}

/// Which connections are logged: the addresses of `--qlog-peer` and of the `--qlog-peers` file,
/// and the sample, the file's `sample=F` if it has one, else `--qlog-sample`, else 1 with no
/// address named and 0 with some. Read at start and again on SIGHUP (a `sample=` word removed
/// from the file returns the sample to the flag's).
fn qlog_policy(a: &ServeArgs) -> Result<udpx_quic::QlogPolicy, String> {
    let named = !a.qlog_peer.is_empty() || a.qlog_peers.is_some();
    let (peers, file_sample) = qlog_peers(&a.qlog_peer, a.qlog_peers.as_deref())?;
    if let (Some(flag), Some(file)) = (a.qlog_sample, file_sample) {
        return Err(format!(
            "--qlog-sample {flag} and sample={file} in --qlog-peers: give the sample in one of them (the file's is read again on SIGHUP)"
        ));
    }
    let sample = file_sample.or(a.qlog_sample).unwrap_or(if named { 0.0 } else { 1.0 });
    Ok(udpx_quic::QlogPolicy { sample, peers })
}

/// The addresses of `--qlog-peer` (`given`) and of the `--qlog-peers` file (read again on
/// SIGHUP), with the file's `sample=F` if it has one.
fn qlog_peers(
    given: &[std::net::IpAddr],
    path: Option<&std::path::Path>,
) -> Result<(Vec<std::net::IpAddr>, Option<f64>), String> {
    let mut peers = given.to_vec();
    let mut sample = None;
    if let Some(p) = path {
        let text = std::fs::read_to_string(p).map_err(|e| format!("--qlog-peers {}: {e}", p.display()))?;
        let (more, s) =
            udpx_quic::QlogPolicy::parse_file(&text).map_err(|e| format!("--qlog-peers {}: {e}", p.display()))?;
        peers.extend(more);
        sample = s;
    }
    Ok((peers, sample))
}

/// The host IDs of a `--removed-hosts` file (read again on SIGHUP).
fn read_removed(path: &std::path::Path) -> Result<Vec<u16>, String> {
    std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| udpx_quic::RemovedHosts::parse_file(&t))
        .map_err(|e| format!("--removed-hosts {}: {e}", path.display()))
}

/// Where upgrades meet (`--upgrade-socket`), or `None` when this server cannot be upgraded.
fn handover(a: &ServeArgs) -> Result<Option<udpx_quic::upgrade::Handover>, String> {
    let handover = match a.upgrade_socket.as_deref() {
        Some("off") if a.upgrade => {
            return Err("--upgrade with --upgrade-socket off: give the running server's socket".into())
        }
        Some("off") => None,
        // A server on an ephemeral port cannot be found again by the same arguments.
        None if a.listen.port() == 0 => None,
        given => Some(udpx_quic::upgrade::Handover::new(
            given.map(std::path::PathBuf::from).unwrap_or_else(|| {
                let euid = nix::unistd::geteuid().as_raw();
                let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(std::path::PathBuf::from);
                udpx_quic::upgrade::Handover::default_path(a.listen, euid, runtime.as_deref())
            }),
            a.upgrade,
            Duration::from_secs(a.drain_timeout),
        )),
    };
    if a.upgrade && a.listen.port() == 0 {
        return Err("--upgrade with port 0: give the running server's port".into());
    }
    Ok(handover)
}

/// The lines a started server prints: where it serves, with what, and its generation.
fn announce(a: &ServeArgs, cfg: &ServeConfig, server: &udpx_h3::H3Server) {
    if server.generated_cert() {
        eprintln!(
            "udpx h3 serve: no --cert/--key: generated a self-signed certificate for localhost, 127.0.0.1 \
             and ::1 (for local use; clients must skip verification)"
        );
    }
    eprintln!(
        "udpx h3 serve: {} on https://{} ({} shards, I/O {}, GRO {}, host ID {})",
        a.dir.display(),
        server.local_addr(),
        cfg.quic.shards,
        cfg.quic.io,
        if cfg.quic.gro { "on" } else { "off" },
        cfg.quic.host_id
    );
    if let Some(k) = server.keylog() {
        eprintln!("udpx h3 serve: {}", k.warning());
    }
    if let Some(q) = server.qlog() {
        let p = q.policy();
        eprintln!(
            "udpx h3 serve: qlog of {} into {} (at most {} files, {} bytes)",
            if p.peers.is_empty() {
                format!("{:.3} % of connections", p.sample * 100.0)
            } else if p.sample <= 0.0 {
                format!("the connections from {:?}", p.peers)
            } else {
                format!("the connections from {:?} and {:.3} % of the others", p.peers, p.sample * 100.0)
            },
            q.dir().display(),
            a.qlog_max_files,
            a.qlog_max_bytes
        );
    }
    if let Some(t) = server.tcp_addr() {
        eprintln!("udpx h3 serve: also HTTPS over TCP on https://{t} (HTTP/1.1, HTTP/2; alt-svc names the QUIC port)");
    }
    let q = server.quic();
    match (q.upgrade_unavailable(), &cfg.quic.handover) {
        (Some(why), _) => eprintln!("udpx h3 serve: upgrades unavailable (classic-BPF steering): {why}"),
        (None, Some(h)) if h.take_over => eprintln!(
            "udpx h3 serve: generation {} took new connections over from the server at {}; it drains",
            q.generation(),
            h.path.display()
        ),
        (None, Some(h)) => eprintln!(
            "udpx h3 serve: generation {}; an upgrade (--upgrade) takes over at {}",
            q.generation(),
            h.path.display()
        ),
        (None, None) => {}
    }
}

/// A started server and what its supervision needs.
struct Running<'a> {
    a: &'a ServeArgs,
    prepared: &'a Prepared,
    server: udpx_h3::H3Server,
    exe: Option<&'a std::path::Path>,
}

impl Running<'_> {
    /// Serves until a stop signal, `--duration`, the end of a drain or the server's own stop;
    /// each turn does what the [`Supervisor`](crate::supervise::Supervisor) says. Then stops
    /// the server and prints its counters.
    fn supervise(
        self,
        mut metrics: Option<udpx_metrics::MetricsServer>,
        signals: &crate::util::StopSignals,
        reload: &crate::util::ReloadSignals,
    ) -> ExitCode {
        use crate::supervise::{Seen, Supervisor, Taken};
        let (a, server) = (self.a, &self.server);
        // Under systemd (Type=notify or notify-reload): ready now; reloads and the stop said.
        let notifier = crate::notify::Notifier::from_env("h3 serve");
        let notify = |state: &str| {
            if let Some(n) = &notifier {
                n.send(state);
            }
        };
        let ready = format!("READY=1\nSTATUS=serving {} on {}", a.dir.display(), server.local_addr());
        if a.upgrade {
            // The unit's main process is now this one (NotifyAccess=all lets it say so); the
            // predecessor exits after its drain.
            notify(&format!("MAINPID={}\n{ready}", std::process::id()));
        } else {
            notify(&ready);
        }
        let seen = || Seen {
            running: server.is_running(),
            finished: server.finished(),
            handed_over: server.quic().handed_over(),
        };
        let now = std::time::Instant::now();
        let metrics_wanted = a.upgrade && a.metrics.is_some() && metrics.is_none();
        let mut sup = Supervisor::new(now, self.prepared.duration)
            .wanting_metrics(metrics_wanted)
            .with_keylog(server.keylog().is_some());
        loop {
            let taken = Taken {
                stop: signals.stop.load(Ordering::Relaxed),
                drain: signals.drain.load(Ordering::Relaxed),
                hup: reload.hup.swap(false, Ordering::Relaxed),
                usr1: reload.usr1.swap(false, Ordering::Relaxed),
                usr2: reload.usr2.swap(false, Ordering::Relaxed),
            };
            let (now, seen) = (std::time::Instant::now(), seen());
            if !sup.goes_on(now, &taken, &seen) {
                break;
            }
            for step in sup.turn(now, &seen, &taken) {
                self.step(step, &mut sup, &mut metrics, notifier.as_ref(), &ready);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if sup.drain_started().is_none() {
            notify("STOPPING=1");
        }
        drop(metrics);
        self.stopped(&sup)
    }

    /// One step of a turn.
    fn step(
        &self,
        step: crate::supervise::Step,
        sup: &mut crate::supervise::Supervisor,
        metrics: &mut Option<udpx_metrics::MetricsServer>,
        notifier: Option<&crate::notify::Notifier>,
        ready: &str,
    ) {
        use crate::supervise::Step;
        let (a, server) = (self.a, &self.server);
        let notify = |state: &str| {
            if let Some(n) = notifier {
                n.send(state);
            }
        };
        match step {
            Step::WarnKeylog => {
                if let Some(k) = server.keylog() {
                    eprintln!("udpx h3 serve: {}", k.warning());
                }
            }
            Step::RetryMetrics => {
                if let Some(Ok(m)) = a.metrics.map(|addr| server.serve_metrics(addr)) {
                    eprintln!("udpx h3 serve: metrics on http://{}/metrics", m.local_addr());
                    *metrics = Some(m);
                    sup.metrics_taken();
                }
            }
            Step::HandedOver => eprintln!(
                "udpx h3 serve: handed over to the upgrade: draining {} connections (GOAWAY to each; the rest closed \
                 after {} s)",
                server.counters().quic.open_connections,
                a.drain_timeout
            ),
            Step::ServesAgain => {
                // The successor died while this server drained: the drain was called off, and
                // this generation takes new connections again (see udpx_quic::upgrade).
                eprintln!(
                    "udpx h3 serve: the upgrade died after it took over: generation {} serves again",
                    server.quic().generation()
                );
                notify(&format!("MAINPID={}\n{ready}", std::process::id()));
            }
            Step::Drain => {
                let c = server.counters().quic;
                eprintln!(
                    "udpx h3 serve: draining {} connections: GOAWAY to each, no new ones, the rest closed after {} s \
                     (signal again to stop now)",
                    c.open_connections, a.drain_timeout
                );
                notify(&format!("STOPPING=1\nSTATUS=draining {} connections", c.open_connections));
                server.drain(Duration::from_secs(a.drain_timeout));
            }
            Step::Upgrade => upgrade_self(server, self.exe, self.prepared.cfg.quic.handover.is_some()),
            Step::ReopenLog => match server.reopen_log() {
                Ok(true) => eprintln!("udpx h3 serve: SIGUSR1: access log reopened"),
                Ok(false) => eprintln!("udpx h3 serve: SIGUSR1: no access log file to reopen"),
                Err(e) => eprintln!("udpx h3 serve: SIGUSR1: {e}; the access log stays the file in use"),
            },
            Step::Reload => {
                if let Some(n) = notifier {
                    n.reloading();
                }
                self.reload();
                notify(ready);
            }
        }
    }

    /// The server stopped: its drain summed up (if it drained) and its counters printed.
    fn stopped(self, sup: &crate::supervise::Supervisor) -> ExitCode {
        match self.server.stop() {
            Ok(c) => {
                if let Some(t) = sup.drain_started() {
                    eprintln!(
                        "udpx h3 serve: drained{} in {:.1} s: {} connections ended on their own, {} closed at the \
                         deadline; {} new ones refused, {} admitted in the handover's grace, {} requests rejected past \
                         GOAWAY",
                        if sup.handed_over() { " after the handover" } else { "" },
                        t.elapsed().as_secs_f64(),
                        c.quic.drained,
                        c.quic.drain_closed,
                        c.quic.refused_draining,
                        c.quic.handover_admitted,
                        c.http.rejected
                    );
                }
                println!("{}", serde_json::json!({ "h3_serve": c }));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("udpx h3 serve: {e}");
                ExitCode::FAILURE
            }
        }
    }

    /// SIGHUP: the certificate and key read again (a file that does not load keeps the one in
    /// force), the removed hosts and the qlog peers (a bad file keeps the old set).
    fn reload(&self) {
        let (a, server, cfg) = (self.a, &self.server, &self.prepared.cfg);
        if let udpx_h3::Tls::Files { cert, key } = &cfg.tls {
            match server.reload_tls() {
                Ok(()) => eprintln!(
                    "udpx h3 serve: SIGHUP: certificate {} and key {} read again: new connections get them",
                    cert.display(),
                    key.display()
                ),
                Err(e) => eprintln!("udpx h3 serve: SIGHUP: {e}; the certificate in force serves on"),
            }
        }
        let removed_hosts = &self.prepared.removed_hosts;
        match a.removed_hosts.as_deref().map(read_removed) {
            Some(Ok(ids)) => {
                removed_hosts.set(&ids);
                eprintln!("udpx h3 serve: SIGHUP: removed hosts now {ids:?}");
            }
            Some(Err(e)) => eprintln!("udpx h3 serve: SIGHUP: {e}; the removed hosts stay {:?}", removed_hosts.list()),
            None if cfg.tls == udpx_h3::Tls::SelfSigned && a.qlog_peers.is_none() => eprintln!(
                "udpx h3 serve: SIGHUP: nothing to read again (no --cert/--key, no --removed-hosts, no --qlog-peers)"
            ),
            None => {}
        }
        if let (Some(q), Some(_)) = (server.qlog(), a.qlog_peers.as_ref()) {
            let now = q.policy();
            match qlog_policy(a).and_then(|p| q.set_policy(p)) {
                Ok(()) => {
                    let p = q.policy();
                    eprintln!("udpx h3 serve: SIGHUP: qlog peers now {:?}, sample {}", p.peers, p.sample);
                }
                Err(e) => {
                    eprintln!("udpx h3 serve: SIGHUP: {e}; the qlog peers stay {:?}, sample {}", now.peers, now.sample)
                }
            }
        }
    }
}

/// SIGUSR2: starts `exe` (this program's path at start, so a new binary installed there) with
/// this process's arguments and `--upgrade`, as a child (it stays in this service's cgroup;
/// under systemd it announces itself with MAINPID=); this process drains once it took over.
fn upgrade_self(server: &udpx_h3::H3Server, exe: Option<&std::path::Path>, handover: bool) {
    let q = server.quic();
    if !handover {
        eprintln!("udpx h3 serve: SIGUSR2: no upgrade socket (--upgrade-socket off, or port 0): no upgrade possible");
        return;
    }
    if let Some(why) = q.upgrade_unavailable() {
        eprintln!("udpx h3 serve: SIGUSR2: no upgrade possible: {why}");
        return;
    }
    if q.handed_over() {
        eprintln!("udpx h3 serve: SIGUSR2: already handed over; signal the newest server");
        return;
    }
    let Some(exe) = exe else {
        eprintln!(
            "udpx h3 serve: SIGUSR2: this program's path is unknown; start `udpx h3 serve ... --upgrade` by hand"
        );
        return;
    };
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).filter(|a| a != "--upgrade").collect();
    args.push("--upgrade".into());
    match std::process::Command::new(exe).args(&args).stdin(std::process::Stdio::null()).spawn() {
        Ok(mut child) => {
            eprintln!("udpx h3 serve: SIGUSR2: started {} (pid {}) to take over", exe.display(), child.id());
            // Reaped here when it ends while this process lives (a failed upgrade says why in
            // its own output and exits; this server then serves on).
            let _ = std::thread::Builder::new().name("udpx-upgrade".into()).spawn(move || {
                if let Ok(status) = child.wait() {
                    if !status.success() {
                        eprintln!("udpx h3 serve: the upgrade exited ({status}); still serving");
                    }
                }
            });
        }
        Err(e) => eprintln!("udpx h3 serve: SIGUSR2: starting {}: {e}; still serving", exe.display()),
    }
}

fn get(a: GetArgs) -> ExitCode {
    if let Err(e) = check_payload(a.max_udp_payload) {
        return usage(e);
    }
    let mut headers = Vec::with_capacity(a.headers.len());
    for h in &a.headers {
        match h.split_once(':') {
            Some((n, v)) if !n.trim().is_empty() && !n.starts_with(':') => {
                headers.push((n.trim().to_string(), v.trim().to_string()));
            }
            _ => return usage(format!("-H {h:?}: write a header field as 'NAME: VALUE', e.g. -H 'range: bytes=0-99'")),
        }
    }
    let cfg = GetConfig {
        io: a.io.into(),
        gro: a.gro == OnOff::On,
        max_udp_payload: a.max_udp_payload,
        head: a.head,
        headers,
        limit_rate: a.limit_rate,
        ..GetConfig::default()
    };
    let r = match udpx_h3::get(&a.url, a.output.as_deref(), &cfg) {
        Ok(r) => r,
        Err(e) if e.is_usage() => return util::usage("h3 get", e),
        Err(e) => {
            eprintln!("udpx h3 get: {e}");
            return ExitCode::FAILURE;
        }
    };
    if a.include {
        eprintln!("status: {}", r.status);
        for (n, v) in &r.headers {
            eprintln!("{n}: {v}");
        }
    }
    if a.json {
        println!("{}", serde_json::json!({ "h3_get": r }));
    } else {
        println!("{}: {r}", a.url);
    }
    if r.status >= 400 {
        eprintln!("udpx h3 get: {} answered {}", a.url, r.status);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use crate::util::parse_size_arg as parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100M"), Ok(100_000_000));
        assert_eq!(parse_size("2k"), Ok(2000));
        assert_eq!(parse_size("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_size("7"), Ok(7));
        for bad in ["0", "-1M", "M", "1T", "200G", ""] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
