//! The bulk bench's verdicts and its table.

use udpx_lab::judge::{checks_text, verdict_rule};
use udpx_lab::stats::{figures, paired_ratios, Run, Spread};

use super::config::{ClientKind, NGINX, QUINN};
use super::runs::{H3Bench, H3Row, H3Run, ZerocopyUse};
use udpx_lab::judge::{steal_note, Check};

/// The targets (see the module docs), from per-round ratios; `vs_nginx`: the best udpx
/// row's ratio to nginx at most ([`nginx_target`](super::config::nginx_target)).
pub fn judge(rows: &[H3Row], vs_nginx: f64) -> Vec<Check> {
    let mut out = Vec::new();
    let find = |server: &str, client: &str| rows.iter().find(|r| r.server == server && r.client == client);
    for client in [ClientKind::Gtlsclient, ClientKind::UdpxGet] {
        if let (Some(a), Some(b)) = (find("gso +GRO", client.name()), find("sendmsg", client.name())) {
            let what = format!("gso +GRO / sendmsg, CPU per byte ({})", client.name());
            out.extend(Check::judge("h3", &what, &a.costs(), &b.costs(), 0.5));
        }
    }
    let chromium = ClientKind::Chromium.name();
    let independent = ClientKind::Independent.name();
    // The comparisons of the bulk rows leave out the rows of the clients users bring (their
    // own pairs below).
    let bulk = |r: &H3Row| r.client != chromium && r.client != independent;
    let best = rows
        .iter()
        .filter(|r| r.is_udpx() && bulk(r))
        .filter_map(|r| Some((r, r.median?.cpu_s_per_gb)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let (Some((best, _)), Some(quinn)) = (best, rows.iter().find(|r| r.server == QUINN)) {
        let what = format!("best udpx ({}) / quinn h3, CPU per byte", best.label());
        out.extend(Check::judge("h3", &what, &best.costs(), &quinn.costs(), 1.0));
    }
    if let (Some((best, _)), Some(nginx)) = (best, rows.iter().find(|r| r.server == NGINX && bulk(r))) {
        let what = format!("best udpx ({}) / nginx, CPU per byte", best.label());
        out.extend(Check::judge("h3", &what, &best.costs(), &nginx.costs(), vs_nginx));
    }
    // The clients users bring: a browser, and an independent QUIC client (quic-go), over
    // HTTP/3 from udpx (its cache off, then on) and HTTP/2 from nginx. Issue 47's targets:
    // 1.4 with the cache off, 1.2 with it on.
    for (client, name) in [(chromium, "Chromium"), (independent, "quic-go / Go h2")] {
        let Some(n) = rows.iter().find(|r| r.client == client && r.server == NGINX) else { continue };
        // Every udpx row of the pair: the cache off, on, and half the working set.
        for u in rows.iter().filter(|r| r.client == client && r.is_udpx()) {
            let target = if u.is_cached() { 1.2 } else { 1.4 };
            let what = format!("udpx ({}) / nginx serving {name}, CPU per byte", u.label());
            out.extend(Check::judge("h3", &what, &u.costs(), &n.costs(), target));
        }
    }
    out
}

/// The table as text: rows, left-out rows, targets.
pub fn table(b: &H3Bench) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} MB file, {} rounds interleaved ({}), each row its median clean run by server CPU; {}\n",
        b.config.size as f64 / 1e6,
        b.config.repeat,
        match b.config.chromium_repeat {
            0 => "the Chromium pair left out".to_string(),
            n => format!("{n} for the Chromium pair"),
        },
        b.path
    );
    if b.debug_build {
        let _ = writeln!(
            s,
            "NOTE: a build with debug assertions (quiche checks itself on every packet): CPU figures are from \
             `cargo build --release` only\n"
        );
    }
    let _ = writeln!(
        s,
        "{:<25} {:<15} {:>9} {:>5} {:>5} {:>8} {:>5} {:>10} {:>9} {:>11} {:>6} {:>14} {:>10} {:>5} {:>8} {:>5} {:>4}",
        "server",
        "client",
        "CPU-s/GB",
        "±",
        "own%",
        "Mbit/s",
        "±",
        "send calls",
        "pkts/call",
        "turns/calls",
        "lost",
        "passes r/c/s",
        "vs sendmsg",
        "±",
        "vs nginx",
        "±",
        "runs"
    );
    for r in &b.rows {
        row_line(&mut s, b, r);
    }
    let extra: usize = b.rows.iter().map(|r| r.runs.len().saturating_sub(r.kept.planned)).max().unwrap_or(0);
    if let Some(note) = steal_note(b.rows.iter().flat_map(|r| r.runs.iter().flatten()).map(|x| &x.steal), Some(extra)) {
        let _ = writeln!(s, "{note} (the server's and the client's CPUs; steal_share per run in the JSON)");
    }
    for l in &b.left_out {
        let _ = writeln!(s, "left out: {}: {}", l.rows, l.why);
    }
    let _ = write!(s, "{}", zerocopy_note(b));
    for r in
        b.rows.iter().filter(|r| r.client == ClientKind::Chromium.name() || r.client == ClientKind::Independent.name())
    {
        if let Some(p) = r.median.and_then(|m| m.packets_per_datagram_in) {
            let _ = writeln!(
                s,
                "{}: {p:.1} packets sent per datagram received (the client's acknowledgement spacing, about)",
                r.label()
            );
        }
    }
    for r in b.rows.iter().filter(|r| r.is_cached()) {
        if let Some(c) = r.median.and_then(|m| m.cache) {
            let _ = writeln!(
                s,
                "{}: the cache ({:.0} MiB) found {:.0} % of the blocks asked for; {:.0} MiB held at the end",
                r.label(),
                c.capacity_mib,
                100.0 * c.hit_ratio,
                c.held_mib
            );
        }
    }
    let _ = writeln!(
        s,
        "passes r/c/s: bytes read from files, copied into packets and sealed, per body byte sent (udpx; the \
         kernel's copy is one more, none for zerocopy sends; nginx reads, encrypts and the kernel copies: 3; \
         udpx's stream bytes are sealed from the read's blocks, not copied first, but where a packet's data \
         lies in more than four pieces); \
         turns/calls: the server's loop turns and send calls per MB of body (udpx)"
    );
    if !b.checks.is_empty() {
        let _ = write!(s, "\n{}\n{}", verdict_rule(b.config.repeat), checks_text(&b.checks));
    }
    s
}

