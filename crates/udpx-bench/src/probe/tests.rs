//! The rules of [`findings`](super::findings), each on a synthetic machine.

use super::*;
use crate::env::{IrqInfo, KernelCapsInfo, OffloadState, QdiscSupport, Sysctls};

/// A healthy machine: every rule says ok.
fn good() -> Environment {
    Environment {
        kernel_release: Some("6.18.0".to_owned()),
        online_cpus: Some(vec![0, 1]),
        loadable_modules: Some(true),
        sysctls: Sysctls {
            rmem_max: Some(8 << 20),
            wmem_max: Some(8 << 20),
            optmem_max: Some(128 << 10),
            netdev_max_backlog: Some(5000),
            ..Sysctls::default()
        },
        caps: KernelCapsInfo {
            gso_max_segments: Some(128),
            gso_limit_measured: true,
            gro: true,
            txtime: true,
            zerocopy: true,
        },
        qdiscs: QdiscSupport { fq: Availability::Present, etf: Availability::Present, note: None },
        default_route_dev: Some("eth0".to_owned()),
        devices: vec![nic()],
        ..Environment::default()
    }
}

fn on() -> OffloadState {
    OffloadState { on: true, fixed: false }
}

fn off() -> OffloadState {
    OffloadState { on: false, fixed: false }
}

/// A two-queue NIC configured well.
fn nic() -> DeviceInfo {
    DeviceInfo {
        name: "eth0".to_owned(),
        present: true,
        mtu: Some(1500),
        driver: Some("ixgbe".to_owned()),
        physical: Some(true),
        features: [
            "tx-checksumming",
            "scatter-gather",
            "tx-udp-segmentation",
            "generic-receive-offload",
            "rx-udp-gro-forwarding",
        ]
        .into_iter()
        .map(|n| (n.to_owned(), on()))
        .collect(),
        root_qdisc: Some("mq".to_owned()),
        child_qdiscs: vec!["fq".to_owned(), "fq".to_owned()],
        rx_queues: Some(2),
        tx_queues: Some(2),
        rps_cpus: [("rx-0".to_owned(), "0".to_owned())].into(),
        irqs: (0..2)
            .map(|i| IrqInfo {
                irq: 64 + i,
                name: format!("eth0-TxRx-{i}"),
                smp_affinity: Some(format!("{}", 1 << i)),
                affinity_hint: Some(format!("0000000{}", 1 << i)),
                effective_affinity: None,
            })
            .collect(),
        ..DeviceInfo::default()
    }
}

fn by_topic<'a>(f: &'a [Finding], topic: &str) -> Vec<&'a Finding> {
    f.iter().filter(|x| x.topic == topic).collect()
}

/// The one finding in `topic` whose detail contains `needle`.
fn one<'a>(f: &'a [Finding], topic: &str, needle: &str) -> &'a Finding {
    let hits: Vec<&Finding> = by_topic(f, topic).into_iter().filter(|x| x.detail.contains(needle)).collect();
    assert_eq!(hits.len(), 1, "{needle:?} in {topic}: {f:#?}");
    hits[0]
}

#[test]
fn healthy_machine_has_no_warnings() {
    let f = findings(&good());
    let bad: Vec<_> = f.iter().filter(|x| x.severity == Severity::Warn).collect();
    assert!(bad.is_empty(), "{bad:#?}");
    // Only the zerocopy-copies note is informational.
    let info: Vec<_> = f.iter().filter(|x| x.severity == Severity::Info).collect();
    assert_eq!(info.len(), 1, "{info:#?}");
    assert!(info[0].detail.contains("always copies"));
}

#[test]
fn gso_rule() {
    let mut env = good();
    assert_eq!(one(&findings(&env), "gso", "128").severity, Severity::Ok);
    env.caps.gso_max_segments = Some(64);
    let f = findings(&env);
    assert_eq!(one(&f, "gso", "Linux 6.9").severity, Severity::Info);
    env.caps.gso_limit_measured = false;
    assert_eq!(one(&findings(&env), "gso", "assumed").severity, Severity::Info);
    env.caps.gso_max_segments = None;
    assert_eq!(one(&findings(&env), "gso", "no UDP GSO").severity, Severity::Warn);
}

#[test]
fn gro_rule() {
    let mut env = good();
    assert_eq!(one(&findings(&env), "gro", "UDP_GRO").severity, Severity::Ok);
    env.caps.gro = false;
    assert_eq!(one(&findings(&env), "gro", "refused").severity, Severity::Warn);
}

