//! What a run reports: the live progress line (stderr, once a second), the
//! closing table (stdout), and the JSON summary with the workload and the
//! machine. MB means 10^6 bytes; message bytes are key + value.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::core::{Count, Tick};
use super::histogram::{Latencies, Summary};
use super::verify::VerifyCounts;

/// Throughput over a measured window.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Throughput {
    pub messages: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub msgs_per_s: f64,
    pub mb_per_s: f64,
}

impl Throughput {
    pub fn new(count: Count, window: Duration) -> Self {
        let seconds = window.as_secs_f64();
        let per_second = |n: u64| {
            if seconds > 0.0 {
                n as f64 / seconds
            } else {
                0.0
            }
        };
        Self {
            messages: count.messages,
            bytes: count.bytes,
            seconds,
            msgs_per_s: per_second(count.messages),
            mb_per_s: per_second(count.bytes) / 1e6,
        }
    }
}

/// The machine the load generator ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub kernel: String,
    pub cpu_model: String,
    pub memory_bytes: Option<u64>,
}

impl Machine {
    pub fn describe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| std::env::consts::ARCH.to_string(), |(_, v)| v.trim().to_string());
        let memory_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
        });
        Self {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".into(), |k| k.trim().to_string()),
            cpu_model,
            memory_bytes,
        }
    }
}

/// The workload as run, for the JSON file.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadReport {
    pub mode: String,
    pub topic: String,
    pub partitions: i32,
    pub message_bytes: super::args::SizeRange,
    pub keys: String,
    pub batch_bytes: usize,
    pub linger_ms: u64,
    pub acks: String,
    pub compression: String,
    pub in_flight: usize,
    pub duration_s: Option<f64>,
    pub messages: Option<u64>,
    pub warmup_s: f64,
    pub rate_msgs_per_s: Option<f64>,
    pub from: String,
    pub verify: bool,
    pub fetch_sessions: bool,
    pub cores: usize,
    pub connections_per_core: usize,
}

/// Where the load went.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    pub spawned: bool,
    pub bootstrap: String,
    pub nodes: usize,
    pub broker_cores: Option<usize>,
    pub flush: Option<String>,
    pub listener: Option<String>,
}

/// The spawned broker's resource use over the measured window.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerReport {
    pub pid: u32,
    pub cpu_user_s: f64,
    pub cpu_system_s: f64,
    pub cpu_s: f64,
    /// Bytes produced plus bytes consumed in the window, per broker CPU second.
    pub bytes_per_cpu_s: Option<f64>,
    pub rss_bytes: Option<u64>,
    /// Whether the broker ran with transparent huge pages (`--huge-pages`).
    pub huge_pages: Option<bool>,
}

