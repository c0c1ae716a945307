//! The storage engine against real files with O_DIRECT: round trips across
//! segment rolls, restarts, simulated crashes, retention and time lookups.

use std::path::Path;

use bytes::{Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use shardlog::log::{FlushPolicy, InjectedFault, Log, LogConfig, LogError, CLEAN_XATTR};
use shardlog::protocol::record_batch::{self, encode_batch, BatchHeader, ProducerFields, Record};

fn run<F, T>(future: impl FnOnce() -> F + Send + 'static) -> T
where
    F: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(future)
        .expect("executor starts")
        .join()
        .expect("executor finishes")
}

/// A batch of `count` records whose values encode (batch number, record number).
fn batch(number: usize, count: usize, timestamp: i64) -> Bytes {
    let records: Vec<Record> = (0..count)
        .map(|r| Record {
            key: Some(Bytes::from(format!("key-{number}"))),
            value: Some(Bytes::from(format!("value-{number}-{r}-{}", "x".repeat(number % 300)))),
            headers: vec![("n".into(), Some(Bytes::from(number.to_string())))],
            timestamp_delta: r as i64,
            offset_delta: r as i32,
        })
        .collect();
    encode_batch(&records, timestamp, ProducerFields::NONE)
}

/// Rolls every 64 KiB. No retention: the test batches carry timestamps
/// from 1970, which time retention would take at the next roll.
fn small_segments(flush: FlushPolicy) -> LogConfig {
    LogConfig { segment_bytes: 64 << 10, flush, cache_bytes_max: 16 << 10, retention_ms: -1, ..LogConfig::default() }
}

/// One segment that never rolls here: a clean reopen reads no older one.
fn one_segment() -> LogConfig {
    LogConfig { segment_bytes: 1 << 30, cache_bytes_max: 16 << 10, ..LogConfig::default() }
}

async fn append_all(log: &Log, batches: &[Bytes]) -> Vec<i64> {
    let mut bases = Vec::new();
    for data in batches {
        let header = record_batch::validate(data, 1 << 20).unwrap();
        let appended = log.append(BytesMut::from(&data[..]), &header).unwrap();
        log.wait_done(appended.last_offset).await.unwrap();
        bases.push(appended.base_offset);
    }
    bases
}

/// Reads the whole log from `from` with the given budget, checking offsets.
async fn read_all(log: &Log, from: i64, max_bytes: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut offset = from;
    while offset < log.high_watermark() {
        let read = log.read(offset, max_bytes).await.unwrap();
        assert!(!read.batches.is_empty(), "read at {offset} returned nothing below the high watermark");
        for data in read.batches {
            let header = record_batch::validate(&data, 1 << 20).unwrap();
            assert!(header.last_offset() >= offset);
            if out.is_empty() {
                assert!(header.base_offset <= offset);
            } else {
                assert_eq!(header.base_offset, offset, "offsets are dense");
            }
            offset = header.last_offset() + 1;
            out.push(data);
        }
    }
    out
}

fn same_content(stored: &[Bytes], sent: &[Bytes]) {
    assert_eq!(stored.len(), sent.len());
    for (a, b) in stored.iter().zip(sent) {
        // Identical apart from the patched base offset and leader epoch.
        assert_eq!(a[record_batch::MAGIC_AT..], b[record_batch::MAGIC_AT..]);
    }
}

#[test]
fn round_trip_across_segment_rolls_for_every_flush_policy() {
    for flush in [FlushPolicy::Always, FlushPolicy::Never, FlushPolicy::IntervalMs(5)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let (log, _) = Log::open(path.join("t-0"), small_segments(flush)).await.unwrap();
            let sent: Vec<Bytes> = (0..400).map(|i| batch(i, 1 + i % 7, 1_000 + i as i64)).collect();
            let bases = append_all(&log, &sent).await;
            log.sync().await.unwrap();
            assert_eq!(bases[0], 0);
            assert!(log.segment_count() > 3, "segments rolled: {}", log.segment_count());
            for max_bytes in [1, 1000, 64 << 10, 10 << 20] {
                same_content(&read_all(&log, 0, max_bytes).await, &sent);
            }
            let middle = bases[200] + 1;
            let tail = read_all(&log, middle, 4096).await;
            same_content(&tail, &sent[200..]);
            log.close().await.unwrap();
        });
    }
}

#[test]
fn reopen_after_clean_close_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let sent: Vec<Bytes> = (0..300).map(|i| batch(i, 3, 5_000 + i as i64)).collect();
    let (p, s) = (path.clone(), sent.clone());
    run(move || async move {
        let (log, _) = Log::open(&p, small_segments(FlushPolicy::Always)).await.unwrap();
        append_all(&log, &s).await;
        log.close().await.unwrap();
    });
    assert!(clean_mark(&path).is_some(), "a clean close marks the active segment");
    run(move || async move {
        let (log, report) = Log::open(&path, small_segments(FlushPolicy::Always)).await.unwrap();
        assert!(report.clean_shutdown);
        // The open took the mark away: a crash from here on is not clean.
        assert_eq!(clean_mark(&path), None);
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(log.log_end_offset(), 900);
        same_content(&read_all(&log, 0, 1 << 20).await, &sent);
        // And appends continue densely after the reopen.
        let more = append_all(&log, &[batch(1, 2, 9_999)]).await;
        assert_eq!(more, vec![900]);
        log.close().await.unwrap();
    });
}

