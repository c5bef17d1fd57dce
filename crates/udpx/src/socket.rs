//! The socket: creation, options, and what it knows about itself.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::caps::{CapState, Capabilities, Feature, KernelCaps, Want};
use crate::counters::{CounterSnapshot, Counters};
use crate::error::Error;
use crate::sys;
use crate::transmit::{Family, SendMode};
use crate::txtime::TxClock;

/// Whether a socket joins a reuseport group, so several sockets share one port and the kernel
/// spreads datagrams over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReusePort {
    /// The port is this socket's alone.
    #[default]
    Disabled,
    /// `SO_REUSEPORT` is set before bind.
    Enabled,
}

/// How a socket receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecvMode {
    /// One `recvmsg` per message.
    Recvmsg,
    /// `recvmmsg`: as many queued messages as buffers given, in one call.
    #[default]
    Recvmmsg,
}

/// How to create a socket. Every field has a sensible default; see [`SocketConfig::new`].
#[derive(Debug, Clone)]
#[non_exhaustive]
#[allow(clippy::struct_excessive_bools)] // reason: independent on/off socket options of the public API, each its own field
pub struct SocketConfig {
    /// Local address to bind (port 0: any). `[::]` gives a dual-stack socket unless `v6_only`.
    pub bind: SocketAddr,
    /// Set `IPV6_V6ONLY` on an IPv6 socket.
    pub v6_only: bool,
    /// Join a reuseport group.
    pub reuse_port: ReusePort,
    /// Connect to this peer after binding (the kernel caches the route; sends to the peer then
    /// skip the per-datagram lookup).
    pub connect: Option<SocketAddr>,
    /// Requested send buffer (SO_SNDBUFFORCE when permitted, else SO_SNDBUF, capped by
    /// `net.core.wmem_max`). The effective size is in [`Capabilities::send_buffer`].
    pub send_buffer: Option<usize>,
    /// Requested receive buffer, likewise.
    pub recv_buffer: Option<usize>,
    /// `O_NONBLOCK`.
    pub nonblocking: bool,
    /// Which system calls and whether to segment (see [`SendMode`]).
    pub send_mode: SendMode,
    /// `recvmsg` or `recvmmsg`.
    pub recv_mode: RecvMode,
    /// Coalesced receive.
    pub gro: Want,
    /// Per-datagram departure times.
    pub txtime: Want,
    /// The clock `SO_TXTIME` is configured with (default [`TxClock::Monotonic`], for fq;
    /// [`TxClock::Tai`] for etf, which needs CAP_NET_ADMIN: without it the option fails with
    /// EPERM, so `txtime` `IfAvailable` leaves departure times off and `Required` fails).
    /// Departures stay [`crate::Timestamp`]s on `CLOCK_MONOTONIC` either way; see
    /// [`crate::txtime`] for the conversion.
    pub txtime_clock: TxClock,
    /// Destination address on receive / source address on send. A control message on every
    /// datagram received: ask for it only where it is read (a wildcard-bound server replying
    /// from the address it was asked on).
    pub pktinfo: Want,
    /// ECN on receive (sending ECN needs nothing); a control message on every datagram.
    pub ecn: Want,
    /// The kernel's drop counter in every receive's metadata, a control message on every
    /// datagram once a drop happened; [`UdpSocket::kernel_drops`] reads the same count without
    /// it.
    pub rxq_ovfl: Want,
    /// The kernel's receive time of each datagram in its metadata ([`RecvMeta::rx_time`],
    /// `SO_TIMESTAMPNS`): a control message on every datagram. For a receiver that reads its
    /// socket later than datagrams arrive (a loop that gathers work) and needs to know when
    /// they came (a round-trip sample).
    ///
    /// [`RecvMeta::rx_time`]: crate::RecvMeta::rx_time
    pub rx_time: Want,
    /// Zerocopy send (`SO_ZEROCOPY`) for [`UdpSocket::send_zerocopy`].
    pub zerocopy: Want,
    /// Zerocopy threshold and in-flight bound.
    pub zerocopy_config: crate::zerocopy::ZcConfig,
    /// `IP_RECVERR`: ICMP errors about datagrams this socket sent are queued on its error
    /// queue (read and counted by udpx, or by [`UdpSocket::drain_errors`]). On by default,
    /// because without it the kernel reports a datagram the egress qdisc dropped as sent
    /// (`udp_send_skb` turns ENOBUFS into success): the drop would be silent. The pending
    /// error it leaves for the next call is drained and retried, never returned to the caller
    /// of an unconnected socket (see [`crate::icmp`]). Turn it off only where the qdisc
    /// cannot drop.
    pub recv_err: bool,
    /// `IP_MTU_DISCOVER = IP_PMTUDISC_PROBE`: set DF, ignore the path MTU cache, so a too-large
    /// datagram is refused with EMSGSIZE rather than fragmented.
    pub pmtu_probe: bool,
    /// Send through io_uring: the messages of each batch as linked `IORING_OP_SENDMSG`
    /// entries, one `io_uring_enter` per batch, with every fallback of the system-call path
    /// (see `sys/uring.rs`). Zerocopy sends go as `IORING_OP_SENDMSG_ZC` entries whose
    /// notifications (on the ring, not the error queue) return the buffers, copies detected
    /// as on the system-call path; without that opcode, by system calls. Where io_uring is
    /// unavailable, `IfAvailable` stays on system calls and says why in
    /// [`Capabilities::io_uring_off_reason`]. Default off. Needs the `io-uring` feature (on by
    /// default).
    pub io_uring: Want,
}

