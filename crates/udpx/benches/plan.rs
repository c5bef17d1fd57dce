//! Micro benchmarks of the pure planning code (no sockets): coalescing datagrams into GSO
//! transmits, splitting transmits into messages, and the cmsg codec. CI compiles them
//! (`cargo bench --no-run`); run with `cargo bench -p udpx`. Prints ns per operation; timings
//! are for looking at, never for pass/fail.

use std::hint::black_box;

use udpx::internals::{decode_bytes, encode_bytes, Cmsg};
use udpx::{messages, Batch, SegmentLimits, Transmit};
use udpx_netns::micro::bench;

fn main() {
    let dst = "192.0.2.2:4433".parse().unwrap();
    let other = "192.0.2.3:4433".parse().unwrap();
    let d = vec![0u8; 1200];
    let mut batch = Batch::new(SegmentLimits { segmenting: true, max_segments: 128 });
    bench("Batch::push, one flow (per datagram)", 256, || {
        batch.clear();
        for _ in 0..256 {
            batch.push(dst, black_box(&d)).unwrap();
        }
        black_box(batch.transmits());
    });
    bench("Batch::push, two flows interleaved", 256, || {
        batch.clear();
        for i in 0..256 {
            batch.push(if i % 2 == 0 { dst } else { other }, black_box(&d)).unwrap();
        }
        black_box(batch.transmits());
    });
    let big = vec![0u8; 64 * 1000];
    let t = Transmit::new(dst, &big).segmented(1000);
    bench("messages() of a 64-segment transmit", 1, || {
        black_box(messages(black_box(&t), true, 128));
    });
    let msgs = [Cmsg::Segment(1200), Cmsg::Tos(2), Cmsg::TxTime(123_456_789)];
    bench("cmsg encode + decode (3 messages)", 1, || {
        black_box(decode_bytes(&encode_bytes(black_box(&msgs))));
    });
}
