//! Headless Chromium, the first real client: a page served by `udpx_h3::serve` fetches a
//! 10 MB + 1 file, three ranges of it and a conditional request over HTTP/3, hashes the
//! bodies with `crypto.subtle.digest` and writes what it saw into the DOM, which
//! `--dump-dom` prints; and the same browser, starting over HTTPS on TCP (`alt_svc_tcp`),
//! follows `Alt-Svc` to HTTP/3 by itself.
//!
//! What Chromium needs (found by trying, Chromium 156, Debian's build):
//! - The certificate is made here and pinned with `--ignore-certificate-errors-spki-list`
//!   (base64 of the SHA-256 of its SubjectPublicKeyInfo).
//! - HTTP/3 from the first request: `--origin-to-force-quic-on=127.0.0.1:PORT`.
//! - Alt-Svc: Chromium follows it to QUIC for a certificate that is not publicly trusted only
//!   on hosts named in `--origin-to-force-quic-on`. With the pin alone, ten fetches after the
//!   page all stayed on h2 though every answer carried `alt-svc`. Naming the host with a port
//!   nothing listens on (`127.0.0.1:1`) exempts the host without forcing QUIC on the real
//!   port: then the first or second fetch after the page goes over h3 (it varies by run: the
//!   QUIC connection races the open h2 one).
//! - A fresh profile (`--user-data-dir`, HOME pointed into it too), no sandbox (tests may run
//!   as root), no crash reporter, and no background networking: this machine has no
//!   internet, and those requests would only fail and add noise.
//! - `--virtual-time-budget` makes `--dump-dom` wait for the page's fetches (virtual time
//!   stands still while a fetch is pending), so no sleep is needed: a run takes 1-2 s.
//!
//! Chromium's helper processes can outlive the browser by seconds: it runs in a process
//! group of its own, bounded in time, and the group is killed and waited for on every path
//! out of a test (a guard's `Drop`, also while a failed assertion unwinds). The test process
//! is a child subreaper, so orphaned helpers become its children and their zombies are
//! reaped here, not seconds later by init: `pgrep chromium` is empty when a test returns.
//! Without Chromium the tests print `SKIP` and record it (`UDPX_SKIP_LOG`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{content, TempDir, BIG};
use nix::sys::prctl::set_child_subreaper;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use udpx_h3::{serve, ServeConfig, Tls};
use udpx_lab::netns::{record_skip, ChildGroup};

/// How long one Chromium run may take (a cold start on a slow 2-core VM takes seconds).
const DEADLINE: Duration = Duration::from_secs(90);

/// How long the group's other processes get to go after the leader is reaped.
const GROUP_GONE: Duration = Duration::from_secs(30);

fn chromium() -> Option<PathBuf> {
    udpx_lab::browser::find()
}

/// A certificate for 127.0.0.1 written as PEM into `dir`, and its SPKI pin.
fn certificate(dir: &Path) -> (Tls, String) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let spki = ck.key_pair.public_key_der();
    let pin = base64::engine::general_purpose::STANDARD.encode(ring::digest::digest(&ring::digest::SHA256, &spki));
    (Tls::Files { cert, key }, pin)
}

fn sha256_hex(b: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, b).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The processes of process group `pgid`, zombies included.
fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
            let pgrp = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(2)?.parse::<i32>().ok());
            pgrp == Some(pgid)
        })
        .collect()
}

/// Chromium running in its own process group. Dropping it kills the group with SIGKILL,
/// reaps the leader and waits until no process of the group is left.
struct Browser {
    group: Option<ChildGroup>,
    pgid: i32,
}

impl Browser {
    fn spawn(cmd: &mut Command) -> Browser {
        // Chromium's helpers, orphaned when the browser is killed, are re-parented to this
        // process rather than to init, so the guard can reap them and know they are gone.
        set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
        let group = ChildGroup::spawn(cmd).expect("spawn chromium");
        let pgid = group.id() as i32;
        Browser { group: Some(group), pgid }
    }

