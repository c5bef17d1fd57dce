//! Three namespaces in a line, for a bottleneck lab: a server, a router, a client.
//!
//! ```text
//!  udpx-<pid>-<n>-srv          udpx-<pid>-<n>-rtr                        udpx-<pid>-<n>-cli
//! +-------------------+      +--------------------------------------+  +-------------------+
//! | ux<pid>s<n>       | veth | ux<pid>a<n>          ux<pid>b<n>     |  | ux<pid>c<n>       |
//! |  10.77.1.1/24     |<---->|  10.77.1.2/24        10.77.2.1/24    |<>|  10.77.2.2/24     |
//! | default via .1.2  |      |  ip_forward=1        [tbf root here] |  | default via .2.1  |
//! +-------------------+      +--------------------------------------+  +-------------------+
//! ```
//!
//! Why a router in the middle: a bottleneck must be a queue the sender does not own. A qdisc on
//! the sender's own device pushes back on the socket (EAGAIN, ENOBUFS, a blocked send), so a
//! burst is never lost there; on the router's egress towards the client, a `tbf` drops what
//! exceeds its bucket and buffer exactly as a slower link would, and only the receiver can
//! count that loss. The server's veth can have `tx-udp-segmentation off` so GSO batches are
//! split before the wire and really arrive at the router as bursts, and RPS on the router and
//! client spreads their receive work as a multi-queue NIC would.
//!
//! The addresses are from 10.0.0.0/8 (RFC 1918) and exist only inside these namespaces, so
//! every line can use the same ones; /24 subnets leave room for more client addresses.
//! IPv4 only. Reverse-path filtering is off everywhere (a lab with extra client addresses would
//! otherwise see its replies dropped), and neighbours are static, as in [`crate::TestNet`].

use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::link::{self, ip, link_mtu};
use crate::namespace::{name_for, next_serial, Namespace};
use crate::testnet::{MAX_MTU, MIN_MTU};
use crate::Error;

/// The server's address.
pub const LINE_SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 1);
/// The router's address on the server's subnet.
pub const LINE_ROUTER_SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 2);
/// The router's address on the client's subnet.
pub const LINE_ROUTER_CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 1);
/// The client's address.
pub const LINE_CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 2);
/// Prefix length of every address of the line.
pub const LINE_PREFIX: u8 = 24;

/// One namespace of the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Node {
    /// Sends the traffic.
    Server,
    /// Forwards it, and holds the bottleneck.
    Router,
    /// Receives it.
    Client,
}

/// One veth end of the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Port {
    /// The server's device, `ux<pid>s<n>`.
    Server,
    /// The router's device towards the server, `ux<pid>a<n>`.
    RouterServer,
    /// The router's device towards the client, `ux<pid>b<n>`: the bottleneck's egress.
    RouterClient,
    /// The client's device, `ux<pid>c<n>`.
    Client,
}

impl Port {
    /// Every port, from server to client.
    pub const ALL: [Port; 4] = [Port::Server, Port::RouterServer, Port::RouterClient, Port::Client];

    /// The namespace the device is in.
    pub fn node(self) -> Node {
        match self {
            Port::Server => Node::Server,
            Port::RouterServer | Port::RouterClient => Node::Router,
            Port::Client => Node::Client,
        }
    }

    /// The device's address.
    pub fn v4(self) -> Ipv4Addr {
        match self {
            Port::Server => LINE_SERVER_V4,
            Port::RouterServer => LINE_ROUTER_SERVER_V4,
            Port::RouterClient => LINE_ROUTER_CLIENT_V4,
            Port::Client => LINE_CLIENT_V4,
        }
    }

    /// The port at the other end of its veth pair.
    pub fn peer(self) -> Port {
        match self {
            Port::Server => Port::RouterServer,
            Port::RouterServer => Port::Server,
            Port::RouterClient => Port::Client,
            Port::Client => Port::RouterClient,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn role(self) -> char {
        ['s', 'a', 'b', 'c'][self.index()]
    }
}

/// What [`LineNet::setup`] builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineConfig {
    /// MTU of all four veth ends, [`MIN_MTU`]..=[`MAX_MTU`].
    pub mtu: u32,
}

impl Default for LineConfig {
    /// MTU 1500.
    fn default() -> LineConfig {
        LineConfig { mtu: 1500 }
    }
}

/// How much a [`LineNet::tbf`] may queue beyond its bucket: tbf's `limit` or `latency`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TbfLimit {
    /// Bytes that may wait for tokens; beyond them packets are dropped.
    Bytes(u32),
    /// The longest a packet may wait for tokens (tc turns it into a byte limit at the rate).
    Latency(Duration),
}

