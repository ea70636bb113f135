//! The engine: the state of one cache and the handlers of every event.
//!
//! `Engine` owns everything shared: counters for the cache, each backend and each group; the
//! backends' writeback state (bandwidth, ratelimits, flusher, submission queues); file
//! metadata; frames and LRU lists; in-flight IO; fsync, sync and read requests. The pages of
//! each file live in a [`PageMap`] the driver keeps (so the runtime can lock files separately)
//! and lends to the engine through [`PageMaps`] when a decision needs them.
//!
//! Entry points: [`Engine::handle`] for events, [`Engine::balance_dirty_pages`] and
//! [`Engine::throttle_continue`] for writers, [`Engine::inode_dirtied`] when a write makes a
//! clean file dirty, [`Engine::poll_action`] and [`Engine::poll_timeout`] for outputs. Every
//! entry point takes `now`, which must never go backwards.
//!
//! # Write-error policy
//!
//! A failed write never loses data: its pages stay cached. What happens next depends on the
//! error's [`ErrorClass`]:
//!
//! | class | errno | pages | retried | reported (once per handle, errseq) |
//! |---|---|---|---|---|
//! | `Retry` | EIO and the rest | dirty | after [`RETRY_BACKOFF_MIN`] doubling to [`RETRY_BACKOFF_MAX`] | at the next fsync or close |
//! | `Outage` | refused, reset, timed-out connections, EAGAIN | dirty | as `Retry` | only as EIO, once the backend has failed for `retry_timeout_secs` without a success; fsync waits for retries until then |
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

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::bandwidth::Rates;
use crate::config::{Config, ConfigError};
use crate::event::{Action, ErrorClass, Event, IoClass, IoError, Issuer, Stability, errno};
use crate::flusher::{Flusher, Submitter};
use crate::fprop::{EventProportions, Local, Proportions};
use crate::ids::{BackendId, FrameId, GroupId, HandleId, InodeId, IoId, RequestId, WriterId};
use crate::memory::{List, Memory};
use crate::pagemap::{CommitBatch, PageMap, Run, WriteEnd};
use crate::stats::{BdiStats, FileErrors, MemInfo, Stats};
use crate::time::{Duration, Instant};
use crate::trace::TraceEvent;
use crate::writer::Writer;

/// Buckets of [`Engine::writepages_sizes`]: up to 2^31 pages per call.
pub const WRITEPAGES_SIZE_BUCKETS: usize = 32;
/// Gives the engine access to the page maps the driver keeps.
pub trait PageMaps {
    /// Runs `f` on the page map of `inode`, creating an empty one if the file has none yet.
    fn with<R>(&mut self, inode: InodeId, f: impl FnOnce(&mut PageMap) -> R) -> R;
}

/// Page maps in an ordered map: the simplest [`PageMaps`], used by the simulator and tests.
#[derive(Default)]
pub struct MapStore {
    maps: BTreeMap<InodeId, PageMap>,
}

impl MapStore {
    /// An empty store.
    pub fn new() -> MapStore {
        MapStore::default()
    }

    /// The map of `inode`, if it has one.
    pub fn get(&self, inode: InodeId) -> Option<&PageMap> {
        self.maps.get(&inode)
    }

    /// Every map.
    pub fn iter(&self) -> impl Iterator<Item = (InodeId, &PageMap)> {
        self.maps.iter().map(|(&i, m)| (i, m))
    }

    /// The map of `inode`, created if missing.
    pub fn get_mut(&mut self, inode: InodeId) -> &mut PageMap {
        self.maps.entry(inode).or_default()
    }
}

impl PageMaps for MapStore {
    fn with<R>(&mut self, inode: InodeId, f: impl FnOnce(&mut PageMap) -> R) -> R {
        f(self.maps.entry(inode).or_default())
    }
}

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

/// Where a file is on its backend's writeback lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InodeList {
    None,
    Dirty,
    Io,
    MoreIo,
}

pub(crate) struct InodeMeta {
    pub(crate) backend: BackendId,
    pub(crate) group: GroupId,
    pub(crate) dirtied_when: Instant,
    /// When a writer last dirtied pages of the file (folded in from its batch): on a
    /// backend with write granules, a file written within the expire interval is still
    /// growing, and its last granule waits.
    pub(crate) last_dirtied: Instant,
    pub(crate) dirty_seq: u64,
    pub(crate) list: InodeList,
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
    pub(crate) page_waiters: Vec<WriterId>,
    pub(crate) last_read_end: u64,
    pub(crate) readahead: u64,
    /// Reads in flight: first page -> (one past the last page, io).
    pub(crate) reading: BTreeMap<u64, (u64, IoId)>,
}

/// One backend's writeback state (the kernel's `bdi_writeback`).
pub(crate) struct Wb {
    pub(crate) counters: Counters,
    pub(crate) rates: Rates,
    pub(crate) share: Local,
    pub(crate) dirty_exceeded: bool,
    /// Requests in flight (writes and reads).
    pub(crate) inflight: u32,
    pub(crate) submitters: BTreeMap<Issuer, Submitter>,
    /// Submitters waiting for a free request slot, served round robin.
    pub(crate) ready: VecDeque<Issuer>,
    pub(crate) flusher: Flusher,
    pub(crate) verifiers: Vec<u64>,
    pub(crate) last_completion: Instant,
    /// When the delayed bandwidth update is due: armed, if not already, when a write leaves an
    /// inode with nothing in flight (the kernel's `bw_dwork`,
    /// docs/mechanisms.md#bandwidth-and-ratelimit-estimation).
    pub(crate) bw_update_at: Option<Instant>,
    /// Writeback throttling and the writes it counts (all writes in flight).
    pub(crate) wbt: crate::wbt::Wbt,
    pub(crate) write_inflight: u32,
    /// Since when every write or commit to this backend has failed with an
    /// [`ErrorClass::Outage`] error (`None` once one succeeds).
    pub(crate) outage_since: Option<Instant>,
    /// The outage outlasted `retry_timeout_secs`: EIO was recorded on its files, fsync and
    /// close report it, and writers that would be throttled fail.
    pub(crate) outage_reported: bool,
}

