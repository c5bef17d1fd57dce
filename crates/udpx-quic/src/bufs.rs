//! Stream data quiche takes without copying it.
//!
//! quiche copies what `stream_send` and `h3::Connection::send_body` are given into a buffer of
//! its own (one allocation and one copy per call), then copies again from there into each
//! packet it builds. With a buffer factory (`quiche::BufFactory`) an application can hand
//! quiche a buffer it filled itself (`stream_send_zc`, `send_body_zc`): the file server reads
//! a file straight into a [`Buf`], and the only user-space copy of a body byte after the read
//! is quiche's into the packet. Every connection of a [`crate::Host`] is a
//! [`Connection`] (quiche's, on [`Bufs`]).
//!
//! A [`Buf`] is a range of a shared [`Block`], with room kept before it so the HTTP/3 DATA
//! frame's header goes in front of the body without a buffer of its own
//! (`BufSplit::try_add_prefix`). A [`BufPool`] hands the blocks out again once quiche has
//! dropped every range of them (all acknowledged): no allocation per chunk in steady state. A
//! block may also be *metered* ([`Block::metered`]): it counts its bytes in a shared gauge for
//! as long as it lives, in a cache or in packets not yet acknowledged, so a cache's bound
//! counts what its evicted blocks still hold.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Room kept before a [`Buf`]'s bytes for a frame header (an HTTP/3 DATA frame's is at most
/// 1 + 8 bytes).
pub const HEADROOM: usize = 16;

/// quiche's connection on this crate's buffers: what a [`crate::App`] is handed.
pub type Connection = quiche::Connection<Bufs>;

/// The buffer factory of every connection a [`crate::Host`] makes.
#[derive(Debug, Clone, Default)]
pub struct Bufs;

impl quiche::BufFactory for Bufs {
    type Buf = Buf;
    type DgramBuf = Vec<u8>;

    fn buf_from_slice(buf: &[u8]) -> Buf {
        let mut v = Vec::with_capacity(buf.len());
        v.extend_from_slice(buf);
        Buf { end: v.len(), data: Arc::new(Block { bytes: v, meter: None }), start: 0 }
    }

    fn dgram_buf_from_slice(buf: &[u8]) -> Vec<u8> {
        buf.to_vec()
    }
}

/// Bytes quiche can hold without copying: `data[start..end]`, shared.
#[derive(Debug, Clone, Default)]
pub struct Buf {
    data: Arc<Block>,
    start: usize,
    end: usize,
}

/// A vector [`Buf`]s share: [`HEADROOM`] bytes, then the bytes they hold.
#[derive(Debug, Default)]
pub struct Block {
    bytes: Vec<u8>,
    /// Counts the vector's length while it lives ([`Block::metered`]).
    meter: Option<Arc<AtomicUsize>>,
}

impl Block {
    /// A zeroed block of `len` bytes (after the headroom) whose size `meter` counts until it
    /// is dropped (by its last holder: a cache, or quiche once every range is acknowledged).
    pub fn metered(len: usize, meter: &Arc<AtomicUsize>) -> Block {
        let bytes = vec![0u8; HEADROOM + len];
        meter.fetch_add(bytes.len(), Relaxed);
        Block { bytes, meter: Some(meter.clone()) }
    }

    /// Its bytes after the headroom, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[HEADROOM..]
    }

    /// Its length after the headroom.
    pub fn len(&self) -> usize {
        self.bytes.len() - HEADROOM
    }

    /// Whether it holds no byte after the headroom.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(m) = &self.meter {
            m.fetch_sub(self.bytes.len(), Relaxed);
        }
    }
}

impl Buf {
    /// The bytes `[HEADROOM..HEADROOM + len)` of `data` (a vector of a [`BufPool`], filled).
    fn filled(data: Arc<Block>, len: usize) -> Buf {
        Buf { data, start: HEADROOM, end: HEADROOM + len }
    }

    /// `len` bytes of `block` from `offset` (counted after its headroom), shared: a slice of a
    /// cached block, sent without a copy. `None` past its end.
    pub fn of(block: &Arc<Block>, offset: usize, len: usize) -> Option<Buf> {
        let start = HEADROOM.checked_add(offset)?;
        let end = start.checked_add(len)?;
        (end <= block.bytes.len()).then(|| Buf { data: block.clone(), start, end })
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.data.bytes[self.start..self.end]
    }
}

impl quiche::BufSplit for Buf {
    fn split_at(&mut self, at: usize) -> Buf {
        let at = (self.start + at).min(self.end);
        let rest = Buf { data: self.data.clone(), start: at, end: self.end };
        self.end = at;
        rest
    }

    fn try_add_prefix(&mut self, prefix: &[u8]) -> bool {
        if self.start < prefix.len() {
            return false;
        }
        let before = self.start - prefix.len()..self.start;
        // Written there at the fill (the caller knew the header): nothing to copy.
        if self.data.bytes[before.clone()] == *prefix {
            self.start -= prefix.len();
            return true;
        }
        // Else only while nothing else holds the vector: quiche may hold the bytes before ours.
        let Some(v) = Arc::get_mut(&mut self.data) else { return false };
        v.bytes[before].copy_from_slice(prefix);
        self.start -= prefix.len();
        true
    }
}

/// Vectors of one size handed out as [`Buf`]s and taken back once every range of them is
/// dropped. Bounded: past `max` vectors in use, a new one is made and not kept.
#[derive(Debug)]
pub struct BufPool {
    size: usize,
    max: usize,
    vecs: Vec<Arc<Block>>,
    /// Where the next search for a free vector starts (round robin).
    next: usize,
    /// Vectors made (not taken from the pool).
    pub made: u64,
}

