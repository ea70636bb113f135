//! The pages of one file: their states, frames and flags (the kernel's `address_space` xarray).
//!
//! A `PageMap` is pure data with range operations. It knows nothing about other files, limits
//! or time: every operation returns what changed, and the engine applies those changes to the
//! counters of the cache, the backend and the group at the same transition points as the
//! kernel (docs/mechanisms.md#1-page-states-and-accounting). Keeping one file's pages in their own
//! structure lets the
//! runtime lock files separately, so writers of different files never share a lock on the
//! per-page path (docs/mechanisms.md#8-cheap-throttle-path).
//!
//! States are exclusive: a resident page is exactly one of clean, dirty, writeback or unstable,
//! so `clean + dirty + writeback + unstable = resident` holds by construction. A writer that
//! wants to change a page under writeback waits for the write to finish (stable pages), which
//! is what keeps the states exclusive.
//!
//! Layout: pages are grouped in chunks of 512 (2 MiB); a chunk exists only while it holds a
//! resident page, and keeps per-state counts so scans for dirty or tagged pages skip clean
//! regions in one step.
//!
//! This file holds the types and the slot bookkeeping every operation shares (state
//! transitions keep the counts); the operations are grouped by what they serve: `dirty.rs`
//! (writers dirtying pages, integrity tags, held pages), `writeback.rs` (taking runs for
//! writing, their completions, commits) and `resident.rs` (reads, reclaim, truncation).

use std::collections::BTreeMap;

use crate::ids::FrameId;

mod dirty;
mod resident;
mod writeback;

/// Pages per chunk.
const CHUNK_PAGES: u64 = 512;
const CHUNK_SHIFT: u32 = 9;
const NO_FRAME: u32 = u32::MAX;

/// The state of a resident page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum PageState {
    /// Same as the backend holds durably; may be evicted.
    Clean = 1,
    /// Modified in memory, not yet written.
    Dirty = 2,
    /// A write of this page is in flight.
    Writeback = 3,
    /// Written to a two-phase backend that has not committed it yet.
    Unstable = 4,
}

impl PageState {
    fn from_u8(v: u8) -> Option<PageState> {
        match v {
            1 => Some(PageState::Clean),
            2 => Some(PageState::Dirty),
            3 => Some(PageState::Writeback),
            4 => Some(PageState::Unstable),
            _ => None,
        }
    }
}

/// Per-page flags.
pub mod flag {
    /// Read or written since reclaim last examined the page (the kernel's `PG_referenced`):
    /// reclaim keeps such a dirty page for another trip instead of writing it.
    pub const REFERENCED: u8 = 1;
    /// Selected by an integrity sync; only tagged pages are written by that sync (livelock
    /// avoidance, the kernel's `PAGECACHE_TAG_TOWRITE`).
    pub const TOWRITE: u8 = 2;
    /// Reclaim wants this page: free it as soon as its writeback ends (`PG_reclaim`).
    pub const RECLAIM: u8 = 4;
    /// Truncated while under writeback: freed when the write completes.
    pub const DOOMED: u8 = 8;
    /// Dirty page whose last write failed with an error that will not pass (ENOSPC, EROFS):
    /// kept, not retried by background writeback.
    pub const HELD: u8 = 16;
    /// Unstable page covered by a COMMIT in flight.
    pub const COMMITTING: u8 = 32;
}

#[derive(Clone, Copy)]
struct Slot {
    frame: u32,
    state: u8,
    flags: u8,
    /// Index of the write verifier this unstable page was written under (two-phase backends).
    verifier: u16,
    /// With `COMMITTING`: which of the file's COMMITs covers this page ([`CommitBatch::tag`]).
    commit: u32,
}

const EMPTY: Slot = Slot { frame: NO_FRAME, state: 0, flags: 0, verifier: 0, commit: 0 };

/// A chunk's slots, stored only up to the highest one ever written (grown in powers of two up
/// to [`CHUNK_PAGES`]); the slots past the stored ones are [`EMPTY`]. Stored in full, a chunk
/// took 6 KiB (512 slots of 12 bytes) for each file however small: 18 MiB of heap, outside
/// the cache's budget, for 3,000 files of one page each (heaptrack of `ebb mount`).
#[derive(Default)]
struct Slots(Vec<Slot>);

impl Slots {
    /// The stored slots (every slot past them is [`EMPTY`]).
    fn iter(&self) -> std::slice::Iter<'_, Slot> {
        self.0.iter()
    }

    fn iter_mut(&mut self) -> std::slice::IterMut<'_, Slot> {
        self.0.iter_mut()
    }
}

