//! The attack lab: four namespaces around a hub, as the internet looks to a server's
//! attacker.
//!
//! ```text
//!                          udpx-<pid>-<n>-hub  (ip_forward=1, no rp_filter)
//!               10.78.1.1  10.78.2.1  10.78.3.1  10.78.4.1
//!                  │          │          │          │        one veth pair each
//!               10.78.1.2  10.78.2.2  10.78.3.2  10.78.4.2
//!                server    attacker    victim     client
//! ```
//!
//! Nothing filters source addresses (no BCP 38, no reverse-path filter in any namespace): a
//! datagram the attacker sends with the victim's address as its source reaches the server,
//! and the server's answers go to the victim, who counts them. The client is the legitimate
//! user whose service the attack must not take away. Addresses are RFC 1918 and exist only in
//! these namespaces; neighbours are static. Dropping the net removes all five namespaces.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::link::{self, ip};
use crate::namespace::{name_for, next_serial, Namespace};
use crate::Error;

/// A namespace at the end of a spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Leaf {
    /// Runs the server under attack.
    Server,
    /// Sends forged datagrams and ICMP errors.
    Attacker,
    /// Whose address the attacker forges; counts what reaches it.
    Victim,
    /// A legitimate client.
    Client,
}

impl Leaf {
    /// Every leaf.
    pub const ALL: [Leaf; 4] = [Leaf::Server, Leaf::Attacker, Leaf::Victim, Leaf::Client];

    fn index(self) -> usize {
        self as usize
    }

    /// The leaf's address.
    pub fn v4(self) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, self.index() as u8 + 1, 2)
    }

    /// The hub's address on the leaf's spoke (the leaf's default gateway).
    pub fn hub_v4(self) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, self.index() as u8 + 1, 1)
    }

    fn role(self) -> &'static str {
        ["srv", "atk", "vic", "cli"][self.index()]
    }

    /// Device-name role letters: the leaf's end, the hub's end.
    fn dev_roles(self) -> (char, char) {
        [('v', 'h'), ('w', 'i'), ('x', 'j'), ('y', 'k')][self.index()]
    }
}

/// The hub and its four leaves (see the module docs), removed on drop. As with every net
/// here, drop sockets and join threads created in the namespaces first.
#[derive(Debug)]
pub struct StarNet {
    leaves: Vec<Namespace>,
    hub: Namespace,
    /// (leaf end, hub end) per leaf.
    devs: Vec<(String, String)>,
}

