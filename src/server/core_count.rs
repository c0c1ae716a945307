//! A restart with another core count (`--cores`). Partitions of cores that
//! no longer run move to the machine's other nodes when it registers
//! (`cluster::control::register_machine`): every core of a machine reads
//! the same data directory, so nothing is copied. Committed consumer-group offsets cannot move that way: a group
//! lives on core `crc32(group) % cores`, in that core's offsets log
//! (`__groups/core-<n>/`), so another count would look for them on another
//! core and not find them. When any offsets log holds data and the count
//! differs from the one that wrote them, the start is refused with the count
//! to use.
//!
//! Runs once in `serve`, before any core starts.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum CoreCountError {
    #[error(
        "the data directory {data} holds committed consumer-group offsets written by {written} cores \
         (a group lives on core crc32(group) % cores); with --cores {cores} they would not be found. \
         Start with --cores {written}"
    )]
    GroupOffsetsPlacedByOtherCount { data: String, written: usize, cores: usize },
    #[error("reading the group offsets logs in {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Refuses a core count other than the one that wrote committed group
/// offsets.
pub fn check_group_offsets(data: &Path, cores: usize) -> Result<(), CoreCountError> {
    let groups = data.join("__groups");
    let (written, with_data) = group_logs(&groups)?;
    if with_data && written != cores {
        return Err(CoreCountError::GroupOffsetsPlacedByOtherCount {
            data: data.display().to_string(),
            written,
            cores,
        });
    }
    Ok(())
}

/// How many cores wrote offsets logs (one past the highest `core-<n>`),
/// and whether any of them holds a record.
fn group_logs(groups: &Path) -> Result<(usize, bool), CoreCountError> {
    let io = |source| CoreCountError::Io { path: groups.display().to_string(), source };
    let entries = match std::fs::read_dir(groups) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, false)),
        Err(e) => return Err(io(e)),
    };
    let (mut written, mut with_data) = (0, false);
    for entry in entries {
        let entry = entry.map_err(io)?;
        // Not a directory: not an offsets log (the core that opens it says
        // what is wrong with it).
        if !entry.file_type().map_err(io)?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        let Some(core) = name.to_str().and_then(|n| n.strip_prefix("core-")).and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        written = written.max(core + 1);
        with_data |= log_has_records(&entry.path()).map_err(io)?;
    }
    Ok((written, with_data))
}

/// Whether any segment of a log starts with a batch: a segment is
/// preallocated with zeros, and a batch's length field (bytes 8..12) is
/// never zero.
fn log_has_records(dir: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let mut head = [0u8; 12];
        let mut file = std::fs::File::open(&path)?;
        let mut filled = 0;
        while filled < head.len() {
            match file.read(&mut head[filled..])? {
                0 => break,
                n => filled += n,
            }
        }
        if filled == head.len() && head[8..12] != [0; 4] {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_dir(root: &Path, core: usize, first_bytes: &[u8]) {
        let dir = root.join("__groups").join(format!("core-{core}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut segment = first_bytes.to_vec();
        segment.resize(4096, 0);
        std::fs::write(dir.join("00000000000000000000.log"), segment).unwrap();
    }

    #[test]
    fn a_changed_count_is_refused_only_when_some_offsets_log_holds_records() {
        let root = tempfile::tempdir().unwrap();
        assert!(check_group_offsets(root.path(), 3).is_ok(), "a fresh directory takes any count");
        log_dir(root.path(), 0, &[]);
        log_dir(root.path(), 1, &[]);
        assert!(check_group_offsets(root.path(), 1).is_ok(), "empty offsets logs hold no group");
        log_dir(root.path(), 1, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 90]);
        let refused = check_group_offsets(root.path(), 1).unwrap_err();
        assert!(refused.to_string().contains("Start with --cores 2"), "{refused}");
        assert!(check_group_offsets(root.path(), 3).is_err(), "more cores move groups too");
        assert!(check_group_offsets(root.path(), 2).is_ok());
    }
}
