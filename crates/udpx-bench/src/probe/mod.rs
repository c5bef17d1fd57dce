//! `udpx probe`: what this machine does for a UDP datapath, what it lacks, and the exact
//! command that fixes each gap.
//!
//! [`probe`] reads an [`Environment`] and judges it with [`findings`], a pure function of the
//! environment, so every rule is tested on synthetic machines (`probe/tests.rs`). The rules
//! are the checklist of two sources:
//!
//! - de Bruijn and Dumazet, "Optimizing UDP for content delivery: GSO, pacing and zerocopy"
//!   (Netdev 0x12): GSO segment limit, GRO, SO_TXTIME needing fq or etf, MSG_ZEROCOPY needing
//!   optmem and a device that does not copy.
//! - Makita, "Boost UDP Transaction Performance" (NTT, 2016): socket buffer limits, the
//!   backlog, IRQ affinity versus the driver's affinity_hint (irqbalance `-h exact`), RPS for
//!   a device with fewer receive queues than CPUs.
//!
//! Plus what this project measured on veth (the development machine's notes): checksum offload
//! and UDP GSO, `rx-udp-gro-forwarding` for GRO of locally sent UDP.
//!
//! Severities: [`Severity::Ok`] (fine), [`Severity::Info`] (worth knowing, maybe intended),
//! [`Severity::Warn`] (costs throughput or correctness). A fix is one shell line to run as
//! root; for a device inside a namespace it is wrapped in `ip netns exec`.

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

use serde::{Deserialize, Serialize};
use udpx_lab::netns::Namespace;

use crate::env::{bytes, format_cpumask, parse_cpumask, Availability, DeviceInfo, Environment};

/// Socket buffer limit below which large bursts drop (`net.core.rmem_max`/`wmem_max`).
pub const MIN_BUFFER_MAX: u64 = 4 << 20;
/// `net.core.optmem_max` below which zerocopy notifications run short (sends fail with
/// ENOBUFS when a notification cannot be allocated).
pub const MIN_OPTMEM_MAX: u64 = 64 << 10;
/// The `optmem_max` recommended: the default since Linux 6.9.
pub const RECOMMENDED_OPTMEM_MAX: u64 = 128 << 10;
/// `net.core.netdev_max_backlog` below which a burst into one CPU's backlog drops.
pub const MIN_NETDEV_MAX_BACKLOG: u64 = 4096;
/// The largest UDP GSO segment count of current kernels (`UDP_MAX_SEGMENTS`, Linux 6.9).
pub const CURRENT_MAX_SEGMENTS: usize = 128;

/// What `udpx probe` looks at and how it prints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeOptions {
    /// Devices to inspect; empty: every device in `/sys/class/net` (lo last).
    pub devices: Vec<String>,
    /// Print one JSON object instead of text.
    pub json: bool,
}

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// As it should be.
    Ok,
    /// Worth knowing; may be intended.
    Info,
    /// Costs throughput, CPU or correctness.
    Warn,
}

impl Severity {
    /// The six-character tag of the text output.
    pub fn tag(self) -> &'static str {
        match self {
            Severity::Ok => "[ ok ]",
            Severity::Info => "[info]",
            Severity::Warn => "[WARN]",
        }
    }
}

/// One judged fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// The section it is printed under: `gso`, `pacing`, `device eth0`, ...
    pub topic: String,
    /// What was found and why it matters.
    pub detail: String,
    /// The exact command that fixes it (run as root), if there is one.
    pub fix: Option<String>,
}

impl Finding {
    fn new(severity: Severity, topic: &str, detail: impl Into<String>) -> Finding {
        Finding { severity, topic: topic.to_owned(), detail: detail.into(), fix: None }
    }

    fn fix(mut self, command: impl Into<String>) -> Finding {
        self.fix = Some(command.into());
        self
    }
}

/// The environment read and the findings on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// Everything read.
    pub environment: Environment,
    /// The judgement, grouped by topic in first-appearance order.
    pub findings: Vec<Finding>,
}

