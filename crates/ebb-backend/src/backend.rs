//! The `Backend` and `BackendFile` traits and the small value types they exchange.
//!
//! Both traits are blocking and `Send + Sync`: the runtime calls them from its IO worker
//! threads, several at a time, and holds backends as `Arc<dyn Backend>` and open files as
//! `Arc<dyn BackendFile>`. Nothing here buffers or reorders: a call performs its IO before it
//! returns, and its error is the one the OS or server reported (`raw_os_error` kept), so the
//! engine sees `ENOSPC`, `EROFS` and `EIO` with their own kinds.
//!
//! # Words
//!
//! * **durable**: survives a crash of the machine (or a restart of the server) that holds the
//!   data. For files this is what `fdatasync` guarantees: the data and the metadata needed to
//!   read it back (the size), not timestamps.
//! * **stable write**: durable when the call returns (`O_DIRECT` alone is not that: the device
//!   may still hold the data in a volatile cache, which is why [`BackendFile::sync`] exists).
//!   In this crate "stable" means "needs no [`BackendFile::commit`]": the data is durable after
//!   the next successful `sync`, and it is never lost by a server restart.
//! * **unstable write**: accepted by a two-phase server (NFS `UNSTABLE`, an S3 part) and lost if
//!   the server restarts before a [`BackendFile::commit`] covering it succeeds with the same
//!   verifier.

use std::fmt;
use std::io;
use std::sync::Arc;

/// How [`Backend::open`] treats the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Create the file (empty) if it does not exist. Without it a missing file is
    /// `ErrorKind::NotFound`.
    pub create: bool,
    /// Set the size of an existing file to 0 at open.
    pub truncate: bool,
}

/// What a backend can do; constant for the life of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Writes may return [`Stability::Unstable`] and need [`BackendFile::commit`].
    pub two_phase: bool,
    /// IO bypasses the OS page cache (`O_DIRECT`); reads cost device time.
    pub direct_io: bool,
    /// Offsets and lengths of `read_at`/`write_at` must be multiples of this (a power of two;
    /// 1 means any). Misaligned requests fail with `ErrorKind::InvalidInput`. The buffer's
    /// address never has to be aligned: backends copy through an aligned buffer when needed,
    /// at a measured cost (see the crate README).
    pub alignment: u64,
    /// Largest buffer a single `read_at`/`write_at` accepts; larger ones fail with
    /// `ErrorKind::InvalidInput`. The engine chunks its runs to at most this.
    pub max_io_bytes: u64,
    /// Concurrent writes to one file run one at a time underneath (a local filesystem: ext4
    /// holds a file's inode lock exclusively through an `O_DIRECT` write that extends the file
    /// or fills a hole, and through every buffered write). A driver then gains nothing from
    /// issuing one file's writes from several threads, and loses a thread hand-off per write.
    pub serial_writes: bool,
}

/// How durable a completed write is: `Stable` needs no commit (the data is durable after the
/// next successful `sync`); `Unstable { verifier }` is held by a two-phase server and lost if
/// the server restarts before a commit covering it returns the same `verifier`. The core's own
/// type, so the engine takes a backend's answer as it is.
pub use ebb_core::Stability;

/// The result of a successful [`BackendFile::write_at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteReply {
    /// Whether the written bytes still need a commit.
    pub stability: Stability,
}

/// The result of a successful [`BackendFile::commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitReply {
    /// The server instance that performed the commit. If it differs from the verifier of an
    /// unstable write, the server restarted in between and that write's data may be gone: the
    /// engine must write it again (and commit again).
    pub verifier: u64,
}

/// The hook a test-only two-phase backend offers to simulate a server restart.
///
/// Reached through [`Backend::server_restart`], so code holding `Arc<dyn Backend>` can drive a
/// restart without knowing the concrete type, and real backends simply return `None`.
pub trait ServerRestart {
    /// Simulates a server restart: every unstable (uncommitted) write is dropped, committed data
    /// stays, and the verifier changes. Atomic with respect to concurrent IO: a write either
    /// completes before the restart (and its verifier is the old one) or after it.
    fn restart(&self);
}

