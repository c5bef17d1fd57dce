//! Reuseport shard groups: several sockets on one port, and who decides which one gets a
//! datagram.
//!
//! By default the kernel picks a socket of a `SO_REUSEPORT` group by flow hash, so the CPU that
//! received a packet and the thread that reads its socket usually differ, and sockets are
//! shared between CPUs (the lock contention of the NTT talk, seed 001). A classic-BPF program
//! attached with `SO_ATTACH_REUSEPORT_CBPF` returns the index of the socket instead:
//!
//! - [`Steering::Cpu`]: the socket of the CPU that is processing the packet (`A = cpu % n`),
//!   so with one pinned thread per socket a datagram never leaves its CPU (what msquic does).
//! - [`Steering::QuicCid`]: one byte of the QUIC destination connection ID chooses the shard
//!   (`A = dcid[k] % n`), so a connection stays on its shard even when the client's address
//!   changes. The program reads the header form first: a short header carries the DCID right
//!   after the first byte, a long header (Initial, Handshake, 0-RTT) after the version and a
//!   DCID length byte. A packet too short for the byte, or a long header whose DCID is shorter
//!   than `k + 1` or longer than 20 bytes (not QUIC v1/v2), gets an out-of-range index, which
//!   makes the kernel fall back to its flow hash.
//!
//! ## Connection ID layout for [`Steering::QuicCid`]
//!
//! ```text
//!  short header (RFC 9000 §17.3), first bit 0:
//!   byte 0      1                                   1+len(DCID)
//!  ┌────────┬──────────── Destination Connection ID ────────────┬──────────────
//!  │0 1 S R │ c0   c1   c2 ...                                   │ packet number…
//!  └────────┴───────────────────────────────────────────────────┴──────────────
//!  long header (RFC 9000 §17.2), first bit 1:
//!   byte 0      1 .. 4        5          6
//!  ┌────────┬────────────┬──────────┬──────── Destination Connection ID ──┬─────
//!  │1 1 T T │  version   │ DCID len │ c0   c1   c2 ...                    │ SCID len…
//!  └────────┴────────────┴──────────┴─────────────────────────────────────┴─────
//!  cid_byte = k selects c_k (payload byte 1 + k, or 6 + k); shard = c_k mod n.
//! ```
//!
//! A server that issues connection IDs with its shard index in byte `c_k` gets every packet of
//! the connection on that shard from the handshake on (a client's first Initials carry a DCID
//! the client chose at random; they all carry the same one, so they land together); an
//! external load balancer can route on the same bytes. The kernel runs the program with the
//! packet data starting at the UDP payload.
//!
//! The program bakes in the group size `n`. When one socket of a reuseport group closes, the
//! kernel moves the group's last socket into its slot, so a program with a fixed `n` would send
//! that socket's connections elsewhere: a [`ShardGroup`]'s sockets therefore close together,
//! never one by one (threads get [`Shard`] handles that keep the whole group open).
//!
//! The programs are built as data ([`cpu_program`], [`cid_program`]) and [`run_cbpf`] runs them
//! in user space, so their logic is tested over byte vectors without sockets.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Deref;
use std::os::fd::AsFd;
use std::sync::Arc;

use crate::error::Error;
use crate::socket::{ReusePort, SocketConfig, UdpSocket};
use crate::sys;

/// One classic-BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Constant.
    pub k: u32,
}

// Opcodes (include/uapi/linux/filter.h, bpf_common.h).
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const W: u16 = 0x00;
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const LEN: u16 = 0x80;
const MOD: u16 = 0x90;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const JSET: u16 = 0x40;
const K: u16 = 0x00;
const X: u16 = 0x08;
const A: u16 = 0x10;
/// `SKF_AD_OFF + SKF_AD_CPU`: loading from this "offset" yields the current CPU.
const AD_CPU: u32 = (-0x1000i32) as u32 + 36;

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// `A = cpu % n; return A`.
pub fn cpu_program(n: u32) -> Vec<Insn> {
    vec![insn(LD | W | ABS, 0, 0, AD_CPU), insn(ALU | MOD | K, 0, 0, n.max(1)), insn(RET | A, 0, 0, 0)]
}

