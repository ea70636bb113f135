//! The page maps the driver keeps, as the engine reaches them.

use std::collections::BTreeMap;

use crate::ids::InodeId;
use crate::pagemap::PageMap;

/// Gives the engine access to the page maps the driver keeps.
pub trait PageMaps {
    /// Runs `f` on the page map of `inode`, creating an empty one if the file has none yet.
    fn with<R>(&mut self, inode: InodeId, f: impl FnOnce(&mut PageMap) -> R) -> R;
}

/// Page maps in an ordered map: the simplest [`PageMaps`], used by the simulator and tests.
#[derive(Default)]
pub struct MapStore {
    maps: BTreeMap<InodeId, PageMap>,
}

impl MapStore {
    /// An empty store.
    pub fn new() -> MapStore {
        MapStore::default()
    }

    /// The map of `inode`, if it has one.
    pub fn get(&self, inode: InodeId) -> Option<&PageMap> {
        self.maps.get(&inode)
    }

    /// Every map.
    pub fn iter(&self) -> impl Iterator<Item = (InodeId, &PageMap)> {
        self.maps.iter().map(|(&i, m)| (i, m))
    }

    /// Drops the map of `inode` (the engine forgot the file, [`crate::Action::Forget`]).
    pub fn remove(&mut self, inode: InodeId) {
        self.maps.remove(&inode);
    }

    /// The map of `inode`, created if missing.
    pub fn get_mut(&mut self, inode: InodeId) -> &mut PageMap {
        self.maps.entry(inode).or_default()
    }
}

impl PageMaps for MapStore {
    fn with<R>(&mut self, inode: InodeId, f: impl FnOnce(&mut PageMap) -> R) -> R {
        f(self.maps.entry(inode).or_default())
    }
}
