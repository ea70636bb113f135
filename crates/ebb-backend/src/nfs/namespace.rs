//! `NfsNamespace`: an NFSv3 export as the tree a mount serves ([`Namespace`]).
//!
//! Nodes are file handles, so a node keeps naming its object across renames, and an open file
//! keeps working after its last name is removed for as long as the server keeps the handle.
//! `ino` is the server's `fileid`; `generation` is a hash of the handle, which tells a new
//! object from a deleted one whose `fileid` the server's filesystem reused. Every call is one
//! or two RPCs as the calls are made: there is no attribute cache here (the mount has its
//! own, with the kernel's timeouts).
//!
//! Calls are made with the mount process's credentials (`AUTH_UNIX`); the mount has checked
//! the caller's permissions already, and new objects get the caller's owner through the
//! attributes of the creating call (the group of a setgid directory, and its setgid bit on a
//! new directory, as a local filesystem gives them). NFSv3 has no extended attributes, no
//! `fallocate` and no rename flags: those are `EOPNOTSUPP` (`EINVAL` for the flags), as the
//! kernel's NFSv3 client answers them.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nfs3_types::nfs3::{
    cookieverf3, devicedata3, fattr3, ftype3, mknoddata3, nfstime3, sattr3, set_atime, set_gid3,
    set_mode3, set_mtime, set_size3, set_uid3, specdata3,
};

use super::client::Handle;
use super::tree::DirPage;
use super::{NfsBackend, NfsFile, Shared, errno};
use crate::backend::{Backend, BackendFile};
use crate::namespace::{
    Attr, Credentials, DirEntries, DirEntry, FileKind, Namespace, RenameFlags, SetAttr, SetTime,
    StatFs,
};

/// The setgid bit.
const SET_GID: u32 = 0o2000;

/// The longest name NFSv3 clients use (`NFS3_MAXNAMLEN`).
const NAME_MAX: u32 = 255;

/// An NFSv3 export as a mount's tree.
#[derive(Clone)]
pub struct NfsNamespace {
    backend: NfsBackend,
}

/// A node: the object's file handle.
#[derive(Clone)]
pub struct NfsNode {
    handle: Arc<Handle>,
}

impl fmt::Debug for NfsNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NfsNode({:02x?})", &self.handle.data[..])
    }
}

impl fmt::Debug for NfsNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NfsNamespace").field("url", &self.backend.url()).finish()
    }
}

impl NfsNamespace {
    /// The tree of the export `backend` mounted.
    pub fn new(backend: NfsBackend) -> NfsNamespace {
        NfsNamespace { backend }
    }

    /// Mounts the export of `url` (see [`NfsBackend::connect`]).
    pub fn connect(url: &str) -> io::Result<NfsNamespace> {
        Ok(NfsNamespace::new(NfsBackend::connect(url)?))
    }

    fn shared(&self) -> &Shared {
        &self.backend.shared
    }

    /// The node and attributes of a looked-up or created object, asking for the attributes
    /// the server did not send.
    fn found(&self, handle: Handle, attributes: Option<fattr3>) -> io::Result<(NfsNode, Attr)> {
        let attributes = match attributes {
            Some(attributes) => attributes,
            None => self.shared().nfs.getattr(&handle)?,
        };
        let attr = attr_of(&handle, &attributes);
        Ok((NfsNode { handle: Arc::new(handle) }, attr))
    }

    /// A created object's node, looking the name up where the server sent no handle. The
    /// object gets exactly the mode of `attributes`: a server creating it with `mkdir(2)` or
    /// `open(2)` drops bits those calls ignore (a directory's setgid bit), so they are set
    /// again.
    fn made(
        &self,
        parent: &NfsNode,
        name: &OsStr,
        made: (Option<Handle>, Option<fattr3>),
        attributes: &sattr3,
    ) -> io::Result<(NfsNode, Attr)> {
        let (node, attr) = match made {
            (Some(handle), attributes) => self.found(handle, attributes)?,
            (None, _) => {
                let (handle, attributes) =
                    self.shared().nfs.lookup(&parent.handle, name.as_bytes())?;
                self.found(handle, attributes)?
            }
        };
        match attributes.mode {
            set_mode3::Some(mode)
                if u32::from(attr.perm) != mode && attr.kind != FileKind::Symlink =>
            {
                let set = SetAttr { mode: Some(mode), ..SetAttr::default() };
                let attr = self.setattr_inner(&node, &set)?;
                Ok((node, attr))
            }
            _ => Ok((node, attr)),
        }
    }

