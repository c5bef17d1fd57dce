//! Typed errors: each says what went wrong and what to change.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use crate::caps::Feature;

/// Why a socket could not be created or configured.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed; `op` names it (e.g. `"bind 0.0.0.0:4433"`).
    Io {
        /// What was being done.
        op: String,
        /// The kernel's error, errno kept.
        source: io::Error,
    },
    /// A feature was asked for with [`Want::Required`](crate::Want::Required) and this kernel
    /// or socket does not have it.
    Unsupported {
        /// The feature.
        feature: Feature,
        /// What the kernel said.
        why: String,
    },
    /// A receive buffer is smaller than a GRO super-buffer can be.
    RecvBufferTooSmall {
        /// The buffer's length.
        len: usize,
        /// The length needed.
        need: usize,
    },
    /// The configuration is inconsistent; the message says how.
    Config(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { op, source } => write!(f, "{op}: {source}"),
            Error::Unsupported { feature, why } => write!(
                f,
                "{feature} is required but not available here ({why}); ask for it as \
                 Want::IfAvailable to run without it"
            ),
            Error::RecvBufferTooSmall { len, need } => write!(
                f,
                "receive buffer of {len} bytes is too small for UDP GRO, which can coalesce up \
                 to {need} bytes: give buffers of at least {need} bytes or turn GRO off"
            ),
            Error::Config(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io { source, .. } => source,
            Error::Unsupported { .. } => io::Error::new(io::ErrorKind::Unsupported, e),
            other => io::Error::new(io::ErrorKind::InvalidInput, other),
        }
    }
}

/// A transmit that cannot be sent as given; nothing of the call was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidTransmit {
    /// `segment_size` was `Some(0)`.
    SegmentSizeZero,
    /// The segment size exceeds what one datagram may carry on this path.
    SegmentTooLarge {
        /// The segment size given.
        segment_size: usize,
        /// The largest allowed.
        max: usize,
        /// Where the limit comes from.
        limit: &'static str,
    },
    /// The contents exceed the largest UDP payload (65,507 B over IPv4, 65,527 B over IPv6).
    PayloadTooLarge {
        /// The length given.
        len: usize,
        /// The largest allowed.
        max: usize,
    },
    /// More segments than one GSO send may carry on this kernel.
    TooManySegments {
        /// Segments in the transmit.
        segments: usize,
        /// The probed maximum.
        max: usize,
    },
    /// The destination's family cannot be reached from this socket.
    WrongFamily {
        /// The destination.
        destination: SocketAddr,
        /// The socket's family.
        socket: &'static str,
    },
}

impl fmt::Display for InvalidTransmit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidTransmit::SegmentSizeZero => {
                f.write_str("segment size 0 is invalid: use None to send one datagram, or a size of at least 1")
            }
            InvalidTransmit::SegmentTooLarge { segment_size, max, limit } => write!(
                f,
                "segment size {segment_size} is larger than the {max} bytes allowed by {limit}: use a segment size of at most {max}"
            ),
            InvalidTransmit::PayloadTooLarge { len, max } => write!(
                f,
                "datagram of {len} bytes exceeds the UDP payload ceiling of {max} bytes: split it into smaller datagrams"
            ),
            InvalidTransmit::TooManySegments { segments, max } => write!(
                f,
                "{segments} segments in one transmit, but this kernel sends at most {max} per GSO call: split it (udpx::Batch does)"
            ),
            InvalidTransmit::WrongFamily { destination, socket } => write!(
                f,
                "destination {destination} cannot be reached from an {socket} socket: bind a socket of that family (or [::] for dual-stack)"
            ),
        }
    }
}

impl std::error::Error for InvalidTransmit {}

