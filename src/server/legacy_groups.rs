//! Committed offsets from before `__consumer_offsets` (issue 30). shardlog
//! used to keep each core's groups in a log of its own,
//! `<data>/__groups/core-<n>/`, on one machine only. Those offsets now live
//! in the replicated `__consumer_offsets` topic, so a data directory that
//! still has `__groups` is migrated on start:
//!
//! 1. `read` (before any core starts) reads every old log, whatever core
//!    count wrote it, into the offsets each group had committed last.
//! 2. `spawn_import` commits them through the broker's own Kafka API once it
//!    serves (FindCoordinator, then OffsetCommit as an admin with generation
//!    -1), only where the group has no commit yet, so a restart halfway
//!    through never moves a newer commit back.
//! 3. When every group is done, `__groups` is renamed `__groups.imported`
//!    (kept, not deleted: it is the user's data). Until then every start
//!    imports again.
//!
//! A group with active members refuses an admin commit; its consumers are
//! already committing, so its old offsets are skipped and the skip logged.
//!
//! The old segment files are read directly (not through `Log`, which needs
//! an executor): batches back to back from each segment's start, in segment
//! order, up to the first that is not whole (the preallocated zeros, or a
//! torn tail). Replaying every record in order, the last one per key wins,
//! which is also right for records below a compacted log's start: they are
//! older than the snapshot that follows them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::client::groups::{GroupAdmin, GroupAdminError};
use crate::constants::BATCH_BYTES_MAX_LIMIT;
use crate::group::{CommittedOffset, OffsetKey, OffsetRecord};
use crate::protocol::record_batch;
use crate::protocol::ErrorCode;

/// The directory of the old per-core offsets logs.
pub const LEGACY_DIR: &str = "__groups";
/// What it is renamed to once imported.
pub const IMPORTED_DIR: &str = "__groups.imported";
/// How long the import keeps retrying a group whose coordinator is not
/// ready (the offsets topic being created, its partitions loading).
const IMPORT_PATIENCE: Duration = Duration::from_secs(120);

/// Each group's last committed offsets, by group id.
pub type GroupOffsets = BTreeMap<String, Vec<(OffsetKey, CommittedOffset)>>;

#[derive(Debug, thiserror::Error)]
pub enum LegacyGroupsError {
    #[error("reading the old group offsets logs in {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// The offsets committed in the old logs under `data`, by group; None when
/// there is nothing to import.
pub fn read(data: &Path) -> Result<Option<GroupOffsets>, LegacyGroupsError> {
    let root = data.join(LEGACY_DIR);
    let io = |path: &Path, source| LegacyGroupsError::Io { path: path.display().to_string(), source };
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&root, e)),
    };
    let mut latest: BTreeMap<OffsetKey, Option<CommittedOffset>> = BTreeMap::new();
    let mut logs: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io(&root, e))?;
        let is_core_log = entry.file_name().to_str().is_some_and(|n| n.starts_with("core-"));
        if is_core_log && entry.file_type().map_err(|e| io(&root, e))?.is_dir() {
            logs.push(entry.path());
        }
    }
    logs.sort();
    for log in logs {
        let mut segments: Vec<PathBuf> = std::fs::read_dir(&log)
            .map_err(|e| io(&log, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        // Named by base offset, zero-padded: name order is offset order.
        segments.sort();
        for segment in segments {
            let bytes = std::fs::read(&segment).map_err(|e| io(&segment, e))?;
            for record in records_of(&bytes) {
                latest.insert(record.key, record.value);
            }
        }
    }
    let mut groups: GroupOffsets = BTreeMap::new();
    for (key, value) in latest {
        if let Some(value) = value {
            groups.entry(key.group_id.clone()).or_default().push((key, value));
        }
    }
    Ok(Some(groups))
}

/// The offset records of one segment's whole batches, in order.
fn records_of(segment: &[u8]) -> Vec<OffsetRecord> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < segment.len() {
        let Ok(header) = record_batch::validate_framing(&segment[at..], BATCH_BYTES_MAX_LIMIT) else { break };
        let end = at + header.size_bytes;
        if end > segment.len() {
            break;
        }
        if let Ok(records) = record_batch::decode_records(&segment[at..end]) {
            for record in records {
                if let Ok(decoded) = OffsetRecord::decode(record.key.unwrap_or_default(), record.value) {
                    out.push(decoded);
                }
            }
        }
        at = end;
    }
    out
}

