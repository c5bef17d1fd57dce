//! A slow, lossy path for tests: a relay between one client and a server that, each way,
//! drops a share of the datagrams by a seeded coin, serialises the rest at a link rate behind
//! a bounded queue (tail-drop past it) and delivers them a fixed delay later. It stands in for
//! the ns-3 link of the QUIC interop runner's loss cases (`handshakeloss`: 15 ms one-way,
//! 10 Mbit/s, 30 % each way), which need no qdisc: the kernel here has no netem.
//!
//! The coins are seeded, and the seed is the caller's to print, so that a failing run's losses
//! can be played again: each direction draws once per datagram offered, so the same datagrams
//! in the same order meet the same fate (a peer's timers may still order them differently).
//! Bounded: what waits is at most the queue plus one delay's worth of the rate, in bytes, and
//! every datagram counts at least its headers. One thread, stopped by a flag and joined.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// IPv4 and UDP headers: what a datagram weighs on the link besides its payload.
const HEADERS: usize = 28;
/// How long the relay sleeps when nothing arrived and nothing is due sooner: the jitter it adds.
const NAP: Duration = Duration::from_micros(250);

/// What the path does to each direction.
#[derive(Debug, Clone, Copy)]
pub struct PathSpec {
    /// One-way delay added to every datagram that is not dropped.
    pub delay: Duration,
    /// Link rate, bits per second (headers included).
    pub rate_bps: u64,
    /// Bytes that may wait for the link; a datagram that would take the queue past this is
    /// tail-dropped.
    pub queue_bytes: usize,
    /// Datagrams dropped by the coin, percent (0 to 100).
    pub loss_pct: u64,
}

impl PathSpec {
    /// The interop runner's `handshakeloss`: 15 ms, 10 Mbit/s, 30 % loss each way; a 64 KiB
    /// queue (about 52 ms at the rate).
    pub fn handshakeloss() -> PathSpec {
        PathSpec { delay: Duration::from_millis(15), rate_bps: 10_000_000, queue_bytes: 64 << 10, loss_pct: 30 }
    }

    /// How long `bytes` occupy the link.
    fn serialisation(&self, bytes: usize) -> Duration {
        Duration::from_nanos((bytes as u64 * 8).saturating_mul(1_000_000_000) / self.rate_bps.max(1))
    }

    /// The bytes the link sends in `d`.
    fn bytes_in(&self, d: Duration) -> usize {
        (d.as_nanos() * u128::from(self.rate_bps) / 8_000_000_000) as usize
    }
}

/// What one direction did with the datagrams offered to it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DirTally {
    /// Datagrams received from the sending end.
    pub offered: u64,
    /// Dropped by the coin.
    pub lost: u64,
    /// Dropped because the queue was full.
    pub tail_dropped: u64,
    /// Handed to the receiving end.
    pub delivered: u64,
}

/// What the relay did: client to server (`up`), server to client (`down`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub up: DirTally,
    pub down: DirTally,
    /// Datagrams from the server before any client spoke (nowhere to send them).
    pub strays: u64,
}

/// splitmix64: a seeded coin whose draws depend on the seed and their count only.
#[derive(Debug)]
pub struct Coin(pub u64);

impl Coin {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Whether the next datagram is dropped, with probability `pct` %.
    pub fn lose(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
}

/// One direction: its coin, the time its link is busy until, and the datagrams on their way
/// with the time each reaches the far end (in that order: the link is first in, first out and
/// the delay fixed).
#[derive(Debug)]
pub struct Link {
    coin: Coin,
    busy_until: Instant,
    in_flight: VecDeque<(Instant, Vec<u8>)>,
    pub tally: DirTally,
    /// The tally's lost and tail-dropped counts before the last offer.
    last: (u64, u64),
}

impl Link {
    pub fn new(seed: u64) -> Link {
        Link {
            coin: Coin(seed),
            busy_until: Instant::now(),
            in_flight: VecDeque::new(),
            tally: DirTally::default(),
            last: (0, 0),
        }
    }

    /// A datagram arrives at `now`: dropped, or queued for the link.
    pub fn offer(&mut self, spec: &PathSpec, now: Instant, datagram: &[u8]) {
        self.tally.offered += 1;
        self.last = (self.tally.lost, self.tally.tail_dropped);
        if self.coin.lose(spec.loss_pct) {
            self.tally.lost += 1;
            return;
        }
        let wire = datagram.len() + HEADERS;
        let start = self.busy_until.max(now);
        // What the link has yet to send before this one (including the rest of the one it is
        // sending).
        let waiting = spec.bytes_in(start - now);
        if waiting + wire > spec.queue_bytes {
            self.tally.tail_dropped += 1;
            return;
        }
        self.busy_until = start + spec.serialisation(wire);
        self.in_flight.push_back((self.busy_until + spec.delay, datagram.to_vec()));
    }

