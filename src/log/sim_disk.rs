//! A simulated disk for the storage engine's fault tests: the file system
//! as a power loss leaves it. A log opened on it (`Disk::Sim`) does every
//! file operation here, in memory and at once, so a seeded run is
//! deterministic and fast (thousands of crashes a second).
//!
//! The model, close to ext4 with data=ordered on a drive with a volatile
//! write cache:
//! - A write is visible to reads at once, and durable once an fdatasync
//!   of its file completes. A crash keeps each write that no fdatasync
//!   covered or not, at random, and may tear the last one it keeps at a
//!   4 KiB boundary (the drive wrote some of its pages).
//! - Metadata (a file's name and size, creates, renames, removes,
//!   truncations, extended attributes) goes through the journal in order:
//!   any fdatasync or directory sync commits all of it so far; a crash
//!   keeps exactly what was committed.
//! - `crash_after(n)`: the n-th mutating operation from now and every
//!   operation after it fail, as in a process that died there; `image`
//!   then gives what survives, as a new disk to reopen the log on.
//!
//! Lives on one core with the logs that use it (`Rc`, `RefCell`).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

const PAGE: u64 = 4096;

/// A simulated disk; see the module comment.
pub struct SimDisk {
    state: RefCell<State>,
}

/// A handle on an open simulated file (by inode, as an fd is: a rename
/// or remove of its name does not affect it).
pub struct SimFile {
    disk: Rc<SimDisk>,
    inode: u64,
}

#[derive(Clone, Default)]
struct Inode {
    /// What reads see now.
    data: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
    /// The content as of the last completed fdatasync.
    synced: Vec<u8>,
    /// Since that fdatasync, in order: the writes (each kept or lost by
    /// a crash) and the size changes (kept when committed).
    events: Vec<Event>,
    /// Size and xattrs as of the last journal commit.
    committed_size: u64,
    committed_xattrs: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone)]
enum Event {
    Write { position: u64, bytes: Vec<u8> },
    Resize { size: u64, committed: bool },
}

#[derive(Clone, Default)]
struct State {
    names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    committed_names: BTreeMap<PathBuf, u64>,
    committed_dirs: BTreeSet<PathBuf>,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    /// Mutating operations so far, and the one at which the process dies.
    operations: u64,
    crash_at: Option<u64>,
    crashed: bool,
}

fn crashed_error() -> std::io::Error {
    std::io::Error::other("simulated crash: the process is gone")
}

fn not_found(path: &Path) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotFound, format!("{}: no such file", path.display()))
}

impl SimDisk {
    pub fn new() -> Rc<SimDisk> {
        Rc::new(SimDisk { state: RefCell::new(State::default()) })
    }

    /// The `n`-th mutating operation from now (1 = the next) and all
    /// after it fail.
    pub fn crash_after(&self, n: u64) {
        let mut state = self.state.borrow_mut();
        state.crash_at = Some(state.operations + n.max(1));
    }

    /// True once the simulated process has died.
    pub fn crashed(&self) -> bool {
        self.state.borrow().crashed
    }

    /// Mutating operations done so far.
    pub fn operations(&self) -> u64 {
        self.state.borrow().operations
    }

    /// What a power loss now leaves, as a fresh disk: committed names,
    /// sizes and xattrs; synced data; each unsynced write kept or lost at
    /// random (`seed`), the last one kept possibly torn at a page boundary.
    pub fn image(&self, seed: u64) -> Rc<SimDisk> {
        let mut rng = Lcg(seed ^ 0x9E37_79B9_7F4A_7C15);
        let state = self.state.borrow();
        let mut inodes = BTreeMap::new();
        for (&id, inode) in &state.inodes {
            let mut data = inode.synced.clone();
            let mut size = inode.synced.len() as u64;
            let kept_writes: Vec<usize> = inode
                .events
                .iter()
                .enumerate()
                .filter(|(_, e)| matches!(e, Event::Write { .. }))
                .map(|(i, _)| i)
                .filter(|_| rng.draw().is_multiple_of(2))
                .collect();
            let torn = kept_writes.last().copied().filter(|_| rng.draw().is_multiple_of(3));
            for (i, event) in inode.events.iter().enumerate() {
                match event {
                    Event::Resize { size: new_size, committed: true } => {
                        size = *new_size;
                        data.resize(size as usize, 0);
                    }
                    Event::Resize { .. } => {}
                    Event::Write { position, bytes } if kept_writes.contains(&i) => {
                        let mut bytes = &bytes[..];
                        if torn == Some(i) {
                            let pages = (bytes.len() as u64).div_ceil(PAGE);
                            let keep_pages = rng.draw() % pages.max(1);
                            bytes = &bytes[..((keep_pages * PAGE) as usize).min(bytes.len())];
                        }
                        let end = *position as usize + bytes.len();
                        if data.len() < end {
                            data.resize(end, 0);
                        }
                        data[*position as usize..end].copy_from_slice(bytes);
                    }
                    Event::Write { .. } => {}
                }
            }
            // The size is metadata: what the journal last committed.
            size = if inode.events.is_empty() { size } else { inode.committed_size };
            data.resize(size as usize, 0);
            let image = Inode {
                data: data.clone(),
                xattrs: inode.committed_xattrs.clone(),
                synced: data,
                events: Vec::new(),
                committed_size: size,
                committed_xattrs: inode.committed_xattrs.clone(),
            };
            inodes.insert(id, image);
        }
        let live: BTreeSet<u64> = state.committed_names.values().copied().collect();
        inodes.retain(|id, _| live.contains(id));
        Rc::new(SimDisk {
            state: RefCell::new(State {
                names: state.committed_names.clone(),
                dirs: state.committed_dirs.clone(),
                committed_names: state.committed_names.clone(),
                committed_dirs: state.committed_dirs.clone(),
                inodes,
                next_inode: state.next_inode,
                ..State::default()
            }),
        })
    }

