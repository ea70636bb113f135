//! Open files, anchors and the cache keys of regular files: everything the filesystem keeps
//! about file data, apart from the namespace (so the [`crate::Mount`] that controls it is not
//! generic over the namespace).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use fuser::{Errno, FileHandle};
use parking_lot::Mutex;

use crate::data::{DataFile, DataPath, FileReport, Opener};
use crate::times::FileTimes;

/// A regular file's identity: its namespace `ino` and `generation`.
pub(crate) type FileId = (u64, u64);

/// A cached file kept across opens.
struct Anchor {
    key: u64,
    file: Arc<Box<dyn DataFile>>,
    open_handles: usize,
    /// The last name was removed: drop the anchor at the last close.
    unlinked: bool,
    /// Removes the hidden name the file was given instead of removing its last name while it
    /// was open (see [`Files::hide`]); run at the last close.
    remove_hidden: Option<RemoveHidden>,
    /// Keeps the file's times alive while it is anchored.
    _times: Arc<FileTimes>,
}

/// Removes a hidden name (see [`Files::hide`]).
pub(crate) type RemoveHidden = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// An open file.
pub(crate) struct Handle {
    pub(crate) file: Box<dyn DataFile>,
    pub(crate) id: FileId,
    pub(crate) times: Arc<FileTimes>,
    /// A write by a user other than root went through this handle and cleared the file's
    /// setuid and setgid bits ([`super::Inner::kill_suid_on_write`]): later writes skip it.
    pub(crate) suid_checked: std::sync::atomic::AtomicBool,
}

/// The file state of a mount.
pub(crate) struct Files {
    pub(crate) data: Arc<dyn DataPath>,
    /// Whether ebb keeps files' times (its cache writes back later than the writes).
    keep_times: bool,
    stopping: AtomicBool,
    anchors: Mutex<HashMap<FileId, Anchor>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
    next_key: AtomicU64,
    /// Keys of files whose anchor was dropped while they still had a name.
    idle_keys: Mutex<HashMap<FileId, u64>>,
    /// The times ebb keeps for files written through the mount, while anything holds them.
    times: Mutex<HashMap<FileId, Weak<FileTimes>>>,
    anchor_limit: usize,
    /// The mount's requests and hand-offs (shown by `ebb stat` under `fuse`).
    pub(crate) counts: super::counts::RequestCounts,
}

/// Whether the backend's file, with `size` and `mtime`, changed underneath since ebb last
/// looked, and whether the cache of `file` holds nothing the backend lacks. Changed: its mtime
/// is not the one ebb last left there ([`FileTimes::baseline_mtime`]), a write-back found it
/// moved ([`FileTimes::changed_underneath`]), or, with nothing to write, its size is not the
/// cache's (the backend may hold the last page whole until the trim at fsync). A write-back of
/// ebb's own in flight may look like a change (its mtime is put back after the write): the
/// cost is clean pages read again, never data lost.
fn moved(
    file: &dyn DataFile,
    times: &FileTimes,
    size: u64,
    mtime: SystemTime,
) -> io::Result<(bool, bool)> {
    let len = file.len()?;
    let clean = file.is_clean();
    let resized = size < len || size > len.next_multiple_of(4096);
    let changed = times.baseline_mtime().is_some_and(|left| mtime != left)
        || times.changed_underneath()
        || (clean && resized);
    Ok((changed, clean))
}

/// Closes an anchor's handle (if a request still uses it, the handle is dropped when that
/// request ends instead).
fn close_anchor(anchor: Anchor) -> io::Result<()> {
    match Arc::into_inner(anchor.file) {
        Some(file) => file.close(),
        None => Ok(()),
    }
}

/// Runs a hidden name's removal, if any; a failure is said (the name stays behind, as a
/// `.nfs` file of the kernel's client does when its removal fails).
fn remove_hidden(remove: Option<RemoveHidden>) {
    if let Some(remove) = remove
        && let Err(error) = remove()
    {
        eprintln!("ebb mount: removing the hidden name of a removed file: {error}");
    }
}

