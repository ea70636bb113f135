//! Dirty limits: how many dirty + writeback pages the cache and each backend may hold.
//!
//! # Goal
//! Bound dirty memory to a fraction of the memory that could hold it, give each backend a
//! share proportional to how fast it completes writes, and place the throttling setpoint
//! between the background threshold and the hard limit (docs/mechanisms.md#2-dirty-limits).
//!
//! # Signals
//! Dirtyable memory (free pages above the reserve plus file pages; anonymous memory excluded),
//! the knobs of [`crate::Config`], each backend's completion fraction from [`crate::fprop`].
//!
//! # Control law
//! ```text
//! avail     = free - min(free, reserve) + file_pages + 1
//! thresh    = dirty_bytes ? ceil(dirty_bytes / PAGE) : dirty_ratio% of avail
//! bg_thresh = dirty_background_bytes ? ... : dirty_background_ratio% of avail
//! if bg_thresh >= thresh: bg_thresh = thresh / 2
//! freerun   = (thresh + bg_thresh) / 2
//! limit     = max(thresh, dirty_limit)        dirty_limit follows thresh down slowly
//! setpoint  = (freerun + limit) / 2
//! wb_thresh = thresh * (100 - sum(min_ratio))% * num/den + thresh * min_ratio%,
//!             capped at thresh * max_ratio%
//! wb_bg_thresh = wb_thresh * bg_thresh / thresh
//! with dirty_seconds (ebb's own, per backend; avg_bw its smoothed write bandwidth):
//! wb_thresh    = min(wb_thresh, dirty_seconds * avg_bw)
//! wb_bg_thresh = min(wb_thresh * bg_thresh / thresh, dirty_background_seconds * avg_bw)
//!                while the cap binds (below the global thresh), the backend is throttled
//!                and written back against these even below the global freerun and
//!                background points (strict_limit); at or above thresh, its writers obey
//!                the global limits as without the cap
//! ```
//! Ratios use the kernel's `ratio * PAGE_SIZE / 100` trick for sub-percent precision.
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | dirty_limit follow-down | 1/32 of the gap | per 200 ms | kernel `update_dirty_limit` |
//! | ratelimit_pages floor | 16 | pages | kernel `writeback_set_ratelimit` |
//! | ratelimit_pages divisor | ncpus * 32 | - | bounds the per-CPU overshoot to ~3% |
//! | legacy ratelimit_pages cap | 1024 | pages (4 MiB) | 2.6.3x, it also sized the writer's IO |
//!
//! # Insufficient data
//! A backend with no completions yet has fraction 0; its threshold is then its `min_ratio`
//! share, and the throttle's idle-device floor (`(limit - dirty) / 8`, in `throttle`) lets it
//! start. Before any bandwidth sample a `dirty_seconds` cap uses the estimate's starting value
//! (100 MB/s, or where `initial_write_bandwidth` starts it).
//!
//! # Stability
//! `dirty_limit` jumps up at once but follows `thresh` down by 1/32 of the gap per update and
//! never below the current dirty count, so a sudden drop in dirtyable memory (an anonymous
//! allocation) does not freeze every writer.
//!
//! # Observability
//! `global_dirty_state` trace lines; `Stats::thresh_pages`, `bg_thresh_pages`, `limit_pages`.

use crate::config::PAGE_SIZE;

/// The knobs that set the global thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirtyKnobs {
    /// Percent of dirtyable memory.
    pub dirty_ratio: u32,
    /// Bytes; takes precedence when nonzero.
    pub dirty_bytes: u64,
    /// Percent of dirtyable memory.
    pub dirty_background_ratio: u32,
    /// Bytes; takes precedence when nonzero.
    pub dirty_background_bytes: u64,
}

/// The global thresholds, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Thresholds {
    /// Hard threshold (`dirty_thresh`).
    pub thresh: u64,
    /// Background threshold.
    pub bg_thresh: u64,
}

/// Dirtyable memory in pages (kernel `global_dirtyable_memory`): free pages above the reserve,
/// plus file pages, plus one so it is never zero.
pub(crate) fn dirtyable_memory(free: u64, reserve: u64, file_pages: u64) -> u64 {
    free - free.min(reserve) + file_pages + 1
}

