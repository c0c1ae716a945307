//! Configuration: built-in defaults, overridden by a TOML file, overridden by
//! `SHARDLOG_*` environment variables, overridden by flags. Validated once at
//! start; a bad setting stops the broker with a message naming it. Every
//! path is made absolute against the working directory in the same step
//! (`ServeConfig::resolve`), so nothing later opens a relative path: glommio
//! 0.9 opens files with `openat(-1, path)` rather than `AT_FDCWD`
//! (DataDog/glommio#637), which fails a relative path with EBADF.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::constants;
use crate::log::{FlushPolicy, LogConfig};

pub mod broker;

/// How clients reach the cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ListenerMode {
    /// Each core listens on its own port (base + core) and is its own node.
    PerCore,
    /// All cores share one port (SO_REUSEPORT); requests are forwarded to the
    /// owning core.
    Shared,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines with key=value fields.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Topic defaults (Kafka's `log.*` broker settings).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicDefaults {
    pub partitions: i32,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub segment_bytes: u64,
    pub segment_ms: u64,
    /// `always`, `never`, or an interval in milliseconds.
    pub flush: String,
    pub max_message_bytes: usize,
    pub cleanup_policy: String,
    /// `default.replication.factor`: replicas of a topic created without one.
    pub replication_factor: i16,
    /// `min.insync.replicas`: replicas an acks=all write must reach.
    pub min_insync_replicas: i32,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        let log = LogConfig::default();
        Self {
            partitions: 1,
            retention_ms: log.retention_ms,
            retention_bytes: log.retention_bytes,
            segment_bytes: log.segment_bytes,
            segment_ms: log.segment_ms,
            flush: log.flush.to_string(),
            max_message_bytes: log.batch_bytes_max,
            cleanup_policy: "delete".into(),
            replication_factor: 1,
            min_insync_replicas: log.min_insync_replicas,
        }
    }
}

/// Consumer-group settings (Kafka's `group.*`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupSettings {
    pub initial_rebalance_delay_ms: u64,
    pub session_timeout_ms_min: i32,
    pub session_timeout_ms_max: i32,
    /// Partitions of `__consumer_offsets` when the cluster creates it
    /// (offsets.topic.num.partitions); a group lives in partition
    /// `abs(java_hash(group)) % partitions`.
    pub offsets_topic_partitions: i32,
    /// Replicas of `__consumer_offsets` (offsets.topic.replication.factor),
    /// fewer when fewer machines serve when it is created.
    pub offsets_topic_replication_factor: i16,
}

impl Default for GroupSettings {
    fn default() -> Self {
        let defaults = crate::group::GroupConfig::default();
        Self {
            initial_rebalance_delay_ms: defaults.initial_rebalance_delay_ms,
            session_timeout_ms_min: defaults.session_timeout_ms_min,
            session_timeout_ms_max: defaults.session_timeout_ms_max,
            offsets_topic_partitions: constants::OFFSETS_TOPIC_PARTITIONS_DEFAULT,
            offsets_topic_replication_factor: constants::OFFSETS_TOPIC_REPLICATION_FACTOR_DEFAULT,
        }
    }
}

