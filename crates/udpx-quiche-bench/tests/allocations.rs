//! The quiche patch series' steady-state promise (issue 47): sending a full packet, and taking
//! an acknowledgement in, allocates nothing. Counts, never times. quiche 0.30.0 as published
//! allocates twice per packet sent (`do_handshake` cloned the local transport parameters on
//! every `send()`: patch 0001) and once per packet received (the header's connection ID went
//! to the heap: patch 0002); this test runs on the patched tree the workspace builds, and fails
//! on the pristine one (`scripts/quiche-microbench.sh` builds both).

#[global_allocator]
static ALLOC: &udpx_quiche_bench::Counting = udpx_quiche_bench::COUNTING;

#[test]
fn a_packet_sent_or_an_ack_taken_in_steady_state_allocates_nothing() {
    let dir = std::env::temp_dir().join(format!("udpx-quiche-allocs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for cc in ["cubic", "bbr2"] {
        let m = udpx_quiche_bench::run(udpx_quiche_bench::Source::Hot, cc, 20_000, &dir);
        // `send()` alone: the application's `stream_send` copies into buffers quiche allocates
        // (udpx hands it its own through the zero-copy path instead).
        let in_send = m.allocs_per_packet - m.stream_send_allocs_per_packet;
        println!("{cc}: {in_send:.4} allocations per packet in send(), {:.3} per ACK processed", m.allocs_per_ack);
        // Below one in twenty: a SmallVec that grows now and then is not "per packet".
        assert!(in_send < 0.05, "{cc}: {in_send:.3} allocations per packet sent: {m:?}");
        assert!(m.allocs_per_ack < 0.05, "{cc}: {:.3} allocations per ACK packet taken in: {m:?}", m.allocs_per_ack);
        assert!(m.packets_sent >= 20_000, "{m:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
