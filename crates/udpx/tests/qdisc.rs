//! Does the kernel pace here? `udpx::qdisc::egress` over real rtnetlink: on loopback (no
//! privileges), and in namespaces the test creates (and removes, also on panic) with the
//! veth's root qdisc replaced by tbf, fq_codel and, where this kernel has it, fq. Needs root
//! for the namespace cases; prints `SKIP:` otherwise, and for a qdisc this kernel lacks.

mod common;

use std::net::IpAddr;

use common::skip;
use udpx::qdisc::{egress, Egress, KernelPacing};
use udpx::TxClock;
use udpx_netns::{skip_unless_capable, TestNet, TestNetConfig};

#[test]
fn loopback_is_noqueue_and_not_paced() {
    for dest in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
        let e = egress(dest.parse().unwrap()).unwrap_or_else(|err| panic!("{dest}: {err}"));
        println!("{dest}: {e}");
        assert_eq!(e.device, "lo", "{dest}");
        assert_eq!(e.root, "noqueue", "{dest}");
        assert!(e.children.is_empty());
        assert_eq!(e.pacing, KernelPacing::None);
        assert_eq!(e.pacing.clock(), None);
    }
}

/// The sending end of a fresh veth pair, asked from inside its namespace.
fn egress_in(net: &TestNet) -> Egress {
    let dest = IpAddr::from(net.rx_v4);
    net.tx.run(move || egress(dest)).expect("egress over the veth")
}

/// `tc qdisc replace dev <tx veth> root <args>` in the sending namespace.
fn replace_root(net: &TestNet, args: &[&str]) -> Result<(), udpx_netns::Error> {
    let mut cmd = vec!["tc", "qdisc", "replace", "dev", &net.tx_dev, "root"];
    cmd.extend_from_slice(args);
    net.tx.exec(&cmd).map(drop)
}

#[test]
fn veth_roots_decide_pacing() {
    if skip_unless_capable("veth_roots_decide_pacing") {
        return;
    }
    let net = TestNet::setup(&TestNetConfig::default()).expect("setup");

    // The default root, whatever this kernel gives a veth (noqueue here, fq_codel or
    // pfifo_fast elsewhere): never a pacing qdisc.
    let e = egress_in(&net);
    println!("default: {e}");
    assert_eq!(e.device, net.tx_dev);
    assert!(e.ifindex > 0);
    assert!(!e.root.is_empty());
    assert_eq!(e.pacing, KernelPacing::None);

    // IPv6 takes the same device; loopback inside the namespace is its own lo.
    let v6 = IpAddr::from(net.rx_v6);
    assert_eq!(net.tx.run(move || egress(v6)).unwrap().device, net.tx_dev);
    assert_eq!(net.tx.run(|| egress("127.0.0.1".parse().unwrap())).unwrap().device, "lo");

    // No route: the kernel's errno, kept.
    let err = net.tx.run(|| egress("203.0.113.7".parse().unwrap())).unwrap_err();
    assert!(err.to_string().contains("203.0.113.7"), "{err}");
    let io: std::io::Error = err.into();
    assert_eq!(io.raw_os_error(), Some(libc::ENETUNREACH), "{io}");

    // A token bucket: shapes, but ignores departure times.
    replace_root(&net, &["tbf", "rate", "100mbit", "burst", "64kb", "latency", "10ms"]).expect("tbf");
    let e = egress_in(&net);
    println!("tbf: {e}");
    assert_eq!(e.root, "tbf");
    assert_eq!(e.pacing, KernelPacing::None);

    match replace_root(&net, &["fq_codel"]) {
        Ok(()) => {
            let e = egress_in(&net);
            println!("fq_codel: {e}");
            assert_eq!((e.root.as_str(), e.pacing), ("fq_codel", KernelPacing::None));
        }
        Err(why) => skip("veth_roots_decide_pacing: fq_codel", &format!("no fq_codel qdisc in this kernel ({why})")),
    }

    match replace_root(&net, &["fq"]) {
        Ok(()) => {
            let e = egress_in(&net);
            println!("fq: {e}");
            assert_eq!((e.root.as_str(), e.pacing), ("fq", KernelPacing::Fq));
            assert_eq!(e.pacing.clock(), Some(TxClock::Monotonic));
        }
        Err(why) => skip("veth_roots_decide_pacing: fq", &format!("no fq qdisc in this kernel ({why})")),
    }
}

#[test]
fn multiqueue_veth_under_mq() {
    if skip_unless_capable("multiqueue_veth_under_mq") {
        return;
    }
    // A veth with two transmit queues, alone in a namespace of its own.
    let ns = udpx_netns::Namespace::create_unique("mq").expect("namespace");
    let pid = std::process::id();
    let (a, b) = (format!("uq{pid}a"), format!("uq{pid}b"));
    let sh = |cmd: &str| ns.exec(&["sh", "-c", cmd]);
    sh(&format!(
        "ip link add {a} numtxqueues 2 numrxqueues 2 type veth peer name {b} numtxqueues 2 numrxqueues 2 && \
         ip addr add 198.51.100.1/24 dev {a} && ip link set {a} up && ip link set {b} up"
    ))
    .expect("multiqueue veth");
    let ask = || ns.run(|| egress("198.51.100.2".parse().unwrap())).expect("egress");
    match sh(&format!("tc qdisc replace dev {a} root handle 1: mq")) {
        Ok(_) => {
            let e = ask();
            println!("mq: {e}");
            assert_eq!(e.root, "mq");
            assert_eq!(e.children.len(), 2, "one child per queue: {e}");
            assert_eq!(e.pacing, KernelPacing::decide("mq", &e.children));
            // Mixed children are never trusted.
            if sh(&format!("tc qdisc replace dev {a} parent 1:1 tbf rate 1gbit burst 64kb latency 1ms")).is_ok() {
                let e = ask();
                println!("mq with a tbf child: {e}");
                assert!(e.children.contains(&"tbf".to_string()), "{e}");
                assert_eq!(e.pacing, KernelPacing::None);
            }
            match sh(&format!("tc qdisc replace dev {a} parent 1:1 fq && tc qdisc replace dev {a} parent 1:2 fq")) {
                Ok(_) => assert_eq!(ask().pacing, KernelPacing::Fq),
                Err(why) => {
                    skip("multiqueue_veth_under_mq: fq children", &format!("no fq qdisc in this kernel ({why})"))
                }
            }
        }
        Err(why) => skip("multiqueue_veth_under_mq", &format!("no mq qdisc in this kernel ({why})")),
    }
}
