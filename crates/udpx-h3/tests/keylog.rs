//! The TLS key log (`--keylog-file`, `udpx_quic::keylog`) decrypts a real capture: a download
//! over HTTP/3 and one over HTTP/2 (HTTPS over TCP) from one server, captured on loopback with
//! dumpcap (or tcpdump), then read back by tshark. With the server's key log tshark sees the
//! request path of both; without it, of neither (the proof that the test can fail).
//!
//! Needs root (capturing) and tshark (Debian's `tshark`, installed by scripts/setup.sh); without
//! either the test prints `SKIP: <why>` and records the skip. Every process it starts is in a
//! group of its own, bounded in time and killed on drop.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::tls::h2_tls;
use common::{content, TempDir};
use udpx_h3::{get, serve, GetConfig, ServeConfig};
use udpx_lab::netns::{find_in_path, record_skip, ChildGroup};
use udpx_quic::{IoMode, KeyLog};

/// The file's name: QPACK would Huffman-code a path of letters (quiche's encoder does when it
/// is shorter), and tshark 4.0 does not decode QPACK; each `~` takes 13 bits in Huffman code, so
/// this path goes as it is, and its bytes are visible in the decrypted QUIC stream data. (HPACK
/// is decoded by tshark: `http2.headers.path`.)
const PATH: &str = "/~k~e~y~l~o~g~";

/// How long a capture or a tshark run may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `cmd` to its end within [`DEADLINE`] (its group killed past it), standard output to
/// `out`; fails the test when it fails.
fn run(cmd: &mut Command, out: &Path) {
    let err = out.with_extension("err");
    cmd.stdin(Stdio::null()).stdout(std::fs::File::create(out).unwrap()).stderr(std::fs::File::create(&err).unwrap());
    let shown = format!("{cmd:?}");
    let g = ChildGroup::spawn(cmd).unwrap_or_else(|e| panic!("{shown}: {e}"));
    let status = g.wait_timeout(DEADLINE).unwrap().unwrap_or_else(|| panic!("{shown} ran past {DEADLINE:?}"));
    assert!(status.success(), "{shown}: {status}: {}", std::fs::read_to_string(&err).unwrap_or_default());
}

/// A capture of loopback traffic to the ports in `filter`, until [`Capture::stop`].
struct Capture {
    group: ChildGroup,
    file: PathBuf,
}

impl Capture {
    /// dumpcap (tshark's capture program) or tcpdump on `lo`; returns once it captures.
    fn start(dir: &Path, filter: &str) -> Capture {
        let file = dir.join("capture.pcap");
        let err = dir.join("capture.err");
        let mut cmd = match find_in_path("dumpcap") {
            Some(d) => {
                let mut c = Command::new(d);
                c.args(["-q", "-i", "lo", "-P", "-f", filter, "-w"]).arg(&file);
                c
            }
            None => {
                let mut c = Command::new(find_in_path("tcpdump").expect("dumpcap or tcpdump"));
                c.args(["-i", "lo", "-U", "-s", "0", "-w"]).arg(&file).arg(filter);
                c
            }
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&err).unwrap());
        let group = ChildGroup::spawn(&mut cmd).expect("start the capture");
        let start = Instant::now();
        // Both say so on standard error once the capture is open ("Capturing on 'Loopback: lo'",
        // "listening on lo").
        let said = || std::fs::read_to_string(&err).unwrap_or_default();
        while !["Capturing on", "listening on"].iter().any(|m| said().contains(m)) {
            assert!(start.elapsed() < Duration::from_secs(20), "the capture did not start: {}", said());
            assert!(udpx_lab::netns::is_running(group.id()), "the capture ended: {}", said());
            std::thread::sleep(Duration::from_millis(20));
        }
        // The filter is attached before the message; a moment more for the socket's ring.
        std::thread::sleep(Duration::from_millis(300));
        Capture { group, file }
    }

    /// Ends the capture (SIGINT: the file is completed) and returns it.
    fn stop(self) -> PathBuf {
        // A moment for the last packets to be read from the ring.
        std::thread::sleep(Duration::from_millis(300));
        let pid = nix::unistd::Pid::from_raw(self.group.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let _ = self.group.wait_timeout(Duration::from_secs(10));
        self.file
    }
}

