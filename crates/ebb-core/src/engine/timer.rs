//! The engine's timer: periodic flusher wakeups, delayed bandwidth updates, retries of failed
//! writes, outage deadlines, paused writers and kswapd's batches that have come due.

use super::*;

impl Engine {
    pub(super) fn timer<M: PageMaps>(&mut self, maps: &mut M) {
        let now = self.now;
        for b in 0..self.wbs.len() {
            if self.wbs[b].wbt.timer().is_some_and(|t| t <= now) {
                let inflight = self.wbs[b].write_inflight;
                let e = self.wbs[b].wbt.on_timer(now, inflight);
                self.record(TraceEvent::Wbt { bdi: BackendId(b as u32), eval: e, inflight });
            }
        }
        for b in 0..self.wbs.len() {
            if self.wbs[b].bw_update_at.is_some_and(|t| t <= now) {
                // The delayed update runs whatever the time since the last one.
                self.wbs[b].bw_update_at = None;
                let now_j = now.jiffies(self.hz);
                self.update_bandwidth(BackendId(b as u32), now_j, None, 0, 0);
            }
        }
        for b in 0..self.wbs.len() {
            if self.wbs[b].flusher.timer.is_some_and(|t| t <= now) {
                self.wbs[b].flusher.timer = None;
                self.wbs[b].flusher.wake_periodic = true;
            }
        }
        let due: Vec<InodeId> = self
            .inodes
            .iter()
            .filter(|(_, m)| {
                m.retry_at.is_some_and(|t| t <= now) || m.hold_retry_at.is_some_and(|t| t <= now)
            })
            .map(|(&i, _)| i)
            .collect();
        for inode in due {
            let held = maps.with(inode, |m| m.counts().held);
            let meta = self.inode_mut(inode);
            if meta.retry_at.is_some_and(|t| t <= now) {
                meta.retry_at = None;
            }
            if meta.hold_retry_at.is_some_and(|t| t <= now) {
                meta.hold_retry_at = None;
            }
            // Held pages are not taken by background writeback; this retry takes them (if
            // the backend still refuses them they are held again, with a longer backoff).
            meta.retry_held = held > 0 && meta.hold_retry_at.is_none();
            let b = meta.backend;
            // Retry: make sure the file is queued and the flusher runs.
            self.mark_inode_dirty(inode);
            self.wbs[b.index()].flusher.start_all = true;
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
            if self.outage_deadline(&self.wbs[b]).is_some_and(|t| t <= now) {
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
    }
}
