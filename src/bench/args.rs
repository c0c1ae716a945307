//! The `shardlog bench` command line: flags, the parsers for their values
//! (sizes, size ranges, rates, durations, key modes), and the check that
//! turns them into a [`Workload`] once, before anything starts.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::ListenerMode;

/// Every value carries this many bytes of bench header (run, producer,
/// sequence, send time), so no message may be smaller.
pub const MESSAGE_BYTES_MIN: u64 = super::payload::HEADER_BYTES as u64;
/// Largest message the generator makes.
pub const MESSAGE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Load-generator cores, and connections per core.
pub const BENCH_CORES_MAX: usize = 256;
pub const CONNECTIONS_PER_CORE_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Producers only: throughput and send-to-ack latency.
    Produce,
    /// Consumers only: read throughput and fetch latency (--from beginning
    /// first fills the topic when it is empty or the broker was spawned).
    Consume,
    /// Producers and consumers at once: adds end-to-end latency.
    E2e,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StartFrom {
    /// Read the whole topic from its first offset, as fast as possible.
    Beginning,
    /// Read only what is written after the start.
    Tail,
}

/// Load generator for any Kafka-compatible broker.
///
/// Without --brokers it starts a shardlog broker of its own (--spawn) on a
/// temporary directory and free ports, and stops it at the end; that broker
/// keeps at most about 3/8 of the free disk (segment size and retention per
/// partition sized to it), so long runs drop old data instead of filling it.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// What to measure [default: produce].
    #[arg(value_enum)]
    pub mode: Option<Mode>,
    /// Bootstrap broker, host:port (any Kafka-compatible broker).
    #[arg(long, short = 'b', conflicts_with = "spawn")]
    pub brokers: Option<String>,
    /// Start a shardlog broker as a child process (the default without --brokers).
    #[arg(long)]
    pub spawn: bool,
    /// Cores of the spawned broker [default: half of this machine's].
    #[arg(long)]
    pub broker_cores: Option<usize>,
    /// Flush policy of the spawned broker: always, never, or an interval in ms [default: the broker's].
    #[arg(long)]
    pub flush: Option<String>,
    /// Listener mode of the spawned broker [default: per-core].
    #[arg(long, value_enum)]
    pub listener: Option<ListenerMode>,
    /// Load-generator cores, one glommio executor each [default: the cores the broker leaves].
    #[arg(long)]
    pub cores: Option<usize>,
    /// Producer (and consumer) clients per core; each opens one connection per broker node it needs.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Topic; created with --partitions when missing.
    #[arg(long, default_value = "shardlog-bench")]
    pub topic: String,
    #[arg(long, default_value_t = 16)]
    pub partitions: i32,
    /// Value size in bytes: fixed (1024, 4KiB) or a uniform range (256..4096).
    #[arg(long, default_value = "1024", value_parser = parse_size_range)]
    pub message_bytes: SizeRange,
    /// none: no key, sticky partition per batch; round-robin: no key, next partition per message;
    /// random:N: one of N keys at random, partition by murmur2 hash like the Java client.
    #[arg(long, default_value = "none", value_parser = parse_keys)]
    pub keys: Keys,
    /// Largest batch per partition, in bytes (4096, 64KiB, 1MiB).
    #[arg(long, default_value = "16384", value_parser = parse_size)]
    pub batch_bytes: u64,
    /// How long a partial batch may wait for more messages.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u64,
    /// 0, 1 or all.
    #[arg(long, default_value = "1", value_parser = parse_acks)]
    pub acks: i16,
    /// Only none is implemented.
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// Requests outstanding per connection.
    #[arg(long, default_value_t = 5)]
    pub in_flight: usize,
    /// How long to measure, after the warmup (30s, 500ms, 2m) [default: 30s unless --messages].
    #[arg(long, value_parser = parse_duration, conflicts_with = "messages")]
    pub duration: Option<Duration>,
    /// Messages to send (and, with e2e/consume, to receive), then stop.
    #[arg(long)]
    pub messages: Option<u64>,
    /// Load before measuring; not counted [default: 5s with --duration, 0s with --messages].
    #[arg(long, value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// Target rate, all producers together: messages/s (50000, 50k) or bytes/s (200MB/s, 1GiB/s) [default: as fast as possible].
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<Rate>,
    /// Where consumers start.
    #[arg(long, value_enum, default_value = "tail")]
    pub from: StartFrom,
    /// Number every message and check that none is lost, duplicated or reordered.
    #[arg(long)]
    pub verify: bool,
    /// Consumers keep a fetch session (KIP-227) per node, so fetches after the first list only the partitions that changed, both ways; `false` lists every partition every time.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub fetch_sessions: bool,
    /// Latency percentile distribution (HdrHistogram text format, ms); other histograms go to FILE.<name>.hgrm.
    #[arg(long, value_name = "FILE")]
    pub hgrm: Option<PathBuf>,
    /// SVG plot of latency by percentile.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Every figure, the workload and the machine, as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// A message size: fixed when `min == max`, else uniform in `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SizeRange {
    pub min: u64,
    pub max: u64,
}

