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
//!
//! And only for connection IDs this shard may speak for ([`may_reset`]): its own worker byte
//! (a GRO train is steered by its first datagram, so a shard can receive another shard's
//! packets) and its own host ID, or that of a host the operator removed ([`RemovedHosts`]),
//! whose packets a balancer now sends here; and its own generation, or one whose process is
//! gone ([`LiveGenerations`]): during an upgrade both processes share the key, and a train of
//! [an ID of the new process, a victim's ID of the old one] reaches the new process whole, so
//! answering it would hand the victim's token to whoever sent the train. A reset for a live
//! connection of another shard, host or generation would end it: with direct server return,
//! DNAT, or a balancer between two rule sets, another host's IDs do reach this one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ring::hmac;
use udpx::generations::Generations;

use crate::cid::ServerCid;

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

/// Which shard asks [`may_reset`]: its host, its generation, its worker of its group's shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speaker {
    /// The host ID it writes into its connection IDs.
    pub host_id: u16,
    /// Its process's generation byte.
    pub generation: u8,
    /// Its shard index.
    pub worker: u8,
    /// The shards of its group (the steering picks `worker byte % shards`).
    pub shards: usize,
}

/// Whether shard `me` may answer a packet for `cid` with a stateless reset: `cid` is a server
/// connection ID of this service's layout whose worker byte steers to this shard, whose host
/// is this one or a removed one, and whose generation is this shard's or one that no longer
/// serves (`live(generation, worker)` says whether that process still has the ID's socket;
/// asked last, and only for another generation's IDs).
pub fn may_reset(cid: &[u8], me: Speaker, removed: &RemovedHosts, live: impl Fn(u8, u8) -> bool) -> bool {
    let Ok(c) = ServerCid::parse(cid) else { return false };
    let steered_here = usize::from(c.worker) % me.shards.max(1) == usize::from(me.worker);
    steered_here
        && (c.host_id == me.host_id || removed.contains(c.host_id))
        && (c.generation == me.generation || !live(c.generation, c.worker))
}

/// The generations of an upgrade that still serve, as the steering program's socket array
/// says ([`Generations::is_live`]); without upgrades there is one generation, and an ID of
/// another is no live process's.
#[derive(Debug, Clone, Default)]
pub struct LiveGenerations(Option<Arc<Generations>>);

impl LiveGenerations {
    /// Over the upgrade maps `gens`.
    pub fn new(gens: Arc<Generations>) -> LiveGenerations {
        LiveGenerations(Some(gens))
    }

    /// Whether `generation` still has a socket at `worker` (one map look-up, a system call).
    pub fn is_live(&self, generation: u8, worker: u8) -> bool {
        self.0.as_ref().is_some_and(|g| g.is_live(generation, worker))
    }
}

/// The host IDs the operator took out of the service, shared by every shard of a server and
/// changed while it runs (`udpx h3 serve --removed-hosts FILE`, read again on SIGHUP): their
/// connections' packets may reach this host, which then ends them with a stateless reset.
#[derive(Clone)]
pub struct RemovedHosts(Arc<[AtomicU64; 1024]>);

impl std::fmt::Debug for RemovedHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RemovedHosts").field(&self.list()).finish()
    }
}

impl Default for RemovedHosts {
    fn default() -> Self {
        RemovedHosts(Arc::new(std::array::from_fn(|_| AtomicU64::new(0))))
    }
}

impl RemovedHosts {
    /// Whether host `id` was removed.
    pub fn contains(&self, id: u16) -> bool {
        self.0[usize::from(id) / 64].load(Ordering::Relaxed) & (1 << (id % 64)) != 0
    }

    /// Replaces the set with `ids` (each word at once: a reader sees every host of a word
    /// either before or after).
    pub fn set(&self, ids: &[u16]) {
        let mut words = [0u64; 1024];
        for &id in ids {
            words[usize::from(id) / 64] |= 1 << (id % 64);
        }
        for (w, v) in self.0.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// The removed hosts, in order.
    pub fn list(&self) -> Vec<u16> {
        (0..=u16::MAX).filter(|&id| self.contains(id)).collect()
    }

    /// Host IDs from a file's whole text ([`RemovedHosts::parse`]), refused unless it ends
    /// with a newline: a file read while it is being written can end mid-number (`0x0012` cut
    /// to `0x00` names another, live, host), so a list is taken only when it is complete.
    /// Publish a new list by rename (write a new file, then move it over the old one).
    pub fn parse_file(text: &str) -> Result<Vec<u16>, String> {
        list_file(text, host_id)
    }

    /// Host IDs from text: decimal or `0x` hex, separated by commas, white space or lines;
    /// `#` starts a comment.
    pub fn parse(text: &str) -> Result<Vec<u16>, String> {
        list(text, host_id)
    }
}

fn host_id(w: &str) -> Result<u16, String> {
    let n = match w.strip_prefix("0x") {
        Some(h) => u16::from_str_radix(h, 16),
        None => w.parse::<u16>(),
    };
    n.map_err(|_| format!("{w:?} is not a host ID (0 to 65535, or 0x0000 to 0xffff)"))
}

/// The words of a list file's whole text, each read by `word`, refused unless the text ends
/// with a newline (see [`RemovedHosts::parse_file`]: a file read while it is being written).
pub fn list_file<T>(text: &str, word: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the file does not end with a newline: it may be half-written; end every list \
                    with a newline and publish it by rename (write a new file, then mv it over the old)"
            .into());
    }
    list(text, word)
}

