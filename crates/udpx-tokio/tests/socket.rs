//! The async socket on its own (each backend): batches sent with `send` arrive whole through
//! `recv` (GRO buffers with their stride), ECN marks received reach quinn's `RecvMeta`, a
//! configuration that switches io_uring off leaves the socket on system calls and says why.

use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use quinn::AsyncUdpSocket;
use udpx_tokio::{Backend, UdpxSocket};

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Whether `backend` is what a socket gets here; prints SKIP (and counts it) when io_uring
/// was asked for and is not available.
fn usable(test: &str, s: &UdpxSocket, backend: Backend) -> bool {
    if backend == Backend::IoUring && !s.receives_by_ring() {
        udpx_lab::netns::record_skip(test, s.backend_note());
        return false;
    }
    true
}

/// Receives with `recv` until `datagrams` datagrams arrived (or 5 s); returns each buffer and
/// its metadata.
async fn recv_all(s: &UdpxSocket, datagrams: usize) -> Vec<(udpx::RecvMeta, Vec<u8>)> {
    let mut out = Vec::new();
    let mut count = 0;
    let mut store = vec![vec![0u8; udpx::GRO_BUFFER]; 8];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count < datagrams {
        let mut bufs: Vec<IoSliceMut<'_>> = store.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let mut meta = [udpx::RecvMeta::default(); 8];
        let k = tokio::time::timeout_at(deadline, s.recv(&mut bufs, &mut meta))
            .await
            .unwrap_or_else(|_| panic!("{count} of {datagrams} datagrams within 5 s"))
            .unwrap();
        drop(bufs);
        for (m, b) in meta.iter().zip(&store).take(k) {
            count += m.segment_count();
            out.push((*m, b[..m.len].to_vec()));
        }
    }
    out
}

