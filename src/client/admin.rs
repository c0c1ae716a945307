//! Admin operations over the Kafka protocol (what `kafka-topics` does).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{decode, ClientError, Connection};
use crate::protocol::create_partitions::{CreatePartitionsRequest, CreatePartitionsResponse, CreatePartitionsTopic};
use crate::protocol::create_topics::{CreatableTopic, CreatableTopicConfig, CreateTopicsRequest, CreateTopicsResponse};
use crate::protocol::delete_topics::{DeleteTopicsRequest, DeleteTopicsResponse};
use crate::protocol::describe_configs::{DescribeConfigsRequest, DescribeConfigsResource, DescribeConfigsResponse};
use crate::protocol::incremental_alter_configs::{
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResource, IncrementalAlterConfigsResponse,
    IncrementalAlterableConfig, CONFIG_OPERATION_DELETE, CONFIG_OPERATION_SET,
};
use crate::protocol::metadata::{MetadataRequest, MetadataResponse};
use crate::protocol::partition_reassignments::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, OngoingReassignment, ReassignablePartition,
};
use crate::protocol::{ApiKey, ErrorCode};

pub struct Admin {
    connection: Connection,
}

/// The outcome of one item (topic) of an admin request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminResult {
    pub name: String,
    pub error: ErrorCode,
    pub message: Option<String>,
}

impl Admin {
    /// AlterPartitionReassignments: each (topic, partition) to new replicas,
    /// or None to cancel its move. One result per move, in order, named
    /// `topic-partition`.
    pub fn alter_reassignments(
        &mut self,
        moves: &[(String, i32, Option<Vec<i32>>)],
    ) -> Result<Vec<AdminResult>, ClientError> {
        let mut topics: Vec<(String, Vec<ReassignablePartition>)> = Vec::new();
        for (topic, partition, replicas) in moves {
            let wanted = ReassignablePartition { partition: *partition, replicas: replicas.clone() };
            match topics.iter_mut().find(|(name, _)| name == topic) {
                Some((_, partitions)) => partitions.push(wanted),
                None => topics.push((topic.clone(), vec![wanted])),
            }
        }
        let request = AlterPartitionReassignmentsRequest { timeout_ms: 30_000, topics };
        let reader = self.connection.request(ApiKey::AlterPartitionReassignments, 0, |w| request.encode(w, 0))?;
        let response = decode(reader, 0, AlterPartitionReassignmentsResponse::decode)?;
        Ok(moves
            .iter()
            .map(|(topic, partition, _)| {
                let answered = response
                    .responses
                    .iter()
                    .filter(|(name, _)| name == topic)
                    .flat_map(|(_, partitions)| partitions)
                    .find(|p| p.partition == *partition);
                AdminResult {
                    name: format!("{topic}-{partition}"),
                    error: answered.map_or(response.error, |p| p.error),
                    message: answered.and_then(|p| p.message.clone()).or_else(|| response.message.clone()),
                }
            })
            .collect())
    }

    /// ListPartitionReassignments: every move in progress.
    pub fn list_reassignments(&mut self) -> Result<Vec<(String, OngoingReassignment)>, ClientError> {
        let request = ListPartitionReassignmentsRequest { timeout_ms: 30_000, topics: None };
        let reader = self.connection.request(ApiKey::ListPartitionReassignments, 0, |w| request.encode(w, 0))?;
        let response = decode(reader, 0, ListPartitionReassignmentsResponse::decode)?;
        Ok(response
            .topics
            .into_iter()
            .flat_map(|(topic, partitions)| partitions.into_iter().map(move |p| (topic.clone(), p)))
            .collect())
    }

    pub fn connect(bootstrap: &str) -> Result<Self, ClientError> {
        Ok(Self { connection: Connection::connect(bootstrap, Duration::from_secs(10))? })
    }

