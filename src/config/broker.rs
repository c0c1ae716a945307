//! Kafka's broker configs as DescribeConfigs shows them and
//! (Incremental)AlterConfigs changes them: which names shardlog answers,
//! their types, which may change at run time (Kafka's dynamic broker configs,
//! KIP-226), and how a value is layered. From the strongest layer down:
//!
//! ```text
//! topic override        (topics only)                 source 1 TOPIC_CONFIG
//! this node's dynamic   broker resource "<node id>"   source 2 DYNAMIC_BROKER_CONFIG
//! cluster-wide dynamic  broker resource ""            source 3 DYNAMIC_DEFAULT_BROKER_CONFIG
//! static                file, SHARDLOG_* or a flag    source 4 STATIC_BROKER_CONFIG
//! built-in default                                    source 5 DEFAULT_CONFIG
//! ```
//!
//! Pure functions: the controller keeps the dynamic maps in the metadata
//! image (`PersistedMetadata::broker_configs` / `node_configs`), every core
//! reads them from its copy of the image.

use std::collections::BTreeMap;

use super::ServeConfig;
use crate::cluster::metadata::NodeInfo;

/// Kafka's `ConfigSource` (DescribeConfigs v1+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum ConfigSource {
    Topic = 1,
    DynamicBroker = 2,
    DynamicDefaultBroker = 3,
    StaticBroker = 4,
    Default = 5,
}

/// Kafka's `ConfigType` (DescribeConfigs v3+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Short = 4,
    Long = 5,
    List = 7,
}

/// One config as DescribeConfigs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    pub name: String,
    pub value: String,
    pub source: ConfigSource,
    pub read_only: bool,
    pub config_type: ConfigType,
    /// Every layer that sets this config, strongest first; the first is the
    /// value in force.
    pub synonyms: Vec<Synonym>,
    pub documentation: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synonym {
    pub name: String,
    pub value: String,
    pub source: ConfigSource,
}

/// The dynamic broker configs that apply to one node.
#[derive(Debug, Clone, Copy)]
pub struct DynamicConfigs<'a> {
    pub cluster: &'a BTreeMap<String, String>,
    pub node: Option<&'a BTreeMap<String, String>>,
}

/// Why a change of dynamic broker configs is refused. All of them are
/// Kafka's INVALID_REQUEST for a broker resource: the whole resource is
/// refused, not the single key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerConfigError {
    #[error("Cannot update these configs dynamically: Set({})", .0.join(", "))]
    ReadOnly(Vec<String>),
    #[error("Unknown broker configs: Set({})", .0.join(", "))]
    Unknown(Vec<String>),
    #[error("Invalid value {value} for broker config {name}: {reason}")]
    InvalidValue { name: String, value: String, reason: String },
}

/// Every broker config DescribeConfigs lists, in Kafka's names.
pub const BROKER_CONFIG_NAMES: &[&str] = &[
    "broker.id",
    "node.id",
    "listeners",
    "advertised.listeners",
    "log.dirs",
    "num.partitions",
    "default.replication.factor",
    "min.insync.replicas",
    "log.retention.ms",
    "log.retention.bytes",
    "log.segment.bytes",
    "log.roll.ms",
    "log.cleanup.policy",
    "message.max.bytes",
    "socket.request.max.bytes",
    "auto.create.topics.enable",
    "group.min.session.timeout.ms",
    "group.max.session.timeout.ms",
    "group.initial.rebalance.delay.ms",
    "offsets.topic.num.partitions",
    "offsets.topic.replication.factor",
];

/// The broker configs of one node (`describe_broker`), with the layers that
/// set each. `wanted` filters by name.
pub fn describe_broker(
    config: &ServeConfig,
    node: &NodeInfo,
    dynamic: DynamicConfigs<'_>,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<ConfigEntry> {
    let defaults = ServeConfig::default();
    BROKER_CONFIG_NAMES
        .iter()
        .filter(|name| wanted(name))
        .map(|name| {
            let def = definition(name);
            let mut synonyms = Vec::new();
            if def.dynamic {
                if let Some(value) = dynamic.node.and_then(|m| m.get(*name)) {
                    synonyms.push(synonym(name, value, ConfigSource::DynamicBroker));
                }
                if let Some(value) = dynamic.cluster.get(*name) {
                    synonyms.push(synonym(name, value, ConfigSource::DynamicDefaultBroker));
                }
            }
            synonyms.extend(static_layers(name, config, &defaults, node));
            entry(name, def, synonyms)
        })
        .collect()
}

