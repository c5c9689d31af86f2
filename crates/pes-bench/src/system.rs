//! The machine the bench runs on: open-file limits, the CPU, and readings of `/proc` (CPU
//! ticks, RSS) for the service, Postgres, the bench and the whole machine.

use std::time::Instant;

use anyhow::{Context, Result, anyhow, ensure};
use serde_json::{Value, json};

use crate::StoreKind;
use crate::store::Database;

/// Raise this process's soft open-file limit to its hard limit: every held model call and every
/// subscriber is a socket here.
pub(crate) fn raise_open_files() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Fail early when the soft open-file limit cannot hold `sockets` sockets and some slack.
pub(crate) fn check_open_files(sockets: usize) -> Result<()> {
    if sockets == 0 {
        return Ok(());
    }
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(soft) = soft {
        let needed = sockets + 256;
        ensure!(
            soft >= needed,
            "this mode holds about {needed} open files (a socket per subscriber or per run in \
             flight) but the limit is {soft}: raise the hard limit (`ulimit -Hn {needed}` as \
             root) or use fewer"
        );
    }
    Ok(())
}

/// What the figures were measured on.
pub(crate) struct Machine {
    pub(crate) cores: usize,
    pub(crate) model: String,
    pub(crate) clock_ticks: u64,
    pub(crate) ticks_assumed: bool,
}

impl Machine {
    pub(crate) fn read() -> Machine {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown cpu".into());
        let ticks = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|t| *t > 0);
        Machine {
            cores,
            model,
            clock_ticks: ticks.unwrap_or(100),
            ticks_assumed: ticks.is_none(),
        }
    }

    pub(crate) fn ticks_to_secs(&self, ticks: u64) -> f64 {
        ticks as f64 / self.clock_ticks as f64
    }

    pub(crate) fn header(&self, db: &Database, what: &str) -> String {
        format!(
            "pes-bench  store={}  {what}  machine: {} cores, {}{}",
            db.kind_name(),
            self.cores,
            self.model,
            if self.ticks_assumed {
                " (CLK_TCK assumed 100)"
            } else {
                ""
            }
        )
    }
}

/// utime + stime of a process, in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn proc_cpu_ticks(pid: &str) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let after_comm = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // after the comm, field 3 (state) is index 0, so field 14 is index 11.
    let get = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat"))
    };
    Ok(get(11)? + get(12)?)
}

/// A `kB` line of `/proc/<pid>/status` (`VmHWM`, `VmRSS`).
pub(crate) fn proc_status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no {key} in /proc/{pid}/status"))
}

/// CPU ticks of every process named `postgres` visible here (approximate: it includes other
/// databases' work on the same server, and misses backends that exit inside the window).
fn postgres_cpu_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(|pid| proc_cpu_ticks(&pid).ok())
        .sum()
}

/// Busy and total ticks of the whole machine (`/proc/stat`, first line).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// CPU readings at one instant, to be subtracted from a later one.
#[derive(Clone, Copy)]
pub(crate) struct CpuSample {
    at: Instant,
    service: u64,
    bench: u64,
    postgres: u64,
    machine_busy: u64,
    machine_total: u64,
}

impl CpuSample {
    /// The CPU ticks so far of the service (`pid`), the bench, Postgres and the machine.
    pub(crate) fn take(pid: u32) -> Result<CpuSample> {
        let (machine_busy, machine_total) = machine_ticks();
        Ok(CpuSample {
            at: Instant::now(),
            service: proc_cpu_ticks(&pid.to_string())?,
            bench: proc_cpu_ticks("self").unwrap_or(0),
            postgres: postgres_cpu_ticks(),
            machine_busy,
            machine_total,
        })
    }

    /// Cores busy between two samples.
    pub(crate) fn usage_since(&self, before: &CpuSample, m: &Machine) -> CpuUsage {
        let wall = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let cores = |t: u64| m.ticks_to_secs(t) / wall;
        let total = self
            .machine_total
            .saturating_sub(before.machine_total)
            .max(1) as f64;
        CpuUsage {
            service_secs: m.ticks_to_secs(self.service.saturating_sub(before.service)),
            service_cores: cores(self.service.saturating_sub(before.service)),
            bench_cores: cores(self.bench.saturating_sub(before.bench)),
            postgres_cores: cores(self.postgres.saturating_sub(before.postgres)),
            machine_busy: self.machine_busy.saturating_sub(before.machine_busy) as f64 / total,
        }
    }
}

pub(crate) struct CpuUsage {
    pub(crate) service_secs: f64,
    pub(crate) service_cores: f64,
    pub(crate) bench_cores: f64,
    pub(crate) postgres_cores: f64,
    /// Fraction of all cores busy (any process).
    pub(crate) machine_busy: f64,
}

impl CpuUsage {
    pub(crate) fn line(&self, m: &Machine, store: StoreKind) -> String {
        let pg = if store == StoreKind::Postgres {
            format!("  postgres {:.2}", self.postgres_cores)
        } else {
            String::new()
        };
        format!(
            "CPU (cores busy)  service {:.2}{pg}  bench {:.2}  machine {:.0}% of {} cores",
            self.service_cores,
            self.bench_cores,
            self.machine_busy * 100.0,
            m.cores
        )
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "serviceCores": self.service_cores,
            "postgresCores": self.postgres_cores,
            "benchCores": self.bench_cores,
            "machineBusy": self.machine_busy,
        })
    }
}
