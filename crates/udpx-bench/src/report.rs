//! Reports: the text tables (the paper's Figure 1 for the send side, Figure 5 for the receive
//! side), the targets of the issues checked against the measured ratios, Markdown, JSON and an
//! SVG chart of cost per byte.

use std::fmt::Write as _;

use serde::Serialize;

use crate::matrix::{Figures, ProfileResult};

/// A target from the issues, checked against this run's medians.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Which profile.
    pub profile: String,
    /// What is compared.
    pub what: String,
    /// The measured ratio.
    pub ratio: f64,
    /// The target the ratio must meet (`≤` target).
    pub at_most: f64,
    /// Whether it does.
    pub met: bool,
}

/// The ratios the issues ask for: cost per delivered byte, both CPUs; and on the `software`
/// profile the sender's own cost per byte sent (the paper's Figure 1).
pub fn checks(p: &ProfileResult) -> Vec<Check> {
    let pick = |id: &str, f: fn(&Figures) -> f64| p.get(id).map(|r| f(&r.median)).filter(|c| c.is_finite());
    let cost = |id: &str| pick(id, |f| f.cpu_per_gb);
    let sender = |id: &str| pick(id, |f| f.tx_cpu_per_gb_sent);
    let tcp = match (cost("tcp"), cost("iperf3-tcp")) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut wanted = vec![
        ("UDP GSO+GRO / cheapest TCP", cost("udp-gso-gro"), tcp, 0.6),
        ("UDP GSO / UDP plain", cost("udp-gso"), cost("udp"), 0.3),
        ("UDP GSO+GRO / UDP plain (10x)", cost("udp-gso-gro"), cost("udp"), 0.1),
        ("udpx UDP plain / iperf3 UDP", cost("udp"), cost("iperf3-udp"), 1.0),
    ];
    // Zerocopy changes the sender's copy: compare sender CPU per byte sent, copy vs zerocopy.
    wanted.push(("sender CPU/GB sent: GSO+zerocopy / GSO copy", sender("udp-gso-zc"), sender("udp-gso"), 1.02));
    wanted.push((
        "sender CPU/GB sent: GSO(CT)+zerocopy / GSO(CT) copy",
        sender("udp-gso-ct-zc"),
        sender("udp-gso-ct"),
        1.02,
    ));
    if p.profile == "software" {
        wanted.push(("sender CPU/GB sent: GSO / plain (3x)", sender("udp-gso"), sender("udp"), 1.0 / 3.0));
    }
    wanted
        .into_iter()
        .filter_map(|(what, a, b, at_most)| {
            let ratio = a? / b?;
            Some(Check { profile: p.profile.clone(), what: what.to_string(), ratio, at_most, met: ratio <= at_most })
        })
        .collect()
}

fn si(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn num(x: f64, prec: usize) -> String {
    if x.is_finite() {
        format!("{x:.prec$}")
    } else {
        "-".into()
    }
}

/// Speed-up over the `udp` row: its cost per byte divided by this row's.
fn speedup(p: &ProfileResult, f: &Figures) -> f64 {
    match p.get("udp") {
        Some(base) if f.cpu_per_gb > 0.0 => base.median.cpu_per_gb / f.cpu_per_gb,
        _ => f64::NAN,
    }
}

/// The send-side table (Figure 1 of the paper, with cost per byte instead of cycles).
pub fn send_table(p: &ProfileResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<24} {:>7} {:>8} {:>7} {:>8} {:>6} {:>6} {:>7} {:>9} {:>8}",
        "row", "Gbit/s", "calls/s", "dg/call", "CPU-s/GB", "tx-CPU", "rx-CPU", "tx/sent", "delivered", "speed-up"
    );
    for r in &p.rows {
        if r.runs.is_empty() {
            let why = r.errors.first().map(String::as_str).unwrap_or("?");
            let _ = writeln!(s, "{:<24} failed: {why}", r.row.label);
            continue;
        }
        let f = &r.median;
        let calls = if f.send_calls_per_s > 0.0 { si(f.send_calls_per_s) } else { "-".into() };
        let per_call = if f.datagrams_per_call > 0.0 { num(f.datagrams_per_call, 1) } else { "-".into() };
        let _ = writeln!(
            s,
            "{:<24} {:>7} {:>8} {:>7} {:>8} {:>6} {:>6} {:>7} {:>8.1}% {:>7}x",
            r.row.label,
            num(f.gbits, 2),
            calls,
            per_call,
            num(f.cpu_per_gb, 2),
            num(f.tx_cpu_per_gb, 2),
            num(f.rx_cpu_per_gb, 2),
            num(f.tx_cpu_per_gb_sent, 2),
            f.delivered * 100.0,
            num(speedup(p, f), 1)
        );
    }
    s
}

