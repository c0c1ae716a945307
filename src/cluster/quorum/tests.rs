//! The engine driven by events, as a shell would, with no sockets or disks:
//! a harness delivers `Send`s between engines, acknowledges every `Persist`
//! at once, and records what each machine applied. Links can be cut to
//! isolate a machine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use raft::eraftpb::MessageType;

use super::*;

fn machine(id: u64) -> MachineId {
    MachineId::new(id).expect("test ids are not zero")
}

fn machines(ids: &[u64]) -> Vec<MachineId> {
    ids.iter().map(|&id| machine(id)).collect()
}

/// What a machine's state machine saw, and its other outputs.
#[derive(Default)]
struct Observed {
    applied: Vec<Applied>,
    committed: Vec<(ProposalToken, u64)>,
    failed: Vec<(ProposalToken, ProposalError)>,
    leaders: Vec<(u64, Option<MachineId>)>,
    durable: Durable,
}

struct Harness {
    engines: BTreeMap<MachineId, QuorumEngine>,
    observed: BTreeMap<MachineId, Observed>,
    /// (from, to, message) not delivered yet.
    network: VecDeque<(MachineId, MachineId, Message)>,
    /// Machines whose messages, both ways, are dropped.
    isolated: BTreeSet<MachineId>,
    /// Machines whose Persist is not acknowledged (a slow disk).
    disk_stalled: BTreeSet<MachineId>,
    stalled_persists: Vec<(MachineId, u64)>,
}

impl Harness {
    fn new(voters: &[u64], learners: &[u64]) -> Self {
        let mut harness = Self {
            engines: BTreeMap::new(),
            observed: BTreeMap::new(),
            network: VecDeque::new(),
            isolated: BTreeSet::new(),
            disk_stalled: BTreeSet::new(),
            stalled_persists: Vec::new(),
        };
        for &id in voters.iter().chain(learners) {
            harness.open(machine(id), voters, learners, Durable::default());
        }
        harness
    }

    fn open(&mut self, id: MachineId, voters: &[u64], learners: &[u64], durable: Durable) {
        let config = QuorumConfig::new(id, machines(voters), machines(learners));
        let (engine, commands) = QuorumEngine::open(config, durable.clone()).expect("valid config");
        self.engines.insert(id, engine);
        self.observed.insert(id, Observed { durable, ..Observed::default() });
        self.carry_out(id, commands);
    }

    fn step(&mut self, id: MachineId, event: Event) {
        let commands = self.engines.get_mut(&id).expect("known machine").step(event);
        self.carry_out(id, commands);
    }

    fn carry_out(&mut self, id: MachineId, commands: Vec<Command>) {
        let mut persisted = None;
        for command in commands {
            let observed = self.observed.get_mut(&id).expect("known machine");
            match command {
                Command::Send { to, message } => self.network.push_back((id, to, message)),
                Command::Persist(persist) => {
                    store(&mut observed.durable, &persist);
                    persisted = Some(persist.number);
                }
                Command::Apply(applied) => observed.applied.push(applied),
                Command::ProposalCommitted { token, index } => observed.committed.push((token, index)),
                Command::ProposalFailed { token, error } => observed.failed.push((token, error)),
                Command::LeaderChanged { term, leader } => observed.leaders.push((term, leader)),
            }
        }
        if let Some(number) = persisted {
            if self.disk_stalled.contains(&id) {
                self.stalled_persists.push((id, number));
            } else {
                self.step(id, Event::PersistDone { number });
            }
        }
    }

    /// Delivers messages until none are left.
    fn settle(&mut self) {
        while let Some((from, to, message)) = self.network.pop_front() {
            if self.isolated.contains(&from) || self.isolated.contains(&to) {
                continue;
            }
            // Through the codec, as the transport will.
            let message = decode_message(&encode_message(&message)).expect("round trip");
            self.step(to, Event::Message { from, message: Box::new(message) });
        }
    }

    fn tick_all(&mut self, ticks: u32) {
        for _ in 0..ticks {
            let ids: Vec<MachineId> = self.engines.keys().copied().collect();
            for id in ids {
                self.step(id, Event::Tick);
            }
            self.settle();
        }
    }

    /// Ticks until exactly one machine leads; returns it.
    fn elect(&mut self) -> MachineId {
        for _ in 0..200 {
            self.tick_all(1);
            let leaders = self.leaders();
            if leaders.len() == 1 {
                return leaders[0];
            }
        }
        panic!("no leader after 200 ticks");
    }

