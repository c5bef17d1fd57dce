//! The socket error queue (`recvmsg(2)` with `MSG_ERRQUEUE`): zerocopy completions and, with
//! `IP_RECVERR`, ICMP errors.
//!
//! From `msg_zerocopy.rst`: "Notifications are read by recvmsg with MSG_ERRQUEUE … The range
//! ee_info..ee_data (inclusive) of send calls has completed"; reading never blocks
//! (MSG_ERRQUEUE implies it), and `POLLERR` signals that the queue is non-empty.

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::addr::SockAddr;
use super::cmsg::{self, Cmsg, CmsgBuf, ExtErr};
use super::{cvt, retry};

/// Bytes of the quoted datagram an error-queue read keeps.
pub(crate) const QUOTE_MAX: usize = 64;

/// Reads every queued error-queue message (up to `max`), calling `f` with each extended error,
/// for an ICMP error the destination of the datagram that caused it (the kernel puts it in
/// `msg_name`: `ip_recv_error`, `ipv6_recv_error`), and the start of that datagram's payload
/// as the ICMP message quoted it (the kernel queues the quote from just past the UDP header,
/// `ip_icmp_error`; empty when a router quoted only the 8 bytes of UDP header, and for
/// zerocopy completions). Returns how many were read; 0 when the queue is empty.
pub(crate) fn drain(
    fd: BorrowedFd<'_>,
    max: usize,
    mut f: impl FnMut(ExtErr, Option<SocketAddr>, &[u8]),
) -> io::Result<usize> {
    let mut n = 0;
    let mut ctrl = CmsgBuf::default();
    // The first QUOTE_MAX bytes of the quote are enough to recognise a datagram of ours; the
    // rest is cut (MSG_TRUNC), which is fine.
    let mut data = [0u8; QUOTE_MAX];
    while n < max {
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
        let mut name = SockAddr::empty();
        let name_len = name.len();
        let (name_ptr, _) = name.as_mut_parts();
        // SAFETY: all-zero is a valid msghdr.
        let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
        hdr.msg_name = name_ptr.cast();
        hdr.msg_namelen = name_len;
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = ctrl.0.as_mut_ptr().cast();
        hdr.msg_controllen = cmsg::CMSG_CAP as _;
        let res = retry(|| {
            // SAFETY: hdr points at live iovec, data and control buffers for the call.
            cvt(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut hdr, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) })
        });
        match res {
            Ok(got) => {
                n += 1;
                let dst = name.with_len(hdr.msg_namelen);
                let quote = &data[..(got as usize).min(QUOTE_MAX)];
                cmsg::decode(&hdr, |c| {
                    if let Cmsg::ExtErr(e) = c {
                        f(e, dst, quote)
                    }
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