    /// DescribeUserScramCredentials v0 (`None`: every user).
    pub fn describe_users(
        &mut self,
        users: Option<Vec<String>>,
    ) -> Result<crate::protocol::scram_credentials::DescribeUserScramCredentialsResponse, ClientError> {
        use crate::protocol::scram_credentials::*;
        let request = DescribeUserScramCredentialsRequest { users };
        let reader = self.connection.request(ApiKey::DescribeUserScramCredentials, 0, |w| request.encode(w, 0))?;
        decode(reader, 0, DescribeUserScramCredentialsResponse::decode)
    }

    /// AlterUserScramCredentials v0: the answer per user.
    pub fn alter_users(
        &mut self,
        request: &crate::protocol::scram_credentials::AlterUserScramCredentialsRequest,
    ) -> Result<Vec<(String, ErrorCode, Option<String>)>, ClientError> {
        use crate::protocol::scram_credentials::AlterUserScramCredentialsResponse;
        let reader = self.connection.request(ApiKey::AlterUserScramCredentials, 0, |w| request.encode(w, 0))?;
        Ok(decode(reader, 0, AlterUserScramCredentialsResponse::decode)?.results)
    }

    pub fn metadata(&mut self, topics: Option<Vec<String>>) -> Result<MetadataResponse, ClientError> {
        let request = MetadataRequest { topics, allow_auto_topic_creation: false };
        let reader = self.connection.request(ApiKey::Metadata, 8, |w| request.encode(w, 8))?;
        decode(reader, 8, MetadataResponse::decode)
    }

    /// DescribeQuorum of the metadata log (`__cluster_metadata` 0), v2.
    pub fn describe_quorum(&mut self) -> Result<crate::protocol::describe_quorum::DescribeQuorumResponse, ClientError> {
        use crate::protocol::describe_quorum::{DescribeQuorumRequest, DescribeQuorumResponse, METADATA_TOPIC};
        let request = DescribeQuorumRequest { topics: vec![(METADATA_TOPIC.into(), vec![0])] };
        let reader = self.connection.request(ApiKey::DescribeQuorum, 2, |w| request.encode(w, 2))?;
        decode(reader, 2, DescribeQuorumResponse::decode)
    }

    /// DescribeCluster v2 with fenced brokers: every registered node.
    pub fn describe_cluster(
        &mut self,
    ) -> Result<crate::protocol::describe_cluster::DescribeClusterResponse, ClientError> {
        use crate::protocol::describe_cluster::{DescribeClusterRequest, DescribeClusterResponse};
        let request = DescribeClusterRequest {
            include_cluster_authorized_operations: false,
            endpoint_type: crate::protocol::describe_cluster::ENDPOINT_TYPE_BROKERS,
            include_fenced_brokers: true,
        };
        let reader = self.connection.request(ApiKey::DescribeCluster, 2, |w| request.encode(w, 2))?;
        decode(reader, 2, DescribeClusterResponse::decode)
    }

    /// UnregisterBroker v0: removes the machine `node` runs on, once it is
    /// stopped and holds no replica.
    pub fn unregister_broker(
        &mut self,
        node: i32,
    ) -> Result<crate::protocol::unregister_broker::UnregisterBrokerResponse, ClientError> {
        use crate::protocol::unregister_broker::{UnregisterBrokerRequest, UnregisterBrokerResponse};
        let request = UnregisterBrokerRequest { broker_id: node };
        let reader = self.connection.request(ApiKey::UnregisterBroker, 0, |w| request.encode(w, 0))?;
        decode(reader, 0, UnregisterBrokerResponse::decode)
    }

    pub fn create_topic(
        &mut self,
        name: &str,
        partitions: i32,
        configs: &BTreeMap<String, String>,
    ) -> Result<AdminResult, ClientError> {
        self.create_topic_replicated(name, partitions, -1, configs)
    }

