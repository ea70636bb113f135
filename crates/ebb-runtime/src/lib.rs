//! The real-time driver of ebb-core: threads, the monotonic clock, real backends, and the
//! public API (open, read, write, fsync, sync, close, drain, stats).
//!
//! ```no_run
//! use std::io::Write;
//! let ebb = ebb_runtime::Builder::new()
//!     .memory(512 << 20)
//!     .knob("dirty_ratio", "20")?
//!     .directory("/srv/data")?
//!     .build()?;
//! let mut f = ebb.open("log", ebb_backend::OpenOptions { create: true, truncate: false })?;
//! f.write_all(b"hello")?;
//! f.fsync()?;
//! f.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The engine decides everything (when writers pause, what the flushers write, which pages
//! reclaim frees, when wbt holds background writes); this crate only carries it out with real
//! threads, real time and real IO. See `shared.rs` for the locks and threads.
#![deny(unsafe_code)]

/// The README's library examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;

/// docs/library.md's examples (the library's guide), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryGuideExamples;

mod alarm;
mod bufpool;
mod device;
mod file;
mod frames;
mod hooks;
mod metrics;
mod outage;
mod pauses;
mod shared;
mod stats;
mod trace;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ebb_backend::{Backend, BackendFile, DirBackend, OpenOptions};
use ebb_core::config::Setting;
use ebb_core::{BackendConfig, BackendId, Config, ConfigError, Engine, Event, PAGE_SIZE, WriterId};
use parking_lot::{Mutex, RwLock};

pub use device::DeviceInfo;

/// Threads that carry out the engine's reads (cache misses and readahead), apart from the IO
/// threads that write: a read never waits behind queued writes for a thread, nor for a buffer
/// a write holds (ebb's own: with S3, eight uploads of 8 MiB parts would otherwise hold every
/// IO thread for tens of milliseconds). Four (ebb's own choice): more reads than that wait
/// for each other, never for writes.
pub const READ_THREADS: usize = 4;
/// The heap a cached file costs the runtime and the engine beside its pages, bytes (the
/// engine's record, page map, file state, one open handle), charged against the budget per file
/// the cache knows (`ebb_core::Config::file_state_bytes`). A release `--memory 64MiB` mount
/// after 3,000 files of 4 KiB: 24.0 MB anonymous, 12.6 MB of it their pages and 1.3 MB the idle
/// process, so 3.4 KB a file; about 2.4 KB here, the rest the mount's (a split estimated from
/// the structures, not measured).
pub const FILE_STATE_BYTES: u64 = 2400;
pub use file::{File, Interrupt, ThrottleStats, TryWrite, WriteAt};
pub use metrics::{MetricsServer, counter_metric, prometheus_name, prometheus_value};
pub use pauses::{BUCKETS_US, PauseStats, RecentPauses};
pub use stats::{DrainProgress, RuntimeStats};

use shared::{BackendSlot, FileKey, FileState, Shared, from_io_error, handle_id};

/// Builds an [`Ebb`]: memory budget, kernel knobs, backends.
pub struct Builder {
    memory: u64,
    /// The caller's own bytes per cached file ([`Builder::file_state_bytes`]).
    caller_file_bytes: u64,
    knobs: Vec<Setting>,
    backends: Vec<AddedBackend>,
    io_threads: usize,
    trace: Option<(std::path::PathBuf, u64)>,
}

/// A backend given to the [`Builder`].
struct AddedBackend {
    name: String,
    backend: Arc<dyn Backend>,
    config: BackendConfig,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// A cache of 256 MiB with the kernel's default knobs and no backend yet.
    pub fn new() -> Builder {
        Builder {
            memory: 256 << 20,
            caller_file_bytes: 0,
            knobs: Vec::new(),
            backends: Vec::new(),
            io_threads: 8,
            trace: None,
        }
    }

