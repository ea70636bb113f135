//! The metadata cache: what HeadObject and ListObjectsV2 said of each key, kept for
//! [`S3Options::metadata_ttl`](super::S3Options::metadata_ttl), so that the lookups, stats
//! and opens the kernel sends for one file cost one request, not one each.
//!
//! Each entry is what the server said of a key at a time (or what this process made it by
//! its own request: a create, a delete, a commit), and is used until it is `ttl` old. ebb's
//! own writes update or drop the entries they change before they return (a commit drops its
//! key's entry, so the next stat reads the server's size and Last-Modified; a delete records
//! the key missing; a new key marks its parent directories as existing), so this mount never
//! sees its own changes late. Other clients' changes are seen at most `ttl` late, as with
//! rclone's `--dir-cache-time`, s3fs's `stat_cache_expire` and mountpoint-s3's
//! `--metadata-ttl`. A `ttl` of zero caches nothing.
//!
//! Entries: `heads[key]`: the object's size and Last-Modified, or `None` (no object of that
//! key); `dirs[key]`: whether any key lies under `key/` (a directory). Both maps are pruned
//! of stale entries when they pass [`ENTRIES_MAX`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Entries per map before stale ones are pruned (about 100 bytes each: 1.6 MB at most
/// between prunes of a long-lived mount over a large bucket).
const ENTRIES_MAX: usize = 16_384;

/// The size and Last-Modified of an object, or `None` for no object.
pub(crate) type Head = Option<(u64, Option<SystemTime>)>;

/// See the module doc.
#[derive(Debug)]
pub(crate) struct MetaCache {
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    heads: HashMap<String, (Instant, Head)>,
    dirs: HashMap<String, (Instant, bool)>,
}

impl MetaCache {
    pub(crate) fn new(ttl: Duration) -> MetaCache {
        MetaCache { ttl, inner: Mutex::new(Inner::default()) }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What is known of the object `key`, if fresh.
    pub(crate) fn head(&self, key: &str) -> Option<Head> {
        let inner = self.inner();
        let (at, head) = inner.heads.get(key)?;
        (at.elapsed() < self.ttl).then_some(*head)
    }

    /// Whether `key/` has keys under it, if known and fresh.
    pub(crate) fn dir(&self, key: &str) -> Option<bool> {
        let inner = self.inner();
        let (at, dir) = inner.dirs.get(key)?;
        (at.elapsed() < self.ttl).then_some(*dir)
    }

    /// The server said (or this process made) `head` of `key`.
    pub(crate) fn set_head(&self, key: &str, head: Head) {
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.inner();
        if ENTRIES_MAX <= inner.heads.len() {
            let ttl = self.ttl;
            inner.heads.retain(|_, (at, _)| now.duration_since(*at) < ttl);
        }
        inner.heads.insert(key.to_owned(), (now, head));
    }

    /// The server said whether keys lie under `key/`.
    pub(crate) fn set_dir(&self, key: &str, dir: bool) {
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.inner();
        if ENTRIES_MAX <= inner.dirs.len() {
            let ttl = self.ttl;
            inner.dirs.retain(|_, (at, _)| now.duration_since(*at) < ttl);
        }
        inner.dirs.insert(key.to_owned(), (now, dir));
    }

    /// This process wrote `key` (its size and time are the server's to say): forgets its head
    /// and records every directory above it as existing.
    pub(crate) fn written(&self, key: &str) {
        let mut inner = self.inner();
        inner.heads.remove(key);
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut above = key.trim_end_matches('/');
        if key.ends_with('/') {
            // A directory's marker: the directory exists.
            inner.dirs.insert(above.to_owned(), (now, true));
        }
        while let Some((parent, _)) = above.rsplit_once('/') {
            inner.dirs.insert(parent.to_owned(), (now, true));
            above = parent;
        }
    }

    /// This process deleted `key`: records it missing, and forgets whether the directories
    /// above it still exist.
    pub(crate) fn deleted(&self, key: &str) {
        let mut inner = self.inner();
        if !self.ttl.is_zero() {
            inner.heads.insert(key.to_owned(), (Instant::now(), None));
        }
        let mut above = key.trim_end_matches('/');
        if key.ends_with('/') {
            inner.dirs.remove(above);
        }
        while let Some((parent, _)) = above.rsplit_once('/') {
            inner.dirs.remove(parent);
            above = parent;
        }
    }

    /// Forgets everything under `prefix` (a directory renamed away or into).
    pub(crate) fn forget_under(&self, prefix: &str) {
        let mut inner = self.inner();
        inner.heads.retain(|key, _| !key.starts_with(prefix));
        let dir = prefix.trim_end_matches('/');
        inner.dirs.retain(|key, _| !key.starts_with(prefix) && key.as_str() != dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_writes_update_the_cache_and_zero_ttl_caches_nothing() {
        let cache = MetaCache::new(Duration::from_secs(60));
        cache.set_head("p/d/f", None);
        cache.set_dir("p/d/f", false);
        assert_eq!(cache.head("p/d/f"), Some(None));
        cache.written("p/d/f");
        assert_eq!(cache.head("p/d/f"), None, "a write leaves the size to the server");
        assert_eq!(cache.dir("p/d"), Some(true));
        assert_eq!(cache.dir("p"), Some(true));
        cache.deleted("p/d/f");
        assert_eq!(cache.head("p/d/f"), Some(None));
        assert_eq!(cache.dir("p/d"), None, "the directory may be gone with its last key");
        cache.set_head("p/d/g", Some((3, None)));
        cache.forget_under("p/d/");
        assert_eq!(cache.head("p/d/g"), None);
        let off = MetaCache::new(Duration::ZERO);
        off.set_head("k", Some((1, None)));
        off.written("a/k");
        assert_eq!((off.head("k"), off.dir("a")), (None, None));
    }
}
