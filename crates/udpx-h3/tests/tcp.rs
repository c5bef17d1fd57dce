//! HTTPS over TCP (`ServeConfig::alt_svc_tcp`), with curl as the client (Debian's curl speaks
//! HTTP/2): the same files by the same rules as HTTP/3, over HTTP/2 and HTTP/1.1, each
//! response carrying `alt-svc` for the QUIC port. Every curl runs in a process group of its
//! own with a deadline, killed on drop. Without curl the tests print `SKIP` and record it.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tls::h2_tls;
use common::{content, TempDir, BIG};
use udpx_h3::tcp::TcpServer;
use udpx_h3::{serve, H3Server, ServeConfig, Site, SiteOptions};
use udpx_lab::netns::{find_in_path, record_skip, ChildGroup};

const DEADLINE: Duration = Duration::from_secs(60);

fn curl_path() -> Option<PathBuf> {
    find_in_path("curl")
}

/// What one curl run got.
#[derive(Debug)]
struct Got {
    /// `%{http_version}`: `2` or `1.1`.
    version: String,
    status: u16,
    /// The response head as received, names in lower case.
    head: String,
    body: Vec<u8>,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            (n.trim() == name).then(|| v.trim())
        })
    }
}

/// Runs curl with `args` and `url` (insecure: the certificate is self-signed), the last
/// transfer's head and body written to files in `dir`; fails the test when curl fails or overruns [`DEADLINE`].
fn curl(curl: &Path, dir: &Path, args: &[&str], url: &str) -> Got {
    let (head, body, log) = (dir.join("head"), dir.join("body"), dir.join("curl.log"));
    let _ = std::fs::remove_file(&body);
    let mut cmd = Command::new(curl);
    // The output options come last, so after a `--next` in `args` they are the last
    // transfer's.
    cmd.args(["-k", "-s", "-S", "--noproxy", "*", "--max-time", "50"])
        .args(args)
        .args(["-w", "%{http_version} %{http_code}", "-D"])
        .arg(&head)
        .arg("-o")
        .arg(&body)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("curl.err")).unwrap());
    let g = ChildGroup::spawn(&mut cmd).expect("spawn curl");
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", g.id())).unwrap_or_default();
        if matches!(stat.rsplit(')').next().unwrap_or("").trim_start().chars().next(), Some('Z') | None) {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "curl {args:?} {url} still running after {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = g.wait().expect("wait for curl");
    let err = std::fs::read_to_string(dir.join("curl.err")).unwrap_or_default();
    assert!(status.success(), "curl {args:?} {url}: {status}: {err}");
    let out = std::fs::read_to_string(&log).unwrap();
    let (version, code) = out.trim().split_once(' ').unwrap_or_default();
    Got {
        version: version.to_string(),
        status: code.parse().unwrap_or(0),
        head: std::fs::read_to_string(&head).unwrap_or_default().to_lowercase(),
        body: std::fs::read(&body).unwrap_or_default(),
    }
}

