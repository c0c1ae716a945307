//! Fetch sessions (KIP-227): what a consumer last asked of this core and
//! what it was last told, so its next Fetch lists only the partitions whose
//! position changed and the answer only those with news. A consumer of
//! 10,000 partitions otherwise sends and receives all 10,000 on every poll.
//!
//! The broker side is incremental too: the core keeps a bounded log of the
//! partitions whose readable state changed (appends, a moved log start), and
//! an incremental fetch reads only the session's partitions named there
//! since its last read, those it changed, and those that must be read every
//! time (behind their high watermark, in error, or owned by another core).
//! Reading all 10,000 to find the few with news took 4-5 ms per fetch.
//!
//! Owned by the core whose connection created the session (a session's
//! requests arrive on that connection's core; one on another core reads as
//! FETCH_SESSION_ID_NOT_FOUND, and the client starts a new one). Changed by
//! the Fetch handler, and the change log by appends and retention. No I/O
//! inside: the handler reads the partitions.
//!
//! The rules, as Kafka's `FetchManager` has them:
//! - epoch -1 (FINAL): no session; a nonzero id closes that session.
//! - epoch 0 (INITIAL): a full request; the answer opens a new session
//!   (closing the named one), or says id 0 when the cache has no room.
//! - epoch n > 0: an incremental request on session `id`, whose next epoch
//!   must be n. Its partitions are added or updated, forgotten ones removed;
//!   the answer lists the session's partitions with records, an error, or a
//!   high watermark, last stable offset or log start offset it has not sent.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::constants::{
    FETCH_SESSIONS_MAX, FETCH_SESSION_CHANGES_MAX, FETCH_SESSION_EVICTABLE_IDLE_MS, FETCH_SESSION_PARTITIONS_MAX,
};
use crate::protocol::fetch::{FetchPartition, FetchPartitionResponse};
use crate::protocol::ErrorCode;
use crate::shard::ShardId;

/// The session fields of a Fetch request.
#[derive(Debug, Clone, Copy)]
pub struct SessionRef {
    pub id: i32,
    pub epoch: i32,
}

pub const INITIAL_EPOCH: i32 = 0;
pub const FINAL_EPOCH: i32 = -1;

/// One partition a Fetch reads: its topic and the client's request for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub topic: Rc<str>,
    pub partition: FetchPartition,
}

/// A partition to read and where it sits: its place in the request
/// (sessionless, full) or in the session (incremental).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub at: usize,
    pub wanted: Wanted,
}

/// A read's answer, and the other core that owns the partition, if one does.
#[derive(Debug)]
pub struct Answer {
    pub response: FetchPartitionResponse,
    pub remote: Option<ShardId>,
}

/// How a Fetch request relates to the sessions, decided before it reads.
#[derive(Debug, Clone, Copy)]
pub enum FetchContext {
    /// Below v7, or epoch -1: the request lists everything; no session.
    Sessionless,
    /// Epoch 0: the request lists everything; its answer opens a session
    /// that has seen the changes up to `mark`.
    Full { mark: Mark },
    /// Session `id`, after the request's changes.
    Incremental { id: i32 },
}

/// Where a read began: the change log's head, the metadata's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    cursor: u64,
    image_version: u64,
}

/// The sessions of one core, bounded in count and in partitions.
pub struct FetchSessions {
    sessions: HashMap<i32, Session>,
    partitions: usize,
    changes: ChangeLog,
    ids: RandomState,
    next_seed: u64,
}

struct Session {
    /// The epoch the next incremental request must carry.
    next_epoch: i32,
    partitions: Vec<Cached>,
    /// Where each (topic, partition) sits in `partitions`.
    positions: HashMap<(Rc<str>, i32), usize>,
    /// Changes read up to here, under this metadata version.
    mark: Mark,
    last_used: Instant,
}

/// A partition of a session: what the client asks and what it was told.
struct Cached {
    wanted: Wanted,
    sent: Sent,
    /// Read on every fetch, not only when the change log names it.
    always: bool,
}

/// The offsets the client last saw in an answer; -1 before any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

const NOT_SENT: Sent = Sent { high_watermark: -1, last_stable_offset: -1, log_start_offset: -1 };

/// The partitions of this core whose readable state changed, oldest first;
/// `first` numbers the oldest kept.
#[derive(Default)]
struct ChangeLog {
    first: u64,
    entries: VecDeque<(Rc<str>, i32)>,
}

