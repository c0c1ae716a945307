//! The `shardlog` command: parse the command line, run the subcommand.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use shardlog::client::admin::Admin;
use shardlog::config::{ListenerMode, LogFormat, ServeConfig};

/// mimalloc, with freed memory kept for reuse (`keep_freed_memory`) and on
/// 4 KiB pages unless `--huge-pages true` (`configure_huge_pages`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "shardlog", version, about = "Kafka-compatible commit log, thread-per-core on io_uring")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Put this process's heap (and that of a broker `bench` spawns) on
    /// transparent huge pages: fewer TLB misses, lower tail latency; on VMs
    /// whose host backs memory lazily, a young process pays while its heap
    /// grows. See docs/deployment.md [default: false].
    #[arg(long, global = true, env = HUGE_PAGES_ENV)]
    huge_pages: Option<bool>,
    /// Client commands (topic, group, user, cluster, mirror, bench): log in
    /// to the brokers as this user (SASL), with --sasl-password
    /// [default: no SASL].
    #[arg(long, global = true, env = "SHARDLOG_SASL_USERNAME", value_name = "NAME")]
    sasl_username: Option<String>,
    /// The --sasl-username's password; prefer the environment variable.
    #[arg(long, global = true, env = "SHARDLOG_SASL_PASSWORD", hide_env_values = true, value_name = "PASSWORD")]
    sasl_password: Option<String>,
    /// The SASL mechanism of --sasl-username: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long, global = true, env = "SHARDLOG_SASL_MECHANISM", default_value = "SCRAM-SHA-512")]
    sasl_mechanism: String,
}

impl Cli {
    /// The client commands' SASL login, if one is asked for.
    fn sasl_login(&self) -> Result<Option<shardlog::security::SaslLogin>, String> {
        let (user, password) = match (&self.sasl_username, &self.sasl_password) {
            (None, None) => return Ok(None),
            (Some(user), Some(password)) => (user.clone(), password.clone()),
            _ => return Err("--sasl-username and --sasl-password go together".into()),
        };
        let mechanism = shardlog::security::Mechanism::from_name(&self.sasl_mechanism).ok_or_else(|| {
            format!("--sasl-mechanism {}: not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", self.sasl_mechanism)
        })?;
        Ok(Some(shardlog::security::SaslLogin { mechanism, user, password }))
    }
}

/// The environment variable of `--huge-pages`, which a spawned broker inherits.
const HUGE_PAGES_ENV: &str = "SHARDLOG_HUGE_PAGES";

#[derive(Subcommand)]
enum Command {
    /// Run a broker (defaults: 127.0.0.1:9092, data in ./data, every core).
    Serve(Box<ServeArgs>),
    /// Load generator: produce, consume or end-to-end against any Kafka-compatible broker, or a spawned shardlog.
    Bench(Box<shardlog::bench::args::BenchArgs>),
    /// Create, list, describe, alter and delete topics (like kafka-topics).
    Topic {
        #[command(subcommand)]
        command: TopicCommand,
    },
    /// List, describe (with lag), delete consumer groups and reset their offsets (like kafka-consumer-groups).
    Group {
        #[command(subcommand)]
        command: GroupCommand,
    },
    /// Check a history of sends and polls (JSON lines, any Kafka-compatible cluster) for lost, duplicated,
    /// inconsistent, skipped and out-of-order records, as Jepsen's Kafka workload does.
    History {
        #[command(subcommand)]
        command: HistoryCommand,
    },
    /// Copy topics from one Kafka-compatible cluster to another (MirrorMaker 2's names and records:
    /// offset syncs, checkpoints, heartbeats; translated group offsets). `mirror status` shows its progress.
    Mirror(Box<MirrorArgs>),
    /// Add, delete and list SASL/SCRAM users (AlterUserScramCredentials, DescribeUserScramCredentials).
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Show the broker's nodes (cores), their partitions and disk use.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct MirrorArgs {
    #[command(subcommand)]
    command: Option<MirrorCommand>,
    #[command(flatten)]
    run: Option<shardlog::mirror::RunArgs>,
}

