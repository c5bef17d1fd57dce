//! CPU accounting without hardware counters, and CPU pinning.
//!
//! This machine has no perf hardware counters, so CPU cost comes from two kernel sources:
//!
//! - **`/proc/stat`** ([`CpuSample`]): per-CPU time in clock ticks (`USER_HZ`, 100 per second
//!   here), split by kind. It sees *everything* a CPU does, including softirq and kernel-thread
//!   work done on behalf of our sockets (GRO in a NAPI thread, the receive stack in the sender's
//!   softirq), which no per-process figure shows. Resolution is one tick (10 ms), so sample
//!   over seconds, not milliseconds. The kinds of work are sampled at each tick, which misses
//!   short wake-ups; idle time is measured exactly (tickless idle), so busy time is judged
//!   by both ([`CpuDelta::busy_time`]).
//! - **getrusage(2)** ([`ProcessCpu`]): user and system time of this process (`RUSAGE_SELF`,
//!   all threads, including ones that have exited) or of the calling thread (`RUSAGE_THREAD`),
//!   at microsecond resolution. Softirq work is charged to whichever task was interrupted, so
//!   this both misses and misattributes some network processing: report it beside the
//!   `/proc/stat` figure, not instead of it.
//!
//! All differences saturate at zero: `iowait` can go backwards (proc(5): "the value in this
//! field may decrease"), and CPUs going offline between samples make counters vanish.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::num::NonZeroU64;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;
use nix::unistd::{sysconf, Pid, SysconfVar};

/// Where per-CPU times come from (proc(5)).
pub const PROC_STAT: &str = "/proc/stat";
/// The list of online CPUs, e.g. `0-1` (Documentation/ABI/testing/sysfs-devices-system-cpu).
pub const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// Fewest fields a `/proc/stat` cpu line may have: `user nice system idle` (Linux 2.4). Later
/// kernels appended iowait (2.5.41), irq and softirq (2.6.0), steal (2.6.11), guest (2.6.24)
/// and guest_nice (2.6.33); missing ones read as zero.
const MIN_CPU_FIELDS: usize = 4;

/// Time one CPU (or all CPUs together) spent in each state, in clock ticks ([`TickRate`]).
///
/// `guest` and `guest_nice` are not kept: the kernel already counts them inside `user` and
/// `nice`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Normal processes in user mode.
    pub user: u64,
    /// Niced processes in user mode.
    pub nice: u64,
    /// Kernel mode (system calls, kernel threads such as `napi/...`).
    pub system: u64,
    /// Idle.
    pub idle: u64,
    /// Idle while waiting for I/O.
    pub iowait: u64,
    /// Servicing hardware interrupts.
    pub irq: u64,
    /// Servicing softirqs: most of the network receive path when not threaded.
    pub softirq: u64,
    /// Stolen by the hypervisor (this is a VM: it runs other guests then).
    pub steal: u64,
}

impl CpuTimes {
    /// Ticks of work: `user + system + irq + softirq`.
    ///
    /// `steal` is left out: it is time the hypervisor ran someone else while we waited, not
    /// work, and on a shared VM it would inflate every cost per byte; it is reported apart
    /// ([`CpuTimes::steal`]). `nice` is left out too: it is the work of *niced* processes, and
    /// the bench does not run niced, so on the pinned CPUs that is other people's work (a
    /// compiler run with `nice`). When this process *is* niced its own work lands in `nice`:
    /// use [`CpuTimes::busy_as`] with [`Accounting::for_this_process`], as
    /// [`CpuDelta::busy_time`] does.
    pub fn busy(&self) -> u64 {
        [self.user, self.system, self.irq, self.softirq].into_iter().fold(0u64, u64::saturating_add)
    }

    /// [`busy`](CpuTimes::busy), plus `nice` when `acc` says our own work runs niced.
    pub fn busy_as(&self, acc: Accounting) -> u64 {
        if acc.nice {
            self.busy().saturating_add(self.nice)
        } else {
            self.busy()
        }
    }

    /// Ticks spent idle: `idle + iowait`.
    pub fn idle_total(&self) -> u64 {
        self.idle.saturating_add(self.iowait)
    }

    /// All ticks: [`busy`](CpuTimes::busy), `nice`, `steal` and
    /// [`idle_total`](CpuTimes::idle_total).
    pub fn total(&self) -> u64 {
        [self.busy(), self.nice, self.steal, self.idle_total()].into_iter().fold(0u64, u64::saturating_add)
    }

    /// `self - earlier` field by field, saturating at zero (see the module docs for why a
    /// counter can appear to go backwards).
    pub fn diff(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            nice: self.nice.saturating_sub(earlier.nice),
            system: self.system.saturating_sub(earlier.system),
            idle: self.idle.saturating_sub(earlier.idle),
            iowait: self.iowait.saturating_sub(earlier.iowait),
            irq: self.irq.saturating_sub(earlier.irq),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }

