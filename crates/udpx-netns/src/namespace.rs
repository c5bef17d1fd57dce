//! Named network namespaces (`ip netns`), entered per thread, removed on drop.
//!
//! A named namespace is a bind mount of a namespace file at `/run/netns/<name>`, made by
//! `ip netns add`. Opening that file and calling `setns(fd, CLONE_NEWNET)` moves *the calling
//! thread* (only it: see setns(2), "network namespace" is per thread) into the namespace; every
//! socket that thread creates afterwards belongs to the namespace for its whole life, whichever
//! thread later uses it. That is how one process drives both ends of a test network.
//!
//! `ip netns del` removes the mount. The kernel frees the namespace, and with it any veth end
//! inside, once the last reference is gone: threads still inside it and sockets created in it
//! both hold one. So drop sockets and join [`Namespace::spawn`]ed threads before the namespace,
//! or the veth lingers until they go (declaring sockets after the `TestNet` does this, since
//! locals drop in reverse order).

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;

use crate::command::{run_bounded, TOOL_TIMEOUT};
use crate::Error;

/// Where `ip netns` keeps its namespace files (iproute2's `NETNS_RUN_DIR`).
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// The prefix of every namespace name [`unique_name`] makes; [`cleanup_stale`] only touches
/// names with this prefix.
pub const NAME_PREFIX: &str = "udpx-";

/// The default time limit of [`Namespace::exec`].
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest name accepted: a file name under `/run/netns` (NAME_MAX).
const MAX_NAME_LEN: usize = 255;

/// A per-process counter that makes names unique within this process; the pid makes them
/// unique between processes.
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Namespaces this process created and has not removed yet, for [`remove_all_live`].
struct Registry {
    live: BTreeSet<String>,
    /// Set by [`remove_all_live`]: the process is exiting, refuse to create more.
    closed: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { live: BTreeSet::new(), closed: false });

/// Locks the registry, ignoring poisoning: the set stays consistent because every update is a
/// single insert or remove, and cleanup must work even after a panic elsewhere.
fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Returns the next value of this process's counter; used in namespace and device names.
pub(crate) fn next_serial() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Makes a namespace name `udpx-<pid>-<serial>-<role>`, unique among this process's names and,
/// through the pid, among concurrently running processes.
///
/// `role` should be short and consist of letters, digits, `.`, `_` or `-`.
pub fn unique_name(role: &str) -> String {
    name_for(next_serial(), role)
}

/// `udpx-<pid>-<serial>-<role>` for a serial the caller already took (a test network uses one
/// serial for both namespaces and the veth names).
pub(crate) fn name_for(serial: u32, role: &str) -> String {
    format!("{NAME_PREFIX}{}-{serial}-{role}", std::process::id())
}

/// A network namespace this process created with `ip netns add`, removed on drop.
///
/// Dropping runs `ip netns del` (logging, never panicking, if that fails). Removing the name
/// does not end threads or close sockets still in the namespace; see the module docs.
#[derive(Debug)]
pub struct Namespace {
    name: String,
    path: PathBuf,
}

impl Namespace {
    /// Creates the network namespace `name` with `ip netns add`.
    ///
    /// Fails with [`Error::Exists`] if a namespace of that name already exists (it belongs to
    /// someone else and is left alone), [`Error::InvalidName`] unless `name` is 1 to 255 of
    /// `[A-Za-z0-9._-]` not starting with `-` and not `.`/`..`, and [`Error::ShuttingDown`]
    /// after [`remove_all_live`] ran.
    ///
    /// The name is recorded for [`remove_all_live`] before this returns, so a signal arriving
    /// at any point cannot leak it: creation and removal hold the same lock.
    pub fn create(name: &str) -> Result<Namespace, Error> {
        validate_name(name)?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        let mut reg = registry();
        if reg.closed {
            return Err(Error::ShuttingDown);
        }
        if path.exists() {
            return Err(Error::Exists { name: name.to_owned() });
        }
        // `ip netns add` creates the file with O_EXCL, so a racing creator makes it fail with
        // EEXIST rather than share the name: map that to `Exists` as well.
        match run_bounded(Command::new("ip").args(["netns", "add", name]), TOOL_TIMEOUT) {
            Ok(_) => {}
            Err(Error::Command { ref stderr, .. }) if stderr.contains("File exists") => {
                return Err(Error::Exists { name: name.to_owned() })
            }
            Err(e) => return Err(e),
        }
        reg.live.insert(name.to_owned());
        Ok(Namespace { name: name.to_owned(), path })
    }

