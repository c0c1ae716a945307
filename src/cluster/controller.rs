//! The types of admin requests the controller decides and their answers,
//! and the checks every decision shares (topic names, topic ids). The
//! decisions themselves are `control` (records) and `bridge` (requests).

use std::collections::BTreeMap;

use super::metadata::NodeId;
use crate::constants;
use crate::protocol::ErrorCode;

/// Validates a topic's configs (the broker supplies it; the controller
/// itself knows no config semantics).
pub type ConfigCheck<'a> = dyn Fn(&BTreeMap<String, String>) -> Result<(), String> + 'a;

/// One topic to create.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct NewTopic {
    pub name: String,
    /// -1: broker default.
    pub partitions: i32,
    /// -1 or 1 on a single node.
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
    /// Explicit placement: (partition index, node ids of its replicas).
    /// When given, `partitions` and `replication_factor` must be -1.
    pub assignments: Vec<(i32, Vec<i32>)>,
}

/// Growth of one topic (CreatePartitions).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PartitionGrowth {
    pub name: String,
    /// The new total partition count.
    pub count: i32,
    /// Explicit placement of each new partition: node ids of its replicas.
    pub assignments: Option<Vec<Vec<i32>>>,
}

/// Which dynamic broker configs an alteration changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerResource {
    /// The cluster-wide defaults (the broker resource with the empty name).
    Cluster,
    Node(NodeId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemResult {
    pub name: String,
    pub error: ErrorCode,
    pub message: Option<String>,
}

/// Checks a topic name the way Kafka does.
pub fn validate_topic_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("topic name is empty");
    }
    if name == "." || name == ".." {
        return Err("topic name cannot be . or ..");
    }
    if name.len() > constants::TOPIC_NAME_BYTES_MAX {
        return Err("topic name is longer than 249 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return Err("topic name may contain only ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// A fresh random-looking topic id (UUID v4 layout) from a seed.
pub fn topic_id(name: &str, salt: u64) -> [u8; 16] {
    let a = crc32fast::hash(name.as_bytes()) as u64;
    let mixed = [a ^ salt.rotate_left(17), salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ a.rotate_left(31)];
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&mixed[0].to_be_bytes());
    id[8..].copy_from_slice(&mixed[1].to_be_bytes());
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafkas_rules() {
        assert!(validate_topic_name("orders.v2_eu-1").is_ok());
        for bad in ["", ".", "..", "bad name", "slash/no", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topic_ids_are_uuid_v4_shaped_and_differ_by_salt() {
        let (a, b) = (topic_id("t", 1), topic_id("t", 2));
        assert_ne!(a, b);
        assert_eq!(a[6] >> 4, 4, "version 4");
        assert_eq!(a[8] >> 6, 0b10, "RFC 4122 variant");
    }
}
