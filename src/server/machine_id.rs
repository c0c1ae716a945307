//! This machine's id in the cluster (issue 29): kept in `machine.id` in the
//! data directory, made at first start (or taken from `--machine-id`), and
//! never changed after. A `--machine-id` that disagrees with the kept one is
//! refused: the data directory belongs to the machine that wrote it.

use std::path::Path;

use crate::cluster::MachineId;

pub const FILE_NAME: &str = "machine.id";

#[derive(Debug, thiserror::Error)]
pub enum MachineIdError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} does not hold a machine id (a positive integer): {text:?}")]
    Damaged { path: String, text: String },
    #[error(
        "--machine-id {given} does not match machine {kept} that wrote {path}; a data directory keeps its machine id"
    )]
    Mismatch { given: u64, kept: u64, path: String },
    #[error("--machine-id must be 1 ..= 2147483647 (Kafka's replica ids are int32)")]
    Zero,
}

/// The id kept in `data`, or `given`, or a new random one; written to
/// `data` (fsynced) when it was not there.
pub fn load_or_create(data: &Path, given: Option<u64>) -> Result<MachineId, MachineIdError> {
    let path = data.join(FILE_NAME);
    let shown = path.display().to_string();
    let io = |source| MachineIdError::Io { path: shown.clone(), source };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let kept = text
                .trim()
                .parse::<u64>()
                .ok()
                .and_then(MachineId::new)
                .ok_or_else(|| MachineIdError::Damaged { path: shown.clone(), text: text.clone() })?;
            match given {
                Some(given) if given != kept.get() => {
                    Err(MachineIdError::Mismatch { given, kept: kept.get(), path: shown.clone() })
                }
                _ => Ok(kept),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = match given {
                Some(given) if given > i32::MAX as u64 => return Err(MachineIdError::Zero),
                Some(given) => MachineId::new(given).ok_or(MachineIdError::Zero)?,
                None => random_id(),
            };
            let tmp = data.join(format!("{FILE_NAME}.tmp"));
            std::fs::write(&tmp, format!("{id}\n")).map_err(io)?;
            std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            std::fs::File::open(data).and_then(|d| d.sync_all()).map_err(io)?;
            Ok(id)
        }
        Err(e) => Err(io(e)),
    }
}

/// A random id that fits Kafka's int32 replica ids (DescribeQuorum names
/// the quorum's voters by machine id): below 2^31.
fn random_id() -> MachineId {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut z = nanos ^ (u64::from(std::process::id()) << 32);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    MachineId::new((z & (i32::MAX as u64)).max(1)).expect("not zero")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_made_once_kept_and_a_different_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let made = load_or_create(dir.path(), None).unwrap();
        assert_eq!(load_or_create(dir.path(), None).unwrap(), made);
        assert_eq!(load_or_create(dir.path(), Some(made.get())).unwrap(), made);
        let refused = load_or_create(dir.path(), Some(made.get() + 1)).unwrap_err();
        assert!(matches!(refused, MachineIdError::Mismatch { .. }), "{refused}");

        let other = tempfile::tempdir().unwrap();
        assert_eq!(load_or_create(other.path(), Some(7)).unwrap().get(), 7);
        assert!(matches!(load_or_create(tempfile::tempdir().unwrap().path(), Some(0)), Err(MachineIdError::Zero)));
        std::fs::write(other.path().join(FILE_NAME), "seven").unwrap();
        assert!(matches!(load_or_create(other.path(), None), Err(MachineIdError::Damaged { .. })));
    }
}
