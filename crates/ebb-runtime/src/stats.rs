//! Stats shaped like the kernel's: `/proc/meminfo` (kB) and `/sys/class/bdi/<dev>/stats`.

use ebb_core::{BackendId, Engine, PAGE_SIZE};
use serde::Serialize;

const KB_PER_PAGE: u64 = PAGE_SIZE / 1024;

/// The cache as a whole, `/proc/meminfo` names and units (kB).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemInfoStat {
    /// The memory budget.
    #[serde(rename = "MemTotal")]
    pub mem_total_kb: u64,
    /// Unused budget.
    #[serde(rename = "MemFree")]
    pub mem_free_kb: u64,
    /// Cached file data.
    #[serde(rename = "Cached")]
    pub cached_kb: u64,
    /// Dirty data.
    #[serde(rename = "Dirty")]
    pub dirty_kb: u64,
    /// Data under writeback.
    #[serde(rename = "Writeback")]
    pub writeback_kb: u64,
    /// Written to a two-phase backend, not yet committed.
    #[serde(rename = "NFS_Unstable")]
    pub unstable_kb: u64,
    /// Active list.
    #[serde(rename = "Active(file)")]
    pub active_kb: u64,
    /// Inactive list.
    #[serde(rename = "Inactive(file)")]
    pub inactive_kb: u64,
    /// The dirty threshold (`vm.dirty_ratio` or `vm.dirty_bytes` of dirtyable memory).
    #[serde(rename = "DirtyThresh")]
    pub dirty_thresh_kb: u64,
    /// The background threshold.
    #[serde(rename = "BackgroundThresh")]
    pub background_thresh_kb: u64,
    /// The smoothed hard limit writers are throttled against.
    #[serde(rename = "DirtyLimit")]
    pub dirty_limit_kb: u64,
    /// Data ever dirtied.
    #[serde(rename = "Dirtied")]
    pub dirtied_kb: u64,
    /// Data ever written back.
    #[serde(rename = "Written")]
    pub written_kb: u64,
}

/// One backend, `/sys/class/bdi/<dev>/stats` names; bandwidths and ratelimits in kB/s.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BdiStat {
    /// Backend name.
    pub name: String,
    /// Dirty data of this backend.
    #[serde(rename = "BdiReclaimable")]
    pub dirty_kb: u64,
    /// Its data under writeback.
    #[serde(rename = "BdiWriteback")]
    pub writeback_kb: u64,
    /// Its unstable data.
    #[serde(rename = "BdiUnstable")]
    pub unstable_kb: u64,
    /// Its share of the dirty threshold.
    #[serde(rename = "BdiDirtyThresh")]
    pub dirty_thresh_kb: u64,
    /// Its share of the background threshold.
    #[serde(rename = "BdiBackgroundThresh")]
    pub background_thresh_kb: u64,
    /// Estimated write bandwidth.
    #[serde(rename = "BdiWriteBandwidth")]
    pub write_bandwidth_kbps: u64,
    /// Smoothed write bandwidth.
    #[serde(rename = "BdiAvgWriteBandwidth")]
    pub avg_write_bandwidth_kbps: u64,
    /// Base dirty ratelimit per writer.
    #[serde(rename = "DirtyRatelimit")]
    pub dirty_ratelimit_kbps: u64,
    /// Last balanced ratelimit.
    #[serde(rename = "BalancedDirtyRatelimit")]
    pub balanced_dirty_ratelimit_kbps: u64,
    /// Requests in flight.
    #[serde(rename = "Inflight")]
    pub inflight: u64,
    /// Writeback throttling: maximum depth.
    #[serde(rename = "WbtMaxDepth")]
    pub wbt_max_depth: u32,
    /// Writeback throttling: background write limit now.
    #[serde(rename = "WbtBackground")]
    pub wbt_background: u32,
    /// Writeback throttling: scale step (positive: scaled down).
    #[serde(rename = "WbtStep")]
    pub wbt_step: i32,
    /// Data ever dirtied against it.
    #[serde(rename = "BdiDirtied")]
    pub dirtied_kb: u64,
    /// Data ever written to it.
    #[serde(rename = "BdiWritten")]
    pub written_kb: u64,
    /// The backend's own counters (`Backend::counters`): for NFS the RPC counts, retransmits
    /// and verifier mismatches, for S3 the requests by kind and retries. Empty for local
    /// backends.
    pub backend: std::collections::BTreeMap<String, u64>,
}