#[derive(Subcommand)]
enum MirrorCommand {
    /// Lag per partition (source end, newest offset sync, target end), throughput into the target over a
    /// second, and the newest checkpoint: read from the two clusters, so it sees any mirror, running or not.
    Status {
        #[command(flatten)]
        pair: shardlog::mirror::Pair,
    },
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Reads FILE (one JSON operation per line: see src/bench/history.rs) and reports every anomaly; exits 1 on any.
    Check {
        file: PathBuf,
        /// Print the whole report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Nodes (id, host:port), cores, partitions per core and disk use: Metadata, plus the broker's /v1/status
    /// endpoint on --metrics-port of the --brokers host.
    Status {
        #[command(flatten)]
        broker: BrokerArg,
        /// The broker's --metrics-port.
        #[arg(long, env = "SHARDLOG_METRICS_PORT", default_value_t = shardlog::constants::METRICS_PORT_DEFAULT)]
        metrics_port: u16,
    },
    /// Move every replica a machine holds to the other machines (named by
    /// any of its node ids), through AlterPartitionReassignments: each to a
    /// serving machine without a replica of that partition, in the same
    /// rack where one can. Node-to-machine comes from the broker's
    /// /v1/status on --metrics-port. Then stop it and `cluster unregister` it.
    Drain {
        /// A node id of the machine.
        node: i32,
        /// Wait until every move is done (at most this many seconds; 0: do not wait).
        #[arg(long, default_value_t = 600)]
        wait: u64,
        /// The broker's --metrics-port.
        #[arg(long, env = "SHARDLOG_METRICS_PORT", default_value_t = shardlog::constants::METRICS_PORT_DEFAULT)]
        metrics_port: u16,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Remove a machine that is stopped for good, named by any of its node
    /// ids (Kafka's UnregisterBroker). Refused while it runs or still holds a
    /// replica of a partition; its node ids are never reused.
    Unregister {
        /// A node id of the machine.
        node: i32,
        #[command(flatten)]
        broker: BrokerArg,
    },
}

#[derive(Subcommand)]
enum GroupCommand {
    /// List every consumer group.
    List {
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Show a group's state, members, committed offsets and lag.
    Describe {
        group: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Delete an empty group and its committed offsets.
    Delete {
        group: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Move an empty group's committed offsets for a topic.
    ResetOffsets {
        group: String,
        #[arg(long)]
        topic: String,
        #[arg(long, conflicts_with_all = ["to_latest", "to_offset", "to_datetime"])]
        to_earliest: bool,
        #[arg(long, conflicts_with_all = ["to_offset", "to_datetime"])]
        to_latest: bool,
        #[arg(long, conflicts_with = "to_datetime")]
        to_offset: Option<i64>,
        /// Milliseconds since the Unix epoch.
        #[arg(long)]
        to_datetime: Option<i64>,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Translate a source group's committed offsets to a mirrored target (shardlog mirror, from the offset
    /// syncs on the target), exactly and never past what was copied; --apply commits them there.
    TranslateOffsets {
        group: String,
        #[command(flatten)]
        pair: shardlog::mirror::Pair,
        #[arg(long, value_enum, default_value_t = shardlog::mirror::policy::Rename::Prefix)]
        rename: shardlog::mirror::policy::Rename,
        /// Commit the translated offsets to the group on the target (it must have no active member there).
        #[arg(long)]
        apply: bool,
    },
}

/// Settings come from built-in defaults, then the TOML file (--config), then
/// SHARDLOG_* environment variables, then these flags.
#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file (keys as the long flags, with '_' for '-'; topic defaults under [topic]).
    /// Relative paths, here and in the file, are relative to the working directory.
    #[arg(long, env = "SHARDLOG_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory, locked (`.lock`) while the broker runs; a relative one is
    /// relative to the working directory [default: ./data].
    #[arg(long, env = "SHARDLOG_DATA")]
    data: Option<PathBuf>,
    /// Cores to run, one executor each; 0 = all online cores [default: 0].
    #[arg(long, env = "SHARDLOG_CORES")]
    cores: Option<usize>,
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long, env = "SHARDLOG_HOST")]
    host: Option<std::net::IpAddr>,
    /// Host name clients are told to connect to [default: the listen address].
    #[arg(long, env = "SHARDLOG_ADVERTISED_HOST")]
    advertised_host: Option<String>,
    /// Base port: core i listens on port + i in per-core mode [default: 9092].
    #[arg(long, env = "SHARDLOG_PORT")]
    port: Option<u16>,
    /// per-core: a port and node per core; shared: all cores on one port [default: per-core].
    #[arg(long, env = "SHARDLOG_LISTENER", value_enum)]
    listener: Option<ListenerMode>,
    /// Node id of core 0 when this machine first joins; core i is
    /// node-id-base + i. Later starts keep the ids the cluster gave [default: 0].
    #[arg(long, env = "SHARDLOG_NODE_ID_BASE")]
    node_id_base: Option<i32>,
    /// This machine's id in the cluster (not 0). Made at first start and kept
    /// in the data directory (machine.id); a different one is refused
    /// [default: the kept one, or a new random id].
    #[arg(long, env = "SHARDLOG_MACHINE_ID")]
    machine_id: Option<u64>,
    /// The controller quorum: ID@HOST:PORT,... (machine id @ its controller
    /// address), 1, 3 or 5 voters, the same list on every machine. A machine
    /// in the list votes; any other follows the metadata log from them
    /// [default: this machine alone, with no controller port].
    #[arg(long, env = "SHARDLOG_CONTROLLER_VOTERS")]
    controller_voters: Option<String>,
    /// TCP port this voter's controller listens on, on --host [default: the
    /// port of this machine's entry in --controller-voters].
    #[arg(long, env = "SHARDLOG_CONTROLLER_PORT")]
    controller_port: Option<u16>,
    /// This machine's rack (broker.rack): placement spreads a topic over racks.
    #[arg(long, env = "SHARDLOG_RACK")]
    rack: Option<String>,
    /// SASL mechanisms the Kafka ports require, from PLAIN, SCRAM-SHA-256 and
    /// SCRAM-SHA-512 (comma-separated): a client authenticates before any
    /// request but ApiVersions. Users are SCRAM credentials in the cluster's
    /// metadata; PLAIN checks its password against them [default: none, no
    /// authentication].
    #[arg(long, env = "SHARDLOG_SASL_MECHANISMS", value_name = "LIST")]
    sasl_mechanisms: Option<String>,
    /// NAME:PASSWORD of a user created at start when the cluster has no user
    /// of that name (SCRAM-SHA-256 and -512 credentials), so a new cluster
    /// has a first administrator. Prefer the environment variable to keep
    /// the password out of the process list.
    #[arg(long, env = "SHARDLOG_BOOTSTRAP_USER", value_name = "NAME:PASSWORD", hide_env_values = true)]
    bootstrap_user: Option<String>,
    /// UDP port of this machine's SWIM gossip, on --host: machines spread who
    /// is alive, and the controller fences a machine gossip declares down
    /// without waiting out its lease [default: no gossip].
    #[arg(long, env = "SHARDLOG_GOSSIP_PORT")]
    gossip_port: Option<u16>,
    /// Gossip addresses of machines to join through, HOST:PORT,...; one is
    /// enough. Without --controller-voters, the voters are learned from
    /// gossip and this machine follows them.
    #[arg(long, env = "SHARDLOG_SEEDS")]
    seeds: Option<String>,
    /// Create topics on first use by Metadata or Produce [default: true].
    #[arg(long, env = "SHARDLOG_AUTO_CREATE_TOPICS")]
    auto_create_topics: Option<bool>,
    /// Largest request frame in bytes (socket.request.max.bytes). Byte counts here
    /// take units: 100MiB, 64KiB, 1GB [default: 104857600].
    #[arg(long, env = "SHARDLOG_REQUEST_BYTES_MAX", value_parser = parse_bytes::<usize>)]
    request_bytes_max: Option<usize>,
    /// Bytes of requests in flight per core before readers wait [default: 268435456].
    #[arg(long, env = "SHARDLOG_IN_FLIGHT_BYTES_MAX", value_parser = parse_bytes::<usize>)]
    in_flight_bytes_max: Option<usize>,
    /// Memory per core for recently written batches (the tail cache that
    /// serves consumers instead of the page cache shardlog bypasses); the
    /// batch cached longest ago leaves first [default: 268435456].
    #[arg(long, env = "SHARDLOG_CACHE_BYTES_MAX", value_parser = parse_bytes::<usize>)]
    cache_bytes_max: Option<usize>,
    /// Open client connections, whole node [default: 50000].
    #[arg(long, env = "SHARDLOG_CONNECTIONS_MAX")]
    connections_max: Option<usize>,
    /// Open client connections from one IP address [default: 10000].
    #[arg(long, env = "SHARDLOG_CONNECTIONS_PER_IP_MAX")]
    connections_per_ip_max: Option<usize>,
    /// Failed SASL logins from one IP address within 10 s after which its
    /// logins are refused unchecked until those 10 s pass; 0: no limit
    /// [default: 100].
    #[arg(long, env = "SHARDLOG_SASL_LOGIN_FAILURES_MAX")]
    sasl_login_failures_max: Option<u32>,
    /// Close connections idle this long (connections.max.idle.ms) [default: 600000].
    #[arg(long, env = "SHARDLOG_IDLE_TIMEOUT_MS")]
    idle_timeout_ms: Option<u64>,
    /// Close a connection whose started request does not arrive whole within this long [default: 30000].
    #[arg(long, env = "SHARDLOG_REQUEST_READ_TIMEOUT_MS")]
    request_read_timeout_ms: Option<u64>,
    /// glommio registered I/O memory per core in bytes (mind RLIMIT_MEMLOCK) [default: 524288].
    #[arg(long, env = "SHARDLOG_IO_MEMORY_BYTES", value_parser = parse_bytes::<usize>)]
    io_memory_bytes: Option<usize>,
    /// Pin each executor to its CPU [default: true].
    #[arg(long, env = "SHARDLOG_PIN")]
    pin: Option<bool>,
    /// At a segment roll, write the new segment over the oldest segment's file when retention would delete it anyway, instead of a new file (overwriting allocated blocks is faster than allocating new ones) [default: true].
    #[arg(long, env = "SHARDLOG_SEGMENT_RECYCLING")]
    segment_recycling: Option<bool>,
    /// Log filter (tracing env-filter syntax) [default: info].
    #[arg(long, env = "SHARDLOG_LOG_LEVEL")]
    log_level: Option<String>,
    /// Log line format on stderr: text, or json (one object per line) [default: text].
    #[arg(long, env = "SHARDLOG_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    /// Port of the HTTP endpoint for /metrics, /v1/health, /v1/ready and /v1/status; 0 disables it [default: 9644].
    #[arg(long, env = "SHARDLOG_METRICS_PORT")]
    metrics_port: Option<u16>,
    /// Export per-partition metrics (offsets, sizes, group lag per partition) [default: false].
    #[arg(long, env = "SHARDLOG_METRICS_PER_PARTITION")]
    metrics_per_partition: Option<bool>,
    /// A follower not caught up with its leader for this long leaves the ISR (replica.lag.time.max.ms) [default: 2500].
    #[arg(long, env = "SHARDLOG_REPLICA_LAG_TIME_MAX_MS")]
    replica_lag_time_max_ms: Option<u64>,
    /// Replicas of auto-created topics and of CreateTopics with -1, each on its own machine (default.replication.factor) [default: 1].
    #[arg(long, env = "SHARDLOG_DEFAULT_REPLICATION_FACTOR")]
    default_replication_factor: Option<i16>,
    /// Topic default min.insync.replicas: in-sync replicas an acks=all write must reach [default: 1].
    #[arg(long, env = "SHARDLOG_MIN_INSYNC_REPLICAS")]
    min_insync_replicas: Option<i32>,
    /// Partitions of auto-created topics and of CreateTopics with -1 [default: 1].
    #[arg(long, env = "SHARDLOG_DEFAULT_PARTITIONS")]
    default_partitions: Option<i32>,
    /// Topic default retention.ms, -1 = forever [default: 604800000].
    #[arg(long, env = "SHARDLOG_RETENTION_MS", allow_negative_numbers = true)]
    retention_ms: Option<i64>,
    /// Topic default retention.bytes per partition, -1 = unlimited [default: -1].
    #[arg(long, env = "SHARDLOG_RETENTION_BYTES", value_parser = parse_bytes_or_unlimited, allow_negative_numbers = true)]
    retention_bytes: Option<i64>,
    /// Topic default segment.bytes [default: 1073741824].
    #[arg(long, env = "SHARDLOG_SEGMENT_BYTES", value_parser = parse_bytes::<u64>)]
    segment_bytes: Option<u64>,
    /// Topic default segment.ms [default: 604800000].
    #[arg(long, env = "SHARDLOG_SEGMENT_MS")]
    segment_ms: Option<u64>,
    /// Topic default flush policy: always (fdatasync before acking), never, or an interval in ms [default: always].
    #[arg(long, env = "SHARDLOG_FLUSH")]
    flush: Option<String>,
    /// Topic default max.message.bytes (largest batch) [default: 1048588].
    #[arg(long, env = "SHARDLOG_MAX_MESSAGE_BYTES", value_parser = parse_bytes::<usize>)]
    max_message_bytes: Option<usize>,
    /// How long the first rebalance of an empty group waits for more members (group.initial.rebalance.delay.ms) [default: 3000].
    #[arg(long, env = "SHARDLOG_GROUP_INITIAL_REBALANCE_DELAY_MS")]
    group_initial_rebalance_delay_ms: Option<u64>,
    /// Smallest session timeout a consumer may ask for (group.min.session.timeout.ms) [default: 6000].
    #[arg(long, env = "SHARDLOG_GROUP_MIN_SESSION_TIMEOUT_MS")]
    group_min_session_timeout_ms: Option<i32>,
    /// Largest session timeout a consumer may ask for (group.max.session.timeout.ms) [default: 1800000].
    #[arg(long, env = "SHARDLOG_GROUP_MAX_SESSION_TIMEOUT_MS")]
    group_max_session_timeout_ms: Option<i32>,
    /// Partitions of __consumer_offsets, where committed offsets live, when the cluster first creates it (offsets.topic.num.partitions) [default: 16].
    #[arg(long, env = "SHARDLOG_OFFSETS_TOPIC_PARTITIONS")]
    offsets_topic_partitions: Option<i32>,
    /// Replicas of __consumer_offsets, at most the machines serving when it is created (offsets.topic.replication.factor) [default: 3].
    #[arg(long, env = "SHARDLOG_OFFSETS_TOPIC_REPLICATION_FACTOR")]
    offsets_topic_replication_factor: Option<i16>,
}

impl ServeArgs {
    fn into_config(self) -> Result<ServeConfig, String> {
        let mut config = match &self.config {
            Some(path) => ServeConfig::from_file(path).map_err(|e| e.to_string())?,
            None => ServeConfig::default(),
        };
        macro_rules! set {
            ($($field:ident => $target:expr),* $(,)?) => {
                $(if let Some(value) = self.$field { $target = value; })*
            };
        }
        set!(
            data => config.data,
            cores => config.cores,
            host => config.host,
            port => config.port,
            listener => config.listener,
            node_id_base => config.node_id_base,
            auto_create_topics => config.auto_create_topics,
            request_bytes_max => config.request_bytes_max,
            in_flight_bytes_max => config.in_flight_bytes_max,
            cache_bytes_max => config.cache_bytes_max,
            connections_max => config.connections_max,
            connections_per_ip_max => config.connections_per_ip_max,
            sasl_login_failures_max => config.sasl_login_failures_max,
            idle_timeout_ms => config.idle_timeout_ms,
            request_read_timeout_ms => config.request_read_timeout_ms,
            io_memory_bytes => config.io_memory_bytes,
            pin => config.pin,
            segment_recycling => config.segment_recycling,
            log_level => config.log_level,
            log_format => config.log_format,
            metrics_port => config.metrics_port,
            metrics_per_partition => config.metrics_per_partition,
            replica_lag_time_max_ms => config.replica_lag_time_max_ms,
            default_replication_factor => config.topic.replication_factor,
            min_insync_replicas => config.topic.min_insync_replicas,
            default_partitions => config.topic.partitions,
            retention_ms => config.topic.retention_ms,
            retention_bytes => config.topic.retention_bytes,
            segment_bytes => config.topic.segment_bytes,
            segment_ms => config.topic.segment_ms,
            flush => config.topic.flush,
            max_message_bytes => config.topic.max_message_bytes,
            group_initial_rebalance_delay_ms => config.group.initial_rebalance_delay_ms,
            group_min_session_timeout_ms => config.group.session_timeout_ms_min,
            group_max_session_timeout_ms => config.group.session_timeout_ms_max,
            offsets_topic_partitions => config.group.offsets_topic_partitions,
            offsets_topic_replication_factor => config.group.offsets_topic_replication_factor,
        );
        if self.advertised_host.is_some() {
            config.advertised_host = self.advertised_host;
        }
        if self.machine_id.is_some() {
            config.machine_id = self.machine_id;
        }
        if self.controller_voters.is_some() {
            config.controller_voters = self.controller_voters;
        }
        if self.controller_port.is_some() {
            config.controller_port = self.controller_port;
        }
        if self.rack.is_some() {
            config.rack = self.rack;
        }
        if let Some(mechanisms) = self.sasl_mechanisms {
            config.sasl_mechanisms = mechanisms;
        }
        if self.bootstrap_user.is_some() {
            config.bootstrap_user = self.bootstrap_user;
        }
        if self.gossip_port.is_some() {
            config.gossip_port = self.gossip_port;
        }
        if self.seeds.is_some() {
            config.seeds = self.seeds;
        }
        config.resolve().map_err(|e| e.to_string())
    }
}

#[derive(Subcommand)]
enum UserCommand {
    /// Adds a user, or sets its password: SCRAM credentials salted and hashed here (the broker never sees the
    /// password); PLAIN logins check against them too.
    Add {
        name: String,
        /// Prefer the environment variable: a flag shows in the process list.
        #[arg(long, env = "SHARDLOG_USER_PASSWORD", hide_env_values = true)]
        password: String,
        /// SCRAM-SHA-256, SCRAM-SHA-512, or both [default: both].
        #[arg(long)]
        mechanism: Option<String>,
        /// PBKDF2 iterations, 4096 ..= 16384.
        #[arg(long, default_value_t = 4096)]
        iterations: i32,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Deletes a user's credentials (all of them, or one --mechanism's).
    Delete {
        name: String,
        #[arg(long)]
        mechanism: Option<String>,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Lists users and their mechanisms and iterations.
    List {
        #[command(flatten)]
        broker: BrokerArg,
    },
}

#[derive(Subcommand)]
enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        /// Replicas of each partition, each on its own machine [default: the
        /// cluster's default.replication.factor].
        #[arg(long)]
        replication_factor: Option<i16>,
        /// Topic config, repeatable: --config retention.ms=60000
        #[arg(long = "config", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// List topics.
    List {
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Show partitions, leaders and configs of a topic.
    Describe {
        name: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Delete a topic and its data.
    Delete {
        name: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Move a partition to other replicas (node ids, preferred leader first),
    /// through AlterPartitionReassignments: the new replicas copy the log as
    /// followers, then the old ones are dropped. --cancel returns a moving
    /// partition to the replicas it had.
    Move {
        name: String,
        #[arg(long)]
        partition: i32,
        /// Node ids, comma-separated: --replicas 4,2,6
        #[arg(long, value_delimiter = ',', required_unless_present = "cancel")]
        replicas: Vec<i32>,
        #[arg(long, conflicts_with = "replicas")]
        cancel: bool,
        /// Wait until the move is done (at most this many seconds; 0: do not wait).
        #[arg(long, default_value_t = 600)]
        wait: u64,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Change a topic: configs (--set k=v, --delete k) or partition count.
    Alter {
        name: String,
        #[arg(long = "set", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        #[arg(long = "delete")]
        delete: Vec<String>,
        #[arg(long)]
        partitions: Option<i32>,
        #[command(flatten)]
        broker: BrokerArg,
    },
}

#[derive(Args)]
struct BrokerArg {
    /// Any broker node, host:port.
    #[arg(long, short = 'b', env = "SHARDLOG_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
}

/// A byte count: `268435456`, `256MiB`, `64KiB`, `1GB` (KiB = 1024, KB = 1000).
fn parse_bytes<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let bytes = shardlog::bench::args::parse_size(text)?;
    T::try_from(bytes).map_err(|_| format!("{text:?} is too large"))
}

/// `parse_bytes`, or -1 for no limit.
fn parse_bytes_or_unlimited(text: &str) -> Result<i64, String> {
    match text.trim() {
        "-1" => Ok(-1),
        other => parse_bytes(other),
    }
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {text}"))
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    if let Err(message) = configure_huge_pages(cli.huge_pages.unwrap_or(false)) {
        eprintln!("shardlog: {message}");
        return ExitCode::FAILURE;
    }
    match cli.sasl_login() {
        Ok(Some(login)) => shardlog::client::use_login(login),
        Ok(None) => {}
        Err(message) => {
            eprintln!("shardlog: {message}");
            return ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Topic { command } => topic(command),
        Command::Group { command } => group(command),
        Command::Cluster { command } => cluster(command),
        Command::User { command } => user(command),
        Command::Mirror(args) => match (args.command, args.run) {
            (Some(MirrorCommand::Status { pair }), _) => {
                shardlog::mirror::status(&pair.source, &pair.target, &pair.source_alias).map(|text| print!("{text}"))
            }
            (None, Some(run)) => {
                init_cli_logs();
                shardlog::mirror::run(run)
            }
            (None, None) => Err("mirror: give --source and --target (see shardlog mirror --help)".into()),
        },
        Command::History { command: HistoryCommand::Check { file, json } } => match check_history(&file, json) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(message) => Err(message),
        },
        Command::Bench(args) => match shardlog::bench::run(*args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(message) => Err(message),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("shardlog: {message}");
            ExitCode::FAILURE
        }
    }
}

/// mimalloc's option `purge_delay` (its index in the `mi_option_t` of the
/// mimalloc that libmimalloc-sys, pinned in Cargo.toml, bundles; the test
/// `the_purge_delay_option_is_the_one_set` checks it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells the allocator to keep freed memory for reuse: by default mimalloc
/// gives memory free for a second back to the kernel, and the next request
/// faults in fresh zeroed pages (e2e p99 at 274k msg/s on a 2-core VM,
/// huge pages on in both: 4.8-9.7 ms with purging, 1.4-1.5 ms without).
/// Memory stays at its high-water mark, which the in-flight and cache
/// budgets bound.
fn keep_freed_memory() {
    // SAFETY: sets an allocator option, before any other thread exists.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// Without `--huge-pages`, turns transparent huge pages off for this
/// process (mimalloc asks for them on its arenas); with it, records the
/// choice in the environment for a broker that `bench` spawns.
fn configure_huge_pages(enabled: bool) -> Result<(), String> {
    if enabled {
        // SAFETY: no other thread exists yet to read the environment.
        unsafe { std::env::set_var(HUGE_PAGES_ENV, "true") };
        return Ok(());
    }
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and changes only
    // this process's huge page policy.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        return Err(format!("cannot turn huge pages off: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let config = args.into_config()?;
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level).map_err(|e| format!("log-level: {e}"))?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => logs.with_ansi(ansi).init(),
        LogFormat::Json => logs.json().init(),
    }
    shardlog::server::serve(config).map_err(|e| e.to_string())
}

fn topic(command: TopicCommand) -> Result<(), String> {
    let fail = |e: shardlog::client::ClientError| e.to_string();
    let check = |result: shardlog::client::admin::AdminResult| -> Result<(), String> {
        if result.error.is_ok() {
            Ok(())
        } else {
            Err(format!(
                "{}: {:?}{}",
                result.name,
                result.error,
                result.message.map(|m| format!(": {m}")).unwrap_or_default()
            ))
        }
    };
    match command {
        TopicCommand::Create { name, partitions, replication_factor, configs, broker } => {
            let configs: BTreeMap<String, String> = configs.into_iter().collect();
            check(
                Admin::connect(&broker.brokers)
                    .map_err(fail)?
                    .create_topic_replicated(&name, partitions, replication_factor.unwrap_or(-1), &configs)
                    .map_err(fail)?,
            )?;
            println!("created topic {name} with {partitions} partitions");
        }
        TopicCommand::List { broker } => {
            let metadata = Admin::connect(&broker.brokers).map_err(fail)?.metadata(None).map_err(fail)?;
            for topic in metadata.topics {
                println!("{}\t{} partitions", topic.name, topic.partitions.len());
            }
        }
        TopicCommand::Describe { name, broker } => {
            let mut admin = Admin::connect(&broker.brokers).map_err(fail)?;
            let metadata = admin.metadata(Some(vec![name.clone()])).map_err(fail)?;
            let Some(topic) = metadata.topics.into_iter().next() else { return Err("empty metadata".into()) };
            if !topic.error.is_ok() {
                return Err(format!("{name}: {:?}", topic.error));
            }
            println!("topic {name}: {} partitions", topic.partitions.len());
            for p in &topic.partitions {
                let node = metadata.brokers.iter().find(|b| b.node_id == p.leader_id);
                let address = node.map(|b| format!("{}:{}", b.host, b.port)).unwrap_or_default();
                let list = |nodes: &[i32]| nodes.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
                println!(
                    "  partition {}\tleader node {}\t{}\treplicas {}\tisr {}",
                    p.index,
                    p.leader_id,
                    address,
                    list(&p.replica_nodes),
                    list(&p.isr_nodes)
                );
            }
            println!("configs:");
            for (key, value, is_override) in admin.describe_topic_configs(&name).map_err(fail)? {
                println!("  {key}={value}{}", if is_override { "" } else { "\t(default)" });
            }
        }
        TopicCommand::Delete { name, broker } => {
            check(Admin::connect(&broker.brokers).map_err(fail)?.delete_topic(&name).map_err(fail)?)?;
            println!("deleted topic {name}");
        }
        TopicCommand::Alter { name, set, delete, partitions, broker } => {
            let mut admin = Admin::connect(&broker.brokers).map_err(fail)?;
            let mut changes: Vec<(String, Option<String>)> = set.into_iter().map(|(k, v)| (k, Some(v))).collect();
            changes.extend(delete.into_iter().map(|k| (k, None)));
            if !changes.is_empty() {
                check(admin.alter_topic_configs(&name, &changes).map_err(fail)?)?;
                println!("altered configs of {name}");
            }
            if let Some(count) = partitions {
                check(admin.create_partitions(&name, count).map_err(fail)?)?;
                println!("{name} now has {count} partitions");
            }
        }
        TopicCommand::Move { name, partition, replicas, cancel, wait, broker } => {
            let mut admin = Admin::connect(&broker.brokers).map_err(fail)?;
            let target = (!cancel).then_some(replicas);
            let results = admin.alter_reassignments(&[(name.clone(), partition, target.clone())]).map_err(fail)?;
            for result in results {
                check(result)?;
            }
            match &target {
                Some(replicas) => println!("moving {name}-{partition} to {replicas:?}"),
                None => println!("cancelled the move of {name}-{partition}"),
            }
            await_moves(&mut admin, &[(name, partition)], wait)?;
        }
    }
    Ok(())
}

/// Waits up to `seconds` (0: not at all) for `moves` to finish.
fn await_moves(admin: &mut Admin, moves: &[(String, i32)], seconds: u64) -> Result<(), String> {
    if seconds == 0 || moves.is_empty() {
        return Ok(());
    }
    let left = shardlog::client::reassign::await_moves(admin, moves, std::time::Duration::from_secs(seconds))?;
    if !left.is_empty() {
        return Err(format!(
            "{} move(s) still in progress after {seconds} s, e.g. {}-{}",
            left.len(),
            left[0].0,
            left[0].1
        ));
    }
    println!("done: {} partition(s) moved", moves.len());
    Ok(())
}

/// `shardlog history check`: true when the history holds no anomaly.
fn check_history(file: &std::path::Path, json: bool) -> Result<bool, String> {
    use shardlog::bench::history;
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let ops = history::parse(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let report = history::check(&ops);
    if json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    }
    println!(
        "{} sends ({} acknowledged, {} indefinite, {} failed), {} polls{}",
        report.sends,
        report.acknowledged,
        report.indefinite,
        report.failed,
        report.polls,
        if report.drained { ", drained" } else { ", no final drain (unseen not checked)" }
    );
    let show = |name: &str, count: usize, first: String| {
        println!("{name:<14} {count}{}", if count > 0 { format!("   e.g. {first}") } else { String::new() });
    };
    show("lost", report.lost.len(), format!("{:?}", report.lost.first()));
    show("unseen", report.unseen.len(), format!("{:?}", report.unseen.first()));
    show("duplicate", report.duplicates.len(), format!("{:?}", report.duplicates.first()));
    show("inconsistent", report.inconsistent.len(), format!("{:?}", report.inconsistent.first()));
    show("non-monotonic", report.non_monotonic.len(), format!("{:?}", report.non_monotonic.first()));
    show("skipped", report.skipped.len(), format!("{:?}", report.skipped.first()));
    show("phantom", report.phantom.len(), format!("{:?}", report.phantom.first()));
    println!("{}", if report.is_valid() { "valid" } else { "INVALID" });
    Ok(report.is_valid())
}

fn group(command: GroupCommand) -> Result<(), String> {
    use shardlog::client::groups::{GroupAdmin, ResetTarget};
    let fail = |e: shardlog::client::groups::GroupAdminError| e.to_string();
    match command {
        GroupCommand::List { broker } => {
            for group in GroupAdmin::connect(&broker.brokers).map_err(fail)?.list().map_err(fail)? {
                println!("{}\t{}", group.group_id, group.protocol_type);
            }
        }
        GroupCommand::Describe { group, broker } => {
            let (described, lags) =
                GroupAdmin::connect(&broker.brokers).map_err(fail)?.describe(&group).map_err(fail)?;
            println!(
                "group {group}: state {} protocol {} {}",
                described.group_state, described.protocol_type, described.protocol_data
            );
            for member in &described.members {
                println!("  member {} client {} host {}", member.member_id, member.client_id, member.client_host);
            }
            println!("  {:<30} {:>9} {:>12} {:>12} {:>8}", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG");
            for p in lags {
                let lag = p.lag().map_or("-".to_string(), |l| l.to_string());
                println!("  {:<30} {:>9} {:>12} {:>12} {:>8}", p.topic, p.partition, p.committed, p.end, lag);
            }
        }
        GroupCommand::Delete { group, broker } => {
            GroupAdmin::connect(&broker.brokers).map_err(fail)?.delete(&group).map_err(fail)?;
            println!("deleted group {group}");
        }
        GroupCommand::ResetOffsets { group, topic, to_earliest, to_latest, to_offset, to_datetime, broker } => {
            let target = match (to_earliest, to_latest, to_offset, to_datetime) {
                (true, _, _, _) => ResetTarget::Earliest,
                (_, true, _, _) => ResetTarget::Latest,
                (_, _, Some(offset), _) => ResetTarget::Offset(offset),
                (_, _, _, Some(ms)) => ResetTarget::Timestamp(ms),
                _ => return Err("say where to: --to-earliest, --to-latest, --to-offset N or --to-datetime MS".into()),
            };
            let moved = GroupAdmin::connect(&broker.brokers)
                .map_err(fail)?
                .reset_offsets(&group, &topic, target)
                .map_err(fail)?;
            for (partition, offset) in moved {
                println!("{topic}\t{partition}\t{offset}");
            }
        }
        GroupCommand::TranslateOffsets { group, pair, rename, apply } => {
            let translated = shardlog::mirror::translate_offsets(&pair, rename, &group, apply)?;
            println!("{:<32} {:>9} {:>14} {:>14}", "TARGET TOPIC", "PARTITION", "SOURCE OFFSET", "TARGET OFFSET");
            for (topic, partition, upstream, downstream) in translated {
                println!("{topic:<32} {partition:>9} {upstream:>14} {downstream:>14}");
            }
            if apply {
                println!("committed to group {group} on {}", pair.target);
            }
        }
    }
    Ok(())
}

fn user(command: UserCommand) -> Result<(), String> {
    use shardlog::protocol::scram_credentials::{AlterUserScramCredentialsRequest, ScramUpsertion};
    use shardlog::security::scram::{random_bytes, Hash};
    let hashes = |mechanism: Option<String>| -> Result<Vec<Hash>, String> {
        match mechanism {
            None => Ok(vec![Hash::Sha256, Hash::Sha512]),
            Some(name) => Hash::from_mechanism(&name)
                .map(|h| vec![h])
                .ok_or_else(|| format!("--mechanism {name}: not SCRAM-SHA-256 or SCRAM-SHA-512")),
        }
    };
    let (broker, request) = match command {
        UserCommand::List { broker } => {
            let mut admin = Admin::connect(&broker.brokers).map_err(|e| format!("{}: {e}", broker.brokers))?;
            let answer = admin.describe_users(None).map_err(|e| format!("{}: {e}", broker.brokers))?;
            if !answer.error.is_ok() {
                return Err(format!("{:?} {}", answer.error, answer.error_message.unwrap_or_default()));
            }
            println!("{:<24} MECHANISMS", "USER");
            for user in answer.results {
                let mechanisms: Vec<String> = user
                    .credentials
                    .iter()
                    .map(|(kind, iterations)| {
                        let name = Hash::from_kafka_type(*kind).map_or("unknown", |h| h.mechanism());
                        format!("{name} ({iterations} iterations)")
                    })
                    .collect();
                println!("{:<24} {}", user.user, mechanisms.join(", "));
            }
            return Ok(());
        }
        UserCommand::Add { name, password, mechanism, iterations, broker } => {
            let upsertions = hashes(mechanism)?
                .into_iter()
                .map(|hash| {
                    let salt = random_bytes(32);
                    let salted = hash.salted_password(password.as_bytes(), &salt, iterations.max(1) as u32);
                    ScramUpsertion {
                        name: name.clone(),
                        mechanism: hash.kafka_type(),
                        iterations,
                        salt: salt.into(),
                        salted_password: salted.into(),
                    }
                })
                .collect();
            (broker, AlterUserScramCredentialsRequest { deletions: Vec::new(), upsertions })
        }
        UserCommand::Delete { name, mechanism, broker } => {
            let mut admin = Admin::connect(&broker.brokers).map_err(|e| format!("{}: {e}", broker.brokers))?;
            let kinds: Vec<i8> = match mechanism {
                Some(_) => hashes(mechanism)?.into_iter().map(Hash::kafka_type).collect(),
                None => {
                    let answer = admin.describe_users(Some(vec![name.clone()])).map_err(|e| e.to_string())?;
                    answer.results.iter().flat_map(|u| u.credentials.iter().map(|(kind, _)| *kind)).collect()
                }
            };
            if kinds.is_empty() {
                return Err(format!("user {name} has no credentials"));
            }
            (
                broker,
                AlterUserScramCredentialsRequest {
                    deletions: kinds.into_iter().map(|k| (name.clone(), k)).collect(),
                    upsertions: Vec::new(),
                },
            )
        }
    };
    let mut admin = Admin::connect(&broker.brokers).map_err(|e| format!("{}: {e}", broker.brokers))?;
    let results = admin.alter_users(&request).map_err(|e| format!("{}: {e}", broker.brokers))?;
    for (user, error, message) in results {
        if !error.is_ok() {
            return Err(format!("user {user}: {error:?} {}", message.unwrap_or_default()));
        }
        println!("user {user}: done");
    }
    Ok(())
}

fn cluster(command: ClusterCommand) -> Result<(), String> {
    match command {
        ClusterCommand::Status { broker, metrics_port } => {
            let status = shardlog::client::status::cluster_status(&broker.brokers, metrics_port)
                .map_err(|e| format!("{}: {e}", broker.brokers))?;
            print!("{status}");
        }
        ClusterCommand::Drain { node, wait, metrics_port, broker } => {
            let fail = |e: String| format!("{}: {e}", broker.brokers);
            let host =
                broker.brokers.split(',').next().unwrap_or_default().rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
            let endpoint = format!("{host}:{metrics_port}");
            let (code, body) =
                shardlog::client::status::http_get(&endpoint, "/v1/status", std::time::Duration::from_secs(10))
                    .map_err(|e| format!("{endpoint}: {e}"))?;
            if code != 200 {
                return Err(format!("{endpoint}/v1/status answered {code}"));
            }
            let status: shardlog::metrics::Status =
                serde_json::from_str(&body).map_err(|e| format!("{endpoint}/v1/status: bad JSON: {e}"))?;
            let mut admin = Admin::connect(&broker.brokers).map_err(|e| fail(e.to_string()))?;
            let metadata = admin.metadata(None).map_err(|e| fail(e.to_string()))?;
            let plan = shardlog::client::reassign::plan_drain(&status.machines, &metadata, node)?;
            let moves: Vec<(String, i32, Option<Vec<i32>>)> =
                plan.iter().map(|m| (m.topic.clone(), m.partition, Some(m.replicas.clone()))).collect();
            if !moves.is_empty() {
                for result in admin.alter_reassignments(&moves).map_err(|e| fail(e.to_string()))? {
                    if !result.error.is_ok() {
                        return Err(format!(
                            "{}: {:?}: {}",
                            result.name,
                            result.error,
                            result.message.unwrap_or_default()
                        ));
                    }
                }
            }
            for m in &plan {
                println!("moving {}-{} to {:?}", m.topic, m.partition, m.replicas);
            }
            let names: Vec<(String, i32)> = plan.iter().map(|m| (m.topic.clone(), m.partition)).collect();
            await_moves(&mut admin, &names, wait)?;
            println!("the machine of node {node} is being emptied of {} replica(s); stop it, then `shardlog cluster unregister {node}`", plan.len());
        }
        ClusterCommand::Unregister { node, broker } => {
            let mut admin = Admin::connect(&broker.brokers).map_err(|e| format!("{}: {e}", broker.brokers))?;
            let answer = admin.unregister_broker(node).map_err(|e| format!("{}: {e}", broker.brokers))?;
            if !answer.error.is_ok() {
                return Err(format!(
                    "unregister node {node}: {:?}: {}",
                    answer.error,
                    answer.error_message.unwrap_or_default()
                ));
            }
            println!("unregistered the machine of node {node}");
        }
    }
    Ok(())
}

/// Logs of a long-running client command (`mirror`) to stderr, at
/// `RUST_LOG` (default info).
fn init_cli_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(flags: &[&str]) -> Result<ServeArgs, clap::Error> {
        let cli = Cli::try_parse_from(["shardlog", "serve"].iter().chain(flags))?;
        match cli.command {
            Command::Serve(args) => Ok(*args),
            _ => unreachable!("parsed as serve"),
        }
    }

    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: reads and sets an allocator option; no other test touches it.
        let option = |value: Option<std::ffi::c_long>| unsafe {
            if let Some(value) = value {
                libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, value);
            }
            libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY)
        };
        // mimalloc's default purge delay is 1000 ms; its neighbours in the
        // option list default to 1 and 0, so a wrong index shows here.
        assert_eq!(option(None), 1000, "MI_OPTION_PURGE_DELAY names another option");
        keep_freed_memory();
        assert_eq!(option(None), -1, "purging is off");
        option(Some(1000));
    }

    #[test]
    fn huge_pages_is_a_flag_before_or_after_the_subcommand() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|cli| cli.huge_pages);
        assert_eq!(parse(&["shardlog", "serve"]).unwrap(), None);
        assert_eq!(parse(&["shardlog", "--huge-pages", "true", "serve"]).unwrap(), Some(true));
        assert_eq!(parse(&["shardlog", "serve", "--huge-pages", "false"]).unwrap(), Some(false));
        assert_eq!(parse(&["shardlog", "bench", "--huge-pages", "true", "produce"]).unwrap(), Some(true));
        assert!(parse(&["shardlog", "serve", "--huge-pages", "maybe"]).is_err());
        assert!(parse(&["shardlog", "--huge-pages", "serve"]).is_err(), "takes true or false, like --pin");
    }

