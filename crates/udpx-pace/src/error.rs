//! What can be wrong with a pacer or a flow, each case saying what to change.

use std::fmt;

/// A configuration the pacer refuses, or a flow it does not know. Never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PaceError {
    /// The slot length is zero.
    ZeroSlot,
    /// The slot count is not a power of two of at least 64 (the occupancy bitmap is words of 64).
    SlotCount {
        /// What was asked for.
        slots: u32,
    },
    /// `max_flows` is zero or does not fit the u32 index space (`u32::MAX` marks "none").
    MaxFlows {
        /// What was asked for.
        max_flows: u32,
    },
    /// Aggregate smoothing outside 101-1000 % (at or below 100 % the flows could never catch
    /// up after a late wake).
    Smoothing {
        /// What was asked for.
        pct: u32,
    },
    /// A flow's rate is zero.
    ZeroRate,
    /// A flow's rate is above what any machine sends ([`MAX_RATE`](crate::MAX_RATE)).
    RateTooHigh {
        /// The rate asked for, bytes per second.
        rate: u64,
    },
    /// A datagram size of zero or above the largest UDP payload.
    DatagramSize {
        /// The size asked for, bytes.
        size: u32,
    },
    /// A burst allowance of zero datagrams.
    ZeroBurst,
    /// A batch (GSO segments per release) of zero, or above [`MAX_SEGMENTS`](crate::MAX_SEGMENTS).
    BatchSize {
        /// The batch asked for or derived from rate x interval.
        batch: u64,
    },
    /// The batch is larger than the burst allowance.
    BatchAboveBurst {
        /// Datagrams per release.
        batch: u32,
        /// The burst allowance, datagrams.
        burst: u32,
    },
    /// The time between releases is shorter than a wheel slot.
    IntervalBelowSlot {
        /// Time between releases, ns (given, or batch x datagram size / rate).
        interval_ns: u64,
        /// The wheel's slot, ns.
        slot_ns: u64,
    },
    /// Every flow index is in use.
    TooManyFlows {
        /// The pacer's capacity.
        max_flows: u32,
    },
    /// No flow has this index (never added, or removed).
    UnknownFlow {
        /// The index given.
        flow: u32,
    },
}

impl fmt::Display for PaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaceError::ZeroSlot => write!(f, "the wheel slot is 0 ns: use a slot of e.g. 250 us"),
            PaceError::SlotCount { slots } => {
                write!(f, "{slots} wheel slots: use a power of two of at least 64 (e.g. 4096)")
            }
            PaceError::MaxFlows { max_flows } => {
                write!(f, "max_flows {max_flows}: use between 1 and {}", u32::MAX - 1)
            }
            PaceError::Smoothing { pct } => write!(
                f,
                "smoothing {pct} %: give 0 (off) or 101 to 1000 (at 100 % or less the flows never catch up after a late wake)"
            ),
            PaceError::ZeroRate => write!(f, "a flow rate of 0 bytes/s: give a positive rate, or remove the flow"),
            PaceError::RateTooHigh { rate } => write!(
                f,
                "a flow rate of {rate} bytes/s is above {} bytes/s (400 Gbit/s), more than any machine sends: check the unit (bytes per second, not bits)",
                crate::MAX_RATE
            ),
            PaceError::DatagramSize { size } => {
                write!(f, "a datagram size of {size} bytes: use 1 to {} bytes", crate::MAX_DATAGRAM)
            }
            PaceError::ZeroBurst => write!(f, "a burst allowance of 0 datagrams: allow at least the batch (default 2 x batch)"),
            PaceError::BatchSize { batch } => write!(
                f,
                "{batch} datagrams per release: use 1 to {} (lengthen the interval if it is 0, shorten it or lower the rate if above)",
                crate::MAX_SEGMENTS
            ),
            PaceError::BatchAboveBurst { batch, burst } => write!(
                f,
                "{batch} datagrams per release exceed the burst allowance of {burst}: raise the burst to at least {batch} or shorten the interval"
            ),
            PaceError::IntervalBelowSlot { interval_ns, slot_ns } => write!(
                f,
                "releases every {interval_ns} ns are shorter than the {slot_ns} ns wheel slot: lengthen the interval (more datagrams per release) or use a shorter slot"
            ),
            PaceError::TooManyFlows { max_flows } => write!(
                f,
                "all {max_flows} flows are in use: create the pacer with a larger max_flows, or shard the flows over more pacers (one per core)"
            ),
            PaceError::UnknownFlow { flow } => write!(f, "no flow {flow}: it was never added or has been removed"),
        }
    }
}

impl std::error::Error for PaceError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message names the value and says what to change.
    #[test]
    fn messages_say_what_to_change() {
        let table: &[(PaceError, &str)] = &[
            (PaceError::ZeroSlot, "use a slot"),
            (PaceError::SlotCount { slots: 100 }, "power of two"),
            (PaceError::MaxFlows { max_flows: 0 }, "between 1 and"),
            (PaceError::ZeroRate, "positive rate"),
            (PaceError::RateTooHigh { rate: u64::MAX }, "check the unit"),
            (PaceError::DatagramSize { size: 0 }, "use 1 to"),
            (PaceError::ZeroBurst, "at least the batch"),
            (PaceError::BatchSize { batch: 1000 }, "use 1 to 64"),
            (PaceError::BatchAboveBurst { batch: 8, burst: 4 }, "raise the burst to at least 8"),
            (PaceError::IntervalBelowSlot { interval_ns: 1, slot_ns: 250_000 }, "lengthen the interval"),
            (PaceError::TooManyFlows { max_flows: 10 }, "larger max_flows"),
            (PaceError::UnknownFlow { flow: 3 }, "no flow 3"),
        ];
        for (e, want) in table {
            let s = e.to_string();
            assert!(s.contains(want), "{s:?} lacks {want:?}");
        }
    }
}
