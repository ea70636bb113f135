//! Resident pages: lookups for reads, clean pages inserted by reads, eviction by reclaim,
//! truncation, and iteration.

use super::{
    CHUNK_PAGES, CHUNK_SHIFT, EMPTY, PageInfo, PageMap, PageState, Run, Slot, StateCounts,
    TruncateOutcome, bump, flag,
};
use crate::ids::FrameId;

impl PageMap {
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
