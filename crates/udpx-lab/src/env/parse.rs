//! The pure parsers of [`env`](super): kernel and tool text in, values out, no I/O; each is
//! table-tested at the bottom.

use std::collections::BTreeMap;

use super::OffloadState;

/// What [`parse_cpuinfo`] finds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuInfo {
    /// The first `model name`.
    pub model: Option<String>,
    /// Whether the first `flags` line has `hypervisor`; `None` without a flags line (not x86).
    pub hypervisor: Option<bool>,
}

/// Parses `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "model name" if info.model.is_none() => info.model = Some(value.trim().to_owned()),
            "flags" if info.hypervisor.is_none() => {
                info.hypervisor = Some(value.split_whitespace().any(|f| f == "hypervisor"));
            }
            _ => {}
        }
    }
    info
}

/// Parses `/proc/interrupts` into (irq number, the rest of the line after the per-CPU counts:
/// chip, hardware irq and handler names). Lines without a numeric irq (NMI, LOC) are skipped.
pub fn parse_interrupts(text: &str) -> Vec<(u32, String)> {
    let mut lines = text.lines();
    let ncpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|line| {
            let (irq, rest) = line.trim_start().split_once(':')?;
            let irq = irq.parse().ok()?;
            let mut rest = rest.trim_start();
            for _ in 0..ncpus {
                match rest.split_once(char::is_whitespace) {
                    Some((count, tail)) if count.bytes().all(|b| b.is_ascii_digit()) => {
                        rest = tail.trim_start();
                    }
                    _ => break,
                }
            }
            Some((irq, rest.trim_end().to_owned()))
        })
        .collect()
}

/// Whether `text` names the interface `dev` as a whole word (`eth0-TxRx-0` and
/// `i40e-eth0-TxRx-0` do; `eth01` does not).
pub fn mentions(text: &str, dev: &str) -> bool {
    if dev.is_empty() {
        return false;
    }
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    text.match_indices(dev)
        .any(|(i, _)| !is_word(text[..i].chars().next_back()) && !is_word(text[i + dev.len()..].chars().next()))
}

/// The `driver:` line of `ethtool -i`.
pub fn parse_ethtool_driver(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix("driver:")).map(|d| d.trim().to_owned()).filter(|d| !d.is_empty())
}

/// Parses `ethtool -k` output (`name: on|off [fixed]`, sub-features indented) into every
/// feature it lists.
pub fn parse_ethtool_features(text: &str) -> BTreeMap<String, OffloadState> {
    text.lines()
        .filter(|line| !line.starts_with("Features for "))
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(':')?;
            let mut words = rest.split_whitespace();
            let on = match words.next()? {
                "on" => true,
                "off" => false,
                _ => return None,
            };
            let fixed = rest.contains("[fixed]");
            (!name.is_empty() && !name.contains(' ')).then(|| (name.to_owned(), OffloadState { on, fixed }))
        })
        .collect()
}

/// One line of `tc qdisc show`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QdiscLine {
    /// Kind, e.g. `fq`, `mq`, `noqueue`.
    pub kind: String,
    /// Handle, e.g. `8001:`.
    pub handle: String,
    /// `None` for the root qdisc, else the parent class (`ffff:fff1` for ingress/clsact).
    pub parent: Option<String>,
}

impl QdiscLine {
    /// The ingress side (`ingress`, `clsact`), not an egress scheduler.
    pub fn is_ingress(&self) -> bool {
        matches!(self.kind.as_str(), "ingress" | "clsact") || self.handle == "ffff:"
    }
}

/// Parses `tc qdisc show [dev X]`.
pub fn parse_tc_qdiscs(text: &str) -> Vec<QdiscLine> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if words.next()? != "qdisc" {
                return None;
            }
            let kind = words.next()?.to_owned();
            let handle = words.next()?.to_owned();
            let words: Vec<&str> = words.collect();
            let parent = if words.contains(&"root") {
                None
            } else {
                let at = words.iter().position(|w| *w == "parent")?;
                Some((*words.get(at + 1)?).to_owned())
            };
            Some(QdiscLine { kind, handle, parent })
        })
        .collect()
}

/// The interface of the IPv4 default route in `/proc/net/route` (destination and mask 0).
pub fn parse_default_route(text: &str) -> Option<String> {
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_owned())
    })
}