    /// [`busy`](CpuTimes::busy) share of all ticks, 0.0 to 1.0; `None` if no ticks passed.
    pub fn utilization(&self) -> Option<f64> {
        let total = self.total();
        (total > 0).then(|| self.busy() as f64 / total as f64)
    }

    fn add(&self, other: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_add(other.user),
            nice: self.nice.saturating_add(other.nice),
            system: self.system.saturating_add(other.system),
            idle: self.idle.saturating_add(other.idle),
            iowait: self.iowait.saturating_add(other.iowait),
            irq: self.irq.saturating_add(other.irq),
            softirq: self.softirq.saturating_add(other.softirq),
            steal: self.steal.saturating_add(other.steal),
        }
    }
}

/// Which `/proc/stat` times count as our work (see [`CpuTimes::busy`] for why).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Accounting {
    /// Count `nice` time as ours: this process runs niced, so its own work is counted there.
    pub nice: bool,
}

impl Accounting {
    /// For this process: `nice` counts when our nice value (`/proc/self/stat`) is above zero.
    /// Read once and cached; if it cannot be read, `nice` is left out (the usual case).
    pub fn for_this_process() -> Accounting {
        static ACC: OnceLock<Accounting> = OnceLock::new();
        *ACC.get_or_init(|| {
            let niced = std::fs::read_to_string("/proc/self/stat").ok().and_then(|t| parse_nice(&t)).unwrap_or(0);
            Accounting { nice: niced > 0 }
        })
    }
}

/// The nice value from `/proc/<pid>/stat` text: field 19 (proc(5)). The command name (field
/// 2) is in parentheses and may hold spaces and `)`, so fields are counted after the last `)`.
pub fn parse_nice(stat: &str) -> Option<i64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After `)`: field 3 (state) is the first word, so field 19 is the 17th.
    rest.split_whitespace().nth(16)?.parse().ok()
}

/// Clock ticks per second of `/proc/stat` (`sysconf(_SC_CLK_TCK)`, `USER_HZ`): 100 on every
/// common Linux build, but read, not assumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickRate(NonZeroU64);

impl TickRate {
    /// A rate of `hz` ticks per second; `None` for zero.
    pub fn new(hz: u64) -> Option<TickRate> {
        NonZeroU64::new(hz).map(TickRate)
    }

    /// This system's rate, read once with sysconf(3) and cached.
    pub fn system() -> Result<TickRate, Error> {
        static RATE: OnceLock<Option<TickRate>> = OnceLock::new();
        RATE.get_or_init(|| {
            sysconf(SysconfVar::CLK_TCK).ok().flatten().and_then(|hz| u64::try_from(hz).ok()).and_then(TickRate::new)
        })
        .ok_or(Error::NoTickRate)
    }

    /// Ticks per second.
    pub fn hz(self) -> u64 {
        self.0.get()
    }

    /// `ticks` as a duration, exact to the nanosecond (no overflow: computed in 128 bits).
    pub fn to_duration(self, ticks: u64) -> Duration {
        let hz = u128::from(self.hz());
        let ticks = u128::from(ticks);
        let secs = ticks / hz;
        let nanos = (ticks % hz) * 1_000_000_000 / hz;
        // secs <= ticks <= u64::MAX and nanos < 1e9, so both conversions are exact.
        Duration::new(u64::try_from(secs).unwrap_or(u64::MAX), u32::try_from(nanos).unwrap_or(0))
    }

    /// `ticks` in seconds.
    pub fn to_secs_f64(self, ticks: u64) -> f64 {
        ticks as f64 / self.hz() as f64
    }
}

/// One reading of `/proc/stat`: the aggregate and every online CPU.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuSample {
    /// When it was read, for the wall-clock length of a [`CpuDelta`].
    pub taken: Instant,
    /// All CPUs together: the `cpu` line, or the sum of the per-CPU lines if it is missing.
    pub total: CpuTimes,
    /// Per CPU number; offline CPUs have no line and are absent.
    pub per_cpu: BTreeMap<usize, CpuTimes>,
    /// Per CPU, microseconds spent in its idle states (`cpuidle`'s `state*/time`, summed),
    /// where the kernel has cpuidle: idle time to the microsecond, where `/proc/stat` gives it
    /// in ticks of 10 ms. Empty where it cannot be read.
    pub idle_us: BTreeMap<usize, u64>,
}

impl CpuSample {
    /// Reads and parses `/proc/stat` now, and each CPU's cpuidle residency.
    pub fn now() -> Result<CpuSample, Error> {
        let text = std::fs::read_to_string(PROC_STAT).map_err(|source| Error::Read { path: PROC_STAT, source })?;
        let mut s = CpuSample::from_proc_stat(&text, Instant::now())?;
        s.idle_us = s.per_cpu.keys().filter_map(|&n| cpuidle_us(n).map(|us| (n, us))).collect();
        Ok(s)
    }