    /// The bytes of the file at `path` now, for tests that damage them.
    pub fn file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.borrow();
        state.names.get(path).map(|id| state.inodes[id].data.clone())
    }

    /// Counts a mutating operation; fails it once the process died.
    fn operate(&self) -> std::io::Result<std::cell::RefMut<'_, State>> {
        let mut state = self.state.borrow_mut();
        if state.crashed {
            return Err(crashed_error());
        }
        state.operations += 1;
        if state.crash_at.is_some_and(|at| state.operations >= at) {
            state.crashed = true;
            return Err(crashed_error());
        }
        Ok(state)
    }

    fn look(&self) -> std::io::Result<std::cell::Ref<'_, State>> {
        let state = self.state.borrow();
        if state.crashed {
            return Err(crashed_error());
        }
        Ok(state)
    }

    pub(crate) fn open(self: &Rc<Self>, path: &Path, create: bool) -> std::io::Result<SimFile> {
        if let Some(&inode) = self.look()?.names.get(path) {
            return Ok(SimFile { disk: self.clone(), inode });
        }
        if !create {
            return Err(not_found(path));
        }
        let mut state = self.operate()?;
        if !path.parent().is_some_and(|dir| state.dirs.contains(dir)) {
            return Err(not_found(path));
        }
        let inode = state.next_inode;
        state.next_inode += 1;
        state.inodes.insert(inode, Inode::default());
        state.names.insert(path.to_path_buf(), inode);
        Ok(SimFile { disk: self.clone(), inode })
    }

    pub(crate) fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        if self.look()?.dirs.contains(dir) {
            return Ok(());
        }
        let mut state = self.operate()?;
        for ancestor in dir.ancestors() {
            state.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    pub(crate) fn list_dir(&self, dir: &Path) -> Vec<String> {
        let state = self.state.borrow();
        state
            .names
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name()?.to_str().map(str::to_string))
            .collect()
    }

    pub(crate) fn read_whole(&self, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
        let state = self.look()?;
        Ok(state.names.get(path).map(|id| state.inodes[id].data.clone()))
    }

    pub(crate) fn write_whole(self: &Rc<Self>, path: &Path, data: &[u8]) -> std::io::Result<()> {
        let file = self.open(path, true)?;
        file.write_at(data, 0)?;
        file.truncate(data.len() as u64)
    }

    pub(crate) fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let mut state = self.operate()?;
        let inode = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    pub(crate) fn remove(&self, path: &Path) -> std::io::Result<()> {
        let mut state = self.operate()?;
        state.names.remove(path).map(|_| ()).ok_or_else(|| not_found(path))
    }

    pub(crate) fn remove_dir_all(&self, dir: &Path) {
        if let Ok(mut state) = self.operate() {
            state.names.retain(|path, _| !path.starts_with(dir));
            state.dirs.retain(|path| !path.starts_with(dir));
        }
    }

    /// A journal commit: every metadata change so far becomes durable.
    pub(crate) fn sync_metadata(&self) -> std::io::Result<()> {
        let mut state = self.operate()?;
        commit(&mut state);
        Ok(())
    }

    pub(crate) fn get_xattr(&self, path: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
        let state = self.look()?;
        let id = state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(state.inodes[id].xattrs.get(name).cloned())
    }

    pub(crate) fn set_xattr(&self, path: &Path, name: &str, value: Option<&[u8]>) -> std::io::Result<()> {
        let mut state = self.operate()?;
        let id = *state.names.get(path).ok_or_else(|| not_found(path))?;
        let xattrs = &mut state.inodes.get_mut(&id).expect("a named inode exists").xattrs;
        match value {
            Some(value) => {
                xattrs.insert(name.to_string(), value.to_vec());
            }
            None => {
                xattrs.remove(name).ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENODATA))?;
            }
        }
        Ok(())
    }
}

