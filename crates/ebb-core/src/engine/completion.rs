//! Completions of writes and COMMITs: the page states they move, the bandwidth update they
//! arm, and the write-error policy (the parent module's doc) they carry out: classes, retries,
//! the outage deadline and the requests that run its clock too, page waiters.

use super::{
    CoreBug, Counters, Engine, HOLD_BACKOFF_MIN, IoKind, IoRecord, OUTAGE_PROBE_MAX, PageMaps,
    RETRY_BACKOFF_MAX, RETRY_BACKOFF_MIN, WaitReason,
};
use crate::event::{Action, ErrorClass, IoError, Issuer, Stability, errno};
use crate::ids::{BackendId, InodeId, IoId, RequestId, WriterId};
use crate::memory::List;
use crate::pagemap::{CommitBatch, Run, WriteEnd};
use crate::time::{Duration, Instant};
use crate::trace::TraceEvent;
use crate::writer::Writer;

impl Engine {
    pub(super) fn write_done<M: PageMaps>(
        &mut self,
        io: IoId,
        result: Result<Stability, IoError>,
        maps: &mut M,
    ) {
        let record =
            self.ios.remove(&io).unwrap_or_else(|| panic!("completion of unknown io {io}"));
        let IoKind::Write { runs, issuer, held_retry } = record.kind else {
            panic!("io {io} is not a write")
        };
        let (b, inode) = (record.backend, record.inode);
        self.write_slot_freed(b, record.issued);
        let end = self.write_end(b, result);
        let out = maps.with(inode, |m| {
            let mut out = crate::pagemap::EndOutcome::default();
            for run in &runs {
                out.merge(m.end_writeback(*run, end));
            }
            out
        });
        let count: u64 = runs.iter().map(|run| run.count).sum();
        if let Err(e) = result {
            self.stats.write_errors += 1;
            if out.freed == count {
                // Every page of the write was truncated away (or the file discarded) while it
                // was in flight: the failure lost nothing the file still holds, so it is
                // neither reported nor retried. A server that lost a deleted file answers so.
                self.stats.errors_of_dropped_pages += 1;
            } else if held_retry && e.class() == ErrorClass::Hold {
                self.stats.held_retries_failed += 1;
                self.schedule_retry(inode, ErrorClass::Hold);
            } else {
                self.write_failed(b, inode, e);
            }
        }
        let became_dirty = out.inode_became_dirty || out.unstable > 0;
        self.write_accounted(b, inode, &runs, end, out);
        if became_dirty {
            // Unstable pages keep the file on the dirty list until committed, as the NFS
            // client marks the inode dirty (I_DIRTY_DATASYNC) for them: the flusher's passes
            // call writepages on it and its write_inode step sends the COMMIT.
            self.mark_inode_dirty(inode);
        }
        self.write_inode_done(b, inode, io, result.is_ok(), maps);
        if let Issuer::Writer(w) = issuer {
            self.writer_io_done(w);
        }
        self.wake_page_waiters(inode);
        self.maybe_commit(inode, maps);
        self.fsync_progress(inode, maps);
        self.sync_progress(b, maps);
        self.wake_memory_waiters(maps);
        self.gate_sweep(maps);
    }

    /// A write issued at `issued` left the backend's request slots: wbt hears its latency.
    fn write_slot_freed(&mut self, b: BackendId, issued: Instant) {
        let now = self.now;
        let wb = &mut self.wbs[b.index()];
        wb.inflight -= 1;
        wb.write_inflight -= 1;
        wb.last_completion = now;
        let latency = now.saturating_since(issued);
        let inflight = wb.write_inflight;
        wb.wbt.on_write_done(now, latency, inflight);
    }

