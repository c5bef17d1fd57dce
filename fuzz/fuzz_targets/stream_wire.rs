//! `udpx stream`'s datagram parser on arbitrary bytes: no panic; what it accepts re-encodes to
//! the same bytes' meaning (a Data header written back parses to the same header).
#![no_main]

use libfuzzer_sys::fuzz_target;
use udpx_stream::wire::{self, Message};

fuzz_target!(|data: &[u8]| {
    match wire::parse(data) {
        Some(Message::Data(d)) => {
            assert_eq!(d.size as usize, data.len(), "a Data datagram is as long as it says");
            let mut buf = data.to_vec();
            wire::write_data(&mut buf, &d);
            assert_eq!(wire::parse(&buf), Some(Message::Data(d)));
            assert_eq!(wire::quoted_secret(&buf[..20]), Some(d.secret), "an ICMP quote of 20 bytes holds the secret");
        }
        Some(Message::Request(r)) => {
            let mut buf = [0u8; wire::REQUEST_LEN];
            let n = wire::write_request(&mut buf, &r);
            assert_eq!(wire::parse(&buf[..n]), Some(Message::Request(r)));
        }
        Some(Message::Cookie { flow, cookie }) => {
            let mut buf = [0u8; 64];
            let n = wire::write_cookie(&mut buf, flow, &cookie);
            assert!(n <= wire::REQUEST_LEN, "a cookie is never larger than a request");
            assert_eq!(wire::parse(&buf[..n]), Some(Message::Cookie { flow, cookie }));
        }
        Some(Message::Keepalive { flow, secret }) => {
            let mut buf = [0u8; 64];
            let n = wire::write_keepalive(&mut buf, flow, secret);
            assert_eq!(wire::parse(&buf[..n]), Some(Message::Keepalive { flow, secret }));
        }
        Some(Message::Refused { reason, .. }) => assert!(reason.len() <= wire::MAX_REASON),
        _ => {}
    }
});
