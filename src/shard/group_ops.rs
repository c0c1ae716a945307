//! The consumer-group side of a core: its group service, and the routing of
//! group requests to the coordinator core.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use super::groups;
use super::{AdminOp, AdminReply};
use super::{Shard, ShardId, ShardMessage};
use crate::cluster::controller::NewTopic;
use crate::cluster::metadata;
use crate::constants::OFFSETS_TOPIC;
use crate::protocol::ErrorCode;

impl Shard {
    /// Starts this core's group service and its timer. Groups load as this
    /// core comes to lead partitions of `__consumer_offsets`.
    pub fn open_groups(self: &Rc<Self>) -> Result<(), groups::GroupServiceError> {
        let settings = &self.config.group;
        let config = crate::group::GroupConfig {
            initial_rebalance_delay_ms: settings.initial_rebalance_delay_ms,
            session_timeout_ms_min: settings.session_timeout_ms_min,
            session_timeout_ms_max: settings.session_timeout_ms_max,
            member_id_seed: (crate::log::now_ms() << 8)
                ^ u64::from(self.id.0)
                ^ ((self.config.node_id_base as u64) << 48),
            ..Default::default()
        };
        let service = groups::GroupService::new(Rc::downgrade(self), config)?;
        *self.groups.borrow_mut() = Some(service.clone());
        let stop = Rc::new(Cell::new(false));
        let shard = self.clone();
        let ticker_stop = stop.clone();
        glommio::spawn_local(async move {
            let watcher = async {
                while !shard.shutting_down.get() {
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
                ticker_stop.set(true);
            };
            futures_lite::future::zip(service.run_ticks(stop), watcher).await;
        })
        .detach();
        Ok(())
    }

    /// The `__consumer_offsets` partition of `group_id` and where its
    /// leader, the group's coordinator, is (see
    /// `MetadataImage::group_coordinator`); None before that topic exists.
    pub fn group_owner(&self, group_id: &str) -> Option<(i32, metadata::Placement)> {
        self.image().group_coordinator(group_id)
    }

    /// Creates `__consumer_offsets` if the cluster has none yet (the first
    /// group request of a new cluster), as Kafka does: with
    /// `--offsets-topic-partitions`, and `--offsets-topic-replication-factor`
    /// replicas or as many machines as serve now, whichever is fewer.
    pub async fn ensure_offsets_topic(self: &Rc<Self>) {
        let image = self.image();
        if image.offsets_partitions() > 0 {
            return;
        }
        let serving = image.cluster.machines.values().filter(|m| !m.fenced).count().max(1);
        let wanted = self.config.group.offsets_topic_replication_factor;
        let replication_factor = wanted.min(i16::try_from(serving).unwrap_or(i16::MAX));
        if replication_factor < wanted {
            tracing::info!(
                replication_factor,
                wanted,
                "creating {OFFSETS_TOPIC} with fewer replicas than --offsets-topic-replication-factor: only {serving} machine(s) serve"
            );
        }
        let configs = [
            ("segment.bytes", crate::constants::OFFSETS_TOPIC_SEGMENT_BYTES.to_string()),
            ("retention.ms", "-1".to_string()),
            ("retention.bytes", "-1".to_string()),
            ("flush", "always".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let topic = NewTopic {
            name: OFFSETS_TOPIC.into(),
            partitions: self.config.group.offsets_topic_partitions,
            replication_factor,
            configs,
            assignments: Vec::new(),
        };
        let reply = self.admin(AdminOp::CreateTopics { topics: vec![topic], validate_only: false }).await;
        if let AdminReply::Items(items) = reply {
            for item in items.iter().filter(|i| !i.error.is_ok() && i.error != ErrorCode::TopicAlreadyExists) {
                tracing::warn!(error = ?item.error, message = ?item.message, "creating {OFFSETS_TOPIC} failed");
            }
        }
    }

    /// Runs a group request on the group's core. In per-core mode a request
    /// that reached another core is answered NOT_COORDINATOR (the client
    /// asks FindCoordinator again); in shared-port mode it is forwarded.
    pub async fn group_op(
        self: &Rc<Self>,
        group_id: &str,
        request: groups::GroupRequest,
    ) -> Result<groups::GroupAnswer, ErrorCode> {
        if self.group_owner(group_id).is_none() {
            // A client that skipped FindCoordinator (or raced a new
            // cluster's first one): create the topic, then look again.
            self.ensure_offsets_topic().await;
        }
        let Some((_, placement)) = self.group_owner(group_id) else {
            return Err(ErrorCode::CoordinatorNotAvailable);
        };
        let owner = match placement {
            metadata::Placement::Local(owner, _) => owner,
            // Another machine's: the client asks FindCoordinator again.
            metadata::Placement::Remote(_) => return Err(ErrorCode::NotCoordinator),
            metadata::Placement::Unavailable => return Err(ErrorCode::CoordinatorNotAvailable),
        };
        let answer = if owner == self.id {
            self.run_group_op(request).await
        } else if self.config.listener == crate::config::ListenerMode::PerCore {
            return Err(ErrorCode::NotCoordinator);
        } else {
            self.forward_group_op(owner, request).await?
        };
        match answer {
            groups::GroupAnswer::Refused(code) => Err(code),
            answer => Ok(answer),
        }
    }

    pub async fn forward_group_op(
        &self,
        owner: ShardId,
        request: groups::GroupRequest,
    ) -> Result<groups::GroupAnswer, ErrorCode> {
        let (reply, receive) = flume::bounded(1);
        self.send(owner, ShardMessage::Group { request, reply })
            .await
            .map_err(|_| ErrorCode::CoordinatorNotAvailable)?;
        receive.recv_async().await.map_err(|_| ErrorCode::CoordinatorNotAvailable)
    }

    pub async fn run_group_op(&self, request: groups::GroupRequest) -> groups::GroupAnswer {
        let service = self.groups.borrow().clone();
        match service {
            Some(service) => service.handle(request).await,
            None => groups::GroupAnswer::Unavailable,
        }
    }

    /// Every core's groups (ListGroups in shared-port mode, where one node
    /// stands for all cores).
    pub async fn list_all_groups(self: &Rc<Self>) -> Vec<groups::GroupAnswer> {
        let mut answers = Vec::new();
        for shard in 0..self.shard_count() as u32 {
            let answer = if ShardId(shard) == self.id {
                self.run_group_op(groups::GroupRequest::List).await
            } else {
                self.forward_group_op(ShardId(shard), groups::GroupRequest::List)
                    .await
                    .unwrap_or(groups::GroupAnswer::Unavailable)
            };
            answers.push(answer);
        }
        answers
    }
}
