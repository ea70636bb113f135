//! The engine: the state of one cache and the handlers of every event.
//!
//! `Engine` owns everything shared: counters for the cache, each backend and each group; the
//! backends' writeback state (bandwidth, ratelimits, flusher, submission queues); file
//! metadata; frames and LRU lists; in-flight IO; fsync, sync and read requests. The pages of
//! each file live in a [`PageMap`] the driver keeps (so the runtime can lock files separately)
//! and lends to the engine through [`PageMaps`] when a decision needs them.
//!
//! Inputs: events ([`Engine::handle`]), a writer's steps ([`Engine::writer_step`]) and a few
//! direct calls, each listed in ARCHITECTURE.md's table of the engine's inputs; outputs:
//! [`Engine::poll_action`], [`Engine::poll_timeout`]. `now` must never go backwards.
//!
//! # Write-error policy
//!
//! A failed write never loses data: its pages stay cached. What happens next depends on the
//! error's [`ErrorClass`]:
//!
//! | class | errno | pages | retried | reported (once per handle, errseq) |
//! |---|---|---|---|---|
//! | `Retry` | EIO and the rest | dirty | after [`RETRY_BACKOFF_MIN`] doubling to [`RETRY_BACKOFF_MAX`] | at the next fsync or close |
//! | `Outage` | refused, reset, timed-out connections, EAGAIN | dirty | as `Retry`, but at most [`OUTAGE_PROBE_MAX`] apart (each retry probes the server) | only as EIO, once the backend has failed for `retry_timeout_secs` without a success; fsync waits for retries until then |
//! | `Hold` | ENOSPC, EROFS, EDQUOT, EFBIG, ESTALE, EACCES, EPERM, ENOENT | held: dirty, not counted by throttling, skipped by background writeback | after [`HOLD_BACKOFF_MIN`] doubling to [`RETRY_BACKOFF_MAX`], all of the file's held pages at once | at the next fsync or close |
//!
//! Only `Retry` and `Outage` failures keep background writeback away from the file until its
//! retry; after a `Hold` failure the file's new dirty data is written as usual (and held as
//! well if the backend refuses it too), so a writer is never throttled at a bandwidth of
//! nothing by pages waiting for a retry.
//!
//! So freeing space on a full backend lets its held pages drain within about half a minute,
//! and a server that comes back gets everything it missed. Two situations fail writers instead
//! of making them wait for something that may never come ([`crate::Verdict::Fail`]): held pages fill
//! the cache so no frame can be had (the write fails with the held errno), and the writer's
//! backend is past its retry timeout (a write that would be throttled fails with EIO). The
//! kernel has no such rule: it drops pages after a write error and marks the mapping; ebb keeps
//! them, so it must bound how long a writer waits on them.

/// First retry after a write that may pass failed: short, as most such failures are brief.
pub(crate) const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// First retry of held pages: longer, as each retry rewrites all of a file's held pages and
/// the condition (a full or read-only backend) passes only when someone acts.
pub(crate) const HOLD_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait between retries of one file (the backoff doubles up to it).
pub(crate) const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The longest wait between retries of one file while its backend cannot be reached: each retry is
/// the probe that finds the server back, so writers go on within this of its return (issue 34 asks
/// 5 s; with 30 s they waited 22-30 s). A retry against a server that is down fails at once
/// (refused) or after its transport's timeout, so probing this often costs little.
pub(crate) const OUTAGE_PROBE_MAX: Duration = Duration::from_secs(2);

mod accounting;
mod completion;
mod durable;
mod forget;
mod kswapd;
mod maps;
mod planted;
mod read;
mod reclaim;
mod recommit;
mod sync;
mod throttle;
mod timer;
mod truncate;
mod views;
mod writeback;
mod writer_call;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use maps::{MapStore, PageMaps};
pub use planted::CoreBug;

use crate::bandwidth::Rates;
use crate::config::{Config, ConfigError};
use crate::event::{Action, Event, IoError, Issuer};
use crate::flusher::{Flusher, Submissions};
use crate::fprop::{EventProportions, Local, Proportions};
use crate::ids::{BackendId, FrameId, GroupId, HandleId, InodeId, IoId, RequestId, WriterId};
use crate::memory::{List, Memory};
use crate::pagemap::{CommitBatch, Run};
use crate::stats::{FileErrors, Stats};
use crate::time::{Duration, Instant};
use crate::trace::TraceEvent;
use crate::writer::Writer;

