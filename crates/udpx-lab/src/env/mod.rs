//! The environment recorded beside every benchmark figure, and the facts `udpx probe` judges.
//!
//! A figure means little without the machine it came from: the same GSO benchmark differs by
//! 3x between a device with UDP segmentation offload and one without, and SO_TXTIME "works"
//! on a kernel that silently ignores it when no fq or etf qdisc exists. [`Environment`] holds
//! what was read: kernel, CPU, network sysctls, the probed [`udpx::KernelCaps`], which pacing
//! qdiscs exist, and per device ([`DeviceInfo`]) the MTU, driver, offloads, root qdisc,
//! queues, RPS/XPS masks, threaded NAPI and, for devices on a bus, their interrupts.
//!
//! # Best effort
//!
//! Every read may fail (no `/sys`, not root, no `ethtool`, a device that went away): it then
//! yields `None`, an empty list or [`Availability::Unknown`], never an error or a panic. The
//! parsers are pure functions over kernel text and are table-tested beside them (`parse.rs`).
//!
//! # Where things are read
//!
//! Kernel-wide files (`/proc/cpuinfo`, `/proc/interrupts`, `/proc/irq`) are read directly.
//! The `net.*` sysctls are read in the calling thread's network namespace (several are per
//! namespace since Linux 6.x). A device inside a [`Namespace`] is read through
//! `ip netns exec` (which mounts that namespace's own `/sys`): one small shell script for its
//! sysfs files, plus `ethtool` and `tc`.
//!
//! Which qdiscs exist is probed once per process, in a throwaway namespace, by installing
//! each on its `lo` (never on a real device); that needs root, otherwise it is `unknown`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use udpx::KernelCaps;
use udpx_netns::{run_bounded, Namespace};

use crate::cpu;

mod parse;

pub use parse::{
    format_cpumask, mentions, parse_cpuinfo, parse_cpumask, parse_default_route, parse_ethtool_driver,
    parse_ethtool_features, parse_interrupts, parse_tc_qdiscs, CpuInfo, QdiscLine,
};
use parse::{parse_file_records, parse_triple};

/// The time limit for each `ethtool`, `tc` or `ip netns exec` call (they take milliseconds).
const TOOL_TIMEOUT: Duration = Duration::from_secs(5);

/// The `ethtool -k` features kept in [`DeviceInfo::features`], with the short names the text
/// and Markdown renderings use.
pub const FEATURES_OF_INTEREST: [(&str, &str); 10] = [
    ("tx-checksumming", "tx-csum"),
    ("tx-checksum-ip-generic", "tx-csum-generic"),
    ("scatter-gather", "sg"),
    ("tcp-segmentation-offload", "tso"),
    ("generic-segmentation-offload", "gso"),
    ("tx-udp-segmentation", "tx-udp-seg"),
    ("generic-receive-offload", "gro"),
    ("rx-gro-list", "rx-gro-list"),
    ("rx-udp-gro-forwarding", "rx-udp-gro-fwd"),
    ("rx-gro-hw", "rx-gro-hw"),
];

/// Whether something exists here: found, looked for and not found, or not checkable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Availability {
    /// It exists.
    Present,
    /// It was looked for and does not exist.
    Absent,
    /// It could not be checked (not root, a tool missing, the check itself failed).
    #[default]
    Unknown,
}

impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Availability::Present => "present",
            Availability::Absent => "absent",
            Availability::Unknown => "unknown",
        })
    }
}

/// Which pacing qdiscs this kernel has (found by [`probe_qdiscs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QdiscSupport {
    /// `fq`: enforces SO_TXTIME departure times on `CLOCK_MONOTONIC` (the clock udpx uses).
    pub fq: Availability,
    /// `etf`: enforces departure times on `CLOCK_TAI` only, and drops packets of sockets on
    /// another clock.
    pub etf: Availability,
    /// Why either is [`Availability::Unknown`].
    pub note: Option<String>,
}