fn commit(state: &mut State) {
    state.committed_names = state.names.clone();
    state.committed_dirs = state.dirs.clone();
    for inode in state.inodes.values_mut() {
        inode.committed_size = inode.data.len() as u64;
        inode.committed_xattrs = inode.xattrs.clone();
        for event in &mut inode.events {
            if let Event::Resize { committed, .. } = event {
                *committed = true;
            }
        }
    }
}

impl SimFile {
    fn with_inode<T>(&self, mutate: bool, f: impl FnOnce(&mut Inode) -> T) -> std::io::Result<T> {
        let mut state = if mutate {
            self.disk.operate()?
        } else {
            drop(self.disk.look()?);
            self.disk.state.borrow_mut()
        };
        Ok(f(state.inodes.get_mut(&self.inode).expect("an open file's inode exists")))
    }

    pub(crate) fn read_at(&self, position: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.with_inode(false, |inode| {
            let start = (position as usize).min(inode.data.len());
            let end = (start + len).min(inode.data.len());
            inode.data[start..end].to_vec()
        })
    }

    pub(crate) fn write_at(&self, bytes: &[u8], position: u64) -> std::io::Result<usize> {
        self.with_inode(true, |inode| {
            let end = position as usize + bytes.len();
            if inode.data.len() < end {
                inode.data.resize(end, 0);
                inode.events.push(Event::Resize { size: end as u64, committed: false });
            }
            inode.data[position as usize..end].copy_from_slice(bytes);
            inode.events.push(Event::Write { position, bytes: bytes.to_vec() });
            bytes.len()
        })
    }

    pub(crate) fn pre_allocate(&self, size: u64) -> std::io::Result<()> {
        self.with_inode(true, |inode| {
            if (inode.data.len() as u64) < size {
                inode.data.resize(size as usize, 0);
                inode.events.push(Event::Resize { size, committed: false });
            }
        })
    }

    pub(crate) fn truncate(&self, size: u64) -> std::io::Result<()> {
        self.with_inode(true, |inode| {
            inode.data.resize(size as usize, 0);
            inode.events.push(Event::Resize { size, committed: false });
        })
    }

    /// Makes this file's data durable, and commits the journal.
    pub(crate) fn fdatasync(&self) -> std::io::Result<()> {
        let mut state = self.disk.operate()?;
        commit(&mut state);
        let inode = state.inodes.get_mut(&self.inode).expect("an open file's inode exists");
        inode.synced = inode.data.clone();
        inode.events.clear();
        Ok(())
    }

    pub(crate) fn file_size(&self) -> std::io::Result<u64> {
        self.with_inode(false, |inode| inode.data.len() as u64)
    }
}

/// The simulator's own generator (so a seed means the same run on every
/// machine and version of any crate).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn draw(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(name: &str) -> PathBuf {
        PathBuf::from("/sim").join(name)
    }

    #[test]
    fn a_crash_keeps_synced_writes_and_committed_names_only() {
        let disk = SimDisk::new();
        disk.create_dir_all(Path::new("/sim")).unwrap();
        let kept = disk.open(&path("kept"), true).unwrap();
        kept.write_at(b"durable", 0).unwrap();
        kept.fdatasync().unwrap();
        let lost = disk.open(&path("lost"), true).unwrap();
        lost.write_at(b"never synced, never named", 0).unwrap();
        for seed in 0..50 {
            let image = disk.image(seed);
            assert_eq!(image.file(&path("kept")).unwrap(), b"durable");
            assert!(image.file(&path("lost")).is_none(), "its name was never committed");
        }
    }

    #[test]
    fn an_unsynced_write_may_or_may_not_survive_and_a_kept_one_may_be_torn() {
        let disk = SimDisk::new();
        disk.create_dir_all(Path::new("/sim")).unwrap();
        let file = disk.open(&path("f"), true).unwrap();
        file.pre_allocate(4 * PAGE).unwrap();
        file.fdatasync().unwrap();
        file.write_at(&[7u8; 3 * PAGE as usize], 0).unwrap();
        let mut outcomes = BTreeSet::new();
        for seed in 0..200 {
            let image = disk.image(seed).file(&path("f")).unwrap();
            assert_eq!(image.len() as u64, 4 * PAGE, "the size was committed");
            outcomes.insert(image.iter().take_while(|b| **b == 7).count() as u64 / PAGE);
        }
        assert!(outcomes.contains(&0) && outcomes.contains(&3), "{outcomes:?}");
        assert!(outcomes.iter().any(|pages| *pages == 1 || *pages == 2), "torn somewhere: {outcomes:?}");
    }

    #[test]
    fn the_crash_point_fails_that_operation_and_every_later_one() {
        let disk = SimDisk::new();
        disk.create_dir_all(Path::new("/sim")).unwrap();
        let file = disk.open(&path("f"), true).unwrap();
        disk.crash_after(2);
        file.write_at(b"one", 0).unwrap();
        assert!(file.fdatasync().is_err());
        assert!(disk.crashed());
        assert!(file.read_at(0, 3).is_err());
        assert_eq!(disk.image(1).file(&path("f")), None, "the create was never committed");
    }
}
