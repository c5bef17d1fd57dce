//! What the io_uring zerocopy path reports to the send loop (plain data, shared by
//! `mmsg.rs` and `uring.rs`).

/// A zerocopy notification: the kernel is done with the buffer of send `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Notif {
    /// The zerocopy id.
    pub id: u32,
    /// The kernel copied the data (say, local delivery).
    pub copied: bool,
    /// The send failed after taking the id: nothing went, so `copied` says nothing about
    /// the path.
    pub failed: bool,
}

/// What a zerocopy batch did besides the count `Ring::sendmsgs_zc` (`sys/uring.rs`) returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ZcBatch {
    /// Entries that went, in order from the first.
    pub sent: usize,
    /// The first entry that did not go still took an id (its notification follows).
    pub failed_took_id: bool,
}
