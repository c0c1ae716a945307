//! The controller quorum's shell on one machine (issue 29): it drives the
//! sans-IO `QuorumEngine`, keeps its state in `RaftLog`, carries its
//! messages over TCP to the other voters and learners, replays committed
//! record batches into the `ClusterImage`, and runs the controller's
//! decisions when this machine leads.
//!
//! Threads, not a Kafka core: the quorum's traffic is small, but an fsync or
//! an election must never stall a core that serves clients. One loop thread
//! owns the engine, the log and the image; a listener thread accepts peers
//! and a reader thread per connection feeds the loop; a writer thread per
//! peer connects out and sends. Every channel is bounded; a message that
//! finds its peer's queue full is dropped (Raft resends).
//!
//! Decisions (`submit`) run on the loop thread against the image the
//! controller will have once its proposals so far commit (KRaft keeps the
//! same speculative state), so two requests in flight never contradict each
//! other. Their answer waits for the commit. A batch that does not replay on
//! the committed image (a bug: decisions are checked first) is skipped whole
//! on every machine alike, and its proposer hears it failed.
//!
//! A request may be sent to any machine (`ControllerHandle::request`): a
//! follower forwards it to the controller, which decides it with the
//! `Decider` given at start, commits the records and sends the answer
//! back, as Kafka's brokers forward admin requests to the active
//! controller. A forwarded request the controller never answers fails
//! after `FORWARD_TIMEOUT`.
//!
//! Wire frame on the controller port, both ways:
//!
//! ```text
//! 0   4  length n of what follows (u32 LE), at most FRAME_BYTES_MAX
//! 4   8  sender's machine id (u64 LE)
//! 12  1  kind: 0 raft message, 1 forwarded request, 2 answer
//! 13  -  kind 0: a prost raft Message
//!        kind 1: request id (u64 LE), the request's bytes
//!        kind 2: request id (u64 LE), status (u8: 0 answered, 1 not the
//!                controller, 2 failed), the answer's bytes or the reason
//! ```
//!
//! Nothing authenticates the sender yet: the security issue (32) puts the
//! controller port behind mTLS. Until then it must only be reachable by the
//! cluster's machines.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ids::MachineId;
use super::image::{Changes, ClusterImage, MetadataDelta, Provenance};
use super::quorum::{
    decode_message, encode_message, Applied, Command, Event, Message, ProposalError, ProposalToken, QuorumConfig,
    QuorumEngine, TICK_MS,
};
use super::raft_log::{RaftLog, RaftLogError};
use super::records::{decode_batch, encode_batch, MetadataRecord};

/// Entries applied between snapshots of the image: the Raft log (and a
/// restart's replay) stays this short.
pub const SNAPSHOT_ENTRIES_DEFAULT: u64 = 4096;
/// A request forwarded to the controller fails after this long unanswered.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
const FRAME_RAFT: u8 = 0;
const FRAME_REQUEST: u8 = 1;
const FRAME_ANSWER: u8 = 2;
const ANSWER_OK: u8 = 0;
const ANSWER_NOT_CONTROLLER: u8 = 1;
const ANSWER_FAILED: u8 = 2;
/// A peer frame larger than this closes the connection.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Outgoing messages queued per peer; more are dropped.
const PEER_QUEUE_DEPTH: usize = 1024;
/// Events (messages, requests) queued for the loop.
const EVENT_QUEUE_DEPTH: usize = 4096;
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const RECONNECT_DELAY: Duration = Duration::from_millis(100);

/// One machine's place in the quorum.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub machine: MachineId,
    /// Every voter with its controller address, this machine included when
    /// it votes.
    pub voters: Vec<(MachineId, SocketAddr)>,
    pub learners: Vec<(MachineId, SocketAddr)>,
    /// Where this machine's controller port listens; `None` for a quorum
    /// of this machine alone, which needs no port.
    pub listen: Option<SocketAddr>,
    /// `__cluster` in the data directory.
    pub dir: PathBuf,
    /// Snapshot the image and compact the log every this many applied
    /// entries (`SNAPSHOT_ENTRIES_DEFAULT`).
    pub snapshot_entries: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    Log(#[from] RaftLogError),
    #[error("controller quorum: {0}")]
    Quorum(String),
    #[error("controller port {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("metadata snapshot: {0}")]
    Snapshot(String),
}

