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
//! and what that commits counts as progress. Under `legacy-2020` and `rfc-2020` accounting
//! unstable pages count toward the background threshold, so a background pass goes on past the
//! call that took the dirty pages into a call that finds none: two calls per wakeup.
//!
//! Submission is paced by the backend's request slots (`queue_depth`): a submitter (the
//! flusher, an fsync, or a legacy writer doing its own writeback) takes pages from its file only
//! when a slot is free, slots go round robin among submitters, and completions free them. So the
//! pages under writeback never exceed what the device has accepted, as with the block layer's
//! request tags.
//!
//! Write granules (ebb's own, for object stores): see [`granules`].
//!
//! This module owns the state: a backend's [`Flusher`] (its works and its files' places on
//! the three lists) and its [`Submissions`] (the submitters and their turn order). The engine
//! drives them (`engine/writeback.rs`): it hands in what they cannot know (the thresholds, the
//! bandwidth, a file's IO and error state) and carries out what they decide.

pub(crate) mod granules;

use std::collections::{BTreeMap, VecDeque};

use crate::event::{IoClass, Issuer};
use crate::ids::{InodeId, IoId, RequestId};
use crate::time::{Duration, Instant};

/// Chunks are multiples of this many pages (4 MiB).
pub(crate) const MIN_WRITEBACK_PAGES: u64 = 1024;
/// The flusher's chunk is at most the dirty limit divided by this.
pub(crate) const DIRTY_SCOPE: u64 = 8;

/// Why the flusher runs a work (the kernel's `wb_reason` names, used in traces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
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
    pub(crate) fn name(self) -> &'static str {
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
struct Work {
    nr_pages: u64,
    sync_all: bool,
    for_kupdate: bool,
    for_background: bool,
    reason: Reason,
    dirtied_before: Instant,
    sync_request: Option<RequestId>,
    pass_written: u64,
    passes: u64,
    written: u64,
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

/// A work as the engine traces it when it starts.
pub(crate) struct Started {
    pub(crate) nr_pages: u64,
    pub(crate) reason: Reason,
    pub(crate) sync_all: bool,
}

/// A work that ended: what it wrote, and the sync waiting for it, if any.
pub(crate) struct Finished {
    pub(crate) written: u64,
    pub(crate) reason: Reason,
    pub(crate) sync_request: Option<RequestId>,
}

/// What the current work does next ([`Flusher::advance_work`]).
pub(crate) enum Next {
    /// It is over: finish it.
    Finish,
    /// A new pass: move the files dirtied no later than this instant to the io list first.
    QueueIo(Instant),
    /// Take the next file of the io list.
    Pick,
}

/// What the current work does when the io list has nothing to take
/// ([`Flusher::after_empty_pick`]).
pub(crate) enum Exhausted {
    Finish,
    /// Every postponed file is being written by another submitter: wait for one to finish.
    Wait,
    /// Start another pass.
    Again,
}

/// Where a file taken from the io list goes ([`Flusher::pick_inode`]).
pub(crate) enum Pick {
    Take,
    /// Another submitter holds its chunk: to the next pass.
    Busy,
    /// It waits for a retry of a failed write: back to the dirty list.
    Gated,
}

/// Which of its backend's lists a file is on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum List {
    #[default]
    None,
    Dirty,
    Io,
    MoreIo,
}

/// A file's place on the lists: which one, and its key on the dirty list (kept while it is off
/// the lists, as the kernel's `dirtied_when` is).
#[derive(Clone, Copy, Debug, Default)]
struct Place {
    list: List,
    dirtied_when: Instant,
    seq: u64,
}

