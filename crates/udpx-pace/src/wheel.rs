//! A single-level timing wheel of u32 entries (flow indices), with an occupancy bitmap.
//!
//! Slot `s` holds the entries whose tick (`due_ns / slot_ns`) is congruent to `s` modulo the
//! slot count. Every entry's tick is kept in `[cursor, cursor + slots)`: a due time further
//! out is clamped to the last slot of the horizon, and the owner re-inserts the entry when it
//! comes out early. Slot lists are doubly linked through arrays indexed by the entry (the flow
//! table's links), so insert and remove are O(1) and nothing is allocated after [`Wheel::new`].
//!
//! A tick is *expired* once it has fully elapsed: tick `t` comes out when `now >= (t + 1) x
//! slot_ns`, so an entry never leaves before its due time and at most one slot (plus the wake-up
//! latency) after it.

use crate::error::PaceError;

const NIL: u32 = u32::MAX;

/// The wheel. See the module docs.
#[derive(Debug)]
pub struct Wheel {
    slot_ns: u64,
    mask: u64,
    /// The first tick not yet expired.
    cursor: u64,
    heads: Vec<u32>,
    /// One bit per slot: the slot's list is non-empty.
    busy: Vec<u64>,
    next: Vec<u32>,
    prev: Vec<u32>,
    /// The slot an entry is in, or NIL.
    slot_of: Vec<u32>,
    len: usize,
}

impl Wheel {
    /// A wheel of `slots` slots (a power of two, at least 64) of `slot_ns` each, for entries
    /// `0..capacity`, starting at time `start_ns`.
    pub fn new(slot_ns: u64, slots: u32, capacity: u32, start_ns: u64) -> Result<Self, PaceError> {
        if slot_ns == 0 {
            return Err(PaceError::ZeroSlot);
        }
        if !slots.is_power_of_two() || slots < 64 {
            return Err(PaceError::SlotCount { slots });
        }
        let cap = capacity as usize;
        Ok(Wheel {
            slot_ns,
            mask: u64::from(slots) - 1,
            cursor: start_ns / slot_ns,
            heads: vec![NIL; slots as usize],
            busy: vec![0; slots as usize / 64],
            next: vec![NIL; cap],
            prev: vec![NIL; cap],
            slot_of: vec![NIL; cap],
            len: 0,
        })
    }

    /// The slot length, ns.
    pub fn slot_ns(&self) -> u64 {
        self.slot_ns
    }

    /// Number of slots.
    pub fn slots(&self) -> u64 {
        self.mask + 1
    }

    /// Entries in the wheel.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the wheel is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `entry` is in the wheel.
    pub fn contains(&self, entry: u32) -> bool {
        self.slot_of[entry as usize] != NIL
    }

    /// The first tick not yet expired: every entry's tick is in `[cursor, cursor + slots)`.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Puts `entry` in the slot of `due_ns` (moving it if it was in the wheel): the current
    /// tick if that is past, the last slot of the horizon if it is beyond. Returns the tick
    /// used.
    ///
    /// # Panics
    /// If `entry` is not below the capacity given to [`Wheel::new`], like a slice index.
    pub fn insert(&mut self, entry: u32, due_ns: u64) -> u64 {
        self.remove(entry);
        let tick = (due_ns / self.slot_ns).clamp(self.cursor, self.cursor.saturating_add(self.mask));
        let slot = (tick & self.mask) as usize;
        let head = self.heads[slot];
        let e = entry as usize;
        self.next[e] = head;
        self.prev[e] = NIL;
        if head != NIL {
            self.prev[head as usize] = entry;
        }
        self.heads[slot] = entry;
        self.slot_of[e] = slot as u32;
        self.busy[slot / 64] |= 1 << (slot % 64);
        self.len += 1;
        tick
    }

