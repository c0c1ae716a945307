//! DescribeConfigs: a topic's effective configs (its overrides over this
//! node's dynamic broker configs over the static broker settings) and a
//! broker's configs (a node id: every config this node runs with; the empty
//! name: the cluster-wide dynamic defaults that are set). Each entry comes
//! with its source, read-only flag, type and, when asked, its synonyms: the
//! layers beneath it (see `config::broker`).

use std::rc::Rc;

use super::alter_configs::broker_resource;
use super::{respond, response, Outcome};
use crate::cluster::controller::BrokerResource;
use crate::cluster::metadata::MetadataImage;
use crate::config::broker::{self, ConfigEntry, ConfigSource, ConfigType, Synonym};
use crate::config::TOPIC_CONFIG_KEYS;
use crate::log::LogConfig;
use crate::protocol::describe_configs::{
    DescribeConfigsRequest, DescribeConfigsResource, DescribeConfigsResourceResult, DescribeConfigsResponse,
    DescribeConfigsResult, DescribeConfigsSynonym,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DescribeConfigsRequest::decode(reader, version)?;
    let image = shard.image();
    let results = body
        .resources
        .into_iter()
        .map(|resource| {
            let described = match resource.resource_type {
                RESOURCE_TOPIC => describe_topic(shard, &image, &resource),
                RESOURCE_BROKER => describe_broker(shard, &image, &resource),
                _ => Err((ErrorCode::InvalidRequest, "only topic and broker resources are described".into())),
            };
            let (error, error_message, configs) = match described {
                Ok(entries) => (ErrorCode::None, None, entries),
                Err((error, message)) => (error, Some(message), Vec::new()),
            };
            DescribeConfigsResult {
                error,
                error_message,
                resource_type: resource.resource_type,
                resource_name: resource.resource_name,
                configs: configs
                    .into_iter()
                    .map(|entry| wire_entry(entry, body.include_synonyms, body.include_documentation))
                    .collect(),
            }
        })
        .collect();
    let mut w = response(request);
    DescribeConfigsResponse { throttle_time_ms: 0, results }.encode(&mut w, version);
    Ok(respond(w))
}

type Described = Result<Vec<ConfigEntry>, (ErrorCode, String)>;

fn wanted(resource: &DescribeConfigsResource) -> impl Fn(&str) -> bool + '_ {
    |name: &str| resource.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|k| k == name))
}

fn describe_broker(shard: &Shard, image: &MetadataImage, resource: &DescribeConfigsResource) -> Described {
    let wanted = wanted(resource);
    match broker_resource(&resource.resource_name) {
        Some(BrokerResource::Cluster) => Ok(broker::describe_cluster_defaults(&image.durable.broker_configs, &wanted)),
        Some(BrokerResource::Node(node_id)) => match image.node(node_id) {
            Some(node) => {
                let dynamic = image.dynamic_broker_configs(node_id);
                Ok(broker::describe_broker(&shard.config, node, dynamic, &wanted))
            }
            None => Err((ErrorCode::InvalidRequest, format!("no node {}", node_id.0))),
        },
        None => Err((
            ErrorCode::InvalidRequest,
            format!("broker resource name '{}' is not a node id", resource.resource_name),
        )),
    }
}

/// A topic as this node serves it: its overrides over this node's broker
/// layers.
fn describe_topic(shard: &Shard, image: &MetadataImage, resource: &DescribeConfigsResource) -> Described {
    let Some(topic) = image.topic(&resource.resource_name) else {
        return Err((ErrorCode::UnknownTopicOrPartition, "no such topic".into()));
    };
    let node_id = image.node_of_shard(shard.id).expect("a running core is a node of the image");
    let node = image.node(node_id).expect("a core's node is in the image");
    let dynamic = image.dynamic_broker_configs(node_id);
    let log = shard
        .config
        .effective_topic_log_config(dynamic, &topic.configs)
        .map_err(|err| (ErrorCode::InvalidConfig, err.to_string()))?;
    let wanted = wanted(resource);
    let entries = TOPIC_CONFIG_KEYS
        .iter()
        .filter(|key| wanted(key))
        .map(|key| {
            let mut synonyms = Vec::new();
            if let Some(value) = topic.configs.get(*key) {
                synonyms.push(Synonym { name: key.to_string(), value: value.clone(), source: ConfigSource::Topic });
            }
            synonyms.extend(broker::topic_config_layers(key, &shard.config, node, dynamic));
            let source = synonyms.first().map_or(ConfigSource::Default, |s| s.source);
            ConfigEntry {
                name: key.to_string(),
                value: match (*key, topic.configs.get(*key)) {
                    // Not a log setting: the controller reads it.
                    ("unclean.leader.election.enable", value) => value.cloned().unwrap_or_else(|| "false".into()),
                    _ => topic_value(&log, key),
                },
                source,
                read_only: false,
                config_type: topic_config_type(key),
                synonyms,
                documentation: "",
            }
        })
        .collect();
    Ok(entries)
}

fn wire_entry(
    entry: ConfigEntry,
    include_synonyms: bool,
    include_documentation: bool,
) -> DescribeConfigsResourceResult {
    let synonyms = if include_synonyms {
        entry
            .synonyms
            .into_iter()
            .map(|s| DescribeConfigsSynonym { name: s.name, value: Some(s.value), source: s.source as i8 })
            .collect()
    } else {
        Vec::new()
    };
    DescribeConfigsResourceResult {
        name: entry.name,
        value: Some(entry.value),
        read_only: entry.read_only,
        config_source: entry.source as i8,
        is_sensitive: false,
        synonyms,
        config_type: entry.config_type as i8,
        documentation: (include_documentation && !entry.documentation.is_empty())
            .then(|| entry.documentation.to_string()),
    }
}

fn topic_config_type(key: &str) -> ConfigType {
    match key {
        "retention.ms" | "retention.bytes" | "segment.ms" => ConfigType::Long,
        "segment.bytes" | "max.message.bytes" | "min.insync.replicas" => ConfigType::Int,
        "cleanup.policy" => ConfigType::List,
        "unclean.leader.election.enable" => ConfigType::Boolean,
        _ => ConfigType::String,
    }
}

fn topic_value(log: &LogConfig, key: &str) -> String {
    match key {
        "retention.ms" => log.retention_ms.to_string(),
        "retention.bytes" => log.retention_bytes.to_string(),
        "segment.bytes" => log.segment_bytes.to_string(),
        "segment.ms" => log.segment_ms.to_string(),
        "flush" => log.flush.to_string(),
        "max.message.bytes" => log.batch_bytes_max.to_string(),
        "cleanup.policy" => "delete".into(),
        "min.insync.replicas" => log.min_insync_replicas.to_string(),
        "message.timestamp.type" => "CreateTime".into(),
        _ => String::new(),
    }
}
