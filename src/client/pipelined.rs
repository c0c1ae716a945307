//! An asynchronous, pipelined Kafka client for glommio executors: the load
//! generator's client. Everything here lives on the core that created it
//! (`Rc`, not `Send`).
//!
//! A [`Connection`] keeps up to `in_flight` requests outstanding on one TCP
//! connection. Kafka answers the requests of a connection in order, so
//! responses are matched to requests by position, and the correlation id
//! only checks it. Two tasks per connection: a writer that sends the queued
//! frames with few vectored sends, and a reader that hands each response to
//! whoever waits for it.
//!
//! [`Cluster`] adds what a producer needs from the rest of the cluster:
//! ApiVersions (which version of each API to speak), Metadata (which node
//! leads which partition, as a [`Topology`]), CreateTopics and ListOffsets,
//! and one connection per node, so each partition's batch goes straight to
//! its leader. The codecs are the broker's own (`protocol`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use event_listener::Event;
use futures::channel::oneshot;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::sync::{Semaphore, StaticPermit};
use glommio::Task;

use super::{sasl_refused, ClientError};
use crate::protocol::api_versions::ApiVersionsResponse;
use crate::protocol::create_topics::{
    CreatableTopic, CreatableTopicConfig, CreatableTopicResult, CreateTopicsRequest, CreateTopicsResponse,
};
use crate::protocol::list_offsets::{ListOffsetsPartition, ListOffsetsRequest, ListOffsetsResponse, ListOffsetsTopic};
use crate::protocol::metadata::{MetadataRequest, MetadataResponse};
use crate::protocol::{ApiKey, DecodeResult, ErrorCode, Reader, Writer};

/// Responses larger than this are refused (a broken or hostile peer).
const RESPONSE_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Requests one connection may have outstanding.
pub const IN_FLIGHT_MAX: usize = 1024;

/// How a connection behaves.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    /// Requests outstanding at once (`--in-flight`).
    pub in_flight: usize,
    pub client_id: String,
    pub connect_timeout: Duration,
    /// Authenticate with SASL first (SaslHandshake v1, SaslAuthenticate v1).
    pub sasl: Option<SaslLogin>,
}

pub use crate::security::SaslLogin;

impl Default for ConnectionOptions {
    fn default() -> Self {
        Self {
            in_flight: 5,
            client_id: "shardlog-bench".into(),
            connect_timeout: Duration::from_secs(10),
            sasl: super::login(),
        }
    }
}

/// One pipelined connection to one broker node.
pub struct Connection {
    shared: Rc<Shared>,
    _reader: Task<()>,
    _writer: Task<()>,
}

/// A request that was queued and whose response has not been read yet.
pub struct PendingResponse {
    reply: oneshot::Receiver<Result<Reader, ClientError>>,
    address: Rc<str>,
}

impl PendingResponse {
    /// Waits for the response; the reader is past the response header.
    pub async fn wait(self) -> Result<Reader, ClientError> {
        match self.reply.await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Closed(format!("{}: connection dropped", self.address))),
        }
    }

    /// Waits for the response and decodes its body.
    pub async fn decode<T>(
        self,
        version: i16,
        decode: impl FnOnce(&mut Reader, i16) -> DecodeResult<T>,
    ) -> Result<T, ClientError> {
        let mut reader = self.wait().await?;
        Ok(decode(&mut reader, version)?)
    }
}

/// What the connection's caller, writer task and reader task share. Both
/// queues are bounded by `permits`: every entry holds one.
struct Shared {
    address: Rc<str>,
    client_id: String,
    /// `in_flight` permits: one per request queued or awaiting its response.
    permits: Rc<Semaphore>,
    in_flight: usize,
    correlation_id: Cell<i32>,
    /// Frames not yet written.
    outbox: RefCell<VecDeque<Outgoing>>,
    outbox_ready: Event,
    /// Requests written (or queued) whose response has not arrived, in wire order.
    pending: RefCell<VecDeque<Pending>>,
    failure: RefCell<Option<String>>,
}

/// A frame waiting for the writer. A request that gets no response (acks=0)
/// holds its permit until it is written, so those too stay bounded.
struct Outgoing {
    chunks: Vec<Bytes>,
    _permit: Option<StaticPermit>,
}

/// A request on the wire, waiting for its response.
struct Pending {
    correlation_id: i32,
    flexible_header: bool,
    reply: oneshot::Sender<Result<Reader, ClientError>>,
    _permit: StaticPermit,
}

