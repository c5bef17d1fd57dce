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
//! The entries point at the caller's headers and payloads, so a send returns only once every
//! entry the kernel took has completed, also when `io_uring_enter` fails on the way; a ring
//! that cannot be entered any more is given up (never entered again), or, with entries still
//! in the kernel, the process aborts rather than hand their buffers back ([`Ring::complete`]).
//!
//! Everything above it (GSO planning and fallbacks, the cursor, ENOBUFS, ICMP retries) is the
//! same code as the system-call path: the messages are the same `mmsghdr`s, only the submission
//! differs. A non-blocking socket's entries carry `MSG_DONTWAIT`, so a full socket answers
//! `-EAGAIN` instead of io_uring arming a poll and waiting (the mechanism never sleeps).
//!
//! Zerocopy: with `MSG_ZEROCOPY` asked for, the entries are `IORING_OP_SENDMSG_ZC` instead.
//! Each gets a zerocopy id in its user data (the socket's tracker assigns them in order, as the
//! kernel does for `MSG_ZEROCOPY`); its first completion carries the result and
//! `IORING_CQE_F_MORE` when the buffer is still the kernel's, and a later notification
//! (`IORING_CQE_F_NOTIF`, same user data, `IORING_NOTIF_USAGE_ZC_COPIED` when the kernel copied
//! after all) hands it back: the notifications replace the error queue. They arrive whenever
//! the ring is read, so they are kept ([`Ring::take_notifs`]) until the socket applies them.
//!
//! Where io_uring is missing (old kernel, `kernel.io_uring_disabled = 2`, a seccomp filter)
//! creating the ring fails and the socket stays on system calls, saying why
//! ([`crate::Capabilities::io_uring_off_reason`]).

use std::io;
use std::os::fd::RawFd;
use std::sync::OnceLock;

use io_uring::{cqueue, opcode, squeue, types, IoUring, Probe};

use super::zc::{Notif, ZcBatch};