/// One backend's flusher state.
pub(crate) struct Flusher {
    /// Dirty files by (time they became dirty, sequence), oldest first.
    dirty: BTreeMap<(Instant, u64), InodeId>,
    io: VecDeque<InodeId>,
    more_io: VecDeque<InodeId>,
    /// Every file this flusher has listed, and where it is.
    places: BTreeMap<InodeId, Place>,
    /// The last sequence number given on the dirty list (orders files dirtied at one instant).
    seq: u64,
    works: VecDeque<Work>,
    current: Option<Work>,
    /// The file whose chunk the flusher is submitting.
    active: Option<InodeId>,
    start_all: bool,
    /// Legacy policy only: the last chunk ended on a congested queue, so, as pdflush did, back
    /// off and pick the next file only when a slot frees; a throttled writer may take the file
    /// in between.
    wait_slot: bool,
    wake_periodic: bool,
    /// Woken for background writeback (`wb_start_background_writeback`): a background work
    /// may start. The flusher sleeps again when a background work ends, as the kernel's does,
    /// so how often writers wake it (which depends on the accounting policy) matters.
    awake: bool,
    last_old_flush: Instant,
    timer: Option<Instant>,
    /// Syncs waiting for every write up to this IO to finish.
    sync_waits: BTreeMap<RequestId, IoId>,
}