/// The receive-side table (Figure 5 of the paper): the same senders into a socket without and
/// with UDP GRO.
pub fn recv_table(p: &ProfileResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<24} {:>7} {:>9} {:>7} {:>8} {:>9}",
        "row", "Gbit/s", "recv/s", "dg/recv", "rx-CPU/GB", "delivered"
    );
    for id in ["udp", "udp-gro", "udp-gso", "udp-gso-gro", "udp-gso-mmsg", "udp-gso-mmsg-gro"] {
        if let Some(r) = p.get(id) {
            let f = &r.median;
            let _ = writeln!(
                s,
                "{:<24} {:>7} {:>9} {:>7} {:>8} {:>8.1}%",
                r.row.label,
                num(f.gbits, 2),
                si(f.recv_calls_per_s),
                num(f.datagrams_per_recv, 1),
                num(f.rx_cpu_per_gb, 2),
                f.delivered * 100.0
            );
        }
    }
    s
}

/// The zerocopy audit of every zerocopy row: completions must equal zerocopy sends; copied
/// completions say the kernel copied anyway; whether udpx turned zerocopy off. Forced rows,
/// measured against their copy rows, show what zerocopy costs a program without detection.
pub fn zerocopy_audit(p: &ProfileResult) -> String {
    let mut s = String::new();
    for r in p.rows.iter().filter(|r| r.row.id.contains("-zc")) {
        for (i, m) in r.runs.iter().enumerate() {
            if let Some(tx) = &m.tx {
                let _ = writeln!(
                    s,
                    "  {:<8} {:<26} run {}: {} zerocopy sends, {} completed{}, {} copied, turned off: {}",
                    p.profile,
                    r.row.label,
                    i + 1,
                    tx.zerocopy_sends,
                    tx.zerocopy_completed,
                    if tx.zerocopy_completed == tx.zerocopy_sends { " (all)" } else { " (MISMATCH)" },
                    tx.zerocopy_copied,
                    if tx.zerocopy_turned_off { "yes" } else { "no" }
                );
            }
        }
    }
    let cost = |id: &str| p.get(id).map(|r| r.median.tx_cpu_per_gb_sent);
    for (forced, copy) in [("udp-gso-zc-forced", "udp-gso"), ("udp-gso-ct-zc-forced", "udp-gso-ct")] {
        if let (Some(a), Some(b)) = (cost(forced), cost(copy)) {
            let _ =
                writeln!(s, "  {:<8} {forced} / {copy} sender CPU per byte: {:.3} (no detection)", p.profile, a / b);
        }
    }
    s
}

/// A line saying how much time the hypervisor stole from the pinned CPUs, if any: stolen
/// time is not counted as busy, but it means another guest ran on this machine meanwhile, so
/// the figures are noisier than usual. `None` when nothing was stolen.
pub fn steal_note(profiles: &[ProfileResult]) -> Option<String> {
    let runs: Vec<f64> = profiles.iter().flat_map(|p| &p.rows).flat_map(|r| &r.runs).map(|m| m.steal_secs).collect();
    let stolen: Vec<f64> = runs.iter().copied().filter(|s| *s > 0.0).collect();
    if stolen.is_empty() {
        return None;
    }
    Some(format!(
        "note: the hypervisor stole {:.2} CPU-s from the pinned CPUs in {} of {} measurements (at most {:.2} s in one); \
         steal is not counted as busy (steal_secs per run in report.json)",
        stolen.iter().sum::<f64>(),
        stolen.len(),
        runs.len(),
        stolen.iter().copied().fold(0.0, f64::max)
    ))
}

/// Checks as text lines.
pub fn checks_text(cs: &[Check]) -> String {
    let mut s = String::new();
    for c in cs {
        let _ = writeln!(
            s,
            "  [{}] {:<8} {:<46} {:>6.3} (target <= {})",
            if c.met { " met " } else { "MISSED" },
            c.profile,
            c.what,
            c.ratio,
            c.at_most
        );
    }
    s
}

