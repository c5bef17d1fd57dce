//! A one-machine lab for the balancer: a client, a balancer running the generated rules, and
//! two or three hosts, each a network namespace; removed on drop, also when a test panics.
//!
//! ```text
//!  udpx-<pid>-<n>-lbcli        udpx-<pid>-<n>-lbbal                      udpx-<pid>-<n>-lbh<i>
//! +------------------+      +----------------------------------+      +----------------------+
//! | 10.78.0.2/24     |<---->| 10.78.0.1/24     10.78.<i>.1/24  |<---->| 10.78.<i>.2/24       |
//! | (10.78.0.3: the  | veth | nft table udpx_lb, ip_forward=1  | veth | VIP 10.78.100.1 on lo|
//! |  rebound address)|      | ip rule fwmark M table M         |      | (stateless mode)     |
//! +------------------+      +----------------------------------+      +----------------------+
//! ```
//!
//! The addresses are from 10.78.0.0/16 (RFC 1918) and exist only inside these namespaces. The
//! hosts' answers go back through the balancer (their default route), which forwards them
//! untouched: in the stateless mode they leave from the VIP itself, so reverse-path filtering
//! is off everywhere. Host `i` (from 1) has server ID `0x0100 + i`, so IDs and marks differ as
//! they would in a real deployment.
//!
//! Beside the generated table `udpx_lb`, the balancer holds the lab's own table
//! `udpx_lab_obs`: packets to the service port forwarded towards each host
//! ([`Lab::host_packets`]), so a test sees where a connection's packets went without trusting
//! the rules under test. [`Lab::rebind_client_to`] moves the client to another address mid-run
//! (a stateless nft rewrite in the client's namespace, as a rebinding NAT would), and
//! [`Lab::use_four_tuple_rules`] swaps in a CID-blind balancer for the contrast.
//!
//! The servers are `udpx h3 serve` processes (the lab is handed the binary's path: this crate
//! does not depend on the HTTP/3 tool), each in a [`ChildGroup`] started with `ip netns exec`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use udpx_lab::netns::{run_bounded, unique_name, ChildGroup, Error, Namespace, MAX_IFNAME_LEN};

use crate::nft::{Balancer, Host, Mode, TABLE};

/// The service address the client talks to.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 78, 100, 1);
/// The client's address.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
/// The address [`Lab::rebind_client`] turns the client's packets into, as a NAT would.
pub const CLIENT_REBOUND: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 3);
/// The balancer's address on the client's side.
pub const BALANCER_CLIENT: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
/// The UDP port the servers listen on.
pub const PORT: u16 = 443;
/// Most hosts a lab has.
pub const MAX_LAB_HOSTS: usize = 3;

const TOOL_TIMEOUT: Duration = Duration::from_secs(20);

/// Host `i`'s address (from 1).
pub fn host_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78, i as u8, 2)
}

/// The balancer's address towards host `i` (from 1).
pub fn balancer_host_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78, i as u8, 1)
}

/// Host `i`'s server ID (from 1).
pub fn host_id(i: usize) -> u16 {
    0x0100 + i as u16
}

/// What [`Lab::setup`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabConfig {
    /// Hosts behind the balancer, 2 to [`MAX_LAB_HOSTS`].
    pub hosts: usize,
    /// The balancer's mode.
    pub mode: Mode,
}

impl Default for LabConfig {
    /// Three hosts, stateless.
    fn default() -> LabConfig {
        LabConfig { hosts: 3, mode: Mode::Stateless }
    }
}