/// Imports `groups` through the broker at `bootstrap` on a thread of its
/// own, then renames the old directory (see the module docs).
pub fn spawn_import(data: PathBuf, bootstrap: String, groups: GroupOffsets) {
    let spawned = std::thread::Builder::new().name("import-groups".into()).spawn(move || {
        let started = Instant::now();
        let (mut imported, mut skipped) = (0usize, 0usize);
        for (group, offsets) in &groups {
            let rows: Vec<(String, i32, i64, i32, String)> = offsets
                .iter()
                .map(|(key, value)| {
                    (key.topic.clone(), key.partition, value.offset, value.leader_epoch, value.metadata.clone())
                })
                .collect();
            match import_group(&bootstrap, group, &rows, started) {
                Ok(count) => imported += count,
                Err(GroupAdminError::Kafka { code, .. })
                    if matches!(
                        code,
                        ErrorCode::UnknownMemberId | ErrorCode::IllegalGeneration | ErrorCode::RebalanceInProgress
                    ) =>
                {
                    tracing::warn!(%group, ?code, "the group has active members; its old committed offsets were not imported");
                    skipped += 1;
                }
                Err(err) => {
                    tracing::error!(%group, error = %err, "importing old committed offsets failed; the next start tries again");
                    return;
                }
            }
        }
        let (from, to) = (data.join(LEGACY_DIR), data.join(IMPORTED_DIR));
        if let Err(err) = std::fs::rename(&from, &to) {
            tracing::error!(error = %err, from = %from.display(), "renaming the imported offsets logs failed; the next start imports again (skipping groups that have commits)");
            return;
        }
        tracing::info!(groups = groups.len(), imported, skipped, kept_in = %to.display(), "imported committed offsets from the old per-core logs into {}", crate::constants::OFFSETS_TOPIC);
    });
    if let Err(err) = spawned {
        tracing::error!(error = %err, "cannot start importing old committed offsets");
    }
}

/// One group, retrying what a starting cluster answers while its offsets
/// topic is created and loaded.
fn import_group(
    bootstrap: &str,
    group: &str,
    rows: &[(String, i32, i64, i32, String)],
    started: Instant,
) -> Result<usize, GroupAdminError> {
    loop {
        let attempt = GroupAdmin::connect(bootstrap).and_then(|mut admin| admin.import_offsets(group, rows));
        let retriable = match &attempt {
            Err(GroupAdminError::Client(_)) => true,
            Err(GroupAdminError::Kafka { code, .. }) => matches!(
                code,
                ErrorCode::CoordinatorNotAvailable | ErrorCode::NotCoordinator | ErrorCode::CoordinatorLoadInProgress
            ),
            Ok(_) => false,
        };
        if !retriable || started.elapsed() > IMPORT_PATIENCE {
            return attempt;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record_batch::{encode_batch, ProducerFields, Record};

    fn batch(records: &[OffsetRecord]) -> Vec<u8> {
        let encoded: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let e = r.encode().unwrap();
                Record {
                    key: Some(e.key),
                    value: e.value,
                    headers: Vec::new(),
                    timestamp_delta: 0,
                    offset_delta: i as i32,
                }
            })
            .collect();
        encode_batch(&encoded, 0, ProducerFields::NONE).to_vec()
    }

    fn commit(group: &str, partition: i32, offset: i64) -> OffsetRecord {
        OffsetRecord {
            key: OffsetKey { group_id: group.into(), topic: "t".into(), partition },
            value: Some(CommittedOffset { offset, leader_epoch: -1, metadata: "m".into(), commit_timestamp_ms: 1 }),
        }
    }

    #[test]
    fn the_last_commit_per_key_of_every_core_log_is_read_and_a_torn_tail_ignored() {
        let root = tempfile::tempdir().unwrap();
        assert!(read(root.path()).unwrap().is_none(), "nothing to import in a new directory");
        let core0 = root.path().join(LEGACY_DIR).join("core-0");
        let core1 = root.path().join(LEGACY_DIR).join("core-1");
        std::fs::create_dir_all(&core0).unwrap();
        std::fs::create_dir_all(&core1).unwrap();
        let mut first = batch(&[commit("a", 0, 5), commit("a", 1, 7)]);
        first.extend(batch(&[commit("a", 0, 9)]));
        first.resize(first.len() + 4096, 0);
        std::fs::write(core0.join("00000000000000000000.log"), &first).unwrap();
        let deleted = OffsetRecord { key: commit("b", 0, 0).key, value: None };
        let mut second = batch(&[commit("b", 0, 3), commit("c", 2, 4)]);
        second.extend(batch(&[deleted]));
        let mut torn = batch(&[commit("c", 2, 99)]);
        torn.truncate(torn.len() - 3);
        second.extend(torn);
        std::fs::write(core1.join("00000000000000000000.log"), &second).unwrap();
        let groups = read(root.path()).unwrap().unwrap();
        let offsets = |g: &str| -> Vec<(i32, i64)> {
            groups.get(g).map_or(Vec::new(), |o| o.iter().map(|(k, v)| (k.partition, v.offset)).collect())
        };
        assert_eq!(offsets("a"), vec![(0, 9), (1, 7)]);
        assert_eq!(offsets("b"), vec![], "a tombstone deletes the commit");
        assert_eq!(offsets("c"), vec![(2, 4)], "the torn batch is not read");
    }
}
