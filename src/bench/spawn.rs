//! `--spawn`: a shardlog broker started as a child process of this same
//! binary (`shardlog serve`) on a temporary data directory and free ports,
//! watched through /proc (CPU seconds, resident memory) and torn down at the
//! end. It runs in its own process group, so Ctrl-C reaches only the bench,
//! which then stops the broker itself.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::Connection;
use crate::config::ListenerMode;
use crate::protocol::ApiKey;

/// How long the broker may take to answer on every port.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the child broker is started with.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    pub cores: usize,
    pub flush: Option<String>,
    pub listener: Option<ListenerMode>,
    /// Partitions the run writes to (sizes their retention).
    pub partitions: usize,
}

/// Segment size and retention per partition, in bytes, under which
/// `partitions` partitions keep at most about 3/8 of `free_bytes` (the
/// retention, the segment being written and the one before): a run
/// at a GB/s writes more than a disk holds, and a throwaway broker should
/// drop its oldest data (retention, checked every 5 s) rather than fill
/// the disk. Never more than the broker's defaults (1 GiB segments).
pub fn disk_bounded_retention(free_bytes: u64, partitions: usize) -> (u64, u64) {
    let keep = free_bytes / 2 / partitions.max(1) as u64;
    // Large segments: each roll syncs the old one and stalls its writer.
    let segment = (keep / 4).clamp(4 << 20, 1 << 30);
    let retention = (keep / 4).max(segment);
    (segment, retention)
}

pub struct SpawnedBroker {
    child: Option<Child>,
    dir: PathBuf,
    pub port: u16,
    pub cores: usize,
}

/// CPU time a process has used so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    pub user_s: f64,
    pub system_s: f64,
}

impl CpuTimes {
    pub fn total_s(&self) -> f64 {
        self.user_s + self.system_s
    }

    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes { user_s: self.user_s - earlier.user_s, system_s: self.system_s - earlier.system_s }
    }
}

impl SpawnedBroker {
    pub fn start(options: &SpawnOptions) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary to spawn a broker: {e}"))?;
        let shared = options.listener == Some(ListenerMode::Shared);
        let ports = if shared { 1 } else { options.cores };
        let port = free_ports(ports)?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("shardlog-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut command = Command::new(exe);
        command
            .arg("serve")
            .arg("--data")
            .arg(dir.join("data"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--cores", &options.cores.to_string()])
            .args(["--log-level", "warn", "--metrics-port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0);
        if let Some(flush) = &options.flush {
            command.args(["--flush", flush]);
        }
        if let Ok(space) = crate::metrics::DiskSpace::of(&dir) {
            let (segment, retention) = disk_bounded_retention(space.free_bytes, options.partitions);
            command.args(["--segment-bytes", &segment.to_string(), "--retention-bytes", &retention.to_string()]);
        }
        if let Some(listener) = options.listener {
            command.args(["--listener", if listener == ListenerMode::Shared { "shared" } else { "per-core" }]);
        }
        let child = command.spawn().map_err(|e| format!("cannot start the broker: {e}"))?;
        let mut broker = SpawnedBroker { child: Some(child), dir, port, cores: options.cores };
        broker.wait_ready(ports)?;
        Ok(broker)
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// User and system CPU seconds of the broker so far.
    pub fn cpu(&self) -> Option<CpuTimes> {
        process_cpu(&self.pid()?.to_string())
    }

    /// Resident memory of the broker now.
    pub fn rss_bytes(&self) -> Option<u64> {
        let kib: u64 = self.status_field("VmRSS:")?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Whether the broker may use transparent huge pages (`--huge-pages`).
    pub fn huge_pages(&self) -> Option<bool> {
        Some(self.status_field("THP_enabled:")? == "1")
    }

    /// The first word after `field` in /proc/PID/status.
    fn status_field(&self, field: &str) -> Option<String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        line.split_whitespace().nth(1).map(str::to_string)
    }

    /// Answers a real request on every port (a connect alone is not enough
    /// while the executors are still opening partitions).
    fn wait_ready(&mut self, ports: usize) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        for offset in 0..ports as u16 {
            loop {
                if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    return Err(format!("the spawned broker exited during start: {status}"));
                }
                let answered = Connection::connect(("127.0.0.1", self.port + offset), Duration::from_secs(2))
                    .and_then(|mut c| c.request(ApiKey::ApiVersions, 0, |_| {}).map(|_| ()));
                if answered.is_ok() {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the spawned broker did not answer on port {} within {START_TIMEOUT:?}",
                        self.port + offset
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// SIGTERM, wait for a clean exit (SIGKILL after a timeout), remove the data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: a plain signal to our own child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + STOP_TIMEOUT;
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for SpawnedBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `count` consecutive free ports on 127.0.0.1.
fn free_ports(count: usize) -> Result<u16, String> {
    for _ in 0..200 {
        let probe = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot bind a port: {e}"))?;
        let base = probe.local_addr().map_err(|e| e.to_string())?.port();
        drop(probe);
        if base as usize + count >= 65535 {
            continue;
        }
        if (0..count as u16).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return Ok(base);
        }
    }
    Err(format!("found no {count} consecutive free ports"))
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// User and system CPU seconds so far of the process `pid` (a number, or
/// "self" for this one: every thread, no children).
pub fn process_cpu(pid: &str) -> Option<CpuTimes> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_times(&stat, clock_ticks_per_second())
}

/// utime and stime (fields 14 and 15) of /proc/PID/stat. The command name
/// (field 2) may hold spaces and parentheses, so fields count from the last ')'.
fn parse_cpu_times(stat: &str, ticks_per_second: f64) -> Option<CpuTimes> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    Some(CpuTimes { user_s: user / ticks_per_second, system_s: system / ticks_per_second })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawned_broker_keeps_about_half_the_free_disk_at_most() {
        const GIB: u64 = 1 << 30;
        for (free, partitions) in [(48 * GIB, 100), (48 * GIB, 10_000), (GIB, 1), (2000 * GIB, 1)] {
            let (segment, retention) = disk_bounded_retention(free, partitions);
            assert!((4 << 20..=GIB).contains(&segment), "{segment}");
            // Retention deletes whole segments: a partition holds up to its
            // retention, the segment being written and one more.
            let most = partitions as u64 * (retention + 2 * segment);
            if segment > 4 << 20 {
                assert!(most <= free * 3 / 8 + partitions as u64, "{free} free, {partitions} partitions: up to {most}");
            }
        }
        // 100 partitions on a 48 GiB disk: about 61 MiB segments and retention each.
        assert_eq!(disk_bounded_retention(48 * GIB, 100), (64_424_509, 64_424_509));
    }

    #[test]
    fn cpu_times_come_from_fields_14_and_15() {
        let stat = "4242 (shard log (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1000 0 0";
        let times = parse_cpu_times(stat, 100.0).expect("parses");
        assert_eq!(times, CpuTimes { user_s: 2.5, system_s: 0.75 });
        assert_eq!(times.total_s(), 3.25);
    }
}
