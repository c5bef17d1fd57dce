//! What a receiver makes of the datagrams it got: per flow and in aggregate. Pure: fed parsed
//! headers and receive times, no sockets, so the arithmetic is tested on made-up streams.
//!
//! The measures, and which clock each reads:
//! - **loss**: datagrams the server says it sent (its End message) minus distinct ones that
//!   arrived; without an End (lost, or the run cut short), the highest sequence number + 1.
//! - **reordering**: arrivals with a sequence number below one already seen; **duplicates**:
//!   a sequence number seen twice (counted, not delivered twice).
//! - **departure error**: `sent - intended`, both the server's clock: how late the pacer (timer,
//!   wheel slot, work) handed a release to the kernel. Negative when the server sent ahead
//!   for a qdisc that holds packets to their time (kernel pacing): counted as `early`.
//! - **arrival lag**: receive time - intended (the same clock when both ends run on one
//!   machine, as in the self-test and the bench): departure error plus network and receive
//!   batching. An upper bound, shown beside the departure error.
//! - **burstiness**: share of a flow's datagrams sent within [`CLOSE_NS`] of its previous
//!   one (server times), and the longest such run: GSO segments of one release count as back
//!   to back, as they are on the wire.
//! - **rate error**: per flow, bytes sent before its last release / (last - first send time),
//!   against the flow's rate.
//! - **1 ms bins**: the aggregate bytes per 1 ms of send time over the steady window (first and
//!   last second left out); max / mean shows flows synchronising.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::wire::Data;

/// Two datagrams of one flow sent this close (ns) are back to back.
pub const CLOSE_NS: u64 = 100_000;
/// Width of an aggregate rate bin, ns.
pub const BIN_NS: u64 = 1_000_000;
/// Highest sequence number a flow may use (its bitmap is sized by it).
pub const MAX_SEQ: u64 = 1 << 30;
/// Left out at each end of the run when binning, ns (flows start and stop there).
pub const EDGE_NS: u64 = 1_000_000_000;

/// One flow as seen by its receiver.
#[derive(Debug, Clone, Default)]
pub struct FlowTally {
    /// The flow's rate from its headers, bytes/s (0 until data arrives).
    pub rate: u64,
    /// Distinct datagrams received.
    pub received: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Datagrams received again.
    pub duplicates: u64,
    /// Datagrams that arrived after one with a higher sequence number.
    pub reordered: u64,
    /// Highest sequence number seen.
    pub highest: Option<u64>,
    /// Datagrams the server said it sent (End).
    pub end_count: Option<u64>,
    /// Datagrams sent within [`CLOSE_NS`] of the flow's previous one.
    pub close: u64,
    /// Longest run of back-to-back datagrams.
    pub max_run: u32,
    seen: Vec<u64>,
    first_sent: Option<u64>,
    last_sent: u64,
    bytes_at_last: u64,
    prev_sent: Option<u64>,
    run: u32,
}

impl FlowTally {
    /// Records one datagram; false if it was a duplicate.
    fn record(&mut self, d: &Data) -> bool {
        let word = (d.seq / 64) as usize;
        if word >= self.seen.len() {
            self.seen.resize(word + 1, 0);
        }
        let bit = 1u64 << (d.seq % 64);
        if self.seen[word] & bit != 0 {
            self.duplicates += 1;
            return false;
        }
        self.seen[word] |= bit;
        self.rate = d.rate;
        self.received += 1;
        self.bytes += u64::from(d.size);
        match self.highest {
            Some(h) if d.seq < h => self.reordered += 1,
            _ => self.highest = Some(d.seq),
        }
        // Burstiness, in send-time order as far as arrival order allows.
        match self.prev_sent {
            Some(p) if d.sent_ns.abs_diff(p) <= CLOSE_NS => {
                self.close += 1;
                self.run += 1;
            }
            _ => self.run = 1,
        }
        self.max_run = self.max_run.max(self.run);
        self.prev_sent = Some(d.sent_ns);
        // Rate: bytes sent strictly before the last send time over the span.
        if self.first_sent.is_none() {
            self.first_sent = Some(d.sent_ns);
        }
        match d.sent_ns.cmp(&self.last_sent) {
            std::cmp::Ordering::Greater => {
                self.last_sent = d.sent_ns;
                self.bytes_at_last = u64::from(d.size);
            }
            std::cmp::Ordering::Equal => self.bytes_at_last += u64::from(d.size),
            std::cmp::Ordering::Less => {}
        }
        true
    }

