//! `SimBackend`: an [`ebb_backend::Backend`] whose storage semantics are a simulator device
//! model's, with the file bytes held in memory.
//!
//! The timing models in [`crate::device`] only move byte counts through virtual time; this
//! backend is their other half: real bytes, with exactly the durability the model gives them,
//! so the engine (or the runtime) can be run against "a SATA disk" or "an NFS server" and a
//! crash checked for what it loses. It does **not** sleep for the model's latencies and keeps
//! no clock: every call completes at once. Timing is the simulator's job.
//!
//! Each file has two images: `live`, what reads see (the device's cache or the server's
//! memory plus its disk), and `durable`, what survives a power cut or a server restart.
//!
//! | model kind | a completed write is | made durable by | lost by |
//! |---|---|---|---|
//! | disk, flash, RAID-0 | `Stable`, in the volatile write cache (or on the media if the cache cannot take it, see [`DeviceParams::write_landing`]) | `sync`/`commit` (a cache flush: every file's cached writes) | [`SimBackend::power_cut`] |
//! | `nfs-server` | `Unstable` with the server's verifier, in server memory | `commit`/`sync` (a COMMIT: every received write, as the model's server does) | [`ServerRestart::restart`] (or `power_cut`), which also changes the verifier |
//!
//! The two-phase rules are not restated here: every WRITE, COMMIT and restart goes through the
//! model's own [`NfsServerState`], and the write-cache admission rule is the block model's
//! ([`DeviceParams::write_landing`]). What this module adds is copying bytes from `live` to
//! `durable` for the writes those rules declare durable, and back on a loss.
//!
//! Simplifications: a size change (`set_size`, `open` with `truncate`) is synchronous
//! metadata, applied to both images at once (an NFS SETATTR is; a local filesystem's journal
//! would make it durable at the next sync, which the contract allows either way). A power cut
//! loses every cached write, the worst case the contract allows (a real drive may have
//! destaged some on its own). One mutex guards the whole device, so a restart or power cut is
//! atomic with respect to IO; this backend is for semantics, not throughput.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ebb_backend::{
    Backend, BackendFile, Capabilities, CommitReply, OpenOptions, ServerRestart, Stability,
    WriteReply, check_name, check_request,
};

use crate::device::{
    self, DeviceError, DeviceParams, NfsServerState, NfsStats, ReceivedWrite, WriteLanding,
};

/// Largest single request, as for `ebb_backend::MemBackend`.
const MAX_IO_BYTES: u64 = 1 << 30;

/// Largest file size; growing a file past it fails with `EFBIG`, so a stray huge offset cannot
/// exhaust memory.
const FILE_BYTES_MAX: u64 = 16 << 30;

/// The seed of the device model, which picks the NFS server's first verifier.
const SEED: u64 = 0;

/// Linux errno values, so `raw_os_error` and `kind()` match what a real file would give.
const ENOENT: i32 = 2;
const ENOMEM: i32 = 12;
const EFBIG: i32 = 27;

/// Files in memory with the durability of a simulator device model; see the module doc.
/// Cheap to clone: clones share the same device and files.
#[derive(Clone)]
pub struct SimBackend {
    shared: Arc<Shared>,
}

struct Shared {
    device: String,
    params: DeviceParams,
    state: Mutex<State>,
}

struct State {
    names: BTreeMap<String, u64>,
    /// Every file with a name or an open handle, by file number.
    files: BTreeMap<u64, Image>,
    next_file: u64,
    durability: Durability,
}

enum Durability {
    /// A block device: writes in its volatile write cache, oldest first.
    WriteCache(Vec<ReceivedWrite>),
    /// A two-phase server, by the `nfs-server` model's rules.
    Server(NfsServerState),
}

#[derive(Default)]
struct Image {
    /// What reads see.
    live: Vec<u8>,
    /// What survives a power cut or server restart.
    durable: Vec<u8>,
    /// Open handles.
    handles: usize,
    /// Whether a name refers to it (false after `remove`).
    linked: bool,
}

impl SimBackend {
    /// A backend with the storage semantics of the named device model (one of
    /// [`device::MODEL_NAMES`]: `sata-2010`, `nfs-server`, ...) and its documented parameters.
    /// An unknown name is an error that names it and lists the known models.
    pub fn for_device(name: &str) -> Result<SimBackend, DeviceError> {
        SimBackend::for_device_with_overrides(name, &toml::Table::new())
    }

