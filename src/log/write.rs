//! The write path of a `Log` (see `log/mod.rs`): `append`, the waits for
//! an append to count as done, and the log's single writer, which copies
//! pending batches into aligned chunks, writes them with O_DIRECT, syncs,
//! and persists the active segment's index. Write-behind hands the log to
//! its core's queue (`write_behind`).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::protocol::record_batch::{self, BatchHeader};

use super::core_cache::{self, CachingLog};
use super::disk::{File, IoBuffer};
use super::index::{OffsetEntry, TimeEntry};
use super::read::evict_cache;
use super::segment::PAGE_BYTES;
use super::write_behind;
use super::{Appended, CachedBatch, FlushPolicy, InjectedFault, Inner, Log, LogError, WriteBehind};

/// Index files are persisted after this much new log data, so that recovery
/// after a crash scans at most about this much.
const INDEX_PERSIST_INTERVAL_BYTES: u64 = 4 << 20;
/// Write-behind (flush `never` or an interval) writes a log's pending data
/// once this much has gathered...
const WRITE_BEHIND_CHUNK_BYTES: usize = 256 << 10;
/// ...or once the first of it has waited this long.
const WRITE_BEHIND_DELAY: Duration = Duration::from_millis(100);
/// A log's writer issues chunks of at most this much...
const WRITE_CHUNK_BYTES: u64 = 1 << 20;
/// ...with up to this many in flight at once.
pub(super) const WRITES_IN_FLIGHT: u64 = 4;

/// A chunk of the active segment, copied and ready to write.
struct WritePlan {
    file: Rc<File>,
    path: PathBuf,
    /// Page-aligned file position of the buffer.
    position: u64,
    buffer: IoBuffer,
    /// File position after the last data byte in the buffer.
    data_end: u64,
    /// Pre-allocate the file to this size first.
    allocate: Option<u64>,
}

struct WriteInFlight {
    task: glommio::task::JoinHandle<std::io::Result<usize>>,
    path: PathBuf,
    data_len: usize,
    data_end: u64,
}

/// A log waiting in its core's write-behind queue. Weak: the queue is a
/// thread-local that outlives the executor, and a log must not be dropped
/// there (its files close through the executor). A log is closed, which
/// writes everything, before its last handle goes.
struct QueuedLog(Weak<Inner>);

impl write_behind::PendingWrite for QueuedLog {
    fn start_write(&self) {
        let Some(inner) = self.0.upgrade() else { return };
        let log = Log { inner };
        glommio::spawn_local(async move {
            let _ = log.write_pending(true).await;
        })
        .detach();
    }

    fn pending_bytes(&self) -> usize {
        self.0.upgrade().map_or(0, |inner| inner.state.borrow().pending_bytes)
    }
}

impl Log {
    /// Assigns offsets to one validated batch and queues it for writing.
    /// The batch is uniquely owned (a slice of the received request), so its
    /// base offset and leader epoch are patched in place, without a copy.
    /// Synchronous: two appends on the same core keep their call order.
    pub fn append(&self, mut batch: BytesMut, header: &BatchHeader) -> Result<Appended, LogError> {
        let limit = self.inner.config.borrow().batch_bytes_max;
        let base_offset = self.check_append(batch.len(), limit, header)?;
        record_batch::patch(&mut batch, base_offset, self.inner.config.borrow().leader_epoch);
        Ok(self.push(batch.freeze(), base_offset, header))
    }

    /// Appends a batch copied from the partition's leader as it is, its
    /// offsets and leader epoch included (a follower's log is the leader's,
    /// byte for byte). It must start at this log's end.
    pub fn append_copied(&self, batch: Bytes, header: &BatchHeader) -> Result<Appended, LogError> {
        // The leader took it under the topic's limit when it was written;
        // a limit lowered since does not apply to it.
        let end = self.check_append(batch.len(), crate::constants::BATCH_BYTES_MAX_LIMIT, header)?;
        if header.base_offset != end {
            return Err(LogError::NotContiguous { expected: end, got: header.base_offset });
        }
        Ok(self.push(batch, end, header))
    }

