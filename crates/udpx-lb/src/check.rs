//! Which host a connection ID or a UDP payload reaches, and why: the rules of [`crate::nft`]
//! replayed in Rust, rule by rule, with the same offsets and the same fall-through.

use std::fmt;

use udpx_quic::cid::CID_LEN;

use crate::nft::{Balancer, Host};

/// Which rule of the ruleset a packet meets, and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A short header whose server ID is in the map (rule `short_cid`).
    ShortCid {
        /// The server ID read at `@th,80,16`.
        server_id: u16,
        /// The host it names.
        host: Host,
    },
    /// A Handshake (or Retry) long header with a 12-byte, rotation-000 DCID whose server ID is
    /// in the map (rule `long_cid`).
    LongCid {
        /// The server ID read at `@th,120,16`.
        server_id: u16,
        /// The host it names.
        host: Host,
    },
    /// An Initial or 0-RTT packet: hashed by its 4-tuple (rule `initial_hash`), never routed by
    /// the connection ID it carries, which a client chooses (and could choose to name a
    /// draining host); which host depends on the balancer's jhash seed.
    InitialHash,
    /// The 4-tuple hash (rule `fallback`).
    Fallback {
        /// Why no earlier rule took it.
        why: String,
    },
}

impl Route {
    /// The host, when the rules name one (not a hash).
    pub fn host(&self) -> Option<Host> {
        match self {
            Route::ShortCid { host, .. } | Route::LongCid { host, .. } => Some(*host),
            Route::InitialHash | Route::Fallback { .. } => None,
        }
    }

    /// The name of the nft counter that counts it ([`crate::nft::COUNTERS`]).
    pub fn counter(&self) -> &'static str {
        match self {
            Route::ShortCid { .. } => "short_cid",
            Route::LongCid { .. } => "long_cid",
            Route::InitialHash => "initial_hash",
            Route::Fallback { .. } => "fallback",
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::ShortCid { server_id, host } => write!(
                f,
                "host {} via {}: short header, server ID {server_id:#06x} in the connection ID (rule short_cid)",
                host.id, host.next_hop
            ),
            Route::LongCid { server_id, host } => write!(
                f,
                "host {} via {}: long header with a server connection ID, server ID {server_id:#06x} (rule long_cid)",
                host.id, host.next_hop
            ),
            Route::InitialHash => write!(
                f,
                "one host by jhash of the 4-tuple: an Initial or 0-RTT, never routed by the connection ID it \
                 carries (a client chooses it); all of one client's Initials share its address and port, so they \
                 reach the host its first one did, which depends on the balancer's jhash seed (rule initial_hash)"
            ),
            Route::Fallback { why } => write!(
                f,
                "one host by jhash of the 4-tuple: {why}; a client whose address or port changes may reach another \
                 host (rule fallback)"
            ),
        }
    }
}

/// What a short header with this connection ID (`cid`, the whole DCID) meets.
pub fn cid(b: &Balancer, cid: &[u8]) -> Route {
    if cid.len() < 3 {
        return Route::Fallback { why: format!("a {}-byte connection ID has no server ID (octets 1-2)", cid.len()) };
    }
    let mut payload = vec![0x40];
    payload.extend_from_slice(cid);
    packet(b, &payload)
}

/// What a UDP payload sent to the VIP's port meets, rule by rule as in the ruleset.
pub fn packet(b: &Balancer, p: &[u8]) -> Route {
    let Some(&first) = p.first() else {
        return Route::Fallback { why: "an empty payload".into() };
    };
    let long = first & 0x80 != 0;
    if !long {
        // @th,72,3 0 and @th,80,16: payload bytes 1..4.
        if p.len() < 4 {
            return Route::Fallback {
                why: format!("a short header needs 4 bytes to hold a server ID, got {}", p.len()),
            };
        }
        if p[1] >> 5 != 0 {
            return Route::Fallback { why: format!("config rotation {:03b} in DCID octet 0, not 000", p[1] >> 5) };
        }
        let server_id = u16::from_be_bytes([p[2], p[3]]);
        return match b.host(server_id) {
            Some((_, host)) => Route::ShortCid { server_id, host },
            None => Route::Fallback { why: format!("short header with server ID {server_id:#06x}, which no host has") },
        };
    }
    // @th,66,1 0: long packet type 00 (Initial) or 01 (0-RTT): by the 4-tuple whatever its DCID
    // says. Its DCID is the client's choice until the server answers, and a client's later
    // Initials (a retransmission, an ACK coalesced with its first Handshake packet) carry the
    // server's ID but the same 4-tuple as its first one, so they reach the same host.
    if first & 0x20 == 0 {
        return Route::InitialHash;
    }
    // Handshake or Retry: @th,104,8 is byte 5 (DCID length), @th,112,3 byte 6, @th,120,16 bytes 7-8.
    let mut why = None;
    if p.len() >= 9 && usize::from(p[5]) == CID_LEN && p[6] >> 5 == 0 {
        let server_id = u16::from_be_bytes([p[7], p[8]]);
        match b.host(server_id) {
            Some((_, host)) => return Route::LongCid { server_id, host },
            None => why = Some(format!("long header with server ID {server_id:#06x}, which no host has")),
        }
    }
    let why = why.unwrap_or_else(|| {
        if p.len() < 9 {
            format!("a long header needs 9 bytes to hold a server ID, got {}", p.len())
        } else {
            format!(
                "a Handshake or Retry whose DCID (length {}, octet 0 {:#04x}) is not a server connection ID",
                p[5], p[6]
            )
        }
    });
    Route::Fallback { why }
}

