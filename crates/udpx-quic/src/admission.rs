//! Who gets a connection: the caps of a shard, when to ask for a Retry, and the rate of
//! answers to packets that start nothing.
//!
//! Every datagram may be forged. An Initial from an address nobody has proven makes quiche
//! keep state (TLS, buffers: about 24 KiB measured in the attack lab) and send up to three
//! times what it received (RFC 9000 8.1, quiche enforces it). So a shard:
//! - keeps at most [`Limits::max_connections`] connections, [`Limits::max_half_open`] of them
//!   not yet established, and [`Limits::max_per_ip`] from one address; a handshake not done
//!   within [`Limits::handshake_timeout`] is dropped (not kept for the idle timeout), within
//!   [`Limits::flood_handshake_timeout`] if it began while a quarter of the half-open cap was
//!   in use (an Initial flood: the slots must turn over, or forged handshakes hold them all);
//! - answers an Initial with a Retry ([`RetryPolicy`]) when told to always, or (`auto`, as
//!   msquic does) while half-open handshakes pass a threshold: then nothing is kept for an
//!   address until it comes back with the token, and the Retry is smaller than the Initial;
//! - sends Version Negotiation only in answer to a datagram of at least 1,200 bytes (RFC 9000
//!   14.1: a client's first datagram is padded so; a smaller one is garbage or an attack) and
//!   at most [`Limits::answers_per_sec`] a second, like stateless resets.
//!
//! Every refusal is counted ([`crate::HostCounters`]); none is an error of the loop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// When to answer an Initial with a Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetryPolicy {
    /// Never: every Initial that passes the caps makes a connection (the 3x limit holds until
    /// the handshake completes).
    Never,
    /// While more than a quarter of [`Limits::max_half_open`] handshakes are under way (an
    /// Initial flood), else not: a round trip only when under attack.
    #[default]
    Auto,
    /// Always: no state for an address before it proves it receives there.
    Always,
}

impl FromStr for RetryPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<RetryPolicy, String> {
        match s {
            "never" => Ok(RetryPolicy::Never),
            "auto" => Ok(RetryPolicy::Auto),
            "always" => Ok(RetryPolicy::Always),
            _ => Err(format!("--retry {s:?}: give never, auto or always")),
        }
    }
}

impl std::fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RetryPolicy::Never => "never",
            RetryPolicy::Auto => "auto",
            RetryPolicy::Always => "always",
        })
    }
}

/// A shard's caps (see the module docs). The defaults are above what `udpx bench h3` asks of
/// one shard (50,000 connections from 64 addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once.
    pub max_connections: usize,
    /// Connections whose handshake is not done.
    pub max_half_open: usize,
    /// Connections from one address (IPv4, or IPv6 /64: one host's addresses count as one).
    pub max_per_ip: usize,
    /// A handshake not done by then is dropped. 30 s by default: a client on a path that
    /// loses 30 % each way backs its retransmissions off (1, 2, 4, 8 s ...); with 5 s, 1 to 4
    /// of 20 quiche clients through one such path failed in half the runs, and
    /// `tests/loss.rs` (60 paths) saw one dropped while its client still retried in every run
    /// (the interop runner's `handshakeloss` expects every handshake). The half-open cap and
    /// Retry (`auto`) bound what forged Initials hold meanwhile.
    pub handshake_timeout: Duration,
    /// The deadline of a handshake that began while [`Limits::retry_threshold`] handshakes
    /// were under way (5 s by default; at most `handshake_timeout`). Under an Initial flood
    /// from forged addresses with `--retry never` (or Initials that come back with Retry tokens)
    /// the half-open cap fills; with 30 s deadlines its slots turned over every 30 s and a
    /// real client was refused for that long (`udpx bench h3 --flood 5000 --flood-seconds 15
    /// --flood-retry never`, 2026-11-27: 5 of 144 downloads failed during the flood and the one
    /// after it too, 0 handshakes timed out in the window).
    pub flood_handshake_timeout: Duration,
    /// When to send Retry.
    pub retry: RetryPolicy,
    /// Stateless answers sent per second, at most, of each kind ([`Answer`]: Version
    /// Negotiation, stateless resets, refusals): a flood that draws one kind does not starve
    /// the others.
    pub answers_per_sec: u32,
}

impl Default for Limits {
    /// 100,000 connections, 8,192 half-open, 4,096 per address, handshakes of at most 30 s
    /// (5 s under an Initial flood), Retry when under an Initial flood, 1,000 stateless
    /// answers a second.
    fn default() -> Limits {
        Limits {
            max_connections: 100_000,
            max_half_open: 8_192,
            max_per_ip: 4_096,
            handshake_timeout: Duration::from_secs(30),
            flood_handshake_timeout: Duration::from_secs(5),
            retry: RetryPolicy::Auto,
            answers_per_sec: 1_000,
        }
    }
}

