//! Two namespaces joined by a veth pair, in one of two offload profiles.
//!
//! ```text
//!   namespace udpx-<pid>-<n>-tx              namespace udpx-<pid>-<n>-rx
//!  +-----------------------------+          +-----------------------------+
//!  | lo (up)                     |          | lo (up)                     |
//!  | ux<pid>t<n>                 |   veth   | ux<pid>r<n>                 |
//!  |   192.0.2.1/24              |<-------->|   192.0.2.2/24              |
//!  |   2001:db8::1/64 nodad      |          |   2001:db8::2/64 nodad      |
//!  +-----------------------------+          +-----------------------------+
//! ```
//!
//! Addresses come from the documentation ranges (RFC 5737, RFC 3849): they are routed nowhere,
//! and each pair lives in its own namespaces, so every test network can use the same ones.
//!
//! Device names are global in one respect: a threaded NAPI instance runs as a kernel thread
//! named `napi/<dev>-<napi id>` in the initial pid namespace, which is how [`TestNet::setup`]
//! finds it to pin it. The pid in the device name keeps those names unique between processes.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::thread;
use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::command::TOOL_TIMEOUT;
use crate::link::{self, ip, link_mtu};
pub use crate::link::{parse_drop_counts, parse_features, DropCounts};
use crate::namespace::{name_for, next_serial, Namespace};
use crate::Error;

/// IPv4 address of the tx end (RFC 5737 TEST-NET-1).
pub const TX_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// IPv4 address of the rx end.
pub const RX_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// Prefix length of both IPv4 addresses.
pub const V4_PREFIX: u8 = 24;
/// IPv6 address of the tx end (RFC 3849 documentation prefix).
pub const TX_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
/// IPv6 address of the rx end.
pub const RX_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
/// Prefix length of both IPv6 addresses.
pub const V6_PREFIX: u8 = 64;

pub use crate::link::MAX_IFNAME_LEN;

/// Smallest MTU accepted: IPv6 needs 1280 (RFC 8200 section 5); below it the kernel disables
/// IPv6 on the device and the IPv6 address cannot be added.
pub const MIN_MTU: u32 = 1280;
/// Largest MTU accepted (ETH_MAX_MTU); veth may allow a little less, and `ip` then says so.
pub const MAX_MTU: u32 = 65535;

/// How long to look for the NAPI kernel thread after switching threaded NAPI on. Creating it is
/// synchronous in the kernels seen so far (it exists when the sysfs write returns); the wait is
/// a margin.
const NAPI_THREAD_WAIT: Duration = Duration::from_secs(1);

/// How the veth pair treats UDP GSO and GRO: which CPU does segmentation and receive work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// The veth as it comes: it advertises UDP segmentation offload, so a GSO super-buffer
    /// crosses the pair whole and the receive stack runs in the sender's softirq on the
    /// sender's CPU. Like a NIC with USO talking to a host with LRO, but free.
    #[default]
    Offload,
    /// No segmentation offload on the tx end (`tx-udp-segmentation off`: the GSO layer splits
    /// in software before the device), GRO with `rx-udp-gro-forwarding` on the rx end, and rx
    /// processing in a threaded NAPI kernel thread, pinned to `rx_cpu` if given. Like a NIC
    /// without USO: the costs land where they would on real hardware.
    Software,
}

impl Profile {
    /// Both profiles, for loops in tests and benchmarks.
    pub const ALL: [Profile; 2] = [Profile::Offload, Profile::Software];

