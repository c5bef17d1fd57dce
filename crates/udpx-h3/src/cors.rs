//! Cross-origin reads (`--cors ORIGIN`, the Fetch standard's CORS protocol): a web player
//! (hls.js, dash.js) on a page of another origin fetches segments and ranges only if the
//! response names its origin.
//!
//! - **Which origins**: a list of exact origins (`https://player.example`, scheme, host and
//!   port as a browser sends them), or `*` (any, without credentials).
//! - **Every answer** of the site (files, ranges, 304, and errors: 404, 416, 503, ...) to a
//!   request whose `origin` is allowed carries `access-control-allow-origin` (the origin, or
//!   `*`) and `access-control-expose-headers` (`content-range`, `accept-ranges`, `etag`: what a
//!   player reads beyond the safelisted ones). With a list, every answer carries `vary:
//!   origin`, since it depends on the request's origin (a shared cache keeps them apart).
//! - **Preflights** (`OPTIONS` with `access-control-request-method`): 204 with the allowed
//!   methods (GET, HEAD), the requested headers that a player sends (`range`, `if-range`,
//!   `if-none-match`, `if-modified-since`, ...) and `access-control-max-age`; from an origin not
//!   allowed, 403 without them. A plain `OPTIONS` gets 204 with `allow`.
//! - Off (the default): nothing changes; `OPTIONS` is 405 like any other method.

/// Which origins may read the site's answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Cors {
    /// No CORS headers (the default).
    #[default]
    Off,
    /// Any origin (`*`).
    Any,
    /// These origins exactly.
    Origins(Vec<String>),
}

/// Request headers a preflight may ask for: what media players and browsers send on a GET.
const ALLOWED_HEADERS: [&str; 8] = [
    "range",
    "if-range",
    "if-none-match",
    "if-modified-since",
    "if-match",
    "if-unmodified-since",
    "cache-control",
    "pragma",
];

/// Response headers a script may read beyond the safelisted ones.
const EXPOSED: &str = "content-range, accept-ranges, etag";

/// How long a browser may keep a preflight's answer (Chromium keeps at most 2 hours).
const MAX_AGE: &str = "7200";

impl Cors {
    /// From the `--cors` values: `*` alone, or origins (`scheme://host[:port]`, no path).
    pub fn parse(values: &[String]) -> Result<Cors, String> {
        if values.is_empty() {
            return Ok(Cors::Off);
        }
        if values.iter().any(|v| v == "*") {
            if values.len() > 1 {
                return Err("--cors *: give * alone (any origin), or only origins".into());
            }
            return Ok(Cors::Any);
        }
        for v in values {
            let ok = v.split_once("://").is_some_and(|(scheme, rest)| {
                matches!(scheme, "http" | "https")
                    && !rest.is_empty()
                    && !rest.contains(['/', '?', '#', ' ', '*'])
                    && rest.bytes().all(|b| b.is_ascii_graphic())
            });
            if !ok || v.bytes().any(|b| b.is_ascii_uppercase()) {
                return Err(format!(
                    "--cors {v:?}: give an origin as a browser sends it (https://player.example or \
                     https://player.example:8443: lower case, no path, no trailing slash), or *"
                ));
            }
        }
        Ok(Cors::Origins(values.to_vec()))
    }

    /// Whether it is on.
    pub fn is_on(&self) -> bool {
        *self != Cors::Off
    }

    /// The `access-control-allow-origin` value for a request from `origin`, if allowed.
    fn allow(&self, origin: Option<&[u8]>) -> Option<String> {
        match (self, origin) {
            (Cors::Any, Some(_)) => Some("*".into()),
            (Cors::Origins(list), Some(o)) => list.iter().find(|a| a.as_bytes() == o).cloned(),
            _ => None,
        }
    }