impl SocketConfig {
    /// Defaults: blocking, GSO with sendmmsg, recvmmsg, IP_RECVERR and PMTU probe mode on; GRO,
    /// txtime and every per-datagram receive control message (pktinfo, ECN, drop counter, receive time)
    /// off:
    /// each costs the receiver on every datagram (`__sock_recv_cmsgs` and `put_cmsg` were 14 %
    /// of a receiver's CPU here), so a socket asks for what it reads. The receive buffer is
    /// the kernel's default unless set; [`crate::rcvbuf`] sizes it from the expected burst.
    pub fn new(bind: SocketAddr) -> Self {
        SocketConfig {
            bind,
            v6_only: false,
            reuse_port: ReusePort::Disabled,
            connect: None,
            send_buffer: None,
            recv_buffer: None,
            nonblocking: false,
            send_mode: SendMode::GsoSendmmsg,
            recv_mode: RecvMode::Recvmmsg,
            gro: Want::Off,
            txtime: Want::Off,
            txtime_clock: TxClock::Monotonic,
            pktinfo: Want::Off,
            ecn: Want::Off,
            rxq_ovfl: Want::Off,
            rx_time: Want::Off,
            zerocopy: Want::Off,
            zerocopy_config: crate::zerocopy::ZcConfig::default(),
            recv_err: true,
            pmtu_probe: true,
            io_uring: Want::Off,
        }
    }

    /// Sets [`SocketConfig::io_uring`].
    pub fn io_uring(mut self, w: Want) -> Self {
        self.io_uring = w;
        self
    }

