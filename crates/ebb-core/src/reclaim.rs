//! Frame allocation and reclaim of clean pages (kernel-reference §8).
//!
//! Allocations take frames while free memory stays above the `min` watermark. Below `low`,
//! background reclaim (kswapd's role) frees pages from the tail of the inactive list until
//! `high`; when an allocation still finds nothing, the allocating writer reclaims directly.
//! Reclaim frees only clean pages. A dirty page at the tail is handled by policy:
//!
//! - `flusher-only` (default, v3.2 and later): it is marked `RECLAIM` and rotated; when a batch
//!   finds only dirty pages the flushers are woken. Direct reclaim never writes. Background
//!   reclaim writes a page itself only when in trouble: the page was already marked once (seen
//!   twice at the tail) and the last batch was all unqueued dirty pages (the kernel's
//!   `PGDAT_DIRTY` rule).
//! - `legacy` (before v3.2): both kinds of reclaim write the dirty page themselves, one page
//!   per write (`pageout`), and mark it so it is freed when the write completes.
//!
//! Pages under writeback or unstable are marked and rotated; a page whose writeback completes
//! while marked is moved to the tail so the next scan frees it at once. Reclaim is instantaneous
//! in the core: it has no CPU-time model, only the decisions.

use crate::config::ReclaimPolicy;
use crate::engine::{Counters, Engine, IoKind, IoRecord, PageMaps, WaitReason};
use crate::event::{Action, IoClass, Issuer};
use crate::ids::{BackendId, FrameId, InodeId};
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
                    let seen_before = info.flags & flag::RECLAIM != 0;
                    let held = info.flags & flag::HELD != 0;
                    let write_it = !held
                        && match self.cfg.reclaim {
                            ReclaimPolicy::Legacy => true,
                            ReclaimPolicy::FlusherOnly => !direct && seen_before && self.node_dirty,
                        };
                    maps.with(inode, |m| m.set_flags(index, flag::RECLAIM));
                    self.mem.move_to_head(frame, List::Inactive);
                    if write_it && self.pageout(inode, index, maps) {
                        if direct {
                            self.stats.direct_written += 1;
                        } else {
                            self.stats.kswapd_written += 1;
                        }
                    } else {
                        out.unqueued_dirty += 1;
                        batch.unqueued_dirty += 1;
                        self.stats.reclaim_immediate += 1;
                        let b = self.inodes[&inode].backend;
                        if !woken.contains(&b) {
                            woken.push(b);
                        }
                    }
                }
                PageState::Writeback | PageState::Unstable => {
                    maps.with(inode, |m| m.set_flags(index, flag::RECLAIM));
                    self.mem.move_to_head(frame, List::Inactive);
                    out.writeback += 1;
                }
            }
            if batch.scanned == SWAP_CLUSTER_MAX {
                // kswapd flags the node when a whole batch was unqueued dirty pages.
                if !direct {
                    self.node_dirty = batch.unqueued_dirty == batch.scanned;
                }
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

    /// Writes one dirty page from reclaim (the kernel's `pageout`): a single-page write, outside
    /// the flusher's chunking. Returns false if the page could not be taken for writing.
    fn pageout<M: PageMaps>(&mut self, inode: InodeId, index: u64, maps: &mut M) -> bool {
        let Some(run) = maps.with(inode, |m| {
            let run = m.start_writeback(index, 1, false, true).filter(|r| r.first == index)?;
            m.take_unheld();
            Some(run)
        }) else {
            return false;
        };
        let b = self.inodes[&inode].backend;
        let io = self.new_io();
        let now = self.now;
        self.ios.insert(
            io,
            IoRecord {
                backend: b,
                inode,
                kind: IoKind::Write { run, issuer: Issuer::Reclaim },
                issued: now,
            },
        );
        let meta = self.inodes.get_mut(&inode).expect("known inode");
        meta.inflight.insert(io);
        let wb = &mut self.wbs[b.index()];
        wb.inflight += 1;
        wb.write_inflight += 1;
        wb.wbt.on_write_issue(now);
        self.account(inode, Counters { dirty: -1, writeback: 1, ..Counters::default() });
        self.stats.writes += 1;
        self.stats.write_pages += 1;
        self.emit(Action::Write {
            io,
            backend: b,
            inode,
            first_page: index,
            pages: 1,
            class: IoClass::Reclaim,
            issuer: Issuer::Reclaim,
        });
        true
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