impl Connection {
    pub async fn connect(address: &str, options: &ConnectionOptions) -> Result<Self, ClientError> {
        assert!((1..=IN_FLIGHT_MAX).contains(&options.in_flight), "in_flight out of range");
        let stream = TcpStream::connect_timeout(address, options.connect_timeout)
            .await
            .map_err(|e| ClientError::Closed(format!("{address}: connect: {e}")))?;
        stream.set_nodelay(true).map_err(|e| ClientError::Closed(format!("{address}: nodelay: {e}")))?;
        let socket = stream.as_raw_fd();
        let (reader, writer) = futures_lite::io::split(stream);
        let shared = Rc::new(Shared {
            address: Rc::from(address),
            client_id: options.client_id.clone(),
            permits: Rc::new(Semaphore::new(options.in_flight as u64)),
            in_flight: options.in_flight,
            correlation_id: Cell::new(0),
            outbox: RefCell::new(VecDeque::new()),
            outbox_ready: Event::new(),
            pending: RefCell::new(VecDeque::new()),
            failure: RefCell::new(None),
        });
        let reader = futures_lite::io::BufReader::with_capacity(256 * 1024, reader);
        let read_task = glommio::spawn_local(read_loop(shared.clone(), reader));
        let write_task = glommio::spawn_local(write_loop(shared.clone(), writer, socket));
        let connection = Self { shared, _reader: read_task, _writer: write_task };
        if let Some(login) = &options.sasl {
            connection.authenticate(login).await?;
        }
        Ok(connection)
    }

    /// Logs in: the handshake, then the mechanism's tokens.
    async fn authenticate(&self, login: &SaslLogin) -> Result<(), ClientError> {
        use crate::protocol::sasl::*;
        let name = login.mechanism.name().to_string();
        let encode = |w: &mut Writer| SaslHandshakeRequest { mechanism: name }.encode(w, 1);
        let handshake = self.call(ApiKey::SaslHandshake, 1, encode, SaslHandshakeResponse::decode).await?;
        if !handshake.error.is_ok() {
            return Err(sasl_refused(self.address(), &handshake.error, &handshake.mechanisms.join(", ")));
        }
        let mut exchange = login.exchange();
        let mut token = exchange.first();
        loop {
            let encode = |w: &mut Writer| SaslAuthenticateRequest { auth_bytes: token.into() }.encode(w, 1);
            let answer = self.call(ApiKey::SaslAuthenticate, 1, encode, SaslAuthenticateResponse::decode).await?;
            if !answer.error.is_ok() {
                return Err(sasl_refused(self.address(), &answer.error, &answer.error_message.unwrap_or_default()));
            }
            match exchange.next(&answer.auth_bytes).map_err(|e| ClientError::Closed(e.to_string()))? {
                Some(next) => token = next,
                None => return Ok(()),
            }
        }
    }

    pub fn address(&self) -> &str {
        &self.shared.address
    }

