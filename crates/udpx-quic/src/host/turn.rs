//! The loop: wait, receive, expire, serve, flush. A turn touches a connection only when a
//! datagram for it arrived, its deadline passed, or it is still sending (see the module docs
//! of [`crate::host`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cid::CID_LEN;
use crate::counters::HostCounters;
use crate::outbox::Flush;
use crate::table::Slot;
use crate::timers::Deadline;
use crate::Error;

use super::flush::{Decision, Wrote};
use super::gate::Now;
use crate::{App, Host};

/// Longest a loop sleeps in `poll` before it looks at its stop flag again.
const STOP_CHECK: Duration = Duration::from_millis(50);
/// Least time between two counter publications of a loop.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// Receive calls per turn at most, so that sending is never starved by a flood.
const RECV_CALLS_PER_TURN: usize = 16;
/// How much longer than the gathering ([`crate::HostConfig::coalesce`]) a datagram's kernel
/// receive time may lie before the turn's start and still be believed (a long turn before it).
const RX_WAIT_SLACK: Duration = Duration::from_millis(10);

/// When a datagram was received, on the monotonic clock: the kernel's receive time (`rx`,
/// wall clock, `SO_TIMESTAMPNS`) moved by the turn's start (`now`), which read both clocks.
/// Never after the turn's start (a datagram that came after it is taken as come at it), never
/// more than `bound` before it (a wall clock stepped meanwhile); the turn's start without one.
fn received_at(now: Now, rx: Option<Duration>, bound: Duration) -> Instant {
    let Some(rx) = rx else { return now.at };
    let wall = now.wall.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let waited = wall.saturating_sub(rx).min(bound);
    now.at.checked_sub(waited).unwrap_or(now.at)
}

/// When [`Host::run`] returns (besides its stop flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Only when stopped: a server.
    Stopped,
    /// Also once no connection is left: a client whose connections are done.
    Idle,
}

impl<A: App> Host<A> {
    /// Runs until `stop` is set, or ([`Until::Idle`]) until no connection is left.
    /// `publish` receives the counters every 100 ms at most, and when the loop ends.
    pub fn run(&mut self, stop: &AtomicBool, until: Until, publish: Option<&Mutex<HostCounters>>) -> Result<(), Error> {
        let mut published: Option<Instant> = None;
        loop {
            if stop.load(Ordering::Relaxed) || (until == Until::Idle && self.connection_count() == 0) {
                break;
            }
            let now = Instant::now();
            if let Some(p) = publish {
                if published.is_none_or(|t| now.duration_since(t) >= PUBLISH_EVERY) {
                    *p.lock().unwrap_or_else(|e| e.into_inner()) = self.counters();
                    published = Some(now);
                }
            }
            if self.drain_step(now) {
                break;
            }
            self.reload_step();
            self.step(STOP_CHECK)?;
        }
        // A drained loop ends with what its deadline closed: each one's application hears of it.
        if self.is_draining() {
            self.reap_all();
        }
        // Packets a turn kept for the next (deferred flushes) leave before the loop ends.
        if !self.out.is_empty() {
            let _ = self.out.flush(&self.socket, &mut self.counters);
            self.flush.flushed();
        }
        if let Some(p) = publish {
            *p.lock().unwrap_or_else(|e| e.into_inner()) = self.counters();
        }
        Ok(())
    }

    /// One turn of the loop: when the last turn found nothing to do, first waits (at most
    /// `max_wait`) for a datagram, the earliest deadline or writability; then receives, runs
    /// the due deadlines and serves the ready connections. For a driver that does things
    /// between turns (a load generator opening connections on a schedule).
    ///
    /// The turn reads the clock twice, and hands the time down: when it starts (for what
    /// arrives) and once it has received (for the deadlines due and the serving).
    pub fn step(&mut self, max_wait: Duration) -> Result<(), Error> {
        // Nothing is ready (what was ready got served), or the socket refused the last flush:
        // wait for a datagram, a deadline, or writability. A datagram that came during the
        // last turn ends the wait at once; a deadline already due makes it zero. Something made
        // ready between turns (a connection opened, a wake) is served now.
        if self.flush.waits(self.ready.is_empty()) {
            self.gather(max_wait);
            self.wait(max_wait)?;
        }
        let start = Now::read();
        self.flush.turn_started(start.at);
        self.counters.turns += 1;
        // The period's ticket key before what arrives: a resumption's first Initial may be the
        // first datagram this shard ever reads.
        self.rotate_ticket_key(start.wall);
        self.receive(start)?;
        self.check_unreachable();
        let now = Instant::now();
        self.expire(now);
        self.serve(now);
        Ok(())
    }

