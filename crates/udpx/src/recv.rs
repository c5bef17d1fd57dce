//! Receiving: [`RecvMeta`], GRO segment iteration, and the receive call.
//!
//! With `UDP_GRO` one message may hold several datagrams of the same flow, back to back, each
//! `stride` bytes long but the last, which may be shorter:
//!
//! ```text
//!  buf: ├── stride ──┼── stride ──┼── stride ──┼─ last ─┤
//!       ◄──────────────────────── len ─────────────────►
//! ```

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::error::Error;
use crate::socket::UdpSocket;
use crate::sys::mmsg::{OwnedSlots, RawRecv, RecvScratch, BATCH};
use crate::transmit::EcnCodepoint;

/// Receive buffer size that no GRO super-buffer can exceed (the GRO layer stops merging
/// before 64 KiB of IP packet).
pub const GRO_BUFFER: usize = 65_536;

/// What arrived in one receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// The sender.
    pub addr: SocketAddr,
    /// Bytes written to the buffer.
    pub len: usize,
    /// Size of each datagram in the buffer (the last may be shorter). Equal to `len` for a
    /// single datagram.
    pub stride: usize,
    /// ECN codepoint (needs [`SocketConfig::ecn`](crate::SocketConfig::ecn)).
    pub ecn: Option<EcnCodepoint>,
    /// The local address the datagram was sent to (needs pktinfo): reply from it.
    pub dst_ip: Option<IpAddr>,
    /// Interface it arrived on (needs pktinfo; 0 when unknown).
    pub ifindex: u32,
    /// The kernel's count of datagrams dropped on this socket so far (SO_RXQ_OVFL). The
    /// kernel only attaches it once non-zero, so `None` with the option on means none.
    pub kernel_drops: Option<u32>,
    /// When the kernel received it (needs [`SocketConfig::rx_time`](crate::SocketConfig::rx_time)):
    /// `CLOCK_REALTIME` as time since the Unix epoch. For a GRO buffer, the first datagram's.
    pub rx_time: Option<std::time::Duration>,
    /// The datagram was longer than the buffer and was cut (MSG_TRUNC): the tail is lost.
    pub truncated: bool,
    /// The kernel had more control data than fit (MSG_CTRUNC): some metadata above may be
    /// missing. On a GRO socket whose segment size was lost this way the datagram boundaries
    /// are unknown: `stride` is 0 and [`RecvMeta::segments`] yields nothing rather than guess
    /// (the bytes are still in the buffer, `len` long). Counted in `control_truncated`.
    pub control_truncated: bool,
}

impl Default for RecvMeta {
    fn default() -> Self {
        RecvMeta {
            addr: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            len: 0,
            stride: 0,
            ecn: None,
            dst_ip: None,
            ifindex: 0,
            kernel_drops: None,
            rx_time: None,
            truncated: false,
            control_truncated: false,
        }
    }
}

impl RecvMeta {
    /// Datagrams in the buffer: at least 1 (a zero-length datagram is one), except 0 when
    /// the boundaries are unknown (see [`RecvMeta::control_truncated`]).
    pub fn segment_count(&self) -> usize {
        if self.boundaries_unknown() {
            0
        } else if self.len == 0 || self.stride == 0 {
            1
        } else {
            self.len.div_ceil(self.stride)
        }
    }

    /// The datagrams of the buffer `buf` this metadata describes (none when the boundaries
    /// are unknown).
    pub fn segments<'b>(&self, buf: &'b [u8]) -> Segments<'b> {
        if self.boundaries_unknown() {
            return Segments { data: &[], stride: 1, empty_pending: false };
        }
        let data = &buf[..self.len.min(buf.len())];
        let stride = if self.stride == 0 { data.len().max(1) } else { self.stride };
        Segments { data, stride, empty_pending: data.is_empty() }
    }

    fn boundaries_unknown(&self) -> bool {
        self.control_truncated && self.stride == 0 && self.len > 0
    }

    /// `gro_on`: the socket has UDP_GRO, so a buffer may hold several datagrams whose size
    /// only the (possibly cut) control data tells.
    pub(crate) fn from_raw(r: &RawRecv, fallback_addr: SocketAddr, gro_on: bool) -> Self {
        let truncated = r.flags & libc::MSG_TRUNC != 0;
        let control_truncated = r.flags & libc::MSG_CTRUNC != 0;
        let stride = match r.gro.map(usize::from) {
            Some(s) if s > 0 && s < r.len => s,
            Some(_) => r.len,
            // Without the GRO size a buffer is one datagram, unless the control data was cut
            // on a GRO socket: then nobody knows, and guessing would hand out wrong datagrams.
            None if control_truncated && gro_on => 0,
            None => r.len,
        };
        RecvMeta {
            addr: r.addr.unwrap_or(fallback_addr),
            len: r.len,
            stride,
            ecn: r.tos.and_then(EcnCodepoint::from_bits),
            dst_ip: r.dst_ip,
            ifindex: r.ifindex,
            kernel_drops: r.drops,
            rx_time: r.rx_time,
            truncated,
            control_truncated,
        }
    }
}

