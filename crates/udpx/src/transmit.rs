//! Sending: [`Transmit`], the four [`SendMode`]s, and the send loop with its fallbacks.
//!
//! The loop's promise: a datagram handed to [`UdpSocket::send`] is sent, or the call returns
//! an error whose `sent` count says exactly which transmits went out — never a silent drop.
//!
//! | kernel answer | what udpx does |
//! | --- | --- |
//! | short `sendmmsg` count | continues from the first unsent message |
//! | EINTR | retries the call |
//! | EAGAIN between transmits | returns `WouldBlock` with the count sent |
//! | EAGAIN inside a split transmit | waits (bounded) for writability and finishes it, so no transmit is ever half-sent |
//! | ENOBUFS | backs off (50 us doubling to 10 ms, at most [`ENOBUFS_RETRIES`] times), counted |
//! | EINVAL on more than 64 segments | lowers the segment limit to 64, re-sends |
//! | EIO / EINVAL on a GSO message | re-sends that transmit at once as plain datagrams; if that works, datagrams to that destination go plain for a back-off (1 s, doubling to 5 min, then GSO is tried again; recorded with the errno, logged once, counted); if the plain send says EMSGSIZE, the problem was size: GSO stays on and EMSGSIZE is reported |
//! | EMSGSIZE | reported with the sizes involved |

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::error::{InvalidTransmit, SendError, SendErrorKind};
use crate::socket::{Family, UdpSocket};
use crate::sys::mmsg::{MsgMeta, OutMsg, SendScratch, BATCH};
use crate::txtime::Timestamp;

/// Largest UDP payload over IPv4: 65,535 − 20 (IP header) − 8 (UDP header).
pub const MAX_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6: the 16-bit payload length covers the UDP header but not the
/// IPv6 header, so 65,535 − 8.
pub const MAX_PAYLOAD_V6: usize = 65_527;
/// ENOBUFS retries before the error is reported.
pub const ENOBUFS_RETRIES: u32 = 12;
/// How long a send may wait for buffer space to finish a transmit it has started.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// The largest UDP payload to `dst`.
pub fn max_payload(dst: &SocketAddr) -> usize {
    match dst {
        SocketAddr::V4(_) => MAX_PAYLOAD_V4,
        SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_some() => MAX_PAYLOAD_V4,
        SocketAddr::V6(_) => MAX_PAYLOAD_V6,
    }
}

/// The ECN codepoint of a datagram (RFC 3168), the low two bits of TOS / traffic class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EcnCodepoint {
    /// ECT(0).
    Ect0 = 0b10,
    /// ECT(1).
    Ect1 = 0b01,
    /// Congestion experienced.
    Ce = 0b11,
}

impl EcnCodepoint {
    /// From the TOS / traffic-class byte; `None` for Not-ECT.
    pub fn from_bits(tos: u8) -> Option<Self> {
        match tos & 0b11 {
            0b10 => Some(EcnCodepoint::Ect0),
            0b01 => Some(EcnCodepoint::Ect1),
            0b11 => Some(EcnCodepoint::Ce),
            _ => None,
        }
    }
}

/// How a socket sends. The bench compares all four; real programs want [`SendMode::GsoSendmmsg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendMode {
    /// One `sendmsg` per datagram: the baseline every UDP program starts from.
    Sendmsg,
    /// `sendmmsg`: up to 64 datagrams per call (fewer syscalls, same stack traversals).
    Sendmmsg,
    /// `sendmsg` with `UDP_SEGMENT`: one call and one stack traversal per super-buffer of up
    /// to 64 KiB.
    GsoSendmsg,
    /// `sendmmsg` of GSO super-buffers: both savings.
    GsoSendmmsg,
}

impl SendMode {
    /// All four, in the order the bench reports them.
    pub const ALL: [SendMode; 4] = [SendMode::Sendmsg, SendMode::Sendmmsg, SendMode::GsoSendmsg, SendMode::GsoSendmmsg];

    /// Whether this mode segments (uses GSO).
    pub fn segments(self) -> bool {
        matches!(self, SendMode::GsoSendmsg | SendMode::GsoSendmmsg)
    }

