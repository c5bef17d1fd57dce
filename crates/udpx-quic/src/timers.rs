//! The timer structure of a shard: every connection in it once, keyed by its earliest deadline
//! (quiche's `timeout_instant()`, a pacing hold, the handshake deadline, the application's
//! wake-up: a [`Deadline`] names which), in an indexed 4-ary min-heap.
//!
//! ```text
//!  heap:  [ (deadline, conn) ... ]      4-ary: children of i are 4i+1 ..= 4i+4
//!  pos:   conn → its index in heap      (NONE when it has no deadline)
//! ```
//!
//! ```text
//!  kind:  conn → the Deadline its entry is for
//! ```
//!
//! Re-keying a connection (after each receive, send or timeout of it) moves its one entry up
//! or down: O(log₄ n), no stale entries to skip later, and the earliest deadline is at the
//! root. lsquic keeps its "advisory tick times" in a heap too; msquic and quicly use a timing
//! wheel, whose O(1) re-key buys less than it seems here: deadlines need microsecond
//! precision for pacing, which a millisecond wheel rounds away. Measured
//! (`cargo bench -p udpx-quic --bench timers`, 2026-11-25 19:35, the project's 2-core VM):
//! a re-key costs 43 ns among 100 connections and 56 ns among 50,000; a deadline fired and
//! re-armed 79 ns and 132 ns: at 50,000 connections a few hundred nanoseconds per packet at
//! most, against the tens of microseconds a packet costs in quiche and the kernel.
//!
//! Deadlines are nanoseconds on the host's own clock (an `Instant` taken at start): a `u64`
//! compares faster than an `Instant` and holds 584 years.

/// "No entry" in the position table.
const NONE: u32 = u32::MAX;

use crate::table::Slot;

/// Children per node.
const ARITY: usize = 4;

/// What a connection's deadline is for: the earliest of its deadlines, which the host works
/// out after each of its turns and acts on when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deadline {
    /// quiche's own timer (loss detection, acknowledgement delay, idle, draining): the host
    /// calls `on_timeout`.
    #[default]
    Quic,
    /// The release time of the packet the host holds for pacing: it goes out.
    Release,
    /// The end of the time a server gives a handshake: the connection is dropped if it is
    /// not established by then.
    Handshake,
    /// The application asked for a turn then (`App::wake_at`).
    App,
}

/// Connections by deadline (see the module docs), by their [`Slot`]s in the host's table (small
/// and dense).
#[derive(Debug, Default)]
pub struct Timers {
    heap: Vec<(u64, u32)>,
    pos: Vec<u32>,
    kind: Vec<Deadline>,
}

impl Timers {
    /// An empty structure.
    pub fn new() -> Timers {
        Timers::default()
    }

    /// Connections with a deadline.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no connection has a deadline.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The earliest deadline and its connection.
    pub fn peek(&self) -> Option<(u64, Slot)> {
        self.heap.first().map(|&(at, c)| (at, Slot(c)))
    }

    /// The deadline of `conn` and what it is for, if it has one.
    pub fn deadline(&self, conn: Slot) -> Option<(u64, Deadline)> {
        match self.pos.get(conn.index()) {
            Some(&p) if p != NONE => Some((self.heap[p as usize].0, self.kind[conn.index()])),
            _ => None,
        }
    }

    /// Sets (or moves) `conn`'s deadline and what it is for; `None` removes it.
    pub fn set(&mut self, conn: Slot, deadline: Option<(u64, Deadline)>) {
        let Some((at, kind)) = deadline else {
            self.remove(conn);
            return;
        };
        let c = conn.index();
        if self.pos.len() <= c {
            self.pos.resize(c + 1, NONE);
            self.kind.resize(c + 1, Deadline::Quic);
        }
        self.kind[c] = kind;
        match self.pos[c] {
            NONE => {
                self.heap.push((at, conn.0));
                let i = self.heap.len() - 1;
                self.pos[c] = i as u32;
                self.up(i);
            }
            p => {
                let i = p as usize;
                let old = self.heap[i].0;
                self.heap[i].0 = at;
                if at < old {
                    self.up(i);
                } else if at > old {
                    self.down(i);
                }
            }
        }
    }

