//! udpx measurement harness: CPU accounting, tx/rx roles, reports.
//!
//! Figures are only comparable when measured the same way, so the tools measure with this
//! crate: [`cpu`] turns kernel counters into CPU time (this machine has no hardware
//! counters), and test networks come from `udpx-netns`.

pub mod cpu;
pub mod env;
pub mod matrix;
pub mod paced;
pub mod probe;
pub mod raw;
pub mod report;
pub mod run;
pub mod rx;
pub mod stats;
pub mod tx;
pub mod wire;
