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
//!
//! The decision is [`Gate::admit`]'s, told the time and whether the host admits (its
//! [`Doors`]), with no socket: a [`Verdict`] (accept with this ID, reply with these bytes, or
//! drop) and the [`Reason`] the loop counts. The loop sends the replies and makes the
//! connection. Its tests run in virtual time, row by row.

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use crate::admission::{Admission, Admit, Answer, Answers, Cap, Limits};
use crate::cid::{CidGenerator, CID_LEN};
use crate::counters::HostCounters;
use crate::reset::{LiveGenerations, RemovedHosts};
use crate::table::{CidKey, Slot, Table};
use crate::token::{ServiceKeys, TokenError, TokenKey};

use crate::{App, Host, Role};

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
    /// [`super::HostConfig::keylog`].
    pub keylog: Option<crate::keylog::KeyLog>,
    /// [`super::HostConfig::qlog`] (read only with the feature `qlog`).
    #[cfg_attr(not(feature = "qlog"), allow(dead_code))]
    pub qlog: Option<crate::qlog::Qlog>,
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
            keylog: None,
            qlog: None,
        }
    }
}

/// Whether a host takes new connections now, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Doors {
    /// A client: it accepts none, and resets nothing.
    Client,
    /// A server serving as usual.
    Open,
    /// A server draining after a handover, within its admission grace: still admitting.
    Grace,
    /// A server draining: Initials are refused.
    Shut,
}

/// Why admission refused a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The cap on connections.
    Connections,
    /// The cap on handshakes under way.
    HalfOpen,
    /// The cap on connections per address.
    PerIp,
    /// The server drains.
    Draining,
}

impl Refusal {
    /// The reason the CONNECTION_CLOSE gives.
    fn reason(self) -> &'static [u8] {
        match self {
            Refusal::Connections => b"connection cap",
            Refusal::HalfOpen => b"handshake cap",
            Refusal::PerIp => b"per-address cap",
            Refusal::Draining => b"shutting down",
        }
    }
}

/// What became of the answer to a refused datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Told {
    /// Answered.
    Sent,
    /// Its kind of answer is over its budget: not answered.
    Limited,
    /// Not answered (no key, another version, too short to answer without amplifying).
    Silent,
}

/// Why a datagram no connection took started none: each is counted
/// ([`Reason::count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    /// Not an Initial (or a client's host): no connection has its ID. A short header to an ID
    /// of this shard may get a stateless reset (`Sent`); `Limited`: the resets' budget is
    /// spent; `Silent`: no shared key, or too short.
    UnknownCid(Told),
    /// An ID a live shard, generation or another host may own: not ours to reset.
    NotOursToReset,
    /// An Initial under 1,200 bytes, or with a DCID under 8 bytes.
    BadInitial,
    /// Another version: Version Negotiation, within its budget.
    Version(Told),
    /// A Retry token past its time.
    TokenExpired,
    /// A token that is not one of ours.
    TokenInvalid,
    /// Refused, with a CONNECTION_CLOSE if the budget allows.
    Refused(Refusal, Told),
    /// Answered with a Retry.
    Retry,
    /// No connection ID or token could be made.
    NoId,
}

impl Reason {
    /// Adds this refusal to its counters.
    pub(super) fn count(self, c: &mut HostCounters) {
        let told = |t: Told, c: &mut HostCounters, sent: fn(&mut HostCounters) -> &mut u64| match t {
            Told::Sent => *sent(c) += 1,
            Told::Limited => c.answers_limited += 1,
            Told::Silent => {}
        };
        match self {
            Reason::UnknownCid(t) => {
                c.dropped_unknown_cid += 1;
                match t {
                    Told::Sent => c.stateless_resets += 1,
                    Told::Limited => c.resets_limited += 1,
                    Told::Silent => {}
                }
            }
            Reason::NotOursToReset => {
                c.dropped_unknown_cid += 1;
                c.resets_not_ours += 1;
            }
            Reason::BadInitial => c.dropped_bad_initial += 1,
            Reason::Version(t) => told(t, c, |c| &mut c.version_negotiations),
            Reason::TokenExpired => c.tokens_expired += 1,
            Reason::TokenInvalid => c.tokens_invalid += 1,
            Reason::Refused(cap, t) => {
                match cap {
                    Refusal::Connections => c.refused_connections += 1,
                    Refusal::HalfOpen => c.refused_half_open += 1,
                    Refusal::PerIp => c.refused_per_ip += 1,
                    Refusal::Draining => c.refused_draining += 1,
                }
                told(t, c, |c| &mut c.refusals_sent);
            }
            Reason::Retry => c.retries_sent += 1,
            Reason::NoId => c.accept_errors += 1,
        }
    }