/// Buckets of [`Engine::writepages_sizes`]: up to 2^31 pages per call.
pub const WRITEPAGES_SIZE_BUCKETS: usize = 32;
/// Page counts by state, signed: between throttle checks a writer's batch is not yet folded in,
/// so a count may dip below zero briefly (the kernel's per-CPU counter error). Reads clamp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) dirty: i64,
    /// Dirty pages held by a write error that will not pass; writeback will not reduce them,
    /// so throttling does not count them (they still occupy memory).
    pub(crate) held: i64,
    pub(crate) writeback: i64,
    pub(crate) unstable: i64,
    pub(crate) resident: i64,
    pub(crate) dirtied: u64,
    pub(crate) written: u64,
}

impl Counters {
    pub(crate) fn dirty(&self) -> u64 {
        self.dirty.max(0) as u64
    }
    /// Dirty pages writeback can clean (dirty minus held).
    pub(crate) fn writable(&self) -> u64 {
        (self.dirty - self.held).max(0) as u64
    }
    pub(crate) fn writeback(&self) -> u64 {
        self.writeback.max(0) as u64
    }
    pub(crate) fn unstable(&self) -> u64 {
        self.unstable.max(0) as u64
    }
}

pub(crate) struct InodeMeta {
    pub(crate) backend: BackendId,
    pub(crate) group: GroupId,
    /// When a writer last dirtied pages of the file (folded in from its batch): on a
    /// backend with write granules, a file written within the expire interval is still
    /// growing, and its last granule waits.
    pub(crate) last_dirtied: Instant,
    /// The submitter currently writing this file's chunk (the kernel's `I_SYNC`).
    pub(crate) syncing: Option<Issuer>,
    pub(crate) writeback_index: u64,
    pub(crate) inflight: BTreeSet<IoId>,
    /// COMMITs in flight. They may overlap: each covers the unstable pages no earlier one
    /// covers (the NFS client sends one whenever a batch of writes completes, without waiting
    /// for the previous one).
    pub(crate) commits_inflight: BTreeSet<IoId>,
    /// Two-phase backends: each writepages call that wrote something leaves a mark at its last
    /// write; a COMMIT goes out once every write up to the oldest mark has completed (the
    /// kernel's NFS commits after the writes of each writepages call, even with later writes
    /// in flight).
    pub(crate) commit_marks: VecDeque<IoId>,
    /// Commit now (sync, fsync, or a writepages call that wrote nothing).
    pub(crate) commit_now: bool,
    /// A writepages call's writes completed but its COMMIT waits for a larger batch
    /// (`commit_batch_ratio`): sent once the file's unstable pages reach the batch or no write
    /// of the file is in flight.
    pub(crate) commit_deferred: bool,
    pub(crate) handles: u32,
    pub(crate) err_seq: u64,
    pub(crate) err: Option<IoError>,
    pub(crate) err_unseen: bool,
    /// When background writeback may try the file again after a write error that may pass
    /// (`Retry`, `Outage`); until then it leaves the file alone.
    pub(crate) retry_at: Option<Instant>,
    /// When the file's held pages are tried again (`Hold`). Its other dirty pages are not
    /// gated: new data is written as usual (and held too if the backend refuses it), so a
    /// writer fills the cache with held pages and fails instead of being throttled at a
    /// bandwidth of nothing.
    pub(crate) hold_retry_at: Option<Instant>,
    pub(crate) retry_backoff: Duration,
    /// Its held pages are due for another try: the flusher's next chunk of the file takes
    /// them too (write-error policy, module doc).
    pub(crate) retry_held: bool,
    /// Runs written but not synced (`durable.rs`).
    pub(crate) durability: durable::Durability,
    pub(crate) page_waiters: Vec<WriterId>,
    pub(crate) last_read_end: u64,
    pub(crate) readahead: u64,
    /// Reads in flight: first page -> (one past the last page, io).
    pub(crate) reading: BTreeMap<u64, (u64, IoId)>,
    /// Ranges the driver is changing in the backend behind the cache ([`Event::Invalidate`]
    /// to [`Event::InvalidateDone`]): reads bring no page of them into the cache.
    pub(crate) invalidating: Vec<Run>,
    /// Unstable pages, as folded into the counters (`Engine::account`): while positive the
    /// file is in its backend's `unstable_files`.
    pub(crate) unstable: i64,
}

