//! # udpx-h3-bench: what measures the udpx HTTP/3 server
//!
//! The server ([`udpx_h3`]) is what a user deploys; this crate is what judges it, so that the
//! server carries none of its measurement's dependencies (quinn, hyperium's h3, the lab):
//!
//! - [`bench`](mod@bench) is `udpx bench h3`: the Cloudflare post's table (server CPU per byte by I/O
//!   mode, beside nginx's HTTPS over TCP and quinn) measured with ngtcp2's client and
//!   `udpx_h3::get`; the scale bench (`--connections`), the bottleneck (`--bottleneck`) and the
//!   Initial flood (`--flood`).
//! - [`load`] runs many clients in one loop as video players (a segment every interval), and
//!   [`load_hyper`] the same players on hyperium's stacks: hyper over HTTPS on TCP (`udpx h3
//!   load`) and `h3` on quinn, the scale bench's second independent HTTP/3 client.
//! - [`quinn_server`] is quinn with h3, the bench's second HTTP/3 server (`udpx h3
//!   quinn-serve`).
#![forbid(unsafe_code)]

pub mod bench;
pub mod independent;
pub mod load;
pub mod load_hyper;
pub mod quinn_server;
