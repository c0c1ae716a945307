//! Bytes <-> types for the Kafka wire protocol: framing, primitives, record
//! batches, and one file per API. Nothing here decides anything; handlers in
//! `server::handlers` do. Every decoder checks lengths against the bytes that
//! remain before allocating (see `wire`).

pub mod error;
pub mod record_batch;
pub mod wire;

pub mod alter_configs;
pub mod alter_replica_log_dirs;
pub mod api_versions;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_cluster;
pub mod describe_configs;
pub mod describe_log_dirs;
pub mod describe_quorum;
pub mod elect_leaders;
pub mod fetch;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod list_offsets;
pub mod metadata;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod sasl;
pub mod scram_credentials;

pub mod delete_groups;
pub mod describe_groups;
pub mod find_coordinator;
pub mod heartbeat;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod offset_commit;
pub mod offset_fetch;
pub mod partition_reassignments;
pub mod sync_group;
pub mod unregister_broker;

pub use error::ErrorCode;
pub use wire::{DecodeError, DecodeResult, Reader, Writer};

/// The Kafka APIs shardlog knows, by request key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i16)]
pub enum ApiKey {
    Produce = 0,
    Fetch = 1,
    ListOffsets = 2,
    Metadata = 3,
    OffsetCommit = 8,
    OffsetFetch = 9,
    FindCoordinator = 10,
    JoinGroup = 11,
    Heartbeat = 12,
    LeaveGroup = 13,
    SyncGroup = 14,
    DescribeGroups = 15,
    ListGroups = 16,
    SaslHandshake = 17,
    ApiVersions = 18,
    CreateTopics = 19,
    DeleteTopics = 20,
    DeleteRecords = 21,
    InitProducerId = 22,
    OffsetForLeaderEpoch = 23,
    DescribeConfigs = 32,
    AlterConfigs = 33,
    AlterReplicaLogDirs = 34,
    DescribeLogDirs = 35,
    SaslAuthenticate = 36,
    CreatePartitions = 37,
    DeleteGroups = 42,
    ElectLeaders = 43,
    IncrementalAlterConfigs = 44,
    AlterPartitionReassignments = 45,
    ListPartitionReassignments = 46,
    DescribeUserScramCredentials = 50,
    AlterUserScramCredentials = 51,
    DescribeQuorum = 55,
    DescribeCluster = 60,
    UnregisterBroker = 64,
}

/// A supported API with its version range and the first version that uses
/// the flexible (compact, tagged) encoding.
#[derive(Debug, Clone, Copy)]
pub struct ApiRange {
    pub key: ApiKey,
    pub version_min: i16,
    pub version_max: i16,
    pub flexible_from: i16,
}

const fn range(key: ApiKey, version_min: i16, version_max: i16, flexible_from: i16) -> ApiRange {
    ApiRange { key, version_min, version_max, flexible_from }
}

/// What ApiVersions advertises: exactly what the handlers implement. The
/// ranges keep librdkafka ≤ 2.11 happy, which silently disables a feature when
/// its legacy versions fall outside the advertised range.
pub const SUPPORTED_APIS: &[ApiRange] = &[
    range(ApiKey::Produce, 3, 8, 9),
    range(ApiKey::Fetch, 4, 11, 12),
    range(ApiKey::ListOffsets, 1, 5, 6),
    range(ApiKey::Metadata, 0, 8, 9),
    range(ApiKey::ApiVersions, 0, 3, 3),
    range(ApiKey::CreateTopics, 2, 4, 5),
    range(ApiKey::DeleteTopics, 1, 3, 4),
    range(ApiKey::DeleteRecords, 0, 1, 2),
    range(ApiKey::InitProducerId, 0, 1, 2),
    range(ApiKey::OffsetForLeaderEpoch, 2, 3, 4),
    range(ApiKey::DescribeConfigs, 1, 3, 4),
    range(ApiKey::AlterConfigs, 0, 1, 2),
    range(ApiKey::CreatePartitions, 0, 1, 2),
    range(ApiKey::IncrementalAlterConfigs, 0, 1, 1),
    range(ApiKey::AlterReplicaLogDirs, 1, 2, 2),
    range(ApiKey::DescribeLogDirs, 1, 4, 2),
    range(ApiKey::DescribeCluster, 0, 2, 0),
    range(ApiKey::DescribeQuorum, 0, 2, 0),
    range(ApiKey::UnregisterBroker, 0, 0, 0),
    range(ApiKey::FindCoordinator, 0, 2, 3),
    range(ApiKey::JoinGroup, 0, 5, 6),
    range(ApiKey::SyncGroup, 0, 3, 4),
    range(ApiKey::Heartbeat, 0, 3, 4),
    range(ApiKey::LeaveGroup, 0, 3, 4),
    range(ApiKey::OffsetCommit, 2, 7, 8),
    range(ApiKey::OffsetFetch, 1, 5, 6),
    range(ApiKey::DescribeGroups, 0, 4, 5),
    range(ApiKey::ListGroups, 0, 2, 3),
    range(ApiKey::DeleteGroups, 0, 1, 2),
    range(ApiKey::ElectLeaders, 0, 2, 2),
    range(ApiKey::AlterPartitionReassignments, 0, 0, 0),
    range(ApiKey::ListPartitionReassignments, 0, 0, 0),
    range(ApiKey::SaslHandshake, 0, 1, 2),
    range(ApiKey::SaslAuthenticate, 0, 1, 2),
    range(ApiKey::DescribeUserScramCredentials, 0, 0, 0),
    range(ApiKey::AlterUserScramCredentials, 0, 0, 0),
];

