//! `udpx bench quic`: quinn on udpx against quinn on quinn-udp, end to end.

mod common;

/// `udpx bench quic` end to end, one round: every row transfers the whole gigabyte and reports
/// its cost; udpx's rows report their send and receive batching. (Costs are reported, never
/// judged here.) Bad sizes exit 2.
#[test]
fn bench_quic_runs_every_row() {
    common::assert_usage_errors(&[
        (&["bench", "quic", "--size", "0"], "--size"),
        (&["bench", "quic", "--rounds", "0"], "--rounds"),
    ]);
    let o = common::udpx(&["bench", "quic", "--rounds", "1", "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["quic_bench"]["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(names, ["QuinnUdp", "UdpxSyscall", "UdpxIoUring"]);
    for r in rows {
        let run = &r["runs"][0];
        assert!(run["cpu_s_per_gb"].as_f64().is_some_and(|c| c > 0.0), "{r}\n{err}");
        if r["path"] != "QuinnUdp" {
            assert!(run["datagrams_per_send"].as_f64().is_some_and(|d| d >= 1.0), "{r}");
        }
    }
}