impl std::ops::Index<usize> for Slots {
    type Output = Slot;
    fn index(&self, offset: usize) -> &Slot {
        self.0.get(offset).unwrap_or(&EMPTY)
    }
}

impl std::ops::IndexMut<usize> for Slots {
    /// Stores the slots up to `offset` first if they are not yet.
    fn index_mut(&mut self, offset: usize) -> &mut Slot {
        if offset >= self.0.len() {
            let len = (offset + 1).next_power_of_two().min(CHUNK_PAGES as usize).max(offset + 1);
            self.0.reserve_exact(len - self.0.len());
            self.0.resize(len, EMPTY);
        }
        &mut self.0[offset]
    }
}

impl std::ops::Index<std::ops::RangeFrom<usize>> for Slots {
    type Output = [Slot];
    /// The stored slots from `range.start` (empty if none is stored there).
    fn index(&self, range: std::ops::RangeFrom<usize>) -> &[Slot] {
        self.0.get(range).unwrap_or(&[])
    }
}

struct Chunk {
    slots: Slots,
    /// Resident pages per state, indexed by `PageState as usize`; index 0 is the resident total.
    count: [u16; 5],
    tagged: u16,
    /// Dirty pages with `HELD`.
    held: u16,
    /// Unstable pages with `COMMITTING`.
    committing: u16,
}

impl Chunk {
    fn new() -> Chunk {
        Chunk { slots: Slots::default(), count: [0; 5], tagged: 0, held: 0, committing: 0 }
    }
}

/// Resident pages of a file by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// All resident pages.
    pub resident: u64,
    /// Clean pages.
    pub clean: u64,
    /// Dirty pages.
    pub dirty: u64,
    /// Pages under writeback.
    pub writeback: u64,
    /// Unstable pages.
    pub unstable: u64,
    /// Dirty pages tagged for an integrity sync.
    pub tagged: u64,
    /// Dirty pages held by a write error that will not pass.
    pub held: u64,
}

/// A contiguous run of pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Run {
    /// First page index.
    pub first: u64,
    /// Number of pages.
    pub count: u64,
}

impl Run {
    /// One past the last page.
    pub fn end(self) -> u64 {
        self.first + self.count
    }
}

/// Why [`PageMap::dirty_range`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirtyStop {
    /// Every page of the range was processed.
    Done,
    /// The writer dirtied `max_dirtied` pages: it must pass its throttle check before going on.
    Limit,
    /// A new page needs a frame and the writer's reserve is empty.
    NeedFrames,
    /// This page is under writeback; the writer waits for it (stable pages).
    Busy(u64),
}

/// What [`PageMap::dirty_range`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyOutcome {
    /// Pages of the range processed (written into), from its start.
    pub consumed: u64,
    /// Pages that became dirty (the kernel's `folio_account_dirtied` calls).
    pub dirtied: u64,
    /// Of those, pages that were unstable (written, uncommitted) before.
    pub from_unstable: u64,
    /// Of those, pages that were not resident and took a frame.
    pub new_pages: u64,
    /// Dirty pages held by an error that the rewrite released (new data supersedes it).
    pub unheld: u64,
    /// The file went from no dirty pages to some (the kernel's `__mark_inode_dirty`).
    pub inode_became_dirty: bool,
    /// Why processing stopped.
    pub stop: DirtyStop,
}

/// How a write ended, for [`PageMap::end_writeback`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteEnd {
    /// Durable: pages become clean.
    Stable,
    /// Accepted by a two-phase backend: pages become unstable under this verifier index.
    Unstable(u16),
    /// Failed with an error that may pass: pages become dirty again, to be retried.
    Redirty,
    /// Failed with an error that will not pass: pages become dirty and held.
    Hold,
}

/// What [`PageMap::end_writeback`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndOutcome {
    /// Pages that became clean.
    pub cleaned: u64,
    /// Pages that became unstable.
    pub unstable: u64,
    /// Pages that became dirty again.
    pub redirtied: u64,
    /// Pages truncated while in flight, now freed.
    pub freed: u64,
    /// Clean pages that reclaim had marked: the engine moves them to the reclaim end of the
    /// LRU so they are freed first (the kernel's immediate reclaim).
    pub rotate: Vec<FrameId>,
    /// Frames of freed pages, to return to the free pool.
    pub freed_frames: Vec<FrameId>,
    /// The file went from no dirty pages to some (a redirty).
    pub inode_became_dirty: bool,
}