    /// Builds a sample from `/proc/stat` text read at `taken`.
    pub fn from_proc_stat(text: &str, taken: Instant) -> Result<CpuSample, ParseError> {
        let mut total = None;
        let mut per_cpu = BTreeMap::new();
        for (cpu, times) in parse_proc_stat(text)? {
            match cpu {
                None => total = Some(times),
                Some(n) => {
                    per_cpu.insert(n, times);
                }
            }
        }
        let total = total.unwrap_or_else(|| per_cpu.values().fold(CpuTimes::default(), |a, t| a.add(t)));
        Ok(CpuSample { taken, total, per_cpu, idle_us: BTreeMap::new() })
    }

    /// What happened between `earlier` and `self`, saturating at zero. A CPU present in only
    /// one of the samples (it went on- or offline) is left out.
    pub fn diff(&self, earlier: &CpuSample) -> CpuDelta {
        CpuDelta {
            elapsed: self.taken.saturating_duration_since(earlier.taken),
            total: self.total.diff(&earlier.total),
            per_cpu: self
                .per_cpu
                .iter()
                .filter_map(|(n, now)| earlier.per_cpu.get(n).map(|then| (*n, now.diff(then))))
                .collect(),
            idle_us: self
                .idle_us
                .iter()
                .filter_map(|(n, now)| earlier.idle_us.get(n).map(|then| (*n, now.saturating_sub(*then))))
                .collect(),
        }
    }
}

/// Microseconds CPU `n` has spent in its idle states (`/sys/devices/system/cpu/cpuN/cpuidle/
/// state*/time`, summed); `None` without cpuidle.
fn cpuidle_us(n: usize) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{n}/cpuidle")).ok()?;
    let mut sum = 0u64;
    let mut any = false;
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().starts_with("state") {
            continue;
        }
        let t = std::fs::read_to_string(e.path().join("time")).ok()?;
        sum = sum.saturating_add(t.trim().parse::<u64>().ok()?);
        any = true;
    }
    any.then_some(sum)
}

/// The difference of two [`CpuSample`]s.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuDelta {
    /// Wall-clock time between the samples.
    pub elapsed: Duration,
    /// All CPUs together.
    pub total: CpuTimes,
    /// Per CPU present in both samples.
    pub per_cpu: BTreeMap<usize, CpuTimes>,
    /// Per CPU, microseconds idle (cpuidle), where both samples had it.
    pub idle_us: BTreeMap<usize, u64>,
}

impl CpuDelta {
    /// The ticks of one CPU, or of all (`None`); `None` result if that CPU was not sampled.
    pub fn times(&self, cpu: Option<usize>) -> Option<&CpuTimes> {
        match cpu {
            None => Some(&self.total),
            Some(n) => self.per_cpu.get(&n),
        }
    }

    /// Busy time of the given CPUs together; CPUs not sampled add nothing. Per CPU:
    ///
    /// - the work ticks ([`CpuTimes::busy_as`] with this process's [`Accounting`]) are
    ///   sampled at each timer tick, so a task that wakes often for a few microseconds and
    ///   sleeps through most ticks is undercounted (measured here: a task busy 19 % of a CPU
    ///   in 30 us bursts read as 11 %);
    /// - the time it was awake ([`CpuDelta::awake`]) is the wall-clock length of the delta
    ///   less its idle time (measured at each idle entry and exit: tickless idle), steal and
    ///   other people's `nice`, and sees those short wake-ups.
    ///
    /// Where cpuidle gives idle time to the microsecond, the time awake alone (the tick's
    /// 10 ms would blur a download of a fraction of a second), unless the host stole time
    /// (see below); else the larger of the two.
    /// Where the CPU runs flat out they agree.
    pub fn busy_time(&self, cpus: &[usize], rate: TickRate) -> Duration {
        let acc = Accounting::for_this_process();
        cpus.iter()
            .filter_map(|&n| {
                let t = self.per_cpu.get(&n)?;
                let ticks = rate.to_duration(t.busy_as(acc));
                Some(match self.awake(n, rate, acc) {
                    Some((awake, true)) if t.steal == 0 => awake,
                    // Steal and cpuidle overlap: a halted vCPU woken by an interrupt waits
                    // for the host's CPU, and that wait is both stolen and still idle to the
                    // guest. The time awake then lies between `awake` (all steal taken off)
                    // and `awake` plus the steal; the ticks, which the kernel charges steal
                    // first, decide within that band. (Before: `awake` alone, 0 % busy in a
                    // row the host stole a third of.)
                    Some((awake, true)) => {
                        let not_idle = self.elapsed.saturating_sub(Duration::from_micros(self.idle_us[&n]));
                        let others = if acc.nice { 0 } else { t.nice };
                        ticks.clamp(awake, not_idle.saturating_sub(rate.to_duration(others)).max(awake))
                    }
                    Some((awake, false)) => awake.max(ticks),
                    None => ticks,
                })
            })
            .sum()
    }

