//! Capability probing: what this kernel and this socket can do, found at run time.
//!
//! Two levels:
//! - [`KernelCaps`]: properties of the running kernel, probed once per process (a throwaway
//!   socket per option; the GSO segment limit by a real 128-segment send over loopback).
//! - [`Capabilities`]: what one socket has switched on, plus the run-time state changes of
//!   its fallbacks (GSO turned off after the path refused it; the segment limit lowered after
//!   the kernel refused 128). Every change is counted and logged once.
//!
//! Nothing here hard-codes a kernel limit: 128 segments (`UDP_MAX_SEGMENTS` since Linux 6.9)
//! is tried first, then 64 (since 4.18).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::sys;

/// A kernel feature udpx can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// UDP segmentation offload (`UDP_SEGMENT`, Linux 4.18).
    Gso,
    /// UDP receive coalescing (`UDP_GRO`, Linux 5.0).
    Gro,
    /// Per-datagram departure times (`SO_TXTIME`, Linux 4.19).
    TxTime,
    /// Zerocopy transmit (`SO_ZEROCOPY`, Linux 4.14; UDP since 5.0).
    Zerocopy,
    /// Destination address on receive, source address on send (`IP_PKTINFO`).
    PktInfo,
    /// ECN codepoints on send and receive (`IP_RECVTOS` / `IPV6_RECVTCLASS`).
    Ecn,
    /// The kernel's per-socket drop counter on receive (`SO_RXQ_OVFL`).
    RxqOvfl,
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Feature::Gso => "UDP GSO (UDP_SEGMENT)",
            Feature::Gro => "UDP GRO (UDP_GRO)",
            Feature::TxTime => "SO_TXTIME",
            Feature::Zerocopy => "SO_ZEROCOPY",
            Feature::PktInfo => "IP_PKTINFO",
            Feature::Ecn => "ECN (IP_RECVTOS)",
            Feature::RxqOvfl => "SO_RXQ_OVFL",
        })
    }
}

/// How much a socket wants a feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Want {
    /// Leave it off.
    #[default]
    Off,
    /// Use it when the kernel has it; run without it otherwise (recorded in [`Capabilities`]).
    IfAvailable,
    /// Fail socket creation with [`Error::Unsupported`](crate::Error::Unsupported) without it.
    Required,
}

impl Want {
    /// Not [`Want::Off`].
    pub fn wanted(self) -> bool {
        self != Want::Off
    }
}

/// What the running kernel supports, probed once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCaps {
    /// Most segments one GSO send may carry (`UDP_MAX_SEGMENTS`); `None` without GSO.
    pub gso_max_segments: Option<usize>,
    /// Whether `gso_max_segments` was measured by a real send (false: loopback was not
    /// usable, so the conservative 64 is assumed).
    pub gso_limit_measured: bool,
    /// `UDP_GRO` accepted.
    pub gro: bool,
    /// `SO_TXTIME` accepted. Whether departure times are *enforced* depends on the egress
    /// qdisc (fq or etf), which `udpx probe` checks.
    pub txtime: bool,
    /// `SO_ZEROCOPY` accepted.
    pub zerocopy: bool,
}

impl KernelCaps {
    /// The probed capabilities of this kernel (probed on first call).
    pub fn get() -> KernelCaps {
        static CAPS: OnceLock<KernelCaps> = OnceLock::new();
        *CAPS.get_or_init(probe_kernel)
    }
}

fn probe_kernel() -> KernelCaps {
    let opt_ok = |level, name, value: libc::c_int| {
        sys::udp_socket(false).and_then(|fd| sys::setsockopt(fd.as_fd(), level, name, value)).is_ok()
    };
    let gso =
        sys::udp_socket(false).and_then(|fd| sys::getsockopt_int(fd.as_fd(), sys::SOL_UDP, sys::UDP_SEGMENT)).is_ok();
    let (gso_max_segments, gso_limit_measured) = if gso {
        match probe_max_segments() {
            Some(n) => (Some(n), true),
            None => (Some(64), false),
        }
    } else {
        (None, false)
    };
    let txtime = sys::udp_socket(false)
        .and_then(|fd| {
            let cfg = libc::sock_txtime { clockid: libc::CLOCK_MONOTONIC, flags: 0 };
            sys::setsockopt(fd.as_fd(), libc::SOL_SOCKET, sys::SO_TXTIME, cfg)
        })
        .is_ok();
    KernelCaps {
        gso_max_segments,
        gso_limit_measured,
        gro: opt_ok(sys::SOL_UDP, sys::UDP_GRO, 1),
        txtime,
        zerocopy: opt_ok(libc::SOL_SOCKET, sys::SO_ZEROCOPY, 1),
    }
}

