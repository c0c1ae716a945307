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
//! Machines that are not voters follow the committed log as observers
//! (`observer`, like KRaft's brokers): they FETCH it from a voter, which
//! answers with the entries after the asker's offset (long-polled), or its
//! last snapshot when those were compacted away. Voters keep the entries
//! since their last snapshot in memory for this.
//!
//! Leases (KIP-631): every registered machine heartbeats to the controller
//! (`HEARTBEAT_EVERY`; an observer's fetch counts too). The controller
//! fences a machine it has not heard from for `MACHINE_LEASE`, and unfences
//! it when it is heard again with the same incarnation. A new controller
//! gives every machine a full lease from its election.
//!
//! The frames are in `wire`.
//!
//! Nothing authenticates the sender yet: the security issue (32) puts the
//! controller port behind mTLS. Until then it must only be reachable by the
//! cluster's machines.

use std::collections::{BTreeMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
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
use super::records::{encode_batch, MetadataRecord};
use super::wire::{self, Cursor, Fetched, Outbox};

/// Entries applied between snapshots of the image: the Raft log (and a
/// restart's replay) stays this short.
pub const SNAPSHOT_ENTRIES_DEFAULT: u64 = 4096;
/// A request forwarded to the controller fails after this long unanswered.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a registered machine tells the controller it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);
/// A machine the controller has not heard from for this long is fenced:
/// its partitions have no leader until it is heard again. Kafka's
/// `broker.session.timeout.ms` is 9 s, sized for JVM pauses; a shardlog
/// machine has none, and replication's failover (issue 30) waits on this.
pub const MACHINE_LEASE: Duration = Duration::from_millis(2000);
/// Refused probes of one machine in a row before the controller leaves it
/// to its lease (a machine that heartbeats while it opens thousands of
/// partitions before it listens is probed this many times, two heartbeat
/// periods apart).
const PROBE_ATTEMPTS: u32 = 40;
/// How often the controller moves leadership back to in-sync preferred
/// replicas (Kafka checks every 300 s), and at most how many partitions a
/// pass moves.
pub const LEADER_BALANCE_EVERY: Duration = Duration::from_secs(30);
const LEADER_BALANCE_MAX: usize = 1000;
/// A FETCH with nothing new waits this long for a commit before it is
/// answered empty (so an observer's fetches are also its heartbeats).
pub const FETCH_WAIT: Duration = Duration::from_millis(200);
/// Bytes of entries in one FETCHED answer (the first entry always goes).
const FETCH_BYTES_MAX: usize = 8 << 20;
/// Events (messages, requests) queued for the loop.
const EVENT_QUEUE_DEPTH: usize = 4096;
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const RECONNECT_DELAY: Duration = Duration::from_millis(100);

/// One machine's place in the quorum.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub machine: MachineId,
    /// Every voter with its controller address, this machine included when
    /// it votes. A machine that is neither a voter nor a learner is an
    /// observer: it follows the committed log by fetching it from a voter.
    pub voters: Vec<(MachineId, SocketAddr)>,
    pub learners: Vec<(MachineId, SocketAddr)>,
    /// Where this machine's controller port listens; `None` for a quorum
    /// of this machine alone, which needs no port, and for an observer.
    pub listen: Option<SocketAddr>,
    /// `__cluster` in the data directory.
    pub dir: PathBuf,
    /// Snapshot the image and compact the log every this many applied
    /// entries (`SNAPSHOT_ENTRIES_DEFAULT`).
    pub snapshot_entries: u64,
}

