//! A delay line in the router of a [`LineNet`]: every packet it forwards, both ways, waits a
//! fixed time in user space before it goes on, so the line has a round-trip time.
//!
//! netem is the usual tool and is not in every kernel (this project's CI kernel has none), so
//! the router routes what it forwards into a TUN device instead; a thread reads each packet,
//! holds it for the one-way delay and writes it back into the device, from which the kernel
//! routes it on to its destination as before:
//!
//! ```text
//!  client ─▶ router: iif = either veth ─▶ table 64: default dev udly0 ─▶ the thread holds it
//!                                                                       │ one_way
//!           router: iif = udly0 ─▶ main table ─▶ the other veth ◀───────┘
//! ```
//!
//! A constant delay keeps every packet's order. What the line holds is bounded
//! ([`MAX_HELD_BYTES`]); beyond it a packet is dropped and counted, as a full queue would.
//! The thread wakes at millisecond granularity (epoll), so a packet may wait up to about a
//! millisecond longer than asked, never less. The thread's CPU is the router's, not the
//! server's or the client's; on a small machine it is part of the load, so a bench says so.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::{Error, LineNet, Node, Port};

/// The most the line holds at once, in bytes of packets; beyond it packets are dropped.
pub const MAX_HELD_BYTES: usize = 64 << 20;

/// The longest one-way delay a line takes.
pub const MAX_ONE_WAY: Duration = Duration::from_secs(1);

/// The TUN device's name inside the router's namespace.
const DEV: &str = "udly0";

/// The routing table the router sends forwarded packets to, and its rules' preferences.
const TABLE: &str = "64";
const PREFS: [&str; 2] = ["64", "65"];

/// What a line did, read when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelayCounters {
    /// Packets written back into the router after their delay.
    pub forwarded: u64,
    /// Packets dropped: the line held [`MAX_HELD_BYTES`] already, or the router refused them
    /// when they were written back.
    pub dropped: u64,
    /// The most bytes held at once.
    pub max_held_bytes: usize,
    /// The most a packet waited beyond its delay, microseconds.
    pub max_late_us: u64,
}

/// A running delay line; dropping it (or [`DelayLine::stop`]) takes the routing through it out
/// and ends its thread, so the router forwards at once again.
#[derive(Debug)]
pub struct DelayLine {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<DelayCounters, String>>>,
    router: String,
    one_way: Duration,
}

impl LineNet {
    /// Delays every packet the router forwards, both ways, by `one_way` (the line's round trip
    /// grows by twice that): see [`crate::delay`]. 1 us to [`MAX_ONE_WAY`]; one line per
    /// [`LineNet`] at a time.
    pub fn delay(&self, one_way: Duration) -> Result<DelayLine, Error> {
        if one_way.is_zero() || one_way > MAX_ONE_WAY {
            return Err(Error::InvalidConfig { why: format!("a delay of {one_way:?}: give 1 us to 1 s") });
        }
        let mtu = u16::try_from(self.mtu()).unwrap_or(u16::MAX);
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), String>>(1);
        let flag = stop.clone();
        let router = self.ns(Node::Router);
        let thread = router.try_spawn(move || run(one_way, mtu, &flag, &ready_tx))?;
        // From here on, dropping `line` undoes whatever was set up.
        let line = DelayLine { stop, thread: Some(thread), router: router.name().to_string(), one_way };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::InvalidConfig { why: format!("the delay line's TUN device: {e}") }),
            Err(_) => return Err(Error::InvalidConfig { why: "the delay line's thread ended at its start".into() }),
        }
        router.exec(&["sysctl", "-q", "-w", &format!("net.ipv4.conf.{DEV}.rp_filter=0")])?;
        router.exec(&["ip", "route", "replace", "default", "dev", DEV, "table", TABLE])?;
        for (port, pref) in [Port::RouterServer, Port::RouterClient].into_iter().zip(PREFS) {
            router.exec(&["ip", "rule", "add", "iif", self.dev(port), "lookup", TABLE, "pref", pref])?;
        }
        Ok(line)
    }
}

