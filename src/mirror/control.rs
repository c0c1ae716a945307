//! The mirror's control thread: finds the source topics to copy, creates
//! and grows their target topics (partition count and configs), hands each
//! partition to a worker from where the target's data ends (`resume`), and
//! writes MirrorMaker 2's records to the target: offset syncs, checkpoints
//! of consumer groups (and their translated offsets, for groups not active
//! on the target) and heartbeats.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flume::{Receiver, Sender};

use super::copy::{Assignment, Key, Progress, Shared, ToControl, ToFetcher};
use super::formats::{Checkpoint, Heartbeat, OffsetSync};
use super::link::{now_ms, Link, LinkError};
use super::mapping::Mapping;
use super::membership::Membership;
use super::policy::{Policy, HEARTBEATS};
use super::resume;
use super::RunArgs;
use crate::client::admin::Admin;
use crate::client::groups::GroupAdmin;
use crate::protocol::ErrorCode;

/// Configs that describe where a topic lives, not what it is: not copied.
const LOCAL_CONFIGS: &[&str] = &[
    "min.insync.replicas",
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
    "message.timestamp.type",
];
/// Offset syncs of a partition are rewritten at least this often, so
/// retention on the syncs topic never drops the newest.
const SYNC_REWRITE: Duration = Duration::from_secs(600);

pub struct Control {
    args: RunArgs,
    policy: Policy,
    source: Link,
    target: Link,
    shared: Arc<Shared>,
    workers: Vec<Sender<ToFetcher>>,
    from_workers: Receiver<ToControl>,
    /// Newest offset sync per partition, read back at start.
    syncs: HashMap<Key, (i64, i64)>,
    written_syncs: HashMap<Key, ((i64, i64), Instant)>,
    /// Partitions handed out: target topic.
    assigned: HashMap<Key, String>,
    /// Partitions that could not start (why), retried at each refresh.
    refused: HashMap<Key, String>,
    checkpoints: HashMap<(String, String, i32), (i64, i64)>,
    generation: u64,
    configs_synced: Option<Instant>,
    membership: Membership,
    /// Every source partition to mirror that the last refresh found.
    mirrorable: BTreeSet<Key>,
    /// This member's share, and the whole group's, from the last rebalance.
    mine: BTreeSet<Key>,
    dealt: BTreeSet<Key>,
}

impl Control {
    pub fn new(
        args: RunArgs,
        policy: Policy,
        shared: Arc<Shared>,
        workers: Vec<Sender<ToFetcher>>,
        from_workers: Receiver<ToControl>,
    ) -> Self {
        let client_id = args.name();
        let membership = Membership::new(&client_id, &args.target, &client_id, args.instance_id.clone());
        Self {
            membership,
            mirrorable: BTreeSet::new(),
            mine: BTreeSet::new(),
            dealt: BTreeSet::new(),
            source: Link::new(&args.source, &client_id),
            target: Link::new(&args.target, &client_id),
            args,
            policy,
            shared,
            workers,
            from_workers,
            syncs: HashMap::new(),
            written_syncs: HashMap::new(),
            assigned: HashMap::new(),
            refused: HashMap::new(),
            checkpoints: HashMap::new(),
            generation: 0,
            configs_synced: None,
        }
    }