    /// How long CPU `n` was neither idle nor stolen, nor running niced work that is not ours:
    /// the delta's wall-clock length less those; `true` when its idle time came from cpuidle
    /// (to the microsecond), `false` when from `/proc/stat`'s ticks. `None` if not sampled.
    pub fn awake(&self, n: usize, rate: TickRate, acc: Accounting) -> Option<(Duration, bool)> {
        let t = self.per_cpu.get(&n)?;
        let (idle, exact) = match self.idle_us.get(&n) {
            Some(&us) => (Duration::from_micros(us), true),
            None => (rate.to_duration(t.idle_total()), false),
        };
        let others = if acc.nice { 0 } else { t.nice };
        let not_ours = rate.to_duration(t.steal.saturating_add(others));
        Some((self.elapsed.saturating_sub(idle).saturating_sub(not_ours), exact))
    }

    /// Time the hypervisor stole from the given CPUs (not counted as busy; reported apart).
    pub fn steal_time(&self, cpus: &[usize], rate: TickRate) -> Duration {
        rate.to_duration(self.sum(cpus, |t| t.steal))
    }

    fn sum(&self, cpus: &[usize], f: impl Fn(&CpuTimes) -> u64) -> u64 {
        cpus.iter().filter_map(|n| self.per_cpu.get(n)).fold(0u64, |sum, t| sum.saturating_add(f(t)))
    }
}

/// User and system CPU time from getrusage(2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCpu {
    /// Time in user mode.
    pub user: Duration,
    /// Time in kernel mode on behalf of the process or thread (system calls; softirq work only
    /// when it happened to interrupt this task).
    pub system: Duration,
}

impl ProcessCpu {
    /// This process so far: all threads, live and exited (`RUSAGE_SELF`).
    pub fn process() -> Result<ProcessCpu, Error> {
        ProcessCpu::read(UsageWho::RUSAGE_SELF, "getrusage(RUSAGE_SELF)")
    }

    /// The calling thread so far (`RUSAGE_THREAD`, Linux 2.6.26+).
    pub fn thread() -> Result<ProcessCpu, Error> {
        ProcessCpu::read(UsageWho::RUSAGE_THREAD, "getrusage(RUSAGE_THREAD)")
    }

    fn read(who: UsageWho, what: &'static str) -> Result<ProcessCpu, Error> {
        let usage = getrusage(who)
            .map_err(|e| Error::Sys { what: what.to_owned(), source: io::Error::from_raw_os_error(e as i32) })?;
        Ok(ProcessCpu {
            user: timeval_to_duration(usage.user_time()),
            system: timeval_to_duration(usage.system_time()),
        })
    }

    /// `user + system`.
    pub fn total(&self) -> Duration {
        self.user.saturating_add(self.system)
    }

    /// `self - earlier`, saturating at zero.
    pub fn diff(&self, earlier: &ProcessCpu) -> ProcessCpu {
        ProcessCpu { user: self.user.saturating_sub(earlier.user), system: self.system.saturating_sub(earlier.system) }
    }
}

/// A `timeval` from getrusage as a duration; negative parts (never produced by Linux) read as
/// zero.
fn timeval_to_duration(tv: TimeVal) -> Duration {
    let secs = u64::try_from(tv.tv_sec()).unwrap_or(0);
    let micros = u64::try_from(tv.tv_usec()).unwrap_or(0);
    Duration::from_secs(secs).saturating_add(Duration::from_micros(micros))
}

/// Restricts the calling thread to one CPU with sched_setaffinity(2).
///
/// Fails if `cpu` is offline, outside this process's cpuset (EINVAL), or beyond the largest
/// CPU set nix supports.
pub fn pin_current_thread(cpu: usize) -> Result<(), Error> {
    let pin_error = |e: nix::errno::Errno| Error::Pin { cpu, source: io::Error::from_raw_os_error(e as i32) };
    let mut set = CpuSet::new();
    set.set(cpu).map_err(pin_error)?;
    // Pid 0 means the calling thread (sched_setaffinity(2)).
    sched_setaffinity(Pid::from_raw(0), &set).map_err(pin_error)
}