    fn leaders(&self) -> Vec<MachineId> {
        self.engines
            .iter()
            .filter(|(id, engine)| engine.is_leader() && !self.isolated.contains(id))
            .map(|(&id, _)| id)
            .collect()
    }

    fn propose(&mut self, id: MachineId, token: u64, data: &[u8]) {
        self.step(id, Event::Propose { token: ProposalToken(token), data: data.to_vec() });
    }

    fn observed(&self, id: u64) -> &Observed {
        &self.observed[&machine(id)]
    }

    /// The non-empty entry data a machine applied, after its latest snapshot.
    fn applied_data(&self, id: u64) -> Vec<Vec<u8>> {
        let mut data = Vec::new();
        for applied in &self.observed(id).applied {
            match applied {
                Applied::Snapshot { data: image, .. } => data = vec![image.clone()],
                Applied::Entry { data: entry, .. } if !entry.is_empty() => data.push(entry.clone()),
                Applied::Entry { .. } => {}
            }
        }
        data
    }
}

/// What a shell does with a Persist (module docs, "Durability").
fn store(durable: &mut Durable, persist: &Persist) {
    if let Some(snapshot) = &persist.snapshot {
        durable.snapshot = Some(snapshot.clone());
        durable.entries.clear();
    }
    if let Some(first) = persist.entries.first() {
        durable.entries.retain(|entry| entry.index < first.index);
        durable.entries.extend(persist.entries.iter().cloned());
    }
    if let Some(hard_state) = &persist.hard_state {
        durable.hard_state = hard_state.clone();
    }
}

#[test]
fn single_voter_elects_itself_and_commits() {
    let config = QuorumConfig::new(machine(1), machines(&[1]), Vec::new());
    let (mut engine, commands) = QuorumEngine::open(config, Durable::default()).expect("valid");
    assert!(engine.is_leader(), "a sole voter leads at once");
    assert!(commands.contains(&Command::LeaderChanged { term: 1, leader: Some(machine(1)) }));
    let number = persist_number(&commands);
    let commands = engine.step(Event::PersistDone { number });
    assert!(
        commands.contains(&Command::Apply(Applied::Entry { index: 1, term: 1, data: Vec::new() })),
        "the leader's marker entry commits once durable: {commands:?}"
    );
    // The new commit index alone needs no fsync.
    let Some(Command::Persist(commit_only)) = commands.first() else {
        panic!("the commit index is persisted: {commands:?}");
    };
    assert!(!commit_only.must_sync && commit_only.entries.is_empty());
    engine.step(Event::PersistDone { number: commit_only.number });

    let commands = engine.step(Event::Propose { token: ProposalToken(7), data: b"topic".to_vec() });
    let number = persist_number(&commands);
    assert!(
        !commands.iter().any(|command| matches!(command, Command::ProposalCommitted { .. })),
        "nothing commits before it is durable"
    );
    let commands = engine.step(Event::PersistDone { number });
    let commands: Vec<Command> =
        commands.into_iter().filter(|command| !matches!(command, Command::Persist(_))).collect();
    assert_eq!(
        commands,
        vec![
            Command::Apply(Applied::Entry { index: 2, term: 1, data: b"topic".to_vec() }),
            Command::ProposalCommitted { token: ProposalToken(7), index: 2 },
        ]
    );
}

fn persist_number(commands: &[Command]) -> u64 {
    commands
        .iter()
        .find_map(|command| match command {
            Command::Persist(persist) => Some(persist.number),
            _ => None,
        })
        .expect("a Persist")
}

#[test]
fn three_voters_elect_one_leader_all_agree_on() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let leader = harness.elect();
    harness.tick_all(3);
    assert_eq!(harness.leaders(), vec![leader]);
    let term = harness.engines[&leader].term();
    for engine in harness.engines.values() {
        assert_eq!(engine.leader(), Some(leader));
        assert_eq!(engine.term(), term);
    }
    for id in [1, 2, 3] {
        assert_eq!(
            harness.observed(id).leaders.last(),
            Some(&(term, Some(leader))),
            "machine {id} reported the leader"
        );
    }
}

