//! Departure times (`SO_TXTIME` / `SCM_TXTIME`).
//!
//! udpx configures `SO_TXTIME` with `CLOCK_MONOTONIC`, the clock the fq qdisc paces on, and
//! attaches a [`Timestamp`] per transmit. Whether the kernel *enforces* it depends on the
//! egress qdisc: fq or etf hold packets until their time; any other qdisc sends at once and
//! says nothing. `udpx probe` tells which; a pacer must detect that and pace in user space.

use std::ops::Add;
use std::time::Duration;

/// A point on `CLOCK_MONOTONIC`, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// Now.
    pub fn now() -> Self {
        Timestamp(crate::sys::monotonic_ns())
    }

    /// From nanoseconds of `CLOCK_MONOTONIC`.
    pub fn from_nanos(ns: u64) -> Self {
        Timestamp(ns)
    }

    /// Nanoseconds of `CLOCK_MONOTONIC`.
    pub fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self` (zero if `earlier` is later).
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        let t = Timestamp::from_nanos(1_000);
        assert_eq!((t + Duration::from_micros(1)).as_nanos(), 2_000);
        assert_eq!((t + Duration::from_micros(1)).saturating_since(t), Duration::from_micros(1));
        assert_eq!(t.saturating_since(t + Duration::from_secs(1)), Duration::ZERO);
        assert!(Timestamp::now() <= Timestamp::now());
    }
}
