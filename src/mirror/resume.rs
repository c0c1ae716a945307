//! Where the mirror goes on after a restart, from the target's data alone.
//!
//! The offset syncs on the target say "source record u was copied to target
//! offset d" (the last record of a target batch, written after the batch
//! was acknowledged). Every target record after d is a copy of a source
//! record after u, in order, one for one: the mirror is the only writer of
//! a mirrored partition. So, after a kill -9, the mirror counts the
//! records the target holds after d (k), skips k records of the source
//! after u (the same records: data of committed transactions, no control
//! batches), and goes on from there: no gap, no duplicate, whatever the
//! dead process had in flight. The same count translates any committed
//! offset exactly (`translate`).
//!
//! Limits: a record the dead mirror sent that the target commits only
//! after the count (the count reads up to the high watermark; a starting
//! mirror first waits `SETTLE` for a dead one's last requests) would be
//! copied twice; compaction on the
//! target between d and its end makes the count short (duplicates, never
//! gaps).

use std::time::Duration;

/// How long a starting mirror waits before it counts: a mirror killed a
/// moment ago may have produce requests in flight, answered within
/// milliseconds by a healthy target.
pub const SETTLE: Duration = Duration::from_secs(1);

use super::batches::select;
use super::link::{Link, LinkError, LinkResult};
use crate::protocol::record_batch::{self, BatchHeader};

/// Data records of a target partition at offsets after `after`, below `end`.
pub fn count_after(target: &mut Link, topic: &str, partition: i32, after: i64, end: i64) -> LinkResult<i64> {
    let mut offset = (after + 1).max(target.list_offset(topic, partition, -2)?);
    let mut count = 0;
    while offset < end {
        let p = target.fetch_partition(topic, partition, offset)?;
        let before = offset;
        for batch in &p.records {
            let Ok(header) = BatchHeader::parse(batch, usize::MAX) else { break };
            if header.size_bytes > batch.len() || header.base_offset >= end {
                break;
            }
            if header.last_offset() < offset {
                continue;
            }
            if !header.is_control() {
                count += records_from(batch, &header, offset)?;
            }
            offset = header.last_offset() + 1;
        }
        if offset == before {
            return Err(LinkError::Other(format!("{topic}-{partition}: no records at {offset} below {end}")));
        }
    }
    Ok(count)
}

/// The source offset after the first `count` records copied from `from` on.
pub fn skip_source(source: &mut Link, topic: &str, partition: i32, from: i64, count: i64) -> LinkResult<i64> {
    let mut remaining = count;
    let mut offset = from;
    while remaining > 0 {
        let p = source.fetch_partition(topic, partition, offset)?;
        let (selected, next) = select(&p.records, offset, &p.aborted_transactions);
        for batch in &selected {
            let records = records_from(&batch.bytes, &batch.header, batch.from)?;
            if records <= remaining {
                remaining -= records;
                if remaining == 0 {
                    return Ok(batch.header.last_offset() + 1);
                }
                continue;
            }
            // The target's copy ends inside this batch: only an
            // uncompressed one can be split.
            let views = record_batch::record_views(&batch.bytes).map_err(|_| {
                LinkError::Other(format!(
                    "{topic}-{partition}: target copy ends inside compressed batch {}",
                    batch.header.base_offset
                ))
            })?;
            let mut seen = 0;
            for view in views {
                let view = view.map_err(|e| LinkError::Other(e.to_string()))?;
                let at = batch.header.base_offset + i64::from(view.offset_delta);
                if at < batch.from {
                    continue;
                }
                if seen == remaining {
                    return Ok(at);
                }
                seen += 1;
            }
        }
        if next == offset {
            return Err(LinkError::Other(format!(
                "{topic}-{partition}: the target holds {remaining} more records than the source has after {from}"
            )));
        }
        offset = next;
    }
    Ok(offset)
}

/// Data records of a batch at or after `from`.
fn records_from(batch: &[u8], header: &BatchHeader, from: i64) -> LinkResult<i64> {
    if header.base_offset >= from {
        return Ok(i64::from(header.record_count));
    }
    if header.compression() != 0 {
        // A compressed batch is copied whole.
        return Ok(i64::from(header.record_count));
    }
    let views = record_batch::record_views(batch).map_err(|e| LinkError::Other(e.to_string()))?;
    let mut count = 0;
    for view in views {
        let view = view.map_err(|e| LinkError::Other(e.to_string()))?;
        if header.base_offset + i64::from(view.offset_delta) >= from {
            count += 1;
        }
    }
    Ok(count)
}

/// Where copying a partition starts: (first source offset, the target
/// offset it will get). `sync` is the newest offset sync for the partition.
/// Without one, the target partition must be empty (the mirror writes no
/// record before its first sync), and copying starts at the source's
/// earliest offset.
pub fn resume(
    source: &mut Link,
    target: &mut Link,
    (topic, partition): (&str, i32),
    target_topic: &str,
    sync: Option<(i64, i64)>,
) -> LinkResult<(i64, i64)> {
    let end = target.list_offset(target_topic, partition, -1)?;
    match sync {
        None => {
            let start = target.list_offset(target_topic, partition, -2)?;
            if end > start {
                return Err(LinkError::Other(format!(
                    "{target_topic}-{partition} holds {} records and no offset sync: the mirror did not write them \
                     (another writer, or another source alias); refusing to mix them",
                    end - start
                )));
            }
            Ok((source.list_offset(topic, partition, -2)?, end))
        }
        Some((upstream, downstream)) => {
            let copied = count_after(target, target_topic, partition, downstream, end)?;
            let next = skip_source(source, topic, partition, upstream + 1, copied)?;
            Ok((next, end))
        }
    }
}

/// The target offset that matches a committed source offset: the k-th
/// record after the sync's source record is the k-th after its target
/// record (and the k-th before, before). Never past what the target holds.
pub fn translate(
    source: &mut Link,
    target: &mut Link,
    (topic, partition): (&str, i32),
    target_topic: &str,
    (upstream, downstream): (i64, i64),
    committed: i64,
) -> LinkResult<Option<i64>> {
    let end = target.list_offset(target_topic, partition, -1)?;
    let start = target.list_offset(target_topic, partition, -2)?;
    let translated = if committed > upstream {
        downstream + 1 + count_source(source, (topic, partition), upstream + 1, committed)?
    } else {
        downstream + 1 - count_source(source, (topic, partition), committed, upstream + 1)?
    };
    Ok(Some(translated.clamp(start, end)))
}

/// Data records a mirror copies from the source in [from, until).
fn count_source(source: &mut Link, (topic, partition): (&str, i32), from: i64, until: i64) -> LinkResult<i64> {
    let mut between = 0;
    let mut offset = from.max(source.list_offset(topic, partition, -2)?);
    while offset < until {
        let p = source.fetch_partition(topic, partition, offset)?;
        let (selected, next) = select(&p.records, offset, &p.aborted_transactions);
        for batch in &selected {
            if batch.header.base_offset >= until {
                break;
            }
            match record_batch::record_views(&batch.bytes) {
                Ok(views) => {
                    for view in views.flatten() {
                        let at = batch.header.base_offset + i64::from(view.offset_delta);
                        if at >= batch.from && at < until {
                            between += 1;
                        }
                    }
                }
                // Compressed: copied whole, so counted whole where it ends
                // before `until` (a commit inside one maps to its start).
                Err(_) if batch.header.last_offset() < until => between += i64::from(batch.header.record_count),
                Err(_) => break,
            }
        }
        if next == offset {
            break;
        }
        offset = next;
    }
    Ok(between)
}