#[test]
fn clean_reopen_takes_the_end_from_the_mark_and_scans_nothing() {
    // One segment: older segments are still checked from their last index
    // entry on every open (a few KiB each).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let sent: Vec<Bytes> = (0..300).map(|i| batch(i, 3, 5_000 + i as i64)).collect();
    let (p, s) = (path.clone(), sent.clone());
    run(move || async move {
        let (log, _) = Log::open(&p, one_segment()).await.unwrap();
        append_all(&log, &s).await;
        log.close().await.unwrap();
        let (log, report) = Log::open(&p, one_segment()).await.unwrap();
        assert!(report.clean_shutdown);
        assert_eq!(report.scanned_bytes, 0, "a clean open reads no batches");
        assert_eq!(log.log_end_offset(), 900);
        // The largest timestamp came from the marker, not from a scan.
        assert_eq!(log.offset_for_timestamp(5_301).await.unwrap(), Some((899, 5_301)));
        assert_eq!(log.offset_for_timestamp(5_302).await.unwrap(), None);
        // Appends continue on the partly filled last page the open read.
        assert_eq!(append_all(&log, &[batch(1, 2, 9_999)]).await, vec![900]);
        log.close().await.unwrap();
        let (log, report) = Log::open(&p, one_segment()).await.unwrap();
        assert_eq!(report.scanned_bytes, 0);
        assert_eq!(log.log_end_offset(), 902);
        let mut expected = s.clone();
        expected.push(batch(1, 2, 9_999));
        same_content(&read_all(&log, 0, 1 << 20).await, &expected);
        log.close().await.unwrap();
    });
    // A segment that changed after the clean close no longer matches the
    // marker: the open scans it, as after a crash.
    let segment = last_segment(&path);
    let valid = std::fs::metadata(&segment).unwrap().len();
    let mut file = std::fs::OpenOptions::new().append(true).open(&segment).unwrap();
    std::io::Write::write_all(&mut file, &[7u8; 5000]).unwrap();
    drop(file);
    let (p, s) = (path.clone(), sent.clone());
    run(move || async move {
        let (log, report) = Log::open(&p, one_segment()).await.unwrap();
        assert!(report.clean_shutdown);
        assert!(report.scanned_bytes > 0);
        assert_eq!(report.truncated_bytes, 5000);
        assert_eq!(log.log_end_offset(), 902);
        same_content(&read_all(&log, 0, 1 << 20).await[..300], &s);
        log.close().await.unwrap();
    });
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), valid);
    // An empty marker file (written by earlier versions instead of the
    // mark) means clean but says nothing of the end: the open scans.
    xattr::remove(last_segment(&path), CLEAN_XATTR).unwrap();
    std::fs::write(path.join("clean"), b"").unwrap();
    run(move || async move {
        let (log, report) = Log::open(&path, one_segment()).await.unwrap();
        assert!(report.clean_shutdown);
        assert!(!path.join("clean").exists(), "the open removes the marker file");
        assert!(report.scanned_bytes > 0);
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(log.log_end_offset(), 902);
        assert_eq!(log.offset_for_timestamp(9_999).await.unwrap(), Some((900, 9_999)));
        log.close().await.unwrap();
    });
}

#[test]
fn a_clean_close_writes_the_index_only_when_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let sent: Vec<Bytes> = (0..100).map(|i| batch(i, 3, 5_000 + i as i64)).collect();
    let (p, s) = (path.clone(), sent.clone());
    run(move || async move {
        let (log, _) = Log::open(&p, one_segment()).await.unwrap();
        append_all(&log, &s).await;
        log.close().await.unwrap();
    });
    let index = last_segment(&path).with_extension("index");
    let time_index = index.with_extension("timeindex");
    let written = std::fs::read(&index).unwrap();
    let written_times = std::fs::read(&time_index).unwrap();
    assert!(written.len() >= 8, "the batches are indexed: {} bytes", written.len());
    let stamp = |path: &Path| std::fs::metadata(path).unwrap().modified().unwrap();
    let before = stamp(&index);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let p = path.clone();
    run(move || async move {
        let (log, _) = Log::open(&p, one_segment()).await.unwrap();
        log.close().await.unwrap();
    });
    assert_eq!(stamp(&index), before, "an unchanged index is not written again");
    let p = path.clone();
    run(move || async move {
        let (log, _) = Log::open(&p, one_segment()).await.unwrap();
        append_all(&log, &[sized_batch(1, 64 << 10)]).await;
        log.close().await.unwrap();
    });
    assert_ne!(stamp(&index), before);
    let grown = std::fs::read(&index).unwrap();
    assert!(grown.len() > written.len() && grown.starts_with(&written), "{} -> {} bytes", written.len(), grown.len());
    // The time index, unread by the clean open, was read under the entries
    // added since.
    let grown_times = std::fs::read(&time_index).unwrap();
    assert!(grown_times.len() > written_times.len() && grown_times.starts_with(&written_times));
    let p = path.clone();
    run(move || async move {
        let (log, _) = Log::open(&p, one_segment()).await.unwrap();
        // Batch i holds offsets 3i..3i+2 stamped 5,000+i..5,002+i; the
        // sized batch after them is stamped 1.
        assert_eq!(log.offset_for_timestamp(5_050).await.unwrap(), Some((146, 5_050)));
        assert_eq!(log.offset_for_timestamp(5_101).await.unwrap(), Some((299, 5_101)));
        assert_eq!(log.offset_for_timestamp(5_102).await.unwrap(), None);
        log.close().await.unwrap();
    });
    // After a crash the scan rebuilds the entries past the last one it
    // trusts, so the next close writes the index whatever its count.
    std::fs::write(&index, &written).unwrap();
    xattr::remove(last_segment(&path), CLEAN_XATTR).unwrap();
    let before = stamp(&index);
    std::thread::sleep(std::time::Duration::from_millis(20));
    run(move || async move {
        let (log, report) = Log::open(&path, one_segment()).await.unwrap();
        assert!(!report.clean_shutdown && report.scanned_bytes > 0);
        log.close().await.unwrap();
    });
    assert_ne!(stamp(&index), before);
    assert_eq!(std::fs::read(&index).unwrap(), grown);
}