/// The network sysctls that bound a UDP datapath, from `/proc/sys` (`None`: unreadable).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sysctls {
    /// `net.core.rmem_max`: largest SO_RCVBUF a non-root socket may ask for, bytes.
    pub rmem_max: Option<u64>,
    /// `net.core.wmem_max`: largest SO_SNDBUF a non-root socket may ask for, bytes.
    pub wmem_max: Option<u64>,
    /// `net.core.rmem_default`: a new socket's receive buffer, bytes.
    pub rmem_default: Option<u64>,
    /// `net.core.wmem_default`: a new socket's send buffer, bytes.
    pub wmem_default: Option<u64>,
    /// `net.core.optmem_max`: per-socket ancillary memory; zerocopy notifications use it.
    pub optmem_max: Option<u64>,
    /// `net.core.netdev_max_backlog`: per-CPU input queue (RPS, lo, veth without NAPI).
    pub netdev_max_backlog: Option<u64>,
    /// `net.ipv4.udp_mem`: min, pressure, max of all UDP buffers together, in pages.
    pub udp_mem: Option<[u64; 3]>,
    /// `net.core.busy_poll`: microseconds poll/select busy-poll (0: off).
    pub busy_poll: Option<u64>,
    /// `net.core.busy_read`: microseconds a blocking read busy-polls (0: off).
    pub busy_read: Option<u64>,
}

/// [`udpx::KernelCaps`], serializable: filled from [`KernelCaps::get`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::struct_excessive_bools)] // reason: udpx::KernelCaps as recorded: independent yes/no kernel facts
pub struct KernelCapsInfo {
    /// Most segments per GSO send; `None` without UDP GSO.
    pub gso_max_segments: Option<usize>,
    /// Whether that limit was measured (false: 64 assumed).
    pub gso_limit_measured: bool,
    /// `UDP_GRO` accepted.
    pub gro: bool,
    /// `SO_TXTIME` accepted (enforced only under fq or etf).
    pub txtime: bool,
    /// `SO_ZEROCOPY` accepted.
    pub zerocopy: bool,
}

impl From<KernelCaps> for KernelCapsInfo {
    fn from(k: KernelCaps) -> Self {
        KernelCapsInfo {
            gso_max_segments: k.gso_max_segments,
            gso_limit_measured: k.gso_limit_measured,
            gro: k.gro,
            txtime: k.txtime,
            zerocopy: k.zerocopy,
        }
    }
}

/// One `ethtool -k` feature: `on`/`off`, and whether the driver lets it change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadState {
    /// Currently on.
    pub on: bool,
    /// Marked `[fixed]`: `ethtool -K` cannot change it.
    pub fixed: bool,
}

impl fmt::Display for OffloadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.on { "on" } else { "off" })?;
        if self.fixed {
            f.write_str(" (fixed)")?;
        }
        Ok(())
    }
}

/// One interrupt of a device, from `/proc/interrupts` and `/proc/irq/<n>/`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqInfo {
    /// The interrupt number.
    pub irq: u32,
    /// The handler name (last column of `/proc/interrupts`), e.g. `eth0-TxRx-0`.
    pub name: String,
    /// `/proc/irq/<n>/smp_affinity`: hex CPU mask the interrupt may go to.
    pub smp_affinity: Option<String>,
    /// `/proc/irq/<n>/affinity_hint`: the driver's suggestion (all zero: none).
    pub affinity_hint: Option<String>,
    /// `/proc/irq/<n>/effective_affinity`: where it actually goes.
    pub effective_affinity: Option<String>,
}

