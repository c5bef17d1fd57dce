//! Privileged tests: real namespaces and veth pairs. Each starts with the capability check and
//! prints `SKIP: ...` when not root. Every receive has a 1 s timeout, so each test is bounded
//! well under 10 s.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use udpx_netns::{
    cleanup_stale, live_namespaces, run_bounded, Error, Namespace, Napi, Profile, Side, TestNet, TestNetConfig,
};

const TIMEOUT: Duration = Duration::from_secs(1);

/// The names `ip netns list` shows (it prints `name (id: N)` once a namespace has an id).
fn listed_namespaces() -> Vec<String> {
    let out = run_bounded(Command::new("ip").args(["netns", "list"]), Duration::from_secs(5)).expect("ip netns list");
    out.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

/// Binds a receiver in `rx` and a sender in `tx`, sends one datagram to `dst`, and checks that
/// it arrives intact from the tx address. Sockets are used from this thread, not the ones that
/// created them.
fn send_one(net: &TestNet, src: IpAddr, dst: IpAddr) {
    let receiver = net.rx.run(move || {
        let s = UdpSocket::bind(SocketAddr::new(dst, 0)).expect("bind receiver");
        s.set_read_timeout(Some(TIMEOUT)).expect("read timeout");
        s
    });
    let sender = net.tx.run(move || UdpSocket::bind(SocketAddr::new(src, 0)).expect("bind sender"));
    let to = receiver.local_addr().unwrap();
    let payload = format!("hello {dst} over {}", net.profile);
    sender.send_to(payload.as_bytes(), to).expect("send");
    let mut buf = [0u8; 2048];
    let (n, from) =
        receiver.recv_from(&mut buf).unwrap_or_else(|e| panic!("nothing arrived at {to} within {TIMEOUT:?}: {e}"));
    assert_eq!(&buf[..n], payload.as_bytes());
    assert_eq!(from, sender.local_addr().unwrap());
}

fn check_profile(profile: Profile, rx_cpu: Option<usize>) -> TestNet {
    let cfg = TestNetConfig { rx_cpu, ..TestNetConfig::new(profile) };
    let net = TestNet::setup(&cfg).expect("setup");
    println!(
        "{profile}: setup took {:?}, devices {} / {}, NAPI threads {:?}",
        net.setup_time, net.tx_dev, net.rx_dev, net.rx_napi_threads
    );
    send_one(&net, net.tx_v4.into(), net.rx_v4.into());
    send_one(&net, net.tx_v6.into(), net.rx_v6.into());
    net
}

#[test]
fn offload_profile_carries_udp_v4_and_v6() {
    if udpx_netns::skip_unless_capable("offload_profile_carries_udp_v4_and_v6") {
        return;
    }
    let net = check_profile(Profile::Offload, None);
    let tx = net.features(Side::Tx).unwrap();
    assert_eq!(tx["tx-udp-segmentation"], "on");
    assert!(net.rx_napi_threads.is_empty());
    assert_eq!(net.mtu, 1500);
}

#[test]
fn software_profile_carries_udp_v4_and_v6() {
    if udpx_netns::skip_unless_capable("software_profile_carries_udp_v4_and_v6") {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rx_cpu = cpus - 1;
    let net = check_profile(Profile::Software, Some(rx_cpu));
    let tx = net.features(Side::Tx).unwrap();
    let rx = net.features(Side::Rx).unwrap();
    assert_eq!(tx["tx-udp-segmentation"], "off");
    assert_eq!(rx["generic-receive-offload"], "on");
    assert_eq!(rx["rx-udp-gro-forwarding"], "on");
    assert!(!net.rx_napi_threads.is_empty());
    for t in &net.rx_napi_threads {
        assert!(t.name.starts_with(&format!("napi/{}-", net.rx_dev)), "{t:?}");
        let status = std::fs::read_to_string(format!("/proc/{}/status", t.pid)).unwrap();
        let allowed = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim();
        assert_eq!(allowed, rx_cpu.to_string(), "{t:?}");
    }
}

#[test]
fn jumbo_mtu_is_applied() {
    if udpx_netns::skip_unless_capable("jumbo_mtu_is_applied") {
        return;
    }
    let cfg = TestNetConfig { mtu: 9000, ..TestNetConfig::default() };
    let net = TestNet::setup(&cfg).unwrap();
    assert_eq!(net.mtu, 9000);
    let link = net.rx.exec(&["ip", "-o", "link", "show", "dev", &net.rx_dev]).unwrap();
    assert!(link.contains(" mtu 9000 "), "{link}");
}

#[test]
fn drop_removes_namespaces_and_napi_threads() {
    if udpx_netns::skip_unless_capable("drop_removes_namespaces_and_napi_threads") {
        return;
    }
    let net = TestNet::setup(&TestNetConfig::new(Profile::Software)).unwrap();
    let names = [net.tx.name().to_owned(), net.rx.name().to_owned()];
    let napi: Vec<u32> = net.rx_napi_threads.iter().map(|t| t.pid).collect();
    let listed = listed_namespaces();
    let live = live_namespaces();
    for name in &names {
        assert!(listed.contains(name), "{name} not in {listed:?}");
        assert!(live.contains(name), "{name} not in {live:?}");
    }
    let start = Instant::now();
    drop(net);
    println!("drop took {:?}", start.elapsed());
    let listed = listed_namespaces();
    let live = live_namespaces();
    for name in &names {
        assert!(!listed.contains(name), "{name} still in {listed:?}");
        assert!(!live.contains(name), "{name} still in {live:?}");
    }
    // The kernel frees the namespaces, and with them the veth and its NAPI thread,
    // asynchronously (cleanup_net runs from a workqueue, later still on a busy machine): what
    // is judged is that they go, not how fast, so the bound is generous.
    let deadline = Instant::now() + Duration::from_secs(30);
    while napi.iter().any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()) {
        assert!(Instant::now() < deadline, "NAPI threads {napi:?} outlived the veth");
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("NAPI threads gone {:?} after drop", start.elapsed());
}

#[test]
fn existing_name_is_refused_and_left_intact() {
    if udpx_netns::skip_unless_capable("existing_name_is_refused_and_left_intact") {
        return;
    }
    let first = Namespace::create_unique("exists").unwrap();
    let err = Namespace::create(first.name()).unwrap_err();
    assert!(matches!(err, Error::Exists { ref name } if name == first.name()), "{err:?}");
    assert!(listed_namespaces().contains(&first.name().to_owned()));
    // Still usable: a thread can enter it and see its (down) loopback.
    let out = first.exec(&["ip", "-o", "link", "show", "lo"]).unwrap();
    assert!(out.contains("lo"), "{out}");
    first.run(|| UdpSocket::bind("0.0.0.0:0").expect("socket in namespace"));
}

#[test]
fn panic_inside_a_test_still_cleans_up() {
    if udpx_netns::skip_unless_capable("panic_inside_a_test_still_cleans_up") {
        return;
    }
    let names = Mutex::new(Vec::new());
    let result = catch_unwind(AssertUnwindSafe(|| {
        let net = TestNet::setup(&TestNetConfig::default()).unwrap();
        names.lock().unwrap().extend([net.tx.name().to_owned(), net.rx.name().to_owned()]);
        panic!("deliberate panic while a TestNet is alive");
    }));
    assert!(result.is_err());
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 2);
    let listed = listed_namespaces();
    for name in &names {
        assert!(!listed.contains(name), "{name} survived the panic: {listed:?}");
    }
}

#[test]
fn run_propagates_panics_and_spawn_runs_inside() {
    if udpx_netns::skip_unless_capable("run_propagates_panics_and_spawn_runs_inside") {
        return;
    }
    let net = TestNet::setup(&TestNetConfig::default()).unwrap();
    let caught = catch_unwind(AssertUnwindSafe(|| net.tx.run(|| panic!("deliberate panic inside the namespace"))));
    let payload = caught.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>().copied(), Some("deliberate panic inside the namespace"));

    // A long-lived receiver thread, as a benchmark server would use.
    let rx_addr = SocketAddr::new(net.rx_v4.into(), 0);
    let receiver = net.rx.run(move || UdpSocket::bind(rx_addr).unwrap());
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    let to = receiver.local_addr().unwrap();
    let server = net.rx.spawn(move || {
        let mut buf = [0u8; 64];
        let (n, _) = receiver.recv_from(&mut buf).expect("datagram within 1 s");
        buf[..n].to_vec()
    });
    let sender = net.tx.run(|| UdpSocket::bind("0.0.0.0:0").unwrap());
    sender.send_to(b"ping", to).unwrap();
    assert_eq!(server.join().unwrap(), b"ping");
}

