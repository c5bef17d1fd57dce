//! Zerocopy send (`MSG_ZEROCOPY`): owned buffers that come back only after the kernel's
//! completion, and a policy that turns zerocopy off where the kernel copies anyway. This file
//! holds the pure parts (pool, buffers, the completion tracker, the per-socket state); the
//! socket's zerocopy methods are in `zc_send.rs`.
//!
//! ```text
//!  ZcPool::get ─► ZcBuf (yours: fill it) ─► UdpSocket::send_zerocopy ─► in flight (the
//!       ▲                                       socket's tracker owns it; you cannot reach it)
//!       └──────── completion for every id it used (error queue, read by reap_completions)
//! ```
//!
//! - Ownership makes early reuse impossible: a buffer is moved into the send and only the
//!   tracker can hand it back, when every zerocopy id its send consumed has completed (the
//!   kernel reports inclusive, 32-bit wrapping id ranges `ee_info..=ee_data`).
//! - A socket dropped with sends in flight first waits (bounded) for their completions and then
//!   *leaks* the rest: freed memory reused by the allocator could otherwise go out on the wire.
//! - Zerocopy pays only for large sends (the paper: GSO super-buffers, cold data). Sends below
//!   the threshold are copied. When completions keep saying "copied" (local delivery over lo
//!   and veth always copies; a device without scatter-gather does too), the socket turns
//!   zerocopy off: the pinning and notification would be pure cost. The change is recorded in
//!   [`Capabilities`](crate::Capabilities), logged once and counted.
//! - ENOBUFS on a zerocopy send (optmem exhausted by notifications) sends the same data by
//!   copying at once, counted. At most `max_inflight` sends are outstanding: past that, a send
//!   first waits for completions (backpressure instead of ENOBUFS).

use std::collections::VecDeque;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::SendError;

/// Default size threshold: zerocopy for sends of at least this many bytes (GSO super-buffers).
pub const DEFAULT_THRESHOLD: usize = 16 << 10;
/// Default bound on sends in flight.
pub const DEFAULT_MAX_INFLIGHT: usize = 256;
/// Consecutive copied completions (with none zerocopied ever) after which zerocopy turns off.
pub const COPIED_LIMIT: u64 = 8;
/// How long a dropped socket waits for outstanding completions before leaking the buffers.
pub const DROP_WAIT: Duration = Duration::from_secs(1);

/// Settings for zerocopy on a socket ([`SocketConfig::zerocopy`](crate::SocketConfig)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZcConfig {
    /// Sends of at least this many bytes use MSG_ZEROCOPY; smaller ones are copied.
    pub threshold: usize,
    /// Most zerocopy sends in flight.
    pub max_inflight: usize,
    /// Turn zerocopy off after this many copied completions in a row when none ever avoided
    /// the copy; 0 keeps it on regardless (to measure what zerocopy costs where it copies).
    pub copied_limit: u64,
}

impl Default for ZcConfig {
    fn default() -> Self {
        ZcConfig { threshold: DEFAULT_THRESHOLD, max_inflight: DEFAULT_MAX_INFLIGHT, copied_limit: COPIED_LIMIT }
    }
}

struct PoolInner {
    /// FIFO: a returned buffer goes to the back, so a large pool rotates through all its
    /// memory (cold data, as the paper's cache-thrashing runs).
    free: Mutex<VecDeque<Box<[u8]>>>,
    buf_size: usize,
}

/// A pool of equal-size send buffers. Clone it freely (it is shared).
#[derive(Clone)]
pub struct ZcPool(Arc<PoolInner>);

impl fmt::Debug for ZcPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZcPool").field("buf_size", &self.0.buf_size).field("free", &self.free()).finish()
    }
}

impl ZcPool {
    /// `count` buffers of `buf_size` bytes, allocated (zeroed) now.
    pub fn new(buf_size: usize, count: usize) -> Self {
        let free = (0..count).map(|_| vec![0u8; buf_size].into_boxed_slice()).collect();
        ZcPool(Arc::new(PoolInner { free: Mutex::new(free), buf_size }))
    }