impl SizeRange {
    pub fn mean(&self) -> f64 {
        (self.min + self.max) as f64 / 2.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    None,
    RoundRobin,
    Random(u32),
}

impl std::fmt::Display for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Keys::None => write!(f, "none"),
            Keys::RoundRobin => write!(f, "round-robin"),
            Keys::Random(count) => write!(f, "random:{count}"),
        }
    }
}

/// A target rate for all producers together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    MessagesPerSecond(f64),
    BytesPerSecond(f64),
}

impl Rate {
    /// Messages per second, given the mean message size.
    pub fn messages_per_second(&self, message_bytes_mean: f64) -> f64 {
        match *self {
            Rate::MessagesPerSecond(rate) => rate,
            Rate::BytesPerSecond(rate) => rate / message_bytes_mean.max(1.0),
        }
    }
}

/// When producers stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Duration(Duration),
    Messages(u64),
}

/// The validated workload every core runs.
#[derive(Debug, Clone)]
pub struct Workload {
    pub mode: Mode,
    pub topic: String,
    pub partitions: i32,
    pub message_bytes: SizeRange,
    pub keys: Keys,
    pub batch_bytes: usize,
    pub linger: Duration,
    pub acks: i16,
    pub in_flight: usize,
    pub limit: Limit,
    pub warmup: Duration,
    /// Messages per second, all producers together; None = as fast as possible.
    pub rate_messages_per_s: Option<f64>,
    pub from: StartFrom,
    pub verify: bool,
    pub fetch_sessions: bool,
    pub cores: usize,
    pub connections: usize,
}

impl Workload {
    /// Producer (and consumer) clients in all.
    pub fn clients(&self) -> usize {
        self.cores * self.connections
    }
}

/// Why the flags were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArgError(pub String);

impl BenchArgs {
    /// Checks the flags; `cores` is the load-generator core count already
    /// decided (it depends on the broker's).
    pub fn workload(&self, cores: usize) -> Result<Workload, ArgError> {
        let fail = |message: String| Err(ArgError(message));
        if self.compression != "none" {
            return fail(format!("--compression {}: only none is implemented; compressed batches would need codecs shardlog does not have", self.compression));
        }
        if !(1..=crate::constants::TOPIC_PARTITIONS_MAX).contains(&self.partitions) {
            return fail(format!("--partitions must be 1..={}", crate::constants::TOPIC_PARTITIONS_MAX));
        }
        if self.message_bytes.min < MESSAGE_BYTES_MIN
            || self.message_bytes.max > MESSAGE_BYTES_MAX
            || self.message_bytes.min > self.message_bytes.max
        {
            return fail(format!(
                "--message-bytes must lie in {MESSAGE_BYTES_MIN}..={MESSAGE_BYTES_MAX} (each value carries a {MESSAGE_BYTES_MIN}-byte header), low end first"
            ));
        }
        if self.batch_bytes < 1024 || self.batch_bytes > 64 * 1024 * 1024 {
            return fail("--batch-bytes must be 1KiB..=64MiB".into());
        }
        if !(1..=super::super::client::pipelined::IN_FLIGHT_MAX).contains(&self.in_flight) {
            return fail(format!("--in-flight must be 1..={}", super::super::client::pipelined::IN_FLIGHT_MAX));
        }
        if !(1..=BENCH_CORES_MAX).contains(&cores) {
            return fail(format!("--cores must be 1..={BENCH_CORES_MAX}"));
        }
        if !(1..=CONNECTIONS_PER_CORE_MAX).contains(&self.connections) {
            return fail(format!("--connections must be 1..={CONNECTIONS_PER_CORE_MAX}"));
        }
        if let Keys::Random(0) = self.keys {
            return fail("--keys random:N needs N >= 1".into());
        }
        let limit = match (self.duration, self.messages) {
            (_, Some(0)) => return fail("--messages must be at least 1".into()),
            (None, Some(messages)) => Limit::Messages(messages),
            (Some(duration), None) if duration.is_zero() => return fail("--duration must be more than 0".into()),
            (Some(duration), None) => Limit::Duration(duration),
            (None, None) => Limit::Duration(Duration::from_secs(30)),
            (Some(_), Some(_)) => return fail("give --duration or --messages, not both".into()),
        };
        let warmup = self.warmup.unwrap_or(match limit {
            Limit::Duration(_) => Duration::from_secs(5),
            Limit::Messages(_) => Duration::ZERO,
        });
        let rate_messages_per_s = match self.rate {
            None => None,
            Some(rate) => {
                let per_second = rate.messages_per_second(self.message_bytes.mean());
                if !(per_second.is_finite() && per_second > 0.0) {
                    return fail("--rate must be more than 0".into());
                }
                Some(per_second)
            }
        };
        Ok(Workload {
            mode: self.mode.unwrap_or(Mode::Produce),
            topic: self.topic.clone(),
            partitions: self.partitions,
            message_bytes: self.message_bytes,
            keys: self.keys,
            batch_bytes: self.batch_bytes as usize,
            linger: Duration::from_millis(self.linger_ms),
            acks: self.acks,
            in_flight: self.in_flight,
            limit,
            warmup,
            rate_messages_per_s,
            from: self.from,
            verify: self.verify,
            fetch_sessions: self.fetch_sessions,
            cores,
            connections: self.connections,
        })
    }
}

