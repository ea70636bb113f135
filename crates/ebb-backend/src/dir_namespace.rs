//! `DirNamespace`: a local directory as a [`Namespace`], the passthrough `ebb mount` serves.
//!
//! Operations go through an `O_PATH` descriptor of the node's object, as `*at` calls relative
//! to it, and never build paths: a rename in the directory, even of a parent, cannot send an
//! operation to the wrong object. Calls that have no `*at` form with an empty path go through
//! the descriptor's `/proc/self/fd/N` link, which names the object itself.
//!
//! * **Descriptors.** A node also has the object's file handle (`name_to_handle_at`), so its
//!   descriptor, and that of a file it opened for data, need not stay open: they live in an
//!   [`FdCache`] that keeps at most a fixed number open (half the process's descriptor limit)
//!   and closes the least recently used, and a closed one is opened again by handle, which
//!   finds the object whatever its names are now (renamed, linked, or replaced under its old
//!   name, when the handle still names the old object; `ESTALE` once that no longer exists).
//!   Nodes hold their descriptor for good (*pinned*) where handles cannot be used: a
//!   filesystem without them, an object on another filesystem mounted inside the directory,
//!   or a process without `CAP_DAC_READ_SEARCH` (not root); and a node whose object loses its
//!   last name through this namespace (unlink, rmdir, a rename onto it) is pinned just before,
//!   so that a file removed while open keeps its data and stays usable, as before.
//! * **Identity.** `ino` is the backing inode number, so it stays the same for the life of the
//!   file and across mounts. Objects on other filesystems mounted inside the directory, and any
//!   numbered 0 or 1, get numbers of ours from `2^63` up, kept for the life of the namespace.
//!   `generation` is a digest of the file handle (0 for an object without one), so an object
//!   that reuses a removed object's number has another generation.
//! * **Owners and modes.** The process runs as root and creates objects itself, so it gives
//!   each new one what a local filesystem would have given the caller: the caller's uid, its
//!   gid or a setgid directory's (whose setgid bit new directories inherit; a new file keeps a
//!   setgid bit asked for only if the caller is in the directory's group), and exactly the
//!   mode asked for. The owner is set first and the mode after, because a chown clears setuid
//!   and setgid, and the mode is set explicitly because the process's own umask applies when
//!   the object is created. Not running as root, objects belong to the process's user.
//! * **Data.** [`Namespace::open_file`] opens the file with `O_DIRECT` like a [`DirBackend`]
//!   file ([`crate::open_direct_path`]); [`DirNamespace::open_buffered`] opens files with
//!   buffered IO instead (comparisons, and filesystems without `O_DIRECT`).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FallocateFlags, Mode, OFlags, Stat, Timespec, XattrFlags};
use rustix::io::Errno;

use crate::backend::{Backend, BackendFile};
use crate::dir::{DirBackend, open_reopenable};
use crate::fd_cache::{FdCache, Slot};
use crate::handle::FileHandle;
use crate::namespace::{
    Attr, Credentials, DirEntries, DirEntry, FileKind, Namespace, RenameFlags, SetAttr, SetTime,
    StatFs, XattrSet,
};

/// The first `ino` given to objects that cannot use their backing inode number. Backing
/// filesystems number inodes far below this (ext4 uses 32 bits).
const OTHER_INOS: u64 = 1 << 63;

/// The largest extended attribute value or name list Linux allows (`XATTR_SIZE_MAX`).
const XATTR_MAX: usize = 1 << 16;

/// The `ino` given to objects that cannot use their inode number, by `(device, inode)`, and
/// the next one to give.
type OtherInos = (HashMap<(u64, u64), u64>, u64);

/// The nodes that exist and can be reopened by handle, by `ino` (the first made of each
/// object, which the mount keeps), so that one losing its last name can be pinned.
type LiveNodes = Mutex<HashMap<u64, Weak<NodeInner>>>;

/// A local directory served as a namespace.
pub struct DirNamespace {
    path: PathBuf,
    root: DirNode,
    /// A descriptor of the root, not `O_PATH` (file handles are opened on its mount).
    root_fd: Arc<OwnedFd>,
    /// The id of the directory's mount, if file handles can be used there (see the module
    /// doc).
    handle_mount: Option<i32>,
    cache: Arc<FdCache>,
    live: Arc<LiveNodes>,
    /// The directory's device: its objects' `ino` are their inode numbers.
    device: u64,
    /// `ino` of objects that cannot use their own (see the module doc).
    others: Mutex<OtherInos>,
    backend: Arc<DirBackend>,
    direct: bool,
    /// Whether the process runs as root (then new objects are given to the caller).
    root_user: bool,
}