/// A running server of the lab.
#[derive(Debug)]
struct Server {
    process: ChildGroup,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// The lab. Fields drop in order: the servers first (killed and reaped), then the namespaces
/// (which removes the veth pairs), then the scratch directory.
#[derive(Debug)]
pub struct Lab {
    servers: Vec<Server>,
    /// The `udpx` binary the servers run (the clients run it too).
    udpx: Option<PathBuf>,
    client: Namespace,
    balancer: Namespace,
    hosts: Vec<Namespace>,
    client_dev: String,
    balancer_client_dev: String,
    balancer_cfg: Balancer,
    /// The addresses the client was rebound to so far (their mappings stay, as in a NAT).
    rebound: std::sync::Mutex<Vec<Ipv4Addr>>,
    scratch: Scratch,
}

/// A directory removed on drop.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Lab {
    /// Creates the namespaces, veth pairs, addresses and routes, loads the generated ruleset
    /// and policy routes into the balancer, and puts the VIP on every host (stateless mode).
    /// On any error, whatever exists is removed before this returns.
    pub fn setup(cfg: &LabConfig) -> Result<Lab, Error> {
        if !(2..=MAX_LAB_HOSTS).contains(&cfg.hosts) {
            return Err(Error::InvalidConfig { why: format!("{} hosts: the lab has 2 to {MAX_LAB_HOSTS}", cfg.hosts) });
        }
        udpx_lab::netns::check_capable()?;
        let hosts: Vec<Host> = (1..=cfg.hosts).map(|i| Host { id: host_id(i), next_hop: host_addr(i) }).collect();
        // One seed for the lab's life, as an operator keeps it across reloads (`--seed`).
        let mut seed = [0u8; 4];
        udpx_quic::cid::random_bytes(&mut seed)
            .map_err(|e| Error::InvalidConfig { why: format!("no randomness for the hash seed: {e}") })?;
        let balancer_cfg = Balancer::new(VIP, PORT, hosts, cfg.mode)
            .map_err(|e| Error::InvalidConfig { why: format!("lab balancer: {e}") })?
            .with_seed(u32::from_ne_bytes(seed));
        let scratch = std::env::temp_dir().join(unique_name("lb-lab"));
        std::fs::create_dir_all(&scratch)
            .map_err(|e| Error::InvalidConfig { why: format!("{}: {e}", scratch.display()) })?;
        let scratch = Scratch(scratch);
        let client = Namespace::create(&unique_name("lbcli"))?;
        let balancer = Namespace::create(&unique_name("lbbal"))?;
        let mut host_ns = Vec::new();
        for i in 1..=cfg.hosts {
            host_ns.push(Namespace::create(&unique_name(&format!("lbh{i}")))?);
        }
        let pid = std::process::id();
        let serial = scratch_serial(&scratch.0);
        let lab = Lab {
            servers: Vec::new(),
            udpx: None,
            client,
            balancer,
            hosts: host_ns,
            client_dev: dev_name(pid, serial, 'c'),
            balancer_client_dev: dev_name(pid, serial, 'd'),
            balancer_cfg,
            rebound: std::sync::Mutex::new(Vec::new()),
            scratch,
        };
        lab.wire()?;
        Ok(lab)
    }

