//! The connection host: one event loop that owns a socket and the quiche connections on it.
//!
//! Each turn of [`Host::run`]:
//!
//! ```text
//!  poll (only when the last turn did nothing) ─► receive all queued (GRO buffers split)
//!    ─► each datagram: header → connection by DCID (or a new one from an Initial) → quiche recv
//!    ─► expired timers → on_timeout ─► the application's turn on every connection
//!    ─► each connection writes up to its send_quantum() into the outbox ─► flush ─► reap closed
//! ```
//!
//! Departure times: quiche's pacer stamps every packet with `SendInfo.at`. Where the egress
//! qdisc honours `SCM_TXTIME` (fq: [`udpx::qdisc`]), each transmit carries its first packet's
//! time and the kernel holds it ([`Pacing::Kernel`]; one departure per GSO run, so a run is one
//! burst, as in the Cloudflare post). Elsewhere (this machine: no fq) the host paces itself
//! ([`Pacing::Hold`]): a packet whose `at` is more than [`PACING_SLACK`] ahead is held, its
//! connection produces nothing more until then, and the loop sleeps (ppoll, ns resolution) to
//! the earliest held time. quiche's own pacer (BBRv2, `Bbr2Gcongestion`) mostly paces by
//! returning `Done` until the next release time and arming the connection's timer for it,
//! with `at` at most tens of microseconds ahead: so the loop waits with `ppoll` at nanosecond
//! resolution (a millisecond `poll` would round every release up to 1 ms). Besides, each
//! connection writes at most its `send_quantum()` per turn, and acknowledgements are read
//! between turns.
//!
//! Connection IDs: a server issues, besides the one it chose at the handshake, as many more as
//! the peer's `active_connection_id_limit` allows (NEW_CONNECTION_ID, with a random stateless
//! reset token), each made by the same [`CidGenerator`]: the same host ID and worker byte,
//! so a client that moves to a new ID (after a NAT rebinding or a change of network) still
//! reaches this host through a QUIC-LB balancer and this shard through the group's steering.
//! IDs the peer retires leave the table; the peer is given new ones in their place. With a
//! [`ResetKey`] shared by the service's hosts every ID's reset token is derived from it, and a
//! short-header packet for an ID this host does not know is answered with a stateless reset
//! (see [`crate::reset`]).
//!
//! No Retry: an Initial from an unknown address makes a connection at once (address
//! validation by Retry tokens is future work); the 3x amplification limit quiche enforces
//! holds until the handshake completes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Deref;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use udpx::{RecvBuffers, Shard, UdpSocket};

use crate::cid::{CidGenerator, CID_LEN};
use crate::counters::HostCounters;
use crate::io::{Flush, Outbox};
use crate::reset::{RateLimit, ResetKey};
use crate::Error;

/// Longest a loop sleeps in `poll` before it looks at its stop flag again.
const STOP_CHECK: Duration = Duration::from_millis(50);
/// Least time between two counter publications of a loop (each sums every connection's
/// quiche statistics).
const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// A packet due within this much of now leaves now (less is below what a wake-up can hit).
pub const PACING_SLACK: Duration = Duration::from_micros(200);

/// Who holds packets to their departure time (`SendInfo.at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Nobody: every packet leaves at once.
    Off,
    /// The host: packets due later are held and sent at their time.
    Hold,
    /// The qdisc (fq): each transmit carries its departure time (`SCM_TXTIME`, the socket
    /// needs `SO_TXTIME`).
    Kernel,
}

/// A packet held until its departure time.
struct Held {
    at: Instant,
    conn: usize,
    to: SocketAddr,
    bytes: Vec<u8>,
}

/// Receive calls per turn at most, so that sending is never starved by a flood.
const RECV_CALLS_PER_TURN: usize = 16;
/// Receive buffers per call.
const RECV_BUFFERS: usize = 8;

/// What runs on the connections: the HTTP/3 server, a client. The host calls it from its own
/// thread; it does no I/O of its own on the socket.
pub trait App {
    /// Per-connection state.
    type State;
    /// A server connection was accepted: its state. (If the Initial that made it then fails
    /// to decrypt, the connection and this state are dropped at once, without [`App::closed`].)
    fn accepted(&mut self, conn: &quiche::Connection) -> Self::State;
    /// The application's turn on `conn`, every loop turn after the packets were fed: read
    /// what arrived, write what the streams can take.
    fn on_turn(&mut self, conn: &mut quiche::Connection, state: &mut Self::State);
    /// `conn` is closed and about to be dropped.
    fn closed(&mut self, conn: &quiche::Connection, state: Self::State);
}