    /// Whether the leader has exited (a zombie or gone).
    fn exited(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pgid)).unwrap_or_default();
        matches!(stat.rsplit(')').next().unwrap_or("").trim_start().chars().next(), Some('Z') | None)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        drop(self.group.take()); // SIGKILL to the group, the leader reaped
        let start = Instant::now();
        loop {
            let left = group_members(self.pgid);
            if left.is_empty() {
                return;
            }
            // Stragglers forked while the kill went out get it again (the group's id cannot
            // have been reused while processes of the group are there); orphans came to us
            // (a subreaper), so their zombies are ours to reap.
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
            for pid in left.iter() {
                let _ = waitpid(Pid::from_raw(*pid), Some(WaitPidFlag::WNOHANG));
            }
            if start.elapsed() > GROUP_GONE {
                eprintln!("chromium group {}: processes {left:?} still there after {GROUP_GONE:?}", self.pgid);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What one run printed.
struct Run {
    dom: String,
    stderr: String,
}

/// Runs Chromium headless on `url` with `extra` flags, its profile under `tmp`, until it
/// exits (it does once `--dump-dom` printed) or [`DEADLINE`] passes (then the test fails).
fn run_chromium(chromium: &Path, tmp: &Path, extra: &[String], url: &str) -> Run {
    let (out, err) = (tmp.join("dom.html"), tmp.join("chromium.log"));
    let mut cmd = Command::new(chromium);
    udpx_lab::browser::headless(&mut cmd, tmp);
    cmd.args(extra)
        .args(["--virtual-time-budget=60000", "--dump-dom", url])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let browser = Browser::spawn(&mut cmd);
    let start = Instant::now();
    while !browser.exited() {
        if start.elapsed() > DEADLINE {
            let stderr = std::fs::read_to_string(&err).unwrap_or_default();
            drop(browser);
            panic!("chromium still running after {DEADLINE:?}; its log ends:\n{}", tail(&stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("chromium ran {:.1} s", start.elapsed().as_secs_f64());
    drop(browser);
    Run {
        dom: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The JSON the page wrote into `<pre id="result">`.
fn result(run: &Run) -> serde_json::Value {
    let text = run
        .dom
        .split_once("<pre id=\"result\">")
        .and_then(|(_, r)| r.split_once("</pre>"))
        .map(|(j, _)| j.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&"))
        .unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!("no result in the page ({e}); the DOM:\n{}\nchromium's log ends:\n{}", run.dom, tail(&run.stderr))
    })
}

/// The page of the HTTP/3 test: fetches, hashes, reports.
const FETCH_PAGE: &str = r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>udpx-h3</title></head><body>
<pre id="result">pending</pre>
<script>
async function hex(buf) {
  const d = new Uint8Array(await crypto.subtle.digest('SHA-256', buf));
  return Array.from(d, b => b.toString(16).padStart(2, '0')).join('');
}
async function get(url, headers) {
  const r = await fetch(url, {cache: 'no-store', headers: headers || {}});
  const body = await r.arrayBuffer();
  return {url: r.url, status: r.status, len: body.byteLength, sha256: await hex(body),
          etag: r.headers.get('etag'), content_range: r.headers.get('content-range')};
}
(async () => {
  const res = {steps: {}};
  try {
    const s = res.steps;
    s.whole = await get('/big.bin?whole');
    s.start = await get('/big.bin?start', {'range': 'bytes=0-99999'});
    s.middle = await get('/big.bin?middle', {'range': 'bytes=5000000-5065535'});
    s.end = await get('/big.bin?end', {'range': 'bytes=9999000-10000099'});
    s.cond = await get('/big.bin?cond', {'if-none-match': s.whole.etag || '"none"'});
  } catch (e) {
    res.error = String(e);
  }
  res.navigation = performance.getEntriesByType('navigation').map(e => e.nextHopProtocol);
  for (const [k, v] of Object.entries(res.steps)) {
    v.protocol = performance.getEntriesByName(v.url).map(e => e.nextHopProtocol);
  }
  document.getElementById('result').textContent = JSON.stringify(res);
})();
</script></body></html>
"#;

#[test]
fn chromium_fetches_over_http3() {
    let Some(chromium) = chromium() else {
        record_skip("chromium_fetches_over_http3", "chromium not installed (scripts/setup.sh installs it)");
        return;
    };
    let tmp = TempDir::new("browser-h3");
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let big = content(BIG, 7);
    std::fs::write(www.join("big.bin"), &big).unwrap();
    std::fs::write(www.join("index.html"), FETCH_PAGE).unwrap();
    let (tls, pin) = certificate(tmp.path());
    let log = tmp.path().join("access.log");
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = tls;
    cfg.site.access_log = Some(log.clone());
    let server = serve(&www, &cfg).expect("server starts");
    let port = server.local_addr().port();
    let run = run_chromium(
        &chromium,
        tmp.path(),
        &[
            format!("--origin-to-force-quic-on=127.0.0.1:{port}"),
            format!("--ignore-certificate-errors-spki-list={pin}"),
        ],
        &format!("https://127.0.0.1:{port}/"),
    );
    let counters = server.stop().unwrap();
    eprintln!("server counters: {counters:?}");
    let r = result(&run);
    eprintln!("page result: {r}");
    let steps = &r["steps"];
    let want = [
        ("whole", 200, &big[..]),
        ("start", 206, &big[..100_000]),
        ("middle", 206, &big[5_000_000..5_065_536]),
        ("end", 206, &big[9_999_000..]),
        ("cond", 304, &[][..]),
    ];
    for (name, status, bytes) in want {
        let s = &steps[name];
        assert_eq!(s["status"], status, "{name}: {s}");
        assert_eq!(s["len"], bytes.len(), "{name}: {s}");
        assert_eq!(s["sha256"], sha256_hex(bytes), "{name}: {s}");
        assert_eq!(s["protocol"], serde_json::json!(["h3"]), "{name}: {s}");
    }
    assert_eq!(r["navigation"], serde_json::json!(["h3"]), "{r}");
    let arrived = access_log(&log); // (written whole: stop flushed it)
    eprintln!("arrived: {arrived:?}");
    for target in ["/", "/big.bin?whole", "/big.bin?start", "/big.bin?middle", "/big.bin?end", "/big.bin?cond"] {
        assert!(arrived.iter().any(|(t, p)| t == target && p == "h3"), "{target} did not arrive over h3: {arrived:?}");
    }
    // Chromium may ask for /favicon.ico too (404), and may open a second connection.
    let h = &counters.http;
    assert!(counters.quic.connections >= 1, "{counters:?}");
    assert_eq!((h.partial, h.not_modified), (3, 1), "{h:?}");
    assert!(h.ok >= 2 && h.requests >= 6 && h.incomplete == 0, "{h:?}");
}

/// (request target, protocol) of each line of the access log.
fn access_log(path: &Path) -> Vec<(String, String)> {
    // time peer method "target" status bytes duration protocol [incomplete]
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.contains(" CONNECTION h3 ")) // a connection's close line
        .filter_map(|l| {
            let (_, rest) = l.split_once('"')?;
            let (target, rest) = rest.split_once('"')?;
            let protocol = rest.split_whitespace().nth(3)?;
            Some((target.to_string(), protocol.to_string()))
        })
        .collect()
}

/// The page of the discovery test: loaded over TCP, it fetches a 1 MiB file until a fetch
/// goes over HTTP/3 (at most 10 times, one after the other). Chromium opens the QUIC
/// connection beside the h2 one once it has seen `alt-svc`, and moves when it is up; virtual
/// time gives the page no way to wait in real time, so each fetch is large enough to take
/// a few milliseconds even on loopback: ten of them outlast a QUIC handshake on a busy
/// machine.
const DISCOVERY_PAGE: &str = r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>udpx-h3 discovery</title></head><body>
<pre id="result">pending</pre>
<script>
(async () => {
  const res = {navigation: performance.getEntriesByType('navigation').map(e => e.nextHopProtocol), fetches: []};
  try {
    for (let i = 1; i <= 10; i++) {
      const r = await fetch('/small.bin?n=' + i, {cache: 'no-store'});
      const body = await r.arrayBuffer();
      const d = new Uint8Array(await crypto.subtle.digest('SHA-256', body));
      const sha256 = Array.from(d, b => b.toString(16).padStart(2, '0')).join('');
      const p = performance.getEntriesByName(r.url).map(e => e.nextHopProtocol);
      res.fetches.push({n: i, status: r.status, sha256: sha256, protocol: p});
      if (p.includes('h3')) break;
    }
  } catch (e) {
    res.error = String(e);
  }
  document.getElementById('result').textContent = JSON.stringify(res);
})();
</script></body></html>
"#;

#[test]
fn chromium_finds_http3_through_alt_svc() {
    let Some(chromium) = chromium() else {
        record_skip("chromium_finds_http3_through_alt_svc", "chromium not installed (scripts/setup.sh installs it)");
        return;
    };
    let tmp = TempDir::new("browser-altsvc");
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let small = content(1 << 20, 8);
    std::fs::write(www.join("small.bin"), &small).unwrap();
    std::fs::write(www.join("index.html"), DISCOVERY_PAGE).unwrap();
    let (tls, pin) = certificate(tmp.path());
    let log = tmp.path().join("access.log");
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = tls;
    cfg.site.access_log = Some(log.clone());
    cfg.alt_svc_tcp = Some("127.0.0.1:0".parse().unwrap());
    let server = serve(&www, &cfg).expect("server starts");
    let quic_port = server.local_addr().port();
    let tcp_port = server.tcp_addr().expect("the TCP listener runs").port();
    eprintln!("QUIC on udp/{quic_port}, HTTPS on tcp/{tcp_port}");
    let run = run_chromium(
        &chromium,
        tmp.path(),
        &["--origin-to-force-quic-on=127.0.0.1:1".to_string(), format!("--ignore-certificate-errors-spki-list={pin}")],
        &format!("https://127.0.0.1:{tcp_port}/"),
    );
    let counters = server.stop().unwrap();
    eprintln!("server counters: {counters:?}");
    let r = result(&run);
    eprintln!("page result: {r}");
    assert_eq!(r["navigation"], serde_json::json!(["h2"]), "the page did not come over TCP: {r}");
    let fetches = r["fetches"].as_array().expect("fetches");
    let sha = sha256_hex(&small);
    assert!(fetches.iter().all(|f| f["status"] == 200 && f["sha256"] == sha.as_str()), "{r}");
    // What arrived where, in order: the server's access log is the record.
    let arrived = access_log(&log); // (written whole: stop flushed it)
    let story: Vec<String> = arrived
        .iter()
        .filter(|(t, _)| t != "/favicon.ico")
        .enumerate()
        .map(|(i, (t, p))| format!("request {} {t} {p}", i + 1))
        .collect();
    println!("discovery: {}", story.join(", "));
    assert_eq!(arrived.first().map(|(t, p)| (t.as_str(), p.as_str())), Some(("/", "h2")), "{arrived:?}");
    assert!(
        fetches.last().is_some_and(|f| f["protocol"] == serde_json::json!(["h3"])),
        "Alt-Svc not followed in {} fetches: {r}",
        fetches.len()
    );
    let last = format!("/small.bin?n={}", fetches.len());
    assert!(arrived.iter().any(|(t, p)| *t == last && p == "h3"), "{last} did not arrive over h3: {arrived:?}");
    assert!(counters.quic.connections >= 1, "no QUIC connection: {counters:?}");
}

/// Issue 48: a page on one origin (server A) reads a segment and a range from another (server
/// B, `--cors` naming A's origin) over HTTP/3 and over HTTP/2 (B's HTTPS-over-TCP listener),
/// one of them with a header that needs a preflight: byte-exact, and B's access log holds the
/// preflight.
#[test]
fn chromium_on_another_origin_reads_a_segment_and_a_range_with_cors() {
    let Some(chromium) = chromium() else {
        record_skip("chromium_on_another_origin_reads", "chromium not installed (scripts/setup.sh installs it)");
        return;
    };
    let tmp = TempDir::new("browser-cors");
    let (www_a, www_b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&www_a).unwrap();
    std::fs::create_dir_all(&www_b).unwrap();
    let seg = content(300_000, 11);
    std::fs::write(www_b.join("seg.m4s"), &seg).unwrap();
    let (tls, pin) = certificate(tmp.path());
    let mut cfg_a = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg_a.tls = tls.clone();
    let a = serve(&www_a, &cfg_a).expect("server A starts");
    let port_a = a.local_addr().port();
    let log_b = tmp.path().join("b-access.log");
    let mut cfg_b = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg_b.tls = tls;
    cfg_b.alt_svc_tcp = Some("127.0.0.1:0".parse().unwrap());
    cfg_b.site.access_log = Some(log_b.clone());
    cfg_b.site.cors = udpx_h3::cors::Cors::parse(&[format!("https://127.0.0.1:{port_a}")]).unwrap();
    let b = serve(&www_b, &cfg_b).expect("server B starts");
    let (quic_b, tcp_b) = (b.local_addr().port(), b.tcp_addr().unwrap().port());
    let page = format!(
        r#"<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><pre id="result">pending</pre><script>
async function hex(buf) {{
  const d = new Uint8Array(await crypto.subtle.digest('SHA-256', buf));
  return Array.from(d, b => b.toString(16).padStart(2, '0')).join('');
}}
async function get(url, headers) {{
  const r = await fetch(url, {{cache: 'no-store', headers: headers || {{}}}});
  const body = await r.arrayBuffer();
  return {{url: r.url, status: r.status, len: body.byteLength, sha256: await hex(body),
          content_range: r.headers.get('content-range')}};
}}
(async () => {{
  const res = {{steps: {{}}}};
  try {{
    const s = res.steps;
    s.h3_whole = await get('https://127.0.0.1:{quic_b}/seg.m4s?h3');
    s.h3_range = await get('https://127.0.0.1:{quic_b}/seg.m4s?h3r', {{'range': 'bytes=1000-1999', 'if-none-match': '"x"'}});
    s.h2_range = await get('https://127.0.0.1:{tcp_b}/seg.m4s?h2r', {{'range': 'bytes=1000-1999'}});
    s.h2_whole = await get('https://127.0.0.1:{tcp_b}/seg.m4s?h2');
  }} catch (e) {{ res.error = String(e); }}
  for (const [k, v] of Object.entries(res.steps)) {{
    v.protocol = performance.getEntriesByName(v.url).map(e => e.nextHopProtocol);
  }}
  document.getElementById('result').textContent = JSON.stringify(res);
}})();
</script></body></html>
"#
    );
    std::fs::write(www_a.join("index.html"), page).unwrap();
    let run = run_chromium(
        &chromium,
        tmp.path(),
        &[
            format!("--origin-to-force-quic-on=127.0.0.1:{port_a},127.0.0.1:{quic_b}"),
            format!("--ignore-certificate-errors-spki-list={pin}"),
        ],
        &format!("https://127.0.0.1:{port_a}/"),
    );
    let _ = a.stop();
    let counters_b = b.stop().unwrap();
    let r = result(&run);
    eprintln!("page result: {r}\nB: {counters_b:?}");
    assert!(r.get("error").is_none(), "a cross-origin fetch failed: {r}");
    let steps = &r["steps"];
    // (The page cannot see the protocol of another origin's fetch without Timing-Allow-Origin:
    // B's access log says it.)
    let arrived = access_log(&log_b);
    for (name, status, bytes, target, protocol) in [
        ("h3_whole", 200, &seg[..], "/seg.m4s?h3", "h3"),
        ("h3_range", 206, &seg[1000..2000], "/seg.m4s?h3r", "h3"),
        ("h2_range", 206, &seg[1000..2000], "/seg.m4s?h2r", "h2"),
        // The TCP listener's answer named HTTP/3 (alt-svc): Chromium may move to it by now.
        ("h2_whole", 200, &seg[..], "/seg.m4s?h2", "h2 or h3"),
    ] {
        let s = &steps[name];
        assert_eq!(s["status"], status, "{name}: {s}");
        assert_eq!(s["sha256"], sha256_hex(bytes), "{name}: {s}");
        let over = |p: &str| protocol.split(" or ").any(|x| x == p);
        assert!(arrived.iter().any(|(t, p)| t == target && over(p)), "{name} over {protocol}: {arrived:?}");
    }
    assert_eq!(steps["h3_range"]["content_range"], "bytes 1000-1999/300000", "exposed to the page");
    let log = std::fs::read_to_string(&log_b).unwrap();
    assert!(log.lines().any(|l| l.contains(" OPTIONS \"/seg.m4s?h3r\" 204 ")), "the preflight: {log}");
    assert_eq!((counters_b.http.no_content, counters_b.http.server_error), (1, 0), "{:?}", counters_b.http);
}