    /// The memory budget in bytes: the cache's frames and the IO threads' buffers together never
    /// hold more. At `build` a part is set aside for the buffers (a write copies its run out of
    /// the cache into one; a read fills one): a quarter of the budget, at least the largest
    /// write (rounded up to 512 KiB, or to 2 MiB huge pages for backends with `serial_writes`),
    /// at most one such write per IO thread; 16 MiB of 256 MiB for local directories, 64 MiB
    /// for S3 with 8 MiB parts. The engine gets the rest (its dirty thresholds derive from it),
    /// which must be at least 4 MiB: `build` refuses a smaller budget, naming the numbers.
    /// Reads have a pool of their own beside it when the budget has room: a 64th of the
    /// budget, at most 1 MiB (1 MiB of 256 MiB). Not counted: writers' one-page reads for partial writes (4 KiB each), and the excess of
    /// an S3 part larger than the buffers' part (parts double every 1000 parts of one file),
    /// which is written alone.
    pub fn memory(mut self, bytes: u64) -> Builder {
        self.memory = bytes;
        self
    }

    /// The bytes the caller keeps per file it attached (a FUSE mount's tables): with the
    /// runtime's ([`FILE_STATE_BYTES`]) charged against the budget per file the cache knows.
    pub fn file_state_bytes(mut self, bytes: u64) -> Builder {
        self.caller_file_bytes = bytes;
        self
    }

    /// Sets a knob by its kernel name: any knob of the registry (`ebb_core::config::knobs`:
    /// `dirty_ratio`, `dirty_bytes`, `throttle`, ..., and the per-backend `max_ratio`, `wbt`,
    /// `wbt_lat_usec`, ... applied to every backend); sizes as `ebb_core::config::parse_size` says
    /// (`64M` is 64 MiB, `64MB` 64,000,000 bytes). An unknown name or a malformed or
    /// out-of-range value is refused here; impossible combinations at `build`. Knobs apply in
    /// order, after the builder's other settings (`memory_bytes` replaces [`Builder::memory`]).
    pub fn knob(self, name: &str, value: &str) -> Result<Builder, ConfigError> {
        Ok(self.setting(ebb_core::config::knob(name)?.parse(value)?))
    }

    /// Sets a knob to a value already parsed and checked by the registry (`Knob::parse`).
    pub fn setting(mut self, setting: Setting) -> Builder {
        self.knobs.push(setting);
        self
    }

    /// Adds a backend; the first one is the default of [`Ebb::open`].
    pub fn backend(self, name: &str, backend: Arc<dyn Backend>) -> Builder {
        self.backend_with(name, backend, BackendConfig::new(name))
    }

    /// Adds a backend with explicit writeback settings. A speed the settings do not declare
    /// (`declared_write_bandwidth`) is taken from the backend's own declaration
    /// (`Backend::write_bandwidth`); `initial_write_bandwidth = auto` starts there.
    pub fn backend_with(
        mut self,
        name: &str,
        backend: Arc<dyn Backend>,
        mut config: BackendConfig,
    ) -> Builder {
        let caps = backend.capabilities();
        let max_pages = (caps.max_io_bytes / PAGE_SIZE).clamp(1, 65_536) as u32;
        config.max_write_pages = config.max_write_pages.min(max_pages);
        config.wbt_pace_write_pages = config.wbt_pace_write_pages.min(max_pages);
        config.declared_write_bandwidth =
            config.declared_write_bandwidth.or_else(|| backend.write_bandwidth());
        config.name = name.to_owned();
        let name = name.to_owned();
        self.backends.push(AddedBackend { name, backend, config });
        self
    }

    /// Adds a directory of files written with `O_DIRECT`, named after its path, with the
    /// settings the kernel would give its block device (rotational, write cache, queue depth).
    pub fn directory(self, path: impl AsRef<Path>) -> io::Result<Builder> {
        let path = path.as_ref();
        let backend = DirBackend::open(path)?;
        let name = path.display().to_string();
        let mut config = BackendConfig::new(name.clone());
        DeviceInfo::for_path(path).apply(&mut config);
        Ok(self.backend_with(&name, Arc::new(backend), config))
    }

