//! The data path of the mount: where file bytes go between a FUSE request and the backend.
//!
//! The filesystem code ([`crate::fs`]) sees only the two small traits here. `EbbData`
//! (`crate::runtime`) puts ebb's runtime in between (the product); [`PassthroughData`] reads and
//! writes the backend's files directly (with a namespace whose files use buffered IO, the
//! kernel's page cache does the caching and keeps the times right), which is what the mount
//! used before the runtime existed and what the tests use to check the filesystem logic on its
//! own.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use ebb_backend::BackendFile;
pub(crate) use ebb_runtime::Interrupt;

/// Opens a file's data path (the namespace's `open_file`, wrapped to keep its times).
pub(crate) type Opener<'a> = &'a dyn Fn() -> io::Result<Arc<dyn BackendFile>>;

/// A cache that backing files are attached to.
pub(crate) trait DataPath: Send + Sync {
    /// A new handle on the cached file `key`, whose backend file `open` opens (called only
    /// when the file is not cached yet). Every handle with the same key shares one cached file.
    fn attach(&self, key: u64, open: Opener<'_>) -> io::Result<Box<dyn DataFile>>;
    /// Writes every dirty byte to the backing files and makes it durable.
    fn sync(&self) -> io::Result<()>;
    /// Stops new writes, writes everything, calling `progress` with a one-line summary and
    /// whether it is the last as it goes; `ErrorKind::TimedOut` (naming what is left) after
    /// `deadline`.
    fn drain(&self, deadline: Duration, progress: &mut dyn FnMut(&str, bool)) -> io::Result<()>;
    /// What is not yet written, one line (for the message of a forced exit).
    fn unwritten(&self) -> String;
    /// The cache's statistics as a JSON object.
    fn stats_json(&self) -> String;
    /// Failed write-backs to the backing files so far (for the mount's log).
    fn write_errors(&self) -> u64 {
        0
    }
    /// The engine's configuration as built (knobs, backend settings); `None` for a data path
    /// without ebb's cache.
    fn engine_config(&self) -> Option<ebb_core::Config> {
        None
    }
    /// The backing file attached under `key` was deleted and nothing has it open: drop its
    /// cached data (dirty data included) instead of writing it back.
    fn discard(&self, _key: u64) {}
    /// Plants `bug` in the cache's engine (tests of checkers; ebb-core's `planted-bugs`
    /// feature): whether it was planted.
    fn plant(&self, _bug: ebb_core::CoreBug) -> bool {
        false
    }
    /// How long a request may wait for the backend before `EIO` (the backend's
    /// `retry_timeout_secs`; see [`crate::fs::outage`]).
    fn retry_timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    /// The backend's own per-try timeout (NFS `timeo`, S3's per-read timeout; `None`: it has
    /// none): a request unanswered longer is evidence of an outage ([`crate::fs::outage`]).
    fn try_timeout(&self) -> Option<Duration> {
        None
    }
    /// A request to the backend failed with `error` (`first`: when the request's first failed
    /// try began, `started`: this one, `failures`: how many failed before): the outage rule's
    /// answer on the backend's one clock where the data path keeps it (ebb's engine, whose
    /// write-back runs the same clock); `None` where it keeps none (the mount's own decides).
    fn request_failed(
        &self,
        _error: ebb_core::IoError,
        _first: std::time::Instant,
        _started: std::time::Instant,
        _failures: u32,
    ) -> Option<ebb_core::outage::Next> {
        None
    }
    /// A request to the backend succeeded (see [`DataPath::request_failed`]).
    fn request_succeeded(&self) {}
    /// A request to the backend begun at `started` still waits for its answer: whether the
    /// data path keeps the backend's clock (and counted it there).
    fn request_waiting(&self, _started: std::time::Instant) -> bool {
        false
    }
    /// Whether the backend has been unreachable for its deadline, on the clock the data path
    /// keeps (`None`: it keeps none).
    fn backend_unreachable(&self) -> Option<bool> {
        None
    }
}

/// A file's line in `ebb stat` (see [`DataFile::report`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FileReport {
    /// The last write-back error, as text (`None`: none ever).
    pub(crate) error: Option<String>,
    /// Write-back errors so far.
    pub(crate) errors: u64,
    /// Whether no handle has been told of the last error yet.
    pub(crate) error_unseen: bool,
    /// Dirty pages, held ones included.
    pub(crate) dirty_pages: u64,
    /// Dirty pages held by an error that will not pass.
    pub(crate) held_pages: u64,
    /// Its close or backend sync failed: ebb commits it once it is written back.
    pub(crate) commit_owed: bool,
    /// Throttle pauses of the handle's writer, and their percentiles in microseconds.
    pub(crate) pauses: u64,
    pub(crate) pause_us_p50: u64,
    pub(crate) pause_us_p99: u64,
    pub(crate) pause_us_max: u64,
    /// Time the writer spent paused or waiting, microseconds.
    pub(crate) stalled_us: u64,
}