/// The cluster-wide dynamic defaults (the broker resource with the empty
/// name): only the ones that are set, as Kafka lists them.
pub fn describe_cluster_defaults(
    cluster: &BTreeMap<String, String>,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<ConfigEntry> {
    cluster
        .iter()
        .filter(|(name, _)| wanted(name))
        .map(|(name, value)| {
            let def = definition(name);
            entry(name, def, vec![synonym(name, value, ConfigSource::DynamicDefaultBroker)])
        })
        .collect()
}

/// The broker-level layers under a topic config (`retention.ms` has
/// `log.retention.ms` under it), strongest first; empty for a topic config
/// with no broker counterpart.
pub fn topic_config_layers(
    topic_key: &str,
    config: &ServeConfig,
    node: &NodeInfo,
    dynamic: DynamicConfigs<'_>,
) -> Vec<Synonym> {
    let Some(name) = broker_name_of_topic_config(topic_key) else {
        return Vec::new();
    };
    let mut layers = Vec::new();
    if definition(name).dynamic {
        if let Some(value) = dynamic.node.and_then(|m| m.get(name)) {
            layers.push(synonym(name, value, ConfigSource::DynamicBroker));
        }
        if let Some(value) = dynamic.cluster.get(name) {
            layers.push(synonym(name, value, ConfigSource::DynamicDefaultBroker));
        }
    }
    layers.extend(static_layers(name, config, &ServeConfig::default(), node));
    layers
}

/// The topic configs the dynamic broker configs set for every topic of a
/// node (`retention.ms` from `log.retention.ms`, ...): the node's over the
/// cluster's. A topic's own overrides go on top of these.
pub fn dynamic_topic_defaults(dynamic: DynamicConfigs<'_>) -> BTreeMap<String, String> {
    let mut defaults = BTreeMap::new();
    for layer in [Some(dynamic.cluster), dynamic.node].into_iter().flatten() {
        for (name, value) in layer {
            if let Some(topic_key) = topic_config_of_broker_name(name) {
                defaults.insert(topic_key.to_string(), value.clone());
            }
        }
    }
    defaults
}

/// Checks a new set of dynamic configs for one resource (a node's or the
/// cluster's): every name is a broker config that may change at run time,
/// and every value parses and lies in range.
pub fn validate_dynamic(config: &ServeConfig, configs: &BTreeMap<String, String>) -> Result<(), BrokerConfigError> {
    let unknown: Vec<String> =
        configs.keys().filter(|name| !BROKER_CONFIG_NAMES.contains(&name.as_str())).cloned().collect();
    if !unknown.is_empty() {
        return Err(BrokerConfigError::Unknown(unknown));
    }
    let read_only: Vec<String> = configs.keys().filter(|name| !definition(name).dynamic).cloned().collect();
    if !read_only.is_empty() {
        return Err(BrokerConfigError::ReadOnly(read_only));
    }
    for (name, value) in configs {
        let topic_key = topic_config_of_broker_name(name).expect("every dynamic broker config sets a topic config");
        let single = BTreeMap::from([(topic_key.to_string(), value.clone())]);
        if let Err(err) = config.topic_log_config(&single) {
            return Err(BrokerConfigError::InvalidValue {
                name: name.clone(),
                value: value.clone(),
                reason: err.to_string(),
            });
        }
    }
    Ok(())
}

/// Kafka's type and documentation of a broker config, and whether it may
/// change at run time here.
#[derive(Debug, Clone, Copy)]
pub struct Definition {
    pub config_type: ConfigType,
    pub dynamic: bool,
    pub documentation: &'static str,
}

/// The definition of a broker config; an unknown name reads as a read-only
/// string (only names from `BROKER_CONFIG_NAMES` and stored dynamic configs
/// reach here).
pub fn definition(name: &str) -> Definition {
    let (config_type, dynamic, documentation) = match name {
        "broker.id" | "node.id" => (ConfigType::Int, false, "This node's id: one Kafka node per core."),
        "listeners" => (ConfigType::String, false, "The address this node listens on."),
        "advertised.listeners" => (ConfigType::String, false, "The address clients are told to use for this node."),
        "log.dirs" => (ConfigType::String, false, "The data directory (--data)."),
        "num.partitions" => (ConfigType::Int, false, "Partitions of a topic created without a count."),
        "default.replication.factor" => (ConfigType::Int, false, "Replicas of a topic created without a factor."),
        "min.insync.replicas" => {
            (ConfigType::Int, false, "Replicas that must hold a write acknowledged with acks=all.")
        }
        "log.retention.ms" => (ConfigType::Long, true, "How long a segment is kept; -1 keeps it forever."),
        "log.retention.bytes" => (ConfigType::Long, true, "The largest size of a partition; -1 for no limit."),
        "log.segment.bytes" => (ConfigType::Int, true, "The size at which a segment is rolled."),
        "log.roll.ms" => (ConfigType::Long, true, "The age at which a segment is rolled."),
        "log.cleanup.policy" => (ConfigType::List, false, "Only delete: compaction is not offered."),
        "message.max.bytes" => (ConfigType::Int, true, "The largest record batch a topic accepts."),
        "socket.request.max.bytes" => (ConfigType::Int, false, "The largest request a connection may send."),
        "auto.create.topics.enable" => (ConfigType::Boolean, false, "Whether Metadata and Produce create topics."),
        "group.min.session.timeout.ms" => (ConfigType::Int, false, "The shortest session a group member may ask."),
        "group.max.session.timeout.ms" => (ConfigType::Int, false, "The longest session a group member may ask."),
        "group.initial.rebalance.delay.ms" => {
            (ConfigType::Int, false, "How long a new group waits for more members before its first rebalance.")
        }
        "offsets.topic.num.partitions" => {
            (ConfigType::Int, false, "Partitions of __consumer_offsets when the cluster creates it.")
        }
        "offsets.topic.replication.factor" => {
            (ConfigType::Short, false, "Replicas of __consumer_offsets when the cluster creates it.")
        }
        _ => (ConfigType::String, false, ""),
    };
    Definition { config_type, dynamic, documentation }
}

/// The topic config a dynamic broker config is the default of.
fn topic_config_of_broker_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "log.retention.ms" => "retention.ms",
        "log.retention.bytes" => "retention.bytes",
        "log.segment.bytes" => "segment.bytes",
        "log.roll.ms" => "segment.ms",
        "message.max.bytes" => "max.message.bytes",
        _ => return None,
    })
}

