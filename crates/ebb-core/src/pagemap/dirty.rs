//! Dirtying: a writer's pages become dirty (new pages take frames), tags for integrity
//! writeback, and held pages released for another try.

use super::{CHUNK_PAGES, CHUNK_SHIFT, DirtyOutcome, DirtyStop, PageMap, PageState, Slot, flag};
use crate::ids::FrameId;

impl PageMap {
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
}
