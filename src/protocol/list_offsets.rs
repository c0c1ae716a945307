//! ListOffsets (key 2), versions 1–5: earliest (-2), latest (-1) or the first
//! offset whose timestamp is at or after a given time.

use super::{error, DecodeResult, ErrorCode, Reader, Writer};

pub const LATEST_TIMESTAMP: i64 = -1;
pub const EARLIEST_TIMESTAMP: i64 = -2;

#[derive(Debug, Clone, Default)]
pub struct ListOffsetsRequest {
    pub replica_id: i32,
    pub isolation_level: i8,
    pub topics: Vec<ListOffsetsTopic>,
}

#[derive(Debug, Clone)]
pub struct ListOffsetsTopic {
    pub name: String,
    pub partitions: Vec<ListOffsetsPartition>,
}

#[derive(Debug, Clone, Copy)]
pub struct ListOffsetsPartition {
    pub index: i32,
    pub current_leader_epoch: i32,
    pub timestamp: i64,
}

impl ListOffsetsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let replica_id = r.i32()?;
        let isolation_level = if version >= 2 { r.i8()? } else { 0 };
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let count = r.array_len(12)?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = r.i32()?;
                let current_leader_epoch = if version >= 4 { r.i32()? } else { -1 };
                let timestamp = r.i64()?;
                partitions.push(ListOffsetsPartition { index, current_leader_epoch, timestamp });
            }
            topics.push(ListOffsetsTopic { name, partitions });
        }
        Ok(Self { replica_id, isolation_level, topics })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        w.i32(self.replica_id);
        if version >= 2 {
            w.i8(self.isolation_level);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for p in &topic.partitions {
                w.i32(p.index);
                if version >= 4 {
                    w.i32(p.current_leader_epoch);
                }
                w.i64(p.timestamp);
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListOffsetsResponse {
    pub throttle_time_ms: i32,
    pub topics: Vec<ListOffsetsTopicResponse>,
}

#[derive(Debug, Clone)]
pub struct ListOffsetsTopicResponse {
    pub name: String,
    pub partitions: Vec<ListOffsetsPartitionResponse>,
}

#[derive(Debug, Clone, Copy)]
pub struct ListOffsetsPartitionResponse {
    pub index: i32,
    pub error: ErrorCode,
    pub timestamp: i64,
    pub offset: i64,
    pub leader_epoch: i32,
}

impl ListOffsetsPartitionResponse {
    pub fn error(index: i32, error: ErrorCode) -> Self {
        Self { index, error, timestamp: -1, offset: -1, leader_epoch: -1 }
    }
}

impl ListOffsetsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        if version >= 2 {
            w.i32(self.throttle_time_ms);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for p in &topic.partitions {
                w.i32(p.index);
                w.i16(p.error.code());
                w.i64(p.timestamp);
                w.i64(p.offset);
                if version >= 4 {
                    w.i32(p.leader_epoch);
                }
            }
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let throttle_time_ms = if version >= 2 { r.i32()? } else { 0 };
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let count = r.array_len(22)?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = r.i32()?;
                let error = error::from_code(r.i16()?);
                let timestamp = r.i64()?;
                let offset = r.i64()?;
                let leader_epoch = if version >= 4 { r.i32()? } else { -1 };
                partitions.push(ListOffsetsPartitionResponse { index, error, timestamp, offset, leader_epoch });
            }
            topics.push(ListOffsetsTopicResponse { name, partitions });
        }
        Ok(Self { throttle_time_ms, topics })
    }
}
