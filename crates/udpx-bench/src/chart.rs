//! The SVG chart of the main job (`cost.svg` beside `report.md`): CPU seconds per delivered GB
//! for every row, one bar per profile.
//!
//! ```text
//!                      title
//!                      [bar+line key]  bar: the median run; line: lowest to highest over N clean runs
//!                      [■] offload  [■] software
//! raw GSO>udpx GRO ... |██████████├──┤ 0.52
//! <- label column  ->  <- plot (PLOT_W) ->  <- value text ->
//! ```
//!
//! Each bar is the row's median run, the run the tables print; the line with end caps over it
//! spans the smallest to the largest cost of the row's runs (every run that delivered
//! something), so two bars whose lines overlap are not told apart by this job. The label
//! column, the value column and the canvas are sized from the longest text they hold
//! ([`chart::text_width`]), so no label is cut.

use std::fmt::Write as _;

use udpx_lab::chart::{self, escape};

use crate::matrix::{Figures, ProfileResult, RowResult};

/// Font sizes (px): the labels and values, the title.
const FONT: f64 = 11.0;
const TITLE_FONT: f64 = 13.0;
/// Margin around everything, and the gap between a text and what it labels (px).
const PAD: f64 = 10.0;
const GAP: f64 = 6.0;
/// Width of the plot: the largest value's bar or line ends here (px).
const PLOT_W: f64 = 520.0;
/// Height of one bar and the pitch of the bars of one row (px).
const BAR_H: f64 = 11.0;
const BAR_PITCH: f64 = 14.0;
/// Half the height of a range line's end caps (px).
const CAP: f64 = 4.0;
const COLORS: [&str; 3] = ["#3b6ea5", "#d08c2e", "#5a9e5a"];
const RANGE_COLOR: &str = "#1a1a1a";
const TITLE: &str = "CPU seconds per delivered GB (both CPUs; lower is better)";

/// One bar: a row of one profile, from its runs.
struct Bar {
    /// The median run's cost (the tables' figure); infinite when that run delivered nothing.
    median: f64,
    /// Smallest and largest finite cost over the runs, and how many runs had one.
    lo: f64,
    hi: f64,
    finite: usize,
    /// Runs measured, and runs that delivered nothing (infinite cost: not in the range).
    runs: usize,
    nothing: usize,
}

impl Bar {
    fn of(r: &RowResult) -> Bar {
        // The clean runs (a run the hypervisor stole from counts in no range: udpx_lab::steal).
        let costs: Vec<f64> = r.runs.iter().filter(|m| !m.steal.stolen).map(|m| Figures::of(m).cpu_per_gb).collect();
        let finite: Vec<f64> = costs.iter().copied().filter(|c| c.is_finite()).collect();
        Bar {
            median: r.median.cpu_per_gb,
            lo: finite.iter().copied().fold(f64::INFINITY, f64::min),
            hi: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            finite: finite.len(),
            runs: costs.len(),
            nothing: costs.len() - finite.len(),
        }
    }

    /// Whether a range line is drawn: two runs or more with a cost.
    fn has_range(&self) -> bool {
        self.finite > 1
    }

    /// The text after the bar: the median, and what the line does not say.
    fn value_text(&self, passes: usize) -> String {
        let mut notes = Vec::new();
        if self.runs < passes {
            notes.push(format!("{} of {passes} runs", self.runs));
        }
        if self.nothing > 0 {
            notes.push(format!("{} delivered nothing", self.nothing));
        }
        let v = if self.median.is_finite() { format!("{:.2}", self.median) } else { "-".into() };
        if notes.is_empty() {
            v
        } else {
            format!("{v} ({})", notes.join("; "))
        }
    }
}

