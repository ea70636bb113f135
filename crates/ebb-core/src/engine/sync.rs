//! fsync, sync and close: the integrity writeback of a file or of everything, its phases
//! (write, wait, commit) and its answers, and close-to-open flushing.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Engine, FsyncPhase, FsyncState, InodeMeta, IoKind, PageMaps, RETRY_BACKOFF_MIN, SyncState,
};
use crate::event::{Action, IoClass, IoError, Issuer, errno};
use crate::flusher::Submitter;
use crate::ids::{BackendId, HandleId, InodeId, IoId, RequestId};
use crate::time::Duration;

impl InodeMeta {
    /// One of the file's handles closed: a close without an open is a bug (an `invariant!`);
    /// where invariants are not checked, the count stays at zero.
    pub(crate) fn handle_closed(&mut self) {
        invariant!(self.handles > 0, "a handle closed on a file with no handle open");
        self.handles = self.handles.saturating_sub(1);
    }
}

impl Engine {
    /// A handle closes: at once, with any error it has not seen, or, on a `flush_on_close`
    /// backend, after writing back and committing the file as fsync does (close-to-open).
    pub(super) fn close<M: PageMaps>(
        &mut self,
        handle: HandleId,
        request: RequestId,
        maps: &mut M,
    ) {
        let flush = self
            .handles
            .get(&handle)
            .and_then(|&(inode, _)| self.inodes.get(&inode))
            .is_some_and(|meta| self.cfg.backends[meta.backend.index()].flush_on_close);
        if flush {
            self.fsync_begin(handle, request, true, maps);
            return;
        }
        self.close_now(handle, request);
    }

    pub(super) fn close_now(&mut self, handle: HandleId, request: RequestId) {
        let result = self.check_handle_error(handle);
        if let Some((inode, _)) = self.handles.remove(&handle)
            && let Some(meta) = self.inodes.get_mut(&inode)
        {
            meta.handle_closed();
        }
        self.emit(Action::CloseDone { request, result });
    }

    pub(super) fn fsync_start<M: PageMaps>(
        &mut self,
        handle: HandleId,
        request: RequestId,
        maps: &mut M,
    ) {
        self.fsync_begin(handle, request, false, maps);
    }

    pub(super) fn fsync_begin<M: PageMaps>(
        &mut self,
        handle: HandleId,
        request: RequestId,
        closing: bool,
        maps: &mut M,
    ) {
        let Some(&(inode, _)) = self.handles.get(&handle) else {
            let result = Err(IoError { errno: errno::EBADF });
            self.emit(if closing {
                Action::CloseDone { request, result }
            } else {
                Action::FsyncDone { request, result }
            });
            return;
        };
        let state = FsyncState {
            handle,
            inode,
            phase: FsyncPhase::Writing,
            rewrite: false,
            outage: false,
            closing,
        };
        self.fsyncs.insert(request, state);
        let reported = self
            .inodes
            .get(&inode)
            .is_some_and(|meta| self.wbs[meta.backend.index()].outage_reported);
        let unwritten = |m: &mut crate::pagemap::PageMap| {
            let counts = m.counts();
            counts.dirty + counts.unstable + counts.writeback > 0
        };
        if reported && maps.with(inode, unwritten) {
            // The backend has been unreachable past its deadline: EIO at once (the retries
            // go on, and the first answer ends the outage), not after writes that a server
            // that never answers may hold until the client's own timeout.
            self.fsync_answer(request, maps);
            return;
        }
        self.fsync_write_phase(request, maps);
    }

