//! Receive through io_uring: one multishot `IORING_OP_RECVMSG` over a ring of provided
//! buffers, so a busy socket is read with no system call per batch at all (the kernel fills
//! buffers as datagrams arrive; [`UringReceiver::recv`] reaps what is there, and enters the
//! kernel only to wait or to re-arm). First step of the io_uring backend: the metadata is the
//! same [`RecvMeta`] as the system-call path (GRO segment size, ECN, pktinfo, the drop
//! counter, truncation), parsed from the same control messages.
//!
//! - The ring runs empty when the caller falls behind: the receive ends with ENOBUFS (the
//!   datagrams wait in the socket's queue, nothing is lost there), which is counted
//!   ([`UringRecvStats::no_buffers`]) and re-armed once buffers are back: never a silent stall.
//! - A multishot receive the kernel ends (no `IORING_CQE_F_MORE`) is re-armed at the next call
//!   ([`UringRecvStats::rearms`]).
//! - A datagram larger than the buffer is cut and reported `truncated`, as with `recvmsg`.
//!
//! Each buffer holds the kernel's 16-byte header, a 128-byte name, the control space and the
//! payload; buffers go back to the ring at the next call, so a datagram's bytes are valid only
//! inside the callback. Not yet: a caller-chosen thread model for async runtimes, and the
//! receive half of the echo server and bench.

use std::io;
use std::os::fd::AsRawFd;

use crate::error::Error;
use crate::recv::RecvMeta;
use crate::socket::UdpSocket;
use crate::sys::uring::{RecvEvent, RecvRing};

/// What a receiver counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringRecvStats {
    /// Completions reaped (one per datagram or GRO buffer, plus ENOBUFS ends).
    pub completions: u64,
    /// Datagrams delivered to the callback (GRO buffers split).
    pub datagrams: u64,
    /// Times the buffer ring ran empty (ENOBUFS) and the receive was re-armed.
    pub no_buffers: u64,
    /// Times the receive had ended and was armed again.
    pub rearms: u64,
    /// Calls that entered the kernel to wait.
    pub waits: u64,
}

/// A multishot io_uring receive on one socket; see the module docs.
#[derive(Debug)]
pub struct UringReceiver<'s> {
    socket: &'s UdpSocket,
    ring: RecvRing,
    stats: UringRecvStats,
    started: bool,
}

impl UdpSocket {
    /// A multishot io_uring receiver on this socket with `buffers` buffers (a power of two,
    /// at most 32,768) of `size` payload bytes each ([`crate::GRO_BUFFER`] for a GRO socket).
    pub fn uring_receiver(&self, buffers: u16, size: usize) -> Result<UringReceiver<'_>, Error> {
        if !buffers.is_power_of_two() || buffers > 32_768 {
            return Err(Error::Config(format!("{buffers} io_uring receive buffers: give a power of two up to 32768")));
        }
        if size == 0 || size > crate::GRO_BUFFER {
            return Err(Error::Config(format!(
                "io_uring receive buffers of {size} B: give 1 to {}",
                crate::GRO_BUFFER
            )));
        }
        crate::caps::io_uring_available()
            .map_err(|why| Error::Unsupported { feature: crate::Feature::IoUring, why })?;
        let ring = RecvRing::new(self.as_raw_fd(), buffers, size).map_err(|e| Error::Unsupported {
            feature: crate::Feature::IoUring,
            why: format!("io_uring receive: {e}"),
        })?;
        Ok(UringReceiver { socket: self, ring, stats: UringRecvStats::default(), started: false })
    }
}

impl UringReceiver<'_> {
    /// Calls `f` for every datagram that arrived (a GRO buffer's datagrams one by one, each
    /// with the buffer's metadata). With `wait`, when nothing is there, waits at most that long
    /// for something (one `io_uring_enter`); without, never enters the kernel unless the
    /// receive must be armed again. Returns the datagrams delivered.
    pub fn recv(
        &mut self,
        wait: Option<std::time::Duration>,
        mut f: impl FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        let fallback = self.socket.peer_addr().unwrap_or(self.socket.local_addr());
        let gro = self.socket.caps.gro;
        let (mut dgrams, mut bytes, mut bufs, mut gro_bufs, mut trunc, mut empty) =
            (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        let was_armed = self.started;
        let n = self.ring.reap(wait, |ev| match ev {
            RecvEvent::NoBuffers => empty += 1,
            RecvEvent::Datagram { raw, payload } => {
                let meta = RecvMeta::from_raw(&raw, fallback, gro);
                bufs += 1;
                bytes += payload.len() as u64;
                trunc += u64::from(meta.truncated);
                let segs = meta.segment_count() as u64;
                gro_bufs += u64::from(segs > 1);
                for d in meta.segments(payload) {
                    dgrams += 1;
                    let one = RecvMeta { len: d.len(), stride: d.len(), ..meta };
                    f(&one, d);
                }
            }
        })?;
        if was_armed && n > 0 && !self.ring.is_armed() {
            self.stats.rearms += 1;
        }
        self.started = true;
        self.stats.completions += n as u64;
        self.stats.datagrams += dgrams;
        self.stats.no_buffers += empty;
        self.stats.waits += u64::from(wait.is_some());
        let c = &self.socket.counters;
        c.add(&c.messages_received, bufs);
        c.add(&c.datagrams_received, dgrams);
        c.add(&c.bytes_received, bytes);
        c.add(&c.gro_buffers_received, gro_bufs);
        c.add(&c.truncated, trunc);
        Ok(dgrams as usize)
    }

    /// What it counted so far.
    pub fn stats(&self) -> UringRecvStats {
        self.stats
    }
}