/// The socket a host serves: a shard of a group, or its own.
#[derive(Debug)]
pub enum HostSocket {
    /// One socket of a reuseport shard group.
    Shard(Shard),
    /// A socket of its own (a client).
    Own(Box<UdpSocket>),
}

impl Deref for HostSocket {
    type Target = UdpSocket;
    fn deref(&self) -> &UdpSocket {
        match self {
            HostSocket::Shard(s) => s,
            HostSocket::Own(s) => s,
        }
    }
}

/// A connection ID as a map key, without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CidKey {
    len: u8,
    bytes: [u8; quiche::MAX_CONN_ID_LEN],
}

impl CidKey {
    fn new(cid: &[u8]) -> CidKey {
        let mut bytes = [0u8; quiche::MAX_CONN_ID_LEN];
        let n = cid.len().min(bytes.len());
        bytes[..n].copy_from_slice(&cid[..n]);
        CidKey { len: n as u8, bytes }
    }
}

struct Entry<S> {
    conn: quiche::Connection,
    state: S,
    keys: Vec<CidKey>,
    /// A packet of this connection is held until then: produce nothing more before.
    hold_until: Option<Instant>,
}

/// One event loop over one socket (see the module docs).
pub struct Host<A: App> {
    socket: HostSocket,
    local: SocketAddr,
    config: quiche::Config,
    accepting: bool,
    cids: CidGenerator,
    conns: Vec<Option<Entry<A::State>>>,
    free: Vec<usize>,
    by_cid: HashMap<CidKey, usize>,
    recv: Option<RecvBuffers>,
    out: Outbox,
    blocked: Option<Flush>,
    app: A,
    counters: HostCounters,
    next_first: usize,
    /// The socket's `icmp_errors` when last looked at.
    icmp_seen: u64,
    pacing: Pacing,
    held: Vec<Held>,
    /// `Instant` and `CLOCK_MONOTONIC` read together, to turn `SendInfo.at` into a departure.
    anchor: (Instant, udpx::Timestamp),
    /// Derives reset tokens and allows resets; `None`: random tokens, no resets.
    reset_key: Option<ResetKey>,
    resets: RateLimit,
}

impl<A: App> std::fmt::Debug for Host<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("local", &self.local).field("connections", &self.by_cid.len()).finish()
    }
}

impl<A: App> Host<A> {
    /// A host on `socket` (which must be non-blocking) that accepts connections (`accepting`)
    /// with IDs of host `host_id`, worker `worker`, or only serves those added with
    /// [`Host::connect`].
    pub fn new(socket: HostSocket, config: quiche::Config, app: A, accepting: bool, host_id: u16, worker: u8) -> Self {
        let recv = RecvBuffers::for_socket(&socket, RECV_BUFFERS);
        Host {
            local: socket.local_addr(),
            socket,
            config,
            accepting,
            cids: CidGenerator::new(host_id, worker),
            conns: Vec::new(),
            free: Vec::new(),
            by_cid: HashMap::new(),
            recv: Some(recv),
            out: Outbox::new(),
            blocked: None,
            app,
            counters: HostCounters::default(),
            next_first: 0,
            icmp_seen: 0,
            pacing: Pacing::Hold,
            held: Vec::new(),
            anchor: (Instant::now(), udpx::Timestamp::now()),
            reset_key: None,
            resets: RateLimit::default(),
        }
    }

    /// Derives every connection ID's stateless reset token from `key` (shared by the hosts of
    /// one service) and answers packets for unknown IDs with a stateless reset (see
    /// [`crate::reset`]). Set it before the first connection.
    pub fn set_reset_key(&mut self, key: ResetKey) {
        self.reset_key = Some(key);
    }

    /// Sets who paces (default [`Pacing::Hold`]). [`Pacing::Kernel`] needs a socket with
    /// `SO_TXTIME` and an fq egress qdisc to mean anything; see [`pacing_for`].
    pub fn set_pacing(&mut self, p: Pacing) {
        self.pacing = p;
    }

    /// Who paces.
    pub fn pacing(&self) -> Pacing {
        self.pacing
    }

