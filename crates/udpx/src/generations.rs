//! Generations of one reuseport group: two processes (an old server and its upgrade) share a
//! port, and every packet reaches the process whose connection it belongs to.
//!
//! The classic-BPF steering of [`crate::shard`] returns an index into the group, and indices
//! shift as sockets join and leave, so it cannot tell one process's sockets from another's.
//! Here an eBPF program of type `SK_REUSEPORT` picks the socket from a
//! `REUSEPORT_SOCKARRAY` keyed by `generation << 8 | worker`, two bytes the server writes into
//! every connection ID it issues ([`CidLayout`]); the map and the program outlive any one
//! process (the next one gets their descriptors over a Unix socket, [`send_fds`] and
//! [`recv_fds`], `SCM_RIGHTS`).
//!
//! ```text
//!  first byte 0 (short header)    → key dcid[gen] << 8 | dcid[worker]
//!       that socket gone          → newest generation, worker % its workers (which resets it)
//!  long header, DCID of our layout → that key if its socket is live, else as below
//!  long header, another DCID (≥ 8) → the flow table: the generation that took its first
//!       Initial; a DCID not in it gets the newest generation, worker = 4-tuple hash % n,
//!       and takes an entry only if a QUIC v1 Initial of ≥ 1,200 bytes (others look up)
//!  anything else                  → the kernel's hash
//! ```
//!
//! The flow table (an LRU map of the first 8 bytes of a client-chosen DCID) keeps a client's
//! first round trip together across a switch: its retransmitted Initials, a second ClientHello
//! datagram and its 0-RTT packets carry the DCID it chose, and they go where its first Initial
//! went even when a newer generation took over meanwhile. Only a datagram that can begin a
//! handshake takes an entry: a QUIC version 1 Initial (type bits 00; version 1 is the one
//! quiche speaks) whose UDP payload is at least 1,200 bytes (RFC 9000 14.1; udpx drops a
//! smaller first Initial anyway, `dropped_bad_initial`). Handshake and 0-RTT packets, smaller
//! Initials and other versions' long headers only look up, so a flood of small forged ones
//! (20 bytes apiece) evicts no handshake's entry; a flood of full-sized Initials still can
//! (the table holds [`FLOW_ENTRIES`]). After a Retry the client's Initial carries the Retry's
//! source ID, of our layout: the generation that sent the Retry takes it while it lives, the
//! newest otherwise (the token is good for both: one key file).
//!
//! The kernel runs the program with its packet offset 0 at the UDP header
//! ([`PAYLOAD_OFFSET`]). Loading it needs `CAP_BPF` and `CAP_NET_ADMIN` (or root);
//! [`Generations::create`] says so when refused.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::Error;
use crate::sys::bpf as sys;
pub use crate::sys::bpf::{recv_fds, send_fds, MAX_FDS};

/// Where a connection ID's steering bytes are: the IDs a server issues are `len` bytes, start
/// with `first_octet`, and carry the generation and the worker at those indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CidLayout {
    /// Length of every server connection ID (at most 20).
    pub len: u8,
    /// Its first byte (QUIC-LB: config rotation and length).
    pub first_octet: u8,
    /// Index of the generation byte.
    pub generation_byte: u8,
    /// Index of the worker byte.
    pub worker_byte: u8,
}

/// Offset of the UDP payload in the program's packet (the UDP header comes first).
pub const PAYLOAD_OFFSET: i32 = 8;

/// Entries of the flow table (client-chosen DCIDs of handshakes under way).
pub const FLOW_ENTRIES: u32 = 16384;

const MAP_ARRAY: u32 = 2;
const MAP_LRU_HASH: u32 = 9;
const MAP_REUSEPORT_SOCKARRAY: u32 = 20;

// Helper functions (include/uapi/linux/bpf.h, `__BPF_FUNC_MAPPER` order).
const FN_MAP_LOOKUP: i32 = 1;
const FN_MAP_UPDATE: i32 = 2;
const FN_SKB_LOAD_BYTES: i32 = 26;
const FN_SK_SELECT_REUSEPORT: i32 = 82;

/// Offset of `len` in `struct sk_reuseport_md` (after two pointers): the datagram's length
/// from its UDP header on, so [`PAYLOAD_OFFSET`] more than the payload's.
const MD_LEN: i16 = 16;
/// Offset of `hash` in `struct sk_reuseport_md` (after two pointers and four `u32`s).
const MD_HASH: i16 = 32;

