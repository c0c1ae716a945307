//! A machine that is not a voter follows the committed metadata log as an
//! observer (issue 29), the way KRaft's brokers fetch the metadata log from
//! the controllers instead of voting on it.
//!
//! One thread long-polls FETCH on the controller port of a voter (the
//! controller, once a reply has named it), replays what comes back into its
//! `ClusterImage` (a snapshot when it is too far behind) and publishes each
//! image to its subscribers, as a voter's loop does. Its fetches carry its
//! incarnation, so they are also its heartbeats. Requests (registration,
//! admin, producer ids) go to the controller over a connection of their
//! own, and are retried on another voter when one is down or not the
//! controller, until `FORWARD_TIMEOUT`.
//!
//! An observer keeps nothing on disk: at start it fetches the controller's
//! last snapshot and the entries after it.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ids::MachineId;
use super::image::{decode_snapshot, Changes, ClusterImage};
use super::quorum::ProposalError;
use super::service::{
    answer_outcome, spawn, ControllerHandle, LoopEvent, QuorumStatus, ServiceConfig, Shared, SubmitError,
    CONNECT_TIMEOUT, FETCH_WAIT, FORWARD_TIMEOUT,
};
use super::wire::{self, Cursor, Fetched};

/// How long a fetch may take before the voter counts as gone.
const FETCH_TIMEOUT: Duration = Duration::from_millis(FETCH_WAIT.as_millis() as u64 + 2000);
/// Pause before trying the next voter.
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// Who the observer talks to: the voters, and the controller once known.
struct Voters {
    me: MachineId,
    list: Vec<(MachineId, SocketAddr)>,
    shared: Arc<Shared>,
    incarnation: AtomicU64,
    next: AtomicU64,
}

impl Voters {
    /// The controller when known, otherwise the voters in turn.
    fn target(&self) -> (MachineId, SocketAddr) {
        let leader = self.shared.status.lock().expect("not poisoned").leader;
        if let Some(found) = leader.and_then(|l| self.list.iter().find(|(id, _)| *id == l)) {
            return *found;
        }
        let at = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.list.len().max(1);
        self.list[at]
    }

    /// `target` failed us: forget it as the controller.
    fn failed(&self, target: MachineId) {
        let mut status = self.shared.status.lock().expect("not poisoned");
        if status.leader == Some(target) {
            status.leader = None;
        }
        drop(status);
        self.next.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(RETRY_DELAY);
    }

    fn learned_leader(&self, leader: Option<MachineId>) {
        if leader.is_some() {
            self.shared.status.lock().expect("not poisoned").leader = leader;
        }
    }
}

/// Starts the fetch thread and the request loop.
pub(crate) fn start(config: &ServiceConfig, stopping: Arc<AtomicBool>) -> (ControllerHandle, Vec<JoinHandle<()>>) {
    let status = QuorumStatus {
        voters: config.voters.iter().map(|(id, _)| *id).collect(),
        learners: config.learners.iter().map(|(id, _)| *id).collect(),
        observer: true,
        ..Default::default()
    };
    let shared = Arc::new(Shared::new(status));
    let voters = Arc::new(Voters {
        me: config.machine,
        list: config.voters.clone(),
        shared: shared.clone(),
        incarnation: AtomicU64::new(0),
        next: AtomicU64::new(config.machine.get()),
    });
    let (events_tx, events_rx) = flume::bounded(1024);
    let handle = ControllerHandle { events: events_tx, shared };
    let fetching = (voters.clone(), stopping.clone());
    let threads = vec![
        spawn("shardlog-metadata-fetch", move || fetch_loop(&fetching.0, &fetching.1)),
        spawn("shardlog-metadata-requests", move || request_loop(voters, events_rx)),
    ];
    (handle, threads)
}

fn request_loop(voters: Arc<Voters>, events: flume::Receiver<LoopEvent>) {
    while let Ok(event) = events.recv() {
        match event {
            LoopEvent::Request { body, reply } => {
                let voters = voters.clone();
                spawn("shardlog-metadata-request", move || {
                    let _ = reply.send(forward(&voters, &body));
                });
            }
            LoopEvent::Submit { reply, .. } => {
                let leader = voters.shared.status.lock().expect("not poisoned").leader;
                let _ = reply.send(Err(SubmitError::Proposal(ProposalError::NotController { leader })));
            }
            LoopEvent::Live { incarnation } => voters.incarnation.store(incarnation, Ordering::Relaxed),
            LoopEvent::Stop => return,
            // Only the controller fences.
            _ => {}
        }
    }
}

