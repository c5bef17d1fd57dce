//! The nftables ruleset (and policy routes) that route QUIC by the server ID in its connection
//! IDs. Pure text from a [`Balancer`]; `nft -c -f` checks it where nft is installed.
//!
//! # Where the bytes are
//!
//! nft's `@th,OFFSET,LEN` counts bits from the transport header: the UDP header is bits 0-63,
//! the QUIC packet starts at bit 64.
//!
//! ```text
//!  short header   byte 0      1 (DCID octet 0)   2-3 (server ID)
//!                 0 1 . . .   rrr LLLLL           host ID
//!                 @th,64,1    @th,72,3            @th,80,16
//!
//!  long header    byte 0      1-4 version   5 (DCID len)   6 (DCID octet 0)   7-8
//!                 1 1 TT ..                  12             rrr LLLLL          host ID
//!                 @th,64,1                   @th,104,8      @th,112,3          @th,120,16
//!                     @th,66,1: type Initial (00) or 0-RTT (01)
//! ```
//!
//! # What nft does with them (nft 1.0.6, found in the issue's prototype and here)
//!
//! - A named map needs `typeof` (nft 1.0.6 refuses `type integer` keys).
//! - A failed map lookup ends the rule (nothing after it runs, the packet is not marked), so an
//!   unknown server ID falls through to the next rule and finally to the 4-tuple fallback. A
//!   payload too short for an offset also ends the rule: short packets fall back too.
//! - `notrack` only works before conntrack (priority `raw`, -300); at `mangle` (-150) the packet
//!   already has its conntrack entry.
//! - `jhash` without `seed` takes a random seed when the rule is loaded, so every reload would
//!   move hashed packets between hosts. The rules carry the balancer's seed
//!   ([`Balancer::with_seed`]; `udpx lb nft --seed`, or a random one printed in the rules'
//!   head to give again): the same hosts and seed hash every packet to the same host across
//!   reloads. When the host list changes the hash changes with it (`mod N`): a client whose
//!   first round trip spans the reload may have its later Initials (a retransmission, a
//!   ClientHello's second datagram, the ACK it coalesces with its first Handshake packet)
//!   hashed to another host, which holds a half-open handshake until its deadline or drops a
//!   packet for a connection it never had; the client finishes with the first host, whose
//!   connection ID its Handshake packets carry (it sends no Initial after its first Handshake
//!   packet, RFC 9001 4.9.1).
//!
//! # Initials go by hash, never by the ID they claim
//!
//! An Initial or 0-RTT packet's DCID is the client's to choose until the server answers: a
//! forged one that imitates a host's server ID would reach that host even while it drains.
//! So Initials and 0-RTT are hashed by their 4-tuple, which all of one client's Initials share
//! (the first, with the client's random DCID, and the later ones that carry the server's ID),
//! and only Handshake packets and short headers are routed by the server ID they carry.
//!
//! # Marks are host IDs
//!
//! A host's firewall mark and routing table are [`Balancer::mark_of`] its server ID, the same
//! in every ruleset, never its position in the host list: taking a host out changes no other
//! host's mark, so between loading new rules and changing routes (or with the old routes
//! left in place) no packet of one host reaches another, which would answer it with a
//! stateless reset.
//!
//! # Modes
//!
//! - [`Mode::Stateless`]: each packet is marked (`meta mark`), `ip rule fwmark M table M`
//!   sends it to its host's next hop, untouched and untracked. Every host must hold the VIP
//!   (on `lo` or a device) and answers the client directly (direct server return).
//! - [`Mode::Dnat`]: the first packet of each conntrack flow is classified the same way and
//!   `dnat to` its host's address; conntrack rewrites the rest and the replies. The hosts need
//!   no VIP, but the balancer keeps state, and the replies must come back through it. A client
//!   whose address changes starts a new flow, classified again by its connection ID. Hosts
//!   behind it must send no stateless resets (`udpx h3 serve --no-stateless-resets`, as the
//!   lab does): conntrack pins an attacker's 4-tuple to one host whatever connection IDs its
//!   later packets carry, so that host would answer other hosts' IDs with their reset tokens
//!   (RFC 9000 21.11). In the stateless mode every packet goes by its ID, so no host sees
//!   another live host's IDs and resets stay on.

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::net::Ipv4Addr;
use std::str::FromStr;

use udpx_quic::cid::CID_LEN;

