//! Sending: a connection's packets into the outbox, up to its quantum, held to their departure
//! times where the host paces; and the probes quiche strands on a path the peer left.
//!
//! Departure times: quiche's pacer stamps every packet with `SendInfo.at`. Where the egress
//! qdisc honours `SCM_TXTIME` (fq: [`udpx::qdisc`]), each transmit carries its first packet's
//! time and the kernel holds it ([`Pacing::Kernel`]). Elsewhere (this machine: no fq) the host
//! paces itself ([`Pacing::Hold`]): a packet whose `at` is more than the slack ahead
//! ([`HostConfig::pacing_slack`](crate::HostConfig::pacing_slack), [`crate::PACING_SLACK`] by
//! default) is held (the connection's one held packet), the connection's deadline is its
//! time, and the loop sleeps with `ppoll` (ns resolution) to the earliest deadline.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::outbox::Flush;
use crate::pacing::{departure, Held, Pacing, QUIET_BURST, QUIET_REFILL};
use crate::table::Slot;

use crate::{App, Burst, Host, QUANTUM_PACKETS};

/// How a host's packets leave: who paces, how much a connection writes per turn, and the
/// clocks that turn times into the timers' ticks and quiche's `SendInfo.at` into departures.
#[derive(Debug)]
pub(super) struct Sending {
    pub pacing: Pacing,
    pub burst: Burst,
    /// A packet due within this much of now leaves now ([`HostConfig::pacing_slack`](crate::HostConfig::pacing_slack)).
    pub slack: Duration,
    /// The timers' clock: deadlines are ns since this.
    epoch: Instant,
    /// `Instant` and `CLOCK_MONOTONIC` read together, to turn `SendInfo.at` into a departure.
    anchor: (Instant, udpx::Timestamp),
}

impl Sending {
    /// Paced by `pacing` with `slack`, writing `burst` per turn; the clocks start at `now`.
    pub fn new(pacing: Pacing, burst: Burst, slack: Duration, now: Instant) -> Sending {
        Sending { pacing, burst, slack, epoch: now, anchor: (now, udpx::Timestamp::now()) }
    }

    /// Nanoseconds of the timers' clock at `t`.
    pub fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// The instant `ns` of the timers' clock names.
    pub fn instant(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }
}