/// User data of zerocopy entries: this bit and the zerocopy id.
const ZC_TAG: u64 = 1 << 63;
/// In a SENDMSG_ZC entry's `ioprio`: say in the notification whether the kernel copied.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// In a notification's result: the kernel copied the data after all.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
/// How long failed `io_uring_enter` calls may go on, none of them followed by a completion,
/// before a send stops waiting for its entries ([`Ring::complete`]): a transient refusal
/// (EAGAIN, ENOMEM, EBUSY under memory pressure) is waited out, a broken ring is not.
#[cfg(not(feature = "fault-injection"))]
const ENTER_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(10);
/// In test builds (the fault seam injects enters that fail for good) a second is enough.
#[cfg(feature = "fault-injection")]
const ENTER_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest pause between two failed `io_uring_enter` calls (they back off from 50 us,
/// doubling): the only sleep in the library, on a path a healthy ring never takes.
const ENTER_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_millis(100);

/// One ring, owned by one [`crate::SendBuffers`] (so by one thread at a time).
pub(crate) struct Ring {
    ring: IoUring,
    /// One slot per entry: the completion results of the last batch.
    results: Box<[i32]>,
    /// One slot per entry: whether its first completion said a notification follows.
    more: Box<[bool]>,
    /// The kernel has `IORING_OP_SENDMSG_ZC`.
    zc: bool,
    /// Notifications read and not yet taken.
    notifs: Vec<Notif>,
    /// Ids whose send failed after taking them (their notification is not judged).
    failed_ids: Vec<u32>,
    /// `io_uring_enter` kept failing with entries never taken left in the submission queue:
    /// the ring is never entered again (an enter would submit entries that point at buffers
    /// long gone) and the socket sends by system calls.
    broken: bool,
    /// Test builds: the next send's `io_uring_enter` calls fail with this errno, the first
    /// after submitting (`after_submit`) or before, `times` calls in all.
    #[cfg(feature = "fault-injection")]
    enter_fault: Option<EnterFault>,
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
        // Room for a batch's completions and many notifications not yet taken (the kernel
        // keeps any overflow, IORING_FEAT_NODROP, but that is slower).
        let ring = IoUring::builder().setup_cqsize(entries.max(64) * 16).build(entries)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::SendMsg::CODE) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "IORING_OP_SENDMSG not supported"));
        }
        let n = entries as usize;
        Ok(Ring {
            ring,
            results: vec![0; n].into_boxed_slice(),
            more: vec![false; n].into_boxed_slice(),
            zc: probe.is_supported(opcode::SendMsgZc::CODE),
            notifs: Vec::new(),
            failed_ids: Vec::new(),
            broken: false,
            #[cfg(feature = "fault-injection")]
            enter_fault: None,
        })
    }

    /// Whether the ring may be used: false once given up on (see [`Ring::complete`]).
    pub(crate) fn is_usable(&self) -> bool {
        !self.broken
    }

    /// Makes the next send's `io_uring_enter` calls fail (the test-only seam of
    /// [`super::fault`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn fail_next_enter(&mut self, fault: EnterFault) {
        self.enter_fault = Some(fault);
    }

    /// Whether no entry is waiting to be submitted (but on a ring given up on, which is never
    /// entered again) and no send completion is unread (zerocopy notifications are kept for
    /// [`Ring::take_notifs`]): [`Ring::complete`] returns only when no entry is in the kernel
    /// (tests).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn is_quiet(&mut self) -> bool {
        let mut unread = 0;
        for c in self.ring.completion() {
            unread += sort(&mut self.notifs, &mut self.failed_ids, &c).is_some() as usize;
        }
        unread == 0 && (self.broken || self.ring.submission().is_empty())
    }

    /// Whether zerocopy entries (`IORING_OP_SENDMSG_ZC`) are available.
    pub(crate) fn has_zerocopy(&self) -> bool {
        self.zc
    }

    /// The notifications read so far, after reading the completion queue; with `wait`, first
    /// waits up to that long for a completion when none is queued.
    pub(crate) fn take_notifs(&mut self, wait: Option<std::time::Duration>) -> io::Result<Vec<Notif>> {
        self.read_completions();
        // A broken ring is not entered again (see `broken`): what it posts is still read.
        if let (Some(w), true, false) = (wait, self.notifs.is_empty(), self.broken) {
            let ts = types::Timespec::from(w);
            match self.ring.submitter().submit_with_args(1, &types::SubmitArgs::new().timespec(&ts)) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => {}
                Err(e) => return Err(e),
            }
            self.read_completions();
        }
        Ok(std::mem::take(&mut self.notifs))
    }

    /// Reads every queued completion; only notifications can be queued between calls.
    fn read_completions(&mut self) {
        for c in self.ring.completion() {
            let _ = sort(&mut self.notifs, &mut self.failed_ids, &c);
        }
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
        self.push_chain(hdrs, n, |i, h| {
            opcode::SendMsg::new(types::Fd(fd), h).flags(flags as u32).build().user_data(i as u64)
        })?;
        let failed = self.complete(n, Chain::Plain);
        self.outcome(hdrs, n, failed)
    }

    /// Submits the `n` entries just pushed and reads completions until every one of them has
    /// posted its (first) completion, into `results` (and `more`); returns the first error of
    /// `io_uring_enter` met on the way, if any.
    ///
    /// An error of `io_uring_enter` does not end the wait: entries the kernel took point at
    /// the caller's headers and payloads, and returning would hand those back while the
    /// kernel may still read them. Entries it has not taken sit in the submission queue, and
    /// the next enter (anyone's) would submit them. So the wait goes on, entering again and
    /// backing off (50 us, doubling to [`ENTER_BACKOFF_MAX`]); only after [`ENTER_GIVE_UP`] of
    /// failures without a completion does it give up:
    /// - every entry the kernel took has completed, only entries it never took are left: the
    ///   ring is marked broken and never entered again (those entries are never submitted);
    ///   the send reports what went and the error, and later sends use system calls;
    /// - an entry is still in the kernel, on a ring that cannot be entered: no return is
    ///   safe (the caller would free or reuse what the kernel may still read, and nothing
    ///   here can keep the caller's buffers), so the process aborts, saying why.
    fn complete(&mut self, n: usize, chain: Chain) -> Option<io::Error> {
        self.results[..n].fill(-libc::ECANCELED);
        self.more[..n].fill(false);
        let (mut done, mut first, mut failed) = (0, true, None::<io::Error>);
        // Since when enters have failed with no completion, and the next pause.
        let (mut failing_since, mut backoff) = (None::<std::time::Instant>, std::time::Duration::from_micros(50));
        while done < n {
            // A zerocopy entry's notification is a completion too: wait for one at a time.
            let want = if let Chain::Zc { .. } = chain { 1 } else { n - done };
            if let Err(e) = self.enter(&mut first, want) {
                if failed.is_none() {
                    log::warn!("udpx: io_uring_enter failed during a send ({e}); waiting for its entries");
                }
                failed.get_or_insert(e);
                failing_since.get_or_insert_with(std::time::Instant::now);
            }
            let before = done;
            for cqe in self.ring.completion() {
                let Some((ud, res, more)) = sort(&mut self.notifs, &mut self.failed_ids, &cqe) else { continue };
                let i = match chain {
                    Chain::Plain => ud as usize,
                    Chain::Zc { first_id } if ud & ZC_TAG != 0 => (ud as u32).wrapping_sub(first_id) as usize,
                    Chain::Zc { .. } => continue,
                };
                if i < n {
                    self.results[i] = res;
                    self.more[i] = more;
                } else if let Chain::Zc { .. } = chain {
                    continue;
                }
                done += 1;
            }
            if done > before {
                failing_since = None;
                backoff = std::time::Duration::from_micros(50);
            } else if failing_since.is_some_and(|s| s.elapsed() < ENTER_GIVE_UP) {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(ENTER_BACKOFF_MAX);
            } else if failing_since.is_some() {
                // Entries never taken stay in the queue; the rest were taken by the kernel.
                let queued = self.ring.submission().len();
                let in_kernel = n.saturating_sub(done + queued);
                if in_kernel > 0 {
                    log::error!(
                        "udpx: io_uring_enter keeps failing ({}) with {in_kernel} send entries in the kernel, which \
                         may still read the caller's buffers: aborting rather than handing them back",
                        failed.as_ref().map_or_else(String::new, ToString::to_string)
                    );
                    std::process::abort();
                }
                log::error!(
                    "udpx: io_uring_enter keeps failing ({}); the send ring is given up, {queued} entries never \
                     submitted; sends go by system calls",
                    failed.as_ref().map_or_else(String::new, ToString::to_string)
                );
                self.broken = true;
                break;
            }
        }
        #[cfg(feature = "fault-injection")]
        {
            self.enter_fault = None;
        }
        failed
    }

    /// What a send reports once [`Ring::complete`] is done: the first `k >= 1` entries that
    /// went (an error of `io_uring_enter` on the way is then lost, as `sendmmsg` loses an
    /// error after a message went); when none did, the first entry's own error, or the
    /// enter's when it was never sent.
    fn outcome(&self, hdrs: &mut [libc::mmsghdr], n: usize, failed: Option<io::Error>) -> io::Result<usize> {
        match (self.first_sent(hdrs, n), failed) {
            (Err(_), Some(e)) if self.results[0] == -libc::ECANCELED => Err(e),
            (res, _) => res,
        }
    }

    /// One `io_uring_enter` for a batch: the first (`*first`) only submits, without waiting
    /// for completions (`IORING_ENTER_GETEVENTS` unset): a non-blocking send completes while
    /// it is issued, and its completion, like those of the entries linked after it (issued
    /// as task work before the call returns to user space), is in the queue when the call
    /// returns, so the usual batch costs no wait. Later calls wait for `want` completions
    /// (a blocking socket's entry waits in the kernel for room). EINTR is not an error.
    fn enter(&mut self, first: &mut bool, want: usize) -> io::Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some(f) = self.enter_fault.as_mut() {
            if std::mem::take(first) && f.after_submit {
                self.ring.submit()?;
            }
            let errno = f.errno;
            f.times -= 1;
            if f.times == 0 {
                self.enter_fault = None;
            }
            return Err(io::Error::from_raw_os_error(errno));
        }
        let r = if std::mem::take(first) { self.ring.submit() } else { self.ring.submit_and_wait(want) };
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Queues `hdrs[..n]` as one chain of linked entries, entry `i` made by `make(i, header)`.
    fn push_chain(
        &mut self,
        hdrs: &[libc::mmsghdr],
        n: usize,
        make: impl Fn(usize, &libc::msghdr) -> squeue::Entry,
    ) -> io::Result<()> {
        let mut sq = self.ring.submission();
        for (i, h) in hdrs.iter().enumerate().take(n) {
            let mut e = make(i, &h.msg_hdr);
            if i + 1 < n {
                e = e.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: the entry points at hdrs[i].msg_hdr, whose name, iovec and control
            // pointers target buffers the caller keeps alive and unmoved for the call; both
            // callers wait for every entry's (first) completion before returning, also when
            // io_uring_enter fails (`complete`: an entry the kernel took is waited for or the
            // process aborts; one it never took is never submitted: the ring is not entered
            // again), after which the kernel reads no header (a SENDMSG_ZC payload is read
            // until its notification: the socket's zerocopy tracker owns that buffer until
            // then). The queue has `entries` >= n free slots: every earlier call drained all
            // its completions, and a ring given up on is never pushed to again.
            unsafe { sq.push(&e) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        Ok(())
    }

    /// `Ok(k)`: the first `k >= 1` entries went (their `msg_len` set); the first one's error
    /// when none did.
    fn first_sent(&self, hdrs: &mut [libc::mmsghdr], n: usize) -> io::Result<usize> {
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

    /// Sends `hdrs[..n]` as linked `IORING_OP_SENDMSG_ZC` entries, entry `i` with zerocopy id
    /// `first_id + i`, and waits for their first completions (not their notifications: see
    /// [`Ring::take_notifs`]). The count as [`Ring::sendmsgs`]; `batch` says whether the
    /// first entry that failed took an id.
    pub(crate) fn sendmsgs_zc(
        &mut self,
        fd: RawFd,
        hdrs: &mut [libc::mmsghdr],
        n: usize,
        flags: libc::c_int,
        first_id: u32,
        batch: &mut ZcBatch,
    ) -> io::Result<usize> {
        *batch = ZcBatch::default();
        let n = n.min(hdrs.len()).min(self.results.len());
        if n == 0 {
            return Ok(0);
        }
        self.push_chain(hdrs, n, |i, h| {
            opcode::SendMsgZc::new(types::Fd(fd), h)
                .flags(flags as u32)
                .ioprio(SEND_ZC_REPORT_USAGE)
                .build()
                .user_data(ZC_TAG | u64::from(first_id.wrapping_add(i as u32)))
        })?;
        let failed = self.complete(n, Chain::Zc { first_id });
        let res = self.outcome(hdrs, n, failed);
        let k = *res.as_ref().unwrap_or(&0);
        batch.sent = k;
        if k < n && self.more[k] {
            batch.failed_took_id = true;
            let id = first_id.wrapping_add(k as u32);
            // Its notification may have come in the same read as its result.
            match self.notifs.iter_mut().find(|x| x.id == id) {
                Some(x) => x.failed = true,
                None => self.failed_ids.push(id),
            }
        }
        res
    }
}

/// Failures of `io_uring_enter` a test asks for ([`super::fault::Fault::UringEnter`]).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct EnterFault {
    /// The errno each failing call returns.
    pub errno: i32,
    /// The first failing call submits the entries first.
    pub after_submit: bool,
    /// Calls that fail, 1 at least.
    pub times: u32,
}

/// How the entries of a send are told apart in their completions' user data.
#[derive(Debug, Clone, Copy)]
enum Chain {
    /// Entry `i`'s user data is `i`.
    Plain,
    /// Entry `i`'s user data is [`ZC_TAG`] and zerocopy id `first_id + i`.
    Zc { first_id: u32 },
}

/// Sorts one completion: a zerocopy notification is kept in `notifs` (marked failed when its
/// id is in `failed_ids`); anything else is returned as (user data, result, `F_MORE`).
fn sort(notifs: &mut Vec<Notif>, failed_ids: &mut Vec<u32>, cqe: &cqueue::Entry) -> Option<(u64, i32, bool)> {
    let ud = cqe.user_data();
    if ud & ZC_TAG != 0 && cqueue::notif(cqe.flags()) {
        let id = ud as u32;
        let failed = match failed_ids.iter().position(|&f| f == id) {
            Some(i) => {
                failed_ids.swap_remove(i);
                true
            }
            None => false,
        };
        notifs.push(Notif { id, copied: cqe.result() as u32 & NOTIF_USAGE_ZC_COPIED != 0, failed });
        return None;
    }
    Some((ud, cqe.result(), cqueue::more(cqe.flags())))
}

/// Whether io_uring here has `IORING_OP_SENDMSG_ZC` (probed once).
pub(crate) fn zerocopy_available() -> bool {
    static ZC: OnceLock<bool> = OnceLock::new();
    *ZC.get_or_init(|| Ring::new(2).is_ok_and(|r| r.has_zerocopy()))
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

/// Page-aligned memory the kernel reads and writes behind our back (a buffer ring and its
/// buffers): allocated once, freed on drop, never moved.
struct PageMem {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl PageMem {
    fn new(len: usize) -> io::Result<PageMem> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "buffer size overflows"))?;
        // SAFETY: the layout has a non-zero size (len.max(1)).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "io_uring receive buffers"));
        }
        Ok(PageMem { ptr, layout })
    }
}

