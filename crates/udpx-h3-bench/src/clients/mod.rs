//! The load clients the scale, tail and restart tables play their viewers with, each the
//! same players (a segment every interval, the same window, counts and JSON fields) on
//! another stack:
//!
//! - [`own`]: udpx's own (`udpx h3 load`), many HTTP/3 connections in one event loop on
//!   quiche, the same library as the server;
//! - [`quinn_hyper`]: hyperium's stacks, which this project did not write: `h3` on quinn for
//!   HTTP/3 and hyper over TLS on TCP for nginx;
//! - [`quicgo`]: the independent program `udpx-quicgo-load` (quic-go's HTTP/3 client, Go's
//!   `net/http` for HTTP/2 and HTTP/1.1), built by `scripts/setup.sh`.

pub mod own;
pub mod quicgo;
pub mod quinn_hyper;
