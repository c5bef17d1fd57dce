//! What a serving process does between its start and its stop (`udpx h3 serve`): a
//! [`Supervisor`] decides, turn by turn, from what it is told (the signals taken, the server's
//! state, the time), and the caller does what it says. The decisions hold no socket, no signal
//! and no clock of their own, so they are tested without a process.

use std::time::{Duration, Instant};

/// How often a server with a key log on says so again.
pub const KEYLOG_WARNING_EVERY: Duration = Duration::from_secs(60);

/// How often an upgrade that could not take the metrics port yet (its predecessor holds it
/// until it exits) tries again.
pub const METRICS_RETRY_EVERY: Duration = Duration::from_secs(1);

/// The server as a turn sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Its loops run (before a drain: the process ends when they stop).
    pub running: bool,
    /// Its drain is over (during a drain: the process ends then).
    pub finished: bool,
    /// A successor took new connections over and has not died since.
    pub handed_over: bool,
}

/// The signals taken since the last turn: `stop` and `drain` stay set once taken (SIGINT,
/// SIGTERM, SIGQUIT), the others are taken once each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // reason: one flag per signal, each taken independently of the others
pub struct Taken {
    /// Stop now (SIGINT, or a second SIGTERM or SIGQUIT).
    pub stop: bool,
    /// Drain (SIGTERM or SIGQUIT).
    pub drain: bool,
    /// SIGHUP: read the files again.
    pub hup: bool,
    /// SIGUSR1: reopen the access log.
    pub usr1: bool,
    /// SIGUSR2: start the upgrade.
    pub usr2: bool,
}

/// One thing to do, in the order [`Supervisor::turn`] gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Say again that the key log is on.
    WarnKeylog,
    /// Try to take the metrics port again.
    RetryMetrics,
    /// The successor took over: the shards drain (the handover started it); say so.
    HandedOver,
    /// The successor died while this server drained: its drain was called off and it serves
    /// again; say so, and that this is the unit's main process again.
    ServesAgain,
    /// Drain on a signal: say so, tell systemd, start the drain.
    Drain,
    /// Start the upgrade (SIGUSR2).
    Upgrade,
    /// Reopen the access log (SIGUSR1).
    ReopenLog,
    /// Read the files again (SIGHUP).
    Reload,
}

/// The decisions of a serving process's loop.
#[derive(Debug, Clone)]
pub struct Supervisor {
    started: Instant,
    /// `--duration`: end after this long.
    duration: Option<Duration>,
    /// Whether it keeps trying for the metrics port (an upgrade whose predecessor holds it).
    metrics_wanted: bool,
    metrics_tried: Instant,
    keylog: bool,
    keylog_warned: Instant,
    /// Draining since (a signal's drain, or the handover's).
    drain_started: Option<Instant>,
    /// The drain is the handover's.
    handed_over: bool,
}

impl Supervisor {
    /// A server started at `now`, to serve for `duration` at most, with the metrics port
    /// taken (or none wanted) and no key log.
    pub fn new(now: Instant, duration: Option<Duration>) -> Supervisor {
        Supervisor {
            started: now,
            duration,
            metrics_wanted: false,
            metrics_tried: now,
            keylog: false,
            keylog_warned: now,
            drain_started: None,
            handed_over: false,
        }
    }

    /// `wanted`: it still has to take the metrics port (tried again every turn until
    /// [`Supervisor::metrics_taken`]).
    pub fn wanting_metrics(self, wanted: bool) -> Supervisor {
        Supervisor { metrics_wanted: wanted, ..self }
    }

    /// `keylog`: its key log is on (said again every [`KEYLOG_WARNING_EVERY`]).
    pub fn with_keylog(self, keylog: bool) -> Supervisor {
        Supervisor { keylog, ..self }
    }

    /// Whether the loop goes on at `now`, with the signals `taken`: no stop signal, within
    /// `--duration`, and the server running (while it drains: until its drain is over).
    pub fn goes_on(&self, now: Instant, taken: &Taken, seen: &Seen) -> bool {
        let alive = if self.drain_started.is_some() { !seen.finished } else { seen.running };
        !taken.stop && self.duration.is_none_or(|d| now.duration_since(self.started) < d) && alive
    }

    /// The metrics port was taken: no more tries.
    pub fn metrics_taken(&mut self) {
        self.metrics_wanted = false;
    }

    /// Draining since, if it drains.
    pub fn drain_started(&self) -> Option<Instant> {
        self.drain_started
    }

    /// The drain is the handover's (the successor took over).
    pub fn handed_over(&self) -> bool {
        self.handed_over
    }