    /// The offset the next batch gets, once the log can take it.
    fn check_append(&self, len: usize, limit: usize, header: &BatchHeader) -> Result<i64, LogError> {
        let state = self.inner.state.borrow();
        if let Some(cause) = &state.failed {
            return Err(LogError::Failed(cause.to_string()));
        }
        if state.closed {
            return Err(LogError::Closed);
        }
        if len > limit {
            return Err(LogError::BatchTooLarge { size: len, max: limit });
        }
        assert_eq!(len, header.size_bytes);
        Ok(state.log_end_offset)
    }

    fn push(&self, batch: Bytes, base_offset: i64, header: &BatchHeader) -> Appended {
        let mut state = self.inner.state.borrow_mut();
        let last_offset = base_offset + i64::from(header.last_offset_delta);
        state.log_end_offset = last_offset + 1;
        state.pending_bytes += batch.len();
        state.cache_bytes += batch.len();
        let first_cached = state.cache.is_empty().then(|| Rc::downgrade(&self.inner) as Weak<dyn CachingLog>);
        let seq = core_cache::cached(batch.len(), first_cached);
        state.cache.push_back(CachedBatch {
            base_offset,
            last_offset,
            max_timestamp: header.max_timestamp,
            data: batch,
            seq,
        });
        Appended { base_offset, last_offset }
    }

    /// Resolves when the batch ending at `last_offset` is done under the flush
    /// policy: durable for `always`, accepted (written behind) otherwise.
    pub async fn wait_done(&self, last_offset: i64) -> Result<(), LogError> {
        let flush = self.inner.config.borrow().flush;
        if flush == FlushPolicy::Always {
            return self.wait_synced(last_offset).await;
        }
        let too_much_pending = self.inner.state.borrow().pending_bytes > self.inner.config.borrow().pending_bytes_max;
        if too_much_pending {
            self.write_pending(false).await?;
        } else {
            self.schedule_writer();
        }
        self.check_failed()
    }

    /// Waits until everything up to `last_offset` is written and synced; the
    /// first waiter writes for all who queued behind it.
    pub async fn wait_synced(&self, last_offset: i64) -> Result<(), LogError> {
        loop {
            // Durable is durable, even in a log that failed since.
            if self.inner.state.borrow().synced_end_offset > last_offset {
                return Ok(());
            }
            self.check_failed()?;
            let _permit = self.inner.flush_lock.acquire_permit(1).await.map_err(|_| LogError::Closed)?;
            if self.inner.state.borrow().synced_end_offset > last_offset {
                return Ok(());
            }
            self.write_and_sync_locked(true).await?;
        }
    }

    /// Writes all pending data and fdatasyncs it (interval timer, shutdown).
    pub async fn sync(&self) -> Result<(), LogError> {
        let _permit = self.inner.flush_lock.acquire_permit(1).await.map_err(|_| LogError::Closed)?;
        self.write_and_sync_locked(true).await
    }

    /// True when written data awaits an fdatasync.
    pub fn needs_sync(&self) -> bool {
        self.inner.unsynced.get() || self.inner.state.borrow().pending_bytes > 0
    }

    fn check_failed(&self) -> Result<(), LogError> {
        match &self.inner.state.borrow().failed {
            Some(cause) => Err(LogError::Failed(cause.to_string())),
            None => Ok(()),
        }
    }

