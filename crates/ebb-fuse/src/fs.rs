//! The FUSE filesystem: a passthrough of DIR whose file data goes through a [`DataPath`].
//!
//! # Inodes
//!
//! Every inode the kernel knows (looked up and not yet forgotten) holds an `O_PATH` file
//! descriptor on its backing object, so operations use `*at` calls relative to it and never
//! build paths: a rename in DIR, even of a parent directory, cannot send an operation to the
//! wrong file. Backing objects are identified by `(st_dev, st_ino)`. A node id (the `st_ino`
//! the mount shows) is the backing inode number, so it stays the same for the life of the file
//! (the kernel forgets inodes when it drops its caches and looks them up again) and across
//! mounts; the root is 1, and objects of other filesystems mounted inside DIR get ids of ours.
//!
//! # Owners and modes
//!
//! ebb runs as root and creates objects itself, so it gives each new object what a local
//! filesystem would have given the caller: the caller's uid, its gid or a setgid directory's
//! (whose setgid bit new directories inherit), and exactly the mode the kernel passed (already
//! masked with the caller's umask). The owner is set first and the mode after, because a chown
//! clears setuid and setgid, and the mode is set explicitly because ebb's own umask applies
//! once more when the backing object is created.
//!
//! # File data
//!
//! Each open of a regular file attaches a handle to the data path, with one key per backing
//! inode (all handles of a file share its cached pages). Besides the handles, the first open
//! also creates an *anchor* handle kept after the last close, because ebb still holds the
//! file's dirty pages then: `getattr` reports the anchor's size (ebb's, not the stale size on
//! disk) and `truncate` goes through it. An anchor is dropped when its file's last name is
//! removed and nothing has it open, or when more than the anchor limit (`Mount::
//! start_keeping`, default [`ANCHOR_LIMIT`]) exist and the file is closed: then only its
//! key is remembered, the runtime decides when the file's pages are written and forgotten, and
//! `getattr`/`truncate` attach a handle for the call. Keys are ours too (a counter), not
//! backing inode numbers: the backing filesystem reuses the number of a removed file for a
//! new one, which must not meet the old file's cached pages.
//!
//! The kernel keeps no copy of the data: files are opened with `FOPEN_DIRECT_IO`, so every
//! `read(2)` and `write(2)` reaches us. A `MAP_SHARED` `mmap` (even read-only) therefore fails
//! with `ENODEV` (the kernel refuses it for direct-IO files unless the filesystem asks for
//! `FUSE_DIRECT_IO_ALLOW_MMAP`, which would bring back a second cache, for mapped files,
//! whose coherence with direct `read(2)`/`write(2)` we have not verified); private mappings
//! work from a copy the kernel makes at fault time.
//!
//! # Threads
//!
//! fuser runs [`LOOP_THREADS`] request loops. Metadata operations are answered on them.
//! Reads go to one pool and writes, `fsync` and `release` to another ([`crate::pool`]), so a
//! writer that ebb throttles holds only its own request: readers and metadata continue. Each
//! pool bounds the requests it holds (running plus queued); when a pool is full the loop that
//! received the request waits for room.
//!
//! # Stopping
//!
//! [`Shared::stop_writes`] makes every operation that would change data or names fail with
//! `EROFS`, so a drain finishes.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;
use rustix::fs::{AtFlags, Mode, OFlags, Stat};

use crate::data::{DataFile, DataPath};
use crate::pool::Pool;
use crate::times::FileTimes;

/// Name of the extended attribute of the mount's root that holds the live stats (JSON).
pub const STATS_XATTR: &str = "user.ebb.stats";

/// How long the kernel may cache names and attributes. We are the only writer of DIR's
/// namespace while mounted, and every size change passes through us, so a short cache is safe;
/// it saves a `getattr` round trip per `stat(2)`.
const TTL: Duration = Duration::from_secs(1);

/// fuser request loops (metadata is answered on them).
pub(crate) const LOOP_THREADS: usize = 2;
/// Threads serving reads; each holds one request.
const READ_THREADS: usize = 8;
/// Threads serving writes, fsync and release (a throttled write sleeps on one of these).
const WRITE_THREADS: usize = 16;
/// Requests a pool holds beyond its running ones before the request loop waits. Each queued
/// write holds its data (at most `MAX_WRITE`), so this bounds that memory to 64 MiB.
const POOL_QUEUE: usize = 64;
/// Largest write request the kernel sends (1 MiB, the kernel's default page limit).
const MAX_WRITE: u32 = 1 << 20;
/// Anchors (cached files kept after their last close) above which a closing file's anchor is
/// synced and dropped instead of kept.
pub(crate) const ANCHOR_LIMIT: usize = 4096;

/// The backing identity of a file: `(st_dev, st_ino)`.
type BackingId = (u64, u64);

/// State shared by the filesystem and the [`crate::Mount`] that controls it.
pub(crate) struct Shared {
    pub(crate) data: Arc<dyn DataPath>,
    stopping: AtomicBool,
    inodes: Mutex<Inodes>,
    anchors: Mutex<HashMap<BackingId, Anchor>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_handle: AtomicU64,
    next_key: AtomicU64,
    /// Keys of files whose anchor was dropped while they still had a name.
    idle_keys: Mutex<HashMap<BackingId, u64>>,
    /// The times ebb keeps for files written through the mount, while anything holds them.
    times: Mutex<HashMap<BackingId, Weak<FileTimes>>>,
    anchor_limit: usize,
    /// Whether we run as root (then new objects are given to the calling user).
    root: bool,
}