impl EndOutcome {
    /// Adds `other`, the outcome of another run of the same write.
    pub fn merge(&mut self, other: EndOutcome) {
        self.cleaned += other.cleaned;
        self.unstable += other.unstable;
        self.redirtied += other.redirtied;
        self.freed += other.freed;
        self.rotate.extend(other.rotate);
        self.freed_frames.extend(other.freed_frames);
        self.inode_became_dirty |= other.inode_became_dirty;
    }
}

/// What [`PageMap::truncate`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TruncateOutcome {
    /// Clean pages dropped.
    pub clean: u64,
    /// Dirty pages dropped (the kernel's `folio_account_cleaned`).
    pub dirty: u64,
    /// Of those, pages held by an error.
    pub held: u64,
    /// Unstable pages dropped.
    pub unstable: u64,
    /// Pages under writeback marked to be freed when their write completes.
    pub doomed: u64,
    /// Frames to return to the free pool.
    pub freed_frames: Vec<FrameId>,
}

/// The pages one COMMIT covers, from [`PageMap::begin_commit`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitBatch {
    /// Tells this COMMIT's pages from those of the file's other COMMITs in flight.
    pub tag: u32,
    /// The pages, in runs.
    pub runs: Vec<Run>,
}

impl CommitBatch {
    /// Pages covered.
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.count).sum()
    }
}

/// What [`PageMap::resolve_commit`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitOutcome {
    /// Unstable pages made durable.
    pub cleaned: u64,
    /// Unstable pages whose verifier did not match: dirty again, to be rewritten.
    pub redirtied: u64,
    /// The file went from no dirty pages to some.
    pub inode_became_dirty: bool,
}

/// One resident page, as [`PageMap::page`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageInfo {
    /// Its state.
    pub state: PageState,
    /// Its frame.
    pub frame: FrameId,
    /// Its flags (see [`flag`]).
    pub flags: u8,
}

/// The pages of one file.
pub struct PageMap {
    index: BTreeMap<u64, u32>,
    chunks: Vec<Chunk>,
    free_chunks: Vec<u32>,
    hint_no: u64,
    hint_slot: u32,
    counts: StateCounts,
    inode_dirty: bool,
    last_unheld: u64,
    /// Tag of the next COMMIT batch.
    next_commit: u32,
}

impl Default for PageMap {
    fn default() -> Self {
        PageMap::new()
    }
}

impl PageMap {
    /// An empty file.
    pub fn new() -> PageMap {
        PageMap {
            index: BTreeMap::new(),
            chunks: Vec::new(),
            free_chunks: Vec::new(),
            hint_no: u64::MAX,
            hint_slot: 0,
            counts: StateCounts::default(),
            inode_dirty: false,
            last_unheld: 0,
            next_commit: 0,
        }
    }

    /// Resident pages by state.
    pub fn counts(&self) -> StateCounts {
        self.counts
    }

    /// Whether the file is marked as having dirty pages (the kernel's `I_DIRTY_PAGES`).
    pub fn inode_dirty(&self) -> bool {
        self.inode_dirty
    }

    pub(crate) fn inode_dirty_flag(&mut self, dirty: bool) {
        self.inode_dirty = dirty;
    }

    /// The resident page at `index`, if any.
    pub fn page(&self, index: u64) -> Option<PageInfo> {
        let slot_index = *self.index.get(&(index >> CHUNK_SHIFT))?;
        let slot = self.chunks[slot_index as usize].slots[(index & (CHUNK_PAGES - 1)) as usize];
        let state = PageState::from_u8(slot.state)?;
        Some(PageInfo { state, frame: FrameId(slot.frame), flags: slot.flags })
    }

    /// Sets `flags` on the resident page at `index`; false if it is not resident.
    pub fn set_flags(&mut self, index: u64, flags: u8) -> bool {
        assert_eq!(
            flags & (flag::TOWRITE | flag::HELD),
            0,
            "TOWRITE and HELD are managed by the page map"
        );
        match self.slot_mut(index) {
            Some(slot) if slot.state != 0 => {
                slot.flags |= flags;
                true
            }
            _ => false,
        }
    }

    /// Clears `flags` on the page at `index`, returning which of them were set.
    pub fn clear_flags(&mut self, index: u64, flags: u8) -> u8 {
        assert_eq!(
            flags & (flag::TOWRITE | flag::HELD),
            0,
            "TOWRITE and HELD are managed by the page map"
        );
        match self.slot_mut(index) {
            Some(slot) if slot.state != 0 => {
                let was = slot.flags & flags;
                slot.flags &= !flags;
                was
            }
            _ => 0,
        }
    }

    fn slot_mut(&mut self, index: u64) -> Option<&mut Slot> {
        let chunk = self.chunk_for(index >> CHUNK_SHIFT, false)?;
        Some(&mut self.chunks[chunk as usize].slots[(index & (CHUNK_PAGES - 1)) as usize])
    }