/// Why a submitted decision did not commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("{0}")]
    Proposal(ProposalError),
    #[error("the committed batch did not replay: {0}")]
    NotApplied(String),
    #[error("the controller service stopped")]
    Stopped,
    #[error("the controller did not answer a forwarded request in time")]
    TimedOut,
    #[error("the controller refused: {0}")]
    Remote(String),
}

/// Decides a request (its bytes, as the caller encoded it) on the
/// controller: the records to commit and the answer's bytes, given once
/// they commit.
pub type Decider = Arc<dyn Fn(&ClusterImage, &[u8]) -> (Vec<MetadataRecord>, Vec<u8>) + Send + Sync>;

/// Where a request's answer goes.
type AnswerSender = flume::Sender<Result<Vec<u8>, SubmitError>>;

/// Who waits for a committed proposal's answer.
enum Origin {
    Local(flume::Sender<Result<u64, SubmitError>>),
    LocalRequest(AnswerSender, Vec<u8>),
    Remote { machine: MachineId, id: u64, answer: Vec<u8> },
}

/// What the quorum looks like from this machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuorumStatus {
    pub term: u64,
    pub leader: Option<MachineId>,
    pub commit_index: u64,
    pub applied: Provenance,
    pub voters: Vec<MachineId>,
    pub learners: Vec<MachineId>,
    /// Each member's matched log end, on the leader; empty elsewhere.
    pub progress: Vec<(MachineId, u64)>,
    /// This machine's last log index.
    pub last_index: u64,
}

/// A decision run against the controller's image; its records are proposed
/// and its answer `T` is given once they commit.
pub type Decide<T> = Box<dyn FnOnce(&ClusterImage) -> (Vec<MetadataRecord>, T) + Send>;

/// Where committed images go, with what changed.
type Subscriber = flume::Sender<(Arc<ClusterImage>, Changes)>;
/// A decision as the loop runs it: the records to propose.
type DecideRecords = Box<dyn FnOnce(&ClusterImage) -> Vec<MetadataRecord> + Send>;

/// The handle the rest of the process holds.
#[derive(Clone)]
pub struct ControllerHandle {
    events: flume::Sender<LoopEvent>,
    shared: Arc<Shared>,
}

struct Shared {
    image: Mutex<Arc<ClusterImage>>,
    status: Mutex<QuorumStatus>,
    subscribers: Mutex<Vec<Subscriber>>,
}

enum LoopEvent {
    Peer { from: MachineId, message: Box<Message> },
    Unreachable(MachineId),
    Submit { decide: DecideRecords, reply: flume::Sender<Result<u64, SubmitError>> },
    Request { body: Vec<u8>, reply: AnswerSender },
    Forwarded { from: MachineId, id: u64, body: Vec<u8> },
    Answer { id: u64, status: u8, body: Vec<u8> },
    Stop,
}

/// The running service: its threads stop when it is dropped.
pub struct ControllerService {
    handle: ControllerHandle,
    threads: Vec<JoinHandle<()>>,
    listen: Option<SocketAddr>,
    stopping: Arc<AtomicBool>,
}

