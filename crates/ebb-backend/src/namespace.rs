//! The `Namespace` trait: the names, directories and attributes a filesystem (the FUSE mount)
//! serves over a backend, beside the file data, which goes through ebb's cache.
//!
//! A mount needs more than [`crate::Backend`]'s flat positional IO: lookups, directories,
//! links, modes, owners and times. A namespace answers those for one tree (a local directory,
//! an NFS export, an S3 bucket), and opens each regular file's data path
//! ([`Namespace::open_file`]) for ebb's cache to read and write.
//!
//! # Contract
//!
//! * **Nodes.** A [`Namespace::Node`] is the namespace's reference to one object (an `O_PATH`
//!   descriptor, an NFS file handle, an object key). The filesystem holds a node for as long as
//!   the kernel knows the object and clones it freely; dropping the last clone releases what
//!   it holds. A node keeps naming its object across renames of it or of its parents, where
//!   the backend can (descriptors and NFS handles can; S3 keys cannot, see below).
//! * **Identity.** [`Attr::ino`] is unique among the objects of the namespace that exist at
//!   one time and stays the same for an object's whole life (the mount shows it as `st_ino`,
//!   and ebb's cache identifies a file by it, with [`Attr::generation`]). Hard links of one
//!   object share it. It is never 0, and never 1 except possibly for the root (the filesystem
//!   shows the root as 1 whatever its `ino`). If the backend reuses numbers of deleted objects,
//!   `generation` must tell the new object from the old.
//! * **Names** are single path components: not empty, no `/`, no NUL, not `.` or `..`.
//!   [`Namespace::readdir`] lists the entries of a directory without `.` and `..`.
//! * **Credentials.** Operations that create or change objects take the caller's
//!   [`Credentials`]. The filesystem has already checked permissions against the attributes it
//!   was given (the kernel's `default_permissions`); a namespace gives new objects the caller's
//!   owner (as a local filesystem would: the caller's uid, its gid or a setgid directory's) and
//!   may check again (an NFS server does). File data is read and written without credentials,
//!   as the namespace's own user: the cache writes back long after the caller is gone.
//! * **Modes** are the permission bits `0o7777` (setuid, setgid, sticky included). A mode
//!   passed to a creating operation has the caller's umask applied already: the new object
//!   gets exactly it (plus what the directory imposes, such as a setgid directory's bit on a
//!   new directory), never the namespace process's own umask.
//! * **Times.** A creating operation sets all three times to now; [`Namespace::setattr`] sets
//!   what it is given. The filesystem keeps the mtime and ctime of files written through ebb's
//!   cache itself (write-back is later than the write) and calls `setattr` with the mtime to
//!   keep after write-backs; a namespace whose file writes do not move the mtime may ignore it.
//! * **Errors** are `io::Error`s carrying the errno the filesystem should return
//!   (`io::Error::from_raw_os_error`, or an OS error passed on as is), because the mount
//!   answers the kernel with an errno: `ENOENT` for a missing name, `EEXIST`, `ENOTDIR`,
//!   `EISDIR`, `ENOTEMPTY`, `EXDEV`, `ENAMETOOLONG`, `EACCES`/`EPERM` as the backend decides.
//!   An error without an errno is mapped from its kind (`EIO` if none fits). An operation the
//!   backend cannot do at all fails with `EOPNOTSUPP` (or the errno Linux uses for it: `EPERM`
//!   for a hard link where links are impossible, `EINVAL` for an unknown rename flag); it never
//!   half-does it, and never pretends it succeeded.
//! * **Blocking.** Every method blocks until the backend answered; all take `&self` and are
//!   called from several threads at once.
//!
//! # How backends map onto it
//!
//! | operation | local directory ([`crate::DirNamespace`]) | NFSv3 | S3 |
//! |---|---|---|---|
//! | `lookup`, `getattr` | `openat(O_PATH)`, `fstat` | LOOKUP, GETATTR | HEAD object, or a `/`-delimited LIST for a prefix (a directory) |
//! | `setattr` | `chmod`, `chown`, `truncate`, `utimensat` | SETATTR | metadata copy, or `EOPNOTSUPP` |
//! | `create`, `mkdir`, `mknod`, `symlink` | `openat(O_CREAT)`, `mkdirat`, `mknodat`, `symlinkat` | CREATE (guarded), MKDIR, MKNOD, SYMLINK | PUT of an empty object or a `prefix/` marker; `EOPNOTSUPP` for special files |
//! | `link` | `linkat` | LINK | `EPERM` (no hard links) |
//! | `unlink`, `rmdir` | `unlinkat` | REMOVE, RMDIR | DELETE (a non-empty prefix is `ENOTEMPTY`) |
//! | `rename` | `renameat2` | RENAME (`NOREPLACE`/`EXCHANGE`: `EINVAL`) | copy and delete of an object; a directory is copy+delete of every key (journaled; `EXDEV` past 5 GiB) |
//! | `readdir` | `getdents` | READDIRPLUS | LIST with delimiter `/` |
//! | `statfs` | `fstatvfs` | FSSTAT | fixed large numbers |
//! | `open_file` | `O_DIRECT` descriptor | file handle, UNSTABLE writes + COMMIT | multipart upload |

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use crate::backend::{Backend, BackendFile};

