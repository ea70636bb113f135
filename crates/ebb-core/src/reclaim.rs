//! Frame allocation and reclaim of clean pages (kernel-reference §8).
//!
//! Allocations take frames while free memory stays above the `min` watermark. Below `low`,
//! background reclaim (kswapd's role) frees pages from the tail of the inactive list until
//! `high`; when an allocation still finds nothing, the allocating writer reclaims directly.
//! Reclaim frees only clean pages: a dirty, unstable or writeback page at the tail is marked
//! `RECLAIM` and rotated, and when everything scanned was dirty the flushers are woken (the
//! `flusher-only` policy of mechanism 6); a page whose writeback completes while marked is moved
//! to the tail so the next scan frees it at once. Reclaim is instantaneous in the core: it has no
//! CPU-time model, only the decisions.

use crate::engine::{Counters, Engine, PageMaps, WaitReason};
use crate::event::Action;
use crate::ids::{BackendId, FrameId};
use crate::memory::List;
use crate::pagemap::{PageState, flag};

/// Pages reclaim isolates per batch (the kernel's `SWAP_CLUSTER_MAX`).
pub const SWAP_CLUSTER_MAX: u64 = 32;

/// What one reclaim pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shrink {
    pub(crate) scanned: u64,
    pub(crate) reclaimed: u64,
    pub(crate) unqueued_dirty: u64,
    pub(crate) writeback: u64,
}

impl Engine {
    /// Takes up to `want` frames for the cache, reclaiming if memory is low.
    pub(crate) fn alloc_frames<M: PageMaps>(
        &mut self,
        want: usize,
        out: &mut Vec<FrameId>,
        maps: &mut M,
    ) -> usize {
        let wmark = self.mem.wmark;
        if self.mem.free_pages() < wmark.low + want as u64 {
            self.kswapd(maps);
        }
        let mut got = self.mem.alloc(want, wmark.min, out);
        if got < want {
            let shrink = self.shrink((want - got) as u64, true, maps);
            self.stats.direct_scanned += shrink.scanned;
            self.stats.direct_reclaimed += shrink.reclaimed;
            got += self.mem.alloc(want - got, wmark.min, out);
        }
        got
    }

    /// Background reclaim: from below `low` up to `high`.
    pub(crate) fn kswapd<M: PageMaps>(&mut self, maps: &mut M) {
        let wmark = self.mem.wmark;
        let free = self.mem.free_pages();
        if free >= wmark.low {
            return;
        }
        let shrink = self.shrink(wmark.high - free, false, maps);
        self.stats.kswapd_scanned += shrink.scanned;
        self.stats.kswapd_reclaimed += shrink.reclaimed;
    }

    /// Frees up to `target` clean pages from the inactive tail, scanning at most about twice
    /// the target plus one batch per call.
    fn shrink<M: PageMaps>(&mut self, target: u64, direct: bool, maps: &mut M) -> Shrink {
        let _ = direct;
        self.age_active_list();
        let mut out = Shrink::default();
        let budget = (2 * target + SWAP_CLUSTER_MAX).min(self.mem.list_len(List::Inactive));
        let mut woken: Vec<BackendId> = Vec::new();
        let mut batch = Shrink::default();
        while out.scanned < budget && out.reclaimed < target {
            let Some(frame) = self.mem.tail(List::Inactive) else { break };
            let (inode, index) = self.mem.owner(frame);
            out.scanned += 1;
            batch.scanned += 1;
            let info = maps.with(inode, |m| m.page(index));
            let Some(info) = info else {
                panic!("frame {frame} on the LRU holds no page ({inode}, {index})");
            };
            match info.state {
                PageState::Clean => {
                    let freed = maps.with(inode, |m| m.evict(index));
                    assert_eq!(freed, Some(frame));
                    self.mem.unlink(frame);
                    self.mem.release(frame);
                    self.account(inode, Counters { resident: -1, ..Counters::default() });
                    out.reclaimed += 1;
                }
                PageState::Dirty => {
                    maps.with(inode, |m| m.set_flags(index, flag::RECLAIM));
                    self.mem.move_to_head(frame, List::Inactive);
                    out.unqueued_dirty += 1;
                    batch.unqueued_dirty += 1;
                    self.stats.reclaim_immediate += 1;
                    let b = self.inodes[&inode].backend;
                    if !woken.contains(&b) {
                        woken.push(b);
                    }
                }
                PageState::Writeback | PageState::Unstable => {
                    maps.with(inode, |m| m.set_flags(index, flag::RECLAIM));
                    self.mem.move_to_head(frame, List::Inactive);
                    out.writeback += 1;
                }
            }
            if batch.scanned == SWAP_CLUSTER_MAX {
                if batch.unqueued_dirty == batch.scanned {
                    // Everything isolated was dirty and not queued: the flushers are behind.
                    for &b in &woken {
                        self.start_all(b);
                        self.stats.reclaim_flusher_wakeups += 1;
                    }
                }
                batch = Shrink::default();
            }
        }
        if out.reclaimed < target && out.unqueued_dirty > 0 {
            for &b in &woken {
                self.start_all(b);
            }
        }
        out
    }

    /// Keeps the inactive list at least as long as the active one by moving pages from the
    /// active tail to the inactive head (the kernel's `inactive_is_low` / `shrink_active_list`).
    fn age_active_list(&mut self) {
        while self.mem.list_len(List::Inactive) < self.mem.list_len(List::Active) {
            let Some(frame) = self.mem.tail(List::Active) else { break };
            self.mem.move_to_head(frame, List::Inactive);
        }
    }

    /// Lets writers waiting for memory retry once some is free or reclaimable.
    pub(crate) fn wake_memory_waiters<M: PageMaps>(&mut self, maps: &mut M) {
        if !self.waiters.values().any(|r| *r == WaitReason::Memory) {
            return;
        }
        self.kswapd(maps);
        if self.mem.free_pages() <= self.mem.wmark.min {
            // Try freeing clean pages the completions just produced.
            let shrink = self.shrink(SWAP_CLUSTER_MAX, true, maps);
            self.stats.direct_scanned += shrink.scanned;
            self.stats.direct_reclaimed += shrink.reclaimed;
            if self.mem.free_pages() <= self.mem.wmark.min {
                return;
            }
        }
        let ready: Vec<_> = self
            .waiters
            .iter()
            .filter(|(_, r)| **r == WaitReason::Memory)
            .map(|(&w, _)| w)
            .collect();
        for w in ready {
            self.waiters.remove(&w);
            self.emit(Action::Resume { writer: w });
        }
    }
}