    /// Adds the headers an answer to a request with `headers` carries.
    pub(crate) fn decorate(&self, headers: &[(&[u8], &[u8])], out: &mut Vec<(&'static str, String)>) {
        if let Some(allow) = self.allow(field(headers, b"origin")) {
            out.push(("access-control-allow-origin", allow));
            out.push(("access-control-expose-headers", EXPOSED.into()));
        }
        if matches!(self, Cors::Origins(_)) {
            out.push(("vary", "origin".into()));
        }
    }

    /// A preflight's answer, if the request is one: its status and headers.
    pub(crate) fn preflight(&self, headers: &[(&[u8], &[u8])]) -> Option<(u16, Vec<(&'static str, String)>)> {
        if !self.is_on() {
            return None;
        }
        let method = field(headers, b"access-control-request-method")?;
        let mut out = Vec::new();
        if self.allow(field(headers, b"origin")).is_none() || !matches!(method, b"GET" | b"HEAD") {
            if matches!(self, Cors::Origins(_)) {
                out.push(("vary", "origin".into()));
            }
            return Some((403, out));
        }
        self.decorate(headers, &mut out);
        out.push(("access-control-allow-methods", "GET, HEAD".into()));
        let asked = field(headers, b"access-control-request-headers").unwrap_or_default();
        let granted: Vec<&str> = String::from_utf8_lossy(asked)
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter_map(|h| ALLOWED_HEADERS.iter().copied().find(|a| *a == h))
            .collect();
        if !granted.is_empty() {
            out.push(("access-control-allow-headers", granted.join(", ")));
        }
        out.push(("access-control-max-age", MAX_AGE.into()));
        Some((204, out))
    }
}

/// The value of the header field `name` (lower case), if there is one.
fn field<'a>(headers: &[(&'a [u8], &'a [u8])], name: &[u8]) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Cors {
        Cors::parse(&["https://player.example".into(), "http://localhost:8080".into()]).unwrap()
    }

    fn get<'a>(h: &'a [(&'a str, &'a str)]) -> Vec<(&'a [u8], &'a [u8])> {
        h.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect()
    }

    #[test]
    fn origins_parse_and_bad_ones_say_what_to_give() {
        assert_eq!(Cors::parse(&[]).unwrap(), Cors::Off);
        assert_eq!(Cors::parse(&["*".into()]).unwrap(), Cors::Any);
        assert!(Cors::parse(&["*".into(), "https://a.example".into()]).unwrap_err().contains("alone"));
        for bad in [
            "player.example",
            "https://player.example/",
            "https://a.example/path",
            "ftp://a",
            "https://A.example",
            "https://",
        ] {
            let e = Cors::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains("as a browser sends it"), "{bad}: {e}");
        }
    }

    #[test]
    fn allowed_origins_get_the_headers_and_others_do_not() {
        let mut h = Vec::new();
        list().decorate(&get(&[("origin", "https://player.example")]), &mut h);
        assert!(h.contains(&("access-control-allow-origin", "https://player.example".into())), "{h:?}");
        assert!(h.contains(&("vary", "origin".into())));
        assert!(h.iter().any(|(n, v)| *n == "access-control-expose-headers" && v.contains("content-range")));
        let mut h = Vec::new();
        list().decorate(&get(&[("origin", "https://evil.example")]), &mut h);
        assert_eq!(h, vec![("vary", "origin".into())], "no allow-origin, still varies");
        let mut h = Vec::new();
        Cors::Any.decorate(&get(&[("origin", "https://any.example")]), &mut h);
        assert!(h.contains(&("access-control-allow-origin", "*".into())) && !h.iter().any(|(n, _)| *n == "vary"));
        let mut h = Vec::new();
        Cors::Any.decorate(&get(&[]), &mut h);
        assert!(h.is_empty(), "no origin, nothing to allow");
    }

    #[test]
    fn preflights_grant_what_a_player_asks() {
        let p = list()
            .preflight(&get(&[
                ("origin", "https://player.example"),
                ("access-control-request-method", "GET"),
                ("access-control-request-headers", "Range, x-custom, if-none-match"),
            ]))
            .unwrap();
        assert_eq!(p.0, 204);
        assert!(p.1.contains(&("access-control-allow-headers", "range, if-none-match".into())), "{p:?}");
        assert!(p.1.contains(&("access-control-allow-methods", "GET, HEAD".into())));
        let refused =
            list().preflight(&get(&[("origin", "https://evil.example"), ("access-control-request-method", "GET")]));
        assert_eq!(refused.map(|p| p.0), Some(403));
        let put =
            list().preflight(&get(&[("origin", "https://player.example"), ("access-control-request-method", "PUT")]));
        assert_eq!(put.map(|p| p.0), Some(403));
        assert!(list().preflight(&get(&[("origin", "https://player.example")])).is_none(), "not a preflight");
    }
}