    /// What the answer is, for a log line.
    pub(super) fn answer(self) -> &'static str {
        match self {
            Reason::UnknownCid(_) | Reason::NotOursToReset => "stateless reset",
            Reason::Version(_) => "version negotiation",
            Reason::Refused(..) => "refusal",
            Reason::Retry => "retry",
            _ => "answer",
        }
    }
}

/// What admission decided about a datagram no connection of the host took.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Start a connection with ID `scid`; `odcid`: the original destination ID a Retry token
    /// proved (the address is then validated); `reset_token`: the ID's stateless reset token
    /// under the service's key.
    Accept { scid: [u8; CID_LEN], odcid: Option<Vec<u8>>, reset_token: Option<u128> },
    /// Send `bytes` back to the sender; counted as `reason`.
    Reply { bytes: Vec<u8>, reason: Reason },
    /// Nothing to send; counted as `reason`.
    Drop(Reason),
}

/// The clock of one turn, read once by the loop and handed down.
#[derive(Debug, Clone, Copy)]
pub(super) struct Now {
    /// For deadlines and budgets.
    pub at: Instant,
    /// For tokens (they outlive the process) and ticket key periods.
    pub wall: SystemTime,
}

impl Now {
    /// The clock now.
    pub fn read() -> Now {
        Now { at: Instant::now(), wall: SystemTime::now() }
    }
}