    /// Whether this mode batches system calls (sendmmsg).
    pub fn batches(self) -> bool {
        matches!(self, SendMode::Sendmmsg | SendMode::GsoSendmmsg)
    }

    /// A short stable name (`sendmsg`, `sendmmsg`, `gso`, `gso-sendmmsg`).
    pub fn name(self) -> &'static str {
        match self {
            SendMode::Sendmsg => "sendmsg",
            SendMode::Sendmmsg => "sendmmsg",
            SendMode::GsoSendmsg => "gso",
            SendMode::GsoSendmmsg => "gso-sendmmsg",
        }
    }
}

impl std::str::FromStr for SendMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SendMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown send mode {s:?}: use one of sendmsg, sendmmsg, gso, gso-sendmmsg"))
    }
}

impl std::fmt::Display for SendMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One send: a datagram, or with `segment_size` a run of datagrams to one destination that the
/// kernel segments (all `segment_size` long but the last, which may be shorter).
#[derive(Debug, Clone, Copy)]
pub struct Transmit<'a> {
    /// Where it goes.
    pub destination: SocketAddr,
    /// The payload: one datagram, or consecutive segments.
    pub contents: &'a [u8],
    /// GSO segment size; `None` sends `contents` as one datagram.
    pub segment_size: Option<usize>,
    /// Source address (needs pktinfo; `None`: the kernel picks by route).
    pub src_ip: Option<IpAddr>,
    /// ECN codepoint to set.
    pub ecn: Option<EcnCodepoint>,
    /// Departure time (`SCM_TXTIME`), honoured only by an fq or etf qdisc.
    pub departure: Option<Timestamp>,
}

impl<'a> Transmit<'a> {
    /// One datagram to `destination`.
    pub fn new(destination: SocketAddr, contents: &'a [u8]) -> Self {
        Transmit { destination, contents, segment_size: None, src_ip: None, ecn: None, departure: None }
    }

    /// With a GSO segment size.
    pub fn segmented(mut self, segment_size: usize) -> Self {
        self.segment_size = Some(segment_size);
        self
    }

    /// Datagrams this transmit puts on the wire.
    pub fn segments(&self) -> usize {
        segment_count(self.contents.len(), self.segment_size)
    }
}

/// Datagrams a payload of `len` makes in segments of `seg` (a zero-length datagram is one).
pub(crate) fn segment_count(len: usize, seg: Option<usize>) -> usize {
    match seg {
        Some(s) if s > 0 && len > s => len.div_ceil(s),
        _ => 1,
    }
}

/// Where the send loop is: transmit index and, inside a transmit, the next segment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cursor {
    t: usize,
    seg: usize,
}

/// What a transmit is checked against: the socket's family and the kernel's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathLimits {
    /// The sending socket's family.
    pub family: Family,
    /// Path MTU towards the connected peer, where known.
    pub path_mtu: Option<usize>,
    /// Most segments per GSO send on this kernel (`None`: no GSO).
    pub max_segments: Option<usize>,
}

/// Checks a transmit without sending. `to_peer`: it goes to the connected peer, whose path MTU
/// is in `limits`.
pub fn validate_transmit(t: &Transmit<'_>, limits: &PathLimits, to_peer: bool) -> Result<(), InvalidTransmit> {
    if !limits.family.reaches(&t.destination) {
        return Err(InvalidTransmit::WrongFamily { destination: t.destination, socket: limits.family.name() });
    }
    let ceiling = max_payload(&t.destination);
    if t.segment_size == Some(0) {
        return Err(InvalidTransmit::SegmentSizeZero);
    }
    if t.contents.len() > ceiling {
        return Err(InvalidTransmit::PayloadTooLarge { len: t.contents.len(), max: ceiling });
    }
    let Some(seg) = t.segment_size else {
        return Ok(());
    };
    if t.segments() <= 1 {
        return Ok(()); // sent as one plain datagram
    }
    if let (Some(mtu), true) = (limits.path_mtu, to_peer) {
        let hdr = if max_payload(&t.destination) == MAX_PAYLOAD_V4 { 28 } else { 48 };
        let max = mtu.saturating_sub(hdr);
        if seg > max {
            return Err(InvalidTransmit::SegmentTooLarge { segment_size: seg, max, limit: "the path MTU" });
        }
    }
    if let Some(kmax) = limits.max_segments {
        if t.segments() > kmax {
            return Err(InvalidTransmit::TooManySegments { segments: t.segments(), max: kmax });
        }
    }
    Ok(())
}

