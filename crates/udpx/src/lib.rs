//! # udpx: UDP at the cost per byte of TCP
//!
//! On a stock Linux server UDP costs several times more CPU per byte than TCP, because every
//! datagram traverses the whole stack. The kernel has the cures; this crate uses them, with
//! run-time detection and fallbacks that never lose a datagram.
//!
//! ## Layers
//!
//! ```text
//!  Batch (gso.rs)            datagrams ──► GSO transmits (pure planning, no syscalls)
//!  UdpSocket::send           transmits ──► sendmmsg/sendmsg vectors, fallbacks, counters
//!  UdpSocket::recv           recvmmsg/recvmsg ──► RecvMeta + GRO segments
//!  qdisc::egress             destination ──► device, root qdisc: does the kernel pace? (rtnetlink)
//!  sys/                      the only unsafe code: syscalls, cmsg codec, mmsghdr vectors, netlink
//! ```
//!
//! ## Capability matrix
//!
//! | feature | kernel | used for | when missing |
//! | --- | --- | --- | --- |
//! | `UDP_SEGMENT` (GSO) | 4.18 (64 segments), 6.9 (128) | one stack traversal per 64 KiB | plain datagrams; limit probed 128 → 64 |
//! | GSO refused by a device (EIO) or `SO_NO_CHECK` (EINVAL) | any | — | batch re-sent plain, that destination plain for a back-off, then GSO retried; counted |
//! | `UDP_GRO` | 5.0 | one receive per train of datagrams | one datagram per buffer |
//! | `sendmmsg` / `recvmmsg` | 3.0 / 2.6.33 | fewer syscalls | — (always present) |
//! | `SO_TXTIME` | 4.19 | departure times, enforced only under an fq or etf root ([`qdisc::egress`] tells) | sent at once |
//! | `SO_MAX_PACING_RATE` | 3.13 (64-bit 5.0) | a connected socket's rate cap, enforced by fq only | not capped |
//! | `SO_ZEROCOPY` | 4.14, UDP 5.0 | no copy for large sends (owned buffers back on completion) | copy; turned off when the kernel keeps copying |
//! | `IP_PKTINFO` | any | reply from the address asked | kernel picks source |
//! | `SO_RXQ_OVFL` | any | drops made visible | — |
//! | `SO_TIMESTAMPNS` | any | each datagram's receive time ([`RecvMeta::rx_time`]), for a reader that gathers | no time |
//!
//! Features are asked for with [`Want`]: `IfAvailable` records what happened in
//! [`Capabilities`]; `Required` fails socket creation with a clear [`Error::Unsupported`].
//!
//! ## Example
//!
//! ```no_run
//! use udpx::{Batch, SendMode, UdpSocket, Want};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tx = UdpSocket::builder("127.0.0.1:0".parse()?).send_mode(SendMode::GsoSendmmsg).bind()?;
//! let rx = UdpSocket::builder("127.0.0.1:0".parse()?).gro(Want::IfAvailable).bind()?;
//! let mut batch = Batch::for_socket(&tx);
//! for i in 0..100u8 {
//!     batch.push(rx.local_addr(), &[i; 1200])?;
//! }
//! tx.send(&batch.transmits())?; // 1 syscall, 1 GSO buffer of 100 segments
//! println!("{}", tx.capabilities());
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]
#![cfg(target_os = "linux")]

mod blocking;
pub mod caps;
pub mod counters;
mod error;
pub mod generations;
pub mod gso;
pub mod icmp;
pub mod qdisc;
pub mod rcvbuf;
pub mod recv;
mod send;
pub mod shard;
mod socket;
mod sys;
pub mod transmit;
pub mod txtime;
#[cfg(feature = "io-uring")]
pub mod uring;
#[cfg(feature = "io-uring")]
mod uring_shard;
mod zc_send;
pub mod zerocopy;

pub use blocking::{enobufs_backoff, ENOBUFS_RETRIES, FINISH_WAIT};
pub use caps::{Capabilities, Feature, KernelCaps, Want};
pub use counters::CounterSnapshot;
pub use error::{Error, InvalidTransmit, SendError, SendErrorKind};
pub use gso::{Batch, DatagramMeta, Planned, SegmentLimits};
pub use icmp::{ErrorOrigin, IcmpError};
pub use recv::{RecvBuffers, RecvMeta, Segments, GRO_BUFFER};
pub use shard::{Shard, ShardGroup, Steering};
pub use socket::{RecvMode, ReusePort, SocketConfig, UdpSocket};
#[cfg(feature = "fault-injection")]
pub use sys::fault::Fault;
/// Reads of served files that never wait for the disk.
pub use sys::file;
/// What the kernel knows of a TCP connection, for a line per connection.
pub use sys::tcp;

/// The control-message codec, for fuzz targets and micro benchmarks (feature `internals`):
/// not a stable API.
#[cfg(feature = "internals")]
pub mod internals {
    pub use crate::sys::cmsg::{decode_bytes, encode_bytes, Cmsg, ExtErr, CMSG_CAP};
}
pub use transmit::{
    max_payload, messages, recycle_transmits, validate_transmit, EcnCodepoint, Family, Message, PathLimits,
    SendBuffers, SendCursor, SendMode, Transmit, MAX_PAYLOAD_V4, MAX_PAYLOAD_V6,
};
pub use txtime::{Timestamp, TxClock};
pub use zerocopy::{ZcBuf, ZcConfig, ZcPool, ZcSendError};
