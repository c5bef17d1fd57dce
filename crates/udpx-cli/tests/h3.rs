//! `udpx h3` as a user runs it: bad input exits 2 with a message naming what to change; the
//! server started as a program serves `udpx h3 get` and (when installed) ngtcp2's
//! gtlsclient, and prints its JSON counters when it stops. Every process started is in a
//! ChildGroup (killed on drop, also when an assertion fails) and bounded by `-l`.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use udpx_lab::netns::{record_skip, ChildGroup};

use common::{assert_row_steal, assert_steal, median_or_run, udpx, wait_bound};

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp(tag: &str) -> Tmp {
    let p = std::env::temp_dir().join(format!("udpx-cli-h3-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(p.join("www")).unwrap();
    Tmp(p)
}

#[test]
fn bad_input_exits_2_and_says_what_to_change() {
    let t = tmp("bad");
    let www = t.0.join("www");
    let www = www.to_str().unwrap();
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let (sampled, bad_sample) = (t.0.join("peers-sampled"), t.0.join("peers-bad"));
    std::fs::write(&sampled, "192.0.2.7 sample=0.5\n").unwrap();
    std::fs::write(&bad_sample, "sample=2\n").unwrap();
    let (sampled, bad_sample) = (sampled.to_str().unwrap(), bad_sample.to_str().unwrap());
    let cases: &[(&[&str], &str)] = &[
        (&["h3", "serve", "/nonexistent-udpx-dir"], "/nonexistent-udpx-dir"),
        (&["h3", "serve", www, "--cert", "/nonexistent.pem", "--key", "/nonexistent.key"], "certificate file"),
        (&["h3", "serve", www, "--cert", "/nonexistent.pem"], "--key"),
        (&["h3", "serve", www, "--listen", &taken], "in use"),
        (&["h3", "serve", www, "--io", "warp"], "--io"),
        (&["h3", "serve", www, "--shards", "0"], "--shards 0"),
        (&["h3", "serve", www, "--shards", "300"], "--shards 300"),
        (&["h3", "serve", www, "--host-id", "70000"], "--host-id"),
        (&["h3", "serve", www, "--max-udp-payload", "1000"], "--max-udp-payload 1000"),
        (&["h3", "serve", www, "--gro", "maybe"], "--gro"),
        (&["h3", "serve", www, "--zerocopy", "maybe"], "--zerocopy"),
        (&["h3", "serve", www, "--coalesce", "200000"], "200000 is not in 0..=100000"),
        (&["h3", "serve", www, "--tcp-max-connections", "10", "--tcp-per-source", "20"], "--tcp-per-source 20"),
        (&["h3", "serve", www, "--tcp-max-connections", "0"], "--tcp-max-connections"),
        (&["h3", "serve", www, "--cache-size", "10k"], "give 0 (off) or at least 1M"),
        (&["h3", "serve", www, "--cache-size", "lots"], "--cache-size"),
        (&["h3", "serve", www, "--cors", "player.example"], "as a browser sends it"),
        (&["h3", "serve", www, "--cors", "*", "--cors", "https://a.example"], "give * alone"),
        (&["h3", "serve", www, "--qlog-sample", "0.5"], "--qlog-dir"),
        (&["h3", "serve", www, "--qlog-dir", "/nonexistent-udpx-dir/q", "--qlog-sample", "2"], "give 0 to 1"),
        (
            &[
                "h3",
                "serve",
                www,
                "--qlog-dir",
                "/nonexistent-udpx-dir/q",
                "--qlog-sample",
                "0.1",
                "--qlog-peers",
                sampled,
            ],
            "give the sample in one of them",
        ),
        (&["h3", "serve", www, "--qlog-dir", "/nonexistent-udpx-dir/q", "--qlog-peers", bad_sample], "F from 0 to 1"),
        #[cfg(not(feature = "qlog"))]
        (&["h3", "serve", www, "--qlog-dir", "/nonexistent-udpx-dir/q"], "--features qlog"),
        (&["h3", "get", "http://127.0.0.1/"], "https://"),
        (&["h3", "get", "https://127.0.0.1:99999/"], "port"),
        (&["h3", "get", "https://127.0.0.1:1/", "-o", "/nonexistent-dir/x"], "output file"),
    ];
    common::assert_usage_errors(cases);
}

/// `udpx h3 serve` of `t`'s `www` with `args`, one shard, on a free port: `during` with its
/// address, its pid and its standard error's file once it listens, then SIGINT; its standard
/// output and error (the test fails unless the server exits 0).
fn serve_while(
    t: &Tmp,
    args: &[&std::ffi::OsStr],
    during: impl FnOnce(&str, u32, &std::path::Path),
) -> (String, String) {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let (out, log) = (t.0.join("serve.out"), t.0.join("serve.err"));
    let server = ChildGroup::spawn(
        Command::new(env!("CARGO_BIN_EXE_udpx"))
            .args(["h3", "serve", t.0.join("www").to_str().unwrap(), "--listen", &listen, "--shards", "1", "-l", "20"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&log).unwrap()),
    )
    .unwrap();
    wait_bound(port);
    during(&listen, server.id(), &log);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = server.wait_timeout(Duration::from_secs(15)).unwrap();
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {err}");
    (std::fs::read_to_string(&out).unwrap(), err)
}

/// One `udpx h3 get` of `/file` from the server at `listen` (the test fails unless it succeeds).
fn get_file(listen: &str) {
    let o = udpx(&["h3", "get", &format!("https://{listen}/file")]);
    assert!(o.status.success(), "get: {}", String::from_utf8_lossy(&o.stderr));
}

/// [`serve_while`] one [`get_file`].
fn serve_one_get(t: &Tmp, args: &[&std::ffi::OsStr]) -> (String, String) {
    serve_while(t, args, |listen, _, _| get_file(listen))
}

/// `--keylog-file`: a link is refused; the server warns of the file at start and writes the
/// secrets of a download into it, created 0600; without the flag the SSLKEYLOGFILE variable
/// writes nothing, and the server says it ignores it.
#[test]
fn keylog_file_is_opt_in_private_and_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    let t = tmp("keylog");
    std::fs::write(t.0.join("www/file"), b"hello").unwrap();
    let www = t.0.join("www");
    let www_s = www.to_str().unwrap();
    let (link, elsewhere) = (t.0.join("link.log"), t.0.join("elsewhere.log"));
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    common::assert_usage_errors(&[(&["h3", "serve", www_s, "--keylog-file", link.to_str().unwrap()], "symbolic link")]);
    assert!(!elsewhere.exists(), "nothing created through the link");

    let env_file = t.0.join("env.log");
    let o = Command::new(env!("CARGO_BIN_EXE_udpx"))
        .args(["h3", "serve", www_s, "--listen", "127.0.0.1:0", "--shards", "1", "-l", "1"])
        .env("SSLKEYLOGFILE", &env_file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("SSLKEYLOGFILE is set and ignored"), "{err}");
    assert!(!err.contains("WARNING: the TLS secrets"), "{err}");
    assert!(!env_file.exists(), "no key log without --keylog-file");

    let keys = t.0.join("keys.log");
    let (_, err) = serve_one_get(&t, &["--keylog-file".as_ref(), keys.as_os_str()]);
    assert!(
        err.contains(&format!("WARNING: the TLS secrets of every new connection are written to {}", keys.display())),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&keys).unwrap().permissions().mode() & 0o777, 0o600);
    let lines = std::fs::read_to_string(&keys).unwrap();
    assert!(lines.lines().any(|l| l.starts_with("CLIENT_TRAFFIC_SECRET_0 ")), "{lines}");
}

