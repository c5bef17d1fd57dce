//! The zerocopy completion tracker, differential against a plain model (id -> owner, owner ->
//! ids left): arbitrary completion ranges (wrapping at 2^32, duplicates, garbage), sends of
//! several ids, sends in progress that grow while completions arrive, and failed calls that
//! consumed an id. An item comes back exactly when every id it owns completed: never early.
#![no_main]

use std::collections::{HashMap, HashSet};

use libfuzzer_sys::fuzz_target;
use udpx::zerocopy::CompletionTracker;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let start = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let mut t = CompletionTracker::new(start);
    let mut next = start;
    let mut owner: HashMap<u32, usize> = HashMap::new();
    let mut left: HashMap<usize, u32> = HashMap::new();
    let mut done_ids: HashSet<u32> = HashSet::new();
    let (mut released, mut released_model) = (Vec::new(), Vec::new());
    let mut item = 0usize;
    let mut open: Option<usize> = None;
    let mut ops = data[4..].chunks(3);
    while let Some(op) = ops.next() {
        let (kind, a, b) = (op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0));
        match kind % 5 {
            // A whole send of 1..4 ids.
            0 if open.is_none() => {
                let n = u32::from(a % 4) + 1;
                t.push(n, item);
                for k in 0..n {
                    owner.insert(next.wrapping_add(k), item);
                }
                left.insert(item, n);
                next = next.wrapping_add(n);
                item += 1;
            }
            // Open a send, or grow the open one (ids its calls consumed).
            1 => {
                if open.is_none() {
                    t.open();
                    open = Some(item);
                    left.insert(item, 0);
                    item += 1;
                }
                let it = open.unwrap_or_default();
                let n = u32::from(a % 3);
                t.extend_open(n);
                for k in 0..n {
                    owner.insert(next.wrapping_add(k), it);
                }
                *left.entry(it).or_default() += n;
                next = next.wrapping_add(n);
            }
            // Close the open send: its item is back at once if nothing is outstanding.
            2 => {
                if let Some(it) = open.take() {
                    if let Some(back) = t.close_open(it) {
                        assert_eq!(left[&back], 0, "item {back} back with ids outstanding");
                        released.push(back);
                        released_model.push(back);
                    }
                }
            }
            // A completion range near the recent ids (may overlap, wrap, repeat).
            _ => {
                let lo = next.wrapping_sub(u32::from(a));
                let hi = lo.wrapping_add(u32::from(b % 16));
                let mut id = lo;
                loop {
                    if done_ids.insert(id) {
                        if let Some(it) = owner.remove(&id) {
                            let l = left.get_mut(&it).expect("owner has ids");
                            *l -= 1;
                            if *l == 0 && open != Some(it) {
                                released_model.push(it);
                            }
                        }
                    }
                    if id == hi {
                        break;
                    }
                    id = id.wrapping_add(1);
                }
                // Ids handed out later are new ids: forget stale "done" marks for them.
                released.extend(t.complete(lo, hi));
            }
        }
        // Ids not yet handed out cannot be done.
        done_ids.retain(|id| id.wrapping_sub(start) < next.wrapping_sub(start));
        let (mut x, mut y) = (released.clone(), released_model.clone());
        x.sort_unstable();
        y.sort_unstable();
        assert_eq!(x, y, "tracker and model disagree");
        assert_eq!(t.next_id(), next);
    }
});
