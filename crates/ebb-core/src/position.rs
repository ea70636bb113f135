//! Position control and pause bounds of the IO-less throttle
//! (docs/throttling.md#io-less-throttling-the-mature-design-linux-32-onwards).
//!
//! # Goal
//! Scale each writer's rate by how far the dirty count is from the setpoint, so the dirty count
//! settles at the setpoint, and bound each pause so writers neither burn CPU on tiny sleeps nor
//! stall long enough to let the device run dry.
//!
//! # Signals
//! Global `dirty`, `freerun`, `setpoint`, `limit`; the backend's `wb_dirty`, `wb_thresh`,
//! `wb_bg_thresh`, `avg_write_bw`; read once per throttle check.
//!
//! # Control law
//! ```text
//! global cubic:    x = (setpoint - dirty) / (limit - setpoint)
//!                  pos_ratio = clamp(1 + x^3, 0, 2)            (0 at or over the limit)
//! backend line:    wb_thresh' = max(min(wb_thresh, thresh), (limit - dirty) / 8)
//!                  r = wb_thresh' / thresh
//!                  wb_setpoint = setpoint * r
//!                  span = (thresh - wb_thresh' + 8 * write_bw) * r
//!                  x_intercept = wb_setpoint + span
//!                  pos_ratio *= (x_intercept - wb_dirty) / (x_intercept - wb_setpoint),
//!                  floored at 1/4 once wb_dirty >= x_intercept - span/4
//! reserve area:    wb_dirty < wb_thresh'/2: pos_ratio *= min(8, (wb_thresh'/2) / wb_dirty)
//! strictlimit:     pos_ratio = min(global, cubic(wb_setpoint, wb_dirty, wb_thresh)),
//!                  wb_setpoint = (wb_thresh + wb_bg_thresh) / 2
//! ```
//! Required properties, each tested: the cubic is 2 at freerun (ramp fast when far below), 1
//! at the setpoint, 0 at the limit, never increasing with dirty, and flat near the setpoint
//! (little oscillation) while steep far from it (fast correction). The backend line spans about
//! 8 seconds of writeback for one device, so the normal wander of ±write_bw/2 moves the ratio
//! by ~12.5%.
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | RATELIMIT_CALC_SHIFT | 10 | bits (1.0 = 1024) | kernel |
//! | MAX_PAUSE | 200 ms (HZ/5 jiffies, at least 1) | ms | kernel |
//! | DIRTY_POLL_THRESH | 32 | pages (128 KiB) | kernel |
//! | backend line floor | 1/4 | - | kernel `wb_position_ratio` |
//! | idle-device floor | (limit - dirty)/8 | pages | kernel |
//! | reserve area cap | 8x | - | kernel |
//! | min pause target | 10 ms + ~10 ms per doubling of N | ms | kernel `wb_min_pause` |
//!
//! # Insufficient data
//! Before the bandwidth is known it is the 100 MB/s initial estimate; the backend line and the
//! max pause then assume a fast device, which errs toward shorter pauses. A nearly idle backend
//! under strictlimit (`wb_dirty < 8`) doubles the ratio so it can ramp.
//!
//! # Stability
//! Flatness of the cubic near the setpoint damps oscillation; the pause cap of about 1/8 of the
//! time to write the backend's dirty pages keeps the device fed; the minimum pause and the
//! `nr_dirtied_pause` it yields keep checks infrequent.
//!
//! # Observability
//! `balance_dirty_pages` trace lines carry `setpoint`, `bdi_setpoint`, `task_ratelimit`,
//! `pause`, `period`, `think`.

use crate::bandwidth::RATELIMIT_CALC_SHIFT;
use crate::limits::{ilog2, roundup_pow_of_two};
use crate::time::Duration;

/// 1.0 in position-ratio fixed point.
pub(crate) const ONE: u64 = 1 << RATELIMIT_CALC_SHIFT;
/// Pages below which checks are not worth doing more often.
pub(crate) const DIRTY_POLL_THRESH: u64 = 32;
/// The longest pause a writer sleeps (the kernel's `MAX_PAUSE`, `max(HZ / 5, 1)` jiffies).
pub const MAX_PAUSE: Duration = Duration::from_millis(200);

