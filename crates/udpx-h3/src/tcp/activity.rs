//! Each connection's activity, and the listener's registry of them that the accept loop
//! evicts the connection idle longest from at the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One connection's activity: shared by its task, its responses, and the registry the accept
/// loop evicts from at the cap.
pub(super) struct Activity {
    pub(super) epoch: Instant,
    /// Bodies under way.
    pub(super) bodies: AtomicUsize,
    /// Requests so far.
    pub(super) requests: AtomicU64,
    /// When it last began a request or ended a body (ms since `epoch`).
    pub(super) last: AtomicU64,
    /// Whether its TLS handshake is done (before, it is new, not idle).
    pub(super) ready: AtomicBool,
    /// Whether it was told to go (it is then not chosen again).
    pub(super) evicted: AtomicBool,
    /// Told to close: idle at the cap.
    pub(super) evict: tokio::sync::Notify,
    /// `h2` or `http/1.1`, once known (its close line's).
    pub(super) protocol: std::sync::OnceLock<&'static str>,
    /// The server began its close (a drain, an eviction, the idle or slow-reader rule, a
    /// handshake or PING timeout); else the client ended it (its close line's `closed_by`).
    pub(super) server_closed: AtomicBool,
}

impl Activity {
    pub(super) fn new(epoch: Instant) -> Activity {
        Activity {
            epoch,
            bodies: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            last: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
            protocol: std::sync::OnceLock::new(),
            server_closed: AtomicBool::new(false),
        }
    }

    /// The server begins the close.
    pub(super) fn server_closes(&self) {
        self.server_closed.store(true, Ordering::Relaxed);
    }

    pub(super) fn touch(&self) {
        self.last.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// The listener's open connections, for eviction.
pub(super) struct Registry {
    pub(super) epoch: Instant,
    pub(super) conns: Mutex<(u64, HashMap<u64, Arc<Activity>>)>,
}

impl Registry {
    pub(super) fn new() -> Registry {
        Registry { epoch: Instant::now(), conns: Mutex::new((0, HashMap::new())) }
    }

    pub(super) fn add(&self, a: Arc<Activity>) -> u64 {
        let mut g = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        let id = g.0;
        g.1.insert(id, a);
        id
    }

    pub(super) fn remove(&self, id: u64) {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).1.remove(&id);
    }

    /// The connection idle longest (past its handshake, no body under way, the oldest last
    /// activity), marked as told to go.
    pub(super) fn oldest_idle(&self) -> Option<Arc<Activity>> {
        let g = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        g.1.values()
            .filter(|a| {
                a.ready.load(Ordering::Acquire)
                    && a.bodies.load(Ordering::Relaxed) == 0
                    && !a.evicted.load(Ordering::Relaxed)
            })
            .min_by_key(|a| a.last.load(Ordering::Relaxed))
            .inspect(|a| a.evicted.store(true, Ordering::Relaxed))
            .cloned()
    }
}
