//! Stateless resets (RFC 9000 section 10.3) that any host of a service can send.
//!
//! A connection's reset token is derived from its connection ID with a key every host of the
//! service shares (HMAC-SHA256, the first 16 bytes), not drawn at random: so when a balancer
//! sends a connection's packets to a host that does not have it (its own host was removed, or
//! restarted), that host can still end it at once with a reset the client recognizes, instead
//! of dropping its packets until the client's idle timeout. Without a shared key a server's
//! tokens are random and it sends no resets.
//!
//! A reset answers only a short-header packet of at least [`MIN_TRIGGER`] bytes, is always
//! shorter than it (no two endpoints can ping-pong resets), and at most
//! [`crate::Limits::answers_per_sec`] leave a shard per second.

use ring::hmac;

/// Bytes of the shared key.
pub const KEY_LEN: usize = 32;

/// The smallest packet answered: a reset is at least 21 bytes (RFC 9000 10.3) and shorter
/// than what it answers.
pub const MIN_TRIGGER: usize = 22;

/// The shared key.
#[derive(Clone)]
pub struct ResetKey(hmac::Key);

impl std::fmt::Debug for ResetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResetKey(..)")
    }
}

impl ResetKey {
    /// From the key's bytes.
    pub fn new(bytes: &[u8; KEY_LEN]) -> ResetKey {
        ResetKey(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// From 64 hex digits (surrounding white space ignored), e.g. the contents of a key file.
    pub fn from_hex(text: &str) -> Result<ResetKey, String> {
        parse_secret(text).map(|b| ResetKey::new(&b))
    }

    /// The reset token of connection ID `cid`, as quiche takes it (its big-endian bytes are
    /// the token on the wire).
    pub fn token(&self, cid: &[u8]) -> u128 {
        let tag = hmac::sign(&self.0, cid);
        let mut t = [0u8; 16];
        t.copy_from_slice(&tag.as_ref()[..16]);
        u128::from_be_bytes(t)
    }

    /// A stateless reset for a packet of `trigger_len` bytes to connection ID `cid`, written
    /// into `out` with `random` as its unpredictable bits; its length, or `None` when the
    /// packet is too short to answer.
    pub fn write_reset(&self, cid: &[u8], trigger_len: usize, random: &[u8; 64], out: &mut [u8; 64]) -> Option<usize> {
        if trigger_len < MIN_TRIGGER {
            return None;
        }
        // Shorter than the trigger, at most 43 bytes (RFC 9000 10.3's advice for short
        // triggers) plus a little random length, so it looks like any short packet.
        let len = (trigger_len - 1).min(43 + usize::from(random[0] & 0x0f));
        out[..len - 16].copy_from_slice(&random[..len - 16]);
        out[0] = 0x40 | (random[1] & 0x3f); // short header form: fixed bit set, form bit clear
        out[len - 16..len].copy_from_slice(&self.token(cid).to_be_bytes());
        Some(len)
    }
}

/// A service's shared 32-byte secret from 64 hex digits (surrounding white space ignored), e.g.
/// the contents of a key file.
pub fn parse_secret(text: &str) -> Result<[u8; KEY_LEN], String> {
    let t = text.trim();
    if t.len() != 2 * KEY_LEN || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "a service key is {} hex digits (got {} characters); make one with \
             `head -c {KEY_LEN} /dev/urandom | od -An -tx1 | tr -d ' \\n'`",
            2 * KEY_LEN,
            t.len()
        ));
    }
    let mut b = [0u8; KEY_LEN];
    for (i, out) in b.iter_mut().enumerate() {
        *out = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).expect("checked hex digits");
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_key_and_cid_and_resets_are_shorter_than_their_trigger() {
        let a = ResetKey::new(&[1; KEY_LEN]);
        let b = ResetKey::from_hex(&"01".repeat(KEY_LEN)).unwrap();
        let c = ResetKey::new(&[2; KEY_LEN]);
        assert_eq!(a.token(b"cid-1"), b.token(b"cid-1"), "same key, same token: any host can reset");
        assert_ne!(a.token(b"cid-1"), a.token(b"cid-2"));
        assert_ne!(a.token(b"cid-1"), c.token(b"cid-1"));
        let mut out = [0u8; 64];
        for (trigger, rnd) in [(22usize, 0u8), (30, 0x0f), (43, 3), (44, 0), (1200, 0x0f), (1200, 0)] {
            let n = a.write_reset(b"cid-1", trigger, &[rnd; 64], &mut out).unwrap();
            assert!((21..trigger).contains(&n) && n <= 58, "{trigger} -> {n}");
            assert_eq!(out[0] & 0xc0, 0x40, "a short header with the fixed bit");
            assert_eq!(out[n - 16..n], a.token(b"cid-1").to_be_bytes());
        }
        assert_eq!(a.write_reset(b"cid-1", 21, &[0; 64], &mut out), None);
        for bad in ["", "zz", &"0".repeat(63), &"g".repeat(64)] {
            assert!(ResetKey::from_hex(bad).unwrap_err().contains("64 hex digits"), "{bad:?}");
        }
    }
}