    /// Adds an S3 bucket, `s3://BUCKET[/PREFIX]` on the server at `endpoint`, named after the
    /// bucket URL: one object per file (see `ebb_backend::s3`), credentials and region from the
    /// AWS environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`, `AWS_REGION`). Errors: the bucket missing (`NotFound`), refused
    /// credentials (`PermissionDenied`), a malformed URL (`InvalidInput`).
    pub fn s3(self, bucket_url: &str, endpoint: &str) -> io::Result<Builder> {
        let options = ebb_backend::S3Options::from_env(bucket_url, endpoint)?;
        self.s3_with(bucket_url, options)
    }

    /// Adds an S3 bucket with explicit options, named `name`. Writes go out a part at a time
    /// (the largest write is one part); writeback throttling is off unless the `wbt` knob asks
    /// for it (`S3Backend::writeback_settings` says why), and then limits the parts in flight.
    pub fn s3_with(self, name: &str, options: ebb_backend::S3Options) -> io::Result<Builder> {
        let backend = ebb_backend::S3Backend::open(options)?;
        Ok(self.s3_backend(name, backend))
    }

    /// Adds an S3 backend the caller opened (and may keep a clone of, for its counters and
    /// uploads), with the settings of [`Builder::s3_with`].
    pub fn s3_backend(self, name: &str, backend: ebb_backend::S3Backend) -> Builder {
        let mut config = BackendConfig::new(name);
        backend.writeback_settings(&mut config);
        self.backend_with(name, Arc::new(backend), config)
    }

    /// Adds the NFSv3 export of `url`, `nfs://HOST[:PORT]/EXPORT[?OPTION=VALUE&...]` (see
    /// `ebb_backend::NfsBackend` for the options), named after the URL. Errors: a malformed URL
    /// (`InvalidInput`), an unreachable server (`ConnectionRefused`, ...), an export the server
    /// refuses to mount (`NotFound`, `PermissionDenied`).
    pub fn nfs(self, url: &str) -> io::Result<Builder> {
        let backend = ebb_backend::NfsBackend::connect(url)?;
        Ok(self.nfs_backend(url, backend))
    }

    /// Adds an NFS backend the caller connected (and may keep a clone of, for its counters),
    /// with the writeback settings the kernel gives an NFS mount's bdi
    /// (`NfsBackend::writeback_settings`: WRITEs of the mount's wsize, no request queue of its
    /// own), and writeback throttling of the WRITEs in flight, which the kernel does not have
    /// (`ebb_backend::network_writeback_throttling`). Its queue depth is kept, not lowered to the IO threads: a writepages
    /// call hands over all its WRITEs, which wait for a thread as the kernel's wait in its RPC
    /// layer.
    pub fn nfs_backend(self, name: &str, backend: ebb_backend::NfsBackend) -> Builder {
        let mut config = BackendConfig::new(name);
        backend.writeback_settings(&mut config);
        self.backend_with(name, Arc::new(backend), config)
    }

    /// IO worker threads (default 8): the most writes and commits in flight to the backends.
    /// Reads have threads of their own ([`READ_THREADS`]), so a read never waits for a thread
    /// behind the writes.
    pub fn io_threads(mut self, n: usize) -> Builder {
        self.io_threads = n.clamp(1, 1024);
        self
    }

    /// Writes the engine's tracepoint events (`balance_dirty_pages`, `bdi_dirty_ratelimit`,
    /// `writeback_*`, `wbt_*`) to `path` in the kernel's text format as the cache runs, at
    /// most `max_bytes` of them (later events are counted in a last line, not written);
    /// `ebb report` draws them. The file is created (truncated) at `build`.
    pub fn trace(mut self, path: impl Into<std::path::PathBuf>, max_bytes: u64) -> Builder {
        self.trace = Some((path.into(), max_bytes));
        self
    }

