//! How the QUIC host sends, as one value: the settings `udpx h3 serve`'s host flags give
//! (`--cc`, `--burst`, `--coalesce`, `--pacing-slack`, `--defer-flush`, `--ack-defer`,
//! `--zerocopy`), applied
//! to a [`ServeConfig`] in one place and written back as those flags for a server started as a
//! program. Every bench that starts udpx servers carries one, so a flag given to a bench
//! reaches its servers whether they run in the bench's process or as `udpx h3 serve`.

use std::time::Duration;

use serde::Serialize;
use udpx_quic::{Burst, Zerocopy};

use crate::server::{Cc, ServeConfig};

/// The QUIC host's sending settings (see [`crate::tuning`]); the default is `udpx h3 serve`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tuning {
    /// The congestion controller.
    #[serde(serialize_with = "as_text")]
    pub cc: Cc,
    /// How much a connection writes per turn; `None`: auto, the controller's
    /// [`Cc::safe_burst`].
    #[serde(serialize_with = "burst_text")]
    pub burst: Option<Burst>,
    /// Between the starts of two loop turns while work keeps coming (zero: none).
    pub coalesce: Duration,
    /// How far ahead of its pacing time a packet leaves ([`udpx_quic::HostConfig::pacing_slack`]).
    pub pacing_slack: Duration,
    /// The deferred flush ([`udpx_quic::HostConfig::defer_flush`]).
    pub defer_flush: bool,
    /// How long acknowledgement-clocked packets may wait for the next ones.
    pub ack_defer: Duration,
    /// MSG_ZEROCOPY for large sends.
    pub zerocopy: Zerocopy,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            cc: Cc::default(),
            burst: None,
            // Gathered: with each datagram's receive time given to quiche it costs neither of
            // the seeds' workloads and saves a fifth of the CPU toward Chromium (docs/bench.md,
            // "Receive times for a loop that gathers"). The library's HostConfig keeps 0.
            coalesce: Duration::from_millis(1),
            pacing_slack: udpx_quic::PACING_SLACK,
            defer_flush: true,
            ack_defer: udpx_quic::host::ACK_DEFER,
            zerocopy: Zerocopy::Auto,
        }
    }
}

impl Tuning {
    /// The burst in force: as given, or the controller's safe one.
    pub fn burst(&self) -> Burst {
        self.burst.unwrap_or(self.cc.safe_burst())
    }

    /// The same under another controller (a bench whose rows compare controllers); an auto
    /// burst follows it.
    pub fn with_cc(self, cc: Cc) -> Tuning {
        Tuning { cc, ..self }
    }

    /// Sets these on `sc`, leaving the rest of it alone.
    pub fn apply(&self, sc: &mut ServeConfig) {
        sc.cc = self.cc;
        sc.quic.zerocopy = self.zerocopy;
        let h = &mut sc.quic.host;
        (h.burst, h.coalesce, h.pacing_slack, h.defer_flush, h.ack_defer) =
            (self.burst(), self.coalesce, self.pacing_slack, self.defer_flush, self.ack_defer);
    }

    /// The `udpx h3 serve` flags that give these settings, every one spelled out.
    pub fn serve_args(&self) -> Vec<String> {
        let burst = burst_name(self.burst);
        [
            ("--cc", self.cc.to_string()),
            ("--burst", burst.to_string()),
            ("--coalesce", self.coalesce.as_micros().to_string()),
            ("--pacing-slack", self.pacing_slack.as_micros().to_string()),
            ("--defer-flush", if self.defer_flush { "on" } else { "off" }.to_string()),
            ("--ack-defer", self.ack_defer.as_micros().to_string()),
            ("--zerocopy", self.zerocopy.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect()
    }
}

fn as_text<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// `--burst`'s word for a burst (`None`: auto).
fn burst_name(b: Option<Burst>) -> &'static str {
    match b {
        None => "auto",
        Some(Burst::Quantum) => "quantum",
        Some(Burst::Window) => "window",
    }
}

fn burst_text<S: serde::Serializer>(b: &Option<Burst>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(burst_name(*b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_and_spelled_as_serve_flags() {
        let t = Tuning::default();
        assert_eq!(t.burst(), Burst::Window, "auto under bbr2");
        assert_eq!(t.with_cc(Cc::Cubic).burst(), Burst::Quantum, "auto follows the controller");
        let t = Tuning { burst: Some(Burst::Window), coalesce: Duration::from_micros(1000), ..t.with_cc(Cc::Cubic) };
        let mut sc = ServeConfig::new("127.0.0.1:0".parse().unwrap());
        t.apply(&mut sc);
        assert_eq!((sc.cc, sc.quic.host.burst, sc.quic.host.coalesce), (Cc::Cubic, Burst::Window, t.coalesce));
        assert_eq!(
            t.serve_args().join(" "),
            "--cc cubic --burst window --coalesce 1000 --pacing-slack 500 --defer-flush on --ack-defer 500 --zerocopy auto"
        );
        let json = serde_json::to_value(t).unwrap();
        assert_eq!(
            (&json["cc"], &json["burst"], &json["defer_flush"]),
            (&"cubic".into(), &"window".into(), &true.into())
        );
    }
}