/// The nft table every ruleset here lives in (`table ip udpx_lb`).
pub const TABLE: &str = "udpx_lb";
/// Host `id`'s firewall mark and routing table are `MARK_BASE + id` (0x10000 to 0x1ffff):
/// never 0 (unmarked), and clear of the kernel's tables 253-255 and of small marks others use.
pub const MARK_BASE: u32 = 0x1_0000;
/// Most hosts one ruleset takes.
pub const MAX_HOSTS: usize = 255;
/// The named counters, in rule order: short header, Initial or 0-RTT hashed by 4-tuple,
/// Handshake with a server CID, 4-tuple fallback.
pub const COUNTERS: [&str; 4] = ["short_cid", "initial_hash", "long_cid", "fallback"];

/// How the balancer hands packets to hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Mark and policy-route, no conntrack; the hosts hold the VIP (DSR).
    #[default]
    Stateless,
    /// `dnat` the first packet of each flow to its host; conntrack does the rest.
    Dnat,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Stateless => "stateless",
            Mode::Dnat => "dnat",
        })
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "stateless" => Ok(Mode::Stateless),
            "dnat" => Ok(Mode::Dnat),
            _ => Err(format!("mode {s:?}: give stateless or dnat")),
        }
    }
}

/// One host behind the balancer: the server ID its connection IDs carry (`udpx h3 serve
/// --host-id`) and the address the balancer sends its packets to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Host {
    /// The QUIC-LB server ID, connection ID octets 1-2.
    pub id: u16,
    /// Its address on the balancer's side: the next hop (stateless) or DNAT target.
    pub next_hop: Ipv4Addr,
}

impl FromStr for Host {
    type Err = String;
    /// `ID=NEXTHOP`: the ID decimal (`1`) or hex (`0x0001`), the next hop an IPv4 address.
    fn from_str(s: &str) -> Result<Host, String> {
        let Some((id, hop)) = s.split_once('=') else {
            return Err(format!("host {s:?}: give ID=NEXTHOP, e.g. 1=10.0.1.2"));
        };
        let id = parse_id(id).map_err(|e| format!("host {s:?}: {e}"))?;
        let next_hop = hop
            .trim()
            .parse::<Ipv4Addr>()
            .map_err(|_| format!("host {s:?}: the next hop {hop:?} is not an IPv4 address"))?;
        Ok(Host { id, next_hop })
    }
}

/// A server ID, decimal (`1`) or hex (`0x0001`).
pub fn parse_id(s: &str) -> Result<u16, String> {
    let id = s.trim();
    match id.strip_prefix("0x").or_else(|| id.strip_prefix("0X")) {
        Some(hex) => u16::from_str_radix(hex, 16),
        None => id.parse::<u16>(),
    }
    .map_err(|_| format!("the ID {id:?} is not 0 to 65535 (decimal or 0x hex)"))
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.id, self.next_hop)
    }
}

/// What a balancer routes: a VIP and port, its hosts, a mode. Made by [`Balancer::new`], which
/// refuses a configuration the rules could not express.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balancer {
    vip: Ipv4Addr,
    port: u16,
    hosts: Vec<Host>,
    mode: Mode,
    /// jhash's seed; `None`: nft draws one at each load.
    seed: Option<u32>,
    /// Server IDs of the hosts being drained ([`Balancer::with_draining`]).
    draining: BTreeSet<u16>,
}

