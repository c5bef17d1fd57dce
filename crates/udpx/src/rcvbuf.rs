//! How large a receive buffer to ask for: sized from the burst it must absorb, in the
//! kernel's own terms.
//!
//! The kernel charges every queued datagram its `truesize`, the whole allocation behind it
//! (`sk_buff`, the data buffer rounded up by the allocator, `skb_shared_info`), not its
//! payload, against `SO_RCVBUF`; and it doubles the value a program sets to leave room for
//! that overhead (`sock_setsockopt`: `val * 2`). Measured here over loopback (`SO_MEMINFO`):
//!
//! ```text
//!  payload   1     100   500   1000  1472  2000  4000  8000   16000  32000  60000   bytes
//!  truesize  832   832   1280  2304  2304  4352  8448  16640  16640  32832  60832   bytes
//! ```
//!
//! A small buffer comes from a 576-byte cache; a larger linear one rounds the headroom, the
//! payload and `skb_shared_info` up to a power of two; either adds the 256-byte `sk_buff`; a
//! large send is built from pages and costs its payload plus a small head and the `sk_buff`
//! (832 bytes). GRO coalesces segments whose buffers stay separate (a frag list), so a coalesced
//! buffer costs about the sum of its segments.
//!
//! Bigger is not safer. A queue far larger than the cache makes every copy to user space a
//! cache miss: on this machine a saturated receiver with a 32 MiB buffer (64 MiB effective)
//! spent more CPU per byte and *lost* 16-34 % of a GSO stream, against 1 % with 2 MiB. A
//! buffer should absorb the burst the receiver can fall behind by, no more: [`RecvRole`]
//! describes it, [`plan`] turns it into the value to set.

use std::time::Duration;

/// Bytes the kernel charges to a receive buffer for one queued datagram of `payload` bytes
/// (the module table; a model of loopback and veth, which hand the sender's buffer on).
pub fn truesize(payload: usize) -> usize {
    /// Headroom, IP and UDP headers and `skb_shared_info` inside the data buffer.
    const IN_BUFFER: usize = 320;
    /// `sk_buff` itself.
    const SKB: usize = 256;
    /// Small heads come from their own cache (`skb_small_head_cache`).
    const SMALL_HEAD: usize = 576;
    /// Larger linear buffers round up to a power of two (`kmalloc`); past this the data is
    /// in pages, charged by length, behind a small head.
    const LINEAR_MAX: usize = 16 << 10;
    let linear = payload.saturating_add(IN_BUFFER);
    if linear <= SMALL_HEAD {
        SMALL_HEAD + SKB
    } else if linear <= LINEAR_MAX {
        linear.next_power_of_two() + SKB
    } else {
        payload.saturating_add(SMALL_HEAD + SKB)
    }
}

/// What a receiver must be able to absorb while it is not reading.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum RecvRole {
    /// One fast stream into a receiver that drains it as fast as it can (a bulk transfer, the
    /// bench): the bytes arriving during the longest gap between two reads (scheduling, a
    /// busy batch), at the stream's rate.
    Bulk {
        /// Arrival rate in payload bytes per second.
        rate: u64,
        /// Longest gap between two reads.
        gap: Duration,
        /// Payload of one datagram.
        datagram: usize,
    },
    /// A server whose many clients each send short bursts: all of them may arrive at once.
    Server {
        /// Clients that may send at the same time.
        clients: usize,
        /// Datagrams per client burst.
        burst: usize,
        /// Payload of one datagram.
        datagram: usize,
    },
}

/// The receive buffer a [`RecvRole`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcvbufPlan {
    /// Datagrams the queue must hold.
    pub datagrams: usize,
    /// Bytes the kernel charges for each ([`truesize`]).
    pub truesize: usize,
    /// The value to set (`SocketConfig::recv_buffer`): half of what is needed, because the
    /// kernel doubles it.
    pub set: usize,
    /// What the kernel will report back (`SO_RCVBUF`, doubled), unless capped by
    /// `net.core.rmem_max` for a process without CAP_NET_ADMIN.
    pub effective: usize,
}

/// Smallest value udpx sets: the kernel's usual default (`net.core.rmem_default`, 208 KiB),
/// so sizing never makes a socket worse off than leaving it alone.
pub const MIN_SET: usize = 212_992;
/// Largest value udpx sets (64 MiB effective): past this the queue is certain to be cold.
pub const MAX_SET: usize = 32 << 20;

/// The buffer for `role`: enough for its burst in kernel terms, at least [`MIN_SET`], at most
/// [`MAX_SET`].
pub fn plan(role: RecvRole) -> RcvbufPlan {
    let (datagrams, payload) = match role {
        RecvRole::Bulk { rate, gap, datagram } => {
            let bytes = (rate as f64 * gap.as_secs_f64()).ceil() as usize;
            // Plus one receive batch of 64 that is being copied out while more arrive.
            (bytes.div_ceil(datagram.max(1)).saturating_add(64), datagram)
        }
        RecvRole::Server { clients, burst, datagram } => (clients.saturating_mul(burst).max(1), datagram),
    };
    let truesize = truesize(payload);
    let set = datagrams.saturating_mul(truesize).div_ceil(2).clamp(MIN_SET, MAX_SET);
    RcvbufPlan { datagrams, truesize, set, effective: set * 2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truesize_follows_the_kernels_table() {
        // The loopback measurements of the module table, exactly.
        let table = [
            (1, 832),
            (100, 832),
            (500, 1280),
            (1000, 2304),
            (1472, 2304),
            (2000, 4352),
            (4000, 8448),
            (8000, 16640),
            (16000, 16640),
            (32000, 32832),
            (60000, 60832),
        ];
        for (payload, want) in table {
            assert_eq!(truesize(payload), want, "payload {payload}");
        }
    }

    #[test]
    fn plans_by_role() {
        // A 2 GB/s stream of 1472-byte datagrams, 1 ms between reads: 1359 + 64 datagrams of
        // 2304 bytes, half of it set.
        let p = plan(RecvRole::Bulk { rate: 2_000_000_000, gap: Duration::from_millis(1), datagram: 1472 });
        assert_eq!((p.datagrams, p.truesize), (1423, 2304));
        assert_eq!(p.set, (1423 * 2304_usize).div_ceil(2));
        assert_eq!(p.effective, p.set * 2);
        // 1000 DNS-like clients with 4 requests each of 100 bytes: 4000 x 832.
        let s = plan(RecvRole::Server { clients: 1000, burst: 4, datagram: 100 });
        assert_eq!((s.datagrams, s.truesize, s.set), (4000, 832, 4000 * 832 / 2));
        // Small needs get the kernel default, absurd ones the cap.
        assert_eq!(plan(RecvRole::Server { clients: 1, burst: 1, datagram: 100 }).set, MIN_SET);
        let huge = plan(RecvRole::Bulk { rate: u64::MAX / 4, gap: Duration::from_secs(10), datagram: 1 });
        assert_eq!(huge.set, MAX_SET);
        assert_eq!(plan(RecvRole::Server { clients: 0, burst: 0, datagram: 0 }).set, MIN_SET);
    }
}