/// `1024`, `4KiB`, `1MiB`, `64kb`, `2MB`: bytes (KiB = 1024, KB = 1000).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a size (try 1024, 4KiB, 1MiB)"))?;
    let scale = unit_scale(unit)
        .ok_or_else(|| format!("{text:?}: unknown size unit {unit:?} (B, KB, KiB, MB, MiB, GB, GiB)"))?;
    let bytes = number * scale;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes <= u64::MAX as f64) || bytes.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

fn unit_scale(unit: &str) -> Option<f64> {
    Some(match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    })
}

/// `1024` (fixed) or `256..4096` (uniform, both ends included).
pub fn parse_size_range(text: &str) -> Result<SizeRange, String> {
    match text.split_once("..") {
        None => parse_size(text).map(|size| SizeRange { min: size, max: size }),
        Some((low, high)) => {
            let min = parse_size(low)?;
            let max = parse_size(high.trim_start_matches('='))?;
            if min > max {
                return Err(format!("{text:?}: the low end comes first"));
            }
            Ok(SizeRange { min, max })
        }
    }
}

/// `30s`, `500ms`, `2m`, `1h`, `1.5s`, `250us`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration (try 30s, 500ms, 2m)"))?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1e3,
        "us" | "µs" => number / 1e6,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("{text:?}: unknown time unit {unit:?} (us, ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is out of range"))
}

/// `50000`, `50k`, `1M`, `50000/s`: messages per second; `200MB/s`,
/// `1GiB/s`: bytes per second.
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let body = text.trim();
    let body = body.strip_suffix("/s").unwrap_or(body);
    let split = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
    let (number, unit) = body.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a rate (try 50000, 50k, 200MB/s)"))?;
    let rate = match unit.trim() {
        "" => Rate::MessagesPerSecond(number),
        "k" => Rate::MessagesPerSecond(number * 1e3),
        "M" => Rate::MessagesPerSecond(number * 1e6),
        "msg" | "msgs" => Rate::MessagesPerSecond(number),
        bytes_unit => {
            let scale = unit_scale(bytes_unit).filter(|_| bytes_unit.to_ascii_lowercase().ends_with('b'));
            Rate::BytesPerSecond(
                number
                    * scale
                        .ok_or_else(|| format!("{text:?}: unknown rate unit {bytes_unit:?} (k, M, KB, MB, MiB, GB)"))?,
            )
        }
    };
    match rate {
        Rate::MessagesPerSecond(r) | Rate::BytesPerSecond(r) if r > 0.0 && r.is_finite() => Ok(rate),
        _ => Err(format!("{text:?}: a rate must be more than 0")),
    }
}

