//! Views of the engine for drivers and tests: meminfo, per-backend and per-group counts (the
//! accounting check is `accounting.rs`).

use super::Engine;
use crate::ids::{BackendId, GroupId};
use crate::memory::List;
use crate::stats::{BdiStats, MemInfo};
use crate::time::Instant;
use crate::trace::TraceEvent;

impl Engine {
    /// The cache as a whole (`/proc/meminfo` style).
    pub fn meminfo(&self) -> MemInfo {
        let t = self.global_thresholds();
        let limit = crate::limits::hard_limit(t.thresh, self.dirty_limit);
        let freerun = crate::limits::freerun(t.thresh, t.bg_thresh);
        MemInfo {
            total: self.mem.total(),
            free: self.mem.free_pages(),
            anon: self.mem.anon(),
            slab: self.mem.files(),
            cached: self.global.resident.max(0) as u64,
            dirty: self.global.dirty(),
            held: self.global.held.max(0) as u64,
            writeback: self.global.writeback(),
            unstable: self.global.unstable(),
            active: self.mem.list_len(List::Active),
            inactive: self.mem.list_len(List::Inactive),
            thresh: t.thresh,
            bg_thresh: t.bg_thresh,
            limit,
            freerun,
            setpoint: crate::limits::setpoint(freerun, limit),
            dirtied: self.global.dirtied,
            written: self.global.written,
        }
    }

    /// Records `global_dirty_state` (when tracing): the cache's pages against its thresholds
    /// at `now`, for a driver that samples them (the runtime, every 100 ms while traced).
    pub fn trace_dirty_state(&mut self, now: Instant) {
        if !self.cfg.trace {
            return;
        }
        let m = self.meminfo();
        self.trace.push((
            now,
            TraceEvent::GlobalDirtyState {
                dirty: m.dirty,
                writeback: m.writeback,
                unstable: m.unstable,
                bg_thresh: m.bg_thresh,
                thresh: m.thresh,
                limit: m.limit,
                dirtied: m.dirtied,
                written: m.written,
            },
        ));
    }

    /// One backend (`/sys/class/bdi` style).
    pub fn bdi_stats(&self, b: BackendId) -> BdiStats {
        let wb = &self.wbs[b.index()];
        let t = self.global_thresholds();
        let wb_thresh = self.wb_thresh(b, t.thresh);
        BdiStats {
            name: self.cfg.backends[b.index()].name.clone(),
            dirty: wb.counters.dirty(),
            held: wb.counters.held.max(0) as u64,
            writeback: wb.counters.writeback(),
            unstable: wb.counters.unstable(),
            wb_thresh,
            wb_bg_thresh: crate::limits::wb_bg_thresh(wb_thresh, t.bg_thresh, t.thresh),
            write_bandwidth: wb.rates.write_bandwidth,
            avg_write_bandwidth: wb.rates.avg_write_bandwidth,
            dirty_ratelimit: wb.rates.dirty_ratelimit,
            balanced_dirty_ratelimit: wb.rates.balanced_dirty_ratelimit,
            inflight: u64::from(wb.inflight),
            wbt_max_depth: wb.wbt.max_depth(),
            wbt_background: wb.wbt.wb_background(),
            wbt_normal: wb.wbt.wb_normal(),
            wbt_step: wb.wbt.scale_step(),
            wbt_target_us: wb.wbt.min_lat_nsec() / 1_000,
            wbt_read_min_us: wb.wbt.last_read_min_nsec() / 1_000,
            wbt_duty_permille: wb.wbt.duty_permille(),
            dirtied: wb.counters.dirtied,
            written: wb.counters.written,
            commits_owed: self.commits_owed(b),
        }
    }

    /// Counts per writer group: (dirty, writeback, unstable, resident).
    pub fn group_counts(&self, g: GroupId) -> (u64, u64, u64, u64) {
        self.groups.get(&g).map_or((0, 0, 0, 0), |c| {
            (c.dirty(), c.writeback(), c.unstable(), c.resident.max(0) as u64)
        })
    }

    /// Requests in flight on `b`.
    pub fn inflight(&self, b: BackendId) -> u32 {
        self.wbs[b.index()].inflight
    }
}