async fn batches_arrive_whole(backend: Backend, test: &str) {
    let rx = UdpxSocket::bind(lo(), backend).unwrap();
    let tx = UdpxSocket::bind(lo(), backend).unwrap();
    if !usable(test, &rx, backend) {
        return;
    }
    let to = rx.udpx().local_addr();
    // 300 single datagrams of mixed sizes, then 20 GSO transmits of 8 x 1000 bytes.
    let singles: Vec<Vec<u8>> = (0..300u32).map(|i| udpx_lab::pattern(50 + i as usize * 3, i as u64)).collect();
    let ts: Vec<udpx::Transmit<'_>> = singles.iter().map(|d| udpx::Transmit::new(to, d)).collect();
    assert_eq!(tx.send(&ts).await.unwrap(), 300);
    let got = recv_all(&rx, 300).await;
    let data: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
    assert_eq!(data, singles, "every single datagram, in order");
    let runs: Vec<Vec<u8>> = (0..20u64).map(|i| udpx_lab::pattern(8000, 1000 + i)).collect();
    let ts: Vec<udpx::Transmit<'_>> =
        runs.iter().map(|d| udpx::Transmit { segment_size: Some(1000), ..udpx::Transmit::new(to, d) }).collect();
    assert_eq!(tx.send(&ts).await.unwrap(), 20);
    let got = recv_all(&rx, 160).await;
    let joined: Vec<u8> = got.iter().flat_map(|(_, d)| d.clone()).collect();
    assert_eq!(joined, runs.concat(), "every segment, in order");
    assert!(got.iter().any(|(m, _)| m.stride == 1000 && m.len > 1000), "GRO buffers kept whole with their stride");
    let st = rx.stats();
    eprintln!("{} receiver: {st:?}", rx.backend_note());
    if backend == Backend::IoUring {
        let bytes: usize = singles.iter().chain(&runs).map(Vec::len).sum();
        assert_eq!(st.bytes_copied, bytes as u64, "every byte copied once from the ring");
    } else {
        assert_eq!(st.bytes_copied, 0, "system calls receive in place");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_arrive_whole_on_system_calls() {
    batches_arrive_whole(Backend::Syscall, "batches_arrive_whole_on_system_calls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_arrive_whole_through_the_ring() {
    batches_arrive_whole(Backend::IoUring, "batches_arrive_whole_through_the_ring").await;
}

/// On a current-thread runtime the ring is the runtime thread's (`SINGLE_ISSUER |
/// DEFER_TASKRUN`): batches arrive whole through it. Polled from another thread, the socket
/// receives by system call there (counted), every datagram in order; back on its own thread
/// the ring goes on receiving.
#[tokio::test]
async fn a_current_thread_runtime_owns_its_ring_and_other_threads_still_receive() {
    let test = "a_current_thread_runtime_owns_its_ring_and_other_threads_still_receive";
    let rx = Arc::new(UdpxSocket::bind(lo(), Backend::IoUring).unwrap());
    if !usable(test, &rx, Backend::IoUring) {
        return;
    }
    if !rx.backend_note().contains("runtime thread") {
        udpx_lab::netns::record_skip(test, "no DEFER_TASKRUN in this kernel: the ring is the shared kind");
        return;
    }
    batches_arrive_whole(Backend::IoUring, test).await;

    let tx = std::net::UdpSocket::bind(lo()).unwrap();
    let to = rx.udpx().local_addr();
    let first: Vec<Vec<u8>> = (0..50u64).map(|i| udpx_lab::pattern(100 + i as usize, i)).collect();
    for d in &first {
        tx.send_to(d, to).unwrap();
    }
    let rx2 = rx.clone();
    let got = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(recv_all(&rx2, 50))
    })
    .await
    .unwrap();
    let data: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
    assert_eq!(data, first, "received on another thread by system call, in order");
    let st = rx.stats();
    assert!(st.recvs_off_ring > 0, "{st:?}");
    assert_eq!(st.bytes_copied, 0, "nothing came through the ring: {st:?}");

    let second: Vec<Vec<u8>> = (0..50u64).map(|i| udpx_lab::pattern(200 + i as usize, 100 + i)).collect();
    for d in &second {
        tx.send_to(d, to).unwrap();
    }
    let data: Vec<Vec<u8>> = recv_all(&rx, 50).await.into_iter().map(|(_, d)| d).collect();
    assert_eq!(data, second, "back on its thread, through the ring");
    let after = rx.stats();
    assert_eq!(after.ring.datagrams, 50, "{after:?}");
    assert_eq!(after.recvs_off_ring, st.recvs_off_ring, "{after:?}");
}

/// ECN marks a peer sets reach quinn through `poll_recv` (quinn's `RecvMeta.ecn`), whichever
/// backend receives them.
async fn ecn_marks_reach_quinn(backend: Backend, test: &str) {
    let rx = Arc::new(UdpxSocket::bind(lo(), backend).unwrap());
    if !usable(test, &rx, backend) {
        return;
    }
    let tx = udpx::UdpSocket::builder(lo()).ecn(udpx::Want::Required).bind().unwrap();
    let to = rx.udpx().local_addr();
    let marks = [Some(udpx::EcnCodepoint::Ect0), Some(udpx::EcnCodepoint::Ect1), Some(udpx::EcnCodepoint::Ce), None];
    for (i, ecn) in marks.iter().enumerate() {
        let d = [i as u8; 100];
        tx.send(&[udpx::Transmit { ecn: *ecn, ..udpx::Transmit::new(to, &d) }]).unwrap();
    }
    let mut seen = Vec::new();
    let mut store = vec![vec![0u8; udpx::GRO_BUFFER]; 4];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen.len() < marks.len() {
        let mut bufs: Vec<IoSliceMut<'_>> = store.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let mut meta = [quinn::udp::RecvMeta::default(); 4];
        let poll = std::future::poll_fn(|cx| match rx.poll_recv(cx, &mut bufs, &mut meta) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => Poll::Pending,
        });
        let k = tokio::time::timeout_at(deadline, poll).await.expect("the marked datagrams within 5 s").unwrap();
        seen.extend(meta.iter().take(k).map(|m| m.ecn));
    }
    use quinn::udp::EcnCodepoint as Q;
    assert_eq!(seen, vec![Some(Q::Ect0), Some(Q::Ect1), Some(Q::Ce), None], "{}", rx.backend_note());
    assert_eq!(rx.stats().ecn_marked, 3, "the marked ones counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecn_marks_reach_quinn_on_system_calls() {
    ecn_marks_reach_quinn(Backend::Syscall, "ecn_marks_reach_quinn_on_system_calls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecn_marks_reach_quinn_through_the_ring() {
    ecn_marks_reach_quinn(Backend::IoUring, "ecn_marks_reach_quinn_through_the_ring").await;
}

/// Receive buffers too small for a GRO buffer are refused with a message that names the size
/// to give, not filled with cut datagrams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffers_too_small_for_gro_are_refused() {
    for backend in [Backend::Syscall, Backend::IoUring] {
        let rx = UdpxSocket::bind(lo(), backend).unwrap();
        if !rx.udpx().capabilities().gro {
            udpx_lab::netns::record_skip("buffers_too_small_for_gro_are_refused", "no UDP GRO");
            return;
        }
        let mut small = vec![0u8; 1500];
        let mut bufs = [IoSliceMut::new(&mut small)];
        let mut meta = [udpx::RecvMeta::default()];
        // Refused at once, not after waiting for a datagram that never comes.
        let e = tokio::time::timeout(Duration::from_secs(5), rx.recv(&mut bufs, &mut meta))
            .await
            .expect("refused without waiting")
            .unwrap_err();
        assert!(e.to_string().contains(&udpx::GRO_BUFFER.to_string()), "{backend:?}: {e}");
    }
}

/// `UDPX_IO_URING=off` (an operator's switch, read when a socket is made) leaves a socket that
/// asked for io_uring on system calls, and it says why. Runs itself in a child process, the
/// variable set there only.
#[test]
fn io_uring_switched_off_by_configuration_falls_back_and_says_why() {
    const NAME: &str = "io_uring_switched_off_by_configuration_falls_back_and_says_why";
    if std::env::var_os("UDPX_IO_URING").is_some() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _g = rt.enter();
        let s = UdpxSocket::bind(lo(), Backend::IoUring).unwrap();
        let caps = s.udpx().capabilities();
        assert!(!caps.io_uring && !s.receives_by_ring(), "{caps}");
        assert!(s.backend_note().contains("UDPX_IO_URING=off"), "{}", s.backend_note());
        assert!(caps.to_string().contains("UDPX_IO_URING=off"), "{caps}");
        println!("child checked: {}", s.backend_note());
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env("UDPX_IO_URING", "off")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("child checked: system calls"), "{text}");
}
