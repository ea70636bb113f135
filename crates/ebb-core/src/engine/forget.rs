//! Files entering the engine (at their first open) and leaving it: a file no handle, page,
//! IO, retry or unreported error keeps is forgotten (the kernel's inode eviction); and the
//! index of the files' retry deadlines.
//!
//! # The files' state against the memory budget
//!
//! Every file the engine knows costs its driver memory beside its cached pages: the engine's
//! own record of it, its page map, the driver's tables (`Config::file_state_bytes` per file,
//! measured by the driver; 0 in the simulator, whose files cost nothing real). The kernel
//! counts its inode and dentry slab against the same memory as the page cache, so that
//! reclaim makes room for them; so does the engine. Control law, per file opened or forgotten:
//!
//! ```text
//! charged_pages = min(ceil(files_known * file_state_bytes / PAGE_SIZE), memory_pages / 2)
//! ```
//!
//! The charge takes free pages; when there are none it is overcommitted and kswapd (woken at
//! once) reclaims clean pages until the zones are back above their watermarks, and the dirty
//! thresholds, which derive from free and cached pages, fall with it. So many small files
//! leave less room for cached data and the process stays within its budget. The cap, half of
//! memory (ebb's own choice, no kernel counterpart: the kernel fails allocations instead), is
//! for files held open, which nothing can forget: beyond it the process exceeds its budget
//! rather than leave the cache too little room to make progress. There are no samples to lack:
//! the charge follows the count of files exactly.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{Engine, InodeMeta, PageMaps};
use crate::config::PAGE_SIZE;
use crate::event::Action;
use crate::ids::{BackendId, GroupId, HandleId, InodeId};
use crate::time::{Duration, Instant};

/// The largest share of memory the files' state is charged: `1 / FILE_STATE_SHARE_MAX` of it
/// (module doc).
const FILE_STATE_SHARE_MAX: u64 = 2;

impl Engine {
    /// A handle opens `inode` on `backend`: the file is known from its first open on, and its
    /// state is charged against memory (module doc).
    pub(super) fn open<M: PageMaps>(
        &mut self,
        handle: HandleId,
        inode: InodeId,
        backend: BackendId,
        maps: &mut M,
    ) {
        assert!(backend.index() < self.wbs.len(), "open on unknown backend {backend}");
        if !self.inodes.contains_key(&inode) {
            self.files_opened += 1;
        }
        let meta = self.inodes.entry(inode).or_insert_with(|| InodeMeta {
            backend,
            group: GroupId(0),
            last_dirtied: Instant::ZERO,
            syncing: None,
            writeback_index: 0,
            inflight: BTreeSet::new(),
            commits_inflight: BTreeSet::new(),
            commit_marks: VecDeque::new(),
            commit_now: false,
            commit_deferred: false,
            handles: 0,
            err_seq: 0,
            err: None,
            err_unseen: false,
            retry_at: None,
            hold_retry_at: None,
            retry_backoff: Duration::ZERO,
            retry_held: false,
            durability: Default::default(),
            page_waiters: Vec::new(),
            last_read_end: u64::MAX,
            readahead: 0,
            reading: BTreeMap::new(),
            invalidating: Vec::new(),
            unstable: 0,
        });
        meta.handles += 1;
        // Errors nobody has seen yet are reported to the next opener too (errseq).
        let seen = if meta.err_unseen { meta.err_seq.saturating_sub(1) } else { meta.err_seq };
        self.handles.insert(handle, (inode, seen));
        self.charge_files(maps);
    }

    /// Forgets `inode` if nothing of it is left (the kernel evicting an unused inode): no open
    /// handle, no page cached, no IO in flight, no retry due, no unreported error, no write
    /// waiting for a sync of the file (unless it was just `emptied`, truncated to nothing with
    /// no handle open: deleted, or dropped from the cache, whose earlier writes no handle can
    /// ask about any more), not in the granule gate, not owed a commit (`recommit.rs`). The
    /// driver hears it as [`Action::Forget`] and drops its own state of the file; opening the
    /// file again starts afresh. So what the engine keeps per file is bounded by the files open
    /// or cached, not by the files ever seen.
    pub(super) fn maybe_forget<M: PageMaps>(
        &mut self,
        inode: InodeId,
        emptied: bool,
        maps: &mut M,
    ) {
        let Some(meta) = self.inodes.get(&inode) else { return };
        let b = meta.backend;
        let unused = meta.handles == 0
            && meta.inflight.is_empty()
            && meta.commits_inflight.is_empty()
            && meta.commit_marks.is_empty()
            && meta.reading.is_empty()
            && meta.invalidating.is_empty()
            && meta.syncing.is_none()
            && meta.page_waiters.is_empty()
            && !meta.err_unseen
            && meta.retry_at.is_none()
            && meta.hold_retry_at.is_none()
            && (emptied || meta.durability.is_empty())
            && meta.unstable == 0
            && self.gate.filling(inode).is_none()
            && !self.owes_commit(inode);
        if !unused || maps.with(inode, |m| m.counts().resident) > 0 {
            return;
        }
        self.inodes.remove(&inode);
        self.wbs[b.index()].flusher.forget(inode);
        self.wbs[b.index()].unstable_files.remove(&inode);
        self.stats.files_forgotten += 1;
        self.emit(Action::Forget { inode });
        self.charge_files(maps);
    }

    /// The most files whose state fits in the share of memory it may be charged (module doc),
    /// for a driver that keeps closed files known (attached, or on a list of closed files) to
    /// bound them by; `u64::MAX` when files cost nothing (`file_state_bytes` 0).
    pub fn files_kept_max(&self) -> u64 {
        match self.cfg.file_state_bytes {
            0 => u64::MAX,
            bytes => self.mem.total() / FILE_STATE_SHARE_MAX * PAGE_SIZE / bytes,
        }
    }

    /// Brings the charge for the files' state in line with the files known (module doc): a
    /// larger charge wakes kswapd, a smaller one the writers waiting for memory.
    pub(super) fn charge_files<M: PageMaps>(&mut self, maps: &mut M) {
        let bytes = (self.inodes.len() as u64).saturating_mul(self.cfg.file_state_bytes);
        let pages = bytes.div_ceil(PAGE_SIZE).min(self.mem.total() / FILE_STATE_SHARE_MAX);
        let before = self.mem.files();
        if pages == before {
            return;
        }
        self.mem.charge_files(pages);
        if pages > before {
            self.kswapd(maps);
        } else {
            self.wake_memory_waiters(maps);
        }
    }

    /// Keeps `retry_timers` in step with the file's retry deadlines after a change from
    /// `before` (its `retry_at` and `hold_retry_at` then).
    pub(crate) fn reindex_retry(&mut self, inode: InodeId, before: [Option<Instant>; 2]) {
        let after = self.retry_deadlines(inode);
        if before == after {
            return;
        }
        for t in before.into_iter().flatten() {
            self.retry_timers.remove(&(t, inode));
        }
        for t in after.into_iter().flatten() {
            self.retry_timers.insert((t, inode));
        }
    }

    /// The file's retry deadlines, for [`Engine::reindex_retry`].
    pub(crate) fn retry_deadlines(&self, inode: InodeId) -> [Option<Instant>; 2] {
        self.inodes.get(&inode).map_or([None, None], |m| [m.retry_at, m.hold_retry_at])
    }
}
