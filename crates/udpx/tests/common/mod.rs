//! Shared by the integration tests: verifiable payloads, a bounded receiver, skip reporting.
#![allow(dead_code)]

pub mod gso_cases;

use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use udpx::{Batch, RecvMeta, UdpSocket, GRO_BUFFER};

/// The payload of datagram `seq` of `len` bytes: every byte depends on seq and position, so a
/// reordered, duplicated, truncated or corrupted datagram cannot match.
/// Datagrams of 4 bytes or more start with the sequence number, so no two are alike.
pub fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut d: Vec<u8> = (0..len).map(|i| (seq.wrapping_mul(31).wrapping_add(i as u32 * 7) % 251) as u8).collect();
    if len >= 4 {
        d[..4].copy_from_slice(&seq.to_be_bytes());
    }
    d
}

/// The send backend the tests under `UDPX_TEST_IO_URING=1` run on: the same tests, sent
/// through io_uring (scripts/test.sh runs faults and loopback a second time so).
pub fn send_backend() -> udpx::Want {
    if std::env::var_os("UDPX_TEST_IO_URING").is_some_and(|v| v == "1") {
        udpx::Want::Required
    } else {
        udpx::Want::Off
    }
}

/// What a receiver saw.
#[derive(Debug, Default)]
pub struct Received {
    pub datagrams: Vec<Vec<u8>>,
    pub messages: usize,
    pub gro_messages: usize,
    pub truncated: usize,
    pub metas: Vec<RecvMeta>,
}

/// Receives until `expect` datagrams arrived, or nothing came for `idle`, or `limit` passed.
pub fn receive(rx: &UdpSocket, expect: usize, idle: Duration, limit: Duration) -> Received {
    rx.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; GRO_BUFFER]).collect();
    let mut metas = [RecvMeta::default(); 16];
    let mut out = Received::default();
    let start = Instant::now();
    let mut last = Instant::now();
    while out.datagrams.len() < expect && last.elapsed() < idle && start.elapsed() < limit {
        let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        match rx.recv(&mut slices, &mut metas) {
            Ok(n) => {
                last = Instant::now();
                for (m, b) in metas[..n].iter().zip(&bufs) {
                    out.messages += 1;
                    out.gro_messages += (m.segment_count() > 1) as usize;
                    out.truncated += m.truncated as usize;
                    out.metas.push(*m);
                    out.datagrams.extend(m.segments(b).map(<[u8]>::to_vec));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    out
}

/// Sends `sent` from `tx` to `rx` through a [`Batch`] in chunks of `chunk` datagrams with
/// `pause` between chunks (a correctness test paces so no queue on the path overflows),
/// while a thread receives; returns what arrived.
pub fn send_paced(tx: &UdpSocket, rx: &UdpSocket, sent: &[Vec<u8>], chunk: usize, pause: Duration) -> Received {
    std::thread::scope(|s| {
        let h = s.spawn(|| receive(rx, sent.len(), Duration::from_millis(500), Duration::from_secs(10)));
        let mut batch = Batch::for_socket(tx);
        for part in sent.chunks(chunk) {
            // Re-planned per chunk: a fallback may have changed the socket's limits.
            batch = Batch::for_socket(tx);
            for d in part {
                batch.push(rx.local_addr(), d).unwrap();
            }
            assert_eq!(tx.send(&batch.transmits()).unwrap(), batch.len());
            std::thread::sleep(pause);
        }
        drop(batch);
        h.join().unwrap()
    })
}

/// Asserts the receiver got exactly `sent`, in order, byte for byte.
pub fn assert_same(sent: &[Vec<u8>], got: &Received, what: &str) {
    assert_eq!(got.datagrams.len(), sent.len(), "{what}: datagram count (truncated {})", got.truncated);
    for (i, (a, b)) in sent.iter().zip(&got.datagrams).enumerate() {
        if a != b {
            let at = sent.iter().position(|s| s == b);
            let near: Vec<Option<usize>> = got.datagrams[i..(i + 8).min(got.datagrams.len())]
                .iter()
                .map(|d| sent.iter().position(|s| s == d))
                .collect();
            panic!(
                "{what}: datagram {i} differs (sent {} B, got {} B, which is sent #{at:?}; next: {near:?})",
                a.len(),
                b.len()
            );
        }
    }
}

/// Asserts the receiver got exactly `sent`, each once, in any order (for paths that may
/// reorder, e.g. a qdisc drained from two CPUs); returns how many arrived out of order.
pub fn assert_same_set(sent: &[Vec<u8>], got: &Received, what: &str) -> usize {
    assert_eq!(got.datagrams.len(), sent.len(), "{what}: datagram count");
    let mut a: Vec<&Vec<u8>> = sent.iter().collect();
    let mut b: Vec<&Vec<u8>> = got.datagrams.iter().collect();
    let reordered = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    a.sort();
    b.sort();
    assert!(a == b, "{what}: the datagrams received are not the datagrams sent");
    reordered
}

/// Prints `SKIP: <why>` and records it for the test runner's summary (see scripts/test.sh).
pub fn skip(test: &str, why: &str) {
    udpx_netns::record_skip(test, why);
}

/// Whether this kernel lets the io_uring send backend be used; prints `SKIP` for `test` when
/// it does not (an old kernel, `kernel.io_uring_disabled`, a seccomp filter).
pub fn uring_usable(test: &str) -> bool {
    let probe = UdpSocket::builder(lo4()).io_uring(udpx::Want::IfAvailable).bind().unwrap();
    let caps = probe.capabilities();
    match caps.io_uring_off_reason {
        Some(why) => {
            skip(test, &why);
            false
        }
        None => {
            assert!(caps.io_uring, "asked for, available, so in use");
            true
        }
    }
}

pub fn lo4() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub fn lo6() -> SocketAddr {
    "[::1]:0".parse().unwrap()
}
