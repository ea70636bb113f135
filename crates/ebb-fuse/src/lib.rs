//! A FUSE filesystem whose file data goes through ebb's cache and writeback (built on
//! ebb-runtime): `ebb mount --backend DIR MOUNTPOINT`.
//!
//! The mount is a passthrough of DIR (names, directories, links, permissions and times are
//! DIR's own), except that file data is read and written through ebb: writes land in ebb's
//! cache, are throttled and written back by ebb's policies, and `stat` reports the size ebb
//! knows. See [`fs`](crate) internals for inodes, threads and the no-double-caching rule.
//!
//! | item | what it is |
//! |---|---|
//! | [`MountConfig`] | DIR, mountpoint, memory, knobs |
//! | [`Mount`] | a running mount: stats, stop writes, drain, unmount |
//! | [`run`] | what `ebb mount` does: mount, serve until SIGINT/SIGTERM, drain, unmount |
//! | [`read_stats`] | what `ebb stat` does: the live stats of a mount |
//! | [`clear_stale_mount`] | removes the dead mount a crashed `ebb mount` left behind |
//!
//! # Stats
//!
//! A running mount serves its runtime's stats (JSON, the fields of `ebb_runtime`'s stats) as
//! the extended attribute [`STATS_XATTR`] (`user.ebb.stats`) of the mount's root directory:
//! `getfattr --only-values -n user.ebb.stats MOUNTPOINT` shows the same as `ebb stat`.
//!
//! # Shutdown
//!
//! [`run`] waits for SIGINT or SIGTERM (blocked in every thread and taken with `sigwait` by
//! one). The first makes every write and namespace change fail with `EROFS`, drains all data
//! to DIR printing progress on stderr, then unmounts (lazily if a process still uses the
//! mount). A second signal during the drain unmounts lazily and exits at once with status 1,
//! printing what was not written. If the mount is unmounted from outside (`umount`), the data
//! is drained the same way. A crash (SIGKILL) leaves a dead mount (`ENOTCONN`); the next
//! start finds it in `/proc/self/mountinfo` and detaches it.

mod data;
mod fs;
mod pool;
mod runtime;
#[cfg(test)]
mod tests;
mod times;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{RecvTimeoutError, unbounded};
use nix::sys::signal::{SigSet, Signal};

pub use crate::fs::STATS_XATTR;
use crate::fs::{EbbFs, LOOP_THREADS, Shared};

/// What data path a mount uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataMode {
    /// ebb's cache and writeback (the product).
    #[default]
    Ebb,
    /// No cache of ours: positional buffered IO on the backing files (the kernel's page cache
    /// of DIR does the caching). For comparisons and for testing the filesystem on its own.
    Passthrough,
}

/// How to mount.
#[derive(Debug, Clone, Default)]
pub struct MountConfig {
    /// The directory whose files the mount serves and writes to.
    pub backend: PathBuf,
    /// An existing empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Cache budget in bytes (`None`: the runtime's default).
    pub memory: Option<u64>,
    /// Kernel-named knobs (`dirty_ratio`, `wbt`, ...) and their values, in order.
    pub knobs: Vec<(String, String)>,
    /// The data path.
    pub data: DataMode,
}

/// A mounted filesystem. Dropping it without [`Mount::unmount`] detaches the mount lazily and
/// writes nothing back.
pub struct Mount {
    session: Option<fuser::BackgroundSession>,
    shared: Arc<Shared>,
    mountpoint: PathBuf,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("mountpoint", &self.mountpoint).finish_non_exhaustive()
    }
}

impl Mount {
    /// Clears a stale mount at the mountpoint, builds the data path and mounts.
    pub fn start(config: &MountConfig) -> io::Result<Mount> {
        Mount::start_keeping(config, fs::ANCHOR_LIMIT)
    }

