//! What the `udpx` binary's tests share.

use std::process::{Command, Output};

/// Runs the `udpx` binary with `args` and waits for it.
pub fn udpx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_udpx")).args(args).output().expect("run udpx")
}

/// Each command line exits 2 with a short message (at most 6 lines) on stderr that contains
/// its needle: what to change.
pub fn assert_usage_errors(cases: &[(&[&str], &str)]) {
    for (args, needle) in cases {
        let o = udpx(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
        assert!(err.lines().count() <= 6, "{args:?}: a short message, got {err}");
    }
}