impl ProbeReport {
    /// The most severe finding's severity ([`Severity::Ok`] without findings).
    pub fn worst(&self) -> Severity {
        self.findings.iter().map(|f| f.severity).max().unwrap_or(Severity::Ok)
    }

    /// One JSON object: `{"environment": {...}, "findings": [{"severity", "topic", "detail",
    /// "fix"}]}`.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialization cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// The text output: the environment paragraph, then a section per topic, one line per
/// finding and an indented `fix:` line under it.
impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.environment)?;
        let mut topics: Vec<&str> = Vec::new();
        for finding in &self.findings {
            if !topics.contains(&finding.topic.as_str()) {
                topics.push(&finding.topic);
            }
        }
        for topic in topics {
            writeln!(f, "\n{topic}")?;
            for finding in self.findings.iter().filter(|x| x.topic == topic) {
                writeln!(f, "{} {}", finding.severity.tag(), finding.detail)?;
                if let Some(fix) = &finding.fix {
                    writeln!(f, "  fix: {fix}")?;
                }
            }
        }
        Ok(())
    }
}

/// Reads the environment for `opts.devices` (all devices when empty) and judges it.
pub fn probe(opts: &ProbeOptions) -> ProbeReport {
    let names = if opts.devices.is_empty() { all_devices() } else { opts.devices.clone() };
    let devices: Vec<(Option<&Namespace>, &str)> = names.iter().map(|n| (None, n.as_str())).collect();
    let environment = Environment::collect(&devices);
    let findings = findings(&environment);
    ProbeReport { environment, findings }
}

/// Probes, prints text or JSON to stdout, and returns exit code 0, or 1 when nothing at all
/// could be read (no `/proc`, no `/sys`). A closed stdout (`udpx probe | head`) is success.
pub fn run(opts: &ProbeOptions) -> ExitCode {
    let report = probe(opts);
    let text = if opts.json { report.to_json() + "\n" } else { report.to_string() };
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("udpx probe: cannot write the report: {e}");
            return ExitCode::FAILURE;
        }
    }
    if report.environment.read_anything() {
        ExitCode::SUCCESS
    } else {
        eprintln!("udpx probe: could not read anything: are /proc and /sys mounted?");
        ExitCode::FAILURE
    }
}

/// Every device in `/sys/class/net`, sorted, with `lo` last.
fn all_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|dir| dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n != "lo").collect())
        .unwrap_or_default();
    names.sort();
    names.push("lo".to_owned());
    names
}

/// Judges an environment: kernel features first, then sysctls, then each device.
pub fn findings(env: &Environment) -> Vec<Finding> {
    let mut out = Vec::new();
    gso(env, &mut out);
    gro(env, &mut out);
    pacing(env, &mut out);
    zerocopy(env, &mut out);
    uring(&mut out);
    buffers(env, &mut out);
    for dev in &env.devices {
        device(env, dev, &mut out);
    }
    out
}

fn gso(env: &Environment, out: &mut Vec<Finding>) {
    const T: &str = "gso";
    let c = &env.caps;
    out.push(match c.gso_max_segments {
        None => Finding::new(
            Severity::Warn,
            T,
            "no UDP GSO (UDP_SEGMENT refused; needs Linux 4.18): every datagram crosses the \
             stack alone, several times the CPU per byte of a GSO send",
        ),
        Some(n) if !c.gso_limit_measured => Finding::new(
            Severity::Info,
            T,
            format!(
                "UDP GSO: {n} segments per send assumed, not measured (the loopback probe \
                 failed: is lo up in this namespace?)"
            ),
        ),
        Some(n) if n < CURRENT_MAX_SEGMENTS => Finding::new(
            Severity::Info,
            T,
            format!(
                "UDP GSO: up to {n} segments per send (measured); Linux 6.9 raised the limit \
                 to {CURRENT_MAX_SEGMENTS}"
            ),
        ),
        Some(n) => Finding::new(Severity::Ok, T, format!("UDP GSO: up to {n} segments per send (measured)")),
    });
}

