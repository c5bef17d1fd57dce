//! Message vectors for `sendmmsg(2)` / `recvmmsg(2)` and their one-message forms.
//!
//! Layout of one batch (indices line up; each header points into its neighbours):
//!
//! ```text
//!  hdrs[i]: mmsghdr { msg_hdr: msghdr {
//!               msg_name ──────► names[i]  (sockaddr_storage; null when connected)
//!               msg_iov ───────► iovs[i] ─► caller's payload (send) / buffer (receive)
//!               msg_control ───► ctrl[i]   (CmsgBuf, 8-byte aligned)
//!           }, msg_len }                   (bytes sent / received, written by the kernel)
//! ```
//!
//! From `sendmmsg(2)`: "returns the number of messages sent from msgvec; if this is less than
//! vlen, the caller can retry with a further sendmmsg() call to send the remaining messages.
//! On error, -1 is returned" — an error is reported only when the *first* message fails; a
//! failure later in the vector shortens the count and is reported by the next call. Callers
//! (see `transmit.rs`) therefore always continue from the returned count.

use std::io::{self, IoSliceMut};
use std::mem;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};

use super::addr::SockAddr;
pub(crate) use super::cmsg::RawRecv;
use super::cmsg::{self, decode_control, Cmsg, CmsgBuf, Encoder};
use super::fault::{Fault, Faults};
use super::zc::{Notif, ZcBatch};
use super::{cvt, retry};

/// Messages per `sendmmsg`/`recvmmsg` call. The kernel takes up to `UIO_MAXIOV` (1024); 64
/// already amortizes the syscall below 2% of the per-datagram cost, and keeps the scratch small.
pub const BATCH: usize = 64;

/// One outgoing message, already planned: a plain datagram or a GSO super-buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutMsg<'a> {
    /// Where the message goes.
    pub dst: SocketAddr,
    /// True on a connected socket sending to its peer: no `msg_name`, so the kernel uses the
    /// cached route instead of a lookup per message.
    pub to_peer: bool,
    pub payload: &'a [u8],
    /// `UDP_SEGMENT` for this message; never set for a single segment.
    pub segment_size: Option<u16>,
    pub src_ip: Option<IpAddr>,
    /// The TOS / traffic class byte's ECN bits.
    pub ecn: Option<u8>,
    /// `SCM_TXTIME` departure time, ns of CLOCK_MONOTONIC.
    pub txtime: Option<u64>,
}

/// What a planned message covers, kept beside its header for the accounting after the call.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MsgMeta {
    /// Index of the transmit.
    pub t: usize,
    /// Its first segment in this message.
    pub first_seg: usize,
    /// Segments (datagrams on the wire).
    pub segs: usize,
    /// This message finishes its transmit.
    pub last: bool,
    /// Payload bytes.
    pub len: usize,
    /// `UDP_SEGMENT` attached.
    pub segment_size: Option<u16>,
}

/// Reusable send vectors of one socket. Messages are planned straight into it
/// ([`SendScratch::push`]) and sent with [`SendScratch::send_filled`] in the same call, while
/// the payloads the headers point at are still borrowed by the caller: no allocation per send.
pub(crate) struct SendScratch {
    hdrs: [libc::mmsghdr; BATCH],
    iovs: [libc::iovec; BATCH],
    names: [SockAddr; BATCH],
    ctrl: [CmsgBuf; BATCH],
    meta: [MsgMeta; BATCH],
    len: usize,
    /// The io_uring this scratch submits through, made on first use by a socket that wants
    /// it; `Err` once making it failed (then system calls, for good).
    #[cfg(feature = "io-uring")]
    ring: Option<Result<super::uring::Ring, ()>>,
    /// The last call's zerocopy batch, when it went as `IORING_OP_SENDMSG_ZC` entries.
    #[cfg(feature = "io-uring")]
    last_zc: Option<ZcBatch>,
}

// SAFETY: the raw pointers inside the headers are written at the start of every call and only
// dereferenced by the kernel during that call, while the caller's borrows keep their targets
// alive; between calls they are stale but never read. So moving the scratch to another thread
// is sound.
unsafe impl Send for SendScratch {}

