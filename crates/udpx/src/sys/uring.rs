//! The io_uring send path: the planned messages of one `sendmmsg` submitted instead as linked
//! `IORING_OP_SENDMSG` entries, one `io_uring_enter` for all of them.
//!
//! ```text
//!  hdrs[0] ──SQE SENDMSG (IO_LINK)──► hdrs[1] ──SQE (IO_LINK)──► … ──► hdrs[n-1] ──SQE
//!  io_uring_enter(to_submit = n, min_complete = n)
//!  CQEs: res = bytes sent | -errno; after the first failure the rest of the chain is
//!        cancelled (-ECANCELED), so "the first k went" has the meaning sendmmsg's return has
//! ```
//!
//! Everything above it (GSO planning and fallbacks, the cursor, ENOBUFS, ICMP retries) is the
//! same code as the system-call path: the messages are the same `mmsghdr`s, only the submission
//! differs. A non-blocking socket's entries carry `MSG_DONTWAIT`, so a full socket answers
//! `-EAGAIN` instead of io_uring arming a poll and waiting (the mechanism never sleeps).
//!
//! Where io_uring is missing (old kernel, `kernel.io_uring_disabled = 2`, a seccomp filter)
//! creating the ring fails and the socket stays on system calls, saying why
//! ([`crate::Capabilities::io_uring_off_reason`]).

use std::io;
use std::os::fd::RawFd;
use std::sync::OnceLock;

use io_uring::{opcode, squeue, types, IoUring, Probe};

/// One ring, owned by one [`crate::SendBuffers`] (so by one thread at a time).
pub(crate) struct Ring {
    ring: IoUring,
    /// One slot per entry: the completion results of the last batch.
    results: Box<[i32]>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ring")
    }
}

impl Ring {
    /// A ring of `entries` (a batch's messages at most) whose kernel supports
    /// `IORING_OP_SENDMSG`.
    pub(crate) fn new(entries: u32) -> io::Result<Ring> {
        let ring = IoUring::new(entries)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::SendMsg::CODE) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "IORING_OP_SENDMSG not supported"));
        }
        Ok(Ring { ring, results: vec![0; entries as usize].into_boxed_slice() })
    }

    /// Sends `hdrs[..n]` as linked SENDMSG entries and waits for their completions. Like
    /// `sendmmsg`: `Ok(k)` when the first `k >= 1` went (their `msg_len` set), the error of
    /// the first one when none did.
    pub(crate) fn sendmsgs(
        &mut self,
        fd: RawFd,
        hdrs: &mut [libc::mmsghdr],
        n: usize,
        flags: libc::c_int,
    ) -> io::Result<usize> {
        let n = n.min(hdrs.len()).min(self.results.len());
        if n == 0 {
            return Ok(0);
        }
        {
            let mut sq = self.ring.submission();
            for (i, h) in hdrs.iter().enumerate().take(n) {
                let mut e =
                    opcode::SendMsg::new(types::Fd(fd), &h.msg_hdr).flags(flags as u32).build().user_data(i as u64);
                if i + 1 < n {
                    e = e.flags(squeue::Flags::IO_LINK);
                }
                // SAFETY: the entry points at hdrs[i].msg_hdr, whose name, iovec and control
                // pointers target buffers the caller keeps alive and unmoved for this call;
                // the call waits below for every entry's completion before returning, so the
                // kernel never reads them after the borrow ends. The queue has `entries` >= n
                // free slots: every earlier call drained all its completions.
                unsafe { sq.push(&e) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
            }
        }
        let mut done = 0;
        self.results[..n].fill(-libc::ECANCELED);
        while done < n {
            match self.ring.submit_and_wait(n - done) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                if i < n {
                    self.results[i] = cqe.result();
                }
                done += 1;
            }
        }
        let mut k = 0;
        while k < n && self.results[k] >= 0 {
            hdrs[k].msg_len = self.results[k] as u32;
            k += 1;
        }
        if k == 0 {
            return Err(io::Error::from_raw_os_error(-self.results[0]));
        }
        Ok(k)
    }
}

/// Whether this kernel and process may use io_uring for sends: `Ok` or why not (probed once).
pub(crate) fn available() -> Result<(), String> {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    AVAILABLE
        .get_or_init(|| {
            Ring::new(2).map(|_| ()).map_err(|e| {
                let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok();
                match disabled.as_deref().map(str::trim) {
                    Some(d) if d != "0" => format!("io_uring unavailable ({e}; kernel.io_uring_disabled = {d})"),
                    _ => format!("io_uring unavailable ({e})"),
                }
            })
        })
        .clone()
}
