//! The one error type of this crate: each variant names what failed and what to do about it.

use std::fmt;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

/// Why creating, using or removing a namespace or test network failed.
///
/// Every `Display` ends with what the reader can do about it. Variants carry owned strings and
/// `std` types only, so callers never depend on this crate's dependencies.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The effective user is not root: namespaces and veth pairs need CAP_SYS_ADMIN and
    /// CAP_NET_ADMIN.
    NotRoot,
    /// A program this crate runs (`ip`, `ethtool`) is not on `PATH`.
    ToolMissing {
        /// The program looked for.
        tool: &'static str,
    },
    /// The kernel refused to create a network namespace (e.g. a container without
    /// CAP_SYS_ADMIN, or a kernel built without CONFIG_NET_NS).
    NamespacesUnavailable {
        /// The errno of `unshare(CLONE_NEWNET)`.
        source: io::Error,
    },
    /// A namespace name this crate would not pass to `ip netns`.
    InvalidName {
        /// The rejected name.
        name: String,
        /// Which rule it broke.
        why: &'static str,
    },
    /// A namespace of that name already exists. It is not ours, so it was left alone.
    Exists {
        /// The existing namespace.
        name: String,
    },
    /// [`crate::remove_all_live`] already ran (the process is exiting after a signal), so no new
    /// namespace may be created: it would outlive the process.
    ShuttingDown,
    /// A [`crate::TestNetConfig`] that cannot work.
    InvalidConfig {
        /// What is wrong with it.
        why: String,
    },
    /// An external command ran and exited unsuccessfully.
    Command {
        /// The command line, for copying into a shell.
        cmd: String,
        /// How it exited.
        status: ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// An external command did not finish in time and was killed.
    Timeout {
        /// The command line.
        cmd: String,
        /// The time limit it exceeded.
        after: Duration,
    },
    /// An external command could not be started at all.
    Spawn {
        /// The command line.
        cmd: String,
        /// Why `fork`/`exec` failed.
        source: io::Error,
    },
    /// A system call or file operation failed.
    Io {
        /// What was being done, e.g. "open /run/netns/udpx-1-0-tx".
        what: String,
        /// The underlying error, errno kept.
        source: io::Error,
    },
    /// A device setting was applied without error but reading it back shows another value.
    SettingDidNotTake {
        /// The device.
        dev: String,
        /// The setting, e.g. `rx-udp-gro-forwarding` or `threaded`.
        setting: String,
        /// The value asked for.
        wanted: String,
        /// The value read back (`"missing"` if the setting was not listed at all).
        got: String,
    },
    /// Threaded NAPI was switched on but no `napi/<dev>-<id>` kernel thread appeared.
    NapiThreadMissing {
        /// The receiving device.
        dev: String,
    },
}

impl Error {
    /// Builds [`Error::Io`] from a `nix` errno, so no `nix` type leaks into the public API.
    pub(crate) fn sys(what: impl Into<String>, errno: nix::errno::Errno) -> Error {
        Error::Io { what: what.into(), source: io::Error::from_raw_os_error(errno as i32) }
    }

    /// Builds [`Error::Io`] from a `std` I/O error.
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io { what: what.into(), source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotRoot => write!(
                f,
                "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN): run as root, \
                 e.g. with sudo"
            ),
            Error::ToolMissing { tool } => {
                write!(f, "`{tool}` is not on PATH: install it (Debian: apt-get install iproute2 ethtool)")
            }
            Error::NamespacesUnavailable { source } => write!(
                f,
                "the kernel refused to create a network namespace ({source}): run as root on a \
                 host or a privileged container, with a kernel built with CONFIG_NET_NS"
            ),
            Error::InvalidName { name, why } => {
                write!(f, "invalid namespace name {name:?}: {why}; use letters, digits, '.', '_' and '-'")
            }
            Error::Exists { name } => write!(
                f,
                "network namespace {name:?} already exists and is not ours, so it was left \
                 alone: choose another name, or remove it with `ip netns del {name}` if it is \
                 stale"
            ),
            Error::ShuttingDown => write!(
                f,
                "the process is exiting and has removed its namespaces; no new namespace may be \
                 created: let the process finish"
            ),
            Error::InvalidConfig { why } => write!(f, "invalid test network config: {why}"),
            Error::Command { cmd, status, stderr } => {
                let stderr = if stderr.is_empty() { "(no output)" } else { stderr };
                write!(f, "`{cmd}` failed ({status}): {stderr}; run the command by hand to investigate")
            }
            Error::Timeout { cmd, after } => write!(
                f,
                "`{cmd}` did not finish within {after:?} and was killed: check for a hung \
                 kernel operation or a peer that waits for input"
            ),
            Error::Spawn { cmd, source } => write!(
                f,
                "could not start `{cmd}` ({source}): check that the program is installed and on \
                 PATH"
            ),
            Error::Io { what, source } => write!(f, "could not {what}: {source}"),
            Error::SettingDidNotTake { dev, setting, wanted, got } => write!(
                f,
                "{dev}: set {setting} to {wanted} but it reads back as {got}: this kernel or \
                 driver does not support it; use the other profile or a newer kernel"
            ),
            Error::NapiThreadMissing { dev } => write!(
                f,
                "{dev}: threaded NAPI is on but no napi/{dev}-<id> kernel thread appeared: the \
                 device has no NAPI instance (is GRO on and the device up?)"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::NamespacesUnavailable { source } | Error::Spawn { source, .. } | Error::Io { source, .. } => {
                Some(source)
            }
            _ => None,
        }
    }
}