    /// Requests sent and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.shared.pending.borrow().len()
    }

    /// True when a request could be queued now, without waiting for one of
    /// the `in_flight` to be answered.
    pub fn has_room(&self) -> bool {
        self.shared.permits.available() > 0
    }

    /// Resolves once a request could be queued without waiting.
    pub async fn wait_room(&self) -> Result<(), ClientError> {
        drop(self.permit().await?);
        Ok(())
    }

    /// Queues a request once fewer than `in_flight` are outstanding, and
    /// returns the handle to its response. Requests go out in call order.
    pub async fn send(
        &self,
        api: ApiKey,
        version: i16,
        encode: impl FnOnce(&mut Writer),
    ) -> Result<PendingResponse, ClientError> {
        let permit = self.permit().await?;
        let correlation_id = self.next_correlation_id();
        let flexible = api.range().is_some_and(|r| version >= r.flexible_from);
        let chunks = self.frame(api, version, correlation_id, flexible, encode);
        let (reply, receiver) = oneshot::channel();
        // No await from here on: the pending entry and the frame are queued
        // together, so the order of `pending` is the order on the wire.
        let flexible_header = flexible && api != ApiKey::ApiVersions;
        self.shared.pending.borrow_mut().push_back(Pending { correlation_id, flexible_header, reply, _permit: permit });
        self.shared.outbox.borrow_mut().push_back(Outgoing { chunks, _permit: None });
        self.shared.outbox_ready.notify(1);
        Ok(PendingResponse { reply: receiver, address: self.shared.address.clone() })
    }

    /// Sends a request and waits for its response.
    pub async fn call<T>(
        &self,
        api: ApiKey,
        version: i16,
        encode: impl FnOnce(&mut Writer),
        decode: impl FnOnce(&mut Reader, i16) -> DecodeResult<T>,
    ) -> Result<T, ClientError> {
        self.send(api, version, encode).await?.decode(version, decode).await
    }

    /// Queues a request that gets no response (Produce with acks=0).
    pub async fn send_only(
        &self,
        api: ApiKey,
        version: i16,
        encode: impl FnOnce(&mut Writer),
    ) -> Result<(), ClientError> {
        let permit = self.permit().await?;
        let correlation_id = self.next_correlation_id();
        let flexible = api.range().is_some_and(|r| version >= r.flexible_from);
        let chunks = self.frame(api, version, correlation_id, flexible, encode);
        self.shared.outbox.borrow_mut().push_back(Outgoing { chunks, _permit: Some(permit) });
        self.shared.outbox_ready.notify(1);
        Ok(())
    }

    /// Waits until every queued request has been written and answered.
    pub async fn drain(&self) -> Result<(), ClientError> {
        let _all =
            self.shared.permits.acquire_permit(self.shared.in_flight as u64).await.map_err(|_| self.closed_error())?;
        Ok(())
    }

    async fn permit(&self) -> Result<StaticPermit, ClientError> {
        if self.shared.failure.borrow().is_some() {
            return Err(self.closed_error());
        }
        self.shared.permits.acquire_static_permit(1).await.map_err(|_| self.closed_error())
    }

    fn closed_error(&self) -> ClientError {
        let reason = self.shared.failure.borrow().clone().unwrap_or_else(|| "closed".into());
        ClientError::Closed(format!("{}: {reason}", self.shared.address))
    }

    fn next_correlation_id(&self) -> i32 {
        let id = self.shared.correlation_id.get().wrapping_add(1) & i32::MAX;
        self.shared.correlation_id.set(id);
        id
    }

    /// Header v1 (v2 for flexible requests), body, and the size prefix.
    fn frame(
        &self,
        api: ApiKey,
        version: i16,
        correlation_id: i32,
        flexible: bool,
        encode: impl FnOnce(&mut Writer),
    ) -> Vec<Bytes> {
        let mut w = Writer::new();
        w.i16(api as i16);
        w.i16(version);
        w.i32(correlation_id);
        w.nullable_string(Some(&self.shared.client_id));
        w.tagged_fields_v(flexible);
        encode(&mut w);
        let size = w.len();
        assert!(size <= i32::MAX as usize, "request frame too large");
        let mut chunks = Vec::with_capacity(4);
        chunks.push(Bytes::copy_from_slice(&(size as i32).to_be_bytes()));
        chunks.extend(w.into_chunks());
        chunks
    }
}

impl Shared {
    /// Fails every waiting request and refuses new ones.
    fn fail(&self, reason: String) {
        if self.failure.borrow().is_none() {
            *self.failure.borrow_mut() = Some(reason.clone());
        }
        self.permits.close();
        let pending: Vec<Pending> = self.pending.borrow_mut().drain(..).collect();
        for entry in pending {
            let _ = entry.reply.send(Err(ClientError::Closed(format!("{}: {reason}", self.address))));
        }
        self.outbox.borrow_mut().clear();
        self.outbox_ready.notify(usize::MAX);
    }

    fn failed(&self) -> bool {
        self.failure.borrow().is_some()
    }
}

async fn read_loop<R: futures_lite::AsyncRead + Unpin>(shared: Rc<Shared>, mut reader: R) {
    let mut buffer = BytesMut::new();
    let reason = loop {
        let frame = match read_frame(&mut reader, &mut buffer).await {
            Ok(frame) => frame,
            Err(reason) => break reason,
        };
        let Some(pending) = shared.pending.borrow_mut().pop_front() else {
            break "a response arrived for no request".to_string();
        };
        let mut body = Reader::from_frame(frame);
        let answer = match body.i32() {
            Ok(got) if got == pending.correlation_id => {
                if pending.flexible_header {
                    body.tagged_fields().map(|()| body).map_err(ClientError::from)
                } else {
                    Ok(body)
                }
            }
            Ok(got) => Err(ClientError::Correlation { expected: pending.correlation_id, got }),
            Err(e) => Err(ClientError::from(e)),
        };
        let broken = answer.is_err();
        let _ = pending.reply.send(answer);
        if broken {
            break "response out of order".to_string();
        }
    };
    shared.fail(reason);
}

