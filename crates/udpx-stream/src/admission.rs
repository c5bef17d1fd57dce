//! Who may have a flow: return routability (cookies), caps per address and per prefix, and a
//! rate limit on every answer sent to an address not yet proven.
//!
//! A UDP request can carry any source address. Without a check, one 64-byte request with a
//! victim's address would make the server stream to the victim for as long as the request
//! asked (measured before this module: 50 MB in 5 s from one forged datagram). So:
//!
//! - **Cookies** (like DTLS's HelloVerifyRequest or QUIC's Retry): the first answer to a
//!   request is a [`Cookie`], an HMAC-SHA256 (truncated) of the client's address, port and a
//!   coarse time under a key the server draws at start, shared by its shards. It is no larger
//!   than the request and the server keeps no state for it. A flow starts only for a request
//!   that carries a cookie valid for its source address, so only a client that receives at
//!   that address can start one. A cookie is good for [`COOKIE_LIFETIME`] at most.
//! - **Continuing consent**: each flow has a random secret, sent in the acceptance and in
//!   every data datagram; the client echoes it in a keepalive every few seconds, and a flow
//!   not heard from for [`crate::server::CONSENT_TIMEOUT`] ends. One cookie cannot buy an
//!   hour of streaming to an address that stopped asking.
//! - **Caps** ([`Limits`]): flows and total rate per client address and per prefix (/24 for
//!   IPv4, /48 for IPv6), over all shards, so one address or one network cannot take the
//!   server's capacity. The benches, whose clients share one address, raise them and say so.
//! - **Unproven answers** (cookies and refusals) are rate-limited per shard
//!   ([`Limits::unproven_per_sec`]), and none is larger than the request it answers.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::wire::{Cookie, COOKIE_LEN};

/// One cookie time bucket, seconds: a cookie is valid in the bucket it was made in and the
/// next two.
pub const COOKIE_PERIOD_S: u64 = 10;
/// How long a cookie is good for at most.
pub const COOKIE_LIFETIME: std::time::Duration = std::time::Duration::from_secs(3 * COOKIE_PERIOD_S);

/// Makes and checks cookies (see the module docs).
pub struct CookieJar {
    key: hmac::Key,
}

impl std::fmt::Debug for CookieJar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieJar")
    }
}

impl CookieJar {
    /// A jar with a fresh random key.
    pub fn new() -> Result<CookieJar, String> {
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new())
            .map_err(|_| "no randomness for the cookie key".to_string())?;
        Ok(CookieJar { key })
    }

    /// A jar with a given key (tests).
    pub fn with_key(key: &[u8]) -> CookieJar {
        CookieJar { key: hmac::Key::new(hmac::HMAC_SHA256, key) }
    }

    /// The cookie for `client` at `now_s` (seconds of any steady clock).
    pub fn make(&self, client: SocketAddr, now_s: u64) -> Cookie {
        self.make_in(client, now_s / COOKIE_PERIOD_S)
    }

    fn make_in(&self, client: SocketAddr, bucket: u64) -> Cookie {
        let mut msg = [0u8; 16 + 2 + 8];
        let ip = match client.ip() {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        };
        msg[..16].copy_from_slice(&ip.octets());
        msg[16..18].copy_from_slice(&client.port().to_be_bytes());
        msg[18..26].copy_from_slice(&bucket.to_be_bytes());
        let tag = hmac::sign(&self.key, &msg);
        let mut c = [0u8; COOKIE_LEN];
        // The bucket's low byte first (so a check needs one MAC, not three), then the MAC.
        c[0] = bucket as u8;
        c[1..].copy_from_slice(&tag.as_ref()[..COOKIE_LEN - 1]);
        c
    }

    /// Whether `cookie` was made for `client` within the last [`COOKIE_LIFETIME`].
    pub fn check(&self, client: SocketAddr, cookie: &Cookie, now_s: u64) -> bool {
        let now = now_s / COOKIE_PERIOD_S;
        let Some(bucket) = (0..3).map(|back| now.wrapping_sub(back)).find(|b| *b as u8 == cookie[0]) else {
            return false;
        };
        let want = self.make_in(client, bucket);
        // Every byte compared whatever the first difference (no timing oracle on the MAC).
        want.iter().zip(cookie).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// A random flow secret (never 0, which a client reads as "not known yet").
pub fn flow_secret() -> u64 {
    let mut b = [0u8; 8];
    if SystemRandom::new().fill(&mut b).is_err() {
        // No randomness: a secret an attacker cannot guess cannot be made; time is the least
        // bad fallback and the keepalives still need it echoed from the data.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        b = (t.as_nanos() as u64).to_be_bytes();
    }
    u64::from_be_bytes(b).max(1)
}

/// The caps on what one address and one network may take (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Flows at once from one client address.
    pub flows_per_addr: u32,
    /// Flows at once from one prefix (/24, /48).
    pub flows_per_prefix: u32,
    /// Summed rate of one address's flows, bytes/s.
    pub rate_per_addr: u64,
    /// Summed rate of one prefix's flows, bytes/s.
    pub rate_per_prefix: u64,
    /// Answers (cookies, refusals) per second per shard to addresses not yet proven.
    pub unproven_per_sec: u32,
}

