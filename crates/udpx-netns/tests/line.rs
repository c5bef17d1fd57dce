//! The three-namespace line (privileged): a datagram crosses the router both ways, the lab's
//! knobs (tbf, features, RPS) take, and teardown leaves no namespace. Prints `SKIP: ...` when
//! not root. Every receive has a 1 s timeout.

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

use udpx_netns::{run_bounded, LineConfig, LineNet, Node, Port, TbfLimit};

const TIMEOUT: Duration = Duration::from_secs(1);

fn listed_namespaces() -> Vec<String> {
    let out = run_bounded(Command::new("ip").args(["netns", "list"]), Duration::from_secs(5)).expect("ip netns list");
    out.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

/// Binds a socket at `port`'s address in its namespace.
fn bind(net: &LineNet, port: Port) -> UdpSocket {
    let addr = SocketAddr::from((port.v4(), 0));
    net.ns(port.node()).run(move || {
        let s = UdpSocket::bind(addr).expect("bind");
        s.set_read_timeout(Some(TIMEOUT)).expect("read timeout");
        s
    })
}

/// One datagram from `from` to `to`, checked byte for byte and by source address.
fn cross(net: &LineNet, from: Port, to: Port, payload: &[u8]) {
    let (tx, rx) = (bind(net, from), bind(net, to));
    tx.send_to(payload, rx.local_addr().unwrap()).expect("send");
    let mut buf = [0u8; 2048];
    let (n, src) = rx
        .recv_from(&mut buf)
        .unwrap_or_else(|e| panic!("{from:?} -> {to:?}: nothing within {TIMEOUT:?} through the router: {e}"));
    assert_eq!(&buf[..n], payload);
    assert_eq!(src, tx.local_addr().unwrap(), "not rewritten on the way");
}

#[test]
fn line_forwards_shapes_and_tears_down() {
    if udpx_netns::skip_unless_capable("line_forwards_shapes_and_tears_down") {
        return;
    }
    let names: Vec<String>;
    {
        let net = LineNet::setup(&LineConfig::default()).expect("setup");
        names = [Node::Server, Node::Router, Node::Client].iter().map(|&n| net.ns(n).name().to_owned()).collect();
        println!("line {names:?} set up in {:?}", net.setup_time());
        let listed = listed_namespaces();
        assert!(names.iter().all(|n| listed.contains(n)), "{names:?} not in {listed:?}");

        cross(&net, Port::Server, Port::Client, b"server to client through the router");
        cross(&net, Port::Client, Port::Server, b"and back");

        let forward = net.ns(Node::Router).exec(&["sysctl", "-n", "net.ipv4.ip_forward"]).unwrap();
        assert_eq!(forward.trim(), "1");

        net.tbf(50_000_000, 30_000, TbfLimit::Bytes(60_000)).expect("tbf");
        let shown = net.qdiscs(Port::RouterClient).unwrap();
        println!("{shown}");
        assert!(shown.contains("qdisc tbf") && shown.contains("rate 50Mbit"), "{shown}");
        net.tbf(20_000_000, 30_000, TbfLimit::Latency(Duration::from_millis(5))).expect("tbf again");
        assert!(net.qdiscs(Port::RouterClient).unwrap().contains("rate 20Mbit"));
        // The bottleneck still passes traffic.
        cross(&net, Port::Server, Port::Client, b"through the bucket");
        assert!(net.tbf(0, 1, TbfLimit::Bytes(1)).is_err());

        net.set_features(Port::Server, &[("tx-udp-segmentation", "off")]).expect("features");
        assert_eq!(net.features(Port::Server).unwrap()["tx-udp-segmentation"], "off");

        for port in [Port::RouterServer, Port::Client] {
            net.rps(port, 0b11).expect("rps");
            net.rps(port, 0).expect("rps off");
        }
    }
    let listed = listed_namespaces();
    for n in &names {
        assert!(!listed.contains(n), "{n} left behind: {listed:?}");
    }
}

/// The bottleneck drops what exceeds its bucket and queue while every send reports success:
/// only the receiver sees the loss (the lab's premise).
#[test]
fn tbf_drops_silently_at_the_router() {
    if udpx_netns::skip_unless_capable("tbf_drops_silently_at_the_router") {
        return;
    }
    let net = LineNet::setup(&LineConfig::default()).expect("setup");
    // 1 Mbit/s, a 3 kB bucket and 3 kB of queue: of 100 x 1200 B sent at once, a handful pass.
    net.tbf(1_000_000, 3_000, TbfLimit::Bytes(3_000)).expect("tbf");
    let (tx, rx) = (bind(&net, Port::Server), bind(&net, Port::Client));
    rx.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let to = rx.local_addr().unwrap();
    for i in 0..100u8 {
        tx.send_to(&[i; 1200], to).expect("every send succeeds: the drop is a hop away");
    }
    let mut got = 0;
    let mut buf = [0u8; 2048];
    while rx.recv_from(&mut buf).is_ok() {
        got += 1;
    }
    println!("tbf passed {got} of 100");
    assert!(got > 0 && got < 50, "{got} of 100 passed a 3 kB bucket at 1 Mbit/s");
    drop((tx, rx));
}

#[test]
fn failed_setup_and_panics_leave_nothing() {
    if udpx_netns::skip_unless_capable("failed_setup_and_panics_leave_nothing") {
        return;
    }
    assert!(LineNet::setup(&LineConfig { mtu: 100 }).is_err(), "MTU below the IPv6 minimum is refused");
    let mut names = Vec::new();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let net = LineNet::setup(&LineConfig::default()).expect("setup");
        names.push(net.ns(Node::Router).name().to_owned());
        // Unwinds like a failed assertion, without the panic message and backtrace.
        std::panic::resume_unwind(Box::new("test panic with the line alive"));
    }));
    assert!(caught.is_err());
    assert_eq!(names.len(), 1);
    assert!(!listed_namespaces().contains(&names[0]), "removed while unwinding");
}