/// Who asks for an operation: the calling process's user, group and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Credentials {
    /// Effective user id (filesystem uid).
    pub uid: u32,
    /// Effective group id (filesystem gid).
    pub gid: u32,
    /// Supplementary groups (may be empty when the filesystem could not learn them).
    pub groups: Vec<u32>,
}

impl Credentials {
    /// Whether the caller belongs to `gid` (its own group or a supplementary one).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The type of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file (its data goes through [`Namespace::open_file`]).
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

/// The attributes of an object, as `stat(2)` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Identity: see the module's contract.
    pub ino: u64,
    /// Tells a new object from an old one that had the same `ino` (0 if numbers are never
    /// reused while a node of the old object may exist).
    pub generation: u64,
    /// The type.
    pub kind: FileKind,
    /// Permission bits, `0o7777`.
    pub perm: u16,
    /// Hard links (1 where the backend has none; directories as the backend counts them).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device special file, else 0.
    pub rdev: u64,
    /// Size in bytes (of the backend's copy: the mount reports ebb's size for cached files).
    pub size: u64,
    /// Space allocated, in 512-byte blocks.
    pub blocks: u64,
    /// Preferred IO size.
    pub blksize: u32,
    /// Last access.
    pub atime: SystemTime,
    /// Last modification of the data.
    pub mtime: SystemTime,
    /// Last change of the status (data, attributes, links).
    pub ctime: SystemTime,
}

/// A time to set: now (the backend's clock) or a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// The backend's current time (`UTIME_NOW`).
    Now,
    /// This time (nanoseconds kept where the backend can).
    At(SystemTime),
}

/// What [`Namespace::setattr`] changes (`None`: left as is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// Permission bits, `0o7777`: set exactly.
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size of a regular file (the filesystem sends sizes of files ebb caches through the
    /// cache instead, see [`crate::BackendFile::set_size`]).
    pub size: Option<u64>,
    /// Last access.
    pub atime: Option<SetTime>,
    /// Last modification.
    pub mtime: Option<SetTime>,
}

/// How [`Namespace::rename`] treats an existing target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameFlags {
    /// Fail with `EEXIST` if the target exists (`RENAME_NOREPLACE`).
    pub no_replace: bool,
    /// Swap source and target atomically, both must exist (`RENAME_EXCHANGE`).
    pub exchange: bool,
}

/// One entry of a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name.
    pub name: OsString,
    /// The `ino` a lookup of the name would report.
    pub ino: u64,
    /// The entry's type.
    pub kind: FileKind,
}

/// The entries of a directory, read as the filesystem asks for them (a backend may fetch them
/// in pages). An error ends the listing.
pub type DirEntries = Box<dyn Iterator<Item = io::Result<DirEntry>> + Send>;

/// Space and object counts of the namespace's storage, as `statvfs(2)` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Size in `fragment_size` units.
    pub blocks: u64,
    /// Free units.
    pub blocks_free: u64,
    /// Free units an unprivileged user may use.
    pub blocks_available: u64,
    /// Objects (inodes).
    pub files: u64,
    /// Free objects.
    pub files_free: u64,
    /// Preferred block size.
    pub block_size: u32,
    /// Longest name.
    pub name_max: u32,
    /// The unit of `blocks`.
    pub fragment_size: u32,
}

/// How [`Namespace::setxattr`] treats an existing or missing attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrSet {
    /// Create or replace.
    #[default]
    Either,
    /// Fail with `EEXIST` if it exists (`XATTR_CREATE`).
    Create,
    /// Fail with `ENODATA` if it does not exist (`XATTR_REPLACE`).
    Replace,
}

