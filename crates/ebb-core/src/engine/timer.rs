//! The engine's timer: periodic flusher wakeups, delayed bandwidth updates, retries of failed
//! writes, outage deadlines, paused writers, kswapd's batches and owed commits that have come
//! due.

use std::collections::BTreeSet;

use super::{Engine, FsyncPhase, PageMaps};
use crate::ids::{BackendId, InodeId, RequestId};
use crate::trace::TraceEvent;

impl Engine {
    pub(super) fn timer<M: PageMaps>(&mut self, maps: &mut M) {
        let now = self.now;
        for b in 0..self.wbs.len() {
            if self.wbs[b].wbt.timer().is_some_and(|t| t <= now) {
                let inflight = self.wbs[b].write_inflight;
                let e = self.wbs[b].wbt.on_timer(now, inflight);
                self.record(TraceEvent::Wbt { bdi: BackendId(b as u32), eval: e, inflight });
            }
            // A paced write's gap ended: the drive after this event issues the next.
            self.wbs[b].wbt.end_gap(now);
        }
        for b in 0..self.wbs.len() {
            if self.wbs[b].bw_update_at.is_some_and(|t| t <= now) {
                self.delayed_bandwidth_update(BackendId(b as u32));
            }
        }
        for b in 0..self.wbs.len() {
            self.wbs[b].flusher.tick(now);
        }
        // The files with a retry due, in file order (as a scan of every file found them).
        let due: BTreeSet<InodeId> =
            self.retry_timers.range(..=(now, InodeId(u64::MAX))).map(|&(_, i)| i).collect();
        self.stats.files_visited += due.len() as u64;
        for inode in due {
            let held = maps.with(inode, |m| m.counts().held);
            let before = self.retry_deadlines(inode);
            let meta = self.inode_mut(inode);
            if meta.retry_at.is_some_and(|t| t <= now) {
                meta.retry_at = None;
                // From the file's start: the failed write left the writeback index past the
                // pages it redirtied, and a pass that finds nothing past it writes nothing,
                // fails nothing and schedules no next retry (a one-write file, an S3 object
                // under one part, was then left until it expired).
                meta.writeback_index = 0;
            }
            if meta.hold_retry_at.is_some_and(|t| t <= now) {
                meta.hold_retry_at = None;
            }
            // Held pages are not taken by background writeback; this retry takes them (if
            // the backend still refuses them they are held again, with a longer backoff).
            meta.retry_held = held > 0 && meta.hold_retry_at.is_none();
            let b = meta.backend;
            self.reindex_retry(inode, before);
            // Retry: make sure the file is queued and the flusher runs.
            self.mark_inode_dirty(inode);
            self.start_all(b);
            let waiting: Vec<RequestId> = self
                .fsyncs
                .iter()
                .filter(|(_, f)| f.inode == inode && matches!(f.phase, FsyncPhase::Retrying))
                .map(|(&r, _)| r)
                .collect();
            for request in waiting {
                self.fsync_write_phase(request, maps);
            }
        }
        for b in 0..self.wbs.len() {
            if self.outage_deadline(BackendId(b as u32)).is_some_and(|t| t <= now) {
                self.outage_expired(BackendId(b as u32), maps);
            }
        }
        let mut retries = Vec::new();
        for (&request, state) in &mut self.syncs {
            let due: Vec<BackendId> =
                state.retry_at.iter().filter(|&(_, &t)| t <= now).map(|(&b, _)| b).collect();
            for b in due {
                state.retry_at.remove(&b);
                retries.push((b, request));
            }
        }
        for (b, request) in retries {
            self.queue_sync_work(b, request);
        }
        self.kswapd_run(maps);
        self.gate_sweep(maps);
        self.recommit_timer(maps);
    }

    /// The delayed bandwidth update armed when a file's writeback ended (the kernel's
    /// `wb_update_bandwidth_workfn`). It runs if `BANDWIDTH_INTERVAL` has passed since the last
    /// update and no throttled writer is updating the estimates; otherwise it looks again an
    /// interval later.
    fn delayed_bandwidth_update(&mut self, b: BackendId) {
        let now_j = self.now.jiffies(self.hz);
        let since = now_j.saturating_sub(self.wbs[b.index()].rates.bw_time_stamp);
        if since < crate::bandwidth::bandwidth_interval_jiffies(self.hz)
            || self.writers_update_rates(b)
        {
            self.wbs[b.index()].bw_update_at =
                Some(self.now + crate::bandwidth::BANDWIDTH_INTERVAL);
            return;
        }
        self.wbs[b.index()].bw_update_at = None;
        self.update_bandwidth(b, now_j, None, 0, 0);
    }

    /// Whether throttled writers are updating `b`'s estimates: an `ioless` check went past
    /// freerun within `BANDWIDTH_INTERVAL`. Their updates also move the dirty ratelimit; a
    /// bandwidth-only update (a writepages call's, the delayed one) restarts the same 200 ms
    /// interval, and the kernel's run whenever that much has passed, so where background
    /// passes start and files end their writeback every few milliseconds (a small cache in
    /// front of a fast device) the writers' checks almost never found 200 ms elapsed and the
    /// ratelimit stayed at its start (the runtime: 3 ratelimit updates in 2.3 s of a throttled
    /// stream). ebb's own: the bandwidth-only updates hold off meanwhile.
    pub(crate) fn writers_update_rates(&self, b: BackendId) -> bool {
        self.wbs[b.index()]
            .throttled_at
            .is_some_and(|t| self.now.saturating_since(t) < crate::bandwidth::BANDWIDTH_INTERVAL)
    }
}
