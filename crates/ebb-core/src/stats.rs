//! Counters the engine keeps about itself, and the `/proc/meminfo`- and `/sys/class/bdi`-shaped
//! views drivers report.
//!
//! Each struct is declared once, through the `figures!` macro: besides the struct, it lists every figure
//! with the name drivers show it under and its unit ([`Stats::figures`], [`MemInfo::figures`],
//! [`BdiStats::figures`]), so a driver reports a new counter without naming it again (the
//! runtime's `ebb stat` JSON is built from these lists). Counters are shown under their field
//! names; the views under the kernel's names (`Dirty`, `BdiReclaimable`, ...; ebb's own for what
//! the kernel does not show, such as `Held`), and their pages are converted to kB by the driver
//! as the kernel's files do.

/// What unit a figure is in, so a driver converts it the way the kernel's files do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Pages (shown in kB).
    Pages,
    /// Pages per second (shown in kB/s).
    PagesPerSecond,
    /// A number shown as it is: a count, or a quantity whose unit the name says (`_ns`, `_us`,
    /// `_pages`).
    Number,
}

/// One figure of a stats struct: the name it is shown under and its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figure {
    /// The name drivers show it under (`/proc/meminfo`'s for [`MemInfo`], the field's own for
    /// [`Stats`]).
    pub name: &'static str,
    /// Its unit.
    pub unit: Unit,
}

/// A figure's value (one of the struct's unsigned or signed fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// A count or quantity.
    Unsigned(u64),
    /// A signed quantity (wbt's scale step).
    Signed(i64),
}

impl From<u64> for Value {
    fn from(value: u64) -> Value {
        Value::Unsigned(value)
    }
}

impl From<u32> for Value {
    fn from(value: u32) -> Value {
        Value::Unsigned(value.into())
    }
}

impl From<i32> for Value {
    fn from(value: i32) -> Value {
        Value::Signed(value.into())
    }
}

/// Declares a stats struct and its list of figures in one place. `counters` structs have only
/// `u64` counts, shown under their field names; in `views`, a field with `#[figure(NAME, UNIT)]`
/// is shown under NAME in UNIT, and a field without one (a backend's name) is not a figure.
macro_rules! figures {
    (counters
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[doc = $doc:literal])* pub $field:ident: u64, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: u64, )*
        }

        impl $name {
            /// Every counter, in declaration order, under its field name.
            pub fn figures(&self) -> Vec<(Figure, Value)> {
                vec![$(
                    (Figure { name: stringify!($field), unit: Unit::Number }, self.$field.into()),
                )*]
            }
        }
    };
    (views
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $(#[figure($shown:literal, $unit:ident)])?
                pub $field:ident: $type:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $type, )*
        }

        impl $name {
            /// Every figure, in declaration order, under the kernel's name (ebb's own where the
            /// kernel has none: `Held`, `WbtTargetUsec`) and with its unit.
            pub fn figures(&self) -> Vec<(Figure, Value)> {
                vec![$($(
                    (Figure { name: $shown, unit: Unit::$unit }, self.$field.into()),
                )?)*]
            }
        }
    };
}

figures! { counters
/// Cumulative counts of the engine's decisions and IO.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Throttle checks entered (calls that read shared counters).
    pub throttle_checks: u64,
    /// Reads of shared counter blocks (the global domain or a backend) by throttle checks.
    pub global_counter_reads: u64,
    /// Files the engine looked at while handling events and computing its next timer: the
    /// entries of its deadline and unstable-file indexes it visited, not every file it knows.
    /// Per event ([`Stats::events`]) it does not grow with the number of files known.
    pub files_visited: u64,
    /// Events handled ([`crate::Engine::handle`]).
    pub events: u64,
    /// Files the engine forgot ([`crate::Action::Forget`]): deleted, or closed with nothing
    /// cached, in flight or unreported.
    pub files_forgotten: u64,
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
    /// Failed writes and COMMITs whose every page was truncated away or discarded while they
    /// were in flight: nothing was lost, so nothing is reported or retried.
    pub errors_of_dropped_pages: u64,
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
    /// Times the engine asked the driver for writers' unused frame reserves
    /// ([`crate::Action::ReturnReserves`]).
    pub reserve_sweeps: u64,
    /// Frames writers gave back from their reserves on such a request.
    pub reserve_frames_returned: u64,
    /// Times a writer waited for a place in the granule gate (its file may not start filling
    /// a write granule while as many files as fit are filling theirs).
    pub granule_gate_waits: u64,
    /// Writes failed by the engine ([`crate::Verdict::Fail`]): held pages filled the cache, or
    /// the writer's backend was unreachable past its retry timeout.
    pub writes_failed: u64,
    /// Writes and commits that failed because the backend could not be reached
    /// ([`crate::ErrorClass::Outage`]).
    pub outage_errors: u64,
    /// Outages that outlasted their backend's `retry_timeout_secs` (EIO reported).
    pub outage_timeouts: u64,
    /// Commits the engine asked for of files owed one ([`crate::Action::SyncFile`]: their
    /// close or backend sync failed on a `flush_on_close` backend, and they are written back).
    pub owed_commits: u64,
    /// Syncs of backend files on `flush_on_close` backends that failed
    /// ([`crate::Event::FileSyncFailed`]): each leaves the file owed a commit.
    pub file_sync_failures: u64,
    /// Retries of held pages (a file's held pages taken for writing again).
    pub held_retries: u64,
    /// Background writes of held pages refused again: not reported to any handle again (the
    /// failure was reported when the pages were first held).
    pub held_retries_failed: u64,
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
}