    /// A free buffer, or `None` when every buffer is in use or in flight.
    pub fn get(&self) -> Option<ZcBuf> {
        let data = self.0.free.lock().unwrap_or_else(|e| e.into_inner()).pop_front()?;
        let len = data.len();
        Some(ZcBuf { data: Some(data), len, pool: self.0.clone() })
    }

    /// Free buffers now.
    pub fn free(&self) -> usize {
        self.0.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Size of every buffer.
    pub fn buf_size(&self) -> usize {
        self.0.buf_size
    }
}

/// A buffer from a [`ZcPool`]. Dropping it returns it to the pool; sending it moves it into the
/// socket until the kernel is done with it.
pub struct ZcBuf {
    data: Option<Box<[u8]>>,
    len: usize,
    pool: Arc<PoolInner>,
}

impl fmt::Debug for ZcBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZcBuf").field("len", &self.len).finish()
    }
}

impl ZcBuf {
    /// Sets how many bytes (from the start) are sent. At most the buffer's capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// The whole buffer's size.
    pub fn capacity(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.len())
    }

    /// The whole buffer (not just the bytes to send).
    pub fn full(&self) -> &[u8] {
        self.data.as_deref().unwrap_or(&[])
    }

    /// The whole buffer, to fill.
    pub fn full_mut(&mut self) -> &mut [u8] {
        self.data.as_deref_mut().unwrap_or(&mut [])
    }

    /// Keeps the memory alive forever: used when the kernel may still read it.
    pub(crate) fn leak(mut self) {
        if let Some(d) = self.data.take() {
            Box::leak(d);
        }
    }
}

impl Deref for ZcBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data.as_deref().unwrap_or(&[])[..self.len]
    }
}

impl DerefMut for ZcBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.data.as_deref_mut().unwrap_or(&mut [])[..len]
    }
}

impl Drop for ZcBuf {
    fn drop(&mut self) {
        if let Some(d) = self.data.take() {
            self.pool.free.lock().unwrap_or_else(|e| e.into_inner()).push_back(d);
        }
    }
}

/// Tracks zerocopy ids in flight: which item (buffer) owns which ids, and which completed.
///
/// The kernel hands out ids in order, starting at 0 and wrapping at 2^32: one per send call
/// it took with MSG_ZEROCOPY, and also one per call that failed *after* it built the packet
/// (`udp_send_skb`: EINVAL for SO_NO_CHECK or too many segments, EIO, a qdisc or netfilter
/// drop); such a call's id is completed at once, while the call is still returning. A send of
/// one buffer can consume several ids (a GSO transmit re-sent as plain datagrams); its item
/// comes back when all of them completed.
///
/// A send in progress is an *open* entry: [`CompletionTracker::open`], then
/// [`CompletionTracker::extend_open`] for each id its calls consume, then
/// [`CompletionTracker::close_open`] with the item. Completions that arrive while it is open
/// are recorded against it, and nothing is released or retired before it closes.
#[derive(Debug)]
pub struct CompletionTracker<T> {
    /// Id of the front entry's first id.
    front: u32,
    entries: VecDeque<Entry<T>>,
    /// Ids in flight (sum of entry sizes).
    ids: u64,
}

#[derive(Debug)]
struct Entry<T> {
    done: Vec<bool>,
    remaining: u32,
    item: Option<T>,
    open: bool,
}

impl<T> CompletionTracker<T> {
    /// Starting at id `first` (0 for a new socket).
    pub fn new(first: u32) -> Self {
        CompletionTracker { front: first, entries: VecDeque::new(), ids: 0 }
    }

    /// The id the next send will get.
    pub fn next_id(&self) -> u32 {
        self.front.wrapping_add(self.ids as u32)
    }

    /// Items in flight.
    pub fn len(&self) -> usize {
        self.entries.iter().filter(|e| e.item.is_some()).count()
    }

    /// Nothing in flight.
    pub fn is_empty(&self) -> bool {
        self.ids == 0
    }

    /// Records a send that consumed `n` ids (≥ 1) and owns `item` until they complete.
    pub fn push(&mut self, n: u32, item: T) {
        let n = n.max(1);
        self.entries.push_back(Entry { done: vec![false; n as usize], remaining: n, item: Some(item), open: false });
        self.ids += u64::from(n);
    }

