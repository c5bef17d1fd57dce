//! Waiting, for callers that block: the policy above the send mechanism.
//!
//! [`UdpSocket::try_send`] never waits; [`UdpSocket::send`] is what a thread that may block
//! wants. It keeps the no-loss promise the same way and adds two waits:
//! - EAGAIN between transmits on a non-blocking socket: returned (`WouldBlock`, with the
//!   count sent whole); inside a transmit that goes as several messages: it waits (at most
//!   [`FINISH_WAIT`]) for writability and finishes it, so no transmit is left half-sent;
//! - ENOBUFS (a full device queue or qdisc): backs off 50 us, doubling to 10 ms, at most
//!   [`ENOBUFS_RETRIES`] times in a row, then returns `NoBuffers`.
//!
//! Its scratch space is the socket's own, behind a lock; an event loop, a reactor or an
//! io_uring loop uses `try_send` with its own [`SendBuffers`](crate::SendBuffers) instead and
//! waits its own way. The waits here also read the error queue on `POLLERR` (see
//! [`crate::icmp`]) instead of spinning.

use std::io;
use std::time::{Duration, Instant};

use crate::error::{SendError, SendErrorKind};
use crate::socket::UdpSocket;
use crate::sys;
use crate::transmit::{SendCursor, Transmit};
use crate::zerocopy::ZcState;

/// ENOBUFS answers in a row that [`UdpSocket::send`] backs off and retries before it reports
/// `NoBuffers`.
pub const ENOBUFS_RETRIES: u32 = 12;
/// How long [`UdpSocket::send`] waits for buffer space to finish a transmit it has started.
pub const FINISH_WAIT: Duration = Duration::from_secs(2);

/// The pause before the `retry`-th retry (from 0) after ENOBUFS: 50 us, doubling, at most
/// 10 ms. A full device queue raises no writability edge, so a waiter sleeps this long; an
/// async caller (udpx-tokio) sleeps it on its timer.
pub fn enobufs_backoff(retry: u32) -> Duration {
    Duration::from_micros(50 << retry.min(8)).min(Duration::from_millis(10))
}

impl UdpSocket {
    /// Sends `transmits` in order, as many per system call as the send mode allows, waiting
    /// where [`UdpSocket::try_send`] would return (see the module docs).
    ///
    /// Returns the number sent, which is `transmits.len()` unless an error says otherwise (see
    /// [`SendError::sent`]). Invalid transmits are refused before anything is sent.
    pub fn send(&self, transmits: &[Transmit<'_>]) -> Result<usize, SendError> {
        let mut scratch = self.send_scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.send_blocking(&mut scratch.0, transmits, None)
    }

    /// [`UdpSocket::send`] on given scratch, for zerocopy sends too (their state locked by
    /// the caller, after the scratch).
    pub(crate) fn send_blocking(
        &self,
        scratch: &mut sys::mmsg::SendScratch,
        transmits: &[Transmit<'_>],
        mut zc: Option<&mut ZcState>,
    ) -> Result<usize, SendError> {
        let mut cur = SendCursor::default();
        let mut enobufs = 0u32;
        loop {
            let e = match self.send_with(scratch, transmits, cur, zc.as_deref_mut()) {
                Ok(n) => return Ok(n),
                Err(e) => e,
            };
            if e.cursor() != cur {
                enobufs = 0; // progress since the last stop
            }
            cur = e.cursor();
            match e.kind {
                SendErrorKind::WouldBlock if cur.segment == 0 => return Err(e),
                SendErrorKind::WouldBlock => {
                    // Inside a transmit: finish it before returning.
                    if !self.wait_for(libc::POLLOUT, FINISH_WAIT, zc.as_deref_mut()).unwrap_or(false) {
                        let why = format!("socket stayed unwritable for {FINISH_WAIT:?} in the middle of a transmit");
                        return Err(SendError {
                            kind: SendErrorKind::Io(io::Error::new(io::ErrorKind::TimedOut, why)),
                            ..e
                        });
                    }
                }
                SendErrorKind::NoBuffers if enobufs < ENOBUFS_RETRIES => {
                    self.counters.add(&self.counters.enobufs_retries, 1);
                    std::thread::sleep(enobufs_backoff(enobufs));
                    enobufs += 1;
                }
                _ => return Err(e),
            }
        }
    }

    /// Waits up to `timeout` (to the nanosecond) for `events` (`POLLIN`, `POLLOUT`, both),
    /// once, and returns the events that came (`POLLERR` among them: error-queue entries to
    /// read, which this wait leaves to the caller; 0 when the time passed). For an event loop
    /// that reads the error queue its own way; [`UdpSocket::wait_readable`] reads it itself.
    pub fn poll(&self, events: libc::c_short, timeout: Duration) -> io::Result<libc::c_short> {
        sys::poll_one(self.fd_ref(), events, timeout)
    }

    /// Waits until the socket is readable or `timeout` passes; returns whether it is. Error
    /// queue entries that show up meanwhile are read (see [`crate::icmp`]) and the wait goes
    /// on; a connected socket's pending error (its peer refused) is returned.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        self.wait_for(libc::POLLIN, timeout, None)
    }

    /// Waits until the socket is writable or `timeout` passes; returns whether it is (error
    /// queue entries as for [`UdpSocket::wait_readable`]).
    pub fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        self.wait_for(libc::POLLOUT, timeout, None)
    }

    /// Waits up to `timeout` for `events` (POLLIN or POLLOUT). POLLERR on the way (an
    /// error-queue entry) is read and the wait goes on; a pending socket error with an empty
    /// queue is returned as the error on a connected socket (its peer refused), read and
    /// dropped on an unconnected one (an ICMP error whose queue entry the kernel dropped).
    pub(crate) fn wait_for(
        &self,
        events: libc::c_short,
        timeout: Duration,
        mut zc: Option<&mut ZcState>,
    ) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let rev = sys::poll_one(self.fd_ref(), events, left)?;
            if rev & events != 0 {
                return Ok(true);
            }
            if rev & libc::POLLERR == 0 || left.is_zero() {
                return Ok(false);
            }
            if self.drain_error_queue(zc.as_deref_mut(), None, &mut |_| {})?.read == 0 {
                // A pending error whose queue entry was dropped (full receive buffer), or a
                // connected socket's peer refusing: SO_ERROR reads and clears it.
                let err = sys::getsockopt_int(self.fd_ref(), libc::SOL_SOCKET, libc::SO_ERROR)?;
                if err != 0 && !self.icmp_pending(err) {
                    return Err(io::Error::from_raw_os_error(err));
                }
            }
        }
    }
}
