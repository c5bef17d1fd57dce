//! What a person reads (a table), what a program reads (JSON, fields documented on
//! [`Summary`] and [`ServerReport`]), and what a person looks at (an SVG of the departure
//! error distribution and of the aggregate send rate in 1 ms bins).
//!
//! The targets beside the figures are issue 9's for 10,000 flows x 4 kB/s; a run of another
//! shape is judged against the same numbers and says so.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use udpx_lab::chart::{self, escape};

use crate::client::{RecvConfig, RecvReport};
use crate::server::ServerReport;
use crate::tally::{Summary, Tally};

/// CPU per datagram the server should stay under, ns.
pub const TARGET_CPU_PER_DATAGRAM_NS: f64 = 8_000.0;
/// Largest p99 rate error, as a fraction (0.05 %).
pub const TARGET_RATE_ERROR_P99: f64 = 0.0005;
/// Largest max/mean of the 1 ms bins.
pub const TARGET_BIN_MAX_OVER_MEAN: f64 = 1.5;

/// The departure error targets for a slot: p50 <= slot/2 + 50 us, p99 <= slot + 150 us (ns).
pub fn departure_targets(slot: Duration) -> (f64, f64) {
    let s = slot.as_nanos() as f64;
    (s / 2.0 + 50_000.0, s + 150_000.0)
}

/// One judged line.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is judged.
    pub what: String,
    /// The figure.
    pub figure: f64,
    /// The bound it should stay at or under.
    pub at_most: f64,
    /// `figure <= at_most`, or `None` when there is nothing to judge (no data).
    pub met: Option<bool>,
}

impl Check {
    fn new(what: &str, figure: f64, at_most: f64, judgeable: bool) -> Check {
        Check { what: what.into(), figure, at_most, met: judgeable.then_some(figure <= at_most) }
    }

    fn word(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "no data",
        }
    }
}

/// The checks a run is judged by (issue 9's figures).
pub fn checks(s: &Summary, server: Option<&ServerReport>, slot: Duration) -> Vec<Check> {
    let (p50, p99) = departure_targets(slot);
    let has = s.datagrams > 0;
    // Handed to the kernel early (kernel pacing): when they left is the qdisc's business.
    let timed_here = has && s.early == 0;
    let mut v = vec![
        Check::new("departure error p50, us", s.departure_error_ns.p50 / 1e3, p50 / 1e3, timed_here),
        Check::new("departure error p99, us", s.departure_error_ns.p99 / 1e3, p99 / 1e3, timed_here),
        Check::new("per-flow rate error p99, %", s.rate_error.p99 * 100.0, TARGET_RATE_ERROR_P99 * 100.0, has),
        Check::new("1 ms bins max/mean", s.bin_max_over_mean, TARGET_BIN_MAX_OVER_MEAN, s.bin_mean > 0.0),
    ];
    if let Some(sv) = server {
        v.push(Check::new(
            "server CPU per datagram, us",
            sv.cpu_per_datagram_ns() / 1e3,
            TARGET_CPU_PER_DATAGRAM_NS / 1e3,
            sv.total.datagrams > 0 && sv.total.cpu_s > 0.0,
        ));
        v.push(Check::new(
            "send errors + unsent datagrams",
            (sv.total.send_errors + sv.total.unsent) as f64,
            0.0,
            true,
        ));
        if let Some(a) = sv.total.steady_allocations {
            v.push(Check::new("allocations in steady state", a as f64, 0.0, sv.total.steady_iterations > 0));
        }
    }
    v
}

fn rate(bytes_per_s: f64) -> String {
    let (v, u) = if bytes_per_s >= 1e9 {
        (bytes_per_s / 1e9, "GB/s")
    } else if bytes_per_s >= 1e6 {
        (bytes_per_s / 1e6, "MB/s")
    } else if bytes_per_s >= 1e3 {
        (bytes_per_s / 1e3, "kB/s")
    } else {
        (bytes_per_s, "B/s")
    };
    format!("{v:.2} {u}")
}

