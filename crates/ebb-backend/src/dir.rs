//! `DirBackend`: a directory of plain files, read and written with `O_DIRECT` positional IO.
//!
//! ebb keeps its own page cache, so going through the kernel's as well would cache every page
//! twice and let the kernel's writeback race ours. `O_DIRECT` bypasses it: `pwrite` moves the
//! pages to the device (possibly into its volatile cache) and `fdatasync` makes them durable.
//!
//! Rules this file implements:
//!
//! * Offsets and lengths must be multiples of 4096 (the cache's page; at least the logical
//!   block size of any device). A misaligned request is `InvalidInput` naming the rule, never
//!   an `EINVAL` from the kernel and never a panic.
//! * The buffer's address may be anything: an unaligned buffer is copied through a per-thread
//!   aligned bounce buffer, chunk by chunk, of the largest chunk the thread has bounced so far
//!   (at most `BOUNCE_BYTES`, 1 MiB): a thread that bounces only small reads keeps a small
//!   buffer (the buffer is zeroed when made, so all of it is resident).
//! * A filesystem that refuses `O_DIRECT` (`EINVAL` at open) is detected when the backend is
//!   opened, by creating, writing and removing a probe file. [`DirBackend::open`] then fails
//!   with `ErrorKind::Unsupported`; [`DirBackend::open_buffered_fallback`] uses buffered IO
//!   instead and reports `direct_io: false`, `alignment: 1`.
//! * The backend does no threading of its own: the runtime's IO workers call it. io_uring was
//!   measured and not adopted (see the crate README).

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::aligned::{AlignedBuf, PAGE_SIZE, is_page_aligned};
use crate::backend::{
    Backend, BackendFile, Capabilities, CommitReply, OpenOptions, Stability, WriteReply,
    check_name, check_request,
};
use crate::fd_cache::{FdCache, Slot};

/// Size of the per-thread aligned buffer that unaligned user buffers are copied through.
const BOUNCE_BYTES: usize = 1 << 20;

/// Largest single request; a power of two below Linux's per-call limit (`0x7ffff000`).
const MAX_IO_BYTES: u64 = 1 << 30;

thread_local! {
    /// Bounce buffer of the current thread, grown to the largest chunk it bounced and kept.
    static BOUNCE: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(0));
}

/// A directory of files opened with `O_DIRECT` (or buffered, if chosen explicitly).
#[derive(Debug)]
pub struct DirBackend {
    path: PathBuf,
    dir: Arc<OwnedFd>,
    direct: bool,
}

impl DirBackend {
    /// Opens the existing directory `path` for `O_DIRECT` IO. Fails with
    /// `ErrorKind::Unsupported` if its filesystem refuses `O_DIRECT`.
    pub fn open(path: impl AsRef<Path>) -> io::Result<DirBackend> {
        let backend = DirBackend::open_buffered_fallback(path)?;
        if !backend.direct {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the filesystem of {} refuses O_DIRECT (EINVAL at open or write); \
                     use DirBackend::open_buffered_fallback to accept buffered IO there",
                    backend.path.display()
                ),
            ));
        }
        Ok(backend)
    }

    /// Opens the existing directory `path`, using `O_DIRECT` when its filesystem supports it
    /// and buffered IO (still made durable by `sync`) when it does not.
    pub fn open_buffered_fallback(path: impl AsRef<Path>) -> io::Result<DirBackend> {
        let path = path.as_ref().to_path_buf();
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::open(&path, flags, Mode::empty())?;
        let direct = probe_direct(&dir)?;
        Ok(DirBackend { path, dir: Arc::new(dir), direct })
    }

    /// Opens the existing directory `path` for buffered IO (the kernel's page cache caches
    /// the files; `sync` still makes them durable), whatever its filesystem supports: for
    /// comparisons with the kernel's own caching.
    pub fn open_buffered(path: impl AsRef<Path>) -> io::Result<DirBackend> {
        let path = path.as_ref().to_path_buf();
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::open(&path, flags, Mode::empty())?;
        Ok(DirBackend { path, dir: Arc::new(dir), direct: false })
    }

    /// The directory this backend serves.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_file(&self, name: &str, options: OpenOptions) -> io::Result<(OwnedFd, bool)> {
        let mut flags = OFlags::RDWR | OFlags::CLOEXEC;
        if self.direct {
            flags |= OFlags::DIRECT;
        }
        if options.truncate {
            flags |= OFlags::TRUNC;
        }
        let mode = Mode::from_raw_mode(0o644);
        if options.create {
            // Try to create first, so the first sync knows to make the name durable too.
            match rustix::fs::openat(&*self.dir, name, flags | OFlags::CREATE | OFlags::EXCL, mode)
            {
                Ok(fd) => return Ok((fd, true)),
                Err(Errno::EXIST) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
        Ok((rustix::fs::openat(&*self.dir, name, flags, mode)?, false))
    }
}

