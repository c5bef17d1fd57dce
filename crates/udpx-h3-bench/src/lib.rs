//! # udpx-h3-bench: what measures the udpx HTTP/3 server
//!
//! The server ([`udpx_h3`]) is what a user deploys; this crate is what judges it, so that the
//! server carries none of its measurement's dependencies (quinn, hyperium's h3, the lab):
//!
//! - [`bench`](mod@bench) is `udpx bench h3`: the Cloudflare post's table (server CPU per byte by I/O
//!   mode, beside nginx's HTTPS over TCP and quinn) measured with ngtcp2's client and
//!   `udpx_h3::get`; the scale bench (`--connections`), the bottleneck (`--bottleneck`) and the
//!   Initial flood (`--flood`).
//! - [`clients`] are the load clients, each many video players (a segment every interval):
//!   udpx's own on quiche ([`clients::own`], `udpx h3 load`), hyperium's `h3` on quinn and
//!   hyper over TCP ([`clients::quinn_hyper`]), and quic-go's ([`clients::quicgo`]).
//! - [`quinn_server`] is quinn with h3, the bench's second HTTP/3 server (`udpx h3
//!   quinn-serve`).
#![forbid(unsafe_code)]

pub mod bench;
pub mod clients;
mod lab;
pub mod quinn_server;

/// The block cache of the bulk table's `+cache` rows and of the scale table's `udpx h3 +cache`
/// server unless `--cache-size` says otherwise: 256 MB (`256M`), room for the bulk table's
/// 100 MB file.
pub const DEFAULT_CACHE_SIZE: usize = 256_000_000;