#[test]
fn exec_returns_stdout_and_errors_carry_stderr() {
    if udpx_netns::skip_unless_capable("exec_returns_stdout_and_errors_carry_stderr") {
        return;
    }
    let net = TestNet::setup(&TestNetConfig::default()).unwrap();
    let addrs = net.rx.exec(&["ip", "-o", "addr", "show"]).unwrap();
    assert!(addrs.contains("192.0.2.2/24"), "{addrs}");
    assert!(addrs.contains("2001:db8::2/64"), "{addrs}");
    assert!(!addrs.contains("192.0.2.1/"), "tx address leaked into rx: {addrs}");
    let err = net.tx.exec(&["sh", "-c", "echo something broke >&2; exit 7"]).unwrap_err();
    match err {
        Error::Command { status, stderr, .. } => {
            assert_eq!(status.code(), Some(7));
            assert_eq!(stderr, "something broke");
        }
        other => panic!("unexpected {other:?}"),
    }
    let err = net.tx.exec_timeout(&["sleep", "5"], Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
}

#[test]
fn cleanup_stale_removes_dead_owners_only() {
    if udpx_netns::skip_unless_capable("cleanup_stale_removes_dead_owners_only") {
        return;
    }
    // A pid that is certainly dead: a child that has exited and been reaped.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("udpx-{dead}-0-stale");
    run_bounded(Command::new("ip").args(["netns", "add", &stale]), Duration::from_secs(5)).unwrap();
    let mine = Namespace::create_unique("keep").unwrap();

    let removed = cleanup_stale();
    let listed = listed_namespaces();
    if listed.contains(&stale) {
        // Tidy up before failing, since nothing owns this one.
        let _ = run_bounded(Command::new("ip").args(["netns", "del", &stale]), Duration::from_secs(5));
        panic!("stale namespace {stale} was not removed");
    }
    assert!(removed >= 1);
    assert!(listed.contains(&mine.name().to_owned()));
}

/// `received_rps` of each CPU from `/proc/net/softnet_stat` (hexadecimal columns: the tenth
/// counts the packet-steering interrupts a CPU took, the thirteenth is the CPU's number).
fn received_rps() -> Vec<(usize, u64)> {
    let text = std::fs::read_to_string("/proc/net/softnet_stat").expect("read /proc/net/softnet_stat");
    let hex = |s: &str| u64::from_str_radix(s, 16).expect("softnet_stat column");
    text.lines()
        .enumerate()
        .map(|(row, line)| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let cpu = cols.get(12).map_or(row, |c| hex(c) as usize);
            (cpu, hex(cols[9]))
        })
        .collect()
}

