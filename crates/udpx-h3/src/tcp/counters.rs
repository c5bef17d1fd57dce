//! The TCP listener's connection counters (its responses are counted by the [`Site`]).
//!
//! [`Site`]: crate::http::Site

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

/// Connection counters of the TCP listener (responses are counted by the [`Site`]).
#[derive(Debug, Default)]
pub(super) struct TcpCounters {
    pub(super) connections: AtomicU64,
    pub(super) tls_failed: AtomicU64,
    pub(super) http2: AtomicU64,
    pub(super) per_source_refused: AtomicU64,
    pub(super) too_slow: AtomicU64,
    pub(super) idle_closed: AtomicU64,
    pub(super) accept_errors: AtomicU64,
    pub(super) open: AtomicU64,
    pub(super) drain_closed: AtomicU64,
    pub(super) evicted: AtomicU64,
    pub(super) full_refused: AtomicU64,
    pub(super) lingering: AtomicU64,
    pub(super) accepting: AtomicBool,
}

/// A snapshot of the TCP listener's connection counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TcpSnapshot {
    /// Connections accepted.
    pub connections: u64,
    /// Connections whose TLS handshake failed or timed out (garbage, a client that refused
    /// the certificate).
    pub tls_failed: u64,
    /// Connections that chose HTTP/2 by ALPN.
    pub http2: u64,
    /// Connections closed at once: their address had its share already.
    pub per_source_refused: u64,
    /// Connections closed for taking a response too slowly (the minimum rate).
    pub too_slow: u64,
    /// Connections closed after `idle` with no request and no response under way.
    pub idle_closed: u64,
    /// Accepts that failed (out of descriptors or memory); accepting paused, never ended.
    pub accept_errors: u64,
    /// Connections open now (a gauge).
    pub open: u64,
    /// Connections still open at a drain's deadline, closed then.
    pub drain_closed: u64,
    /// Idle connections closed at the cap to make room for a new one.
    pub evicted: u64,
    /// Connections closed at the cap with no idle one to make room (every one busy).
    pub full_refused: u64,
    /// Closed connections reading their client's last bytes now (a gauge; see `linger`).
    pub lingering: u64,
}

/// The listener's counters, readable from another thread (a metrics endpoint).
#[derive(Debug, Clone)]
pub struct TcpProbe(pub(super) Arc<TcpCounters>);

impl TcpProbe {
    /// The counters now.
    pub fn snapshot(&self) -> TcpSnapshot {
        snapshot(&self.0)
    }
}

pub(super) fn snapshot(c: &TcpCounters) -> TcpSnapshot {
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    TcpSnapshot {
        connections: g(&c.connections),
        tls_failed: g(&c.tls_failed),
        http2: g(&c.http2),
        per_source_refused: g(&c.per_source_refused),
        too_slow: g(&c.too_slow),
        idle_closed: g(&c.idle_closed),
        accept_errors: g(&c.accept_errors),
        open: g(&c.open),
        drain_closed: g(&c.drain_closed),
        evicted: g(&c.evicted),
        full_refused: g(&c.full_refused),
        lingering: g(&c.lingering),
    }
}