#[test]
fn a_damaged_clean_mark_still_means_clean_but_the_open_scans() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let sent: Vec<Bytes> = (0..50).map(|i| batch(i, 3, 5_000 + i as i64)).collect();
    let (p, s) = (path.clone(), sent.clone());
    run(move || async move {
        let (log, _) = Log::open(&p, small_segments(FlushPolicy::Always)).await.unwrap();
        append_all(&log, &s).await;
        log.close().await.unwrap();
    });
    let mut mark = clean_mark(&path).unwrap();
    mark[20] ^= 1;
    xattr::set(last_segment(&path), CLEAN_XATTR, &mark).unwrap();
    run(move || async move {
        let (log, report) = Log::open(&path, small_segments(FlushPolicy::Always)).await.unwrap();
        assert!(report.clean_shutdown);
        assert!(report.scanned_bytes > 0, "a mark that fails its checksum is not trusted");
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(log.log_end_offset(), 150);
        same_content(&read_all(&log, 0, 1 << 20).await, &sent);
        assert_eq!(clean_mark(&path), None);
        log.close().await.unwrap();
    });
}

/// A batch of about `bytes` in 1 KiB records, its values marked with `number`.
fn sized_batch(number: usize, bytes: usize) -> Bytes {
    let records: Vec<Record> = (0..(bytes / 1040).max(1))
        .map(|r| Record {
            value: Some(Bytes::from(vec![(number * 31 + r) as u8; 1 + (number + r) % 1024])),
            offset_delta: r as i32,
            ..Record::default()
        })
        .collect();
    encode_batch(&records, number as i64, ProducerFields::NONE)
}

#[test]
fn batches_of_every_size_written_as_a_pipeline_of_chunks_round_trip() {
    // Large batches appended faster than the disk takes them: the writer
    // splits pending data into page-aligned chunks (batches cut across
    // chunks), several in flight, across segment rolls. Whatever the split,
    // the files must hold exactly the batches, in order, after a reopen.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let sent: Vec<Bytes> = (0..120)
        .map(|i| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let size = match seed % 4 {
                0 => 100 + (seed >> 8) as usize % 4000,
                1 => 4096 * (1 + (seed >> 8) as usize % 64),
                _ => (64 << 10) + (seed >> 8) as usize % (3 << 20),
            };
            sized_batch(i, size)
        })
        .collect();
    let config = LogConfig {
        segment_bytes: 8 << 20,
        flush: FlushPolicy::Never,
        cache_bytes_max: 64 << 10,
        batch_bytes_max: 4 << 20,
        pending_bytes_max: 64 << 20,
        retention_ms: -1,
        ..LogConfig::default()
    };
    let (p, s, c) = (path.clone(), sent.clone(), config.clone());
    run(move || async move {
        let (log, _) = Log::open(&p, c).await.unwrap();
        for (round, chunk) in s.chunks(17).enumerate() {
            let mut last = 0;
            for data in chunk {
                let header = record_batch::validate(data, 4 << 20).unwrap();
                last = log.append(BytesMut::from(&data[..]), &header).unwrap().last_offset;
            }
            if round % 2 == 0 {
                log.sync().await.unwrap();
            } else {
                log.wait_done(last).await.unwrap();
            }
        }
        log.sync().await.unwrap();
        assert!(log.segment_count() > 5, "segments rolled: {}", log.segment_count());
        same_content(&read_big(&log).await, &s);
        log.close().await.unwrap();
    });
    run(move || async move {
        let (log, report) = Log::open(&path, config).await.unwrap();
        assert!(report.clean_shutdown);
        same_content(&read_big(&log).await, &sent);
        log.close().await.unwrap();
    });
}

