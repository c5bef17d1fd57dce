//! One event loop per core: a reuseport shard group steered by the connection ID's worker
//! byte, one thread per socket, each with its own connections.
//!
//! ```text
//!            ┌─ socket 0 ─ thread 0: Host (its connections, CIDs with worker byte 0)
//!  port ─────┼─ socket 1 ─ thread 1: Host (worker byte 1)
//!  cBPF:     └─ socket n-1 …
//!  dcid[11] % n
//! ```
//!
//! A client's first Initial carries a DCID it chose; the program reads its byte 11 (or, for
//! a shorter DCID, lets the kernel hash the 4-tuple), and the shard that gets it issues IDs
//! whose worker byte is its own index, so everything later lands on the same shard.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use udpx::{ShardGroup, SocketConfig, Steering, UdpSocket, Want};

use crate::cid::WORKER_BYTE;
use crate::counters::HostCounters;
use crate::host::{App, ConfigSwap, DrainSignal, Host, HostConfig, HostSocket, SharedCounters};
use crate::outbox::IoMode;
use crate::Error;

/// Socket buffers asked for (the kernel caps them at `net.core.[rw]mem_max` without
/// privilege).
const SOCKET_BUFFER: usize = 4 << 20;

/// How a server's sockets are set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Event loops (sockets, threads); at most 256 (the worker byte).
    pub shards: usize,
    /// How packets leave.
    pub io: IoMode,
    /// Receive with UDP_GRO where the kernel has it.
    pub gro: bool,
    /// The QUIC-LB host ID in every connection ID.
    pub host_id: u16,
    /// MSG_ZEROCOPY for large flushes (`auto` by default: off where the kernel copies).
    pub zerocopy: crate::Zerocopy,
    /// Each shard's settings (a copy each; [`HostConfig::keys`] `None` here: keys of this
    /// process's own, shared by its shards, or its predecessor's after an upgrade).
    pub host: HostConfig,
    /// Upgrades ([`crate::upgrade`]): `None` steers with classic BPF and cannot be upgraded.
    pub handover: Option<crate::upgrade::Handover>,
}

impl ServerConfig {
    /// One shard, `gso-mmsg`, GRO on, host 0.
    pub fn new(listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            listen,
            shards: 1,
            io: IoMode::GsoMmsg,
            gro: true,
            host_id: 0,
            zerocopy: crate::Zerocopy::Auto,
            host: HostConfig::server(),
            handover: None,
        }
    }
}

impl ServerConfig {
    /// Refuses what no server can start with: a shard count outside 1 to 256 (the connection
    /// ID's worker byte numbers them), limits that admit nothing.
    pub fn check(&self) -> Result<(), Error> {
        if !(1..=256).contains(&self.shards) {
            return Err(Error::Config(format!(
                "{} shards: give 1 to 256 (the connection ID's worker byte numbers them)",
                self.shards
            )));
        }
        self.host.limits.check().map_err(Error::Config)
    }
}

/// The socket settings of a host socket in `io` mode.
pub fn socket_config(bind: SocketAddr, io: IoMode, gro: bool) -> SocketConfig {
    SocketConfig::new(bind)
        .send_mode(io.send_mode())
        .gro(if gro { Want::IfAvailable } else { Want::Off })
        // Bound to the unspecified address: each connection's packets name its own local
        // address (a multi-homed server answers from the address asked; a load client plays
        // many addresses on one socket).
        .pktinfo(if bind.ip().is_unspecified() { Want::IfAvailable } else { Want::Off })
        .nonblocking(true)
        .buffers(SOCKET_BUFFER, SOCKET_BUFFER)
}

/// A client's socket: an ephemeral port of `peer`'s family.
pub fn client_socket(peer: SocketAddr, io: IoMode, gro: bool) -> Result<UdpSocket, Error> {
    let any: SocketAddr = if peer.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("literal address");
    socket_config(any, io, gro).bind().map_err(Error::Socket)
}

/// A running server: its threads, their stop flag and counters.
#[derive(Debug)]
pub struct Server {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    drain: Arc<DrainSignal>,
    swaps: Vec<Arc<ConfigSwap>>,
    threads: Vec<JoinHandle<Result<(), Error>>>,
    counters: Vec<SharedCounters>,
    shards: Vec<udpx::Shard>,
    generation: u8,
    upgrades: Upgrades,
    /// For an upgrade: the exchange with the process it took over from, open for this one's
    /// life ([`crate::upgrade::Predecessor`]).
    predecessor: crate::upgrade::Predecessor,
}

