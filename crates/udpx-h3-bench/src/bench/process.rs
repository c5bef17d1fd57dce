//! The bench's peers as processes: run one to its end within a deadline, tell whether one
//! has exited. Used by the peer rows and the browser's.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use udpx_lab::netns::ChildGroup;

/// Whether process `pid` is gone or a zombie.
pub(super) fn exited(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().unwrap_or("").trim_start().chars().next();
    matches!(state, Some('Z') | None)
}

/// Runs `cmd` in a process group of its own (killed on drop), its output to `log`, until it
/// exits or `deadline` passes; a non-zero exit or the deadline is an error.
pub(super) fn run_bounded(cmd: &mut Command, log: &Path, deadline: Duration) -> Result<(), String> {
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