impl<A: App> Host<A> {
    /// After a NAT rebinding, quiche 0.30 moves the connection to the peer's new address but
    /// strands what it had in flight to the old one (cloudflare/quiche#2452): those packets'
    /// ACKs cannot come, loss detection runs per path, so nothing acknowledged on the new path
    /// declares them lost, and when the old path's PTO fires `send()` writes nothing. The
    /// stream keeps a hole and the connection dies at its idle timeout (6 downloads in 10
    /// through a rebinding relay, `udpx-h3`'s `tests/rebind.rs`).
    ///
    /// So when the old path's PTO fired (its `total_pto_count` grew), a connection with
    /// nothing more to send writes that path's PTO probes (`send_on_path`: probes may exceed
    /// the window, as RFC 9002 allows, and carry the stranded data) and the host sends them to
    /// the address the connection now uses, once that address is validated (no
    /// amplification: it proved it receives). Their ACK reaches the old path's loss
    /// detection, which then declares the rest lost, and quiche resends it on the new path
    /// under the new path's window. At most two probes per path and PTO (quiche's own
    /// limit); counted in `stranded_probes`. Looked at only after quiche's timers fired.
    pub(super) fn resend_stranded(&mut self, slot: Slot) {
        let Some(e) = self.table.get_mut(slot) else { return };
        // One pass, no allocation: this runs on every timeout of every connection, and almost
        // all have one path.
        let (mut active, mut ptos) = (None, 0);
        for p in e.conn.path_stats() {
            if p.active {
                active = Some((p.local_addr, p.peer_addr));
            } else {
                ptos += p.total_pto_count;
            }
        }
        if ptos <= e.left_ptos {
            e.left_ptos = ptos; // a path went away: count from what is left
            return;
        }
        let Some(active) = active.filter(|a| e.conn.is_path_validated(a.0, a.1).unwrap_or(false)) else { return };
        e.left_ptos = ptos;
        let left: Vec<(SocketAddr, SocketAddr)> = e
            .conn
            .path_stats()
            .filter(|p| !p.active && p.peer_addr != active.1)
            .map(|p| (p.local_addr, p.peer_addr))
            .collect();
        let max = e.conn.max_send_udp_payload_size();
        for (local, peer) in left {
            for _ in 0..2 {
                let Some(space) = self.out.space(max) else { return };
                match e.conn.send_on_path(space, Some(local), Some(peer)) {
                    Ok((len, _)) => {
                        self.counters.packets_sent += 1;
                        self.counters.bytes_sent += len as u64;
                        self.counters.stranded_probes += 1;
                        // It leaves on the active path: to its peer, from its local address.
                        let from = src_for(self.local, active.0);
                        self.out.commit(slot, active.1, from, len, None);
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// Writes up to the connection's quantum into the outbox; whether it may have more.
    pub(super) fn produce(&mut self, slot: Slot, now: Instant) -> bool {
        let Some(e) = self.table.get_mut(slot) else { return false };
        if let Some(h) = &e.held {
            if h.at > now + self.sending.slack {
                return false; // its time has not come
            }
            // Due: it leaves first, then the connection produces on.
            let len = h.bytes.len();
            let Some(space) = self.out.space(len) else {
                return true;
            };
            let h = e.held.take().expect("checked above");
            space[..len].copy_from_slice(&h.bytes);
            self.out.commit(slot, h.to, h.from, len, None);
            e.last_out = Some(now);
        }
        let max = e.conn.max_send_udp_payload_size();
        let mut budget = match self.sending.burst {
            Burst::Quantum => e.conn.send_quantum().max(max).min(QUANTUM_PACKETS * max),
            Burst::Window => QUANTUM_PACKETS * max,
        };
        while budget > 0 {
            let space = match self.out.space(max) {
                Some(s) => s,
                None => {
                    let f = self.out.flush(&self.socket, &mut self.counters);
                    if f != Flush::Done {
                        self.flush.blocked = Some(f);
                        return true;
                    }
                    continue;
                }
            };
            match e.conn.send(space) {
                Ok((len, info)) => {
                    self.counters.packets_sent += 1;
                    self.counters.bytes_sent += len as u64;
                    budget = budget.saturating_sub(len);
                    // Quiet: nothing left for a while. A connection waiting on its held packet
                    // is being paced, not quiet: only packets that leave move `last_out`.
                    if e.last_out.is_none_or(|t| now.saturating_duration_since(t) >= QUIET_REFILL) {
                        e.quiet_credit = QUIET_BURST;
                    }
                    let early = self.sending.pacing != Pacing::Off && info.at > now + self.sending.slack;
                    let now_anyway = early && e.quiet_credit > 0;
                    if now_anyway {
                        // The start of a burst after a quiet spell: it leaves now.
                        e.quiet_credit -= 1;
                        self.counters.quiet_sends += 1;
                    } else if self.sending.pacing == Pacing::Hold && early {
                        // Not yet: keep it (the only copy made), and the connection's later
                        // packets behind it; its deadline is the packet's time.
                        let from = src_for(self.local, info.from);
                        e.held = Some(Held { at: info.at, to: info.to, from, bytes: space[..len].to_vec() });
                        self.counters.paced_holds += 1;
                        return false;
                    }
                    let departure = (self.sending.pacing == Pacing::Kernel && !now_anyway)
                        .then(|| departure(self.sending.anchor, info.at));
                    let from = src_for(self.local, info.from);
                    self.out.commit(slot, info.to, from, len, departure);
                    e.last_out = Some(now);
                }
                Err(quiche::Error::Done) => {
                    if std::mem::take(&mut e.timed_out) {
                        self.resend_stranded(slot);
                    }
                    return false;
                }
                Err(err) => {
                    log::debug!("udpx-quic: {} send failed: {err}", e.conn.trace_id());
                    self.app.failed(&e.conn, &mut e.state, &err);
                    let _ = e.conn.close(false, 0x1, b"send failed");
                    return false;
                }
            }
        }
        true
    }
}

/// The source address a packet from local address `from` must name (`IP_PKTINFO`) on a
/// socket bound to `bound`: none when the socket is bound to one address (the kernel's choice
/// is right), else the connection's own.
pub(super) fn src_for(bound: SocketAddr, from: SocketAddr) -> Option<IpAddr> {
    (bound.ip().is_unspecified() && !from.ip().is_unspecified()).then_some(from.ip())
}
