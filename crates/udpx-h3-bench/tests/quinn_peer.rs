//! The bench's second HTTP/3 server (`udpx h3 quinn-serve`: quinn with h3) follows the file
//! server's path rules: a file under the directory is served whole, a symlink out of it, a
//! path with `..` and a FIFO are not.

#[path = "../../udpx-h3/tests/common/mod.rs"]
mod common;

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Site;
use udpx_h3::{get, GetConfig};

#[test]
fn quinn_serve_keeps_to_its_directory() {
    let site = Site::new("quinn-peer");
    let fifo = site.root.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (site.tmp.path().join("cert.pem"), site.tmp.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    // A free port: bound, noted, released for the server.
    let addr = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (root, stop2) = (site.root.clone(), stop.clone());
    let server = std::thread::spawn(move || udpx_h3_bench::quinn_server::serve(&root, addr, &cert, &key, &stop2));
    let status =
        |path: &str| get(&format!("https://{addr}{path}"), None, &GetConfig::default()).map(|r| (r.status, r.bytes));
    // The server binds in its thread: the first request is tried again until it listens.
    let mut small = status("/small");
    for _ in 0..20 {
        if small.as_ref().is_ok_and(|r| r.0 == 200) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        small = status("/small");
    }
    let escape = status("/escape");
    let dotdot = status("/sub/../../secret");
    let fifo_answer = status("/fifo");
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap().expect("quinn-serve ran");
    assert_eq!(small.unwrap(), (200, 1024), "a file under the directory");
    let escape = escape.unwrap();
    assert!(matches!(escape.0, 403 | 404) && escape.1 == 0, "the symlink out of the directory: {escape:?}");
    let dotdot = dotdot.unwrap();
    assert!(matches!(dotdot.0, 400 | 403 | 404) && dotdot.1 == 0, "..: {dotdot:?}");
    let fifo_answer = fifo_answer.unwrap();
    assert!(matches!(fifo_answer.0, 403 | 404) && fifo_answer.1 == 0, "a FIFO: {fifo_answer:?}");
}