impl Limits {
    /// Half-open handshakes past which `auto` sends Retry.
    pub fn retry_threshold(&self) -> usize {
        (self.max_half_open / 4).max(1)
    }

    /// Refuses values no server can run with, saying which.
    pub fn check(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.max_half_open == 0 || self.max_per_ip == 0 {
            return Err(format!(
                "connection caps ({} in all, {} half-open, {} per address): give each at least 1",
                self.max_connections, self.max_half_open, self.max_per_ip
            ));
        }
        if self.handshake_timeout < Duration::from_millis(100) || self.handshake_timeout > Duration::from_secs(60) {
            return Err(format!("handshake timeout {:?}: give 0.1 to 60 s", self.handshake_timeout));
        }
        if self.flood_handshake_timeout < Duration::from_millis(100) {
            return Err(format!(
                "handshake timeout under a flood {:?}: give at least 0.1 s",
                self.flood_handshake_timeout
            ));
        }
        Ok(())
    }
}

/// What the cap check says of a new connection from an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Make the connection.
    Accept,
    /// Ask for a Retry first.
    Retry,
    /// Refuse (which cap): drop the Initial, count it.
    Refuse(Cap),
}

/// The cap an Initial met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// [`Limits::max_connections`].
    Connections,
    /// [`Limits::max_half_open`].
    HalfOpen,
    /// [`Limits::max_per_ip`].
    PerIp,
}

/// A shard's counts against its [`Limits`].
#[derive(Debug, Default)]
pub struct Admission {
    limits: Limits,
    connections: usize,
    half_open: usize,
    by_ip: HashMap<IpAddr, u32>,
}

/// The address a connection counts against: IPv4 as is, IPv6 by its /64.
pub fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(a) => {
            let mut o = a.octets();
            o[8..].fill(0);
            IpAddr::from(o)
        }
        v4 => v4,
    }
}

impl Admission {
    /// Counts against `limits`.
    pub fn new(limits: Limits) -> Admission {
        Admission { limits, ..Admission::default() }
    }

    /// The caps.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Connections counted now, and of them half-open.
    pub fn counts(&self) -> (usize, usize) {
        (self.connections, self.half_open)
    }

    /// Addresses with connections (bounded by the connection cap).
    pub fn addresses(&self) -> usize {
        self.by_ip.len()
    }

    /// Whether an Initial from `ip` may make a connection, needs a Retry (`validated`: it
    /// carried a valid token already), or is refused.
    pub fn check(&self, ip: IpAddr, validated: bool) -> Admit {
        let l = &self.limits;
        if self.connections >= l.max_connections {
            return Admit::Refuse(Cap::Connections);
        }
        if self.half_open >= l.max_half_open {
            return Admit::Refuse(Cap::HalfOpen);
        }
        if self.by_ip.get(&ip_key(ip)).is_some_and(|&n| n as usize >= l.max_per_ip) {
            return Admit::Refuse(Cap::PerIp);
        }
        let retry = match l.retry {
            RetryPolicy::Never => false,
            RetryPolicy::Always => true,
            RetryPolicy::Auto => self.half_open >= l.retry_threshold(),
        };
        if retry && !validated {
            Admit::Retry
        } else {
            Admit::Accept
        }
    }

    /// The deadline of a handshake beginning now: [`Limits::flood_handshake_timeout`] while a
    /// quarter of the half-open cap is in use, else [`Limits::handshake_timeout`].
    pub fn handshake_timeout(&self) -> Duration {
        let l = &self.limits;
        if self.half_open >= l.retry_threshold() {
            l.flood_handshake_timeout.min(l.handshake_timeout)
        } else {
            l.handshake_timeout
        }
    }

    /// A connection from `ip` was made (half-open).
    pub fn opened(&mut self, ip: IpAddr) {
        self.connections += 1;
        self.half_open += 1;
        *self.by_ip.entry(ip_key(ip)).or_insert(0) += 1;
    }

    /// A connection finished its handshake.
    pub fn established(&mut self) {
        self.half_open = self.half_open.saturating_sub(1);
    }

    /// A connection from `ip` is gone (`was_half_open`: it never finished its handshake).
    pub fn closed(&mut self, ip: IpAddr, was_half_open: bool) {
        self.connections = self.connections.saturating_sub(1);
        if was_half_open {
            self.half_open = self.half_open.saturating_sub(1);
        }
        let k = ip_key(ip);
        if let Some(n) = self.by_ip.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.by_ip.remove(&k);
            }
        }
    }
}

/// At most `per_sec` events a second (a fixed one-second window).
#[derive(Debug)]
pub struct Rate {
    per_sec: u32,
    window: Instant,
    used: u32,
}