/// Everything `shardlog serve` runs with.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    pub data: PathBuf,
    /// Cores to run; 0 means every online core.
    pub cores: usize,
    pub host: IpAddr,
    /// Host advertised to clients in Metadata (defaults to `host`).
    pub advertised_host: Option<String>,
    pub port: u16,
    pub listener: ListenerMode,
    /// Node id of core 0 when the machine first registers; core i is
    /// `node_id_base + i`. Later starts keep the registered ids.
    pub node_id_base: i32,
    /// This machine's id; `None`: the one kept in the data directory, or a
    /// new one (`server::machine_id`).
    pub machine_id: Option<u64>,
    /// The controller quorum, `ID@HOST:PORT,...`; `None`: this machine
    /// alone (see `voters`).
    pub controller_voters: Option<String>,
    /// Where this voter's controller listens; defaults to its entry's port.
    pub controller_port: Option<u16>,
    /// This machine's rack (Kafka's `broker.rack`).
    pub rack: Option<String>,
    /// SASL mechanisms the Kafka ports require (comma-separated); empty:
    /// none (see `crate::security`).
    pub sasl_mechanisms: String,
    /// `NAME:PASSWORD`: a user made at start if the cluster lacks it.
    pub bootstrap_user: Option<String>,
    /// Failed logins from one address in 10 s before its logins are
    /// refused unchecked (see `server::limits`); 0: no limit.
    pub sasl_login_failures_max: u32,
    /// UDP port of this machine's SWIM gossip; `None`: no gossip.
    pub gossip_port: Option<u16>,
    /// Gossip addresses (`host:port,...`) of machines to join through.
    pub seeds: Option<String>,
    pub auto_create_topics: bool,
    pub request_bytes_max: usize,
    /// Bytes of requests being read or served per core; readers wait when
    /// it is spent, so producers slow down instead of exhausting memory.
    pub in_flight_bytes_max: usize,
    /// Tail cache per core (written batches kept for readers).
    pub cache_bytes_max: usize,
    /// Open client connections, all cores together.
    pub connections_max: usize,
    /// Open client connections from one IP address, all cores together.
    pub connections_per_ip_max: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout_ms: u64,
    /// A request must arrive whole within this long once it has begun.
    pub request_read_timeout_ms: u64,
    pub io_memory_bytes: usize,
    /// Pin each executor to its core.
    pub pin: bool,
    /// A roll writes the new segment over the file of the oldest segment
    /// when retention would delete that one anyway.
    pub segment_recycling: bool,
    pub log_level: String,
    pub log_format: LogFormat,
    /// Port of the HTTP metrics and health endpoint on `host`; 0 disables it.
    pub metrics_port: u16,
    /// Export per-partition series (offsets, sizes, group lag); off by
    /// default to bound label cardinality.
    pub metrics_per_partition: bool,
    /// A follower not caught up for this long leaves the ISR
    /// (`replica.lag.time.max.ms`).
    pub replica_lag_time_max_ms: u64,
    pub topic: TopicDefaults,
    pub group: GroupSettings,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            data: PathBuf::from("./data"),
            cores: 0,
            host: IpAddr::from([127, 0, 0, 1]),
            advertised_host: None,
            port: 9092,
            listener: ListenerMode::PerCore,
            node_id_base: 0,
            machine_id: None,
            controller_voters: None,
            controller_port: None,
            rack: None,
            sasl_mechanisms: String::new(),
            bootstrap_user: None,
            sasl_login_failures_max: 100,
            gossip_port: None,
            seeds: None,
            auto_create_topics: true,
            request_bytes_max: constants::REQUEST_BYTES_MAX_DEFAULT,
            in_flight_bytes_max: constants::IN_FLIGHT_BYTES_MAX_DEFAULT,
            cache_bytes_max: crate::log::CORE_CACHE_BYTES_MAX_DEFAULT,
            connections_max: constants::CONNECTIONS_MAX_DEFAULT,
            connections_per_ip_max: constants::CONNECTIONS_PER_IP_MAX_DEFAULT,
            idle_timeout_ms: 600_000,
            request_read_timeout_ms: 30_000,
            io_memory_bytes: constants::IO_MEMORY_BYTES_DEFAULT,
            pin: true,
            segment_recycling: true,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            metrics_port: constants::METRICS_PORT_DEFAULT,
            metrics_per_partition: false,
            replica_lag_time_max_ms: constants::REPLICA_LAG_TIME_MS_MAX_DEFAULT,
            topic: TopicDefaults::default(),
            group: GroupSettings::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {source}")]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("invalid setting {name} = {value}: {reason}")]
    Invalid { name: &'static str, value: String, reason: &'static str },
    #[error("cannot make {path} absolute: the working directory: {source}")]
    WorkingDirectory { path: PathBuf, source: std::io::Error },
}