    /// Starts the cache. Errors: `InvalidInput` naming the knob for impossible settings, or
    /// when no backend was added.
    pub fn build(self) -> io::Result<Ebb> {
        // The IO threads are the backends' request slots as the engine sees them: a write the
        // engine issues beyond them waits in the job queue, counted as writeback (so against
        // the dirty limit) while no device works on it. A device's own queue depth (sysfs
        // nr_requests) only lowers this. A `queue_depth` knob below still overrides it. Not
        // for a backend whose client queues requests itself (NFS): there a writepages call
        // hands over all its WRITEs at once and returns, as the kernel's NFS client does, and
        // the job queue is its RPC layer's queue. The backend declares this itself
        // (`BackendConfig::client_queue`), so every way of adding it (`nfs`, `backend_with`
        // with its `writeback_settings`, a mount's namespace) gives the engine the same depth.
        let slots_max = u32::try_from(self.io_threads).unwrap_or(u32::MAX);
        let mut configs = Vec::with_capacity(self.backends.len());
        let mut slots = Vec::with_capacity(self.backends.len());
        for added in self.backends {
            let mut backend_config = added.config;
            if !backend_config.client_queue {
                backend_config.queue_depth = backend_config.queue_depth.min(slots_max);
            }
            configs.push(backend_config);
            let caps = added.backend.capabilities();
            slots.push(BackendSlot { name: added.name, caps, backend: added.backend });
        }
        let mut configs = configs.into_iter();
        let Some(first) = configs.next() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no backend was added"));
        };
        let mut config = Config::new(self.memory, first);
        config.nr_cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        config.backends.extend(configs);
        config.stage_for_granules();
        config.file_state_bytes = FILE_STATE_BYTES + self.caller_file_bytes;
        for setting in &self.knobs {
            setting.apply(&mut config);
        }
        let buf_bytes = set_aside_buffers(&mut config, &slots, self.io_threads)?;
        config.validate().map_err(config_error)?;
        config.trace = self.trace.is_some();
        let trace = match &self.trace {
            Some((path, max_bytes)) => {
                let names = config.backends.iter().map(|b| b.name.clone()).collect();
                Some(trace::Tracer::create(path, *max_bytes, names)?)
            }
            None => None,
        };
        let clock = std::time::Instant::now();
        let engine = Engine::new(config, ebb_core::Instant::ZERO).map_err(config_error)?;
        let (shared, threads) =
            Shared::start(engine, slots, self.io_threads, buf_bytes, clock, trace);
        Ok(Ebb {
            inner: Arc::new(Inner {
                shared,
                threads: Mutex::new(threads),
                io_threads: self.io_threads,
            }),
        })
    }
}

/// The error of a build whose memory budget cannot hold the IO buffers and the smallest cache
/// (inside an `io::Error` of kind `InvalidInput`): says the smallest budget that works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetTooSmall {
    /// The smallest `memory_bytes` that holds the IO buffers and the smallest cache, bytes.
    pub smallest: u64,
    message: String,
}

impl std::fmt::Display for BudgetTooSmall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BudgetTooSmall {}