/// An SVG bar chart: CPU-s per delivered GB for every row, one bar per profile.
pub fn svg_chart(profiles: &[ProfileResult]) -> String {
    let colors = ["#3b6ea5", "#d08c2e", "#5a9e5a"];
    let ids: Vec<(&str, &str)> =
        profiles.first().map(|p| p.rows.iter().map(|r| (r.row.id, r.row.label)).collect()).unwrap_or_default();
    let max = profiles
        .iter()
        .flat_map(|p| p.rows.iter().map(|r| r.median.cpu_per_gb))
        .filter(|x| x.is_finite())
        .fold(0.0f64, f64::max)
        .max(0.1);
    let (label_w, bar_w, row_h, bar_h) = (190.0, 520.0, 12.0 * profiles.len() as f64 + 10.0, 11.0);
    let height = 60.0 + row_h * ids.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="11">"#,
        w = label_w + bar_w + 80.0
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="13">CPU seconds per delivered GB (both CPUs; lower is better)</text>"#
    );
    for (pi, p) in profiles.iter().enumerate() {
        let x = label_w + 160.0 * pi as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="28" width="10" height="10" fill="{}"/><text x="{}" y="37">{}</text>"#,
            colors[pi % 3],
            x + 14.0,
            p.profile
        );
    }
    for (i, (id, label)) in ids.iter().enumerate() {
        let y0 = 50.0 + row_h * i as f64;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{label}</text>"#,
            label_w - 6.0,
            y0 + row_h / 2.0 + 3.0
        );
        for (pi, p) in profiles.iter().enumerate() {
            let Some(r) = p.get(id) else { continue };
            let v = r.median.cpu_per_gb;
            if !v.is_finite() {
                continue;
            }
            let w = (v / max * bar_w).max(1.0);
            let y = y0 + 2.0 + 12.0 * pi as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{label_w}" y="{y}" width="{w:.1}" height="{bar_h}" fill="{}"/>"#,
                colors[pi % 3]
            );
            let _ = writeln!(s, r#"<text x="{:.1}" y="{}">{v:.2}</text>"#, label_w + w + 4.0, y + 9.0);
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The whole run as Markdown.
pub fn markdown(title: &str, setup: &str, profiles: &[ProfileResult], cs: &[Check], environment: &str) -> String {
    let mut s = format!("# {title}\n\n{setup}\n\n");
    for p in profiles {
        let _ = writeln!(s, "## Profile `{}`: send side (Figure 1)\n\n```\n{}```\n", p.profile, send_table(p));
        let _ = writeln!(s, "## Profile `{}`: receive side (Figure 5)\n\n```\n{}```\n", p.profile, recv_table(p));
    }
    let _ = writeln!(s, "## Targets\n\n```\n{}```\n", checks_text(cs));
    let audit: String = profiles.iter().map(zerocopy_audit).collect();
    let _ = writeln!(s, "## Zerocopy audit\n\n```\n{audit}```\n");
    if let Some(note) = steal_note(profiles) {
        let _ = writeln!(s, "{note}\n");
    }
    let _ = writeln!(s, "## Environment\n\n{environment}\n");
    s.push_str(
        "## How to read this\n\n- Gbit/s: delivered (received) payload over the sending time.\n\
         - CPU-s/GB: busy time of both pinned CPUs from /proc/stat (user, system, irq, softirq; not steal, which is the hypervisor \
         running another guest, reported apart; not nice, which is other people's niced work unless the bench itself runs niced), per GB delivered; \
         tx-CPU and rx-CPU split it by CPU; tx/sent is the sender CPU's busy time per GB *sent* (the paper's Figure 1 \
         measures the sender alone; on the `software` profile the receive stack runs on the other CPU).\n- speed-up: the `UDP sendmsg` row's cost per byte divided by this row's.\n\
         - delivered: received / sent datagrams (TCP: bytes).\n- Medians over the repetitions, which ran interleaved.\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{default_rows, RowResult};
    use crate::run::Measurement;

    fn profile(costs: &[(&'static str, f64)]) -> ProfileResult {
        let rows = default_rows(true)
            .into_iter()
            .map(|row| {
                let c = costs.iter().find(|(id, _)| *id == row.id).map(|x| x.1);
                let runs = c.map(|_| vec![Measurement::default()]).unwrap_or_default();
                let median =
                    Figures { cpu_per_gb: c.unwrap_or(f64::NAN), gbits: 1.0, delivered: 1.0, ..Figures::default() };
                RowResult { row, runs, median, errors: vec![] }
            })
            .collect();
        ProfileResult { profile: "offload".into(), rows }
    }

    #[test]
    fn checks_compute_ratios() {
        let p = profile(&[
            ("tcp", 0.6),
            ("iperf3-tcp", 0.5),
            ("udp", 3.6),
            ("udp-gso", 0.9),
            ("udp-gso-gro", 0.25),
            ("iperf3-udp", 4.0),
        ]);
        let cs = checks(&p);
        let get = |w: &str| cs.iter().find(|c| c.what.starts_with(w)).unwrap();
        assert!((get("UDP GSO+GRO / cheapest").ratio - 0.5).abs() < 1e-9 && get("UDP GSO+GRO / cheapest").met);
        assert!((get("UDP GSO / UDP plain").ratio - 0.25).abs() < 1e-9);
        assert!(get("udpx UDP plain").met);
        // A missing row means no check, not a pass.
        let q = profile(&[("udp", 3.0)]);
        assert!(checks(&q).is_empty());
    }

    #[test]
    fn tables_and_chart_render() {
        let p = profile(&[("tcp", 0.6), ("udp", 3.6), ("udp-gso", 0.9)]);
        let t = send_table(&p);
        assert!(t.contains("UDP GSO") && t.contains("4.0x"), "{t}");
        assert!(t.contains("failed"), "rows without runs say so");
        let svg = svg_chart(std::slice::from_ref(&p));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let md = markdown("t", "s", &[p], &[], "env");
        assert!(md.contains("Figure 5"));
    }
}
