//! Device plumbing shared by the test networks ([`crate::TestNet`], [`crate::LineNet`]): `ip`
//! with a time limit, device names that carry the process id, static neighbours, and device
//! features set with ethtool and read back.

use std::collections::BTreeMap;
use std::process::Command;

use crate::command::{run_bounded, TOOL_TIMEOUT};
use crate::namespace::Namespace;
use crate::Error;

/// Longest interface name: IFNAMSIZ (16) minus the terminating NUL.
pub const MAX_IFNAME_LEN: usize = 15;

/// Runs `ip <args>` with the tool time limit.
pub(crate) fn ip(args: &[&str]) -> Result<String, Error> {
    run_bounded(Command::new("ip").args(args), TOOL_TIMEOUT)
}

/// Reads a device's MTU from `ip -o link show`: `2: dev@if2: <...> mtu 1500 qdisc ...`.
pub(crate) fn link_mtu(ns: &Namespace, dev: &str) -> Result<u32, Error> {
    let out = ip(&["-n", ns.name(), "-o", "link", "show", "dev", dev])?;
    let mut words = out.split_whitespace();
    words.by_ref().find(|w| *w == "mtu").and_then(|_| words.next()).and_then(|m| m.parse().ok()).ok_or_else(|| {
        Error::SettingDidNotTake {
            dev: dev.to_owned(),
            setting: "mtu".to_owned(),
            wanted: "a readable value".to_owned(),
            got: out.trim().to_owned(),
        }
    })
}

/// A device name `ux<pid><role><n>`: the pid keeps names unique between processes (they
/// matter globally for the NAPI kernel threads named after them), `n` is the per-process
/// serial of the network.
///
/// It fits [`MAX_IFNAME_LEN`]: pids are at most 4194304 (PID_MAX_LIMIT, 7 digits), which
/// leaves at least 5 digits for `n`; `n` is taken modulo the room left, so names repeat only
/// after 100000 networks in one process, and only matter while both are alive.
pub(crate) fn dev_name(pid: u32, serial: u32, role: char) -> String {
    let pid_digits = pid.to_string().len();
    let room = MAX_IFNAME_LEN.saturating_sub(pid_digits + 3).clamp(1, 9);
    let n = serial % 10u32.pow(room as u32);
    format!("ux{pid}{role}{n}")
}

/// The MAC address of `dev` in `ns`, from sysfs as `ip netns exec` mounts it.
pub(crate) fn mac(ns: &Namespace, dev: &str) -> Result<String, Error> {
    Ok(ns.exec(&["cat", &format!("/sys/class/net/{dev}/address")])?.trim().to_owned())
}

/// A permanent neighbour entry for `peer` (v4 or v6) on `dev`: no ARP or neighbour discovery
/// on a measured path. While a neighbour resolves, the kernel queues datagrams and flushes
/// them later from another context, which reorders the first ones and drops past its queue
/// limit.
pub(crate) fn static_neighbour(ns: &Namespace, dev: &str, peer: &str, mac: &str) -> Result<(), Error> {
    ip(&["-n", ns.name(), "neigh", "replace", peer, "lladdr", mac, "dev", dev, "nud", "permanent"]).map(drop)
}

/// A device's drop counters, from `ip -s -o link show`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// Received packets the device or the stack behind it dropped (`RX: dropped`; on veth
    /// also the backlog's drops).
    pub rx_dropped: u64,
    /// Packets the device could not pass on (`TX: dropped`; on veth the peer's full NAPI
    /// ring or backlog).
    pub tx_dropped: u64,
}

/// The drop counters of `dev` in `ns` (see [`parse_drop_counts`]).
pub(crate) fn drop_counts(ns: &Namespace, dev: &str) -> Result<DropCounts, Error> {
    let out = ip(&["-n", ns.name(), "-s", "-o", "link", "show", "dev", dev])?;
    parse_drop_counts(&out).ok_or_else(|| Error::SettingDidNotTake {
        dev: dev.to_owned(),
        setting: "statistics".to_owned(),
        wanted: "RX and TX lines with a dropped column".to_owned(),
        got: out.trim().to_owned(),
    })
}

/// Parses the one-line `ip -s -o link show` form, where `\` separates what would be lines:
/// `RX: bytes packets errors dropped ...` followed by the figures, then the same for `TX:`.
pub fn parse_drop_counts(text: &str) -> Option<DropCounts> {
    let parts: Vec<&str> = text.split('\\').map(str::trim).collect();
    let dropped = |side: &str| {
        let i = parts.iter().position(|p| p.starts_with(side))?;
        let col = parts[i].split_whitespace().skip(1).position(|w| w == "dropped")?;
        parts.get(i + 1)?.split_whitespace().nth(col)?.parse().ok()
    };
    Some(DropCounts { rx_dropped: dropped("RX:")?, tx_dropped: dropped("TX:")? })
}

/// The features of `dev` in `ns`, parsed from `ethtool -k` (see [`parse_features`]).
pub(crate) fn features(ns: &Namespace, dev: &str) -> Result<BTreeMap<String, String>, Error> {
    let out = ns.exec_timeout(&["ethtool", "-k", dev], TOOL_TIMEOUT)?;
    Ok(parse_features(&out))
}

