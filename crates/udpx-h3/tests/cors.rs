//! `--cors` through both listeners of one server: a segment and a range fetched with an
//! `origin` over HTTP/3 (quiche's client) and over HTTP/2 (the h2 crate over TLS) carry
//! `access-control-allow-origin`; a preflight over HTTP/2 is answered; another origin is not
//! named.

mod common;

use common::tls::h2_tls;
use common::{content, TempDir};
use udpx_h3::cors::Cors;
use udpx_h3::{get, serve, GetConfig, ServeConfig, SiteOptions};

const ORIGIN: &str = "https://player.example";

#[test]
fn a_segment_and_a_range_over_http3_and_http2_name_the_origin() {
    let tmp = TempDir::new("cors");
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let seg = content(300_000, 5);
    std::fs::write(www.join("seg.m4s"), &seg).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (tmp.path().join("cert.pem"), tmp.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = udpx_h3::Tls::Files { cert: cert.clone(), key: key.clone() };
    cfg.alt_svc_tcp = Some("127.0.0.1:0".parse().unwrap());
    cfg.site = SiteOptions { cors: Cors::parse(&[ORIGIN.into()]).unwrap(), ..SiteOptions::default() };
    let server = serve(&www, &cfg).expect("server starts");
    let url = format!("https://127.0.0.1:{}/seg.m4s", server.local_addr().port());

    // HTTP/3: the whole segment, then a range, from the allowed origin; then another origin.
    let h3 = |headers: &[(&str, &str)]| {
        let out = tmp.path().join("h3-body");
        let cfg = GetConfig {
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            ..GetConfig::default()
        };
        let r = get(&url, Some(&out), &cfg).unwrap();
        let allow = r.headers.iter().find(|(n, _)| n == "access-control-allow-origin").map(|(_, v)| v.clone());
        (r.status, allow, std::fs::read(&out).unwrap())
    };
    let (status, allow, body) = h3(&[("origin", ORIGIN)]);
    assert_eq!((status, allow.as_deref()), (200, Some(ORIGIN)));
    assert!(body == seg);
    let (status, allow, body) = h3(&[("origin", ORIGIN), ("range", "bytes=1000-1999")]);
    assert_eq!((status, allow.as_deref()), (206, Some(ORIGIN)));
    assert!(body == seg[1000..2000]);
    let (status, allow, _) = h3(&[("origin", "https://evil.example")]);
    assert_eq!((status, allow), (200, None));

    // HTTP/2 over TLS: a preflight, then the range.
    let addr = server.tcp_addr().expect("the TCP listener runs");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (pre, ranged) = rt.block_on(async move {
        let tls = h2_tls(&cert, addr).await;
        let (mut client, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(conn);
        let req = http::Request::builder()
            .method("OPTIONS")
            .uri(format!("https://{addr}/seg.m4s"))
            .header("origin", ORIGIN)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "range")
            .body(())
            .unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let pre = resp.await.unwrap();
        let req = http::Request::get(format!("https://{addr}/seg.m4s"))
            .header("origin", ORIGIN)
            .header("range", "bytes=0-99")
            .body(())
            .unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        let head = resp.headers().clone();
        let status = resp.status();
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        ((pre.status(), pre.headers().clone()), (status, head, got))
    });
    assert_eq!(pre.0, 204);
    assert_eq!(pre.1["access-control-allow-origin"], ORIGIN);
    assert_eq!(pre.1["access-control-allow-headers"], "range");
    assert_eq!(ranged.0, 206);
    assert_eq!(ranged.1["access-control-allow-origin"], ORIGIN);
    assert!(ranged.1["access-control-expose-headers"].to_str().unwrap().contains("content-range"));
    assert_eq!(ranged.1["vary"], "origin");
    assert!(ranged.2 == seg[..100]);
    drop(server);
}