    /// What became of the datagram offered last (for a trace of the run).
    pub fn fate(&self) -> &'static str {
        let t = &self.tally;
        match self.last {
            (lost, _) if lost != t.lost => "LOST",
            (_, tail) if tail != t.tail_dropped => "TAIL-DROPPED",
            _ => "passed",
        }
    }

    /// The next datagram due by `now`, if any.
    pub fn due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.in_flight.front().is_some_and(|(at, _)| *at <= now) {
            self.in_flight.pop_front().map(|(_, d)| d)
        } else {
            None
        }
    }

    /// When the next datagram reaches the far end.
    pub fn next_due(&self) -> Option<Instant> {
        self.in_flight.front().map(|(at, _)| *at)
    }
}

/// A running relay: clients send to [`Relay::addr`]; it speaks to the server from a socket of
/// its own. Stopped and joined by [`Relay::stop`] or on drop.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<Tally>>>,
}

impl Relay {
    /// Relays between whoever last sent to its front socket and `server`, over `spec`, its
    /// coins drawn from `seed` (one stream each way).
    pub fn start(server: SocketAddr, spec: PathSpec, seed: u64) -> io::Result<Relay> {
        let front = UdpSocket::bind("127.0.0.1:0")?;
        let back = UdpSocket::bind("127.0.0.1:0")?;
        back.connect(server)?;
        front.set_nonblocking(true)?;
        back.set_nonblocking(true)?;
        let addr = front.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("lossy-relay".into())
            .spawn(move || run(front, back, spec, seed, &flag))?;
        Ok(Relay { addr, stop, thread: Some(thread) })
    }

    /// Where clients send.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the relay and returns what it did (an error if its sockets failed).
    pub fn stop(mut self) -> io::Result<Tally> {
        self.halt()
    }

    fn halt(&mut self) -> io::Result<Tally> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(io::Error::other("relay thread panicked"))),
            None => Err(io::Error::other("relay already stopped")),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.halt();
        }
    }
}

/// Whether `r` is a receive that found nothing (or an ICMP error from an earlier send to a
/// closed port: the peer went away, which the relay does not mind).
fn nothing(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused)
}

fn run(front: UdpSocket, back: UdpSocket, spec: PathSpec, seed: u64, stop: &AtomicBool) -> io::Result<Tally> {
    // Two independent streams from one seed: the directions' fates do not depend on how their
    // datagrams interleave.
    let (mut up, mut down) = (Link::new(seed ^ 0x5555_5555_5555_5555), Link::new(seed ^ 0xaaaa_aaaa_aaaa_aaaa));
    let mut client: Option<SocketAddr> = None;
    let mut strays = 0;
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let mut moved = false;
        loop {
            match front.recv_from(&mut buf) {
                Ok((n, from)) => {
                    moved = true;
                    client = Some(from);
                    up.offer(&spec, Instant::now(), &buf[..n]);
                    log::debug!("lossy: up {n} bytes {}", up.fate());
                }
                Err(e) if nothing(&e) => break,
                Err(e) => return Err(e),
            }
        }
        loop {
            match back.recv(&mut buf) {
                Ok(n) => {
                    moved = true;
                    if client.is_some() {
                        down.offer(&spec, Instant::now(), &buf[..n]);
                        log::debug!("lossy: down {n} bytes {}", down.fate());
                    } else {
                        strays += 1;
                    }
                }
                Err(e) if nothing(&e) => break,
                Err(e) => return Err(e),
            }
        }
        let now = Instant::now();
        while let Some(d) = up.due(now) {
            up.tally.delivered += 1;
            // A send that fails (the server gone, a full buffer) is a loss like any other.
            let _ = back.send(&d);
        }
        if let Some(to) = client {
            while let Some(d) = down.due(now) {
                down.tally.delivered += 1;
                let _ = front.send_to(&d, to);
            }
        }
        if !moved {
            let next = [up.next_due(), down.next_due()].into_iter().flatten().min();
            let nap = next.map_or(NAP, |at| at.saturating_duration_since(Instant::now()).min(NAP));
            std::thread::sleep(nap);
        }
    }
    Ok(Tally { up: up.tally, down: down.tally, strays })
}
