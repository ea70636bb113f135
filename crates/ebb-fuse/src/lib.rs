//! A FUSE filesystem whose file data goes through ebb's cache and writeback (built on
//! ebb-runtime): `ebb mount --backend DIR MOUNTPOINT`.
//!
//! The mount serves a namespace ([`ebb_backend::Namespace`]: a local directory with
//! [`ebb_backend::DirNamespace`], the passthrough `ebb mount` uses; an NFS export or an S3
//! bucket with theirs): names, directories, links, permissions and times are the namespace's,
//! file data is read and written through ebb: writes land in ebb's cache, are throttled and
//! written back by ebb's policies, and `stat` reports the size ebb knows. See [`fs`](crate)
//! internals for nodes, threads and the no-double-caching rule.
//!
//! | item | what it is |
//! |---|---|
//! | [`MountConfig`] | mountpoint, memory, knobs, data path |
//! | [`Mount`] | a running mount: stats, stop writes, drain, unmount |
//! | [`run`] | what `ebb mount` does: mount, serve until SIGINT/SIGTERM, drain, unmount |
//! | [`read_stats`], [`read_stats_listing`] | what `ebb stat` does: the live stats of a mount |
//! | [`clear_stale_mount`] | removes the dead mount a crashed `ebb mount` left behind |
//!
//! # Stats
//!
//! A running mount serves its runtime's stats (JSON, the fields of `ebb_runtime`'s stats, and
//! the files with the most dirty data) on a Unix socket of its own, answered by a thread of the
//! mount process without the kernel or the backend (see `stats_socket`: where it is, its
//! permissions, its protocol), so `ebb stat` works however many files are open and while the
//! backend does not answer. The same JSON (with the default list) is the extended attribute
//! [`STATS_XATTR`] (`user.ebb.stats`) of the mount's root directory, for a caller who cannot
//! reach the socket: `getfattr --only-values -n user.ebb.stats MOUNTPOINT`.
//!
//! # Shutdown
//!
//! [`run`] waits for SIGINT or SIGTERM (blocked in every thread and taken with `sigwait` by
//! one). The first makes every write and namespace change fail with `EROFS`, drains all data
//! to the backend printing progress on stderr, then unmounts (lazily if a process still uses
//! the mount). A second signal during the drain unmounts lazily and exits at once with status
//! 1, printing what was not written. If the mount is unmounted from outside (`umount`), the
//! data is drained the same way. A crash (SIGKILL) leaves a dead mount (`ENOTCONN`); the next
//! start finds it in `/proc/self/mountinfo` and detaches it. While it serves, failed
//! write-backs are logged on stderr.

mod connection;
mod data;
mod fs;
mod places;
mod pool;
mod run;
mod runtime;
mod stats_socket;
#[cfg(test)]
mod tests;
mod times;
mod uring;

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use ebb_backend::{DirNamespace, Namespace};

use crate::connection::Connection;
pub use crate::fs::STATS_XATTR;
use crate::fs::{EbbFs, Files, LOOP_THREADS};
pub use crate::places::clear_stale_mount;
use crate::places::{check_memory, check_places, raise_fd_limit};
pub use crate::run::run;
pub use crate::stats_socket::DEFAULT_LISTED_FILES;
use crate::stats_socket::StatsServer;
pub use crate::uring::FuseLoop;

/// What data path a mount uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataMode {
    /// ebb's cache and writeback (the product).
    #[default]
    Ebb,
    /// No cache of ours: positional IO on the namespace's files, which must then use buffered
    /// IO (`DirNamespace::open_buffered`: the kernel's page cache does the caching).
    /// For comparisons and for testing the filesystem on its own.
    Passthrough,
}

/// How to mount.
#[derive(Debug, Clone, Default)]
pub struct MountConfig {
    /// An existing empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Memory budget in bytes: the process's own memory (the code it maps plus 8 MiB and 1/64),
    /// the mount's copies of write requests (an eighth, 0.5 to 20.5 MiB), ebb's IO buffers and
    /// its cache (`None`: the runtime's default cache, the copies beside it).
    pub memory: Option<u64>,
    /// Kernel-named knobs (`dirty_ratio`, `wbt`, ...) and their values, in order.
    pub knobs: Vec<(String, String)>,
    /// The data path.
    pub data: DataMode,
    /// Serve the stats as Prometheus metrics at `http://ADDR/metrics`
    /// (`ebb_runtime::Ebb::serve_metrics`); only with [`DataMode::Ebb`].
    pub metrics: Option<std::net::SocketAddr>,
    /// Write the engine's tracepoint events to this file, at most this many bytes
    /// (`ebb_runtime::Builder::trace`); only with [`DataMode::Ebb`].
    pub trace: Option<(PathBuf, u64)>,
    /// Which loop takes the requests (FUSE over io_uring or `/dev/fuse`); `None`: the one the
    /// environment variable `EBB_FUSE_LOOP` names (`auto`, `uring`, `classic`; so a test suite
    /// runs with either), else [`FuseLoop::Auto`].
    pub fuse_loop: Option<FuseLoop>,
}

