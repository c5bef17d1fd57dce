//! The connection host: one event loop that owns a socket and the quiche connections on it,
//! and does work in proportion to the connections that have work.
//!
//! ```text
//!  wait (ppoll, ns) only when nothing is ready ─► receive (GRO buffers split)
//!    ─► each datagram → connection by DCID (a new one from an Initial: admission, Retry)
//!         → quiche recv → the connection is ready
//!    ─► timers due (one deadline per connection: quiche's timer, a pacing hold, the
//!         handshake deadline) → on_timeout → ready
//!    ─► serve the ready connections, round robin, each once: the application's turn, new
//!         connection IDs, up to its quantum of packets into the outbox; closed ones leave;
//!         each is re-keyed in the timers; one with more to send goes to the back
//!    ─► flush: the outbox's GSO runs of every connection served, in few sendmmsg calls
//! ```
//!
//! Nothing walks the connection table per turn: a connection is touched when a datagram for
//! it arrives, when its deadline passes, or when it is still sending (see [`crate::timers`]
//! and [`crate::ready`]). 10,000 idle connections cost a turn nothing. The counters are kept
//! as the work happens (a connection's losses are added as they are seen when it is served),
//! never summed over the table.
//!
//! Fairness: a connection writes at most its quantum per turn ([`QUANTUM_PACKETS`] packets,
//! or quiche's `send_quantum()` when that is smaller), then waits behind every other ready
//! connection, so a large download never delays a small one by more than one quantum.
//!
//! Departure times: quiche's pacer stamps every packet with `SendInfo.at`. Where the egress
//! qdisc honours `SCM_TXTIME` (fq: [`udpx::qdisc`]), each transmit carries its first packet's
//! time and the kernel holds it ([`Pacing::Kernel`]; a GSO run is cut where the time moves
//! more than quiche's own tolerance, 50 us). Elsewhere (this machine: no fq) the host paces
//! itself ([`Pacing::Hold`]): a packet whose `at` is more than [`PACING_SLACK`] ahead is held
//! (the connection's one held packet), the connection's deadline is its time, and the loop
//! sleeps with `ppoll` (ns resolution) to the earliest deadline. Under BBRv2
//! (`bbr2_gcongestion`) quiche mostly paces by returning `Done` until the next release and
//! arming its timer for it, which the same deadline covers.
//!
//! Connection IDs: a server issues, besides the one it chose at the handshake, as many more as
//! the peer's `active_connection_id_limit` allows (NEW_CONNECTION_ID, with a reset token),
//! each made by the same [`CidGenerator`]: the same host ID and worker byte, so a client that
//! moves to a new ID still reaches this host through a QUIC-LB balancer and this shard
//! through the group's steering. With shared [`ServiceKeys`] every ID's reset token is derived
//! from the service's secret and a short-header packet for an unknown ID is answered with a
//! stateless reset (see [`crate::reset`]).
//!
//! Admission ([`crate::admission`]): caps on connections, half-open handshakes and
//! connections per address; a handshake not done within its deadline is dropped; Retry with
//! address-bound tokens ([`crate::token`]) always, never, or while under an Initial flood.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::poll::{PollFd, PollFlags};
use udpx::{RecvBuffers, Shard, UdpSocket};

use crate::admission::{Admission, Admit, Cap, Limits, Rate};
use crate::bufs::Connection;
use crate::cid::{CidGenerator, CID_LEN};
use crate::counters::HostCounters;
use crate::io::{Flush, Outbox};
use crate::pacing::{departure, Held, Pacing, PACING_SLACK};
use crate::ready::ReadyQueue;
use crate::timers::Timers;
use crate::token::{ServiceKeys, TokenError, TokenKey};
use crate::Error;

/// Longest a loop sleeps in `poll` before it looks at its stop flag again.
const STOP_CHECK: Duration = Duration::from_millis(50);
/// Least time between two counter publications of a loop.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// Receive calls per turn at most, so that sending is never starved by a flood.
const RECV_CALLS_PER_TURN: usize = 16;
/// Receive buffers per call.
const RECV_BUFFERS: usize = 8;
/// Packets one connection writes per turn at most (its quantum): a GSO run's worth.
pub const QUANTUM_PACKETS: usize = 64;

/// How much one connection writes per turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Burst {
    /// quiche's `send_quantum()` (its advice: under CUBIC about ten packets), at most
    /// [`QUANTUM_PACKETS`].
    #[default]
    Quantum,
    /// What the congestion window and the stream data allow, at most [`QUANTUM_PACKETS`]:
    /// fewer, larger GSO runs per byte. Measured on veth (`udpx bench h3 --burst window`):
    /// about 0.6x the CPU per byte of `Quantum` for one bulk download, a sixth of the send
    /// calls. Safe only where the congestion controller paces (BBRv2, the host holding each
    /// packet to its release time): unpaced (CUBIC), a 64-packet burst overflows a bottleneck
    /// queue shorter than it (`udpx bench h3 --bottleneck 500 --bottleneck-buffer 1`: about 20
    /// times the losses of `Quantum`), paced it lost nothing there.
    Window,
}

/// A turn that leaves connections ready keeps its packets for the next turn while they are
/// fewer bytes than this (about 44 full packets), so that turn's join them in one send call.
const DEFER_BELOW: usize = 64 << 10;
/// New connection IDs offered to one connection in one turn, at most.
const MAX_ISSUED_PER_TURN: usize = 8;

