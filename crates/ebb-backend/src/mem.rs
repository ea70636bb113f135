//! `MemBackend`: files in memory, with an optional two-phase (NFS-like) mode.
//!
//! In the plain mode every write is stable and `sync` has nothing to do. In the two-phase mode
//! each file has two images: `live`, what reads see (the server's cache), and `stable`, what
//! survives a restart. Writes change only `live` and return `Unstable` with the server's
//! verifier; a commit copies its range from `live` to `stable`; [`ServerRestart::restart`]
//! replaces every `live` with its `stable` and changes the verifier. That lets the engine's
//! two-phase path (rewrite after a verifier change) be tested without a server.
//!
//! Locking: the server state (the verifier) is an `RwLock` that every file operation holds
//! shared and a restart holds exclusively, so a write either lands before a restart (and
//! reports the old verifier) or after it; each file image has its own `Mutex`, so writers of
//! different files do not serialise. A poisoned lock is taken over: images are plain bytes and
//! every operation leaves them consistent between statements that could panic (none do).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, Weak};

use crate::backend::{
    Backend, BackendFile, Capabilities, CommitReply, OpenOptions, ServerRestart, Stability,
    WriteReply, check_name, check_request,
};

/// Largest single request, as for [`crate::DirBackend`].
const MAX_IO_BYTES: u64 = 1 << 30;

/// Largest file size; growing a file past it fails with `EFBIG`, so a stray huge offset cannot
/// exhaust memory.
const FILE_BYTES_MAX: u64 = 16 << 30;

/// Files in memory. Cheap to clone: clones share the same files.
#[derive(Clone)]
pub struct MemBackend {
    shared: Arc<Shared>,
}

struct Shared {
    two_phase: bool,
    /// Restart generation (starts at 1); the verifier is derived from it.
    generation: RwLock<u64>,
    names: Mutex<BTreeMap<String, Arc<Mutex<Image>>>>,
    /// Every image ever opened, including removed files still open, for `restart`.
    images: Mutex<Vec<Weak<Mutex<Image>>>>,
}

#[derive(Default)]
struct Image {
    /// What reads see.
    live: Vec<u8>,
    /// What survives a restart (two-phase mode only). Invariant: `stable.len() <= live.len()`.
    stable: Vec<u8>,
}

impl MemBackend {
    /// A backend whose writes are all stable.
    pub fn new() -> MemBackend {
        MemBackend::with_mode(false)
    }

    /// A two-phase backend: writes return `Unstable`, `commit` makes them durable, and
    /// [`Backend::server_restart`] offers a restart that drops uncommitted data.
    pub fn two_phase() -> MemBackend {
        MemBackend::with_mode(true)
    }

    fn with_mode(two_phase: bool) -> MemBackend {
        MemBackend {
            shared: Arc::new(Shared {
                two_phase,
                generation: RwLock::new(1),
                names: Mutex::new(BTreeMap::new()),
                images: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The verifier writes and commits report now (two-phase mode; 0 in the plain mode).
    pub fn verifier(&self) -> u64 {
        self.shared.verifier(&self.shared.server())
    }
}

impl Default for MemBackend {
    fn default() -> MemBackend {
        MemBackend::new()
    }
}

impl fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file_count = lock(&self.shared.names).len();
        f.debug_struct("MemBackend")
            .field("two_phase", &self.shared.two_phase)
            .field("file_count", &file_count)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn server(&self) -> RwLockReadGuard<'_, u64> {
        self.generation.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn verifier(&self, generation: &u64) -> u64 {
        if self.two_phase { mix(*generation) } else { 0 }
    }
}

impl Backend for MemBackend {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        check_name(name)?;
        let _server = self.shared.server();
        let mut names = lock(&self.shared.names);
        let image = match names.get(name) {
            Some(image) => Arc::clone(image),
            None if options.create => {
                let image = Arc::new(Mutex::new(Image::default()));
                names.insert(name.to_owned(), Arc::clone(&image));
                lock(&self.shared.images).push(Arc::downgrade(&image));
                image
            }
            None => return Err(io::Error::from_raw_os_error(libc_errno::ENOENT)),
        };
        drop(names);
        if options.truncate {
            let mut image = lock(&image);
            image.live.clear();
            image.stable.clear();
        }
        Ok(Arc::new(MemFile { name: name.to_owned(), image, shared: Arc::clone(&self.shared) }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        match lock(&self.shared.names).remove(name) {
            Some(_) => Ok(()),
            None => Err(io::Error::from_raw_os_error(libc_errno::ENOENT)),
        }
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        Ok(lock(&self.shared.names).contains_key(name))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            two_phase: self.shared.two_phase,
            direct_io: false,
            alignment: 1,
            max_io_bytes: MAX_IO_BYTES,
            serial_writes: false,
        }
    }

    fn server_restart(&self) -> Option<&dyn ServerRestart> {
        if self.shared.two_phase { Some(self) } else { None }
    }
}

impl ServerRestart for MemBackend {
    fn restart(&self) {
        let mut generation = self.shared.generation.write().unwrap_or_else(PoisonError::into_inner);
        *generation += 1;
        let mut images = lock(&self.shared.images);
        images.retain(|weak| weak.strong_count() > 0);
        for image in images.iter().filter_map(Weak::upgrade) {
            let mut image = lock(&image);
            let stable = image.stable.clone();
            image.live = stable;
        }
    }
}

/// One open file of a [`MemBackend`].
struct MemFile {
    name: String,
    image: Arc<Mutex<Image>>,
    shared: Arc<Shared>,
}

impl fmt::Debug for MemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemFile").field("name", &self.name).finish_non_exhaustive()
    }
}

impl MemFile {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            two_phase: self.shared.two_phase,
            direct_io: false,
            alignment: 1,
            max_io_bytes: MAX_IO_BYTES,
            serial_writes: false,
        }
    }
}

