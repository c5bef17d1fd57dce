//! I/O modes and the outbox: how the packets quiche writes become `Transmit`s.
//!
//! quiche hands out one packet per `send()` call. The outbox appends each to one flat buffer
//! and groups consecutive packets to the same peer of equal size into a run, which the udpx
//! socket sends as one GSO buffer (or, in the plain modes, as one datagram per packet):
//!
//! ```text
//!  buf: ├ p0 1350 ┼ p1 1350 ┼ p2 1350 ┼ p3 400 ┤├ p4 1350 (other peer) ┤├ p5 1350 ┼ …
//!       └──────────── run 0: seg 1350, 4 packets ┘└─────── run 1 ───────┘└ run 2 …
//!                 (a shorter packet ends its run)
//! ```
//!
//! A run ends at a shorter packet (GSO allows only the last segment to be shorter), at a
//! change of peer or of connection, at [`MAX_RUN_SEGMENTS`] packets or at the largest UDP
//! payload. Runs never mix connections, even to one peer address (a client socket carrying
//! several connections): a receiver steering by connection ID may see a GSO buffer whole
//! (on loopback the kernel looks the socket up once for the unsegmented buffer, and GRO
//! merges by address, not by ID), so every packet of a run must belong to one connection. When the
//! socket cannot take more (`EAGAIN`, or `ENOBUFS` from a full device queue) the outbox keeps
//! the unsent packets and the exact [`SendCursor`], and the next flush resumes there: nothing
//! quiche produced is dropped, and no new packet is produced until the old ones are gone.
//!
//! With zerocopy ([`Zerocopy`]) the outbox writes into buffers of a pool instead of its own
//! vector. A flush whose runs are large (the socket's threshold on average) goes with
//! MSG_ZEROCOPY, and the kernel's copy from user memory is saved; the socket then keeps a
//! share of that buffer until the kernel's completions, and the outbox writes the next
//! packets into another one. Where the kernel copies anyway (loopback, veth, a device without
//! scatter-gather) its completions say so and the socket turns zerocopy off (`auto`).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use udpx::{SendBuffers, SendCursor, SendErrorKind, SendMode, Transmit, UdpSocket, ZcBuf, ZcPool};

use crate::counters::HostCounters;
use crate::table::Slot;

/// Most packets in one GSO run: what every kernel since 4.18 takes (6.9 takes 128).
pub const MAX_RUN_SEGMENTS: usize = 64;
/// Departure times this close (ns) go out in one GSO run: quiche's `ReleaseDecision`
/// treats releases within 50 us as one burst.
const SAME_DEPARTURE_NS: u64 = 50_000;
/// Bytes the outbox holds before it must be flushed.
pub const OUTBOX_BYTES: usize = 512 * 1024;

/// How packets leave: the four rows of the Cloudflare post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoMode {
    /// One `sendmsg` per packet.
    Sendmsg,
    /// `sendmmsg`: many packets per call, one stack traversal each.
    Sendmmsg,
    /// `sendmsg` with `UDP_SEGMENT`: one GSO run per call.
    Gso,
    /// `sendmmsg` of GSO runs: several runs per call.
    #[default]
    GsoMmsg,
}

impl IoMode {
    /// All four, in the post's order.
    pub const ALL: [IoMode; 4] = [IoMode::Sendmsg, IoMode::Sendmmsg, IoMode::Gso, IoMode::GsoMmsg];

    /// The udpx socket send mode that implements it.
    pub fn send_mode(self) -> SendMode {
        match self {
            IoMode::Sendmsg => SendMode::Sendmsg,
            IoMode::Sendmmsg => SendMode::Sendmmsg,
            IoMode::Gso => SendMode::GsoSendmsg,
            IoMode::GsoMmsg => SendMode::GsoSendmmsg,
        }
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Sendmsg => "sendmsg",
            IoMode::Sendmmsg => "sendmmsg",
            IoMode::Gso => "gso",
            IoMode::GsoMmsg => "gso-mmsg",
        }
    }
}

impl FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<IoMode, String> {
        IoMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown I/O mode {s:?}: use one of sendmsg, sendmmsg, gso, gso-mmsg"))
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Zerocopy for the outbox's large flushes (`--zerocopy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Zerocopy {
    /// Every send copies.
    Off,
    /// MSG_ZEROCOPY for flushes of large runs, turned off where the kernel's completions say
    /// it copied anyway (the first few sends tell).
    #[default]
    Auto,
    /// As `auto`, but kept on where the kernel copies (to measure what it costs there).
    Always,
}

