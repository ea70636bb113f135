//! The pages of one file: their states, frames and flags (the kernel's `address_space` xarray).
//!
//! A `PageMap` is pure data with range operations. It knows nothing about other files, limits
//! or time: every operation returns what changed, and the engine applies those changes to the
//! counters of the cache, the backend and the group at the same transition points as the
//! kernel (kernel-reference §1.2). Keeping one file's pages in their own structure lets the
//! runtime lock files separately, so writers of different files never share a lock on the
//! per-page path (mechanism 8).
//!
//! States are exclusive: a resident page is exactly one of clean, dirty, writeback or unstable,
//! so `clean + dirty + writeback + unstable = resident` holds by construction. A writer that
//! wants to change a page under writeback waits for the write to finish (stable pages), which
//! is what keeps the states exclusive.
//!
//! Layout: pages are grouped in chunks of 512 (2 MiB); a chunk exists only while it holds a
//! resident page, and keeps per-state counts so scans for dirty or tagged pages skip clean
//! regions in one step.

use std::collections::BTreeMap;

use crate::ids::FrameId;

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

struct Chunk {
    slots: Box<[Slot]>,
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
        Chunk {
            slots: vec![EMPTY; CHUNK_PAGES as usize].into_boxed_slice(),
            count: [0; 5],
            tagged: 0,
            held: 0,
            committing: 0,
        }
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