/// Reads one response into `buffer`, whose memory is reused once the
/// frames read before it are dropped (no fresh pages to fault in per fetch).
async fn read_frame<R: futures_lite::AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
) -> Result<BytesMut, String> {
    let mut size = [0u8; 4];
    reader.read_exact(&mut size).await.map_err(|e| format!("read: {e}"))?;
    let size = i32::from_be_bytes(size);
    if size < 4 || size as usize > RESPONSE_BYTES_MAX {
        return Err(format!("response frame of {size} bytes"));
    }
    buffer.clear();
    buffer.resize(size as usize, 0);
    reader.read_exact(buffer).await.map_err(|e| format!("read: {e}"))?;
    Ok(buffer.split())
}

/// Writes the queued frames, all that are queued at once in one vectored
/// send where the socket takes them (`crate::net`).
async fn write_loop<W: futures_lite::AsyncWrite + Unpin>(shared: Rc<Shared>, mut writer: W, socket: RawFd) {
    // SAFETY: `writer`, a half of the stream, keeps its socket open for as
    // long as this loop runs, and `socket` is used only inside it.
    let socket = unsafe { BorrowedFd::borrow_raw(socket) };
    loop {
        let batch: Vec<Outgoing> = shared.outbox.borrow_mut().drain(..).collect();
        if batch.is_empty() {
            if shared.failed() {
                break;
            }
            let listener = shared.outbox_ready.listen();
            if shared.outbox.borrow().is_empty() && !shared.failed() {
                listener.await;
            }
            continue;
        }
        let pieces: Vec<&Bytes> = batch.iter().flat_map(|o| o.chunks.iter()).collect();
        if let Err(e) = crate::net::write_vectored(&mut writer, socket, &pieces).await {
            shared.fail(format!("write: {e}"));
            break;
        }
        drop(batch);
    }
    let _ = writer.close().await;
}

/// The versions this client speaks with one cluster: for each API, the
/// highest that both the broker and our (non-flexible) codecs know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    pub produce: i16,
    pub fetch: i16,
    pub list_offsets: i16,
    pub metadata: i16,
    pub create_topics: i16,
}

impl Versions {
    /// Picks versions from a broker's ApiVersions answer.
    pub fn negotiate(broker: &ApiVersionsResponse) -> Result<Self, ClientError> {
        let pick = |api: ApiKey| -> Result<i16, ClientError> {
            let ours = api.range().expect("every API the client uses is in SUPPORTED_APIS");
            let our_max = ours.version_max.min(ours.flexible_from - 1);
            let Some(theirs) = broker.apis.iter().find(|a| a.api_key == api as i16) else {
                return Err(ClientError::Unsupported(format!("broker does not serve {api:?}")));
            };
            let version = our_max.min(theirs.version_max);
            if version < ours.version_min.max(theirs.version_min) {
                return Err(ClientError::Unsupported(format!(
                    "{api:?}: broker serves {}..={}, we speak {}..={our_max}",
                    theirs.version_min, theirs.version_max, ours.version_min
                )));
            }
            Ok(version)
        };
        Ok(Self {
            produce: pick(ApiKey::Produce)?,
            fetch: pick(ApiKey::Fetch)?,
            list_offsets: pick(ApiKey::ListOffsets)?,
            metadata: pick(ApiKey::Metadata)?,
            create_topics: pick(ApiKey::CreateTopics)?,
        })
    }
}

/// Where one topic's partitions live: a snapshot of Metadata. Plain data, so
/// it can be handed to every core.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// Node id -> "host:port".
    pub nodes: BTreeMap<i32, String>,
    /// Leader node of each partition, by partition index.
    pub leaders: Vec<i32>,
}

impl Topology {
    pub fn leader(&self, partition: i32) -> Option<i32> {
        self.leaders.get(partition as usize).copied()
    }

    pub fn address(&self, node: i32) -> Option<&str> {
        self.nodes.get(&node).map(String::as_str)
    }
}

/// Connections to the nodes of one cluster, one per node, opened on first
/// use. Each producer and consumer of the load generator has its own.
pub struct Nodes {
    options: ConnectionOptions,
    addresses: RefCell<BTreeMap<i32, String>>,
    connections: RefCell<HashMap<i32, Rc<Connection>>>,
}

