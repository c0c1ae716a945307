//! The consumer-group side of a core: its group service, and the routing of
//! group requests to the coordinator core.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use super::groups;
use super::{Shard, ShardId, ShardMessage};
use crate::cluster::metadata;
use crate::protocol::ErrorCode;

impl Shard {
    /// Opens this core's group service (replaying committed offsets) and
    /// starts its timer.
    pub async fn open_groups(self: &Rc<Self>) -> Result<(), groups::GroupServiceError> {
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
        let dir = self.config.data.join("__groups").join(format!("core-{}", self.id.0));
        let service = groups::GroupService::open(&dir, config).await?;
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

    /// Where `group_id`'s coordinator is (see
    /// `MetadataImage::group_coordinator`).
    pub fn group_owner(&self, group_id: &str) -> metadata::Placement {
        self.image().group_coordinator(group_id)
    }

    /// Runs a group request on the group's core. In per-core mode a request
    /// that reached another core is answered NOT_COORDINATOR (the client
    /// asks FindCoordinator again); in shared-port mode it is forwarded.
    pub async fn group_op(
        self: &Rc<Self>,
        group_id: &str,
        request: groups::GroupRequest,
    ) -> Result<groups::GroupAnswer, ErrorCode> {
        let owner = match self.group_owner(group_id) {
            metadata::Placement::Local(owner, _) => owner,
            // Another machine's: the client asks FindCoordinator again.
            metadata::Placement::Remote(_) => return Err(ErrorCode::NotCoordinator),
            metadata::Placement::Unavailable => return Err(ErrorCode::CoordinatorNotAvailable),
        };
        if owner == self.id {
            return Ok(self.run_group_op(request).await);
        }
        if self.config.listener == crate::config::ListenerMode::PerCore {
            return Err(ErrorCode::NotCoordinator);
        }
        self.forward_group_op(owner, request).await
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