    /// Where a write's pages go by its result: clean, unstable under the verifier's slot, held
    /// (an error of class `Hold`) or dirty again. A success, or an error the server gave
    /// (`ENOSPC`, `EIO`: [`crate::outage::is_answer`]), means the backend is reached.
    fn write_end(&mut self, b: BackendId, result: Result<Stability, IoError>) -> WriteEnd {
        let end = match result {
            Ok(Stability::Stable) => WriteEnd::Stable,
            Ok(Stability::Unstable { verifier }) => {
                WriteEnd::Unstable(self.verifier_slot(b, verifier))
            }
            Err(e) if e.class() == ErrorClass::Hold => WriteEnd::Hold,
            Err(_) => WriteEnd::Redirty,
        };
        if result.map_or_else(crate::outage::is_answer, |_| true) {
            self.backend_reached(b);
        }
        if end == WriteEnd::Hold && self.planted(CoreBug::DropHeldPage) {
            WriteEnd::Stable
        } else {
            end
        }
    }

    /// The counters, durability watermark, completion share and LRU after a write of `runs`
    /// ended as `end` with outcome `out`.
    fn write_accounted(
        &mut self,
        b: BackendId,
        inode: InodeId,
        runs: &[Run],
        end: WriteEnd,
        out: crate::pagemap::EndOutcome,
    ) {
        let held = end == WriteEnd::Hold && !self.planted(CoreBug::SkipHeldCount);
        let completed = out.cleaned + out.unstable;
        let delta = Counters {
            writeback: -(runs.iter().map(|run| run.count as i64).sum::<i64>()),
            dirty: out.redirtied as i64,
            held: if held { out.redirtied as i64 } else { 0 },
            unstable: out.unstable as i64,
            resident: -(out.freed as i64),
            written: completed,
            ..Counters::default()
        };
        if end == WriteEnd::Stable
            && out.cleaned > 0
            && !self.planted(CoreBug::ForgetUnsyncedRun)
            && let Some(meta) = self.inodes.get_mut(&inode)
        {
            for run in runs {
                meta.durability.cleaned(run.first, run.end());
            }
        }
        self.account(inode, delta);
        if completed > 0 {
            let max_frac =
                crate::fprop::FRAC_BASE * u64::from(self.cfg.backends[b.index()].max_ratio) / 100;
            let now = self.now;
            let wb = &mut self.wbs[b.index()];
            self.completions.add(now, &mut wb.share, completed, max_frac);
        }
        for frame in out.freed_frames {
            self.mem.unlink(frame);
            self.mem.release(frame);
        }
        for frame in out.rotate {
            if self.mem.list_of(frame) != List::None {
                self.mem.move_to_inactive_tail(frame);
            }
        }
    }

    /// The file's part of a write's end: one write fewer in flight, the retry backoff reset by
    /// a success, held pages retried at once once the backend takes writes again (`ok`), and
    /// the delayed bandwidth update armed when the file has no write left in flight.
    fn write_inode_done<M: PageMaps>(
        &mut self,
        b: BackendId,
        inode: InodeId,
        io: IoId,
        ok: bool,
        maps: &mut M,
    ) {
        let mut inode_idle = false;
        let held_left = ok && maps.with(inode, |m| m.counts().held) > 0;
        let before = self.retry_deadlines(inode);
        if let Some(meta) = self.inodes.get_mut(&inode) {
            meta.inflight.remove(&io);
            inode_idle = meta.inflight.is_empty();
            if ok {
                meta.retry_backoff = Duration::ZERO;
            }
            if held_left && meta.retry_at.is_none() && !meta.retry_held {
                meta.hold_retry_at = None;
                // The backend takes writes again: the rest of the held pages follow at once.
                meta.retry_held = true;
                self.start_all(b);
            }
        }
        self.reindex_retry(inode, before);
        // The inode's writeback ended: a bandwidth update 200 ms later (BANDWIDTH_INTERVAL), so
        // that inodes finishing together share one. A pending one is not moved.
        let wb = &mut self.wbs[b.index()];
        if inode_idle && wb.bw_update_at.is_none() {
            wb.bw_update_at = Some(self.now + crate::bandwidth::BANDWIDTH_INTERVAL);
        }
    }