/// The smallest UDP payload a client's first Initial comes in (RFC 9000 14.1), the least that
/// takes a flow.
const MIN_INITIAL_LEN: i32 = 1200;

/// One eBPF instruction before encoding, with jumps to labels.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// An instruction: code, dst, src, offset, immediate.
    I(u8, u8, u8, i16, i32),
    /// A conditional or plain jump to a label.
    J(u8, u8, u8, &'static str, i32),
    /// `ld_imm64 dst, map` (two slots): map 0 sockets, 1 state, 2 flows.
    Map(u8, usize),
    /// A jump target.
    L(&'static str),
}

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const FP: u8 = 10;

fn mov_k(d: u8, k: i32) -> Op {
    Op::I(0xb7, d, 0, 0, k)
}
fn mov_r(d: u8, s: u8) -> Op {
    Op::I(0xbf, d, s, 0, 0)
}
fn add_k(d: u8, k: i32) -> Op {
    Op::I(0x07, d, 0, 0, k)
}
fn and_k(d: u8, k: i32) -> Op {
    Op::I(0x57, d, 0, 0, k)
}
fn lsh_k(d: u8, k: i32) -> Op {
    Op::I(0x67, d, 0, 0, k)
}
fn or_r(d: u8, s: u8) -> Op {
    Op::I(0x4f, d, s, 0, 0)
}
fn mod_r(d: u8, s: u8) -> Op {
    Op::I(0x9f, d, s, 0, 0)
}
fn ldxb(d: u8, s: u8, off: i16) -> Op {
    Op::I(0x71, d, s, off, 0)
}
fn ldxw(d: u8, s: u8, off: i16) -> Op {
    Op::I(0x61, d, s, off, 0)
}
fn stxw(d: u8, off: i16, s: u8) -> Op {
    Op::I(0x63, d, s, off, 0)
}
fn stw(d: u8, off: i16, k: i32) -> Op {
    Op::I(0x62, d, 0, off, k)
}
fn call(f: i32) -> Op {
    Op::I(0x85, 0, 0, 0, f)
}
fn exit() -> Op {
    Op::I(0x95, 0, 0, 0, 0)
}
fn ja(l: &'static str) -> Op {
    Op::J(0x05, 0, 0, l, 0)
}
fn jeq_k(d: u8, k: i32, l: &'static str) -> Op {
    Op::J(0x15, d, 0, l, k)
}
fn jne_k(d: u8, k: i32, l: &'static str) -> Op {
    Op::J(0x55, d, 0, l, k)
}
fn jlt_k(d: u8, k: i32, l: &'static str) -> Op {
    Op::J(0xa5, d, 0, l, k)
}
fn jset_k(d: u8, k: i32, l: &'static str) -> Op {
    Op::J(0x45, d, 0, l, k)
}

// The stack: the packet's first bytes at BUF, the socket-array key at KEY, a flow value at VAL.
const BUF: i16 = -32;
const KEY: i16 = -36;
const VAL: i16 = -40;

/// `bpf_skb_load_bytes(ctx, PAYLOAD_OFFSET, fp + BUF, len)`, result in r0.
fn load(len: i32) -> [Op; 6] {
    [
        mov_r(R1, R6),
        mov_k(R2, PAYLOAD_OFFSET),
        mov_r(R3, FP),
        add_k(R3, BUF.into()),
        mov_k(R4, len),
        call(FN_SKB_LOAD_BYTES),
    ]
}

/// `bpf_sk_select_reuseport(ctx, sockets, fp + KEY, 0)`, result in r0 (0: selected).
fn select() -> [Op; 6] {
    [mov_r(R1, R6), Op::Map(R2, 0), mov_r(R3, FP), add_k(R3, KEY.into()), mov_k(R4, 0), call(FN_SK_SELECT_REUSEPORT)]
}

/// r0 = the state map's value (newest generation, its workers) or null.
fn state() -> [Op; 5] {
    [stw(FP, KEY, 0), Op::Map(R1, 1), mov_r(R2, FP), add_k(R2, KEY.into()), call(FN_MAP_LOOKUP)]
}

/// The steering program for `layout`, as labelled operations (see the module docs).
fn program(layout: CidLayout) -> Vec<Op> {
    let (g, w, n) = (i16::from(layout.generation_byte), i16::from(layout.worker_byte), i32::from(layout.len));
    // A client DCID's first 8 bytes: the flow key, right after the long header's length byte.
    let flow_key = BUF + 6;
    let mut p = vec![mov_r(R6, R1)];
    // Short header: the generation and worker bytes follow the first byte.
    p.extend(load(1 + i32::from(g.max(w)) + 1));
    p.push(jne_k(R0, 0, "pass"));
    p.push(ldxb(R7, FP, BUF));
    p.push(jset_k(R7, 0x80, "long"));
    p.extend([ldxb(R8, FP, BUF + 1 + g), ldxb(R9, FP, BUF + 1 + w), ja("by_cid")]);
    // Long header: 6 bytes, then the DCID.
    p.push(Op::L("long"));
    p.extend(load(6 + n));
    p.push(jne_k(R0, 0, "pass"));
    p.extend([
        ldxb(R1, FP, BUF + 5),
        jne_k(R1, n, "flow"),
        ldxb(R1, FP, BUF + 6),
        jne_k(R1, layout.first_octet.into(), "flow"),
    ]);
    p.extend([ldxb(R8, FP, BUF + 6 + g), ldxb(R9, FP, BUF + 6 + w)]);
    p.extend([mov_r(R1, R8), lsh_k(R1, 8), or_r(R1, R9), stxw(FP, KEY, R1)]);
    p.extend(select());
    p.push(jeq_k(R0, 0, "pass"));
    // A client-chosen DCID: where its first Initial went, or the newest generation.
    p.push(Op::L("flow"));
    p.extend([ldxb(R1, FP, BUF + 5), jlt_k(R1, 8, "pass")]);
    p.extend([Op::Map(R1, 2), mov_r(R2, FP), add_k(R2, flow_key.into()), call(FN_MAP_LOOKUP)]);
    p.push(jeq_k(R0, 0, "new_flow"));
    p.extend([ldxw(R1, R0, 0), stxw(FP, KEY, R1), ja("select")]);
    // A DCID not in the table: the newest generation, and an entry only for a QUIC v1 Initial
    // (type bits 00, version 1) of at least MIN_INITIAL_LEN bytes, so a flood of small or
    // other long headers evicts no handshake's entry (they only look up).
    p.push(Op::L("new_flow"));
    p.extend(state());
    p.push(jeq_k(R0, 0, "pass"));
    p.extend([ldxw(R8, R0, 0), ldxw(R9, R0, 4), jeq_k(R9, 0, "pass")]);
    p.extend([ldxw(R1, R6, MD_HASH), mod_r(R1, R9), lsh_k(R8, 8), or_r(R8, R1), stxw(FP, KEY, R8)]);
    p.extend([mov_r(R1, R7), and_k(R1, 0x30), jne_k(R1, 0, "select")]);
    p.extend([ldxb(R1, FP, BUF + 1), jne_k(R1, 0, "select"), ldxb(R1, FP, BUF + 2), jne_k(R1, 0, "select")]);
    p.extend([ldxb(R1, FP, BUF + 3), jne_k(R1, 0, "select"), ldxb(R1, FP, BUF + 4), jne_k(R1, 1, "select")]);
    p.extend([ldxw(R1, R6, MD_LEN), jlt_k(R1, PAYLOAD_OFFSET + MIN_INITIAL_LEN, "select")]);
    p.push(stxw(FP, VAL, R8));
    p.extend([
        Op::Map(R1, 2),
        mov_r(R2, FP),
        add_k(R2, flow_key.into()),
        mov_r(R3, FP),
        add_k(R3, VAL.into()),
        mov_k(R4, 0),
        call(FN_MAP_UPDATE),
        ja("select"),
    ]);
    // Our layout: that generation's worker socket; if it is gone, the newest generation's
    // shard for the worker byte (which answers with a stateless reset).
    p.push(Op::L("by_cid"));
    p.extend([mov_r(R1, R8), lsh_k(R1, 8), or_r(R1, R9), stxw(FP, KEY, R1)]);
    p.extend(select());
    p.push(jeq_k(R0, 0, "pass"));
    p.extend(state());
    p.push(jeq_k(R0, 0, "pass"));
    p.extend([ldxw(R8, R0, 0), ldxw(R1, R0, 4), jeq_k(R1, 0, "pass")]);
    p.extend([mod_r(R9, R1), lsh_k(R8, 8), or_r(R8, R9), stxw(FP, KEY, R8)]);
    p.push(Op::L("select"));
    p.extend(select());
    // SK_PASS: the selected socket, or the kernel's hash when none was selected.
    p.push(Op::L("pass"));
    p.extend([mov_k(R0, 1), exit()]);
    p
}

fn encode(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | u64::from(dst & 0xf) << 8
        | u64::from(src & 0xf) << 12
        | u64::from(off as u16) << 16
        | u64::from(imm as u32) << 32
}

/// Encodes `ops` with the three maps' descriptors; labels become relative jumps.
fn assemble(ops: &[Op], maps: [i32; 3]) -> Vec<u64> {
    let mut at = std::collections::HashMap::new();
    let mut pc = 0i32;
    for op in ops {
        match op {
            Op::L(l) => {
                at.insert(*l, pc);
            }
            Op::Map(..) => pc += 2,
            _ => pc += 1,
        }
    }
    let mut out = Vec::with_capacity(pc as usize);
    for op in ops {
        match *op {
            Op::I(c, d, s, o, k) => out.push(encode(c, d, s, o, k)),
            Op::J(c, d, s, l, k) => {
                let off = at[l] - out.len() as i32 - 1;
                out.push(encode(c, d, s, off as i16, k));
            }
            // BPF_LD | BPF_IMM | BPF_DW with src BPF_PSEUDO_MAP_FD.
            Op::Map(d, m) => out.extend([encode(0x18, d, 1, 0, maps[m]), 0]),
            Op::L(_) => {}
        }
    }
    out
}

/// The maps and the program of one port's generations. Dropping it closes this process's
/// references; the group keeps the program (and through it the maps) while any socket of it
/// lives.
#[derive(Debug)]
pub struct Generations {
    sockets: OwnedFd,
    state: OwnedFd,
    flows: OwnedFd,
    prog: OwnedFd,
}

fn refused(what: &str, e: io::Error) -> Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (eBPF reuseport steering needs CAP_BPF and CAP_NET_ADMIN, or root)".to_string()
        }
        _ => String::new(),
    };
    Error::Io { op: format!("{what}{hint}"), source: e }
}