/// The broker config under a topic config.
fn broker_name_of_topic_config(topic_key: &str) -> Option<&'static str> {
    Some(match topic_key {
        "retention.ms" => "log.retention.ms",
        "retention.bytes" => "log.retention.bytes",
        "segment.bytes" => "log.segment.bytes",
        "segment.ms" => "log.roll.ms",
        "max.message.bytes" => "message.max.bytes",
        "min.insync.replicas" => "min.insync.replicas",
        "cleanup.policy" => "log.cleanup.policy",
        _ => return None,
    })
}

/// The static value and the built-in default: the static layer only when it
/// differs from the default (a file, variable or flag set it).
fn static_layers(name: &str, config: &ServeConfig, defaults: &ServeConfig, node: &NodeInfo) -> Vec<Synonym> {
    let configured = static_value(name, config, node);
    let default = static_value(name, defaults, node);
    let mut layers = Vec::with_capacity(2);
    if configured != default {
        layers.push(synonym(name, &configured, ConfigSource::StaticBroker));
    }
    layers.push(synonym(name, &default, ConfigSource::Default));
    layers
}

fn static_value(name: &str, config: &ServeConfig, node: &NodeInfo) -> String {
    let topic = &config.topic;
    match name {
        "broker.id" | "node.id" => node.node_id.0.to_string(),
        "listeners" => format!("PLAINTEXT://{}:{}", config.host, node.port),
        "advertised.listeners" => format!("PLAINTEXT://{}:{}", node.host, node.port),
        "log.dirs" => config.data.display().to_string(),
        "num.partitions" => topic.partitions.to_string(),
        "default.replication.factor" => topic.replication_factor.to_string(),
        "min.insync.replicas" => topic.min_insync_replicas.to_string(),
        "log.retention.ms" => topic.retention_ms.to_string(),
        "log.retention.bytes" => topic.retention_bytes.to_string(),
        "log.segment.bytes" => topic.segment_bytes.to_string(),
        "log.roll.ms" => topic.segment_ms.to_string(),
        "log.cleanup.policy" => topic.cleanup_policy.clone(),
        "message.max.bytes" => topic.max_message_bytes.to_string(),
        "socket.request.max.bytes" => config.request_bytes_max.to_string(),
        "auto.create.topics.enable" => config.auto_create_topics.to_string(),
        "group.min.session.timeout.ms" => config.group.session_timeout_ms_min.to_string(),
        "group.max.session.timeout.ms" => config.group.session_timeout_ms_max.to_string(),
        "group.initial.rebalance.delay.ms" => config.group.initial_rebalance_delay_ms.to_string(),
        "offsets.topic.num.partitions" => config.group.offsets_topic_partitions.to_string(),
        "offsets.topic.replication.factor" => config.group.offsets_topic_replication_factor.to_string(),
        _ => String::new(),
    }
}

fn synonym(name: &str, value: &str, source: ConfigSource) -> Synonym {
    Synonym { name: name.into(), value: value.into(), source }
}

