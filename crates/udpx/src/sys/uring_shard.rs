//! One ring for one socket and one thread: the multishot receive of [`super::uring::RecvRing`]
//! and sends from slots the ring owns, so that a server's replies go out in the same
//! `io_uring_enter` that waits for its next requests.
//!
//! ```text
//!  slots (allocated once, never moved): [msghdr | iovec | name | control]  [payload bytes]
//!  fill(i, message)  copies the payload into slot i and writes its header
//!  submit(i)         queues SENDMSG(slot i) with user data SEND_TAG | i (no link: replies
//!                    are independent, so one that fails does not cancel the next)
//!  the next reap's enter submits them; their completions come back as RecvEvent::Other
//! ```
//!
//! A slot is the kernel's from `submit` to its completion: it cannot be filled again before
//! (`fill` refuses), and the ring is not torn down before every such send has completed or been
//! cancelled (Drop); where that cannot be confirmed the slots are leaked, never freed.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types};

use super::addr::SockAddr;
use super::cmsg::CmsgBuf;
use super::mmsg::{fill_msg, OutMsg};
use super::uring::{RecvEvent, RecvRing, RecvSetup, RECV_ARM};

/// User data of a send: this bit and the slot.
pub(crate) const SEND_TAG: u64 = 1 << 62;
/// User data of a send's cancellation.
const SEND_CANCEL_TAG: u64 = 1 << 61;

/// One slot's header and the memory it points at (beside it, inside the same boxed slice).
struct Slot {
    hdr: libc::msghdr,
    iov: libc::iovec,
    name: SockAddr,
    ctrl: CmsgBuf,
}

/// Send slots: headers and payload bytes owned here, read by the kernel while in flight.
pub(crate) struct SendSlots {
    slots: Box<[Slot]>,
    data: Box<[u8]>,
    size: usize,
    in_flight: Box<[bool]>,
    /// Slots given to the kernel and not yet completed.
    busy: usize,
    /// Never free the memory (the kernel may still read it).
    leaked: bool,
}

impl SendSlots {
    fn new(count: u16, size: usize) -> SendSlots {
        let n = usize::from(count);
        let slots = (0..n)
            .map(|_| Slot {
                // SAFETY: all-zero is a valid msghdr and iovec (null pointers, zero lengths).
                hdr: unsafe { std::mem::zeroed() },
                // SAFETY: as above.
                iov: unsafe { std::mem::zeroed() },
                name: SockAddr::empty(),
                ctrl: CmsgBuf::default(),
            })
            .collect();
        SendSlots {
            slots,
            data: vec![0; n * size].into_boxed_slice(),
            size,
            in_flight: vec![false; n].into_boxed_slice(),
            busy: 0,
            leaked: false,
        }
    }

    /// Copies `m`'s payload into slot `i` and writes its header. Refused while the slot is
    /// the kernel's, or when the payload does not fit.
    pub(crate) fn fill(&mut self, i: u16, m: &OutMsg<'_>, v6_socket: bool) -> io::Result<()> {
        let i = usize::from(i);
        if i >= self.slots.len() || self.in_flight[i] {
            return Err(io::Error::other("udpx bug: filling a send slot the kernel owns"));
        }
        if m.payload.len() > self.size {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "payload larger than a send slot"));
        }
        let bytes = &mut self.data[i * self.size..][..m.payload.len()];
        bytes.copy_from_slice(m.payload);
        let s = &mut self.slots[i];
        fill_msg(&mut s.hdr, &mut s.iov, &mut s.name, &mut s.ctrl, &OutMsg { payload: bytes, ..*m }, v6_socket);
        Ok(())
    }

    fn complete(&mut self, i: usize) -> bool {
        if i < self.in_flight.len() && self.in_flight[i] {
            self.in_flight[i] = false;
            self.busy -= 1;
            return true;
        }
        false
    }
}

impl Drop for SendSlots {
    fn drop(&mut self) {
        if self.leaked {
            std::mem::forget(std::mem::take(&mut self.slots));
            std::mem::forget(std::mem::take(&mut self.data));
        }
    }
}

/// What one completion of a [`ShardRing`] was.
pub(crate) enum ShardEvent<'a> {
    /// A receive event, as [`RecvRing::reap`] gives it.
    Recv(RecvEvent<'a>),
    /// The send of slot `slot` completed: bytes sent, or `-errno`. The slot is free again.
    Sent { slot: u16, result: i32 },
}

/// A receive ring with send slots; see the module docs. Used by one thread only.
pub(crate) struct ShardRing {
    // Declared first: dropped (its receive cancelled) while the slots still exist; the
    // sends are cancelled in Drop before either goes.
    rx: RecvRing,
    slots: SendSlots,
    fd: RawFd,
}

impl std::fmt::Debug for ShardRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardRing").field("rx", &self.rx).field("busy", &self.slots.busy).finish()
    }
}