    /// Creates a namespace named by [`unique_name`]`(role)`.
    pub fn create_unique(role: &str) -> Result<Namespace, Error> {
        Namespace::create(&unique_name(role))
    }

    /// The namespace's name, as `ip netns list` shows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file, `/run/netns/<name>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a fresh thread that has joined this namespace, and returns its result.
    ///
    /// Sockets created inside `f` belong to the namespace and stay usable from any thread
    /// afterwards. A panic in `f` is propagated to the caller.
    ///
    /// # Panics
    ///
    /// Panics if the thread cannot be started or cannot join the namespace (the namespace file
    /// is gone, or the process lacks CAP_SYS_ADMIN); [`Namespace::try_run`] returns those as
    /// errors instead.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.try_run(f).unwrap_or_else(|e| panic!("cannot run in namespace {}: {e}", self.name))
    }

    /// Like [`Namespace::run`], but returns an error if the thread cannot enter the namespace.
    /// A panic in `f` is still propagated.
    pub fn try_run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
        let handle = self.try_spawn(f)?;
        match handle.join() {
            Ok(value) => Ok(value),
            Err(payload) => std::panic::resume_unwind(payload),
        }
    }

    /// Spawns a long-lived thread inside the namespace (a receiver, a server) and returns its
    /// handle. The thread has entered the namespace before `f` starts.
    ///
    /// # Panics
    ///
    /// Panics if the thread cannot be started or cannot join the namespace;
    /// [`Namespace::try_spawn`] returns those as errors instead.
    pub fn spawn<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        self.try_spawn(f).unwrap_or_else(|e| panic!("cannot spawn in namespace {}: {e}", self.name))
    }

    /// Like [`Namespace::spawn`], but returns an error if the thread cannot be started or
    /// cannot enter the namespace. Waits until the thread has entered it.
    pub fn try_spawn<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>, Error> {
        // Open in the caller, so a missing namespace is reported here with its path.
        let file = File::open(&self.path).map_err(|e| Error::io(format!("open {}", self.path.display()), e))?;
        let (entered_tx, entered_rx) = mpsc::sync_channel::<Result<(), Errno>>(1);
        let handle = thread::Builder::new()
            .name(format!("netns {}", self.name))
            .spawn(move || {
                let entered = setns(&file, CloneFlags::CLONE_NEWNET);
                drop(file);
                let failed = entered.is_err();
                // The caller waits for this message, so the send cannot fail.
                let _ = entered_tx.send(entered);
                if failed {
                    // Ends the thread without a `T` and without running the panic hook (no
                    // message); the caller reports the errno it was sent.
                    std::panic::resume_unwind(Box::new("setns failed"));
                }
                f()
            })
            .map_err(|e| Error::io(format!("spawn a thread for namespace {}", self.name), e))?;
        // A closed channel would mean the thread died before sending; it cannot, but report it
        // as an errno rather than panic.
        match entered_rx.recv().unwrap_or(Err(Errno::ECHILD)) {
            Ok(()) => Ok(handle),
            Err(errno) => {
                let _ = handle.join();
                Err(Error::sys(format!("enter namespace {} with setns(CLONE_NEWNET)", self.name), errno))
            }
        }
    }

    /// A command that runs `program` inside the namespace via `ip netns exec <name> <program>`,
    /// for external peers (iperf3, ethtool, sh). `ip netns exec` also mounts the namespace's own
    /// `/sys`, so `/sys/class/net` shows its devices.
    ///
    /// The caller bounds its runtime: use [`crate::run_bounded`], or `spawn` and kill it.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `args` (program, then arguments) inside the namespace, waits at most
    /// [`EXEC_TIMEOUT`], checks the exit status and returns stdout. Errors carry stderr.
    pub fn exec(&self, args: &[&str]) -> Result<String, Error> {
        self.exec_timeout(args, EXEC_TIMEOUT)
    }

    /// Like [`Namespace::exec`] with an explicit time limit.
    pub fn exec_timeout(&self, args: &[&str], timeout: Duration) -> Result<String, Error> {
        let Some((program, rest)) = args.split_first() else {
            return Err(Error::InvalidConfig { why: "Namespace::exec needs at least a program name".to_owned() });
        };
        let mut cmd = self.command(program);
        cmd.args(rest);
        run_bounded(&mut cmd, timeout)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let mut reg = registry();
        // Already removed by `remove_all_live`: nothing left to do.
        if reg.live.remove(&self.name) {
            if let Err(e) = delete(&self.name) {
                eprintln!("udpx-netns: could not remove namespace {}: {e}", self.name);
            }
        }
    }
}

