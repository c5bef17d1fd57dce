//! The attack lab (privileged): a datagram the attacker sends with the victim's address as its
//! source reaches the server as from the victim, the server's answer reaches the victim, the
//! client talks to the server, and teardown leaves no namespace. Prints `SKIP: ...` when not
//! root. Every receive has a 1 s timeout.

use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Duration;

use udpx_netns::forge::{udp_datagram, RawSender};
use udpx_netns::{live_namespaces, skip_unless_capable, Leaf, StarNet};

fn bind(net: &StarNet, leaf: Leaf, port: u16) -> UdpSocket {
    let addr = SocketAddr::from((leaf.v4(), port));
    net.ns(leaf).run(move || {
        let s = UdpSocket::bind(addr).expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
        s
    })
}

#[test]
fn a_forged_source_reaches_the_server_and_its_answer_the_victim() {
    if skip_unless_capable("a_forged_source_reaches_the_server_and_its_answer_the_victim") {
        return;
    }
    let before = live_namespaces().len();
    {
        let net = StarNet::setup().expect("star");
        let server = bind(&net, Leaf::Server, 7000);
        let victim = bind(&net, Leaf::Victim, 7001);
        let client = bind(&net, Leaf::Client, 7002);
        let raw = net.ns(Leaf::Attacker).run(|| RawSender::new().expect("raw socket"));
        let forged = udp_datagram(
            SocketAddrV4::new(Leaf::Victim.v4(), 7001),
            SocketAddrV4::new(Leaf::Server.v4(), 7000),
            b"from the victim, honest",
        );
        raw.send(&forged).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = server.recv_from(&mut buf).expect("the forged datagram crossed the hub");
        assert_eq!((&buf[..n], from), (&b"from the victim, honest"[..], victim.local_addr().unwrap()));
        server.send_to(b"answer", from).unwrap();
        let (n, _) = victim.recv_from(&mut buf).expect("the answer reached the victim");
        assert_eq!(&buf[..n], b"answer");
        client.send_to(b"hello", server.local_addr().unwrap()).unwrap();
        let (n, from) = server.recv_from(&mut buf).expect("the client reaches the server");
        assert_eq!((&buf[..n], from), (&b"hello"[..], client.local_addr().unwrap()));
    }
    assert_eq!(live_namespaces().len(), before, "every namespace removed");
}