/// Parses a kernel hex CPU mask (`3`, `00000000,00000003`) into CPU numbers; `None` if it is
/// not a mask.
pub fn parse_cpumask(text: &str) -> Option<Vec<usize>> {
    let digits: Vec<u32> = text.trim().chars().filter(|&c| c != ',').map(|c| c.to_digit(16)).collect::<Option<_>>()?;
    if digits.is_empty() {
        return None;
    }
    let mut cpus = Vec::new();
    for (i, d) in digits.iter().rev().enumerate() {
        cpus.extend((0..4).filter(|b| d & (1 << b) != 0).map(|b| i * 4 + b));
    }
    Some(cpus)
}

/// Formats CPU numbers as a kernel hex mask, 32-bit groups separated by commas, without
/// leading zeros: what `echo … > rps_cpus` or `smp_affinity` takes.
pub fn format_cpumask(cpus: &[usize]) -> String {
    let Some(&max) = cpus.iter().max() else {
        return "0".to_owned();
    };
    let mut words = vec![0u32; max / 32 + 1];
    for &c in cpus {
        words[c / 32] |= 1 << (c % 32);
    }
    let mut out = String::new();
    for (i, w) in words.iter().rev().enumerate() {
        if i == 0 {
            out.push_str(&format!("{w:x}"));
        } else {
            out.push_str(&format!(",{w:08x}"));
        }
    }
    out
}

/// Parses the output of [`READ_FILES_SCRIPT`](super::READ_FILES_SCRIPT).
pub(super) fn parse_file_records(out: &str) -> BTreeMap<String, String> {
    out.split('\u{1e}')
        .filter_map(|rec| {
            let (path, value) = rec.split_once('\u{1f}')?;
            Some((path.to_owned(), value.trim_end().to_owned()))
        })
        .collect()
}

