//! When a turn's packets leave: the flush rules, one decision after each turn's serving, told
//! the time and what the connections wrote. No socket here: the loop sends what the rules say.
//!
//! - Blocked: a flush the socket refused (EAGAIN, ENOBUFS) is retried first, and the loop waits
//!   for writability (or half a millisecond without buffers) before serving again.
//! - Deferred ([`HostConfig::defer_flush`](super::HostConfig::defer_flush)): a connection that
//!   wrote its quantum and has more goes back to the ready queue, so the next turn comes at
//!   once; a small remainder (under [`DEFER_BELOW`]) waits for that turn's packets, which join
//!   the same runs and the same send call. One turn at most, and never across a wait.
//! - Held ([`HostConfig::ack_defer`](super::HostConfig::ack_defer)): the few packets an
//!   acknowledgement freed in a transfer under way wait, under [`ACK_DEFER_BELOW`] and within
//!   half the connection's round trip, for the next acknowledgements' packets.
//! - Coalesced ([`HostConfig::coalesce`](super::HostConfig::coalesce)): while work keeps
//!   coming, a turn starts no sooner than the least time after the last one's start.

use std::time::{Duration, Instant};

use crate::counters::HostCounters;
use crate::outbox::Flush;

/// A turn that leaves connections ready keeps its packets for the next turn while they are
/// fewer bytes than this (about 44 full packets), so that turn's join them in one send call.
const DEFER_BELOW: usize = 64 << 10;

/// A connection that wrote fewer packets than this in a turn, mid-transfer, wrote what one
/// acknowledgement freed ([`crate::HostConfig::ack_defer`]).
pub(crate) const ACK_CLOCKED_PACKETS: u64 = 16;
/// Deferred acknowledgement-clocked packets leave once they reach this many bytes (about 32
/// full packets: half a GSO run's most).
pub(crate) const ACK_DEFER_BELOW: usize = 40 << 10;
/// A connection that sent within this much before its turn is mid-transfer.
const MID_TRANSFER: Duration = Duration::from_millis(2);

/// What one connection's turn wrote, as the flush rules need it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wrote {
    /// Packets it wrote.
    pub packets: u64,
    /// It wrote its quantum and may have more.
    pub more: bool,
    /// It holds a packet for pacing.
    pub paced: bool,
    /// It is closing (its packets are its last).
    pub closing: bool,
    /// When it last sent before this turn.
    pub prior_out: Option<Instant>,
}

/// What the loop does with the outbox after serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// Nothing to send, or the socket is blocked.
    Nothing,
    /// Send it now.
    Send,
    /// Keep it for the next turn, which comes at once (a deferred flush).
    Defer,
    /// Keep it, until the time limit of its acknowledgement-clocked connections at most.
    Hold,
}

/// What the connections served in one turn did, as far as the flush goes.
#[derive(Debug, Clone, Copy, Default)]
struct ThisTurn {
    /// One wrote its quantum and went back to the ready queue.
    more: bool,
    /// One wrote packets that were not the small freed window of an
    /// acknowledgement-clocked transfer: the turn's packets leave now.
    unclocked: bool,
    /// The earliest time limit of its acknowledgement-clocked connections.
    clocked_by: Option<Instant>,
}

/// The flush rules and their state (see the module docs).
#[derive(Debug)]
pub(super) struct FlushRules {
    /// The least time between the starts of two turns while work keeps coming (zero: none).
    coalesce: Duration,
    /// Whether a turn may keep its packets for the next one.
    defer_flush: bool,
    /// The most acknowledgement-clocked packets wait (zero: never).
    ack_defer: Duration,
    /// The socket refused the last flush.
    pub blocked: Option<Flush>,
    /// The last turn kept its packets for this one.
    deferred: bool,
    this_turn: ThisTurn,
    /// Packets kept by acknowledgement-clocked deferral leave by then.
    flush_by: Option<Instant>,
    /// When the last turn started.
    last_turn: Instant,
}

impl FlushRules {
    /// Rules with these settings, at `now`.
    pub fn new(coalesce: Duration, defer_flush: bool, ack_defer: Duration, now: Instant) -> FlushRules {
        FlushRules {
            coalesce,
            defer_flush,
            ack_defer,
            blocked: None,
            deferred: false,
            this_turn: ThisTurn::default(),
            flush_by: None,
            last_turn: now,
        }
    }