/// One backend's writeback state (the kernel's `bdi_writeback`).
pub(crate) struct Wb {
    pub(crate) counters: Counters,
    pub(crate) rates: Rates,
    pub(crate) share: Local,
    pub(crate) dirty_exceeded: bool,
    /// Requests in flight (writes and reads).
    pub(crate) inflight: u32,
    pub(crate) submissions: Submissions,
    pub(crate) flusher: Flusher,
    pub(crate) verifiers: Vec<u64>,
    pub(crate) last_completion: Instant,
    /// When the delayed bandwidth update is due: armed, if not already, when a write leaves an
    /// inode with nothing in flight (the kernel's `bw_dwork`,
    /// docs/mechanisms.md#bandwidth-and-ratelimit-estimation).
    pub(crate) bw_update_at: Option<Instant>,
    /// The last `ioless` throttle check past freerun: while one came within
    /// `BANDWIDTH_INTERVAL`, the throttled writers update the estimates (with the ratelimit)
    /// and the bandwidth-only updates hold off (`Engine::writers_update_rates`).
    pub(crate) throttled_at: Option<Instant>,
    /// Writeback throttling and the writes it counts (all writes in flight).
    pub(crate) wbt: crate::wbt::Wbt,
    pub(crate) write_inflight: u32,
    /// The backend's one outage clock (`crate::outage`): since when every write, COMMIT
    /// and request to it has failed with an [`ErrorClass::Outage`] error.
    pub(crate) outage: crate::outage::OutageClock,
    /// The outage outlasted `retry_timeout_secs`: EIO was recorded on its files, fsync and
    /// close report it, and writers that would be throttled fail.
    pub(crate) outage_reported: bool,
    /// The files with unstable pages folded into the counters (a superset of those whose page
    /// map has some: a writer's redirtying folds in later): what a sync commits, found
    /// without looking at the backend's other files.
    pub(crate) unstable_files: BTreeSet<InodeId>,
}

impl Wb {
    /// A backend's writeback state at `now` (`now_j` in jiffies), its bandwidth estimate
    /// seeded as `initial_write_bandwidth` says.
    fn new(b: &crate::config::BackendConfig, now: Instant, now_j: u64) -> Wb {
        let mut rates = Rates::new(now_j);
        if let Some(bytes_per_sec) = b.initial_bandwidth_bytes() {
            rates.seed(bytes_per_sec / crate::config::PAGE_SIZE);
        }
        Wb {
            counters: Counters::default(),
            rates,
            share: Local::default(),
            dirty_exceeded: false,
            inflight: 0,
            submissions: Submissions::default(),
            flusher: Flusher::new(now),
            verifiers: Vec::new(),
            last_completion: now,
            bw_update_at: None,
            throttled_at: None,
            wbt: crate::wbt::Wbt::for_backend(b),
            write_inflight: 0,
            outage: crate::outage::OutageClock::new(
                Duration::from_nanos(b.retry_timeout_secs.saturating_mul(1_000_000_000)),
                b.try_timeout_ms.map(Duration::from_millis),
            ),
            outage_reported: false,
            unstable_files: BTreeSet::new(),
        }
    }
}

pub(crate) enum IoKind {
    Write {
        /// Ascending, disjoint, not empty (`Action::Write`).
        runs: Vec<Run>,
        issuer: Issuer,
        /// Background writeback retrying pages that were all held already: if they are
        /// refused again (a `Hold` error) nothing new has failed, and no handle hears of it
        /// again (an fsync or sync retrying them reports its own failure).
        held_retry: bool,
    },
    /// `keep_below`: a truncate while the read was in flight; pages at or past it are stale
    /// and not inserted. `stale`: pages evicted while the read was in flight (they may have been
    /// rewritten and written back meanwhile, so the read's bytes for them may be older).
    Read { run: Run, frames: Vec<FrameId>, keep_below: u64, stale: Vec<u64> },
    /// The pages this COMMIT covers.
    Commit { batch: CommitBatch },
}