impl fmt::Display for TbfLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TbfLimit::Bytes(b) => write!(f, "limit {b}"),
            TbfLimit::Latency(d) => write!(f, "latency {}us", d.as_micros().max(1)),
        }
    }
}

/// A server → router → client line of namespaces; dropping it removes all three (which
/// destroys the veth pairs), also while unwinding from a panic.
///
/// As with [`crate::TestNet`], drop sockets and join threads created in the namespaces first.
#[derive(Debug)]
pub struct LineNet {
    server: Namespace,
    router: Namespace,
    client: Namespace,
    devs: [String; 4],
    mtu: u32,
    setup_time: Duration,
}

impl LineNet {
    /// Creates the namespaces, both veth pairs, addresses, routes, forwarding and static
    /// neighbours, and checks that the MTU and forwarding took. On any error, whatever was
    /// created is removed again before this returns.
    pub fn setup(cfg: &LineConfig) -> Result<LineNet, Error> {
        if !(MIN_MTU..=MAX_MTU).contains(&cfg.mtu) {
            return Err(Error::InvalidConfig { why: format!("MTU {} is outside {MIN_MTU}..={MAX_MTU}", cfg.mtu) });
        }
        crate::check_capable()?;
        let start = Instant::now();
        let serial = next_serial();
        let pid = std::process::id();
        let devs = Port::ALL.map(|p| link::dev_name(pid, serial, p.role()));
        // Dropped on any early return below, removing what exists so far.
        let server = Namespace::create(&name_for(serial, "srv"))?;
        let router = Namespace::create(&name_for(serial, "rtr"))?;
        let client = Namespace::create(&name_for(serial, "cli"))?;
        let net = LineNet { server, router, client, devs, mtu: cfg.mtu, setup_time: Duration::ZERO };

        for (near, far) in [(Port::Server, Port::RouterServer), (Port::RouterClient, Port::Client)] {
            let (n, f) = (net.ns(near.node()).name(), net.ns(far.node()).name());
            ip(&["-n", n, "link", "add", net.dev(near), "type", "veth", "peer", "name", net.dev(far), "netns", f])?;
        }
        let mtu = cfg.mtu.to_string();
        for node in [Node::Server, Node::Router, Node::Client] {
            ip(&["-n", net.ns(node).name(), "link", "set", "dev", "lo", "up"])?;
            // rp_filter: the stricter of `all` and the device's value applies; both go to 0.
            net.sysctls(node, &[("net.ipv4.conf.all.rp_filter", "0"), ("net.ipv4.conf.default.rp_filter", "0")])?;
        }
        for port in Port::ALL {
            let (n, dev) = (net.ns(port.node()).name(), net.dev(port));
            ip(&["-n", n, "addr", "add", &format!("{}/{LINE_PREFIX}", port.v4()), "dev", dev])?;
            ip(&["-n", n, "link", "set", "dev", dev, "mtu", &mtu, "up"])?;
            net.sysctls(port.node(), &[(&format!("net.ipv4.conf.{dev}.rp_filter"), "0")])?;
        }
        net.sysctls(Node::Router, &[("net.ipv4.ip_forward", "1")])?;
        for (port, via) in [(Port::Server, LINE_ROUTER_SERVER_V4), (Port::Client, LINE_ROUTER_CLIENT_V4)] {
            let n = net.ns(port.node()).name();
            ip(&["-n", n, "route", "add", "default", "via", &via.to_string(), "dev", net.dev(port)])?;
        }
        for port in Port::ALL {
            let peer = port.peer();
            let peer_mac = link::mac(net.ns(peer.node()), net.dev(peer))?;
            link::static_neighbour(net.ns(port.node()), net.dev(port), &peer.v4().to_string(), &peer_mac)?;
        }
        for port in Port::ALL {
            let got = link_mtu(net.ns(port.node()), net.dev(port))?;
            if got != cfg.mtu {
                return Err(Error::SettingDidNotTake {
                    dev: net.dev(port).to_owned(),
                    setting: "mtu".to_owned(),
                    wanted: mtu,
                    got: got.to_string(),
                });
            }
        }
        Ok(LineNet { setup_time: start.elapsed(), ..net })
    }

    /// A namespace of the line.
    pub fn ns(&self, node: Node) -> &Namespace {
        match node {
            Node::Server => &self.server,
            Node::Router => &self.router,
            Node::Client => &self.client,
        }
    }

    /// A device's name.
    pub fn dev(&self, port: Port) -> &str {
        &self.devs[port.index()]
    }

    /// A device's address ([`Port::v4`]).
    pub fn addr(&self, port: Port) -> Ipv4Addr {
        port.v4()
    }