/// Where a server stands on upgrades.
#[derive(Debug)]
enum Upgrades {
    /// Not asked for.
    Off,
    /// Asked for, not possible here (why).
    Unavailable(String),
    /// Its successor may take over at the handover socket.
    Listening(crate::upgrade::Listening),
}

/// A view of a running server's counters that outlives borrows of it (for a metrics
/// endpoint's thread): each shard's socket and host counters.
#[derive(Debug, Clone)]
pub struct ServerProbe {
    shards: Vec<udpx::Shard>,
    counters: Vec<SharedCounters>,
}

/// One shard's counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct ShardSample {
    /// The socket's own.
    pub socket: udpx::CounterSnapshot,
    /// Datagrams the kernel dropped on the socket (SO_MEMINFO; 0 where unreadable).
    pub kernel_drops: u64,
    /// The socket's top ICMP senders ([`udpx::UdpSocket::icmp_offenders`]).
    pub icmp_offenders: Vec<(std::net::IpAddr, u64)>,
    /// The event loop's, as last published.
    pub host: HostCounters,
}

impl ServerProbe {
    /// Every shard's counters, in shard order.
    pub fn sample(&self) -> Vec<ShardSample> {
        self.shards
            .iter()
            .zip(&self.counters)
            .map(|(s, c)| ShardSample {
                socket: s.counters(),
                kernel_drops: s.kernel_drops().map(u64::from).unwrap_or(0),
                icmp_offenders: s.icmp_offenders(),
                host: c.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            })
            .collect()
    }
}

impl Server {
    /// Binds the shard group and starts one thread per shard. `configs` holds each shard's
    /// quiche configuration (one per shard: quiche's is not `Clone`); `make_app` makes its
    /// application (called in the shard's thread). ([`Server::prepare`] then
    /// [`Starting::start`], for a server that passes no listening socket on.)
    pub fn start<A, M>(cfg: &ServerConfig, configs: Vec<quiche::Config>, make_app: M) -> Result<Server, Error>
    where
        A: App + 'static,
        M: Fn(usize) -> A + Send + Sync + 'static,
    {
        Server::prepare(cfg, false)?.start(configs, make_app)
    }

    /// The first half of a start: checks the configuration and, for an upgrade, asks the
    /// running server to hand over (see [`crate::upgrade`]); nothing is bound or taken over
    /// yet. `listeners`: whether this server takes listening sockets over from its predecessor
    /// (upgrade protocol 2; [`Starting::take_passed`]) and passes its own on
    /// ([`Starting::pass_on`]).
    pub fn prepare(cfg: &ServerConfig, listeners: bool) -> Result<Starting, Error> {
        cfg.check()?;
        // With upgrades: the predecessor's maps (an upgrade) or new ones; without eBPF here a
        // fresh server steers with classic BPF and says why it cannot be upgraded.
        let mut unavailable = None;
        let (offer, gens) = match &cfg.handover {
            None => (None, None),
            Some(h) if h.take_over => {
                let (offer, gens) = crate::upgrade::ask(&h.path, listeners, h.exchange_timeout)?;
                let next = offer.generation.wrapping_add(1);
                (Some(offer), Some((gens, next)))
            }
            Some(_) => match udpx::generations::Generations::create(crate::cid::LAYOUT) {
                Ok(gens) => (None, Some((gens, 0))),
                Err(e) => {
                    unavailable = Some(e.to_string());
                    (None, None)
                }
            },
        };
        Ok(Starting { cfg: cfg.clone(), offer, gens, unavailable, pass_on: crate::upgrade::PassOn::default() })
    }
}

/// A server between [`Server::prepare`] and [`Starting::start`]: for an upgrade, its
/// predecessor has offered the handover and waits (up to 10 s) for it to be taken. Dropped
/// unstarted, the predecessor carries on.
#[derive(Debug)]
pub struct Starting {
    cfg: ServerConfig,
    offer: Option<crate::upgrade::Offer>,
    gens: Option<(udpx::generations::Generations, u8)>,
    unavailable: Option<String>,
    pass_on: crate::upgrade::PassOn,
}

impl Starting {
    /// The listening sockets the predecessor passed on (empty unless this is an upgrade asked
    /// with `listeners`, from a server that had some), in the order it passed them; taken
    /// once. Whoever takes them must check what they are.
    pub fn take_passed(&mut self) -> Vec<std::os::fd::OwnedFd> {
        self.offer.as_mut().map(|o| std::mem::take(&mut o.passed)).unwrap_or_default()
    }

    /// What this server passes on to its own successor (the listener's owner puts its
    /// sockets there, and withdraws them when it stops listening).
    pub fn pass_on(&self) -> crate::upgrade::PassOn {
        self.pass_on.clone()
    }