/// One message a transmit becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Byte range of the transmit's contents.
    pub range: std::ops::Range<usize>,
    /// Datagrams on the wire.
    pub segments: usize,
    /// `UDP_SEGMENT` attached (never for a single segment).
    pub segment_size: Option<usize>,
}

/// The messages a transmit becomes: with GSO, super-buffers of at most `max_segments`;
/// without, one message per segment; a transmit of one datagram, one plain message.
pub fn messages(t: &Transmit<'_>, gso: bool, max_segments: usize) -> Vec<Message> {
    let total = t.segments();
    let mut out = Vec::new();
    let mut first = 0;
    while first < total {
        let (range, n, seg) = chunk(t, first, if gso { max_segments } else { 1 });
        out.push(Message { range, segments: n, segment_size: seg });
        first += n;
    }
    out
}

/// The message of `t` starting at segment `first`, of at most `per_msg` segments.
fn chunk(t: &Transmit<'_>, first: usize, per_msg: usize) -> (std::ops::Range<usize>, usize, Option<usize>) {
    match t.segment_size {
        Some(seg) if t.segments() > 1 => {
            let n = per_msg.max(1).min(t.segments() - first);
            let start = first * seg;
            let end = (start + n * seg).min(t.contents.len());
            // Never UDP_SEGMENT on a single segment: some devices fail it with EIO.
            (start..end, n, (n > 1).then_some(seg))
        }
        _ => (0..t.contents.len(), 1, None),
    }
}

impl UdpSocket {
    /// Checks a transmit against the socket and the kernel's limits without sending.
    pub fn validate(&self, t: &Transmit<'_>) -> Result<(), InvalidTransmit> {
        let limits = PathLimits {
            family: self.family,
            path_mtu: self.path_mtu(),
            max_segments: self.caps.kernel.gso_max_segments,
        };
        validate_transmit(t, &limits, self.peer == Some(t.destination))
    }