#[test]
fn pacing_rule() {
    let t = "pacing (SO_TXTIME)";
    let mut env = good();
    assert_eq!(one(&findings(&env), t, "enforced").severity, Severity::Ok);

    env.qdiscs.fq = Availability::Absent;
    env.qdiscs.etf = Availability::Absent;
    let f = findings(&env);
    let w = one(&f, t, "not enforced");
    assert_eq!(w.severity, Severity::Warn);
    assert!(w.detail.contains("pace in user space"));
    assert_eq!(w.fix.as_deref(), Some("modprobe sch_fq && tc qdisc replace dev eth0 root fq"));
    env.loadable_modules = Some(false);
    let f = findings(&env);
    let w = one(&f, t, "not enforced");
    assert!(w.detail.contains("CONFIG_NET_SCH_FQ=y"), "{w:?}");
    assert_eq!(w.fix.as_deref(), Some("tc qdisc replace dev eth0 root fq"));

    env.qdiscs.etf = Availability::Present;
    let f = findings(&env);
    assert_eq!(one(&f, t, "CLOCK_TAI").severity, Severity::Warn);

    env.qdiscs.fq = Availability::Unknown;
    env.qdiscs.note = Some("not root".to_owned());
    assert_eq!(one(&findings(&env), t, "not root").severity, Severity::Info);

    env.caps.txtime = false;
    assert_eq!(one(&findings(&env), t, "refused").severity, Severity::Info);
}

#[test]
fn zerocopy_rule() {
    let mut env = good();
    let f = findings(&env);
    assert_eq!(one(&f, "zerocopy", "accepted").severity, Severity::Ok);
    assert_eq!(one(&f, "zerocopy", "optmem_max is 128 KiB").severity, Severity::Ok);
    assert_eq!(one(&f, "zerocopy", "always copies").severity, Severity::Info);
    env.sysctls.optmem_max = Some(20480);
    let f = findings(&env);
    let w = one(&f, "zerocopy", "ENOBUFS");
    assert_eq!(w.severity, Severity::Warn);
    assert_eq!(w.fix.as_deref(), Some("sysctl -w net.core.optmem_max=131072"));
    env.caps.zerocopy = false;
    let f = findings(&env);
    assert_eq!(by_topic(&f, "zerocopy").len(), 1);
    assert_eq!(one(&f, "zerocopy", "refused").severity, Severity::Info);
}

#[test]
fn buffer_and_backlog_rules() {
    let t = "buffers and backlog";
    let mut env = good();
    let f = findings(&env);
    assert_eq!(one(&f, t, "rmem_max is 8 MiB").severity, Severity::Ok);
    assert_eq!(one(&f, t, "wmem_max is 8 MiB").severity, Severity::Ok);
    assert_eq!(one(&f, t, "backlog is 5000").severity, Severity::Ok);
    env.sysctls.rmem_max = Some(212992);
    env.sysctls.netdev_max_backlog = Some(1000);
    let f = findings(&env);
    let w = one(&f, t, "rmem_max is 208 KiB");
    assert_eq!(w.severity, Severity::Warn);
    assert_eq!(w.fix.as_deref(), Some("sysctl -w net.core.rmem_max=4194304"));
    let i = one(&f, t, "backlog is 1000");
    assert_eq!(i.severity, Severity::Info);
    assert_eq!(i.fix.as_deref(), Some("sysctl -w net.core.netdev_max_backlog=4096"));
    // Exactly 4 MiB (this machine) is enough.
    env.sysctls.rmem_max = Some(4 << 20);
    assert_eq!(one(&findings(&env), t, "rmem_max").severity, Severity::Ok);
    // Unreadable sysctls give no finding at all.
    env.sysctls = Sysctls::default();
    assert!(by_topic(&findings(&env), t).is_empty());
}

#[test]
fn checksum_rule() {
    let t = "device eth0";
    let mut env = good();
    assert_eq!(one(&findings(&env), t, "checksum").severity, Severity::Ok);
    env.devices[0].features.insert("tx-checksumming".to_owned(), off());
    let f = findings(&env);
    let w = one(&f, t, "checksum");
    assert_eq!(w.severity, Severity::Warn);
    assert!(w.detail.contains("falls back to plain sends"));
    assert_eq!(w.fix.as_deref(), Some("ethtool -K eth0 tx on"));
}