/// What was read about one network device ([`Environment::collect`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Interface name.
    pub name: String,
    /// The namespace it was read in (`None`: the caller's).
    pub namespace: Option<String>,
    /// Whether `/sys/class/net/<name>` was found; if not, everything else is empty.
    pub present: bool,
    /// `/sys/class/net/<name>/operstate`: `up`, `down`, or `unknown` (lo, always).
    pub operstate: Option<String>,
    /// MTU, bytes.
    pub mtu: Option<u32>,
    /// Driver (`ethtool -i`); `None` for lo, which has no driver information.
    pub driver: Option<String>,
    /// Whether it sits on a bus (`/sys/class/net/<name>/device` exists): a NIC, virtio
    /// included, rather than lo, veth or ifb.
    pub physical: Option<bool>,
    /// The [`FEATURES_OF_INTEREST`] that `ethtool -k` listed.
    pub features: BTreeMap<String, OffloadState>,
    /// Kind of the root egress qdisc (`tc qdisc show`), e.g. `noqueue`, `pfifo_fast`, `mq`.
    pub root_qdisc: Option<String>,
    /// Kinds of the other egress qdiscs (children of `mq` or a classful root).
    pub child_qdiscs: Vec<String>,
    /// Number of receive queues (`/sys/class/net/<name>/queues/rx-*`).
    pub rx_queues: Option<usize>,
    /// Number of transmit queues.
    pub tx_queues: Option<usize>,
    /// `rps_cpus` per receive queue (`rx-0` → hex mask; 0: RPS off).
    pub rps_cpus: BTreeMap<String, String>,
    /// `xps_cpus` per transmit queue (absent on single-queue devices).
    pub xps_cpus: BTreeMap<String, String>,
    /// `/sys/class/net/<name>/threaded`: NAPI polls in a kernel thread.
    pub threaded_napi: Option<bool>,
    /// Interrupts of a physical device (by name in `/proc/interrupts`, or the MSI vectors of
    /// its bus device).
    pub irqs: Vec<IrqInfo>,
}

impl DeviceInfo {
    /// The state of an `ethtool -k` feature, if it was read.
    pub fn feature(&self, name: &str) -> Option<OffloadState> {
        self.features.get(name).copied()
    }

    /// The loopback device.
    pub fn is_loopback(&self) -> bool {
        self.name == "lo"
    }

    /// `name`, or `namespace/name` for a device inside a namespace.
    pub fn label(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// All egress qdisc kinds: the root, then its children.
    pub fn qdisc_kinds(&self) -> impl Iterator<Item = &str> {
        self.root_qdisc.iter().chain(self.child_qdiscs.iter()).map(String::as_str)
    }
}

/// The environment of a run; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    /// `uname -r`, from `/proc/sys/kernel/osrelease`.
    pub kernel_release: Option<String>,
    /// The first `model name` of `/proc/cpuinfo`.
    pub cpu_model: Option<String>,
    /// Online CPUs (`/sys/devices/system/cpu/online`).
    pub online_cpus: Option<Vec<usize>>,
    /// Whether the CPU flags include `hypervisor` (a VM); `None` without a flags line.
    pub virtualized: Option<bool>,
    /// Whether the kernel loads modules (`/proc/modules` exists): decides whether
    /// `modprobe sch_fq` can ever help.
    pub loadable_modules: Option<bool>,
    /// The network sysctls.
    pub sysctls: Sysctls,
    /// The probed UDP features of this kernel.
    pub caps: KernelCapsInfo,
    /// Which pacing qdiscs exist.
    pub qdiscs: QdiscSupport,
    /// The device of the IPv4 default route (`/proc/net/route`), if any.
    pub default_route_dev: Option<String>,
    /// The devices asked about, in the order asked.
    pub devices: Vec<DeviceInfo>,
}

