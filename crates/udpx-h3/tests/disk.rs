//! Body reads never wait for the disk on a shard thread (issue 46): a file dropped from the
//! page cache is served whole and byte-exact, its cold ranges read by the disk thread while
//! the responses wait (`http_disk_waits`), and no read on a shard thread could block
//! (`http_disk_blocking_reads` stays 0), with the block cache off and on. The files live under
//! the target directory (a disk: tmpfs pages never leave memory); where the page cache keeps
//! them anyway, the file system refuses `RWF_NOWAIT`, or the disk answered every read before
//! it was refused, the test says SKIP.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};

use common::{content, digest, TempDir, BIG};
use udpx_h3::{get, serve, GetConfig, ServeConfig};

/// A served directory on the disk the target directory is on, removed when dropped.
struct DiskRoot(PathBuf);

impl Drop for DiskRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn root(tag: &str) -> DiskRoot {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("udpx-h3-disk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    DiskRoot(d)
}

/// Writes `bytes` to `path` and drops its pages from the page cache; `false` if any stayed or
/// the file system refuses `RWF_NOWAIT` (then nothing here would wait for the disk). The file
/// is looked at with `mincore`, never read: a read would start the readahead that warms the
/// very pages the server must find cold (`RWF_NOWAIT` is tried on a file beside it).
fn cold_file(path: &Path, bytes: &[u8]) -> bool {
    let beside = path.with_extension("probe");
    std::fs::write(&beside, [1u8; 4096]).unwrap();
    let mut probe = [0u8; 4096];
    let refused = udpx::file::read_nowait(&File::open(&beside).unwrap(), &mut probe, 0);
    if matches!(refused, Err(e) if e.kind() == std::io::ErrorKind::Unsupported) {
        return false;
    }
    std::fs::write(path, bytes).unwrap();
    let f = File::open(path).unwrap();
    f.sync_all().unwrap();
    udpx::file::drop_cached(&f).unwrap();
    udpx::file::cached_pages(&f).unwrap().0 == 0
}

fn cold_downloads(tag: &str, cache: usize) {
    let r = root(tag);
    let want = content(BIG, 7);
    if !cold_file(&r.0.join("big"), &want) {
        let why = "the page cache kept a dropped file here (tmpfs?), or RWF_NOWAIT is refused";
        udpx_lab::netns::record_skip(&format!("disk.rs cold downloads ({tag})"), why);
        return;
    }
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.cache_size = cache;
    let s = serve(&r.0, &cfg).expect("server starts");
    let port = s.local_addr().port();
    let clients: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                let out = TempDir::new("disk-out");
                let dst = out.path().join("big");
                let got = get(&format!("https://127.0.0.1:{port}/big"), Some(&dst), &GetConfig::default());
                (got.map(|g| g.status).map_err(|e| e.to_string()), digest(&std::fs::read(&dst).unwrap_or_default()))
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), (Ok(200), digest(&want)), "byte-exact");
    }
    let c = s.stop().expect("stop");
    println!("cache {cache}: {:?}", c.http);
    assert_eq!(c.http.disk_blocking_reads, 0, "no read on a shard thread could block");
    assert_eq!(c.http.body_bytes, 3 * BIG as u64);
    assert_eq!(c.http.open_files, 0);
    if c.http.disk_waits == 0 {
        // A cold first read starts the kernel's readahead and is refused while its pages are
        // read; a disk that answers before the read looks again (CI's once: 117 reads, none
        // refused) leaves the disk thread nothing to do, and this run cannot judge it.
        let why =
            format!("none of {} reads was refused: the disk answered before any read looked again", c.http.file_reads);
        udpx_lab::netns::record_skip(&format!("disk.rs cold downloads ({tag}): the disk thread"), &why);
    }
}

#[test]
fn a_cold_file_is_served_whole_without_a_shard_waiting_for_the_disk() {
    cold_downloads("nocache", 0);
}

#[test]
fn a_cold_file_is_served_whole_through_the_block_cache() {
    cold_downloads("cache", 64 << 20);
}
