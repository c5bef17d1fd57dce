//! `udpx h3` as a user runs it: bad input exits 2 with a message naming what to change; the
//! server started as a program serves `udpx h3 get` and (when installed) ngtcp2's
//! gtlsclient, and prints its JSON counters when it stops. Every process started is in a
//! ChildGroup (killed on drop, also when an assertion fails) and bounded by `-l`.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use udpx_lab::netns::{record_skip, ChildGroup};

use common::udpx;

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
        (&["h3", "get", "http://127.0.0.1/"], "https://"),
        (&["h3", "get", "https://127.0.0.1:99999/"], "port"),
        (&["h3", "get", "https://127.0.0.1:1/", "-o", "/nonexistent-dir/x"], "output file"),
    ];
    common::assert_usage_errors(cases);
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
    let up = Instant::now();
    while std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
        assert!(up.elapsed() < Duration::from_secs(10), "server did not bind");
        std::thread::sleep(Duration::from_millis(20));
    }
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
        (&["bench", "h3", "--warp"], "--warp"),
        (&["bench", "h3", "--veth", "--loopback"], "--loopback"),
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
    let b = &json["h3_bench"];
    assert_eq!(b["rows"].as_array().map(Vec::len), Some(5), "the udpx h3 get rows only: {b}");
    assert_eq!(b["left_out"].as_array().map(Vec::len), Some(2), "{b}");
}
