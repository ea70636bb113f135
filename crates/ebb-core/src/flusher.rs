//! The flusher: which files and pages to write, and when (docs/mechanisms.md#4-flusher).
//!
//! One flusher per backend runs works in order: queued works (sync, reclaim-requested), a
//! flush-all request, periodic writeback of data older than `dirty_expire_centisecs` every
//! `dirty_writeback_centisecs`, and background writeback while the backend is over its
//! background threshold. Files wait on three lists ordered as the kernel orders them: `dirty`
//! (by the time they became dirty), `io` (selected for the current pass) and `more_io` (chunk
//! used up, continue in the next pass, so large files take turns). Each file is written in
//! chunks of about half a second of bandwidth, at most 1/8 of the dirty limit, a multiple of 4
//! MiB; contiguous dirty pages go out as one write of up to `max_write_pages`.
//!
//! Sync works write only pages tagged when they reached the file and requeue a file written
//! during the sync as newly dirty, so a writer that keeps dirtying cannot make sync last forever
//! (livelock avoidance).
//!
//! Background writeback starts only when a writer's throttle check wakes the flusher
//! (`wb_start_background_writeback`); a wakeup that finds the backend at or under its background
//! threshold is spent, and the flusher sleeps again when a background work ends.
//!
//! Two-phase backends (docs/nfs.md): a file with unstable pages or COMMITs in flight
//! stays on the dirty list, as the NFS client marks the inode dirty for them, so every pass of a
//! work calls writepages on it even with nothing dirty (the kernel counts those calls too). A
//! call that wrote something commits once its writes have completed; one that wrote nothing
//! commits at once; with no write of the file in flight its write_inode step commits as well,
//! and what that commits counts as progress. Under `legacy-2020` accounting unstable pages count
//! toward the background threshold, so a background pass goes on past the call that took the
//! dirty pages into a call that finds none: two calls per wakeup.
//!
//! Submission is paced by the backend's request slots (`queue_depth`): a submitter (the
//! flusher, an fsync, or a legacy writer doing its own writeback) takes pages from its file only
//! when a slot is free, slots go round robin among submitters, and completions free them. So the
//! pages under writeback never exceed what the device has accepted, as with the block layer's
//! request tags.
//!
//! Write granules (ebb's own, for object stores): see [`granules`].

mod granules;

use std::collections::{BTreeMap, VecDeque};

use crate::engine::{Counters, Engine, InodeList, IoKind, IoRecord, PageMaps};
use crate::event::{Action, IoClass, Issuer};
use crate::ids::{BackendId, InodeId, IoId, RequestId, WriterId};
use crate::time::{Duration, Instant};
use crate::trace::TraceEvent;

/// Chunks are multiples of this many pages (4 MiB).
pub const MIN_WRITEBACK_PAGES: u64 = 1024;
/// The flusher's chunk is at most the dirty limit divided by this.
pub const DIRTY_SCOPE: u64 = 8;

/// Why the flusher runs a work (the kernel's `wb_reason` names, used in traces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Over the background threshold.
    Background,
    /// Reclaim found dirty pages and asked for them to be written.
    Vmscan,
    /// sync(2).
    Sync,
    /// Periodic writeback of old data.
    Periodic,
}

impl Reason {
    /// The kernel's trace name.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Background => "background",
            Reason::Vmscan => "vmscan",
            Reason::Sync => "sync",
            Reason::Periodic => "periodic",
        }
    }
}

/// A unit of flusher work (the kernel's `wb_writeback_work`).
#[derive(Clone, Debug)]
pub(crate) struct Work {
    pub(crate) nr_pages: u64,
    pub(crate) sync_all: bool,
    pub(crate) for_kupdate: bool,
    pub(crate) for_background: bool,
    pub(crate) reason: Reason,
    pub(crate) dirtied_before: Instant,
    pub(crate) sync_request: Option<RequestId>,
    pub(crate) pass_written: u64,
    pub(crate) passes: u64,
    pub(crate) written: u64,
}

