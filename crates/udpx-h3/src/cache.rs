//! A body read once (issue 47): a bounded cache of file blocks shared by a server's shards, so
//! that the same segment sent to thousands of viewers comes from the file once and is sealed
//! into packets straight from the cached block (no copy of its own: quiche takes slices of it,
//! [`udpx_quic::bufs::Buf::of`]).
//!
//! - **Keys**: a block is [`BLOCK`] bytes of one version of one file at an aligned offset: the
//!   file's device, inode, size, modification and change times ([`FileId`], from the `fstat`
//!   of the descriptor the response opened) and the block's index. Ranges and live segments
//!   hit the same blocks; a file replaced by rename is another inode, so its old and new bytes
//!   never mix; an in-place rewrite changes the change time, and a fill that saw the file
//!   change under it (its [`FileId`] before and after the read differ) is not kept and fails
//!   its response, as a file that shrank does.
//! - **The bound** (`--cache-size`) counts every cached block's bytes for as long as the block
//!   lives: in the cache, and after its eviction while packets not yet acknowledged still hold
//!   slices of it ([`udpx_quic::bufs::Block::metered`]). A fill that finds no room once the
//!   least recently used blocks are evicted is not cached: its response reads the file as
//!   without a cache (a file larger than the cache streams). Memory is bounded whatever the
//!   number of paths: entries are blocks, at most the bound over the smallest block.
//! - **Where the work is**: a lookup takes one lock (a hash map and a recency list); a fill
//!   reads outside the lock, on the shard thread, from the page cache only: a block the page
//!   cache lacks is read by the disk thread first (`crate::disk`).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use udpx_quic::bufs::Block;

/// HTTP/3's read for a longer body, whatever its stream takes at the moment: one system call
/// per 256 KiB instead of one per turn's capacity (issue 47). The stream takes slices of it,
/// and the cache keeps bodies in blocks of this size.
pub const BLOCK: usize = 256 * 1024;

/// One version of one file: what a cached block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileId {
    /// The version `meta` (an `fstat`) describes.
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The file's size in this version.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// What the cache counts, for /metrics and the bench.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheCounters {
    /// The bound, bytes (`--cache-size`).
    pub capacity: u64,
    /// Blocks found.
    pub hits: u64,
    /// Blocks read from a file and kept.
    pub misses: u64,
    /// Blocks read from a file and not kept: no room once evictions were done, or the file
    /// changed under the read.
    pub uncached: u64,
    /// Of them, those whose file changed under the read.
    pub changed: u64,
    /// Bytes read from files into the cache.
    pub bytes_filled: u64,
    /// Blocks evicted (least recently used first).
    pub evictions: u64,
    /// Blocks in the cache now (a level).
    pub blocks: u64,
    /// Bytes of cached blocks alive now, evicted ones that packets still hold included (a
    /// level, at most `capacity`).
    pub held: u64,
}

/// The cache (see the module docs). Shared by a server's shards.
#[derive(Debug)]
pub struct BlockCache {
    capacity: usize,
    /// Bytes of its blocks alive (in the map or held by packets).
    held: Arc<AtomicUsize>,
    map: Mutex<Lru>,
    hits: AtomicU64,
    misses: AtomicU64,
    uncached: AtomicU64,
    changed: AtomicU64,
    bytes_filled: AtomicU64,
    evictions: AtomicU64,
}

/// The blocks by key, and by last use.
#[derive(Debug, Default)]
struct Lru {
    blocks: HashMap<(FileId, u64), (Arc<Block>, u64)>,
    by_use: BTreeMap<u64, (FileId, u64)>,
    tick: u64,
}

impl Lru {
    fn touch(&mut self, key: (FileId, u64)) -> Option<Arc<Block>> {
        self.tick += 1;
        let tick = self.tick;
        let (block, used) = self.blocks.get_mut(&key)?;
        self.by_use.remove(used);
        *used = tick;
        self.by_use.insert(tick, key);
        Some(block.clone())
    }