impl ControllerService {
    /// Opens the log, binds the controller port and starts the threads.
    pub fn start(config: ServiceConfig, decider: Option<Decider>) -> Result<Self, ServiceError> {
        let log = RaftLog::open(&config.dir)?;
        let ids = |list: &[(MachineId, SocketAddr)]| list.iter().map(|(id, _)| *id).collect::<Vec<_>>();
        let mut quorum = QuorumConfig::new(config.machine, ids(&config.voters), ids(&config.learners));
        // Machines must not draw the same election timeouts: `id ^ time`
        // collides for ids 2 and 3 started a millisecond apart, and two
        // machines that always time out together split every vote.
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        quorum.election_seed = config.machine.get().wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ nanos;
        let (engine, first) =
            QuorumEngine::open(quorum, log.durable().clone()).map_err(|e| ServiceError::Quorum(e.to_string()))?;
        let listener = match config.listen {
            Some(addr) => {
                let listener = TcpListener::bind(addr).map_err(|source| ServiceError::Listen { addr, source })?;
                let bound = listener.local_addr().map_err(|source| ServiceError::Listen { addr, source })?;
                Some((listener, bound))
            }
            None => None,
        };
        let listen = listener.as_ref().map(|(_, bound)| *bound);
        let (events_tx, events_rx) = flume::bounded(EVENT_QUEUE_DEPTH);
        let shared = Arc::new(Shared {
            image: Mutex::new(Arc::new(ClusterImage::default())),
            status: Mutex::new(QuorumStatus::default()),
            subscribers: Mutex::new(Vec::new()),
        });
        {
            let mut status = shared.status.lock().expect("not poisoned");
            status.voters = ids(&config.voters);
            status.learners = ids(&config.learners);
        }
        let handle = ControllerHandle { events: events_tx.clone(), shared: shared.clone() };
        let mut threads = Vec::new();
        let mut peers = BTreeMap::new();
        for (id, addr) in config.voters.iter().chain(&config.learners) {
            if *id == config.machine {
                continue;
            }
            let (tx, rx) = flume::bounded::<Vec<u8>>(PEER_QUEUE_DEPTH);
            peers.insert(*id, tx);
            let (peer, addr, events) = (*id, *addr, events_tx.clone());
            threads.push(spawn(&format!("shardlog-ctl-to-{id}"), move || write_to_peer(peer, addr, rx, events)));
        }
        let stopping = Arc::new(AtomicBool::new(false));
        if let Some((listener, _)) = listener {
            let (accept_events, accept_stopping) = (events_tx.clone(), stopping.clone());
            threads.push(spawn("shardlog-ctl-accept", move || accept_peers(listener, accept_events, accept_stopping)));
        }
        let snapshot_index = log.durable().snapshot.as_ref().map_or(0, |s| s.get_metadata().index);
        let mut state = LoopState {
            decider,
            forwarded: BTreeMap::new(),
            next_forward: 1,
            snapshot_index,
            snapshot_entries: config.snapshot_entries.max(1),
            engine,
            log,
            peers,
            committed: ClusterImage::default(),
            speculative: None,
            waiting: BTreeMap::new(),
            replayed: BTreeMap::new(),
            next_token: 1,
            shared,
        };
        state.run_commands(first);
        threads.push(spawn("shardlog-controller", move || state.run(events_rx)));
        Ok(Self { handle, threads, listen, stopping })
    }

    pub fn handle(&self) -> ControllerHandle {
        self.handle.clone()
    }

    /// The bound controller address (the port, when 0 was asked).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen
    }
}