impl ServiceConfig {
    /// Whether this machine votes or learns through Raft; otherwise it
    /// observes.
    pub fn is_member(&self) -> bool {
        self.voters.iter().chain(&self.learners).any(|(id, _)| *id == self.machine)
    }
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

impl SubmitError {
    /// Whether trying again later may succeed: no controller yet, or it
    /// did not answer in time.
    pub fn is_retriable(&self) -> bool {
        matches!(self, Self::Proposal(ProposalError::NotController { .. }) | Self::TimedOut)
    }
}

/// Decides a request (its bytes, as the caller encoded it) on the
/// controller: the records to commit and the answer's bytes, given once
/// they commit.
pub type Decider = Arc<dyn Fn(&ClusterImage, &[u8]) -> (Vec<MetadataRecord>, Vec<u8>) + Send + Sync>;

/// Where a request's answer goes.
pub(crate) type AnswerSender = flume::Sender<Result<Vec<u8>, SubmitError>>;

/// Who waits for a committed proposal's answer.
enum Origin {
    Local(flume::Sender<Result<u64, SubmitError>>),
    LocalRequest(AnswerSender, Vec<u8>),
    Remote {
        reply: Outbox,
        id: u64,
        answer: Vec<u8>,
    },
    /// The controller's own (fencing): nobody waits.
    Controller,
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
    /// Whether this machine follows the log as an observer.
    pub observer: bool,
    /// The observers that fetched from this voter, with the offset each
    /// holds.
    pub observers: Vec<(MachineId, u64)>,
}

/// A decision run against the controller's image; its records are proposed
/// and its answer `T` is given once they commit.
pub type Decide<T> = Box<dyn FnOnce(&ClusterImage) -> (Vec<MetadataRecord>, T) + Send>;

/// Where committed images go, with what changed.
type Subscriber = flume::Sender<(Arc<ClusterImage>, Changes)>;
/// A decision as the loop runs it: the records to propose.
pub(crate) type DecideRecords = Box<dyn FnOnce(&ClusterImage) -> Vec<MetadataRecord> + Send>;

/// The handle the rest of the process holds.
#[derive(Clone)]
pub struct ControllerHandle {
    pub(crate) events: flume::Sender<LoopEvent>,
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    image: Mutex<Arc<ClusterImage>>,
    pub(crate) status: Mutex<QuorumStatus>,
    subscribers: Mutex<Vec<Subscriber>>,
}

impl Shared {
    pub(crate) fn new(status: QuorumStatus) -> Self {
        Self {
            image: Mutex::new(Arc::new(ClusterImage::default())),
            status: Mutex::new(status),
            subscribers: Mutex::new(Vec::new()),
        }
    }

