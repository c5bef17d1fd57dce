//! Client Initials for attack labs: a real client's first datagram re-protected under fresh
//! connection IDs, a few microseconds each (RFC 9001 5: Initial keys derive from the
//! destination connection ID alone, so anyone can make them: this is what a flood of
//! Initials from forged addresses costs an attacker).
//!
//! [`InitialForger::new`] has quiche make one client Initial (a ClientHello padded to 1,200
//! bytes), removes its protection and keeps the plaintext; [`InitialForger::forge`] seals
//! that plaintext again under a random destination and source connection ID, so each forgery
//! is a new connection to a server, which must answer it with a whole handshake (or a Retry).
//! The ClientHello inside is the same every time: a server cannot tell until it has spent the
//! handshake's work. Lab code, the flood bench's: the host never forges (the keys are
//! [`udpx_quic::initial`]'s, which the host uses for its stateless refusals).

use std::net::SocketAddr;

use ring::aead::Aad;

use udpx_quic::initial::Keys;

/// Where the parts of an Initial's header are.
#[derive(Debug, Clone, Copy)]
struct Layout {
    dcid: (usize, usize),
    scid: (usize, usize),
    /// Where the packet number starts.
    pn: usize,
    /// The packet's end (the Length field's extent).
    end: usize,
}

fn varint(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let first = *b.get(at)?;
    let len = 1usize << (first >> 6);
    let mut v = u64::from(first & 0x3f);
    for k in 1..len {
        v = (v << 8) | u64::from(*b.get(at + k)?);
    }
    Some((v, at + len))
}

fn layout(p: &[u8]) -> Option<Layout> {
    if p.len() < 7 || p[0] & 0xf0 != 0xc0 {
        return None; // not a long-header Initial
    }
    let dlen = usize::from(p[5]);
    let dcid = (6, 6 + dlen);
    let slen = usize::from(*p.get(dcid.1)?);
    let scid = (dcid.1 + 1, dcid.1 + 1 + slen);
    let (token_len, at) = varint(p, scid.1)?;
    let (length, pn) = varint(p, at + token_len as usize)?;
    let end = pn + length as usize;
    (end <= p.len() && pn + 4 + 16 <= end).then_some(Layout { dcid, scid, pn, end })
}

/// Makes client Initials under fresh connection IDs (see the module docs).
#[derive(Debug)]
pub struct InitialForger {
    /// The template's header with the packet number field (unprotected).
    header: Vec<u8>,
    layout: Layout,
    pn_len: usize,
    pn: u64,
    /// The template's plaintext payload (frames).
    plain: Vec<u8>,
    /// The datagram's length (the template's: padded to at least 1,200 bytes).
    datagram_len: usize,
}

