//! What the udpx-tokio examples share: their socket's flags and a client's local address.
//! (A module in a subdirectory of `examples/`, so cargo takes it for no example of its own.)

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use clap::builder::{PossibleValuesParser, TypedValueParser};
use udpx_tokio::Backend;

/// The flags of the example's socket.
#[derive(Debug, clap::Args)]
pub struct SocketArgs {
    /// Where the server listens.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// System calls, or io_uring where the kernel allows (the socket says which it took).
    #[arg(long, default_value = "syscall", value_parser = backend())]
    pub backend: Backend,
}

/// `syscall` or `io-uring`.
fn backend() -> impl TypedValueParser<Value = Backend> {
    PossibleValuesParser::new(["syscall", "io-uring"]).map(|b| {
        if b == "io-uring" {
            Backend::IoUring
        } else {
            Backend::Syscall
        }
    })
}

/// A client's local address for `server`: loopback of its address family, any port.
pub fn client_addr(server: SocketAddr) -> SocketAddr {
    if server.is_ipv6() {
        (Ipv6Addr::LOCALHOST, 0).into()
    } else {
        (Ipv4Addr::LOCALHOST, 0).into()
    }
}