    /// Lets datagrams gather (a sleep, not a wait on the socket) as the flush rules say
    /// ([`super::flush::FlushRules::gather`]), never past the earliest deadline or `max_wait`.
    fn gather(&mut self, max_wait: Duration) {
        let now = Instant::now();
        let deadline = self.timers.peek().map(|(at, _)| self.sending.instant(at));
        if let Some((until, coalesced)) = self.flush.gather(now, max_wait, deadline) {
            if coalesced {
                self.counters.coalesced += 1;
            }
            std::thread::sleep(until - now);
        }
    }

    /// Waits for a datagram, writability when blocked, or the earliest deadline, at most
    /// `max_wait`.
    fn wait(&mut self, max_wait: Duration) -> Result<(), Error> {
        let now = Instant::now();
        let mut timeout = max_wait;
        if let Some((at, _)) = self.timers.peek() {
            timeout = timeout.min(Duration::from_nanos(at.saturating_sub(self.sending.ns(now))));
        }
        let (timeout, events) = self.flush.wait(now, timeout);
        if timeout.is_zero() {
            return Ok(());
        }
        self.counters.waits += 1;
        // To the nanosecond: a deadline (a held packet) may be a few hundred microseconds away.
        let err = self.socket.poll(events, timeout).map_err(Error::Io)? & libc::POLLERR != 0;
        if err {
            // ICMP errors queued (IP_RECVERR): read them, or POLLERR stays raised and the
            // loop spins. The socket counts them (`icmp_errors`).
            if let Err(e) = self.socket.drain_errors(|_| {}) {
                self.counters.recv_errors += 1;
                log::debug!("udpx-quic: reading the error queue failed (counted): {e}");
            }
        }
        Ok(())
    }

    /// A client gives up on connections that never heard from their server once ICMP errors
    /// arrive (port unreachable: nothing listens there), instead of waiting for the idle
    /// timeout. A server never does: anyone can send it ICMP errors.
    fn check_unreachable(&mut self) {
        if self.role.accepts() {
            return;
        }
        let n = self.socket.counters().icmp_errors;
        if n == self.icmp_seen {
            return;
        }
        self.icmp_seen = n;
        for (slot, e) in self.table.iter_mut() {
            if e.conn.stats().recv == 0 {
                let _ = e.conn.close(false, 0x0, b"peer unreachable");
                self.ready.push(slot);
            }
        }
    }

