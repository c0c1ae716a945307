//! Rolls and retention of a `Log` (see `log/mod.rs`): DeleteRecords, the
//! retention pass, and the roll to a new segment, which writes over the
//! oldest segment's file when retention would delete that segment anyway.

use std::path::Path;
use std::rc::Rc;

use super::open::write_log_start;
use super::segment::Segment;
use super::{now_ms, Log, LogError};

impl Log {
    /// Moves the log start offset forward (DeleteRecords); returns the new
    /// low watermark. Whole segments below it are deleted.
    pub async fn delete_records(&self, offset: i64) -> Result<i64, LogError> {
        let high_watermark = self.high_watermark();
        let target = if offset < 0 { high_watermark } else { offset };
        let log_start = self.log_start_offset();
        if target > high_watermark {
            return Err(LogError::OffsetOutOfRange { offset, log_start, high_watermark });
        }
        if target > log_start {
            // One writer of the log-start file at a time (retention writes
            // it under the same lock).
            let _permit = self.inner.flush_lock.acquire_permit(1).await.map_err(|_| LogError::Closed)?;
            let start = {
                let mut state = self.inner.state.borrow_mut();
                state.log_start_offset = state.log_start_offset.max(target);
                state.log_start_offset
            };
            write_log_start(&self.inner.disk, &self.inner.dir, start).await?;
        }
        self.enforce_retention(now_ms()).await?;
        Ok(self.log_start_offset())
    }

    /// Deletes whole segments that are past retention (time or size) or wholly
    /// below the log start offset. The active segment is never deleted.
    pub async fn enforce_retention(&self, now_ms: u64) -> Result<usize, LogError> {
        if self.segment_count() <= 1 {
            // The active segment is never deleted: nothing to wait for.
            return Ok(0);
        }
        let _permit = self.inner.flush_lock.acquire_permit(1).await.map_err(|_| LogError::Closed)?;
        let doomed = self.take_expired(now_ms, usize::MAX);
        if doomed.is_empty() {
            return Ok(0);
        }
        write_log_start(&self.inner.disk, &self.inner.dir, self.log_start_offset()).await?;
        // Unlinking a large file frees its extents: glommio does it on its
        // blocking-call threads, not on this core's reactor.
        for segment in &doomed {
            for path in [segment.log_path.clone(), segment.index_path("index"), segment.index_path("timeindex")] {
                self.remove_if_present(&path).await?;
            }
        }
        tracing::info!(dir = %self.inner.dir.display(), segments = doomed.len(), "retention deleted segments");
        Ok(doomed.len())
    }

    /// Takes out of the log, oldest first, up to `most` segments past
    /// retention (time or size) or wholly below the log start offset, and
    /// moves the log start past them. Never the active segment.
    fn take_expired(&self, now_ms: u64, most: usize) -> Vec<Segment> {
        let config = self.inner.config.borrow();
        let mut state = self.inner.state.borrow_mut();
        let mut total: u64 = state.segments.values().map(|s| s.size_bytes).sum();
        let mut doomed = Vec::new();
        while state.segments.len() > 1 && doomed.len() < most {
            let Some((_, oldest)) = state.segments.iter().next() else { break };
            let next_base = oldest.next_offset;
            let expired_by_time = config.retention_ms >= 0
                && oldest.max_timestamp != i64::MIN
                && oldest.max_timestamp < now_ms as i64 - config.retention_ms;
            let expired_by_size =
                config.retention_bytes >= 0 && total.saturating_sub(oldest.size_bytes) >= config.retention_bytes as u64;
            let below_start = next_base <= state.log_start_offset;
            if !(expired_by_time || expired_by_size || below_start) {
                break;
            }
            let Some((_, segment)) = state.segments.pop_first() else { break };
            total -= segment.size_bytes;
            state.log_start_offset = state.log_start_offset.max(next_base);
            doomed.push(segment);
        }
        doomed
    }

    /// The next active segment, at `base`. When the oldest segment is
    /// past retention, which would delete it anyway, the new segment is
    /// written over its file (`Segment::reuse`) instead of a new file, and
    /// it leaves the log now rather than at the next retention pass. The
    /// file must be this log's own: every batch in it has an offset below
    /// all the log will write, which is what lets a crash scan tell old
    /// data from new. One still open elsewhere (a read in flight must go on
    /// reading the old data) is deleted as retention would. The log-start
    /// file is left as it is: after a crash the open moves the log start up
    /// to the first segment. Caller holds `flush_lock`.
    async fn new_segment(&self, base: i64) -> Result<Segment, LogError> {
        let now = now_ms();
        let recycle = self.inner.config.borrow().recycle_segments;
        if let Some(oldest) = recycle.then(|| self.take_expired(now, 1).pop()).flatten() {
            for path in [oldest.index_path("index"), oldest.index_path("timeindex")] {
                self.remove_if_present(&path).await?;
            }
            let old_path = oldest.log_path.clone();
            if let Ok(file) = Rc::try_unwrap(oldest.file) {
                let _ = file.close().await;
                match Segment::reuse(&self.inner.disk, &self.inner.dir, &old_path, base, now).await {
                    Ok(segment) => return Ok(segment),
                    Err(e) => {
                        tracing::warn!(segment = %old_path.display(), error = %e, "cannot write the new segment over an expired one; creating a new file");
                    }
                }
            }
            self.remove_if_present(&old_path).await?;
        }
        Segment::create(&self.inner.disk, &self.inner.dir, base, now).await
    }

    async fn remove_if_present(&self, path: &Path) -> Result<(), LogError> {
        self.inner.disk.remove_if_present(path).await.map_err(|e| LogError::io(path, e))
    }

    /// Starts a new segment when the active one is full or old enough. The
    /// old segment is trimmed to its exact size, synced and indexed first, so
    /// every segment but the last is whole after a crash.
    pub(super) async fn roll_if_due(&self) -> Result<(), LogError> {
        let (due, next_base) = {
            let config = self.inner.config.borrow();
            let state = self.inner.state.borrow();
            let active = state.segments.values().next_back().expect("a log always has an active segment");
            let first_pending = state.cache.partition_point(|b| b.base_offset < state.written_end_offset);
            let next_len = state.cache.get(first_pending).map_or(0, |b| b.data.len() as u64);
            let full = active.size_bytes > 0 && active.size_bytes + next_len > config.segment_bytes;
            let old = active.size_bytes > 0 && now_ms().saturating_sub(active.created_ms) >= config.segment_ms;
            (full || old, active.next_offset)
        };
        if !due {
            return Ok(());
        }
        let (file, size, path) = {
            let state = self.inner.state.borrow();
            let active = state.segments.values().next_back().expect("a log always has an active segment");
            (active.file.clone(), active.size_bytes, active.log_path.clone())
        };
        file.truncate(size).await.map_err(|e| LogError::io(&path, e))?;
        file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
        self.inner.unsynced.set(false);
        self.persist_active_index().await?;
        let segment = self.new_segment(next_base).await?;
        let recycled = segment.allocated_bytes > 0;
        let mut state = self.inner.state.borrow_mut();
        state.synced_end_offset = state.synced_end_offset.max(state.written_end_offset);
        if let Some((_, old)) = state.segments.iter_mut().next_back() {
            old.tail = Some(Vec::new());
        }
        state.segments.insert(next_base, segment);
        tracing::info!(dir = %self.inner.dir.display(), base_offset = next_base, recycled, "rolled segment");
        Ok(())
    }
}
