//! Fetch: reads every wanted partition on its owning core; long-polls up to
//! max_wait_ms until min_bytes are available; returns at least one whole
//! batch even above the byte limits. A sessionless or full request is
//! answered for every partition it lists; an incremental one (a fetch
//! session, `shard::fetch_sessions`) reads only the session's partitions
//! that may have news, and answers only those that have.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use event_listener::EventListener;
use futures::future::join_all;

use super::{respond, response, Outcome};
use crate::constants::FETCH_WAIT_MS_MAX;
use crate::protocol::fetch::{FetchPartitionResponse, FetchRequest, FetchResponse, FetchTopicResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::fetch_sessions::{Answer, FetchContext, Read, SessionRef, Wanted, FINAL_EPOCH};
use crate::shard::{PartitionOp, PartitionReply, Shard, ShardId};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = FetchRequest::decode(reader, version)?;
    if body.replica_id >= 0 {
        let answer = super::replica_fetch::answer(shard, &body).await;
        let mut w = response(request);
        answer.encode(&mut w, version);
        return Ok(respond(w));
    }
    let session = if version >= 7 {
        SessionRef { id: body.session_id, epoch: body.session_epoch }
    } else {
        SessionRef { id: 0, epoch: FINAL_EPOCH }
    };
    let (changed, forgotten) = wanted_of(&body);
    let image_version = shard.image().version;
    let begun = shard.fetch_sessions.borrow_mut().begin(session, changed, &forgotten, image_version, Instant::now());
    let (context, reads) = match begun {
        Ok(begun) => begun,
        Err(error) => {
            crate::metrics::record_error(crate::protocol::ApiKey::Fetch, error);
            let mut w = response(request);
            FetchResponse { throttle_time_ms: 0, error: Some(error), session_id: 0, topics: Vec::new() }
                .encode(&mut w, version);
            return Ok(respond(w));
        }
    };
    crate::shard::report::fetch_context(&context);
    let incremental = match context {
        FetchContext::Incremental { id } => Some(id),
        _ => None,
    };
    let (reads, answers) = read_until_ready(shard, &body, incremental, reads).await;
    let (session_id, answered) = match context {
        FetchContext::Sessionless => (0, answers.into_iter().map(|a| a.response).enumerate().collect()),
        FetchContext::Full { mark } => {
            let id = shard.fetch_sessions.borrow_mut().open(mark, &reads, &answers, Instant::now());
            (id, answers.into_iter().map(|a| a.response).enumerate().collect())
        }
        FetchContext::Incremental { id } => (id, shard.fetch_sessions.borrow_mut().news(id, &reads, answers)),
    };
    let answered = redirect_to_rack(shard, &body.rack_id, &reads, answered);
    let topics = by_topic(&reads, answered);
    for topic in &topics {
        for partition in &topic.partitions {
            crate::metrics::record_fetched(&topic.name, &partition.records);
        }
    }
    let mut w = response(request);
    FetchResponse { throttle_time_ms: 0, error: Some(ErrorCode::None), session_id, topics }.encode(&mut w, version);
    Ok(respond(w))
}

/// The request's partitions, and the ones it asks a session to forget.
fn wanted_of(body: &FetchRequest) -> (Vec<Wanted>, Vec<(Rc<str>, i32)>) {
    let mut changed = Vec::with_capacity(body.topics.iter().map(|t| t.partitions.len()).sum());
    for topic in &body.topics {
        let name: Rc<str> = topic.name.as_str().into();
        changed.extend(topic.partitions.iter().map(|&partition| Wanted { topic: name.clone(), partition }));
    }
    let mut forgotten = Vec::new();
    for topic in &body.forgotten {
        let name: Rc<str> = topic.name.as_str().into();
        forgotten.extend(topic.partitions.iter().map(|&index| (name.clone(), index)));
    }
    (changed, forgotten)
}

