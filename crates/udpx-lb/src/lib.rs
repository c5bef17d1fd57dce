//! QUIC connections routed by connection ID across hosts, through a Linux balancer that
//! already exists: nftables.
//!
//! A 4-tuple hash sends a client's packets elsewhere as soon as its NAT rebinds; the QUIC-LB
//! draft's answer is a server ID inside every connection ID the server chooses. udpx's servers
//! write one ([`udpx_quic::cid`]: octet 0 = `000` rotation bits + length `0x0b`, 2-byte host
//! ID, 7-byte nonce, generation and worker bytes), so a balancer that reads two bytes of the UDP payload can
//! keep every connection on its host. This crate does not build a balancer; it gives one its
//! rules and proves the path:
//!
//! - [`nft`]: the ruleset for `nft -f` (and the `ip rule`/`ip route` lines of the stateless
//!   mode) from a VIP, a port and the hosts: pure text, golden-tested.
//! - [`check`]: which host a connection ID or a captured UDP payload reaches and why, by the
//!   same rules, in Rust.
//! - [`lab`]: a client, a balancer running the generated rules, and two or three server
//!   namespaces, removed on drop.
//! - [`bench`](mod@bench): `udpx bench lb`, the balancer's figures in the lab (cost per packet
//!   against a 4-tuple hash, connections that survive a rebinding, spread over hosts).
//!
//! Plaintext QUIC-LB only: a balancer that decrypts encrypted server IDs needs XDP/eBPF
//! (Katran-style); nftables cannot run a block cipher. IPv4 only for now.
//!
//! ```text
//!  client ──► balancer (nft: server ID → fwmark → table 100+mark → via host)
//!                 ├──► host 1 (VIP on lo, answers the client directly: DSR)
//!                 └──► host 2
//! ```

#![forbid(unsafe_code)]

pub mod bench;
pub mod check;
pub mod lab;
pub mod nft;

pub use nft::{Balancer, ConfigError, Host, Mode};
