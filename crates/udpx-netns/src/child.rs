//! Peer processes the lab starts (iperf3, sockperf servers), ended whatever happens.
//!
//! Each runs in a process group of its own ([`ChildGroup::spawn`]). Dropping the guard kills
//! the whole group with SIGKILL (peers such as sockperf ignore SIGTERM, and a wrapper like
//! `taskset` or `ip netns exec` may sit between us and the peer) and reaps the child, also
//! while unwinding from a panic or an early error return. The signal cleanup
//! ([`crate::cleanup_on_signals`]) kills every live group before it exits the process, since
//! `exit` runs no destructor.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

fn live() -> MutexGuard<'static, Vec<i32>> {
    static LIVE: OnceLock<Mutex<Vec<i32>>> = OnceLock::new();
    LIVE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// A child process in a process group of its own, killed with its group when dropped.
#[derive(Debug)]
pub struct ChildGroup {
    child: Option<Child>,
    pgid: i32,
}

impl ChildGroup {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(cmd: &mut Command) -> io::Result<ChildGroup> {
        let child = cmd.process_group(0).spawn()?;
        let pgid = child.id() as i32;
        live().push(pgid);
        Ok(ChildGroup { child: Some(child), pgid })
    }

    /// The child's pid (also its process group's id).
    pub fn id(&self) -> u32 {
        self.pgid as u32
    }

    /// Waits for the child to exit by itself; whatever else is left of its group is killed.
    pub fn wait(mut self) -> io::Result<ExitStatus> {
        let status = self.child.as_mut().map(Child::wait).unwrap_or_else(|| Err(io::Error::other("no child")));
        drop(self); // kills what is left of the group, if anything
        status
    }

    /// Waits up to `limit` for the child to exit by itself (`None`: it did not, and its group
    /// is killed); whatever else is left of its group is killed either way.
    pub fn wait_timeout(mut self, limit: std::time::Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = std::time::Instant::now() + limit;
        let child = self.child.as_mut().ok_or_else(|| io::Error::other("no child"))?;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break Some(s);
            }
            if std::time::Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        drop(self);
        Ok(status)
    }
}

impl Drop for ChildGroup {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The group's id stays reserved until the leader is reaped below.
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
            let _ = child.wait();
        }
        live().retain(|&p| p != self.pgid);
    }
}

/// A process group the lab did not spawn itself but must end: a daemon that detached from its
/// [`ChildGroup`] (nginx with `daemon on` starts a session and group of its own, named by its
/// pid file). Killed with SIGKILL when dropped, and by the signal cleanup meanwhile.
#[derive(Debug)]
pub struct GroupGuard(i32);

impl GroupGuard {
    /// Takes charge of process group `pgid`.
    pub fn adopt(pgid: u32) -> GroupGuard {
        live().push(pgid as i32);
        GroupGuard(pgid as i32)
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.0), Signal::SIGKILL);
        live().retain(|&p| p != self.0);
    }
}

/// Whether process `pid` runs: a zombie is gone for the lab's purposes (`/proc` says which).
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

/// Kills every live group (for the signal cleanup, which exits without running destructors).
/// Returns how many.
pub fn kill_all_live() -> usize {
    let groups = live().clone();
    for &pgid in &groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    groups.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        is_running(pid as u32)
    }

    #[test]
    fn dropping_the_guard_ends_the_whole_group() {
        // A shell that ignores SIGTERM and starts a grandchild in the same group.
        let pid_file = std::env::temp_dir().join(format!("udpx-childgroup-{}", std::process::id()));
        let script = format!("trap '' TERM; sleep 30 & echo $! > {}; wait", pid_file.display());
        let g = ChildGroup::spawn(Command::new("sh").args(["-c", &script])).unwrap();
        let leader = g.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(5);
        let grandchild = loop {
            if let Some(p) = std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
                break p;
            }
            assert!(Instant::now() < deadline, "the grandchild never started");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(live().contains(&leader));
        drop(g);
        let _ = std::fs::remove_file(&pid_file);
        assert!(!alive(leader), "the leader is reaped");
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !alive(grandchild)
        });
        assert!(gone, "the grandchild of the group is killed too");
        assert!(!live().contains(&leader), "unregistered");
    }
}