figures! { views
/// The cache as a whole, in pages (`/proc/meminfo` style).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// The memory budget.
    #[figure("MemTotal", Pages)]
    pub total: u64,
    /// Unused pages.
    #[figure("MemFree", Pages)]
    pub free: u64,
    /// Anonymous (non-cache) pages.
    #[figure("AnonPages", Pages)]
    pub anon: u64,
    /// Pages charged for the state of the files the cache knows (the kernel's inode and
    /// dentry slab; `Config::file_state_bytes`).
    #[figure("Slab", Pages)]
    pub slab: u64,
    /// Resident file pages.
    #[figure("Cached", Pages)]
    pub cached: u64,
    /// Dirty pages (`Dirty`).
    #[figure("Dirty", Pages)]
    pub dirty: u64,
    /// Of those, pages held by a write error that will not pass (ENOSPC, EROFS): kept until
    /// the user rewrites, truncates or deletes them.
    #[figure("Held", Pages)]
    pub held: u64,
    /// Pages under writeback (`Writeback`).
    #[figure("Writeback", Pages)]
    pub writeback: u64,
    /// Written but uncommitted pages (`NFS_Unstable`).
    #[figure("NFS_Unstable", Pages)]
    pub unstable: u64,
    /// Pages on the active list.
    #[figure("Active(file)", Pages)]
    pub active: u64,
    /// Pages on the inactive list.
    #[figure("Inactive(file)", Pages)]
    pub inactive: u64,
    /// Dirty threshold.
    #[figure("DirtyThresh", Pages)]
    pub thresh: u64,
    /// Background threshold.
    #[figure("BackgroundThresh", Pages)]
    pub bg_thresh: u64,
    /// Hard limit (smoothed).
    #[figure("DirtyLimit", Pages)]
    pub limit: u64,
    /// Freerun: below it writers are not throttled, (thresh + bg_thresh) / 2.
    #[figure("DirtyFreerun", Pages)]
    pub freerun: u64,
    /// The throttling setpoint, where IO-less throttling settles: (freerun + limit) / 2.
    #[figure("DirtySetpoint", Pages)]
    pub setpoint: u64,
    /// Pages dirtied, ever.
    #[figure("Dirtied", Pages)]
    pub dirtied: u64,
    /// Pages whose writeback completed, ever.
    #[figure("Written", Pages)]
    pub written: u64,
}
}

figures! { views
/// One backend (`/sys/class/bdi/<name>/stats` style); bandwidths in pages/s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BdiStats {
    /// Backend name.
    pub name: String,
    /// Dirty pages.
    #[figure("BdiReclaimable", Pages)]
    pub dirty: u64,
    /// Of those, pages held by a write error that will not pass.
    #[figure("BdiHeld", Pages)]
    pub held: u64,
    /// Pages under writeback.
    #[figure("BdiWriteback", Pages)]
    pub writeback: u64,
    /// Unstable pages.
    #[figure("BdiUnstable", Pages)]
    pub unstable: u64,
    /// The backend's share of the threshold.
    #[figure("BdiDirtyThresh", Pages)]
    pub wb_thresh: u64,
    /// The backend's share of the background threshold.
    #[figure("BdiBackgroundThresh", Pages)]
    pub wb_bg_thresh: u64,
    /// Estimated write bandwidth.
    #[figure("BdiWriteBandwidth", PagesPerSecond)]
    pub write_bandwidth: u64,
    /// Smoothed write bandwidth.
    #[figure("BdiAvgWriteBandwidth", PagesPerSecond)]
    pub avg_write_bandwidth: u64,
    /// Base ratelimit per writer.
    #[figure("DirtyRatelimit", PagesPerSecond)]
    pub dirty_ratelimit: u64,
    /// Last balanced ratelimit.
    #[figure("BalancedDirtyRatelimit", PagesPerSecond)]
    pub balanced_dirty_ratelimit: u64,
    /// Requests in flight.
    #[figure("Inflight", Number)]
    pub inflight: u64,
    /// Writeback throttling: current maximum depth.
    #[figure("WbtMaxDepth", Number)]
    pub wbt_max_depth: u32,
    /// Writeback throttling: current limit on background writes.
    #[figure("WbtBackground", Number)]
    pub wbt_background: u32,
    /// Writeback throttling: current limit on other buffered writes.
    #[figure("WbtNormal", Number)]
    pub wbt_normal: u32,
    /// Writeback throttling: current scale step (positive: scaled down).
    #[figure("WbtStep", Number)]
    pub wbt_step: i32,
    /// Writeback throttling: the read-latency target, µs (0: off).
    #[figure("WbtTargetUsec", Number)]
    pub wbt_target_us: u64,
    /// Writeback throttling: minimum read latency of the last window with reads, µs.
    #[figure("WbtReadMinUsec", Number)]
    pub wbt_read_min_us: u64,
    /// Writeback throttling, `wbt = ebb` pacing: the share of the time background writes
    /// may be in service while reads are active, per mille (1000: unpaced).
    #[figure("WbtDutyPermille", Number)]
    pub wbt_duty_permille: u32,
    /// Pages dirtied against it, ever.
    #[figure("BdiDirtied", Pages)]
    pub dirtied: u64,
    /// Pages written, ever.
    #[figure("BdiWritten", Pages)]
    pub written: u64,
    /// Files whose close or backend sync failed, owed a commit once written back
    /// (`ebb_core`'s `recommit`: committed without anyone's fsync).
    #[figure("BdiCommitsOwed", Number)]
    pub commits_owed: u64,
}
}

/// One file's write-error state (docs/mechanisms.md#9-errors), from [`crate::Engine::file_errors`].
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
    /// Its close or backend sync failed: the engine commits it once it is written back
    /// (`recommit`).
    pub commit_owed: bool,
}
