//! The storage engine's one door to the file system: every file and
//! directory operation of a log (and of the producer snapshot kept beside
//! it) goes through a `Disk`, so that the same engine runs on the real
//! disk (glommio DMA files, O_DIRECT) or on the simulated one of the fault
//! tests (`sim_disk`), which loses what no fdatasync covered, tears the
//! last write and can corrupt reads, as a power loss and a bad disk do.
//!
//! Lives on the core that owns the log, like the log. The variants are
//! an enum, not a trait object: the hot path (writes, reads, syncs) pays
//! one branch, and the futures stay unboxed.

use std::ops::Deref;
use std::path::Path;
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions, ReadResult};

use super::sim_disk::{SimDisk, SimFile};

/// Where a log keeps its files.
#[derive(Clone, Default)]
pub enum Disk {
    /// The file system, through glommio (O_DIRECT for segments).
    #[default]
    Real,
    /// The fault tests' simulated disk.
    Sim(Rc<SimDisk>),
}

/// An open segment or index file.
pub enum File {
    Dma(DmaFile),
    Sim(SimFile),
}

/// A page-aligned buffer to write with.
pub enum IoBuffer {
    Dma(DmaBuffer),
    Heap(Vec<u8>),
}

/// Bytes a read returned.
pub enum ReadBytes {
    Dma(ReadResult),
    Heap(Vec<u8>),
}

impl Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Dma(read) => read,
            ReadBytes::Heap(bytes) => bytes,
        }
    }
}

impl IoBuffer {
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            IoBuffer::Dma(buffer) => buffer.as_bytes_mut(),
            IoBuffer::Heap(bytes) => bytes,
        }
    }
}

/// The OS's error under a glommio one (the caller names the path).
fn io(err: glommio::GlommioError<()>) -> std::io::Error {
    super::os_error(err)
}

impl File {
    pub async fn read_at(&self, position: u64, len: usize) -> std::io::Result<ReadBytes> {
        match self {
            File::Dma(file) => file.read_at(position, len).await.map(ReadBytes::Dma).map_err(io),
            File::Sim(file) => file.read_at(position, len).map(ReadBytes::Heap),
        }
    }

    pub async fn write_at(&self, buffer: IoBuffer, position: u64) -> std::io::Result<usize> {
        match (self, buffer) {
            (File::Dma(file), IoBuffer::Dma(buffer)) => file.write_at(buffer, position).await.map_err(io),
            (File::Sim(file), IoBuffer::Heap(bytes)) => file.write_at(&bytes, position),
            _ => unreachable!("a buffer is allocated by the file it is written to"),
        }
    }

    /// A zeroed-or-not buffer of `len` bytes (a multiple of the page size)
    /// that this file can write.
    pub fn alloc_buffer(&self, len: usize) -> IoBuffer {
        match self {
            File::Dma(file) => IoBuffer::Dma(file.alloc_dma_buffer(len)),
            File::Sim(_) => IoBuffer::Heap(vec![0; len]),
        }
    }

    /// Allocates the file's blocks up to `size`, growing its size.
    pub async fn pre_allocate(&self, size: u64) -> std::io::Result<()> {
        match self {
            File::Dma(file) => file.pre_allocate(size, false).await.map_err(io),
            File::Sim(file) => file.pre_allocate(size),
        }
    }

    pub async fn truncate(&self, size: u64) -> std::io::Result<()> {
        match self {
            File::Dma(file) => file.truncate(size).await.map_err(io),
            File::Sim(file) => file.truncate(size),
        }
    }

    pub async fn fdatasync(&self) -> std::io::Result<()> {
        match self {
            File::Dma(file) => file.fdatasync().await.map_err(io),
            File::Sim(file) => file.fdatasync(),
        }
    }

    pub async fn file_size(&self) -> std::io::Result<u64> {
        match self {
            File::Dma(file) => file.file_size().await.map_err(io),
            File::Sim(file) => file.file_size(),
        }
    }

    pub async fn close(self) -> std::io::Result<()> {
        match self {
            File::Dma(file) => file.close().await.map_err(io),
            File::Sim(_) => Ok(()),
        }
    }
}

impl Disk {
    /// Opens a segment file for O_DIRECT reads and writes.
    pub async fn open_file(&self, path: &Path, create: bool) -> std::io::Result<File> {
        match self {
            Disk::Real => {
                OpenOptions::new().read(true).write(true).create(create).dma_open(path).await.map(File::Dma).map_err(io)
            }
            Disk::Sim(disk) => disk.open(path, create).map(File::Sim),
        }
    }