impl SendScratch {
    pub(crate) fn new() -> Box<Self> {
        Box::new(SendScratch {
            // SAFETY: mmsghdr and iovec are plain C structs for which all-zero (null
            // pointers, zero lengths) is a valid value.
            hdrs: unsafe { mem::zeroed() },
            // SAFETY: as above.
            iovs: unsafe { mem::zeroed() },
            names: [SockAddr::empty(); BATCH],
            ctrl: [CmsgBuf::default(); BATCH],
            meta: [MsgMeta::default(); BATCH],
            len: 0,
            #[cfg(feature = "io-uring")]
            ring: None,
            #[cfg(feature = "io-uring")]
            last_zc: None,
        })
    }

    /// What the last [`SendScratch::send_filled`] did as zerocopy io_uring entries, if it
    /// went so (then its ids are the socket's own, completed by [`SendScratch::zc_notifs`],
    /// not by the error queue).
    pub(crate) fn last_zc(&self) -> Option<ZcBatch> {
        #[cfg(feature = "io-uring")]
        {
            self.last_zc
        }
        #[cfg(not(feature = "io-uring"))]
        {
            None
        }
    }

    /// Whether this scratch's zerocopy sends go as io_uring SENDMSG_ZC entries (a ring that
    /// has them was made).
    pub(crate) fn zc_on_ring(&self) -> bool {
        #[cfg(feature = "io-uring")]
        {
            matches!(&self.ring, Some(Ok(r)) if r.has_zerocopy() && r.is_usable())
        }
        #[cfg(not(feature = "io-uring"))]
        {
            false
        }
    }

    /// The zerocopy notifications the ring has read (waiting up to `wait` for one when none
    /// is queued); none without a ring.
    pub(crate) fn zc_notifs(&mut self, wait: Option<std::time::Duration>) -> io::Result<Vec<Notif>> {
        #[cfg(feature = "io-uring")]
        if let Some(Ok(r)) = self.ring.as_mut() {
            return r.take_notifs(wait);
        }
        let _ = wait;
        Ok(Vec::new())
    }

