//! From a request path to a file under the served directory, or a refusal.
//!
//! The path is split on `/` first and each segment percent-decoded after, so an encoded
//! slash (`%2f`) can never make a new segment: a segment that decodes to something holding
//! `/` or `\\` is refused, and so is `..` in any spelling (`..`, `%2e%2e`); a NUL (`%00`) is a
//! bad request. What is left is joined onto the directory and canonicalized (symlinks
//! resolved); a result outside the directory (a symlink pointing out) is refused too. A
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
use std::os::unix::ffi::OsStringExt;
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

/// The file `raw` (a request's `:path`) names under `root`, which must be canonical.
pub fn resolve(root: &Path, raw: &str) -> Result<Resolved, Refusal> {
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
        std::fs::remove_dir_all(&base).unwrap();
    }
}
