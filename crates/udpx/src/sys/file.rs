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

/// How many of `file`'s pages the page cache holds now, and of how many (`mincore` over a
/// read-only mapping). Unlike a probing read it starts no readahead, so asking leaves the
/// cache as it was: for tests and benches of cold reads. An empty file holds `(0, 0)`.
pub fn cached_pages(file: &File) -> io::Result<(usize, usize)> {
    let len = usize::try_from(file.metadata()?.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if len == 0 {
        return Ok((0, 0));
    }
    // SAFETY: sysconf reads a constant of the system.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let pages = len.div_ceil(page);
    // SAFETY: a fresh shared read-only mapping of an open descriptor; nothing of ours is
    // overwritten, and it is unmapped below on every path.
    let at = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    if at == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; pages];
    // SAFETY: `at` maps `len` bytes; `vec` has one byte for each of its pages.
    let r = cvt(unsafe { libc::mincore(at, len, vec.as_mut_ptr()) });
    // SAFETY: the mapping made above, of that length, unmapped once.
    unsafe { libc::munmap(at, len) };
    r?;
    Ok((vec.iter().filter(|b| *b & 1 == 1).count(), pages))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_is_all_cached_and_an_empty_one_has_no_pages() {
        let dir = std::env::temp_dir().join(format!("udpx-cached-pages-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::write(&p, vec![7u8; 3 * 4096 + 1]).unwrap();
        let f = File::open(&p).unwrap();
        let (cached, pages) = cached_pages(&f).unwrap();
        assert!(pages >= 2, "{pages}");
        assert_eq!(cached, pages, "a file just written is in the page cache");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(cached_pages(&File::open(&p).unwrap()).unwrap(), (0, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