#[test]
fn proposal_on_follower_fails_with_not_controller_naming_the_leader() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let leader = harness.elect();
    let follower = [1, 2, 3].map(machine).into_iter().find(|&id| id != leader).expect("a follower");
    harness.propose(follower, 9, b"x");
    assert_eq!(
        harness.observed[&follower].failed,
        vec![(ProposalToken(9), ProposalError::NotController { leader: Some(leader) })]
    );
}

#[test]
fn proposal_commits_on_every_voter_and_the_learner() {
    let mut harness = Harness::new(&[1, 2, 3], &[4]);
    let leader = harness.elect();
    harness.propose(leader, 1, b"first");
    harness.settle();
    harness.tick_all(2);
    assert_eq!(harness.observed[&leader].committed.len(), 1);
    for id in [1, 2, 3, 4] {
        assert_eq!(harness.applied_data(id), vec![b"first".to_vec()], "machine {id}");
    }
}

#[test]
fn learner_follows_but_never_leads_or_accepts_proposals() {
    let mut harness = Harness::new(&[1, 2, 3], &[4]);
    let leader = harness.elect();
    // Long enough for several elections, had the learner been able to start one.
    harness.isolated.insert(leader);
    harness.tick_all(60);
    assert!(!harness.engines[&machine(4)].is_leader());
    let new_leader = harness.leaders()[0];
    harness.propose(machine(4), 5, b"x");
    assert_eq!(
        harness.observed(4).failed,
        vec![(ProposalToken(5), ProposalError::NotController { leader: Some(new_leader) })]
    );
}

#[test]
fn leader_loss_fails_pending_proposals_naming_the_new_leader() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let old = harness.elect();
    harness.isolated.insert(old);
    harness.propose(old, 3, b"never replicated");
    harness.settle();
    // The others elect a new leader while the old one is cut off, then the
    // link heals before check-quorum makes the old one step down on its own.
    let others: Vec<MachineId> = [1, 2, 3].map(machine).into_iter().filter(|&id| id != old).collect();
    let mut new_leader = None;
    for _ in 0..200 {
        for &id in &others {
            harness.step(id, Event::Tick);
        }
        harness.settle();
        new_leader = others.iter().copied().find(|id| harness.engines[id].is_leader());
        if new_leader.is_some() {
            break;
        }
    }
    let new_leader = new_leader.expect("the majority elects a leader");
    assert!(harness.engines[&old].is_leader(), "the old leader has not noticed yet");
    harness.isolated.remove(&old);
    harness.propose(new_leader, 4, b"after");
    // The new leader's next heartbeat carries its higher term.
    for _ in 0..super::HEARTBEAT_TICKS_DEFAULT {
        harness.step(new_leader, Event::Tick);
    }
    harness.settle();
    assert!(!harness.engines[&old].is_leader());
    assert_eq!(
        harness.observed[&old].failed,
        vec![(ProposalToken(3), ProposalError::LeaderLost { leader: Some(new_leader) })]
    );
    harness.tick_all(2);
    assert_eq!(harness.applied_data(old.get()), vec![b"after".to_vec()], "the overwritten entry is gone");
}

#[test]
fn isolated_leader_steps_down_by_check_quorum() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let old = harness.elect();
    harness.propose(old, 1, b"x");
    harness.isolated.insert(old);
    for _ in 0..2 * ELECTION_TICKS_DEFAULT {
        harness.step(old, Event::Tick);
    }
    assert!(!harness.engines[&old].is_leader());
    assert!(matches!(harness.observed[&old].failed.as_slice(), [(ProposalToken(1), ProposalError::LeaderLost { .. })]));
}

#[test]
fn follower_acknowledges_appends_only_after_persist_done() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let leader = harness.elect();
    let follower = [1, 2, 3].map(machine).into_iter().find(|&id| id != leader).expect("a follower");
    harness.disk_stalled.insert(follower);
    harness.propose(leader, 1, b"x");
    // Deliver by hand to see what the follower sends back.
    let mut acks_before = 0;
    while let Some((from, to, message)) = harness.network.pop_front() {
        if to == follower {
            let commands =
                harness.engines.get_mut(&to).expect("known").step(Event::Message { from, message: Box::new(message) });
            acks_before += commands
                .iter()
                .filter(|command| {
                    matches!(command, Command::Send { message, .. }
                        if message.get_msg_type() == MessageType::MsgAppendResponse && message.index >= 2)
                })
                .count();
            harness.carry_out(to, commands);
        }
    }
    assert_eq!(acks_before, 0, "no acknowledgement before the entry is durable");
    let (id, number) = harness.stalled_persists.pop().expect("a Persist waits");
    let commands = harness.engines.get_mut(&id).expect("known").step(Event::PersistDone { number });
    assert!(commands.iter().any(|command| matches!(command, Command::Send { message, .. }
        if message.get_msg_type() == MessageType::MsgAppendResponse && message.index >= 2)));
}