    /// Makes `image` the committed one and hands it to every subscriber.
    pub(crate) fn publish(&self, image: Arc<ClusterImage>, changes: Changes) {
        *self.image.lock().expect("not poisoned") = image.clone();
        self.status.lock().expect("not poisoned").applied = image.provenance;
        self.subscribers
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
}

pub(crate) enum LoopEvent {
    Peer {
        from: MachineId,
        message: Box<Message>,
    },
    Unreachable(MachineId),
    Submit {
        decide: DecideRecords,
        reply: flume::Sender<Result<u64, SubmitError>>,
    },
    Request {
        body: Vec<u8>,
        reply: AnswerSender,
    },
    Forwarded {
        id: u64,
        body: Vec<u8>,
        reply: Outbox,
    },
    Answer {
        id: u64,
        status: u8,
        body: Vec<u8>,
    },
    Fetch {
        from: MachineId,
        after: u64,
        incarnation: u64,
        reply: Outbox,
    },
    Heartbeat {
        from: MachineId,
        incarnation: u64,
    },
    /// This machine registered with `incarnation`: heartbeat from now on.
    Live {
        incarnation: u64,
    },
    /// Gossip declared this machine down.
    Suspect(MachineId),
    /// A connection from this machine to the controller port closed.
    PeerClosed(MachineId),
    /// The machine's Kafka port refused a connection while it was
    /// registered as `incarnation`: nothing listens there, its process is
    /// gone (`LoopState::probe`).
    Refused {
        machine: MachineId,
        incarnation: u64,
        /// Probes of this machine in a row that were refused.
        attempt: u32,
    },
    /// This machine is shutting down: no more heartbeats, so that the
    /// controller does not unfence it again (controlled shutdown).
    Quiet,
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
    /// Opens the log, binds the controller port and starts the threads; a
    /// machine that is not a member of the quorum starts as an observer.
    pub fn start(config: ServiceConfig, decider: Option<Decider>) -> Result<Self, ServiceError> {
        if !config.is_member() {
            let stopping = Arc::new(AtomicBool::new(false));
            let (handle, threads) = super::observer::start(&config, stopping.clone());
            return Ok(Self { handle, threads, listen: None, stopping });
        }
        let log = RaftLog::open(&config.dir)?;
        let ids = |list: &[(MachineId, SocketAddr)]| list.iter().map(|(id, _)| *id).collect::<Vec<_>>();
        let mut quorum = QuorumConfig::new(config.machine, ids(&config.voters), ids(&config.learners));
        // Machines must not draw the same election timeouts: `id ^ time`
        // collides for ids 2 and 3 started a millisecond apart, and two
        // machines that always time out together split every vote.
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        quorum.election_seed = config.machine.get().wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ nanos;
        let snapshot = log.durable().snapshot.as_ref().map(|s| {
            let meta = s.get_metadata();
            (Provenance { offset: meta.index, epoch: meta.term }, Arc::<[u8]>::from(s.get_data()))
        });
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
        let status =
            QuorumStatus { voters: ids(&config.voters), learners: ids(&config.learners), ..Default::default() };
        let shared = Arc::new(Shared::new(status));
        let handle = ControllerHandle { events: events_tx.clone(), shared: shared.clone() };
        let mut threads = Vec::new();
        let mut peers = BTreeMap::new();
        for (id, addr) in config.voters.iter().chain(&config.learners) {
            if *id == config.machine {
                continue;
            }
            let (tx, rx) = flume::bounded::<Vec<u8>>(wire::OUTBOX_DEPTH);
            peers.insert(*id, tx);
            let (peer, addr, events) = (*id, *addr, events_tx.clone());
            threads.push(spawn(&format!("shardlog-ctl-to-{id}"), move || write_to_peer(peer, addr, rx, events)));
        }
        let stopping = Arc::new(AtomicBool::new(false));
        if let Some((listener, _)) = listener {
            let (accept_events, accept_stopping) = (events_tx.clone(), stopping.clone());
            threads.push(spawn("shardlog-ctl-accept", move || accept_peers(listener, accept_events, accept_stopping)));
        }
        let snapshot_index = snapshot.as_ref().map_or(0, |(at, _)| at.offset);
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
            snapshot,
            recent: VecDeque::new(),
            parked: Vec::new(),
            incarnation: None,
            heard: BTreeMap::new(),
            leader_since: None,
            suspicions: BTreeMap::new(),
            ticks: 0,
            last_tick: Instant::now(),
            events: events_tx.clone(),
            heartbeats: BTreeMap::new(),
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
    /// A decision with no records answers at once. Only on the controller:
    /// elsewhere it fails with `NotController` (see `request`).
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
    /// controller runs (a follower or an observer forwards it), and
    /// answers once the records commit.
    pub async fn request(&self, body: Vec<u8>) -> Result<Vec<u8>, SubmitError> {
        let (reply, wait) = flume::bounded(1);
        self.events.send_async(LoopEvent::Request { body, reply }).await.map_err(|_| SubmitError::Stopped)?;
        wait.recv_async().await.map_err(|_| SubmitError::Stopped)?
    }

    /// This machine is registered as `incarnation`: from now on it
    /// heartbeats to the controller, which fences it when they stop.
    pub fn live(&self, incarnation: u64) {
        let _ = self.events.send(LoopEvent::Live { incarnation });
    }

    /// Stops this machine's heartbeats (a controlled shutdown fences it,
    /// and a heartbeat would unfence it again).
    pub fn quiet(&self) {
        let _ = self.events.send(LoopEvent::Quiet);
    }

    /// Gossip declared `machine` down: the controller fences it now unless
    /// it heard from it within two heartbeats (see `gossip`).
    pub fn suspect(&self, machine: MachineId) {
        let _ = self.events.send(LoopEvent::Suspect(machine));
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
    /// Requests this machine forwarded to the controller, by id, with
    /// their deadline and the machine they went to.
    forwarded: BTreeMap<u64, (AnswerSender, Instant, MachineId)>,
    next_forward: u64,
    /// The index of the last snapshot the log holds.
    snapshot_index: u64,
    snapshot_entries: u64,
    engine: QuorumEngine,
    log: RaftLog,
    peers: BTreeMap<MachineId, Outbox>,
    committed: ClusterImage,
    /// The leader's image with its uncommitted proposals replayed.
    speculative: Option<ClusterImage>,
    waiting: BTreeMap<ProposalToken, Origin>,
    /// Whether each committed index replayed, until its proposal is answered.
    replayed: BTreeMap<u64, Result<(), String>>,
    next_token: u64,
    shared: Arc<Shared>,
    /// The last snapshot, for observers that are further behind than
    /// `recent` reaches.
    snapshot: Option<(Provenance, Arc<[u8]>)>,
    /// The batches applied since that snapshot, for observers.
    recent: VecDeque<(Provenance, Arc<[u8]>)>,
    /// Observers' fetches waiting for a commit, with their deadlines.
    parked: Vec<(u64, Outbox, Instant)>,
    /// This machine's registration, once it has one: it heartbeats.
    incarnation: Option<u64>,
    /// When the controller last heard each machine, with its incarnation.
    heard: BTreeMap<u64, (u64, Instant)>,
    /// Since when this machine has been the controller.
    leader_since: Option<Instant>,
    /// When gossip last declared each machine down, leader or not: a
    /// controller elected just after acts on what gossip said before (the
    /// machine that died was often the old controller's neighbour, or the
    /// old controller itself).
    suspicions: BTreeMap<MachineId, Instant>,
    ticks: u64,
    last_tick: Instant,
    /// The loop's own queue, for the probes it starts.
    events: flume::Sender<LoopEvent>,
    /// When each machine's last heartbeat arrived, with its incarnation:
    /// only heartbeats (`heard` also starts leases at elections).
    heartbeats: BTreeMap<u64, (u64, Instant)>,
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
                self.on_tick(now);
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
            LoopEvent::Unreachable(to) => {
                // What went to a machine that cannot be reached will not be
                // answered: its callers may try again (at the next
                // controller) at once instead of at the timeout.
                self.fail_forwarded(|target| target == to, None);
                self.engine.step(Event::Unreachable { to })
            }
            LoopEvent::Submit { decide, reply } => {
                if !self.engine.is_leader() {
                    let leader = self.engine.leader();
                    let _ = reply.send(Err(SubmitError::Proposal(ProposalError::NotController { leader })));
                    return;
                }
                let base = self.speculative.get_or_insert_with(|| self.committed.clone());
                let records = decide(base);
                return self.propose(records, Origin::Local(reply));
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
                self.forwarded.insert(id, (reply, Instant::now() + FORWARD_TIMEOUT, leader));
                let mut frame = id.to_le_bytes().to_vec();
                frame.extend_from_slice(&body);
                self.send_frame(leader, wire::FRAME_REQUEST, &frame);
                return;
            }
            LoopEvent::Forwarded { id, body, reply } => {
                if !self.engine.is_leader() {
                    let leader = self.engine.leader().map_or(0, MachineId::get);
                    self.send_answer(&reply, id, wire::ANSWER_NOT_CONTROLLER, &leader.to_le_bytes());
                    return;
                }
                return self.decide_request(&body, |answer| Origin::Remote { reply, id, answer });
            }
            LoopEvent::Answer { id, status, body } => {
                let Some((reply, _, _)) = self.forwarded.remove(&id) else { return };
                let _ = reply.send(answer_outcome(status, body));
                return;
            }
            LoopEvent::Fetch { from, after, incarnation, reply } => {
                self.heard_from(from, incarnation);
                {
                    let mut status = self.shared.status.lock().expect("not poisoned");
                    match status.observers.iter_mut().find(|(id, _)| *id == from) {
                        Some(known) => known.1 = after,
                        None => status.observers.push((from, after)),
                    }
                }
                if after >= self.committed.provenance.offset {
                    self.parked.push((after, reply, Instant::now() + FETCH_WAIT));
                } else {
                    self.answer_fetch(after, &reply);
                }
                return;
            }
            LoopEvent::Heartbeat { from, incarnation } => return self.heard_from(from, incarnation),
            LoopEvent::Live { incarnation } => {
                self.incarnation = Some(incarnation);
                return;
            }
            LoopEvent::Suspect(machine) => return self.suspected(machine),
            LoopEvent::PeerClosed(machine) => return self.probe(machine, 0, Duration::ZERO),
            LoopEvent::Refused { machine, incarnation, attempt } => return self.refused(machine, incarnation, attempt),
            LoopEvent::Quiet => {
                self.incarnation = None;
                return;
            }
            LoopEvent::Stop => return,
        };
        self.run_commands(commands);
    }