/// One row of [`table`]: its median clean run's figures with their spreads, and its ratios to
/// the sendmsg server and to nginx; or why it has no figure.
fn row_line(s: &mut String, b: &H3Bench, r: &H3Row) {
    use std::fmt::Write as _;
    // Against nginx serving the same client where there is such a row (the pairs of the
    // clients users bring), else nginx serving curl.
    let nginx = b
        .rows
        .iter()
        .find(|x| x.server == NGINX && x.client == r.client)
        .or_else(|| b.rows.iter().find(|x| x.server == NGINX))
        .map(H3Row::costs);
    let Some(m) = r.median else {
        let why = r.kept.no_figure().unwrap_or_else(|| format!("failed: {}", r.error.as_deref().unwrap_or("?")));
        let _ = writeln!(s, "{:<25} {:<15} {why}", r.server, r.client);
        return;
    };
    let pm = |v: f64, f: fn(&H3Run) -> f64| {
        let sp = Spread::of_clean(&figures(&r.runs, f));
        udpx_lab::judge::pm(v, sp.min, sp.max)
    };
    let ratio = |base: Option<Vec<Run>>| -> (String, String) {
        let Some(base) = base else { return ("-".into(), "-".into()) };
        let rs = paired_ratios(&r.costs(), &base);
        let sp = Spread::of(&rs);
        // No pair, or a base run that measured no CPU at all (a file too small for the
        // clock tick): no ratio to show.
        if sp.n == 0 || !sp.median.is_finite() {
            return ("-".into(), "-".into());
        }
        (format!("{:.2}x", sp.median), udpx_lab::judge::pm(sp.median, sp.min, sp.max))
    };
    let sendmsg = b.rows.iter().find(|x| x.server == "sendmsg" && x.client == r.client).map(H3Row::costs);
    let (vs_s, vs_s_pm) = if r.is_udpx() { ratio(sendmsg) } else { ("-".into(), "-".into()) };
    let (vs_n, vs_n_pm) = ratio(nginx);
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let _ = writeln!(
        s,
        "{:<25} {:<15} {:>9.3} {:>5} {:>5.0} {:>8.0} {:>5} {:>10} {:>9} {:>11} {:>6} {:>14} {:>10} {:>5} {:>8} {:>5} {:>4}",
        r.server,
        r.client,
        m.cpu_s_per_gb,
        pm(m.cpu_s_per_gb, |x| x.cpu_s_per_gb),
        100.0 * m.server_task_s / m.server_cpu_s.max(1e-9),
        m.mbit_per_s,
        pm(m.mbit_per_s, |x| x.mbit_per_s),
        opt(m.send_calls),
        m.packets_per_call.map_or("-".to_string(), |p| format!("{p:.2}")),
        match (m.turns_per_mb, m.send_calls_per_mb) {
            (Some(t), Some(c)) => format!("{t:.0}/{c:.0}"),
            _ => "-".to_string(),
        },
        opt(m.lost_packets),
        m.passes.map_or("-".to_string(), |p| format!("{:.2}/{:.2}/{:.2}", p.read, p.copied, p.sealed)),
        vs_s,
        vs_s_pm,
        vs_n,
        vs_n_pm,
        r.kept.cell()
    );
}

/// What zerocopy did over the udpx runs, in a line: a gain it cannot show on this path is
/// said, not claimed.
fn zerocopy_note(b: &H3Bench) -> String {
    let uses: Vec<ZerocopyUse> =
        b.rows.iter().flat_map(|r| r.runs.iter().flatten()).filter_map(|m| m.zerocopy).collect();
    let sends: u64 = uses.iter().map(|u| u.sends).sum();
    if uses.is_empty() || b.config.host.zerocopy == udpx_quic::Zerocopy::Off {
        return String::new();
    }
    let copied: u64 = uses.iter().map(|u| u.copied).sum();
    let off = uses.iter().filter(|u| u.turned_off).count();
    let mut s = format!(
        "zerocopy (--zerocopy {}): {sends} messages (GSO runs) went with MSG_ZEROCOPY over {} udpx runs; the \
         kernel copied {copied} of them anyway",
        b.config.host.zerocopy,
        uses.len()
    );
    if off > 0 {
        s += &format!(", so {off} runs turned it off after their first sends");
    }
    if sends > 0 && copied == sends {
        s += " (loopback and veth always copy: what zerocopy saves shows only on a NIC with scatter-gather)";
    }
    s + "\n"
}
