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
//! - [`Steering::QuicCid`]: for QUIC short-header packets, one byte of the destination
//!   connection ID chooses the shard (`A = payload[offset] % n`), so a connection stays on its
//!   shard even when the client's address changes. Packets too short for the offset return an
//!   out-of-range index, which makes the kernel fall back to the flow hash.
//!
//! ## Connection ID layout for [`Steering::QuicCid`]
//!
//! ```text
//!  UDP payload of a QUIC short-header packet (RFC 9000 §17.3):
//!   byte 0      1 ..                               1+len(DCID)
//!  ┌────────┬────────────── Destination Connection ID ───────────┬──────────────
//!  │0 1 S R │ c0   c1   c2 ...                                    │ packet number…
//!  └────────┴────────────────────────────────────────────────────┴──────────────
//!  offset = 1 + k selects byte c_k; shard = c_k mod n.
//! ```
//!
//! A server that issues connection IDs with its shard index in byte `c_k` gets every packet of
//! the connection on that shard; an external load balancer can route on the same byte. The
//! kernel runs the program with the packet data starting at the UDP payload.
//!
//! The programs are built as data ([`cpu_program`], [`cid_program`]) and [`run_cbpf`] runs them
//! in user space, so their logic is tested over byte vectors without sockets.

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::AsFd;

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
const JGE: u16 = 0x30;
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

/// `if len > offset { A = payload[offset] % n; return A } else { return n }` (out of range:
/// the kernel falls back to the flow hash).
pub fn cid_program(offset: u32, n: u32) -> Vec<Insn> {
    vec![
        insn(LD | W | LEN, 0, 0, 0),
        // A >= offset + 1 ? next : fallback
        insn(JMP | JGE | K, 0, 3, offset + 1),
        insn(LD | B | ABS, 0, 0, offset),
        insn(ALU | MOD | K, 0, 0, n.max(1)),
        insn(RET | A, 0, 0, 0),
        insn(RET | K, 0, 0, n.max(1)),
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
    /// A byte of the QUIC destination connection ID at this payload offset.
    QuicCid {
        /// Offset in the UDP payload (1 = the first DCID byte of a short header).
        offset: u32,
    },
}

impl fmt::Display for Steering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Steering::Hash => f.write_str("kernel hash"),
            Steering::Cpu => f.write_str("receiving CPU (cBPF)"),
            Steering::QuicCid { offset } => write!(f, "QUIC DCID byte at payload offset {offset} (cBPF)"),
        }
    }
}

/// Sockets sharing one port.
#[derive(Debug)]
pub struct ShardGroup {
    /// The sockets, in group order (index = what the steering program returns).
    pub sockets: Vec<UdpSocket>,
    /// How datagrams are spread.
    pub steering: Steering,
}

impl ShardGroup {
    /// Binds `n` sockets to `cfg.bind` with SO_REUSEPORT (all with `cfg`'s other settings) and
    /// attaches the steering program. With port 0 the first socket's port is used for all.
    pub fn bind(cfg: SocketConfig, n: usize, steering: Steering) -> Result<ShardGroup, Error> {
        if n == 0 {
            return Err(Error::Config("a shard group needs at least 1 socket".into()));
        }
        if let Steering::QuicCid { offset } = steering {
            if offset as usize >= crate::transmit::MAX_PAYLOAD_V6 {
                return Err(Error::Config(format!(
                    "steering offset {offset} is past the end of any UDP payload (at most {} bytes): use an offset inside the connection ID",
                    crate::transmit::MAX_PAYLOAD_V6
                )));
            }
        }
        let mut sockets = Vec::with_capacity(n);
        let mut addr: SocketAddr = cfg.bind;
        for _ in 0..n {
            let mut c = cfg.clone().reuse_port(ReusePort::Enabled);
            c.bind = addr;
            let s = c.bind()?;
            addr = s.local_addr();
            sockets.push(s);
        }
        let prog = match steering {
            Steering::Hash => None,
            Steering::Cpu => Some(cpu_program(n as u32)),
            Steering::QuicCid { offset } => Some(cid_program(offset, n as u32)),
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
        Ok(ShardGroup { sockets, steering })
    }

    /// The shared local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.sockets[0].local_addr()
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

    #[test]
    fn cid_selector_over_byte_vectors() {
        let p = cid_program(1, 4);
        // Short header: 0x40 | bits, then the DCID.
        let cases: &[(&[u8], u32)] = &[
            (&[0x41, 0, 9, 9], 0),
            (&[0x41, 1, 9, 9], 1),
            (&[0x41, 6, 0, 0], 2),
            (&[0x41, 255], 3),
            (&[0x41], 4), // too short: out of range, the kernel falls back to the hash
            (&[], 4),
        ];
        for (pkt, want) in cases {
            assert_eq!(run_cbpf(&p, pkt, 0), Ok(*want), "{pkt:?}");
        }
        // Offset past the packet end for every packet.
        let far = cid_program(100, 4);
        assert_eq!(run_cbpf(&far, &[1; 50], 0), Ok(4));
        assert_eq!(run_cbpf(&far, &[7; 101], 0), Ok(3));
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