/// Reads until min_bytes are there, an error, the deadline or shutdown.
/// Each pass of a sessionless or full fetch reads all of `first`; a pass of
/// an incremental one (session `incremental`) reads the session's
/// partitions that changed since the last pass, and those of other cores.
/// Returns the reads and their answers, in the order of their `at`, within
/// the response's byte budget.
async fn read_until_ready(
    shard: &Rc<Shard>,
    body: &FetchRequest,
    incremental: Option<i32>,
    first: Vec<Read>,
) -> (Vec<Read>, Vec<Answer>) {
    let max_wait = Duration::from_millis(body.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let deadline = Instant::now() + max_wait;
    let Some(id) = incremental else {
        // Every pass reads every partition; the last pass is the answer.
        loop {
            let listener = shard.data_event.listen();
            let mut answers = read_once(shard, &first, body.max_bytes).await;
            let deadline_passed = Instant::now() >= deadline;
            if deadline_passed || is_ready(body, answers.iter(), shard) {
                trim_to_budget(&mut answers, body.max_bytes);
                return (first, answers);
            }
            wait_for_data(shard, listener, &remote_shards(&answers), deadline).await;
        }
    };
    let mut collected: BTreeMap<usize, (Read, Answer)> = BTreeMap::new();
    let mut pass = first;
    loop {
        let listener = shard.data_event.listen();
        let answers = read_once(shard, &pass, body.max_bytes).await;
        for (read, answer) in pass.into_iter().zip(answers) {
            collected.insert(read.at, (read, answer));
        }
        if Instant::now() >= deadline || is_ready(body, collected.values().map(|(_, a)| a), shard) {
            break;
        }
        let owners = remote_shards(collected.values().map(|(_, answer)| answer));
        wait_for_data(shard, listener, &owners, deadline).await;
        let image_version = shard.image().version;
        pass = shard.fetch_sessions.borrow_mut().changed_since_last_read(id, image_version);
        pass.extend(collected.values().filter(|(_, a)| a.remote.is_some()).map(|(read, _)| read.clone()));
        pass.sort_unstable_by_key(|read| read.at);
        pass.dedup_by_key(|read| read.at);
    }
    let (reads, mut answers): (Vec<Read>, Vec<Answer>) = collected.into_values().unzip();
    trim_to_budget(&mut answers, body.max_bytes);
    (reads, answers)
}

/// The other cores that own some of the partitions answered (a long poll
/// also waits for data there).
fn remote_shards<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> Vec<ShardId> {
    let mut owners: Vec<ShardId> = answers.into_iter().filter_map(|answer| answer.remote).collect();
    owners.sort_unstable();
    owners.dedup();
    owners
}

/// Whether a fetch can answer: min_bytes are there, a partition is in
/// error, or the broker is shutting down.
fn is_ready<'a>(body: &FetchRequest, answers: impl Iterator<Item = &'a Answer>, shard: &Shard) -> bool {
    let mut total = 0;
    for answer in answers {
        if !answer.response.error.is_ok() {
            return true;
        }
        total += answer.response.records_bytes();
    }
    total >= body.min_bytes.max(0) as usize || shard.shutting_down.get()
}

/// Waits for new data on this core (`listener`, taken before the last
/// read), on another core that owns a wanted partition, for shutdown, or
/// for the deadline.
async fn wait_for_data(shard: &Rc<Shard>, listener: EventListener, remote_shards: &[ShardId], deadline: Instant) {
    let shutdown = shard.shutdown_event.listen();
    let remote = async {
        if remote_shards.is_empty() {
            std::future::pending::<()>().await;
        }
        let waits = remote_shards.iter().map(|owner| Box::pin(shard.await_remote_data(*owner, deadline)));
        futures::future::select_all(waits).await;
    };
    let local = futures_lite::future::or(listener, shutdown);
    let wait = deadline.saturating_duration_since(Instant::now());
    futures_lite::future::or(futures_lite::future::or(local, remote), async {
        glommio::timer::sleep(wait).await;
    })
    .await;
}

