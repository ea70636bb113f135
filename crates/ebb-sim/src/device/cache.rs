//! A device's volatile write cache: space accounting and the set of dirty extents to destage.
//!
//! Drives and SSDs acknowledge a write as soon as its data sits in their RAM, and write it to
//! the media later. That is why buffered writeback can fill a device with seconds of work that
//! reads then queue behind, and why blk-wbt treats devices with a write cache specially
//! (docs/wbt.md). The cache here only tracks bytes and ranges; `block.rs` decides
//! when to admit and when to destage.
//!
//! Space is reserved when a write starts crossing the link (so admission can never overfill
//! the cache), becomes a dirty extent when the transfer completes, and is released when its
//! destage completes. Dirty extents are kept disjoint and non-adjacent in a B-tree: a write
//! that overlaps or touches an existing extent merges with it, and bytes it overwrites are
//! released at once (they will never be destaged, as in a real cache). Destaging walks the
//! extents in ascending offset from a cursor and wraps around (C-LOOK), so a disk destages
//! with short seeks.

use std::collections::BTreeMap;

/// Space and dirty ranges of one write cache; see the module doc.
#[derive(Debug)]
pub(super) struct WriteCache {
    capacity: u64,
    /// Reserved plus dirty bytes.
    used: u64,
    /// Disjoint, non-adjacent dirty extents: offset to length.
    dirty: BTreeMap<u64, u64>,
    dirty_bytes: u64,
    /// Where the next destage search starts (end of the last destaged chunk).
    cursor: u64,
}

impl WriteCache {
    pub(super) fn new(capacity: u64) -> WriteCache {
        WriteCache { capacity, used: 0, dirty: BTreeMap::new(), dirty_bytes: 0, cursor: 0 }
    }

    /// True if a write of `len` bytes can ever be cached (otherwise it is written through).
    pub(super) fn can_hold(&self, len: u64) -> bool {
        WriteCache::caches(self.capacity, len)
    }

    /// The admission rule of a cache of `capacity` bytes: a write of `len` bytes is cached
    /// (acknowledged from volatile memory) if it fits at all, else written through to the media.
    pub(super) fn caches(capacity: u64, len: u64) -> bool {
        len <= capacity
    }

    /// True if `len` bytes can be reserved now.
    pub(super) fn has_room(&self, len: u64) -> bool {
        self.used + len <= self.capacity
    }

    pub(super) fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    /// Reserves space for a write whose transfer is starting.
    pub(super) fn reserve(&mut self, len: u64) {
        assert!(self.has_room(len));
        self.used += len;
    }

    /// Records a reserved write as dirty; returns the bytes it overwrote, which are released.
    pub(super) fn insert(&mut self, offset: u64, len: u64) -> u64 {
        assert!(len > 0);
        let mut start = offset;
        let mut end = offset + len;
        let mut replaced = 0;
        if let Some((&before, &before_len)) = self.dirty.range(..=start).next_back()
            && before + before_len >= start
        {
            start = before;
            end = end.max(before + before_len);
            replaced += before_len;
            self.dirty.remove(&before);
        }
        while let Some((&after, &after_len)) = self.dirty.range(start..=end).next() {
            end = end.max(after + after_len);
            replaced += after_len;
            self.dirty.remove(&after);
        }
        let merged = end - start;
        self.dirty.insert(start, merged);
        let overwritten = replaced + len - merged;
        self.dirty_bytes = self.dirty_bytes - replaced + merged;
        self.used -= overwritten;
        assert!(self.dirty_bytes <= self.used);
        overwritten
    }

    /// Removes up to `max_len` dirty bytes for destaging: the first extent at or after the
    /// cursor, wrapping to the lowest one. The space stays used until [`Self::release`].
    pub(super) fn take_chunk(&mut self, max_len: u64) -> Option<(u64, u64)> {
        assert!(max_len > 0);
        let (&offset, &len) =
            self.dirty.range(self.cursor..).next().or_else(|| self.dirty.iter().next())?;
        self.dirty.remove(&offset);
        let chunk = len.min(max_len);
        if chunk < len {
            self.dirty.insert(offset + chunk, len - chunk);
        }
        self.dirty_bytes -= chunk;
        self.cursor = offset + chunk;
        Some((offset, chunk))
    }

    /// Frees the space of a completed destage.
    pub(super) fn release(&mut self, len: u64) {
        assert!(len <= self.used - self.dirty_bytes, "released more than was taken");
        self.used -= len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_writes_merge_and_release_overwritten_bytes() {
        // Goal: extents stay disjoint, adjacent writes coalesce, and overwritten bytes free
        // their space immediately so a flush can still drain the cache to zero.
        let mut cache = WriteCache::new(1 << 20);
        for (offset, len) in [(0, 4096), (8192, 4096), (4096, 4096), (2048, 4096)] {
            cache.reserve(len);
            let overwritten = cache.insert(offset, len);
            assert_eq!(overwritten, if offset == 2048 { 4096 } else { 0 });
        }
        assert_eq!(cache.dirty_bytes(), 12288);
        assert_eq!(cache.take_chunk(8192), Some((0, 8192)));
        assert_eq!(cache.take_chunk(8192), Some((8192, 4096)));
        assert_eq!(cache.take_chunk(8192), None);
        cache.release(12288);
        assert!(cache.has_room(1 << 20));
    }

    #[test]
    fn destage_walks_upward_and_wraps() {
        // Goal: destaging continues from the last destaged position (C-LOOK order).
        let mut cache = WriteCache::new(1 << 20);
        for offset in [300_000, 100_000, 200_000] {
            cache.reserve(4096);
            cache.insert(offset, 4096);
        }
        assert_eq!(cache.take_chunk(4096), Some((100_000, 4096)));
        cache.reserve(4096);
        cache.insert(50_000, 4096);
        assert_eq!(cache.take_chunk(4096), Some((200_000, 4096)));
        assert_eq!(cache.take_chunk(4096), Some((300_000, 4096)));
        assert_eq!(cache.take_chunk(4096), Some((50_000, 4096)));
    }
}
