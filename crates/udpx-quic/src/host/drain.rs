//! The graceful stop: a server that drains admits no new connection (a new Initial is refused
//! with CONNECTION_REFUSED, counted in `refused_draining`), gives every connection a turn at
//! once so its application can tell the peer ([`App::drain`]: HTTP/3 sends GOAWAY) and lets each
//! finish what is under way and close on its own (`drained`). At the deadline the rest are
//! closed ([`App::drain_deadline`], counted in `drain_closed`), their CONNECTION_CLOSE sent, and
//! the loop ends; it ends sooner once no connection is left.
//!
//! One [`DrainSignal`] is shared by a server's shards ([`crate::Server::drain`]); each shard's
//! loop looks at it once per turn.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{App, Host};

/// Tells a server's loops to drain, with how long they may take.
#[derive(Debug, Default)]
pub struct DrainSignal {
    started: AtomicBool,
    timeout_ms: AtomicU64,
    grace_ms: AtomicU64,
    hooks: Hooks,
}

/// What runs when a drain starts (listeners beside the QUIC port: [`DrainSignal::on_start`]).
#[derive(Default)]
struct Hooks(Mutex<Vec<Hook>>);

/// One of them: it is given the drain's timeout.
type Hook = Box<dyn FnOnce(Duration) + Send>;

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map(|v| v.len()).unwrap_or(0);
        write!(f, "Hooks({n})")
    }
}

impl DrainSignal {
    /// Starts the drain (once: a later call changes nothing), to end within `timeout`.
    pub fn start(&self, timeout: Duration) {
        let hooks = {
            let mut hooks = self.hooks.0.lock().unwrap_or_else(|e| e.into_inner());
            if self.started.load(Ordering::Acquire) {
                return;
            }
            self.timeout_ms.store(timeout.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
            self.started.store(true, Ordering::Release);
            std::mem::take(&mut *hooks)
        };
        for h in hooks {
            h(timeout);
        }
    }

    /// Runs `hook` with the drain's timeout when the drain starts (at once if it has): how a
    /// listener beside the QUIC port (HTTPS over TCP) drains with it, a handover's drain
    /// included. The hook runs on the thread that starts the drain: it should only signal.
    pub fn on_start(&self, hook: Hook) {
        let mut hooks = self.hooks.0.lock().unwrap_or_else(|e| e.into_inner());
        match self.started() {
            Some(timeout) => {
                drop(hooks);
                hook(timeout);
            }
            None => hooks.push(hook),
        }
    }

    /// Starts the drain of a process that handed its port to an upgrade ([`crate::upgrade`]):
    /// for `grace` it still admits the Initials that reach it (the steering sends it only
    /// those of handshakes it began: a retransmission, a Retry's answer), then it drains as
    /// [`DrainSignal::start`] does; a loop with no connection left waits for the grace to end.
    pub fn hand_over(&self, timeout: Duration, grace: Duration) {
        if !self.started.load(Ordering::Acquire) {
            self.grace_ms.store(grace.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
            self.start(timeout);
        }
    }

    /// Whether the drain was a handover (its admission grace is not zero).
    pub fn handed_over(&self) -> bool {
        self.grace_ms.load(Ordering::Relaxed) > 0
    }

    /// Whether it started, and its timeout.
    pub fn started(&self) -> Option<Duration> {
        self.started.load(Ordering::Acquire).then(|| Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed)))
    }
}

/// Where a host is in its drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Draining {
    /// Serving as usual.
    No,
    /// Draining until the deadline.
    Until(Instant),
    /// Past the deadline: the rest were closed; the loop ends after one more turn sends their
    /// CONNECTION_CLOSE.
    Closed,
}

impl<A: App> Host<A> {
    /// Starts draining now, to end by `deadline` (see the module docs). A client host ignores
    /// it.
    pub fn drain(&mut self, deadline: Instant) {
        if !self.accepting || self.draining != Draining::No {
            return;
        }
        self.draining = Draining::Until(deadline);
        log::debug!("udpx-quic: draining {} connections", self.connection_count());
        // A handover's drain spreads its GOAWAYs over the admission grace.
        let spread = self.admit_until.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()));
        self.app.drain(spread);
        let slots: Vec<_> = self.table.iter_mut().map(|(s, _)| s).collect();
        for s in slots {
            self.ready.push(s);
        }
    }

    /// Whether the host is draining (or drained).
    pub fn is_draining(&self) -> bool {
        self.draining != Draining::No
    }

    /// Whether a draining host still admits new connections at `now` (the grace of a
    /// handover, [`DrainSignal::hand_over`]).
    pub(super) fn admitting(&self, now: Instant) -> bool {
        self.admit_until.is_some_and(|t| now < t)
    }

    /// Once per turn while running: starts the drain when the shared signal says so, closes
    /// what is left at the deadline; whether the loop is done (drained, or closed and sent).
    pub(super) fn drain_step(&mut self, now: Instant) -> bool {
        if self.draining == Draining::No {
            if let Some(signal) = self.drain_signal.clone() {
                if let Some(timeout) = signal.started() {
                    let grace = Duration::from_millis(signal.grace_ms.load(Ordering::Relaxed));
                    self.admit_until = (!grace.is_zero()).then(|| now + grace.min(timeout));
                    self.drain(now + timeout);
                }
            }
        }
        match self.draining {
            Draining::No => false,
            Draining::Closed => true,
            Draining::Until(_) if self.connection_count() == 0 && !self.admitting(now) => true,
            Draining::Until(deadline) if now >= deadline => {
                let slots: Vec<_> = self.table.iter_mut().map(|(s, _)| s).collect();
                for s in slots {
                    let Some(e) = self.table.get_mut(s) else { continue };
                    if !e.conn.is_closed() && !e.conn.is_draining() {
                        self.counters.drain_closed += 1;
                        self.app.drain_deadline(&mut e.conn, &mut e.state);
                    }
                    self.ready.push(s);
                }
                log::debug!("udpx-quic: drain deadline: closed {} connections", self.counters.drain_closed);
                self.draining = Draining::Closed;
                false
            }
            Draining::Until(_) => false,
        }
    }
}
