//! The connection table of a host: its connections in slots, and the connection-ID index that
//! finds a connection from a packet's destination ID.
//!
//! A connection keeps its [`Slot`] from insert to remove: the timers, the ready queue and the
//! outbox name it by that slot (small and dense: a freed slot is reused, so their arrays stay
//! as large as the most connections ever open at once). Every connection ID the connection
//! answers to (ours, the client's first DCID, IDs issued later) leads to its slot until the
//! peer retires it or the connection leaves.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crate::bufs::Connection;
use crate::cid::{CidGenerator, CID_LEN};
use crate::pacing::Held;

/// A connection's place in its host's table, and its name in the timers, the ready queue and
/// the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub u32);

impl Slot {
    /// As an array index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A connection ID as a map key, without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CidKey {
    len: u8,
    bytes: [u8; quiche::MAX_CONN_ID_LEN],
}

impl CidKey {
    pub(crate) fn new(cid: &[u8]) -> CidKey {
        let mut bytes = [0u8; quiche::MAX_CONN_ID_LEN];
        let n = cid.len().min(bytes.len());
        bytes[..n].copy_from_slice(&cid[..n]);
        CidKey { len: n as u8, bytes }
    }
}

/// One connection and what the host keeps beside it.
pub(crate) struct Entry<S> {
    pub conn: Connection,
    pub state: S,
    /// The connection IDs that lead to it.
    pub keys: Vec<CidKey>,
    /// The address it counts against in the admission caps.
    pub peer_ip: IpAddr,
    /// Its local address (quiche's path): the unspecified address for a client connection
    /// that lets the kernel choose.
    pub local: SocketAddr,
    /// Its handshake completed (counted once).
    pub established: bool,
    /// Dropped if not established by then (server connections).
    pub handshake_deadline: Option<Instant>,
    /// Its one packet waiting for its departure time: it produces nothing more before.
    pub held: Option<Held>,
    /// quiche's lost and retransmitted counts already added to the host's counters.
    pub seen_lost: u64,
    pub seen_retrans: u64,
    /// quiche's retransmitted and copied stream bytes already added to the host's counters.
    pub seen_stream_retrans: u64,
    pub seen_stream_copied: u64,
    /// quiche's timers fired since its last turn: a path the peer left may hold stranded
    /// packets (`Host::resend_stranded`).
    pub timed_out: bool,
    /// PTOs of the paths other than the active one, as last seen by `resend_stranded`.
    pub left_ptos: usize,
    /// When a packet of it last went into the outbox (a held packet counts when it is released).
    pub last_out: Option<Instant>,
    /// Packets it may still send ahead of their pacing time ([`crate::pacing::QUIET_BURST`]
    /// after a quiet spell).
    pub quiet_credit: u8,
}

/// The connections of one host (see the module docs).
pub(crate) struct Table<S> {
    slots: Vec<Option<Entry<S>>>,
    free: Vec<usize>,
    by_cid: HashMap<CidKey, Slot>,
}

impl<S> Table<S> {
    pub fn new() -> Table<S> {
        Table { slots: Vec::new(), free: Vec::new(), by_cid: HashMap::new() }
    }

    /// Connections in it.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Adds a connection found by the IDs `keys`; its slot.
    pub fn insert(
        &mut self,
        conn: Connection,
        state: S,
        keys: &[CidKey],
        peer_ip: IpAddr,
        local: SocketAddr,
        handshake_deadline: Option<Instant>,
    ) -> Slot {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let slot = Slot(idx as u32);
        for k in keys {
            self.by_cid.insert(*k, slot);
        }
        self.slots[idx] = Some(Entry {
            conn,
            state,
            keys: keys.to_vec(),
            peer_ip,
            local,
            established: false,
            handshake_deadline,
            held: None,
            seen_lost: 0,
            seen_retrans: 0,
            seen_stream_retrans: 0,
            seen_stream_copied: 0,
            timed_out: false,
            left_ptos: 0,
            last_out: None,
            quiet_credit: 0,
        });
        slot
    }