impl PageMem {
    /// Gives the memory up without freeing it (the kernel may still use it).
    fn leak(&mut self) {
        self.ptr = std::ptr::null_mut();
    }
}

impl Drop for PageMem {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return; // leaked on purpose
        }
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// The user data of the multishot receive (and of its cancellation).
pub(crate) const RECV_ARM: u64 = 1;
const RECV_CANCEL: u64 = 2;
/// The buffer group of a receive ring.
const BGID: u16 = 7;

/// What one completion of the multishot receive brought.
pub(crate) enum RecvEvent<'a> {
    /// A datagram (or GRO buffer) in buffer `bid`: the decoded header and the payload.
    Datagram { raw: super::cmsg::RawRecv, payload: &'a [u8] },
    /// The buffer ring ran empty: the kernel dropped nothing yet, but the receive stopped
    /// (ENOBUFS); it is re-armed once buffers are back.
    NoBuffers,
    /// The receive ended with this error (errno), as `recvmsg` would have returned it (an ICMP
    /// error pending on the socket, say); it is re-armed at the next reap.
    Error(i32),
    /// The completion of another entry on the ring (a send of a [`super::uring_shard`]).
    Other { user_data: u64, result: i32 },
}

/// How a receive ring is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecvSetup {
    /// Reaped and armed from any thread (one at a time): `COOP_TASKRUN`.
    Shared,
    /// Used by the thread that made it, and only by it, with room for `extra` more entries
    /// in flight beside the receive: `SINGLE_ISSUER | DEFER_TASKRUN` (6.1), so the kernel
    /// posts the receive's completions only when that thread enters to collect them (no
    /// wake-up per datagram, none of the work on another thread's account); `COOP_TASKRUN`
    /// where the kernel lacks it. The socket is registered as a fixed file.
    OneThread { extra: u32 },
}