    pub fn run(mut self) -> Result<(), String> {
        self.create_internal_topics()?;
        self.read_syncs()?;
        if !self.syncs.is_empty() {
            std::thread::sleep(resume::SETTLE);
        }
        let mut refreshed: Option<Instant> = None;
        let mut beat: Option<Instant> = None;
        let mut checkpointed: Option<Instant> = None;
        let mut reported = Instant::now();
        let mut last_records = 0;
        while !self.shared.stop.load(Ordering::Relaxed) {
            if refreshed.is_none_or(|at| at.elapsed() >= Duration::from_millis(self.args.refresh_ms)) {
                if let Err(err) = self.refresh() {
                    tracing::warn!(%err, "mirror: topic refresh failed");
                }
                refreshed = Some(Instant::now());
            }
            let rejoin = self.shared.group.lock().expect("group").rejoin;
            if rejoin || !self.mirrorable.is_subset(&self.dealt) || self.dealt.is_empty() && !self.mirrorable.is_empty()
            {
                self.rebalance();
            }
            let waiting: Vec<Key> = self.mine.iter().filter(|k| !self.assigned.contains_key(*k)).cloned().collect();
            if refreshed.is_some_and(|at| at.elapsed() < Duration::from_millis(150)) {
                for key in waiting {
                    let target_topic = self.policy.target_topic(&key.0);
                    self.start(key, &target_topic);
                }
            }
            while let Ok(message) = self.from_workers.try_recv() {
                self.handle(message);
            }
            if beat.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                self.heartbeat();
                beat = Some(Instant::now());
            }
            if let Err(err) = self.write_syncs() {
                tracing::warn!(%err, "mirror: writing offset syncs failed");
            }
            if checkpointed.is_none_or(|at| at.elapsed() >= Duration::from_millis(self.args.checkpoint_interval_ms)) {
                if let Err(err) = self.checkpoint() {
                    tracing::warn!(%err, "mirror: checkpoints failed");
                }
                checkpointed = Some(Instant::now());
            }
            if reported.elapsed() >= Duration::from_secs(self.args.report_s) {
                let records = self.shared.records.load(Ordering::Relaxed);
                let rate = (records - last_records) as f64 / reported.elapsed().as_secs_f64();
                last_records = records;
                reported = Instant::now();
                self.report(rate);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Syncs of what was acknowledged, so a restart counts little; then
        // the share goes to the others at once.
        self.take_back();
        self.membership.leave();
        Ok(())
    }

    /// Stops every partition: no new produce request, the ones under way
    /// answered, offset syncs written, workers told.
    fn take_back(&mut self) {
        self.shared.writing.store(false, Ordering::SeqCst);
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Err(err) = self.write_syncs() {
            tracing::warn!(%err, "mirror: offset syncs not written before a rebalance");
        }
        for key in self.assigned.keys() {
            let _ = self.workers[worker_of(key, self.workers.len())].send(ToFetcher::Revoke(key.clone()));
        }
        self.assigned.clear();
        self.shared.progress.lock().expect("progress").clear();
    }

    /// Gives every partition up and joins the group again for a new share.
    fn rebalance(&mut self) {
        self.take_back();
        match self.membership.join(&self.mirrorable, &self.shared.group) {
            Ok(assignment) => {
                tracing::info!(
                    mine = assignment.mine.len(),
                    all = assignment.all.len(),
                    "mirror: joined the mirror group {}",
                    self.args.name()
                );
                self.mine = assignment.mine;
                self.dealt = assignment.all;
                // Another member may have copied these partitions since:
                // its offset syncs are the newest.
                if let Err(err) = self.read_syncs() {
                    tracing::warn!(%err, "mirror: offset syncs not read back; counting from older ones");
                }
                self.shared.writing.store(true, Ordering::SeqCst);
                for key in self.mine.clone() {
                    let target_topic = self.policy.target_topic(&key.0);
                    self.start(key, &target_topic);
                }
            }
            Err(err) => {
                tracing::warn!(%err, "mirror: cannot join the mirror group; retrying");
                self.mine.clear();
                self.dealt.clear();
                self.shared.group.lock().expect("group").rejoin = true;
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }

    fn report(&self, rate: f64) {
        let progress = self.shared.progress.lock().expect("progress");
        let lag: i64 = progress.values().map(|p| p.lag().max(0)).sum();
        let latency = self.shared.latency.lock().expect("latency");
        println!(
            "mirror: {} partitions, {:.0} records/s, {} records and {} bytes copied, lag {} records, latency p50 {:.1} ms p99 {:.1} ms",
            progress.len(),
            rate,
            self.shared.records.load(Ordering::Relaxed),
            self.shared.bytes.load(Ordering::Relaxed),
            lag,
            latency.value_at_quantile(0.5) as f64 / 1000.0,
            latency.value_at_quantile(0.99) as f64 / 1000.0,
        );
    }

    fn create_internal_topics(&mut self) -> Result<(), String> {
        let mut admin =
            Admin::connect(first(&self.args.target)).map_err(|e| format!("target {}: {e}", self.args.target))?;
        let compact: BTreeMap<String, String> = [("cleanup.policy".to_string(), "compact".to_string())].into();
        for topic in [self.policy.offset_syncs_topic(), self.policy.checkpoints_topic(), HEARTBEATS.to_string()] {
            let configs = if topic == HEARTBEATS { BTreeMap::new() } else { compact.clone() };
            let mut result = admin.create_topic(&topic, 1, &configs).map_err(|e| format!("create {topic}: {e}"))?;
            if !matches!(result.error, ErrorCode::None | ErrorCode::TopicAlreadyExists) && !configs.is_empty() {
                // A target without compaction (shardlog): the mirror
                // rewrites each partition's newest sync, so retention never
                // loses it.
                result = admin.create_topic(&topic, 1, &BTreeMap::new()).map_err(|e| format!("create {topic}: {e}"))?;
            }
            if !matches!(result.error, ErrorCode::None | ErrorCode::TopicAlreadyExists) {
                return Err(format!(
                    "create {topic} on the target: {:?} {}",
                    result.error,
                    result.message.unwrap_or_default()
                ));
            }
        }
        // A new topic needs a moment to get a leader.
        for topic in [self.policy.offset_syncs_topic(), self.policy.checkpoints_topic(), HEARTBEATS.to_string()] {
            wait_for_leader(&mut self.target, &topic, 0)?;
        }
        Ok(())
    }

    /// The newest offset sync of every partition, from the target.
    fn read_syncs(&mut self) -> Result<(), String> {
        let topic = self.policy.offset_syncs_topic();
        let records = self.target.read_all(&topic, 0, 0).map_err(|e| format!("read {topic}: {e}"))?;
        for (_, key, value) in records {
            if let Ok(sync) = OffsetSync::decode(&key, &value) {
                self.syncs.insert((sync.topic, sync.partition), (sync.upstream, sync.downstream));
            }
        }
        tracing::info!(partitions = self.syncs.len(), "mirror: offset syncs read back from {topic}");
        Ok(())
    }

    /// Finds source topics, creates or grows their targets, and starts the
    /// partitions not yet copied.
    fn refresh(&mut self) -> Result<(), LinkError> {
        let metadata = self.source.metadata(None)?;
        let mut admin = Admin::connect(first(&self.args.target))?;
        let mut source_admin = Admin::connect(first(&self.args.source))?;
        let sync_configs = self.configs_synced.is_none_or(|at| at.elapsed() >= Duration::from_secs(30));
        let target_metadata = self.target.metadata(None)?;
        let mut mirrorable = BTreeSet::new();
        let target_counts: HashMap<String, i32> = target_metadata
            .topics
            .iter()
            .filter(|t| t.error.is_ok())
            .map(|t| (t.name.clone(), t.partitions.len() as i32))
            .collect();
        for topic in metadata.topics.iter().filter(|t| t.error.is_ok() && !t.is_internal) {
            if !self.policy.mirrors_topic(&topic.name) {
                continue;
            }
            let target_topic = self.policy.target_topic(&topic.name);
            let partitions = topic.partitions.len() as i32;
            let source_configs: BTreeMap<String, String> = if sync_configs || !target_counts.contains_key(&target_topic)
            {
                source_admin
                    .describe_topic_configs(&topic.name)?
                    .into_iter()
                    .filter(|(name, _, overridden)| *overridden && !LOCAL_CONFIGS.contains(&name.as_str()))
                    .map(|(name, value, _)| (name, value))
                    .collect()
            } else {
                BTreeMap::new()
            };
            match target_counts.get(&target_topic) {
                None => {
                    let mut result = admin.create_topic(&target_topic, partitions, &source_configs)?;
                    if !matches!(result.error, ErrorCode::None | ErrorCode::TopicAlreadyExists)
                        && !source_configs.is_empty()
                    {
                        tracing::warn!(topic = %target_topic, error = ?result.error, "mirror: the target refused the source's configs; creating without them");
                        result = admin.create_topic(&target_topic, partitions, &BTreeMap::new())?;
                    }
                    if !matches!(result.error, ErrorCode::None | ErrorCode::TopicAlreadyExists) {
                        tracing::warn!(topic = %target_topic, error = ?result.error, "mirror: cannot create the target topic");
                        continue;
                    }
                    tracing::info!(source = %topic.name, target = %target_topic, partitions, "mirror: created the target topic");
                }
                Some(&count) if count < partitions => {
                    let result = admin.create_partitions(&target_topic, partitions)?;
                    tracing::info!(topic = %target_topic, from = count, to = partitions, error = ?result.error, "mirror: grew the target topic");
                }
                Some(_) if sync_configs && !source_configs.is_empty() => {
                    let target_configs: BTreeMap<String, String> = admin
                        .describe_topic_configs(&target_topic)?
                        .into_iter()
                        .map(|(name, value, _)| (name, value))
                        .collect();
                    let changes: Vec<(String, Option<String>)> = source_configs
                        .iter()
                        .filter(|(name, value)| target_configs.get(*name) != Some(value))
                        .map(|(name, value)| (name.clone(), Some(value.clone())))
                        .collect();
                    if !changes.is_empty() {
                        let result = admin.alter_topic_configs(&target_topic, &changes)?;
                        tracing::info!(topic = %target_topic, changes = changes.len(), error = ?result.error, "mirror: followed the source's configs");
                    }
                }
                Some(_) => {}
            }
            for p in &topic.partitions {
                mirrorable.insert((topic.name.clone(), p.index));
            }
        }
        if sync_configs {
            self.configs_synced = Some(Instant::now());
        }
        self.mirrorable = mirrorable;
        Ok(())
    }

    /// Works out where a partition goes on and hands it to its worker.
    fn start(&mut self, key: Key, target_topic: &str) {
        if wait_for_leader(&mut self.target, target_topic, key.1).is_err() {
            return;
        }
        let sync = self.syncs.get(&key).copied();
        let answer = resume::resume(&mut self.source, &mut self.target, (&key.0, key.1), target_topic, sync);
        let (start, downstream) = match answer {
            Ok(found) => found,
            Err(err) => {
                let why = err.to_string();
                if self.refused.insert(key.clone(), why.clone()).as_ref() != Some(&why) {
                    tracing::error!(topic = %key.0, partition = key.1, %why, "mirror: partition not started");
                }
                return;
            }
        };
        self.refused.remove(&key);
        if sync.is_none() {
            // Before the first record: the sync a restart counts from.
            let first = (start - 1, downstream - 1);
            if let Err(err) = self.append_syncs(&[(key.clone(), first)]) {
                tracing::warn!(%err, "mirror: first offset sync not written; partition not started");
                return;
            }
            self.syncs.insert(key.clone(), first);
        }
        self.generation += 1;
        let generation = self.generation;
        tracing::info!(topic = %key.0, partition = key.1, start, target = %target_topic, downstream, generation, "mirror: copying");
        self.shared.progress.lock().expect("progress").insert(
            key.clone(),
            Progress {
                target_topic: target_topic.to_string(),
                generation,
                mapping: Mapping::starting(start, downstream, self.syncs.get(&key).copied()),
                source_end: -1,
                ..Progress::default()
            },
        );
        self.assigned.insert(key.clone(), target_topic.to_string());
        let worker = worker_of(&key, self.workers.len());
        let _ = self.workers[worker].send(ToFetcher::Assign(Assignment {
            key,
            target_topic: target_topic.to_string(),
            start,
            generation,
        }));
    }

    fn handle(&mut self, message: ToControl) {
        let (key, generation, why) = match message {
            ToControl::Resync { key, generation, reason } => (key, generation, reason),
            ToControl::OutOfRange { key, generation } => (
                key,
                generation,
                "the source deleted records not yet copied (retention ran ahead of the mirror)".into(),
            ),
        };
        let current =
            self.shared.progress.lock().expect("progress").get(&key).map(|p| (p.generation, p.mapping.sync()));
        let Some((current_generation, sync)) = current else { return };
        if current_generation != generation {
            return;
        }
        tracing::warn!(topic = %key.0, partition = key.1, %why, "mirror: restarting the partition from the target's data");
        if let Some(sync) = sync {
            self.syncs.insert(key.clone(), sync);
        }
        if why.starts_with("the source deleted") {
            // A gap the mirror cannot fill: go on from the source's start,
            // marked with a fresh sync at the target's end.
            self.syncs.remove(&key);
            if let Some(target_topic) = self.assigned.get(&key).cloned() {
                if let (Ok(end), Ok(start)) =
                    (self.target.list_offset(&target_topic, key.1, -1), self.source.list_offset(&key.0, key.1, -2))
                {
                    tracing::error!(topic = %key.0, partition = key.1, start, "mirror: records lost to source retention");
                    let sync = (start - 1, end - 1);
                    if self.append_syncs(&[(key.clone(), sync)]).is_ok() {
                        self.syncs.insert(key.clone(), sync);
                    }
                }
            }
        }
        if let Some(target_topic) = self.assigned.remove(&key) {
            self.start(key, &target_topic);
        }
    }

    fn heartbeat(&mut self) {
        let beat = Heartbeat {
            source_alias: self.policy.source_alias.clone(),
            target_alias: self.policy.target_alias.clone(),
            timestamp_ms: now_ms(),
        };
        if let Err(err) = self.target.append(HEARTBEATS, 0, &[(beat.key(), beat.value())]) {
            tracing::debug!(%err, "mirror: heartbeat not written");
        }
    }

    /// Writes the newest exact (source, target) pair of each partition that
    /// moved since its last sync.
    fn write_syncs(&mut self) -> Result<(), LinkError> {
        let due: Vec<(Key, (i64, i64))> = {
            let progress = self.shared.progress.lock().expect("progress");
            progress
                .iter()
                .filter_map(|(key, p)| {
                    let sync = p.mapping.sync()?;
                    let stale = match self.written_syncs.get(key) {
                        Some((written, at)) => *written != sync || at.elapsed() >= SYNC_REWRITE,
                        None => self.syncs.get(key) != Some(&sync),
                    };
                    stale.then(|| (key.clone(), sync))
                })
                .collect()
        };
        if due.is_empty() {
            return Ok(());
        }
        self.append_syncs(&due)?;
        for (key, sync) in due {
            self.syncs.insert(key.clone(), sync);
            self.written_syncs.insert(key, (sync, Instant::now()));
        }
        Ok(())
    }

    fn append_syncs(&mut self, syncs: &[(Key, (i64, i64))]) -> Result<(), LinkError> {
        let records: Vec<(Bytes, Bytes)> = syncs
            .iter()
            .map(|((topic, partition), (upstream, downstream))| {
                let sync = OffsetSync {
                    topic: topic.clone(),
                    partition: *partition,
                    upstream: *upstream,
                    downstream: *downstream,
                };
                (sync.key(), sync.value())
            })
            .collect();
        let topic = self.policy.offset_syncs_topic();
        for chunk in records.chunks(1000) {
            self.target.append(&topic, 0, chunk)?;
        }
        Ok(())
    }

    /// Translates the committed offsets of the source's groups, writes them
    /// as checkpoints, and commits them on the target for groups with no
    /// active member there.
    fn checkpoint(&mut self) -> Result<(), LinkError> {
        let mut source_groups = GroupAdmin::connect(first(&self.args.source)).map_err(other)?;
        let groups = source_groups.list().map_err(other)?;
        let mut target_groups = GroupAdmin::connect(first(&self.args.target)).map_err(other)?;
        let mut records = Vec::new();
        for group in groups {
            if !self.policy.mirrors_group(&group.group_id) {
                continue;
            }
            let (_, committed) = match source_groups.state_and_offsets(&group.group_id) {
                Ok(found) => found,
                Err(err) => {
                    tracing::debug!(group = %group.group_id, %err, "mirror: group offsets not read");
                    continue;
                }
            };
            let mut translated = Vec::new();
            {
                let progress = self.shared.progress.lock().expect("progress");
                for (topic, partition, offset, metadata) in committed {
                    let Some(p) = progress.get(&(topic.clone(), partition)) else { continue };
                    let Some(downstream) = p.mapping.translate(offset) else { continue };
                    translated.push((partition, offset, downstream, metadata, p.target_topic.clone()));
                }
            }
            let mut commits = Vec::new();
            for (partition, upstream, downstream, metadata, target_topic) in &translated {
                let key = (group.group_id.clone(), target_topic.clone(), *partition);
                if self.checkpoints.get(&key) != Some(&(*upstream, *downstream)) {
                    let checkpoint = Checkpoint {
                        group: group.group_id.clone(),
                        topic: target_topic.clone(),
                        partition: *partition,
                        upstream: *upstream,
                        downstream: *downstream,
                        metadata: metadata.clone(),
                    };
                    records.push((checkpoint.key(), checkpoint.value()));
                    self.checkpoints.insert(key, (*upstream, *downstream));
                }
                commits.push((target_topic.clone(), *partition, *downstream, metadata.clone()));
            }
            if self.args.sync_group_offsets && !commits.is_empty() {
                self.sync_group(&mut target_groups, &group.group_id, commits);
            }
        }
        if !records.is_empty() {
            let topic = self.policy.checkpoints_topic();
            for chunk in records.chunks(1000) {
                self.target.append(&topic, 0, chunk)?;
            }
        }
        Ok(())
    }

    /// Commits translated offsets on the target where the group is not
    /// active there and its target offset is behind (never moves a group
    /// back).
    fn sync_group(&self, target_groups: &mut GroupAdmin, group: &str, commits: Vec<(String, i32, i64, String)>) {
        let (state, existing) = match target_groups.state_and_offsets(group) {
            Ok(found) => found,
            Err(err) => {
                tracing::debug!(group, %err, "mirror: target group not read");
                return;
            }
        };
        if !matches!(state.as_str(), "Empty" | "Dead" | "") {
            return;
        }
        let existing: HashMap<(String, i32), i64> =
            existing.into_iter().map(|(topic, partition, offset, _)| ((topic, partition), offset)).collect();
        let behind: Vec<_> = commits
            .into_iter()
            .filter(|(topic, partition, offset, _)| {
                existing.get(&(topic.clone(), *partition)).is_none_or(|have| have < offset)
            })
            .collect();
        if let Err(err) = target_groups.commit(group, &behind) {
            tracing::debug!(group, %err, "mirror: translated offsets not committed");
        }
    }
}

fn other(err: impl std::fmt::Display) -> LinkError {
    LinkError::Other(err.to_string())
}

/// The first address of a comma-separated bootstrap list.
fn first(bootstrap: &str) -> &str {
    bootstrap.split(',').next().unwrap_or(bootstrap).trim()
}

/// Which worker copies a partition.
pub fn worker_of(key: &Key, workers: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.0.as_bytes().iter().chain(&key.1.to_be_bytes()) {
        hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
    }
    (hash % workers.max(1) as u64) as usize
}

fn wait_for_leader(link: &mut Link, topic: &str, partition: i32) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        link.forget(topic);
        match link.leader_or_refresh(topic, partition) {
            Ok(_) => return Ok(()),
            Err(err) if Instant::now() > deadline => return Err(format!("{topic}-{partition} has no leader: {err}")),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
