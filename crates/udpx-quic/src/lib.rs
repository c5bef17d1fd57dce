//! # udpx-quic: the QUIC host on quiche over the udpx datapath
//!
//! quiche does QUIC and no I/O: the application feeds it datagrams and asks it for packets.
//! That is what lets a server choose its system calls, which is the whole point of the
//! Cloudflare post this crate reproduces: the same HTTP/3 server moved from one `sendmsg` per
//! packet to `sendmmsg`, to GSO, to GSO with `sendmmsg`, and its CPU per byte fell with each
//! step. This crate is the host that owns the I/O:
//!
//! ```text
//!  udpx-h3 (HTTP/3: requests, files)         App::on_turn on each connection
//!  Host (host/): the loop (turn.rs), admission   connections by DCID, timers, send quantum
//!   and stateless replies (gate.rs), sending
//!   (send.rs); its Table (table.rs)
//!  Outbox (outbox.rs)                        packets → GSO runs → Transmits, resumes on EAGAIN
//!  Server (server.rs)                        one Host per shard of a reuseport group
//!  cid.rs                                    QUIC-LB connection IDs, the worker byte
//!  udpx                                      sockets, GSO/GRO, sendmmsg, cBPF steering
//! ```
//!
//! ## I/O modes
//!
//! | [`IoMode`] | socket | one call sends | counted in |
//! | --- | --- | --- | --- |
//! | `sendmsg` | `SendMode::Sendmsg` | one packet | `send_calls` = packets |
//! | `sendmmsg` | `SendMode::Sendmmsg` | up to 64 packets, each its own traversal | |
//! | `gso` | `SendMode::GsoSendmsg` | one run of equal-size packets to one peer | `gso_runs` |
//! | `gso-mmsg` | `SendMode::GsoSendmmsg` | up to 64 runs | |
//!
//! Receive is the same in every mode: `recvmmsg` into 64 KiB buffers with `UDP_GRO` where
//! available (a buffer then holds a train of datagrams, split before quiche sees them).
//!
//! ## What it does not do yet
//!
//! - NEW_TOKEN: quiche 0.30 never sends one, so a returning client is validated by Retry.
//! - Caps per address are per shard (shards share nothing), not per host.
//! - Kernel pacing ([`Pacing::Kernel`]: each GSO run handed to an fq qdisc with its departure
//!   time) is built but no server here turns it on; the host holds early packets itself.
#![forbid(unsafe_code)]

pub mod admission;
pub mod bufs;
pub mod cid;
pub mod counters;
pub mod host;
pub mod initial;
pub mod keylog;
pub mod outbox;
pub mod pacing;
pub mod qlog;
pub mod ready;
pub mod records;
pub mod reset;
pub mod server;
pub mod table;
pub mod timers;
pub mod token;
pub mod upgrade;

use std::fmt;
use std::net::SocketAddr;

pub use admission::{Limits, RetryPolicy};
pub use bufs::{Buf, BufPool, Bufs, Connection};
pub use cid::{CidGenerator, ServerCid, CID_LEN, GENERATION_BYTE, WORKER_BYTE};
pub use counters::HostCounters;
pub use host::{App, Burst, Host, HostConfig, HostSocket, Role, Until, QUANTUM_PACKETS};
pub use keylog::KeyLog;
pub use outbox::{IoMode, Zerocopy};
pub use pacing::{pacing_for, Pacing, PACING_SLACK};
pub use qlog::{Qlog, QlogConfig, QlogPolicy};
pub use reset::{RemovedHosts, ResetKey};
pub use server::{client_socket, socket_config, Server, ServerConfig, ServerProbe, ShardSample, Starting};
pub use table::Slot;
pub use token::{ServiceKeys, TokenKey};

/// What can go wrong in the host.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The socket could not be made as asked.
    Socket(udpx::Error),
    /// Another process holds the port.
    AddrInUse(SocketAddr),
    /// quiche refused (`what` it was asked to do).
    Quic(&'static str, quiche::Error),
    /// A system call failed.
    Io(std::io::Error),
    /// A setting out of range.
    Config(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Socket(e) => write!(f, "{e}"),
            Error::AddrInUse(a) => write!(f, "{a} is in use by another program: choose another port with --listen"),
            Error::Quic(what, e) => write!(f, "QUIC {what}: {e}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::Config(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for Error {}