/// What one profile shows for one row: a bar, or why not.
enum Cell {
    Bar(Bar),
    Text(&'static str),
}

fn cell(p: &ProfileResult, id: &str) -> Cell {
    match p.rows.iter().find(|r| r.row.id == id) {
        None => Cell::Text("not run"),
        Some(r) if r.runs.is_empty() => Cell::Text("failed: no run measured"),
        Some(r) => Cell::Bar(Bar::of(r)),
    }
}

/// An SVG bar chart: CPU-s per delivered GB for every row, one bar per profile, each with the
/// range of its runs (see the module's documentation).
pub fn svg_chart(profiles: &[ProfileResult]) -> String {
    // Rows in table order; a row only one profile ran still gets its line.
    let mut rows: Vec<(&str, &str)> = Vec::new();
    for r in profiles.iter().flat_map(|p| &p.rows) {
        if !rows.iter().any(|(id, _)| *id == r.row.id) {
            rows.push((r.row.id, r.row.label));
        }
    }
    let cells: Vec<Vec<Cell>> = rows.iter().map(|(id, _)| profiles.iter().map(|p| cell(p, id)).collect()).collect();
    let bars = || cells.iter().flatten().filter_map(|c| if let Cell::Bar(b) = c { Some(b) } else { None });
    let max = bars().flat_map(|b| [b.median, b.hi]).filter(|x| x.is_finite()).fold(0.0f64, f64::max).max(0.1);
    let passes = profiles.iter().map(|p| p.planned).max().unwrap_or(0);
    let fewer = bars().any(|b| b.runs < passes || b.nothing > 0);

    // The texts decide the sizes.
    let caption = format!(
        "bar: the median run; line: lowest to highest over {passes} clean run{}{}",
        if passes == 1 { "" } else { "s" },
        if fewer { " (fewer where noted)" } else { "" }
    );
    let key_w = 34.0;
    let x0 = PAD + rows.iter().map(|(_, l)| chart::text_width(l, FONT)).fold(0.0, f64::max) + GAP;
    let values: Vec<String> = cells
        .iter()
        .flat_map(|row| row.iter().zip(profiles))
        .map(|(c, p)| match c {
            Cell::Bar(b) => b.value_text(p.planned),
            Cell::Text(t) => t.to_string(),
        })
        .collect();
    let value_w = values.iter().map(|v| chart::text_width(v, FONT)).fold(0.0, f64::max);
    let legend_w: f64 = profiles.iter().map(|p| 14.0 + chart::text_width(&p.profile, FONT) + 18.0).sum();
    let width = (x0 + PLOT_W + GAP + value_w + PAD)
        .max(x0 + key_w + GAP + chart::text_width(&caption, FONT) + PAD)
        .max(x0 + legend_w + PAD)
        .max(PAD + chart::text_width(TITLE, TITLE_FONT) + PAD)
        .ceil();
    let row_h = BAR_PITCH * profiles.len() as f64 + 8.0;
    let top = 70.0;
    let height = (top + row_h * rows.len() as f64 + PAD).ceil();
    let px = |v: f64| x0 + v / max * PLOT_W;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="{}" font-size="{FONT}">"#,
        chart::FONT_FAMILY
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{PAD}" y="20" font-size="{TITLE_FONT}">{}</text>"#, escape(TITLE));
    write_key(&mut s, x0, key_w, &caption, profiles);
    for (i, ((_, label), row)) in rows.iter().zip(&cells).enumerate() {
        let y0 = top + row_h * i as f64;
        // Every other row shaded, so a label is read with its own bars.
        if i % 2 == 1 {
            let _ = writeln!(s, r##"<rect x="0" y="{y0}" width="{width}" height="{row_h}" fill="#f2f2f2"/>"##);
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            x0 - GAP,
            y0 + row_h / 2.0 + 3.5,
            escape(label)
        );
        for (pi, (p, c)) in profiles.iter().zip(row).enumerate() {
            let y = y0 + 4.0 + BAR_PITCH * pi as f64;
            let text_y = y + 9.0;
            let b = match c {
                Cell::Text(t) => {
                    let _ = writeln!(s, r##"<text x="{}" y="{text_y}" fill="#777">{t}</text>"##, x0 + GAP);
                    continue;
                }
                Cell::Bar(b) => b,
            };
            // The tooltip: the figures to three places, `-` where there is none.
            let fig = |x: f64| if x.is_finite() { format!("{x:.3}") } else { "-".into() };
            let _ = writeln!(
                s,
                "<g><title>{}</title>",
                escape(&format!(
                    "{}, {label}: median run {}, lowest {}, highest {} CPU-s/GB over {} clean of {} planned runs",
                    p.profile,
                    fig(b.median),
                    fig(b.lo),
                    fig(b.hi),
                    b.runs,
                    p.planned
                ))
            );
            let mut end = x0;
            if b.median.is_finite() {
                let w = (px(b.median) - x0).max(1.0);
                let _ = writeln!(
                    s,
                    r#"<rect x="{x0}" y="{y}" width="{w:.1}" height="{BAR_H}" fill="{}"/>"#,
                    COLORS[pi % COLORS.len()]
                );
                end = x0 + w;
            }
            if b.has_range() {
                let (a, z, yc) = (px(b.lo), px(b.hi), y + BAR_H / 2.0);
                let _ = writeln!(
                    s,
                    r#"<path class="range" d="M{a:.1} {yc}H{z:.1}M{a:.1} {}V{}M{z:.1} {}V{}" stroke="{RANGE_COLOR}" stroke-width="1.3" fill="none"/>"#,
                    yc - CAP,
                    yc + CAP,
                    yc - CAP,
                    yc + CAP
                );
                end = end.max(z);
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{text_y}">{}</text></g>"#,
                end + GAP,
                escape(&b.value_text(p.planned))
            );
        }
    }
    // The zero line the bars grow from, over the shading.
    let _ = writeln!(
        s,
        r##"<line x1="{x0}" y1="{}" x2="{x0}" y2="{}" stroke="#bbb"/>"##,
        top - 2.0,
        top + row_h * rows.len() as f64
    );
    s.push_str("</svg>\n");
    s
}

/// The chart's key, at `x0` below the title: a small bar with a line over it and `caption`
/// (what they mean) after it, `key_w` wide; then one colour swatch per profile.
fn write_key(s: &mut String, x0: f64, key_w: f64, caption: &str, profiles: &[ProfileResult]) {
    // The key: a small bar with a line over it, then what they mean.
    let ky = 32.0;
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{ky}" width="{}" height="{BAR_H}" fill="#999"/><path d="M{} {}H{}M{} {}V{}M{} {}V{}" stroke="{RANGE_COLOR}" stroke-width="1.3" fill="none"/>"##,
        key_w * 0.6,
        x0 + key_w * 0.35,
        ky + BAR_H / 2.0,
        x0 + key_w * 0.9,
        x0 + key_w * 0.35,
        ky + BAR_H / 2.0 - CAP,
        ky + BAR_H / 2.0 + CAP,
        x0 + key_w * 0.9,
        ky + BAR_H / 2.0 - CAP,
        ky + BAR_H / 2.0 + CAP,
    );
    let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, x0 + key_w + GAP, ky + 9.0, escape(caption));
    let mut lx = x0;
    for (pi, p) in profiles.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="50" width="10" height="10" fill="{}"/><text x="{}" y="59">{}</text>"#,
            COLORS[pi % COLORS.len()],
            lx + 14.0,
            escape(&p.profile)
        );
        lx += 14.0 + chart::text_width(&p.profile, FONT) + 18.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{default_rows, Preset, Row, RowResult};
    use crate::run::Measurement;