    /// Takes the connection out, and every ID that led to it.
    pub fn remove(&mut self, slot: Slot) -> Option<Entry<S>> {
        let e = self.slots.get_mut(slot.index())?.take()?;
        for k in &e.keys {
            self.by_cid.remove(k);
        }
        self.free.push(slot.index());
        Some(e)
    }

    pub fn get(&self, slot: Slot) -> Option<&Entry<S>> {
        self.slots.get(slot.index())?.as_ref()
    }

    pub fn get_mut(&mut self, slot: Slot) -> Option<&mut Entry<S>> {
        self.slots.get_mut(slot.index())?.as_mut()
    }

    /// The connection a destination ID leads to.
    pub fn lookup(&self, dcid: &[u8]) -> Option<Slot> {
        self.by_cid.get(&CidKey::new(dcid)).copied()
    }

    /// Every connection: for reports and for what a client does on rare events, never for
    /// the loop's turns.
    pub fn iter(&self) -> impl Iterator<Item = (Slot, &Entry<S>)> {
        self.slots.iter().enumerate().filter_map(|(i, e)| Some((Slot(i as u32), e.as_ref()?)))
    }

    /// [`Table::iter`], writable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Slot, &mut Entry<S>)> {
        self.slots.iter_mut().enumerate().filter_map(|(i, e)| Some((Slot(i as u32), e.as_mut()?)))
    }

    /// A connection ID from `cids` that no connection uses; `None` without randomness.
    pub fn fresh_cid(&self, cids: &mut CidGenerator) -> Option<[u8; CID_LEN]> {
        fresh_cid(cids, &self.by_cid)
    }

    /// Forgets the IDs the peer of `slot` retired; then, with `offer`, gives it up to `max`
    /// new ones from `cids` (as many as the peer takes), each with `token(cid)` as its reset
    /// token (`None`: none could be made). How many were issued.
    pub fn refresh_cids(
        &mut self,
        slot: Slot,
        cids: &mut CidGenerator,
        offer: bool,
        max: usize,
        token: impl Fn(&[u8]) -> Option<u128>,
    ) -> u64 {
        let Table { slots, by_cid, .. } = self;
        let Some(e) = slots.get_mut(slot.index()).and_then(Option::as_mut) else { return 0 };
        while let Some(old) = e.conn.retired_scid_next() {
            let k = CidKey::new(&old);
            by_cid.remove(&k);
            e.keys.retain(|x| *x != k);
        }
        if !offer || !e.conn.is_established() || e.conn.is_closed() {
            return 0;
        }
        let mut issued = 0;
        // Bounded: a peer's limit is at most what we advertise (quiche: the minimum of both),
        // but a broken peer must not make this loop spin.
        for _ in 0..max {
            if e.conn.scids_left() == 0 {
                break;
            }
            let Some(cid) = fresh_cid(cids, by_cid) else { break };
            let Some(t) = token(&cid) else { break };
            match e.conn.new_scid(&quiche::ConnectionId::from_ref(&cid), t, false) {
                Ok(_) => {
                    let k = CidKey::new(&cid);
                    by_cid.insert(k, slot);
                    e.keys.push(k);
                    issued += 1;
                }
                Err(err) => {
                    log::debug!("udpx-quic: {}: no new connection ID: {err}", e.conn.trace_id());
                    break;
                }
            }
        }
        issued
    }
}

/// A connection ID of this host that no connection uses; `None` without randomness.
fn fresh_cid(cids: &mut CidGenerator, by_cid: &HashMap<CidKey, Slot>) -> Option<[u8; CID_LEN]> {
    loop {
        match cids.next_cid() {
            Ok(c) if !by_cid.contains_key(&CidKey::new(&c)) => return Some(c),
            Ok(_) => continue,
            Err(e) => {
                log::warn!("udpx-quic: no randomness for a connection ID: {e}");
                return None;
            }
        }
    }
}