    /// The least time between two turns' starts.
    pub fn coalesce(&self) -> Duration {
        self.coalesce
    }

    /// A turn starts at `now`.
    pub fn turn_started(&mut self, now: Instant) {
        self.last_turn = now;
    }

    /// Serving starts: nothing written yet.
    pub fn serving(&mut self) {
        self.this_turn = ThisTurn::default();
    }

    /// A connection served at `now` wrote `w`; `rtt` gives its active path's round trip
    /// (asked only of an acknowledgement-clocked one).
    pub fn wrote(&mut self, w: Wrote, now: Instant, rtt: impl FnOnce() -> Option<Duration>) {
        if w.packets == 0 {
            return;
        }
        if w.closing || !w.ack_clocked(now) {
            self.this_turn.unclocked = true;
        } else if let Some(rtt) = rtt() {
            // Its next acknowledgement is due within about half its round trip (TCP defers
            // no longer: `tcp_tso_should_defer`).
            let by = now + (rtt / 2).min(self.ack_defer);
            self.this_turn.clocked_by = Some(self.this_turn.clocked_by.map_or(by, |t| t.min(by)));
        }
    }

    /// A connection served went back to the ready queue with more to write.
    pub fn requeued(&mut self) {
        self.this_turn.more = true;
    }

    /// After serving at `now`, with `pending` bytes in the outbox: what to do with them
    /// (deferrals and holds counted in `c`).
    pub fn decide(&mut self, now: Instant, pending: usize, c: &mut HostCounters) -> Decision {
        let defer = self.defer_flush && self.this_turn.more && !self.deferred && pending > 0 && pending < DEFER_BELOW;
        self.deferred = defer;
        if defer {
            c.deferred_flushes += 1;
        }
        let hold = !defer
            && !self.ack_defer.is_zero()
            && !self.this_turn.unclocked
            && pending > 0
            && pending < ACK_DEFER_BELOW
            && self.flush_by.is_none_or(|t| now < t);
        if hold {
            if self.flush_by.is_none() {
                self.flush_by = Some(self.this_turn.clocked_by.unwrap_or(now + self.ack_defer));
                c.ack_defers += 1;
            }
        } else if let Some(t) = self.flush_by.take() {
            if now >= t {
                c.ack_defer_expired += 1;
            }
        }
        match () {
            () if defer => Decision::Defer,
            () if hold => Decision::Hold,
            () if pending == 0 || self.blocked.is_some() => Decision::Nothing,
            () => Decision::Send,
        }
    }

    /// What was kept left (the loop ends).
    pub fn flushed(&mut self) {
        self.flush_by = None;
    }

    /// Whether the loop waits before its next turn: nothing is ready, or the socket refused
    /// the last flush (it waits for writability).
    pub fn waits(&self, nothing_ready: bool) -> bool {
        nothing_ready || self.blocked.is_some()
    }

    /// Until when the loop lets datagrams gather before it waits on its socket (a sleep,
    /// never past `deadline` or `max_wait` from `now`), and whether for coalescing: with
    /// coalescing on, until `coalesce` after the last turn's start; while
    /// acknowledgement-clocked packets are held, until their time limit, so the acknowledgements
    /// that come meanwhile are read in one call and answered in one send call.
    pub fn gather(&self, now: Instant, max_wait: Duration, deadline: Option<Instant>) -> Option<(Instant, bool)> {
        if self.blocked.is_some() || (self.coalesce.is_zero() && self.flush_by.is_none()) {
            return None;
        }
        let coalesced = gather_until(self.last_turn, self.coalesce, now, max_wait, deadline);
        let clocked =
            self.flush_by.and_then(|t| gather_until(now, t.saturating_duration_since(now), now, max_wait, deadline));
        match (coalesced, clocked) {
            (Some(a), Some(b)) => Some((a.max(b), true)),
            (Some(a), None) => Some((a, true)),
            (None, b) => b.map(|b| (b, false)),
        }
    }

    /// How long the loop may wait on its socket at most, given `timeout` (held packets must
    /// leave in time; without buffers it looks again within half a millisecond), and the
    /// events it waits for (writability when the socket was full).
    pub fn wait(&self, now: Instant, mut timeout: Duration) -> (Duration, libc::c_short) {
        if let Some(t) = self.flush_by {
            timeout = timeout.min(t.saturating_duration_since(now));
        }
        let mut events = libc::POLLIN;
        match self.blocked {
            Some(Flush::WouldBlock) => events |= libc::POLLOUT,
            Some(Flush::NoBuffers) => timeout = timeout.min(Duration::from_micros(500)),
            _ => {}
        }
        (timeout, events)
    }
}

