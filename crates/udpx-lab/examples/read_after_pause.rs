//! What a pause costs the next read of a body (issue 47): the same `pread` of a 256 KiB block
//! from a file in the page cache into one of a pool of blocks, back to back and after pauses of
//! 0.1 to 10 ms (a sleep, or a spin that keeps the CPU busy).
//!
//! A server's shard reads a segment's blocks when a request arrives, after a pause of
//! milliseconds; this shows what the pause alone does to the read's cost on this machine,
//! away from any server: `cargo run --release -p udpx-lab --example read_after_pause [CPU]`
//! (default: the last CPU). It prints, per pause, the read's cost in ms per MB and the
//! hypervisor's steal on that CPU meanwhile (`/proc/stat`); a row with more than 2 % steal is
//! marked and should not be read.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use udpx_lab::cpu::{online_cpus, pin_current_thread};
use udpx_lab::env::parse_cpuinfo;
use udpx_lab::steal::StealMeter;

/// The responder's block (`udpx_h3::cache::BLOCK`).
const BLOCK: usize = 256 << 10;
/// A segment of the scale bench's viewers: four blocks.
const FILE: usize = 4 * BLOCK;
/// Blocks in the pool the reads rotate over (the responder's pool held 14-15 in a Chromium
/// row of `udpx bench h3`, `read_buffers_made`).
const POOL: usize = 16;
/// Reads per row.
const READS: usize = 400;

fn main() {
    let cpu = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("the CPU to pin to: a number, e.g. 1"))
        .unwrap_or_else(|| *online_cpus().last().expect("at least one CPU"));
    pin_current_thread(cpu).expect("pinning to that CPU (is it online?)");

    let dir = std::env::temp_dir().join(format!("udpx-read-after-pause-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("segment");
    let body: Vec<u8> = (0..FILE).map(|i| (i * 31 % 251) as u8).collect();
    File::create(&path).and_then(|mut f| f.write_all(&body)).expect("writing the segment");
    let file = File::open(&path).expect("opening the segment");
    let mut pool: Vec<Vec<u8>> = (0..POOL).map(|_| vec![1u8; BLOCK]).collect();
    // Into the page cache.
    read_all(&file, &mut pool, 0);

    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| parse_cpuinfo(&t).model)
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("read_after_pause: {model}, Linux {}, pinned to CPU {cpu}", kernel.trim());
    println!("A {} KiB file in the page cache read whole after each pause: {} reads of {BLOCK} bytes into {POOL} blocks in turn; {READS} pauses a row", FILE >> 10, FILE / BLOCK);
    println!("| pause | how | ms per MB read | us per read | steal on the CPU |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for (us, spin) in
        [(0, false), (100, false), (1000, false), (1000, true), (5000, false), (5000, true), (10000, false)]
    {
        let pause = Duration::from_micros(us);
        let meter = StealMeter::start(&[cpu]);
        let mut reading = Duration::ZERO;
        for i in 0..READS {
            if spin {
                let until = Instant::now() + pause;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            } else if !pause.is_zero() {
                std::thread::sleep(pause);
            }
            let t = Instant::now();
            read_all(&file, &mut pool, i);
            reading += t.elapsed();
        }
        let steal = meter.stop().expect("/proc/stat and the clock tick rate");
        let per_read = reading.as_secs_f64() / (READS * FILE / BLOCK) as f64;
        println!(
            "| {us} us | {} | {:.3} | {:.1} | {}{} |",
            if us == 0 {
                "back to back"
            } else if spin {
                "spin"
            } else {
                "sleep"
            },
            per_read * 1e3 / (BLOCK as f64 / 1e6),
            per_read * 1e6,
            steal.pct(),
            if steal.stolen { " (stolen: do not read)" } else { "" }
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads the whole file, block by block, into the pool's blocks in turn from `turn`.
fn read_all(file: &File, pool: &mut [Vec<u8>], turn: usize) {
    for (k, at) in (0..FILE).step_by(BLOCK).enumerate() {
        let n = pool.len();
        let block = &mut pool[(turn * (FILE / BLOCK) + k) % n];
        file.read_exact_at(block, at as u64).expect("reading the segment");
    }
}