/// The delay line: a request and its echo cross it both ways, so no round trip through it is
/// shorter than twice the one-way delay (a lower bound, never a timing target); 50 datagrams
/// sent back to back (within the sockets' default receive buffers) arrive whole and in order; its counters agree with what crossed; once it
/// stops, the router forwards directly again and its rules are gone.
#[test]
fn delay_line_delays_both_ways_keeps_order_and_stops() {
    if udpx_netns::skip_unless_capable("delay_line_delays_both_ways_keeps_order_and_stops") {
        return;
    }
    let net = LineNet::setup(&LineConfig::default()).expect("setup");
    assert!(net.delay(Duration::ZERO).is_err(), "a zero delay is refused");
    assert!(net.delay(Duration::from_secs(2)).is_err(), "a delay over a second is refused");
    let one_way = Duration::from_millis(15);
    let line = net.delay(one_way).expect("the delay line");
    let rules = net.ns(Node::Router).exec(&["ip", "rule", "list"]).unwrap();
    assert!(rules.contains("lookup 64"), "{rules}");
    let (client, server) = (bind(&net, Port::Client), bind(&net, Port::Server));
    // The echo ends after this much silence: long enough for the line's stop on a loaded machine.
    server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let server_addr = server.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        while let Ok((n, from)) = server.recv_from(&mut buf) {
            got.push(buf[..n].to_vec());
            server.send_to(&buf[..n], from).unwrap();
        }
        got
    });
    let mut buf = [0u8; 2048];
    for i in 0..5u8 {
        let sent = std::time::Instant::now();
        client.send_to(&[i; 100], server_addr).unwrap();
        let (n, _) = client.recv_from(&mut buf).expect("the echo, within 1 s");
        let rtt = sent.elapsed();
        assert_eq!(&buf[..n], &[i; 100][..]);
        assert!(rtt >= 2 * one_way, "round trip {rtt:?} shorter than twice {one_way:?}");
        println!("round trip through the delay line: {rtt:?}");
    }
    for i in 0..50u16 {
        client.send_to(&i.to_be_bytes().repeat(600), server_addr).unwrap();
    }
    for i in 0..50u16 {
        let (n, _) = client.recv_from(&mut buf).unwrap_or_else(|e| panic!("echo {i}: {e}"));
        let first = u16::from_be_bytes([buf[0], buf[1]]);
        assert!(buf[..n] == i.to_be_bytes().repeat(600)[..], "echo {i}: got {n} B starting with {first}");
    }
    let c = line.stop().expect("stop");
    println!("{c:?}");
    // 55 requests and 55 echoes, all through the line (and maybe what the kernel itself sent
    // through the device when it came up: an IPv6 router solicitation).
    assert!(c.forwarded >= 110 && c.dropped == 0, "{c:?}");
    assert!(c.max_held_bytes >= 1200, "{c:?}");
    let rules = net.ns(Node::Router).exec(&["ip", "rule", "list"]).unwrap();
    assert!(!rules.contains("lookup 64"), "rules left: {rules}");
    // Direct again: a datagram crosses at once (no line to hold it).
    client.send_to(b"direct", server_addr).unwrap();
    let (n, _) = client.recv_from(&mut buf).expect("forwarded without the line");
    assert_eq!(&buf[..n], b"direct");
    drop(client);
    let got = echo.join().unwrap();
    assert_eq!(got.len(), 56);
}
