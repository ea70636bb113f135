//! Writer-local state and the per-page write path (docs/mechanisms.md#8-cheap-throttle-path).
//!
//! The kernel keeps the per-page cost of dirtying low by touching only per-task and per-CPU
//! state until a task has dirtied `nr_dirtied_pause` pages, and only then reads the shared
//! counters in `balance_dirty_pages`. ebb does the same: [`write_pages`] updates the file's
//! [`PageMap`] and this [`Writer`], nothing shared. Counter changes and new frames are batched
//! here and folded into the engine at the writer's next throttle check, where the shared
//! counters are read once. The calls a writer makes, and when, are the writer protocol
//! ([`WriterInput`], [`WriterNext`], `call.rs`).
//!
//! Between checks the shared counters lag the page maps by at most the writer's batch (the
//! kernel's per-CPU counter error, docs/mechanisms.md#8-cheap-throttle-path);
//! [`crate::Engine::check_accounting`]
//! adds the pending batches back when it verifies the totals.

mod call;

pub use call::{WaitOn, WriterInput, WriterNext};

use crate::ids::{FrameId, GroupId, InodeId, WriterId};
use crate::pagemap::{DirtyStop, PageMap};
use crate::time::{Duration, Instant};

/// Frames a writer takes from the engine at a time (like a per-CPU page list).
pub const FRAME_BATCH: usize = 256;
/// Pages a new writer may dirty before its first check (kernel: 128 KiB at fork).
pub const INITIAL_DIRTIED_PAUSE: u64 = 32;

/// Dirtying not yet folded into the shared counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) inode: InodeId,
    /// Pages that became dirty.
    pub(crate) dirtied: u64,
    /// Of those, pages that were unstable.
    pub(crate) from_unstable: u64,
    /// Of those, pages that were not resident.
    pub(crate) new_pages: u64,
    /// Held pages the writes released.
    pub(crate) unheld: u64,
}

/// Where a writer is in a throttle call that has not returned `Proceed` yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallState {
    /// No call in progress.
    Idle,
    /// IO-less policy, looping at the hard limit after a max pause.
    IolessOverLimit { pages_dirtied: u64 },
    /// IO-less policy after its one pause: the call ends on continue.
    IolessPaused,
    /// Legacy policy: sleeping `pause` jiffies, then re-checking.
    LegacySleeping { pages_written: u64, write_chunk: u64, pause: u64 },
    /// Legacy policy: waiting for its own writeback IO.
    LegacyWriting { pages_written: u64, write_chunk: u64, pause: u64 },
    /// 2010 policy: after the soft pause, check whether a limit is exceeded.
    Bw2010Paused { pages_dirtied: u64 },
    /// Waiting for a page under writeback, or for memory, before dirtying goes on.
    Blocked,
}

/// The state of one writer (the kernel's task fields used by dirty throttling). Owned by the
/// driver; the runtime keeps one per writer thread, so nothing in it is shared.
#[derive(Clone, Debug)]
pub struct Writer {
    /// Identity.
    pub id: WriterId,
    /// Accounting group.
    pub group: GroupId,
    pub(crate) nr_dirtied: u64,
    pub(crate) nr_dirtied_pause: u64,
    /// Pages after which the next check is due: `nr_dirtied_pause`, or 8 while the backend is
    /// over its limit.
    pub(crate) ratelimit: u64,
    /// Jiffies up to which the writer has paid for its dirtying (`dirty_paused_when`).
    pub(crate) dirty_paused_when: Option<u64>,
    pub(crate) pending: Vec<Pending>,
    pub(crate) added: Vec<(FrameId, InodeId, u64)>,
    pub(crate) frames: Vec<FrameId>,
    pub(crate) scratch: Vec<(FrameId, u64)>,
    /// The file last written (its backend is the one throttled against).
    pub(crate) last_inode: Option<InodeId>,
    /// A page of a file before which [`write_pages`] stops for a throttle check: the end of
    /// the write granule the writer is filling, set by the granule gate.
    pub(crate) granule_stop: Option<(InodeId, u64)>,
    /// The last page the writer dirtied, in `last_inode`.
    pub(crate) last_page: Option<u64>,
    /// The writer reached its `granule_stop`: it filled its granule to the end. (Its last page
    /// being a granule's last is not enough: a request may end inside that page.)
    pub(crate) at_stop: bool,
    pub(crate) call: CallState,
    /// The end of the sleep the last verdict asked for, while it is owed.
    pub(crate) sleep_until: Option<Instant>,
    pub(crate) call_start: Instant,
    /// The current call went past the freerun point.
    pub(crate) call_throttled: bool,
    /// Dirtying share for the legacy per-task threshold.
    pub(crate) dirty_share: crate::fprop::Local,
    /// Lifetime totals, for stats.
    pub(crate) total_dirtied: u64,
    pub(crate) total_stalled: Duration,
    pub(crate) writeback_pages: u64,
}

impl Writer {
    /// A new writer in `group`.
    pub fn new(id: WriterId, group: GroupId) -> Writer {
        Writer {
            id,
            group,
            nr_dirtied: 0,
            nr_dirtied_pause: INITIAL_DIRTIED_PAUSE,
            ratelimit: INITIAL_DIRTIED_PAUSE,
            dirty_paused_when: None,
            pending: Vec::new(),
            added: Vec::new(),
            frames: Vec::new(),
            scratch: Vec::new(),
            last_inode: None,
            granule_stop: None,
            last_page: None,
            at_stop: false,
            call: CallState::Idle,
            sleep_until: None,
            call_start: Instant::ZERO,
            call_throttled: false,
            dirty_share: Default::default(),
            total_dirtied: 0,
            total_stalled: Duration::ZERO,
            writeback_pages: 0,
        }
    }