/// `path` made absolute against the working directory, without touching the
/// file system (no symlinks resolved, `..` kept): what a relative path from
/// the command line, the environment or a config file means.
pub fn absolute_path(path: &Path) -> Result<PathBuf, ConfigError> {
    std::path::absolute(path).map_err(|source| ConfigError::WorkingDirectory { path: path.into(), source })
}

impl ServeConfig {
    /// Reads a TOML file; `path` is made absolute first, so errors name it in full.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let path = absolute_path(path)?;
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse { path, source })
    }

    /// The config the broker runs with: every path absolute, every setting
    /// checked. Resolving again changes nothing.
    pub fn resolve(mut self) -> Result<Self, ConfigError> {
        self.data = absolute_path(&self.data)?;
        self.validate()?;
        Ok(self)
    }

    /// Cores actually used.
    pub fn core_count(&self) -> usize {
        if self.cores == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.cores
        }
    }

    pub fn advertised_host(&self) -> String {
        self.advertised_host.clone().unwrap_or_else(|| self.host.to_string())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |name, value: String, reason| Err(ConfigError::Invalid { name, value, reason });
        if !self.data.is_absolute() {
            return invalid("data", self.data.display().to_string(), "must be absolute: resolve() the config first");
        }
        if self.core_count() > constants::CORES_MAX {
            return invalid("cores", self.cores.to_string(), "more than 256 cores");
        }
        if self.listener == ListenerMode::PerCore && usize::from(self.port) + self.core_count() > 65536 {
            return invalid("port", self.port.to_string(), "port + cores exceeds 65535");
        }
        if self.request_bytes_max < 1024 || self.request_bytes_max > i32::MAX as usize {
            return invalid("request-bytes-max", self.request_bytes_max.to_string(), "must be 1 KiB .. 2 GiB");
        }
        if self.in_flight_bytes_max < self.request_bytes_max {
            return invalid(
                "in-flight-bytes-max",
                self.in_flight_bytes_max.to_string(),
                "must be at least request-bytes-max",
            );
        }
        if self.connections_max == 0 || self.connections_per_ip_max == 0 {
            return invalid("connections-max", self.connections_max.to_string(), "limits must be positive");
        }
        if self.idle_timeout_ms == 0 || self.request_read_timeout_ms == 0 {
            return invalid("idle-timeout-ms", self.idle_timeout_ms.to_string(), "timeouts must be positive");
        }
        if self.topic.replication_factor < 1 || self.topic.min_insync_replicas < 1 {
            return invalid(
                "default-replication-factor",
                format!("{} / min-insync-replicas {}", self.topic.replication_factor, self.topic.min_insync_replicas),
                "both at least 1",
            );
        }
        if self.replica_lag_time_max_ms < 100 {
            return invalid("replica-lag-time-max-ms", self.replica_lag_time_max_ms.to_string(), "at least 100");
        }
        if self.io_memory_bytes < 64 * 1024 {
            return invalid("io-memory-bytes", self.io_memory_bytes.to_string(), "at least 64 KiB");
        }
        if self.group.session_timeout_ms_min <= 0
            || self.group.session_timeout_ms_min > self.group.session_timeout_ms_max
        {
            return invalid(
                "group-min-session-timeout-ms",
                self.group.session_timeout_ms_min.to_string(),
                "must be positive and at most group-max-session-timeout-ms",
            );
        }
        if !(1..=1000).contains(&self.group.offsets_topic_partitions) {
            return invalid(
                "offsets-topic-partitions",
                self.group.offsets_topic_partitions.to_string(),
                "must be 1 ..= 1000",
            );
        }
        if self.group.offsets_topic_replication_factor < 1 {
            return invalid(
                "offsets-topic-replication-factor",
                self.group.offsets_topic_replication_factor.to_string(),
                "at least 1",
            );
        }
        let kafka_ports = usize::from(self.port)..usize::from(self.port) + self.core_count();
        if self.metrics_port != 0 && kafka_ports.contains(&usize::from(self.metrics_port)) {
            return invalid("metrics-port", self.metrics_port.to_string(), "collides with a Kafka port");
        }
        if let Some(id) = self.machine_id.filter(|id| *id == 0 || *id > i32::MAX as u64) {
            return invalid("machine-id", id.to_string(), "must be 1 ..= 2147483647");
        }
        self.voters()?;
        if self.seeds.as_ref().is_some_and(|s| !s.trim().is_empty()) && self.gossip_port.is_none() {
            return invalid("seeds", self.seeds.clone().unwrap_or_default(), "gossip needs --gossip-port too");
        }
        if let Some(rack) = self.rack.as_ref().filter(|r| r.is_empty() || r.len() > 255) {
            return invalid("rack", rack.clone(), "must be 1 ..= 255 bytes");
        }
        if crate::security::parse_mechanisms(&self.sasl_mechanisms).is_err() {
            let reason = "each must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512";
            return invalid("sasl-mechanisms", self.sasl_mechanisms.clone(), reason);
        }
        if self.bootstrap_user.as_deref().is_some_and(|u| crate::security::parse_user(u).is_err()) {
            return invalid("bootstrap-user", "(hidden)".into(), "must be NAME:PASSWORD, both non-empty");
        }
        let clustered = self.controller_voters.is_some() || self.seeds.is_some();
        if clustered && !self.sasl_mechanisms.trim().is_empty() && self.bootstrap_user.is_none() {
            let reason = "a machine of a cluster logs in to the others' Kafka ports as --bootstrap-user: set it";
            return invalid("sasl-mechanisms", self.sasl_mechanisms.clone(), reason);
        }
        if self.node_id_base < 0 {
            return invalid("node-id-base", self.node_id_base.to_string(), "must be >= 0");
        }
        self.topic_log_config(&Default::default()).map(|_| ())
    }

    /// The SASL mechanisms the Kafka ports require (validated at start).
    pub fn sasl_mechanisms(&self) -> Vec<crate::security::Mechanism> {
        crate::security::parse_mechanisms(&self.sasl_mechanisms).unwrap_or_default()
    }

    /// The bootstrap user's name and password (validated at start).
    pub fn bootstrap_user(&self) -> Option<(String, String)> {
        self.bootstrap_user.as_deref().and_then(|u| crate::security::parse_user(u).ok())
    }

    /// How this machine logs in to the others' Kafka ports (its followers
    /// fetch there): as the bootstrap user, with SCRAM-SHA-512, -256 or
    /// PLAIN, whichever is enabled first in that order; `None` without SASL.
    pub fn inter_machine_login(&self) -> Option<crate::client::pipelined::SaslLogin> {
        use crate::security::{scram::Hash, Mechanism};
        let enabled = self.sasl_mechanisms();
        let mechanism = [Mechanism::Scram(Hash::Sha512), Mechanism::Scram(Hash::Sha256), Mechanism::Plain]
            .into_iter()
            .find(|m| enabled.contains(m))?;
        let (user, password) = self.bootstrap_user()?;
        Some(crate::client::pipelined::SaslLogin { mechanism, user, password })
    }

    /// The controller voters, as (machine id, host:port), in the order
    /// given; empty when this machine is a quorum of its own.
    pub fn voters(&self) -> Result<Vec<(u64, String)>, ConfigError> {
        let Some(list) = &self.controller_voters else { return Ok(Vec::new()) };
        let bad = |reason| ConfigError::Invalid { name: "controller-voters", value: list.clone(), reason };
        let mut voters: Vec<(u64, String)> = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (id, address) = entry.split_once('@').ok_or_else(|| bad("each voter is ID@HOST:PORT"))?;
            let id: u64 = id.parse().map_err(|_| bad("a voter's id is a machine id (1 ..= 2147483647)"))?;
            if id == 0 || id > i32::MAX as u64 {
                return Err(bad("a voter's id is a machine id (1 ..= 2147483647)"));
            }
            let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("each voter is ID@HOST:PORT"))?;
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad("each voter is ID@HOST:PORT, with a port 1 ..= 65535"));
            }
            if voters.iter().any(|(other, _)| *other == id) {
                return Err(bad("a machine id is listed twice"));
            }
            voters.push((id, address.to_string()));
        }
        if ![1, 3, 5].contains(&voters.len()) {
            return Err(bad("1, 3 or 5 voters (an even count tolerates no more failures than one fewer)"));
        }
        Ok(voters)
    }

    /// The gossip seeds, `host:port` each.
    pub fn seed_list(&self) -> Vec<String> {
        self.seeds
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    /// The log settings of a topic on a node: its own configs over the
    /// node's dynamic broker configs over the static broker defaults.
    pub fn effective_topic_log_config(
        &self,
        dynamic: broker::DynamicConfigs<'_>,
        overrides: &std::collections::BTreeMap<String, String>,
    ) -> Result<LogConfig, ConfigError> {
        let mut layered = broker::dynamic_topic_defaults(dynamic);
        layered.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.topic_log_config(&layered)
    }

    /// The log settings of a topic: its own configs over the broker defaults.
    pub fn topic_log_config(
        &self,
        overrides: &std::collections::BTreeMap<String, String>,
    ) -> Result<LogConfig, ConfigError> {
        let d = &self.topic;
        let mut log = LogConfig {
            segment_bytes: d.segment_bytes,
            segment_ms: d.segment_ms,
            retention_ms: d.retention_ms,
            retention_bytes: d.retention_bytes,
            flush: FlushPolicy::parse(&d.flush).ok_or(ConfigError::Invalid {
                name: "topic.flush",
                value: d.flush.clone(),
                reason: "always, never, or milliseconds",
            })?,
            batch_bytes_max: d.max_message_bytes,
            min_insync_replicas: d.min_insync_replicas,
            recycle_segments: self.segment_recycling,
            ..LogConfig::default()
        };
        for (name, value) in overrides {
            apply_topic_config(&mut log, name, value)?;
        }
        check_log_config(&log)?;
        Ok(log)
    }
}

