//! QUIC version 1 Initial packet protection (RFC 9001 5): keys that anyone derives from the
//! client's first destination connection ID, so an Initial proves nothing about its sender.
//! Two users: the flood bench's forged client Initials (`udpx-h3-bench`), and the one stateless
//! answer the host makes in a server's Initial, [`refusal`]: a CONNECTION_CLOSE with
//! CONNECTION_REFUSED (RFC 9000 5.2.2) for an Initial the admission caps turn away, so the
//! client stops at once instead of retrying into the cap until its handshake times out
//! (quiche has no stateless close of its own).
//!
//! ```text
//!  server Initial:  0xc0 | version 1 | DCID = the client's SCID | SCID = ours | token 0
//!                   | length | packet number 0 (1 byte) | CONNECTION_CLOSE(0x1c,
//!                   CONNECTION_REFUSED, frame type 0, reason) | PADDING | AEAD tag
//! ```
//!
//! Its cost to the client's address: about 80 bytes for a datagram of at least 1,200, well
//! inside the 3x anti-amplification limit; the host charges it to its answers budget (it is
//! unauthenticated, like a Version Negotiation).

use ring::aead::{self, quic, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;

/// RFC 9001 5.2: the Initial salt of QUIC version 1.
const INITIAL_SALT_V1: [u8; 20] = [
    0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f,
    0x0a,
];

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label (RFC 8446 7.1) with an empty context, `out.len()` bytes.
fn expand_label(prk: &hkdf::Prk, label: &[u8], out: &mut [u8]) {
    let len = (out.len() as u16).to_be_bytes();
    let full_len = [(6 + label.len()) as u8];
    let info: [&[u8]; 5] = [&len, &full_len, b"tls13 ", label, &[0]];
    prk.expand(&info, Len(out.len())).and_then(|okm| okm.fill(out)).expect("HKDF lengths are in range");
}

/// One side's Initial keys for a client's first destination connection ID.
pub struct Keys {
    pub aead: LessSafeKey,
    pub iv: [u8; 12],
    pub hp: quic::HeaderProtectionKey,
}

impl std::fmt::Debug for Keys {
    /// Names the keys' algorithm only: keys are never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(QUIC v1 Initial, AES-128-GCM)")
    }
}

impl Keys {
    /// The client's.
    pub fn client(dcid: &[u8]) -> Keys {
        Keys::derive(dcid, b"client in")
    }

    /// The server's.
    pub fn server(dcid: &[u8]) -> Keys {
        Keys::derive(dcid, b"server in")
    }

    fn derive(dcid: &[u8], label: &[u8]) -> Keys {
        let initial = hkdf::Salt::new(hkdf::HKDF_SHA256, &INITIAL_SALT_V1).extract(dcid);
        let mut secret = [0u8; 32];
        expand_label(&initial, label, &mut secret);
        let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, &secret);
        let (mut key, mut iv, mut hp) = ([0u8; 16], [0u8; 12], [0u8; 16]);
        expand_label(&prk, b"quic key", &mut key);
        expand_label(&prk, b"quic iv", &mut iv);
        expand_label(&prk, b"quic hp", &mut hp);
        Keys {
            aead: LessSafeKey::new(UnboundKey::new(&aead::AES_128_GCM, &key).expect("a 16-byte key")),
            iv,
            hp: quic::HeaderProtectionKey::new(&quic::AES_128, &hp).expect("a 16-byte key"),
        }
    }

    /// The AEAD nonce of packet number `pn`.
    pub fn nonce(&self, pn: u64) -> Nonce {
        let mut n = self.iv;
        for (b, p) in n[4..].iter_mut().zip(pn.to_be_bytes()) {
            *b ^= p;
        }
        Nonce::assume_unique_for_key(n)
    }
}

/// QUIC version 1, the version these keys are for.
pub const VERSION_1: u32 = 1;

/// RFC 9000 20.1: CONNECTION_REFUSED.
pub const CONNECTION_REFUSED: u64 = 0x02;

/// A varint (RFC 9000 16) of up to 2^30 - 1, appended to `out`.
fn put_varint(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=63 => out.push(v as u8),
        64..=16_383 => out.extend_from_slice(&(0x4000 | v as u16).to_be_bytes()),
        _ => out.extend_from_slice(&(0x8000_0000 | (v.min((1 << 30) - 1)) as u32).to_be_bytes()),
    }
}

