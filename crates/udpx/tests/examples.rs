//! The examples run as a user runs them: `gso_send` against `gro_recv` over loopback (every
//! datagram arrives intact; GSO and GRO carried them, or the example said why not), and
//! `shard_echo` answering requests from several client sockets. Each example is the binary
//! `cargo test` built (see `udpx_netns::examples`), killed if a test fails before it ends.

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use udpx_netns::examples::{number_after, Examples};

const EXAMPLES: Examples = udpx_netns::examples!();

/// `gso_send` to `gro_recv`, `count` datagrams; asserts every one arrived and that each side
/// either used its offload or said why not; returns both outputs.
fn gso_to_gro(count: u32, sender_flags: &[&str]) -> (String, String) {
    let count_s = count.to_string();
    let mut rx = EXAMPLES.start("gro_recv", &["--count", &count_s, "--timeout-ms", "5000"]);
    let addr = rx.listening_on().to_string();
    let mut args = vec!["--to", &addr, "--count", &count_s, "--size", "1200", "--burst", "64", "--gap-ms", "1"];
    args.extend_from_slice(sender_flags);
    let (tx_status, tx_out) = EXAMPLES.start("gso_send", &args).finish(Duration::from_secs(60));
    assert!(tx_status.success(), "gso_send failed ({tx_status}):\n{tx_out}");
    let (rx_status, rx_out) = rx.finish(Duration::from_secs(60));
    eprintln!("gso_send:\n{tx_out}gro_recv:\n{rx_out}");
    assert_eq!(number_after::<u64>(&tx_out, "sent "), u64::from(count), "{tx_out}");
    let got: u64 = number_after(&rx_out, "received ");
    let drops: u64 = number_after(&rx_out, "kernel drops: ");
    assert!(rx_out.contains("(0 damaged, 0 duplicates)"), "{rx_out}");
    if drops == 0 {
        assert_eq!(got, u64::from(count), "no drop on the receiver's socket, so every datagram arrives");
        assert!(rx_status.success(), "{rx_status}");
    } else {
        // Only the receiver's own socket may lose on loopback, and only what it counted.
        assert!(u64::from(count) - got <= drops, "missing {} but the kernel dropped {drops}", u64::from(count) - got);
        common::skip("examples: gso_to_gro exact delivery", &format!("the receiver's socket dropped {drops}"));
    }
    (tx_out, rx_out)
}

/// The line starting with `prefix` says the offload was used, or why not (a reason after
/// `not used: `).
fn used_or_said_why(out: &str, prefix: &str) -> bool {
    let line = out.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} line:\n{out}"));
    if let Some(why) = line.split("not used: ").nth(1) {
        assert!(why.len() > 10, "a reason: {line}");
        return false;
    }
    line.contains("used") || panic!("{line}")
}

#[test]
fn gso_sender_to_gro_receiver() {
    let (tx, rx) = gso_to_gro(1000, &[]);
    let kernel = udpx::KernelCaps::get();
    let gso = used_or_said_why(&tx, "gso: ");
    let gro = used_or_said_why(&rx, "gro: ");
    // Where the kernel has them, loopback carries them: GSO buffers arrive whole at a GRO socket.
    assert_eq!(gso, kernel.gso_max_segments.is_some(), "{tx}");
    if kernel.gso_max_segments.is_some() && kernel.gro {
        assert!(gro, "GSO buffers over loopback reach a GRO socket whole:\n{rx}");
        assert!(number_after::<u64>(&tx, " in ") < 1000 / 8, "batched: far fewer send calls than datagrams:\n{tx}");
    }
}

/// With `SO_NO_CHECK` the kernel refuses every GSO send: the sender says so, and the
/// receiver still gets every datagram (re-sent plain).
#[test]
fn gso_refused_is_said_and_nothing_lost() {
    if udpx::KernelCaps::get().gso_max_segments.is_none() {
        return common::skip("examples: gso_refused_is_said_and_nothing_lost", "this kernel has no UDP GSO");
    }
    let (tx, _) = gso_to_gro(300, &["--refuse-gso"]);
    assert!(!used_or_said_why(&tx, "gso: "), "{tx}");
    assert!(tx.contains("refused"), "the reason names the refusal:\n{tx}");
}

/// Requests from four client sockets (four flows: the kernel's hash spreads them) come back
/// byte for byte; the server stops by itself at its count and reports each shard.
#[test]
fn shard_echo_answers_every_request() {
    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 50;
    const TOTAL: usize = CLIENTS * PER_CLIENT;
    let total = TOTAL.to_string();
    let mut server =
        EXAMPLES.start("shard_echo", &["--shards", "2", "--steering", "hash", "--count", &total, "--seconds", "60"]);
    let addr = server.listening_on();
    let clients: Vec<UdpSocket> = (0..CLIENTS).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let mut buf = [0u8; 2048];
    for (c, sock) in clients.iter().enumerate() {
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // In chunks of 10, each chunk's replies read before the next: no queue overflows.
        for chunk in 0..PER_CLIENT / 10 {
            let requests: Vec<Vec<u8>> =
                (0..10).map(|i| format!("client {c} request {}", chunk * 10 + i).into_bytes()).collect();
            for r in &requests {
                sock.send_to(r, addr).unwrap();
            }
            let mut replies: Vec<Vec<u8>> = (0..10)
                .map(|_| {
                    let (n, from) = sock.recv_from(&mut buf).expect("a reply within 5 s");
                    assert_eq!(from, addr, "the reply comes from the server's address");
                    buf[..n].to_vec()
                })
                .collect();
            replies.sort();
            let mut want = requests.clone();
            want.sort();
            assert_eq!(replies, want, "client {c}: every request echoed once, byte for byte");
        }
    }
    let (status, out) = server.finish(Duration::from_secs(30));
    eprintln!("{out}");
    assert!(status.success(), "{status}");
    assert_eq!(number_after::<u64>(&out, "served "), TOTAL as u64, "{out}");
    let per_shard: u64 = (0..2).map(|i| number_after::<u64>(&out, &format!("shard {i}: "))).sum();
    assert_eq!(per_shard, TOTAL as u64, "the shards' requests add up:\n{out}");
}
