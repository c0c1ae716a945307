//! The controller driver on core 0: admin requests become requests to the
//! controller service, and every committed image is applied on every core
//! before an admin request is answered.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::{events, report};
use super::{AdminOp, AdminReply, Shard, ShardId, ShardMessage};
use crate::cluster::bridge;
use crate::cluster::controller;
use crate::cluster::metadata::MetadataImage;
use crate::cluster::records::ConfigResource;
use crate::constants;
use crate::protocol::ErrorCode;

impl Shard {
    /// Sends an admin operation to the controller (core 0) and waits.
    pub async fn admin(self: &Rc<Self>, op: AdminOp) -> AdminReply {
        let api = report::admin_api(&op);
        let reply = self.admin_on_controller(op).await;
        report::admin_reply(api, &reply);
        reply
    }

    async fn admin_on_controller(self: &Rc<Self>, op: AdminOp) -> AdminReply {
        if self.is_controller() {
            return self.run_admin(op).await;
        }
        let (reply, receive) = flume::bounded(1);
        let failed = || AdminReply::Items(Vec::new());
        if self.send(ShardId(0), ShardMessage::Admin { op, reply }).await.is_err() {
            return failed();
        }
        receive.recv_async().await.unwrap_or_else(|_| failed())
    }

    /// The broker's side of the controller: has the controller service
    /// decide and commit the change, then applies the committed image on
    /// every core, then answers.
    pub(super) async fn run_admin(self: &Rc<Self>, op: AdminOp) -> AdminReply {
        assert!(self.is_controller());
        let Ok(_permit) = self.controller_lock.acquire_permit(1).await else {
            return AdminReply::Items(Vec::new());
        };
        let Some((handle, _)) = self.controller.clone() else {
            return AdminReply::Items(Vec::new());
        };
        let request = match op {
            AdminOp::CreateTopics { topics, validate_only } => {
                bridge::AdminRequest::CreateTopics { topics, validate_only }
            }
            AdminOp::DeleteTopics { names } => bridge::AdminRequest::DeleteTopics { names },
            AdminOp::CreatePartitions { topics, validate_only } => {
                bridge::AdminRequest::CreatePartitions { topics, validate_only }
            }
            AdminOp::AlterTopicConfigs { name, changes, replace, validate_only } => {
                bridge::AdminRequest::AlterConfigs {
                    resource: ConfigResource::Topic(name),
                    changes,
                    replace,
                    validate_only,
                }
            }
            AdminOp::AlterBrokerConfigs { resource, changes, replace, validate_only } => {
                let resource = match resource {
                    controller::BrokerResource::Cluster => ConfigResource::Broker(None),
                    controller::BrokerResource::Node(node) => ConfigResource::Broker(Some(node.0)),
                };
                bridge::AdminRequest::AlterConfigs { resource, changes, replace, validate_only }
            }
            AdminOp::AllocateProducerId => return AdminReply::ProducerId(self.allocate_producer_id().await),
        };
        let names = request_names(&request);
        let items = match bridge::submit(&handle, request).await {
            Ok(items) => items,
            Err(err) => return AdminReply::Items(bridge::failed_items(&names, &err)),
        };
        self.publish_committed().await;
        AdminReply::Items(items)
    }

    /// On core 0: applies every image the metadata log commits on every
    /// core (changes decided on this machine are applied by `run_admin`
    /// before it answers; this follows the rest). Runs until shutdown.
    pub async fn follow_controller(self: Rc<Self>) {
        let Some((handle, _)) = self.controller.clone().filter(|_| self.is_controller()) else { return };
        let committed = handle.subscribe(constants::INBOX_DEPTH);
        while !self.shutting_down.get() {
            let next = futures_lite::future::or(async { committed.recv_async().await.ok().map(|_| ()) }, async {
                glommio::timer::sleep(Duration::from_millis(100)).await;
                Some(())
            })
            .await;
            if next.is_none() {
                return;
            }
            let Ok(_permit) = self.controller_lock.acquire_permit(1).await else { return };
            self.publish_committed().await;
        }
    }

    /// Applies the controller's last committed image on every core, when
    /// it is newer than the one they have.
    async fn publish_committed(self: &Rc<Self>) {
        let Some((handle, machine)) = self.controller.clone() else { return };
        let committed = handle.image();
        let current = self.image();
        if committed.provenance.offset <= current.version {
            return;
        }
        let next = bridge::local_image_since(&current, &committed, machine);
        events::log_topic_changes(&current.durable, &next.durable);
        self.broadcast_image(Arc::new(next)).await;
    }

    async fn allocate_producer_id(self: &Rc<Self>) -> Result<i64, ErrorCode> {
        let (next, end) = self.producer_ids.get();
        if next < end {
            self.producer_ids.set((next + 1, end));
            return Ok(next);
        }
        let Some((handle, machine)) = self.controller.clone() else { return Err(ErrorCode::NotController) };
        let start = bridge::allocate_producer_ids(&handle, machine).await.map_err(|err| {
            tracing::warn!(error = %err, "allocating a producer id block failed");
            ErrorCode::NotController
        })?;
        self.publish_committed().await;
        self.producer_ids.set((start + 1, start + constants::PRODUCER_ID_BLOCK));
        Ok(start)
    }

    async fn broadcast_image(self: &Rc<Self>, image: Arc<MetadataImage>) {
        let mut waits = Vec::new();
        for (index, inbox) in self.inboxes.iter().enumerate() {
            if index == self.id.0 as usize {
                continue;
            }
            let (done, wait) = flume::bounded(1);
            if inbox.send_async(ShardMessage::ApplyImage { image: image.clone(), done }).await.is_ok() {
                waits.push(wait);
            }
        }
        if let Err(err) = self.apply_image(image).await {
            tracing::error!(error = %err, "applying metadata on the controller core failed");
        }
        for wait in waits {
            let _ = wait.recv_async().await;
        }
    }
}

/// The item names of an admin request, for answers when it fails whole.
fn request_names(request: &bridge::AdminRequest) -> Vec<String> {
    match request {
        bridge::AdminRequest::CreateTopics { topics, .. } => topics.iter().map(|t| t.name.clone()).collect(),
        bridge::AdminRequest::DeleteTopics { names } => names.clone(),
        bridge::AdminRequest::CreatePartitions { topics, .. } => topics.iter().map(|t| t.name.clone()).collect(),
        bridge::AdminRequest::AlterConfigs { resource, .. } => vec![match resource {
            ConfigResource::Topic(name) => name.clone(),
            ConfigResource::Broker(None) => String::new(),
            ConfigResource::Broker(Some(node)) => node.to_string(),
        }],
    }
}
