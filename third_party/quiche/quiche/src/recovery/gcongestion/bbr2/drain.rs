// Copyright (c) 2015 The Chromium Authors. All rights reserved.
// Use of this source code is governed by a BSD-style license that can be
// found in the LICENSE file.

// Copyright (C) 2023, Cloudflare, Inc.
// All rights reserved.
//
// Redistribution and use in source and binary forms, with or without
// modification, are permitted provided that the following conditions are
// met:
//
//     * Redistributions of source code must retain the above copyright notice,
//       this list of conditions and the following disclaimer.
//
//     * Redistributions in binary form must reproduce the above copyright
//       notice, this list of conditions and the following disclaimer in the
//       documentation and/or other materials provided with the distribution.
//
// THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS
// IS" AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO,
// THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
// PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR
// CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
// EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO,
// PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR
// PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF
// LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING
// NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS
// SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

use std::time::Instant;

use crate::recovery::gcongestion::bbr2::Params;
use crate::recovery::gcongestion::Acked;
use crate::recovery::gcongestion::Lost;
use crate::recovery::RecoveryStats;

use super::mode::Cycle;
use super::mode::Mode;
use super::mode::ModeImpl;
use super::network_model::BBRv2NetworkModel;
use super::BBRv2CongestionEvent;
use super::Limits;

#[derive(Debug)]
pub(super) struct Drain {
    pub(super) model: BBRv2NetworkModel,
    pub(super) cycle: Cycle,
}

impl ModeImpl for Drain {
    #[cfg(feature = "qlog")]
    fn state_str(&self) -> &'static str {
        "bbr_drain"
    }

    fn is_probing_for_bandwidth(&self) -> bool {
        false
    }

    fn on_congestion_event(
        mut self, _prior_in_flight: usize, event_time: Instant,
        _acked_packets: &[Acked], _lost_packets: &[Lost],
        congestion_event: &mut BBRv2CongestionEvent,
        _target_bytes_inflight: usize, params: &Params,
        _recovery_stats: &mut RecoveryStats, _cwnd: usize,
    ) -> Mode {
        self.model.set_pacing_gain(params.drain_pacing_gain);
        // Only STARTUP can transition to DRAIN, both of them use the same cwnd
        // gain.
        self.model.set_cwnd_gain(params.drain_cwnd_gain);

        let drain_target = self.drain_target(congestion_event.min_cwnd);
        if congestion_event.bytes_in_flight <= drain_target {
            return self.into_probe_bw(
                event_time,
                Some(congestion_event),
                params,
            );
        }

        Mode::Drain(self)
    }

    fn get_cwnd_limits(&self, _params: &Params) -> Limits<usize> {
        Limits {
            lo: 0,
            hi: self.model.inflight_lo(),
        }
    }

    fn on_exit_quiescence(
        self, _now: Instant, _quiescence_start_time: Instant, _params: &Params,
    ) -> Mode {
        Mode::Drain(self)
    }

    fn enter(
        &mut self, _: Instant, _: Option<&BBRv2CongestionEvent>, _params: &Params,
    ) {
    }

    fn leave(&mut self, _: Instant, _: Option<&BBRv2CongestionEvent>) {}
}

impl Drain {
    fn into_probe_bw(
        mut self, now: Instant, congestion_event: Option<&BBRv2CongestionEvent>,
        params: &Params,
    ) -> Mode {
        self.leave(now, congestion_event);
        let mut next_mode = Mode::probe_bw(self.model, self.cycle);
        next_mode.enter(now, congestion_event, params);
        next_mode
    }

    /// DRAIN ends once the bytes in flight are down to the estimated BDP, or
    /// to the minimum congestion window where the BDP is smaller: on a path
    /// whose BDP is below a packet or two, a sender that always has a packet
    /// written and not yet acknowledged would otherwise never leave DRAIN,
    /// and would pace at its drain gain (1/2.885 of the bottleneck) for good.
    fn drain_target(&self, min_cwnd: usize) -> usize {
        self.model.bdp0().max(min_cwnd)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::recovery::gcongestion::bbr2::DEFAULT_PARAMS;

    /// A model of a 1.5 MB/s path whose minimum RTT is 60 us (veth behind
    /// a 12 Mbit/s shaper: a packet that finds the shaper's bucket full
    /// crosses at once), taken as the model's initial RTT: then 1,200-byte
    /// packets sent 800 us apart, each acknowledged 2.8 ms later (the
    /// sender's pacing holds are in its RTT samples). Its BDP is 90 bytes.
    fn low_bdp_model(start: Instant) -> BBRv2NetworkModel {
        let params = &DEFAULT_PARAMS;
        let mut model =
            BBRv2NetworkModel::new(params, Duration::from_micros(60));
        let rtt = Duration::from_micros(2800);
        let mut in_flight = std::collections::VecDeque::new();
        for pn in 0..60u64 {
            let now = start + Duration::from_micros(800) * pn as u32;
            while in_flight
                .front()
                .is_some_and(|&(_, sent): &(u64, Instant)| sent + rtt <= now)
            {
                let (acked_pn, sent) = in_flight.pop_front().unwrap();
                let acked = [Acked {
                    pkt_num: acked_pn,
                    time_sent: sent,
                }];
                let bytes = 1200 * (in_flight.len() + 1);
                let mut event = BBRv2CongestionEvent::new(
                    sent + rtt,
                    12_000,
                    bytes,
                    false,
                    12_000,
                );
                model.on_congestion_event_start(
                    &acked,
                    &[],
                    &mut event,
                    params,
                );
                model.on_congestion_event_finish(acked_pn + 1, &event);
            }
            model.on_packet_sent(now, 1200 * in_flight.len(), pn, 1200, true);
            in_flight.push_back((pn, now));
        }
        model
    }

    /// Whether DRAIN ends at an acknowledgement that leaves
    /// `bytes_in_flight` in flight, with a minimum window of `min_cwnd`.
    fn drain_ends(bytes_in_flight: usize, min_cwnd: usize) -> bool {
        let start = Instant::now();
        let model = low_bdp_model(start);
        assert!(
            model.bdp0() < 1200,
            "the model's BDP is {} bytes, not below a packet",
            model.bdp0()
        );
        let drain = Drain {
            model,
            cycle: Default::default(),
        };
        let now = start + Duration::from_millis(20);
        let mut event = BBRv2CongestionEvent::new(
            now,
            min_cwnd,
            bytes_in_flight + 1200,
            false,
            min_cwnd,
        );
        event.bytes_in_flight = bytes_in_flight;
        event.bytes_acked = 1200;
        let mode = drain.on_congestion_event(
            bytes_in_flight + 1200,
            now,
            &[],
            &[],
            &mut event,
            bytes_in_flight,
            &DEFAULT_PARAMS,
            &mut Default::default(),
            min_cwnd,
        );
        matches!(mode, Mode::ProbeBW(_))
    }

    #[test]
    fn drain_ends_at_the_minimum_window_when_the_bdp_is_smaller() {
        // A host that paces in user space writes its next packet before the
        // last one is acknowledged: one or two packets are in flight at
        // every acknowledgement. With a BDP of 90 bytes, DRAIN ended only at
        // an empty pipe, that is never.
        assert!(drain_ends(2400, 12_000));
        assert!(drain_ends(0, 12_000));
        // Above the minimum window DRAIN goes on, as before.
        assert!(!drain_ends(24_000, 12_000));
        // Without a minimum window the BDP alone decides.
        assert!(!drain_ends(2400, 0));
    }
}
