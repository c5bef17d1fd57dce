//! The micro benchmarks' timer: warm up, run for about 300 ms, print nanoseconds per
//! operation. For looking at, never for pass/fail (the benches are only compiled by the suite).

use std::time::{Duration, Instant};

/// Runs `f` (which does `per_iter` operations) 100 times to warm up, then for about 300 ms,
/// and prints `name`, the nanoseconds per operation and the iterations.
pub fn bench(name: &str, per_iter: u64, mut f: impl FnMut()) {
    for _ in 0..100 {
        f();
    }
    let start = Instant::now();
    let mut iters = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        f();
        iters += 1;
    }
    let ns = start.elapsed().as_nanos() as f64 / (iters * per_iter) as f64;
    println!("{name:<52} {ns:>8.1} ns/op  ({iters} iterations)");
}
