//! The QUIC host's flags, declared once: `udpx h3 serve` and `udpx bench h3` (whose udpx
//! servers run with them) flatten the same [`HostFlags`], so a setting has one name, one
//! default, one range and one help text, and is read into the host's settings in one place.

use std::time::Duration;

use clap::{Args, ValueEnum};

/// `on` or `off`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

/// `--burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BurstArg {
    /// Window under a pacing congestion controller (bbr2), quantum otherwise.
    Auto,
    /// quiche's send_quantum().
    Quantum,
    /// What the congestion window allows, at most 64 packets.
    Window,
}

/// How the QUIC host sends (see each flag).
#[derive(Args, Debug, Clone)]
pub struct HostFlags {
    /// Congestion control: bbr2 (paced; the default) or cubic (quiche's own default; paced by
    /// quiche patch 0008).
    #[arg(long, default_value = "bbr2")]
    cc: udpx_h3::server::Cc,
    /// How much one connection writes per loop turn: quantum (quiche's send_quantum(), about
    /// ten packets under CUBIC), window (what the congestion window allows, at most 64
    /// packets: fewer, larger GSO runs, about a sixth of the send calls) or auto: window
    /// under bbr2, whose pacing spaces the packets, quantum under cubic (unpaced before quiche
    /// patch 0008, its 64-packet bursts overflowed a shallow bottleneck's queue: `udpx bench
    /// h3 --bottleneck`; kept until paced CUBIC's rows are measured).
    #[arg(long, value_enum, default_value = "auto")]
    burst: BurstArg,
    /// Microseconds at least between the starts of two loop turns while work keeps coming
    /// (0: a turn as soon as a datagram arrives; default 1000). Datagrams that arrive meanwhile are served
    /// together: fewer wake-ups and system calls for many connections at once, at the price
    /// of up to this much added latency under load. Deadlines are never delayed. 0 to 100000.
    /// A loop that gathers gives quiche each datagram's kernel receive time, so the wait is not
    /// read as the path's round trip. Measured with 1000: a fifth to a quarter of the CPU per
    /// packet saved toward Chromium, the p99 of paced 1 MiB segments at 100 viewers not worse,
    /// and 5,000 players' p50 0.6 ms later (docs/bench.md).
    #[arg(long, default_value_t = 1000, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    coalesce: u64,
    /// Microseconds ahead of its pacing time a packet may leave (default 500; 100 to 10000).
    /// Set to --coalesce or more, a loop turn sends what falls due before the next turn
    /// could start and BBRv2's window holds that much more (quiche patch 0013): fewer turns
    /// toward a client that reads slowly, in bursts of up to this much of the pacing rate.
    /// Measured with 1000 (docs/bench.md, "Sending ahead of the pacer"): serving Chromium
    /// 2.12x nginx's CPU per byte against 2.54x, a sixth fewer turns per MB; through a 1 ms
    /// bottleneck queue 0.3-0.7 % of the packets lost against none, toward quic-go's client
    /// 6 % against 0.2 %: not the default.
    #[arg(long, default_value_t = udpx_quic::PACING_SLACK.as_micros() as u64, value_name = "US",
          value_parser = clap::value_parser!(u64).range(100..=10_000))]
    pacing_slack: u64,
    /// Whether a loop turn in which a connection wrote its quantum and has more keeps its
    /// packets for the next turn's send call (once, under 64 KiB): half the send calls for
    /// bulk downloads.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    defer_flush: OnOff,
    /// Microseconds the packets of acknowledgement-clocked transfers may wait for the next
    /// acknowledgements' packets, to leave in one send call (0: never; TCP's
    /// tcp_tso_should_defer does the same): a client that acknowledges every second packet
    /// (Chromium) otherwise costs a send call per acknowledgement. A response's first flight
    /// never waits. 0 to 2000.
    #[arg(long, default_value_t = udpx_quic::host::ACK_DEFER.as_micros() as u64, value_name = "US",
          value_parser = clap::value_parser!(u64).range(0..=2000))]
    ack_defer: u64,
    /// MSG_ZEROCOPY for sends of large GSO runs (16 KiB a run on average), saving the kernel's
    /// copy of every byte: auto turns it off where the kernel copies anyway (loopback, veth,
    /// a device without scatter-gather: its first completions say so); always keeps it on
    /// there (to measure its cost); off copies every send. Pinned pages count against
    /// RLIMIT_MEMLOCK (unless CAP_IPC_LOCK): past it, sends copy (counted).
    #[arg(long, default_value = "auto")]
    zerocopy: udpx_quic::Zerocopy,
}

impl HostFlags {
    /// The host's sending settings these flags give, for a server in this process or one a
    /// bench starts as `udpx h3 serve`.
    pub fn tuning(&self) -> udpx_h3::Tuning {
        udpx_h3::Tuning {
            cc: self.cc,
            burst: match self.burst {
                BurstArg::Auto => None,
                BurstArg::Quantum => Some(udpx_quic::Burst::Quantum),
                BurstArg::Window => Some(udpx_quic::Burst::Window),
            },
            coalesce: Duration::from_micros(self.coalesce),
            pacing_slack: Duration::from_micros(self.pacing_slack),
            defer_flush: self.defer_flush == OnOff::On,
            ack_defer: Duration::from_micros(self.ack_defer),
            zerocopy: self.zerocopy,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        host: HostFlags,
    }

    #[test]
    fn the_flags_read_into_the_hosts_settings_and_bad_values_are_refused() {
        let d = Cli::try_parse_from(["x"]).unwrap().host.tuning();
        assert_eq!(d, udpx_h3::Tuning::default(), "the flags' defaults are the server's");
        assert_eq!(d.burst(), udpx_quic::Burst::Window, "auto under bbr2: window");
        let c = Cli::try_parse_from(["x", "--cc", "cubic", "--coalesce", "250", "--defer-flush", "off"]).unwrap().host;
        let c = c.tuning();
        assert_eq!(c.burst(), udpx_quic::Burst::Quantum, "auto under cubic: quantum");
        assert_eq!((c.coalesce, c.defer_flush), (Duration::from_micros(250), false));
        // Spelled back as the same flags, they read into the same settings.
        let args = std::iter::once("x".to_string()).chain(c.serve_args());
        assert_eq!(Cli::try_parse_from(args).unwrap().host.tuning(), c);
        for bad in [
            ["--coalesce", "100001"],
            ["--pacing-slack", "99"],
            ["--ack-defer", "2001"],
            ["--burst", "rate"],
            ["--cc", "reno"],
        ] {
            let e = Cli::try_parse_from(["x", bad[0], bad[1]]).err().unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(e.to_string().contains(bad[0]), "{bad:?}: {e}");
        }
    }
}