    /// Receives what is queued and feeds it to the connections (each becomes ready); returns
    /// the datagrams fed. `now`: the turn's start.
    fn receive(&mut self, now: Now) -> Result<usize, Error> {
        let Some(mut bufs) = self.recv.take() else { return Ok(0) };
        let mut fed = 0;
        let mut result = Ok(());
        let bound = self.flush.coalesce() + RX_WAIT_SLACK;
        for _ in 0..RECV_CALLS_PER_TURN {
            match self.socket.try_recv_into(&mut bufs) {
                Ok(0) => break,
                Ok(n) => {
                    for i in 0..n {
                        let (meta, data) = bufs.message_mut(i);
                        let meta = *meta;
                        if meta.truncated || meta.segment_count() == 0 {
                            self.counters.dropped_truncated += 1;
                            continue;
                        }
                        let stride = if meta.stride == 0 { data.len().max(1) } else { meta.stride };
                        if data.is_empty() {
                            self.counters.dropped_unparseable += 1;
                            continue;
                        }
                        // The address it was sent to (pktinfo, on a socket bound to the
                        // unspecified address), or the socket's.
                        let to = match meta.dst_ip {
                            Some(ip) => SocketAddr::new(ip, self.local.port()),
                            None => self.local,
                        };
                        // When it came (a socket that gathers asks the kernel): a wait in
                        // the socket is not the path's round trip.
                        let at = received_at(now, meta.rx_time, bound);
                        for d in data.chunks_mut(stride) {
                            fed += 1;
                            self.counters.datagrams_received += 1;
                            self.counters.bytes_received += d.len() as u64;
                            self.datagram(meta.addr, to, d, now, at);
                        }
                    }
                    // A short batch emptied the queue: another call now would find nothing
                    // (what arrives meanwhile wakes the next wait at once).
                    if n < bufs.capacity() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // Only a broken descriptor or a bug ends the loop; anything the network can
                // cause (the library already keeps ICMP errors out) is counted and the loop
                // goes on.
                Err(e) if udpx::recv::is_unusable(&e) => {
                    result = Err(Error::Io(e));
                    break;
                }
                Err(e) => {
                    self.counters.recv_errors += 1;
                    log::debug!("udpx-quic: receive failed (counted, serving on): {e}");
                    break;
                }
            }
        }
        self.recv = Some(bufs);
        result.map(|_| fed)
    }

    /// One datagram from `from` to local address `to`, received at `at`.
    fn datagram(&mut self, from: SocketAddr, to: SocketAddr, buf: &mut [u8], now: Now, at: Instant) {
        let hdr = match quiche::Header::from_slice(buf, CID_LEN) {
            Ok(h) => h,
            Err(_) => {
                self.counters.dropped_unparseable += 1;
                return;
            }
        };
        let (slot, fresh) = match self.table.lookup(&hdr.dcid) {
            Some(s) => (s, false),
            // A stateless reset carries none of our connection IDs: it goes to the connection
            // whose peer's reset token ends it (quiche then checks it and closes).
            None if !self.role.accepts() && hdr.ty == quiche::Type::Short => match self.reset_target(from, buf) {
                Some(i) => {
                    self.counters.resets_received += 1;
                    (i, false)
                }
                None => {
                    self.counters.dropped_unknown_cid += 1;
                    return;
                }
            },
            None => match self.new_connection(from, to, &hdr, buf.len(), now) {
                Some(i) => (i, true),
                None => return,
            },
        };
        let Some(e) = self.table.get_mut(slot) else { return };
        // A connection that let the kernel choose its address keeps its unspecified one.
        let to = if e.local.ip().is_unspecified() { e.local } else { to };
        let info = quiche::RecvInfo { from, to };
        match e.conn.recv_at(buf, info, at) {
            Ok(_) | Err(quiche::Error::Done) => {
                if fresh {
                    self.counters.connections += 1;
                }
                self.ready.push(slot);
            }
            Err(err) => {
                self.counters.dropped_by_quic += 1;
                log::debug!("udpx-quic: {} refused a datagram from {from}: {err}", e.conn.trace_id());
                if fresh {
                    // An Initial that does not decrypt leaves no state behind.
                    self.remove(slot);
                } else {
                    // quiche closes the connection for any error it returns from `recv`.
                    self.app.failed(&e.conn, &mut e.state, &err);
                    self.ready.push(slot);
                }
            }
        }
    }

    /// Runs the deadlines that are due: quiche's timers fire, held packets are released
    /// (their connections become ready), handshakes past their deadline are dropped.
    fn expire(&mut self, now: Instant) {
        let due = self.sending.ns(now + self.sending.slack);
        while let Some((c, kind)) = self.timers.pop_due(due) {
            self.counters.timers_fired += 1;
            let Some(e) = self.table.get_mut(c) else { continue };
            match kind {
                Deadline::Handshake if !e.established && !e.conn.is_established() => {
                    // Dropped, not closed: nothing more is sent to an address that never
                    // finished.
                    self.counters.handshake_timeouts += 1;
                    self.reap(c);
                    continue;
                }
                Deadline::Handshake => {}
                Deadline::Quic => self.counters.timers_quic += 1,
                Deadline::Release => self.counters.timers_release += 1,
                Deadline::App => self.counters.timers_app += 1,
            }
            // quiche's timer is looked at whichever deadline fired: one that passed with it
            // (a late wake) fires now, not a turn later.
            if e.conn.timeout_instant().is_some_and(|t| t <= now) {
                e.conn.on_timeout();
                e.timed_out = true;
            }
            self.ready.push(c);
        }
    }

    /// Serves the connections that are ready now, each once (see the module docs), then
    /// flushes. Returns how many were served.
    fn serve(&mut self, now: Instant) -> usize {
        // What a blocked flush left goes first (packets deferred by the last turn wait to join
        // this turn's).
        if self.flush.blocked.is_some() && !self.out.is_empty() {
            let f = self.out.flush(&self.socket, &mut self.counters);
            if f != Flush::Done {
                self.flush.blocked = Some(f);
                return 0;
            }
        }
        self.flush.blocked = None;
        let n = self.ready.len();
        let mut served = 0;
        self.flush.serving();
        for _ in 0..n {
            if self.flush.blocked.is_some() {
                break; // the rest stay ready for the next turn
            }
            let Some(c) = self.ready.pop() else { break };
            served += 1;
            self.serve_one(c, now);
        }
        self.counters.served += served as u64;
        if self.flush.decide(now, self.out.pending_bytes(), &mut self.counters) == Decision::Send {
            let f = self.out.flush(&self.socket, &mut self.counters);
            if f != Flush::Done {
                self.flush.blocked = Some(f);
            }
        }
        served
    }

    /// One ready connection: its application's turn, connection IDs, its quantum of packets;
    /// then it leaves (closed), waits for its deadline, or goes to the back of the queue.
    fn serve_one(&mut self, slot: Slot, now: Instant) {
        let Some(e) = self.table.get_mut(slot) else { return };
        if !e.established && e.conn.is_established() {
            e.established = true;
            e.handshake_deadline = None;
            if self.role.accepts() {
                self.gate.admission.established();
            }
        }
        let ran = e.conn.is_established() || e.conn.is_in_early_data();
        if ran {
            self.app.on_turn(&mut e.conn, &mut e.state);
        }
        let prior_out = e.last_out;
        self.issue_cids(slot);
        let sent_before = self.counters.packets_sent;
        let mut more = self.produce(slot, now);
        // A resuming client is in early data only once its first flight is written: its
        // application gets its turn now, so its request goes in 0-RTT, not a round trip later.
        if let Some(e) = self.table.get_mut(slot).filter(|e| !ran && e.conn.is_in_early_data()) {
            self.app.on_turn(&mut e.conn, &mut e.state);
            more |= self.produce(slot, now);
        }
        let Some(e) = self.table.get_mut(slot) else { return };
        let wrote = self.counters.packets_sent - sent_before;
        let closing = e.conn.is_closed() || e.conn.is_draining();
        let w = Wrote { packets: wrote, more, paced: e.held.is_some(), closing, prior_out };
        let conn = &e.conn;
        self.flush.wrote(w, now, || conn.path_stats().find(|p| p.active).map(|p| p.rtt));
        let st = e.conn.stats();
        self.counters.lost_packets += (st.lost as u64).saturating_sub(e.seen_lost);
        self.counters.retransmitted += (st.retrans as u64).saturating_sub(e.seen_retrans);
        self.counters.stream_bytes_retransmitted += st.stream_retrans_bytes.saturating_sub(e.seen_stream_retrans);
        self.counters.stream_bytes_copied += st.stream_bytes_copied.saturating_sub(e.seen_stream_copied);
        (e.seen_lost, e.seen_retrans, e.seen_stream_retrans, e.seen_stream_copied) =
            (st.lost as u64, st.retrans as u64, st.stream_retrans_bytes, st.stream_bytes_copied);
        if e.conn.is_closed() {
            self.reap(slot);
            return;
        }
        let wake = if e.conn.is_established() || e.conn.is_in_early_data() { self.app.wake_at(&e.state) } else { None };
        let deadline = [
            (e.conn.timeout_instant(), Deadline::Quic),
            (e.held.as_ref().map(|h| h.at), Deadline::Release),
            (e.handshake_deadline, Deadline::Handshake),
            (wake, Deadline::App),
        ]
        .into_iter()
        .filter_map(|(at, kind)| Some((at?, kind)))
        .min_by_key(|&(at, _)| at);
        let at = deadline.map(|(d, kind)| (self.sending.ns(d), kind));
        self.timers.set(slot, at);
        if more {
            self.ready.push(slot);
            self.flush.requeued();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn a_receive_time_moves_onto_the_monotonic_clock_within_its_bound() {
        let now = Now::read();
        let wall = now.wall.duration_since(UNIX_EPOCH).unwrap();
        let ms = Duration::from_millis;
        let bound = ms(11);
        // (the kernel's time relative to the turn's start's wall clock, how long before the
        // turn's start the datagram is taken as received)
        let cases: [(Option<i64>, Duration); 6] = [
            (None, Duration::ZERO),    // no time: the turn's start
            (Some(0), Duration::ZERO), // at the start
            (Some(-3), ms(3)),         // waited 3 ms in the socket
            (Some(-11), ms(11)),       // the bound itself
            (Some(-5_000), ms(11)),    // a stepped clock: no more than the bound
            (Some(2), Duration::ZERO), // came after the start: taken as at it
        ];
        for (rel, before) in cases {
            let rx = rel.map(|r| if r < 0 { wall - ms(r.unsigned_abs()) } else { wall + ms(r as u64) });
            assert_eq!(received_at(now, rx, bound), now.at - before, "{rel:?}");
        }
        // A time before the epoch's start cannot come from the decoder; zero is the floor.
        let early = Now { at: now.at, wall: SystemTime::UNIX_EPOCH };
        assert_eq!(received_at(early, Some(Duration::ZERO), bound), now.at);
    }
}