    /// Binds the shard group, starts one thread per shard and, for an upgrade, takes new
    /// connections over (see [`Server::start`]).
    pub fn start<A, M>(self, configs: Vec<quiche::Config>, make_app: M) -> Result<Server, Error>
    where
        A: App + 'static,
        M: Fn(usize) -> A + Send + Sync + 'static,
    {
        let Starting { cfg, offer, gens, unavailable, pass_on } = self;
        let cfg = &cfg;
        if configs.len() != cfg.shards {
            return Err(Error::Config(format!("{} quiche configurations for {} shards", configs.len(), cfg.shards)));
        }
        // A loop that gathers its datagrams asks when each came (see `HostConfig::coalesce`).
        let rx_time = if cfg.host.coalesce.is_zero() { Want::Off } else { Want::IfAvailable };
        let sockets = cfg.zerocopy.apply(socket_config(cfg.listen, cfg.io, cfg.gro).rx_time(rx_time));
        let in_use = |e: udpx::Error| match e {
            udpx::Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::AddrInUse => {
                Error::AddrInUse(cfg.listen)
            }
            e => Error::Socket(e),
        };
        let (group, generation, gens) = match gens {
            Some((gens, generation)) => {
                if gens.is_live(generation, 0) {
                    return Err(Error::Config(format!(
                        "upgrade: generation {generation} still serves (an upgrade 256 generations ago has \
                         not ended); wait for it to drain"
                    )));
                }
                let join = offer.is_some();
                let group =
                    ShardGroup::bind_generation(sockets, cfg.shards, &gens, generation, join).map_err(in_use)?;
                (group, generation, Some(Arc::new(gens)))
            }
            None => (
                ShardGroup::bind(sockets, cfg.shards, Steering::QuicCid { cid_byte: WORKER_BYTE }).map_err(in_use)?,
                0,
                None,
            ),
        };
        let local = group.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let drain = Arc::new(DrainSignal::new(cfg.shards));
        let mut swaps = Vec::new();
        let make_app = Arc::new(make_app);
        let mut threads = Vec::new();
        let mut counters = Vec::new();
        let shards = group.shards();
        // One set of keys for every shard: a Retry token or a session ticket one shard made
        // is good on the others.
        let mut settings = cfg.host.clone();
        let inherited = offer.as_ref().map(|o| o.keys.clone());
        settings.keys = Some(settings.keys.or(inherited).unwrap_or_else(crate::ServiceKeys::random));
        settings.generation = generation;
        settings.generations = gens.clone().map(crate::reset::LiveGenerations::new).unwrap_or_default();
        let keys = settings.keys.clone().expect("set just above");
        for (shard, qc) in group.shards().into_iter().zip(configs) {
            let (stop, make_app, settings, drain) = (stop.clone(), make_app.clone(), settings.clone(), drain.clone());
            let swap = Arc::new(ConfigSwap::default());
            swaps.push(swap.clone());
            let cell: SharedCounters = Arc::new(Mutex::new(HostCounters::default()));
            counters.push(cell.clone());
            let role = crate::Role::Server { host_id: cfg.host_id, worker: shard.index() as u8, shards: cfg.shards };
            let t = std::thread::Builder::new()
                .name(format!("udpx-quic-{}", shard.index()))
                .spawn(move || {
                    let app = make_app(shard.index());
                    let mut host = Host::with_config(HostSocket::Shard(shard), qc, app, role, settings);
                    host.set_drain_signal(drain);
                    host.set_config_swap(swap);
                    host.run(&stop, crate::Until::Stopped, Some(&cell))
                })
                .map_err(Error::Io)?;
            threads.push(t);
        }
        let mut server = Server {
            local,
            stop,
            drain,
            swaps,
            threads,
            counters,
            shards,
            generation,
            upgrades: Upgrades::Off,
            predecessor: Default::default(),
        };
        // On an error below, `server` is dropped: its loops stop and are joined.
        server.upgrades = match (gens, &cfg.handover) {
            (Some(gens), Some(h)) => {
                // The handover socket first (bound beside the path, not yet over it): what can
                // fail fails before anything is taken over.
                let (signal, timeout) = (server.drain.clone(), h.drain_timeout);
                let revive = server.drain.clone();
                let on = crate::upgrade::OnHandover {
                    taken: Box::new(move || signal.hand_over(timeout, crate::upgrade::ADMIT_GRACE)),
                    revive: Box::new(move || revive.cancel()),
                };
                let serving = crate::upgrade::Serving {
                    gens: gens.clone(),
                    generation,
                    workers: cfg.shards as u16,
                    keys,
                    pass_on,
                };
                let mut l = crate::upgrade::listen(&h.path, serving, h.exchange_timeout, on)?;
                match offer {
                    // The predecessor commits first ("go"), then new connections come here, then
                    // it is told and drains; if it does not confirm, it is published again
                    // (only one generation ever takes new connections).
                    Some(o) => {
                        // Kept for this server's life; "bye" once it drains (or stops) on purpose.
                        let p = o.take_over(&gens, generation, cfg.shards as u16)?;
                        let bye = p.clone();
                        server.drain.on_change(Box::new(move |e| {
                            if matches!(e, crate::host::DrainEvent::Started { .. }) {
                                bye.bye();
                            }
                        }));
                        server.predecessor = p;
                    }
                    None => gens.publish(generation, cfg.shards as u16).map_err(Error::Socket)?,
                }
                // Only now is the path this server's: a failed upgrade leaves it the old one's.
                l.take_path()?;
                Upgrades::Listening(l)
            }
            _ => unavailable.map_or(Upgrades::Off, Upgrades::Unavailable),
        };
        Ok(server)
    }
}

