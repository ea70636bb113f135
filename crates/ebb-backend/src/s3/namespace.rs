//! `S3Namespace`: a bucket (under a prefix) as a tree for the mount, as s3fs and rclone show
//! one.
//!
//! Directories are `/`-delimited key prefixes; `mkdir` writes a zero-byte `dir/` marker
//! object (as s3fs and rclone do), so an empty directory exists, and a directory also exists
//! while any key lies under it. A file is one object ([`super::S3Backend`] for its data).
//! Inode numbers are synthetic: a hash of the path when this mount first sees it (so the same
//! across mounts for files never renamed; the root is 1), unique among the paths it has seen,
//! kept by a file through its renames, with a generation that changes each time this mount
//! creates an object under a number, so a file recreated under the same name is a new file to
//! ebb's cache. Nodes share their path, and a rename moves it, so a node follows its file. What S3 cannot do fails, never half-done: hard links
//! `EPERM`; symlinks, special files, and changing modes, owners or times `EOPNOTSUPP` (objects
//! show 0644, directories 0755, owned by the mount's user, with the object's Last-Modified as
//! their times). A file is renamed by completing its upload, copying it on the server and
//! deleting the old key (objects up to 5 GiB; larger ones `EXDEV`); a directory by copying
//! every key under it on the server, then deleting the old keys, journaled so that a crash
//! between leaves each file under its old or new name (or both) and the next start finishes
//! the rename (`EXDEV` if a key under it is larger than 5 GiB). While it runs, other clients
//! may see a file under both names.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::SystemTime;

use super::S3Backend;
use super::error::S3Error;
use crate::backend::{Backend, BackendFile, OpenOptions, check_name};
use crate::namespace::{
    Attr, Credentials, DirEntries, DirEntry, FileKind, Namespace, RenameFlags, SetAttr, StatFs,
    unsupported,
};

/// Largest object CopyObject copies in one request.
pub(super) const COPY_BYTES_MAX: u64 = 5 << 30;

mod errno {
    pub(super) const EPERM: i32 = 1;
    pub(super) const ENOENT: i32 = 2;
    pub(super) const EEXIST: i32 = 17;
    pub(super) const EXDEV: i32 = 18;
    pub(super) const ENOTDIR: i32 = 20;
    pub(super) const EISDIR: i32 = 21;
    pub(super) const EINVAL: i32 = 22;
    pub(super) const ENAMETOOLONG: i32 = 36;
    pub(super) const ENOTEMPTY: i32 = 39;
}

/// The longest name of one path component, bytes: the kernel's `NAME_MAX`, which `statfs`
/// reports (`name_max`).
const NAME_MAX: usize = 255;
/// The longest object key, bytes: S3's limit of 1,024 bytes of UTF-8. A path is refused when
/// its key (the bucket prefix, the path, and the `/` a directory's marker adds) would not fit,
/// so every file and directory a name can make also has a key.
const KEY_MAX: usize = 1024;