    fn run_commands(&mut self, commands: Vec<Command>) {
        let mut queue = VecDeque::from(commands);
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
                    let me = self.engine.machine();
                    if leader != Some(me) {
                        self.speculative = None;
                        self.leader_since = None;
                    } else if self.leader_since.is_none() {
                        // Every machine gets a whole lease from the
                        // election: nobody heartbeated to this machine.
                        self.leader_since = Some(Instant::now());
                        self.heard.clear();
                        let recent: Vec<MachineId> = self
                            .suspicions
                            .iter()
                            .filter(|(_, at)| at.elapsed() < MACHINE_LEASE)
                            .map(|(machine, _)| *machine)
                            .collect();
                        for machine in recent {
                            self.fence_suspect(machine);
                        }
                        // A machine that died with the old controller is
                        // found after two heartbeat periods (the live ones
                        // have heartbeated by then) instead of a lease.
                        let machines: Vec<MachineId> = self.committed.machines.keys().copied().collect();
                        for machine in machines {
                            self.probe(machine, 0, HEARTBEAT_EVERY * 2);
                        }
                    }
                    if let Some(leader) = leader {
                        tracing::info!(term, controller = %leader, machine = %me, "controller elected");
                    }
                    self.fail_forwarded(|target| Some(target) != leader, leader);
                    let mut status = self.shared.status.lock().expect("not poisoned");
                    status.term = term;
                    status.leader = leader;
                }
            }
        }
        self.snapshot_if_due();
        self.answer_parked(false);
        let mut status = self.shared.status.lock().expect("not poisoned");
        status.commit_index = self.engine.commit_index();
        status.applied = self.committed.provenance;
        status.progress = self.engine.progress();
        status.last_index = self.engine.last_index();
    }

    /// Heartbeats, fetch deadlines and leases.
    fn on_tick(&mut self, now: Instant) {
        self.ticks += 1;
        let every = (HEARTBEAT_EVERY.as_millis() as u64 / TICK_MS).max(1);
        if let Some(incarnation) = self.incarnation {
            match self.engine.leader() {
                Some(leader) if leader == self.engine.machine() => self.heard_from(leader, incarnation),
                Some(leader) if self.ticks.is_multiple_of(every) => {
                    self.send_frame(leader, wire::FRAME_HEARTBEAT, &incarnation.to_le_bytes())
                }
                _ => {}
            }
        }
        self.answer_parked(true);
        // A loop that stalled (a slow disk) heard nobody meanwhile: the
        // heartbeats wait in its queue. Nobody is fenced for that.
        if now.duration_since(self.last_tick) > MACHINE_LEASE / 2 {
            self.heard.clear();
        }
        self.last_tick = now;
        self.expire_leases(now);
        if self.ticks.is_multiple_of((LEADER_BALANCE_EVERY.as_millis() as u64 / TICK_MS).max(1)) {
            self.balance_leaders();
        }
    }

    /// The leader balancer (Kafka's auto.leader.rebalance): preferred
    /// replicas that are in sync lead again.
    fn balance_leaders(&mut self) {
        if self.leader_since.is_none() || !self.engine.is_leader() {
            return;
        }
        let base = self.speculative.as_ref().unwrap_or(&self.committed);
        let records = super::control::balance_leaders(base, LEADER_BALANCE_MAX);
        if !records.is_empty() {
            tracing::info!(partitions = records.len(), "leader balancer: preferred replicas lead again");
            self.propose(records, Origin::Controller);
        }
    }

    /// The controller heard from `machine` as `incarnation`: its lease is
    /// renewed, and a machine fenced for silence is unfenced. A heartbeat
    /// of an older incarnation (a restarted machine's) renews nothing.
    fn heard_from(&mut self, machine: MachineId, incarnation: u64) {
        if incarnation == 0 || !self.engine.is_leader() {
            return;
        }
        let base = self.speculative.as_ref().unwrap_or(&self.committed);
        let Some(registered) = base.machines.get(&machine).filter(|m| m.incarnation == incarnation) else { return };
        self.heard.insert(machine.get(), (incarnation, Instant::now()));
        self.heartbeats.insert(machine.get(), (incarnation, Instant::now()));
        if registered.fenced {
            tracing::info!(%machine, "machine heard again; unfenced");
            let records = super::control::unfence_machine(base, machine.get());
            self.propose(records, Origin::Controller);
        }
    }

    /// Gossip says `machine` is down: fence it without waiting out its
    /// lease, unless its heartbeat came within two periods (gossip is a
    /// hint; the heartbeat is the machine itself).
    fn suspected(&mut self, machine: MachineId) {
        self.suspicions.insert(machine, Instant::now());
        self.fence_suspect(machine);
    }

    fn fence_suspect(&mut self, machine: MachineId) {
        if !self.engine.is_leader() || machine == self.engine.machine() {
            return;
        }
        let base = self.speculative.as_ref().unwrap_or(&self.committed);
        let Some(registered) = base.machines.get(&machine).filter(|m| !m.fenced) else { return };
        let recent = self.heard.get(&machine.get()).is_some_and(|(incarnation, at)| {
            *incarnation == registered.incarnation && at.elapsed() < HEARTBEAT_EVERY * 2
        });
        if recent {
            return;
        }
        tracing::warn!(%machine, "gossip declared the machine down; fenced before its lease ran out");
        let records = super::control::fence_machine(base, machine.get());
        self.propose(records, Origin::Controller);
    }

    /// Checks whether `machine`'s process is gone: after `delay`, a TCP
    /// connect to its first Kafka port, on a thread of its own. Refused
    /// means nothing listens there (kill -9, a crash: the kernel answers for
    /// the dead process), and the machine is fenced at once instead of when
    /// its lease runs out (`refused`); failover then takes a round trip, not
    /// `MACHINE_LEASE`. A timeout or any other answer proves nothing (a
    /// partition, a slow machine) and leaves it to the lease. Asked when a
    /// machine's connection to the controller closes, and of every machine
    /// when this one becomes the controller.
    fn probe(&mut self, machine: MachineId, attempt: u32, delay: Duration) {
        if !self.engine.is_leader() || machine == self.engine.machine() || attempt >= PROBE_ATTEMPTS {
            return;
        }
        let Some(registered) = self.committed.machines.get(&machine).filter(|m| !m.fenced) else { return };
        let incarnation = registered.incarnation;
        let first = registered
            .nodes
            .iter()
            .filter_map(|n| self.committed.nodes.get(&super::metadata::NodeId(*n)))
            .min_by_key(|placed| placed.core);
        let Some(placed) = first else { return };
        let Ok(port) = u16::try_from(placed.port) else { return };
        let (host, events) = (placed.host.clone(), self.events.clone());
        tracing::debug!(%machine, attempt, host = %host, port, "probing a machine's Kafka port");
        spawn("shardlog-ctl-probe", move || {
            use std::net::ToSocketAddrs;
            std::thread::sleep(delay);
            let Some(addr) = (host.as_str(), port).to_socket_addrs().ok().and_then(|mut a| a.next()) else { return };
            if let Err(err) = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                if err.kind() == std::io::ErrorKind::ConnectionRefused {
                    let _ = events.send(LoopEvent::Refused { machine, incarnation, attempt: attempt + 1 });
                }
            }
        });
    }

    /// `machine`'s Kafka port refused a connection (see `probe`): fenced,
    /// unless it registered again since, or heartbeated within two periods
    /// (a machine that registered and is still opening its partitions before
    /// it listens): then it is probed again after two more.
    fn refused(&mut self, machine: MachineId, incarnation: u64, attempt: u32) {
        if !self.engine.is_leader() {
            return;
        }
        let base = self.speculative.as_ref().unwrap_or(&self.committed);
        let same = base.machines.get(&machine).is_some_and(|m| !m.fenced && m.incarnation == incarnation);
        if !same {
            return;
        }
        let recent = self
            .heartbeats
            .get(&machine.get())
            .is_some_and(|(heard, at)| *heard == incarnation && at.elapsed() < HEARTBEAT_EVERY * 2);
        if recent {
            self.probe(machine, attempt, HEARTBEAT_EVERY * 2);
            return;
        }
        tracing::warn!(%machine, "the machine's Kafka port refuses connections and it stopped heartbeating (its process is gone); fenced before its lease ran out");
        let records = super::control::fence_machine(base, machine.get());
        self.propose(records, Origin::Controller);
    }

    /// Fences every unfenced machine the controller has not heard from for
    /// `MACHINE_LEASE`. A lease starts when the controller first sees a
    /// registration (a new incarnation), and at its election.
    fn expire_leases(&mut self, now: Instant) {
        if self.leader_since.is_none() || !self.engine.is_leader() {
            return;
        }
        let base = self.speculative.as_ref().unwrap_or(&self.committed);
        let mut expired = Vec::new();
        for (id, machine) in &base.machines {
            let heard = self.heard.entry(id.get()).or_insert((machine.incarnation, now));
            if heard.0 != machine.incarnation {
                *heard = (machine.incarnation, now);
            }
            let silent = now.duration_since(heard.1);
            if !machine.fenced && silent > MACHINE_LEASE {
                tracing::warn!(machine = %id, silent_ms = silent.as_millis() as u64, "machine lease expired; fenced");
                expired.push(id.get());
            }
        }
        if !expired.is_empty() {
            let records = super::control::fence_machines(base, &expired);
            self.propose(records, Origin::Controller);
        }
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
        let meta = snapshot.get_metadata();
        let at = Provenance { offset: meta.index, epoch: meta.term };
        self.snapshot = Some((at, Arc::from(snapshot.get_data())));
        self.recent.retain(|(entry, _)| entry.offset > at.offset);
    }

    fn apply(&mut self, applied: Applied) {
        let (next, changes) = match applied {
            Applied::Entry { data, .. } if data.is_empty() => return,
            Applied::Entry { index, term, data } => {
                let at = Provenance { offset: index, epoch: term };
                let replayed = super::image::replay_batch(&self.committed, at, &data);
                self.recent.push_back((at, Arc::from(data)));
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
            Applied::Snapshot { index, term, data } => match super::image::decode_snapshot(&data) {
                Ok(image) => {
                    self.snapshot = Some((Provenance { offset: index, epoch: term }, Arc::from(data)));
                    self.recent.clear();
                    (image, Changes::default())
                }
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
        self.shared.publish(Arc::new(self.committed.clone()), changes);
    }

    /// Answers the parked fetches that something committed for, and with
    /// `expired` also those whose wait is over.
    fn answer_parked(&mut self, expired: bool) {
        if self.parked.is_empty() {
            return;
        }
        let now = Instant::now();
        let offset = self.committed.provenance.offset;
        let parked = std::mem::take(&mut self.parked);
        for (after, reply, deadline) in parked {
            if after < offset || (expired && deadline <= now) {
                self.answer_fetch(after, &reply);
            } else {
                self.parked.push((after, reply, deadline));
            }
        }
    }

    /// The committed batches after `after` (from the snapshot, when the
    /// entries after `after` are compacted away), up to `FETCH_BYTES_MAX`.
    fn answer_fetch(&self, after: u64, reply: &Outbox) {
        let mut fetched =
            Fetched { leader: self.engine.leader(), commit: self.committed.provenance.offset, ..Default::default() };
        let mut from = after;
        // `recent` holds every batch after the snapshot (or after the
        // start of the log, when there is none).
        if let Some((at, bytes)) = self.snapshot.as_ref().filter(|(at, _)| after < at.offset) {
            fetched.snapshot = Some((*at, bytes.to_vec()));
            from = at.offset;
        }
        let mut bytes = 0;
        for (at, data) in self.recent.iter().filter(|(at, _)| at.offset > from) {
            if bytes > 0 && bytes + data.len() > FETCH_BYTES_MAX {
                break;
            }
            bytes += data.len();
            fetched.entries.push((*at, data.to_vec()));
        }
        let _ = reply.try_send(wire::frame(self.engine.machine(), wire::FRAME_FETCHED, &fetched.encode()));
    }

    fn send(&self, to: MachineId, message: &Message) {
        self.send_frame(to, wire::FRAME_RAFT, &encode_message(message));
    }

    fn send_frame(&self, to: MachineId, kind: u8, body: &[u8]) {
        let Some(queue) = self.peers.get(&to) else { return };
        let _ = queue.try_send(wire::frame(self.engine.machine(), kind, body));
    }

    fn send_answer(&self, reply: &Outbox, id: u64, status: u8, body: &[u8]) {
        let _ = reply.try_send(wire::frame(self.engine.machine(), wire::FRAME_ANSWER, &answer_body(id, status, body)));
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
        self.propose(records, origin(answer));
    }

    /// Replays `records` on the speculative image (so the next decision
    /// sees them) at the index their entry will get (a machine's epoch is
    /// the index of its registration), and proposes them; `origin` hears
    /// the outcome once they commit. Nothing to propose answers at once.
    fn propose(&mut self, records: Vec<MetadataRecord>, origin: Origin) {
        if records.is_empty() {
            let offset = self.committed.provenance.offset;
            return self.answer(origin, Ok(offset));
        }
        let base = self.speculative.get_or_insert_with(|| self.committed.clone());
        let mut delta = MetadataDelta::new(base);
        let at = Provenance { offset: self.engine.last_index() + 1, epoch: self.engine.term() };
        if let Some(err) = records.iter().find_map(|r| delta.replay(at, r).err()) {
            return self.answer(origin, Err(SubmitError::NotApplied(err.to_string())));
        }
        self.speculative = Some(delta.finish().0);
        let token = ProposalToken(self.next_token);
        self.next_token += 1;
        self.waiting.insert(token, origin);
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
            Origin::Remote { reply, id, answer } => match outcome {
                Ok(_) => self.send_answer(&reply, id, wire::ANSWER_OK, &answer),
                Err(SubmitError::Proposal(ProposalError::NotController { leader })) => {
                    let leader = leader.map_or(0, MachineId::get);
                    self.send_answer(&reply, id, wire::ANSWER_NOT_CONTROLLER, &leader.to_le_bytes())
                }
                Err(err) => self.send_answer(&reply, id, wire::ANSWER_FAILED, err.to_string().as_bytes()),
            },
            Origin::Controller => {
                if let Err(err) = outcome {
                    tracing::debug!(error = %err, "a controller proposal did not commit");
                }
            }
        }
    }

    /// Fails forwarded requests the controller has not answered in time.
    fn expire_forwarded(&mut self) {
        let now = Instant::now();
        let expired: Vec<u64> =
            self.forwarded.iter().filter(|(_, (_, deadline, _))| *deadline <= now).map(|(id, _)| *id).collect();
        for id in expired {
            if let Some((reply, _, _)) = self.forwarded.remove(&id) {
                let _ = reply.send(Err(SubmitError::TimedOut));
            }
        }
    }

    /// Fails the forwarded requests whose target `lost` says is no longer
    /// the controller, naming `leader` as the one to ask.
    fn fail_forwarded(&mut self, lost: impl Fn(MachineId) -> bool, leader: Option<MachineId>) {
        let gone: Vec<u64> = self.forwarded.iter().filter(|(_, (_, _, to))| lost(*to)).map(|(id, _)| *id).collect();
        for id in gone {
            if let Some((reply, _, _)) = self.forwarded.remove(&id) {
                let _ = reply.send(Err(SubmitError::Proposal(ProposalError::NotController { leader })));
            }
        }
    }
}

/// An ANSWER frame's body.
pub(crate) fn answer_body(id: u64, status: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = id.to_le_bytes().to_vec();
    frame.push(status);
    frame.extend_from_slice(body);
    frame
}

/// What an ANSWER frame's status and body mean to the requester.
pub(crate) fn answer_outcome(status: u8, body: Vec<u8>) -> Result<Vec<u8>, SubmitError> {
    match status {
        wire::ANSWER_OK => Ok(body),
        wire::ANSWER_NOT_CONTROLLER => {
            let leader = Cursor(&body).u64().ok().and_then(MachineId::new);
            Err(SubmitError::Proposal(ProposalError::NotController { leader }))
        }
        _ => Err(SubmitError::Remote(String::from_utf8_lossy(&body).into_owned())),
    }
}

pub(crate) fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new().name(name.into()).spawn(body).expect("spawn a controller thread")
}