/// Iterator over the datagrams of a (possibly GRO-coalesced) buffer.
#[derive(Debug, Clone)]
pub struct Segments<'b> {
    data: &'b [u8],
    stride: usize,
    empty_pending: bool,
}

impl<'b> Iterator for Segments<'b> {
    type Item = &'b [u8];
    fn next(&mut self) -> Option<&'b [u8]> {
        if self.data.is_empty() {
            return std::mem::take(&mut self.empty_pending).then_some(self.data);
        }
        let n = self.stride.min(self.data.len());
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        Some(head)
    }
}

/// Caller-owned receive space: `count` buffers of `size` bytes, their metadata, and the
/// message vectors of one call, all set up once. [`UdpSocket::recv_into`] and
/// [`UdpSocket::try_recv_into`] fill it without locking anything or allocating, and lend the
/// received data out of it ([`RecvBuffers::messages`], [`RecvBuffers::datagrams`]). Keep one
/// per receiving thread or event loop.
pub struct RecvBuffers {
    slots: OwnedSlots,
    scratch: Box<RecvScratch>,
    metas: Box<[RecvMeta]>,
    got: usize,
}

impl std::fmt::Debug for RecvBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBuffers")
            .field("count", &self.slots.count())
            .field("size", &self.slots.size())
            .field("received", &self.got)
            .finish()
    }
}

impl RecvBuffers {
    /// `count` buffers (1 to 64: one system call fills at most 64) of `size` bytes each. A
    /// socket with GRO needs [`GRO_BUFFER`]-byte buffers; without GRO a buffer smaller than a
    /// datagram cuts it (reported as `truncated`).
    pub fn new(count: usize, size: usize) -> Self {
        let count = count.clamp(1, BATCH);
        RecvBuffers {
            slots: OwnedSlots::new(count, size.max(1)),
            scratch: RecvScratch::new(),
            metas: vec![RecvMeta::default(); count].into_boxed_slice(),
            got: 0,
        }
    }

    /// `count` buffers of the size `socket` needs: [`GRO_BUFFER`] with GRO, else the largest
    /// datagram of its family.
    pub fn for_socket(socket: &UdpSocket, count: usize) -> Self {
        let size = if socket.caps.gro { GRO_BUFFER } else { crate::transmit::MAX_PAYLOAD_V6 };
        Self::new(count, size)
    }

    /// Messages one receive can return: the number of buffers.
    pub fn capacity(&self) -> usize {
        self.slots.count()
    }

    /// Messages the last receive returned (a GRO buffer is one message).
    pub fn len(&self) -> usize {
        self.got
    }

    /// The last receive returned nothing (or none happened yet).
    pub fn is_empty(&self) -> bool {
        self.got == 0
    }

    /// Message `i` of the last receive: its metadata and its bytes. Panics past [`len`](Self::len).
    pub fn message(&self, i: usize) -> (&RecvMeta, &[u8]) {
        assert!(i < self.got, "message {i} of {}", self.got);
        let m = &self.metas[i];
        (m, &self.slots.slot(i)[..m.len.min(self.slots.size())])
    }

    /// Message `i`, writable (to turn a request into its reply in place).
    pub fn message_mut(&mut self, i: usize) -> (&RecvMeta, &mut [u8]) {
        assert!(i < self.got, "message {i} of {}", self.got);
        let m = &self.metas[i];
        let len = m.len.min(self.slots.size());
        (m, &mut self.slots.slot_mut(i)[..len])
    }

    /// The messages of the last receive.
    pub fn messages(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        (0..self.got).map(|i| self.message(i))
    }

    /// The datagrams of the last receive, GRO buffers split (see [`RecvMeta::segments`]).
    pub fn datagrams(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        self.messages().flat_map(|(m, b)| m.segments(b).map(move |d| (m, d)))
    }
}

