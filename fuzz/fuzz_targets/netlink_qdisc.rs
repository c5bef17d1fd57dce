//! The rtnetlink answer parsers on arbitrary bytes: a qdisc dump and a route answer give a
//! result or an error, never a panic, and every qdisc read belongs to the request asked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udpx::qdisc::{parse_qdisc_dump, parse_route_reply, root_and_children, KernelPacing};

fuzz_target!(|input: (u32, Vec<u8>)| {
    let (seq, bytes) = input;
    if let Ok(qdiscs) = parse_qdisc_dump(&bytes, seq) {
        for q in &qdiscs {
            let (root, children) = root_and_children(&qdiscs, q.ifindex);
            let _ = KernelPacing::decide(&root, &children);
        }
    }
    let _ = parse_route_reply(&bytes, seq);
});