/// The CPUs the calling thread may run on (sched_getaffinity(2)).
pub fn current_affinity() -> Result<Vec<usize>, Error> {
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(|e| Error::Sys {
        what: "sched_getaffinity".to_owned(),
        source: io::Error::from_raw_os_error(e as i32),
    })?;
    Ok((0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect())
}

/// The online CPUs, from [`ONLINE_CPUS`].
pub fn try_online_cpus() -> Result<Vec<usize>, Error> {
    let text = std::fs::read_to_string(ONLINE_CPUS).map_err(|source| Error::Read { path: ONLINE_CPUS, source })?;
    Ok(parse_cpu_list(&text)?)
}

/// The online CPUs. If [`ONLINE_CPUS`] cannot be read or parsed (sysfs not mounted), falls
/// back to the calling thread's affinity, and failing that to CPU 0, logging why: a benchmark
/// can still run, and its report records the CPUs it used.
pub fn online_cpus() -> Vec<usize> {
    match try_online_cpus() {
        Ok(cpus) => cpus,
        Err(e) => {
            log::warn!("{e}; using this thread's CPU affinity instead");
            current_affinity().ok().filter(|cpus| !cpus.is_empty()).unwrap_or_else(|| vec![0])
        }
    }
}

/// Parses a kernel CPU list such as `0`, `0-3` or `0,2-3,7` (one trailing newline allowed)
/// into sorted, distinct CPU numbers.
///
/// The format is the kernel's `cpulist` (bitmap_parselist); the stride form `0-7:2/4` is not
/// used for the online list and is rejected.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, ParseError> {
    let err = |why| ParseError { source: "CPU list", line: 1, text: text.trim_end().to_owned(), why };
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Err(err("it is empty"));
    }
    let number = |s: &str| -> Result<usize, ParseError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("expected CPU numbers and ranges like 0,2-3"));
        }
        s.parse().map_err(|_| err("CPU number too large"))
    };
    let mut cpus = Vec::new();
    for part in body.split(',') {
        match part.split_once('-') {
            None => cpus.push(number(part)?),
            Some((lo, hi)) => {
                let (lo, hi) = (number(lo)?, number(hi)?);
                if lo > hi {
                    return Err(err("a range ends below its start"));
                }
                if hi - lo >= CpuSet::count() {
                    return Err(err("a range is larger than any CPU set"));
                }
                cpus.extend(lo..=hi);
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Parses `/proc/stat` text into `(cpu, times)` in file order: `None` for the aggregate `cpu`
/// line, `Some(n)` for `cpuN`.
///
/// ```text
/// cpu  4705 356 584 3699176 23060 0 277 0 0 0
/// cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0
/// intr 1462898 ...            <- other lines are not ours and are skipped
/// ```
///
/// Strict about lines starting with `cpu` (a format change should fail loudly, not yield zero
/// CPU time): each needs at least `MIN_CPU_FIELDS` numeric fields, a numeric CPU index and
/// no repeat. At least one cpu line must be present.
pub fn parse_proc_stat(text: &str) -> Result<Vec<(Option<usize>, CpuTimes)>, ParseError> {
    let mut out: Vec<(Option<usize>, CpuTimes)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let err = |why| ParseError { source: PROC_STAT, line: index + 1, text: line.to_owned(), why };
        let mut words = line.split_whitespace();
        let Some(key) = words.next() else {
            continue;
        };
        let Some(suffix) = key.strip_prefix("cpu") else {
            continue;
        };
        let cpu = if suffix.is_empty() {
            None
        } else if suffix.bytes().all(|b| b.is_ascii_digit()) {
            Some(suffix.parse().map_err(|_| err("CPU number too large"))?)
        } else {
            return Err(err("expected `cpu` or `cpu<N>`"));
        };
        let mut fields = [0u64; 8];
        let mut count = 0;
        for word in words {
            let value: u64 = word.parse().map_err(|_| err("a field is not a non-negative integer"))?;
            if let Some(slot) = fields.get_mut(count) {
                *slot = value;
            }
            count += 1;
        }
        if count < MIN_CPU_FIELDS {
            return Err(err("fewer than 4 fields (user nice system idle)"));
        }
        if out.iter().any(|(seen, _)| *seen == cpu) {
            return Err(err("this CPU is listed twice"));
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = fields;
        out.push((cpu, CpuTimes { user, nice, system, idle, iowait, irq, softirq, steal }));
    }
    if out.is_empty() {
        return Err(ParseError { source: PROC_STAT, line: 0, text: String::new(), why: "no cpu lines at all" });
    }
    Ok(out)
}

/// Text from the kernel that did not have the expected format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// What was being parsed: [`PROC_STAT`] or `"CPU list"`.
    pub source: &'static str,
    /// 1-based line number; 0 if the problem is the text as a whole.
    pub line: usize,
    /// The offending line.
    pub text: String,
    /// What was wrong with it.
    pub why: &'static str,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "cannot parse {}: {}", self.source, self.why)?;
        } else {
            write!(f, "cannot parse {} line {} ({:?}): {}", self.source, self.line, self.text, self.why)?;
        }
        write!(f, "; this kernel's format is not understood: report it with the text")
    }
}

impl std::error::Error for ParseError {}