impl UdpSocket {
    /// Receives up to `bufs.len()` messages (one `recvmmsg`, or one `recvmsg` in
    /// [`RecvMode::Recvmsg`](crate::RecvMode::Recvmsg)), filling `meta` for each.
    ///
    /// Blocks for the first message on a blocking socket (bounded by
    /// [`set_read_timeout`](UdpSocket::set_read_timeout)); returns `WouldBlock` when nothing is
    /// queued on a non-blocking one. With GRO on, every buffer must hold [`GRO_BUFFER`] bytes,
    /// or the call fails with [`Error::RecvBufferTooSmall`] (as `InvalidInput`). Uses the
    /// socket's own scratch space behind a lock; [`UdpSocket::recv_into`] takes the caller's.
    pub fn recv(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        if let Some(b) = bufs.iter().find(|b| self.caps.gro && b.len() < GRO_BUFFER) {
            return Err(Error::RecvBufferTooSmall { len: b.len(), need: GRO_BUFFER }.into());
        }
        let n = bufs.len().min(meta.len()).min(BATCH);
        let mut scratch = self.recv_scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.recv_with(&mut scratch, &mut meta[..n], 0, |s, mmsg, ctrl, flags| {
            s.recv(self.fd_ref(), &mut bufs[..n], mmsg, ctrl, flags)
        })
    }

    /// Receives into `bufs` as [`UdpSocket::recv`] does (blocking as the socket is set up),
    /// without any lock or allocation: the caller owns the buffers and the scratch space.
    pub fn recv_into(&self, bufs: &mut RecvBuffers) -> io::Result<usize> {
        self.recv_owned(bufs, 0)
    }

    /// Receives into `bufs` and never waits: `WouldBlock` when nothing is queued, whatever the
    /// socket's blocking mode (`MSG_DONTWAIT`). For event loops.
    pub fn try_recv_into(&self, bufs: &mut RecvBuffers) -> io::Result<usize> {
        self.recv_owned(bufs, libc::MSG_DONTWAIT)
    }

    fn recv_owned(&self, bufs: &mut RecvBuffers, flags: libc::c_int) -> io::Result<usize> {
        bufs.got = 0;
        if self.caps.gro && bufs.slots.size() < GRO_BUFFER {
            return Err(Error::RecvBufferTooSmall { len: bufs.slots.size(), need: GRO_BUFFER }.into());
        }
        let RecvBuffers { slots, scratch, metas, .. } = bufs;
        let got = self.recv_with(scratch, metas, flags, |s, mmsg, ctrl, flags| {
            s.recv_iovs(self.fd_ref(), slots.iovs(), mmsg, ctrl, flags)
        })?;
        bufs.got = got;
        Ok(got)
    }