pub(crate) struct IoRecord {
    pub(crate) backend: BackendId,
    pub(crate) inode: InodeId,
    pub(crate) kind: IoKind,
    pub(crate) issued: Instant,
}

pub(crate) enum FsyncPhase {
    /// Writing the pages tagged when the fsync began.
    Writing,
    /// Waiting for every write in flight up to this IO.
    Waiting(IoId),
    /// Waiting for the file's COMMITs in flight up to this one.
    Committing(IoId),
    /// The backend could not be reached (an [`ErrorClass::Outage`] failure): waiting for the
    /// file's next retry, to write again, unless the outage reaches the backend's
    /// `retry_timeout_secs` first (then EIO).
    Retrying,
}

pub(crate) struct FsyncState {
    pub(crate) handle: HandleId,
    pub(crate) inode: InodeId,
    pub(crate) phase: FsyncPhase,
    /// A COMMIT redirtied pages (the server restarted): write them again before answering.
    pub(crate) rewrite: bool,
    /// A write or commit of the file failed because the backend was unreachable while this
    /// fsync ran: it waits for a retry instead of answering.
    pub(crate) outage: bool,
    /// This is the write-back of a close on a `flush_on_close` backend: answer with
    /// [`Action::CloseDone`] and forget the handle.
    pub(crate) closing: bool,
}

pub(crate) struct SyncState {
    pub(crate) backends_left: u32,
    pub(crate) error: Option<IoError>,
    /// The files that recorded a write error during this sync, with their last error.
    pub(crate) failed: BTreeMap<InodeId, IoError>,
    /// Backends where a COMMIT redirtied pages (the server restarted) during this sync: their
    /// part is written again before the sync answers.
    pub(crate) rewrite: BTreeSet<BackendId>,
    /// Backends that could not be reached during this sync ([`ErrorClass::Outage`]): their
    /// part is written again after a backoff, until the outage reaches its timeout.
    pub(crate) outage: BTreeSet<BackendId>,
    /// When each such backend's part is tried again.
    pub(crate) retry_at: BTreeMap<BackendId, Instant>,
}

pub(crate) struct ReadState {
    /// The reads (of this request or of readahead) whose pages the request needs.
    pub(crate) waiting: BTreeSet<IoId>,
    pub(crate) error: Option<IoError>,
}

/// Why a writer waits for [`Action::Resume`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitReason {
    /// Its own writeback IO (legacy policy).
    OwnWriteback,
    /// A page under writeback of this file.
    Page(InodeId),
    /// Free memory.
    Memory,
    /// A place in the granule gate (`throttle::gate`).
    Granule,
}

