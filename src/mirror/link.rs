//! A blocking Kafka client of one cluster for the mirror: Metadata (which
//! node leads what), one connection per node, and the calls the mirror
//! makes. It speaks the broker's own codecs at versions every Kafka since
//! 2.1 (and shardlog) serves, so either side can be any Kafka-compatible
//! cluster. A call that fails drops its connection; the next call to that
//! node opens a new one.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;

use crate::client::{decode, ClientError, Connection};
use crate::protocol::fetch::{FetchPartition, FetchPartitionResponse, FetchRequest, FetchResponse, FetchTopic};
use crate::protocol::init_producer_id::{InitProducerIdRequest, InitProducerIdResponse};
use crate::protocol::list_offsets::{ListOffsetsPartition, ListOffsetsRequest, ListOffsetsResponse, ListOffsetsTopic};
use crate::protocol::metadata::{MetadataRequest, MetadataResponse};
use crate::protocol::produce::{ProducePartition, ProduceRequest, ProduceResponse, ProduceTopic};
use crate::protocol::record_batch::{self, encode_batch, ProducerFields, Record};
use crate::protocol::{ApiKey, ErrorCode, Reader, Writer};

const METADATA: i16 = 8;
const FETCH: i16 = 11;
const PRODUCE: i16 = 7;
const LIST_OFFSETS: i16 = 5;
const INIT_PRODUCER_ID: i16 = 1;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("{what}: {code:?}")]
    Kafka { what: String, code: ErrorCode },
    #[error("{0}")]
    Other(String),
}

pub type LinkResult<T> = Result<T, LinkError>;

/// The leader and partition count of each topic, from the last Metadata.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    pub leaders: HashMap<(String, i32), i32>,
    pub partitions: BTreeMap<String, i32>,
}

pub struct Link {
    bootstrap: Vec<String>,
    client_id: String,
    nodes: BTreeMap<i32, String>,
    connections: HashMap<i32, Connection>,
    pub layout: Layout,
}

impl Link {
    /// `bootstrap`: comma-separated host:port.
    pub fn new(bootstrap: &str, client_id: &str) -> Self {
        Self {
            bootstrap: bootstrap.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
            client_id: client_id.into(),
            nodes: BTreeMap::new(),
            connections: HashMap::new(),
            layout: Layout::default(),
        }
    }

    /// Metadata of `topics` (None: all) from any bootstrap or known node;
    /// updates the layout of the topics it names.
    pub fn metadata(&mut self, topics: Option<Vec<String>>) -> LinkResult<MetadataResponse> {
        let request = MetadataRequest { topics, allow_auto_topic_creation: false };
        let mut candidates: Vec<String> = self.bootstrap.clone();
        candidates.extend(self.nodes.values().cloned());
        let mut last = None;
        for address in candidates {
            let answer = Connection::connect(address.as_str(), CONNECT_TIMEOUT).and_then(|mut connection| {
                let reader = connection.request(ApiKey::Metadata, METADATA, |w| request.encode(w, METADATA))?;
                decode(reader, METADATA, MetadataResponse::decode)
            });
            match answer {
                Ok(response) => {
                    self.learn(&response);
                    return Ok(response);
                }
                Err(err) => last = Some(err),
            }
        }
        Err(last.map_or_else(|| LinkError::Other("no bootstrap address".into()), LinkError::Client))
    }