#[test]
fn udp_segmentation_rule() {
    let t = "device eth0";
    let mut env = good();
    assert_eq!(one(&findings(&env), t, "tx-udp-segmentation on").severity, Severity::Ok);
    let feat = |env: &mut Environment, s| {
        env.devices[0].features.insert("tx-udp-segmentation".to_owned(), s);
    };
    feat(&mut env, off());
    let f = findings(&env);
    let i = one(&f, t, "supports it");
    assert_eq!(i.severity, Severity::Info);
    assert_eq!(i.fix.as_deref(), Some("ethtool -K eth0 tx-udp-segmentation on"));
    feat(&mut env, OffloadState { on: false, fixed: true });
    let f = findings(&env);
    let o = one(&f, t, "splits in software");
    assert_eq!((o.severity, o.fix.as_ref()), (Severity::Ok, None));
}

#[test]
fn gro_forwarding_rule() {
    let t = "device eth0";
    let mut env = good();
    assert_eq!(one(&findings(&env), t, "GRO on with").severity, Severity::Ok);
    env.devices[0].features.insert("rx-udp-gro-forwarding".to_owned(), off());
    let f = findings(&env);
    let i = one(&f, t, "rx-udp-gro-forwarding off");
    assert_eq!(i.severity, Severity::Info);
    assert_eq!(i.fix.as_deref(), Some("ethtool -K eth0 rx-udp-gro-forwarding on"));
    // rx-gro-list also makes veth run GRO.
    env.devices[0].features.insert("rx-gro-list".to_owned(), on());
    assert_eq!(one(&findings(&env), t, "rx-gro-list").severity, Severity::Ok);
    // GRO off altogether.
    env.devices[0].features.insert("generic-receive-offload".to_owned(), off());
    let f = findings(&env);
    assert_eq!(one(&f, t, "generic-receive-offload off").fix.as_deref(), Some("ethtool -K eth0 gro on"));
    // veth is judged like a NIC, with its own reason.
    env.devices[0].features.insert("generic-receive-offload".to_owned(), on());
    env.devices[0].features.insert("rx-gro-list".to_owned(), off());
    env.devices[0].physical = Some(false);
    env.devices[0].driver = Some("veth".to_owned());
    let f = findings(&env);
    assert!(one(&f, t, "rx-udp-gro-forwarding off").detail.contains("veth runs GRO"));
    // lo never runs GRO, ifb receives nothing from a wire: no finding.
    for (name, driver) in [("lo", None), ("ifb0", Some("ifb"))] {
        env.devices[0].name = name.to_owned();
        env.devices[0].driver = driver.map(str::to_owned);
        let topic = format!("device {name}");
        let f = findings(&env);
        assert!(!by_topic(&f, &topic).is_empty());
        assert!(by_topic(&f, &topic).iter().all(|x| !x.detail.contains("GRO")));
    }
}

#[test]
fn qdisc_rule() {
    let t = "device eth0";
    let mut env = good();
    assert_eq!(one(&findings(&env), t, "mq (fq)").severity, Severity::Ok);
    // fq under only some of mq's queues: some packets would not be paced, so none is trusted.
    env.devices[0].child_qdiscs = vec!["fq".to_owned(), "pfifo_fast".to_owned()];
    assert_eq!(one(&findings(&env), t, "qdisc mq: SO_TXTIME departure times are ignored").severity, Severity::Info);
    env.devices[0].child_qdiscs = vec!["etf".to_owned(), "etf".to_owned()];
    assert!(one(&findings(&env), t, "mq (etf)").detail.contains("CLOCK_TAI"));
    env.devices[0].root_qdisc = Some("pfifo_fast".to_owned());
    env.devices[0].child_qdiscs.clear();
    let f = findings(&env);
    let i = one(&f, t, "qdisc pfifo_fast");
    assert_eq!(i.severity, Severity::Info);
    assert_eq!(i.fix.as_deref(), Some("tc qdisc replace dev eth0 root fq"));
    env.qdiscs.fq = Availability::Absent;
    let f = findings(&env);
    let i = one(&f, t, "qdisc pfifo_fast");
    assert!(i.detail.contains("no fq") && i.fix.is_none(), "{i:?}");
}

#[test]
fn irq_affinity_rule() {
    let t = "device eth0";
    let mut env = good();
    assert_eq!(one(&findings(&env), t, "affinity_hint").severity, Severity::Ok);
    // irqbalance put both on CPU 0.
    env.devices[0].irqs[1].smp_affinity = Some("00000001".to_owned());
    let f = findings(&env);
    let w = one(&f, t, "affinity_hint");
    assert_eq!(w.severity, Severity::Warn);
    assert!(w.detail.contains("-h exact") && w.detail.contains("irq 65"));
    assert_eq!(w.fix.as_deref(), Some("echo 2 > /proc/irq/65/smp_affinity"));
    // No hints (virtio): nothing to compare against.
    for irq in &mut env.devices[0].irqs {
        irq.affinity_hint = Some("0".to_owned());
    }
    assert!(by_topic(&findings(&env), t).iter().all(|x| !x.detail.contains("affinity")));
}

