//! Every raw call into the kernel lives here, and nowhere else in udpx.
//!
//! The rest of the crate is `deny(unsafe_code)`; this module alone allows it, and every
//! `unsafe` block carries a `// SAFETY:` line naming the invariant it relies on (enforced by
//! `clippy::undocumented_unsafe_blocks`).
//!
//! One way to call the kernel:
//! - `cvt` turns the C convention (`-1` and `errno`) into `io::Result`, keeping the errno;
//! - `retry` is the one EINTR loop;
//! - `setsockopt` / `getsockopt` are the one socket-option helper pair;
//! - `cmsg` is the one control-message encoder (it finalizes `msg_controllen` on drop) and
//!   decoder, over 8-byte-aligned buffers;
//! - `mmsg` builds `mmsghdr` vectors for `sendmmsg`/`recvmmsg` (and their one-message
//!   `sendmsg`/`recvmsg` forms);
//! - `fault` is a test-only seam that makes the next send fail on demand.
#![allow(unsafe_code)]

pub(crate) mod addr;
pub mod bpf;
pub mod cmsg;
pub(crate) mod errqueue;
pub mod fault;
pub mod file;
pub(crate) mod mmsg;
pub(crate) mod netlink;
pub mod tcp;
#[cfg(feature = "io-uring")]
pub(crate) mod uring;
#[cfg(feature = "io-uring")]
pub(crate) mod uring_shard;
pub(crate) mod zc;

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Turns a C return value into `io::Result`: `-1` becomes the thread's `errno`.
pub(crate) fn cvt<T: IsMinusOne>(res: T) -> io::Result<T> {
    if res.is_minus_one() {
        Err(io::Error::last_os_error())
    } else {
        Ok(res)
    }
}

/// Calls `f` until it does not fail with `EINTR`: the one EINTR loop of the crate.
pub(crate) fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Integer types that signal failure with `-1`.
pub(crate) trait IsMinusOne {
    fn is_minus_one(&self) -> bool;
}
impl IsMinusOne for i64 {
    fn is_minus_one(&self) -> bool {
        *self == -1
    }
}
impl IsMinusOne for i32 {
    fn is_minus_one(&self) -> bool {
        *self == -1
    }
}
impl IsMinusOne for isize {
    fn is_minus_one(&self) -> bool {
        *self == -1
    }
}

