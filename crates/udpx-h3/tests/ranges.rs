//! What a video player and a browser send, through a real HTTP/3 client (quiche's, in
//! `udpx_h3::get`) against the server on loopback: byte ranges (206 byte-exact at the start,
//! middle and end and across the last byte; 416; invalid ranges ignored), conditional
//! requests (304 with its validators; If-Range that does not match gives the whole file),
//! HEAD, index.html and the directory redirect, and bad input (`bytes=-0`, a start past 2^63,
//! garbage header fields, `%00`) answered with the right status while the server keeps
//! serving. Every response is in the access log, counted by status class.

mod common;

use common::{digest, Site, TempDir, BIG};
use udpx_h3::{get, serve, GetConfig, GetReport, ServeConfig, SiteOptions};

struct Fixture {
    site: Site,
    log: TempDir,
    server: udpx_h3::H3Server,
}

fn fixture() -> Fixture {
    let site = Site::new("ranges");
    std::fs::write(site.root.join("sub/index.html"), b"<p>sub</p>").unwrap();
    std::fs::write(site.root.join("index.html"), b"<p>home</p>").unwrap();
    let log = TempDir::new("ranges-log");
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.quic.shards = 1;
    cfg.site = SiteOptions { access_log: Some(log.path().join("access.log")), ..SiteOptions::default() };
    let server = serve(&site.root, &cfg).expect("server starts");
    Fixture { site, log, server }
}

impl Fixture {
    /// GETs `path` with `headers`; the body into a file, returned with the report.
    fn fetch(&self, path: &str, headers: &[(&str, &str)]) -> (GetReport, Vec<u8>) {
        self.request(path, headers, false)
    }

    fn request(&self, path: &str, headers: &[(&str, &str)], head: bool) -> (GetReport, Vec<u8>) {
        let out = TempDir::new("ranges-out");
        let dst = out.path().join("body");
        let cfg = GetConfig {
            head,
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            ..GetConfig::default()
        };
        let url = format!("https://127.0.0.1:{}{path}", self.server.local_addr().port());
        let r = get(&url, Some(&dst), &cfg).unwrap_or_else(|e| panic!("{path} {headers:?}: {e}"));
        let body = std::fs::read(&dst).unwrap();
        assert_eq!(r.bytes, body.len() as u64);
        if let Some(cl) = header(&r, "content-length") {
            if !head && r.status != 304 {
                assert_eq!(cl, body.len().to_string(), "{path} {headers:?}: content-length and body agree");
            }
        }
        (r, body)
    }
}

fn header<'a>(r: &'a GetReport, name: &str) -> Option<&'a str> {
    r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// Ranges of `/big` (whose bytes are `big`) and `/small`: satisfiable, unsatisfiable, invalid.
fn ranges(f: &Fixture, big: &[u8]) {
    let len = BIG as u64;
    // Ranges: start, middle, end (suffix), across the last byte.
    for (range, start, end) in [
        ("bytes=0-999", 0, 999),
        ("bytes=5000000-5065535", 5_000_000, 5_065_535),
        ("bytes=-1000", len - 1000, len - 1),
        ("bytes=9999990-10000100", 9_999_990, len - 1),
        ("bytes=9000000-", 9_000_000, len - 1),
    ] {
        let (r, body) = f.fetch("/big", &[("range", range)]);
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(header(&r, "content-range"), Some(format!("bytes {start}-{end}/{len}").as_str()), "{range}");
        assert_eq!(digest(&body), digest(&big[start as usize..=end as usize]), "{range}: bytes differ");
    }
    // A suffix longer than the file: all of it, as a 206.
    let (r, body) = f.fetch("/small", &[("range", "bytes=-5000")]);
    assert_eq!((r.status, header(&r, "content-range")), (206, Some("bytes 0-1023/1024")));
    assert_eq!(body, f.site.file("small"));

    // Unsatisfiable: 416 naming the length, no body.
    for (path, range, total) in [
        ("/big", "bytes=10000001-", len),
        ("/big", "bytes=-0", len),
        ("/big", "bytes=9223372036854775808-", len),
        ("/big", "bytes=99999999999999999999999999-", len),
        ("/empty", "bytes=0-", 0),
    ] {
        let (r, body) = f.fetch(path, &[("range", range)]);
        assert_eq!(r.status, 416, "{path} {range}");
        assert_eq!(header(&r, "content-range"), Some(format!("bytes */{total}").as_str()));
        assert!(body.is_empty());
    }
    // Invalid or several ranges: the whole file, never a wrong body.
    for range in ["bytes=9-3", "bytes=0-1,5-6", "bytes=abc", "lines=1-2"] {
        let (r, body) = f.fetch("/small", &[("range", range)]);
        assert_eq!((r.status, body.as_slice()), (200, f.site.file("small").as_slice()), "{range}");
    }
}

