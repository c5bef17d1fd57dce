//! The bench's datagram format, for `--verify`: a sequence number and a checksum in every
//! datagram, so the receiver can count loss, reordering and corruption.
//!
//! ```text
//!  0        8        12       16                                   len
//!  ├─ seq ──┼─ len ──┼─ sum ──┼─ filler (a function of seq) ────────┤
//!    u64 LE   u32 LE   u32 LE   FNV-1a of the filler in `sum`
//! ```
//!
//! Datagrams shorter than [`HEADER`] carry no header and are counted, not verified.

/// Bytes of header.
pub const HEADER: usize = 16;

/// FNV-1a, 32 bit: cheap and good enough to catch corruption and misplaced bytes.
pub fn fnv1a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Fills `buf` as datagram `seq` (filler and header).
pub fn stamp(buf: &mut [u8], seq: u64) {
    if buf.len() < HEADER {
        return;
    }
    let len = buf.len() as u32;
    let (hdr, body) = buf.split_at_mut(HEADER);
    let k = (seq as u8).wrapping_mul(13);
    for (i, b) in body.iter_mut().enumerate() {
        *b = k.wrapping_add(i as u8);
    }
    let sum = fnv1a(body);
    hdr[0..8].copy_from_slice(&seq.to_le_bytes());
    hdr[8..12].copy_from_slice(&len.to_le_bytes());
    hdr[12..16].copy_from_slice(&sum.to_le_bytes());
}

/// Only the header: the filler stays as it was (for the fast path, where the buffer was
/// stamped once and only the sequence number and checksum change).
pub fn restamp_header(buf: &mut [u8], seq: u64, body_sum: u32) {
    if buf.len() < HEADER {
        return;
    }
    buf[0..8].copy_from_slice(&seq.to_le_bytes());
    let len = buf.len() as u32;
    buf[8..12].copy_from_slice(&len.to_le_bytes());
    buf[12..16].copy_from_slice(&body_sum.to_le_bytes());
}

/// What a received datagram says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Intact datagram `seq`.
    Ok(u64),
    /// Too short to carry a header.
    Short,
    /// Header and contents disagree.
    Corrupt,
}

/// Checks a received datagram.
pub fn check(d: &[u8]) -> Check {
    if d.len() < HEADER {
        return Check::Short;
    }
    let seq = u64::from_le_bytes(d[0..8].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(d[8..12].try_into().unwrap_or_default());
    let sum = u32::from_le_bytes(d[12..16].try_into().unwrap_or_default());
    if len as usize != d.len() || fnv1a(&d[HEADER..]) != sum {
        return Check::Corrupt;
    }
    Check::Ok(seq)
}

/// How far behind the highest sequence number seen a late datagram can still be told apart
/// as reordered or duplicate: a bitmap of this many bits (8 KiB). Older arrivals are counted
/// in `too_late` (a queue this deep at 1472 B is 96 MB: far beyond any socket buffer here).
pub const SEQ_WINDOW: u64 = 1 << 16;

/// Tracks sequence numbers: loss (gaps), reordering and duplicates, counted apart.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SeqTracker {
    /// Next sequence number expected.
    pub next: u64,
    /// Datagrams that arrived after a higher number, the first time their number was seen
    /// (each fills one of the `gaps`).
    pub reordered: u64,
    /// Datagrams whose number was already seen (they fill no gap).
    pub duplicates: u64,
    /// Late datagrams more than [`SEQ_WINDOW`] behind: reordered or duplicate, not known which.
    pub too_late: u64,
    /// Sequence numbers skipped over (may later arrive as `reordered`).
    pub gaps: u64,
    /// Datagrams whose contents did not match their header.
    pub corrupt: u64,
    /// Datagrams too short to verify.
    pub short: u64,
    /// Which of the last [`SEQ_WINDOW`] numbers arrived: bit `seq % SEQ_WINDOW`.
    #[serde(skip)]
    seen: Vec<u64>,
}