/// The longest connection ID of QUIC v1 and v2 (RFC 9000 §17.2).
pub const MAX_CID_LEN: u32 = 20;

/// Steering by byte `cid_byte` of the destination connection ID over `n` sockets: returns
/// `dcid[cid_byte] % n`, or `n` (out of range: the kernel's hash decides) when the packet is
/// too short or a long header's DCID length does not cover the byte or exceeds 20.
pub fn cid_program(cid_byte: u8, n: u32) -> Vec<Insn> {
    let n = n.max(1);
    let k = u32::from(cid_byte);
    // Instruction indices of the three targets; `to(from, target)` is the relative jump.
    const LONG: usize = 9;
    const FALLBACK: usize = 17;
    let to = |from: usize, target: usize| (target - from - 1) as u8;
    vec![
        /* 0 */ insn(LD | W | LEN, 0, 0, 0),
        /* 1 */ insn(JMP | JGE | K, 0, to(1, FALLBACK), 1),
        /* 2 */ insn(LD | B | ABS, 0, 0, 0),
        /* 3 */ insn(JMP | JSET | K, to(3, LONG), 0, 0x80),
        // Short header: the DCID starts at byte 1; byte 1 + k must exist.
        /* 4 */
        insn(LD | W | LEN, 0, 0, 0),
        /* 5 */ insn(JMP | JGE | K, 0, to(5, FALLBACK), 2 + k),
        /* 6 */ insn(LD | B | ABS, 0, 0, 1 + k),
        /* 7 */ insn(ALU | MOD | K, 0, 0, n),
        /* 8 */ insn(RET | A, 0, 0, 0),
        // Long header: DCID length at byte 5, the DCID from byte 6; byte 6 + k must exist.
        /* 9 */
        insn(LD | W | LEN, 0, 0, 0),
        /* 10 */ insn(JMP | JGE | K, 0, to(10, FALLBACK), 7 + k),
        /* 11 */ insn(LD | B | ABS, 0, 0, 5),
        /* 12 */ insn(JMP | JGT | K, 0, to(12, FALLBACK), k),
        /* 13 */ insn(JMP | JGT | K, to(13, FALLBACK), 0, MAX_CID_LEN),
        /* 14 */ insn(LD | B | ABS, 0, 0, 6 + k),
        /* 15 */ insn(ALU | MOD | K, 0, 0, n),
        /* 16 */ insn(RET | A, 0, 0, 0),
        /* 17 */ insn(RET | K, 0, 0, n),
    ]
}

/// Why [`run_cbpf`] stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CbpfError {
    /// An instruction this interpreter does not know (it knows what udpx's programs use).
    Unsupported(u16),
    /// A load past the packet end: the kernel returns 0 (drop) in that case.
    OutOfBounds,
    /// Ran off the end of the program.
    NoReturn,
}

/// Runs a classic-BPF program over `packet` (the UDP payload) as the kernel would on CPU `cpu`;
/// returns the value of the `ret`.
pub fn run_cbpf(prog: &[Insn], packet: &[u8], cpu: u32) -> Result<u32, CbpfError> {
    let (mut a, mut x) = (0u32, 0u32);
    let mut pc = 0usize;
    while let Some(i) = prog.get(pc) {
        pc += 1;
        match i.code {
            c if c == LD | W | ABS && i.k == AD_CPU => a = cpu,
            c if c == LD | W | ABS => {
                let k = i.k as usize;
                let b = packet.get(k..k + 4).ok_or(CbpfError::OutOfBounds)?;
                a = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            }
            c if c == LD | B | ABS => a = *packet.get(i.k as usize).ok_or(CbpfError::OutOfBounds)? as u32,
            c if c == LD | W | LEN => a = packet.len() as u32,
            c if c == LDX | W | LEN => x = packet.len() as u32,
            c if c == ALU | MOD | K => a = if i.k == 0 { return Ok(0) } else { a % i.k },
            c if c == ALU | MOD | X => a = if x == 0 { return Ok(0) } else { a % x },
            c if c == JMP | JGE | K => pc += if a >= i.k { i.jt as usize } else { i.jf as usize },
            c if c == JMP | JGT | K => pc += if a > i.k { i.jt as usize } else { i.jf as usize },
            c if c == JMP | JSET | K => pc += if a & i.k != 0 { i.jt as usize } else { i.jf as usize },
            c if c == RET | A => return Ok(a),
            c if c == RET | K => return Ok(i.k),
            other => return Err(CbpfError::Unsupported(other)),
        }
    }
    Err(CbpfError::NoReturn)
}