/// Reads the whole log one batch at a time (batches up to 4 MiB).
async fn read_big(log: &Log) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < log.high_watermark() {
        let read = log.read(offset, 1).await.unwrap();
        for data in read.batches {
            let header = record_batch::validate(&data, 4 << 20).unwrap();
            assert_eq!(header.base_offset, offset, "offsets are dense");
            offset = header.last_offset() + 1;
            out.push(data);
        }
    }
    out
}

#[test]
fn eio_on_fdatasync_stops_appends_keeps_acknowledged_data_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let sent: Vec<Bytes> = (0..50).map(|i| batch(i, 2, 7_000 + i as i64)).collect();
    let (p, s) = (path.clone(), sent.clone());
    run(move || async move {
        let (log, _) = Log::open(&p, small_segments(FlushPolicy::Always)).await.unwrap();
        append_all(&log, &s).await;
        assert_eq!(log.high_watermark(), 100);
        log.inject_fault(InjectedFault::SyncEio);
        let doomed = batch(99, 2, 9_000);
        let header = record_batch::validate(&doomed, 1 << 20).unwrap();
        let appended = log.append(BytesMut::from(&doomed[..]), &header).unwrap();
        let err = log.wait_done(appended.last_offset).await.unwrap_err();
        assert!(matches!(&err, LogError::Io { message, .. } if message.contains("Input/output error")), "{err}");
        assert!(log.is_failed() && !log.failed_for_space(), "an EIO is not healed by waiting for space");
        // Stopped: nothing more is taken, and nothing unsynced becomes visible.
        assert!(matches!(log.append(BytesMut::from(&doomed[..]), &header), Err(LogError::Failed(_))));
        assert_eq!(log.high_watermark(), 100, "the failed batch was never acknowledged");
        same_content(&read_all(&log, 0, 64 << 10).await, &s);
        log.close().await.unwrap();
    });
    assert_eq!(clean_mark(&path), None, "a failed log is not marked clean");
    assert!(!path.join("clean").exists());
    run(move || async move {
        let (log, report) = Log::open(&path, small_segments(FlushPolicy::Always)).await.unwrap();
        assert!(!report.clean_shutdown);
        let stored = read_all(&log, 0, 1 << 20).await;
        // Every acknowledged batch is back; the unacknowledged one may be too
        // (its write reached the file), which Kafka semantics allow.
        assert!(stored.len() == sent.len() || stored.len() == sent.len() + 1, "{} batches", stored.len());
        same_content(&stored[..sent.len()], &sent);
        let next = log.log_end_offset();
        assert_eq!(append_all(&log, &[batch(1, 1, 9_999)]).await, vec![next], "appends resume after reopening");
        log.close().await.unwrap();
    });
}

#[test]
fn eio_on_write_fails_the_flush_and_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let (log, _) = Log::open(&path, small_segments(FlushPolicy::Never)).await.unwrap();
        let kept = [batch(1, 3, 1_000)];
        append_all(&log, &kept).await;
        log.sync().await.unwrap();
        log.inject_fault(InjectedFault::WriteEio);
        let lost = batch(2, 3, 2_000);
        let header = record_batch::validate(&lost, 1 << 20).unwrap();
        log.append(BytesMut::from(&lost[..]), &header).unwrap();
        assert!(log.sync().await.is_err(), "the write error reaches the flush");
        assert!(log.is_failed());
        assert!(matches!(log.append(BytesMut::from(&lost[..]), &header), Err(LogError::Failed(_))));
        same_content(&read_all(&log, 0, 1 << 20).await[..1], &kept);
        log.close().await.unwrap();
    });
}

#[test]
fn logs_of_one_core_share_the_cache_budget_oldest_batch_out_first() {
    const BUDGET: usize = 128 << 10;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        shardlog::log::set_core_cache_bytes_max(BUDGET);
        let config = LogConfig { flush: FlushPolicy::Always, ..LogConfig::default() };
        let mut logs = Vec::new();
        for i in 0..4 {
            logs.push(Log::open(path.join(format!("t-{i}")), config.clone()).await.unwrap().0);
        }
        let sent: Vec<Bytes> = (0..200).map(|i| batch(100 + i, 8, 1_000 + i as i64)).collect();
        let total: usize = sent.iter().map(Bytes::len).sum();
        let batch_bytes = sent.iter().map(Bytes::len).max().unwrap();
        assert!(total > 2 * BUDGET, "more than the core budget: {total}");
        // One busy log among idle ones may use the whole budget, not more.
        append_all(&logs[0], &sent).await;
        let busy = shardlog::log::core_cache_bytes();
        assert!(busy > BUDGET - batch_bytes && busy <= BUDGET, "{busy} bytes cached");
        assert!(logs[0].memory_bytes() <= BUDGET + 8 * 1024, "{} bytes", logs[0].memory_bytes());
        // Newer data in another log pushes out the first log's oldest batches.
        let newer: Vec<Bytes> = (0..40).map(|i| batch(1_000 + i, 8, 5_000 + i as i64)).collect();
        let newer_total: usize = newer.iter().map(Bytes::len).sum();
        append_all(&logs[1], &newer).await;
        let cached = shardlog::log::core_cache_bytes();
        assert!(cached <= BUDGET, "{cached} bytes cached");
        let first_kept = logs[0].memory_bytes();
        assert!(
            first_kept <= busy - newer_total + batch_bytes + 8 * 1024,
            "the first log gave way: {first_kept} bytes (was {busy})"
        );
        assert!(logs[1].memory_bytes() >= newer_total, "the newest log keeps all of its {newer_total} bytes");
        // What left the cache is read back from disk, whole.
        same_content(&read_all(&logs[0], 0, 64 << 10).await, &sent);
        same_content(&read_all(&logs[1], 0, 64 << 10).await, &newer);
        for log in &logs {
            log.close().await.unwrap();
        }
        drop(logs);
        assert_eq!(shardlog::log::core_cache_bytes(), 0, "closed logs give their cache back");
        shardlog::log::set_core_cache_bytes_max(shardlog::log::CORE_CACHE_BYTES_MAX_DEFAULT);
    });
}