impl FileReport {
    /// The report as JSON, for the file with node id `ino`.
    pub(crate) fn to_json(&self, ino: u64) -> serde_json::Value {
        serde_json::json!({
            "ino": ino,
            "error": self.error,
            "errors": self.errors,
            "error_unseen": self.error_unseen,
            "dirty_pages": self.dirty_pages,
            "held_pages": self.held_pages,
            "commit_owed": self.commit_owed,
            "pauses": self.pauses,
            "pause_us_p50": self.pause_us_p50,
            "pause_us_p99": self.pause_us_p99,
            "pause_us_max": self.pause_us_max,
            "stalled_us": self.stalled_us,
        })
    }
}

/// One handle on a cached file. Reads see every write made through any handle of the file.
pub(crate) trait DataFile: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// A read for a caller that opened the file with `O_DIRECT`: around the cache, from the
    /// backing file, unless the cache holds a newer copy of the range. `offset` and `buf.len()`
    /// are multiples of 4096; bytes past the backing file's end are not filled.
    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// May sleep (dirty throttling).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    fn set_len(&self, size: u64) -> io::Result<()>;
    /// The size the cache knows, which may be ahead of the backing file's.
    fn len(&self) -> io::Result<u64>;
    fn fsync(&self) -> io::Result<()>;
    /// Closes the handle, reporting a write error not yet reported to it.
    fn close(self: Box<Self>) -> io::Result<()>;
    /// One step of a write that does not block ([`ebb_runtime::File::poll_write_at`]): some
    /// bytes copied, or `Pending` with `cx`'s waker woken when the write may go on. Default:
    /// the whole write, blocking (no throttle to wait on without a thread).
    fn poll_write_at(
        &self,
        buf: &[u8],
        offset: u64,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<usize>> {
        std::task::Poll::Ready(self.write_at(buf, offset))
    }
    /// [`DataFile::poll_write_at`] for a request loop, which must not block: `None` (nothing
    /// more written) where the step would block ([`ebb_runtime::File::try_poll_write_at`]).
    /// Default: always `None`.
    fn try_poll_write_at(
        &self,
        _buf: &[u8],
        _offset: u64,
        _cx: &mut std::task::Context<'_>,
    ) -> Option<std::task::Poll<io::Result<usize>>> {
        None
    }
    /// [`DataFile::read_at`] for a request loop, which must not block: `Some` with the bytes
    /// read when the cache holds the whole range ([`ebb_runtime::File::try_read_at`]), `None`
    /// where the read would wait (`buf` may then hold some bytes). Default: always `None`.
    fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> Option<usize> {
        None
    }
    /// [`DataFile::read_at`], giving up when `interrupted` says so while it waits.
    fn read_at_interruptible(
        &self,
        buf: &mut [u8],
        offset: u64,
        _interrupted: Interrupt<'_>,
    ) -> io::Result<usize> {
        self.read_at(buf, offset)
    }
    /// [`DataFile::fsync`], giving up with `ErrorKind::Interrupted` when `interrupted` says
    /// so while it waits.
    fn fsync_interruptible(&self, _interrupted: Interrupt<'_>) -> io::Result<()> {
        self.fsync()
    }
    /// What `ebb stat` shows of this handle's file: write errors, unwritten pages, and this
    /// handle's throttle pauses. Default: nothing (no cache).
    fn report(&self) -> Option<FileReport> {
        None
    }
    /// The runtime's file behind this handle, if it is one (`ebb stat` takes the reports
    /// of many under one engine lock: [`reports`]).
    fn ebb_file(&self) -> Option<&ebb_runtime::File> {
        None
    }
    /// Makes the cached bytes of `offset..offset + len` zeros, then calls `backend` (which
    /// punches or zeroes the backend's range); no read in flight meanwhile brings the bytes
    /// from before back into the cache. Default: only `backend` (no cache).
    fn zero_range(
        &self,
        _offset: u64,
        _len: u64,
        backend: &mut dyn FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        backend()
    }
    /// Whether the cache holds nothing of the file the backend lacks. Default: true (no cache).
    fn is_clean(&self) -> bool {
        true
    }
    /// Someone else changed the backing file: the cache drops its copies of the backend's
    /// bytes, keeping the data the backend lacks ([`ebb_runtime::File::backend_changed`]).
    /// Default: nothing (no cache).
    fn backend_changed(&self) -> io::Result<()> {
        Ok(())
    }
    /// Reports a write error not yet reported to this handle, without closing it.
    fn check_error(&self) -> io::Result<()> {
        Ok(())
    }
    /// What `close(2)` of one descriptor does: [`DataFile::check_error`], or on a backend that
    /// flushes on close, a write-back and commit of the file as fsync does.
    fn flush(&self, _interrupted: Interrupt<'_>) -> io::Result<()> {
        self.check_error()
    }
    /// Whether [`DataFile::flush`] and [`DataFile::close`] write the file back (a backend that
    /// flushes on close: NFS, S3), so may wait for the backend. Default: false.
    fn close_writes_back(&self) -> bool {
        false
    }
}

