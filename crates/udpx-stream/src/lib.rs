//! # udpx-stream: paced delivery to many flows
//!
//! The other half of udpx's mission (the paper's video server): one server streaming to tens
//! of thousands of clients over unconnected UDP sockets, every flow paced. This crate puts the
//! pacer of [`udpx_pace`] on udpx sockets:
//!
//! - [`server`]: `udpx stream serve`. One thread per shard of a reuseport group, each with its
//!   own socket, pacer and flows; one timed wait per busy wheel slot; every flow due in a slot
//!   leaves in one `sendmmsg`, a GSO buffer per flow when its release has several datagrams.
//! - [`client`]: `udpx stream recv`. One socket per flow (real clients: distinct ports and
//!   addresses), requests, and per-flow measurement ([`tally`]).
//! - [`lab`]: both ends in a self-test (two namespaces over veth as root, loopback otherwise).
//! - [`pacing`]: the kernel's pacing (`SCM_TXTIME` under fq) where the egress qdisc honours it,
//!   the wheel where it does not.
//! - [`wire`]: the datagram formats; [`report`]: the table, JSON and SVG.
//! - [`admission`]: cookies (return routability), flow secrets, caps per address and prefix.
//!
//! Tool crate: it uses the library, the pacing policy and the lab, never another tool crate.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod alloc;
pub mod capacity;
pub mod client;
pub mod fig4;
pub mod lab;
pub mod pacing;
pub mod report;
pub mod server;
pub mod tally;
pub mod wire;

use std::fmt;

pub use admission::Limits;
pub use client::{receive, Progress, RecvConfig, RecvReport};
pub use pacing::{Pacing, PacingChoice};
pub use server::{ServeConfig, Server, ServerReport, ShardStats};
pub use tally::{Summary, Tally};

/// What can stop a stream run, by what the user does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    /// A number or flag out of range; the message says what to change (exit code 2).
    Usage(String),
    /// Sockets, threads, namespaces could not be set up.
    Setup(String),
    /// A system call failed while running.
    Io(String),
    /// This machine lacks what the run needs (exit code 4).
    Skip(String),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Usage(m) | StreamError::Setup(m) | StreamError::Io(m) => f.write_str(m),
            StreamError::Skip(m) => write!(f, "skipped: {m}"),
        }
    }
}

impl std::error::Error for StreamError {}