/// A namespace of files: a directory, a memory map, an NFS export, a bucket.
///
/// Names are single path components: not empty, no `/`, no NUL, not `.` or `..`; anything
/// else is `ErrorKind::InvalidInput`.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Opens (and with `options.create`, creates) the file `name`.
    ///
    /// The returned handle stays valid after [`Backend::remove`] of the same name, as an open
    /// file descriptor does; what IO on it then does is backend-specific.
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>>;

    /// Removes the file `name`; `ErrorKind::NotFound` if it does not exist. The removal is
    /// durable when the call returns.
    fn remove(&self, name: &str) -> io::Result<()>;

    /// Whether the file `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool>;

    /// What this backend can do. Constant for its life.
    fn capabilities(&self) -> Capabilities;

    /// The restart hook of a simulated two-phase server, `None` for real backends (and for
    /// backends that cannot simulate one). Calling this has no effect by itself.
    fn server_restart(&self) -> Option<&dyn ServerRestart> {
        None
    }

    /// The backend's own event counters, named as its protocol's tools name them (for NFS,
    /// the kernel client's `nfsstat`/`mountstats` names: `write_rpcs`, `commit_rpcs`,
    /// `retransmits`, ...), in a stable order. Empty for backends without any. Reported by the
    /// runtime's stats beside the engine's per-backend figures; reading them must be cheap
    /// (atomics), as `ebb stat` and metrics scrapes call it while IO runs.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// The backend's sustained write speed, bytes/s, when it knows it (a link or a service
    /// with a provisioned rate, a device whose speed its maker states); `None` (the default):
    /// unknown. The engine's bandwidth estimate starts there with `initial_write_bandwidth =
    /// auto` and learns the real rate from completed writes after that.
    fn write_bandwidth(&self) -> Option<u64> {
        None
    }

    /// Makes every write to this backend's files that returned `Ok` before the call durable,
    /// with their sizes and names, in one call (`Some(Ok(()))`): a local directory syncs its
    /// filesystem (`syncfs(2)`), as the kernel's unmount does, instead of one `fsync` per file.
    /// An error means none of it may be assumed durable. `None` (the default): the backend
    /// cannot, and the caller syncs each file ([`BackendFile::sync`]).
    fn sync_all(&self) -> Option<io::Result<()>> {
        None
    }
}

/// One open file of a [`Backend`]. All methods take `&self` and may be called concurrently
/// from several threads; concurrent writes to overlapping ranges leave either write's bytes
/// (per page, no ordering promise), writes to disjoint ranges never interfere.
pub trait BackendFile: Send + Sync + fmt::Debug {
    /// Reads into `buf` from `offset`, returning the number of bytes read: `buf.len()`, or
    /// fewer only when the file ends first (0 at or past the end). Holes (never written ranges
    /// inside the file) read as zeros. Bytes of `buf` past the returned count are unspecified.
    /// Misaligned offset or length on a backend with `alignment > 1`: `InvalidInput`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `buf` at `offset`, extending the file if the write ends past its size
    /// (a gap before `offset` becomes a hole that reads as zeros).
    ///
    /// All or error: on `Ok` every byte was written; on `Err` any prefix of the range may have
    /// been written, and the caller must treat the whole range as not written (retry it, or
    /// keep the pages dirty). Short writes from the OS are continued internally, `EINTR` is
    /// retried. A file whose logical size is not a page multiple is written with its last page
    /// whole, then trimmed with [`BackendFile::set_size`].
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply>;

    /// Writes one *extent* of the file, `offset..offset + len`, as a unit: `runs` are the bytes
    /// the caller has for it (sorted by offset, disjoint, each inside the extent), and the gaps
    /// between them keep what the backend already holds. A backend that can only write whole
    /// units (an S3 part) writes the extent once, filling the gaps from what it holds; the
    /// size grows to at least the end of the last run, as with `write_at`. All or error, as
    /// `write_at`. Runs out of order, overlapping or outside the extent: `InvalidInput`.
    ///
    /// The default writes each run with [`BackendFile::write_at`] and returns the first
    /// unstable reply (the oldest verifier, so a restart between runs is noticed), else stable.
    fn write_extent(&self, offset: u64, len: u64, runs: &[(u64, &[u8])]) -> io::Result<WriteReply> {
        check_extent(offset, len, runs)?;
        let mut reply = WriteReply { stability: Stability::Stable };
        for (run_offset, data) in runs {
            let run_reply = self.write_at(data, *run_offset)?;
            if reply.stability == Stability::Stable {
                reply = run_reply;
            }
        }
        Ok(reply)
    }

    /// The unit this backend writes whole (an S3 part) that holds byte `offset` of a file at
    /// least `end` bytes long, or `None` if it writes any range as it is (the default). A
    /// caller writing less than a unit may then hand a buffer of the whole unit to
    /// [`BackendFile::write_unit_in_place`], which saves the backend a copy of it.
    fn write_unit(&self, _offset: u64, _end: u64) -> Option<std::ops::Range<u64>> {
        None
    }