impl Zerocopy {
    /// The command-line names.
    pub const NAMES: &'static str = "off, auto, always";

    /// The socket settings that implement it.
    pub fn apply(self, cfg: udpx::SocketConfig) -> udpx::SocketConfig {
        let copied_limit = if self == Zerocopy::Always { 0 } else { udpx::ZcConfig::default().copied_limit };
        match self {
            Zerocopy::Off => cfg.zerocopy(udpx::Want::Off),
            _ => cfg
                .zerocopy(udpx::Want::IfAvailable)
                .zerocopy_config(udpx::ZcConfig { copied_limit, ..udpx::ZcConfig::default() }),
        }
    }
}

impl FromStr for Zerocopy {
    type Err = String;
    fn from_str(s: &str) -> Result<Zerocopy, String> {
        match s {
            "off" => Ok(Zerocopy::Off),
            "auto" => Ok(Zerocopy::Auto),
            "always" => Ok(Zerocopy::Always),
            _ => Err(format!("unknown zerocopy setting {s:?}: use one of {}", Zerocopy::NAMES)),
        }
    }
}

impl fmt::Display for Zerocopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Zerocopy::Off => "off",
            Zerocopy::Auto => "auto",
            Zerocopy::Always => "always",
        })
    }
}

/// Pool buffers a zerocopy outbox may have in flight or in use at once (each `OUTBOX_BYTES`;
/// touched only when used).
pub const ZEROCOPY_OUTBOXES: usize = 8;

/// A zerocopy outbox's storage: the pool and the buffer being filled.
struct ZcStore {
    pool: ZcPool,
    /// The buffer the runs are in, shared with the socket while a send from it is in flight.
    cur: Option<Arc<ZcBuf>>,
    /// The runs are in `cur` (else in the outbox's own vector); chosen when the outbox is
    /// empty, fixed until it is empty again.
    active: bool,
}

/// The pooled buffer the runs are in, if they are in one (else in the outbox's own vector).
fn active(zc: &Option<ZcStore>) -> Option<&Arc<ZcBuf>> {
    zc.as_ref().filter(|z| z.active).and_then(|z| z.cur.as_ref())
}

/// Consecutive packets to one peer, all `seg` bytes but possibly the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub to: SocketAddr,
    /// The source address to send from (`IP_PKTINFO`); `None`: the socket's.
    pub from: Option<IpAddr>,
    /// The connection whose packets these are.
    pub conn: Slot,
    pub start: usize,
    pub len: usize,
    pub seg: usize,
    pub packets: usize,
    /// A shorter packet ended it.
    pub closed: bool,
    /// Departure time of the run's first packet (kernel pacing): the run leaves as one burst.
    pub departure: Option<udpx::Timestamp>,
}

/// Packets waiting to be sent, grouped into runs (see the module docs).
pub(crate) struct Outbox {
    buf: Vec<u8>,
    runs: Vec<Run>,
    cursor: SendCursor,
    bufs: SendBuffers,
    /// The list of transmits a flush hands the socket, kept empty between flushes so its
    /// allocation serves every flush (see [`udpx::recycle_transmits`]).
    spare: Vec<Transmit<'static>>,
    /// Zerocopy storage, when the socket has zerocopy (see the module docs).
    zc: Option<ZcStore>,
}

/// What [`Outbox::flush`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    /// Everything went.
    Done,
    /// The socket is full (EAGAIN): wait for writability.
    WouldBlock,
    /// The device queue is full (ENOBUFS): back off briefly.
    NoBuffers,
}

impl Outbox {
    pub fn new() -> Outbox {
        Outbox {
            buf: vec![0; OUTBOX_BYTES],
            runs: Vec::new(),
            cursor: SendCursor::default(),
            bufs: SendBuffers::new(),
            spare: Vec::new(),
            zc: None,
        }
    }

    /// Writes into pooled buffers from now on while `socket` has zerocopy on (a no-op when it
    /// has not).
    pub fn enable_zerocopy(&mut self, socket: &UdpSocket) {
        if self.zc.is_none() && socket.zerocopy_on() {
            let pool = ZcPool::new(OUTBOX_BYTES, ZEROCOPY_OUTBOXES);
            self.zc = Some(ZcStore { pool, cur: None, active: false });
            if self.runs.is_empty() {
                self.renew(socket, &mut HostCounters::default());
            }
        }
    }