    /// Sets [`SocketConfig::send_mode`].
    pub fn send_mode(mut self, m: SendMode) -> Self {
        self.send_mode = m;
        self
    }
    /// Sets [`SocketConfig::recv_mode`].
    pub fn recv_mode(mut self, m: RecvMode) -> Self {
        self.recv_mode = m;
        self
    }
    /// Sets [`SocketConfig::gro`].
    pub fn gro(mut self, w: Want) -> Self {
        self.gro = w;
        self
    }
    /// Sets [`SocketConfig::txtime`].
    pub fn txtime(mut self, w: Want) -> Self {
        self.txtime = w;
        self
    }
    /// Sets [`SocketConfig::txtime_clock`].
    pub fn txtime_clock(mut self, c: TxClock) -> Self {
        self.txtime_clock = c;
        self
    }
    /// Sets [`SocketConfig::pktinfo`].
    pub fn pktinfo(mut self, w: Want) -> Self {
        self.pktinfo = w;
        self
    }
    /// Sets [`SocketConfig::ecn`].
    pub fn ecn(mut self, w: Want) -> Self {
        self.ecn = w;
        self
    }
    /// Sets [`SocketConfig::rxq_ovfl`].
    pub fn rxq_ovfl(mut self, w: Want) -> Self {
        self.rxq_ovfl = w;
        self
    }
    /// Sets [`SocketConfig::rx_time`].
    pub fn rx_time(mut self, w: Want) -> Self {
        self.rx_time = w;
        self
    }
    /// Sets [`SocketConfig::zerocopy`].
    pub fn zerocopy(mut self, w: Want) -> Self {
        self.zerocopy = w;
        self
    }
    /// Sets the zerocopy threshold: sends of at least this many bytes use MSG_ZEROCOPY. Must be
    /// 1 to 65,527 (checked at bind).
    pub fn zerocopy_threshold(mut self, bytes: usize) -> Self {
        self.zerocopy_config.threshold = bytes;
        self
    }
    /// Sets the whole zerocopy configuration.
    pub fn zerocopy_config(mut self, c: crate::zerocopy::ZcConfig) -> Self {
        self.zerocopy_config = c;
        self
    }
    /// Sets [`SocketConfig::connect`].
    pub fn connect(mut self, peer: SocketAddr) -> Self {
        self.connect = Some(peer);
        self
    }
    /// Sets [`SocketConfig::reuse_port`].
    pub fn reuse_port(mut self, r: ReusePort) -> Self {
        self.reuse_port = r;
        self
    }
    /// Sets both buffer sizes.
    pub fn buffers(mut self, send: usize, recv: usize) -> Self {
        self.send_buffer = Some(send);
        self.recv_buffer = Some(recv);
        self
    }
    /// Sets [`SocketConfig::send_buffer`].
    pub fn send_buffer(mut self, n: usize) -> Self {
        self.send_buffer = Some(n);
        self
    }
    /// Sets [`SocketConfig::recv_buffer`].
    pub fn recv_buffer(mut self, n: usize) -> Self {
        self.recv_buffer = Some(n);
        self
    }
    /// Sets [`SocketConfig::nonblocking`].
    pub fn nonblocking(mut self, on: bool) -> Self {
        self.nonblocking = on;
        self
    }
    /// Sets [`SocketConfig::recv_err`].
    pub fn recv_err(mut self, on: bool) -> Self {
        self.recv_err = on;
        self
    }
    /// Sets [`SocketConfig::v6_only`].
    pub fn v6_only(mut self, on: bool) -> Self {
        self.v6_only = on;
        self
    }

    /// Creates, configures and binds the socket.
    pub fn bind(self) -> Result<UdpSocket, Error> {
        UdpSocket::bind_with(self)
    }
}

/// A UDP socket with batched, segmented send and coalesced receive.
///
/// All methods take `&self`: one socket may be shared by a sending and a receiving thread.
/// Send and receive each serialize on their own internal scratch space.
pub struct UdpSocket {
    pub(crate) fd: OwnedFd,
    pub(crate) family: Family,
    pub(crate) local: SocketAddr,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) send_mode: SendMode,
    pub(crate) recv_mode: RecvMode,
    pub(crate) caps: CapState,
    pub(crate) counters: Counters,
    pub(crate) faults: sys::fault::Faults,
    /// Scratch for the blocking [`UdpSocket::send`] and zerocopy sends (lock order: this, then
    /// the zerocopy state).
    pub(crate) send_scratch: Mutex<crate::transmit::SendBuffers>,
    pub(crate) recv_scratch: Mutex<Box<sys::mmsg::RecvScratch>>,
    pub(crate) logged_gso_off: AtomicBool,
    pub(crate) logged_ctrunc: AtomicBool,
    pub(crate) zc: Option<Mutex<crate::zerocopy::ZcState>>,
    /// ICMP errors kept for `drain_errors` and the top list of their senders.
    pub(crate) icmp_log: Mutex<crate::icmp::log::IcmpLog>,
    path_mtu: OnceLock<Option<usize>>,
    /// Sends go through io_uring.
    pub(crate) uring: bool,
    /// Why io_uring was asked for and not used.
    pub(crate) uring_off_reason: Option<String>,
    /// O_NONBLOCK as last set through udpx (io_uring entries then carry MSG_DONTWAIT).
    pub(crate) nonblocking: AtomicBool,
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        self.settle_zerocopy();
    }
}

