//! The nodes the kernel knows (looked up and not yet forgotten), by node id, with the kernel's
//! count of references to each.
//!
//! A node id, which the mount also shows as `st_ino`, is the namespace's `ino` (stable for the
//! life of an object, see [`ebb_backend::Namespace`]), so it stays the same when the kernel
//! drops its inode cache and looks the object up again; the root is 1 whatever its `ino`.

use std::collections::HashMap;

use ebb_backend::{Attr, Namespace};
use fuser::{Errno, INodeNo};
use parking_lot::Mutex;

struct Entry<N: Namespace> {
    node: N::Node,
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
        table.insert(INodeNo::ROOT.0, Entry { node: root, generation: attr.generation, count: 1 });
        Nodes { table: Mutex::new(table), root_ino: attr.ino }
    }

    /// The node id of the object with `ino`.
    pub(crate) fn id(&self, ino: u64) -> u64 {
        if ino == self.root_ino { INodeNo::ROOT.0 } else { ino }
    }

    /// The node `id`; `ESTALE` if the kernel forgot it (or never had it).
    pub(crate) fn get(&self, id: INodeNo) -> Result<N::Node, Errno> {
        self.table.lock().get(&id.0).map(|entry| entry.node.clone()).ok_or(Errno::ESTALE)
    }

    /// Counts one kernel reference to the object `node` with `attr` and returns its node id.
    /// A known id with another generation is a new object that reuses a number: it replaces
    /// the old one, which no longer exists.
    pub(crate) fn remember(&self, node: N::Node, attr: &Attr) -> u64 {
        let id = self.id(attr.ino);
        let mut table = self.table.lock();
        let entry = table.entry(id).or_insert_with(|| Entry {
            node: node.clone(),
            generation: attr.generation,
            count: 0,
        });
        if entry.generation != attr.generation {
            entry.node = node;
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
