//! The block cache (`ServeConfig::cache_size`, `--cache-size`) through a real server and
//! quiche's client over loopback: many downloads of one file read it once; ranges across block
//! boundaries come byte-exact from cached blocks; a file replaced by rename is served new,
//! never mixed with the old; a file larger than the cache streams whole with the cache's
//! memory held under its bound; many distinct files keep the cache within its bound.

mod common;

use common::{content, digest, Site, TempDir, BIG};
use udpx_h3::server::BLOCK;
use udpx_h3::{get, serve, GetConfig, GetReport, H3Server, ServeConfig};

fn server(site: &Site, cache: usize, shards: usize) -> H3Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.quic.shards = shards;
    cfg.cache_size = cache;
    serve(&site.root, &cfg).expect("server starts")
}

fn fetch(s: &H3Server, path: &str, headers: &[(&str, &str)]) -> (GetReport, Vec<u8>) {
    let out = TempDir::new("cache-out");
    let dst = out.path().join("body");
    let cfg = GetConfig {
        headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        ..GetConfig::default()
    };
    let url = format!("https://127.0.0.1:{}{path}", s.local_addr().port());
    let r = get(&url, Some(&dst), &cfg).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let body = std::fs::read(&dst).unwrap_or_default();
    (r, body)
}

#[test]
fn many_downloads_of_one_file_read_it_once() {
    let site = Site::new("cache-once");
    let s = server(&site, 64 << 20, 2);
    let want = site.file("big");
    let n = 12;
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let port = s.local_addr().port();
            std::thread::spawn(move || {
                let out = TempDir::new("cache-once-out");
                let dst = out.path().join("big");
                let r = get(&format!("https://127.0.0.1:{port}/big"), Some(&dst), &GetConfig::default()).unwrap();
                (r.status, digest(&std::fs::read(&dst).unwrap()))
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), (200, digest(&want)));
    }
    let c = s.stop().unwrap();
    let k = c.cache.expect("the cache is on");
    eprintln!("http {:?}\ncache {k:?}", c.http);
    assert_eq!(c.http.body_bytes, (n * BIG) as u64);
    // Each block read once for all twelve (shards racing for a block may both read it: at most
    // twice).
    assert!(c.http.file_bytes_read >= BIG as u64 && c.http.file_bytes_read <= 2 * BIG as u64, "{:?}", c.http);
    assert_eq!(k.bytes_filled, c.http.file_bytes_read);
    assert!(k.hits >= ((n - 2) * BIG.div_ceil(BLOCK)) as u64, "{k:?}");
    assert_eq!(k.uncached, 0, "{k:?}");
    assert_eq!(k.blocks, BIG.div_ceil(BLOCK) as u64, "every block of the file kept: {k:?}");
    assert!(k.held <= k.capacity, "{k:?}");
}

#[test]
fn ranges_across_blocks_are_byte_exact_from_the_cache() {
    let site = Site::new("cache-ranges");
    let s = server(&site, 64 << 20, 1);
    let want = site.file("big");
    // Warm the cache, then ask for ranges that start and end inside blocks and cross them.
    assert_eq!(fetch(&s, "/big", &[]).0.status, 200);
    let b = BLOCK;
    let ranges = [(0, 10), (b - 5, b + 5), (3 * b + 17, 7 * b + 3), (BIG - 100, BIG - 1), (1, BIG - 2)];
    for (from, to) in ranges {
        let (r, body) = fetch(&s, "/big", &[("range", &format!("bytes={from}-{to}"))]);
        assert_eq!(r.status, 206, "{from}-{to}");
        assert!(body == want[from..=to], "{from}-{to}: differs");
    }
    let c = s.stop().unwrap();
    let k = c.cache.unwrap();
    assert_eq!(c.http.file_bytes_read, BIG as u64, "the ranges came from the cache: {k:?}");
}

#[test]
fn a_file_replaced_by_rename_is_served_new_never_mixed() {
    let site = Site::new("cache-rename");
    let s = server(&site, 64 << 20, 1);
    let old = site.file("big");
    assert!(fetch(&s, "/big", &[]).1 == old);
    let new = content(BIG, 99);
    std::fs::write(site.root.join("big.tmp"), &new).unwrap();
    std::fs::rename(site.root.join("big.tmp"), site.root.join("big")).unwrap();
    for _ in 0..2 {
        let (r, body) = fetch(&s, "/big", &[]);
        assert_eq!(r.status, 200);
        assert!(body == new, "the new version, whole");
    }
    let k = s.stop().unwrap().cache.unwrap();
    assert_eq!(k.bytes_filled, 2 * BIG as u64, "each version read once: {k:?}");
}

#[test]
fn a_file_larger_than_the_cache_streams_within_the_bound() {
    let site = Site::new("cache-small");
    let s = server(&site, 2 << 20, 1);
    let want = site.file("big");
    for _ in 0..2 {
        let (r, body) = fetch(&s, "/big", &[]);
        assert_eq!(r.status, 200);
        assert!(body == want, "whole");
    }
    let k = s.stop().unwrap().cache.unwrap();
    eprintln!("{k:?}");
    assert!(k.evictions > 0 || k.uncached > 0, "a 10 MB file through a 2 MB cache: {k:?}");
    assert!(k.held <= k.capacity, "{k:?}");
}

#[test]
fn many_distinct_files_keep_the_cache_within_its_bound() {
    let site = Site::new("cache-many");
    let dir = site.root.join("many");
    std::fs::create_dir_all(&dir).unwrap();
    let files = 1200;
    for i in 0..files {
        std::fs::write(dir.join(i.to_string()), content(1000, i as u64)).unwrap();
    }
    // Room for about 1,000 of them: the first are evicted as the last come in.
    let s = server(&site, 1_000_000, 1);
    for i in 0..files {
        let (r, body) = fetch(&s, &format!("/many/{i}"), &[]);
        assert_eq!(r.status, 200);
        assert!(body == content(1000, i as u64), "file {i}");
    }
    let k = s.stop().unwrap().cache.unwrap();
    eprintln!("{k:?}");
    assert!(k.evictions > 0, "{k:?}");
    assert!(k.held <= k.capacity && k.blocks < files as u64, "{k:?}");
    assert_eq!(k.misses, files as u64, "{k:?}");
}
