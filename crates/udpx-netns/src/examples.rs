//! A package's examples run by its integration tests as a user runs them: the binary cargo
//! built, its output read line by line as it comes, killed and reaped if the test ends first.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! // In `tests/examples.rs` of the package whose examples these are.
//! const EXAMPLES: udpx_netns::examples::Examples = udpx_netns::examples!();
//!
//! let mut server = EXAMPLES.start("shard_echo", &["--count", "1"]);
//! let addr = server.listening_on();
//! // ... send it a request ...
//! let (status, out) = server.finish(Duration::from_secs(30));
//! assert!(status.success(), "{out}");
//! ```
//!
//! Where the binary comes from: `cargo test` builds every example of the package (into
//! `target/<profile>/examples/`, beside the `deps` directory the test runs from) before the
//! tests run. A run of one test target (`cargo test --test examples`) builds none, so an
//! example missing or older than its sources is built here with cargo, for the profile the
//! test runs under. Which package, and which cargo, is the calling crate's to say: the
//! [`examples!`](crate::examples!) macro reads them from its build environment.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// The [`Examples`] of the package this expands in: its manifest directory, its name and the
/// cargo that builds it, as cargo set them when it compiled the calling crate.
#[macro_export]
macro_rules! examples {
    () => {
        $crate::examples::Examples::new(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"), env!("CARGO"))
    };
}

/// The examples of one package (see [`examples!`](crate::examples!)).
#[derive(Debug, Clone, Copy)]
pub struct Examples {
    manifest_dir: &'static str,
    package: &'static str,
    cargo: &'static str,
}

impl Examples {
    /// The examples of the package in `manifest_dir` named `package`, built with the cargo at
    /// `cargo` when needed.
    pub const fn new(manifest_dir: &'static str, package: &'static str, cargo: &'static str) -> Examples {
        Examples { manifest_dir, package, cargo }
    }

    /// The example `name` as cargo built it, built first when it is missing or older than its
    /// sources (`examples/<name>.rs` and the modules in subdirectories of `examples/`).
    ///
    /// # Panics
    ///
    /// When the test does not run from `target/<profile>/deps`, or the build fails.
    pub fn binary(&self, name: &str) -> PathBuf {
        let exe = std::env::current_exe().expect("the test's own path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
        let bin = profile_dir.join("examples").join(name);
        let examples = Path::new(self.manifest_dir).join("examples");
        let sources = modified(&examples.join(format!("{name}.rs"))).max(shared_modules(&examples));
        if modified(&bin).is_none() || modified(&bin) < sources {
            let mut cargo = Command::new(self.cargo);
            cargo.args(["build", "--quiet", "-p", self.package, "--example", name]);
            match profile_dir.file_name().and_then(|p| p.to_str()) {
                Some("debug") | None => {}
                Some("release") => {
                    cargo.arg("--release");
                }
                Some(profile) => {
                    cargo.args(["--profile", profile]);
                }
            }
            let status = cargo.status().expect("run cargo");
            assert!(status.success(), "cargo build -p {} --example {name}: {status}", self.package);
        }
        bin
    }

    /// Starts the example `name` with `args`, its stdout and stderr read as they come.
    ///
    /// # Panics
    ///
    /// When it cannot be built or started.
    pub fn start(&self, name: &str, args: &[&str]) -> Running {
        let mut child = Command::new(self.binary(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start example {name}: {e}"));
        let (tx, lines) = mpsc::channel();
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped stdout"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped stderr"));
        for pipe in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Running { name: name.to_owned(), child, lines, output: String::new() }
    }
}

/// A running example: its output (stdout and stderr, line by line, in the order they came)
/// kept as it is read; killed and reaped when dropped, also when the test panics.
#[derive(Debug)]
pub struct Running {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    output: String,
}

impl Running {
    /// The address after `listening on ` in the example's first lines (within 30 s).
    ///
    /// # Panics
    ///
    /// When no such line comes, with what the example printed.
    pub fn listening_on(&mut self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Ok(line) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.output.push_str(&line);
            self.output.push('\n');
            if let Some(rest) = line.strip_prefix("listening on ") {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                return addr.parse().unwrap_or_else(|e| panic!("{}: {addr:?} is not an address: {e}", self.name));
            }
        }
        panic!("{} printed no `listening on` line:\n{}", self.name, self.output);
    }

    /// Waits (at most `limit`) for the example to end; its exit status and everything it
    /// printed.
    ///
    /// # Panics
    ///
    /// When it is still running after `limit` (it is then killed), with what it printed.
    pub fn finish(mut self, limit: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the example") {
                break status;
            }
            assert!(Instant::now() < deadline, "{} still running after {limit:?}:\n{}", self.name, self.output);
            std::thread::sleep(Duration::from_millis(20));
        };
        // The pipes close with the process: the readers end and drop their senders.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.output.push_str(&line);
            self.output.push('\n');
        }
        (status, std::mem::take(&mut self.output))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number after the first `prefix` in `text`: its digits, with a decimal point between
/// digits (a sentence's full stop after it is not part of it).
///
/// # Panics
///
/// When `prefix` is not in `text` or no number of type `T` follows it, with `text`.
pub fn number_after<T: FromStr>(text: &str, prefix: &str) -> T {
    let at = text.find(prefix).unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}")) + prefix.len();
    let rest = &text.as_bytes()[at..];
    let len = (0..rest.len())
        .find(|&i| {
            !(rest[i].is_ascii_digit() || rest[i] == b'.' && i > 0 && rest.get(i + 1).is_some_and(u8::is_ascii_digit))
        })
        .unwrap_or(rest.len());
    let number = &text[at..at + len];
    number.parse().unwrap_or_else(|_| panic!("{number:?} after {prefix:?} is not a number of its kind in:\n{text}"))
}

/// When `path` was last modified (`None` when it does not exist).
fn modified(path: &Path) -> Option<SystemTime> {
    path.metadata().and_then(|m| m.modified()).ok()
}

/// The newest modification among the files in subdirectories of `examples` (modules the
/// examples share, as `examples/common/mod.rs`; cargo takes no example from them).
fn shared_modules(examples: &Path) -> Option<SystemTime> {
    let entries = |dir: &Path| std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path());
    let mut dirs: Vec<PathBuf> = entries(examples).filter(|p| p.is_dir()).collect();
    let mut newest = None;
    while let Some(dir) = dirs.pop() {
        for path in entries(&dir) {
            if path.is_dir() {
                dirs.push(path);
            } else {
                newest = newest.max(modified(&path));
            }
        }
    }
    newest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_after_a_prefix() {
        let text = "sent 1000 datagrams in 16 calls over 4 flows in 1.002 s. received 7.";
        assert_eq!(number_after::<u64>(text, "sent "), 1000);
        assert_eq!(number_after::<u64>(text, " in "), 16);
        assert_eq!(number_after::<f64>(text, " flows in "), 1.002);
        assert_eq!(number_after::<u64>(text, "received "), 7, "the full stop is not a decimal point");
    }

    #[test]
    #[should_panic(expected = "no \"lost \"")]
    fn a_missing_prefix_says_so() {
        number_after::<u64>("sent 1", "lost ");
    }
}
