//! What a pacer and a flow are asked to do, and the checks that turn a request into numbers
//! the pacer can keep.

use crate::error::PaceError;

/// Above this a rate is a unit mistake, not a flow: 400 Gbit/s, in bytes per second.
pub const MAX_RATE: u64 = 50_000_000_000;
/// The largest UDP payload (IPv4): 65,535 - 20 - 8.
pub const MAX_DATAGRAM: u32 = 65_507;
/// Most datagrams in one release (one GSO buffer): the kernel's long-standing `UDP_MAX_SEGMENTS`
/// (64; 128 since Linux 6.9, which udpx probes, but a pacer that needs more than 64 per
/// release is not pacing).
pub const MAX_SEGMENTS: u32 = 64;

const NS_PER_SEC: u128 = 1_000_000_000;

/// The wheel and the shard's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacerConfig {
    /// Slot length, ns. Departures are released when their slot has elapsed, so a datagram
    /// leaves between 0 and one slot (plus the wake-up latency) after its departure time.
    /// Default 250 us.
    pub slot_ns: u64,
    /// Slot count: a power of two, at least 64. The horizon (slots x slot) should exceed the
    /// longest interval; a flow due further out waits in the last slot and is re-filed.
    /// Default 4096 (1.024 s at 250 us).
    pub slots: u32,
    /// Most flows at once; every table is sized for it up front. Default 16,384.
    pub max_flows: u32,
    /// Seeds the per-flow phase hash. Same seed, same phases (tests rely on it).
    pub seed: u64,
    /// Aggregate smoothing: the releases of one advance may add up to at most this percentage
    /// of the flows' summed rate over the time since the previous advance (plus a slot's worth
    /// of slack); flows more than a slot late beyond it wait for the next slot, keeping their
    /// credit. After a late wake (a timer 5 ms late, a preempted thread) the flows that fell
    /// due meanwhile then leave spread over the following slots at this rate instead of all in
    /// one lump. Flows due within the last slot always go: on time it changes nothing. 0: off
    /// (every due flow leaves at once). Default 0.
    pub smoothing_pct: u32,
}

impl Default for PacerConfig {
    fn default() -> Self {
        PacerConfig { slot_ns: 250_000, slots: 4096, max_flows: 16_384, seed: 0x5eed_u64, smoothing_pct: 0 }
    }
}

impl PacerConfig {
    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), PaceError> {
        if self.slot_ns == 0 {
            return Err(PaceError::ZeroSlot);
        }
        if !self.slots.is_power_of_two() || self.slots < 64 {
            return Err(PaceError::SlotCount { slots: self.slots });
        }
        if self.max_flows == 0 || self.max_flows == u32::MAX {
            return Err(PaceError::MaxFlows { max_flows: self.max_flows });
        }
        if self.smoothing_pct != 0 && !(101..=1000).contains(&self.smoothing_pct) {
            return Err(PaceError::Smoothing { pct: self.smoothing_pct });
        }
        Ok(())
    }
}

/// How many datagrams a flow sends per release: the Figure 4 trade-off. Fewer per release is
/// smoother on the wire; more per release costs fewer wake-ups and lets GSO build larger
/// buffers, at the price of bursts (the paper measured CPU 100 / 92 / 88 / 84 % and relative
/// loss 100 / 103 / 110 / 117 % for bursts of 1 / 2 / 4 / 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    /// This many datagrams per release; the interval follows (batch x size / rate).
    Segments(u32),
    /// A release every this many ns; the batch follows (rate x interval / size, rounded down).
    IntervalNs(u64),
}

impl Default for Granularity {
    /// Two datagrams per release.
    fn default() -> Self {
        Granularity::Segments(2)
    }
}

/// One flow's pacing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowConfig {
    /// Bytes per second (UDP payload).
    pub rate: u64,
    /// Bytes per datagram (UDP payload; the GSO segment size).
    pub datagram_size: u32,
    /// Datagrams per release, directly or from an interval.
    pub granularity: Granularity,
    /// The most datagrams the flow may send beyond its rate: over any time span `d`, it sends
    /// at most `rate x d + burst x datagram_size` bytes. At least the batch; `None` means
    /// twice the batch, so a release up to one interval late loses no rate.
    pub burst: Option<u32>,
    /// Whether the flow always has data (a streaming source, like the paper's video server) or
    /// sends only what [`Pacer::enqueue`](crate::Pacer::enqueue) gave it.
    pub source: Source,
}