impl Environment {
    /// Reads everything; `devices` lists (namespace, name) pairs, `None` meaning the caller's
    /// namespace. Never fails: what cannot be read is left empty (see the module docs).
    ///
    /// Costs a few milliseconds per device (more inside a namespace: one `ip netns exec` per
    /// tool), plus, on the first call in a process, the qdisc probe (a namespace made and
    /// removed) and [`KernelCaps::get`].
    pub fn collect(devices: &[(Option<&Namespace>, &str)]) -> Environment {
        let cpuinfo = read_trimmed("/proc/cpuinfo").map(|t| parse_cpuinfo(&t)).unwrap_or_default();
        let interrupts = read_trimmed("/proc/interrupts").map(|t| parse_interrupts(&t)).unwrap_or_default();
        Environment {
            kernel_release: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu_model: cpuinfo.model,
            online_cpus: cpu::try_online_cpus().ok(),
            virtualized: cpuinfo.hypervisor,
            loadable_modules: match std::fs::metadata("/proc/modules") {
                Ok(_) => Some(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(false),
                Err(_) => None,
            },
            sysctls: read_sysctls(),
            caps: KernelCaps::get().into(),
            qdiscs: probe_qdiscs(),
            default_route_dev: read_trimmed("/proc/net/route").and_then(|t| parse_default_route(&t)),
            devices: devices.iter().map(|&(ns, name)| collect_device(ns, name, &interrupts)).collect(),
        }
    }

    /// Whether anything at all could be read (a kernel release, a sysctl or a device).
    pub fn read_anything(&self) -> bool {
        self.kernel_release.is_some() || self.sysctls != Sysctls::default() || self.devices.iter().any(|d| d.present)
    }

    /// The device list as a Markdown table, for beside a report; a system table first.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("| environment | |\n| --- | --- |\n");
        for (key, value) in self.summary_rows() {
            out.push_str(&format!("| {key} | {} |\n", md_escape(&value)));
        }
        if self.devices.is_empty() {
            return out;
        }
        out.push_str("\n| device | state | driver | MTU | rx/tx queues | qdisc |");
        for (_, short) in FEATURES_OF_INTEREST {
            out.push_str(&format!(" {short} |"));
        }
        out.push_str(" threaded NAPI | rps_cpus |\n| --- | --- | --- | --- | --- | --- |");
        out.push_str(&" --- |".repeat(FEATURES_OF_INTEREST.len() + 2));
        out.push('\n');
        for d in &self.devices {
            let mut row = vec![
                d.label(),
                opt(&d.operstate),
                opt(&d.driver),
                opt(&d.mtu),
                format!("{}/{}", opt(&d.rx_queues), opt(&d.tx_queues)),
                qdisc_text(d),
            ];
            for (long, _) in FEATURES_OF_INTEREST {
                row.push(d.feature(long).map_or("?".to_owned(), |s| s.to_string()));
            }
            row.push(d.threaded_napi.map_or("?".to_owned(), yes_no));
            row.push(join_map(&d.rps_cpus));
            out.push('|');
            for cell in row {
                out.push_str(&format!(" {} |", md_escape(&cell)));
            }
            out.push('\n');
        }
        out
    }

    /// (key, value) rows of the system part, shared by both renderings.
    fn summary_rows(&self) -> Vec<(&'static str, String)> {
        let s = &self.sysctls;
        let cpus = match &self.online_cpus {
            Some(list) => format!("{} online", list.len()),
            None => "? online".to_owned(),
        };
        let vm = match self.virtualized {
            Some(true) => ", VM",
            Some(false) => ", bare metal",
            None => "",
        };
        let udp_mem = s.udp_mem.map_or("?".to_owned(), |[a, b, c]| format!("{a} {b} {c} pages"));
        vec![
            ("kernel", opt(&self.kernel_release)),
            ("CPU", format!("{}, {cpus}{vm}", opt(&self.cpu_model))),
            ("UDP features", caps_text(&self.caps)),
            ("pacing qdiscs", format!("fq {}, etf {}", self.qdiscs.fq, self.qdiscs.etf)),
            ("socket buffers max", format!("rmem {}, wmem {}", bytes(s.rmem_max), bytes(s.wmem_max))),
            ("socket buffers default", format!("rmem {}, wmem {}", bytes(s.rmem_default), bytes(s.wmem_default))),
            ("optmem_max", bytes(s.optmem_max)),
            ("netdev_max_backlog", opt(&s.netdev_max_backlog)),
            ("udp_mem", udp_mem),
            ("busy_poll / busy_read", format!("{} / {} us", opt(&s.busy_poll), opt(&s.busy_read))),
        ]
    }
}