/// Sets the IO buffers' part of the memory budget aside ([`bufpool::reserve`]; the largest
/// buffer is the largest write of any backend, in a huge-page buffer for `serial_writes`) and
/// leaves the engine the rest, less the reads' own pool where there is room for one
/// ([`bufpool::read_reserve`]); returns the writes' and the reads' bytes. Errors: `InvalidInput` naming the
/// numbers when the rest is below the smallest cache, 4 MiB.
fn set_aside_buffers(
    config: &mut Config,
    slots: &[BackendSlot],
    io_threads: usize,
) -> io::Result<(usize, usize)> {
    let largest = config
        .backends
        .iter()
        .zip(slots)
        .map(|(b, slot)| {
            let len = (u64::from(b.largest_write_pages()) * PAGE_SIZE) as usize;
            bufpool::alloc_size(len, slot.caps.serial_writes) as u64
        })
        .max()
        .unwrap_or(0);
    let budget = config.memory_bytes;
    let reserve = bufpool::reserve(budget, largest, io_threads);
    const MIN_CACHE: u64 = 4 << 20;
    let fits = |budget: u64| budget >= bufpool::reserve(budget, largest, io_threads) + MIN_CACHE;
    if !fits(budget) {
        // The reserve grows with the budget (a quarter of it, within one and all threads'
        // largest buffers), so the smallest budget that fits is found by trying, page by page.
        let smallest = (1..)
            .map(|pages| pages * PAGE_SIZE)
            .find(|&budget| fits(budget))
            .expect("a budget of the reserve's most plus the smallest cache fits");
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            BudgetTooSmall {
                smallest,
                message: format!(
                    "ebb configuration: memory_bytes: {budget} bytes leave less than the \
                     smallest cache (4 MiB) after {reserve} bytes of IO buffers (the largest \
                     write is {largest} bytes); the budget must be at least {smallest} bytes, \
                     or max_write_pages (or wbt_pace_write_pages) smaller"
                ),
            },
        ));
    }
    let reads = bufpool::read_reserve(budget, reserve, MIN_CACHE);
    config.memory_bytes = budget - reserve - reads;
    Ok((reserve as usize, reads as usize))
}

pub(crate) fn config_error(e: ConfigError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("ebb configuration: {e}"))
}

/// The IO buffers' part of the memory budget ([`Ebb::io_buffers`]), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoBuffers {
    /// Set aside for them at build.
    pub reserved: u64,
    /// The most held at once so far (never above `reserved`).
    pub peak: u64,
}

pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    io_threads: usize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Like an unmount: write everything back (bounded), then stop the threads.
        let _ = drain(&self.shared, std::time::Duration::from_secs(60), &mut |_| {});
        self.shared.stop(self.io_threads);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// A writeback cache in front of one or more backends. Cheap to clone; the cache stops (after
/// writing everything back, for at most a minute) when the last clone and the last [`File`]
/// are dropped. Use [`Ebb::drain`] to bound and watch that.
#[derive(Clone)]
pub struct Ebb {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Ebb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ebb").field("backends", &self.backend_names()).finish()
    }
}

