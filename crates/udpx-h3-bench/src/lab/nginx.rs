//! nginx as the scale, tail and restart rows run it: one worker for many connections, HTTPS
//! over TCP with HTTP/2 and HTTP/1.1 (the bulk table's nginx, with HTTP/3 beside, has its
//! own configuration: `bench::peers`).

use std::net::SocketAddr;
use std::path::Path;

/// nginx's process lines for the rows that run one process, in the foreground.
pub(crate) const SINGLE_PROCESS: &str = "daemon off;\nmaster_process off;\n";

/// nginx for many connections: one worker, TLS 1.3, HTTP/2 and HTTP/1.1 by ALPN, connections
/// kept open as long as the run (a player asks every few seconds). `processes`: the daemon and
/// master lines ([`SINGLE_PROCESS`], or a master for the restart rows' reload and upgrade).
pub(crate) fn nginx_conf(
    dir: &Path,
    www: &Path,
    listen: SocketAddr,
    (cert, key): (&Path, &Path),
    processes: &str,
) -> String {
    let d = dir.display();
    format!(
        "{processes}worker_processes 1;\nworker_rlimit_nofile 200000;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\nevents {{ worker_connections 100000; }}\n\
         http {{\n  access_log off;\n  default_type application/octet-stream;\n  keepalive_timeout 120s;\n\
         keepalive_requests 1000000;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         server {{\n    listen {listen} ssl http2;\n    ssl_protocols TLSv1.3;\n    ssl_certificate {};\n\
         ssl_certificate_key {};\n    root {};\n  }}\n}}\n",
        cert.display(),
        key.display(),
        www.display()
    )
}