/// A multishot `IORING_OP_RECVMSG` over a ring of provided buffers, on one socket.
///
/// ```text
///  buffer ring (page-aligned): [entry 0: addr, len, bid][entry 1]…   tail (u16) in entry 0's resv
///  each buffer:  io_uring_recvmsg_out (16 B) | name (128 B) | control (CMSG_CAP) | payload
///  one RECVMSG SQE (MULTISHOT, BUFFER_SELECT) → a CQE per datagram with the buffer id;
///  a CQE without IORING_CQE_F_MORE ends it (re-armed); -ENOBUFS: the ring ran empty
/// ```
pub(crate) struct RecvRing {
    ring: IoUring,
    entries: PageMem,
    bufs: PageMem,
    count: u16,
    /// Distance between buffers.
    size: usize,
    /// Bytes of each buffer the kernel may fill.
    len: usize,
    tail: u16,
    /// The template of every receive (a `msghdr`: name and control lengths only), in memory of
    /// its own: the kernel reads it for as long as the multishot request lives.
    msghdr: PageMem,
    armed: bool,
    fd: RawFd,
    /// Buffers handed to the caller in the current `reap` and not yet returned.
    pending: Vec<u16>,
    /// The completions of the current reap (collected first: the queue borrows the ring).
    cqes: Vec<(u64, i32, u32)>,
    /// Receive completions collected and not yet delivered (past a reap's `max`): their
    /// buffers stay off the ring until they are.
    backlog: std::collections::VecDeque<(u64, i32, u32)>,
    /// Completions are posted only when this thread enters with GETEVENTS (DEFER_TASKRUN).
    deferred: bool,
    /// The socket is the ring's fixed file 0.
    fixed: bool,
    /// Completions the entries pushed since the last enter will post at once (sends that
    /// complete inline): a wait asks for one more than these.
    pub(crate) expect: u32,
}