/// What tshark decodes of `capture` with `keylog` (or none): the bytes of every decrypted QUIC
/// stream frame, and the paths of HTTP/2 requests. `tcp_port`: where TLS is (not 443).
fn decode(
    tshark: &Path,
    capture: &Path,
    keylog: Option<&Path>,
    tcp_port: u16,
    out: &Path,
) -> (Vec<Vec<u8>>, Vec<String>) {
    let mut cmd = Command::new(tshark);
    let keys = keylog.map(|k| k.display().to_string()).unwrap_or_default();
    cmd.arg("-r")
        .arg(capture)
        .args(["-n", "-2", "-o"])
        .arg(format!("tls.keylog_file:{keys}"))
        .args(["-d", &format!("tcp.port=={tcp_port},tls")])
        .args(["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,"])
        .args(["-e", "quic.stream_data", "-e", "http2.headers.path"]);
    run(&mut cmd, out);
    let text = std::fs::read_to_string(out).unwrap();
    let (mut streams, mut paths) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let (quic, h2) = line.split_once('\t').unwrap_or((line, ""));
        for hex in quic.split(',').filter(|h| !h.is_empty()) {
            let hex = hex.replace(':', "");
            let bytes =
                (0..hex.len() / 2).filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect();
            streams.push(bytes);
        }
        paths.extend(h2.split(',').filter(|p| !p.is_empty()).map(str::to_owned));
    }
    (streams, paths)
}

#[test]
fn tshark_decrypts_a_capture_of_http3_and_http2_with_the_key_log() {
    let Some(tshark) = find_in_path("tshark") else {
        record_skip("key log decryption", "no tshark (Debian's tshark; scripts/setup.sh installs it)");
        return;
    };
    if !nix::unistd::geteuid().is_root() {
        record_skip("key log decryption", "not root: capturing on loopback needs it");
        return;
    }
    if find_in_path("dumpcap").is_none() && find_in_path("tcpdump").is_none() {
        record_skip("key log decryption", "neither dumpcap nor tcpdump to capture with");
        return;
    }
    let tmp = TempDir::new("keylog");
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let body = content(50_000, 11);
    std::fs::write(www.join(&PATH[1..]), &body).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (tmp.path().join("cert.pem"), tmp.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let keys = tmp.path().join("keys.log");
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = udpx_h3::Tls::Files { cert: cert.clone(), key };
    cfg.alt_svc_tcp = Some("127.0.0.1:0".parse().unwrap());
    // One packet per datagram on the wire (a GSO train on loopback is captured as one datagram,
    // which tshark would take for one packet).
    cfg.quic.io = IoMode::Sendmsg;
    cfg.quic.host.keylog = Some(KeyLog::open(&keys, udpx_quic::keylog::DEFAULT_MAX_BYTES).unwrap());
    let server = serve(&www, &cfg).expect("server starts");
    let (udp, tcp) = (server.local_addr().port(), server.tcp_addr().unwrap());
    let capture = Capture::start(tmp.path(), &format!("udp port {udp} or tcp port {}", tcp.port()));

    // HTTP/3.
    let url = format!("https://127.0.0.1:{udp}{PATH}");
    let out = tmp.path().join("h3-body");
    let get_cfg = GetConfig { io: IoMode::Sendmsg, ..GetConfig::default() };
    let r = get(&url, Some(&out), &get_cfg).unwrap();
    assert_eq!(r.status, 200);
    assert!(std::fs::read(&out).unwrap() == body);
    // HTTP/2 over TLS.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (status, got) = rt.block_on(async move {
        let tls = h2_tls(&cert, tcp).await;
        let (mut client, conn) = h2::client::handshake(tls).await.unwrap();
        let conn = tokio::spawn(conn);
        let req = http::Request::builder().uri(format!("https://127.0.0.1{PATH}")).body(()).unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        let status = resp.status().as_u16();
        let mut b = resp.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = b.data().await {
            let chunk = chunk.unwrap();
            let _ = b.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        drop(client);
        let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
        (status, got)
    });
    assert_eq!(status, 200);
    assert!(got == body);
    let file = capture.stop();
    drop(server);

    let lines = std::fs::read_to_string(&keys).unwrap();
    for label in ["CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_TRAFFIC_SECRET_0"] {
        assert!(lines.lines().filter(|l| l.starts_with(label)).count() >= 2, "{label} of both connections: {lines}");
    }
    let seen = |(streams, paths): &(Vec<Vec<u8>>, Vec<String>)| {
        let h3 = streams.iter().any(|s| s.windows(PATH.len()).any(|w| w == PATH.as_bytes()));
        let h2 = paths.iter().any(|p| p == PATH);
        (h3, h2)
    };
    let with = decode(&tshark, &file, Some(&keys), tcp.port(), &tmp.path().join("with.txt"));
    let without = decode(&tshark, &file, None, tcp.port(), &tmp.path().join("without.txt"));
    assert_eq!(
        seen(&without),
        (false, false),
        "without the key log nothing is decrypted ({} QUIC stream frames)",
        without.0.len()
    );
    assert_eq!(
        seen(&with),
        (true, true),
        "the request path over HTTP/3 and over HTTP/2, decrypted with the key log ({} QUIC stream frames, HTTP/2 \
         paths {:?})",
        with.0.len(),
        with.1
    );
}
