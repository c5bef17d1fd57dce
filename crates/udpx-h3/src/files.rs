//! From a request path to a file under the served directory, or a refusal.
//!
//! The path is split on `/` first and each segment percent-decoded after, so an encoded
//! slash (`%2f`) can never make a new segment: a segment that decodes to something holding
//! `/` or `\\` is refused, and so is `..` in any spelling (`..`, `%2e%2e`); a NUL (`%00`) is a
//! bad request. What is left is opened beneath the directory ([`open`]: `openat2` with
//! `RESOLVE_BENEATH`, so the kernel refuses a symlink pointing out: 403), or, without
//! `openat2`, joined onto it and canonicalized ([`resolve`]) with the same answers. A
//! directory is served by its `index.html`: asked with a trailing slash, that file; without,
//! [`Resolved::AddSlash`] (the caller redirects, so relative links in the page resolve).
//!
//! | request path | answer |
//! | --- | --- |
//! | `/a/b.txt`, `/a//b.txt`, `/a/./b.txt`, `/a%20b` | the file |
//! | `/../etc/passwd`, `/a/%2e%2e/x`, `/a%2fb`, `/link-to-outside` | 403 |
//! | `/missing`, `/a-directory` | 404 |
//! | `/`, `/dir/` (with an `index.html`) | `index.html` |
//! | `/dir` (with an `index.html`) | add the slash (301) |
//! | `relative`, `/bad%zz`, `/a%00b` | 400 |

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Why a path is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: not an absolute path, or a broken percent escape.
    BadRequest,
    /// 403: it would leave the directory.
    Forbidden,
    /// 404: no such regular file.
    NotFound,
}

impl Refusal {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Refusal::BadRequest => 400,
            Refusal::Forbidden => 403,
            Refusal::NotFound => 404,
        }
    }
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// This regular file.
    File(PathBuf),
    /// A directory with an `index.html`, asked without its trailing slash.
    AddSlash,
}

/// The relative path a request's `:path` names (empty for the directory itself), and the
/// path as asked (for the trailing slash).
fn relative(raw: &str) -> Result<(PathBuf, &str), Refusal> {
    let path = raw.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Err(Refusal::BadRequest);
    }
    let mut rel = PathBuf::new();
    for seg in path.split('/') {
        let dec = percent_decode(seg.as_bytes()).ok_or(Refusal::BadRequest)?;
        if dec.contains(&0) {
            return Err(Refusal::BadRequest);
        }
        if dec.iter().any(|&b| b == b'/' || b == b'\\') || dec == b".." {
            return Err(Refusal::Forbidden);
        }
        if dec.is_empty() || dec == b"." {
            continue;
        }
        rel.push(OsString::from_vec(dec));
    }
    Ok((rel, path))
}

/// The directory a site serves: its canonical path and an open descriptor of it.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    dir: File,
}

impl Root {
    /// Opens `dir` (a directory; canonicalized).
    pub fn open(dir: &Path) -> io::Result<Root> {
        let path = dir.canonicalize()?;
        let dir =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(&path)?;
        Ok(Root { path, dir })
    }

