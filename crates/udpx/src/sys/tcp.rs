//! What the kernel knows of a TCP connection (`TCP_INFO`, `TCP_CONGESTION`): for a server's
//! line per connection at its close, beside QUIC's.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use super::cvt;

/// A TCP connection's figures, from `TCP_INFO`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Smoothed round-trip time.
    pub rtt: Duration,
    /// Minimum round-trip time (zero before a sample).
    pub min_rtt: Duration,
    /// Segments sent.
    pub segs_out: u64,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u64,
    /// Segments the kernel counts lost now.
    pub lost: u64,
    /// Congestion window, bytes (segments times the sending MSS).
    pub cwnd: u64,
    /// Bytes sent (retransmissions included).
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
}

/// `fd`'s `TCP_INFO`.
pub fn info(fd: BorrowedFd<'_>) -> io::Result<TcpInfo> {
    // SAFETY: tcp_info is plain old data; the kernel fills at most `len` bytes of it.
    let mut i: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `i` is a live tcp_info of `len` bytes, `len` a live socklen_t.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut i).cast(), &mut len) })?;
    Ok(TcpInfo {
        rtt: Duration::from_micros(i.tcpi_rtt.into()),
        min_rtt: Duration::from_micros(i.tcpi_min_rtt.into()),
        segs_out: i.tcpi_segs_out.into(),
        total_retrans: i.tcpi_total_retrans.into(),
        lost: i.tcpi_lost.into(),
        cwnd: u64::from(i.tcpi_snd_cwnd) * u64::from(i.tcpi_snd_mss),
        bytes_sent: i.tcpi_bytes_sent,
        bytes_received: i.tcpi_bytes_received,
    })
}

/// `fd`'s congestion controller (`TCP_CONGESTION`): `cubic`, `bbr`, ...
pub fn congestion(fd: BorrowedFd<'_>) -> io::Result<String> {
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: `name` is a live buffer of `len` bytes, `len` a live socklen_t.
    cvt(unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_mut_ptr().cast(), &mut len)
    })?;
    let name = &name[..(len as usize).min(name.len())];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn a_loopback_connection_has_figures_and_a_controller() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        c.read_exact(&mut got).unwrap();
        let i = info(s.as_fd()).unwrap();
        assert!(i.bytes_sent >= 100_000 && i.segs_out > 0 && i.cwnd > 0, "{i:?}");
        assert!(i.rtt > Duration::ZERO, "{i:?}");
        assert_eq!(info(c.as_fd()).unwrap().bytes_received, 100_000);
        assert!(!congestion(s.as_fd()).unwrap().is_empty());
    }
}
