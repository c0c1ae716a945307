//! The leader side of one partition's replication as a state machine:
//! events in (the leader's own log end moved, a follower fetched, time
//! passed, the controller committed a registration), commands out (a new
//! high watermark, an ISR change to ask the controller for). No I/O: the
//! partition's core feeds it and carries the commands out
//! (`shard::replication`), and the tests below drive it without sockets.
//!
//! Kafka's rules, as KIP-966 tightens them:
//! - The high watermark is the smallest log end offset over the ISR, and
//!   never moves back. While an ISR change is pending, the ISR counted is
//!   the committed one together with the requested one (KIP-497's maximal
//!   ISR), so a follower leaving is still waited for and one joining
//!   already counts.
//! - It does not advance while that ISR is smaller than
//!   `min.insync.replicas`: an acknowledged write is on that many replicas.
//! - A follower is caught up when it fetches from the leader's log end (or
//!   from where the log ended at its previous fetch); one not caught up
//!   for `replica.lag.time.max.ms` leaves the ISR.
//! - A follower outside the ISR joins once its log end reaches the high
//!   watermark and the start of the leader's epoch.

use std::collections::BTreeMap;

/// A partition's registration as the controller committed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderConfig {
    /// `min.insync.replicas`.
    pub min_insync: usize,
    /// `replica.lag.time.max.ms`.
    pub lag_time_max_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Readers and acks=all waiters may go up to this offset.
    HighWatermark(i64),
    /// Ask the controller for this ISR (AlterPartition), made on the
    /// registration of `partition_epoch`.
    AlterIsr { isr: Vec<i32>, partition_epoch: i32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Follower {
    /// The follower's log end, as its last fetch offset says; -1: unknown.
    end_offset: i64,
    caught_up_ms: u64,
    /// The leader's log end when the follower last fetched, and when.
    last_fetch_leader_end: i64,
    last_fetch_ms: u64,
}

#[derive(Debug, Clone)]
pub struct LeaderState {
    me: i32,
    registration: Registration,
    /// The ISR asked for and not yet committed.
    pending_isr: Option<Vec<i32>>,
    followers: BTreeMap<i32, Follower>,
    high_watermark: i64,
    /// The log end when this leader's epoch began.
    epoch_start_offset: i64,
    config: LeaderConfig,
}

impl LeaderState {
    /// A replica that became leader with `registration`; its log ends at
    /// `log_end` and what it knew committed ends at `high_watermark`.
    /// Followers get one lag period from now before they can be dropped.
    pub fn new(
        me: i32,
        registration: Registration,
        log_end: i64,
        high_watermark: i64,
        now_ms: u64,
        config: LeaderConfig,
    ) -> Self {
        let mut state = Self {
            me,
            registration: registration.clone(),
            pending_isr: None,
            followers: BTreeMap::new(),
            high_watermark: high_watermark.min(log_end),
            epoch_start_offset: log_end,
            config,
        };
        state.track_followers(now_ms);
        state
    }

    pub fn leader_epoch(&self) -> i32 {
        self.registration.leader_epoch
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// The committed ISR.
    pub fn isr(&self) -> &[i32] {
        &self.registration.isr
    }

    pub fn replicas(&self) -> &[i32] {
        &self.registration.replicas
    }

    pub fn config(&self) -> LeaderConfig {
        self.config
    }

    pub fn set_config(&mut self, config: LeaderConfig) {
        self.config = config;
    }

    /// Whether the committed ISR has `min.insync.replicas` members: acks=all
    /// produces are refused (NOT_ENOUGH_REPLICAS) when it has not.
    pub fn enough_in_sync(&self) -> bool {
        self.registration.isr.len() >= self.config.min_insync
    }

    /// Each follower's log end as last reported (-1: not yet fetched).
    pub fn follower_ends(&self) -> impl Iterator<Item = (i32, i64)> + '_ {
        self.followers.iter().map(|(node, f)| (*node, f.end_offset))
    }

    /// The leader's own log end (what it has durable) moved.
    pub fn on_log_end(&mut self, log_end: i64) -> Vec<Command> {
        self.advance(log_end).into_iter().collect()
    }

    /// `follower` fetched from `fetch_offset` while the leader's log ended
    /// at `log_end`: its log ends there.
    pub fn on_follower_fetch(&mut self, follower: i32, fetch_offset: i64, log_end: i64, now_ms: u64) -> Vec<Command> {
        let Some(state) = self.followers.get_mut(&follower) else { return Vec::new() };
        if fetch_offset >= log_end {
            state.caught_up_ms = now_ms;
        } else if fetch_offset >= state.last_fetch_leader_end {
            state.caught_up_ms = state.caught_up_ms.max(state.last_fetch_ms);
        }
        state.end_offset = fetch_offset;
        state.last_fetch_leader_end = log_end;
        state.last_fetch_ms = now_ms;
        let mut commands = Vec::new();
        let joins = self.pending_isr.is_none()
            && !self.registration.isr.contains(&follower)
            && fetch_offset >= self.high_watermark
            && fetch_offset >= self.epoch_start_offset;
        if joins {
            let mut isr = self.registration.isr.clone();
            isr.push(follower);
            commands.push(self.ask(isr));
        }
        commands.extend(self.advance(log_end));
        commands
    }

    /// Drops followers that lag by more than `replica.lag.time.max.ms` from
    /// the ISR (one request for all of them), unless a change is pending.
    pub fn on_tick(&mut self, now_ms: u64) -> Vec<Command> {
        if self.pending_isr.is_some() {
            return Vec::new();
        }
        let lag_max = self.config.lag_time_max_ms;
        let lagging: Vec<i32> = self
            .registration
            .isr
            .iter()
            .copied()
            .filter(|node| *node != self.me)
            .filter(|node| self.followers.get(node).is_none_or(|f| now_ms.saturating_sub(f.caught_up_ms) > lag_max))
            .collect();
        if lagging.is_empty() {
            return Vec::new();
        }
        let isr = self.registration.isr.iter().copied().filter(|node| !lagging.contains(node)).collect();
        vec![self.ask(isr)]
    }

    /// The controller committed `registration` for this leader's epoch (an
    /// ISR change, whether this leader asked for it or not). The pending
    /// request is settled by any newer partition epoch.
    pub fn on_registration(&mut self, registration: Registration, log_end: i64, now_ms: u64) -> Vec<Command> {
        assert_eq!(registration.leader_epoch, self.registration.leader_epoch, "a new leader epoch is a new leader");
        if registration.partition_epoch > self.registration.partition_epoch {
            self.pending_isr = None;
        }
        self.registration = registration;
        self.track_followers(now_ms);
        self.advance(log_end).into_iter().collect()
    }

    /// The controller refused the pending ISR change (or could not be
    /// reached): the next fetch or tick asks again.
    pub fn on_alter_failed(&mut self) {
        self.pending_isr = None;
    }

    fn ask(&mut self, isr: Vec<i32>) -> Command {
        self.pending_isr = Some(isr.clone());
        Command::AlterIsr { isr, partition_epoch: self.registration.partition_epoch }
    }

    fn track_followers(&mut self, now_ms: u64) {
        let me = self.me;
        let replicas = &self.registration.replicas;
        self.followers.retain(|node, _| replicas.contains(node));
        for node in replicas.iter().copied().filter(|node| *node != me) {
            self.followers.entry(node).or_insert(Follower {
                end_offset: -1,
                caught_up_ms: now_ms,
                last_fetch_leader_end: i64::MAX,
                last_fetch_ms: now_ms,
            });
        }
    }

    /// Moves the high watermark to the smallest log end over the maximal
    /// ISR, if that is higher and the ISR is large enough.
    fn advance(&mut self, log_end: i64) -> Option<Command> {
        let mut counted: Vec<i32> = self.registration.isr.clone();
        if let Some(pending) = &self.pending_isr {
            counted.extend(pending.iter().filter(|node| !self.registration.isr.contains(node)));
        }
        if !counted.contains(&self.me) {
            counted.push(self.me);
        }
        if counted.len() < self.config.min_insync {
            return None;
        }
        let mut candidate = log_end;
        for node in counted.iter().filter(|node| **node != self.me) {
            let end = self.followers.get(node).map_or(-1, |f| f.end_offset);
            candidate = candidate.min(end);
        }
        if candidate > self.high_watermark {
            self.high_watermark = candidate;
            return Some(Command::HighWatermark(candidate));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG_MS: u64 = 1000;

    fn leader(isr: &[i32], min_insync: usize) -> LeaderState {
        let registration =
            Registration { replicas: vec![1, 2, 3], isr: isr.to_vec(), leader_epoch: 4, partition_epoch: 7 };
        LeaderState::new(1, registration, 100, 100, 0, LeaderConfig { min_insync, lag_time_max_ms: LAG_MS })
    }

    fn committed(state: &LeaderState, isr: &[i32]) -> Registration {
        Registration {
            isr: isr.to_vec(),
            partition_epoch: state.registration.partition_epoch + 1,
            ..state.registration.clone()
        }
    }

    #[test]
    fn the_high_watermark_is_the_smallest_log_end_over_the_isr() {
        let mut state = leader(&[1, 2, 3], 2);
        assert_eq!(state.on_log_end(120), vec![], "no follower has fetched past 100 yet");
        assert_eq!(state.on_follower_fetch(2, 120, 120, 10), vec![]);
        assert_eq!(state.on_follower_fetch(3, 110, 120, 10), vec![Command::HighWatermark(110)]);
        assert_eq!(state.on_follower_fetch(3, 120, 120, 20), vec![Command::HighWatermark(120)]);
        assert_eq!(state.on_follower_fetch(3, 115, 120, 30), vec![], "it never moves back");
        assert_eq!(state.high_watermark(), 120);
    }

    #[test]
    fn below_min_insync_the_high_watermark_stays_put() {
        let mut state = leader(&[1], 2);
        assert!(!state.enough_in_sync());
        assert_eq!(state.on_log_end(150), vec![], "an ISR of one under min.insync.replicas=2 commits nothing");
        let mut alone = leader(&[1], 1);
        assert_eq!(alone.on_log_end(150), vec![Command::HighWatermark(150)], "min.insync.replicas=1: the leader alone");
    }

    #[test]
    fn a_lagging_follower_leaves_the_isr_after_the_lag_time_and_is_waited_for_until_it_has() {
        let mut state = leader(&[1, 2, 3], 2);
        state.on_follower_fetch(2, 100, 100, 0);
        state.on_follower_fetch(3, 100, 100, 0);
        state.on_log_end(200);
        // Follower 2 keeps up; follower 3 stops fetching.
        assert_eq!(state.on_follower_fetch(2, 200, 200, 500), vec![]);
        assert_eq!(state.on_tick(900), vec![], "within the lag time");
        assert_eq!(state.on_follower_fetch(2, 200, 200, 1200), vec![]);
        let asked = state.on_tick(LAG_MS + 1);
        assert_eq!(asked, vec![Command::AlterIsr { isr: vec![1, 2], partition_epoch: 7 }]);
        assert_eq!(state.on_tick(LAG_MS + 500), vec![], "one request at a time");
        assert_eq!(state.high_watermark(), 100, "3 still counts until the shrink commits");
        let shrunk = committed(&state, &[1, 2]);
        assert_eq!(state.on_registration(shrunk, 200, 1600), vec![Command::HighWatermark(200)]);
    }

    #[test]
    fn a_follower_that_fetches_behind_a_moving_log_end_still_counts_as_caught_up() {
        let mut state = leader(&[1, 2], 1);
        // Each fetch reaches where the log ended at the previous fetch.
        for step in 1..=10u64 {
            let end = 100 + 10 * step as i64;
            state.on_follower_fetch(2, end - 10, end, step * 400);
        }
        assert_eq!(state.on_tick(4000), vec![], "never a full lag period behind what it last saw");
    }

    #[test]
    fn a_follower_rejoins_once_it_reaches_the_high_watermark_and_the_epoch_start() {
        let mut state = leader(&[1, 2], 1);
        state.on_follower_fetch(2, 100, 100, 0);
        state.on_log_end(180);
        state.on_follower_fetch(2, 180, 180, 1);
        assert_eq!(state.high_watermark(), 180);
        assert_eq!(state.on_follower_fetch(3, 150, 180, 2), vec![], "below the high watermark");
        assert_eq!(
            state.on_follower_fetch(3, 180, 180, 3),
            vec![Command::AlterIsr { isr: vec![1, 2, 3], partition_epoch: 7 }]
        );
        state.on_alter_failed();
        let asked = state.on_follower_fetch(3, 180, 180, 4);
        assert_eq!(
            asked,
            vec![Command::AlterIsr { isr: vec![1, 2, 3], partition_epoch: 7 }],
            "asked again after a refusal"
        );
        let grown = committed(&state, &[1, 2, 3]);
        state.on_registration(grown, 180, 5);
        assert_eq!(state.isr(), &[1, 2, 3]);
        state.on_log_end(190);
        assert_eq!(state.on_follower_fetch(2, 190, 190, 6), vec![], "3 is in the ISR now and has not fetched 190");
    }

    #[test]
    fn a_follower_short_of_the_epoch_start_does_not_join() {
        // A new leader whose log ends at 100 and knew 90 committed; alone
        // under min.insync.replicas=2, it commits nothing more.
        let registration = Registration { replicas: vec![1, 2], isr: vec![1], leader_epoch: 5, partition_epoch: 1 };
        let config = LeaderConfig { min_insync: 2, lag_time_max_ms: LAG_MS };
        let mut state = LeaderState::new(1, registration, 100, 90, 0, config);
        assert_eq!(
            state.on_follower_fetch(2, 95, 100, 1),
            vec![],
            "95 reaches the high watermark, not the epoch's start"
        );
        let asked = state.on_follower_fetch(2, 100, 100, 2);
        assert_eq!(asked, vec![Command::AlterIsr { isr: vec![1, 2], partition_epoch: 1 }, Command::HighWatermark(100)]);
    }
}
