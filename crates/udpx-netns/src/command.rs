//! Running external programs with a time limit, capturing both output streams.
//!
//! `std::process::Command::output` waits forever; a hung `ip` or a peer that waits for input
//! would hang a test run. [`run_bounded`] waits at most a given time, then kills the child.
//!
//! How it waits: two reader threads drain stdout and stderr (so a chatty child never blocks on
//! a full pipe) and report over a channel when the child closes them, which normally happens
//! when it exits; the caller sleeps on that channel, so a 2 ms `ip` call costs 2 ms, not a
//! polling interval. A child that leaves a grandchild holding the pipes (a daemonizing server)
//! is detected by `try_wait` between channel waits; its output is then taken as read so far,
//! and the reader threads finish whenever the grandchild closes the pipes.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::Error;

/// The time limit for `ip` and `ethtool` calls: each takes a few milliseconds here; seconds
/// mean something is wrong.
pub(crate) const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one channel wait lasts before the child's exit status is checked again.
const SLICE: Duration = Duration::from_millis(20);

/// How long to keep reading after the child exited while something else still holds its pipes.
const GRACE_AFTER_EXIT: Duration = Duration::from_millis(100);

/// Which stream a reader thread drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

/// Renders a command as a shell-like line for error messages: program, then arguments.
pub fn display_command(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` with stdin closed, waits at most `timeout`, and returns its stdout.
///
/// Fails with [`Error::Command`] (carrying stderr) if it exits unsuccessfully,
/// [`Error::Timeout`] if it is still running after `timeout` (it is then killed with SIGKILL and
/// reaped), or [`Error::Spawn`] if it cannot be started. Output is decoded as UTF-8 lossily.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<String, Error> {
    let line = display_command(cmd);
    let deadline = Instant::now() + timeout;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn { cmd: line.clone(), source })?;

    let (tx, rx) = mpsc::channel::<(Stream, Option<Vec<u8>>)>();
    let mut readers = 0;
    if let Some(out) = child.stdout.take() {
        spawn_reader(Stream::Stdout, out, tx.clone());
        readers += 1;
    }
    if let Some(err) = child.stderr.take() {
        spawn_reader(Stream::Stderr, err, tx);
        readers += 1;
    }

    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let mut status: Option<ExitStatus> = None;
    let mut exited_at: Option<Instant> = None;
    while readers > 0 {
        let now = Instant::now();
        if status.is_none() {
            status = try_wait(&mut child, &line)?;
            if status.is_some() {
                exited_at = Some(now);
            }
        }
        if exited_at.is_some_and(|t| now.duration_since(t) > GRACE_AFTER_EXIT) {
            break; // a grandchild holds the pipes; keep what was read
        }
        if now >= deadline {
            return Err(kill_for_timeout(&mut child, line, timeout));
        }
        match rx.recv_timeout(SLICE.min(deadline - now)) {
            Ok((Stream::Stdout, Some(chunk))) => stdout.extend_from_slice(&chunk),
            Ok((Stream::Stderr, Some(chunk))) => stderr.extend_from_slice(&chunk),
            Ok((_, None)) => readers -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }

    // The pipes are closed; the child has exited or is about to. Poll briefly for its status.
    let mut pause = Duration::from_micros(100);
    let status = loop {
        if let Some(s) = status {
            break s;
        }
        status = try_wait(&mut child, &line)?;
        if status.is_none() {
            if Instant::now() >= deadline {
                return Err(kill_for_timeout(&mut child, line, timeout));
            }
            thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    };

    if status.success() {
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    } else {
        Err(Error::Command { cmd: line, status, stderr: String::from_utf8_lossy(&stderr).trim().to_owned() })
    }
}

/// Drains one pipe on its own thread, sending each chunk as it arrives and `None` at end of file
/// (or on a read error, which ends the stream early). Send errors mean the caller has given up
/// on this command; the thread then just finishes.
fn spawn_reader(which: Stream, mut pipe: impl Read + Send + 'static, tx: mpsc::Sender<(Stream, Option<Vec<u8>>)>) {
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.send((which, Some(buf[..n].to_vec()))).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send((which, None));
    });
}

fn try_wait(child: &mut Child, line: &str) -> Result<Option<ExitStatus>, Error> {
    child.try_wait().map_err(|e| Error::io(format!("wait for `{line}`"), e))
}

/// Kills and reaps a child that overran its time limit, and returns the error to report.
fn kill_for_timeout(child: &mut Child, cmd: String, after: Duration) -> Error {
    if let Err(e) = child.kill() {
        eprintln!("udpx-netns: could not kill `{cmd}` after its timeout: {e}");
    }
    // SIGKILL cannot be caught, so this wait ends unless the child is stuck in the kernel.
    let _ = child.wait();
    Error::Timeout { cmd, after }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_stdout_on_success() {
        let out =
            run_bounded(Command::new("sh").args(["-c", "echo hello; echo noise >&2"]), Duration::from_secs(5)).unwrap();
        assert_eq!(out, "hello\n");
    }

    #[test]
    fn failure_carries_stderr_and_status() {
        let err = run_bounded(Command::new("sh").args(["-c", "echo bad thing >&2; exit 3"]), Duration::from_secs(5))
            .unwrap_err();
        match err {
            Error::Command { cmd, status, stderr } => {
                assert!(cmd.starts_with("sh -c"), "{cmd}");
                assert_eq!(status.code(), Some(3));
                assert_eq!(stderr, "bad thing");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn overrun_is_killed() {
        let start = Instant::now();
        let err = run_bounded(Command::new("sleep").arg("10"), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn grandchild_holding_pipes_does_not_block() {
        // The shell exits at once; its background child keeps stdout open for 5 s. It writes
        // its pid to a file so the test can end it afterwards (a test ends what it starts).
        let pid_file = std::env::temp_dir().join(format!("udpx-netns-grandchild-{}", std::process::id()));
        let script = format!("echo early; sleep 5 & echo $! > {}; exit 0", pid_file.display());
        let start = Instant::now();
        let out = run_bounded(Command::new("sh").args(["-c", &script]), Duration::from_secs(4));
        let elapsed = start.elapsed();
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok()) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        let _ = std::fs::remove_file(&pid_file);
        assert_eq!(out.unwrap(), "early\n");
        assert!(elapsed < Duration::from_secs(2));
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let err = run_bounded(&mut Command::new("/nonexistent/udpx-netns-test"), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err:?}");
    }
}