    /// Write-behind: writes once a chunk is pending, or when the oldest
    /// unwritten batch has waited `WRITE_BEHIND_DELAY` (queued with the
    /// core's other logs, see `write_behind`). Readers are served
    /// from the cache meanwhile, so the delay costs no latency; it turns many
    /// small O_DIRECT writes (each a trip through the kernel's block layer)
    /// into few large ones.
    fn schedule_writer(&self) {
        let urgent = {
            let mut state = self.inner.state.borrow_mut();
            if state.pending_bytes == 0 {
                return;
            }
            let urgent = state.pending_bytes >= WRITE_BEHIND_CHUNK_BYTES;
            let wanted = if urgent { WriteBehind::Urgent } else { WriteBehind::Delayed };
            // A delayed writer is overtaken by an urgent one, never the reverse.
            if state.writer == WriteBehind::Urgent || state.writer == wanted {
                return;
            }
            state.writer = wanted;
            urgent
        };
        if urgent {
            let log = self.clone();
            glommio::spawn_local(async move {
                glommio::yield_if_needed().await;
                let _ = log.write_pending(true).await;
            })
            .detach();
        } else {
            write_behind::schedule(Box::new(QueuedLog(Rc::downgrade(&self.inner))), WRITE_BEHIND_DELAY);
        }
    }

    /// Writes pending data without syncing (write-behind).
    async fn write_pending(&self, from_writer_task: bool) -> Result<(), LogError> {
        let permit = self.inner.flush_lock.acquire_permit(1).await.map_err(|_| LogError::Closed);
        if from_writer_task {
            self.inner.state.borrow_mut().writer = WriteBehind::Idle;
        }
        let _permit = permit?;
        self.write_and_sync_locked(false).await
    }

    /// The writer: rolls when due and writes every pending batch, then
    /// optionally fdatasyncs. Caller holds `flush_lock`.
    pub(super) async fn write_and_sync_locked(&self, sync: bool) -> Result<(), LogError> {
        self.check_failed()?;
        let result = self.write_all_locked().await;
        let result = match result {
            Ok(()) if sync => self.sync_locked().await,
            other => other,
        };
        if let Err(err) = &result {
            self.fail(err);
        }
        result
    }

    async fn write_all_locked(&self) -> Result<(), LogError> {
        // A writer dropped mid-way may have left writes in flight; the next
        // writes cover the same pages, so wait for those first.
        drop(self.inner.writes.acquire_permit(WRITES_IN_FLIGHT).await.map_err(|_| LogError::Closed)?);
        while self.inner.state.borrow().pending_bytes > 0 {
            self.roll_if_due().await?;
            self.write_segment_locked().await?;
        }
        Ok(())
    }

    /// Writes the pending data that fits in the active segment as a pipeline
    /// of aligned chunks, up to `WRITES_IN_FLIGHT` at once, so the device is
    /// never idle while the next chunk is copied. Two writes in flight never
    /// share a page: a chunk followed by more data ends on a page boundary
    /// (possibly inside a batch), and a chunk that must rewrite the partly
    /// filled page of the one before waits for it. Batches count as written
    /// once the writes holding all their bytes complete, in order.
    async fn write_segment_locked(&self) -> Result<(), LogError> {
        self.load_tail().await?;
        let mut in_flight: VecDeque<WriteInFlight> = VecDeque::new();
        let result = self.write_segment_pipeline(&mut in_flight).await;
        if result.is_err() {
            // No write of a failed pass may land after it returns: the
            // log is reopened from the file (after a full disk) and its
            // recovery and new appends must not race a write still in
            // flight. Their data was never acknowledged.
            for write in in_flight.drain(..) {
                let _ = write.task.await;
            }
        }
        result
    }

