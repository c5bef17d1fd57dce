//! Address validation tokens for Retry (RFC 9000 8.1.2), and the keys every host of a
//! service shares.
//!
//! A Retry asks a client to repeat its Initial with a token only the server could have made,
//! for the address the Initial came from and the connection ID the Retry gave it (the client's
//! next Initial is sent to that ID, RFC 9000 17.2.5.2): a client that receives at its address
//! gets it and comes back, a forged source never sees it, and a token seen once on the path
//! validates no second handshake (another DCID does not open it). The token is sealed (AES-128-GCM) under a key
//! the service's hosts share, so a client that comes back through a balancer to another host
//! is still let in:
//!
//! ```text
//!  0      1            13                                   len-16       len
//!  ├ 'R' ─┼─ nonce (12) ┼─ sealed: issued (u64 s) │ odcid len │ odcid ┼─ tag (16) ┤
//!  additional data (authenticated, not sent): 'R', the client's address (16, v4 mapped), port,
//!  the Retry's source connection ID (the DCID of the Initial that brings the token back)
//! ```
//!
//! It holds the original destination connection ID (which the server must echo in its
//! transport parameters) and when it was issued; it is good for [`TOKEN_LIFETIME`] and only
//! from the address and port it was made for. A token from another address, an expired one
//! or a forged one is refused, and the Initial that carries it is dropped (counted).
//!
//! [`ServiceKeys`] derives every shared key of a service (the stateless reset key, the token
//! key, the session ticket keys) from one secret, so one key file serves them all, each under
//! its own label (HMAC-SHA256 of the label under the secret): no key is the secret itself.
//! Without a key file the secret is the process's own, and its session ticket keys are not
//! derived at all: each period's key is drawn at random, shared by the process's shards and
//! forgotten when the next one is drawn, so a ticket key taken from memory opens no earlier
//! period's tickets (forward secrecy for the process's lifetime). With a key file every host
//! derives the same key for a period, as resumption on any host needs; the operator rotates it
//! by replacing the file (a restart reads it; a reload on SIGHUP will).
//!
//! Rolling upgrades: hosts of the same version derive the same reset tokens. A host before
//! 2026-11-27 used the secret itself as its reset key; one after derives it under the label
//! "udpx stateless reset key". While both run, a reset one sends for the other's connection
//! carries a token the client does not know and is ignored: that client waits for its idle
//! timeout, as without shared keys. Nothing else differs between them.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::reset::ResetKey;

/// How long a Retry token is good for.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(10);
/// The first byte of every token of ours.
const MARK: u8 = b'R';
/// Longest token: mark, nonce, issued, length, a 20-byte ID, tag.
pub const MAX_TOKEN_LEN: usize = 1 + 12 + 8 + 1 + 20 + 16;

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    /// Not one of ours, cut, altered, made under another key, or for another address.
    Invalid,
    /// Ours, but older than [`TOKEN_LIFETIME`] (or from the future).
    Expired,
}