    /// The receive path: one call (retried after draining a pending ICMP error on an
    /// unconnected socket), the metadata decoded into `meta`, the counters.
    fn recv_with(
        &self,
        scratch: &mut RecvScratch,
        meta: &mut [RecvMeta],
        flags: libc::c_int,
        mut call: impl FnMut(&mut RecvScratch, bool, usize, libc::c_int) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let fallback = self.peer.unwrap_or(self.local);
        let c = &self.counters;
        let mmsg = self.recv_mode == crate::RecvMode::Recvmmsg;
        // Control space only for the control messages this socket asked for: none means no
        // per-call control work, and one datagram per call then goes by recvfrom(2).
        let caps = &self.caps;
        let wants_control = caps.gro || caps.pktinfo || caps.ecn || caps.rxq_ovfl || caps.rx_time;
        let ctrl = if wants_control { self.faults.recv_control_len() } else { 0 };
        let mut retries = 0;
        let got = loop {
            match call(scratch, mmsg, ctrl, flags) {
                Ok(got) => break got,
                // A pending error left by an ICMP error about some earlier datagram
                // (IP_RECVERR): nothing was received; read the queue and receive again, up to
                // the flood budget (see crate::icmp).
                Err(e) if e.raw_os_error().is_some_and(|errno| self.icmp_pending(errno)) => {
                    if !self.icmp_recv_retry(&mut retries) {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let (mut dgrams, mut bytes, mut gro, mut trunc, mut drops, mut ctrunc) = (0, 0, 0, 0, 0, 0);
        for (m, r) in meta.iter_mut().zip(scratch.results(got)) {
            *m = RecvMeta::from_raw(r, fallback, self.caps.gro);
            ctrunc += m.control_truncated as u64;
            let segs = m.segment_count() as u64;
            dgrams += segs;
            bytes += m.len as u64;
            gro += (segs > 1) as u64;
            trunc += m.truncated as u64;
            drops = drops.max(m.kernel_drops.unwrap_or(0) as u64);
        }
        c.add(&c.recv_calls, 1);
        c.add(&c.messages_received, got as u64);
        c.add(&c.datagrams_received, dgrams);
        c.add(&c.bytes_received, bytes);
        c.add(&c.gro_buffers_received, gro);
        c.add(&c.truncated, trunc);
        if ctrunc > 0 {
            c.add(&c.control_truncated, ctrunc);
            if !self.logged_ctrunc.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!(
                    "udpx: control data cut (MSG_CTRUNC) on {}: an option set outside udpx adds control \
                     messages beyond the {} bytes udpx reserves",
                    self.local,
                    crate::sys::cmsg::CMSG_CAP
                );
            }
        }
        c.max(&c.kernel_drops, drops);
        Ok(got)
    }
}

/// Whether a receive error means the socket itself is unusable: a closed or wrong descriptor,
/// a bad buffer or an invalid argument, that is a bug, never something a datagram or an ICMP
/// message can cause (the library keeps ICMP errors out of receives). A server's loop ends on
/// these and counts every other error, serving on.
pub fn is_unusable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EBADF | libc::EFAULT | libc::ENOTSOCK | libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_socket_is_unusable() {
        for errno in [libc::EBADF, libc::EFAULT, libc::ENOTSOCK, libc::EINVAL] {
            assert!(is_unusable(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        // What the network or a full queue can cause, and errors with no errno.
        for errno in [libc::EAGAIN, libc::EINTR, libc::ECONNREFUSED, libc::EHOSTUNREACH, libc::ENOBUFS, libc::EMSGSIZE]
        {
            assert!(!is_unusable(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        assert!(!is_unusable(&io::Error::other("no errno")));
    }

    fn meta(len: usize, stride: usize) -> RecvMeta {
        RecvMeta { len, stride, ..Default::default() }
    }

    #[test]
    fn gro_split_truth_table() {
        let buf: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        // (len, stride) -> segment lengths
        let cases: &[(usize, usize, &[usize])] = &[
            (0, 0, &[0]),
            (1, 1, &[1]),
            (1200, 1200, &[1200]),
            (3600, 1200, &[1200, 1200, 1200]),
            (3100, 1200, &[1200, 1200, 700]),
            (1201, 1200, &[1200, 1]),
            (5, 1, &[1, 1, 1, 1, 1]),
            (100, 0, &[100]), // no stride reported: one datagram
        ];
        for &(len, stride, want) in cases {
            let m = meta(len, stride);
            let segs: Vec<&[u8]> = m.segments(&buf).collect();
            assert_eq!(segs.iter().map(|s| s.len()).collect::<Vec<_>>(), want, "len {len} stride {stride}");
            assert_eq!(m.segment_count(), want.len());
            // The segments tile the buffer in order.
            let joined: Vec<u8> = segs.concat();
            assert_eq!(&joined[..], &buf[..len]);
        }
    }

    #[test]
    fn raw_to_meta() {
        let from: SocketAddr = "192.0.2.9:53".parse().unwrap();
        let r =
            RawRecv { len: 2400, flags: 0, addr: Some(from), gro: Some(1200), tos: Some(0b11), ..Default::default() };
        let m = RecvMeta::from_raw(&r, from, true);
        assert_eq!((m.stride, m.segment_count(), m.ecn), (1200, 2, Some(EcnCodepoint::Ce)));
        // A GRO size of at least the length means one datagram.
        let r = RawRecv { len: 500, gro: Some(1200), ..r };
        assert_eq!(RecvMeta::from_raw(&r, from, true).stride, 500);
        // MSG_TRUNC is surfaced.
        let r = RawRecv { flags: libc::MSG_TRUNC, ..r };
        assert!(RecvMeta::from_raw(&r, from, true).truncated);
    }

    #[test]
    fn cut_control_data_never_mis_splits() {
        let from: SocketAddr = "192.0.2.9:53".parse().unwrap();
        let buf = [7u8; 4000];
        // (GRO on the socket, GRO size decoded, MSG_CTRUNC) -> datagrams handed out
        let cases: &[(bool, Option<u16>, bool, &[usize])] = &[
            (true, None, true, &[]),                             // boundaries lost: none, not one of 4000
            (true, Some(1000), true, &[1000, 1000, 1000, 1000]), // the GRO size made it; later cmsgs cut
            (false, None, true, &[4000]),                        // no GRO: a buffer is one datagram
            (true, None, false, &[4000]),                        // nothing cut: no GRO size means one
        ];
        for &(gro_on, gro, cut, want) in cases {
            let flags = if cut { libc::MSG_CTRUNC } else { 0 };
            let r = RawRecv { len: 4000, flags, addr: Some(from), gro, ..Default::default() };
            let m = RecvMeta::from_raw(&r, from, gro_on);
            assert_eq!(m.control_truncated, cut);
            let got: Vec<usize> = m.segments(&buf).map(<[u8]>::len).collect();
            assert_eq!(got, want, "gro_on {gro_on} gro {gro:?} cut {cut}");
            assert_eq!(m.segment_count(), want.len());
        }
    }
}
