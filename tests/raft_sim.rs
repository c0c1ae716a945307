//! A seeded, reproducible simulation of the controller quorum's Raft engine
//! (`shardlog::cluster::quorum`), after TigerBeetle's VOPR and FoundationDB's
//! simulation: no sockets, threads or clocks. One seed decides everything:
//! 3 or 5 voters plus a learner, a virtual clock, a network that loses,
//! duplicates, delays and reorders messages, symmetric and one-way
//! partitions that heal, disks with fsync latency, crashes that lose every
//! write not yet acknowledged, restarts from what the disk kept, compactions,
//! and clients proposing to whoever they think leads.
//!
//! Checked after every step:
//! (a) election safety: at most one leader per term, ever, and never a learner;
//! (b) state machine safety: no two machines apply different entries at one
//!     index (every applied sequence is a prefix of one committed sequence),
//!     and indexes are applied in order without gaps;
//! (c) durability of acknowledged proposals: a proposal reported committed is
//!     the entry at its index, and once the network heals every machine has
//!     applied it;
//! (d) liveness: after the faults stop and the network heals, a proposal
//!     commits within `LIVENESS_MS` and every machine catches up within
//!     `CONVERGENCE_MS`.
//!
//! A second test crashes the leader of a healthy quorum once per seed and
//! prints the distribution of the virtual time until a new leader commits.
//!
//! `SHARDLOG_RAFT_SEEDS=N` runs seeds 1..=N (default `SEEDS_DEFAULT`);
//! `SHARDLOG_RAFT_SEED=N` replays one seed. A failure names its seed and the
//! command that replays it; `SHARDLOG_RAFT_KEEP_GOING=1` runs every seed and
//! lists each failure's first line.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{self, AssertUnwindSafe};

use shardlog::cluster::quorum::{
    decode_message, encode_message, Applied, Command, Durable, Event, Persist, ProposalError, ProposalToken,
    QuorumConfig, QuorumEngine, TICK_MS,
};
use shardlog::cluster::MachineId;

/// Seeds per test when `SHARDLOG_RAFT_SEEDS` is unset: a few seconds each in
/// a debug build on two cores.
const SEEDS_DEFAULT: u64 = 200;
/// How long faults are injected, virtual ms (the seed picks within).
const FAULT_PHASE_MS_MIN: u64 = 10_000;
const FAULT_PHASE_MS_MAX: u64 = 25_000;
/// After healing, a new proposal must commit within this.
const LIVENESS_MS: u64 = 10_000;
/// After healing, every machine must have applied everything within this.
const CONVERGENCE_MS: u64 = 20_000;
/// A failover taking longer than this fails the failover test.
const FAILOVER_MS_MAX: u64 = 10_000;

#[test]
fn simulated_faults_keep_raft_safe_and_live() {
    let mut slowest_ms = 0;
    let seeds = seeds();
    let started = std::time::Instant::now();
    let mut totals = Totals::default();
    for outcome in run_seeds("simulated_faults_keep_raft_safe_and_live", &seeds, |seed| Sim::faults(seed).run_faults())
    {
        slowest_ms = slowest_ms.max(outcome.heal_to_commit_ms);
        totals.add(&outcome);
    }
    println!(
        "raft_sim faults: {} seeds in {:.1} s wall; {} proposals committed, {} failed, {} crashes ({} torn writes), \
         {} partitions, {} snapshots installed; slowest commit after heal {} virtual ms",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        totals.committed,
        totals.failed,
        totals.crashes,
        totals.torn_writes,
        totals.partitions,
        totals.snapshots_installed,
        slowest_ms
    );
}