/// A server Initial closing the connection a client's Initial asked for, with
/// CONNECTION_REFUSED and `reason` (at most 64 bytes are kept): protected with the server's
/// Initial keys of `client_dcid` (the client's first destination ID), sent to the client's
/// `client_scid` from `server_scid` (any ID: the connection never exists). About 80 bytes.
pub fn refusal(client_dcid: &[u8], client_scid: &[u8], server_scid: &[u8], reason: &[u8]) -> Vec<u8> {
    let reason = &reason[..reason.len().min(64)];
    // The frames: CONNECTION_CLOSE (transport), then padding so the header-protection sample
    // (16 bytes from 4 past the packet number) lies inside the packet.
    let mut plain = Vec::with_capacity(96);
    put_varint(&mut plain, 0x1c);
    put_varint(&mut plain, CONNECTION_REFUSED);
    put_varint(&mut plain, 0); // the frame that caused it: none in particular
    put_varint(&mut plain, reason.len() as u64);
    plain.extend_from_slice(reason);
    plain.resize(plain.len().max(24), 0);
    let pn_len = 1;
    let mut out = Vec::with_capacity(128 + plain.len());
    out.push(0xc0 | (pn_len as u8 - 1)); // long header, fixed bit, Initial, 1-byte number
    out.extend_from_slice(&VERSION_1.to_be_bytes());
    out.push(client_scid.len() as u8);
    out.extend_from_slice(client_scid);
    out.push(server_scid.len() as u8);
    out.extend_from_slice(server_scid);
    put_varint(&mut out, 0); // no token in a server's Initial
                             // The length: the packet number, the frames and the tag, as a 2-byte varint always.
    let length = pn_len + plain.len() + 16;
    out.extend_from_slice(&(0x4000 | length as u16).to_be_bytes());
    let pn_at = out.len();
    out.push(0); // packet number 0
    let keys = Keys::server(client_dcid);
    let hlen = out.len();
    out.extend_from_slice(&plain);
    let (header, body) = out.split_at_mut(hlen);
    let tag =
        keys.aead.seal_in_place_separate_tag(keys.nonce(0), Aad::from(&*header), body).expect("a short packet seals");
    out.extend_from_slice(tag.as_ref());
    let mask = keys.hp.new_mask(&out[pn_at + 4..pn_at + 20]).expect("a 16-byte sample");
    out[0] ^= mask[0] & 0x0f;
    out[pn_at] ^= mask[1];
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9001 A.1: the client's Initial keys for DCID 0x8394c8f03e515708.
    #[test]
    fn initial_keys_match_rfc_9001_a1() {
        let dcid = [0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08];
        let k = Keys::client(&dcid);
        assert_eq!(k.iv, [0xfa, 0x04, 0x4b, 0x2f, 0x42, 0xa3, 0xfd, 0x3b, 0x46, 0xfb, 0x25, 0x5c]);
        // The header protection key, checked through RFC 9001 A.2's sample and mask.
        let sample = [0xd1, 0xb1, 0xc9, 0x8d, 0xd7, 0x68, 0x9f, 0xb8, 0xec, 0x11, 0xd2, 0x42, 0xb1, 0x23, 0xdc, 0x9b];
        assert_eq!(k.hp.new_mask(&sample).unwrap(), [0x43, 0x7b, 0x9a, 0xec, 0x36]);
    }

    /// A client (quiche) whose Initial is answered with a refusal closes at once with
    /// CONNECTION_REFUSED, the reason as sent.
    #[test]
    fn a_refusal_closes_a_quiche_client() {
        let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
        cfg.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).unwrap();
        cfg.verify_peer(false);
        let (local, peer): (std::net::SocketAddr, std::net::SocketAddr) =
            (([192, 0, 2, 1], 1).into(), ([192, 0, 2, 2], 2).into());
        let scid = [9u8; 16];
        let mut c =
            quiche::connect(Some("localhost"), &quiche::ConnectionId::from_ref(&scid), local, peer, &mut cfg).unwrap();
        let mut out = vec![0u8; 1500];
        let (n, _) = c.send(&mut out).unwrap();
        let hdr = quiche::Header::from_slice(&mut out[..n], quiche::MAX_CONN_ID_LEN).unwrap();
        let mut r = refusal(&hdr.dcid, &hdr.scid, &[5; 8], b"connection cap");
        assert!(r.len() < 100, "{} bytes", r.len());
        let len = r.len();
        assert_eq!(c.recv(&mut r, quiche::RecvInfo { from: peer, to: local }).unwrap(), len);
        let e = c.peer_error().expect("the peer's close");
        assert_eq!((e.is_app, e.error_code, &e.reason[..]), (false, CONNECTION_REFUSED, &b"connection cap"[..]));
        assert!(c.is_draining() || c.is_closed());
    }
}
