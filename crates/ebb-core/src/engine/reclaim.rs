//! The engine drives reclaim (policy and state: `crate::reclaim`): frame and anonymous
//! allocations down the zonelist, direct reclaim, the scan of a zone's inactive list, swap-out
//! and `pageout` writes, and the writers waiting for memory. Background reclaim: `kswapd.rs`.

use super::{Counters, Engine, IoKind, IoRecord, PageMaps, WaitReason};
use crate::config::ReclaimPolicy;
use crate::event::{Action, IoClass, IoError, Issuer, Stability, Verdict};
use crate::ids::{BackendId, FrameId, InodeId, IoId, WriterId};
use crate::memory::{List, Watermarks};
use crate::pagemap::{PageState, Run, flag};
use crate::reclaim::{self, DirtyPage, SWAP_CLUSTER_MAX, SWAP_INODE, Shrink};
use crate::time::{Duration, Instant};
use crate::writer::{CallState, Writer};

impl Engine {
    /// Takes up to `want` frames for the cache, reclaiming if memory is low.
    pub(crate) fn alloc_frames<M: PageMaps>(
        &mut self,
        want: usize,
        out: &mut Vec<FrameId>,
        maps: &mut M,
    ) -> usize {
        let class = self.mem.top_zone();
        self.reclaim.clear_direct_throttle();
        if self.room_above(class, |w| w.low) < (want as u64).max(1) {
            self.kswapd_wake(maps);
        }
        let mut got = self.alloc_zonelist(class, want, out);
        if got < want {
            self.direct_reclaim((want - got) as u64, maps);
            got += self.alloc_zonelist(class, want - got, out);
        }
        self.reclaim.file_added(got as u64);
        got
    }

    /// Free pages the zones of `class` hold above `mark` plus their lowmem reserve.
    fn room_above(&self, class: usize, mark: impl Fn(Watermarks) -> u64) -> u64 {
        (0..=class)
            .map(|z| {
                let floor = mark(self.mem.zone_wmark(z)) + self.mem.reserve(z, class);
                self.mem.zone_free(z).saturating_sub(floor)
            })
            .sum()
    }

    /// Frames from the zones of `class`, highest first, each down to `min` plus the reserve.
    fn alloc_zonelist(&mut self, class: usize, want: usize, out: &mut Vec<FrameId>) -> usize {
        let mut got = 0;
        for z in (0..=class).rev() {
            if got == want {
                break;
            }
            let floor = self.mem.zone_wmark(z).min + self.mem.reserve(z, class);
            got += self.mem.alloc(z, want - got, floor, out);
        }
        got
    }

    /// Anonymous pages from the zones of `class`, as [`Engine::alloc_zonelist`].
    fn anon_zonelist(&mut self, class: usize, want: u64) -> u64 {
        let mut got = 0;
        for z in (0..=class).rev() {
            if got == want {
                break;
            }
            let floor = self.mem.zone_wmark(z).min + self.mem.reserve(z, class);
            got += self.mem.take_anon(z, want - got, floor);
        }
        got
    }

    /// Direct reclaim for an allocation of the highest class: the zones of the zonelist,
    /// highest first, until `target` pages are freed.
    fn direct_reclaim<M: PageMaps>(&mut self, target: u64, maps: &mut M) {
        let class = self.mem.top_zone();
        let mut shrink = Shrink::default();
        for z in (0..=class).rev() {
            if shrink.reclaimed >= target {
                break;
            }
            shrink.add(self.shrink(z, target - shrink.reclaimed, true, maps));
        }
        self.stats.direct_scanned += shrink.scanned;
        self.stats.direct_reclaimed += shrink.reclaimed;
        if self.cfg.reclaim.wakes_flushers_after_overscan() && 2 * shrink.scanned > 3 * target {
            // 2.6.3x-3.x `do_try_to_free_pages`: direct reclaim that scanned more than 1.5 times
            // what it wanted wakes the flushers to write as many pages as it scanned
            // (docs/mechanisms.md#6-reclaim, older history). `flusher-only` wakes them by the batch
            // rules of `shrink_counted` instead.
            for b in 0..self.wbs.len() {
                let b = BackendId(b as u32);
                if self.wbs[b.index()].counters.writable() > 0 {
                    self.queue_reclaim_work(b, shrink.scanned);
                    self.stats.reclaim_flusher_wakeups += 1;
                }
            }
        }
        let dirty = shrink.unqueued_dirty + shrink.writeback;
        if self.cfg.reclaim.throttles_when_congested()
            && dirty > 0
            && dirty == shrink.immediate
            && !self.write_pending_small()
        {
            // Every dirty page met was already under writeback and marked: the LRU is
            // congested; reclaim_throttle(CONGESTED), one jiffy.
            self.reclaim.throttle_direct(self.now + Duration::from_jiffies(1, self.hz));
        }
    }