    /// Starts the entry of a send in progress (no ids yet).
    pub fn open(&mut self) {
        self.entries.push_back(Entry { done: Vec::new(), remaining: 0, item: None, open: true });
    }

    /// The open entry consumed `n` more ids (the next ones). No-op without an open entry.
    pub fn extend_open(&mut self, n: u32) {
        if let Some(e) = self.entries.back_mut().filter(|e| e.open) {
            e.done.resize(e.done.len() + n as usize, false);
            e.remaining += n;
            self.ids += u64::from(n);
        }
    }

    /// Ids the open entry has consumed so far (0 without one).
    pub fn open_ids(&self) -> u32 {
        self.entries.back().filter(|e| e.open).map_or(0, |e| e.done.len() as u32)
    }

    /// Closes the open entry, which owns `item` until its ids complete. Returns the item at
    /// once when none is outstanding (no id consumed, or all completed already).
    pub fn close_open(&mut self, item: T) -> Option<T> {
        let Some(e) = self.entries.back_mut().filter(|e| e.open) else { return Some(item) };
        e.open = false;
        let back = if e.remaining == 0 {
            Some(item)
        } else {
            e.item = Some(item);
            None
        };
        self.retire();
        back
    }

    /// Marks the inclusive, wrapping range `lo..=hi` complete; returns the items whose ids have
    /// all completed. Ids not in flight (duplicates, garbage) are ignored.
    pub fn complete(&mut self, lo: u32, hi: u32) -> Vec<T> {
        let mut out = Vec::new();
        if self.ids == 0 {
            return out;
        }
        // Offsets into the window [front, front + ids), in wrapping id space.
        let span = hi.wrapping_sub(lo) as u64;
        let (mut off, last) = if self.front.wrapping_sub(lo) as u64 <= span {
            // The range starts at or before the window and reaches into it.
            (0, hi.wrapping_sub(self.front) as u64)
        } else {
            let o = lo.wrapping_sub(self.front) as u64;
            (o, o + span)
        };
        if off >= self.ids {
            return out;
        }
        let end = last.min(self.ids - 1) + 1;
        // Find the entry holding `off`.
        let mut idx = 0;
        let mut base = 0u64;
        while idx < self.entries.len() && off < end {
            let n = self.entries[idx].done.len() as u64;
            if off >= base + n {
                base += n;
                idx += 1;
                continue;
            }
            let e = &mut self.entries[idx];
            let i = (off - base) as usize;
            if !e.done[i] {
                e.done[i] = true;
                e.remaining -= 1;
                if e.remaining == 0 && !e.open {
                    if let Some(item) = e.item.take() {
                        out.push(item);
                    }
                }
            }
            off += 1;
        }
        self.retire();
        out
    }

    /// Retires finished, closed entries at the front so the window moves on.
    fn retire(&mut self) {
        while let Some(e) = self.entries.front() {
            if e.remaining != 0 || e.open {
                break;
            }
            let n = e.done.len() as u32;
            self.front = self.front.wrapping_add(n);
            self.ids -= n as u64;
            self.entries.pop_front();
        }
    }

    /// Takes every item still in flight (for leaking on drop).
    pub fn take_all(&mut self) -> Vec<T> {
        let out = self.entries.iter_mut().filter_map(|e| e.item.take()).collect();
        out
    }
}

/// What the tracker keeps alive for the kernel until its ids complete: a buffer sent whole
/// ([`UdpSocket::send_zerocopy`](crate::UdpSocket::send_zerocopy)), or a share of a buffer its
/// owner writes again only once no share is left
/// ([`UdpSocket::try_send_zerocopy`](crate::UdpSocket::try_send_zerocopy)).
#[derive(Debug)]
pub(crate) enum Held {
    Own(ZcBuf),
    Shared(Arc<ZcBuf>),
}

impl Held {
    /// Keeps the memory alive forever (the kernel may still read it).
    pub(crate) fn leak(self) {
        match self {
            Held::Own(b) => b.leak(),
            Held::Shared(b) => std::mem::forget(b),
        }
    }
}

/// The zerocopy state of one socket.
#[derive(Debug)]
pub(crate) struct ZcState {
    pub cfg: ZcConfig,
    pub tracker: CompletionTracker<Held>,
    /// Completions that said copied, in a row.
    pub copied_in_row: u64,
    /// Completions that did not copy, ever.
    pub zerocopied: u64,
}

