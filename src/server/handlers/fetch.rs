//! Fetch: reads every requested partition on its owning core; long-polls up
//! to max_wait_ms until min_bytes are available; lists every requested
//! partition in the answer; returns at least one whole batch even above the
//! byte limits.

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::future::join_all;

use super::{respond, response, Outcome};
use crate::constants::FETCH_WAIT_MS_MAX;
use crate::protocol::fetch::{FetchPartitionResponse, FetchRequest, FetchResponse, FetchTopicResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{PartitionOp, PartitionReply, Shard, ShardId};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = FetchRequest::decode(reader, version)?;
    let max_wait = Duration::from_millis(body.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let deadline = Instant::now() + max_wait;
    let image = shard.image();
    let mut remote_shards: Vec<ShardId> = body
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
        .filter_map(|(t, p)| image.partition(&t.name, p.index).map(|info| info.shard))
        .filter(|owner| *owner != shard.id)
        .collect();
    remote_shards.sort_unstable();
    remote_shards.dedup();
    let topics = loop {
        let listener = shard.data_event.listen();
        let topics = read_once(shard, &body).await;
        let total: usize = topics.iter().flat_map(|t| &t.partitions).map(FetchPartitionResponse::records_bytes).sum();
        let any_error = topics.iter().flat_map(|t| &t.partitions).any(|p| p.error != ErrorCode::None);
        let now = Instant::now();
        if total >= body.min_bytes.max(0) as usize || any_error || now >= deadline || shard.shutting_down.get() {
            break topics;
        }
        // Wake on new data here, on any other core that owns a requested
        // partition, at shutdown, or at the deadline.
        let shutdown = shard.shutdown_event.listen();
        let remote = async {
            if remote_shards.is_empty() {
                std::future::pending::<()>().await;
            }
            let waits = remote_shards.iter().map(|owner| Box::pin(shard.await_remote_data(*owner, deadline)));
            futures::future::select_all(waits).await;
        };
        let local = futures_lite::future::or(listener, shutdown);
        futures_lite::future::or(futures_lite::future::or(local, remote), async {
            glommio::timer::sleep(deadline - now).await;
        })
        .await;
    };
    let mut w = response(request);
    FetchResponse { throttle_time_ms: 0, error: Some(ErrorCode::None), session_id: 0, topics }.encode(&mut w, version);
    Ok(respond(w))
}

/// One pass over every requested partition, trimmed to the response budget.
async fn read_once(shard: &Rc<Shard>, body: &FetchRequest) -> Vec<FetchTopicResponse> {
    // Each partition reads at most an even share of the response budget: a
    // catch-up consumer asking 100 partitions for 4 MiB each within 64 MiB
    // would otherwise have the disk read 400 MiB to send 64 (the log still
    // returns at least one whole batch, so every partition progresses).
    let requested: usize = body.topics.iter().map(|t| t.partitions.len()).sum();
    let share = (body.max_bytes.max(0) as usize / requested.max(1)).max(1);
    // Partitions this core can answer at once are answered in place; the
    // rest (disk reads, other cores) run concurrently.
    let mut answers: Vec<Option<FetchPartitionResponse>> = Vec::with_capacity(requested);
    let mut reads = Vec::new();
    for topic in &body.topics {
        for partition in &topic.partitions {
            let p = *partition;
            let max_bytes = (p.partition_max_bytes.max(0) as usize).min(share);
            if let Some(answer) = shard.fetch_now(&topic.name, p.index, p.fetch_offset, max_bytes) {
                answers.push(Some(answer));
                continue;
            }
            let slot = answers.len();
            answers.push(None);
            let shard = shard.clone();
            let name = topic.name.clone();
            reads.push(async move {
                let op = PartitionOp::Fetch { offset: p.fetch_offset, max_bytes };
                let answer = match shard.partition_op(&name, p.index, op).await {
                    PartitionReply::Fetch(answer) => answer,
                    _ => FetchPartitionResponse::error(p.index, ErrorCode::UnknownServerError),
                };
                (slot, answer)
            });
        }
    }
    for (slot, answer) in join_all(reads).await {
        answers[slot] = Some(answer);
    }
    let mut answers = answers.into_iter().flatten();
    let mut budget = body.max_bytes.max(0) as usize;
    let mut first = true;
    body.topics
        .iter()
        .map(|topic| FetchTopicResponse {
            name: topic.name.clone(),
            partitions: topic
                .partitions
                .iter()
                .filter_map(|_| answers.next())
                .map(|mut answer| {
                    let mut kept = Vec::new();
                    for batch in answer.records.drain(..) {
                        if !first && batch.len() > budget {
                            break;
                        }
                        budget = budget.saturating_sub(batch.len());
                        first = false;
                        kept.push(batch);
                    }
                    answer.records = kept;
                    answer
                })
                .collect(),
        })
        .collect()
}
