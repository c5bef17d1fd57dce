//! How a host serves: one value, made once and handed whole to [`super::Host::with_config`]
//! (a server's shards each get a copy, from [`crate::ServerConfig::host`]).

use std::time::Duration;

use crate::admission::Limits;
use crate::keylog::KeyLog;
use crate::pacing::Pacing;
use crate::qlog::Qlog;
use crate::reset::{LiveGenerations, RemovedHosts};
use crate::token::ServiceKeys;

use crate::Burst;

/// A host's settings: everything but its socket, quiche's own settings, its application and
/// its [`super::Role`]. [`HostConfig::default`] is a client's; [`HostConfig::server`] a
/// server's.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The keys the service's hosts share (stateless resets, Retry tokens, session tickets:
    /// see [`crate::token`]); `None`: keys of its own ([`ServiceKeys::random`]: no stateless
    /// resets, tokens and tickets good on this host only).
    pub keys: Option<ServiceKeys>,
    /// The admission caps and the Retry policy.
    pub limits: Limits,
    /// How much one connection writes per turn.
    pub burst: Burst,
    /// The least time between the starts of two turns while work keeps coming (zero: a turn
    /// starts as soon as a datagram arrives). Datagrams that arrive meanwhile wait in the
    /// socket and are served together: one wake-up, one `recvmmsg`, and their answers in one
    /// `sendmmsg`, for many connections at once. A datagram after a quiet spell longer than
    /// this is served at once; deadlines (quiche's timers, pacing releases) are never delayed
    /// by it. The price: up to this much added latency under load. A server that gathers asks
    /// the kernel when each datagram came (`SO_TIMESTAMPNS`) and gives quiche that time, so
    /// that the wait in the socket is not read as part of the path's round trip.
    pub coalesce: Duration,
    /// A packet quiche's pacer stamps at most this far ahead of now leaves now; a later one
    /// is held to its time ([`crate::PACING_SLACK`] by default). At `coalesce` or more a turn
    /// sends what falls due before the next turn could start, so a gathering loop is not
    /// woken for each pacing deadline: fewer turns toward a client that reads slowly
    /// (Chromium, 250-400 Mbit/s on veth), in bursts of up to this much of the pacing rate
    /// (losses through a bottleneck queue shorter than that). Under BBRv2 give quiche the same time as
    /// `BbrParams::ack_processing_delay_us` (quiche patch 0013; `udpx-h3` does), or its
    /// window, not its pacer, limits each turn. Measured: docs/bench.md, "Sending ahead of the pacer".
    pub pacing_slack: Duration,
    /// Lets a turn in which a connection wrote its quantum and has more keep its packets
    /// (under 64 KiB) for the next turn's send call, once: a response a little past the
    /// quantum then leaves in one call instead of two (`deferred_flushes`), and a bulk
    /// download goes 20 packets per call instead of 10. Off for a client, on for a server.
    pub defer_flush: bool,
    /// How long the packets of acknowledgement-clocked transfers may wait for more (zero:
    /// never). When every connection that wrote in a turn was mid-transfer (it sent within
    /// the last few milliseconds) and wrote only the few packets the acknowledgement just read
    /// freed (fewer than 16 packets: `ACK_CLOCKED_PACKETS` in the flush rules), and together
    /// they are under 40 KiB (`ACK_DEFER_BELOW`), the turn keeps them: the next
    /// acknowledgements' packets join them in one send call. TCP defers the same way
    /// (`tcp_tso_should_defer`).
    /// A client that acknowledges every second packet (Chromium) otherwise costs the server a
    /// send call, and a wake-up of the receiver, per acknowledgement. The price: up to this
    /// much added to a transfer's packets, never to a response's first flight.
    pub ack_defer: Duration,
    /// Who paces. [`Pacing::Kernel`] needs a socket with `SO_TXTIME` and an fq egress qdisc to
    /// mean anything; see [`crate::pacing_for`].
    pub pacing: Pacing,
    /// Hosts taken out of the service, whose connection IDs a server answers with a stateless
    /// reset besides its own ([`crate::reset::may_reset`]; shared with the caller, who may
    /// change it while the host runs).
    pub removed_hosts: RemovedHosts,
    /// The generation byte of the connection IDs it issues (which process of an upgrade:
    /// [`crate::upgrade`]); 0 for a server that was not started as an upgrade.
    pub generation: u8,
    /// The generations that serve beside it (an upgrade's predecessor or successor): their
    /// connection IDs are never answered with a stateless reset here, which would hand a live
    /// connection's reset token to whoever sent its ID. Filled by [`crate::Server`].
    pub generations: LiveGenerations,
    /// Where the TLS secrets of its connections go (`--keylog-file`; see [`crate::keylog`]):
    /// the host turns quiche's `log_keys` on for every configuration it makes connections
    /// with, and gives each new connection a writer before its first packet. `None` (the
    /// default): nothing is logged, and `log_keys` stays off.
    pub keylog: Option<KeyLog>,
    /// Where the qlog of the connections its policy chooses goes (`--qlog-dir`; see
    /// [`crate::qlog`]): each chosen connection gets a writer at admission, before its first
    /// packet. Needs the feature `qlog` (without it nothing is logged: [`crate::qlog::AVAILABLE`]
    /// says so, and `udpx_h3::serve` refuses the setting). `None` (the default): nothing.
    pub qlog: Option<Qlog>,
}

impl Default for HostConfig {
    /// A client's: own keys, default limits, quiche's quantum, no coalescing, no deferred
    /// flush, no acknowledgement-clocked deferral, paced by holding packets, no key log, no qlog.
    fn default() -> HostConfig {
        HostConfig {
            keys: None,
            limits: Limits::default(),
            burst: Burst::Quantum,
            coalesce: Duration::ZERO,
            pacing_slack: crate::PACING_SLACK,
            defer_flush: false,
            ack_defer: Duration::ZERO,
            pacing: Pacing::Hold,
            removed_hosts: RemovedHosts::default(),
            generation: 0,
            generations: LiveGenerations::default(),
            keylog: None,
            qlog: None,
        }
    }
}

impl HostConfig {
    /// A server's: the client's with the deferred flush on and acknowledgement-clocked
    /// packets deferred up to [`crate::host::ACK_DEFER`].
    pub fn server() -> HostConfig {
        HostConfig { defer_flush: true, ack_defer: crate::host::ACK_DEFER, ..HostConfig::default() }
    }
}
