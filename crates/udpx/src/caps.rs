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
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

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
    /// The kernel's receive time of each datagram (`SO_TIMESTAMPNS`).
    RxTime,
    /// Sends through io_uring (`IORING_OP_SENDMSG`, Linux 5.3).
    IoUring,
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
            Feature::RxTime => "SO_TIMESTAMPNS",
            Feature::IoUring => "io_uring (IORING_OP_SENDMSG)",
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
#[allow(clippy::struct_excessive_bools)] // reason: a record of independent yes/no kernel facts, one per probe
pub struct KernelCaps {
    /// Most segments one GSO send may carry (`UDP_MAX_SEGMENTS`); `None` without GSO.
    pub gso_max_segments: Option<usize>,
    /// Whether `gso_max_segments` was measured by a real send (false: loopback was not
    /// usable, so the conservative 64 is assumed).
    pub gso_limit_measured: bool,
    /// `UDP_GRO` accepted.
    pub gro: bool,
    /// `SO_TXTIME` accepted. Whether departure times are *enforced* depends on the egress
    /// qdisc (fq or etf), which [`crate::qdisc::egress`] (and `udpx probe`) checks.
    pub txtime: bool,
    /// `SO_ZEROCOPY` accepted.
    pub zerocopy: bool,
}

/// Whether sends can go through io_uring in this process: `Ok`, or why not (an old kernel,
/// `kernel.io_uring_disabled`, a seccomp filter, a build without the `io-uring` feature, or
/// the operator's `UDPX_IO_URING=off` in the environment). Probed once, by making a ring and
/// asking it for `IORING_OP_SENDMSG`.
pub fn io_uring_available() -> Result<(), String> {
    if std::env::var_os("UDPX_IO_URING").is_some_and(|v| v == "off") {
        return Err("io_uring switched off (UDPX_IO_URING=off in the environment)".to_owned());
    }
    #[cfg(feature = "io-uring")]
    return sys::uring::available();
    #[cfg(not(feature = "io-uring"))]
    Err("built without the io-uring feature".to_owned())
}

/// Whether io_uring sends can be zerocopy (`IORING_OP_SENDMSG_ZC`, Linux 6.1): a zerocopy
/// socket on the io_uring backend then takes its completions from the ring; without it, such a
/// socket's zerocopy sends go by system calls with `MSG_ZEROCOPY`.
pub fn io_uring_zerocopy_available() -> bool {
    #[cfg(feature = "io-uring")]
    return sys::uring::zerocopy_available();
    #[cfg(not(feature = "io-uring"))]
    false
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
        match scratch.send_one(fd.as_fd(), false, &msg, 0, &faults) {
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
#[allow(clippy::struct_excessive_bools)] // reason: a snapshot of independent yes/no socket facts, one per option
pub struct Capabilities {
    /// GSO sends are in use on this socket now (the send mode segments, the kernel has GSO,
    /// and the socket as a whole is not in a refusal back-off).
    pub gso: bool,
    /// Segments per GSO send: the probed kernel limit, possibly lowered at run time.
    pub gso_max_segments: usize,
    /// Destinations that datagrams go to plain for now because the kernel refused a GSO send
    /// to them (each until its back-off ends).
    pub gso_refused_destinations: usize,
    /// The last GSO refusal: the errno, the destination, and what udpx does about it.
    pub gso_off_reason: Option<String>,
    /// `UDP_GRO` is on for this socket.
    pub gro: bool,
    /// `SO_TXTIME` is on for this socket (accepted; enforcement depends on the qdisc).
    pub txtime: bool,
    /// The clock the socket's departure times are handed to the kernel on (set at creation
    /// from [`crate::SocketConfig::txtime_clock`]); `None` when `txtime` is off.
    pub txtime_clock: Option<crate::TxClock>,
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
    /// The kernel's receive time on each datagram.
    pub rx_time: bool,
    /// `IP_RECVERR`: ICMP errors on the error queue (see [`crate::icmp`]).
    pub recv_err: bool,
    /// Effective send buffer (what the kernel reports, i.e. doubled for its bookkeeping).
    pub send_buffer: usize,
    /// Effective receive buffer.
    pub recv_buffer: usize,
    /// The kernel-wide probe this socket started from.
    pub kernel: KernelCaps,
    /// Sends go through io_uring ([`crate::SocketConfig::io_uring`]).
    pub io_uring: bool,
    /// Why io_uring was asked for and is not used (unavailable: an old kernel,
    /// `kernel.io_uring_disabled`, a seccomp filter).
    pub io_uring_off_reason: Option<String>,
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
        if self.gso_refused_destinations > 0 {
            writeln!(f, "  plain to      {} destination(s) in GSO refusal back-off", self.gso_refused_destinations)?;
        }
        if let Some(r) = &self.gso_off_reason {
            writeln!(f, "  last refusal  {r}")?;
        }
        writeln!(f, "gro            {} (kernel: {})", yn(self.gro), yn(k.gro))?;
        match self.txtime_clock {
            Some(c) => {
                writeln!(f, "txtime         yes, {c} (kernel: {}; enforced only by an fq/etf qdisc)", yn(k.txtime))?
            }
            None => writeln!(f, "txtime         no (kernel: {}; enforced only by an fq/etf qdisc)", yn(k.txtime))?,
        }
        writeln!(f, "zerocopy       {} (kernel: {})", yn(self.zerocopy), yn(self.zerocopy_available))?;
        if let Some(r) = &self.zerocopy_off_reason {
            writeln!(f, "  turned off    {r}")?;
        }
        writeln!(f, "pktinfo        {}", yn(self.pktinfo))?;
        writeln!(f, "ecn            {}", yn(self.ecn))?;
        writeln!(f, "rxq_ovfl       {}", yn(self.rxq_ovfl))?;
        writeln!(f, "rx_time        {}", yn(self.rx_time))?;
        writeln!(f, "recv_err       {}", yn(self.recv_err))?;
        match &self.io_uring_off_reason {
            Some(why) => writeln!(f, "send backend   system calls ({why})")?,
            None => writeln!(f, "send backend   {}", if self.io_uring { "io_uring" } else { "system calls" })?,
        }
        writeln!(f, "send buffer    {} B", self.send_buffer)?;
        write!(f, "recv buffer    {} B", self.recv_buffer)
    }
}

/// First back-off after the kernel refused GSO towards a destination; it doubles with every
/// refusal after a retry, up to [`GSO_RETRY_MAX`].
pub const GSO_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest GSO refusal back-off.
pub const GSO_RETRY_MAX: Duration = Duration::from_secs(300);
/// Destinations remembered with a GSO refusal; past this many at once, the whole socket
/// backs off.
pub const MAX_REFUSED_DESTINATIONS: usize = 64;

/// One GSO refusal back-off: for a destination, or (no `ip`) the whole socket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal {
    ip: Option<IpAddr>,
    until: Instant,
    backoff: Duration,
}