/// How datagrams are spread over a shard group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steering {
    /// The kernel's flow hash (no program).
    Hash,
    /// The socket of the receiving CPU: socket `i` belongs to CPU `i` (`cpu % n`).
    Cpu,
    /// A byte of the QUIC destination connection ID, short or long header.
    QuicCid {
        /// Which byte of the DCID (0 = its first byte); below [`MAX_CID_LEN`].
        cid_byte: u8,
    },
    /// The generation and worker bytes of the DCID, through an eBPF program shared with the
    /// group's other generations ([`crate::generations`]); this group is `generation`.
    Generation {
        /// This group's generation byte.
        generation: u8,
    },
}

impl fmt::Display for Steering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Steering::Hash => f.write_str("kernel hash"),
            Steering::Cpu => f.write_str("receiving CPU (cBPF)"),
            Steering::QuicCid { cid_byte } => write!(f, "QUIC DCID byte {cid_byte} (cBPF)"),
            Steering::Generation { generation } => write!(f, "QUIC DCID generation {generation} and worker (eBPF)"),
        }
    }
}

/// Most sockets one reuseport group holds (the kernel counts them in a `u16`).
pub const MAX_SHARDS: usize = u16::MAX as usize;

/// Sockets sharing one port. They close together when the group and every [`Shard`] handle
/// are gone, never one at a time (see the module docs: the steering program counts on it).
#[derive(Debug)]
pub struct ShardGroup {
    sockets: Arc<[UdpSocket]>,
    steering: Steering,
}

/// One socket of a [`ShardGroup`], for the thread that serves it. It dereferences to the
/// socket and keeps the whole group open.
#[derive(Debug, Clone)]
pub struct Shard {
    sockets: Arc<[UdpSocket]>,
    index: usize,
}

impl ShardGroup {
    /// Binds `n` sockets to `cfg.bind` with SO_REUSEPORT (all with `cfg`'s other settings) and
    /// attaches the steering program. With port 0 the first socket's port is used for all.
    ///
    /// A port somebody already holds is refused (`AddrInUse`), even when that somebody is a
    /// reuseport group of the same user, which the kernel would let these sockets join
    /// silently: the two groups would then split each other's datagrams.
    pub fn bind(cfg: SocketConfig, n: usize, steering: Steering) -> Result<ShardGroup, Error> {
        if n == 0 || n > MAX_SHARDS {
            return Err(Error::Config(format!(
                "a shard group of {n} sockets: give at least 1 and at most {MAX_SHARDS}"
            )));
        }
        if let Steering::QuicCid { cid_byte } = steering {
            if u32::from(cid_byte) >= MAX_CID_LEN {
                return Err(Error::Config(format!(
                    "connection-ID byte {cid_byte}: QUIC connection IDs are at most {MAX_CID_LEN} bytes, \
                     give a byte index from 0 to {}",
                    MAX_CID_LEN - 1
                )));
            }
        }
        Self::probe_free(cfg.bind)?;
        let sockets = Self::bind_all(&cfg, n)?;
        let prog = match steering {
            Steering::Generation { .. } => {
                return Err(Error::Config("generation steering binds with ShardGroup::bind_generation".into()))
            }
            Steering::Hash => None,
            Steering::Cpu => Some(cpu_program(n as u32)),
            Steering::QuicCid { cid_byte } => Some(cid_program(cid_byte, n as u32)),
        };
        if let Some(p) = prog {
            let raw: Vec<libc::sock_filter> =
                p.iter().map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect();
            sys::attach_reuseport_cbpf(sockets[0].as_fd(), &raw).map_err(|e| {
                Error::Config(format!(
                    "the kernel refused the {steering} reuseport program ({} instructions): {e}; \
                     classic BPF reports no verifier log, EINVAL means an invalid instruction or jump",
                    raw.len()
                ))
            })?;
        }
        Ok(ShardGroup { sockets: sockets.into(), steering })
    }

