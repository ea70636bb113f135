//! The namespace operations of the filesystem: lookups, attributes, creation and removal of
//! names, directories, extended attributes.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use ebb_backend::{Attr, Credentials, FileKind, Namespace, SetAttr, StatFs, XattrSet};
use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, RenameFlags, ReplyDirectory};
use parking_lot::Mutex;

use super::files::FileId;
use super::{Inner, OpenDir, STATS_XATTR, dir_entry, errno_of, to_errno};

/// Directory entries read ahead of the kernel's offset in one readdir (more than fit in
/// its 4 KiB buffer of short names, so each answer but the last is full).
const READ_AHEAD: usize = 256;

/// The file identity of a regular file's attributes (`None` for other objects).
pub(super) fn file_id(attr: &Attr) -> Option<FileId> {
    (attr.kind == FileKind::Regular).then_some((attr.ino, attr.generation))
}

/// How hidden names of removed files begin (`Inner::hide`).
const HIDDEN_PREFIX: &str = ".ebb-removed-";
/// The longest an rmdir waits for the hidden names of files whose last close is on its way
/// (`Inner::rmdir`). The RELEASE follows the UNLINK by well under a millisecond on an idle
/// machine; 2 s leaves room for a loaded one, and a directory with a hidden name of a file
/// still open fails after it, as it did at once before.
const RMDIR_HIDDEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl<N: Namespace> Inner<N> {
    /// Looks `name` up in `parent`, counting one kernel reference on the result.
    pub(super) fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<(FileAttr, u64), Errno> {
        let dir = self.node(parent)?;
        let (node, attr) = self.ns.lookup(&dir, name).map_err(to_errno)?;
        Ok(self.entry(node, &attr))
    }

    pub(super) fn getattr(&self, id: INodeNo) -> Result<FileAttr, Errno> {
        let node = self.node(id)?;
        let attr = self.ns.getattr(&node).map_err(to_errno)?;
        Ok(self.file_attr(id.0, &node, &attr))
    }

    /// Changes attributes; a regular file's size goes through the cache when ebb caches it,
    /// and an mtime set on a file whose times ebb keeps is kept (see [`crate::times`]).
    pub(super) fn setattr(
        &self,
        id: INodeNo,
        set: &SetAttr,
        fh: Option<FileHandle>,
        caller: &Credentials,
    ) -> Result<FileAttr, Errno> {
        self.files.check_writable()?;
        let node = self.node(id)?;
        let mut set = *set;
        let before = self.ns.getattr(&node).map_err(to_errno)?;
        let file = file_id(&before);
        if let (Some(size), Some(file)) = (set.size, file) {
            let times = self.files.file_times(file);
            let open = self.opener(&node, &times);
            if self.files.truncate(file, fh, size, &open).map_err(to_errno)? {
                set.size = None;
            }
        }
        let times = set.atime.is_some() || set.mtime.is_some();
        let kept = file.and_then(|file| self.files.kept_times(file)).filter(|_| times);
        let attr = match kept {
            // Under the kept times' lock, so a write-back cannot put back the old mtime.
            Some(kept) => kept.set_with(|| self.ns.setattr(&node, &set, caller)),
            None => self.ns.setattr(&node, &set, caller),
        }
        .map_err(to_errno)?;
        if let Some(file) = file {
            if set.size.is_some() {
                self.files.written(file);
            } else if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
                self.files.status_changed(file);
            }
        }
        Ok(self.file_attr(id.0, &node, &attr))
    }

    pub(super) fn readlink(&self, id: INodeNo) -> Result<Vec<u8>, Errno> {
        let node = self.node(id)?;
        let target = self.ns.readlink(&node).map_err(to_errno)?;
        Ok(target.as_bytes().to_vec())
    }

    pub(super) fn mknod(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: &Credentials,
    ) -> Result<(FileAttr, u64), Errno> {
        self.files.check_writable()?;
        let kind = match rustix::fs::FileType::from_raw_mode(mode) {
            rustix::fs::FileType::Fifo => FileKind::Fifo,
            rustix::fs::FileType::Socket => FileKind::Socket,
            rustix::fs::FileType::CharacterDevice => FileKind::CharDevice,
            rustix::fs::FileType::BlockDevice => FileKind::BlockDevice,
            rustix::fs::FileType::RegularFile => FileKind::Regular,
            _ => return Err(Errno::EINVAL),
        };
        let dir = self.node(parent)?;
        let (node, attr) = self
            .ns
            .mknod(&dir, name, kind, mode & 0o7777, rdev.into(), caller)
            .map_err(to_errno)?;
        Ok(self.entry(node, &attr))
    }

    pub(super) fn mkdir(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        caller: &Credentials,
    ) -> Result<(FileAttr, u64), Errno> {
        self.files.check_writable()?;
        let dir = self.node(parent)?;
        let (node, attr) = self.ns.mkdir(&dir, name, mode & 0o7777, caller).map_err(to_errno)?;
        Ok(self.entry(node, &attr))
    }

    pub(super) fn symlink(
        &self,
        parent: INodeNo,
        name: &OsStr,
        target: &OsStr,
        caller: &Credentials,
    ) -> Result<(FileAttr, u64), Errno> {
        self.files.check_writable()?;
        let dir = self.node(parent)?;
        let (node, attr) = self.ns.symlink(&dir, name, target, caller).map_err(to_errno)?;
        Ok(self.entry(node, &attr))
    }

    pub(super) fn link(
        &self,
        id: INodeNo,
        new_parent: INodeNo,
        new_name: &OsStr,
        caller: &Credentials,
    ) -> Result<(FileAttr, u64), Errno> {
        self.files.check_writable()?;
        let node = self.node(id)?;
        let dir = self.node(new_parent)?;
        let (node, attr) = self.ns.link(&node, &dir, new_name, caller).map_err(to_errno)?;
        if let Some(file) = file_id(&attr) {
            self.files.status_changed(file);
        }
        Ok(self.entry(node, &attr))
    }

    /// The regular file `name` in `dir`, if it is one: its identity and whether this is its
    /// last name.
    fn regular_file(&self, dir: &N::Node, name: &OsStr) -> Option<(FileId, bool)> {
        let (_, attr) = self.ns.lookup(dir, name).ok()?;
        file_id(&attr).map(|file| (file, attr.nlink <= 1))
    }

    /// A name of the regular file `file` went away (`last`: its only one).
    fn name_removed(&self, file: FileId, last: bool) {
        if last {
            self.files.after_remove(file);
        } else {
            self.files.status_changed(file);
        }
    }

    pub(super) fn unlink(
        &self,
        parent: INodeNo,
        name: &OsStr,
        caller: &Credentials,
    ) -> Result<(), Errno> {
        self.files.check_writable()?;
        let dir = self.node(parent)?;
        let removed = self.regular_file(&dir, name);
        if let Some((file, true)) = removed
            && self.hide_instead(file)
        {
            return self.hide(&dir, name, file, caller);
        }
        self.ns.unlink(&dir, name, caller).map_err(to_errno)?;
        if let Some((file, last)) = removed {
            self.name_removed(file, last);
        }
        Ok(())
    }

    /// Whether removing the last name of the regular file `file` must hide it instead: it is
    /// open through the mount and the namespace would destroy it at once.
    fn hide_instead(&self, file: FileId) -> bool {
        self.ns.removal_destroys_open_files() && self.files.is_open(file)
    }

    /// Renames `name` in `dir`, the last name of the open file `file`, to a hidden name that
    /// is removed at the file's last close, as the kernel's NFS client does ("silly rename"):
    /// the file's handles keep working until then.
    fn hide(
        &self,
        dir: &N::Node,
        name: &OsStr,
        file: FileId,
        caller: &Credentials,
    ) -> Result<(), Errno> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let hidden = loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let hidden = OsString::from(format!("{HIDDEN_PREFIX}{:x}-{n:x}", file.0));
            // A rename replaces: never onto a name that exists.
            match self.ns.lookup(dir, &hidden) {
                Err(error) if error.raw_os_error() == Some(libc::ENOENT) => break hidden,
                Err(error) => return Err(to_errno(error)),
                Ok(_) => continue,
            }
        };
        let flags = ebb_backend::RenameFlags::default();
        self.ns.rename(dir, name, dir, &hidden, flags, caller).map_err(to_errno)?;
        let (ns, dir, caller) = (Arc::clone(&self.ns), dir.clone(), caller.clone());
        self.files.hide(file, Box::new(move || ns.unlink(&dir, &hidden, &caller)));
        self.files.status_changed(file);
        Ok(())
    }

    pub(super) fn rmdir(
        &self,
        parent: INodeNo,
        name: &OsStr,
        caller: &Credentials,
    ) -> Result<(), Errno> {
        self.files.check_writable()?;
        let dir = self.node(parent)?;
        // A file unlinked just before may still be a hidden name: the kernel sends its RELEASE
        // (which removes that name) after the UNLINK returns, so an rmdir right after can
        // find it. Wait a bounded while for such names to go, as long as they are all that is
        // left; a hidden name of a file still open stays and the rmdir fails as before.
        let deadline = std::time::Instant::now() + RMDIR_HIDDEN_WAIT;
        loop {
            match self.ns.rmdir(&dir, name, caller) {
                Err(error)
                    if error.raw_os_error() == Some(libc::ENOTEMPTY)
                        && std::time::Instant::now() < deadline
                        && self.only_hidden_names(&dir, name) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                result => return result.map_err(to_errno),
            }
        }
    }

    /// Whether the directory `name` in `dir` holds nothing but hidden names of removed files
    /// (`hide`), or nothing at all now (the last hidden name went since the rmdir failed).
    fn only_hidden_names(&self, dir: &N::Node, name: &OsStr) -> bool {
        let Ok((node, _)) = self.ns.lookup(dir, name) else { return false };
        let Ok(entries) = self.ns.readdir(&node) else { return false };
        for entry in entries {
            let Ok(entry) = entry else { return false };
            let entry = entry.name.to_string_lossy();
            if entry == "." || entry == ".." {
                continue;
            }
            if !entry.starts_with(HIDDEN_PREFIX) {
                return false;
            }
        }
        true
    }

    pub(super) fn rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        caller: &Credentials,
    ) -> Result<(), Errno> {
        self.files.check_writable()?;
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            return Err(Errno::EINVAL);
        }
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let rename_flags = ebb_backend::RenameFlags {
            no_replace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange,
        };
        let from = self.node(parent)?;
        let to = self.node(new_parent)?;
        let source = self.regular_file(&from, name);
        // A replaced target loses a name (unless it is the source itself, or swapped).
        let mut replaced = if exchange { None } else { self.regular_file(&to, new_name) }
            .filter(|(file, _)| Some(*file) != source.map(|(source, _)| source));
        if let Some((file, true)) = replaced
            && self.hide_instead(file)
        {
            // Hidden first, so the rename replaces nothing (the kernel's NFS client does so).
            self.hide(&to, new_name, file, caller)?;
            replaced = None;
        }
        self.ns.rename(&from, name, &to, new_name, rename_flags, caller).map_err(to_errno)?;
        if let Some((file, last)) = replaced {
            self.name_removed(file, last);
        }
        if let Some((file, _)) = source {
            self.files.status_changed(file);
        }
        Ok(())
    }

    pub(super) fn opendir(&self, id: INodeNo) -> Result<u64, Errno> {
        let node = self.node(id)?;
        let rest = self.ns.readdir(&node).map_err(to_errno)?;
        // "..": the parent is not known here; the kernel does not use it.
        let read = vec![
            (id.0, FileType::Directory, OsString::from(".")),
            (id.0, FileType::Directory, OsString::from("..")),
        ];
        let fh = self.files.next_handle();
        let dir = OpenDir { read, rest: Some(rest) };
        self.dirs.lock().insert(fh, Arc::new(Mutex::new(dir)));
        Ok(fh)
    }

    /// Reads entries of the open directory `fh` from the namespace until [`READ_AHEAD`] past
    /// `offset` (the index of the next entry the kernel wants) are known, or all are: the part
    /// of a readdir that may wait on the backend (and is tried again through an outage).
    pub(super) fn fill_dir(&self, fh: FileHandle, offset: u64) -> Result<(), Errno> {
        let Some(dir) = self.dirs.lock().get(&fh.0).cloned() else { return Err(Errno::EBADF) };
        let mut dir = dir.lock();
        let wanted = usize::try_from(offset).unwrap_or(usize::MAX).saturating_add(READ_AHEAD);
        while dir.read.len() < wanted {
            let Some(rest) = dir.rest.as_mut() else { break };
            match rest.next() {
                Some(Ok(entry)) => {
                    let entry = dir_entry(&self.nodes, entry);
                    dir.read.push(entry);
                }
                Some(Err(error)) => return Err(to_errno(error)),
                None => dir.rest = None,
            }
        }
        Ok(())
    }

    /// Answers a readdir from `offset` with the entries [`Inner::fill_dir`] read (as many as
    /// fit; the kernel asks again from where the answer ends, and an empty one is the end).
    pub(super) fn readdir(&self, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(dir) = self.dirs.lock().get(&fh.0).cloned() else {
            reply.error(Errno::EBADF);
            return;
        };
        let dir = dir.lock();
        let mut index = usize::try_from(offset).unwrap_or(usize::MAX);
        while let Some((ino, kind, name)) = dir.read.get(index) {
            if reply.add(INodeNo(*ino), index as u64 + 1, *kind, name) {
                break;
            }
            index += 1;
        }
        reply.ok();
    }

    pub(super) fn fsyncdir(&self, id: INodeNo) -> Result<(), Errno> {
        let node = self.node(id)?;
        self.ns.sync_dir(&node).map_err(to_errno)
    }

    pub(super) fn statfs(&self, id: INodeNo) -> Result<StatFs, Errno> {
        let node = self.node(id)?;
        self.ns.statfs(&node).map_err(to_errno)
    }

    pub(super) fn getxattr(&self, id: INodeNo, name: &OsStr) -> Result<Vec<u8>, Errno> {
        if id == INodeNo::ROOT && name == STATS_XATTR {
            return Ok(self.files.stats_json(crate::DEFAULT_LISTED_FILES).into_bytes());
        }
        let node = self.node(id)?;
        self.ns.getxattr(&node, name).map_err(to_errno)
    }

    /// The attribute names, NUL-terminated each; the root also lists the stats attribute.
    pub(super) fn listxattr(&self, id: INodeNo) -> Result<Vec<u8>, Errno> {
        let node = self.node(id)?;
        let mut names = match self.ns.listxattr(&node) {
            Ok(names) => names,
            Err(error) if id == INodeNo::ROOT && errno_of(&error) == Errno::EOPNOTSUPP => {
                Vec::new()
            }
            Err(error) => return Err(to_errno(error)),
        };
        if id == INodeNo::ROOT {
            names.push(OsString::from(STATS_XATTR));
        }
        let mut list = Vec::new();
        for name in names {
            list.extend_from_slice(name.as_bytes());
            list.push(0);
        }
        Ok(list)
    }

    pub(super) fn setxattr(
        &self,
        id: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        caller: &Credentials,
    ) -> Result<(), Errno> {
        if id == INodeNo::ROOT && name == STATS_XATTR {
            return Err(Errno::EPERM);
        }
        self.files.check_writable()?;
        let how = match flags {
            0 => XattrSet::Either,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return Err(Errno::EINVAL),
        };
        let node = self.node(id)?;
        self.ns.setxattr(&node, name, value, how, caller).map_err(to_errno)?;
        self.xattr_changed(&node);
        Ok(())
    }

    pub(super) fn removexattr(
        &self,
        id: INodeNo,
        name: &OsStr,
        caller: &Credentials,
    ) -> Result<(), Errno> {
        if id == INodeNo::ROOT && name == STATS_XATTR {
            return Err(Errno::EPERM);
        }
        self.files.check_writable()?;
        let node = self.node(id)?;
        self.ns.removexattr(&node, name, caller).map_err(to_errno)?;
        self.xattr_changed(&node);
        Ok(())
    }

    fn xattr_changed(&self, node: &N::Node) {
        if let Some(file) = self.ns.getattr(node).ok().as_ref().and_then(file_id) {
            self.files.status_changed(file);
        }
    }
}
