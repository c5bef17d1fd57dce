//! Reports: the text tables (the paper's Figure 1 for the send side, Figure 5 for the receive
//! side), the targets of the issues checked against the measured ratios, Markdown and JSON; the
//! SVG chart of cost per byte is [`crate::chart`]'s.

use std::fmt::Write as _;

use crate::matrix::{Figures, LeftOut, ProfileResult, RowResult};
use crate::stats::{paired_ratios, Run, Spread};
use udpx_lab::judge::pm;
// The chart, under the path the CLI has always used.
pub use crate::chart::svg_chart;
// The judged targets and how they print: the lab's, under the paths the reports have always used.
pub use udpx_lab::judge::{checks_text, verdict_rule, Check};

/// The ratios the issues ask for: cost per delivered byte, both CPUs; and the sender's own
/// cost per byte sent (the paper's Figure 1), for zerocopy and, on `software`, for GSO.
pub fn checks(p: &ProfileResult) -> Vec<Check> {
    let pick = |id: &str, f: fn(&Figures) -> f64| -> Vec<Run> {
        match p.get(id) {
            // Infinite costs stay: paired_ratios turns them into an inconclusive verdict.
            Some(r) => r.per_run(p.passes, f),
            None => vec![Run::Failed; p.passes],
        }
    };
    let cost = |id: &str| pick(id, |f| f.cpu_per_gb);
    let sender = |id: &str| pick(id, |f| f.tx_cpu_per_gb_sent);
    // The cheaper TCP of each pass (udpx's or iperf3's), whichever ran.
    // A pass in which either was stolen is marked as stolen.
    let tcp: Vec<Run> = cost("tcp")
        .into_iter()
        .zip(cost("iperf3-tcp"))
        .map(|(a, b)| match (a, b) {
            (Run::Clean(a), Run::Clean(b)) => Run::Clean(a.min(b)),
            (Run::Failed, x) | (x, Run::Failed) => x,
            (Run::Clean(a) | Run::Stolen(a), Run::Clean(b) | Run::Stolen(b)) => Run::Stolen(a.min(b)),
        })
        .collect();
    // Without iperf3 the cheapest TCP is udpx's own row alone: the check says so.
    let cheapest = if p.get("iperf3-tcp").is_some() {
        "UDP GSO+GRO / cheapest TCP"
    } else {
        "UDP GSO+GRO / cheapest TCP (udpx TCP only: iperf3 left out)"
    };
    let mut wanted = vec![
        (cheapest, cost("udp-gso-gro"), tcp, 0.3),
        ("UDP GSO / UDP plain", cost("udp-gso"), cost("udp"), 0.3),
        ("UDP GSO+GRO / UDP plain (10x)", cost("udp-gso-gro"), cost("udp"), 0.1),
        ("udpx UDP plain / iperf3 UDP", cost("udp"), cost("iperf3-udp"), 1.0),
    ];
    // Issue 16: udpx's receiver behind the raw sender against the raw receiver, same shape,
    // same receive buffer, same waiting: what the abstractions cost over bare syscalls.
    wanted.push(("udpx receiver / raw receiver, plain (metadata off)", cost("raw>udpx"), cost("raw"), 1.0));
    wanted.push(("udpx receiver / raw receiver, GSO (metadata off)", cost("raw-gso>udpx"), cost("raw-gso"), 1.0));
    wanted.push((
        "udpx receiver / raw receiver, GSO+GRO (metadata off)",
        cost("raw-gso>udpx-gro"),
        cost("raw-gso-gro"),
        1.0,
    ));
    wanted.push((
        "udpx receiver / raw receiver, GSO+GRO with pktinfo+ECN",
        cost("raw-gso>udpx-gro-meta"),
        cost("raw-gso-gro"),
        1.10,
    ));
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
    // Issue 12: the io_uring bulk rows no costlier than the same rows on system calls.
    wanted.push((
        "io_uring / system calls, GSO+mmsg>GRO+mmsg",
        cost("udp-gso-mmsg-gro-uring"),
        cost("udp-gso-mmsg-gro"),
        1.0,
    ));
    wanted.push(("io_uring / system calls, GSO+mmsg>recvmmsg", cost("udp-gso-mmsg-uring"), cost("udp-gso-mmsg"), 1.0));
    wanted.into_iter().filter_map(|(what, a, b, at_most)| Check::judge(&p.profile, what, &a, &b, at_most)).collect()
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

/// Speed-up over the `udp` row: its cost per byte divided by this row's, for the median runs,
/// and `±` from the per-run ratios (pass i of `udp` over pass i of this row).
fn speedup(p: &ProfileResult, r: &RowResult) -> (f64, String) {
    let Some(base) = p.get("udp") else { return (f64::NAN, "-".into()) };
    let cost = |x: &RowResult| x.per_run(p.passes, |f| f.cpu_per_gb);
    let per_run = Spread::of(&paired_ratios(&cost(base), &cost(r)));
    let v = base.median.cpu_per_gb / r.median.cpu_per_gb;
    (v, pm(v, per_run.min, per_run.max))
}

/// The send-side table (Figure 1 of the paper, with cost per byte instead of cycles). Each
/// row is its median run; `±` columns give the spread over runs.
pub fn send_table(p: &ProfileResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<28} {:>7} {:>5} {:>8} {:>7} {:>8} {:>5} {:>6} {:>6} {:>7} {:>9} {:>8} {:>5} {:>6} {:>4}",
        "row",
        "Gbit/s",
        "±",
        "calls/s",
        "dg/call",
        "CPU-s/GB",
        "±",
        "tx-CPU",
        "rx-CPU",
        "tx/sent",
        "delivered",
        "speed-up",
        "±",
        "x raw",
        "runs"
    );
    for r in &p.rows {
        if let Some(why) = r.kept.no_figure() {
            let _ = writeln!(s, "{:<28} {why}", r.row.label);
            continue;
        }
        if r.median_run.is_none() {
            let why = r.errors.first().map(String::as_str).unwrap_or("?");
            let _ = writeln!(s, "{:<28} failed: {why}", r.row.label);
            continue;
        }
        let f = &r.median;
        let calls = if f.send_calls_per_s > 0.0 { si(f.send_calls_per_s) } else { "-".into() };
        let per_call = if f.datagrams_per_call > 0.0 { num(f.datagrams_per_call, 1) } else { "-".into() };
        let (up, up_pm) = speedup(p, r);
        let _ = writeln!(
            s,
            "{:<28} {:>7} {:>5} {:>8} {:>7} {:>8} {:>5} {:>6} {:>6} {:>7} {:>8.1}% {:>7}x {:>5} {:>6} {:>4}",
            r.row.label,
            num(f.gbits, 2),
            pm(f.gbits, r.min.gbits, r.max.gbits),
            calls,
            per_call,
            num(f.cpu_per_gb, 2),
            pm(f.cpu_per_gb, r.min.cpu_per_gb, r.max.cpu_per_gb),
            num(f.tx_cpu_per_gb, 2),
            num(f.rx_cpu_per_gb, 2),
            num(f.tx_cpu_per_gb_sent, 2),
            f.delivered * 100.0,
            num(up, 1),
            up_pm,
            r.vs_raw.as_ref().map_or("-".to_string(), |v| format!("{:.2}x", v.cost.median)),
            r.kept.cell()
        );
    }
    s
}

