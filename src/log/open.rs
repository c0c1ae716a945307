//! Opening and closing a `Log` (see `log/mod.rs`): the directory listing,
//! where each segment ends (from the clean mark, or by a recovery scan),
//! the time index and last page read when first needed, and the close that
//! leaves the clean mark for the next open.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::sync::Semaphore;

use crate::constants::BATCH_BYTES_MAX_LIMIT;
use crate::protocol::record_batch;

use super::core_cache;
use super::disk::{Disk, File};
use super::index::{self, OffsetEntry, SegmentIndex, TimeEntry};
use super::read_ahead::ReadAhead;
use super::recovery::{self, ScanStop};
use super::segment::{self, Segment, PAGE_BYTES};
use super::write::WRITES_IN_FLIGHT;
use super::{now_ms, Inner, Log, LogConfig, LogError, RecoveryReport, State, WriteBehind, READ_CHUNK_BYTES};

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
                high_watermark_limit: Cell::new(i64::MAX),
            }),
        };
        Ok((log, report))
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
    pub(super) async fn read_times(&self, base: i64) -> Result<(), LogError> {
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
    pub(super) async fn load_tail(&self) -> Result<(), LogError> {
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

/// Short reads in a row (no whole batch gained) after which a recovery
/// scan gives up with an error rather than guess where the log ends.
const SHORT_READS_MAX: u32 = 8;

/// Finds where a segment's valid batches end, as after a crash: from the
/// last index entry that points at the batch it claims, reads and checks
/// every batch to the end of the file, adding the index entries the crash
/// lost.
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
pub(super) async fn write_log_start(disk: &Disk, dir: &Path, offset: i64) -> Result<(), LogError> {
    let path = dir.join(LOG_START_FILE);
    disk.replace_file(&path, offset.to_string().into_bytes(), true).await.map_err(|e| LogError::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::CleanEnd;

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