/// [`MAX_PAUSE`] in ticks of a `hz` clock, at least one (`HZ / 5` exactly: 200 ms is a fifth of
/// a second).
pub(crate) fn max_pause_jiffies(hz: u64) -> u64 {
    MAX_PAUSE.jiffies(hz).max(1)
}

/// The cubic global control line (kernel `pos_ratio_polynom`), in 1/1024.
pub(crate) fn pos_ratio_polynom(setpoint: u64, dirty: u64, limit: u64) -> u64 {
    let span = (limit as i64 - setpoint as i64) | 1;
    let x = ((setpoint as i64 - dirty as i64) << RATELIMIT_CALC_SHIFT) / span;
    let mut pos = x;
    pos = (pos * x) >> RATELIMIT_CALC_SHIFT;
    pos = (pos * x) >> RATELIMIT_CALC_SHIFT;
    pos += 1 << RATELIMIT_CALC_SHIFT;
    pos.clamp(0, 2 << RATELIMIT_CALC_SHIFT) as u64
}

/// Everything position control reads, in pages and pages/s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PositionInputs {
    /// Global hard threshold.
    pub thresh: u64,
    /// Global background threshold.
    pub bg_thresh: u64,
    /// Global hard limit (`max(thresh, dirty_limit)`).
    pub limit: u64,
    /// Global dirty + writeback (+ unstable) pages.
    pub dirty: u64,
    /// The backend's share of `thresh`.
    pub wb_thresh: u64,
    /// The backend's share of `bg_thresh`.
    pub wb_bg_thresh: u64,
    /// The backend's dirty + writeback (+ unstable) pages.
    pub wb_dirty: u64,
    /// The backend's smoothed write bandwidth, pages/s.
    pub avg_write_bw: u64,
    /// Whether the backend throttles on its own counts.
    pub strict_limit: bool,
}

impl PositionInputs {
    /// The global freerun ceiling.
    pub(crate) fn freerun(&self) -> u64 {
        (self.thresh + self.bg_thresh) / 2
    }

    /// The global setpoint.
    pub(crate) fn setpoint(&self) -> u64 {
        (self.freerun() + self.limit) / 2
    }
}

/// The position ratio for a writer of this backend (kernel `wb_position_ratio`), in 1/1024.
pub(crate) fn wb_position_ratio(p: &PositionInputs) -> u64 {
    let freerun = p.freerun();
    let limit = p.limit;
    if p.dirty >= limit {
        return 0;
    }
    let setpoint = (freerun + limit) / 2;
    let mut pos_ratio = pos_ratio_polynom(setpoint, p.dirty, limit);

    if p.strict_limit {
        if p.wb_dirty < 8 {
            return (pos_ratio * 2).min(2 * ONE);
        }
        if p.wb_dirty >= p.wb_thresh {
            return 0;
        }
        let wb_setpoint = (p.wb_thresh + p.wb_bg_thresh) / 2;
        if wb_setpoint == 0 || wb_setpoint == p.wb_thresh {
            return 0;
        }
        let wb_pos = pos_ratio_polynom(wb_setpoint, p.wb_dirty, p.wb_thresh);
        return pos_ratio.min(wb_pos);
    }

    // The backend's linear line.
    let mut wb_thresh = p.wb_thresh.min(p.thresh);
    wb_thresh = wb_thresh.max((limit - p.dirty) / 8);
    let ratio_16 = ((u128::from(wb_thresh) << 16) / u128::from(p.thresh | 1)) as u64;
    let wb_setpoint = ((u128::from(setpoint) * u128::from(ratio_16)) >> 16) as u64;
    // Saturating: when anonymous memory shrinks thresh fast, the smoothed limit stays high
    // and `(limit - dirty) / 8` can pass thresh.
    let span = ((u128::from(p.thresh.saturating_sub(wb_thresh) + 8 * p.avg_write_bw)
        * u128::from(ratio_16))
        >> 16) as u64;
    let x_intercept = wb_setpoint + span;
    if p.wb_dirty < x_intercept - span / 4 {
        pos_ratio = ((u128::from(pos_ratio) * u128::from(x_intercept - p.wb_dirty))
            / u128::from((x_intercept - wb_setpoint) | 1)) as u64;
    } else {
        pos_ratio /= 4;
    }

    // Reserve area: keep a minimum of dirty pages queued for the device.
    let reserve = wb_thresh / 2;
    if p.wb_dirty < reserve {
        if p.wb_dirty > reserve / 8 {
            pos_ratio =
                (u128::from(pos_ratio) * u128::from(reserve) / u128::from(p.wb_dirty)) as u64;
        } else {
            pos_ratio *= 8;
        }
    }
    pos_ratio
}

