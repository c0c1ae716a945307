//! The shard's side of replication (issue 30): what each of this core's
//! partitions is (sole replica, leader, follower) as the metadata image
//! says, the changes of role, carrying out what a leader's state machine
//! asks (`replica::leader::Command`), the ISR ticks, and the truncation a
//! follower's fetcher asks for (close, cut, reopen).
//!
//! Lives on every core; each core handles its own partitions only.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use super::partition::Partition;
use super::{Shard, ShardError};
use crate::cluster::control::IsrChange;
use crate::cluster::metadata::MetadataImage;
use crate::log::now_ms;
use crate::protocol::ErrorCode;
use crate::replica::leader::{Command, LeaderConfig, LeaderState, Registration};
use crate::replica::Role;

/// What the image says a local replica is.
#[derive(Debug, Clone)]
pub struct Desired {
    /// -1: no leader now.
    pub leader: i32,
    pub registration: Registration,
    pub topic_id: [u8; 16],
}

/// Partitions a core follows, by leader node, and the fetchers running.
#[derive(Debug, Default)]
pub struct Followed {
    by_leader: BTreeMap<i32, BTreeMap<(Rc<str>, i32), Target>>,
    leader_of: BTreeMap<(Rc<str>, i32), i32>,
    pub(crate) running: BTreeSet<i32>,
}

/// One followed partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub leader_epoch: i32,
    /// The leader-epoch exchange (and any truncation) is done for this
    /// leader epoch: the fetcher may fetch.
    pub truncated: bool,
}

impl Followed {
    fn follow(&mut self, topic: Rc<str>, index: i32, leader: i32, leader_epoch: i32) {
        self.unfollow(&topic, index);
        self.leader_of.insert((topic.clone(), index), leader);
        self.by_leader.entry(leader).or_default().insert((topic, index), Target { leader_epoch, truncated: false });
    }

    fn unfollow(&mut self, topic: &Rc<str>, index: i32) {
        let key = (topic.clone(), index);
        if let Some(leader) = self.leader_of.remove(&key) {
            if let Some(targets) = self.by_leader.get_mut(&leader) {
                targets.remove(&key);
                if targets.is_empty() {
                    self.by_leader.remove(&leader);
                }
            }
        }
    }

    /// The partitions followed from `leader`.
    pub fn targets_of(&self, leader: i32) -> Vec<(Rc<str>, i32, Target)> {
        self.by_leader.get(&leader).map_or(Vec::new(), |targets| {
            targets.iter().map(|((topic, index), target)| (topic.clone(), *index, *target)).collect()
        })
    }

    /// Whether `topic`/`index` is still followed from `leader` in `leader_epoch`.
    pub fn is_following(&self, topic: &Rc<str>, index: i32, leader: i32, leader_epoch: i32) -> bool {
        self.by_leader
            .get(&leader)
            .and_then(|targets| targets.get(&(topic.clone(), index)))
            .is_some_and(|target| target.leader_epoch == leader_epoch)
    }

    pub fn mark_truncated(&mut self, topic: &Rc<str>, index: i32, leader: i32, leader_epoch: i32) {
        let target = self.by_leader.get_mut(&leader).and_then(|targets| targets.get_mut(&(topic.clone(), index)));
        if let Some(target) = target.filter(|t| t.leader_epoch == leader_epoch) {
            target.truncated = true;
        }
    }

    pub fn mark_untruncated(&mut self, topic: &Rc<str>, index: i32, leader: i32) {
        let target = self.by_leader.get_mut(&leader).and_then(|targets| targets.get_mut(&(topic.clone(), index)));
        if let Some(target) = target {
            target.truncated = false;
        }
    }
}

/// How often leaders check their followers' lag.
const ISR_TICK: Duration = Duration::from_millis(250);

impl Shard {
    /// This core's node id.
    pub fn node_id(&self) -> i32 {
        self.image().node_of_shard(self.id).map_or(-1, |n| n.0)
    }

    /// The partitions with a replica on this core, and what each should be.
    pub(super) fn desired_replicas(&self, image: &MetadataImage) -> BTreeMap<(String, i32), Desired> {
        let Some(node) = image.node_of_shard(self.id) else { return BTreeMap::new() };
        let mut wanted = BTreeMap::new();
        for topic in image.cluster.topics.values() {
            for (index, partition) in topic.partitions.iter().enumerate() {
                if !partition.replicas.contains(&node.0) {
                    continue;
                }
                let registration = Registration {
                    replicas: partition.replicas.clone(),
                    isr: partition.isr.clone(),
                    leader_epoch: partition.leader_epoch,
                    partition_epoch: partition.partition_epoch,
                };
                let desired = Desired { leader: partition.leader, registration, topic_id: topic.id };
                wanted.insert((topic.name.clone(), index as i32), desired);
            }
        }
        wanted
    }