/// Checks a namespace name against the rules documented on [`Namespace::create`].
fn validate_name(name: &str) -> Result<(), Error> {
    let bad = |why| Err(Error::InvalidName { name: name.to_owned(), why });
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("it is longer than 255 bytes");
    }
    if name == "." || name == ".." {
        return bad("it names a directory");
    }
    if name.starts_with('-') {
        return bad("it starts with '-', which `ip` would read as an option");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return bad("it contains a character other than letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// `ip netns del <name>`.
fn delete(name: &str) -> Result<(), Error> {
    run_bounded(Command::new("ip").args(["netns", "del", name]), TOOL_TIMEOUT).map(|_| ())
}

/// The names of namespaces this process created and has not removed yet.
pub fn live_namespaces() -> Vec<String> {
    registry().live.iter().cloned().collect()
}

/// Removes every namespace this process created and still holds, and refuses to create more.
/// Returns how many were removed.
///
/// Meant for the moment a binary exits abnormally (Ctrl-C), when `Drop` will not run: the
/// `Namespace` values stay alive but their later drop does nothing. Any [`Namespace::create`]
/// afterwards fails with [`Error::ShuttingDown`], so a thread racing the exit cannot leak a
/// namespace. Failures are logged to stderr.
///
/// It runs `ip`, takes a lock and allocates, so it must not be called from an asynchronous
/// signal handler; call it from a thread that waits for the signal, as
/// [`cleanup_on_signals`] does.
pub fn remove_all_live() -> usize {
    let mut reg = registry();
    reg.closed = true;
    let names = std::mem::take(&mut reg.live);
    let mut removed = 0;
    for name in names {
        match delete(&name) {
            Ok(()) => removed += 1,
            Err(e) => eprintln!("udpx-netns: could not remove namespace {name}: {e}"),
        }
    }
    removed
}

/// Installs Ctrl-C (SIGINT), SIGTERM and SIGHUP handling that removes this process's namespaces
/// and exits with status 128 + the signal number (130 for Ctrl-C).
///
/// How: the signals are blocked in the calling thread, and a dedicated thread waits for them
/// with sigwait(2), then calls [`remove_all_live`] (which is not async-signal-safe, hence not a
/// signal handler) and exits. Threads inherit the signal mask, so call this first thing in
/// `main`, before starting any thread: a signal sent to the process is delivered to some thread
/// that does not block it, and a thread started earlier would take the default action (die
/// without cleanup). Child processes started with `std::process::Command` get an empty signal
/// mask from the standard library, so Ctrl-C still reaches peers such as iperf3.
///
/// Calling it again does nothing.
pub fn cleanup_on_signals() -> Result<(), Error> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut set = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    set.thread_block().map_err(|e| Error::sys("block SIGINT, SIGTERM and SIGHUP", e))?;
    thread::Builder::new()
        .name("udpx-netns-signals".to_owned())
        .spawn(move || match set.wait() {
            Ok(signal) => {
                // Peers first (exit runs no destructor), then the namespaces they ran in.
                let killed = crate::child::kill_all_live();
                if killed > 0 {
                    eprintln!("udpx-netns: {signal} received, killed {killed} peer process group(s)");
                }
                let removed = remove_all_live();
                eprintln!("udpx-netns: {signal} received, removed {removed} network namespace(s)");
                std::process::exit(128 + signal as i32);
            }
            Err(e) => eprintln!("udpx-netns: waiting for signals failed: {e}; cleanup disabled"),
        })
        .map_err(|e| Error::io("spawn the signal-waiting thread", e))?;
    let _ = INSTALLED.set(());
    Ok(())
}

/// Removes namespaces named `udpx-<pid>-...` whose process is no longer alive (left behind by
/// a run that was killed with SIGKILL, or aborted). Returns how many were removed; failures
/// are logged to stderr.
///
/// A process counts as alive if `kill(pid, 0)` succeeds or fails with EPERM. Pids are those of
/// the pid namespace this runs in; namespaces made from another pid namespace (a container
/// sharing `/run/netns`) may look stale or alive by accident, so only run this where udpx runs
/// in one pid namespace. This process's own namespaces are never touched.
pub fn cleanup_stale() -> usize {
    let entries = match std::fs::read_dir(NETNS_RUN_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
        Err(e) => {
            eprintln!("udpx-netns: could not list {NETNS_RUN_DIR}: {e}");
            return 0;
        }
    };
    let me = std::process::id();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if pid == me || process_alive(pid) {
            continue;
        }
        match delete(&name) {
            Ok(()) => removed += 1,
            Err(e) => eprintln!("udpx-netns: could not remove stale namespace {name}: {e}"),
        }
    }
    removed
}

