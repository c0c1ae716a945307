//! The read path of a `Log` (see `log/mod.rs`): batches from the tail
//! cache, the read-ahead or the segment files, the offset for a timestamp,
//! and the eviction of written batches from the tail cache.

use std::rc::Rc;

use bytes::Bytes;

use crate::constants::BATCH_BYTES_MAX_LIMIT;
use crate::protocol::record_batch::{self, BatchHeader};

use super::core_cache::{self, CachingLog};
use super::read_ahead;
use super::{Inner, Log, LogError, ReadOutput, State, READ_CHUNK_BYTES};

/// How far a read may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Visible {
    /// Consumers: the high watermark.
    HighWatermark,
    /// Followers: the leader's own end (`Log::local_end_offset`).
    LocalEnd,
}

impl Log {
    fn visible_end(&self, visible: Visible) -> i64 {
        match visible {
            Visible::HighWatermark => self.high_watermark(),
            Visible::LocalEnd => self.local_end_offset(),
        }
    }

    /// Reads whole batches from `offset`, up to `max_bytes` (at least one
    /// batch when any is available), never past the high-water mark.
    pub async fn read(&self, offset: i64, max_bytes: usize) -> Result<ReadOutput, LogError> {
        self.read_to(offset, max_bytes, Visible::HighWatermark).await
    }

    /// `read` for a follower of this (leader's) log: up to the leader's own
    /// end, past the high watermark, which the follower's fetch moves.
    pub async fn read_for_replica(&self, offset: i64, max_bytes: usize) -> Result<ReadOutput, LogError> {
        self.read_to(offset, max_bytes, Visible::LocalEnd).await
    }

    async fn read_to(&self, offset: i64, max_bytes: usize, visible: Visible) -> Result<ReadOutput, LogError> {
        loop {
            if let Some(done) = self.read_now_to(offset, max_bytes, visible) {
                return done;
            }
            // The read-ahead in flight is reading exactly this: wait for it.
            let wait = {
                let read_ahead = self.inner.read_ahead.borrow();
                read_ahead.in_flight_at(offset).then(|| read_ahead.done.listen())
            };
            match wait {
                Some(listener) => listener.await,
                None => break,
            }
        }
        let end = self.visible_end(visible);
        let high_watermark = self.high_watermark();
        let log_start_offset = self.log_start_offset();
        let batches = self.read_disk(offset, max_bytes, end).await?;
        if let Some(last) = batches.last() {
            let next = BatchHeader::parse(last, usize::MAX)?.last_offset() + 1;
            self.start_read_ahead(next, max_bytes);
        }
        Ok(ReadOutput { batches, high_watermark, log_start_offset })
    }

    /// `read` without waiting: the answer when it needs no disk read (an
    /// offset out of range, nothing new, or batches in the tail cache),
    /// None otherwise.
    pub fn read_now(&self, offset: i64, max_bytes: usize) -> Option<Result<ReadOutput, LogError>> {
        self.read_now_to(offset, max_bytes, Visible::HighWatermark)
    }

    /// An offset up to the log's end is in range (Kafka's rule): a new
    /// leader's high watermark may trail what a consumer read from the old
    /// one until its followers fetch, and a read there finds nothing yet.
    fn read_now_to(&self, offset: i64, max_bytes: usize, visible: Visible) -> Option<Result<ReadOutput, LogError>> {
        let end = self.visible_end(visible);
        let high_watermark = self.high_watermark();
        let log_start_offset = self.log_start_offset();
        if offset < log_start_offset || offset > self.log_end_offset().max(high_watermark) {
            return Some(Err(LogError::OffsetOutOfRange { offset, log_start: log_start_offset, high_watermark }));
        }
        let mut out = ReadOutput { batches: Vec::new(), high_watermark, log_start_offset };
        if offset >= end {
            return Some(Ok(out));
        }
        out.batches = match self.read_cache(offset, max_bytes, end) {
            Some(batches) => batches,
            None => {
                let taken = self.inner.read_ahead.borrow_mut().take(offset, max_bytes, end)?;
                if let Some(next) = taken.read_next {
                    self.start_read_ahead(next, max_bytes);
                }
                taken.batches
            }
        };
        Some(Ok(out))
    }