    /// Makes `partition` what `desired` says: leader, sole replica or
    /// follower, in the registered leader epoch.
    pub(super) async fn take_role(
        self: &Rc<Self>,
        partition: &Rc<Partition>,
        desired: &Desired,
    ) -> Result<(), ShardError> {
        let me = self.node_id();
        let epoch = desired.registration.leader_epoch;
        let current = partition.replica.role.borrow().clone();
        let log = &partition.log;
        let now = now_ms();
        if desired.leader == me {
            self.followed.borrow_mut().unfollow(&partition.topic, partition.index);
            let new_epoch = current.leader_epoch() != epoch || !current.leads();
            if new_epoch {
                // Before the first batch of the epoch, so the cache never
                // lacks an epoch the log holds.
                partition.assign_epoch(epoch, log.log_end_offset()).await.map_err(|e| ShardError::Log {
                    topic: partition.topic.to_string(),
                    partition: partition.index,
                    source: crate::log::LogError::io(log.dir(), e),
                })?;
            }
            if desired.registration.replicas.len() == 1 {
                if new_epoch || !matches!(current, Role::Sole { .. }) {
                    tracing::info!(topic = %partition.topic, partition = partition.index, leader_epoch = epoch, "leading (sole replica)");
                }
                *partition.replica.role.borrow_mut() = Role::Sole { leader_epoch: epoch };
                log.set_high_watermark_limit(i64::MAX);
            } else {
                let config = self.leader_config(partition);
                let commands = match current {
                    Role::Leader(mut state) if !new_epoch => {
                        state.set_config(config);
                        let commands = state.on_registration(desired.registration.clone(), log.local_end_offset(), now);
                        *partition.replica.role.borrow_mut() = Role::Leader(state);
                        commands
                    }
                    _ => {
                        tracing::info!(topic = %partition.topic, partition = partition.index, leader_epoch = epoch, isr = ?desired.registration.isr, "leading");
                        let high_watermark = log.high_watermark();
                        let mut state = LeaderState::new(
                            me,
                            desired.registration.clone(),
                            log.local_end_offset(),
                            high_watermark,
                            now,
                            config,
                        );
                        log.set_high_watermark_limit(state.high_watermark());
                        let commands = state.on_log_end(log.local_end_offset());
                        *partition.replica.role.borrow_mut() = Role::Leader(Box::new(state));
                        commands
                    }
                };
                self.carry_out(partition, desired.topic_id, commands);
            }
        } else {
            let same = matches!(current, Role::Follower { leader, leader_epoch } if leader == desired.leader && leader_epoch == epoch);
            if !same {
                // What this replica knew committed stays readable; nothing
                // more until its new leader says so.
                log.set_high_watermark_limit(log.high_watermark());
                *partition.replica.role.borrow_mut() = Role::Follower { leader: desired.leader, leader_epoch: epoch };
                if desired.leader >= 0 {
                    tracing::info!(topic = %partition.topic, partition = partition.index, leader = desired.leader, leader_epoch = epoch, "following");
                    self.followed.borrow_mut().follow(partition.topic.clone(), partition.index, desired.leader, epoch);
                    self.start_fetcher(desired.leader);
                } else {
                    self.followed.borrow_mut().unfollow(&partition.topic, partition.index);
                }
            }
        }
        partition.replica.changed.notify(usize::MAX);
        self.offsets_role_changed(partition);
        Ok(())
    }

    /// A partition that leaves this core stops being followed.
    pub(super) fn forget_replica(&self, partition: &Partition) {
        self.followed.borrow_mut().unfollow(&partition.topic, partition.index);
        *partition.replica.role.borrow_mut() = Role::Follower { leader: -1, leader_epoch: -1 };
        partition.replica.changed.notify(usize::MAX);
        self.offsets_role_changed(partition);
    }

    /// Tells the group service that this core now leads a partition of
    /// `__consumer_offsets`, or no longer does (it loads or drops groups).
    fn offsets_role_changed(&self, partition: &Partition) {
        if &*partition.topic != crate::constants::OFFSETS_TOPIC {
            return;
        }
        if let Some(service) = self.group_service() {
            let leading = super::groups::leading_epoch(&partition.replica.role.borrow());
            service.role_changed(partition.index, leading);
        }
    }