    pub(super) fn verifier_slot(&mut self, b: BackendId, verifier: u64) -> u16 {
        let list = &mut self.wbs[b.index()].verifiers;
        match list.iter().position(|&v| v == verifier) {
            Some(i) => i as u16,
            None => {
                assert!(list.len() < usize::from(u16::MAX), "too many write verifiers");
                list.push(verifier);
                (list.len() - 1) as u16
            }
        }
    }

    /// A write or commit of `inode` on `b` failed with `e`: the write-error policy (module
    /// doc). The pages themselves are redirtied or held by the caller.
    pub(super) fn write_failed(&mut self, b: BackendId, inode: InodeId, e: IoError) {
        match e.class() {
            ErrorClass::Retry => self.record_error(inode, e),
            ErrorClass::Hold => {
                self.last_hold = Some(e);
                self.record_error(inode, e);
            }
            ErrorClass::Outage => {
                self.stats.outage_errors += 1;
                for f in self.fsyncs.values_mut().filter(|f| f.inode == inode) {
                    f.outage = true;
                }
                for state in self.syncs.values_mut() {
                    state.outage.insert(b);
                }
                let now = self.now;
                let wb = &mut self.wbs[b.index()];
                wb.outage.down(now);
                if self.cfg.backends[b.index()].retry_timeout_secs == 0 {
                    // No patience: reported like any failure.
                    self.record_error(inode, IoError { errno: errno::EIO });
                }
            }
        }
        self.schedule_retry(inode, e.class());
    }

    /// Records a write error on a file: every open handle will see it once.
    pub(super) fn record_error(&mut self, inode: InodeId, e: IoError) {
        if let Some(meta) = self.inodes.get_mut(&inode) {
            meta.err_seq += 1;
            meta.err = Some(e);
            meta.err_unseen = true;
            for state in self.syncs.values_mut() {
                state.failed.insert(inode, e);
            }
        }
    }

    /// Sets the file's next retry with exponential backoff: from [`RETRY_BACKOFF_MIN`]
    /// doubling to [`RETRY_BACKOFF_MAX`] for errors that may pass ([`OUTAGE_PROBE_MAX`] for
    /// an unreachable backend), from [`HOLD_BACKOFF_MIN`] for held pages (whose retry
    /// rewrites all of them).
    pub(super) fn schedule_retry(&mut self, inode: InodeId, class: ErrorClass) {
        let now = self.now;
        let before = self.retry_deadlines(inode);
        let Some(meta) = self.inodes.get_mut(&inode) else { return };
        let first = if class == ErrorClass::Hold { HOLD_BACKOFF_MIN } else { RETRY_BACKOFF_MIN };
        meta.retry_backoff = if meta.retry_backoff == Duration::ZERO {
            first
        } else {
            let most =
                if class == ErrorClass::Outage { OUTAGE_PROBE_MAX } else { RETRY_BACKOFF_MAX };
            (meta.retry_backoff + meta.retry_backoff).clamp(first, most)
        };
        let at = now + meta.retry_backoff;
        if class == ErrorClass::Hold {
            // The earliest retry stands: new data failing meanwhile does not push it back.
            meta.hold_retry_at = Some(meta.hold_retry_at.map_or(at, |t| t.min(at)));
        } else {
            meta.retry_at = Some(at);
        }
        self.reindex_retry(inode, before);
    }

    /// A request a caller waits on (a lookup, a create, a read that misses the cache), made
    /// by the driver to backend `b`, failed at `now` with `error`: what the outage rule says
    /// ([`crate::outage::OutageClock::failed`]: `first` is when the request's first failed
    /// try began, `started` when this one began, `failures` how many failed before), on the
    /// backend's one clock, which its write-back runs too: a request failing starts the
    /// outage for the data as well, and its deadline comes as one for both.
    pub fn request_failed(
        &mut self,
        now: Instant,
        b: BackendId,
        error: IoError,
        first: Instant,
        started: Instant,
        failures: u32,
    ) -> crate::outage::Next {
        self.advance(now);
        if crate::outage::is_answer(error) {
            // The server answered, with an error: reached, as at a success.
            self.backend_reached(b);
        }
        self.fold_oldest_io(b);
        self.wbs[b.index()].outage.failed(error, first, started, now, failures)
    }

