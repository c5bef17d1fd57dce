//! Departure times (`SO_TXTIME` / `SCM_TXTIME`).
//!
//! udpx configures `SO_TXTIME` with a [`TxClock`], `CLOCK_MONOTONIC` (the clock the fq qdisc
//! paces on) unless asked for `CLOCK_TAI` (the clock etf is configured with), and attaches a
//! [`Timestamp`] per transmit. Whether the kernel *enforces* it depends on the egress qdisc:
//! fq or etf hold packets until their time; any other qdisc sends at once and says nothing.
//! [`crate::qdisc::egress`] tells which (and `udpx probe` shows it); a pacer must detect that
//! and pace in user space.
//!
//! Departure times are always given on `CLOCK_MONOTONIC`, whatever the socket's clock, so a
//! pacer has one time base. For a [`TxClock::Tai`] socket the send path adds the offset
//! `CLOCK_TAI − CLOCK_MONOTONIC`, read once per send call (two vDSO clock reads): the offset
//! moves only when the system clock is stepped or slewed, by far less than a packet's
//! look-ahead within one call. A step of the system clock between a pacer computing a time
//! and sending it shifts that time by the step; etf drops packets that end up in its past.

use std::ops::Add;
use std::time::Duration;

/// The clock a socket's departure times are on, as the kernel sees them (`sock_txtime.clockid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TxClock {
    /// `CLOCK_MONOTONIC`: what fq honours. Any socket may set it.
    #[default]
    Monotonic,
    /// `CLOCK_TAI`: what etf is configured with. Setting it needs CAP_NET_ADMIN (the kernel
    /// refuses other clocks than `CLOCK_MONOTONIC` with EPERM otherwise: `sk_setsockopt`).
    Tai,
}

impl TxClock {
    /// The `clockid_t` for `SO_TXTIME`.
    pub(crate) fn clockid(self) -> libc::clockid_t {
        match self {
            TxClock::Monotonic => libc::CLOCK_MONOTONIC,
            TxClock::Tai => libc::CLOCK_TAI,
        }
    }

    /// What to add to a `CLOCK_MONOTONIC` time to get this clock's time for the same instant:
    /// 0 for `Monotonic`; `CLOCK_TAI − CLOCK_MONOTONIC` read now for `Tai`.
    pub fn offset_from_monotonic_ns(self) -> i64 {
        match self {
            TxClock::Monotonic => 0,
            TxClock::Tai => {
                let mono = crate::sys::clock_ns(libc::CLOCK_MONOTONIC) as i64;
                let tai = crate::sys::clock_ns(libc::CLOCK_TAI) as i64;
                let mono2 = crate::sys::clock_ns(libc::CLOCK_MONOTONIC) as i64;
                // The TAI read sits between two monotonic reads: take their midpoint.
                tai - (mono + (mono2 - mono) / 2)
            }
        }
    }

    /// `CLOCK_MONOTONIC` ns `mono` on this clock, given an offset from
    /// [`TxClock::offset_from_monotonic_ns`] (saturating at 0 and `u64::MAX`).
    pub fn convert(mono: u64, offset_ns: i64) -> u64 {
        mono.saturating_add_signed(offset_ns)
    }
}

impl std::fmt::Display for TxClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TxClock::Monotonic => "CLOCK_MONOTONIC",
            TxClock::Tai => "CLOCK_TAI",
        })
    }
}

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

    #[test]
    fn clocks() {
        assert_eq!(TxClock::default(), TxClock::Monotonic);
        assert_eq!(TxClock::Monotonic.offset_from_monotonic_ns(), 0);
        // TAI counts from 1970, MONOTONIC from boot: the offset is positive and near the
        // realtime offset (plus 0 to 37 s of TAI-UTC, depending on what the system set; 0 here),
        // within the jitter of reading two clocks one after the other (1 ms of slack).
        let off = TxClock::Tai.offset_from_monotonic_ns();
        let real =
            crate::sys::clock_ns(libc::CLOCK_REALTIME) as i64 - crate::sys::clock_ns(libc::CLOCK_MONOTONIC) as i64;
        assert!((-1_000_000..=38_000_000_000).contains(&(off - real)), "TAI offset {off}, realtime offset {real}");
        assert_eq!(TxClock::convert(10, -20), 0);
        assert_eq!(TxClock::convert(u64::MAX - 1, 5), u64::MAX);
        assert_eq!(TxClock::convert(1_000, 500), 1_500);
    }
}