#[test]
fn a_disk_read_reads_the_next_chunk_ahead_in_memory() {
    // O_DIRECT has no kernel read-ahead: after a read that had to go to the
    // disk, the log reads the next chunk itself, so a consumer reading on
    // finds it in memory (read_now answers without waiting). Across segment
    // rolls, and until the log closes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let config = LogConfig {
            segment_bytes: 128 << 10,
            flush: FlushPolicy::Always,
            cache_bytes_max: 16 << 10,
            retention_ms: -1,
            ..LogConfig::default()
        };
        let (log, _) = Log::open(&path, config).await.unwrap();
        let sent: Vec<Bytes> = (0..600).map(|i| sized_batch(i, 16 << 10)).collect();
        append_all(&log, &sent).await;
        assert!(log.segment_count() > 3, "segments rolled: {}", log.segment_count());
        assert!(log.read_now(0, 64 << 10).is_none(), "the start of the log is only on disk");
        assert_eq!(shardlog::log::core_read_ahead_bytes(), 0);

        const READ_BYTES: usize = 64 << 10;
        let mut stored = Vec::new();
        let mut offset = 0;
        let mut from_memory = 0;
        while offset < log.high_watermark() {
            let read = match log.read_now(offset, READ_BYTES) {
                Some(read) => {
                    from_memory += 1;
                    read.unwrap()
                }
                None => log.read(offset, READ_BYTES).await.unwrap(),
            };
            assert!(!read.batches.is_empty(), "nothing at {offset}");
            let ahead = shardlog::log::core_read_ahead_bytes();
            assert!(ahead <= 2 * READ_BYTES, "at most the chunk being read and the next: {ahead} bytes");
            for data in read.batches {
                let header = record_batch::validate(&data, 1 << 20).unwrap();
                assert_eq!(header.base_offset, offset, "offsets are dense");
                offset = header.last_offset() + 1;
                stored.push(data);
            }
            // Time for the read-ahead started by this read to complete.
            glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
        }
        same_content(&stored, &sent);
        let reads = stored.iter().map(Bytes::len).sum::<usize>() / READ_BYTES;
        assert!(from_memory >= reads - 2, "{from_memory} of about {reads} reads answered from memory");

        // A read elsewhere drops what was read ahead before it.
        let again = log.read(0, READ_BYTES).await.unwrap();
        same_content(&again.batches, &sent[..again.batches.len()]);
        glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
        assert!(shardlog::log::core_read_ahead_bytes() > 0, "the read from the start reads ahead again");
        log.close().await.unwrap();
        assert_eq!(shardlog::log::core_read_ahead_bytes(), 0, "a closed log drops its read-ahead");
    });
}

/// The longest prefix of `sent` whose bytes all lie within `cut` bytes.
fn prefix_within(sent: &[Bytes], cut: u64) -> usize {
    let mut end = 0u64;
    sent.iter()
        .take_while(|b| {
            end += b.len() as u64;
            end <= cut
        })
        .count()
}

/// The clean mark on the log's last segment.
fn clean_mark(dir: &Path) -> Option<Vec<u8>> {
    xattr::get(last_segment(dir), CLEAN_XATTR).unwrap()
}

fn last_segment(dir: &Path) -> std::path::PathBuf {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.pop().unwrap()
}