/// One paragraph, for printing beside a table.
impl fmt::Display for Environment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.summary_rows().into_iter().map(|(k, v)| format!("{k}: {v}")).collect();
        f.write_str(&parts.join("; "))?;
        for d in &self.devices {
            write!(f, "; {}: ", d.label())?;
            if !d.present {
                f.write_str("not found")?;
                continue;
            }
            write!(
                f,
                "{}, MTU {}, {}/{} queues, qdisc {}",
                opt(&d.driver),
                opt(&d.mtu),
                opt(&d.rx_queues),
                opt(&d.tx_queues),
                qdisc_text(d)
            )?;
            if d.operstate.as_deref() == Some("down") {
                f.write_str(", down")?;
            }
            for (long, short) in FEATURES_OF_INTEREST {
                if let Some(state) = d.feature(long) {
                    write!(f, ", {short} {}", if state.on { "on" } else { "off" })?;
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Where a device lives: the caller's namespace, or one entered through `ip netns exec`.
#[derive(Clone, Copy)]
enum Place<'a> {
    Here,
    Netns(&'a Namespace),
}

/// Prints each readable file given as an argument as `RS path US contents`, so one
/// `ip netns exec` reads them all.
const READ_FILES_SCRIPT: &str =
    r#"for f; do if v=$(cat -- "$f" 2>/dev/null); then printf '\036%s\037%s\n' "$f" "$v"; fi; done"#;

impl Place<'_> {
    /// Runs a tool; `None` if it cannot start, fails or times out.
    fn run(self, args: &[&str]) -> Option<String> {
        match self {
            Place::Here => {
                let (program, rest) = args.split_first()?;
                run_bounded(Command::new(program).args(rest), TOOL_TIMEOUT).ok()
            }
            Place::Netns(ns) => ns.exec_timeout(args, TOOL_TIMEOUT).ok(),
        }
    }

    /// Reads small text files, trimmed; unreadable ones are missing from the map.
    fn read_files(self, paths: &[String]) -> BTreeMap<String, String> {
        match self {
            Place::Here => paths.iter().filter_map(|p| Some((p.clone(), read_trimmed(p)?))).collect(),
            Place::Netns(_) => {
                let mut args = vec!["sh", "-c", READ_FILES_SCRIPT, "sh"];
                args.extend(paths.iter().map(String::as_str));
                self.run(&args).map(|out| parse_file_records(&out)).unwrap_or_default()
            }
        }
    }

    /// The entries of a directory, sorted.
    fn list_dir(self, path: &str) -> Option<Vec<String>> {
        let mut names: Vec<String> = match self {
            Place::Here => {
                std::fs::read_dir(path).ok()?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
            }
            Place::Netns(_) => self.run(&["ls", "-1", path])?.lines().map(str::to_owned).collect(),
        };
        names.sort();
        Some(names)
    }

    /// The resolved path of a symbolic link, if everything it names exists.
    fn canonical(self, path: &str) -> Option<String> {
        match self {
            Place::Here => std::fs::canonicalize(path).ok().map(|p| p.to_string_lossy().into_owned()),
            Place::Netns(_) => {
                self.run(&["readlink", "-e", path]).map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
            }
        }
    }
}

/// Reads a file and trims trailing whitespace; `None` if unreadable.
fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim_end().to_owned())
}

fn read_sysctls() -> Sysctls {
    let num = |name: &str| read_trimmed(format!("/proc/sys/net/core/{name}")).and_then(|s| s.parse().ok());
    Sysctls {
        rmem_max: num("rmem_max"),
        wmem_max: num("wmem_max"),
        rmem_default: num("rmem_default"),
        wmem_default: num("wmem_default"),
        optmem_max: num("optmem_max"),
        netdev_max_backlog: num("netdev_max_backlog"),
        udp_mem: read_trimmed("/proc/sys/net/ipv4/udp_mem").and_then(|s| parse_triple(&s)),
        busy_poll: num("busy_poll"),
        busy_read: num("busy_read"),
    }
}