fn os_error(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// A bucket as a tree. See the module doc.
#[derive(Debug)]
pub struct S3Namespace {
    backend: S3Backend,
    names: Mutex<Names>,
    started: SystemTime,
    owner: (u32, u32),
}

/// The numbers and nodes of the paths this mount has seen.
#[derive(Debug, Default)]
struct Names {
    inos: BTreeMap<String, u64>,
    paths: BTreeMap<u64, String>,
    /// Objects this mount created under each number (absent: 0).
    generations: BTreeMap<u64, u64>,
    /// The shared path of every node alive, so a rename moves it.
    nodes: BTreeMap<String, Weak<Mutex<String>>>,
}

impl Names {
    fn ino(&mut self, path: &str) -> u64 {
        if let Some(ino) = self.inos.get(path) {
            return *ino;
        }
        let mut ino = ino_of(path);
        while self.paths.contains_key(&ino) {
            ino = ino_of(&format!("{ino}/{path}"));
        }
        self.inos.insert(path.to_owned(), ino);
        self.paths.insert(ino, path.to_owned());
        ino
    }

    fn shared_path(&mut self, path: &str) -> Arc<Mutex<String>> {
        if let Some(shared) = self.nodes.get(path).and_then(Weak::upgrade) {
            return shared;
        }
        let shared = Arc::new(Mutex::new(path.to_owned()));
        self.nodes.retain(|_, weak| weak.strong_count() > 0);
        self.nodes.insert(path.to_owned(), Arc::downgrade(&shared));
        shared
    }

    /// The directory `from` and everything under it now have names under `to`.
    fn renamed_tree(&mut self, from: &str, to: &str) {
        let under = |path: &str| {
            path.strip_prefix(from).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        };
        let mut paths: Vec<String> = self.inos.keys().filter(|path| under(path)).cloned().collect();
        paths.extend(self.nodes.keys().filter(|path| under(path)).cloned());
        paths.sort();
        paths.dedup();
        for path in paths {
            let new = format!("{to}{}", &path[from.len()..]);
            self.renamed(&path, &new);
        }
    }

    /// `from` now has the name `to`; what `to` named is gone.
    fn renamed(&mut self, from: &str, to: &str) {
        if let Some(old) = self.inos.remove(to) {
            self.paths.remove(&old);
        }
        if let Some(ino) = self.inos.remove(from) {
            self.inos.insert(to.to_owned(), ino);
            self.paths.insert(ino, to.to_owned());
        }
        self.nodes.remove(to);
        if let Some(shared) = self.nodes.remove(from).and_then(|weak| weak.upgrade()) {
            *shared.lock().unwrap_or_else(PoisonError::into_inner) = to.to_owned();
            self.nodes.insert(to.to_owned(), Arc::downgrade(&shared));
        }
    }
}

/// One object: its path under the prefix (`""` for the root, no trailing `/`; shared by the
/// object's nodes and moved by a rename) and whether it is a directory.
#[derive(Debug, Clone)]
pub struct S3Node {
    path: Arc<Mutex<String>>,
    directory: bool,
}

impl S3Node {
    /// The node's path now.
    pub fn path(&self) -> String {
        self.path.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl S3Namespace {
    /// The tree of `backend`'s bucket under its prefix.
    pub fn new(backend: S3Backend) -> S3Namespace {
        let owner = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());
        S3Namespace {
            backend,
            names: Mutex::new(Names::default()),
            started: SystemTime::now(),
            owner,
        }
    }

    fn key(&self, path: &str) -> String {
        format!("{}{path}", self.backend.prefix())
    }

    fn child(&self, parent: &S3Node, name: &OsStr) -> io::Result<String> {
        if !parent.directory {
            return Err(os_error(errno::ENOTDIR));
        }
        let name = name.to_str().ok_or_else(|| os_error(errno::EINVAL))?;
        check_name(name).map_err(|_| os_error(errno::EINVAL))?;
        if name.len() > NAME_MAX {
            return Err(os_error(errno::ENAMETOOLONG));
        }
        let parent = parent.path();
        let path = if parent.is_empty() { name.to_owned() } else { format!("{parent}/{name}") };
        if self.backend.prefix().len() + path.len() + 1 > KEY_MAX {
            return Err(os_error(errno::ENAMETOOLONG));
        }
        Ok(path)
    }

    fn names(&self) -> MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn node(&self, path: &str, directory: bool) -> S3Node {
        S3Node { path: self.names().shared_path(path), directory }
    }

    /// This mount made a new object at `path`: a new generation of its number.
    fn created(&self, path: &str) {
        let mut names = self.names();
        let ino = names.ino(path);
        *names.generations.entry(ino).or_insert(0) += 1;
    }

    fn attr(&self, path: &str, kind: FileKind, size: u64, mtime: SystemTime) -> Attr {
        let (ino, generation) = if path.is_empty() {
            (1, 0)
        } else {
            let mut names = self.names();
            let ino = names.ino(path);
            (ino, names.generations.get(&ino).copied().unwrap_or(0))
        };
        Attr {
            ino,
            generation,
            kind,
            perm: if kind == FileKind::Directory { 0o755 } else { 0o644 },
            nlink: if kind == FileKind::Directory { 2 } else { 1 },
            uid: self.owner.0,
            gid: self.owner.1,
            rdev: 0,
            size,
            blocks: size.div_ceil(512),
            blksize: 1 << 20,
            atime: mtime,
            mtime,
            ctime: mtime,
        }
    }

    /// What `path` is now: a file (an object), a directory (a marker or keys under it), or
    /// nothing.
    fn stat(&self, path: &str) -> io::Result<Option<S3Node>> {
        if path.is_empty() {
            return Ok(Some(self.node("", true)));
        }
        let client = self.backend.client();
        let key = self.key(path);
        if client.meta.absent(&key) {
            return Ok(None);
        }
        if client.head_object(&key).map_err(S3Error::into_io)?.is_some() {
            return Ok(Some(self.node(path, false)));
        }
        let directory = match client.meta.dir(&key) {
            Some(directory) => directory,
            None => {
                let listing = client
                    .list_objects(&format!("{key}/"), Some("/"), None)
                    .map_err(S3Error::into_io)?;
                let directory = !listing.objects.is_empty() || !listing.prefixes.is_empty();
                client.meta.set_dir(&key, directory);
                directory
            }
        };
        Ok(directory.then(|| self.node(path, true)))
    }

    fn attr_of(&self, node: &S3Node) -> io::Result<Attr> {
        let path = node.path();
        if node.directory {
            return Ok(self.attr(&path, FileKind::Directory, 0, self.started));
        }
        let key = self.key(&path);
        let head = self.backend.client().head_object_meta(&key).map_err(S3Error::into_io)?;
        let (size, mtime) = head.ok_or_else(|| os_error(errno::ENOENT))?;
        // A file this mount has open may be longer than the object (the mount shows ebb's size).
        Ok(self.attr(&path, FileKind::Regular, size, mtime.unwrap_or(self.started)))
    }

    /// Renames the directory `from` to `to`: every key under it copied on the server, then
    /// deleted ([`S3Backend::rename_prefix`], journaled and rolled forward after a crash).
    /// The target may be an empty directory (replaced), not a file (`ENOTDIR`), a directory
    /// with entries (`ENOTEMPTY`) or inside the source (`EINVAL`).
    fn rename_directory(&self, from: &str, to: &str, flags: RenameFlags) -> io::Result<()> {
        if from == to {
            return Ok(());
        }
        if to.strip_prefix(from).is_some_and(|rest| rest.starts_with('/')) {
            return Err(os_error(errno::EINVAL));
        }
        match self.stat(to)? {
            Some(_) if flags.no_replace => return Err(os_error(errno::EEXIST)),
            Some(target) if !target.directory => return Err(os_error(errno::ENOTDIR)),
            // An empty target keeps its marker (the source's, if it has one, replaces it).
            Some(_) if self.has_children(to)? => return Err(os_error(errno::ENOTEMPTY)),
            _ => {}
        }
        let (old, new) = (format!("{}/", self.key(from)), format!("{}/", self.key(to)));
        self.backend.rename_prefix(&old, &new, KEY_MAX)?;
        self.names().renamed_tree(from, to);
        Ok(())
    }

    /// Whether the directory `path` has any key under it but its own marker.
    fn has_children(&self, path: &str) -> io::Result<bool> {
        let prefix = format!("{}/", self.key(path));
        let listing =
            self.backend.client().list_objects(&prefix, None, None).map_err(S3Error::into_io)?;
        Ok(listing.objects.iter().any(|(key, _)| *key != prefix))
    }
}

/// A stable inode number for `path`: FNV-1a of it, never 0 or 1 (the root is 1).
fn ino_of(path: &str) -> u64 {
    if path.is_empty() {
        return 1;
    }
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    hash.max(2)
}

impl Namespace for S3Namespace {
    type Node = S3Node;

    fn describe(&self) -> String {
        format!("s3://{}/{}", self.backend.client().bucket_name(), self.backend.prefix())
    }

    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    /// A removed object's open files fail their later writes (the key is gone); a renamed one
    /// follows its new key, so hiding it keeps them working.
    fn removal_destroys_open_files(&self) -> bool {
        true
    }

    fn writeback_settings(&self, settings: &mut ebb_core::BackendConfig) {
        self.backend.writeback_settings(settings);
    }

    fn root(&self) -> io::Result<(S3Node, Attr)> {
        let node = self.node("", true);
        let attr = self.attr_of(&node)?;
        Ok((node, attr))
    }

    fn lookup(&self, parent: &S3Node, name: &OsStr) -> io::Result<(S3Node, Attr)> {
        let path = self.child(parent, name)?;
        let node = self.stat(&path)?.ok_or_else(|| os_error(errno::ENOENT))?;
        let attr = self.attr_of(&node)?;
        Ok((node, attr))
    }

    fn getattr(&self, node: &S3Node) -> io::Result<Attr> {
        self.attr_of(node)
    }

    fn setattr(&self, node: &S3Node, set: &SetAttr, _caller: &Credentials) -> io::Result<Attr> {
        let before = self.attr_of(node)?;
        let changes_owner = set.uid.is_some_and(|uid| uid != before.uid)
            || set.gid.is_some_and(|gid| gid != before.gid)
            || set.mode.is_some_and(|mode| mode & 0o7777 != u32::from(before.perm));
        if changes_owner || set.atime.is_some() || set.mtime.is_some() {
            return Err(unsupported());
        }
        if let Some(size) = set.size {
            if node.directory {
                return Err(os_error(errno::EISDIR));
            }
            let file = self.open_file(node)?;
            file.set_size(size)?;
            file.sync()?;
        }
        self.attr_of(node)
    }

    fn readlink(&self, _node: &S3Node) -> io::Result<OsString> {
        Err(os_error(errno::EINVAL))
    }

    fn create(
        &self,
        parent: &S3Node,
        name: &OsStr,
        _mode: u32,
        _caller: &Credentials,
    ) -> io::Result<(S3Node, Attr)> {
        let path = self.child(parent, name)?;
        if self.stat(&path)?.is_some() {
            return Err(os_error(errno::EEXIST));
        }
        self.backend.client().put_object(&self.key(&path), &[]).map_err(S3Error::into_io)?;
        self.created(&path);
        let node = self.node(&path, false);
        let attr = self.attr_of(&node)?;
        Ok((node, attr))
    }

    fn mkdir(
        &self,
        parent: &S3Node,
        name: &OsStr,
        _mode: u32,
        _caller: &Credentials,
    ) -> io::Result<(S3Node, Attr)> {
        let path = self.child(parent, name)?;
        let since = std::time::Instant::now();
        if self.stat(&path)?.is_some() {
            return Err(os_error(errno::EEXIST));
        }
        let marker = format!("{}/", self.key(&path));
        let client = self.backend.client();
        client.put_object(&marker, &[]).map_err(S3Error::into_io)?;
        // Nothing was under it at that stat: its listing is known, empty.
        client.meta.set_listed(&marker, since);
        self.created(&path);
        let node = self.node(&path, true);
        let attr = self.attr_of(&node)?;
        Ok((node, attr))
    }

    fn mknod(
        &self,
        parent: &S3Node,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        _rdev: u64,
        caller: &Credentials,
    ) -> io::Result<(S3Node, Attr)> {
        match kind {
            FileKind::Regular => self.create(parent, name, mode, caller),
            _ => Err(unsupported()),
        }
    }

    fn symlink(
        &self,
        _parent: &S3Node,
        _name: &OsStr,
        _target: &OsStr,
        _caller: &Credentials,
    ) -> io::Result<(S3Node, Attr)> {
        Err(unsupported())
    }

    fn link(
        &self,
        _node: &S3Node,
        _new_parent: &S3Node,
        _new_name: &OsStr,
        _caller: &Credentials,
    ) -> io::Result<(S3Node, Attr)> {
        Err(os_error(errno::EPERM))
    }

    fn unlink(&self, parent: &S3Node, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        let path = self.child(parent, name)?;
        match self.stat(&path)? {
            None => Err(os_error(errno::ENOENT)),
            Some(node) if node.directory => Err(os_error(errno::EISDIR)),
            Some(_) => self.backend.remove_key(&self.key(&path)),
        }
    }

    fn rmdir(&self, parent: &S3Node, name: &OsStr, _caller: &Credentials) -> io::Result<()> {
        let path = self.child(parent, name)?;
        match self.stat(&path)? {
            None => Err(os_error(errno::ENOENT)),
            Some(node) if !node.directory => Err(os_error(errno::ENOTDIR)),
            Some(_) if self.has_children(&path)? => Err(os_error(errno::ENOTEMPTY)),
            Some(_) => {
                let marker = format!("{}/", self.key(&path));
                self.backend.client().delete_object(&marker).map_err(S3Error::into_io)
            }
        }
    }

    fn rename(
        &self,
        parent: &S3Node,
        name: &OsStr,
        new_parent: &S3Node,
        new_name: &OsStr,
        flags: RenameFlags,
        _caller: &Credentials,
    ) -> io::Result<()> {
        if flags.exchange {
            return Err(os_error(errno::EINVAL));
        }
        let from = self.child(parent, name)?;
        let to = self.child(new_parent, new_name)?;
        let source = self.stat(&from)?.ok_or_else(|| os_error(errno::ENOENT))?;
        if source.directory {
            return self.rename_directory(&from, &to, flags);
        }
        if from == to {
            return Ok(());
        }
        match self.stat(&to)? {
            Some(_) if flags.no_replace => return Err(os_error(errno::EEXIST)),
            Some(target) if target.directory => return Err(os_error(errno::EISDIR)),
            _ => {}
        }
        let size = self.attr_of(&source)?.size;
        if COPY_BYTES_MAX < size {
            return Err(os_error(errno::EXDEV));
        }
        self.backend.rename_key(&self.key(&from), &self.key(&to))?;
        self.names().renamed(&from, &to);
        Ok(())
    }

    fn readdir(&self, node: &S3Node) -> io::Result<DirEntries> {
        if !node.directory {
            return Err(os_error(errno::ENOTDIR));
        }
        let path = node.path();
        let prefix = if path.is_empty() { self.key("") } else { format!("{}/", self.key(&path)) };
        let base = if path.is_empty() { String::new() } else { format!("{path}/") };
        let client = self.backend.client();
        let mut entries = Vec::new();
        let mut continuation: Option<String> = None;
        let since = std::time::Instant::now();
        loop {
            let listing = client
                .list_objects(&prefix, Some("/"), continuation.as_deref())
                .map_err(S3Error::into_io)?;
            for (key, _) in &listing.objects {
                let name = &key[prefix.len()..];
                if !name.is_empty() {
                    let path = format!("{base}{name}");
                    let ino = self.names().ino(&path);
                    entries.push(Ok(DirEntry { name: name.into(), ino, kind: FileKind::Regular }));
                }
            }
            for sub in &listing.prefixes {
                let name = sub[prefix.len()..].trim_end_matches('/');
                if !name.is_empty() {
                    let path = format!("{base}{name}");
                    let ino = self.names().ino(&path);
                    entries.push(Ok(DirEntry {
                        name: name.into(),
                        ino,
                        kind: FileKind::Directory,
                    }));
                }
            }
            match listing.next {
                Some(token) => continuation = Some(token),
                None => break,
            }
        }
        client.meta.set_listed(&prefix, since);
        Ok(Box::new(entries.into_iter()))
    }

    fn statfs(&self, _node: &S3Node) -> io::Result<StatFs> {
        // A bucket has no size: numbers as large as other S3 mounts show.
        Ok(StatFs {
            blocks: 1 << 40,
            blocks_free: 1 << 40,
            blocks_available: 1 << 40,
            files: 1 << 40,
            files_free: 1 << 40,
            block_size: 4096,
            name_max: 255,
            fragment_size: 4096,
        })
    }

    fn open_file(&self, node: &S3Node) -> io::Result<Arc<dyn BackendFile>> {
        if node.directory {
            return Err(os_error(errno::EISDIR));
        }
        self.backend
            .open_key(self.key(&node.path()), OpenOptions { create: false, truncate: false })
    }
}
