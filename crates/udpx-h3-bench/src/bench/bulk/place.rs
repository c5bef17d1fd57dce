//! Where a bulk row's two ends run (the namespaces and CPUs) and what the server's CPU spends
//! over one download.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

use udpx_lab::cpu::{CpuSample, TickRate};
use udpx_lab::netns::{find_in_path, Namespace, Side, TestNet};
use udpx_lab::steal::Steal;
use udpx_lab::task::{cpu_secs, switches};

/// Where the two ends are.
pub(super) struct Place<'a> {
    pub(super) net: Option<&'a TestNet>,
    pub(super) server_ip: IpAddr,
    /// The server's CPU (the last online one) and the client's (the first).
    pub(super) server_cpu: usize,
    pub(super) client_cpu: usize,
}

impl Place<'_> {
    pub(super) fn client_ns(&self) -> Option<&Namespace> {
        self.net.map(|n| n.ns(Side::Tx))
    }

    pub(super) fn server_ns(&self) -> Option<&Namespace> {
        self.net.map(|n| n.ns(Side::Rx))
    }

    /// `taskset -c CPU program` in namespace `ns` (or here); without `taskset` in `PATH`
    /// (util-linux), the program unpinned.
    pub(super) fn command(&self, ns: Option<&Namespace>, cpu: usize, program: &Path) -> Command {
        let Some(taskset) = find_in_path("taskset") else {
            return match ns {
                Some(ns) => ns.command(&program.to_string_lossy()),
                None => Command::new(program),
            };
        };
        let mut c = match ns {
            Some(ns) => ns.command(&taskset.to_string_lossy()),
            None => Command::new(taskset),
        };
        c.args(["-c", &cpu.to_string()]).arg(program);
        c
    }

    /// Runs `f` on a thread pinned to `cpu` in namespace `ns` (or here); threads it starts
    /// inherit the pinning.
    pub(super) fn run_on<T: Send + 'static>(
        &self,
        ns: Option<&Namespace>,
        cpu: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        let g = move || {
            let _ = udpx_lab::cpu::pin_current_thread(cpu);
            f()
        };
        match ns {
            Some(ns) => ns.try_run(g).map_err(|e| e.to_string()),
            None => std::thread::spawn(g).join().map_err(|_| "a bench thread panicked".to_string()),
        }
    }
}

/// What [`ServerMeter`] measured over one download.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cost {
    /// Busy seconds of the server's CPU.
    pub(super) busy: f64,
    /// Seconds of the server's own tasks.
    pub(super) task: f64,
    /// Context switches of the server's own tasks (each voluntary one a wake-up).
    pub(super) switches: Option<u64>,
    /// The steal from the server's and the client's CPUs.
    pub(super) steal: Steal,
}

/// A server's cost over one download: its CPU's busy time (see
/// [`udpx_lab::cpu::CpuDelta::busy_time`]) and its own tasks' time on CPU; and the steal of
/// both ends' CPUs over the same window.
pub(super) struct ServerMeter {
    tasks: Vec<String>,
    cpus: [usize; 2],
    rate: TickRate,
    task0: Option<f64>,
    switches0: Option<u64>,
    busy0: Option<CpuSample>,
}

impl ServerMeter {
    /// Starts measuring the server's CPU, the tasks (`/proc/...` directories) and the steal of
    /// the server's and the client's CPUs.
    pub(super) fn start(tasks: Vec<String>, place: &Place<'_>, rate: TickRate) -> ServerMeter {
        let task0 = cpu_secs(&tasks, rate);
        let switches0 = switches(&tasks);
        let cpus = [place.server_cpu, place.client_cpu];
        ServerMeter { tasks, cpus, rate, task0, switches0, busy0: CpuSample::now().ok() }
    }

    /// What was spent since the start; `None` if `/proc` could not be read.
    pub(super) fn stop(&self) -> Option<Cost> {
        let d = CpuSample::now().ok()?.diff(self.busy0.as_ref()?);
        let busy = d.busy_time(&self.cpus[..1], self.rate).as_secs_f64();
        let task = (cpu_secs(&self.tasks, self.rate)? - self.task0?).max(0.0);
        let switches = switches(&self.tasks).zip(self.switches0).map(|(b, a)| b.saturating_sub(a));
        Some(Cost { busy, task, switches, steal: Steal::of(&d, &self.cpus, self.rate) })
    }
}