    /// Pages dirtied since the last throttle check.
    pub fn nr_dirtied(&self) -> u64 {
        self.nr_dirtied
    }

    /// Pages the writer may dirty between checks.
    pub fn nr_dirtied_pause(&self) -> u64 {
        self.nr_dirtied_pause
    }

    /// Pages this writer ever dirtied.
    pub fn total_dirtied(&self) -> u64 {
        self.total_dirtied
    }

    /// Time this writer spent throttled.
    pub fn total_stalled(&self) -> Duration {
        self.total_stalled
    }

    /// Pages this writer wrote back itself (only the legacy policy makes it do so).
    pub fn writeback_pages(&self) -> u64 {
        self.writeback_pages
    }

    /// Pages dirtied but not yet folded into the shared counters.
    pub fn pending_dirtied(&self) -> u64 {
        self.pending.iter().map(|p| p.dirtied).sum()
    }

    /// The end of the sleep the writer's last verdict asked for, while its throttle call waits
    /// for it: a writer that does not sleep in place (`File::try_write_at`) continues the call
    /// ([`WriterInput::Continue`]) only once this has passed, as a sleeping writer wakes then,
    /// and is throttled exactly as one that slept.
    pub fn paused_until(&self) -> Option<Instant> {
        self.sleep_until
    }

    /// Records the verdict a throttle call returned (the sleep it asks for, if any) and
    /// returns it.
    pub(crate) fn note(&mut self, v: crate::Verdict) -> crate::Verdict {
        self.sleep_until = match v {
            crate::Verdict::Sleep { until } => Some(until),
            _ => None,
        };
        v
    }

    /// Frames held in the writer's reserve.
    pub fn reserved_frames(&self) -> usize {
        self.frames.len()
    }
}

/// What [`write_pages`] did and what the writer must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteStep {
    /// Pages of the request processed from its start; the writer resumes after them.
    pub consumed: u64,
    /// The file had no dirty pages before: the engine must hear of the step
    /// ([`WriteStep::needs_engine`]) so the flusher sees the file.
    pub inode_became_dirty: bool,
    /// What stopped the step.
    pub next: NextStep,
}

/// What stopped [`write_pages`] (the engine acts on it in [`crate::Engine::writer_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// The request is done and no check is due.
    Done,
    /// A throttle check is due (or frames ran out): the engine decides before the writer
    /// writes on.
    Check,
    /// A page is under writeback: the writer waits for it before writing on.
    Busy(u64),
}

/// Dirties pages `[first, first + count)` of `inode` for `writer`, touching only `map` and
/// `writer`. Stops when the writer owes a throttle check (the kernel's
/// `balance_dirty_pages_ratelimited`, called after each page), when its frame reserve is empty,
/// at a page under writeback, or at the end of the write granule it is filling (the granule
/// gate's turns end there).
pub fn write_pages(
    writer: &mut Writer,
    inode: InodeId,
    map: &mut PageMap,
    first: u64,
    count: u64,
) -> WriteStep {
    let mut count = count;
    let mut at_stop = false;
    if let Some((file, stop)) = writer.granule_stop
        && file == inode
        && (first..first.saturating_add(count)).contains(&stop)
    {
        count = stop - first;
        at_stop = true;
        if count == 0 {
            // The writer stands at the granule's end, wherever it wrote last: the check moves
            // the stop past this granule, so a writer that jumped here goes on after it.
            writer.last_inode = Some(inode);
            writer.last_page = Some(stop - 1);
            writer.at_stop = true;
            return WriteStep { consumed: 0, inode_became_dirty: false, next: NextStep::Check };
        }
    }
    let budget = writer.ratelimit.saturating_sub(writer.nr_dirtied).max(1);
    writer.scratch.clear();
    let out = map.dirty_range(first, count, budget, &mut writer.frames, &mut writer.scratch);
    if out.dirtied > 0 || out.unheld > 0 {
        writer.nr_dirtied += out.dirtied;
        writer.total_dirtied += out.dirtied;
        match writer.pending.iter_mut().find(|p| p.inode == inode) {
            Some(p) => {
                p.dirtied += out.dirtied;
                p.from_unstable += out.from_unstable;
                p.new_pages += out.new_pages;
                p.unheld += out.unheld;
            }
            None => writer.pending.push(Pending {
                inode,
                dirtied: out.dirtied,
                from_unstable: out.from_unstable,
                new_pages: out.new_pages,
                unheld: out.unheld,
            }),
        }
        writer.added.extend(writer.scratch.iter().map(|&(frame, index)| (frame, inode, index)));
    }
    writer.last_inode = Some(inode);
    if out.consumed > 0 {
        writer.last_page = Some(first + out.consumed - 1);
        writer.at_stop = at_stop && out.consumed == count;
    }
    let next = match out.stop {
        DirtyStop::Done if writer.nr_dirtied >= writer.ratelimit || at_stop => NextStep::Check,
        DirtyStop::Done => NextStep::Done,
        DirtyStop::Limit | DirtyStop::NeedFrames => NextStep::Check,
        DirtyStop::Busy(page) => NextStep::Busy(page),
    };
    WriteStep { consumed: out.consumed, inode_became_dirty: out.inode_became_dirty, next }
}
