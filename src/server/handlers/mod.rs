//! Request dispatch: a flat match on the API key, one handler file per API.
//! Handlers decide; codecs in `protocol` parse and encode.

mod alter_configs;
mod api_versions;
mod create_partitions;
mod create_topics;
mod delete_records;
mod delete_topics;
mod describe_cluster;
mod describe_configs;
mod describe_quorum;
mod elect_leaders;
mod fetch;
mod find_coordinator;
mod groups;
mod init_producer_id;
mod list_offsets;
mod log_dirs;
mod metadata;
mod offset_for_leader_epoch;
mod produce;
mod reassignments;
mod replica_fetch;
mod scram_credentials;
mod unregister_broker;

use std::rc::Rc;

use bytes::{Bytes, BytesMut};

use crate::protocol::{self, ApiKey, ParsedHeader, Reader, Request, Writer};
use crate::shard::Shard;

/// What the connection does after a request.
pub enum Outcome {
    Respond(Vec<Bytes>),
    /// acks=0 produce: nothing goes back.
    NoResponse,
    /// The request could not be parsed: Kafka closes the connection.
    Close(String),
    /// Answer, then close (a refused SASL handshake or authentication).
    RespondAndClose(Vec<Bytes>, String),
}

/// Handles one frame (header and body).
pub async fn handle(shard: &Rc<Shard>, frame: BytesMut, peer: &str) -> Outcome {
    let mut reader = Reader::from_frame(frame);
    let request = match protocol::parse_header(&mut reader) {
        Ok(ParsedHeader::Supported(request)) => request,
        Ok(ParsedHeader::Unsupported(header)) if header.api_key == ApiKey::ApiVersions as i16 => {
            return api_versions::unsupported_version(header.correlation_id);
        }
        Ok(ParsedHeader::Unsupported(header)) => {
            return Outcome::Close(format!("unsupported api {} version {}", header.api_key, header.api_version));
        }
        Err(err) => return Outcome::Close(format!("bad request header: {err}")),
    };
    let version = request.header.api_version;
    let timer = crate::metrics::RequestTimer::start(request.api);
    let result = match request.api {
        ApiKey::ApiVersions => api_versions::handle(&request, &mut reader),
        ApiKey::Metadata => metadata::handle(shard, &request, &mut reader).await,
        ApiKey::Produce => produce::handle(shard, &request, &mut reader).await,
        ApiKey::Fetch => fetch::handle(shard, &request, &mut reader).await,
        ApiKey::ListOffsets => list_offsets::handle(shard, &request, &mut reader).await,
        ApiKey::CreateTopics => create_topics::handle(shard, &request, &mut reader).await,
        ApiKey::DeleteTopics => delete_topics::handle(shard, &request, &mut reader).await,
        ApiKey::CreatePartitions => create_partitions::handle(shard, &request, &mut reader).await,
        ApiKey::DeleteRecords => delete_records::handle(shard, &request, &mut reader).await,
        ApiKey::DescribeConfigs => describe_configs::handle(shard, &request, &mut reader).await,
        ApiKey::AlterConfigs => alter_configs::handle(shard, &request, &mut reader).await,
        ApiKey::IncrementalAlterConfigs => alter_configs::handle_incremental(shard, &request, &mut reader).await,
        ApiKey::InitProducerId => init_producer_id::handle(shard, &request, &mut reader).await,
        ApiKey::OffsetForLeaderEpoch => offset_for_leader_epoch::handle(shard, &request, &mut reader).await,
        ApiKey::FindCoordinator => find_coordinator::handle(shard, &request, &mut reader).await,
        ApiKey::JoinGroup => groups::join(shard, &request, &mut reader, peer).await,
        ApiKey::SyncGroup => groups::sync(shard, &request, &mut reader).await,
        ApiKey::Heartbeat => groups::heartbeat(shard, &request, &mut reader).await,
        ApiKey::LeaveGroup => groups::leave(shard, &request, &mut reader).await,
        ApiKey::OffsetCommit => groups::offset_commit(shard, &request, &mut reader).await,
        ApiKey::OffsetFetch => groups::offset_fetch(shard, &request, &mut reader).await,
        ApiKey::DescribeGroups => groups::describe(shard, &request, &mut reader).await,
        ApiKey::ListGroups => groups::list(shard, &request, &mut reader).await,
        ApiKey::DeleteGroups => groups::delete(shard, &request, &mut reader).await,
        ApiKey::ElectLeaders => elect_leaders::handle(shard, &request, &mut reader).await,
        ApiKey::AlterPartitionReassignments => reassignments::alter(shard, &request, &mut reader).await,
        ApiKey::ListPartitionReassignments => reassignments::list(shard, &request, &mut reader),
        ApiKey::DescribeCluster => describe_cluster::handle(shard, &request, &mut reader).await,
        ApiKey::DescribeQuorum => describe_quorum::handle(shard, &request, &mut reader).await,
        ApiKey::UnregisterBroker => unregister_broker::handle(shard, &request, &mut reader).await,
        ApiKey::SaslHandshake | ApiKey::SaslAuthenticate => out_of_turn_sasl(&request, &mut reader),
        ApiKey::DescribeUserScramCredentials => scram_credentials::describe(shard, &request, &mut reader).await,
        ApiKey::AlterUserScramCredentials => scram_credentials::alter(shard, &request, &mut reader).await,
        ApiKey::DescribeLogDirs => log_dirs::describe(shard, &request, &mut reader).await,
        ApiKey::AlterReplicaLogDirs => log_dirs::alter(shard, &request, &mut reader).await,
    };
    timer.finish(result.is_ok());
    match result {
        Ok(outcome) => outcome,
        Err(err) => Outcome::Close(format!("bad {:?} v{version} request: {err}", request.api)),
    }
}

/// SaslHandshake or SaslAuthenticate on a connection that is not
/// authenticating: a PLAINTEXT listener, or one already authenticated
/// (shardlog's sessions do not expire, so there is no re-authentication).
/// ILLEGAL_SASL_STATE, as Kafka answers.
fn out_of_turn_sasl(request: &Request, reader: &mut Reader) -> protocol::DecodeResult<Outcome> {
    use protocol::sasl::*;
    let version = request.header.api_version;
    let mut w = response(request);
    let error = protocol::ErrorCode::IllegalSaslState;
    if request.api == ApiKey::SaslHandshake {
        SaslHandshakeRequest::decode(reader, version)?;
        SaslHandshakeResponse { error, mechanisms: Vec::new() }.encode(&mut w, version);
    } else {
        SaslAuthenticateRequest::decode(reader, version)?;
        let error_message = Some("SaslAuthenticate on a connection that is not authenticating".to_string());
        SaslAuthenticateResponse { error, error_message, auth_bytes: Bytes::new(), session_lifetime_ms: 0 }
            .encode(&mut w, version);
    }
    Ok(respond(w))
}

/// Starts a response with the header for `request`.
pub fn response(request: &Request) -> Writer {
    protocol::response_writer(request.header.correlation_id, request.api, request.flexible)
}

pub fn respond(writer: Writer) -> Outcome {
    Outcome::Respond(writer.into_chunks())
}
