//! # udpx-pace: pacing policy
//!
//! Pure pacing logic for udpx: no sockets, no clock reads. A [`Pacer`] keeps a shard of
//! flows, each with an earliest departure time, on a timing [`wheel`]; the caller passes
//! `now` to [`Pacer::advance_to`] and sends the [`Release`]s it gets back.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
mod pacer;
pub mod wheel;

pub use config::{FlowConfig, FlowParams, Granularity, PacerConfig, Source, MAX_DATAGRAM, MAX_RATE, MAX_SEGMENTS};
pub use error::PaceError;
pub use pacer::{phase, Pacer, Release};
