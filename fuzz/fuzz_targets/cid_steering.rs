//! The QUIC connection-ID steering program, run by the in-repo classic-BPF interpreter on
//! arbitrary packets: it always answers a valid socket index or the fallback (the group
//! size, which makes the kernel use its hash), never an error; and a long-header packet whose
//! DCID covers the byte lands on that byte's shard.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udpx::shard::{cid_program, run_cbpf, MAX_CID_LEN};

fuzz_target!(|input: (u8, u8, Vec<u8>)| {
    let (k, n, pkt) = input;
    let k = k % MAX_CID_LEN as u8;
    let n = u32::from(n) + 1;
    let prog = cid_program(k, n);
    let got = run_cbpf(&prog, &pkt, 0).expect("the program runs on any packet");
    assert!(got <= n, "index {got} of {n}");
    if pkt.len() > 6 && pkt[0] & 0x80 != 0 {
        let dcid_len = usize::from(pkt[5]);
        if dcid_len > usize::from(k) && dcid_len <= MAX_CID_LEN as usize && pkt.len() > 6 + usize::from(k) {
            assert_eq!(got, u32::from(pkt[6 + usize::from(k)]) % n);
        }
    }
});