    /// A writer writes pages `[first, first + count)`.
    ///
    /// Pages not resident take frames from `frames` (the writer's reserve); each new page is
    /// appended to `added` with its index so the engine can put its frame on the LRU. Clean and
    /// unstable pages become dirty; dirty pages stay dirty (a rewrite is not a new dirtying).
    /// Processing stops after `max_dirtied` pages became dirty, when a frame is needed and
    /// `frames` is empty, or at a page under writeback.
    pub fn dirty_range(
        &mut self,
        first: u64,
        count: u64,
        max_dirtied: u64,
        frames: &mut Vec<FrameId>,
        added: &mut Vec<(FrameId, u64)>,
    ) -> DirtyOutcome {
        let was_dirty = self.inode_dirty;
        let mut out = DirtyOutcome {
            consumed: 0,
            dirtied: 0,
            from_unstable: 0,
            new_pages: 0,
            unheld: 0,
            inode_became_dirty: false,
            stop: DirtyStop::Done,
        };
        let end = first + count;
        let mut index = first;
        'chunks: while index < end {
            let no = index >> CHUNK_SHIFT;
            let chunk = self.chunk_for(no, true).expect("created");
            let chunk_end = ((no + 1) << CHUNK_SHIFT).min(end);
            while index < chunk_end {
                if out.dirtied == max_dirtied {
                    out.stop = DirtyStop::Limit;
                    break 'chunks;
                }
                let offset = (index & (CHUNK_PAGES - 1)) as usize;
                let slot = self.chunks[chunk as usize].slots[offset];
                match slot.state {
                    0 => {
                        let Some(frame) = frames.pop() else {
                            out.stop = DirtyStop::NeedFrames;
                            self.release_if_empty(no, chunk);
                            break 'chunks;
                        };
                        self.chunks[chunk as usize].slots[offset] =
                            Slot { frame: frame.0, state: 0, flags: 0, verifier: 0, commit: 0 };
                        self.transition(chunk, offset, PageState::Dirty as u8);
                        added.push((frame, index));
                        out.new_pages += 1;
                        out.dirtied += 1;
                    }
                    s if s == PageState::Clean as u8 => {
                        self.transition(chunk, offset, PageState::Dirty as u8);
                        out.dirtied += 1;
                    }
                    s if s == PageState::Unstable as u8 => {
                        self.transition(chunk, offset, PageState::Dirty as u8);
                        out.dirtied += 1;
                        out.from_unstable += 1;
                    }
                    s if s == PageState::Dirty as u8 => {}
                    _ => {
                        out.stop = DirtyStop::Busy(index);
                        break 'chunks;
                    }
                }
                // The write marks the page accessed: the 2.6.x-3.x write path calls
                // `mark_page_accessed` on each page it copies into, so a written page reaches
                // the LRU tail referenced (see `reclaim`).
                self.chunks[chunk as usize].slots[offset].flags |= flag::REFERENCED;
                // A rewrite clears a permanent error: the user supplied new data.
                if self.unhold(chunk, offset) {
                    out.unheld += 1;
                }
                index += 1;
                out.consumed += 1;
            }
        }
        if out.dirtied > 0 {
            self.inode_dirty = true;
            out.inode_became_dirty = !was_dirty;
        }
        out
    }

    /// Tags every dirty page for an integrity sync and returns how many are tagged now.
    pub fn tag_dirty(&mut self) -> u64 {
        let chunks: Vec<u32> = self.index.values().copied().collect();
        for chunk in chunks {
            let c = &mut self.chunks[chunk as usize];
            if c.count[PageState::Dirty as usize] == 0 {
                continue;
            }
            for slot in c.slots.iter_mut() {
                if slot.state == PageState::Dirty as u8 && slot.flags & flag::TOWRITE == 0 {
                    slot.flags |= flag::TOWRITE;
                    c.tagged += 1;
                    self.counts.tagged += 1;
                }
            }
        }
        self.counts.tagged
    }

    /// Held pages that the last [`PageMap::start_writeback`] calls took for writing again,
    /// since the previous call of this method (the engine moves them out of its held count).
    pub fn take_unheld(&mut self) -> u64 {
        std::mem::take(&mut self.last_unheld)
    }

    /// Takes the next run of dirty pages at or after `from` for writing: at most `max_run`
    /// contiguous pages, only tagged ones if `tagged_only`, skipping held pages if
    /// `skip_held`. The pages move to writeback. `None` when no such page remains past `from`.
    pub fn start_writeback(
        &mut self,
        from: u64,
        max_run: u64,
        tagged_only: bool,
        skip_held: bool,
    ) -> Option<Run> {
        assert!(max_run > 0);
        let eligible = |s: &Slot| {
            s.state == PageState::Dirty as u8
                && (!tagged_only || s.flags & flag::TOWRITE != 0)
                && (!skip_held || s.flags & flag::HELD == 0)
        };
        // Find the first eligible page.
        let mut found = None;
        let start_no = from >> CHUNK_SHIFT;
        for (&no, &chunk) in self.index.range(start_no..) {
            let c = &self.chunks[chunk as usize];
            let mut candidates =
                if tagged_only { c.tagged } else { c.count[PageState::Dirty as usize] };
            if skip_held && !tagged_only {
                candidates -= c.held;
            }
            if candidates == 0 {
                continue;
            }
            let base = no << CHUNK_SHIFT;
            let lo = if no == start_no { (from - base) as usize } else { 0 };
            if let Some(offset) = c.slots[lo..].iter().position(eligible) {
                found = Some(base + (lo + offset) as u64);
                break;
            }
        }
        let first = found?;
        let mut index = first;
        while index - first < max_run {
            let no = index >> CHUNK_SHIFT;
            let Some(chunk) = self.chunk_for(no, false) else { break };
            let offset = (index & (CHUNK_PAGES - 1)) as usize;
            if !eligible(&self.chunks[chunk as usize].slots[offset]) {
                break;
            }
            if self.chunks[chunk as usize].slots[offset].flags & flag::HELD != 0 {
                self.last_unheld += 1;
            }
            self.transition(chunk, offset, PageState::Writeback as u8);
            index += 1;
        }
        Some(Run { first, count: index - first })
    }

    /// A write of `run` (all under writeback) ended as `end`.
    pub fn end_writeback(&mut self, run: Run, end: WriteEnd) -> EndOutcome {
        let was_dirty = self.inode_dirty;
        let mut out = EndOutcome::default();
        let (to, verifier, extra_flag) = match end {
            WriteEnd::Stable => (PageState::Clean as u8, 0, 0),
            WriteEnd::Unstable(v) => (PageState::Unstable as u8, v, 0),
            WriteEnd::Redirty => (PageState::Dirty as u8, 0, 0),
            WriteEnd::Hold => (PageState::Dirty as u8, 0, flag::HELD),
        };
        for index in run.first..run.end() {
            let no = index >> CHUNK_SHIFT;
            let chunk = self.chunk_for(no, false).expect("a page under writeback is resident");
            let offset = (index & (CHUNK_PAGES - 1)) as usize;
            let slot = self.chunks[chunk as usize].slots[offset];
            assert_eq!(
                slot.state,
                PageState::Writeback as u8,
                "page {index} is not under writeback"
            );
            if slot.flags & flag::DOOMED != 0 {
                self.transition(chunk, offset, 0);
                self.chunks[chunk as usize].slots[offset] = EMPTY;
                out.freed += 1;
                out.freed_frames.push(FrameId(slot.frame));
                self.release_if_empty(no, chunk);
                continue;
            }
            self.transition(chunk, offset, to);
            let c = &mut self.chunks[chunk as usize];
            let s = &mut c.slots[offset];
            s.verifier = verifier;
            if extra_flag == flag::HELD {
                s.flags |= flag::HELD;
                c.held += 1;
                self.counts.held += 1;
            }
            let s = &mut self.chunks[chunk as usize].slots[offset];
            match end {
                WriteEnd::Stable => {
                    out.cleaned += 1;
                    if s.flags & flag::RECLAIM != 0 {
                        s.flags &= !flag::RECLAIM;
                        out.rotate.push(FrameId(s.frame));
                    }
                }
                WriteEnd::Unstable(_) => out.unstable += 1,
                WriteEnd::Redirty | WriteEnd::Hold => out.redirtied += 1,
            }
        }
        if out.redirtied > 0 {
            self.inode_dirty = true;
            out.inode_became_dirty = !was_dirty;
        }
        out
    }

    /// Marks every unstable page that no COMMIT in flight covers yet as covered by a COMMIT
    /// about to be sent, and returns them (no runs: nothing to commit). Several COMMITs of one
    /// file may be in flight, each covering the pages it marked, as the NFS client's commit
    /// list hands each COMMIT the requests whose WRITE completed since the last.
    pub fn begin_commit(&mut self) -> CommitBatch {
        let tag = self.next_commit;
        self.next_commit = self.next_commit.wrapping_add(1);
        let mut runs: Vec<Run> = Vec::new();
        let entries: Vec<(u64, u32)> = self.index.iter().map(|(&no, &c)| (no, c)).collect();
        for (no, chunk) in entries {
            let c = &mut self.chunks[chunk as usize];
            if c.count[PageState::Unstable as usize] == c.committing {
                continue;
            }
            for (offset, slot) in c.slots.iter_mut().enumerate() {
                if slot.state != PageState::Unstable as u8 || slot.flags & flag::COMMITTING != 0 {
                    continue;
                }
                slot.flags |= flag::COMMITTING;
                slot.commit = tag;
                c.committing += 1;
                let index = (no << CHUNK_SHIFT) + offset as u64;
                match runs.last_mut() {
                    Some(run) if run.end() == index => run.count += 1,
                    _ => runs.push(Run { first: index, count: 1 }),
                }
            }
        }
        CommitBatch { tag, runs }
    }

    /// The COMMIT of `batch` ended: its pages still unstable and covered by it become clean
    /// when `durable(verifier)` says their write verifier matches, and dirty otherwise (the
    /// server restarted and lost them). Pages rewritten meanwhile, even if written again and
    /// covered by a later COMMIT, are untouched.
    pub fn resolve_commit(
        &mut self,
        batch: &CommitBatch,
        durable: impl Fn(u16) -> bool,
    ) -> CommitOutcome {
        let was_dirty = self.inode_dirty;
        let mut out = CommitOutcome::default();
        for run in &batch.runs {
            for index in run.first..run.end() {
                let no = index >> CHUNK_SHIFT;
                let Some(chunk) = self.chunk_for(no, false) else { continue };
                let offset = (index & (CHUNK_PAGES - 1)) as usize;
                let slot = self.chunks[chunk as usize].slots[offset];
                if slot.state != PageState::Unstable as u8
                    || slot.flags & flag::COMMITTING == 0
                    || slot.commit != batch.tag
                {
                    continue;
                }
                let ok = durable(slot.verifier);
                let to = if ok { PageState::Clean } else { PageState::Dirty };
                self.transition(chunk, offset, to as u8);
                if ok {
                    out.cleaned += 1;
                } else {
                    out.redirtied += 1;
                }
            }
        }
        if out.redirtied > 0 {
            self.inode_dirty = true;
            out.inode_became_dirty = !was_dirty;
        }
        out
    }

    /// Looks up `[first, first + count)` for a read: marks resident pages referenced and
    /// appends the runs of missing pages to `missing`. Returns the number of resident pages.
    pub fn lookup(&mut self, first: u64, count: u64, missing: &mut Vec<Run>) -> u64 {
        let mut hits = 0;
        let mut gap: Option<Run> = None;
        for index in first..first + count {
            let resident = match self.slot_mut(index) {
                Some(slot) if slot.state != 0 => {
                    slot.flags |= flag::REFERENCED;
                    true
                }
                _ => false,
            };
            if resident {
                hits += 1;
                if let Some(run) = gap.take() {
                    missing.push(run);
                }
            } else {
                match gap.as_mut() {
                    Some(run) => run.count += 1,
                    None => gap = Some(Run { first: index, count: 1 }),
                }
            }
        }
        if let Some(run) = gap {
            missing.push(run);
        }
        hits
    }

    /// Inserts clean pages read from the backend: page `first + i` gets `frames[i]`, the frame
    /// the driver filled with that page's data. Pages that became resident meanwhile (written,
    /// or read by another request) keep their contents, and their frames come back unused.
    /// Returns the `(frame, index)` pairs inserted and the unused frames.
    pub fn insert_clean(
        &mut self,
        first: u64,
        frames: &[FrameId],
    ) -> (Vec<(FrameId, u64)>, Vec<FrameId>) {
        let mut inserted = Vec::with_capacity(frames.len());
        let mut unused = Vec::new();
        for (index, &frame) in (first..).zip(frames) {
            let no = index >> CHUNK_SHIFT;
            let chunk = self.chunk_for(no, true).expect("created");
            let offset = (index & (CHUNK_PAGES - 1)) as usize;
            if self.chunks[chunk as usize].slots[offset].state != 0 {
                unused.push(frame);
                continue;
            }
            self.chunks[chunk as usize].slots[offset] =
                Slot { frame: frame.0, state: 0, flags: 0, verifier: 0, commit: 0 };
            self.transition(chunk, offset, PageState::Clean as u8);
            inserted.push((frame, index));
        }
        (inserted, unused)
    }

    /// Evicts the clean page at `index`, returning its frame; `None` if it is not clean.
    pub fn evict(&mut self, index: u64) -> Option<FrameId> {
        let no = index >> CHUNK_SHIFT;
        let chunk = self.chunk_for(no, false)?;
        let offset = (index & (CHUNK_PAGES - 1)) as usize;
        let slot = self.chunks[chunk as usize].slots[offset];
        if slot.state != PageState::Clean as u8 {
            return None;
        }
        self.transition(chunk, offset, 0);
        self.chunks[chunk as usize].slots[offset] = EMPTY;
        self.release_if_empty(no, chunk);
        Some(FrameId(slot.frame))
    }

    /// Drops every page at or after `from` (truncate, unlink). Pages under writeback are marked
    /// to be freed when their write completes.
    pub fn truncate(&mut self, from: u64) -> TruncateOutcome {
        let mut out = TruncateOutcome::default();
        let chunks: Vec<(u64, u32)> =
            self.index.range(from >> CHUNK_SHIFT..).map(|(&no, &slot)| (no, slot)).collect();
        for (no, chunk) in chunks {
            let base = no << CHUNK_SHIFT;
            let lo = from.saturating_sub(base).min(CHUNK_PAGES) as usize;
            for offset in lo..CHUNK_PAGES as usize {
                let slot = self.chunks[chunk as usize].slots[offset];
                match PageState::from_u8(slot.state) {
                    None => continue,
                    Some(PageState::Writeback) => {
                        self.chunks[chunk as usize].slots[offset].flags |= flag::DOOMED;
                        out.doomed += 1;
                        continue;
                    }
                    Some(PageState::Clean) => out.clean += 1,
                    Some(PageState::Dirty) => {
                        out.dirty += 1;
                        if slot.flags & flag::HELD != 0 {
                            out.held += 1;
                        }
                    }
                    Some(PageState::Unstable) => out.unstable += 1,
                }
                self.transition(chunk, offset, 0);
                self.chunks[chunk as usize].slots[offset] = EMPTY;
                out.freed_frames.push(FrameId(slot.frame));
            }
            self.release_if_empty(no, chunk);
        }
        if self.counts.dirty == 0 {
            self.inode_dirty = false;
        }
        out
    }

    /// Recomputes the counts from the pages, for checkers (O(pages)).
    pub fn recount(&self) -> StateCounts {
        let mut counts = StateCounts::default();
        for &chunk in self.index.values() {
            for slot in self.chunks[chunk as usize].slots.iter() {
                if slot.state == 0 {
                    continue;
                }
                counts.resident += 1;
                bump(&mut counts, slot.state, true);
                if slot.flags & flag::TOWRITE != 0 {
                    counts.tagged += 1;
                }
                if slot.flags & flag::HELD != 0 {
                    counts.held += 1;
                }
            }
        }
        counts
    }

    /// Every resident page with its index, in index order (for checkers and debugging).
    pub fn pages(&self) -> impl Iterator<Item = (u64, PageInfo)> + '_ {
        self.index.iter().flat_map(move |(&no, &chunk)| {
            self.chunks[chunk as usize].slots.iter().enumerate().filter_map(move |(i, slot)| {
                let state = PageState::from_u8(slot.state)?;
                Some((
                    (no << CHUNK_SHIFT) + i as u64,
                    PageInfo { state, frame: FrameId(slot.frame), flags: slot.flags },
                ))
            })
        })
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