impl Shared {
    /// Every later operation that would change data or names fails with `EROFS`.
    pub(crate) fn stop_writes(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Closes every anchor (after the kernel released every file, at unmount). Their errors
    /// were the application handles' to report; see [`crate::Mount::unmount`].
    pub(crate) fn close_anchors(&self) {
        let anchors: Vec<Anchor> = self.anchors.lock().drain().map(|(_, anchor)| anchor).collect();
        for anchor in anchors {
            let _ = close_anchor(anchor);
        }
    }
}

/// Closes an anchor's handle (if a request still uses it, the handle is dropped when that
/// request ends instead).
fn close_anchor(anchor: Anchor) -> io::Result<()> {
    match Arc::into_inner(anchor.file) {
        Some(file) => file.close(),
        None => Ok(()),
    }
}

/// The inodes the kernel knows, by node id, with the kernel's reference count.
struct Inodes {
    by_ino: HashMap<u64, (Arc<Inode>, u64)>,
    /// The backing filesystem's device (DIR's `st_dev`): its objects' node ids are their
    /// backing inode numbers.
    device: u64,
    root: BackingId,
    /// Node ids of objects whose inode number cannot be theirs (on another filesystem mounted
    /// inside DIR, or numbered 1, the root's id), kept for the life of the mount.
    others: HashMap<BackingId, u64>,
    next_other: u64,
}

/// The first node id given to objects that cannot use their backing inode number. Backing
/// filesystems number inodes far below this (ext4 uses 32 bits).
const OTHER_IDS: u64 = 1 << 63;

impl Inodes {
    /// The node id (and `st_ino`) of the backing object `backing`: its inode number, so that
    /// it stays the same when the kernel forgets the inode and looks it up again, and across
    /// mounts. While the kernel knows a node, we hold a descriptor of its backing object, so
    /// the backing filesystem cannot give the number to another object meanwhile.
    fn node_id(&mut self, backing: BackingId) -> u64 {
        if backing == self.root {
            return INodeNo::ROOT.0;
        }
        if backing.0 == self.device && backing.1 > INodeNo::ROOT.0 && backing.1 < OTHER_IDS {
            return backing.1;
        }
        let next = &mut self.next_other;
        *self.others.entry(backing).or_insert_with(|| {
            *next += 1;
            *next - 1
        })
    }
}

/// A backing object the kernel knows.
struct Inode {
    /// `O_PATH | O_NOFOLLOW` on the backing object.
    fd: OwnedFd,
    backing: BackingId,
}

impl Inode {
    /// A path that opens the backing object itself (`/proc/self/fd/N`).
    fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// A cached file kept across opens.
struct Anchor {
    key: u64,
    file: Arc<Box<dyn DataFile>>,
    open_handles: usize,
    /// The last name was removed: drop the anchor at the last close.
    unlinked: bool,
    /// Keeps the file's times alive while it is anchored.
    _times: Arc<FileTimes>,
}

/// An open file.
struct Handle {
    file: Box<dyn DataFile>,
    backing: BackingId,
    times: Arc<FileTimes>,
}

#[derive(Clone)]
struct DirEntry {
    ino: u64,
    kind: FileType,
    name: OsString,
}

/// The filesystem handed to fuser.
pub(crate) struct EbbFs {
    shared: Arc<Shared>,
    reads: Pool,
    writes: Pool,
}

impl EbbFs {
    pub(crate) fn new(
        backend: &Path,
        data: Arc<dyn DataPath>,
        anchor_limit: usize,
    ) -> io::Result<(EbbFs, Arc<Shared>)> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(backend, flags, Mode::empty()).map_err(|errno| {
            io::Error::new(
                io::Error::from(errno).kind(),
                format!("cannot open the backend directory {}: {errno}", backend.display()),
            )
        })?;
        let stat = rustix::fs::fstat(&fd)?;
        let backing = (stat.st_dev, stat.st_ino);
        let mut by_ino = HashMap::new();
        by_ino.insert(INodeNo::ROOT.0, (Arc::new(Inode { fd, backing }), 1));

        let shared = Arc::new(Shared {
            data,
            stopping: AtomicBool::new(false),
            inodes: Mutex::new(Inodes {
                by_ino,
                device: stat.st_dev,
                root: backing,
                others: HashMap::new(),
                next_other: OTHER_IDS,
            }),
            anchors: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            next_key: AtomicU64::new(1),
            idle_keys: Mutex::new(HashMap::new()),
            times: Mutex::new(HashMap::new()),
            anchor_limit,
            root: rustix::process::geteuid().is_root(),
        });
        let fs = EbbFs {
            shared: Arc::clone(&shared),
            reads: Pool::new("ebb-fuse-read", READ_THREADS, POOL_QUEUE)?,
            writes: Pool::new("ebb-fuse-write", WRITE_THREADS, POOL_QUEUE)?,
        };
        Ok((fs, shared))
    }
}

/// The errno of an IO error: the OS's if it carries one, else one chosen from its kind.
pub(crate) fn errno_of(error: &io::Error) -> Errno {
    if let Some(raw) = error.raw_os_error() {
        return Errno::from_i32(raw);
    }
    use io::ErrorKind as K;
    let raw = match error.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::InvalidInput => libc::EINVAL,
        K::StorageFull => libc::ENOSPC,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::TimedOut => libc::ETIMEDOUT,
        K::Unsupported => libc::EOPNOTSUPP,
        K::Interrupted => libc::EINTR,
        K::WouldBlock => libc::EAGAIN,
        K::FileTooLarge => libc::EFBIG,
        K::OutOfMemory => libc::ENOMEM,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        K::DirectoryNotEmpty => libc::ENOTEMPTY,
        _ => libc::EIO,
    };
    Errno::from_i32(raw)
}

fn errno(error: rustix::io::Errno) -> Errno {
    Errno::from_i32(error.raw_os_error())
}