    /// Creates `dir` (and its parents) unless it exists.
    pub async fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        match self {
            Disk::Real => {
                // Looked up through io_uring first: after a reboot that
                // lookup reads the disk, on an io-wq worker while the core
                // goes on with other logs (a blocking call here, on the
                // core, made a cold start of ten thousand logs up to 1.5x
                // slower).
                match glommio::io::Directory::open(dir).await.map_err(io) {
                    Ok(opened) => {
                        let _ = opened.close().await;
                        Ok(())
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir),
                    Err(e) => Err(e),
                }
            }
            Disk::Sim(disk) => disk.create_dir_all(dir),
        }
    }

    /// The names in `dir`.
    pub fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        match self {
            Disk::Real => {
                let mut names = Vec::new();
                for entry in std::fs::read_dir(dir)? {
                    if let Ok(name) = entry?.file_name().into_string() {
                        names.push(name);
                    }
                }
                Ok(names)
            }
            Disk::Sim(disk) => Ok(disk.list_dir(dir)),
        }
    }

    /// A small file's content; `None` when it does not exist.
    pub async fn read_small_file(&self, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
        match self {
            Disk::Real => {
                let file = match glommio::io::BufferedFile::open(path).await.map_err(io) {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e),
                };
                let size = file.file_size().await.map_err(io)?;
                // glommio cannot allocate (and panics on) a zero-length read buffer.
                let data =
                    if size == 0 { Vec::new() } else { file.read_at(0, size as usize).await.map_err(io)?.to_vec() };
                file.close().await.map_err(io)?;
                Ok(Some(data))
            }
            Disk::Sim(disk) => disk.read_whole(path),
        }
    }

    /// Replaces `path` with `data` atomically: writes a temporary file
    /// beside it (fdatasynced first when `sync`), then renames it over
    /// `path`. Every step goes through glommio, off the reactor: a core
    /// writes these for thousands of partitions in one pass, and blocking
    /// file calls for each stalled its requests meanwhile.
    pub async fn replace_file(&self, path: &Path, data: Vec<u8>, sync: bool) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        match self {
            Disk::Real => {
                let file = glommio::io::BufferedFile::create(&tmp).await.map_err(io)?;
                file.write_at(data, 0).await.map_err(io)?;
                if sync {
                    file.fdatasync().await.map_err(io)?;
                }
                file.close().await.map_err(io)?;
                glommio::io::rename(&tmp, path).await.map_err(io)
            }
            Disk::Sim(disk) => {
                disk.write_whole(&tmp, &data)?;
                if sync {
                    disk.open(&tmp, false)?.fdatasync()?;
                }
                disk.rename(&tmp, path)
            }
        }
    }

    /// Writes `data` as the whole content of `path` (an index file) with
    /// O_DIRECT, overwriting in place and then cutting to size: truncating
    /// on open freed the file's blocks and the write allocated them again
    /// (ext4 discards freed blocks synchronously where mounted with
    /// `discard`). Not synced: a crash may leave any prefix of it.
    pub async fn write_whole(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        match self {
            Disk::Real => {
                let file = OpenOptions::new().write(true).create(true).dma_open(path).await.map_err(io)?;
                if !data.is_empty() {
                    let aligned = (data.len() as u64).next_multiple_of(super::segment::PAGE_BYTES) as usize;
                    let mut buf = file.alloc_dma_buffer(aligned);
                    let bytes = buf.as_bytes_mut();
                    bytes[..data.len()].copy_from_slice(data);
                    bytes[data.len()..].fill(0);
                    file.write_at(buf, 0).await.map_err(io)?;
                }
                file.truncate(data.len() as u64).await.map_err(io)?;
                file.close().await.map_err(io)
            }
            Disk::Sim(disk) => disk.write_whole(path, data),
        }
    }

    pub async fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        match self {
            Disk::Real => glommio::io::rename(from, to).await.map_err(io),
            Disk::Sim(disk) => disk.rename(from, to),
        }
    }

    /// Removes a file; one that is already gone is not an error.
    pub async fn remove_if_present(&self, path: &Path) -> std::io::Result<()> {
        let removed = match self {
            Disk::Real => glommio::io::remove(path).await.map_err(io),
            Disk::Sim(disk) => disk.remove(path),
        };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes a directory and everything in it.
    pub fn remove_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        match self {
            Disk::Real => std::fs::remove_dir_all(dir),
            Disk::Sim(disk) => {
                disk.remove_dir_all(dir);
                Ok(())
            }
        }
    }

    /// Makes the entries of `dir` (a rename into it) durable.
    pub async fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        match self {
            Disk::Real => {
                let opened = glommio::io::Directory::open(dir).await.map_err(io)?;
                let synced = opened.sync().await.map_err(io);
                let _ = opened.close().await;
                synced
            }
            Disk::Sim(disk) => disk.sync_metadata(),
        }
    }

    pub fn get_xattr(&self, path: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
        match self {
            Disk::Real => xattr::get(path, name),
            Disk::Sim(disk) => disk.get_xattr(path, name),
        }
    }

    pub fn set_xattr(&self, path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
        match self {
            Disk::Real => xattr::set(path, name, value),
            Disk::Sim(disk) => disk.set_xattr(path, name, Some(value)),
        }
    }

    pub fn remove_xattr(&self, path: &Path, name: &str) -> std::io::Result<()> {
        match self {
            Disk::Real => xattr::remove(path, name),
            Disk::Sim(disk) => disk.set_xattr(path, name, None),
        }
    }

    /// Writes a small file whole (the clean marker where the file system
    /// has no user xattrs).
    pub fn write_small_file(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        match self {
            Disk::Real => std::fs::write(path, data),
            Disk::Sim(disk) => disk.write_whole(path, data),
        }
    }

    /// True for the real disk: glommio's per-device probe applies.
    pub fn is_real(&self) -> bool {
        matches!(self, Disk::Real)
    }
}
