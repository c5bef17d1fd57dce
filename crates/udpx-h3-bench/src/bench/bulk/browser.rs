//! A real browser as the bulk table's client: headless Chromium (Debian's, installed by
//! `scripts/setup.sh`) opens a page served by the server under test, which fetches the file
//! [`FETCHES`] times one after another and reads each body to its end; the page writes what it
//! got (bytes, and the protocol of each fetch from the Resource Timing entries) into the DOM,
//! which `--dump-dom` prints. From udpx over HTTP/3 (`--origin-to-force-quic-on`), from nginx
//! over HTTP/2. Chromium acknowledges every second packet for a connection's first hundred and
//! opens its flow-control windows its own way: the client users bring.
//!
//! The flags are the lab's ([`udpx_lab::browser::headless`]) and a pinned certificate.
//! Chromium runs in a process group of its own, bounded in time, killed with its helpers on
//! every path out.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::config::{H3BenchConfig, FILE};
use super::place::Place;

/// Downloads of the file per run.
pub const FETCHES: u64 = 4;

/// The page's name in the served directory.
pub const PAGE: &str = "chromium.html";

/// The page: fetches `FILE` FETCHES times, reads each body whole (`arrayBuffer`: with a
/// stream reader `--dump-dom` did not wait for the reads), reports between markers.
fn page() -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>udpx bench</title></head><body>\n\
         <pre id=\"result\">pending</pre>\n<script>\n\
         (async () => {{\n\
           let bytes = 0, ok = 0;\n\
           for (let i = 0; i < {FETCHES}; i++) {{\n\
             const r = await fetch('/{FILE}?' + i, {{ cache: 'no-store' }});\n\
             const b = await r.arrayBuffer();\n\
             bytes += b.byteLength;\n\
             if (r.status === 200) ok++;\n\
           }}\n\
           const protos = performance.getEntriesByType('resource').map(e => e.nextHopProtocol).join(',');\n\
           document.body.textContent = 'UDPX' + 'RESULT ' + bytes + ' ' + ok + ' ' + protos + ' UDPX' + 'END';\n\
         }})().catch(e => {{ document.body.textContent = 'UDPX' + 'RESULT error ' + e + ' UDPX' + 'END'; }});\n\
         </script></body></html>\n"
    )
}

/// Writes the page into the served directory `www`.
pub fn write_page(www: &Path) -> Result<(), String> {
    std::fs::write(www.join(PAGE), page()).map_err(|e| format!("{PAGE}: {e}"))
}

/// What a run got (each fetch over the protocol expected, checked).
#[derive(Debug)]
pub struct Fetched {
    pub bytes: u64,
    pub seconds: f64,
}

/// Chromium on the client's CPU and namespace opens `https://ADDR/PAGE` of the server at
/// `addr`, over HTTP/3 when `quic` (else whatever TLS over TCP offers: HTTP/2 from nginx);
/// `pin` is the certificate's SPKI pin.
pub fn fetch(
    cfg: &H3BenchConfig,
    place: &Place<'_>,
    dir: &Path,
    addr: SocketAddr,
    quic: bool,
    pin: &str,
) -> Result<Fetched, String> {
    let chromium = cfg.programs.chromium.as_deref().ok_or("chromium not found")?;
    let tmp = dir.join(if quic { "chromium-h3" } else { "chromium-tcp" });
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut cmd = place.command(place.client_ns(), place.client_cpu, chromium);
    udpx_lab::browser::headless(&mut cmd, &tmp);
    cmd.arg(format!("--ignore-certificate-errors-spki-list={pin}"));
    if quic {
        cmd.arg(format!("--origin-to-force-quic-on={addr}"));
    }
    cmd.args(["--virtual-time-budget=60000", "--dump-dom", &format!("https://{addr}/{PAGE}")]);
    let out = tmp.join("dom.txt");
    let limit = cfg.deadline() * FETCHES as u32 + Duration::from_secs(60);
    let start = Instant::now();
    crate::lab::process::run_bounded(&mut cmd, &out, limit).map_err(|e| format!("chromium: {e}"))?;
    let seconds = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let result = text.split("UDPXRESULT ").nth(1).and_then(|r| r.split(" UDPXEND").next()).ok_or_else(|| {
        let tail: Vec<&str> = text.lines().rev().take(6).collect();
        format!(
            "chromium printed no result; its output ends: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )
    })?;
    let mut it = result.split_whitespace();
    let bytes: u64 = it.next().and_then(|b| b.parse().ok()).ok_or_else(|| format!("chromium: {result}"))?;
    let ok: u64 = it.next().and_then(|b| b.parse().ok()).unwrap_or(0);
    let protocols = it.next().unwrap_or("").to_string();
    if ok != FETCHES || bytes != FETCHES * cfg.size {
        return Err(format!("chromium: {ok} of {FETCHES} fetches answered 200, {bytes} bytes"));
    }
    let want = if quic { "h3" } else { "h2" };
    if !protocols.split(',').filter(|p| !p.is_empty()).all(|p| p == want) {
        return Err(format!("chromium fetched over {protocols}, {want} expected"));
    }
    Ok(Fetched { bytes, seconds })
}
