//! Truncation of a log's suffix: what a follower does when its log holds
//! batches its leader never had (written by an old leader that lost its
//! place before they were committed), found by the leader-epoch exchange
//! (`replica::epochs`). Rare (after a leader change, and only when the
//! logs diverged), so it is done the simple way: close the log, cut the
//! files, and let the caller reopen it, whose recovery scan finds the new
//! end and drops index entries past it.

use std::ops::Bound;
use std::path::PathBuf;

use crate::constants::BATCH_BYTES_MAX_LIMIT;
use crate::protocol::record_batch::{BatchHeader, HEADER_BYTES};

use super::segment::PAGE_BYTES;
use super::{Log, LogError};

impl Log {
    /// Removes every batch from the one that holds `offset` on, and closes
    /// the log (unmarked, so the next open scans the cut segment). Returns
    /// where the log now ends: `offset`, or less when `offset` fell inside
    /// a batch. Nothing at or below the log start offset is cut.
    pub async fn truncate_and_close(&self, offset: i64) -> Result<i64, LogError> {
        self.close_unmarked().await?;
        let offset = offset.max(self.log_start_offset());
        let (cut, later) = {
            let state = self.inner.state.borrow();
            let cut = state.segments.range(..=offset).next_back().or_else(|| state.segments.iter().next()).map(
                |(_, segment)| {
                    let relative = (offset - segment.base_offset).clamp(0, i64::from(u32::MAX)) as u32;
                    (
                        segment.base_offset,
                        segment.file.clone(),
                        segment.log_path.clone(),
                        u64::from(segment.index.position_for(relative)),
                        segment.size_bytes,
                        segment.next_offset,
                    )
                },
            );
            let later: Vec<PathBuf> = match &cut {
                Some((base, ..)) => state
                    .segments
                    .range((Bound::Excluded(*base), Bound::Unbounded))
                    .map(|(_, segment)| segment.log_path.clone())
                    .collect(),
                None => Vec::new(),
            };
            (cut, later)
        };
        let Some((base, file, path, mut position, size, segment_end)) = cut else { return Ok(offset) };
        let disk = &self.inner.disk;
        for log_path in later.iter().rev() {
            for extension in ["timeindex", "index"] {
                let index = log_path.with_extension(extension);
                disk.remove_if_present(&index).await.map_err(|e| LogError::io(&index, e))?;
            }
            disk.remove_if_present(log_path).await.map_err(|e| LogError::io(log_path, e))?;
        }
        let mut end = None;
        while position < size {
            // Aligned reads only: glommio sizes a short unaligned read as whole.
            let aligned = position - position % PAGE_BYTES;
            let skip = (position - aligned) as usize;
            let read = file.read_at(aligned, skip + HEADER_BYTES).await.map_err(|e| LogError::io(&path, e))?;
            let header = read
                .get(skip..)
                .ok_or_else(|| LogError::Corrupt { path: path.display().to_string(), reason: "short read".into() })
                .and_then(|bytes| {
                    BatchHeader::parse(bytes, BATCH_BYTES_MAX_LIMIT)
                        .map_err(|e| LogError::Corrupt { path: path.display().to_string(), reason: e.to_string() })
                })?;
            if header.last_offset() >= offset {
                end = Some(header.base_offset);
                break;
            }
            position += header.size_bytes as u64;
        }
        let end = end.unwrap_or(segment_end).max(base);
        let position = position.min(size);
        file.truncate(position).await.map_err(|e| LogError::io(&path, e))?;
        file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
        disk.sync_dir(&self.inner.dir).await.map_err(|e| LogError::io(&self.inner.dir, e))?;
        tracing::info!(dir = %self.inner.dir.display(), offset, end, "log truncated");
        Ok(end.max(self.log_start_offset()))
    }

    /// Removes every batch and closes the log so that it reopens empty,
    /// starting at `offset`: what a follower does when its whole log lies
    /// below its leader's log start (retention, DeleteRecords, compaction
    /// moved past it while it was away), as Kafka's
    /// `truncateFullyAndStartAt`. A crash halfway reopens a log that still
    /// ends below the leader's log start, and the follower empties it again.
    pub async fn empty_and_close(&self, offset: i64) -> Result<(), LogError> {
        self.close_unmarked().await?;
        let disk = &self.inner.disk;
        super::open::write_log_start(disk, &self.inner.dir, offset).await?;
        let segments: Vec<PathBuf> = self.inner.state.borrow().segments.values().map(|s| s.log_path.clone()).collect();
        for log_path in segments.iter().rev() {
            for extension in ["timeindex", "index"] {
                let index = log_path.with_extension(extension);
                disk.remove_if_present(&index).await.map_err(|e| LogError::io(&index, e))?;
            }
            disk.remove_if_present(log_path).await.map_err(|e| LogError::io(log_path, e))?;
        }
        disk.sync_dir(&self.inner.dir).await.map_err(|e| LogError::io(&self.inner.dir, e))?;
        tracing::info!(dir = %self.inner.dir.display(), offset, "log emptied to start at the leader's log start");
        Ok(())
    }
}