impl Backend for DirBackend {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        check_name(name)?;
        let (fd, created) = self.open_file(name, options)?;
        let fd = FileFd::Fixed(Arc::new(fd));
        let flags = OFlags::empty(); // never opened again
        let file =
            DirFile::new(name.to_owned(), fd, flags, Some(Arc::clone(&self.dir)), self.direct);
        file.name_sync_pending.store(created, Ordering::Release);
        Ok(Arc::new(file))
    }

    fn sync_all(&self) -> Option<io::Result<()>> {
        Some(rustix::fs::syncfs(&*self.dir).map_err(io::Error::from))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        rustix::fs::unlinkat(&*self.dir, name, AtFlags::empty())?;
        rustix::fs::fsync(&*self.dir)?;
        Ok(())
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        match rustix::fs::statat(&*self.dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(errno) => Err(errno.into()),
        }
    }

    fn capabilities(&self) -> Capabilities {
        let alignment = if self.direct { PAGE_SIZE as u64 } else { 1 };
        Capabilities {
            two_phase: false,
            direct_io: self.direct,
            alignment,
            max_io_bytes: MAX_IO_BYTES,
            serial_writes: true,
        }
    }
}

/// Opens the existing regular file at `path` (any path, for example a FUSE filesystem's
/// backing file or `/proc/self/fd/N`) read-write with `O_DIRECT`, as the file type of
/// [`DirBackend`] with the same rules (4096-aligned offsets and lengths, any buffer address).
///
/// If the file's filesystem refuses `O_DIRECT` (`EINVAL` at open), the file is opened with
/// buffered IO instead (and then accepts any alignment). `sync`
/// makes the data durable; making the name durable is left to the caller (who created it).
pub fn open_direct_path(path: &Path) -> io::Result<Arc<dyn BackendFile>> {
    open_path(path, true)
}

/// [`open_direct_path`], or with buffered IO when `direct` is false.
pub(crate) fn open_path(path: &Path, direct: bool) -> io::Result<Arc<dyn BackendFile>> {
    let open = |flags| Ok(rustix::fs::open(path, flags, Mode::empty())?);
    let name = path.display().to_string();
    let (fd, flags, direct) = open_data(&open, direct, &name)?;
    Ok(Arc::new(DirFile::new(name, FileFd::Fixed(Arc::new(fd)), flags, None, direct)))
}

/// Opens a regular file for data like [`open_path`], with `reopen` (which opens the file with
/// the flags given), keeping its descriptor in `cache`: when the cache closes it, the next
/// call opens the file again with `reopen`. `name` is for messages.
pub(crate) fn open_reopenable(
    name: String,
    reopen: Reopen,
    direct: bool,
    cache: Arc<FdCache>,
) -> io::Result<Arc<dyn BackendFile>> {
    let (fd, flags, direct) = open_data(&*reopen, direct, &name)?;
    let slot = Arc::new(Slot::default());
    cache.put(&slot, fd);
    let fd = FileFd::Cached { slot, cache, reopen };
    Ok(Arc::new(DirFile::new(name, fd, flags, None, direct)))
}

/// Opens a regular file read-write with `open`, with `O_DIRECT` if `direct` and the
/// filesystem takes it: the descriptor, the flags it was opened with and whether they
/// include `O_DIRECT`.
fn open_data(
    open: &dyn Fn(OFlags) -> io::Result<OwnedFd>,
    direct: bool,
    name: &str,
) -> io::Result<(OwnedFd, OFlags, bool)> {
    let buffered = OFlags::RDWR | OFlags::CLOEXEC;
    let attempt = if direct { open(buffered | OFlags::DIRECT) } else { Err(Errno::INVAL.into()) };
    let (fd, flags, direct) = match attempt {
        Ok(fd) => (fd, buffered | OFlags::DIRECT, true),
        Err(error) if error.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
            (open(buffered)?, buffered, false)
        }
        Err(error) => return Err(error),
    };
    let stat = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name} is not a regular file"),
        ));
    }
    Ok((fd, flags, direct))
}

