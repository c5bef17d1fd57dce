//! The raw reference: the bare system calls of the kernel's `udpgso_bench_tx`/`_rx`, written
//! here on std and nix with no udpx code, so that every udpx row can be judged against the
//! loop it abstracts (STYLE rule 10).
//!
//! - **Sender**: one `send(2)` of one buffer per call on a connected socket: a single datagram
//!   ([`Shape::Plain`]), or [`GSO_SEGMENTS`] datagrams in one buffer with a `UDP_SEGMENT`
//!   control message (`sendmsg(2)`; nix builds the 24-byte control buffer on the heap each
//!   call, a few nanoseconds against a 61,824-byte send).
//! - **Receiver**: `recv(2)` into one [`udpx::GRO_BUFFER`]-byte buffer, no control messages,
//!   `UDP_GRO` by `setsockopt` for [`Shape::GsoGro`]. It waits the way the udpx receiver
//!   ([`crate::rx::run_rx`]) does: a non-blocking socket drained until `EAGAIN`, then
//!   `poll(2)` with the same 50 ms timeout, and the same stop rule. `recv` copies every byte
//!   into the buffer (no `MSG_TRUNC`); with `check` it also compares every byte with the
//!   sender's pattern. Without control messages it cannot learn the GRO segment size: it
//!   counts a buffer as `len / segment` datagrams rounded up, exact for the uniform streams
//!   sent here.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{setsockopt, sockopt, ControlMessage, MsgFlags};
use serde::Serialize;

use crate::cpu::ProcessCpu;
use crate::rx::RxResult;
use crate::tx::TxResult;

/// Segments per GSO send: `udpgso_bench_tx`'s 61,824 bytes at 1,472 bytes a segment.
pub const GSO_SEGMENTS: usize = 42;

/// The three shapes of the raw reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// `send` of one datagram into `recv`.
    Plain,
    /// `sendmsg` of [`GSO_SEGMENTS`] datagrams with `UDP_SEGMENT` into a plain `recv`.
    Gso,
    /// The same into a `recv` on a socket with `UDP_GRO`.
    GsoGro,
}

impl Shape {
    /// The sender segments.
    pub fn gso(self) -> bool {
        !matches!(self, Shape::Plain)
    }
    /// The receiver coalesces.
    pub fn gro(self) -> bool {
        matches!(self, Shape::GsoGro)
    }
    /// Payload bytes per send call for datagrams of `size` bytes.
    pub fn send_bytes(self, size: usize) -> usize {
        if self.gso() {
            GSO_SEGMENTS * size
        } else {
            size
        }
    }
}

/// The byte at `offset` within any datagram the raw sender sends (not all zeros, so no page
/// or compression trick makes the copy cheaper than real data).
pub fn pattern(offset: usize) -> u8 {
    (offset.wrapping_mul(7) + 3) as u8
}

/// Sets the receive buffer: `SO_RCVBUFFORCE` as root, else `SO_RCVBUF` (as udpx does);
/// returns the effective size the kernel reports (doubled).
pub fn set_rcvbuf(sock: &UdpSocket, set: usize) -> io::Result<usize> {
    if setsockopt(sock, sockopt::RcvBufForce, &set).is_err() {
        setsockopt(sock, sockopt::RcvBuf, &set)?;
    }
    Ok(nix::sys::socket::getsockopt(sock, sockopt::RcvBuf)?)
}

/// The raw receiver's socket: bound, non-blocking, `UDP_GRO` for `gro`, the receive buffer
/// set to `rcvbuf` (`SO_RCVBUF`'s argument, before the kernel doubles it). Returns the socket
/// and the effective buffer size.
pub fn rx_socket(bind: SocketAddr, gro: bool, rcvbuf: usize) -> io::Result<(UdpSocket, usize)> {
    let s = UdpSocket::bind(bind)?;
    s.set_nonblocking(true)?;
    if gro {
        setsockopt(&s, sockopt::UdpGroSegment, &true)?;
    }
    let eff = set_rcvbuf(&s, rcvbuf)?;
    Ok((s, eff))
}

/// The raw sender's socket: bound to `bind`, connected to `dst`, blocking (as
/// `udpgso_bench_tx`), send buffer 4 MiB like the udpx sender.
pub fn tx_socket(bind: SocketAddr, dst: SocketAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(bind)?;
    s.connect(dst)?;
    let buf = 4usize << 20;
    if setsockopt(&s, sockopt::SndBufForce, &buf).is_err() {
        setsockopt(&s, sockopt::SndBuf, &buf)?;
    }
    Ok(s)
}

/// Sends `shape` datagrams of `size` bytes for `duration` (or until `stop`), at most `rate`
/// bytes per second. A refused datagram (`ECONNREFUSED` from an ICMP error about an earlier
/// one) is skipped, as `udpgso_bench_tx` does.
pub fn run_tx(
    sock: &UdpSocket,
    shape: Shape,
    size: usize,
    duration: Duration,
    rate: Option<u64>,
    stop: &AtomicBool,
) -> io::Result<TxResult> {
    let len = shape.send_bytes(size);
    let buf: Vec<u8> = (0..len).map(|i| pattern(i % size)).collect();
    let seg = u16::try_from(size).map_err(|_| io::Error::other("segment size above 65,535"))?;
    let fd = sock.as_raw_fd();
    let per_call = len.div_ceil(size) as u64;
    let cpu0 = ProcessCpu::thread().unwrap_or_default();
    let start = Instant::now();
    let mut res = TxResult::default();
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) || now - start >= duration {
            break;
        }
        if let Some(rate) = rate {
            if res.bytes as f64 > rate as f64 * (now - start).as_secs_f64() {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
        }
        let sent = if shape.gso() {
            let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
            nix::sys::socket::sendmsg::<()>(fd, &[IoSlice::new(&buf)], &cmsg, MsgFlags::empty(), None)
                .map_err(io::Error::from)
        } else {
            sock.send(&buf)
        };
        match sent {
            Ok(_) => {
                res.bytes += len as u64;
                res.datagrams += per_call;
                res.calls += 1;
                res.gso_buffers += shape.gso() as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => res.calls += 1,
            Err(e) => return Err(e),
        }
    }
    res.secs = start.elapsed().as_secs_f64();
    let cpu = ProcessCpu::thread().unwrap_or_default().diff(&cpu0);
    res.user_secs = cpu.user.as_secs_f64();
    res.sys_secs = cpu.system.as_secs_f64();
    Ok(res)
}