#[test]
fn lagging_follower_gets_the_compacted_log_as_a_snapshot() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let leader = harness.elect();
    let lagging = [1, 2, 3].map(machine).into_iter().find(|&id| id != leader).expect("a follower");
    harness.isolated.insert(lagging);
    for token in 0..5 {
        harness.propose(leader, token, format!("record {token}").as_bytes());
        harness.settle();
    }
    harness.tick_all(1);
    let applied = harness.engines[&leader].applied_index();
    let snapshot = harness
        .engines
        .get_mut(&leader)
        .expect("known")
        .compact(applied, b"image".to_vec())
        .expect("applied index compacts");
    assert_eq!(snapshot.get_metadata().index, applied);
    harness.isolated.remove(&lagging);
    harness.propose(leader, 99, b"after compaction");
    harness.settle();
    harness.tick_all(3);
    assert_eq!(harness.applied_data(lagging.get()), vec![b"image".to_vec(), b"after compaction".to_vec()]);
    assert!(harness.observed[&lagging]
        .applied
        .iter()
        .any(|applied| matches!(applied, Applied::Snapshot { index, .. } if *index == snapshot.get_metadata().index)));
}

#[test]
fn follower_that_installed_a_snapshot_can_campaign() {
    // Found by tests/raft_sim.rs (seed 321 of the first version): raft-rs
    // reads the entries after its applied index before campaigning, and
    // after a snapshot those are gone unless the snapshot counts as applied.
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let leader = harness.elect();
    let lagging = [1, 2, 3].map(machine).into_iter().find(|&id| id != leader).expect("a follower");
    harness.isolated.insert(lagging);
    for token in 0..3 {
        harness.propose(leader, token, b"r");
        harness.settle();
    }
    harness.tick_all(1);
    let applied = harness.engines[&leader].applied_index();
    harness.engines.get_mut(&leader).expect("known").compact(applied, b"image".to_vec()).expect("compacts");
    harness.isolated.remove(&lagging);
    harness.tick_all(3);
    assert!(harness.observed[&lagging].applied.iter().any(|applied| matches!(applied, Applied::Snapshot { .. })));
    harness.isolated.insert(leader);
    harness.tick_all(3 * ELECTION_TICKS_DEFAULT);
    assert_eq!(harness.leaders().len(), 1, "the two left elect a leader");
}

#[test]
fn compaction_refuses_an_index_not_yet_applied() {
    let config = QuorumConfig::new(machine(1), machines(&[1]), Vec::new());
    let (mut engine, _) = QuorumEngine::open(config, Durable::default()).expect("valid");
    assert!(matches!(
        engine.compact(5, Vec::new()),
        Err(QuorumError::CompactionNotApplied { index: 5, applied_index: 0 })
    ));
}

#[test]
fn restart_replays_the_snapshot_then_committed_entries() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let leader = harness.elect();
    for token in 0..3 {
        harness.propose(leader, token, format!("r{token}").as_bytes());
        harness.settle();
    }
    harness.tick_all(2);
    let follower = [1, 2, 3].map(machine).into_iter().find(|&id| id != leader).expect("a follower");
    let snapshot_index = harness.engines[&follower].applied_index() - 1;
    let snapshot = harness
        .engines
        .get_mut(&follower)
        .expect("known")
        .compact(snapshot_index, b"image".to_vec())
        .expect("compacts");
    let durable = {
        let durable = &mut harness.observed.get_mut(&follower).expect("known").durable;
        durable.entries.retain(|entry| entry.index > snapshot_index);
        durable.snapshot = Some(snapshot);
        durable.clone()
    };
    let (_, commands) =
        QuorumEngine::open(QuorumConfig::new(follower, machines(&[1, 2, 3]), Vec::new()), durable).expect("reopens");
    let applied: Vec<&Applied> = commands
        .iter()
        .filter_map(|command| match command {
            Command::Apply(applied) => Some(applied),
            _ => None,
        })
        .collect();
    assert!(
        matches!(applied[0], Applied::Snapshot { index, data, .. } if *index == snapshot_index && data == b"image")
    );
    assert!(matches!(applied[1], Applied::Entry { index, data, .. } if *index == snapshot_index + 1 && data == b"r2"));
}