impl Server {
    /// The generation byte of the connection IDs it issues (0 unless started as an upgrade).
    pub fn generation(&self) -> u8 {
        self.generation
    }

    /// Why this server cannot be upgraded, when upgrades were asked for and the kernel
    /// refused the eBPF steering (it then steers with classic BPF).
    pub fn upgrade_unavailable(&self) -> Option<&str> {
        match &self.upgrades {
            Upgrades::Unavailable(why) => Some(why),
            _ => None,
        }
    }

    /// Whether a successor took over (this server then drains on its own).
    pub fn handed_over(&self) -> bool {
        matches!(&self.upgrades, Upgrades::Listening(l) if l.taken())
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// A handle that stops the server when set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Starts the graceful stop on every shard (see [`crate::host::DrainSignal`]): no new
    /// connection is admitted, each connection finishes what is under way and closes, and each
    /// shard's loop ends when none is left or at `timeout`, closing the rest. Wait for it with
    /// [`Server::finished`], then [`Server::stop`] collects the counters. A second call changes
    /// nothing.
    pub fn drain(&self, timeout: std::time::Duration) {
        self.drain.start(timeout);
    }

    /// Gives each shard a new configuration (one per shard, as at start), taken at its next
    /// turn: connections made from then on use it, open ones carry on (see
    /// [`crate::host::ConfigSwap`]).
    pub fn reload(&self, configs: Vec<quiche::Config>) -> Result<(), Error> {
        if configs.len() != self.swaps.len() {
            return Err(Error::Config(format!(
                "{} quiche configurations for {} shards",
                configs.len(),
                self.swaps.len()
            )));
        }
        for (swap, c) in self.swaps.iter().zip(configs) {
            swap.offer(c);
        }
        Ok(())
    }

    /// The drain signal the shards share (for a caller that starts the drain from elsewhere).
    pub fn drain_signal(&self) -> Arc<DrainSignal> {
        self.drain.clone()
    }

    /// Whether every shard's loop has ended (drained, stopped, or failed).
    pub fn finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// The counters summed over shards, as last published (each loop publishes at most every
    /// 100 ms while it runs, and when it ends: `Host::run`).
    pub fn counters(&self) -> HostCounters {
        self.counters
            .iter()
            .fold(HostCounters::default(), |acc, c| acc.add(&c.lock().unwrap_or_else(|e| e.into_inner())))
    }

    /// The counters of each shard, in shard order, as last published.
    pub fn shard_counters(&self) -> Vec<HostCounters> {
        self.counters
            .iter()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).add(&HostCounters::default()))
            .collect()
    }

    /// A view of the counters for another thread (a metrics endpoint).
    pub fn probe(&self) -> ServerProbe {
        ServerProbe { shards: self.shards.clone(), counters: self.counters.clone() }
    }

    /// Queues a send fault on shard `shard`'s socket (test builds, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, shard: usize, fault: udpx::Fault) {
        self.shards[shard].inject_fault(fault);
    }

    /// Whether every shard thread still runs.
    pub fn is_running(&self) -> bool {
        self.threads.iter().all(|t| !t.is_finished())
    }

    /// Stops the loops, waits for them, returns the final counters (or the first loop's
    /// error).
    pub fn stop(mut self) -> Result<HostCounters, Error> {
        // On purpose: a predecessor still draining does not take it for a death.
        self.predecessor.bye();
        self.stop.store(true, Ordering::Relaxed);
        let mut first_err = None;
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(Error::Config("a shard thread panicked".into()));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(self.counters()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