    /// A label longer than any row has, to show the column grows to it.
    const LONG: &str = "raw GSO+mmsg>udpx GRO+mmsg+pktinfo+ECN+timestamps, rcvbuf 32M";

    /// Every row of the job and [`LONG`], `passes` runs each with a spread, except: `udp` ran
    /// once, `udp-gso-zc-forced` never, and `udp-gro`'s second run delivered nothing.
    fn profile(name: &str, scale: f64, passes: usize) -> ProfileResult {
        let mut rows = default_rows(true, Preset::THOROUGH);
        rows.push(Row { id: "long", label: LONG, kind: rows[0].kind });
        let rows = rows
            .into_iter()
            .enumerate()
            .map(|(i, row)| {
                let mut r = RowResult::new(row);
                let runs = match r.row.id {
                    "udp" => 1,
                    "udp-gso-zc-forced" => 0,
                    _ => passes,
                };
                for run in 0..runs {
                    let cost = scale * (0.2 + (i % 7) as f64 * 0.5) * (1.0 + 0.1 * ((i + run) % 3) as f64);
                    let delivered = if r.row.id == "udp-gro" && run == 1 { 0 } else { 1_000_000_000 };
                    r.runs.push(Measurement {
                        run,
                        busy_secs: cost,
                        sent_bytes: 1_000_000_000,
                        recv_bytes: delivered,
                        send_secs: 1.0,
                        ..Measurement::default()
                    });
                }
                r.summarize(passes, passes);
                r
            })
            .collect();
        ProfileResult { profile: name.into(), passes, planned: passes, rows }
    }

