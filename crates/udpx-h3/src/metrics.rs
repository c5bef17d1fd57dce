//! The Prometheus table of `H3Server::serve_metrics`: what a scrape reads (each shard's socket
//! and QUIC counters, the HTTP responses of every listener, the block cache, the disk thread,
//! the key and qlog writers) and the names it gives them.

use std::collections::HashMap;
use std::sync::Arc;

use udpx_quic::HostCounters;

use crate::http::Site;

/// What a scrape of `serve_metrics` reads.
pub(crate) struct MetricsSource {
    pub(crate) probe: udpx_quic::ServerProbe,
    pub(crate) site: Arc<Site>,
    pub(crate) tcp: Option<crate::tcp::TcpProbe>,
    pub(crate) cache: Option<Arc<crate::cache::BlockCache>>,
    pub(crate) keylog: Option<udpx_quic::KeyLog>,
    pub(crate) qlog: Option<udpx_quic::Qlog>,
}

/// `quic_<name>` for every host count, made once: metric names are `'static` (a bounded set,
/// the host's fields).
static QUIC_NAMES: std::sync::OnceLock<HashMap<&'static str, &'static str>> = std::sync::OnceLock::new();

fn quic_names(h: &HostCounters) -> HashMap<&'static str, &'static str> {
    h.fields_with_help().into_iter().map(|(n, _, _)| (n, &*Box::leak(format!("quic_{n}").into_boxed_str()))).collect()
}