/// One pass over `reads`; answers in the same order.
async fn read_once(shard: &Rc<Shard>, reads: &[Read], max_bytes: i32) -> Vec<Answer> {
    // Each partition reads at most an even share of the response budget: a
    // catch-up consumer asking 100 partitions for 4 MiB each within 64 MiB
    // would otherwise have the disk read 400 MiB to send 64 (the log still
    // returns at least one whole batch, so every partition progresses).
    let share = (max_bytes.max(0) as usize / reads.len().max(1)).max(1);
    let max_bytes_of = |read: &Read| (read.wanted.partition.partition_max_bytes.max(0) as usize).min(share);
    // Partitions this core can answer at once are answered in place; the
    // rest (disk reads, other cores) run concurrently.
    let now = shard.fetch_now_each(reads, max_bytes_of);
    let mut answers: Vec<Option<FetchPartitionResponse>> = Vec::with_capacity(reads.len());
    let mut remote = Vec::with_capacity(reads.len());
    let mut pending = Vec::new();
    for (read, (answer, is_remote)) in reads.iter().zip(now) {
        remote.push(is_remote);
        if answer.is_some() {
            answers.push(answer);
            continue;
        }
        let slot = answers.len();
        answers.push(None);
        let shard = shard.clone();
        let topic = read.wanted.topic.clone();
        let p = read.wanted.partition;
        let op = PartitionOp::Fetch { offset: p.fetch_offset, max_bytes: max_bytes_of(read) };
        pending.push(async move {
            let answer = match shard.partition_op(&topic, p.index, op).await {
                PartitionReply::Fetch(answer) => answer,
                _ => FetchPartitionResponse::error(p.index, ErrorCode::UnknownServerError),
            };
            (slot, answer)
        });
    }
    for (slot, answer) in join_all(pending).await {
        answers[slot] = Some(answer);
    }
    answers.into_iter().flatten().zip(remote).map(|(response, remote)| Answer { response, remote }).collect()
}

/// Keeps the batches that fit in the response's `max_bytes`, in order;
/// the first batch goes out even when larger.
fn trim_to_budget(answers: &mut [Answer], max_bytes: i32) {
    let mut budget = max_bytes.max(0) as usize;
    let mut first = true;
    for answer in answers {
        let records = &mut answer.response.records;
        let mut kept = 0;
        for batch in records.iter() {
            if !first && batch.len() > budget {
                break;
            }
            budget = budget.saturating_sub(batch.len());
            first = false;
            kept += 1;
        }
        records.truncate(kept);
    }
}

/// Groups answers (by index in `reads`) into the response's topics, a
/// topic listed once, where it first appears.
/// KIP-392: where a consumer in `rack` (Fetch v11) has an in-sync follower
/// in its rack, the leader's answer names it and carries no records; the
/// consumer then reads from that follower.
fn redirect_to_rack(
    shard: &Shard,
    rack: &str,
    reads: &[Read],
    mut answered: Vec<(usize, FetchPartitionResponse)>,
) -> Vec<(usize, FetchPartitionResponse)> {
    if rack.is_empty() {
        return answered;
    }
    let image = shard.image();
    for (at, answer) in &mut answered {
        let wanted = &reads[*at].wanted;
        if !answer.error.is_ok() {
            continue;
        }
        if let Some(node) = image.preferred_read_replica(&wanted.topic, wanted.partition.index, rack) {
            answer.preferred_read_replica = node.0;
            answer.records.clear();
        }
    }
    answered
}

fn by_topic(reads: &[Read], answered: Vec<(usize, FetchPartitionResponse)>) -> Vec<FetchTopicResponse> {
    let mut topics: Vec<FetchTopicResponse> = Vec::new();
    let mut slots: HashMap<&str, usize> = HashMap::new();
    let mut last: Option<(&str, usize)> = None;
    for (at, answer) in answered {
        let name: &str = &reads[at].wanted.topic;
        let slot = match last {
            Some((previous, slot)) if previous == name => slot,
            _ => *slots.entry(name).or_insert_with(|| {
                topics.push(FetchTopicResponse { name: name.to_owned(), partitions: Vec::new() });
                topics.len() - 1
            }),
        };
        last = Some((name, slot));
        topics[slot].partitions.push(answer);
    }
    topics
}