    /// With the outbox empty: where the next runs go. A pooled buffer no send holds any more
    /// while zerocopy is on, else the outbox's own vector (counted when the pool ran dry).
    fn renew(&mut self, socket: &UdpSocket, c: &mut HostCounters) {
        let Some(z) = self.zc.as_mut() else { return };
        z.active = false;
        if !socket.zerocopy_on() {
            z.cur = None;
            return;
        }
        if z.cur.as_mut().is_some_and(|b| Arc::get_mut(b).is_some()) {
            z.active = true;
            return;
        }
        // The last buffer is in flight: take another (reading completions first if none is
        // free).
        z.cur = None;
        let mut next = z.pool.get();
        if next.is_none() {
            let _ = socket.reap_completions(None);
            next = z.pool.get();
        }
        match next {
            Some(b) => {
                z.cur = Some(Arc::new(b));
                z.active = true;
            }
            None => c.zerocopy_pool_empty += 1,
        }
    }

    fn end(&self) -> usize {
        self.runs.last().map_or(0, |r| r.start + r.len)
    }

    /// Free space for one more packet of up to `max` bytes, or `None` when full.
    pub fn space(&mut self, max: usize) -> Option<&mut [u8]> {
        let end = self.end();
        let store: &mut [u8] = match &mut self.zc {
            // Never shared while active: a send's share leaves only with the outbox empty,
            // and then `renew` picks a buffer no send holds.
            Some(ZcStore { cur: Some(b), active: true, .. }) => Arc::get_mut(b)?.full_mut(),
            _ => &mut self.buf,
        };
        (end + max <= store.len()).then(|| &mut store[end..end + max])
    }

    /// Whether packets wait to be sent.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Bytes of the packets that wait to be sent.
    pub fn pending_bytes(&self) -> usize {
        self.runs.first().map_or(0, |f| self.end() - f.start)
    }

    /// Appends the `len`-byte packet of connection `conn` just written into
    /// [`Outbox::space`], for `to` from `from`. A run is cut where the departure time moves
    /// more than quiche's own tolerance for one burst (50 us).
    pub fn commit(
        &mut self,
        conn: Slot,
        to: SocketAddr,
        from: Option<IpAddr>,
        len: usize,
        departure: Option<udpx::Timestamp>,
    ) {
        let start = self.end();
        if let Some(r) = self.runs.last_mut() {
            let same_time = match (r.departure, departure) {
                (Some(a), Some(b)) => a.as_nanos().abs_diff(b.as_nanos()) <= SAME_DEPARTURE_NS,
                (a, b) => a.is_none() == b.is_none(),
            };
            let fits = r.to == to
                && r.from == from
                && same_time
                && r.conn == conn
                && !r.closed
                && len <= r.seg
                && len > 0
                && r.packets < MAX_RUN_SEGMENTS
                && r.len + len <= udpx::max_payload(&to);
            if fits {
                r.len += len;
                r.packets += 1;
                r.closed = len < r.seg;
                return;
            }
        }
        self.runs.push(Run { to, from, conn, start, len, seg: len, packets: 1, closed: false, departure });
    }