    fn leader_config(&self, partition: &Partition) -> LeaderConfig {
        LeaderConfig {
            min_insync: partition.log.config().min_insync_replicas.max(1) as usize,
            lag_time_max_ms: self.config.replica_lag_time_max_ms,
        }
    }

    fn start_fetcher(self: &Rc<Self>, leader: i32) {
        if self.followed.borrow_mut().running.insert(leader) {
            glommio::spawn_local(crate::replica::follower::run(self.clone(), leader)).detach();
        }
    }

    /// Carries out what a leader's state machine asked for.
    pub(crate) fn carry_out(self: &Rc<Self>, partition: &Rc<Partition>, topic_id: [u8; 16], commands: Vec<Command>) {
        for command in commands {
            match command {
                Command::HighWatermark(high_watermark) => {
                    partition.log.set_high_watermark_limit(high_watermark);
                    partition.replica.changed.notify(usize::MAX);
                    self.readable_changed(partition);
                }
                Command::AlterIsr { isr, partition_epoch } => {
                    self.ask_isr(partition.clone(), topic_id, isr, partition_epoch);
                }
            }
        }
    }

    fn ask_isr(self: &Rc<Self>, partition: Rc<Partition>, topic_id: [u8; 16], isr: Vec<i32>, partition_epoch: i32) {
        let shard = self.clone();
        glommio::spawn_local(async move {
            let image = shard.image();
            let leader_epoch = partition.replica.leader_epoch();
            let machine_epoch = image.cluster.machines.get(&image.machine).map_or(0, |m| m.epoch);
            let change = IsrChange {
                topic_id,
                partition: partition.index,
                leader: shard.node_id(),
                machine_epoch,
                leader_epoch,
                partition_epoch,
                isr: isr.clone(),
            };
            let answer = match shard.controller() {
                Some((handle, _)) => crate::cluster::bridge::alter_isr(handle, change).await,
                None => Err((crate::protocol::ErrorCode::NotController, "no controller".into())),
            };
            match answer {
                Ok(()) => {
                    tracing::info!(topic = %partition.topic, partition = partition.index, ?isr, "ISR changed");
                    crate::metrics::record_isr_change();
                }
                Err((error, reason)) => {
                    tracing::warn!(topic = %partition.topic, partition = partition.index, ?isr, ?error, %reason, "ISR change refused");
                    if let Role::Leader(state) = &mut *partition.replica.role.borrow_mut() {
                        if state.leader_epoch() == leader_epoch {
                            state.on_alter_failed();
                        }
                    }
                }
            }
        })
        .detach();
    }

    /// Every `ISR_TICK`: each leader drops followers that lag too long.
    pub async fn run_isr_ticks(self: Rc<Self>) {
        while !self.shutting_down.get() {
            glommio::timer::sleep(ISR_TICK).await;
            let now = now_ms();
            let image = self.image();
            for partition in self.local_partitions() {
                let commands = match &mut *partition.replica.role.borrow_mut() {
                    Role::Leader(state) => state.on_tick(now),
                    _ => continue,
                };
                if commands.is_empty() {
                    continue;
                }
                let topic_id = image.topic(&partition.topic).map_or([0; 16], |t| t.topic_id);
                self.carry_out(&partition, topic_id, commands);
            }
        }
    }

    /// The leader's own log end moved (its appends are done under the
    /// flush policy): with an ISR of one, that moves the high watermark.
    pub(crate) fn leader_log_moved(&self, partition: &Partition) {
        let commands = match &mut *partition.replica.role.borrow_mut() {
            Role::Leader(state) => state.on_log_end(partition.log.local_end_offset()),
            _ => return,
        };
        for command in commands {
            if let Command::HighWatermark(high_watermark) = command {
                partition.log.set_high_watermark_limit(high_watermark);
                partition.replica.changed.notify(usize::MAX);
            }
        }
    }