impl Wrote {
    /// Whether a connection that wrote this in its turn wrote the small freed window of an
    /// acknowledgement-clocked transfer, which may wait for the next acknowledgements' packets
    /// (`HostConfig::ack_defer`): it stopped on its own (window or data, not its quantum: `more`
    /// false), holds no packet for pacing (the pacer decides when those leave), wrote fewer than
    /// [`ACK_CLOCKED_PACKETS`], and sent within [`MID_TRANSFER`] before this turn. A response's
    /// first flight on a quiet connection is never one.
    fn ack_clocked(&self, now: Instant) -> bool {
        !self.more
            && !self.paced
            && self.packets < ACK_CLOCKED_PACKETS
            && self.prior_out.is_some_and(|t| now.saturating_duration_since(t) < MID_TRANSFER)
    }
}

/// Until when a loop that coalesces turns sleeps before waiting on its socket: `least` after
/// the last turn's start, but never past `max_wait` from `now` nor past the earliest
/// `deadline`; `None` when that time has passed (a quiet spell: serve at once).
fn gather_until(
    last_turn: Instant,
    least: Duration,
    now: Instant,
    max_wait: Duration,
    deadline: Option<Instant>,
) -> Option<Instant> {
    let mut until = (last_turn + least).min(now + max_wait);
    if let Some(d) = deadline {
        until = until.min(d);
    }
    (until > now).then_some(until)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_small_freed_window_of_a_transfer_under_way_may_wait() {
        let now = Instant::now();
        let recent = Some(now - Duration::from_micros(300));
        let w = Wrote { packets: 8, more: false, paced: false, closing: false, prior_out: recent };
        assert!(w.ack_clocked(now));
        // Its quantum (more to write), a pacing hold, a full run, a quiet connection: no.
        assert!(!Wrote { more: true, ..w }.ack_clocked(now));
        assert!(!Wrote { paced: true, ..w }.ack_clocked(now));
        assert!(!Wrote { packets: ACK_CLOCKED_PACKETS, ..w }.ack_clocked(now));
        assert!(!Wrote { prior_out: Some(now - MID_TRANSFER), ..w }.ack_clocked(now));
        assert!(!Wrote { prior_out: None, ..w }.ack_clocked(now));
    }

    #[test]
    fn gathering_never_passes_a_deadline_nor_follows_a_quiet_spell() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Work keeps coming: sleep until 1 ms after the last turn's start.
        assert_eq!(gather_until(t, ms(1), t + Duration::from_micros(200), ms(50), None), Some(t + ms(1)));
        // A deadline before that ends the sleep at the deadline.
        let d = t + Duration::from_micros(500);
        assert_eq!(gather_until(t, ms(1), t + Duration::from_micros(200), ms(50), Some(d)), Some(d));
        // A deadline already due, or a quiet spell longer than the least time: no sleep.
        assert_eq!(gather_until(t, ms(1), t + Duration::from_micros(600), ms(50), Some(d)), None);
        assert_eq!(gather_until(t, ms(1), t + ms(2), ms(50), None), None);
        // Never past the caller's own bound.
        assert_eq!(gather_until(t, ms(10), t, ms(3), None), Some(t + ms(3)));
        // Off: never.
        assert_eq!(gather_until(t, Duration::ZERO, t, ms(3), None), None);
    }

    const US: fn(u64) -> Duration = Duration::from_micros;

    /// A connection's turn, for the table below.
    #[derive(Clone, Copy)]
    enum Conn {
        /// Wrote a full quantum and has more.
        Quantum,
        /// Wrote `n` packets of a transfer under way, then stopped (window or data).
        Clocked(u64),
        /// Wrote the first flight of a quiet connection.
        FirstFlight(u64),
        /// Wrote nothing.
        Idle,
    }

    /// One turn: what the connections wrote and what the outbox then holds.
    struct Turn {
        at_us: u64,
        conns: &'static [Conn],
        pending: usize,
        want: Decision,
    }

    /// Runs `turns` through one set of rules; returns the counters.
    fn play(defer_flush: bool, ack_defer: Duration, turns: &[Turn]) -> HostCounters {
        let t0 = Instant::now();
        let mut rules = FlushRules::new(Duration::ZERO, defer_flush, ack_defer, t0);
        let mut c = HostCounters::default();
        for (i, turn) in turns.iter().enumerate() {
            let now = t0 + US(turn.at_us);
            rules.turn_started(now);
            rules.serving();
            for conn in turn.conns {
                let (packets, more, prior_out) = match *conn {
                    Conn::Quantum => (64, true, Some(now - US(100))),
                    Conn::Clocked(n) => (n, false, Some(now - US(300))),
                    Conn::FirstFlight(n) => (n, false, None),
                    Conn::Idle => (0, false, None),
                };
                let w = Wrote { packets, more, paced: false, closing: false, prior_out };
                rules.wrote(w, now, || Some(US(400)));
                if more {
                    rules.requeued();
                }
            }
            assert_eq!(rules.decide(now, turn.pending, &mut c), turn.want, "turn {i}");
        }
        c
    }

    #[test]
    fn the_flush_decision_after_each_turn() {
        use Conn::*;
        let full = DEFER_BELOW * 2;
        // Deferred flush: a small remainder of a quantum waits one turn, never two.
        let c = play(
            true,
            Duration::ZERO,
            &[
                Turn { at_us: 0, conns: &[Quantum], pending: 10_000, want: Decision::Defer },
                Turn { at_us: 10, conns: &[Quantum], pending: 20_000, want: Decision::Send },
                Turn { at_us: 20, conns: &[Quantum], pending: full, want: Decision::Send },
                Turn { at_us: 30, conns: &[Idle], pending: 0, want: Decision::Nothing },
            ],
        );
        assert_eq!(c.deferred_flushes, 1);
        // Off: every turn's packets leave.
        let c =
            play(false, Duration::ZERO, &[Turn { at_us: 0, conns: &[Quantum], pending: 10_000, want: Decision::Send }]);
        assert_eq!(c.deferred_flushes, 0);
        // Acknowledgement-clocked: the freed window waits until half the round trip (200 us
        // here, under the 500 us bound), joined by the next; past that time it leaves.
        let c = play(
            false,
            US(500),
            &[
                Turn { at_us: 0, conns: &[Clocked(4)], pending: 5_000, want: Decision::Hold },
                Turn { at_us: 100, conns: &[Clocked(4)], pending: 10_000, want: Decision::Hold },
                Turn { at_us: 250, conns: &[Clocked(4)], pending: 15_000, want: Decision::Send },
            ],
        );
        assert_eq!((c.ack_defers, c.ack_defer_expired), (1, 1));
        // A first flight, a full quantum beside it, or enough bytes: no hold.
        let c = play(
            false,
            US(500),
            &[
                Turn { at_us: 0, conns: &[FirstFlight(4)], pending: 5_000, want: Decision::Send },
                Turn { at_us: 10, conns: &[Clocked(4), Quantum], pending: 5_000, want: Decision::Send },
                Turn { at_us: 20, conns: &[Clocked(4)], pending: ACK_DEFER_BELOW, want: Decision::Send },
            ],
        );
        assert_eq!((c.ack_defers, c.ack_defer_expired), (0, 0));
    }

    #[test]
    fn a_blocked_socket_sends_nothing_and_the_loop_waits_for_writability() {
        let t0 = Instant::now();
        let mut rules = FlushRules::new(Duration::from_millis(1), false, Duration::ZERO, t0);
        let mut c = HostCounters::default();
        rules.blocked = Some(Flush::WouldBlock);
        rules.serving();
        assert_eq!(rules.decide(t0, 5_000, &mut c), Decision::Nothing);
        // It waits even with connections ready (serving them could send nothing), for
        // writability, and does not sleep to coalesce first.
        assert!(rules.waits(false));
        assert_eq!(
            rules.wait(t0, Duration::from_millis(50)),
            (Duration::from_millis(50), libc::POLLIN | libc::POLLOUT)
        );
        assert_eq!(rules.gather(t0, Duration::from_millis(50), None), None);
        // Without buffers: it looks again within half a millisecond.
        rules.blocked = Some(Flush::NoBuffers);
        assert_eq!(rules.wait(t0, Duration::from_millis(50)), (US(500), libc::POLLIN));
        rules.blocked = None;
        assert!(!rules.waits(false) && rules.waits(true));
    }
}