    /// Datagrams lost: by the server's count where it arrived, else up to the highest seen.
    pub fn lost(&self) -> u64 {
        let sent = self.end_count.unwrap_or_else(|| self.highest.map_or(0, |h| h + 1));
        sent.saturating_sub(self.received)
    }

    /// Datagrams the server sent, as far as this receiver knows.
    pub fn sent(&self) -> u64 {
        self.lost() + self.received
    }

    /// Measured rate / configured rate - 1, once the flow has two send times.
    pub fn rate_error(&self) -> Option<f64> {
        let first = self.first_sent?;
        if self.last_sent <= first || self.rate == 0 {
            return None;
        }
        let measured = (self.bytes - self.bytes_at_last) as f64 * 1e9 / (self.last_sent - first) as f64;
        Some(measured / self.rate as f64 - 1.0)
    }
}

/// Percentiles of a distribution, in its unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    fn of_histogram(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            p50: h.value_at_quantile(0.5) as f64,
            p99: h.value_at_quantile(0.99) as f64,
            p999: h.value_at_quantile(0.999) as f64,
            max: h.max() as f64,
        }
    }

    fn of_sorted(v: &[f64]) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Percentiles { p50: at(0.5), p99: at(0.99), p999: at(0.999), max: v[v.len() - 1] }
    }
}

/// Everything a receiver saw.
#[derive(Debug)]
pub struct Tally {
    flows: Vec<FlowTally>,
    departure: Histogram<u64>,
    early_by: Histogram<u64>,
    arrival: Histogram<u64>,
    early: u64,
    bins: HashMap<u64, u64>,
    /// Datagrams that were not a well-formed message for the socket they arrived on.
    pub malformed: u64,
}

/// The aggregate, as the table and the JSON show it. Times in ns, rates in bytes/s.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Flows asked for.
    pub flows: usize,
    /// Flows that got at least one datagram.
    pub flows_with_data: usize,
    /// Flows whose End message arrived (their loss is exact).
    pub flows_ended: usize,
    /// Distinct datagrams received.
    pub datagrams: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Datagrams the server sent, as far as the receivers know (see [`FlowTally::sent`]).
    pub sent: u64,
    /// Datagrams lost.
    pub lost: u64,
    /// `lost / sent`, percent.
    pub loss_pct: f64,
    /// Datagrams received twice or more (counted once).
    pub duplicates: u64,
    /// Datagrams that arrived out of order.
    pub reordered: u64,
    /// Not-well-formed datagrams.
    pub malformed: u64,
    /// Bytes received over the span of their send times, bytes/s.
    pub goodput: f64,
    /// Departure error (sent - intended), ns.
    pub departure_error_ns: Percentiles,
    /// Datagrams handed to the kernel before their departure time (kernel pacing): not in
    /// `departure_error_ns`, which then says nothing about when they left.
    pub early: u64,
    /// How early those were handed over, ns.
    pub early_by_ns: Percentiles,
    /// Arrival lag (receive time - intended), ns.
    pub arrival_lag_ns: Percentiles,
    /// Share of datagrams sent within 100 us of their flow's previous one.
    pub burstiness: f64,
    /// Longest run of one flow's back-to-back datagrams.
    pub max_back_to_back: u32,
    /// |measured / configured rate - 1| over flows, as a fraction.
    pub rate_error: Percentiles,
    /// Mean of the aggregate 1 ms bins over the steady window, bytes/s.
    pub bin_mean: f64,
    /// Largest 1 ms bin, bytes/s.
    pub bin_max: f64,
    /// `bin_max / bin_mean` (1.0 is perfectly smooth).
    pub bin_max_over_mean: f64,
}

impl Tally {
    /// A tally for flows `0..flows`.
    pub fn new(flows: usize) -> Tally {
        let h = || Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("static bounds");
        Tally {
            flows: vec![FlowTally::default(); flows],
            departure: h(),
            early_by: h(),
            arrival: h(),
            early: 0,
            bins: HashMap::new(),
            malformed: 0,
        }
    }

    /// Per-flow tallies.
    pub fn flows(&self) -> &[FlowTally] {
        &self.flows
    }