/// What [`Namespace::fallocate`] does to a range of a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallocate {
    /// Reserve space for the range without changing the size the backend has for the file
    /// (`FALLOC_FL_KEEP_SIZE`). The filesystem changes sizes through ebb's cache itself.
    Reserve,
    /// Deallocate the range, which then reads as zeros; the size stays
    /// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`).
    PunchHole,
    /// Make the range read as zeros, allocated; the size stays (`FALLOC_FL_ZERO_RANGE |
    /// FALLOC_FL_KEEP_SIZE`).
    ZeroRange,
}

/// The error of an operation a namespace cannot do.
pub fn unsupported() -> io::Error {
    io::Error::from_raw_os_error(EOPNOTSUPP)
}

/// `EOPNOTSUPP` on Linux.
const EOPNOTSUPP: i32 = 95;

/// A tree of named objects with attributes, whose regular files' data ebb caches. See the
/// module documentation for the contract every method follows.
pub trait Namespace: Send + Sync + fmt::Debug + 'static {
    /// The namespace's reference to one object.
    type Node: Clone + Send + Sync + fmt::Debug + 'static;

    /// What the namespace serves, for messages (`/srv/data`, `nfs://host/export`, `s3://bucket`).
    fn describe(&self) -> String;

    /// The local directory it serves, if any: the runtime then takes its block device's
    /// writeback settings, and the mount refuses a mountpoint inside it.
    fn local_directory(&self) -> Option<&Path> {
        None
    }

    /// The backend ebb's cache accounts this namespace's files to: its capabilities
    /// (`two_phase`, `alignment`, ...) are those of every file [`Namespace::open_file`] opens.
    fn backend(&self) -> Arc<dyn Backend>;

    /// Sets the writeback settings ebb's cache uses for [`Namespace::backend`] (queue depth,
    /// write size, two-phase accounting, ...), as the kernel sets up a backing device for its
    /// filesystem. Default: leaves the engine's defaults (a local directory's settings come
    /// from its block device, see [`Namespace::local_directory`]).
    fn writeback_settings(&self, _settings: &mut ebb_core::BackendConfig) {}

    /// Whether a node, or a file [`Namespace::open_file`] opened, keeps a deleted object's
    /// storage allocated, as a descriptor does. The filesystem then watches the regular files
    /// it knows and, when one is deleted by someone else (`nlink` 0) and nothing has it open
    /// through the mount, drops its node and cached data so the storage is freed. Default:
    /// false (a file handle or a key holds nothing).
    fn nodes_hold_storage(&self) -> bool {
        false
    }

    /// Whether removing an object's last name destroys it at once, also for those who still
    /// hold a node of it (an NFS server answers `ESTALE` to its file handle). The filesystem
    /// then hides the name of a file still open through the mount instead of removing it
    /// (renamed to a hidden name in the same directory, as the kernel's NFS client does), and
    /// removes the hidden name at the last close. Default: false (a removed file open through
    /// the mount stays usable, as a descriptor keeps a local file).
    fn removal_destroys_open_files(&self) -> bool {
        false
    }

    /// The root directory.
    fn root(&self) -> io::Result<(Self::Node, Attr)>;

    /// The object `name` in the directory `parent`: `ENOENT` if none, `ENOTDIR` if `parent`
    /// is not a directory. Symlinks are not followed.
    fn lookup(&self, parent: &Self::Node, name: &OsStr) -> io::Result<(Self::Node, Attr)>;

    /// The object's attributes now.
    fn getattr(&self, node: &Self::Node) -> io::Result<Attr>;

    /// Changes the attributes given in `set`, returning the attributes after: the owner first,
    /// then the mode (so the setuid and setgid bits a change of owner clears are those `set`
    /// gives, exactly), then the size, then the times.
    fn setattr(&self, node: &Self::Node, set: &SetAttr, caller: &Credentials) -> io::Result<Attr>;

    /// The target of the symlink `node` (`EINVAL` if it is not one).
    fn readlink(&self, node: &Self::Node) -> io::Result<OsString>;

    /// Creates the regular file `name` in `parent` with `mode`, owned by the caller; `EEXIST`
    /// if the name exists (whatever it names).
    fn create(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<(Self::Node, Attr)>;

    /// Creates a directory.
    fn mkdir(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<(Self::Node, Attr)>;

    /// Creates a special file (`Fifo`, `Socket`, `CharDevice`, `BlockDevice` with `rdev`) or,
    /// for `Regular`, an empty regular file.
    fn mknod(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        caller: &Credentials,
    ) -> io::Result<(Self::Node, Attr)>;

    /// Creates the symlink `name` to `target` (stored as given, never resolved).
    fn symlink(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        target: &OsStr,
        caller: &Credentials,
    ) -> io::Result<(Self::Node, Attr)>;

    /// Makes `new_name` in `new_parent` another name of `node` (not a directory: `EPERM`).
    /// A backend without hard links fails with `EPERM`, as Linux filesystems without them do.
    fn link(
        &self,
        node: &Self::Node,
        new_parent: &Self::Node,
        new_name: &OsStr,
        caller: &Credentials,
    ) -> io::Result<(Self::Node, Attr)>;

    /// Removes the name `name` (not a directory: `EISDIR`) from `parent`. Nodes of the object
    /// stay valid while the filesystem holds them (an open file keeps its data).
    fn unlink(&self, parent: &Self::Node, name: &OsStr, caller: &Credentials) -> io::Result<()>;

    /// Removes the empty directory `name` from `parent` (`ENOTEMPTY`, `ENOTDIR`).
    fn rmdir(&self, parent: &Self::Node, name: &OsStr, caller: &Credentials) -> io::Result<()>;

    /// Renames `name` in `parent` to `new_name` in `new_parent`, atomically replacing an
    /// existing target as `rename(2)` does (a directory only by an empty directory). A flag the
    /// backend cannot honour fails with `EINVAL` and changes nothing; a rename the backend
    /// cannot do at all fails with `EXDEV`, so that tools copy instead (an S3 directory is renamed
    /// key by key, not atomically: see `S3Namespace`).
    fn rename(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        new_parent: &Self::Node,
        new_name: &OsStr,
        flags: RenameFlags,
        caller: &Credentials,
    ) -> io::Result<()>;

    /// The entries of the directory `node` (without `.` and `..`), in the backend's order.
    fn readdir(&self, node: &Self::Node) -> io::Result<DirEntries>;

    /// Space and object counts of the storage holding `node`.
    fn statfs(&self, node: &Self::Node) -> io::Result<StatFs>;

    /// Makes the directory's entries durable (`fsync` of a directory). Default: nothing to do
    /// (a backend whose namespace changes are durable when they return).
    fn sync_dir(&self, _node: &Self::Node) -> io::Result<()> {
        Ok(())
    }

    /// The value of the extended attribute `name` (`ENODATA` if it has none). Default:
    /// `EOPNOTSUPP`.
    fn getxattr(&self, _node: &Self::Node, _name: &OsStr) -> io::Result<Vec<u8>> {
        Err(unsupported())
    }

    /// The names of the object's extended attributes. Default: `EOPNOTSUPP`.
    fn listxattr(&self, _node: &Self::Node) -> io::Result<Vec<OsString>> {
        Err(unsupported())
    }

    /// Sets an extended attribute. Default: `EOPNOTSUPP`.
    fn setxattr(
        &self,
        _node: &Self::Node,
        _name: &OsStr,
        _value: &[u8],
        _how: XattrSet,
        _caller: &Credentials,
    ) -> io::Result<()> {
        Err(unsupported())
    }

    /// Removes an extended attribute (`ENODATA` if it has none). Default: `EOPNOTSUPP`.
    fn removexattr(
        &self,
        _node: &Self::Node,
        _name: &OsStr,
        _caller: &Credentials,
    ) -> io::Result<()> {
        Err(unsupported())
    }

    /// Changes the allocation of `offset..offset + len` of the regular file `node` in the
    /// backend's copy. The filesystem drops and zeroes the range in ebb's cache itself before
    /// it punches or zeroes here. Default: `EOPNOTSUPP`.
    fn fallocate(
        &self,
        _node: &Self::Node,
        _offset: u64,
        _len: u64,
        _how: Fallocate,
    ) -> io::Result<()> {
        Err(unsupported())
    }

    /// The data path of the regular file `node`: positional IO on it for ebb's cache. Called
    /// once per cached file; the cache keeps it while it holds the file's pages, also after
    /// the file lost its last name. Its capabilities (`two_phase`, `alignment`, ...) are those
    /// of the backend the namespace's files belong to.
    fn open_file(&self, node: &Self::Node) -> io::Result<Arc<dyn BackendFile>>;
}