    /// The socket's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The application.
    pub fn app(&self) -> &A {
        &self.app
    }

    /// The application, writable.
    pub fn app_mut(&mut self) -> &mut A {
        &mut self.app
    }

    /// Connections open.
    pub fn connection_count(&self) -> usize {
        self.conns.len() - self.free.len()
    }

    /// Opens a client connection to `peer` with a random 12-byte source ID; `state` is the
    /// application's.
    pub fn connect(&mut self, server_name: Option<&str>, peer: SocketAddr, state: A::State) -> Result<(), Error> {
        let mut scid = [0u8; CID_LEN];
        crate::cid::random_bytes(&mut scid).map_err(Error::Io)?;
        let scid_ref = quiche::ConnectionId::from_ref(&scid);
        let conn = quiche::connect(server_name, &scid_ref, self.local, peer, &mut self.config)
            .map_err(|e| Error::Quic("connect", e))?;
        self.counters.connections += 1;
        self.insert(conn, state, &[CidKey::new(&scid)]);
        Ok(())
    }

    fn insert(&mut self, conn: quiche::Connection, state: A::State, keys: &[CidKey]) -> usize {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        for k in keys {
            self.by_cid.insert(*k, idx);
        }
        self.conns[idx] = Some(Entry { conn, state, keys: keys.to_vec(), hold_until: None });
        idx
    }

    /// The counters so far, the socket's own included.
    pub fn counters(&self) -> HostCounters {
        let s = self.socket.counters();
        let mut c = self.counters.clone();
        c.send_calls = s.send_calls;
        c.datagrams_sent = s.datagrams_sent;
        c.gso_fallbacks = s.gso_fallbacks;
        c.gso_runs = s.gso_buffers_sent;
        c.recv_calls = s.recv_calls;
        c.gro_buffers = s.gro_buffers_received;
        c.icmp_errors = s.icmp_errors;
        for e in self.conns.iter().flatten() {
            let st = e.conn.stats();
            c.lost_packets += st.lost as u64;
            c.retransmitted += st.retrans as u64;
        }
        c.add(&HostCounters::default())
    }