    /// The `<g>` of one bar, found by its tooltip.
    fn group<'a>(svg: &'a str, profile: &str, label: &str) -> Option<&'a str> {
        let at = svg.find(&format!("<g><title>{}", escape(&format!("{profile}, {label}:"))))?;
        Some(&svg[at..at + svg[at..].find("</g>")?])
    }

    #[test]
    fn every_label_is_whole_and_every_range_is_drawn() {
        let ps = [profile("offload", 1.0, 5), profile("software", 1.7, 5)];
        let svg = svg_chart(&ps);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let (width, height) = chart::canvas(&svg).expect("the canvas");
        let texts = chart::texts(&svg);
        // Every text inside the canvas, by the width the font can take.
        for t in &texts {
            let (l, r) = t.extent();
            assert!(l >= 0.0 && r <= width, "{t:?} leaves the canvas of width {width}");
        }
        let bar_x: Vec<f64> = chart::start_tags(&svg, "rect")
            .filter(|t| t.contains(&format!("height=\"{BAR_H}\"")) && !t.contains("#999"))
            .map(|t| chart::attr(t, "x").unwrap().parse().unwrap())
            .collect();
        let x0 = bar_x[0];
        assert!(bar_x.iter().all(|x| *x == x0), "every bar starts at the plot's left edge");
        // Every row label whole, once, left of the bars.
        for r in &ps[0].rows {
            let found: Vec<_> = texts.iter().filter(|t| t.content == r.row.label).collect();
            assert_eq!(found.len(), 1, "{:?} drawn whole once", r.row.label);
            let (l, right) = found[0].extent();
            assert!(l >= 0.0 && right < x0, "{:?} spans {l}-{right}, the bars start at {x0}", r.row.label);
        }
        assert!(texts
            .iter()
            .any(|t| t.content.starts_with("bar: the median run; line: lowest to highest over 5 clean runs")));
        // Every bar of more than one run with a cost has its range: a line with two end caps
        // from the smallest to the largest run, on the bar's scale.
        let mut ranges = 0;
        for p in &ps {
            for r in &p.rows {
                let costs: Vec<f64> =
                    r.runs.iter().map(|m| Figures::of(m).cpu_per_gb).filter(|c| c.is_finite()).collect();
                let Some(g) = group(&svg, &p.profile, r.row.label) else {
                    assert!(r.runs.is_empty(), "{} {} has runs but no bar", p.profile, r.row.id);
                    continue;
                };
                let range = chart::start_tags(g, "path").find(|t| t.contains("class=\"range\""));
                if costs.len() < 2 {
                    assert!(range.is_none(), "{} {}: one run, no range", p.profile, r.row.id);
                    continue;
                }
                let d = chart::attr(range.expect("a range line"), "d").unwrap();
                assert_eq!(d.matches('M').count(), 3, "the line and two caps: {d}");
                let (from, to) = d[1..].split_once('H').unwrap();
                let a: f64 = from.split(' ').next().unwrap().parse().unwrap();
                let z: f64 = to[..to.find('M').unwrap()].parse().unwrap();
                let bar = chart::start_tags(g, "rect").next().unwrap();
                let px_per = chart::attr(bar, "width").unwrap().parse::<f64>().unwrap() / r.median.cpu_per_gb;
                let lo = costs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = costs.iter().copied().fold(0.0, f64::max);
                assert!(lo < hi, "the data has a spread");
                for (got, want) in [(a, lo), (z, hi)] {
                    assert!((got - (x0 + want * px_per)).abs() < 0.5, "{} {}: {d} for {lo}-{hi}", p.profile, r.row.id);
                }
                ranges += 1;
            }
        }
        assert_eq!(svg.matches("class=\"range\"").count(), ranges, "no range without its row");
        assert!(ranges > 40, "{ranges}");
        // What the line cannot say is said beside it.
        let note = |s: &str| texts.iter().any(|t| t.content.ends_with(s));
        assert!(note("(1 of 5 runs)") && note("(1 delivered nothing)"));
        assert!(texts.iter().filter(|t| t.content == "failed: no run measured").count() == 2);
        assert!(height > 70.0 + 30.0 * ps[0].rows.len() as f64);
    }
}