    #[cfg(test)]
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Sends what waits, from where the last flush stopped. Hard errors (the kernel refused a
    /// transmit for good) skip that transmit, counted in `send_errors`: QUIC's loss recovery
    /// re-sends its frames.
    pub fn flush(&mut self, socket: &UdpSocket, c: &mut HostCounters) -> Flush {
        while !self.runs.is_empty() {
            let mut transmits: Vec<Transmit<'_>> = udpx::recycle_transmits(std::mem::take(&mut self.spare));
            let store = active(&self.zc).map_or(&self.buf[..], |b| b.full());
            transmits.extend(self.runs.iter().map(|r| {
                let mut t = Transmit::new(r.to, &store[r.start..r.start + r.len]);
                t.departure = r.departure;
                t.src_ip = r.from;
                if r.packets > 1 {
                    t.segmented(r.seg)
                } else {
                    t
                }
            }));
            let sent = match active(&self.zc) {
                Some(b) => socket.try_send_zerocopy(&mut self.bufs, &transmits, self.cursor, b),
                None => socket.try_send(&mut self.bufs, &transmits, self.cursor),
            };
            self.spare = udpx::recycle_transmits(transmits);
            match sent {
                Ok(_) => {
                    c.transmits += self.runs.len() as u64;
                    c.multi_packet_runs += self.runs.iter().filter(|r| r.packets > 1).count() as u64;
                    self.runs.clear();
                    self.cursor = SendCursor::default();
                    self.renew(socket, c);
                }
                Err(e) => {
                    self.cursor = e.cursor();
                    match e.kind {
                        SendErrorKind::WouldBlock => {
                            c.send_blocked += 1;
                            return Flush::WouldBlock;
                        }
                        SendErrorKind::NoBuffers => {
                            c.send_blocked += 1;
                            return Flush::NoBuffers;
                        }
                        _ => {
                            c.send_errors += 1;
                            log::warn!("udpx-quic: send failed, transmit skipped: {e}");
                            self.cursor = SendCursor { transmit: self.cursor.transmit + 1, segment: 0 };
                            if self.cursor.transmit >= self.runs.len() {
                                self.runs.clear();
                                self.cursor = SendCursor::default();
                                self.renew(socket, c);
                            }
                        }
                    }
                }
            }
        }
        Flush::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(o: &mut Outbox, to: SocketAddr, len: usize) {
        o.space(len).unwrap();
        o.commit(Slot(0), to, None, len, None);
    }

    #[test]
    fn runs_group_equal_sizes_to_one_peer() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let mut o = Outbox::new();
        for len in [1350, 1350, 1350, 400, 1350, 1350] {
            push(&mut o, a, len);
        }
        push(&mut o, b, 1350);
        push(&mut o, b, 1400); // larger than the run's segment: a new run
        let got: Vec<(u16, usize, usize, usize)> =
            o.runs().iter().map(|r| (r.to.port(), r.len, r.seg, r.packets)).collect();
        assert_eq!(got, vec![(1, 3 * 1350 + 400, 1350, 4), (1, 2700, 1350, 2), (2, 1350, 1350, 1), (2, 1400, 1400, 1)]);
    }

    #[test]
    fn runs_stop_at_the_segment_limit_and_the_largest_payload() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut o = Outbox::new();
        for _ in 0..MAX_RUN_SEGMENTS + 1 {
            push(&mut o, a, 1000);
        }
        assert_eq!(o.runs().iter().map(|r| r.packets).collect::<Vec<_>>(), vec![64, 1]);
        let mut o = Outbox::new();
        for _ in 0..40 {
            push(&mut o, a, 1700); // 38 * 1700 > 65507
        }
        assert!(o.runs().iter().all(|r| r.len <= udpx::MAX_PAYLOAD_V4));
        assert_eq!(o.runs().iter().map(|r| r.packets).sum::<usize>(), 40);
    }

