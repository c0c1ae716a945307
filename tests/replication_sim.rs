//! A seeded, reproducible simulation of replication (issue 30): one
//! partition with three replicas on three machines, `min.insync.replicas`
//! 2, acks=all producers, followers fetching, machines that crash and
//! restart, links that are cut, machines cut off from the controller, and
//! metadata that reaches each machine late. No sockets, threads or clocks;
//! one seed decides everything.
//!
//! What is real: the controller's decisions (`cluster::control`: placement,
//! fencing and elections, AlterPartition checks, re-registration), the
//! metadata replay (`cluster::image`), the leader's state machine
//! (`replica::leader`: ISR, high watermark, lag) and the leader-epoch cache
//! with the truncation rule (`replica::epochs`). What is modelled: the
//! glue the shard and the fetcher put around them (`shard::replication`,
//! `replica::follower`), logs as vectors (flush=always: an append is
//! durable when it is made), and a controller quorum that never fails
//! (tests/raft_sim.rs covers it).
//!
//! Checked after every step:
//! (a) at most one replica acts as leader in any leader epoch;
//! (b) every acknowledged write is in the log of every replica of the
//!     committed ISR, at its offset, and in no other place of those logs;
//! (c) what a consumer read below a leader's high watermark never changes:
//!     no offset is ever seen with two values;
//! and once the faults stop and every machine is back: (d) a new write is
//!     acknowledged within `LIVENESS_MS`, and (e) every replica's log equals
//!     the leader's up to its high watermark.
//!
//! `SHARDLOG_REPL_SEEDS=N` runs seeds 1..=N (default `SEEDS_DEFAULT`);
//! `SHARDLOG_REPL_SEED=N` replays one seed. A failure names its seed.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{self, AssertUnwindSafe};

use shardlog::cluster::control::{
    alter_isr, create_topics, fence_machines, register_machine, unfence_machine, ControlContext, IsrChange,
    TopicRequest,
};
use shardlog::cluster::image::{ClusterImage, MetadataDelta, Provenance};
use shardlog::cluster::records::MetadataRecord;
use shardlog::replica::epochs::{truncation_offset, LeaderEpochCache, UNDEFINED_EPOCH};
use shardlog::replica::leader::{Command, LeaderConfig, LeaderState, Registration};

const SEEDS_DEFAULT: u64 = 300;
const MACHINES: u64 = 3;
const TOPIC: &str = "t";
const STEPS_FAULTY: usize = 3_000;
/// After healing, a write must be acknowledged within this (virtual ms).
const LIVENESS_MS: u64 = 20_000;
const LEASE_MS: u64 = 2_000;
const CONFIG: LeaderConfig = LeaderConfig { min_insync: 2, lag_time_max_ms: 2_500 };
/// Entries a follower copies per fetch, at most.
const FETCH_ENTRIES_MAX: usize = 4;

#[test]
fn simulated_faults_never_lose_an_acknowledged_write_or_split_a_leader_epoch() {
    let seeds = seeds();
    let mut totals = (0usize, 0usize, 0usize, 0usize);
    for seed in &seeds {
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| Sim::new(*seed).run()));
        match outcome {
            Ok(done) => {
                totals.0 += done.acked;
                totals.1 += done.crashes;
                totals.2 += done.elections;
                totals.3 += done.truncations;
            }
            Err(cause) => {
                eprintln!(
                    "replication_sim: seed {seed} failed; replay with: \
                     SHARDLOG_REPL_SEED={seed} cargo test --test replication_sim -- --nocapture"
                );
                panic::resume_unwind(cause);
            }
        }
    }
    println!(
        "replication_sim: {} seeds; {} writes acknowledged, {} crashes, {} leader changes, {} truncations",
        seeds.len(),
        totals.0,
        totals.1,
        totals.2,
        totals.3
    );
    assert!(totals.0 > 0 && totals.2 > 0, "the faults must bite: writes acknowledged and leaders changed");
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("SHARDLOG_REPL_SEED") {
        return vec![seed.parse().expect("SHARDLOG_REPL_SEED is a number")];
    }
    let count = std::env::var("SHARDLOG_REPL_SEEDS")
        .map(|count| count.parse().expect("SHARDLOG_REPL_SEEDS is a number"))
        .unwrap_or(SEEDS_DEFAULT);
    (1..=count).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    epoch: i32,
    value: u64,
}