impl Generations {
    /// New maps and a loaded program for `layout` (connection IDs of at most 20 bytes, the
    /// two steering bytes inside them).
    pub fn create(layout: CidLayout) -> Result<Generations, Error> {
        if layout.len > 20 || layout.generation_byte >= layout.len || layout.worker_byte >= layout.len {
            return Err(Error::Config(format!(
                "connection-ID layout {layout:?}: both steering bytes inside an ID of at most 20 bytes"
            )));
        }
        let sockets = sys::map_create(MAP_REUSEPORT_SOCKARRAY, 4, 8, 1 << 16, "udpx_sockets")
            .map_err(|e| refused("create the reuseport socket array", e))?;
        let state =
            sys::map_create(MAP_ARRAY, 4, 8, 1, "udpx_newest").map_err(|e| refused("create the state map", e))?;
        let flows = sys::map_create(MAP_LRU_HASH, 8, 4, FLOW_ENTRIES, "udpx_flows")
            .map_err(|e| refused("create the flow table", e))?;
        use std::os::fd::AsRawFd;
        let insns = assemble(&program(layout), [sockets.as_raw_fd(), state.as_raw_fd(), flows.as_raw_fd()]);
        let prog = sys::prog_load(sys::PROG_TYPE_SK_REUSEPORT, sys::ATTACH_SK_REUSEPORT_SELECT, &insns, "udpx_gens")
            .map_err(|(e, log)| {
                let mut err = refused("load the reuseport program", e);
                if let Error::Io { op, .. } = &mut err {
                    if !log.is_empty() {
                        op.push_str(&format!("; the verifier said: {}", log.trim()));
                    }
                }
                err
            })?;
        Ok(Generations { sockets, state, flows, prog })
    }

