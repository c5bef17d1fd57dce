//! Who holds a release to its departure time: the kernel (an fq qdisc on the egress device
//! honours `SCM_TXTIME`) or the pacer's wheel here (any other qdisc sends at once).

use std::fmt;
use std::net::IpAddr;

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PacingChoice {
    /// The kernel where the egress qdisc paces, else the wheel.
    #[default]
    Auto,
    /// Always the wheel: release each flow at its time from user space.
    Wheel,
    /// Always hand departures to the kernel (`SCM_TXTIME`) a look-ahead early, even where the
    /// qdisc does not enforce them (then datagrams leave up to the look-ahead early: for
    /// testing the kernel path on a machine without fq).
    Kernel,
}

impl std::str::FromStr for PacingChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PacingChoice::Auto),
            "wheel" => Ok(PacingChoice::Wheel),
            "kernel" => Ok(PacingChoice::Kernel),
            _ => Err(format!("pacing {s:?}: give auto, wheel or kernel")),
        }
    }
}

/// What a shard does, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pacing {
    /// Releases leave when the wheel says.
    Wheel {
        /// Why not the kernel.
        why: String,
    },
    /// Releases go early with `SCM_TXTIME`; the qdisc holds them.
    Kernel {
        /// Why (the qdisc found, or the user's choice).
        why: String,
        /// Whether the qdisc found enforces it.
        enforced: bool,
    },
}

impl fmt::Display for Pacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pacing::Wheel { why } => write!(f, "wheel ({why})"),
            Pacing::Kernel { why, enforced: true } => write!(f, "kernel SO_TXTIME ({why})"),
            Pacing::Kernel { why, enforced: false } => write!(f, "kernel SO_TXTIME, NOT enforced ({why})"),
        }
    }
}

/// Decides for traffic to `dest`, looking at the route's device and its root qdisc.
pub fn decide(choice: PacingChoice, dest: IpAddr) -> Pacing {
    let found = egress_text(dest);
    match (choice, found) {
        (PacingChoice::Wheel, (_, text)) => Pacing::Wheel { why: format!("asked for; {text}") },
        (PacingChoice::Kernel, (enforced, text)) => Pacing::Kernel { why: format!("asked for; {text}"), enforced },
        (PacingChoice::Auto, (true, text)) => Pacing::Kernel { why: text, enforced: true },
        (PacingChoice::Auto, (false, text)) => Pacing::Wheel { why: text },
    }
}

/// Whether the egress towards `dest` paces by departure time on `CLOCK_MONOTONIC`, and a line
/// saying what was found.
fn egress_text(dest: IpAddr) -> (bool, String) {
    use udpx::qdisc::KernelPacing;
    match udpx::qdisc::egress(dest) {
        Ok(e) if e.pacing == KernelPacing::Etf => {
            (false, format!("egress {e}; this server departs on CLOCK_MONOTONIC (fq's clock), so the wheel paces"))
        }
        Ok(e) => (e.pacing == KernelPacing::Fq, format!("egress {e}")),
        Err(err) => (false, format!("egress towards {dest} unknown ({err})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback's root is noqueue: the wheel, and the reason names the device.
    #[test]
    fn loopback_is_paced_by_the_wheel() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        match decide(PacingChoice::Auto, lo) {
            Pacing::Wheel { why } => assert!(why.contains("lo") && why.contains("not enforced"), "{why}"),
            other => panic!("{other}"),
        }
        match decide(PacingChoice::Kernel, lo) {
            p @ Pacing::Kernel { enforced: false, .. } => assert!(p.to_string().contains("NOT enforced")),
            other => panic!("{other}"),
        }
        assert!(matches!(decide(PacingChoice::Wheel, lo), Pacing::Wheel { .. }));
        assert_eq!("kernel".parse(), Ok(PacingChoice::Kernel));
        assert!("fq".parse::<PacingChoice>().is_err());
    }
}
