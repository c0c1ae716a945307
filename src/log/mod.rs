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
mod read;
mod read_ahead;
pub mod recovery;
mod retention;
mod segment;
pub mod sim_disk;
mod write;
mod write_behind;

pub use core_cache::{core_cache_bytes, set_core_cache_bytes_max, CORE_CACHE_BYTES_MAX_DEFAULT};
pub use disk::Disk;
use disk::File;
use read_ahead::ReadAhead;
pub use read_ahead::{core_read_ahead_bytes, READ_AHEAD_BYTES_MAX};
use write::WRITES_IN_FLIGHT;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use glommio::sync::Semaphore;

use crate::constants::BATCH_BYTES_MAX_LIMIT;
use crate::protocol::record_batch::{self, BatchError};
use index::{OffsetEntry, SegmentIndex, TimeEntry};
use recovery::ScanStop;
use segment::{Segment, PAGE_BYTES};

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
const CLEAN_MARKER: &str = "clean";
/// The clean mark, as an extended attribute of the active segment's file.
pub const CLEAN_XATTR: &str = "user.shardlog.clean";
const LOG_START_FILE: &str = "log-start";

/// The clean mark: where the active segment ended at the clean close, so
/// the next open need not scan for it. It is an extended attribute of the
/// segment file (`CLEAN_XATTR`), which the open removes before the log
/// takes writes; 44 bytes fit in an ext4 inode, so neither setting nor
/// removing it allocates or frees a block. A `clean` file holding the same
/// bytes took its place before, and still does where the file system has
/// no user xattrs: at ten thousand partitions, unlinking those files at
/// open (ext4 frees the block and discards it, synchronously) and
/// creating them again at shutdown (a search through recently freed
/// inodes) took seconds. An empty or unreadable mark (older versions wrote
/// an empty file) still means a clean close; the open then scans as after
/// a crash.
///
/// ```text
/// mark: "SLCLEAN1" | crc32 (of the rest) u32 LE | base_offset i64 BE | size_bytes u64 BE |
///       next_offset i64 BE | max_timestamp i64 BE
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CleanEnd {
    base_offset: i64,
    size_bytes: u64,
    next_offset: i64,
    max_timestamp: i64,
}

const CLEAN_MAGIC: &[u8; 8] = b"SLCLEAN1";

