//! The binary's log backend: the libraries' `log` records on standard error, as
//! `udpx: warning: ...`. Warnings by default (a refused GSO, a lowered segment limit, zerocopy
//! switched off, an io_uring fallback); `UDPX_LOG=error|warn|info|debug|trace|off` changes the
//! level. Each call site prints at most [`PER_SECOND`] records a second and then says how
//! many it left out: a peer that can make a server warn on each datagram cannot flood its log.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::{LevelFilter, Log, Metadata, Record};

/// Records a call site prints per second at most.
const PER_SECOND: u32 = 10;

/// A call site's second: when it began, records printed in it, records left out.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    printed: u32,
    left_out: u64,
}

/// Call sites by (file, line): a bounded set (the program's own lines).
struct Stderr {
    sites: Mutex<Option<HashMap<(&'static str, u32), Window>>>,
}

impl Stderr {
    /// Whether a record from `site` at `now` is printed, and how many before it were left out
    /// (said once the next one prints).
    fn admit(&self, site: (&'static str, u32), now: Instant) -> Option<u64> {
        let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        let w = sites.get_or_insert_with(HashMap::new).entry(site).or_insert(Window {
            start: now,
            printed: 0,
            left_out: 0,
        });
        if now.duration_since(w.start) >= Duration::from_secs(1) {
            w.start = now;
            w.printed = 0;
        }
        if w.printed >= PER_SECOND {
            w.left_out += 1;
            return None;
        }
        w.printed += 1;
        Some(std::mem::take(&mut w.left_out))
    }
}

impl Log for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        // Records without a static file name (none from this program) share one site.
        let site = (r.file_static().unwrap_or(""), r.line().unwrap_or(0));
        if let Some(left_out) = self.admit(site, Instant::now()) {
            if left_out > 0 {
                eprintln!("udpx: ({left_out} more like the next one left out: {PER_SECOND} a second at most)");
            }
            let level = match r.level() {
                log::Level::Error => "error",
                log::Level::Warn => "warning",
                log::Level::Info => "info",
                log::Level::Debug => "debug",
                log::Level::Trace => "trace",
            };
            eprintln!("udpx: {level}: {} ({})", r.args(), r.target());
        }
    }

    fn flush(&self) {}
}

/// The level `UDPX_LOG` asks for (`None` when set to something else), warnings when unset.
fn level(var: Option<&str>) -> Option<LevelFilter> {
    match var.map(str::trim) {
        None | Some("") => Some(LevelFilter::Warn),
        Some(v) => v.parse().ok(),
    }
}

/// Installs the backend (once, at start).
pub fn init() {
    let var = std::env::var("UDPX_LOG").ok();
    let max = level(var.as_deref()).unwrap_or_else(|| {
        eprintln!(
            "udpx: UDPX_LOG={:?} is not a level: give error, warn, info, debug, trace or off (warnings shown)",
            var.unwrap_or_default()
        );
        LevelFilter::Warn
    });
    static LOGGER: Stderr = Stderr { sites: Mutex::new(None) };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_default_to_warnings() {
        assert_eq!(level(None), Some(LevelFilter::Warn));
        assert_eq!(level(Some("")), Some(LevelFilter::Warn));
        assert_eq!(level(Some("debug")), Some(LevelFilter::Debug));
        assert_eq!(level(Some("off")), Some(LevelFilter::Off));
        assert_eq!(level(Some("loud")), None);
    }

    #[test]
    fn a_site_prints_ten_a_second_and_counts_the_rest() {
        let l = Stderr { sites: Mutex::new(None) };
        let t0 = Instant::now();
        let site = ("a.rs", 1);
        let printed = (0..25).filter(|_| l.admit(site, t0).is_some()).count();
        assert_eq!(printed, PER_SECOND as usize);
        // Another site has its own budget.
        assert_eq!(l.admit(("a.rs", 2), t0), Some(0));
        // The next second: printed again, and the 15 left out are said.
        assert_eq!(l.admit(site, t0 + Duration::from_secs(1)), Some(15));
        assert_eq!(l.admit(site, t0 + Duration::from_secs(1)), Some(0));
    }
}
