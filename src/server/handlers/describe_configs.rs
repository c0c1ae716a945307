//! DescribeConfigs: a topic's effective configs (its overrides over the
//! broker defaults) and the broker's own settings.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::config::TOPIC_CONFIG_KEYS;
use crate::log::LogConfig;
use crate::protocol::describe_configs::{
    DescribeConfigsRequest, DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DescribeConfigsRequest::decode(reader, version)?;
    let image = shard.image();
    let results = body
        .resources
        .into_iter()
        .map(|resource| {
            let keys = resource.configuration_keys.clone();
            let wanted = |name: &str| keys.as_ref().is_none_or(|k| k.iter().any(|k| k == name));
            let mut result = DescribeConfigsResult {
                error: ErrorCode::None,
                error_message: None,
                resource_type: resource.resource_type,
                resource_name: resource.resource_name.clone(),
                configs: Vec::new(),
            };
            match resource.resource_type {
                RESOURCE_TOPIC => match image.topic(&resource.resource_name) {
                    Some(topic) => match shard.config.topic_log_config(&topic.configs) {
                        Ok(log) => {
                            for key in TOPIC_CONFIG_KEYS.iter().filter(|k| wanted(k)) {
                                let source =
                                    if topic.configs.contains_key(*key) { SOURCE_TOPIC } else { SOURCE_DEFAULT };
                                result.configs.push(entry(key, topic_value(&log, key), source, false));
                            }
                        }
                        Err(err) => {
                            result.error = ErrorCode::InvalidConfig;
                            result.error_message = Some(err.to_string());
                        }
                    },
                    None => {
                        result.error = ErrorCode::UnknownTopicOrPartition;
                        result.error_message = Some("no such topic".into());
                    }
                },
                RESOURCE_BROKER => {
                    let config = &shard.config;
                    let settings = [
                        ("num.partitions", config.topic.partitions.to_string()),
                        ("log.dirs", config.data.display().to_string()),
                        ("auto.create.topics.enable", config.auto_create_topics.to_string()),
                        ("socket.request.max.bytes", config.request_bytes_max.to_string()),
                        ("log.retention.ms", config.topic.retention_ms.to_string()),
                        ("log.segment.bytes", config.topic.segment_bytes.to_string()),
                    ];
                    for (name, value) in settings.into_iter().filter(|(n, _)| wanted(n)) {
                        result.configs.push(entry(name, value, SOURCE_STATIC_BROKER, true));
                    }
                }
                _ => {
                    result.error = ErrorCode::InvalidRequest;
                    result.error_message = Some("only topic and broker resources are described".into());
                }
            }
            result
        })
        .collect();
    let mut w = response(request);
    DescribeConfigsResponse { throttle_time_ms: 0, results }.encode(&mut w, version);
    Ok(respond(w))
}

fn entry(name: &str, value: String, source: i8, read_only: bool) -> DescribeConfigsResourceResult {
    let config_type = match name {
        "retention.ms" | "retention.bytes" | "segment.bytes" | "segment.ms" => TYPE_LONG,
        "max.message.bytes" | "min.insync.replicas" => TYPE_INT,
        "cleanup.policy" => TYPE_LIST,
        _ => TYPE_STRING,
    };
    DescribeConfigsResourceResult {
        name: name.into(),
        value: Some(value),
        read_only,
        config_source: source,
        is_sensitive: false,
        synonyms: Vec::new(),
        config_type,
        documentation: None,
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
        "min.insync.replicas" => "1".into(),
        "message.timestamp.type" => "CreateTime".into(),
        _ => String::new(),
    }
}