/// Sends one GSO buffer of 128 one-byte segments to a socket of our own on loopback; the
/// kernel refuses more than `UDP_MAX_SEGMENTS` with EINVAL. Then 64. `None` when loopback is
/// unusable (e.g. a fresh network namespace with `lo` down).
fn probe_max_segments() -> Option<usize> {
    let fd = sys::udp_socket(false).ok()?;
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    sys::bind(fd.as_fd(), &lo).ok()?;
    let me = sys::local_or_peer(fd.as_fd(), false).ok()??;
    sys::set_nonblocking(fd.as_fd(), true).ok()?;
    let payload = [0u8; 128];
    let mut scratch = sys::mmsg::SendScratch::new();
    let faults = sys::fault::Faults::default();
    for n in [128usize, 64] {
        let msg = sys::mmsg::OutMsg {
            dst: me,
            to_peer: false,
            payload: &payload[..n],
            segment_size: Some(1),
            src_ip: None,
            ecn: None,
            txtime: None,
        };
        match scratch.send(fd.as_fd(), false, &[msg], false, 0, &faults) {
            Ok(_) => return Some(n),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// What one socket has, as a snapshot ([`UdpSocket::capabilities`](crate::UdpSocket::capabilities)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// GSO sends are in use on this socket now (the send mode segments, the kernel has GSO,
    /// and no fallback has turned it off).
    pub gso: bool,
    /// Segments per GSO send: the probed kernel limit, possibly lowered at run time.
    pub gso_max_segments: usize,
    /// Why GSO was turned off at run time, if it was.
    pub gso_off_reason: Option<String>,
    /// `UDP_GRO` is on for this socket.
    pub gro: bool,
    /// `SO_TXTIME` is on for this socket (accepted; enforcement depends on the qdisc).
    pub txtime: bool,
    /// `SO_ZEROCOPY` is available to this socket's kernel.
    pub zerocopy_available: bool,
    /// Zerocopy sends are in use on this socket now (asked for, accepted, not turned off).
    pub zerocopy: bool,
    /// Why zerocopy was turned off at run time, if it was.
    pub zerocopy_off_reason: Option<String>,
    /// Destination address on receive / source address on send.
    pub pktinfo: bool,
    /// ECN on receive.
    pub ecn: bool,
    /// Kernel drop counter on receive.
    pub rxq_ovfl: bool,
    /// `IP_RECVERR`: ICMP errors on the error queue (see [`crate::icmp`]).
    pub recv_err: bool,
    /// Effective send buffer (what the kernel reports, i.e. doubled for its bookkeeping).
    pub send_buffer: usize,
    /// Effective receive buffer.
    pub recv_buffer: usize,
    /// The kernel-wide probe this socket started from.
    pub kernel: KernelCaps,
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yn = |b: bool| if b { "yes" } else { "no" };
        let k = &self.kernel;
        writeln!(
            f,
            "gso            {} (kernel: {}, max {} segments{})",
            yn(self.gso),
            yn(k.gso_max_segments.is_some()),
            self.gso_max_segments,
            if k.gso_limit_measured { ", measured" } else { ", assumed" }
        )?;
        if let Some(r) = &self.gso_off_reason {
            writeln!(f, "  turned off    {r}")?;
        }
        writeln!(f, "gro            {} (kernel: {})", yn(self.gro), yn(k.gro))?;
        writeln!(f, "txtime         {} (kernel: {}; enforced only by an fq/etf qdisc)", yn(self.txtime), yn(k.txtime))?;
        writeln!(f, "zerocopy       {} (kernel: {})", yn(self.zerocopy), yn(self.zerocopy_available))?;
        if let Some(r) = &self.zerocopy_off_reason {
            writeln!(f, "  turned off    {r}")?;
        }
        writeln!(f, "pktinfo        {}", yn(self.pktinfo))?;
        writeln!(f, "ecn            {}", yn(self.ecn))?;
        writeln!(f, "rxq_ovfl       {}", yn(self.rxq_ovfl))?;
        writeln!(f, "recv_err       {}", yn(self.recv_err))?;
        writeln!(f, "send buffer    {} B", self.send_buffer)?;
        write!(f, "recv buffer    {} B", self.recv_buffer)
    }
}

/// The mutable, run-time part of a socket's capabilities.
#[derive(Debug)]
pub(crate) struct CapState {
    pub gso: AtomicBool,
    pub gso_max_segments: AtomicUsize,
    pub gso_off_reason: OnceLock<String>,
    pub gro: bool,
    pub txtime: bool,
    pub pktinfo: bool,
    pub ecn: bool,
    pub rxq_ovfl: bool,
    pub recv_err: bool,
    pub zerocopy: AtomicBool,
    pub zerocopy_off_reason: OnceLock<String>,
    pub kernel: KernelCaps,
}

impl CapState {
    pub(crate) fn gso_enabled(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    pub(crate) fn max_segments(&self) -> usize {
        self.gso_max_segments.load(Ordering::Relaxed)
    }
}
