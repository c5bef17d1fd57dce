//! Does the kernel pace here? The egress device of a destination and its qdiscs, read with
//! rtnetlink.
//!
//! A departure time (`SO_TXTIME` + `SCM_TXTIME`, see [`crate::txtime`]) is only a request:
//! the kernel stores it in the packet (`skb->tstamp`) and every layer below ignores it except
//! two qdiscs. **fq** holds each packet until its time, on `CLOCK_MONOTONIC` (and drops one
//! more than its horizon, 10 s by default, ahead). **etf** releases packets in time order on
//! `CLOCK_TAI`, the only clock it can be configured with (`validate_input_params` in
//! `net/sched/sch_etf.c` refuses others), and drops a packet from a socket without
//! `SO_TXTIME`, with another clock (`sk_clockid`), or whose time has passed. Under any other root
//! (`noqueue` on `lo` and veth, `fq_codel`, `pfifo_fast`, `tbf`, `htb`...) the timestamp is
//! accepted and the packet leaves at once, and nothing says so: a sender that relies on the
//! kernel there does not pace at all. So a pacer asks [`egress`] once per destination and
//! paces in user space unless it says [`KernelPacing::Fq`] or [`KernelPacing::Etf`].
//!
//! Multi-queue devices have an `mq` root that only dispatches to one child qdisc per transmit
//! queue; which queue a socket's packets take depends on XPS and the flow hash, not on the
//! sender. So `mq` counts as pacing only when *every* child is the same pacing qdisc: with
//! mixed children some packets would be paced and others not, which cannot be trusted.
//! Classful roots (`htb`, `prio`, `tbf`) are not trusted even with fq leaves below them: the
//! parent's own scheduling decides when a leaf may dequeue, so the departure time is at best
//! a lower bound.
//!
//! The question is asked in the calling thread's network namespace (a netlink socket belongs
//! to the namespace it was created in), like every socket udpx creates.

use std::fmt;
use std::io;
use std::net::IpAddr;

use crate::error::Error;
use crate::sys::addr::unmapped;
use crate::sys::netlink::{
    link_request, parse_link, parse_qdisc, parse_route, qdisc_dump_request, route_request, walk, NlSocket, RECV_BUF,
    RTM_NEWLINK, RTM_NEWQDISC, RTM_NEWROUTE,
};
use crate::txtime::TxClock;

pub use crate::sys::netlink::{ParseError, QdiscMsg, TC_H_ROOT};

/// `TC_H_INGRESS` (`linux/pkt_sched.h`): the parent of the ingress and clsact qdiscs, which
/// see only received packets.
const TC_H_INGRESS: u32 = 0xFFFF_FFF1;

/// Whether departure times are enforced on a device, and on which clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelPacing {
    /// The root is `fq`, or `mq` with `fq` under every queue: departure times on
    /// `CLOCK_MONOTONIC` ([`TxClock::Monotonic`]) are honoured, within fq's horizon.
    Fq,
    /// The root is `etf`, or `mq` with `etf` under every queue: departure times on
    /// `CLOCK_TAI` ([`TxClock::Tai`]) are honoured; a packet without one, on another clock, or
    /// late, is dropped by etf.
    Etf,
    /// Any other qdisc: a departure time is ignored and the packet leaves at once. Pace in
    /// user space.
    None,
}

impl KernelPacing {
    /// The clock a socket must configure for departure times to be honoured; `None` when
    /// nothing honours them.
    pub fn clock(self) -> Option<TxClock> {
        match self {
            KernelPacing::Fq => Some(TxClock::Monotonic),
            KernelPacing::Etf => Some(TxClock::Tai),
            KernelPacing::None => None,
        }
    }

    /// Decides from the root qdisc's kind and its direct children's (see the module docs).
    pub fn decide(root: &str, children: &[String]) -> KernelPacing {
        let all = |kind: &str| !children.is_empty() && children.iter().all(|c| c == kind);
        match root {
            "fq" => KernelPacing::Fq,
            "etf" => KernelPacing::Etf,
            "mq" if all("fq") => KernelPacing::Fq,
            "mq" if all("etf") => KernelPacing::Etf,
            _ => KernelPacing::None,
        }
    }
}

impl fmt::Display for KernelPacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelPacing::Fq => "enforced by fq (CLOCK_MONOTONIC)",
            KernelPacing::Etf => "enforced by etf (CLOCK_TAI)",
            KernelPacing::None => "not enforced (pace in user space)",
        })
    }
}