#[test]
fn crash_cuts_recover_to_longest_valid_prefix() {
    use rand_like::Lcg;
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    let sent: Vec<Bytes> = (0..200).map(|i| batch(i, 1 + i % 5, 7_000 + i as i64)).collect();
    let (p, s) = (original.clone(), sent.clone());
    run(move || async move {
        // One big segment, never closed: the crash image.
        let config = LogConfig { segment_bytes: 1 << 30, ..LogConfig::default() };
        let (log, _) = Log::open(&p, config).await.unwrap();
        append_all(&log, &s).await;
    });
    let segment = last_segment(&original);
    let image = std::fs::read(&segment).unwrap();
    let total: u64 = sent.iter().map(|b| b.len() as u64).sum();
    assert!(image.len() as u64 >= total);
    let mut rng = Lcg(42);
    for trial in 0..60 {
        let cut = rng.next() % (total + 1);
        let mut damaged = image[..cut as usize].to_vec();
        match trial % 3 {
            0 => damaged.extend(std::iter::repeat_n(0u8, 8192)),
            1 => damaged.extend((0..(rng.next() % 5000)).map(|_| rng.next() as u8)),
            _ => {}
        }
        let copy = dir.path().join(format!("trial-{trial}"));
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::write(copy.join(segment.file_name().unwrap()), &damaged).unwrap();
        let expected = prefix_within(&sent, cut);
        let s = sent.clone();
        run(move || async move {
            let (log, report) = Log::open(&copy, LogConfig::default()).await.unwrap();
            assert!(!report.clean_shutdown);
            let stored = read_all(&log, 0, 1 << 20).await;
            same_content(&stored, &s[..expected]);
            let end: i64 =
                s[..expected].iter().map(|b| i64::from(BatchHeader::parse(b, 1 << 20).unwrap().record_count)).sum();
            assert_eq!(log.log_end_offset(), end, "cut at {cut}");
            // The recovered log takes new appends at the right offset.
            let more = append_all(&log, &[batch(0, 1, 1)]).await;
            assert_eq!(more, vec![end]);
            log.close().await.unwrap();
        });
    }
}

#[test]
fn retention_by_size_and_time_and_delete_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        // Retention by explicit passes only: no roll writes over an
        // expired segment here.
        let mut config =
            LogConfig { retention_ms: 7 * 86_400_000, recycle_segments: false, ..small_segments(FlushPolicy::Never) };
        let (log, _) = Log::open(&path, config.clone()).await.unwrap();
        let now = shardlog::log::now_ms() as i64;
        let old: Vec<Bytes> = (0..400).map(|i| batch(i, 2, now - 10 * 86_400_000)).collect();
        let fresh: Vec<Bytes> = (0..200).map(|i| batch(i, 2, now)).collect();
        append_all(&log, &old).await;
        append_all(&log, &fresh).await;
        log.sync().await.unwrap();
        let segments_before = log.segment_count();
        // Time: 7-day retention removes the old segments only.
        let deleted = log.enforce_retention(now as u64).await.unwrap();
        assert!(deleted > 0, "segments before: {segments_before}, size {}", log.size_bytes());
        assert!(log.log_start_offset() > 0 && log.log_start_offset() <= 800);
        assert!(log.segment_count() < segments_before);
        let first = log.read(log.log_start_offset(), 1).await.unwrap();
        assert!(!first.batches.is_empty());
        assert!(log.read(0, 1).await.is_err(), "deleted offsets are out of range");
        // Size: keep about 64 KiB.
        config.retention_bytes = 64 << 10;
        log.set_config(config);
        log.enforce_retention(now as u64).await.unwrap();
        assert!(log.size_bytes() <= (64 << 10) + (64 << 10));
        // DeleteRecords moves the start inside a segment and persists it.
        let target = log.log_end_offset() - 10;
        assert_eq!(log.delete_records(target).await.unwrap(), target);
        assert!(log.read(target - 1, 1).await.is_err());
        log.close().await.unwrap();
        let (log, _) = Log::open(&path, LogConfig::default()).await.unwrap();
        assert_eq!(log.log_start_offset(), target);
        log.close().await.unwrap();
    });
}

#[test]
fn timestamp_lookup_finds_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let (log, _) = Log::open(&path, small_segments(FlushPolicy::Always)).await.unwrap();
        // Batch i holds 4 records at 10_000 + 10*i + r.
        let sent: Vec<Bytes> = (0..300).map(|i| batch(i, 4, 10_000 + 10 * i as i64)).collect();
        append_all(&log, &sent).await;
        assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some((0, 10_000)));
        assert_eq!(log.offset_for_timestamp(10_002).await.unwrap(), Some((2, 10_002)));
        assert_eq!(log.offset_for_timestamp(10_005).await.unwrap(), Some((4, 10_010)));
        assert_eq!(log.offset_for_timestamp(12_993).await.unwrap(), Some((299 * 4 + 3, 12_993)));
        assert_eq!(log.offset_for_timestamp(20_000).await.unwrap(), None);
        log.close().await.unwrap();
    });
}

