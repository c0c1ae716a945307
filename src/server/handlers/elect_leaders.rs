//! ElectLeaders (KIP-460): preferred or unclean elections, decided by the
//! controller (`cluster::control::elect_leaders`) and answered per
//! partition once committed.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::bridge::{self, Answer};
use crate::protocol::elect_leaders::{ElectLeadersRequest, ElectLeadersResponse, PartitionResult, UNCLEAN};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = ElectLeadersRequest::decode(reader, version)?;
    let asked = bridge::Request::ElectLeaders {
        unclean: body.election_type == UNCLEAN,
        partitions: body.topic_partitions.clone(),
    };
    let (error, items) = match shard.controller() {
        Some((handle, _)) => match bridge::request(handle, &asked).await {
            Ok(Answer::Items(items)) => (ErrorCode::None, items),
            Ok(_) => (ErrorCode::UnknownServerError, Vec::new()),
            Err(err) => (bridge::failed_items(&[String::new()], &err)[0].error, Vec::new()),
        },
        None => (ErrorCode::NotController, Vec::new()),
    };
    let mut results: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    for (name, code, message) in items {
        let Some((topic, partition)) = name.rsplit_once('/') else { continue };
        let Ok(partition) = partition.parse() else { continue };
        let error = crate::protocol::error::from_code(code);
        results.entry(topic.to_string()).or_default().push(PartitionResult { partition, error, message });
    }
    // The whole request failed (no controller): every partition named says why.
    if !error.is_ok() {
        for (topic, partitions) in body.topic_partitions.iter().flatten() {
            let failed = partitions.iter().map(|p| PartitionResult { partition: *p, error, message: None });
            results.entry(topic.clone()).or_default().extend(failed);
        }
    }
    let mut w = response(request);
    ElectLeadersResponse { throttle_time_ms: 0, error, results: results.into_iter().collect() }.encode(&mut w, version);
    Ok(respond(w))
}