impl InitialForger {
    /// One real client Initial (quiche's, HTTP/3's ALPN, `server_name`) taken apart.
    pub fn new(server_name: &str) -> Result<InitialForger, String> {
        let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).map_err(|e| e.to_string())?;
        cfg.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).map_err(|e| e.to_string())?;
        cfg.verify_peer(false);
        let scid = random::<16>();
        let (a, b): (SocketAddr, SocketAddr) = (([192, 0, 2, 1], 1).into(), ([192, 0, 2, 2], 2).into());
        let mut conn = quiche::connect(Some(server_name), &quiche::ConnectionId::from_ref(&scid), a, b, &mut cfg)
            .map_err(|e| e.to_string())?;
        let mut out = vec![0u8; 1500];
        let (n, _) = conn.send(&mut out).map_err(|e| e.to_string())?;
        out.truncate(n);
        InitialForger::from_datagram(&out)
    }

    /// Takes apart a client's first datagram (an Initial, the only packet in it).
    pub fn from_datagram(d: &[u8]) -> Result<InitialForger, String> {
        let l = layout(d).ok_or("not a client Initial")?;
        let keys = Keys::client(&d[l.dcid.0..l.dcid.1]);
        let mut p = d[..l.end].to_vec();
        let mask = keys.hp.new_mask(&p[l.pn + 4..l.pn + 20]).map_err(|_| "header protection")?;
        p[0] ^= mask[0] & 0x0f;
        let pn_len = usize::from(p[0] & 3) + 1;
        let mut pn = 0u64;
        for k in 0..pn_len {
            p[l.pn + k] ^= mask[1 + k];
            pn = (pn << 8) | u64::from(p[l.pn + k]);
        }
        let (header, body) = p.split_at_mut(l.pn + pn_len);
        let plain = keys
            .aead
            .open_in_place(keys.nonce(pn), Aad::from(&*header), body)
            .map_err(|_| "the Initial does not open under its own keys")?
            .to_vec();
        Ok(InitialForger { header: header.to_vec(), layout: l, pn_len, pn, plain, datagram_len: d.len() })
    }

    /// A datagram's length: every forgery is this long.
    #[cfg(test)]
    pub fn datagram_len(&self) -> usize {
        self.datagram_len
    }

    /// A new Initial into `out` (cleared first): the template's under a random destination
    /// and source connection ID, protected as a client would. Returns its destination
    /// connection ID's range in `out`.
    pub fn forge(&self, out: &mut Vec<u8>) -> std::ops::Range<usize> {
        let l = self.layout;
        out.clear();
        out.extend_from_slice(&self.header);
        let ids = random::<40>();
        out[l.dcid.0..l.dcid.1].copy_from_slice(&ids[..l.dcid.1 - l.dcid.0]);
        out[l.scid.0..l.scid.1].copy_from_slice(&ids[20..20 + (l.scid.1 - l.scid.0)]);
        let keys = Keys::client(&out[l.dcid.0..l.dcid.1]);
        let hlen = out.len();
        out.extend_from_slice(&self.plain);
        let (header, body) = out.split_at_mut(hlen);
        let tag = keys
            .aead
            .seal_in_place_separate_tag(keys.nonce(self.pn), Aad::from(&*header), body)
            .expect("an Initial's length seals");
        out.extend_from_slice(tag.as_ref());
        let mask = keys.hp.new_mask(&out[l.pn + 4..l.pn + 20]).expect("a 16-byte sample");
        out[0] ^= mask[0] & 0x0f;
        for k in 0..self.pn_len {
            out[l.pn + k] ^= mask[1 + k];
        }
        out.resize(self.datagram_len, 0); // any padding after the packet, as the template had
        l.dcid.0..l.dcid.1
    }
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the system's random source");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forgery opens under its own keys to the template's frames, with new IDs, and a
    /// server (quiche) takes it for a new connection's Initial.
    #[test]
    fn forgeries_are_initials_a_server_accepts() {
        let f = InitialForger::new("localhost").unwrap();
        assert!(f.datagram_len() >= 1200);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let ra = f.forge(&mut a);
        f.forge(&mut b);
        assert_eq!((a.len(), b.len()), (f.datagram_len(), f.datagram_len()));
        assert_ne!(a[ra.clone()], b[ra.clone()], "each has its own destination ID");
        let back = InitialForger::from_datagram(&a).unwrap();
        assert_eq!(back.plain, f.plain, "the same frames under the new keys");
        let hdr = quiche::Header::from_slice(&mut a.clone(), quiche::MAX_CONN_ID_LEN).unwrap();
        assert_eq!((hdr.ty, &hdr.dcid[..]), (quiche::Type::Initial, &a[ra]));
        // A server takes it: the ClientHello opens and a handshake answers.
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let dir = std::env::temp_dir().join(format!("udpx-forge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
        std::fs::write(&c, cert.cert.pem()).unwrap();
        std::fs::write(&k, cert.key_pair.serialize_pem()).unwrap();
        let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
        cfg.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).unwrap();
        cfg.load_cert_chain_from_pem_file(c.to_str().unwrap()).unwrap();
        cfg.load_priv_key_from_pem_file(k.to_str().unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (from, to): (SocketAddr, SocketAddr) = (([192, 0, 2, 9], 9).into(), ([192, 0, 2, 2], 2).into());
        let scid = quiche::ConnectionId::from_ref(&[7; 16]);
        let mut srv = quiche::accept(&scid, None, to, from, &mut cfg).unwrap();
        let n = a.len();
        assert_eq!(srv.recv(&mut a, quiche::RecvInfo { from, to }).unwrap(), n);
        let mut out = [0u8; 1500];
        let (sent, _) = srv.send(&mut out).unwrap();
        assert!(sent >= 1200, "the server answers with its handshake: {sent} B");
    }
}