fn collect_device(ns: Option<&Namespace>, name: &str, interrupts: &[(u32, String)]) -> DeviceInfo {
    let place = ns.map_or(Place::Here, Place::Netns);
    let mut info =
        DeviceInfo { name: name.to_owned(), namespace: ns.map(|n| n.name().to_owned()), ..DeviceInfo::default() };
    // A name with a slash or dots could read other sysfs files; interface names never have
    // them (dev_valid_name).
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return info;
    }
    let base = format!("/sys/class/net/{name}");
    let queues = place.list_dir(&format!("{base}/queues")).unwrap_or_default();
    let rx: Vec<&String> = queues.iter().filter(|q| q.starts_with("rx-")).collect();
    let tx: Vec<&String> = queues.iter().filter(|q| q.starts_with("tx-")).collect();
    let mut paths = vec![format!("{base}/mtu"), format!("{base}/threaded"), format!("{base}/operstate")];
    paths.extend(rx.iter().map(|q| format!("{base}/queues/{q}/rps_cpus")));
    paths.extend(tx.iter().map(|q| format!("{base}/queues/{q}/xps_cpus")));
    let files = place.read_files(&paths);
    let Some(mtu) = files.get(&paths[0]) else {
        return info; // no such device
    };
    info.present = true;
    info.mtu = mtu.parse().ok();
    info.operstate = files.get(&paths[2]).cloned();
    info.threaded_napi = files.get(&paths[1]).and_then(|s| s.parse::<u8>().ok()).map(|v| v != 0);
    info.rx_queues = Some(rx.len()).filter(|&n| n > 0);
    info.tx_queues = Some(tx.len()).filter(|&n| n > 0);
    for (dir, map) in [("rps_cpus", &mut info.rps_cpus), ("xps_cpus", &mut info.xps_cpus)] {
        for q in queues.iter() {
            if let Some(v) = files.get(&format!("{base}/queues/{q}/{dir}")) {
                map.insert(q.clone(), v.clone());
            }
        }
    }
    info.driver = place.run(&["ethtool", "-i", name]).and_then(|t| parse_ethtool_driver(&t));
    info.features = place
        .run(&["ethtool", "-k", name])
        .map(|t| parse_ethtool_features(&t))
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| FEATURES_OF_INTEREST.iter().any(|(long, _)| long == k))
        .collect();
    if let Some(text) = place.run(&["tc", "qdisc", "show", "dev", name]) {
        let qdiscs = parse_tc_qdiscs(&text);
        info.root_qdisc = qdiscs.iter().find(|q| q.parent.is_none()).map(|q| q.kind.clone());
        info.child_qdiscs =
            qdiscs.into_iter().filter(|q| q.parent.is_some() && !q.is_ingress()).map(|q| q.kind).collect();
    }
    let device = place.canonical(&format!("{base}/device"));
    info.physical = Some(device.is_some());
    if let Some(device) = device {
        info.irqs = device_irqs(name, &device, interrupts);
    }
    info
}

/// The interrupts of a device on a bus: those whose `/proc/interrupts` name mentions the
/// interface, else the MSI vectors of its bus device (or of the parent: a virtio device's
/// vectors belong to its PCI function). The bus path is the same in every namespace.
fn device_irqs(name: &str, device: &str, interrupts: &[(u32, String)]) -> Vec<IrqInfo> {
    let mut numbers: Vec<u32> = interrupts.iter().filter(|(_, desc)| mentions(desc, name)).map(|&(n, _)| n).collect();
    if numbers.is_empty() {
        let device = Path::new(device);
        for dir in [Some(device), device.parent()].into_iter().flatten() {
            if let Ok(entries) = std::fs::read_dir(dir.join("msi_irqs")) {
                numbers = entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
                break;
            }
        }
    }
    numbers.sort_unstable();
    numbers.dedup();
    numbers
        .into_iter()
        .map(|irq| {
            let file = |f: &str| read_trimmed(format!("/proc/irq/{irq}/{f}"));
            IrqInfo {
                irq,
                name: interrupts
                    .iter()
                    .find(|(n, _)| *n == irq)
                    .and_then(|(_, desc)| desc.split_whitespace().last())
                    .unwrap_or_default()
                    .to_owned(),
                smp_affinity: file("smp_affinity"),
                affinity_hint: file("affinity_hint"),
                effective_affinity: file("effective_affinity"),
            }
        })
        .collect()
}

