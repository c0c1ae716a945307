//! The storage engine: one `Log` per partition, owned by the core that owns
//! the partition (never shared across threads: `Rc`/`RefCell` inside).
//!
//! ```text
//! data/<topic>-<partition>/
//!   00000000000000000000.log        v2 record batches, as produced, offsets patched in
//!   00000000000000000000.index      sparse relative offset -> position
//!   00000000000000000000.timeindex  sparse max timestamp -> relative offset
//!   log-start                       log start offset (after DeleteRecords / retention)
//!   clean                           after a clean close, where the file system has no user xattrs
//! ```
//!
//! One file per part below: `write.rs` the write path, `read.rs` the read
//! path, `retention.rs` rolls and retention, `open.rs` the open and the
//! clean close it relies on. This file holds the types they share and the
//! log's accessors.
//!
//! Write path: `append` (synchronous, no await) assigns dense offsets, patches
//! the base offset and leader epoch (outside the CRC) in place into the batch
//! it is handed (a uniquely owned slice of the produce request, so the bytes
//! are not copied on the way in) and puts it in the tail cache. A single
//! writer per log (the `flush_lock`) copies the batches not yet written
//! into aligned buffers of up to 1 MiB, rewriting the partly filled last
//! page, and writes them with O_DIRECT, up
//! to four chunks in flight (chunks followed by more data end on a page
//! boundary, so no two writes in flight share a page); under `flush=always`
//! it then fdatasyncs. Appends that arrive while a write is in flight are
//! covered by the next one: one sync per file per I/O cycle (group commit).
//! Under `never` and interval policies nothing waits for the disk, so the
//! writer runs once 256 KiB is pending or after 100 ms (write-behind): large
//! writes cost the kernel far less per byte than one write per batch (with
//! 100 partitions and 16 KiB batches this doubled produce throughput). The
//! price: a process crash loses the unwritten window, which the page cache
//! would have kept; `always` is the policy for data that must survive.
//! The delayed writes of a core's logs are timed by one queue per core
//! (`write_behind`), which writes logs due within a few milliseconds of
//! each other in one io_uring submission.
//!
//! Read path: batches at or after the cache's first offset come from memory;
//! older ones are read with aligned DMA reads located through the index.
//! The cache stands in for the page cache O_DIRECT bypasses: the logs of a
//! core share one budget, the batch cached longest ago leaving first
//! (`core_cache`). A read that has to go to the disk starts reading the
//! next chunk in the background (`read_ahead`), as the kernel would for a
//! buffered file, so a consumer catching up does not wait for the disk on
//! every fetch.
//! Readers never see past the high-water mark, which under `flush=always`
//! is the durable end and otherwise the end of the log.
//!
//! Rolls and retention: a full (or old) segment is trimmed to its data,
//! fdatasynced and indexed before the next one starts. When the oldest
//! segment is then past retention, which would delete it at its next pass
//! anyway, the new segment is written over its file (`Segment::reuse`):
//! blocks already allocated and written are overwritten in place, with no
//! pre-allocation, no unwritten extents to convert and no freed blocks to
//! discard and allocate again. Produce p99 at max throughput (100
//! partitions, ~5 rolls/s) halved with it (docs/perf-history.md). The old
//! batches past the new data have offsets below the new segment's base,
//! so a crash scan, which checks offset continuity, stops at them. The
//! periodic retention pass deletes whatever else has expired.
//!
//! Open: after a crash, the last segment is scanned from its last index
//! entry and cut at the first torn batch (`recovery`). After a clean close
//! the clean mark (an xattr of the last segment, see `CleanEnd`) says where
//! it ends, and the open reads only the directory and the offset index:
//! the time index (`SegmentIndex::merge_times`) and the partly filled last
//! page (`Log::load_tail`) are read when first needed. At ten thousand
//! partitions each file read at open is ~10,000 disk reads after a reboot.

// File I/O: every file and directory operation goes through `disk::Disk`,
// the real file system (glommio DMA files) or the simulated one of the
// power-loss tests (`sim_disk`, tests/power_loss.rs).
mod core_cache;
pub mod disk;
pub mod index;
mod open;
mod read;
mod read_ahead;
pub mod recovery;
mod retention;
mod segment;
pub mod sim_disk;
mod truncate;
mod write;
mod write_behind;

pub use core_cache::{core_cache_bytes, set_core_cache_bytes_max, CORE_CACHE_BYTES_MAX_DEFAULT};
pub use disk::Disk;
pub use open::CLEAN_XATTR;
use read_ahead::ReadAhead;
pub use read_ahead::{core_read_ahead_bytes, READ_AHEAD_BYTES_MAX};

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use glommio::sync::Semaphore;

use crate::protocol::record_batch::BatchError;
use segment::Segment;