/// `none`, `round-robin`, `random:N`.
pub fn parse_keys(text: &str) -> Result<Keys, String> {
    match text {
        "none" => Ok(Keys::None),
        "round-robin" => Ok(Keys::RoundRobin),
        _ => match text.strip_prefix("random:") {
            Some(count) => count
                .parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .map(Keys::Random)
                .ok_or_else(|| format!("{text:?}: random:N needs N from 1 to {}", u32::MAX)),
            None => Err(format!("{text:?}: expected none, round-robin or random:N")),
        },
    }
}

/// `0`, `1`, `all` (or `-1`).
pub fn parse_acks(text: &str) -> Result<i16, String> {
    match text {
        "0" => Ok(0),
        "1" => Ok(1),
        "all" | "-1" => Ok(-1),
        _ => Err(format!("{text:?}: acks is 0, 1 or all")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> BenchArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).expect("parses").bench
    }

    #[test]
    fn size_range_parses_fixed_and_ranges() {
        assert_eq!(parse_size_range("256..4096"), Ok(SizeRange { min: 256, max: 4096 }));
        assert_eq!(parse_size_range("1024"), Ok(SizeRange { min: 1024, max: 1024 }));
        assert_eq!(parse_size_range("1KiB..=2KiB"), Ok(SizeRange { min: 1024, max: 2048 }));
        assert!(parse_size_range("4096..256").is_err());
        assert!(parse_size_range("big").is_err());
    }

    #[test]
    fn sizes_know_decimal_and_binary_units() {
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("1.5").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn rates_are_messages_or_bytes_per_second() {
        assert_eq!(parse_rate("200MB/s"), Ok(Rate::BytesPerSecond(200e6)));
        assert_eq!(parse_rate("1GiB/s"), Ok(Rate::BytesPerSecond(1024.0 * 1024.0 * 1024.0)));
        assert_eq!(parse_rate("50000"), Ok(Rate::MessagesPerSecond(50000.0)));
        assert_eq!(parse_rate("50k"), Ok(Rate::MessagesPerSecond(50000.0)));
        assert_eq!(parse_rate("1M/s"), Ok(Rate::MessagesPerSecond(1e6)));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10parsecs/s").is_err());
        assert_eq!(Rate::BytesPerSecond(200e6).messages_per_second(1000.0), 200_000.0);
    }

    #[test]
    fn durations_take_common_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5y").is_err());
    }

    #[test]
    fn keys_and_acks_parse() {
        assert_eq!(parse_keys("none"), Ok(Keys::None));
        assert_eq!(parse_keys("round-robin"), Ok(Keys::RoundRobin));
        assert_eq!(parse_keys("random:1000"), Ok(Keys::Random(1000)));
        assert!(parse_keys("random:0").is_err());
        assert!(parse_keys("sometimes").is_err());
        assert_eq!(parse_acks("all"), Ok(-1));
        assert!(parse_acks("2").is_err());
    }

    #[test]
    fn flags_become_a_workload_with_defaults() {
        let args =
            parse(&["e2e", "--message-bytes", "256..4096", "--rate", "200MB/s", "--duration", "30s", "--acks", "all"]);
        let workload = args.workload(2).expect("valid");
        assert_eq!(workload.mode, Mode::E2e);
        assert_eq!(workload.limit, Limit::Duration(Duration::from_secs(30)));
        assert_eq!(workload.warmup, Duration::from_secs(5));
        assert_eq!(workload.acks, -1);
        let rate = workload.rate_messages_per_s.expect("rate");
        assert!((rate - 200e6 / 2176.0).abs() < 1e-6);
        let args = parse(&["--messages", "20000"]);
        let workload = args.workload(1).expect("valid");
        assert_eq!(workload.mode, Mode::Produce);
        assert_eq!(workload.limit, Limit::Messages(20000));
        assert_eq!(workload.warmup, Duration::ZERO);
    }

    #[test]
    fn bad_combinations_are_refused_with_a_reason() {
        let args = parse(&["--compression", "zstd"]);
        assert!(args.workload(1).unwrap_err().0.contains("only none"));
        let args = parse(&["--message-bytes", "8"]);
        assert!(args.workload(1).unwrap_err().0.contains("header"));
        assert!(Cli::try_parse_from(["bench", "--duration", "1s", "--messages", "5"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--brokers", "h:1", "--spawn"]).is_err());
    }
}
