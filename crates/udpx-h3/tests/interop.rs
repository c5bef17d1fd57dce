//! Interoperability with ngtcp2 (Debian's `ngtcp2-client` and `ngtcp2-server`, C with GnuTLS:
//! implementations nobody here wrote): `gtlsclient` downloads from `udpx_h3::serve` in every
//! I/O mode, and `udpx_h3::get` downloads from `gtlsserver`. A missing program is a SKIP,
//! printed and recorded, never a silent pass. Every program started runs in a
//! [`ChildGroup`], killed on drop (also when an assertion fails), and is given a deadline.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{digest, start, Site, TempDir};
use udpx_h3::{get, GetConfig};
use udpx_lab::netns::ChildGroup;
use udpx_quic::IoMode;

const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `cmd` in its own process group until it exits or the deadline passes (then it is
/// killed and the test fails); returns its exit status and its output (stdout + stderr,
/// captured to a file so a chatty peer never blocks on a full pipe).
fn run_bounded(cmd: &mut Command, log: &Path) -> (std::process::ExitStatus, String) {
    let f = std::fs::File::create(log).unwrap();
    cmd.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f);
    let g = ChildGroup::spawn(cmd).expect("spawn peer");
    let start = Instant::now();
    loop {
        // ChildGroup has no try_wait: look at /proc for the leader's state.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", g.id())).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start().chars().next();
        if matches!(state, Some('Z') | None) {
            let status = g.wait().expect("wait for peer");
            let out = std::fs::read_to_string(log).unwrap_or_default();
            return (status, out);
        }
        if start.elapsed() > DEADLINE {
            let out = std::fs::read_to_string(log).unwrap_or_default();
            drop(g);
            panic!("{cmd:?} still running after {DEADLINE:?}; its output ends:\n{}", tail(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[test]
fn gtlsclient_downloads_in_every_io_mode() {
    let Some(client) = common::ngtcp2("gtlsclient", "gtlsclient_downloads_in_every_io_mode") else { return };
    let site = Site::new("gtlsclient");
    for io in IoMode::ALL {
        let server = start(&site, io, 2);
        let port = server.local_addr().port();
        let out = TempDir::new("gtlsclient-out");
        let uris: Vec<String> =
            ["empty", "small", "big"].iter().map(|n| format!("https://127.0.0.1:{port}/{n}")).collect();
        let (status, log) = run_bounded(
            Command::new(&client)
                .args(["-q", "--exit-on-all-streams-close", "--timeout=20s"])
                .arg(format!("--download={}", out.path().display()))
                .args(["127.0.0.1", &port.to_string()])
                .args(&uris),
            &out.path().join("gtlsclient.log"),
        );
        assert!(status.success(), "gtlsclient ({io}) failed: {status}\n{}", tail(&log));
        for name in ["empty", "small", "big"] {
            let got = std::fs::read(out.path().join(name))
                .unwrap_or_else(|e| panic!("{io}: {name} not downloaded: {e}\n{}", tail(&log)));
            assert_eq!(
                (got.len(), digest(&got)),
                (site.file(name).len(), digest(&site.file(name))),
                "{io}: {name} differs"
            );
        }
        let c = server.stop().unwrap();
        eprintln!(
            "gtlsclient {io}: packets/call {:.2}, GSO runs {}, lost {}",
            c.quic.packets_per_call, c.quic.gso_runs, c.quic.lost_packets
        );
        assert_eq!(c.http.ok, 3, "{io}");
        assert_eq!(c.quic.dropped_unknown_cid, 0, "{io}: a packet reached a shard without its connection");
    }
}

#[test]
fn gtlsclient_fifty_streams_on_one_connection() {
    let Some(client) = common::ngtcp2("gtlsclient", "gtlsclient_fifty_streams_on_one_connection") else { return };
    let site = Site::new("gtlsstreams");
    let many = site.root.join("many");
    std::fs::create_dir_all(&many).unwrap();
    let files: Vec<(String, Vec<u8>)> =
        (0..50).map(|i| (format!("f{i}"), common::content(1000 + i * 7919, 100 + i as u64))).collect();
    for (name, data) in &files {
        std::fs::write(many.join(name), data).unwrap();
    }
    let server = start(&site, IoMode::GsoMmsg, 2);
    let port = server.local_addr().port();
    let out = TempDir::new("gtlsstreams-out");
    let uris: Vec<String> = files.iter().map(|(n, _)| format!("https://127.0.0.1:{port}/many/{n}")).collect();
    let (status, log) = run_bounded(
        Command::new(&client)
            .args(["-q", "--exit-on-all-streams-close", "--timeout=20s"])
            .arg(format!("--download={}", out.path().display()))
            .args(["127.0.0.1", &port.to_string()])
            .args(&uris),
        &out.path().join("gtlsclient.log"),
    );
    assert!(status.success(), "gtlsclient failed: {status}\n{}", tail(&log));
    for (name, data) in &files {
        let got = std::fs::read(out.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}\n{}", tail(&log)));
        assert_eq!(digest(&got), digest(data), "{name} differs");
    }
    let c = server.stop().unwrap();
    assert_eq!((c.http.ok, c.quic.connections), (50, 1), "50 streams on one connection");
}

#[test]
fn gtlsclient_with_small_flow_control_windows() {
    let Some(client) = common::ngtcp2("gtlsclient", "gtlsclient_with_small_flow_control_windows") else { return };
    // 10 MB through a 64 KiB stream window and a 128 KiB connection window: the server must
    // wait for every MAX_STREAM_DATA and never send past it (ngtcp2 closes the connection
    // with FLOW_CONTROL_ERROR if it does).
    let site = Site::new("gtlswindow");
    let server = start(&site, IoMode::GsoMmsg, 1);
    let port = server.local_addr().port();
    let out = TempDir::new("gtlswindow-out");
    let (status, log) = run_bounded(
        Command::new(&client)
            .args(["-q", "--exit-on-all-streams-close", "--timeout=20s"])
            .args(["--max-stream-data-bidi-local=64K", "--max-data=128K"])
            .arg(format!("--download={}", out.path().display()))
            .args(["127.0.0.1", &port.to_string(), &format!("https://127.0.0.1:{port}/big")]),
        &out.path().join("gtlsclient.log"),
    );
    assert!(status.success(), "gtlsclient failed: {status}\n{}", tail(&log));
    let got = std::fs::read(out.path().join("big")).unwrap();
    assert_eq!(digest(&got), digest(&site.file("big")), "content differs");
    server.stop().unwrap();
}

#[test]
fn gtlsclient_head_and_post() {
    let Some(client) = common::ngtcp2("gtlsclient", "gtlsclient_head_and_post") else { return };
    let site = Site::new("gtlsmethods");
    let server = start(&site, IoMode::GsoMmsg, 1);
    let port = server.local_addr().port();
    let out = TempDir::new("gtlsmethods-out");
    for method in ["HEAD", "POST"] {
        let (status, log) =
            run_bounded(
                Command::new(&client)
                    .args(["-q", "--exit-on-all-streams-close", "--timeout=20s", "-m", method])
                    .args(["127.0.0.1", &port.to_string(), &format!("https://127.0.0.1:{port}/big")]),
                &out.path().join("log"),
            );
        assert!(status.success(), "gtlsclient -m {method}: {status}\n{}", tail(&log));
    }
    let c = server.stop().unwrap();
    assert_eq!((c.http.ok, c.http.method_not_allowed), (1, 1));
    assert!(c.quic.bytes_sent < 1_000_000, "HEAD sent a body: {} bytes", c.quic.bytes_sent);
}

#[test]
fn get_downloads_from_gtlsserver() {
    let Some(server) = common::ngtcp2("gtlsserver", "get_downloads_from_gtlsserver") else { return };
    let site = Site::new("gtlsserver");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (site.tmp.path().join("cert.pem"), site.tmp.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    // A free port: bound and released, then taken by gtlsserver.
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = site.tmp.path().join("gtlsserver.log");
    let f = std::fs::File::create(&log).unwrap();
    let _peer = ChildGroup::spawn(
        Command::new(&server)
            .args(["-q", "--no-quic-dump", "--no-http-dump"])
            .arg(format!("--htdocs={}", site.root.display()))
            .args(["127.0.0.1", &port.to_string()])
            .args([&key, &cert])
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f),
    )
    .expect("spawn gtlsserver");
    // Up once its port is taken.
    let up = Instant::now();
    while std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "gtlsserver did not bind: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = TempDir::new("gtlsserver-out");
    for io in [IoMode::Sendmsg, IoMode::GsoMmsg] {
        for name in ["small", "big"] {
            let dst = out.path().join(name);
            let r =
                get(&format!("https://127.0.0.1:{port}/{name}"), Some(&dst), &GetConfig { io, ..GetConfig::default() })
                    .unwrap_or_else(|e| {
                        panic!(
                            "get {name} from gtlsserver ({io}): {e}\n{}",
                            tail(&std::fs::read_to_string(&log).unwrap_or_default())
                        )
                    });
            assert_eq!(r.status, 200);
            let got = std::fs::read(&dst).unwrap();
            assert_eq!(digest(&got), digest(&site.file(name)), "{name} from gtlsserver differs");
            eprintln!("gtlsserver {io} {name}: {r}");
        }
    }
}