impl CleanEnd {
    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(32);
        body.extend_from_slice(&self.base_offset.to_be_bytes());
        body.extend_from_slice(&self.size_bytes.to_be_bytes());
        body.extend_from_slice(&self.next_offset.to_be_bytes());
        body.extend_from_slice(&self.max_timestamp.to_be_bytes());
        let mut out = Vec::with_capacity(44);
        out.extend_from_slice(CLEAN_MAGIC);
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn decode(raw: &[u8]) -> Option<CleanEnd> {
        let rest = raw.strip_prefix(CLEAN_MAGIC)?;
        let (crc, body) = rest.split_first_chunk::<4>()?;
        if body.len() != 32 || crc32fast::hash(body).to_le_bytes() != *crc {
            return None;
        }
        let field = |i: usize| body[i * 8..i * 8 + 8].try_into().ok();
        Some(CleanEnd {
            base_offset: i64::from_be_bytes(field(0)?),
            size_bytes: u64::from_be_bytes(field(1)?),
            next_offset: i64::from_be_bytes(field(2)?),
            max_timestamp: i64::from_be_bytes(field(3)?),
        })
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Log {
    /// Opens (or creates) the log in `dir`, recovering the last segment.
    pub async fn open(dir: impl Into<PathBuf>, config: LogConfig) -> Result<(Log, RecoveryReport), LogError> {
        Log::open_on(Disk::Real, dir, config).await
    }

    /// `open` on the given disk (the real one, or the fault tests'
    /// simulated one).
    pub async fn open_on(
        disk: Disk,
        dir: impl Into<PathBuf>,
        config: LogConfig,
    ) -> Result<(Log, RecoveryReport), LogError> {
        let dir = dir.into();
        disk.create_dir_all(&dir).await.map_err(|e| LogError::io(&dir, e))?;
        if disk.is_real() {
            probe_device(&dir).await?;
        }
        // The marker file: on file systems without user xattrs, and from
        // versions before the xattr. Looking for it through io_uring also
        // reads the directory's entries off the core, before the listing
        // below (which, listing first, made cold starts 1.3x slower).
        let marker = dir.join(CLEAN_MARKER);
        let (clean_shutdown, mut clean_end) = match disk.read_small_file(&marker).await {
            Ok(Some(raw)) => {
                disk.remove_if_present(&marker).await.map_err(|e| LogError::io(&marker, e))?;
                (true, CleanEnd::decode(&raw))
            }
            Ok(None) => (false, None),
            Err(e) => return Err(LogError::io(&marker, e)),
        };
        let listing = list_dir(&disk, &dir)?;
        let mut base_offsets = listing.segments;
        // A new log has nothing to recover.
        let mut report =
            RecoveryReport { clean_shutdown: clean_shutdown || base_offsets.is_empty(), ..RecoveryReport::default() };
        base_offsets.sort_unstable();
        let mut segments = BTreeMap::new();
        let now = now_ms();
        let last_base = base_offsets.last().copied();
        for base in base_offsets {
            let is_last = Some(base) == last_base;
            let known_end = if is_last { clean_end.take() } else { None };
            match open_segment(&disk, &dir, base, is_last, known_end, &config, now, &mut report).await {
                Ok(segment) => {
                    segments.insert(base, segment);
                }
                Err(LogError::Io { path, message, .. }) => {
                    // Never drop data silently: move the segment aside and say so.
                    let log_path = dir.join(segment::file_name(base, "log"));
                    let aside = log_path.with_extension("log.unreadable");
                    disk.rename(&log_path, &aside).await.map_err(|e| LogError::io(&log_path, e))?;
                    tracing::error!(%path, error = %message, moved_to = %aside.display(), "segment cannot be read; moved aside");
                    report.unreadable_segments.push(aside);
                }
                Err(other) => return Err(other),
            }
        }
        let stored_start = if listing.log_start { read_log_start(&disk, &dir).await? } else { None };
        if segments.is_empty() {
            let base = stored_start.unwrap_or(0);
            segments.insert(base, Segment::create(&disk, &dir, base, now).await?);
        }
        report.segments = segments.len();
        let first_base = *segments.keys().next().unwrap_or(&0);
        let log_end_offset = segments.values().next_back().map_or(0, |s| s.next_offset);
        let log_start_offset = stored_start.unwrap_or(first_base).clamp(first_base, log_end_offset);
        let state = State {
            segments,
            log_start_offset,
            log_end_offset,
            written_end_offset: log_end_offset,
            synced_end_offset: log_end_offset,
            cache: VecDeque::new(),
            cache_bytes: 0,
            pending_bytes: 0,
            failed: None,
            closed: false,
            closed_cleanly: false,
            writer: WriteBehind::Idle,
            bytes_since_index_persist: 0,
        };
        let log = Log {
            inner: Rc::new(Inner {
                disk,
                dir,
                config: RefCell::new(config),
                state: RefCell::new(state),
                flush_lock: Semaphore::new(1),
                unsynced: Cell::new(false),
                fault: Cell::new(None),
                writes: Rc::new(Semaphore::new(WRITES_IN_FLIGHT)),
                read_ahead: RefCell::new(ReadAhead::default()),
            }),
        };
        Ok((log, report))
    }

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

    /// The offset up to which consumers may read.
    pub fn high_watermark(&self) -> i64 {
        let state = self.inner.state.borrow();
        match self.inner.config.borrow().flush {
            FlushPolicy::Always => state.synced_end_offset,
            _ => state.log_end_offset,
        }
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

    /// Writes and syncs everything, persists indexes, trims pre-allocation and
    /// leaves the clean marker, which records where the active segment ends
    /// so that the next open need not scan it. The log refuses appends
    /// afterwards.
    pub async fn close(&self) -> Result<(), LogError> {
        self.close_unmarked().await?;
        self.mark_clean()
    }

    /// Closes like `close` but leaves no clean marker yet: the next open
    /// scans the last segment and the partition replays it, unless
    /// `mark_clean` follows. State kept beside the log (the producer
    /// snapshot) is saved between the two, as of the log's final end.
    pub async fn close_unmarked(&self) -> Result<(), LogError> {
        let _permit = self.inner.flush_lock.acquire_permit(1).await.map_err(|_| LogError::Closed)?;
        if self.inner.state.borrow().failed.is_none() {
            self.write_and_sync_locked(true).await?;
        }
        // A writer dropped mid-way may have left writes in flight.
        drop(self.inner.writes.acquire_permit(WRITES_IN_FLIGHT).await.map_err(|_| LogError::Closed)?);
        self.inner.state.borrow_mut().closed = true;
        self.inner.read_ahead.borrow_mut().close();
        let (file, size, path) = {
            let mut state = self.inner.state.borrow_mut();
            let Some((_, active)) = state.segments.iter_mut().next_back() else { return Ok(()) };
            (active.file.clone(), active.size_bytes, active.log_path.clone())
        };
        file.truncate(size).await.map_err(|e| LogError::io(&path, e))?;
        self.persist_active_index().await?;
        let files: Vec<Rc<File>> = self.inner.state.borrow().segments.values().map(|s| s.file.clone()).collect();
        for file in files {
            file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
        }
        self.inner.state.borrow_mut().closed_cleanly = true;
        Ok(())
    }

    /// Leaves the clean mark on a log that `close_unmarked` closed without
    /// a failure: the next open takes the end from it and scans nothing.
    /// Does nothing to a log that failed or is not closed.
    pub fn mark_clean(&self) -> Result<(), LogError> {
        let end = {
            let state = self.inner.state.borrow();
            if !state.closed_cleanly || state.failed.is_some() {
                return Ok(());
            }
            state.segments.values().next_back().map(|active| {
                let end = CleanEnd {
                    base_offset: active.base_offset,
                    size_bytes: active.size_bytes,
                    next_offset: active.next_offset,
                    max_timestamp: active.max_timestamp,
                };
                (active.log_path.clone(), end)
            })
        };
        match end {
            Some((log_path, end)) => mark_clean(&self.inner.disk, &self.inner.dir, &log_path, &end.encode()),
            None => Ok(()),
        }
    }

    /// Removes the log's directory (topic deletion). The log must be closed.
    pub fn remove_files(&self) -> Result<(), LogError> {
        self.inner.disk.remove_dir_all(&self.inner.dir).map_err(|e| LogError::io(&self.inner.dir, e))
    }

    /// Reads a segment's time index file where the open left it unread.
    async fn read_times(&self, base: i64) -> Result<(), LogError> {
        let path = {
            let state = self.inner.state.borrow();
            match state.segments.get(&base) {
                Some(segment) if !segment.index.times_read() => segment.index_path("timeindex"),
                _ => return Ok(()),
            }
        };
        let times = read_index_file(&self.inner.disk, &path).await;
        let mut state = self.inner.state.borrow_mut();
        if let Some(segment) = state.segments.get_mut(&base) {
            if !segment.index.merge_times(&times) {
                segment.index_entries_persisted = None;
            }
        }
        Ok(())
    }

    /// Reads the active segment's partly filled last page where a clean
    /// open left it on disk (most partitions are never written before the
    /// next restart: reading every tail at open was a third of a cold
    /// start's disk reads).
    async fn load_tail(&self) -> Result<(), LogError> {
        let (file, path, size) = {
            let state = self.inner.state.borrow();
            let Some(active) = state.segments.values().next_back() else { return Ok(()) };
            if active.tail.is_some() {
                return Ok(());
            }
            (active.file.clone(), active.log_path.clone(), active.size_bytes)
        };
        // Under the flush lock: nothing else writes the segment meanwhile.
        let tail = read_tail(&file, &path, size).await?;
        self.active_mut(|active| active.tail = Some(tail));
        Ok(())
    }

    fn active_mut(&self, f: impl FnOnce(&mut Segment)) {
        let mut state = self.inner.state.borrow_mut();
        if let Some((_, active)) = state.segments.iter_mut().next_back() {
            f(active);
        }
    }
}

/// What a log directory holds.
struct DirListing {
    /// Base offsets of the segments, unsorted.
    segments: Vec<i64>,
    log_start: bool,
}

fn list_dir(disk: &Disk, dir: &Path) -> Result<DirListing, LogError> {
    let mut out = DirListing { segments: Vec::new(), log_start: false };
    for name in disk.list_dir(dir).map_err(|e| LogError::io(dir, e))? {
        match name.as_str() {
            LOG_START_FILE => out.log_start = true,
            _ => {
                if let Some(base) =
                    name.strip_suffix(".log").filter(|stem| stem.len() == 20).and_then(|s| s.parse().ok())
                {
                    out.segments.push(base);
                }
            }
        }
    }
    Ok(out)
}

/// Where a segment's valid data ends.
struct SegmentEnd {
    position: u64,
    next_offset: i64,
    max_timestamp: i64,
    bytes_since_index: u64,
}

/// Finds where a segment's valid batches end, as after a crash: from the
/// last index entry that points at the batch it claims, reads and checks
/// every batch to the end of the file, adding the index entries the crash
/// lost.
/// Short reads in a row (no whole batch gained) after which a recovery
/// scan gives up with an error rather than guess where the log ends.
const SHORT_READS_MAX: u32 = 8;

async fn scan_segment_end(
    file: &File,
    log_path: &Path,
    base: i64,
    file_size: u64,
    index: &mut SegmentIndex,
    config: &LogConfig,
    report: &mut RecoveryReport,
) -> Result<SegmentEnd, LogError> {
    let mut start = (0u64, base);
    while let Some(entry) = index.offsets.last().copied() {
        let expected = base + i64::from(entry.relative_offset);
        let probe = file
            .read_at(u64::from(entry.position), record_batch::HEADER_BYTES)
            .await
            .map_err(|e| LogError::io(log_path, e))?;
        if probe.len() == record_batch::HEADER_BYTES && record_batch::read_i64(&probe, 0) == expected {
            start = (u64::from(entry.position), expected);
            break;
        }
        index.offsets.pop();
        index.truncate_to_position(entry.position);
    }
    let (mut position, mut next_offset) = start;
    let mut max_timestamp = index.times.last().map_or(i64::MIN, |t| t.max_timestamp);
    let mut bytes_since_index = 0u64;
    // Bytes to read next: a chunk, or the whole batch that a chunk cut.
    let mut wanted = READ_CHUNK_BYTES;
    let mut reads_without_progress = 0;
    while position < file_size {
        // Reads start on a page boundary: glommio sizes the result of an
        // unaligned read that comes back short as if it were whole, so only
        // an aligned read says truthfully how many bytes it holds.
        let aligned = position - position % PAGE_BYTES;
        let skip = (position - aligned) as usize;
        let len = (skip as u64 + wanted.min(file_size - position)) as usize;
        let read = file.read_at(aligned, len).await.map_err(|e| LogError::io(log_path, e))?;
        let chunk = read.get(skip..).unwrap_or_default();
        let scan = recovery::scan(chunk, next_offset, BATCH_BYTES_MAX_LIMIT);
        for batch in &scan.batches {
            let batch_position = position + batch.position as u64;
            if bytes_since_index >= config.index_interval_bytes && batch_position > 0 {
                let relative_offset = (batch.header.base_offset - base) as u32;
                if index.offsets.last().is_none_or(|e| e.relative_offset < relative_offset) {
                    index.push(
                        OffsetEntry { relative_offset, position: batch_position as u32 },
                        TimeEntry { max_timestamp, relative_offset },
                    );
                }
                bytes_since_index = 0;
            }
            bytes_since_index += batch.header.size_bytes as u64;
            max_timestamp = max_timestamp.max(batch.header.max_timestamp);
        }
        next_offset = scan.next_offset;
        let valid = scan.valid_bytes() as u64;
        let chunk_end = position + chunk.len() as u64;
        position += valid;
        // Only bytes that were read can end the log: a chunk that ends at
        // a batch boundary, or inside a batch, before the file does is
        // followed by reading on (the whole batch at once if it is larger
        // than a chunk). Cutting at a short read would drop durable data.
        let needed = match scan.stop {
            ScanStop::Invalid { .. } => break,
            ScanStop::End => 0,
            ScanStop::Incomplete { needed_bytes, .. } => needed_bytes as u64,
        };
        if chunk_end >= file_size {
            break;
        }
        reads_without_progress = if valid == 0 { reads_without_progress + 1 } else { 0 };
        if reads_without_progress > SHORT_READS_MAX {
            return Err(LogError::io(
                log_path,
                std::io::Error::other(format!("reads at position {position} keep returning short of {needed} bytes")),
            ));
        }
        wanted = READ_CHUNK_BYTES.max(needed);
    }
    report.scanned_bytes += position - start.0;
    Ok(SegmentEnd { position, next_offset, max_timestamp, bytes_since_index })
}

#[allow(clippy::too_many_arguments)]
async fn open_segment(
    disk: &Disk,
    dir: &Path,
    base: i64,
    is_last: bool,
    mut clean_end: Option<CleanEnd>,
    config: &LogConfig,
    now: u64,
    report: &mut RecoveryReport,
) -> Result<Segment, LogError> {
    let log_path = dir.join(segment::file_name(base, "log"));
    let file = segment::open(disk, &log_path, false).await?;
    if is_last {
        // The file is open, so its inode is in memory: no disk read here.
        if let Some(mark) = take_clean_mark(disk, &log_path)? {
            report.clean_shutdown = true;
            clean_end = CleanEnd::decode(&mark);
        }
    }
    let file_size = file.file_size().await.map_err(|e| LogError::io(&log_path, e))?;
    let offsets = read_index_file(disk, &log_path.with_extension("index")).await;
    let mut index = SegmentIndex::decode_offsets(&offsets, file_size);
    // The offset index file holds exactly what was decoded (nothing
    // dropped); the time index is checked when it is read.
    let mut index_entries_persisted =
        (offsets.len() == index.offsets.len() * index::OFFSET_ENTRY_BYTES).then_some(index.offsets.len());
    let clean_end = clean_end.filter(|end| end.base_offset == base && end.size_bytes == file_size);
    let trusted_end = clean_end.is_some();
    let end = match clean_end {
        // A clean close recorded where the segment ends and persisted its
        // index: nothing to scan. (Scanning the last segment of every
        // partition was most of a clean restart's disk reads.) The time
        // index is read when first needed (`Log::read_times`).
        Some(clean) => SegmentEnd {
            position: clean.size_bytes,
            next_offset: clean.next_offset,
            max_timestamp: clean.max_timestamp,
            bytes_since_index: clean.size_bytes - index.offsets.last().map_or(0, |entry| u64::from(entry.position)),
        },
        None => {
            let times = read_index_file(disk, &log_path.with_extension("timeindex")).await;
            index.merge_times(&times);
            // The scan rebuilds entries past the last one it trusts.
            index_entries_persisted = None;
            scan_segment_end(&file, &log_path, base, file_size, &mut index, config, report).await?
        }
    };
    let SegmentEnd { position, next_offset, max_timestamp, bytes_since_index } = end;
    if position < file_size {
        if !is_last {
            tracing::warn!(segment = %log_path.display(), valid_bytes = position, file_size, "older segment has an invalid tail; truncating");
        }
        report.truncated_bytes += file_size - position;
        file.truncate(position).await.map_err(|e| LogError::io(&log_path, e))?;
        tracing::warn!(segment = %log_path.display(), truncated_bytes = file_size - position, "recovery truncated the log");
    }
    let tail = if !is_last {
        Some(Vec::new())
    } else if trusted_end {
        // Read when first written (`Log::load_tail`).
        (position % PAGE_BYTES == 0).then(Vec::new)
    } else {
        Some(read_tail(&file, &log_path, position).await?)
    };
    Ok(Segment {
        base_offset: base,
        file: Rc::new(file),
        log_path,
        size_bytes: position,
        next_offset,
        tail,
        allocated_bytes: position,
        index,
        bytes_since_index,
        max_timestamp,
        created_ms: now,
        index_entries_persisted,
    })
}

thread_local! {
    static PROBED_DEVICES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

impl Drop for Inner {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        core_cache::forget(state.cache.front().map(|b| b.seq), state.cache_bytes);
    }
}

/// glommio decides once per device and thread whether reads may use the
/// io_uring poll ring, by reading the first page of the first file it opens
/// there. On an empty file that read succeeds on any device (EOF), so the
/// poll ring gets enabled where it is unsupported and every later read fails
/// with EOPNOTSUPP. Opening a file that has a page of data first makes the
/// probe truthful.
async fn probe_device(dir: &Path) -> Result<(), LogError> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(dir).map_err(|e| LogError::io(dir, e))?.dev();
    if PROBED_DEVICES.with(|probed| probed.borrow().contains(&device)) {
        return Ok(());
    }
    let path = dir.join(format!(".probe-{:?}", std::thread::current().id()).replace(['(', ')'], ""));
    let probe = match std::fs::write(&path, vec![0u8; PAGE_BYTES as usize]) {
        Ok(()) => path.clone(),
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
            // A full disk must not stop a start (the broker serves reads
            // and reopens its logs once space returns): probe with a
            // segment that already holds a page, or not yet at all.
            let _ = std::fs::remove_file(&path);
            match segment_with_a_page(dir) {
                Some(existing) => existing,
                None => return Ok(()),
            }
        }
        Err(e) => return Err(LogError::io(&path, e)),
    };
    let file = segment::open(&Disk::Real, &probe, false).await?;
    let _ = file.close().await;
    if probe == path {
        std::fs::remove_file(&path).map_err(|e| LogError::io(&path, e))?;
    }
    PROBED_DEVICES.with(|probed| probed.borrow_mut().push(device));
    Ok(())
}

/// A segment file in `dir` at least a page long, if there is one.
fn segment_with_a_page(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir).ok()?.filter_map(Result::ok).map(|entry| entry.path()).find(|path| {
        path.extension().is_some_and(|e| e == "log") && std::fs::metadata(path).is_ok_and(|m| m.len() >= PAGE_BYTES)
    })
}