pub(crate) enum IoKind {
    Write {
        run: Run,
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
    pub(crate) err_seq_start: BTreeMap<InodeId, u64>,
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
    pub(crate) dirty_seq: u64,
    pub(crate) min_ratio_sum: u32,
    /// kswapd's last batch was all unqueued dirty pages (the kernel's `PGDAT_DIRTY`).
    pub(crate) node_dirty: bool,
    /// The error of the last write whose pages were held: what a writer fails with when held
    /// pages fill the cache.
    pub(crate) last_hold: Option<IoError>,
    pub(crate) reclaim: crate::reclaim::ReclaimState,
}

impl Engine {
    /// An engine for `config`, starting at time `now`. Fails if the configuration is invalid.
    pub fn new(config: Config, now: Instant) -> Result<Engine, ConfigError> {
        config.validate()?;
        let hz = config.hz;
        let now_j = now.jiffies(hz);
        let wbs = config
            .backends
            .iter()
            .map(|b| Wb {
                counters: Counters::default(),
                rates: {
                    let mut r = Rates::new(now_j);
                    if let Some(bytes_per_sec) = b.initial_write_bandwidth {
                        r.seed(bytes_per_sec / crate::config::PAGE_SIZE);
                    }
                    r
                },
                share: Local::default(),
                dirty_exceeded: false,
                inflight: 0,
                submitters: BTreeMap::new(),
                ready: VecDeque::new(),
                flusher: Flusher::new(now),
                verifiers: Vec::new(),
                last_completion: now,
                bw_update_at: None,
                wbt: crate::wbt::Wbt::new(
                    b.hw_queue_depth,
                    b.wbt_target_usec(),
                    b.wbt_window_usec,
                    b.write_cache,
                ),
                write_inflight: 0,
                outage_since: None,
                outage_reported: false,
            })
            .collect();
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
            writer_ios: BTreeMap::new(),
            writer_written: BTreeMap::new(),
            fsyncs: BTreeMap::new(),
            syncs: BTreeMap::new(),
            reads: BTreeMap::new(),
            stats: Stats::default(),
            writepages_sizes: [0; WRITEPAGES_SIZE_BUCKETS],
            trace: Vec::new(),
            dirty_seq: 0,
            min_ratio_sum,
            node_dirty: false,
            last_hold: None,
            reclaim: crate::reclaim::ReclaimState::default(),
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
        for wb in &self.wbs {
            consider(wb.flusher.timer);
            consider(wb.wbt.timer());
            consider(wb.bw_update_at);
            consider(self.outage_deadline(wb));
        }
        for meta in self.inodes.values() {
            consider(meta.retry_at);
            consider(meta.hold_retry_at);
        }
        for state in self.syncs.values() {
            consider(state.retry_at.values().min().copied());
        }
        consider(self.kswapd_timer());
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
        match event {
            Event::Open { handle, inode, backend } => self.open(handle, inode, backend),
            Event::Close { handle, request } => self.close(handle, request, maps),
            Event::Fsync { handle, request } => self.fsync_start(handle, request, maps),
            Event::Sync { request } => self.sync_start(request, maps),
            Event::Read { inode, first_page, pages, request } => {
                self.read_start(inode, first_page, pages, request, maps)
            }
            Event::Truncate { inode, first_page } => self.truncate(inode, first_page, maps),
            Event::WriteDone { io, result } if self.is_swap_io(io) => {
                self.swap_done(io, result, maps)
            }
            Event::WriteDone { io, result } => self.write_done(io, result, maps),
            Event::CommitDone { io, result } => self.commit_done(io, result, maps),
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
    }

    fn open(&mut self, handle: HandleId, inode: InodeId, backend: BackendId) {
        assert!(backend.index() < self.wbs.len(), "open on unknown backend {backend}");
        let meta = self.inodes.entry(inode).or_insert_with(|| InodeMeta {
            backend,
            group: GroupId(0),
            dirtied_when: Instant::ZERO,
            last_dirtied: Instant::ZERO,
            dirty_seq: 0,
            list: InodeList::None,
            syncing: None,
            writeback_index: 0,
            inflight: BTreeSet::new(),
            commits_inflight: BTreeSet::new(),
            commit_marks: VecDeque::new(),
            commit_now: false,
            handles: 0,
            err_seq: 0,
            err: None,
            err_unseen: false,
            retry_at: None,
            hold_retry_at: None,
            retry_backoff: Duration::ZERO,
            retry_held: false,
            page_waiters: Vec::new(),
            last_read_end: u64::MAX,
            readahead: 0,
            reading: BTreeMap::new(),
        });
        meta.handles += 1;
        // Errors nobody has seen yet are reported to the next opener too (errseq).
        let seen = if meta.err_unseen { meta.err_seq.saturating_sub(1) } else { meta.err_seq };
        self.handles.insert(handle, (inode, seen));
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
    pub fn inode_dirtied(&mut self, now: Instant, inode: InodeId) {
        self.advance(now);
        self.mark_inode_dirty(inode);
    }

    pub(crate) fn mark_inode_dirty(&mut self, inode: InodeId) {
        let now = self.now;
        let Some(meta) = self.inodes.get_mut(&inode) else {
            panic!("inode {inode} dirtied before it was opened");
        };
        if meta.list != InodeList::None {
            // Already dirty, or queued by the flusher, which requeues it: never reposition.
            return;
        }
        self.dirty_seq += 1;
        meta.dirtied_when = now;
        meta.dirty_seq = self.dirty_seq;
        meta.list = InodeList::Dirty;
        let b = meta.backend;
        let key = (now, self.dirty_seq);
        let interval = self.writeback_interval();
        let wb = &mut self.wbs[b.index()];
        let was_empty = wb.flusher.dirty.is_empty();
        wb.flusher.dirty.insert(key, inode);
        if was_empty && wb.flusher.timer.is_none() && self.cfg.dirty_writeback_centisecs > 0 {
            // First dirty file of the backend: wake the flusher one period later.
            wb.flusher.timer = Some(now + interval);
        }
    }

    pub(crate) fn writeback_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.cfg.dirty_writeback_centisecs) * 10)
    }