/// `thresh` and `bg_thresh` for `avail` dirtyable pages (kernel `domain_dirty_limits`).
pub(crate) fn thresholds(avail: u64, knobs: &DirtyKnobs) -> Thresholds {
    let from_ratio = |ratio: u32| -> u64 {
        let ratio_pp = u128::from(ratio) * u128::from(PAGE_SIZE) / 100;
        (ratio_pp * u128::from(avail) / u128::from(PAGE_SIZE)) as u64
    };
    let thresh = if knobs.dirty_bytes > 0 {
        knobs.dirty_bytes.div_ceil(PAGE_SIZE)
    } else {
        from_ratio(knobs.dirty_ratio)
    };
    let mut bg_thresh = if knobs.dirty_background_bytes > 0 {
        knobs.dirty_background_bytes.div_ceil(PAGE_SIZE)
    } else {
        from_ratio(knobs.dirty_background_ratio)
    };
    if bg_thresh >= thresh {
        bg_thresh = thresh / 2;
    }
    Thresholds { thresh, bg_thresh }
}

/// The point below which writers are not throttled at all.
pub(crate) fn freerun(thresh: u64, bg_thresh: u64) -> u64 {
    (thresh + bg_thresh) / 2
}

/// The hard limit: the larger of `thresh` and the smoothed `dirty_limit`.
pub(crate) fn hard_limit(thresh: u64, dirty_limit: u64) -> u64 {
    thresh.max(dirty_limit)
}

/// The throttling setpoint, halfway between freerun and the limit.
pub(crate) fn setpoint(freerun: u64, limit: u64) -> u64 {
    (freerun + limit) / 2
}

/// One update of the smoothed limit (kernel `update_dirty_limit`, every 200 ms): up at once,
/// down by 1/32 of the gap, never below `dirty`.
pub(crate) fn follow_dirty_limit(dirty_limit: u64, thresh: u64, dirty: u64) -> u64 {
    if dirty_limit < thresh {
        return thresh;
    }
    let target = thresh.max(dirty);
    if dirty_limit > target { dirty_limit - (dirty_limit - target) / 32 } else { dirty_limit }
}

/// A backend's share of `thresh` (kernel `__wb_calc_thresh`), from its completion fraction
/// `num/den`, its min/max ratios and the sum of every backend's min ratio (all percent).
pub(crate) fn wb_thresh(
    thresh: u64,
    num: u64,
    den: u64,
    min_ratio_sum: u32,
    min_ratio: u32,
    max_ratio: u32,
) -> u64 {
    let den = den.max(1);
    let num = num.min(den);
    let pool = u128::from(thresh) * u128::from(100 - min_ratio_sum.min(100)) / 100;
    let mut share = (pool * u128::from(num) / u128::from(den)) as u64;
    share += thresh * u64::from(min_ratio) / 100;
    share.min(thresh * u64::from(max_ratio) / 100)
}

/// The most pages `seconds` of writing at `bw` pages/s take (`dirty_seconds`); no cap for 0.
pub(crate) fn seconds_cap(seconds: u64, bw: u64) -> u64 {
    if seconds == 0 { u64::MAX } else { seconds.saturating_mul(bw) }
}

/// A backend's background threshold: its share of `bg_thresh`.
pub(crate) fn wb_bg_thresh(wb_thresh: u64, bg_thresh: u64, thresh: u64) -> u64 {
    if thresh == 0 {
        0
    } else {
        (u128::from(wb_thresh) * u128::from(bg_thresh) / u128::from(thresh)) as u64
    }
}

/// Pages a writer may dirty before its next check while in freerun (kernel
/// `dirty_poll_interval`): about the square root of the remaining headroom.
pub(crate) fn dirty_poll_interval(dirty: u64, thresh: u64) -> u64 {
    if thresh > dirty { 1 << (ilog2(thresh - dirty) / 2) } else { 1 }
}

/// The 2.6.3x `ratelimit_pages`, which also sized the IO the legacy writer did itself:
/// memory / (ncpus * 32), clamped to 16..=1024 pages.
pub(crate) fn legacy_ratelimit_pages(memory_pages: u64, nr_cpus: u32) -> u64 {
    (memory_pages / (u64::from(nr_cpus) * 32)).clamp(16, 1024)
}