    /// The lowercase name used in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Offload => "offload",
            Profile::Software => "software",
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Profile {
    type Err = Error;

    fn from_str(s: &str) -> Result<Profile, Error> {
        match s {
            "offload" => Ok(Profile::Offload),
            "software" => Ok(Profile::Software),
            other => {
                Err(Error::InvalidConfig { why: format!("unknown profile {other:?}: use \"offload\" or \"software\"") })
            }
        }
    }
}

/// Where a veth end's receive processing runs, for benchmarks that compare a UDP server with a
/// TCP one ([`TestNet::receive_on`]).
///
/// veth hands a packet to its NAPI instance (GRO, and the kernel thread if threaded) only if
/// the sending end has no TSO or the packet is UDP with UDP GRO forwarding on at this end
/// (`veth_skb_is_eligible_for_gro`): every TCP segment from a TSO end goes to the backlog
/// instead, whatever the setting. Receive packet steering to the receiving CPU is on in both
/// modes, so the backlog's work runs on the receiving side too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Napi {
    /// NAPI polls in softirq on the CPU that raised it (veth: the sender's), and steering
    /// carries each packet's protocol work to the receiving CPU. TCP and UDP alike: protocol
    /// work in softirq on the receiving CPU, as after a NIC's interrupt. UDP's veth poll and
    /// GRO run on the sending CPU (a NIC's would run on the receiving one).
    #[default]
    Softirq,
    /// NAPI polls in a kernel thread pinned to the receiving CPU: UDP's poll, GRO and protocol
    /// work there, at the cost of a switch to that thread per poll (a NIC's softirq needs
    /// none). TCP from a TSO end bypasses the thread (above): only steering brings it there.
    Threaded,
}

impl Napi {
    /// The lowercase name used in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Napi::Softirq => "softirq",
            Napi::Threaded => "threaded",
        }
    }
}

impl fmt::Display for Napi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Napi {
    type Err = Error;

    fn from_str(s: &str) -> Result<Napi, Error> {
        match s {
            "softirq" => Ok(Napi::Softirq),
            "threaded" => Ok(Napi::Threaded),
            other => Err(Error::InvalidConfig {
                why: format!("unknown NAPI mode {other:?}: use \"softirq\" or \"threaded\""),
            }),
        }
    }
}

/// One end of the veth pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The sending end.
    Tx,
    /// The receiving end.
    Rx,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Side {
        match self {
            Side::Tx => Side::Rx,
            Side::Rx => Side::Tx,
        }
    }
}

/// What [`TestNet::setup`] builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestNetConfig {
    /// Offload behaviour of the pair.
    pub profile: Profile,
    /// MTU of both veth ends, [`MIN_MTU`]..=[`MAX_MTU`].
    pub mtu: u32,
    /// The CPU the caller will run its sender on. Recorded in [`TestNet::tx_cpu`] for the
    /// caller and its report; setup itself pins nothing on the tx side (there is no tx kernel
    /// thread in either profile).
    pub tx_cpu: Option<usize>,
    /// The CPU for receive processing: with [`Profile::Software`] the NAPI kernel thread is
    /// pinned to it. With [`Profile::Offload`] receive work runs on the sender's CPU and this
    /// is only recorded.
    pub rx_cpu: Option<usize>,
}

impl Default for TestNetConfig {
    /// [`Profile::Offload`], MTU 1500, no CPU pinning.
    fn default() -> TestNetConfig {
        TestNetConfig { profile: Profile::Offload, mtu: 1500, tx_cpu: None, rx_cpu: None }
    }
}

impl TestNetConfig {
    /// The default config with the given profile.
    pub fn new(profile: Profile) -> TestNetConfig {
        TestNetConfig { profile, ..TestNetConfig::default() }
    }

    fn validate(&self) -> Result<(), Error> {
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return Err(Error::InvalidConfig {
                why: format!("MTU {} is outside {MIN_MTU}..={MAX_MTU} (IPv6 needs at least {MIN_MTU})", self.mtu),
            });
        }
        for (what, cpu) in [("tx_cpu", self.tx_cpu), ("rx_cpu", self.rx_cpu)] {
            if let Some(cpu) = cpu {
                if cpu >= CpuSet::count() {
                    return Err(Error::InvalidConfig { why: format!("{what} {cpu} is beyond the largest CPU set") });
                }
            }
        }
        Ok(())
    }
}