/// Why reading CPU times or pinning failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A kernel file could not be read.
    Read {
        /// The file.
        path: &'static str,
        /// Why.
        source: io::Error,
    },
    /// A kernel file had an unexpected format.
    Parse(ParseError),
    /// A system call failed.
    Sys {
        /// Which one.
        what: String,
        /// Its errno.
        source: io::Error,
    },
    /// The calling thread could not be pinned.
    Pin {
        /// The CPU asked for.
        cpu: usize,
        /// The errno of sched_setaffinity (EINVAL: offline or outside the cpuset).
        source: io::Error,
    },
    /// sysconf(_SC_CLK_TCK) gave no usable value.
    NoTickRate,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { path, source } => write!(f, "cannot read {path}: {source}; is /proc (and /sys) mounted?"),
            Error::Parse(e) => e.fmt(f),
            Error::Sys { what, source } => write!(f, "{what} failed: {source}"),
            Error::Pin { cpu, source } => write!(
                f,
                "cannot pin this thread to CPU {cpu}: {source}; choose an online CPU \
                 allowed to this process (see {ONLINE_CPUS} and `taskset -p $$`)"
            ),
            Error::NoTickRate => write!(
                f,
                "sysconf(_SC_CLK_TCK) gave no clock tick rate, so /proc/stat ticks cannot be \
                 converted to seconds: this libc or kernel is unsupported"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Read { source, .. } | Error::Sys { source, .. } | Error::Pin { source, .. } => Some(source),
            Error::Parse(e) => Some(e),
            Error::NoTickRate => None,
        }
    }
}

