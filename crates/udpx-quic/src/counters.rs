//! What a host counts. One [`HostCounters`] per event loop, summed over the shards.

use serde::Serialize;

/// Counters of one host (one shard's event loop), or their sum over shards.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostCounters {
    /// Connections accepted (server) or opened (client).
    pub connections: u64,
    /// Connections closed and removed.
    pub closed: u64,
    /// Connection IDs issued to peers after the handshake (NEW_CONNECTION_ID), each with this
    /// host's ID.
    pub cids_issued: u64,
    /// QUIC packets quiche produced and the host handed to the socket.
    pub packets_sent: u64,
    /// Their bytes (UDP payload).
    pub bytes_sent: u64,
    /// Transmits (runs) handed to the socket.
    pub transmits: u64,
    /// Runs of more than one packet (the host's grouping, whatever the mode).
    pub multi_packet_runs: u64,
    /// GSO buffers the socket sent (the socket's count; 0 in the plain modes).
    pub gso_runs: u64,
    /// Send system calls (the socket's count).
    pub send_calls: u64,
    /// Datagrams the socket put on the wire (the socket's count).
    pub datagrams_sent: u64,
    /// `datagrams_sent / send_calls`.
    pub packets_per_call: f64,
    /// Flushes that stopped on a full socket (EAGAIN) or device queue (ENOBUFS); the packets
    /// were kept and sent later.
    pub send_blocked: u64,
    /// Transmits the kernel refused for good (skipped; QUIC re-sends their frames).
    pub send_errors: u64,
    /// Destinations for which the socket turned GSO off after a refusal (the socket's count).
    pub gso_fallbacks: u64,
    /// Packets quiche declared lost, over all connections (its `Stats::lost`).
    pub lost_packets: u64,
    /// Packets quiche retransmitted (its `Stats::retrans`).
    pub retransmitted: u64,
    /// Receive system calls (the socket's count).
    pub recv_calls: u64,
    /// Datagrams received (GRO buffers split).
    pub datagrams_received: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Receive buffers that held more than one datagram (GRO).
    pub gro_buffers: u64,
    /// Datagrams without a parsable QUIC header (garbage, cut).
    pub dropped_unparseable: u64,
    /// Packets for no known connection that could not start one (not an Initial).
    pub dropped_unknown_cid: u64,
    /// Initials in a datagram under 1200 bytes, or with a DCID under 8 bytes (RFC 9000 §14.1,
    /// §7.2): dropped before any state is made.
    pub dropped_bad_initial: u64,
    /// Datagrams quiche refused (decryption failed, invalid frames, ...).
    pub dropped_by_quic: u64,
    /// Datagrams cut by the kernel (larger than the receive buffer) or with unknown GRO
    /// boundaries.
    pub dropped_truncated: u64,
    /// Version negotiation packets sent.
    pub version_negotiations: u64,
    /// Stateless resets sent for packets to connection IDs this host does not know (only
    /// with a shared reset key).
    pub stateless_resets: u64,
    /// Stateless resets not sent: over the rate limit.
    pub resets_limited: u64,
    /// Stateless resets received that matched a connection's token (a client's count: the
    /// server no longer had that connection).
    pub resets_received: u64,
    /// Packets held back until their departure time (`SendInfo.at` more than the pacing
    /// slack ahead): the host's pacer at work.
    pub paced_holds: u64,
    /// Connection attempts quiche refused at accept.
    pub accept_errors: u64,
    /// ICMP errors about datagrams sent (the socket's count; port unreachable, ...).
    pub icmp_errors: u64,
    /// Receive calls that failed with an error the host counted and served on (never one
    /// an ICMP message caused: the socket keeps those out).
    pub recv_errors: u64,
}

impl HostCounters {
    /// The sum of `self` and `o` (packets per call recomputed).
    pub fn add(&self, o: &HostCounters) -> HostCounters {
        let mut s = HostCounters {
            connections: self.connections + o.connections,
            closed: self.closed + o.closed,
            cids_issued: self.cids_issued + o.cids_issued,
            packets_sent: self.packets_sent + o.packets_sent,
            bytes_sent: self.bytes_sent + o.bytes_sent,
            transmits: self.transmits + o.transmits,
            multi_packet_runs: self.multi_packet_runs + o.multi_packet_runs,
            gso_runs: self.gso_runs + o.gso_runs,
            send_calls: self.send_calls + o.send_calls,
            datagrams_sent: self.datagrams_sent + o.datagrams_sent,
            packets_per_call: 0.0,
            send_blocked: self.send_blocked + o.send_blocked,
            send_errors: self.send_errors + o.send_errors,
            gso_fallbacks: self.gso_fallbacks + o.gso_fallbacks,
            lost_packets: self.lost_packets + o.lost_packets,
            retransmitted: self.retransmitted + o.retransmitted,
            recv_calls: self.recv_calls + o.recv_calls,
            datagrams_received: self.datagrams_received + o.datagrams_received,
            bytes_received: self.bytes_received + o.bytes_received,
            gro_buffers: self.gro_buffers + o.gro_buffers,
            dropped_unparseable: self.dropped_unparseable + o.dropped_unparseable,
            dropped_unknown_cid: self.dropped_unknown_cid + o.dropped_unknown_cid,
            dropped_bad_initial: self.dropped_bad_initial + o.dropped_bad_initial,
            dropped_by_quic: self.dropped_by_quic + o.dropped_by_quic,
            dropped_truncated: self.dropped_truncated + o.dropped_truncated,
            version_negotiations: self.version_negotiations + o.version_negotiations,
            stateless_resets: self.stateless_resets + o.stateless_resets,
            resets_limited: self.resets_limited + o.resets_limited,
            resets_received: self.resets_received + o.resets_received,
            paced_holds: self.paced_holds + o.paced_holds,
            accept_errors: self.accept_errors + o.accept_errors,
            icmp_errors: self.icmp_errors + o.icmp_errors,
            recv_errors: self.recv_errors + o.recv_errors,
        };
        s.packets_per_call = ratio(s.datagrams_sent, s.send_calls);
        s
    }

    /// Every datagram dropped at the host, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_unparseable
            + self.dropped_unknown_cid
            + self.dropped_bad_initial
            + self.dropped_by_quic
            + self.dropped_truncated
    }
}

pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