impl Drop for ControllerService {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.handle.events.send(LoopEvent::Stop);
        // Unblocks the accept loop.
        if let Some(listen) = self.listen {
            let _ = TcpStream::connect_timeout(&listen, CONNECT_TIMEOUT);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl ControllerHandle {
    /// Runs `decide` on the controller's image, proposes its records and
    /// waits for them to commit; then answers with the decision's `T`.
    /// A decision with no records answers at once.
    pub async fn submit<T: Send + 'static>(&self, decide: Decide<T>) -> Result<T, SubmitError> {
        let answer = Arc::new(Mutex::new(None));
        let slot = answer.clone();
        let decide = Box::new(move |image: &ClusterImage| {
            let (records, value) = decide(image);
            *slot.lock().expect("not poisoned") = Some(value);
            records
        });
        let (reply, wait) = flume::bounded(1);
        self.events.send_async(LoopEvent::Submit { decide, reply }).await.map_err(|_| SubmitError::Stopped)?;
        wait.recv_async().await.map_err(|_| SubmitError::Stopped)??;
        let value = answer.lock().expect("not poisoned").take();
        value.ok_or(SubmitError::Stopped)
    }

    /// Has the controller decide `body` with its `Decider`, wherever the
    /// controller runs (a follower forwards it), and answers once the
    /// records commit.
    pub async fn request(&self, body: Vec<u8>) -> Result<Vec<u8>, SubmitError> {
        let (reply, wait) = flume::bounded(1);
        self.events.send_async(LoopEvent::Request { body, reply }).await.map_err(|_| SubmitError::Stopped)?;
        wait.recv_async().await.map_err(|_| SubmitError::Stopped)?
    }

    /// The last committed image.
    pub fn image(&self) -> Arc<ClusterImage> {
        self.shared.image.lock().expect("not poisoned").clone()
    }

    pub fn status(&self) -> QuorumStatus {
        self.shared.status.lock().expect("not poisoned").clone()
    }

    /// Every image committed from now on, with what changed.
    pub fn subscribe(&self, depth: usize) -> flume::Receiver<(Arc<ClusterImage>, Changes)> {
        let (tx, rx) = flume::bounded(depth);
        self.shared.subscribers.lock().expect("not poisoned").push(tx);
        rx
    }
}

struct LoopState {
    decider: Option<Decider>,
    /// Requests this machine forwarded to the controller, by id.
    forwarded: BTreeMap<u64, (AnswerSender, Instant)>,
    next_forward: u64,
    /// The index of the last snapshot the log holds.
    snapshot_index: u64,
    snapshot_entries: u64,
    engine: QuorumEngine,
    log: RaftLog,
    peers: BTreeMap<MachineId, flume::Sender<Vec<u8>>>,
    committed: ClusterImage,
    /// The leader's image with its uncommitted proposals replayed.
    speculative: Option<ClusterImage>,
    waiting: BTreeMap<ProposalToken, Origin>,
    /// Whether each committed index replayed, until its proposal is answered.
    replayed: BTreeMap<u64, Result<(), String>>,
    next_token: u64,
    shared: Arc<Shared>,
}

impl LoopState {
    fn run(mut self, events: flume::Receiver<LoopEvent>) {
        let tick = Duration::from_millis(TICK_MS);
        let mut next_tick = Instant::now() + tick;
        loop {
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + tick;
                let commands = self.engine.step(Event::Tick);
                self.run_commands(commands);
                self.expire_forwarded();
                continue;
            }
            match events.recv_timeout(next_tick - now) {
                Ok(LoopEvent::Stop) | Err(flume::RecvTimeoutError::Disconnected) => return,
                Ok(event) => self.handle(event),
                Err(flume::RecvTimeoutError::Timeout) => {}
            }
        }
    }

    fn handle(&mut self, event: LoopEvent) {
        let commands = match event {
            LoopEvent::Peer { from, message } => self.engine.step(Event::Message { from, message }),
            LoopEvent::Unreachable(to) => self.engine.step(Event::Unreachable { to }),
            LoopEvent::Submit { decide, reply } => {
                if !self.engine.is_leader() {
                    let leader = self.engine.leader();
                    let _ = reply.send(Err(SubmitError::Proposal(ProposalError::NotController { leader })));
                    return;
                }
                let base = self.speculative.get_or_insert_with(|| self.committed.clone());
                let records = decide(base);
                if records.is_empty() {
                    let _ = reply.send(Ok(self.committed.provenance.offset));
                    return;
                }
                // Replays on the speculative image so the next decision sees
                // it, at the index the entry will get (a machine's epoch is
                // the index of its registration).
                let mut delta = MetadataDelta::new(base);
                let at = Provenance { offset: self.engine.last_index() + 1, epoch: self.engine.term() };
                if let Some(err) = records.iter().find_map(|r| delta.replay(at, r).err()) {
                    let _ = reply.send(Err(SubmitError::NotApplied(err.to_string())));
                    return;
                }
                self.speculative = Some(delta.finish().0);
                let token = ProposalToken(self.next_token);
                self.next_token += 1;
                self.waiting.insert(token, Origin::Local(reply));
                self.engine.step(Event::Propose { token, data: encode_batch(&records) })
            }
            LoopEvent::Request { body, reply } => {
                if self.engine.is_leader() {
                    return self.decide_request(&body, |answer| Origin::LocalRequest(reply, answer));
                }
                let Some(leader) = self.engine.leader() else {
                    let error = ProposalError::NotController { leader: None };
                    let _ = reply.send(Err(SubmitError::Proposal(error)));
                    return;
                };
                let id = self.next_forward;
                self.next_forward += 1;
                self.forwarded.insert(id, (reply, Instant::now() + FORWARD_TIMEOUT));
                let mut frame = id.to_le_bytes().to_vec();
                frame.extend_from_slice(&body);
                self.send_frame(leader, FRAME_REQUEST, &frame);
                return;
            }
            LoopEvent::Forwarded { from, id, body } => {
                if !self.engine.is_leader() {
                    let leader = self.engine.leader().map_or(0, MachineId::get);
                    self.send_answer(from, id, ANSWER_NOT_CONTROLLER, &leader.to_le_bytes());
                    return;
                }
                return self.decide_request(&body, |answer| Origin::Remote { machine: from, id, answer });
            }
            LoopEvent::Answer { id, status, body } => {
                let Some((reply, _)) = self.forwarded.remove(&id) else { return };
                let outcome = match status {
                    ANSWER_OK => Ok(body),
                    ANSWER_NOT_CONTROLLER => {
                        let leader = body.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
                        let leader = leader.and_then(MachineId::new);
                        Err(SubmitError::Proposal(ProposalError::NotController { leader }))
                    }
                    _ => Err(SubmitError::Remote(String::from_utf8_lossy(&body).into_owned())),
                };
                let _ = reply.send(outcome);
                return;
            }
            LoopEvent::Stop => return,
        };
        self.run_commands(commands);
    }