    /// The slab index of chunk `no`, creating it if asked.
    fn chunk_for(&mut self, no: u64, create: bool) -> Option<u32> {
        if self.hint_no == no {
            return Some(self.hint_slot);
        }
        let slot = match self.index.get(&no) {
            Some(&slot) => slot,
            None if create => {
                let slot = match self.free_chunks.pop() {
                    Some(slot) => slot,
                    None => {
                        self.chunks.push(Chunk::new());
                        (self.chunks.len() - 1) as u32
                    }
                };
                self.index.insert(no, slot);
                slot
            }
            None => return None,
        };
        self.hint_no = no;
        self.hint_slot = slot;
        Some(slot)
    }

    /// Frees chunk `no` if it holds no resident page.
    fn release_if_empty(&mut self, no: u64, slot: u32) {
        if self.chunks[slot as usize].count[0] == 0 {
            self.index.remove(&no);
            self.free_chunks.push(slot);
            if self.hint_no == no {
                self.hint_no = u64::MAX;
            }
        }
    }

    /// Moves the page in `slot` of chunk `chunk` from state `from` to `to` (0 = absent),
    /// keeping every count right.
    fn transition(&mut self, chunk: u32, offset: usize, to: u8) {
        let c = &mut self.chunks[chunk as usize];
        let slot = &mut c.slots[offset];
        let from = slot.state;
        debug_assert_ne!(from, to);
        invariant!(
            legal_transition(PageState::from_u8(from), PageState::from_u8(to)),
            "page state {:?} -> {:?} is no legal transition",
            PageState::from_u8(from),
            PageState::from_u8(to)
        );
        if from != 0 {
            c.count[from as usize] -= 1;
            bump(&mut self.counts, from, false);
        } else {
            c.count[0] += 1;
            self.counts.resident += 1;
        }
        if to != 0 {
            c.count[to as usize] += 1;
            bump(&mut self.counts, to, true);
        } else {
            c.count[0] -= 1;
            self.counts.resident -= 1;
        }
        if slot.flags & flag::TOWRITE != 0 && to != PageState::Dirty as u8 {
            slot.flags &= !flag::TOWRITE;
            c.tagged -= 1;
            self.counts.tagged -= 1;
        }
        if slot.flags & flag::HELD != 0 && to != PageState::Dirty as u8 {
            slot.flags &= !flag::HELD;
            c.held -= 1;
            self.counts.held -= 1;
        }
        if slot.flags & flag::COMMITTING != 0 && to != PageState::Unstable as u8 {
            // Rewritten, resolved or dropped: no COMMIT in flight covers this page any more.
            slot.flags &= !flag::COMMITTING;
            c.committing -= 1;
        }
        slot.state = to;
    }

    /// Clears `HELD` on a dirty page, returning whether it was set.
    fn unhold(&mut self, chunk: u32, offset: usize) -> bool {
        let c = &mut self.chunks[chunk as usize];
        let slot = &mut c.slots[offset];
        if slot.flags & flag::HELD == 0 {
            return false;
        }
        slot.flags &= !flag::HELD;
        c.held -= 1;
        self.counts.held -= 1;
        true
    }
}

/// The page-state changes the model allows (`None`: not resident): a page comes in clean (a
/// read) or dirty (a write); only a dirty page goes under writeback; a write ends it clean,
/// unstable (two-phase) or dirty again (failed), or frees it (truncated meanwhile); a COMMIT
/// ends an unstable page clean or dirty; a write dirties a clean or unstable page; clean, dirty
/// and unstable pages may be dropped (eviction, truncation). Writeback is left only by its end.
fn legal_transition(from: Option<PageState>, to: Option<PageState>) -> bool {
    use PageState::{Clean, Dirty, Unstable, Writeback};
    match from {
        None => matches!(to, Some(Clean | Dirty)),
        Some(Clean) => matches!(to, Some(Dirty) | None),
        Some(Dirty) => matches!(to, Some(Writeback) | None),
        Some(Writeback) => matches!(to, Some(Clean | Unstable | Dirty) | None),
        Some(Unstable) => matches!(to, Some(Clean | Dirty) | None),
    }
}

fn bump(counts: &mut StateCounts, state: u8, up: bool) {
    let field = match state {
        1 => &mut counts.clean,
        2 => &mut counts.dirty,
        3 => &mut counts.writeback,
        4 => &mut counts.unstable,
        _ => unreachable!("state {state}"),
    };
    if up {
        *field += 1;
    } else {
        *field -= 1;
    }
}

#[cfg(test)]
mod tests;
