//! Where the scale table's ends run (the namespaces and CPUs, or loopback), a server
//! running there, and its `/metrics` read from the server's side.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use udpx_lab::netns::{ChildGroup, Namespace, Profile, Side, TestNet, TestNetConfig};

use super::config::ScaleConfig;

/// Where the ends are: the namespaces (root) or loopback.
pub(super) struct Place {
    pub(super) net: Option<TestNet>,
    pub(super) server_ip: IpAddr,
    pub(super) client_ips: Vec<IpAddr>,
    pub(super) server_cpu: usize,
    pub(super) client_cpu: usize,
}

impl Place {
    pub(super) fn server_ns(&self) -> Option<&Namespace> {
        self.net.as_ref().map(|n| n.ns(Side::Rx))
    }

    pub(super) fn client_ns(&self) -> Option<&Namespace> {
        self.net.as_ref().map(|n| n.ns(Side::Tx))
    }

    /// `taskset -c CPU program`, in the server's namespace on the server's CPU.
    pub(super) fn server_command(&self, program: &Path) -> Command {
        Self::pinned(self.server_ns(), self.server_cpu, program)
    }

    /// The same in the client's namespace, on the client's CPU.
    pub(super) fn client_command(&self, program: &Path) -> Command {
        Self::pinned(self.client_ns(), self.client_cpu, program)
    }

    fn pinned(ns: Option<&Namespace>, cpu: usize, program: &Path) -> Command {
        let mut c = match ns {
            Some(ns) => ns.command("taskset"),
            None => Command::new("taskset"),
        };
        c.args(["-c", &cpu.to_string()]).arg(program);
        c
    }
}

pub(super) fn setup(cfg: &ScaleConfig) -> Result<Place, String> {
    let cpus = udpx_lab::cpu::online_cpus();
    let (client_cpu, server_cpu) = (cpus[0], *cpus.last().unwrap_or(&0));
    if !udpx_lab::netns::is_root() {
        return Ok(Place {
            net: None,
            server_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            client_ips: (0..cfg.addresses)
                .map(|k| IpAddr::V4(Ipv4Addr::new(127, 0, 1 + (k / 250) as u8, 1 + (k % 250) as u8)))
                .collect(),
            server_cpu,
            client_cpu,
        });
    }
    let net = TestNet::setup(&TestNetConfig::new(Profile::Offload)).map_err(|e| format!("veth pair: {e}"))?;
    crate::lab::receive_on_own_cpus(&net, cfg.napi, server_cpu, client_cpu)?;
    let mut client_ips = vec![IpAddr::V4(net.tx_v4)];
    let o = net.tx_v4.octets();
    for k in 1..cfg.addresses.clamp(1, 200) {
        let ip = Ipv4Addr::new(o[0], o[1], o[2], 10 + k as u8);
        net.tx
            .exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", &net.tx_dev])
            .map_err(|e| format!("client address {ip}: {e}"))?;
        client_ips.push(IpAddr::V4(ip));
    }
    Ok(Place { server_ip: IpAddr::V4(net.rx_v4), net: Some(net), client_ips, server_cpu, client_cpu })
}

/// A running server: its process, what it serves on.
pub(super) struct Running {
    pub(super) process: ChildGroup,
    pub(super) addr: SocketAddr,
    /// The udpx server's `/metrics`.
    pub(super) metrics: Option<SocketAddr>,
}

/// `GET /metrics` from `addr` (in the server's namespace): every sample's value summed by
/// name over its labels (the shards).
pub(super) fn scrape(place: &Place, addr: SocketAddr) -> Option<HashMap<String, f64>> {
    let f = move || -> Option<String> {
        use std::io::{Read, Write};
        let mut t = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        t.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        t.write_all(b"GET /metrics HTTP/1.0\r\nhost: bench\r\n\r\n").ok()?;
        let mut body = String::new();
        t.read_to_string(&mut body).ok()?;
        Some(body)
    };
    let text = match place.server_ns() {
        Some(ns) => ns.try_run(f).ok()??,
        None => f()?,
    };
    let mut out: HashMap<String, f64> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        let name = name.split('{').next().unwrap_or(name);
        if let Ok(v) = value.parse::<f64>() {
            *out.entry(name.to_string()).or_default() += v;
        }
    }
    Some(out)
}