impl fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpSocket")
            .field("fd", &self.fd.as_raw_fd())
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("send_mode", &self.send_mode)
            .finish_non_exhaustive()
    }
}

fn io_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let op = op.into();
    move |source| Error::Io { op, source }
}

/// Whether sends go through io_uring, and why not when asked for and unavailable.
fn uring_backend(want: Want) -> Result<(bool, Option<String>), Error> {
    if !want.wanted() {
        return Ok((false, None));
    }
    match crate::caps::io_uring_available() {
        Ok(()) => Ok((true, None)),
        Err(why) if want == Want::Required => Err(Error::Unsupported { feature: Feature::IoUring, why }),
        Err(why) => {
            log::debug!("udpx: {why}; sending with system calls");
            Ok((false, Some(why)))
        }
    }
}

/// Applies an optional feature: `Off` does nothing; otherwise try `set`, and a failure is an
/// error only when `Required`.
fn apply(want: Want, feature: Feature, set: impl FnOnce() -> io::Result<()>) -> Result<bool, Error> {
    if !want.wanted() {
        return Ok(false);
    }
    match set() {
        Ok(()) => Ok(true),
        Err(e) if want == Want::Required => Err(Error::Unsupported { feature, why: e.to_string() }),
        Err(e) => {
            log::debug!("udpx: {feature} not available: {e}");
            Ok(false)
        }
    }
}

impl UdpSocket {
    /// A socket with default settings bound to `addr` (see [`SocketConfig::new`]).
    pub fn bind(addr: SocketAddr) -> Result<UdpSocket, Error> {
        SocketConfig::new(addr).bind()
    }

    /// Starts a configuration.
    pub fn builder(addr: SocketAddr) -> SocketConfig {
        SocketConfig::new(addr)
    }

    fn bind_with(cfg: SocketConfig) -> Result<UdpSocket, Error> {
        let v6 = cfg.bind.is_ipv6();
        let fd = sys::udp_socket(v6).map_err(io_err("socket"))?;
        let b = fd.as_fd();
        if v6 {
            sys::setsockopt(b, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, cfg.v6_only as libc::c_int)
                .map_err(io_err("setsockopt IPV6_V6ONLY"))?;
        }
        if cfg.reuse_port == ReusePort::Enabled {
            sys::setsockopt(b, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1 as libc::c_int)
                .map_err(io_err("setsockopt SO_REUSEPORT"))?;
        }
        if let Some(n) = cfg.send_buffer {
            set_buffer(b, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, n).map_err(io_err("set send buffer"))?;
        }
        if let Some(n) = cfg.recv_buffer {
            set_buffer(b, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, n).map_err(io_err("set receive buffer"))?;
        }
        sys::bind(b, &cfg.bind).map_err(io_err(format!("bind {}", cfg.bind)))?;
        let local = sys::local_or_peer(b, false).map_err(io_err("getsockname"))?.unwrap_or(cfg.bind);
        let family = if !v6 {
            Family::V4
        } else if cfg.v6_only || !matches!(cfg.bind.ip(), IpAddr::V6(ip) if ip.is_unspecified()) {
            Family::V6Only
        } else {
            Family::DualStack
        };
        let sock = Self::finish(fd, family, local, cfg.send_mode, cfg.recv_mode, &cfg)?;
        if let Some(peer) = cfg.connect {
            if !family.reaches(&peer) {
                return Err(Error::Config(format!(
                    "cannot connect a {} socket to {peer}: bind an address of the peer's family",
                    family.name()
                )));
            }
            sys::connect(sock.fd.as_fd(), &sys::addr::map_for_socket(&peer, family.is_v6()))
                .map_err(io_err(format!("connect {peer}")))?;
            let mut sock = sock;
            sock.peer = Some(peer);
            return Ok(sock);
        }
        Ok(sock)
    }