impl Ebb {
    /// A builder.
    pub fn builder() -> Builder {
        Builder::new()
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// The backends' names, the default first.
    pub fn backend_names(&self) -> Vec<String> {
        self.shared().backends.iter().map(|b| b.name.clone()).collect()
    }

    fn backend_id(&self, name: &str) -> io::Result<BackendId> {
        self.shared()
            .backends
            .iter()
            .position(|b| b.name == name)
            .map(|i| BackendId(i as u32))
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("no backend named {name:?}"))
            })
    }

    /// Opens (or creates) the file `name` of the default backend.
    pub fn open(&self, name: &str, opts: OpenOptions) -> io::Result<File> {
        self.open_on(BackendId(0), name, opts)
    }

    /// Opens (or creates) the file `name` of the backend named `backend`.
    pub fn open_in(&self, backend: &str, name: &str, opts: OpenOptions) -> io::Result<File> {
        let b = self.backend_id(backend)?;
        self.open_on(b, name, opts)
    }

    fn open_on(&self, b: BackendId, name: &str, opts: OpenOptions) -> io::Result<File> {
        let slot = &self.shared().backends[b.index()];
        let backend = slot.backend.clone();
        let file = self.open_key(b, FileKey::Name(name.to_owned()), || backend.open(name, opts))?;
        if opts.truncate && !file.is_empty() {
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// A file the caller opened (e.g. a FUSE inode's path, opened with `O_DIRECT`), cached
    /// under `key`: every attach with the same key shares one cached file. `backend` names the
    /// builder backend whose writeback accounting it belongs to.
    pub fn attach(&self, backend: &str, key: u64, file: Arc<dyn BackendFile>) -> io::Result<File> {
        self.attach_with(backend, key, || Ok(file))
    }

    /// Like [`Ebb::attach`], but `open` runs only when no file is cached under `key` yet, so a
    /// caller that opens a descriptor per handle (a FUSE open) opens one per cached file
    /// instead. Its error is returned as is.
    pub fn attach_with(
        &self,
        backend: &str,
        key: u64,
        open: impl FnOnce() -> io::Result<Arc<dyn BackendFile>>,
    ) -> io::Result<File> {
        let b = self.backend_id(backend)?;
        self.open_key(b, FileKey::Id(key), open)
    }

    fn open_key(
        &self,
        b: BackendId,
        key: FileKey,
        opener: impl FnOnce() -> io::Result<Arc<dyn BackendFile>>,
    ) -> io::Result<File> {
        let shared = self.shared();
        let _g = shared.open_lock.lock();
        let known = shared.core.lock().keys.get(&(b, key.clone())).copied();
        let fs = match known.and_then(|inode| shared.file(inode)) {
            Some(fs) => fs,
            None => {
                let file = opener()?;
                let size = file.size()?;
                let mut core = shared.core.lock();
                let inode = ebb_core::InodeId(core.next_inode);
                core.next_inode += 1;
                core.keys.insert((b, key.clone()), inode);
                drop(core);
                let fs = Arc::new(FileState {
                    inode,
                    backend: b,
                    file,
                    map: Mutex::new(ebb_core::PageMap::new()),
                    size: size.into(),
                    size_lock: RwLock::new(()),
                    truncate_lock: Mutex::new(()),
                    padded: false.into(),
                    needs_sync: false.into(),
                    key: (b, key),
                    handles: 0.into(),
                    lane: Mutex::default(),
                    sync_lock: Mutex::new(()),
                    durable: Default::default(),
                    discarded: false.into(),
                });
                shared.files.write().insert(inode, fs.clone());
                fs
            }
        };
        fs.handles.fetch_add(1, Ordering::AcqRel);
        let handle = handle_id(shared);
        let inode = fs.inode;
        shared.enter(|core, maps, now| {
            core.engine.handle(now, Event::Open { handle, inode, backend: b }, maps)
        });
        let writer = WriterId(shared.next_id() as u32);
        Ok(File::new(self.clone(), fs, handle, writer))
    }

    /// Removes the file `name` of the default backend and drops its cached pages; while a handle
    /// is open, that handle keeps the file and its data, as a descriptor of an unlinked file does.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        self.forget(BackendId(0), FileKey::Name(name.to_owned()));
        self.shared().backends[0].backend.remove(name)
    }

    /// The most files a caller should keep attached while nobody has them open: half of
    /// `Engine::files_kept_max` (the other half is for open files), less the runtime's own.
    pub fn files_kept_max(&self) -> u64 {
        let shared = self.shared();
        let core = shared.core.lock();
        (core.engine.files_kept_max() / 2).saturating_sub(core.closed_max as u64)
    }

    /// Forgets the file attached under `key` after its backing file was deleted: its cached
    /// pages, dirty ones included, are dropped (nobody can read them any more) and the key is
    /// free. If a handle of it is still open, only the key is forgotten and the pages stay for
    /// that handle.
    pub fn discard(&self, backend: &str, key: u64) -> io::Result<()> {
        let b = self.backend_id(backend)?;
        self.forget(b, FileKey::Id(key));
        Ok(())
    }

    /// Forgets `key`; if no handle has the file open, drops its cached pages (dirty included)
    /// and, unless writes of it are in flight (the closed-file list forgets it later then),
    /// the file itself.
    fn forget(&self, b: BackendId, key: FileKey) {
        let shared = self.shared();
        let _g = shared.open_lock.lock();
        let inode = shared.core.lock().keys.remove(&(b, key));
        let Some(fs) = inode.and_then(|inode| shared.file(inode)) else { return };
        if fs.handles.load(Ordering::Acquire) > 0 {
            return;
        }
        let inode = fs.inode;
        fs.discarded.store(true, Ordering::Release);
        fs.size.store(0, Ordering::Release);
        shared.enter(|core, maps, now| {
            core.engine.handle(now, Event::Truncate { inode, first_page: 0 }, maps);
            if core.engine.inode_idle(inode) {
                shared.files.write().remove(&inode);
            }
        });
    }

    /// Makes everything dirty now durable, on every backend (`sync(2)`).
    pub fn sync(&self) -> io::Result<()> {
        let shared = self.shared();
        let slot = shared.request(|request| Event::Sync { request });
        let engine_result = slot.wait().map_err(from_io_error);
        sync_files(shared, engine_result)
    }

    /// Stops accepting writes (they fail with `ReadOnlyFilesystem`), writes everything back and
    /// syncs it, calling `progress` about every 100 ms. Fails with `TimedOut` (naming what is
    /// left) past `deadline`, or with the write error that keeps data from the backend.
    pub fn drain(
        &self,
        deadline: std::time::Duration,
        progress: &mut dyn FnMut(&DrainProgress),
    ) -> io::Result<()> {
        drain(self.shared(), deadline, progress)
    }

    /// Plants `bug` in the engine (tests that show a checker finds it); false, planting
    /// nothing, unless ebb-core was built with its `planted-bugs` feature.
    #[doc(hidden)]
    pub fn plant(&self, bug: ebb_core::CoreBug) -> bool {
        self.shared().core.lock().engine.plant(bug)
    }

    /// Checks the engine's accounting as the simulator does after every event
    /// (`Engine::check_accounting`): its counters against a recount of every file's pages, its
    /// frames against the budget. For tests (the swarm over real threads) at a quiet moment: a
    /// writer in the middle of a write makes it an error rather than a wait.
    #[doc(hidden)]
    pub fn check_accounting(&self) -> Result<(), String> {
        self.shared().check_accounting()
    }

    /// The engine's configuration as built: the knobs applied, and each backend's settings
    /// from its device (rotational, queue depth) and capabilities.
    pub fn config(&self) -> Config {
        self.shared().core.lock().engine.config().clone()
    }

    /// The IO buffers' part of the memory budget: the bytes set aside for them (the engine's
    /// memory, [`Config::memory_bytes`] of [`Ebb::config`], is the budget less these) and the
    /// most bytes of buffers held at once so far (the writes' and the reads' pools together).
    pub fn io_buffers(&self) -> IoBuffers {
        let (bufs, reads) = (&self.shared().bufs, &self.shared().read_bufs);
        let reserved = bufs.limit() + reads.limit();
        IoBuffers { reserved: reserved as u64, peak: (bufs.peak() + reads.peak()) as u64 }
    }

    /// The cache's state, shaped like `/proc/meminfo` and `/sys/class/bdi/*/stats`.
    pub fn stats(&self) -> RuntimeStats {
        // Backend counters first: a backend never takes the engine lock, so no order issue,
        // and the engine lock is then held only for the engine's own figures.
        let backend_counters =
            self.shared().backends.iter().map(|b| b.backend.counters()).collect();
        let pauses = self.shared().pauses.lock().stats(std::time::Instant::now());
        let core = self.shared().core.lock();
        stats::collect(&core.engine, backend_counters, pauses)
    }
}