/// What runs on the connections: the HTTP/3 server, a client. The host calls it from its own
/// thread; it does no I/O of its own on the socket.
pub trait App {
    /// Per-connection state.
    type State;
    /// A server connection was accepted: its state. (If the Initial that made it then fails
    /// to decrypt, the connection and this state are dropped at once, without [`App::closed`].)
    fn accepted(&mut self, conn: &Connection) -> Self::State;
    /// The application's turn on `conn`: called when the connection has had news (packets
    /// arrived, a timer fired, it is still sending) and is established or in early data, and
    /// only then. Read what arrived; write what the streams can take (quiche's
    /// `stream_writable_next()` names the streams that became writable since).
    fn on_turn(&mut self, conn: &mut Connection, state: &mut Self::State);
    /// When the application wants its next turn on a connection even if nothing arrives (a
    /// client that sends on a schedule, a step to take on the next turn): part of the
    /// connection's deadline, asked after each of its turns. Default: never.
    fn wake_at(&self, state: &Self::State) -> Option<Instant> {
        let _ = state;
        None
    }
    /// `conn` is closed and about to be dropped.
    fn closed(&mut self, conn: &Connection, state: Self::State);
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
    conn: Connection,
    state: S,
    keys: Vec<CidKey>,
    /// The address it counts against in the admission caps.
    peer_ip: IpAddr,
    /// Its local address (quiche's path): the unspecified address for a client connection
    /// that lets the kernel choose.
    local: SocketAddr,
    /// Its handshake completed (counted once).
    established: bool,
    /// Dropped if not established by then (server connections).
    handshake_deadline: Option<Instant>,
    /// Its one packet waiting for its departure time: it produces nothing more before.
    held: Option<Held>,
    /// quiche's lost and retransmitted counts already added to the host's counters.
    seen_lost: u64,
    seen_retrans: u64,
    /// quiche's timers fired since its last turn: a path the peer left may hold stranded
    /// packets ([`Host::resend_stranded`]).
    timed_out: bool,
    /// PTOs of the paths other than the active one, as last seen by `resend_stranded`.
    left_ptos: usize,
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
    timers: Timers,
    ready: ReadyQueue,
    recv: Option<RecvBuffers>,
    out: Outbox,
    blocked: Option<Flush>,
    app: A,
    counters: HostCounters,
    /// The socket's `icmp_errors` when last looked at.
    icmp_seen: u64,
    pacing: Pacing,
    burst: Burst,
    /// The timers' clock: deadlines are ns since this.
    epoch: Instant,
    /// `Instant` and `CLOCK_MONOTONIC` read together, to turn `SendInfo.at` into a departure.
    anchor: (Instant, udpx::Timestamp),
    keys: ServiceKeys,
    /// The shards of its group, for [`crate::reset::may_reset`].
    shards: usize,
    /// Hosts whose IDs it resets besides its own.
    removed_hosts: crate::reset::RemovedHosts,
    token_key: TokenKey,
    /// The session ticket key's period in force (server).
    ticket_period: Option<u64>,
    answers: Rate,
    admission: Admission,
    /// The last turn found nothing to do: the next one waits first.
    idle: bool,
    /// The least time between the starts of two turns while work keeps coming (zero: none).
    coalesce: Duration,
    /// Whether a turn may keep its packets for the next one ([`Host::set_deferred_flush`]).
    defer_flush: bool,
    /// The last turn kept its packets for this one (see `serve`).
    deferred: bool,
    /// A connection served this turn wrote its quantum and went back to the ready queue.
    more_this_turn: bool,
    /// When the last turn started.
    last_turn: Instant,
}

impl<A: App> std::fmt::Debug for Host<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("local", &self.local).field("connections", &self.connection_count()).finish()
    }
}

impl<A: App> Host<A> {
    /// A host on `socket` (which must be non-blocking) that accepts connections (`accepting`)
    /// with IDs of host `host_id`, worker `worker`, or only serves those added with
    /// [`Host::connect`]. Its keys are its own ([`ServiceKeys::random`]) until
    /// [`Host::set_keys`].
    pub fn new(socket: HostSocket, config: quiche::Config, app: A, accepting: bool, host_id: u16, worker: u8) -> Self {
        let recv = RecvBuffers::for_socket(&socket, RECV_BUFFERS);
        let keys = ServiceKeys::random();
        let limits = Limits::default();
        // A socket with zerocopy on: the outbox writes into pooled buffers (see `io`).
        let mut out = Outbox::new();
        out.enable_zerocopy(&socket);
        Host {
            local: socket.local_addr(),
            socket,
            config,
            accepting,
            cids: CidGenerator::new(host_id, worker),
            conns: Vec::new(),
            free: Vec::new(),
            by_cid: HashMap::new(),
            timers: Timers::new(),
            ready: ReadyQueue::new(),
            recv: Some(recv),
            out,
            blocked: None,
            app,
            counters: HostCounters::default(),
            icmp_seen: 0,
            pacing: Pacing::Hold,
            burst: Burst::Quantum,
            epoch: Instant::now(),
            anchor: (Instant::now(), udpx::Timestamp::now()),
            token_key: keys.token_key(),
            keys,
            shards: 1,
            removed_hosts: crate::reset::RemovedHosts::default(),
            ticket_period: None,
            answers: Rate::new(limits.answers_per_sec),
            admission: Admission::new(limits),
            idle: false,
            coalesce: Duration::ZERO,
            defer_flush: false,
            deferred: false,
            more_this_turn: false,
            last_turn: Instant::now(),
        }
    }

    /// Uses the service's shared keys: reset tokens derived from its secret (and stateless
    /// resets sent for unknown IDs), Retry tokens any host opens, session tickets any host
    /// resumes. Set it before the first connection.
    pub fn set_keys(&mut self, keys: ServiceKeys) {
        self.token_key = keys.token_key();
        self.keys = keys;
        self.ticket_period = None;
    }

