//! Writeback and commit: dirty runs taken for writing, their completions (stable, unstable
//! with a verifier, or failed), and two-phase commits resolved by verifier.

use super::{
    CHUNK_PAGES, CHUNK_SHIFT, CommitBatch, CommitOutcome, EMPTY, EndOutcome, PageMap, PageState,
    Run, Slot, WriteEnd, flag,
};
use crate::ids::FrameId;

/// Whether [`PageMap::start_writeback`] takes this page with these filters.
fn writeback_eligible(s: &Slot, tagged_only: bool, skip_held: bool) -> bool {
    s.state == PageState::Dirty as u8
        && (!tagged_only || s.flags & flag::TOWRITE != 0)
        && (!skip_held || s.flags & flag::HELD == 0)
}

impl PageMap {
    /// The first dirty page at or after `from` that [`PageMap::start_writeback`] would take
    /// with the same filters.
    pub fn next_writeback(&self, from: u64, tagged_only: bool, skip_held: bool) -> Option<u64> {
        let eligible = |s: &Slot| writeback_eligible(s, tagged_only, skip_held);
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
                return Some(base + (lo + offset) as u64);
            }
        }
        None
    }

    /// The last dirty page of the file (held ones included), if any.
    pub fn last_dirty(&self) -> Option<u64> {
        for (&no, &chunk) in self.index.iter().rev() {
            let c = &self.chunks[chunk as usize];
            if c.count[PageState::Dirty as usize] == 0 {
                continue;
            }
            let offset = c.slots.iter().rposition(|s| s.state == PageState::Dirty as u8);
            return offset.map(|offset| (no << CHUNK_SHIFT) + offset as u64);
        }
        None
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
        let eligible = |s: &Slot| writeback_eligible(s, tagged_only, skip_held);
        let found = self.next_writeback(from, tagged_only, skip_held);
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
}
