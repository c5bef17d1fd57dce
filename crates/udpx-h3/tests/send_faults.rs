//! The send path under the kernel's refusals, injected through the library's fault seam
//! (feature `fault-injection`; `cargo test --all-features`): a full socket (EAGAIN) and a
//! full device queue (ENOBUFS) keep the unsent packets and resume (an ENOBUFS on a zerocopy
//! send is sent again by copying, at once); a short `sendmmsg` continues; a GSO refusal (EIO)
//! falls back to plain datagrams, counted; a transmit the kernel refuses for good (EMSGSIZE)
//! is skipped and QUIC re-sends it. The 10 MB download arrives byte for byte through all of it.
#![cfg(feature = "fault-injection")]

mod common;

use common::{digest, start, Site, TempDir};
use udpx::Fault;
use udpx_h3::{get, GetConfig};
use udpx_quic::IoMode;

#[test]
fn refusals_are_resumed_counted_and_lose_nothing() {
    let site = Site::new("faults");
    let server = start(&site, IoMode::GsoMmsg, 1);
    let port = server.local_addr().port();
    // Consumed by the server's next send calls, one each, in this order.
    let mut faults = Vec::new();
    for _ in 0..5 {
        faults.extend([Fault::Errno(libc::EAGAIN), Fault::Errno(libc::ENOBUFS), Fault::Short(1)]);
    }
    // Refused for good: a size error fails every try (the socket first tries three times
    // whether it was someone else's pending ICMP error).
    faults.extend([Fault::Errno(libc::EMSGSIZE); 4]);
    // On the first GSO call after the others: on a plain call EIO is a hard error, not a GSO
    // refusal, and which call comes first depends on timing.
    faults.push(Fault::ErrnoOnGso(libc::EIO));
    for f in faults {
        server.inject_fault(0, f);
    }
    let out = TempDir::new("faults-out");
    let dst = out.path().join("big");
    let r = get(&format!("https://127.0.0.1:{port}/big"), Some(&dst), &GetConfig::default()).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(digest(&std::fs::read(&dst).unwrap()), digest(&site.file("big")), "content differs");
    let c = server.stop().unwrap().quic;
    eprintln!("{}", serde_json::to_string(&c).unwrap());
    // An ENOBUFS that falls on a zerocopy send means optmem ran out, not the device queue:
    // the same data goes at once by copying (`zerocopy_refused`), not as a stop. Whether a
    // send of this download is a zerocopy one depends on timing, so either counts.
    assert!(
        c.send_blocked + c.zerocopy_refused >= 10,
        "EAGAIN and ENOBUFS stops: {}, ENOBUFS copied at once: {}",
        c.send_blocked,
        c.zerocopy_refused
    );
    assert_eq!(c.send_errors, 1, "the EMSGSIZE transmit skipped");
    assert!(c.gso_fallbacks >= 1, "the EIO made the destination plain");
}