    /// Which unknown connection IDs it answers with a stateless reset (with shared keys): those
    /// of its own shard of `shards` and of its host, or of a host in `removed`
    /// ([`crate::reset::may_reset`]). Default: one shard, no host removed.
    pub fn set_reset_scope(&mut self, shards: usize, removed: crate::reset::RemovedHosts) {
        self.shards = shards.max(1);
        self.removed_hosts = removed;
    }

    /// Sets the admission caps and the Retry policy (default [`Limits::default`]).
    pub fn set_limits(&mut self, limits: Limits) {
        self.answers = Rate::new(limits.answers_per_sec);
        self.admission = Admission::new(limits);
    }

    /// Sets the least time between the starts of two turns while work keeps coming (default
    /// zero: a turn starts as soon as a datagram arrives). Datagrams that arrive meanwhile
    /// wait in the socket and are served together: one wake-up, one `recvmmsg`, and their
    /// answers in one `sendmmsg`, for many connections at once. A datagram after a quiet spell
    /// longer than `least` is served at once; deadlines (quiche's timers, pacing releases)
    /// are never delayed by it. The price: up to `least` of added latency under load.
    pub fn set_coalesce(&mut self, least: Duration) {
        self.coalesce = least;
    }

    /// Lets a turn in which a connection wrote its quantum and has more keep its packets (under
    /// 64 KiB) for the next turn's send call, once: a response a little past the quantum then
    /// leaves in one call instead of two (`deferred_flushes`), and a bulk download goes 20
    /// packets per call instead of 10. Off by default for a host (clients); servers turn it on
    /// (`ServerConfig::defer_flush`).
    pub fn set_deferred_flush(&mut self, on: bool) {
        self.defer_flush = on;
    }

    /// The least time between two turns' starts ([`Host::set_coalesce`]).
    pub fn coalesce(&self) -> Duration {
        self.coalesce
    }

    /// Sets how much one connection writes per turn (default [`Burst::Quantum`]).
    pub fn set_burst(&mut self, b: Burst) {
        self.burst = b;
    }

    /// Sets who paces (default [`Pacing::Hold`]). [`Pacing::Kernel`] needs a socket with
    /// `SO_TXTIME` and an fq egress qdisc to mean anything; see [`crate::pacing_for`].
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
    /// application's. With `session` (from an earlier connection's [`quiche::Connection::session`])
    /// it resumes, and may send early data.
    pub fn connect(&mut self, server_name: Option<&str>, peer: SocketAddr, state: A::State) -> Result<(), Error> {
        self.connect_with(server_name, peer, state, None, None).map(|_| ())
    }

    /// [`Host::connect`] with a session to resume and a chosen destination ID for the first
    /// Initial (`dcid`: e.g. to land on a given shard of a server); returns the connection's
    /// slot.
    pub fn connect_with(
        &mut self,
        server_name: Option<&str>,
        peer: SocketAddr,
        state: A::State,
        session: Option<&[u8]>,
        dcid: Option<&[u8]>,
    ) -> Result<usize, Error> {
        self.connect_from(None, server_name, peer, state, session, dcid)
    }

    /// [`Host::connect_with`] from local address `from` (a socket bound to the unspecified
    /// address, with `IP_PKTINFO`, sends each connection's packets from its own address: one
    /// socket and loop can play many clients).
    pub fn connect_from(
        &mut self,
        from: Option<IpAddr>,
        server_name: Option<&str>,
        peer: SocketAddr,
        state: A::State,
        session: Option<&[u8]>,
        dcid: Option<&[u8]>,
    ) -> Result<usize, Error> {
        let local = match from {
            Some(ip) => SocketAddr::new(ip, self.local.port()),
            None => self.local,
        };
        let mut scid = [0u8; CID_LEN];
        crate::cid::random_bytes(&mut scid).map_err(Error::Io)?;
        let scid_ref = quiche::ConnectionId::from_ref(&scid);
        let mut conn = match dcid {
            Some(d) => quiche::connect_with_dcid_and_buffer_factory(
                server_name,
                &scid_ref,
                &quiche::ConnectionId::from_ref(d),
                local,
                peer,
                &mut self.config,
            ),
            None => quiche::connect_with_buffer_factory(server_name, &scid_ref, local, peer, &mut self.config),
        }
        .map_err(|e| Error::Quic("connect", e))?;
        if let Some(s) = session {
            conn.set_session(s).map_err(|e| Error::Quic("resume a session", e))?;
        }
        self.counters.connections += 1;
        let idx = self.insert(conn, state, &[CidKey::new(&scid)], peer.ip(), local, None);
        // A client speaks first.
        self.ready.push(idx as u32);
        Ok(idx)
    }

    /// Makes connection `idx` ready: its application gets a turn on the next step (an outside
    /// event: the driver queued work for it).
    pub fn wake(&mut self, idx: usize) {
        if self.conns.get(idx).is_some_and(Option::is_some) {
            self.ready.push(idx as u32);
        }
    }

    /// Calls `f` with every open connection and its application state: a walk over the whole
    /// table, for a report at the end of a run, never for the loop.
    pub fn for_each_connection(&self, mut f: impl FnMut(&Connection, &A::State)) {
        for e in self.conns.iter().flatten() {
            f(&e.conn, &e.state);
        }
    }

    /// The connection in slot `idx` and its application state, if it is open.
    pub fn connection(&self, idx: usize) -> Option<(&Connection, &A::State)> {
        self.conns.get(idx)?.as_ref().map(|e| (&e.conn, &e.state))
    }