impl ZcState {
    pub(crate) fn new(cfg: ZcConfig) -> Self {
        ZcState { cfg, tracker: CompletionTracker::new(0), copied_in_row: 0, zerocopied: 0 }
    }
}

/// A zerocopy send that did not go out: the buffer comes back with the reason.
#[derive(Debug)]
pub struct ZcSendError {
    /// The buffer, when the kernel can no longer read it (no part of it is in flight); `None`
    /// while part of it went with MSG_ZEROCOPY: it returns to its pool on completion.
    pub buf: Option<ZcBuf>,
    /// Why.
    pub error: SendError,
}

impl fmt::Display for ZcSendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "zerocopy send: {}", self.error)
    }
}

impl std::error::Error for ZcSendError {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn pool_round_trip() {
        let pool = ZcPool::new(100, 2);
        let mut a = pool.get().unwrap();
        let _b = pool.get().unwrap();
        assert!(pool.get().is_none(), "all buffers out");
        a.set_len(10);
        a.copy_from_slice(&[7; 10]);
        assert_eq!(&a[..], &[7; 10]);
        drop(a);
        assert_eq!(pool.free(), 1);
    }

    #[test]
    fn tracker_basics_and_multi_id_sends() {
        let mut t = CompletionTracker::new(0);
        t.push(1, "a");
        t.push(3, "b"); // ids 1..=3
        t.push(1, "c"); // id 4
        assert_eq!(t.next_id(), 5);
        assert_eq!(t.complete(1, 2), Vec::<&str>::new(), "b needs id 3 too");
        assert_eq!(t.complete(4, 4), vec!["c"], "out of order is fine");
        assert_eq!(t.complete(0, 0), vec!["a"]);
        assert_eq!(t.complete(3, 3), vec!["b"]);
        assert!(t.is_empty());
        assert_eq!(t.next_id(), 5);
        assert_eq!(t.complete(9, 100), Vec::<&str>::new(), "ids not in flight are ignored");
    }

    #[test]
    fn tracker_wraps_at_u32() {
        let mut t = CompletionTracker::new(u32::MAX - 1);
        t.push(1, 1);
        t.push(2, 2); // ids MAX, 0
        t.push(1, 3); // id 1
        assert_eq!(t.complete(u32::MAX - 1, 1), vec![1, 2, 3], "one range across the wrap");
        assert_eq!(t.next_id(), 2);
    }

    proptest! {
        /// Differential: the tracker against a plain model (id -> item, item -> ids left).
        #[test]
        fn tracker_matches_model(
            start in prop_oneof![Just(0u32), Just(u32::MAX - 20), any::<u32>()],
            ops in proptest::collection::vec((1u32..4, 0u32..6, 0u32..6), 1..60),
        ) {
            let mut t = CompletionTracker::new(start);
            let mut owner: HashMap<u32, usize> = HashMap::new();
            let mut left: HashMap<usize, u32> = HashMap::new();
            let mut next = start;
            let mut released_model = Vec::new();
            let mut released = Vec::new();
            for (i, (n, a, b)) in ops.into_iter().enumerate() {
                t.push(n, i);
                for k in 0..n { owner.insert(next.wrapping_add(k), i); }
                left.insert(i, n);
                next = next.wrapping_add(n);
                // Complete a range somewhere in the recent ids (possibly overlapping).
                let lo = next.wrapping_sub(1 + a.min(next.wrapping_sub(start)));
                let hi = lo.wrapping_add(b.min(next.wrapping_sub(lo).wrapping_sub(1)));
                let mut id = lo;
                loop {
                    if let Some(item) = owner.remove(&id) {
                        let l = left.get_mut(&item).unwrap();
                        *l -= 1;
                        if *l == 0 { released_model.push(item); }
                    }
                    if id == hi { break; }
                    id = id.wrapping_add(1);
                }
                released.extend(t.complete(lo, hi));
                let mut x = released.clone(); x.sort();
                let mut y = released_model.clone(); y.sort();
                prop_assert_eq!(x, y);
            }
        }
    }
}