impl Nodes {
    pub fn new(addresses: BTreeMap<i32, String>, options: ConnectionOptions) -> Self {
        Self { options, addresses: RefCell::new(addresses), connections: RefCell::new(HashMap::new()) }
    }

    /// Adds or updates node addresses (from a newer Metadata answer).
    pub fn learn(&self, addresses: impl IntoIterator<Item = (i32, String)>) {
        self.addresses.borrow_mut().extend(addresses);
    }

    /// The connection to a node, opened on first use.
    pub async fn node(&self, node: i32) -> Result<Rc<Connection>, ClientError> {
        if let Some(connection) = self.connections.borrow().get(&node) {
            return Ok(connection.clone());
        }
        let address = self
            .addresses
            .borrow()
            .get(&node)
            .cloned()
            .ok_or_else(|| ClientError::Closed(format!("node {node} is not in the metadata")))?;
        let connection = Rc::new(Connection::connect(&address, &self.options).await?);
        // Another task may have connected meanwhile; keep the first.
        let mut connections = self.connections.borrow_mut();
        Ok(connections.entry(node).or_insert(connection).clone())
    }

    /// Every open connection.
    pub fn open(&self) -> Vec<Rc<Connection>> {
        self.connections.borrow().values().cloned().collect()
    }
}

/// A client of one cluster on one core: negotiated versions, the bootstrap
/// connection, and connections to the nodes that Metadata names.
pub struct Cluster {
    versions: Versions,
    bootstrap: Rc<Connection>,
    nodes: Nodes,
}

impl Cluster {
    /// Connects to any node and asks it which API versions it serves.
    pub async fn connect(bootstrap: &str, options: ConnectionOptions) -> Result<Self, ClientError> {
        let connection = Connection::connect(bootstrap, &options).await?;
        let answer = connection.call(ApiKey::ApiVersions, 0, |_| {}, ApiVersionsResponse::decode).await?;
        if !answer.error.is_ok() {
            return Err(ClientError::Unsupported(format!("ApiVersions answered {:?}", answer.error)));
        }
        let versions = Versions::negotiate(&answer)?;
        Ok(Self { versions, bootstrap: Rc::new(connection), nodes: Nodes::new(BTreeMap::new(), options) })
    }

    pub fn versions(&self) -> Versions {
        self.versions
    }

    pub fn bootstrap(&self) -> &Rc<Connection> {
        &self.bootstrap
    }

    pub async fn node(&self, node: i32) -> Result<Rc<Connection>, ClientError> {
        self.nodes.node(node).await
    }

    pub async fn metadata(&self, topics: Option<Vec<String>>) -> Result<MetadataResponse, ClientError> {
        let version = self.versions.metadata;
        let request = MetadataRequest { topics, allow_auto_topic_creation: false };
        let response = self
            .bootstrap
            .call(ApiKey::Metadata, version, |w| request.encode(w, version), MetadataResponse::decode)
            .await?;
        self.nodes.learn(response.brokers.iter().map(|b| (b.node_id, format!("{}:{}", b.host, b.port))));
        Ok(response)
    }