impl StarNet {
    /// Creates the five namespaces, the four veth pairs, addresses, routes, forwarding and
    /// static neighbours. On any error, whatever was created is removed before this returns.
    pub fn setup() -> Result<StarNet, Error> {
        crate::check_capable()?;
        let serial = next_serial();
        let pid = std::process::id();
        let hub = Namespace::create(&name_for(serial, "hub"))?;
        let mut leaves = Vec::new();
        for leaf in Leaf::ALL {
            leaves.push(Namespace::create(&name_for(serial, leaf.role()))?);
        }
        let devs = Leaf::ALL
            .iter()
            .map(|l| {
                let (a, b) = l.dev_roles();
                (link::dev_name(pid, serial, a), link::dev_name(pid, serial, b))
            })
            .collect();
        let net = StarNet { leaves, hub, devs };
        let no_rp = ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"];
        net.hub.exec(&["sysctl", "-q", "-w", no_rp[0], no_rp[1], "net.ipv4.ip_forward=1"])?;
        ip(&["-n", net.hub.name(), "link", "set", "dev", "lo", "up"])?;
        for leaf in Leaf::ALL {
            let (ns, (dev, hub_dev)) = (net.ns(leaf), &net.devs[leaf.index()]);
            ip(&[
                "-n",
                ns.name(),
                "link",
                "add",
                dev,
                "type",
                "veth",
                "peer",
                "name",
                hub_dev,
                "netns",
                net.hub.name(),
            ])?;
            ns.exec(&["sysctl", "-q", "-w", no_rp[0], no_rp[1]])?;
            ip(&["-n", ns.name(), "link", "set", "dev", "lo", "up"])?;
            ip(&["-n", ns.name(), "addr", "add", &format!("{}/24", leaf.v4()), "dev", dev])?;
            ip(&["-n", ns.name(), "link", "set", "dev", dev, "up"])?;
            ip(&["-n", net.hub.name(), "addr", "add", &format!("{}/24", leaf.hub_v4()), "dev", hub_dev])?;
            ip(&["-n", net.hub.name(), "link", "set", "dev", hub_dev, "up"])?;
            net.hub.exec(&["sysctl", "-q", "-w", &format!("net.ipv4.conf.{hub_dev}.rp_filter=0")])?;
            ns.exec(&["sysctl", "-q", "-w", &format!("net.ipv4.conf.{dev}.rp_filter=0")])?;
            ip(&["-n", ns.name(), "route", "add", "default", "via", &leaf.hub_v4().to_string(), "dev", dev])?;
            let hub_mac = link::mac(&net.hub, hub_dev)?;
            let leaf_mac = link::mac(ns, dev)?;
            link::static_neighbour(ns, dev, &leaf.hub_v4().to_string(), &hub_mac)?;
            link::static_neighbour(&net.hub, hub_dev, &leaf.v4().to_string(), &leaf_mac)?;
        }
        let forwarding = net.hub.exec(&["sysctl", "-n", "net.ipv4.ip_forward"])?;
        if forwarding.trim() != "1" {
            return Err(Error::SettingDidNotTake {
                dev: net.hub.name().to_owned(),
                setting: "net.ipv4.ip_forward".to_owned(),
                wanted: "1".to_owned(),
                got: forwarding.trim().to_owned(),
            });
        }
        Ok(net)
    }

    /// A leaf's namespace.
    pub fn ns(&self, leaf: Leaf) -> &Namespace {
        &self.leaves[leaf.index()]
    }

    /// The hub's namespace.
    pub fn hub(&self) -> &Namespace {
        &self.hub
    }

    /// A leaf's address ([`Leaf::v4`]).
    pub fn addr(&self, leaf: Leaf) -> Ipv4Addr {
        leaf.v4()
    }

    /// The leaf's device.
    pub fn dev(&self, leaf: Leaf) -> &str {
        &self.devs[leaf.index()].0
    }

    /// The victim's ear: a UDP socket on the victim's `port` that counts, for `listen`, the
    /// bytes that reach it and the datagrams `mark` picks out (say, data a server should never
    /// have sent to an unproven address). Join the thread for `(bytes, marked)`.
    pub fn victim_listens<F>(
        &self,
        port: u16,
        listen: Duration,
        mark: F,
    ) -> Result<std::thread::JoinHandle<(usize, usize)>, Error>
    where
        F: Fn(&[u8]) -> bool + Send + 'static,
    {
        let sock = self.ns(Leaf::Victim).run(move || -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind(SocketAddr::from((Leaf::Victim.v4(), port)))?;
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            Ok(s)
        });
        let sock = sock.map_err(|e| Error::io("bind the victim's socket", e))?;
        Ok(std::thread::spawn(move || {
            let (mut bytes, mut marked, mut buf) = (0usize, 0usize, [0u8; 2048]);
            let start = Instant::now();
            while start.elapsed() < listen {
                if let Ok((n, _)) = sock.recv_from(&mut buf) {
                    bytes += n;
                    marked += usize::from(mark(&buf[..n]));
                }
            }
            (bytes, marked)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_have_their_own_subnets_and_device_roles() {
        let mut roles = std::collections::HashSet::new();
        for l in Leaf::ALL {
            assert_eq!(l.v4().octets()[..3], l.hub_v4().octets()[..3]);
            let (a, b) = l.dev_roles();
            assert!(roles.insert(a) && roles.insert(b), "device names never collide");
        }
        assert!(Leaf::ALL.windows(2).all(|w| w[0].v4().octets()[2] != w[1].v4().octets()[2]));
    }
}