    /// The attributes a new object in `parent` starts with: `mode`, owned by the caller, in
    /// the group of a setgid parent (whose bit a new directory inherits).
    fn owned(
        &self,
        parent: &NfsNode,
        mode: u32,
        caller: &Credentials,
        directory: bool,
    ) -> io::Result<sattr3> {
        let parent = self.shared().nfs.getattr(&parent.handle)?;
        let inherits = parent.mode & SET_GID != 0;
        let gid = if inherits { parent.gid } else { caller.gid };
        let mode = if inherits && directory { mode | SET_GID } else { mode };
        Ok(sattr3 {
            mode: set_mode3::Some(mode & 0o7777),
            uid: set_uid3::Some(caller.uid),
            gid: set_gid3::Some(gid),
            ..sattr3::default()
        })
    }

    fn setattr_inner(&self, node: &NfsNode, set: &SetAttr) -> io::Result<Attr> {
        let nfs = &self.shared().nfs;
        let mut after = None;
        // The owner first, then the mode, so the setuid and setgid bits are exactly the mode's.
        if set.uid.is_some() || set.gid.is_some() {
            let owner = sattr3 {
                uid: set.uid.map_or(set_uid3::None, set_uid3::Some),
                gid: set.gid.map_or(set_gid3::None, set_gid3::Some),
                ..sattr3::default()
            };
            after = nfs.setattr(&node.handle, owner)?;
        }
        let rest = sattr3 {
            mode: set.mode.map_or(set_mode3::None, |mode| set_mode3::Some(mode & 0o7777)),
            size: set.size.map_or(set_size3::None, set_size3::Some),
            atime: match set.atime {
                None => set_atime::DONT_CHANGE,
                Some(SetTime::Now) => set_atime::SET_TO_SERVER_TIME,
                Some(SetTime::At(time)) => set_atime::SET_TO_CLIENT_TIME(nfs_time(time)?),
            },
            mtime: match set.mtime {
                None => set_mtime::DONT_CHANGE,
                Some(SetTime::Now) => set_mtime::SET_TO_SERVER_TIME,
                Some(SetTime::At(time)) => set_mtime::SET_TO_CLIENT_TIME(nfs_time(time)?),
            },
            ..sattr3::default()
        };
        let changes_more =
            set.mode.is_some() || set.size.is_some() || set.atime.is_some() || set.mtime.is_some();
        if changes_more {
            after = nfs.setattr(&node.handle, rest)?;
        }
        let attributes = match after {
            Some(attributes) => attributes,
            None => nfs.getattr(&node.handle)?,
        };
        Ok(attr_of(&node.handle, &attributes))
    }
}

impl Namespace for NfsNamespace {
    type Node = NfsNode;

    fn describe(&self) -> String {
        self.backend.url().to_owned()
    }

    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    fn removal_destroys_open_files(&self) -> bool {
        true
    }

    fn writeback_settings(&self, settings: &mut ebb_core::BackendConfig) {
        self.backend.writeback_settings(settings);
    }

    fn root(&self) -> io::Result<(NfsNode, Attr)> {
        let root = self.shared().root.clone();
        self.found(root, None).map_err(plain)
    }

    fn lookup(&self, parent: &NfsNode, name: &OsStr) -> io::Result<(NfsNode, Attr)> {
        let (handle, attributes) =
            self.shared().nfs.lookup(&parent.handle, name.as_bytes()).map_err(plain)?;
        self.found(handle, attributes).map_err(plain)
    }

    fn getattr(&self, node: &NfsNode) -> io::Result<Attr> {
        let attributes = self.shared().nfs.getattr(&node.handle).map_err(plain)?;
        Ok(attr_of(&node.handle, &attributes))
    }

    fn setattr(&self, node: &NfsNode, set: &SetAttr, _caller: &Credentials) -> io::Result<Attr> {
        self.setattr_inner(node, set).map_err(plain)
    }

    fn readlink(&self, node: &NfsNode) -> io::Result<OsString> {
        let target = self.shared().nfs.readlink(&node.handle).map_err(plain)?;
        Ok(OsString::from_vec(target))
    }