/// The writeback engine of one cache.
pub struct Engine {
    pub(crate) cfg: Config,
    pub(crate) hz: u64,
    pub(crate) now: Instant,
    pub(crate) actions: VecDeque<Action>,
    pub(crate) next_io: u64,
    pub(crate) global: Counters,
    pub(crate) groups: BTreeMap<GroupId, Counters>,
    pub(crate) wbs: Vec<Wb>,
    pub(crate) inodes: BTreeMap<InodeId, InodeMeta>,
    pub(crate) handles: BTreeMap<HandleId, (InodeId, u64)>,
    pub(crate) ios: BTreeMap<IoId, IoRecord>,
    pub(crate) mem: Memory,
    pub(crate) completions: Proportions,
    pub(crate) dirty_shares: EventProportions,
    pub(crate) dirty_limit: u64,
    pub(crate) dirty_limit_stamp: u64,
    pub(crate) waiters: BTreeMap<WriterId, WaitReason>,
    /// Which files may fill a write granule now, and who waits (`throttle::gate`).
    pub(crate) gate: throttle::GranuleGate,
    pub(crate) writer_ios: BTreeMap<WriterId, u32>,
    pub(crate) writer_written: BTreeMap<WriterId, u64>,
    pub(crate) fsyncs: BTreeMap<RequestId, FsyncState>,
    pub(crate) syncs: BTreeMap<RequestId, SyncState>,
    pub(crate) reads: BTreeMap<RequestId, ReadState>,
    pub(crate) stats: Stats,
    /// Writepages calls by the pages they wrote: entry `i` counts the calls that wrote
    /// `[2^(i-1), 2^i)` pages, entry 0 the calls that wrote none.
    pub(crate) writepages_sizes: [u64; WRITEPAGES_SIZE_BUCKETS],
    pub(crate) trace: Vec<(Instant, TraceEvent)>,
    pub(crate) min_ratio_sum: u32,
    /// kswapd's last batch was all unqueued dirty pages (the kernel's `PGDAT_DIRTY`).
    pub(crate) node_dirty: bool,
    /// The error of the last write whose pages were held: what a writer fails with when held
    /// pages fill the cache.
    pub(crate) last_hold: Option<IoError>,
    /// A bug the swarm's tests planted (`planted.rs`).
    pub(crate) planted: Option<CoreBug>,
    pub(crate) reclaim: crate::reclaim::ReclaimState,
    /// Files visited by [`Engine::poll_timeout`] (which takes `&self`) since the last event;
    /// folded into `Stats::files_visited` by the next one.
    pub(crate) visited: std::cell::Cell<u64>,
    /// The files' retry deadlines (`InodeMeta::retry_at`, `hold_retry_at`), earliest first:
    /// the timer finds what is due without looking at every file.
    pub(crate) retry_timers: BTreeSet<(Instant, InodeId)>,
    /// Files ever opened. The flusher's flush-all and periodic works are sized by the dirty
    /// pages plus this (the kernel's `get_nr_dirty_pages` adds its inode count); it is kept as
    /// it was before files could be forgotten, so no work's size changed.
    pub(crate) files_opened: u64,
    /// Frames handed to writers' reserves and not yet seen dirtied (folded by
    /// `apply_pending`) or given back: what [`Action::ReturnReserves`] could bring back, at most.
    pub(crate) reserved: u64,
    /// Files owed a commit after a failed close (`recommit.rs`, [`crate::recommit`]).
    pub(crate) recommits: crate::recommit::Recommits,
}