impl Flusher {
    pub(crate) fn new(now: Instant) -> Flusher {
        Flusher {
            dirty: BTreeMap::new(),
            io: VecDeque::new(),
            more_io: VecDeque::new(),
            places: BTreeMap::new(),
            seq: 0,
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

    /// When the periodic wakeup is due.
    pub(crate) fn timer(&self) -> Option<Instant> {
        self.timer
    }

    /// The periodic wakeup came due by `now`: the next pick may start a periodic work.
    pub(crate) fn tick(&mut self, now: Instant) {
        if self.timer.is_some_and(|t| t <= now) {
            self.timer = None;
            self.wake_periodic = true;
        }
    }

    /// Whether `inode` is on one of the lists.
    /// Takes a file the engine forgets (nothing dirty, not being written) off its list and
    /// drops its place (the kernel's eviction takes an inode off the writeback lists).
    pub(crate) fn forget(&mut self, inode: InodeId) {
        debug_assert_ne!(self.active, Some(inode), "forgetting the file being written");
        self.unlist(inode);
        self.places.remove(&inode);
    }

    pub(crate) fn is_listed(&self, inode: InodeId) -> bool {
        self.places.get(&inode).is_some_and(|p| p.list != List::None)
    }

    /// How many files are on the lists.
    pub(crate) fn listed(&self) -> usize {
        self.dirty.len() + self.io.len() + self.more_io.len()
    }

    fn place(&mut self, inode: InodeId) -> &mut Place {
        self.places.entry(inode).or_default()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// A file became dirty (the kernel's `__mark_inode_dirty`): onto the dirty list unless it
    /// is on a list already (never repositioned). The first dirty file arms the periodic
    /// wakeup `period` later, if there is one.
    pub(crate) fn mark_dirty(&mut self, inode: InodeId, now: Instant, period: Option<Duration>) {
        if self.is_listed(inode) {
            // Already dirty, or queued by the flusher, which requeues it.
            return;
        }
        let seq = self.next_seq();
        *self.place(inode) = Place { list: List::Dirty, dirtied_when: now, seq };
        let was_empty = self.dirty.is_empty();
        let replaced = self.dirty.insert((now, seq), inode);
        invariant!(replaced.is_none(), "inode {inode} took the dirty-list key of {replaced:?}");
        if let Some(period) = period
            && was_empty
            && self.timer.is_none()
        {
            // First dirty file of the backend: wake the flusher one period later.
            self.timer = Some(now + period);
        }
    }

    /// Takes a file off whichever list it is on.
    pub(crate) fn unlist(&mut self, inode: InodeId) {
        let place = *self.place(inode);
        let removed = match place.list {
            List::None => 1,
            List::Dirty => {
                let at = self.dirty.remove(&(place.dirtied_when, place.seq));
                usize::from(at == Some(inode))
            }
            List::Io => remove_all(&mut self.io, inode),
            List::MoreIo => remove_all(&mut self.more_io, inode),
        };
        // A file the flusher picked is off the io list while its place still says io.
        let expected = if place.list == List::Io { 0..=1 } else { 1..=1 };
        invariant!(
            expected.contains(&removed),
            "inode {inode} was {removed} times on the {:?} list",
            place.list
        );
        self.place(inode).list = List::None;
    }

    /// Back to the dirty list, keeping it ordered by time (the kernel's `redirty_tail`).
    pub(crate) fn redirty_tail(&mut self, inode: InodeId, now: Instant) {
        self.unlist(inode);
        let newest = self.dirty.keys().next_back().map(|k| k.0);
        let seq = self.next_seq();
        let place = self.place(inode);
        if newest.is_some_and(|t| place.dirtied_when < t) {
            place.dirtied_when = now;
        }
        place.seq = seq;
        place.list = List::Dirty;
        let key = (place.dirtied_when, seq);
        let replaced = self.dirty.insert(key, inode);
        invariant!(replaced.is_none(), "inode {inode} took the dirty-list key of {replaced:?}");
    }

    /// To the end of the next pass (its chunk used up, so large files take turns).
    pub(crate) fn postpone(&mut self, inode: InodeId) {
        self.unlist(inode);
        self.place(inode).list = List::MoreIo;
        self.more_io.push_back(inode);
    }

    /// An integrity pass wrote the file: it counts as dirtied `now`.
    pub(crate) fn set_dirtied_when(&mut self, inode: InodeId, now: Instant) {
        self.place(inode).dirtied_when = now;
    }

    /// Moves postponed files and files dirtied no later than `dirtied_before` to `io`; returns
    /// how many moved.
    pub(crate) fn queue_io(&mut self, dirtied_before: Instant) -> u64 {
        let postponed: Vec<InodeId> = self.more_io.drain(..).collect();
        let mut expired = Vec::new();
        while let Some((&(when, seq), &inode)) = self.dirty.iter().next() {
            if when > dirtied_before {
                break;
            }
            self.dirty.remove(&(when, seq));
            expired.push(inode);
        }
        let mut moved = 0;
        for inode in postponed.into_iter().chain(expired) {
            let from = self.place(inode).list;
            invariant!(
                matches!(from, List::MoreIo | List::Dirty),
                "inode {inode} queued for IO from the {from:?} list"
            );
            self.place(inode).list = List::Io;
            self.io.push_back(inode);
            moved += 1;
        }
        moved
    }

    /// Whether the io list is empty.
    pub(crate) fn io_empty(&self) -> bool {
        self.io.is_empty()
    }

    /// The next file of the io list to write; `check` says whether another submitter holds
    /// the file and whether it waits for a retry (which only an integrity work overrides).
    pub(crate) fn pick_inode(
        &mut self,
        now: Instant,
        mut check: impl FnMut(InodeId) -> Pick,
    ) -> Option<InodeId> {
        let integrity = self.current_sync_all();
        while let Some(inode) = self.io.pop_front() {
            if self.place(inode).list != List::Io {
                continue;
            }
            match check(inode) {
                Pick::Busy => {
                    self.place(inode).list = List::MoreIo;
                    self.more_io.push_back(inode);
                }
                // A file waiting to retry a failed write is left alone by background work, not
                // by a sync, which must try everything it covers (and report what fails).
                Pick::Gated if !integrity => self.redirty_tail(inode, now),
                Pick::Take | Pick::Gated => return Some(inode),
            }
        }
        None
    }

    /// The reason of the current work, for traces (background if none).
    pub(crate) fn reason(&self) -> Reason {
        self.current.as_ref().map_or(Reason::Background, |w| w.reason)
    }

    /// Whether a work is running (`writeback_in_progress`).
    pub(crate) fn busy(&self) -> bool {
        self.current.is_some()
    }

    /// Whether the current work is an integrity (sync) work.
    pub(crate) fn current_sync_all(&self) -> bool {
        self.current.as_ref().is_some_and(|w| w.sync_all)
    }

    /// Whether the current work may leave a file's last granule for later (background,
    /// periodic and reclaim's works: see [`granules`]). Reclaim's too: the tails it would
    /// write short are bounded (half the background threshold in all), and a tail's pages are
    /// a file's oldest dirty ones, the first that reclaim finds dirty at the end of its list.
    pub(crate) fn defers_tails(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|w| w.for_background || w.for_kupdate || w.reason == Reason::Vmscan)
    }

    /// Whether the flusher is submitting a chunk.
    pub(crate) fn submitting(&self) -> bool {
        self.active.is_some()
    }

    /// Whether the flusher waits for a request slot before its next file (legacy policy), given
    /// whether the backend's slots are all taken; a free slot ends the wait.
    pub(crate) fn waits_for_slot(&mut self, full: bool) -> bool {
        if self.wait_slot && !full {
            self.wait_slot = false;
        }
        self.wait_slot
    }

    /// Queues a sync(2) work for `request`.
    pub(crate) fn queue_sync(&mut self, request: RequestId, now: Instant) {
        let mut work = Work::new(Reason::Sync, u64::MAX, now);
        work.sync_all = true;
        work.sync_request = Some(request);
        self.works.push_back(work);
    }

    /// Queues a work writing `nr_pages` pages, oldest files first (2.6.3x-3.x direct reclaim's
    /// `wakeup_flusher_threads(total_scanned)`).
    pub(crate) fn queue_vmscan(&mut self, nr_pages: u64, now: Instant) {
        self.works.push_back(Work::new(Reason::Vmscan, nr_pages, now));
    }

    /// Asks for everything dirty to be written (reclaim's `wakeup_flusher_threads`).
    pub(crate) fn request_all(&mut self) {
        self.start_all = true;
    }

    /// Wakes the flusher for background writeback (`wb_start_background_writeback`).
    pub(crate) fn wake(&mut self) {
        self.awake = true;
    }

    fn has_dirty(&self) -> bool {
        !self.dirty.is_empty() || !self.more_io.is_empty() || !self.io.is_empty()
    }

    /// Starts the next work, if one is due: queued works first, then a flush-all request, a
    /// periodic work (every `period`), background writeback (woken and `over_bg`). With none,
    /// a wakeup is spent and the periodic timer armed while files are dirty.
    pub(crate) fn pick_work(
        &mut self,
        now: Instant,
        period: Duration,
        nr_dirty: u64,
        over_bg: bool,
    ) -> Option<Started> {
        let work = if let Some(work) = self.works.pop_front() {
            Some(work)
        } else if self.start_all {
            self.start_all = false;
            Some(Work::new(Reason::Vmscan, nr_dirty, now))
        } else if self.wake_periodic
            && period > Duration::ZERO
            && now >= self.last_old_flush + period
        {
            self.wake_periodic = false;
            self.last_old_flush = now;
            // Files a finished work left queued count too (the kernel's `wb_has_dirty_io`).
            self.has_dirty().then(|| Work::new(Reason::Periodic, nr_dirty, now))
        } else if over_bg && self.awake {
            Some(Work::new(Reason::Background, u64::MAX, now))
        } else {
            None
        };
        let Some(work) = work else {
            self.wake_periodic = false;
            // A wakeup that finds the backend under its background threshold is spent.
            self.awake = false;
            if self.has_dirty() && self.timer.is_none() && period > Duration::ZERO {
                self.timer = Some(now + period);
            }
            return None;
        };
        let started =
            Started { nr_pages: work.nr_pages, reason: work.reason, sync_all: work.sync_all };
        self.current = Some(work);
        Some(started)
    }

    /// The current work's next step at `now`: whether it is over (done, yielding to a queued
    /// work, or a background work under the threshold, `over_bg` false), starts a pass, or
    /// goes on with the io list. A periodic work covers files dirtied `expire` ago or earlier.
    pub(crate) fn advance_work(&mut self, now: Instant, expire: Duration, over_bg: bool) -> Next {
        let yield_to_queued = !self.works.is_empty();
        let work = self.current.as_mut().expect("current work");
        if work.nr_pages == 0
            || ((work.for_background || work.for_kupdate) && yield_to_queued)
            || (work.for_background && !over_bg)
        {
            return Next::Finish;
        }
        if work.for_kupdate {
            // Before one expire interval has passed nothing can be old enough.
            let Some(cutoff) = now.as_nanos().checked_sub(expire.as_nanos()) else {
                return Next::Finish;
            };
            work.dirtied_before = Instant::from_nanos(cutoff);
        } else if work.for_background {
            work.dirtied_before = now;
        }
        if !self.io.is_empty() {
            return Next::Pick;
        }
        if work.passes > 0 && work.pass_written == 0 && self.more_io.is_empty() {
            // A whole pass wrote nothing (held pages, retry gates): stop.
            return Next::Finish;
        }
        work.passes += 1;
        work.pass_written = 0;
        Next::QueueIo(work.dirtied_before)
    }

    /// The io list had nothing to take: finish the work, wait for the postponed files' other
    /// submitters (`busy`), or go on if this pass wrote something.
    pub(crate) fn after_empty_pick(&self, busy: impl Fn(InodeId) -> bool) -> Exhausted {
        if self.more_io.is_empty() {
            return Exhausted::Finish;
        }
        if self.more_io.iter().all(|&i| busy(i)) {
            return Exhausted::Wait;
        }
        if self.current.as_ref().expect("work").pass_written == 0 {
            Exhausted::Finish
        } else {
            Exhausted::Again
        }
    }

    /// The size of the next chunk of a file (the kernel's `writeback_chunk_size`): everything
    /// for a sync; `MIN_WRITEBACK_PAGES` before v3.2 (`ioless` false); else half a second of
    /// `bandwidth` (pages per second), at most the dirty limit (pages) over `DIRTY_SCOPE`,
    /// rounded up to a multiple of `MIN_WRITEBACK_PAGES`.
    pub(crate) fn chunk_size(&self, ioless: bool, bandwidth: u64, dirty_limit: u64) -> u64 {
        let work = self.current.as_ref().expect("work");
        if work.sync_all {
            return u64::MAX;
        }
        if !ioless {
            // Before v3.2 every chunk was MAX_WRITEBACK_PAGES.
            return MIN_WRITEBACK_PAGES.min(work.nr_pages.max(1));
        }
        let chunk = (bandwidth / 2).min(dirty_limit / DIRTY_SCOPE).min(work.nr_pages);
        (chunk + MIN_WRITEBACK_PAGES) / MIN_WRITEBACK_PAGES * MIN_WRITEBACK_PAGES
    }

    /// The flusher starts submitting a chunk of `inode`.
    pub(crate) fn start_chunk(&mut self, inode: InodeId) {
        self.active = Some(inode);
    }

    /// The flusher's chunk ended having written `written` pages (and committed `committed`,
    /// which count as progress); `wait_slot`: back off until a request slot frees.
    pub(crate) fn chunk_done(&mut self, written: u64, committed: u64, wait_slot: bool) {
        self.active = None;
        self.wait_slot = wait_slot;
        if let Some(work) = self.current.as_mut() {
            work.nr_pages = work.nr_pages.saturating_sub(written + committed);
            work.pass_written += written + committed;
            work.written += written;
        }
    }

    /// Ends the current work, if any; a background work spends the wakeup.
    pub(crate) fn finish_work(&mut self) -> Option<Finished> {
        let work = self.current.take()?;
        if work.for_background {
            // One background pass per wakeup.
            self.awake = false;
        }
        Some(Finished {
            written: work.written,
            reason: work.reason,
            sync_request: work.sync_request,
        })
    }

    /// A sync waits for every write of the backend up to `last`.
    pub(crate) fn wait_sync(&mut self, request: RequestId, last: IoId) {
        self.sync_waits.insert(request, last);
    }

    /// A sync no longer waits.
    pub(crate) fn end_sync_wait(&mut self, request: RequestId) {
        self.sync_waits.remove(&request);
    }

    /// The syncs waiting, with the last IO each waits for.
    pub(crate) fn sync_waits(&self) -> impl Iterator<Item = (RequestId, IoId)> + '_ {
        self.sync_waits.iter().map(|(&r, &io)| (r, io))
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

    /// The writeback-throttling class of this submitter's writes for `issuer`.
    pub(crate) fn wbt_class(&self, issuer: Issuer) -> crate::wbt::WbtClass {
        use crate::wbt::WbtClass;
        match (issuer, self.class) {
            (_, IoClass::Sync | IoClass::Reclaim) | (Issuer::Fsync(_) | Issuer::Reclaim, _) => {
                WbtClass::Sync
            }
            (Issuer::Writer(_), _) => WbtClass::Normal,
            _ => WbtClass::Background,
        }
    }
}

/// One backend's submitters and their turns: those waiting for a free request slot are
/// served round robin.
#[derive(Default)]
pub(crate) struct Submissions {
    submitters: BTreeMap<Issuer, Submitter>,
    ready: VecDeque<Issuer>,
}

impl Submissions {
    /// A new submitter, last in turn. Panics if `issuer` is already submitting here.
    pub(crate) fn add(&mut self, issuer: Issuer, sub: Submitter) {
        let previous = self.submitters.insert(issuer, sub);
        assert!(previous.is_none(), "{issuer:?} already submitting");
        self.ready.push_back(issuer);
    }

    /// Whether `issuer` is submitting here.
    pub(crate) fn has(&self, issuer: Issuer) -> bool {
        self.submitters.contains_key(&issuer)
    }

    /// The submitter whose turn it is, taken out of the turn order.
    pub(crate) fn next_turn(&mut self) -> Option<(Issuer, Submitter)> {
        let issuer = self.ready.pop_front()?;
        Some((issuer, self.submitters.get(&issuer).expect("ready submitter").clone()))
    }

    /// Submitters that writeback throttling held back take their turns again first, in the
    /// order they had.
    pub(crate) fn hold_back(&mut self, held: Vec<Issuer>) {
        for issuer in held.into_iter().rev() {
            self.ready.push_front(issuer);
        }
    }

    /// `issuer` has nothing more to write: it leaves.
    pub(crate) fn finish(&mut self, issuer: Issuer) -> Submitter {
        self.submitters.remove(&issuer).expect("submitter")
    }

    /// `issuer` wrote `pages` pages up to `end`: it leaves if that used up its chunk (a granule
    /// is written whole, even past the chunk's end), else takes its next turn last.
    pub(crate) fn wrote(&mut self, issuer: Issuer, end: u64, pages: u64) -> Option<Submitter> {
        let s = self.submitters.get_mut(&issuer).expect("submitter");
        s.next_index = end;
        s.chunk_left = s.chunk_left.saturating_sub(pages);
        s.written += pages;
        if s.chunk_left == 0 {
            return Some(self.finish(issuer));
        }
        self.ready.push_back(issuer);
        None
    }
}

impl crate::pagemap::PageMap {
    /// Sets or clears the file's dirty mark (the kernel's `I_DIRTY_PAGES`): the flusher clears
    /// it when it takes the file and sets it again if pages stay dirty.
    pub fn set_inode_dirty(&mut self, dirty: bool) {
        self.inode_dirty_flag(dirty);
    }
}

/// Takes every `inode` off `list`, returning how many there were (one, if the lists are right).
fn remove_all(list: &mut VecDeque<InodeId>, inode: InodeId) -> usize {
    let before = list.len();
    list.retain(|&i| i != inode);
    before - list.len()
}

#[cfg(test)]
mod tests {
    use super::Flusher;
    use crate::ids::InodeId;
    use crate::time::Instant;

    /// A file goes on the dirty list once, to the io list, and off it.
    #[test]
    fn a_file_moves_between_the_lists() {
        let mut f = Flusher::new(Instant::ZERO);
        f.mark_dirty(InodeId(1), Instant::ZERO, None);
        f.mark_dirty(InodeId(1), Instant::ZERO, None);
        assert_eq!(f.listed(), 1, "listed once");
        assert_eq!(f.queue_io(Instant::ZERO), 1);
        f.unlist(InodeId(1));
        assert_eq!(f.listed(), 0);
    }

    /// Planted: the io list holds the file twice (no operation does this; the test pushes it
    /// by hand); taking the file off finds it.
    #[test]
    #[should_panic(expected = "inode 1 was 2 times on the Io list")]
    fn a_file_listed_twice_is_caught() {
        let mut f = Flusher::new(Instant::ZERO);
        f.mark_dirty(InodeId(1), Instant::ZERO, None);
        assert_eq!(f.queue_io(Instant::ZERO), 1);
        f.io.push_back(InodeId(1));
        f.unlist(InodeId(1));
    }
}