// SAFETY: the raw pointers point into memory this struct owns (PageMem) and into the boxed
// msghdr; nothing is shared with another thread, and the kernel's use of them ends when the
// ring is torn down in Drop. Moving the owner to another thread moves all of it.
unsafe impl Send for RecvRing {}

impl std::fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing").field("count", &self.count).field("size", &self.size).finish()
    }
}

/// Bytes of name space each buffer reserves (a `sockaddr_storage`).
const NAME_LEN: usize = std::mem::size_of::<libc::sockaddr_storage>();
/// Header the kernel writes before the name (`struct io_uring_recvmsg_out`).
const OUT_LEN: usize = 16;

impl RecvRing {
    /// A ring of `count` buffers (a power of two, at most 32768) with room for `payload`
    /// bytes of datagram each, receiving on `fd`, set up as `setup` says.
    pub(crate) fn with_setup(fd: RawFd, count: u16, payload: usize, setup: RecvSetup) -> io::Result<RecvRing> {
        if !count.is_power_of_two() || count > 32768 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "buffer count: a power of two up to 32768"));
        }
        let ctrl = super::cmsg::CMSG_CAP;
        // Each buffer exactly this long (a longer datagram is cut here, as recvmsg cuts at
        // the iovec), placed 64-byte aligned so the control data inside stays 8-aligned.
        let len = OUT_LEN + NAME_LEN + ctrl + payload;
        let size = len.next_multiple_of(64);
        // A completion per datagram: a completion queue that cannot overflow before the ring's
        // buffers are all used (an overflow ends a multishot receive).
        let extra = match setup {
            RecvSetup::Shared => 0,
            RecvSetup::OneThread { extra } => extra,
        };
        let cq = (2 * (u32::from(count) + extra)).max(64);
        let sq = (extra + 8).next_power_of_two();
        // COOP_TASKRUN (5.19): a datagram's completion is posted by the arming thread at its
        // next kernel entry or exit (a sleeping one is woken), not by interrupting it with an
        // IPI per datagram: on a VM the IPIs made a busy QUIC transfer cost twice the CPU.
        let coop = || match IoUring::builder().setup_cqsize(cq).setup_coop_taskrun().build(sq) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder().setup_cqsize(cq).build(sq),
            r => r,
        };
        let (ring, deferred) = match setup {
            RecvSetup::Shared => (coop()?, false),
            // TASKRUN_FLAG: the kernel says in the submission queue's flags when completions
            // wait to be posted, so a reap that does not wait enters only then.
            RecvSetup::OneThread { .. } => match IoUring::builder()
                .setup_cqsize(cq)
                .setup_single_issuer()
                .setup_defer_taskrun()
                .setup_taskrun_flag()
                .build(sq)
            {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (coop()?, false),
                r => (r?, true),
            },
        };
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::RecvMsgMulti::CODE) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "IORING_OP_RECVMSG not supported"));
        }
        let entries = PageMem::new(usize::from(count) * std::mem::size_of::<types::BufRingEntry>())?;
        let bufs = PageMem::new(usize::from(count) * size)?;
        let msghdr = PageMem::new(std::mem::size_of::<libc::msghdr>())?;
        {
            // SAFETY: page-aligned, zeroed memory of a msghdr's size, owned here: all-zero is
            // a valid msghdr; only the two lengths matter to a multishot receive (the kernel
            // lays name and control out in each buffer by them).
            let h = unsafe { &mut *(msghdr.ptr as *mut libc::msghdr) };
            h.msg_namelen = NAME_LEN as libc::socklen_t;
            h.msg_controllen = ctrl as _;
        }
        let mut r = RecvRing {
            ring,
            entries,
            bufs,
            count,
            size,
            len,
            tail: 0,
            msghdr,
            armed: false,
            fd,
            pending: Vec::with_capacity(usize::from(count)),
            cqes: Vec::with_capacity(usize::from(count)),
            backlog: std::collections::VecDeque::new(),
            deferred,
            fixed: false,
            expect: 0,
        };
        if let RecvSetup::OneThread { .. } = setup {
            // No file lookup per entry; best effort (the raw fd works as well).
            r.fixed = r.ring.submitter().register_files(&[fd]).is_ok();
        }
        // SAFETY: `entries` is page-aligned memory for `count` entries, owned by `r` and kept
        // until Drop, which unregisters the group before freeing it.
        unsafe { r.ring.submitter().register_buf_ring_with_flags(r.entries.ptr as u64, count, BGID, 0)? };
        for bid in 0..count {
            r.give(bid);
        }
        r.publish();
        Ok(r)
    }

    /// Puts buffer `bid` at the ring's tail (visible to the kernel at the next publish).
    fn give(&mut self, bid: u16) {
        let mask = self.count - 1;
        let slot = usize::from(self.tail & mask);
        // SAFETY: slot < count entries of the ring memory; the kernel reads entries only up to
        // the published tail, and this one is past it until `publish`.
        let e = (self.entries.ptr as *mut types::BufRingEntry).wrapping_add(slot);
        // SAFETY: as above: `e` is entry `slot` of our live ring memory, not yet published.
        let e = unsafe { &mut *e };
        // The buffer's address: inside `bufs` (bid < count).
        e.set_addr(self.bufs.ptr.wrapping_add(usize::from(bid) * self.size) as u64);
        e.set_len(self.len as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the given buffers visible to the kernel (release store of the tail).
    fn publish(&mut self) {
        // SAFETY: the entries memory is the ring's base; its first entry is initialized.
        let tail = unsafe { types::BufRingEntry::tail(self.entries.ptr as *const types::BufRingEntry) };
        // SAFETY: the tail is a u16 inside our live, aligned ring memory that the kernel only
        // reads; an atomic store orders the entries written before it.
        let tail = unsafe { std::sync::atomic::AtomicU16::from_ptr(tail as *mut u16) };
        tail.store(self.tail, std::sync::atomic::Ordering::Release);
    }

    /// Whether the multishot receive is in force (it ends on errors and ENOBUFS).
    pub(crate) fn is_armed(&self) -> bool {
        self.armed
    }

    /// The receive template.
    fn msghdr(&self) -> &libc::msghdr {
        // SAFETY: initialized in `new`, never written afterwards, alive as long as self.
        unsafe { &*(self.msghdr.ptr as *const libc::msghdr) }
    }

    /// Queues the receive (submitted by the reap's enter).
    fn arm(&mut self) -> io::Result<()> {
        let e = if self.fixed {
            opcode::RecvMsgMulti::new(types::Fixed(0), self.msghdr(), BGID).build()
        } else {
            opcode::RecvMsgMulti::new(types::Fd(self.fd), self.msghdr(), BGID).build()
        };
        // SAFETY: the entry points at the msghdr memory, which lives until Drop, where the
        // request is cancelled and waited for before anything is freed. The queue has room:
        // at most one receive and one cancel are ever outstanding beside `extra` other entries
        // in a queue of at least `extra + 8`.
        unsafe { self.ring.submission().push(&e.user_data(RECV_ARM)) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.armed = true;
        Ok(())
    }

    /// The ring, for a [`super::uring_shard::ShardRing`] to push its own entries on.
    pub(crate) fn ring_mut(&mut self) -> &mut IoUring {
        &mut self.ring
    }

    /// The socket as an entry's target: the fixed file where registered.
    pub(crate) fn uses_fixed_file(&self) -> bool {
        self.fixed
    }

    /// The receive's last completion was read elsewhere (a shard's Drop).
    pub(crate) fn mark_ended(&mut self) {
        self.armed = false;
    }

    /// Whether completions wait for this thread's next enter (DEFER_TASKRUN).
    pub(crate) fn is_deferred(&self) -> bool {
        self.deferred
    }

    /// An eventfd the kernel signals for every completion this ring posts, for an event loop
    /// to wait on (its counter says nothing more: reap to see what came). Read it before
    /// reaping, so a completion posted after the reap signals it again.
    pub(crate) fn register_eventfd(&mut self) -> io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: eventfd(2) takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by no one else.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        self.ring.submitter().register_eventfd(owned.as_raw_fd())?;
        Ok(owned)
    }

    /// Hands back the buffers of the last reap and makes sure the receive is armed; then, with
    /// `wait`, waits at most that long for a completion; then calls `f` for every completion
    /// but datagrams past the first `max` (those wait, their buffers held, in a backlog
    /// delivered first next time). Returns how many it handled.
    pub(crate) fn reap(
        &mut self,
        wait: Option<std::time::Duration>,
        max: usize,
        mut f: impl FnMut(RecvEvent<'_>),
    ) -> io::Result<usize> {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            for &bid in &pending {
                self.give(bid);
            }
            self.pending = pending;
            self.pending.clear();
            self.publish();
        }
        // Armed again only with a buffer on the ring: with every buffer held in the backlog it
        // would end at once (ENOBUFS), again at every reap.
        if !self.armed && self.backlog.len() < usize::from(self.count) {
            self.arm()?;
        }
        let ready = (max > 0 && !self.backlog.is_empty()) || !self.ring.completion().is_empty();
        let (queued, overflow, taskrun) = {
            let sq = self.ring.submission();
            (sq.len(), sq.cq_overflow(), sq.taskrun())
        };
        match wait.filter(|_| !ready) {
            Some(limit) => {
                // io_uring_enter(GETEVENTS) with a timeout (IORING_ENTER_EXT_ARG, Linux 5.11):
                // ETIME when it runs out. It submits what is queued in the same call, and
                // waits for one completion more than those entries post at once.
                let ts = types::Timespec::from(limit);
                let args = types::SubmitArgs::new().timespec(&ts);
                match self.ring.submitter().submit_with_args(1 + self.expect as usize, &args) {
                    Ok(_) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::ETIME)) => {}
                    Err(e) => return Err(e),
                }
                self.expect = 0;
            }
            // Entries to submit; completions the kernel kept when the queue was full
            // (entering flushes them); or, deferred, completions waiting to be posted
            // (TASKRUN_FLAG says so: the submit then carries GETEVENTS).
            None if queued > 0 || overflow || taskrun => {
                match self.ring.submit() {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    Err(e) => return Err(e),
                }
                self.expect = 0;
            }
            None => {}
        }
        let mut n = 0;
        // Collected first: the completion queue borrows the ring. Datagrams past `max` wait in
        // the backlog, their buffers still ours; everything else goes out now.
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        cqes.extend(self.backlog.drain(..));
        let old = cqes.len();
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
        let mut delivered = 0;
        for (k, &(ud, res, flags)) in cqes.iter().enumerate() {
            if ud != RECV_ARM {
                if ud != RECV_CANCEL && k >= old {
                    f(RecvEvent::Other { user_data: ud, result: res });
                }
                continue;
            }
            if k >= old && !io_uring::cqueue::more(flags) {
                self.armed = false; // ended (error, or the kernel's choice): re-armed next time
            }
            // Only datagrams wait (holding their buffers); the ends of a receive go out now.
            if res >= 0 {
                if delivered >= max {
                    self.backlog.push_back((ud, res, flags));
                    continue;
                }
                delivered += 1;
            }
            n += 1;
            match res {
                r if r == -libc::ENOBUFS => {
                    f(RecvEvent::NoBuffers);
                    continue;
                }
                // Cancelled (the thread that armed it exited, say): armed again next time.
                r if r == -libc::ECANCELED => continue,
                r if r < 0 => {
                    f(RecvEvent::Error(-r));
                    continue;
                }
                _ => {}
            }
            let Some(bid) = io_uring::cqueue::buffer_select(flags) else { continue };
            if bid >= self.count {
                continue;
            }
            self.pending.push(bid);
            // SAFETY: buffer `bid` lies inside `bufs`; the kernel wrote `res` bytes into it and
            // handed it to us (it is off the ring until `give`), so nothing writes it while
            // this shared view lives (until the next reap).
            let start = self.bufs.ptr.wrapping_add(usize::from(bid) * self.size);
            // SAFETY: see above; `start` is buffer `bid` of `bufs`, at least `len` bytes long.
            let buf = unsafe { std::slice::from_raw_parts(start, (res as usize).min(self.len)) };
            let Ok(out) = types::RecvMsgOut::parse(buf, self.msghdr()) else { continue };
            let mut raw = super::cmsg::RawRecv {
                len: out.payload_data().len(),
                flags: out.flags() as i32
                    | if out.is_payload_truncated() { libc::MSG_TRUNC } else { 0 }
                    | if out.is_control_data_truncated() { libc::MSG_CTRUNC } else { 0 },
                ..Default::default()
            };
            let name = out.name_data();
            if !name.is_empty() && name.len() <= NAME_LEN {
                // SAFETY: all-zero is a valid sockaddr_storage.
                let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
                // SAFETY: `name.len()` <= size_of(sockaddr_storage) bytes into it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        name.as_ptr(),
                        (&mut storage as *mut libc::sockaddr_storage).cast(),
                        name.len(),
                    )
                };
                raw.addr = super::addr::read(&storage, name.len() as libc::socklen_t);
            }
            let ctrl = out.control_data();
            if !ctrl.is_empty() {
                // SAFETY: an all-zero msghdr is valid; it describes the control bytes inside
                // the buffer (8-byte aligned: 64-byte aligned buffers, 16 + 128 bytes before).
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_control = ctrl.as_ptr() as *mut libc::c_void;
                h.msg_controllen = ctrl.len() as _;
                super::cmsg::decode_control(&h, &mut raw);
            }
            f(RecvEvent::Datagram { raw, payload: out.payload_data() });
        }
        self.cqes = cqes;
        Ok(n)
    }
}

impl Drop for RecvRing {
    fn drop(&mut self) {
        // The kernel may still write into the buffers while the multishot request lives:
        // cancel it and wait for its last completion before the memory goes.
        if self.armed {
            let e = opcode::AsyncCancel::new(RECV_ARM).build().user_data(RECV_CANCEL);
            // SAFETY: a cancel entry carries no pointers.
            let pushed = unsafe { self.ring.submission().push(&e) }.is_ok();
            let mut ended = !pushed;
            for _ in 0..100 {
                if ended || self.ring.submit_and_wait(1).is_err() {
                    break;
                }
                for c in self.ring.completion() {
                    if c.user_data() == RECV_ARM && !io_uring::cqueue::more(c.flags()) {
                        ended = true;
                    }
                }
            }
            if !ended {
                // Never free memory the kernel may still write: leak it.
                log::warn!("udpx: an io_uring receive did not end on cancel; its buffers are leaked");
                self.bufs.leak();
                self.entries.leak();
                self.msghdr.leak();
                return;
            }
        }
        let _ = self.ring.submitter().unregister_buf_ring(BGID);
    }
}
