//! A process's CPU and memory from `/proc` (for `clbctl load --node-agents`): user + system time
//! from `/proc/PID/stat`, `VmRSS` from `/proc/PID/status`, sampled every few hundred milliseconds,
//! and the file-descriptor limit of this process.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::load::lock;

/// One reading of a process.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    pub(super) at: Instant,
    /// User + system CPU time, clock ticks.
    pub(super) ticks: u64,
    /// Resident set, KiB.
    pub(super) rss_kib: u64,
}

/// Reads process `pid` now (`None` when it is gone or `/proc` is not Linux's).
pub(super) fn read(pid: u32) -> Option<Reading> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (in parentheses): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let ticks = field(14)? + field(15)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
    Some(Reading {
        at: Instant::now(),
        ticks,
        rss_kib,
    })
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's USER_HZ, if that fails).
pub(super) fn ticks_per_s() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// The readings of one process, taken every `every` by a task until dropped.
#[derive(Debug, Clone)]
pub(super) struct Sampler {
    pid: u32,
    readings: Arc<Mutex<Vec<Reading>>>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

/// CPU and memory of a process over a window.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(super) struct Usage {
    /// CPU time over the window ÷ its length, in % of one core.
    pub(super) cpu_percent: f64,
    /// The largest `VmRSS` sampled in the window, MB (10⁶ bytes).
    pub(super) rss_peak_mb: f64,
    /// `VmRSS` at the window's end, MB.
    pub(super) rss_end_mb: f64,
}

impl Sampler {
    /// Starts sampling `pid` every `every`.
    pub(super) fn start(pid: u32, every: Duration) -> Self {
        let readings = Arc::new(Mutex::new(read(pid).into_iter().collect::<Vec<_>>()));
        let r = readings.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Some(x) = read(pid) {
                    lock(&r).push(x);
                }
            }
        });
        Self {
            pid,
            readings,
            task: Arc::new(task),
        }
    }

    /// A reading now (also kept with the samples).
    pub(super) fn now(&self) -> Option<Reading> {
        let x = read(self.pid)?;
        lock(&self.readings).push(x);
        Some(x)
    }

    /// The usage between two readings taken with [`Sampler::now`].
    pub(super) fn usage(&self, from: Reading, to: Reading, ticks_per_s: u64) -> Usage {
        let secs = (to.at - from.at).as_secs_f64().max(1e-9);
        let cpu = to.ticks.saturating_sub(from.ticks) as f64 / ticks_per_s.max(1) as f64;
        let peak = lock(&self.readings)
            .iter()
            .filter(|r| r.at >= from.at && r.at <= to.at)
            .map(|r| r.rss_kib)
            .max()
            .unwrap_or(to.rss_kib);
        Usage {
            cpu_percent: round2(cpu / secs * 100.0),
            rss_peak_mb: mb(peak),
            rss_end_mb: mb(to.rss_kib),
        }
    }

    /// The largest `VmRSS` of every sample so far, MB.
    pub(super) fn rss_peak_mb(&self) -> f64 {
        mb(lock(&self.readings)
            .iter()
            .map(|r| r.rss_kib)
            .max()
            .unwrap_or(0))
    }
}

fn mb(kib: u64) -> f64 {
    round2(kib as f64 * 1024.0 / 1e6)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// This process's `RLIMIT_NOFILE` (soft, hard), from `/proc/self/limits`.
pub(super) fn nofile() -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut v = line["Max open files".len()..]
        .split_whitespace()
        .map(|x| x.parse::<u64>().unwrap_or(u64::MAX));
    Some((v.next()?, v.next()?))
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit when below `needed` (this crate
/// forbids `unsafe`, so through util-linux's `prlimit --pid`), and says whether the limit is
/// enough for `needed` descriptors.
pub(super) fn raise_nofile(needed: u64) -> Result<(u64, u64), String> {
    let Some((soft, hard)) = nofile() else {
        return Err("cannot read /proc/self/limits".to_owned());
    };
    if soft < needed && soft < hard {
        let hard_text = if hard == u64::MAX {
            "unlimited".to_owned()
        } else {
            hard.to_string()
        };
        let r = std::process::Command::new("prlimit")
            .arg("--pid")
            .arg(std::process::id().to_string())
            .arg(format!("--nofile={hard_text}:{hard_text}"))
            .status();
        if !matches!(r, Ok(s) if s.success()) {
            return Err(format!(
                "the open-file limit is {soft} (hard {hard}), below the {needed} the agents need, \
                 and `prlimit` could not raise it: run `ulimit -n {hard_text}` first"
            ));
        }
    }
    let (soft, hard) = nofile().unwrap_or((soft, hard));
    if soft < needed {
        return Err(format!(
            "the open-file limit is {soft} (hard {hard}), below the {needed} descriptors the \
             agents need: raise the hard limit (`ulimit -Hn`, limits.conf) or use fewer agents"
        ));
    }
    Ok((soft, hard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_can_be_read() {
        let r = read(std::process::id()).expect("/proc/self");
        assert!(r.rss_kib > 0);
        let (soft, hard) = nofile().expect("limits");
        assert!(soft <= hard);
    }
}
