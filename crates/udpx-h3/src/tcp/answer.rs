//! A request answered by the site's shared rules, as HTTP types, for HTTP/1.1 and HTTP/2
//! alike; the response's file while it is held, and the record the access log gets at its end.

use std::fs::File;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper::header::{HeaderName, HeaderValue};
use hyper::StatusCode;

use crate::http::{Answer, FileBody, LogEntry, RequestHead, Site};

/// A request's answer by the shared rules, as HTTP types: status, headers, the body (none
/// for HEAD), and the record that reports the response when dropped.
pub(super) struct Answered {
    pub(super) status: StatusCode,
    pub(super) headers: hyper::HeaderMap,
    pub(super) body: Option<FileBody>,
    pub(super) log: Finish,
}

/// Answers the request head `head` (over `protocol`) from `peer` by [`Site::answer`].
pub(super) fn answer(
    site: &Arc<Site>,
    peer: SocketAddr,
    head: &hyper::http::request::Parts,
    protocol: &'static str,
) -> Answered {
    let start = Instant::now();
    let path = head.uri.path_and_query().map_or("", |p| p.as_str());
    let fields: Vec<(&[u8], &[u8])> = head.headers.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())).collect();
    let method = head.method.as_str();
    let Answer { status, headers: answer_headers, body } =
        site.answer(&RequestHead { method: method.as_bytes(), path: path.as_bytes(), headers: &fields });
    // HEAD never sends a body, whatever the answer holds.
    let body = body.filter(|_| method != "HEAD");
    let log = Finish {
        site: site.clone(),
        peer,
        method: method.to_owned(),
        path: path.to_owned(),
        status,
        start,
        protocol,
        bytes: 0,
        complete: body.is_none(),
    };
    let mut headers = hyper::HeaderMap::new();
    for (name, value) in answer_headers {
        match (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value)) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            _ => log::warn!("udpx-h3: header {name}: {value:?} is not valid HTTP; left out"),
        }
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Answered { status, headers, body, log }
}

/// A response's file, counted in the site's `open_files` while it is held.
pub(super) struct Held {
    pub(super) file: File,
    pub(super) site: Arc<Site>,
}

impl Held {
    pub(super) fn new(file: File, site: &Arc<Site>) -> Held {
        site.file_opened();
        Held { file, site: site.clone() }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.site.file_closed();
    }
}

/// What [`Site::finished`] is told when the body is dropped.
pub(super) struct Finish {
    pub(super) site: Arc<Site>,
    pub(super) peer: SocketAddr,
    pub(super) method: String,
    pub(super) path: String,
    pub(super) status: u16,
    pub(super) start: Instant,
    pub(super) protocol: &'static str,
    /// Body bytes handed to hyper.
    pub(super) bytes: u64,
    /// Whether the last byte was handed to hyper (true at once for a response without a
    /// body); false when the peer left first or the file failed.
    pub(super) complete: bool,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.site.finished(&LogEntry {
            peer: self.peer,
            method: &self.method,
            path: &self.path,
            status: self.status,
            bytes: self.bytes,
            duration: self.start.elapsed(),
            protocol: self.protocol,
            complete: self.complete,
        });
    }
}