/// The table.
pub fn text(cfg: &RecvConfig, path: &str, server: Option<&ServerReport>, r: &RecvReport, slot: Duration) -> String {
    let s = &r.summary;
    let mut o = String::new();
    let per = match (cfg.interval, cfg.segments) {
        (Some(i), _) => format!("a release every {:.2} ms", i.as_secs_f64() * 1e3),
        (None, 0) => "the server's default datagrams per release".into(),
        (None, n) => format!("{n} per release"),
    };
    let _ = writeln!(
        o,
        "udpx stream: {} flows x {}, {} B datagrams, {per}, {:.0} s, {path}",
        cfg.flows,
        rate(cfg.rate as f64),
        cfg.size,
        cfg.duration.as_secs_f64()
    );
    if let Some(sv) = server {
        let _ = writeln!(o, "pacing: {}", sv.total.pacing);
    }
    let _ = writeln!(o);
    row(&mut o, "flows accepted / refused", format!("{} / {}", r.accepted, r.refused.0));
    if let Some(why) = &r.refused.1 {
        row(&mut o, "first refusal", why.clone());
    }
    row(
        &mut o,
        "datagrams sent / received",
        format!("{} / {} ({} flows ended with an exact count)", s.sent, s.datagrams, s.flows_ended),
    );
    row(
        &mut o,
        "lost",
        format!(
            "{} ({:.4} %){}",
            s.lost,
            s.loss_pct,
            match r.socket_drops {
                Some(d) => format!("; {d} of them dropped by the receiving sockets' buffers"),
                None => String::new(),
            }
        ),
    );
    row(&mut o, "reordered / duplicates", format!("{} / {}", s.reordered, s.duplicates));
    row(&mut o, "malformed", s.malformed.to_string());
    row(&mut o, "goodput", rate(s.goodput));
    row(
        &mut o,
        "departure error p50/p99/max",
        format!(
            "{:.0} / {:.0} / {:.0} us{}",
            s.departure_error_ns.p50 / 1e3,
            s.departure_error_ns.p99 / 1e3,
            s.departure_error_ns.max / 1e3,
            if s.early > 0 {
                format!(
                    " ({} handed to the kernel early, p50 {:.0} us, max {:.0} us before their time)",
                    s.early,
                    s.early_by_ns.p50 / 1e3,
                    s.early_by_ns.max / 1e3
                )
            } else {
                String::new()
            }
        ),
    );
    row(
        &mut o,
        "arrival lag p50/p99",
        format!("{:.0} / {:.0} us", s.arrival_lag_ns.p50 / 1e3, s.arrival_lag_ns.p99 / 1e3),
    );
    row(
        &mut o,
        "rate error p50/p99/max",
        format!(
            "{:.5} / {:.5} / {:.5} %",
            s.rate_error.p50 * 100.0,
            s.rate_error.p99 * 100.0,
            s.rate_error.max * 100.0
        ),
    );
    row(
        &mut o,
        "1 ms bins mean / max",
        format!("{} / {} (max/mean {:.2})", rate(s.bin_mean), rate(s.bin_max), s.bin_max_over_mean),
    );
    row(
        &mut o,
        "burstiness",
        format!(
            "{:.1} % within 100 us of the flow's previous; longest run {}",
            s.burstiness * 100.0,
            s.max_back_to_back
        ),
    );
    if let Some(sv) = server {
        server_rows(&mut o, sv);
    }
    let _ = writeln!(o, "\n  targets (issue 9, for 10,000 flows x 4 kB/s):");
    for c in checks(s, server, slot) {
        let _ = writeln!(o, "    {:<34} {:>12.4}  <= {:<10} {}", c.what, c.figure, c.at_most, c.word());
    }
    o
}

/// One row of the table: `k`, then `v`.
fn row(o: &mut String, k: &str, v: String) {
    let _ = writeln!(o, "  {k:<30} {v}");
}

/// The table's rows about the server (when it ran here).
fn server_rows(o: &mut String, sv: &ServerReport) {
    let t = &sv.total;
    row(o, "pacer threads", t.realtime.clone());
    row(o, "server CPU", format!("{:.2} s, {:.2} us per datagram", t.cpu_s, sv.cpu_per_datagram_ns() / 1e3));
    let per_call = if t.send_calls > 0 { t.datagrams as f64 / t.send_calls as f64 } else { 0.0 };
    row(o, "send calls", format!("{} ({per_call:.1} datagrams per call, {} busy wakes)", t.send_calls, t.busy_wakes));
    row(o, "clients gone (flows ended early)", t.clients_gone.to_string());
    row(o, "caps in force", sv.caps.clone());
    row(
        o,
        "admission",
        format!(
            "{} cookies sent, {} bad cookies, {} capped, {} unproven answers over the rate, {} keepalives ({} bad), {} flows lapsed",
            t.cookies_sent, t.bad_cookies, t.capped, t.unproven_limited, t.keepalives, t.bad_keepalives, t.consent_lapsed
        ),
    );
    row(
        o,
        "would-block / ENOBUFS waits",
        format!(
            "{} / {}; send errors {}, unsent {}, control unsent {}",
            t.would_block, t.no_buffers, t.send_errors, t.unsent, t.control_unsent
        ),
    );
    row(
        o,
        "steady-state allocations",
        match t.steady_allocations {
            Some(a) => format!("{a} in {} iterations", t.steady_iterations),
            None => "not counted (built without count-allocations)".into(),
        },
    );
}

