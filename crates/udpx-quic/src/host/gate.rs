//! Admission and the stateless replies: what a host does with a packet that no connection of
//! its own has taken. This is the attack surface, in one file to audit: every packet here may
//! be forged, so each answer is smaller than what it answers, rate-limited, or sent only
//! after the address is proven (RFC 9000 8.1).
//!
//! - A new connection from a client Initial: at least 1,200 bytes, a supported version (else
//!   Version Negotiation, rate-limited), a DCID of at least 8 bytes, a valid Retry token or
//!   none, then the caps ([`crate::admission`]) decide: accept, Retry, or refuse (counted).
//! - Retry: a fresh ID of this shard and a token bound to the address and that ID
//!   ([`crate::token`]); no state is kept.
//! - Stateless resets for short-header packets to unknown IDs of this shard and host (or of a
//!   removed host), with the service's shared key, rate-limited ([`crate::reset`]).
//! - Connection IDs offered to established connections, and the session ticket key of the
//!   period in force.
//! - A new connection's key log and qlog writers ([`crate::keylog`], [`crate::qlog`]), set
//!   before its first packet is processed.

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use crate::admission::{Admission, Admit, Answer, Answers, Cap, Limits};
use crate::cid::{CidGenerator, CID_LEN};
use crate::reset::{LiveGenerations, RemovedHosts};
use crate::table::{CidKey, Slot};
use crate::token::{ServiceKeys, TokenError, TokenKey};

use super::{App, Host};

/// New connection IDs offered to one connection in one turn, at most.
const MAX_ISSUED_PER_TURN: usize = 8;

/// What a host keeps to admit connections and answer packets no connection takes.
pub(super) struct Gate {
    /// Makes this host's and shard's connection IDs.
    pub cids: CidGenerator,
    pub keys: ServiceKeys,
    pub token_key: TokenKey,
    /// The session ticket key's period in force (server).
    pub ticket_period: Option<u64>,
    /// Stateless answers per second, a budget for each kind.
    pub answers: Answers,
    pub admission: Admission,
    /// The shards of its group, for [`crate::reset::may_reset`].
    pub shards: usize,
    /// Hosts whose IDs it resets besides its own.
    pub removed_hosts: RemovedHosts,
    /// The generations of an upgrade that still serve: their IDs are never reset here.
    pub generations: LiveGenerations,
}

impl Gate {
    /// For worker `worker` of generation `generation` (of `shards`) of host `host_id`, with
    /// the service's keys (`None`: its own), its limits, the hosts removed from it and the
    /// generations that serve beside it.
    pub fn new(
        host_id: u16,
        (generation, worker): (u8, u8),
        shards: usize,
        keys: Option<ServiceKeys>,
        limits: Limits,
        (removed_hosts, generations): (RemovedHosts, LiveGenerations),
    ) -> Gate {
        let keys = keys.unwrap_or_else(ServiceKeys::random);
        Gate {
            cids: CidGenerator::with_generation(host_id, generation, worker),
            token_key: keys.token_key(),
            keys,
            ticket_period: None,
            answers: Answers::new(limits.answers_per_sec),
            admission: Admission::new(limits),
            shards: shards.max(1),
            removed_hosts,
            generations,
        }
    }
}

