//! Produce (key 0), versions 3–8. Decoded record sets are uniquely owned
//! slices of the received frame (`BytesMut`: the log patches offsets into
//! them in place); requests to encode hold shared `Bytes`.

use bytes::{Bytes, BytesMut};

use super::{DecodeResult, ErrorCode, Reader, Writer};

/// A produce request; `R` is how record sets are held (see the module doc).
#[derive(Debug, Clone)]
pub struct ProduceRequest<R = Bytes> {
    pub transactional_id: Option<String>,
    pub acks: i16,
    pub timeout_ms: i32,
    pub topics: Vec<ProduceTopic<R>>,
}

#[derive(Debug, Clone)]
pub struct ProduceTopic<R = Bytes> {
    pub name: String,
    pub partitions: Vec<ProducePartition<R>>,
}

#[derive(Debug, Clone)]
pub struct ProducePartition<R = Bytes> {
    pub index: i32,
    pub records: Option<R>,
}

impl ProduceRequest<BytesMut> {
    pub fn decode(r: &mut Reader, _version: i16) -> DecodeResult<Self> {
        let transactional_id = r.nullable_string()?;
        let acks = r.i16()?;
        let timeout_ms = r.i32()?;
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let partition_count = r.array_len(8)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let index = r.i32()?;
                let records = r.nullable_bytes_mut()?;
                partitions.push(ProducePartition { index, records });
            }
            topics.push(ProduceTopic { name, partitions });
        }
        Ok(Self { transactional_id, acks, timeout_ms, topics })
    }
}

impl ProduceRequest<Bytes> {
    pub fn encode(&self, w: &mut Writer) {
        w.nullable_string(self.transactional_id.as_deref());
        w.i16(self.acks);
        w.i32(self.timeout_ms);
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for partition in &topic.partitions {
                w.i32(partition.index);
                match &partition.records {
                    Some(records) => {
                        w.i32(records.len() as i32);
                        w.shared(records.clone());
                    }
                    None => w.i32(-1),
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ProduceResponse {
    pub topics: Vec<ProduceTopicResponse>,
    pub throttle_time_ms: i32,
}

#[derive(Debug, Clone)]
pub struct ProduceTopicResponse {
    pub name: String,
    pub partitions: Vec<ProducePartitionResponse>,
}

#[derive(Debug, Clone)]
pub struct ProducePartitionResponse {
    pub index: i32,
    pub error: ErrorCode,
    pub base_offset: i64,
    pub log_append_time_ms: i64,
    pub log_start_offset: i64,
    pub error_message: Option<String>,
}

impl ProducePartitionResponse {
    pub fn error(index: i32, error: ErrorCode) -> Self {
        Self { index, error, base_offset: -1, log_append_time_ms: -1, log_start_offset: -1, error_message: None }
    }
}

impl ProduceResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for p in &topic.partitions {
                w.i32(p.index);
                w.i16(p.error.code());
                w.i64(p.base_offset);
                w.i64(p.log_append_time_ms);
                if version >= 5 {
                    w.i64(p.log_start_offset);
                }
                if version >= 8 {
                    w.i32(0); // record_errors
                    w.nullable_string(p.error_message.as_deref());
                }
            }
        }
        w.i32(self.throttle_time_ms);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let count = r.array_len(22)?;
            let mut partitions = Vec::with_capacity(count);
            for _ in 0..count {
                let index = r.i32()?;
                let error = error_from_code(r.i16()?);
                let base_offset = r.i64()?;
                let log_append_time_ms = r.i64()?;
                let log_start_offset = if version >= 5 { r.i64()? } else { -1 };
                let mut error_message = None;
                if version >= 8 {
                    let errors = r.array_len(6)?;
                    for _ in 0..errors {
                        r.i32()?;
                        r.nullable_string()?;
                    }
                    error_message = r.nullable_string()?;
                }
                partitions.push(ProducePartitionResponse {
                    index,
                    error,
                    base_offset,
                    log_append_time_ms,
                    log_start_offset,
                    error_message,
                });
            }
            topics.push(ProduceTopicResponse { name, partitions });
        }
        let throttle_time_ms = r.i32()?;
        Ok(Self { topics, throttle_time_ms })
    }
}

/// Maps a received code back onto our enum (client side); unknown codes read
/// as UNKNOWN_SERVER_ERROR.
pub fn error_from_code(code: i16) -> ErrorCode {
    super::error::from_code(code)
}
