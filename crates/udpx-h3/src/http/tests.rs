use std::io::Read;

use super::*;

const LEN: u64 = 1000;

fn part(start: u64, len: u64) -> Outcome {
    Outcome::Part { start, len }
}

#[test]
fn ranges() {
    use Outcome::*;
    let table: &[(&str, u64, Outcome)] = &[
        ("bytes=0-0", LEN, part(0, 1)),
        ("bytes=0-499", LEN, part(0, 500)),
        ("bytes=500-", LEN, part(500, 500)),
        ("bytes=999-999", LEN, part(999, 1)),
        ("bytes=990-2000", LEN, part(990, 10)), // across the last byte: clamped
        ("bytes=-10", LEN, part(990, 10)),
        ("bytes=-1000", LEN, part(0, 1000)),
        ("bytes=-5000", LEN, part(0, 1000)), // a suffix longer than the file: all of it
        ("Bytes = 3-4", LEN, part(3, 2)),
        (" bytes= 3 - 4 ", LEN, part(3, 2)),
        ("bytes=0-18446744073709551615", LEN, part(0, 1000)),
        ("bytes=0-99999999999999999999999", LEN, part(0, 1000)),
        ("bytes=-99999999999999999999999", LEN, part(0, 1000)),
        ("bytes=1000-", LEN, NotSatisfiable),
        ("bytes=1000-1001", LEN, NotSatisfiable),
        ("bytes=9223372036854775808-", LEN, NotSatisfiable), // 2^63
        ("bytes=99999999999999999999999-", LEN, NotSatisfiable),
        ("bytes=-0", LEN, NotSatisfiable),
        ("bytes=0-0", 0, NotSatisfiable),
        ("bytes=0-", 0, NotSatisfiable),
        ("bytes=-0", 0, NotSatisfiable),
        ("bytes=-1", 0, Whole), // the only satisfiable form on an empty file: no content-range for 0 bytes
        ("bytes=9-3", LEN, Whole), // invalid: ignored
        ("bytes=x-3", LEN, Whole),
        ("bytes=3-x", LEN, Whole),
        ("bytes=+3-4", LEN, Whole),
        ("bytes=-", LEN, Whole),
        ("bytes=", LEN, Whole),
        ("bytes", LEN, Whole),
        ("items=0-1", LEN, Whole),
        ("bytes=0-1,5-6", LEN, Whole), // several ranges: the whole file
        ("bytes=0-1,", LEN, part(0, 2)),
        ("bytes=--1", LEN, Whole),
        ("bytes=1-2-3", LEN, Whole),
    ];
    for &(field, len, want) in table {
        assert_eq!(parse_range(field, len), want, "{field:?} on {len} bytes");
    }
}