mod rand_like {
    /// A tiny deterministic generator for reproducible cut points.
    pub struct Lcg(pub u64);
    impl Lcg {
        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn ten_thousand_partitions_open_append_and_reopen() {
    const PARTITIONS: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let data = batch(1, 4, 1_000);
    run(move || async move {
        let config = LogConfig { flush: FlushPolicy::Never, ..LogConfig::default() };
        let rss_before = rss_bytes();
        let started = std::time::Instant::now();
        let mut logs = Vec::with_capacity(PARTITIONS);
        for p in 0..PARTITIONS {
            logs.push(Log::open(path.join(format!("t-{p}")), config.clone()).await.unwrap().0);
        }
        let opened = started.elapsed();
        let header = record_batch::validate(&data, 1 << 20).unwrap();
        for log in &logs {
            let appended = log.append(BytesMut::from(&data[..]), &header).unwrap();
            log.wait_done(appended.last_offset).await.unwrap();
        }
        for log in &logs {
            log.sync().await.unwrap();
        }
        let appended = started.elapsed() - opened;
        let rss = rss_bytes().saturating_sub(rss_before);
        let memory: usize = logs.iter().map(Log::memory_bytes).sum();
        let close_started = std::time::Instant::now();
        for log in &logs {
            log.close().await.unwrap();
        }
        let closed = close_started.elapsed();
        drop(logs);
        let reopen_started = std::time::Instant::now();
        let mut reopened = Vec::with_capacity(PARTITIONS);
        for p in 0..PARTITIONS {
            let (log, report) = Log::open(path.join(format!("t-{p}")), config.clone()).await.unwrap();
            assert!(report.clean_shutdown);
            assert_eq!(log.log_end_offset(), 4);
            reopened.push(log);
        }
        let reopen = reopen_started.elapsed();
        eprintln!(
            "{PARTITIONS} partitions: open {opened:?}, append+sync {appended:?}, close {closed:?}, reopen {reopen:?}; \
             RSS growth {} KiB ({} B/partition), log-accounted memory {} B/partition",
            rss / 1024,
            rss / PARTITIONS as u64,
            memory / PARTITIONS
        );
        assert!(rss / (PARTITIONS as u64) < 64 * 1024, "per-partition memory stays small");
        let read = reopened[PARTITIONS - 1].read(0, 1 << 20).await.unwrap();
        assert_eq!(read.batches.len(), 1);
        for log in &reopened {
            log.close().await.unwrap();
        }
    });
}

/// Copies every file of `from` into a new directory `to` (a crash image
/// of a log whose data is written).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

/// Base offsets of the whole, valid batches found anywhere in `file` from
/// `from` on (at any byte position, not only where a batch would start).
fn batches_in(file: &Path, from: usize) -> Vec<i64> {
    let image = std::fs::read(file).unwrap();
    (from..image.len().saturating_sub(record_batch::HEADER_BYTES))
        .filter_map(|at| {
            let header = BatchHeader::parse(&image[at..], 1 << 20).ok()?;
            let whole = image.get(at..at + header.size_bytes)?;
            record_batch::validate(whole, 1 << 20).ok().map(|h| h.base_offset)
        })
        .collect()
}

#[test]
fn a_roll_writes_over_the_expired_oldest_segment_and_a_crash_scan_ignores_its_old_data() {
    for recycle in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (path, crash) = (dir.path().join("t-0"), dir.path().join("crash"));
        let config =
            LogConfig { retention_bytes: 128 << 10, recycle_segments: recycle, ..small_segments(FlushPolicy::Never) };
        let (p, c, conf) = (path.clone(), crash.clone(), config.clone());
        let (sent, bases, end, start, active_base) = run(move || async move {
            let (log, _) = Log::open(&p, conf).await.unwrap();
            let (mut sent, mut bases) = (Vec::new(), Vec::new());
            let mut append = |i: usize| {
                let data = batch(i, 1 + i % 5, 1_000 + i as i64);
                sent.push(data.clone());
                data
            };
            // Enough for several rolls, each past the 128 KiB retention.
            for i in 0..400 {
                let data = append(i);
                bases.extend(append_all(&log, &[data]).await);
                log.sync().await.unwrap();
            }
            // Roll once more, then write a little: the new active segment
            // holds far less new data than the file it was made of.
            let before = log.active_segment_base_offset();
            let mut i = 400;
            while log.active_segment_base_offset() == before || i < 404 {
                let data = append(i);
                bases.extend(append_all(&log, &[data]).await);
                log.sync().await.unwrap();
                if log.active_segment_base_offset() != before
                    && log.log_end_offset() > log.active_segment_base_offset() + 4
                {
                    break;
                }
                i += 1;
            }
            copy_dir(&p, &c);
            let (end, start, active_base) =
                (log.log_end_offset(), log.log_start_offset(), log.active_segment_base_offset());
            // Nothing before the log start is left on disk.
            assert!(log.size_bytes() <= (128 << 10) + (128 << 10), "retention kept {} bytes", log.size_bytes());
            log.close().await.unwrap();
            (sent, bases, end, start, active_base)
        });
        // What follows the new data in the active segment's file: with
        // recycling, the old segment's batches (offsets below the active
        // segment's base); without, zeros of the pre-allocation.
        let active = crash.join(format!("{active_base:020}.log"));
        let image_len = std::fs::metadata(&active).unwrap().len();
        let new_data: usize =
            sent.iter().zip(&bases).filter(|(_, &base)| base >= active_base).map(|(b, _)| b.len()).sum();
        let old = batches_in(&active, new_data);
        if recycle {
            assert!(
                !old.is_empty() && old.iter().all(|&base| base < active_base),
                "recycle: old batches follow the new data: {old:?}, base {active_base}"
            );
        } else {
            assert_eq!(old, Vec::<i64>::new(), "a new file holds no old batches");
        }
        let c = crash.clone();
        run(move || async move {
            let (log, report) = Log::open(&c, config).await.unwrap();
            assert!(!report.clean_shutdown);
            assert_eq!(log.log_end_offset(), end, "recycle {recycle}: the crash scan keeps all the new data");
            assert_eq!(report.truncated_bytes, image_len - new_data as u64, "and cuts off the rest of the file");
            assert_eq!(log.log_start_offset(), start);
            let first = bases.iter().position(|&base| base >= start).unwrap();
            same_content(&read_all(&log, start, 1 << 20).await, &sent[first..]);
            // And takes appends at the right offset.
            assert_eq!(append_all(&log, &[batch(1, 1, 1)]).await, vec![end]);
            log.close().await.unwrap();
        });
    }
}

#[test]
fn a_crash_right_after_the_old_file_took_the_new_name_recovers_an_empty_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (path, crash) = (dir.path().join("t-0"), dir.path().join("crash"));
    let sent: Vec<Bytes> = (0..300).map(|i| batch(i, 2, 1_000 + i as i64)).collect();
    let (p, s) = (path.clone(), sent.clone());
    let end = run(move || async move {
        let (log, _) = Log::open(&p, small_segments(FlushPolicy::Always)).await.unwrap();
        append_all(&log, &s).await;
        let end = log.log_end_offset();
        log.close().await.unwrap();
        end
    });
    // The roll renamed the oldest segment to the next base, then crashed
    // before writing: the new segment holds only old batches.
    copy_dir(&path, &crash);
    let oldest = crash.join(format!("{:020}.log", 0));
    let oldest_len = std::fs::metadata(&oldest).unwrap().len();
    for index in ["index", "timeindex"] {
        std::fs::remove_file(oldest.with_extension(index)).unwrap();
    }
    std::fs::rename(&oldest, crash.join(format!("{end:020}.log"))).unwrap();
    run(move || async move {
        let (log, report) = Log::open(&crash, small_segments(FlushPolicy::Always)).await.unwrap();
        assert_eq!(report.truncated_bytes, oldest_len, "every old byte is cut off");
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.active_segment_base_offset(), end);
        let start = log.log_start_offset();
        assert!(start > 0, "the old segment's offsets are gone");
        let stored = read_all(&log, start, 1 << 20).await;
        let first = sent.len() - stored.len();
        same_content(&stored, &sent[first..]);
        assert_eq!(append_all(&log, &[batch(1, 1, 1)]).await, vec![end]);
        log.close().await.unwrap();
    });
}