impl ShardRing {
    /// A ring receiving on `fd` into `buffers` buffers of `payload` bytes, with `slots` send
    /// slots of `slot_size` bytes each.
    pub(crate) fn new(fd: RawFd, buffers: u16, payload: usize, slots: u16, slot_size: usize) -> io::Result<ShardRing> {
        let rx = RecvRing::with_setup(fd, buffers, payload, RecvSetup::OneThread { extra: u32::from(slots) })?;
        Ok(ShardRing { rx, slots: SendSlots::new(slots, slot_size), fd })
    }

    /// Whether the kernel posts completions only at this thread's enters (DEFER_TASKRUN).
    pub(crate) fn is_deferred(&self) -> bool {
        self.rx.is_deferred()
    }

    /// The send slots (to fill them).
    pub(crate) fn slots(&mut self) -> &mut SendSlots {
        &mut self.slots
    }

    /// Whether the multishot receive is in force.
    pub(crate) fn is_armed(&self) -> bool {
        self.rx.is_armed()
    }

    /// Sends in the kernel, not yet completed.
    pub(crate) fn busy(&self) -> usize {
        self.slots.busy
    }

    /// The next wait is for any one completion, not one more than the sends just queued
    /// post at once.
    pub(crate) fn wait_for_any(&mut self) {
        self.rx.expect = 0;
    }

    /// Queues the send of filled slot `i` (`flags`: `sendmsg` flags); the next reap's enter
    /// submits it.
    pub(crate) fn submit(&mut self, i: u16, flags: libc::c_int) -> io::Result<()> {
        let k = usize::from(i);
        if k >= self.slots.slots.len() || self.slots.in_flight[k] {
            return Err(io::Error::other("udpx bug: submitting a send slot twice"));
        }
        let hdr: *const libc::msghdr = &self.slots.slots[k].hdr;
        let e = if self.rx.uses_fixed_file() {
            opcode::SendMsg::new(types::Fixed(0), hdr)
        } else {
            opcode::SendMsg::new(types::Fd(self.fd), hdr)
        };
        let e = e.flags(flags as u32).build().user_data(SEND_TAG | u64::from(i));
        // SAFETY: the entry points at slot k's header, which points at its iovec, name and
        // control buffer and at its payload bytes: all inside boxed slices owned by
        // `self.slots`, never moved or reallocated, and not written while the slot is in
        // flight (`fill` refuses); they are freed only after the send completed or was
        // cancelled (Drop), or never (leaked). The queue has room for every slot besides the
        // receive (RecvSetup::OneThread's `extra`).
        unsafe { self.rx.ring_mut().submission().push(&e) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.slots.in_flight[k] = true;
        self.slots.busy += 1;
        self.rx.expect += 1;
        Ok(())
    }

    /// Submits the queued sends and reaps, as [`RecvRing::reap`] (`max` bounds the receive
    /// completions delivered; send completions all come).
    pub(crate) fn reap(
        &mut self,
        wait: Option<std::time::Duration>,
        max: usize,
        mut f: impl FnMut(ShardEvent<'_>, &mut SendSlots),
    ) -> io::Result<usize> {
        let slots = &mut self.slots;
        self.rx.reap(wait, max, |ev| match ev {
            RecvEvent::Other { user_data, result } if user_data & SEND_TAG != 0 => {
                let slot = (user_data & 0xffff) as u16;
                if slots.complete(usize::from(slot)) {
                    f(ShardEvent::Sent { slot, result }, slots);
                }
            }
            RecvEvent::Other { .. } => {}
            ev => f(ShardEvent::Recv(ev), slots),
        })
    }
}

impl Drop for ShardRing {
    fn drop(&mut self) {
        if self.slots.busy == 0 {
            return;
        }
        // Sends still in flight (waiting for room in the socket): cancel them and wait for
        // their completions before the slots go.
        for k in 0..self.slots.in_flight.len() {
            if self.slots.in_flight[k] {
                let e = opcode::AsyncCancel::new(SEND_TAG | k as u64).build().user_data(SEND_CANCEL_TAG);
                // SAFETY: a cancel entry carries no pointers.
                if unsafe { self.rx.ring_mut().submission().push(&e) }.is_err() {
                    let _ = self.rx.ring_mut().submit();
                    // SAFETY: as above.
                    let _ = unsafe { self.rx.ring_mut().submission().push(&e) };
                }
            }
        }
        for _ in 0..100 {
            if self.slots.busy == 0 {
                break;
            }
            if self.rx.ring_mut().submit_and_wait(1).is_err() {
                break;
            }
            let done: Vec<(u64, u32)> = self.rx.ring_mut().completion().map(|c| (c.user_data(), c.flags())).collect();
            for (ud, flags) in done {
                if ud & SEND_TAG != 0 {
                    self.slots.complete((ud & 0xffff) as usize);
                } else if ud == RECV_ARM && !io_uring::cqueue::more(flags) {
                    // The receive ended meanwhile: its own Drop must not wait for that again.
                    self.rx.mark_ended();
                }
            }
        }
        if self.slots.busy > 0 {
            log::warn!("udpx: io_uring sends did not end on cancel; their slots are leaked");
            self.slots.leaked = true;
        }
    }
}