/// The longest pause, jiffies (kernel `wb_max_pause`): about 1/8 of the time to write the
/// backend's dirty pages, at most 200 ms.
pub(crate) fn wb_max_pause(wb_dirty: u64, avg_write_bw: u64, hz: u64) -> u64 {
    let max_pause = max_pause_jiffies(hz);
    let t = wb_dirty / (1 + avg_write_bw / roundup_pow_of_two(1 + hz / 8)) + 1;
    t.min(max_pause)
}

/// The shortest pause worth sleeping, jiffies, and the pages to dirty before the next check
/// (kernel `wb_min_pause`).
pub(crate) fn wb_min_pause(
    max_pause: u64,
    avg_write_bw: u64,
    dirty_ratelimit: u64,
    task_ratelimit: u64,
    hz: u64,
) -> (u64, u64) {
    let hi = ilog2(avg_write_bw);
    let lo = ilog2(dirty_ratelimit);
    let mut t = (hz / 100).max(1);
    if hi > lo {
        t += u64::from(hi - lo) * (10 * hz) / 1024;
    }
    t = t.min(1 + max_pause / 2);
    let pow_hz = roundup_pow_of_two(hz);
    let mut pages = dirty_ratelimit * t / pow_hz;
    if pages < DIRTY_POLL_THRESH {
        t = max_pause;
        pages = dirty_ratelimit * t / pow_hz;
        if pages > DIRTY_POLL_THRESH {
            pages = DIRTY_POLL_THRESH;
            t = hz * DIRTY_POLL_THRESH / dirty_ratelimit.max(1);
        }
    }
    let pause = hz * pages / (task_ratelimit + 1);
    if pause > max_pause {
        t = max_pause;
        pages = task_ratelimit * t / pow_hz;
    }
    let min_pause = if pages >= DIRTY_POLL_THRESH { 1 + t / 2 } else { t };
    (min_pause, pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200 ms in jiffies is the kernel's `max(HZ / 5, 1)` for every HZ the knob allows, and so
    /// is the bandwidth interval.
    #[test]
    fn max_pause_is_a_fifth_of_a_second_in_jiffies() {
        for hz in 1..=10_000 {
            assert_eq!(max_pause_jiffies(hz), (hz / 5).max(1), "HZ={hz}");
            assert_eq!(crate::bandwidth::bandwidth_interval_jiffies(hz), (hz / 5).max(1));
        }
    }

    /// The cubic's anchor points: 2 at freerun, 1 at the setpoint, 0 at the limit.
    #[test]
    fn cubic_anchor_points() {
        // freerun 999, setpoint 1500, limit 2001: the span 501 is odd, so the kernel's `| 1`
        // on the denominator leaves it exact.
        assert_eq!(pos_ratio_polynom(1500, 999, 2001), 2 * ONE);
        assert_eq!(pos_ratio_polynom(1500, 1500, 2001), ONE);
        assert_eq!(pos_ratio_polynom(1500, 2001, 2001), 0);
        // Halfway between setpoint and limit: x = -1/2, 1 + x^3 = 7/8 = 896, within rounding.
        assert!(pos_ratio_polynom(1500, 1750, 2001).abs_diff(896) <= 2);
        // With an even span the `| 1` costs under 1% at freerun.
        assert!(pos_ratio_polynom(1500, 1000, 2000).abs_diff(2 * ONE) <= 2 * ONE / 100);
    }

    /// The cubic never increases with dirty and is flatter near the setpoint than far from it.
    #[test]
    fn cubic_is_monotone_and_flat_at_setpoint() {
        let mut last = u64::MAX;
        for dirty in (1000..=2000).step_by(10) {
            let r = pos_ratio_polynom(1500, dirty, 2000);
            assert!(r <= last);
            last = r;
        }
        let near = pos_ratio_polynom(1500, 1490, 2000) - pos_ratio_polynom(1500, 1510, 2000);
        let far = pos_ratio_polynom(1500, 1890, 2000) - pos_ratio_polynom(1500, 1910, 2000);
        assert!(near < far);
    }

    fn single_device(dirty: u64) -> PositionInputs {
        PositionInputs {
            thresh: 200_000,
            bg_thresh: 100_000,
            limit: 200_000,
            dirty,
            wb_thresh: 200_000,
            wb_bg_thresh: 100_000,
            wb_dirty: dirty,
            avg_write_bw: 15_000,
            strict_limit: false,
        }
    }

    /// With one device holding all the dirty pages, the ratio is 1 at the setpoint and 0 at
    /// the limit; the backend line is 1 at its setpoint, which equals the global one.
    #[test]
    fn single_device_ratio_by_hand() {
        let p = single_device(175_000);
        assert_eq!(p.setpoint(), 175_000);
        // ratio_16 = (200000 << 16) / 200001 = 65535; wb_setpoint = 175000*65535>>16 = 174997;
        // the line factor is (x_int - 175000)/(x_int - 174997) ~ 1, so the result is ~1024.
        let r = wb_position_ratio(&p);
        assert!(r.abs_diff(ONE) <= 1, "{r}");
        assert_eq!(wb_position_ratio(&single_device(200_000)), 0);
        assert_eq!(wb_position_ratio(&single_device(250_000)), 0);
    }

    /// A strictlimit backend is throttled by its own line even far below the global freerun.
    #[test]
    fn strictlimit_uses_the_backends_own_line() {
        let p = PositionInputs {
            wb_thresh: 8_000,
            wb_bg_thresh: 4_000,
            wb_dirty: 6_000,
            dirty: 10_000,
            strict_limit: true,
            ..single_device(0)
        };
        assert_eq!(wb_position_ratio(&p), ONE);
        let over = PositionInputs { wb_dirty: 8_000, ..p };
        assert_eq!(wb_position_ratio(&over), 0);
    }

    /// An idle backend far below its reserve gets up to 8x its ratio.
    #[test]
    fn reserve_area_boosts_a_nearly_empty_backend() {
        let p = PositionInputs { wb_dirty: 1_000, ..single_device(175_000) };
        let base = pos_ratio_polynom(175_000, 175_000, 200_000);
        assert!(wb_position_ratio(&p) >= 4 * base);
    }

    /// Pauses are bounded: max 200 ms at HZ 1000, and at least ~1/8 of the drain time when small.
    #[test]
    fn max_pause_by_hand() {
        // bw 15000 pages/s: 15000/128 = 117; 100000/118 + 1 = 848 > 200 -> 200.
        assert_eq!(wb_max_pause(100_000, 15_000, 1000), 200);
        // 1000 pages: 1000/118 + 1 = 9 jiffies.
        assert_eq!(wb_max_pause(1_000, 15_000, 1000), 9);
    }

    /// The minimum pause for one writer at bandwidth: a 10 ms target gives 150 pages per check
    /// at 15,000 pages/s, rounded through the power-of-two HZ.
    #[test]
    fn min_pause_by_hand() {
        let (min_pause, pages) = wb_min_pause(200, 15_000, 15_000, 15_000, 1000);
        // t = 10; pages = 15000 * 10 / 1024 = 146 >= 32 so min_pause = 1 + 10/2 = 6.
        assert_eq!((min_pause, pages), (6, 146));
        // Sixteen writers (N = 16): t = 10 + 4 * 10000/1024 = 49; pages = 937*49/1024 = 44.
        let (min_pause, pages) = wb_min_pause(200, 15_000, 937, 937, 1000);
        assert_eq!((min_pause, pages), (1 + 49 / 2, 44));
    }
}
