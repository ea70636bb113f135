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
//! key); `dirs[key]`: whether any key lies under `key/` (a directory); `listed[prefix]`: a
//! directory whose whole listing is known (its every page read, or made empty by this mount's
//! mkdir), so that a name in it with no fresh entry in `heads` or `dirs` does not exist: the
//! lookup of a new name before a create costs no request. A listing's time is when its first
//! page was asked for, so it goes stale no later than the entries it set. A change that leaves
//! a key's existence unknown (a commit by CompleteMultipartUpload, a copy) forgets the listing
//! of its directory; a delete, which may leave the directories above it empty, forgets the
//! listings above the key's own; a rename of a directory forgets them all. The maps are
//! pruned of stale entries when they pass [`ENTRIES_MAX`].

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
    listed: HashMap<String, Instant>,
}

/// The directory prefix `key` lies directly in: up to its last `/` (a directory's marker
/// `a/b/` lies in `a/`), or empty.
fn parent_prefix(key: &str) -> &str {
    let name = key.trim_end_matches('/');
    name.rfind('/').map_or("", |slash| &name[..=slash])
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

    /// Whether `key` is known not to exist (neither an object nor a directory): its directory's
    /// whole listing is fresh and has no such entry.
    pub(crate) fn absent(&self, key: &str) -> bool {
        let inner = self.inner();
        let fresh = |at: &Instant| at.elapsed() < self.ttl;
        inner.listed.get(parent_prefix(key)).is_some_and(fresh)
            && !inner.heads.get(key).is_some_and(|(at, head)| fresh(at) && head.is_some())
            && !inner.dirs.get(key).is_some_and(|(at, dir)| fresh(at) && *dir)
    }

    /// Every key directly under `prefix` (a directory's, ending with `/`, or empty) is in the
    /// entries set since `since`: a listing asked for at `since` was read to its end, or this
    /// mount made the directory, empty, after `since`.
    pub(crate) fn set_listed(&self, prefix: &str, since: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let mut inner = self.inner();
        if ENTRIES_MAX <= inner.listed.len() {
            let ttl = self.ttl;
            inner.listed.retain(|_, at| at.elapsed() < ttl);
        }
        inner.listed.insert(prefix.to_owned(), since);
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
    /// (and so the listing of its directory) and records every directory above it as existing.
    pub(crate) fn written(&self, key: &str) {
        self.inner().listed.remove(parent_prefix(key));
        self.made(key, None);
    }

    /// This process made `key`: records `head` for it (its size and the time it was made;
    /// `None`: the server's to say, and the caller forgot its directory's listing) and every
    /// directory above it as existing.
    pub(crate) fn made(&self, key: &str, head: Head) {
        let mut inner = self.inner();
        inner.heads.remove(key);
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        if head.is_some() {
            inner.heads.insert(key.to_owned(), (now, head));
        }
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
        // The directories above may be gone: the listings that hold them are unknown now.
        let own = (!key.ends_with('/')).then(|| parent_prefix(key));
        inner
            .listed
            .retain(|prefix, _| !key.starts_with(prefix.as_str()) || Some(prefix.as_str()) == own);
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

    /// Another client may have changed `key`: forgets its head (the next look at its size and
    /// time asks the server; names keep their listing).
    pub(crate) fn forget(&self, key: &str) {
        self.inner().heads.remove(key);
    }

    /// Forgets everything under `prefix` (a directory renamed away or into).
    pub(crate) fn forget_under(&self, prefix: &str) {
        let mut inner = self.inner();
        inner.heads.retain(|key, _| !key.starts_with(prefix));
        let dir = prefix.trim_end_matches('/');
        inner.dirs.retain(|key, _| !key.starts_with(prefix) && key.as_str() != dir);
        inner.listed.clear();
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

    #[test]
    fn a_whole_listing_answers_for_missing_names_until_a_change_makes_it_unknown() {
        let cache = MetaCache::new(Duration::from_secs(60));
        assert!(!cache.absent("p/d/new"), "nothing listed yet");
        cache.set_listed("p/d/", Instant::now());
        cache.set_head("p/d/old", Some((5, None)));
        assert!(cache.absent("p/d/new"));
        assert!(!cache.absent("p/d/old"), "listed as an object");
        assert!(!cache.absent("p/e/new"), "another directory's name");
        // A create's and a small file's PutObject keep the listing whole.
        cache.made("p/d/new", Some((0, None)));
        assert!(!cache.absent("p/d/new"));
        assert!(cache.absent("p/d/other"));
        // A delete records the name missing and keeps its own directory's listing.
        cache.deleted("p/d/old");
        assert!(cache.absent("p/d/old"));
        // A commit whose size is the server's to say makes the listing unknown.
        cache.written("p/d/big");
        assert!(!cache.absent("p/d/other"));
        // The root's listing, and one dropped by a delete under it (its directories may go).
        cache.set_listed("", Instant::now());
        cache.set_listed("p/d/", Instant::now());
        assert!(cache.absent("q"));
        cache.deleted("p/d/new");
        assert!(!cache.absent("q"), "the root's listing survived a delete below it");
        assert!(cache.absent("p/d/x"));
        cache.set_listed("p/", Instant::now());
        cache.forget_under("p/d/");
        assert!(!cache.absent("p/x"), "a listing survived a directory rename");
        let off = MetaCache::new(Duration::ZERO);
        off.set_listed("p/", Instant::now());
        assert!(!off.absent("p/x"));
    }
}