fn kind_of(mode: u32) -> FileType {
    match rustix::fs::FileType::from_raw_mode(mode) {
        rustix::fs::FileType::Directory => FileType::Directory,
        rustix::fs::FileType::Symlink => FileType::Symlink,
        rustix::fs::FileType::Fifo => FileType::NamedPipe,
        rustix::fs::FileType::Socket => FileType::Socket,
        rustix::fs::FileType::CharacterDevice => FileType::CharDevice,
        rustix::fs::FileType::BlockDevice => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn time(seconds: i64, nanos: i64) -> SystemTime {
    let nanos = u32::try_from(nanos).unwrap_or(0);
    if seconds >= 0 {
        UNIX_EPOCH + Duration::new(seconds.unsigned_abs(), nanos)
    } else {
        UNIX_EPOCH - Duration::new(seconds.unsigned_abs(), 0) + Duration::from_nanos(nanos.into())
    }
}

fn to_timespec(value: Option<TimeOrNow>) -> rustix::fs::Timespec {
    match value {
        None => rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        Some(TimeOrNow::Now) => rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
        Some(TimeOrNow::SpecificTime(at)) => match at.duration_since(UNIX_EPOCH) {
            Ok(since) => rustix::fs::Timespec {
                tv_sec: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: since.subsec_nanos().into(),
            },
            Err(before) => {
                let before = before.duration();
                rustix::fs::Timespec {
                    tv_sec: -i64::try_from(before.as_secs()).unwrap_or(i64::MAX) - 1,
                    tv_nsec: (1_000_000_000 - i64::from(before.subsec_nanos())) % 1_000_000_000,
                }
            }
        },
    }
}

/// The permission bits a new object created with `mode` in the directory `parent` gets from
/// Linux: `mode`'s (the kernel masked them with the caller's umask already); in a setgid
/// directory a new directory is setgid too, and a new group-executable file keeps a setgid bit
/// asked for only if the caller belongs to the directory's group (or is root).
fn new_mode(caller: &Caller, parent: &Stat, directory: bool, mode: u32) -> u32 {
    let mut wanted = mode & 0o7777;
    if parent.st_mode & libc::S_ISGID != 0 {
        let group_executable_setgid = libc::S_ISGID | libc::S_IXGRP;
        if directory {
            wanted |= libc::S_ISGID;
        } else if wanted & group_executable_setgid == group_executable_setgid
            && caller.uid != 0
            && !caller.in_group(parent.st_gid)
        {
            wanted &= !libc::S_ISGID;
        }
    }
    wanted
}

/// Who made a request: the process's ids as the kernel passed them.
#[derive(Debug, Clone, Copy)]
struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Caller {
    fn of(req: &Request) -> Caller {
        Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() }
    }

    /// Whether the caller belongs to `gid`: its own group, or one of its supplementary groups
    /// (read from `/proc/PID/status`; if the caller is gone, only its own group counts).
    fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return false;
        };
        status
            .lines()
            .find_map(|line| line.strip_prefix("Groups:"))
            .is_some_and(|groups| groups.split_whitespace().any(|g| g.parse() == Ok(gid)))
    }
}

impl Shared {
    fn inode(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        self.inodes
            .lock()
            .by_ino
            .get(&ino.0)
            .map(|(inode, _)| Arc::clone(inode))
            .ok_or(Errno::ESTALE)
    }

    fn check_writable(&self) -> Result<(), Errno> {
        if self.stopping.load(Ordering::SeqCst) { Err(Errno::EROFS) } else { Ok(()) }
    }