impl Engine {
    /// An engine for `config`, starting at time `now`. Fails if the configuration is invalid.
    pub fn new(config: Config, now: Instant) -> Result<Engine, ConfigError> {
        config.validate()?;
        let hz = config.hz;
        let now_j = now.jiffies(hz);
        let wbs = config.backends.iter().map(|b| Wb::new(b, now, now_j)).collect();
        let mem = Memory::new(&config);
        let memory_pages = config.memory_pages();
        let min_ratio_sum = config.backends.iter().map(|b| b.min_ratio).sum();
        let mut engine = Engine {
            hz,
            now,
            actions: VecDeque::new(),
            next_io: 1,
            global: Counters::default(),
            groups: BTreeMap::new(),
            wbs,
            inodes: BTreeMap::new(),
            handles: BTreeMap::new(),
            ios: BTreeMap::new(),
            mem,
            completions: Proportions::new(now),
            // 2.6.3x: a period of about twice the dirty limit, in events.
            dirty_shares: EventProportions::new(
                2 + crate::limits::ilog2((memory_pages / 5).max(2) - 1),
            ),
            dirty_limit: 0,
            dirty_limit_stamp: now_j,
            waiters: BTreeMap::new(),
            gate: Default::default(),
            writer_ios: BTreeMap::new(),
            writer_written: BTreeMap::new(),
            fsyncs: BTreeMap::new(),
            syncs: BTreeMap::new(),
            reads: BTreeMap::new(),
            stats: Stats::default(),
            writepages_sizes: [0; WRITEPAGES_SIZE_BUCKETS],
            trace: Vec::new(),
            min_ratio_sum,
            node_dirty: false,
            last_hold: None,
            planted: None,
            reclaim: crate::reclaim::ReclaimState::default(),
            visited: std::cell::Cell::new(0),
            retry_timers: BTreeSet::new(),
            files_opened: 0,
            reserved: 0,
            recommits: Default::default(),
            cfg: config,
        };
        engine.dirty_limit = engine.global_thresholds().thresh;
        Ok(engine)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The engine's counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// How many pages each writepages call wrote, as a histogram: entry `i` counts the calls
    /// that wrote `[2^(i-1), 2^i)` pages (entry 0: none). The 2020 NFS posting's measure.
    pub fn writepages_sizes(&self) -> &[u64; WRITEPAGES_SIZE_BUCKETS] {
        &self.writepages_sizes
    }

    /// Takes the next action, if any. Drivers drain this after every entry point.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Takes the trace events recorded since the last call (empty unless `Config::trace`).
    pub fn drain_trace(&mut self) -> Vec<(Instant, TraceEvent)> {
        std::mem::take(&mut self.trace)
    }

    /// The earliest instant at which the engine wants [`Event::Timer`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for (b, wb) in self.wbs.iter().enumerate() {
            consider(wb.flusher.timer());
            consider(wb.wbt.timer());
            consider(wb.wbt.pace_timer());
            consider(wb.bw_update_at);
            consider(self.outage_deadline(BackendId(b as u32)));
        }
        if let Some(&(t, _)) = self.retry_timers.first() {
            self.visited.set(self.visited.get() + 1);
            consider(Some(t));
        }
        for state in self.syncs.values() {
            consider(state.retry_at.values().min().copied());
        }
        consider(self.kswapd_timer());
        consider(self.gate_timer());
        consider(self.recommits.timer());
        next
    }

    pub(crate) fn advance(&mut self, now: Instant) {
        assert!(now >= self.now, "time went backwards: {now} after {}", self.now);
        self.now = now;
    }

    pub(crate) fn emit(&mut self, action: Action) {
        self.actions.push_back(action);
    }

    pub(crate) fn record(&mut self, event: TraceEvent) {
        if self.cfg.trace {
            self.trace.push((self.now, event));
        }
    }

    pub(crate) fn new_io(&mut self) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        id
    }

    /// Handles one event.
    pub fn handle<M: PageMaps>(&mut self, now: Instant, event: Event, maps: &mut M) {
        self.advance(now);
        self.stats.events += 1;
        self.stats.files_visited += self.visited.take();
        // The file the event may leave with nothing, and whether it was cut to nothing.
        let touched = match &event {
            Event::Close { handle, .. } => self.handles.get(handle).map(|&(i, _)| (i, false)),
            Event::Truncate { inode, first_page } => Some((*inode, *first_page == 0)),
            Event::WriteDone { io, .. }
            | Event::CommitDone { io, .. }
            | Event::ReadDone { io, .. } => self.ios.get(io).map(|r| (r.inode, false)),
            _ => None,
        };
        match event {
            Event::Open { handle, inode, backend } => self.open(handle, inode, backend, maps),
            Event::Close { handle, request } => {
                self.close(handle, request, maps);
                self.gate_sweep(maps);
            }
            Event::Fsync { handle, request } => self.fsync_start(handle, request, maps),
            Event::Sync { request } => self.sync_start(request, maps),
            Event::Read { inode, first_page, pages, request } => {
                self.read_start(inode, first_page, pages, request, maps)
            }
            Event::Truncate { inode, first_page } => self.truncate(inode, first_page, maps),
            Event::Invalidate { inode, first_page, pages } => {
                self.invalidate(inode, Run { first: first_page, count: pages })
            }
            Event::InvalidateDone { inode, first_page, pages } => {
                self.invalidate_done(inode, Run { first: first_page, count: pages })
            }
            Event::BackendChanged { inode } => self.backend_changed(inode, maps),
            Event::WriteDone { io, result } if self.is_swap_io(io) => {
                self.swap_done(io, result, maps)
            }
            Event::WriteDone { io, result } => self.write_done(io, result, maps),
            Event::CommitDone { io, result } => self.commit_done(io, result, maps),
            Event::FileSynced { inode, mark } => self.file_synced(inode, mark, maps),
            Event::FileSyncFailed { inode, error } => self.file_sync_done(inode, Err(error), maps),
            Event::ReadDone { io, result } => self.read_done(io, result, maps),
            Event::DirectReadStart { backend, id } => {
                if let Some(wb) = self.wbs.get_mut(backend.index()) {
                    wb.wbt.on_read_issue(now, id | (1 << 63));
                }
            }
            Event::DirectRead { backend, id, latency } => {
                if let Some(wb) = self.wbs.get_mut(backend.index()) {
                    wb.wbt.on_read_done(now, latency, Some(id | (1 << 63)));
                }
            }
            Event::AnonAlloc { pages } => {
                self.mem.add_anon(pages);
                self.kswapd(maps);
            }
            Event::AnonFree { pages } => {
                self.mem.sub_anon(pages);
                self.wake_memory_waiters(maps);
            }
            Event::Timer => self.timer(maps),
        }
        self.drive_all(maps);
        if let Some((inode, emptied)) = touched {
            self.recommit_touched(inode, emptied, maps);
            self.maybe_forget(inode, emptied, maps);
        }
    }

    /// Whether `inode` is known (has been opened).
    pub fn knows_inode(&self, inode: InodeId) -> bool {
        self.inodes.contains_key(&inode)
    }

    /// The backend of a known file.
    pub fn inode_backend(&self, inode: InodeId) -> Option<BackendId> {
        self.inodes.get(&inode).map(|m| m.backend)
    }

    /// Reclaim evicted page `index` of `inode`: a read in flight over it must not insert its
    /// (possibly older) bytes for that page.
    pub(crate) fn page_evicted(&mut self, inode: InodeId, index: u64) {
        let Some(meta) = self.inodes.get(&inode) else { return };
        let Some((_, &(end, io))) = meta.reading.range(..=index).next_back() else { return };
        if index < end
            && let Some(IoRecord { kind: IoKind::Read { stale, .. }, .. }) = self.ios.get_mut(&io)
        {
            stale.push(index);
        }
    }

    /// Whether `inode` has no IO in flight (writes, reads, commit): a driver may forget it.
    pub fn inode_idle(&self, inode: InodeId) -> bool {
        self.inodes.get(&inode).is_none_or(|m| {
            m.inflight.is_empty() && m.reading.is_empty() && m.commits_inflight.is_empty()
        })
    }

    /// The frames a read in flight fills: page `first_page + i` of [`Action::Read`] goes into
    /// `frames[i]`. `None` if `io` is not a read in flight. The driver copies the data in before
    /// it reports [`Event::ReadDone`]; nothing else uses these frames meanwhile.
    pub fn read_frames(&self, io: IoId) -> Option<&[FrameId]> {
        match &self.ios.get(&io)?.kind {
            IoKind::Read { frames, .. } => Some(frames),
            _ => None,
        }
    }

    /// The last write error recorded for a file, if any (queryable error state).
    pub fn inode_error(&self, inode: InodeId) -> Option<IoError> {
        self.inodes.get(&inode).and_then(|m| m.err)
    }

    /// A known file's error state: its last error, whether a handle has seen it, when its
    /// failed pages are retried, and how many dirty pages an error holds.
    pub fn file_errors<M: PageMaps>(&self, inode: InodeId, maps: &mut M) -> Option<FileErrors> {
        let meta = self.inodes.get(&inode)?;
        let counts = maps.with(inode, |m| m.counts());
        Some(FileErrors {
            error: meta.err,
            count: meta.err_seq,
            unseen: meta.err_unseen,
            retry_at: match (meta.retry_at, meta.hold_retry_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            held_pages: counts.held,
            dirty_pages: counts.dirty,
            commit_owed: self.recommits.owes(inode),
        })
    }

    /// Reports to `handle` a write error of its file it has not seen yet, once, marking it seen
    /// (errseq semantics): fsync and close answer with it, and drivers call it for a flush
    /// that does not close the handle (as `close(2)` reports on NFS).
    pub fn check_handle_error(&mut self, handle: HandleId) -> Result<(), IoError> {
        let Some(&(inode, seen)) = self.handles.get(&handle) else { return Ok(()) };
        let Some(meta) = self.inodes.get_mut(&inode) else { return Ok(()) };
        if meta.err_seq > seen {
            meta.err_unseen = false;
            self.handles.insert(handle, (inode, meta.err_seq));
            return Err(meta.err.expect("an error sequence implies an error"));
        }
        Ok(())
    }

    /// A write made a clean file dirty (`WriteStep::inode_became_dirty`): put it on its
    /// backend's dirty list so the flusher sees it (the kernel's `__mark_inode_dirty`).
    pub(crate) fn inode_dirtied(&mut self, now: Instant, inode: InodeId) {
        self.advance(now);
        self.mark_inode_dirty(inode);
    }

    /// The metadata of a file the engine knows (opened, never forgotten while it has pages or
    /// IO); a file it does not know here is a bug in the engine, not the driver's input.
    pub(crate) fn inode_mut(&mut self, inode: InodeId) -> &mut InodeMeta {
        self.inodes.get_mut(&inode).expect("a known inode")
    }

    /// Folds a writer's batched dirtying into the shared counters and LRU. A frame whose page
    /// was truncated meanwhile is not put on the LRU (truncate already freed it).
    pub(crate) fn apply_pending<M: PageMaps>(&mut self, w: &mut Writer, maps: &mut M) {
        for p in w.pending.drain(..) {
            let meta = self.inodes.get_mut(&p.inode).expect("writes go to opened inodes");
            if p.dirtied > 0 {
                meta.last_dirtied = self.now;
            }
            let listed = self.wbs[meta.backend.index()].flusher.is_listed(p.inode);
            if meta.group != w.group && !listed {
                meta.group = w.group;
            }
            let (b, g) = (meta.backend, meta.group);
            self.gate_dirtied(p.inode, p.dirtied);
            for c in [
                &mut self.global,
                &mut self.wbs[b.index()].counters,
                self.groups.entry(g).or_default(),
            ] {
                c.dirty += p.dirtied as i64;
                c.held -= p.unheld as i64;
                c.unstable -= p.from_unstable as i64;
                c.resident += p.new_pages as i64;
                c.dirtied += p.dirtied;
            }
            self.fold_unstable(p.inode, -(p.from_unstable as i64));
            if self.cfg.throttle.tracks_task_dirty_shares() {
                self.dirty_shares.add(&mut w.dirty_share, p.dirtied);
            }
        }
        self.reserved = self.reserved.saturating_sub(w.added.len() as u64);
        for (frame, inode, index) in w.added.drain(..) {
            let owned = maps.with(inode, |m| m.page(index).is_some_and(|p| p.frame == frame));
            if owned && self.mem.list_of(frame) == List::None {
                self.mem.add_to_lru(frame, inode, index);
            }
        }
    }

    /// Applies a change of page states of a file on `b` to every counter.
    pub(crate) fn account(&mut self, inode: InodeId, delta: Counters) {
        let meta = &self.inodes[&inode];
        let (b, g) = (meta.backend, meta.group);
        for c in
            [&mut self.global, &mut self.wbs[b.index()].counters, self.groups.entry(g).or_default()]
        {
            c.dirty += delta.dirty;
            c.held += delta.held;
            c.writeback += delta.writeback;
            c.unstable += delta.unstable;
            c.resident += delta.resident;
            c.dirtied += delta.dirtied;
            c.written += delta.written;
        }
        self.fold_unstable(inode, delta.unstable);
    }

    /// Adds `delta` to the file's unstable pages, keeping its backend's `unstable_files`.
    fn fold_unstable(&mut self, inode: InodeId, delta: i64) {
        if delta == 0 {
            return;
        }
        let Some(meta) = self.inodes.get_mut(&inode) else { return };
        meta.unstable += delta;
        let (b, listed) = (meta.backend, meta.unstable > 0);
        let set = &mut self.wbs[b.index()].unstable_files;
        if listed {
            set.insert(inode);
        } else {
            set.remove(&inode);
        }
    }

    /// Writer exits: its pending dirtying and reserved frames go back to the engine.
    pub fn writer_exit<M: PageMaps>(&mut self, now: Instant, w: &mut Writer, maps: &mut M) {
        self.advance(now);
        self.apply_pending(w, maps);
        self.take_reserve(w);
        self.waiters.remove(&w.id);
        self.reclaim_forget(w.id);
        self.gate_writer_exit(w, maps);
    }

    /// Folds a writer's batch into the shared counters without a throttle check (the kernel's
    /// periodic fold of per-CPU deltas); drivers call it for idle writers and before fsync.
    pub fn flush_writer<M: PageMaps>(&mut self, now: Instant, w: &mut Writer, maps: &mut M) {
        self.advance(now);
        self.apply_pending(w, maps);
    }
}
