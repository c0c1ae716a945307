//! Info-level log lines for notable metadata changes, written by the
//! controller (core 0) once a change is persisted: one line per topic
//! created, deleted or grown. Requests themselves are never logged at info.

use crate::cluster::metadata::PersistedMetadata;

/// Logs what differs between two persisted metadata versions.
pub fn log_topic_changes(before: &PersistedMetadata, after: &PersistedMetadata) {
    for (name, topic) in &after.topics {
        match before.topics.get(name) {
            None => tracing::info!(topic = %name, partitions = topic.partitions.len(), "topic created"),
            Some(old) if old.partitions.len() != topic.partitions.len() => tracing::info!(
                topic = %name,
                partitions_before = old.partitions.len(),
                partitions = topic.partitions.len(),
                "partitions added"
            ),
            Some(old) if old.configs != topic.configs => {
                tracing::info!(topic = %name, configs = ?topic.configs, "topic configs changed")
            }
            Some(_) => {}
        }
    }
    for (name, topic) in &before.topics {
        if !after.topics.contains_key(name) {
            tracing::info!(topic = %name, partitions = topic.partitions.len(), "topic deleted");
        }
    }
}
