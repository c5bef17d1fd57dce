//! The graceful stop: a server that drains admits no new connection (a new Initial is refused
//! with CONNECTION_REFUSED, counted in `refused_draining`), gives every connection a turn at
//! once so its application can tell the peer ([`App::drain`]: HTTP/3 sends GOAWAY) and lets each
//! finish what is under way and close on its own (`drained`). At the deadline the rest are
//! closed ([`App::drain_deadline`], counted in `drain_closed`), their CONNECTION_CLOSE sent, and
//! the loop ends; it ends sooner once no connection is left.
//!
//! One [`DrainSignal`] is shared by a server's shards ([`crate::Server::drain`]); each shard's
//! loop looks at it once per turn. The shards end together: a shard with nothing left waits for
//! the others, so that a drain can be called off ([`DrainSignal::cancel`]) until the last one is
//! done, and the whole server then serves on. (An upgrade's successor that dies while its
//! predecessor drains: see [`crate::upgrade`].)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{App, Host};

/// Tells a server's loops to drain, with how long they may take.
#[derive(Debug)]
pub struct DrainSignal {
    started: AtomicBool,
    /// Set once every loop is done: from then on the drain can no longer be called off.
    ended: AtomicBool,
    timeout_ms: AtomicU64,
    grace_ms: AtomicU64,
    shared: Mutex<Shared>,
}

/// What changes under the lock: who listens, and how many loops are done.
#[derive(Default)]
struct Shared {
    hooks: Vec<Hook>,
    /// Loops that drained and wait for the others.
    done: usize,
    /// Loops in all.
    loops: usize,
}

/// What a drain hook hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainEvent {
    /// The drain started, to end within `timeout`; `handover`: a successor took over (it
    /// accepts from the same listening sockets, so they must stay open).
    Started { timeout: Duration, handover: bool },
    /// The drain was called off ([`DrainSignal::cancel`]): serve on as before.
    Cancelled,
}

/// A listener beside the QUIC port: told of every start and cancel, on the thread that makes
/// it, under the signal's lock (it should only signal, never call the signal back).
pub type Hook = Box<dyn Fn(DrainEvent) + Send>;

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shared(hooks {}, done {} of {})", self.hooks.len(), self.done, self.loops)
    }
}

impl Default for DrainSignal {
    /// For one loop.
    fn default() -> DrainSignal {
        DrainSignal::new(1)
    }
}