impl Default for Limits {
    /// 16 flows and 1 GB/s per address, 256 flows and 4 GB/s per prefix, 10,000 unproven
    /// answers per second per shard.
    fn default() -> Limits {
        Limits {
            flows_per_addr: 16,
            flows_per_prefix: 256,
            rate_per_addr: 1_000_000_000,
            rate_per_prefix: 4_000_000_000,
            unproven_per_sec: 10_000,
        }
    }
}

impl Limits {
    /// The caps for `flows` flows of `rate` bytes/s all from one address (a bench or
    /// self-test): at least enough for them, never below the defaults.
    pub fn raised_for(flows: u32, rate: u64) -> Limits {
        let d = Limits::default();
        let total = rate.saturating_mul(u64::from(flows));
        Limits {
            flows_per_addr: d.flows_per_addr.max(flows),
            flows_per_prefix: d.flows_per_prefix.max(flows),
            rate_per_addr: d.rate_per_addr.max(total),
            rate_per_prefix: d.rate_per_prefix.max(total),
            unproven_per_sec: d.unproven_per_sec.max(flows),
        }
    }

    /// The caps as a person reads them.
    pub fn describe(&self) -> String {
        format!(
            "per address {} flows and {} B/s, per prefix {} flows and {} B/s, {} unproven answers/s per shard",
            self.flows_per_addr, self.rate_per_addr, self.flows_per_prefix, self.rate_per_prefix, self.unproven_per_sec
        )
    }
}

/// The prefix an address counts against: its /24 (IPv4) or /48 (IPv6).
pub fn prefix(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            let o = a.octets();
            IpAddr::from([o[0], o[1], o[2], 0])
        }
        IpAddr::V6(a) => {
            let mut o = a.octets();
            o[6..].fill(0);
            IpAddr::from(o)
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Use {
    flows: u32,
    rate: u64,
}

/// What every shard's flows take, by address and by prefix: entries exist only for addresses
/// with live flows, so the tables are bounded by the server's flow limit.
#[derive(Debug)]
pub struct Caps {
    limits: Limits,
    used: Mutex<(HashMap<IpAddr, Use>, HashMap<IpAddr, Use>)>,
}

impl Caps {
    /// Empty tables under `limits`.
    pub fn new(limits: Limits) -> Caps {
        Caps { limits, used: Mutex::new((HashMap::new(), HashMap::new())) }
    }

    /// The caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Takes one flow of `rate` for `ip`, or says which cap it would pass.
    pub fn admit(&self, ip: IpAddr, rate: u64) -> Result<(), String> {
        let l = &self.limits;
        let ip = ip.to_canonical();
        let net = prefix(ip);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let (by_addr, by_prefix) = &mut *used;
        let a = by_addr.get(&ip).copied().unwrap_or_default();
        let p = by_prefix.get(&net).copied().unwrap_or_default();
        if a.flows + 1 > l.flows_per_addr {
            return Err(format!("{ip} has {} flows, this server's cap per address", a.flows));
        }
        if p.flows + 1 > l.flows_per_prefix {
            return Err(format!("{net}'s network has {} flows, this server's cap per prefix", p.flows));
        }
        if a.rate.saturating_add(rate) > l.rate_per_addr {
            return Err(format!("{ip}'s flows would pass this server's {} B/s per address", l.rate_per_addr));
        }
        if p.rate.saturating_add(rate) > l.rate_per_prefix {
            return Err(format!("{net}'s network would pass this server's {} B/s per prefix", l.rate_per_prefix));
        }
        for (map, key) in [(&mut *by_addr, ip), (&mut *by_prefix, net)] {
            let e = map.entry(key).or_default();
            e.flows += 1;
            e.rate = e.rate.saturating_add(rate);
        }
        Ok(())
    }

    /// Gives back a flow [`Caps::admit`] took.
    pub fn release(&self, ip: IpAddr, rate: u64) {
        let ip = ip.to_canonical();
        let net = prefix(ip);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let (by_addr, by_prefix) = &mut *used;
        for (map, key) in [(by_addr, ip), (by_prefix, net)] {
            if let Some(e) = map.get_mut(&key) {
                e.flows = e.flows.saturating_sub(1);
                e.rate = e.rate.saturating_sub(rate);
                if e.flows == 0 {
                    map.remove(&key);
                }
            }
        }
    }

    /// Addresses and prefixes with live flows (tests: the tables stay bounded).
    pub fn entries(&self) -> (usize, usize) {
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        (used.0.len(), used.1.len())
    }
}

/// A token bucket of `per_sec` tokens a second, holding at most one second's worth.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    per_sec: u32,
    tokens: f64,
    last_ns: u64,
}

