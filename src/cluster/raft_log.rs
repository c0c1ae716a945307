//! The controller quorum's Raft state on disk (issue 29): what the quorum
//! engine's `Persist` commands ask the shell to keep, in one append-only
//! file, `__cluster/raft.log` in the data directory. Read back at start as
//! `quorum::Durable`.
//!
//! ```text
//! frame   offset  size  field
//!         0       4     body length n (u32 LE)
//!         4       4     crc32c of the body (u32 LE)
//!         8       n     body: kind (u8), then prost bytes
//! kind 1  Entries: a prost `Entry` list; stored entries at and after the
//!         first one's index are dropped first (a new leader overwrote them)
//! kind 2  HardState (term, vote, commit)
//! kind 3  Snapshot; with `keep_after` (u64 LE, before the prost bytes)
//!         entries after that index stay (compaction), else all go
//!         (a snapshot received from the leader)
//! ```
//!
//! A frame is written whole, then synced before the engine hears it is
//! durable. A crash can leave a torn last frame: it was never reported
//! durable, so opening cuts the file at the first frame that does not check.
//! Once the file holds much more than its live state it is rewritten (a
//! temporary file, fsync, rename, fsync of the directory).
//!
//! A full disk: the directory keeps a reserve file (`RESERVE_FILE`,
//! `RESERVE_BYTES` of zeros, made at open where there is room). A write or
//! sync that fails with ENOSPC cuts what it wrote, deletes the reserve and
//! tries once more, so the metadata log keeps working when the partitions'
//! data filled the disk (a Kafka client's first group lookup creates
//! `__consumer_offsets`: a metadata write). A rewrite that fails leaves the
//! file as it was.
//!
//! Blocking I/O: it runs on the controller's own thread, never on a core
//! that serves Kafka clients.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use prost::Message as _;

use super::quorum::{Durable, Entry, HardState, Persist, Snapshot};

pub const FILE_NAME: &str = "raft.log";
/// A frame body larger than this is damage, not data (entries are cut at
/// 1 MiB by the engine; a snapshot of 100,000 partitions is a few MiB).
pub const FRAME_BYTES_MAX: usize = 256 << 20;
/// Rewrite the file once it is this many times its live size (and at least
/// `REWRITE_BYTES_MIN`).
const REWRITE_RATIO: u64 = 4;
const REWRITE_BYTES_MIN: u64 = 16 << 20;
const FRAME_HEADER_BYTES: usize = 8;
/// Space kept free for the metadata log on a disk that fills up.
pub const RESERVE_FILE: &str = "raft.reserve";
const RESERVE_BYTES: usize = 4 << 20;

const KIND_ENTRIES: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_SNAPSHOT: u8 = 3;

#[derive(Debug, thiserror::Error)]
pub enum RaftLogError {
    #[error("raft log {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("raft log {path}: a checked frame does not decode: {reason}")]
    Decode { path: String, reason: String },
}

/// The open file and the state it holds.
pub struct RaftLog {
    path: PathBuf,
    file: File,
    state: Durable,
    file_bytes: u64,
}