fn entry(name: &str, def: Definition, synonyms: Vec<Synonym>) -> ConfigEntry {
    let strongest = synonyms.first().expect("a config has at least its default layer");
    ConfigEntry {
        name: name.into(),
        value: strongest.value.clone(),
        source: strongest.source,
        read_only: !def.dynamic,
        config_type: def.config_type,
        synonyms,
        documentation: def.documentation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::metadata::{NodeId, ShardId};

    fn node() -> NodeInfo {
        NodeInfo { node_id: NodeId(1), host: "broker.example".into(), port: 9093, shard: ShardId(1) }
    }

    fn find<'a>(entries: &'a [ConfigEntry], name: &str) -> &'a ConfigEntry {
        entries.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("{name} is listed"))
    }

    #[test]
    fn a_node_value_wins_over_the_cluster_value_which_wins_over_the_static_one() {
        let config = ServeConfig {
            topic: super::super::TopicDefaults { retention_ms: 5_000, ..Default::default() },
            ..Default::default()
        };
        let cluster = BTreeMap::from([("log.retention.ms".to_string(), "7000".to_string())]);
        let own = BTreeMap::from([("log.retention.ms".to_string(), "9000".to_string())]);
        let all = |_: &str| true;

        let entries = describe_broker(&config, &node(), DynamicConfigs { cluster: &cluster, node: Some(&own) }, &all);
        let retention = find(&entries, "log.retention.ms");
        assert_eq!((retention.value.as_str(), retention.source), ("9000", ConfigSource::DynamicBroker));
        let sources: Vec<ConfigSource> = retention.synonyms.iter().map(|s| s.source).collect();
        assert_eq!(
            sources,
            [
                ConfigSource::DynamicBroker,
                ConfigSource::DynamicDefaultBroker,
                ConfigSource::StaticBroker,
                ConfigSource::Default
            ]
        );
        assert!(!retention.read_only);

        let entries = describe_broker(&config, &node(), DynamicConfigs { cluster: &cluster, node: None }, &all);
        assert_eq!(find(&entries, "log.retention.ms").value, "7000");
        let empty = BTreeMap::new();
        let entries = describe_broker(&config, &node(), DynamicConfigs { cluster: &empty, node: None }, &all);
        let retention = find(&entries, "log.retention.ms");
        assert_eq!((retention.value.as_str(), retention.source), ("5000", ConfigSource::StaticBroker));
    }

    #[test]
    fn an_unchanged_setting_reads_as_the_default_and_static_settings_are_read_only() {
        let empty = BTreeMap::new();
        let entries =
            describe_broker(&ServeConfig::default(), &node(), DynamicConfigs { cluster: &empty, node: None }, &|_| {
                true
            });
        assert_eq!(entries.len(), BROKER_CONFIG_NAMES.len());
        let partitions = find(&entries, "num.partitions");
        assert_eq!((partitions.source, partitions.read_only), (ConfigSource::Default, true));
        assert_eq!(find(&entries, "broker.id").value, "1");
        assert_eq!(find(&entries, "advertised.listeners").value, "PLAINTEXT://broker.example:9093");
    }

    #[test]
    fn dynamic_broker_configs_become_topic_defaults_with_the_node_winning() {
        let cluster = BTreeMap::from([
            ("log.retention.ms".to_string(), "7000".to_string()),
            ("log.segment.bytes".to_string(), "1048576".to_string()),
        ]);
        let own = BTreeMap::from([("log.retention.ms".to_string(), "9000".to_string())]);
        let defaults = dynamic_topic_defaults(DynamicConfigs { cluster: &cluster, node: Some(&own) });
        assert_eq!(defaults.get("retention.ms").map(String::as_str), Some("9000"));
        assert_eq!(defaults.get("segment.bytes").map(String::as_str), Some("1048576"));
    }

    #[test]
    fn only_dynamic_known_and_valid_broker_configs_may_be_set() {
        let config = ServeConfig::default();
        let set = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert_eq!(validate_dynamic(&config, &set(&[("log.retention.ms", "60000")])), Ok(()));
        assert_eq!(
            validate_dynamic(&config, &set(&[("num.partitions", "3"), ("log.retention.ms", "1")])),
            Err(BrokerConfigError::ReadOnly(vec!["num.partitions".into()]))
        );
        assert_eq!(
            validate_dynamic(&config, &set(&[("no.such.config", "1")])),
            Err(BrokerConfigError::Unknown(vec!["no.such.config".into()]))
        );
        assert!(matches!(
            validate_dynamic(&config, &set(&[("log.segment.bytes", "10")])),
            Err(BrokerConfigError::InvalidValue { .. })
        ));
        assert!(matches!(
            validate_dynamic(&config, &set(&[("log.retention.ms", "soon")])),
            Err(BrokerConfigError::InvalidValue { .. })
        ));
    }
}