impl Gate {
    /// What to do with the datagram of `len` bytes from `from` with header `hdr`, which no
    /// connection in `table` took (see the module docs). Sends nothing and counts nothing:
    /// the caller does both.
    pub fn admit<S>(
        &mut self,
        table: &Table<S>,
        from: SocketAddr,
        hdr: &quiche::Header<'_>,
        len: usize,
        doors: Doors,
        now: Now,
    ) -> Verdict {
        if doors == Doors::Client || hdr.ty != quiche::Type::Initial {
            if doors != Doors::Client && hdr.ty == quiche::Type::Short {
                return self.reset(&hdr.dcid, len, now.at);
            }
            return Verdict::Drop(Reason::UnknownCid(Told::Silent));
        }
        if len < quiche::MIN_CLIENT_INITIAL_LEN {
            // RFC 9000 14.1: a client's first datagram is at least 1,200 bytes; a smaller one
            // gets nothing, not even Version Negotiation (which would be an amplifier).
            return Verdict::Drop(Reason::BadInitial);
        }
        if !quiche::version_is_supported(hdr.version) {
            if !self.answers.allow(Answer::VersionNegotiation, now.at) {
                return Verdict::Drop(Reason::Version(Told::Limited));
            }
            let mut out = [0u8; 1350];
            return match quiche::negotiate_version(&hdr.scid, &hdr.dcid, &mut out) {
                Ok(n) => Verdict::Reply { bytes: out[..n].to_vec(), reason: Reason::Version(Told::Sent) },
                Err(_) => Verdict::Drop(Reason::Version(Told::Silent)),
            };
        }
        if hdr.dcid.len() < 8 {
            return Verdict::Drop(Reason::BadInitial);
        }
        if doors == Doors::Shut {
            return self.refuse(hdr, Refusal::Draining, now.at);
        }
        let odcid = match hdr.token.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => match self.token_key.open(from, t, &hdr.dcid, now.wall) {
                Ok(odcid) => Some(odcid),
                Err(TokenError::Expired) => return Verdict::Drop(Reason::TokenExpired),
                // A NEW_TOKEN token (quiche never sends one) or a forgery: ours are Retry
                // tokens only.
                Err(TokenError::Invalid) => return Verdict::Drop(Reason::TokenInvalid),
            },
        };
        match self.admission.check(from.ip(), odcid.is_some()) {
            Admit::Refuse(cap) => {
                let why = match cap {
                    Cap::Connections => Refusal::Connections,
                    Cap::HalfOpen => Refusal::HalfOpen,
                    Cap::PerIp => Refusal::PerIp,
                };
                return self.refuse(hdr, why, now.at);
            }
            Admit::Retry => return self.retry(table, from, hdr, now.wall),
            Admit::Accept => {}
        }
        let Some(scid) = table.fresh_cid(&mut self.cids) else {
            return Verdict::Drop(Reason::NoId);
        };
        let reset_token = self.keys.reset.as_ref().map(|k| k.token(&scid));
        Verdict::Accept { scid, odcid, reset_token }
    }

    /// A refused Initial's answer (RFC 9000 5.2.2: a server Initial closing with
    /// CONNECTION_REFUSED, [`crate::initial::refusal`]) while the answers budget allows: it is
    /// unauthenticated, and the address may be forged.
    fn refuse(&mut self, hdr: &quiche::Header<'_>, why: Refusal, now: Instant) -> Verdict {
        if hdr.version != crate::initial::VERSION_1 {
            return Verdict::Drop(Reason::Refused(why, Told::Silent)); // its keys would be another version's
        }
        if !self.answers.allow(Answer::Refusal, now) {
            return Verdict::Drop(Reason::Refused(why, Told::Limited));
        }
        let mut scid = [0u8; CID_LEN];
        if crate::cid::random_bytes(&mut scid).is_err() {
            return Verdict::Drop(Reason::Refused(why, Told::Silent));
        }
        let bytes = crate::initial::refusal(&hdr.dcid, &hdr.scid, &scid, why.reason());
        Verdict::Reply { bytes, reason: Reason::Refused(why, Told::Sent) }
    }

    /// A Retry for an Initial: a fresh ID of this shard (so the client's next Initial comes
    /// back here, by the steering's worker byte and the balancer's host ID) and a token for
    /// the address. No state is kept.
    fn retry<S>(&mut self, table: &Table<S>, to: SocketAddr, hdr: &quiche::Header<'_>, wall: SystemTime) -> Verdict {
        let Some(new_scid) = table.fresh_cid(&mut self.cids) else { return Verdict::Drop(Reason::NoId) };
        // Bound to the ID the client must send its next Initial to.
        let token = self.token_key.seal(to, &hdr.dcid, &new_scid, wall);
        if token.is_empty() {
            return Verdict::Drop(Reason::NoId);
        }
        let mut out = [0u8; 256];
        let new = quiche::ConnectionId::from_ref(&new_scid);
        match quiche::retry(&hdr.scid, &hdr.dcid, &new, &token, hdr.version, &mut out) {
            Ok(n) => Verdict::Reply { bytes: out[..n].to_vec(), reason: Reason::Retry },
            Err(e) => {
                log::debug!("udpx-quic: no Retry for {to}: {e}");
                Verdict::Drop(Reason::NoId)
            }
        }
    }

    /// A short-header packet of `len` bytes for the unknown connection ID `dcid`: a stateless
    /// reset when the keys are shared, the ID is this shard's to reset, the packet is long
    /// enough and the budget allows.
    fn reset(&mut self, dcid: &[u8], len: usize, now: Instant) -> Verdict {
        let silent = Verdict::Drop(Reason::UnknownCid(Told::Silent));
        let Some(key) = &self.keys.reset else { return silent };
        // A short header does not say how long its DCID is: this service's are CID_LEN.
        let Some(cid) = dcid.get(..CID_LEN) else { return silent };
        let me = crate::reset::Speaker {
            host_id: self.cids.host_id(),
            generation: self.cids.generation(),
            worker: self.cids.worker(),
            shards: self.shards,
        };
        let live = &self.generations;
        if !crate::reset::may_reset(cid, me, &self.removed_hosts, |g, w| live.is_live(g, w)) {
            return Verdict::Drop(Reason::NotOursToReset);
        }
        let mut random = [0u8; 64];
        let mut out = [0u8; 64];
        if crate::cid::random_bytes(&mut random).is_err() {
            return silent;
        }
        let Some(n) = key.write_reset(cid, len, &random, &mut out) else { return silent };
        if !self.answers.allow(Answer::Reset, now) {
            return Verdict::Drop(Reason::UnknownCid(Told::Limited));
        }
        Verdict::Reply { bytes: out[..n].to_vec(), reason: Reason::UnknownCid(Told::Sent) }
    }
}