/// Which pacing qdiscs exist, probed once per process: in a throwaway namespace, a control
/// qdisc (`pfifo`, always built in) proves `tc` works there, then `fq` and `etf` are installed
/// on its `lo`. "Specified qdisc kind is unknown" means absent; the kernel loads a missing
/// `sch_*` module by itself on that request, so a module counts as present.
pub fn probe_qdiscs() -> QdiscSupport {
    static CACHE: OnceLock<QdiscSupport> = OnceLock::new();
    CACHE.get_or_init(probe_qdiscs_uncached).clone()
}

fn probe_qdiscs_uncached() -> QdiscSupport {
    let unknown = |why: String| QdiscSupport { note: Some(why), ..QdiscSupport::default() };
    if !udpx_netns::is_root() {
        return unknown("not root: cannot install a qdisc in a scratch namespace".to_owned());
    }
    let ns = match Namespace::create_unique("qdisc") {
        Ok(ns) => ns,
        Err(e) => return unknown(format!("no scratch namespace: {e}")),
    };
    let try_qdisc = |spec: &[&str]| -> Result<(), String> {
        let mut args = vec!["tc", "qdisc", "replace", "dev", "lo", "root"];
        args.extend_from_slice(spec);
        ns.exec_timeout(&args, TOOL_TIMEOUT).map(|_| ()).map_err(|e| match e {
            udpx_netns::Error::Command { stderr, .. } => stderr,
            other => other.to_string(),
        })
    };
    if let Err(why) = try_qdisc(&["pfifo"]) {
        return unknown(format!("tc does not work in a scratch namespace: {why}"));
    }
    let mut note = None;
    let mut judge = |spec: &[&str]| match try_qdisc(spec) {
        Ok(()) => Availability::Present,
        Err(why) if why.contains("qdisc kind is unknown") => Availability::Absent,
        Err(why) => {
            note = Some(format!("{}: {why}", spec[0]));
            Availability::Unknown
        }
    };
    let fq = judge(&["fq"]);
    let etf = judge(&["etf", "clockid", "CLOCK_TAI", "delta", "100000"]);
    QdiscSupport { fq, etf, note }
}

// ---------------------------------------------------------------------------------------------
// Rendering helpers

fn opt<T: fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or("?".to_owned(), T::to_string)
}

fn yes_no(b: bool) -> String {
    (if b { "yes" } else { "no" }).to_owned()
}

/// `4 MiB`, `128 KiB` or `212992 B`.
pub fn bytes(v: Option<u64>) -> String {
    match v {
        None => "?".to_owned(),
        Some(n) if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        Some(n) if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        Some(n) => format!("{n} B"),
    }
}

fn caps_text(c: &KernelCapsInfo) -> String {
    let gso = match c.gso_max_segments {
        Some(n) => format!("GSO {n} segments ({})", if c.gso_limit_measured { "measured" } else { "assumed" }),
        None => "no GSO".to_owned(),
    };
    format!("{gso}, GRO {}, SO_TXTIME {}, zerocopy {}", yes_no(c.gro), yes_no(c.txtime), yes_no(c.zerocopy))
}

fn qdisc_text(d: &DeviceInfo) -> String {
    let mut s = opt(&d.root_qdisc);
    if !d.child_qdiscs.is_empty() {
        let mut kinds = d.child_qdiscs.clone();
        kinds.sort();
        kinds.dedup();
        s.push_str(&format!(" ({})", kinds.join(", ")));
    }
    s
}

