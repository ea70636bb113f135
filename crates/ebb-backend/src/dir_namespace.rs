//! `DirNamespace`: a local directory as a [`Namespace`], the passthrough `ebb mount` serves.
//!
//! Every node holds an `O_PATH` descriptor of its object, so operations are `*at` calls
//! relative to it and never build paths: a rename in the directory, even of a parent, cannot
//! send an operation to the wrong object. Calls that have no `*at` form with an empty path go
//! through the descriptor's `/proc/self/fd/N` link, which names the object itself.
//!
//! * **Identity.** `ino` is the backing inode number, so it stays the same for the life of the
//!   file and across mounts; while a node exists its descriptor keeps the backing filesystem
//!   from giving the number to another object. Objects on other filesystems mounted inside the
//!   directory, and any numbered 0 or 1, get numbers of ours from `2^63` up, kept for the life
//!   of the namespace. `generation` is 0.
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
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FallocateFlags, Mode, OFlags, Stat, Timespec, XattrFlags};
use rustix::io::Errno;

use crate::backend::{Backend, BackendFile};
use crate::dir::{DirBackend, open_path};
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

/// A local directory served as a namespace.
pub struct DirNamespace {
    path: PathBuf,
    root: DirNode,
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

/// A node of a [`DirNamespace`]: an `O_PATH` descriptor of the object.
#[derive(Clone, Debug)]
pub struct DirNode(Arc<OwnedFd>);

impl DirNode {
    /// A path that names the object itself (`/proc/self/fd/N`), valid while the node lives.
    fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }
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
        Ok(DirNamespace {
            path: path.to_path_buf(),
            root: DirNode(Arc::new(fd)),
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

    fn attr(&self, stat: &Stat) -> Attr {
        Attr {
            ino: self.ino(stat.st_dev, stat.st_ino),
            generation: 0,
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

    fn node_attr(&self, fd: OwnedFd) -> io::Result<(DirNode, Attr)> {
        let stat = rustix::fs::fstat(&fd)?;
        Ok((DirNode(Arc::new(fd)), self.attr(&stat)))
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
        let parent = rustix::fs::fstat(&*parent.0)?;
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
        let result = rustix::fs::openat(&*parent.0, name, path_flags(), Mode::empty())
            .map_err(io::Error::from)
            .and_then(|fd| {
                self.own_new(parent, &fd, mode, caller)?;
                self.node_attr(fd)
            });
        if result.is_err() {
            let directory = rustix::fs::statat(&*parent.0, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|stat| kind_of(stat.st_mode) == FileKind::Directory);
            let flags = if directory { AtFlags::REMOVEDIR } else { AtFlags::empty() };
            let _ = rustix::fs::unlinkat(&*parent.0, name, flags);
        }
        result
    }

    /// The node's kind, refusing symlinks for calls that `/proc/self/fd` would follow.
    fn not_symlink(&self, node: &DirNode, refusal: Errno) -> io::Result<()> {
        let stat = rustix::fs::fstat(&*node.0)?;
        if kind_of(stat.st_mode) == FileKind::Symlink {
            return Err(refusal.into());
        }
        Ok(())
    }
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
        let stat = rustix::fs::fstat(&*self.root.0)?;
        Ok((self.root.clone(), self.attr(&stat)))
    }

    fn lookup(&self, parent: &DirNode, name: &OsStr) -> io::Result<(DirNode, Attr)> {
        let fd = rustix::fs::openat(&*parent.0, name, path_flags(), Mode::empty())?;
        self.node_attr(fd)
    }

    fn getattr(&self, node: &DirNode) -> io::Result<Attr> {
        Ok(self.attr(&rustix::fs::fstat(&*node.0)?))
    }

    fn setattr(&self, node: &DirNode, set: &SetAttr, _caller: &Credentials) -> io::Result<Attr> {
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.map(rustix::fs::Uid::from_raw);
            let gid = set.gid.map(rustix::fs::Gid::from_raw);
            let flags = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
            rustix::fs::chownat(&*node.0, "", uid, gid, flags)?;
        }
        if let Some(mode) = set.mode {
            self.not_symlink(node, Errno::OPNOTSUPP)?;
            rustix::fs::chmod(node.proc_path(), Mode::from_raw_mode(mode & 0o7777))?;
        }
        if let Some(size) = set.size {
            let flags = OFlags::WRONLY | OFlags::CLOEXEC;
            let fd = rustix::fs::open(node.proc_path(), flags, Mode::empty())?;
            rustix::fs::ftruncate(&fd, size)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = rustix::fs::Timestamps {
                last_access: timespec(set.atime),
                last_modification: timespec(set.mtime),
            };
            rustix::fs::utimensat(rustix::fs::CWD, node.proc_path(), &times, AtFlags::empty())?;
        }
        self.getattr(node)
    }

    fn readlink(&self, node: &DirNode) -> io::Result<OsString> {
        // readlinkat with an empty path answers ENOENT for anything but a symlink.
        if kind_of(rustix::fs::fstat(&*node.0)?.st_mode) != FileKind::Symlink {
            return Err(Errno::INVAL.into());
        }
        let target = rustix::fs::readlinkat(&*node.0, "", Vec::new())?;
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
        let fd = rustix::fs::openat(&*parent.0, name, flags | OFlags::CLOEXEC, perm)?;
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
        rustix::fs::mkdirat(&*parent.0, name, Mode::from_raw_mode(mode & 0o7777))?;
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
        rustix::fs::mknodat(&*parent.0, name, file_type(kind), perm, rdev)?;
        self.finish_new(parent, name, mode, caller)
    }

    fn symlink(
        &self,
        parent: &DirNode,
        name: &OsStr,
        target: &OsStr,
        caller: &Credentials,
    ) -> io::Result<(DirNode, Attr)> {
        rustix::fs::symlinkat(target, &*parent.0, name)?;
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
        rustix::fs::linkat(rustix::fs::CWD, node.proc_path(), &*new_parent.0, new_name, flags)?;
        self.lookup(new_parent, new_name)
    }

    fn unlink(&self, parent: &DirNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&*parent.0, name, AtFlags::empty())?)
    }

