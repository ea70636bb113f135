//! Views of the engine for drivers and tests: meminfo, per-backend and per-group counts, and
//! the accounting check.

use super::{Counters, Engine, IoKind, MapStore};
use crate::ids::{BackendId, GroupId};
use crate::memory::List;
use crate::stats::{BdiStats, MemInfo};
use crate::time::Instant;
use crate::trace::TraceEvent;
use crate::writer::Writer;

/// The page counts [`Engine::check_accounting`] compares, in its order.
const COUNTED: [&str; 5] = ["dirty", "writeback", "unstable", "resident", "held"];

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

    /// Verifies that the counters agree with the page maps, given every writer's pending
    /// batch: per backend and in total, dirty, writeback, unstable and resident pages match a
    /// recount, nothing is negative, and `clean + dirty + writeback + unstable = resident`.
    /// Also checks the frame budget. For tests and the simulator's checkers (O(pages)).
    pub fn check_accounting(&self, maps: &MapStore, writers: &[&Writer]) -> Result<(), String> {
        let (per_backend, total) = self.recount(maps)?;
        let pending = self.pending_counts(writers);
        self.check_counters(&per_backend, &total, &pending)?;
        self.check_frames(total[3] as u64, writers)
    }

    /// Every page map recounted, checked against its own counts, and summed per backend and in
    /// total, in the order of [`COUNTED`].
    fn recount(&self, maps: &MapStore) -> Result<(Vec<[i64; 5]>, [i64; 5]), String> {
        let mut per_backend = vec![[0i64; 5]; self.wbs.len()];
        let mut total = [0i64; 5];
        for (inode, map) in maps.iter() {
            let c = map.recount();
            if c != map.counts() {
                return Err(format!(
                    "inode {inode}: counts {:?} but recount {:?}",
                    map.counts(),
                    c
                ));
            }
            if c.clean + c.dirty + c.writeback + c.unstable != c.resident {
                return Err(format!("inode {inode}: states do not add up: {c:?}"));
            }
            let Some(meta) = self.inodes.get(&inode) else {
                if c.resident > 0 {
                    return Err(format!("inode {inode} has pages but was never opened"));
                }
                continue;
            };
            let v = [
                c.dirty as i64,
                c.writeback as i64,
                c.unstable as i64,
                c.resident as i64,
                c.held as i64,
            ];
            for k in 0..5 {
                per_backend[meta.backend.index()][k] += v[k];
                total[k] += v[k];
            }
        }
        Ok((per_backend, total))
    }

    /// The writers' pending batches per backend: dirtying not yet folded into the counters.
    fn pending_counts(&self, writers: &[&Writer]) -> Vec<[i64; 5]> {
        let mut pending = vec![[0i64; 5]; self.wbs.len()];
        for w in writers {
            for p in &w.pending {
                let b = self.inodes[&p.inode].backend.index();
                pending[b][0] += p.dirtied as i64;
                pending[b][2] -= p.from_unstable as i64;
                pending[b][3] += p.new_pages as i64;
                pending[b][4] -= p.unheld as i64;
            }
        }
        pending
    }

    /// Each backend's counters and the global ones, plus what is pending, against the pages.
    fn check_counters(
        &self,
        per_backend: &[[i64; 5]],
        total: &[i64; 5],
        pending: &[[i64; 5]],
    ) -> Result<(), String> {
        let values = |c: &Counters| [c.dirty, c.writeback, c.unstable, c.resident, c.held];
        for (b, wb) in self.wbs.iter().enumerate() {
            let have = values(&wb.counters);
            for k in 0..5 {
                let exact = have[k] + pending[b][k];
                if exact != per_backend[b][k] {
                    return Err(format!(
                        "backend {b}: {} counter {} + pending {} != pages {}",
                        COUNTED[k], have[k], pending[b][k], per_backend[b][k]
                    ));
                }
                if exact < 0 {
                    return Err(format!("backend {b}: {} is negative", COUNTED[k]));
                }
            }
        }
        let g = values(&self.global);
        for k in 0..5 {
            let pending_total: i64 = pending.iter().map(|p| p[k]).sum();
            if g[k] + pending_total != total[k] {
                return Err(format!(
                    "global {} counter {} + pending {} != pages {}",
                    COUNTED[k], g[k], pending_total, total[k]
                ));
            }
        }
        Ok(())
    }

    /// Frames: the allocated ones are the `resident` pages', the writers' reserves and the
    /// reads' in flight, and they and anonymous memory fit in the budget.
    fn check_frames(&self, resident: u64, writers: &[&Writer]) -> Result<(), String> {
        let reserved: u64 = writers.iter().map(|w| w.frames.len() as u64).sum();
        let read_frames: u64 = self
            .ios
            .values()
            .map(
                |r| if let IoKind::Read { frames, .. } = &r.kind { frames.len() as u64 } else { 0 },
            )
            .sum();
        if self.mem.allocated() != resident + reserved + read_frames {
            return Err(format!(
                "frames: allocated {} != resident {resident} + reserved {reserved} + reading {read_frames}",
                self.mem.allocated()
            ));
        }
        if self.mem.allocated() > self.mem.total()
            || (self.mem.allocated() + self.mem.anon() > self.mem.total()
                && !self.mem.overcommitted())
        {
            return Err(format!(
                "memory budget exceeded: {} + {} > {}",
                self.mem.allocated(),
                self.mem.anon(),
                self.mem.total()
            ));
        }
        Ok(())
    }
}