/// Why a [`Balancer`] cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// No host given.
    NoHosts,
    /// More than [`MAX_HOSTS`].
    TooManyHosts(usize),
    /// Two hosts with one server ID.
    DuplicateId(u16),
    /// Two hosts with one address.
    DuplicateNextHop(Ipv4Addr),
    /// A host's address is the VIP itself.
    NextHopIsVip(Ipv4Addr),
    /// Port 0.
    PortZero,
    /// A draining host that is not among the hosts.
    UnknownDraining(u16),
    /// Every host draining: no host would take a new connection.
    AllDraining,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoHosts => write!(f, "no host: give at least one --host ID=NEXTHOP"),
            ConfigError::TooManyHosts(n) => write!(f, "{n} hosts: give at most {MAX_HOSTS} (one firewall mark each)"),
            ConfigError::DuplicateId(id) => write!(f, "host ID {id} given twice: give each host its own ID"),
            ConfigError::DuplicateNextHop(a) => write!(f, "next hop {a} given twice: give each host its own address"),
            ConfigError::NextHopIsVip(a) => write!(f, "next hop {a} is the VIP: give the host's own address"),
            ConfigError::PortZero => write!(f, "--port 0: give the port the service listens on (1 to 65535)"),
            ConfigError::UnknownDraining(id) => {
                write!(f, "--draining {id}: no such host; give the ID of one of the --host lines")
            }
            ConfigError::AllDraining => {
                write!(f, "every host is draining: at least one must take new connections (drop a --draining)")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Balancer {
    /// Checks and keeps the configuration. Hosts keep their order (the hash's buckets); each
    /// host's mark is its ID's ([`Balancer::mark_of`]).
    pub fn new(vip: Ipv4Addr, port: u16, hosts: Vec<Host>, mode: Mode) -> Result<Balancer, ConfigError> {
        if hosts.is_empty() {
            return Err(ConfigError::NoHosts);
        }
        if hosts.len() > MAX_HOSTS {
            return Err(ConfigError::TooManyHosts(hosts.len()));
        }
        if port == 0 {
            return Err(ConfigError::PortZero);
        }
        let (mut ids, mut hops) = (BTreeSet::new(), BTreeSet::new());
        for h in &hosts {
            if !ids.insert(h.id) {
                return Err(ConfigError::DuplicateId(h.id));
            }
            if !hops.insert(h.next_hop) {
                return Err(ConfigError::DuplicateNextHop(h.next_hop));
            }
            if h.next_hop == vip {
                return Err(ConfigError::NextHopIsVip(vip));
            }
        }
        Ok(Balancer { vip, port, hosts, mode, seed: None, draining: BTreeSet::new() })
    }

    /// The same balancer with the hosts of server IDs `ids` draining: each keeps every packet
    /// whose connection ID names it (its connections carry on) and gets no new Initial or
    /// 0-RTT packet and no 4-tuple fallback (the hashes skip it). Remove it from the hosts
    /// once its connections have ended: its mark and table are its own, so nothing else moves.
    pub fn with_draining(mut self, ids: &[u16]) -> Result<Balancer, ConfigError> {
        for &id in ids {
            if self.host(id).is_none() {
                return Err(ConfigError::UnknownDraining(id));
            }
            self.draining.insert(id);
        }
        if self.draining.len() == self.hosts.len() {
            return Err(ConfigError::AllDraining);
        }
        Ok(self)
    }

    /// Whether host `id` is draining.
    pub fn is_draining(&self, id: u16) -> bool {
        self.draining.contains(&id)
    }

    /// The hosts that take new connections (the hashes' buckets, in order).
    pub fn taking(&self) -> Vec<Host> {
        self.hosts.iter().copied().filter(|h| !self.is_draining(h.id)).collect()
    }

    /// The same balancer hashing with `seed` (kept across reloads: see the module docs).
    pub fn with_seed(mut self, seed: u32) -> Balancer {
        self.seed = Some(seed);
        self
    }

    /// The hash seed, if one was given.
    pub fn seed(&self) -> Option<u32> {
        self.seed
    }

    /// The VIP.
    pub fn vip(&self) -> Ipv4Addr {
        self.vip
    }

    /// The UDP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The hosts, in hash-bucket order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The firewall mark (and routing table) of the host with server ID `id`: the same in
    /// every ruleset that has the host.
    pub fn mark_of(id: u16) -> u32 {
        MARK_BASE + u32::from(id)
    }

    /// The host with server ID `id` and its index, if any.
    pub fn host(&self, id: u16) -> Option<(usize, Host)> {
        self.hosts.iter().copied().enumerate().find(|(_, h)| h.id == id)
    }

    /// The whole ruleset for `nft -f`: it replaces table `ip udpx_lb` and nothing else.
    pub fn ruleset(&self) -> String {
        self.render(true)
    }

    /// The same ruleset without the connection-ID rules: every packet by the 4-tuple hash, as a
    /// balancer that knows nothing of QUIC routes. The baseline for comparisons (the lab's
    /// rebinding contrast); only the counter `fallback` counts.
    pub fn four_tuple_ruleset(&self) -> String {
        self.render(false)
    }

    fn render(&self, by_cid: bool) -> String {
        let n = self.hosts.len();
        // `mod N [seed S] map { bucket : mark }`: a hash bucket per host that takes new
        // connections, in list order (a draining host has none).
        let taking = self.taking();
        let buckets: Vec<String> =
            taking.iter().enumerate().map(|(i, h)| format!("{i} : {:#x}", Balancer::mark_of(h.id))).collect();
        let n_hashed = taking.len();
        let seed = self.seed.map(|s| format!(" seed {s:#010x}")).unwrap_or_default();
        let hash = format!("mod {n_hashed}{seed} map {{ {} }}", buckets.join(", "));
        let mut s = String::new();
        let w = &mut s;
        line(w, "#!/usr/sbin/nft -f");
        line(w, "# udpx lb nft: QUIC routed by the server ID in its connection IDs (QUIC-LB plaintext,");
        line(w, "# udpx-quic's layout: octet 0 = 000 rotation bits + length 0x0b, 2-byte server ID, nonce, worker).");
        let _ = writeln!(w, "# VIP {} udp port {}, {} hosts, mode {}.", self.vip, self.port, n, self.mode);
        match self.seed {
            Some(seed) => {
                let _ = writeln!(
                    w,
                    "# Hash seed {seed:#010x}: give it again (--seed) to keep hashed packets on their hosts."
                );
            }
            None => line(w, "# No hash seed: nft draws one at each load (hashed packets may move hosts on a reload)."),
        }
        line(w, "# A host's firewall mark and routing table: 0x10000 + its server ID, the same in every ruleset.");
        if !self.draining.is_empty() {
            let ids: Vec<String> = self.draining.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                w,
                "# Draining: host {}: keeps every packet its connection IDs name, gets no new Initial and no fallback.",
                ids.join(", ")
            );
        }
        match self.mode {
            Mode::Stateless => {
                line(w, "# Stateless: packets are marked, not tracked; `ip rule fwmark` sends them to their host");
                line(w, "# (the ip lines printed below). Every host holds the VIP and answers directly (DSR).");
            }
            Mode::Dnat => {
                line(w, "# DNAT: the first packet of each conntrack flow is classified and sent to its host's");
                line(w, "# address; conntrack rewrites the rest and the replies, which must pass back through here.");
            }
        }
        line(w, "# Offsets are bits from the UDP header (@th): the QUIC packet starts at bit 64.");
        line(w, "# A failed map lookup or a payload too short for an offset ends a rule: the next one runs.");
        line(w, "");
        line(w, "# Create the table if missing, then delete it: loading this file again replaces it.");
        let _ = writeln!(w, "table ip {TABLE}");
        let _ = writeln!(w, "delete table ip {TABLE}");
        let _ = writeln!(w, "table ip {TABLE} {{");
        line(w, "\t# server ID (connection ID octets 1-2) -> the host's firewall mark");
        line(w, "\tmap sid2mark {");
        line(w, "\t\ttypeof @th,80,16 : meta mark");
        let elems: Vec<String> =
            self.hosts.iter().map(|h| format!("{:#06x} : {:#x}", h.id, Balancer::mark_of(h.id))).collect();
        let _ = writeln!(w, "\t\telements = {{ {} }}", elems.join(", "));
        line(w, "\t}");
        if self.mode == Mode::Dnat {
            line(w, "\t# firewall mark -> the host's address");
            line(w, "\tmap mark2ip {");
            line(w, "\t\ttypeof meta mark : ip daddr");
            let elems: Vec<String> =
                self.hosts.iter().map(|h| format!("{:#x} : {}", Balancer::mark_of(h.id), h.next_hop)).collect();
            let _ = writeln!(w, "\t\telements = {{ {} }}", elems.join(", "));
            line(w, "\t}");
        }
        line(w, "");
        line(w, "\t# packets per rule: `nft list counters table ip udpx_lb`");
        for c in COUNTERS {
            let _ = writeln!(w, "\tcounter {c} {{ }}");
        }
        line(w, "");
        line(w, "\tchain prerouting {");
        match self.mode {
            Mode::Stateless => {
                line(w, "\t\t# raw (-300): before conntrack, so notrack takes effect; marks are set before routing");
                line(w, "\t\ttype filter hook prerouting priority raw; policy accept;");
                let _ = writeln!(w, "\t\tip daddr {} udp dport {} notrack jump quic", self.vip, self.port);
            }
            Mode::Dnat => {
                line(w, "\t\t# a nat chain sees only the first packet of each conntrack flow");
                line(w, "\t\ttype nat hook prerouting priority dstnat; policy accept;");
                let _ = writeln!(w, "\t\tip daddr {} udp dport {} jump quic", self.vip, self.port);
                let _ = writeln!(w, "\t\tip daddr {} udp dport {} dnat to meta mark map @mark2ip", self.vip, self.port);
            }
        }
        line(w, "\t}");
        line(w, "");
        line(w, "\t# sets the mark of the packet's host, counts it by rule, and returns");
        line(w, "\tchain quic {");
        if by_cid {
            line(w, "\t\t# short header (form bit 0), DCID octet 0 with config rotation 000: route by server ID");
            line(
                w,
                "\t\t@th,64,1 0 @th,72,3 0 meta mark set @th,80,16 map @sid2mark counter name \"short_cid\" return",
            );
            line(w, "\t\t# Initial or 0-RTT (long types 00, 01): a hash of the 4-tuple, never the DCID it claims");
            line(w, "\t\t# (a client chooses it); all of one client's Initials share its address and port");
            let _ = writeln!(
                w,
                "\t\t@th,64,1 1 @th,66,1 0 meta mark set jhash ip saddr . udp sport . ip daddr . udp dport {hash} counter name \"initial_hash\" return"
            );
            line(w, "\t\t# Handshake (long type 10) with a server-chosen DCID: length 12, rotation 000");
            let _ = writeln!(
                w,
                "\t\t@th,64,1 1 @th,104,8 {CID_LEN} @th,112,3 0 meta mark set @th,120,16 map @sid2mark counter name \"long_cid\" return"
            );
        } else {
            line(w, "\t\t# (the connection-ID rules are left out: a CID-blind balancer, for comparison)");
        }
        line(w, "\t\t# anything else (unknown server ID, another rotation, short or non-QUIC packets): 4-tuple hash");
        let _ = writeln!(
            w,
            "\t\tmeta mark set jhash ip saddr . udp sport . ip daddr . udp dport {hash} counter name \"fallback\""
        );
        line(w, "\t}");
        line(w, "}");
        s
    }

    /// The policy routes of [`Mode::Stateless`], one command a line with a comment first (empty
    /// in [`Mode::Dnat`]). `ip rule add` adds a rule each time it runs: run them once.
    pub fn routes(&self) -> String {
        if self.mode == Mode::Dnat {
            return String::new();
        }
        let mut s = String::new();
        let w = &mut s;
        line(w, "# Policy routing on the balancer: firewall mark M -> table M -> the host's next hop.");
        line(w, "# The hosts answer from the VIP directly: turn rp_filter off where their answers pass.");
        for cmd in self.route_commands() {
            line(w, &cmd.join(" "));
        }
        s
    }

    /// [`Balancer::routes`] as argument lists for `ip` (without the program name): per host,
    /// the `ip rule` of its mark, then its route.
    pub fn route_commands(&self) -> Vec<Vec<String>> {
        self.marks().flat_map(|(mark, h)| [self.rule_command(mark), self.route_command(mark, h)]).collect()
    }

    /// The `ip route replace` lines alone: what points a host's mark at a new next hop (the
    /// `ip rule`s of the first load stay; adding them again would only duplicate them). A host
    /// taken out needs none: the other hosts' marks do not change.
    pub fn route_replacements(&self) -> Vec<Vec<String>> {
        self.marks().map(|(mark, h)| self.route_command(mark, h)).collect()
    }

    /// (mark, host) in order; none in DNAT mode (no policy routing).
    fn marks(&self) -> impl Iterator<Item = (u32, &Host)> {
        let stateless = self.mode != Mode::Dnat;
        self.hosts.iter().filter(move |_| stateless).map(|h| (Balancer::mark_of(h.id), h))
    }

    fn rule_command(&self, mark: u32) -> Vec<String> {
        let table = mark.to_string();
        ["ip", "rule", "add", "fwmark", &format!("{mark:#x}"), "table", &table].map(String::from).to_vec()
    }

    fn route_command(&self, mark: u32, h: &Host) -> Vec<String> {
        let table = mark.to_string();
        let (vip, hop) = (format!("{}/32", self.vip), h.next_hop.to_string());
        ["ip", "route", "replace", &vip, "via", &hop, "table", &table].map(String::from).to_vec()
    }
}