    /// Its canonical path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A file a request names, open.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // made once per request and taken apart at once
pub enum Opened {
    /// This regular file (`path`: its path, for its type and the logs).
    File {
        /// The open file.
        file: File,
        /// Its metadata (one `fstat`).
        meta: Metadata,
        /// Its path under the root.
        path: PathBuf,
    },
    /// A directory with an `index.html`, asked without its trailing slash.
    AddSlash,
}

/// Why [`open`] did not open a file.
#[derive(Debug)]
pub enum OpenError {
    /// The request's path is refused.
    Refused(Refusal),
    /// The system refused (out of descriptors, memory, ...).
    Io(io::Error),
}

impl From<Refusal> for OpenError {
    fn from(r: Refusal) -> Self {
        OpenError::Refused(r)
    }
}

/// Opens the file `raw` (a request's `:path`) names under `root`: one `openat2` with
/// `RESOLVE_BENEATH` (nothing that would leave the directory resolves) and one `fstat`,
/// instead of canonicalizing the path (a `readlink` per component) and stating it twice
/// before opening. Where `openat2` is missing (Linux before 5.6, or a seccomp filter) or
/// refuses a symlink (an absolute one, or one pointing out), [`resolve`] and `open`. Opened non-blocking, so a FIFO in the directory
/// cannot stall the loop; anything but a regular file or a directory is 404.
pub fn open(root: &Root, raw: &str) -> Result<Opened, OpenError> {
    let (rel, asked) = relative(raw)?;
    let rel_c = if rel.as_os_str().is_empty() { PathBuf::from(".") } else { rel.clone() };
    let file = match open_beneath(&root.dir, &rel_c) {
        Ok(f) => f,
        // No openat2 here; or the path crossed an absolute symlink or one pointing out of the
        // directory (EXDEV): the path way decides those (an absolute link to a file inside
        // is served, one pointing out is 403).
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM | libc::EXDEV)) => {
            return fallback(root, raw);
        }
        Err(e) => return Err(refusal_of(e)),
    };
    let meta = file.metadata().map_err(OpenError::Io)?;
    if meta.is_dir() {
        let index = open_beneath(&file, Path::new("index.html")).map_err(refusal_of)?;
        let meta = index.metadata().map_err(OpenError::Io)?;
        if !meta.is_file() {
            return Err(Refusal::NotFound.into());
        }
        if !asked.ends_with('/') {
            return Ok(Opened::AddSlash);
        }
        return Ok(Opened::File { file: index, meta, path: root.path.join(rel).join("index.html") });
    }
    if !meta.is_file() {
        return Err(Refusal::NotFound.into());
    }
    Ok(Opened::File { file, meta, path: root.path.join(rel) })
}

/// `openat2(dir, rel, O_RDONLY, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
fn open_beneath(dir: &File, rel: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    Ok(File::from(rustix::fs::openat2(dir, rel, flags, Mode::empty(), resolve)?))
}

/// What an `open` failure means to the client.
fn refusal_of(e: io::Error) -> OpenError {
    match e.raw_os_error() {
        // Leaving the directory (a `..` or a symlink pointing out).
        Some(libc::EXDEV) => Refusal::Forbidden.into(),
        Some(libc::EACCES | libc::EPERM) => Refusal::Forbidden.into(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG | libc::ENXIO) => Refusal::NotFound.into(),
        _ => OpenError::Io(e),
    }
}

/// [`open`] without `openat2`.
fn fallback(root: &Root, raw: &str) -> Result<Opened, OpenError> {
    match resolve(&root.path, raw)? {
        Resolved::AddSlash => Ok(Opened::AddSlash),
        Resolved::File(path) => {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
                .open(&path)
                .map_err(refusal_of)?;
            let meta = file.metadata().map_err(OpenError::Io)?;
            Ok(Opened::File { file, meta, path })
        }
    }
}

/// The file `raw` (a request's `:path`) names under `root`, which must be canonical, by
/// path (canonicalized: symlinks resolved, then checked to stay under `root`).
pub fn resolve(root: &Path, raw: &str) -> Result<Resolved, Refusal> {
    let (rel, path) = relative(raw)?;
    let full = root.join(rel).canonicalize().map_err(|_| Refusal::NotFound)?;
    if !full.starts_with(root) {
        return Err(Refusal::Forbidden);
    }
    if full.is_dir() {
        let index = full.join("index.html");
        if !index.is_file() {
            return Err(Refusal::NotFound);
        }
        return if path.ends_with('/') { Ok(Resolved::File(index)) } else { Ok(Resolved::AddSlash) };
    }
    if !full.is_file() {
        return Err(Refusal::NotFound);
    }
    Ok(Resolved::File(full))
}

