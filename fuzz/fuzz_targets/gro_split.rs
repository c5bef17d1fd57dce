//! GRO splitting: any length, stride and truncation flags. The datagrams handed out tile the
//! buffer in order, each `stride` long but the last; their count is what `segment_count`
//! says; a buffer whose boundaries were lost (control data cut on a GRO socket) yields none.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udpx::RecvMeta;

fuzz_target!(|input: (u16, u16, u8, bool, bool)| {
    let (len, stride, slack, truncated, control_truncated) = input;
    // The buffer the kernel wrote `len` bytes into, maybe larger.
    let buf: Vec<u8> = (0..len as usize + slack as usize).map(|i| i as u8).collect();
    let m = RecvMeta { len: len as usize, stride: stride as usize, truncated, control_truncated, ..RecvMeta::default() };
    let segs: Vec<&[u8]> = m.segments(&buf).collect();
    assert_eq!(segs.len(), m.segment_count(), "the count and the datagrams handed out agree");
    let unknown = control_truncated && stride == 0 && len > 0;
    if unknown {
        assert!(segs.is_empty(), "a buffer with lost boundaries was split");
        return;
    }
    let data = &buf[..len as usize];
    assert_eq!(segs.concat(), data, "segments must tile the buffer in order");
    if let Some((last, rest)) = segs.split_last() {
        if stride > 0 {
            assert!(rest.iter().all(|s| s.len() == stride as usize));
            assert!(last.len() <= stride as usize || segs.len() == 1);
        }
    }
    assert!(!segs.is_empty(), "a datagram, even an empty one, is one");
});
