//! GSO planning against the kernel's rules: a validated transmit becomes messages that cover
//! its contents exactly, in order; each carries at most the segment limit; `UDP_SEGMENT` only
//! on a message of more than one segment (the GSO layer refuses a buffer not larger than its
//! segment size); every segment full size but the last. And `Batch` puts datagrams into
//! transmits that satisfy the same rules and give back the datagrams in order.
#![no_main]

use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use udpx::{messages, validate_transmit, Batch, Family, PathLimits, SegmentLimits, Transmit};

fuzz_target!(|input: (u16, u16, u8, bool, Vec<u16>)| {
    let (len, seg, max_segs, gso, sizes) = input;
    let dst: SocketAddr = "192.0.2.1:443".parse().unwrap();
    let contents = vec![7u8; len as usize];
    let max_segs = usize::from(max_segs % 130).max(1);
    let t = Transmit { segment_size: (seg > 0).then_some(seg as usize), ..Transmit::new(dst, &contents) };
    let limits = PathLimits { family: Family::V4, path_mtu: Some(1500), max_segments: Some(max_segs) };
    if validate_transmit(&t, &limits, false).is_ok() {
        let msgs = messages(&t, gso, max_segs);
        let mut at = 0;
        let mut total = 0;
        for m in &msgs {
            assert_eq!(m.range.start, at, "contiguous");
            at = m.range.end;
            total += m.segments;
            assert!(m.segments <= if gso { max_segs } else { 1 });
            match m.segment_size {
                Some(s) => {
                    assert!(m.segments > 1 && m.range.len() > s, "UDP_SEGMENT on one segment");
                    assert_eq!(m.range.len().div_ceil(s), m.segments);
                }
                None => assert_eq!(m.segments, 1),
            }
        }
        assert_eq!(at, contents.len());
        assert_eq!(total, t.segments());
    }
    let mut b = Batch::new(SegmentLimits { segmenting: gso, max_segments: max_segs });
    let mut want: Vec<Vec<u8>> = Vec::new();
    for (i, s) in sizes.iter().take(300).enumerate() {
        let d = vec![i as u8; usize::from(*s % 3000)];
        if b.push(dst, &d).is_ok() {
            want.push(d);
        }
    }
    let mut got: Vec<Vec<u8>> = Vec::new();
    for t in b.transmits() {
        assert!(t.segments() <= max_segs.max(1) || !gso);
        match t.segment_size {
            Some(s) => got.extend(t.contents.chunks(s).map(<[u8]>::to_vec)),
            None => got.push(t.contents.to_vec()),
        }
    }
    assert_eq!(got, want, "a batch gives back its datagrams, in order");
});
