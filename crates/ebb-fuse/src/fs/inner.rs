//! The filesystem state's own helpers: a node's namespace reference, a regular file's data
//! path as the cache opens it, and the attributes the kernel is told.

use std::io;
use std::sync::Arc;
use std::time::SystemTime;

use ebb_backend::{Attr, BackendFile, Credentials, FileKind, Namespace, SetAttr, SetTime};
use fuser::{Errno, FileAttr, INodeNo};

use super::Inner;
use super::convert::file_type;
use crate::times::{FileTimes, TimedFile};

impl<N: Namespace> Inner<N> {
    pub(super) fn node(&self, id: INodeNo) -> Result<N::Node, Errno> {
        self.nodes.get(id)
    }

    /// Opens the data path of the regular file `node` for the cache, wrapped so that the
    /// backend's mtime is put back to the kept one after each write-back.
    pub(super) fn opener<'a>(
        &'a self,
        node: &'a N::Node,
        times: &'a Arc<FileTimes>,
    ) -> impl Fn() -> io::Result<Arc<dyn BackendFile>> + 'a {
        move || {
            let inner = self.ns.open_file(node)?;
            let (ns, node) = (Arc::clone(&self.ns), node.clone());
            let (stat_ns, stat_node) = (Arc::clone(&ns), node.clone());
            let restore = Box::new(move |mtime: SystemTime| {
                let set = SetAttr { mtime: Some(SetTime::At(mtime)), ..SetAttr::default() };
                ns.setattr(&node, &set, &Credentials::default()).map(|attr| attr.mtime)
            });
            let stat = Box::new(move || stat_ns.getattr(&stat_node).map(|attr| attr.mtime));
            let times = Arc::clone(times);
            Ok(Arc::new(TimedFile { inner, times, restore, stat, inflight: 0.into() }) as _)
        }
    }

    /// What the kernel is told about the object `node` with `attr` and node id `id`: for a
    /// file ebb caches, ebb's size and the times it keeps.
    pub(super) fn file_attr(&self, id: u64, node: &N::Node, attr: &Attr) -> FileAttr {
        let mut size = attr.size;
        let (mut mtime, mut ctime) = (attr.mtime, attr.ctime);
        if attr.kind == FileKind::Regular {
            let file = (attr.ino, attr.generation);
            let times = self.files.file_times(file);
            let open = self.opener(node, &times);
            if self.files.drop_if_changed(file, &times, attr.size, attr.mtime, &open) {
                // Closing the cache may have changed the backend's file (an S3 object gets
                // a trimmed size then): its attributes from before are out of date.
                if let Ok(fresh) = self.ns.getattr(node) {
                    times.saw(fresh.mtime);
                    (size, mtime, ctime) = (fresh.size, fresh.mtime, fresh.ctime);
                }
            }
            if let Some(kept) = times.get() {
                (mtime, ctime) = (kept.mtime, kept.ctime);
            }
            // On error the backend's size is the best answer left.
            if let Some(Ok(cached)) = self.files.cached_size(file, &open) {
                size = cached;
            }
        }
        FileAttr {
            ino: INodeNo(id),
            size,
            blocks: size.div_ceil(512).max(attr.blocks),
            atime: attr.atime,
            mtime,
            ctime,
            crtime: SystemTime::UNIX_EPOCH,
            kind: file_type(attr.kind),
            perm: attr.perm,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            rdev: u32::try_from(attr.rdev).unwrap_or(0),
            blksize: attr.blksize,
            flags: 0,
        }
    }

    /// Releases the nodes and cached data of regular files deleted by someone else that
    /// nothing has open through the mount, so their storage is freed (see [`super::nodes`]).
    pub(super) fn release_deleted_files(&self) {
        for (id, node) in self.nodes.regular_files() {
            let Ok(attr) = self.ns.getattr(&node) else { continue };
            if attr.nlink == 0 && self.files.release_deleted((attr.ino, attr.generation)) {
                self.nodes.release(id);
            }
        }
    }

    /// Counts a kernel reference to the object `node` and tells its attributes.
    pub(super) fn entry(&self, node: N::Node, attr: &Attr) -> (FileAttr, u64) {
        let id = self.nodes.remember(node.clone(), attr);
        (self.file_attr(id, &node, attr), attr.generation)
    }
}