/// Where a destination's packets leave this namespace, and whether departure times are
/// enforced there. Filled by [`egress`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Egress {
    /// The output interface of the route (`RTA_OIF`).
    pub ifindex: u32,
    /// Its name (`IFLA_IFNAME`).
    pub device: String,
    /// The root qdisc's kind (`noqueue`, `fq`, `mq`, `fq_codel`, ...); empty if the kernel
    /// listed no root.
    pub root: String,
    /// The kinds of the qdiscs directly under the root (one per queue under `mq`, the leaves
    /// of a classful root), in the kernel's order.
    pub children: Vec<String>,
    /// The verdict: [`KernelPacing::decide`] on `root` and `children`.
    pub pacing: KernelPacing,
}

impl fmt::Display for Egress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (ifindex {}) root {}",
            self.device,
            self.ifindex,
            if self.root.is_empty() { "?" } else { &self.root }
        )?;
        if !self.children.is_empty() {
            write!(f, " [{}]", self.children.join(","))?;
        }
        write!(f, ": departure times {}", self.pacing)
    }
}

/// Finds the device a datagram to `dest` leaves by (the route the kernel would use, as `ip
/// route get` shows), its root qdisc and the root's children, and decides whether departure
/// times are enforced there. Runs in the calling thread's network namespace; three netlink
/// exchanges, no privileges needed.
///
/// Errors: [`Error::Io`] with the kernel's errno (ENETUNREACH: no route; EACCES/EPERM: a
/// sandbox forbids netlink) or InvalidData for an answer that cannot be read.
pub fn egress(dest: IpAddr) -> Result<Egress, Error> {
    let dest = unmapped(dest);
    let io = |op: String| move |source: io::Error| Error::Io { op, source };
    let mut nl = NlSocket::open().map_err(io("open a NETLINK_ROUTE socket".into()))?;
    let mut buf = vec![0u8; RECV_BUF];

    let mut oif = Ok(None);
    nl.exchange(
        |seq| route_request(seq, dest),
        &mut buf,
        |ty, p| {
            if ty == RTM_NEWROUTE && matches!(oif, Ok(None)) {
                oif = parse_route(p);
            }
        },
    )
    .map_err(io(format!("route to {dest} (RTM_GETROUTE)")))?;
    let ifindex =
        oif.map_err(io::Error::from).map_err(io(format!("route to {dest} (RTM_GETROUTE)")))?.ok_or_else(|| {
            Error::Io {
                op: format!("route to {dest}: the route names no output device (unreachable, blackhole or prohibit)"),
                source: io::Error::from_raw_os_error(libc::ENETUNREACH),
            }
        })?;

    let mut name = Ok(None);
    nl.exchange(
        |seq| link_request(seq, ifindex),
        &mut buf,
        |ty, p| {
            if ty == RTM_NEWLINK {
                name = parse_link(p).map(|(i, n)| n.filter(|_| i == ifindex));
            }
        },
    )
    .map_err(io(format!("name of interface {ifindex} (RTM_GETLINK)")))?;
    let op = format!("name of interface {ifindex} (RTM_GETLINK)");
    let device = name.map_err(io::Error::from).map_err(io(op))?.unwrap_or_else(|| format!("if{ifindex}"));

    let mut qdiscs = Vec::new();
    let mut bad = None;
    nl.exchange(
        |seq| qdisc_dump_request(seq, ifindex),
        &mut buf,
        |ty, p| {
            if ty == RTM_NEWQDISC {
                match parse_qdisc(p) {
                    Ok(q) => qdiscs.push(q),
                    Err(e) => bad = Some(e),
                }
            }
        },
    )
    .map_err(io(format!("qdiscs of {device} (RTM_GETQDISC)")))?;
    if let Some(e) = bad {
        return Err(Error::Io { op: format!("qdiscs of {device} (RTM_GETQDISC)"), source: e.into() });
    }
    let (root, children) = root_and_children(&qdiscs, ifindex);
    let pacing = KernelPacing::decide(&root, &children);
    Ok(Egress { ifindex, device, root, children, pacing })
}

/// From a qdisc dump, the kind of `ifindex`'s root (parent [`TC_H_ROOT`]; empty if absent)
/// and of the qdiscs directly below it: those whose parent has the root's major handle
/// number (`mq`'s per-queue children `8001:1`, `8001:2`..., or a classful root's leaves
/// `1:10`...). A root with handle 0 (`noqueue`, default `pfifo_fast`) has none. Ingress and
/// other devices' qdiscs are ignored.
pub fn root_and_children(qdiscs: &[QdiscMsg], ifindex: u32) -> (String, Vec<String>) {
    let mine = || qdiscs.iter().filter(move |q| q.ifindex == ifindex);
    let Some(root) = mine().find(|q| q.parent == TC_H_ROOT) else {
        return (String::new(), Vec::new());
    };
    let major = root.handle >> 16;
    let children = if major == 0 {
        Vec::new()
    } else {
        mine()
            .filter(|q| q.parent != TC_H_ROOT && q.parent != TC_H_INGRESS && q.parent >> 16 == major)
            .map(|q| q.kind.clone())
            .collect()
    };
    (root.kind.clone(), children)
}