impl DelayLine {
    /// The one-way delay.
    pub fn one_way(&self) -> Duration {
        self.one_way
    }

    /// Takes the routing through the line out and ends its thread: what it did.
    pub fn stop(mut self) -> Result<DelayCounters, Error> {
        self.finish()
    }

    fn finish(&mut self) -> Result<DelayCounters, Error> {
        for pref in PREFS {
            // Absent when the setup failed before it, or the namespace is gone: nothing to undo.
            let _ = std::process::Command::new("ip")
                .args(["-n", &self.router, "rule", "del", "pref", pref])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
        self.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else { return Ok(DelayCounters::default()) };
        match thread.join() {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(Error::InvalidConfig { why: format!("the delay line: {e}") }),
            Err(_) => Err(Error::InvalidConfig { why: "the delay line's thread panicked".into() }),
        }
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// The thread: opens the device, says so, then holds and forwards until told to stop.
fn run(
    one_way: Duration,
    mtu: u16,
    stop: &AtomicBool,
    ready: &mpsc::SyncSender<Result<(), String>>,
) -> Result<DelayCounters, String> {
    let (mut dev, mut poll) = match open(mtu) {
        Ok(x) => {
            let _ = ready.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let mut events = Events::with_capacity(4);
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut held_bytes = 0usize;
    let mut c = DelayCounters::default();
    let mut buf = vec![0u8; usize::from(mtu) + 64];
    while !stop.load(Ordering::Relaxed) {
        // Until a packet comes, the head is due, or 50 ms (to see the stop flag).
        let now = Instant::now();
        let wait = held.front().map_or(Duration::from_millis(50), |(due, _)| due.saturating_duration_since(now));
        if !wait.is_zero() {
            poll.poll(&mut events, Some(wait.min(Duration::from_millis(50)))).map_err(|e| format!("epoll: {e}"))?;
        }
        // Everything that has come (the wake is edge-triggered: read to EAGAIN).
        loop {
            match dev.read(&mut buf) {
                Ok(0) => break,
                Ok(n) if held_bytes + n > MAX_HELD_BYTES => c.dropped += 1,
                Ok(n) => {
                    held_bytes += n;
                    c.max_held_bytes = c.max_held_bytes.max(held_bytes);
                    held.push_back((Instant::now() + one_way, buf[..n].to_vec()));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read from {DEV}: {e}")),
            }
        }
        // Everything due, in order.
        let now = Instant::now();
        while let Some((due, p)) = held.pop_front() {
            if due > now {
                held.push_front((due, p));
                break;
            }
            held_bytes -= p.len();
            let late = u64::try_from(now.duration_since(due).as_micros()).unwrap_or(u64::MAX);
            c.max_late_us = c.max_late_us.max(late);
            match dev.write(&p) {
                // A TUN device takes a packet whole or not at all.
                Ok(n) if n == p.len() => c.forwarded += 1,
                // The router refused it (no route, a full backlog): a loss, as on a link.
                Ok(_) | Err(_) => c.dropped += 1,
            }
        }
    }
    Ok(c)
}

/// A non-blocking TUN device (no packet information), up, and an epoll set watching it.
fn open(mtu: u16) -> Result<(tun::Device, Poll), String> {
    let mut cfg = tun::Configuration::default();
    cfg.tun_name(DEV).mtu(mtu).layer(tun::Layer::L3).up();
    let dev = tun::create(&cfg).map_err(|e| format!("create {DEV}: {e}"))?;
    dev.set_nonblock().map_err(|e| format!("{DEV}: non-blocking: {e}"))?;
    let poll = Poll::new().map_err(|e| format!("epoll: {e}"))?;
    poll.registry()
        .register(&mut SourceFd(&dev.as_raw_fd()), Token(0), Interest::READABLE)
        .map_err(|e| format!("epoll {DEV}: {e}"))?;
    Ok((dev, poll))
}
