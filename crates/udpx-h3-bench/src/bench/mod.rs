//! `udpx bench h3`'s tables, one module each, over the lab they share (`crate::lab`: the
//! scratch directory, certificates, nginx, peers as processes, rows of interleaved runs):
//!
//! - [`bulk`]: the default table, one file downloaded per I/O mode and client, beside nginx
//!   and quinn (its API is re-exported here: [`run`], [`table`], [`H3BenchConfig`], ...);
//! - [`scale`]: players and idle connections by the thousand (`--connections`);
//! - [`burst`]: the burst rules through a shallow bottleneck (`--bottleneck`);
//! - [`tail`]: the viewers' tail through a bottleneck with a round trip (`--viewers`);
//! - [`flood`]: a flood of forged Initials (`--flood`);
//! - [`restart`]: upgrades, reloads and restarts under load (`--restart`).
//!
//! A table uses the lab and the client crates' modules, never another table.

pub mod bulk;
pub mod burst;
pub mod flood;
pub mod restart;
pub mod scale;
pub mod tail;

pub use bulk::{
    judge, nginx_target, run, table, udpx_servers, CacheUse, ClientKind, H3Bench, H3BenchConfig, H3Row, H3Run, LeftOut,
    Passes, Programs, ServerKind, ZerocopyUse,
};