/// Reads the qdiscs from one datagram of an RTM_GETQDISC dump answering request `seq`. Pure
/// and total: any bytes give a result or an error, never a panic (the fuzz entry point).
pub fn parse_qdisc_dump(datagram: &[u8], seq: u32) -> Result<Vec<QdiscMsg>, ParseError> {
    let mut out = Vec::new();
    let mut bad = None;
    walk(datagram, seq, |ty, p| {
        if ty == RTM_NEWQDISC && bad.is_none() {
            match parse_qdisc(p) {
                Ok(q) => out.push(q),
                Err(e) => bad = Some(e),
            }
        }
    })?;
    bad.map_or(Ok(out), Err)
}

/// Reads the output interface from the answer to an RTM_GETROUTE request `seq`. Pure and
/// total, like [`parse_qdisc_dump`].
pub fn parse_route_reply(datagram: &[u8], seq: u32) -> Result<Option<u32>, ParseError> {
    let mut oif = Ok(None);
    walk(datagram, seq, |ty, p| {
        if ty == RTM_NEWROUTE && matches!(oif, Ok(None)) {
            oif = parse_route(p);
        }
    })?;
    oif
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(ifindex: u32, handle: u32, parent: u32, kind: &str) -> QdiscMsg {
        QdiscMsg { ifindex, handle, parent, kind: kind.into() }
    }

    fn kinds(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn decision_table() {
        use KernelPacing as P;
        let cases: &[(&str, &[&str], KernelPacing)] = &[
            ("fq", &[], P::Fq),
            ("etf", &[], P::Etf),
            ("mq", &["fq", "fq", "fq"], P::Fq),
            ("mq", &["etf", "etf"], P::Etf),
            ("mq", &["fq", "fq_codel"], P::None),
            ("mq", &["fq", "etf"], P::None),
            ("mq", &[], P::None),
            ("mq", &["pfifo_fast", "pfifo_fast"], P::None),
            ("noqueue", &[], P::None),
            ("fq_codel", &[], P::None),
            ("pfifo_fast", &[], P::None),
            ("tbf", &["fq"], P::None),
            ("htb", &["fq", "fq"], P::None),
            ("", &[], P::None),
        ];
        for (root, children, want) in cases {
            assert_eq!(KernelPacing::decide(root, &kinds(children)), *want, "{root} {children:?}");
        }
        assert_eq!(P::Fq.clock(), Some(TxClock::Monotonic));
        assert_eq!(P::Etf.clock(), Some(TxClock::Tai));
        assert_eq!(P::None.clock(), None);
    }

    #[test]
    fn root_and_children_table() {
        let dump = vec![
            q(1, 0, TC_H_ROOT, "noqueue"),
            q(2, 0x8001_0000, TC_H_ROOT, "mq"),
            q(2, 0, 0x8001_0001, "fq"),
            q(2, 0, 0x8001_0002, "fq_codel"),
            q(2, 0xFFFF_0000, TC_H_INGRESS, "ingress"),
            q(3, 0x0001_0000, TC_H_ROOT, "htb"),
            q(3, 0x0002_0000, 0x0001_0010, "fq"),
            q(3, 0x0003_0000, 0x0002_0001, "pfifo"), // a grandchild: not direct
            q(4, 0, TC_H_ROOT, "pfifo_fast"),
            q(4, 0, 0x0000_0001, "weird"), // handle 0 root: no children
        ];
        let rc = |i| root_and_children(&dump, i);
        assert_eq!(rc(1), ("noqueue".into(), vec![]));
        assert_eq!(rc(2), ("mq".into(), kinds(&["fq", "fq_codel"])));
        assert_eq!(rc(3), ("htb".into(), kinds(&["fq"])));
        assert_eq!(rc(4), ("pfifo_fast".into(), vec![]));
        assert_eq!(rc(9), (String::new(), vec![]));
    }

    #[test]
    fn display_says_what_to_do() {
        let e = Egress {
            ifindex: 1,
            device: "lo".into(),
            root: "noqueue".into(),
            children: vec![],
            pacing: KernelPacing::None,
        };
        assert_eq!(e.to_string(), "lo (ifindex 1) root noqueue: departure times not enforced (pace in user space)");
    }
}
