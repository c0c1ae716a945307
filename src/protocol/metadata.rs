//! Metadata (key 3), versions 0–8: brokers (one per core, each its own node),
//! topics, and which node leads each partition.

use super::{error, DecodeResult, ErrorCode, Reader, Writer};

#[derive(Debug, Clone, Default)]
pub struct MetadataRequest {
    /// None: all topics.
    pub topics: Option<Vec<String>>,
    pub allow_auto_topic_creation: bool,
}

impl MetadataRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let raw_count = r.i32()?;
        let topics = if raw_count < 0 || (version == 0 && raw_count == 0) {
            None
        } else {
            let count = raw_count as usize;
            if count.saturating_mul(2) > r.remaining() {
                return Err(super::DecodeError::ArrayTooLong { count: i64::from(raw_count), remaining: r.remaining() });
            }
            let mut names = Vec::with_capacity(count);
            for _ in 0..count {
                names.push(r.string()?);
            }
            Some(names)
        };
        let allow_auto_topic_creation = if version >= 4 { r.bool()? } else { true };
        if version >= 8 {
            r.bool()?;
            r.bool()?;
        }
        Ok(Self { topics, allow_auto_topic_creation })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        match &self.topics {
            Some(names) => {
                w.i32(names.len() as i32);
                for name in names {
                    w.string(name);
                }
            }
            None => w.i32(if version == 0 { 0 } else { -1 }),
        }
        if version >= 4 {
            w.bool(self.allow_auto_topic_creation);
        }
        if version >= 8 {
            w.bool(false);
            w.bool(false);
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct MetadataResponse {
    pub throttle_time_ms: i32,
    pub brokers: Vec<MetadataBroker>,
    pub cluster_id: Option<String>,
    pub controller_id: i32,
    pub topics: Vec<MetadataTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataBroker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
}

#[derive(Debug, Clone)]
pub struct MetadataTopic {
    pub error: ErrorCode,
    pub name: String,
    pub is_internal: bool,
    pub partitions: Vec<MetadataPartition>,
}

#[derive(Debug, Clone)]
pub struct MetadataPartition {
    pub error: ErrorCode,
    pub index: i32,
    pub leader_id: i32,
    pub leader_epoch: i32,
    pub replica_nodes: Vec<i32>,
    pub isr_nodes: Vec<i32>,
}

impl MetadataResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        if version >= 3 {
            w.i32(self.throttle_time_ms);
        }
        w.i32(self.brokers.len() as i32);
        for broker in &self.brokers {
            w.i32(broker.node_id);
            w.string(&broker.host);
            w.i32(broker.port);
            if version >= 1 {
                w.nullable_string(broker.rack.as_deref());
            }
        }
        if version >= 2 {
            w.nullable_string(self.cluster_id.as_deref());
        }
        if version >= 1 {
            w.i32(self.controller_id);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.i16(topic.error.code());
            w.string(&topic.name);
            if version >= 1 {
                w.bool(topic.is_internal);
            }
            w.i32(topic.partitions.len() as i32);
            for p in &topic.partitions {
                w.i16(p.error.code());
                w.i32(p.index);
                w.i32(p.leader_id);
                if version >= 7 {
                    w.i32(p.leader_epoch);
                }
                for nodes in [&p.replica_nodes, &p.isr_nodes] {
                    w.i32(nodes.len() as i32);
                    for node in nodes {
                        w.i32(*node);
                    }
                }
                if version >= 5 {
                    w.i32(0); // offline_replicas
                }
            }
            if version >= 8 {
                w.i32(i32::MIN); // topic_authorized_operations: not requested
            }
        }
        if version >= 8 {
            w.i32(i32::MIN);
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let throttle_time_ms = if version >= 3 { r.i32()? } else { 0 };
        let broker_count = r.array_len(10)?;
        let mut brokers = Vec::with_capacity(broker_count);
        for _ in 0..broker_count {
            let node_id = r.i32()?;
            let host = r.string()?;
            let port = r.i32()?;
            let rack = if version >= 1 { r.nullable_string()? } else { None };
            brokers.push(MetadataBroker { node_id, host, port, rack });
        }
        let cluster_id = if version >= 2 { r.nullable_string()? } else { None };
        let controller_id = if version >= 1 { r.i32()? } else { -1 };
        let topic_count = r.array_len(8)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let error = error::from_code(r.i16()?);
            let name = r.string()?;
            let is_internal = if version >= 1 { r.bool()? } else { false };
            let count = r.array_len(18)?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let error = error::from_code(r.i16()?);
                let index = r.i32()?;
                let leader_id = r.i32()?;
                let leader_epoch = if version >= 7 { r.i32()? } else { -1 };
                let mut lists = [Vec::new(), Vec::new()];
                for list in &mut lists {
                    let n = r.array_len(4)?;
                    for _ in 0..n {
                        list.push(r.i32()?);
                    }
                }
                if version >= 5 {
                    let n = r.array_len(4)?;
                    for _ in 0..n {
                        r.i32()?;
                    }
                }
                let [replica_nodes, isr_nodes] = lists;
                partitions.push(MetadataPartition { error, index, leader_id, leader_epoch, replica_nodes, isr_nodes });
            }
            if version >= 8 {
                r.i32()?;
            }
            topics.push(MetadataTopic { error, name, is_internal, partitions });
        }
        Ok(Self { throttle_time_ms, brokers, cluster_id, controller_id, topics })
    }
}
