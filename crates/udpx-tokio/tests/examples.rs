//! The examples run as a user runs them, over loopback: `tokio_echo` as a server and as its
//! client (every request echoed, byte for byte, on each backend), and `quinn_endpoint` as a
//! server and a client in two processes (the client's bytes come back intact) and as both in
//! one. Each example is the binary `cargo test` built (see `udpx_netns::examples`), killed if
//! a test fails before it ends.

use std::path::PathBuf;
use std::time::Duration;

use udpx_netns::examples::{number_after, Examples};

const EXAMPLES: Examples = udpx_netns::examples!();

/// Starts the server `example` with `server`, then its client with `client` and `--connect`
/// the address the server printed; both must end successfully. Their outputs: (server, client).
fn server_then_client(example: &str, server: &[&str], client: &[&str]) -> (String, String) {
    let mut running = EXAMPLES.start(example, server);
    let addr = running.listening_on().to_string();
    let client: Vec<&str> = client.iter().copied().chain(["--connect", &addr]).collect();
    let (status, client_out) = EXAMPLES.start(example, &client).finish(Duration::from_secs(90));
    assert!(status.success(), "{example} {client:?}: {status}\n{client_out}");
    let (status, served) = running.finish(Duration::from_secs(30));
    eprintln!("server:\n{served}client:\n{client_out}");
    assert!(status.success(), "{example} {server:?}: {status}\n{served}");
    (served, client_out)
}

/// The server `tokio_echo` and its client `tokio_echo --connect`, on `backend`: the client
/// checks every reply; the server stops at its count.
fn echo(backend: &str) {
    let (served, client) = server_then_client(
        "tokio_echo",
        &["--count", "100", "--seconds", "60", "--backend", backend],
        &["--count", "100", "--backend", backend],
    );
    assert!(client.contains("100 of 100 requests echoed intact"), "{client}");
    assert_eq!(number_after::<u64>(&served, "served "), 100, "{served}");
    if backend == "io-uring" {
        // On io_uring where the kernel allows it; otherwise the socket said why not.
        assert!(served.contains("(io_uring") || served.contains("(system calls: "), "{served}");
    }
}

#[test]
fn tokio_echo_on_system_calls() {
    echo("syscall");
}

#[test]
fn tokio_echo_on_io_uring() {
    echo("io-uring");
}

/// A quinn server and a quinn client in two processes: the client's megabyte comes back
/// intact, the server served one connection and stopped.
#[test]
fn quinn_endpoint_server_and_client() {
    let cert = std::env::temp_dir().join(format!("udpx-tokio-example-cert-{}.der", std::process::id()));
    let cert_s = cert.to_str().unwrap().to_owned();
    // Removed also when the test fails.
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(cert.clone());
    // The server writes the certificate before it prints `listening on`.
    let (served, client) = server_then_client(
        "quinn_endpoint",
        &["--role", "server", "--cert-out", &cert_s, "--connections", "1", "--seconds", "60"],
        &["--role", "client", "--cert", &cert_s, "--bytes", "1000000", "--seconds", "60"],
    );
    assert!(client.contains("1000000 bytes echoed intact"), "{client}");
    assert!(served.contains("served 1 connection(s), echoed 1000000 bytes"), "{served}");
}

/// Both ends in one process, on io_uring where the kernel allows it.
#[test]
fn quinn_endpoint_both_ends_on_io_uring() {
    let (status, out) = EXAMPLES
        .start("quinn_endpoint", &["--backend", "io-uring", "--bytes", "300000"])
        .finish(Duration::from_secs(90));
    eprintln!("{out}");
    assert!(status.success(), "{status}\n{out}");
    assert!(out.contains("300000 bytes echoed intact"), "{out}");
    assert!(out.contains("served 1 connection(s), echoed 300000 bytes"), "{out}");
}