    /// The descriptors to hand to the next process, in [`Generations::from_fds`] order.
    pub fn fds(&self) -> [BorrowedFd<'_>; 4] {
        [self.sockets.as_fd(), self.state.as_fd(), self.flows.as_fd(), self.prog.as_fd()]
    }

    /// Takes the descriptors another process handed over (four, in [`Generations::fds`]
    /// order).
    pub fn from_fds(fds: Vec<OwnedFd>) -> Result<Generations, Error> {
        let n = fds.len();
        let mut it = fds.into_iter();
        match (it.next(), it.next(), it.next(), it.next(), it.next()) {
            (Some(sockets), Some(state), Some(flows), Some(prog), None) => {
                Ok(Generations { sockets, state, flows, prog })
            }
            _ => Err(Error::Config(format!("a generation handover carries 4 descriptors, this one {n}"))),
        }
    }

    /// Puts `socket` (bound, in the group) at `generation`'s `worker`.
    pub fn insert(&self, generation: u8, worker: u8, socket: BorrowedFd<'_>) -> Result<(), Error> {
        let key = (u32::from(generation) << 8 | u32::from(worker)).to_ne_bytes();
        let fd = u64::from(std::os::fd::AsRawFd::as_raw_fd(&socket) as u32).to_ne_bytes();
        sys::map_update(self.sockets.as_fd(), &key, &fd)
            .map_err(|e| refused(&format!("put generation {generation}'s worker {worker} in the socket array"), e))
    }

