//! UDP transactions at scale (issue: `udpx echo`): an echo server over reuseport shards steered
//! by CPU or QUIC connection ID, with batched system calls, and a load generator with latency
//! percentiles. The table that compares the modes is `udpx-bench`'s `echo` module, beside the
//! other tables; this crate measures with the lab (`udpx-lab`) and depends on no other tool.

pub mod load;
pub mod proto;
pub mod server;
