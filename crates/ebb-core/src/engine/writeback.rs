//! The engine drives each backend's flusher and submission queue (their state and decisions
//! are `crate::flusher`'s): it starts works and chunks with what they need from the engine
//! (thresholds, bandwidth, a file's IO and error state), issues the writes the submitters take
//! while request slots are free, and puts a file back on its lists after each chunk.

use super::{Counters, Engine, IoKind, IoRecord, PageMaps, WRITEPAGES_SIZE_BUCKETS};
use crate::event::{Action, IoClass, Issuer};
use crate::flusher::{Exhausted, Next, Pick, Submitter, granules};
use crate::ids::{BackendId, InodeId, IoId, RequestId, WriterId};
use crate::pagemap::Run;
use crate::time::{Duration, Instant};
use crate::trace::TraceEvent;

/// What one turn of a submitter did ([`Engine::submit_turn`]).
enum Turn {
    /// Writeback throttling holds its class: it keeps its place.
    Held,
    /// It wrote and takes its next turn last.
    Wrote,
    /// It has nothing more to write, or used up its chunk.
    Done(Submitter),
}

impl Engine {
    /// Runs every backend's flusher and submission queue until nothing more can be issued.
    pub(crate) fn drive_all<M: PageMaps>(&mut self, maps: &mut M) {
        for b in 0..self.wbs.len() {
            self.drive(BackendId(b as u32), maps);
        }
    }