impl fmt::Debug for DirNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirNamespace").field("path", &self.path).finish_non_exhaustive()
    }
}

/// A node of a [`DirNamespace`]: the object's file handle and its `O_PATH` descriptor while
/// that is open (see the module doc).
#[derive(Clone, Debug)]
pub struct DirNode(Arc<NodeInner>);

#[derive(Debug)]
struct NodeInner {
    /// The `O_PATH` descriptor, while open.
    slot: Arc<Slot>,
    /// Opens the object again; `None`: the slot is pinned.
    handle: Option<FileHandle>,
    /// The handle's digest (the `generation` told), 0 without a handle.
    generation: u64,
    /// The object's `ino`, and the namespace's live nodes this one is among (if it has a
    /// handle), which it leaves when dropped.
    ino: u64,
    live: Weak<LiveNodes>,
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        let Some(live) = self.live.upgrade() else { return };
        let mut live = live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.get(&self.ino).is_some_and(|node| std::ptr::eq(node.as_ptr(), self)) {
            live.remove(&self.ino);
        }
    }
}

/// A path that names the object of `fd` itself (`/proc/self/fd/N`), valid while `fd` is open.
fn proc_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn path_flags() -> OFlags {
    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn kind_of(mode: u32) -> FileKind {
    match rustix::fs::FileType::from_raw_mode(mode) {
        rustix::fs::FileType::Directory => FileKind::Directory,
        rustix::fs::FileType::Symlink => FileKind::Symlink,
        rustix::fs::FileType::Fifo => FileKind::Fifo,
        rustix::fs::FileType::Socket => FileKind::Socket,
        rustix::fs::FileType::CharacterDevice => FileKind::CharDevice,
        rustix::fs::FileType::BlockDevice => FileKind::BlockDevice,
        _ => FileKind::Regular,
    }
}

fn file_type(kind: FileKind) -> rustix::fs::FileType {
    match kind {
        FileKind::Regular => rustix::fs::FileType::RegularFile,
        FileKind::Directory => rustix::fs::FileType::Directory,
        FileKind::Symlink => rustix::fs::FileType::Symlink,
        FileKind::Fifo => rustix::fs::FileType::Fifo,
        FileKind::Socket => rustix::fs::FileType::Socket,
        FileKind::CharDevice => rustix::fs::FileType::CharacterDevice,
        FileKind::BlockDevice => rustix::fs::FileType::BlockDevice,
    }
}

fn time(seconds: i64, nanos: u64) -> SystemTime {
    let nanos = Duration::from_nanos(nanos.min(999_999_999));
    if seconds >= 0 {
        UNIX_EPOCH + Duration::from_secs(seconds.unsigned_abs()) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs()) + nanos
    }
}

fn timespec(value: Option<SetTime>) -> Timespec {
    match value {
        None => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        Some(SetTime::Now) => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
        Some(SetTime::At(at)) => match at.duration_since(UNIX_EPOCH) {
            Ok(since) => Timespec {
                tv_sec: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: since.subsec_nanos().into(),
            },
            Err(before) => {
                let before = before.duration();
                let nanos = i64::from(before.subsec_nanos());
                let seconds = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
                if nanos == 0 {
                    Timespec { tv_sec: -seconds, tv_nsec: 0 }
                } else {
                    Timespec { tv_sec: -seconds - 1, tv_nsec: 1_000_000_000 - nanos }
                }
            }
        },
    }
}

impl DirNamespace {
    /// Serves the existing directory `path`, file data with `O_DIRECT` (`ErrorKind::
    /// Unsupported` if its filesystem refuses it). Errors name the path.
    pub fn open(path: impl AsRef<Path>) -> io::Result<DirNamespace> {
        let path = path.as_ref();
        // A missing directory or a file is told as such, before the probe of O_DIRECT (which
        // writes a file there) can fail with an error about that file.
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        rustix::fs::open(path, flags, Mode::empty())
            .map_err(|errno| in_path(path, errno.into()))?;
        let backend = DirBackend::open(path).map_err(|error| {
            let kind = error.kind();
            in_path(path, io::Error::new(kind, format!("cannot write files there: {error}")))
        })?;
        DirNamespace::with_backend(path, backend, true)
    }