/// Connects to `peer` and sends its queue, reconnecting after errors.
/// What the peer sends back on the connection (answers to forwarded
/// requests) is read by a thread of its own.
fn write_to_peer(peer: MachineId, addr: SocketAddr, queue: flume::Receiver<Vec<u8>>, events: flume::Sender<LoopEvent>) {
    use std::io::Write;
    let mut stream: Option<TcpStream> = None;
    while let Ok(frame) = queue.recv() {
        if stream.is_none() {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(connected) => {
                    wire::tune(&connected);
                    if let Ok(reading) = connected.try_clone() {
                        let events = events.clone();
                        spawn(&format!("shardlog-ctl-back-{peer}"), move || read_from_peer(reading, events, None));
                    }
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
                let _ = connected.shutdown(std::net::Shutdown::Both);
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
        wire::tune(&stream);
        let Ok(writing) = stream.try_clone() else { continue };
        let events = events.clone();
        spawn("shardlog-ctl-from", move || {
            let reply = wire::spawn_writer(writing, "shardlog-ctl-reply");
            read_from_peer(stream, events, Some(reply));
        });
    }
}

/// Reads frames until the peer closes or sends a bad one. Requests and
/// fetches are answered on `reply`, this connection's way back; a
/// connection this machine opened has none and takes only answers and
/// Raft messages.
fn read_from_peer(stream: TcpStream, events: flume::Sender<LoopEvent>, reply: Option<Outbox>) {
    if let Some(peer) = read_frames(stream, &events, reply) {
        tracing::debug!(%peer, "controller port: a machine's connection closed");
        let _ = events.send(LoopEvent::PeerClosed(peer));
    }
}

/// `read_from_peer`'s loop; returns the machine that sent frames on this
/// connection, if any did.
fn read_frames(mut stream: TcpStream, events: &flume::Sender<LoopEvent>, reply: Option<Outbox>) -> Option<MachineId> {
    let mut peer = None;
    loop {
        let frame = match wire::read_frame(&mut stream) {
            Ok(frame) => frame,
            Err(wire::FrameError::Io(_)) => return peer,
            Err(err) => {
                tracing::warn!(error = %err, "controller port: closing a connection");
                return peer;
            }
        };
        let (from, kind) = (frame.from, frame.kind);
        peer = Some(from);
        let event = decode_event(frame, reply.as_ref());
        let Some(event) = event else {
            tracing::warn!(%from, kind, "controller port: a frame that does not decode or belong here; closing");
            return peer;
        };
        if events.send(event).is_err() {
            return None;
        }
    }
}

fn decode_event(frame: wire::Frame, reply: Option<&Outbox>) -> Option<LoopEvent> {
    let from = frame.from;
    let mut body = Cursor(&frame.body);
    Some(match frame.kind {
        wire::FRAME_RAFT => LoopEvent::Peer { from, message: Box::new(decode_message(&frame.body).ok()?) },
        wire::FRAME_REQUEST => {
            let id = body.u64().ok()?;
            LoopEvent::Forwarded { id, body: body.rest().to_vec(), reply: reply?.clone() }
        }
        wire::FRAME_ANSWER => {
            let id = body.u64().ok()?;
            let status = body.u8().ok()?;
            LoopEvent::Answer { id, status, body: body.rest().to_vec() }
        }
        wire::FRAME_FETCH => {
            let after = body.u64().ok()?;
            let incarnation = body.u64().ok()?;
            LoopEvent::Fetch { from, after, incarnation, reply: reply?.clone() }
        }
        wire::FRAME_HEARTBEAT => LoopEvent::Heartbeat { from, incarnation: body.u64().ok()? },
        _ => return None,
    })
}