/// No cache of ours: positional IO on the backend's file.
#[derive(Debug, Default)]
pub(crate) struct PassthroughData;

impl DataPath for PassthroughData {
    fn attach(&self, _key: u64, open: Opener<'_>) -> io::Result<Box<dyn DataFile>> {
        Ok(Box::new(PassthroughFile(open()?)))
    }

    fn sync(&self) -> io::Result<()> {
        rustix::fs::sync();
        Ok(())
    }

    fn drain(&self, _deadline: Duration, progress: &mut dyn FnMut(&str, bool)) -> io::Result<()> {
        progress("passthrough: nothing of ours to drain; syncing the kernel's cache", true);
        self.sync()
    }

    fn unwritten(&self) -> String {
        "passthrough: no data of ours is held; the kernel's cache may be dirty".to_owned()
    }

    fn stats_json(&self) -> String {
        "{\"data_path\": \"passthrough\"}".to_owned()
    }
}

struct PassthroughFile(Arc<dyn BackendFile>);

impl DataFile for PassthroughFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.0.write_at(buf, offset)?;
        Ok(buf.len())
    }

    fn set_len(&self, size: u64) -> io::Result<()> {
        self.0.set_size(size)
    }

    fn len(&self) -> io::Result<u64> {
        self.0.size()
    }

    fn fsync(&self) -> io::Result<()> {
        self.0.sync()
    }

    fn close(self: Box<Self>) -> io::Result<()> {
        Ok(())
    }
}

/// A file's line in `ebb stat` from its errors and pages (`File::errors`) and its handle's
/// throttle pauses.
pub(crate) fn report_of(
    file: &ebb_runtime::File,
    errors: Option<ebb_core::FileErrors>,
) -> FileReport {
    let errors = errors.unwrap_or_default();
    let throttle = file.throttle_stats();
    FileReport {
        error: errors.error.map(|e| io::Error::from_raw_os_error(e.errno).to_string()),
        errors: errors.count,
        error_unseen: errors.unseen,
        dirty_pages: errors.dirty_pages,
        held_pages: errors.held_pages,
        commit_owed: errors.commit_owed,
        pauses: throttle.pauses,
        pause_us_p50: throttle.pause_us_p50,
        pause_us_p99: throttle.pause_us_p99,
        pause_us_max: throttle.pause_us_max,
        stalled_us: throttle.stalled_us,
    }
}

/// The reports of `files` (`DataFile::report`), those of the runtime's files taken under one
/// engine lock.
pub(crate) fn reports(files: &[&dyn DataFile]) -> Vec<Option<FileReport>> {
    let ebb: Vec<&ebb_runtime::File> = files.iter().filter_map(|file| file.ebb_file()).collect();
    if ebb.len() != files.len() {
        return files.iter().map(|file| file.report()).collect();
    }
    let errors = ebb_runtime::File::errors_of(&ebb);
    ebb.iter().zip(errors).map(|(file, errors)| Some(report_of(file, errors))).collect()
}