    /// Serves the existing directory `path`, file data with buffered IO (the kernel's page
    /// cache of the directory caches it): for comparisons.
    pub fn open_buffered(path: impl AsRef<Path>) -> io::Result<DirNamespace> {
        let path = path.as_ref();
        let backend = DirBackend::open_buffered(path).map_err(|error| in_path(path, error))?;
        DirNamespace::with_backend(path, backend, false)
    }

    fn with_backend(path: &Path, backend: DirBackend, direct: bool) -> io::Result<DirNamespace> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::empty())
            .map_err(|errno| in_path(path, errno.into()))?;
        let stat = rustix::fs::fstat(&fd)?;
        // Not O_PATH: open_by_handle_at refuses such a descriptor of the mount.
        let root_fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| in_path(path, errno.into()))?;
        let root_fd = Arc::new(root_fd);
        // File handles are used if the root has one and can be opened by it.
        let handle_mount = FileHandle::of(fd.as_fd()).ok().and_then(|(handle, mount)| {
            let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
            handle.open(root_fd.as_fd(), flags).ok().map(|_| mount)
        });
        let root = NodeInner {
            slot: Slot::pinned(fd),
            handle: None,
            generation: 0,
            ino: 0,
            live: Weak::new(),
        };
        Ok(DirNamespace {
            path: path.to_path_buf(),
            root: DirNode(Arc::new(root)),
            root_fd,
            handle_mount,
            cache: Arc::new(FdCache::for_process()),
            live: Arc::new(Mutex::new(HashMap::new())),
            device: stat.st_dev,
            others: Mutex::new((HashMap::new(), OTHER_INOS)),
            backend: Arc::new(backend),
            direct,
            root_user: rustix::process::geteuid().is_root(),
        })
    }

    /// The `ino` of the backing object `(device, inode)` (see the module doc).
    fn ino(&self, device: u64, inode: u64) -> u64 {
        if device == self.device && inode > 1 && inode < OTHER_INOS {
            return inode;
        }
        let mut others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        let (map, next) = &mut *others;
        *map.entry((device, inode)).or_insert_with(|| {
            *next += 1;
            *next - 1
        })
    }

    fn attr(&self, stat: &Stat, generation: u64) -> Attr {
        Attr {
            ino: self.ino(stat.st_dev, stat.st_ino),
            generation,
            kind: kind_of(stat.st_mode),
            perm: (stat.st_mode & 0o7777) as u16,
            nlink: u32::try_from(stat.st_nlink).unwrap_or(u32::MAX),
            uid: stat.st_uid,
            gid: stat.st_gid,
            rdev: stat.st_rdev,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            blocks: u64::try_from(stat.st_blocks).unwrap_or(0),
            blksize: u32::try_from(stat.st_blksize).unwrap_or(4096),
            atime: time(stat.st_atime, stat.st_atime_nsec),
            mtime: time(stat.st_mtime, stat.st_mtime_nsec),
            ctime: time(stat.st_ctime, stat.st_ctime_nsec),
        }
    }

    /// The node of the object `fd` (an `O_PATH` descriptor of it), and its attributes.
    fn node_attr(&self, fd: OwnedFd) -> io::Result<(DirNode, Attr)> {
        let stat = rustix::fs::fstat(&fd)?;
        let handle = self.handle_mount.and_then(|root_mount| {
            let (handle, mount) = FileHandle::of(fd.as_fd()).ok()?;
            (mount == root_mount).then_some(handle)
        });
        let generation = handle.as_ref().map_or(0, FileHandle::digest);
        let attr = self.attr(&stat, generation);
        let Some(handle) = handle else {
            let node = NodeInner {
                slot: Slot::pinned(fd),
                handle: None,
                generation,
                ino: attr.ino,
                live: Weak::new(),
            };
            return Ok((DirNode(Arc::new(node)), attr));
        };
        let node = Arc::new(NodeInner {
            slot: Arc::new(Slot::default()),
            handle: Some(handle),
            generation,
            ino: attr.ino,
            live: Arc::downgrade(&self.live),
        });
        self.cache.put(&node.slot, fd);
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let known = live.get(&attr.ino).and_then(Weak::upgrade);
        if known.as_ref().is_none_or(|known| known.generation != generation) {
            live.insert(attr.ino, Arc::downgrade(&node));
        }
        // The lock first: dropping the last reference to the known node takes it again.
        drop(live);
        drop(known);
        Ok((DirNode(node), attr))
    }

    /// The node's `O_PATH` descriptor, opened again by handle if the cache closed it.
    fn fd(&self, node: &DirNode) -> io::Result<Arc<OwnedFd>> {
        self.cache.get(&node.0.slot, || self.reopen(&node.0, path_flags()))
    }

    /// Opens the object of `node` with `flags`: through its pinned descriptor if it has one,
    /// by handle otherwise.
    fn reopen(&self, node: &NodeInner, flags: OFlags) -> io::Result<OwnedFd> {
        reopen(node, &self.root_fd, flags)
    }

    /// The node's status, through its descriptor if that is open and without caching one
    /// opened for the call (so that visiting every node, as the mount's sweep for deleted
    /// files does, leaves the cache to the nodes in use).
    fn stat(&self, node: &DirNode) -> io::Result<Stat> {
        match node.0.slot.peek() {
            Some(fd) => Ok(rustix::fs::fstat(&*fd)?),
            None => Ok(rustix::fs::fstat(self.reopen(&node.0, path_flags())?)?),
        }
    }

    /// Before the name `name` in `parent` goes (unlink, rmdir, a rename onto it): if it is the
    /// last name of an object a node of this namespace has, that node and a descriptor of the
    /// object, for [`Slot::pin`] once the name is gone (see the module doc).
    fn last_name(&self, parent: &OwnedFd, name: &OsStr) -> Option<(Arc<NodeInner>, OwnedFd)> {
        self.handle_mount?;
        let stat = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let last = stat.st_nlink <= 1 || kind_of(stat.st_mode) == FileKind::Directory;
        if !last || stat.st_dev != self.device {
            return None;
        }
        let node = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&stat.st_ino)?
            .upgrade()?;
        let fd = rustix::fs::openat(parent, name, path_flags(), Mode::empty()).ok()?;
        let (handle, _) = FileHandle::of(fd.as_fd()).ok()?;
        (node.handle.as_ref() == Some(&handle)).then_some((node, fd))
    }

    /// Gives the new object `fd` (any descriptor of it) created in `parent` with `mode` the
    /// owner and mode a local filesystem would have given `caller` (see the module doc).
    fn own_new(
        &self,
        parent: &DirNode,
        fd: &OwnedFd,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<()> {
        let parent = rustix::fs::fstat(&*self.fd(parent)?)?;
        let stat = rustix::fs::fstat(fd)?;
        let kind = kind_of(stat.st_mode);
        let setgid_parent = parent.st_mode & SETGID != 0;
        if self.root_user {
            let uid = Some(rustix::fs::Uid::from_raw(caller.uid));
            // In a setgid directory the object has the directory's group already.
            let gid = (!setgid_parent).then(|| rustix::fs::Gid::from_raw(caller.gid));
            let flags = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
            rustix::fs::chownat(fd, "", uid, gid, flags)?;
        }
        if kind == FileKind::Symlink {
            return Ok(()); // a symlink's mode is always 0777
        }
        let mut wanted = mode & 0o7777;
        if setgid_parent {
            let group_executable_setgid = SETGID | 0o010;
            if kind == FileKind::Directory {
                wanted |= SETGID;
            } else if wanted & group_executable_setgid == group_executable_setgid
                && caller.uid != 0
                && !caller.in_group(parent.st_gid)
            {
                wanted &= !SETGID;
            }
        }
        // Through the descriptor's link: the name may have been replaced meanwhile.
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::chmod(path, Mode::from_raw_mode(wanted))?;
        Ok(())
    }

    /// Finishes a creation: owner and mode, then the node; on failure the object is removed
    /// again (not left with the wrong owner or mode).
    fn finish_new(
        &self,
        parent: &DirNode,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<(DirNode, Attr)> {
        let parent_fd = self.fd(parent)?;
        let result = rustix::fs::openat(&*parent_fd, name, path_flags(), Mode::empty())
            .map_err(io::Error::from)
            .and_then(|fd| {
                self.own_new(parent, &fd, mode, caller)?;
                self.node_attr(fd)
            });
        if result.is_err() {
            let directory = rustix::fs::statat(&*parent_fd, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|stat| kind_of(stat.st_mode) == FileKind::Directory);
            let flags = if directory { AtFlags::REMOVEDIR } else { AtFlags::empty() };
            let _ = rustix::fs::unlinkat(&*parent_fd, name, flags);
        }
        result
    }

    /// The node's kind, refusing symlinks for calls that `/proc/self/fd` would follow.
    fn not_symlink(fd: &OwnedFd, refusal: Errno) -> io::Result<()> {
        let stat = rustix::fs::fstat(fd)?;
        if kind_of(stat.st_mode) == FileKind::Symlink {
            return Err(refusal.into());
        }
        Ok(())
    }
}

/// Opens the object of `node` with `flags` (see [`DirNamespace::reopen`]); `root` is a
/// descriptor on the mount of the namespace's directory.
fn reopen(node: &NodeInner, root: &OwnedFd, flags: OFlags) -> io::Result<OwnedFd> {
    if let Some(handle) = &node.handle
        && !node.slot.is_pinned()
    {
        return handle.open(root.as_fd(), flags);
    }
    let Some(fd) = node.slot.peek() else { return Err(Errno::STALE.into()) };
    if flags.contains(OFlags::PATH) {
        return fd.try_clone();
    }
    Ok(rustix::fs::open(proc_path(&fd), flags | OFlags::CLOEXEC, Mode::empty())?)
}

/// `S_ISGID`.
const SETGID: u32 = 0o2000;

/// An error naming the directory it concerns.
fn in_path(path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

impl Namespace for DirNamespace {
    type Node = DirNode;

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn local_directory(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn nodes_hold_storage(&self) -> bool {
        true
    }

    fn backend(&self) -> Arc<dyn Backend> {
        Arc::clone(&self.backend) as Arc<dyn Backend>
    }

    fn root(&self) -> io::Result<(DirNode, Attr)> {
        let stat = rustix::fs::fstat(&*self.root_fd)?;
        Ok((self.root.clone(), self.attr(&stat, 0)))
    }

    fn lookup(&self, parent: &DirNode, name: &OsStr) -> io::Result<(DirNode, Attr)> {
        let fd = rustix::fs::openat(&*self.fd(parent)?, name, path_flags(), Mode::empty())?;
        self.node_attr(fd)
    }

    fn getattr(&self, node: &DirNode) -> io::Result<Attr> {
        Ok(self.attr(&self.stat(node)?, node.0.generation))
    }

    fn setattr(&self, node: &DirNode, set: &SetAttr, _caller: &Credentials) -> io::Result<Attr> {
        let fd = self.fd(node)?;
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.map(rustix::fs::Uid::from_raw);
            let gid = set.gid.map(rustix::fs::Gid::from_raw);
            let flags = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
            rustix::fs::chownat(&*fd, "", uid, gid, flags)?;
        }
        if let Some(mode) = set.mode {
            DirNamespace::not_symlink(&fd, Errno::OPNOTSUPP)?;
            rustix::fs::chmod(proc_path(&fd), Mode::from_raw_mode(mode & 0o7777))?;
        }
        if let Some(size) = set.size {
            let flags = OFlags::WRONLY | OFlags::CLOEXEC;
            let file = rustix::fs::open(proc_path(&fd), flags, Mode::empty())?;
            rustix::fs::ftruncate(&file, size)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = rustix::fs::Timestamps {
                last_access: timespec(set.atime),
                last_modification: timespec(set.mtime),
            };
            rustix::fs::utimensat(rustix::fs::CWD, proc_path(&fd), &times, AtFlags::empty())?;
        }
        Ok(self.attr(&rustix::fs::fstat(&*fd)?, node.0.generation))
    }

    fn readlink(&self, node: &DirNode) -> io::Result<OsString> {
        // readlinkat with an empty path answers ENOENT for anything but a symlink.
        let fd = self.fd(node)?;
        if kind_of(rustix::fs::fstat(&*fd)?.st_mode) != FileKind::Symlink {
            return Err(Errno::INVAL.into());
        }
        let target = rustix::fs::readlinkat(&*fd, "", Vec::new())?;
        Ok(OsStr::from_bytes(target.as_bytes()).to_owned())
    }

    fn create(
        &self,
        parent: &DirNode,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<(DirNode, Attr)> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let perm = Mode::from_raw_mode(mode & 0o7777);
        let fd = rustix::fs::openat(&*self.fd(parent)?, name, flags | OFlags::CLOEXEC, perm)?;
        drop(fd);
        self.finish_new(parent, name, mode, caller)
    }

    fn mkdir(
        &self,
        parent: &DirNode,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<(DirNode, Attr)> {
        rustix::fs::mkdirat(&*self.fd(parent)?, name, Mode::from_raw_mode(mode & 0o7777))?;
        self.finish_new(parent, name, mode, caller)
    }

    fn mknod(
        &self,
        parent: &DirNode,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        caller: &Credentials,
    ) -> io::Result<(DirNode, Attr)> {
        if matches!(kind, FileKind::Directory | FileKind::Symlink) {
            return Err(Errno::INVAL.into());
        }
        let perm = Mode::from_raw_mode(mode & 0o7777);
        rustix::fs::mknodat(&*self.fd(parent)?, name, file_type(kind), perm, rdev)?;
        self.finish_new(parent, name, mode, caller)
    }

    fn symlink(
        &self,
        parent: &DirNode,
        name: &OsStr,
        target: &OsStr,
        caller: &Credentials,
    ) -> io::Result<(DirNode, Attr)> {
        rustix::fs::symlinkat(target, &*self.fd(parent)?, name)?;
        self.finish_new(parent, name, 0o777, caller)
    }

    fn link(
        &self,
        node: &DirNode,
        new_parent: &DirNode,
        new_name: &OsStr,
        _caller: &Credentials,
    ) -> io::Result<(DirNode, Attr)> {
        let flags = AtFlags::SYMLINK_FOLLOW;
        let (fd, new_parent_fd) = (self.fd(node)?, self.fd(new_parent)?);
        rustix::fs::linkat(rustix::fs::CWD, proc_path(&fd), &*new_parent_fd, new_name, flags)?;
        self.lookup(new_parent, new_name)
    }

    fn unlink(&self, parent: &DirNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        let parent = self.fd(parent)?;
        let last = self.last_name(&parent, name);
        rustix::fs::unlinkat(&*parent, name, AtFlags::empty())?;
        if let Some((node, fd)) = last {
            node.slot.pin(fd);
        }
        Ok(())
    }

    fn rmdir(&self, parent: &DirNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        let parent = self.fd(parent)?;
        let last = self.last_name(&parent, name);
        rustix::fs::unlinkat(&*parent, name, AtFlags::REMOVEDIR)?;
        if let Some((node, fd)) = last {
            node.slot.pin(fd);
        }
        Ok(())
    }

    fn rename(
        &self,
        parent: &DirNode,
        name: &OsStr,
        new_parent: &DirNode,
        new_name: &OsStr,
        flags: RenameFlags,
        _caller: &Credentials,
    ) -> io::Result<()> {
        let mut raw = rustix::fs::RenameFlags::empty();
        if flags.no_replace {
            raw |= rustix::fs::RenameFlags::NOREPLACE;
        }
        if flags.exchange {
            raw |= rustix::fs::RenameFlags::EXCHANGE;
        }
        let (parent, new_parent) = (self.fd(parent)?, self.fd(new_parent)?);
        // The object a rename replaces may lose its last name (an exchange keeps both).
        let last = if flags.exchange { None } else { self.last_name(&new_parent, new_name) };
        rustix::fs::renameat_with(&*parent, name, &*new_parent, new_name, raw)?;
        if let Some((node, fd)) = last {
            node.slot.pin(fd);
        }
        Ok(())
    }

    fn readdir(&self, node: &DirNode) -> io::Result<DirEntries> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(proc_path(&*self.fd(node)?), flags, Mode::empty())?;
        let mut entries = Vec::new();
        let mut dir = rustix::fs::Dir::read_from(&fd)?;
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                rustix::fs::FileType::Unknown => {
                    let stat =
                        rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)?;
                    kind_of(stat.st_mode)
                }
                other => kind_of(other.as_raw_mode()),
            };
            // Same device as the directory unless a filesystem is mounted on the entry; the
            // number is the one its lookup reports either way for ordinary entries.
            let ino = self.ino(self.device, entry.ino());
            entries.push(Ok(DirEntry { name: OsStr::from_bytes(name).to_owned(), ino, kind }));
        }
        Ok(Box::new(entries.into_iter()))
    }

    fn statfs(&self, node: &DirNode) -> io::Result<StatFs> {
        let s = rustix::fs::statvfs(proc_path(&*self.fd(node)?))?;
        Ok(StatFs {
            blocks: s.f_blocks,
            blocks_free: s.f_bfree,
            blocks_available: s.f_bavail,
            files: s.f_files,
            files_free: s.f_ffree,
            block_size: u32::try_from(s.f_bsize).unwrap_or(4096),
            name_max: u32::try_from(s.f_namemax).unwrap_or(255),
            fragment_size: u32::try_from(s.f_frsize).unwrap_or(4096),
        })
    }

    fn sync_dir(&self, node: &DirNode) -> io::Result<()> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(proc_path(&*self.fd(node)?), flags, Mode::empty())?;
        Ok(rustix::fs::fsync(&fd)?)
    }

    fn getxattr(&self, node: &DirNode, name: &OsStr) -> io::Result<Vec<u8>> {
        // Linux keeps no user attributes on symlinks, and the link would be followed.
        let fd = self.fd(node)?;
        DirNamespace::not_symlink(&fd, Errno::NODATA)?;
        let mut value = Vec::with_capacity(XATTR_MAX);
        rustix::fs::getxattr(proc_path(&fd), name, rustix::buffer::spare_capacity(&mut value))?;
        Ok(value)
    }

    fn listxattr(&self, node: &DirNode) -> io::Result<Vec<OsString>> {
        let fd = self.fd(node)?;
        if DirNamespace::not_symlink(&fd, Errno::NODATA).is_err() {
            return Ok(Vec::new());
        }
        let mut list = Vec::with_capacity(XATTR_MAX);
        rustix::fs::listxattr(proc_path(&fd), rustix::buffer::spare_capacity(&mut list))?;
        Ok(list
            .split(|&byte| byte == 0)
            .filter(|name| !name.is_empty())
            .map(|name| OsStr::from_bytes(name).to_owned())
            .collect())
    }

    fn setxattr(
        &self,
        node: &DirNode,
        name: &OsStr,
        value: &[u8],
        how: XattrSet,
        _caller: &Credentials,
    ) -> io::Result<()> {
        let fd = self.fd(node)?;
        DirNamespace::not_symlink(&fd, Errno::PERM)?;
        let flags = match how {
            XattrSet::Either => XattrFlags::empty(),
            XattrSet::Create => XattrFlags::CREATE,
            XattrSet::Replace => XattrFlags::REPLACE,
        };
        Ok(rustix::fs::setxattr(proc_path(&fd), name, value, flags)?)
    }

    fn removexattr(&self, node: &DirNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        let fd = self.fd(node)?;
        DirNamespace::not_symlink(&fd, Errno::PERM)?;
        Ok(rustix::fs::removexattr(proc_path(&fd), name)?)
    }

    fn fallocate(
        &self,
        node: &DirNode,
        offset: u64,
        len: u64,
        how: crate::namespace::Fallocate,
    ) -> io::Result<()> {
        use crate::namespace::Fallocate as How;
        let mode = FallocateFlags::KEEP_SIZE
            | match how {
                How::Reserve => FallocateFlags::empty(),
                How::PunchHole => FallocateFlags::PUNCH_HOLE,
                How::ZeroRange => FallocateFlags::ZERO_RANGE,
            };
        let flags = OFlags::WRONLY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(proc_path(&*self.fd(node)?), flags, Mode::empty())?;
        Ok(rustix::fs::fallocate(&fd, mode, offset, len)?)
    }

    fn open_file(&self, node: &DirNode) -> io::Result<Arc<dyn BackendFile>> {
        let (node, root) = (Arc::clone(&node.0), Arc::clone(&self.root_fd));
        let name = format!("{} (inode {})", self.path.display(), node.ino);
        let reopen = Box::new(move |flags| reopen(&node, &root, flags));
        open_reopenable(name, reopen, self.direct, Arc::clone(&self.cache))
    }
}