#[test]
fn etag_lists() {
    let cur = "\"abc\"";
    for (list, weak_cmp, strong_cmp) in [
        ("\"abc\"", true, true),
        ("W/\"abc\"", true, false),
        ("\"x\", \"abc\"", true, true),
        ("\"x\",W/\"abc\"", true, false),
        ("*", true, true),
        ("\"abcd\"", false, false),
        ("abc", false, false),
        ("\"abc", false, false),
        ("", false, false),
        ("\"a,b\", \"abc\"", true, true),
    ] {
        assert_eq!(etag_list_matches(list, cur, false), weak_cmp, "weak {list:?}");
        assert_eq!(etag_list_matches(list, cur, true), strong_cmp, "strong {list:?}");
    }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn date(secs: u64) -> String {
    httpdate::fmt_http_date(at(secs))
}

#[test]
fn conditionals_before_ranges() {
    use Outcome::*;
    let now = at(2_000_000_000);
    let mtime = at(1_700_000_000) + Duration::from_millis(500);
    let v = Validators::new("\"e1\"".into(), mtime, now);
    assert_eq!(v.last_modified, at(1_700_000_000));
    let lm = date(1_700_000_000);
    let range = || Some(Some("bytes=0-9".to_string()));
    let c = |f: &dyn Fn(&mut Conditions)| {
        let mut c = Conditions::default();
        f(&mut c);
        c
    };
    let cases: Vec<(&str, Conditions, bool, Outcome)> = vec![
        ("nothing", c(&|_| {}), true, Whole),
        ("range", c(&|c| c.range = range()), true, part(0, 10)),
        ("range on HEAD is ignored", c(&|c| c.range = range()), false, Whole),
        ("two Range fields", c(&|c| c.range = Some(None)), true, Whole),
        ("INM match", c(&|c| c.if_none_match = Some("\"e1\"".into())), true, NotModified),
        ("INM weak match", c(&|c| c.if_none_match = Some("W/\"e1\"".into())), true, NotModified),
        ("INM on HEAD", c(&|c| c.if_none_match = Some("\"e1\"".into())), false, NotModified),
        ("INM star", c(&|c| c.if_none_match = Some("*".into())), true, NotModified),
        ("INM other", c(&|c| c.if_none_match = Some("\"e0\"".into())), true, Whole),
        (
            "INM before Range",
            c(&|c| {
                c.if_none_match = Some("\"e1\"".into());
                c.range = range();
            }),
            true,
            NotModified,
        ),
        ("IMS same second", c(&|c| c.if_modified_since = Some(lm.clone())), true, NotModified),
        ("IMS later", c(&|c| c.if_modified_since = Some(date(1_800_000_000))), true, NotModified),
        ("IMS earlier", c(&|c| c.if_modified_since = Some(date(1_600_000_000))), true, Whole),
        ("IMS in the future: ignored", c(&|c| c.if_modified_since = Some(date(2_100_000_000))), true, Whole),
        ("IMS garbage: ignored", c(&|c| c.if_modified_since = Some("yesterday".into())), true, Whole),
        (
            "INM (no match) wins over IMS",
            c(&|c| {
                c.if_none_match = Some("\"e0\"".into());
                c.if_modified_since = Some(lm.clone());
            }),
            true,
            Whole,
        ),
        ("IM match", c(&|c| c.if_match = Some("\"e1\"".into())), true, Whole),
        ("IM weak never matches", c(&|c| c.if_match = Some("W/\"e1\"".into())), true, PreconditionFailed),
        ("IM other", c(&|c| c.if_match = Some("\"e0\"".into())), true, PreconditionFailed),
        ("IM star", c(&|c| c.if_match = Some("*".into())), true, Whole),
        ("IUS earlier", c(&|c| c.if_unmodified_since = Some(date(1_600_000_000))), true, PreconditionFailed),
        ("IUS same", c(&|c| c.if_unmodified_since = Some(lm.clone())), true, Whole),
        (
            "IM match overrides IUS",
            c(&|c| {
                c.if_match = Some("\"e1\"".into());
                c.if_unmodified_since = Some(date(1_600_000_000));
            }),
            true,
            Whole,
        ),
        (
            "If-Range etag match",
            c(&|c| {
                c.range = range();
                c.if_range = Some("\"e1\"".into());
            }),
            true,
            part(0, 10),
        ),
        (
            "If-Range etag mismatch: whole",
            c(&|c| {
                c.range = range();
                c.if_range = Some("\"e0\"".into());
            }),
            true,
            Whole,
        ),
        (
            "If-Range weak etag: whole",
            c(&|c| {
                c.range = range();
                c.if_range = Some("W/\"e1\"".into());
            }),
            true,
            Whole,
        ),
        (
            "If-Range date match",
            c(&|c| {
                c.range = range();
                c.if_range = Some(lm.clone());
            }),
            true,
            part(0, 10),
        ),
        (
            "If-Range date mismatch: whole",
            c(&|c| {
                c.range = range();
                c.if_range = Some(date(1_700_000_001));
            }),
            true,
            Whole,
        ),
        ("If-Range without Range: whole", c(&|c| c.if_range = Some("\"e1\"".into())), true, Whole),
        (
            "unsatisfiable after conditions pass",
            c(&|c| c.range = Some(Some("bytes=5000-".into()))),
            true,
            NotSatisfiable,
        ),
    ];
    for (what, cond, get, want) in cases {
        assert_eq!(evaluate(&cond, &v, LEN, get, now), want, "{what}");
    }
}

#[test]
fn young_and_future_modification_times() {
    let now = at(2_000_000_000);
    let range = || Some(Some("bytes=0-9".to_string()));
    // A date validator of a file changed less than a second ago is weak: If-Range by date
    // must not splice two versions made within one second.
    let young = Validators::new("\"e2\"".into(), now - Duration::from_millis(300), now);
    assert!(!young.date_is_strong);
    let mut cond = Conditions { range: range(), ..Conditions::default() };
    cond.if_range = Some(httpdate::fmt_http_date(young.last_modified));
    assert_eq!(evaluate(&cond, &young, LEN, true, now), Outcome::Whole);
    // A modification time in the future is announced as now.
    let future = Validators::new("\"e3\"".into(), now + Duration::from_secs(3600), now);
    assert_eq!(future.last_modified, now);
}

#[test]
fn header_fields_are_collected() {
    let h: Vec<(&[u8], &[u8])> = vec![
        (b"if-none-match", b"\"a\""),
        (b"if-none-match", b" \"b\" "),
        (b"range", b"bytes=0-1"),
        (b"if-range", b"\"a\""),
        (b"x-other", b"\xff"),
    ];
    let c = Conditions::from_headers(&h);
    assert_eq!(c.if_none_match.as_deref(), Some("\"a\", \"b\""));
    assert_eq!(c.range, Some(Some("bytes=0-1".into())));
    let h: Vec<(&[u8], &[u8])> = vec![(b"range", b"bytes=0-1"), (b"range", b"bytes=2-3")];
    assert_eq!(Conditions::from_headers(&h).range, Some(None));
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn site(opts: &SiteOptions) -> (Dir, Site) {
    let d = std::env::temp_dir().join(format!("udpx-h3-http-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(d.join("www/docs")).unwrap();
    std::fs::write(d.join("www/index.html"), b"<p>home</p>").unwrap();
    std::fs::write(d.join("www/docs/index.html"), b"<p>docs</p>").unwrap();
    std::fs::write(d.join("www/seg.m4s"), (0..=255u8).cycle().take(1000).collect::<Vec<u8>>()).unwrap();
    std::fs::write(d.join("www/empty.txt"), b"").unwrap();
    let s = Site::new(&d.join("www"), opts).unwrap();
    (Dir(d), s)
}

fn get<'a>(s: &Site, method: &'a str, path: &'a str, headers: &'a [(&'a [u8], &'a [u8])]) -> Answer {
    s.answer(&RequestHead { method: method.as_bytes(), path: path.as_bytes(), headers })
}

fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
}

fn body(a: Answer) -> Vec<u8> {
    let Some(mut b) = a.body else { return Vec::new() };
    let mut out = vec![0; b.len as usize];
    b.file.read_exact(&mut out).unwrap();
    out
}

#[test]
fn answers() {
    let (_d, s) = site(&SiteOptions::default());
    s.set_alt_svc(4433);
    let a = get(&s, "GET", "/", &[]);
    assert_eq!((a.status, header(&a, "content-type")), (200, Some("text/html")));
    assert_eq!(header(&a, "alt-svc"), Some("h3=\":4433\"; ma=86400"));
    assert_eq!(body(a), b"<p>home</p>");
    assert_eq!(body(get(&s, "GET", "/docs/", &[])), b"<p>docs</p>");
    let a = get(&s, "GET", "/docs?x=1", &[]);
    assert_eq!((a.status, header(&a, "location")), (301, Some("/docs/?x=1")));
    // A redirect built from the request: no CR/LF or raw query bytes reach the header, and
    // `//host` is not a scheme-relative redirect.
    let a = get(&s, "GET", "//docs?a\r\nset-cookie: x", &[]);
    assert_eq!((a.status, header(&a, "location")), (301, Some("/docs/?a%0D%0Aset-cookie:%20x")));
    let a = get(&s, "GET", "/seg.m4s", &[]);
    assert_eq!((header(&a, "content-type"), header(&a, "content-length")), (Some("video/iso.segment"), Some("1000")));
    for name in ["etag", "last-modified", "cache-control", "date", "accept-ranges"] {
        assert!(header(&a, name).is_some(), "{name}");
    }
    let etag = header(&a, "etag").unwrap().to_string();
    let lm = header(&a, "last-modified").unwrap().to_string();
    // HEAD: the same fields, no body, Range ignored.
    let a = get(&s, "HEAD", "/seg.m4s", &[(b"range", b"bytes=0-1")]);
    assert_eq!((a.status, header(&a, "content-length"), a.body.is_none()), (200, Some("1000"), true));
    // 206 bodies start where they should.
    let a = get(&s, "GET", "/seg.m4s", &[(b"range", b"bytes=300-309")]);
    assert_eq!((a.status, header(&a, "content-range")), (206, Some("bytes 300-309/1000")));
    assert_eq!(body(a), (300..310u32).map(|i| (i % 256) as u8).collect::<Vec<_>>());
    let a = get(&s, "GET", "/seg.m4s", &[(b"range", b"bytes=-3")]);
    assert_eq!(body(a), vec![(997 % 256) as u8, (998 % 256) as u8, (999 % 256) as u8]);
    // 304 keeps the validators and cache-control, has no body.
    let a = get(&s, "GET", "/seg.m4s", &[(b"if-none-match", etag.as_bytes())]);
    assert_eq!((a.status, a.body.is_none()), (304, true));
    assert_eq!((header(&a, "etag"), header(&a, "last-modified")), (Some(etag.as_str()), Some(lm.as_str())));
    assert!(header(&a, "cache-control").is_some());
    let a = get(&s, "GET", "/seg.m4s", &[(b"if-modified-since", lm.as_bytes())]);
    assert_eq!(a.status, 304);
    // 416 names the length.
    let a = get(&s, "GET", "/seg.m4s", &[(b"range", b"bytes=1000-")]);
    assert_eq!((a.status, header(&a, "content-range")), (416, Some("bytes */1000")));
    let a = get(&s, "GET", "/empty.txt", &[(b"range", b"bytes=0-")]);
    assert_eq!((a.status, header(&a, "content-range")), (416, Some("bytes */0")));
    let a = get(&s, "GET", "/empty.txt", &[(b"range", b"bytes=-1")]);
    assert_eq!((a.status, header(&a, "content-length"), a.body.is_none()), (200, Some("0"), true));
    // Refusals.
    assert_eq!(get(&s, "POST", "/", &[]).status, 405);
    assert_eq!(get(&s, "GET", "/a%00b", &[]).status, 400);
    assert_eq!(get(&s, "GET", "/%2e%2e/x", &[]).status, 403);
    assert_eq!(get(&s, "GET", "/nope", &[]).status, 404);
    let a = get(&s, "GET", "/seg.m4s", &[(b"if-match", b"\"other\"")]);
    assert_eq!(a.status, 412);
    let c = s.counters();
    assert_eq!(c.requests, 18);
    assert_eq!(c.by_class, [0, 7, 4, 7, 0]);
    assert_eq!((c.ok, c.partial, c.not_modified, c.redirects), (5, 2, 2, 2));
    assert_eq!((c.bad_request, c.forbidden, c.not_found, c.method_not_allowed), (1, 1, 1, 1));
    assert_eq!((c.precondition_failed, c.range_not_satisfiable), (1, 2));
}

#[test]
fn access_log_lines() {
    let d = std::env::temp_dir().join(format!("udpx-h3-log-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let _d = Dir(d.clone());
    let log = d.join("access.log");
    let (_dir, s) = site(&SiteOptions { access_log: Some(log.clone()), ..SiteOptions::default() });
    let e = LogEntry {
        peer: "127.0.0.1:5555".parse().unwrap(),
        method: "GET",
        path: "/a \"b\"\n",
        status: 206,
        bytes: 10,
        duration: Duration::from_micros(1500),
        protocol: "h3",
        complete: true,
    };
    s.finished(&e);
    s.finished(&LogEntry { complete: false, protocol: "h2", ..e.clone() });
    s.flush_log().unwrap(); // (written by the log's own thread)
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].ends_with(" 127.0.0.1:5555 GET \"/a \\\"b\\\"\\n\" 206 10 1.500ms h3"), "{}", lines[0]);
    assert!(lines[1].ends_with(" h2 incomplete"), "{}", lines[1]);
    assert_eq!((s.counters().body_bytes, s.counters().incomplete), (20, 1));
    let bad = Site::new(&d, &SiteOptions { cache_control: "a\nb".into(), ..SiteOptions::default() });
    assert!(bad.unwrap_err().to_string().contains("printable ASCII"));
}

#[test]
fn slash_locations_are_safe_in_a_header_and_stay_on_this_host() {
    for (target, location) in [
        ("/docs", "/docs/"),
        ("/docs?x=1&y=2", "/docs/?x=1&y=2"),
        ("//evil.example", "/evil.example/"),
        ("///evil.example?q", "/evil.example/?q"),
        ("/a b", "/a%20b/"),
        ("/a\r\nb", "/a%0D%0Ab/"),
        ("/d?q=\"<x>\"", "/d/?q=%22%3Cx%3E%22"),
        ("/caf\u{e9}", "/caf%C3%A9/"),
        ("/d?a?b", "/d/?a?b"),
        ("/%2e%2e", "/%2e%2e/"),
    ] {
        let l = slash_location(target);
        assert_eq!(l, location, "{target:?}");
        assert!(l.bytes().all(|b| b.is_ascii_graphic()), "{target:?} -> {l:?}");
        assert!(!l.starts_with("//"), "{target:?} -> {l:?}");
    }
}

/// `--cors`: every answer to an allowed origin names it (files, ranges, 304, errors, the
/// refusals), preflights are answered, and without it nothing changes.
#[test]
fn cors_headers_on_every_answer_to_an_allowed_origin() {
    let cors = crate::cors::Cors::parse(&["https://player.example".into()]).unwrap();
    let (_d, s) = site(&SiteOptions { cors, ..SiteOptions::default() });
    let from: &[(&[u8], &[u8])] = &[(b"origin", b"https://player.example")];
    let ranged: &[(&[u8], &[u8])] = &[(b"origin", b"https://player.example"), (b"range", b"bytes=10-19")];
    let etag = header(&get(&s, "GET", "/seg.m4s", &[]), "etag").unwrap().to_string();
    let cond: &[(&[u8], &[u8])] = &[(b"origin", b"https://player.example"), (b"if-none-match", etag.as_bytes())];
    for (method, path, h, status) in [
        ("GET", "/seg.m4s", from, 200),
        ("GET", "/seg.m4s", ranged, 206),
        ("HEAD", "/seg.m4s", from, 200),
        ("GET", "/seg.m4s", cond, 304),
        ("GET", "/nope", from, 404),
        ("POST", "/", from, 405),
    ] {
        let a = get(&s, method, path, h);
        assert_eq!(a.status, status, "{method} {path}");
        assert_eq!(header(&a, "access-control-allow-origin"), Some("https://player.example"), "{method} {path}");
        assert_eq!(header(&a, "vary"), Some("origin"), "{method} {path}");
        assert!(header(&a, "access-control-expose-headers").is_some_and(|v| v.contains("content-range")));
    }
    assert_eq!(header(&get(&s, "POST", "/", from), "allow"), Some("GET, HEAD, OPTIONS"));
    let refused = s.refuse(503, from);
    assert_eq!(header(&refused, "access-control-allow-origin"), Some("https://player.example"));
    // Another origin: no allow-origin, the answer still varies by origin.
    let other = get(&s, "GET", "/seg.m4s", &[(b"origin", b"https://evil.example")]);
    assert_eq!((other.status, header(&other, "access-control-allow-origin")), (200, None));
    assert_eq!(header(&other, "vary"), Some("origin"));
    // Preflights.
    let pre: &[(&[u8], &[u8])] = &[
        (b"origin", b"https://player.example"),
        (b"access-control-request-method", b"GET"),
        (b"access-control-request-headers", b"range"),
    ];
    let a = get(&s, "OPTIONS", "/seg.m4s", pre);
    assert_eq!((a.status, header(&a, "access-control-allow-headers")), (204, Some("range")));
    assert_eq!(header(&a, "access-control-allow-origin"), Some("https://player.example"));
    let bad: &[(&[u8], &[u8])] = &[(b"origin", b"https://evil.example"), (b"access-control-request-method", b"GET")];
    assert_eq!(get(&s, "OPTIONS", "/seg.m4s", bad).status, 403);
    let plain = get(&s, "OPTIONS", "/", &[]);
    assert_eq!((plain.status, header(&plain, "allow")), (204, Some("GET, HEAD, OPTIONS")));
    // Off: OPTIONS is any other method, and no CORS header anywhere.
    let (_d2, off) = site(&SiteOptions::default());
    assert_eq!(get(&off, "OPTIONS", "/seg.m4s", pre).status, 405);
    let a = get(&off, "GET", "/seg.m4s", from);
    assert!(a.headers.iter().all(|(n, _)| !n.starts_with("access-control") && *n != "vary"), "{:?}", a.headers);
}
