//! The `bpf(2)` calls the generation steering needs (maps, one program, element updates) and
//! the file-descriptor passing that hands them to the next process (`SCM_RIGHTS`).
//!
//! The attribute structs are the leading fields of `union bpf_attr`
//! (`include/uapi/linux/bpf.h`); the kernel accepts a shorter struct than its own as long as
//! what it does not know is absent, and every field not set here is zero.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use super::cmsg::{decode, Cmsg, CmsgBuf, Encoder};
use super::{cvt, retry};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;

/// `BPF_PROG_TYPE_SK_REUSEPORT`.
pub(crate) const PROG_TYPE_SK_REUSEPORT: u32 = 21;
/// `BPF_SK_REUSEPORT_SELECT`.
pub(crate) const ATTACH_SK_REUSEPORT_SELECT: u32 = 39;

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
struct Elem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, fully initialized attribute struct of the command's layout and
    // its size is passed with it; pointers inside it name buffers the caller keeps alive.
    cvt(unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, mem::size_of::<T>() as libc::c_uint) })
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(name.bytes().take(15)) {
        *o = b;
    }
    out
}

/// `BPF_MAP_CREATE`: a map of `map_type` with `max_entries` of `key_size`/`value_size` bytes.
pub(crate) fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut attr =
        MapCreate { map_type, key_size, value_size, max_entries, map_name: name16(name), ..Default::default() };
    let fd = bpf(BPF_MAP_CREATE, &mut attr)?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// One element command on `map`: `key` and the value buffer at `value` (the map's sizes).
fn elem(cmd: libc::c_long, map: BorrowedFd<'_>, key: &[u8], value: u64) -> io::Result<()> {
    let mut attr = Elem { map_fd: map.as_raw_fd() as u32, _pad: 0, key: key.as_ptr() as u64, value, flags: 0 };
    bpf(cmd, &mut attr).map(drop)
}

/// `BPF_MAP_UPDATE_ELEM` with `BPF_ANY`: `key` and `value` must be the map's sizes.
pub(crate) fn map_update(map: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> io::Result<()> {
    elem(BPF_MAP_UPDATE_ELEM, map, key, value.as_ptr() as u64)
}

/// `BPF_MAP_LOOKUP_ELEM`: fills `value` (the map's value size); `ENOENT` when absent.
pub(crate) fn map_lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    elem(BPF_MAP_LOOKUP_ELEM, map, key, value.as_mut_ptr() as u64)
}

/// `BPF_PROG_LOAD` of `insns` (8-byte eBPF instructions). On refusal the error carries the
/// verifier's log.
pub(crate) fn prog_load(
    prog_type: u32,
    attach: u32,
    insns: &[u64],
    name: &str,
) -> Result<OwnedFd, (io::Error, String)> {
    let license = b"Dual MIT/GPL\0";
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = ProgLoad {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name16(name),
        expected_attach_type: attach,
        ..Default::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
        Err(first) => {
            // Again with the verifier's log, for the message.
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let _ = bpf(BPF_PROG_LOAD, &mut attr);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err((first, String::from_utf8_lossy(&log[..end]).into_owned()))
        }
    }
}

/// `SO_ATTACH_REUSEPORT_EBPF`: `prog` picks the socket of `fd`'s whole reuseport group.
pub(crate) fn attach_reuseport_ebpf(fd: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    super::setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_REUSEPORT_EBPF, prog.as_raw_fd() as libc::c_int)
}

/// Most descriptors one [`send_fds`] carries.
pub const MAX_FDS: usize = super::cmsg::MAX_RIGHTS;

/// Sends `data` (non-empty) and `fds` (at most [`MAX_FDS`]) in one message (`SCM_RIGHTS`).
pub fn send_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if data.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "one to eight descriptors with some data"));
    }
    let mut raw = [-1; MAX_FDS];
    for (r, f) in raw.iter_mut().zip(fds) {
        *r = f.as_raw_fd();
    }
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let mut control = CmsgBuf::default();
    {
        let mut enc = Encoder::new(&mut msg, &mut control);
        enc.push(&Cmsg::Rights { fds: raw, count: fds.len() as u8 });
    }
    // SAFETY: msg names live buffers (iov, control) for the duration of the call.
    let sent = retry(|| cvt(unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) }))?;
    if sent as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "a short write on the handover socket"));
    }
    Ok(())
}

/// Receives one message of at most `buf.len()` bytes and the descriptors it carries (closed
/// on exec). Returns the byte count (0 at end of stream).
pub fn recv_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut control = CmsgBuf::default();
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = mem::size_of_val(&control.0) as _;
    // SAFETY: msg names live buffers for the duration of the call.
    let n = retry(|| cvt(unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) }))?;
    let mut fds = Vec::new();
    let mut unreadable = false;
    decode(&msg, |c| match c {
        Cmsg::Rights { fds: got, count } => {
            for &fd in &got[..usize::from(count)] {
                // SAFETY: a descriptor SCM_RIGHTS delivered is new in this process and owned by
                // nobody else; it is taken here exactly once.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        Cmsg::Unknown { .. } => unreadable = true,
        _ => {}
    });
    if unreadable || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "more descriptors than a handover carries"));
    }
    Ok((n as usize, fds))
}