    async fn write_segment_pipeline(&self, in_flight: &mut VecDeque<WriteInFlight>) -> Result<(), LogError> {
        let mut issued_end = {
            let state = self.inner.state.borrow();
            state.segments.values().next_back().expect("a log always has an active segment").size_bytes
        };
        loop {
            // A partly filled page is rewritten by the next chunk: every
            // write before it completes first, so the segment's tail is that
            // page's data.
            let partial_page = issued_end % PAGE_BYTES != 0;
            let must_drain = partial_page || in_flight.len() as u64 >= WRITES_IN_FLIGHT;
            while must_drain && !in_flight.is_empty() {
                self.complete_write(in_flight).await?;
                if !partial_page && (in_flight.len() as u64) < WRITES_IN_FLIGHT {
                    break;
                }
            }
            let Some(plan) = self.plan_write(issued_end) else { break };
            if let Some(target) = plan.allocate {
                // The file's size grows with the allocation (no KEEP_SIZE): a
                // write inside the size is not an extending write, so ext4
                // takes it inline under IOCB_NOWAIT instead of punting it to
                // io-wq worker threads (fio, 16 KiB O_DIRECT writes: 35% less
                // kernel CPU). Recovery stops at the zeros past the data and
                // trims them; close and roll trim to the exact size.
                plan.file.pre_allocate(target).await.map_err(|e| LogError::io(&plan.path, e))?;
                self.active_mut(|active| active.allocated_bytes = active.allocated_bytes.max(target));
            }
            self.injected(InjectedFault::WriteEio, &plan.path)?;
            let permit = self.inner.writes.clone().acquire_static_permit(1).await.map_err(|_| LogError::Closed)?;
            let WritePlan { file, path, position, buffer, data_end, .. } = plan;
            let task = glommio::spawn_local(async move {
                let _permit = permit;
                file.write_at(buffer, position).await
            })
            .detach();
            in_flight.push_back(WriteInFlight { task, path, data_len: (data_end - position) as usize, data_end });
            issued_end = data_end;
        }
        while !in_flight.is_empty() {
            self.complete_write(in_flight).await?;
        }
        Ok(())
    }

    /// The next chunk to write from `issued_end`, or None when every pending
    /// byte that fits in the active segment is issued. A chunk starting in a
    /// partly filled page is planned once the writes before it completed:
    /// that page's data is then the active segment's tail.
    fn plan_write(&self, issued_end: u64) -> Option<WritePlan> {
        let config = self.inner.config.borrow();
        let state = self.inner.state.borrow();
        let active = state.segments.values().next_back()?;
        let first_pending = state.cache.partition_point(|b| b.base_offset < state.written_end_offset);
        // Where the eligible data ends: whole batches that fit in the segment
        // (at least one in an empty segment), plus any batch already begun.
        let mut position = active.size_bytes;
        let mut available_end = position;
        for b in state.cache.range(first_pending..) {
            let end = position + b.data.len() as u64;
            let begun = position < issued_end;
            if !begun && position > 0 && end > config.segment_bytes {
                break;
            }
            available_end = end;
            position = end;
        }
        if available_end <= issued_end {
            return None;
        }
        let start = issued_end - issued_end % PAGE_BYTES;
        // `write_segment_locked` loaded the tail before planning.
        let head: &[u8] = if start < issued_end { active.tail.as_deref()? } else { &[] };
        debug_assert!(start == issued_end || active.size_bytes == issued_end);
        debug_assert_eq!(head.len() as u64, issued_end - start);
        let data_end = if available_end - issued_end > WRITE_CHUNK_BYTES {
            let end = (issued_end + WRITE_CHUNK_BYTES) / PAGE_BYTES * PAGE_BYTES;
            debug_assert!(end > issued_end);
            end
        } else {
            available_end
        };
        let buffer_len = (data_end - start).next_multiple_of(PAGE_BYTES);
        let allocate = active.preallocation_for(start + buffer_len, config.segment_bytes);
        let mut buffer = active.file.alloc_buffer(buffer_len as usize);
        let bytes = buffer.as_bytes_mut();
        bytes[..head.len()].copy_from_slice(head);
        let mut position = active.size_bytes;
        for b in state.cache.range(first_pending..) {
            let end = position + b.data.len() as u64;
            if position >= data_end {
                break;
            }
            if end > issued_end {
                let from = issued_end.saturating_sub(position) as usize;
                let to = (data_end.min(end) - position) as usize;
                let at = (position + from as u64 - start) as usize;
                bytes[at..at + to - from].copy_from_slice(&b.data[from..to]);
            }
            position = end;
        }
        let data_len = (data_end - start) as usize;
        bytes[data_len..].fill(0);
        Some(WritePlan {
            file: active.file.clone(),
            path: active.log_path.clone(),
            position: start,
            buffer,
            data_end,
            allocate,
        })
    }

