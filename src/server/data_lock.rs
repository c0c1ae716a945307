//! The data directory's lock: `<data>/.lock`, held with an exclusive flock
//! for the life of the broker process (Kafka's `.lock`), so that a second
//! broker started on the same directory refuses to start instead of serving
//! the same segment files. The kernel drops the lock when the process ends,
//! however it ends: a kill -9 leaves nothing to clean up. The file holds the
//! holder's pid, for the refusal message only.
//!
//! Nothing else reads the data directory's top level by listing it (topics
//! are found through `metadata.rkyv`), and a partition directory is named
//! `<topic>-<partition>`, which a file named `.lock` never is.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = ".lock";

/// Holds the lock until dropped (`serve` keeps it until it returns).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum DataDirLockError {
    #[error(
        "data directory {dir} is in use by another shardlog process{holder}: {lock} is locked; stop that broker or choose another --data",
        dir = dir.display(),
        lock = lock.display(),
        holder = holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    Held { dir: PathBuf, lock: PathBuf, holder: Option<u32> },
    #[error("data directory {dir}: cannot lock {lock}: {source}", dir = dir.display(), lock = lock.display())]
    Io { dir: PathBuf, lock: PathBuf, source: std::io::Error },
}

impl DataDirLock {
    /// Takes the lock on `dir` (which exists), or says who holds it.
    pub fn acquire(dir: &Path) -> Result<Self, DataDirLockError> {
        let lock = dir.join(LOCK_FILE);
        let io = |source| DataDirLockError::Io { dir: dir.to_path_buf(), lock: lock.clone(), source };
        // Not truncated on open: until we hold the lock, the pid in it is the holder's.
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&lock).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(DataDirLockError::Held { dir: dir.to_path_buf(), holder: read_pid(&mut file), lock });
            }
            Err(TryLockError::Error(source)) => return Err(io(source)),
        }
        // The pid only serves the refusal message: a full disk must not stop a start.
        let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(Self { _file: file })
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = DataDirLock::acquire(dir.path()).expect("first lock");
        match DataDirLock::acquire(dir.path()) {
            Err(DataDirLockError::Held { holder, .. }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("second lock: {other:?}"),
        }
        drop(first);
        DataDirLock::acquire(dir.path()).expect("lock again once released");
    }
}