fn drain(
    shared: &Shared,
    deadline: std::time::Duration,
    progress: &mut dyn FnMut(&DrainProgress),
) -> io::Result<()> {
    shared.draining.store(true, Ordering::Release);
    let start = std::time::Instant::now();
    let slot = shared.request(|request| Event::Sync { request });
    let report = |done: bool| {
        let core = shared.core.lock();
        let m = core.engine.meminfo();
        DrainProgress {
            elapsed_ms: start.elapsed().as_millis() as u64,
            dirty_pages: m.dirty,
            writeback_pages: m.writeback,
            unstable_pages: m.unstable,
            written_pages: m.written,
            done,
        }
    };
    let result = loop {
        if let Some(r) = slot.wait_for(std::time::Duration::from_millis(100)) {
            break r;
        }
        let p = report(false);
        progress(&p);
        if start.elapsed() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "drain deadline passed with {} dirty, {} writeback and {} unstable pages not \
                     yet durable",
                    p.dirty_pages, p.writeback_pages, p.unstable_pages
                ),
            ));
        }
    };
    let result = sync_files(shared, result.map_err(from_io_error));
    progress(&report(true));
    result
}

/// Trims and syncs every backend file written since its last sync after the engine's sync
/// answered `engine`; returns the first error of either. A file not written since has nothing
/// to trim (only a write takes a backend file past its logical size) and nothing to sync, so
/// the work is proportional to the files written, not to the files cached (the issue's
/// mount took 14-20 s to drain 11,700 clean files, a size check and a sync mark for each).
/// A file another thread is syncing is visited too: this sync waits for that one.
fn sync_files(shared: &Shared, engine: io::Result<()>) -> io::Result<()> {
    let files: Vec<Arc<FileState>> = shared
        .files
        .read()
        .values()
        .filter(|fs| {
            (fs.needs_sync.load(Ordering::Acquire) || fs.sync_lock.is_locked())
                && !fs.discarded.load(Ordering::Acquire)
        })
        .cloned()
        .collect();
    shared.files_synced.fetch_add(files.len() as u64, Ordering::Relaxed);
    let mut first_err = engine.err();
    let mut each = Vec::new();
    for (b, slot) in shared.backends.iter().enumerate() {
        let of_b: Vec<_> = files.iter().filter(|fs| fs.backend.index() == b).cloned().collect();
        if of_b.len() < SYNC_ALL_FILES {
            each.extend(of_b);
            continue;
        }
        match sync_together(shared, &*slot.backend, &of_b) {
            None => each.extend(of_b),
            Some(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Some(Ok(())) => {}
        }
    }
    for fs in &each {
        if let Err(e) = shared::durable::sync_backend_file(shared, fs) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// From this many files of one backend to sync, [`sync_files`] asks the backend to sync them
/// all in one call ([`Backend::sync_all`]): one `syncfs` is cheaper than their `fsync`s (about
/// 2 ms each on the machine of the issue, whose mount drained 11,700 clean files for 14-20 s)
/// even though it also flushes what others wrote to that filesystem.
const SYNC_ALL_FILES: usize = 16;

/// Syncs `files` of `backend` with one [`Backend::sync_all`], as [`file::sync_backend_file`]
/// does each: trimmed first, each file's sync lock held and its durable mark taken before the
/// call, [`Event::FileSynced`] after it. `None`, having synced nothing, if the backend cannot.
fn sync_together(
    shared: &Shared,
    backend: &dyn Backend,
    files: &[Arc<FileState>],
) -> Option<io::Result<()>> {
    let mut first_err = None;
    let mut trimmed = Vec::new();
    for fs in files {
        match shared::durable::trim_backend_file(fs) {
            Ok(()) => trimmed.push(fs),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    // In inode order, as every caller that holds several takes them.
    let locks: Vec<_> = trimmed.iter().map(|fs| fs.sync_lock.lock()).collect();
    let marks: Vec<u64> = shared
        .enter(|core, _, _| trimmed.iter().map(|fs| core.engine.durable_mark(fs.inode)).collect());
    let swapped: Vec<bool> =
        trimmed.iter().map(|fs| fs.needs_sync.swap(false, Ordering::AcqRel)).collect();
    let result = backend.sync_all();
    if !matches!(result, Some(Ok(()))) {
        for (fs, &was) in trimmed.iter().zip(&swapped) {
            if was {
                fs.needs_sync.store(true, Ordering::Release);
            }
        }
    }
    match result? {
        Ok(()) => {}
        Err(e) => return Some(Err(first_err.unwrap_or(e))),
    }
    shared.enter(|core, maps, now| {
        for (fs, &mark) in trimmed.iter().zip(&marks) {
            core.engine.handle(now, Event::FileSynced { inode: fs.inode, mark }, maps);
        }
    });
    drop(locks);
    for fs in trimmed {
        shared::durable::durable_changed(shared, fs);
    }
    Some(first_err.map_or(Ok(()), Err))
}
