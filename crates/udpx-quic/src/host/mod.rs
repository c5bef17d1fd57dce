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
//! itself ([`Pacing::Hold`]): a packet whose `at` is more than the slack ahead
//! ([`HostConfig::pacing_slack`], [`crate::PACING_SLACK`] by default) is held (the
//! connection's one held packet), the connection's deadline is its time, and the loop
//! sleeps with `ppoll` (ns resolution) to the earliest deadline. Under BBRv2
//! (`bbr2_gcongestion`) quiche mostly paces by returning `Done` until the next release and
//! arming its timer for it, which the same deadline covers.
//!
//! Connection IDs: a server issues, besides the one it chose at the handshake, as many more as
//! the peer's `active_connection_id_limit` allows (NEW_CONNECTION_ID, with a reset token),
//! each made by the same [`crate::CidGenerator`]: the same host ID and worker byte, so a client that
//! moves to a new ID still reaches this host through a QUIC-LB balancer and this shard
//! through the group's steering. With shared [`crate::ServiceKeys`] every ID's reset token is derived
//! from the service's secret and a short-header packet for an unknown ID is answered with a
//! stateless reset (see [`crate::reset`]).
//!
//! Admission ([`crate::admission`]): caps on connections, half-open handshakes and
//! connections per address; a handshake not done within its deadline is dropped; Retry with
//! address-bound tokens ([`crate::token`]) always, never, or while under an Initial flood.
//!
//! One concern per file and per type: this one holds the host's type, its settings and the
//! table's bookkeeping; `turn.rs` the loop (wait, receive, expire, serve, flush), which reads
//! the clock and hands the time down; `gate.rs` admission and every answer to a packet no
//! connection takes (the attack surface, to audit in one place), as a `Gate` that decides
//! without a socket (accept, reply with these bytes, drop, each with its counted reason) and
//! the loop that sends and counts; `flush.rs` when a turn's packets leave (`FlushRules`, one
//! decision after each turn's serving); `send.rs` a connection's packets into the outbox and the
//! pacing hold; `drain.rs` and `reload.rs` the lifecycle (drain, handover, reload). The
//! connections themselves live in a table (`crate::table`), named by their [`Slot`] in the
//! timers, the ready queue and the outbox.

use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udpx::{RecvBuffers, Shard, UdpSocket};

use crate::bufs::Connection;
use crate::cid::CID_LEN;
use crate::counters::HostCounters;
use crate::outbox::Outbox;
use crate::pacing::Pacing;
use crate::ready::ReadyQueue;
use crate::table::{CidKey, Entry, Slot, Table};
use crate::timers::Timers;
use crate::Error;

mod config;
mod drain;
mod flush;
mod gate;
mod reload;
mod send;
mod turn;

pub use config::HostConfig;
pub use drain::{DrainEvent, DrainSignal};
pub use reload::ConfigSwap;
pub use turn::Until;

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
    /// packet to its release time): unpaced (CUBIC before quiche patch 0008), a 64-packet
    /// burst overflows a bottleneck queue shorter than it (`udpx bench h3 --bottleneck 500
    /// --bottleneck-buffer 1`: about 20 times the losses of `Quantum`), paced it lost nothing
    /// there.
    Window,
}

