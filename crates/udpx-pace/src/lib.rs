//! # udpx-pace: pacing policy
//!
//! Pure pacing logic for udpx: no sockets, no clock reads, no allocation after
//! [`Pacer::new`]. A [`Pacer`] keeps one core's shard of flows, each with an earliest
//! departure time, on a timing [`wheel`]. The caller owns the clock and the socket: it sleeps
//! to [`Pacer::next_wakeup`], passes `now` to [`Pacer::advance_to`], and sends the
//! [`Release`]s it gets back (one GSO buffer per flow, all of them in one `sendmmsg`). Tests
//! drive the same code with a fake clock.
//!
//! ## Why user-space pacing, and why this shape
//!
//! A burst is fast at small time scales even when the flow is slow, and routers drop what
//! arrives faster than they drain (the paper, "Pacing"). The kernel paces a *connected* socket
//! with `SO_MAX_PACING_RATE`, and any socket's datagrams with `SO_TXTIME` under fq or etf
//! ("Earliest Departure Time"). A server multiplexing 10,000 flows over a few unconnected
//! sockets, on a machine whose qdisc may ignore the timestamp, has to decide departures
//! itself. Timers are the constraint: tokio/mio round up to 1 ms; `clock_nanosleep` and
//! timerfd wake 25-50 us late at p50 and 50-110 us at p99, and each wake costs 20-30 us of
//! CPU. So the pacer wakes once per busy slot and sends every flow due in it.
//!
//! ## Earliest departure time
//!
//! Each flow keeps `edt`, the time its next batch may leave. A release at `now` (>= `edt`):
//!
//! ```text
//! start = max(edt, now - catch_up)        catch_up = (burst - batch) x size / rate
//! n     = batch                           on time, or at most one slot late
//!       = min(burst, batch + paid)        more than a slot late: paid = (now - start) x rate / size
//! edt   = start + n x size / rate         (durations rounded up: the rate is never exceeded)
//! ```
//!
//! This is a token bucket of `burst` datagrams read off the caller's `now`, so over any span
//! `d` of actual send times a flow sends at most `rate x d + burst x size` bytes (to 1 ns of
//! rounding), however late or irregular the calls (property-tested). A release late by up to
//! `catch_up` moves nothing: the intended departures stay exactly `batch x size / rate` apart,
//! so slot quantization and timer lateness cost no rate. After a stall a flow sends at most its
//! burst at once and then resumes its schedule. Each [`Release`] carries the `due_ns` it was
//! meant to leave at (`now - due_ns` is the departure error; passed as `SCM_TXTIME` it is in the
//! past, so the kernel sends at once).
//!
//! A new flow's first departure is `now + phase`, the phase a Fibonacci hash of its index
//! spread over one interval ([`phase`]): consecutive indices fall evenly across the interval,
//! so flows added together never leave together.
//!
//! ## The wheel
//!
//! ```text
//!   slot = 250 us, slots = 4096 (power of two), horizon = 1.024 s
//!
//!              cursor (first tick not yet expired)
//!                 v
//!   ticks   ... | t  | t+1 | t+2 | ... | t+4095 |      tick = due_ns / slot
//!   slots       |  5 |  6  |  7  | ... |   4    |      slot = tick & (slots - 1)
//!   heads       | 17 | NIL |  3  | ... |   9    |      u32 flow index, NIL = u32::MAX
//!   busy bits   |  1 |  0  |  1  | ... |   1    |      one bit per slot, 64 per word
//!                 |           |
//!   flow table    17 <-> 2    3 <-> 40 <-> 8         next/prev: u32 links indexed by flow
//! ```
//!
//! A flow sits in the slot of its `edt` (the cursor's if that is past; the last slot if beyond
//! the horizon, re-filed when it comes out early). A slot is released once it has fully
//! elapsed, so a datagram leaves between 0 and one slot after its `edt`, plus the timer's
//! lateness: p50 about slot/2 + 40 us, p99 under slot + 110 us. The busy bitmap gives the next
//! busy slot in a few word scans: [`Pacer::next_wakeup`] is its end, so the caller sleeps
//! straight to it and never wakes for an empty slot. Insert and remove are O(1) through the
//! links; [`Pacer::advance_to`] takes each expired flow once per call.
//!
//! ## Batch versus interval (Figure 4)
//!
//! Datagrams per release trade smoothness for cost. The paper measured, for bursts of
//! 1 / 2 / 4 / 8 datagrams, CPU time 100 / 92 / 88 / 84 % and relative loss 100 / 103 / 110 /
//! 117 %, and suggests an interval of 8 ms with up to 8 segments as a reasonable trade-off. A
//! 1 MB/s flow at a 1 ms interval sends 1 KB per release: less than a segment, no GSO at all.
//! So a flow's [`Granularity`] is either the segments per release (default 2, the interval
//! follows) or the interval (the batch follows: rate x interval / size). More than the batch
//! is sent only when a release is more than a slot late (overload, a stall), and never more
//! than the burst. A flow whose interval is shorter than a slot is refused
//! ([`PaceError::IntervalBelowSlot`]): it would need several departures per wake.
//!
//! ## After a late wake: aggregate smoothing
//!
//! Each flow's token bucket bounds that flow, not the sum: after the thread was preempted
//! for 5 ms, every flow due meanwhile is late, and released together they put 5 ms of the
//! whole shard's traffic on the wire in one burst, which a bottleneck's queue drops.
//! [`PacerConfig::smoothing_pct`] (the stream server uses 125 %) lets the releases of one
//! advance add up to at most that share of the flows' summed rate over the time since the
//! previous one, plus a slot's worth: flows more than a slot late beyond it stay due for the
//! next slot with their credit kept, so the backlog drains at 1.25x the aggregate rate (a
//! 10 ms stall: 40 ms). Flows due within the last slot always go, so an on-time pacer is
//! unchanged (the 10,000-flow figures hold with it on), and a flow still gets its rate while
//! it waits less than its catch-up allowance.
//!
//! ## Sources
//!
//! [`Source::Streaming`] flows always have data (the paper's video server): released at their
//! rate for as long as they exist. [`Source::Queued`] flows send what [`Pacer::enqueue`] gave
//! them and leave the wheel when empty; an idle flow keeps at most its burst of credit.
//!
//! ## Example
//!
//! ```
//! use udpx_pace::{FlowConfig, Pacer, PacerConfig};
//!
//! let start = 1_000_000_000; // ns of CLOCK_MONOTONIC, e.g. udpx::Timestamp::now().as_nanos()
//! let mut pacer = Pacer::new(PacerConfig::default(), start)?;
//! let flow = pacer.add_flow(FlowConfig::new(4_000, 1_200), start)?; // 4 kB/s, 2 x 1200 B
//! let mut due = Vec::with_capacity(pacer.max_releases());
//! let mut sent = 0;
//! while let Some(wake) = pacer.next_wakeup() {
//!     if wake > start + 3_000_000_000 {
//!         break;
//!     }
//!     // a server sleeps here (clock_nanosleep to `wake`) and reads the clock
//!     pacer.advance_to(wake, &mut due);
//!     for r in &due {
//!         assert_eq!(r.flow, flow);
//!         sent += r.datagrams; // a server builds a GSO transmit of r.datagrams segments
//!     }
//! }
//! assert_eq!(sent, 10); // 3 s at 4 kB/s = 12 kB = 10 x 1200 B
//! # Ok::<(), udpx_pace::PaceError>(())
//! ```
//!
//! ## Not here
//!
//! Sockets, clocks and kernel pacing (`SO_TXTIME` under fq, `SO_MAX_PACING_RATE`) belong to
//! the caller: `udpx stream serve` and the Figure 4 bench will put this pacer on udpx sockets.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
mod pacer;
pub mod wheel;

pub use config::{FlowConfig, FlowParams, Granularity, PacerConfig, Source, MAX_DATAGRAM, MAX_RATE, MAX_SEGMENTS};
pub use error::PaceError;
pub use pacer::{phase, FlowState, Pacer, Release};
