//! udpx measurement harness: CPU accounting, tx/rx roles, reports.
//!
//! Figures are only comparable when measured the same way, so the tools measure with this
//! crate: [`cpu`] turns kernel counters into CPU time (this machine has no hardware
//! counters), and test networks come from `udpx-netns`.
//!
//! Every udpx row is judged against bare system calls of the same shape ([`raw`]: the loops
//! of the kernel's `udpgso_bench`, run in the same job with the same receive buffer), and
//! [`paced`] compares receivers at a rate both sustain.

pub mod chart;
pub mod matrix;
pub mod paced;
pub mod probe;
pub mod raw;
pub mod report;
pub mod run;
pub mod rx;
pub mod tx;
pub mod wire;

// The lab's measuring tools, under the paths the tables have always used.
pub use udpx_lab::{cpu, env, stats};