/// Topic config keys shardlog understands, as Kafka names them.
pub const TOPIC_CONFIG_KEYS: &[&str] = &[
    "retention.ms",
    "retention.bytes",
    "segment.bytes",
    "segment.ms",
    "flush",
    "max.message.bytes",
    "cleanup.policy",
    "min.insync.replicas",
    "message.timestamp.type",
    "unclean.leader.election.enable",
];

/// Applies one topic config to a log config; unknown keys are refused.
pub fn apply_topic_config(log: &mut LogConfig, name: &str, value: &str) -> Result<(), ConfigError> {
    fn number<T: std::str::FromStr>(name: &'static str, value: &str) -> Result<T, ConfigError> {
        value.parse().map_err(|_| ConfigError::Invalid { name, value: value.into(), reason: "not a number" })
    }
    match name {
        "retention.ms" => log.retention_ms = number("retention.ms", value)?,
        "retention.bytes" => log.retention_bytes = number("retention.bytes", value)?,
        "segment.bytes" => log.segment_bytes = number("segment.bytes", value)?,
        "segment.ms" => log.segment_ms = number("segment.ms", value)?,
        "max.message.bytes" => log.batch_bytes_max = number("max.message.bytes", value)?,
        "flush" => {
            log.flush = FlushPolicy::parse(value).ok_or(ConfigError::Invalid {
                name: "flush",
                value: value.into(),
                reason: "always, never, or milliseconds",
            })?
        }
        "cleanup.policy" => {
            if value != "delete" {
                return Err(ConfigError::Invalid {
                    name: "cleanup.policy",
                    value: value.into(),
                    reason: "only delete is supported",
                });
            }
        }
        "min.insync.replicas" => {
            let n: i32 = number("min.insync.replicas", value)?;
            if n < 1 {
                return Err(ConfigError::Invalid {
                    name: "min.insync.replicas",
                    value: value.into(),
                    reason: "at least 1",
                });
            }
            log.min_insync_replicas = n;
        }
        "unclean.leader.election.enable" => {
            if value != "true" && value != "false" {
                return Err(ConfigError::Invalid {
                    name: "unclean.leader.election.enable",
                    value: value.into(),
                    reason: "true or false",
                });
            }
        }
        "message.timestamp.type" => {
            if value != "CreateTime" {
                return Err(ConfigError::Invalid {
                    name: "message.timestamp.type",
                    value: value.into(),
                    reason: "only CreateTime",
                });
            }
        }
        _ => return Err(ConfigError::Invalid { name: "topic config", value: name.into(), reason: "unknown key" }),
    }
    Ok(())
}

