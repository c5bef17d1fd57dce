//! `udpx-quiche-bench [PACKETS] [COLD_MIB]`: the microbench of quiche's send path (see the
//! library's docs), one row per source and controller, and the rows as JSON on the last line.

#[global_allocator]
static ALLOC: &udpx_quiche_bench::Counting = udpx_quiche_bench::COUNTING;

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let packets: u64 = match args.next().map(|a| a.parse()) {
        None => 200_000,
        Some(Ok(n)) if n >= 1000 => n,
        Some(_) => {
            eprintln!("udpx-quiche-bench: PACKETS must be a number of at least 1000 (say 200000)");
            return std::process::ExitCode::from(2);
        }
    };
    let cold_mib: usize = match args.next().map(|a| a.parse()) {
        None => 256,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            eprintln!("udpx-quiche-bench: COLD_MIB must be a number of MiB of at least 1 (say 256)");
            return std::process::ExitCode::from(2);
        }
    };
    let dir = std::env::temp_dir().join(format!("udpx-quiche-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut rows = Vec::new();
    println!("| source | cc | packets | ns/packet | allocs/packet (in stream_send) | ACKs | ns/ACK | allocs/ACK |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for source in [udpx_quiche_bench::Source::Hot, udpx_quiche_bench::Source::Cold(cold_mib << 20)] {
        for cc in ["cubic", "bbr2"] {
            let m = udpx_quiche_bench::run(source, cc, packets, &dir);
            println!(
                "| {:?} | {} | {} | {:.0} | {:.3} ({:.3}) | {} | {:.0} | {:.3} |",
                m.source,
                m.cc,
                m.packets_sent,
                m.ns_per_packet,
                m.allocs_per_packet,
                m.stream_send_allocs_per_packet,
                m.acks_processed,
                m.ns_per_ack,
                m.allocs_per_ack
            );
            rows.push(m);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", serde_json::json!({ "quiche_microbench": rows }));
    std::process::ExitCode::SUCCESS
}