/// Seals and opens Retry tokens.
pub struct TokenKey(LessSafeKey);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// From 16 bytes of key.
    pub fn new(key: &[u8; 16]) -> TokenKey {
        TokenKey(LessSafeKey::new(UnboundKey::new(&AES_128_GCM, key).expect("a 16-byte AES-128 key")))
    }

    /// The additional data: mark, address, port, then the Retry's connection ID (at most 20
    /// bytes, its length first) in a fixed buffer; the bytes used.
    fn aad(peer: SocketAddr, retry_cid: &[u8]) -> ([u8; 40], usize) {
        let ip = match peer.ip() {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        };
        let cid = &retry_cid[..retry_cid.len().min(20)];
        let mut a = [0u8; 40];
        a[0] = MARK;
        a[1..17].copy_from_slice(&ip.octets());
        a[17..19].copy_from_slice(&peer.port().to_be_bytes());
        a[19] = cid.len() as u8;
        a[20..20 + cid.len()].copy_from_slice(cid);
        (a, 20 + cid.len())
    }

    /// A token for `peer` carrying `odcid`, issued at `now` in a Retry whose source connection
    /// ID is `retry_cid`.
    pub fn seal(&self, peer: SocketAddr, odcid: &[u8], retry_cid: &[u8], now: SystemTime) -> Vec<u8> {
        let odcid = &odcid[..odcid.len().min(20)];
        let mut nonce = [0u8; 12];
        if SystemRandom::new().fill(&mut nonce).is_err() {
            // A repeated nonce under GCM would be fatal to the key; without randomness no
            // token is made (the Initial is then handled without Retry, or dropped).
            return Vec::new();
        }
        let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let mut sealed = Vec::with_capacity(MAX_TOKEN_LEN);
        sealed.push(MARK);
        sealed.extend_from_slice(&nonce);
        let body_at = sealed.len();
        sealed.extend_from_slice(&secs.to_be_bytes());
        sealed.push(odcid.len() as u8);
        sealed.extend_from_slice(odcid);
        let mut body = sealed.split_off(body_at);
        let n = Nonce::assume_unique_for_key(nonce);
        let (aad, len) = Self::aad(peer, retry_cid);
        if self.0.seal_in_place_append_tag(n, Aad::from(&aad[..len]), &mut body).is_err() {
            return Vec::new();
        }
        sealed.extend_from_slice(&body);
        sealed
    }

    /// The original destination connection ID in `token`, if it is ours, for `peer` and an
    /// Initial sent to `dcid` (the Retry's connection ID it was sealed with), and not older
    /// than [`TOKEN_LIFETIME`] at `now`.
    pub fn open(&self, peer: SocketAddr, token: &[u8], dcid: &[u8], now: SystemTime) -> Result<Vec<u8>, TokenError> {
        if token.len() < 1 + 12 + 8 + 1 + 16 || token.len() > MAX_TOKEN_LEN || token[0] != MARK {
            return Err(TokenError::Invalid);
        }
        let nonce: [u8; 12] = token[1..13].try_into().expect("12 bytes");
        let mut body = token[13..].to_vec();
        let (aad, len) = Self::aad(peer, dcid);
        let plain = self
            .0
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&aad[..len]), &mut body)
            .map_err(|_| TokenError::Invalid)?;
        let issued = u64::from_be_bytes(plain[..8].try_into().expect("8 bytes"));
        let len = usize::from(plain[8]);
        if plain.len() != 9 + len {
            return Err(TokenError::Invalid);
        }
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        // A second's slack for hosts whose clocks differ a little.
        if issued > now + 1 || now.saturating_sub(issued) > TOKEN_LIFETIME.as_secs() {
            return Err(TokenError::Expired);
        }
        Ok(plain[9..].to_vec())
    }
}

/// Bytes of [`ServiceKeys::to_handover`]: flags, secret, whether a ticket key is in force,
/// its period and the key.
pub const HANDOVER_LEN: usize = 1 + 32 + 1 + 8 + 48;

/// How often session ticket keys change.
pub const TICKET_KEY_PERIOD: Duration = Duration::from_secs(12 * 3600);

/// A process's own ticket key: the period it is for and the key, shared by every shard.
type OwnTickets = Arc<Mutex<Option<(u64, [u8; 48])>>>;

/// The keys a service's hosts share, from one secret (or drawn at random for one process).
#[derive(Debug, Clone)]
pub struct ServiceKeys {
    /// Stateless resets ([`crate::reset`]); `None` when no secret was given (random tokens,
    /// no resets: a host alone cannot tell a lost connection from a forged packet).
    pub reset: Option<ResetKey>,
    secret: [u8; 32],
    /// The process's own ticket keys (no shared secret): the period in force and its random
    /// key, shared by every clone (every shard).
    own_tickets: Option<OwnTickets>,
}

impl ServiceKeys {
    /// Keys from the service's shared 32-byte secret (the key file).
    pub fn shared(secret: &[u8; 32]) -> ServiceKeys {
        let reset = ResetKey::new(&derive(secret, b"udpx stateless reset key"));
        ServiceKeys { reset: Some(reset), secret: *secret, own_tickets: None }
    }

    /// The same keys without stateless resets: behind a balancer that does not route by
    /// connection ID (dnat with conntrack), a host that answers another host's IDs with resets
    /// is a token oracle (RFC 9000 21.11); Retry tokens and session tickets stay shared.
    pub fn without_resets(mut self) -> ServiceKeys {
        self.reset = None;
        self
    }

    /// Keys for this process alone: its shards share them, other hosts do not.
    pub fn random() -> ServiceKeys {
        let mut secret = [0u8; 32];
        // Without randomness the keys would be guessable; the process cannot serve safely.
        SystemRandom::new().fill(&mut secret).expect("the kernel's random numbers");
        ServiceKeys { reset: None, secret, own_tickets: Some(Arc::new(Mutex::new(None))) }
    }

    fn derive(&self, label: &[u8]) -> [u8; 32] {
        derive(&self.secret, label)
    }