impl From<ParseError> for Error {
    fn from(e: ParseError) -> Error {
        Error::Parse(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real 6.x /proc/stat, shortened.
    const STAT_6X: &str = "\
cpu  4705 356 584 3699176 23060 0 277 0 0 0
cpu0 2352 178 292 1849588 11530 0 138 5 0 0
cpu1 2353 178 292 1849588 11530 0 139 0 7 1
intr 1462898 13 0 0 0 0 0 0 0 1 0 0
ctxt 2302733
btime 1700000000
processes 5211
procs_running 1
procs_blocked 0
softirq 409213 0 108244 1 2 3 4 5 6 7 8
";

    fn times(v: [u64; 8]) -> CpuTimes {
        let [user, nice, system, idle, iowait, irq, softirq, steal] = v;
        CpuTimes { user, nice, system, idle, iowait, irq, softirq, steal }
    }

    #[test]
    fn parses_a_modern_proc_stat() {
        let parsed = parse_proc_stat(STAT_6X).unwrap();
        assert_eq!(
            parsed,
            vec![
                (None, times([4705, 356, 584, 3699176, 23060, 0, 277, 0])),
                (Some(0), times([2352, 178, 292, 1849588, 11530, 0, 138, 5])),
                (Some(1), times([2353, 178, 292, 1849588, 11530, 0, 139, 0])),
            ]
        );
    }

    #[test]
    fn old_kernels_with_fewer_fields_read_as_zero() {
        // 2.4: four fields; 2.6.0: seven (no steal).
        let text = "cpu  10 20 30 40\ncpu0 1 2 3 4 5 6 7\n";
        let parsed = parse_proc_stat(text).unwrap();
        assert_eq!(parsed[0], (None, times([10, 20, 30, 40, 0, 0, 0, 0])));
        assert_eq!(parsed[1], (Some(0), times([1, 2, 3, 4, 5, 6, 7, 0])));
    }

    #[test]
    fn garbage_is_rejected_with_its_line() {
        let cases = [
            ("cpu0 1 2 x 4\n", 1, "not a non-negative integer"),
            ("cpu 1 2 3 4\ncpu0 1 2 3\n", 2, "fewer than 4"),
            ("cpuX 1 2 3 4\n", 1, "expected `cpu`"),
            ("cpu0 1 2 3 4\ncpu0 1 2 3 4\n", 2, "twice"),
            ("cpu0 1 2 -3 4\n", 1, "not a non-negative"),
            ("cpu0 1 2 3 99999999999999999999\n", 1, "not a non-negative"),
            ("", 0, "no cpu lines"),
            ("hello world\nintr 1 2 3\n", 0, "no cpu lines"),
        ];
        for (text, line, why) in cases {
            let e = parse_proc_stat(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.why.contains(why), "{text:?}: {e}");
            assert!(e.to_string().contains("/proc/stat"), "{e}");
        }
    }

    #[test]
    fn sample_uses_aggregate_or_sums_cpus() {
        let at = Instant::now();
        let s = CpuSample::from_proc_stat(STAT_6X, at).unwrap();
        assert_eq!(s.total.user, 4705);
        assert_eq!(s.per_cpu.len(), 2);
        let s = CpuSample::from_proc_stat("cpu0 1 2 3 4\ncpu1 10 20 30 40\n", at).unwrap();
        assert_eq!(s.total, times([11, 22, 33, 44, 0, 0, 0, 0]));
    }

    #[test]
    fn busy_is_user_system_irq_softirq() {
        // user 1, nice 2, system 3, idle 100, iowait 200, irq 4, softirq 5, steal 6.
        let t = times([1, 2, 3, 100, 200, 4, 5, 6]);
        // Steal is the hypervisor running someone else, nice is niced processes: not ours.
        assert_eq!(t.busy(), 1 + 3 + 4 + 5);
        assert_eq!(t.busy_as(Accounting { nice: false }), 1 + 3 + 4 + 5);
        assert_eq!(t.busy_as(Accounting { nice: true }), 1 + 2 + 3 + 4 + 5);
        assert_eq!(t.idle_total(), 300);
        assert_eq!(t.total(), 321);
        assert_eq!(times([0; 8]).utilization(), None);
        assert_eq!(times([1, 0, 0, 3, 0, 0, 0, 0]).utilization(), Some(0.25));
        // A CPU stolen half the time and busy the other half: utilization 0.5, not 1.0.
        assert_eq!(times([1, 0, 0, 0, 0, 0, 0, 1]).utilization(), Some(0.5));
        assert_eq!(times([u64::MAX, 1, 0, 0, 0, 0, 0, 0]).busy(), u64::MAX);
        let d =
            CpuDelta { elapsed: Duration::ZERO, total: t, per_cpu: [(0, t), (1, t)].into(), idle_us: BTreeMap::new() };
        let rate = TickRate::new(100).unwrap();
        assert_eq!(d.steal_time(&[0, 1], rate), Duration::from_millis(120));
    }

    #[test]
    fn nice_value_from_proc_self_stat() {
        // A command name with spaces and a `)`; nice is field 19 (here 5).
        let stat = "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 5 1 0 123 4096 100";
        assert_eq!(parse_nice(stat), Some(5));
        assert_eq!(parse_nice("1 (init) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 -3 1"), Some(-3));
        assert_eq!(parse_nice("1 (short) S 0"), None);
        assert_eq!(parse_nice("no parenthesis"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_nice(&own).is_some(), "{own}");
    }

    #[test]
    fn diffs_saturate() {
        let earlier = times([10, 10, 10, 10, 50, 10, 10, 10]);
        let later = times([15, 10, 12, 20, 40, 11, 13, 10]);
        // iowait went backwards (proc(5) allows it): 0, not a wrap-around.
        assert_eq!(later.diff(&earlier), times([5, 0, 2, 10, 0, 1, 3, 0]));
        assert_eq!(earlier.diff(&earlier), CpuTimes::default());

        let p0 = ProcessCpu { user: Duration::from_millis(5), system: Duration::from_millis(9) };
        let p1 = ProcessCpu { user: Duration::from_millis(8), system: Duration::from_millis(7) };
        assert_eq!(p1.diff(&p0), ProcessCpu { user: Duration::from_millis(3), system: Duration::ZERO });
        assert_eq!(p1.total(), Duration::from_millis(15));
    }

    #[test]
    fn busy_time_sees_short_wakeups_through_exact_idle() {
        let rate = TickRate::new(100).unwrap();
        let t0 = Instant::now();
        let a = CpuSample::from_proc_stat("cpu0 0 0 0 0 0 0 0 0\n", t0).unwrap();
        let at = |text: &str| CpuSample::from_proc_stat(text, t0 + Duration::from_secs(1)).unwrap().diff(&a);
        // The tick saw 10 ticks of work, but the CPU was idle only 80 of 100: 200 ms busy.
        assert_eq!(at("cpu0 10 0 0 80 0 0 0 0\n").busy_time(&[0], rate), Duration::from_millis(200));
        // Steal and other people's niced work are not ours.
        let d = at("cpu0 10 5 0 70 0 0 0 10\n");
        let acc = Accounting { nice: false };
        assert_eq!(d.awake(0, rate, acc), Some((Duration::from_millis(150), false)));
        assert_eq!(d.awake(0, rate, Accounting { nice: true }), Some((Duration::from_millis(200), false)));
        // Rounding the other way: the work ticks win.
        assert_eq!(at("cpu0 60 0 0 45 0 0 0 0\n").busy_time(&[0], rate), Duration::from_millis(600));
        // With cpuidle's microseconds, the time awake alone: 1 s less 873,250 us idle.
        let mut d = at("cpu0 60 0 0 45 0 0 0 0\n");
        d.idle_us.insert(0, 873_250);
        assert_eq!(d.busy_time(&[0], rate), Duration::from_micros(126_750));
        // Steal with cpuidle: idle 700 ms and 300 ms stolen leave nothing awake by subtraction,
        // but the stolen wait was spent halted; the 20 work ticks (200 ms) decide within the
        // band of 0 to 300 ms.
        let mut d = at("cpu0 20 0 0 50 0 0 0 30\n");
        d.idle_us.insert(0, 700_000);
        assert_eq!(d.busy_time(&[0], rate), Duration::from_millis(200));
        // The band bounds the ticks: never above the 100 ms not idle.
        let mut d = at("cpu0 50 0 0 20 0 0 0 30\n");
        d.idle_us.insert(0, 900_000);
        assert_eq!(d.busy_time(&[0], rate), Duration::from_millis(100));
    }

    #[test]
    fn cpuidle_is_read_where_the_kernel_has_it() {
        let s = CpuSample::now().unwrap();
        if std::fs::metadata("/sys/devices/system/cpu/cpu0/cpuidle").is_err() {
            println!("SKIP: cpuidle_is_read_where_the_kernel_has_it: no cpuidle in this kernel");
            return;
        }
        assert_eq!(s.idle_us.len(), s.per_cpu.len(), "every CPU's idle time: {:?}", s.idle_us);
        let later = CpuSample::now().unwrap();
        let d = later.diff(&s);
        assert_eq!(d.idle_us.len(), s.per_cpu.len());
        // cpuidle adds an idle period when it ends, whole: one that began before the first
        // sample and ended before the second counts in full, so a delta may exceed the time
        // between the samples. The sound bounds: the residency only grows (the delta is the
        // plain difference, not a saturated one), and no CPU has been idle longer than the
        // machine has been up (microseconds, not ticks or nanoseconds).
        let uptime_us = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok())
            .map(|secs| (secs * 1e6) as u64)
            .expect("/proc/uptime");
        for (n, &then) in &s.idle_us {
            let now = later.idle_us[n];
            assert!(now >= then, "CPU {n}: idle time went back from {then} to {now} us");
            assert_eq!(d.idle_us[n], now - then, "CPU {n}");
            // /proc/uptime is read last and to the 10 ms.
            assert!(now <= uptime_us + 10_000, "CPU {n}: idle {now} us, up {uptime_us} us");
        }
    }

    #[test]
    fn sample_diff_keeps_cpus_present_in_both() {
        let t0 = Instant::now();
        let a = CpuSample::from_proc_stat("cpu 4 0 0 4\ncpu0 2 0 0 2\ncpu1 2 0 0 2\n", t0).unwrap();
        let b_text = "cpu 10 0 0 10\ncpu0 5 0 0 3\ncpu2 5 0 0 7\n";
        let b = CpuSample::from_proc_stat(b_text, t0 + Duration::from_secs(2)).unwrap();
        let d = b.diff(&a);
        assert_eq!(d.elapsed, Duration::from_secs(2));
        assert_eq!(d.total, times([6, 0, 0, 6, 0, 0, 0, 0]));
        assert_eq!(d.per_cpu.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(d.times(Some(0)).unwrap().busy(), 3);
        assert!(d.times(Some(1)).is_none());
        let rate = TickRate::new(100).unwrap();
        // cpu0 was idle for 1 tick of the 2 s (200 ticks): awake 199 ticks, more than the
        // 3 ticks of sampled work (see busy_time).
        assert_eq!(d.busy_time(&[0, 1], rate), Duration::from_millis(1990));
        // Samples in the wrong order: elapsed saturates to zero too.
        assert_eq!(a.diff(&b).elapsed, Duration::ZERO);
    }

    #[test]
    fn ticks_convert_exactly() {
        let rate = TickRate::new(100).unwrap();
        assert_eq!(rate.to_duration(0), Duration::ZERO);
        assert_eq!(rate.to_duration(1), Duration::from_millis(10));
        assert_eq!(rate.to_duration(250), Duration::from_millis(2500));
        assert_eq!(rate.to_secs_f64(250), 2.5);
        let odd = TickRate::new(3).unwrap();
        assert_eq!(odd.to_duration(4), Duration::new(1, 333_333_333));
        // No overflow at the top of the range.
        assert_eq!(TickRate::new(1).unwrap().to_duration(u64::MAX), Duration::from_secs(u64::MAX));
        assert!(TickRate::new(0).is_none());
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0\n").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse_cpu_list("0,2-3,7").unwrap(), vec![0, 2, 3, 7]);
        assert_eq!(parse_cpu_list("3,1-2,2").unwrap(), vec![1, 2, 3]);
        for bad in ["", "\n", "a", "0-", "-1", "1-0", "0,,1", "0 1", "0-3:2/4", ",", "0-99999999"] {
            let e = parse_cpu_list(bad).unwrap_err();
            assert_eq!(e.source, "CPU list", "{bad:?}");
        }
    }

    #[test]
    fn live_system_reads() {
        // Not pure, but cheap and safe everywhere this crate runs (Linux with /proc and /sys).
        let sample = CpuSample::now().unwrap();
        let online = online_cpus();
        assert!(!online.is_empty());
        for cpu in &online {
            assert!(sample.per_cpu.contains_key(cpu), "CPU {cpu} not in /proc/stat");
        }
        assert!(TickRate::system().unwrap().hz() > 0);
        let p = ProcessCpu::process().unwrap();
        let t = ProcessCpu::thread().unwrap();
        assert!(p.total() >= t.total());
    }

    #[test]
    fn pinning_a_thread() {
        let cpu = *online_cpus().last().unwrap();
        let pinned = std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            current_affinity().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(pinned, vec![cpu]);
        let e = std::thread::spawn(|| pin_current_thread(CpuSet::count()).unwrap_err()).join().unwrap();
        assert!(matches!(e, Error::Pin { .. }), "{e}");
    }
}