fn gro(env: &Environment, out: &mut Vec<Finding>) {
    const T: &str = "gro";
    out.push(if env.caps.gro {
        Finding::new(
            Severity::Ok,
            T,
            "UDP_GRO accepted: a socket can receive coalesced datagrams (only what a device \
             hands up through GRO; see each device)",
        )
    } else {
        Finding::new(Severity::Warn, T, "UDP_GRO refused (needs Linux 5.0): every datagram is received alone")
    });
}

fn pacing(env: &Environment, out: &mut Vec<Finding>) {
    const T: &str = "pacing (SO_TXTIME)";
    let q = &env.qdiscs;
    if !env.caps.txtime {
        out.push(Finding::new(Severity::Info, T, "SO_TXTIME refused (needs Linux 4.19): pace in user space"));
        return;
    }
    let dev = env.default_route_dev.as_deref().unwrap_or("eth0");
    match (q.fq, q.etf) {
        (Availability::Present, _) => out.push(Finding::new(
            Severity::Ok,
            T,
            "SO_TXTIME accepted and the fq qdisc exists: departure times are enforced on \
             devices whose qdisc is fq (see each device)",
        )),
        (Availability::Absent, Availability::Present) => out.push(
            Finding::new(
                Severity::Warn,
                T,
                "SO_TXTIME accepted, no fq qdisc, only etf: etf enforces departure times on \
                 CLOCK_TAI only and drops packets of sockets on CLOCK_MONOTONIC, which udpx \
                 uses; departure times are not enforced: pace in user space",
            )
            .fix(enable_fq(env, dev)),
        ),
        (Availability::Absent, Availability::Absent) => out.push(
            Finding::new(
                Severity::Warn,
                T,
                format!(
                    "SO_TXTIME accepted but this kernel has neither fq nor etf: departure \
                     times are not enforced (packets leave at once and nothing reports it); \
                     pace in user space. The fix below needs a kernel with fq{}",
                    if env.loadable_modules == Some(false) {
                        " built in (CONFIG_NET_SCH_FQ=y: this kernel loads no modules)"
                    } else {
                        " (CONFIG_NET_SCH_FQ)"
                    }
                ),
            )
            .fix(enable_fq(env, dev)),
        ),
        _ => out.push(Finding::new(
            Severity::Info,
            T,
            format!(
                "SO_TXTIME accepted; could not check for the fq and etf qdiscs ({}): \
                 departure times are enforced only under fq",
                q.note.as_deref().unwrap_or("unknown why")
            ),
        )),
    }
}

/// `modprobe sch_fq && tc qdisc replace dev DEV root fq`, without the modprobe on a kernel
/// that loads no modules.
fn enable_fq(env: &Environment, dev: &str) -> String {
    let tc = format!("tc qdisc replace dev {dev} root fq");
    if env.loadable_modules == Some(false) {
        tc
    } else {
        format!("modprobe sch_fq && {tc}")
    }
}

/// The send backends: system calls always; io_uring where this process may make a ring.
fn uring(out: &mut Vec<Finding>) {
    const T: &str = "send backend";
    out.push(match udpx::caps::io_uring_available() {
        Ok(()) => Finding::new(
            Severity::Ok,
            T,
            format!(
                "io_uring available: SocketConfig::io_uring sends each batch as linked SENDMSG entries, \
                 one io_uring_enter per batch (sockets use system calls unless asked); zerocopy {}",
                if udpx::caps::io_uring_zerocopy_available() {
                    "as SENDMSG_ZC, completions from the ring"
                } else {
                    "by system calls (no IORING_OP_SENDMSG_ZC: Linux 6.1)"
                }
            ),
        ),
        Err(why) => Finding::new(Severity::Info, T, format!("system calls only: {why}")),
    });
}