/// A kernel thread running one NAPI instance of the rx device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NapiThread {
    /// Its pid (kernel threads are single-threaded processes).
    pub pid: u32,
    /// Its name, `napi/<dev>-<napi id>`.
    pub name: String,
}

/// Two namespaces joined by a veth pair, configured per [`TestNetConfig`]; dropping it removes
/// both namespaces, which destroys the veth pair.
///
/// Create sockets with `tx.run(...)` / `rx.run(...)`. Drop sockets and join threads that live
/// in the namespaces before the `TestNet` (see [`Namespace`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct TestNet {
    /// The sending namespace. Dropped first, which destroys the veth pair.
    pub tx: Namespace,
    /// The receiving namespace.
    pub rx: Namespace,
    /// The veth end in `tx`, `ux<pid>t<n>`.
    pub tx_dev: String,
    /// The veth end in `rx`, `ux<pid>r<n>`.
    pub rx_dev: String,
    /// [`TX_V4`].
    pub tx_v4: Ipv4Addr,
    /// [`RX_V4`].
    pub rx_v4: Ipv4Addr,
    /// [`TX_V6`].
    pub tx_v6: Ipv6Addr,
    /// [`RX_V6`].
    pub rx_v6: Ipv6Addr,
    /// The profile set up.
    pub profile: Profile,
    /// The MTU of both ends, as read back from the kernel.
    pub mtu: u32,
    /// From the config, for the caller to pin its sender.
    pub tx_cpu: Option<usize>,
    /// From the config; with [`Profile::Software`] the NAPI threads are pinned to it.
    pub rx_cpu: Option<usize>,
    /// [`Profile::Software`] only: the rx device's NAPI kernel threads (one per rx queue; a
    /// default veth has one). Changing GRO on the rx device afterwards makes the kernel replace
    /// them with new, unpinned threads.
    pub rx_napi_threads: Vec<NapiThread>,
    /// How long setup took, for reports.
    pub setup_time: Duration,
}

impl TestNet {
    /// Creates the namespaces and the veth pair, addresses and brings everything up, applies
    /// the profile and verifies that its settings took.
    ///
    /// On any error, whatever was created is removed again before this returns.
    pub fn setup(cfg: &TestNetConfig) -> Result<TestNet, Error> {
        cfg.validate()?;
        crate::check_capable()?;
        let start = Instant::now();
        let serial = next_serial();
        let (tx_dev, rx_dev) = veth_names(std::process::id(), serial);
        // Dropped on any early return below, removing what exists so far.
        let tx = Namespace::create(&name_for(serial, "tx"))?;
        let rx = Namespace::create(&name_for(serial, "rx"))?;

        ip(&["-n", tx.name(), "link", "add", &tx_dev, "type", "veth", "peer", "name", &rx_dev, "netns", rx.name()])?;
        let mtu = cfg.mtu.to_string();
        for (ns, dev, v4, v6) in [(&tx, &tx_dev, TX_V4, TX_V6), (&rx, &rx_dev, RX_V4, RX_V6)] {
            let n = ns.name();
            ip(&["-n", n, "link", "set", "dev", "lo", "up"])?;
            let v4 = format!("{v4}/{V4_PREFIX}");
            ip(&["-n", n, "addr", "add", &v4, "dev", dev])?;
            // nodad: usable at once instead of "tentative" for about a second.
            let v6 = format!("{v6}/{V6_PREFIX}");
            ip(&["-n", n, "addr", "add", &v6, "dev", dev, "nodad"])?;
            ip(&["-n", n, "link", "set", "dev", dev, "mtu", &mtu, "up"])?;
        }
        // Static neighbour entries: no ARP or neighbour discovery on the measured path. While a
        // neighbour resolves, the kernel queues datagrams and flushes them later from another
        // context, which reorders the first ones and drops past its queue limit.
        let (tx_mac, rx_mac) = (link::mac(&tx, &tx_dev)?, link::mac(&rx, &rx_dev)?);
        for (ns, dev, peer_v4, peer_v6, peer_mac) in
            [(&tx, &tx_dev, RX_V4, RX_V6, &rx_mac), (&rx, &rx_dev, TX_V4, TX_V6, &tx_mac)]
        {
            for peer in [peer_v4.to_string(), peer_v6.to_string()] {
                link::static_neighbour(ns, dev, &peer, peer_mac)?;
            }
        }
        for (ns, dev) in [(&tx, &tx_dev), (&rx, &rx_dev)] {
            let got = link_mtu(ns, dev)?;
            if got != cfg.mtu {
                return Err(Error::SettingDidNotTake {
                    dev: dev.clone(),
                    setting: "mtu".to_owned(),
                    wanted: mtu.clone(),
                    got: got.to_string(),
                });
            }
        }

        let mut net = TestNet {
            tx,
            rx,
            tx_dev,
            rx_dev,
            tx_v4: TX_V4,
            rx_v4: RX_V4,
            tx_v6: TX_V6,
            rx_v6: RX_V6,
            profile: cfg.profile,
            mtu: cfg.mtu,
            tx_cpu: cfg.tx_cpu,
            rx_cpu: cfg.rx_cpu,
            rx_napi_threads: Vec::new(),
            setup_time: Duration::ZERO,
        };
        match cfg.profile {
            Profile::Offload => {
                net.expect_features(Side::Tx, &[("tx-udp-segmentation", "on")])?;
            }
            Profile::Software => net.apply_software_profile(cfg.rx_cpu)?,
        }
        net.setup_time = start.elapsed();
        Ok(net)
    }

