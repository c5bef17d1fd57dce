//! The peers of `udpx bench h3` that run as child processes (gtlsclient; nginx and curl). (The
//! CPU time of a server read from `/proc` is `udpx_lab::task`.)

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use udpx_lab::cpu::TickRate;
use udpx_lab::netns::{ChildGroup, Napi, Profile, Side, TestNet, TestNetConfig};

use super::config::{ClientKind, H3BenchConfig, FILE};
use super::place::{Place, ServerMeter};
use super::runs::{measured, H3Run};
use crate::lab::process::{exited, run_bounded};
use crate::lab::receive_on_own_cpus;

/// gtlsclient downloads `url` into a directory of its own; returns (bytes, seconds).
pub(super) fn gtlsclient(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    addr: SocketAddr,
    url: &str,
) -> Result<(u64, f64), String> {
    let prog = cfg.programs.gtlsclient.as_deref().ok_or("gtlsclient not found")?;
    let out = dir.join("gtlsclient-out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let log = dir.join("gtlsclient.log");
    let mut cmd = place.command(place.client_ns(), place.client_cpu, prog);
    cmd.args(["-q", "--exit-on-all-streams-close", "--timeout=20s"])
        .arg(format!("--download={}", out.display()))
        .args([addr.ip().to_string(), addr.port().to_string(), url.to_string()]);
    let start = Instant::now();
    let status = run_bounded(&mut cmd, &log, cfg.deadline());
    let seconds = start.elapsed().as_secs_f64();
    let got = std::fs::metadata(out.join(FILE)).map(|m| m.len());
    let _ = std::fs::remove_dir_all(&out);
    status.map_err(|e| format!("gtlsclient: {e}"))?;
    let bytes = got.map_err(|e| format!("gtlsclient saved no file: {e}"))?;
    Ok((bytes, seconds))
}

/// The independent client (`udpx-quicgo-load --get`) downloads the file once from `addr` over
/// `proto`: its bytes and seconds (a status other than 200 or a short body is an error).
pub(super) fn independent(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    addr: SocketAddr,
    proto: crate::clients::quicgo::Proto,
) -> Result<(u64, f64), String> {
    let prog = cfg.programs.independent.as_deref().ok_or("the independent client not found")?;
    let cmd = place.command(place.client_ns(), place.client_cpu, prog);
    let r = crate::clients::quicgo::get(cmd, addr, &format!("/{FILE}"), proto, cfg.deadline())?;
    if r.status != 200 || r.bytes != cfg.size {
        return Err(format!("{}: HTTP {}, {} bytes; the file has {}", r.client, r.status, r.bytes, cfg.size));
    }
    if r.packets_received > 0 {
        log::info!(
            "{}: {} packets sent per {} received ({:.3})",
            r.client,
            r.packets_sent,
            r.packets_received,
            r.packets_sent as f64 / r.packets_received as f64
        );
    }
    Ok((r.bytes, r.seconds))
}

/// nginx serves the file over HTTPS (TLS 1.3) and curl downloads it.
pub(super) fn nginx_run(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    (cert, key, pin): (&Path, &Path, &str),
    client: ClientKind,
    rate: TickRate,
) -> Result<H3Run, String> {
    let (Some(nginx), Some(curl)) = (cfg.programs.nginx.as_deref(), cfg.programs.curl.as_deref()) else {
        return Err("nginx or curl not found".into());
    };
    let port = free_tcp_port(place)?;
    let ndir = dir.join("nginx");
    let _ = std::fs::remove_dir_all(&ndir);
    std::fs::create_dir_all(&ndir).map_err(|e| format!("{}: {e}", ndir.display()))?;
    let conf = nginx_conf(&ndir, &dir.join("www"), SocketAddr::new(place.server_ip, port), cert, key);
    std::fs::write(ndir.join("nginx.conf"), conf).map_err(|e| format!("nginx.conf: {e}"))?;
    let log = std::fs::File::create(ndir.join("stderr.log")).map_err(|e| e.to_string())?;
    let mut cmd = place.command(place.server_ns(), place.server_cpu, nginx);
    cmd.arg("-p")
        .arg(&ndir)
        .arg("-c")
        .arg(ndir.join("nginx.conf"))
        .arg("-e")
        .arg(ndir.join("error.log"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    let server = ChildGroup::spawn(&mut cmd).map_err(|e| format!("starting nginx: {e}"))?;
    let addr = SocketAddr::new(place.server_ip, port);
    wait_listening(place, addr, &server).map_err(|e| {
        let err = std::fs::read_to_string(ndir.join("error.log")).unwrap_or_default();
        let out = std::fs::read_to_string(ndir.join("stderr.log")).unwrap_or_default();
        format!("nginx: {e}: {}{}", out.trim(), err.trim())
    })?;
    let task = [format!("/proc/{}", server.id())];
    if matches!(client, ClientKind::Chromium | ClientKind::Independent) {
        let meter = ServerMeter::start(task.to_vec(), place, rate);
        let got = match client {
            ClientKind::Chromium => {
                super::browser::fetch(cfg, place, dir, addr, false, pin).map(|f| (f.bytes, f.seconds))
            }
            _ => independent(cfg, place, addr, crate::clients::quicgo::Proto::H2),
        };
        let cost = meter.stop();
        drop(server);
        let (bytes, seconds) = got?;
        let Some(cost) = cost else {
            return Err("nginx's /proc/PID or /proc/stat could not be read".into());
        };
        return Ok(measured(cost, bytes, seconds));
    }
    let url = format!("https://{addr}/{FILE}");
    let out = ndir.join("curl.out");
    let mut c = place.command(place.client_ns(), place.client_cpu, curl);
    c.args(["-k", "-s", "-S", "--http1.1", "--tlsv1.3", "-o", "/dev/null", "-w", "%{size_download} %{http_code}"])
        .args(["--max-time", &cfg.deadline().as_secs().to_string(), &url]);
    let meter = ServerMeter::start(task.to_vec(), place, rate);
    let start = Instant::now();
    let status = run_bounded(&mut c, &out, cfg.deadline() + Duration::from_secs(5));
    let seconds = start.elapsed().as_secs_f64();
    let cost = meter.stop();
    drop(server);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    status.map_err(|e| format!("curl: {e}: {}", text.trim()))?;
    let mut it = text.split_whitespace();
    let bytes: u64 = it.next().and_then(|b| b.parse().ok()).ok_or_else(|| format!("curl said {text:?}"))?;
    let code = it.next().unwrap_or("?");
    if code != "200" || bytes != cfg.size {
        return Err(format!("curl: HTTP {code}, {bytes} bytes; the file has {}", cfg.size));
    }
    let Some(cost) = cost else {
        return Err("nginx's /proc/PID or /proc/stat could not be read".into());
    };
    Ok(measured(cost, bytes, seconds))
}

/// `udpx h3 quinn-serve` (quinn with h3, a child process under `taskset`) serves the file and
/// `udpx h3 get` downloads it.
pub(super) fn quinn_run(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    (cert, key): (&Path, &Path),
    rate: TickRate,
) -> Result<H3Run, String> {
    let udpx = cfg.programs.udpx.as_deref().ok_or("no udpx binary")?;
    let ip = place.server_ip;
    let port = place.run_on(place.server_ns(), place.server_cpu, move || {
        std::net::UdpSocket::bind((ip, 0)).and_then(|s| s.local_addr()).map(|a| a.port())
    })?;
    let port = port.map_err(|e| format!("a free UDP port: {e}"))?;
    let addr = SocketAddr::new(ip, port);
    let logp = dir.join("quinn.log");
    let log = std::fs::File::create(&logp).map_err(|e| e.to_string())?;
    let mut cmd = place.command(place.server_ns(), place.server_cpu, udpx);
    cmd.args(["h3", "quinn-serve"])
        .arg(dir.join("www"))
        .args(["--listen", &addr.to_string(), "--cert"])
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["-l", &(cfg.deadline().as_secs() + 10).to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    let server = ChildGroup::spawn(&mut cmd).map_err(|e| format!("starting quinn-serve: {e}"))?;
    let start = Instant::now();
    while !std::fs::read_to_string(&logp).unwrap_or_default().contains(" on https://") {
        if exited(server.id()) || start.elapsed() > Duration::from_secs(10) {
            return Err(format!("quinn-serve did not start: {}", std::fs::read_to_string(&logp).unwrap_or_default()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Every thread of the process (its runtime's and quinn's).
    let tasks = || -> Vec<String> {
        let d = format!("/proc/{}/task", server.id());
        std::fs::read_dir(&d)
            .map(|rd| rd.flatten().map(|e| format!("{d}/{}", e.file_name().to_string_lossy())).collect())
            .unwrap_or_default()
    };
    let meter = ServerMeter::start(tasks(), place, rate);
    let url = format!("https://{addr}/{FILE}");
    let got = place
        .run_on(place.client_ns(), place.client_cpu, move || {
            udpx_h3::get(&url, None, &udpx_h3::GetConfig::default()).map(|r| (r.bytes, r.seconds))
        })?
        .map_err(|e| format!("udpx h3 get from quinn: {e}"));
    let cost = meter.stop();
    drop(server);
    let (bytes, seconds) = got?;
    if bytes != cfg.size {
        return Err(format!("{bytes} bytes received from quinn; the file has {}", cfg.size));
    }
    let Some(cost) = cost else {
        return Err("quinn-serve's /proc/PID/task or /proc/stat could not be read".into());
    };
    Ok(measured(cost, bytes, seconds))
}

/// nginx's configuration: one process (`master_process off`), every path under `dir`, TLS 1.3
/// only, the file served from `www` (sendfile cannot apply under TLS without kernel TLS).
fn nginx_conf(dir: &Path, www: &Path, listen: SocketAddr, cert: &Path, key: &Path) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  default_type application/octet-stream;\n\
         client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
         uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         server {{\n    listen {listen} ssl http2;\n    ssl_protocols TLSv1.3;\n\
         ssl_certificate {};\n    ssl_certificate_key {};\n    root {};\n  }}\n}}\n",
        cert.display(),
        key.display(),
        www.display()
    )
}

/// A TCP port free at the server's address (bound and released: nginx binds it next).
fn free_tcp_port(place: &Place<'_>) -> Result<u16, String> {
    let ip = place.server_ip;
    let f = move || std::net::TcpListener::bind((ip, 0)).and_then(|l| l.local_addr()).map(|a| a.port());
    match place.server_ns() {
        Some(ns) => ns.try_run(f).map_err(|e| e.to_string())?,
        None => f(),
    }
    .map_err(|e| format!("a free TCP port: {e}"))
}

/// Waits (at most 10 s) until `addr` accepts a TCP connection from the client's side.
fn wait_listening(place: &Place<'_>, addr: SocketAddr, server: &ChildGroup) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let f = move || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
        let up = match place.client_ns() {
            Some(ns) => ns.try_run(f).map_err(|e| e.to_string())?,
            None => f(),
        };
        if up {
            return Ok(());
        }
        if exited(server.id()) {
            return Err("it exited at start".into());
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!("{addr} not listening after 10 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The veth pair of a profile: the server's device (its namespace is `Rx`) with TCP and UDP
/// segmentation offload both off (`Software`) or both on (`Offload`), GSO on; each side's
/// receive work on its own CPU ([`receive_on_own_cpus`]).
pub(super) fn equal_footing(
    profile: Profile,
    napi: Napi,
    server_cpu: usize,
    client_cpu: usize,
) -> Result<TestNet, String> {
    let net = TestNet::setup(&TestNetConfig::new(Profile::Offload)).map_err(|e| format!("veth pair: {e}"))?;
    let v = if profile == Profile::Software { "off" } else { "on" };
    net.set_features(Side::Rx, &[("tso", v), ("tx-udp-segmentation", v), ("gso", "on")])
        .map_err(|e| format!("server-side offloads ({profile}): {e}"))?;
    receive_on_own_cpus(&net, napi, server_cpu, client_cpu)?;
    Ok(net)
}