fn zerocopy(env: &Environment, out: &mut Vec<Finding>) {
    const T: &str = "zerocopy";
    if !env.caps.zerocopy {
        out.push(Finding::new(Severity::Info, T, "SO_ZEROCOPY refused (UDP needs Linux 5.0): every send copies"));
        return;
    }
    out.push(Finding::new(Severity::Ok, T, "SO_ZEROCOPY accepted"));
    out.push(Finding::new(
        Severity::Info,
        T,
        "toward lo or veth zerocopy always copies (local delivery copies; every completion \
         says copied), so it is a net loss there; only a NIC with scatter-gather avoids the \
         copy. Measure before turning it on",
    ));
    if let Some(optmem) = env.sysctls.optmem_max {
        out.push(if optmem < MIN_OPTMEM_MAX {
            Finding::new(
                Severity::Warn,
                T,
                format!(
                    "net.core.optmem_max is {}: each zerocopy send's completion notification \
                     is charged to it, and sends fail with ENOBUFS when it runs out (below {})",
                    bytes(Some(optmem)),
                    bytes(Some(MIN_OPTMEM_MAX))
                ),
            )
            .fix(format!("sysctl -w net.core.optmem_max={RECOMMENDED_OPTMEM_MAX}"))
        } else {
            Finding::new(
                Severity::Ok,
                T,
                format!("net.core.optmem_max is {}: room for zerocopy notifications", bytes(Some(optmem))),
            )
        });
    }
}

fn buffers(env: &Environment, out: &mut Vec<Finding>) {
    const T: &str = "buffers and backlog";
    let s = &env.sysctls;
    for (name, value, what) in [("rmem_max", s.rmem_max, "SO_RCVBUF"), ("wmem_max", s.wmem_max, "SO_SNDBUF")] {
        let Some(v) = value else { continue };
        out.push(if v < MIN_BUFFER_MAX {
            Finding::new(
                Severity::Warn,
                T,
                format!(
                    "net.core.{name} is {}: {what} of an unprivileged socket is capped there, \
                     too small for bursts at gigabits (udpx uses the uncapped {what}FORCE when \
                     root)",
                    bytes(Some(v))
                ),
            )
            .fix(format!("sysctl -w net.core.{name}={MIN_BUFFER_MAX}"))
        } else {
            Finding::new(Severity::Ok, T, format!("net.core.{name} is {}", bytes(Some(v))))
        });
    }
    if let Some(v) = s.netdev_max_backlog {
        out.push(if v < MIN_NETDEV_MAX_BACKLOG {
            Finding::new(
                Severity::Info,
                T,
                format!(
                    "net.core.netdev_max_backlog is {v}: the per-CPU input queue (used by \
                     RPS, lo and veth) drops bursts beyond it (column 2 of \
                     /proc/net/softnet_stat counts them)"
                ),
            )
            .fix(format!("sysctl -w net.core.netdev_max_backlog={MIN_NETDEV_MAX_BACKLOG}"))
        } else {
            Finding::new(Severity::Ok, T, format!("net.core.netdev_max_backlog is {v}"))
        });
    }
}