    /// Write-pending pages are at most half of the reclaimable ones: throttling would happen
    /// naturally when they reach the tail (the kernel's skip of CONGESTED and NOPROGRESS).
    fn write_pending_small(&self) -> bool {
        let g = &self.global;
        let pending = g.writable() + g.writeback();
        let reclaimable = self.mem.list_len(List::Inactive) + self.mem.list_len(List::Active);
        2 * pending <= reclaimable
    }

    /// After an allocation: the sleep direct reclaim's throttle asks of the writer, if any.
    /// Counts it as a reclaim stall of known length.
    ///
    /// A throttle set by an earlier allocation whose time has passed asks nothing: taken by a
    /// later check it was a sleep into the past (swarm seed 8779: the simulator's clock went
    /// backwards and the engine panicked).
    pub(crate) fn take_direct_throttle(&mut self, w: &mut Writer) -> Option<Verdict> {
        let now = self.now;
        let until = self.reclaim.take_direct_throttle(now)?;
        w.call = CallState::Blocked;
        w.call_start = self.now;
        self.stats.reclaim_stalls += 1;
        self.stats.reclaim_stall_ns += until.saturating_since(self.now).as_nanos();
        Some(w.note(Verdict::Sleep { until }))
    }

    /// A writer touches `pages` new pages of an anonymous mapping (page faults): takes frames
    /// for them, reclaiming as a file allocation does. Returns the pages granted and the
    /// writer's next move (the writer protocol, `crate::writer::call`): when none could be had
    /// it is [`crate::WriterNext::Wait`] for memory (or a sleep of reclaim's throttling); the writer
    /// then continues ([`crate::WriterInput::Continue`]) and faults again.
    pub fn anon_fault<M: PageMaps>(
        &mut self,
        now: Instant,
        w: &mut Writer,
        pages: u64,
        maps: &mut M,
    ) -> (u64, crate::WriterNext) {
        self.advance(now);
        self.apply_pending(w, maps);
        let class = self.mem.top_zone();
        self.reclaim.clear_direct_throttle();
        if self.room_above(class, |w| w.low) < pages.max(1) {
            self.kswapd_wake(maps);
        }
        let mut got = self.anon_zonelist(class, pages);
        if got < pages {
            self.direct_reclaim(pages - got, maps);
            got += self.anon_zonelist(class, pages - got);
        }
        self.reclaim.anon_added(got);
        let verdict = if got == 0 {
            self.memory_wait(w);
            Verdict::Wait
        } else if let Some(sleep) = self.take_direct_throttle(w) {
            sleep
        } else {
            Verdict::Proceed { stalled: Duration::ZERO, throttled: false }
        };
        self.drive_all(maps);
        (got, self.writer_next(w, verdict))
    }