    /// [`Mount::start`], keeping at most `kept_closed_files` closed files attached to the
    /// cache (so `stat` of them costs no open; `start` keeps 4096). Past that, a closed file
    /// keeps only its cache key and the runtime decides when to write and forget it.
    pub fn start_keeping(config: &MountConfig, kept_closed_files: usize) -> io::Result<Mount> {
        let backend = config.backend.canonicalize().map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("backend directory {}: {error}", config.backend.display()),
            )
        })?;
        if !backend.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("backend {} is not a directory", backend.display()),
            ));
        }
        if clear_stale_mount(&config.mountpoint)? {
            eprintln!(
                "ebb mount: cleared a stale mount at {} (left by a crashed ebb)",
                config.mountpoint.display()
            );
        }
        let mountpoint = config.mountpoint.canonicalize().map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("mountpoint {}: {error}", config.mountpoint.display()),
            )
        })?;
        check_places(&backend, &mountpoint)?;
        if config.data == DataMode::Ebb
            && let Some(memory) = config.memory
        {
            check_memory(memory)?;
        }
        raise_fd_limit();
        let data: Arc<dyn data::DataPath> = match config.data {
            DataMode::Ebb => Arc::new(runtime::EbbData::new(&backend, config)?),
            DataMode::Passthrough => Arc::new(data::PassthroughData),
        };
        Mount::start_with(&backend, &mountpoint, data, kept_closed_files)
    }

    /// Mounts `backend` on `mountpoint` (both canonical) with the data path `data`.
    pub(crate) fn start_with(
        backend: &Path,
        mountpoint: &Path,
        data: Arc<dyn data::DataPath>,
        anchor_limit: usize,
    ) -> io::Result<Mount> {
        let (fs, shared) = EbbFs::new(backend, data, anchor_limit)?;
        let mut options = fuser::Config::default();
        options.mount_options = vec![
            fuser::MountOption::FSName(format!("ebb:{}", backend.display())),
            fuser::MountOption::Subtype("ebb".to_owned()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoAtime,
        ];
        options.acl = fuser::SessionACL::All;
        options.n_threads = Some(LOOP_THREADS);
        options.clone_fd = true;
        let session = fuser::Session::new(fs, mountpoint, &options)
            .and_then(fuser::Session::spawn)
            .map_err(|error| {
                io::Error::new(
                    error.kind(),
                    format!("mounting on {}: {error}", mountpoint.display()),
                )
            })?;
        Ok(Mount { session: Some(session), shared, mountpoint: mountpoint.to_path_buf() })
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The live stats (JSON), as `ebb stat` shows them.
    pub fn stats_json(&self) -> String {
        self.shared.data.stats_json()
    }

    /// From now on every write and namespace change fails with `EROFS`.
    pub fn stop_writes(&self) {
        self.shared.stop_writes();
    }

    /// Stops writes and writes everything to DIR, calling `progress` with a summary line and
    /// whether it is the last as it goes. `ErrorKind::TimedOut` naming what is left after
    /// `deadline`.
    pub fn drain(
        &self,
        deadline: Duration,
        progress: &mut dyn FnMut(&str, bool),
    ) -> io::Result<()> {
        self.shared.stop_writes();
        self.shared.data.drain(deadline, progress)
    }

    /// Failed write-backs to DIR since the start.
    pub fn write_errors(&self) -> u64 {
        self.shared.data.write_errors()
    }

    /// What is not yet written to DIR, one line.
    pub fn unwritten(&self) -> String {
        self.shared.data.unwritten()
    }

    /// Whether the kernel side has gone (unmounted from outside).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|session| session.guard.is_finished())
    }

    /// Unmounts (lazily if busy), then writes everything to DIR and makes it durable. Fails
    /// only if something could not be written now; an error that passed (a full backend that
    /// has room again) is not a failure.
    pub fn unmount(mut self) -> io::Result<()> {
        let detached = self.unmount_kernel_side()?;
        if let Some(session) = self.session.take() {
            if detached {
                drop(session);
            } else {
                session.join()?;
            }
        }
        // What the sync reports is what decides: everything is in DIR or not. The anchors are
        // ebb's own handles; an error they report at close is one that happened and was
        // reported to the application's handles (or written since), not data left behind.
        let synced = self.shared.data.sync();
        self.shared.close_anchors();
        synced
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
        if let Some(session) = self.session.take() {
            if !session.guard.is_finished() {
                let _ =
                    rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
            }
            drop(session);
        }
    }
}