/// The receive-side table (Figure 5 of the paper): the same senders into a socket without and
/// with UDP GRO, the raw receivers of each shape beside them.
pub fn recv_table(p: &ProfileResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<28} {:>7} {:>9} {:>7} {:>9} {:>5} {:>9}",
        "row", "Gbit/s", "recv/s", "dg/recv", "rx-CPU/GB", "±", "delivered"
    );
    for id in [
        "udp",
        "raw",
        "udp-gro",
        "udp-gso",
        "raw-gso",
        "udp-gso-gro",
        "raw-gso-gro",
        "raw-gso>udpx-gro",
        "udp-gso-mmsg",
        "udp-gso-mmsg-gro",
    ] {
        if let Some(r) = p.get(id).filter(|r| r.median_run.is_some()) {
            let f = &r.median;
            let _ = writeln!(
                s,
                "{:<28} {:>7} {:>9} {:>7} {:>9} {:>5} {:>8.1}%",
                r.row.label,
                num(f.gbits, 2),
                si(f.recv_calls_per_s),
                num(f.datagrams_per_recv, 1),
                num(f.rx_cpu_per_gb, 2),
                pm(f.rx_cpu_per_gb, r.min.rx_cpu_per_gb, r.max.rx_cpu_per_gb),
                f.delivered * 100.0
            );
        }
    }
    s
}