    fn wire(&self) -> Result<(), Error> {
        let pid = std::process::id();
        let serial = scratch_serial(&self.scratch.0);
        let bal = &self.balancer;
        let mut all: Vec<&Namespace> = vec![&self.client, bal];
        all.extend(self.hosts.iter());
        for ns in &all {
            ns.exec(&["ip", "link", "set", "dev", "lo", "up"])?;
            ns.exec(&["sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"])?;
        }
        bal.exec(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
        // Client <-> balancer.
        let (cd, bd) = (self.client_dev.as_str(), self.balancer_client_dev.as_str());
        veth(bal, bd, &self.client, cd)?;
        addr_up(&self.client, cd, CLIENT)?;
        addr_up(bal, bd, BALANCER_CLIENT)?;
        self.client.exec(&["ip", "route", "add", "default", "via", &BALANCER_CLIENT.to_string()])?;
        // Balancer <-> each host.
        for (k, ns) in self.hosts.iter().enumerate() {
            let i = k + 1;
            let (b, h) = (dev_name(pid, serial, host_role(i, true)), dev_name(pid, serial, host_role(i, false)));
            veth(bal, &b, ns, &h)?;
            addr_up(bal, &b, balancer_host_addr(i))?;
            addr_up(ns, &h, host_addr(i))?;
            ns.exec(&["ip", "route", "add", "default", "via", &balancer_host_addr(i).to_string()])?;
            if self.balancer_cfg.mode() == Mode::Stateless {
                ns.exec(&["ip", "addr", "add", &format!("{VIP}/32"), "dev", "lo"])?;
            }
        }
        // The generated rules, exactly as `udpx lb nft` prints them.
        self.load_nft(bal, "balancer.nft", &self.balancer_cfg.ruleset())?;
        for cmd in self.balancer_cfg.route_commands() {
            let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            bal.exec(&args)?;
        }
        // The lab's own view: packets to the service forwarded towards each host.
        let mut obs = String::from("table ip udpx_lab_obs {\n");
        for i in 1..=self.hosts.len() {
            let _ = writeln!(obs, "\tcounter h{i} {{ }}");
        }
        obs.push_str("\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n");
        for i in 1..=self.hosts.len() {
            let dev = dev_name(pid, serial, host_role(i, true));
            let _ = writeln!(obs, "\t\toifname \"{dev}\" udp dport {PORT} counter name \"h{i}\"");
        }
        obs.push_str("\t}\n}\n");
        self.load_nft(bal, "observe.nft", &obs)
    }

    fn load_nft(&self, ns: &Namespace, file: &str, rules: &str) -> Result<(), Error> {
        let path = self.scratch.0.join(file);
        std::fs::write(&path, rules).map_err(|e| Error::InvalidConfig { why: format!("{}: {e}", path.display()) })?;
        ns.exec_timeout(&["nft", "-f", &path.to_string_lossy()], TOOL_TIMEOUT).map(drop)
    }

    /// The balancer's configuration (what `udpx lb nft` would be given).
    pub fn balancer_config(&self) -> &Balancer {
        &self.balancer_cfg
    }

    /// The client's namespace.
    pub fn client(&self) -> &Namespace {
        &self.client
    }

    /// The balancer's namespace.
    pub fn balancer(&self) -> &Namespace {
        &self.balancer
    }

    /// Host `i`'s namespace (from 1).
    pub fn host(&self, i: usize) -> &Namespace {
        &self.hosts[i - 1]
    }

    /// How many hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// Where the servers listen: the VIP (stateless) or each host's own address (DNAT).
    pub fn listen_addr(&self, i: usize) -> SocketAddrV4 {
        match self.balancer_cfg.mode() {
            Mode::Stateless => SocketAddrV4::new(VIP, PORT),
            Mode::Dnat => SocketAddrV4::new(host_addr(i), PORT),
        }
    }

    /// The URL of `path` on the VIP.
    pub fn url(&self, path: &str) -> String {
        format!("https://{VIP}:{PORT}/{}", path.trim_start_matches('/'))
    }

    /// Starts `udpx h3 serve DIR --host-id <id> --listen <addr> --shards 1 -l <secs>
    /// --key-file <one key for all>` on every host (`udpx` is the binary's path) and waits
    /// until each has announced itself.
    pub fn start_servers(&mut self, udpx: &Path, dir: &Path, secs: u32) -> Result<(), Error> {
        self.udpx = Some(udpx.to_path_buf());
        let key_file = self.scratch.0.join("reset.key");
        let mut key = [0u8; 32];
        udpx_quic::cid::random_bytes(&mut key)
            .map_err(|e| Error::InvalidConfig { why: format!("no randomness for the reset key: {e}") })?;
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt;
            // The owner's alone, as `udpx h3 serve --key-file` requires.
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&key_file)
                .and_then(|mut f| f.write_all(hex.as_bytes()))
                .map_err(|e| Error::InvalidConfig { why: format!("{}: {e}", key_file.display()) })?;
        }
        // The hosts taken out ([`Lab::remove_host`] writes it and tells the servers).
        let removed_file = self.scratch.0.join("removed-hosts");
        std::fs::write(&removed_file, "")
            .map_err(|e| Error::InvalidConfig { why: format!("{}: {e}", removed_file.display()) })?;
        for i in 1..=self.hosts.len() {
            let stdout = self.scratch.0.join(format!("h{i}.out"));
            let stderr = self.scratch.0.join(format!("h{i}.err"));
            let file =
                |p: &Path| File::create(p).map_err(|e| Error::InvalidConfig { why: format!("{}: {e}", p.display()) });
            let mut cmd = self.hosts[i - 1].command(&udpx.to_string_lossy());
            cmd.args(["h3", "serve"])
                .arg(dir)
                .args(["--host-id", &host_id(i).to_string(), "--listen", &self.listen_addr(i).to_string()])
                .args(["--shards", "1", "-l", &secs.to_string()])
                // Stopped at a test's end, often with a client killed mid-download: 2 s of
                // drain, not the default 30 s of waiting for a connection that will not finish.
                .args(["--drain-timeout", "2"])
                .arg("--key-file")
                .arg(&key_file)
                .arg("--removed-hosts")
                .arg(&removed_file)
                // Behind dnat, conntrack pins a client's 4-tuple to one host whatever IDs its
                // later packets carry: a host answering another host's IDs with resets would
                // hand an attacker their tokens (RFC 9000 21.11). No resets in that mode.
                .args(if self.balancer_cfg.mode() == Mode::Dnat { &["--no-stateless-resets"][..] } else { &[][..] })
                .stdin(Stdio::null())
                .stdout(file(&stdout)?)
                .stderr(file(&stderr)?);
            let process = ChildGroup::spawn(&mut cmd)
                .map_err(|e| Error::InvalidConfig { why: format!("start {}: {e}", udpx.display()) })?;
            self.servers.push(Server { process, stdout, stderr });
        }
        let start = Instant::now();
        for s in &self.servers {
            loop {
                let err = std::fs::read_to_string(&s.stderr).unwrap_or_default();
                if err.contains(" on https://") {
                    break;
                }
                if start.elapsed() > Duration::from_secs(15) {
                    return Err(Error::InvalidConfig {
                        why: format!("a server did not start in 15 s: {}", err.trim()),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Starts `udpx h3 get` of `path` on the VIP in the client's namespace (the binary
    /// [`Lab::start_servers`] was given), the body into `out`, its standard error into `out`
    /// with extension `err`.
    pub fn download(&self, path: &str, out: &Path) -> Result<ChildGroup, Error> {
        let udpx = self.udpx.as_deref().ok_or_else(|| Error::InvalidConfig { why: "no servers started".into() })?;
        let err = out.with_extension("err");
        let err = File::create(&err).map_err(|e| Error::InvalidConfig { why: format!("{}: {e}", err.display()) })?;
        let mut cmd = self.client.command(&udpx.to_string_lossy());
        cmd.args(["h3", "get", &self.url(path), "-o"]).arg(out).stdin(Stdio::null()).stdout(Stdio::null()).stderr(err);
        ChildGroup::spawn(&mut cmd).map_err(|e| Error::InvalidConfig { why: format!("start {}: {e}", udpx.display()) })
    }

    /// The balancer's device towards the client (for the environment record).
    pub fn balancer_client_dev(&self) -> &str {
        &self.balancer_client_dev
    }

    /// Stops every server with SIGTERM and returns what each printed on stdout (its JSON
    /// counters) and stderr, host 1 first.
    pub fn stop_servers(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for s in self.servers.drain(..) {
            // `ip netns exec` execs the server, so the pid is the server's.
            let _ = Command::new("kill").args(["-TERM", &s.process.id().to_string()]).status();
            let _ = s.process.wait();
            out.push((
                std::fs::read_to_string(&s.stdout).unwrap_or_default(),
                std::fs::read_to_string(&s.stderr).unwrap_or_default(),
            ));
        }
        out
    }

    /// The balancer's named counters ([`crate::nft::COUNTERS`]): name -> packets.
    pub fn counters(&self) -> Result<BTreeMap<String, u64>, Error> {
        let out = self.balancer.exec(&["nft", "list", "counters", "table", "ip", TABLE])?;
        Ok(parse_counters(&out))
    }

    /// Packets to the service's port the balancer forwarded towards each host so far, host 1
    /// first (the lab's own counters, in table `udpx_lab_obs`).
    pub fn host_packets(&self) -> Result<Vec<u64>, Error> {
        let c = parse_counters(&self.balancer.exec(&["nft", "list", "counters", "table", "ip", "udpx_lab_obs"])?);
        Ok((1..=self.hosts.len()).map(|i| c.get(&format!("h{i}")).copied().unwrap_or(0)).collect())
    }

    /// Takes host `i` (from 1) out of the balancer as an operator would: the servers that stay
    /// are told (its ID written to their `--removed-hosts` file, then SIGHUP), so they may
    /// answer its connections with stateless resets; the ruleset generated for the other hosts
    /// replaces the loaded one (atomically, `nft -f`; the same hash seed). No route changes:
    /// marks are host IDs, so every other host keeps its mark and table. Host `i`'s server
    /// keeps running: packets of its connections now reach another host.
    pub fn remove_host(&mut self, i: usize) -> Result<(), Error> {
        let hosts: Vec<Host> = self.balancer_cfg.hosts().iter().filter(|h| h.id != host_id(i)).copied().collect();
        if hosts.len() == self.balancer_cfg.hosts().len() || hosts.is_empty() {
            return Err(Error::InvalidConfig { why: format!("host {i}: not in the balancer, or the last one") });
        }
        let mut cfg = Balancer::new(VIP, PORT, hosts, self.balancer_cfg.mode())
            .map_err(|e| Error::InvalidConfig { why: format!("lab balancer: {e}") })?;
        if let Some(seed) = self.balancer_cfg.seed() {
            cfg = cfg.with_seed(seed);
        }
        if !self.servers.is_empty() {
            let removed = self.scratch.0.join("removed-hosts");
            let gone: Vec<String> = self
                .balancer_cfg
                .hosts()
                .iter()
                .filter(|h| !cfg.hosts().contains(h))
                .map(|h| format!("{:#06x}", h.id))
                .collect();
            std::fs::write(&removed, gone.join("\n") + "\n")
                .map_err(|e| Error::InvalidConfig { why: format!("{}: {e}", removed.display()) })?;
            for (k, s) in self.servers.iter().enumerate() {
                if cfg.host(host_id(k + 1)).is_some() {
                    let _ = Command::new("kill").args(["-HUP", &s.process.id().to_string()]).status();
                }
            }
        }
        self.load_nft(&self.balancer, "balancer-without.nft", &cfg.ruleset())?;
        self.balancer_cfg = cfg;
        Ok(())
    }

    /// Drains host `i` (from 1): new rules with the same hosts and seed in which host `i` keeps
    /// every packet its connection IDs name and gets no new connection
    /// ([`Balancer::with_draining`]), loaded atomically; no route changes.
    pub fn drain_host(&mut self, i: usize) -> Result<(), Error> {
        let mut cfg = Balancer::new(VIP, PORT, self.balancer_cfg.hosts().to_vec(), self.balancer_cfg.mode())
            .and_then(|b| b.with_draining(&[host_id(i)]))
            .map_err(|e| Error::InvalidConfig { why: format!("lab balancer: {e}") })?;
        if let Some(seed) = self.balancer_cfg.seed() {
            cfg = cfg.with_seed(seed);
        }
        self.load_nft(&self.balancer, "balancer-draining.nft", &cfg.ruleset())?;
        self.balancer_cfg = cfg;
        Ok(())
    }

    /// Loads the generated CID rules again (after [`Lab::use_four_tuple_rules`]).
    pub fn use_cid_rules(&self) -> Result<(), Error> {
        self.load_nft(&self.balancer, "balancer.nft", &self.balancer_cfg.ruleset())
    }

    /// Ends a rebinding: the client's packets leave from its own address again.
    pub fn undo_rebind(&self) -> Result<(), Error> {
        self.client.exec(&["nft", "delete", "table", "ip", "udpx_rebind"]).map(drop)
    }

    /// Replaces the balancer's rules with [`Balancer::four_tuple_ruleset`]: a balancer blind to
    /// connection IDs, for the contrast.
    pub fn use_four_tuple_rules(&self) -> Result<(), Error> {
        self.load_nft(&self.balancer, "four-tuple.nft", &self.balancer_cfg.four_tuple_ruleset())
    }

    /// Rewrites the client's address to [`CLIENT_REBOUND`] from then on: see
    /// [`Lab::rebind_client_to`].
    pub fn rebind_client(&self) -> Result<(), Error> {
        self.rebind_client_to(CLIENT_REBOUND)
    }

    /// Rewrites the client's address from then on, as a NAT that rebinds would: a stateless nft
    /// rule in the client's namespace turns [`CLIENT`] into `addr` (in 10.78.0.0/24, not an
    /// address of the lab) on the way out and back on the way in, so the client's socket sees
    /// nothing and the hosts see a new address. Calling it again moves to another address; the
    /// earlier ones keep their way in, as a NAT keeps a mapping until it expires, so packets a
    /// server still sends to an earlier address reach the client (which answers from the new
    /// one). Returns after the rules are loaded.
    pub fn rebind_client_to(&self, addr: Ipv4Addr) -> Result<(), Error> {
        self.rebind(addr, None)
    }

    /// Rewrites the client's source port too, from the port of its one UDP socket to
    /// `new_port` (and back on the way in), besides the address: a NAT that rebinds both.
    pub fn rebind_client_port(&self, addr: Ipv4Addr, new_port: u16) -> Result<(), Error> {
        let ports = self.client_udp_ports()?;
        let [port] = ports[..] else {
            return Err(Error::InvalidConfig {
                why: format!("the client has UDP sockets on ports {ports:?}, not one"),
            });
        };
        self.rebind(addr, Some((port, new_port)))
    }

    /// The local ports of the UDP sockets in the client's namespace.
    pub fn client_udp_ports(&self) -> Result<Vec<u16>, Error> {
        let out = self.client.exec(&["ss", "-Huan"])?;
        Ok(out.lines().filter_map(|l| l.split_whitespace().nth(3)?.rsplit_once(':')?.1.parse().ok()).collect())
    }

    fn rebind(&self, addr: Ipv4Addr, ports: Option<(u16, u16)>) -> Result<(), Error> {
        let o = addr.octets();
        if o[..3] != [10, 78, 0] || [CLIENT, BALANCER_CLIENT].contains(&addr) || o[3] == 0 || o[3] == 255 {
            return Err(Error::InvalidConfig { why: format!("rebind to {addr}: give a free address of 10.78.0.0/24") });
        }
        // The balancer delivers the new address to the client's device.
        let mac = self.client.exec(&["cat", &format!("/sys/class/net/{}/address", self.client_dev)])?;
        let bd = self.balancer_client_dev.as_str();
        self.balancer.exec(&[
            "ip",
            "neigh",
            "replace",
            &addr.to_string(),
            "lladdr",
            mac.trim(),
            "dev",
            bd,
            "nud",
            "permanent",
        ])?;
        // Every address rebound to so far (without a port rewrite) still comes back in.
        let back_in = {
            let mut r = self.rebound.lock().unwrap_or_else(|e| e.into_inner());
            if !r.contains(&addr) {
                r.push(addr);
            }
            match ports {
                None => r.iter().map(Ipv4Addr::to_string).collect::<Vec<_>>().join(", "),
                Some(_) => addr.to_string(),
            }
        };
        // Matches, then rewrites: (out match, out set, in match, in set).
        let (om, os, im, is) = match ports {
            Some((old, new)) => (
                format!(" udp sport {old}"),
                format!(" udp sport set {new}"),
                format!(" udp dport {new}"),
                format!(" udp dport set {old}"),
            ),
            None => Default::default(),
        };
        let rules = format!(
            "table ip udpx_rebind\ndelete table ip udpx_rebind\n\
             table ip udpx_rebind {{\n\
             \tcounter out {{ }}\n\
             \tcounter in {{ }}\n\
             \tchain output {{\n\
             \t\ttype filter hook output priority raw; policy accept;\n\
             \t\tip saddr {CLIENT} ip daddr {VIP}{om} notrack ip saddr set {addr}{os} counter name \"out\"\n\
             \t}}\n\
             \tchain prerouting {{\n\
             \t\ttype filter hook prerouting priority raw; policy accept;\n\
             \t\tip saddr {VIP} ip daddr {{ {back_in} }}{im} notrack ip daddr set {CLIENT}{is} counter name \"in\"\n\
             \t}}\n\
             }}\n"
        );
        self.load_nft(&self.client, "rebind.nft", &rules)
    }

    /// The client's rebinding counters (`out`, `in`), after [`Lab::rebind_client`].
    pub fn rebind_counters(&self) -> Result<BTreeMap<String, u64>, Error> {
        Ok(parse_counters(&self.client.exec(&["nft", "list", "counters", "table", "ip", "udpx_rebind"])?))
    }

    /// Limits the balancer's egress towards the client to `bits_per_sec` (a `tbf`), so that a
    /// download lasts long enough to change something in the middle of it.
    pub fn limit_client_rate(&self, bits_per_sec: u64) -> Result<(), Error> {
        let rate = format!("{bits_per_sec}bit");
        let dev = self.balancer_client_dev.as_str();
        self.balancer
            .exec(&[
                "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst", "32kb", "latency", "100ms",
            ])
            .map(drop)
    }
}

/// `nft list counters` output -> counter name -> packets.
///
/// ```text
/// table ip udpx_lb {
///         counter short_cid {
///                 packets 12 bytes 3456
///         }
/// ```
pub fn parse_counters(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut name = None;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("counter ") {
            name = rest.split_whitespace().next().map(str::to_owned);
        } else if let (Some(n), Some(rest)) = (name.as_ref(), line.strip_prefix("packets ")) {
            if let Some(p) = rest.split_whitespace().next().and_then(|p| p.parse().ok()) {
                out.insert(n.clone(), p);
            }
            name = None;
        }
    }
    out
}

/// A veth pair: `a` in `ns_a`, `b` in `ns_b`.
fn veth(ns_a: &Namespace, a: &str, ns_b: &Namespace, b: &str) -> Result<(), Error> {
    run_bounded(
        Command::new("ip").args([
            "-n",
            ns_a.name(),
            "link",
            "add",
            a,
            "type",
            "veth",
            "peer",
            "name",
            b,
            "netns",
            ns_b.name(),
        ]),
        TOOL_TIMEOUT,
    )
    .map(drop)
}

fn addr_up(ns: &Namespace, dev: &str, addr: Ipv4Addr) -> Result<(), Error> {
    ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", dev])?;
    ns.exec(&["ip", "link", "set", "dev", dev, "up"])?;
    ns.exec(&["sysctl", "-q", "-w", &format!("net.ipv4.conf.{dev}.rp_filter=0")]).map(drop)
}

/// The per-lab number in device names: the scratch directory's name ends with the serial
/// [`unique_name`] took (`udpx-<pid>-<serial>-lb-lab`).
fn scratch_serial(dir: &Path) -> u32 {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.split('-').nth(2).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Device roles: `c` client, `d` balancer towards the client, `k`/`l`/`m` balancer towards
/// host 1/2/3, `x`/`y`/`z` host 1/2/3.
fn host_role(i: usize, balancer_side: bool) -> char {
    let roles = if balancer_side { ['k', 'l', 'm'] } else { ['x', 'y', 'z'] };
    roles[(i - 1) % roles.len()]
}

/// `ux<pid><role><n>`, cut to fit [`MAX_IFNAME_LEN`] as the lab's other networks do.
fn dev_name(pid: u32, serial: u32, role: char) -> String {
    let room = MAX_IFNAME_LEN.saturating_sub(pid.to_string().len() + 3).clamp(1, 9);
    format!("ux{pid}{role}{}", serial % 10u32.pow(room as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse() {
        let text = "table ip udpx_lb {\n\tcounter short_cid {\n\t\tpackets 12 bytes 3456\n\t}\n\
                    \tcounter fallback {\n\t\tpackets 0 bytes 0\n\t}\n}\n";
        let c = parse_counters(text);
        assert_eq!(c.get("short_cid"), Some(&12));
        assert_eq!(c.get("fallback"), Some(&0));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn names_and_addresses() {
        for pid in [1, 4_194_304] {
            for role in ['c', 'd', 'k', 'z'] {
                let n = dev_name(pid, u32::MAX, role);
                assert!(n.len() <= MAX_IFNAME_LEN, "{n}");
            }
        }
        assert_eq!(scratch_serial(Path::new("/tmp/udpx-123-7-lb-lab")), 7);
        let all: Vec<Ipv4Addr> = (1..=3)
            .flat_map(|i| [host_addr(i), balancer_host_addr(i)])
            .chain([VIP, CLIENT, CLIENT_REBOUND, BALANCER_CLIENT])
            .collect();
        assert!(all.iter().all(|a| a.is_private()));
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
        assert_ne!(host_id(1), 1, "IDs differ from marks");
    }
}