#[test]
fn leader_crash_failover_virtual_time() {
    let seeds = seeds();
    let mut failovers_ms =
        run_seeds("leader_crash_failover_virtual_time", &seeds, |seed| Sim::calm(seed).run_failover());
    failovers_ms.sort_unstable();
    let at = |quantile: f64| failovers_ms[((failovers_ms.len() - 1) as f64 * quantile).round() as usize];
    println!(
        "raft_sim failover, leader crash to a new leader's first commit ({} trials, 3 and 5 voters, tick {} ms, \
         default election ticks): p50 {} ms, p99 {} ms, max {} ms (virtual)",
        failovers_ms.len(),
        TICK_MS,
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("SHARDLOG_RAFT_SEED") {
        return vec![seed.parse().expect("SHARDLOG_RAFT_SEED is a number")];
    }
    let count = std::env::var("SHARDLOG_RAFT_SEEDS")
        .map(|count| count.parse().expect("SHARDLOG_RAFT_SEEDS is a number"))
        .unwrap_or(SEEDS_DEFAULT);
    (1..=count).collect()
}

/// Runs each seed; on a panic (a checker or the engine) names the seed and
/// how to replay it. With `SHARDLOG_RAFT_KEEP_GOING=1` it runs every seed
/// and lists all failures (to see which checker a deliberate break trips).
fn run_seeds<T>(test: &str, seeds: &[u64], run: impl Fn(u64) -> T) -> Vec<T> {
    let keep_going = std::env::var("SHARDLOG_RAFT_KEEP_GOING").is_ok_and(|value| value == "1");
    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    for &seed in seeds {
        match panic::catch_unwind(AssertUnwindSafe(|| run(seed))) {
            Ok(outcome) => outcomes.push(outcome),
            Err(cause) => {
                eprintln!(
                    "raft_sim: seed {seed} failed; replay with: \
                     SHARDLOG_RAFT_SEED={seed} cargo test --test raft_sim {test} -- --nocapture"
                );
                if !keep_going {
                    panic::resume_unwind(cause);
                }
                let message = cause
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| cause.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                failures.push(format!("seed {seed}: {}", message.lines().next().unwrap_or_default()));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), seeds.len(), failures.join("\n"));
    outcomes
}

/// What a fault run did, for the summary line.
#[derive(Default)]
struct Totals {
    committed: u64,
    failed: u64,
    crashes: u64,
    partitions: u64,
    snapshots_installed: u64,
    torn_writes: u64,
}

impl Totals {
    fn add(&mut self, outcome: &FaultOutcome) {
        self.committed += outcome.totals.committed;
        self.failed += outcome.totals.failed;
        self.crashes += outcome.totals.crashes;
        self.partitions += outcome.totals.partitions;
        self.snapshots_installed += outcome.totals.snapshots_installed;
        self.torn_writes += outcome.totals.torn_writes;
    }
}

struct FaultOutcome {
    heal_to_commit_ms: u64,
    totals: Totals,
}

/// The network's and disks' misbehaviour, drawn per seed.
#[derive(Clone, Copy)]
struct Weather {
    drop_percent: u64,
    duplicate_percent: u64,
    delay_ms_max: u64,
    /// Percent of messages held up to `slow_delay_ms_max`: they overtake
    /// nothing, everything else overtakes them.
    slow_percent: u64,
    slow_delay_ms_max: u64,
    fsync_ms_max: u64,
}

const CALM: Weather = Weather {
    drop_percent: 0,
    duplicate_percent: 0,
    delay_ms_max: 5,
    slow_percent: 0,
    slow_delay_ms_max: 0,
    fsync_ms_max: 5,
};

#[derive(Debug)]
enum SimEvent {
    Tick { node: usize, incarnation: u64 },
    Deliver { from: usize, to: usize, bytes: Vec<u8> },
    DiskDone { node: usize, incarnation: u64, persist: Persist },
    Restart { node: usize },
    Heal { links: Vec<(usize, usize)> },
    Propose,
    Fault,
}

struct Node {
    id: MachineId,
    learner: bool,
    engine: Option<QuorumEngine>,
    /// Bumped at each crash: events for an older one are void.
    incarnation: u64,
    /// What survives a crash: only Persists the disk acknowledged.
    disk: Durable,
    disk_free_at_ms: u64,
    /// The state machine, rebuilt from the disk at each start.
    machine: StateMachine,
    /// Virtual ms between this machine's ticks (clock drift).
    tick_ms: u64,
}

/// The replicated state: the non-empty entries applied, in order.
#[derive(Default, Clone)]
struct StateMachine {
    applied_index: u64,
    records: Vec<Record>,
}

#[derive(Clone, PartialEq, Eq, Debug)]
struct Record {
    index: u64,
    term: u64,
    data: Vec<u8>,
}

struct Sim {
    seed: u64,
    rng: Rng,
    now_ms: u64,
    queue: BTreeMap<(u64, u64), SimEvent>,
    sequence: u64,
    nodes: Vec<Node>,
    voters: Vec<MachineId>,
    learners: Vec<MachineId>,
    weather: Weather,
    /// Directed links that drop everything.
    blocked: BTreeSet<(usize, usize)>,
    faults_on: bool,
    crash_at_next_persist: Option<usize>,
    clients_on: bool,
    /// (a): who led each term.
    leaders: BTreeMap<u64, usize>,
    /// (b): the one committed sequence, as the machines applied it.
    committed: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Where each proposal's data was applied, so none lands twice.
    data_index: BTreeMap<Vec<u8>, u64>,
    /// (c): proposals reported committed: token -> (index, data).
    acknowledged: BTreeMap<u64, (u64, Vec<u8>)>,
    proposals: BTreeMap<u64, Vec<u8>>,
    next_token: u64,
    /// The clients' idea of the leader: (term, node) from the latest report.
    believed_leader: Option<(u64, usize)>,
    /// First commit time of a proposal made at or after this time.
    watch_from_ms: Option<u64>,
    first_commit_after_watch: Option<(u64, usize)>,
    totals: Totals,
}

impl Sim {
    /// A seed's cluster with faults: 3 or 5 voters, one learner.
    fn faults(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let voters = if rng.below(2) == 0 { 3 } else { 5 };
        let weather = Weather {
            drop_percent: rng.below(11),
            duplicate_percent: rng.below(6),
            delay_ms_max: 1 + rng.below(30),
            slow_percent: rng.below(6),
            slow_delay_ms_max: 100 + rng.below(900),
            fsync_ms_max: 1 + rng.below(20),
        };
        Self::new(seed, rng, voters, weather)
    }

    /// A healthy cluster on a quiet LAN, for failover timing.
    fn calm(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x0fa1_10e7);
        let voters = if rng.below(2) == 0 { 3 } else { 5 };
        Self::new(seed, rng, voters, CALM)
    }

    fn new(seed: u64, mut rng: Rng, voters: u64, weather: Weather) -> Self {
        let ids: Vec<MachineId> = (1..=voters + 1).map(|id| MachineId::new(id).expect("ids start at 1")).collect();
        let nodes = ids
            .iter()
            .map(|&id| Node {
                id,
                learner: id.get() == voters + 1,
                engine: None,
                incarnation: 0,
                disk: Durable::default(),
                disk_free_at_ms: 0,
                machine: StateMachine::default(),
                // Up to 1% fast or slow.
                tick_ms: TICK_MS - 1 + rng.below(3),
            })
            .collect();
        let mut sim = Self {
            seed,
            rng,
            now_ms: 0,
            queue: BTreeMap::new(),
            sequence: 0,
            nodes,
            voters: ids[..voters as usize].to_vec(),
            learners: vec![ids[voters as usize]],
            weather,
            blocked: BTreeSet::new(),
            faults_on: false,
            crash_at_next_persist: None,
            clients_on: true,
            leaders: BTreeMap::new(),
            committed: BTreeMap::new(),
            data_index: BTreeMap::new(),
            acknowledged: BTreeMap::new(),
            proposals: BTreeMap::new(),
            next_token: 0,
            believed_leader: None,
            watch_from_ms: None,
            first_commit_after_watch: None,
            totals: Totals::default(),
        };
        for node in 0..sim.nodes.len() {
            sim.start(node);
        }
        sim
    }

    fn run_faults(mut self) -> FaultOutcome {
        let fault_phase_ms = FAULT_PHASE_MS_MIN + self.rng.below(FAULT_PHASE_MS_MAX - FAULT_PHASE_MS_MIN);
        self.faults_on = true;
        let first_fault_ms = 500 + self.rng.below(1_000);
        self.schedule(first_fault_ms, SimEvent::Fault);
        self.schedule(0, SimEvent::Propose);
        self.run_until(fault_phase_ms);

        // The faults stop: links heal, crashed machines come back, the
        // network stops losing (it still delays and reorders).
        self.faults_on = false;
        self.blocked.clear();
        self.weather.drop_percent = 0;
        self.weather.duplicate_percent = 0;
        for node in 0..self.nodes.len() {
            if self.nodes[node].engine.is_none() {
                self.start(node);
            }
        }
        let healed_ms = self.now_ms;
        self.watch_from_ms = Some(healed_ms);
        self.run_while(healed_ms + LIVENESS_MS, |sim| sim.first_commit_after_watch.is_none());
        let Some((commit_ms, _)) = self.first_commit_after_watch else {
            panic!(
                "(d) liveness: no proposal committed within {LIVENESS_MS} ms of healing (leaders: {:?})",
                self.nodes.iter().map(|node| node.engine.as_ref().map(|engine| engine.leader())).collect::<Vec<_>>()
            );
        };
        // Clients stop, so that "caught up" has a fixed target.
        self.clients_on = false;
        self.run_while(healed_ms + CONVERGENCE_MS, |sim| !sim.converged());
        let last_index = self.committed.keys().next_back().copied().unwrap_or_default();
        for node in &self.nodes {
            assert!(
                node.machine.applied_index >= last_index,
                "(d) liveness: machine {} applied up to {} of {last_index} {CONVERGENCE_MS} ms after healing",
                node.id,
                node.machine.applied_index
            );
        }
        self.check_acknowledged_everywhere();
        FaultOutcome { heal_to_commit_ms: commit_ms - healed_ms, totals: self.totals }
    }

    /// Time from crashing a healthy quorum's leader to a commit by another.
    fn run_failover(mut self) -> u64 {
        self.schedule(0, SimEvent::Propose);
        self.run_while(10_000, |sim| sim.acknowledged.is_empty());
        assert!(!self.acknowledged.is_empty(), "no commit within 10 s of a calm start");
        // Steady state, then a crash at a random point between heartbeats.
        let crash_ms = self.now_ms + 1_000 + self.rng.below(1_000);
        self.run_until(crash_ms);
        let leader = (0..self.nodes.len())
            .find(|&node| self.nodes[node].engine.as_ref().is_some_and(QuorumEngine::is_leader))
            .expect("a calm quorum has a leader");
        self.crash(leader);
        self.watch_from_ms = Some(self.now_ms);
        self.run_while(crash_ms + FAILOVER_MS_MAX, |sim| sim.first_commit_after_watch.is_none());
        let Some((commit_ms, by)) = self.first_commit_after_watch else {
            panic!("no new leader committed within {FAILOVER_MS_MAX} ms of the leader's crash");
        };
        assert_ne!(by, leader);
        commit_ms - crash_ms
    }

    fn run_until(&mut self, end_ms: u64) {
        self.run_while(end_ms, |_| true);
    }

    /// Runs events up to `end_ms` while `go` holds.
    fn run_while(&mut self, end_ms: u64, go: impl Fn(&Self) -> bool) {
        while go(self) {
            let Some(entry) = self.queue.first_entry() else {
                return;
            };
            let (time_ms, _) = *entry.key();
            if time_ms > end_ms {
                self.now_ms = end_ms;
                return;
            }
            let event = entry.remove();
            self.now_ms = time_ms;
            self.handle(event);
        }
    }

    fn schedule(&mut self, after_ms: u64, event: SimEvent) {
        self.sequence += 1;
        self.queue.insert((self.now_ms + after_ms, self.sequence), event);
    }

    fn handle(&mut self, event: SimEvent) {
        match event {
            SimEvent::Tick { node, incarnation } => {
                if self.nodes[node].incarnation == incarnation && self.nodes[node].engine.is_some() {
                    self.step(node, Event::Tick);
                    let tick_ms = self.nodes[node].tick_ms;
                    self.schedule(tick_ms, SimEvent::Tick { node, incarnation });
                }
            }
            SimEvent::Deliver { from, to, bytes } => {
                if self.nodes[to].engine.is_some() && !self.blocked.contains(&(from, to)) {
                    let message = decode_message(&bytes).expect("the simulation sends what it encoded");
                    self.step(to, Event::Message { from: self.nodes[from].id, message: Box::new(message) });
                }
            }
            SimEvent::DiskDone { node, incarnation, persist } => {
                if self.nodes[node].incarnation == incarnation {
                    store(&mut self.nodes[node].disk, &persist);
                    self.step(node, Event::PersistDone { number: persist.number });
                }
            }
            SimEvent::Restart { node } => self.start(node),
            SimEvent::Heal { links } => {
                for link in links {
                    self.blocked.remove(&link);
                }
            }
            SimEvent::Propose if !self.clients_on => {}
            SimEvent::Propose => {
                self.propose();
                let gap_ms = if self.faults_on { 20 + self.rng.below(180) } else { 10 };
                self.schedule(gap_ms, SimEvent::Propose);
            }
            SimEvent::Fault => {
                if self.faults_on {
                    self.inject_fault();
                    let gap_ms = 300 + self.rng.below(2_500);
                    self.schedule(gap_ms, SimEvent::Fault);
                }
            }
        }
    }

    fn inject_fault(&mut self) {
        let nodes = self.nodes.len();
        match self.rng.below(11) {
            0..=2 => {
                let node = self.rng.below(nodes as u64) as usize;
                if self.nodes[node].engine.is_some() {
                    self.crash(node);
                    let down_ms = 100 + self.rng.below(5_000);
                    self.schedule(down_ms, SimEvent::Restart { node });
                }
            }
            3..=4 => {
                // Symmetric: a random side against the rest.
                let side: Vec<bool> = (0..nodes).map(|_| self.rng.below(2) == 0).collect();
                let links: Vec<(usize, usize)> = (0..nodes)
                    .flat_map(|from| (0..nodes).map(move |to| (from, to)))
                    .filter(|&(from, to)| side[from] != side[to])
                    .collect();
                self.partition(links);
            }
            5..=6 => {
                // One-way: a few directed links drop, their reverse works.
                let count = 1 + self.rng.below(nodes as u64);
                let links: Vec<(usize, usize)> = (0..count)
                    .map(|_| (self.rng.below(nodes as u64) as usize, self.rng.below(nodes as u64) as usize))
                    .filter(|(from, to)| from != to)
                    .collect();
                self.partition(links);
            }
            7 => {
                // The leader alone against everyone: what check-quorum is for.
                if let Some(leader) =
                    (0..nodes).find(|&node| self.nodes[node].engine.as_ref().is_some_and(QuorumEngine::is_leader))
                {
                    let links: Vec<(usize, usize)> = (0..nodes)
                        .filter(|&other| other != leader)
                        .flat_map(|other| [(leader, other), (other, leader)])
                        .collect();
                    self.partition(links);
                }
            }
            8 => {
                // Dies the moment its next write is issued: its messages may
                // be out, the write is not (or only partly) on disk.
                self.crash_at_next_persist = Some(self.rng.below(nodes as u64) as usize);
            }
            _ => {
                let node = self.rng.below(nodes as u64) as usize;
                self.compact(node);
            }
        }
    }

    fn partition(&mut self, links: Vec<(usize, usize)>) {
        if links.is_empty() {
            return;
        }
        self.totals.partitions += 1;
        self.blocked.extend(links.iter().copied());
        let heal_ms = 300 + self.rng.below(6_000);
        self.schedule(heal_ms, SimEvent::Heal { links });
    }

    /// Snapshot a machine's state machine at its applied index, as the
    /// shell will with the metadata image.
    fn compact(&mut self, node: usize) {
        let crashed = self.nodes[node].engine.is_none();
        let index = self.nodes[node].machine.applied_index;
        if crashed || index == 0 {
            return;
        }
        let data = encode_image(&self.nodes[node].machine);
        let engine = self.nodes[node].engine.as_mut().expect("running");
        // Stale when the machine already holds a snapshot at or past it.
        if let Ok(snapshot) = engine.compact(index, data) {
            let disk = &mut self.nodes[node].disk;
            disk.entries.retain(|entry| entry.index > index);
            disk.snapshot = Some(snapshot);
        }
    }

    /// Starts (or restarts) a machine from what its disk kept.
    fn start(&mut self, node: usize) {
        let incarnation = self.nodes[node].incarnation;
        let mut config = QuorumConfig::new(self.nodes[node].id, self.voters.clone(), self.learners.clone());
        config.election_seed = self.seed ^ (node as u64).wrapping_mul(0x9e37_79b9) ^ incarnation << 32;
        let (engine, commands) =
            QuorumEngine::open(config, self.nodes[node].disk.clone()).expect("the disk holds a valid log");
        self.nodes[node].engine = Some(engine);
        self.nodes[node].machine = StateMachine::default();
        self.carry_out(node, commands);
        // Ticks start at a random phase.
        let phase_ms = self.rng.below(TICK_MS);
        self.schedule(phase_ms, SimEvent::Tick { node, incarnation });
    }

    /// Loses the engine, the state machine and every unacknowledged write.
    fn crash(&mut self, node: usize) {
        self.totals.crashes += 1;
        self.tear_write_in_progress(node);
        let crashed = &mut self.nodes[node];
        crashed.engine = None;
        crashed.incarnation += 1;
        crashed.machine = StateMachine::default();
        crashed.disk_free_at_ms = 0;
    }

    /// The disk may have written part of the Persist it was on when the
    /// machine died: perhaps its snapshot, then a prefix of its entries, never
    /// its hard state (written last). Unacknowledged, so Raft must cope.
    fn tear_write_in_progress(&mut self, node: usize) {
        let incarnation = self.nodes[node].incarnation;
        let in_progress = self.queue.values().find_map(|event| match event {
            SimEvent::DiskDone { node: writer, incarnation: written, persist }
                if *writer == node && *written == incarnation =>
            {
                Some(persist.clone())
            }
            _ => None,
        });
        let Some(mut torn) = in_progress else {
            return;
        };
        if self.rng.below(2) == 0 {
            return;
        }
        if torn.snapshot.is_some() && self.rng.below(2) == 0 {
            // Died before the snapshot was down: nothing after it either.
            torn.snapshot = None;
            torn.entries.clear();
        }
        let kept = self.rng.below(torn.entries.len() as u64 + 1) as usize;
        torn.entries.truncate(kept);
        torn.hard_state = None;
        self.totals.torn_writes += 1;
        store(&mut self.nodes[node].disk, &torn);
    }

    fn propose(&mut self) {
        let nodes = self.nodes.len() as u64;
        let node = match self.believed_leader {
            Some((_, node)) if self.rng.below(10) < 8 => node,
            _ => self.rng.below(nodes) as usize,
        };
        if self.nodes[node].engine.is_none() {
            // The client's connection fails; it asks someone else next time.
            self.believed_leader = None;
            return;
        }
        self.next_token += 1;
        let token = self.next_token;
        let data = format!("s{}p{token}", self.seed).into_bytes();
        self.proposals.insert(token, data.clone());
        self.step(node, Event::Propose { token: ProposalToken(token), data });
    }

    fn step(&mut self, node: usize, event: Event) {
        let engine = self.nodes[node].engine.as_mut().expect("steps go to running machines");
        let commands = engine.step(event);
        self.carry_out(node, commands);
    }

    fn carry_out(&mut self, node: usize, commands: Vec<Command>) {
        let mut persisted = false;
        for command in commands {
            match command {
                Command::Send { to, message } => {
                    let to = (to.get() - 1) as usize;
                    self.send(node, to, encode_message(&message));
                }
                Command::Persist(persist) => {
                    persisted = true;
                    let fsync_ms = 1 + self.rng.below(self.weather.fsync_ms_max);
                    let disk = &mut self.nodes[node];
                    // One disk: writes finish in the order issued.
                    let done_ms = disk.disk_free_at_ms.max(self.now_ms) + fsync_ms;
                    disk.disk_free_at_ms = done_ms;
                    let incarnation = disk.incarnation;
                    self.schedule(done_ms - self.now_ms, SimEvent::DiskDone { node, incarnation, persist });
                }
                Command::Apply(applied) => self.apply(node, applied),
                Command::ProposalCommitted { token, index } => self.acknowledge(node, token, index),
                Command::ProposalFailed { token: _, error } => {
                    self.totals.failed += 1;
                    if let ProposalError::NotController { leader } | ProposalError::LeaderLost { leader } = error {
                        self.believed_leader = leader.map(|leader| (0, (leader.get() - 1) as usize));
                    }
                }
                Command::LeaderChanged { term, leader } => {
                    if let Some(leader) = leader {
                        if self.believed_leader.is_none_or(|(believed_term, _)| believed_term <= term) {
                            self.believed_leader = Some((term, (leader.get() - 1) as usize));
                        }
                    }
                }
            }
        }
        self.check_election_safety(node);
        if persisted && self.faults_on && self.crash_at_next_persist == Some(node) {
            self.crash_at_next_persist = None;
            self.crash(node);
            let down_ms = 100 + self.rng.below(3_000);
            self.schedule(down_ms, SimEvent::Restart { node });
        }
    }

    fn send(&mut self, from: usize, to: usize, bytes: Vec<u8>) {
        let weather = self.weather;
        if self.rng.below(100) < weather.drop_percent {
            return;
        }
        let copies = if self.rng.below(100) < weather.duplicate_percent { 2 } else { 1 };
        for _ in 0..copies {
            let delay_ms = if self.rng.below(100) < weather.slow_percent {
                1 + self.rng.below(weather.slow_delay_ms_max)
            } else {
                1 + self.rng.below(weather.delay_ms_max)
            };
            self.schedule(delay_ms, SimEvent::Deliver { from, to, bytes: bytes.clone() });
        }
    }

    /// (a): one leader per term, never a learner.
    fn check_election_safety(&mut self, node: usize) {
        let Some(engine) = self.nodes[node].engine.as_ref() else {
            return;
        };
        if !engine.is_leader() {
            return;
        }
        assert!(!self.nodes[node].learner, "(a) election safety: learner {} leads", self.nodes[node].id);
        let term = engine.term();
        let leader = *self.leaders.entry(term).or_insert(node);
        assert_eq!(
            leader, node,
            "(a) election safety: machines {} and {} both led term {term}",
            self.nodes[leader].id, self.nodes[node].id
        );
    }

    /// (b): entries apply in order, and match what any other machine applied
    /// at the same index.
    fn apply(&mut self, node: usize, applied: Applied) {
        match applied {
            Applied::Entry { index, term, data } => {
                let id = self.nodes[node].id;
                let machine = &mut self.nodes[node].machine;
                assert_eq!(
                    index,
                    machine.applied_index + 1,
                    "(b) machine {id} applied {index} after {}",
                    machine.applied_index
                );
                machine.applied_index = index;
                if !data.is_empty() {
                    machine.records.push(Record { index, term, data: data.clone() });
                }
                self.check_committed(node, index, term, &data);
            }
            Applied::Snapshot { index, term, data } => {
                self.totals.snapshots_installed += 1;
                let image = decode_image(&data);
                assert_eq!(image.applied_index, index, "(b) a snapshot's image is at its index");
                assert!(
                    index > self.nodes[node].machine.applied_index,
                    "(b) machine {} installed snapshot {index} behind its applied {}",
                    self.nodes[node].id,
                    self.nodes[node].machine.applied_index
                );
                for record in &image.records {
                    self.check_committed(node, record.index, record.term, &record.data);
                }
                if let Some((committed_term, _)) = self.committed.get(&index) {
                    assert_eq!(*committed_term, term, "(b) snapshot {index} has term {term}, the log {committed_term}");
                }
                self.nodes[node].machine = image;
            }
        }
    }

    fn check_committed(&mut self, node: usize, index: u64, term: u64, data: &[u8]) {
        let id = self.nodes[node].id;
        match self.committed.get(&index) {
            Some((committed_term, committed_data)) => assert!(
                *committed_term == term && committed_data == data,
                "(b) state machine safety: machine {id} applied {:?} (term {term}) at index {index}, \
                 another machine {:?} (term {committed_term})",
                String::from_utf8_lossy(data),
                String::from_utf8_lossy(committed_data)
            ),
            None => {
                self.committed.insert(index, (term, data.to_vec()));
            }
        }
        if !data.is_empty() {
            let first = *self.data_index.entry(data.to_vec()).or_insert(index);
            assert_eq!(first, index, "(b) proposal {:?} applied at two indexes", String::from_utf8_lossy(data));
        }
    }

    /// (c), at once: what was reported committed is the entry at its index.
    fn acknowledge(&mut self, node: usize, token: ProposalToken, index: u64) {
        self.totals.committed += 1;
        let data = self.proposals[&token.0].clone();
        let committed = self.committed.get(&index).map(|(_, data)| String::from_utf8_lossy(data));
        assert!(
            committed.as_deref() == Some(String::from_utf8_lossy(&data).as_ref()),
            "(c) proposal {} reported committed at {index} by machine {}, but the applied log holds {committed:?} there",
            token.0,
            self.nodes[node].id
        );
        assert!(self.acknowledged.insert(token.0, (index, data)).is_none(), "(c) proposal {} reported twice", token.0);
        if let Some(from_ms) = self.watch_from_ms {
            if self.first_commit_after_watch.is_none() && self.now_ms >= from_ms {
                self.first_commit_after_watch = Some((self.now_ms, node));
            }
        }
    }

    fn converged(&self) -> bool {
        let Some(last) = self.committed.keys().next_back() else {
            return false;
        };
        self.nodes.iter().all(|node| node.engine.is_some() && node.machine.applied_index >= *last)
    }

    /// (c), after healing: every machine applied every acknowledged proposal.
    fn check_acknowledged_everywhere(&self) {
        for node in &self.nodes {
            let applied: BTreeMap<u64, &[u8]> =
                node.machine.records.iter().map(|record| (record.index, record.data.as_slice())).collect();
            for (token, (index, data)) in &self.acknowledged {
                assert_eq!(
                    applied.get(index).copied(),
                    Some(data.as_slice()),
                    "(c) machine {} lacks proposal {token} (committed at {index}) {CONVERGENCE_MS} ms after healing \
                     (it applied up to {})",
                    node.id,
                    node.machine.applied_index
                );
            }
        }
    }
}

/// What the shell does with a Persist (module docs of `quorum`).
fn store(disk: &mut Durable, persist: &Persist) {
    if let Some(snapshot) = &persist.snapshot {
        disk.snapshot = Some(snapshot.clone());
        disk.entries.clear();
    }
    if let Some(first) = persist.entries.first() {
        disk.entries.retain(|entry| entry.index < first.index);
        disk.entries.extend(persist.entries.iter().cloned());
    }
    if let Some(hard_state) = &persist.hard_state {
        disk.hard_state = hard_state.clone();
    }
}

/// The state machine as snapshot bytes: applied index, then each record as
/// index, term, length, data (little-endian, fixed width).
fn encode_image(machine: &StateMachine) -> Vec<u8> {
    let mut bytes = machine.applied_index.to_le_bytes().to_vec();
    for record in &machine.records {
        bytes.extend_from_slice(&record.index.to_le_bytes());
        bytes.extend_from_slice(&record.term.to_le_bytes());
        bytes.extend_from_slice(&(record.data.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&record.data);
    }
    bytes
}

fn decode_image(bytes: &[u8]) -> StateMachine {
    let mut rest = bytes;
    let mut take = |count: usize| {
        let (head, tail) = rest.split_at(count);
        rest = tail;
        head
    };
    let u64_of = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    let applied_index = u64_of(take(8));
    let mut records = Vec::new();
    let mut left = bytes.len() - 8;
    while left > 0 {
        let index = u64_of(take(8));
        let term = u64_of(take(8));
        let length = u32::from_le_bytes(take(4).try_into().expect("4 bytes")) as usize;
        records.push(Record { index, term, data: take(length).to_vec() });
        left -= 20 + length;
    }
    StateMachine { applied_index, records }
}

/// xorshift64*: the simulation's only source of randomness.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // Spread small seeds; xorshift must not start at zero.
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..bound` (bound > 0; the bias is negligible here).
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}