fn join_map(m: &BTreeMap<String, String>) -> String {
    if m.is_empty() {
        return "?".to_owned();
    }
    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_render_in_binary_units() {
        assert_eq!(bytes(Some(4 << 20)), "4 MiB");
        assert_eq!(bytes(Some(131072)), "128 KiB");
        assert_eq!(bytes(Some(212992)), "208 KiB");
        assert_eq!(bytes(Some(1000)), "1000 B");
        assert_eq!(bytes(None), "?");
    }

    #[test]
    fn renderings_of_a_synthetic_environment() {
        let mut env = Environment {
            kernel_release: Some("6.18.0".to_owned()),
            cpu_model: Some("Some | CPU".to_owned()),
            online_cpus: Some(vec![0, 1]),
            ..Environment::default()
        };
        env.devices.push(DeviceInfo {
            name: "eth0".to_owned(),
            present: true,
            mtu: Some(1500),
            root_qdisc: Some("mq".to_owned()),
            child_qdiscs: vec!["fq".to_owned(), "fq".to_owned()],
            features: [("tx-udp-segmentation".to_owned(), OffloadState { on: false, fixed: true })].into(),
            ..DeviceInfo::default()
        });
        let text = env.to_string();
        assert!(text.contains("kernel: 6.18.0"), "{text}");
        assert!(text.contains("eth0: ?, MTU 1500"), "{text}");
        assert!(text.contains("qdisc mq (fq)"), "{text}");
        assert!(!text.contains('\n'), "one paragraph: {text}");
        let md = env.to_markdown();
        assert!(md.contains("| CPU | Some \\| CPU, 2 online |"), "{md}");
        assert!(md.contains("| eth0 | ? | ? | 1500 | ?/? | mq (fq) |"), "{md}");
        assert!(md.contains("| off (fixed) |"), "{md}");
        // Every device row has as many cells as the header.
        let cells = |l: &str| l.matches(" |").count();
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| device")).collect();
        let header = cells(lines[0]);
        assert!(md.lines().filter(|l| l.starts_with("| eth0")).all(|l| cells(l) == header));
        let json = serde_json::to_string(&env).unwrap();
        assert!(json.contains("\"fq\":\"unknown\""), "{json}");
        let back: Environment = serde_json::from_str(&json).unwrap();
        assert_eq!(back, env);
    }

    #[test]
    fn missing_device_is_not_an_error() {
        let env = Environment::collect(&[(None, "udpx-no-such-dev"), (None, "../x")]);
        assert!(env.devices.iter().all(|d| !d.present && d.mtu.is_none()));
        assert!(env.to_string().contains("udpx-no-such-dev: not found"));
    }

    #[test]
    fn loopback_here_and_inside_a_namespace() {
        let here = Environment::collect(&[(None, "lo")]);
        let lo = &here.devices[0];
        assert!(lo.present);
        assert_eq!(lo.physical, Some(false));
        assert!(lo.mtu.is_some());
        println!("{here}");
        if udpx_netns::skip_unless_capable("env: lo inside a namespace") {
            return;
        }
        let ns = Namespace::create_unique("envlo").unwrap();
        // A down device has no qdisc at all; `up` attaches noqueue.
        ns.exec(&["ip", "link", "set", "dev", "lo", "up"]).unwrap();
        let env = Environment::collect(&[(Some(&ns), "lo"), (Some(&ns), "nope0")]);
        let lo = &env.devices[0];
        assert!(lo.present, "{lo:?}");
        assert_eq!(lo.namespace.as_deref(), Some(ns.name()));
        assert_eq!(lo.mtu, Some(65536));
        assert_eq!(lo.operstate.as_deref(), Some("unknown"));
        assert_eq!(lo.rx_queues, Some(1));
        assert_eq!(lo.rps_cpus.get("rx-0").map(String::as_str), Some("0"));
        assert_eq!(lo.root_qdisc.as_deref(), Some("noqueue"));
        assert_eq!(lo.physical, Some(false));
        assert!(lo.feature("tx-udp-segmentation").is_some(), "{lo:?}");
        assert!(!env.devices[1].present);
        println!("{}", env.to_markdown());
    }
}