fn check_log_config(log: &LogConfig) -> Result<(), ConfigError> {
    let invalid = |name, value: String, reason| Err(ConfigError::Invalid { name, value, reason });
    if !(64 * 1024..=1 << 30).contains(&log.segment_bytes) {
        return invalid("segment.bytes", log.segment_bytes.to_string(), "must be 64 KiB .. 1 GiB");
    }
    if log.segment_ms == 0 {
        return invalid("segment.ms", "0".into(), "must be positive");
    }
    if log.retention_ms < -1 || log.retention_bytes < -1 {
        return invalid("retention", format!("{}/{}", log.retention_ms, log.retention_bytes), "-1 or a positive value");
    }
    if !(1024..=crate::constants::BATCH_BYTES_MAX_LIMIT).contains(&log.batch_bytes_max) {
        return invalid("max.message.bytes", log.batch_bytes_max.to_string(), "must be 1 KiB .. 64 MiB");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_once_resolved() {
        let config = ServeConfig::default().resolve().unwrap();
        assert_eq!(config.data, std::env::current_dir().unwrap().join("data"));
    }

    #[test]
    fn relative_paths_resolve_against_the_working_directory_and_absolute_ones_stay() {
        let cwd = std::env::current_dir().unwrap();
        let relative = ServeConfig { data: "some/dir".into(), ..ServeConfig::default() };
        let resolved = relative.resolve().unwrap();
        assert_eq!(resolved.data, cwd.join("some/dir"));
        assert_eq!(resolved.clone().resolve().unwrap(), resolved, "resolving twice changes nothing");
        let absolute = ServeConfig { data: "/srv/shardlog".into(), ..ServeConfig::default() };
        assert_eq!(absolute.resolve().unwrap().data, Path::new("/srv/shardlog"));
    }

    #[test]
    fn an_unresolved_config_is_refused() {
        assert!(ServeConfig::default().validate().is_err(), "./data is relative until resolved");
    }

    #[test]
    fn a_config_file_error_names_its_absolute_path() {
        let err = ServeConfig::from_file(Path::new("no/such/shardlog.toml")).unwrap_err().to_string();
        let expected = std::env::current_dir().unwrap().join("no/such/shardlog.toml");
        assert!(err.starts_with(&format!("cannot read config file {}: ", expected.display())), "{err}");
    }

    #[test]
    fn toml_file_overrides_defaults_and_rejects_unknown_keys() {
        let config: ServeConfig = toml::from_str("port = 19092\n[topic]\npartitions = 6\nflush = \"never\"\n").unwrap();
        assert_eq!(config.port, 19092);
        assert_eq!(config.topic.partitions, 6);
        assert_eq!(config.topic_log_config(&Default::default()).unwrap().flush, FlushPolicy::Never);
        assert!(toml::from_str::<ServeConfig>("prot = 1").is_err());
    }

    #[test]
    fn bad_topic_configs_are_refused() {
        let config = ServeConfig::default();
        let mut overrides = std::collections::BTreeMap::new();
        overrides.insert("segment.bytes".to_string(), "12".to_string());
        assert!(config.topic_log_config(&overrides).is_err());
        overrides.clear();
        overrides.insert("no.such.key".to_string(), "1".to_string());
        assert!(config.topic_log_config(&overrides).is_err());
    }
}
