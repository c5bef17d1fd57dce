//! Headless Chromium as a peer: where it is and the flags a lab run needs (found by trying,
//! Chromium 156, Debian's build; see `crates/udpx-h3/tests/browser.rs`): a fresh profile with
//! HOME pointed into it, no sandbox (labs run as root), no crash reporter, no background
//! networking (the lab has no internet, and those requests would only add noise), no proxy.
//! The caller adds the certificate pin, `--origin-to-force-quic-on` where it wants HTTP/3,
//! and what to do (`--dump-dom URL`), and bounds the run in time in a process group of its
//! own (Chromium's helpers outlive the browser by seconds).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Chromium in `PATH` (`chromium`, or `chromium-browser`).
pub fn find() -> Option<PathBuf> {
    crate::netns::find_in_path("chromium").or_else(|| crate::netns::find_in_path("chromium-browser"))
}

/// Adds to `cmd` (Chromium, or a wrapper that runs it) the flags and environment of a
/// headless run with a fresh profile under `dir`.
pub fn headless(cmd: &mut Command, dir: &Path) {
    let profile = dir.join("profile");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-breakpad",
        "--disable-crash-reporter",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--no-first-run",
        "--no-default-browser-check",
        "--no-pings",
        "--metrics-recording-only",
        "--password-store=basic",
        "--no-proxy-server",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--disk-cache-dir={}", dir.join("cache").display()))
    .env("HOME", &profile)
    .env("XDG_CONFIG_HOME", profile.join("config"))
    .env("XDG_CACHE_HOME", profile.join("cache"));
    for v in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        cmd.env_remove(v);
    }
}