    /// CreateTopics with a replication factor (-1: the broker's default).
    pub fn create_topic_replicated(
        &mut self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &BTreeMap<String, String>,
    ) -> Result<AdminResult, ClientError> {
        let request = CreateTopicsRequest {
            topics: vec![CreatableTopic {
                name: name.into(),
                num_partitions: partitions,
                replication_factor,
                assignments: Vec::new(),
                configs: configs
                    .iter()
                    .map(|(k, v)| CreatableTopicConfig { name: k.clone(), value: Some(v.clone()) })
                    .collect(),
            }],
            timeout_ms: 30_000,
            validate_only: false,
        };
        let reader = self.connection.request(ApiKey::CreateTopics, 4, |w| request.encode(w, 4))?;
        let response = decode(reader, 4, CreateTopicsResponse::decode)?;
        let result = response.topics.into_iter().next();
        Ok(result.map_or(
            AdminResult {
                name: name.into(),
                error: ErrorCode::UnknownServerError,
                message: Some("empty response".into()),
            },
            |t| AdminResult { name: t.name, error: t.error, message: t.error_message },
        ))
    }

    pub fn delete_topic(&mut self, name: &str) -> Result<AdminResult, ClientError> {
        let request = DeleteTopicsRequest { topic_names: vec![name.into()], timeout_ms: 30_000 };
        let reader = self.connection.request(ApiKey::DeleteTopics, 3, |w| request.encode(w, 3))?;
        let response = decode(reader, 3, DeleteTopicsResponse::decode)?;
        let result = response.responses.into_iter().next();
        Ok(result.map_or(AdminResult { name: name.into(), error: ErrorCode::UnknownServerError, message: None }, |t| {
            AdminResult { name: t.name, error: t.error, message: None }
        }))
    }

    pub fn create_partitions(&mut self, name: &str, count: i32) -> Result<AdminResult, ClientError> {
        let request = CreatePartitionsRequest {
            topics: vec![CreatePartitionsTopic { name: name.into(), count, assignments: None }],
            timeout_ms: 30_000,
            validate_only: false,
        };
        let reader = self.connection.request(ApiKey::CreatePartitions, 1, |w| request.encode(w, 1))?;
        let response = decode(reader, 1, CreatePartitionsResponse::decode)?;
        let result = response.results.into_iter().next();
        Ok(result.map_or(AdminResult { name: name.into(), error: ErrorCode::UnknownServerError, message: None }, |t| {
            AdminResult { name: t.name, error: t.error, message: t.error_message }
        }))
    }

    /// Effective configs of a topic: (name, value, is an override).
    pub fn describe_topic_configs(&mut self, name: &str) -> Result<Vec<(String, String, bool)>, ClientError> {
        let request = DescribeConfigsRequest {
            resources: vec![DescribeConfigsResource {
                resource_type: 2,
                resource_name: name.into(),
                configuration_keys: None,
            }],
            include_synonyms: false,
            include_documentation: false,
        };
        let reader = self.connection.request(ApiKey::DescribeConfigs, 3, |w| request.encode(w, 3))?;
        let response = decode(reader, 3, DescribeConfigsResponse::decode)?;
        Ok(response
            .results
            .into_iter()
            .flat_map(|r| r.configs)
            .map(|c| (c.name, c.value.unwrap_or_default(), c.config_source == 1))
            .collect())
    }

    /// Sets (`Some`) or removes (`None`) topic configs.
    pub fn alter_topic_configs(
        &mut self,
        name: &str,
        changes: &[(String, Option<String>)],
    ) -> Result<AdminResult, ClientError> {
        let request = IncrementalAlterConfigsRequest {
            resources: vec![IncrementalAlterConfigsResource {
                resource_type: 2,
                resource_name: name.into(),
                configs: changes
                    .iter()
                    .map(|(key, value)| IncrementalAlterableConfig {
                        name: key.clone(),
                        config_operation: if value.is_some() { CONFIG_OPERATION_SET } else { CONFIG_OPERATION_DELETE },
                        value: value.clone(),
                    })
                    .collect(),
            }],
            validate_only: false,
        };
        let reader = self.connection.request(ApiKey::IncrementalAlterConfigs, 1, |w| request.encode(w, 1))?;
        let response = decode(reader, 1, IncrementalAlterConfigsResponse::decode)?;
        let result = response.responses.into_iter().next();
        Ok(result.map_or(AdminResult { name: name.into(), error: ErrorCode::UnknownServerError, message: None }, |r| {
            AdminResult { name: r.resource_name, error: r.error, message: r.error_message }
        }))
    }
}