impl ApiKey {
    pub fn from_i16(key: i16) -> Option<Self> {
        use ApiKey::*;
        Some(match key {
            0 => Produce,
            1 => Fetch,
            2 => ListOffsets,
            3 => Metadata,
            8 => OffsetCommit,
            9 => OffsetFetch,
            10 => FindCoordinator,
            11 => JoinGroup,
            12 => Heartbeat,
            13 => LeaveGroup,
            14 => SyncGroup,
            15 => DescribeGroups,
            16 => ListGroups,
            17 => SaslHandshake,
            18 => ApiVersions,
            19 => CreateTopics,
            20 => DeleteTopics,
            21 => DeleteRecords,
            22 => InitProducerId,
            23 => OffsetForLeaderEpoch,
            32 => DescribeConfigs,
            33 => AlterConfigs,
            34 => AlterReplicaLogDirs,
            35 => DescribeLogDirs,
            36 => SaslAuthenticate,
            37 => CreatePartitions,
            42 => DeleteGroups,
            43 => ElectLeaders,
            44 => IncrementalAlterConfigs,
            45 => AlterPartitionReassignments,
            46 => ListPartitionReassignments,
            50 => DescribeUserScramCredentials,
            51 => AlterUserScramCredentials,
            55 => DescribeQuorum,
            60 => DescribeCluster,
            64 => UnregisterBroker,
            _ => return None,
        })
    }

    pub fn range(self) -> Option<&'static ApiRange> {
        SUPPORTED_APIS.iter().find(|r| r.key == self)
    }
}

/// Request header, v1 or v2 (v2 adds tagged fields in flexible requests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
}

/// A header whose key and version we serve, with the flexibility resolved.
#[derive(Debug, Clone)]
pub struct Request {
    pub header: RequestHeader,
    pub api: ApiKey,
    pub flexible: bool,
}

/// What a frame's header tells us: either a request we serve, or enough to
/// answer an unsupported one.
#[derive(Debug)]
pub enum ParsedHeader {
    Supported(Request),
    /// Unknown key or out-of-range version.
    Unsupported(RequestHeader),
}

/// Reads the request header from the front of a frame.
pub fn parse_header(r: &mut Reader) -> DecodeResult<ParsedHeader> {
    let api_key = r.i16()?;
    let api_version = r.i16()?;
    let correlation_id = r.i32()?;
    let client_id = r.nullable_string()?;
    let header = RequestHeader { api_key, api_version, correlation_id, client_id };
    let Some(range) = ApiKey::from_i16(api_key).and_then(ApiKey::range) else {
        return Ok(ParsedHeader::Unsupported(header));
    };
    if api_version < range.version_min || api_version > range.version_max {
        return Ok(ParsedHeader::Unsupported(header));
    }
    let flexible = api_version >= range.flexible_from;
    if flexible {
        r.tagged_fields()?;
    }
    Ok(ParsedHeader::Supported(Request { header, api: range.key, flexible }))
}

/// Starts a response: the header, v0 or (flexible, not ApiVersions) v1.
pub fn response_writer(correlation_id: i32, api: ApiKey, flexible: bool) -> Writer {
    let mut w = Writer::new();
    w.i32(correlation_id);
    if flexible && api != ApiKey::ApiVersions {
        w.tagged_fields_v(true);
    }
    w
}

