//! Fetch (key 1), versions 4–11. Record data in responses is a list of shared
//! `Bytes` (whole stored batches), written without copying. Fetch sessions
//! (v7+) are not kept: every response carries session id 0, which clients
//! treat as "send full requests".

use bytes::Bytes;

use super::{error, DecodeResult, ErrorCode, Reader, Writer};

#[derive(Debug, Clone, Default)]
pub struct FetchRequest {
    pub replica_id: i32,
    pub max_wait_ms: i32,
    pub min_bytes: i32,
    pub max_bytes: i32,
    pub isolation_level: i8,
    pub session_id: i32,
    pub session_epoch: i32,
    pub topics: Vec<FetchTopic>,
    pub rack_id: String,
}

#[derive(Debug, Clone)]
pub struct FetchTopic {
    pub name: String,
    pub partitions: Vec<FetchPartition>,
}

#[derive(Debug, Clone, Copy)]
pub struct FetchPartition {
    pub index: i32,
    pub current_leader_epoch: i32,
    pub fetch_offset: i64,
    pub log_start_offset: i64,
    pub partition_max_bytes: i32,
}

impl FetchRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let replica_id = r.i32()?;
        let max_wait_ms = r.i32()?;
        let min_bytes = r.i32()?;
        let max_bytes = r.i32()?;
        let isolation_level = r.i8()?;
        let (session_id, session_epoch) = if version >= 7 { (r.i32()?, r.i32()?) } else { (0, -1) };
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let partition_count = r.array_len(if version >= 9 { 28 } else { 24 })?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let index = r.i32()?;
                let current_leader_epoch = if version >= 9 { r.i32()? } else { -1 };
                let fetch_offset = r.i64()?;
                let log_start_offset = if version >= 5 { r.i64()? } else { -1 };
                let partition_max_bytes = r.i32()?;
                partitions.push(FetchPartition {
                    index,
                    current_leader_epoch,
                    fetch_offset,
                    log_start_offset,
                    partition_max_bytes,
                });
            }
            topics.push(FetchTopic { name, partitions });
        }
        if version >= 7 {
            let forgotten = r.array_len(6)?;
            for _ in 0..forgotten {
                r.string()?;
                let count = r.array_len(4)?;
                for _ in 0..count {
                    r.i32()?;
                }
            }
        }
        let rack_id = if version >= 11 { r.string()? } else { String::new() };
        Ok(Self {
            replica_id,
            max_wait_ms,
            min_bytes,
            max_bytes,
            isolation_level,
            session_id,
            session_epoch,
            topics,
            rack_id,
        })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        w.i32(self.replica_id);
        w.i32(self.max_wait_ms);
        w.i32(self.min_bytes);
        w.i32(self.max_bytes);
        w.i8(self.isolation_level);
        if version >= 7 {
            w.i32(self.session_id);
            w.i32(self.session_epoch);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for p in &topic.partitions {
                w.i32(p.index);
                if version >= 9 {
                    w.i32(p.current_leader_epoch);
                }
                w.i64(p.fetch_offset);
                if version >= 5 {
                    w.i64(p.log_start_offset);
                }
                w.i32(p.partition_max_bytes);
            }
        }
        if version >= 7 {
            w.i32(0);
        }
        if version >= 11 {
            w.string(&self.rack_id);
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct FetchResponse {
    pub throttle_time_ms: i32,
    pub error: Option<ErrorCode>,
    pub session_id: i32,
    pub topics: Vec<FetchTopicResponse>,
}

#[derive(Debug, Clone)]
pub struct FetchTopicResponse {
    pub name: String,
    pub partitions: Vec<FetchPartitionResponse>,
}

#[derive(Debug, Clone)]
pub struct FetchPartitionResponse {
    pub index: i32,
    pub error: ErrorCode,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// Whole batches, in offset order (the last may be partial when decoded
    /// from a peer that cut it at max_bytes).
    pub records: Vec<Bytes>,
}

impl FetchPartitionResponse {
    pub fn error(index: i32, error: ErrorCode) -> Self {
        Self { index, error, high_watermark: -1, last_stable_offset: -1, log_start_offset: -1, records: Vec::new() }
    }

    pub fn records_bytes(&self) -> usize {
        self.records.iter().map(Bytes::len).sum()
    }
}

impl FetchResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        w.i32(self.throttle_time_ms);
        if version >= 7 {
            w.i16(self.error.unwrap_or(ErrorCode::None).code());
            w.i32(self.session_id);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for p in &topic.partitions {
                w.i32(p.index);
                w.i16(p.error.code());
                w.i64(p.high_watermark);
                w.i64(p.last_stable_offset);
                if version >= 5 {
                    w.i64(p.log_start_offset);
                }
                w.i32(-1); // aborted_transactions: null
                if version >= 11 {
                    w.i32(-1); // preferred_read_replica
                }
                w.i32(p.records_bytes() as i32);
                for batch in &p.records {
                    w.shared(batch.clone());
                }
            }
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let throttle_time_ms = r.i32()?;
        let (error, session_id) = if version >= 7 { (Some(error::from_code(r.i16()?)), r.i32()?) } else { (None, 0) };
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let count = r.array_len(30)?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = r.i32()?;
                let error = error::from_code(r.i16()?);
                let high_watermark = r.i64()?;
                let last_stable_offset = r.i64()?;
                let log_start_offset = if version >= 5 { r.i64()? } else { -1 };
                let aborted = r.array_len(16)?;
                for _ in 0..aborted {
                    r.i64()?;
                    r.i64()?;
                }
                if version >= 11 {
                    r.i32()?;
                }
                let data = r.nullable_bytes()?.unwrap_or_default();
                let records = super::record_batch::split_batches(data, i32::MAX as usize)
                    .map_err(|_| super::DecodeError::Invalid("record set"))?;
                partitions.push(FetchPartitionResponse {
                    index,
                    error,
                    high_watermark,
                    last_stable_offset,
                    log_start_offset,
                    records,
                });
            }
            topics.push(FetchTopicResponse { name, partitions });
        }
        Ok(Self { throttle_time_ms, error, session_id, topics })
    }
}
