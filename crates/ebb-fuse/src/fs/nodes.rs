//! The nodes the kernel knows (looked up and not yet forgotten), by node id, with the kernel's
//! count of references to each.
//!
//! A node id, which the mount also shows as `st_ino`, is the namespace's `ino` (stable for the
//! life of an object, see [`ebb_backend::Namespace`]), so it stays the same when the kernel
//! drops its inode cache and looks the object up again; the root is 1 whatever its `ino`.

use std::collections::HashMap;

use ebb_backend::{Attr, FileKind, Namespace};
use fuser::{Errno, INodeNo};
use parking_lot::Mutex;

struct Entry<N: Namespace> {
    /// `None` once released: the object was deleted by someone else (see
    /// [`Nodes::release`]); the kernel may still know the id, whose operations fail.
    node: Option<N::Node>,
    regular: bool,
    generation: u64,
    /// Lookups the kernel has not forgotten yet.
    count: u64,
}

/// The node table.
pub(crate) struct Nodes<N: Namespace> {
    table: Mutex<HashMap<u64, Entry<N>>>,
    /// The root's `ino` in the namespace (shown as 1).
    root_ino: u64,
}

impl<N: Namespace> Nodes<N> {
    pub(crate) fn new(root: N::Node, attr: &Attr) -> Nodes<N> {
        let mut table = HashMap::new();
        let root =
            Entry { node: Some(root), regular: false, generation: attr.generation, count: 1 };
        table.insert(INodeNo::ROOT.0, root);
        Nodes { table: Mutex::new(table), root_ino: attr.ino }
    }

    /// The node id of the object with `ino`.
    pub(crate) fn id(&self, ino: u64) -> u64 {
        if ino == self.root_ino { INodeNo::ROOT.0 } else { ino }
    }

    /// The node `id`; `ESTALE` if the kernel forgot it (or never had it) or it was released.
    pub(crate) fn get(&self, id: INodeNo) -> Result<N::Node, Errno> {
        self.table.lock().get(&id.0).and_then(|entry| entry.node.clone()).ok_or(Errno::ESTALE)
    }

    /// The regular files the kernel knows, with their node ids.
    pub(crate) fn regular_files(&self) -> Vec<(u64, N::Node)> {
        let table = self.table.lock();
        table
            .iter()
            .filter(|(_, entry)| entry.regular)
            .filter_map(|(&id, entry)| Some((id, entry.node.clone()?)))
            .collect()
    }

    /// Drops the node `id` (a regular file deleted by someone else, which nothing here has
    /// open) so that its descriptor no longer keeps the file's storage; the kernel's later
    /// requests on it fail with `ESTALE`, and a new lookup of the number finds a new object.
    pub(crate) fn release(&self, id: u64) {
        if let Some(entry) = self.table.lock().get_mut(&id) {
            entry.node = None;
        }
    }

    /// Counts one kernel reference to the object `node` with `attr` and returns its node id.
    /// A known id with another generation is a new object that reuses a number: it replaces
    /// the old one, which no longer exists.
    pub(crate) fn remember(&self, node: N::Node, attr: &Attr) -> u64 {
        let id = self.id(attr.ino);
        let mut table = self.table.lock();
        let entry = table.entry(id).or_insert_with(|| Entry {
            node: Some(node.clone()),
            regular: attr.kind == FileKind::Regular,
            generation: attr.generation,
            count: 0,
        });
        if entry.generation != attr.generation || entry.node.is_none() {
            entry.node = Some(node);
            entry.regular = attr.kind == FileKind::Regular;
            entry.generation = attr.generation;
        }
        entry.count += 1;
        id
    }

    /// The kernel dropped `count` references to `id`; the node goes with the last.
    pub(crate) fn forget(&self, id: u64, count: u64) {
        if id == INodeNo::ROOT.0 {
            return;
        }
        let mut table = self.table.lock();
        let Some(entry) = table.get_mut(&id) else { return };
        entry.count = entry.count.saturating_sub(count);
        if entry.count == 0 {
            table.remove(&id);
        }
    }
}