    fn rmdir(&self, parent: &DirNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&*parent.0, name, AtFlags::REMOVEDIR)?)
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
        Ok(rustix::fs::renameat_with(&*parent.0, name, &*new_parent.0, new_name, raw)?)
    }

    fn readdir(&self, node: &DirNode) -> io::Result<DirEntries> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(node.proc_path(), flags, Mode::empty())?;
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
        let s = rustix::fs::statvfs(node.proc_path())?;
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
        let fd = rustix::fs::open(node.proc_path(), flags, Mode::empty())?;
        Ok(rustix::fs::fsync(&fd)?)
    }

    fn getxattr(&self, node: &DirNode, name: &OsStr) -> io::Result<Vec<u8>> {
        // Linux keeps no user attributes on symlinks, and the link would be followed.
        self.not_symlink(node, Errno::NODATA)?;
        let mut value = Vec::with_capacity(XATTR_MAX);
        rustix::fs::getxattr(node.proc_path(), name, rustix::buffer::spare_capacity(&mut value))?;
        Ok(value)
    }

    fn listxattr(&self, node: &DirNode) -> io::Result<Vec<OsString>> {
        if self.not_symlink(node, Errno::NODATA).is_err() {
            return Ok(Vec::new());
        }
        let mut list = Vec::with_capacity(XATTR_MAX);
        rustix::fs::listxattr(node.proc_path(), rustix::buffer::spare_capacity(&mut list))?;
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
        self.not_symlink(node, Errno::PERM)?;
        let flags = match how {
            XattrSet::Either => XattrFlags::empty(),
            XattrSet::Create => XattrFlags::CREATE,
            XattrSet::Replace => XattrFlags::REPLACE,
        };
        Ok(rustix::fs::setxattr(node.proc_path(), name, value, flags)?)
    }

    fn removexattr(&self, node: &DirNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        self.not_symlink(node, Errno::PERM)?;
        Ok(rustix::fs::removexattr(node.proc_path(), name)?)
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
        let fd = rustix::fs::open(node.proc_path(), flags, Mode::empty())?;
        Ok(rustix::fs::fallocate(&fd, mode, offset, len)?)
    }

    fn open_file(&self, node: &DirNode) -> io::Result<Arc<dyn BackendFile>> {
        open_path(&node.proc_path(), self.direct)
    }
}