    /// Runs until `stop` is set, or (`until_idle`) until no connection is left.
    /// `publish` receives the counters when the loop is about to wait (at most every 100 ms)
    /// and when it ends.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        until_idle: bool,
        publish: Option<&Mutex<HostCounters>>,
    ) -> Result<(), Error> {
        let mut idle = false;
        let mut published: Option<Instant> = None;
        loop {
            if stop.load(Ordering::Relaxed) || (until_idle && self.connection_count() == 0) {
                break;
            }
            if idle {
                if let Some(p) = publish.filter(|_| published.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY)) {
                    *p.lock().unwrap_or_else(|e| e.into_inner()) = self.counters();
                    published = Some(Instant::now());
                }
                self.wait()?;
            }
            let got = self.receive()?;
            self.check_unreachable();
            self.timers();
            self.app_turns();
            self.issue_cids();
            let sent = self.send();
            self.reap();
            // Blocked: wait for writability (or back off) before the next flush.
            idle = self.blocked.is_some() || (got == 0 && sent == 0);
        }
        if let Some(p) = publish {
            *p.lock().unwrap_or_else(|e| e.into_inner()) = self.counters();
        }
        Ok(())
    }

    /// Waits for a datagram, writability when blocked, or the next timer.
    fn wait(&mut self) -> Result<(), Error> {
        let now = Instant::now();
        let mut timeout = STOP_CHECK;
        for e in self.conns.iter().flatten() {
            if let Some(t) = e.conn.timeout_instant() {
                timeout = timeout.min(t.saturating_duration_since(now));
            }
        }
        for h in &self.held {
            timeout = timeout.min(h.at.saturating_duration_since(now + PACING_SLACK));
        }
        let mut flags = PollFlags::POLLIN;
        match self.blocked {
            Some(Flush::WouldBlock) => flags |= PollFlags::POLLOUT,
            Some(Flush::NoBuffers) => timeout = timeout.min(Duration::from_micros(500)),
            _ => {}
        }
        if timeout.is_zero() {
            return Ok(());
        }
        // ppoll: a held packet may be due in a few hundred microseconds.
        let mut fds = [PollFd::new(self.socket.as_fd(), flags)];
        let err = match nix::poll::ppoll(&mut fds, Some(nix::sys::time::TimeSpec::from_duration(timeout)), None) {
            Ok(_) => fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLERR)),
            Err(nix::errno::Errno::EINTR) => false,
            Err(e) => return Err(Error::Io(e.into())),
        };
        if err {
            // ICMP errors queued (IP_RECVERR): read them, or POLLERR stays raised and the
            // loop spins. The socket counts them (`icmp_errors`).
            if let Err(e) = self.socket.drain_errors(|_| {}) {
                self.counters.recv_errors += 1;
                log::debug!("udpx-quic: reading the error queue failed (counted): {e}");
            }
        }
        Ok(())
    }

    /// A client gives up on connections that never heard from their server once ICMP errors
    /// arrive (port unreachable: nothing listens there), instead of waiting for the idle
    /// timeout. A server never does: anyone can send it ICMP errors.
    fn check_unreachable(&mut self) {
        if self.accepting {
            return;
        }
        let n = self.socket.counters().icmp_errors;
        if n == self.icmp_seen {
            return;
        }
        self.icmp_seen = n;
        for e in self.conns.iter_mut().flatten() {
            if e.conn.stats().recv == 0 {
                let _ = e.conn.close(false, 0x0, b"peer unreachable");
            }
        }
    }

    /// Receives what is queued; returns the datagrams fed.
    fn receive(&mut self) -> Result<usize, Error> {
        let Some(mut bufs) = self.recv.take() else { return Ok(0) };
        let mut fed = 0;
        let mut result = Ok(());
        for _ in 0..RECV_CALLS_PER_TURN {
            match self.socket.try_recv_into(&mut bufs) {
                Ok(0) => break,
                Ok(n) => {
                    for i in 0..n {
                        let (meta, data) = bufs.message_mut(i);
                        let meta = *meta;
                        if meta.truncated || meta.segment_count() == 0 {
                            self.counters.dropped_truncated += 1;
                            continue;
                        }
                        let stride = if meta.stride == 0 { data.len().max(1) } else { meta.stride };
                        if data.is_empty() {
                            self.counters.dropped_unparseable += 1;
                            continue;
                        }
                        for d in data.chunks_mut(stride) {
                            fed += 1;
                            self.counters.datagrams_received += 1;
                            self.counters.bytes_received += d.len() as u64;
                            self.datagram(meta.addr, d);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // Only a broken descriptor or a bug ends the loop; anything the network can
                // cause (the library already keeps ICMP errors out) is counted and the loop
                // goes on.
                Err(e) if is_fatal(&e) => {
                    result = Err(Error::Io(e));
                    break;
                }
                Err(e) => {
                    self.counters.recv_errors += 1;
                    log::debug!("udpx-quic: receive failed (counted, serving on): {e}");
                    break;
                }
            }
        }
        self.recv = Some(bufs);
        result.map(|_| fed)
    }

    /// One datagram from `from`.
    fn datagram(&mut self, from: SocketAddr, buf: &mut [u8]) {
        let hdr = match quiche::Header::from_slice(buf, CID_LEN) {
            Ok(h) => h,
            Err(_) => {
                self.counters.dropped_unparseable += 1;
                return;
            }
        };
        let key = CidKey::new(&hdr.dcid);
        let (idx, fresh) = match self.by_cid.get(&key) {
            Some(&i) => (i, false),
            // A stateless reset carries none of our connection IDs: it goes to the connection
            // whose peer's reset token ends it (quiche then checks it and closes).
            None if !self.accepting && hdr.ty == quiche::Type::Short => match self.reset_target(from, buf) {
                Some(i) => {
                    self.counters.resets_received += 1;
                    (i, false)
                }
                None => {
                    self.counters.dropped_unknown_cid += 1;
                    return;
                }
            },
            None => match self.new_connection(from, &hdr, buf.len()) {
                Some(i) => (i, true),
                None => return,
            },
        };
        let Some(e) = self.conns[idx].as_mut() else { return };
        let info = quiche::RecvInfo { from, to: self.local };
        match e.conn.recv(buf, info) {
            Ok(_) | Err(quiche::Error::Done) => {
                if fresh {
                    self.counters.connections += 1;
                }
            }
            Err(err) => {
                self.counters.dropped_by_quic += 1;
                log::debug!("udpx-quic: {} refused a datagram from {from}: {err}", e.conn.trace_id());
                if fresh {
                    // An Initial that does not decrypt leaves no state behind.
                    self.remove(idx);
                }
            }
        }
    }

    /// A connection for an Initial to an unknown DCID, or `None` (counted) when it cannot
    /// start one.
    fn new_connection(&mut self, from: SocketAddr, hdr: &quiche::Header<'_>, len: usize) -> Option<usize> {
        if !self.accepting || hdr.ty != quiche::Type::Initial {
            self.counters.dropped_unknown_cid += 1;
            if self.accepting && hdr.ty == quiche::Type::Short {
                self.stateless_reset(from, &hdr.dcid, len);
            }
            return None;
        }
        if !quiche::version_is_supported(hdr.version) {
            let mut out = [0u8; 1350];
            if let Ok(n) = quiche::negotiate_version(&hdr.scid, &hdr.dcid, &mut out) {
                self.send_now(from, &out[..n], "version negotiation");
                self.counters.version_negotiations += 1;
            }
            return None;
        }
        if len < quiche::MIN_CLIENT_INITIAL_LEN || hdr.dcid.len() < 8 {
            self.counters.dropped_bad_initial += 1;
            return None;
        }
        let Some(scid) = fresh_cid(&mut self.cids, &self.by_cid) else {
            self.counters.accept_errors += 1;
            return None;
        };
        if let Some(k) = &self.reset_key {
            self.config.set_stateless_reset_token(Some(k.token(&scid)));
        }
        let scid_ref = quiche::ConnectionId::from_ref(&scid);
        let conn = match quiche::accept(&scid_ref, None, self.local, from, &mut self.config) {
            Ok(c) => c,
            Err(e) => {
                self.counters.accept_errors += 1;
                log::debug!("udpx-quic: accept from {from} failed: {e}");
                return None;
            }
        };
        let state = self.app.accepted(&conn);
        // Both IDs lead to it: ours, and the one the client chose, which its retransmitted
        // Initials still carry.
        Some(self.insert(conn, state, &[CidKey::new(&scid), CidKey::new(&hdr.dcid)]))
    }

    fn timers(&mut self) {
        let now = Instant::now();
        for e in self.conns.iter_mut().flatten() {
            if e.conn.timeout_instant().is_some_and(|t| t <= now) {
                e.conn.on_timeout();
            }
        }
    }

    fn app_turns(&mut self) {
        for e in self.conns.iter_mut().flatten() {
            if e.conn.is_established() || e.conn.is_in_early_data() {
                self.app.on_turn(&mut e.conn, &mut e.state);
            }
        }
    }

    /// Lets every connection write up to its send quantum, round robin, and flushes. Returns
    /// the packets produced.
    fn send(&mut self) -> usize {
        if !self.out.is_empty() {
            let f = self.out.flush(&self.socket, &mut self.counters);
            if f != Flush::Done {
                self.blocked = Some(f);
                return 0;
            }
        }
        self.blocked = None;
        let mut produced = 0;
        let now = Instant::now();
        self.release_held(now);
        let n = self.conns.len();
        if n == 0 {
            return 0;
        }
        self.next_first = (self.next_first + 1) % n;
        for k in 0..n {
            let idx = (self.next_first + k) % n;
            let Some(e) = self.conns[idx].as_mut() else { continue };
            if e.hold_until.is_some() {
                continue; // a packet of it waits for its time
            }
            let max = e.conn.max_send_udp_payload_size();
            let mut budget = e.conn.send_quantum().max(max);
            while budget > 0 {
                let space = match self.out.space(max) {
                    Some(s) => s,
                    None => {
                        let f = self.out.flush(&self.socket, &mut self.counters);
                        if f != Flush::Done {
                            self.blocked = Some(f);
                            return produced;
                        }
                        continue;
                    }
                };
                match e.conn.send(space) {
                    Ok((len, info)) => {
                        self.counters.packets_sent += 1;
                        self.counters.bytes_sent += len as u64;
                        produced += 1;
                        budget = budget.saturating_sub(len);
                        if self.pacing == Pacing::Hold && info.at > now + PACING_SLACK {
                            // Not yet: keep it (the only copy made), and the connection's
                            // later packets behind it.
                            let bytes = space[..len].to_vec();
                            self.held.push(Held { at: info.at, conn: idx, to: info.to, bytes });
                            e.hold_until = Some(info.at);
                            self.counters.paced_holds += 1;
                            break;
                        }
                        let departure = (self.pacing == Pacing::Kernel).then(|| departure(self.anchor, info.at));
                        self.out.commit(idx, info.to, len, departure);
                    }
                    Err(quiche::Error::Done) => break,
                    Err(err) => {
                        log::debug!("udpx-quic: {} send failed: {err}", e.conn.trace_id());
                        let _ = e.conn.close(false, 0x1, b"send failed");
                        break;
                    }
                }
            }
        }
        let f = self.out.flush(&self.socket, &mut self.counters);
        if f != Flush::Done {
            self.blocked = Some(f);
        }
        produced
    }

    /// Moves the held packets now due into the outbox, each connection's in order, and lets
    /// their connections produce again.
    fn release_held(&mut self, now: Instant) {
        if self.held.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].at > now + PACING_SLACK {
                i += 1;
                continue;
            }
            let len = self.held[i].bytes.len();
            let Some(space) = self.out.space(len) else { break };
            let h = self.held.swap_remove(i);
            space[..len].copy_from_slice(&h.bytes);
            self.out.commit(h.conn, h.to, len, None);
            if let Some(e) = self.conns.get_mut(h.conn).and_then(Option::as_mut) {
                e.hold_until = None;
            }
        }
    }

    /// The connection to `from` whose peer's stateless reset token ends `buf`, if any.
    fn reset_target(&self, from: SocketAddr, buf: &[u8]) -> Option<usize> {
        let tail = buf.len().checked_sub(16).filter(|_| buf.len() >= 21).map(|at| &buf[at..])?;
        self.conns.iter().position(|slot| {
            slot.as_ref().is_some_and(|e| {
                e.conn.path_stats().any(|p| p.peer_addr == from)
                    && e.conn
                        .peer_transport_params()
                        .and_then(|tp| tp.stateless_reset_token)
                        .is_some_and(|t| t.to_be_bytes() == tail)
            })
        })
    }

    /// Answers a short-header packet of `len` bytes for the unknown connection ID `dcid` with
    /// a stateless reset, when a key is set, the packet is long enough and the rate allows.
    fn stateless_reset(&mut self, to: SocketAddr, dcid: &[u8], len: usize) {
        let Some(key) = &self.reset_key else { return };
        // A short header does not say how long its DCID is: this service's are CID_LEN.
        let Some(cid) = dcid.get(..CID_LEN) else { return };
        let mut random = [0u8; 64];
        let mut out = [0u8; 64];
        if crate::cid::random_bytes(&mut random).is_err() {
            return;
        }
        let Some(n) = key.write_reset(cid, len, &random, &mut out) else { return };
        if !self.resets.allow(Instant::now()) {
            self.counters.resets_limited += 1;
            return;
        }
        self.send_now(to, &out[..n], "stateless reset");
        self.counters.stateless_resets += 1;
    }

    /// Sends one datagram outside the outbox (version negotiation, stateless reset): once,
    /// without waiting; a refusal is logged (the peer will send again).
    fn send_now(&self, to: SocketAddr, bytes: &[u8], what: &str) {
        if let Err(e) = self.socket.try_send(
            &mut udpx::SendBuffers::new(),
            &[udpx::Transmit::new(to, bytes)],
            udpx::SendCursor::default(),
        ) {
            log::debug!("udpx-quic: {what} to {to} not sent: {e}");
        }
    }

    /// Forgets the connection IDs peers retired; a server offers every established
    /// connection as many new ones as its peer takes (see the module docs).
    fn issue_cids(&mut self) {
        for (idx, slot) in self.conns.iter_mut().enumerate() {
            let Some(e) = slot.as_mut() else { continue };
            while let Some(old) = e.conn.retired_scid_next() {
                let k = CidKey::new(&old);
                self.by_cid.remove(&k);
                e.keys.retain(|x| *x != k);
            }
            if !self.accepting || !e.conn.is_established() || e.conn.is_closed() {
                continue;
            }
            // Bounded: a peer's limit is at most what we advertise (quiche: the minimum of
            // both), but a broken peer must not make this loop spin.
            for _ in 0..MAX_ISSUED_PER_TURN {
                if e.conn.scids_left() == 0 {
                    break;
                }
                let Some(cid) = fresh_cid(&mut self.cids, &self.by_cid) else { break };
                let token = match &self.reset_key {
                    Some(k) => k.token(&cid),
                    None => {
                        let mut t = [0u8; 16];
                        if crate::cid::random_bytes(&mut t).is_err() {
                            break;
                        }
                        u128::from_ne_bytes(t)
                    }
                };
                match e.conn.new_scid(&quiche::ConnectionId::from_ref(&cid), token, false) {
                    Ok(_) => {
                        let k = CidKey::new(&cid);
                        self.by_cid.insert(k, idx);
                        e.keys.push(k);
                        self.counters.cids_issued += 1;
                    }
                    Err(err) => {
                        log::debug!("udpx-quic: {}: no new connection ID: {err}", e.conn.trace_id());
                        break;
                    }
                }
            }
        }
    }

    fn reap(&mut self) {
        for idx in 0..self.conns.len() {
            let closed = self.conns[idx].as_mut().is_some_and(|e| e.conn.is_closed());
            if !closed {
                continue;
            }
            let Some(e) = self.remove(idx) else { continue };
            let st = e.conn.stats();
            self.counters.lost_packets += st.lost as u64;
            self.counters.retransmitted += st.retrans as u64;
            self.counters.closed += 1;
            self.app.closed(&e.conn, e.state);
        }
    }

    /// Takes connection `idx` out of the table.
    fn remove(&mut self, idx: usize) -> Option<Entry<A::State>> {
        let e = self.conns[idx].take()?;
        for k in &e.keys {
            self.by_cid.remove(k);
        }
        // A closed connection's held packet goes nowhere (its slot may be reused).
        self.held.retain(|h| h.conn != idx);
        self.free.push(idx);
        Some(e)
    }
}