/// [`HostConfig::ack_defer`] of a server: about four acknowledgements of a client that
/// acknowledges every eighth packet at 700 Mbit/s, and within TCP's 1 ms burst
/// (`tcp_tso_autosize`) and [`crate::pacing::PACING_SLACK`].
pub const ACK_DEFER: Duration = Duration::from_micros(500);

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
    /// quiche failed on `conn` with `err` and closes the connection for it: a datagram it
    /// refused (a peer's protocol violation, a failed handshake, a limit) or a packet it could
    /// not make. The close's wire code says less (`OutOfIdentifiers` and most other transport
    /// errors go out as PROTOCOL_VIOLATION); this is the cause, for a log line. Not called for
    /// a new connection's first datagram (that connection is dropped without
    /// [`App::closed`]). Default: nothing.
    fn failed(&mut self, conn: &Connection, state: &mut Self::State, err: &quiche::Error) {
        let _ = (conn, state, err);
    }
    /// The server started draining ([`Host::drain`]): no new connection will come, and each
    /// connection gets a turn now. The application tells its peers (HTTP/3: GOAWAY), lets what
    /// is under way finish, and closes each connection when it is done. With a `spread` (a
    /// handover to an upgrade) it tells them over that long, each at its own moment, so that
    /// they do not all connect to the successor at once (Envoy's gradual drain). Default:
    /// nothing (the connections run on until the drain deadline).
    fn drain(&mut self, spread: Duration) {
        let _ = spread;
    }
    /// The drain deadline passed with `conn` still open: close it now. Default: an application
    /// close with code 0.
    fn drain_deadline(&mut self, conn: &mut Connection, state: &mut Self::State) {
        let _ = state;
        let _ = conn.close(true, 0, b"server shutting down");
    }
    /// The drain was called off ([`DrainSignal::cancel`]: an upgrade's successor died): new
    /// connections are served as before; those already told to go may still go. Default:
    /// nothing.
    fn undrain(&mut self) {}
}

/// What a host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It opens connections ([`Host::connect`]) and accepts none.
    Client,
    /// It accepts connections, whose IDs carry `host_id` (QUIC-LB) and `worker` (its shard).
    Server {
        /// The host ID in every connection ID.
        host_id: u16,
        /// The worker byte in every connection ID: the shard's index.
        worker: u8,
        /// The shards of its group (1 for a host alone): which unknown IDs are its own to
        /// reset ([`crate::reset::may_reset`]).
        shards: usize,
    },
}

impl Role {
    /// Whether a host in this role accepts connections (a server).
    pub fn accepts(self) -> bool {
        matches!(self, Role::Server { .. })
    }
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

/// One event loop over one socket (see the module docs).
pub struct Host<A: App> {
    socket: HostSocket,
    local: SocketAddr,
    config: quiche::Config,
    role: Role,
    /// Its connections and the connection-ID index.
    table: Table<A::State>,
    timers: Timers,
    ready: ReadyQueue,
    recv: Option<RecvBuffers>,
    out: Outbox,
    app: A,
    counters: HostCounters,
    /// The socket's `icmp_errors` when last looked at.
    icmp_seen: u64,
    /// Who paces, how much a connection writes per turn, and the clocks.
    sending: send::Sending,
    /// Admission, keys, logs, and the answers to packets no connection takes.
    gate: gate::Gate,
    /// When a turn's packets leave.
    flush: flush::FlushRules,
    /// Draining and reloading.
    life: drain::Lifecycle,
}

impl<A: App> std::fmt::Debug for Host<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("local", &self.local).field("connections", &self.connection_count()).finish()
    }
}

impl<A: App> Host<A> {
    /// A host on `socket` (which must be non-blocking) in `role`, with the default settings
    /// ([`HostConfig::default`]: a client's).
    pub fn new(socket: HostSocket, config: quiche::Config, app: A, role: Role) -> Self {
        Host::with_config(socket, config, app, role, HostConfig::default())
    }

    /// A host on `socket` (which must be non-blocking) in `role`: a server accepts connections
    /// with IDs of its host ID and worker; a client only serves those added with
    /// [`Host::connect`]. `settings` is read here, once.
    pub fn with_config(
        socket: HostSocket,
        mut config: quiche::Config,
        app: A,
        role: Role,
        settings: HostConfig,
    ) -> Self {
        let (host_id, worker, shards) = match role {
            Role::Server { host_id, worker, shards } => (host_id, worker, shards),
            Role::Client => (0, 0, 1),
        };
        let recv = RecvBuffers::for_socket(&socket, RECV_BUFFERS);
        // A socket with zerocopy on: the outbox writes into pooled buffers (see `io`).
        let mut out = Outbox::new();
        out.enable_zerocopy(&socket);
        let HostConfig {
            keys,
            limits,
            burst,
            coalesce,
            pacing_slack,
            defer_flush,
            ack_defer,
            pacing,
            removed_hosts,
            generation,
            generations,
            keylog,
            qlog,
        } = settings;
        crate::keylog::KeyLog::prepare(keylog.as_ref(), &mut config);
        let now = Instant::now();
        let mut gate =
            gate::Gate::new(host_id, (generation, worker), shards, keys, limits, (removed_hosts, generations));
        (gate.keylog, gate.qlog) = (keylog, qlog);
        let mut host = Host {
            local: socket.local_addr(),
            socket,
            config,
            role,
            table: Table::new(),
            timers: Timers::new(),
            ready: ReadyQueue::new(),
            recv: Some(recv),
            out,
            app,
            counters: HostCounters::default(),
            icmp_seen: 0,
            sending: send::Sending::new(pacing, burst, pacing_slack, now),
            gate,
            flush: flush::FlushRules::new(coalesce, defer_flush, ack_defer, now),
            life: drain::Lifecycle::new(),
        };
        // A server's session tickets work across its shards from its first datagram on.
        host.rotate_ticket_key(std::time::SystemTime::now());
        host
    }