/// Every row against the raw row of its shape ([`crate::matrix::VsRaw`]): cost per delivered
/// byte and delivered fraction as ratios, median of the per-run ratios with [min-max], and the
/// receive buffer in effect (the median run's).
pub fn raw_table(p: &ProfileResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<28} {:<12} {:>22} {:>22} {:>9}",
        "row", "raw row", "CPU-s/GB / raw", "delivered / raw", "rcvbuf"
    );
    let spread = |x: &crate::stats::Spread| format!("{:.2} [{:.2}-{:.2}]", x.median, x.min, x.max);
    for r in &p.rows {
        let Some(v) = &r.vs_raw else { continue };
        let rcvbuf = r
            .runs
            .iter()
            .find(|m| Some(m.run) == r.median_run)
            .and_then(|m| m.rcvbuf_effective)
            .map_or("-".to_string(), |b| format!("{:.1}M", b as f64 / (1 << 20) as f64));
        let _ = writeln!(
            s,
            "{:<28} {:<12} {:>22} {:>22} {:>9}",
            r.row.label,
            v.raw,
            spread(&v.cost),
            spread(&v.delivered),
            rcvbuf
        );
    }
    s
}

/// The rows left out of the job and why, one line each (empty when none).
pub fn left_out_text(l: &[LeftOut]) -> String {
    let mut s = String::new();
    for x in l {
        let _ = writeln!(s, "  left out: {:<26} {}", x.label, x.why);
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
    let cost = |id: &str| p.get(id).map(|r| r.per_run(p.passes, |f| f.tx_cpu_per_gb_sent));
    for (forced, copy) in [("udp-gso-zc-forced", "udp-gso"), ("udp-gso-ct-zc-forced", "udp-gso-ct")] {
        if let (Some(a), Some(b)) = (cost(forced), cost(copy)) {
            let r = Spread::of(&paired_ratios(&a, &b));
            let _ = writeln!(
                s,
                "  {:<8} {forced} / {copy} sender CPU per byte: {:.3} [{:.3}-{:.3}, {} runs] (no detection)",
                p.profile, r.median, r.min, r.max, r.n
            );
        }
    }
    s
}

/// The line about the hypervisor's steal from the two pinned CPUs ([`udpx_lab::judge::steal_note`]):
/// how many runs were marked and left out, and the extra passes run to make them up. `None`
/// without runs.
pub fn steal_note(profiles: &[ProfileResult]) -> Option<String> {
    let runs = profiles.iter().flat_map(|p| &p.rows).flat_map(|r| &r.runs).map(|m| &m.steal);
    let extra = profiles.iter().map(|p| p.passes.saturating_sub(p.planned)).sum();
    udpx_lab::judge::steal_note(runs, Some(extra))
        .map(|n| format!("{n} (the sender's and the receiver's CPUs; steal_share per run in report.json)"))
}

/// The whole run as Markdown.
pub fn markdown(
    title: &str,
    setup: &str,
    profiles: &[ProfileResult],
    cs: &[Check],
    environment: &str,
    left_out: &[LeftOut],
) -> String {
    let mut s = format!("# {title}\n\n{setup}\n\n");
    if !left_out.is_empty() {
        let _ = writeln!(s, "Rows left out of this run:\n\n```\n{}```\n", left_out_text(left_out));
    }
    for p in profiles {
        let _ = writeln!(s, "## Profile `{}`: send side (Figure 1)\n\n```\n{}```\n", p.profile, send_table(p));
        let _ = writeln!(s, "## Profile `{}`: receive side (Figure 5)\n\n```\n{}```\n", p.profile, recv_table(p));
        let _ = writeln!(s, "## Profile `{}`: against the raw reference\n\n```\n{}```\n", p.profile, raw_table(p));
    }
    let passes = profiles.first().map_or(0, |p| p.passes);
    let _ = writeln!(s, "## Targets\n\n{}\n\n```\n{}```\n", verdict_rule(passes), checks_text(cs));
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
         - x raw: this row's cost per byte over the raw row of its shape (the bare system calls of the kernel's \
         udpgso_bench, same receive buffer, same waiting), median of the per-run ratios; the raw-reference table \
         gives its range and the delivered ratio.\n\
         - delivered: received / sent datagrams (TCP: bytes).\n\
         - Each row shows its median run by CPU-s/GB, whole (its throughput, calls and loss are that run's); `±` is the \
         larger distance from that figure to the smallest or largest over the runs, which ran interleaved; report.json \
         has every run and the field-wise min and max.\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{default_rows, Preset, RowResult};
    use crate::run::Measurement;
    use crate::stats::Verdict;

    /// A profile whose rows cost these CPU-s per GB in each pass (both CPUs and the sender's
    /// alike); `f64::NAN` for a pass that failed.
    fn profile(costs: &[(&'static str, &[f64])]) -> ProfileResult {
        let passes = costs.iter().map(|c| c.1.len()).max().unwrap_or(0);
        let rows = default_rows(true, Preset::DEFAULT)
            .into_iter()
            .map(|row| {
                let mut r = RowResult::new(row);
                let per_pass = costs.iter().find(|(id, _)| *id == r.row.id).map(|x| x.1).unwrap_or(&[]);
                for (run, c) in per_pass.iter().enumerate().filter(|(_, c)| !c.is_nan()) {
                    r.runs.push(Measurement {
                        run,
                        busy_secs: *c,
                        busy_tx_cpu_secs: *c,
                        sent_bytes: 1_000_000_000,
                        recv_bytes: 1_000_000_000,
                        sent_datagrams: 1,
                        recv_datagrams: 1,
                        send_secs: 1.0,
                        ..Measurement::default()
                    });
                }
                r.summarize(passes, passes);
                r
            })
            .collect();
        ProfileResult { profile: "offload".into(), passes, planned: passes, rows }
    }

    #[test]
    fn checks_pair_runs_and_judge_the_range() {
        let p = profile(&[
            ("tcp", &[0.6, 0.6, 0.6]),
            ("iperf3-tcp", &[0.5, 0.7, 0.5]),
            ("udp", &[3.6, 4.0, 3.0]),
            ("udp-gso", &[0.9, 1.0, 0.75]),
            ("udp-gso-gro", &[0.125, 0.15, 0.15]),
            ("iperf3-udp", &[4.0, 3.0, 4.0]),
        ]);
        let cs = checks(&p);
        let get = |w: &str| cs.iter().find(|c| c.what.starts_with(w)).unwrap();
        // Cheapest TCP per pass: 0.5, 0.6, 0.5; ratios 0.25, 0.25, 0.3: all <= 0.3.
        let c = get("UDP GSO+GRO / cheapest");
        assert_eq!(c.ratios, vec![0.25, 0.25, 0.3]);
        assert_eq!((c.ratio, c.min, c.max, c.verdict), (0.25, 0.25, 0.3, Verdict::Met));
        assert_eq!(c.what, "UDP GSO+GRO / cheapest TCP", "iperf3 ran: no note");
        // 0.25 in every pass: at the target of 0.3 or below.
        assert_eq!(get("UDP GSO / UDP plain").verdict, Verdict::Met);
        // udp / iperf3-udp: 0.9, 1.333, 0.75 straddle 1.0.
        assert_eq!(get("udpx UDP plain").verdict, Verdict::Inconclusive);
        // GSO+GRO / plain: 0.069, 0.075, 0.1 <= 0.1 ... met; and a clear miss below.
        assert_eq!(get("UDP GSO+GRO / UDP plain").verdict, Verdict::Met);
        let q = profile(&[("udp", &[1.0, 1.0, 1.0]), ("udp-gso", &[0.5, 0.4, 0.6])]);
        assert_eq!(checks(&q)[0].verdict, Verdict::Missed);
        // A failed pass leaves two pairs: no verdict.
        let q = profile(&[("udp", &[1.0, f64::NAN, 1.0]), ("udp-gso", &[0.1, 0.1, 0.1])]);
        let c = &checks(&q)[0];
        assert_eq!((c.ratios.len(), c.verdict), (2, Verdict::Inconclusive));
        let text = checks_text(&cs);
        assert!(text.contains("[met] ") && text.contains("[inconclusive]"), "{text}");
        assert!(text.contains("[0.250-0.300, 3 runs, ±20%]"), "{text}");
        // Without iperf3 the check says its TCP is udpx's alone.
        let q = profile(&[("tcp", &[0.6, 0.6, 0.6]), ("udp-gso-gro", &[0.1, 0.1, 0.1])]);
        assert!(checks(&q)[0].what.contains("udpx TCP only: iperf3 left out"), "{:?}", checks(&q)[0]);
        // The receiver checks: udpx's receiver behind the raw sender over the raw receiver.
        let q = profile(&[
            ("raw-gso-gro", &[0.2, 0.2, 0.2]),
            ("raw-gso>udpx-gro", &[0.19, 0.2, 0.18]),
            ("raw-gso>udpx-gro-meta", &[0.23, 0.24, 0.23]),
        ]);
        let cs = checks(&q);
        let get = |w: &str| cs.iter().find(|c| c.what.starts_with(w)).unwrap();
        assert_eq!(get("udpx receiver / raw receiver, GSO+GRO (metadata off)").verdict, Verdict::Met);
        let c = get("udpx receiver / raw receiver, GSO+GRO with pktinfo+ECN");
        assert_eq!((c.at_most, c.verdict), (1.10, Verdict::Missed));
        // A missing row means no check, not a pass.
        let q = profile(&[("udp", &[3.0])]);
        assert!(checks(&q).is_empty());
    }

    #[test]
    fn stolen_runs_are_noted_and_left_out() {
        let mut p = profile(&[("udp", &[1.0, 1.0]), ("udp-gso", &[0.5, 0.5])]);
        assert!(steal_note(std::slice::from_ref(&p)).unwrap().starts_with("steal: 0 of 4 runs"));
        let row = p.rows.iter_mut().find(|r| r.row.id == "udp").unwrap();
        row.runs[1].steal = udpx_lab::steal::Steal { steal_s: 0.25, steal_share: 0.125, stolen: true };
        row.summarize(2, 2);
        let note = steal_note(std::slice::from_ref(&p)).unwrap();
        assert!(note.contains("1 of 4 runs over the 2 % limit") && note.contains("12.5 %"), "{note}");
        let t = send_table(&p);
        assert!(t.lines().any(|l| l.starts_with("UDP sendmsg>recvmsg") && l.ends_with(" 1/2")), "{t}");
        let c = checks(&p).into_iter().find(|c| c.what == "UDP GSO / UDP plain").unwrap();
        assert_eq!((c.ratios.len(), c.stolen), (1, 1));
    }

    #[test]
    fn tables_and_chart_render() {
        let p = profile(&[("tcp", &[0.6, 0.5, 0.7]), ("udp", &[3.6, 3.6, 3.6]), ("udp-gso", &[0.9, 0.9, 0.9])]);
        let t = send_table(&p);
        assert!(t.contains("UDP GSO") && t.contains("4.0x"), "{t}");
        // TCP's median run costs 0.6; the range 0.5-0.7 is ±17 %.
        assert!(t.contains("±17%"), "{t}");
        assert!(t.contains("failed"), "rows without runs say so");
        let svg = svg_chart(std::slice::from_ref(&p));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let md = markdown("t", "s", &[p], &[], "env", &crate::matrix::left_out(Some("not on PATH"), true));
        assert!(md.contains("left out: TCP (iperf3)") && md.contains("not on PATH"), "{md}");
        assert!(md.contains("Figure 5"));
    }
}