    /// Whether this scratch's send ring, if it has one, has no entry queued, none in the
    /// kernel and no completion unread (test builds).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn uring_quiet(&mut self) -> bool {
        #[cfg(feature = "io-uring")]
        if let Some(Ok(r)) = self.ring.as_mut() {
            return r.is_quiet();
        }
        true
    }

    /// Forgets the planned messages.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Messages planned.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The planned messages' coverage, in order.
    pub(crate) fn metas(&self) -> &[MsgMeta] {
        &self.meta[..self.len]
    }

    /// The control messages planned for message `i`, decoded from the bytes the kernel would
    /// read (tests check what a transmit turns into).
    #[cfg(test)]
    pub(crate) fn control(&self, i: usize) -> Vec<Cmsg> {
        let mut out = Vec::new();
        if i < self.len {
            cmsg::decode(&self.hdrs[i].msg_hdr, |c| out.push(c));
        }
        out
    }

    /// Plans one more message (at most [`BATCH`]). The payload must stay alive until
    /// [`SendScratch::send_filled`] returns, which every caller ensures by sending within the
    /// borrow of its transmits.
    pub(crate) fn push(&mut self, m: &OutMsg<'_>, v6_socket: bool, meta: MsgMeta) {
        let i = self.len;
        assert!(i < BATCH, "udpx bug: more than {BATCH} messages planned");
        self.fill(i, m, v6_socket);
        self.meta[i] = MsgMeta { len: m.payload.len(), segment_size: m.segment_size, ..meta };
        self.len += 1;
    }

    /// Sends the planned messages: with `mmsg` all of them in one `sendmmsg`, otherwise the
    /// first with `sendmsg`. Returns how many the kernel took (≥ 1 on success). With
    /// `uring = Some(nonblocking)` they go as linked io_uring SENDMSG entries instead, the same
    /// messages with the same meaning of the result ([`super::uring`]); if no ring can be made,
    /// by system calls. A zerocopy send (`MSG_ZEROCOPY` in `flags`) with `zc_first_id` goes
    /// as SENDMSG_ZC entries numbered from it where the kernel has them
    /// ([`SendScratch::last_zc`] then says what the batch did), else by system calls with
    /// `MSG_ZEROCOPY`.
    pub(crate) fn send_filled(
        &mut self,
        fd: BorrowedFd<'_>,
        mmsg: bool,
        flags: libc::c_int,
        faults: &Faults,
        uring: Option<bool>,
        zc_first_id: Option<u32>,
    ) -> io::Result<usize> {
        #[cfg(feature = "io-uring")]
        {
            self.last_zc = None;
        }
        let mut n = if mmsg { self.len } else { self.len.min(1) };
        if n == 0 {
            return Ok(0);
        }
        let gso = self.meta[..n].iter().any(|m| m.segment_size.is_some());
        let mut enter_fault = None;
        match faults.next(gso) {
            Some(Fault::Errno(e) | Fault::ErrnoOnGso(e)) => return Err(io::Error::from_raw_os_error(e)),
            Some(Fault::Short(k)) if mmsg => n = n.min(k.max(1)),
            Some(Fault::UringEnter { errno, after_submit, times }) => enter_fault = Some((errno, after_submit, times)),
            _ => {}
        }
        #[cfg(not(all(feature = "io-uring", feature = "fault-injection")))]
        let _ = enter_fault;
        #[cfg(feature = "io-uring")]
        if let Some(nonblocking) = uring {
            let ring = self.ring.get_or_insert_with(|| super::uring::Ring::new(BATCH as u32).map_err(|_| ()));
            // A ring given up on after io_uring_enter kept failing is never entered again.
            if let Some(ring) = ring.as_mut().ok().filter(|r| r.is_usable()) {
                #[cfg(feature = "fault-injection")]
                if let Some((errno, after_submit, times)) = enter_fault {
                    let times = times.max(1);
                    ring.fail_next_enter(super::uring::EnterFault { errno, after_submit, times });
                }
                let f = if nonblocking { flags | libc::MSG_DONTWAIT } else { flags };
                if f & libc::MSG_ZEROCOPY == 0 {
                    return ring.sendmsgs(fd.as_raw_fd(), &mut self.hdrs, n, f);
                }
                if let (Some(first), true) = (zc_first_id, ring.has_zerocopy()) {
                    let mut batch = ZcBatch::default();
                    let res =
                        ring.sendmsgs_zc(fd.as_raw_fd(), &mut self.hdrs, n, f & !libc::MSG_ZEROCOPY, first, &mut batch);
                    self.last_zc = Some(batch);
                    return res;
                }
            }
        }
        #[cfg(not(feature = "io-uring"))]
        let _ = (uring, zc_first_id);
        if mmsg {
            // sendmmsg(sockfd, msgvec, vlen, flags): msgvec[0..vlen] are initialized headers
            // whose pointers target live buffers (filled by push within the caller's borrow);
            // flags: 0 or MSG_ZEROCOPY (blocking behaviour follows O_NONBLOCK).
            let sent = retry(|| {
                // SAFETY: see the comment above; hdrs has BATCH ≥ n entries.
                cvt(unsafe { libc::sendmmsg(fd.as_raw_fd(), self.hdrs.as_mut_ptr(), n as u32, flags) })
            })?;
            Ok(sent as usize)
        } else {
            // SAFETY: hdrs[0].msg_hdr was filled by push with pointers into live buffers.
            retry(|| cvt(unsafe { libc::sendmsg(fd.as_raw_fd(), &self.hdrs[0].msg_hdr, flags) }))?;
            Ok(1)
        }
    }

    /// Plans and sends the one message `msg` with `sendmsg`.
    pub(crate) fn send_one(
        &mut self,
        fd: BorrowedFd<'_>,
        v6_socket: bool,
        msg: &OutMsg<'_>,
        flags: libc::c_int,
        faults: &Faults,
    ) -> io::Result<usize> {
        self.clear();
        self.push(msg, v6_socket, MsgMeta::default());
        self.send_filled(fd, false, flags, faults, None, None)
    }

    fn fill(&mut self, i: usize, m: &OutMsg<'_>, v6_socket: bool) {
        self.hdrs[i].msg_len = 0;
        fill_msg(&mut self.hdrs[i].msg_hdr, &mut self.iovs[i], &mut self.names[i], &mut self.ctrl[i], m, v6_socket);
    }
}