    pub(crate) fn expire_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.cfg.dirty_expire_centisecs) * 10)
    }

    /// Folds a writer's batched dirtying into the shared counters and LRU. A frame whose page
    /// was truncated meanwhile is not put on the LRU (truncate already freed it).
    pub(crate) fn apply_pending<M: PageMaps>(&mut self, w: &mut Writer, maps: &mut M) {
        for p in w.pending.drain(..) {
            let meta = self.inodes.get_mut(&p.inode).expect("writes go to opened inodes");
            if p.dirtied > 0 {
                meta.last_dirtied = self.now;
            }
            if meta.group != w.group && meta.list == InodeList::None {
                meta.group = w.group;
            }
            let (b, g) = (meta.backend, meta.group);
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
            if self.cfg.throttle != crate::config::ThrottlePolicy::Ioless {
                self.dirty_shares.add(&mut w.dirty_share, p.dirtied);
            }
        }
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
    }

    /// Writer exits: its pending dirtying and reserved frames go back to the engine.
    pub fn writer_exit<M: PageMaps>(&mut self, now: Instant, w: &mut Writer, maps: &mut M) {
        self.advance(now);
        self.apply_pending(w, maps);
        for frame in w.frames.drain(..) {
            self.mem.release(frame);
        }
        self.waiters.remove(&w.id);
        self.reclaim_forget(w.id);
    }

    /// Folds a writer's batch into the shared counters without a throttle check (the kernel's
    /// periodic fold of per-CPU deltas); drivers call it for idle writers and before fsync.
    pub fn flush_writer<M: PageMaps>(&mut self, now: Instant, w: &mut Writer, maps: &mut M) {
        self.advance(now);
        self.apply_pending(w, maps);
    }

    // ----- completions -----

    fn write_done<M: PageMaps>(
        &mut self,
        io: IoId,
        result: Result<Stability, IoError>,
        maps: &mut M,
    ) {
        let record =
            self.ios.remove(&io).unwrap_or_else(|| panic!("completion of unknown io {io}"));
        let IoKind::Write { run, issuer, held_retry } = record.kind else {
            panic!("io {io} is not a write")
        };
        let (b, inode) = (record.backend, record.inode);
        let now = self.now;
        let wb = &mut self.wbs[b.index()];
        wb.inflight -= 1;
        wb.write_inflight -= 1;
        wb.last_completion = now;
        let latency = now.saturating_since(record.issued);
        let inflight = wb.write_inflight;
        wb.wbt.on_write_done(now, latency, inflight);
        let end = match result {
            Ok(Stability::Stable) => WriteEnd::Stable,
            Ok(Stability::Unstable { verifier }) => {
                WriteEnd::Unstable(self.verifier_slot(b, verifier))
            }
            Err(e) => {
                self.stats.write_errors += 1;
                if held_retry && e.class() == ErrorClass::Hold {
                    self.stats.held_retries_failed += 1;
                    self.schedule_retry(inode, ErrorClass::Hold);
                } else {
                    self.write_failed(b, inode, e);
                }
                if e.class() == ErrorClass::Hold { WriteEnd::Hold } else { WriteEnd::Redirty }
            }
        };
        if result.is_ok() {
            self.backend_reached(b);
        }
        let out = maps.with(inode, |m| m.end_writeback(run, end));
        let mut delta = Counters {
            writeback: -(run.count as i64),
            dirty: out.redirtied as i64,
            held: if end == WriteEnd::Hold { out.redirtied as i64 } else { 0 },
            unstable: out.unstable as i64,
            resident: -(out.freed as i64),
            ..Counters::default()
        };
        let completed = out.cleaned + out.unstable;
        delta.written = completed;
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
        if out.inode_became_dirty || out.unstable > 0 {
            // Unstable pages keep the file on the dirty list until committed, as the NFS
            // client marks the inode dirty (I_DIRTY_DATASYNC) for them: the flusher's passes
            // call writepages on it and its write_inode step sends the COMMIT.
            self.mark_inode_dirty(inode);
        }
        let mut inode_idle = false;
        let held_left = result.is_ok() && maps.with(inode, |m| m.counts().held) > 0;
        if let Some(meta) = self.inodes.get_mut(&inode) {
            meta.inflight.remove(&io);
            inode_idle = meta.inflight.is_empty();
            if result.is_ok() {
                meta.retry_backoff = Duration::ZERO;
            }
            if held_left && meta.retry_at.is_none() && !meta.retry_held {
                meta.hold_retry_at = None;
                // The backend takes writes again: the rest of the held pages follow at once.
                meta.retry_held = true;
                self.wbs[b.index()].flusher.start_all = true;
            }
        }
        // The inode's writeback ended: a bandwidth update 200 ms later (BANDWIDTH_INTERVAL), so
        // that inodes finishing together share one. A pending one is not moved.
        let wb = &mut self.wbs[b.index()];
        if inode_idle && wb.bw_update_at.is_none() {
            wb.bw_update_at = Some(self.now + crate::bandwidth::BANDWIDTH_INTERVAL);
        }
        if let Issuer::Writer(w) = issuer {
            self.writer_io_done(w);
        }
        self.wake_page_waiters(inode);
        self.maybe_commit(inode, maps);
        self.fsync_progress(inode, maps);
        self.sync_progress(b, maps);
        self.wake_memory_waiters(maps);
    }

    fn verifier_slot(&mut self, b: BackendId, verifier: u64) -> u16 {
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
    fn write_failed(&mut self, b: BackendId, inode: InodeId, e: IoError) {
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
                wb.outage_since.get_or_insert(now);
                if self.cfg.backends[b.index()].retry_timeout_secs == 0 {
                    // No patience: reported like any failure.
                    self.record_error(inode, IoError { errno: errno::EIO });
                }
            }
        }
        self.schedule_retry(inode, e.class());
    }

    /// Records a write error on a file: every open handle will see it once.
    fn record_error(&mut self, inode: InodeId, e: IoError) {
        if let Some(meta) = self.inodes.get_mut(&inode) {
            meta.err_seq += 1;
            meta.err = Some(e);
            meta.err_unseen = true;
        }
    }

    /// Sets the file's next retry with exponential backoff: from [`RETRY_BACKOFF_MIN`]
    /// doubling to [`RETRY_BACKOFF_MAX`] for errors that may pass, from
    /// [`HOLD_BACKOFF_MIN`] for held pages (whose retry rewrites all of them).
    fn schedule_retry(&mut self, inode: InodeId, class: ErrorClass) {
        let now = self.now;
        let Some(meta) = self.inodes.get_mut(&inode) else { return };
        let first = if class == ErrorClass::Hold { HOLD_BACKOFF_MIN } else { RETRY_BACKOFF_MIN };
        meta.retry_backoff = if meta.retry_backoff == Duration::ZERO {
            first
        } else {
            (meta.retry_backoff + meta.retry_backoff).clamp(first, RETRY_BACKOFF_MAX)
        };
        let at = now + meta.retry_backoff;
        if class == ErrorClass::Hold {
            // The earliest retry stands: new data failing meanwhile does not push it back.
            meta.hold_retry_at = Some(meta.hold_retry_at.map_or(at, |t| t.min(at)));
        } else {
            meta.retry_at = Some(at);
        }
    }

    /// A write or commit to `b` succeeded: any outage is over.
    fn backend_reached(&mut self, b: BackendId) {
        let wb = &mut self.wbs[b.index()];
        wb.outage_since = None;
        wb.outage_reported = false;
    }

    /// When the backend's current outage turns into EIO for its files (`None`: no outage, or
    /// already reported).
    pub(crate) fn outage_deadline(&self, wb: &Wb) -> Option<Instant> {
        let since = wb.outage_since.filter(|_| !wb.outage_reported)?;
        let b = self.wbs.iter().position(|w| std::ptr::eq(w, wb))?;
        let secs = self.cfg.backends[b].retry_timeout_secs;
        Some(since + Duration::from_nanos(secs.saturating_mul(1_000_000_000)))
    }

    /// The backend's outage reached its deadline: every file of it with unwritten data gets
    /// EIO (once per handle), waiting fsyncs answer, and from now on its writers fail instead
    /// of being throttled, until a write succeeds. The data stays and is retried.
    fn outage_expired<M: PageMaps>(&mut self, b: BackendId, maps: &mut M) {
        self.wbs[b.index()].outage_reported = true;
        self.stats.outage_timeouts += 1;
        let files: Vec<InodeId> = self
            .inodes
            .iter()
            .filter(|(_, m)| m.backend == b)
            .map(|(&i, _)| i)
            .filter(|&i| maps.with(i, |m| m.counts().dirty + m.counts().unstable > 0))
            .collect();
        for inode in files {
            self.record_error(inode, IoError { errno: errno::EIO });
        }
        let waiting: Vec<RequestId> = self
            .fsyncs
            .iter()
            .filter(|(_, f)| matches!(f.phase, FsyncPhase::Retrying))
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

    fn wake_page_waiters(&mut self, inode: InodeId) {
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
    pub fn wait_for_page<M: PageMaps>(
        &mut self,
        now: Instant,
        w: &mut Writer,
        inode: InodeId,
        page: u64,
        maps: &mut M,
    ) -> crate::Verdict {
        self.advance(now);
        let busy = maps
            .with(inode, |m| m.page(page).is_some_and(|p| p.state == crate::PageState::Writeback));
        if !busy {
            return crate::Verdict::Proceed { stalled: Duration::ZERO, throttled: false };
        }
        w.call = crate::writer::CallState::Blocked;
        w.call_start = now;
        self.waiters.insert(w.id, WaitReason::Page(inode));
        self.inodes.get_mut(&inode).expect("known inode").page_waiters.push(w.id);
        crate::Verdict::Wait
    }

    // ----- commits (two-phase backends) -----

    /// Sends a COMMIT for `inode` when one is due (a writepages call's writes have all
    /// completed, or `commit_now`) and unstable pages no COMMIT in flight covers exist.
    /// Returns the pages it covers (0: none sent).
    pub(crate) fn maybe_commit<M: PageMaps>(&mut self, inode: InodeId, maps: &mut M) -> u64 {
        let Some(meta) = self.inodes.get_mut(&inode) else { return 0 };
        let mut due = std::mem::take(&mut meta.commit_now);
        while let Some(&mark) = meta.commit_marks.front() {
            if meta.inflight.range(..=mark).next().is_some() {
                break;
            }
            meta.commit_marks.pop_front();
            due = true;
        }
        if !due {
            return 0;
        }
        let b = meta.backend;
        let batch = maps.with(inode, |m| {
            if m.counts().unstable > 0 { m.begin_commit() } else { CommitBatch::default() }
        });
        let pages = batch.pages();
        if pages == 0 {
            return 0;
        }
        let io = self.new_io();
        self.inodes.get_mut(&inode).expect("known").commits_inflight.insert(io);
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

    fn commit_done<M: PageMaps>(&mut self, io: IoId, result: Result<u64, IoError>, maps: &mut M) {
        let record =
            self.ios.remove(&io).unwrap_or_else(|| panic!("completion of unknown io {io}"));
        let (b, inode) = (record.backend, record.inode);
        let IoKind::Commit { batch } = record.kind else { panic!("io {io} is not a commit") };
        self.inodes.get_mut(&inode).expect("known").commits_inflight.remove(&io);
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
                self.write_failed(b, inode, e);
                // The server may have lost the data: write it again.
                maps.with(inode, |m| m.resolve_commit(&batch, |_| false))
            }
        };
        if result.is_ok() {
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

    // ----- fsync, sync, close -----

    /// A handle closes: at once, with any error it has not seen, or, on a `flush_on_close`
    /// backend, after writing back and committing the file as fsync does (close-to-open).
    fn close<M: PageMaps>(&mut self, handle: HandleId, request: RequestId, maps: &mut M) {
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

    fn close_now(&mut self, handle: HandleId, request: RequestId) {
        let result = self.check_handle_error(handle);
        if let Some((inode, _)) = self.handles.remove(&handle)
            && let Some(meta) = self.inodes.get_mut(&inode)
        {
            meta.handles = meta.handles.saturating_sub(1);
        }
        self.emit(Action::CloseDone { request, result });
    }

    fn fsync_start<M: PageMaps>(&mut self, handle: HandleId, request: RequestId, maps: &mut M) {
        self.fsync_begin(handle, request, false, maps);
    }

    fn fsync_begin<M: PageMaps>(
        &mut self,
        handle: HandleId,
        request: RequestId,
        closing: bool,
        maps: &mut M,
    ) {
        let Some(&(inode, _)) = self.handles.get(&handle) else {
            let result = Err(IoError { errno: 9 });
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
            if let Some((inode, _)) = self.handles.remove(&state.handle)
                && let Some(meta) = self.inodes.get_mut(&inode)
            {
                meta.handles = meta.handles.saturating_sub(1);
            }
            self.emit(Action::CloseDone { request, result });
        } else {
            self.emit(Action::FsyncDone { request, result });
        }
    }

    fn fsync_write_phase<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
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

    fn fsync_commit_phase<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
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
            self.inodes.get_mut(&inode).expect("known").commit_now = true;
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
            // rather than answer with data unwritten (write-error policy, module doc).
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

    fn sync_start<M: PageMaps>(&mut self, request: RequestId, maps: &mut M) {
        let err_seq_start = self.inodes.iter().map(|(&i, m)| (i, m.err_seq)).collect();
        self.syncs.insert(
            request,
            SyncState {
                backends_left: self.wbs.len() as u32,
                error: None,
                err_seq_start,
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
                .sync_waits
                .iter()
                .filter(|&(_, &last)| {
                    self.ios
                        .range(..=last)
                        .all(|(_, r)| r.backend != b || matches!(r.kind, IoKind::Read { .. }))
                })
                .map(|(&r, _)| r)
                .collect()
        };
        for request in done {
            // Writes done: commit every file of this backend with unstable pages.
            let unstable: Vec<InodeId> = self
                .inodes
                .iter()
                .filter(|(_, m)| m.backend == b)
                .map(|(&i, _)| i)
                .filter(|&i| maps.with(i, |m| m.counts().unstable > 0))
                .collect();
            let pending_commit =
                unstable.iter().any(|i| !self.inodes[i].commits_inflight.is_empty());
            if !unstable.is_empty() || pending_commit {
                for i in unstable {
                    self.inodes.get_mut(&i).expect("known").commit_now = true;
                    self.maybe_commit(i, maps);
                }
                // Keep waiting: the commits' completions call back here. Track them by the
                // newest IO issued.
                let last = IoId(self.next_io - 1);
                self.wbs[b.index()].flusher.sync_waits.insert(request, last);
                if self
                    .ios
                    .range(..=last)
                    .any(|(_, r)| r.backend == b && matches!(r.kind, IoKind::Commit { .. }))
                {
                    continue;
                }
            }
            self.wbs[b.index()].flusher.sync_waits.remove(&request);
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
                let error = state.error.or_else(|| {
                    self.inodes
                        .iter()
                        .find(|(i, m)| m.err_seq > state.err_seq_start.get(i).copied().unwrap_or(0))
                        .and_then(|(_, m)| m.err)
                });
                self.emit(Action::SyncDone { request, result: error.map_or(Ok(()), Err) });
            }
        }
    }

    // ----- reads -----

    fn read_start<M: PageMaps>(
        &mut self,
        inode: InodeId,
        first: u64,
        pages: u64,
        request: RequestId,
        maps: &mut M,
    ) {
        let Some(meta) = self.inodes.get_mut(&inode) else {
            self.emit(Action::ReadDone { request, result: Err(IoError { errno: 9 }) });
            return;
        };
        // Readahead (the kernel's on-demand readahead, simplified): on sequential reads keep a
        // window of up to 32 pages (read_ahead_kb = 128) in flight beyond the request, so the
        // next read usually finds its pages resident or on their way; a seek resets it.
        let sequential = meta.last_read_end == first;
        meta.readahead = if sequential { (meta.readahead * 2).clamp(4, 32) } else { 0 };
        meta.last_read_end = first + pages;
        let span = pages + meta.readahead;
        let b = meta.backend;
        let end = first + pages;
        let mut missing = Vec::new();
        maps.with(inode, |m| m.lookup(first, span, &mut missing));
        let mut waiting = BTreeSet::new();
        for run in missing {
            // Parts already being read: wait for those reads instead of reading twice.
            let mut cursor = run.first;
            let in_flight: Vec<(u64, u64, IoId)> = self.inodes[&inode]
                .reading
                .range(..run.end())
                .filter(|(_, (e, _))| *e > run.first)
                .map(|(&f, &(e, io))| (f, e, io))
                .collect();
            let mut gaps = Vec::new();
            for (f, e, io) in in_flight {
                if f > cursor {
                    gaps.push(Run { first: cursor, count: f - cursor });
                }
                if f < end && e > first {
                    waiting.insert(io);
                }
                cursor = cursor.max(e);
            }
            if cursor < run.end() {
                gaps.push(Run { first: cursor, count: run.end() - cursor });
            }
            for gap in gaps {
                let mut frames = Vec::new();
                self.alloc_frames(gap.count as usize, &mut frames, maps);
                if frames.is_empty() {
                    continue;
                }
                let gap = Run { first: gap.first, count: frames.len() as u64 };
                let io = self.new_io();
                self.ios.insert(
                    io,
                    IoRecord {
                        backend: b,
                        inode,
                        kind: IoKind::Read {
                            run: gap,
                            frames,
                            keep_below: u64::MAX,
                            stale: Vec::new(),
                        },
                        issued: self.now,
                    },
                );
                self.inodes
                    .get_mut(&inode)
                    .expect("known")
                    .reading
                    .insert(gap.first, (gap.end(), io));
                self.wbs[b.index()].inflight += 1;
                self.wbs[b.index()].wbt.on_read_issue(self.now, io.0);
                self.stats.reads += 1;
                self.stats.read_pages += gap.count;
                self.emit(Action::Read {
                    io,
                    backend: b,
                    inode,
                    first_page: gap.first,
                    pages: gap.count,
                });
                if gap.first < end {
                    waiting.insert(io);
                }
            }
        }
        if waiting.is_empty() {
            self.emit(Action::ReadDone { request, result: Ok(()) });
        } else {
            self.reads.insert(request, ReadState { waiting, error: None });
        }
    }

    fn read_done<M: PageMaps>(&mut self, io: IoId, result: Result<(), IoError>, maps: &mut M) {
        let record =
            self.ios.remove(&io).unwrap_or_else(|| panic!("completion of unknown io {io}"));
        let IoKind::Read { run, mut frames, keep_below, mut stale } = record.kind else {
            panic!("io {io} is not a read")
        };
        let (b, inode) = (record.backend, record.inode);
        self.wbs[b.index()].inflight -= 1;
        let latency = self.now.saturating_since(record.issued);
        self.wbs[b.index()].wbt.on_read_done(self.now, latency, Some(io.0));
        // Pages a truncate dropped while the read was in flight hold stale bytes.
        let fresh = keep_below.saturating_sub(run.first).min(frames.len() as u64) as usize;
        let mut unused = frames.split_off(fresh);
        if result.is_ok() {
            // Insert the runs between stale pages; a stale page's frame goes back unused.
            stale.sort_unstable();
            stale.dedup();
            let mut inserted = Vec::new();
            let mut start = 0usize;
            let cuts: Vec<usize> = stale
                .iter()
                .filter(|&&p| p >= run.first)
                .map(|&p| (p - run.first) as usize)
                .filter(|&c| c < fresh)
                .chain(std::iter::once(fresh))
                .collect();
            for cut in cuts {
                let first = run.first + start as u64;
                let segment = &frames[start..cut];
                let (ins, rest) = maps.with(inode, |m| m.insert_clean(first, segment));
                inserted.extend(ins);
                unused.extend(rest);
                if cut < fresh {
                    unused.push(frames[cut]);
                }
                start = cut + 1;
            }
            let n = inserted.len() as i64;
            for (frame, index) in inserted {
                self.mem.add_to_lru(frame, inode, index);
            }
            self.account(inode, Counters { resident: n, ..Counters::default() });
        } else {
            unused.extend(frames);
        }
        for frame in unused {
            self.mem.release(frame);
        }
        if let Some(meta) = self.inodes.get_mut(&inode) {
            meta.reading.remove(&run.first);
        }
        // Complete the requests that waited for this read.
        let done: Vec<RequestId> = self
            .reads
            .iter_mut()
            .filter_map(|(&req, r)| {
                if !r.waiting.remove(&io) {
                    return None;
                }
                if let Err(e) = result {
                    r.error = Some(e);
                }
                r.waiting.is_empty().then_some(req)
            })
            .collect();
        for request in done {
            let state = self.reads.remove(&request).expect("read");
            self.emit(Action::ReadDone { request, result: state.error.map_or(Ok(()), Err) });
        }
        self.wake_memory_waiters(maps);
    }

    // ----- truncate -----

    fn truncate<M: PageMaps>(&mut self, inode: InodeId, first_page: u64, maps: &mut M) {
        if !self.inodes.contains_key(&inode) {
            return;
        }
        let out = maps.with(inode, |m| m.truncate(first_page));
        // Reads in flight past the cut would bring back bytes the truncate removed.
        let reading: Vec<IoId> = self.inodes[&inode]
            .reading
            .values()
            .filter(|&&(end, _)| end > first_page)
            .map(|&(_, io)| io)
            .collect();
        for io in reading {
            if let Some(IoRecord { kind: IoKind::Read { keep_below, .. }, .. }) =
                self.ios.get_mut(&io)
            {
                *keep_below = (*keep_below).min(first_page);
            }
        }
        for &frame in &out.freed_frames {
            self.mem.unlink(frame);
            self.mem.release(frame);
        }
        let freed = out.freed_frames.len() as i64;
        self.account(
            inode,
            Counters {
                dirty: -(out.dirty as i64),
                held: -(out.held as i64),
                unstable: -(out.unstable as i64),
                resident: -freed,
                ..Counters::default()
            },
        );
        // Truncating away held pages is how a user gives up on data a permanent error keeps.
        let (dirty, held) = maps.with(inode, |m| (m.counts().dirty, m.counts().held));
        let meta = self.inodes.get_mut(&inode).expect("known");
        if dirty == 0 {
            meta.retry_at = None;
        }
        if held == 0 {
            meta.hold_retry_at = None;
        }
    }

    // ----- timers -----

    fn timer<M: PageMaps>(&mut self, maps: &mut M) {
        let now = self.now;
        for b in 0..self.wbs.len() {
            if self.wbs[b].wbt.timer().is_some_and(|t| t <= now) {
                let inflight = self.wbs[b].write_inflight;
                let e = self.wbs[b].wbt.on_timer(now, inflight);
                self.record(TraceEvent::Wbt { bdi: BackendId(b as u32), eval: e, inflight });
            }
        }
        for b in 0..self.wbs.len() {
            if self.wbs[b].bw_update_at.is_some_and(|t| t <= now) {
                // The delayed update runs whatever the time since the last one.
                self.wbs[b].bw_update_at = None;
                let now_j = now.jiffies(self.hz);
                self.update_bandwidth(BackendId(b as u32), now_j, None, 0, 0);
            }
        }
        for b in 0..self.wbs.len() {
            if self.wbs[b].flusher.timer.is_some_and(|t| t <= now) {
                self.wbs[b].flusher.timer = None;
                self.wbs[b].flusher.wake_periodic = true;
            }
        }
        let due: Vec<InodeId> = self
            .inodes
            .iter()
            .filter(|(_, m)| {
                m.retry_at.is_some_and(|t| t <= now) || m.hold_retry_at.is_some_and(|t| t <= now)
            })
            .map(|(&i, _)| i)
            .collect();
        for inode in due {
            let held = maps.with(inode, |m| m.counts().held);
            let meta = self.inodes.get_mut(&inode).expect("known");
            if meta.retry_at.is_some_and(|t| t <= now) {
                meta.retry_at = None;
            }
            if meta.hold_retry_at.is_some_and(|t| t <= now) {
                meta.hold_retry_at = None;
            }
            // Held pages are not taken by background writeback; this retry takes them (if
            // the backend still refuses them they are held again, with a longer backoff).
            meta.retry_held = held > 0 && meta.hold_retry_at.is_none();
            let b = meta.backend;
            // Retry: make sure the file is queued and the flusher runs.
            self.mark_inode_dirty(inode);
            self.wbs[b.index()].flusher.start_all = true;
            let waiting: Vec<RequestId> = self
                .fsyncs
                .iter()
                .filter(|(_, f)| f.inode == inode && matches!(f.phase, FsyncPhase::Retrying))
                .map(|(&r, _)| r)
                .collect();
            for request in waiting {
                self.fsync_write_phase(request, maps);
            }
        }
        for b in 0..self.wbs.len() {
            if self.outage_deadline(&self.wbs[b]).is_some_and(|t| t <= now) {
                self.outage_expired(BackendId(b as u32), maps);
            }
        }
        let mut retries = Vec::new();
        for (&request, state) in &mut self.syncs {
            let due: Vec<BackendId> =
                state.retry_at.iter().filter(|&(_, &t)| t <= now).map(|(&b, _)| b).collect();
            for b in due {
                state.retry_at.remove(&b);
                retries.push((b, request));
            }
        }
        for (b, request) in retries {
            self.queue_sync_work(b, request);
        }
        self.kswapd_run(maps);
    }

    // ----- views -----

    /// The cache as a whole (`/proc/meminfo` style).
    pub fn meminfo(&self) -> MemInfo {
        let t = self.global_thresholds();
        MemInfo {
            total: self.mem.total(),
            free: self.mem.free_pages(),
            anon: self.mem.anon(),
            cached: self.global.resident.max(0) as u64,
            dirty: self.global.dirty(),
            held: self.global.held.max(0) as u64,
            writeback: self.global.writeback(),
            unstable: self.global.unstable(),
            active: self.mem.list_len(List::Active),
            inactive: self.mem.list_len(List::Inactive),
            thresh: t.thresh,
            bg_thresh: t.bg_thresh,
            limit: crate::limits::hard_limit(t.thresh, self.dirty_limit),
            dirtied: self.global.dirtied,
            written: self.global.written,
        }
    }

    /// One backend (`/sys/class/bdi` style).
    pub fn bdi_stats(&self, b: BackendId) -> BdiStats {
        let wb = &self.wbs[b.index()];
        let t = self.global_thresholds();
        let wb_thresh = self.wb_thresh(b, t.thresh);
        BdiStats {
            name: self.cfg.backends[b.index()].name.clone(),
            dirty: wb.counters.dirty(),
            held: wb.counters.held.max(0) as u64,
            writeback: wb.counters.writeback(),
            unstable: wb.counters.unstable(),
            wb_thresh,
            wb_bg_thresh: crate::limits::wb_bg_thresh(wb_thresh, t.bg_thresh, t.thresh),
            write_bandwidth: wb.rates.write_bandwidth,
            avg_write_bandwidth: wb.rates.avg_write_bandwidth,
            dirty_ratelimit: wb.rates.dirty_ratelimit,
            balanced_dirty_ratelimit: wb.rates.balanced_dirty_ratelimit,
            inflight: u64::from(wb.inflight),
            wbt_max_depth: wb.wbt.max_depth(),
            wbt_background: wb.wbt.wb_background(),
            wbt_normal: wb.wbt.wb_normal(),
            wbt_step: wb.wbt.scale_step(),
            wbt_target_us: wb.wbt.min_lat_nsec() / 1_000,
            wbt_read_min_us: wb.wbt.last_read_min_nsec() / 1_000,
            dirtied: wb.counters.dirtied,
            written: wb.counters.written,
        }
    }

    /// Counts per writer group: (dirty, writeback, unstable, resident).
    pub fn group_counts(&self, g: GroupId) -> (u64, u64, u64, u64) {
        self.groups.get(&g).map_or((0, 0, 0, 0), |c| {
            (c.dirty(), c.writeback(), c.unstable(), c.resident.max(0) as u64)
        })
    }

    /// Requests in flight on `b`.
    pub fn inflight(&self, b: BackendId) -> u32 {
        self.wbs[b.index()].inflight
    }

    /// Verifies that the counters agree with the page maps, given every writer's pending
    /// batch: per backend and in total, dirty, writeback, unstable and resident pages match a
    /// recount, nothing is negative, and `clean + dirty + writeback + unstable = resident`.
    /// Also checks the frame budget. For tests and the simulator's checkers (O(pages)).
    pub fn check_accounting(&self, maps: &MapStore, writers: &[&Writer]) -> Result<(), String> {
        let mut per_backend = vec![[0i64; 5]; self.wbs.len()];
        let mut total = [0i64; 5];
        for (inode, map) in maps.iter() {
            let c = map.recount();
            if c != map.counts() {
                return Err(format!(
                    "inode {inode}: counts {:?} but recount {:?}",
                    map.counts(),
                    c
                ));
            }
            if c.clean + c.dirty + c.writeback + c.unstable != c.resident {
                return Err(format!("inode {inode}: states do not add up: {c:?}"));
            }
            let Some(meta) = self.inodes.get(&inode) else {
                if c.resident > 0 {
                    return Err(format!("inode {inode} has pages but was never opened"));
                }
                continue;
            };
            let v = [
                c.dirty as i64,
                c.writeback as i64,
                c.unstable as i64,
                c.resident as i64,
                c.held as i64,
            ];
            for k in 0..5 {
                per_backend[meta.backend.index()][k] += v[k];
                total[k] += v[k];
            }
        }
        // Pending batches are dirtying not yet folded into the counters.
        let mut pending = vec![[0i64; 5]; self.wbs.len()];
        for w in writers {
            for p in &w.pending {
                let b = self.inodes[&p.inode].backend.index();
                pending[b][0] += p.dirtied as i64;
                pending[b][2] -= p.from_unstable as i64;
                pending[b][3] += p.new_pages as i64;
                pending[b][4] -= p.unheld as i64;
            }
        }
        let names = ["dirty", "writeback", "unstable", "resident", "held"];
        for (b, wb) in self.wbs.iter().enumerate() {
            let c = &wb.counters;
            let have = [c.dirty, c.writeback, c.unstable, c.resident, c.held];
            for k in 0..5 {
                let exact = have[k] + pending[b][k];
                if exact != per_backend[b][k] {
                    return Err(format!(
                        "backend {b}: {} counter {} + pending {} != pages {}",
                        names[k], have[k], pending[b][k], per_backend[b][k]
                    ));
                }
                if exact < 0 {
                    return Err(format!("backend {b}: {} is negative", names[k]));
                }
            }
        }
        let c = &self.global;
        let g = [c.dirty, c.writeback, c.unstable, c.resident, c.held];
        let pending_total: Vec<i64> = (0..5).map(|k| pending.iter().map(|p| p[k]).sum()).collect();
        for k in 0..5 {
            if g[k] + pending_total[k] != total[k] {
                return Err(format!(
                    "global {} counter {} + pending {} != pages {}",
                    names[k], g[k], pending_total[k], total[k]
                ));
            }
        }
        let reserved: u64 = writers.iter().map(|w| w.frames.len() as u64).sum();
        let read_frames: u64 = self
            .ios
            .values()
            .map(
                |r| if let IoKind::Read { frames, .. } = &r.kind { frames.len() as u64 } else { 0 },
            )
            .sum();
        let resident = total[3] as u64;
        if self.mem.allocated() != resident + reserved + read_frames {
            return Err(format!(
                "frames: allocated {} != resident {resident} + reserved {reserved} + reading {read_frames}",
                self.mem.allocated()
            ));
        }
        if self.mem.allocated() > self.mem.total()
            || (self.mem.allocated() + self.mem.anon() > self.mem.total()
                && !self.mem.overcommitted())
        {
            return Err(format!(
                "memory budget exceeded: {} + {} > {}",
                self.mem.allocated(),
                self.mem.anon(),
                self.mem.total()
            ));
        }
        Ok(())
    }
}
