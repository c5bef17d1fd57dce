//! The self-test: a server and its receivers in one process, on the embedded default path (a
//! veth pair between two network namespaces when run as root, loopback otherwise).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use udpx_lab::netns::{self, Profile, TestNet, TestNetConfig};

use crate::client::{receive, Progress, RecvConfig, RecvReport, PORTS_PER_ADDRESS};
use crate::server::{ServeConfig, Server, ServerReport};
use crate::StreamError;

/// Where the self-test ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// Two namespaces joined by a veth pair.
    Veth,
    /// The loopback device.
    Loopback,
}

/// A self-test's results: the server's and the receiver's view.
#[derive(Debug)]
pub struct SelfTest {
    /// Where it ran.
    pub path: Path,
    /// The server's figures.
    pub server: ServerReport,
    /// The receiver's.
    pub receiver: RecvReport,
    /// Veth only: packets the pair itself dropped between the server and the receivers
    /// ([`netns::TestNet::link_drops`]); `None` on loopback or if unreadable.
    pub link_drops: Option<u64>,
}

impl SelfTest {
    /// Every datagram the server sent arrived exactly once (and the server counted none
    /// unsent).
    pub fn exactly_once(&self) -> bool {
        let s = &self.receiver.summary;
        s.datagrams == self.server.total.datagrams
            && s.duplicates == 0
            && s.lost == 0
            && self.server.total.unsent == 0
            && s.flows_ended == s.flows
    }
}

/// Runs `serve` and `recv` against each other. `serve.bind` and `recv.server`/`recv.local`
/// are filled in here; `progress` is updated as datagrams arrive.
pub fn self_test(
    mut serve: ServeConfig,
    mut recv: RecvConfig,
    progress: Arc<Progress>,
) -> Result<SelfTest, StreamError> {
    let addrs = u64::from(recv.flows).div_ceil(u64::from(PORTS_PER_ADDRESS)).max(1);
    if addrs > 200 {
        return Err(StreamError::Usage(format!("--flows {}: the self-test runs at most 5,000,000 flows", recv.flows)));
    }
    let addrs = addrs as u8;
    // The clients share one or a few addresses: caps left at their defaults are raised to fit
    // them (the report prints the caps in force).
    if serve.limits == crate::Limits::default() {
        serve.limits = crate::Limits::raised_for(recv.flows, recv.rate);
    }
    // Validated with as many (placeholder) local addresses as the self-test will add.
    recv.local = vec![IpAddr::V4(Ipv4Addr::LOCALHOST); addrs as usize];
    recv.validate()?;
    // With two CPUs or more: the server on the last, the receivers and their receive
    // processing on the first, so the server's CPU time is its own work.
    let cpus = udpx_lab::cpu::online_cpus();
    let split = cpus.len() >= 2;
    if split && serve.cpus.is_empty() {
        serve.cpus = vec![cpus[cpus.len() - 1]];
    }
    let rx_cpu = split.then(|| cpus[0]);
    if netns::is_root() {
        // The software profile: segmentation on the sender (no USO on the veth, like a NIC
        // without it), receive processing in the receiver's NAPI thread rather than charged to
        // the sender's system calls.
        let mut tc = TestNetConfig::new(Profile::Software);
        tc.rx_cpu = rx_cpu;
        let net = TestNet::setup(&tc).map_err(|e| StreamError::Setup(format!("the veth pair: {e}")))?;
        let mut local = vec![IpAddr::V4(net.rx_v4)];
        for k in 1..addrs {
            // Further client addresses in the receiver's namespace, same subnet.
            let o = net.rx_v4.octets();
            let extra = Ipv4Addr::new(o[0], o[1], o[2], o[3].wrapping_add(10 + k));
            net.rx
                .exec(&["ip", "addr", "add", &format!("{extra}/24"), "dev", &net.rx_dev])
                .map_err(|e| StreamError::Setup(format!("adding client address {extra}: {e}")))?;
            local.push(IpAddr::V4(extra));
        }
        serve.bind = SocketAddr::new(IpAddr::V4(net.tx_v4), 0);
        // What the pair dropped while it came up (neighbour discovery before both ends were
        // up) is not the run's.
        let drops_before = net.link_drops().ok();
        let server = net.tx.try_run(move || Server::start(serve)).map_err(setup)??;
        recv.server = server.local_addr();
        recv.local = local;
        let p = progress.clone();
        let receiver = net
            .rx
            .try_spawn(move || {
                if let Some(c) = rx_cpu {
                    let _ = udpx_lab::cpu::pin_current_thread(c);
                }
                receive(&recv, &p)
            })
            .map_err(setup)?;
        let receiver = receiver.join().map_err(|_| StreamError::Setup("the receiver panicked".into()));
        let server = server.stop()?;
        let link_drops = net.link_drops().ok().zip(drops_before).map(|(a, b)| a.saturating_sub(b));
        Ok(SelfTest { path: Path::Veth, server, receiver: receiver??, link_drops })
    } else {
        serve.bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let server = Server::start(serve)?;
        recv.server = server.local_addr();
        recv.local = (0..addrs).map(|k| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + k))).collect();
        let receiver = std::thread::spawn(move || {
            if let Some(c) = rx_cpu {
                let _ = udpx_lab::cpu::pin_current_thread(c);
            }
            receive(&recv, &progress)
        })
        .join()
        .map_err(|_| StreamError::Setup("the receiver panicked".into()))?;
        let server = server.stop()?;
        Ok(SelfTest { path: Path::Loopback, server, receiver: receiver?, link_drops: None })
    }
}

fn setup(e: netns::Error) -> StreamError {
    StreamError::Setup(format!("entering a namespace: {e}"))
}

/// How long a self-test takes at most: the flows' duration, the receiver's grace, margin.
pub fn bound(recv: &RecvConfig) -> Duration {
    recv.duration + crate::client::GRACE + Duration::from_secs(10)
}
