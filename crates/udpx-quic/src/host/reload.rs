//! Reload without restart: a new quiche configuration (a renewed certificate and key) offered
//! to a running host, taken at its next turn. Connections made from then on use it; those
//! already open keep the TLS state they were made with. The session ticket key of the period
//! is set on the new configuration at once, so resumption carries on across the change.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::{App, Host};

/// One host's slot for its next configuration (see the module docs).
#[derive(Default)]
pub struct ConfigSwap {
    pending: AtomicBool,
    next: Mutex<Option<quiche::Config>>,
}

impl std::fmt::Debug for ConfigSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSwap").field("pending", &self.pending.load(Ordering::Relaxed)).finish()
    }
}

impl ConfigSwap {
    /// Offers `config` (replacing one offered before and not yet taken).
    pub fn offer(&self, config: quiche::Config) {
        *self.next.lock().unwrap_or_else(|e| e.into_inner()) = Some(config);
        self.pending.store(true, Ordering::Release);
    }

    /// The configuration offered since the last call, if any (one atomic load when none).
    fn take(&self) -> Option<quiche::Config> {
        if !self.pending.swap(false, Ordering::Acquire) {
            return None;
        }
        self.next.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl<A: App> Host<A> {
    /// Makes [`Host::run`] take the configurations offered to `swap` (a server gives each shard
    /// its own).
    pub fn set_config_swap(&mut self, swap: std::sync::Arc<ConfigSwap>) {
        self.life.swap = Some(swap);
    }

    /// Replaces the configuration new connections are made with (see the module docs).
    pub fn replace_config(&mut self, mut config: quiche::Config) {
        crate::keylog::KeyLog::prepare(self.gate.keylog.as_ref(), &mut config);
        self.config = config;
        // The ticket key of the period in force goes onto the new configuration now.
        self.gate.ticket_period = None;
        self.rotate_ticket_key(std::time::SystemTime::now());
        self.counters.config_reloads += 1;
    }

    /// Once per turn while running: takes an offered configuration.
    pub(super) fn reload_step(&mut self) {
        if let Some(c) = self.life.swap.as_ref().and_then(|s| s.take()) {
            self.replace_config(c);
        }
    }
}
