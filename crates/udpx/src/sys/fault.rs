//! A test-only seam in the syscall layer.
//!
//! Some failures cannot be produced on demand by this kernel (a GSO `EIO` from a driver,
//! `ENOBUFS` from a full device queue, a `sendmmsg` that stops short), yet the fallbacks that
//! handle them must be proven to lose nothing. With the `fault-injection` feature a test queues
//! faults on a socket; each send syscall consumes one before touching the kernel. Without the
//! feature the type is empty and every method compiles to nothing.

/// One injected fault, consumed by the next send syscall on the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
// Constructed only by tests, through the `fault-injection` feature.
#[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
pub enum Fault {
    /// The call fails with this errno and sends nothing (as the kernel does when the first
    /// message of a batch fails).
    Errno(i32),
    /// A `sendmmsg` hands at most this many messages to the kernel and returns the count,
    /// as a real partial send does (a plain `sendmsg` is unaffected).
    Short(usize),
    /// The next call that carries a GSO message (a segment size) fails with this errno;
    /// calls before it without one go through and leave the fault queued. For a refusal that
    /// only means something on a GSO send (EIO), where which call comes first depends on
    /// timing.
    ErrnoOnGso(i32),
    /// The next call that goes through io_uring queues its entries as usual, but its
    /// `io_uring_enter` calls fail with `errno`, `times` of them (1 at least): the first after
    /// the kernel took the entries (`after_submit`, as when the wait for completions fails)
    /// or before. Every entry the kernel took must still be waited for, and what went
    /// reported, before the send returns. A call by system calls consumes it unaffected.
    UringEnter {
        /// The errno `io_uring_enter` returns.
        errno: i32,
        /// Whether the kernel takes the entries before the first failure.
        after_submit: bool,
        /// How many calls of that send fail.
        times: u32,
    },
    /// The next call goes through untouched: a place holder that puts the faults queued after
    /// it on later calls (an io_uring retry round, say).
    Pass,
}

/// Queued faults of one socket.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    #[cfg(feature = "fault-injection")]
    queue: std::sync::Mutex<std::collections::VecDeque<Fault>>,
    /// Receive control-buffer bytes offered to the kernel (0: the full buffer), so a test can
    /// make the kernel itself cut the control data (MSG_CTRUNC).
    #[cfg(feature = "fault-injection")]
    recv_control: std::sync::atomic::AtomicUsize,
}

impl Faults {
    /// Queues a fault for a later send call.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn push(&self, f: Fault) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push_back(f);
    }

    /// Offers only `len` bytes of control buffer to later receives (0: the whole buffer).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn limit_recv_control(&self, len: usize) {
        self.recv_control.store(len, std::sync::atomic::Ordering::Relaxed);
    }

    /// Control-buffer bytes a receive offers the kernel.
    #[inline]
    pub(crate) fn recv_control_len(&self) -> usize {
        #[cfg(feature = "fault-injection")]
        {
            match self.recv_control.load(std::sync::atomic::Ordering::Relaxed) {
                0 => super::cmsg::CMSG_CAP,
                n => n.min(super::cmsg::CMSG_CAP),
            }
        }
        #[cfg(not(feature = "fault-injection"))]
        {
            super::cmsg::CMSG_CAP
        }
    }

    /// Takes the next fault for a call that carries a GSO message (`gso`) or not, if any.
    #[inline]
    pub(crate) fn next(&self, gso: bool) -> Option<Fault> {
        #[cfg(feature = "fault-injection")]
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            match q.front() {
                Some(Fault::ErrnoOnGso(_)) if !gso => None,
                _ => q.pop_front(),
            }
        }
        #[cfg(not(feature = "fault-injection"))]
        {
            let _ = gso;
            None
        }
    }
}