    fn run_commands(&mut self, commands: Vec<Command>) {
        let mut queue = std::collections::VecDeque::from(commands);
        while let Some(command) = queue.pop_front() {
            match command {
                Command::Send { to, message } => self.send(to, &message),
                Command::Persist(persist) => {
                    if let Err(err) = self.log.persist(&persist) {
                        // Acknowledging what is not durable would break
                        // Raft: stop this machine's quorum member instead.
                        tracing::error!(error = %err, "controller log write failed; the controller stops");
                        std::process::exit(1);
                    }
                    queue.extend(self.engine.step(Event::PersistDone { number: persist.number }));
                }
                Command::Apply(applied) => self.apply(applied),
                Command::ProposalCommitted { token, index } => {
                    let outcome = match self.replayed.remove(&index) {
                        Some(Err(reason)) => Err(SubmitError::NotApplied(reason)),
                        _ => Ok(index),
                    };
                    if let Some(origin) = self.waiting.remove(&token) {
                        self.answer(origin, outcome);
                    }
                }
                Command::ProposalFailed { token, error } => {
                    self.speculative = None;
                    if let Some(origin) = self.waiting.remove(&token) {
                        self.answer(origin, Err(SubmitError::Proposal(error)));
                    }
                }
                Command::LeaderChanged { term, leader } => {
                    if leader != Some(self.engine.machine()) {
                        self.speculative = None;
                    }
                    if let Some(leader) = leader {
                        tracing::info!(term, controller = %leader, machine = %self.engine.machine(), "controller elected");
                    }
                    let mut status = self.shared.status.lock().expect("not poisoned");
                    status.term = term;
                    status.leader = leader;
                }
            }
        }
        self.snapshot_if_due();
        let mut status = self.shared.status.lock().expect("not poisoned");
        status.commit_index = self.engine.commit_index();
        status.applied = self.committed.provenance;
        status.progress = self.engine.progress();
        status.last_index = self.engine.last_index();
    }

    /// Snapshots the committed image into the log once enough entries were
    /// applied since the last snapshot; the entries it covers go.
    fn snapshot_if_due(&mut self) {
        let applied = self.engine.applied_index();
        if applied < self.snapshot_index + self.snapshot_entries {
            return;
        }
        let image = super::image::encode_snapshot(&self.committed);
        let snapshot = match self.engine.compact(applied, image) {
            Ok(snapshot) => snapshot,
            Err(err) => {
                tracing::warn!(error = %err, applied, "metadata snapshot refused by the quorum engine");
                return;
            }
        };
        if let Err(err) = self.log.compact(&snapshot) {
            tracing::error!(error = %err, "controller log write failed; the controller stops");
            std::process::exit(1);
        }
        tracing::debug!(index = applied, "metadata snapshot taken");
        self.snapshot_index = applied;
    }

