//! Per-socket counters: what the bench and every tool read.
//!
//! Updated with relaxed atomics once per system call (not per datagram), so they cost a few
//! nanoseconds against a syscall of microseconds.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $name:ident ),* $(,)?) => {
        /// The live counters of one socket.
        #[derive(Debug, Default)]
        pub(crate) struct Counters { $( pub(crate) $name: AtomicU64, )* }

        /// A snapshot of a socket's counters ([`UdpSocket::counters`](crate::UdpSocket::counters)).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct CounterSnapshot { $( $(#[doc = $doc])* pub $name: u64, )* }

        impl Counters {
            pub(crate) fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name.load(Relaxed), )* }
            }
        }

        impl CounterSnapshot {
            /// Field-wise difference `self - earlier` (saturating), for a measurement interval.
            pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name.saturating_sub(earlier.$name), )* }
            }

            /// Field-wise sum, to total several sockets (shards).
            pub fn add(&self, other: &CounterSnapshot) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name + other.$name, )* }
            }

            /// `(name, value)` pairs, for reports.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }

            /// `(name, what it counts, value)`, for metrics endpoints: the text is this
            /// field's documentation.
            pub fn fields_with_help(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![ $( (stringify!($name), concat!($($doc),*), self.$name), )* ]
            }
        }
    };
}

counters! {
    /// Send system calls made (sendmsg or sendmmsg), including failed ones.
    send_calls,
    /// Datagrams (on-the-wire UDP packets) sent, counting each GSO segment.
    datagrams_sent,
    /// Payload bytes sent.
    bytes_sent,
    /// Messages handed to the kernel with `UDP_SEGMENT` (GSO super-buffers).
    gso_buffers_sent,
    /// `sendmmsg` calls that took fewer messages than offered (continued, not dropped).
    partial_sends,
    /// Sends that returned EAGAIN.
    would_block,
    /// ENOBUFS answers (device queue or qdisc full) the send mechanism stopped at.
    no_buffers,
    /// Of those, retried by the blocking send after a back-off.
    enobufs_retries,
    /// Times GSO was turned off after the path refused a segmented send (EIO/EINVAL); the
    /// refused batch was re-sent as plain datagrams.
    gso_fallbacks,
    /// Times the GSO segment limit was lowered after the kernel refused a larger count.
    segment_limit_lowered,
    /// EMSGSIZE answers reported to the caller.
    emsgsize,
    /// Messages the kernel took with MSG_ZEROCOPY (each consumes one completion id).
    zerocopy_sends,
    /// Zerocopy ids consumed by send calls that failed after the kernel built the packet
    /// (EINVAL from SO_NO_CHECK, EIO, a qdisc or netfilter drop): their completions arrive
    /// too. Every id completes: `zerocopy_completed == zerocopy_sends + zerocopy_failed_ids`
    /// once nothing is in flight.
    zerocopy_failed_ids,
    /// Zerocopy ids completed by the kernel.
    zerocopy_completed,
    /// Of those, completions where the kernel copied after all (SO_EE_CODE_ZEROCOPY_COPIED).
    zerocopy_copied,
    /// Of those, completions that came as io_uring notifications (SENDMSG_ZC) rather than
    /// from the error queue.
    zerocopy_ring_notifs,
    /// Zerocopy sends refused with ENOBUFS (optmem) and sent by copying instead.
    zerocopy_enobufs_copied,
    /// Zerocopy-eligible sends copied because `max_inflight` sends were in flight already.
    zerocopy_inflight_copied,
    /// Times zerocopy was turned off for the socket because the kernel kept copying.
    zerocopy_turned_off,
    /// Buffers still in flight when the socket was dropped, kept alive (leaked) so the kernel
    /// never reads reused memory.
    zerocopy_leaked_on_drop,
    /// Extended errors from the error queue that were not zerocopy completions (ICMP errors,
    /// with IP_RECVERR).
    icmp_errors,
    /// Of those: port unreachable (ECONNREFUSED).
    icmp_port_unreachable,
    /// Of those: host unreachable (EHOSTUNREACH, EHOSTDOWN).
    icmp_host_unreachable,
    /// Of those: network unreachable (ENETUNREACH, ENONET).
    icmp_net_unreachable,
    /// Of those: fragmentation needed / packet too big (EMSGSIZE, from the network or the
    /// local stack).
    icmp_too_big,
    /// Of those: administratively prohibited (EACCES).
    icmp_prohibited,
    /// Of those: any other kind.
    icmp_other,
    /// Sends and receives retried after a pending ICMP error failed them (IP_RECVERR,
    /// unconnected sockets).
    icmp_retries,
    /// Calls that met new ICMP errors on every try of their budget and returned WouldBlock
    /// (nothing lost: the caller comes back): an ICMP flood at work.
    icmp_flood_yields,
    /// ICMP errors the library read and dropped from the ones kept for drain_errors (the
    /// newest 64 are kept).
    icmp_unseen,
    /// Other send errors reported to the caller.
    send_errors,
    /// Receive system calls that returned data (recvmsg or recvmmsg).
    recv_calls,
    /// Messages received (a GRO super-buffer is one message).
    messages_received,
    /// Datagrams received, counting each segment of a GRO buffer.
    datagrams_received,
    /// Payload bytes received.
    bytes_received,
    /// Messages that arrived coalesced by GRO (more than one segment).
    gro_buffers_received,
    /// Messages cut short because the buffer was too small (MSG_TRUNC).
    truncated,
    /// Messages whose control data the kernel cut (MSG_CTRUNC); on a GRO socket without the
    /// segment size their datagrams are not handed out (see `RecvMeta::control_truncated`).
    control_truncated,
    /// The kernel's drop counter for this socket (SO_RXQ_OVFL), last value seen.
    kernel_drops,
}

impl CounterSnapshot {
    /// Datagrams per send system call (the batching factor).
    pub fn datagrams_per_send_call(&self) -> f64 {
        ratio(self.datagrams_sent, self.send_calls)
    }

    /// Datagrams per receive system call.
    pub fn datagrams_per_recv_call(&self) -> f64 {
        ratio(self.datagrams_received, self.recv_calls)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Counters {
    pub(crate) fn add(&self, c: &AtomicU64, n: u64) {
        let _ = self;
        c.fetch_add(n, Relaxed);
    }

    pub(crate) fn max(&self, c: &AtomicU64, n: u64) {
        let _ = self;
        c.fetch_max(n, Relaxed);
    }
}