impl Bucket {
    /// Full.
    pub fn new(per_sec: u32) -> Bucket {
        Bucket { per_sec, tokens: f64::from(per_sec), last_ns: 0 }
    }

    /// Takes a token at `now_ns` if there is one.
    pub fn take(&mut self, now_ns: u64) -> bool {
        let dt = now_ns.saturating_sub(self.last_ns) as f64 / 1e9;
        self.last_ns = self.last_ns.max(now_ns);
        self.tokens = (self.tokens + dt * f64::from(self.per_sec)).min(f64::from(self.per_sec));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_bound_to_address_port_and_time() {
        let jar = CookieJar::with_key(b"test key");
        let a: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let c = jar.make(a, 1000);
        assert!(jar.check(a, &c, 1000));
        assert!(jar.check(a, &c, 1000 + 2 * COOKIE_PERIOD_S), "still good two periods on");
        assert!(!jar.check(a, &c, 1000 + 3 * COOKIE_PERIOD_S), "expired after the lifetime");
        assert!(!jar.check("192.0.2.1:4001".parse().unwrap(), &c, 1000), "another port");
        assert!(!jar.check("192.0.2.2:4000".parse().unwrap(), &c, 1000), "another address");
        assert!(!jar.check("[::ffff:192.0.2.2]:4000".parse().unwrap(), &c, 1000));
        assert!(jar.check("[::ffff:192.0.2.1]:4000".parse().unwrap(), &c, 1000), "the same address mapped");
        let mut forged = c;
        forged[5] ^= 1;
        assert!(!jar.check(a, &forged, 1000), "one bit changed");
        assert!(!CookieJar::with_key(b"another key").check(a, &c, 1000), "another server's key");
        assert!(!jar.check(a, &[0; COOKIE_LEN], 1000));
    }

    #[test]
    fn caps_per_address_and_prefix() {
        let caps = Caps::new(Limits {
            flows_per_addr: 2,
            flows_per_prefix: 3,
            rate_per_addr: 100,
            rate_per_prefix: 1000,
            unproven_per_sec: 1,
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert!(caps.admit(a, 10).is_ok());
        assert!(caps.admit(a, 10).is_ok());
        assert!(caps.admit(a, 10).unwrap_err().contains("per address"));
        assert!(caps.admit(b, 10).is_ok());
        assert!(caps.admit(b, 10).unwrap_err().contains("per prefix"), "the /24 holds 3");
        assert!(caps.admit("198.51.100.1".parse().unwrap(), 100).is_ok(), "another network");
        assert!(caps.admit("198.51.100.2".parse().unwrap(), 101).unwrap_err().contains("B/s per address"));
        caps.release(a, 10);
        caps.release(a, 10);
        caps.release(b, 10);
        caps.release("198.51.100.1".parse().unwrap(), 100);
        assert_eq!(caps.entries(), (0, 0), "released to nothing");
        assert_eq!(prefix("2001:db8:1:2:3::1".parse().unwrap()), "2001:db8:1::".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn bucket_rate() {
        let mut b = Bucket::new(10);
        let taken = (0..100).filter(|_| b.take(0)).count();
        assert_eq!(taken, 10, "a second's worth at once");
        assert!(!b.take(50_000_000), "half a token after 50 ms");
        assert!(b.take(100_000_000), "one after 100 ms");
    }
}
