//! # udpx-pace: pacing policy
//!
//! Pure pacing logic for udpx: no sockets, no clock reads. This first part holds the
//! configuration checks ([`FlowConfig`], [`PacerConfig`], [`PaceError`]) and the timing
//! [`wheel`]; the pacer over them follows.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
pub mod wheel;

pub use config::{FlowConfig, FlowParams, Granularity, PacerConfig, Source, MAX_DATAGRAM, MAX_RATE, MAX_SEGMENTS};
pub use error::PaceError;