    /// Removes `conn`'s deadline, if any.
    pub fn remove(&mut self, conn: Slot) {
        let c = conn.index();
        let Some(&p) = self.pos.get(c) else { return };
        if p == NONE {
            return;
        }
        let i = p as usize;
        self.pos[c] = NONE;
        let last = self.heap.pop().expect("an entry at p");
        if i < self.heap.len() {
            self.heap[i] = last;
            self.pos[last.1 as usize] = i as u32;
            // The moved entry may belong above or below.
            self.up(i);
            let j = self.pos[last.1 as usize] as usize;
            self.down(j);
        }
    }

    /// Takes the earliest connection whose deadline is at or before `now`, and what the
    /// deadline was for.
    pub fn pop_due(&mut self, now: u64) -> Option<(Slot, Deadline)> {
        let (at, conn) = *self.heap.first()?;
        if at > now {
            return None;
        }
        self.remove(Slot(conn));
        Some((Slot(conn), self.kind[conn as usize]))
    }

    fn up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.heap[parent].0 <= self.heap[i].0 {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let first = ARITY * i + 1;
            if first >= n {
                break;
            }
            let last = (first + ARITY).min(n);
            let mut min = first;
            for k in first + 1..last {
                if self.heap[k].0 < self.heap[min].0 {
                    min = k;
                }
            }
            if self.heap[min].0 >= self.heap[i].0 {
                break;
            }
            self.swap(i, min);
            i = min;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a].1 as usize] = a as u32;
        self.pos[self.heap[b].1 as usize] = b as u32;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn earliest_first_and_each_once() {
        let mut t = Timers::new();
        for (c, at) in [(3u32, 30u64), (1, 10), (2, 20), (7, 5)] {
            t.set(Slot(c), Some((at, Deadline::Quic)));
        }
        t.set(Slot(3), Some((1, Deadline::Release))); // moved earlier, another kind
        t.set(Slot(7), Some((50, Deadline::Handshake))); // moved later
        t.set(Slot(2), None); // removed
        assert_eq!(t.len(), 3);
        assert_eq!(t.deadline(Slot(1)), Some((10, Deadline::Quic)));
        assert_eq!(t.deadline(Slot(2)), None);
        let mut fired = Vec::new();
        while let Some((c, kind)) = t.pop_due(40) {
            fired.push((c.0, kind));
        }
        assert_eq!(fired, vec![(3, Deadline::Release), (1, Deadline::Quic)], "due ones in order; 7 (at 50) waits");
        assert_eq!(t.peek(), Some((50, Slot(7))));
        assert_eq!(t.pop_due(49), None);
        assert_eq!(t.pop_due(50), Some((Slot(7), Deadline::Handshake)));
        assert!(t.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Set(u32, u64),
        Remove(u32),
        Pop(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..64, 0u64..1000).prop_map(|(c, t)| Op::Set(c, t)),
            (0u32..64).prop_map(Op::Remove),
            (0u64..1000).prop_map(Op::Pop),
        ]
    }

    proptest! {
        /// The heap agrees with a sorted set of (deadline, connection) after any sequence of
        /// sets, removals and pops: every due timer fires once, earliest first, and a moved
        /// deadline fires at its new time only.
        #[test]
        fn agrees_with_a_sorted_set(ops in proptest::collection::vec(op(), 0..400)) {
            let mut t = Timers::new();
            let mut model: BTreeSet<(u64, u32)> = BTreeSet::new();
            let mut at: std::collections::HashMap<u32, u64> = Default::default();
            for o in ops {
                match o {
                    Op::Set(c, d) => {
                        if let Some(old) = at.insert(c, d) { model.remove(&(old, c)); }
                        model.insert((d, c));
                        t.set(Slot(c), Some((d, Deadline::App)));
                    }
                    Op::Remove(c) => {
                        if let Some(old) = at.remove(&c) { model.remove(&(old, c)); }
                        t.remove(Slot(c));
                    }
                    Op::Pop(now) => {
                        let want = model.iter().next().copied().filter(|(d, _)| *d <= now);
                        let got = t.pop_due(now).map(|(s, _)| s.0);
                        match want {
                            None => prop_assert_eq!(got, None),
                            Some((d, _)) => {
                                // Ties may come in any order; the deadline must match.
                                let c = got.expect("a due timer");
                                prop_assert_eq!(at.remove(&c), Some(d));
                                model.remove(&(d, c));
                            }
                        }
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert_eq!(t.peek().map(|p| p.0), model.iter().next().map(|p| p.0));
            }
        }
    }
}