#[test]
fn restart_refuses_a_changed_voter_list() {
    let config = QuorumConfig::new(machine(1), machines(&[1]), Vec::new());
    let (mut engine, commands) = QuorumEngine::open(config, Durable::default()).expect("valid");
    let mut durable = Durable::default();
    for command in &commands {
        if let Command::Persist(persist) = command {
            store(&mut durable, persist);
        }
    }
    engine.step(Event::PersistDone { number: persist_number(&commands) });
    durable.snapshot = Some(engine.compact(1, Vec::new()).expect("compacts"));
    durable.entries.clear();
    let config = QuorumConfig::new(machine(1), machines(&[1, 2, 3]), Vec::new());
    assert!(matches!(QuorumEngine::open(config, durable), Err(QuorumError::MembershipChanged { .. })));
}

#[test]
fn restart_refuses_a_log_with_a_gap() {
    let entry = |index| Entry { index, term: 1, ..Entry::default() };
    let durable = Durable { entries: vec![entry(1), entry(3)], ..Durable::default() };
    let config = QuorumConfig::new(machine(1), machines(&[1]), Vec::new());
    assert!(matches!(
        QuorumEngine::open(config, durable),
        Err(QuorumError::DurableLogBroken { index: 3, expected_index: 2 })
    ));
}

#[test]
fn peers_cannot_inject_proposals_or_speak_for_others() {
    let mut harness = Harness::new(&[1, 2, 3], &[]);
    let leader = harness.elect();
    let follower = [1, 2, 3].map(machine).into_iter().find(|&id| id != leader).expect("a follower");
    let last_index = harness.engines[&leader].commit_index();
    let mut forwarded = Message::default();
    forwarded.set_msg_type(MessageType::MsgPropose);
    forwarded.from = follower.get();
    forwarded.to = leader.get();
    forwarded.entries = vec![Entry { data: b"injected".to_vec(), ..Entry::default() }];
    harness.step(leader, Event::Message { from: follower, message: Box::new(forwarded.clone()) });
    let mut spoofed = forwarded;
    spoofed.set_msg_type(MessageType::MsgHeartbeat);
    spoofed.from = 7;
    harness.step(leader, Event::Message { from: follower, message: Box::new(spoofed) });
    harness.settle();
    harness.tick_all(2);
    assert_eq!(harness.engines[&leader].commit_index(), last_index);
    assert!(harness.applied_data(leader.get()).is_empty());
}

#[test]
fn config_errors_name_the_problem() {
    let open = |config: QuorumConfig| QuorumEngine::open(config, Durable::default()).map(|_| ());
    assert!(matches!(
        open(QuorumConfig::new(machine(4), machines(&[1, 2, 3]), Vec::new())),
        Err(QuorumError::NotAMember { .. })
    ));
    assert!(matches!(
        open(QuorumConfig::new(machine(1), machines(&[1, 2]), machines(&[2]))),
        Err(QuorumError::ListedTwice { .. })
    ));
    assert!(matches!(open(QuorumConfig::new(machine(1), Vec::new(), machines(&[1]))), Err(QuorumError::NoVoters)));
    let mut config = QuorumConfig::new(machine(1), machines(&[1]), Vec::new());
    config.election_ticks = config.heartbeat_ticks;
    assert!(matches!(open(config), Err(QuorumError::Ticks { .. })));
}

#[test]
fn oversized_proposal_is_refused() {
    let config = QuorumConfig::new(machine(1), machines(&[1]), Vec::new());
    let (mut engine, _) = QuorumEngine::open(config, Durable::default()).expect("valid");
    let commands = engine.step(Event::Propose { token: ProposalToken(1), data: vec![0; ENTRY_BYTES_MAX_DEFAULT + 1] });
    assert!(matches!(commands.as_slice(), [Command::ProposalFailed { error: ProposalError::TooLarge { .. }, .. }]));
}

#[test]
fn garbage_from_the_wire_is_an_error() {
    // A field 1 varint that never ends.
    assert!(matches!(decode_message(&[0x08, 0xff, 0xff]), Err(QuorumError::Decode(_))));
}