/// The partly filled last page of a segment whose data ends at `position`.
async fn read_tail(file: &File, path: &Path, position: u64) -> Result<Vec<u8>, LogError> {
    let tail_len = (position % PAGE_BYTES) as usize;
    if tail_len == 0 {
        return Ok(Vec::new());
    }
    let page = file.read_at(position - tail_len as u64, tail_len).await.map_err(|e| LogError::io(path, e))?;
    Ok(page[..tail_len].to_vec())
}

/// An index file's content; a missing or unreadable one is an empty index
/// (the recovery scan rebuilds what it lacks).
async fn read_index_file(disk: &Disk, path: &Path) -> Vec<u8> {
    disk.read_small_file(path).await.ok().flatten().unwrap_or_default()
}

/// Leaves the clean mark on the active segment (`log_path`), or in a
/// `clean` file in `dir` where the file system has no user xattrs.
fn mark_clean(disk: &Disk, dir: &Path, log_path: &Path, mark: &[u8]) -> Result<(), LogError> {
    match disk.set_xattr(log_path, CLEAN_XATTR, mark) {
        Ok(()) => Ok(()),
        Err(e) if is_unsupported(&e) => {
            let marker = dir.join(CLEAN_MARKER);
            disk.write_small_file(&marker, mark).map_err(|e| LogError::io(&marker, e))
        }
        Err(e) => Err(LogError::io(log_path, e)),
    }
}

