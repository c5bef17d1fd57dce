//! The README as a contract with docs/bench.md: every figure in the README's table of tools is
//! one that docs/bench.md (or docs/library.md, for `udpx-tokio`) writes, digit for digit, and
//! the README's "Not done yet" lists open gaps only. Plain reading of the files, no build of
//! anything and no network.

use std::collections::HashSet;
use std::path::PathBuf;

/// A file of the repository, by its path from the repository's root.
fn read(path: &str) -> String {
    let file = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../")).join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The rows of the README's first table (the lines that start with `|` after the title), its
/// header included: the table of tools.
fn table_rows(readme: &str) -> Vec<&str> {
    readme.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).collect()
}

/// The section under `heading` (a `## ` line), up to the next `## ` heading.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text.find(heading).unwrap_or_else(|| panic!("no {heading:?} in the README"));
    let body = &text[start + heading.len()..];
    &body[..body.find("\n## ").unwrap_or(body.len())]
}

/// Where the number at `k` ends: digits, groups of three after commas (`59,738`), a decimal
/// part (`0.68`).
fn number_end(c: &[char], mut k: usize) -> usize {
    let digit = |k: usize| c.get(k).is_some_and(char::is_ascii_digit);
    while digit(k) {
        k += 1;
    }
    while c.get(k) == Some(&',') && (1..=3).all(|d| digit(k + d)) && !digit(k + 4) {
        k += 4;
    }
    if c.get(k) == Some(&'.') && digit(k + 1) {
        k += 1;
        while digit(k) {
            k += 1;
        }
    }
    k
}

/// Where the number or range of two numbers (`1.4-1.8`) at `k` ends, and whether it is a range.
fn number_or_range_end(c: &[char], k: usize) -> (usize, bool) {
    let end = number_end(c, k);
    if c.get(end) == Some(&'-') && c.get(end + 1).is_some_and(char::is_ascii_digit) {
        (number_end(c, end + 1), true)
    } else {
        (end, false)
    }
}

/// Whether a date (`2026-11-29`) starts at `k`.
fn is_date(c: &[char], k: usize) -> bool {
    let digits = |from: usize, n: usize| (from..from + n).all(|i| c.get(i).is_some_and(char::is_ascii_digit));
    digits(k, 4)
        && c.get(k + 4) == Some(&'-')
        && digits(k + 5, 2)
        && c.get(k + 7) == Some(&'-')
        && digits(k + 8, 2)
        && !c.get(k + 10).is_some_and(char::is_ascii_digit)
}

/// The figures in `text`, in order, each as written. A figure is a number (`0.68`, `5,000`) or
/// a range of two (`1.4-1.8`), with the `x` or ` %` after it if there is one (`0.68x`,
/// `0.3 %`), or a range in brackets (`[2.96-3.70]`). Not figures: digits inside a word (`h3`,
/// `p99`, `8b5a739`, `v0.65.0`), dates (`2026-11-29`) and a link's target (`](docs/...-27)`).
fn figures(text: &str) -> Vec<String> {
    let c: Vec<char> = text.chars().collect();
    let digit = |k: usize| c.get(k).is_some_and(char::is_ascii_digit);
    let wordy = |k: usize| c.get(k).is_some_and(|ch| ch.is_alphanumeric() || *ch == '_');
    // Inside a word: after a letter, a digit or `_`, or after a `.` that follows one (`v0.65.0`).
    let in_word = |k: usize| k > 0 && (wordy(k - 1) || (c[k - 1] == '.' && k > 1 && wordy(k - 2)));
    let mut found = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i] == ']' && c.get(i + 1) == Some(&'(') {
            i += c[i..].iter().position(|&ch| ch == ')').unwrap_or(c.len() - i);
            continue;
        }
        if c[i] == '[' && digit(i + 1) {
            let (end, is_range) = number_or_range_end(&c, i + 1);
            if is_range && c.get(end) == Some(&']') {
                found.push(c[i..=end].iter().collect());
                i = end + 1;
                continue;
            }
        }
        if !digit(i) || in_word(i) {
            i += 1;
            continue;
        }
        if is_date(&c, i) {
            i += 10;
            continue;
        }
        let (mut end, _) = number_or_range_end(&c, i);
        if c.get(end) == Some(&'x') && !wordy(end + 1) {
            end += 1;
        } else if c.get(end) == Some(&' ') && c.get(end + 1) == Some(&'%') {
            end += 2;
        }
        // `8b5a739`, `32M`, `0.30.0`: the start of a word, not a figure.
        if !(wordy(end) || (c.get(end) == Some(&'.') && digit(end + 1))) {
            found.push(c[i..end].iter().collect());
        }
        i = end;
    }
    found
}

