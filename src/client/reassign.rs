//! Moving partitions (`shardlog topic move`, `shardlog cluster drain`):
//! plans made here, carried out by the cluster through Kafka's
//! AlterPartitionReassignments, and followed through
//! ListPartitionReassignments, as `kafka-reassign-partitions` does.
//!
//! A drain moves every replica a machine holds to the other machines: each
//! replica of the drained machine is replaced in place (so a preferred
//! leader's successor is preferred too) by a node of a serving machine that
//! holds no replica of that partition, in the same rack where one can, on
//! the machine and then the node with the fewest replicas so far. Which
//! node belongs to which machine comes from the broker's `/v1/status`
//! (Kafka's Metadata does not say).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::admin::Admin;
use crate::metrics::MachineStatus;
use crate::protocol::metadata::MetadataResponse;

/// A partition's new replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub topic: String,
    pub partition: i32,
    pub replicas: Vec<i32>,
}

/// The moves that empty the machine of `node` (see the module docs).
pub fn plan_drain(machines: &[MachineStatus], metadata: &MetadataResponse, node: i32) -> Result<Vec<Move>, String> {
    let drained = machines
        .iter()
        .find(|m| m.nodes.contains(&node))
        .ok_or_else(|| format!("node {node} is no registered machine's"))?;
    let machine_of: BTreeMap<i32, &MachineStatus> =
        machines.iter().flat_map(|m| m.nodes.iter().map(move |n| (*n, m))).collect();
    let mut load: BTreeMap<i32, usize> = BTreeMap::new();
    for topic in &metadata.topics {
        for partition in &topic.partitions {
            for replica in &partition.replica_nodes {
                *load.entry(*replica).or_default() += 1;
            }
        }
    }
    let machine_load = |load: &BTreeMap<i32, usize>, m: &MachineStatus| -> usize {
        m.nodes.iter().map(|n| load.get(n).copied().unwrap_or(0)).sum()
    };
    let mut moves = Vec::new();
    let mut topics: Vec<_> = metadata.topics.iter().collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    for topic in topics {
        let mut partitions: Vec<_> = topic.partitions.iter().collect();
        partitions.sort_by_key(|p| p.index);
        for partition in partitions {
            if !partition.replica_nodes.iter().any(|n| drained.nodes.contains(n)) {
                continue;
            }
            let mut replicas = partition.replica_nodes.clone();
            for at in 0..replicas.len() {
                let leaving = replicas[at];
                if !drained.nodes.contains(&leaving) {
                    continue;
                }
                let used: BTreeSet<u64> = replicas
                    .iter()
                    .filter(|n| !drained.nodes.contains(n))
                    .filter_map(|n| machine_of.get(n).map(|m| m.machine))
                    .collect();
                let candidates: Vec<&MachineStatus> = machines
                    .iter()
                    .filter(|m| m.machine != drained.machine && !m.fenced && !m.nodes.is_empty())
                    .filter(|m| !used.contains(&m.machine))
                    .collect();
                let same_rack: Vec<&MachineStatus> =
                    candidates.iter().copied().filter(|m| drained.rack.is_some() && m.rack == drained.rack).collect();
                let pool = if same_rack.is_empty() { candidates } else { same_rack };
                let machine =
                    pool.into_iter().min_by_key(|m| (machine_load(&load, m), m.machine)).ok_or_else(|| {
                        format!(
                            "{}-{}: no serving machine without a replica of it is left to move one to",
                            topic.name, partition.index
                        )
                    })?;
                let node = *machine
                    .nodes
                    .iter()
                    .min_by_key(|n| (load.get(n).copied().unwrap_or(0), **n))
                    .expect("a candidate machine has nodes");
                *load.entry(node).or_default() += 1;
                if let Some(count) = load.get_mut(&leaving) {
                    *count = count.saturating_sub(1);
                }
                replicas[at] = node;
            }
            moves.push(Move { topic: topic.name.clone(), partition: partition.index, replicas });
        }
    }
    Ok(moves)
}

/// Waits until none of `moves` is in progress, or `timeout`; the ones
/// still moving then.
pub fn await_moves(
    admin: &mut Admin,
    moves: &[(String, i32)],
    timeout: Duration,
) -> Result<Vec<(String, i32)>, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let ongoing: BTreeSet<(String, i32)> = admin
            .list_reassignments()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(topic, p)| (topic, p.partition))
            .collect();
        let left: Vec<(String, i32)> = moves.iter().filter(|m| ongoing.contains(*m)).cloned().collect();
        if left.is_empty() || Instant::now() >= deadline {
            return Ok(left);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::metadata::{MetadataPartition, MetadataTopic};
    use crate::protocol::ErrorCode;

    fn machine(id: u64, rack: &str, nodes: &[i32]) -> MachineStatus {
        MachineStatus { machine: id, rack: Some(rack.into()), fenced: false, nodes: nodes.to_vec(), this: false }
    }

    fn metadata(partitions: &[&[i32]]) -> MetadataResponse {
        MetadataResponse {
            topics: vec![MetadataTopic {
                error: ErrorCode::None,
                name: "t".into(),
                is_internal: false,
                partitions: partitions
                    .iter()
                    .enumerate()
                    .map(|(i, replicas)| MetadataPartition {
                        error: ErrorCode::None,
                        index: i as i32,
                        leader_id: replicas[0],
                        leader_epoch: 0,
                        replica_nodes: replicas.to_vec(),
                        isr_nodes: replicas.to_vec(),
                    })
                    .collect(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_drain_replaces_each_replica_in_place_on_a_machine_without_one_preferring_the_rack() {
        let machines =
            [machine(1, "a", &[0, 1]), machine(2, "a", &[2, 3]), machine(3, "b", &[4, 5]), machine(4, "b", &[6, 7])];
        // Machine 1 (rack a) holds replicas of partitions 0 and 1.
        let plan = plan_drain(&machines, &metadata(&[&[0, 4], &[6, 1], &[2, 4]]), 1).unwrap();
        assert_eq!(plan.len(), 2, "{plan:?}");
        assert_eq!(plan[0].replicas[1], 4, "the other replica stays where it is");
        assert_eq!(plan[0].replicas[0], 3, "machine 2 is machine 1's only rack-mate; its emptier node");
        assert_eq!(plan[1].replicas, vec![6, 2], "in place: the preferred leader stays first");
        for m in &plan {
            let machines_used: BTreeSet<u64> =
                m.replicas.iter().map(|n| machines.iter().find(|x| x.nodes.contains(n)).unwrap().machine).collect();
            assert_eq!(machines_used.len(), m.replicas.len(), "one replica per machine: {m:?}");
        }
    }

    #[test]
    fn a_drain_with_nowhere_to_go_says_which_partition() {
        let machines = [machine(1, "a", &[0]), machine(2, "a", &[1])];
        let refused = plan_drain(&machines, &metadata(&[&[0, 1]]), 0).unwrap_err();
        assert!(refused.contains("t-0"), "{refused}");
        assert!(plan_drain(&machines, &metadata(&[&[0, 1]]), 9).is_err(), "an unknown node");
    }
}