    /// A request to `b` a caller waits on, begun at `started`, has had no answer by `now`
    /// (the driver saw it waiting): once its try has outlived the backend's per-try timeout
    /// the backend is silent since then, or since its last answer; before, or on a backend
    /// without one, nothing ([`crate::outage::OutageClock::waiting`]).
    pub fn request_waiting(&mut self, now: Instant, b: BackendId, started: Instant) {
        self.advance(now);
        self.wbs[b.index()].outage.waiting(started.min(now), now);
    }

    /// Whether `b` has been unreachable for its `retry_timeout_secs` at `now`, an IO the
    /// engine has in flight to it counted from its issue once it outlived the per-try
    /// timeout: a driver answers the requests that wait on it `EIO` once their own try is
    /// given up, until the backend answers.
    pub fn backend_unreachable(&mut self, now: Instant, b: BackendId) -> bool {
        self.advance(now);
        self.wbs[b.index()].outage.expired(now, self.oldest_io(b))
    }

    /// When the oldest IO the engine has in flight to `b` was issued (IO ids grow with
    /// time, so it is the first of `b`'s in `ios`); `None` for a backend without a per-try
    /// timeout, whose IOs in flight never count as an outage (nothing to look for).
    pub(crate) fn oldest_io(&self, b: BackendId) -> Option<Instant> {
        self.wbs[b.index()].outage.try_timeout()?;
        self.ios.values().find(|record| record.backend == b).map(|record| record.issued)
    }

    /// Counts `b`'s oldest IO in flight into its outage clock (once it outlived the per-try
    /// timeout, a failure from its issue, unless the backend answered since).
    fn fold_oldest_io(&mut self, b: BackendId) {
        if let Some(oldest) = self.oldest_io(b) {
            let now = self.now;
            self.wbs[b.index()].outage.waiting(oldest, now);
        }
    }

    /// A request to `b` succeeded at `now`: the backend answers, so any outage is over, for
    /// its write-back too (writers no longer fail; fsync waits for retries again).
    pub fn request_succeeded(&mut self, now: Instant, b: BackendId) {
        self.advance(now);
        self.backend_reached(b);
    }

    /// Whether `b`'s outage clock runs (a call to it failed since the last success) or may
    /// start (an IO to it is in flight, which becomes evidence of an outage if it outlives
    /// the backend's per-try timeout): a driver need not report a request's success
    /// otherwise. A success while an IO is in flight moves the start of the backend's
    /// silence, so it is reported then.
    pub fn backend_down(&self, b: BackendId) -> bool {
        self.wbs[b.index()].outage.since().is_some() || self.oldest_io(b).is_some()
    }

    /// A write, commit or request to `b` was answered (a success, or an error the server
    /// gave): any outage is over.
    pub(super) fn backend_reached(&mut self, b: BackendId) {
        let now = self.now;
        let wb = &mut self.wbs[b.index()];
        wb.outage.succeeded(now);
        wb.outage_reported = false;
    }

    /// When the current outage of backend `b` turns into EIO for its files (`None`: no
    /// outage, or already reported), its oldest IO in flight counted from its issue once it
    /// outlives the per-try timeout ([`crate::outage::OutageClock::expires_at`]).
    pub(crate) fn outage_deadline(&self, b: BackendId) -> Option<Instant> {
        let wb = &self.wbs[b.index()];
        if wb.outage_reported {
            return None;
        }
        wb.outage.expires_at(self.oldest_io(b))
    }

