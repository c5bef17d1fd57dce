//! Pacing holds: who holds packets to their departure time (`SendInfo.at`), and how a held
//! packet waits.
//!
//! quiche stamps every packet with the time its pacer wants it to leave. Where the egress
//! qdisc honours `SCM_TXTIME` (fq), the kernel holds each transmit to its first packet's time
//! ([`Pacing::Kernel`]). Elsewhere the host holds a packet due later than [`PACING_SLACK`]:
//! the connection's one held packet, its deadline in the shard's timers, released when the
//! deadline passes ([`Pacing::Hold`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A packet due within this much of now leaves now, so a burst is at most this much of the
/// pacing rate (TCP allows about 1 ms, `tcp_tso_autosize`). Measured under BBRv2 on veth
/// (`udpx bench h3 --bottleneck 500 --bottleneck-buffer 1 --cc bbr2` and `--connections
/// 10000 --cc bbr2`, 2026-11-26): at 200 us a 16 KiB response left in 1.42 send calls of 8.5
/// packets (the last few held for a later turn), at 500 us in 1.00 of 12.0 with 1 packet lost
/// per 200 MB through the 1 ms bottleneck queue; at 1 ms that queue lost 156.
pub const PACING_SLACK: Duration = Duration::from_micros(500);

/// After a connection sent nothing for [`QUIET_REFILL`], this many of its packets leave at
/// once whatever their pacing time (quiche's own pacer allows the same ten, "one bulk write",
/// after quiescence, but caps them by its congestion window in packets: a model that a burst
/// of handshakes left with a tiny bandwidth estimate then paces every later response packet by
/// packet, and its samples stay as slow as its pacing). Measured with quic-go's client
/// (5,000 players of 16 KiB every 10 s, veth, `udpx bench h3 --connections 5000 --interval 10
/// --servers udpx,nginx-h2 --clients independent --rounds 2 --napi threaded`, 2026-11-27):
/// before, 4.95 pacing holds and timer firings per request and 1.88x nginx-h2's CPU per byte
/// (1.71-2.05); after, 0.36 and 1.27x (1.21-1.33). Through a 1 ms bottleneck queue (`udpx
/// bench h3 --bottleneck 500 --bottleneck-buffer 1`) the losses stayed as they were (14 and 17
/// of 71,000 packets under `--burst window`, 0 under `quantum`).
pub const QUIET_BURST: u8 = 10;

/// A connection silent this long gets its [`QUIET_BURST`] again (Linux fq refills an idle
/// flow's credit after the same 40 ms).
pub const QUIET_REFILL: Duration = Duration::from_millis(40);

/// Who holds packets to their departure time (`SendInfo.at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Nobody: every packet leaves at once.
    Off,
    /// The host: packets due later are held and sent at their time.
    Hold,
    /// The qdisc (fq): each transmit carries its departure time (`SCM_TXTIME`, the socket
    /// needs `SO_TXTIME`).
    Kernel,
}

/// A connection's packet held until its departure time.
#[derive(Debug)]
pub(crate) struct Held {
    pub at: Instant,
    pub to: SocketAddr,
    /// The source address it must leave from (`IP_PKTINFO`), when the socket has many.
    pub from: Option<std::net::IpAddr>,
    pub bytes: Vec<u8>,
}

/// `SendInfo.at` as a departure on `CLOCK_MONOTONIC`, through an (`Instant`, `Timestamp`)
/// pair read together.
pub(crate) fn departure(anchor: (Instant, udpx::Timestamp), at: Instant) -> udpx::Timestamp {
    match at.checked_duration_since(anchor.0) {
        Some(d) => anchor.1 + d,
        None => anchor.1, // before the anchor: due already
    }
}

/// Who should pace traffic to `peer` from this namespace: the kernel where the route's egress
/// qdisc honours departure times on `CLOCK_MONOTONIC` (fq), else the host.
pub fn pacing_for(peer: std::net::IpAddr) -> Pacing {
    match udpx::qdisc::egress(peer) {
        Ok(e) if e.pacing == udpx::qdisc::KernelPacing::Fq => Pacing::Kernel,
        _ => Pacing::Hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departure_times_follow_the_anchor() {
        let anchor = (Instant::now(), udpx::Timestamp::from_nanos(1_000_000_000));
        let later = anchor.0 + Duration::from_micros(300);
        assert_eq!(departure(anchor, later).as_nanos(), 1_000_300_000);
        let earlier = anchor.0.checked_sub(Duration::from_millis(1)).unwrap_or(anchor.0);
        assert_eq!(departure(anchor, earlier).as_nanos(), 1_000_000_000, "due already: the anchor");
    }

    #[test]
    fn loopback_is_paced_by_the_host() {
        assert_eq!(pacing_for("127.0.0.1".parse().unwrap()), Pacing::Hold, "lo's noqueue ignores SO_TXTIME");
    }
}