    /// Makes [`Host::run`] drain when `signal` starts (a server's shards share one).
    pub fn set_drain_signal(&mut self, signal: Arc<DrainSignal>) {
        self.life.signal = Some(signal);
    }

    /// The least time between two turns' starts ([`HostConfig::coalesce`]).
    pub fn coalesce(&self) -> Duration {
        self.flush.coalesce()
    }

    /// Who paces.
    pub fn pacing(&self) -> Pacing {
        self.sending.pacing
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
        self.table.len()
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
    ) -> Result<Slot, Error> {
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
    ) -> Result<Slot, Error> {
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
        if let Some(k) = &self.gate.keylog {
            conn.set_keylog(k.writer());
        }
        if let Some(s) = session {
            conn.set_session(s).map_err(|e| Error::Quic("resume a session", e))?;
        }
        self.counters.connections += 1;
        let slot = self.table.insert(conn, state, &[CidKey::new(&scid)], peer.ip(), local, None);
        // A client speaks first.
        self.ready.push(slot);
        Ok(slot)
    }

    /// Makes connection `slot` ready: its application gets a turn on the next step (an
    /// outside event: the driver queued work for it).
    pub fn wake(&mut self, slot: Slot) {
        if self.table.get(slot).is_some() {
            self.ready.push(slot);
        }
    }

    /// Calls `f` with every open connection and its application state: a walk over the whole
    /// table, for a report at the end of a run, never for the loop.
    pub fn for_each_connection(&self, mut f: impl FnMut(&Connection, &A::State)) {
        for (_, e) in self.table.iter() {
            f(&e.conn, &e.state);
        }
    }

    /// The connection in `slot` and its application state, if it is open.
    pub fn connection(&self, slot: Slot) -> Option<(&Connection, &A::State)> {
        self.table.get(slot).map(|e| (&e.conn, &e.state))
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
        c.half_open = self.gate.admission.counts().1 as u64;
        c.add(&HostCounters::default())
    }

    /// A connection leaves (closed, or a half-open one dropped at its deadline without a word
    /// to its peer): counted, the application told.
    fn reap(&mut self, slot: Slot) {
        let Some(e) = self.remove(slot) else { return };
        self.counters.closed += 1;
        if matches!(self.life.draining, drain::Draining::Until(_)) {
            self.counters.drained += 1;
        }
        self.app.closed(&e.conn, e.state);
    }

    /// Reaps every connection left.
    fn reap_all(&mut self) {
        let slots: Vec<Slot> = self.table.iter_mut().map(|(s, _)| s).collect();
        for s in slots {
            self.reap(s);
        }
    }

    /// Takes connection `slot` out of the table, the timers, the ready queue and the caps.
    fn remove(&mut self, slot: Slot) -> Option<Entry<A::State>> {
        let e = self.table.remove(slot)?;
        self.timers.remove(slot);
        self.ready.remove(slot);
        if self.role.accepts() {
            self.gate.admission.closed(e.peer_ip, !e.established);
        }
        Some(e)
    }

    /// Deadlines and readiness, for tests: (connections with a deadline, connections ready).
    pub fn queues(&self) -> (usize, usize) {
        (self.timers.len(), self.ready.len())
    }
}

/// A counters cell a running host publishes into.
pub type SharedCounters = Arc<Mutex<HostCounters>>;