    /// Gives back the frame reserves of `writers` (the answer to [`Action::ReturnReserves`]):
    /// writers not in the middle of a write, whose reserves sit unused. Writers waiting for
    /// memory may then go on ([`Action::Resume`]). A writer's next throttle check refills its
    /// reserve.
    pub fn return_reserves<'w, M: PageMaps>(
        &mut self,
        now: Instant,
        writers: impl IntoIterator<Item = &'w mut Writer>,
        maps: &mut M,
    ) {
        self.advance(now);
        let returned: u64 = writers.into_iter().map(|w| self.take_reserve(w)).sum();
        self.stats.reserve_frames_returned += returned;
        if returned > 0 {
            self.wake_memory_waiters(maps);
            self.drive_all(maps);
        }
    }

    /// Releases the frames of `w`'s reserve; returns how many.
    pub(crate) fn take_reserve(&mut self, w: &mut Writer) -> u64 {
        let n = w.frames.len() as u64;
        for frame in w.frames.drain(..) {
            self.mem.release(frame);
        }
        self.reserved = self.reserved.saturating_sub(n);
        n
    }

    /// A writer found no frame even after direct reclaim: it waits for memory.
    pub(crate) fn memory_wait(&mut self, w: &mut Writer) {
        self.reclaim.clear_direct_throttle();
        w.call = CallState::Blocked;
        w.call_start = self.now;
        self.waiters.insert(w.id, WaitReason::Memory);
        self.reclaim.stall(w.id, self.now);
        self.stats.memory_waits += 1;
        self.stats.reclaim_stalls += 1;
        if self.reserved > w.frames.len() as u64 {
            // Other writers' reserves hold frames: idle ones could hold the whole budget
            // (2000 open files of one page each), and nothing would ever free them.
            self.stats.reserve_sweeps += 1;
            self.emit(Action::ReturnReserves);
        }
    }

    /// The error of held pages when they leave nothing else that could free memory: no page is
    /// dirty and writable, under writeback, unstable or being read, so a writer waiting for a
    /// frame would wait until someone frees space on the backend (write-error policy,
    /// `engine`). `None` while anything else may still free memory.
    pub(crate) fn memory_held(&self) -> Option<IoError> {
        let g = &self.global;
        let in_flight = g.writable() + g.writeback() + g.unstable();
        let reading = self.ios.values().any(|r| matches!(r.kind, IoKind::Read { .. }));
        let swapping = self.reclaim.swapping();
        if g.held <= 0 || in_flight > 0 || reading || swapping {
            return None;
        }
        self.last_hold.or(Some(IoError { errno: crate::event::errno::ENOSPC }))
    }

    /// A writer leaves: it no longer waits.
    pub(crate) fn reclaim_forget(&mut self, w: WriterId) {
        if let Some(since) = self.reclaim.forget(w) {
            self.stats.reclaim_stall_ns += self.now.saturating_since(since).as_nanos();
        }
    }

    /// Direct reclaim's pass over zone `z` ([`Engine::shrink_counted`]).
    fn shrink<M: PageMaps>(&mut self, z: usize, target: u64, direct: bool, maps: &mut M) -> Shrink {
        self.shrink_counted(z, target, direct, maps).0
    }

    /// Frees up to `target` clean pages from the inactive tail of zone `z`, scanning at most
    /// about twice the target plus one batch per call. Also returns the file pages scanned.
    pub(super) fn shrink_counted<M: PageMaps>(
        &mut self,
        z: usize,
        target: u64,
        direct: bool,
        maps: &mut M,
    ) -> (Shrink, u64) {
        self.age_active_list(z);
        let mut out = Shrink::default();
        // Anonymous pages written to swap since the last pass are freed first (they were
        // rotated to the tail when their write completed).
        let freed = self.mem.free_swapped_anon(z, target);
        out.scanned += freed;
        out.reclaimed += freed;
        let mut budget = 2 * target + SWAP_CLUSTER_MAX;
        // Pages already on their way to swap count toward the target: the kernel's kswapd
        // does not scan again for memory its writes are about to free.
        let anon_target = target.saturating_sub(self.mem.zone_anon_writeback(z));
        let anon_scan = self.anon_scan_share(z, (2 * anon_target).min(budget));
        if anon_scan > 0 && out.reclaimed < target {
            self.swap_out(z, anon_scan, direct);
            out.scanned += anon_scan;
            budget -= anon_scan;
        }
        let budget = out.scanned + budget.min(self.mem.zone_list_len(z, List::Inactive));
        let woken = self.scan_inactive(z, target, budget, direct, &mut out, maps);
        if out.reclaimed < target && out.unqueued_dirty > 0 {
            for &b in &woken {
                self.start_all(b);
            }
        }
        let file_scanned = out.scanned - out.scanned.min(freed + anon_scan);
        self.reclaim.file_scanned(file_scanned);
        self.age_reclaim_stat();
        (out, file_scanned)
    }

    /// Takes pages from the inactive tail of zone `z` while `out` has scanned fewer than
    /// `budget` and freed fewer than `target`; a batch of `SWAP_CLUSTER_MAX` all dirty and
    /// unqueued wakes the flushers of the backends whose dirty pages were left. Returns those
    /// backends.
    fn scan_inactive<M: PageMaps>(
        &mut self,
        z: usize,
        target: u64,
        budget: u64,
        direct: bool,
        out: &mut Shrink,
        maps: &mut M,
    ) -> Vec<BackendId> {
        let mut woken: Vec<BackendId> = Vec::new();
        let mut batch = Shrink::default();
        while out.scanned < budget && out.reclaimed < target {
            let Some(frame) = self.mem.tail(z, List::Inactive) else { break };
            let (page, wake) = self.reclaim_page(frame, direct, maps);
            out.add(page);
            batch.add(page);
            if let Some(b) = wake
                && !woken.contains(&b)
            {
                woken.push(b);
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
        woken
    }

    /// Reclaim meets the page in `frame` at the inactive tail: frees it if clean, else marks
    /// and rotates it (a dirty one may be written or kept, `reclaim::dirty_page`). Returns
    /// what it counts, and the backend whose flusher should hear of a dirty page left.
    fn reclaim_page<M: PageMaps>(
        &mut self,
        frame: FrameId,
        direct: bool,
        maps: &mut M,
    ) -> (Shrink, Option<BackendId>) {
        let (inode, index) = self.mem.owner(frame);
        let mut page = Shrink { scanned: 1, ..Shrink::default() };
        let Some(info) = maps.with(inode, |m| m.page(index)) else {
            panic!("frame {frame} on the LRU holds no page ({inode}, {index})");
        };
        match info.state {
            PageState::Clean => {
                // A driver's writer may have dirtied it since the look above (writers dirty
                // pages under the page map's lock alone, never the engine's): then it is met
                // again as what it is now, which cannot be clean (only the engine cleans).
                let Some(freed) = maps.with(inode, |m| m.evict(index)) else {
                    return self.reclaim_page(frame, direct, maps);
                };
                assert_eq!(freed, frame);
                self.page_evicted(inode, index);
                self.mem.unlink(frame);
                self.mem.release(frame);
                self.account(inode, Counters { resident: -1, ..Counters::default() });
                page.reclaimed = 1;
                (page, None)
            }
            PageState::Dirty => {
                let (unqueued, wake) =
                    self.reclaim_dirty(frame, (inode, index), info.flags, direct, maps);
                page.unqueued_dirty = unqueued;
                (page, wake)
            }
            PageState::Writeback | PageState::Unstable => {
                if info.flags & flag::RECLAIM != 0 {
                    page.immediate = 1;
                }
                maps.with(inode, |m| m.set_flags(index, flag::RECLAIM));
                self.mem.move_to_head(frame, reclaim::skipped_list(self.cfg.reclaim, false));
                self.reclaim.file_rotated();
                page.writeback = 1;
                (page, None)
            }
        }
    }

    /// A dirty page at the inactive tail, with `flags`: kept for another trip, written, or
    /// left for the flusher (`reclaim::dirty_page`). Returns whether it counts as unqueued
    /// dirty, and the backend whose flusher should hear of it.
    fn reclaim_dirty<M: PageMaps>(
        &mut self,
        frame: FrameId,
        (inode, index): (InodeId, u64),
        flags: u8,
        direct: bool,
        maps: &mut M,
    ) -> (u64, Option<BackendId>) {
        // Every examination tests and clears the referenced bit (the kernel's
        // `page_check_references`); writes set it (module doc).
        let referenced = maps.with(inode, |m| m.clear_flags(index, flag::REFERENCED)) != 0;
        let policy = self.cfg.reclaim;
        let seen_before = flags & flag::RECLAIM != 0;
        let held = flags & flag::HELD != 0;
        let action =
            reclaim::dirty_page(policy, direct, seen_before, self.node_dirty, held, referenced);
        self.reclaim.file_rotated();
        let b = self.inodes[&inode].backend;
        if action == DirtyPage::Keep {
            // Referenced and dirty: kept for another trip round the inactive list, not
            // written (`PAGEREF_RECLAIM_CLEAN`, docs/mechanisms.md#6-reclaim).
            self.mem.move_to_head(frame, List::Inactive);
            self.stats.reclaim_kept_referenced += 1;
            // Counted as unqueued dirty under `flusher-only`, as the kernel counts it before
            // the referenced test (node flag, flusher wakeups). The 2.6.3x kernel had neither
            // rule (its reclaim woke the flushers from direct reclaim's scan count instead),
            // so under `legacy` a kept page counts as scanned only, as the pages legacy writes
            // do.
            return match policy {
                ReclaimPolicy::FlusherOnly => (1, Some(b)),
                ReclaimPolicy::Legacy => (0, None),
            };
        }
        let write = action == DirtyPage::Write;
        maps.with(inode, |m| m.set_flags(index, flag::RECLAIM));
        self.mem.move_to_head(frame, reclaim::skipped_list(policy, write));
        if write && self.pageout(inode, index, maps) {
            if direct {
                self.stats.direct_written += 1;
            } else {
                self.stats.kswapd_written += 1;
            }
            return (0, None);
        }
        self.stats.reclaim_immediate += 1;
        (1, Some(b))
    }

    /// How many of `budget` pages this pass over zone `z` scans from anonymous memory (module
    /// doc).
    fn anon_scan_share(&self, z: usize, budget: u64) -> u64 {
        if self.cfg.swap_backend.is_none() {
            return 0;
        }
        let anon = self.mem.zone_swappable_anon(z);
        if anon == 0 {
            return 0;
        }
        let file =
            self.mem.zone_list_len(z, List::Inactive) + self.mem.zone_list_len(z, List::Active);
        if file + self.mem.zone_free(z) <= self.mem.zone_wmark(z).high {
            return anon.min(budget);
        }
        self.reclaim.anon_share(anon, file, budget)
    }

    /// Halves a list's recent counts once its scanned count passes a quarter of the list.
    fn age_reclaim_stat(&mut self) {
        let sizes =
            [self.mem.anon(), self.mem.list_len(List::Inactive) + self.mem.list_len(List::Active)];
        self.reclaim.age(sizes);
    }

    /// Starts swap-out writes of `pages` anonymous pages, in clusters of consecutive slots.
    fn swap_out(&mut self, z: usize, pages: u64, direct: bool) {
        let Some(swap) = self.cfg.swap_backend else { return };
        let b = BackendId(swap as u32);
        // Swap space twice the memory, the sizing advice of the era.
        let slots = 2 * self.mem.total();
        self.mem.anon_start_swap(z, pages);
        if direct {
            self.stats.direct_swapped += pages;
        } else {
            self.stats.kswapd_swapped += pages;
        }
        let mut left = pages;
        while left > 0 {
            let io = self.new_io();
            let (first_page, n) = self.reclaim.swap_slots(io, z, left.min(SWAP_CLUSTER_MAX), slots);
            self.stats.writes += 1;
            self.stats.write_pages += n;
            self.emit(Action::Write {
                io,
                backend: b,
                inode: SWAP_INODE,
                runs: vec![Run { first: first_page, count: n }],
                class: IoClass::Reclaim,
                issuer: Issuer::Reclaim,
            });
            left -= n;
        }
    }

    /// Pages whose writeback completed, file and swap.
    pub(super) fn pages_written(&self) -> u64 {
        self.global.written + self.reclaim.swap_written()
    }

    /// Whether `io` is a swap-out write.
    pub(crate) fn is_swap_io(&self, io: IoId) -> bool {
        self.reclaim.is_swap_io(io)
    }

    /// A swap-out write completed: its pages wait for the next pass to free them; after an
    /// error they stay resident and may be tried again.
    pub(crate) fn swap_done<M: PageMaps>(
        &mut self,
        io: IoId,
        result: Result<Stability, IoError>,
        maps: &mut M,
    ) {
        let (z, pages) = self.reclaim.swap_done(io, result.is_ok());
        if result.is_err() {
            self.stats.write_errors += 1;
        }
        self.mem.anon_swap_done(z, pages, result.is_ok());
        self.wake_memory_waiters(maps);
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
                kind: IoKind::Write { runs: vec![run], issuer: Issuer::Reclaim, held_retry: false },
                issued: now,
            },
        );
        let meta = self.inode_mut(inode);
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
            runs: vec![run],
            class: IoClass::Reclaim,
            issuer: Issuer::Reclaim,
        });
        true
    }

    /// Keeps the inactive list at least as long as the active one by moving pages from the
    /// active tail to the inactive head (the kernel's `inactive_is_low` / `shrink_active_list`).
    fn age_active_list(&mut self, z: usize) {
        while self.mem.zone_list_len(z, List::Inactive) < self.mem.zone_list_len(z, List::Active) {
            let Some(frame) = self.mem.tail(z, List::Active) else { break };
            self.mem.move_to_head(frame, List::Inactive);
        }
    }

    /// Lets writers waiting for memory retry once some is free or reclaimable.
    pub(crate) fn wake_memory_waiters<M: PageMaps>(&mut self, maps: &mut M) {
        if self.cfg.kswapd_scan_ns > 0 {
            // Timed kswapd: a completion may end its throttle or find a zone under `low`.
            self.kswapd(maps);
        }
        if !self.waiters.values().any(|r| *r == WaitReason::Memory) {
            return;
        }
        self.kswapd(maps);
        let class = self.mem.top_zone();
        if self.room_above(class, |w| w.min) == 0 {
            // Try freeing clean pages the completions just produced.
            self.direct_reclaim(SWAP_CLUSTER_MAX, maps);
            self.reclaim.clear_direct_throttle();
            if self.room_above(class, |w| w.min) == 0 && self.memory_held().is_none() {
                return;
            }
            // Else held pages fill the cache: the waiters wake to fail (`memory_held`).
        }
        let ready: Vec<_> = self
            .waiters
            .iter()
            .filter(|(_, r)| **r == WaitReason::Memory)
            .map(|(&w, _)| w)
            .collect();
        for w in ready {
            self.waiters.remove(&w);
            self.reclaim_forget(w);
            self.emit(Action::Resume { writer: w });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, Config};
    use crate::engine::MapStore;
    use crate::{Event, GroupId};

    /// 64 MiB in three zones of 4, 12 and 48 MiB (1024, 3072 and 12288 pages).
    fn zoned(swap: bool) -> Config {
        let mut c = Config::new(64 << 20, BackendConfig::new("data"));
        c.zone_bounds_bytes = vec![4 << 20, 16 << 20];
        c.backends.push(BackendConfig::new("swap"));
        c.swap_backend = swap.then_some(1);
        c
    }

    /// A page written once reaches the LRU tail referenced: reclaim that would write it
    /// (`legacy` here) keeps it for another trip instead, clearing the bit, and writes it on the
    /// second trip if it is still dirty (`PAGEREF_RECLAIM_CLEAN`). A page written again in
    /// between is referenced again and kept again.
    #[test]
    fn referenced_dirty_pages_get_a_second_trip() {
        let mut config = Config::new(64 << 20, BackendConfig::new("data"));
        config.reclaim = ReclaimPolicy::Legacy;
        let mut engine = Engine::new(config, Instant::ZERO).expect("valid");
        let mut maps = MapStore::new();
        let inode = InodeId(1);
        let open = Event::Open { handle: crate::HandleId(1), inode, backend: BackendId(0) };
        engine.handle(Instant::ZERO, open, &mut maps);
        let mut w = Writer::new(WriterId(0), GroupId(0));
        let mut frames = Vec::new();
        assert_eq!(engine.alloc_frames(8, &mut frames, &mut maps), 8);
        w.frames = frames;
        let step = crate::writer::write_pages(&mut w, inode, maps.get_mut(inode), 0, 8);
        assert_eq!(step.consumed, 8);
        engine.apply_pending(&mut w, &mut maps);
        let referenced = |maps: &mut MapStore, i: u64| {
            maps.get(inode).and_then(|m| m.page(i)).expect("resident").flags & flag::REFERENCED != 0
        };
        assert!((0..8).all(|i| referenced(&mut maps, i)), "writes mark the pages accessed");
        // First trip: all eight are kept, unwritten, and lose the bit.
        let (s, _) = engine.shrink_counted(0, 8, false, &mut maps);
        assert_eq!((s.scanned, s.reclaimed), (8, 0));
        assert_eq!(engine.stats.kswapd_written, 0);
        assert_eq!(engine.stats.reclaim_kept_referenced, 8);
        assert!((0..8).all(|i| !referenced(&mut maps, i)));
        // Page 0 is written again before the next trip: referenced again.
        let step = crate::writer::write_pages(&mut w, inode, maps.get_mut(inode), 0, 1);
        assert_eq!(step.consumed, 1);
        // Second trip: the seven untouched pages are written one by one, page 0 is kept.
        let (s, _) = engine.shrink_counted(0, 8, false, &mut maps);
        assert_eq!((s.scanned, s.reclaimed), (8, 0));
        assert_eq!(engine.stats.kswapd_written, 7);
        assert_eq!(engine.stats.reclaim_kept_referenced, 9);
        let writes = std::iter::from_fn(|| engine.poll_action())
            .filter(|a| matches!(a, Action::Write { runs, .. } if runs == &[Run { first: runs[0].first, count: 1 }]))
            .count();
        assert_eq!(writes, 7, "single-page writes from reclaim");
    }

    /// Allocations take the highest zone first and fall back to lower zones only when it is
    /// down to its min watermark; a lower zone keeps its lowmem reserve for the class.
    #[test]
    fn allocations_prefer_the_highest_zone() {
        let mut engine = Engine::new(zoned(false), Instant::ZERO).expect("valid");
        let mut maps = MapStore::new();
        let mut w = Writer::new(WriterId(0), GroupId(0));
        let (got, _) = engine.anon_fault(Instant::ZERO, &mut w, 10_000, &mut maps);
        assert_eq!(got, 10_000);
        assert_eq!(engine.mem.zone_free(2), 12_288 - 10_000, "all from the highest zone");
        assert_eq!((engine.mem.zone_free(1), engine.mem.zone_free(0)), (3072, 1024));
        // Without swap nothing is reclaimable: take everything the floors allow.
        let (got, _) = engine.anon_fault(Instant::ZERO, &mut w, 100_000, &mut maps);
        assert!(got > 0);
        for z in 0..3 {
            let floor = engine.mem.zone_wmark(z).min + engine.mem.reserve(z, 2);
            assert_eq!(engine.mem.zone_free(z), floor, "zone {z} down to min + reserve");
        }
        assert_eq!(engine.mem.reserve(0, 2), (3072 + 12_288) / 256);
    }

    /// kswapd takes time: woken at `low`, it reclaims nothing in the event that wakes it, then
    /// one batch per timer, each followed by a pause of the pages it scanned times
    /// `kswapd_scan_ns`; allocations meanwhile fall to direct reclaim below `min`; once every
    /// zone is back at `high` kswapd sleeps (no timer).
    #[test]
    fn kswapd_reclaims_in_batches_over_time() {
        let mut config = zoned(true);
        config.kswapd_scan_ns = 2000;
        let mut engine = Engine::new(config, Instant::ZERO).expect("valid");
        let mut maps = MapStore::new();
        let mut w = Writer::new(WriterId(0), GroupId(0));
        let t0 = Instant::ZERO + Duration::from_millis(1);
        // Take every zone down to low; the next page wakes kswapd, which has not run yet.
        let fill = engine.room_above(2, |m| m.low);
        let (got, _) = engine.anon_fault(t0, &mut w, fill, &mut maps);
        assert_eq!(got, fill);
        assert_eq!(engine.kswapd_timer(), None, "no zone set fails low: kswapd sleeps");
        // The highest zone went under low first; the lower ones serve pages until every zone
        // fails low plus its reserve.
        while engine.kswapd_timer().is_none() {
            let (got, _) = engine.anon_fault(t0, &mut w, 1, &mut maps);
            assert_eq!(got, 1);
        }
        let first = engine.kswapd_timer().expect("kswapd is awake");
        assert!(first > t0, "the first batch comes after a batch's time");
        assert_eq!(engine.stats().kswapd_scanned, 0, "nothing reclaimed in the waking event");
        // The allocator does not wait for it: past min it reclaims directly.
        let more = engine.room_above(2, |m| m.min) + 1;
        let (got, _) = engine.anon_fault(t0, &mut w, more, &mut maps);
        assert!(got > 0);
        assert!(engine.stats().direct_scanned > 0, "{:?}", engine.stats());
        // One batch: at most SWAP_CLUSTER_MAX pages reclaimed per zone, and the next batch is
        // as far away as the pages scanned cost.
        engine.handle(first, Event::Timer, &mut maps);
        let s = engine.stats();
        assert!(s.kswapd_scanned > 0 && s.kswapd_reclaimed <= 3 * SWAP_CLUSTER_MAX, "{s:?}");
        let next = engine.kswapd_timer().expect("still unbalanced");
        let cost = Duration::from_nanos(s.kswapd_scanned * engine.cfg.kswapd_scan_ns);
        assert!(next >= first + cost, "{next} before {first} + {cost}");
        // Let it run, completing its swap writes, until it sleeps.
        let mut now = first;
        for _ in 0..100_000 {
            let Some(at) = engine.kswapd_timer() else { break };
            now = at.max(now);
            engine.handle(now, Event::Timer, &mut maps);
            while let Some(action) = engine.poll_action() {
                if let Action::Write { io, .. } = action {
                    let done = Event::WriteDone { io, result: Ok(Stability::Stable) };
                    engine.handle(now, done, &mut maps);
                }
            }
        }
        assert_eq!(engine.kswapd_timer(), None, "kswapd went back to sleep");
        for z in 0..3 {
            assert!(engine.mem.zone_free(z) >= engine.mem.zone_wmark(z).high, "zone {z}");
        }
        assert!(now > first + cost, "balancing took many batches");
    }

    /// With swap, kswapd balances every zone it has to: after faulting twice the memory, each
    /// zone is at or above its min watermark, what did not fit went to swap, and the budget held.
    #[test]
    fn kswapd_balances_every_zone() {
        let mut engine = Engine::new(zoned(true), Instant::ZERO).expect("valid");
        let mut maps = MapStore::new();
        let mut w = Writer::new(WriterId(0), GroupId(0));
        let mut now = Instant::ZERO;
        let mut granted = 0;
        let mut pending: Vec<IoId> = Vec::new();
        for _ in 0..10_000 {
            if granted >= 2 * 16_384 {
                break;
            }
            now += Duration::from_millis(1);
            // kswapd's batches (and any other timer) due by now run first.
            while let Some(t) = engine.poll_timeout().filter(|&t| t <= now) {
                engine.handle(t.max(engine.now), Event::Timer, &mut maps);
            }
            let want = 256.min(2 * 16_384 - granted);
            let (got, _) = engine.anon_fault(now, &mut w, want, &mut maps);
            granted += got;
            for io in pending.drain(..) {
                let done = Event::WriteDone { io, result: Ok(Stability::Stable) };
                engine.handle(now, done, &mut maps);
            }
            while let Some(action) = engine.poll_action() {
                if let Action::Write { io, .. } = action {
                    pending.push(io);
                }
            }
            assert!(engine.mem.anon() + engine.mem.allocated() <= engine.mem.total());
        }
        assert_eq!(granted, 2 * 16_384, "every page was faulted in");
        for z in 0..3 {
            assert!(
                engine.mem.zone_free(z) >= engine.mem.zone_wmark(z).min,
                "zone {z}: {} free",
                engine.mem.zone_free(z)
            );
        }
        let s = engine.stats();
        assert!(s.kswapd_swapped + s.direct_swapped >= 16_384, "{s:?}");
        assert!(s.kswapd_reclaimed > 0, "{s:?}");
    }
}