    /// A data datagram arrived on flow `flow`'s socket at `recv_ns`.
    pub fn data(&mut self, flow: usize, d: &Data, recv_ns: u64) {
        let Some(f) = self.flows.get_mut(flow) else {
            self.malformed += 1;
            return;
        };
        // A sequence number beyond 2^30 (a thousand years at 4 kB/s... or corruption) must not
        // size the bitmap.
        if d.flow as usize != flow || d.seq >= MAX_SEQ {
            self.malformed += 1;
            return;
        }
        if !f.record(d) {
            return;
        }
        if d.sent_ns >= d.intended_ns {
            let _ = self.departure.record((d.sent_ns - d.intended_ns).max(1));
        } else {
            self.early += 1;
            let _ = self.early_by.record(d.intended_ns - d.sent_ns);
        }
        let _ = self.arrival.record(recv_ns.saturating_sub(d.intended_ns).max(1));
        *self.bins.entry(d.sent_ns / BIN_NS).or_insert(0) += u64::from(d.size);
    }

    /// Flow `flow`'s End arrived.
    pub fn end(&mut self, flow: usize, count: u64) {
        match self.flows.get_mut(flow) {
            Some(f) => f.end_count = Some(count),
            None => self.malformed += 1,
        }
    }

    /// Whether every flow that got data has also got its End.
    pub fn all_ended(&self) -> bool {
        self.flows.iter().all(|f| f.end_count.is_some())
    }

    /// Departure errors as (ns, share of datagrams at or below) points, for a CDF plot.
    pub fn departure_cdf(&self, points: usize) -> Vec<(f64, f64)> {
        cdf(&self.departure, points)
    }

    /// The aggregate rate per 1 ms bin over the steady window, bytes/s.
    pub fn bins(&self) -> Vec<f64> {
        let (Some(&lo), Some(&hi)) = (self.bins.keys().min(), self.bins.keys().max()) else {
            return Vec::new();
        };
        let edge = EDGE_NS / BIN_NS;
        if hi < lo + 2 * edge + 1 {
            return Vec::new();
        }
        (lo + edge..hi - edge).map(|b| self.bins.get(&b).copied().unwrap_or(0) as f64 * (1e9 / BIN_NS as f64)).collect()
    }

    /// The aggregate.
    pub fn summary(&self) -> Summary {
        let mut s = Summary { flows: self.flows.len(), malformed: self.malformed, ..Summary::default() };
        let mut close = 0;
        let mut errors = Vec::new();
        let (mut t0, mut t1) = (u64::MAX, 0);
        for f in &self.flows {
            s.flows_with_data += usize::from(f.received > 0);
            s.flows_ended += usize::from(f.end_count.is_some());
            s.datagrams += f.received;
            s.bytes += f.bytes;
            s.sent += f.sent();
            s.lost += f.lost();
            s.duplicates += f.duplicates;
            s.reordered += f.reordered;
            s.max_back_to_back = s.max_back_to_back.max(f.max_run);
            close += f.close;
            if let Some(e) = f.rate_error() {
                errors.push(e.abs());
            }
            if let Some(first) = f.first_sent {
                t0 = t0.min(first);
                t1 = t1.max(f.last_sent);
            }
        }
        if s.sent > 0 {
            s.loss_pct = 100.0 * s.lost as f64 / s.sent as f64;
        }
        if s.datagrams > 0 {
            s.burstiness = close as f64 / s.datagrams as f64;
        }
        if t1 > t0 {
            s.goodput = s.bytes as f64 * 1e9 / (t1 - t0) as f64;
        }
        errors.sort_by(f64::total_cmp);
        s.rate_error = Percentiles::of_sorted(&errors);
        s.departure_error_ns = Percentiles::of_histogram(&self.departure);
        s.arrival_lag_ns = Percentiles::of_histogram(&self.arrival);
        s.early = self.early;
        s.early_by_ns = Percentiles::of_histogram(&self.early_by);
        let bins = self.bins();
        if !bins.is_empty() {
            s.bin_mean = bins.iter().sum::<f64>() / bins.len() as f64;
            s.bin_max = bins.iter().copied().fold(0.0, f64::max);
            if s.bin_mean > 0.0 {
                s.bin_max_over_mean = s.bin_max / s.bin_mean;
            }
        }
        s
    }
}

