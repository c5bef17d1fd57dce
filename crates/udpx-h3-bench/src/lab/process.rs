//! The bench's peers and servers as processes: run one to its end within a deadline, tell
//! whether one has exited, wait until a server is up.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use udpx_lab::netns::ChildGroup;

/// Whether process `pid` is gone or a zombie.
pub(crate) fn exited(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().unwrap_or("").trim_start().chars().next();
    matches!(state, Some('Z') | None)
}

/// Runs `cmd` in a process group of its own (killed on drop), its output to `log`, until it
/// exits or `deadline` passes; a non-zero exit or the deadline is an error.
pub(crate) fn run_bounded(cmd: &mut Command, log: &Path, deadline: Duration) -> Result<(), String> {
    let f = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let f2 = f.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(f).stderr(f2);
    let g = ChildGroup::spawn(cmd).map_err(|e| format!("cannot start: {e}"))?;
    // `waitpid` every 20 ms, not /proc every 2 ms: this thread is not pinned, and while the
    // client's CPU is busy it runs on the server's, whose busy time is the server's figure
    // (reading /proc/PID/stat every 2 ms took about 3 % of that CPU in every row, udpx's and
    // nginx's alike: scripts/profile-chromium.sh, 2026-11-29).
    let Some(status) = g.wait_timeout(deadline).map_err(|e| e.to_string())? else {
        return Err(format!("still running after {deadline:?}: stopped"));
    };
    if !status.success() {
        let out = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = out.lines().rev().take(5).collect();
        return Err(format!("{status}: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | ")));
    }
    Ok(())
}

/// Waits up to 15 s for a server started with its output in `log` to be `up`; past that, an
/// error with what it printed.
pub(crate) fn wait_until_up(name: &str, log: &Path, up: impl Fn() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !up() {
        if start.elapsed() > Duration::from_secs(15) {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{name} did not start in 15 s: {}", text.trim()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