impl SeqTracker {
    /// Accounts for one received datagram.
    pub fn see(&mut self, d: &[u8]) {
        match check(d) {
            Check::Ok(seq) => self.see_seq(seq),
            Check::Short => self.short += 1,
            Check::Corrupt => self.corrupt += 1,
        }
    }

    /// Accounts for an intact datagram numbered `seq`.
    pub fn see_seq(&mut self, seq: u64) {
        if self.seen.is_empty() {
            self.seen = vec![0; (SEQ_WINDOW / 64) as usize];
        }
        if seq >= self.next {
            // The skipped numbers' bits still hold numbers one window older: clear them
            // (all of the window at most).
            for s in self.next.max(seq.saturating_sub(SEQ_WINDOW))..seq {
                self.set(s, false);
            }
            self.gaps += seq - self.next;
            self.next = seq + 1;
            self.set(seq, true);
        } else if self.next - seq > SEQ_WINDOW {
            self.too_late += 1;
        } else if self.get(seq) {
            self.duplicates += 1;
        } else {
            self.set(seq, true);
            self.reordered += 1;
        }
    }

    fn get(&self, seq: u64) -> bool {
        let bit = seq % SEQ_WINDOW;
        self.seen[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }

    fn set(&mut self, seq: u64, on: bool) {
        let bit = seq % SEQ_WINDOW;
        let word = &mut self.seen[(bit / 64) as usize];
        if on {
            *word |= 1 << (bit % 64);
        } else {
            *word &= !(1 << (bit % 64));
        }
    }

    /// Datagrams lost for good: gaps not filled by late arrivals (duplicates fill none).
    pub fn lost(&self) -> u64 {
        self.gaps.saturating_sub(self.reordered + self.too_late)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_check_round_trip_and_corruption() {
        let mut d = vec![0u8; 1472];
        stamp(&mut d, 42);
        assert_eq!(check(&d), Check::Ok(42));
        d[100] ^= 1;
        assert_eq!(check(&d), Check::Corrupt);
        assert_eq!(check(&d[..10]), Check::Short);
        let mut e = vec![0u8; 1472];
        stamp(&mut e, 43);
        assert_eq!(check(&e[..1000]), Check::Corrupt, "truncation is caught by the length");
        let sum = fnv1a(&e[HEADER..]);
        restamp_header(&mut e, 7, sum);
        assert_eq!(check(&e), Check::Ok(7));
    }

    #[test]
    fn tracker_counts_gaps_reorder() {
        let mk = |s| {
            let mut d = vec![0u8; 64];
            stamp(&mut d, s);
            d
        };
        let mut t = SeqTracker::default();
        for s in [0, 1, 3, 2, 4, 7, 8] {
            t.see(&mk(s));
        }
        assert_eq!((t.next, t.gaps, t.reordered, t.lost()), (9, 3, 1, 2));
    }

    #[test]
    fn tracker_counts_duplicates_apart_from_reordering() {
        let mut t = SeqTracker::default();
        // 1 twice in order, 2 late once and then again, 0 again much later.
        for s in [0, 1, 1, 3, 2, 2, 4, 0] {
            t.see_seq(s);
        }
        assert_eq!((t.reordered, t.duplicates, t.gaps, t.lost(), t.too_late), (1, 3, 1, 0, 0));
        // A duplicate does not hide a loss: 5 never arrives, 6 arrives twice.
        for s in [6, 6] {
            t.see_seq(s);
        }
        assert_eq!((t.gaps, t.duplicates, t.lost()), (2, 4, 1));
    }

    #[test]
    fn tracker_window_wraps() {
        let mut t = SeqTracker::default();
        t.see_seq(0);
        // Jump by more than a window: 0's bit must not make a later arrival look duplicate.
        t.see_seq(SEQ_WINDOW + 5);
        t.see_seq(SEQ_WINDOW); // late, same bit as 0 had
        assert_eq!((t.reordered, t.duplicates), (1, 0));
        t.see_seq(1); // a window and more behind: cannot tell
        assert_eq!(t.too_late, 1);
        assert_eq!(t.lost(), SEQ_WINDOW + 4 - 2);
    }
}