/// Where a flow's datagrams come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// Always has data: released at its rate for as long as it exists.
    #[default]
    Streaming,
    /// Sends the datagrams enqueued; idle (out of the wheel) when none are left.
    Queued,
}

impl FlowConfig {
    /// A streaming flow of `rate` bytes/s in datagrams of `datagram_size`, two per release,
    /// burst four.
    pub fn new(rate: u64, datagram_size: u32) -> Self {
        FlowConfig { rate, datagram_size, granularity: Granularity::default(), burst: None, source: Source::Streaming }
    }

    /// Checks the flow against the wheel's slot and derives the numbers the pacer keeps.
    pub fn validate(&self, slot_ns: u64) -> Result<FlowParams, PaceError> {
        if self.rate == 0 {
            return Err(PaceError::ZeroRate);
        }
        if self.rate > MAX_RATE {
            return Err(PaceError::RateTooHigh { rate: self.rate });
        }
        if self.datagram_size == 0 || self.datagram_size > MAX_DATAGRAM {
            return Err(PaceError::DatagramSize { size: self.datagram_size });
        }
        let batch = match self.granularity {
            Granularity::Segments(n) => u64::from(n),
            Granularity::IntervalNs(i) => {
                if i < slot_ns {
                    return Err(PaceError::IntervalBelowSlot { interval_ns: i, slot_ns });
                }
                (u128::from(self.rate) * u128::from(i) / NS_PER_SEC / u128::from(self.datagram_size))
                    .min(u64::MAX.into()) as u64
            }
        };
        if batch == 0 || batch > u64::from(MAX_SEGMENTS) {
            return Err(PaceError::BatchSize { batch });
        }
        let batch = batch as u32;
        let burst = match self.burst {
            Some(0) => return Err(PaceError::ZeroBurst),
            Some(b) => b,
            None => 2 * batch,
        };
        if burst < batch {
            return Err(PaceError::BatchAboveBurst { batch, burst });
        }
        let p = FlowParams { rate: self.rate, size: self.datagram_size, batch, burst, source: self.source };
        let interval_ns = p.duration_ns(batch);
        if interval_ns < slot_ns {
            return Err(PaceError::IntervalBelowSlot { interval_ns, slot_ns });
        }
        Ok(p)
    }
}

/// A validated flow: what the pacer keeps per flow besides its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowParams {
    /// Bytes per second.
    pub rate: u64,
    /// Bytes per datagram.
    pub size: u32,
    /// Datagrams per release when on time.
    pub batch: u32,
    /// Burst allowance, datagrams (>= batch).
    pub burst: u32,
    /// Streaming or queued.
    pub source: Source,
}

impl FlowParams {
    /// Time to send `n` datagrams at the rate, ns, rounded up (so the rate is never exceeded).
    pub fn duration_ns(&self, n: u32) -> u64 {
        let bytes_ns = u128::from(n) * u128::from(self.size) * NS_PER_SEC;
        bytes_ns.div_ceil(u128::from(self.rate)).min(u64::MAX.into()) as u64
    }

    /// Whole datagrams the rate pays for in `ns`, rounded down.
    pub fn datagrams_in(&self, ns: u64) -> u64 {
        (u128::from(ns) * u128::from(self.rate) / NS_PER_SEC / u128::from(self.size)).min(u64::MAX.into()) as u64
    }

