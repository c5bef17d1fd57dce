//! The example `paced_send` run as a user runs it: for one second, four flows at 1.2 MB/s each
//! to a receiver this test holds. Judged by counting: every datagram it says it sent arrives,
//! and the count is the asked rate over the run's own measured duration, within a factor of 2
//! (a loaded machine's timer may be late; the pacer then catches up within each flow's burst).

use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use udpx::{RecvBuffers, UdpSocket, Want};
use udpx_netns::examples::{number_after, Examples};

const EXAMPLES: Examples = udpx_netns::examples!();

/// Sets its flag when dropped.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

#[test]
fn paced_send_sends_at_the_asked_rate() {
    const FLOWS: u64 = 4;
    const RATE: u64 = 1_200_000;
    const SIZE: u64 = 1200;
    let rx =
        UdpSocket::builder("127.0.0.1:0".parse().unwrap()).gro(Want::IfAvailable).recv_buffer(4 << 20).bind().unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let to = rx.local_addr().to_string();
    let done = AtomicBool::new(false);
    let (received, out) = std::thread::scope(|s| {
        // The receiving thread stops when this closure ends, by a failed assertion too (the
        // scope would otherwise wait for it forever).
        let _stop = Stop(&done);
        let counter = s.spawn(|| {
            let mut bufs = RecvBuffers::for_socket(&rx, 16);
            let mut n = 0u64;
            while !done.load(Relaxed) {
                match rx.recv_into(&mut bufs) {
                    Ok(_) => n += bufs.datagrams().count() as u64,
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(e) => panic!("receive: {e}"),
                }
            }
            n
        });
        let args = ["--to", &to, "--flows", &FLOWS.to_string(), "--rate", &RATE.to_string(), "--seconds", "1"];
        let (status, out) = EXAMPLES.start("paced_send", &args).finish(Duration::from_secs(30));
        // Datagrams still on their way over loopback land within a moment.
        std::thread::sleep(Duration::from_millis(300));
        done.store(true, Relaxed);
        assert!(status.success(), "paced_send: {status}\n{out}");
        (counter.join().unwrap(), out)
    });
    eprintln!("{out}received by the test: {received}");
    let sent: u64 = number_after(&out, "sent ");
    let secs: f64 = number_after(&out, " flows in ");
    let drops = u64::from(rx.kernel_drops().unwrap());
    assert!(received <= sent && sent - received <= drops, "sent {sent}, received {received}, dropped {drops}");
    // The asked rate over the measured duration, in datagrams.
    let expected = (FLOWS * RATE) as f64 * secs / SIZE as f64;
    assert!(secs >= 0.9, "it ran the asked second: {secs} s");
    assert!(
        (expected / 2.0..=expected * 2.0).contains(&(sent as f64)),
        "sent {sent} datagrams in {secs} s, asked {expected:.0}: more than a factor of 2 off"
    );
}