/// When an append counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// fdatasync before the append is acknowledged (group commit).
    Always,
    /// Written behind; fdatasync every so many milliseconds.
    IntervalMs(u64),
    /// Written behind; fdatasync only on roll and close.
    Never,
}

impl FlushPolicy {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "always" => Some(Self::Always),
            "never" => Some(Self::Never),
            other => other.parse::<u64>().ok().filter(|ms| *ms > 0).map(Self::IntervalMs),
        }
    }
}

impl std::fmt::Display for FlushPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Always => f.write_str("always"),
            Self::Never => f.write_str("never"),
            Self::IntervalMs(ms) => write!(f, "{ms}"),
        }
    }
}

/// Per-log settings (a topic's configs, resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    pub segment_bytes: u64,
    pub segment_ms: u64,
    /// -1: keep forever.
    pub retention_ms: i64,
    /// -1: no size limit.
    pub retention_bytes: i64,
    pub flush: FlushPolicy,
    pub index_interval_bytes: u64,
    /// Largest batch accepted (`max.message.bytes`).
    pub batch_bytes_max: usize,
    /// Written batches kept in memory for tail reads, at most; the logs of
    /// a core also share the core's budget (`core_cache`), oldest out first.
    pub cache_bytes_max: usize,
    /// Unwritten bytes beyond which appends wait for the writer.
    pub pending_bytes_max: usize,
    /// Partition leader epoch patched into every batch.
    pub leader_epoch: i32,
    /// `min.insync.replicas` of the partition's topic (replication reads
    /// it; the log itself does not).
    pub min_insync_replicas: i32,
    /// At a roll, write the new segment over the oldest one's file when
    /// retention would delete that segment anyway (`Segment::reuse`),
    /// instead of creating a new file and deleting the old one.
    pub recycle_segments: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            flush: FlushPolicy::Always,
            index_interval_bytes: 4096,
            batch_bytes_max: 1024 * 1024 + 12,
            cache_bytes_max: 1 << 30,
            pending_bytes_max: 8 << 20,
            leader_epoch: 0,
            min_insync_replicas: 1,
            recycle_segments: true,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("offset {offset} is outside [{log_start}, {high_watermark}]")]
    OffsetOutOfRange { offset: i64, log_start: i64, high_watermark: i64 },
    #[error("invalid batch: {0}")]
    Batch(#[from] BatchError),
    #[error("batch of {size} bytes exceeds the limit of {max}")]
    BatchTooLarge { size: usize, max: usize },
    #[error("i/o error on {path}: {message}")]
    Io { path: String, message: String, enospc: bool },
    #[error("log stopped after an earlier write or sync failure: {0}")]
    Failed(String),
    #[error("log is closed")]
    Closed,
    #[error("a copied batch starts at {got}, not at the log end {expected}")]
    NotContiguous { expected: i64, got: i64 },
    #[error("segment {path} is corrupt: {reason}")]
    Corrupt { path: String, reason: String },
}

impl LogError {
    /// The failure of an operation on `path`. `LogError::Io` names the path
    /// once: glommio's own errors, which carry the path and the operation
    /// too, are reduced to the OS error.
    pub fn io(path: &Path, err: impl Into<OsError>) -> Self {
        let OsError(err) = err.into();
        LogError::Io {
            path: path.display().to_string(),
            // glommio's errors keep the kind, not the errno, when converted.
            enospc: err.raw_os_error() == Some(libc::ENOSPC) || err.kind() == std::io::ErrorKind::StorageFull,
            message: err.to_string(),
        }
    }
}

/// The OS's error under an I/O failure, without glommio's description of
/// the operation (its path and file descriptor).
pub struct OsError(pub std::io::Error);

impl From<std::io::Error> for OsError {
    fn from(err: std::io::Error) -> Self {
        OsError(err)
    }
}

impl From<glommio::GlommioError<()>> for OsError {
    fn from(err: glommio::GlommioError<()>) -> Self {
        match err {
            glommio::GlommioError::EnhancedIoError { source, .. } => OsError(source),
            other => OsError(other.into()),
        }
    }
}

/// The OS's error under a glommio error, for an `io::Result` whose caller names the path.
pub fn os_error(err: glommio::GlommioError<()>) -> std::io::Error {
    OsError::from(err).0
}

/// Offsets assigned to one appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: i64,
    pub last_offset: i64,
}

/// Batches returned by a read, whole and in order.
#[derive(Debug, Clone, Default)]
pub struct ReadOutput {
    pub batches: Vec<Bytes>,
    pub high_watermark: i64,
    pub log_start_offset: i64,
}