    /// Starts reading, in the background, the batches from `start` that
    /// only the disk holds (`read_ahead`): about as much as a read of
    /// `max_bytes` just took.
    fn start_read_ahead(&self, start: i64, max_bytes: usize) {
        let high_watermark = self.local_end_offset();
        {
            let state = self.inner.state.borrow();
            let cached = state.cache.front().is_some_and(|b| b.base_offset <= start);
            if state.closed || start >= high_watermark || cached {
                return;
            }
        }
        let bytes = read_ahead::chunk_bytes(max_bytes);
        let Some(charge) = self.inner.read_ahead.borrow_mut().begin(start, bytes) else { return };
        let log = Rc::downgrade(&self.inner);
        glommio::spawn_local(async move {
            let Some(inner) = log.upgrade() else { return };
            let reader = Log { inner };
            let read = reader.read_disk(start, bytes, high_watermark).await.unwrap_or_default();
            let kept = reader.inner.read_ahead.borrow_mut().finish(start, read, charge);
            drop(reader);
            if let Some(id) = kept {
                glommio::timer::sleep(read_ahead::READ_AHEAD_TTL).await;
                if let Some(inner) = log.upgrade() {
                    inner.read_ahead.borrow_mut().expire(id);
                }
            }
        })
        .detach();
    }

    /// The first offset whose record timestamp is at or after `timestamp`,
    /// with that timestamp; None when every record is older.
    pub async fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<(i64, i64)>, LogError> {
        let mut offset = loop {
            let unread = {
                let state = self.inner.state.borrow();
                let candidate = state.segments.values().find(|s| s.max_timestamp >= timestamp);
                match candidate {
                    Some(segment) if !segment.index.times_read() => segment.base_offset,
                    Some(segment) => {
                        let relative = segment.index.scan_start_for_time(timestamp);
                        break (segment.base_offset + i64::from(relative)).max(state.log_start_offset);
                    }
                    // Not on disk yet: only the unwritten tail can hold it.
                    None => break state.written_end_offset.max(state.log_start_offset),
                }
            };
            self.read_times(unread).await?;
        };
        let high_watermark = self.high_watermark();
        while offset < high_watermark {
            let read = self.read(offset, READ_CHUNK_BYTES as usize).await?;
            for batch in &read.batches {
                let header = BatchHeader::parse(batch, usize::MAX)?;
                if header.last_offset() < offset || header.max_timestamp < timestamp {
                    continue;
                }
                let found = first_record_at_or_after(batch, &header, timestamp);
                if found.0 >= offset {
                    return Ok(Some(found));
                }
            }
            match read.batches.last() {
                Some(last) => offset = BatchHeader::parse(last, usize::MAX)?.last_offset() + 1,
                None => break,
            }
        }
        Ok(None)
    }

    fn read_cache(&self, offset: i64, max_bytes: usize, high_watermark: i64) -> Option<Vec<Bytes>> {
        let state = self.inner.state.borrow();
        let first = state.cache.front()?;
        if first.base_offset > offset {
            return None;
        }
        let start = state.cache.partition_point(|b| b.last_offset < offset);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for batch in state.cache.range(start..) {
            if batch.base_offset >= high_watermark || (!out.is_empty() && bytes + batch.data.len() > max_bytes) {
                break;
            }
            bytes += batch.data.len();
            out.push(batch.data.clone());
        }
        Some(out)
    }

