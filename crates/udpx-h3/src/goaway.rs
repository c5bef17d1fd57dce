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

/// Least and most time between the two GOAWAY frames (two round trips, within these), and
/// between two tries of a frame quiche refused.
const BETWEEN: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Where a connection is in the two-step GOAWAY.
///
/// quiche refuses a frame while the control stream has no credit or the connection no room
/// (its send capacity is the smaller of the congestion window and the connection's credit, so
/// a client that paused a download can hold it shut for as long as it likes). A refused frame
/// is tried again on the connection's later turns (a packet may have brought credit), and its
/// timer is set a round trip ahead, doubling with each refusal up to a second: a frame that
/// cannot go never leaves its due time in the past, which would make the loop turn without
/// waiting (a core spun for the whole drain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum GoAway {
    /// Not draining.
    #[default]
    None,
    /// The first frame was refused `tries` times; its timer is then.
    Refused { retry_at: Instant, tries: u32 },
    /// The first frame went; the second is due then (or was refused `tries` times, and is
    /// tried again then).
    Announced { at: Instant, tries: u32 },
    /// The second went with ID `id`: requests at or above it are refused. `mark`: the packets
    /// the connection had sent when quiche took the frame.
    Final { id: u64, mark: u64 },
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
        let rtt = conn.path_stats().find(|p| p.active).map_or(BETWEEN.0, |p| p.rtt);
        let mark = conn.stats().sent as u64;
        *self = self.next(now, rtt, |id| h3.send_goaway(conn, id).is_ok(), last_request, mark);
    }

    /// The state after a turn at `now` on a path of `rtt`: `send` tries to send a GOAWAY with
    /// an ID and says whether quiche took it; `mark`: the packets sent so far. Pure but for
    /// `send`, for the tests.
    fn next(
        self,
        now: Instant,
        rtt: Duration,
        mut send: impl FnMut(u64) -> bool,
        last_request: Option<u64>,
        mark: u64,
    ) -> GoAway {
        // The time after `tries` refusals: a round trip, doubled each time, within BETWEEN.
        let backoff = |tries: u32| now + rtt.saturating_mul(1 << tries.min(10)).clamp(BETWEEN.0, BETWEEN.1);
        match self {
            // The first frame: tried on every turn until it goes (a turn is a packet, which
            // may have brought credit, or the timer).
            GoAway::None | GoAway::Refused { .. } => {
                if send(LAST_POSSIBLE_REQUEST) {
                    GoAway::Announced { at: now + (2 * rtt).clamp(BETWEEN.0, BETWEEN.1), tries: 0 }
                } else {
                    let tries = if let GoAway::Refused { tries, .. } = self { tries + 1 } else { 0 };
                    GoAway::Refused { retry_at: backoff(tries), tries }
                }
            }
            GoAway::Announced { at, tries } if at <= now + udpx_quic::PACING_SLACK => {
                let id = last_request.map_or(0, |s| s + 4);
                if send(id) {
                    GoAway::Final { id, mark }
                } else {
                    GoAway::Announced { at: backoff(tries), tries: tries + 1 }
                }
            }
            other => other,
        }
    }

    /// Whether a request on stream `sid` is refused.
    pub(crate) fn rejects(self, sid: u64) -> bool {
        matches!(self, GoAway::Final { id, .. } if sid >= id)
    }

    /// Whether the connection may close once no response is under way, now that it has sent
    /// `sent()` packets (asked only then): the second frame went, and a packet left after quiche took it. A close
    /// in the turn that wrote the frame would lose it (a closing connection sends only its
    /// CONNECTION_CLOSE, no stream data), and the client would never learn which requests
    /// were not processed. The packet's acknowledgement brings the turn that closes.
    pub(crate) fn done(self, sent: impl FnOnce() -> u64) -> bool {
        matches!(self, GoAway::Final { mark, .. } if sent() > mark)
    }

    /// When the connection wants its next turn for the GOAWAY.
    pub(crate) fn due(self) -> Option<Instant> {
        match self {
            GoAway::Refused { retry_at: at, .. } | GoAway::Announced { at, .. } => Some(at),
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
        assert!(!GoAway::Announced { at: Instant::now(), tries: 0 }.rejects(1 << 40));
        let last = GoAway::Final { id: 8, mark: 5 };
        assert!(!last.rejects(4));
        assert!(last.rejects(8));
        assert!(last.rejects(12));
        assert!(!GoAway::None.done(|| 6));
        // Not in the turn that wrote the frame: only once a packet has left since.
        assert!(!last.done(|| 5) && last.done(|| 6));
        assert_eq!(LAST_POSSIBLE_REQUEST % 4, 0);
    }

    /// A frame quiche refuses is due again a round trip later, then two, four, ... up to a
    /// second, never now (the drain spin of the third review); one that goes moves on.
    #[test]
    fn a_refused_frame_is_due_again_later_never_now() {
        let t0 = Instant::now();
        let rtt = Duration::from_millis(20);
        let mut g = GoAway::None;
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..10 {
            g = g.next(now, rtt, |_| false, Some(8), 0);
            let due = g.due().expect("a refused frame has a timer");
            assert!(due > now + udpx_quic::PACING_SLACK, "due in the future: {g:?}");
            waits.push(due - now);
            now = due;
        }
        assert_eq!(waits[0], rtt);
        assert_eq!(waits[1], 2 * rtt);
        assert_eq!(*waits.last().unwrap(), BETWEEN.1, "at most a second: {waits:?}");
        // Credit came back: the first frame goes, the second is due two round trips on.
        g = g.next(now, rtt, |id| id == LAST_POSSIBLE_REQUEST, Some(8), 0);
        assert_eq!(g, GoAway::Announced { at: now + 2 * rtt, tries: 0 });
        // The second, refused while due, then taken.
        now += 2 * rtt;
        g = g.next(now, rtt, |_| false, Some(8), 0);
        assert_eq!(g, GoAway::Announced { at: now + rtt, tries: 1 });
        assert_eq!(
            g.next(now, rtt, |_| true, Some(8), 0),
            GoAway::Announced { at: now + rtt, tries: 1 },
            "not yet due"
        );
        now += rtt;
        assert_eq!(g.next(now, rtt, |_| true, Some(8), 7), GoAway::Final { id: 12, mark: 7 });
        // A tiny RTT still waits at least BETWEEN.0.
        let g = GoAway::None.next(t0, Duration::from_micros(50), |_| false, None, 0);
        assert_eq!(g.due(), Some(t0 + BETWEEN.0));
    }
}