/// What opening a log found on disk.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub clean_shutdown: bool,
    pub segments: usize,
    pub truncated_bytes: u64,
    pub scanned_bytes: u64,
    /// Segments that could not be read, renamed to `*.log.unreadable`.
    pub unreadable_segments: Vec<PathBuf>,
}

struct CachedBatch {
    base_offset: i64,
    last_offset: i64,
    max_timestamp: i64,
    data: Bytes,
    /// Core-wide order of caching (`core_cache`).
    seq: u64,
}

struct State {
    segments: BTreeMap<i64, Segment>,
    log_start_offset: i64,
    /// Next offset to assign.
    log_end_offset: i64,
    /// Next offset not yet written to a file.
    written_end_offset: i64,
    /// Next offset not yet durable (fdatasync'ed).
    synced_end_offset: i64,
    /// Recent batches; every unwritten batch is here (a suffix).
    cache: VecDeque<CachedBatch>,
    cache_bytes: usize,
    pending_bytes: usize,
    /// The write or sync error that stopped the log.
    failed: Option<LogError>,
    closed: bool,
    /// Closed with everything written, trimmed, indexed and synced.
    closed_cleanly: bool,
    writer: WriteBehind,
    bytes_since_index_persist: u64,
}

struct Inner {
    disk: Disk,
    dir: PathBuf,
    config: RefCell<LogConfig>,
    state: RefCell<State>,
    /// One writer at a time: rolls, writes, syncs and retention.
    flush_lock: Semaphore,
    /// Set when written data awaits an fdatasync (interval policy).
    unsynced: Cell<bool>,
    /// Armed by `inject_fault_nth`: the fault, and how many matching
    /// operations to go until it strikes (1: the next).
    fault: Cell<Option<(InjectedFault, u32)>>,
    /// One unit per segment write in flight (held by the write's task).
    writes: Rc<Semaphore>,
    read_ahead: RefCell<ReadAhead>,
    /// The high watermark replication allows (`set_high_watermark_limit`).
    high_watermark_limit: Cell<i64>,
}

/// An I/O error the storage layer's test hook makes the next write or
/// fdatasync of one log return, as a failing disk would (EIO). Real disks
/// seldom fail on demand; the tests of what a broker does then need this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFault {
    /// The next segment write fails with EIO.
    WriteEio,
    /// The next fdatasync fails with EIO (the write before it succeeded).
    SyncEio,
}

impl InjectedFault {
    /// Parses `write-eio` or `sync-eio`, with an optional `@N` (N >= 1):
    /// the Nth such operation fails instead of the first, so that a test
    /// has acknowledged data in the log before the fault.
    pub fn parse(text: &str) -> Option<(Self, u32)> {
        let (kind, nth) = match text.split_once('@') {
            Some((kind, nth)) => (kind, nth.parse().ok().filter(|nth| *nth >= 1)?),
            None => (text, 1),
        };
        let fault = match kind {
            "write-eio" => InjectedFault::WriteEio,
            "sync-eio" => InjectedFault::SyncEio,
            _ => return None,
        };
        Some((fault, nth))
    }
}

/// The write-behind task of a log, if one is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteBehind {
    Idle,
    /// Will write after `WRITE_BEHIND_DELAY`.
    Delayed,
    /// Will write at once: a chunk is pending.
    Urgent,
}

/// A partition's log. Cheap to clone (a handle); lives on one core.
#[derive(Clone)]
pub struct Log {
    inner: Rc<Inner>,
}

