//! Counters the engine keeps about itself, and the `/proc/meminfo`- and `/sys/class/bdi`-shaped
//! views drivers report.

/// Cumulative counts of the engine's decisions and IO.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Throttle checks entered (calls that read shared counters).
    pub throttle_checks: u64,
    /// Reads of shared counter blocks (the global domain or a backend) by throttle checks.
    pub global_counter_reads: u64,
    /// Throttle calls that made the writer wait.
    pub throttled_calls: u64,
    /// Pages written back by writers themselves (legacy policy only).
    pub writer_writeback_pages: u64,
    /// Writes issued by writers themselves (legacy policy only).
    pub writer_writeback_ios: u64,
    /// Writepages calls (`do_writepages`): the flusher's chunks, including passes over a file
    /// that only has unstable pages and so find nothing to write (the kernel counts those too),
    /// fsync's integrity call, and legacy writers' own writeback.
    pub writepages_calls: u64,
    /// Pages written by those calls.
    pub writepages_pages: u64,
    /// Writes issued.
    pub writes: u64,
    /// Pages in those writes.
    pub write_pages: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Reads issued.
    pub reads: u64,
    /// Pages in those reads.
    pub read_pages: u64,
    /// COMMITs issued.
    pub commits: u64,
    /// Unstable pages covered by those COMMITs.
    pub commit_pages: u64,
    /// Pages redirtied because a verifier changed (server restart).
    pub verifier_redirtied: u64,
    /// Flusher works run.
    pub flusher_works: u64,
    /// Pages scanned by background reclaim.
    pub kswapd_scanned: u64,
    /// Pages freed by background reclaim.
    pub kswapd_reclaimed: u64,
    /// Pages written by background reclaim itself.
    pub kswapd_written: u64,
    /// Pages scanned by direct reclaim.
    pub direct_scanned: u64,
    /// Pages freed by direct reclaim.
    pub direct_reclaimed: u64,
    /// Pages written by direct reclaim itself.
    pub direct_written: u64,
    /// Anonymous pages background reclaim wrote to swap.
    pub kswapd_swapped: u64,
    /// Anonymous pages direct reclaim wrote to swap (allowed under every policy).
    pub direct_swapped: u64,
    /// Times a writer waited for memory.
    pub memory_waits: u64,
    /// Reclaim stalls: a writer found no frame even after direct reclaim and waited, or direct
    /// reclaim found the LRU congested and throttled it.
    pub reclaim_stalls: u64,
    /// Times kswapd throttled itself on writeback (pages cycling faster than IO completes).
    pub kswapd_throttled: u64,
    /// Total time of the reclaim stalls that ended, nanoseconds.
    pub reclaim_stall_ns: u64,
    /// Dirty or writeback pages found at the LRU tail and left for the flusher.
    pub reclaim_immediate: u64,
    /// Dirty pages reclaim would have written but kept for another trip because they were
    /// referenced since the last examination (`PAGEREF_RECLAIM_CLEAN`).
    pub reclaim_kept_referenced: u64,
    /// Flusher wakeups requested by reclaim.
    pub reclaim_flusher_wakeups: u64,
}

/// The cache as a whole, in pages (`/proc/meminfo` style).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// The memory budget.
    pub total: u64,
    /// Unused pages.
    pub free: u64,
    /// Anonymous (non-cache) pages.
    pub anon: u64,
    /// Resident file pages.
    pub cached: u64,
    /// Dirty pages (`Dirty`).
    pub dirty: u64,
    /// Of those, pages held by a write error that will not pass (ENOSPC, EROFS): kept until
    /// the user rewrites, truncates or deletes them.
    pub held: u64,
    /// Pages under writeback (`Writeback`).
    pub writeback: u64,
    /// Written but uncommitted pages (`NFS_Unstable`).
    pub unstable: u64,
    /// Pages on the active list.
    pub active: u64,
    /// Pages on the inactive list.
    pub inactive: u64,
    /// Dirty threshold.
    pub thresh: u64,
    /// Background threshold.
    pub bg_thresh: u64,
    /// Hard limit (smoothed).
    pub limit: u64,
    /// Pages dirtied, ever.
    pub dirtied: u64,
    /// Pages whose writeback completed, ever.
    pub written: u64,
}

/// One backend (`/sys/class/bdi/<name>/stats` style); bandwidths in pages/s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BdiStats {
    /// Backend name.
    pub name: String,
    /// Dirty pages.
    pub dirty: u64,
    /// Of those, pages held by a write error that will not pass.
    pub held: u64,
    /// Pages under writeback.
    pub writeback: u64,
    /// Unstable pages.
    pub unstable: u64,
    /// The backend's share of the threshold.
    pub wb_thresh: u64,
    /// The backend's share of the background threshold.
    pub wb_bg_thresh: u64,
    /// Estimated write bandwidth.
    pub write_bandwidth: u64,
    /// Smoothed write bandwidth.
    pub avg_write_bandwidth: u64,
    /// Base ratelimit per writer.
    pub dirty_ratelimit: u64,
    /// Last balanced ratelimit.
    pub balanced_dirty_ratelimit: u64,
    /// Requests in flight.
    pub inflight: u64,
    /// Writeback throttling: current maximum depth.
    pub wbt_max_depth: u32,
    /// Writeback throttling: current limit on background writes.
    pub wbt_background: u32,
    /// Writeback throttling: current limit on other buffered writes.
    pub wbt_normal: u32,
    /// Writeback throttling: current scale step (positive: scaled down).
    pub wbt_step: i32,
    /// Writeback throttling: the read-latency target, µs (0: off).
    pub wbt_target_us: u64,
    /// Writeback throttling: minimum read latency of the last window with reads, µs.
    pub wbt_read_min_us: u64,
    /// Pages dirtied against it, ever.
    pub dirtied: u64,
    /// Pages written, ever.
    pub written: u64,
}

/// One file's write-error state (mechanism 9), from [`crate::Engine::file_errors`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileErrors {
    /// The last write or COMMIT error recorded for the file.
    pub error: Option<crate::IoError>,
    /// Errors recorded so far (the errseq counter).
    pub count: u64,
    /// Whether the last error has not been reported to any handle yet.
    pub unseen: bool,
    /// When writeback retries the pages an error that may pass left dirty.
    pub retry_at: Option<crate::Instant>,
    /// Dirty pages held by an error that will not pass (kept, not retried in the background).
    pub held_pages: u64,
    /// Dirty pages in all (held ones included).
    pub dirty_pages: u64,
}