#[test]
fn rps_rule() {
    let t = "device eth0";
    let mut env = good();
    env.devices[0].rx_queues = Some(1);
    let f = findings(&env);
    let i = one(&f, t, "RPS off");
    assert_eq!(i.severity, Severity::Info);
    assert_eq!(i.fix.as_deref(), Some("echo 3 > /sys/class/net/eth0/queues/rx-0/rps_cpus"));
    env.devices[0].rps_cpus.insert("rx-0".to_owned(), "3".to_owned());
    assert_eq!(one(&findings(&env), t, "RPS spreads").severity, Severity::Ok);
    // A NIC moved into a namespace: the redirection runs in a shell there.
    let mut moved = env.clone();
    moved.devices[0].namespace = Some("udpx-1-0-rx".to_owned());
    moved.devices[0].rps_cpus.insert("rx-0".to_owned(), "0".to_owned());
    let f = findings(&moved);
    let fix = one(&f, "device udpx-1-0-rx/eth0", "RPS off").fix.as_deref();
    assert_eq!(fix, Some("ip netns exec udpx-1-0-rx sh -c 'echo 3 > /sys/class/net/eth0/queues/rx-0/rps_cpus'"));
    // One CPU: nothing to spread to.
    env.devices[0].rps_cpus.insert("rx-0".to_owned(), "0".to_owned());
    env.online_cpus = Some(vec![0]);
    assert!(by_topic(&findings(&env), t).iter().all(|x| !x.detail.contains("RPS")));
    // Virtual devices are not judged on RPS; in a namespace fixes are wrapped.
    env.online_cpus = Some(vec![0, 1]);
    env.devices[0].physical = Some(false);
    env.devices[0].namespace = Some("udpx-1-0-rx".to_owned());
    env.devices[0].features.insert("tx-checksumming".to_owned(), off());
    let f = findings(&env);
    assert!(by_topic(&f, "device udpx-1-0-rx/eth0").iter().all(|x| !x.detail.contains("RPS")));
    assert_eq!(
        one(&f, "device udpx-1-0-rx/eth0", "checksum").fix.as_deref(),
        Some("ip netns exec udpx-1-0-rx ethtool -K eth0 tx on")
    );
}

#[test]
fn missing_device_warns() {
    let mut env = good();
    env.devices = vec![DeviceInfo { name: "nope0".to_owned(), ..DeviceInfo::default() }];
    let f = findings(&env);
    assert_eq!(one(&f, "device nope0", "no such device").severity, Severity::Warn);
    assert_eq!(by_topic(&f, "device nope0").len(), 1);
}

#[test]
fn text_and_json_outputs() {
    let mut env = good();
    env.sysctls.rmem_max = Some(1 << 20);
    let report = ProbeReport { findings: findings(&env), environment: env };
    assert_eq!(report.worst(), Severity::Warn);
    let text = report.to_string();
    assert!(text.contains("\ngso\n[ ok ] UDP GSO"), "{text}");
    assert!(
        text.contains("[WARN] net.core.rmem_max is 1 MiB")
            && text.contains("\n  fix: sysctl -w net.core.rmem_max=4194304\n"),
        "{text}"
    );
    // Each topic heading appears once.
    assert_eq!(text.matches("\ndevice eth0\n").count(), 1, "{text}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    let first = &json["findings"][0];
    assert_eq!(first["severity"], "ok");
    assert_eq!(first["topic"], "gso");
    assert!(first["fix"].is_null());
    assert_eq!(json["environment"]["qdiscs"]["fq"], "present");
    assert_eq!(json["environment"]["caps"]["gso_max_segments"], 128);
}

/// Not a rule test: probes this machine and prints the report (`--nocapture` shows it).
#[test]
fn real_probe_on_this_machine() {
    let report = probe(&ProbeOptions::default());
    println!("{report}");
    println!("{}", report.environment.to_markdown());
    assert!(report.environment.read_anything());
    assert!(report.environment.devices.last().is_some_and(|d| d.name == "lo" && d.present));
    let json = report.to_json();
    assert!(json.contains("\"findings\""));
    if std::env::var_os("UDPX_PROBE_JSON").is_some() {
        println!("{json}");
    }
}