    fn apply(&mut self, applied: Applied) {
        let (next, changes) = match applied {
            Applied::Entry { data, .. } if data.is_empty() => return,
            Applied::Entry { index, term, data } => {
                let at = Provenance { offset: index, epoch: term };
                let replayed = decode_batch(&data).map_err(|e| e.to_string()).and_then(|records| {
                    let mut delta = MetadataDelta::new(&self.committed);
                    for record in &records {
                        delta.replay(at, record).map_err(|e| e.to_string())?;
                    }
                    Ok(delta.finish())
                });
                match replayed {
                    Ok(done) => {
                        self.replayed.insert(index, Ok(()));
                        done
                    }
                    Err(reason) => {
                        tracing::error!(index, %reason, "a committed metadata batch does not replay; skipped");
                        self.replayed.insert(index, Err(reason));
                        return;
                    }
                }
            }
            Applied::Snapshot { data, .. } => match super::image::decode_snapshot(&data) {
                Ok(image) => (image, Changes::default()),
                Err(err) => {
                    tracing::error!(error = %err, "a metadata snapshot does not decode; the controller stops");
                    std::process::exit(1);
                }
            },
        };
        if self.replayed.len() > EVENT_QUEUE_DEPTH {
            let keep_from = self.engine.commit_index().saturating_sub(EVENT_QUEUE_DEPTH as u64);
            self.replayed.retain(|index, _| *index >= keep_from);
        }
        self.committed = next;
        if self.waiting.is_empty() {
            // Nothing of ours in flight: the next decision starts from what
            // committed (which may hold a former leader's entries).
            self.speculative = None;
        }
        let image = Arc::new(self.committed.clone());
        *self.shared.image.lock().expect("not poisoned") = image.clone();
        self.shared
            .subscribers
            .lock()
            .expect("not poisoned")
            // A subscriber that is behind misses this one and reads the
            // latest image when it catches up; only a gone one is dropped.
            .retain(|subscriber| {
                !matches!(
                    subscriber.try_send((image.clone(), changes.clone())),
                    Err(flume::TrySendError::Disconnected(_))
                )
            });
    }

    fn send(&self, to: MachineId, message: &Message) {
        self.send_frame(to, FRAME_RAFT, &encode_message(message));
    }

    fn send_frame(&self, to: MachineId, kind: u8, body: &[u8]) {
        let Some(queue) = self.peers.get(&to) else { return };
        let mut frame = Vec::with_capacity(13 + body.len());
        frame.extend_from_slice(&((9 + body.len()) as u32).to_le_bytes());
        frame.extend_from_slice(&self.engine.machine().get().to_le_bytes());
        frame.push(kind);
        frame.extend_from_slice(body);
        let _ = queue.try_send(frame);
    }

    fn send_answer(&self, to: MachineId, id: u64, status: u8, body: &[u8]) {
        let mut frame = id.to_le_bytes().to_vec();
        frame.push(status);
        frame.extend_from_slice(body);
        self.send_frame(to, FRAME_ANSWER, &frame);
    }

    /// Decides a request on the leader, proposes its records and remembers
    /// who waits for the answer.
    fn decide_request(&mut self, body: &[u8], origin: impl FnOnce(Vec<u8>) -> Origin) {
        let Some(decider) = self.decider.clone() else {
            let origin = origin(Vec::new());
            return self.answer(origin, Err(SubmitError::Remote("this controller decides no requests".into())));
        };
        let base = self.speculative.get_or_insert_with(|| self.committed.clone());
        let (records, answer) = decider(base, body);
        if records.is_empty() {
            let offset = self.committed.provenance.offset;
            return self.answer(origin(answer), Ok(offset));
        }
        let mut delta = MetadataDelta::new(base);
        let at = Provenance { offset: self.engine.last_index() + 1, epoch: self.engine.term() };
        if let Some(err) = records.iter().find_map(|r| delta.replay(at, r).err()) {
            return self.answer(origin(Vec::new()), Err(SubmitError::NotApplied(err.to_string())));
        }
        self.speculative = Some(delta.finish().0);
        let token = ProposalToken(self.next_token);
        self.next_token += 1;
        self.waiting.insert(token, origin(answer));
        let commands = self.engine.step(Event::Propose { token, data: encode_batch(&records) });
        self.run_commands(commands);
    }