impl Default for FetchSessions {
    fn default() -> Self {
        Self {
            sessions: HashMap::new(),
            partitions: 0,
            changes: ChangeLog::default(),
            ids: RandomState::new(),
            next_seed: 0,
        }
    }
}

impl FetchSessions {
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Partitions cached over all sessions.
    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// Records that `topic`/`index` has something new to read (records, a
    /// high watermark or log start offset). Kept also without sessions: a
    /// full fetch in flight opens one that has seen the changes up to its
    /// start.
    pub fn note_change(&mut self, topic: &Rc<str>, index: i32) {
        self.changes.push(topic, index);
    }

    /// Sorts a request into its context, applying what it says to the
    /// sessions: closes, or for an incremental request checks the epoch,
    /// applies `changed` and `forgotten` and advances the epoch. Returns the
    /// partitions to read: the request's own, or those of the session that
    /// may have news.
    pub fn begin(
        &mut self,
        session: SessionRef,
        changed: Vec<Wanted>,
        forgotten: &[(Rc<str>, i32)],
        image_version: u64,
        now: Instant,
    ) -> Result<(FetchContext, Vec<Read>), ErrorCode> {
        fn requested(changed: Vec<Wanted>) -> Vec<Read> {
            changed.into_iter().enumerate().map(|(at, wanted)| Read { at, wanted }).collect()
        }
        match session.epoch {
            FINAL_EPOCH => {
                self.close(session.id);
                Ok((FetchContext::Sessionless, requested(changed)))
            }
            INITIAL_EPOCH => {
                self.close(session.id);
                let mark = Mark { cursor: self.changes.head(), image_version };
                Ok((FetchContext::Full { mark }, requested(changed)))
            }
            epoch => {
                let entry = self.sessions.get_mut(&session.id).ok_or(ErrorCode::FetchSessionIdNotFound)?;
                if entry.next_epoch != epoch {
                    return Err(ErrorCode::InvalidFetchSessionEpoch);
                }
                let before = entry.partitions.len();
                entry.forget(forgotten);
                for wanted in changed {
                    entry.upsert(wanted);
                }
                entry.next_epoch = next_epoch(epoch);
                entry.last_used = now;
                self.partitions = self.partitions + entry.partitions.len() - before;
                if self.partitions > FETCH_SESSION_PARTITIONS_MAX {
                    // Grown past the cache: evicted, as Kafka would, so the
                    // client falls back to a full request.
                    self.close(session.id);
                    return Err(ErrorCode::FetchSessionIdNotFound);
                }
                let reads = self.reads_due(session.id, image_version, true);
                Ok((FetchContext::Incremental { id: session.id }, reads))
            }
        }
    }

    /// While an incremental fetch waits: the session's partitions the
    /// change log names since its last look (all of them when the log no
    /// longer reaches back that far or the metadata changed).
    pub fn changed_since_last_read(&mut self, id: i32, image_version: u64) -> Vec<Read> {
        self.reads_due(id, image_version, false)
    }

    /// Opens a session over a full request's partitions, remembering what
    /// its answer told; returns the id, or 0 when there is no room.
    pub fn open(&mut self, mark: Mark, reads: &[Read], answers: &[Answer], now: Instant) -> i32 {
        if reads.is_empty() || !self.make_room(reads.len(), now) {
            return 0;
        }
        let mut session = Session {
            next_epoch: 1,
            partitions: Vec::with_capacity(reads.len()),
            positions: HashMap::with_capacity(reads.len()),
            mark,
            last_used: now,
        };
        for (read, answer) in reads.iter().zip(answers) {
            let at = session.upsert(read.wanted.clone());
            session.partitions[at].remember(answer);
        }
        self.partitions += session.partitions.len();
        let id = self.new_id();
        self.sessions.insert(id, session);
        id
    }