/// Writes one message's header: `hdr` is made to point at `iov` (the payload), `name` (the
/// destination, unless sending to the connected peer) and `ctrl` (segment size, source
/// address, ECN, departure time), which must stay where they are while the kernel may read
/// the header.
pub(crate) fn fill_msg(
    hdr: &mut libc::msghdr,
    iov: &mut libc::iovec,
    name: &mut SockAddr,
    ctrl: &mut CmsgBuf,
    m: &OutMsg<'_>,
    v6_socket: bool,
) {
    // SAFETY: all-zero is a valid msghdr (null pointers, zero lengths).
    *hdr = unsafe { mem::zeroed() };
    if !m.to_peer {
        *name = SockAddr::for_socket(&m.dst, v6_socket);
        hdr.msg_name = name.as_ptr() as *mut libc::c_void;
        hdr.msg_namelen = name.len();
    }
    // The kernel only reads from iov_base on send; the cast to *mut is what iovec wants.
    *iov = libc::iovec { iov_base: m.payload.as_ptr() as *mut libc::c_void, iov_len: m.payload.len() };
    hdr.msg_iov = iov;
    hdr.msg_iovlen = 1;
    // A datagram to an IPv4 address, written plain or v4-mapped (`::ffff:a.b.c.d`), leaves
    // through the IPv4 path (`udpv6_sendmsg` hands it to `udp_sendmsg`), which reads only
    // IPPROTO_IP control messages: its TOS and source must be IP_TOS and IP_PKTINFO.
    let to_v4 = !v6_socket || super::addr::is_v4(&m.dst);
    let mut enc = Encoder::new(hdr, ctrl);
    if let Some(s) = m.segment_size {
        enc.push(&Cmsg::Segment(s));
    }
    match m.src_ip.map(super::addr::unmapped) {
        Some(IpAddr::V4(addr)) => enc.push(&Cmsg::PktInfoV4 { ifindex: 0, addr }),
        Some(IpAddr::V6(addr)) => enc.push(&Cmsg::PktInfoV6 { ifindex: 0, addr }),
        None => {}
    }
    if let Some(ecn) = m.ecn {
        enc.push(&if to_v4 { Cmsg::Tos(ecn) } else { Cmsg::TClass(ecn) });
    }
    if let Some(t) = m.txtime {
        enc.push(&Cmsg::TxTime(t));
    }
}

/// Receive buffers that own their memory: `count` slots of `size` bytes in one allocation,
/// with their iovecs pointing into it, set up once (the memory never moves).
pub(crate) struct OwnedSlots {
    data: Box<[u8]>,
    iovs: Box<[libc::iovec]>,
    size: usize,
}

// SAFETY: the iovecs point only into `data`, which this struct owns and never reallocates;
// moving the struct to another thread moves the allocation's owner with them.
unsafe impl Send for OwnedSlots {}

impl OwnedSlots {
    pub(crate) fn new(count: usize, size: usize) -> Self {
        let mut data = vec![0u8; count * size].into_boxed_slice();
        let base = data.as_mut_ptr();
        // `base + i * size` stays inside `data` for every slot (computed without unsafe).
        let iovs =
            (0..count).map(|i| libc::iovec { iov_base: base.wrapping_add(i * size).cast(), iov_len: size }).collect();
        OwnedSlots { data, iovs, size }
    }

    pub(crate) fn count(&self) -> usize {
        self.iovs.len()
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn slot(&self, i: usize) -> &[u8] {
        &self.data[i * self.size..(i + 1) * self.size]
    }

    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.data[i * self.size..(i + 1) * self.size]
    }

    /// The iovecs, for [`RecvScratch::recv_iovs`].
    pub(crate) fn iovs(&mut self) -> &mut [libc::iovec] {
        &mut self.iovs
    }
}