    fn insert(&mut self, key: (FileId, u64), block: Arc<Block>) {
        self.tick += 1;
        if let Some((_, used)) = self.blocks.insert(key, (block, self.tick)) {
            self.by_use.remove(&used);
        }
        self.by_use.insert(self.tick, key);
    }

    /// Drops the least recently used block; `false` when none is left.
    fn evict_one(&mut self) -> bool {
        let Some((_, key)) = self.by_use.pop_first() else { return false };
        self.blocks.remove(&key);
        true
    }
}

/// What [`BlockCache::block`] found.
#[derive(Debug)]
pub enum Found {
    /// The block, found in the cache.
    Block(Arc<Block>),
    /// The block, read from the file now and kept.
    Filled(Arc<Block>),
    /// No room for it: read it as without a cache.
    NoRoom,
}

impl BlockCache {
    /// A cache that holds at most `capacity` bytes of blocks.
    pub fn new(capacity: usize) -> BlockCache {
        BlockCache {
            capacity,
            held: Arc::default(),
            map: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            uncached: AtomicU64::new(0),
            changed: AtomicU64::new(0),
            bytes_filled: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The block of `file` (version `id`) holding byte `offset`: found, or read now
    /// (positionally: the descriptor's offset is not used) and kept if there is room. `Err`
    /// when the read failed or came short, or the file changed under it (`fstat` after the
    /// read differs from `id`): its bytes are not the version the response promised.
    pub fn block(&self, file: &File, id: &FileId, offset: u64) -> std::io::Result<Found> {
        self.block_with(file, id, offset, |f, buf, at| f.read_exact_at(buf, at))
    }

    /// [`BlockCache::block`], reading a missing block with `read` (the responder's reads
    /// only from the page cache, `crate::disk`): an `Err` of `read` keeps nothing and is
    /// returned as it is.
    pub fn block_with(
        &self,
        file: &File,
        id: &FileId,
        offset: u64,
        read: impl FnOnce(&File, &mut [u8], u64) -> std::io::Result<()>,
    ) -> std::io::Result<Found> {
        let index = offset / BLOCK as u64;
        let key = (*id, index);
        if let Some(b) = self.lock().touch(key) {
            self.hits.fetch_add(1, Relaxed);
            return Ok(Found::Block(b));
        }
        let start = index * BLOCK as u64;
        let len = (BLOCK as u64).min(id.size.saturating_sub(start)) as usize;
        let Some(mut block) = self.reserve(len) else {
            self.uncached.fetch_add(1, Relaxed);
            return Ok(Found::NoRoom);
        };
        read(file, block.bytes_mut(), start)?;
        self.bytes_filled.fetch_add(len as u64, Relaxed);
        if FileId::of(&file.metadata()?) != *id {
            self.uncached.fetch_add(1, Relaxed);
            self.changed.fetch_add(1, Relaxed);
            return Err(std::io::Error::other("the file changed while it was read"));
        }
        let block = Arc::new(block);
        self.misses.fetch_add(1, Relaxed);
        self.lock().insert(key, block.clone());
        Ok(Found::Filled(block))
    }

    /// A metered block of `len` bytes, once least recently used blocks are evicted until it
    /// fits; `None` if it cannot (evicted blocks that packets still hold count until
    /// acknowledged). The check and the block's count are made under the lock, so shards
    /// filling at once cannot pass the bound together.
    fn reserve(&self, len: usize) -> Option<Block> {
        let size = udpx_quic::bufs::HEADROOM + len;
        if size > self.capacity {
            return None;
        }
        let mut lru = self.lock();
        while self.held.load(Relaxed) + size > self.capacity {
            if !lru.evict_one() {
                return None;
            }
            self.evictions.fetch_add(1, Relaxed);
        }
        Some(Block::metered(len, &self.held))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its counters now.
    pub fn counters(&self) -> CacheCounters {
        CacheCounters {
            capacity: self.capacity as u64,
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            uncached: self.uncached.load(Relaxed),
            changed: self.changed.load(Relaxed),
            bytes_filled: self.bytes_filled.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            blocks: self.lock().blocks.len() as u64,
            held: self.held.load(Relaxed) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file(dir: &std::path::Path, name: &str, bytes: &[u8]) -> (File, FileId) {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        let f = File::open(&p).unwrap();
        let id = FileId::of(&f.metadata().unwrap());
        (f, id)
    }

    fn tmp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("udpx-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn block(found: Found) -> Arc<Block> {
        match found {
            Found::Block(b) | Found::Filled(b) => b,
            Found::NoRoom => panic!("no room"),
        }
    }

    #[test]
    fn a_block_is_read_once_and_ranges_hit_it() {
        let d = tmp("once");
        let bytes: Vec<u8> = (0..BLOCK + 1000).map(|i| (i % 251) as u8).collect();
        let (f, id) = file(&d, "a", &bytes);
        let c = BlockCache::new(4 * BLOCK);
        let first = block(c.block(&f, &id, 0).unwrap());
        let again = block(c.block(&f, &id, 1234).unwrap());
        assert!(Arc::ptr_eq(&first, &again), "the same block");
        let tail = block(c.block(&f, &id, BLOCK as u64 + 10).unwrap());
        assert_eq!(tail.len(), 1000, "the last block is the file's tail");
        let buf = udpx_quic::bufs::Buf::of(&tail, 0, 1000).unwrap();
        assert_eq!(buf.as_ref(), &bytes[BLOCK..]);
        let k = c.counters();
        assert_eq!((k.hits, k.misses, k.bytes_filled), (1, 2, bytes.len() as u64), "{k:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_bound_counts_evicted_blocks_that_are_still_held() {
        let d = tmp("bound");
        let bytes = vec![7u8; 3 * BLOCK];
        let (f, id) = file(&d, "a", &bytes);
        let room = 2 * (BLOCK + udpx_quic::bufs::HEADROOM);
        let c = BlockCache::new(room);
        let b0 = block(c.block(&f, &id, 0).unwrap());
        let b1 = block(c.block(&f, &id, BLOCK as u64).unwrap());
        // Both held by "packets": a third block finds no room even after evicting both.
        assert!(matches!(c.block(&f, &id, 2 * BLOCK as u64).unwrap(), Found::NoRoom));
        let k = c.counters();
        assert_eq!((k.evictions, k.blocks, k.uncached), (2, 0, 1), "{k:?}");
        assert_eq!(k.held as usize, room, "evicted but held: still counted");
        drop((b0, b1));
        assert_eq!(c.counters().held, 0, "freed once acknowledged");
        let _b2 = block(c.block(&f, &id, 2 * BLOCK as u64).unwrap());
        assert!(c.counters().held as usize <= room);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_replaced_file_is_another_version_and_an_in_place_change_is_refused() {
        let d = tmp("change");
        let (f, id) = file(&d, "a", &[1u8; 5000]);
        let c = BlockCache::new(4 * BLOCK);
        let old = block(c.block(&f, &id, 0).unwrap());
        // Replaced by rename: a new inode, a new key; the old version's block is untouched.
        std::fs::write(d.join("a.new"), [2u8; 5000]).unwrap();
        std::fs::rename(d.join("a.new"), d.join("a")).unwrap();
        let f2 = File::open(d.join("a")).unwrap();
        let id2 = FileId::of(&f2.metadata().unwrap());
        assert_ne!(id, id2);
        let new = block(c.block(&f2, &id2, 0).unwrap());
        assert_eq!((old.len(), udpx_quic::bufs::Buf::of(&new, 0, 3).unwrap().as_ref()), (5000, &[2u8; 3][..]));
        // Rewritten in place after the response looked at it: the read sees another version.
        std::fs::OpenOptions::new().write(true).open(d.join("a")).unwrap().write_all(&[3u8; 10]).unwrap();
        // In this cache a hit: the block read before the change, whole and of one version.
        assert!(Arc::ptr_eq(&block(c.block(&f2, &id2, 0).unwrap()), &new));
        let c2 = BlockCache::new(4 * BLOCK);
        let e = c2.block(&f2, &id2, 0).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("changed"), "{e}");
        assert_eq!((c2.counters().changed, c2.counters().blocks), (1, 0));
        let _ = std::fs::remove_dir_all(&d);
    }
}