/// `--qlog-dir` with `--qlog-peer`: the named address's download gets its file, the server
/// says what it logs, and the final counters count it (a build with the feature `qlog`).
#[cfg(feature = "qlog")]
#[test]
fn qlog_of_one_viewer() {
    let t = tmp("qlog");
    std::fs::write(t.0.join("www/file"), vec![7u8; 100_000]).unwrap();
    let qdir = t.0.join("qlog");
    let (out, err) =
        serve_one_get(&t, &["--qlog-peer".as_ref(), "127.0.0.1".as_ref(), "--qlog-dir".as_ref(), qdir.as_os_str()]);
    assert!(err.contains("qlog of the connections from [127.0.0.1]"), "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["h3_serve"]["qlog"]["files"], 1, "{json}");
    let files: Vec<_> = std::fs::read_dir(&qdir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.starts_with('\u{1e}') && text.contains("packet_sent"), "{}", &text[..text.len().min(300)]);
}

/// `--qlog-peers FILE` read again on SIGHUP: a viewer not named gets no file; named in the
/// file, then SIGHUP, its next connection gets one (a build with the feature `qlog`).
#[cfg(feature = "qlog")]
#[test]
fn sighup_reads_the_qlog_peers_again() {
    let t = tmp("qlog-hup");
    std::fs::write(t.0.join("www/file"), b"hello").unwrap();
    let (qdir, peers) = (t.0.join("qlog"), t.0.join("peers"));
    std::fs::write(&peers, "127.0.0.2 # another viewer\n").unwrap();
    let args = ["--qlog-peers".as_ref(), peers.as_os_str(), "--qlog-dir".as_ref(), qdir.as_os_str()];
    let (out, err) = serve_while(&t, &args, |listen, pid, log| {
        get_file(listen);
        let hup = |text: &str, line: &str| {
            std::fs::write(&peers, text).unwrap();
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGHUP).unwrap();
            let start = Instant::now();
            while !std::fs::read_to_string(log).unwrap_or_default().contains(line) {
                assert!(start.elapsed() < Duration::from_secs(10), "no SIGHUP line {line:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        hup("127.0.0.2\n127.0.0.1\n", "SIGHUP: qlog peers now [127.0.0.2, 127.0.0.1], sample 0");
        get_file(listen);
        // 127.0.0.1 no longer named, but every connection sampled: logged again.
        hup("127.0.0.2 sample=1\n", "SIGHUP: qlog peers now [127.0.0.2], sample 1");
        get_file(listen);
        // A bad sample is refused and the policy in force stays.
        hup("sample=3\n", "the qlog peers stay [127.0.0.2], sample 1");
    });
    assert!(err.contains("\"sample=3\": give sample=F with F from 0 to 1"), "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["h3_serve"]["qlog"]["files"], 2, "the second and third connections: {json}");
    assert_eq!(std::fs::read_dir(&qdir).unwrap().count(), 2);
}

#[test]
fn serve_as_a_program_for_get_and_gtlsclient() {
    let t = tmp("serve");
    let content: Vec<u8> = (0..1_000_003u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(t.0.join("www/file"), &content).unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let (out, err) = (t.0.join("serve.out"), t.0.join("serve.err"));
    let server = ChildGroup::spawn(
        Command::new(env!("CARGO_BIN_EXE_udpx"))
            .args(["h3", "serve", t.0.join("www").to_str().unwrap(), "--listen", &listen, "--shards", "2"])
            .args(["--io", "gso", "-l", "20"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap()),
    )
    .unwrap();
    wait_bound(port);
    let url = format!("https://{listen}/file");
    let got = t.0.join("got");
    let o = udpx(&["h3", "get", &url, "-o", got.to_str().unwrap(), "--io", "sendmmsg"]);
    let line = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "get: {}", String::from_utf8_lossy(&o.stderr));
    assert!(line.contains("status 200") && line.contains("1000003 bytes") && line.contains("Mbit/s"), "{line}");
    assert_eq!(std::fs::read(&got).unwrap(), content);
    let o = udpx(&["h3", "get", &format!("https://{listen}/missing")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("status 404"));
    match ["/usr/bin/gtlsclient", "/usr/local/bin/gtlsclient"].iter().find(|p| std::path::Path::new(p).is_file()) {
        None => record_skip(
            "serve_as_a_program_for_get_and_gtlsclient (gtlsclient part)",
            "gtlsclient not installed (ngtcp2-client)",
        ),
        Some(client) => {
            let dl = t.0.join("dl");
            std::fs::create_dir_all(&dl).unwrap();
            let mut g = Command::new(client);
            g.args(["-q", "--exit-on-all-streams-close", "--timeout=10s"])
                .arg(format!("--download={}", dl.display()))
                .args(["127.0.0.1", &port.to_string(), &url])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let status = ChildGroup::spawn(&mut g).unwrap().wait().unwrap();
            assert!(status.success(), "gtlsclient: {status}");
            assert_eq!(std::fs::read(dl.join("file")).unwrap(), content);
        }
    }
    // SIGTERM: a clean stop with the counters as JSON.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "server: {status}: {}", std::fs::read_to_string(&err).unwrap_or_default());
    let json: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    let c = &json["h3_serve"];
    assert!(c["http"]["ok"].as_u64().unwrap() >= 1, "{c}");
    assert_eq!(c["http"]["not_found"].as_u64(), Some(1), "{c}");
    assert!(c["quic"]["gso_runs"].as_u64().unwrap() > 0, "{c}");
    let e = std::fs::read_to_string(&err).unwrap();
    assert!(e.contains("generated a self-signed certificate"), "{e}");
}

#[test]
fn bench_h3_bad_flags_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "h3", "--size", "0"], "--size"),
        (&["bench", "h3", "--size", "12X"], "--size"),
        (&["bench", "h3", "--size", "200G"], "--size"),
        (&["bench", "h3", "--repeat", "0"], "--repeat"),
        (&["bench", "h3", "--repeat", "many"], "--repeat"),
        (&["bench", "h3", "--chromium-repeat", "101"], "--chromium-repeat"),
        (&["bench", "h3", "--warp"], "--warp"),
        (&["bench", "h3", "--veth", "--loopback"], "--loopback"),
        (&["bench", "h3", "--coalesce", "200000"], "--coalesce"),
        (&["bench", "h3", "--flood", "0"], "--flood"),
        (&["bench", "h3", "--flood", "1000", "--flood-retry", "sometimes"], "--flood-retry"),
        (&["bench", "h3", "--flood", "1000", "--connections", "10"], "--connections"),
        (&["bench", "h3", "--flood-seconds", "5"], "--flood"),
        (&["bench", "h3", "--bottleneck", "0"], "--bottleneck"),
        (&["bench", "h3", "--bottleneck-buffer", "5"], "--bottleneck"),
        (&["bench", "h3", "--rtt", "40"], "--bottleneck"),
        (&["bench", "h3", "--bottleneck", "100", "--rtt", "0"], "--rtt"),
        (&["bench", "h3", "--bottleneck", "100", "--rtt", "3000"], "--rtt"),
        (&["bench", "h3", "--bottleneck", "100", "--viewers", "20"], "--rtt"),
        (&["bench", "h3", "--bottleneck", "100", "--rtt", "40", "--viewers", "0"], "--viewers"),
        (&["bench", "h3", "--window", "5"], "--window"),
        (&["bench", "h3", "--connections", "10", "--window", "0"], "--window"),
        (&["bench", "h3", "--cc", "reno"], "--cc"),
        (&["bench", "h3", "--burst", "rate"], "--burst"),
        (&["bench", "h3", "--connections", "10", "--cache-size", "64M"], "add udpx-cache to --servers"),
        (&["bench", "h3", "--connections", "10", "--servers", "udpx-cache", "--cache-size", "0"], "--cache-size 0"),
        (&["bench", "h3", "--connections", "10", "--servers", "udpx-cache", "--cache-size", "5k"], "--cache-size"),
        (&["bench", "h3", "--flood", "1000", "--cache-size", "64M"], "leave it out with --restart"),
    ];
    for (args, needle) in cases {
        let o = udpx(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
    }
}

/// A PATH without nginx (Debian puts it in /usr/sbin): the bench still runs, exits 0, and
/// names the row it left out.
#[test]
fn bench_h3_names_a_missing_nginx_and_exits_0() {
    let o = Command::new(env!("CARGO_BIN_EXE_udpx"))
        .args(["bench", "h3", "--size", "200k", "--repeat", "1", "--loopback", "--json"])
        .env("PATH", "/nonexistent-udpx-path")
        .output()
        .expect("run udpx");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("left out nginx https/tcp / curl: nginx and curl not found in PATH"), "{err}");
    assert!(err.contains("gtlsclient not found in PATH"), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let b = &json["h3_bench"][0];
    assert_eq!(json["h3_bench"].as_array().map(Vec::len), Some(1), "loopback: one table");
    assert_eq!(b["profile"], "loopback");
    // The independent client is ours, found where scripts/setup.sh puts it (not only in PATH):
    // its udpx row runs, its nginx row needs nginx.
    let independent = usize::from(!b["config"]["programs"]["independent"].is_null());
    // Two of them with it: udpx with the block cache off and on (`--cache-size`).
    assert_eq!(b["rows"].as_array().map(Vec::len), Some(6 + 2 * independent), "the udpx h3 get rows, quinn's: {b}");
    assert_eq!(b["rows"][5]["server"], "quinn h3", "{b}");
    let quinn = median_or_run("bench_h3_names_a_missing_nginx", &b["rows"][5]);
    assert!(quinn["bytes"].as_u64().is_some(), "quinn's download measured: {b}");
    b["rows"].as_array().unwrap().iter().for_each(assert_row_steal);
    assert_eq!(
        b["left_out"].as_array().map(Vec::len),
        Some(3 + 1 - independent),
        "nginx, gtlsclient, chromium (and the independent client if missing): {b}"
    );
}

/// `--burst window`: every udpx row still delivers the whole file, and the GSO rows write
/// more than quiche's quantum (ten packets under CUBIC) per send call.
#[test]
fn bench_h3_burst_window_writes_larger_runs() {
    let o = Command::new(env!("CARGO_BIN_EXE_udpx"))
        .args(["bench", "h3", "--size", "4M", "--repeat", "1", "--loopback", "--burst", "window", "--json"])
        .output()
        .expect("run udpx");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let b = &json["h3_bench"][0];
    assert!(b["path"].as_str().is_some_and(|p| p.contains("--burst window")), "{b}");
    let rows = b["rows"].as_array().expect("rows");
    let udpx_get: Vec<_> = rows.iter().filter(|r| r["client"] == "udpx h3 get" && r["server"] != "quinn h3").collect();
    assert_eq!(udpx_get.len(), 5, "{b}");
    let test = "bench_h3_burst_window_writes_larger_runs";
    for r in &udpx_get {
        assert_eq!(median_or_run(test, r)["bytes"].as_u64(), Some(4_000_000), "{r}");
        assert_row_steal(r);
    }
    let most = udpx_get.iter().filter_map(|r| median_or_run(test, r)["packets_per_call"].as_f64()).fold(0.0, f64::max);
    assert!(most > 10.0, "no row wrote more than ten packets per call: {b}");
}

/// A TCP connection to `to` from `from` (a loopback address), so the test plays many sources.
fn connect_from(from: std::net::Ipv4Addr, to: std::net::SocketAddr) -> Option<std::net::TcpStream> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).ok()?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(from, 0))).ok()?;
    let std::net::SocketAddr::V4(to) = to else { return None };
    connect(fd.as_raw_fd(), &SockaddrIn::from(to)).ok()?;
    Some(std::net::TcpStream::from(fd))
}

