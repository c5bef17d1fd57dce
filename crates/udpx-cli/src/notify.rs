//! systemd's service notifications (sd_notify(3)), for `Type=notify` and `Type=notify-reload`
//! units: one datagram per change to the socket named by `NOTIFY_SOCKET` (a path, or an
//! abstract name after `@`). Without the variable (not under systemd) nothing is sent.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Where the notifications go.
pub struct Notifier {
    sock: UnixDatagram,
    to: SocketAddr,
}

impl Notifier {
    /// The notifier of `NOTIFY_SOCKET`, if set and usable (else `None`, said once on stderr).
    pub fn from_env(cmd: &str) -> Option<Notifier> {
        let name = std::env::var_os("NOTIFY_SOCKET")?;
        let name = name.to_str().unwrap_or_default().to_owned();
        let to = match name.strip_prefix('@') {
            Some(abs) => SocketAddr::from_abstract_name(abs.as_bytes()),
            None => SocketAddr::from_pathname(&name),
        };
        match (UnixDatagram::unbound(), to) {
            (Ok(sock), Ok(to)) => Some(Notifier { sock, to }),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("udpx {cmd}: NOTIFY_SOCKET {name:?}: {e}; systemd will not hear from this server");
                None
            }
        }
    }

    /// Sends `state` (newline-separated `KEY=VALUE` lines); a failure is logged, not fatal.
    pub fn send(&self, state: &str) {
        if let Err(e) = self.sock.send_to_addr(state.as_bytes(), &self.to) {
            log::warn!("sd_notify {state:?}: {e}");
        }
    }

    /// `RELOADING=1` with the `MONOTONIC_USEC` systemd wants beside it (`Type=notify-reload`).
    pub fn reloading(&self) {
        let usec = udpx::Timestamp::now().as_nanos() / 1_000;
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
    }
}
