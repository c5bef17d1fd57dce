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

/// Tracks sequence numbers: loss (gaps), reordering and duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SeqTracker {
    /// Next sequence number expected.
    pub next: u64,
    /// Datagrams that arrived with a lower number than expected (late or duplicate).
    pub reordered: u64,
    /// Sequence numbers skipped over (may later arrive as `reordered`).
    pub gaps: u64,
    /// Datagrams whose contents did not match their header.
    pub corrupt: u64,
    /// Datagrams too short to verify.
    pub short: u64,
}

impl SeqTracker {
    /// Accounts for one received datagram.
    pub fn see(&mut self, d: &[u8]) {
        match check(d) {
            Check::Ok(seq) if seq >= self.next => {
                self.gaps += seq - self.next;
                self.next = seq + 1;
            }
            Check::Ok(_) => self.reordered += 1,
            Check::Short => self.short += 1,
            Check::Corrupt => self.corrupt += 1,
        }
    }

    /// Datagrams lost for good: gaps not filled by late arrivals.
    pub fn lost(&self) -> u64 {
        self.gaps.saturating_sub(self.reordered)
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
}