/// The pid in a name made by [`unique_name`]: `udpx-<pid>-<rest>`.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let (pid, tail) = rest.split_once('-')?;
    if tail.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

fn process_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    // Signal 0 checks existence and permission without sending anything (kill(2)).
    !matches!(kill(Pid::from_raw(raw), None), Err(Errno::ESRCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for good in ["udpx-1-0-tx", "a", "A.b_c-9"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        let long = "x".repeat(256);
        for bad in ["", ".", "..", "-x", "a/b", "a b", "é", long.as_str()] {
            assert!(matches!(validate_name(bad), Err(Error::InvalidName { .. })), "{bad}");
        }
    }

    #[test]
    fn unique_names_carry_pid_and_differ() {
        let a = unique_name("tx");
        let b = unique_name("tx");
        assert_ne!(a, b);
        assert_eq!(owner_pid(&a), Some(std::process::id()));
        assert!(validate_name(&a).is_ok());
    }

    #[test]
    fn owner_pid_parses_only_our_names() {
        assert_eq!(owner_pid("udpx-123-4-tx"), Some(123));
        assert_eq!(owner_pid("udpx-123-x"), Some(123));
        assert_eq!(owner_pid("udpx-123"), None);
        assert_eq!(owner_pid("udpx-123-"), None);
        assert_eq!(owner_pid("udpx--4-tx"), None);
        assert_eq!(owner_pid("udpx-0-4-tx"), None);
        assert_eq!(owner_pid("udpx-12a-4-tx"), None);
        assert_eq!(owner_pid("other-123-4-tx"), None);
    }

    #[test]
    fn own_process_is_alive() {
        assert!(process_alive(std::process::id()));
    }
}