    /// Answers an fsync (or a flushing close) with the first error its handle has not seen,
    /// or EIO whenever the file still has unwritten data on a backend past its retry timeout
    /// (the handle may have seen that error already: the data is still not durable).
    pub(crate) fn fsync_answer<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
        let state = self.fsyncs.remove(&request).expect("fsync");
        let mut result = self.check_handle_error(state.handle);
        let reported = self
            .inodes
            .get(&state.inode)
            .is_some_and(|meta| self.wbs[meta.backend.index()].outage_reported);
        if reported && result.is_ok() {
            let counts = maps.with(state.inode, |m| m.counts());
            if counts.dirty + counts.unstable + counts.writeback > 0 {
                result = Err(IoError { errno: errno::EIO });
            }
        }
        if state.closing {
            if result.is_err() {
                // No close is left to commit what the retries write back (`recommit.rs`).
                self.owe_commit(state.inode);
            }
            if let Some((inode, _)) = self.handles.remove(&state.handle)
                && let Some(meta) = self.inodes.get_mut(&inode)
            {
                meta.handle_closed();
            }
            self.emit(Action::CloseDone { request, result });
        } else {
            self.emit(Action::FsyncDone { request, result });
        }
    }

    pub(super) fn fsync_write_phase<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
        let inode = self.fsyncs[&request].inode;
        self.fsyncs.get_mut(&request).expect("fsync").outage = false;
        let tagged = maps.with(inode, |m| m.tag_dirty());
        if tagged > 0 {
            // One integrity writepages call (counted like the flusher's).
            self.stats.writepages_calls += 1;
            let b = self.inodes[&inode].backend;
            self.fsyncs.get_mut(&request).expect("fsync").phase = FsyncPhase::Writing;
            self.add_submitter(
                b,
                Issuer::Fsync(request),
                Submitter::new(inode, 0, u64::MAX, true, false, IoClass::Sync),
            );
        } else {
            self.fsync_wait_phase(request, maps);
        }
    }

    pub(crate) fn fsync_wait_phase<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
        let inode = self.fsyncs[&request].inode;
        match self.inodes[&inode].inflight.last().copied() {
            Some(last) => {
                self.fsyncs.get_mut(&request).expect("fsync").phase = FsyncPhase::Waiting(last)
            }
            None => self.fsync_commit_phase(request, maps),
        }
    }

    pub(super) fn fsync_commit_phase<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
        let inode = self.fsyncs[&request].inode;
        let counts = maps.with(inode, |m| m.counts());
        let rewrite = std::mem::take(&mut self.fsyncs.get_mut(&request).expect("fsync").rewrite);
        if counts.tagged > 0 || rewrite {
            // A commit redirtied pages (server restart): write them again.
            self.fsync_write_phase(request, maps);
            return;
        }
        if counts.unstable > 0 {
            // Commit what no COMMIT in flight covers, then wait for all of them.
            self.inode_mut(inode).commit_now = true;
            self.maybe_commit(inode, maps);
        }
        if let Some(&last) = self.inodes[&inode].commits_inflight.last() {
            self.fsyncs.get_mut(&request).expect("fsync").phase = FsyncPhase::Committing(last);
            return;
        }
        let meta = &self.inodes[&inode];
        let reported = self.wbs[meta.backend.index()].outage_reported;
        if self.fsyncs[&request].outage && !reported && counts.dirty > 0 {
            // The backend could not be reached: wait for the file's retry and write again,
            // rather than answer with data unwritten (write-error policy, module doc). If the
            // retry already fired while this fsync waited for its writes, no retry is left to
            // wake it: write again now (swarm seeds 2443, 3009, 4534, 8531 waited forever).
            if meta.retry_at.is_none() {
                self.fsync_write_phase(request, maps);
                return;
            }
            self.fsyncs.get_mut(&request).expect("fsync").phase = FsyncPhase::Retrying;
            return;
        }
        self.fsync_answer(request, maps);
    }

    pub(crate) fn fsync_progress<M: PageMaps>(&mut self, inode: InodeId, maps: &mut M) {
        let ready: Vec<RequestId> = self
            .fsyncs
            .iter()
            .filter(|(_, f)| f.inode == inode)
            .filter(|(_, f)| match f.phase {
                FsyncPhase::Writing => false,
                FsyncPhase::Waiting(last) => {
                    self.inodes[&inode].inflight.range(..=last).next().is_none()
                }
                FsyncPhase::Committing(last) => {
                    self.inodes[&inode].commits_inflight.range(..=last).next().is_none()
                }
                FsyncPhase::Retrying => false,
            })
            .map(|(&r, _)| r)
            .collect();
        for request in ready {
            self.fsync_commit_phase(request, maps);
        }
    }

    pub(super) fn sync_start<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
        self.syncs.insert(
            request,
            SyncState {
                backends_left: self.wbs.len() as u32,
                error: None,
                failed: BTreeMap::new(),
                rewrite: BTreeSet::new(),
                outage: BTreeSet::new(),
                retry_at: BTreeMap::new(),
            },
        );
        for b in 0..self.wbs.len() {
            self.queue_sync_work(BackendId(b as u32), request);
        }
        let _ = maps;
    }

    /// Called when a backend's part of a sync may have finished.
    pub(crate) fn sync_progress<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        let done: Vec<RequestId> = {
            let wb = &self.wbs[b.index()];
            wb.flusher
                .sync_waits()
                .filter(|&(_, last)| {
                    self.ios
                        .range(..=last)
                        .all(|(_, r)| r.backend != b || matches!(r.kind, IoKind::Read { .. }))
                })
                .map(|(r, _)| r)
                .collect()
        };
        for request in done {
            // Writes done: commit every file of this backend with unstable pages.
            let listed = &self.wbs[b.index()].unstable_files;
            self.stats.files_visited += listed.len() as u64;
            let unstable: Vec<InodeId> = listed
                .iter()
                .copied()
                .filter(|&i| maps.with(i, |m| m.counts().unstable > 0))
                .collect();
            let pending_commit =
                unstable.iter().any(|i| !self.inodes[i].commits_inflight.is_empty());
            if !unstable.is_empty() || pending_commit {
                for i in unstable {
                    self.inode_mut(i).commit_now = true;
                    self.maybe_commit(i, maps);
                }
                // Keep waiting: the commits' completions call back here. Track them by the
                // newest IO issued.
                let last = IoId(self.next_io - 1);
                self.wbs[b.index()].flusher.wait_sync(request, last);
                if self
                    .ios
                    .range(..=last)
                    .any(|(_, r)| r.backend == b && matches!(r.kind, IoKind::Commit { .. }))
                {
                    continue;
                }
            }
            self.wbs[b.index()].flusher.end_sync_wait(request);
            let Some(state) = self.syncs.get_mut(&request) else { continue };
            if state.rewrite.remove(&b) {
                // A COMMIT redirtied pages: write this backend's part again.
                self.queue_sync_work(b, request);
                continue;
            }
            if state.outage.remove(&b) {
                if !self.wbs[b.index()].outage_reported {
                    // The backend could not be reached: try its part again after a backoff.
                    let at = self.now + RETRY_BACKOFF_MIN.max(Duration::from_secs(1));
                    self.syncs.get_mut(&request).expect("sync").retry_at.insert(b, at);
                    continue;
                }
                state.error.get_or_insert(IoError { errno: errno::EIO });
            }
            state.backends_left -= 1;
            if state.backends_left == 0 {
                let state = self.syncs.remove(&request).expect("sync");
                // A file that failed during the sync, the first in file order, with its last
                // error.
                let error = state.error.or_else(|| state.failed.values().next().copied());
                self.emit(Action::SyncDone { request, result: error.map_or(Ok(()), Err) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{BackendConfig, Config};
    use crate::engine::{Engine, MapStore};
    use crate::event::{Action, Event};
    use crate::ids::{BackendId, HandleId, InodeId, RequestId};
    use crate::time::Instant;

    /// An engine with one file open through `HandleId(1)`.
    fn one_open_file() -> (Engine, MapStore) {
        let config = Config::new(64 << 20, BackendConfig::new("data"));
        let mut engine = Engine::new(config, Instant::ZERO).expect("valid");
        let mut maps = MapStore::new();
        let open = Event::Open { handle: HandleId(1), inode: InodeId(1), backend: BackendId(0) };
        engine.handle(Instant::ZERO, open, &mut maps);
        (engine, maps)
    }

    /// Closing the handle brings the file's count back to zero (the precondition of the
    /// planted break below).
    #[test]
    fn a_close_takes_back_its_open() {
        let (mut engine, mut maps) = one_open_file();
        assert_eq!(engine.inodes[&InodeId(1)].handles, 1);
        let close = Event::Close { handle: HandleId(1), request: RequestId(1) };
        engine.handle(Instant::ZERO, close, &mut maps);
        // Forgotten at once (nothing cached) or kept with no handle.
        assert_eq!(engine.inodes.get(&InodeId(1)).map_or(0, |meta| meta.handles), 0);
        let answered = std::iter::from_fn(|| engine.poll_action())
            .any(|a| matches!(a, Action::CloseDone { result: Ok(()), .. }));
        assert!(answered, "the close is answered");
    }

    /// Planted: the file's count lost its open (a bad state no event makes); the close that
    /// would hide it under a saturating subtraction stops on the invariant instead.
    #[test]
    #[should_panic(expected = "a handle closed on a file with no handle open")]
    fn a_close_without_an_open_is_caught() {
        let (mut engine, mut maps) = one_open_file();
        engine.inodes.get_mut(&InodeId(1)).expect("opened").handles = 0;
        let close = Event::Close { handle: HandleId(1), request: RequestId(1) };
        engine.handle(Instant::ZERO, close, &mut maps);
    }
}
