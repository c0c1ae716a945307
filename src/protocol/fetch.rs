//! Fetch (key 1), versions 4–11. Record data in responses is a list of shared
//! `Bytes` (whole stored batches), written without copying. From v7 a
//! request names a fetch session (KIP-227; kept by `server::fetch_sessions`)
//! and lists only the partitions that changed, plus those to forget.

use bytes::Bytes;

use super::{error, DecodeResult, ErrorCode, Reader, Writer};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchRequest {
    pub replica_id: i32,
    pub max_wait_ms: i32,
    pub min_bytes: i32,
    pub max_bytes: i32,
    pub isolation_level: i8,
    pub session_id: i32,
    pub session_epoch: i32,
    pub topics: Vec<FetchTopic>,
    /// Partitions to drop from the session (v7+).
    pub forgotten: Vec<ForgottenTopic>,
    pub rack_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgottenTopic {
    pub name: String,
    pub partitions: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchTopic {
    pub name: String,
    pub partitions: Vec<FetchPartition>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        let mut forgotten = Vec::new();
        if version >= 7 {
            let topic_count = r.array_len(6)?;
            forgotten.reserve(topic_count);
            for _ in 0..topic_count {
                let name = r.string()?;
                let count = r.array_len(4)?;
                let mut partitions = Vec::with_capacity(count);
                for _ in 0..count {
                    partitions.push(r.i32()?);
                }
                forgotten.push(ForgottenTopic { name, partitions });
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
            forgotten,
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
            w.i32(self.forgotten.len() as i32);
            for topic in &self.forgotten {
                w.string(&topic.name);
                w.i32(topic.partitions.len() as i32);
                for &index in &topic.partitions {
                    w.i32(index);
                }
            }
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
    /// (producer id, first offset) of the aborted transactions in the
    /// answer (read_committed); decoded only, the broker has none.
    pub aborted_transactions: Vec<(i64, i64)>,
    /// v11: the replica the consumer should read from instead (KIP-392),
    /// -1 for this one.
    pub preferred_read_replica: i32,
}

impl FetchPartitionResponse {
    pub fn error(index: i32, error: ErrorCode) -> Self {
        Self {
            index,
            error,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            records: Vec::new(),
            aborted_transactions: Vec::new(),
            preferred_read_replica: -1,
        }
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
                    w.i32(p.preferred_read_replica);
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
                let mut aborted_transactions = Vec::with_capacity(aborted);
                for _ in 0..aborted {
                    aborted_transactions.push((r.i64()?, r.i64()?));
                }
                let preferred_read_replica = if version >= 11 { r.i32()? } else { -1 };
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
                    aborted_transactions,
                    preferred_read_replica,
                });
            }
            topics.push(FetchTopicResponse { name, partitions });
        }
        Ok(Self { throttle_time_ms, error, session_id, topics })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Writer;
    use bytes::BytesMut;
    use kafka_protocol::messages as oracle;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn request() -> FetchRequest {
        FetchRequest {
            replica_id: -1,
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 50 << 20,
            isolation_level: 0,
            session_id: 1234,
            session_epoch: 7,
            topics: vec![FetchTopic {
                name: "payments".into(),
                partitions: vec![FetchPartition {
                    index: 3,
                    current_leader_epoch: 2,
                    fetch_offset: 99,
                    log_start_offset: 5,
                    partition_max_bytes: 1 << 20,
                }],
            }],
            forgotten: vec![
                ForgottenTopic { name: "payments".into(), partitions: vec![0, 1] },
                ForgottenTopic { name: "refunds".into(), partitions: vec![4] },
            ],
            rack_id: "r1".into(),
        }
    }

    fn oracle_request(message: &FetchRequest) -> oracle::FetchRequest {
        let text = |s: &str| StrBytes::from_string(s.to_owned());
        let topics = message
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        oracle::fetch_request::FetchPartition::default()
                            .with_partition(p.index)
                            .with_current_leader_epoch(p.current_leader_epoch)
                            .with_fetch_offset(p.fetch_offset)
                            .with_log_start_offset(p.log_start_offset)
                            .with_partition_max_bytes(p.partition_max_bytes)
                    })
                    .collect();
                oracle::fetch_request::FetchTopic::default()
                    .with_topic(oracle::TopicName(text(&t.name)))
                    .with_partitions(partitions)
            })
            .collect();
        let forgotten = message
            .forgotten
            .iter()
            .map(|t| {
                oracle::fetch_request::ForgottenTopic::default()
                    .with_topic(oracle::TopicName(text(&t.name)))
                    .with_partitions(t.partitions.clone())
            })
            .collect();
        oracle::FetchRequest::default()
            .with_replica_id(oracle::BrokerId(message.replica_id))
            .with_max_wait_ms(message.max_wait_ms)
            .with_min_bytes(message.min_bytes)
            .with_max_bytes(message.max_bytes)
            .with_isolation_level(message.isolation_level)
            .with_session_id(message.session_id)
            .with_session_epoch(message.session_epoch)
            .with_topics(topics)
            .with_forgotten_topics_data(forgotten)
            .with_rack_id(text(&message.rack_id))
    }

    #[test]
    fn session_fields_and_forgotten_topics_match_kafka_protocol_crate_and_round_trip() {
        for version in 7..=11 {
            let message = request();
            let mut ours = Writer::new();
            message.encode(&mut ours, version);
            let ours = ours.into_bytes();
            let mut theirs = BytesMut::new();
            oracle_request(&message).encode(&mut theirs, version).expect("oracle encodes");
            assert_eq!(ours, theirs.freeze(), "v{version}");
            let decoded = FetchRequest::decode(&mut Reader::new(ours), version).unwrap();
            let mut expected = message.clone();
            if version < 9 {
                expected.topics[0].partitions[0].current_leader_epoch = -1;
            }
            if version < 11 {
                expected.rack_id = String::new();
            }
            assert_eq!(decoded, expected, "v{version}");
        }
    }

    #[test]
    fn a_forgotten_list_longer_than_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        FetchRequest { forgotten: Vec::new(), ..request() }.encode(&mut w, 7);
        let mut bytes = w.into_bytes().to_vec();
        // The forgotten-topics count is the last four bytes at v7.
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(FetchRequest::decode(&mut Reader::new(bytes.into()), 7).is_err());
    }
}
