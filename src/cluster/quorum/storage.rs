//! The engine's in-memory Raft log: what raft-rs reads through its `Storage`
//! trait. It mirrors what the shell has been told to persist (including
//! writes still in flight: raft-rs only counts them once `PersistDone`
//! arrives), so it never touches a disk itself. Owned by one
//! `QuorumEngine`; nothing else writes it.
//!
//! Unlike raft-rs's `MemStorage` it keeps the snapshot's bytes (the metadata
//! image), so a lagging follower can be sent the image itself, and it builds
//! snapshots at the index the shell applied, not at the commit index.

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use super::QuorumError;

#[derive(Debug)]
pub(super) struct QuorumStorage {
    hard_state: HardState,
    conf_state: ConfState,
    /// Everything at or below its index lives only here. Index 0: none yet.
    snapshot: Snapshot,
    /// The entries after the snapshot's index, contiguous.
    entries: Vec<Entry>,
}

impl QuorumStorage {
    /// A storage holding what the shell read back from disk, checked: the
    /// entries follow the snapshot without a gap and the commit index points
    /// at an entry that exists.
    pub(super) fn recover(
        conf_state: ConfState,
        mut hard_state: HardState,
        snapshot: Option<Snapshot>,
        entries: Vec<Entry>,
    ) -> Result<Self, QuorumError> {
        let snapshot = snapshot.unwrap_or_default();
        let (snapshot_index, snapshot_term) = index_term(&snapshot);
        let mut expected_index = snapshot_index + 1;
        let mut previous_term = snapshot_term;
        for entry in &entries {
            if entry.index != expected_index || entry.term < previous_term {
                return Err(QuorumError::DurableLogBroken { index: entry.index, expected_index });
            }
            expected_index += 1;
            previous_term = entry.term;
        }
        let last_index = expected_index - 1;
        // A snapshot is committed by definition; a lower stored commit index
        // only means the hard state was written before the snapshot.
        hard_state.commit = hard_state.commit.max(snapshot_index);
        hard_state.term = hard_state.term.max(snapshot_term);
        if hard_state.commit > last_index {
            return Err(QuorumError::DurableCommitBeyondLog { commit: hard_state.commit, last_index });
        }
        Ok(Self { hard_state, conf_state, snapshot, entries })
    }

    pub(super) fn snapshot_index(&self) -> u64 {
        index_term(&self.snapshot).0
    }

    pub(super) fn snapshot(&self) -> Option<&Snapshot> {
        (self.snapshot_index() > 0).then_some(&self.snapshot)
    }

    /// Appends entries from a Ready, first dropping any stored suffix they
    /// replace (a follower's log being overwritten by a new leader).
    pub(super) fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        assert!(
            first.index > self.snapshot_index(),
            "append at {} overwrites the snapshot at {}",
            first.index,
            self.snapshot_index()
        );
        assert!(first.index <= self.last() + 1, "append at {} leaves a gap after {}", first.index, self.last());
        let keep = (first.index - self.first()) as usize;
        self.entries.truncate(keep);
        self.entries.extend_from_slice(entries);
    }

    pub(super) fn set_hard_state(&mut self, hard_state: HardState) {
        self.hard_state = hard_state;
    }

    /// Replaces the whole log by a snapshot received from the leader.
    pub(super) fn install_snapshot(&mut self, snapshot: Snapshot) {
        let (index, term) = index_term(&snapshot);
        assert!(index > self.snapshot_index(), "snapshot at {index} is not newer");
        self.entries.clear();
        self.hard_state.term = self.hard_state.term.max(term);
        self.hard_state.commit = self.hard_state.commit.max(index);
        self.snapshot = snapshot;
    }

    /// Makes `data` (the state machine at `index`) the snapshot and drops the
    /// entries it covers. The caller checked `index` was applied.
    pub(super) fn compact(&mut self, index: u64, data: Vec<u8>) -> Result<Snapshot, QuorumError> {
        let snapshot_index = self.snapshot_index();
        if index <= snapshot_index {
            return Err(QuorumError::CompactionStale { index, snapshot_index });
        }
        let term = self.entry_term(index).expect("an applied entry is in the log");
        let metadata = SnapshotMetadata { conf_state: Some(self.conf_state.clone()), index, term };
        let snapshot = Snapshot { data, metadata: Some(metadata) };
        let covered = (index + 1 - self.first()) as usize;
        self.entries.drain(..covered);
        self.snapshot = snapshot.clone();
        Ok(snapshot)
    }

    fn first(&self) -> u64 {
        self.snapshot_index() + 1
    }

    fn last(&self) -> u64 {
        self.entries.last().map_or(self.snapshot_index(), |entry| entry.index)
    }

    fn entry_term(&self, index: u64) -> Result<u64, StorageError> {
        let (snapshot_index, snapshot_term) = index_term(&self.snapshot);
        if index == snapshot_index {
            return Ok(snapshot_term);
        }
        if index < snapshot_index {
            return Err(StorageError::Compacted);
        }
        if index > self.last() {
            return Err(StorageError::Unavailable);
        }
        Ok(self.entries[(index - self.first()) as usize].term)
    }
}

impl Storage for QuorumStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        // raft-rs only asks for what it knows is there: a miss is its bug or ours.
        assert!(high <= self.last() + 1, "entries [{low}, {high}) asked beyond the last index {}", self.last());
        let start = (low - self.first()) as usize;
        let end = (high - self.first()) as usize;
        let mut entries = self.entries[start..end].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        self.entry_term(index).map_err(raft::Error::Store)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Raft asks only after compaction dropped what a follower needs, so a
        // snapshot exists; `request_index` is above it only when a follower
        // asked for a fresher one, which waits for the next compaction.
        if self.snapshot_index() == 0 || self.snapshot_index() < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}

/// A snapshot's (index, term); (0, 0) for none.
pub(super) fn index_term(snapshot: &Snapshot) -> (u64, u64) {
    snapshot.metadata.as_ref().map_or((0, 0), |metadata| (metadata.index, metadata.term))
}