impl udpx_metrics::Source for MetricsSource {
    fn sample(&self) -> Vec<udpx_metrics::ShardSample> {
        self.probe
            .sample()
            .into_iter()
            .map(|s| {
                let h = &s.host;
                let names = QUIC_NAMES.get_or_init(|| quic_names(h));
                udpx_metrics::ShardSample {
                    socket: s.socket,
                    kernel_drops: s.kernel_drops,
                    icmp_offenders: s.icmp_offenders,
                    // Every host count, as `quic_<name>` (levels as gauges): one list, the
                    // host's own, so a counter added there is served here.
                    extra: h
                        .fields_with_help()
                        .into_iter()
                        .map(|(name, help, value)| udpx_metrics::Extra {
                            name: names.get(name).copied().unwrap_or("quic_unnamed"),
                            help: help.trim(),
                            value,
                            gauge: HostCounters::is_level(name),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn global(&self) -> Vec<udpx_metrics::Extra> {
        let h = self.site.counters();
        let (c, level) = (counter, gauge);
        let mut out = vec![
            c("http_requests", "HTTP requests whose head arrived (every listener)", h.requests),
            c("http_responses_1xx", "Responses with a 1xx status", h.by_class[0]),
            c("http_responses_2xx", "Responses with a 2xx status (200, 206)", h.by_class[1]),
            c("http_responses_3xx", "Responses with a 3xx status (301, 304)", h.by_class[2]),
            c("http_responses_4xx", "Responses with a 4xx status", h.by_class[3]),
            c("http_responses_5xx", "Responses with a 5xx status", h.by_class[4]),
            c("http_partial", "206 responses (byte ranges)", h.partial),
            c("http_no_content", "204 responses: CORS preflights and OPTIONS (--cors)", h.no_content),
            c("http_not_modified", "304 responses", h.not_modified),
            c("http_range_not_satisfiable", "416 responses", h.range_not_satisfiable),
            c("http_body_bytes", "Body bytes the transports took", h.body_bytes),
            c("http_file_reads", "Reads from files for HTTP/3 bodies", h.file_reads),
            c("http_file_bytes_read", "Bytes read from files for HTTP/3 bodies", h.file_bytes_read),
            c("http_read_buffers_made", "Buffers allocated to read bodies into (none pooled was free)", h.read_buffers_made),
            c("http_incomplete", "Responses not sent whole (reset, stopped, connection gone)", h.incomplete),
            c(
                "http_unavailable",
                "503 responses: out of file descriptors, or an open-file bound reached",
                h.unavailable,
            ),
            level("open_files", "HTTP/3 responses holding an open file now", h.open_files),
            c(
                "http_stalled",
                "Responses ended for taking too little: HTTP/3 streams reset at the park timeout, TCP connections closed",
                h.stalled,
            ),
            c("http_parked", "HTTP/3 responses parked (their file given back) after the stall timeout", h.parked),
            c("http_resumed", "Parked HTTP/3 responses that went on when their client read again", h.resumed),
            c(
                "http_resume_refused",
                "Parked HTTP/3 responses reset when their client read again: the file changed or a bound was reached",
                h.resume_refused,
            ),
            level(
                "http_streams_resetting",
                "HTTP/3 streams reset by the server that quiche has not forgotten yet",
                h.streams_resetting,
            ),
            c("http_trailers", "Trailer sections on requests, read and ignored", h.trailers),
            c("http_log_dropped", "Access-log lines dropped: the writer's queue was full", h.log_dropped),
            c(
                "http_disk_waits",
                "HTTP/3 body reads the page cache could not serve, handed to the disk thread",
                h.disk_waits,
            ),
            c("http_disk_queue_full", "Of them, those the disk thread's full queue refused", h.disk_queue_full),
            c(
                "http_disk_blocking_reads",
                "Body reads on a shard thread that could block: the file system refused RWF_NOWAIT",
                h.disk_blocking_reads,
            ),
            level(
                "http_unfinished_heads",
                "HTTP/3 request streams with data and no whole head yet (quiche holds the partial frame)",
                h.unfinished_heads,
            ),
            c(
                "http_heads_refused",
                "HTTP/3 connections closed for unfinished request heads over a cap (connection, address, shard)",
                h.heads_refused,
            ),
            c(
                "http_heads_timed_out",
                "HTTP/3 connections closed for a request head unfinished past its deadline",
                h.heads_timed_out,
            ),
            c(
                "http_idle_closed",
                "HTTP/3 connections closed after the idle timeout (no request, no response)",
                h.idle_closed,
            ),
            c(
                "http_rejected",
                "HTTP/3 requests refused with H3_REQUEST_REJECTED past the final GOAWAY while draining",
                h.rejected,
            ),
        ];
        self.optional_extras(&mut out);
        out
    }
}

impl MetricsSource {
    /// The counters of the parts only some servers run, for those this one runs: the TLS key
    /// log, qlog, the block cache, HTTPS over TCP.
    fn optional_extras(&self, out: &mut Vec<udpx_metrics::Extra>) {
        let (c, level) = (counter, gauge);
        if let Some(k) = &self.keylog {
            out.extend([
                c("keylog_lines", "TLS key log lines written (--keylog-file: both listeners)", k.lines()),
                c(
                    "keylog_dropped",
                    "TLS key log lines dropped: past the file's bound, or a write that failed",
                    k.dropped(),
                ),
            ]);
        }
        if let Some(q) = self.qlog.as_ref().map(udpx_quic::Qlog::counters) {
            out.extend([
                c("qlog_files", "Connections logged to a qlog file (--qlog-dir)", q.files),
                c("qlog_skipped", "Connections chosen for qlog but not logged: --qlog-max-files reached", q.skipped),
                c(
                    "qlog_busy",
                    "Sampled connections chosen for qlog but not logged: --qlog-max-live others were logging",
                    q.busy,
                ),
                level("qlog_live", "Connections writing a qlog now", q.live),
                c("qlog_records", "qlog records queued for the files", q.records),
                c(
                    "qlog_dropped",
                    "qlog records dropped: the writer's queue full (the shard never waits), --qlog-max-bytes reached, \
                     or a record over 64 KiB",
                    q.dropped,
                ),
                c("qlog_bytes", "qlog bytes queued for the files", q.bytes),
                c("qlog_write_errors", "qlog writes that failed (disk full, directory gone)", q.write_errors),
            ]);
        }
        if let Some(k) = self.cache.as_ref().map(|c| c.counters()) {
            out.extend([
                level("cache_capacity_bytes", "The block cache's bound (--cache-size)", k.capacity),
                c("cache_hits", "Body blocks found in the cache", k.hits),
                c("cache_misses", "Body blocks read from a file and kept", k.misses),
                c(
                    "cache_uncached",
                    "Body blocks read from a file and not kept (no room, or the file changed under the read)",
                    k.uncached,
                ),
                c("cache_changed", "Cache fills that found the file changed under the read", k.changed),
                c("cache_bytes_filled", "Bytes read from files into the cache", k.bytes_filled),
                c("cache_evictions", "Blocks evicted from the cache, least recently used first", k.evictions),
                level("cache_blocks", "Blocks in the cache now", k.blocks),
                level(
                    "cache_held_bytes",
                    "Bytes of cached blocks alive now, evicted ones that packets still hold included",
                    k.held,
                ),
            ]);
        }
        if let Some(t) = self.tcp.as_ref().map(crate::tcp::TcpProbe::snapshot) {
            out.extend([
                c("tcp_connections", "HTTPS-over-TCP connections accepted (--alt-svc-tcp)", t.connections),
                c("tcp_tls_failed", "HTTPS-over-TCP connections whose TLS handshake failed", t.tls_failed),
                c("tcp_http2_connections", "HTTPS-over-TCP connections that chose HTTP/2", t.http2),
                c(
                    "tcp_per_source_refused",
                    "HTTPS-over-TCP connections closed at once: their address had its share",
                    t.per_source_refused,
                ),
                c("tcp_too_slow", "HTTPS-over-TCP connections closed for taking a response too slowly", t.too_slow),
                c("tcp_idle_closed", "HTTPS-over-TCP connections closed after the idle timeout", t.idle_closed),
                c("tcp_accept_errors", "HTTPS-over-TCP accepts that failed (out of descriptors)", t.accept_errors),
                level("tcp_open", "HTTPS-over-TCP connections open now", t.open),
                level(
                    "tcp_lingering",
                    "HTTPS-over-TCP connections closed and reading their client's last bytes now",
                    t.lingering,
                ),
                c("tcp_evicted", "HTTPS-over-TCP idle connections closed at the cap to make room", t.evicted),
                c(
                    "tcp_full_refused",
                    "HTTPS-over-TCP connections closed at the cap with every one busy",
                    t.full_refused,
                ),
                c(
                    "tcp_drain_closed",
                    "HTTPS-over-TCP connections still open at a drain's deadline, closed then",
                    t.drain_closed,
                ),
            ]);
        }
    }
}

/// A counter for the metrics table: its name, what it counts, its value.
fn counter(name: &'static str, help: &'static str, value: u64) -> udpx_metrics::Extra {
    udpx_metrics::Extra { name, help, value, gauge: false }
}

/// A gauge (a level) for the metrics table: its name, what it measures, its value.
fn gauge(name: &'static str, help: &'static str, value: u64) -> udpx_metrics::Extra {
    udpx_metrics::Extra { name, help, value, gauge: true }
}