/// Read granularity for recovery and for disk reads.
const READ_CHUNK_BYTES: u64 = 1 << 20;

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Log {
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The disk the log lives on (state kept beside it goes there too).
    pub fn disk(&self) -> &Disk {
        &self.inner.disk
    }

    pub fn config(&self) -> LogConfig {
        self.inner.config.borrow().clone()
    }

    pub fn set_config(&self, config: LogConfig) {
        *self.inner.config.borrow_mut() = config;
    }

    /// Test hook: the next write or fdatasync (per `fault`) of this log fails
    /// with EIO, once.
    pub fn inject_fault(&self, fault: InjectedFault) {
        self.inject_fault_nth(fault, 1);
    }

    /// Test hook: the `nth` next write or fdatasync (per `fault`; a roll's
    /// fdatasync does not count) of this log fails with EIO, once.
    pub fn inject_fault_nth(&self, fault: InjectedFault, nth: u32) {
        assert!(nth >= 1, "the first operation is the 1st");
        self.inner.fault.set(Some((fault, nth)));
    }

    /// The injected error, if `fault` is armed and this is its operation
    /// (which disarms it).
    fn injected(&self, fault: InjectedFault, path: &Path) -> Result<(), LogError> {
        match self.inner.fault.get() {
            Some((armed, nth)) if armed == fault && nth > 1 => {
                self.inner.fault.set(Some((armed, nth - 1)));
                Ok(())
            }
            Some((armed, _)) if armed == fault => {
                self.inner.fault.set(None);
                Err(LogError::io(path, std::io::Error::from_raw_os_error(libc::EIO)))
            }
            _ => Ok(()),
        }
    }

    /// True when the log failed for want of space, so reopening it once
    /// space returns is safe; false when healthy or failed for another cause:
    /// after an EIO it stays stopped until the broker restarts (a failed
    /// fdatasync may have dropped the data the kernel could not write, so
    /// retrying in place could lose it).
    pub fn failed_for_space(&self) -> bool {
        matches!(self.inner.state.borrow().failed, Some(LogError::Io { enospc: true, .. }))
    }

    /// True after a write or sync failed: the log takes no more appends
    /// until it is reopened (which recovers what is on disk).
    pub fn is_failed(&self) -> bool {
        self.inner.state.borrow().failed.is_some()
    }

    pub fn log_start_offset(&self) -> i64 {
        self.inner.state.borrow().log_start_offset
    }

    /// The end of what a crash keeps: synced batches under flush `always`
    /// (an acknowledgement waits for the sync), written ones otherwise (a
    /// process crash keeps what reached the device; acknowledged data not
    /// yet written is what flush `never` risks).
    pub fn durable_end_offset(&self) -> i64 {
        let state = self.inner.state.borrow();
        if self.inner.config.borrow().flush == FlushPolicy::Always {
            state.synced_end_offset
        } else {
            state.written_end_offset
        }
    }

    pub fn log_end_offset(&self) -> i64 {
        self.inner.state.borrow().log_end_offset
    }

    /// The offset up to which consumers may read: this log's own end
    /// (`local_end_offset`), or less where replication sets a limit.
    pub fn high_watermark(&self) -> i64 {
        self.local_end_offset().min(self.inner.high_watermark_limit.get())
    }

    /// What this replica holds as done under the flush policy: synced
    /// batches under `always`, every appended one otherwise. A leader's
    /// high watermark never passes it; a follower's fetch offset is it.
    pub fn local_end_offset(&self) -> i64 {
        let state = self.inner.state.borrow();
        match self.inner.config.borrow().flush {
            FlushPolicy::Always => state.synced_end_offset,
            _ => state.log_end_offset,
        }
    }

    /// Sets the high watermark of a replicated partition (its leader's
    /// ISR decides it); `i64::MAX` lifts it (one replica: the log's end).
    /// Readers and waiters on `high_watermark` see it at once.
    pub fn set_high_watermark_limit(&self, limit: i64) {
        self.inner.high_watermark_limit.set(limit);
    }

    pub fn high_watermark_limit(&self) -> i64 {
        self.inner.high_watermark_limit.get()
    }

    /// Bytes on disk in all segments.
    pub fn size_bytes(&self) -> u64 {
        self.inner.state.borrow().segments.values().map(|s| s.size_bytes).sum()
    }

    /// Base offset of the segment being written.
    pub fn active_segment_base_offset(&self) -> i64 {
        self.inner.state.borrow().segments.keys().next_back().copied().unwrap_or(0)
    }

    pub fn segment_count(&self) -> usize {
        self.inner.state.borrow().segments.len()
    }

    /// Memory this log holds: cache, unwritten data, indexes, tails.
    pub fn memory_bytes(&self) -> usize {
        let state = self.inner.state.borrow();
        state.cache_bytes
            + state
                .segments
                .values()
                .map(|s| s.index.memory_bytes() + s.tail.as_ref().map_or(0, Vec::capacity))
                .sum::<usize>()
    }

    fn active_mut(&self, f: impl FnOnce(&mut Segment)) {
        let mut state = self.inner.state.borrow_mut();
        if let Some((_, active)) = state.segments.iter_mut().next_back() {
            f(active);
        }
    }
}

/// Interval between fdatasyncs under `flush=<ms>`; used by the shard's timer.
pub fn sync_interval(policy: FlushPolicy) -> Option<Duration> {
    match policy {
        FlushPolicy::IntervalMs(ms) => Some(Duration::from_millis(ms)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::InjectedFault;

    #[test]
    fn injected_fault_parses_an_optional_nth_operation() {
        assert_eq!(InjectedFault::parse("sync-eio"), Some((InjectedFault::SyncEio, 1)));
        assert_eq!(InjectedFault::parse("sync-eio@3"), Some((InjectedFault::SyncEio, 3)));
        assert_eq!(InjectedFault::parse("write-eio@1"), Some((InjectedFault::WriteEio, 1)));
        for bad in ["sync-eio@0", "sync-eio@", "sync-eio@x", "read-eio", "sync-eio@-1"] {
            assert_eq!(InjectedFault::parse(bad), None, "{bad}");
        }
    }
}