/// A send that stopped before every transmit went out.
///
/// `sent` transmits (from the start of the slice) went out whole, and `partial_segments`
/// segments of the next one (nonzero only when that transmit goes as several messages: GSO
/// off towards its destination, or more segments than one GSO call takes). Together they are
/// the [`SendError::cursor`] to resend from: never from a transmit's start once part of it
/// went. [`UdpSocket::send`](crate::UdpSocket::send) finishes a started transmit before it
/// reports `WouldBlock`, so there `partial_segments` is 0 for `WouldBlock`.
#[derive(Debug)]
pub struct SendError {
    /// Transmits sent whole before the stop.
    pub sent: usize,
    /// Segments of `transmits[sent]` already sent (0 unless it was split into plain datagrams).
    pub partial_segments: usize,
    /// Why it stopped.
    pub kind: SendErrorKind,
}

impl SendError {
    /// Where to resend from: the first transmit not sent whole and its segments already sent.
    pub fn cursor(&self) -> crate::SendCursor {
        crate::SendCursor { transmit: self.sent, segment: self.partial_segments }
    }
}

/// Why a send stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendErrorKind {
    /// The socket is non-blocking and its send buffer is full: wait for writability, resend
    /// the rest from [`SendError::cursor`].
    WouldBlock,
    /// ENOBUFS: the device queue or the qdisc is full (reported by the kernel with
    /// IP_RECVERR). Back off, resend the rest from [`SendError::cursor`].
    NoBuffers,
    /// The transmit at index `index` is invalid; nothing of the call was sent.
    Invalid {
        /// Index of the offending transmit.
        index: usize,
        /// What is wrong with it.
        reason: InvalidTransmit,
    },
    /// `EMSGSIZE`: a datagram or segment is larger than the path allows.
    MessageTooLarge {
        /// Bytes in the message the kernel refused.
        len: usize,
        /// Its segment size, if it was a GSO send.
        segment_size: Option<usize>,
        /// The path MTU, where the socket knows it (connected sockets).
        path_mtu: Option<usize>,
    },
    /// Any other error from the kernel, after the retries udpx does (EINTR always; ENOBUFS
    /// with backoff).
    Io(io::Error),
}

impl SendError {
    /// True for [`SendErrorKind::WouldBlock`].
    pub fn is_would_block(&self) -> bool {
        matches!(self.kind, SendErrorKind::WouldBlock)
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            SendErrorKind::WouldBlock => {
                write!(f, "send would block after {} transmits", self.sent)
            }
            SendErrorKind::NoBuffers => write!(
                f,
                "the device queue or qdisc is full (ENOBUFS) after {} transmits: back off and resend the rest",
                self.sent
            ),
            SendErrorKind::Invalid { index, reason } => write!(f, "transmit {index}: {reason}"),
            SendErrorKind::MessageTooLarge { len, segment_size, path_mtu } => {
                write!(f, "message of {len} bytes")?;
                if let Some(s) = segment_size {
                    write!(f, " in segments of {s}")?;
                }
                write!(f, " is too large for the path")?;
                if let Some(m) = path_mtu {
                    write!(
                        f,
                        " (path MTU {m}: payloads of at most {} bytes over IPv4, {} over IPv6)",
                        m.saturating_sub(28),
                        m.saturating_sub(48)
                    )?;
                }
                write!(f, " after {} transmits; send smaller datagrams or segments", self.sent)
            }
            SendErrorKind::Io(e) if self.partial_segments > 0 => write!(
                f,
                "send failed after {} transmits and {} segments of the next: {e}",
                self.sent, self.partial_segments
            ),
            SendErrorKind::Io(e) => write!(f, "send failed after {} transmits: {e}", self.sent),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            SendErrorKind::Io(e) => Some(e),
            SendErrorKind::Invalid { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

impl From<SendError> for io::Error {
    fn from(e: SendError) -> io::Error {
        match e.kind {
            SendErrorKind::WouldBlock => io::ErrorKind::WouldBlock.into(),
            SendErrorKind::NoBuffers => io::Error::from_raw_os_error(libc::ENOBUFS),
            SendErrorKind::Io(inner) => inner,
            _ => io::Error::new(io::ErrorKind::InvalidInput, e),
        }
    }
}
