//! The metadata log's records: what the controller quorum replicates (issue
//! 29), shaped like KRaft's metadata records. The controller turns each
//! admin request into a batch of records; a batch is one Raft entry, so its
//! records commit together. Every machine replays committed batches into a
//! `MetadataDelta` (see `image`), never rewriting the whole image.
//!
//! A batch on the wire and on disk:
//!
//! ```text
//! offset  size  field
//! 0       4     magic "SLMR"
//! 4       1     format version (1)
//! 5       4     crc32c of the payload
//! 9       n     payload: rkyv of Vec<MetadataRecord>
//! ```
//!
//! Integers are fixed-width; a machine id is its raw u64 here (0 is refused
//! on replay), a node id its i32, a topic id the 16 UUID bytes.

use rkyv::{Archive, Deserialize, Serialize};

/// One change to the cluster's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub enum MetadataRecord {
    /// The first record of a new cluster's log.
    ClusterCreated {
        cluster_id: String,
    },
    /// A machine (re)registers with its nodes. The offset of this record is
    /// the machine's epoch (KIP-631's broker epoch): later records about the
    /// machine name it, so a stale registration's changes are refused.
    RegisterMachine(MachineRegistration),
    /// The controller stops routing to a machine's nodes (lease expired).
    FenceMachine {
        machine: u64,
        machine_epoch: u64,
    },
    UnfenceMachine {
        machine: u64,
        machine_epoch: u64,
    },
    /// A machine leaves the cluster for good; it must lead nothing.
    UnregisterMachine {
        machine: u64,
        machine_epoch: u64,
    },
    Topic {
        name: String,
        topic_id: [u8; 16],
    },
    Partition(PartitionRecord),
    PartitionChange(PartitionChange),
    RemoveTopic {
        topic_id: [u8; 16],
    },
    /// Sets (`Some`) or deletes (`None`) one dynamic config.
    Config {
        resource: ConfigResource,
        name: String,
        value: Option<String>,
    },
    /// A block of producer ids handed to a machine: ids below
    /// `next_producer_id` are taken.
    ProducerIds {
        machine: u64,
        machine_epoch: u64,
        next_producer_id: i64,
    },
    /// A partition's move to other replicas (KIP-455) starts or is
    /// replaced (`Some`), or ends (`None`: completed or cancelled). The
    /// replica set itself changes through `PartitionChange` records in the
    /// same batch. New variants go last and stay no larger than the
    /// largest, so the logs of older versions still decode.
    Reassignment {
        topic_id: [u8; 16],
        partition: i32,
        moving: Option<Reassignment>,
    },
    /// A user's SCRAM credential for one hash is set (`Some`) or deleted
    /// (`None`): `--bootstrap-user`, AlterUserScramCredentials. Salted and
    /// hashed (RFC 5802's StoredKey and ServerKey), never the password.
    ScramCredential {
        user: String,
        /// Kafka's `ScramMechanism`: 1 SHA-256, 2 SHA-512.
        mechanism: i8,
        credential: Option<Box<StoredScram>>,
    },
}

/// A SCRAM credential as the cluster stores it (`security::scram::Credential`).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct StoredScram {
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl From<crate::security::scram::Credential> for StoredScram {
    fn from(c: crate::security::scram::Credential) -> Self {
        StoredScram { salt: c.salt, iterations: c.iterations, stored_key: c.stored_key, server_key: c.server_key }
    }
}

impl From<&StoredScram> for crate::security::scram::Credential {
    fn from(s: &StoredScram) -> Self {
        crate::security::scram::Credential {
            salt: s.salt.clone(),
            iterations: s.iterations,
            stored_key: s.stored_key.clone(),
            server_key: s.server_key.clone(),
        }
    }
}