impl BackendFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        check_request(&self.capabilities(), offset, buf.len())?;
        let _server = self.shared.server();
        let image = lock(&self.image);
        let size = image.live.len() as u64;
        if size <= offset {
            return Ok(0);
        }
        // offset < size <= usize::MAX, so these conversions are exact.
        let start = offset as usize;
        let count = buf.len().min(image.live.len() - start);
        buf[..count].copy_from_slice(&image.live[start..start + count]);
        Ok(count)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        check_request(&self.capabilities(), offset, buf.len())?;
        let server = self.shared.server();
        let stability = if self.shared.two_phase {
            Stability::Unstable { verifier: self.shared.verifier(&server) }
        } else {
            Stability::Stable
        };
        if buf.is_empty() {
            // An empty write changes nothing, not even the size (as pwrite of 0 bytes).
            return Ok(WriteReply { stability });
        }
        let mut image = lock(&self.image);
        let end = offset + buf.len() as u64;
        if (image.live.len() as u64) < end {
            grow(&mut image.live, end)?;
        }
        let start = offset as usize;
        image.live[start..start + buf.len()].copy_from_slice(buf);
        Ok(WriteReply { stability })
    }

    fn commit(&self, offset: u64, len: u64) -> io::Result<CommitReply> {
        let server = self.shared.server();
        if self.shared.two_phase {
            let mut image = lock(&self.image);
            let size = image.live.len() as u64;
            let end = if len == 0 { size } else { offset.saturating_add(len).min(size) };
            if offset < end {
                let Image { live, stable } = &mut *image;
                if (stable.len() as u64) < end {
                    stable.resize(end as usize, 0);
                }
                let range = offset as usize..end as usize;
                stable[range.clone()].copy_from_slice(&live[range]);
            }
        }
        Ok(CommitReply { verifier: self.shared.verifier(&server) })
    }

    fn sync(&self) -> io::Result<()> {
        // Committing the whole file (len 0) copies all of `live`, size included, to `stable`.
        self.commit(0, 0)?;
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(lock(&self.image).live.len() as u64)
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        let _server = self.shared.server();
        let mut image = lock(&self.image);
        if (image.live.len() as u64) < size {
            grow(&mut image.live, size)?;
        }
        // A size change is a synchronous metadata operation (NFS SETATTR): both images take it.
        image.live.truncate(size as usize);
        if self.shared.two_phase {
            grow(&mut image.stable, size)?;
            image.stable.truncate(size as usize);
        }
        Ok(())
    }
}

/// Extends `bytes` with zeros to `size` bytes, failing with `EFBIG` past `FILE_BYTES_MAX`
/// and with `ENOMEM` if the memory cannot be reserved.
fn grow(bytes: &mut Vec<u8>, size: u64) -> io::Result<()> {
    if FILE_BYTES_MAX < size {
        return Err(io::Error::from_raw_os_error(libc_errno::EFBIG));
    }
    let size = size as usize;
    if bytes.len() < size {
        bytes
            .try_reserve(size - bytes.len())
            .map_err(|_| io::Error::from_raw_os_error(libc_errno::ENOMEM))?;
        bytes.resize(size, 0);
    }
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A verifier that does not look like a counter (splitmix64 of the generation), so an engine
/// cannot come to rely on verifiers being small or increasing.
fn mix(generation: u64) -> u64 {
    let mut z = generation.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The errno values a memory backend reports, as Linux numbers them (so `raw_os_error` and
/// `kind()` match what a real file would give).
mod libc_errno {
    pub(super) const ENOENT: i32 = rustix::io::Errno::NOENT.raw_os_error();
    pub(super) const ENOMEM: i32 = rustix::io::Errno::NOMEM.raw_os_error();
    pub(super) const EFBIG: i32 = rustix::io::Errno::FBIG.raw_os_error();
}