/// Sends `body` to the controller and waits for its answer, trying the
/// voters in turn until one is the controller or `FORWARD_TIMEOUT` passes.
fn forward(voters: &Voters, body: &[u8]) -> Result<Vec<u8>, SubmitError> {
    let deadline = Instant::now() + FORWARD_TIMEOUT;
    let mut frame = 1u64.to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    let frame = wire::frame(voters.me, wire::FRAME_REQUEST, &frame);
    while Instant::now() < deadline {
        let (target, addr) = voters.target();
        let outcome = exchange(addr, &frame, deadline.saturating_duration_since(Instant::now()));
        match outcome {
            Some(answer) if answer.kind == wire::FRAME_ANSWER => {
                let mut cursor = Cursor(&answer.body);
                let (Ok(_id), Ok(status)) = (cursor.u64(), cursor.u8()) else {
                    voters.failed(target);
                    continue;
                };
                match answer_outcome(status, cursor.rest().to_vec()) {
                    Err(SubmitError::Proposal(ProposalError::NotController { leader })) => match leader {
                        Some(leader) if leader != target => voters.learned_leader(Some(leader)),
                        _ => voters.failed(target),
                    },
                    outcome => return outcome,
                }
            }
            _ => voters.failed(target),
        }
    }
    Err(SubmitError::TimedOut)
}

/// Sends `frame` on a new connection to `addr` and reads one frame back.
fn exchange(addr: SocketAddr, frame: &[u8], timeout: Duration) -> Option<wire::Frame> {
    use std::io::Write;
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).ok()?;
    wire::tune(&stream);
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))).ok()?;
    stream.write_all(frame).ok()?;
    wire::read_frame(&mut stream).ok()
}

/// Follows the committed log until `stopping`.
fn fetch_loop(voters: &Voters, stopping: &AtomicBool) {
    use std::io::Write;
    let mut image = ClusterImage::default();
    let mut connection: Option<(MachineId, TcpStream)> = None;
    while !stopping.load(Ordering::SeqCst) {
        let (target, mut stream) = match connection.take() {
            Some(open) => open,
            None => {
                let (target, addr) = voters.target();
                match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                    Ok(stream) => {
                        wire::tune(&stream);
                        let _ = stream.set_read_timeout(Some(FETCH_TIMEOUT));
                        (target, stream)
                    }
                    Err(_) => {
                        voters.failed(target);
                        continue;
                    }
                }
            }
        };
        let mut body = image.provenance.offset.to_le_bytes().to_vec();
        body.extend_from_slice(&voters.incarnation.load(Ordering::Relaxed).to_le_bytes());
        let fetched = stream
            .write_all(&wire::frame(voters.me, wire::FRAME_FETCH, &body))
            .ok()
            .and_then(|_| wire::read_frame(&mut stream).ok())
            .filter(|frame| frame.kind == wire::FRAME_FETCHED)
            .and_then(|frame| Fetched::decode(&frame.body).ok());
        let Some(fetched) = fetched else {
            voters.failed(target);
            continue;
        };
        voters.learned_leader(fetched.leader);
        if let Some(next) = follow(&image, fetched) {
            image = next.0;
            voters.shared.publish(Arc::new(image.clone()), next.1);
        }
        voters.shared.status.lock().expect("not poisoned").commit_index = image.provenance.offset;
        // Moves to the controller once it is known: its fetches are the
        // heartbeats that keep this machine unfenced.
        match fetched_leader(voters) {
            Some(leader) if leader != target => {}
            _ => connection = Some((target, stream)),
        }
    }
}

fn fetched_leader(voters: &Voters) -> Option<MachineId> {
    voters.shared.status.lock().expect("not poisoned").leader
}

/// `image` with `fetched` applied, and what changed; `None` when nothing
/// new came. A batch that does not replay is skipped whole, as voters do.
fn follow(image: &ClusterImage, fetched: Fetched) -> Option<(ClusterImage, Changes)> {
    let mut current: Option<(ClusterImage, Changes)> = None;
    if let Some((at, bytes)) = fetched.snapshot.filter(|(at, _)| at.offset > image.provenance.offset) {
        match decode_snapshot(&bytes) {
            Ok(snapshot) => current = Some((snapshot, Changes::default())),
            Err(err) => {
                tracing::error!(error = %err, offset = at.offset, "a fetched metadata snapshot does not decode");
                return None;
            }
        }
    }
    for (at, data) in fetched.entries {
        let base = current.as_ref().map_or(image, |(next, _)| next);
        if at.offset <= base.provenance.offset {
            continue;
        }
        let replayed = super::image::replay_batch(base, at, &data);
        match replayed {
            Ok((next, changes)) => {
                let merged = match current.take() {
                    Some((_, mut before)) => {
                        before.merge(changes);
                        before
                    }
                    None => changes,
                };
                current = Some((next, merged));
            }
            Err(reason) => {
                tracing::error!(offset = at.offset, %reason, "a fetched metadata batch does not replay; skipped")
            }
        }
    }
    current
}