fn rps_of(cpu: usize) -> u64 {
    received_rps()
        .into_iter()
        .find(|&(c, _)| c == cpu)
        .map_or_else(|| panic!("CPU {cpu} not in softnet_stat"), |(_, n)| n)
}

fn pin_me(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu set");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("pin");
}

/// TCP from a TSO end never reaches veth's NAPI: in either mode, `receive_on` steers its
/// protocol work to the receiving side's CPU, so each CPU takes steering interrupts from the
/// other (data one way, acknowledgements the other). Without the steering, every segment
/// would run on its sender's CPU and neither count would move.
#[test]
fn receive_on_steers_tcp_to_each_sides_cpu() {
    if udpx_netns::skip_unless_capable("receive_on_steers_tcp_to_each_sides_cpu") {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        println!("SKIP: receive_on_steers_tcp_to_each_sides_cpu: needs two CPUs, this machine has {cpus}");
        return;
    }
    let (tx_cpu, rx_cpu) = (0, cpus - 1);
    for napi in [Napi::Softirq, Napi::Threaded] {
        let net = TestNet::setup(&TestNetConfig::new(Profile::Offload)).expect("setup");
        let rx_threads = net.receive_on(Side::Rx, rx_cpu, napi).expect("receive on rx");
        let tx_threads = net.receive_on(Side::Tx, tx_cpu, napi).expect("receive on tx");
        assert_eq!(rx_threads.is_empty(), napi == Napi::Softirq, "{napi}: {rx_threads:?}");
        assert_eq!(tx_threads.is_empty(), napi == Napi::Softirq, "{napi}: {tx_threads:?}");
        for (side, cpu) in [(Side::Rx, rx_cpu), (Side::Tx, tx_cpu)] {
            let dev = net.dev(side);
            let rps = net.ns(side).exec(&["cat", &format!("/sys/class/net/{dev}/queues/rx-0/rps_cpus")]).unwrap();
            assert_eq!(u64::from_str_radix(&rps.trim().replace(',', ""), 16).unwrap(), 1 << cpu, "{napi} {dev}");
        }

        let rx_ip = net.rx_v4;
        let listener = net.rx.run(move || std::net::TcpListener::bind((rx_ip, 0)).expect("listen"));
        let to = listener.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            pin_me(rx_cpu);
            let (mut s, _) = listener.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut sink = Vec::new();
            std::io::Read::read_to_end(&mut s, &mut sink).expect("read")
        });
        let (before_rx, before_tx) = (rps_of(rx_cpu), rps_of(tx_cpu));
        let mut stream = net.tx.run(move || std::net::TcpStream::connect_timeout(&to, TIMEOUT).expect("connect"));
        let sent = std::thread::scope(|s| {
            s.spawn(|| {
                pin_me(tx_cpu);
                stream.set_nodelay(true).unwrap();
                let chunk = [7u8; 1000];
                for _ in 0..2_000 {
                    std::io::Write::write_all(&mut stream, &chunk).expect("write");
                }
                stream.shutdown(std::net::Shutdown::Write).unwrap();
                2_000 * chunk.len()
            })
            .join()
            .unwrap()
        });
        assert_eq!(reader.join().unwrap(), sent, "{napi}");
        let (rx_irqs, tx_irqs) = (rps_of(rx_cpu) - before_rx, rps_of(tx_cpu) - before_tx);
        println!("{napi}: steering interrupts on the receiver's CPU {rx_irqs}, on the sender's {tx_irqs}");
        assert!(rx_irqs > 0, "{napi}: the data's receive work never reached CPU {rx_cpu}");
        assert!(tx_irqs > 0, "{napi}: the acknowledgements' receive work never reached CPU {tx_cpu}");
    }
}