    /// Adopts an existing UDP socket (for example a `std::net::UdpSocket` or one inherited
    /// from a supervisor). The descriptor is duplicated, so the caller's handle stays valid and
    /// both refer to the same kernel socket. Options in `cfg` other than `bind`, `connect`,
    /// `v6_only` and `reuse_port` (which are fixed once a socket is bound) are applied.
    pub fn adopt(socket: impl AsFd, cfg: SocketConfig) -> Result<UdpSocket, Error> {
        let fd = socket.as_fd().try_clone_to_owned().map_err(io_err("dup"))?;
        let b = fd.as_fd();
        let ty = sys::getsockopt_int(b, libc::SOL_SOCKET, libc::SO_TYPE).map_err(io_err("getsockopt SO_TYPE"))?;
        let proto =
            sys::getsockopt_int(b, libc::SOL_SOCKET, libc::SO_PROTOCOL).map_err(io_err("getsockopt SO_PROTOCOL"))?;
        if ty != libc::SOCK_DGRAM || proto != libc::IPPROTO_UDP {
            return Err(Error::Config("the descriptor is not a UDP socket".into()));
        }
        let local = sys::local_or_peer(b, false)
            .map_err(io_err("getsockname"))?
            .ok_or_else(|| Error::Config("the socket has no IPv4/IPv6 local address: bind it first".into()))?;
        let domain =
            sys::getsockopt_int(b, libc::SOL_SOCKET, libc::SO_DOMAIN).map_err(io_err("getsockopt SO_DOMAIN"))?;
        let family = if domain == libc::AF_INET {
            Family::V4
        } else {
            let v6only = sys::getsockopt_int(b, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap_or(1) != 0;
            if v6only || !matches!(local.ip(), IpAddr::V6(ip) if ip.is_unspecified()) {
                Family::V6Only
            } else {
                Family::DualStack
            }
        };
        if let Some(n) = cfg.send_buffer {
            set_buffer(b, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, n).map_err(io_err("set send buffer"))?;
        }
        if let Some(n) = cfg.recv_buffer {
            set_buffer(b, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, n).map_err(io_err("set receive buffer"))?;
        }
        // A socket-wide UDP_SEGMENT would segment every plain send udpx makes (udpx attaches
        // the segment size per message, as a control message): clear it, and say so.
        if let Ok(seg) = sys::getsockopt_int(b, sys::SOL_UDP, sys::UDP_SEGMENT) {
            if seg > 0 {
                sys::setsockopt(b, sys::SOL_UDP, sys::UDP_SEGMENT, 0 as libc::c_int)
                    .map_err(io_err("clear the adopted socket's UDP_SEGMENT"))?;
                log::warn!(
                    "udpx: adopted socket had UDP_SEGMENT {seg} set socket-wide; cleared (udpx segments per message)"
                );
            }
        }
        let peer = sys::local_or_peer(b, true).map_err(io_err("getpeername"))?;
        let mut sock = Self::finish(fd, family, local, cfg.send_mode, cfg.recv_mode, &cfg)?;
        sock.peer = peer;
        Ok(sock)
    }

    /// Sets the per-socket options shared by `bind` and `adopt`, probes, and assembles.
    fn finish(
        fd: OwnedFd,
        family: Family,
        local: SocketAddr,
        send_mode: SendMode,
        recv_mode: RecvMode,
        cfg: &SocketConfig,
    ) -> Result<UdpSocket, Error> {
        let b = fd.as_fd();
        let v6 = family.is_v6();
        let dual = family == Family::DualStack;
        let int = |level, name, v: libc::c_int| sys::setsockopt(b, level, name, v);
        // Both IP levels on a dual-stack socket: its IPv4 traffic takes the IPv4 paths.
        let both = |l4: (libc::c_int, libc::c_int), l6: (libc::c_int, libc::c_int), v| -> io::Result<()> {
            if v6 {
                int(libc::IPPROTO_IPV6, l6.1, v)?;
                if dual {
                    int(libc::IPPROTO_IP, l4.1, v)?;
                }
                Ok(())
            } else {
                int(libc::IPPROTO_IP, l4.1, v)
            }
        };
        if cfg.pmtu_probe {
            both((0, libc::IP_MTU_DISCOVER), (0, libc::IPV6_MTU_DISCOVER), libc::IP_PMTUDISC_PROBE)
                .map_err(io_err("setsockopt IP_MTU_DISCOVER"))?;
        }
        // Set either way: an adopted socket may come with it on.
        both((0, libc::IP_RECVERR), (0, libc::IPV6_RECVERR), cfg.recv_err as libc::c_int)
            .map_err(io_err("setsockopt IP_RECVERR"))?;
        let pktinfo =
            apply(cfg.pktinfo, Feature::PktInfo, || both((0, libc::IP_PKTINFO), (0, libc::IPV6_RECVPKTINFO), 1))?;
        let ecn = apply(cfg.ecn, Feature::Ecn, || both((0, libc::IP_RECVTOS), (0, libc::IPV6_RECVTCLASS), 1))?;
        let rxq_ovfl = apply(cfg.rxq_ovfl, Feature::RxqOvfl, || int(libc::SOL_SOCKET, sys::SO_RXQ_OVFL, 1))?;
        let rx_time = apply(cfg.rx_time, Feature::RxTime, || int(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1))?;
        if !rx_time {
            // Off either way: an adopted socket may come with it on, and its control message
            // would then cut the others' space (MSG_CTRUNC) on a socket that asked for none.
            let _ = int(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 0);
        }
        let gro = apply(cfg.gro, Feature::Gro, || int(sys::SOL_UDP, sys::UDP_GRO, 1))?;
        let zc_cfg = cfg.zerocopy_config;
        if cfg.zerocopy.wanted() && !(1..=crate::transmit::MAX_PAYLOAD_V6).contains(&zc_cfg.threshold) {
            return Err(Error::Config(format!(
                "zerocopy threshold {}: give 1 to {} bytes (sends below it are copied)",
                zc_cfg.threshold,
                crate::transmit::MAX_PAYLOAD_V6
            )));
        }
        if cfg.zerocopy.wanted() && zc_cfg.max_inflight == 0 {
            return Err(Error::Config("zerocopy max_inflight 0: allow at least 1 send in flight".into()));
        }
        let zerocopy = apply(cfg.zerocopy, Feature::Zerocopy, || int(libc::SOL_SOCKET, sys::SO_ZEROCOPY, 1))?;
        let txtime = apply(cfg.txtime, Feature::TxTime, || {
            let t = libc::sock_txtime { clockid: cfg.txtime_clock.clockid(), flags: 0 };
            sys::setsockopt(b, libc::SOL_SOCKET, sys::SO_TXTIME, t)
        })?;
        if cfg.nonblocking {
            sys::set_nonblocking(b, true).map_err(io_err("set O_NONBLOCK"))?;
        }
        let (uring, uring_off_reason) = uring_backend(cfg.io_uring)?;
        let kernel = KernelCaps::get();
        let gso = send_mode.segments() && kernel.gso_max_segments.is_some();
        Ok(UdpSocket {
            fd,
            family,
            local,
            peer: None,
            send_mode,
            recv_mode,
            caps: CapState {
                gso: AtomicBool::new(gso),
                gso_max_segments: AtomicUsize::new(kernel.gso_max_segments.unwrap_or(1)),
                gso_refused_until_ns: std::sync::atomic::AtomicU64::new(0),
                gso_refusals: Default::default(),
                gro,
                txtime,
                txtime_clock: cfg.txtime_clock,
                pktinfo,
                ecn,
                rxq_ovfl,
                rx_time,
                recv_err: cfg.recv_err,
                zerocopy: AtomicBool::new(zerocopy),
                zerocopy_off_reason: OnceLock::new(),
                kernel,
            },
            counters: Counters::default(),
            faults: Default::default(),
            send_scratch: Mutex::new(crate::transmit::SendBuffers::new()),
            recv_scratch: Mutex::new(sys::mmsg::RecvScratch::new()),
            logged_gso_off: AtomicBool::new(false),
            logged_ctrunc: AtomicBool::new(false),
            zc: zerocopy.then(|| Mutex::new(crate::zerocopy::ZcState::new(zc_cfg))),
            icmp_log: Mutex::default(),
            path_mtu: OnceLock::new(),
            uring,
            uring_off_reason,
            nonblocking: AtomicBool::new(cfg.nonblocking),
        })
    }

    /// For the send path: `Some(nonblocking)` when this socket sends through io_uring.
    pub(crate) fn uring_send(&self) -> Option<bool> {
        self.uring.then(|| self.nonblocking.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The bound local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The connected peer, if any.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The socket's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The send mode chosen at creation.
    pub fn send_mode(&self) -> SendMode {
        self.send_mode
    }

    /// What this socket has now, including fallbacks taken so far.
    pub fn capabilities(&self) -> Capabilities {
        let b = self.fd.as_fd();
        let buf = |name| sys::getsockopt_int(b, libc::SOL_SOCKET, name).map(|v| v.max(0) as usize).unwrap_or(0);
        let c = &self.caps;
        let (gso_refused_destinations, gso_off_reason) = c.refusal_summary();
        Capabilities {
            gso: c.gso_enabled(),
            gso_max_segments: c.max_segments(),
            gso_refused_destinations,
            gso_off_reason,
            gro: c.gro,
            txtime: c.txtime,
            txtime_clock: c.txtime.then_some(c.txtime_clock),
            zerocopy_available: c.kernel.zerocopy,
            zerocopy: c.zerocopy.load(std::sync::atomic::Ordering::Relaxed),
            zerocopy_off_reason: c.zerocopy_off_reason.get().cloned(),
            pktinfo: c.pktinfo,
            ecn: c.ecn,
            rxq_ovfl: c.rxq_ovfl,
            rx_time: c.rx_time,
            recv_err: c.recv_err,
            send_buffer: buf(libc::SO_SNDBUF),
            recv_buffer: buf(libc::SO_RCVBUF),
            kernel: c.kernel,
            io_uring: self.uring,
            io_uring_off_reason: self.uring_off_reason.clone(),
        }
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }

    /// The path MTU of a connected socket (`IP_MTU` / `IPV6_MTU`), read once; `None` when
    /// unconnected.
    pub fn path_mtu(&self) -> Option<usize> {
        *self.path_mtu.get_or_init(|| {
            let peer = self.peer?;
            let _ = peer;
            // On an AF_INET6 socket IPV6_MTU answers for v4-mapped peers too.
            let (level, name) = if self.family.is_v6() {
                (libc::IPPROTO_IPV6, libc::IPV6_MTU)
            } else {
                (libc::IPPROTO_IP, libc::IP_MTU)
            };
            sys::getsockopt_int(self.fd.as_fd(), level, name).ok().map(|m| m.max(0) as usize)
        })
    }

    /// Bytes the kernel charges to this socket's receive queue now (`SO_MEMINFO`,
    /// `SK_MEMINFO_RMEM_ALLOC`): queued datagrams counted by their truesize, against the
    /// limit in [`Capabilities::recv_buffer`] (see [`crate::rcvbuf`]).
    pub fn queued_bytes(&self) -> io::Result<usize> {
        Ok(sys::meminfo(self.fd.as_fd())?[0] as usize)
    }

    /// Datagrams the kernel has dropped on this socket so far (receive buffer full, checksum
    /// errors), read with `SO_MEMINFO`: no per-datagram control message needed.
    pub fn kernel_drops(&self) -> io::Result<u32> {
        Ok(sys::meminfo(self.fd.as_fd())?[8])
    }

    /// Sets or clears `O_NONBLOCK`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        sys::set_nonblocking(self.fd.as_fd(), on)?;
        self.nonblocking.store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Bounds how long a blocking receive waits (`SO_RCVTIMEO`); after it, `recv` fails with
    /// `WouldBlock`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        sys::set_timeout(self.fd.as_fd(), libc::SO_RCVTIMEO, t)
    }

    /// Bounds how long a blocking send waits for buffer space (`SO_SNDTIMEO`).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        sys::set_timeout(self.fd.as_fd(), libc::SO_SNDTIMEO, t)
    }

    /// Caps the rate at which the kernel sends this socket's packets (`SO_MAX_PACING_RATE`,
    /// bytes per second; `u64::MAX` removes the cap).
    ///
    /// Only the fq qdisc enforces it, and only for a connected socket: fq keeps per-socket
    /// state for sockets in the established state (a connected UDP socket is), while an
    /// unconnected socket's packets are spread over fq flows by hash and paced by none of
    /// them. Packets that carry a departure time are scheduled by that time instead. Under any
    /// other qdisc the kernel stores the value and nothing reads it: check
    /// [`crate::qdisc::egress`] before relying on it.
    pub fn set_max_pacing_rate(&self, bytes_per_sec: u64) -> io::Result<()> {
        // The kernel reads an unsigned long where it is given one (since 5.0), else an int.
        sys::setsockopt(self.fd.as_fd(), libc::SOL_SOCKET, sys::SO_MAX_PACING_RATE, bytes_per_sec)
    }

    /// Sets `SO_NO_CHECK` (no UDP checksum on send). The kernel then refuses GSO sends with
    /// EINVAL: the one real, on-demand way to exercise the GSO fallback on a modern kernel.
    /// Useful for tests; no reason to call it otherwise.
    pub fn set_no_check(&self, on: bool) -> io::Result<()> {
        sys::setsockopt(self.fd.as_fd(), libc::SOL_SOCKET, sys::SO_NO_CHECK, on as libc::c_int)
    }

    /// Queues a fault for a later send call (test builds only, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, fault: crate::Fault) {
        self.faults.push(fault);
    }