    #[test]
    fn full_outbox_refuses_space() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut o = Outbox::new();
        let mut n = 0;
        while o.space(1500).is_some() {
            o.commit(Slot(0), a, None, 1500, None);
            n += 1;
        }
        assert_eq!(n, OUTBOX_BYTES / 1500);
    }

    #[test]
    fn flushes_reuse_one_transmit_list() {
        let (rx, rx2) =
            (std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let tx = udpx::UdpSocket::builder("127.0.0.1:0".parse().unwrap()).nonblocking(true).bind().unwrap();
        let (to, other) = (rx.local_addr().unwrap(), rx2.local_addr().unwrap());
        let mut o = Outbox::new();
        let mut c = HostCounters::default();
        let mut capacity = None;
        for _ in 0..3 {
            // Two peers: two runs, a list of two transmits.
            push(&mut o, to, 1200);
            push(&mut o, other, 700);
            assert_eq!(o.flush(&tx, &mut c), Flush::Done);
            assert!(o.spare.is_empty());
            let cap = o.spare.capacity();
            assert!(cap >= 2, "the list's allocation is kept: capacity {cap}");
            // The same allocation every time: the capacity never changes once grown.
            assert_eq!(*capacity.get_or_insert(cap), cap);
        }
        assert_eq!(c.transmits, 6);
    }

    /// A sending socket in `mode` with zerocopy kept on, and an outbox writing for it.
    fn zerocopy_outbox(mode: IoMode) -> (udpx::UdpSocket, Outbox) {
        let b = udpx::UdpSocket::builder("127.0.0.1:0".parse().unwrap()).send_mode(mode.send_mode());
        let tx = Zerocopy::Always.apply(b.nonblocking(true)).bind().unwrap();
        let mut o = Outbox::new();
        o.enable_zerocopy(&tx);
        (tx, o)
    }

    /// Twenty 1200-byte packets of `byte` to `to`: one 24 KB run, above the 16 KiB threshold.
    fn fill(o: &mut Outbox, to: SocketAddr, byte: u8) {
        for _ in 0..20 {
            o.space(1200).unwrap().fill(byte);
            o.commit(Slot(0), to, None, 1200, None);
        }
    }

    /// A buffer a zerocopy send holds is never written again before the kernel's completion:
    /// the next packets go into another pooled buffer, and the first is reused only once its
    /// completion was read.
    #[test]
    fn zerocopy_never_writes_a_buffer_in_flight() {
        if !udpx::KernelCaps::get().zerocopy {
            println!("SKIP: zerocopy_never_writes_a_buffer_in_flight: no SO_ZEROCOPY");
            return;
        }
        let rx = udpx::UdpSocket::builder("127.0.0.1:0".parse().unwrap()).recv_buffer(8 << 20).bind().unwrap();
        let (tx, mut o) = zerocopy_outbox(IoMode::GsoMmsg);
        let mut c = HostCounters::default();
        let base = |o: &mut Outbox| o.space(1).unwrap().as_ptr() as usize;
        let first = base(&mut o);
        fill(&mut o, rx.local_addr(), 1);
        assert_eq!(o.flush(&tx, &mut c), Flush::Done);
        assert_eq!(tx.zerocopy_in_flight(), 1, "the send is held until its completion is read");
        let second = base(&mut o);
        assert_ne!(first, second, "written again while the kernel may read it");
        fill(&mut o, rx.local_addr(), 2);
        assert_eq!(o.flush(&tx, &mut c), Flush::Done);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tx.zerocopy_in_flight() > 0 && std::time::Instant::now() < deadline {
            tx.reap_completions(Some(std::time::Duration::from_millis(100))).unwrap();
        }
        assert_eq!(tx.zerocopy_in_flight(), 0);
        // Every buffer back: the pool hands them out in turn, the first again among them.
        let mut seen = Vec::new();
        for round in 0..ZEROCOPY_OUTBOXES + 1 {
            seen.push(base(&mut o));
            fill(&mut o, rx.local_addr(), 3 + round as u8);
            assert_eq!(o.flush(&tx, &mut c), Flush::Done);
            while tx.zerocopy_in_flight() > 0 {
                tx.reap_completions(Some(std::time::Duration::from_millis(100))).unwrap();
            }
        }
        assert!(seen.contains(&first), "the first buffer came back to the pool");
        assert_eq!(c.zerocopy_pool_empty, 0);
        let s = tx.counters();
        assert!(s.zerocopy_sends >= ZEROCOPY_OUTBOXES as u64 + 3, "{s:?}");
        // Every datagram arrived whole, with the bytes written for it: 20 of each fill.
        let mut bufs = udpx::RecvBuffers::for_socket(&rx, 64);
        let mut got = std::collections::BTreeMap::<u8, usize>::new();
        while let Ok(n) = rx.try_recv_into(&mut bufs) {
            if n == 0 {
                break;
            }
            for (_, d) in bufs.datagrams() {
                assert!(d.len() == 1200 && d.iter().all(|&b| b == d[0]), "a datagram changed in flight");
                *got.entry(d[0]).or_default() += 1;
            }
        }
        assert_eq!(got.len(), ZEROCOPY_OUTBOXES + 3, "{got:?}");
        assert!(got.values().all(|&n| n == 20), "{got:?}");
    }

    /// Without GSO each packet is its own message: pinning a page per small datagram costs more
    /// than copying it, so those flushes copy even with zerocopy on.
    #[test]
    fn zerocopy_only_for_large_messages() {
        if !udpx::KernelCaps::get().zerocopy {
            println!("SKIP: zerocopy_only_for_large_messages: no SO_ZEROCOPY");
            return;
        }
        let rx = udpx::UdpSocket::builder("127.0.0.1:0".parse().unwrap()).recv_buffer(4 << 20).bind().unwrap();
        for (mode, want_zc) in [(IoMode::Sendmmsg, false), (IoMode::GsoMmsg, true)] {
            let (tx, mut o) = zerocopy_outbox(mode);
            fill(&mut o, rx.local_addr(), 7);
            assert_eq!(o.flush(&tx, &mut HostCounters::default()), Flush::Done);
            assert_eq!(tx.counters().zerocopy_sends > 0, want_zc, "{mode}: {:?}", tx.counters());
        }
    }

    #[test]
    fn io_mode_names_round_trip() {
        for m in IoMode::ALL {
            assert_eq!(m.name().parse::<IoMode>(), Ok(m));
        }
        assert!("gso-sendmmsg".parse::<IoMode>().unwrap_err().contains("gso-mmsg"));
    }
}