impl Refusal {
    fn renew(&mut self, now: Instant) {
        self.backoff = (self.backoff * 2).min(GSO_RETRY_MAX);
        self.until = now + self.backoff;
    }
}

/// Where the kernel refused GSO (EIO from a device or tunnel that cannot segment, EINVAL
/// without UDP checksum offload or with SO_NO_CHECK). These conditions belong to a route, not
/// to the socket, so one bad peer must not cost every other peer its GSO: datagrams to a
/// refused destination go plain until its back-off ends, then GSO is tried again (a refused
/// try is re-sent plain at once, so a retry never loses anything).
#[derive(Debug, Default)]
pub(crate) struct GsoRefusals {
    by_dst: Vec<Refusal>,
    socket_wide: Option<Refusal>,
    last_reason: Option<String>,
}

impl GsoRefusals {
    /// Whether GSO towards `ip` is in back-off at `now`.
    fn refused(&self, ip: IpAddr, now: Instant) -> bool {
        self.socket_wide.is_some_and(|r| now < r.until) || self.by_dst.iter().any(|r| r.ip == Some(ip) && now < r.until)
    }

    /// Records a refusal towards `ip`; returns the back-off it starts.
    fn record(&mut self, ip: IpAddr, now: Instant) -> Duration {
        let fresh = |ip| Refusal { ip, until: now + GSO_RETRY_FIRST, backoff: GSO_RETRY_FIRST };
        if let Some(r) = self.by_dst.iter_mut().find(|r| r.ip == Some(ip)) {
            r.renew(now);
            return r.backoff;
        }
        if self.by_dst.len() >= MAX_REFUSED_DESTINATIONS {
            // Make room from an entry whose back-off ended; else the socket backs off whole.
            if let Some(i) = self.by_dst.iter().position(|r| now >= r.until) {
                self.by_dst.swap_remove(i);
            } else {
                let r = self.socket_wide.get_or_insert(fresh(None));
                r.renew(now);
                return r.backoff;
            }
        }
        self.by_dst.push(fresh(Some(ip)));
        GSO_RETRY_FIRST
    }

    fn active(&self, now: Instant) -> usize {
        self.by_dst.iter().filter(|r| now < r.until).count()
    }
}