/// The 2.6.3x per-task threshold (`task_dirty_limit`): heavy dirtiers get a threshold up to
/// `bdi_thresh / divisor` lower (divisor 8 in 2.6.3x, 16 in the 2010 IO-less posting), never
/// below half of it. `num/den` is the task's share of recent dirtying.
pub(crate) fn task_dirty_limit(bdi_thresh: u64, num: u64, den: u64, divisor: u64) -> u64 {
    let den = den.max(1);
    let reduction =
        (u128::from(bdi_thresh / divisor) * u128::from(num.min(den)) / u128::from(den)) as u64;
    (bdi_thresh - reduction).max(bdi_thresh / 2)
}

/// floor(log2(x)) for x > 0, and 0 for 0.
pub(crate) fn ilog2(x: u64) -> u32 {
    if x == 0 { 0 } else { 63 - x.leading_zeros() }
}

/// The smallest power of two not below `x` (1 for 0).
pub(crate) fn roundup_pow_of_two(x: u64) -> u64 {
    x.max(1).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel defaults 20/10 on 1,000,000 dirtyable pages give the thresholds by hand.
    #[test]
    fn thresholds_by_hand() {
        let knobs = DirtyKnobs {
            dirty_ratio: 20,
            dirty_bytes: 0,
            dirty_background_ratio: 10,
            dirty_background_bytes: 0,
        };
        // ratio_pp = 20 * 4096 / 100 = 819 (truncated), thresh = 819 * 1e6 / 4096 = 199951;
        // bg: 10 * 4096 / 100 = 409, 409 * 1e6 / 4096 = 99853.
        let t = thresholds(1_000_000, &knobs);
        assert_eq!(t, Thresholds { thresh: 199_951, bg_thresh: 99_853 });
        assert_eq!(freerun(t.thresh, t.bg_thresh), 149_902);
        assert_eq!(setpoint(149_902, 199_951), 174_926);
    }

    /// Bytes knobs take precedence, round up to pages, and a background threshold at or above
    /// the hard one is halved.
    #[test]
    fn bytes_knobs_and_background_clamp() {
        let knobs = DirtyKnobs {
            dirty_ratio: 20,
            dirty_bytes: 10_000,
            dirty_background_ratio: 0,
            dirty_background_bytes: 40_960,
        };
        let t = thresholds(1_000_000, &knobs);
        assert_eq!(t.thresh, 3);
        assert_eq!(t.bg_thresh, 1);
    }

    /// The smoothed limit jumps up but follows down by 1/32 of the gap, never below dirty.
    #[test]
    fn dirty_limit_follows_down_slowly() {
        assert_eq!(follow_dirty_limit(1000, 2000, 0), 2000);
        assert_eq!(follow_dirty_limit(2000, 1000, 0), 2000 - 1000 / 32);
        assert_eq!(follow_dirty_limit(2000, 1000, 1990), 2000);
        assert_eq!(follow_dirty_limit(2000, 1000, 1900), 2000 - 100 / 32);
    }

    /// A backend's share follows its completion fraction within min and max ratios.
    #[test]
    fn wb_thresh_shares() {
        assert_eq!(wb_thresh(10_000, 1, 2, 0, 0, 100), 5_000);
        assert_eq!(wb_thresh(10_000, 0, 1, 10, 10, 100), 1_000);
        assert_eq!(wb_thresh(10_000, 1, 1, 10, 10, 100), 10_000);
        assert_eq!(wb_thresh(10_000, 1, 1, 0, 0, 1), 100);
        assert_eq!(wb_bg_thresh(5_000, 5_000, 10_000), 2_500);
    }

    /// The poll interval is about the square root of the headroom.
    #[test]
    fn poll_interval_is_square_root_of_headroom() {
        assert_eq!(dirty_poll_interval(0, 1 << 20), 1 << 10);
        assert_eq!(dirty_poll_interval(0, 1000), 1 << 4);
        assert_eq!(dirty_poll_interval(500, 400), 1);
    }

    /// Legacy per-task limits shrink by up to 1/divisor for a task doing all the dirtying.
    #[test]
    fn task_dirty_limit_by_hand() {
        assert_eq!(task_dirty_limit(16_000, 1, 1, 8), 14_000);
        assert_eq!(task_dirty_limit(16_000, 1, 1, 16), 15_000);
        assert_eq!(task_dirty_limit(16_000, 0, 1, 8), 16_000);
        assert_eq!(legacy_ratelimit_pages(1 << 20, 4), 1024);
    }
}