impl BufPool {
    /// A pool of vectors that hold `size` bytes after [`HEADROOM`], at most `max` kept.
    pub fn new(size: usize, max: usize) -> BufPool {
        BufPool { size, max, vecs: Vec::new(), next: 0, made: 0 }
    }

    /// A [`Buf`] of `len` bytes (at most the pool's size) that `fill` writes, with `prefix`
    /// written just before them (the header the bytes will go out with, when the caller can
    /// tell: [`quiche::BufSplit::try_add_prefix`] then finds it in place; at most
    /// [`HEADROOM`] bytes, more are not written). The vector is one no one else holds: a kept
    /// one quiche has let go of, else a new one. `fill`'s error is returned as is.
    pub fn fill<E>(
        &mut self,
        len: usize,
        prefix: &[u8],
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Buf, E> {
        let len = len.min(self.size);
        let prefix = if prefix.len() <= HEADROOM { prefix } else { &[] };
        let write = |b: &mut Block| {
            b.bytes[HEADROOM - prefix.len()..HEADROOM].copy_from_slice(prefix);
            fill(&mut b.bytes[HEADROOM..HEADROOM + len])
        };
        let n = self.vecs.len();
        // A few looks, not a walk over the pool: quiche lets go of vectors roughly in order.
        let found = (0..n.min(8)).map(|k| (self.next + k) % n).find(|&i| Arc::strong_count(&self.vecs[i]) == 1);
        let i = match found {
            Some(i) => i,
            None => {
                self.made += 1;
                let mut v = Block { bytes: vec![0u8; HEADROOM + self.size], meter: None };
                if n >= self.max {
                    // Not kept: the pool is at its bound.
                    write(&mut v)?;
                    return Ok(Buf::filled(Arc::new(v), len));
                }
                self.vecs.push(Arc::new(v));
                n
            }
        };
        self.next = (i + 1) % self.vecs.len();
        // Unique: its count was 1, or it was just made.
        let v = Arc::get_mut(&mut self.vecs[i]).expect("a free vector is held by the pool alone");
        write(v)?;
        Ok(Buf::filled(self.vecs[i].clone(), len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiche::BufSplit;

    /// A fill that writes `bytes`.
    fn put(bytes: &[u8]) -> impl FnOnce(&mut [u8]) -> Result<(), ()> + '_ {
        move |s| {
            s.copy_from_slice(bytes);
            Ok(())
        }
    }

    /// A fill that writes `n` everywhere.
    fn all(n: u8) -> impl FnOnce(&mut [u8]) -> Result<(), ()> {
        move |s| {
            s.fill(n);
            Ok(())
        }
    }

    #[test]
    fn a_prefix_goes_into_the_headroom_only_while_unshared() {
        let mut pool = BufPool::new(64, 4);
        let mut b = pool.fill(10, &[], put(b"0123456789")).unwrap();
        // The pool holds the vector too: a prefix not written at the fill is refused.
        assert!(!b.try_add_prefix(&[0, 10]));
        let mut b = pool.fill(10, &[0, 10], put(b"0123456789")).unwrap();
        assert!(b.try_add_prefix(&[0, 10]));
        assert_eq!(b.as_ref(), b"\x00\x0a0123456789");
        let rest = b.split_at(5);
        assert_eq!((b.as_ref(), rest.as_ref()), (&b"\x00\x0a012"[..], &b"3456789"[..]));
        // `rest` shares the vector: no prefix written into it (its bytes before are b's).
        let mut rest = rest;
        assert!(!rest.try_add_prefix(&[9]));
        // A vector no one else holds takes any prefix (a Buf of quiche's own making).
        let mut own = <Bufs as quiche::BufFactory>::buf_from_slice(b"abc");
        assert!(!own.try_add_prefix(&[1]), "no headroom");
        let _ = own;
    }

    #[test]
    fn vectors_come_back_once_every_range_is_dropped() {
        let mut pool = BufPool::new(32, 2);
        let a = pool.fill(8, &[], all(1)).unwrap();
        let b = pool.fill(8, &[], all(2)).unwrap();
        assert_eq!(pool.made, 2);
        // Both held: a third is made and not kept.
        let c = pool.fill(8, &[], all(3)).unwrap();
        assert_eq!(pool.made, 3);
        drop((a, c));
        // The first came back: reused, refilled, nothing made.
        let d = pool.fill(4, &[], all(4)).unwrap();
        assert_eq!((pool.made, d.as_ref()), (3, &[4u8; 4][..]));
        assert_eq!(b.as_ref(), &[2u8; 8][..], "a held vector is never refilled");
    }

    #[test]
    fn a_metered_block_counts_until_its_last_range_is_dropped() {
        let meter = Arc::new(AtomicUsize::new(0));
        let mut block = Block::metered(100, &meter);
        block.bytes_mut().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let block = Arc::new(block);
        assert_eq!(meter.load(Relaxed), HEADROOM + 100);
        let slice = Buf::of(&block, 10, 5).unwrap();
        assert_eq!(slice.as_ref(), &[10, 11, 12, 13, 14]);
        assert!(Buf::of(&block, 96, 5).is_none(), "past its end");
        assert!(Buf::of(&block, usize::MAX, 1).is_none());
        drop(block);
        assert_eq!(meter.load(Relaxed), HEADROOM + 100, "a range still holds it");
        drop(slice);
        assert_eq!(meter.load(Relaxed), 0);
    }

    #[test]
    fn a_failed_fill_returns_its_error() {
        let mut pool = BufPool::new(8, 1);
        assert_eq!(pool.fill(4, &[], |_| Err::<(), _>("short read")).unwrap_err(), "short read");
    }
}
