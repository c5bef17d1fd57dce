//! What the TCP listener holds and what one peer may hold of it, and the HTTP/2 keep-alive
//! pings.

use std::time::Duration;

/// What the listener holds, and what one peer may hold of it (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpLimits {
    /// Connections at once (`--tcp-max-connections`); at the cap the one idle longest is
    /// closed to make room for a new one.
    pub max_connections: usize,
    /// Connections at once from one address, an IPv6 /64 (`--tcp-per-source`): at most
    /// `max_connections`, and below it so that no one address can hold them all.
    pub per_source: usize,
    /// A connection with a response under way must take at least `min_bytes` ...
    pub min_bytes: u64,
    /// ... in every `window`, or it is closed.
    pub window: Duration,
    /// A connection with no response under way and no new request for this long is closed
    /// (checked every `window`, so it may live up to one `window` longer).
    pub idle: Duration,
    /// An HTTP/2 response parked this long (its client stopped reading) is reset
    /// (RST_STREAM), its connection kept.
    pub park: Duration,
}

impl Default for TcpLimits {
    /// 1,024 connections (nginx's `worker_connections` is 512 by default, 768 in Debian's
    /// configuration), 64 per address (browsers open 6 per origin over HTTP/1.1, one over
    /// HTTP/2; a carrier NAT puts many households behind one address), 16 KiB every 20 s (a
    /// reader slower than 800 B/s for 20 s is let go; nginx's `send_timeout` is 60 s between
    /// two writes), and 60 s idle.
    fn default() -> TcpLimits {
        TcpLimits {
            max_connections: 1024,
            per_source: 64,
            min_bytes: 16 * 1024,
            window: Duration::from_secs(20),
            idle: Duration::from_secs(60),
            park: Duration::from_secs(300),
        }
    }
}

/// How often an idle HTTP/2 connection is pinged, and how long the answer may take before
/// the connection is closed.
pub(super) const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
pub(super) const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