/// The reading of a figure, case by case: what the other tests rely on.
#[test]
fn a_figure_is_read_whole_and_as_written() {
    let cases: &[(&str, &[&str])] = &[
        ("3.43x [2.96-3.70], 5 paired rounds", &["3.43x", "[2.96-3.70]", "5"]),
        ("1.4-1.8x nginx's, 0.52 ms", &["1.4-1.8x", "0.52"]),
        ("lost 0.3 % of 59,738 and 10,000", &["0.3 %", "59,738", "10,000"]),
        // A verdict line's range is not closed by its bracket: the range alone is the figure.
        ("0.973 [0.955-0.999, 5 runs]", &["0.973", "0.955-0.999", "5"]),
        ("h3, p99, 8b5a739, v0.65.0, 32M, 4xx", &[]),
        ("on 2026-11-29 (target 1.4)", &["1.4"]),
        ("[bench.md](docs/bench.md#the-quic-host-at-scale-issue-27) 6 of 6 by 4-tuple", &["6", "6", "4"]),
    ];
    for (text, want) in cases {
        assert_eq!(figures(text), *want, "{text:?}");
    }
}

/// Every figure in the third column of the README's table of tools is a figure of
/// docs/bench.md or docs/library.md, read the same way: the README states the latest verdicts
/// there, copied digit for digit (`1.4-1.8x` needs `1.4-1.8x` there, not `1.4x` and `1.8x`).
/// A figure rounded, retyped or left behind by a newer run fails here with its row's tool.
#[test]
fn every_figure_in_the_readme_table_is_in_bench_md() {
    let readme = read("README.md");
    let docs: HashSet<String> =
        figures(&read("docs/bench.md")).into_iter().chain(figures(&read("docs/library.md"))).collect();
    let rows = table_rows(&readme);
    assert!(rows.len() > 2, "the README's first table has {} lines: is it still the table of tools?", rows.len());
    let mut missing = Vec::new();
    // The header and the separator are not tools.
    for row in rows.iter().skip(2) {
        let cells: Vec<&str> = row.split('|').collect();
        let (tool, headline) = (cells.get(1).map_or("", |t| t.trim()), cells.get(3).copied().unwrap_or(""));
        missing.extend(figures(headline).into_iter().filter(|f| !docs.contains(f)).map(|f| format!("{tool}: {f}")));
    }
    assert!(
        missing.is_empty(),
        "figures in the README's table that neither docs/bench.md nor docs/library.md writes \
         (copy the latest verdict as bench.md writes it):\n  {}",
        missing.join("\n  ")
    );
}

/// "Not done yet" lists the open gaps, one line each; a gap closed leaves it (its figures stay
/// in docs/bench.md and CHANGELOG.md). Issue 46 is done.
#[test]
fn not_done_yet_lists_only_open_issues() {
    let readme = read("README.md");
    let gaps = section(&readme, "## Not done yet");
    assert!(gaps.contains("- **"), "\"Not done yet\" has no line of its own:\n{gaps}");
    for done in ["done on", "(issue 46"] {
        assert!(!gaps.contains(done), "\"Not done yet\" says {done:?}: what is done belongs in docs/bench.md\n{gaps}");
    }
}