    /// Picks, from what an incremental fetch of session `id` read
    /// (`answers` in the order of `reads`), the answers the client has not
    /// seen, remembering them as seen; returns them with their read's index.
    pub fn news(&mut self, id: i32, reads: &[Read], answers: Vec<Answer>) -> Vec<(usize, FetchPartitionResponse)> {
        let Some(session) = self.sessions.get_mut(&id) else {
            // Closed while this request read: answer everything it read.
            return answers.into_iter().map(|a| a.response).enumerate().collect();
        };
        let mut out = Vec::new();
        for (index, (read, answer)) in reads.iter().zip(answers).enumerate() {
            let news = !answer.response.records.is_empty() || !answer.response.error.is_ok();
            let Some(cached) = session.find_mut(&read.wanted, read.at) else {
                // Forgotten by a later request meanwhile: only data matters.
                if news {
                    out.push((index, answer.response));
                }
                continue;
            };
            if news || cached.sent != Sent::of(&answer.response) {
                cached.remember(&answer);
                out.push((index, answer.response));
            } else {
                cached.always =
                    answer.remote.is_some() || read.wanted.partition.fetch_offset < answer.response.high_watermark;
            }
        }
        out
    }

    /// The partitions of session `id` to read now; `requested` adds those
    /// to read on every fetch (a request's first pass).
    fn reads_due(&mut self, id: i32, image_version: u64, requested: bool) -> Vec<Read> {
        let Some(session) = self.sessions.get_mut(&id) else {
            return Vec::new();
        };
        let head = self.changes.head();
        let everything = session.mark.image_version != image_version || session.mark.cursor < self.changes.first;
        let ats: Vec<usize> = if everything {
            (0..session.partitions.len()).collect()
        } else {
            let named = self.changes.since(session.mark.cursor);
            let mut ats: Vec<usize> = named.filter_map(|key| session.positions.get(key).copied()).collect();
            if requested {
                ats.extend(session.partitions.iter().enumerate().filter(|(_, c)| c.always).map(|(at, _)| at));
            }
            ats.sort_unstable();
            ats.dedup();
            ats
        };
        session.mark = Mark { cursor: head, image_version };
        ats.into_iter().map(|at| Read { at, wanted: session.partitions[at].wanted.clone() }).collect()
    }

    fn close(&mut self, id: i32) {
        if id == 0 {
            return;
        }
        if let Some(session) = self.sessions.remove(&id) {
            self.partitions -= session.partitions.len();
        }
    }

    /// Frees room for a session of `partitions`, evicting the least recently
    /// used sessions that have been idle long enough (as Kafka does, an
    /// active session is never evicted for a new one).
    fn make_room(&mut self, partitions: usize, now: Instant) -> bool {
        if partitions > FETCH_SESSION_PARTITIONS_MAX {
            return false;
        }
        let idle_min = Duration::from_millis(FETCH_SESSION_EVICTABLE_IDLE_MS);
        while self.sessions.len() >= FETCH_SESSIONS_MAX || self.partitions + partitions > FETCH_SESSION_PARTITIONS_MAX {
            let oldest = self.sessions.iter().min_by_key(|(_, s)| s.last_used).map(|(id, s)| (*id, s.last_used));
            match oldest {
                Some((id, last_used)) if now.saturating_duration_since(last_used) >= idle_min => self.close(id),
                _ => return false,
            }
        }
        true
    }

    /// A random positive id not in use (random so that a client of an
    /// earlier broker process does not find someone else's session).
    fn new_id(&mut self) -> i32 {
        loop {
            self.next_seed += 1;
            let id = (self.ids.hash_one(self.next_seed) as i32) & i32::MAX;
            if id != 0 && !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }
}

/// Kafka's `FetchMetadata.nextEpoch`: after i32::MAX comes 1 (0 means "new").
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl Sent {
    fn of(answer: &FetchPartitionResponse) -> Self {
        Self {
            high_watermark: answer.high_watermark,
            last_stable_offset: answer.last_stable_offset,
            log_start_offset: answer.log_start_offset,
        }
    }
}

impl Cached {
    /// Takes in an answer sent to the client. An error leaves nothing
    /// known, so the partition is sent again once it clears.
    fn remember(&mut self, answer: &Answer) {
        let response = &answer.response;
        self.sent = if response.error.is_ok() { Sent::of(response) } else { NOT_SENT };
        self.always = answer.remote.is_some()
            || !response.error.is_ok()
            || self.wanted.partition.fetch_offset < response.high_watermark;
    }
}

impl Session {
    /// Adds or updates a partition, to be read on the next fetch; returns
    /// its position.
    fn upsert(&mut self, wanted: Wanted) -> usize {
        let key = (wanted.topic.clone(), wanted.partition.index);
        match self.positions.get(&key) {
            Some(&at) => {
                self.partitions[at].wanted = wanted;
                self.partitions[at].always = true;
                at
            }
            None => {
                let at = self.partitions.len();
                self.positions.insert(key, at);
                self.partitions.push(Cached { wanted, sent: NOT_SENT, always: true });
                at
            }
        }
    }