/// What the raw receiver found wrong with `check` on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RawCheck {
    /// Bytes that differ from the sender's pattern.
    pub bad_bytes: u64,
}

/// Receives datagrams of `size` bytes until `stop` is set and the queue is quiet for 100 ms,
/// or `idle` passes without data once data has arrived, or `max` passes. With `check`,
/// compares every byte with [`pattern`] (counted in the returned check).
pub fn run_rx(
    sock: &UdpSocket,
    size: usize,
    check: bool,
    idle: Duration,
    max: Duration,
    stop: &AtomicBool,
) -> io::Result<(RxResult, RawCheck)> {
    let mut buf = vec![0u8; udpx::GRO_BUFFER];
    // The expected contents of one buffer: segment after segment of the pattern.
    let expect: Vec<u8> = if check { (0..buf.len()).map(|i| pattern(i % size.max(1))).collect() } else { Vec::new() };
    let mut bad = RawCheck::default();
    let cpu0 = ProcessCpu::thread().unwrap_or_default();
    let begin = Instant::now();
    let mut res = RxResult::default();
    let mut first: Option<Instant> = None;
    let mut last_data = Instant::now();
    loop {
        let now = Instant::now();
        let quiet = first.is_some() && now - last_data > idle;
        if now - begin > max || quiet || (stop.load(Ordering::Relaxed) && now - last_data > Duration::from_millis(100))
        {
            break;
        }
        match sock.recv(&mut buf) {
            Ok(n) => {
                let segs = n.div_ceil(size.max(1)).max(1) as u64;
                res.bytes += n as u64;
                res.datagrams += segs;
                res.calls += 1;
                res.gro_buffers += (segs > 1) as u64;
                if check {
                    bad.bad_bytes += buf[..n].iter().zip(&expect).filter(|(a, b)| a != b).count() as u64;
                }
                let now = Instant::now();
                first.get_or_insert(now);
                last_data = now;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(50u16)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    res.secs = first.map_or(0.0, |f| (last_data - f).as_secs_f64());
    let cpu = ProcessCpu::thread().unwrap_or_default().diff(&cpu0);
    res.user_secs = cpu.user.as_secs_f64();
    res.sys_secs = cpu.system.as_secs_f64();
    Ok((res, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Raw sender into raw receiver over loopback for 300 ms at 20 MB/s: every byte sent
    /// arrives and matches the pattern; `gro`: coalesced buffers.
    fn pair(shape: Shape) -> (TxResult, RxResult, RawCheck) {
        let size = 1472;
        let (rx, eff) = rx_socket("127.0.0.1:0".parse().unwrap(), shape.gro(), 4 << 20).unwrap();
        assert!(eff >= 4 << 20, "effective receive buffer {eff}");
        let dst = rx.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let h = std::thread::spawn(move || {
            run_rx(&rx, size, true, Duration::from_secs(2), Duration::from_secs(10), &s).unwrap()
        });
        let tx = tx_socket("127.0.0.1:0".parse().unwrap(), dst).unwrap();
        let t = run_tx(&tx, shape, size, Duration::from_millis(300), Some(20_000_000), &stop).unwrap();
        stop.store(true, Ordering::Relaxed);
        let (r, c) = h.join().unwrap();
        (t, r, c)
    }

    #[test]
    fn raw_pairs_deliver_every_byte_exactly() {
        for shape in [Shape::Plain, Shape::Gso, Shape::GsoGro] {
            let (t, r, c) = pair(shape);
            assert!(t.calls > 0, "{shape:?}: nothing sent");
            assert_eq!(r.bytes, t.bytes, "{shape:?}: bytes received = bytes sent");
            assert_eq!(r.datagrams, t.datagrams, "{shape:?}");
            assert_eq!(c.bad_bytes, 0, "{shape:?}: every byte as sent");
            match shape {
                Shape::Plain | Shape::Gso => {
                    assert_eq!(r.calls, r.datagrams, "{shape:?}: one datagram per recv without GRO");
                    assert_eq!(r.gro_buffers, 0);
                }
                Shape::GsoGro => {
                    assert!(r.datagrams > r.calls, "GRO: more than one segment per recv ({r:?})");
                    assert!(r.gro_buffers > 0);
                }
            }
            if shape.gso() {
                assert_eq!(t.datagrams, t.calls * GSO_SEGMENTS as u64, "42 segments per send");
            }
        }
    }

    #[test]
    fn shapes() {
        assert_eq!(Shape::Gso.send_bytes(1472), 61_824);
        assert_eq!(Shape::Plain.send_bytes(1472), 1472);
        assert!(Shape::GsoGro.gro() && Shape::GsoGro.gso() && !Shape::Gso.gro() && !Shape::Plain.gso());
    }
}