    /// The namespace of one side.
    pub fn ns(&self, side: Side) -> &Namespace {
        match side {
            Side::Tx => &self.tx,
            Side::Rx => &self.rx,
        }
    }

    /// The veth device of one side.
    pub fn dev(&self, side: Side) -> &str {
        match side {
            Side::Tx => &self.tx_dev,
            Side::Rx => &self.rx_dev,
        }
    }

    /// The device features of one side, parsed from `ethtool -k` (see [`parse_features`]):
    /// `"tx-udp-segmentation" -> "on"`. For reports and checks.
    pub fn features(&self, side: Side) -> Result<BTreeMap<String, String>, Error> {
        link::features(self.ns(side), self.dev(side))
    }

    /// The drop counters of one side's veth (see [`DropCounts`]).
    pub fn drop_counts(&self, side: Side) -> Result<DropCounts, Error> {
        link::drop_counts(self.ns(side), self.dev(side))
    }

    /// Packets the pair itself dropped from tx to rx: the tx end's `TX: dropped` (a full NAPI
    /// ring or backlog on the peer; with a software-segmented GSO send only the last segment's
    /// fate reaches the sender, so these drops are silent) plus the rx end's `RX: dropped`.
    pub fn link_drops(&self) -> Result<u64, Error> {
        Ok(self.drop_counts(Side::Tx)?.tx_dropped + self.drop_counts(Side::Rx)?.rx_dropped)
    }

    /// Sets features with `ethtool -K <dev> <name> <value>...` on one side, then reads them back
    /// and fails with [`Error::SettingDidNotTake`] if any differs (ethtool itself exits 0 when
    /// the kernel silently keeps a feature fixed). Changing GRO on the rx device of a
    /// [`Profile::Software`] net replaces its NAPI threads: see [`TestNet::rx_napi_threads`].
    pub fn set_features(&self, side: Side, settings: &[(&str, &str)]) -> Result<(), Error> {
        link::set_features(self.ns(side), self.dev(side), settings)
    }

    fn expect_features(&self, side: Side, wanted: &[(&str, &str)]) -> Result<(), Error> {
        link::expect_features(self.ns(side), self.dev(side), wanted)
    }

    fn apply_software_profile(&mut self, rx_cpu: Option<usize>) -> Result<(), Error> {
        self.set_features(Side::Tx, &[("tx-udp-segmentation", "off")])?;
        self.rx_napi_threads = self.threaded_napi(Side::Rx, rx_cpu)?;
        Ok(())
    }