#[derive(Debug, Clone)]
enum Role {
    /// Not applied any image since it started.
    Unknown,
    Leader(Box<LeaderState>),
    Follower {
        leader: i32,
        epoch: i32,
        truncated: bool,
    },
}

struct Replica {
    node: i32,
    machine: u64,
    up: bool,
    incarnation: u64,
    /// Durable (flush=always).
    log: Vec<Entry>,
    epochs: LeaderEpochCache,
    high_watermark: i64,
    role: Role,
    /// Provenance of the image it applied last.
    applied: Provenance,
}

impl Replica {
    fn end(&self) -> i64 {
        self.log.len() as i64
    }
}

struct Pending {
    node: i32,
    epoch: i32,
    offset: i64,
    value: u64,
}

#[derive(Default)]
struct Done {
    acked: usize,
    crashes: usize,
    elections: usize,
    truncations: usize,
}

struct Sim {
    seed: u64,
    rng: Rng,
    now_ms: u64,
    image: ClusterImage,
    topic_id: [u8; 16],
    replicas: Vec<Replica>,
    /// Node pairs whose link is cut.
    cut: BTreeSet<(i32, i32)>,
    /// Machines cut off from the controller (no heartbeats, no metadata).
    isolated: BTreeSet<u64>,
    heard: BTreeMap<u64, u64>,
    pending: Vec<Pending>,
    acked: BTreeMap<i64, u64>,
    seen: BTreeMap<i64, u64>,
    next_value: u64,
    done: Done,
    last_leader: i32,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut image = ClusterImage::default();
        for machine in 1..=MACHINES {
            let endpoints = vec![(format!("10.0.0.{machine}"), 9092)];
            let records = register_machine(&image, machine, 1, None, &endpoints, None).expect("registers");
            image = commit(&image, &records);
            image = commit(&image, &unfence_machine(&image, machine));
        }
        let check = |_: &BTreeMap<String, String>| Ok(());
        let context = ControlContext {
            default_partitions: 1,
            default_replication_factor: 3,
            check_topic_configs: &check,
            salt: seed,
        };
        let request = TopicRequest {
            name: TOPIC.into(),
            partitions: 1,
            replication_factor: 3,
            configs: BTreeMap::new(),
            assignments: Vec::new(),
        };
        let decision = create_topics(&image, &[request], &context);
        image = commit(&image, &decision.records);
        let topic_id = image.topic_ids[TOPIC];
        let replicas = image
            .nodes
            .iter()
            .map(|(node, placement)| Replica {
                node: node.0,
                machine: placement.machine,
                up: true,
                incarnation: 1,
                log: Vec::new(),
                epochs: LeaderEpochCache::default(),
                high_watermark: 0,
                role: Role::Unknown,
                applied: Provenance::default(),
            })
            .collect();
        let heard = (1..=MACHINES).map(|m| (m, 0)).collect();
        Sim {
            seed,
            rng: Rng::new(seed),
            now_ms: 0,
            image,
            topic_id,
            replicas,
            cut: BTreeSet::new(),
            isolated: BTreeSet::new(),
            heard,
            pending: Vec::new(),
            acked: BTreeMap::new(),
            seen: BTreeMap::new(),
            next_value: 1,
            done: Done::default(),
            last_leader: -1,
        }
    }

    fn run(mut self) -> Done {
        for _ in 0..STEPS_FAULTY {
            self.step(true);
        }
        self.heal();
        let value = self.next_value;
        let healed_at = self.now_ms;
        let mut asked = false;
        loop {
            self.step(false);
            if !asked && self.produce_on_leader() {
                asked = true;
            }
            if asked && self.acked.values().any(|v| *v >= value) && self.converged() {
                break;
            }
            assert!(
                self.now_ms - healed_at < LIVENESS_MS,
                "seed {}: no write acknowledged and replicas converged within {LIVENESS_MS} ms of healing \
                 (asked {asked}; image {:?}; replicas {})",
                self.seed,
                self.partition(),
                self.describe()
            );
        }
        self.check_converged();
        self.done.acked = self.acked.len();
        self.done
    }

    fn partition(&self) -> shardlog::cluster::image::PartitionImage {
        (*self.image.topic(TOPIC).expect("topic").partitions[0]).clone()
    }

    fn step(&mut self, faults: bool) {
        self.now_ms += 1 + self.rng.below(20);
        let roll = self.rng.below(100);
        match roll {
            // After healing, only the one write `run` asks for.
            0..=24 if faults => {
                self.produce_on_leader();
            }
            25..=59 => self.fetch_some(),
            60..=69 => self.apply_images(),
            70..=74 => self.tick_leaders(),
            75..=84 => self.consume(),
            85..=99 if faults => self.fault(),
            _ => {}
        }
        self.controller_step();
        self.settle_pending();
        self.check_safety();
    }

    // ----- the controller (always available; decides on the committed image)

    fn controller_step(&mut self) {
        for replica in &self.replicas {
            if replica.up && !self.isolated.contains(&replica.machine) {
                self.heard.insert(replica.machine, self.now_ms);
            }
        }
        let expired: Vec<u64> = self
            .image
            .machines
            .iter()
            .filter(|(id, m)| !m.fenced && self.now_ms - self.heard[&id.get()] > LEASE_MS)
            .map(|(id, _)| id.get())
            .collect();
        if !expired.is_empty() {
            let records = fence_machines(&self.image, &expired);
            self.image = commit(&self.image, &records);
        }
        let returning: Vec<u64> = self
            .image
            .machines
            .iter()
            .filter(|(id, m)| m.fenced && self.now_ms - self.heard[&id.get()] < LEASE_MS / 4)
            .map(|(id, _)| id.get())
            .collect();
        for machine in returning {
            let records = unfence_machine(&self.image, machine);
            self.image = commit(&self.image, &records);
        }
        let leader = self.partition().leader;
        if leader != self.last_leader {
            self.done.elections += 1;
            self.last_leader = leader;
        }
    }

    // ----- the shard's glue: the image a machine applies gives roles

    fn apply_images(&mut self) {
        let at = self.rng.below(self.replicas.len() as u64) as usize;
        let machine = self.replicas[at].machine;
        if !self.replicas[at].up || self.isolated.contains(&machine) {
            return;
        }
        self.apply_image(at);
    }

    fn apply_image(&mut self, at: usize) {
        let partition = self.partition();
        let registration = Registration {
            replicas: partition.replicas.clone(),
            isr: partition.isr.clone(),
            leader_epoch: partition.leader_epoch,
            partition_epoch: partition.partition_epoch,
        };
        let now = self.now_ms;
        let replica = &mut self.replicas[at];
        replica.applied = self.image.provenance;
        let end = replica.end();
        let mut commands = Vec::new();
        if partition.leader == replica.node {
            let same = matches!(&replica.role, Role::Leader(state) if state.leader_epoch() == partition.leader_epoch);
            if same {
                let Role::Leader(state) = &mut replica.role else { unreachable!() };
                commands = state.on_registration(registration, end, now);
            } else {
                replica.epochs.assign(partition.leader_epoch, end);
                let mut state = LeaderState::new(replica.node, registration, end, replica.high_watermark, now, CONFIG);
                replica.high_watermark = state.high_watermark();
                commands.extend(state.on_log_end(end));
                replica.role = Role::Leader(Box::new(state));
            }
        } else {
            let same = matches!(&replica.role, Role::Follower { leader, epoch, .. }
                if *leader == partition.leader && *epoch == partition.leader_epoch);
            if !same {
                replica.role =
                    Role::Follower { leader: partition.leader, epoch: partition.leader_epoch, truncated: false };
            }
        }
        self.carry_out(at, commands);
    }

    fn carry_out(&mut self, at: usize, commands: Vec<Command>) {
        for command in commands {
            match command {
                Command::HighWatermark(high_watermark) => self.replicas[at].high_watermark = high_watermark,
                Command::AlterIsr { isr, partition_epoch } => {
                    let replica = &self.replicas[at];
                    let Role::Leader(state) = &replica.role else { continue };
                    let machine_epoch = self
                        .image
                        .machines
                        .iter()
                        .find(|(id, _)| id.get() == replica.machine)
                        .map_or(0, |(_, m)| m.epoch);
                    let change = IsrChange {
                        topic_id: self.topic_id,
                        partition: 0,
                        leader: replica.node,
                        machine_epoch,
                        leader_epoch: state.leader_epoch(),
                        partition_epoch,
                        isr,
                    };
                    let reachable = !self.isolated.contains(&replica.machine);
                    match alter_isr(&self.image, &change) {
                        Ok(records) if reachable => self.image = commit(&self.image, &records),
                        _ => {
                            if let Role::Leader(state) = &mut self.replicas[at].role {
                                state.on_alter_failed();
                            }
                        }
                    }
                }
            }
        }
    }

    // ----- clients

    /// An acks=all write to a replica that acts as leader; false when none
    /// takes it.
    fn produce_on_leader(&mut self) -> bool {
        let leaders: Vec<usize> = (0..self.replicas.len())
            .filter(|at| self.replicas[*at].up && matches!(self.replicas[*at].role, Role::Leader(_)))
            .collect();
        if leaders.is_empty() {
            return false;
        }
        let at = leaders[self.rng.below(leaders.len() as u64) as usize];
        let replica = &mut self.replicas[at];
        let Role::Leader(state) = &mut replica.role else { unreachable!() };
        if !state.enough_in_sync() {
            return false;
        }
        let epoch = state.leader_epoch();
        let value = self.next_value;
        self.next_value += 1;
        replica.log.push(Entry { epoch, value });
        let end = replica.log.len() as i64;
        let commands = state.on_log_end(end);
        self.pending.push(Pending { node: replica.node, epoch, offset: end - 1, value });
        self.carry_out(at, commands);
        true
    }

    /// Acknowledges writes below their leader's high watermark; a write
    /// whose leader stopped leading stays unacknowledged (its client saw
    /// an error or a timeout).
    fn settle_pending(&mut self) {
        let mut keep = Vec::new();
        for pending in std::mem::take(&mut self.pending) {
            let replica = self.replicas.iter().find(|r| r.node == pending.node).expect("a replica");
            let still = replica.up && matches!(&replica.role, Role::Leader(s) if s.leader_epoch() == pending.epoch);
            if !still {
                continue;
            }
            if replica.high_watermark > pending.offset {
                let before = self.acked.insert(pending.offset, pending.value);
                assert!(before.is_none(), "seed {}: offset {} acknowledged twice", self.seed, pending.offset);
            } else {
                keep.push(pending);
            }
        }
        self.pending = keep;
    }

    /// A consumer reads a leader's log below its high watermark.
    fn consume(&mut self) {
        let at = self.rng.below(self.replicas.len() as u64) as usize;
        let replica = &self.replicas[at];
        if !replica.up || !matches!(replica.role, Role::Leader(_)) {
            return;
        }
        for offset in 0..replica.high_watermark.min(replica.end()) {
            let value = replica.log[offset as usize].value;
            let before = *self.seen.entry(offset).or_insert(value);
            assert_eq!(
                before, value,
                "seed {}: offset {offset} read as {before} and later as {value} (node {})",
                self.seed, replica.node
            );
        }
    }

    // ----- followers

    fn fetch_some(&mut self) {
        let at = self.rng.below(self.replicas.len() as u64) as usize;
        let (leader, epoch, truncated) = match &self.replicas[at].role {
            Role::Follower { leader, epoch, truncated } if *leader >= 0 => (*leader, *epoch, *truncated),
            _ => return,
        };
        let follower = self.replicas[at].node;
        let Some(from) = self.replicas.iter().position(|r| r.node == leader) else { return };
        let pair = (follower.min(leader), follower.max(leader));
        if !self.replicas[at].up || !self.replicas[from].up || self.cut.contains(&pair) {
            return;
        }
        // The leader answers only in the epoch it leads (FENCED / UNKNOWN_LEADER_EPOCH).
        let serves = matches!(&self.replicas[from].role, Role::Leader(s) if s.leader_epoch() == epoch);
        if !serves {
            return;
        }
        if !truncated {
            self.exchange_epochs(at, from, epoch);
            return;
        }
        let fetch_offset = self.replicas[at].end();
        let leader_end = self.replicas[from].end();
        if fetch_offset > leader_end {
            // OFFSET_OUT_OF_RANGE: check for divergence again.
            self.replicas[at].role = Role::Follower { leader, epoch, truncated: false };
            return;
        }
        let now = self.now_ms;
        let commands = match &mut self.replicas[from].role {
            Role::Leader(state) => state.on_follower_fetch(follower, fetch_offset, leader_end, now),
            _ => unreachable!(),
        };
        self.carry_out(from, commands);
        let upto =
            (fetch_offset as usize + 1 + self.rng.below(FETCH_ENTRIES_MAX as u64) as usize).min(leader_end as usize);
        let copied: Vec<Entry> = self.replicas[from].log[fetch_offset as usize..upto].to_vec();
        let leader_high_watermark = self.replicas[from].high_watermark;
        let replica = &mut self.replicas[at];
        for entry in copied {
            let offset = replica.end();
            if replica.epochs.latest().is_none_or(|e| entry.epoch > e.epoch) {
                replica.epochs.assign(entry.epoch, offset);
            }
            replica.log.push(entry);
        }
        // KAFKA-14704: after the append, never above what it holds.
        let high_watermark = leader_high_watermark.min(replica.end());
        replica.high_watermark = replica.high_watermark.max(high_watermark);
    }

    /// OffsetForLeaderEpoch and truncation, one round.
    fn exchange_epochs(&mut self, at: usize, from: usize, epoch: i32) {
        let latest = self.replicas[at].epochs.latest().map_or(UNDEFINED_EPOCH, |e| e.epoch);
        let leader = &self.replicas[from];
        let (leader_epoch, leader_end) = leader.epochs.end_offset_for(latest, leader.end());
        let replica = &mut self.replicas[at];
        let end = replica.end();
        let cut = truncation_offset(&replica.epochs, end, leader_epoch, leader_end)
            .unwrap_or(if latest == UNDEFINED_EPOCH && end == 0 { end } else { replica.high_watermark });
        if cut >= end {
            let leader = match replica.role {
                Role::Follower { leader, .. } => leader,
                _ => unreachable!(),
            };
            replica.role = Role::Follower { leader, epoch, truncated: true };
            return;
        }
        replica.log.truncate(cut as usize);
        replica.epochs.truncate_from(cut);
        replica.high_watermark = replica.high_watermark.min(cut);
        self.done.truncations += 1;
    }

    fn tick_leaders(&mut self) {
        let now = self.now_ms;
        for at in 0..self.replicas.len() {
            if !self.replicas[at].up {
                continue;
            }
            let commands = match &mut self.replicas[at].role {
                Role::Leader(state) => state.on_tick(now),
                _ => continue,
            };
            self.carry_out(at, commands);
        }
    }

    // ----- faults

    fn fault(&mut self) {
        let at = self.rng.below(self.replicas.len() as u64) as usize;
        match self.rng.below(6) {
            0 if self.replicas[at].up => {
                // kill -9: what is durable stays, the rest goes.
                let replica = &mut self.replicas[at];
                replica.up = false;
                replica.role = Role::Unknown;
                replica.high_watermark = 0;
                self.done.crashes += 1;
            }
            1 if !self.replicas[at].up => self.restart(at),
            2 => {
                let other = self.replicas[self.rng.below(self.replicas.len() as u64) as usize].node;
                let node = self.replicas[at].node;
                if other != node {
                    self.cut.insert((node.min(other), node.max(other)));
                }
            }
            3 => {
                self.isolated.insert(self.replicas[at].machine);
            }
            4 => {
                self.cut.clear();
                self.isolated.clear();
            }
            _ => {}
        }
    }

    fn restart(&mut self, at: usize) {
        let replica = &mut self.replicas[at];
        replica.up = true;
        replica.incarnation += 1;
        replica.role = Role::Unknown;
        replica.high_watermark = 0;
        let endpoints = vec![(format!("10.0.0.{}", replica.machine), 9092)];
        let records = register_machine(&self.image, replica.machine, replica.incarnation, None, &endpoints, None)
            .expect("registers");
        self.image = commit(&self.image, &records);
    }

    fn heal(&mut self) {
        self.cut.clear();
        self.isolated.clear();
        for at in 0..self.replicas.len() {
            if !self.replicas[at].up {
                self.restart(at);
            }
        }
    }

    // ----- checks

    fn describe(&self) -> String {
        let mut out = String::new();
        for r in &self.replicas {
            let role = match &r.role {
                Role::Unknown => "unknown".to_string(),
                Role::Leader(state) => {
                    format!("leader e{} isr {:?} hw {}", state.leader_epoch(), state.isr(), state.high_watermark())
                }
                Role::Follower { leader, epoch, truncated } => {
                    format!("follower of {leader} e{epoch} truncated {truncated}")
                }
            };
            out += &format!(
                "\n  node {} up {} end {} hw {} epochs {:?}: {role}",
                r.node,
                r.up,
                r.end(),
                r.high_watermark,
                r.epochs.entries()
            );
        }
        out
    }

    fn check_safety(&self) {
        let mut leaders: BTreeMap<i32, i32> = BTreeMap::new();
        for replica in self.replicas.iter().filter(|r| r.up) {
            if let Role::Leader(state) = &replica.role {
                if let Some(other) = leaders.insert(state.leader_epoch(), replica.node) {
                    panic!(
                        "seed {}: nodes {other} and {} both lead epoch {}",
                        self.seed,
                        replica.node,
                        state.leader_epoch()
                    );
                }
            }
        }
        let isr = self.partition().isr;
        for (offset, value) in &self.acked {
            for replica in self.replicas.iter().filter(|r| isr.contains(&r.node)) {
                let held = replica.log.get(*offset as usize).map(|e| e.value);
                assert_eq!(
                    held,
                    Some(*value),
                    "seed {}: acknowledged {value} at {offset} missing from node {} of the ISR {isr:?} (log end {})",
                    self.seed,
                    replica.node,
                    replica.end()
                );
            }
        }
    }

    /// Every replica applied the last image, follows the leader and holds
    /// its log up to the leader's high watermark.
    fn converged(&mut self) -> bool {
        for at in 0..self.replicas.len() {
            if self.replicas[at].applied != self.image.provenance {
                self.apply_image(at);
            }
        }
        let leader = self.partition().leader;
        let Some(lead) = self.replicas.iter().find(|r| r.node == leader) else { return false };
        lead.high_watermark == lead.end()
            && self.partition().isr.len() == self.replicas.len()
            && self.replicas.iter().all(|r| r.end() == lead.end())
    }

    fn check_converged(&self) {
        let leader = self.partition().leader;
        let lead = self.replicas.iter().find(|r| r.node == leader).expect("a leader");
        for replica in &self.replicas {
            assert_eq!(
                replica.log, lead.log,
                "seed {}: node {} diverges from leader {leader}",
                self.seed, replica.node
            );
        }
        for (offset, value) in &self.acked {
            assert_eq!(
                lead.log.get(*offset as usize).map(|e| e.value),
                Some(*value),
                "seed {}: lost {value}",
                self.seed
            );
        }
        for (offset, value) in &self.seen {
            assert_eq!(
                lead.log.get(*offset as usize).map(|e| e.value),
                Some(*value),
                "seed {}: read {value} at {offset} is gone",
                self.seed
            );
        }
    }
}

fn commit(image: &ClusterImage, records: &[MetadataRecord]) -> ClusterImage {
    if records.is_empty() {
        return image.clone();
    }
    let at = Provenance { offset: image.provenance.offset + 1, epoch: 1 };
    let mut delta = MetadataDelta::new(image);
    for record in records {
        delta.replay(at, record).unwrap_or_else(|e| panic!("{record:?}: {e}"));
    }
    delta.finish().0
}

/// xorshift64*: the same numbers on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}