/// Event counters of the engine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EngineCounters {
    /// Throttle checks writers made.
    pub throttle_checks: u64,
    /// Checks that went past the freerun point.
    pub throttled_calls: u64,
    /// Reads of shared counters made by throttle checks (two per check is the goal).
    pub global_counter_reads: u64,
    /// Flusher writepages calls.
    pub writepages_calls: u64,
    /// Writes issued and their pages.
    pub writes: u64,
    /// Pages written.
    pub write_pages: u64,
    /// Failed writes.
    pub write_errors: u64,
    /// Reads issued.
    pub reads: u64,
    /// Pages read.
    pub read_pages: u64,
    /// COMMITs sent.
    pub commits: u64,
    /// Pages written again because a COMMIT returned another verifier than their WRITE (the
    /// server restarted and may have lost them).
    pub verifier_redirtied: u64,
    /// Background reclaim: pages scanned, reclaimed, written.
    pub kswapd_scanned: u64,
    /// Pages background reclaim freed.
    pub kswapd_reclaimed: u64,
    /// Pages background reclaim wrote.
    pub kswapd_written: u64,
    /// Direct reclaim: pages scanned.
    pub direct_scanned: u64,
    /// Pages direct reclaim freed.
    pub direct_reclaimed: u64,
    /// Pages direct reclaim wrote (0 under `flusher-only`).
    pub direct_written: u64,
}

/// Everything `Ebb::stats` reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RuntimeStats {
    /// The cache as a whole.
    pub meminfo: MemInfoStat,
    /// Each backend.
    pub bdi: Vec<BdiStat>,
    /// Event counters.
    pub counters: EngineCounters,
}

/// What a drain has left, reported while it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DrainProgress {
    /// Since the drain began.
    pub elapsed_ms: u64,
    /// Pages still dirty.
    pub dirty_pages: u64,
    /// Pages being written.
    pub writeback_pages: u64,
    /// Pages written but not committed.
    pub unstable_pages: u64,
    /// Pages written back since the cache started.
    pub written_pages: u64,
    /// The drain finished.
    pub done: bool,
}

/// The engine's figures, plus each backend's own counters (`backend_counters[i]` for backend
/// `i`, from `Backend::counters`).
pub(crate) fn collect(
    engine: &Engine,
    mut backend_counters: Vec<Vec<(&'static str, u64)>>,
) -> RuntimeStats {
    let m = engine.meminfo();
    let kb = |pages: u64| pages * KB_PER_PAGE;
    let meminfo = MemInfoStat {
        mem_total_kb: kb(m.total),
        mem_free_kb: kb(m.free),
        cached_kb: kb(m.cached),
        dirty_kb: kb(m.dirty),
        writeback_kb: kb(m.writeback),
        unstable_kb: kb(m.unstable),
        active_kb: kb(m.active),
        inactive_kb: kb(m.inactive),
        dirty_thresh_kb: kb(m.thresh),
        background_thresh_kb: kb(m.bg_thresh),
        dirty_limit_kb: kb(m.limit),
        dirtied_kb: kb(m.dirtied),
        written_kb: kb(m.written),
    };
    let bdi = (0..engine.config().backends.len())
        .map(|i| {
            let b = engine.bdi_stats(BackendId(i as u32));
            BdiStat {
                name: b.name,
                dirty_kb: kb(b.dirty),
                writeback_kb: kb(b.writeback),
                unstable_kb: kb(b.unstable),
                dirty_thresh_kb: kb(b.wb_thresh),
                background_thresh_kb: kb(b.wb_bg_thresh),
                write_bandwidth_kbps: kb(b.write_bandwidth),
                avg_write_bandwidth_kbps: kb(b.avg_write_bandwidth),
                dirty_ratelimit_kbps: kb(b.dirty_ratelimit),
                balanced_dirty_ratelimit_kbps: kb(b.balanced_dirty_ratelimit),
                inflight: b.inflight,
                wbt_max_depth: b.wbt_max_depth,
                wbt_background: b.wbt_background,
                wbt_step: b.wbt_step,
                dirtied_kb: kb(b.dirtied),
                written_kb: kb(b.written),
                backend: backend_counters
                    .get_mut(i)
                    .map(|c| c.drain(..).map(|(k, v)| (k.to_owned(), v)).collect())
                    .unwrap_or_default(),
            }
        })
        .collect();
    let s = engine.stats();
    let counters = EngineCounters {
        throttle_checks: s.throttle_checks,
        throttled_calls: s.throttled_calls,
        global_counter_reads: s.global_counter_reads,
        writepages_calls: s.writepages_calls,
        writes: s.writes,
        write_pages: s.write_pages,
        write_errors: s.write_errors,
        reads: s.reads,
        read_pages: s.read_pages,
        commits: s.commits,
        verifier_redirtied: s.verifier_redirtied,
        kswapd_scanned: s.kswapd_scanned,
        kswapd_reclaimed: s.kswapd_reclaimed,
        kswapd_written: s.kswapd_written,
        direct_scanned: s.direct_scanned,
        direct_reclaimed: s.direct_reclaimed,
        direct_written: s.direct_written,
    };
    RuntimeStats { meminfo, bdi, counters }
}