/// Refuses a mountpoint that is not a directory, and one inside the backend directory (the
/// mount would serve itself: a lookup of the mountpoint through the mount waits for the mount,
/// and both request loops deadlock). Both paths are canonical.
fn check_places(backend: &Path, mountpoint: &Path) -> io::Result<()> {
    if !mountpoint.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("mountpoint {} is not a directory", mountpoint.display()),
        ));
    }
    if mountpoint.starts_with(backend) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "mountpoint {} is inside the backend directory {}: the mount would contain \
                 itself; mount outside the backend",
                mountpoint.display(),
                backend.display()
            ),
        ));
    }
    Ok(())
}

/// Refuses a cache budget larger than the memory this machine has available now
/// (`MemAvailable` in `/proc/meminfo`): the cache fills its budget before it reclaims, so a
/// budget past that ends with the OOM killer. Without `/proc/meminfo` nothing is checked.
fn check_memory(memory: u64) -> io::Result<()> {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else { return Ok(()) };
    let Some(available) = meminfo_bytes(&meminfo, "MemAvailable") else { return Ok(()) };
    if memory > available {
        let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a memory budget of {:.1} GiB (--memory) is more than this machine has \
                 available ({:.1} GiB, MemAvailable in /proc/meminfo); give at most that",
                gib(memory),
                gib(available)
            ),
        ));
    }
    Ok(())
}

/// The value of the `/proc/meminfo` line `field` in bytes (the file says kB, meaning KiB).
fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    })
}

/// If `mountpoint` holds a FUSE mount whose server is gone (`ENOTCONN`), detaches it and
/// returns `true`. A live FUSE mount there is an error (`AlreadyExists`); no mount, `false`.
pub fn clear_stale_mount(mountpoint: &Path) -> io::Result<bool> {
    let absolute = absolute_without_following(mountpoint)?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let fuse_here = mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(separator) = fields.iter().position(|&field| field == "-") else {
            return false;
        };
        fields.get(4).is_some_and(|&at| unescape_mountinfo(at) == absolute.as_os_str())
            && fields.get(separator + 1).is_some_and(|fstype| fstype.starts_with("fuse"))
    });
    if !fuse_here {
        return Ok(false);
    }
    match std::fs::metadata(&absolute) {
        Err(error) if error.raw_os_error() == Some(libc::ENOTCONN) => {
            rustix::mount::unmount(&absolute, rustix::mount::UnmountFlags::DETACH)?;
            Ok(true)
        }
        _ => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} is already a live FUSE mount; unmount it first (umount {0})",
                absolute.display()
            ),
        )),
    }
}

