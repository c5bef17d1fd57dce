//! Starting the servers a row measures (udpx, quinn, nginx) on a free port in the server's
//! namespace, and waiting until each answers.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use udpx_lab::netns::ChildGroup;

use super::config::{ScaleConfig, ScaleServer};
use super::place::{Place, Running};
use crate::lab::nginx::{nginx_conf, SINGLE_PROCESS};
use crate::lab::process::wait_until_up;

/// A free UDP (`udp`) or TCP port at the server's address.
pub(super) fn free_port(place: &Place, udp: bool) -> Result<u16, String> {
    let ip = place.server_ip;
    let f = move || {
        if udp {
            std::net::UdpSocket::bind((ip, 0)).and_then(|s| s.local_addr()).map(|a| a.port())
        } else {
            std::net::TcpListener::bind((ip, 0)).and_then(|s| s.local_addr()).map(|a| a.port())
        }
    };
    match place.server_ns() {
        Some(ns) => ns.try_run(f).map_err(|e| e.to_string())?,
        None => f(),
    }
    .map_err(|e| format!("a free port: {e}"))
}

pub(super) fn start_server(
    cfg: &ScaleConfig,
    place: &Place,
    dir: &Path,
    (cert, key): (&Path, &Path),
    server: ScaleServer,
    lifetime: Duration,
) -> Result<Running, String> {
    let www = dir.join("www");
    let log = dir.join(format!("{}.log", server.name().replace(['/', ' '], "-")));
    let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let mut metrics = None;
    let (mut cmd, addr, ready): (Command, SocketAddr, &str) = match server {
        ScaleServer::Udpx | ScaleServer::UdpxQlog | ScaleServer::UdpxCache | ScaleServer::Quinn => {
            let addr = SocketAddr::new(place.server_ip, free_port(place, true)?);
            let mut c = place.server_command(&cfg.udpx);
            let sub = if server.is_udpx() { "serve" } else { "quinn-serve" };
            c.args(["h3", sub])
                .arg(&www)
                .args(["--listen", &addr.to_string(), "--cert"])
                .arg(cert)
                .arg("--key")
                .arg(key);
            c.args(["-l", &lifetime.as_secs().to_string()]);
            if server == ScaleServer::UdpxQlog {
                // Every connection, each its file; the default bounds on bytes (1 GiB in all),
                // files as many as connections.
                let q = dir.join("qlog");
                let _ = std::fs::remove_dir_all(&q);
                c.arg("--qlog-dir").arg(&q).args(["--qlog-sample", "1", "--qlog-max-files", "1000000"]);
            }
            if server == ScaleServer::UdpxCache {
                c.args(["--cache-size", &cfg.cache_size.to_string()]);
            }
            if server.is_udpx() {
                c.args(["--shards", "1"]).args(cfg.host.serve_args());
                // Idle connections are the idle row's load: kept for the run, as nginx's are
                // (keepalive_timeout 120s in its configuration here).
                c.args(["--idle-timeout", &lifetime.as_secs().max(1).to_string()]);
                let m = SocketAddr::new(place.server_ip, free_port(place, false)?);
                c.args(["--metrics", &m.to_string()]);
                metrics = Some(m);
            }
            (c, addr, " on https://")
        }
        ScaleServer::NginxH2 | ScaleServer::NginxH1 => {
            let nginx = cfg.nginx.as_deref().ok_or("nginx not found")?;
            let addr = SocketAddr::new(place.server_ip, free_port(place, false)?);
            let ndir = dir.join("nginx-scale");
            let _ = std::fs::remove_dir_all(&ndir);
            std::fs::create_dir_all(&ndir).map_err(|e| e.to_string())?;
            std::fs::write(ndir.join("nginx.conf"), nginx_conf(&ndir, &www, addr, (cert, key), SINGLE_PROCESS))
                .map_err(|e| e.to_string())?;
            let mut c = place.server_command(nginx);
            c.arg("-p").arg(&ndir).arg("-c").arg(ndir.join("nginx.conf")).arg("-e").arg(ndir.join("error.log"));
            (c, addr, "")
        }
    };
    cmd.stdin(Stdio::null()).stdout(logf.try_clone().map_err(|e| e.to_string())?).stderr(logf);
    let process = ChildGroup::spawn(&mut cmd).map_err(|e| format!("starting {}: {e}", server.name()))?;
    let up = || {
        if ready.is_empty() {
            let f = move || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
            match place.client_ns() {
                Some(ns) => ns.try_run(f).unwrap_or(false),
                None => f(),
            }
        } else {
            std::fs::read_to_string(&log).unwrap_or_default().contains(ready)
        }
    };
    wait_until_up(server.name(), &log, up)?;
    Ok(Running { process, addr, metrics })
}