fn device(env: &Environment, d: &DeviceInfo, out: &mut Vec<Finding>) {
    let topic = format!("device {}", d.label());
    let t = topic.as_str();
    if !d.present {
        out.push(Finding::new(Severity::Warn, t, "no such device"));
        return;
    }
    let cmd = |c: String| in_namespace(d, &c);
    let dev = d.name.as_str();

    if let Some(csum) = d.feature("tx-checksumming") {
        out.push(if csum.on {
            Finding::new(Severity::Ok, t, "tx checksum offload on")
        } else {
            let f = Finding::new(
                Severity::Warn,
                t,
                "tx checksum offload off: UDP GSO sends can fail with EIO (EINVAL on some \
                 paths); udpx then falls back to plain sends",
            );
            if csum.fixed {
                f
            } else {
                f.fix(cmd(format!("ethtool -K {dev} tx on")))
            }
        });
    }

    if let Some(seg) = d.feature("tx-udp-segmentation") {
        out.push(match (seg.on, seg.fixed) {
            (true, _) => Finding::new(Severity::Ok, t, "tx-udp-segmentation on: a GSO buffer reaches the device whole"),
            (false, true) => Finding::new(
                Severity::Ok,
                t,
                "no UDP segmentation offload in this driver: GSO splits in software just \
                 before the device, still far cheaper than one send per datagram",
            ),
            (false, false) => Finding::new(
                Severity::Info,
                t,
                "tx-udp-segmentation off though the device supports it: GSO splits in \
                 software before the device",
            )
            .fix(cmd(format!("ethtool -K {dev} tx-udp-segmentation on"))),
        });
    }

    if let Some(sg) = d.feature("scatter-gather") {
        if !sg.on {
            let f =
                Finding::new(Severity::Info, t, "scatter-gather off: MSG_ZEROCOPY sends copy, and GSO must linearize");
            out.push(if sg.fixed { f } else { f.fix(cmd(format!("ethtool -K {dev} sg on"))) });
        }
    }

    // lo never runs GRO, and ifb, bridges or tunnels are not where UDP arrives from a wire;
    // NICs and veth are.
    if d.physical == Some(true) || d.driver.as_deref() == Some("veth") {
        gro_forwarding(d, t, &cmd, out);
    }
    qdisc(env, d, t, &cmd, out);
    if d.physical == Some(true) {
        irq_affinity(d, t, out);
        rps(env, d, t, out);
    }
}

/// GRO of UDP that no socket asked for (forwarded, or locally sent through veth, where NAPI
/// only runs with rx-udp-gro-forwarding, rx-gro-list or XDP) needs rx-udp-gro-forwarding.
fn gro_forwarding(d: &DeviceInfo, t: &str, cmd: &dyn Fn(String) -> String, out: &mut Vec<Finding>) {
    let dev = d.name.as_str();
    let (Some(gro), Some(fwd)) = (d.feature("generic-receive-offload"), d.feature("rx-udp-gro-forwarding")) else {
        return;
    };
    let list_on = d.feature("rx-gro-list").is_some_and(|s| s.on);
    if !gro.on {
        let f = Finding::new(Severity::Info, t, "generic-receive-offload off: no UDP GRO on this device");
        out.push(if gro.fixed { f } else { f.fix(cmd(format!("ethtool -K {dev} gro on"))) });
    } else if fwd.on || list_on {
        out.push(Finding::new(
            Severity::Ok,
            t,
            format!(
                "GRO on with {}: UDP is coalesced on receive",
                if fwd.on { "rx-udp-gro-forwarding" } else { "rx-gro-list" }
            ),
        ));
    } else if !fwd.fixed {
        let why = if d.driver.as_deref() == Some("veth") {
            "veth runs GRO (NAPI) only with it: locally sent UDP arrives uncoalesced"
        } else {
            "forwarded UDP, and UDP to sockets without UDP_GRO, is not coalesced"
        };
        out.push(
            Finding::new(Severity::Info, t, format!("GRO on but rx-udp-gro-forwarding off: {why}"))
                .fix(cmd(format!("ethtool -K {dev} rx-udp-gro-forwarding on"))),
        );
    }
}

fn qdisc(env: &Environment, d: &DeviceInfo, t: &str, cmd: &dyn Fn(String) -> String, out: &mut Vec<Finding>) {
    let Some(root) = d.root_qdisc.as_deref() else {
        return;
    };
    // The library's rule (udpx::qdisc): fq or etf at the root, or under every queue of mq.
    // A pacing qdisc under only some queues, or below a classful root, does not count.
    let pacing = udpx::qdisc::KernelPacing::decide(root, &d.child_qdiscs);
    if let Some(clock) = pacing.clock() {
        let kind = if clock == udpx::TxClock::Tai { "etf" } else { "fq" };
        out.push(Finding::new(
            Severity::Ok,
            t,
            format!("qdisc {root} ({kind}): SO_TXTIME departure times on {clock} are enforced here"),
        ));
        return;
    }
    let f = Finding::new(
        Severity::Info,
        t,
        format!(
            "qdisc {root}: SO_TXTIME departure times are ignored on this device{}",
            match env.qdiscs.fq {
                Availability::Present => "",
                Availability::Absent => " (and this kernel has no fq)",
                Availability::Unknown => " (fq availability unknown)",
            }
        ),
    );
    out.push(if env.qdiscs.fq == Availability::Present && env.caps.txtime {
        f.fix(cmd(format!("tc qdisc replace dev {} root fq", d.name)))
    } else {
        f
    });
}