impl Files {
    pub(crate) fn new(data: Arc<dyn DataPath>, keep_times: bool, anchor_limit: usize) -> Files {
        Files {
            data,
            keep_times,
            stopping: AtomicBool::new(false),
            anchors: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            next_key: AtomicU64::new(1),
            idle_keys: Mutex::new(HashMap::new()),
            times: Mutex::new(HashMap::new()),
            anchor_limit,
            counts: super::counts::RequestCounts::default(),
        }
    }

    /// Every later operation that would change data or names fails with `EROFS`.
    pub(crate) fn stop_writes(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub(crate) fn check_writable(&self) -> Result<(), Errno> {
        if self.stopping.load(Ordering::SeqCst) { Err(Errno::EROFS) } else { Ok(()) }
    }

    /// A fresh handle number (files and directories share the space).
    pub(crate) fn next_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// Closes every anchor (after the kernel released every file, at unmount). Their errors
    /// were the application handles' to report; see [`crate::Mount::unmount`].
    pub(crate) fn close_anchors(&self) {
        let anchors: Vec<Anchor> = self.anchors.lock().drain().map(|(_, anchor)| anchor).collect();
        for mut anchor in anchors {
            let hidden = anchor.remove_hidden.take();
            let _ = close_anchor(anchor);
            remove_hidden(hidden);
        }
    }

    /// Whether a handle of the regular file `id` is open through the mount.
    pub(crate) fn is_open(&self, id: FileId) -> bool {
        self.anchors.lock().get(&id).is_some_and(|anchor| anchor.open_handles > 0)
    }

    /// The open file `id` lost its last name, which was renamed to a hidden one instead of
    /// removed (the namespace destroys a removed file at once, see
    /// `Namespace::removal_destroys_open_files`): `remove` removes the hidden name at the
    /// last close, after which the file's cached data is dropped. If the file was closed
    /// meanwhile, the hidden name is removed now.
    pub(crate) fn hide(&self, id: FileId, remove: RemoveHidden) {
        let late = {
            let mut anchors = self.anchors.lock();
            match anchors.get_mut(&id) {
                Some(anchor) if anchor.open_handles > 0 => {
                    anchor.unlinked = true;
                    anchor.remove_hidden = Some(remove);
                    None
                }
                _ => Some(remove),
            }
        };
        if late.is_some() {
            remove_hidden(late);
            self.after_remove(id);
        }
    }

    /// The live stats (the data path's JSON) with a `files` list: of the cached files that
    /// have a handle open here, pages not written, a write error or a commit owed, the
    /// `listed` ones with the most dirty pages (then errors), each with its errors, pages,
    /// whether a commit is owed, and the throttle pauses of its open handles (the largest
    /// percentiles, the summed counts); and `files_not_listed`: how many others there are,
    /// their dirty and held pages and commits owed. The cost is one look per
    /// attached file (at most the anchor limit plus the open handles) and a selection, never
    /// one per file the mount has seen.
    pub(crate) fn stats_json(&self, listed: usize) -> String {
        let stats = self.data.stats_json();
        let Ok(serde_json::Value::Object(mut stats)) = serde_json::from_str(&stats) else {
            return stats;
        };
        type Attached = (FileId, bool, Arc<Box<dyn DataFile>>);
        let anchors: Vec<Attached> = self
            .anchors
            .lock()
            .iter()
            .map(|(&id, anchor)| (id, anchor.open_handles > 0, Arc::clone(&anchor.file)))
            .collect();
        let mut files: HashMap<FileId, (bool, FileReport)> = HashMap::with_capacity(anchors.len());
        let handles: Vec<&dyn DataFile> = anchors.iter().map(|(_, _, file)| &***file).collect();
        let reports = crate::data::reports(&handles);
        for ((id, open, _), report) in anchors.iter().zip(reports) {
            if let Some(report) = report
                && (*open || report.dirty_pages > 0 || report.errors > 0 || report.commit_owed)
            {
                files.insert(*id, (*open, report));
            }
        }
        let handles: Vec<Arc<Handle>> = self.handles.lock().values().cloned().collect();
        for handle in handles {
            let Some((_, file)) = files.get_mut(&handle.id) else { continue };
            let Some(mine) = handle.file.report() else { continue };
            file.pauses += mine.pauses;
            file.stalled_us += mine.stalled_us;
            file.pause_us_p50 = file.pause_us_p50.max(mine.pause_us_p50);
            file.pause_us_p99 = file.pause_us_p99.max(mine.pause_us_p99);
            file.pause_us_max = file.pause_us_max.max(mine.pause_us_max);
        }
        let mut files: Vec<(FileId, bool, FileReport)> =
            files.into_iter().map(|(id, (open, report))| (id, open, report)).collect();
        let order = |a: &(FileId, bool, FileReport), b: &(FileId, bool, FileReport)| {
            (b.2.dirty_pages, b.2.errors, a.0).cmp(&(a.2.dirty_pages, a.2.errors, b.0))
        };
        let rest = if files.len() > listed {
            files.select_nth_unstable_by(listed, order);
            files.split_off(listed)
        } else {
            Vec::new()
        };
        files.sort_unstable_by(order);
        let list: Vec<serde_json::Value> =
            files.iter().map(|(id, _, file)| file.to_json(id.0)).collect();
        stats.insert("files".to_owned(), serde_json::Value::Array(list));
        stats.insert("fuse".to_owned(), self.counts.to_json());
        stats.insert(
            "files_not_listed".to_owned(),
            serde_json::json!({
                "files": rest.len(),
                "open": rest.iter().filter(|(_, open, _)| *open).count(),
                "with_errors": rest.iter().filter(|(_, _, file)| file.errors > 0).count(),
                "dirty_pages": rest.iter().map(|(_, _, file)| file.dirty_pages).sum::<u64>(),
                "held_pages": rest.iter().map(|(_, _, file)| file.held_pages).sum::<u64>(),
                "commits_owed": rest.iter().filter(|(_, _, file)| file.commit_owed).count(),
            }),
        );
        serde_json::to_string_pretty(&stats).unwrap_or_default()
    }

    /// The size ebb knows for the file `id`, if it caches it (`open` opens its data path if
    /// only its key is kept); `None` if ebb does not cache it.
    pub(crate) fn cached_size(&self, id: FileId, open: Opener<'_>) -> Option<io::Result<u64>> {
        let anchor = self.anchors.lock().get(&id).map(|anchor| Arc::clone(&anchor.file));
        match anchor {
            Some(file) => Some(file.len()),
            None => self.with_idle(id, open, |file| file.len()),
        }
    }

    /// Runs `work` on a handle attached for the call if the file has no anchor but the
    /// runtime may still cache it (its key is idle); `None` if it has no idle key.
    fn with_idle<T>(
        &self,
        id: FileId,
        open: Opener<'_>,
        work: impl FnOnce(&dyn DataFile) -> io::Result<T>,
    ) -> Option<io::Result<T>> {
        let key = self.idle_keys.lock().get(&id).copied()?;
        Some(self.data.attach(key, open).and_then(|file| {
            let result = work(file.as_ref());
            result.and_then(|value| file.close().map(|()| value))
        }))
    }

    /// Drops what ebb caches of the file `id` if the backend's file changed underneath
    /// ([`moved`]), nothing here has it open and the cache holds nothing the backend lacks:
    /// the next open reads the backend's new data (close-to-open consistency, as NFS clients
    /// keep). Returns whether it dropped the cache: closing it may have changed the backend's
    /// file (an S3 object gets its trimmed size at that close), so attributes read before are
    /// out of date. Otherwise an open goes on with [`Files::revalidate`].
    pub(crate) fn drop_if_changed(
        &self,
        id: FileId,
        times: &FileTimes,
        size: u64,
        mtime: SystemTime,
        open: Opener<'_>,
    ) -> bool {
        if times.baseline_mtime().is_none() {
            times.saw(mtime);
            return false;
        }
        let anchor = match self.anchors.lock().get(&id) {
            Some(anchor) if anchor.open_handles > 0 => return false,
            Some(anchor) => Some(Arc::clone(&anchor.file)),
            None => None,
        };
        let changed = |file: &dyn DataFile| moved(file, times, size, mtime);
        let verdict = match anchor {
            Some(file) => changed(file.as_ref().as_ref()),
            None => self.with_idle(id, open, changed).unwrap_or(Ok((false, true))),
        };
        if let Ok((true, true)) = verdict
            && self.forget_cached(id)
        {
            times.saw(mtime);
            return true;
        }
        false
    }

    /// At an open through the handle `fh` of a file whose cache [`Files::drop_if_changed`]
    /// kept (another handle has it open, or it has data the backend lacks): if the backend's
    /// file changed underneath ([`moved`]), the cache drops its copies of the backend's
    /// bytes and keeps its own data ([`DataFile::backend_changed`]), so this open reads what
    /// someone else wrote (close-to-open, whether or not the kernel's release of an earlier
    /// handle has arrived yet). A file with nothing the backend lacks takes the backend's
    /// times; one with data not written yet keeps ebb's (ebb's writes win).
    pub(crate) fn revalidate(
        &self,
        fh: u64,
        times: &FileTimes,
        size: u64,
        mtime: SystemTime,
    ) -> io::Result<()> {
        let Some(handle) = self.handles.lock().get(&fh).cloned() else { return Ok(()) };
        let (changed, clean) = moved(handle.file.as_ref(), times, size, mtime)?;
        if !changed {
            return Ok(());
        }
        handle.file.backend_changed()?;
        if clean {
            times.saw(mtime);
        } else {
            times.change_seen(mtime);
        }
        Ok(())
    }

    /// Forgets the cache of the file `id`, which nothing has open here; false (nothing done)
    /// if it was opened meanwhile.
    fn forget_cached(&self, id: FileId) -> bool {
        let anchor = {
            let mut anchors = self.anchors.lock();
            if anchors.get(&id).is_some_and(|anchor| anchor.open_handles > 0) {
                // Opened since the caller looked: the open's revalidation takes it from here.
                return false;
            }
            anchors.remove(&id)
        };
        let idle = self.idle_keys.lock().remove(&id);
        if let Some(anchor) = anchor {
            let key = anchor.key;
            let _ = close_anchor(anchor);
            self.data.discard(key);
        }
        if let Some(key) = idle {
            self.data.discard(key);
        }
        true
    }

    /// The file `id` was deleted by someone else (it has no name left): unless it is open
    /// here, ebb forgets its cache, closing its descriptors, and returns `true`.
    pub(crate) fn release_deleted(&self, id: FileId) -> bool {
        if self.anchors.lock().get(&id).is_some_and(|anchor| anchor.open_handles > 0) {
            return false;
        }
        self.forget_cached(id)
    }

    /// The file `id` lost its last name: its anchor goes now, or at its last close.
    pub(crate) fn after_remove(&self, id: FileId) {
        let idle = self.idle_keys.lock().remove(&id);
        let closing = {
            let mut anchors = self.anchors.lock();
            match anchors.get_mut(&id) {
                Some(anchor) if anchor.open_handles == 0 => anchors.remove(&id),
                Some(anchor) => {
                    anchor.unlinked = true;
                    None
                }
                None => None,
            }
        };
        if let Some(anchor) = closing {
            // The file has no name and no opener: its data can no longer be read by anyone.
            let key = anchor.key;
            let _ = close_anchor(anchor);
            self.data.discard(key);
        } else if let Some(key) = idle {
            // Closed past the anchor limit, only its key was kept: drop its cached data too.
            self.data.discard(key);
        }
    }

    /// Opens a handle on the regular file `id` (creating its anchor on the first open);
    /// `open` opens its data path when the cache does not hold the file.
    pub(crate) fn open_handle(
        &self,
        id: FileId,
        times: Arc<FileTimes>,
        open: Opener<'_>,
    ) -> io::Result<u64> {
        let key = {
            let mut anchors = self.anchors.lock();
            if let Some(anchor) = anchors.get_mut(&id) {
                anchor.open_handles += 1;
                anchor.key
            } else {
                let idle = self.idle_keys.lock().remove(&id);
                let key = idle.unwrap_or_else(|| self.next_key.fetch_add(1, Ordering::Relaxed));
                let file = match self.data.attach(key, open) {
                    Ok(file) => file,
                    Err(error) => {
                        if let Some(key) = idle {
                            self.idle_keys.lock().insert(id, key);
                        }
                        return Err(error);
                    }
                };
                let file = Arc::new(file);
                let _times = Arc::clone(&times);
                let anchor = Anchor {
                    key,
                    file,
                    open_handles: 1,
                    unlinked: false,
                    remove_hidden: None,
                    _times,
                };
                anchors.insert(id, anchor);
                key
            }
        };
        match self.data.attach(key, open) {
            Ok(file) => {
                let fh = self.next_handle();
                self.handles
                    .lock()
                    .insert(fh, Arc::new(Handle { file, id, times, suid_checked: false.into() }));
                Ok(fh)
            }
            Err(error) => {
                self.release_anchor(id);
                Err(error)
            }
        }
    }

    pub(crate) fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// Closes the handle `fh`; errors not yet reported to it come back here.
    pub(crate) fn release(&self, fh: FileHandle) -> io::Result<()> {
        let Some(handle) = self.handles.lock().remove(&fh.0) else { return Ok(()) };
        let id = handle.id;
        let result = match Arc::into_inner(handle) {
            Some(handle) => handle.file.close(),
            None => Ok(()),
        };
        self.release_anchor(id);
        result
    }

    /// One handle of the file closed: drop the anchor if the file has no name any more, or if
    /// there are too many anchors (then its key stays known, see the module doc).
    fn release_anchor(&self, id: FileId) {
        let closing = {
            let mut anchors = self.anchors.lock();
            let too_many = anchors.len() > self.anchor_limit;
            match anchors.get_mut(&id) {
                Some(anchor) => {
                    anchor.open_handles = anchor.open_handles.saturating_sub(1);
                    if anchor.open_handles == 0 && (anchor.unlinked || too_many) {
                        // Its key is kept before the lock goes: an open in between would
                        // otherwise find neither and cache the file a second time.
                        if !anchor.unlinked {
                            self.idle_keys.lock().insert(id, anchor.key);
                        }
                        anchors.remove(&id)
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        #[cfg(test)]
        tests::after_anchor_removed();
        if let Some(mut anchor) = closing {
            let (key, unlinked) = (anchor.key, anchor.unlinked);
            let hidden = anchor.remove_hidden.take();
            if let Err(error) = close_anchor(anchor) {
                eprintln!("ebb mount: closing a file: {error}");
            }
            remove_hidden(hidden);
            if unlinked {
                // The last close of a file without a name: nobody can read its data again.
                self.data.discard(key);
            }
        }
    }

    /// Sets the size of the regular file `id` through the cache when ebb caches it (through
    /// the handle `fh` if given); `Ok(false)` when it does not, and the caller sets the size
    /// in the namespace.
    pub(crate) fn truncate(
        &self,
        id: FileId,
        fh: Option<FileHandle>,
        size: u64,
        open: Opener<'_>,
    ) -> io::Result<bool> {
        let handle = fh.and_then(|fh| self.handles.lock().get(&fh.0).cloned());
        let anchor = || self.anchors.lock().get(&id).map(|anchor| Arc::clone(&anchor.file));
        // The times first, so the trim's write-back puts the new mtime on the backend (and the
        // next look at it finds what ebb left, not a change underneath).
        self.written(id);
        if let Some(handle) = handle {
            handle.file.set_len(size)?;
        } else if let Some(file) = anchor() {
            file.set_len(size)?;
        } else if let Some(result) = self.with_idle(id, open, |file| file.set_len(size)) {
            result?;
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    /// The times ebb keeps for the file `id`, created if nothing holds them yet.
    pub(crate) fn file_times(&self, id: FileId) -> Arc<FileTimes> {
        if !self.keep_times {
            return Arc::new(FileTimes::default());
        }
        let mut map = self.times.lock();
        if let Some(times) = map.get(&id).and_then(Weak::upgrade) {
            return times;
        }
        // Forget files that left the cache when the map doubles.
        if map.len() >= 1024 && map.len().is_power_of_two() {
            map.retain(|_, times| times.strong_count() > 0);
        }
        let times = Arc::new(FileTimes::default());
        map.insert(id, Arc::downgrade(&times));
        times
    }

    /// The times ebb keeps for the file `id`, if anything holds them.
    pub(crate) fn kept_times(&self, id: FileId) -> Option<Arc<FileTimes>> {
        self.times.lock().get(&id).and_then(Weak::upgrade)
    }

    /// The data of the file `id` changed through the mount just now.
    pub(crate) fn written(&self, id: FileId) {
        if let Some(times) = self.kept_times(id) {
            times.written();
        }
    }

    /// The status of the file `id` changed through the mount (see [`crate::times`]).
    pub(crate) fn status_changed(&self, id: FileId) {
        if let Some(times) = self.kept_times(id) {
            times.status_changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::PassthroughData;
    use ebb_backend::{Backend, MemBackend, OpenOptions};
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// Set by the test below: a closing thread pauses after dropping an anchor from the map,
    /// where the lock no longer covers it, so that an opener can come in between.
    static PAUSE_AFTER_ANCHOR_REMOVED: AtomicBool = AtomicBool::new(false);

    pub(super) fn after_anchor_removed() {
        if PAUSE_AFTER_ANCHOR_REMOVED.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Passthrough data that records the keys files are attached with.
    #[derive(Default)]
    struct Recorded {
        keys: Mutex<Vec<u64>>,
    }

    impl DataPath for Recorded {
        fn attach(&self, key: u64, open: Opener<'_>) -> io::Result<Box<dyn DataFile>> {
            self.keys.lock().push(key);
            PassthroughData.attach(key, open)
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
        fn drain(&self, _: Duration, _: &mut dyn FnMut(&str, bool)) -> io::Result<()> {
            Ok(())
        }
        fn unwritten(&self) -> String {
            String::new()
        }
        fn stats_json(&self) -> String {
            String::new()
        }
    }

    /// A file closed past the anchor limit keeps its cache key, also while another opener
    /// races the close: were the anchor gone before the key was kept, the opener would attach
    /// the file under a new key, a second cache of the same file (whose size, read from the
    /// backend without the first one's unwritten data, a later trim would write back).
    #[test]
    fn a_file_keeps_its_cache_key_while_closes_race_opens() {
        let recorded = Arc::new(Recorded::default());
        let files = Arc::new(Files::new(recorded.clone(), false, 0));
        let backend = MemBackend::new();
        let file = backend.open("f", OpenOptions { create: true, truncate: false }).unwrap();
        let id = (7, 1);
        PAUSE_AFTER_ANCHOR_REMOVED.store(true, Ordering::Relaxed);
        let cycle = |files: &Files| {
            let open = || Ok(Arc::clone(&file));
            for _ in 0..2_000 {
                let fh = files.open_handle(id, Arc::new(FileTimes::default()), &open).unwrap();
                files.release(FileHandle(fh)).unwrap();
            }
        };
        std::thread::scope(|scope| {
            scope.spawn(|| cycle(&files));
            cycle(&files);
        });
        let keys = recorded.keys.lock();
        let first = keys[0];
        let other = keys.iter().filter(|&&key| key != first).count();
        assert_eq!(other, 0, "{other} of {} attaches under another key", keys.len());
    }
}