    /// The backend's outage reached its deadline: every file of it with unwritten data gets
    /// EIO (once per handle), waiting fsyncs answer, and from now on its writers fail instead
    /// of being throttled, until a write succeeds. The data stays and is retried.
    pub(super) fn outage_expired<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        // The start stays until the backend answers (an IO that ends in a failure later
        // does not move it).
        self.fold_oldest_io(b);
        self.wbs[b.index()].outage_reported = true;
        self.stats.outage_timeouts += 1;
        let unwritten = |m: &mut crate::pagemap::PageMap| {
            let counts = m.counts();
            counts.dirty + counts.unstable + counts.writeback > 0
        };
        let files: Vec<InodeId> = self
            .inodes
            .iter()
            .filter(|(_, m)| m.backend == b)
            .map(|(&i, _)| i)
            .filter(|&i| maps.with(i, unwritten))
            .collect();
        for inode in files {
            self.record_error(inode, IoError { errno: errno::EIO });
        }
        // Every fsync and flushing close of the backend's files, whatever it waits for: a
        // write of a server that never answers may not end before the client's own timeout.
        let waiting: Vec<RequestId> = self
            .fsyncs
            .iter()
            .filter(|(_, f)| self.inodes.get(&f.inode).is_some_and(|m| m.backend == b))
            .map(|(&r, _)| r)
            .collect();
        for request in waiting {
            self.fsync_answer(request, maps);
        }
        // Syncs waiting to retry this backend's part: one more pass, which ends with EIO.
        let mut retries = Vec::new();
        for (&request, state) in &mut self.syncs {
            if state.retry_at.remove(&b).is_some() {
                state.outage.insert(b);
                retries.push(request);
            }
        }
        for request in retries {
            self.queue_sync_work(b, request);
        }
        // Writers paused against this backend re-check, and fail.
        let paused: Vec<WriterId> = self.waiters.keys().copied().collect();
        for w in paused {
            if self.waiters.get(&w) != Some(&WaitReason::OwnWriteback) {
                self.waiters.remove(&w);
                self.emit(Action::Resume { writer: w });
            }
        }
    }

    pub(super) fn wake_page_waiters(&mut self, inode: InodeId) {
        if let Some(meta) = self.inodes.get_mut(&inode)
            && !meta.page_waiters.is_empty()
        {
            let waiters = std::mem::take(&mut meta.page_waiters);
            for w in waiters {
                if self.waiters.remove(&w).is_some() {
                    self.actions.push_back(Action::Resume { writer: w });
                }
            }
        }
    }

    /// A writer found a page under writeback: it waits for that file's next completion.
    pub(crate) fn wait_for_page<M: PageMaps>(
        &mut self,
        now: Instant,
        w: &mut Writer,
        inode: InodeId,
        page: u64,
        maps: &mut M,
    ) -> crate::Verdict {
        self.advance(now);
        w.sleep_until = None;
        let busy = maps
            .with(inode, |m| m.page(page).is_some_and(|p| p.state == crate::PageState::Writeback));
        if !busy {
            return crate::Verdict::Proceed { stalled: Duration::ZERO, throttled: false };
        }
        w.call = crate::writer::CallState::Blocked;
        w.call_start = now;
        self.waiters.insert(w.id, WaitReason::Page(inode));
        self.inode_mut(inode).page_waiters.push(w.id);
        crate::Verdict::Wait
    }

    // ----- commits (two-phase backends) -----

    /// Sends a COMMIT for `inode` when one is due (a writepages call's writes have all
    /// completed, or `commit_now`) and unstable pages no COMMIT in flight covers exist.
    /// Returns the pages it covers (0: none sent).
    ///
    /// With `commit_batch_ratio` set (ebb's own), a completed call's COMMIT waits until the
    /// file's unstable pages reach that share of the backend's dirty threshold, or until no
    /// write of the file is in flight (a writer that stopped or is throttled still gets its
    /// COMMIT without an fsync; the kernel's `write_inode` commits a file under no writeback
    /// the same way). `commit_now` (fsync, sync, close, an empty call) is never deferred.
    pub(crate) fn maybe_commit<M: PageMaps>(&mut self, inode: InodeId, maps: &mut M) -> u64 {
        let Some(meta) = self.inodes.get_mut(&inode) else { return 0 };
        let b = meta.backend;
        let mut due = std::mem::take(&mut meta.commit_now);
        let mut call_done = std::mem::take(&mut meta.commit_deferred);
        while let Some(&mark) = meta.commit_marks.front() {
            if meta.inflight.range(..=mark).next().is_some() {
                break;
            }
            meta.commit_marks.pop_front();
            call_done = true;
        }
        if call_done && !due {
            due = self.commit_batch_due(b, inode, maps);
            self.inode_mut(inode).commit_deferred = !due;
        }
        if !due {
            return 0;
        }
        let batch = maps.with(inode, |m| {
            if m.counts().unstable > 0 { m.begin_commit() } else { CommitBatch::default() }
        });
        let pages = batch.pages();
        if pages == 0 {
            return 0;
        }
        let io = self.new_io();
        self.inode_mut(inode).commits_inflight.insert(io);
        self.ios.insert(
            io,
            IoRecord { backend: b, inode, kind: IoKind::Commit { batch }, issued: self.now },
        );
        self.stats.commits += 1;
        self.stats.commit_pages += pages;
        self.record(TraceEvent::Commit { bdi: b, inode, pages });
        self.emit(Action::Commit { io, backend: b, inode, pages });
        pages
    }

    /// Whether a completed writepages call's COMMIT goes out now (see [`Self::maybe_commit`]).
    fn commit_batch_due<M: PageMaps>(&self, b: BackendId, inode: InodeId, maps: &mut M) -> bool {
        let ratio = u64::from(self.cfg.backends[b.index()].commit_batch_ratio);
        if ratio == 0 || self.inodes.get(&inode).is_none_or(|m| m.inflight.is_empty()) {
            return true;
        }
        let t = self.global_thresholds();
        let batch = self.wb_limits(b, t.thresh, t.bg_thresh).0 * ratio / 100;
        maps.with(inode, |m| m.counts().unstable) >= batch.max(1)
    }

    pub(super) fn commit_done<M: PageMaps>(
        &mut self,
        io: IoId,
        result: Result<u64, IoError>,
        maps: &mut M,
    ) {
        let record =
            self.ios.remove(&io).unwrap_or_else(|| panic!("completion of unknown io {io}"));
        let (b, inode) = (record.backend, record.inode);
        let IoKind::Commit { batch } = record.kind else { panic!("io {io} is not a commit") };
        self.inode_mut(inode).commits_inflight.remove(&io);
        let out = match result {
            Ok(verifier) => {
                let verifiers = &self.wbs[b.index()].verifiers;
                maps.with(inode, |m| {
                    m.resolve_commit(&batch, |slot| {
                        verifiers.get(usize::from(slot)) == Some(&verifier)
                    })
                })
            }
            Err(e) => {
                // The server may have lost the data: write it again.
                let out = maps.with(inode, |m| m.resolve_commit(&batch, |_| false));
                if out.redirtied > 0 {
                    self.write_failed(b, inode, e);
                } else {
                    // Its pages were truncated away meanwhile: nothing to lose (as for writes).
                    self.stats.errors_of_dropped_pages += 1;
                }
                out
            }
        };
        if result.map_or_else(crate::outage::is_answer, |_| true) {
            self.backend_reached(b);
        }
        self.stats.verifier_redirtied += out.redirtied;
        if out.redirtied > 0 {
            for f in self.fsyncs.values_mut().filter(|f| f.inode == inode) {
                f.rewrite = true;
            }
            for state in self.syncs.values_mut() {
                state.rewrite.insert(b);
            }
        }
        let delta = Counters {
            unstable: -((out.cleaned + out.redirtied) as i64),
            dirty: out.redirtied as i64,
            ..Counters::default()
        };
        self.account(inode, delta);
        if out.inode_became_dirty {
            self.mark_inode_dirty(inode);
        }
        self.maybe_commit(inode, maps);
        self.fsync_progress(inode, maps);
        self.sync_progress(b, maps);
        self.wake_memory_waiters(maps);
    }
}