impl<A: App> Host<A> {
    /// Whether the host takes new connections at `now`.
    fn doors(&self, now: Instant) -> Doors {
        match self.role {
            Role::Client => Doors::Client,
            Role::Server { .. } if !self.is_draining() => Doors::Open,
            Role::Server { .. } if self.admitting(now) => Doors::Grace,
            Role::Server { .. } => Doors::Shut,
        }
    }

    /// A connection for a datagram to an unknown DCID, or `None` when admission starts none
    /// (its answer sent and its reason counted).
    pub(super) fn new_connection(
        &mut self,
        from: SocketAddr,
        local: SocketAddr,
        hdr: &quiche::Header<'_>,
        len: usize,
        now: Now,
    ) -> Option<Slot> {
        let doors = self.doors(now.at);
        let (scid, odcid, reset_token) = match self.gate.admit(&self.table, from, hdr, len, doors, now) {
            Verdict::Accept { scid, odcid, reset_token } => (scid, odcid, reset_token),
            Verdict::Reply { bytes, reason } => {
                reason.count(&mut self.counters);
                self.send_now(from, &bytes, reason.answer());
                return None;
            }
            Verdict::Drop(reason) => {
                reason.count(&mut self.counters);
                return None;
            }
        };
        if reset_token.is_some() {
            self.config.set_stateless_reset_token(reset_token);
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
        if doors == Doors::Grace {
            self.counters.handover_admitted += 1;
        }
        // Before its first packet is processed: the handshake's secrets come with it.
        if let Some(k) = &self.gate.keylog {
            conn.set_keylog(k.writer());
        }
        #[cfg(feature = "qlog")]
        if let Some(w) = self.gate.qlog.as_ref().and_then(|q| q.writer_for(from, &scid, now.wall)) {
            conn.set_qlog(w, "udpx".into(), format!("server connection from {from}"));
        }
        let state = self.app.accepted(&conn);
        let deadline = now.at + self.gate.admission.handshake_timeout();
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
    pub(super) fn rotate_ticket_key(&mut self, wall: SystemTime) {
        if !self.role.accepts() {
            return;
        }
        let period = crate::token::ticket_period(wall);
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
        let issued = self.table.refresh_cids(slot, cids, self.role.accepts(), MAX_ISSUED_PER_TURN, token);
        self.counters.cids_issued += issued;
    }
}

#[cfg(test)]
mod tests {
    //! Admission without a socket, in virtual time: each row is a datagram no connection took,
    //! the state the gate is in, and what it must decide; the replies are parsed back.
    use super::*;
    use crate::admission::RetryPolicy;
    use std::time::Duration;

    const FROM: &str = "192.0.2.7:4433";

    fn gate(keys: Option<ServiceKeys>, limits: Limits) -> Gate {
        Gate::new(7, (0, 1), 2, keys, limits, (RemovedHosts::default(), LiveGenerations::default()))
    }

    fn shared() -> Option<ServiceKeys> {
        Some(ServiceKeys::shared(&[9; 32]))
    }

    /// A long-header Initial of `version` with this DCID and token, padded to `len` bytes.
    fn initial(version: u32, dcid: &[u8], token: &[u8], len: usize) -> Vec<u8> {
        let mut b = vec![0xc0];
        b.extend_from_slice(&version.to_be_bytes());
        b.push(dcid.len() as u8);
        b.extend_from_slice(dcid);
        b.push(8);
        b.extend_from_slice(&[0xcc; 8]);
        assert!(token.len() < 64);
        b.push(token.len() as u8); // a one-byte varint
        b.extend_from_slice(token);
        b.resize(len.max(b.len() + 4), 0);
        b
    }

    /// A short-header packet to `dcid`, `len` bytes.
    fn short(dcid: &[u8], len: usize) -> Vec<u8> {
        let mut b = vec![0x40];
        b.extend_from_slice(dcid);
        b.resize(len, 0x55);
        b
    }

    /// What the gate decides for `packet`.
    fn admit(g: &mut Gate, packet: &[u8], doors: Doors, now: Now) -> Verdict {
        let mut buf = packet.to_vec();
        let hdr = quiche::Header::from_slice(&mut buf, CID_LEN).expect("a header");
        g.admit(&Table::<()>::new(), FROM.parse().unwrap(), &hdr, packet.len(), doors, now)
    }

    /// The verdict's reason, and whether it replies.
    fn reason(v: &Verdict) -> (Option<Reason>, bool) {
        match v {
            Verdict::Accept { .. } => (None, false),
            Verdict::Reply { reason, .. } => (Some(*reason), true),
            Verdict::Drop(reason) => (Some(*reason), false),
        }
    }

    #[test]
    fn each_datagram_no_connection_takes_gets_one_verdict() {
        let now = Now::read();
        let v1 = crate::initial::VERSION_1;
        let dcid = [0xab; 16];
        let mine = CidGenerator::with_generation(7, 0, 1).next_cid().unwrap();
        let other_host = CidGenerator::with_generation(8, 0, 1).next_cid().unwrap();
        let other_shard = CidGenerator::with_generation(7, 0, 0).next_cid().unwrap();
        use Told::*;
        // (what, packet, keys, doors, expected reason (None: accepted), replies)
        type Row = (&'static str, Vec<u8>, Option<ServiceKeys>, Doors, Option<Reason>, bool);
        let rows: Vec<Row> = vec![
            ("an Initial", initial(v1, &dcid, &[], 1200), None, Doors::Open, None, false),
            ("an Initial while handing over", initial(v1, &dcid, &[], 1200), None, Doors::Grace, None, false),
            ("a small Initial", initial(v1, &dcid, &[], 1199), None, Doors::Open, Some(Reason::BadInitial), false),
            ("a short DCID", initial(v1, &[1; 7], &[], 1200), None, Doors::Open, Some(Reason::BadInitial), false),
            (
                "another version",
                initial(0x1a2a_3a4a, &dcid, &[], 1200),
                None,
                Doors::Open,
                Some(Reason::Version(Sent)),
                true,
            ),
            (
                "a forged token",
                initial(v1, &dcid, &[1; 40], 1200),
                None,
                Doors::Open,
                Some(Reason::TokenInvalid),
                false,
            ),
            (
                "draining",
                initial(v1, &dcid, &[], 1200),
                None,
                Doors::Shut,
                Some(Reason::Refused(Refusal::Draining, Sent)),
                true,
            ),
            (
                "an Initial to a client",
                initial(v1, &dcid, &[], 1200),
                None,
                Doors::Client,
                Some(Reason::UnknownCid(Silent)),
                false,
            ),
            (
                "a short header, no shared key",
                short(&mine, 40),
                None,
                Doors::Open,
                Some(Reason::UnknownCid(Silent)),
                false,
            ),
            ("a short header to our ID", short(&mine, 40), shared(), Doors::Open, Some(Reason::UnknownCid(Sent)), true),
            (
                "a short header too short to answer",
                short(&mine, 21),
                shared(),
                Doors::Open,
                Some(Reason::UnknownCid(Silent)),
                false,
            ),
            ("another host's ID", short(&other_host, 40), shared(), Doors::Open, Some(Reason::NotOursToReset), false),
            ("another shard's ID", short(&other_shard, 40), shared(), Doors::Open, Some(Reason::NotOursToReset), false),
            (
                "a short header to a client",
                short(&mine, 40),
                shared(),
                Doors::Client,
                Some(Reason::UnknownCid(Silent)),
                false,
            ),
        ];
        for (what, packet, keys, doors, want, replies) in rows {
            let mut g = gate(keys, Limits::default());
            let v = admit(&mut g, &packet, doors, now);
            assert_eq!(reason(&v), (want, replies), "{what}: {v:?}");
            if let Verdict::Reply { bytes, .. } = &v {
                // Never larger than what it answers (no amplification).
                assert!(bytes.len() <= packet.len().max(1200), "{what}: {} bytes for {}", bytes.len(), packet.len());
            }
        }
    }

    #[test]
    fn caps_refuse_and_retry_proves_the_address() {
        let now = Now::read();
        let v1 = crate::initial::VERSION_1;
        let dcid = [0xab; 16];
        let from: SocketAddr = FROM.parse().unwrap();
        // One per address: the second is refused, with a CONNECTION_CLOSE.
        let mut g = gate(None, Limits { max_per_ip: 1, retry: RetryPolicy::Never, ..Limits::default() });
        assert!(matches!(admit(&mut g, &initial(v1, &dcid, &[], 1200), Doors::Open, now), Verdict::Accept { .. }));
        g.admission.opened(from.ip());
        let v = admit(&mut g, &initial(v1, &dcid, &[], 1200), Doors::Open, now);
        assert_eq!(reason(&v), (Some(Reason::Refused(Refusal::PerIp, Told::Sent)), true));
        // Retry always: a Retry, whose token then admits the address with the original ID.
        let mut g = gate(None, Limits { retry: RetryPolicy::Always, ..Limits::default() });
        let Verdict::Reply { bytes, reason: Reason::Retry } =
            admit(&mut g, &initial(v1, &dcid, &[], 1200), Doors::Open, now)
        else {
            panic!("no Retry")
        };
        let mut retry = bytes.clone();
        let hdr = quiche::Header::from_slice(&mut retry, CID_LEN).expect("a Retry");
        assert_eq!(hdr.ty, quiche::Type::Retry);
        let token = hdr.token.clone().expect("a token");
        let v = admit(&mut g, &initial(v1, &hdr.scid, &token, 1200), Doors::Open, now);
        let Verdict::Accept { odcid, reset_token, .. } = v else { panic!("the token did not admit: {v:?}") };
        assert_eq!(odcid.as_deref(), Some(&dcid[..]));
        assert_eq!(reset_token, None, "no shared key: quiche's own reset token");
        // The same token from another address, or past its time, admits nothing.
        let mut elsewhere = initial(v1, &hdr.scid, &token, 1200);
        let h = quiche::Header::from_slice(&mut elsewhere, CID_LEN).unwrap();
        let v = g.admit(&Table::<()>::new(), "192.0.2.8:4433".parse().unwrap(), &h, 1200, Doors::Open, now);
        assert_eq!(reason(&v), (Some(Reason::TokenInvalid), false));
        let later = Now { at: now.at, wall: now.wall + Duration::from_secs(3600) };
        let v = admit(&mut g, &initial(v1, &hdr.scid, &token, 1200), Doors::Open, later);
        assert_eq!(reason(&v), (Some(Reason::TokenExpired), false));
    }

    #[test]
    fn answers_stop_at_their_budget_and_each_refusal_is_counted() {
        let now = Now::read();
        let mut g = gate(shared(), Limits { answers_per_sec: 3, ..Limits::default() });
        let mine = CidGenerator::with_generation(7, 0, 1).next_cid().unwrap();
        let vn = initial(0x1a2a_3a4a, &[0xab; 16], &[], 1200);
        let mut c = HostCounters::default();
        let mut replies = 0;
        for _ in 0..10 {
            for p in [&vn, &short(&mine, 40)] {
                let v = admit(&mut g, p, Doors::Open, now);
                replies += usize::from(matches!(v, Verdict::Reply { .. }));
                reason(&v).0.expect("a reason").count(&mut c);
            }
        }
        // A budget for each kind: one kind's flood does not starve the other.
        assert_eq!(replies, 6);
        assert_eq!((c.version_negotiations, c.answers_limited), (3, 7));
        assert_eq!((c.stateless_resets, c.resets_limited, c.dropped_unknown_cid), (3, 7, 10));
        // In the next second's window the budget is back (the window began when the gate was
        // made, after `now` was read).
        let later = Now { at: now.at + Duration::from_secs(2), wall: now.wall };
        assert!(matches!(admit(&mut g, &vn, Doors::Open, later), Verdict::Reply { .. }));
    }
}