    /// Writes `buf[valid]` at `offset + valid.start`, as [`BackendFile::write_at`] does.
    /// `buf` covers the file's bytes `offset..offset + buf.len()`, a whole unit as
    /// [`BackendFile::write_unit`] gave it; its bytes outside `valid` are scratch, which the
    /// backend may overwrite with what it holds there, so that it writes the unit from `buf`
    /// itself. If the unit changed meanwhile (the file grew), the backend writes the valid
    /// bytes as `write_at` would. The default does exactly that.
    fn write_unit_in_place(
        &self,
        buf: &mut [u8],
        offset: u64,
        valid: std::ops::Range<usize>,
    ) -> io::Result<WriteReply> {
        let start = offset + valid.start as u64;
        self.write_at(&buf[valid], start)
    }

    /// Writes `source`'s bytes at `offset`, as [`BackendFile::write_at`] would, copying them
    /// straight from the source as the request goes out, when this backend can for this range
    /// (an S3 backend, for one whole part); `None` when it cannot, and then nothing was written
    /// and the caller gathers the bytes into a buffer for `write_at`. This saves the caller a
    /// copy of the bytes and the buffer for them. The default: `None`.
    fn write_from(
        &self,
        _offset: u64,
        _source: &dyn WriteSource,
    ) -> Option<io::Result<WriteReply>> {
        None
    }

    /// Makes the unstable writes in `offset..offset + len` durable (`len == 0` means to the end
    /// of the file), returning the server's current verifier. On a backend without
    /// `two_phase` this is a `sync` and returns verifier 0.
    fn commit(&self, offset: u64, len: u64) -> io::Result<CommitReply>;

    /// Makes every write that returned `Ok` before this call durable, together with the size
    /// (`fdatasync` for files) and, on the first sync after the file was created, its name.
    /// On a two-phase backend it also commits everything. An error means some of that data may
    /// not be durable; the caller must not assume any part of it is.
    fn sync(&self) -> io::Result<()>;

    /// The file's current logical size in bytes.
    fn size(&self) -> io::Result<u64>;

    /// Sets the logical size: bytes past `size` are discarded, a larger size adds a hole that
    /// reads as zeros. Any size is accepted (no alignment rule), so the engine writes the last
    /// page whole and trims with this. Durable after the next successful `sync`.
    fn set_size(&self, size: u64) -> io::Result<()>;

    /// Another client may have changed the file: forgets what this handle's backend remembers
    /// of its size, times and existence, so that the next [`BackendFile::size`] asks the
    /// server (the S3 backend's metadata cache; the other backends ask every time).
    fn forget_metadata(&self) {}
}

/// The bytes of a write, copied out on demand from where the caller keeps them (a cache's
/// pages) rather than handed over in one buffer: see [`BackendFile::write_from`]. The bytes do
/// not change during the call, so a backend that retries a request reads them again.
pub trait WriteSource: Sync {
    /// The write's length, bytes.
    fn len(&self) -> usize;

    /// Whether the write is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the write's bytes `at..at + dst.len()` into `dst` (inside the write).
    fn copy_to(&self, at: usize, dst: &mut [u8]);
}

/// A reader of a [`WriteSource`] from its start, for a request body.
pub(crate) struct SourceReader<'a> {
    source: &'a dyn WriteSource,
    at: usize,
}

impl<'a> SourceReader<'a> {
    /// A reader of `source`'s bytes from the first.
    pub(crate) fn new(source: &'a dyn WriteSource) -> SourceReader<'a> {
        SourceReader { source, at: 0 }
    }
}

impl io::Read for SourceReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.source.len() - self.at);
        self.source.copy_to(self.at, &mut buf[..n]);
        self.at += n;
        Ok(n)
    }
}

macro_rules! forward_backend {
    ($pointer:ident) => {
        /// Forwards to the pointee, so `Arc<dyn Backend>` and `Box<dyn Backend>` are backends too.
        impl<B: Backend + ?Sized> Backend for $pointer<B> {
            fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
                (**self).open(name, options)
            }

            fn remove(&self, name: &str) -> io::Result<()> {
                (**self).remove(name)
            }

            fn exists(&self, name: &str) -> io::Result<bool> {
                (**self).exists(name)
            }

            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }

            fn server_restart(&self) -> Option<&dyn ServerRestart> {
                (**self).server_restart()
            }

            fn counters(&self) -> Vec<(&'static str, u64)> {
                (**self).counters()
            }

            fn write_bandwidth(&self) -> Option<u64> {
                (**self).write_bandwidth()
            }

            fn sync_all(&self) -> Option<io::Result<()>> {
                (**self).sync_all()
            }
        }
    };
}

forward_backend!(Arc);
forward_backend!(Box);

