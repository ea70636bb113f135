//! Background reclaim (kswapd's role; `crate::reclaim`'s module doc): woken below `low`, it
//! balances every zone to `high`, instantly or in timed batches, and throttles itself while
//! the pages it meets are under writeback.

use super::{Engine, PageMaps};
use crate::reclaim::{SWAP_CLUSTER_MAX, Shrink, WRITEBACK_THROTTLE};
use crate::time::{Duration, Instant};

impl Engine {
    /// Wakes background reclaim (module doc). Instant mode (`kswapd_scan_ns` 0): balances the
    /// zones now. Timed mode: a sleeping kswapd that finds some zone below `low` wakes and runs
    /// its first batch one batch's time later; an awake one keeps its schedule, except that a
    /// WRITEBACK throttle ends early once `SWAP_CLUSTER_MAX` pages have been written.
    pub(crate) fn kswapd<M: PageMaps>(&mut self, maps: &mut M) {
        if self.cfg.kswapd_scan_ns == 0 {
            self.kswapd_balance(u64::MAX, maps);
            return;
        }
        if let Some(at) = self.reclaim.kswapd_at() {
            if at > self.now
                && let Some((_, written)) = self.reclaim.kswapd_throttled()
                && self.pages_written().saturating_sub(written) >= SWAP_CLUSTER_MAX
            {
                self.reclaim.kswapd_schedule(self.now);
            }
            return;
        }
        let zones = self.mem.zones();
        if (0..zones).any(|z| self.mem.zone_free(z) < self.mem.zone_wmark(z).low) {
            self.reclaim.kswapd_schedule(self.now + self.kswapd_batch_time(SWAP_CLUSTER_MAX));
        }
    }

    /// An allocation found no zone of its zonelist above `low` plus reserve: wakes kswapd (in
    /// timed mode even though no zone is yet under its bare `low`; the wake is the kernel's
    /// `wakeup_kswapd` from the allocator's slow path).
    pub(crate) fn kswapd_wake<M: PageMaps>(&mut self, maps: &mut M) {
        if self.cfg.kswapd_scan_ns > 0 && self.reclaim.kswapd_at().is_none() {
            self.reclaim.kswapd_schedule(self.now + self.kswapd_batch_time(SWAP_CLUSTER_MAX));
        } else {
            self.kswapd(maps);
        }
    }

    /// Virtual time kswapd spends scanning `pages` pages.
    pub(crate) fn kswapd_batch_time(&self, pages: u64) -> Duration {
        Duration::from_nanos(pages.max(1).saturating_mul(self.cfg.kswapd_scan_ns))
    }

    /// When the awake kswapd runs its next batch (timed mode).
    pub(crate) fn kswapd_timer(&self) -> Option<Instant> {
        self.reclaim.kswapd_at()
    }

    /// Timed mode: kswapd's batch is due. It reclaims at most `SWAP_CLUSTER_MAX` pages per zone
    /// it balances, then schedules its next batch after the time the pages it scanned cost, or
    /// after its throttle; it sleeps once every zone is at `high`.
    pub(crate) fn kswapd_run<M: PageMaps>(&mut self, maps: &mut M) {
        let Some(at) = self.reclaim.kswapd_at() else { return };
        if at > self.now {
            return;
        }
        let zones = self.mem.zones();
        if (0..zones).all(|z| self.mem.zone_free(z) >= self.mem.zone_wmark(z).high) {
            // Balanced: kswapd sleeps and the node flags clear.
            self.node_dirty = false;
            self.reclaim.kswapd_sleep();
            return;
        }
        if let Some((until, written)) = self.reclaim.kswapd_throttled()
            && self.now < until
            && self.pages_written().saturating_sub(written) < SWAP_CLUSTER_MAX
        {
            self.reclaim.kswapd_schedule(until);
            return;
        }
        self.reclaim.kswapd_unthrottle();
        let scanned = self.kswapd_balance(SWAP_CLUSTER_MAX, maps);
        let next = match self.reclaim.kswapd_throttled() {
            Some((until, _)) => until.max(self.now + self.kswapd_batch_time(scanned)),
            None if scanned == 0 => {
                // Nothing it could scan (what is left is on its way to swap or disk): kswapd
                // naps HZ/10 as 2.6.3x-3.x `congestion_wait` does, or until SWAP_CLUSTER_MAX
                // pages have been written.
                let written = self.pages_written();
                self.reclaim.kswapd_throttle(self.now + WRITEBACK_THROTTLE, written);
                self.now + WRITEBACK_THROTTLE
            }
            None => self.now + self.kswapd_batch_time(scanned),
        };
        self.reclaim.kswapd_schedule(next);
        self.wake_memory_waiters(maps);
    }

    /// Background reclaim's balancing pass: runs when some zone is below `low` and balances the
    /// zones up to `high`, freeing at most `batch` pages per zone (module doc); an awake timed
    /// kswapd (`batch` limited) keeps balancing while any zone is under `high`. While throttled
    /// (WRITEBACK, below) it does nothing. Returns the pages scanned.
    pub(crate) fn kswapd_balance<M: PageMaps>(&mut self, batch: u64, maps: &mut M) -> u64 {
        let zones = self.mem.zones();
        let instant = batch == u64::MAX;
        if instant && (0..zones).all(|z| self.mem.zone_free(z) >= self.mem.zone_wmark(z).low) {
            if (0..zones).all(|z| self.mem.zone_free(z) >= self.mem.zone_wmark(z).high) {
                // Balanced: the node flags clear.
                self.node_dirty = false;
            }
            return 0;
        }
        if let Some((until, written)) = self.reclaim.kswapd_throttled() {
            let done = self.pages_written().saturating_sub(written);
            if self.now < until && done < SWAP_CLUSTER_MAX {
                return 0;
            }
            self.reclaim.kswapd_unthrottle();
        }
        // The highest zone under its high watermark; every zone up to it is balanced against
        // that class (its high watermark plus the lowmem reserve for end_zone).
        let Some(end_zone) =
            (0..zones).rev().find(|&z| self.mem.zone_free(z) < self.mem.zone_wmark(z).high)
        else {
            return 0;
        };
        let mut shrink = Shrink::default();
        let mut file_scanned = 0;
        for z in 0..=end_zone {
            let goal = self.mem.zone_wmark(z).high + self.mem.reserve(z, end_zone);
            let free = self.mem.zone_free(z);
            if free >= goal {
                continue;
            }
            let (s, file) = self.shrink_counted(z, (goal - free).min(batch), false, maps);
            shrink.add(s);
            file_scanned += file;
        }
        if file_scanned > 0 {
            // kswapd flags the node when a whole pass found only unqueued dirty file pages
            // (`PGDAT_DIRTY`); the flag clears when the node is balanced.
            self.node_dirty = shrink.unqueued_dirty == file_scanned;
        }
        self.stats.kswapd_scanned += shrink.scanned;
        self.stats.kswapd_reclaimed += shrink.reclaimed;
        if shrink.immediate > 0 {
            // Pages cycle through the LRU faster than their writeback completes:
            // reclaim_throttle(WRITEBACK), HZ/10, or until SWAP_CLUSTER_MAX pages are written.
            // Under both policies: 2.6.3x kswapd also napped HZ/10 (`congestion_wait`) when its
            // passes made poor progress.
            let written = self.pages_written();
            self.reclaim.kswapd_throttle(self.now + WRITEBACK_THROTTLE, written);
            self.stats.kswapd_throttled += 1;
        }
        shrink.scanned
    }
}
