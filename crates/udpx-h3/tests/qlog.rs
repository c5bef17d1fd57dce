//! qlog (`--qlog-dir`, `udpx_quic::qlog`) from a running server: a download's file parses
//! record by record (JSON-SEQ: RS, a JSON text, a newline) and holds its `packet_sent`
//! events; only the chosen connections get a file; and with the writer stalled (a disk that
//! hangs) and a tiny queue, a burst of connections is served while records are dropped and
//! counted, never waited for. Needs the features `qlog` (and `fault-injection` for the stall):
//! `cargo test -p udpx-h3 --features qlog,fault-injection --test qlog` (scripts/test.sh runs
//! every feature). Without the feature, the setting is refused.

mod common;

/// A build without the feature refuses qlog rather than serve without it.
#[cfg(not(feature = "qlog"))]
#[test]
fn a_build_without_qlog_refuses_it() {
    let tmp = common::TempDir::new("qlog-off");
    let mut cfg = udpx_h3::ServeConfig::new("127.0.0.1:0".parse().unwrap());
    let q = udpx_quic::QlogConfig::new(tmp.path().join("qlog"));
    cfg.quic.host.qlog = Some(udpx_quic::Qlog::start(&q).unwrap());
    let e = udpx_h3::serve(tmp.path(), &cfg).unwrap_err();
    assert!(e.is_usage() && e.to_string().contains("--features qlog"), "{e}");
}

#[cfg(feature = "qlog")]
mod on {
    use super::common;

    use std::path::{Path, PathBuf};

    use common::{content, TempDir};
    use udpx_h3::{get, serve, GetConfig, H3Server, ServeConfig};
    use udpx_quic::{Qlog, QlogConfig, QlogPolicy};

    /// A server of `www/seg` (200 kB) with qlog into `dir` by `cfg`.
    fn server(tmp: &TempDir, qlog: &QlogConfig) -> (H3Server, Qlog, Vec<u8>) {
        let www = tmp.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        let body = content(200_000, 3);
        std::fs::write(www.join("seg"), &body).unwrap();
        let q = Qlog::start(qlog).unwrap();
        let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.quic.host.qlog = Some(q.clone());
        (serve(&www, &cfg).expect("server starts"), q, body)
    }

    fn download(server: &H3Server, body: &[u8]) {
        let url = format!("https://127.0.0.1:{}/seg", server.local_addr().port());
        let out = std::env::temp_dir().join(format!(
            "udpx-h3-qlog-dl-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let r = get(&url, Some(&out), &GetConfig::default()).unwrap();
        assert_eq!(r.status, 200);
        assert!(std::fs::read(&out).unwrap() == body);
        let _ = std::fs::remove_file(&out);
    }

    /// The files in `dir`, each parsed record by record: every record an RS, one JSON text and a
    /// newline (a record that does not parse fails the test).
    fn records(dir: &Path) -> Vec<(PathBuf, Vec<serde_json::Value>)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(bytes.first(), Some(&0x1e), "{}: JSON-SEQ starts with RS", p.display());
            let recs = bytes[1..]
                .split(|&b| b == 0x1e)
                .map(|r| {
                    assert_eq!(r.last(), Some(&b'\n'), "{}: a record ends with a newline", p.display());
                    serde_json::from_slice::<serde_json::Value>(r).unwrap_or_else(|e| {
                        panic!("{}: a record that is not JSON ({e}): {}", p.display(), String::from_utf8_lossy(r))
                    })
                })
                .collect();
            out.push((p, recs));
        }
        out
    }

    fn name(r: &serde_json::Value) -> &str {
        r["name"].as_str().unwrap_or("")
    }

    #[test]
    fn a_downloads_qlog_parses_record_by_record_and_holds_its_packets_sent() {
        let tmp = TempDir::new("qlog");
        let dir = tmp.path().join("qlog");
        let (server, q, body) = server(&tmp, &QlogConfig::new(dir.clone()));
        download(&server, &body);
        let c = server.stop().unwrap();
        q.flush().unwrap();
        let files = records(&dir);
        assert_eq!(files.len(), 1, "one connection, one file: {files:?}");
        let (path, recs) = &files[0];
        let file = path.file_name().unwrap().to_str().unwrap();
        assert!(file.ends_with(".sqlog") && file.contains('T') && file.contains('Z'), "time and ID: {file}");
        assert_eq!(recs[0]["serialization_format"], "JSON-SEQ", "the header record: {}", recs[0]);
        let sent = recs.iter().filter(|r| name(r) == "quic:packet_sent").count();
        // 200 kB in packets of at most 1452 bytes: at least 138 packets sent.
        assert!(sent >= 138, "{sent} packet_sent events in {} records", recs.len());
        assert!(recs.iter().any(|r| name(r) == "quic:packet_received"));
        let qc = c.qlog.expect("the qlog counters");
        assert_eq!((qc.files, qc.dropped, qc.skipped, qc.write_errors), (1, 0, 0, 0), "{qc:?}");
        assert_eq!(qc.records as usize, recs.len(), "every record queued is in the file");
    }

    #[test]
    fn only_the_chosen_connections_are_logged() {
        let tmp = TempDir::new("qlog-peers");
        let dir = tmp.path().join("qlog");
        let mut cfg = QlogConfig::new(dir.clone());
        cfg.policy = QlogPolicy { sample: 0.0, peers: vec!["127.0.0.2".parse().unwrap()] };
        let (server, q, body) = server(&tmp, &cfg);
        download(&server, &body); // from 127.0.0.1: not named
        assert_eq!(q.counters().files, 0);
        q.set_policy(QlogPolicy { sample: 0.0, peers: vec!["127.0.0.1".parse().unwrap()] }).unwrap();
        download(&server, &body);
        drop(server);
        q.flush().unwrap();
        assert_eq!(records(&dir).len(), 1, "the second connection only");
    }

    /// The writer stalls (as on a disk that hangs) with a queue of 8 messages: 30 connections are
    /// each served whole while the writer does not write at all (a shard that waited for room in
    /// the queue would stall with it, and the downloads time out), their records dropped and
    /// counted; once the writer goes on, every file still parses record by record.
    #[cfg(feature = "fault-injection")]
    #[test]
    fn a_burst_with_the_writer_stalled_drops_records_instead_of_waiting() {
        let tmp = TempDir::new("qlog-burst");
        let dir = tmp.path().join("qlog");
        let mut cfg = QlogConfig::new(dir.clone());
        cfg.queue = 8;
        let (server, q, body) = server(&tmp, &cfg);
        let hold = q.hold();
        for _ in 0..30 {
            download(&server, &body);
        }
        let during = q.counters();
        drop(hold);
        drop(server);
        q.flush().unwrap();
        let after = q.counters();
        println!("while stalled: {during:?}; after: {after:?}");
        assert_eq!(during.files, 30, "{during:?}");
        assert!(during.dropped > 1000, "records dropped while the writer stalled: {during:?}");
        assert!(during.records <= 9, "the queue's 8 (and the one the writer holds) at most: {during:?}");
        let files = records(&dir);
        let written: usize = files.iter().map(|(_, r)| r.len()).sum();
        assert_eq!(written as u64, after.records, "what was queued is written whole: {after:?}");
    }
}