fn line(w: &mut String, s: &str) {
    w.push_str(s);
    w.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two(mode: Mode) -> Balancer {
        let hosts = vec!["1=10.78.1.2".parse().unwrap(), "0x0002=10.78.2.2".parse().unwrap()];
        Balancer::new(Ipv4Addr::new(10, 78, 100, 1), 443, hosts, mode).unwrap().with_seed(0x0bad_cafe)
    }

    const GOLDEN_STATELESS: &str = r#"#!/usr/sbin/nft -f
# udpx lb nft: QUIC routed by the server ID in its connection IDs (QUIC-LB plaintext,
# udpx-quic's layout: octet 0 = 000 rotation bits + length 0x0b, 2-byte server ID, nonce, worker).
# VIP 10.78.100.1 udp port 443, 2 hosts, mode stateless.
# Hash seed 0x0badcafe: give it again (--seed) to keep hashed packets on their hosts.
# A host's firewall mark and routing table: 0x10000 + its server ID, the same in every ruleset.
# Stateless: packets are marked, not tracked; `ip rule fwmark` sends them to their host
# (the ip lines printed below). Every host holds the VIP and answers directly (DSR).
# Offsets are bits from the UDP header (@th): the QUIC packet starts at bit 64.
# A failed map lookup or a payload too short for an offset ends a rule: the next one runs.

# Create the table if missing, then delete it: loading this file again replaces it.
table ip udpx_lb
delete table ip udpx_lb
table ip udpx_lb {
	# server ID (connection ID octets 1-2) -> the host's firewall mark
	map sid2mark {
		typeof @th,80,16 : meta mark
		elements = { 0x0001 : 0x10001, 0x0002 : 0x10002 }
	}

	# packets per rule: `nft list counters table ip udpx_lb`
	counter short_cid { }
	counter initial_hash { }
	counter long_cid { }
	counter fallback { }

	chain prerouting {
		# raw (-300): before conntrack, so notrack takes effect; marks are set before routing
		type filter hook prerouting priority raw; policy accept;
		ip daddr 10.78.100.1 udp dport 443 notrack jump quic
	}

	# sets the mark of the packet's host, counts it by rule, and returns
	chain quic {
		# short header (form bit 0), DCID octet 0 with config rotation 000: route by server ID
		@th,64,1 0 @th,72,3 0 meta mark set @th,80,16 map @sid2mark counter name "short_cid" return
		# Initial or 0-RTT (long types 00, 01): a hash of the 4-tuple, never the DCID it claims
		# (a client chooses it); all of one client's Initials share its address and port
		@th,64,1 1 @th,66,1 0 meta mark set jhash ip saddr . udp sport . ip daddr . udp dport mod 2 seed 0x0badcafe map { 0 : 0x10001, 1 : 0x10002 } counter name "initial_hash" return
		# Handshake (long type 10) with a server-chosen DCID: length 12, rotation 000
		@th,64,1 1 @th,104,8 12 @th,112,3 0 meta mark set @th,120,16 map @sid2mark counter name "long_cid" return
		# anything else (unknown server ID, another rotation, short or non-QUIC packets): 4-tuple hash
		meta mark set jhash ip saddr . udp sport . ip daddr . udp dport mod 2 seed 0x0badcafe map { 0 : 0x10001, 1 : 0x10002 } counter name "fallback"
	}
}
"#;

    #[test]
    fn stateless_golden() {
        assert_eq!(two(Mode::Stateless).ruleset(), GOLDEN_STATELESS);
        assert_eq!(
            two(Mode::Stateless).routes(),
            "# Policy routing on the balancer: firewall mark M -> table M -> the host's next hop.\n\
             # The hosts answer from the VIP directly: turn rp_filter off where their answers pass.\n\
             ip rule add fwmark 0x10001 table 65537\n\
             ip route replace 10.78.100.1/32 via 10.78.1.2 table 65537\n\
             ip rule add fwmark 0x10002 table 65538\n\
             ip route replace 10.78.100.1/32 via 10.78.2.2 table 65538\n"
        );
    }

    #[test]
    fn dnat_differs_only_where_it_must() {
        let b = two(Mode::Dnat);
        let r = b.ruleset();
        assert!(r.contains("\tmap mark2ip {\n\t\ttypeof meta mark : ip daddr\n\t\telements = { 0x10001 : 10.78.1.2, 0x10002 : 10.78.2.2 }\n\t}\n"), "{r}");
        assert!(r.contains("type nat hook prerouting priority dstnat; policy accept;"), "{r}");
        assert!(r.contains("ip daddr 10.78.100.1 udp dport 443 dnat to meta mark map @mark2ip"), "{r}");
        assert!(!r.contains("notrack"), "{r}");
        // The classification chain is the same text in both modes.
        let chain = |r: &str| r[r.find("\tchain quic").unwrap()..].to_owned();
        assert_eq!(chain(&r), chain(GOLDEN_STATELESS));
        assert_eq!(b.routes(), "");
        assert!(b.route_commands().is_empty());
    }

    #[test]
    fn the_four_tuple_baseline_only_hashes() {
        let r = two(Mode::Stateless).four_tuple_ruleset();
        let chain = &r[r.find("\tchain quic").unwrap()..];
        assert!(!chain.contains("@th"), "{chain}");
        assert!(
            chain.contains("meta mark set jhash ip saddr . udp sport . ip daddr . udp dport mod 2 seed 0x0badcafe map"),
            "{chain}"
        );
        let head = |r: &str| r[..r.find("\tchain quic").unwrap()].to_owned();
        assert_eq!(head(&r), head(GOLDEN_STATELESS));
    }

    /// Where the rules send a short-header packet of host `id`: its mark from `rules`'
    /// `sid2mark` map, then the next hop of that mark's table in `routes` (`ip route` lines).
    fn route(rules: &str, routes: &[Vec<String>], id: u16) -> Option<Ipv4Addr> {
        let map = rules.lines().find(|l| l.trim_start().starts_with("elements = {"))?;
        let key = format!("{id:#06x} : ");
        let at = map.find(&key)? + key.len();
        let mark = u32::from_str_radix(map[at..].split([',', ' ']).next()?.trim_start_matches("0x"), 16).ok()?;
        routes.iter().find(|r| r[1] == "route" && r.last() == Some(&mark.to_string())).and_then(|r| r[5].parse().ok())
    }

    /// A host taken out of three: the new rules, loaded while the old routes are still in
    /// place (or for good: a removal changes no route), send every packet of the hosts that
    /// stay to the same host as before, never to another (which would reset it). With marks
    /// by position, host 3's packets went to host 2 in that window.
    #[test]
    fn removing_a_host_moves_no_other_hosts_packets() {
        let h = |s: &str| s.parse::<Host>().unwrap();
        let vip = Ipv4Addr::new(10, 78, 100, 1);
        let all = vec![h("0x0101=10.78.1.2"), h("0x0102=10.78.2.2"), h("0x0103=10.78.3.2")];
        let old = Balancer::new(vip, 443, all.clone(), Mode::Stateless).unwrap().with_seed(7);
        for gone in 0..3 {
            let left: Vec<Host> = all.iter().copied().filter(|x| *x != all[gone]).collect();
            let new = Balancer::new(vip, 443, left.clone(), Mode::Stateless).unwrap().with_seed(7);
            let old_routes = old.route_commands();
            for x in &left {
                assert_eq!(route(&new.ruleset(), &old_routes, x.id), Some(x.next_hop), "new rules, old routes");
                assert_eq!(route(&new.ruleset(), &new.route_commands(), x.id), Some(x.next_hop), "new routes");
                assert_eq!(route(&old.ruleset(), &old_routes, x.id), Some(x.next_hop), "before");
            }
            assert_eq!(route(&new.ruleset(), &old_routes, all[gone].id), None, "the removed host's ID is unmapped");
        }
    }

    /// A draining host keeps its server ID's packets and leaves both hashes; the others keep
    /// theirs; draining an unknown host or every host is refused.
    #[test]
    fn a_draining_host_keeps_its_ids_and_leaves_the_hashes() {
        let h = |s: &str| s.parse::<Host>().unwrap();
        let vip = Ipv4Addr::new(10, 78, 100, 1);
        let all = vec![h("0x0101=10.78.1.2"), h("0x0102=10.78.2.2"), h("0x0103=10.78.3.2")];
        let b = Balancer::new(vip, 443, all.clone(), Mode::Stateless).unwrap().with_seed(7);
        let d = b.clone().with_draining(&[0x0102]).unwrap();
        assert!(d.is_draining(0x0102) && !d.is_draining(0x0101));
        assert_eq!(d.taking(), vec![all[0], all[2]]);
        let rules = d.ruleset();
        let mark = Balancer::mark_of(0x0102);
        assert!(rules.contains(&format!("0x0102 : {mark:#x}")), "its IDs still map to it:\n{rules}");
        assert!(
            rules.contains(&format!(
                "mod 2 seed 0x00000007 map {{ 0 : {:#x}, 1 : {:#x} }}",
                Balancer::mark_of(0x0101),
                Balancer::mark_of(0x0103)
            )),
            "{rules}"
        );
        assert!(rules.contains("# Draining: host 258"), "{rules}");
        for x in &all {
            assert_eq!(route(&rules, &d.route_commands(), x.id), Some(x.next_hop), "host {}", x.id);
        }
        assert_eq!(b.clone().with_draining(&[9]), Err(ConfigError::UnknownDraining(9)));
        assert_eq!(b.with_draining(&[0x0101, 0x0102, 0x0103]), Err(ConfigError::AllDraining));
    }

    #[test]
    fn hosts_parse_and_configs_are_checked() {
        let h: Host = "0x00ff=192.0.2.1".parse().unwrap();
        assert_eq!((h.id, h.next_hop), (255, Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!("7=192.0.2.7".parse::<Host>().unwrap().to_string(), "7=192.0.2.7");
        for (bad, needle) in [
            ("1", "ID=NEXTHOP"),
            ("70000=192.0.2.1", "0 to 65535"),
            ("x=192.0.2.1", "0 to 65535"),
            ("1=host", "not an IPv4"),
            ("1=::1", "not an IPv4"),
        ] {
            let e = bad.parse::<Host>().unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        let vip = Ipv4Addr::new(10, 0, 0, 1);
        let h = |s: &str| s.parse::<Host>().unwrap();
        let new = |hosts: Vec<Host>, port| Balancer::new(vip, port, hosts, Mode::Stateless);
        assert_eq!(new(vec![], 443), Err(ConfigError::NoHosts));
        assert_eq!(new(vec![h("1=10.0.1.1")], 0), Err(ConfigError::PortZero));
        assert_eq!(new(vec![h("1=10.0.1.1"), h("1=10.0.1.2")], 443), Err(ConfigError::DuplicateId(1)));
        assert_eq!(
            new(vec![h("1=10.0.1.1"), h("2=10.0.1.1")], 443),
            Err(ConfigError::DuplicateNextHop(Ipv4Addr::new(10, 0, 1, 1)))
        );
        assert_eq!(new(vec![h("1=10.0.0.1")], 443), Err(ConfigError::NextHopIsVip(vip)));
        let many: Vec<Host> =
            (0..256u32).map(|i| Host { id: i as u16, next_hop: Ipv4Addr::from(0x0a00_0100 + i) }).collect();
        assert_eq!(new(many, 443), Err(ConfigError::TooManyHosts(256)));
        for e in [ConfigError::NoHosts, ConfigError::PortZero, ConfigError::DuplicateId(3)] {
            assert!(e.to_string().contains("give"), "{e}");
        }
        assert_eq!("dnat".parse::<Mode>(), Ok(Mode::Dnat));
        assert!("nat".parse::<Mode>().unwrap_err().contains("stateless or dnat"));
    }

    /// `nft -c -f` (check only, nothing loaded) accepts both modes, when nft is installed and
    /// this is root (nft -c still opens a netlink socket).
    #[test]
    fn nft_accepts_the_rules() {
        let nft =
            ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"].into_iter().find(|p| std::path::Path::new(p).is_file());
        let Some(nft) = nft else {
            udpx_lab::netns::record_skip("nft_accepts_the_rules", "nft not installed (Debian package nftables)");
            return;
        };
        if !udpx_lab::netns::is_root() {
            udpx_lab::netns::record_skip("nft_accepts_the_rules", "not root: nft -c needs CAP_NET_ADMIN");
            return;
        }
        for (mode, by_cid) in [(Mode::Stateless, true), (Mode::Dnat, true), (Mode::Stateless, false)] {
            let b = two(mode);
            let path = std::env::temp_dir().join(format!("udpx-lb-{}-{mode}-{by_cid}.nft", std::process::id()));
            std::fs::write(&path, if by_cid { b.ruleset() } else { b.four_tuple_ruleset() }).unwrap();
            let out = std::process::Command::new(nft).arg("-c").arg("-f").arg(&path).output().unwrap();
            let _ = std::fs::remove_file(&path);
            assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