    /// Binds `n` sockets as generation `generation` of `gens` and attaches its program. With
    /// `join` the port may be held already, by the group of an earlier generation (the
    /// process this one upgrades: same user, same address); without it a taken port is
    /// refused as in [`ShardGroup::bind`].
    pub fn bind_generation(
        cfg: SocketConfig,
        n: usize,
        gens: &crate::generations::Generations,
        generation: u8,
        join: bool,
    ) -> Result<ShardGroup, Error> {
        if n == 0 || n > 256 {
            return Err(Error::Config(format!("a generation of {n} sockets: give 1 to 256 (one worker byte)")));
        }
        if !join {
            Self::probe_free(cfg.bind)?;
        }
        let sockets = Self::bind_all(&cfg, n)?;
        for (i, s) in sockets.iter().enumerate() {
            gens.insert(generation, i as u8, s.as_fd())?;
        }
        gens.attach(sockets[0].as_fd())?;
        Ok(ShardGroup { sockets: sockets.into(), steering: Steering::Generation { generation } })
    }

    /// Refuses a port somebody holds: a plain bind (no SO_REUSEPORT) finds out.
    fn probe_free(bind: SocketAddr) -> Result<(), Error> {
        if bind.port() == 0 {
            return Ok(());
        }
        match std::net::UdpSocket::bind(bind) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(Error::Io {
                op: format!(
                    "bind a shard group to {bind}: the port is taken (joining another reuseport group \
                     would split its datagrams); pick a free port or stop the other server"
                ),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// `n` sockets with SO_REUSEPORT on `cfg.bind` (port 0: the first one's port for all).
    fn bind_all(cfg: &SocketConfig, n: usize) -> Result<Vec<UdpSocket>, Error> {
        let mut sockets = Vec::with_capacity(n);
        let mut addr: SocketAddr = cfg.bind;
        for _ in 0..n {
            let mut c = cfg.clone().reuse_port(ReusePort::Enabled);
            c.bind = addr;
            let s = c.bind()?;
            addr = s.local_addr();
            sockets.push(s);
        }
        Ok(sockets)
    }

    /// The shared local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.sockets[0].local_addr()
    }

    /// How datagrams are spread.
    pub fn steering(&self) -> Steering {
        self.steering
    }

    /// The sockets, in group order (index = what the steering program returns).
    pub fn sockets(&self) -> &[UdpSocket] {
        &self.sockets
    }

    /// Sockets in the group (at least 1).
    pub fn len(&self) -> usize {
        self.sockets.len()
    }

    /// Always false: a group has at least one socket.
    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }

    /// One handle per socket, in group order, to hand to the threads that serve them.
    pub fn shards(&self) -> Vec<Shard> {
        (0..self.sockets.len()).map(|index| Shard { sockets: self.sockets.clone(), index }).collect()
    }
}

impl Shard {
    /// The socket's index in its group.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl Deref for Shard {
    type Target = UdpSocket;
    fn deref(&self) -> &UdpSocket {
        &self.sockets[self.index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_program_maps_cpu_to_socket() {
        let p = cpu_program(4);
        for cpu in 0..10 {
            assert_eq!(run_cbpf(&p, b"anything", cpu), Ok(cpu % 4));
        }
    }

    /// A short-header packet whose DCID is `cid`.
    fn short(cid: &[u8]) -> Vec<u8> {
        [&[0x41u8][..], cid, &[0xee; 4]].concat()
    }

    /// A long-header (Initial, QUIC v1) packet whose DCID is `cid`.
    fn long(cid: &[u8]) -> Vec<u8> {
        [&[0xc3u8, 0, 0, 0, 1, cid.len() as u8][..], cid, &[8], &[0x55; 8], &[0; 20]].concat()
    }

    #[test]
    fn cid_selector_over_byte_vectors() {
        let p = cid_program(0, 4);
        let cases: &[(Vec<u8>, u32)] = &[
            (short(&[0, 9, 9]), 0),
            (short(&[1, 9, 9]), 1),
            (short(&[6, 0, 0]), 2),
            (vec![0x41, 255], 3),
            (long(&[5, 1, 2, 3, 4, 5, 6, 7]), 1), // the DCID byte, not the version's 0
            (long(&[7; 20]), 3),
            (vec![0x41], 4), // too short: out of range, the kernel falls back to the hash
            (vec![], 4),
            (vec![0xc3, 0, 0, 0, 1, 0], 4),    // long header, empty DCID
            (vec![0xc3, 0, 0, 0, 1, 8, 9], 1), // cut after the DCID's byte 0: that byte steers
            ([&[0xc3u8, 0, 0, 0, 1, 21][..], &[1u8; 40][..]].concat(), 4), // DCID longer than 20
        ];
        for (pkt, want) in cases {
            assert_eq!(run_cbpf(&p, pkt, 0), Ok(*want), "{pkt:?}");
        }
        // The last byte of a 20-byte DCID, in both forms; and a DCID too short for it.
        let p = cid_program(19, 3);
        let cid: Vec<u8> = (0..20).collect();
        assert_eq!(run_cbpf(&p, &short(&cid), 0), Ok(19 % 3));
        assert_eq!(run_cbpf(&p, &long(&cid), 0), Ok(19 % 3));
        assert_eq!(run_cbpf(&p, &long(&cid[..19]), 0), Ok(3));
        // The widest byte index and the largest group build without overflow.
        let wide = cid_program(u8::MAX, u32::MAX);
        assert_eq!(run_cbpf(&wide, &short(&[1; 8]), 0), Ok(u32::MAX));
    }

    proptest::proptest! {
        /// Whatever arrives, the program answers a socket index or the fallback, never an
        /// interpreter error; and a well-formed packet of either form lands on `dcid[k] % n`.
        #[test]
        fn cid_program_is_total(
            pkt in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            k in 0u8..20,
            n in 1u32..9,
            cid in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..=20),
        ) {
            let p = cid_program(k, n);
            let got = run_cbpf(&p, &pkt, 0);
            proptest::prop_assert!(matches!(got, Ok(v) if v <= n), "{:?}", got);
            let want = cid.get(k as usize).map_or(n, |b| u32::from(*b) % n);
            proptest::prop_assert_eq!(run_cbpf(&p, &long(&cid), 0), Ok(want));
            if (k as usize) < cid.len() {
                proptest::prop_assert_eq!(run_cbpf(&p, &short(&cid), 0), Ok(want));
            }
        }
    }

    #[test]
    fn interpreter_rejects_unknown_and_unterminated() {
        assert_eq!(run_cbpf(&[insn(0x07, 0, 0, 0)], &[], 0), Err(CbpfError::Unsupported(0x07)));
        assert_eq!(run_cbpf(&[insn(LD | W | LEN, 0, 0, 0)], &[], 0), Err(CbpfError::NoReturn));
        assert_eq!(
            run_cbpf(&[insn(LD | B | ABS, 0, 0, 5), insn(RET | A, 0, 0, 0)], &[1], 0),
            Err(CbpfError::OutOfBounds)
        );
    }
}