/// Opens a file again with the flags given (see [`open_reopenable`]).
pub(crate) type Reopen = Box<dyn Fn(OFlags) -> io::Result<OwnedFd> + Send + Sync>;

/// A data file's descriptor: its own for its life, or one in a cache that may close it.
enum FileFd {
    Fixed(Arc<OwnedFd>),
    Cached { slot: Arc<Slot>, cache: Arc<FdCache>, reopen: Reopen },
}

/// One open file of a [`DirBackend`].
struct DirFile {
    name: String,
    fd: FileFd,
    /// The flags the file was opened with, to open it again.
    flags: OFlags,
    /// The directory, to make a newly created name durable on the first sync (`None` for a
    /// file opened by path with [`open_direct_path`], whose name its caller manages).
    dir: Option<Arc<OwnedFd>>,
    capabilities: Capabilities,
    name_sync_pending: AtomicBool,
    /// Writes and size changes so far: a buffered file's cached descriptor stays open from its
    /// first write until a sync that no write followed (a new descriptor would not see the
    /// errors of the kernel's write-back of those writes).
    changes: AtomicU64,
}

impl DirFile {
    fn new(
        name: String,
        fd: FileFd,
        flags: OFlags,
        dir: Option<Arc<OwnedFd>>,
        direct: bool,
    ) -> DirFile {
        DirFile {
            name,
            fd,
            flags,
            dir,
            capabilities: Capabilities {
                two_phase: false,
                direct_io: direct,
                alignment: if direct { PAGE_SIZE as u64 } else { 1 },
                max_io_bytes: MAX_IO_BYTES,
                serial_writes: true,
            },
            name_sync_pending: AtomicBool::new(false),
            changes: AtomicU64::new(0),
        }
    }

    /// The file's descriptor, opened again if its cache closed it.
    fn fd(&self) -> io::Result<Arc<OwnedFd>> {
        match &self.fd {
            FileFd::Fixed(fd) => Ok(Arc::clone(fd)),
            FileFd::Cached { slot, cache, reopen } => cache.get(slot, || reopen(self.flags)),
        }
    }

    /// Counts a change; a buffered file's descriptor is kept open until a sync.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        if let FileFd::Cached { slot, .. } = &self.fd
            && !self.capabilities.direct_io
        {
            slot.set_busy(true);
        }
    }
}

impl fmt::Debug for DirFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirFile")
            .field("name", &self.name)
            .field("direct_io", &self.capabilities.direct_io)
            .finish_non_exhaustive()
    }
}