/// The words of `text` (separated by commas, white space or lines; `#` starts a comment), each
/// read by `word`.
fn list<T>(text: &str, word: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(|c: char| c == ',' || c.is_whitespace()))
        .filter(|w| !w.is_empty())
        .map(word)
        .collect()
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
    fn a_shard_resets_only_its_own_ids_and_removed_hosts() {
        let cid = |host_id, worker| ServerCid { host_id, nonce: [9; 7], generation: 0, worker }.to_bytes();
        let removed = RemovedHosts::default();
        // Host 1, generation 0, shard 0 of 2; no other generation serves.
        let me = Speaker { host_id: 1, generation: 0, worker: 0, shards: 2 };
        let none = |_, _| false;
        assert!(may_reset(&cid(1, 0), me, &removed, none));
        assert!(may_reset(&cid(1, 2), me, &removed, none), "worker byte 2 steers to shard 0 of 2");
        assert!(!may_reset(&cid(1, 1), me, &removed, none), "shard 1's ID: a GRO train's second datagram");
        assert!(!may_reset(&cid(2, 0), me, &removed, none), "a live host's ID");
        assert!(!may_reset(&[0x0b; 12][..11], me, &removed, none), "not the layout");
        assert!(!may_reset(&[0x0c; 12], me, &removed, none), "another first octet");
        removed.set(&[2, 700]);
        assert!(may_reset(&cid(2, 0), me, &removed, none), "a removed host's ID");
        assert!(!may_reset(&cid(2, 1), me, &removed, none), "still only this shard's worker byte");
        assert_eq!(removed.list(), [2, 700]);
        removed.set(&[]);
        assert!(!may_reset(&cid(2, 0), me, &removed, none));
        assert_eq!(RemovedHosts::parse("2, 0x0003\n# gone\n700 # too\n").unwrap(), [2, 3, 700]);
        assert!(RemovedHosts::parse("70000").unwrap_err().contains("not a host ID"));
        // A file cut while being written is refused whole, not read as far as it goes.
        assert_eq!(RemovedHosts::parse_file("0x0012\n").unwrap(), [0x12]);
        assert_eq!(RemovedHosts::parse_file("").unwrap(), [] as [u16; 0]);
        assert!(RemovedHosts::parse_file("0x0012\n0x00").unwrap_err().contains("half-written"));
    }

    /// The third review's oracle: during an upgrade, a train [an ID of generation 1, a victim's
    /// ID of generation 0] reaches generation 1's shard whole; it must not answer the victim's
    /// ID while generation 0 serves (it would hand out the victim's token), and may once
    /// generation 0 is gone. The liveness look-up is made only for another generation's IDs.
    #[test]
    fn a_shard_resets_another_generations_ids_only_once_that_generation_is_gone() {
        let cid = |generation, worker| ServerCid { host_id: 1, nonce: [9; 7], generation, worker }.to_bytes();
        let removed = RemovedHosts::default();
        let new = Speaker { host_id: 1, generation: 1, worker: 0, shards: 2 };
        let asked = std::cell::Cell::new(0);
        let old_serves = |g: u8, w: u8| {
            asked.set(asked.get() + 1);
            g == 0 && w < 4
        };
        assert!(may_reset(&cid(1, 0), new, &removed, old_serves), "its own generation's ID");
        assert_eq!(asked.get(), 0, "no look-up for its own generation");
        assert!(!may_reset(&cid(0, 0), new, &removed, old_serves), "the victim's: generation 0 still serves");
        assert!(!may_reset(&cid(0, 2), new, &removed, old_serves));
        assert_eq!(asked.get(), 2);
        assert!(may_reset(&cid(0, 0), new, &removed, |_, _| false), "generation 0 is gone: its IDs are reset");
        assert!(may_reset(&cid(7, 2), new, &removed, old_serves), "a generation that never served (or left)");
        assert!(!may_reset(&cid(0, 1), new, &removed, |_, _| false), "still only this shard's worker byte");
        assert!(!LiveGenerations::default().is_live(0, 0), "without upgrades no other generation serves");
    }

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