    fn forget(&mut self, forgotten: &[(Rc<str>, i32)]) {
        if forgotten.is_empty() {
            return;
        }
        let mut gone = false;
        for key in forgotten {
            gone |= self.positions.remove(key).is_some();
        }
        if !gone {
            return;
        }
        self.partitions.retain(|c| self.positions.contains_key(&(c.wanted.topic.clone(), c.wanted.partition.index)));
        for (at, cached) in self.partitions.iter().enumerate() {
            self.positions.insert((cached.wanted.topic.clone(), cached.wanted.partition.index), at);
        }
    }

    /// The cached partition `wanted`, looked for first at `at` (where it was
    /// when the read began; a request in between may have moved it).
    fn find_mut(&mut self, wanted: &Wanted, at: usize) -> Option<&mut Cached> {
        let same = |c: &Cached| c.wanted.partition.index == wanted.partition.index && c.wanted.topic == wanted.topic;
        let at = match self.partitions.get(at) {
            Some(cached) if same(cached) => at,
            _ => *self.positions.get(&(wanted.topic.clone(), wanted.partition.index))?,
        };
        self.partitions.get_mut(at)
    }
}

impl ChangeLog {
    fn head(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    fn push(&mut self, topic: &Rc<str>, index: i32) {
        if self.entries.len() == FETCH_SESSION_CHANGES_MAX {
            self.entries.pop_front();
            self.first += 1;
        }
        self.entries.push_back((topic.clone(), index));
    }

    /// The entries from `cursor` on (none before `first`: the caller checks).
    fn since(&self, cursor: u64) -> impl Iterator<Item = &(Rc<str>, i32)> {
        let skip = cursor.saturating_sub(self.first) as usize;
        self.entries.iter().skip(skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERSION: u64 = 1;

    fn wanted(topic: &str, index: i32, offset: i64) -> Wanted {
        Wanted {
            topic: topic.into(),
            partition: FetchPartition {
                index,
                current_leader_epoch: -1,
                fetch_offset: offset,
                log_start_offset: -1,
                partition_max_bytes: 1 << 20,
            },
        }
    }

    fn answer(index: i32, high_watermark: i64, records: usize) -> Answer {
        let response = FetchPartitionResponse {
            index,
            error: ErrorCode::None,
            high_watermark,
            last_stable_offset: high_watermark,
            log_start_offset: 0,
            records: (0..records).map(|_| bytes::Bytes::from_static(b"batch")).collect(),
            aborted_transactions: Vec::new(),
            preferred_read_replica: -1,
        };
        Answer { response, remote: None }
    }

    fn failed(index: i32) -> Answer {
        Answer { response: FetchPartitionResponse::error(index, ErrorCode::NotLeaderOrFollower), remote: None }
    }

    /// Session `id` at `epoch`: (topic, partition) of each read.
    fn step(
        sessions: &mut FetchSessions,
        id: i32,
        epoch: i32,
        changed: Vec<Wanted>,
        forgotten: &[(Rc<str>, i32)],
    ) -> Vec<Read> {
        let (context, reads) =
            sessions.begin(SessionRef { id, epoch }, changed, forgotten, VERSION, Instant::now()).unwrap();
        assert!(matches!(context, FetchContext::Incremental { .. }));
        reads
    }

    fn names(reads: &[Read]) -> Vec<(String, i32, i64)> {
        reads
            .iter()
            .map(|r| (r.wanted.topic.to_string(), r.wanted.partition.index, r.wanted.partition.fetch_offset))
            .collect()
    }

    fn indexes(out: &[(usize, FetchPartitionResponse)]) -> Vec<i32> {
        out.iter().map(|(_, a)| a.index).collect()
    }

    /// A session over t-0 and t-1, both read to their end (high watermark 0).
    fn open_two(sessions: &mut FetchSessions, now: Instant) -> i32 {
        let all = vec![wanted("t", 0, 0), wanted("t", 1, 0)];
        let (context, reads) =
            sessions.begin(SessionRef { id: 0, epoch: INITIAL_EPOCH }, all, &[], VERSION, now).unwrap();
        let FetchContext::Full { mark } = context else { panic!("epoch 0 is a full fetch: {context:?}") };
        sessions.open(mark, &reads, &[answer(0, 0, 0), answer(1, 0, 0)], now)
    }

    #[test]
    fn an_incremental_fetch_reads_only_changed_partitions_and_answers_only_news() {
        let mut sessions = FetchSessions::default();
        let id = open_two(&mut sessions, Instant::now());
        assert_ne!(id, 0);
        assert_eq!((sessions.len(), sessions.partitions()), (1, 2));
        assert!(step(&mut sessions, id, 1, Vec::new(), &[]).is_empty(), "no change, nothing to read");

        sessions.note_change(&"t".into(), 1);
        sessions.note_change(&"other".into(), 0);
        let reads = step(&mut sessions, id, 2, Vec::new(), &[]);
        assert_eq!(names(&reads), vec![("t".into(), 1, 0)], "the changed partition of this session");
        let out = sessions.news(id, &reads, vec![answer(1, 3, 1)]);
        assert_eq!(indexes(&out), vec![1]);

        // Behind its high watermark, t-1 is read until the client catches up.
        assert_eq!(names(&step(&mut sessions, id, 3, Vec::new(), &[])), vec![("t".into(), 1, 0)]);
        let reads = step(&mut sessions, id, 4, vec![wanted("t", 1, 3)], &[]);
        assert_eq!(names(&reads), vec![("t".into(), 1, 3)]);
        let out = sessions.news(id, &reads, vec![answer(1, 3, 0)]);
        assert!(out.is_empty(), "at its end, with the high watermark already sent: {out:?}");
        assert!(step(&mut sessions, id, 5, Vec::new(), &[]).is_empty());

        // A high watermark that moves without records is news too.
        sessions.note_change(&"t".into(), 0);
        let reads = step(&mut sessions, id, 6, Vec::new(), &[]);
        let out = sessions.news(id, &reads, vec![answer(0, 0, 0)]);
        assert!(out.is_empty(), "named but unchanged");
        sessions.note_change(&"t".into(), 0);
        let reads = step(&mut sessions, id, 7, Vec::new(), &[]);
        assert_eq!(indexes(&sessions.news(id, &reads, vec![answer(0, 9, 0)])), vec![0], "high watermark 0 -> 9");
        let reads = step(&mut sessions, id, 8, Vec::new(), &[]);
        assert_eq!(names(&reads), vec![("t".into(), 0, 0)], "behind its high watermark: read each time");
    }

    #[test]
    fn a_partition_with_an_error_is_read_every_time_and_sent_again_once_it_clears() {
        let mut sessions = FetchSessions::default();
        let id = open_two(&mut sessions, Instant::now());
        sessions.note_change(&"t".into(), 0);
        let reads = step(&mut sessions, id, 1, Vec::new(), &[]);
        assert_eq!(indexes(&sessions.news(id, &reads, vec![failed(0)])), vec![0]);
        let reads = step(&mut sessions, id, 2, Vec::new(), &[]);
        assert_eq!(names(&reads), vec![("t".into(), 0, 0)], "read again though nothing named it");
        let out = sessions.news(id, &reads, vec![answer(0, 0, 0)]);
        assert_eq!(indexes(&out), vec![0], "same offsets as before the error");
        assert!(step(&mut sessions, id, 3, Vec::new(), &[]).is_empty());
    }

    #[test]
    fn a_partition_of_another_core_is_read_every_time() {
        let mut sessions = FetchSessions::default();
        let id = open_two(&mut sessions, Instant::now());
        let reads = step(&mut sessions, id, 1, vec![wanted("t", 1, 0)], &[]);
        let remote = Answer { remote: Some(ShardId(1)), ..answer(1, 0, 0) };
        assert!(sessions.news(id, &reads, vec![remote]).is_empty());
        assert_eq!(names(&step(&mut sessions, id, 2, Vec::new(), &[])), vec![("t".into(), 1, 0)]);
    }

    #[test]
    fn forgotten_partitions_leave_the_session_and_added_ones_are_sent_the_first_time() {
        let mut sessions = FetchSessions::default();
        let id = open_two(&mut sessions, Instant::now());
        let forgotten = [(Rc::<str>::from("t"), 0)];
        let reads = step(&mut sessions, id, 1, vec![wanted("u", 7, 0)], &forgotten);
        assert_eq!(names(&reads), vec![("u".into(), 7, 0)]);
        assert_eq!(sessions.partitions(), 2);
        let out = sessions.news(id, &reads, vec![answer(7, 0, 0)]);
        assert_eq!(indexes(&out), vec![7], "the new partition, once");
        sessions.note_change(&"t".into(), 0);
        assert!(step(&mut sessions, id, 2, Vec::new(), &[]).is_empty(), "t-0 is forgotten");
    }

    #[test]
    fn a_session_behind_the_change_log_or_the_metadata_reads_everything() {
        let mut sessions = FetchSessions::default();
        let id = open_two(&mut sessions, Instant::now());
        for _ in 0..=FETCH_SESSION_CHANGES_MAX / 2 {
            sessions.note_change(&"x".into(), 0);
            sessions.note_change(&"x".into(), 1);
        }
        assert_eq!(step(&mut sessions, id, 1, Vec::new(), &[]).len(), 2, "the log dropped changes it had not read");
        assert_eq!(step(&mut sessions, id, 2, Vec::new(), &[]).len(), 0);
        let (_, reads) =
            sessions.begin(SessionRef { id, epoch: 3 }, Vec::new(), &[], VERSION + 1, Instant::now()).unwrap();
        assert_eq!(reads.len(), 2, "new metadata (a topic deleted or moved)");
    }

    #[test]
    fn changes_during_a_long_poll_are_read_once() {
        let mut sessions = FetchSessions::default();
        let id = open_two(&mut sessions, Instant::now());
        assert!(step(&mut sessions, id, 1, Vec::new(), &[]).is_empty());
        sessions.note_change(&"t".into(), 1);
        assert_eq!(names(&sessions.changed_since_last_read(id, VERSION)), vec![("t".into(), 1, 0)]);
        assert!(sessions.changed_since_last_read(id, VERSION).is_empty());
    }

    #[test]
    fn wrong_epochs_and_unknown_ids_are_refused_and_epoch_minus_one_closes() {
        let mut sessions = FetchSessions::default();
        let now = Instant::now();
        let id = open_two(&mut sessions, now);
        let begin = |sessions: &mut FetchSessions, id, epoch| {
            sessions.begin(SessionRef { id, epoch }, Vec::new(), &[], VERSION, now).map(|(context, _)| context)
        };
        assert_eq!(begin(&mut sessions, id, 2).unwrap_err(), ErrorCode::InvalidFetchSessionEpoch);
        let other = id.wrapping_add(1) & i32::MAX;
        assert_eq!(begin(&mut sessions, other, 1).unwrap_err(), ErrorCode::FetchSessionIdNotFound);
        begin(&mut sessions, id, 1).unwrap();
        assert!(matches!(begin(&mut sessions, id, FINAL_EPOCH).unwrap(), FetchContext::Sessionless));
        assert_eq!((sessions.len(), sessions.partitions()), (0, 0));
        assert_eq!(begin(&mut sessions, id, 2).unwrap_err(), ErrorCode::FetchSessionIdNotFound);
    }

    #[test]
    fn a_full_cache_evicts_only_sessions_idle_long_enough() {
        let mut sessions = FetchSessions::default();
        let start = Instant::now();
        let ids: Vec<i32> = (0..FETCH_SESSIONS_MAX).map(|_| open_two(&mut sessions, start)).collect();
        assert!(ids.iter().all(|&id| id != 0));
        assert_eq!(open_two(&mut sessions, start + Duration::from_secs(1)), 0, "all in use: no session");
        let later = start + Duration::from_millis(FETCH_SESSION_EVICTABLE_IDLE_MS);
        // One session stays active; another is evicted for the newcomer.
        sessions.begin(SessionRef { id: ids[0], epoch: 1 }, Vec::new(), &[], VERSION, later).unwrap();
        assert_ne!(open_two(&mut sessions, later), 0);
        assert_eq!(sessions.len(), FETCH_SESSIONS_MAX);
        let kept = sessions.begin(SessionRef { id: ids[0], epoch: 2 }, Vec::new(), &[], VERSION, later);
        assert!(kept.is_ok(), "the active one survives");
    }

    #[test]
    fn epochs_wrap_to_one() {
        assert_eq!(next_epoch(1), 2);
        assert_eq!(next_epoch(i32::MAX), 1);
    }
}