impl DrainSignal {
    /// A signal for `loops` loops (a server's shards).
    pub fn new(loops: usize) -> DrainSignal {
        DrainSignal {
            started: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            timeout_ms: AtomicU64::new(0),
            grace_ms: AtomicU64::new(0),
            shared: Mutex::new(Shared { loops: loops.max(1), ..Shared::default() }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the drain (once: a later call changes nothing), to end within `timeout`.
    pub fn start(&self, timeout: Duration) {
        self.start_with(timeout, Duration::ZERO);
    }

    fn start_with(&self, timeout: Duration, grace: Duration) {
        let shared = self.lock();
        if self.started.load(Ordering::Acquire) || self.ended.load(Ordering::Acquire) {
            return;
        }
        self.timeout_ms.store(timeout.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
        self.grace_ms.store(grace.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
        self.started.store(true, Ordering::Release);
        let event = DrainEvent::Started { timeout, handover: !grace.is_zero() };
        for h in &shared.hooks {
            h(event);
        }
    }

    /// Tells `hook` of every start and cancel of the drain (of a start at once if it has
    /// started): how a listener beside the QUIC port (HTTPS over TCP) drains with it, a
    /// handover's drain included, and serves on when a drain is called off.
    pub fn on_change(&self, hook: Hook) {
        let mut shared = self.lock();
        if let Some(timeout) = self.started() {
            hook(DrainEvent::Started { timeout, handover: self.handed_over() });
        }
        shared.hooks.push(hook);
    }

    /// Starts the drain of a process that handed its port to an upgrade ([`crate::upgrade`]):
    /// for `grace` it still admits the Initials that reach it (the steering sends it only
    /// those of handshakes it began: a retransmission, a Retry's answer), then it drains as
    /// [`DrainSignal::start`] does; a loop with no connection left waits for the grace to end.
    pub fn hand_over(&self, timeout: Duration, grace: Duration) {
        self.start_with(timeout, grace.max(Duration::from_millis(1)));
    }

    /// Calls the drain off, if every loop is still running: they undo their drain at their next
    /// turn (admit new connections again; those already told to go still go), and the hooks
    /// hear [`DrainEvent::Cancelled`]. Whether the server serves on (false: its loops have ended
    /// or are ending; nothing changed). Not draining: true.
    pub fn cancel(&self) -> bool {
        let mut shared = self.lock();
        if self.ended.load(Ordering::Acquire) {
            return false;
        }
        if !self.started.load(Ordering::Acquire) {
            return true;
        }
        self.started.store(false, Ordering::Release);
        self.grace_ms.store(0, Ordering::Relaxed);
        shared.done = 0;
        for h in &shared.hooks {
            h(DrainEvent::Cancelled);
        }
        true
    }

    /// Whether the drain was a handover (its admission grace is not zero).
    pub fn handed_over(&self) -> bool {
        self.grace_ms.load(Ordering::Relaxed) > 0
    }

    /// Whether it started (and was not called off), and its timeout.
    pub fn started(&self) -> Option<Duration> {
        self.started.load(Ordering::Acquire).then(|| Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed)))
    }

    /// A loop is done draining (once per drain): whether every loop is, so that all end now
    /// (false while a drain was called off, or others are still at it).
    fn done(&self) -> bool {
        let mut shared = self.lock();
        if !self.started.load(Ordering::Acquire) {
            return false;
        }
        shared.done += 1;
        if shared.done >= shared.loops {
            self.ended.store(true, Ordering::Release);
        }
        self.ended.load(Ordering::Acquire)
    }

    /// Whether every loop is done: the drain can no longer be called off.
    fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
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

/// A host's lifecycle: its part in the graceful stop, and where reloaded configurations come.
#[derive(Debug)]
pub(super) struct Lifecycle {
    pub(super) draining: Draining,
    /// A server's shared drain signal, looked at once per turn while running.
    pub(super) signal: Option<Arc<DrainSignal>>,
    /// Whether this drain came from the signal (only such a drain can be called off).
    by_signal: bool,
    /// Whether this loop told the signal it is done.
    told_done: bool,
    /// While draining after a handover: new connections are still admitted until then.
    admit_until: Option<Instant>,
    /// Where a reloaded configuration is offered, looked at once per turn while running.
    pub(super) swap: Option<Arc<super::ConfigSwap>>,
}

impl Lifecycle {
    pub(super) fn new() -> Lifecycle {
        Lifecycle {
            draining: Draining::No,
            signal: None,
            by_signal: false,
            told_done: false,
            admit_until: None,
            swap: None,
        }
    }
}

impl<A: App> Host<A> {
    /// Starts draining now, to end by `deadline` (see the module docs). A client host ignores
    /// it.
    pub fn drain(&mut self, deadline: Instant) {
        self.start_drain(Instant::now(), deadline);
    }

    /// [`Host::drain`] at `now`.
    fn start_drain(&mut self, now: Instant, deadline: Instant) {
        if !self.role.accepts() || self.life.draining != Draining::No {
            return;
        }
        self.life.draining = Draining::Until(deadline);
        log::debug!("udpx-quic: draining {} connections", self.connection_count());
        // A handover's drain spreads its GOAWAYs over the admission grace.
        let spread = self.life.admit_until.map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        self.app.drain(spread);
        let slots: Vec<_> = self.table.iter_mut().map(|(s, _)| s).collect();
        for s in slots {
            self.ready.push(s);
        }
    }

    /// Whether the host is draining (or drained).
    pub fn is_draining(&self) -> bool {
        self.life.draining != Draining::No
    }

    /// Whether a draining host still admits new connections at `now` (the grace of a
    /// handover, [`DrainSignal::hand_over`]).
    pub(super) fn admitting(&self, now: Instant) -> bool {
        self.life.admit_until.is_some_and(|t| now < t)
    }

    /// Once per turn while running: starts the drain when the shared signal says so (and undoes
    /// it when the signal calls it off), closes what is left at the deadline; whether the loop
    /// is done (drained, or closed and sent, and every loop of the signal with it).
    pub(super) fn drain_step(&mut self, now: Instant) -> bool {
        // Read once per turn, without cloning the Arc on the hot path: (started, grace, ended).
        let seen = self
            .life
            .signal
            .as_deref()
            .map(|s| (s.started(), Duration::from_millis(s.grace_ms.load(Ordering::Relaxed)), s.ended()));
        if let Some((started, grace, ended)) = seen {
            match (self.life.draining, started) {
                (Draining::No, Some(timeout)) => {
                    self.life.admit_until = (!grace.is_zero()).then(|| now + grace.min(timeout));
                    self.start_drain(now, now + timeout);
                    self.life.by_signal = true;
                }
                (Draining::Until(_) | Draining::Closed, None) if self.life.by_signal && !ended => {
                    self.undrain();
                    return false;
                }
                _ => {}
            }
        }
        let done = match self.life.draining {
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
                self.life.draining = Draining::Closed;
                false
            }
            Draining::Until(_) => false,
        };
        match self.life.signal.as_deref().filter(|_| self.life.by_signal) {
            // The loops end together, once each is done.
            Some(signal) if done => {
                if !self.life.told_done {
                    self.life.told_done = true;
                    return signal.done();
                }
                signal.ended()
            }
            _ => done,
        }
    }

    /// The drain called off: admitting again; the connections already told to go still go.
    fn undrain(&mut self) {
        log::info!("udpx-quic: drain called off: serving again");
        self.life.draining = Draining::No;
        self.life.by_signal = false;
        self.life.told_done = false;
        self.life.admit_until = None;
        self.app.undrain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drain can be called off until its last loop is done, and the hooks hear each change;
    /// once every loop is done it can no longer be (the loops are ending).
    #[test]
    fn a_drain_is_called_off_only_while_a_loop_still_drains() {
        let s = DrainSignal::new(2);
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        s.on_change(Box::new(move |e| h.lock().unwrap().push(e)));
        let t = Duration::from_secs(5);
        s.hand_over(t, Duration::from_secs(3));
        assert!(s.handed_over() && s.started() == Some(t));
        assert!(!s.done(), "one of two loops done: the other still drains");
        assert!(s.cancel(), "called off while a loop still drains");
        assert_eq!(s.started(), None);
        assert!(!s.done(), "not draining: no loop ends");
        s.start(t);
        assert!(!s.handed_over(), "a plain drain after the cancel");
        assert!(!s.done() && s.done(), "both loops done: they end");
        assert!(!s.cancel(), "too late");
        s.start(t); // a later start changes nothing
        assert_eq!(
            *heard.lock().unwrap(),
            [
                DrainEvent::Started { timeout: t, handover: true },
                DrainEvent::Cancelled,
                DrainEvent::Started { timeout: t, handover: false },
            ]
        );
    }
}
