//! The owed commits of files whose close or backend sync failed on a `flush_on_close`
//! backend, driven by the rule in [`crate::recommit`]: who owes one, when an owed file is
//! looked at (its completions, its truncation, the timer) and the driver's answers.

use crate::event::{Action, IoError};
use crate::ids::{BackendId, InodeId};
use crate::recommit::{Decision, FileState};

use super::{Engine, PageMaps};

impl Engine {
    /// A close of `inode` was answered with an error: on a `flush_on_close` backend no close
    /// is left to commit what the retries write back, so the engine owes it a commit.
    pub(super) fn owe_commit(&mut self, inode: InodeId) {
        if self.flushes_on_close(inode) {
            self.recommits.owe(inode, self.now);
        }
    }

    fn flushes_on_close(&self, inode: InodeId) -> bool {
        self.inodes
            .get(&inode)
            .is_some_and(|meta| self.cfg.backends[meta.backend.index()].flush_on_close)
    }

    /// Whether `inode` is owed a commit (it is not forgotten meanwhile).
    pub(super) fn owes_commit(&self, inode: InodeId) -> bool {
        self.recommits.owes(inode)
    }

    /// How many files of `b` are owed a commit.
    pub(super) fn commits_owed(&self, b: BackendId) -> u64 {
        let of_b = |i: &InodeId| self.inodes.get(i).is_some_and(|meta| meta.backend == b);
        self.recommits.files().filter(of_b).count() as u64
    }

    /// An owed file as the rule sees it: clean when nothing of it is dirty (held included),
    /// under writeback or unstable and no write or COMMIT of it is in flight; synced when no
    /// stable write of it waits for a sync (`durable.rs`).
    fn owed_state<M: PageMaps>(&self, inode: InodeId, maps: &mut M) -> FileState {
        let Some(meta) = self.inodes.get(&inode) else {
            return FileState { clean: true, synced: true };
        };
        let c = maps.with(inode, |m| m.counts());
        let clean = c.dirty + c.writeback + c.unstable == 0
            && meta.inflight.is_empty()
            && meta.commits_inflight.is_empty();
        FileState { clean, synced: meta.durability.is_empty() }
    }

    fn recommit_act(&mut self, inode: InodeId, decision: Decision) {
        if decision == Decision::Commit {
            let backend = self.inodes[&inode].backend;
            self.stats.owed_commits += 1;
            self.emit(Action::SyncFile { backend, inode });
        }
    }

    /// Looks at an owed file (a completion of it, the timer): commits it if it is due.
    fn recommit_look<M: PageMaps>(&mut self, inode: InodeId, maps: &mut M) {
        if !self.recommits.owes(inode) {
            return;
        }
        let state = self.owed_state(inode, maps);
        let decision = self.recommits.look(inode, state, self.now);
        self.recommit_act(inode, decision);
    }

    /// An event touched `inode` (a completion, a close, a truncation; `emptied`: cut to
    /// nothing): an owed file that is now written back is committed; one cut to nothing with
    /// no handle open (deleted, dropped from the cache) owes nothing any more.
    pub(super) fn recommit_touched<M: PageMaps>(
        &mut self,
        inode: InodeId,
        emptied: bool,
        maps: &mut M,
    ) {
        if !self.recommits.owes(inode) {
            return;
        }
        if emptied && self.inodes.get(&inode).is_none_or(|meta| meta.handles == 0) {
            self.recommits.forget(inode);
            return;
        }
        self.recommit_look(inode, maps);
    }

    /// The driver synced `inode`'s backend file ([`crate::Event::FileSynced`], after
    /// `file_synced`) or failed to ([`crate::Event::FileSyncFailed`]).
    pub(super) fn file_sync_done<M: PageMaps>(
        &mut self,
        inode: InodeId,
        result: Result<(), IoError>,
        maps: &mut M,
    ) {
        match result {
            Ok(()) => {
                if !self.recommits.owes(inode) {
                    return;
                }
                let state = self.owed_state(inode, maps);
                let decision = self.recommits.synced(inode, state, self.now);
                self.recommit_act(inode, decision);
                if decision == Decision::Clear {
                    self.maybe_forget(inode, false, maps);
                }
            }
            Err(_) if self.flushes_on_close(inode) => {
                self.stats.file_sync_failures += 1;
                self.recommits.failed(inode, self.now);
            }
            Err(_) => {}
        }
    }

    /// The timer: looks at the owed files whose time has come.
    pub(super) fn recommit_timer<M: PageMaps>(&mut self, maps: &mut M) {
        let due = self.recommits.due(self.now);
        self.stats.files_visited += due.len() as u64;
        for inode in due {
            self.recommit_look(inode, maps);
        }
    }
}