/// Out of file descriptors: the server (its limit cut to 64 by the shell that starts it)
/// raises its soft limit to the hard one and says so; idle TCP connections from many addresses
/// take its descriptors until accepting fails; meanwhile an HTTP/3 request is answered 503 (it
/// could not open the file) and nothing ends; once the connections go, service resumes.
#[test]
fn out_of_descriptors_answers_503_and_recovers() {
    let t = tmp("nofile");
    std::fs::write(t.0.join("www/file"), vec![7u8; 100_000]).unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let tcp_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (listen, tcp) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{tcp_port}"));
    let (out, err) = (t.0.join("serve.out"), t.0.join("serve.err"));
    let script = format!(
        "ulimit -Sn 32 && ulimit -Hn 64 && exec {} h3 serve {} --listen {listen} --alt-svc-tcp {tcp} --shards 1 -l 40",
        env!("CARGO_BIN_EXE_udpx"),
        t.0.join("www").display()
    );
    let server = ChildGroup::spawn(
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap()),
    )
    .unwrap();
    wait_bound(port);
    let url = format!("https://{listen}/file");
    assert!(String::from_utf8_lossy(&udpx(&["h3", "get", &url]).stdout).contains("status 200"));
    let e = std::fs::read_to_string(&err).unwrap();
    assert!(e.contains("open files: 64 (raised from 32)"), "{e}");
    // Idle connections, 10 per address (under the per-address cap), until the server is full.
    let to: std::net::SocketAddr = tcp.parse().unwrap();
    let idle: Vec<std::net::TcpStream> =
        (0..100u8).filter_map(|i| connect_from(std::net::Ipv4Addr::new(127, 0, 1, 1 + i / 10), to)).collect();
    // Full once the server has accepted them up to its limit (64, `ulimit -Hn` above; `sh`
    // exec'd the server, so the pid is the server's).
    wait_descriptors(server.id(), 64);
    let o = udpx(&["h3", "get", &url]);
    let line = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(line.contains("status 503"), "a full server answers 503: {line} {}", String::from_utf8_lossy(&o.stderr));
    drop(idle);
    // The server closes its ends as the peers go; the next request is served.
    let mut served = false;
    let back = Instant::now();
    while !served && back.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        served = String::from_utf8_lossy(&udpx(&["h3", "get", &url]).stdout).contains("status 200");
    }
    assert!(served, "service resumed once descriptors were free");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "server: {status}: {}", std::fs::read_to_string(&err).unwrap_or_default());
    let json: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    let c = &json["h3_serve"];
    println!("{c}");
    assert!(c["http"]["unavailable"].as_u64().unwrap() >= 1, "{c}");
    assert!(c["tcp"]["accept_errors"].as_u64().unwrap() >= 1, "{c}");
}