    #[test]
    fn byte_counts_take_units_and_retention_takes_minus_one() {
        let args = serve_args(&[
            "--cache-bytes-max",
            "256MiB",
            "--segment-bytes",
            "64MiB",
            "--max-message-bytes",
            "1048588",
            "--in-flight-bytes-max",
            "1GB",
            "--retention-bytes",
            "-1",
            "--retention-ms",
            "-1",
        ])
        .unwrap();
        assert_eq!(args.cache_bytes_max, Some(256 << 20));
        assert_eq!(args.segment_bytes, Some(64 << 20));
        assert_eq!(args.max_message_bytes, Some(1_048_588));
        assert_eq!(args.in_flight_bytes_max, Some(1_000_000_000));
        assert_eq!(args.retention_bytes, Some(-1));
        assert_eq!(args.retention_ms, Some(-1));
        assert_eq!(serve_args(&["--retention-bytes", "10GiB"]).unwrap().retention_bytes, Some(10 << 30));
        assert!(serve_args(&["--cache-bytes-max", "12x"]).is_err(), "unknown unit");
        assert!(serve_args(&["--retention-bytes", "-2"]).is_err(), "only -1 means unlimited");
    }

    #[test]
    fn segment_recycling_is_on_unless_turned_off_and_reaches_every_topic() {
        let recycles = |flags: &[&str]| {
            let config = serve_args(flags).unwrap().into_config().unwrap();
            config.topic_log_config(&Default::default()).unwrap().recycle_segments
        };
        assert!(recycles(&[]));
        assert!(!recycles(&["--segment-recycling", "false"]));
        assert!(recycles(&["--segment-recycling", "true"]));
    }

    #[test]
    fn a_relative_data_directory_is_made_absolute_against_the_working_directory() {
        let cwd = std::env::current_dir().unwrap();
        let data = |flags: &[&str]| serve_args(flags).unwrap().into_config().unwrap().data;
        assert_eq!(data(&[]), cwd.join("data"));
        assert_eq!(data(&["--data", "some/dir"]), cwd.join("some/dir"));
        assert_eq!(data(&["--data", "/srv/shardlog"]), std::path::Path::new("/srv/shardlog"));
    }
}
