//! The ready queue of a shard: the connections that have work, each in it at most once, served
//! in the order they became ready.
//!
//! A connection becomes ready when a datagram for it was fed to quiche, when its deadline
//! passed (quiche's timer, a pacing hold, the handshake deadline), or when it still had data
//! to send after its quantum. A turn serves the connections that were ready when it began
//! (so one that keeps re-queueing itself waits behind the others: round robin), and nothing
//! else: a connection with no work costs nothing per turn.

use std::collections::VecDeque;

use crate::table::Slot;

/// Connections with work (see the module docs).
#[derive(Debug, Default)]
pub struct ReadyQueue {
    queue: VecDeque<Slot>,
    queued: Vec<bool>,
}

impl ReadyQueue {
    /// Empty.
    pub fn new() -> ReadyQueue {
        ReadyQueue::default()
    }

    /// Queues `conn` unless it is queued already.
    pub fn push(&mut self, conn: Slot) {
        let c = conn.index();
        if self.queued.len() <= c {
            self.queued.resize(c + 1, false);
        }
        if !self.queued[c] {
            self.queued[c] = true;
            self.queue.push_back(conn);
        }
    }

    /// The next connection to serve.
    pub fn pop(&mut self) -> Option<Slot> {
        let c = self.queue.pop_front()?;
        self.queued[c.index()] = false;
        Some(c)
    }

    /// Connections queued.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether none is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Forgets `conn` (it is gone; its slot may be reused).
    pub fn remove(&mut self, conn: Slot) {
        if self.queued.get(conn.index()).copied().unwrap_or(false) {
            self.queue.retain(|&c| c != conn);
            self.queued[conn.index()] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_once_in_order() {
        let mut q = ReadyQueue::new();
        for c in [5, 1, 5, 9, 1] {
            q.push(Slot(c));
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop(), Some(Slot(5)));
        q.push(Slot(5)); // again after being served: at the back
        q.remove(Slot(9));
        assert_eq!([q.pop(), q.pop(), q.pop()], [Some(Slot(1)), Some(Slot(5)), None]);
        assert!(q.is_empty());
    }
}