/// Waits (10 s at most) until process `pid` holds `n` descriptors or more (/proc/PID/fd).
fn wait_descriptors(pid: u32, n: usize) {
    let start = Instant::now();
    let count = || std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    while count() < n {
        assert!(start.elapsed() < Duration::from_secs(10), "the server holds {} descriptors, not {n}", count());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `udpx bench h3 --flood` (root: the attack lab), short: forged Initials from random
/// addresses, every bound the bench judges holds (toward the forged addresses at most 3x what
/// they sent without Retry, at most 1x with; every legitimate download whole; the server
/// still up), and the server's own counts agree with what the attacker did. The bounds are
/// counts, not timings.
#[test]
fn bench_h3_flood_holds_its_bounds() {
    let args = ["bench", "h3", "--flood", "1000", "--flood-seconds", "3", "--flood-retry", "never,always", "--json"];
    let Some(json) = root_lab("bench_h3_flood_holds_its_bounds", &args) else { return };
    let rows = json["h3_flood"]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{json}");
    for (r, mode) in rows.iter().zip(["never", "always"]) {
        let r = &r["Ok"];
        assert_eq!(r["retry"], mode, "{json}");
        assert_steal(r);
        let bounds = r["bounds"].as_array().expect("bounds");
        assert_eq!(bounds.len(), 4, "3 s: memory growth not judged (under three handshake deadlines): {r}");
        for b in bounds {
            assert_eq!(b["met"], true, "--retry {mode}: {b}");
        }
        let initials = r["initials"].as_u64().unwrap();
        assert!(initials > 1_000 && r["downloads"].as_u64() > Some(0), "{r}");
        let c = &r["counters"];
        // Most forged Initials reach the server (a loaded machine may drop some on the way:
        // half is the bound), and what they draw depends on the mode.
        if mode == "always" {
            // Answered by a Retry, never by a handshake: only the client's connections exist.
            assert!(c["retries_sent"].as_u64() > Some(initials / 2), "{r}");
            assert_eq!(c["handshake_timeouts"], 0, "{r}");
            assert!(c["connections"].as_u64() <= r["downloads"].as_u64().map(|d| d + 2), "{r}");
        } else {
            assert_eq!(c["retries_sent"], 0, "{r}");
            assert!(c["connections"].as_u64() > Some(initials / 2), "forged Initials became handshakes: {r}");
        }
    }
}

/// `udpx bench h3 --bottleneck` (root: a router with a tbf), short: a row per burst rule,
/// each download whole (the bench fails a run otherwise), the server's counts carried. Losses
/// and goodput belong to the report, not to this test.
#[test]
fn bench_h3_bottleneck_runs_each_burst_rule() {
    let args = ["bench", "h3", "--bottleneck", "300", "--size", "5M", "--repeat", "1", "--cc", "bbr2", "--json"];
    let Some(json) = root_lab("bench_h3_bottleneck_runs_each_burst_rule", &args) else { return };
    let rows = json["h3_bottleneck"]["rows"].as_array().expect("rows");
    let modes: Vec<&str> = rows.iter().filter_map(|r| r["mode"].as_str()).collect();
    assert_eq!(modes, ["quantum", "window"], "{json}");
    for r in rows {
        assert_row_steal(r);
        let m = median_or_run("bench_h3_bottleneck_runs_each_burst_rule", r);
        assert!(m["packets"].as_u64() > Some(3_000) && m["send_calls"].as_u64() > Some(0), "{r}");
        assert!(m["mbit_per_s"].as_f64() > Some(0.0), "{r}");
    }
}

/// `udpx bench h3 --bottleneck --rtt --viewers` (root: the line with its router and delay
/// line), short: one round of 4 players, a 1 s ramp and 4 s measured; a row per controller
/// (and nginx's where nginx and quic-go's client are installed), every request answered or
/// counted, the host flags in the configuration the rows ran with (`--coalesce` reached the
/// tail bench only since the host flags became one value). The tail's milliseconds belong to
/// the report, not to this test.
#[test]
fn bench_h3_viewers_runs_each_controller() {
    let args = [
        "bench",
        "h3",
        "--bottleneck",
        "200",
        "--rtt",
        "20",
        "--viewers",
        "4",
        "--ramp",
        "1",
        "--window",
        "4",
        "--repeat",
        "1",
        "--coalesce",
        "250",
        "--json",
    ];
    let Some(json) = root_lab("bench_h3_viewers_runs_each_controller", &args) else { return };
    let tail = &json["h3_tail"];
    assert_eq!(tail["config"]["coalesce"], serde_json::json!({"secs": 0, "nanos": 250_000}), "{tail}");
    let rows = tail["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["cc"].as_str()).collect();
    assert!(names == ["cubic", "bbr2"] || names == ["cubic", "bbr2", "nginx-h2"], "{names:?}");
    for r in rows {
        assert!(r["error"].is_null(), "{r}");
        assert_row_steal(r);
        let m = median_or_run("bench_h3_viewers_runs_each_controller", r);
        let (requests, served) = (m["requests"].as_u64().unwrap(), m["served"].as_u64().unwrap());
        assert!(requests > 0 && served + m["unanswered"].as_u64().unwrap() <= requests, "{r}");
        assert!(served > 0 && m["p50_ms"].as_f64() <= m["p99_ms"].as_f64(), "{r}");
    }
}

/// `udpx bench h3 --restart`, small: one change per row under 50 players and four
/// rate-limited downloads spanning it. The upgrade and the reload fail no request and break no
/// connection and no download (the upgrade's players move on GOAWAY, the downloads finish
/// from the old process), the naive restart breaks connections and downloads (the table can
/// see a loss), and nginx's TCP rows, where nginx is installed, fail nothing either. The
/// upgrade is played three times: by udpx's own client, by quinn's (which follows GOAWAY as
/// browsers do, RFC 9114 5.2), and with HTTPS over TCP beside (its listener handed over), half
/// the players on hyper's HTTP/2 client. Counts only; the p99 columns are the report's.
#[test]
fn bench_h3_restart_upgrades_and_reloads_without_a_failure() {
    let args = ["bench", "h3", "--restart", "50", "--restart-seconds", "6", "--restart-changes", "1", "--json"];
    let Some(json) = root_lab("bench_h3_restart_upgrades_and_reloads_without_a_failure", &args) else { return };
    let rows = json["h3_restart"]["rows"].as_array().expect("rows");
    let row = |name: &str| rows.iter().find(|r| r["change"] == name).unwrap_or_else(|| panic!("{name}: {json}"));
    for name in ["UdpxUpgrade", "UdpxUpgradeQuinn", "UdpxUpgradeH2H3", "UdpxReload", "NginxReload", "NginxUpgrade"] {
        let r = row(name);
        if name.starts_with("Nginx") && r["load"].is_null() {
            continue; // nginx not installed: the row says so
        }
        // The h2+h3 row's two halves: quinn over HTTP/3, hyper over HTTP/2 (TCP).
        for l in [&r["load"], &r["load_h2"]] {
            if l.is_null() && name != "UdpxUpgradeH2H3" {
                continue;
            }
            assert!(l["requests"].as_u64() > Some(0), "{name}: {r}");
            for k in ["failed", "unanswered", "ended_early"] {
                assert_eq!(l[k].as_u64(), Some(0), "{name}: {k}: {r}");
            }
        }
        assert!(r["changes"][0]["error"].is_null(), "{r}");
        assert_eq!(r["downloads_broken"].as_u64(), Some(0), "{name}: the rate-limited downloads end whole: {r}");
        assert_steal(r);
        // Which side limits the row: both CPUs' busy shares measured (a served row keeps the
        // server's CPU busy some of the time).
        for k in ["server_busy", "client_busy"] {
            let b = r[k].as_f64().unwrap_or_else(|| panic!("{name}: {k}: {r}"));
            assert!(b > 0.0 && b <= 1.05, "{name}: {k} {b}");
        }
    }
    for name in ["UdpxUpgrade", "UdpxUpgradeQuinn", "UdpxUpgradeH2H3"] {
        let up = row(name);
        assert!(up["load"]["moved_on_goaway"].as_u64() > Some(0), "the players moved to the new server: {up}");
        assert!(up["changes"][0]["replaced_after_s"].as_f64().is_some(), "the old server exited: {up}");
    }
    assert_eq!(row("UdpxUpgradeQuinn")["load"]["client"], "quinn h3", "a client udpx did not write");
    let both = row("UdpxUpgradeH2H3");
    assert_eq!((&both["load"]["client"], &both["load_h2"]["client"]), (&"quinn h3".into(), &"hyper (TCP, h2)".into()));
    assert!(both["load_h2"]["moved_on_goaway"].as_u64() > Some(0), "the HTTP/2 players moved too: {both}");
    let naive = row("UdpxRestart");
    assert!(naive["load"]["ended_early"].as_u64() > Some(0), "a restart breaks connections: {naive}");
    assert!(naive["downloads_broken"].as_u64() > Some(0), "and downloads: {naive}");
}

/// Runs a root-only lab of `udpx` with `args` (ending in `--json`): its JSON, or `None` after
/// recording the skip when `udpx` says SKIP (exit 4: a feature this machine lacks, here root).
fn root_lab(test: &str, args: &[&str]) -> Option<serde_json::Value> {
    let o = Command::new(env!("CARGO_BIN_EXE_udpx")).args(args).output().expect("run udpx");
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.code() == Some(4) {
        record_skip(test, err.trim());
        return None;
    }
    assert!(o.status.success(), "{err}");
    Some(serde_json::from_slice(&o.stdout).expect("one JSON object"))
}

/// `udpx bench h3 --connections`, small: a row per server (nginx's where installed) and client
/// (udpx's own and quic-go) and the idle row, every row's players established, and the udpx row carries its host's counts per
/// request over the window (read from its `/metrics`). Latency and CPU belong to the report.
#[test]
fn bench_h3_scale_rows_carry_the_hosts_counts() {
    let o = Command::new(env!("CARGO_BIN_EXE_udpx"))
        .args(["bench", "h3", "--connections", "50", "--idle", "100", "--interval", "1"])
        .args(["--ramp", "1", "--window", "2", "--keepalive", "0.2", "--json"])
        .output()
        .expect("run udpx");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let rows = json["h3_scale"]["rows"].as_array().expect("rows");
    // A row per server and client (udpx's own and the independent one where setup built it),
    // and the idle row.
    let left = json["h3_scale"]["left_out"].to_string();
    let servers = if left.contains("nginx") { 2 } else { 4 };
    let clients = if left.contains("independent client") { 1 } else { 2 };
    assert_eq!(rows.len(), servers * clients + 1, "{json}");
    for r in rows {
        assert_row_steal(r);
        let m = median_or_run("bench_h3_scale_rows_carry_the_hosts_counts", r);
        let want = r["connections"].as_u64().unwrap();
        assert_eq!(m["load"]["established"].as_u64(), Some(want), "{r}");
        if r["idle"] == false {
            // The server process's own CPU, to the nanosecond: a light row still reads above zero.
            assert!(m["server_process_s_per_gb"].as_f64() > Some(0.0), "{r}");
            // Every server sleeps between requests: woken at least once for some of them.
            assert!(m["server_switches_per_request"].as_f64() > Some(0.0), "{r}");
        }
        let host = &m["host"];
        if r["server"] == "Udpx" && r["idle"] == false {
            assert!(host["requests"].as_u64() > Some(0), "{r}");
            assert!(host["send_calls"].as_f64() > Some(0.0) && host["datagrams_per_send"].as_f64() >= Some(1.0), "{r}");
            assert!(host["recv_calls"].as_f64() > Some(0.0) && host["turns"].as_f64() > Some(0.0), "{r}");
        } else {
            assert!(host.is_null(), "only the udpx player row has them: {r}");
        }
    }
    // The idle row's floor: a bare echo server at the rate the udpx server received (100
    // connections, a PING each every 0.2 s: about 500 a second), every datagram answered.
    let floor = &json["h3_scale"]["idle_floor"];
    if Command::new("sockperf").arg("--version").output().is_err() {
        println!("SKIP (the floor part): sockperf not installed (scripts/setup.sh installs it)");
        return;
    }
    let errors = &json["h3_scale"]["idle_floor_errors"];
    // One round, and one extra at most when a row's run was stolen.
    let floors = floor.as_array().map_or(0, Vec::len);
    assert!((1..=2).contains(&floors), "one floor per round: {floor} {errors}");
    let f = &floor[0];
    assert_steal(f);
    let rate = f["rate"].as_u64().unwrap();
    assert!((250..=1_000).contains(&rate), "about 500 datagrams a second: {f}");
    let (sent, answered) = (f["sent"].as_u64().unwrap(), f["answered"].as_u64().unwrap());
    // Ping-pong: one datagram at a time, so at most the last is in flight when the client stops.
    assert!(sent > 0 && answered + 1 >= sent && answered <= sent, "every datagram answered: {f}");
}

/// `udpx bench h3 --connections --servers udpx,udpx-cache`: the `+cache` row serves the
/// segment every player fetches from its block cache, the plain row reads it per request
/// (the host's `http_file_bytes_read` over the window, per request).
#[test]
fn bench_h3_scale_cache_row_reads_the_segment_once() {
    let o = Command::new(env!("CARGO_BIN_EXE_udpx"))
        .args(["bench", "h3", "--connections", "50", "--idle", "0", "--interval", "1"])
        .args(["--ramp", "1", "--window", "2", "--servers", "udpx,udpx-cache", "--clients", "own"])
        .args(["--cache-size", "16M", "--json"])
        .output()
        .expect("run udpx");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(json["h3_scale"]["config"]["cache_size"].as_u64(), Some(16_000_000), "{json}");
    let segment = json["h3_scale"]["config"]["segment"].as_f64().unwrap();
    let rows = json["h3_scale"]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{json}");
    for r in rows {
        assert_row_steal(r);
        let m = median_or_run("bench_h3_scale_cache_row_reads_the_segment_once", r);
        assert_eq!(m["load"]["established"].as_u64(), Some(50), "{r}");
        let read = m["host"]["file_bytes_read"].as_f64().expect("the host's reads (http_file_bytes_read)");
        match r["server"].as_str() {
            // Halfway between the two: the window's edges (the client's count of requests and the
            // server's scrapes are not taken at the same instant) move either by a few requests.
            Some("Udpx") => assert!(read >= 0.5 * segment, "each request reads the file: {read} of {segment}: {r}"),
            Some("UdpxCache") => assert!(read < 0.5 * segment, "the cache serves the segment: {read}: {r}"),
            other => panic!("a row of {other:?}: {r}"),
        }
    }
}

/// One `udpx h3 serve --zerocopy <z>` run: `get`s `files` two at a time (two connections in
/// the same flushes), each compared with the file, then SIGTERM; returns the host's counters.
/// `memlock`: the server runs without CAP_IPC_LOCK and with RLIMIT_MEMLOCK 0, so every page
/// MSG_ZEROCOPY would pin is refused.
fn zerocopy_run(t: &Tmp, content: &[u8], z: &str, memlock: bool) -> serde_json::Value {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let (out, err) = (t.0.join(format!("serve-{z}.out")), t.0.join(format!("serve-{z}.err")));
    let mut cmd = if memlock {
        // setpriv executes udpx itself: the PID is the server's (for prlimit and SIGTERM).
        let mut c = Command::new("setpriv");
        c.args(["--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", env!("CARGO_BIN_EXE_udpx")]);
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_udpx"))
    };
    cmd.args(["h3", "serve", t.0.join("www").to_str().unwrap(), "--listen", &listen, "--shards", "1"])
        .args(["--zerocopy", z, "-l", "30"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let server = ChildGroup::spawn(&mut cmd).unwrap();
    if memlock {
        let pid = server.id().to_string();
        let o = Command::new("prlimit").args(["--pid", &pid, "--memlock=0:0"]).output().unwrap();
        assert!(o.status.success(), "prlimit: {}", String::from_utf8_lossy(&o.stderr));
    }
    wait_bound(port);
    let url = format!("https://{listen}/file");
    for pair in 0..2 {
        let gets: Vec<_> = (0..2)
            .map(|i| {
                let (url, got) = (url.clone(), t.0.join(format!("got-{z}-{pair}-{i}")));
                std::thread::spawn(move || (udpx(&["h3", "get", &url, "-o", got.to_str().unwrap()]), got))
            })
            .collect();
        for g in gets {
            let (o, got) = g.join().unwrap();
            assert!(o.status.success(), "get ({z}): {}", String::from_utf8_lossy(&o.stderr));
            assert!(std::fs::read(&got).unwrap() == content, "--zerocopy {z}: the body differs");
        }
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "server: {status}: {}", std::fs::read_to_string(&err).unwrap_or_default());
    let json: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    json["h3_serve"]["quic"].clone()
}

/// `--zerocopy`: the outbox writes into pooled buffers, large flushes go with MSG_ZEROCOPY,
/// and a buffer is written again only after the kernel's completions (every body compared,
/// two downloads at once). On loopback the kernel copies anyway: `auto` turns zerocopy off
/// (once), `always` keeps it on and every completion says copied. Past RLIMIT_MEMLOCK (no
/// CAP_IPC_LOCK) the kernel refuses each zerocopy call: each is sent by copying at once.
#[test]
fn zerocopy_serves_whole_files_and_copies_past_the_memlock_limit() {
    if !udpx::KernelCaps::get().zerocopy {
        return record_skip("zerocopy_serves_whole_files_and_copies_past_the_memlock_limit", "no SO_ZEROCOPY");
    }
    let t = tmp("zerocopy");
    let content: Vec<u8> = (0..8_000_017u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    std::fs::write(t.0.join("www/file"), &content).unwrap();
    let n = |c: &serde_json::Value, k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no {k}: {c}"));

    let c = zerocopy_run(&t, &content, "always", false);
    assert!(n(&c, "zerocopy_sends") > 0, "{c}");
    assert!(n(&c, "zerocopy_copied") > 0, "loopback copies: {c}");
    assert_eq!(n(&c, "zerocopy_turned_off"), 0, "{c}");

    let c = zerocopy_run(&t, &content, "auto", false);
    assert_eq!(n(&c, "zerocopy_turned_off"), 1, "loopback copies, so auto turns it off: {c}");

    let c = zerocopy_run(&t, &content, "off", false);
    assert_eq!(n(&c, "zerocopy_sends"), 0, "{c}");

    let tools = ["setpriv", "prlimit"].iter().all(|p| Command::new(p).arg("--version").output().is_ok());
    if !udpx_lab::netns::is_root() || !tools {
        return record_skip(
            "zerocopy_serves_whole_files_and_copies_past_the_memlock_limit (RLIMIT_MEMLOCK part)",
            "needs root, setpriv and prlimit (util-linux)",
        );
    }
    let c = zerocopy_run(&t, &content, "always", true);
    assert!(n(&c, "zerocopy_refused") > 0, "every pinned page is past the limit: {c}");
    assert_eq!(n(&c, "zerocopy_sends"), 0, "{c}");
}

/// `--key-file` must be the owner's alone (refused, exit 2, saying to chmod 600); SIGHUP reads
/// `--removed-hosts` again: a good file replaces the set (logged), a bad one keeps the old set
/// (logged with why), and the server serves on either way.
#[test]
fn sighup_reads_the_removed_hosts_again_and_a_shared_key_file_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let t = tmp("sighup");
    std::fs::write(t.0.join("www/file"), b"hello").unwrap();
    let key = t.0.join("service.key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let removed = t.0.join("removed-hosts");
    std::fs::write(&removed, "2\n").unwrap();
    let www = t.0.join("www");
    let (www_s, key_s, removed_s) = (www.to_str().unwrap(), key.to_str().unwrap(), removed.to_str().unwrap());
    let o = udpx(&["h3", "serve", www_s, "--key-file", key_s, "--removed-hosts", removed_s, "-l", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let log = t.0.join("serve.err");
    let server = ChildGroup::spawn(
        Command::new(env!("CARGO_BIN_EXE_udpx"))
            .args(["h3", "serve", www_s, "--listen", &listen, "--shards", "1", "-l", "20"])
            .args(["--key-file", key_s, "--removed-hosts", removed_s])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    )
    .unwrap();
    wait_bound(port);
    let hup_and_wait_for = |needle: &str| {
        let _ = Command::new("kill").args(["-HUP", &server.id().to_string()]).status();
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(needle) {
                return text;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "{needle:?} not in {text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    std::fs::write(&removed, "2, 0x0003\n").unwrap();
    hup_and_wait_for("removed hosts now [2, 3]");
    std::fs::write(&removed, "not a host\n").unwrap();
    let text = hup_and_wait_for("the removed hosts stay [2, 3]");
    assert!(text.contains("is not a host ID"), "{text}");
    // Read while half-written (`0x0012` cut to `0x00` would name another host): refused whole.
    std::fs::write(&removed, "2, 0x0003\n0x00").unwrap();
    let text = hup_and_wait_for("half-written");
    assert!(!text.contains("removed hosts now [0, 2, 3]"), "{text}");
    let o = udpx(&["h3", "get", &format!("https://{listen}/file")]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("status 200"), "served on after both");
    println!("sighup: {}", text.lines().filter(|l| l.contains("SIGHUP")).collect::<Vec<_>>().join(" / "));
}

/// The upgrade in place: SIGUSR2 starts this program again with the same arguments and
/// `--upgrade`; the new process takes the port over (a GET after it is answered), the old one
/// hands over, drains and exits 0 by itself. Needs eBPF steering (root); SKIP otherwise.
#[test]
fn sigusr2_upgrades_in_place() {
    let t = tmp("usr2");
    std::fs::write(t.0.join("www/file"), b"hello").unwrap();
    let www = t.0.join("www");
    let sock = t.0.join("handover.sock");
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let log = t.0.join("serve.err");
    // The metrics port is the old process's until it exits: the upgrade goes on without it.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    // The new process is the old one's child, in its process group: the guard ends both.
    let server = ChildGroup::spawn(
        Command::new(env!("CARGO_BIN_EXE_udpx"))
            .args(["h3", "serve", www.to_str().unwrap(), "--listen", &listen, "--shards", "1", "-l", "30"])
            .args(["--drain-timeout", "10", "--upgrade-socket", sock.to_str().unwrap(), "--metrics", &metrics])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    )
    .unwrap();
    wait_bound(port);
    let wait_for_line = |needle: &str| {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(needle) {
                return text;
            }
            assert!(start.elapsed() < Duration::from_secs(15), "{needle:?} not in {text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let text = wait_for_line("udpx h3 serve: ");
    if let Some(l) = text.lines().find(|l| l.contains("upgrades unavailable")) {
        record_skip("sigusr2_upgrades_in_place", l);
        return;
    }
    wait_for_line("an upgrade (--upgrade) takes over");
    let _ = Command::new("kill").args(["-USR2", &server.id().to_string()]).status();
    wait_for_line("generation 1 took new connections over");
    // The new process tries the metrics port just after its takeover line: it is the old
    // one's while that one still runs (the usual case: "taken then"), or free if the old one
    // already drained and exited (a loaded machine). Either way the new process serves on.
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("taken then") || text.matches("metrics on http").count() >= 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "the new process did not try the metrics port: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = udpx(&["h3", "get", &format!("https://{listen}/file")]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("status 200"), "served after the upgrade");
    // The old process drains and exits by itself; its successor (in its process group, which
    // the guard's wait kills) then takes the metrics port, retried every second. The old one
    // is watched as a zombie, not reaped, until the port is the successor's.
    let start = Instant::now();
    let stat = format!("/proc/{}/stat", server.id());
    while std::fs::read_to_string(&stat).ok().and_then(|s| s.rsplit(") ").next().map(|r| r.starts_with('Z')))
        != Some(true)
    {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(start.elapsed() < Duration::from_secs(20), "the old process did not exit by itself: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let start = Instant::now();
    loop {
        let answer = udpx_metrics::scrape(metrics.parse().expect("an address")).unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(start.elapsed() < Duration::from_secs(10), "the successor never served metrics: {text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = server.wait_timeout(Duration::from_secs(5)).unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "the old process exits by itself: {text}");
    assert!(text.contains("SIGUSR2: started") && text.contains("drained after the handover"), "{text}");
    assert!(text.matches("metrics on http").count() == 2, "the successor said it took the port: {text}");
}

/// The graceful stop from the command line: SIGTERM drains (the log says so, with what was
/// drained), and the process ends by itself once no connection is left; SIGQUIT is taken the
/// same way.
#[test]
fn sigterm_drains_and_exits() {
    let t = tmp("drain");
    std::fs::write(t.0.join("www/file"), b"hello").unwrap();
    let www = t.0.join("www");
    let www_s = www.to_str().unwrap();
    let start_server = |log: &std::path::Path| {
        let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listen = format!("127.0.0.1:{port}");
        let server = ChildGroup::spawn(
            Command::new(env!("CARGO_BIN_EXE_udpx"))
                .args(["h3", "serve", www_s, "--listen", &listen, "--shards", "2", "-l", "30", "--drain-timeout", "20"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(log).unwrap()),
        )
        .unwrap();
        wait_bound(port);
        (server, listen)
    };
    let log = t.0.join("serve.err");
    let (server, listen) = start_server(&log);
    let o = udpx(&["h3", "get", &format!("https://{listen}/file")]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("status 200"), "served before the drain");
    let _ = Command::new("kill").args(["-TERM", &server.id().to_string()]).status();
    // No connection is open (the GET's client closed its own): the drain ends at once.
    let status = server.wait_timeout(Duration::from_secs(15)).unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{text}");
    assert!(text.contains("draining") && text.contains("drained in"), "{text}");

    // SIGQUIT drains too (its default action would end the process with a core dump), and
    // SIGINT after it stops at once: the process exits 0 either way.
    let log = t.0.join("serve2.err");
    let (server, _) = start_server(&log);
    let _ = Command::new("kill").args(["-QUIT", &server.id().to_string()]).status();
    let _ = Command::new("kill").args(["-INT", &server.id().to_string()]).status();
    let status = server.wait_timeout(Duration::from_secs(15)).unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{text}");
}

/// Under systemd (`Type=notify-reload`): the server says READY=1 once it serves, RELOADING=1
/// with MONOTONIC_USEC then READY=1 around a SIGHUP, and STOPPING=1 when SIGTERM starts the
/// drain. `NOTIFY_SOCKET` is a datagram socket this test binds.
#[test]
fn systemd_hears_ready_reloading_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let t = tmp("notify");
    let sock_path = t.0.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let next = || {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("a notification within 10 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let www = t.0.join("www");
    let server = ChildGroup::spawn(
        Command::new(env!("CARGO_BIN_EXE_udpx"))
            .args(["h3", "serve", www.to_str().unwrap(), "--listen", &listen, "--shards", "1", "-l", "30"])
            .env("NOTIFY_SOCKET", &sock_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    let ready = next();
    assert!(ready.starts_with("READY=1\nSTATUS=serving"), "{ready:?}");
    let _ = Command::new("kill").args(["-HUP", &server.id().to_string()]).status();
    let reloading = next();
    let usec = reloading.strip_prefix("RELOADING=1\nMONOTONIC_USEC=").and_then(|u| u.parse::<u64>().ok());
    assert!(usec.is_some_and(|u| u > 0), "{reloading:?}");
    assert!(next().starts_with("READY=1"), "ready again after the reload");
    let _ = Command::new("kill").args(["-TERM", &server.id().to_string()]).status();
    let stopping = next();
    assert!(stopping.starts_with("STOPPING=1"), "{stopping:?}");
    let status = server.wait_timeout(Duration::from_secs(15)).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0));
}
