//! Property tests: the pacer's promises over random flows, clocks and churn, and the wheel
//! against a plain model.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use udpx_pace::wheel::Wheel;
use udpx_pace::{FlowConfig, Granularity, Pacer, PacerConfig, Release, Source};

const SLOT: u64 = 250_000;
const T0: u64 = 1_000_000_000;

/// A flow the pacer accepts: rate, size, batch, burst beyond the batch.
fn flow_strategy() -> impl Strategy<Value = FlowConfig> {
    (1_000u64..=20_000_000, 64u32..=1_500, 1u32..=8, 0u32..=8)
        .prop_map(|(rate, size, batch, extra)| FlowConfig {
            granularity: Granularity::Segments(batch),
            burst: Some(batch + extra),
            ..FlowConfig::new(rate, size)
        })
        .prop_filter("interval at least a slot", |f| f.validate(SLOT).is_ok())
}

/// Time between calls: mostly around a slot, sometimes a stall of up to 50 ms.
fn step_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![9 => 0u64..600_000, 1 => 0u64..50_000_000]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// No flow ever sends more than `rate x time + burst` (to 1 ns of rounding), over any
    /// span of its actual send times, however the calls come: early, late or after stalls;
    /// with aggregate smoothing on or off.
    /// Every release is due, non-empty and within the burst.
    #[test]
    fn never_above_rate_times_time_plus_burst(
        flows in proptest::collection::vec(flow_strategy(), 1..4),
        steps in proptest::collection::vec(step_strategy(), 1..400),
        smoothing_pct in prop_oneof![Just(0u32), 101u32..400],
    ) {
        let cfg = PacerConfig { max_flows: 8, smoothing_pct, ..PacerConfig::default() };
        let mut p = Pacer::new(cfg, T0).unwrap();
        let ids: Vec<u32> = flows.iter().map(|f| p.add_flow(*f, T0).unwrap()).collect();
        let mut sends: HashMap<u32, Vec<(u64, u32)>> = HashMap::new();
        let mut out = Vec::new();
        let mut now = T0;
        for dt in steps {
            now += dt;
            p.advance_to(now, &mut out);
            for r in &out {
                let cfg = flows[ids.iter().position(|&i| i == r.flow).unwrap()];
                let burst = cfg.burst.unwrap();
                prop_assert!(r.due_ns <= now);
                prop_assert!(r.datagrams >= 1 && r.datagrams <= burst);
                sends.entry(r.flow).or_default().push((now, r.datagrams));
            }
        }
        for (k, &id) in ids.iter().enumerate() {
            let cfg = flows[k];
            let (rate, size, burst) = (u128::from(cfg.rate), u128::from(cfg.datagram_size), u128::from(cfg.burst.unwrap()));
            let s = sends.get(&id).map(Vec::as_slice).unwrap_or(&[]);
            for i in 0..s.len() {
                let mut datagrams = 0u128;
                for j in i..s.len() {
                    datagrams += u128::from(s[j].1);
                    let span = u128::from(s[j].0 - s[i].0);
                    prop_assert!(
                        datagrams * size * 1_000_000_000 <= rate * (span + 1) + burst * size * 1_000_000_000,
                        "flow {k} {cfg:?}: {datagrams} datagrams in {span} ns"
                    );
                }
            }
        }
    }

    /// Waking exactly when told (the end of each busy slot), every release is the batch and
    /// the intended departures are exactly one interval apart: the rate is kept to the
    /// nanosecond, with nothing lost to the slot quantization.
    #[test]
    fn on_time_wakes_keep_exact_spacing(
        flows in proptest::collection::vec(
            flow_strategy().prop_map(|f| FlowConfig { burst: None, ..f }), 1..6),
    ) {
        let mut p = Pacer::new(PacerConfig { max_flows: 8, ..PacerConfig::default() }, T0).unwrap();
        let ids: Vec<u32> = flows.iter().map(|f| p.add_flow(*f, T0).unwrap()).collect();
        let mut last: HashMap<u32, u64> = HashMap::new();
        let mut out = Vec::new();
        let mut wakes = 0;
        while let Some(wake) = p.next_wakeup() {
            if wakes == 2_000 {
                break;
            }
            wakes += 1;
            p.advance_to(wake, &mut out);
            for r in &out {
                let cfg = flows[ids.iter().position(|&i| i == r.flow).unwrap()];
                let params = cfg.validate(SLOT).unwrap();
                prop_assert_eq!(r.datagrams, params.batch);
                prop_assert!(wake - r.due_ns <= SLOT);
                if let Some(prev) = last.insert(r.flow, r.due_ns) {
                    prop_assert_eq!(r.due_ns - prev, params.duration_ns(params.batch));
                }
            }
        }
    }

    /// Flows added, removed, fed, re-rated and advanced in any order: only live flows are released, each
    /// at most once per call, never before due, never more than enqueued; no panic.
    #[test]
    fn churn(ops in proptest::collection::vec((0u8..5, any::<u32>(), 0u64..2_000_000), 1..300)) {
        let mut p = Pacer::new(PacerConfig { max_flows: 16, ..PacerConfig::default() }, T0).unwrap();
        let mut live: BTreeMap<u32, (Source, u64)> = BTreeMap::new(); // flow -> (source, left to send)
        let mut out: Vec<Release> = Vec::new();
        let mut now = T0;
        for (op, pick, arg) in ops {
            match op {
                0 => {
                    let source = if pick % 2 == 0 { Source::Streaming } else { Source::Queued };
                    let cfg = FlowConfig { source, ..FlowConfig::new(10_000 + u64::from(pick % 1_000_000), 1_000) };
                    match p.add_flow(cfg, now) {
                        Ok(id) => prop_assert!(live.insert(id, (source, 0)).is_none()),
                        Err(e) => prop_assert_eq!(live.len(), 16, "{}", e),
                    }
                }
                1 if !live.is_empty() => {
                    let id = *live.keys().nth(pick as usize % live.len()).unwrap();
                    p.remove_flow(id).unwrap();
                    live.remove(&id);
                    prop_assert!(p.remove_flow(id).is_err());
                }
                2 if !live.is_empty() => {
                    let id = *live.keys().nth(pick as usize % live.len()).unwrap();
                    let n = arg % 10;
                    p.enqueue(id, n, now).unwrap();
                    let entry = live.get_mut(&id).unwrap();
                    if entry.0 == Source::Queued {
                        entry.1 += n;
                    }
                }
                3 if !live.is_empty() => {
                    let id = *live.keys().nth(pick as usize % live.len()).unwrap();
                    let source = live[&id].0;
                    let cfg = FlowConfig { source, ..FlowConfig::new(10_000 + arg, 1_000) };
                    p.update_flow(id, cfg, now).unwrap();
                }
                _ => {
                    now += arg;
                    p.advance_to(now, &mut out);
                    let mut seen = Vec::new();
                    for r in &out {
                        prop_assert!(!seen.contains(&r.flow), "flow {} twice in one call", r.flow);
                        seen.push(r.flow);
                        prop_assert!(r.due_ns <= now && r.datagrams >= 1);
                        let entry = live.get_mut(&r.flow);
                        prop_assert!(entry.is_some(), "released a removed flow {}", r.flow);
                        let entry = entry.unwrap();
                        if entry.0 == Source::Queued {
                            prop_assert!(u64::from(r.datagrams) <= entry.1);
                            entry.1 -= u64::from(r.datagrams);
                        }
                    }
                }
            }
            prop_assert_eq!(p.len(), live.len());
            for (&id, &(_, left)) in &live {
                let state = p.flow_state(id).unwrap();
                if live[&id].0 == Source::Queued {
                    prop_assert_eq!(state.queued, left);
                }
            }
        }
    }

    /// The wheel agrees with a map of entry -> tick: same entries out, in tick order, the same
    /// next busy tick, through inserts (past, near, beyond the horizon), removals and jumps.
    #[test]
    fn wheel_matches_model(ops in proptest::collection::vec((0u8..3, 0u32..32, 0u64..200), 1..400)) {
        const SLOTS: u64 = 64;
        let mut w = Wheel::new(SLOT, SLOTS as u32, 32, T0).unwrap();
        let mut model: HashMap<u32, u64> = HashMap::new();
        let mut now = T0;
        let mut out = Vec::new();
        for (op, e, arg) in ops {
            match op {
                0 if !model.contains_key(&e) => {
                    // due between 10 slots ago and 190 slots ahead
                    let due = (now + arg * SLOT).saturating_sub(10 * SLOT);
                    let tick = (due / SLOT).clamp(w.cursor(), w.cursor() + SLOTS - 1);
                    prop_assert_eq!(w.insert(e, due), tick);
                    model.insert(e, tick);
                }
                1 => prop_assert_eq!(w.remove(e), model.remove(&e).is_some()),
                _ => {
                    now += arg * SLOT / 3;
                    out.clear();
                    w.expire(now, &mut out);
                    let target = now / SLOT;
                    let mut want: Vec<u32> = model.iter().filter(|(_, &t)| t < target).map(|(&e, _)| e).collect();
                    want.sort_unstable();
                    let ticks: Vec<u64> = out.iter().map(|e| model[e]).collect();
                    prop_assert!(ticks.windows(2).all(|p| p[0] <= p[1]), "out of tick order");
                    let mut got = out.clone();
                    got.sort_unstable();
                    prop_assert_eq!(got, want);
                    model.retain(|_, &mut t| t >= target);
                }
            }
            prop_assert_eq!(w.len(), model.len());
            prop_assert_eq!(w.next_busy_tick(), model.values().min().copied());
        }
    }
}