    /// Waits until an acks=all produce ending at `last_offset` is below the
    /// high watermark: on every in-sync replica. Kafka's answers otherwise:
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR fell under
    /// `min.insync.replicas` meanwhile, NOT_LEADER_OR_FOLLOWER when this
    /// replica stopped leading, REQUEST_TIMED_OUT at the deadline.
    pub(crate) async fn wait_replicated(&self, partition: &Partition, last_offset: i64, timeout_ms: i32) -> ErrorCode {
        let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64);
        let epoch = partition.replica.leader_epoch();
        loop {
            let listener = partition.replica.changed.listen();
            if partition.log.high_watermark() > last_offset {
                return ErrorCode::None;
            }
            match &*partition.replica.role.borrow() {
                Role::Leader(state) if state.leader_epoch() == epoch => {
                    if !state.enough_in_sync() {
                        return ErrorCode::NotEnoughReplicasAfterAppend;
                    }
                }
                Role::Sole { .. } => return ErrorCode::None,
                _ => return ErrorCode::NotLeaderOrFollower,
            }
            if self.shutting_down.get() {
                return ErrorCode::NotLeaderOrFollower;
            }
            let wait = deadline.saturating_duration_since(std::time::Instant::now());
            if wait.is_zero() {
                return ErrorCode::RequestTimedOut;
            }
            futures_lite::future::or(listener, async {
                glommio::timer::sleep(wait).await;
            })
            .await;
        }
    }

    /// Cuts a follower's log at `offset` (see `Log::truncate_and_close`)
    /// and reopens it: the reopened partition keeps its role, its epoch
    /// cache without the cut epochs, and rebuilds its producer state from
    /// the log. Returns where the log now ends.
    pub(crate) async fn truncate_partition(
        self: &Rc<Self>,
        topic: &str,
        index: i32,
        offset: i64,
    ) -> Result<i64, ShardError> {
        let _restructure = self.restructure.acquire_permit(1).await.map_err(|_| ShardError::Log {
            topic: topic.into(),
            partition: index,
            source: crate::log::LogError::Closed,
        })?;
        let Some(partition) = self.local_partition(topic, index) else { return Ok(offset) };
        let log_error = |source| ShardError::Log { topic: topic.into(), partition: index, source };
        let config = partition.log.config();
        let high_watermark = partition.log.high_watermark();
        partition
            .forget_producer_snapshot()
            .await
            .map_err(|e| log_error(crate::log::LogError::io(partition.log.dir(), e)))?;
        let end = partition.log.truncate_and_close(offset).await.map_err(log_error)?;
        let mut epochs = partition.replica.epochs.borrow().clone();
        epochs.truncate_from(end);
        let reopened = self.open_partition(topic.to_string(), index, config).await?;
        reopened.adopt_replica_state(&partition);
        *reopened.replica.epochs.borrow_mut() = epochs;
        reopened.persist_epochs().await.map_err(|e| log_error(crate::log::LogError::io(reopened.log.dir(), e)))?;
        reopened.log.set_high_watermark_limit(high_watermark.min(end));
        self.partitions.borrow_mut().insert(reopened);
        partition.replica.changed.notify(usize::MAX);
        Ok(end)
    }

    /// Empties a follower's log to start at `offset`, its leader's log
    /// start, when the whole log lies below it (see `Log::empty_and_close`),
    /// and reopens it with no epochs and no producer state.
    pub(crate) async fn restart_partition_at(
        self: &Rc<Self>,
        topic: &str,
        index: i32,
        offset: i64,
    ) -> Result<(), ShardError> {
        let _restructure = self.restructure.acquire_permit(1).await.map_err(|_| ShardError::Log {
            topic: topic.into(),
            partition: index,
            source: crate::log::LogError::Closed,
        })?;
        let Some(partition) = self.local_partition(topic, index) else { return Ok(()) };
        let log_error = |source| ShardError::Log { topic: topic.into(), partition: index, source };
        let config = partition.log.config();
        partition
            .forget_producer_snapshot()
            .await
            .map_err(|e| log_error(crate::log::LogError::io(partition.log.dir(), e)))?;
        partition.log.empty_and_close(offset).await.map_err(log_error)?;
        let reopened = self.open_partition(topic.to_string(), index, config).await?;
        reopened.adopt_replica_state(&partition);
        let mut epochs = partition.replica.epochs.borrow().clone();
        epochs.truncate_from(i64::MIN);
        *reopened.replica.epochs.borrow_mut() = epochs;
        reopened.persist_epochs().await.map_err(|e| log_error(crate::log::LogError::io(reopened.log.dir(), e)))?;
        reopened.log.set_high_watermark_limit(reopened.log.log_start_offset());
        self.partitions.borrow_mut().insert(reopened);
        partition.replica.changed.notify(usize::MAX);
        Ok(())
    }
}