impl<A: App> Host<A> {
    /// A connection for an Initial to an unknown DCID, or `None` (counted) when it cannot
    /// or must not start one: not an Initial, another version, too small, a bad token, a cap,
    /// or a Retry sent instead.
    pub(super) fn new_connection(
        &mut self,
        from: SocketAddr,
        local: SocketAddr,
        hdr: &quiche::Header<'_>,
        len: usize,
    ) -> Option<Slot> {
        if !self.accepting || hdr.ty != quiche::Type::Initial {
            self.counters.dropped_unknown_cid += 1;
            if self.accepting && hdr.ty == quiche::Type::Short {
                self.stateless_reset(from, &hdr.dcid, len);
            }
            return None;
        }
        if len < quiche::MIN_CLIENT_INITIAL_LEN {
            // RFC 9000 14.1: a client's first datagram is at least 1,200 bytes; a smaller one
            // gets nothing, not even Version Negotiation (which would be an amplifier).
            self.counters.dropped_bad_initial += 1;
            return None;
        }
        if !quiche::version_is_supported(hdr.version) {
            if !self.gate.answers.allow(Answer::VersionNegotiation, Instant::now()) {
                self.counters.answers_limited += 1;
                return None;
            }
            let mut out = [0u8; 1350];
            if let Ok(n) = quiche::negotiate_version(&hdr.scid, &hdr.dcid, &mut out) {
                self.send_now(from, &out[..n], "version negotiation");
                self.counters.version_negotiations += 1;
            }
            return None;
        }
        if hdr.dcid.len() < 8 {
            self.counters.dropped_bad_initial += 1;
            return None;
        }
        if self.is_draining() {
            if !self.admitting(Instant::now()) {
                self.counters.refused_draining += 1;
                self.refuse(from, hdr, b"shutting down");
                return None;
            }
            self.counters.handover_admitted += 1;
        }
        let now = SystemTime::now();
        let odcid = match hdr.token.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => match self.gate.token_key.open(from, t, &hdr.dcid, now) {
                Ok(odcid) => Some(odcid),
                Err(TokenError::Expired) => {
                    self.counters.tokens_expired += 1;
                    return None;
                }
                Err(TokenError::Invalid) => {
                    // A NEW_TOKEN token (quiche never sends one) or a forgery: ours are Retry
                    // tokens only.
                    self.counters.tokens_invalid += 1;
                    return None;
                }
            },
        };
        match self.gate.admission.check(from.ip(), odcid.is_some()) {
            Admit::Refuse(cap) => {
                let reason: &[u8] = match cap {
                    Cap::Connections => {
                        self.counters.refused_connections += 1;
                        b"connection cap"
                    }
                    Cap::HalfOpen => {
                        self.counters.refused_half_open += 1;
                        b"handshake cap"
                    }
                    Cap::PerIp => {
                        self.counters.refused_per_ip += 1;
                        b"per-address cap"
                    }
                };
                self.refuse(from, hdr, reason);
                return None;
            }
            Admit::Retry => {
                self.retry(from, hdr, now);
                return None;
            }
            Admit::Accept => {}
        }
        let Some(scid) = self.table.fresh_cid(&mut self.gate.cids) else {
            self.counters.accept_errors += 1;
            return None;
        };
        if let Some(k) = &self.gate.keys.reset {
            self.config.set_stateless_reset_token(Some(k.token(&scid)));
        }
        let scid_ref = quiche::ConnectionId::from_ref(&scid);
        let conn = match &odcid {
            Some(o) => {
                let o = quiche::ConnectionId::from_ref(o);
                let cids = quiche::RetryConnectionIds { original_destination_cid: &o, retry_source_cid: &hdr.dcid };
                quiche::accept_with_retry(&scid_ref, cids, local, from, &mut self.config)
            }
            None => quiche::accept_with_buf_factory(&scid_ref, None, local, from, &mut self.config),
        };
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                self.counters.accept_errors += 1;
                log::debug!("udpx-quic: accept from {from} failed: {e}");
                return None;
            }
        };
        if odcid.is_some() {
            self.counters.validated_by_retry += 1;
        }
        // Before its first packet is processed: the handshake's secrets come with it.
        if let Some(k) = &self.keylog {
            conn.set_keylog(k.writer());
        }
        #[cfg(feature = "qlog")]
        if let Some(w) = self.qlog.as_ref().and_then(|q| q.writer_for(from, &scid, now)) {
            conn.set_qlog(w, "udpx".into(), format!("server connection from {from}"));
        }
        let state = self.app.accepted(&conn);
        let deadline = Instant::now() + self.gate.admission.handshake_timeout();
        self.gate.admission.opened(from.ip());
        // Both IDs lead to it: ours, and the one the client chose (or our Retry's), which its
        // retransmitted Initials still carry.
        Some(self.table.insert(
            conn,
            state,
            &[CidKey::new(&scid), CidKey::new(&hdr.dcid)],
            from.ip(),
            local,
            Some(deadline),
        ))
    }

    /// Tells the client of a refused Initial so (RFC 9000 5.2.2: a server Initial closing with
    /// CONNECTION_REFUSED, [`crate::initial::refusal`]) while the answers budget allows: it is
    /// unauthenticated, and the address may be forged. Else only counted.
    fn refuse(&mut self, to: SocketAddr, hdr: &quiche::Header<'_>, reason: &[u8]) {
        if hdr.version != crate::initial::VERSION_1 {
            return; // its keys would be another version's
        }
        if !self.gate.answers.allow(Answer::Refusal, Instant::now()) {
            self.counters.answers_limited += 1;
            return;
        }
        let mut scid = [0u8; CID_LEN];
        if crate::cid::random_bytes(&mut scid).is_err() {
            return;
        }
        let packet = crate::initial::refusal(&hdr.dcid, &hdr.scid, &scid, reason);
        self.send_now(to, &packet, "refusal");
        self.counters.refusals_sent += 1;
    }

    /// Answers an Initial with a Retry: a fresh ID of this shard (so the client's next Initial
    /// comes back here, by the steering's worker byte and the balancer's host ID) and a token
    /// for the address. No state is kept.
    fn retry(&mut self, to: SocketAddr, hdr: &quiche::Header<'_>, now: SystemTime) {
        let Some(new_scid) = self.table.fresh_cid(&mut self.gate.cids) else { return };
        // Bound to the ID the client must send its next Initial to.
        let token = self.gate.token_key.seal(to, &hdr.dcid, &new_scid, now);
        if token.is_empty() {
            self.counters.accept_errors += 1;
            return;
        }
        let mut out = [0u8; 256];
        let new = quiche::ConnectionId::from_ref(&new_scid);
        match quiche::retry(&hdr.scid, &hdr.dcid, &new, &token, hdr.version, &mut out) {
            Ok(n) => {
                self.send_now(to, &out[..n], "retry");
                self.counters.retries_sent += 1;
            }
            Err(e) => log::debug!("udpx-quic: no Retry for {to}: {e}"),
        }
    }

    /// The connection to `from` whose peer's stateless reset token ends `buf`, if any (a
    /// client's: it has few connections, so this looks at each).
    pub(super) fn reset_target(&self, from: SocketAddr, buf: &[u8]) -> Option<Slot> {
        let tail = buf.len().checked_sub(16).filter(|_| buf.len() >= 21).map(|at| &buf[at..])?;
        self.table.iter().find_map(|(slot, e)| {
            let ends_it = e.conn.path_stats().any(|p| p.peer_addr == from)
                && e.conn
                    .peer_transport_params()
                    .and_then(|tp| tp.stateless_reset_token)
                    .is_some_and(|t| t.to_be_bytes() == tail);
            ends_it.then_some(slot)
        })
    }

    /// Answers a short-header packet of `len` bytes for the unknown connection ID `dcid` with
    /// a stateless reset, when the keys are shared, the packet is long enough and the rate
    /// allows.
    pub(super) fn stateless_reset(&mut self, to: SocketAddr, dcid: &[u8], len: usize) {
        let Some(key) = &self.gate.keys.reset else { return };
        // A short header does not say how long its DCID is: this service's are CID_LEN.
        let Some(cid) = dcid.get(..CID_LEN) else { return };
        let me = crate::reset::Speaker {
            host_id: self.gate.cids.host_id(),
            generation: self.gate.cids.generation(),
            worker: self.gate.cids.worker(),
            shards: self.gate.shards,
        };
        let live = &self.gate.generations;
        if !crate::reset::may_reset(cid, me, &self.gate.removed_hosts, |g, w| live.is_live(g, w)) {
            self.counters.resets_not_ours += 1;
            return;
        }
        let mut random = [0u8; 64];
        let mut out = [0u8; 64];
        if crate::cid::random_bytes(&mut random).is_err() {
            return;
        }
        let Some(n) = key.write_reset(cid, len, &random, &mut out) else { return };
        if !self.gate.answers.allow(Answer::Reset, Instant::now()) {
            self.counters.resets_limited += 1;
            return;
        }
        self.send_now(to, &out[..n], "stateless reset");
        self.counters.stateless_resets += 1;
    }

    /// Sends one datagram outside the outbox (version negotiation, stateless reset, Retry):
    /// once, without waiting; a refusal is logged (the peer will send again).
    pub(super) fn send_now(&self, to: SocketAddr, bytes: &[u8], what: &str) {
        if let Err(e) = self.socket.try_send(
            &mut udpx::SendBuffers::new(),
            &[udpx::Transmit::new(to, bytes)],
            udpx::SendCursor::default(),
        ) {
            log::debug!("udpx-quic: {what} to {to} not sent: {e}");
        }
    }

    /// Sets the session ticket key of the period in force (every shard and host derives the
    /// same from the service's keys): resumption works across shards and hosts, and keys change
    /// every [`crate::token::TICKET_KEY_PERIOD`].
    pub(super) fn rotate_ticket_key(&mut self) {
        if !self.accepting {
            return;
        }
        let period = crate::token::ticket_period(SystemTime::now());
        if self.gate.ticket_period == Some(period) {
            return;
        }
        let key = self.gate.keys.ticket_key_of(period);
        match self.config.set_ticket_key(&key) {
            Ok(()) => self.gate.ticket_period = Some(period),
            Err(e) => {
                log::warn!("udpx-quic: the session ticket key was refused ({e}); resumption stays per shard");
                self.gate.ticket_period = Some(period);
            }
        }
    }

    /// Forgets the connection IDs the peer retired; a server offers an established connection
    /// as many new ones as its peer takes (see the module docs), each with this host ID and
    /// worker byte, and a reset token from the service's key (random without one). Bounded
    /// per turn.
    pub(super) fn issue_cids(&mut self, slot: Slot) {
        // Runs on every connection's turn: the key is borrowed, not cloned (the gate's keys and
        // its ID generator are separate fields).
        let Gate { keys, cids, .. } = &mut self.gate;
        let key = &keys.reset;
        let token = |cid: &[u8]| match key {
            Some(k) => Some(k.token(cid)),
            None => {
                let mut t = [0u8; 16];
                crate::cid::random_bytes(&mut t).ok().map(|()| u128::from_ne_bytes(t))
            }
        };
        let issued = self.table.refresh_cids(slot, cids, self.accepting, MAX_ISSUED_PER_TURN, token);
        self.counters.cids_issued += issued;
    }
}