/// Bytes from hex (`0b0001...`, spaces, colons and a `0x` prefix allowed).
pub fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let t = s.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    let digits: Vec<u8> = t.bytes().filter(|c| !matches!(c, b' ' | b':' | b'\n' | b'\t' | b'-')).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("{s:?}: an odd number of hex digits; give two per byte"));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).unwrap_or("??");
            u8::from_str_radix(text, 16).map_err(|_| format!("{s:?}: {text:?} is not a hex byte"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use udpx_quic::cid::{CidGenerator, ServerCid};

    use super::*;
    use crate::nft::Mode;

    fn b() -> Balancer {
        let hosts = vec!["1=10.78.1.2".parse().unwrap(), "2=10.78.2.2".parse().unwrap()];
        Balancer::new(Ipv4Addr::new(10, 78, 100, 1), 443, hosts, Mode::Stateless).unwrap()
    }

    #[test]
    fn server_cids_reach_their_host_in_both_headers() {
        for id in [1u16, 2] {
            let c = CidGenerator::new(id, 3).next_cid().unwrap();
            let short = [&[0x41u8][..], &c, &[0xaa; 30]].concat();
            let r = packet(&b(), &short);
            assert_eq!(r.host().map(|h| h.id), Some(id), "{r}");
            assert_eq!(r.counter(), "short_cid");
            assert_eq!(cid(&b(), &c), r);
            // A Handshake packet goes by the server CID it carries.
            let long = [&[0xe0u8, 0, 0, 0, 1, CID_LEN as u8][..], &c, &[8], &[9; 8], &[0; 40]].concat();
            let r = packet(&b(), &long);
            assert_eq!(r, Route::LongCid { server_id: id, host: b().hosts()[usize::from(id) - 1] });
            assert!(r.to_string().contains("rule long_cid"), "{r}");
            // An Initial or 0-RTT never does, even with a live host's ID: by its 4-tuple.
            for first in [0xc0u8, 0xd0] {
                let long = [&[first, 0, 0, 0, 1, CID_LEN as u8][..], &c, &[8], &[9; 8], &[0; 1180]].concat();
                assert_eq!(packet(&b(), &long), Route::InitialHash, "{first:#x}");
            }
        }
    }

    /// The third review: an Initial whose DCID imitates a draining host's ID reached it; the
    /// draining host's own Handshake packets still do.
    #[test]
    fn an_initial_naming_a_draining_host_is_hashed_away_from_it() {
        let draining = b().with_draining(&[2]).unwrap();
        let c = CidGenerator::new(2, 3).next_cid().unwrap();
        let initial = [&[0xc0u8, 0, 0, 0, 1, CID_LEN as u8][..], &c, &[0; 1188]].concat();
        assert_eq!(packet(&draining, &initial), Route::InitialHash);
        assert_eq!(draining.taking().iter().map(|h| h.id).collect::<Vec<_>>(), [1], "the hash skips host 2");
        let handshake = [&[0xe0u8, 0, 0, 0, 1, CID_LEN as u8][..], &c, &[0; 40]].concat();
        assert_eq!(packet(&draining, &handshake).host().map(|h| h.id), Some(2));
    }

    #[test]
    fn initials_hash_and_the_rest_falls_back() {
        let dcid = [0xf1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
        let initial = [&[0xc3u8, 0, 0, 0, 1, 16][..], &dcid, &[8], &[0; 1180]].concat();
        assert_eq!(packet(&b(), &initial), Route::InitialHash);
        assert!(packet(&b(), &initial).to_string().contains("jhash of the 4-tuple"));
        // A 12-byte client DCID that looks like a server CID of an unknown host: hashed.
        let unknown = ServerCid { host_id: 9, nonce: [1; 7], generation: 0, worker: 0 }.to_bytes();
        let initial = [&[0xc0u8, 0, 0, 0, 1, 12][..], &unknown, &[0; 1180]].concat();
        assert_eq!(packet(&b(), &initial).counter(), "initial_hash");
        let handshake = [&[0xe0u8, 0, 0, 0, 1, 12][..], &unknown, &[0; 40]].concat();
        let r = packet(&b(), &handshake);
        assert_eq!(r.counter(), "fallback");
        assert!(r.to_string().contains("0x0009, which no host has"), "{r}");
        let cases: &[(&[u8], &str)] = &[
            (&[], "empty"),
            (&[0x40], "needs 4 bytes"),
            (&[0x40, 0x0b, 0], "needs 4 bytes"),
            (&[0x40, 0x2b, 0, 1, 0, 0], "rotation 001"),
            (&[0x40, 0x0b, 0, 7, 0, 0], "0x0007, which no host has"),
            (&[0xe0, 0, 0], "needs 9 bytes"),
            (&[0xf0, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5], "is not a server connection ID"),
        ];
        for (p, needle) in cases {
            let r = packet(&b(), p);
            assert_eq!(r.counter(), "fallback", "{p:02x?}");
            assert!(r.to_string().contains(needle), "{p:02x?}: {r}");
        }
        // A truncated Initial is hashed by its 4-tuple all the same (nothing in it is read).
        assert_eq!(packet(&b(), &[0xc0, 0, 0, 0, 1, 8, 1, 2]), Route::InitialHash);
        assert!(cid(&b(), &[0x0b]).to_string().contains("1-byte connection ID has no server ID"));
        // Non-QUIC text to the port: a short header by its first bit, checked like one.
        assert_eq!(packet(&b(), b"hello, balancer").counter(), "fallback");
    }

    #[test]
    fn hex_parses() {
        assert_eq!(parse_hex("0x0b 00:01-ff").unwrap(), vec![0x0b, 0, 1, 0xff]);
        assert_eq!(parse_hex("").unwrap(), Vec::<u8>::new());
        assert!(parse_hex("abc").unwrap_err().contains("odd"));
        assert!(parse_hex("zz").unwrap_err().contains("not a hex byte"));
    }
}