/// Reads and removes the clean mark of a segment. A mark that cannot be
/// removed fails the open: left in place, it could vouch for a segment
/// that changed after a later crash.
fn take_clean_mark(disk: &Disk, log_path: &Path) -> Result<Option<Vec<u8>>, LogError> {
    let mark = match disk.get_xattr(log_path, CLEAN_XATTR) {
        Ok(mark) => mark,
        Err(e) if is_unsupported(&e) => None,
        Err(e) => {
            tracing::warn!(segment = %log_path.display(), error = %e, "cannot read the clean mark; scanning the segment");
            return Ok(None);
        }
    };
    if mark.is_some() {
        match disk.remove_xattr(log_path, CLEAN_XATTR) {
            Err(e) if e.raw_os_error() != Some(libc::ENODATA) => {
                return Err(LogError::Corrupt {
                    path: log_path.display().to_string(),
                    reason: format!("cannot remove the clean mark: {e}"),
                });
            }
            _ => {}
        }
    }
    Ok(mark)
}

fn is_unsupported(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.kind() == std::io::ErrorKind::Unsupported
}

async fn read_log_start(disk: &Disk, dir: &Path) -> Result<Option<i64>, LogError> {
    let path = dir.join(LOG_START_FILE);
    let raw = disk.read_small_file(&path).await.map_err(|e| LogError::io(&path, e))?;
    Ok(raw.and_then(|raw| std::str::from_utf8(&raw).ok()?.trim().parse::<i64>().ok()))
}