/// Makita: irqbalance ignores the driver's affinity_hint unless run with `-h exact`, and may
/// pile every queue's interrupt onto one node's CPUs.
fn irq_affinity(d: &DeviceInfo, t: &str, out: &mut Vec<Finding>) {
    let multi_queue = d.rx_queues.unwrap_or(0) > 1 || d.tx_queues.unwrap_or(0) > 1;
    if !multi_queue {
        return;
    }
    let mut hinted = 0;
    let mut off: Vec<(u32, String)> = Vec::new();
    for irq in &d.irqs {
        let Some(hint) = irq.affinity_hint.as_deref().and_then(parse_cpumask) else {
            continue;
        };
        if hint.is_empty() {
            continue; // the driver gives no hint
        }
        hinted += 1;
        let current = irq.smp_affinity.as_deref().and_then(parse_cpumask);
        if current.as_deref() != Some(hint.as_slice()) {
            off.push((irq.irq, format_cpumask(&hint)));
        }
    }
    if hinted == 0 {
        return;
    }
    if off.is_empty() {
        out.push(Finding::new(Severity::Ok, t, format!("{hinted} queue interrupts follow the driver's affinity_hint")));
        return;
    }
    let list: Vec<String> = off.iter().map(|(n, _)| n.to_string()).collect();
    let fix: Vec<String> = off.iter().map(|(n, mask)| format!("echo {mask} > /proc/irq/{n}/smp_affinity")).collect();
    out.push(
        Finding::new(
            Severity::Warn,
            t,
            format!(
                "{} of {hinted} queue interrupts (irq {}) are not where the driver's \
                 affinity_hint puts them, so queues may share CPUs; either run irqbalance \
                 with -h exact (IRQBALANCE_ARGS=\"-h exact\"), or stop it and pin by hand",
                off.len(),
                list.join(", ")
            ),
        )
        .fix(fix.join("; ")),
    );
}

/// Makita: a device with one receive queue puts all receive work on the CPU taking its
/// interrupt; RPS spreads it (Documentation/networking/scaling.rst).
fn rps(env: &Environment, d: &DeviceInfo, t: &str, out: &mut Vec<Finding>) {
    let cpus = env.online_cpus.as_deref().unwrap_or_default();
    if d.rx_queues != Some(1) || cpus.len() < 2 {
        return;
    }
    let Some(mask) = d.rps_cpus.get("rx-0").and_then(|m| parse_cpumask(m)) else {
        return;
    };
    out.push(if mask.is_empty() {
        Finding::new(
            Severity::Info,
            t,
            format!(
                "one receive queue, {} CPUs, RPS off: all receive processing runs on the CPU \
                 that takes the interrupt",
                cpus.len()
            ),
        )
        .fix(shell_in_namespace(
            d,
            &format!("echo {} > /sys/class/net/{}/queues/rx-0/rps_cpus", format_cpumask(cpus), d.name),
        ))
    } else {
        Finding::new(
            Severity::Ok,
            t,
            format!(
                "one receive queue, RPS spreads it over CPUs {}",
                mask.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
            ),
        )
    });
}

/// Prefixes `ip netns exec NS ` for a device inside a namespace.
fn in_namespace(d: &DeviceInfo, command: &str) -> String {
    match &d.namespace {
        Some(ns) => format!("ip netns exec {ns} {command}"),
        None => command.to_owned(),
    }
}

/// Like [`in_namespace`] for a shell line (a redirection): `ip netns exec NS sh -c '...'`.
fn shell_in_namespace(d: &DeviceInfo, line: &str) -> String {
    match &d.namespace {
        Some(ns) => format!("ip netns exec {ns} sh -c '{line}'"),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests;