    /// As [`SimBackend::for_device`], with model parameters replaced as an experiment file's
    /// `[devices]` overrides do (for example `write_cache_bytes = 0` for a disk without a
    /// write cache); unknown fields and unusable values are errors naming them.
    pub fn for_device_with_overrides(
        name: &str,
        overrides: &toml::Table,
    ) -> Result<SimBackend, DeviceError> {
        let params = device::by_name_with_overrides(name, SEED, overrides)?.params().clone();
        let durability = match params {
            DeviceParams::Nfs(_) => Durability::Server(NfsServerState::new(SEED)),
            DeviceParams::Disk(_) | DeviceParams::Flash(_) | DeviceParams::Raid0(_) => {
                Durability::WriteCache(Vec::new())
            }
        };
        let state =
            State { names: BTreeMap::new(), files: BTreeMap::new(), next_file: 0, durability };
        Ok(SimBackend {
            shared: Arc::new(Shared { device: name.to_owned(), params, state: Mutex::new(state) }),
        })
    }

    /// The device model's name.
    pub fn device(&self) -> &str {
        &self.shared.device
    }

    /// Cuts the power: a block device loses every write not yet flushed by `sync`/`commit`
    /// (writes it took through to the media stay); an NFS server restarts (as
    /// [`ServerRestart::restart`]). Open handles stay valid and read what survived.
    pub fn power_cut(&self) {
        let mut state = self.shared.lock();
        match &mut state.durability {
            Durability::WriteCache(cached) => cached.clear(),
            Durability::Server(server) => server.restart(),
        }
        for image in state.files.values_mut() {
            image.live.clone_from(&image.durable);
        }
    }

    /// The server's counters (verifier, restarts, durable, uncommitted and lost bytes) for the
    /// `nfs-server` model; `None` for block devices.
    pub fn nfs_stats(&self) -> Option<NfsStats> {
        match &self.shared.lock().durability {
            Durability::Server(server) => Some(server.stats()),
            Durability::WriteCache(_) => None,
        }
    }

    fn two_phase(&self) -> bool {
        matches!(self.shared.params, DeviceParams::Nfs(_))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Taken over when poisoned: every operation leaves the images consistent between
        // statements that could panic (none do).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            two_phase: matches!(self.params, DeviceParams::Nfs(_)),
            direct_io: false,
            alignment: 1,
            max_io_bytes: MAX_IO_BYTES,
            serial_writes: false,
        }
    }
}

impl State {
    /// Copies the named writes from `live` to `durable` (files removed and closed since are
    /// skipped; bytes trimmed by a later `set_size` are no longer there to copy).
    fn make_durable(&mut self, writes: &[ReceivedWrite]) -> io::Result<()> {
        for write in writes {
            let Some(image) = self.files.get_mut(&write.file) else { continue };
            let end = (write.offset + write.len).min(image.live.len() as u64);
            if write.offset < end {
                grow(&mut image.durable, end)?;
                let range = write.offset as usize..end as usize;
                image.durable[range.clone()].copy_from_slice(&image.live[range]);
            }
        }
        Ok(())
    }

    /// A cache flush or a COMMIT: returns the verifier the reply carries (0 for a block device).
    fn flush(&mut self) -> io::Result<u64> {
        match &mut self.durability {
            Durability::WriteCache(cached) => {
                let cached = std::mem::take(cached);
                self.make_durable(&cached)?;
                Ok(0)
            }
            Durability::Server(server) => {
                // The fsync of a synchronous COMMIT cannot overlap a restart: both hold the lock.
                let commit = server.begin_commit();
                let done = server.finish_commit(commit);
                self.make_durable(&done.durable)?;
                Ok(done.verifier)
            }
        }
    }
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file_count = self.shared.lock().names.len();
        f.debug_struct("SimBackend")
            .field("device", &self.shared.device)
            .field("file_count", &file_count)
            .finish_non_exhaustive()
    }
}