    /// The MTU of every device.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// How long setup took, for reports.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// A device's features, parsed from `ethtool -k` (see [`crate::parse_features`]).
    pub fn features(&self, port: Port) -> Result<std::collections::BTreeMap<String, String>, Error> {
        link::features(self.ns(port.node()), self.dev(port))
    }

    /// Sets device features with `ethtool -K` and reads them back, as
    /// [`crate::TestNet::set_features`] does: e.g. `(Port::Server, &[("tx-udp-segmentation",
    /// "off")])` so the server's GSO batches are split into bursts before the wire.
    pub fn set_features(&self, port: Port, settings: &[(&str, &str)]) -> Result<(), Error> {
        link::set_features(self.ns(port.node()), self.dev(port), settings)
    }

    /// Makes the router's egress towards the client a token bucket of `rate_bits_per_sec`
    /// with a bucket of `burst_bytes` and a queue bounded by `limit` (`tc qdisc replace ...
    /// root tbf`): the lab's bottleneck. Replaces whatever root was there, so calling it again
    /// changes the bottleneck.
    pub fn tbf(&self, rate_bits_per_sec: u64, burst_bytes: u32, limit: TbfLimit) -> Result<(), Error> {
        if rate_bits_per_sec == 0 || burst_bytes == 0 {
            return Err(Error::InvalidConfig {
                why: format!("tbf rate {rate_bits_per_sec} bit/s, burst {burst_bytes} B: both must be above 0"),
            });
        }
        if !crate::on_path("tc") {
            return Err(Error::ToolMissing { tool: "tc" });
        }
        let (rate, burst) = (format!("{rate_bits_per_sec}bit"), burst_bytes.to_string());
        let limit = limit.to_string();
        let mut args = vec!["tc", "qdisc", "replace", "dev", self.dev(Port::RouterClient), "root", "tbf"];
        args.extend(["rate", &rate, "burst", &burst]);
        args.extend(limit.split(' '));
        self.router.exec(&args).map(drop)
    }

    /// `tc qdisc show dev <port's device>`, for checks and reports.
    pub fn qdiscs(&self, port: Port) -> Result<String, Error> {
        self.ns(port.node()).exec(&["tc", "qdisc", "show", "dev", self.dev(port)])
    }

    /// Receive packet steering on a device: its first receive queue's packets are handed to
    /// the CPUs in `cpu_mask` (bit n = CPU n) by hash, as a multi-queue NIC would spread them
    /// (`/sys/class/net/<dev>/queues/rx-0/rps_cpus`, written inside the namespace). 0 turns it
    /// off. The value is read back and compared.
    pub fn rps(&self, port: Port, cpu_mask: u64) -> Result<(), Error> {
        link::set_rps(self.ns(port.node()), self.dev(port), cpu_mask)
    }

    /// Sets sysctls inside one namespace (its own `/proc/sys/net`) and reads them back.
    fn sysctls(&self, node: Node, settings: &[(&str, &str)]) -> Result<(), Error> {
        let mut args = vec!["sysctl", "-q", "-w"];
        let pairs: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        args.extend(pairs.iter().map(String::as_str));
        let ns = self.ns(node);
        ns.exec(&args)?;
        for (key, value) in settings {
            let got = ns.exec(&["sysctl", "-n", key])?;
            if got.trim() != *value {
                return Err(Error::SettingDidNotTake {
                    dev: ns.name().to_owned(),
                    setting: (*key).to_owned(),
                    wanted: (*value).to_owned(),
                    got: got.trim().to_owned(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_consistent() {
        for p in Port::ALL {
            assert_eq!(p.peer().peer(), p);
            assert_ne!(p.peer().node(), p.node(), "a veth pair joins two namespaces");
        }
        // Each pair shares a /24; the two pairs do not.
        let net = |a: Ipv4Addr| a.octets()[..3].to_vec();
        assert_eq!(net(Port::Server.v4()), net(Port::RouterServer.v4()));
        assert_eq!(net(Port::Client.v4()), net(Port::RouterClient.v4()));
        assert_ne!(net(Port::Server.v4()), net(Port::Client.v4()));
        assert!(Port::ALL.iter().all(|p| p.v4().is_private()));
    }

    #[test]
    fn tbf_limits_render_for_tc() {
        assert_eq!(TbfLimit::Bytes(30_000).to_string(), "limit 30000");
        assert_eq!(TbfLimit::Latency(Duration::from_millis(5)).to_string(), "latency 5000us");
        assert_eq!(TbfLimit::Latency(Duration::ZERO).to_string(), "latency 1us");
    }
}