    fn learn(&mut self, response: &MetadataResponse) {
        for broker in &response.brokers {
            let address = format!("{}:{}", broker.host, broker.port);
            if self.nodes.get(&broker.node_id) != Some(&address) {
                self.connections.remove(&broker.node_id);
                self.nodes.insert(broker.node_id, address);
            }
        }
        for topic in &response.topics {
            if !topic.error.is_ok() {
                continue;
            }
            self.layout.partitions.insert(topic.name.clone(), topic.partitions.len() as i32);
            for p in &topic.partitions {
                self.layout.leaders.insert((topic.name.clone(), p.index), p.leader_id);
            }
        }
    }

    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        self.layout.leaders.get(&(topic.to_string(), partition)).copied().filter(|&leader| leader >= 0)
    }

    /// Forgets where `topic` lives (after NOT_LEADER and the like).
    pub fn forget(&mut self, topic: &str) {
        self.layout.leaders.retain(|(t, _), _| t != topic);
    }

    /// The leader of a partition, asking Metadata when it is not known.
    pub fn leader_or_refresh(&mut self, topic: &str, partition: i32) -> LinkResult<i32> {
        if let Some(leader) = self.leader(topic, partition) {
            return Ok(leader);
        }
        self.metadata(Some(vec![topic.to_string()]))?;
        self.leader(topic, partition).ok_or_else(|| LinkError::Kafka {
            what: format!("leader of {topic}-{partition}"),
            code: ErrorCode::LeaderNotAvailable,
        })
    }

    /// One request to one node; a failure drops the connection.
    pub fn call<T>(
        &mut self,
        node: i32,
        api: ApiKey,
        version: i16,
        encode: impl FnOnce(&mut Writer),
        decode_body: impl FnOnce(&mut Reader, i16) -> crate::protocol::DecodeResult<T>,
    ) -> LinkResult<T> {
        if !self.connections.contains_key(&node) {
            let address = self
                .nodes
                .get(&node)
                .cloned()
                .ok_or_else(|| LinkError::Other(format!("node {node} is not in the metadata")))?;
            let mut connection = Connection::connect(address.as_str(), CONNECT_TIMEOUT)?;
            connection.set_client_id(&self.client_id);
            self.connections.insert(node, connection);
        }
        let connection = self.connections.get_mut(&node).expect("inserted above");
        let answer = connection.request(api, version, encode).and_then(|reader| decode(reader, version, decode_body));
        if answer.is_err() {
            self.connections.remove(&node);
        }
        Ok(answer?)
    }

    /// A read_committed fetch of `partitions` (topic, partition, offset)
    /// from `node`.
    pub fn fetch(
        &mut self,
        node: i32,
        partitions: &[(String, i32, i64)],
        max_wait_ms: i32,
        partition_bytes: i32,
    ) -> LinkResult<FetchResponse> {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for (topic, index, offset) in partitions {
            let wanted = FetchPartition {
                index: *index,
                current_leader_epoch: -1,
                fetch_offset: *offset,
                log_start_offset: -1,
                partition_max_bytes: partition_bytes,
            };
            match topics.iter_mut().find(|t| &t.name == topic) {
                Some(t) => t.partitions.push(wanted),
                None => topics.push(FetchTopic { name: topic.clone(), partitions: vec![wanted] }),
            }
        }
        let request = FetchRequest {
            replica_id: -1,
            max_wait_ms,
            min_bytes: 1,
            max_bytes: 64 << 20,
            isolation_level: 1,
            session_id: 0,
            session_epoch: -1,
            topics,
            forgotten: Vec::new(),
            rack_id: String::new(),
        };
        self.call(node, ApiKey::Fetch, FETCH, |w| request.encode(w, FETCH), FetchResponse::decode)
    }

    /// One partition's records from `offset` (up to 4 MiB, no waiting),
    /// from its leader; a partition error is an error.
    pub fn fetch_partition(&mut self, topic: &str, partition: i32, offset: i64) -> LinkResult<FetchPartitionResponse> {
        let leader = self.leader_or_refresh(topic, partition)?;
        let answer = self.fetch(leader, &[(topic.to_string(), partition, offset)], 0, 4 << 20)?;
        let p = answer
            .topics
            .into_iter()
            .flat_map(|t| t.partitions)
            .next()
            .ok_or_else(|| LinkError::Other(format!("fetch {topic}-{partition}: empty answer")))?;
        if !p.error.is_ok() {
            self.forget(topic);
            return Err(LinkError::Kafka { what: format!("fetch {topic}-{partition} at {offset}"), code: p.error });
        }
        Ok(p)
    }

    /// One produce request (acks=all) to `node`: one batch per partition.
    pub fn produce(&mut self, node: i32, batches: Vec<(String, i32, Bytes)>) -> LinkResult<ProduceResponse> {
        let request = produce_request(batches);
        self.call(node, ApiKey::Produce, PRODUCE, |w| request.encode(w), ProduceResponse::decode)
    }

    /// Several produce requests (acks=all) to `node`, sent back to back
    /// before the first answer is read; answers in request order. After a
    /// connection failure the rest are errors too.
    pub fn produce_pipelined(
        &mut self,
        node: i32,
        requests: Vec<Vec<(String, i32, Bytes)>>,
    ) -> Vec<LinkResult<ProduceResponse>> {
        let count = requests.len();
        let failed = |why: &str| (0..count).map(|_| Err(LinkError::Other(why.to_string()))).collect::<Vec<_>>();
        if !self.connections.contains_key(&node) {
            let Some(address) = self.nodes.get(&node).cloned() else {
                return failed(&format!("node {node} is not in the metadata"));
            };
            match Connection::connect(address.as_str(), CONNECT_TIMEOUT) {
                Ok(mut connection) => {
                    connection.set_client_id(&self.client_id);
                    self.connections.insert(node, connection);
                }
                Err(err) => return failed(&err.to_string()),
            }
        }
        let connection = self.connections.get_mut(&node).expect("inserted above");
        let mut sent = Vec::with_capacity(count);
        for batches in requests {
            let request = produce_request(batches);
            match connection.send_request(ApiKey::Produce, PRODUCE, |w| request.encode(w)) {
                Ok(s) => sent.push(s),
                Err(_) => break,
            }
        }
        let mut out = Vec::with_capacity(count);
        let mut broken = sent.len() < count;
        for s in sent {
            let answer =
                connection.read_response(s).and_then(|reader| decode(reader, PRODUCE, ProduceResponse::decode));
            broken |= answer.is_err();
            out.push(answer.map_err(LinkError::Client));
        }
        while out.len() < count {
            out.push(Err(LinkError::Other(format!("node {node}: connection lost"))));
        }
        if broken {
            self.connections.remove(&node);
        }
        out
    }

    /// A new idempotent producer id and epoch.
    pub fn init_producer_id(&mut self) -> LinkResult<(i64, i16)> {
        if self.nodes.is_empty() {
            self.metadata(Some(Vec::new()))?;
        }
        let nodes: Vec<i32> = self.nodes.keys().copied().collect();
        let request = InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: -1 };
        let mut last = LinkError::Other("no node".into());
        for node in nodes {
            match self.call(
                node,
                ApiKey::InitProducerId,
                INIT_PRODUCER_ID,
                |w| request.encode(w, INIT_PRODUCER_ID),
                InitProducerIdResponse::decode,
            ) {
                Ok(answer) if answer.error.is_ok() => return Ok((answer.producer_id, answer.producer_epoch)),
                Ok(answer) => last = LinkError::Kafka { what: "InitProducerId".into(), code: answer.error },
                Err(err) => last = err,
            }
        }
        Err(last)
    }

    /// ListOffsets of one partition at `timestamp` (-1 latest: the high
    /// watermark; -2 earliest).
    pub fn list_offset(&mut self, topic: &str, partition: i32, timestamp: i64) -> LinkResult<i64> {
        let leader = self.leader_or_refresh(topic, partition)?;
        let request = ListOffsetsRequest {
            replica_id: -1,
            isolation_level: 0,
            topics: vec![ListOffsetsTopic {
                name: topic.into(),
                partitions: vec![ListOffsetsPartition { index: partition, current_leader_epoch: -1, timestamp }],
            }],
        };
        let answer = self.call(
            leader,
            ApiKey::ListOffsets,
            LIST_OFFSETS,
            |w| request.encode(w, LIST_OFFSETS),
            ListOffsetsResponse::decode,
        );
        let answer = match answer {
            Ok(answer) => answer,
            Err(err) => {
                self.forget(topic);
                return Err(err);
            }
        };
        let found = answer.topics.iter().flat_map(|t| &t.partitions).find(|p| p.index == partition);
        match found {
            Some(p) if p.error.is_ok() => Ok(p.offset),
            Some(p) => {
                self.forget(topic);
                Err(LinkError::Kafka { what: format!("ListOffsets {topic}-{partition}"), code: p.error })
            }
            None => Err(LinkError::Other(format!("ListOffsets {topic}-{partition}: no answer"))),
        }
    }

    /// Appends key/value records to a partition (acks=all, not
    /// idempotent: the mirror's own small topics, where a repeat is
    /// harmless); returns the base offset.
    pub fn append(&mut self, topic: &str, partition: i32, records: &[(Bytes, Bytes)]) -> LinkResult<i64> {
        let now = now_ms();
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| Record {
                key: Some(key.clone()),
                value: Some(value.clone()),
                headers: Vec::new(),
                timestamp_delta: 0,
                offset_delta: i as i32,
            })
            .collect();
        let batch = encode_batch(&records, now, ProducerFields::NONE);
        let leader = self.leader_or_refresh(topic, partition)?;
        let answer = match self.produce(leader, vec![(topic.to_string(), partition, batch)]) {
            Ok(answer) => answer,
            Err(err) => {
                self.forget(topic);
                return Err(err);
            }
        };
        let p = answer
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .next()
            .ok_or_else(|| LinkError::Other(format!("produce to {topic}: empty answer")))?;
        if !p.error.is_ok() {
            self.forget(topic);
            return Err(LinkError::Kafka { what: format!("produce to {topic}-{partition}"), code: p.error });
        }
        Ok(p.base_offset)
    }

    /// Every record (offset, key, value) of a partition from `from` to the
    /// high watermark, in order.
    pub fn read_all(&mut self, topic: &str, partition: i32, from: i64) -> LinkResult<Vec<(i64, Bytes, Bytes)>> {
        let end = self.list_offset(topic, partition, -1)?;
        let mut offset = from.max(self.list_offset(topic, partition, -2)?);
        let mut out = Vec::new();
        while offset < end {
            let p = self.fetch_partition(topic, partition, offset)?;
            let before = offset;
            for batch in &p.records {
                let Ok(header) = record_batch::BatchHeader::parse(batch, usize::MAX) else { break };
                if header.size_bytes > batch.len() {
                    break;
                }
                offset = offset.max(header.last_offset() + 1);
                if header.is_control() || header.compression() != 0 {
                    continue;
                }
                let Ok(records) = record_batch::decode_records(batch) else { continue };
                for record in records {
                    let at = header.base_offset + i64::from(record.offset_delta);
                    if at >= before {
                        out.push((at, record.key.unwrap_or_default(), record.value.unwrap_or_default()));
                    }
                }
            }
            if offset == before {
                break;
            }
        }
        Ok(out)
    }
}

/// A produce request (acks=all, 30 s) of one batch per partition.
fn produce_request(batches: Vec<(String, i32, Bytes)>) -> ProduceRequest {
    let mut topics: Vec<ProduceTopic> = Vec::new();
    for (topic, index, bytes) in batches {
        let partition = ProducePartition { index, records: Some(bytes) };
        match topics.iter_mut().find(|t| t.name == topic) {
            Some(t) => t.partitions.push(partition),
            None => topics.push(ProduceTopic { name: topic, partitions: vec![partition] }),
        }
    }
    ProduceRequest { transactional_id: None, acks: -1, timeout_ms: 30_000, topics }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