impl Backend for SimBackend {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        check_name(name)?;
        let mut state = self.shared.lock();
        let file = match state.names.get(name) {
            Some(&file) => file,
            None if options.create => {
                let file = state.next_file;
                state.next_file += 1;
                state.names.insert(name.to_owned(), file);
                state.files.insert(file, Image { linked: true, ..Image::default() });
                file
            }
            None => return Err(io::Error::from_raw_os_error(ENOENT)),
        };
        let image = state.files.get_mut(&file).expect("a named file has an image");
        image.handles += 1;
        if options.truncate {
            image.live.clear();
            image.durable.clear();
        }
        Ok(Arc::new(SimFile { name: name.to_owned(), file, shared: Arc::clone(&self.shared) }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        let mut state = self.shared.lock();
        let file = state.names.remove(name).ok_or_else(|| io::Error::from_raw_os_error(ENOENT))?;
        let image = state.files.get_mut(&file).expect("a named file has an image");
        image.linked = false;
        if image.handles == 0 {
            state.files.remove(&file);
        }
        Ok(())
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        Ok(self.shared.lock().names.contains_key(name))
    }

    fn capabilities(&self) -> Capabilities {
        self.shared.capabilities()
    }

    fn server_restart(&self) -> Option<&dyn ServerRestart> {
        if self.two_phase() { Some(self) } else { None }
    }
}

impl ServerRestart for SimBackend {
    /// Restarts the NFS server (the same as [`SimBackend::power_cut`]).
    fn restart(&self) {
        self.power_cut();
    }
}

/// One open file of a [`SimBackend`].
struct SimFile {
    name: String,
    file: u64,
    shared: Arc<Shared>,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile")
            .field("device", &self.shared.device)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl SimFile {
    fn image<'a>(&self, state: &'a mut State) -> &'a mut Image {
        state.files.get_mut(&self.file).expect("an open file has an image")
    }
}

impl BackendFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        check_request(&self.shared.capabilities(), offset, buf.len())?;
        let mut state = self.shared.lock();
        let live = &self.image(&mut state).live;
        if live.len() as u64 <= offset {
            return Ok(0);
        }
        // offset < live.len() <= usize::MAX, so these conversions are exact.
        let start = offset as usize;
        let count = buf.len().min(live.len() - start);
        buf[..count].copy_from_slice(&live[start..start + count]);
        Ok(count)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        check_request(&self.shared.capabilities(), offset, buf.len())?;
        let mut state = self.shared.lock();
        let stability = |state: &State| match &state.durability {
            Durability::WriteCache(_) => Stability::Stable,
            Durability::Server(server) => Stability::Unstable { verifier: server.verifier() },
        };
        if buf.is_empty() {
            // An empty write changes nothing, not even the size (as pwrite of 0 bytes).
            return Ok(WriteReply { stability: stability(&state) });
        }
        let len = buf.len() as u64;
        let end = offset + len;
        let image = self.image(&mut state);
        grow(&mut image.live, end)?;
        let range = offset as usize..end as usize;
        image.live[range.clone()].copy_from_slice(buf);
        let write = ReceivedWrite { file: self.file, offset, len };
        match (self.shared.params.write_landing(len), &mut state.durability) {
            (WriteLanding::Media, _) => {
                let image = self.image(&mut state);
                grow(&mut image.durable, end)?;
                image.durable[range].copy_from_slice(buf);
            }
            (_, Durability::WriteCache(cached)) => cached.push(write),
            (_, Durability::Server(server)) => {
                server.receive(write);
            }
        }
        Ok(WriteReply { stability: stability(&state) })
    }

    fn commit(&self, _offset: u64, _len: u64) -> io::Result<CommitReply> {
        // The model's COMMIT (and a cache flush) covers the whole device, so any range does.
        let verifier = self.shared.lock().flush()?;
        Ok(CommitReply { verifier })
    }

    fn sync(&self) -> io::Result<()> {
        // Sizes are synchronous here, so a flush of every write makes the size durable too.
        self.shared.lock().flush()?;
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        let mut state = self.shared.lock();
        Ok(self.image(&mut state).live.len() as u64)
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        let mut state = self.shared.lock();
        let image = self.image(&mut state);
        for bytes in [&mut image.live, &mut image.durable] {
            grow(bytes, size)?;
            bytes.truncate(size as usize);
        }
        Ok(())
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let image = self.image(&mut state);
        image.handles -= 1;
        if !image.linked && image.handles == 0 {
            state.files.remove(&self.file);
        }
    }
}

/// Extends `bytes` with zeros to `size` bytes (no change if already that long), failing with
/// `EFBIG` past `FILE_BYTES_MAX` and with `ENOMEM` if the memory cannot be reserved.
fn grow(bytes: &mut Vec<u8>, size: u64) -> io::Result<()> {
    if FILE_BYTES_MAX < size {
        return Err(io::Error::from_raw_os_error(EFBIG));
    }
    let size = size as usize;
    if bytes.len() < size {
        bytes.try_reserve(size - bytes.len()).map_err(|_| io::Error::from_raw_os_error(ENOMEM))?;
        bytes.resize(size, 0);
    }
    Ok(())
}