/// `socket(2)`: a non-inheritable UDP socket of the given family.
pub(crate) fn udp_socket(v6: bool) -> io::Result<OwnedFd> {
    let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket(2) takes plain integers and returns a new descriptor or -1.
    let fd = cvt(unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2), is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt(2)` with a plain-old-data value.
///
/// `T` must be the type the kernel expects for (`level`, `name`): an `int` for most options,
/// a struct for a few (`sock_txtime`). All callers in this crate pass `c_int`, `u32`, `u64` or
/// `libc::sock_txtime`, which have no padding and no invalid bit patterns.
pub(crate) fn setsockopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> io::Result<()> {
    // SAFETY: `value` lives on our stack for the duration of the call and its exact size is
    // passed as optlen; the kernel only reads optlen bytes from it.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `getsockopt(2)` for an `int`-valued option.
pub(crate) fn getsockopt_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes; len says how many bytes value holds.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut value as *mut libc::c_int).cast(), &mut len) })?;
    Ok(value)
}

/// `SO_ATTACH_REUSEPORT_CBPF`: attaches a classic-BPF program that picks the socket of the
/// reuseport group (by index) for each datagram.
pub(crate) fn attach_reuseport_cbpf(fd: BorrowedFd<'_>, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    // The kernel copies the program during the call; `prog` outlives it.
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_REUSEPORT_CBPF, fprog)
}

/// `SO_MEMINFO`: the socket's memory counters (`include/uapi/linux/sock_diag.h`); index
/// `SK_MEMINFO_DROPS` (8) is the drop count, the same number SO_RXQ_OVFL reports, read without
/// a control message on every datagram.
pub(crate) fn meminfo(fd: BorrowedFd<'_>) -> io::Result<[u32; 9]> {
    let mut v = [0u32; 9];
    let mut len = mem::size_of_val(&v) as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes; len says how many bytes v holds; the kernel
    // writes at most that many.
    cvt(unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_MEMINFO, v.as_mut_ptr().cast(), &mut len)
    })?;
    Ok(v)
}

/// `bind(2)`.
pub(crate) fn bind(fd: BorrowedFd<'_>, addr: &std::net::SocketAddr) -> io::Result<()> {
    let raw = addr::SockAddr::from_std(addr);
    // SAFETY: `raw` holds an initialized sockaddr of `raw.len()` bytes for the call.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), raw.as_ptr(), raw.len()) }).map(drop)
}

/// `connect(2)`.
pub(crate) fn connect(fd: BorrowedFd<'_>, addr: &std::net::SocketAddr) -> io::Result<()> {
    let raw = addr::SockAddr::from_std(addr);
    // SAFETY: as for bind: an initialized sockaddr of the stated length.
    retry(|| cvt(unsafe { libc::connect(fd.as_raw_fd(), raw.as_ptr(), raw.len()) })).map(drop)
}

/// `getsockname(2)` or `getpeername(2)`.
pub(crate) fn local_or_peer(fd: BorrowedFd<'_>, peer: bool) -> io::Result<Option<std::net::SocketAddr>> {
    let mut raw = addr::SockAddr::empty();
    let (ptr, len) = raw.as_mut_parts();
    let res = if peer {
        // SAFETY: ptr/len describe a sockaddr_storage we own; the kernel writes at most *len
        // bytes and updates *len.
        unsafe { libc::getpeername(fd.as_raw_fd(), ptr, len) }
    } else {
        // SAFETY: as above.
        unsafe { libc::getsockname(fd.as_raw_fd(), ptr, len) }
    };
    match cvt(res) {
        Ok(_) => Ok(raw.to_std()),
        Err(e) if peer && e.raw_os_error() == Some(libc::ENOTCONN) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sets or clears `O_NONBLOCK`.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and only reads the descriptor's flags.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let new = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    if new != flags {
        // SAFETY: F_SETFL takes an int flag set, which we pass.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, new) })?;
    }
    Ok(())
}

/// `SO_RCVTIMEO` / `SO_SNDTIMEO`: `None` blocks forever.
pub(crate) fn set_timeout(fd: BorrowedFd<'_>, name: libc::c_int, t: Option<Duration>) -> io::Result<()> {
    let tv = match t {
        Some(d) => {
            // A zero timeval means "forever" to the kernel: round up to 1 us.
            let d = d.max(Duration::from_micros(1));
            libc::timeval {
                tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                tv_usec: d.subsec_micros() as libc::suseconds_t,
            }
        }
        None => libc::timeval { tv_sec: 0, tv_usec: 0 },
    };
    setsockopt(fd, libc::SOL_SOCKET, name, tv)
}

/// `ppoll(2)` on one descriptor, to the nanosecond; returns the `revents` (0 on timeout).
pub(crate) fn poll_one(fd: BorrowedFd<'_>, events: libc::c_short, timeout: Duration) -> io::Result<libc::c_short> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 };
        // ppoll, not poll: a deadline (a paced packet's release) may be microseconds away,
        // which poll's milliseconds would round to a spin or a late wake.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let secs = left.as_secs().min(libc::time_t::MAX as u64) as libc::time_t;
        let ts = libc::timespec { tv_sec: secs, tv_nsec: left.subsec_nanos() as _ };
        // SAFETY: one valid pollfd, count 1, a valid timespec, no signal mask.
        match cvt(unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) }) {
            Ok(_) => return Ok(pfd.revents),
            // A signal: wait out what is left.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of [`crate::Timestamp`].
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// A clock in nanoseconds (0 if the kernel does not know the clock, which cannot happen for
/// the MONOTONIC, REALTIME and TAI clocks udpx reads, all present since Linux 3.10).
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; an unknown clock only makes the call fail
    // with EINVAL, leaving `ts` zero.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// The raw descriptor, for the few calls that need it.
pub(crate) fn raw(fd: BorrowedFd<'_>) -> RawFd {
    fd.as_raw_fd()
}

// Constants libc does not (yet) export for every target; values from the kernel's uapi headers.
/// `SOL_UDP` (`include/linux/socket.h`).
pub(crate) const SOL_UDP: libc::c_int = 17;
/// `UDP_SEGMENT` (`include/uapi/linux/udp.h`), since 4.18.
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (`include/uapi/linux/udp.h`), since 5.0.
pub(crate) const UDP_GRO: libc::c_int = 104;
/// `SO_TXTIME` / `SCM_TXTIME` (`include/uapi/asm-generic/socket.h`), since 4.19.
pub(crate) const SO_TXTIME: libc::c_int = 61;
/// `SO_MAX_PACING_RATE` (`include/uapi/asm-generic/socket.h`), since 3.13; a 64-bit value
/// is read since 5.0 (before, the low 32 bits).
pub(crate) const SO_MAX_PACING_RATE: libc::c_int = 47;
/// `SO_ZEROCOPY`, since 4.14.
pub(crate) const SO_ZEROCOPY: libc::c_int = 60;
/// `SO_RXQ_OVFL`.
pub(crate) const SO_RXQ_OVFL: libc::c_int = 40;
/// `SO_NO_CHECK`: disables UDP checksums on send; a GSO send then fails (tests use it).
pub(crate) const SO_NO_CHECK: libc::c_int = 11;