    /// The steps of the turn at `now`, in order.
    pub fn turn(&mut self, now: Instant, seen: &Seen, taken: &Taken) -> Vec<Step> {
        let mut steps = Vec::new();
        if self.keylog && now.duration_since(self.keylog_warned) >= KEYLOG_WARNING_EVERY {
            self.keylog_warned = now;
            steps.push(Step::WarnKeylog);
        }
        if self.metrics_wanted && now.duration_since(self.metrics_tried) >= METRICS_RETRY_EVERY {
            self.metrics_tried = now;
            steps.push(Step::RetryMetrics);
        }
        if self.drain_started.is_none() && seen.handed_over {
            self.handed_over = true;
            self.drain_started = Some(now);
            steps.push(Step::HandedOver);
        }
        if self.handed_over && !seen.handed_over {
            self.handed_over = false;
            self.drain_started = None;
            steps.push(Step::ServesAgain);
        }
        if self.drain_started.is_none() && taken.drain {
            self.drain_started = Some(now);
            steps.push(Step::Drain);
        }
        if taken.usr2 {
            steps.push(Step::Upgrade);
        }
        if taken.usr1 {
            steps.push(Step::ReopenLog);
        }
        if taken.hup {
            steps.push(Step::Reload);
        }
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVING: Seen = Seen { running: true, finished: false, handed_over: false };

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// Each row: the turn's time (ms), what the server looks like, the signals; the steps the
    /// turn gives and whether the loop goes on after it.
    struct Row {
        ms: u64,
        seen: Seen,
        taken: Taken,
        steps: &'static [Step],
        goes_on: bool,
    }

    fn play(mut s: Supervisor, t0: Instant, rows: &[Row]) -> Supervisor {
        for (i, r) in rows.iter().enumerate() {
            let now = at(t0, r.ms);
            assert_eq!(s.turn(now, &r.seen, &r.taken), r.steps, "row {i}");
            assert_eq!(s.goes_on(now, &r.taken, &r.seen), r.goes_on, "row {i}");
        }
        s
    }

    #[test]
    fn a_drain_signal_drains_once_and_the_loop_ends_when_the_drain_is_over() {
        let t0 = Instant::now();
        let drain = Taken { drain: true, ..Taken::default() };
        // Draining: the loops stopped admitting (running false) but the drain is not over.
        let draining = Seen { running: false, ..SERVING };
        let over = Seen { finished: true, ..draining };
        let s = play(
            Supervisor::new(t0, None),
            t0,
            &[
                Row { ms: 50, seen: SERVING, taken: Taken::default(), steps: &[], goes_on: true },
                Row { ms: 100, seen: SERVING, taken: drain, steps: &[Step::Drain], goes_on: true },
                Row { ms: 150, seen: draining, taken: drain, steps: &[], goes_on: true },
                Row { ms: 200, seen: over, taken: drain, steps: &[], goes_on: false },
            ],
        );
        assert_eq!(s.drain_started(), Some(at(t0, 100)));
        assert!(!s.handed_over());
    }

    #[test]
    fn a_successor_that_dies_after_it_took_over_leaves_this_one_serving() {
        let t0 = Instant::now();
        let handed = Seen { handed_over: true, ..SERVING };
        let s = play(
            Supervisor::new(t0, None),
            t0,
            &[
                Row { ms: 50, seen: handed, taken: Taken::default(), steps: &[Step::HandedOver], goes_on: true },
                Row { ms: 100, seen: handed, taken: Taken::default(), steps: &[], goes_on: true },
                // The drain was called off: the server serves again, and a later drain
                // signal drains it.
                Row { ms: 150, seen: SERVING, taken: Taken::default(), steps: &[Step::ServesAgain], goes_on: true },
                Row {
                    ms: 200,
                    seen: SERVING,
                    taken: Taken { drain: true, ..Taken::default() },
                    steps: &[Step::Drain],
                    goes_on: true,
                },
            ],
        );
        assert!(!s.handed_over());
        assert_eq!(s.drain_started(), Some(at(t0, 200)));
    }

    #[test]
    fn a_drain_signal_during_the_handovers_drain_does_not_drain_again() {
        let t0 = Instant::now();
        let handed = Seen { handed_over: true, ..SERVING };
        play(
            Supervisor::new(t0, None),
            t0,
            &[
                Row { ms: 50, seen: handed, taken: Taken::default(), steps: &[Step::HandedOver], goes_on: true },
                Row {
                    ms: 100,
                    seen: handed,
                    taken: Taken { drain: true, ..Taken::default() },
                    steps: &[],
                    goes_on: true,
                },
            ],
        );
    }

    #[test]
    fn stop_and_duration_end_the_loop() {
        let t0 = Instant::now();
        let s = Supervisor::new(t0, Some(Duration::from_secs(1)));
        let (none, stop) = (Taken::default(), Taken { stop: true, ..Taken::default() });
        assert!(s.goes_on(at(t0, 999), &none, &SERVING));
        assert!(!s.goes_on(at(t0, 1000), &none, &SERVING));
        assert!(!s.goes_on(at(t0, 10), &stop, &SERVING));
        // A server whose loops stopped on their own ends the process.
        assert!(!s.goes_on(at(t0, 10), &none, &Seen { running: false, ..SERVING }));
    }

    #[test]
    fn signals_taken_once_give_their_steps_in_order() {
        let t0 = Instant::now();
        let all = Taken { hup: true, usr1: true, usr2: true, ..Taken::default() };
        play(
            Supervisor::new(t0, None),
            t0,
            &[
                Row {
                    ms: 50,
                    seen: SERVING,
                    taken: all,
                    steps: &[Step::Upgrade, Step::ReopenLog, Step::Reload],
                    goes_on: true,
                },
                Row { ms: 100, seen: SERVING, taken: Taken::default(), steps: &[], goes_on: true },
            ],
        );
    }

    #[test]
    fn the_key_log_warning_and_the_metrics_retry_keep_their_pace() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(t0, None).wanting_metrics(true).with_keylog(true);
        let none = Taken::default();
        assert_eq!(s.turn(at(t0, 999), &SERVING, &none), []);
        assert_eq!(s.turn(at(t0, 1000), &SERVING, &none), [Step::RetryMetrics]);
        assert_eq!(s.turn(at(t0, 1500), &SERVING, &none), []);
        s.metrics_taken();
        assert_eq!(s.turn(at(t0, 2500), &SERVING, &none), []);
        assert_eq!(s.turn(at(t0, 60_000), &SERVING, &none), [Step::WarnKeylog]);
        assert_eq!(s.turn(at(t0, 61_000), &SERVING, &none), []);
        assert_eq!(s.turn(at(t0, 120_000), &SERVING, &none), [Step::WarnKeylog]);
        // Without a key log, no warning.
        let mut quiet = Supervisor::new(t0, None);
        assert_eq!(quiet.turn(at(t0, 120_000), &SERVING, &none), []);
    }
}
