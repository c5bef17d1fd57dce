//! UDP transactions at scale (issue: `udpx echo`): an echo server over reuseport shards steered
//! by CPU or QUIC connection ID, with batched system calls, a load generator with latency
//! percentiles, and the table that compares the modes ([`bench`](mod@bench): `udpx echo bench`).
//! This crate measures and judges with the lab (`udpx-lab`) and depends on no other tool.

pub mod bench;
pub mod load;
pub mod proto;
pub mod server;
