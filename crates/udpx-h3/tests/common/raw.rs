//! A quiche HTTP/3 client driven by hand over its own loopback socket, for tests that need
//! what udpx's own client will not do (hold a window shut, send trailers, watch GOAWAY).

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// A quiche connection on its own non-blocking socket, driven by [`Raw::pump`].
pub struct Raw {
    pub sock: UdpSocket,
    pub conn: quiche::Connection,
    pub h3: Option<quiche::h3::Connection>,
}

pub fn client_config(stream_window: u64) -> quiche::Config {
    let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    c.set_application_protos(quiche::h3::APPLICATION_PROTOCOL).unwrap();
    c.verify_peer(false);
    c.set_max_idle_timeout(30_000);
    c.set_initial_max_data(32 << 20);
    c.set_initial_max_stream_data_bidi_local(stream_window);
    c.set_initial_max_stream_data_bidi_remote(1 << 20);
    c.set_initial_max_stream_data_uni(1 << 20);
    c.set_initial_max_streams_bidi(100);
    c.set_initial_max_streams_uni(100);
    c
}

impl Raw {
    /// Connects from `local_ip` and finishes the handshake (5 s at most).
    pub fn connect(local_ip: &str, server: SocketAddr, cfg: &mut quiche::Config) -> Raw {
        let r = Raw::attempt(local_ip, server, cfg);
        assert!(r.conn.is_established(), "handshake from {local_ip}");
        r
    }

    /// Tries to connect from `local_ip`: until established or closed, 5 s at most.
    pub fn attempt(local_ip: &str, server: SocketAddr, cfg: &mut quiche::Config) -> Raw {
        let sock = UdpSocket::bind((local_ip, 0)).unwrap();
        sock.set_nonblocking(true).unwrap();
        let mut scid = [0u8; 16];
        udpx_quic::cid::random_bytes(&mut scid).unwrap();
        let local = sock.local_addr().unwrap();
        let conn =
            quiche::connect(Some("localhost"), &quiche::ConnectionId::from_ref(&scid), local, server, cfg).unwrap();
        let mut r = Raw { sock, conn, h3: None };
        let start = Instant::now();
        while !r.conn.is_established() && !r.conn.is_closed() && start.elapsed() < Duration::from_secs(5) {
            r.pump();
            std::thread::sleep(Duration::from_millis(2));
        }
        r
    }

    /// Sets up HTTP/3 on the connection (its control and QPACK streams).
    pub fn with_h3(mut self) -> Raw {
        self.h3 =
            Some(quiche::h3::Connection::with_transport(&mut self.conn, &quiche::h3::Config::new().unwrap()).unwrap());
        self.pump();
        self
    }

    /// Reads what arrived, fires quiche's timer when due, sends what quiche has.
    pub fn pump(&mut self) {
        let mut buf = [0u8; 65_535];
        let local = self.sock.local_addr().unwrap();
        while let Ok((n, from)) = self.sock.recv_from(&mut buf) {
            let _ = self.conn.recv(&mut buf[..n], quiche::RecvInfo { from, to: local });
        }
        if self.conn.timeout().is_some_and(|t| t.is_zero()) {
            self.conn.on_timeout();
        }
        let mut out = [0u8; 1500];
        while let Ok((n, info)) = self.conn.send(&mut out) {
            let _ = self.sock.send_to(&out[..n], info.to);
        }
    }

    /// A GET for `path`; the stream ID.
    pub fn request(&mut self, path: &str, fin: bool) -> Option<u64> {
        let h = [
            quiche::h3::Header::new(b":method", b"GET"),
            quiche::h3::Header::new(b":scheme", b"https"),
            quiche::h3::Header::new(b":authority", b"localhost"),
            quiche::h3::Header::new(b":path", path.as_bytes()),
        ];
        self.h3.as_mut().unwrap().send_request(&mut self.conn, &h, fin).ok()
    }

    /// At most `budget` body bytes of stream `sid`, as far as they arrived (the stream's window
    /// opens only as far as the client reads).
    pub fn body(&mut self, sid: u64, budget: usize) -> Vec<u8> {
        let mut buf = vec![0u8; budget];
        let mut got = 0;
        if let Some(h3) = self.h3.as_mut() {
            while got < budget {
                match h3.recv_body(&mut self.conn, sid, &mut buf[got..]) {
                    Ok(n) if n > 0 => got += n,
                    _ => break,
                }
            }
        }
        buf.truncate(got);
        buf
    }

    /// HTTP/3 events: the status of each response that arrived, body read and dropped.
    pub fn statuses(&mut self) -> Vec<u16> {
        let mut out = Vec::new();
        let Some(h3) = self.h3.as_mut() else { return out };
        let mut body = [0u8; 16_384];
        loop {
            match h3.poll(&mut self.conn) {
                Ok((_, quiche::h3::Event::Headers { list, .. })) => {
                    use quiche::h3::NameValue;
                    if let Some(s) = list.iter().find(|h| h.name() == b":status") {
                        out.push(std::str::from_utf8(s.value()).unwrap().parse().unwrap());
                    }
                }
                Ok((sid, quiche::h3::Event::Data)) => {
                    while h3.recv_body(&mut self.conn, sid, &mut body).is_ok_and(|n| n > 0) {}
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        out
    }
}

/// Pumps every client for `d`, calling `each` on every turn.
pub fn drive(clients: &mut [Raw], d: Duration, mut each: impl FnMut(&mut Raw)) {
    let start = Instant::now();
    while start.elapsed() < d {
        for c in clients.iter_mut() {
            c.pump();
            each(c);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One GET from `local_ip` on a fresh connection: its status (10 s at most).
pub fn fresh_get(local_ip: &str, server: SocketAddr, path: &str) -> Option<u16> {
    let mut c = Raw::connect(local_ip, server, &mut client_config(1 << 20)).with_h3();
    c.request(path, true)?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        c.pump();
        if let Some(&s) = c.statuses().first() {
            let _ = c.conn.close(true, 0x100, b"");
            c.pump();
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}