    /// How far behind its schedule a flow may fall and still catch up: the burst beyond one
    /// batch, in time (rounded down). With it, a flow's sends over any span `d` stay within
    /// `rate x (d + 1 ns) + burst` datagrams (the 1 ns is [`duration_ns`](Self::duration_ns)
    /// rounding up).
    pub fn catch_up_ns(&self) -> u64 {
        let bytes_ns = u128::from(self.burst - self.batch) * u128::from(self.size) * NS_PER_SEC;
        (bytes_ns / u128::from(self.rate)).min(u64::MAX.into()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: u64 = 250_000;

    fn flow(rate: u64, size: u32, g: Granularity, burst: Option<u32>) -> FlowConfig {
        FlowConfig { rate, datagram_size: size, granularity: g, burst, source: Source::Streaming }
    }

    /// Good flows and the numbers they become: (config, batch, burst, interval ns).
    #[test]
    fn derived_truth_table() {
        use Granularity::*;
        let table = [
            (flow(4_000, 1_200, Segments(2), None), 2, 4, 600_000_000),
            (flow(4_000, 1_000, Segments(1), Some(1)), 1, 1, 250_000_000),
            // The paper: 1 MB/s, 8 ms interval, 1000-byte datagrams -> 8 per release.
            (flow(1_000_000, 1_000, IntervalNs(8_000_000), Some(8)), 8, 8, 8_000_000),
            (flow(1_000_000, 1_000, IntervalNs(8_500_000), None), 8, 16, 8_000_000),
            (flow(3, 1, Segments(1), None), 1, 2, 333_333_334),
        ];
        for (cfg, batch, burst, interval) in table {
            let p = cfg.validate(SLOT).unwrap();
            assert_eq!((p.batch, p.burst, p.duration_ns(p.batch)), (batch, burst, interval), "{cfg:?}");
        }
    }

    /// Bad flows and the error each gets.
    #[test]
    fn rejected_truth_table() {
        use Granularity::*;
        let table = [
            (flow(0, 1_200, Segments(2), None), PaceError::ZeroRate),
            (flow(MAX_RATE + 1, 1_200, Segments(2), None), PaceError::RateTooHigh { rate: MAX_RATE + 1 }),
            (flow(4_000, 0, Segments(2), None), PaceError::DatagramSize { size: 0 }),
            (flow(4_000, 70_000, Segments(2), None), PaceError::DatagramSize { size: 70_000 }),
            (flow(4_000, 1_200, Segments(0), None), PaceError::BatchSize { batch: 0 }),
            (flow(4_000, 1_200, Segments(65), None), PaceError::BatchSize { batch: 65 }),
            (flow(4_000, 1_200, Segments(2), Some(0)), PaceError::ZeroBurst),
            (flow(4_000, 1_200, Segments(4), Some(2)), PaceError::BatchAboveBurst { batch: 4, burst: 2 }),
            (
                flow(4_000, 1_200, IntervalNs(100_000), None),
                PaceError::IntervalBelowSlot { interval_ns: 100_000, slot_ns: SLOT },
            ),
            // 1 ms of 4 kB/s is not one datagram.
            (flow(4_000, 1_200, IntervalNs(1_000_000), None), PaceError::BatchSize { batch: 0 }),
            // 1 GB/s in 2 datagrams of 1200 B is 2.4 us per release: far below a slot.
            (
                flow(1_000_000_000, 1_200, Segments(2), None),
                PaceError::IntervalBelowSlot { interval_ns: 2_400, slot_ns: SLOT },
            ),
        ];
        for (cfg, err) in table {
            assert_eq!(cfg.validate(SLOT), Err(err), "{cfg:?}");
        }
    }

    #[test]
    fn pacer_config_truth_table() {
        let ok = PacerConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let table = [
            (PacerConfig { slot_ns: 0, ..ok }, PaceError::ZeroSlot),
            (PacerConfig { slots: 100, ..ok }, PaceError::SlotCount { slots: 100 }),
            (PacerConfig { slots: 32, ..ok }, PaceError::SlotCount { slots: 32 }),
            (PacerConfig { max_flows: 0, ..ok }, PaceError::MaxFlows { max_flows: 0 }),
            (PacerConfig { max_flows: u32::MAX, ..ok }, PaceError::MaxFlows { max_flows: u32::MAX }),
        ];
        for (cfg, err) in table {
            assert_eq!(cfg.validate(), Err(err));
        }
    }

    /// Rounding: durations up, datagrams down, catch-up down.
    #[test]
    fn rounding() {
        let p = flow(3, 1, Granularity::Segments(1), Some(3)).validate(1).unwrap();
        assert_eq!(p.duration_ns(1), 333_333_334);
        assert_eq!(p.datagrams_in(333_333_333), 0);
        assert_eq!(p.datagrams_in(333_333_334), 1);
        assert_eq!(p.catch_up_ns(), 666_666_666);
        assert_eq!(p.datagrams_in(p.catch_up_ns()), 1, "2/3 s at 3 B/s pays for 1 more than 1 s - 1/3 s");
        let tight = flow(4_000, 1_200, Granularity::Segments(2), Some(2)).validate(SLOT).unwrap();
        assert_eq!(tight.catch_up_ns(), 0);
    }
}
