//! Reads of files a sender serves, that never wait for the disk.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::{cvt, retry};

/// One `preadv2(RWF_NOWAIT)` of `file` into `buf` at `offset`: the bytes the page cache holds
/// from there (`Ok(0)` at the end of the file), `Err(WouldBlock)` when the first would need
/// the disk, `Err(Unsupported)` where the file system does not take `RWF_NOWAIT`.
pub fn read_nowait(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let at = libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: one iovec over `buf`, a live, exclusively borrowed slice of that length.
    let n = retry(|| cvt(unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) }));
    match n {
        Ok(n) => Ok(n as usize),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Err(io::ErrorKind::Unsupported.into()),
        Err(e) => Err(e),
    }
}

/// Asks the kernel to drop `file`'s clean pages from the page cache (`POSIX_FADV_DONTNEED`):
/// the next read of them goes to the disk. For tests and benches of cold reads.
pub fn drop_cached(file: &File) -> io::Result<()> {
    // SAFETY: an advice call on an open descriptor; it touches no memory of ours.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}
