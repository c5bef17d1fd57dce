//! Ctrl-C removes the namespaces: this binary re-runs itself as a child that sets up a test
//! network under `cleanup_on_signals`, sends it SIGINT, and checks the exit status (130) and
//! that `ip netns list` no longer shows the namespaces. Bounded: every wait has a deadline,
//! generous (30 s) because what is judged is the cleanup, not its speed; the child is ended
//! (SIGINT, then SIGKILL) whatever happens to the parent.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use udpx_netns::{run_bounded, TestNet, TestNetConfig};

const CHILD_ENV: &str = "UDPX_NETNS_SIGNAL_CHILD";

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
    } else {
        parent();
    }
}

/// How long the parent waits for each step of the child (setup, exit after SIGINT).
const STEP: Duration = Duration::from_secs(30);

/// Sets up a test network, prints its namespace names, and waits to be interrupted.
fn child() {
    udpx_netns::cleanup_on_signals().expect("install signal cleanup");
    let net = TestNet::setup(&TestNetConfig::default()).expect("setup");
    println!("{} {}", net.tx.name(), net.rx.name());
    // The parent signals it within STEP or ends it (ChildGuard); this bounds an orphan.
    std::thread::sleep(2 * STEP);
    eprintln!("child: no signal arrived within {:?}", 2 * STEP);
    drop(net);
    std::process::exit(1);
}

fn listed() -> String {
    run_bounded(Command::new("ip").args(["netns", "list"]), STEP).expect("ip netns list")
}

/// Ends the child if the parent fails before it has: SIGINT first (so it removes its
/// namespaces), SIGKILL if it has not exited within STEP; then reaps it.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let Some(child) = self.0.as_mut() else { return };
        if let Ok(None) = child.try_wait() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
            let deadline = Instant::now() + STEP;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

fn parent() {
    print!("test ctrl_c_removes_namespaces ... ");
    if udpx_netns::skip_unless_capable("ctrl_c_removes_namespaces") {
        return;
    }
    let mut guard = ChildGuard(Some(
        Command::new(std::env::current_exe().expect("own path"))
            .env(CHILD_ENV, "1")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child"),
    ));
    let child = guard.0.as_mut().expect("spawned");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let Ok(line) = rx.recv_timeout(STEP) else {
        panic!("child did not report its namespaces within {STEP:?}");
    };
    let names: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    assert_eq!(names.len(), 2, "child said {line:?}");
    let before = listed();
    for name in &names {
        assert!(before.contains(name.as_str()), "{name} not in {before}");
    }

    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
    kill(pid, Signal::SIGINT).expect("send SIGINT");
    let deadline = Instant::now() + STEP;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        // The guard kills and reaps it.
        assert!(Instant::now() < deadline, "child did not exit within {STEP:?} of SIGINT");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(130), "{status}");
    let after = listed();
    for name in &names {
        assert!(!after.contains(name.as_str()), "{name} survived SIGINT: {after}");
    }
    println!("ok");
}