    fn insert(
        &mut self,
        conn: Connection,
        state: A::State,
        keys: &[CidKey],
        peer_ip: IpAddr,
        local: SocketAddr,
        handshake_deadline: Option<Instant>,
    ) -> usize {
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
        self.conns[idx] = Some(Entry {
            conn,
            state,
            keys: keys.to_vec(),
            peer_ip,
            local,
            established: false,
            handshake_deadline,
            held: None,
            seen_lost: 0,
            seen_retrans: 0,
            timed_out: false,
            left_ptos: 0,
        });
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
        c.zerocopy_sends = s.zerocopy_sends;
        c.zerocopy_copied = s.zerocopy_copied;
        c.zerocopy_turned_off = s.zerocopy_turned_off;
        c.zerocopy_refused = s.zerocopy_enobufs_copied;
        // SO_MEMINFO: the socket asks for no SO_RXQ_OVFL control message, so the receive
        // path's own count stays 0; a socket that cannot be read keeps the path's count.
        c.kernel_drops = self.socket.kernel_drops().map_or(s.kernel_drops, u64::from);
        c.open_connections = self.connection_count() as u64;
        c.half_open = self.admission.counts().1 as u64;
        c.add(&HostCounters::default())
    }

    /// Runs until `stop` is set, or (`until_idle`) until no connection is left.
    /// `publish` receives the counters every 100 ms at most, and when the loop ends.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        until_idle: bool,
        publish: Option<&Mutex<HostCounters>>,
    ) -> Result<(), Error> {
        let mut published: Option<Instant> = None;
        loop {
            if stop.load(Ordering::Relaxed) || (until_idle && self.connection_count() == 0) {
                break;
            }
            if let Some(p) = publish {
                let now = Instant::now();
                if published.is_none_or(|t| now.duration_since(t) >= PUBLISH_EVERY) {
                    *p.lock().unwrap_or_else(|e| e.into_inner()) = self.counters();
                    published = Some(now);
                }
            }
            self.step(STOP_CHECK)?;
        }
        if let Some(p) = publish {
            *p.lock().unwrap_or_else(|e| e.into_inner()) = self.counters();
        }
        Ok(())
    }

    /// One turn of the loop: when the last turn found nothing to do, first waits (at most
    /// `max_wait`) for a datagram, the earliest deadline or writability; then receives, runs
    /// the due deadlines and serves the ready connections. For a driver that does things
    /// between turns (a load generator opening connections on a schedule).
    pub fn step(&mut self, max_wait: Duration) -> Result<(), Error> {
        // Something made ready between turns (a connection opened, a wake) is served now.
        if self.idle && self.ready.is_empty() {
            self.gather(max_wait);
            self.wait(max_wait)?;
        }
        self.last_turn = Instant::now();
        self.counters.turns += 1;
        self.receive()?;
        self.check_unreachable();
        let now = Instant::now();
        self.rotate_ticket_key();
        self.expire(now);
        self.serve(now);
        // Nothing is left ready (what was ready got served), or the socket is full: wait for
        // a datagram, a deadline, or writability. A datagram that came during the turn ends
        // the wait at once; a deadline already due makes it zero.
        self.idle = self.blocked.is_some() || self.ready.is_empty();
        Ok(())
    }

    /// Nanoseconds of the timers' clock at `t`.
    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// With coalescing on, lets datagrams gather until `coalesce` after the last turn's start
    /// (never past the earliest deadline or `max_wait`): a sleep, not a wait on the socket.
    fn gather(&mut self, max_wait: Duration) {
        if self.coalesce.is_zero() || self.blocked.is_some() {
            return;
        }
        let now = Instant::now();
        let deadline = self.timers.peek().map(|(at, _)| self.epoch + Duration::from_nanos(at));
        if let Some(until) = gather_until(self.last_turn, self.coalesce, now, max_wait, deadline) {
            self.counters.coalesced += 1;
            std::thread::sleep(until - now);
        }
    }

    /// Waits for a datagram, writability when blocked, or the earliest deadline, at most
    /// `max_wait`.
    fn wait(&mut self, max_wait: Duration) -> Result<(), Error> {
        let now = Instant::now();
        let mut timeout = max_wait;
        if let Some((at, _)) = self.timers.peek() {
            let now_ns = self.ns(now);
            timeout = timeout.min(Duration::from_nanos(at.saturating_sub(now_ns)));
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
        self.counters.waits += 1;
        // ppoll: a deadline (a held packet) may be a few hundred microseconds away.
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
        for (idx, slot) in self.conns.iter_mut().enumerate() {
            let Some(e) = slot.as_mut() else { continue };
            if e.conn.stats().recv == 0 {
                let _ = e.conn.close(false, 0x0, b"peer unreachable");
                self.ready.push(idx as u32);
            }
        }
    }

    /// Receives what is queued and feeds it to the connections (each becomes ready); returns
    /// the datagrams fed.
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
                        // The address it was sent to (pktinfo, on a socket bound to the
                        // unspecified address), or the socket's.
                        let to = match meta.dst_ip {
                            Some(ip) => SocketAddr::new(ip, self.local.port()),
                            None => self.local,
                        };
                        for d in data.chunks_mut(stride) {
                            fed += 1;
                            self.counters.datagrams_received += 1;
                            self.counters.bytes_received += d.len() as u64;
                            self.datagram(meta.addr, to, d);
                        }
                    }
                    // A short batch emptied the queue: another call now would find nothing
                    // (what arrives meanwhile wakes the next wait at once).
                    if n < bufs.capacity() {
                        break;
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

    /// One datagram from `from` to local address `to`.
    fn datagram(&mut self, from: SocketAddr, to: SocketAddr, buf: &mut [u8]) {
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
            None => match self.new_connection(from, to, &hdr, buf.len()) {
                Some(i) => (i, true),
                None => return,
            },
        };
        let Some(e) = self.conns[idx].as_mut() else { return };
        // A connection that let the kernel choose its address keeps its unspecified one.
        let to = if e.local.ip().is_unspecified() { e.local } else { to };
        let info = quiche::RecvInfo { from, to };
        match e.conn.recv(buf, info) {
            Ok(_) | Err(quiche::Error::Done) => {
                if fresh {
                    self.counters.connections += 1;
                }
                self.ready.push(idx as u32);
            }
            Err(err) => {
                self.counters.dropped_by_quic += 1;
                log::debug!("udpx-quic: {} refused a datagram from {from}: {err}", e.conn.trace_id());
                if fresh {
                    // An Initial that does not decrypt leaves no state behind.
                    self.remove(idx);
                } else {
                    self.ready.push(idx as u32);
                }
            }
        }
    }

    /// A connection for an Initial to an unknown DCID, or `None` (counted) when it cannot
    /// or must not start one: not an Initial, another version, too small, a bad token, a cap,
    /// or a Retry sent instead.
    fn new_connection(
        &mut self,
        from: SocketAddr,
        local: SocketAddr,
        hdr: &quiche::Header<'_>,
        len: usize,
    ) -> Option<usize> {
        if !self.accepting || hdr.ty != quiche::Type::Initial {
            self.counters.dropped_unknown_cid += 1;
            if self.accepting && hdr.ty == quiche::Type::Short {
                self.stateless_reset(from, &hdr.dcid, len);
            }
            return None;
        }
        if len < quiche::MIN_CLIENT_INITIAL_LEN {
            // RFC 9000 14.1: a client's first datagram is at least 1,200 bytes; a smaller one
            // gets nothing, not even Version Negotiation (which would be an amplifier).
            self.counters.dropped_bad_initial += 1;
            return None;
        }
        if !quiche::version_is_supported(hdr.version) {
            if !self.answers.allow(Instant::now()) {
                self.counters.answers_limited += 1;
                return None;
            }
            let mut out = [0u8; 1350];
            if let Ok(n) = quiche::negotiate_version(&hdr.scid, &hdr.dcid, &mut out) {
                self.send_now(from, &out[..n], "version negotiation");
                self.counters.version_negotiations += 1;
            }
            return None;
        }
        if hdr.dcid.len() < 8 {
            self.counters.dropped_bad_initial += 1;
            return None;
        }
        let now = SystemTime::now();
        let odcid = match hdr.token.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => match self.token_key.open(from, t, &hdr.dcid, now) {
                Ok(odcid) => Some(odcid),
                Err(TokenError::Expired) => {
                    self.counters.tokens_expired += 1;
                    return None;
                }
                Err(TokenError::Invalid) => {
                    // A NEW_TOKEN token (quiche never sends one) or a forgery: ours are Retry
                    // tokens only.
                    self.counters.tokens_invalid += 1;
                    return None;
                }
            },
        };
        match self.admission.check(from.ip(), odcid.is_some()) {
            Admit::Refuse(cap) => {
                match cap {
                    Cap::Connections => self.counters.refused_connections += 1,
                    Cap::HalfOpen => self.counters.refused_half_open += 1,
                    Cap::PerIp => self.counters.refused_per_ip += 1,
                }
                return None;
            }
            Admit::Retry => {
                self.retry(from, hdr, now);
                return None;
            }
            Admit::Accept => {}
        }
        let Some(scid) = fresh_cid(&mut self.cids, &self.by_cid) else {
            self.counters.accept_errors += 1;
            return None;
        };
        if let Some(k) = &self.keys.reset {
            self.config.set_stateless_reset_token(Some(k.token(&scid)));
        }
        let scid_ref = quiche::ConnectionId::from_ref(&scid);
        let conn = match &odcid {
            Some(o) => {
                let o = quiche::ConnectionId::from_ref(o);
                let cids = quiche::RetryConnectionIds { original_destination_cid: &o, retry_source_cid: &hdr.dcid };
                quiche::accept_with_retry(&scid_ref, cids, local, from, &mut self.config)
            }
            None => quiche::accept_with_buf_factory(&scid_ref, None, local, from, &mut self.config),
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                self.counters.accept_errors += 1;
                log::debug!("udpx-quic: accept from {from} failed: {e}");
                return None;
            }
        };
        if odcid.is_some() {
            self.counters.validated_by_retry += 1;
        }
        let state = self.app.accepted(&conn);
        self.admission.opened(from.ip());
        let deadline = Instant::now() + self.admission.limits().handshake_timeout;
        // Both IDs lead to it: ours, and the one the client chose (or our Retry's), which its
        // retransmitted Initials still carry.
        Some(self.insert(conn, state, &[CidKey::new(&scid), CidKey::new(&hdr.dcid)], from.ip(), local, Some(deadline)))
    }

    /// Answers an Initial with a Retry: a fresh ID of this shard (so the client's next Initial
    /// comes back here, by the steering's worker byte and the balancer's host ID) and a token
    /// for the address. No state is kept.
    fn retry(&mut self, to: SocketAddr, hdr: &quiche::Header<'_>, now: SystemTime) {
        let Some(new_scid) = fresh_cid(&mut self.cids, &self.by_cid) else { return };
        // Bound to the ID the client must send its next Initial to.
        let token = self.token_key.seal(to, &hdr.dcid, &new_scid, now);
        if token.is_empty() {
            self.counters.accept_errors += 1;
            return;
        }
        let mut out = [0u8; 256];
        let new = quiche::ConnectionId::from_ref(&new_scid);
        match quiche::retry(&hdr.scid, &hdr.dcid, &new, &token, hdr.version, &mut out) {
            Ok(n) => {
                self.send_now(to, &out[..n], "retry");
                self.counters.retries_sent += 1;
            }
            Err(e) => log::debug!("udpx-quic: no Retry for {to}: {e}"),
        }
    }

    /// Runs the deadlines that are due: quiche's timers fire, held packets are released
    /// (their connections become ready), handshakes past their deadline are dropped.
    fn expire(&mut self, now: Instant) {
        let due = self.ns(now + PACING_SLACK);
        while let Some(c) = self.timers.pop_due(due) {
            self.counters.timers_fired += 1;
            let idx = c as usize;
            let Some(e) = self.conns.get_mut(idx).and_then(Option::as_mut) else { continue };
            if !e.established && e.handshake_deadline.is_some_and(|d| d <= now) && !e.conn.is_established() {
                // Dropped, not closed: nothing more is sent to an address that never finished.
                self.counters.handshake_timeouts += 1;
                self.drop_connection(idx);
                continue;
            }
            if e.conn.timeout_instant().is_some_and(|t| t <= now) {
                e.conn.on_timeout();
                e.timed_out = true;
            }
            self.ready.push(c);
        }
    }

    /// Serves the connections that are ready now, each once (see the module docs), then
    /// flushes. Returns how many were served.
    fn serve(&mut self, now: Instant) -> usize {
        // What a blocked flush left goes first (packets deferred by the last turn, below,
        // wait to join this turn's).
        if self.blocked.is_some() && !self.out.is_empty() {
            let f = self.out.flush(&self.socket, &mut self.counters);
            if f != Flush::Done {
                self.blocked = Some(f);
                return 0;
            }
        }
        self.blocked = None;
        let n = self.ready.len();
        let mut served = 0;
        self.more_this_turn = false;
        for _ in 0..n {
            if self.blocked.is_some() {
                break; // the rest stay ready for the next turn
            }
            let Some(c) = self.ready.pop() else { break };
            served += 1;
            self.serve_one(c as usize, now);
        }
        self.counters.served += served as u64;
        // With the deferred flush on (`set_deferred_flush`): a connection that wrote its
        // quantum and has more went back to the ready queue, so the next turn comes at once;
        // a small remainder waits for that turn's packets, which join the same runs and the
        // same send call. One turn at most, and never across a wait.
        let defer = self.defer_flush
            && self.more_this_turn
            && !self.deferred
            && !self.out.is_empty()
            && self.out.pending_bytes() < DEFER_BELOW;
        self.deferred = defer;
        if defer {
            self.counters.deferred_flushes += 1;
        }
        if !self.out.is_empty() && self.blocked.is_none() && !defer {
            let f = self.out.flush(&self.socket, &mut self.counters);
            if f != Flush::Done {
                self.blocked = Some(f);
            }
        }
        served
    }

    /// One ready connection: its application's turn, connection IDs, its quantum of packets;
    /// then it leaves (closed), waits for its deadline, or goes to the back of the queue.
    fn serve_one(&mut self, idx: usize, now: Instant) {
        let Some(e) = self.conns.get_mut(idx).and_then(Option::as_mut) else { return };
        if !e.established && e.conn.is_established() {
            e.established = true;
            e.handshake_deadline = None;
            if self.accepting {
                self.admission.established();
            }
        }
        let ran = e.conn.is_established() || e.conn.is_in_early_data();
        if ran {
            self.app.on_turn(&mut e.conn, &mut e.state);
        }
        self.issue_cids(idx);
        let mut more = self.produce(idx, now);
        // A resuming client is in early data only once its first flight is written: its
        // application gets its turn now, so its request goes in 0-RTT, not a round trip later.
        if let Some(e) = self.conns.get_mut(idx).and_then(Option::as_mut).filter(|e| !ran && e.conn.is_in_early_data())
        {
            self.app.on_turn(&mut e.conn, &mut e.state);
            more |= self.produce(idx, now);
        }
        let Some(e) = self.conns.get_mut(idx).and_then(Option::as_mut) else { return };
        let st = e.conn.stats();
        self.counters.lost_packets += (st.lost as u64).saturating_sub(e.seen_lost);
        self.counters.retransmitted += (st.retrans as u64).saturating_sub(e.seen_retrans);
        (e.seen_lost, e.seen_retrans) = (st.lost as u64, st.retrans as u64);
        if e.conn.is_closed() {
            self.reap(idx);
            return;
        }
        let wake = if e.conn.is_established() || e.conn.is_in_early_data() { self.app.wake_at(&e.state) } else { None };
        let deadline = [e.conn.timeout_instant(), e.held.as_ref().map(|h| h.at), e.handshake_deadline, wake]
            .into_iter()
            .flatten()
            .min();
        let at = deadline.map(|d| self.ns(d));
        self.timers.set(idx as u32, at);
        if more {
            self.ready.push(idx as u32);
            self.more_this_turn = true;
        }
    }

    /// After a NAT rebinding, quiche 0.30 moves the connection to the peer's new address but
    /// strands what it had in flight to the old one (cloudflare/quiche#2452): those packets'
    /// ACKs cannot come, loss detection runs per path, so nothing acknowledged on the new path
    /// declares them lost, and when the old path's PTO fires `send()` writes nothing. The
    /// stream keeps a hole and the connection dies at its idle timeout (6 downloads in 10
    /// through a rebinding relay, `udpx-h3`'s `tests/rebind.rs`).
    ///
    /// So when the old path's PTO fired (its `total_pto_count` grew), a connection with
    /// nothing more to send writes that path's PTO probes (`send_on_path`: probes may exceed
    /// the window, as RFC 9002 allows, and carry the stranded data) and the host sends them to
    /// the address the connection now uses, once that address is validated (no
    /// amplification: it proved it receives). Their ACK reaches the old path's loss
    /// detection, which then declares the rest lost, and quiche resends it on the new path
    /// under the new path's window. At most two probes per path and PTO (quiche's own
    /// limit); counted in `stranded_probes`. Looked at only after quiche's timers fired.
    fn resend_stranded(&mut self, idx: usize) {
        let Some(e) = self.conns.get_mut(idx).and_then(Option::as_mut) else { return };
        // One pass, no allocation: this runs on every timeout of every connection, and almost
        // all have one path.
        let (mut active, mut ptos) = (None, 0);
        for p in e.conn.path_stats() {
            if p.active {
                active = Some((p.local_addr, p.peer_addr));
            } else {
                ptos += p.total_pto_count;
            }
        }
        if ptos <= e.left_ptos {
            e.left_ptos = ptos; // a path went away: count from what is left
            return;
        }
        let Some(active) = active.filter(|a| e.conn.is_path_validated(a.0, a.1).unwrap_or(false)) else { return };
        e.left_ptos = ptos;
        let left: Vec<(SocketAddr, SocketAddr)> = e
            .conn
            .path_stats()
            .filter(|p| !p.active && p.peer_addr != active.1)
            .map(|p| (p.local_addr, p.peer_addr))
            .collect();
        let max = e.conn.max_send_udp_payload_size();
        for (local, peer) in left {
            for _ in 0..2 {
                let Some(space) = self.out.space(max) else { return };
                match e.conn.send_on_path(space, Some(local), Some(peer)) {
                    Ok((len, _)) => {
                        self.counters.packets_sent += 1;
                        self.counters.bytes_sent += len as u64;
                        self.counters.stranded_probes += 1;
                        // It leaves on the active path: to its peer, from its local address.
                        let from = src_for(self.local, active.0);
                        self.out.commit(idx, active.1, from, len, None);
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// Writes up to the connection's quantum into the outbox; whether it may have more.
    fn produce(&mut self, idx: usize, now: Instant) -> bool {
        let Some(e) = self.conns.get_mut(idx).and_then(Option::as_mut) else { return false };
        if let Some(h) = &e.held {
            if h.at > now + PACING_SLACK {
                return false; // its time has not come
            }
            // Due: it leaves first, then the connection produces on.
            let len = h.bytes.len();
            let Some(space) = self.out.space(len) else {
                return true;
            };
            let h = e.held.take().expect("checked above");
            space[..len].copy_from_slice(&h.bytes);
            self.out.commit(idx, h.to, h.from, len, None);
        }
        let max = e.conn.max_send_udp_payload_size();
        let mut budget = match self.burst {
            Burst::Quantum => e.conn.send_quantum().max(max).min(QUANTUM_PACKETS * max),
            Burst::Window => QUANTUM_PACKETS * max,
        };
        while budget > 0 {
            let space = match self.out.space(max) {
                Some(s) => s,
                None => {
                    let f = self.out.flush(&self.socket, &mut self.counters);
                    if f != Flush::Done {
                        self.blocked = Some(f);
                        return true;
                    }
                    continue;
                }
            };
            match e.conn.send(space) {
                Ok((len, info)) => {
                    self.counters.packets_sent += 1;
                    self.counters.bytes_sent += len as u64;
                    budget = budget.saturating_sub(len);
                    if self.pacing == Pacing::Hold && info.at > now + PACING_SLACK {
                        // Not yet: keep it (the only copy made), and the connection's later
                        // packets behind it; its deadline is the packet's time.
                        let from = src_for(self.local, info.from);
                        e.held = Some(Held { at: info.at, to: info.to, from, bytes: space[..len].to_vec() });
                        self.counters.paced_holds += 1;
                        return false;
                    }
                    let departure = (self.pacing == Pacing::Kernel).then(|| departure(self.anchor, info.at));
                    let from = src_for(self.local, info.from);
                    self.out.commit(idx, info.to, from, len, departure);
                }
                Err(quiche::Error::Done) => {
                    if std::mem::take(&mut e.timed_out) {
                        self.resend_stranded(idx);
                    }
                    return false;
                }
                Err(err) => {
                    log::debug!("udpx-quic: {} send failed: {err}", e.conn.trace_id());
                    let _ = e.conn.close(false, 0x1, b"send failed");
                    return false;
                }
            }
        }
        true
    }

    /// The connection to `from` whose peer's stateless reset token ends `buf`, if any (a
    /// client's: it has few connections, so this looks at each).
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
    /// a stateless reset, when the keys are shared, the packet is long enough and the rate
    /// allows.
    fn stateless_reset(&mut self, to: SocketAddr, dcid: &[u8], len: usize) {
        let Some(key) = &self.keys.reset else { return };
        // A short header does not say how long its DCID is: this service's are CID_LEN.
        let Some(cid) = dcid.get(..CID_LEN) else { return };
        if !crate::reset::may_reset(cid, self.cids.host_id(), self.cids.worker(), self.shards, &self.removed_hosts) {
            self.counters.resets_not_ours += 1;
            return;
        }
        let mut random = [0u8; 64];
        let mut out = [0u8; 64];
        if crate::cid::random_bytes(&mut random).is_err() {
            return;
        }
        let Some(n) = key.write_reset(cid, len, &random, &mut out) else { return };
        if !self.answers.allow(Instant::now()) {
            self.counters.resets_limited += 1;
            return;
        }
        self.send_now(to, &out[..n], "stateless reset");
        self.counters.stateless_resets += 1;
    }

    /// Sends one datagram outside the outbox (version negotiation, stateless reset, Retry):
    /// once, without waiting; a refusal is logged (the peer will send again).
    fn send_now(&self, to: SocketAddr, bytes: &[u8], what: &str) {
        if let Err(e) = self.socket.try_send(
            &mut udpx::SendBuffers::new(),
            &[udpx::Transmit::new(to, bytes)],
            udpx::SendCursor::default(),
        ) {
            log::debug!("udpx-quic: {what} to {to} not sent: {e}");
        }
    }

    /// Forgets the connection IDs the peer retired; a server offers an established connection
    /// as many new ones as its peer takes (see the module docs). Bounded per turn.
    fn issue_cids(&mut self, idx: usize) {
        let Some(e) = self.conns.get_mut(idx).and_then(Option::as_mut) else { return };
        while let Some(old) = e.conn.retired_scid_next() {
            let k = CidKey::new(&old);
            self.by_cid.remove(&k);
            e.keys.retain(|x| *x != k);
        }
        if !self.accepting || !e.conn.is_established() || e.conn.is_closed() {
            return;
        }
        // Bounded: a peer's limit is at most what we advertise (quiche: the minimum of both),
        // but a broken peer must not make this loop spin.
        for _ in 0..MAX_ISSUED_PER_TURN {
            if e.conn.scids_left() == 0 {
                break;
            }
            let Some(cid) = fresh_cid(&mut self.cids, &self.by_cid) else { break };
            let token = match &self.keys.reset {
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

    /// A closed connection leaves: counted, the application told.
    fn reap(&mut self, idx: usize) {
        let Some(e) = self.remove(idx) else { return };
        self.counters.closed += 1;
        self.app.closed(&e.conn, e.state);
    }

    /// A half-open connection past its deadline leaves without a word to its peer.
    fn drop_connection(&mut self, idx: usize) {
        if let Some(e) = self.remove(idx) {
            self.counters.closed += 1;
            self.app.closed(&e.conn, e.state);
        }
    }

    /// Takes connection `idx` out of the table, the timers, the ready queue and the caps.
    fn remove(&mut self, idx: usize) -> Option<Entry<A::State>> {
        let e = self.conns.get_mut(idx)?.take()?;
        for k in &e.keys {
            self.by_cid.remove(k);
        }
        self.timers.remove(idx as u32);
        self.ready.remove(idx as u32);
        if self.accepting {
            self.admission.closed(e.peer_ip, !e.established);
        }
        self.free.push(idx);
        Some(e)
    }

    /// Sets the session ticket key of the period in force (every shard and host derives the
    /// same from the service's keys): resumption works across shards and hosts, and keys change
    /// every [`crate::token::TICKET_KEY_PERIOD`].
    fn rotate_ticket_key(&mut self) {
        if !self.accepting {
            return;
        }
        let period = crate::token::ticket_period(SystemTime::now());
        if self.ticket_period == Some(period) {
            return;
        }
        let key = self.keys.ticket_key_of(period);
        match self.config.set_ticket_key(&key) {
            Ok(()) => self.ticket_period = Some(period),
            Err(e) => {
                log::warn!("udpx-quic: the session ticket key was refused ({e}); resumption stays per shard");
                self.ticket_period = Some(period);
            }
        }
    }

    /// Deadlines and readiness, for tests: (connections with a deadline, connections ready).
    pub fn queues(&self) -> (usize, usize) {
        (self.timers.len(), self.ready.len())
    }
}

/// The source address a packet from local address `from` must name (`IP_PKTINFO`) on a
/// socket bound to `bound`: none when the socket is bound to one address (the kernel's choice
/// is right), else the connection's own.
fn src_for(bound: SocketAddr, from: SocketAddr) -> Option<IpAddr> {
    (bound.ip().is_unspecified() && !from.ip().is_unspecified()).then_some(from.ip())
}

/// Until when a loop that coalesces turns sleeps before waiting on its socket: `least` after
/// the last turn's start, but never past `max_wait` from `now` nor past the earliest
/// `deadline`; `None` when that time has passed (a quiet spell: serve at once).
fn gather_until(
    last_turn: Instant,
    least: Duration,
    now: Instant,
    max_wait: Duration,
    deadline: Option<Instant>,
) -> Option<Instant> {
    let mut until = (last_turn + least).min(now + max_wait);
    if let Some(d) = deadline {
        until = until.min(d);
    }
    (until > now).then_some(until)
}

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
    fn gathering_never_passes_a_deadline_nor_follows_a_quiet_spell() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Work keeps coming: sleep until 1 ms after the last turn's start.
        assert_eq!(gather_until(t, ms(1), t + Duration::from_micros(200), ms(50), None), Some(t + ms(1)));
        // A deadline before that ends the sleep at the deadline.
        let d = t + Duration::from_micros(500);
        assert_eq!(gather_until(t, ms(1), t + Duration::from_micros(200), ms(50), Some(d)), Some(d));
        // A deadline already due, or a quiet spell longer than the least time: no sleep.
        assert_eq!(gather_until(t, ms(1), t + Duration::from_micros(600), ms(50), Some(d)), None);
        assert_eq!(gather_until(t, ms(1), t + ms(2), ms(50), None), None);
        // Never past the caller's own bound.
        assert_eq!(gather_until(t, ms(10), t, ms(3), None), Some(t + ms(3)));
        // Off: never.
        assert_eq!(gather_until(t, Duration::ZERO, t, ms(3), None), None);
    }
}