/// Parses three whitespace-separated numbers (`net.ipv4.udp_mem`).
pub(super) fn parse_triple(text: &str) -> Option<[u64; 3]> {
    let v: Vec<u64> = text.split_whitespace().map(|w| w.parse().ok()).collect::<Option<_>>()?;
    v.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_model_and_hypervisor() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) \
                    Processor\nflags\t\t: fpu vme hypervisor lahf_lm\n\nprocessor\t: 1\n\
                    model name\t: Other\nflags\t\t: fpu\n";
        let info = parse_cpuinfo(text);
        assert_eq!(info.model.as_deref(), Some("Intel(R) Xeon(R) Processor"));
        assert_eq!(info.hypervisor, Some(true));
        let bare = parse_cpuinfo("model name : X\nflags : fpu sse2\n");
        assert_eq!(bare.hypervisor, Some(false));
        // arm64: no model name, no flags line.
        let arm = parse_cpuinfo("processor : 0\nFeatures : fp asimd\nCPU part : 0xd0c\n");
        assert_eq!(arm, CpuInfo::default());
    }

    #[test]
    fn interrupts_keep_names_after_counts() {
        let text = "           CPU0       CPU1       \n \
             26:          0         15  IO-APIC   4-edge      ttyS0\n \
             38:          0       1033 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n \
             64:    1234567          0 IR-PCI-MSI 524288-edge      eth0-TxRx-0\n \
             65:          5          9 IR-PCI-MSI 524289-edge      i40e-eth1-TxRx-1\n\
             NMI:          0          0   Non-maskable interrupts\n\
             LOC:     123456     654321   Local timer interrupts\n";
        let irqs = parse_interrupts(text);
        assert_eq!(irqs.len(), 4, "{irqs:?}");
        assert_eq!(irqs[0], (26, "IO-APIC   4-edge      ttyS0".to_owned()));
        assert_eq!(irqs[1].0, 38);
        assert!(irqs[1].1.ends_with("virtio2-input.0"));
        let eth0: Vec<u32> = irqs.iter().filter(|(_, d)| mentions(d, "eth0")).map(|p| p.0).collect();
        assert_eq!(eth0, [64]);
        assert!(irqs.iter().any(|(n, d)| *n == 65 && mentions(d, "eth1")));
    }

    #[test]
    fn mentions_whole_words_only() {
        assert!(mentions("eth0-TxRx-0", "eth0"));
        assert!(mentions("i40e-eth0-TxRx-0", "eth0"));
        assert!(mentions("a, eth0", "eth0"));
        assert!(!mentions("eth01-TxRx-0", "eth0"));
        assert!(!mentions("veth0", "eth0"));
        assert!(!mentions("x", ""));
    }

    #[test]
    fn ethtool_features_and_driver() {
        let text = "Features for lo:\nrx-checksumming: on [fixed]\ntx-checksumming: on\n\
                    \ttx-checksum-ipv4: off [fixed]\n\ttx-checksum-ip-generic: on [fixed]\n\
                    scatter-gather: on\ntx-udp-segmentation: off [requested on]\n\
                    rx-udp-gro-forwarding: off\nhsr-dup-offload: off [fixed]\n";
        let f = parse_ethtool_features(text);
        let st = |on, fixed| Some(OffloadState { on, fixed });
        assert_eq!(f.get("tx-checksumming").copied(), st(true, false));
        assert_eq!(f.get("tx-checksum-ip-generic").copied(), st(true, true));
        assert_eq!(f.get("tx-udp-segmentation").copied(), st(false, false));
        assert_eq!(f.get("rx-udp-gro-forwarding").copied(), st(false, false));
        assert!(!f.contains_key("Features for lo"));
        assert_eq!(f.len(), 8);
        let drv = "driver: virtio_net\nversion: 1.0.0\nbus-info: 0000:00:03.0\n";
        assert_eq!(parse_ethtool_driver(drv).as_deref(), Some("virtio_net"));
        assert_eq!(parse_ethtool_driver("driver: \n"), None);
        assert_eq!(parse_ethtool_driver(""), None);
    }

    #[test]
    fn tc_qdisc_show() {
        let text = "qdisc noqueue 0: root refcnt 2 \n";
        let q = parse_tc_qdiscs(text);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].kind, "noqueue");
        assert_eq!(q[0].parent, None);
        let mq = "qdisc mq 0: dev eth0 root \n\
                  qdisc fq 0: dev eth0 parent :2 limit 10000p flow_limit 100p buckets 1024\n\
                  qdisc fq 0: dev eth0 parent :1 limit 10000p flow_limit 100p buckets 1024\n\
                  qdisc clsact ffff: dev eth0 parent ffff:fff1 \n\
                  qdisc pfifo_fast 0: dev eth1 root refcnt 2 bands 3 priomap 1 2 2 2\n";
        let q = parse_tc_qdiscs(mq);
        assert_eq!(q.len(), 5);
        assert_eq!(q[0].kind, "mq");
        assert_eq!(q[1].parent.as_deref(), Some(":2"));
        assert!(q[3].is_ingress());
        assert!(!q[1].is_ingress());
        assert_eq!(q[4].parent, None);
        assert!(parse_tc_qdiscs("Error: Cannot find device \"x\".\n").is_empty());
    }

    #[test]
    fn default_route() {
        let text = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                    eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                    eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(parse_default_route(text).as_deref(), Some("eth0"));
        assert_eq!(parse_default_route("Iface\tDestination\n"), None);
    }

    #[test]
    fn cpumasks_round_trip() {
        assert_eq!(parse_cpumask("3"), Some(vec![0, 1]));
        assert_eq!(parse_cpumask("0\n"), Some(vec![]));
        assert_eq!(parse_cpumask("00000000,00000000"), Some(vec![]));
        assert_eq!(parse_cpumask("1,00000004"), Some(vec![2, 32]));
        assert_eq!(parse_cpumask("zz"), None);
        assert_eq!(parse_cpumask(""), None);
        assert_eq!(format_cpumask(&[0, 1]), "3");
        assert_eq!(format_cpumask(&[]), "0");
        assert_eq!(format_cpumask(&[2, 32]), "1,00000004");
        let many: Vec<usize> = (0..40).collect();
        assert_eq!(format_cpumask(&many), "ff,ffffffff");
        assert_eq!(parse_cpumask(&format_cpumask(&many)), Some(many));
    }

    #[test]
    fn file_records_and_triples() {
        let out = "\u{1e}/sys/a\u{1f}1500\n\u{1e}/sys/b\u{1f}line1\nline2\n";
        let m = parse_file_records(out);
        assert_eq!(m["/sys/a"], "1500");
        assert_eq!(m["/sys/b"], "line1\nline2");
        assert!(parse_file_records("").is_empty());
        assert_eq!(parse_triple("575799\t767734\t1151598"), Some([575799, 767734, 1151598]));
        assert_eq!(parse_triple("1 2"), None);
        assert_eq!(parse_triple("1 x 3"), None);
    }
}