    /// Whether the socket's io_uring send ring (if it made one) is quiet: no entry queued,
    /// none in the kernel, no completion unread, as after every send that returned (test
    /// builds only, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn io_uring_send_quiet(&self) -> bool {
        self.send_scratch.lock().unwrap_or_else(|e| e.into_inner()).0.uring_quiet()
    }

    /// Offers the kernel only `len` bytes of control buffer per received message from now on
    /// (0 restores the full buffer), so the kernel cuts control data with MSG_CTRUNC (test
    /// builds only, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn limit_recv_control(&self, len: usize) {
        self.faults.limit_recv_control(len);
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        sys::raw(self.fd.as_fd())
    }
}

/// Sets a buffer size with the `*FORCE` option (root may exceed `net.core.[rw]mem_max`),
/// falling back to the plain option when not permitted.
fn set_buffer(fd: BorrowedFd<'_>, force: libc::c_int, plain: libc::c_int, n: usize) -> io::Result<()> {
    let v = n.min(i32::MAX as usize / 2) as libc::c_int;
    match sys::setsockopt(fd, libc::SOL_SOCKET, force, v) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => sys::setsockopt(fd, libc::SOL_SOCKET, plain, v),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cap is stored on the socket (what fq reads); a 32-bit read sees it too.
    #[test]
    fn max_pacing_rate_is_stored() {
        let peer = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let s = UdpSocket::builder("127.0.0.1:0".parse().unwrap()).connect(peer.local_addr()).bind().unwrap();
        s.set_max_pacing_rate(1_250_000).unwrap();
        let got = sys::getsockopt_int(s.as_fd(), libc::SOL_SOCKET, sys::SO_MAX_PACING_RATE).unwrap();
        assert_eq!(got, 1_250_000);
        s.set_max_pacing_rate(u64::MAX).unwrap();
    }
}