    /// Puts one side's receive processing on `cpu`, in softirq or in a NAPI thread (see
    /// [`Napi`]), with GRO and UDP GRO forwarding on and receive packet steering to `cpu`.
    /// Returns the NAPI thread(s): none in softirq mode.
    pub fn receive_on(&self, side: Side, cpu: usize, napi: Napi) -> Result<Vec<NapiThread>, Error> {
        if napi == Napi::Threaded {
            return self.threaded_napi(side, Some(cpu));
        }
        self.set_features(side, &[("gro", "on"), ("rx-udp-gro-forwarding", "on")])?;
        self.write_threaded(side, false)?;
        self.steer(side, cpu)?;
        Ok(Vec::new())
    }

    /// Receive packet steering on one side's device to `cpu` alone (CPUs past 63 are left as
    /// they are: the mask is 64 bits).
    fn steer(&self, side: Side, cpu: usize) -> Result<(), Error> {
        match u32::try_from(cpu).ok().and_then(|c| 1u64.checked_shl(c)) {
            Some(mask) => link::set_rps(self.ns(side), self.dev(side), mask),
            None => Ok(()),
        }
    }

    /// Writes the device's `threaded` switch and reads it back.
    fn write_threaded(&self, side: Side, on: bool) -> Result<(), Error> {
        let dev = self.dev(side);
        let want = if on { "1" } else { "0" };
        // /sys/class/net shows the devices of the namespace that mounted sysfs; `ip netns exec`
        // mounts a fresh sysfs for the target namespace, so the write must go through it. The
        // device name is ours (letters and digits), safe inside the shell string.
        let file = format!("/sys/class/net/{dev}/threaded");
        let got =
            self.ns(side).exec_timeout(&["sh", "-c", &format!("echo {want} > {file} && cat {file}")], TOOL_TIMEOUT)?;
        if got.trim() != want {
            return Err(Error::SettingDidNotTake {
                dev: dev.to_owned(),
                setting: "threaded".to_owned(),
                wanted: want.to_owned(),
                got: got.trim().to_owned(),
            });
        }
        Ok(())
    }

    /// Moves receive processing on one side's veth into a threaded NAPI kernel thread (with GRO
    /// and UDP GRO forwarding on), pinned to `cpu` if given, as a NIC's interrupt and softirq
    /// would be on a real host. Returns the thread(s).
    ///
    /// With a `cpu`, receive packet steering on the same device sends there too what veth does
    /// not hand to NAPI: a packet from a peer with TSO on is NAPI's only if it is UDP (the
    /// socket's plain destructor) with UDP GRO forwarding on here (`veth_skb_is_eligible_for_gro`).
    /// Every TCP segment takes the backlog instead, processed on the sending CPU: without the
    /// steering a TCP server's CPU would run its client's receive work (and the client's CPU the
    /// server's acknowledgements and the sends they clock).
    pub fn threaded_napi(&self, side: Side, cpu: Option<usize>) -> Result<Vec<NapiThread>, Error> {
        // GRO must be on before threaded NAPI: veth only has a NAPI instance while GRO (or XDP)
        // is on, and toggling GRO later destroys and recreates the thread.
        self.set_features(side, &[("gro", "on"), ("rx-udp-gro-forwarding", "on")])?;
        let dev = self.dev(side).to_owned();
        self.write_threaded(side, true)?;
        let deadline = Instant::now() + NAPI_THREAD_WAIT;
        let threads = loop {
            let found = find_napi_threads(&dev)?;
            if !found.is_empty() {
                break found;
            }
            if Instant::now() >= deadline {
                return Err(Error::NapiThreadMissing { dev });
            }
            thread::sleep(Duration::from_millis(10));
        };
        if let Some(cpu) = cpu {
            for t in &threads {
                pin_thread(t, cpu)?;
            }
            self.steer(side, cpu)?;
        }
        Ok(threads)
    }
}