impl Work {
    fn new(reason: Reason, nr_pages: u64, now: Instant) -> Work {
        Work {
            nr_pages,
            sync_all: false,
            for_kupdate: reason == Reason::Periodic,
            for_background: reason == Reason::Background,
            reason,
            dirtied_before: now,
            sync_request: None,
            pass_written: 0,
            passes: 0,
            written: 0,
        }
    }
}

/// One backend's flusher state.
pub(crate) struct Flusher {
    /// Dirty files by (time they became dirty, sequence), oldest first.
    pub(crate) dirty: BTreeMap<(Instant, u64), InodeId>,
    pub(crate) io: VecDeque<InodeId>,
    pub(crate) more_io: VecDeque<InodeId>,
    pub(crate) works: VecDeque<Work>,
    pub(crate) current: Option<Work>,
    /// The file whose chunk the flusher is submitting.
    pub(crate) active: Option<InodeId>,
    pub(crate) start_all: bool,
    /// Legacy policy only: the last chunk ended on a congested queue, so, as pdflush did, back
    /// off and pick the next file only when a slot frees; a throttled writer may take the file
    /// in between.
    pub(crate) wait_slot: bool,
    pub(crate) wake_periodic: bool,
    /// Woken for background writeback (`wb_start_background_writeback`): a background work
    /// may start. The flusher sleeps again when a background work ends, as the kernel's does,
    /// so how often writers wake it (which depends on the accounting policy) matters.
    pub(crate) awake: bool,
    pub(crate) last_old_flush: Instant,
    pub(crate) timer: Option<Instant>,
    /// Syncs waiting for every write up to this IO to finish.
    pub(crate) sync_waits: BTreeMap<RequestId, IoId>,
}

impl Flusher {
    pub(crate) fn new(now: Instant) -> Flusher {
        Flusher {
            dirty: BTreeMap::new(),
            io: VecDeque::new(),
            more_io: VecDeque::new(),
            works: VecDeque::new(),
            current: None,
            active: None,
            start_all: false,
            wait_slot: false,
            wake_periodic: false,
            awake: false,
            last_old_flush: now,
            timer: None,
            sync_waits: BTreeMap::new(),
        }
    }
}

/// One submitter's position in a file.
#[derive(Clone, Debug)]
pub(crate) struct Submitter {
    pub(crate) inode: InodeId,
    pub(crate) next_index: u64,
    pub(crate) chunk_left: u64,
    pub(crate) tagged_only: bool,
    pub(crate) skip_held: bool,
    pub(crate) class: IoClass,
    pub(crate) written: u64,
}

impl Submitter {
    pub(crate) fn new(
        inode: InodeId,
        next_index: u64,
        chunk: u64,
        tagged_only: bool,
        skip_held: bool,
        class: IoClass,
    ) -> Submitter {
        Submitter {
            inode,
            next_index,
            chunk_left: chunk,
            tagged_only,
            skip_held,
            class,
            written: 0,
        }
    }
}

/// The writeback-throttling class of a submitter's writes.
fn wbt_class(issuer: Issuer, class: IoClass) -> crate::wbt::WbtClass {
    use crate::wbt::WbtClass;
    match (issuer, class) {
        (_, IoClass::Sync | IoClass::Reclaim) | (Issuer::Fsync(_) | Issuer::Reclaim, _) => {
            WbtClass::Sync
        }
        (Issuer::Writer(_), _) => WbtClass::Normal,
        _ => WbtClass::Background,
    }
}

impl Engine {
    pub(crate) fn add_submitter(&mut self, b: BackendId, issuer: Issuer, sub: Submitter) {
        let wb = &mut self.wbs[b.index()];
        let previous = wb.submitters.insert(issuer, sub);
        assert!(previous.is_none(), "{issuer:?} already submitting on backend {b}");
        wb.ready.push_back(issuer);
    }

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