    /// Gives a proposal's outcome to whoever waits for it.
    fn answer(&self, origin: Origin, outcome: Result<u64, SubmitError>) {
        match origin {
            Origin::Local(reply) => {
                let _ = reply.send(outcome);
            }
            Origin::LocalRequest(reply, answer) => {
                let _ = reply.send(outcome.map(|_| answer));
            }
            Origin::Remote { machine, id, answer } => match outcome {
                Ok(_) => self.send_answer(machine, id, ANSWER_OK, &answer),
                Err(SubmitError::Proposal(ProposalError::NotController { leader })) => {
                    let leader = leader.map_or(0, MachineId::get);
                    self.send_answer(machine, id, ANSWER_NOT_CONTROLLER, &leader.to_le_bytes())
                }
                Err(err) => self.send_answer(machine, id, ANSWER_FAILED, err.to_string().as_bytes()),
            },
        }
    }

    /// Fails forwarded requests the controller has not answered in time.
    fn expire_forwarded(&mut self) {
        let now = Instant::now();
        let expired: Vec<u64> =
            self.forwarded.iter().filter(|(_, (_, deadline))| *deadline <= now).map(|(id, _)| *id).collect();
        for id in expired {
            if let Some((reply, _)) = self.forwarded.remove(&id) {
                let _ = reply.send(Err(SubmitError::TimedOut));
            }
        }
    }
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new().name(name.into()).spawn(body).expect("spawn a controller thread")
}

/// Connects to `peer` and sends its queue, reconnecting after errors.
fn write_to_peer(peer: MachineId, addr: SocketAddr, queue: flume::Receiver<Vec<u8>>, events: flume::Sender<LoopEvent>) {
    let mut stream: Option<TcpStream> = None;
    while let Ok(frame) = queue.recv() {
        if stream.is_none() {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(connected) => {
                    let _ = connected.set_nodelay(true);
                    stream = Some(connected);
                }
                Err(_) => {
                    let _ = events.try_send(LoopEvent::Unreachable(peer));
                    std::thread::sleep(RECONNECT_DELAY);
                    continue;
                }
            }
        }
        if let Some(connected) = &mut stream {
            if connected.write_all(&frame).is_err() {
                let _ = connected.shutdown(Shutdown::Both);
                stream = None;
                let _ = events.try_send(LoopEvent::Unreachable(peer));
            }
        }
    }
}

fn accept_peers(listener: TcpListener, events: flume::Sender<LoopEvent>, stopping: Arc<AtomicBool>) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let events = events.clone();
        spawn("shardlog-ctl-from", move || read_from_peer(stream, events));
    }
}

/// Reads frames until the peer closes or sends a bad one.
fn read_from_peer(mut stream: TcpStream, events: flume::Sender<LoopEvent>) {
    let mut header = [0u8; 13];
    loop {
        if stream.read_exact(&mut header).is_err() {
            return;
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let from = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
        let kind = header[12];
        if !(9..=FRAME_BYTES_MAX).contains(&len) {
            tracing::warn!(len, "controller port: a frame of an impossible length; closing");
            return;
        }
        let mut body = vec![0u8; len - 9];
        if stream.read_exact(&mut body).is_err() {
            return;
        }
        let Some(from) = MachineId::new(from) else {
            tracing::warn!("controller port: a frame from machine 0; closing");
            return;
        };
        let event = match kind {
            FRAME_RAFT => match decode_message(&body) {
                Ok(message) => LoopEvent::Peer { from, message: Box::new(message) },
                Err(_) => {
                    tracing::warn!(%from, "controller port: a raft message that does not decode; closing");
                    return;
                }
            },
            FRAME_REQUEST | FRAME_ANSWER if body.len() >= 8 + usize::from(kind == FRAME_ANSWER) => {
                let id = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                if kind == FRAME_REQUEST {
                    LoopEvent::Forwarded { from, id, body: body[8..].to_vec() }
                } else {
                    LoopEvent::Answer { id, status: body[8], body: body[9..].to_vec() }
                }
            }
            _ => {
                tracing::warn!(%from, kind, "controller port: a frame of an unknown kind; closing");
                return;
            }
        };
        if events.send(event).is_err() {
            return;
        }
    }
}