fn cdf(h: &Histogram<u64>, points: usize) -> Vec<(f64, f64)> {
    if h.is_empty() || points < 2 {
        return Vec::new();
    }
    (0..points)
        .map(|i| {
            let q = i as f64 / (points - 1) as f64;
            (h.value_at_quantile(q) as f64, q)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(flow: u32, seq: u64, intended: u64, sent: u64) -> Data {
        Data { flow, secret: 1, size: 1000, seq, intended_ns: intended, sent_ns: sent, rate: 1_000_000 }
    }

    /// A flow at 1 MB/s in 1000 B datagrams, two per release every 2 ms, each sent 30 us late.
    fn steady(t: &mut Tally, flow: u32, releases: u64) {
        for r in 0..releases {
            let due = 1_000_000_000 + r * 2_000_000;
            for k in 0..2 {
                t.data(flow as usize, &data(flow, 2 * r + k, due, due + 30_000), due + 80_000);
            }
        }
    }

    #[test]
    fn a_steady_flow() {
        let mut t = Tally::new(1);
        steady(&mut t, 0, 2000);
        t.end(0, 4000);
        let s = t.summary();
        assert_eq!((s.datagrams, s.sent, s.lost, s.duplicates, s.reordered), (4000, 4000, 0, 0, 0));
        assert_eq!(s.flows_ended, 1);
        assert!((s.departure_error_ns.p50 - 30_000.0).abs() < 100.0, "{:?}", s.departure_error_ns);
        assert!((s.arrival_lag_ns.p99 - 80_000.0).abs() < 100.0);
        assert_eq!(s.burstiness, 0.5, "the second segment of each release is back to back");
        assert_eq!(s.max_back_to_back, 2);
        assert!(s.rate_error.max < 1e-9, "{:?}", s.rate_error);
        // 4 s of sends, the bins leave out a second at each end: every other 1 ms bin holds a
        // release of 2000 B, so the max is twice the mean.
        assert!((s.bin_max_over_mean - 2.0).abs() < 0.01, "{}", s.bin_max_over_mean);
    }

    #[test]
    fn loss_duplicates_reordering() {
        let mut t = Tally::new(2);
        for seq in [0, 1, 3, 2, 2, 5] {
            t.data(0, &data(0, seq, 0, seq * 1_000_000), 0);
        }
        let f = &t.flows()[0];
        assert_eq!((f.received, f.duplicates, f.reordered, f.lost()), (5, 1, 1, 1), "seq 4 missing");
        t.end(0, 8);
        assert_eq!(t.flows()[0].lost(), 3, "the End says 8 were sent: 4, 6, 7 lost");
        // A datagram on the wrong flow's socket, a flow number out of range.
        t.data(1, &data(0, 9, 0, 0), 0);
        t.data(5, &data(5, 0, 0, 0), 0);
        t.end(9, 1);
        assert_eq!(t.malformed, 3);
        assert!(!t.all_ended());
    }

    #[test]
    fn rate_error_and_bursts() {
        let mut t = Tally::new(1);
        // 1000 B every 1 ms = 1 MB/s exactly, but 10 % too fast: every 0.9 ms.
        for seq in 0..100 {
            t.data(0, &data(0, seq, 0, seq * 900_000), 0);
        }
        let e = t.flows()[0].rate_error().unwrap();
        assert!((e - (1.0 / 0.9 - 1.0)).abs() < 1e-9, "{e}");
        // A stall: five datagrams sent at once.
        for seq in 100..105 {
            t.data(0, &data(0, seq, 0, 200_000_000), 0);
        }
        assert_eq!(t.flows()[0].max_run, 5);
    }

    #[test]
    fn early_departures_are_counted() {
        let mut t = Tally::new(1);
        t.data(0, &data(0, 0, 5_000_000, 1_000_000), 6_000_000);
        let s = t.summary();
        assert_eq!(s.early, 1);
        assert_eq!(s.departure_error_ns.max, 0.0, "an early datagram is no departure error");
        assert!((s.early_by_ns.max - 4_000_000.0).abs() < 5_000.0, "{:?}", s.early_by_ns);
    }

    #[test]
    fn absurd_sequence_numbers_do_not_allocate() {
        let mut t = Tally::new(1);
        t.data(0, &data(0, u64::MAX - 1, 0, 0), 0);
        assert_eq!(t.flows()[0].received, 0);
        assert!(t.flows()[0].seen.is_empty());
        assert_eq!(t.malformed, 1);
    }
}