/// `%XX` escapes decoded; `None` for a broken escape.
fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(v);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let base = std::env::temp_dir().join(format!("udpx-h3-files-{}", std::process::id()));
        let root = base.join("root");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/b.txt"), b"b").unwrap();
        std::fs::write(root.join("a b"), b"sp").unwrap();
        std::fs::write(base.join("secret"), b"s").unwrap();
        let _ = std::os::unix::fs::symlink(base.join("secret"), root.join("out"));
        let _ = std::os::unix::fs::symlink(root.join("a/b.txt"), root.join("in"));
        let root = root.canonicalize().unwrap();
        let ok = |p: &str| match resolve(&root, p) {
            Ok(Resolved::File(f)) => Ok(f.strip_prefix(&root).unwrap().to_path_buf()),
            Ok(Resolved::AddSlash) => Ok("AddSlash".into()),
            Err(e) => Err(e),
        };
        assert_eq!(ok("/a/b.txt"), Ok("a/b.txt".into()));
        assert_eq!(ok("/a//b.txt?x=1"), Ok("a/b.txt".into()));
        assert_eq!(ok("/a/./b.txt"), Ok("a/b.txt".into()));
        assert_eq!(ok("/a%20b"), Ok("a b".into()));
        assert_eq!(ok("/in"), Ok("a/b.txt".into()));
        for bad in
            ["/../secret", "/a/../../secret", "/a/%2e%2e/%2e%2e/secret", "/a%2fb.txt", "/a%2Fb.txt", "/out", "/a%5cb"]
        {
            assert_eq!(resolve(&root, bad), Err(Refusal::Forbidden), "{bad}");
        }
        assert_eq!(resolve(&root, "/missing"), Err(Refusal::NotFound));
        assert_eq!(resolve(&root, "/a"), Err(Refusal::NotFound));
        assert_eq!(resolve(&root, "/"), Err(Refusal::NotFound));
        assert_eq!(resolve(&root, "a/b.txt"), Err(Refusal::BadRequest));
        assert_eq!(resolve(&root, "/bad%zz"), Err(Refusal::BadRequest));
        assert_eq!(resolve(&root, "/bad%2"), Err(Refusal::BadRequest));
        assert_eq!(resolve(&root, "/a%00b"), Err(Refusal::BadRequest));
        assert_eq!(resolve(&root, "/a/b.txt%00.html"), Err(Refusal::BadRequest));
        std::fs::write(root.join("a/index.html"), b"i").unwrap();
        assert_eq!(ok("/a/"), Ok("a/index.html".into()));
        assert_eq!(ok("/a?q"), Ok("AddSlash".into()));
        assert_eq!(resolve(&root, "/"), Err(Refusal::NotFound));

        // `open` (openat2 beneath the root) answers every path as `resolve` does; a symlink
        // inside keeps the name asked for (its type comes from the request, as in nginx).
        let r = Root::open(&root).unwrap();
        let opened = |p: &str| match open(&r, p) {
            Ok(Opened::File { path, file, meta }) => {
                assert!(meta.is_file() && file.metadata().unwrap().len() == meta.len());
                Ok(path.strip_prefix(&root).unwrap().to_path_buf())
            }
            Ok(Opened::AddSlash) => Ok("AddSlash".into()),
            Err(OpenError::Refused(x)) => Err(x),
            Err(OpenError::Io(e)) => panic!("{p}: {e}"),
        };
        for p in [
            "/a/b.txt",
            "/a//b.txt?x=1",
            "/a/./b.txt",
            "/a%20b",
            "/../secret",
            "/a/../../secret",
            "/a/%2e%2e/%2e%2e/secret",
            "/a%2fb.txt",
            "/out",
            "/a%5cb",
            "/missing",
            "/missing/x",
            "/a/b.txt/x",
            "/",
            "a/b.txt",
            "/bad%zz",
            "/a%00b",
            "/a/",
            "/a?q",
        ] {
            assert_eq!(opened(p), ok(p), "{p}");
        }
        // An absolute symlink to a file inside is served (by the path way, by its target's
        // name); a relative one keeps the name asked for (its type comes from the request, as
        // in nginx); a relative one pointing out is refused.
        assert_eq!(opened("/in"), Ok("a/b.txt".into()));
        std::os::unix::fs::symlink("a/b.txt", root.join("rel-in")).unwrap();
        std::os::unix::fs::symlink("../secret", root.join("rel-out")).unwrap();
        assert_eq!(opened("/rel-in"), Ok("rel-in".into()));
        assert_eq!(opened("/rel-out"), Err(Refusal::Forbidden));
        // A FIFO is not served, and opening it does not wait for a writer.
        rustix::fs::mkfifoat(rustix::fs::CWD, root.join("fifo"), rustix::fs::Mode::from_raw_mode(0o644)).unwrap();
        assert_eq!(opened("/fifo"), Err(Refusal::NotFound));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