    /// The keys as bytes for the process that takes over from this one ([`crate::upgrade`],
    /// over a Unix socket only its user can open): the secret, whether resets are on, and a
    /// process's own ticket key in force, so tokens, tickets and resets stay good across it.
    pub fn to_handover(&self) -> Vec<u8> {
        let own = self.own_tickets.as_ref().map(|o| *o.lock().unwrap_or_else(|e| e.into_inner()));
        let mut b = Vec::with_capacity(HANDOVER_LEN);
        b.push(u8::from(self.reset.is_some()) | u8::from(own.is_some()) << 1);
        b.extend_from_slice(&self.secret);
        let (period, key) = own.flatten().unwrap_or((0, [0; 48]));
        b.push(u8::from(own.flatten().is_some()));
        b.extend_from_slice(&period.to_be_bytes());
        b.extend_from_slice(&key);
        b
    }

    /// The keys [`ServiceKeys::to_handover`] wrote, or `None` for bytes of another length.
    pub fn from_handover(b: &[u8]) -> Option<ServiceKeys> {
        if b.len() != HANDOVER_LEN {
            return None;
        }
        let secret: [u8; 32] = b[1..33].try_into().ok()?;
        let mut keys = ServiceKeys::shared(&secret);
        if b[0] & 1 == 0 {
            keys.reset = None;
        }
        if b[0] & 2 != 0 {
            let current = (b[33] == 1).then(|| {
                let period = u64::from_be_bytes(b[34..42].try_into().expect("8 bytes"));
                (period, b[42..90].try_into().expect("48 bytes"))
            });
            keys.own_tickets = Some(Arc::new(Mutex::new(current)));
        }
        Some(keys)
    }

    /// The Retry token key.
    pub fn token_key(&self) -> TokenKey {
        let k = self.derive(b"udpx retry token key");
        TokenKey::new(k[..16].try_into().expect("16 bytes"))
    }

    /// The session ticket key for the period that `now` falls in (48 bytes, as BoringSSL
    /// takes it: name, HMAC key, AES key), and the period's number. Every host derives the same
    /// key for the same period, so a client resumes on any host and any shard; a ticket made
    /// in one period is not accepted in the next.
    pub fn ticket_key(&self, now: SystemTime) -> (u64, [u8; 48]) {
        let period = ticket_period(now);
        (period, self.ticket_key_of(period))
    }

    /// The session ticket key of one period (see [`ServiceKeys::ticket_key`]). For a process's
    /// own keys ([`ServiceKeys::random`]): a random key drawn by the first shard that asks for
    /// a later period, the same for every shard, the earlier one forgotten (a shard that asks
    /// for an earlier period, its clock read just before the change, gets the newest key).
    pub fn ticket_key_of(&self, period: u64) -> [u8; 48] {
        if let Some(own) = &self.own_tickets {
            let mut g = own.lock().unwrap_or_else(|e| e.into_inner());
            match *g {
                Some((p, key)) if p >= period => return key,
                _ => {
                    let mut key = [0u8; 48];
                    SystemRandom::new().fill(&mut key).expect("the kernel's random numbers");
                    *g = Some((period, key));
                    return key;
                }
            }
        }
        let a = self.derive(format!("udpx ticket key {period} a").as_bytes());
        let b = self.derive(format!("udpx ticket key {period} b").as_bytes());
        let mut key = [0u8; 48];
        key[..32].copy_from_slice(&a);
        key[32..].copy_from_slice(&b[..16]);
        key
    }
}

/// HMAC-SHA256 of `label` under `secret`: one key per label.
fn derive(secret: &[u8; 32], label: &[u8]) -> [u8; 32] {
    let k = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let tag = hmac::sign(&k, label);
    tag.as_ref()[..32].try_into().expect("32 bytes")
}