    fn create(
        &self,
        parent: &NfsNode,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<(NfsNode, Attr)> {
        let run = || {
            let attributes = self.owned(parent, mode, caller, false)?;
            let made =
                self.shared().nfs.create(&parent.handle, name.as_bytes(), attributes.clone())?;
            self.made(parent, name, made, &attributes)
        };
        run().map_err(plain)
    }

    fn mkdir(
        &self,
        parent: &NfsNode,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> io::Result<(NfsNode, Attr)> {
        let run = || {
            let attributes = self.owned(parent, mode, caller, true)?;
            let made =
                self.shared().nfs.mkdir(&parent.handle, name.as_bytes(), attributes.clone())?;
            self.made(parent, name, made, &attributes)
        };
        run().map_err(plain)
    }

    fn mknod(
        &self,
        parent: &NfsNode,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        caller: &Credentials,
    ) -> io::Result<(NfsNode, Attr)> {
        if kind == FileKind::Regular {
            return self.create(parent, name, mode, caller);
        }
        let run = || {
            let attributes = self.owned(parent, mode, caller, false)?;
            let device = |attributes| devicedata3 {
                dev_attributes: attributes,
                spec: specdata3 { specdata1: major(rdev), specdata2: minor(rdev) },
            };
            let what = match kind {
                FileKind::Fifo => mknoddata3::NF3FIFO(attributes.clone()),
                FileKind::Socket => mknoddata3::NF3SOCK(attributes.clone()),
                FileKind::CharDevice => mknoddata3::NF3CHR(device(attributes.clone())),
                FileKind::BlockDevice => mknoddata3::NF3BLK(device(attributes.clone())),
                FileKind::Regular | FileKind::Directory | FileKind::Symlink => {
                    return Err(io::Error::from_raw_os_error(errno::EINVAL));
                }
            };
            let made = self.shared().nfs.mknod(&parent.handle, name.as_bytes(), what)?;
            self.made(parent, name, made, &attributes)
        };
        run().map_err(plain)
    }

    fn symlink(
        &self,
        parent: &NfsNode,
        name: &OsStr,
        target: &OsStr,
        caller: &Credentials,
    ) -> io::Result<(NfsNode, Attr)> {
        let run = || {
            let attributes = self.owned(parent, 0o777, caller, false)?;
            let nfs = &self.shared().nfs;
            let made = nfs.symlink(
                &parent.handle,
                name.as_bytes(),
                target.as_bytes(),
                attributes.clone(),
            )?;
            self.made(parent, name, made, &attributes)
        };
        run().map_err(plain)
    }

    fn link(
        &self,
        node: &NfsNode,
        new_parent: &NfsNode,
        new_name: &OsStr,
        _caller: &Credentials,
    ) -> io::Result<(NfsNode, Attr)> {
        let run = || {
            let nfs = &self.shared().nfs;
            let after = nfs.link(&node.handle, &new_parent.handle, new_name.as_bytes())?;
            let attributes = match after {
                Some(attributes) => attributes,
                None => nfs.getattr(&node.handle)?,
            };
            Ok((node.clone(), attr_of(&node.handle, &attributes)))
        };
        run().map_err(plain)
    }

    fn unlink(&self, parent: &NfsNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        self.shared().nfs.remove(&parent.handle, name.as_bytes()).map_err(plain)
    }

    fn rmdir(&self, parent: &NfsNode, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        self.shared().nfs.rmdir(&parent.handle, name.as_bytes()).map_err(plain)
    }

    fn rename(
        &self,
        parent: &NfsNode,
        name: &OsStr,
        new_parent: &NfsNode,
        new_name: &OsStr,
        flags: RenameFlags,
        _caller: &Credentials,
    ) -> io::Result<()> {
        if flags.no_replace || flags.exchange {
            // NFSv3's RENAME always replaces; the kernel's client refuses the flags so.
            return Err(io::Error::from_raw_os_error(errno::EINVAL));
        }
        let nfs = &self.shared().nfs;
        nfs.rename(&parent.handle, name.as_bytes(), &new_parent.handle, new_name.as_bytes())
            .map_err(plain)
    }

    fn readdir(&self, node: &NfsNode) -> io::Result<DirEntries> {
        let mut listing = Listing {
            namespace: self.clone(),
            directory: Arc::clone(&node.handle),
            cookie: 0,
            verifier: cookieverf3::default(),
            pending: VecDeque::new(),
            end: false,
        };
        // The first page now, so that an unreadable directory fails the call itself.
        listing.fetch().map_err(plain)?;
        Ok(Box::new(listing))
    }

    fn statfs(&self, node: &NfsNode) -> io::Result<StatFs> {
        const UNIT: u64 = 4096;
        let nfs = &self.shared().nfs;
        let stat = nfs.fsstat(&node.handle).map_err(plain)?;
        // As the kernel's client: the server's PATHCONF, at most NFSv3's 255 (ganesha says 1024
        // over ext4, whose names stop at 255).
        let name_max = nfs.pathconf(&node.handle).map_or(NAME_MAX, |conf| conf.name_max);
        let name_max = if name_max == 0 { NAME_MAX } else { name_max.min(NAME_MAX) };
        Ok(StatFs {
            blocks: stat.tbytes / UNIT,
            blocks_free: stat.fbytes / UNIT,
            blocks_available: stat.abytes / UNIT,
            files: stat.tfiles,
            files_free: stat.ffiles,
            block_size: UNIT as u32,
            name_max,
            fragment_size: UNIT as u32,
        })
    }

    fn open_file(&self, node: &NfsNode) -> io::Result<Arc<dyn BackendFile>> {
        let shared = Arc::clone(&self.backend.shared);
        Ok(Arc::new(NfsFile { shared, handle: (*node.handle).clone() }))
    }
}

/// A directory's entries, fetched a READDIRPLUS page at a time.
struct Listing {
    namespace: NfsNamespace,
    directory: Arc<Handle>,
    cookie: u64,
    verifier: cookieverf3,
    pending: VecDeque<DirEntry>,
    end: bool,
}

impl Listing {
    fn fetch(&mut self) -> io::Result<()> {
        let nfs = &self.namespace.shared().nfs;
        let DirPage { entries, next_cookie, verifier, end } =
            nfs.readdirplus(&self.directory, self.cookie, self.verifier)?;
        self.cookie = next_cookie;
        self.verifier = verifier;
        self.end = end || entries.is_empty();
        for entry in entries {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let kind = match entry.attributes {
                Some(attributes) => kind_of(attributes.type_),
                None => {
                    // The server left the attributes out: ask for them by name.
                    let (_, attributes) = nfs.lookup(&self.directory, &entry.name)?;
                    match attributes {
                        Some(attributes) => kind_of(attributes.type_),
                        None => FileKind::Regular,
                    }
                }
            };
            let name = OsString::from_vec(entry.name);
            self.pending.push_back(DirEntry { name, ino: entry.fileid, kind });
        }
        Ok(())
    }
}

impl Iterator for Listing {
    type Item = io::Result<DirEntry>;

    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        loop {
            if let Some(entry) = self.pending.pop_front() {
                return Some(Ok(entry));
            }
            if self.end {
                return None;
            }
            if let Err(error) = self.fetch() {
                self.end = true;
                return Some(Err(plain(error)));
            }
        }
    }
}

/// The mount answers the kernel with `raw_os_error`: the errno, without the server's words.
fn plain(error: io::Error) -> io::Error {
    match crate::errno_of(&error) {
        Some(code) if error.raw_os_error().is_none() => io::Error::from_raw_os_error(code),
        _ => error,
    }
}

fn kind_of(kind: ftype3) -> FileKind {
    match kind {
        ftype3::NF3REG => FileKind::Regular,
        ftype3::NF3DIR => FileKind::Directory,
        ftype3::NF3LNK => FileKind::Symlink,
        ftype3::NF3FIFO => FileKind::Fifo,
        ftype3::NF3SOCK => FileKind::Socket,
        ftype3::NF3CHR => FileKind::CharDevice,
        ftype3::NF3BLK => FileKind::BlockDevice,
    }
}

fn attr_of(handle: &Handle, attributes: &fattr3) -> Attr {
    let time = |time: nfstime3| {
        UNIX_EPOCH + Duration::new(u64::from(time.seconds), time.nseconds.min(999_999_999))
    };
    Attr {
        ino: attributes.fileid.max(2),
        generation: generation_of(handle),
        kind: kind_of(attributes.type_),
        perm: (attributes.mode & 0o7777) as u16,
        nlink: attributes.nlink,
        uid: attributes.uid,
        gid: attributes.gid,
        rdev: device(attributes.rdev.specdata1, attributes.rdev.specdata2),
        size: attributes.size,
        blocks: attributes.used.div_ceil(512),
        blksize: 4096,
        atime: time(attributes.atime),
        mtime: time(attributes.mtime),
        ctime: time(attributes.ctime),
    }
}

/// A hash of the handle's bytes (FNV-1a), never 0: the handle names one object for its whole
/// life, and a new object that reuses a `fileid` gets another handle.
fn generation_of(handle: &Handle) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in handle.data.iter() {
        hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash.max(1)
}

fn nfs_time(time: SystemTime) -> io::Result<nfstime3> {
    let since = time
        .duration_since(UNIX_EPOCH)
        .ok()
        .filter(|since| since.as_secs() <= u64::from(u32::MAX))
        .ok_or_else(|| io::Error::from_raw_os_error(errno::EINVAL))?;
    Ok(nfstime3 { seconds: since.as_secs() as u32, nseconds: since.subsec_nanos() })
}

/// Linux's `makedev` from a major and minor number.
fn device(major: u32, minor: u32) -> u64 {
    let (major, minor) = (u64::from(major), u64::from(minor));
    ((major & 0xfffff000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffffff00) << 12)
        | (minor & 0xff)
}

fn major(device: u64) -> u32 {
    (((device >> 32) & 0xfffff000) | ((device >> 8) & 0xfff)) as u32
}

fn minor(device: u64) -> u32 {
    (((device >> 12) & 0xffffff00) | (device & 0xff)) as u32
}
