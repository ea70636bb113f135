//! Forgetting files: a file no handle, page, IO, retry or unreported error keeps leaves the
//! engine (the kernel's inode eviction), and the index of the files' retry deadlines.

use super::{Engine, PageMaps};
use crate::event::Action;
use crate::ids::InodeId;
use crate::time::Instant;

impl Engine {
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