/// The mutable, run-time part of a socket's capabilities.
#[derive(Debug)]
#[allow(clippy::struct_excessive_bools)] // reason: independent yes/no facts, one per socket option, fixed at creation
pub(crate) struct CapState {
    /// The send mode segments and the kernel has GSO (fixed at creation).
    pub gso: AtomicBool,
    pub gso_max_segments: AtomicUsize,
    /// `CLOCK_MONOTONIC` ns until which some GSO refusal back-off is in force (0: none ever).
    /// Outside a back-off a transmit checks this and takes no lock.
    pub gso_refused_until_ns: AtomicU64,
    pub gso_refusals: Mutex<GsoRefusals>,
    pub gro: bool,
    pub txtime: bool,
    pub txtime_clock: crate::TxClock,
    pub pktinfo: bool,
    pub ecn: bool,
    pub rxq_ovfl: bool,
    pub rx_time: bool,
    pub recv_err: bool,
    pub zerocopy: AtomicBool,
    pub zerocopy_off_reason: OnceLock<String>,
    pub kernel: KernelCaps,
}

impl CapState {
    /// Whether the socket segments at all now (no socket-wide refusal back-off).
    pub(crate) fn gso_enabled(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
            && (!self.in_refusal_backoff() || self.refusals().socket_wide.map_or(true, |r| Instant::now() >= r.until))
    }

    /// Whether any GSO refusal back-off may be in force now (lock-free; false outside one).
    fn in_refusal_backoff(&self) -> bool {
        let until = self.gso_refused_until_ns.load(Ordering::Relaxed);
        until != 0 && crate::sys::monotonic_ns() < until
    }

    /// Whether a transmit to `dst` may be segmented now.
    pub(crate) fn gso_for(&self, dst: &SocketAddr) -> bool {
        if !self.gso.load(Ordering::Relaxed) {
            return false;
        }
        if !self.in_refusal_backoff() {
            return true;
        }
        !self.refusals().refused(crate::sys::addr::unmapped(dst.ip()), Instant::now())
    }

    /// Records that the kernel refused GSO towards `dst` with `errno` (the plain re-send went
    /// through); returns the reason text.
    pub(crate) fn gso_refused(&self, dst: &SocketAddr, errno: i32) -> String {
        let ip = crate::sys::addr::unmapped(dst.ip());
        let mut r = self.refusals();
        let backoff = r.record(ip, Instant::now());
        // Slightly later than the entry's own end, never earlier: the fast path only skips the
        // lock when no back-off can be in force.
        let until = crate::sys::monotonic_ns().saturating_add(backoff.as_nanos() as u64 + 1_000_000);
        self.gso_refused_until_ns.fetch_max(until, Ordering::Relaxed);
        let cause = match errno {
            libc::EIO => "the route's device or a tunnel/IPsec transform cannot segment UDP",
            libc::EINVAL => "no UDP checksum offload on the route's device, or SO_NO_CHECK on the socket",
            _ => "the path refused segmentation",
        };
        let why = format!(
            "the kernel refused a GSO send to {ip} with {} ({cause}); the refused batch was re-sent as plain \
             datagrams, and datagrams to {ip} go plain for {backoff:?} before GSO is tried again",
            io::Error::from_raw_os_error(errno)
        );
        r.last_reason = Some(why.clone());
        why
    }

    /// (destinations in back-off now, the last refusal's reason).
    pub(crate) fn refusal_summary(&self) -> (usize, Option<String>) {
        let r = self.refusals();
        (r.active(Instant::now()), r.last_reason.clone())
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, GsoRefusals> {
        self.gso_refusals.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn max_segments(&self) -> usize {
        self.gso_max_segments.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_back_off_per_destination_then_socket_wide_when_full() {
        let mut r = GsoRefusals::default();
        let t0 = Instant::now();
        let ip = |i: u32| IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i));
        assert_eq!(r.record(ip(0), t0), GSO_RETRY_FIRST);
        assert!(r.refused(ip(0), t0) && !r.refused(ip(1), t0));
        assert!(!r.refused(ip(0), t0 + GSO_RETRY_FIRST), "retried when the back-off ends");
        assert_eq!(r.record(ip(0), t0), GSO_RETRY_FIRST * 2, "a refused retry doubles it");
        for _ in 0..20 {
            r.record(ip(0), t0);
        }
        assert_eq!(r.record(ip(0), t0), GSO_RETRY_MAX, "bounded");
        for i in 1..MAX_REFUSED_DESTINATIONS as u32 {
            r.record(ip(i), t0);
        }
        assert_eq!(r.active(t0), MAX_REFUSED_DESTINATIONS);
        assert!(r.socket_wide.is_none());
        // One more, none expired: the whole socket backs off rather than forget anyone.
        r.record(ip(999), t0);
        assert!(r.refused(ip(12345), t0), "socket-wide back-off covers every destination");
        // Later, with expired entries, a new destination takes an expired slot.
        let later = t0 + GSO_RETRY_MAX + Duration::from_secs(1);
        r.record(ip(1000), later);
        assert!(r.refused(ip(1000), later) && !r.refused(ip(12345), later));
        assert_eq!(r.by_dst.len(), MAX_REFUSED_DESTINATIONS);
    }
}