/// Validators, conditional requests and HEAD.
fn conditionals(f: &Fixture) {
    // Validators and conditional requests.
    let (r, body) = f.fetch("/small", &[]);
    assert_eq!((r.status, body.len()), (200, 1024));
    assert_eq!(header(&r, "accept-ranges"), Some("bytes"));
    assert_eq!(header(&r, "content-type"), Some("application/octet-stream"));
    let alt = format!("h3=\":{}\"; ma=86400", f.server.local_addr().port());
    assert_eq!(header(&r, "alt-svc"), Some(alt.as_str()));
    let etag = header(&r, "etag").expect("etag").to_string();
    let lm = header(&r, "last-modified").expect("last-modified").to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "a strong tag: {etag}");
    for cond in [
        vec![("if-none-match", etag.as_str())],
        vec![("if-none-match", &*format!("\"nope\", W/{etag}"))],
        vec![("if-modified-since", lm.as_str())],
        vec![("if-none-match", etag.as_str()), ("range", "bytes=0-9")],
    ] {
        let (r, body) = f.fetch("/small", &cond);
        assert_eq!(r.status, 304, "{cond:?}");
        assert!(body.is_empty());
        assert_eq!(header(&r, "etag"), Some(etag.as_str()));
        assert_eq!(header(&r, "last-modified"), Some(lm.as_str()));
        assert_eq!(header(&r, "cache-control"), Some("no-cache"));
    }
    let (r, _) = f.fetch("/small", &[("if-none-match", "\"other\""), ("if-modified-since", lm.as_str())]);
    assert_eq!(r.status, 200, "If-None-Match that does not match wins over If-Modified-Since");
    let (r, _) = f.fetch("/small", &[("if-match", "\"other\"")]);
    assert_eq!(r.status, 412);
    let (r, body) = f.fetch("/small", &[("range", "bytes=10-19"), ("if-range", etag.as_str())]);
    assert_eq!((r.status, body.as_slice()), (206, &f.site.file("small")[10..20]));
    let (r, body) = f.fetch("/small", &[("range", "bytes=10-19"), ("if-range", "\"an-older-version\"")]);
    assert_eq!((r.status, body.len()), (200, 1024), "If-Range mismatch: the whole current file");

    // HEAD: the whole file's fields, no body, Range ignored.
    let (r, body) = f.request("/big", &[("range", "bytes=0-9")], true);
    assert_eq!((r.status, header(&r, "content-length"), body.len()), (200, Some("10000001"), 0));
}

#[test]
fn ranges_conditionals_and_bad_input() {
    let f = fixture();
    let big = f.site.file("big");
    assert!(f.server.local_addr().port() > 0);

    ranges(&f, &big);
    conditionals(&f);

    // index.html and the directory redirect.
    let (r, body) = f.fetch("/", &[]);
    assert_eq!((r.status, header(&r, "content-type"), body.as_slice()), (200, Some("text/html"), &b"<p>home</p>"[..]));
    let (r, _) = f.fetch("/sub?x=1", &[]);
    assert_eq!((r.status, header(&r, "location")), (301, Some("/sub/?x=1")));
    let (_, body) = f.fetch("/sub/", &[]);
    assert_eq!(body, b"<p>sub</p>");

    // Bad input: the right status, and the server goes on serving.
    let long = "x".repeat(8000);
    for (path, headers, status) in [
        ("/a%00b", vec![], 400),
        ("/small%00.html", vec![], 400),
        ("/%zz", vec![], 400),
        ("/../secret", vec![], 403),
        ("/small", vec![("range", "bytes=\u{7f}\u{1}-")], 200),
        ("/small", vec![("if-modified-since", "not a date at all")], 200),
        ("/small", vec![("if-none-match", "\"unterminated")], 200),
        ("/small", vec![("if-range", "garbage"), ("range", "bytes=0-0")], 200),
        ("/small", vec![("x-long", long.as_str()), ("range", long.as_str())], 200),
    ] {
        let (r, _) = f.fetch(path, &headers);
        assert_eq!(r.status, status, "{path}");
    }
    let (r, body) = f.fetch("/big", &[]);
    assert_eq!((r.status, digest(&body)), (200, digest(&big)), "still serving");

    // The metrics endpoint: responses by status class, the sockets' and hosts' counters.
    let m = f.server.serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
    let text = udpx_metrics::scrape(m.local_addr()).unwrap();
    let now = f.server.counters().http;
    for (name, value) in [
        ("http_requests_total", now.requests),
        ("http_responses_2xx_total", now.by_class[1]),
        ("http_responses_3xx_total", now.by_class[2]),
        ("http_responses_4xx_total", now.by_class[3]),
        ("http_partial_total", 7),
    ] {
        assert!(text.lines().any(|l| l == format!("{name} {value}")), "{name} {value}:\n{text}");
    }
    for family in [
        "udpx_datagrams_received_total{shard=\"0\"}",
        "quic_connections_total{shard=\"0\"}",
        // Admission and address validation: what an operator alerts on under attack.
        "quic_half_open{shard=\"0\"}",
        "quic_refused_per_ip_total{shard=\"0\"}",
        "quic_tokens_invalid_total{shard=\"0\"}",
        "quic_handshake_timeouts_total{shard=\"0\"}",
        "quic_retries_sent_total{shard=\"0\"}",
        "quic_coalesced_total{shard=\"0\"} 0", // off by default,
    ] {
        assert!(text.contains(family), "{family}:\n{text}");
    }
    drop(m);

    let all = f.server.stop().unwrap();
    let c = all.http;
    let text = std::fs::read_to_string(f.log.path().join("access.log")).unwrap();
    // A line per request, and one per connection when it closes (each request here came on a
    // connection of its own).
    let (closes, lines): (Vec<&str>, Vec<&str>) = text.lines().partition(|l| l.contains(" CONNECTION h3 "));
    assert_eq!(lines.len() as u64, c.requests, "one access-log line per request");
    assert_eq!(closes.len() as u64, all.quic.closed, "one line per connection closed");
    assert!(lines.iter().all(|l| l.ends_with(" h3")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains(" GET \"/big\" 206 1000 ")), "{lines:?}");
    assert_eq!(c.by_class.iter().sum::<u64>(), c.requests);
    assert_eq!((c.partial, c.not_modified, c.range_not_satisfiable, c.precondition_failed), (7, 4, 5, 1));
    assert_eq!((c.bad_request, c.forbidden, c.redirects, c.incomplete), (3, 1, 1, 0));
}