impl RecvScratch {
    /// One datagram with `recvfrom(2)`, for a socket that wants no control message: the
    /// kernel's `udpgso_bench_rx` shape plus the source address, without the msghdr and iovec
    /// that `recvmsg` copies in per call. MSG_TRUNC makes the kernel return the datagram's real
    /// length, so a cut datagram is still reported as one.
    fn recv_from(&mut self, fd: BorrowedFd<'_>, iov: &mut libc::iovec, flags: libc::c_int) -> io::Result<usize> {
        let mut namelen = self.names[0].capacity();
        let (name, _) = self.names[0].as_mut_parts();
        let len = retry(|| {
            // SAFETY: iov describes a live, exclusively borrowed buffer of iov_len bytes; name
            // points at a sockaddr_storage of `namelen` bytes owned by this scratch.
            cvt(unsafe {
                libc::recvfrom(fd.as_raw_fd(), iov.iov_base, iov.iov_len, flags | libc::MSG_TRUNC, name, &mut namelen)
            })
        })? as usize;
        let cut = len > iov.iov_len;
        self.out[0] = RawRecv {
            len: len.min(iov.iov_len),
            flags: if cut { libc::MSG_TRUNC } else { 0 },
            addr: self.names[0].with_len(namelen),
            ..RawRecv::default()
        };
        Ok(1)
    }
}

/// Reusable receive vectors of one socket.
pub(crate) struct RecvScratch {
    hdrs: [libc::mmsghdr; BATCH],
    names: [SockAddr; BATCH],
    ctrl: [CmsgBuf; BATCH],
    /// What the last call received, decoded (reused: no per-call initialization).
    out: [RawRecv; BATCH],
}

// SAFETY: as for SendScratch: pointers are rewritten before each call and unused between.
unsafe impl Send for RecvScratch {}

impl RecvScratch {
    pub(crate) fn new() -> Box<Self> {
        Box::new(RecvScratch {
            // SAFETY: all-zero mmsghdrs are valid (null pointers, zero lengths).
            hdrs: unsafe { mem::zeroed() },
            names: [SockAddr::empty(); BATCH],
            ctrl: [CmsgBuf::default(); BATCH],
            out: [RawRecv::default(); BATCH],
        })
    }

    /// The decoded results of the last [`RecvScratch::recv`] that returned `got`.
    pub(crate) fn results(&self, got: usize) -> &[RawRecv] {
        &self.out[..got.min(BATCH)]
    }