/// The load generator's own CPU use over the measured window (this
/// process, every thread): near 100% busy means the generator, not the
/// broker, may be the limit.
#[derive(Debug, Clone, Serialize)]
pub struct GeneratorReport {
    pub cores: usize,
    pub window_s: f64,
    pub cpu_user_s: f64,
    pub cpu_system_s: f64,
    pub cpu_s: f64,
    /// CPU seconds over (cores x window): 1.0 is every generator core busy.
    pub busy: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub shardlog_version: &'static str,
    pub unix_time_s: u64,
    pub command: Vec<String>,
    pub workload: WorkloadReport,
    pub target: TargetReport,
    pub machine: Machine,
    /// Consume mode from the beginning: the produce phase that filled the topic.
    pub fill: Option<Throughput>,
    pub produce: Option<Throughput>,
    pub consume: Option<Throughput>,
    pub latency_us: BTreeMap<String, Summary>,
    pub verify: Option<VerifyCounts>,
    pub broker: Option<BrokerReport>,
    pub generator: Option<GeneratorReport>,
    /// Records the broker refused, by reason.
    pub refused: BTreeMap<String, u64>,
    pub errors: Vec<String>,
    pub files: BTreeMap<String, String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.verify.is_none_or(|v| v.ok())
    }

    /// The closing table.
    pub fn table(&self, latencies: &Latencies) -> String {
        let mut out = String::new();
        let w = &self.workload;
        let size = if w.message_bytes.min == w.message_bytes.max {
            format!("{} B", w.message_bytes.min)
        } else {
            format!("{}..{} B", w.message_bytes.min, w.message_bytes.max)
        };
        let _ = writeln!(
            out,
            "\nshardlog bench {}: topic {} ({} partitions), {size} messages, keys {}, acks={}, batch {} B, linger {} ms, in-flight {}",
            w.mode, w.topic, w.partitions, w.keys, w.acks, w.batch_bytes, w.linger_ms, w.in_flight
        );
        let target = if self.target.spawned {
            format!(
                "spawned shardlog, {} cores, flush {}, {} listener",
                self.target.broker_cores.unwrap_or(0),
                self.target.flush.as_deref().unwrap_or("default"),
                self.target.listener.as_deref().unwrap_or("per-core")
            )
        } else {
            format!("broker {} ({} nodes)", self.target.bootstrap, self.target.nodes)
        };
        let rate = w
            .rate_msgs_per_s
            .map_or_else(|| "as fast as possible".to_string(), |r| format!("{} msgs/s", group(r.round() as u64)));
        let _ = writeln!(out, "load: {} cores x {} connections, {rate}; {target}", w.cores, w.connections_per_core);
        let _ = writeln!(
            out,
            "machine: {} cores, {}, Linux {}\n",
            self.machine.cores, self.machine.cpu_model, self.machine.kernel
        );
        let _ = writeln!(out, "{:<12}{:>14}{:>10}{:>14}{:>10}", "", "messages", "seconds", "msgs/s", "MB/s");
        for (name, throughput) in [("fill", &self.fill), ("produce", &self.produce), ("consume", &self.consume)] {
            if let Some(t) = throughput {
                let _ = writeln!(
                    out,
                    "{name:<12}{:>14}{:>10.2}{:>14}{:>10.2}",
                    group(t.messages),
                    t.seconds,
                    group(t.msgs_per_s.round() as u64),
                    t.mb_per_s
                );
            }
        }
        let _ = writeln!(
            out,
            "\n{:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}",
            "latency ms", "p50", "p90", "p99", "p99.9", "p99.99", "max", "count"
        );
        for (name, latency) in latencies.named() {
            let s = latency.summary();
            let ms = |us: u64| format!("{:.3}", us as f64 / 1000.0);
            let label = if name == "e2e" { "end-to-end" } else { name };
            let _ = writeln!(
                out,
                "{label:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}",
                ms(s.p50_us),
                ms(s.p90_us),
                ms(s.p99_us),
                ms(s.p999_us),
                ms(s.p9999_us),
                ms(s.max_us),
                group(s.count)
            );
        }
        if let Some(v) = &self.verify {
            let _ = writeln!(
                out,
                "\nverify: {} expected, {} received, {} lost, {} duplicated, {} reordered ({} streams{}) {}",
                group(v.expected),
                group(v.received),
                v.lost,
                v.duplicated,
                v.reordered,
                v.streams,
                if v.refused > 0 { format!(", {} refused by the broker", group(v.refused)) } else { String::new() },
                if v.ok() { "OK" } else { "FAILED" }
            );
        }
        if let Some(b) = &self.broker {
            let per_cpu = b.bytes_per_cpu_s.map_or_else(|| "-".to_string(), |v| format!("{:.1} MB", v / 1e6));
            let rss = b.rss_bytes.map_or_else(|| "-".to_string(), |v| format!("{:.1} MB", v as f64 / 1e6));
            let _ = writeln!(
                out,
                "broker: {:.2} CPU s (user {:.2}, sys {:.2}), {per_cpu} per CPU second, RSS {rss}{}",
                b.cpu_s,
                b.cpu_user_s,
                b.cpu_system_s,
                if b.huge_pages == Some(true) { ", huge pages" } else { "" }
            );
        }
        if let Some(g) = &self.generator {
            let busy = g.busy.map_or_else(|| "-".to_string(), |b| format!("{:.0}%", b * 100.0));
            let _ = writeln!(
                out,
                "generator: {:.2} CPU s (user {:.2}, sys {:.2}) in {:.1} s on {} core{}: {busy} busy",
                g.cpu_s,
                g.cpu_user_s,
                g.cpu_system_s,
                g.window_s,
                g.cores,
                if g.cores == 1 { "" } else { "s" }
            );
        }
        for (reason, count) in &self.refused {
            let _ = writeln!(out, "refused by the broker: {} records: {reason}", group(*count));
        }
        for error in &self.errors {
            let _ = writeln!(out, "error: {error}");
        }
        out
    }
}

/// The live line: rates over the last interval, p99 over the run so far.
pub fn progress_line(elapsed: Duration, warmup: bool, interval: &Tick, interval_s: f64, totals: &Tick) -> String {
    let mut line = format!("[{:>5.0}s]{}", elapsed.as_secs_f64(), if warmup { " warmup" } else { "" });
    let rate = |count: &Count| {
        let s = interval_s.max(1e-3);
        format!(
            "{:>11} msg/s {:>8.1} MB/s",
            group((count.messages as f64 / s).round() as u64),
            count.bytes as f64 / s / 1e6
        )
    };
    let p99 = |latency: &super::histogram::Latency| {
        if latency.is_empty() {
            "-".to_string()
        } else {
            format!("{:.3} ms", latency.quantile_us(0.99) as f64 / 1000.0)
        }
    };
    if totals.produced.messages > 0 || interval.produced.messages > 0 {
        let _ = write!(line, " produce {} p99 {}", rate(&interval.produced), p99(&totals.latencies.produce));
    }
    if totals.consumed.messages > 0 || totals.fetches > 0 {
        let _ = write!(line, " | consume {}", rate(&interval.consumed));
        if !totals.latencies.e2e.is_empty() {
            let _ = write!(line, " e2e p99 {}", p99(&totals.latencies.e2e));
        }
    }
    if totals.refused > 0 {
        let _ = write!(line, " | refused {}", group(totals.refused));
    }
    line
}

/// 1234567 -> "1,234,567".
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, c) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
    }

    #[test]
    fn throughput_divides_by_the_window() {
        let t = Throughput::new(Count { messages: 5000, bytes: 5_000_000 }, Duration::from_secs(2));
        assert_eq!(t.msgs_per_s, 2500.0);
        assert_eq!(t.mb_per_s, 2.5);
    }
}