/// New connection IDs offered to one connection in one turn, at most.
const MAX_ISSUED_PER_TURN: usize = 8;

/// A connection ID of this host that no connection uses; `None` without randomness.
fn fresh_cid(cids: &mut CidGenerator, by_cid: &HashMap<CidKey, usize>) -> Option<[u8; CID_LEN]> {
    loop {
        match cids.next_cid() {
            Ok(c) if !by_cid.contains_key(&CidKey::new(&c)) => return Some(c),
            Ok(_) => continue,
            Err(e) => {
                log::warn!("udpx-quic: no randomness for a connection ID: {e}");
                return None;
            }
        }
    }
}

/// `SendInfo.at` as a departure on `CLOCK_MONOTONIC`, through an (`Instant`, `Timestamp`)
/// pair read together.
fn departure(anchor: (Instant, udpx::Timestamp), at: Instant) -> udpx::Timestamp {
    match at.checked_duration_since(anchor.0) {
        Some(d) => anchor.1 + d,
        None => anchor.1, // before the anchor: due already
    }
}

/// Who should pace traffic to `peer` from this namespace: the kernel where the route's egress
/// qdisc honours departure times on `CLOCK_MONOTONIC` (fq), else the host.
pub fn pacing_for(peer: std::net::IpAddr) -> Pacing {
    match udpx::qdisc::egress(peer) {
        Ok(e) if e.pacing == udpx::qdisc::KernelPacing::Fq => Pacing::Kernel,
        _ => Pacing::Hold,
    }
}

/// Whether a receive error means the socket itself is unusable (a bug or a closed
/// descriptor), not something a datagram or an ICMP message could cause.
pub(crate) fn is_fatal(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EBADF | libc::EFAULT | libc::ENOTSOCK | libc::EINVAL))
}

/// A counters cell a running host publishes into.
pub type SharedCounters = Arc<Mutex<HostCounters>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departure_times_follow_the_anchor() {
        let anchor = (Instant::now(), udpx::Timestamp::from_nanos(1_000_000_000));
        let later = anchor.0 + Duration::from_micros(300);
        assert_eq!(departure(anchor, later).as_nanos(), 1_000_300_000);
        let earlier = anchor.0.checked_sub(Duration::from_millis(1)).unwrap_or(anchor.0);
        assert_eq!(departure(anchor, earlier).as_nanos(), 1_000_000_000, "due already: the anchor");
    }

    #[test]
    fn loopback_is_paced_by_the_host() {
        assert_eq!(pacing_for("127.0.0.1".parse().unwrap()), Pacing::Hold, "lo's noqueue ignores SO_TXTIME");
    }
}