impl RaftLog {
    /// Opens (or creates) the log in `dir` and reads back what it holds;
    /// a torn last frame is cut off.
    pub fn open(dir: &Path) -> Result<Self, RaftLogError> {
        let path = dir.join(FILE_NAME);
        let io = |source| RaftLogError::Io { path: path.display().to_string(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io)?;
        let mut raw = Vec::new();
        file.read_to_end(&mut raw).map_err(io)?;
        let mut state = Durable::default();
        let mut at = 0;
        while let Some((kind, body, next)) = frame_at(&raw, at) {
            apply_frame(&mut state, kind, body)
                .map_err(|reason| RaftLogError::Decode { path: path.display().to_string(), reason })?;
            at = next;
        }
        if at < raw.len() {
            tracing::warn!(path = %path.display(), kept = at, cut = raw.len() - at, "raft log: cutting a torn tail");
            file.set_len(at as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        make_reserve(&dir.join(RESERVE_FILE));
        Ok(Self { path, file, state, file_bytes: at as u64 })
    }

    /// What the file holds, for `QuorumEngine::open`.
    pub fn durable(&self) -> &Durable {
        &self.state
    }

    /// Carries out one `Persist`: snapshot, entries, hard state, in that
    /// order, synced when the engine asks. Returns once it is durable.
    pub fn persist(&mut self, persist: &Persist) -> Result<(), RaftLogError> {
        let mut frames = Vec::new();
        if let Some(snapshot) = &persist.snapshot {
            frames.push(encode_snapshot(snapshot, None));
        }
        if !persist.entries.is_empty() {
            frames.push(encode_entries(&persist.entries));
        }
        if let Some(hard_state) = &persist.hard_state {
            frames.push(frame(KIND_HARD_STATE, &hard_state.encode_to_vec()));
        }
        self.write_frames_or_use_reserve(&frames, persist.must_sync)?;
        self.rewrite_if_bloated();
        Ok(())
    }

    /// Stores a compaction snapshot (`QuorumEngine::compact`): entries
    /// after its index stay.
    pub fn compact(&mut self, snapshot: &Snapshot) -> Result<(), RaftLogError> {
        let index = snapshot.get_metadata().index;
        self.write_frames_or_use_reserve(&[encode_snapshot(snapshot, Some(index))], true)?;
        self.rewrite_if_bloated();
        Ok(())
    }

    /// `write_frames`, once more after deleting the reserve when the disk
    /// is full.
    fn write_frames_or_use_reserve(&mut self, frames: &[Vec<u8>], sync: bool) -> Result<(), RaftLogError> {
        match self.write_frames(frames, sync) {
            Err(RaftLogError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOSPC) => {
                let reserve = self.path.with_file_name(RESERVE_FILE);
                if std::fs::remove_file(&reserve).is_err() {
                    return Err(self.io_error(source));
                }
                tracing::error!(reserve = %reserve.display(), "the disk is full: the metadata log uses its reserve; free space (delete records or topics) before it runs out too");
                self.write_frames(frames, sync)
            }
            other => other,
        }
    }

    /// Appends `frames` and syncs when asked; a failure cuts what was
    /// appended, so the file ends on a whole frame.
    fn write_frames(&mut self, frames: &[Vec<u8>], sync: bool) -> Result<(), RaftLogError> {
        let (bytes_before, state_before) = (self.file_bytes, self.state.clone());
        let mut result = frames.iter().try_for_each(|bytes| self.append(bytes));
        if result.is_ok() && sync && !frames.is_empty() {
            result = self.file.sync_data().map_err(|source| self.io_error(source));
        }
        if result.is_err() {
            let _ = self.file.set_len(bytes_before);
            self.file_bytes = bytes_before;
            self.state = state_before;
        }
        result
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), RaftLogError> {
        let (kind, body) = (bytes[FRAME_HEADER_BYTES], &bytes[FRAME_HEADER_BYTES + 1..]);
        let mut next = self.state.clone();
        apply_frame(&mut next, kind, body).map_err(|reason| RaftLogError::Decode { path: self.path_text(), reason })?;
        self.file.write_all(bytes).map_err(|source| self.io_error(source))?;
        self.state = next;
        self.file_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Rewrites the file as its live state once it has grown far past it;
    /// a rewrite that fails (a full disk) leaves the file as it was.
    fn rewrite_if_bloated(&mut self) {
        if let Err(err) = self.rewrite() {
            tracing::warn!(error = %err, "raft log: rewriting the file failed; it stays as it is");
            let _ = std::fs::remove_file(self.path.with_file_name(format!("{FILE_NAME}.tmp")));
        }
    }

    fn rewrite(&mut self) -> Result<(), RaftLogError> {
        let live = live_frames(&self.state);
        let live_bytes: u64 = live.iter().map(|f| f.len() as u64).sum();
        if self.file_bytes < REWRITE_BYTES_MIN.max(live_bytes.saturating_mul(REWRITE_RATIO)) {
            return Ok(());
        }
        let dir = self.path.parent().expect("the log lives in a directory").to_path_buf();
        let tmp = dir.join(format!("{FILE_NAME}.tmp"));
        let io = |source| RaftLogError::Io { path: tmp.display().to_string(), source };
        let mut out = File::create(&tmp).map_err(io)?;
        for bytes in &live {
            out.write_all(bytes).map_err(io)?;
        }
        out.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        File::open(&dir).and_then(|d| d.sync_all()).map_err(io)?;
        self.file = OpenOptions::new().append(true).read(true).open(&self.path).map_err(|s| self.io_error(s))?;
        self.file_bytes = live_bytes;
        Ok(())
    }

    fn io_error(&self, source: std::io::Error) -> RaftLogError {
        RaftLogError::Io { path: self.path_text(), source }
    }

    fn path_text(&self) -> String {
        self.path.display().to_string()
    }
}

/// Writes the reserve file where it is missing and the disk has room.
fn make_reserve(path: &Path) {
    if path.exists() {
        return;
    }
    let made = File::create(path).and_then(|mut f| {
        f.write_all(&vec![0u8; RESERVE_BYTES])?;
        f.sync_all()
    });
    if let Err(err) = made {
        let _ = std::fs::remove_file(path);
        tracing::warn!(path = %path.display(), error = %err, "no room for the metadata log's reserve");
    }
}

/// The frames that rebuild `state` alone.
fn live_frames(state: &Durable) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    if let Some(snapshot) = &state.snapshot {
        frames.push(encode_snapshot(snapshot, Some(snapshot.get_metadata().index)));
    }
    if !state.entries.is_empty() {
        frames.push(encode_entries(&state.entries));
    }
    frames.push(frame(KIND_HARD_STATE, &state.hard_state.encode_to_vec()));
    frames
}

fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut body = Vec::new();
    for entry in entries {
        let bytes = entry.encode_to_vec();
        body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        body.extend_from_slice(&bytes);
    }
    frame(KIND_ENTRIES, &body)
}

fn encode_snapshot(snapshot: &Snapshot, keep_after: Option<u64>) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(u8::from(keep_after.is_some()));
    body.extend_from_slice(&keep_after.unwrap_or(0).to_le_bytes());
    body.extend_from_slice(&snapshot.encode_to_vec());
    frame(KIND_SNAPSHOT, &body)
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + payload.len());
    body.push(kind);
    body.extend_from_slice(payload);
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The frame at `at`: its kind, payload and where the next starts; `None`
/// at the end or at a frame that is short or does not check.
fn frame_at(raw: &[u8], at: usize) -> Option<(u8, &[u8], usize)> {
    let header = raw.get(at..at + FRAME_HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len == 0 || len > FRAME_BYTES_MAX {
        return None;
    }
    let body = raw.get(at + FRAME_HEADER_BYTES..at + FRAME_HEADER_BYTES + len)?;
    if crc32c::crc32c(body) != crc {
        return None;
    }
    Some((body[0], &body[1..], at + FRAME_HEADER_BYTES + len))
}

fn apply_frame(state: &mut Durable, kind: u8, payload: &[u8]) -> Result<(), String> {
    match kind {
        KIND_ENTRIES => {
            let mut at = 0;
            let mut entries = Vec::new();
            while at < payload.len() {
                let len_bytes = payload.get(at..at + 4).ok_or("a cut entry length")?;
                let len = u32::from_le_bytes(len_bytes.try_into().map_err(|_| "entry length")?) as usize;
                let bytes = payload.get(at + 4..at + 4 + len).ok_or("a cut entry")?;
                entries.push(Entry::decode(bytes).map_err(|e| e.to_string())?);
                at += 4 + len;
            }
            let Some(first) = entries.first().map(|e| e.index) else { return Ok(()) };
            state.entries.retain(|e| e.index < first);
            state.entries.extend(entries);
        }
        KIND_HARD_STATE => state.hard_state = HardState::decode(payload).map_err(|e| e.to_string())?,
        KIND_SNAPSHOT => {
            let (flag, rest) = payload.split_first().ok_or("an empty snapshot frame")?;
            let keep = rest.get(..8).ok_or("a cut snapshot frame")?;
            let keep_after = u64::from_le_bytes(keep.try_into().map_err(|_| "keep_after")?);
            let snapshot = Snapshot::decode(&rest[8..]).map_err(|e| e.to_string())?;
            if *flag == 1 {
                state.entries.retain(|e| e.index > keep_after);
            } else {
                state.entries.clear();
            }
            state.snapshot = Some(snapshot);
        }
        other => return Err(format!("unknown frame kind {other}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, data: format!("batch {index}@{term}").into_bytes(), ..Default::default() }
    }

    fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
        HardState { term, vote, commit }
    }

    fn snapshot(index: u64, term: u64) -> Snapshot {
        let mut snapshot = Snapshot { data: b"image".to_vec(), ..Default::default() };
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = term;
        snapshot
    }

    fn persist(entries: Vec<Entry>, hard: Option<HardState>, snapshot: Option<Snapshot>) -> Persist {
        Persist { number: 0, snapshot, entries, hard_state: hard, must_sync: true }
    }

    #[test]
    fn persisted_entries_and_hard_state_read_back_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RaftLog::open(dir.path()).unwrap();
        assert_eq!(log.durable(), &Durable::default());
        log.persist(&persist(vec![entry(1, 1), entry(2, 1), entry(3, 1)], Some(hard_state(1, 1, 0)), None)).unwrap();
        log.persist(&persist(vec![entry(2, 2)], Some(hard_state(2, 3, 2)), None)).unwrap();
        let expected =
            Durable { hard_state: hard_state(2, 3, 2), snapshot: None, entries: vec![entry(1, 1), entry(2, 2)] };
        assert_eq!(log.durable(), &expected, "a new leader's entry 2 replaced 2 and 3");
        drop(log);
        assert_eq!(RaftLog::open(dir.path()).unwrap().durable(), &expected);
    }

    #[test]
    fn a_received_snapshot_drops_the_log_and_a_compaction_keeps_what_follows() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RaftLog::open(dir.path()).unwrap();
        log.persist(&persist((1..=5).map(|i| entry(i, 1)).collect(), Some(hard_state(1, 1, 5)), None)).unwrap();
        log.compact(&snapshot(3, 1)).unwrap();
        assert_eq!(log.durable().entries, vec![entry(4, 1), entry(5, 1)]);
        log.persist(&persist(Vec::new(), None, Some(snapshot(9, 2)))).unwrap();
        assert!(log.durable().entries.is_empty());
        drop(log);
        let reopened = RaftLog::open(dir.path()).unwrap();
        assert_eq!(reopened.durable().snapshot.as_ref().unwrap().get_metadata().index, 9);
        assert!(reopened.durable().entries.is_empty());
    }

    #[test]
    fn a_torn_last_frame_is_cut_and_what_came_before_survives() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RaftLog::open(dir.path()).unwrap();
        log.persist(&persist(vec![entry(1, 1)], Some(hard_state(1, 1, 1)), None)).unwrap();
        let whole = log.durable().clone();
        log.persist(&persist(vec![entry(2, 1)], None, None)).unwrap();
        drop(log);
        let path = dir.path().join(FILE_NAME);
        let raw = std::fs::read(&path).unwrap();
        for cut in 1..encode_entries(&[entry(2, 1)]).len() {
            std::fs::write(&path, &raw[..raw.len() - cut]).unwrap();
            let reopened = RaftLog::open(dir.path()).unwrap();
            assert_eq!(reopened.durable(), &whole, "cut {cut} bytes");
            let len = std::fs::metadata(&path).unwrap().len() as usize;
            assert_eq!(len, raw.len() - encode_entries(&[entry(2, 1)]).len(), "the torn frame is gone");
        }
    }

    #[test]
    fn the_file_is_rewritten_when_it_outgrows_its_state_and_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RaftLog::open(dir.path()).unwrap();
        let big = |index: u64| Entry { index, term: 1, data: vec![7u8; 256 << 10], ..Default::default() };
        for index in 1..=100 {
            log.persist(&persist(vec![big(index)], Some(hard_state(1, 1, index)), None)).unwrap();
            if index % 10 == 0 {
                log.compact(&snapshot(index, 1)).unwrap();
            }
        }
        let size = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len();
        assert!(size < REWRITE_BYTES_MIN + (1 << 20), "{size} bytes: the file was never rewritten");
        let state = log.durable().clone();
        drop(log);
        assert_eq!(RaftLog::open(dir.path()).unwrap().durable(), &state);
    }
}