/// Atomically records the log start offset (write, fdatasync, rename),
/// without blocking the core: under heavy writes an fdatasync can take
/// hundreds of milliseconds, which on the reactor thread stalled every
/// partition and connection of the core.
async fn write_log_start(disk: &Disk, dir: &Path, offset: i64) -> Result<(), LogError> {
    let path = dir.join(LOG_START_FILE);
    disk.replace_file(&path, offset.to_string().into_bytes(), true).await.map_err(|e| LogError::io(&path, e))
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
    use super::{CleanEnd, InjectedFault};

    #[test]
    fn injected_fault_parses_an_optional_nth_operation() {
        assert_eq!(InjectedFault::parse("sync-eio"), Some((InjectedFault::SyncEio, 1)));
        assert_eq!(InjectedFault::parse("sync-eio@3"), Some((InjectedFault::SyncEio, 3)));
        assert_eq!(InjectedFault::parse("write-eio@1"), Some((InjectedFault::WriteEio, 1)));
        for bad in ["sync-eio@0", "sync-eio@", "sync-eio@x", "read-eio", "sync-eio@-1"] {
            assert_eq!(InjectedFault::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn clean_end_round_trips_and_rejects_damage() {
        let end =
            CleanEnd { base_offset: 1 << 40, size_bytes: 123_456, next_offset: (1 << 40) + 77, max_timestamp: -5 };
        let encoded = end.encode();
        assert_eq!(CleanEnd::decode(&encoded), Some(end));
        for at in [0, 9, 20, encoded.len() - 1] {
            let mut broken = encoded.clone();
            broken[at] ^= 1;
            assert_eq!(CleanEnd::decode(&broken), None, "flipped byte {at}");
        }
        assert_eq!(CleanEnd::decode(&encoded[..encoded.len() - 1]), None);
        assert_eq!(CleanEnd::decode(b""), None);
    }
}