    /// Issues writes while the backend has free request slots.
    fn pump<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) -> Vec<(Issuer, Submitter)> {
        let depth = self.cfg.backends[b.index()].queue_depth;
        let max_write = u64::from(self.cfg.backends[b.index()].max_write_pages);
        let mut finished = Vec::new();
        let mut held = Vec::new();
        let now = self.now;
        while self.wbs[b.index()].inflight < depth {
            let Some(issuer) = self.wbs[b.index()].ready.pop_front() else { break };
            let class =
                self.wbs[b.index()].submitters.get(&issuer).map(|s| wbt_class(issuer, s.class));
            let wb = &mut self.wbs[b.index()];
            if let Some(class) = class
                && !wb.wbt.may_issue(class, wb.write_inflight, now)
            {
                // Writeback throttling holds this class; others (sync) may still go.
                held.push(issuer);
                continue;
            }
            let sub = self.wbs[b.index()].submitters.get(&issuer).expect("ready submitter").clone();
            let tail_budget =
                if issuer == Issuer::Flusher { self.tail_budget(b, sub.inode) } else { None };
            // ebb's wbt variant writes smaller in the background while reads are active.
            let write =
                class.map_or(max_write, |c| self.wbs[b.index()].wbt.write_pages(c, max_write, now));
            let backend = &self.cfg.backends[b.index()];
            let max = write.min(sub.chunk_left);
            let (run, unheld) = maps.with(sub.inode, |m| {
                let run = granules::take_run(m, backend, &sub, max, tail_budget);
                (run, m.take_unheld())
            });
            let Some(run) = run else {
                // Nothing more past this point: the next pass over this file starts at 0.
                if let Some(meta) = self.inodes.get_mut(&sub.inode) {
                    meta.writeback_index = 0;
                }
                let sub = self.wbs[b.index()].submitters.remove(&issuer).expect("submitter");
                finished.push((issuer, sub));
                continue;
            };
            let io = self.new_io();
            let sync_all =
                self.wbs[b.index()].flusher.current.as_ref().is_some_and(|work| work.sync_all);
            let held_retry = unheld == run.count && issuer == Issuer::Flusher && !sync_all;
            self.ios.insert(
                io,
                IoRecord {
                    backend: b,
                    inode: sub.inode,
                    kind: IoKind::Write { run, issuer, held_retry },
                    issued: now,
                },
            );
            let meta = self.inode_mut(sub.inode);
            meta.inflight.insert(io);
            meta.writeback_index = run.end();
            self.wbs[b.index()].inflight += 1;
            self.wbs[b.index()].write_inflight += 1;
            self.wbs[b.index()].wbt.on_write_issue(now);
            self.account(
                sub.inode,
                Counters {
                    dirty: -(run.count as i64),
                    held: -(unheld as i64),
                    writeback: run.count as i64,
                    ..Counters::default()
                },
            );
            self.stats.writes += 1;
            self.stats.write_pages += run.count;
            if let Issuer::Writer(w) = issuer {
                *self.writer_ios.entry(w).or_insert(0) += 1;
                self.stats.writer_writeback_ios += 1;
                self.stats.writer_writeback_pages += run.count;
            }
            self.emit(Action::Write {
                io,
                backend: b,
                inode: sub.inode,
                first_page: run.first,
                pages: run.count,
                class: sub.class,
                issuer,
            });
            let wb = &mut self.wbs[b.index()];
            let s = wb.submitters.get_mut(&issuer).expect("submitter");
            s.next_index = run.end();
            // A granule is written whole, even past the chunk's end.
            s.chunk_left = s.chunk_left.saturating_sub(run.count);
            s.written += run.count;
            if s.chunk_left == 0 {
                let sub = wb.submitters.remove(&issuer).expect("submitter");
                finished.push((issuer, sub));
            } else {
                wb.ready.push_back(issuer);
            }
        }
        // Held submitters keep their turn order, ahead of any that were not reached.
        let wb = &mut self.wbs[b.index()];
        for issuer in held.into_iter().rev() {
            wb.ready.push_front(issuer);
        }
        finished
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
        self.writepages_sizes[bucket.min(crate::engine::WRITEPAGES_SIZE_BUCKETS - 1)] += 1;
        match issuer {
            Issuer::Flusher => {
                let sync_all =
                    self.wbs[b.index()].flusher.current.as_ref().is_some_and(|w| w.sync_all);
                let committed = self.requeue_inode(b, &sub, sync_all, maps);
                let depth = self.cfg.backends[b.index()].queue_depth;
                let full = self.wbs[b.index()].inflight >= depth;
                let f = &mut self.wbs[b.index()].flusher;
                f.active = None;
                // The legacy era's flusher (pdflush) wrote nonblocking and backed off while
                // the queue was congested, releasing the file; later flushers block holding it.
                f.wait_slot = sub.chunk_left == 0
                    && full
                    && self.cfg.throttle == crate::config::ThrottlePolicy::Legacy;
                if let Some(work) = f.current.as_mut() {
                    work.nr_pages = work.nr_pages.saturating_sub(sub.written + committed);
                    work.pass_written += sub.written + committed;
                    work.written += sub.written;
                }
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
        if counts.dirty == 0 {
            // Unstable pages or COMMITs in flight keep the file dirty (I_DIRTY_DATASYNC).
            let unstable = counts.unstable > 0 || !meta.commits_inflight.is_empty();
            if unstable {
                self.redirty_tail(b, inode);
            } else if meta.list != InodeList::None {
                self.unlist(b, inode);
            }
            return progress;
        }
        if integrity {
            meta.dirtied_when = now;
        }
        let retry_gated = meta.retry_at.is_some_and(|t| t > now);
        if sub.chunk_left == 0 && !retry_gated {
            self.unlist(b, inode);
            self.inode_mut(inode).list = InodeList::MoreIo;
            self.wbs[b.index()].flusher.more_io.push_back(inode);
        } else {
            self.redirty_tail(b, inode);
        }
        progress
    }

    /// Takes a file off whichever list it is on.
    pub(crate) fn unlist(&mut self, b: BackendId, inode: InodeId) {
        let meta = self.inodes.get_mut(&inode).expect("a known inode");
        let f = &mut self.wbs[b.index()].flusher;
        match meta.list {
            InodeList::None => {}
            InodeList::Dirty => {
                f.dirty.remove(&(meta.dirtied_when, meta.dirty_seq));
            }
            InodeList::Io => f.io.retain(|&i| i != inode),
            InodeList::MoreIo => f.more_io.retain(|&i| i != inode),
        }
        meta.list = InodeList::None;
    }

    /// Back to the dirty list, keeping it ordered by time (the kernel's `redirty_tail`).
    pub(crate) fn redirty_tail(&mut self, b: BackendId, inode: InodeId) {
        self.unlist(b, inode);
        let now = self.now;
        let newest = self.wbs[b.index()].flusher.dirty.keys().next_back().map(|k| k.0);
        self.dirty_seq += 1;
        let meta = self.inodes.get_mut(&inode).expect("a known inode");
        if newest.is_some_and(|t| meta.dirtied_when < t) {
            meta.dirtied_when = now;
        }
        meta.dirty_seq = self.dirty_seq;
        meta.list = InodeList::Dirty;
        let key = (meta.dirtied_when, meta.dirty_seq);
        self.wbs[b.index()].flusher.dirty.insert(key, inode);
    }

    /// Moves postponed files and files dirtied no later than `dirtied_before` to `io`.
    fn queue_io(&mut self, b: BackendId, dirtied_before: Instant) {
        let f = &mut self.wbs[b.index()].flusher;
        let mut moved = 0u64;
        let postponed: Vec<InodeId> = f.more_io.drain(..).collect();
        let mut expired = Vec::new();
        while let Some((&(when, seq), &inode)) = f.dirty.iter().next() {
            if when > dirtied_before {
                break;
            }
            f.dirty.remove(&(when, seq));
            expired.push(inode);
        }
        for inode in postponed.into_iter().chain(expired) {
            self.inode_mut(inode).list = InodeList::Io;
            self.wbs[b.index()].flusher.io.push_back(inode);
            moved += 1;
        }
        let reason =
            self.wbs[b.index()].flusher.current.as_ref().map_or(Reason::Background, |w| w.reason);
        self.record(TraceEvent::QueueIo { bdi: b, moved, reason: reason.name() });
    }

    /// Whether background writeback should run (the kernel's `wb_over_bg_thresh`).
    pub(crate) fn over_bg_thresh(&self, b: BackendId) -> bool {
        let t = self.global_thresholds();
        let legacy = self.cfg.unstable_accounting == crate::config::UnstableAccounting::Legacy2020;
        let global = self.global.writable() + if legacy { self.global.unstable() } else { 0 };
        if global > t.bg_thresh {
            return true;
        }
        let wb = &self.wbs[b.index()].counters;
        let wb_reclaimable = wb.writable() + if legacy { wb.unstable() } else { 0 };
        let seconds = &self.cfg.backends[b.index()];
        let bg = if seconds.dirty_seconds > 0 || seconds.dirty_background_seconds > 0 {
            self.wb_limits(b, t.thresh, t.bg_thresh).1
        } else {
            self.wb_thresh(b, t.bg_thresh)
        };
        wb_reclaimable > bg
    }

    /// The size of the next chunk of a file (the kernel's `writeback_chunk_size`).
    fn chunk_size(&self, b: BackendId, work: &Work) -> u64 {
        if work.sync_all {
            return u64::MAX;
        }
        if self.cfg.throttle != crate::config::ThrottlePolicy::Ioless {
            // Before v3.2 every chunk was MAX_WRITEBACK_PAGES.
            return MIN_WRITEBACK_PAGES.min(work.nr_pages.max(1));
        }
        let bw = self.wbs[b.index()].rates.avg_write_bandwidth;
        let chunk = (bw / 2).min(self.dirty_limit / DIRTY_SCOPE).min(work.nr_pages);
        (chunk + MIN_WRITEBACK_PAGES) / MIN_WRITEBACK_PAGES * MIN_WRITEBACK_PAGES
    }

    pub(crate) fn queue_sync_work(&mut self, b: BackendId, request: RequestId) {
        let mut work = Work::new(Reason::Sync, u64::MAX, self.now);
        work.sync_all = true;
        work.sync_request = Some(request);
        self.wbs[b.index()].flusher.works.push_back(work);
    }

    /// Wakes the flusher for background writeback (`wb_start_background_writeback`).
    pub(crate) fn wake_flusher(&mut self, b: BackendId) {
        self.wbs[b.index()].flusher.awake = true;
    }

    /// Whether the backend's flusher is running a work (`writeback_in_progress`).
    pub(crate) fn writeback_in_progress(&self, b: BackendId) -> bool {
        self.wbs[b.index()].flusher.current.is_some()
    }

    /// Asks the flusher to write `nr_pages` pages, oldest files first (2.6.3x-3.x direct
    /// reclaim's `wakeup_flusher_threads(total_scanned)`).
    pub(crate) fn queue_reclaim_work(&mut self, b: BackendId, nr_pages: u64) {
        let work = Work::new(Reason::Vmscan, nr_pages, self.now);
        self.wbs[b.index()].flusher.works.push_back(work);
    }

    /// Asks the flusher to write everything dirty (reclaim's `wakeup_flusher_threads`).
    pub(crate) fn start_all(&mut self, b: BackendId) {
        self.wbs[b.index()].flusher.start_all = true;
    }

    /// Picks the flusher's next work and file, if it is not busy with a chunk.
    fn flusher_step<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        let now = self.now;
        // Bounded: each turn starts a chunk, finishes a work, or returns.
        for turn in 0.. {
            assert!(
                turn < 1_000_000,
                "backend {b}: flusher loop does not settle: {:?}",
                self.wbs[b.index()].flusher.current
            );
            if self.wbs[b.index()].flusher.active.is_some() {
                return;
            }
            if self.wbs[b.index()].flusher.wait_slot {
                if self.wbs[b.index()].inflight >= self.cfg.backends[b.index()].queue_depth {
                    return;
                }
                self.wbs[b.index()].flusher.wait_slot = false;
            }
            if self.wbs[b.index()].flusher.current.is_none() && !self.pick_work(b) {
                return;
            }
            let over_bg = self.over_bg_thresh(b);
            let expire = self.expire_interval();
            let f = &mut self.wbs[b.index()].flusher;
            let yield_to_queued = !f.works.is_empty();
            let work = f.current.as_mut().expect("current work");
            if work.nr_pages == 0
                || ((work.for_background || work.for_kupdate) && yield_to_queued)
                || (work.for_background && !over_bg)
            {
                self.finish_work(b, maps);
                continue;
            }
            if work.for_kupdate {
                // Before one expire interval has passed nothing can be old enough.
                let Some(cutoff) = now.as_nanos().checked_sub(expire.as_nanos()) else {
                    self.finish_work(b, maps);
                    continue;
                };
                work.dirtied_before = Instant::from_nanos(cutoff);
            } else if work.for_background {
                work.dirtied_before = now;
            }
            let dirtied_before = work.dirtied_before;
            if f.io.is_empty() {
                if work.passes > 0 && work.pass_written == 0 && f.more_io.is_empty() {
                    // A whole pass wrote nothing (held pages, retry gates): stop.
                    self.finish_work(b, maps);
                    continue;
                }
                work.passes += 1;
                work.pass_written = 0;
                self.queue_io(b, dirtied_before);
            }
            match self.pick_inode(b) {
                Some(inode) => {
                    self.start_chunk(b, inode, maps);
                    return;
                }
                None => {
                    let f = &self.wbs[b.index()].flusher;
                    let all_busy = f.more_io.iter().all(|i| self.inodes[i].syncing.is_some());
                    if f.more_io.is_empty() || all_busy {
                        if f.more_io.is_empty() {
                            self.finish_work(b, maps);
                            continue;
                        }
                        // Wait for another submitter to finish with those files.
                        return;
                    }
                    let work = self.wbs[b.index()].flusher.current.as_mut().expect("work");
                    if work.pass_written == 0 {
                        self.finish_work(b, maps);
                        continue;
                    }
                }
            }
        }
    }

    fn pick_work(&mut self, b: BackendId) -> bool {
        let now = self.now;
        let interval = self.writeback_interval();
        let nr_dirty = self.global.dirty() + self.inodes.len() as u64;
        let over_bg = self.over_bg_thresh(b);
        let f = &mut self.wbs[b.index()].flusher;
        let work = if let Some(work) = f.works.pop_front() {
            Some(work)
        } else if f.start_all {
            f.start_all = false;
            Some(Work::new(Reason::Vmscan, nr_dirty, now))
        } else if f.wake_periodic && interval > Duration::ZERO && now >= f.last_old_flush + interval
        {
            f.wake_periodic = false;
            f.last_old_flush = now;
            // Files a finished work left queued count too (the kernel's `wb_has_dirty_io`).
            (!f.dirty.is_empty() || !f.more_io.is_empty() || !f.io.is_empty())
                .then(|| Work::new(Reason::Periodic, nr_dirty, now))
        } else if over_bg && f.awake {
            Some(Work::new(Reason::Background, u64::MAX, now))
        } else {
            None
        };
        match work {
            Some(work) => {
                self.stats.flusher_works += 1;
                self.record(TraceEvent::WritebackStart {
                    bdi: b,
                    nr_pages: work.nr_pages,
                    reason: work.reason.name(),
                    sync_all: work.sync_all,
                });
                self.wbs[b.index()].flusher.current = Some(work);
                true
            }
            None => {
                let f = &mut self.wbs[b.index()].flusher;
                f.wake_periodic = false;
                // A wakeup that finds the backend under its background threshold is spent.
                f.awake = false;
                let has_dirty = !f.dirty.is_empty() || !f.more_io.is_empty() || !f.io.is_empty();
                if has_dirty && f.timer.is_none() && interval > Duration::ZERO {
                    f.timer = Some(now + interval);
                }
                false
            }
        }
    }

    fn pick_inode(&mut self, b: BackendId) -> Option<InodeId> {
        let now = self.now;
        while let Some(inode) = self.wbs[b.index()].flusher.io.pop_front() {
            let meta = self.inodes.get_mut(&inode).expect("a known inode");
            if meta.list != InodeList::Io {
                continue;
            }
            if meta.syncing.is_some() {
                // Another submitter holds this file's chunk: try it in the next pass.
                meta.list = InodeList::MoreIo;
                self.wbs[b.index()].flusher.more_io.push_back(inode);
                continue;
            }
            // A file waiting to retry a failed write is left alone by background work, not by
            // a sync, which must try everything it covers (and report what fails).
            let integrity =
                self.wbs[b.index()].flusher.current.as_ref().is_some_and(|w| w.sync_all);
            if !integrity && meta.retry_at.is_some_and(|t| t > now) {
                self.redirty_tail(b, inode);
                continue;
            }
            return Some(inode);
        }
        None
    }

    fn start_chunk<M: PageMaps>(&mut self, b: BackendId, inode: InodeId, maps: &mut M) {
        let work = self.wbs[b.index()].flusher.current.clone().expect("work");
        let chunk = self.chunk_size(b, &work);
        let meta = self.inode_mut(inode);
        meta.syncing = Some(Issuer::Flusher);
        // A due retry of held pages takes them too, from the start of the file.
        let retry_held = std::mem::take(&mut meta.retry_held);
        let next_index = if work.sync_all || retry_held { 0 } else { meta.writeback_index };
        if retry_held {
            self.stats.held_retries += 1;
        }
        maps.with(inode, |m| {
            m.set_inode_dirty(false);
            if work.sync_all {
                m.tag_dirty();
            }
        });
        self.stats.writepages_calls += 1;
        self.bandwidth_at_writepages(b);
        self.wbs[b.index()].flusher.active = Some(inode);
        let class = if work.sync_all { IoClass::Sync } else { IoClass::Background };
        self.add_submitter(
            b,
            Issuer::Flusher,
            Submitter::new(
                inode,
                next_index,
                chunk,
                work.sync_all,
                !work.sync_all && !retry_held,
                class,
            ),
        );
    }

    fn finish_work<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        let Some(work) = self.wbs[b.index()].flusher.current.take() else { return };
        if work.for_background {
            // One background pass per wakeup.
            self.wbs[b.index()].flusher.awake = false;
        }
        self.record(TraceEvent::WritebackWritten {
            bdi: b,
            written: work.written,
            reason: work.reason.name(),
        });
        if let Some(request) = work.sync_request {
            let last = IoId(self.next_io - 1);
            self.wbs[b.index()].flusher.sync_waits.insert(request, last);
            self.sync_progress(b, maps);
        }
    }

    /// Starts the legacy writer's own writeback of up to `pages` pages on `b`: the kernel's
    /// `writeback_inodes_wb` from `balance_dirty_pages`, which takes files from the same lists
    /// as the flusher and skips a file the flusher is writing. Returns false if there was
    /// nothing it could write.
    pub(crate) fn legacy_writeback_start(&mut self, w: WriterId, b: BackendId, pages: u64) -> bool {
        if self.wbs[b.index()].flusher.io.is_empty() {
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
}

impl crate::pagemap::PageMap {
    /// Sets or clears the file's dirty mark (the kernel's `I_DIRTY_PAGES`): the flusher clears
    /// it when it takes the file and sets it again if pages stay dirty.
    pub fn set_inode_dirty(&mut self, dirty: bool) {
        self.inode_dirty_flag(dirty);
    }
}
