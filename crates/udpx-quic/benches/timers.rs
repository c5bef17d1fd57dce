//! Micro benchmark of the host's deadline heap (`udpx_quic::timers::Timers`) at 100 to 50,000
//! connections: a re-key (one connection's deadline moved, as after each of its packets), and
//! a deadline firing and re-armed. CI compiles it (`cargo bench --no-run`); run with
//! `cargo bench -p udpx-quic --bench timers`. Prints ns per operation; timings are for
//! looking at, never for pass/fail.

use std::hint::black_box;

use udpx_netns::micro::bench;
use udpx_quic::table::Slot;
use udpx_quic::timers::{Deadline, Timers};

/// A small xorshift generator: the same sequence every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn main() {
    // Deadlines spread over 10 s, in nanoseconds, as the host keys them.
    const SPREAD: u64 = 10_000_000_000;
    for n in [100u32, 1_000, 10_000, 50_000] {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut t = Timers::new();
        for conn in 0..n {
            t.set(Slot(conn), Some((rng.next() % SPREAD, Deadline::Quic)));
        }
        bench(&format!("re-key one of {n} (a packet moved its deadline)"), 1, || {
            let conn = (rng.next() % u64::from(n)) as u32;
            t.set(black_box(Slot(conn)), Some((rng.next() % SPREAD, Deadline::Quic)));
        });
        let mut now = 0u64;
        bench(&format!("fire the earliest of {n} and re-arm it"), 1, || {
            now = t.peek().map_or(now, |(at, _)| at);
            if let Some((conn, kind)) = t.pop_due(black_box(now)) {
                t.set(conn, Some((now + rng.next() % SPREAD, kind)));
            }
        });
    }
}