/// One JSON object: the configuration, the server's figures (when it ran here), the
/// receiver's summary and the checks.
pub fn json(
    cfg: &RecvConfig,
    path: &str,
    server: Option<&ServerReport>,
    r: &RecvReport,
    slot: Duration,
) -> serde_json::Value {
    serde_json::json!({
        "config": {
            "flows": cfg.flows,
            "rate": cfg.rate,
            "size": cfg.size,
            "interval_ns": cfg.interval.map(|i| i.as_nanos() as u64),
            "segments": cfg.segments,
            "burst": cfg.burst,
            "duration_s": cfg.duration.as_secs_f64(),
            "slot_ns": slot.as_nanos() as u64,
        },
        "path": path,
        "server": server,
        "receiver": {
            "accepted": r.accepted,
            "refused": r.refused.0,
            "refusal": r.refused.1,
            "elapsed_s": r.elapsed_s,
            "socket_drops": r.socket_drops,
            "summary": r.summary,
        },
        "checks": checks(&r.summary, server, slot),
    })
}

/// Two plots: the departure error CDF and the aggregate rate in 1 ms bins. The canvas is at
/// least 760 px wide and as wide as its longest text needs ([`chart::text_width`]), and the
/// plots start right of their widest y label, so no text is cut.
pub fn svg(t: &Tally, title: &str) -> String {
    const FONT: f64 = 11.0;
    const TITLE_FONT: f64 = 13.0;
    let h = 220.0;
    let cdf = t.departure_cdf(400);
    let bins = t.bins();
    let ymax = bins.iter().copied().fold(0.0, f64::max).max(1.0);
    let secs = bins.len() as f64 / 1e3;
    let top_label = "departure error (log scale), share of datagrams at or below";
    let bottom_label =
        format!("aggregate send rate per 1 ms bin (MB/s) over {secs:.0} s: mean per column, largest (light)");
    let y_labels = [Panel::y_label(1.0), Panel::y_label(ymax / 1e6)];
    let left = y_labels.iter().map(|l| chart::text_width(l, FONT)).fold(0.0, f64::max).max(40.0) + 10.0;
    let w = (chart::text_width(title, TITLE_FONT) + 20.0)
        .max(left + chart::text_width(top_label, FONT).max(chart::text_width(&bottom_label, FONT)) + 20.0)
        .max(760.0)
        .ceil();
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{}" font-family="{}" font-size="{FONT}">"#,
        2.0 * h + 60.0,
        chart::FONT_FAMILY
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(o, r#"<text x="10" y="18" font-size="{TITLE_FONT}">{}</text>"#, escape(title));
    // Departure error CDF, on a log scale from 10 us: the body (a slot) and the tail (late
    // wakes, milliseconds) both show.
    let lo = 10_000f64.ln();
    let hi = cdf.last().map_or(1e6, |p| p.0).max(1e6).ln();
    let x_of = |ns: f64| ((ns.max(10_000.0).ln() - lo) / (hi - lo)).clamp(0.0, 1.0);
    let top = Panel { top: 30.0, left, w, h };
    top.frame(&mut o, top_label, "", 1.0);
    for (ns, label) in
        [(1e4f64, "10 us"), (1e5, "100 us"), (1e6, "1 ms"), (1e7, "10 ms"), (1e8, "100 ms"), (1e9, "1 s")]
    {
        if ns.ln() <= hi + 1e-9 {
            top.x_tick(&mut o, x_of(ns), label);
        }
    }
    let pts: Vec<(f64, f64)> = cdf.iter().map(|&(x, q)| (x_of(x), q)).collect();
    top.polyline(&mut o, &pts, "#3b6ea5");
    // 1 ms bins: per pixel column the mean (dark) and the largest (light) bin, and the run's
    // mean (dashed).
    let bottom = Panel { top: 40.0 + h, left, w, h };
    bottom.frame(&mut o, &bottom_label, &format!("{secs:.0} s"), ymax / 1e6);
    let group = (bins.len() / 700).max(1);
    let n = bins.len().div_ceil(group).max(2) as f64;
    let col = |f: fn(&[f64]) -> f64| -> Vec<(f64, f64)> {
        bins.chunks(group).enumerate().map(|(i, c)| (i as f64 / (n - 1.0), f(c) / ymax)).collect()
    };
    bottom.polyline(&mut o, &col(|c| c.iter().copied().fold(0.0, f64::max)), "#e9c48f");
    bottom.polyline(&mut o, &col(|c| c.iter().sum::<f64>() / c.len() as f64), "#b06a10");
    if !bins.is_empty() {
        let mean = bins.iter().sum::<f64>() / bins.len() as f64 / ymax;
        bottom.hline(&mut o, mean, &format!("mean {:.1}", mean * ymax / 1e6));
    }
    o.push_str("</svg>\n");
    o
}

/// One plot's place in the picture: its top edge, the plot area's left edge, the width and
/// height (px).
struct Panel {
    top: f64,
    left: f64,
    w: f64,
    h: f64,
}

impl Panel {
    /// The text of the y axis's top value.
    fn y_label(ymax: f64) -> String {
        format!("{ymax:.2}")
    }

    /// The plot area: left, top, right, bottom.
    fn area(&self) -> (f64, f64, f64, f64) {
        (self.left, self.top + 20.0, self.w - 20.0, self.top + self.h - 20.0)
    }

    fn frame(&self, o: &mut String, label: &str, xmax: &str, ymax: f64) {
        let (x0, y0, x1, y1) = self.area();
        let _ = writeln!(
            o,
            r##"<rect x="{x0}" y="{y0}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
            x1 - x0,
            y1 - y0
        );
        let _ = writeln!(o, r#"<text x="{x0}" y="{}">{}</text>"#, y0 - 5.0, escape(label));
        let _ =
            writeln!(o, r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, x0 - 4.0, y0 + 8.0, Self::y_label(ymax));
        let _ = writeln!(o, r#"<text x="{}" y="{y1}" text-anchor="end">0</text>"#, x0 - 4.0);
        let _ = writeln!(o, r#"<text x="{x1}" y="{}" text-anchor="end">{}</text>"#, y1 + 14.0, escape(xmax));
    }

    /// A tick on the x axis at `x` (0..=1).
    fn x_tick(&self, o: &mut String, x: f64, label: &str) {
        let (x0, y0, x1, y1) = self.area();
        let px = x0 + x * (x1 - x0);
        let _ = writeln!(o, r##"<line x1="{px:.1}" y1="{y0}" x2="{px:.1}" y2="{y1}" stroke="#ddd"/>"##);
        let _ = writeln!(o, r#"<text x="{px:.1}" y="{}" text-anchor="middle">{label}</text>"#, y1 + 14.0);
    }

    /// A dashed horizontal line at `y` (0..=1) with a label.
    fn hline(&self, o: &mut String, y: f64, label: &str) {
        let (x0, y0, x1, y1) = self.area();
        let py = y1 - y * (y1 - y0);
        let _ = writeln!(
            o,
            r##"<line x1="{x0}" y1="{py:.1}" x2="{x1}" y2="{py:.1}" stroke="#555" stroke-dasharray="4 3"/>"##
        );
        let _ = writeln!(o, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, x1 - 4.0, py - 4.0, escape(label));
    }

    /// Points in 0..=1 on both axes.
    fn polyline(&self, o: &mut String, pts: &[(f64, f64)], color: &str) {
        let (x0, y0, x1, y1) = self.area();
        let mut d = String::new();
        for &(x, y) in pts {
            let _ = write!(d, "{:.1},{:.1} ", x0 + x * (x1 - x0), y1 - y * (y1 - y0));
        }
        let _ = writeln!(o, r#"<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.2"/>"#);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Data;

    #[test]
    fn svg_and_checks_of_a_made_up_run() {
        let mut t = Tally::new(1);
        for seq in 0..4000u64 {
            let due = 1_000_000_000 + seq * 1_000_000;
            let d =
                Data { flow: 0, secret: 1, size: 1000, seq, intended_ns: due, sent_ns: due + 100_000, rate: 1_000_000 };
            t.data(0, &d, due + 150_000);
        }
        let svg = svg(&t, "a <test>");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;test&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 3, "the CDF, the bins' mean and largest");
        // A title longer than the plots are wide widens the canvas: every text drawn whole.
        let title = format!("udpx stream: 10000 flows x 4000 B/s, {}", "veth between two namespaces, ".repeat(3));
        let wide = super::svg(&t, &title);
        let (width, _) = chart::canvas(&wide).unwrap();
        let texts = chart::texts(&wide);
        assert!(texts.iter().any(|x| x.content == title), "the title whole");
        for x in &texts {
            let (l, r) = x.extent();
            assert!(l >= 0.0 && r <= width, "{x:?} leaves the canvas of width {width}");
        }
        let cs = checks(&t.summary(), None, Duration::from_micros(250));
        assert_eq!(cs[0].met, Some(true), "100 us <= 175 us: {:?}", cs[0]);
        assert_eq!(cs[3].met, Some(true), "a steady 1 MB/s: {:?}", cs[3]);
        let empty = checks(&Tally::new(1).summary(), None, Duration::from_micros(250));
        assert!(empty.iter().all(|c| c.met.is_none() || c.what.contains("bins")));
    }
}
