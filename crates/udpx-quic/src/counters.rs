//! What a host counts. One [`HostCounters`] per event loop, summed over the shards. Every
//! count is kept as the work happens; nothing here is summed over the connections.

use serde::Serialize;

macro_rules! host_counters {
    ($( $(#[doc = $doc:literal])* $name:ident ),* $(,)?) => {
        /// Counters of one host (one shard's event loop), or their sum over shards.
        #[derive(Debug, Clone, Default, PartialEq, Serialize)]
        pub struct HostCounters {
            $( $(#[doc = $doc])* pub $name: u64, )*
            /// `datagrams_sent / send_calls`.
            pub packets_per_call: f64,
        }

        impl HostCounters {
            /// The sum of `self` and `o` (packets per call recomputed).
            pub fn add(&self, o: &HostCounters) -> HostCounters {
                let mut s = HostCounters { $( $name: self.$name + o.$name, )* packets_per_call: 0.0 };
                s.packets_per_call = ratio(s.datagrams_sent, s.send_calls);
                s
            }

            /// `(name, what it counts, value)` of every count, for metrics endpoints: the text
            /// is the field's documentation.
            pub fn fields_with_help(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![ $( (stringify!($name), concat!($($doc),*), self.$name), )* ]
            }

            /// Whether the count `name` is a level (it goes down as well as up), not a total.
            pub fn is_level(name: &str) -> bool {
                matches!(name, "open_connections" | "half_open")
            }
        }
    };
}

host_counters! {
    /// Connections accepted (server) or opened (client).
    connections,
    /// Connections closed and removed.
    closed,
    /// Connections open now (a level, summed over shards).
    open_connections,
    /// Of those, server connections whose handshake is not done (a level).
    half_open,
    /// Connection IDs issued to peers after the handshake (NEW_CONNECTION_ID), each with this
    /// host's ID.
    cids_issued,
    /// QUIC packets quiche produced and the host handed to the socket.
    packets_sent,
    /// Their bytes (UDP payload).
    bytes_sent,
    /// Transmits (runs) handed to the socket.
    transmits,
    /// Runs of more than one packet (the host's grouping, whatever the mode).
    multi_packet_runs,
    /// GSO buffers the socket sent (the socket's count; 0 in the plain modes).
    gso_runs,
    /// Send system calls (the socket's count).
    send_calls,
    /// Datagrams the socket put on the wire (the socket's count).
    datagrams_sent,
    /// Flushes that stopped on a full socket (EAGAIN) or device queue (ENOBUFS); the packets
    /// were kept and sent later.
    send_blocked,
    /// Transmits the kernel refused for good (skipped; QUIC re-sends their frames).
    send_errors,
    /// Destinations for which the socket turned GSO off after a refusal (the socket's count).
    gso_fallbacks,
    /// Packets quiche declared lost, over all connections (its `Stats::lost`).
    lost_packets,
    /// Packets quiche retransmitted (its `Stats::retrans`).
    retransmitted,
    /// Stream bytes quiche sent again (its `Stats::stream_retrans_bytes`): each is copied
    /// into a packet and sealed once more.
    stream_bytes_retransmitted,
    /// Stream bytes quiche copied into a packet before sealing it (its
    /// `Stats::stream_bytes_copied`, patch 0010): the rest are sealed straight from the
    /// response's buffers, so this is 0 but where a packet's data lay in more pieces than a
    /// seal takes.
    stream_bytes_copied,
    /// Receive system calls (the socket's count).
    recv_calls,
    /// Datagrams received (GRO buffers split).
    datagrams_received,
    /// Bytes received.
    bytes_received,
    /// Receive buffers that held more than one datagram (GRO).
    gro_buffers,
    /// Datagrams without a parsable QUIC header (garbage, cut).
    dropped_unparseable,
    /// Packets for no known connection that could not start one (not an Initial).
    dropped_unknown_cid,
    /// Initials in a datagram under 1200 bytes, or with a DCID under 8 bytes (RFC 9000 §14.1,
    /// §7.2): dropped before any state is made (and never answered).
    dropped_bad_initial,
    /// Datagrams quiche refused (decryption failed, invalid frames, ...).
    dropped_by_quic,
    /// Datagrams cut by the kernel (larger than the receive buffer) or with unknown GRO
    /// boundaries.
    dropped_truncated,
    /// Version negotiation packets sent.
    version_negotiations,
    /// Stateless resets sent for packets to connection IDs this host does not know (only
    /// with shared keys).
    stateless_resets,
    /// Stateless resets not sent: over the rate limit.
    resets_limited,
    /// Stateless resets not sent: the unknown ID is another shard's or a live host's
    /// ([`crate::reset::may_reset`]); the packet is dropped (and counted in
    /// `dropped_unknown_cid`).
    resets_not_ours,
    /// Version negotiations and refusals not sent: over their kind's rate limit.
    answers_limited,
    /// Stateless resets received that matched a connection's token (a client's count: the
    /// server no longer had that connection).
    resets_received,
    /// Packets held back until their departure time (`SendInfo.at` more than the pacing
    /// slack ahead): the host's pacer at work.
    paced_holds,
    /// Connection attempts quiche refused at accept.
    accept_errors,
    /// ICMP errors about datagrams sent (the socket's count; port unreachable, ...).
    icmp_errors,
    /// Datagrams the kernel dropped at this socket, its receive buffer full (`SO_MEMINFO`,
    /// read when the counters are taken).
    kernel_drops,
    /// Receive calls that failed with an error the host counted and served on (never one
    /// an ICMP message caused: the socket keeps those out).
    recv_errors,
    /// Retry packets sent (address validation).
    retries_sent,
    /// Connections made for an Initial whose Retry token was valid.
    validated_by_retry,
    /// Initials dropped: a token that is not ours, altered, or for another address.
    tokens_invalid,
    /// Initials dropped: a Retry token past its lifetime.
    tokens_expired,
    /// Initials refused: the shard's connection cap.
    refused_connections,
    /// Initials refused: the shard's cap on half-open handshakes.
    refused_half_open,
    /// Initials refused: the cap on connections from one address.
    refused_per_ip,
    /// Of the refused, those answered with a server Initial closing with CONNECTION_REFUSED
    /// (the rest were past the answers budget, `answers_limited`).
    refusals_sent,
    /// Configurations replaced while running (a certificate reloaded on SIGHUP).
    config_reloads,
    /// Initials refused: the server is draining (graceful stop); answered like the other
    /// refusals.
    refused_draining,
    /// Connections that ended on their own while the server drained (before its deadline).
    drained,
    /// Connections still open at the drain deadline, closed then.
    drain_closed,
    /// Initials admitted while draining after a handover to an upgrade: the first round
    /// trips of handshakes begun here, which the steering keeps here.
    handover_admitted,
    /// Handshakes dropped at their deadline (not done in time; nothing sent to the peer).
    handshake_timeouts,
    /// Loop turns.
    turns,
    /// Connections served (their application's turn and their packets), over all turns:
    /// `served / turns` is the connections served per turn.
    served,
    /// Deadlines that came due (quiche's timers, pacing holds, handshake deadlines, the
    /// application's wake-ups): the sum of the next three and `handshake_timeouts`' share.
    timers_fired,
    /// Of those, quiche's own timers (loss detection, delayed acknowledgements, idle).
    timers_quic,
    /// Of those, held packets' release times (the host pacing).
    timers_release,
    /// Of those, wake-ups the application asked for.
    timers_app,
    /// Packets sent ahead of their pacing time as the start of a burst after a quiet spell
    /// (`udpx_quic::pacing::QUIET_BURST`).
    quiet_sends,
    /// Times the loop waited in ppoll (it waits only when nothing is ready).
    waits,
    /// Times the loop slept first to let work gather (`HostConfig::coalesce`).
    coalesced,
    /// Turns that ended with connections still ready and kept their few packets for the next
    /// turn's send call instead of sending them alone.
    deferred_flushes,
    /// Turns whose packets were all the small freed windows of acknowledgement-clocked
    /// transfers and waited for the next acknowledgements' packets to join them in one send
    /// call, at most `HostConfig::ack_defer` (TCP's `tcp_tso_should_defer`).
    ack_defers,
    /// Of the send calls that followed such waits, those made at the time limit rather than
    /// because enough packets had gathered or other work came.
    ack_defer_expired,
    /// Probes written on a path the peer left after a NAT rebinding and sent to its new
    /// address instead: what quiche stranded on the old path (`Host::resend_stranded`).
    stranded_probes,
    /// Messages the socket sent with MSG_ZEROCOPY (the socket's count).
    zerocopy_sends,
    /// Of their completions, those in which the kernel copied after all (the socket's count).
    zerocopy_copied,
    /// Times zerocopy was turned off because the kernel kept copying (the socket's count).
    zerocopy_turned_off,
    /// Zerocopy send calls the kernel refused with ENOBUFS and that were sent by copying at
    /// once: socket option memory, or pinned pages past RLIMIT_MEMLOCK (the socket's count).
    zerocopy_refused,
    /// Flushes that could not take a pooled buffer (all in flight) and copied instead.
    zerocopy_pool_empty,
}

pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl HostCounters {
    /// Every datagram dropped at the host, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_unparseable
            + self.dropped_by_quic
            + self.dropped_unknown_cid
            + self.dropped_bad_initial
            + self.dropped_truncated
    }

    /// Connections served per turn.
    pub fn served_per_turn(&self) -> f64 {
        ratio(self.served, self.turns)
    }
}