    /// Receives into `bufs` (one datagram or GRO buffer each): with `mmsg` as many as are
    /// queued, up to `bufs.len()` and [`BATCH`], in one `recvmmsg` (MSG_WAITFORONE: block for
    /// the first only); otherwise one with `recvmsg`. `flags` adds to the call's flags
    /// (MSG_DONTWAIT: never block).
    ///
    /// `ctrl_len` is the control space offered per message, normally [`cmsg::CMSG_CAP`].
    pub(crate) fn recv(
        &mut self,
        fd: BorrowedFd<'_>,
        bufs: &mut [IoSliceMut<'_>],
        mmsg: bool,
        ctrl_len: usize,
        flags: libc::c_int,
    ) -> io::Result<usize> {
        // IoSliceMut is guaranteed ABI-compatible with iovec on Unix (std's documentation).
        let iovs = bufs.as_mut_ptr().cast::<libc::iovec>();
        // SAFETY: `bufs` is a live, exclusively borrowed slice of iovec-compatible values.
        let iovs = unsafe { std::slice::from_raw_parts_mut(iovs, bufs.len()) };
        self.recv_iovs(fd, iovs, mmsg, ctrl_len, flags)
    }

    /// [`RecvScratch::recv`] on raw iovecs (owned slots or a caller's slices). Each header is
    /// pointed at its buffer, name and control space; nothing is zeroed: the kernel writes
    /// the address, the lengths and the flags it reports.
    pub(crate) fn recv_iovs(
        &mut self,
        fd: BorrowedFd<'_>,
        iovs: &mut [libc::iovec],
        mmsg: bool,
        ctrl_len: usize,
        flags: libc::c_int,
    ) -> io::Result<usize> {
        let n = iovs.len().min(if mmsg { BATCH } else { 1 });
        if n == 0 {
            return Ok(0);
        }
        let ctrl_len = ctrl_len.min(cmsg::CMSG_CAP);
        #[allow(clippy::needless_range_loop)] // four arrays indexed in step
        for i in 0..n {
            let namelen = self.names[i].capacity();
            let (name, _) = self.names[i].as_mut_parts();
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            let hdr = &mut h.msg_hdr;
            hdr.msg_name = name.cast();
            hdr.msg_namelen = namelen;
            hdr.msg_iov = &mut iovs[i];
            hdr.msg_iovlen = 1;
            hdr.msg_control = if ctrl_len == 0 { std::ptr::null_mut() } else { self.ctrl[i].0.as_mut_ptr().cast() };
            hdr.msg_controllen = ctrl_len as _;
            hdr.msg_flags = 0;
        }
        if !mmsg && ctrl_len == 0 {
            return self.recv_from(fd, &mut iovs[0], flags);
        }
        let got = if mmsg {
            // recvmmsg(sockfd, msgvec, vlen, flags, timeout): n headers pointing at live
            // buffers; MSG_WAITFORONE turns on MSG_DONTWAIT after the first message; timeout
            // NULL (SO_RCVTIMEO still bounds the first wait).
            retry(|| {
                // SAFETY: see the comment above.
                cvt(unsafe {
                    libc::recvmmsg(
                        fd.as_raw_fd(),
                        self.hdrs.as_mut_ptr(),
                        n as u32,
                        libc::MSG_WAITFORONE | flags,
                        std::ptr::null_mut(),
                    )
                })
            })? as usize
        } else {
            let len = retry(|| {
                // SAFETY: hdrs[0].msg_hdr points at live name, buffer and control storage.
                cvt(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut self.hdrs[0].msg_hdr, flags) })
            })?;
            self.hdrs[0].msg_len = len as u32;
            1
        };
        #[allow(clippy::needless_range_loop)] // three arrays indexed in step
        for i in 0..got {
            let h = &self.hdrs[i];
            let mut r = RawRecv {
                len: h.msg_len as usize,
                flags: h.msg_hdr.msg_flags,
                addr: self.names[i].with_len(h.msg_hdr.msg_namelen),
                ..RawRecv::default()
            };
            decode_control(&h.msg_hdr, &mut r);
            self.out[i] = r;
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A departure becomes exactly one SCM_TXTIME of 8 bytes (u64 ns, native endian), beside
    /// the other control messages of the message.
    #[test]
    fn txtime_is_encoded_as_u64_ns() {
        let payload = [7u8; 3000];
        let msg = OutMsg {
            dst: "127.0.0.1:9".parse().unwrap(),
            to_peer: false,
            payload: &payload,
            segment_size: Some(1000),
            src_ip: None,
            ecn: Some(1),
            txtime: Some(0x0123_4567_89AB_CDEF),
        };
        let mut s = SendScratch::new();
        s.push(&msg, false, MsgMeta::default());
        s.push(&OutMsg { txtime: None, ..msg }, false, MsgMeta::default());
        assert_eq!(s.control(0), vec![Cmsg::Segment(1000), Cmsg::Tos(1), Cmsg::TxTime(0x0123_4567_89AB_CDEF)]);
        assert_eq!(s.control(1), vec![Cmsg::Segment(1000), Cmsg::Tos(1)]);
        // The raw bytes: SOL_SOCKET / SCM_TXTIME (= SO_TXTIME), CMSG_LEN(8), the value.
        let raw = cmsg::encode_bytes(&[Cmsg::TxTime(42)]);
        assert_eq!(raw.len(), 24);
        assert_eq!(u64::from_ne_bytes(raw[0..8].try_into().unwrap()), 24);
        assert_eq!(i32::from_ne_bytes(raw[8..12].try_into().unwrap()), libc::SOL_SOCKET);
        assert_eq!(i32::from_ne_bytes(raw[12..16].try_into().unwrap()), super::super::SO_TXTIME);
        assert_eq!(u64::from_ne_bytes(raw[16..24].try_into().unwrap()), 42);
    }
}