/// A batch of exactly `size` bytes: one record, its value as long as fits.
fn exact_batch(number: usize, size: usize) -> Bytes {
    (size.saturating_sub(120)..size)
        .map(|value_bytes| {
            let record = Record { value: Some(Bytes::from(vec![number as u8; value_bytes])), ..Record::default() };
            encode_batch(&[record], number as i64, ProducerFields::NONE)
        })
        .find(|batch| batch.len() == size)
        .unwrap_or_else(|| panic!("no one-record batch of {size} bytes"))
}

#[test]
fn a_crash_scan_keeps_batches_whose_header_a_read_chunk_cuts() {
    // Recovery reads the segment in 1 MiB chunks. A chunk that ends a few
    // bytes into a batch header holds only the high bytes of its base
    // offset, zeros for any offset below 2^24: they are not the end of
    // the log. Each image puts a batch header across the first chunk's
    // end, k bytes of it before.
    const CHUNK: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    for k in [1usize, 2, 3, 4, 5, 6, 8, 12, 60, 61] {
        let mut sent = Vec::new();
        let mut position = 0;
        while CHUNK - k - position > 20_000 {
            sent.push(exact_batch(sent.len(), 16_000));
            position += 16_000;
        }
        sent.push(exact_batch(sent.len(), CHUNK - k - position));
        sent.extend((0..40).map(|i| exact_batch(100 + i, 5_000)));
        let original = dir.path().join(format!("original-{k}"));
        let (p, s) = (original.clone(), sent.clone());
        run(move || async move {
            let (log, _) = Log::open(&p, one_segment()).await.unwrap();
            append_all(&log, &s).await;
            // No close: the crash image, every batch acknowledged (synced).
        });
        // The log file alone (no index): the scan starts at 0, so its
        // first chunk ends at 1 MiB.
        let crash = dir.path().join(format!("crash-{k}"));
        std::fs::create_dir_all(&crash).unwrap();
        let segment = last_segment(&original);
        std::fs::copy(&segment, crash.join(segment.file_name().unwrap())).unwrap();
        let s = sent.clone();
        run(move || async move {
            let (log, report) = Log::open(&crash, one_segment()).await.unwrap();
            assert!(!report.clean_shutdown);
            assert_eq!(log.log_end_offset(), s.len() as i64, "a header {k} bytes before the chunk's end");
            same_content(&read_all(&log, 0, 1 << 20).await, &s);
        });
    }
}