    /// Whether `generation` has a live socket at `worker` (a socket leaves the array when it
    /// closes).
    pub fn is_live(&self, generation: u8, worker: u8) -> bool {
        let key = (u32::from(generation) << 8 | u32::from(worker)).to_ne_bytes();
        let mut cookie = [0u8; 8];
        sys::map_lookup(self.sockets.as_fd(), &key, &mut cookie).is_ok()
    }

    /// Makes `generation` (of `workers` sockets) the one new connections go to.
    pub fn publish(&self, generation: u8, workers: u16) -> Result<(), Error> {
        let mut v = [0u8; 8];
        v[..4].copy_from_slice(&u32::from(generation).to_ne_bytes());
        v[4..].copy_from_slice(&u32::from(workers.max(1)).to_ne_bytes());
        sys::map_update(self.state.as_fd(), &0u32.to_ne_bytes(), &v)
            .map_err(|e| refused("publish the newest generation", e))
    }

    /// The generation new connections go to and its worker count (0 workers: none published).
    pub fn newest(&self) -> (u8, u32) {
        let mut v = [0u8; 8];
        if sys::map_lookup(self.state.as_fd(), &0u32.to_ne_bytes(), &mut v).is_err() {
            return (0, 0);
        }
        let g = u32::from_ne_bytes([v[0], v[1], v[2], v[3]]);
        (g as u8, u32::from_ne_bytes([v[4], v[5], v[6], v[7]]))
    }

    /// Attaches the program to `socket`'s reuseport group (the whole group, whichever socket).
    pub fn attach(&self, socket: BorrowedFd<'_>) -> Result<(), Error> {
        sys::attach_reuseport_ebpf(socket, self.prog.as_fd()).map_err(|e| refused("attach the reuseport program", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: CidLayout = CidLayout { len: 12, first_octet: 0x0b, generation_byte: 10, worker_byte: 11 };

    #[test]
    fn labels_resolve_and_maps_take_two_slots() {
        let ops = program(LAYOUT);
        let insns = assemble(&ops, [3, 4, 5]);
        let maps = ops.iter().filter(|o| matches!(o, Op::Map(..))).count();
        let labels = ops.iter().filter(|o| matches!(o, Op::L(..))).count();
        assert_eq!(insns.len(), ops.len() - labels + maps);
        // The last two instructions: r0 = 1 (SK_PASS); exit.
        assert_eq!(insns[insns.len() - 1] & 0xff, 0x95);
        assert_eq!(insns[insns.len() - 2], encode(0xb7, 0, 0, 0, 1));
        // Every jump lands inside the program.
        for (i, w) in insns.iter().enumerate() {
            let code = (w & 0xff) as u8;
            if code & 0x07 == 0x05 && code != 0x85 && code != 0x95 {
                let off = ((w >> 16) & 0xffff) as u16 as i16;
                let to = i as i64 + 1 + i64::from(off);
                assert!((0..insns.len() as i64).contains(&to), "jump at {i} to {to}");
            }
        }
    }

    #[test]
    fn layouts_outside_an_id_are_refused() {
        let bad = CidLayout { len: 12, first_octet: 0x0b, generation_byte: 12, worker_byte: 11 };
        assert!(matches!(Generations::create(bad), Err(Error::Config(m)) if m.contains("inside")));
    }
}