impl BackendFile for DirFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        check_request(&self.capabilities, offset, buf.len())?;
        let fd = self.fd()?;
        if !self.capabilities.direct_io || is_page_aligned(buf) {
            return read_full(&*fd, buf, offset, self.capabilities.alignment);
        }
        BOUNCE.with_borrow_mut(|bounce| {
            grow_bounce(bounce, buf.len());
            let mut done = 0;
            for chunk in buf.chunks_mut(BOUNCE_BYTES) {
                let staging = &mut bounce[..chunk.len()];
                let read = read_full(&*fd, staging, offset + done as u64, PAGE_SIZE as u64)?;
                chunk[..read].copy_from_slice(&staging[..read]);
                done += read;
                if read < chunk.len() {
                    break;
                }
            }
            Ok(done)
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        check_request(&self.capabilities, offset, buf.len())?;
        self.changed();
        let fd = self.fd()?;
        if !self.capabilities.direct_io || is_page_aligned(buf) {
            write_full(&*fd, buf, offset)?;
        } else {
            BOUNCE.with_borrow_mut(|bounce| {
                grow_bounce(bounce, buf.len());
                let mut done = 0;
                for chunk in buf.chunks(BOUNCE_BYTES) {
                    let staging = &mut bounce[..chunk.len()];
                    staging.copy_from_slice(chunk);
                    write_full(&*fd, staging, offset + done as u64)?;
                    done += chunk.len();
                }
                io::Result::Ok(())
            })?;
        }
        Ok(WriteReply { stability: Stability::Stable })
    }

    fn commit(&self, _offset: u64, _len: u64) -> io::Result<CommitReply> {
        self.sync()?;
        Ok(CommitReply { verifier: 0 })
    }

    fn sync(&self) -> io::Result<()> {
        let fd = self.fd()?;
        let changes = self.changes.load(Ordering::Acquire);
        retry_interrupted(|| rustix::fs::fdatasync(&*fd))?;
        if let FileFd::Cached { slot, .. } = &self.fd
            && self.changes.load(Ordering::Acquire) == changes
        {
            slot.set_busy(false);
        }
        if let Some(dir) = &self.dir
            && self.name_sync_pending.swap(false, Ordering::AcqRel)
            && let Err(errno) = retry_interrupted(|| rustix::fs::fsync(&**dir))
        {
            self.name_sync_pending.store(true, Ordering::Release);
            return Err(errno.into());
        }
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        let stat = rustix::fs::fstat(&*self.fd()?)?;
        // st_size of a regular file is never negative.
        Ok(u64::try_from(stat.st_size).unwrap_or(0))
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        self.changed();
        let fd = self.fd()?;
        retry_interrupted(|| rustix::fs::ftruncate(&*fd, size))?;
        Ok(())
    }
}

/// Grows the thread's bounce buffer to hold a chunk of a `len`-byte request (at most
/// `BOUNCE_BYTES`, rounded up to whole pages).
fn grow_bounce(bounce: &mut AlignedBuf, len: usize) {
    let need = len.min(BOUNCE_BYTES);
    if bounce.len() < need {
        *bounce = AlignedBuf::zeroed(need);
    }
}

/// `pread` until `buf` is full or the file ends. With direct IO (`alignment > 1`) a read that
/// returns a count that is not a multiple of `alignment` has reached the end of the file (a
/// further `pread` at that unaligned offset would fail with `EINVAL`).
fn read_full(fd: impl AsFd, buf: &mut [u8], offset: u64, alignment: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let read = retry_interrupted(|| {
            rustix::io::pread(fd.as_fd(), &mut buf[done..], offset + done as u64)
        })?;
        done += read;
        if read == 0 || !(read as u64).is_multiple_of(alignment) {
            break;
        }
    }
    Ok(done)
}

/// `pwrite` until all of `buf` is written; a write that makes no progress is `WriteZero`.
fn write_full(fd: impl AsFd, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let written = retry_interrupted(|| {
            rustix::io::pwrite(fd.as_fd(), &buf[done..], offset + done as u64)
        })?;
        if written == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "pwrite wrote 0 bytes"));
        }
        done += written;
    }
    Ok(())
}

/// Runs `call` again while it fails with `EINTR`.
fn retry_interrupted<T>(mut call: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match call() {
            Err(Errno::INTR) => {}
            result => return result,
        }
    }
}

/// Whether the directory's filesystem accepts `O_DIRECT`: creates a probe file with it,
/// writes one aligned page, and removes the file. `EINVAL` at open or write means "no"; other
/// errors (permissions, ENOSPC) are returned as they are.
fn probe_direct(dir: &OwnedFd) -> io::Result<bool> {
    let name = format!(".ebb-direct-probe.{}.{:p}", std::process::id(), dir);
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::DIRECT | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, name.as_str(), flags, Mode::from_raw_mode(0o600)) {
        Ok(fd) => fd,
        Err(Errno::INVAL) => {
            // The kernel creates the file before it checks O_DIRECT: remove it again.
            match rustix::fs::unlinkat(dir, name.as_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => return Ok(false),
                Err(errno) => return Err(errno.into()),
            }
        }
        Err(errno) => return Err(errno.into()),
    };
    let page = AlignedBuf::zeroed(PAGE_SIZE);
    let written = retry_interrupted(|| rustix::io::pwrite(&fd, &page, 0));
    drop(fd);
    rustix::fs::unlinkat(dir, name.as_str(), AtFlags::empty())?;
    match written {
        Ok(_) => Ok(true),
        Err(Errno::INVAL) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}
