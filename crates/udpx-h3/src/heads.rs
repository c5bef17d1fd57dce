//! Unfinished request heads, bounded (the third review, issue 46).
//!
//! quiche's HTTP/3 layer copies an unfinished HEADERS frame (up to 1.5 times the field-section
//! limit, 24 KiB) out of its stream and gives the flow-control credit back, and says nothing
//! about it until the frame is whole. A peer that opens every stream it may (100) with a
//! HEADERS frame it never finishes, on every connection its address may have, would pin
//! gigabytes of a shard. So the responder counts what quiche does not: a client request
//! stream that has delivered data (seen readable) and no head yet is an *unfinished head*,
//! from that moment until its HEADERS event (or its reset, or its end).
//!
//! ```text
//!   stream readable, no head yet ──► Heads::begin  ── over a cap ──► connection closed (H3_EXCESSIVE_LOAD)
//!   HEADERS / reset / FIN        ──► Heads::end
//!   unfinished for HEAD_DEADLINE ──► connection closed (H3_REQUEST_INCOMPLETE)
//! ```
//!
//! Caps: per connection, per address (an IPv6 /64) and per shard, so that neither one
//! connection nor one address holds the shard's budget; at 24 KiB each, the shard's cap bounds
//! what heads can pin (24 MiB at 1,024). A browser's request head is a few hundred bytes
//! (QPACK) in one packet: one is unfinished only while a packet of it is lost, a round trip
//! or two.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long a request head may stay unfinished before its connection is closed (nginx's
/// `client_header_timeout` is 60 s for a whole HTTP/1.1 head over TCP; a QUIC head lost in
/// part is resent within a few round trips).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);

/// Unfinished heads one connection may have at once.
pub const PER_CONN: usize = 16;
/// ... one address (IPv6: a /64).
pub const PER_ADDR: usize = 64;
/// ... a shard.
pub const PER_SHARD: usize = 1024;

/// Why a head was refused (its connection is then closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    Conn,
    Addr,
    Shard,
}

/// The shard's count, in all and by address (an entry leaves at zero).
#[derive(Debug, Default)]
pub(crate) struct HeadBudget {
    shard: Cell<usize>,
    by_addr: RefCell<HashMap<IpAddr, usize>>,
}

/// One connection's unfinished heads: since when, by stream.
#[derive(Debug, Default)]
pub(crate) struct Heads(HashMap<u64, Instant>);

impl HeadBudget {
    /// Stream `sid` of connection `heads` (from `addr`) has data and no head yet: counted,
    /// unless a cap is reached. Already counted: nothing changes.
    pub(crate) fn begin(&self, heads: &mut Heads, addr: IpAddr, sid: u64, now: Instant) -> Result<(), Over> {
        if heads.0.contains_key(&sid) {
            return Ok(());
        }
        let held = self.by_addr.borrow().get(&addr).copied().unwrap_or(0);
        let over = if heads.0.len() >= PER_CONN {
            Some(Over::Conn)
        } else if held >= PER_ADDR {
            Some(Over::Addr)
        } else if self.shard.get() >= PER_SHARD {
            Some(Over::Shard)
        } else {
            None
        };
        if let Some(o) = over {
            return Err(o);
        }
        heads.0.insert(sid, now);
        self.shard.set(self.shard.get() + 1);
        *self.by_addr.borrow_mut().entry(addr).or_insert(0) += 1;
        Ok(())
    }

    /// Stream `sid`'s head arrived (or the stream ended or was reset): no longer counted.
    pub(crate) fn end(&self, heads: &mut Heads, addr: IpAddr, sid: u64) {
        if heads.0.remove(&sid).is_some() {
            self.release(addr, 1);
        }
    }

    /// The connection is gone: its heads are no longer counted.
    pub(crate) fn end_all(&self, heads: &mut Heads, addr: IpAddr) {
        let n = heads.0.len();
        heads.0.clear();
        if n > 0 {
            self.release(addr, n);
        }
    }

    fn release(&self, addr: IpAddr, n: usize) {
        self.shard.set(self.shard.get().saturating_sub(n));
        let mut m = self.by_addr.borrow_mut();
        if let Some(c) = m.get_mut(&addr) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                m.remove(&addr);
            }
        }
    }

    /// Unfinished heads on the shard now.
    pub(crate) fn count(&self) -> usize {
        self.shard.get()
    }
}

impl Heads {
    /// When the oldest unfinished head reaches [`HEAD_DEADLINE`].
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.0.values().min().map(|&t| t + HEAD_DEADLINE)
    }

    /// Whether stream `sid` is counted.
    pub(crate) fn has(&self, sid: u64) -> bool {
        self.0.contains_key(&sid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_connection_address_and_shard_and_everything_comes_back() {
        let b = HeadBudget::default();
        let now = Instant::now();
        let (a, other) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let mut conns: Vec<Heads> = (0..5).map(|_| Heads::default()).collect();
        for s in 0..PER_CONN as u64 {
            b.begin(&mut conns[0], a, s * 4, now).unwrap();
        }
        b.begin(&mut conns[0], a, 0, now).expect("counted once");
        assert_eq!(b.begin(&mut conns[0], a, 400, now), Err(Over::Conn));
        for (i, c) in conns.iter_mut().enumerate().skip(1).take(3) {
            for s in 0..PER_CONN as u64 {
                b.begin(c, a, s * 4, now).unwrap_or_else(|e| panic!("conn {i}: {e:?}"));
            }
        }
        assert_eq!(b.count(), PER_ADDR);
        assert_eq!(b.begin(&mut conns[4], a, 0, now), Err(Over::Addr));
        let mut elsewhere = Heads::default();
        b.begin(&mut elsewhere, other, 0, now).expect("another address");
        b.end_all(&mut elsewhere, other);
        assert_eq!(conns[0].deadline(), Some(now + HEAD_DEADLINE));
        b.end(&mut conns[0], a, 0);
        assert!(!conns[0].has(0));
        b.begin(&mut conns[4], a, 4, now).expect("room again for the address");
        for c in &mut conns {
            b.end_all(c, a);
        }
        assert_eq!(b.count(), 0);
        assert!(b.by_addr.borrow().is_empty());
    }

    #[test]
    fn the_shard_cap_holds_over_many_addresses() {
        let b = HeadBudget::default();
        let now = Instant::now();
        let mut refused = 0;
        for i in 0..(PER_SHARD / PER_CONN + 8) {
            let addr = IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
            let mut h = Heads::default();
            for s in 0..PER_CONN as u64 {
                if b.begin(&mut h, addr, s * 4, now) == Err(Over::Shard) {
                    refused += 1;
                }
            }
        }
        assert_eq!(b.count(), PER_SHARD);
        assert_eq!(refused, 8 * PER_CONN);
    }
}
