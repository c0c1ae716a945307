//! DescribeQuorum: the controller quorum of the metadata log, named as KRaft
//! names it (`__cluster_metadata` partition 0): the controller (leader
//! machine id), the Raft term, the commit index as high watermark, and each
//! voter's and learner's log end as the controller tracks it. Machine ids
//! are the replica ids. Answered by the controller's machine; another
//! machine answers NOT_LEADER_OR_FOLLOWER, as a KRaft follower does.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::protocol::describe_quorum::{
    DescribeQuorumRequest, DescribeQuorumResponse, QuorumNode, QuorumPartition, QuorumTopic, ReplicaState,
    METADATA_TOPIC,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DescribeQuorumRequest::decode(reader, version)?;
    let status = shard.controller().map(|(handle, machine)| (handle.status(), *machine));
    let topics = body
        .topics
        .iter()
        .map(|(name, partitions)| QuorumTopic {
            topic_name: name.clone(),
            partitions: partitions
                .iter()
                .map(|&index| {
                    let mut answer = QuorumPartition {
                        partition_index: index,
                        error: ErrorCode::None,
                        error_message: None,
                        leader_id: -1,
                        leader_epoch: -1,
                        high_watermark: -1,
                        current_voters: Vec::new(),
                        observers: Vec::new(),
                    };
                    let Some((status, machine)) = status.as_ref().filter(|_| name == METADATA_TOPIC && index == 0)
                    else {
                        answer.error = ErrorCode::UnknownTopicOrPartition;
                        return answer;
                    };
                    if status.leader != Some(*machine) {
                        answer.error = ErrorCode::NotLeaderOrFollower;
                        answer.leader_id = status.leader.map_or(-1, |l| l.get() as i32);
                        return answer;
                    }
                    let replica = |id: &crate::cluster::MachineId| ReplicaState {
                        replica_id: id.get() as i32,
                        log_end_offset: status
                            .progress
                            .iter()
                            .find(|(member, _)| member == id)
                            .map_or(-1, |(_, matched)| *matched as i64),
                        last_fetch_timestamp: -1,
                        last_caught_up_timestamp: -1,
                    };
                    answer.leader_id = machine.get() as i32;
                    answer.leader_epoch = status.term as i32;
                    answer.high_watermark = status.commit_index as i64;
                    answer.current_voters = status.voters.iter().map(replica).collect();
                    answer.observers = status.learners.iter().map(replica).collect();
                    answer.observers.extend(status.observers.iter().map(|(id, offset)| ReplicaState {
                        replica_id: id.get() as i32,
                        log_end_offset: *offset as i64,
                        last_fetch_timestamp: -1,
                        last_caught_up_timestamp: -1,
                    }));
                    answer
                })
                .collect(),
        })
        .collect();
    let mut w = response(request);
    // No controller listeners to name: a lone machine's quorum needs no port.
    let nodes = status
        .as_ref()
        .map(|(status, _)| {
            status.voters.iter().map(|id| QuorumNode { node_id: id.get() as i32, listeners: Vec::new() })
        })
        .into_iter()
        .flatten()
        .collect();
    DescribeQuorumResponse { error: ErrorCode::None, error_message: None, topics, nodes }.encode(&mut w, version);
    Ok(respond(w))
}