/// `ethtool -K <dev> <name> <value>...` in `ns`, then reads them back and fails with
/// [`Error::SettingDidNotTake`] if any differs (ethtool itself exits 0 when the kernel silently
/// keeps a feature fixed).
pub(crate) fn set_features(ns: &Namespace, dev: &str, settings: &[(&str, &str)]) -> Result<(), Error> {
    let mut args = vec!["ethtool", "-K", dev];
    for (name, value) in settings {
        args.push(name);
        args.push(value);
    }
    ns.exec_timeout(&args, TOOL_TIMEOUT)?;
    expect_features(ns, dev, settings)
}

/// Receive packet steering on `dev`'s first receive queue: its packets are handed to the CPUs
/// in `cpu_mask` (bit n = CPU n) by hash (`/sys/class/net/<dev>/queues/rx-0/rps_cpus`, written
/// inside `ns`); 0 turns it off. The value is read back and compared.
pub(crate) fn set_rps(ns: &Namespace, dev: &str, cpu_mask: u64) -> Result<(), Error> {
    let file = format!("/sys/class/net/{dev}/queues/rx-0/rps_cpus");
    // `ip netns exec` mounts the namespace's own sysfs, so the write goes through it. The device
    // name is ours (letters and digits), safe inside the shell string.
    let got = ns.exec_timeout(&["sh", "-c", &format!("echo {cpu_mask:x} > {file} && cat {file}")], TOOL_TIMEOUT)?;
    // The kernel prints the mask in 32-bit words separated by commas, zero-padded.
    let read = u64::from_str_radix(&got.trim().replace(',', ""), 16).ok();
    if read != Some(cpu_mask) {
        return Err(Error::SettingDidNotTake {
            dev: dev.to_owned(),
            setting: "rps_cpus".to_owned(),
            wanted: format!("{cpu_mask:x}"),
            got: got.trim().to_owned(),
        });
    }
    Ok(())
}

/// Fails with [`Error::SettingDidNotTake`] unless every feature in `wanted` has its value.
pub(crate) fn expect_features(ns: &Namespace, dev: &str, wanted: &[(&str, &str)]) -> Result<(), Error> {
    let features = features(ns, dev)?;
    for (name, value) in wanted {
        // ethtool's long names for the short ones used with -K.
        let long = match *name {
            "gro" => "generic-receive-offload",
            "gso" => "generic-segmentation-offload",
            "tso" => "tcp-segmentation-offload",
            other => other,
        };
        let got = features.get(long).map_or("missing", String::as_str);
        if got != *value {
            return Err(Error::SettingDidNotTake {
                dev: dev.to_owned(),
                setting: (*name).to_owned(),
                wanted: (*value).to_owned(),
                got: got.to_owned(),
            });
        }
    }
    Ok(())
}

/// Parses `ethtool -k` output into feature name -> state (`"on"` or `"off"`).
///
/// ```text
/// Features for ux123r0:
/// rx-checksumming: on
/// tx-checksumming: on
///         tx-checksum-ipv4: off [fixed]
/// rx-udp-gro-forwarding: on
/// ```
///
/// Annotations such as `[fixed]` (cannot be changed) or `[requested on]` (asked for but not in
/// effect) are dropped: the value is the state in effect. Lines without `name: state` are
/// skipped.
pub fn parse_features(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with("Features for "))
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(':')?;
            let state = rest.split_whitespace().next()?;
            (!name.is_empty() && !name.contains(' ')).then(|| (name.to_owned(), state.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_names_fit() {
        for pid in [1, 42, 4_194_304] {
            for serial in [0, 9, 99_999, u32::MAX] {
                for role in ['s', 'a', 'b', 'c'] {
                    let n = dev_name(pid, serial, role);
                    assert!(n.len() <= MAX_IFNAME_LEN, "{n}");
                    assert!(n.starts_with(&format!("ux{pid}{role}")), "{n}");
                }
            }
        }
        assert_eq!(dev_name(1234, 7, 'c'), "ux1234c7");
    }

    #[test]
    fn drop_counts_parse() {
        let text = "7: ux1t0@if6: <BROADCAST,UP> mtu 1500 qdisc noqueue state UP\\    link/ether 1a:2b brd ff:ff\\    \
                    RX:  bytes packets errors dropped  missed   mcast           \\    900 9 0 4 0 0 \\    \
                    TX:  bytes packets errors dropped carrier collsns           \\    700 7 0 3 0 0 ";
        assert_eq!(parse_drop_counts(text), Some(DropCounts { rx_dropped: 4, tx_dropped: 3 }));
        assert_eq!(parse_drop_counts("7: ux1t0: <UP> mtu 1500"), None);
        assert_eq!(parse_drop_counts("RX: bytes dropped\\ 1 x\\ TX: bytes dropped\\ 1 2"), None);
    }

    #[test]
    fn features_parse() {
        let text = "Features for ux1r0:\n\
                    rx-checksumming: on\n\
                    tx-checksumming: on\n\
                    \ttx-checksum-ipv4: off [fixed]\n\
                    generic-receive-offload: on\n\
                    tx-udp-segmentation: off [requested on]\n\
                    rx-udp-gro-forwarding: on\n\
                    \n\
                    garbage without colon\n";
        let f = parse_features(text);
        assert_eq!(f["rx-checksumming"], "on");
        assert_eq!(f["tx-checksum-ipv4"], "off");
        assert_eq!(f["tx-udp-segmentation"], "off");
        assert_eq!(f["rx-udp-gro-forwarding"], "on");
        assert_eq!(f.len(), 6);
    }
}