/// The number of the session ticket key period that `now` falls in (cheap: a host checks it
/// every turn and derives a key only when it changes).
pub fn ticket_period(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / TICKET_KEY_PERIOD.as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_only_for_its_address_in_time_under_its_key() {
        let k = TokenKey::new(&[7; 16]);
        let peer: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let odcid = [9u8; 16];
        let rcid = [5u8; 12];
        let t = k.seal(peer, &odcid, &rcid, now);
        assert!(t.len() <= MAX_TOKEN_LEN);
        assert_eq!(k.open(peer, &t, &rcid, now), Ok(odcid.to_vec()));
        assert_eq!(k.open(peer, &t, &rcid, now + TOKEN_LIFETIME), Ok(odcid.to_vec()), "good to its lifetime");
        assert_eq!(k.open(peer, &t, &rcid, now + TOKEN_LIFETIME + Duration::from_secs(1)), Err(TokenError::Expired));
        assert_eq!(k.open("192.0.2.1:5001".parse().unwrap(), &t, &rcid, now), Err(TokenError::Invalid), "another port");
        assert_eq!(
            k.open("192.0.2.2:5000".parse().unwrap(), &t, &rcid, now),
            Err(TokenError::Invalid),
            "another address"
        );
        assert_eq!(k.open(peer, &t, &[6u8; 12], now), Err(TokenError::Invalid), "another handshake's DCID");
        assert_eq!(k.open(peer, &t, &rcid[..11], now), Err(TokenError::Invalid), "a shorter DCID");
        assert_eq!(TokenKey::new(&[8; 16]).open(peer, &t, &rcid, now), Err(TokenError::Invalid), "another key");
        for i in 0..t.len() {
            let mut bad = t.clone();
            bad[i] ^= 1;
            assert!(k.open(peer, &bad, &rcid, now).is_err(), "byte {i} altered");
        }
        assert_eq!(k.open(peer, &t[..t.len() - 1], &rcid, now), Err(TokenError::Invalid), "cut");
        assert_eq!(k.open(peer, b"", &rcid, now), Err(TokenError::Invalid));
        assert_ne!(k.seal(peer, &odcid, &rcid, now), t, "a fresh nonce each time");
    }

    #[test]
    fn service_keys_agree_across_hosts_and_rotate() {
        let (a, b) = (ServiceKeys::shared(&[1; 32]), ServiceKeys::shared(&[1; 32]));
        let peer: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let now = SystemTime::now();
        let t = a.token_key().seal(peer, b"odcid-12345", b"retry-cid", now);
        assert_eq!(
            b.token_key().open(peer, &t, b"retry-cid", now),
            Ok(b"odcid-12345".to_vec()),
            "another host opens it"
        );
        assert!(ServiceKeys::random().token_key().open(peer, &t, b"retry-cid", now).is_err());
        let (p1, k1) = a.ticket_key(now);
        assert_eq!(b.ticket_key(now), (p1, k1));
        let (p2, k2) = a.ticket_key(now + TICKET_KEY_PERIOD);
        assert_eq!(p2, p1 + 1);
        assert_ne!(k1, k2, "a new key each period");
        assert!(a.reset.is_some() && ServiceKeys::random().reset.is_none());
        assert_ne!(
            a.reset.as_ref().unwrap().token(b"cid"),
            ResetKey::new(&[1; 32]).token(b"cid"),
            "the reset key is derived under its own label, not the secret itself"
        );
    }

    #[test]
    fn a_process_own_ticket_keys_are_random_shared_by_its_shards_and_rotate() {
        let k = ServiceKeys::random();
        let shard2 = k.clone();
        let now = SystemTime::now();
        let (p, k1) = k.ticket_key(now);
        assert_eq!(shard2.ticket_key(now), (p, k1), "every shard of the process uses the same key");
        let (_, k2) = shard2.ticket_key(now + TICKET_KEY_PERIOD);
        assert_ne!(k1, k2);
        assert_eq!(k.ticket_key(now + TICKET_KEY_PERIOD).1, k2, "the next period's key, also shared");
        assert_eq!(k.ticket_key(now).1, k2, "a shard a little late gets the newest key, not a new one");
        let other = ServiceKeys::random();
        assert_ne!(other.ticket_key(now).1, k1, "drawn at random, not derived");
        // Derived keys of a shared secret are the same on every host, whatever it drew before.
        let (a, b) = (ServiceKeys::shared(&[3; 32]), ServiceKeys::shared(&[3; 32]));
        assert_eq!(a.ticket_key_of(p), b.ticket_key_of(p));
    }
}

#[cfg(test)]
mod handover_tests {
    use super::*;

    #[test]
    fn keys_cross_a_handover_whole() {
        let now = SystemTime::now();
        let peer: SocketAddr = "192.0.2.9:443".parse().unwrap();
        for keys in
            [ServiceKeys::random(), ServiceKeys::shared(&[3; 32]), ServiceKeys::shared(&[4; 32]).without_resets()]
        {
            let (period, ticket) = keys.ticket_key(now);
            let b = keys.to_handover();
            assert_eq!(b.len(), HANDOVER_LEN);
            let got = ServiceKeys::from_handover(&b).unwrap();
            assert_eq!(got.ticket_key(now), (period, ticket), "the ticket key in force");
            assert_eq!(got.reset.is_some(), keys.reset.is_some());
            let token = keys.token_key().seal(peer, b"odcid-of-8", b"retry-cid", now);
            assert_eq!(got.token_key().open(peer, &token, b"retry-cid", now).unwrap(), b"odcid-of-8");
        }
        assert!(ServiceKeys::from_handover(&[0; 10]).is_none());
    }
}
