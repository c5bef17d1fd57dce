//! Reload without restart (issue 40, item 3): the certificate and key read again while the
//! server runs. New connections get the new certificate, a connection opened before carries on,
//! and files that do not load leave the certificate in force serving, with the reason. The
//! clients are quiche driven by hand (it shows the certificate the server sent).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::raw::{client_config, Raw};
use common::Site;
use udpx_h3::{serve, H3Server, ServeConfig, Tls};

/// A fresh self-signed certificate for localhost: its DER, and its PEM files written to `dir`.
fn write_cert(dir: &Path) -> Vec<u8> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.join("cert.pem"), ck.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), ck.key_pair.serialize_pem()).unwrap();
    ck.cert.der().to_vec()
}

/// The certificate a new connection is given.
fn served_cert(server: &H3Server) -> Vec<u8> {
    let c = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(1 << 20));
    c.conn.peer_cert().expect("the server sent a certificate").to_vec()
}

/// Waits (5 s at most) until every shard has taken `n` configurations in all.
fn reloaded(server: &H3Server, n: u64) -> u64 {
    let start = Instant::now();
    loop {
        let got = server.counters().quic.config_reloads;
        if got >= n || start.elapsed() > Duration::from_secs(5) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A GET for `/small` on `c`: its status (5 s at most).
fn get_small(c: &mut Raw) -> Option<u16> {
    c.request("/small", true)?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        c.pump();
        if let Some(&s) = c.statuses().first() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn a_reloaded_certificate_serves_new_connections_and_bad_files_keep_the_old_one() {
    let site = Site::new("reload");
    let dir = site.tmp.path().to_path_buf();
    let first = write_cert(&dir);
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.quic.shards = 2;
    cfg.tls = Tls::Files { cert: dir.join("cert.pem"), key: dir.join("key.pem") };
    let server = serve(&site.root, &cfg).expect("server starts");
    assert_eq!(served_cert(&server), first);
    let mut before = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(1 << 20)).with_h3();

    let second = write_cert(&dir);
    server.reload_tls().expect("the new files load");
    assert_eq!(reloaded(&server, 2), 2, "each shard took the new configuration");
    for _ in 0..4 {
        assert_eq!(served_cert(&server), second, "a new connection gets the new certificate");
    }
    assert_eq!(get_small(&mut before), Some(200), "a connection opened before carries on");

    // A broken certificate, then a key that is not the certificate's: refused, said why, and
    // the second certificate serves on.
    std::fs::write(dir.join("cert.pem"), b"-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    let e = server.reload_tls().expect_err("a broken certificate").to_string();
    assert!(e.contains("not a PEM certificate chain"), "{e}");
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.join("cert.pem"), other.cert.pem()).unwrap();
    let e = server.reload_tls().expect_err("a key for another certificate").to_string();
    assert!(e.contains("not a PEM private key for the certificate"), "{e}");
    std::fs::remove_file(dir.join("key.pem")).unwrap();
    let e = server.reload_tls().expect_err("a missing key").to_string();
    assert!(e.contains("key file"), "{e}");
    std::thread::sleep(Duration::from_millis(300)); // past a publication of every shard
    assert_eq!(server.counters().quic.config_reloads, 2, "nothing was taken");
    assert_eq!(served_cert(&server), second);
    server.stop().expect("stop");
}

#[test]
fn a_generated_certificate_has_nothing_to_reload() {
    let site = Site::new("reload-self");
    let server = serve(&site.root, &ServeConfig::new("127.0.0.1:0".parse().unwrap())).expect("server starts");
    let e = server.reload_tls().expect_err("no files").to_string();
    assert!(e.contains("no --cert/--key"), "{e}");
    server.stop().expect("stop");
}

/// SIGUSR1's part (logrotate): the access log moved away, reopened, later lines go to a new file
/// of its name.
#[test]
fn the_access_log_reopens_after_it_was_moved() {
    let site = Site::new("reopen");
    let log = site.tmp.path().join("access.log");
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.site.access_log = Some(log.clone());
    let server = serve(&site.root, &cfg).expect("server starts");
    let mut c = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(1 << 20)).with_h3();
    assert_eq!(get_small(&mut c), Some(200));
    let rotated = site.tmp.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    assert!(server.reopen_log().expect("reopened"), "a file to reopen");
    assert_eq!(get_small(&mut c), Some(200));
    server.flush_log().expect("the access log flushed");
    let first = std::fs::read_to_string(&rotated).unwrap();
    let second = std::fs::read_to_string(&log).unwrap();
    assert_eq!((first.lines().count(), second.lines().count()), (1, 1), "{first:?} {second:?}");
    assert!(second.contains("\"/small\" 200"), "{second}");
    server.stop().expect("stop");
}

/// The third review: a reload reads each file once for every shard (and the TCP listener),
/// so shards cannot disagree when the file changes under them. The certificate is a FIFO that
/// gives its bytes to exactly one reader: the reload of four shards succeeds and every shard
/// serves the new certificate. (Before, each shard opened the file again: the second one
/// waited for a writer that never came.)
#[test]
fn a_reload_reads_each_file_once_for_every_shard() {
    let site = Site::new("reload-once");
    let dir = site.tmp.path().to_path_buf();
    write_cert(&dir);
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.quic.shards = 4;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    cfg.tls = Tls::Files { cert: cert.clone(), key: key.clone() };
    let server = serve(&site.root, &cfg).expect("server starts");

    let next = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(&key, next.key_pair.serialize_pem()).unwrap();
    std::fs::remove_file(&cert).unwrap();
    nix::unistd::mkfifo(&cert, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let pem = next.cert.pem();
    let fifo = cert.clone();
    // One writer: the first reader gets the certificate, and a second would wait for ever.
    let writer = std::thread::spawn(move || std::fs::write(&fifo, pem).unwrap());
    let reload = {
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::sync::Arc::new(server);
        let s = server.clone();
        std::thread::spawn(move || tx.send(s.reload_tls().map_err(|e| e.to_string())).unwrap());
        let r = rx.recv_timeout(Duration::from_secs(10));
        if r.is_err() {
            // Release the reader that waits, so the test ends.
            let _ = std::fs::write(&cert, b"");
        }
        (r, server)
    };
    let (result, server) = reload;
    writer.join().unwrap();
    assert!(matches!(result, Ok(Ok(()))), "the reload of four shards read the FIFO once: {result:?}");
    assert_eq!(reloaded(&server, 4), 4);
    for _ in 0..8 {
        assert_eq!(served_cert(&server), next.cert.der().to_vec(), "every shard serves the new certificate");
    }
}

/// The third review: access-log writes left the shard thread. The log is a FIFO whose reader
/// never reads: once its 64 KiB are full, a write blocks. 1,200 requests (about 130 KiB of
/// lines) are all answered; the lines wait in the writer's queue. (Before, the shard wrote the
/// line itself and stopped answering after about 550.)
#[test]
fn a_stuck_access_log_does_not_stop_the_server() {
    use std::os::unix::fs::OpenOptionsExt;
    let site = Site::new("log-stuck");
    let log = site.tmp.path().join("access.fifo");
    nix::unistd::mkfifo(&log, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A reader that never reads (the server's open for writing needs one).
    let _reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&log).unwrap();
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.site.access_log = Some(log.clone());
    let server = serve(&site.root, &cfg).expect("server starts");
    let mut answered = 0;
    for _ in 0..24 {
        let mut c = Raw::connect("127.0.0.1", server.local_addr(), &mut client_config(1 << 20)).with_h3();
        for _ in 0..50 {
            c.request("/small", true).expect("a request");
        }
        let start = Instant::now();
        let mut got = 0;
        while got < 50 && start.elapsed() < Duration::from_secs(10) {
            c.pump();
            got += c.statuses().iter().filter(|&&s| s == 200).count();
            std::thread::sleep(Duration::from_millis(1));
        }
        answered += got;
        if got < 50 {
            break;
        }
    }
    let h = server.counters().http;
    assert_eq!(answered, 1200, "every request answered while the log is stuck: {h:?}");
    assert!(server.flush_log().is_err(), "the lines cannot all be written: the FIFO is full");
}