    /// Takes `entry` out of the wheel; false if it was not in.
    ///
    /// # Panics
    /// If `entry` is not below the capacity given to [`Wheel::new`].
    pub fn remove(&mut self, entry: u32) -> bool {
        let e = entry as usize;
        let slot = self.slot_of[e];
        if slot == NIL {
            return false;
        }
        let (p, n) = (self.prev[e], self.next[e]);
        if p == NIL {
            self.heads[slot as usize] = n;
            if n == NIL {
                self.busy[slot as usize / 64] &= !(1 << (slot % 64));
            }
        } else {
            self.next[p as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
        self.slot_of[e] = NIL;
        self.next[e] = NIL;
        self.prev[e] = NIL;
        self.len -= 1;
        true
    }

    /// The earliest tick at or after the cursor whose slot is busy (found in the bitmap).
    pub fn next_busy_tick(&self) -> Option<u64> {
        let slots = self.slots();
        let start = self.cursor & self.mask;
        let words = self.busy.len() as u64;
        // Scan words from the cursor's, wrapping once; the first word is scanned again at the
        // end for the bits below the cursor.
        for i in 0..=words {
            let w = ((start / 64) + i) % words;
            let mut bits = self.busy[w as usize];
            if i == 0 {
                bits &= !0u64 << (start % 64);
            } else if i == words {
                bits &= !(!0u64 << (start % 64));
            }
            if bits != 0 {
                let slot = w * 64 + u64::from(bits.trailing_zeros());
                let ahead = (slot + slots - start) & self.mask;
                return Some(self.cursor.saturating_add(ahead));
            }
        }
        None
    }

    /// When the earliest busy slot has fully elapsed: the time to sleep to.
    pub fn next_expiry_ns(&self) -> Option<u64> {
        self.next_busy_tick().map(|t| t.saturating_add(1).saturating_mul(self.slot_ns))
    }

    /// Moves the cursor to the tick of `now_ns`, taking every entry of the fully elapsed ticks
    /// out of the wheel into `out` (appended, earliest tick first). Empty slots are skipped
    /// with the bitmap. Entries inserted afterwards land at the new cursor or later, so none
    /// comes out twice in one call.
    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<u32>) {
        let target = now_ns / self.slot_ns;
        while let Some(tick) = self.next_busy_tick() {
            if tick >= target {
                break;
            }
            let slot = (tick & self.mask) as usize;
            let mut e = self.heads[slot];
            while e != NIL {
                let n = self.next[e as usize];
                self.slot_of[e as usize] = NIL;
                self.next[e as usize] = NIL;
                self.prev[e as usize] = NIL;
                out.push(e);
                self.len -= 1;
                e = n;
            }
            self.heads[slot] = NIL;
            self.busy[slot / 64] &= !(1 << (slot % 64));
            self.cursor = tick;
        }
        self.cursor = self.cursor.max(target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: u64 = 250_000;

    fn wheel() -> Wheel {
        Wheel::new(SLOT, 64, 16, 0).unwrap()
    }

    fn expire(w: &mut Wheel, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        w.expire(now, &mut out);
        out
    }

    /// (due, tick it lands in) with the cursor at 0: past and present go to the cursor, the
    /// future to its tick, beyond the horizon to the last slot.
    #[test]
    fn insert_truth_table() {
        let table = [(0, 0), (SLOT - 1, 0), (SLOT, 1), (63 * SLOT, 63), (64 * SLOT, 63), (u64::MAX, 63)];
        for (due, tick) in table {
            let mut w = wheel();
            assert_eq!(w.insert(3, due), tick, "due {due}");
            assert_eq!(w.next_busy_tick(), Some(tick));
            assert_eq!(w.next_expiry_ns(), Some((tick + 1) * SLOT));
        }
    }

    /// A slot comes out only once it has fully elapsed, and then all of it at once.
    #[test]
    fn expires_when_slot_has_elapsed() {
        let mut w = wheel();
        w.insert(1, 10);
        w.insert(2, SLOT - 1);
        w.insert(3, SLOT);
        assert_eq!(expire(&mut w, SLOT - 1), Vec::<u32>::new());
        let mut got = expire(&mut w, SLOT);
        got.sort();
        assert_eq!(got, vec![1, 2]);
        assert_eq!(expire(&mut w, 2 * SLOT - 1), Vec::<u32>::new());
        assert_eq!(expire(&mut w, 2 * SLOT), vec![3]);
        assert!(w.is_empty());
        assert_eq!(w.next_busy_tick(), None);
    }

    /// Removal from the head, middle and tail of a slot list keeps the others and the bitmap.
    #[test]
    fn remove_anywhere() {
        for victim in [1, 2, 3] {
            let mut w = wheel();
            for e in [1, 2, 3] {
                w.insert(e, 5 * SLOT);
            }
            assert!(w.remove(victim));
            assert!(!w.remove(victim));
            let mut got = expire(&mut w, 6 * SLOT);
            got.sort();
            let want: Vec<u32> = [1, 2, 3].into_iter().filter(|&e| e != victim).collect();
            assert_eq!(got, want);
        }
        let mut w = wheel();
        w.insert(4, 7 * SLOT);
        w.remove(4);
        assert_eq!(w.next_busy_tick(), None, "bit cleared with the last entry");
    }

    /// Bad shapes are refused; inserting an entry already in moves it.
    #[test]
    fn shapes_and_reinsert() {
        assert_eq!(Wheel::new(0, 64, 1, 0).err(), Some(PaceError::ZeroSlot));
        assert_eq!(Wheel::new(SLOT, 96, 1, 0).err(), Some(PaceError::SlotCount { slots: 96 }));
        assert_eq!(Wheel::new(SLOT, 0, 1, 0).err(), Some(PaceError::SlotCount { slots: 0 }));
        let mut w = wheel();
        w.insert(2, 3 * SLOT);
        w.insert(2, 9 * SLOT);
        assert_eq!((w.len(), w.next_busy_tick()), (1, Some(9)));
    }

    /// The wheel wraps: entries keep their order across many rotations.
    #[test]
    fn wraps_many_times() {
        let mut w = wheel();
        let mut now = 0;
        for round in 0..1000u64 {
            let due = now + (round % 70) * SLOT; // sometimes beyond the 64-slot horizon
            let tick = w.insert(0, due);
            assert!(tick >= w.cursor() && tick < w.cursor() + 64);
            let wake = w.next_expiry_ns().unwrap();
            assert_eq!(wake, (tick + 1) * SLOT);
            assert!(expire(&mut w, wake - 1).is_empty());
            assert_eq!(expire(&mut w, wake), vec![0]);
            now = wake;
        }
    }

    /// A big jump (a stall) expires every slot, in tick order, across the wrap.
    #[test]
    fn stall_expires_in_order() {
        let mut w = Wheel::new(SLOT, 64, 64, 40 * SLOT).unwrap();
        for e in 0..64u32 {
            w.insert(e, (40 + u64::from(e)) * SLOT);
        }
        assert_eq!(expire(&mut w, 1000 * SLOT), (0..64).collect::<Vec<u32>>());
        assert_eq!(w.cursor(), 1000);
        assert_eq!(w.insert(5, 0), 1000, "the past goes to the cursor");
    }
}

#[cfg(test)]
mod overflow_tests {
    use super::*;

    /// Near the end of u64 time nothing overflows or panics: entries clamp to the horizon and
    /// the wake-up saturates.
    #[test]
    fn the_end_of_time_does_not_panic() {
        let mut w = Wheel::new(1, 64, 4, u64::MAX - 3).expect("shape");
        w.insert(0, u64::MAX);
        w.insert(1, u64::MAX - 1);
        assert_eq!(w.next_expiry_ns(), Some(u64::MAX));
        let mut out = Vec::new();
        w.expire(u64::MAX, &mut out);
    }
}