    /// The topic's partitions and leaders; `Ok(None)` while the topic does
    /// not exist or some partition has no leader yet.
    pub async fn topology(&self, topic: &str) -> Result<Option<Topology>, ClientError> {
        let response = self.metadata(Some(vec![topic.to_string()])).await?;
        let Some(found) = response.topics.iter().find(|t| t.name == topic) else {
            return Ok(None);
        };
        if !found.error.is_ok() || found.partitions.is_empty() {
            return Ok(None);
        }
        let mut leaders = vec![-1; found.partitions.len()];
        for partition in &found.partitions {
            let index = partition.index as usize;
            if index >= leaders.len() || partition.leader_id < 0 || !partition.error.is_ok() {
                return Ok(None);
            }
            leaders[index] = partition.leader_id;
        }
        let nodes: BTreeMap<i32, String> =
            response.brokers.iter().map(|b| (b.node_id, format!("{}:{}", b.host, b.port))).collect();
        if leaders.iter().any(|leader| !nodes.contains_key(leader)) {
            return Ok(None);
        }
        Ok(Some(Topology { nodes, leaders }))
    }

    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: &BTreeMap<String, String>,
    ) -> Result<CreatableTopicResult, ClientError> {
        let version = self.versions.create_topics;
        let request = CreateTopicsRequest {
            topics: vec![CreatableTopic {
                name: name.into(),
                num_partitions: partitions,
                replication_factor: -1,
                assignments: Vec::new(),
                configs: configs
                    .iter()
                    .map(|(k, v)| CreatableTopicConfig { name: k.clone(), value: Some(v.clone()) })
                    .collect(),
            }],
            timeout_ms: 30_000,
            validate_only: false,
        };
        let response = self
            .bootstrap
            .call(ApiKey::CreateTopics, version, |w| request.encode(w, version), CreateTopicsResponse::decode)
            .await?;
        Ok(response.topics.into_iter().next().unwrap_or(CreatableTopicResult {
            name: name.into(),
            error: ErrorCode::UnknownServerError,
            error_message: Some("empty CreateTopics response".into()),
        }))
    }

    /// ListOffsets for `partitions` of `topic` at `timestamp` (-1 latest,
    /// -2 earliest), each asked of its leader.
    pub async fn list_offsets(
        &self,
        topic: &str,
        topology: &Topology,
        partitions: &[i32],
        timestamp: i64,
    ) -> Result<BTreeMap<i32, i64>, ClientError> {
        let version = self.versions.list_offsets;
        let mut by_node: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for &partition in partitions {
            let leader = topology
                .leader(partition)
                .ok_or_else(|| ClientError::Closed(format!("partition {partition} has no leader")))?;
            by_node.entry(leader).or_default().push(partition);
        }
        let mut offsets = BTreeMap::new();
        for (node, indexes) in by_node {
            let request = ListOffsetsRequest {
                replica_id: -1,
                isolation_level: 0,
                topics: vec![ListOffsetsTopic {
                    name: topic.into(),
                    partitions: indexes
                        .iter()
                        .map(|&index| ListOffsetsPartition { index, current_leader_epoch: -1, timestamp })
                        .collect(),
                }],
            };
            let connection = self.node(node).await?;
            let response = connection
                .call(ApiKey::ListOffsets, version, |w| request.encode(w, version), ListOffsetsResponse::decode)
                .await?;
            for partition in response.topics.iter().flat_map(|t| &t.partitions) {
                if !partition.error.is_ok() {
                    return Err(ClientError::Unsupported(format!(
                        "ListOffsets {topic}/{}: {:?}",
                        partition.index, partition.error
                    )));
                }
                offsets.insert(partition.index, partition.offset);
            }
        }
        Ok(offsets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::api_versions::ApiVersionRange;

    fn broker(ranges: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
        ApiVersionsResponse {
            error: ErrorCode::None,
            apis: ranges
                .iter()
                .map(|&(key, version_min, version_max)| ApiVersionRange {
                    api_key: key as i16,
                    version_min,
                    version_max,
                })
                .collect(),
        }
    }

    #[test]
    fn negotiation_picks_the_highest_non_flexible_version_both_sides_know() {
        let kafka = broker(&[
            (ApiKey::Produce, 3, 11),
            (ApiKey::Fetch, 4, 17),
            (ApiKey::ListOffsets, 1, 9),
            (ApiKey::Metadata, 0, 12),
            (ApiKey::CreateTopics, 2, 7),
        ]);
        let versions = Versions::negotiate(&kafka).expect("compatible");
        assert_eq!(versions, Versions { produce: 8, fetch: 11, list_offsets: 5, metadata: 8, create_topics: 4 });
        let old = broker(&[
            (ApiKey::Produce, 0, 5),
            (ApiKey::Fetch, 0, 6),
            (ApiKey::ListOffsets, 0, 2),
            (ApiKey::Metadata, 0, 5),
            (ApiKey::CreateTopics, 0, 2),
        ]);
        let versions = Versions::negotiate(&old).expect("compatible");
        assert_eq!(versions, Versions { produce: 5, fetch: 6, list_offsets: 2, metadata: 5, create_topics: 2 });
    }

    #[test]
    fn negotiation_fails_without_a_common_version() {
        let ancient = broker(&[
            (ApiKey::Produce, 0, 2),
            (ApiKey::Fetch, 0, 3),
            (ApiKey::ListOffsets, 0, 0),
            (ApiKey::Metadata, 0, 1),
            (ApiKey::CreateTopics, 0, 1),
        ]);
        assert!(matches!(Versions::negotiate(&ancient), Err(ClientError::Unsupported(_))));
        let missing = broker(&[(ApiKey::Produce, 3, 8)]);
        assert!(matches!(Versions::negotiate(&missing), Err(ClientError::Unsupported(_))));
    }
}
