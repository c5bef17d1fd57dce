//! Server connection IDs in the QUIC-LB plaintext layout (draft-ietf-quic-load-balancers,
//! "Plaintext CID Algorithm"), with two bytes more for the host's own steering.
//!
//! ```text
//!   octet 0        1 .. 2        3 .. 9          10           11
//!  ┌───────────┬────────────┬──────────────┬────────────┬──────────┐
//!  │ 000 01011 │  host ID   │ random nonce │ generation │  worker  │   12 bytes in all
//!  └───────────┴────────────┴──────────────┴────────────┴──────────┘
//!   config rotation `000`, then the length of the rest (0x0b = 11)
//! ```
//!
//! A load balancer in front of several hosts routes on the host ID (octets 1-2, the QUIC-LB
//! "server ID"); inside a host, the reuseport program of [`udpx::shard`] reads the worker byte
//! ([`WORKER_BYTE`]) and picks the shard `worker % n`; across an upgrade the eBPF program of
//! [`udpx::generations`] reads the generation byte ([`GENERATION_BYTE`]) too, and picks the
//! process. The nonce makes the IDs of one worker unlinkable to an observer and unique: 56
//! random bits, so a collision among a million live IDs has a probability near 7e-6 (birthday
//! bound), and the host checks its table before it uses one anyway.
//!
//! Both ends of the layout are fixed here so that the steering program, the nftables rules of
//! the load-balancer issue and this generator agree: change them together.

use std::fmt;
use std::io;

/// Length of a server connection ID.
pub const CID_LEN: usize = 12;
/// Octet 0: config rotation `000` and the length of the rest (11).
pub const FIRST_OCTET: u8 = (CID_LEN - 1) as u8;
/// Index of the worker byte in the ID: the `cid_byte` of [`udpx::Steering::QuicCid`].
pub const WORKER_BYTE: u8 = (CID_LEN - 1) as u8;
/// Index of the generation byte: which process of an upgrade issued the ID.
pub const GENERATION_BYTE: u8 = (CID_LEN - 2) as u8;

/// Where the steering programs find the two bytes.
pub const LAYOUT: udpx::generations::CidLayout = udpx::generations::CidLayout {
    len: CID_LEN as u8,
    first_octet: FIRST_OCTET,
    generation_byte: GENERATION_BYTE,
    worker_byte: WORKER_BYTE,
};

/// A parsed server connection ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerCid {
    /// The host (QUIC-LB server ID), octets 1-2, big-endian.
    pub host_id: u16,
    /// The random nonce, octets 3-9.
    pub nonce: [u8; 7],
    /// The generation (which process of an upgrade), octet 10.
    pub generation: u8,
    /// The worker (shard) byte, octet 11.
    pub worker: u8,
}

/// Why bytes are not a server connection ID of this layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CidError {
    /// Not [`CID_LEN`] bytes.
    Length(usize),
    /// Octet 0 is not `000` + `0x0b` (another config rotation or another length).
    FirstOctet(u8),
}

impl fmt::Display for CidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CidError::Length(n) => write!(f, "a server connection ID has {CID_LEN} bytes, not {n}"),
            CidError::FirstOctet(b) => {
                write!(f, "octet 0 is {b:#04x}, not {FIRST_OCTET:#04x} (config rotation 000, length 11)")
            }
        }
    }
}

impl std::error::Error for CidError {}

impl ServerCid {
    /// Parses `bytes` (a whole connection ID).
    pub fn parse(bytes: &[u8]) -> Result<ServerCid, CidError> {
        if bytes.len() != CID_LEN {
            return Err(CidError::Length(bytes.len()));
        }
        if bytes[0] != FIRST_OCTET {
            return Err(CidError::FirstOctet(bytes[0]));
        }
        let mut nonce = [0u8; 7];
        nonce.copy_from_slice(&bytes[3..10]);
        Ok(ServerCid {
            host_id: u16::from_be_bytes([bytes[1], bytes[2]]),
            nonce,
            generation: bytes[10],
            worker: bytes[11],
        })
    }

    /// The wire bytes.
    pub fn to_bytes(&self) -> [u8; CID_LEN] {
        let mut b = [0u8; CID_LEN];
        b[0] = FIRST_OCTET;
        b[1..3].copy_from_slice(&self.host_id.to_be_bytes());
        b[3..10].copy_from_slice(&self.nonce);
        b[10] = self.generation;
        b[11] = self.worker;
        b
    }
}

/// Issues the connection IDs of one worker of one host. Randomness comes from the kernel
/// (`getrandom`), drawn a page at a time so an ID costs no system call.
#[derive(Debug)]
pub struct CidGenerator {
    host_id: u16,
    generation: u8,
    worker: u8,
    pool: Box<[u8; 4096]>,
    used: usize,
}

