//! What one process, or some of its threads, used: CPU time, context switches and resident
//! memory, read from `/proc/PID` (proc(5)). Where [`crate::cpu`] sees whole CPUs, this sees the
//! tasks a bench measures: a server's shard threads, a peer server's process.
//!
//! CPU time comes from each task's `schedstat` (nanoseconds on CPU), else its `stat`
//! (`utime + stime`, 10 ms ticks). A thread that ends takes its time with it, and one that ends
//! while it is read is left out: the servers measured keep their threads for a run.

use std::collections::HashSet;

use crate::cpu::TickRate;

/// The ids of this process's threads whose name starts with `prefix` (`udpx-quic-`: a QUIC
/// server's shards).
pub fn threads_named(prefix: &str) -> HashSet<u32> {
    let Ok(rd) = std::fs::read_dir("/proc/self/task") else { return HashSet::new() };
    rd.flatten()
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).map(|c| c.starts_with(prefix)).unwrap_or(false))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// CPU seconds of the tasks (`/proc/PID` or `/proc/PID/task/TID` directories) so far; `None`
/// if a task is gone or there are none.
pub fn cpu_secs(tasks: &[String], rate: TickRate) -> Option<f64> {
    if tasks.is_empty() {
        return None;
    }
    let mut sum = 0.0;
    for t in tasks {
        sum += task_cpu_secs(t, rate)?;
    }
    Some(sum)
}

/// CPU seconds of one task directory so far ([`cpu_secs`]); `None` if it is gone.
fn task_cpu_secs(task: &str, rate: TickRate) -> Option<f64> {
    match std::fs::read_to_string(format!("{task}/schedstat")).ok().and_then(|s| schedstat_ns(&s)) {
        Some(ns) => Some(ns as f64 / 1e9),
        None => Some(rate.to_secs_f64(stat_ticks(&std::fs::read_to_string(format!("{task}/stat")).ok()?)?)),
    }
}

/// CPU seconds process `pid` has run so far, every live thread summed (each task's
/// `schedstat`: to the nanosecond, where `/proc/PID/stat` counts 10 ms ticks). `None` if the
/// process is gone.
pub fn process_cpu_secs(pid: u32, rate: TickRate) -> Option<f64> {
    sum_tasks(pid, |t| task_cpu_secs(t, rate))
}

/// `f` over the live threads of process `pid` (`/proc/PID/task/*`), summed; a thread that ends
/// while it is read counts nothing. `None` if the process is gone or no thread could be read.
fn sum_tasks<T: std::iter::Sum<T>>(pid: u32, f: impl Fn(&str) -> Option<T>) -> Option<T> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let read: Vec<T> = tasks.flatten().filter_map(|e| f(&e.path().to_string_lossy())).collect();
    (!read.is_empty()).then(|| read.into_iter().sum())
}

/// Context switches of process `pid` so far, every live thread summed:
/// `voluntary_ctxt_switches` (it slept: a wake-up each) and `nonvoluntary_ctxt_switches` of
/// `/proc/PID/task/*/status`.
pub fn process_switches(pid: u32) -> Option<u64> {
    sum_tasks(pid, task_switches)
}

/// Context switches of the tasks (`/proc/PID` or `/proc/PID/task/TID` directories) so far,
/// summed as [`process_switches`] does; `None` if a task is gone or there are none.
pub fn switches(tasks: &[String]) -> Option<u64> {
    if tasks.is_empty() {
        return None;
    }
    tasks.iter().map(|t| task_switches(t)).sum()
}

/// Context switches of one task directory so far; `None` if it is gone.
fn task_switches(task: &str) -> Option<u64> {
    status_switches(&std::fs::read_to_string(format!("{task}/status")).ok()?)
}

/// The resident memory of process `pid` (`VmRSS` of `/proc/PID/status`), bytes.
pub fn rss(pid: u32) -> Option<u64> {
    status_rss(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// `VmRSS` from a `/proc/.../status` text, bytes.
pub fn status_rss(status: &str) -> Option<u64> {
    let kb: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches(" kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Voluntary plus involuntary context switches from a `/proc/.../status` text.
pub fn status_switches(status: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        status.lines().find_map(|l| l.strip_prefix(name))?.trim_start_matches(':').trim().parse().ok()
    };
    Some(field("voluntary_ctxt_switches")? + field("nonvoluntary_ctxt_switches")?)
}

/// The first field of `/proc/.../schedstat`: nanoseconds on CPU.
pub fn schedstat_ns(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// `utime + stime` of a `/proc/.../stat` line (fields 14 and 15, counted after the command
/// name, which may hold spaces and parentheses: proc(5)).
pub fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn stat_fields() {
        let s = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1234 0 0";
        assert_eq!(stat_ticks(s), Some(325));
        assert_eq!(stat_ticks("garbage"), None);
        assert_eq!(schedstat_ns("106123939 50324660 360\n"), Some(106_123_939));
        assert_eq!(schedstat_ns(""), None);
        let st = "Name:\tudpx\nVmRSS:\t  2048 kB\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(status_switches(st), Some(127));
        assert_eq!(status_rss(st), Some(2048 * 1024));
        assert_eq!(status_switches("Name:\tudpx\n"), None);
        assert_eq!(status_rss("Name:\tudpx\n"), None);
        assert!(rss(std::process::id()).is_some_and(|b| b > 0), "this process's memory");
    }

    #[test]
    fn a_process_cpu_time_counts_its_threads() {
        let rate = TickRate::new(100).unwrap();
        let before = process_cpu_secs(std::process::id(), rate).expect("this process's tasks");
        // Another thread runs 200 ms of CPU (by its own clock, however busy the machine), says
        // so and stays alive for the second reading: its share must be in it. (A test thread
        // beside this one that ends in between takes its own time out: far less than 50 ms.)
        let (spun_tx, spun) = std::sync::mpsc::channel::<()>();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("udpx-lab-spin".into())
            .spawn(move || {
                let own = || crate::cpu::ProcessCpu::thread().unwrap().total();
                let start = own();
                while own() - start < Duration::from_millis(200) {
                    std::hint::black_box(0u64);
                }
                spun_tx.send(()).unwrap();
                let _ = wait.recv();
            })
            .unwrap();
        spun.recv().unwrap();
        assert_eq!(threads_named("udpx-lab-spin").len(), 1, "the spinning thread by its name");
        let after = process_cpu_secs(std::process::id(), rate).unwrap();
        drop(release);
        t.join().unwrap();
        assert!(after - before >= 0.15, "{before} -> {after}");
        assert_eq!(process_cpu_secs(u32::MAX, rate), None, "no such process");
        assert!(process_switches(std::process::id()).is_some());
        let me = format!("/proc/{}", std::process::id());
        assert!(switches(std::slice::from_ref(&me)).is_some());
        assert_eq!(switches(&[]), None);
        assert_eq!(switches(&["/proc/0/no-such-task".to_string()]), None);
    }
}
