//! # udpx-h3: an HTTP/3 file server and client on the udpx datapath
//!
//! `serve(dir, cfg)` answers GET and HEAD for the files under a directory over HTTP/3
//! (quiche's `h3` module), on the QUIC host of [`udpx_quic`]: one event loop per shard of a
//! reuseport group, packets sent in the chosen [`IoMode`](udpx_quic::IoMode) (`sendmsg`,
//! `sendmmsg`, `gso`, `gso-mmsg`), GRO on receive. It exists to measure what the Cloudflare
//! post measured (CPU per byte of a file download by I/O mode) with a server whose every
//! system call is ours, and to be downloaded from by an implementation nobody here wrote
//! (ngtcp2's `gtlsclient`).
//!
//! - Responses as a browser or a video player expects them (see [`http`], one set of rules
//!   for every listener): content types, `index.html`, validators (`etag`, `last-modified`),
//!   conditional requests (304, 412), byte ranges (206, 416), `alt-svc`; 404 for what is
//!   missing, 403 for a path that leaves the directory (see [`files`]), 405 for other methods,
//!   400 for a malformed request; an access log and counters by status.
//! - Bodies stream from disk at the pace the stream's flow control and congestion window
//!   allow, one chunk at most in memory per response (see [`server`]).
//! - TLS from PEM files, or a self-signed certificate made at start for local use (see
//!   [`tls`]).
//!
//! `get(url, out, cfg)` is the matching client, on a udpx socket and the same host loop.
//! It does not verify certificates.
//!
//! What measures this server lives beside it, not in it: `udpx-h3-bench` holds `udpx bench
//! h3` (the Cloudflare post's table, the scale bench), the load generator `udpx h3 load` and
//! the quinn peer, so a server a user deploys does not carry quinn, h3 or the lab.
#![forbid(unsafe_code)]

mod accesslog;
pub mod cache;
pub mod client;
pub mod cors;
mod disk;
pub mod files;
mod goaway;
pub mod heads;
pub mod http;
mod metrics;
mod responder;
pub mod server;
pub mod tcp;
pub mod tls;
pub mod tuning;

use std::fmt;

pub use client::{get, GetConfig, GetReport, Url, QUIET_PING};
pub use http::{HttpSnapshot, Site, SiteOptions};
pub use server::{
    serve, H3Server, ServeConfig, ServeCounters, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_OPEN_PER_ADDR,
    DEFAULT_MAX_OPEN_PER_SHARD, DEFAULT_PARK_TIMEOUT, DEFAULT_STALL_TIMEOUT,
};
pub use tls::Tls;
pub use tuning::Tuning;

/// What can go wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Bad input the user can fix (a path, a file, a URL): exit code 2.
    Usage(String),
    /// The QUIC host (socket, port in use, quiche).
    Quic(udpx_quic::Error),
    /// TLS setup.
    Tls(String),
    /// A file system call.
    Io(std::io::Error),
    /// The transfer failed.
    Failed(String),
}

impl Error {
    /// Whether the user's input is at fault (exit code 2) rather than the run (exit code 1).
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::Usage(_) | Error::Quic(udpx_quic::Error::AddrInUse(_)))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(s) | Error::Tls(s) | Error::Failed(s) => f.write_str(s),
            Error::Quic(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}