impl CidGenerator {
    /// IDs for worker `worker` (its shard index) of host `host_id`, generation 0.
    pub fn new(host_id: u16, worker: u8) -> CidGenerator {
        CidGenerator::with_generation(host_id, 0, worker)
    }

    /// IDs for worker `worker` of generation `generation` of host `host_id`.
    pub fn with_generation(host_id: u16, generation: u8, worker: u8) -> CidGenerator {
        CidGenerator { host_id, generation, worker, pool: Box::new([0; 4096]), used: 4096 }
    }

    /// The generation byte it writes.
    pub fn generation(&self) -> u8 {
        self.generation
    }

    /// The host ID it writes.
    pub fn host_id(&self) -> u16 {
        self.host_id
    }

    /// The worker byte it writes.
    pub fn worker(&self) -> u8 {
        self.worker
    }

    /// A fresh ID.
    pub fn next_cid(&mut self) -> io::Result<[u8; CID_LEN]> {
        let nonce = self.random7()?;
        Ok(ServerCid { host_id: self.host_id, nonce, generation: self.generation, worker: self.worker }.to_bytes())
    }

    fn random7(&mut self) -> io::Result<[u8; 7]> {
        if self.used + 7 > self.pool.len() {
            getrandom::getrandom(&mut self.pool[..]).map_err(io::Error::from)?;
            self.used = 0;
        }
        let mut n = [0u8; 7];
        n.copy_from_slice(&self.pool[self.used..self.used + 7]);
        self.used += 7;
        Ok(n)
    }
}

/// Random bytes from the kernel, for client connection IDs and tokens.
pub fn random_bytes(out: &mut [u8]) -> io::Result<()> {
    getrandom::getrandom(out).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use udpx::shard::{cid_program, run_cbpf};

    use super::*;

    #[test]
    fn layout_and_host_id() {
        let mut g = CidGenerator::new(0xabcd, 7);
        let c = g.next_cid().unwrap();
        assert_eq!(c.len(), 12);
        assert_eq!(c[0], 0x0b, "config rotation 000 and length 11");
        assert_eq!(c[0] >> 5, 0, "config rotation bits");
        assert_eq!(usize::from(c[0] & 0x1f), c.len() - 1);
        assert_eq!(&c[1..3], &[0xab, 0xcd]);
        assert_eq!(c[11], 7);
        let p = ServerCid::parse(&c).unwrap();
        assert_eq!((p.host_id, p.generation, p.worker), (0xabcd, 0, 7));
        assert_eq!(p.to_bytes(), c);
        let c = CidGenerator::with_generation(0xabcd, 200, 7).next_cid().unwrap();
        assert_eq!((c[10], c[11]), (200, 7));
        assert_eq!(ServerCid::parse(&c).unwrap().generation, 200);
        // Host 0 (the default) and the largest host ID.
        assert_eq!(&CidGenerator::new(0, 0).next_cid().unwrap()[1..3], &[0, 0]);
        assert_eq!(&CidGenerator::new(u16::MAX, 255).next_cid().unwrap()[1..3], &[0xff, 0xff]);
    }

    #[test]
    fn parse_refuses_other_layouts() {
        let c = CidGenerator::new(1, 2).next_cid().unwrap();
        assert_eq!(ServerCid::parse(&c[..11]), Err(CidError::Length(11)));
        assert_eq!(ServerCid::parse(&[c.as_slice(), &[0]].concat()), Err(CidError::Length(13)));
        let mut other = c;
        other[0] = 0x2b; // config rotation 001
        assert_eq!(ServerCid::parse(&other), Err(CidError::FirstOctet(0x2b)));
        assert!(CidError::FirstOctet(0x2b).to_string().contains("0x0b"));
    }

    #[test]
    fn unique_over_a_million() {
        let mut g = CidGenerator::new(3, 1);
        let mut seen = HashSet::with_capacity(1 << 21);
        for _ in 0..1_000_000 {
            assert!(seen.insert(g.next_cid().unwrap()), "duplicate connection ID");
        }
    }

    #[test]
    fn worker_byte_steers_to_its_shard() {
        for n in [1u32, 2, 3, 4, 8] {
            let prog = cid_program(WORKER_BYTE, n);
            for worker in 0..n as u8 {
                let mut g = CidGenerator::new(0x0102, worker);
                for _ in 0..100 {
                    let cid = g.next_cid().unwrap();
                    // Short header (1-RTT): form bit 0, fixed bit 1, then the DCID.
                    let short = [&[0x40u8][..], &cid, &[0x5a; 24]].concat();
                    assert_eq!(run_cbpf(&prog, &short, 0), Ok(u32::from(worker)), "n={n}");
                    // Long header (Handshake, v1) with this DCID: same shard.
                    let long = [&[0xe0u8, 0, 0, 0, 1, CID_LEN as u8][..], &cid, &[0; 30]].concat();
                    assert_eq!(run_cbpf(&prog, &long, 0), Ok(u32::from(worker)), "n={n}");
                }
            }
        }
    }
}