/// Names the veth ends `ux<pid>t<n>` and `ux<pid>r<n>` (see `link::dev_name` for why they fit
/// [`MAX_IFNAME_LEN`] and when they repeat).
pub(crate) fn veth_names(pid: u32, serial: u32) -> (String, String) {
    (link::dev_name(pid, serial, 't'), link::dev_name(pid, serial, 'r'))
}

/// Finds the kernel threads named `napi/<dev>-<id>` by scanning `/proc/<pid>/comm`.
///
/// Kernel threads show their full name there even past the 15 bytes of a task's comm (since
/// Linux 5.17 via the kthread's `full_name`); the exact `-<digits>` suffix keeps `ux1r1` from
/// matching `ux1r10`.
fn find_napi_threads(dev: &str) -> Result<Vec<NapiThread>, Error> {
    let prefix = format!("napi/{dev}-");
    let entries = std::fs::read_dir("/proc").map_err(|e| Error::io("list /proc", e))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Processes come and go while scanning: a failed read just means "not this one".
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        let comm = comm.trim_end();
        if comm.strip_prefix(&prefix).is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())) {
            found.push(NapiThread { pid, name: comm.to_owned() });
        }
    }
    found.sort_by_key(|t| t.pid);
    Ok(found)
}

/// Pins a NAPI thread to one CPU and checks that the kernel kept exactly that mask.
fn pin_thread(t: &NapiThread, cpu: usize) -> Result<(), Error> {
    let what = || format!("pin {} (pid {}) to CPU {cpu}", t.name, t.pid);
    let raw = i32::try_from(t.pid)
        .map_err(|_| Error::InvalidConfig { why: format!("pid {} of {} does not fit pid_t", t.pid, t.name) })?;
    let pid = Pid::from_raw(raw);
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| Error::sys(what(), e))?;
    sched_setaffinity(pid, &set).map_err(|e| Error::sys(what(), e))?;
    let got = sched_getaffinity(pid).map_err(|e| Error::sys(what(), e))?;
    let cpus: Vec<usize> = (0..CpuSet::count()).filter(|&c| got.is_set(c).unwrap_or(false)).collect();
    if cpus != [cpu] {
        return Err(Error::SettingDidNotTake {
            dev: t.name.clone(),
            setting: "CPU affinity".to_owned(),
            wanted: cpu.to_string(),
            got: format!("{cpus:?}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_names_fit_and_differ() {
        for pid in [1, 42, 99_999, 4_194_304] {
            for serial in [0, 1, 9, 10, 99_999, 100_000, u32::MAX] {
                let (t, r) = veth_names(pid, serial);
                assert!(t.len() <= MAX_IFNAME_LEN, "{t}");
                assert!(r.len() <= MAX_IFNAME_LEN, "{r}");
                assert_ne!(t, r);
                assert!(t.starts_with(&format!("ux{pid}t")));
            }
        }
        assert_eq!(veth_names(1234, 7), ("ux1234t7".into(), "ux1234r7".into()));
        assert_ne!(veth_names(1234, 1), veth_names(1234, 10));
    }

    #[test]
    fn config_validation() {
        assert!(TestNetConfig::default().validate().is_ok());
        for mtu in [0, 1279, 65536] {
            let cfg = TestNetConfig { mtu, ..TestNetConfig::default() };
            assert!(matches!(cfg.validate(), Err(Error::InvalidConfig { .. })));
        }
        let cfg = TestNetConfig { rx_cpu: Some(1 << 20), ..TestNetConfig::default() };
        assert!(matches!(cfg.validate(), Err(Error::InvalidConfig { .. })));
    }

    #[test]
    fn profile_names_round_trip() {
        for p in Profile::ALL {
            assert_eq!(p.as_str().parse::<Profile>().unwrap(), p);
        }
        assert!("fast".parse::<Profile>().is_err());
    }
}