    fn drive<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        // Bounded: each turn either issues IO, finishes a submitter or stops.
        for turn in 0.. {
            assert!(turn < 1_000_000, "backend {b}: submission loop does not settle");
            self.flusher_step(b, maps);
            let finished = self.pump(b, maps);
            if finished.is_empty() {
                break;
            }
            for (issuer, sub) in finished {
                self.submitter_done(b, issuer, sub, maps);
            }
        }
    }

    pub(crate) fn add_submitter(&mut self, b: BackendId, issuer: Issuer, sub: Submitter) {
        self.wbs[b.index()].submissions.add(issuer, sub);
    }

    /// Issues writes while the backend has free request slots; returns the submitters that
    /// finished.
    fn pump<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) -> Vec<(Issuer, Submitter)> {
        let depth = self.cfg.backends[b.index()].queue_depth;
        let mut finished = Vec::new();
        let mut held = Vec::new();
        while self.wbs[b.index()].inflight < depth {
            let Some((issuer, sub)) = self.wbs[b.index()].submissions.next_turn() else { break };
            match self.submit_turn(b, issuer, sub, maps) {
                Turn::Held => held.push(issuer),
                Turn::Wrote => {}
                Turn::Done(sub) => finished.push((issuer, sub)),
            }
        }
        // Held submitters keep their turn order, ahead of any that were not reached.
        self.wbs[b.index()].submissions.hold_back(held);
        finished
    }

    /// One turn of `issuer`: the next run of its file, as large as its wbt class, the backend
    /// and what is left of its chunk allow, written in one IO.
    fn submit_turn<M: PageMaps>(
        &mut self,
        b: BackendId,
        issuer: Issuer,
        sub: Submitter,
        maps: &mut M,
    ) -> Turn {
        let now = self.now;
        let max_write = u64::from(self.cfg.backends[b.index()].max_write_pages);
        let class = sub.wbt_class(issuer);
        let wb = &mut self.wbs[b.index()];
        if !wb.wbt.may_issue(class, wb.write_inflight, now) {
            // Writeback throttling holds this class; others (sync) may still go.
            return Turn::Held;
        }
        let tail_budget =
            if issuer == Issuer::Flusher { self.tail_budget(b, sub.inode) } else { None };
        // ebb's wbt variant writes smaller in the background while reads are active.
        let write = self.wbs[b.index()].wbt.write_pages(class, max_write, now);
        let backend = &self.cfg.backends[b.index()];
        let max = write.min(sub.chunk_left);
        let (runs, unheld) = maps.with(sub.inode, |m| {
            let runs = granules::take_runs(m, backend, &sub, max, tail_budget);
            (runs, m.take_unheld())
        });
        let Some(runs) = runs else {
            // Nothing more past this point: the next pass over this file starts at 0.
            if let Some(meta) = self.inodes.get_mut(&sub.inode) {
                meta.writeback_index = 0;
            }
            return Turn::Done(self.wbs[b.index()].submissions.finish(issuer));
        };
        let sync_all = self.wbs[b.index()].flusher.current_sync_all();
        let count: u64 = runs.iter().map(|run| run.count).sum();
        let end = runs.last().map_or(0, |run| run.end());
        let held_retry = unheld == count && issuer == Issuer::Flusher && !sync_all;
        self.issue_write(b, issuer, &sub, runs, unheld, held_retry);
        match self.wbs[b.index()].submissions.wrote(issuer, end, count) {
            Some(sub) => Turn::Done(sub),
            None => Turn::Wrote,
        }
    }

    /// Sends `runs` (ascending, disjoint, not empty) of the submitter's file as one write: the
    /// IO record, the file's and backend's in-flight writes, the counters (`unheld` of its
    /// pages were held) and the action.
    fn issue_write(
        &mut self,
        b: BackendId,
        issuer: Issuer,
        sub: &Submitter,
        runs: Vec<Run>,
        unheld: u64,
        held_retry: bool,
    ) {
        let (inode, class) = (sub.inode, sub.class);
        let now = self.now;
        let io = self.new_io();
        let count: u64 = runs.iter().map(|run| run.count).sum();
        let end = runs.last().map_or(0, |run| run.end());
        self.ios.insert(
            io,
            IoRecord {
                backend: b,
                inode,
                kind: IoKind::Write { runs: runs.clone(), issuer, held_retry },
                issued: now,
            },
        );
        let meta = self.inode_mut(inode);
        meta.inflight.insert(io);
        meta.writeback_index = end;
        let wb = &mut self.wbs[b.index()];
        wb.inflight += 1;
        wb.write_inflight += 1;
        wb.wbt.on_write_issue(now);
        self.account(
            inode,
            Counters {
                dirty: -(count as i64),
                held: -(unheld as i64),
                writeback: count as i64,
                ..Counters::default()
            },
        );
        self.stats.writes += 1;
        self.stats.write_pages += count;
        if let Issuer::Writer(w) = issuer {
            *self.writer_ios.entry(w).or_insert(0) += 1;
            self.stats.writer_writeback_ios += 1;
            self.stats.writer_writeback_pages += count;
        }
        self.emit(Action::Write { io, backend: b, inode, runs, class, issuer });
    }

    fn submitter_done<M: PageMaps>(
        &mut self,
        b: BackendId,
        issuer: Issuer,
        sub: Submitter,
        maps: &mut M,
    ) {
        self.stats.writepages_pages += sub.written;
        self.record(TraceEvent::Writepages { bdi: b, inode: sub.inode, wrote: sub.written });
        let bucket = (u64::BITS - sub.written.leading_zeros()) as usize;
        self.writepages_sizes[bucket.min(WRITEPAGES_SIZE_BUCKETS - 1)] += 1;
        match issuer {
            Issuer::Flusher => {
                let sync_all = self.wbs[b.index()].flusher.current_sync_all();
                let committed = self.requeue_inode(b, &sub, sync_all, maps);
                let depth = self.cfg.backends[b.index()].queue_depth;
                let full = self.wbs[b.index()].inflight >= depth;
                // The legacy era's flusher (pdflush) wrote nonblocking and backed off while
                // the queue was congested, releasing the file; later flushers block holding it.
                let wait_slot = sub.chunk_left == 0
                    && full
                    && self.cfg.throttle.flusher_backs_off_when_congested();
                self.wbs[b.index()].flusher.chunk_done(sub.written, committed, wait_slot);
            }
            Issuer::Writer(w) => {
                let _ = self.requeue_inode(b, &sub, false, maps);
                self.legacy_writeback_submitted(w, sub.written);
            }
            Issuer::Fsync(request) => {
                if self.fsyncs.contains_key(&request) {
                    self.fsync_wait_phase(request, maps);
                }
            }
            Issuer::Reclaim => {}
        }
    }

    /// Puts a file back on the right list after a chunk (the kernel's `requeue_inode`), after
    /// the two-phase part of the call. Returns the pages a COMMIT sent by the file's
    /// write_inode step covers, which count as progress, as in the kernel.
    fn requeue_inode<M: PageMaps>(
        &mut self,
        b: BackendId,
        sub: &Submitter,
        integrity: bool,
        maps: &mut M,
    ) -> u64 {
        let inode = sub.inode;
        let now = self.now;
        let counts = maps.with(inode, |m| {
            let c = m.counts();
            m.set_inode_dirty(c.dirty > 0);
            c
        });
        // Two-phase backends (docs/nfs.md): a call that wrote something commits once
        // its writes have completed; a call that wrote nothing commits at once (its completion
        // object has nothing to wait for). With no write of the file in flight, the file's
        // write_inode step commits too, and what it commits counts as progress.
        let meta = self.inode_mut(inode);
        let idle = meta.inflight.is_empty();
        match meta.inflight.last().copied() {
            Some(last) if sub.written > 0 => meta.commit_marks.push_back(last),
            _ => meta.commit_now |= counts.unstable > 0,
        }
        let committed = self.maybe_commit(inode, maps);
        let progress = if idle { committed } else { 0 };
        let meta = self.inode_mut(inode);
        meta.syncing = None;
        let retry_gated = meta.retry_at.is_some_and(|t| t > now);
        let unstable = counts.unstable > 0 || !meta.commits_inflight.is_empty();
        let f = &mut self.wbs[b.index()].flusher;
        if counts.dirty == 0 {
            // Unstable pages or COMMITs in flight keep the file dirty (I_DIRTY_DATASYNC).
            if unstable {
                f.redirty_tail(inode, now);
            } else {
                f.unlist(inode);
            }
            return progress;
        }
        if integrity {
            f.set_dirtied_when(inode, now);
        }
        if sub.chunk_left == 0 && !retry_gated {
            f.postpone(inode);
        } else {
            f.redirty_tail(inode, now);
        }
        progress
    }

    /// Puts a file that became dirty on its backend's dirty list (the kernel's
    /// `__mark_inode_dirty`); the first arms the flusher's periodic wakeup.
    pub(crate) fn mark_inode_dirty(&mut self, inode: InodeId) {
        let Some(meta) = self.inodes.get(&inode) else {
            panic!("inode {inode} dirtied before it was opened");
        };
        let b = meta.backend;
        let period = (self.cfg.dirty_writeback_centisecs > 0).then(|| self.writeback_interval());
        self.wbs[b.index()].flusher.mark_dirty(inode, self.now, period);
    }

    pub(crate) fn writeback_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.cfg.dirty_writeback_centisecs) * 10)
    }

    pub(crate) fn expire_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.cfg.dirty_expire_centisecs) * 10)
    }

    /// Moves postponed files and files dirtied no later than `dirtied_before` to `io`.
    fn queue_io(&mut self, b: BackendId, dirtied_before: Instant) {
        let f = &mut self.wbs[b.index()].flusher;
        let moved = f.queue_io(dirtied_before);
        let reason = f.reason();
        self.record(TraceEvent::QueueIo { bdi: b, moved, reason: reason.name() });
    }

    /// Whether background writeback should run (the kernel's `wb_over_bg_thresh`).
    pub(crate) fn over_bg_thresh(&self, b: BackendId) -> bool {
        let t = self.global_thresholds();
        let legacy = self.cfg.unstable_accounting.background_counts_unstable();
        let global = self.global.writable() + if legacy { self.global.unstable() } else { 0 };
        if global > t.bg_thresh {
            return true;
        }
        let wb = &self.wbs[b.index()].counters;
        let wb_reclaimable = wb.writable() + if legacy { wb.unstable() } else { 0 };
        if self.whole_granules_dirty(b) {
            return true;
        }
        let seconds = &self.cfg.backends[b.index()];
        let bg = if seconds.dirty_seconds > 0 || seconds.dirty_background_seconds > 0 {
            self.wb_limits(b, t.thresh, t.bg_thresh).1
        } else {
            self.wb_thresh(b, t.bg_thresh)
        };
        wb_reclaimable > bg
    }

    /// Write-behind of whole granules (ebb's own, for backends with write granules such as S3
    /// parts): the backend holds more dirty pages than the granules the gate's admitted files
    /// may be filling, so at least one granule is whole, and a whole part waits for nothing.
    /// Background writeback then runs below the background threshold too (the part a writer
    /// is filling still waits: `granules::take_run`). Under the kernel's rule alone it stopped
    /// under the threshold, so one stream had 1-4 parts of 8 in flight where the raw upload
    /// keeps 8 (measured: 0.65-0.78 of the raw upload when the server was fast).
    pub(crate) fn whole_granules_dirty(&self, b: BackendId) -> bool {
        let Some(bytes) = self.cfg.backends[b.index()].write_granule_bytes else { return false };
        let granule = (bytes / crate::config::PAGE_SIZE).max(1);
        let filling = self.gate.admitted_count() as u64;
        self.wbs[b.index()].counters.writable() >= granule * (filling + 1)
    }

    pub(crate) fn queue_sync_work(&mut self, b: BackendId, request: RequestId) {
        let now = self.now;
        self.wbs[b.index()].flusher.queue_sync(request, now);
    }

    /// Wakes the flusher for background writeback (`wb_start_background_writeback`).
    pub(crate) fn wake_flusher(&mut self, b: BackendId) {
        self.wbs[b.index()].flusher.wake();
    }

    /// Whether the backend's flusher is running a work (`writeback_in_progress`).
    pub(crate) fn writeback_in_progress(&self, b: BackendId) -> bool {
        self.wbs[b.index()].flusher.busy()
    }

    /// Asks the flusher to write `nr_pages` pages, oldest files first (2.6.3x-3.x direct
    /// reclaim's `wakeup_flusher_threads(total_scanned)`).
    pub(crate) fn queue_reclaim_work(&mut self, b: BackendId, nr_pages: u64) {
        let now = self.now;
        self.wbs[b.index()].flusher.queue_vmscan(nr_pages, now);
    }

    /// Asks the flusher to write everything dirty (reclaim's `wakeup_flusher_threads`).
    pub(crate) fn start_all(&mut self, b: BackendId) {
        self.wbs[b.index()].flusher.request_all();
    }

    /// Picks the flusher's next work and file, if it is not busy with a chunk.
    fn flusher_step<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        // Bounded: each turn starts a chunk, finishes a work, or returns.
        for turn in 0.. {
            assert!(turn < 1_000_000, "backend {b}: flusher loop does not settle");
            let full = self.wbs[b.index()].inflight >= self.cfg.backends[b.index()].queue_depth;
            let f = &mut self.wbs[b.index()].flusher;
            if f.submitting() || f.waits_for_slot(full) {
                return;
            }
            if !f.busy() && !self.pick_work(b) {
                return;
            }
            let over_bg = self.over_bg_thresh(b);
            let expire = self.expire_interval();
            match self.wbs[b.index()].flusher.advance_work(self.now, expire, over_bg) {
                Next::Finish => {
                    self.finish_work(b, maps);
                    continue;
                }
                Next::QueueIo(dirtied_before) => self.queue_io(b, dirtied_before),
                Next::Pick => {}
            }
            if let Some(inode) = self.pick_inode(b) {
                self.start_chunk(b, inode, maps);
                return;
            }
            let inodes = &self.inodes;
            match self.wbs[b.index()].flusher.after_empty_pick(|i| inodes[&i].syncing.is_some()) {
                Exhausted::Finish => self.finish_work(b, maps),
                // Wait for another submitter to finish with those files.
                Exhausted::Wait => return,
                Exhausted::Again => {}
            }
        }
    }

    fn pick_work(&mut self, b: BackendId) -> bool {
        let interval = self.writeback_interval();
        let nr_dirty = self.global.dirty() + self.files_opened;
        let over_bg = self.over_bg_thresh(b);
        let now = self.now;
        let Some(work) = self.wbs[b.index()].flusher.pick_work(now, interval, nr_dirty, over_bg)
        else {
            return false;
        };
        self.stats.flusher_works += 1;
        self.record(TraceEvent::WritebackStart {
            bdi: b,
            nr_pages: work.nr_pages,
            reason: work.reason.name(),
            sync_all: work.sync_all,
        });
        true
    }

    fn pick_inode(&mut self, b: BackendId) -> Option<InodeId> {
        let now = self.now;
        let inodes = &self.inodes;
        self.wbs[b.index()].flusher.pick_inode(now, |inode| {
            let meta = &inodes[&inode];
            if meta.syncing.is_some() {
                Pick::Busy
            } else if meta.retry_at.is_some_and(|t| t > now) {
                Pick::Gated
            } else {
                Pick::Take
            }
        })
    }

    fn start_chunk<M: PageMaps>(&mut self, b: BackendId, inode: InodeId, maps: &mut M) {
        let ioless = self.cfg.throttle.has_position_control();
        let bw = self.wbs[b.index()].rates.avg_write_bandwidth;
        let f = &self.wbs[b.index()].flusher;
        let chunk = f.chunk_size(ioless, bw, self.dirty_limit);
        let sync_all = f.current_sync_all();
        let meta = self.inode_mut(inode);
        meta.syncing = Some(Issuer::Flusher);
        // A due retry of held pages takes them too, from the start of the file.
        let retry_held = std::mem::take(&mut meta.retry_held);
        let next_index = if sync_all || retry_held { 0 } else { meta.writeback_index };
        if retry_held {
            self.stats.held_retries += 1;
        }
        maps.with(inode, |m| {
            m.set_inode_dirty(false);
            if sync_all {
                m.tag_dirty();
            }
        });
        self.stats.writepages_calls += 1;
        self.bandwidth_at_writepages(b);
        self.wbs[b.index()].flusher.start_chunk(inode);
        let class = if sync_all { IoClass::Sync } else { IoClass::Background };
        let skip_held = !sync_all && !retry_held;
        let sub = Submitter::new(inode, next_index, chunk, sync_all, skip_held, class);
        self.add_submitter(b, Issuer::Flusher, sub);
    }

    fn finish_work<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        let Some(work) = self.wbs[b.index()].flusher.finish_work() else { return };
        self.record(TraceEvent::WritebackWritten {
            bdi: b,
            written: work.written,
            reason: work.reason.name(),
        });
        if let Some(request) = work.sync_request {
            let last = IoId(self.next_io - 1);
            self.wbs[b.index()].flusher.wait_sync(request, last);
            self.sync_progress(b, maps);
        }
    }

    /// Starts the legacy writer's own writeback of up to `pages` pages on `b`: the kernel's
    /// `writeback_inodes_wb` from `balance_dirty_pages`, which takes files from the same lists
    /// as the flusher and skips a file the flusher is writing. Returns false if there was
    /// nothing it could write.
    pub(crate) fn legacy_writeback_start(&mut self, w: WriterId, b: BackendId, pages: u64) -> bool {
        if self.wbs[b.index()].flusher.io_empty() {
            self.queue_io(b, self.now);
        }
        let Some(inode) = self.pick_inode(b) else { return false };
        let meta = self.inode_mut(inode);
        meta.syncing = Some(Issuer::Writer(w));
        let next_index = meta.writeback_index;
        self.stats.writepages_calls += 1;
        self.add_submitter(
            b,
            Issuer::Writer(w),
            Submitter::new(inode, next_index, pages, false, true, IoClass::Background),
        );
        true
    }

    /// How large a file's last granule may be for the flusher's current work to leave it for
    /// later, or `None` if it may not (`crate::flusher::granules`): only background and
    /// periodic work, only for a file dirtied within the expire interval and not retrying a
    /// failed write, and only while the
    /// tails of all dirty files of granular backends fit in half the background threshold, so
    /// that deferred tails can never keep writeback from bringing the cache under it. The
    /// granule gate's admitted files always may (the gate bounds them); while writers wait for
    /// it, the others' tails are measured by what they hold.
    fn tail_budget(&self, b: BackendId, inode: InodeId) -> Option<granules::TailBudget> {
        self.cfg.backends[b.index()].write_granule_bytes?;
        if !self.wbs[b.index()].flusher.defers_tails() {
            return None;
        }
        let meta = self.inodes.get(&inode)?;
        if meta.last_dirtied + self.expire_interval() <= self.now {
            return None;
        }
        // A file whose write failed and is being retried (`retry_backoff` is reset by a
        // success) has its tail written like any page: the retries are reclaim-like works,
        // and deferring the tail meant an S3 file's data, one partly dirty part, was not
        // retried at all until it expired (issue 34: held data stranded after an outage).
        if meta.retry_backoff > Duration::ZERO {
            return None;
        }
        if let Some(filling) = self.gate.filling(inode) {
            // The gate keeps the admitted files' tails within half the background threshold.
            return Some(granules::TailBudget::Filling(filling));
        }
        // Every granular backend's dirty files, so that the tails of all of them together fit.
        let files: usize = self
            .wbs
            .iter()
            .zip(&self.cfg.backends)
            .filter(|(_, backend)| backend.write_granule_bytes.is_some())
            .map(|(wb, _)| wb.flusher.listed())
            .sum();
        let budget = self.global_thresholds().bg_thresh / 2 / (files as u64 + 1);
        Some(if self.gate.saturated() {
            granules::TailBudget::Extent(budget)
        } else {
            granules::TailBudget::Granule(budget)
        })
    }
}