/// `www/` with `big` (10 MB + 1) and `index.html`, served on QUIC and TCP, the access log in
/// the temp dir.
struct Setup {
    tmp: TempDir,
    big: Vec<u8>,
    server: H3Server,
    tcp: SocketAddr,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let tmp = TempDir::new(tag);
        let www = tmp.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        let big = content(BIG, 11);
        std::fs::write(www.join("big"), &big).unwrap();
        std::fs::write(www.join("index.html"), "<!DOCTYPE html><title>x</title>\n").unwrap();
        let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.alt_svc_tcp = Some("127.0.0.1:0".parse().unwrap());
        cfg.site.access_log = Some(tmp.path().join("access.log"));
        let server = serve(&www, &cfg).expect("server starts");
        let tcp = server.tcp_addr().expect("the TCP listener runs");
        Setup { tmp, big, server, tcp }
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.tcp)
    }

    /// The access log's lines.
    fn log(&self) -> Vec<String> {
        self.server.flush_log().expect("the access log flushed");
        std::fs::read_to_string(self.tmp.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
}

/// The line of the access log for `method "target" status bytes ... protocol`, if any.
fn logged(lines: &[String], method: &str, target: &str, status: u16, bytes: u64, protocol: &str) -> bool {
    let want = format!(" {method} \"{target}\" {status} {bytes} ");
    lines
        .iter()
        .any(|l| l.contains(&want) && l.split_whitespace().nth(7) == Some(protocol) && !l.ends_with("incomplete"))
}

#[test]
fn curl_over_http2_and_http1() {
    let Some(curl_bin) = curl_path() else {
        record_skip("curl_over_http2_and_http1", "curl not installed (scripts/setup.sh installs it)");
        return;
    };
    let s = Setup::new("tcp-curl");
    let quic_port = s.server.local_addr().port();
    let dir = s.tmp.path();
    for (flag, version, protocol) in [("--http2", "2", "h2"), ("--http1.1", "1.1", "http/1.1")] {
        // The whole file, byte-exact, with alt-svc naming the QUIC port.
        let g = curl(&curl_bin, dir, &[flag], &s.url("/big"));
        assert_eq!((g.version.as_str(), g.status), (version, 200), "{flag}: {}", g.head);
        assert!(g.body == s.big, "{flag}: the body differs ({} bytes of {})", g.body.len(), s.big.len());
        let alt = g.header("alt-svc").unwrap_or_else(|| panic!("{flag}: no alt-svc: {}", g.head));
        assert!(alt.starts_with(&format!("h3=\":{quic_port}\"")), "{flag}: alt-svc {alt}");
        assert_eq!(g.header("content-length"), Some(BIG.to_string().as_str()), "{flag}");
        assert!(g.header("etag").is_some() && g.header("last-modified").is_some(), "{flag}: {}", g.head);

        // A range across the last byte: 206, byte-exact.
        let g = curl(&curl_bin, dir, &[flag, "-H", "Range: bytes=9999990-10000100"], &s.url("/big"));
        assert_eq!(g.status, 206, "{flag}: {}", g.head);
        assert_eq!(g.header("content-range"), Some("bytes 9999990-10000000/10000001"), "{flag}");
        assert!(g.body == s.big[9_999_990..], "{flag}: range body differs");

        // A range in the middle.
        let g = curl(&curl_bin, dir, &[flag, "-H", "Range: bytes=4000000-4000099"], &s.url("/big"));
        assert_eq!((g.status, g.body.as_slice()), (206, &s.big[4_000_000..4_000_100]), "{flag}");

        // HEAD: the head of the whole file, no body.
        let g = curl(&curl_bin, dir, &[flag, "-I"], &s.url("/big"));
        assert_eq!(g.status, 200, "{flag}: {}", g.head);
        assert_eq!(g.header("content-length"), Some(BIG.to_string().as_str()), "{flag}: {}", g.head);
        // curl -I writes the head where the body would go: nothing else may be there.
        assert_eq!(String::from_utf8_lossy(&g.body).to_lowercase(), g.head, "{flag}: HEAD got a body");

        // index.html for the directory, and a 404.
        let g = curl(&curl_bin, dir, &[flag], &s.url("/"));
        assert_eq!(g.status, 200, "{flag}");
        assert!(g.header("content-type").is_some_and(|t| t.starts_with("text/html")), "{flag}: {}", g.head);
        assert_eq!(curl(&curl_bin, dir, &[flag], &s.url("/missing")).status, 404, "{flag}");

        let log = s.log();
        assert!(logged(&log, "GET", "/big", 200, BIG as u64, protocol), "{protocol}: {log:#?}");
        assert!(logged(&log, "GET", "/big", 206, 11, protocol), "{protocol}: {log:#?}");
        assert!(logged(&log, "HEAD", "/big", 200, 0, protocol), "{protocol}: {log:#?}");
        assert!(logged(&log, "GET", "/missing", 404, 0, protocol), "{protocol}: {log:#?}");
    }
    // HTTP/1.1 keep-alive: a HEAD and then a GET on the same connection; a body sent after
    // the HEAD would be read as the GET's response and garble it.
    let first = s.url("/big");
    let args = ["--http1.1", "-I", "-o", "/dev/null", &first, "--next", "-k", "--http1.1"];
    let g = curl(&curl_bin, dir, &args, &s.url("/"));
    assert_eq!(g.status, 200);
    assert!(g.body.starts_with(b"<!DOCTYPE html>"), "{:?}", String::from_utf8_lossy(&g.body));

    // The metrics endpoint counts the TCP listener's connections too.
    let m = s.server.serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
    let text = udpx_metrics::scrape(m.local_addr()).unwrap();
    drop(m);
    // A line per TCP connection at its close, as for QUIC's: curl closed each (its FIN
    // first), one request each but the keep-alive pair's two.
    let closed = Instant::now();
    let closes = loop {
        let closes: Vec<String> = s.log().into_iter().filter(|l| l.contains(" CONNECTION ")).collect();
        if closes.len() >= 13 || closed.elapsed() > DEADLINE {
            break closes;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("{}", closes.join("\n"));
    for protocol in ["h2", "http/1.1"] {
        let mine: Vec<&String> = closes.iter().filter(|l| l.contains(&format!(" CONNECTION {protocol} "))).collect();
        assert!(mine.len() >= 6, "{protocol}: a line per connection: {closes:#?}");
        for l in &mine {
            for field in ["closed_by=client", "requests=", "rtt=", "min_rtt=", "sent=", "cc=", "cwnd=", "bytes_sent="] {
                assert!(l.contains(field), "{field} in {l}");
            }
        }
        let most = mine.iter().map(|l| l.split("bytes_sent=").nth(1).unwrap().split(' ').next().unwrap());
        let most = most.map(|b| b.parse::<u64>().unwrap()).max().unwrap();
        assert!(most > BIG as u64, "{protocol}: the big download's connection sent it all ({most})");
    }
    assert!(closes.iter().any(|l| l.contains(" CONNECTION http/1.1 ") && l.contains(" requests=2 ")), "{closes:#?}");
    let c = s.server.stop().unwrap();
    let h = &c.http;
    assert_eq!((h.partial, h.not_found, h.incomplete), (4, 2, 0), "{h:?}");
    assert_eq!(c.quic.connections, 0, "nothing came over QUIC: {c:?}");
    let t = c.tcp.expect("the TCP listener's counters");
    assert!(t.connections >= 2 && t.http2 >= 1, "{t:?}");
    assert!(text.lines().any(|l| l == format!("tcp_connections_total {}", t.connections)), "{text}");
    assert!(text.contains("tcp_http2_connections_total"), "{text}");
}

#[test]
fn garbage_does_not_stop_the_listener() {
    let Some(curl_bin) = curl_path() else {
        record_skip("garbage_does_not_stop_the_listener", "curl not installed (scripts/setup.sh installs it)");
        return;
    };
    // The listener alone, on a Site of its own, so its connection counters can be read.
    let (tmp, server, big, _, site) = hostile_listener("tcp-garbage", udpx_h3::tcp::TcpLimits::default(), BIG);
    let addr = server.local_addr();
    let garbage: [&[u8]; 3] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",        // plain HTTP on the TLS port
        b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00", // a cut ClientHello, then EOF
        &[0xff; 4096],                               // noise
    ];
    for g in garbage {
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(g).unwrap();
        let _ = c.shutdown(std::net::Shutdown::Write);
        // The listener answers with an alert or closes; either way the read ends.
        let _ = std::io::Read::read_to_end(&mut c, &mut Vec::new());
    }
    drop(TcpStream::connect(addr).unwrap()); // connect and close at once
                                             // A client that connects and stays silent holds one connection, not the listener.
    let _silent = TcpStream::connect(addr).unwrap();
    for flag in ["--http2", "--http1.1"] {
        let g = curl(&curl_bin, tmp.path(), &[flag], &format!("https://{addr}/big"));
        assert_eq!(g.status, 200, "{flag}");
        assert!(g.body == big, "{flag}: the body differs");
    }
    assert!(server.is_running());
    let c = server.stop(); // the silent connection is still open: stop ends it
    assert_eq!(c.connections, 7, "{c:?}");
    assert_eq!(c.tls_failed, 4, "three garbage handshakes and the one closed at once: {c:?}");
    assert_eq!(c.http2, 1, "{c:?}");
    assert_eq!(site.counters().ok, 2);
}

#[test]
fn a_tcp_port_in_use_is_a_usage_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tmp = TempDir::new("tcp-inuse");
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.alt_svc_tcp = Some(taken.local_addr().unwrap());
    let e = serve(tmp.path(), &cfg).expect_err("the TCP port is taken");
    assert!(e.is_usage(), "{e}");
    assert!(e.to_string().contains(&taken.local_addr().unwrap().to_string()), "{e}");
}

/// The listener alone with `limits` on a Site of its own: its directory, the server, the big
/// file's bytes, the certificate's PEM path, the Site.
fn hostile_listener(
    tag: &str,
    limits: udpx_h3::tcp::TcpLimits,
    size: usize,
) -> (TempDir, TcpServer, Vec<u8>, PathBuf, Arc<Site>) {
    listener_logging(tag, limits, size, false)
}

/// [`hostile_listener`], with the access log in `access.log` of the temp dir if `log`.
fn listener_logging(
    tag: &str,
    limits: udpx_h3::tcp::TcpLimits,
    size: usize,
    log: bool,
) -> (TempDir, TcpServer, Vec<u8>, PathBuf, Arc<Site>) {
    let tmp = TempDir::new(tag);
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let big = content(size, 13);
    std::fs::write(www.join("big"), &big).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (tmp.path().join("cert.pem"), tmp.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let opts = SiteOptions { access_log: log.then(|| tmp.path().join("access.log")), ..SiteOptions::default() };
    let site = Arc::new(Site::new(&www, &opts).unwrap());
    let server = TcpServer::start_with("127.0.0.1:0".parse().unwrap(), &cert, &key, site.clone(), limits).unwrap();
    (tmp, server, big, cert, site)
}

/// One address may hold only its share of the connections; another address is served
/// meanwhile.
#[test]
fn one_address_holds_only_its_share() {
    let Some(curl_bin) = curl_path() else {
        record_skip("one_address_holds_only_its_share", "curl not installed (scripts/setup.sh installs it)");
        return;
    };
    let limits = udpx_h3::tcp::TcpLimits { per_source: 4, ..Default::default() };
    let (tmp, server, big, _, _) = hostile_listener("tcp-share", limits, BIG);
    let addr = server.local_addr();
    let held: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let g = curl(&curl_bin, tmp.path(), &["--http2", "--interface", "127.0.0.2"], &format!("https://{addr}/big"));
    assert_eq!(g.status, 200);
    assert!(g.body == big);
    let c = server.stop();
    assert_eq!(c.per_source_refused, 16, "{c:?}");
    drop(held);
}

/// An HTTP/1.1 reader slower than the minimum rate (curl --limit-rate) is cut off and
/// counted: it does not keep its connection for the length of the file. (Over HTTP/2 the
/// stream is parked instead: the next tests.)
#[test]
fn a_slow_http1_reader_is_cut_off() {
    let Some(curl_bin) = curl_path() else {
        record_skip("a_slow_http1_reader_is_cut_off", "curl not installed (scripts/setup.sh installs it)");
        return;
    };
    let limits =
        udpx_h3::tcp::TcpLimits { min_bytes: 512 * 1024, window: Duration::from_secs(1), ..Default::default() };
    // Larger than what the two sockets' buffers take on loopback (several MB each way), so
    // the server still has a body under way when the reader stalls.
    let (_tmp, server, _, _, _) = hostile_listener("tcp-slow", limits, 48 << 20);
    let addr = server.local_addr();
    let start = Instant::now();
    // Killed (its group) when dropped at the end.
    let _reader = ChildGroup::spawn(
        Command::new(&curl_bin)
            .args(["-k", "-s", "--noproxy", "*", "--max-time", "30", "--limit-rate", "20k", "--http1.1"])
            .args(["-o", "/dev/null"])
            .arg(format!("https://{addr}/big"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    // The server lets go of it (the client only notices once it has read what its own
    // socket already holds, at 20 kB/s).
    while server.counters().too_slow == 0 && start.elapsed() < Duration::from_secs(25) {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("cut off after {:?}", start.elapsed());
    let c = server.stop();
    assert_eq!(c.too_slow, 1, "cut off within a few windows: {c:?}");
}

/// The third review: an HTTP/2 stream whose client stops reading (a zero window: a paused
/// video) is parked, its file given back, and reset alone (RST_STREAM CANCEL) at the park
/// timeout; its connection goes on and answers the next request. (Before, the whole
/// connection was closed after one window.)
#[test]
fn a_stalled_http2_stream_is_parked_then_reset_alone() {
    let limits = udpx_h3::tcp::TcpLimits {
        min_bytes: 64 * 1024,
        window: Duration::from_secs(1),
        park: Duration::from_secs(3),
        ..Default::default()
    };
    let (_tmp, server, big, cert, site) = hostile_listener("tcp-window", limits, BIG);
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (reset, again) = rt.block_on(async move {
        let tls = h2_tls(&cert, addr).await;
        // A stream window of 0: the server may send headers, never a byte of body.
        let (mut client, conn) =
            h2::client::Builder::new().initial_window_size(0).handshake::<_, bytes::Bytes>(tls).await.unwrap();
        tokio::spawn(conn);
        let req = http::Request::get(format!("https://{addr}/big")).body(()).unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        // Held, nothing read: the stream is reset within the park timeout and a few windows.
        let mut body = resp.into_body();
        let got = tokio::time::timeout(Duration::from_secs(15), body.data()).await;
        let reset = match got {
            Ok(Some(Err(e))) => e.reason(),
            other => panic!("the stalled stream ends in a reset: {other:?}"),
        };
        // The connection still serves: a new stream (a HEAD: the window of 0 takes no body).
        let req = http::Request::head(format!("https://{addr}/big")).body(()).unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        let n: usize = resp.headers()["content-length"].to_str().unwrap().parse().unwrap();
        assert_eq!(resp.status(), 200);
        (reset, n)
    });
    let h = site.counters();
    let c = server.stop();
    assert_eq!(reset, Some(h2::Reason::CANCEL));
    assert_eq!(again, big.len(), "the same connection answered the next request");
    assert_eq!((c.too_slow, c.connections), (0, 1), "{c:?}");
    assert_eq!((h.parked, h.stalled, h.open_files), (1, 1, 0), "{h:?}");
}

/// A paused HTTP/2 download (its window shut for longer than the stall window) gives its file
/// back and resumes byte-exact when its client reads again, beside a sibling stream that
/// completes meanwhile on the same connection.
#[test]
fn a_paused_http2_stream_resumes_byte_exact_beside_an_active_one() {
    let limits = udpx_h3::tcp::TcpLimits {
        min_bytes: 64 * 1024,
        window: Duration::from_secs(1),
        park: Duration::from_secs(60),
        ..Default::default()
    };
    let (_tmp, server, big, cert, site) = hostile_listener("tcp-pause", limits, BIG);
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let s2 = site.clone();
    let (paused, sibling, open_while_parked) = rt.block_on(async move {
        let tls = h2_tls(&cert, addr).await;
        let (mut client, conn) = h2::client::Builder::new()
            .initial_window_size(256 << 10)
            .initial_connection_window_size(8 << 20)
            .handshake::<_, bytes::Bytes>(tls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let get = || http::Request::get(format!("https://{addr}/big")).body(()).unwrap();
        let (resp, _) = client.send_request(get(), true).unwrap();
        let mut video = resp.await.unwrap().into_body();
        let mut got = Vec::new();
        // The first 256 KiB, not given back: the stream's window stays shut.
        while got.len() < 256 << 10 {
            got.extend_from_slice(&video.data().await.unwrap().unwrap());
        }
        // A sibling stream completes while the video is paused.
        let (resp, _) = client.send_request(get(), true).unwrap();
        let mut other = resp.await.unwrap().into_body();
        let mut n = 0;
        while let Some(chunk) = other.data().await {
            let chunk = chunk.unwrap();
            n += chunk.len();
            other.flow_control().release_capacity(chunk.len()).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        let open = s2.counters().open_files;
        // Reading again: the rest, byte-exact.
        video.flow_control().release_capacity(got.len()).unwrap();
        while let Some(chunk) = video.data().await {
            let chunk = chunk.unwrap();
            got.extend_from_slice(&chunk);
            video.flow_control().release_capacity(chunk.len()).unwrap();
        }
        (got, n, open)
    });
    let h = site.counters();
    let c = server.stop();
    assert_eq!(sibling, big.len());
    assert!(paused == big, "the paused stream resumed byte-exact ({} of {} bytes)", paused.len(), big.len());
    assert_eq!(open_while_parked, 0, "the parked stream gave its file back");
    assert!(h.parked >= 1 && h.resumed >= 1 && h.stalled == 0, "{h:?}");
    assert_eq!((c.too_slow, c.connections), (0, 1), "{c:?}");
}

/// An HTTP/2 connection with no stream, kept alive only by answering the server's PINGs (the
/// h2 client does), is closed at the idle timeout and counted; it does not hold its permit
/// for ever.
#[test]
fn an_idle_http2_connection_is_closed() {
    let limits = udpx_h3::tcp::TcpLimits {
        window: Duration::from_millis(500),
        idle: Duration::from_secs(2),
        ..Default::default()
    };
    let (tmp, server, _, cert, site) = listener_logging("tcp-idle", limits, 1000, true);
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let closed = rt.block_on(async move {
        let tls = h2_tls(&cert, addr).await;
        let (mut client, conn) = h2::client::Builder::new().handshake::<_, bytes::Bytes>(tls).await.unwrap();
        let driver = tokio::spawn(conn);
        // One request, then nothing: the connection idles with no stream.
        let req = http::Request::get(format!("https://{addr}/big")).body(()).unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let mut body = resp.await.unwrap().into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        // The driver ends when the server closes the connection (bounded: 15 s).
        tokio::time::timeout(Duration::from_secs(15), driver).await.is_ok()
    });
    assert!(closed, "the server closed the idle connection");
    let c = server.stop();
    assert_eq!((c.idle_closed, c.too_slow), (1, 0), "{c:?}");
    // Its close line says the server ended it.
    site.flush_log().unwrap();
    let log = std::fs::read_to_string(tmp.path().join("access.log")).unwrap();
    let line = log.lines().find(|l| l.contains(" CONNECTION h2 ")).unwrap_or_else(|| panic!("no close line: {log}"));
    assert!(line.contains(" closed_by=server ") && line.contains(" requests=1 "), "{line}");
}

/// At the connection cap the connection idle longest is closed to make room for a new one
/// (nginx does the same with its idle keep-alive connections), never one with a response under
/// way; with every connection busy the new one is closed, counted. (Before: a fixed 256
/// permits, and a new connection waited in the accept queue behind idle ones for up to the
/// idle timeout.)
#[test]
fn at_the_cap_the_oldest_idle_connection_makes_room() {
    let limits = udpx_h3::tcp::TcpLimits { max_connections: 3, per_source: 3, ..Default::default() };
    let (_tmp, server, big, cert, _) = hostile_listener("tcp-cap", limits, BIG);
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // Two idle keep-alive connections, the first idle longer, and one paused download.
        let mut first = common::tls::connect(&cert, addr, b"http/1.1").await;
        assert_eq!(common::tls::http1_get(&mut first, "/big").await, (200, big.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut second = common::tls::connect(&cert, addr, b"http/1.1").await;
        assert_eq!(common::tls::http1_get(&mut second, "/big").await.0, 200);
        let (mut h2c, conn) =
            h2::client::Builder::new().handshake::<_, bytes::Bytes>(h2_tls(&cert, addr).await).await.unwrap();
        tokio::spawn(conn);
        let req = http::Request::get(format!("https://{addr}/big")).body(()).unwrap();
        let (resp, _) = h2c.send_request(req, true).unwrap();
        let mut paused = resp.await.unwrap().into_body();
        let _ = paused.data().await.unwrap().unwrap(); // then not read: its window stays shut

        // A fourth (from another address: one address holds at most its share): the first
        // idle connection goes, the fourth is served.
        let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
        let mut fourth = common::tls::connect_from(&cert, addr, b"http/1.1", Some(other)).await;
        assert_eq!(common::tls::http1_get(&mut fourth, "/big").await.0, 200);
        let mut byte = [0u8; 1];
        let end = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut first, &mut byte));
        assert!(matches!(end.await, Ok(Ok(0))), "the connection idle longest was closed");
        // The second still serves.
        assert_eq!(common::tls::http1_get(&mut second, "/big").await.0, 200);

        // Every connection busy (the paused download, and two more): a new one is closed.
        let mut more = Vec::new();
        for c in [&mut second, &mut fourth] {
            tokio::io::AsyncWriteExt::write_all(c, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
            let mut head = [0u8; 256];
            let n = tokio::io::AsyncReadExt::read(c, &mut head).await.unwrap();
            more.push(n); // the response began; not read further: its body stays under way
        }
        let mut last = common::tls::connect_raw(addr, other).await;
        let mut byte = [0u8; 1];
        let end = tokio::time::timeout(Duration::from_secs(10), tokio::io::AsyncReadExt::read(&mut last, &mut byte));
        assert!(matches!(end.await, Ok(Ok(0)) | Ok(Err(_))), "refused at the cap with every one busy");
        drop(h2c);
    });
    let c = server.stop();
    assert_eq!((c.evicted, c.full_refused), (1, 1), "{c:?}");
}

/// A connection the server ends is closed lingering (as nginx's `lingering_close`): the server
/// ends its side (TLS close, FIN), then reads and discards what the client still sends until the
/// client closes (or a short deadline). A client's last frames cross the server's close (an
/// HTTP/2 client's WINDOW_UPDATEs and SETTINGS acks after the GOAWAY); a socket closed at once
/// answers them with a reset, which fails the client's next write (EPIPE: the HTTP/2 + HTTP/3
/// upgrade test saw it) and destroys whatever it had not read yet. Here an HTTP/1.1 client reads
/// a `Connection: close` response to its end, then writes twice: both must be taken. (Before,
/// the second write failed.)
#[test]
fn a_closing_connection_lingers_for_the_clients_late_bytes() {
    let (_tmp, server, big, cert, _) = hostile_listener("tcp-linger", Default::default(), 1 << 20);
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for round in 0..3 {
            let mut tls = common::tls::connect(&cert, addr, b"http/1.1").await;
            tls.write_all(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await.unwrap();
            tls.flush().await.unwrap();
            let mut got = Vec::new();
            let end = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut got)).await;
            assert!(matches!(end, Ok(Ok(_))), "round {round}: the response ended cleanly: {end:?}");
            let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
            assert!(got[head_end..] == big[..], "round {round}: the whole body");
            // Late bytes, after the server's close: taken, not reset.
            let tcp = tls.get_mut().0;
            for write in 0..2 {
                let w = tcp.write_all(&[b'x'; 100]).await;
                assert!(w.is_ok(), "round {round}, write {write} after the server's close: {w:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    server.stop();
}