    /// Sends `transmits` in order, as many per system call as the send mode allows.
    ///
    /// Returns the number sent, which is `transmits.len()` unless an error says otherwise (see
    /// [`SendError::sent`]). Invalid transmits are refused before anything is sent.
    pub fn send(&self, transmits: &[Transmit<'_>]) -> Result<usize, SendError> {
        self.send_inner(transmits, None)
    }

    /// The send loop. With `zc` (a zerocopy send, its state locked and an entry open in its
    /// tracker) every call carries MSG_ZEROCOPY, and every id the kernel consumes is added to
    /// the open entry: one per message it took, and one per failed call that used one (found
    /// by reading the error queue right after the failure, where the kernel has already
    /// queued that id's completion).
    pub(crate) fn send_inner(
        &self,
        transmits: &[Transmit<'_>],
        mut zc: Option<&mut crate::zerocopy::ZcState>,
    ) -> Result<usize, SendError> {
        let mut flags = if zc.is_some() { libc::MSG_ZEROCOPY } else { 0 };
        let mut icmp_retries = 0;
        for (index, t) in transmits.iter().enumerate() {
            self.validate(t).map_err(|reason| SendError {
                sent: 0,
                partial_segments: 0,
                kind: SendErrorKind::Invalid { index, reason },
            })?;
        }
        let mut scratch = self.send_scratch.lock().unwrap_or_else(|e| e.into_inner());
        let batched = self.send_mode.batches();
        let mut cur = Cursor::default();
        let mut enobufs = 0u32;
        // A transmit being re-sent plain after its GSO send was refused: (index, errno).
        let mut gso_suspect: Option<(usize, i32)> = None;
        let c = &self.counters;
        while cur.t < transmits.len() {
            self.plan(transmits, cur, if batched { BATCH } else { 1 }, gso_suspect.map(|s| s.0), &mut scratch);
            let res = scratch.send_filled(self.fd_ref(), batched, flags, &self.faults);
            c.add(&c.send_calls, 1);
            let zc_call = flags & libc::MSG_ZEROCOPY != 0;
            match res {
                Ok(n) => {
                    enobufs = 0;
                    if let (true, Some(z)) = (zc_call, zc.as_deref_mut()) {
                        z.tracker.extend_open(n as u32);
                        c.add(&c.zerocopy_sends, n as u64);
                    }
                    if n < scratch.len() {
                        c.add(&c.partial_sends, 1);
                        if zc_call {
                            // The message the kernel stopped at may have failed after taking
                            // an id.
                            self.after_failed_call(zc.as_deref_mut(), true);
                        }
                    }
                    let (mut dgrams, mut bytes, mut gso) = (0, 0, 0);
                    for s in &scratch.metas()[..n] {
                        dgrams += s.segs as u64;
                        bytes += s.len as u64;
                        gso += s.segment_size.is_some() as u64;
                        cur = if s.last {
                            Cursor { t: s.t + 1, seg: 0 }
                        } else {
                            Cursor { t: s.t, seg: s.first_seg + s.segs }
                        };
                        if let Some((t, errno)) = gso_suspect {
                            if s.t == t && s.last {
                                // The plain re-send went through: the path refuses GSO.
                                gso_suspect = None;
                                self.gso_refused(&transmits[t].destination, errno);
                            }
                        }
                    }
                    c.add(&c.datagrams_sent, dgrams);
                    c.add(&c.bytes_sent, bytes);
                    c.add(&c.gso_buffers_sent, gso);
                }
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(0);
                    let icmp_kind = self.caps.recv_err && crate::icmp::is_icmp_errno(errno);
                    let drained = if zc_call || icmp_kind {
                        self.after_failed_call(zc.as_deref_mut(), zc_call)
                    } else {
                        Default::default()
                    };
                    if icmp_kind && self.peer.is_none() && drained.icmp > 0 && icmp_retries < crate::icmp::ICMP_RETRIES
                    {
                        // A pending error left by someone else's ICMP (IP_RECVERR): this call
                        // sent nothing; the queue is read now, so send again.
                        icmp_retries += 1;
                        c.add(&c.icmp_retries, 1);
                        continue;
                    }
                    let first_span = scratch.metas()[0];
                    let first_seg = first_span.segment_size;
                    match errno {
                        libc::EAGAIN => {
                            c.add(&c.would_block, 1);
                            if cur.seg == 0 && gso_suspect.is_none() {
                                return Err(SendError {
                                    sent: cur.t,
                                    partial_segments: 0,
                                    kind: SendErrorKind::WouldBlock,
                                });
                            }
                            // Inside a split transmit: finish it before returning.
                            if !self.wait_for(libc::POLLOUT, FINISH_WAIT, zc.as_deref_mut()).unwrap_or(false) {
                                return Err(self.fail(
                                    cur,
                                    SendErrorKind::Io(io::Error::new(
                                        io::ErrorKind::TimedOut,
                                        format!(
                                            "socket stayed unwritable for {FINISH_WAIT:?} in the middle of a transmit"
                                        ),
                                    )),
                                ));
                            }
                        }
                        libc::ENOBUFS if flags & libc::MSG_ZEROCOPY != 0 => {
                            // optmem exhausted by zerocopy notifications: copy instead, now.
                            flags &= !libc::MSG_ZEROCOPY;
                            c.add(&c.zerocopy_enobufs_copied, 1);
                        }
                        libc::ENOBUFS if enobufs < ENOBUFS_RETRIES => {
                            c.add(&c.enobufs_retries, 1);
                            std::thread::sleep(
                                Duration::from_micros(50 << enobufs.min(8)).min(Duration::from_millis(10)),
                            );
                            enobufs += 1;
                        }
                        libc::EINVAL
                            if first_seg.is_some() && first_span.segs > 64 && self.caps.max_segments() > 64 =>
                        {
                            self.caps.gso_max_segments.store(64, Ordering::Relaxed);
                            c.add(&c.segment_limit_lowered, 1);
                            log::warn!("udpx: kernel refused {} GSO segments; limit lowered to 64", first_span.segs);
                        }
                        libc::EIO | libc::EINVAL if first_seg.is_some() => {
                            // Re-send this transmit plain at once; decide after.
                            gso_suspect = Some((first_span.t, errno));
                        }
                        libc::EMSGSIZE => {
                            c.add(&c.emsgsize, 1);
                            // A plain re-send after a GSO refusal failed on size: the refusal
                            // was about size, not the device. GSO stays on.
                            let seg = first_seg
                                .map(usize::from)
                                .or_else(|| gso_suspect.and_then(|(t, _)| transmits[t].segment_size));
                            return Err(self.fail(
                                cur,
                                SendErrorKind::MessageTooLarge {
                                    len: first_span.len.max(transmits[first_span.t].contents.len()),
                                    segment_size: seg,
                                    path_mtu: self.path_mtu(),
                                },
                            ));
                        }
                        _ => {
                            c.add(&c.send_errors, 1);
                            return Err(self.fail(cur, SendErrorKind::Io(e)));
                        }
                    }
                }
            }
        }
        Ok(transmits.len())
    }

    /// Builds the next batch of messages from `cur`: GSO messages of at most the segment limit
    /// where segmenting is on, one message per segment where it is off (or `plain_t` says this
    /// transmit must go plain), whole contents otherwise.
    fn plan(
        &self,
        transmits: &[Transmit<'_>],
        mut cur: Cursor,
        cap: usize,
        plain_t: Option<usize>,
        out: &mut SendScratch,
    ) {
        out.clear();
        let v6 = self.family.is_v6();
        let max_segs = self.caps.max_segments().max(1);
        while out.len() < cap && cur.t < transmits.len() {
            let t = &transmits[cur.t];
            let to_peer = self.peer == Some(t.destination);
            let base = OutMsg {
                dst: t.destination,
                to_peer,
                payload: t.contents,
                segment_size: None,
                src_ip: t.src_ip,
                ecn: t.ecn.map(|e| e as u8),
                txtime: t.departure.map(|d| d.as_nanos()),
            };
            let total = t.segments();
            let per_msg = if plain_t != Some(cur.t) && self.caps.gso_for(&t.destination) { max_segs } else { 1 };
            while out.len() < cap && cur.seg < total {
                let (range, n, seg) = chunk(t, cur.seg, per_msg);
                let msg = OutMsg { payload: &t.contents[range], segment_size: seg.map(|s| s as u16), ..base };
                let last = cur.seg + n == total;
                out.push(&msg, v6, MsgMeta { t: cur.t, first_seg: cur.seg, segs: n, last, ..MsgMeta::default() });
                if last {
                    cur = Cursor { t: cur.t + 1, seg: 0 };
                    break;
                }
                cur.seg += n;
            }
        }
    }

    /// After a send call failed (or a sendmmsg stopped short): reads the error queue. With
    /// `zc_call`, a completion covering the next zerocopy id means the failed call consumed it
    /// (the kernel built the packet, then refused it): the id joins the send's open entry,
    /// already complete, so later ids line up with the kernel's.
    fn after_failed_call(&self, mut zc: Option<&mut crate::zerocopy::ZcState>, zc_call: bool) -> crate::icmp::Drained {
        let watch = zc.as_deref().filter(|_| zc_call).map(|z| z.tracker.next_id());
        let d = self.drain_error_queue(zc.as_deref_mut(), watch, &mut |_| {}).unwrap_or_default();
        if let (Some(id), true, Some(z)) = (watch, d.watched_completed, zc) {
            z.tracker.extend_open(1);
            drop(z.tracker.complete(id, id));
            self.counters.add(&self.counters.zerocopy_failed_ids, 1);
        }
        d
    }

    fn fail(&self, cur: Cursor, kind: SendErrorKind) -> SendError {
        SendError { sent: cur.t, partial_segments: cur.seg, kind }
    }

    /// Records that the path to `dst` refused GSO (see `GsoRefusals`): counted, logged once
    /// per socket at warn level (every time at debug).
    fn gso_refused(&self, dst: &SocketAddr, errno: i32) {
        self.counters.add(&self.counters.gso_fallbacks, 1);
        let why = self.caps.gso_refused(dst, errno);
        if !self.logged_gso_off.swap(true, Ordering::Relaxed) {
            log::warn!("udpx: GSO refused on {}: {why}", self.local);
        } else {
            log::debug!("udpx: GSO refused on {}: {why}", self.local);
        }
    }

    pub(crate) fn fd_ref(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}