    /// Waits for the oldest write in flight and accounts every batch it
    /// completed: index entries, the written end, the partly filled page.
    async fn complete_write(&self, in_flight: &mut VecDeque<WriteInFlight>) -> Result<(), LogError> {
        let Some(write) = in_flight.pop_front() else { return Ok(()) };
        let written = match write.task.await {
            Some(result) => result.map_err(|e| LogError::io(&write.path, e))?,
            None => return Err(LogError::io(&write.path, std::io::Error::other("write cancelled"))),
        };
        if written < write.data_len {
            return Err(LogError::Io {
                path: write.path.display().to_string(),
                message: "short write".into(),
                enospc: false,
            });
        }
        self.inner.unsynced.set(true);
        let index_interval = self.inner.config.borrow().index_interval_bytes;
        let mut guard = self.inner.state.borrow_mut();
        let state = &mut *guard;
        let first_pending = state.cache.partition_point(|b| b.base_offset < state.written_end_offset);
        let active = state.segments.values_mut().next_back().expect("a log always has an active segment");
        let mut position = active.size_bytes;
        let mut completed = 0;
        for b in state.cache.range(first_pending..) {
            if position + b.data.len() as u64 > write.data_end {
                break;
            }
            if active.bytes_since_index >= index_interval && position > 0 {
                active.index.push(
                    OffsetEntry {
                        relative_offset: (b.base_offset - active.base_offset) as u32,
                        position: position as u32,
                    },
                    TimeEntry {
                        max_timestamp: active.max_timestamp,
                        relative_offset: (b.base_offset - active.base_offset) as u32,
                    },
                );
                active.bytes_since_index = 0;
            }
            active.bytes_since_index += b.data.len() as u64;
            active.max_timestamp = active.max_timestamp.max(b.max_timestamp);
            position += b.data.len() as u64;
            active.next_offset = b.last_offset + 1;
            completed += 1;
        }
        if completed == 0 {
            return Ok(());
        }
        let written_bytes = position - active.size_bytes;
        let tail_len = (position % PAGE_BYTES) as usize;
        let tail = active.tail.get_or_insert_with(Vec::new);
        let joined_len = tail.len() + written_bytes as usize;
        let written = state.cache.range(first_pending..first_pending + completed).map(|b| &b.data[..]);
        keep_tail(tail, written, joined_len - tail_len);
        active.size_bytes = position;
        state.written_end_offset = active.next_offset;
        state.pending_bytes -= written_bytes as usize;
        state.bytes_since_index_persist += written_bytes;
        evict_cache(state, self.inner.config.borrow().cache_bytes_max);
        drop(guard);
        core_cache::evict_over_budget();
        Ok(())
    }

    async fn sync_locked(&self) -> Result<(), LogError> {
        let (file, path, written_end) = {
            let state = self.inner.state.borrow();
            let active = state.segments.values().next_back().expect("a log always has an active segment");
            (active.file.clone(), active.log_path.clone(), state.written_end_offset)
        };
        if self.inner.unsynced.get() {
            let started = std::time::Instant::now();
            self.injected(InjectedFault::SyncEio, &path)?;
            file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
            crate::metrics::record_fsync(started.elapsed());
            self.inner.unsynced.set(false);
        }
        {
            let mut state = self.inner.state.borrow_mut();
            state.synced_end_offset = state.synced_end_offset.max(written_end);
        }
        let persist_due = self.inner.state.borrow().bytes_since_index_persist >= INDEX_PERSIST_INTERVAL_BYTES;
        if persist_due {
            self.persist_active_index().await?;
        }
        Ok(())
    }