    async fn read_disk(&self, mut offset: i64, max_bytes: usize, high_watermark: i64) -> Result<Vec<Bytes>, LogError> {
        // Stored batches may be larger than the topic's current limit.
        let batch_bytes_max = BATCH_BYTES_MAX_LIMIT;
        let mut out: Vec<Bytes> = Vec::new();
        let mut bytes = 0usize;
        loop {
            let located = {
                let state = self.inner.state.borrow();
                state.segments.range(..=offset).next_back().map(|(_, s)| {
                    let relative = (offset - s.base_offset).clamp(0, i64::from(u32::MAX)) as u32;
                    (
                        s.file.clone(),
                        s.log_path.clone(),
                        u64::from(s.index.position_for(relative)),
                        s.size_bytes,
                        s.next_offset,
                    )
                })
            };
            let Some((file, path, mut position, segment_size, segment_end)) = located else { break };
            while position < segment_size {
                let want = ((max_bytes.saturating_sub(bytes)).max(64 << 10) as u64)
                    .min(READ_CHUNK_BYTES.max(max_bytes as u64));
                let len = want.min(segment_size - position) as usize;
                let chunk = file.read_at(position, len).await.map_err(|e| LogError::io(&path, e))?;
                let mut at = 0usize;
                let mut progressed = false;
                while at + record_batch::HEADER_BYTES <= chunk.len() {
                    let header = BatchHeader::parse(&chunk[at..], batch_bytes_max)
                        .map_err(|e| LogError::Corrupt { path: path.display().to_string(), reason: e.to_string() })?;
                    if at + header.size_bytes > chunk.len() {
                        if at == 0 {
                            // One batch larger than the chunk: read exactly it.
                            let whole =
                                file.read_at(position, header.size_bytes).await.map_err(|e| LogError::io(&path, e))?;
                            if whole.len() < header.size_bytes {
                                return Err(LogError::Corrupt {
                                    path: path.display().to_string(),
                                    reason: "short batch".into(),
                                });
                            }
                            if header.last_offset() >= offset && header.base_offset < high_watermark {
                                out.push(Bytes::copy_from_slice(&whole[..header.size_bytes]));
                                return Ok(out);
                            }
                            at = header.size_bytes;
                            progressed = true;
                        }
                        break;
                    }
                    progressed = true;
                    if header.base_offset >= high_watermark {
                        return Ok(out);
                    }
                    if header.last_offset() >= offset {
                        if !out.is_empty() && bytes + header.size_bytes > max_bytes {
                            return Ok(out);
                        }
                        bytes += header.size_bytes;
                        out.push(Bytes::copy_from_slice(&chunk[at..at + header.size_bytes]));
                        offset = header.last_offset() + 1;
                    }
                    at += header.size_bytes;
                }
                if !progressed {
                    return Err(LogError::Corrupt {
                        path: path.display().to_string(),
                        reason: "truncated batch".into(),
                    });
                }
                position += at as u64;
                if bytes >= max_bytes {
                    return Ok(out);
                }
            }
            // Continue into the next segment, or into the unwritten tail.
            offset = offset.max(segment_end);
            if offset >= high_watermark || bytes >= max_bytes {
                break;
            }
            let has_next = self.inner.state.borrow().segments.range(segment_end..).next().is_some();
            if !has_next {
                if let Some(more) = self.read_cache(offset, max_bytes.saturating_sub(bytes), high_watermark) {
                    for batch in more {
                        if !out.is_empty() && bytes + batch.len() > max_bytes {
                            break;
                        }
                        bytes += batch.len();
                        out.push(batch);
                    }
                }
                break;
            }
            glommio::yield_if_needed().await;
        }
        Ok(out)
    }
}

/// Drops written batches, oldest first, until the log caches at most
/// `cache_bytes_max`.
pub(super) fn evict_cache(state: &mut State, cache_bytes_max: usize) {
    while state.cache_bytes > cache_bytes_max && evict_oldest_written(state) {}
}

/// Drops the oldest cached batch if it is written.
fn evict_oldest_written(state: &mut State) -> bool {
    match state.cache.front() {
        Some(front) if front.last_offset < state.written_end_offset => {}
        _ => return false,
    }
    let front = state.cache.pop_front().expect("checked above");
    state.cache_bytes -= front.data.len();
    core_cache::evicted(front.seq, front.data.len(), state.cache.front().map(|b| b.seq));
    true
}

impl CachingLog for Inner {
    fn evict_oldest(&self) -> bool {
        self.state.try_borrow_mut().is_ok_and(|mut state| evict_oldest_written(&mut state))
    }
}

/// For an uncompressed batch, the first record at or after `timestamp`;
/// otherwise (compressed: records unreadable without inflating) its base.
fn first_record_at_or_after(batch: &[u8], header: &BatchHeader, timestamp: i64) -> (i64, i64) {
    if header.compression() == 0 {
        if let Ok(records) = record_batch::decode_records(batch) {
            for record in records {
                let record_ts = header.base_timestamp + record.timestamp_delta;
                if record_ts >= timestamp {
                    return (header.base_offset + i64::from(record.offset_delta), record_ts);
                }
            }
        }
    }
    (header.base_offset, header.max_timestamp)
}