/// The kinds of stateless answer a server sends to packets no connection takes, each with a
/// budget of its own ([`Answers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Version Negotiation, to an Initial of a version quiche does not speak.
    VersionNegotiation,
    /// A stateless reset, to a short-header packet for an unknown connection ID.
    Reset,
    /// A server Initial closing with CONNECTION_REFUSED, to an Initial turned away.
    Refusal,
}

/// A [`Rate`] per kind of stateless answer: answers to a forged packet of one kind (e.g. a
/// flood of unknown versions) use up their own budget only, so resets that end a client's
/// dead connection, and refusals that tell a real client why, still go.
#[derive(Debug)]
pub struct Answers([Rate; 3]);

impl Answers {
    /// `per_sec` of each kind a second.
    pub fn new(per_sec: u32) -> Answers {
        Answers(std::array::from_fn(|_| Rate::new(per_sec)))
    }

    /// Whether one more answer of `kind` is allowed at `now` (and counts it).
    pub fn allow(&mut self, kind: Answer, now: Instant) -> bool {
        self.0[kind as usize].allow(now)
    }
}

impl Rate {
    /// `per_sec` a second.
    pub fn new(per_sec: u32) -> Rate {
        Rate { per_sec, window: Instant::now(), used: 0 }
    }

    /// Whether one more is allowed at `now` (and counts it).
    pub fn allow(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.used = 0;
        }
        if self.used >= self.per_sec {
            return false;
        }
        self.used += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_answer_has_its_own_budget() {
        let mut a = Answers::new(3);
        let now = Instant::now();
        for _ in 0..3 {
            assert!(a.allow(Answer::VersionNegotiation, now));
        }
        assert!(!a.allow(Answer::VersionNegotiation, now), "its budget is used up");
        assert!(a.allow(Answer::Reset, now), "a reset still goes");
        assert!(a.allow(Answer::Refusal, now), "a refusal still goes");
        assert!(a.allow(Answer::VersionNegotiation, now + Duration::from_secs(1)), "a second later");
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn caps_in_order_and_released() {
        let l = Limits {
            max_connections: 3,
            max_half_open: 2,
            max_per_ip: 2,
            retry: RetryPolicy::Never,
            ..Limits::default()
        };
        let mut a = Admission::new(l);
        assert_eq!(a.check(ip("192.0.2.1"), false), Admit::Accept);
        a.opened(ip("192.0.2.1"));
        a.opened(ip("192.0.2.1"));
        assert_eq!(a.check(ip("192.0.2.9"), false), Admit::Refuse(Cap::HalfOpen));
        a.established();
        assert_eq!(a.check(ip("192.0.2.1"), false), Admit::Refuse(Cap::PerIp));
        assert_eq!(a.check(ip("::ffff:192.0.2.1"), false), Admit::Refuse(Cap::PerIp), "the same address mapped");
        a.opened(ip("192.0.2.9"));
        assert_eq!(a.check(ip("192.0.2.10"), false), Admit::Refuse(Cap::Connections));
        a.closed(ip("192.0.2.1"), false);
        a.closed(ip("192.0.2.1"), true);
        a.closed(ip("192.0.2.9"), true);
        assert_eq!((a.counts(), a.addresses()), ((0, 0), 0));
        assert_eq!(ip_key(ip("2001:db8::1:2")), ip_key(ip("2001:db8::ffff")), "one /64, one host");
    }

    #[test]
    fn retry_policies() {
        let mut l = Limits { max_half_open: 8, retry: RetryPolicy::Always, ..Limits::default() };
        let a = Admission::new(l);
        assert_eq!(a.check(ip("192.0.2.1"), false), Admit::Retry);
        assert_eq!(a.check(ip("192.0.2.1"), true), Admit::Accept, "a valid token is the proof");
        l.retry = RetryPolicy::Auto;
        let mut a = Admission::new(l);
        assert_eq!(a.check(ip("192.0.2.1"), false), Admit::Accept, "no flood: no round trip");
        for _ in 0..l.retry_threshold() {
            a.opened(ip("192.0.2.1"));
        }
        assert_eq!(a.check(ip("192.0.2.2"), false), Admit::Retry, "a quarter of the half-open cap: Retry");
        assert_eq!("always".parse(), Ok(RetryPolicy::Always));
        assert!("sometimes".parse::<RetryPolicy>().unwrap_err().contains("never, auto or always"));
    }

    #[test]
    fn rate() {
        let mut r = Rate::new(3);
        let t = Instant::now();
        assert_eq!((0..10).filter(|_| r.allow(t)).count(), 3);
        assert!(r.allow(t + Duration::from_secs(1)));
    }
}