/// Checks a name against the single-component rule of [`Backend`], with an `InvalidInput`
/// error naming it. Public for backends outside this crate (the simulator's).
pub fn check_name(name: &str) -> io::Result<()> {
    let bad = name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']);
    if bad {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("backend file name {name:?} is not a single path component"),
        ));
    }
    Ok(())
}

/// Checks the arguments of [`BackendFile::write_extent`]: runs sorted, disjoint and inside
/// `offset..offset + len`, with an `InvalidInput` error naming the first run that is not.
/// Public for backends outside this crate.
pub fn check_extent(offset: u64, len: u64, runs: &[(u64, &[u8])]) -> io::Result<()> {
    let end = offset.checked_add(len).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("extent at {offset} of {len} bytes overflows"),
        )
    })?;
    let mut previous_end = offset;
    for (index, (run_offset, data)) in runs.iter().enumerate() {
        let run_end = run_offset.checked_add(data.len() as u64);
        if *run_offset < previous_end || run_end.is_none_or(|run_end| end < run_end) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "run {index} (offset {run_offset}, {} bytes) of the extent {offset}..{end} \
                     is out of order, overlaps the run before it or leaves the extent",
                    data.len()
                ),
            ));
        }
        previous_end = run_offset + data.len() as u64;
    }
    Ok(())
}

/// An IO error carrying a Linux errno and a message, for backends whose errors come from a
/// server (an S3 error code, an NFS status): the errno is what the engine classifies (retry,
/// hold), the message says what the server said. [`errno_of`] reads the errno back.
pub fn errno_error(errno: i32, message: String) -> io::Error {
    let kind = io::Error::from_raw_os_error(errno).kind();
    io::Error::new(kind, ErrnoError { errno, message })
}

/// The errno of an error a backend returned: the OS's own, or the one [`errno_error`]
/// attached; `None` for other errors (the engine treats them as `EIO`).
pub fn errno_of(error: &io::Error) -> Option<i32> {
    error.raw_os_error().or_else(|| {
        error.get_ref().and_then(|inner| inner.downcast_ref::<ErrnoError>()).map(|e| e.errno)
    })
}

/// The payload of [`errno_error`].
#[derive(Debug)]
struct ErrnoError {
    errno: i32,
    message: String,
}

impl fmt::Display for ErrnoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (os error {})", self.message, self.errno)
    }
}

impl std::error::Error for ErrnoError {}

/// Checks `offset` and `len` against `capabilities` (size limit, largest file offset,
/// alignment), with an `InvalidInput` error naming the rule broken. Public for backends outside
/// this crate (the simulator's).
pub fn check_request(capabilities: &Capabilities, offset: u64, len: usize) -> io::Result<()> {
    let len = len as u64;
    if capabilities.max_io_bytes < len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("request of {len} bytes exceeds max_io_bytes {}", capabilities.max_io_bytes),
        ));
    }
    if offset.checked_add(len).is_none_or(|end| i64::MAX as u64 <= end) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("request at offset {offset} of {len} bytes ends past the largest file offset"),
        ));
    }
    let alignment = capabilities.alignment;
    if alignment > 1 && (!offset.is_multiple_of(alignment) || !len.is_multiple_of(alignment)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "misaligned request (offset {offset}, {len} bytes): this backend uses direct IO, \
                 offsets and lengths must be multiples of {alignment} bytes"
            ),
        ));
    }
    Ok(())
}

/// Background writes `wbt = ebb` keeps in flight to a network backend at least: one being
/// served and one on its way, so the server never waits for the client between two (ebb's
/// own; as a directory's lanes, `ebb_runtime`'s `DIRECTORY_WBT_MIN_DEPTH`). Against ganesha
/// beside a reader (BENCHMARKS.md, NFS), 1 gave the reads the same percentiles within noise
/// and the writer 7% less.
pub const NETWORK_WBT_MIN_DEPTH: u32 = 2;

/// The writeback throttling of a network backend (the NFS and S3 backends'
/// `writeback_settings`, which then leave it off by default): ebb's variant, `wbt = ebb`, on the backend's background writes in
/// flight (an NFS client's WRITEs, an S3 client's part uploads), with the backend's reads
/// (cache misses and direct reads) as its signal and its target learned from their idle
/// latency, and at least [`NETWORK_WBT_MIN_DEPTH`] writes in flight. The kernel has no wbt for
/// a network filesystem, which has no block queue; ebb's client has a queue of its own (the
/// IO threads' jobs) whose depth it controls.
pub fn network_writeback_throttling(settings: &mut ebb_core::BackendConfig) {
    settings.wbt = ebb_core::WbtMode::Ebb;
    settings.wbt_min_depth = NETWORK_WBT_MIN_DEPTH;
}