    /// The attributes of the backing object `inode` (whose `fstat` is `stat`), with ebb's
    /// size and write time for a cached file.
    fn attr(&self, ino: u64, stat: &Stat, inode: &Inode) -> FileAttr {
        let kind = kind_of(stat.st_mode);
        let mut size = u64::try_from(stat.st_size).unwrap_or(0);
        let mut mtime = time(stat.st_mtime, stat.st_mtime_nsec as i64);
        let mut ctime = time(stat.st_ctime, stat.st_ctime_nsec as i64);
        if kind == FileType::RegularFile {
            let backing = (stat.st_dev, stat.st_ino);
            if let Some(times) = self.kept_times(backing).and_then(|times| times.get()) {
                mtime = time(times.mtime.tv_sec, times.mtime.tv_nsec);
                ctime = time(times.ctime.tv_sec, times.ctime.tv_nsec);
            }
            let cached = self.anchors.lock().get(&backing).map(|anchor| Arc::clone(&anchor.file));
            if let Some(file) = cached {
                if let Ok(len) = file.len() {
                    size = len;
                }
            } else if let Some(len) = self.with_idle(inode, |file| file.len()) {
                // On error the size on disk is the best answer left.
                size = len.unwrap_or(size);
            }
        }
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512).max(u64::try_from(stat.st_blocks).unwrap_or(0)),
            atime: time(stat.st_atime, stat.st_atime_nsec as i64),
            mtime,
            ctime,
            crtime: UNIX_EPOCH,
            kind,
            perm: (stat.st_mode & 0o7777) as u16,
            nlink: u32::try_from(stat.st_nlink).unwrap_or(u32::MAX),
            uid: stat.st_uid,
            gid: stat.st_gid,
            rdev: u32::try_from(stat.st_rdev).unwrap_or(0),
            blksize: 4096,
            flags: 0,
        }
    }

    fn getattr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let inode = self.inode(ino)?;
        let stat = rustix::fs::fstat(&inode.fd).map_err(errno)?;
        Ok(self.attr(ino.0, &stat, &inode))
    }

    /// Runs `work` on a handle attached for the call if the file has no anchor but the
    /// runtime may still cache it (its key is idle); `None` if it has no idle key.
    fn with_idle<T>(
        &self,
        inode: &Inode,
        work: impl FnOnce(&dyn DataFile) -> io::Result<T>,
    ) -> Option<io::Result<T>> {
        let key = self.idle_keys.lock().get(&inode.backing).copied()?;
        let times = self.file_times(inode.backing);
        Some(self.data.attach(key, &inode.proc_path(), &times).and_then(|file| {
            let result = work(file.as_ref());
            result.and_then(|value| file.close().map(|()| value))
        }))
    }

    /// Looks `name` up in `parent`, counting one kernel reference on the result.
    fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let dir = self.inode(parent)?;
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&dir.fd, name, flags, Mode::empty()).map_err(errno)?;
        let stat = rustix::fs::fstat(&fd).map_err(errno)?;
        let backing = (stat.st_dev, stat.st_ino);
        let (ino, inode) = {
            let mut inodes = self.inodes.lock();
            let ino = inodes.node_id(backing);
            let entry =
                inodes.by_ino.entry(ino).or_insert_with(|| (Arc::new(Inode { fd, backing }), 0));
            entry.1 += 1;
            (ino, Arc::clone(&entry.0))
        };
        Ok(self.attr(ino, &stat, &inode))
    }

    fn forget(&self, ino: u64, count: u64) {
        if ino == INodeNo::ROOT.0 {
            return;
        }
        let mut inodes = self.inodes.lock();
        let Some(entry) = inodes.by_ino.get_mut(&ino) else { return };
        entry.1 = entry.1.saturating_sub(count);
        if entry.1 == 0 {
            inodes.by_ino.remove(&ino);
        }
    }

    /// Gives the new object `name` of `dir` the owner and mode a local filesystem would have
    /// given it (see [`Shared::set_new_owner_and_mode`]).
    fn finish_new(
        &self,
        caller: &Caller,
        dir: &Inode,
        name: &OsStr,
        mode: u32,
    ) -> Result<(), Errno> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&dir.fd, name, flags, Mode::empty()).map_err(errno)?;
        let result = self.set_new_owner_and_mode(caller, dir, &fd, mode);
        if result.is_err() {
            // Not left behind owned by the wrong user or with the wrong mode.
            let directory = rustix::fs::fstat(&fd)
                .is_ok_and(|stat| kind_of(stat.st_mode) == FileType::Directory);
            let flags = if directory { AtFlags::REMOVEDIR } else { AtFlags::empty() };
            let _ = rustix::fs::unlinkat(&dir.fd, name, flags);
        }
        result
    }

    /// Sets the owner and mode of the new object `fd` (an `O_PATH` or open descriptor) created
    /// in `dir` with `mode` (type bits ignored), as `caller` would have got them
    /// from a local filesystem. Owner first: a chown clears setuid and setgid, and the mode
    /// asked for is set exactly (the kernel applied the caller's umask already; ebb's own umask
    /// was applied again at creation).
    fn set_new_owner_and_mode(
        &self,
        caller: &Caller,
        dir: &Inode,
        fd: &OwnedFd,
        mode: u32,
    ) -> Result<(), Errno> {
        let parent = rustix::fs::fstat(&dir.fd).map_err(errno)?;
        let stat = rustix::fs::fstat(fd).map_err(errno)?;
        let kind = kind_of(stat.st_mode);
        if kind == FileType::Symlink {
            // A symlink's mode is always 0777; only its owner matters.
            return self.chown_new(caller, fd, parent.st_mode & libc::S_ISGID != 0);
        }
        let wanted = new_mode(caller, &parent, kind == FileType::Directory, mode);
        self.chown_new(caller, fd, parent.st_mode & libc::S_ISGID != 0)?;
        // Through the descriptor's /proc link: the name may have been replaced meanwhile.
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd));
        rustix::fs::chmod(path, Mode::from_raw_mode(wanted)).map_err(errno)
    }

    /// Gives a new object to the calling user when we run as root: its uid, and its gid unless
    /// the directory is setgid (the object then has the directory's group already).
    fn chown_new(&self, caller: &Caller, fd: &OwnedFd, setgid_parent: bool) -> Result<(), Errno> {
        if !self.root {
            return Ok(());
        }
        let uid = Some(rustix::fs::Uid::from_raw(caller.uid));
        let gid = (!setgid_parent).then(|| rustix::fs::Gid::from_raw(caller.gid));
        let flags = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
        rustix::fs::chownat(fd, "", uid, gid, flags).map_err(errno)
    }

    /// Marks the file `name` in `dir` as losing its last name, if it is a regular file with
    /// one link; returns its backing identity to pass to [`Shared::after_remove`].
    fn before_remove(&self, dir: &Inode, name: &OsStr) -> Option<BackingId> {
        let stat = rustix::fs::statat(&dir.fd, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        (kind_of(stat.st_mode) == FileType::RegularFile && stat.st_nlink <= 1)
            .then_some((stat.st_dev, stat.st_ino))
    }

    /// The file lost its last name: its anchor goes now, or at its last close.
    fn after_remove(&self, backing: BackingId) {
        let idle = self.idle_keys.lock().remove(&backing);
        let closing = {
            let mut anchors = self.anchors.lock();
            match anchors.get_mut(&backing) {
                Some(anchor) if anchor.open_handles == 0 => anchors.remove(&backing),
                Some(anchor) => {
                    anchor.unlinked = true;
                    None
                }
                None => None,
            }
        };
        if let Some(anchor) = closing {
            // The file has no name and no opener: its data can no longer be read by anyone.
            let key = anchor.key;
            let _ = close_anchor(anchor);
            self.data.discard(key);
        } else if let Some(key) = idle {
            // Closed past the anchor limit, only its key was kept: drop its cached data too.
            self.data.discard(key);
        }
    }

    /// Opens a handle on the regular file `inode` (creating its anchor on the first open).
    fn open_handle(&self, inode: &Inode) -> io::Result<u64> {
        let path = inode.proc_path();
        let times = self.file_times(inode.backing);
        let key = {
            let mut anchors = self.anchors.lock();
            if let Some(anchor) = anchors.get_mut(&inode.backing) {
                anchor.open_handles += 1;
                anchor.key
            } else {
                let idle = self.idle_keys.lock().remove(&inode.backing);
                let key = idle.unwrap_or_else(|| self.next_key.fetch_add(1, Ordering::Relaxed));
                let file = match self.data.attach(key, &path, &times) {
                    Ok(file) => file,
                    Err(error) => {
                        if let Some(key) = idle {
                            self.idle_keys.lock().insert(inode.backing, key);
                        }
                        return Err(error);
                    }
                };
                let file = Arc::new(file);
                let _times = Arc::clone(&times);
                let anchor = Anchor { key, file, open_handles: 1, unlinked: false, _times };
                anchors.insert(inode.backing, anchor);
                key
            }
        };
        match self.data.attach(key, &path, &times) {
            Ok(file) => {
                let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
                let handle = Arc::new(Handle { file, backing: inode.backing, times });
                self.handles.lock().insert(fh, handle);
                Ok(fh)
            }
            Err(error) => {
                self.release_anchor(inode.backing);
                Err(error)
            }
        }
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// Closes the handle `fh`; errors not yet reported to it come back here.
    fn release(&self, fh: FileHandle) -> io::Result<()> {
        let Some(handle) = self.handles.lock().remove(&fh.0) else { return Ok(()) };
        let backing = handle.backing;
        let result = match Arc::into_inner(handle) {
            Some(handle) => handle.file.close(),
            None => Ok(()),
        };
        self.release_anchor(backing);
        result
    }

    /// One handle of the file closed: drop the anchor if the file has no name any more, or if
    /// there are too many anchors (then its key stays known, see the module doc).
    fn release_anchor(&self, backing: BackingId) {
        let closing = {
            let mut anchors = self.anchors.lock();
            let too_many = anchors.len() > self.anchor_limit;
            match anchors.get_mut(&backing) {
                Some(anchor) => {
                    anchor.open_handles = anchor.open_handles.saturating_sub(1);
                    if anchor.open_handles == 0 && (anchor.unlinked || too_many) {
                        anchors.remove(&backing)
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        if let Some(anchor) = closing {
            let (key, unlinked) = (anchor.key, anchor.unlinked);
            if !unlinked {
                self.idle_keys.lock().insert(backing, key);
            }
            if let Err(error) = close_anchor(anchor) {
                eprintln!("ebb mount: closing a file: {error}");
            }
            if unlinked {
                // The last close of a file without a name: nobody can read its data again.
                self.data.discard(key);
            }
        }
    }

    /// Sets the size of the regular file `inode`: through its handle or anchor when ebb caches
    /// it, directly on the backing file when it does not.
    fn truncate(&self, inode: &Inode, fh: Option<FileHandle>, size: u64) -> io::Result<()> {
        self.truncate_cached(inode, fh, size)?;
        if let Some(times) = self.kept_times(inode.backing) {
            times.written();
        }
        Ok(())
    }

    fn truncate_cached(&self, inode: &Inode, fh: Option<FileHandle>, size: u64) -> io::Result<()> {
        if let Some(fh) = fh
            && let Some(handle) = self.handles.lock().get(&fh.0).cloned()
        {
            return handle.file.set_len(size);
        }
        let anchor = self.anchors.lock().get(&inode.backing).map(|a| Arc::clone(&a.file));
        if let Some(file) = anchor {
            return file.set_len(size);
        }
        if let Some(result) = self.with_idle(inode, |file| file.set_len(size)) {
            return result;
        }
        let file = std::fs::OpenOptions::new().write(true).open(inode.proc_path())?;
        file.set_len(size)
    }

    /// The inode `ino` for an extended attribute change: not a symlink, whose `user.`
    /// attributes Linux refuses (`EPERM`), and which `/proc/self/fd` would follow.
    fn xattr_inode(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        let inode = self.inode(ino)?;
        let stat = rustix::fs::fstat(&inode.fd).map_err(errno)?;
        if kind_of(stat.st_mode) == FileType::Symlink {
            return Err(Errno::EPERM);
        }
        Ok(inode)
    }

    /// `fallocate(2)` of the open file `fh`: the plain mode (allocate, growing the size ebb
    /// knows if the range ends past it) and `KEEP_SIZE` (allocate only) reserve the space in
    /// the backing file. Modes that change data (punching a hole, zeroing, collapsing or
    /// inserting a range) are `EOPNOTSUPP`: ebb's cache may hold newer data for the range.
    fn fallocate(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        use rustix::fs::FallocateFlags;
        let mode = FallocateFlags::from_bits_retain(mode as u32);
        if !(mode.is_empty() || mode == FallocateFlags::KEEP_SIZE) {
            return Err(Errno::EOPNOTSUPP);
        }
        self.check_writable()?;
        let end = offset.checked_add(length).filter(|&end| end <= i64::MAX as u64);
        let end = end.ok_or(Errno::EFBIG)?;
        let handle = self.handle(fh)?;
        let inode = self.inode(ino)?;
        let flags = OFlags::WRONLY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(inode.proc_path(), flags, Mode::empty()).map_err(errno)?;
        // The backing file keeps its size: the size is ebb's to change, through the cache.
        rustix::fs::fallocate(&fd, FallocateFlags::KEEP_SIZE, offset, length).map_err(errno)?;
        // The kernel holds the file's inode lock through a fallocate and through every write
        // that extends the file, so the size cannot grow between this check and the set.
        if mode.is_empty() && end > handle.file.len().map_err(|error| errno_of(&error))? {
            handle.file.set_len(end).map_err(|error| errno_of(&error))?;
            handle.times.written();
        } else {
            self.status_changed(inode.backing);
        }
        Ok(())
    }

    /// The times ebb keeps for the file `backing`, created if nothing holds them yet.
    fn file_times(&self, backing: BackingId) -> Arc<FileTimes> {
        let mut map = self.times.lock();
        if let Some(times) = map.get(&backing).and_then(Weak::upgrade) {
            return times;
        }
        // Forget files that left the cache once they are half the map.
        if map.len() >= 1024 && map.len().is_power_of_two() {
            map.retain(|_, times| times.strong_count() > 0);
        }
        let times = Arc::new(FileTimes::default());
        map.insert(backing, Arc::downgrade(&times));
        times
    }

    /// The times ebb keeps for the file `backing`, if anything holds them.
    fn kept_times(&self, backing: BackingId) -> Option<Arc<FileTimes>> {
        self.times.lock().get(&backing).and_then(Weak::upgrade)
    }

    /// The status of the file `backing` changed through the mount (see [`crate::times`]).
    fn status_changed(&self, backing: BackingId) {
        if let Some(times) = self.kept_times(backing) {
            times.status_changed();
        }
    }

    fn read_dir(&self, inode: &Inode) -> io::Result<Vec<DirEntry>> {
        let fd = rustix::fs::open(
            inode.proc_path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut entries = Vec::new();
        let mut dir = rustix::fs::Dir::read_from(&fd)?;
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let kind = match entry.file_type() {
                rustix::fs::FileType::Directory => FileType::Directory,
                rustix::fs::FileType::Symlink => FileType::Symlink,
                rustix::fs::FileType::Fifo => FileType::NamedPipe,
                rustix::fs::FileType::Socket => FileType::Socket,
                rustix::fs::FileType::CharacterDevice => FileType::CharDevice,
                rustix::fs::FileType::BlockDevice => FileType::BlockDevice,
                _ => FileType::RegularFile,
            };
            let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_owned();
            entries.push(DirEntry { ino: entry.ino(), kind, name });
        }
        Ok(entries)
    }
}

/// Runs `work` and answers with its entry or error.
fn entry(reply: ReplyEntry, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, fuser::Generation(0)),
        Err(error) => reply.error(error),
    }
}

impl Filesystem for EbbFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Best effort: the kernel may offer less.
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.shared.lookup(parent, name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.shared.getattr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(error) => reply.error(error),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let shared = Arc::clone(&self.shared);
        let work = move || -> Result<FileAttr, Errno> {
            shared.check_writable()?;
            let inode = shared.inode(ino)?;
            let path = inode.proc_path();
            if let Some(mode) = mode {
                rustix::fs::chmod(&path, Mode::from_raw_mode(mode & 0o7777)).map_err(errno)?;
                shared.status_changed(inode.backing);
            }
            if uid.is_some() || gid.is_some() {
                let uid = uid.map(rustix::fs::Uid::from_raw);
                let gid = gid.map(rustix::fs::Gid::from_raw);
                let flags = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
                rustix::fs::chownat(&inode.fd, "", uid, gid, flags).map_err(errno)?;
                shared.status_changed(inode.backing);
            }
            if let Some(size) = size {
                shared.truncate(&inode, fh, size).map_err(|error| errno_of(&error))?;
            }
            if atime.is_some() || mtime.is_some() {
                let times = rustix::fs::Timestamps {
                    last_access: to_timespec(atime),
                    last_modification: to_timespec(mtime),
                };
                let set = || -> io::Result<Stat> {
                    rustix::fs::utimensat(rustix::fs::CWD, &path, &times, AtFlags::empty())?;
                    Ok(rustix::fs::fstat(&inode.fd)?)
                };
                // Under the kept times' lock, so a write-back cannot put back the old mtime.
                match shared.kept_times(inode.backing) {
                    Some(kept) => kept.set_with(set),
                    None => set().map(drop),
                }
                .map_err(|error| errno_of(&error))?;
            }
            shared.getattr(ino)
        };
        // A truncate goes through the cache and may wait for it: not on the request loop.
        let run = move || match work() {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(error) => reply.error(error),
        };
        if size.is_some() { self.writes.run(run) } else { run() }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let result = self
            .shared
            .inode(ino)
            .and_then(|inode| rustix::fs::readlinkat(&inode.fd, "", Vec::new()).map_err(errno));
        match result {
            Ok(target) => reply.data(target.as_bytes()),
            Err(error) => reply.error(error),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let shared = &self.shared;
        let result = (|| {
            shared.check_writable()?;
            let dir = shared.inode(parent)?;
            let kind = rustix::fs::FileType::from_raw_mode(mode);
            let perm = Mode::from_raw_mode(mode & !umask & 0o7777);
            rustix::fs::mknodat(&dir.fd, name, kind, perm, u64::from(rdev)).map_err(errno)?;
            shared.finish_new(&Caller::of(req), &dir, name, mode)?;
            shared.lookup(parent, name)
        })();
        entry(reply, result);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let shared = &self.shared;
        let result = (|| {
            shared.check_writable()?;
            let dir = shared.inode(parent)?;
            let perm = Mode::from_raw_mode(mode & !umask & 0o7777);
            rustix::fs::mkdirat(&dir.fd, name, perm).map_err(errno)?;
            shared.finish_new(&Caller::of(req), &dir, name, mode)?;
            shared.lookup(parent, name)
        })();
        entry(reply, result);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let shared = &self.shared;
        let result = (|| {
            shared.check_writable()?;
            let dir = shared.inode(parent)?;
            let file = rustix::fs::statat(&dir.fd, name, AtFlags::SYMLINK_NOFOLLOW).ok();
            let last = shared.before_remove(&dir, name);
            rustix::fs::unlinkat(&dir.fd, name, AtFlags::empty()).map_err(errno)?;
            match (last, file) {
                (Some(backing), _) => shared.after_remove(backing),
                (None, Some(file)) => shared.status_changed((file.st_dev, file.st_ino)),
                (None, None) => {}
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = (|| {
            self.shared.check_writable()?;
            let dir = self.shared.inode(parent)?;
            rustix::fs::unlinkat(&dir.fd, name, AtFlags::REMOVEDIR).map_err(errno)
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let shared = &self.shared;
        let result = (|| {
            shared.check_writable()?;
            let dir = shared.inode(parent)?;
            rustix::fs::symlinkat(target, &dir.fd, link_name).map_err(errno)?;
            shared.finish_new(&Caller::of(req), &dir, link_name, 0o777)?;
            shared.lookup(parent, link_name)
        })();
        entry(reply, result);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let shared = &self.shared;
        let result = (|| {
            shared.check_writable()?;
            let from = shared.inode(parent)?;
            let to = shared.inode(newparent)?;
            // A replaced target loses a name (unless it is the source itself or swapped).
            let source =
                rustix::fs::statat(&from.fd, name, AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
            let replaced = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                None
            } else {
                shared
                    .before_remove(&to, newname)
                    .filter(|&backing| backing != (source.st_dev, source.st_ino))
            };
            let raw = rustix::fs::RenameFlags::from_bits_retain(flags.bits());
            rustix::fs::renameat_with(&from.fd, name, &to.fd, newname, raw).map_err(errno)?;
            shared.status_changed((source.st_dev, source.st_ino));
            if let Some(backing) = replaced {
                shared.after_remove(backing);
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let shared = &self.shared;
        let result = (|| {
            shared.check_writable()?;
            let inode = shared.inode(ino)?;
            let dir = shared.inode(newparent)?;
            let flags = AtFlags::SYMLINK_FOLLOW;
            rustix::fs::linkat(rustix::fs::CWD, inode.proc_path(), &dir.fd, newname, flags)
                .map_err(errno)?;
            shared.status_changed(inode.backing);
            shared.lookup(newparent, newname)
        })();
        entry(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let shared = &self.shared;
        let result = (|| {
            let writing = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
            if writing {
                shared.check_writable()?;
            }
            let inode = shared.inode(ino)?;
            shared.open_handle(&inode).map_err(|error| errno_of(&error))
        })();
        match result {
            Ok(fh) => reply.opened(
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            ),
            Err(error) => reply.error(error),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let shared = Arc::clone(&self.shared);
        // As in the kernel, a reader that opened the file with O_DIRECT reads around the
        // cache (and its latency is what wbt protects); others read through it.
        let direct = flags.0 & libc::O_DIRECT != 0
            && offset.is_multiple_of(4096)
            && u64::from(size).is_multiple_of(4096);
        self.reads.run(move || {
            let result = shared.handle(fh).and_then(|handle| {
                let mut buf = vec![0; size as usize];
                let done = if direct {
                    read_direct(handle.file.as_ref(), &mut buf, offset)
                } else {
                    read_cached(handle.file.as_ref(), &mut buf, offset)
                };
                buf.truncate(done.map_err(|error| errno_of(&error))?);
                Ok(buf)
            });
            match result {
                Ok(buf) => reply.data(&buf),
                Err(error) => reply.error(error),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Err(error) = self.shared.check_writable() {
            reply.error(error);
            return;
        }
        let shared = Arc::clone(&self.shared);
        let data = data.to_vec();
        self.writes.run(move || {
            let result = shared.handle(fh).and_then(|handle| {
                let mut done = 0;
                while done < data.len() {
                    match handle.file.write_at(&data[done..], offset + done as u64) {
                        Ok(0) => return Err(Errno::EIO),
                        Ok(written) => done += written,
                        Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                        Err(error) => return Err(errno_of(&error)),
                    }
                }
                handle.times.written();
                Ok(done)
            });
            match result {
                Ok(done) => reply.written(u32::try_from(done).unwrap_or(u32::MAX)),
                Err(error) => reply.error(error),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) does not write the data (as on a local filesystem; fsync does), but it
        // reports a write-back error this handle has not seen yet, once, as close(2) on NFS
        // does: the release that follows cannot reach the caller.
        match self.shared.handle(fh).and_then(|h| h.file.check_error().map_err(|e| errno_of(&e))) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let shared = Arc::clone(&self.shared);
        self.writes.run(move || match shared.release(fh) {
            Ok(()) => reply.ok(),
            Err(error) => {
                // The kernel does not pass release errors on to close(2); say it here.
                eprintln!("ebb mount: a write error was reported at close: {error}");
                reply.error(errno_of(&error));
            }
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let shared = Arc::clone(&self.shared);
        self.writes.run(move || {
            match shared.handle(fh).and_then(|h| h.file.fsync().map_err(|e| errno_of(&e))) {
                Ok(()) => reply.ok(),
                Err(error) => reply.error(error),
            }
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let shared = &self.shared;
        let result = shared
            .inode(ino)
            .and_then(|inode| shared.read_dir(&inode).map_err(|error| errno_of(&error)));
        match result {
            Ok(entries) => {
                let fh = shared.next_handle.fetch_add(1, Ordering::Relaxed);
                shared.dirs.lock().insert(fh, Arc::new(entries));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(error) => reply.error(error),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(entries) = self.shared.dirs.lock().get(&fh.0).cloned() else {
            reply.error(Errno::EBADF);
            return;
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (index, entry) in entries.iter().enumerate().skip(start) {
            if reply.add(INodeNo(entry.ino), index as u64 + 1, entry.kind, &entry.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.shared.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.shared.inode(ino).and_then(|inode| {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let fd = rustix::fs::open(inode.proc_path(), flags, Mode::empty()).map_err(errno)?;
            rustix::fs::fsync(&fd).map_err(errno)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let result = self
            .shared
            .inode(ino)
            .and_then(|inode| rustix::fs::statvfs(inode.proc_path()).map_err(errno));
        match result {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                u32::try_from(s.f_bsize).unwrap_or(4096),
                u32::try_from(s.f_namemax).unwrap_or(255),
                u32::try_from(s.f_frsize).unwrap_or(4096),
            ),
            Err(error) => reply.error(error),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let value = if ino == INodeNo::ROOT && name == STATS_XATTR {
            Ok(self.shared.data.stats_json().into_bytes())
        } else {
            self.shared.inode(ino).and_then(|inode| {
                let stat = rustix::fs::fstat(&inode.fd).map_err(errno)?;
                if kind_of(stat.st_mode) == FileType::Symlink {
                    return Err(Errno::ENODATA);
                }
                get_xattr(&inode.proc_path(), name).map_err(errno)
            })
        };
        xattr_reply(reply, value, size);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let value = self.shared.inode(ino).and_then(|inode| {
            let stat = rustix::fs::fstat(&inode.fd).map_err(errno)?;
            let mut list = if kind_of(stat.st_mode) == FileType::Symlink {
                Vec::new()
            } else {
                list_xattr(&inode.proc_path()).map_err(errno)?
            };
            if ino == INodeNo::ROOT {
                list.extend_from_slice(STATS_XATTR.as_bytes());
                list.push(0);
            }
            Ok(list)
        });
        xattr_reply(reply, value, size);
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let shared = &self.shared;
        let result = (|| {
            if ino == INodeNo::ROOT && name == STATS_XATTR {
                return Err(Errno::EPERM);
            }
            shared.check_writable()?;
            let inode = shared.xattr_inode(ino)?;
            let flags = rustix::fs::XattrFlags::from_bits_retain(flags as u32);
            rustix::fs::setxattr(inode.proc_path(), name, value, flags).map_err(errno)?;
            shared.status_changed(inode.backing);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let shared = &self.shared;
        let result = (|| {
            if ino == INodeNo::ROOT && name == STATS_XATTR {
                return Err(Errno::EPERM);
            }
            shared.check_writable()?;
            let inode = shared.xattr_inode(ino)?;
            rustix::fs::removexattr(inode.proc_path(), name).map_err(errno)?;
            shared.status_changed(inode.backing);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let shared = Arc::clone(&self.shared);
        self.writes.run(move || match shared.fallocate(ino, fh, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let shared = Arc::clone(&self.shared);
        let name = name.to_owned();
        let caller = Caller::of(req);
        let work = move || -> Result<(FileAttr, u64), Errno> {
            shared.check_writable()?;
            let dir = shared.inode(parent)?;
            let perm = Mode::from_raw_mode(mode & !umask & 0o7777);
            let base = OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
            let excl = OFlags::CREATE | OFlags::EXCL;
            match rustix::fs::openat(&dir.fd, &name, base | excl, perm) {
                Ok(fd) => {
                    if let Err(error) = shared.set_new_owner_and_mode(&caller, &dir, &fd, mode) {
                        let _ = rustix::fs::unlinkat(&dir.fd, &name, AtFlags::empty());
                        return Err(error);
                    }
                }
                Err(rustix::io::Errno::EXIST) if flags & libc::O_EXCL == 0 => {}
                Err(error) => return Err(errno(error)),
            }
            let attr = shared.lookup(parent, &name)?;
            if attr.kind != FileType::RegularFile {
                shared.forget(attr.ino.0, 1);
                return Err(if attr.kind == FileType::Directory {
                    Errno::EISDIR
                } else {
                    Errno::EINVAL
                });
            }
            let opened = shared.inode(attr.ino).and_then(|inode| {
                let fh = shared.open_handle(&inode).map_err(|error| errno_of(&error))?;
                if flags & libc::O_TRUNC != 0
                    && let Err(error) = shared.truncate(&inode, Some(FileHandle(fh)), 0)
                {
                    let _ = shared.release(FileHandle(fh));
                    return Err(errno_of(&error));
                }
                Ok(fh)
            });
            match opened {
                Ok(fh) => Ok((shared.getattr(attr.ino)?, fh)),
                Err(error) => {
                    shared.forget(attr.ino.0, 1);
                    Err(error)
                }
            }
        };
        let run = move || match work() {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                fuser::Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            ),
            Err(error) => reply.error(error),
        };
        // With O_TRUNC this goes through the cache and may wait for it.
        if flags & libc::O_TRUNC != 0 { self.writes.run(run) } else { run() }
    }
}

/// The largest extended attribute value or name list Linux allows (`XATTR_SIZE_MAX`).
const XATTR_MAX: usize = 1 << 16;

/// The value of the extended attribute `name` of `path` (following symlinks).
pub(crate) fn get_xattr(path: &Path, name: &OsStr) -> Result<Vec<u8>, rustix::io::Errno> {
    let mut value = Vec::with_capacity(XATTR_MAX);
    rustix::fs::getxattr(path, name, rustix::buffer::spare_capacity(&mut value))?;
    Ok(value)
}

fn list_xattr(path: &Path) -> Result<Vec<u8>, rustix::io::Errno> {
    let mut list = Vec::with_capacity(XATTR_MAX);
    rustix::fs::listxattr(path, rustix::buffer::spare_capacity(&mut list))?;
    Ok(list)
}

/// Reads through the cache until `buf` is full or the file ends.
fn read_cached(file: &dyn DataFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(read) => done += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}

/// An aligned read around the cache, cut at the size ebb knows. The backing file may end
/// before that size (a hole the cache added by growing the file, never written) or after it
/// (its last page is written whole): the first reads as zeros, the second is cut.
fn read_direct(file: &dyn DataFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let size = file.len()?;
    let valid = usize::try_from(size.saturating_sub(offset)).unwrap_or(usize::MAX).min(buf.len());
    if valid == 0 {
        return Ok(0);
    }
    let read = file.read_direct_at(buf, offset)?;
    if read < valid {
        buf[read..valid].fill(0);
    }
    Ok(valid)
}

fn xattr_reply(reply: ReplyXattr, value: Result<Vec<u8>, Errno>, size: u32) {
    match value {
        Ok(value) if size == 0 => reply.size(u32::try_from(value.len()).unwrap_or(u32::MAX)),
        Ok(value) if value.len() <= size as usize => reply.data(&value),
        Ok(_) => reply.error(Errno::ERANGE),
        Err(error) => reply.error(error),
    }
}