/// `path` made absolute with its parent canonicalized but its last component not followed
/// (a stale mountpoint cannot be resolved).
fn absolute_without_following(path: &Path) -> io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => Ok(parent.canonicalize()?.join(name)),
        _ => Ok(absolute),
    }
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\'
            && index + 3 < bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[index + 1..index + 4], 8)
        {
            out.push(value);
            index += 4;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// Open files hold a descriptor each (plus one per cached file): take the hard limit.
fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

/// The live stats of the ebb mount at `mountpoint` (JSON).
pub fn read_stats(mountpoint: &Path) -> io::Result<String> {
    match fs::get_xattr(mountpoint, std::ffi::OsStr::new(STATS_XATTR)) {
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

/// Says on stderr when write-backs to DIR fail, at most once per [`ErrorLog::EVERY`]: the
/// applications learn of them at fsync and close, the operator from this.
#[derive(Default)]
struct ErrorLog {
    reported: u64,
    last: Option<Instant>,
}

impl ErrorLog {
    const EVERY: Duration = Duration::from_secs(10);

    /// Logs new failures unless the last line is recent.
    fn check(&mut self, mount: &Mount, backend: &Path) {
        if self.last.is_some_and(|last| last.elapsed() < ErrorLog::EVERY) {
            return;
        }
        self.flush(mount, backend);
    }

    /// Logs new failures now.
    fn flush(&mut self, mount: &Mount, backend: &Path) {
        let errors = mount.write_errors();
        if errors > self.reported {
            eprintln!(
                "ebb mount: {} failed write-backs to {} ({errors} since the start; the data stays \
                 in the cache, applications get the error at fsync and close, `ebb stat` shows \
                 the state)",
                errors - self.reported,
                backend.display()
            );
            self.reported = errors;
            self.last = Some(Instant::now());
        }
    }
}

/// How long a drain may take before `run` gives up and reports what is left.
const DRAIN_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// What [`run`] waits for.
enum Event {
    Signal(Signal),
    Drained(io::Result<()>),
}

/// Mounts, serves until SIGINT/SIGTERM or an outside unmount, drains and unmounts. Returns
/// `Ok` when everything was written to DIR; exits the process with status 1 on a second signal.
pub fn run(config: &MountConfig) -> io::Result<()> {
    // Block the signals before any thread starts, so every thread inherits the mask and only
    // the sigwait thread below receives them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block().map_err(io::Error::from)?;
    let mount = Arc::new(Mount::start(config)?);
    eprintln!(
        "ebb mount: {} on {} (ctrl-c or SIGTERM drains to {} and unmounts)",
        config.backend.display(),
        mount.mountpoint().display(),
        config.backend.display()
    );
    let (sender, events) = unbounded();
    let signal_sender = sender.clone();
    std::thread::Builder::new().name("ebb-signals".to_owned()).spawn(move || {
        while let Ok(signal) = signals.wait() {
            if signal_sender.send(Event::Signal(signal)).is_err() {
                break;
            }
        }
    })?;
    let mut draining = false;
    let mut errors = ErrorLog::default();
    let start_drain = |reason: &str| {
        eprintln!("ebb mount: {reason}: writes stopped, draining to {}", config.backend.display());
        let mount = Arc::clone(&mount);
        let sender = sender.clone();
        std::thread::Builder::new().name("ebb-drain".to_owned()).spawn(move || {
            let mut last = Instant::now() - Duration::from_secs(1);
            let result = mount.drain(DRAIN_DEADLINE, &mut |line, done| {
                if done || last.elapsed() >= Duration::from_millis(500) {
                    eprintln!("ebb mount: drain: {line}");
                    last = Instant::now();
                }
            });
            drop(mount);
            let _ = sender.send(Event::Drained(result));
        })
    };
    loop {
        match events.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::Signal(signal)) if !draining => {
                draining = true;
                start_drain(&format!("{signal}"))?;
            }
            Ok(Event::Signal(signal)) => {
                eprintln!(
                    "ebb mount: {signal} again: exiting now; not written to DIR: {}",
                    mount.unwritten()
                );
                let _ =
                    rustix::mount::unmount(mount.mountpoint(), rustix::mount::UnmountFlags::DETACH);
                std::process::exit(1);
            }
            Ok(Event::Drained(result)) => {
                errors.flush(&mount, &config.backend);
                if let Err(error) = result {
                    eprintln!(
                        "ebb mount: drain failed: {error}; not written: {}",
                        mount.unwritten()
                    );
                    let _ = rustix::mount::unmount(
                        mount.mountpoint(),
                        rustix::mount::UnmountFlags::DETACH,
                    );
                    return Err(error);
                }
                break;
            }
            Err(RecvTimeoutError::Timeout) => {
                errors.check(&mount, &config.backend);
                if !draining && mount.is_finished() {
                    draining = true;
                    start_drain("unmounted from outside")?;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let mount = Arc::into_inner(mount)
        .ok_or_else(|| io::Error::other("the mount is still in use after the drain"))?;
    let mountpoint = mount.mountpoint().to_path_buf();
    mount.unmount()?;
    eprintln!("ebb mount: everything written; {} unmounted", mountpoint.display());
    Ok(())
}