    pub(super) async fn persist_active_index(&self) -> Result<(), LogError> {
        let unread_times = {
            let mut state = self.inner.state.borrow_mut();
            state.bytes_since_index_persist = 0;
            let Some((_, active)) = state.segments.iter().next_back() else { return Ok(()) };
            // Entries are only ever added (recovery, which cuts them, leaves
            // the count unknown): the same count is the same content. A
            // clean shutdown of partitions written nothing since they opened
            // writes no index.
            if active.index_entries_persisted == Some(active.index.offsets.len()) {
                return Ok(());
            }
            (!active.index.times_read()).then_some(active.base_offset)
        };
        if let Some(base) = unread_times {
            self.read_times(base).await?;
        }
        // Persist a copy so no RefCell borrow is held across the awaits.
        let (path_index, path_time, offsets, times, entries) = {
            let state = self.inner.state.borrow();
            let Some((_, active)) = state.segments.iter().next_back() else { return Ok(()) };
            (
                active.index_path("index"),
                active.index_path("timeindex"),
                active.index.encode_offsets(),
                active.index.encode_times(),
                active.index.offsets.len(),
            )
        };
        let disk = &self.inner.disk;
        disk.write_whole(&path_index, &offsets).await.map_err(|e| LogError::io(&path_index, e))?;
        disk.write_whole(&path_time, &times).await.map_err(|e| LogError::io(&path_time, e))?;
        self.active_mut(|active| active.index_entries_persisted = Some(entries));
        Ok(())
    }

    fn fail(&self, err: &LogError) {
        let mut state = self.inner.state.borrow_mut();
        if state.failed.is_none() {
            tracing::error!(dir = %self.inner.dir.display(), error = %err, "log stopped accepting appends");
            state.failed = Some(err.clone());
        }
    }
}

/// Keeps the bytes of (`tail` ++ `written`) from `from` on in `tail`, in
/// place: the new partly filled page, without an allocation per write.
fn keep_tail<'a>(tail: &mut Vec<u8>, written: impl Iterator<Item = &'a [u8]>, from: usize) {
    let mut at = tail.len();
    if from >= at {
        tail.clear();
    } else {
        tail.drain(..from);
    }
    for piece in written {
        let end = at + piece.len();
        if end > from {
            tail.extend_from_slice(&piece[from.saturating_sub(at)..]);
        }
        at = end;
    }
}

#[cfg(test)]
mod tests {
    use super::keep_tail;

    fn kept(tail: &[u8], written: &[&[u8]], from: usize) -> Vec<u8> {
        let mut tail = tail.to_vec();
        keep_tail(&mut tail, written.iter().copied(), from);
        tail
    }

    #[test]
    fn keep_tail_keeps_the_joined_bytes_from_the_cut_on() {
        // The cut inside the old tail: its rest, then everything written.
        assert_eq!(kept(b"abcd", &[b"ef", b"gh"], 2), b"cdefgh");
        // The cut inside a written piece.
        assert_eq!(kept(b"abcd", &[b"ef", b"ghij"], 7), b"hij");
        // The cut at a piece boundary, and at the very end (page filled).
        assert_eq!(kept(b"ab", &[b"cd", b"ef"], 4), b"ef");
        assert_eq!(kept(b"ab", &[b"cd"], 4), b"");
        // No old tail.
        assert_eq!(kept(b"", &[b"abc", b"def"], 1), b"bcdef");
    }

    #[test]
    fn keep_tail_reuses_the_buffer() {
        let mut tail = Vec::with_capacity(16);
        tail.extend_from_slice(b"0123");
        let before = tail.as_ptr();
        keep_tail(&mut tail, [&b"4567"[..], b"89"].into_iter(), 6);
        assert_eq!(tail, b"6789");
        assert_eq!(tail.as_ptr(), before);
    }
}
