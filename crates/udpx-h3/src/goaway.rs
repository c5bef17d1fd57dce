//! The graceful stop's HTTP/3 part (RFC 9114 5.2): two GOAWAY frames per connection. The
//! first, sent when the server starts draining, carries the largest client stream ID there can
//! be: it says "no new connection work" without refusing the requests already in flight. About
//! two round trips later the second carries the ID after the last request the server saw;
//! requests on streams at or above it are refused with H3_REQUEST_REJECTED (the client may
//! send them again on a new connection), every response under way finishes, and the connection
//! is closed with H3_NO_ERROR when the last one has. quiche only sends the frames; the rest
//! is here and in the responder.

use std::time::{Duration, Instant};

/// H3_REQUEST_REJECTED (RFC 9114 8.1): the request was not processed; safe to send again.
pub(crate) const H3_REQUEST_REJECTED: u64 = 0x10b;

/// The largest client-initiated bidirectional stream ID (2^62 - 4): the first GOAWAY's.
const LAST_POSSIBLE_REQUEST: u64 = (1 << 62) - 4;

/// Least and most time between the two GOAWAY frames (two round trips, within these).
const BETWEEN: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Where a connection is in the two-step GOAWAY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum GoAway {
    /// Not draining.
    #[default]
    None,
    /// The first frame went; the second is due then.
    Announced(Instant),
    /// The second went with this ID: requests at or above it are refused.
    Final(u64),
}

impl GoAway {
    /// Sends the next frame when it is due. `last_request`: the highest request stream ID
    /// seen.
    pub(crate) fn step(
        &mut self,
        h3: &mut quiche::h3::Connection,
        conn: &mut udpx_quic::Connection,
        last_request: Option<u64>,
        now: Instant,
    ) {
        // A frame quiche refuses now (its control stream full) goes on a later turn.
        let sent = match *self {
            GoAway::None => h3.send_goaway(conn, LAST_POSSIBLE_REQUEST).is_ok().then(|| {
                let rtt = conn.path_stats().find(|p| p.active).map_or(BETWEEN.0, |p| p.rtt);
                GoAway::Announced(now + (2 * rtt).clamp(BETWEEN.0, BETWEEN.1))
            }),
            GoAway::Announced(at) if at <= now + udpx_quic::PACING_SLACK => {
                let id = last_request.map_or(0, |s| s + 4);
                h3.send_goaway(conn, id).is_ok().then_some(GoAway::Final(id))
            }
            _ => None,
        };
        if let Some(next) = sent {
            *self = next;
        }
    }

    /// Whether a request on stream `sid` is refused.
    pub(crate) fn rejects(self, sid: u64) -> bool {
        matches!(self, GoAway::Final(id) if sid >= id)
    }

    /// Whether the connection may close once no response is under way.
    pub(crate) fn done(self) -> bool {
        matches!(self, GoAway::Final(_))
    }

    /// When the connection wants its next turn for the GOAWAY.
    pub(crate) fn due(self) -> Option<Instant> {
        match self {
            GoAway::Announced(at) => Some(at),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_at_or_past_the_final_id_are_refused() {
        assert!(!GoAway::None.rejects(0));
        assert!(!GoAway::Announced(Instant::now()).rejects(1 << 40));
        assert!(!GoAway::Final(8).rejects(4));
        assert!(GoAway::Final(8).rejects(8));
        assert!(GoAway::Final(8).rejects(12));
        assert!(GoAway::Final(8).done() && !GoAway::None.done());
        assert_eq!(LAST_POSSIBLE_REQUEST % 4, 0);
    }
}