/// A move in progress: the replicas asked for, and those the partition had
/// before it began (what a cancellation returns to).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Reassignment {
    pub target: Vec<i32>,
    pub original: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct MachineRegistration {
    pub machine: u64,
    /// Random per process start: tells a restart from a duplicate.
    pub incarnation: u64,
    pub rack: Option<String>,
    /// One Kafka node per core.
    pub nodes: Vec<NodeRegistration>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub node_id: i32,
    pub core: u32,
    pub host: String,
    pub port: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct PartitionRecord {
    pub topic_id: [u8; 16],
    pub partition: i32,
    /// Node ids, preferred leader first.
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// -1: no leader.
    pub leader: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
}

/// Changes fields of a partition; `None` leaves a field as it is. Replay
/// bumps the partition epoch always and the leader epoch when the leader
/// changes, as KRaft does.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct PartitionChange {
    pub topic_id: [u8; 16],
    pub partition: i32,
    /// `Some(-1)`: no leader.
    pub leader: Option<i32>,
    pub isr: Option<Vec<i32>>,
    pub replicas: Option<Vec<i32>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub enum ConfigResource {
    Topic(String),
    /// `None`: the cluster-wide broker defaults.
    Broker(Option<i32>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("a metadata batch of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("not a metadata batch (bad magic)")]
    Magic,
    #[error("metadata batch format {0} is not known")]
    Version(u8),
    #[error("metadata batch checksum mismatch")]
    Checksum,
    #[error("metadata batch does not decode: {0}")]
    Decode(String),
}

const MAGIC: &[u8; 4] = b"SLMR";
/// `size_of::<ArchivedMetadataRecord>()` since format version 1.
#[cfg(test)]
const ARCHIVED_RECORD_BYTES: usize = 56;
const FORMAT_VERSION: u8 = 1;
const HEADER_BYTES: usize = MAGIC.len() + 1 + 4;

/// Encodes a batch of records (one Raft entry's data).
pub fn encode_batch(records: &[MetadataRecord]) -> Vec<u8> {
    let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&records.to_vec()).expect("records always serialize");
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Decodes a batch, checking its header and checksum first.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<MetadataRecord>, RecordError> {
    if bytes.len() < HEADER_BYTES {
        return Err(RecordError::Short(bytes.len()));
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        return Err(RecordError::Magic);
    }
    let version = bytes[MAGIC.len()];
    if version != FORMAT_VERSION {
        return Err(RecordError::Version(version));
    }
    let crc_at = MAGIC.len() + 1;
    let crc = u32::from_le_bytes([bytes[crc_at], bytes[crc_at + 1], bytes[crc_at + 2], bytes[crc_at + 3]]);
    let payload = &bytes[HEADER_BYTES..];
    if crc32c::crc32c(payload) != crc {
        return Err(RecordError::Checksum);
    }
    let mut aligned = rkyv::util::AlignedVec::<16>::new();
    aligned.extend_from_slice(payload);
    rkyv::from_bytes::<Vec<MetadataRecord>, rkyv::rancor::Error>(&aligned)
        .map_err(|e| RecordError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archived_record_keeps_the_size_older_logs_were_written_with() {
        // Older logs hold records at this stride: a larger new variant
        // would make every batch written before it undecodable.
        assert_eq!(std::mem::size_of::<ArchivedMetadataRecord>(), ARCHIVED_RECORD_BYTES);
    }

    fn sample() -> Vec<MetadataRecord> {
        vec![
            MetadataRecord::ClusterCreated { cluster_id: "c".into() },
            MetadataRecord::RegisterMachine(MachineRegistration {
                machine: 7,
                incarnation: 99,
                rack: Some("r1".into()),
                nodes: vec![NodeRegistration { node_id: 70, core: 0, host: "10.0.0.7".into(), port: 9092 }],
            }),
            MetadataRecord::Topic { name: "t".into(), topic_id: [1; 16] },
            MetadataRecord::Partition(PartitionRecord {
                topic_id: [1; 16],
                partition: 0,
                replicas: vec![70],
                isr: vec![70],
                leader: 70,
                leader_epoch: 0,
                partition_epoch: 0,
            }),
            MetadataRecord::PartitionChange(PartitionChange {
                topic_id: [1; 16],
                partition: 0,
                leader: Some(-1),
                isr: None,
                replicas: None,
            }),
            MetadataRecord::Config {
                resource: ConfigResource::Broker(None),
                name: "log.retention.ms".into(),
                value: Some("1".into()),
            },
            MetadataRecord::ProducerIds { machine: 7, machine_epoch: 2, next_producer_id: 2000 },
            MetadataRecord::ScramCredential {
                user: "alice".into(),
                mechanism: 2,
                credential: Some(Box::new(StoredScram {
                    salt: vec![1; 32],
                    iterations: 4096,
                    stored_key: vec![2; 64],
                    server_key: vec![3; 64],
                })),
            },
            MetadataRecord::ScramCredential { user: "alice".into(), mechanism: 1, credential: None },
        ]
    }

    #[test]
    fn a_batch_round_trips() {
        assert_eq!(decode_batch(&encode_batch(&sample())).unwrap(), sample());
    }

    #[test]
    fn a_damaged_batch_is_an_error_not_a_panic() {
        let good = encode_batch(&sample());
        for len in 0..HEADER_BYTES {
            assert_eq!(decode_batch(&good[..len]), Err(RecordError::Short(len)));
        }
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            assert!(decode_batch(&bad).is_err(), "a flipped bit at byte {at} went unnoticed");
        }
        assert!(decode_batch(&good[..good.len() - 1]).is_err());
    }
}