/// A mounted filesystem. Dropping it without [`Mount::unmount`] detaches the mount lazily,
/// ends its FUSE connection (a process still using the mount gets `ENOTCONN`, none waits for
/// an answer: see `connection`) and writes nothing back.
pub struct Mount {
    session: Option<fuser::BackgroundSession>,
    /// Ended whenever the mount stops serving while it may still have users.
    connection: Connection,
    /// Serves `ebb stat`; stopped (its socket removed) when the mount is dropped.
    stats_server: Option<StatsServer>,
    files: Arc<Files>,
    mountpoint: PathBuf,
    /// The io_uring queues taking the requests, if they do (`uring`).
    ring: Option<uring::Running>,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("mountpoint", &self.mountpoint).finish_non_exhaustive()
    }
}

impl Mount {
    /// Clears a stale mount at the mountpoint, builds the data path and mounts `namespace`.
    pub fn start<N: Namespace>(config: &MountConfig, namespace: N) -> io::Result<Mount> {
        Mount::start_keeping(config, namespace, fs::ANCHOR_LIMIT)
    }

    /// [`Mount::start`], keeping at most `kept_closed_files` closed files attached to the
    /// cache (so `stat` of them costs no open; `start` keeps 4096). Past that, a closed file
    /// keeps only its cache key and the runtime decides when to write and forget it.
    pub fn start_keeping<N: Namespace>(
        config: &MountConfig,
        namespace: N,
        kept_closed_files: usize,
    ) -> io::Result<Mount> {
        if clear_stale_mount(&config.mountpoint)? {
            eprintln!(
                "ebb mount: cleared a stale mount at {} (left by a crashed ebb)",
                config.mountpoint.display()
            );
        }
        // A mountpoint that is not there is a bad setting (InvalidInput: `ebb mount` exits 2).
        let mountpoint = config.mountpoint.canonicalize().map_err(|error| {
            let kind = match error.kind() {
                io::ErrorKind::NotFound => io::ErrorKind::InvalidInput,
                kind => kind,
            };
            io::Error::new(kind, format!("mountpoint {}: {error}", config.mountpoint.display()))
        })?;
        check_places(namespace.local_directory(), &mountpoint)?;
        let backend = namespace.backend();
        let name = namespace.describe();
        let data: Arc<dyn data::DataPath> = match config.data {
            DataMode::Ebb => {
                if let Some(memory) = config.memory {
                    check_memory(memory)?;
                }
                Arc::new(runtime::EbbData::new(config, &namespace)?)
            }
            DataMode::Passthrough if config.metrics.is_some() || config.trace.is_some() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "metrics and traces are ebb's, which the passthrough data path does not have",
                ));
            }
            DataMode::Passthrough if backend.capabilities().alignment > 1 => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the passthrough data path needs a namespace with buffered files, and \
                         {name}'s use direct IO (DirNamespace::open_buffered)"
                    ),
                ));
            }
            DataMode::Passthrough => Arc::new(data::PassthroughData),
        };
        raise_fd_limit();
        // The closed files attached are not lowered to what the cache's budget holds the state
        // of (`ebb_runtime::Ebb::files_kept_max`): a file detached answers stat with its backend file's
        // ctime, not the one the mount kept, so at `--memory 64MiB` (an attached limit of a few
        // hundred) `tar cf` of a fresh `git clone` saw "file changed as we read it". Until a
        // detached file keeps its times, the limit stays the mount's own.
        let keep_times = config.data == DataMode::Ebb;
        let copies = fs::kept_request_copies(config.memory);
        let fuse_loop = match config.fuse_loop {
            Some(fuse_loop) => fuse_loop,
            None => FuseLoop::from_env()
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?
                .unwrap_or_default(),
        };
        let kept = (kept_closed_files, copies);
        Mount::start_with(namespace, &mountpoint, data, keep_times, kept, fuse_loop)
    }

    /// Mounts `namespace` on `mountpoint` (canonical) with the data path `data`, keeping
    /// `(anchor_limit, kept_copies)`, its requests taken by `fuse_loop`.
    pub(crate) fn start_with<N: Namespace>(
        namespace: N,
        mountpoint: &Path,
        data: Arc<dyn data::DataPath>,
        keep_times: bool,
        (anchor_limit, kept_copies): (usize, usize),
        fuse_loop: FuseLoop,
    ) -> io::Result<Mount> {
        let name = namespace.describe();
        let namespace = Arc::new(namespace);
        let negotiation = Arc::new(uring::Negotiation::default());
        let (fs, files) = EbbFs::new(
            namespace,
            data,
            keep_times,
            anchor_limit,
            kept_copies,
            Arc::clone(&negotiation),
        )?;
        // The rings are made before INIT asks for them (`uring`'s module doc).
        let from_rings = &files.counts.from_rings;
        let prepared = uring::prepare(fuse_loop, fs::MAX_WRITE as usize, &negotiation, from_rings)?;
        let ring_fs = Arc::new(fs.share());
        let mut options = fuser::Config::default();
        options.mount_options = vec![
            fuser::MountOption::FSName(format!("ebb:{name}")),
            // Given to the kernel (fuser keeps `Subtype` for fusermount), so the mount's type
            // is `fuse.ebb` and umount(8) runs /sbin/umount.fuse.ebb, which waits for the drain.
            fuser::MountOption::CUSTOM("subtype=ebb".to_owned()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoAtime,
        ];
        options.acl = fuser::SessionACL::All;
        options.n_threads = Some(LOOP_THREADS);
        options.clone_fd = true;
        let mounting = |error: io::Error| {
            io::Error::new(error.kind(), format!("mounting on {}: {error}", mountpoint.display()))
        };
        let session = fuser::Session::new(fs, mountpoint, &options).map_err(mounting)?;
        let device = session.as_fd().try_clone_to_owned().map_err(mounting)?;
        let dispatcher = session.dispatcher();
        let ring = uring::start(prepared, &negotiation, &device, &dispatcher, &ring_fs)
            .map_err(mounting)?;
        drop(ring_fs);
        files.counts.uring.store(ring.is_some(), std::sync::atomic::Ordering::Relaxed);
        let session = session.spawn().map_err(mounting)?;
        let connection = Connection::new(device, mountpoint);
        // Without its socket the mount still works; `ebb stat` falls back to the attribute.
        let stats_server = StatsServer::start(mountpoint, Arc::downgrade(&files))
            .inspect_err(|error| {
                eprintln!("ebb mount: no stats socket ({error}); `ebb stat` uses the xattr");
            })
            .ok();
        Ok(Mount {
            session: Some(session),
            connection,
            stats_server,
            files,
            mountpoint: mountpoint.to_path_buf(),
            ring,
        })
    }

    /// Plants `bug` in the cache's engine, for a test that checks its checker finds it:
    /// whether it was planted (only with ebb-core's `planted-bugs` feature, and ebb's data
    /// path).
    pub fn plant(&self, bug: ebb_core::CoreBug) -> bool {
        self.files.data.plant(bug)
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The loop taking the requests: [`FuseLoop::Uring`] or [`FuseLoop::Classic`].
    pub fn fuse_loop(&self) -> FuseLoop {
        if self.ring.is_some() { FuseLoop::Uring } else { FuseLoop::Classic }
    }

    /// Requests taken from the io_uring queues so far (0 with the classic loop).
    pub fn ring_requests(&self) -> u64 {
        self.files.counts.from_rings.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The live stats (JSON), as `ebb stat` shows them (listing at most
    /// [`DEFAULT_LISTED_FILES`] files).
    pub fn stats_json(&self) -> String {
        self.files.stats_json(DEFAULT_LISTED_FILES)
    }

    /// From now on every write and namespace change fails with `EROFS`.
    pub fn stop_writes(&self) {
        self.files.stop_writes();
    }

    /// Stops writes and writes everything to the backend, calling `progress` with a summary line and
    /// whether it is the last as it goes. `ErrorKind::TimedOut` naming what is left after
    /// `deadline`.
    pub fn drain(
        &self,
        deadline: Duration,
        progress: &mut dyn FnMut(&str, bool),
    ) -> io::Result<()> {
        self.files.stop_writes();
        self.files.data.drain(deadline, progress)
    }

    /// Failed write-backs to the backend since the start.
    pub fn write_errors(&self) -> u64 {
        self.files.data.write_errors()
    }

    /// The engine's configuration as the mount built it: the knobs and the backend's writeback
    /// settings (`None` with the passthrough data path, which has no cache).
    pub fn engine_config(&self) -> Option<ebb_core::Config> {
        self.files.data.engine_config()
    }

    /// What is not yet written to the backend, one line.
    pub fn unwritten(&self) -> String {
        self.files.data.unwritten()
    }

    /// Whether the kernel side has gone (unmounted from outside).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|session| session.guard.is_finished())
    }

    /// Unmounts (lazily if busy: the processes using it then get `ENOTCONN`), then writes
    /// everything to the backend and makes it durable. Fails only if something could not be
    /// written now; an error that passed (a full backend that has room again) is not a failure.
    pub fn unmount(mut self) -> io::Result<()> {
        let detached = self.unmount_kernel_side()?;
        if let Some(session) = self.session.take() {
            if detached {
                // No process keeps adding to the cache while it is written, nor waits on a
                // mount nobody serves.
                self.connection.end(&self.mountpoint);
                drop(session);
            } else {
                session.join()?;
            }
        }
        // What the sync reports is what decides: everything is in the backend or not. The anchors are
        // ebb's own handles; an error they report at close is one that happened and was
        // reported to the application's handles (or written since), not data left behind.
        let synced = self.files.data.sync();
        self.files.close_anchors();
        synced
    }

    /// Detaches the mount lazily and ends its connection (see `connection`): a process still
    /// using it gets `ENOTCONN`, and none waits for an answer that would never come.
    pub(crate) fn detach(&self) {
        let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
        self.connection.end(&self.mountpoint);
    }

    /// Unmounts; returns whether it had to detach lazily (the mount was busy).
    fn unmount_kernel_side(&self) -> io::Result<bool> {
        if self.is_finished() {
            return Ok(false);
        }
        use rustix::mount::{UnmountFlags, unmount};
        match unmount(&self.mountpoint, UnmountFlags::empty()) {
            Ok(()) => Ok(false),
            Err(rustix::io::Errno::BUSY) => {
                eprintln!(
                    "ebb mount: {} is busy; detaching it (processes using it get errors)",
                    self.mountpoint.display()
                );
                unmount(&self.mountpoint, UnmountFlags::DETACH)?;
                Ok(true)
            }
            Err(rustix::io::Errno::INVAL) => Ok(false),
            Err(errno) => Err(io::Error::new(
                io::Error::from(errno).kind(),
                format!("unmounting {}: {errno}", self.mountpoint.display()),
            )),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stats_server.take();
        if let Some(session) = self.session.take() {
            if !session.guard.is_finished() {
                self.detach();
            } else {
                // The request loops have ended; if not for the connection's end (an error of
                // theirs), nobody would serve it from here on.
                self.connection.end(&self.mountpoint);
            }
            drop(session);
        }
    }
}

/// The live stats of the ebb mount at `mountpoint` (JSON), listing at most
/// [`DEFAULT_LISTED_FILES`] files.
pub fn read_stats(mountpoint: &Path) -> io::Result<String> {
    read_stats_listing(mountpoint, DEFAULT_LISTED_FILES)
}

/// The live stats of the ebb mount at `mountpoint` (JSON), listing at most `listed` files
/// (those with the most dirty data; `files_not_listed` counts the others). From the mount's
/// socket; from the root's extended attribute (with the default list) if this user has no
/// socket for that path.
pub fn read_stats_listing(mountpoint: &Path, listed: usize) -> io::Result<String> {
    if let Some(stats) = stats_socket::read(mountpoint, listed)? {
        return Ok(stats);
    }
    match get_xattr(mountpoint, STATS_XATTR) {
        Ok(value) => String::from_utf8(value)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "stats are not UTF-8")),
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is not the root of an ebb mount", mountpoint.display()),
        )),
        Err(errno) => Err(io::Error::new(
            io::Error::from(errno).kind(),
            format!("reading the stats of {}: {errno}", mountpoint.display()),
        )),
    }
}

/// The value of the extended attribute `name` of `path` (following symlinks).
fn get_xattr(path: &Path, name: &str) -> Result<Vec<u8>, rustix::io::Errno> {
    // The largest value Linux allows (`XATTR_SIZE_MAX`).
    let mut value = Vec::with_capacity(1 << 16);
    rustix::fs::getxattr(path, name, rustix::buffer::spare_capacity(&mut value))?;
    Ok(value)
}