/// Decodes the body of any request we serve (fuzzing and tests): every
/// supported API at `request.header.api_version`.
pub fn decode_request_body(request: &Request, reader: &mut Reader) -> DecodeResult<()> {
    let version = request.header.api_version;
    match request.api {
        ApiKey::Produce => produce::ProduceRequest::decode(reader, version).map(drop),
        ApiKey::Fetch => fetch::FetchRequest::decode(reader, version).map(drop),
        ApiKey::ListOffsets => list_offsets::ListOffsetsRequest::decode(reader, version).map(drop),
        ApiKey::Metadata => metadata::MetadataRequest::decode(reader, version).map(drop),
        ApiKey::OffsetCommit => offset_commit::OffsetCommitRequest::decode(reader, version).map(drop),
        ApiKey::OffsetFetch => offset_fetch::OffsetFetchRequest::decode(reader, version).map(drop),
        ApiKey::FindCoordinator => find_coordinator::FindCoordinatorRequest::decode(reader, version).map(drop),
        ApiKey::JoinGroup => join_group::JoinGroupRequest::decode(reader, version).map(drop),
        ApiKey::Heartbeat => heartbeat::HeartbeatRequest::decode(reader, version).map(drop),
        ApiKey::LeaveGroup => leave_group::LeaveGroupRequest::decode(reader, version).map(drop),
        ApiKey::SyncGroup => sync_group::SyncGroupRequest::decode(reader, version).map(drop),
        ApiKey::DescribeGroups => describe_groups::DescribeGroupsRequest::decode(reader, version).map(drop),
        ApiKey::ListGroups => list_groups::ListGroupsRequest::decode(reader, version).map(drop),
        ApiKey::ApiVersions => api_versions::ApiVersionsRequest::decode(reader, version).map(drop),
        ApiKey::CreateTopics => create_topics::CreateTopicsRequest::decode(reader, version).map(drop),
        ApiKey::DeleteTopics => delete_topics::DeleteTopicsRequest::decode(reader, version).map(drop),
        ApiKey::DeleteRecords => delete_records::DeleteRecordsRequest::decode(reader, version).map(drop),
        ApiKey::InitProducerId => init_producer_id::InitProducerIdRequest::decode(reader, version).map(drop),
        ApiKey::OffsetForLeaderEpoch => {
            offset_for_leader_epoch::OffsetForLeaderEpochRequest::decode(reader, version).map(drop)
        }
        ApiKey::DescribeConfigs => describe_configs::DescribeConfigsRequest::decode(reader, version).map(drop),
        ApiKey::AlterConfigs => alter_configs::AlterConfigsRequest::decode(reader, version).map(drop),
        ApiKey::CreatePartitions => create_partitions::CreatePartitionsRequest::decode(reader, version).map(drop),
        ApiKey::DeleteGroups => delete_groups::DeleteGroupsRequest::decode(reader, version).map(drop),
        ApiKey::ElectLeaders => elect_leaders::ElectLeadersRequest::decode(reader, version).map(drop),
        ApiKey::AlterPartitionReassignments => {
            partition_reassignments::AlterPartitionReassignmentsRequest::decode(reader, version).map(drop)
        }
        ApiKey::ListPartitionReassignments => {
            partition_reassignments::ListPartitionReassignmentsRequest::decode(reader, version).map(drop)
        }
        ApiKey::IncrementalAlterConfigs => {
            incremental_alter_configs::IncrementalAlterConfigsRequest::decode(reader, version).map(drop)
        }
        ApiKey::AlterReplicaLogDirs => {
            alter_replica_log_dirs::AlterReplicaLogDirsRequest::decode(reader, version).map(drop)
        }
        ApiKey::DescribeLogDirs => describe_log_dirs::DescribeLogDirsRequest::decode(reader, version).map(drop),
        ApiKey::DescribeCluster => describe_cluster::DescribeClusterRequest::decode(reader, version).map(drop),
        ApiKey::DescribeQuorum => describe_quorum::DescribeQuorumRequest::decode(reader, version).map(drop),
        ApiKey::UnregisterBroker => unregister_broker::UnregisterBrokerRequest::decode(reader, version).map(drop),
        ApiKey::SaslHandshake => sasl::SaslHandshakeRequest::decode(reader, version).map(drop),
        ApiKey::SaslAuthenticate => sasl::SaslAuthenticateRequest::decode(reader, version).map(drop),
        ApiKey::DescribeUserScramCredentials => {
            scram_credentials::DescribeUserScramCredentialsRequest::decode(reader, version).map(drop)
        }
        ApiKey::AlterUserScramCredentials => {
            scram_credentials::AlterUserScramCredentialsRequest::decode(reader, version).map(drop)
        }
    }
}
