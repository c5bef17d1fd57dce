//! Allocation counting for the "no allocation in steady state" figure.
//!
//! With the `count-allocations` feature, the `allocation-counter` crate replaces the global
//! allocator with one that counts per thread; a shard measures each of its iterations with it.
//! Without the feature nothing is counted and the figure reads "not counted", never zero.

/// Whether allocations are counted in this build.
pub fn counting() -> bool {
    cfg!(feature = "count-allocations")
}

/// Runs `f`, returning its result and the allocations it made on this thread (`None` when not
/// counted).
#[cfg(feature = "count-allocations")]
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Option<u64>) {
    let mut out = None;
    let info = allocation_counter::measure(|| out = Some(f()));
    (out.expect("the closure ran"), Some(info.count_total))
}

/// Runs `f`, returning its result and the allocations it made on this thread (`None` when not
/// counted).
#[cfg(not(feature = "count-allocations"))]
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Option<u64>) {
    (f(), None)
}

#[cfg(all(test, feature = "count-allocations"))]
mod tests {
    #[test]
    fn counts_this_threads_allocations() {
        let (v, n) = super::measure(|| vec![1u8; 10]);
        assert_eq!(v.len(), 10);
        assert_eq!(n, Some(1));
        let (_, n) = super::measure(|| 1 + 1);
        assert_eq!(n, Some(0));
    }
}
