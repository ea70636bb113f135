//! Write-bandwidth and dirty-ratelimit estimation for one backend
//! (docs/mechanisms.md#bandwidth-and-ratelimit-estimation).
//!
//! # Goal
//! Know how fast the backend completes writes (`write_bandwidth`, smoothed into
//! `avg_write_bandwidth`), and find the base rate `dirty_ratelimit` that, given to each of the
//! N writers at position ratio 1, makes their combined dirtying rate equal the write bandwidth:
//! `dirty_ratelimit -> write_bw / N`.
//!
//! # Signals
//! Pages completed (`written`) and pages dirtied (`dirtied`) against this backend since the
//! last update, and the elapsed time. Updates come from a throttle check (bandwidth and
//! ratelimit) or the start of a writepages call (bandwidth only) once 200 ms
//! (`BANDWIDTH_INTERVAL`) have passed since the last one, and from the delayed update 200 ms
//! after a file's writeback ends (bandwidth only; the kernel's `wb_inode_writeback_end`,
//! docs/mechanisms.md#bandwidth-and-ratelimit-estimation). ebb's own: while an `ioless`
//! writer was throttled past freerun within 200 ms, the bandwidth-only updates hold off (the
//! delayed one looks again 200 ms later), so they do not restart the interval under the
//! throttled writers' ratelimit updates (`Engine::writers_update_rates`); the kernel runs them
//! regardless, and its delayed one however long since the last update.
//!
//! # Control law
//! ```text
//! bandwidth:  period = roundup_pow_of_two(3 * HZ)
//!             bw = (written_delta * HZ + write_bw * (period - elapsed)) / period
//!             (restart from the sample alone when elapsed > period)
//!             avg moves 1/8 toward the old bw only when the new sample confirms the direction
//! ratelimit:  dirty_rate = dirtied_delta * HZ / elapsed
//!             task_rate  = dirty_ratelimit * pos_ratio + 1
//!             balanced   = min(task_rate * write_bw / dirty_rate, write_bw)
//!             dirty_ratelimit moves toward balanced only when the position error and the rate
//!             error agree, by at most 1/8 of the gap, less when the gap is small
//! ```
//! Using `task_rate` (rate times position ratio) rather than the bare rate removes the spurious
//! fixed point where a position ratio away from 1 exactly compensates a wrong rate.
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | INIT_BW | 100 MB/s = 25600 | pages/s | kernel `wb_init` (`initial_write_bandwidth = kernel`) |
//! | BANDWIDTH_INTERVAL | 200 | ms | kernel, `max(HZ/5, 1)` |
//! | averaging period | roundup_pow_of_two(3 HZ) | jiffies | kernel |
//! | avg filter step | 1/8 | - | kernel `wb_update_write_bandwidth` |
//! | ratelimit step | at most 1/8 of the gap | - | kernel `wb_update_dirty_ratelimit` |
//!
//! # Insufficient data
//! Before the first sample every rate (bandwidth, its average, the ratelimit and the balanced
//! rate) is the start `initial_write_bandwidth` chooses (ebb's own knob): `kernel`, the default,
//! is the kernel's `INIT_BW`; a rate starts there; `auto` starts at the speed the backend's
//! driver declares (`BackendConfig::declared_write_bandwidth`: the simulator's device model,
//! a runtime backend's `write_bandwidth`) and at `INIT_BW` when none is declared. The laws
//! above are the same from any start; a start near the device's rate only removes the seconds
//! of convergence from 100 MB/s. An update with `elapsed > period` (long
//! idle) restarts the estimate from the new sample. A zero dirty rate is treated as 1 page/s.
//!
//! # Stability
//! The bandwidth blends ~3 s of samples; the average ignores isolated spikes. The ratelimit
//! takes only steps both signals agree on and shrinks the step sharply once the gap is small
//! relative to the rate, trading exact matching for no jitter.
//!
//! # Observability
//! `bdi_dirty_ratelimit` trace lines (write_bw, avg_write_bw, dirty_rate, dirty_ratelimit,
//! task_ratelimit, balanced_dirty_ratelimit, in KB/s).

use crate::limits::roundup_pow_of_two;
use crate::time::Duration;

/// 100 MB/s in 4 KiB pages per second.
pub const INIT_BW: u64 = 25_600;
/// Fixed-point shift of position ratios: 1.0 is 1024.
pub(crate) const RATELIMIT_CALC_SHIFT: u32 = 10;
/// The least time between two bandwidth estimates, and the delay of the update armed when a
/// file's writeback ends (the kernel's `BANDWIDTH_INTERVAL`, `max(HZ / 5, 1)` jiffies).
pub(crate) const BANDWIDTH_INTERVAL: Duration = Duration::from_millis(200);

/// [`BANDWIDTH_INTERVAL`] in ticks of a `hz` clock, at least one (`HZ / 5` exactly).
pub(crate) fn bandwidth_interval_jiffies(hz: u64) -> u64 {
    BANDWIDTH_INTERVAL.jiffies(hz).max(1)
}

/// The estimator state of one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rates {
    /// Jiffies of the last update.
    pub bw_time_stamp: u64,
    /// Completed pages at the last update.
    pub written_stamp: u64,
    /// Dirtied pages at the last update.
    pub dirtied_stamp: u64,
    /// Estimated write bandwidth, pages/s.
    pub write_bandwidth: u64,
    /// Smoothed write bandwidth, pages/s, always >= 1.
    pub avg_write_bandwidth: u64,
    /// Base dirtying rate per writer at position ratio 1, pages/s, >= 1.
    pub dirty_ratelimit: u64,
    /// Last balanced-rate estimate, pages/s.
    pub balanced_dirty_ratelimit: u64,
    /// Last measured dirty rate, pages/s (for traces).
    pub dirty_rate: u64,
}

impl Rates {
    /// Initial estimates at `now_jiffies`.
    pub(crate) fn new(now_jiffies: u64) -> Rates {
        Rates {
            bw_time_stamp: now_jiffies,
            written_stamp: 0,
            dirtied_stamp: 0,
            write_bandwidth: INIT_BW,
            avg_write_bandwidth: INIT_BW,
            dirty_ratelimit: INIT_BW,
            balanced_dirty_ratelimit: INIT_BW,
            dirty_rate: 0,
        }
    }

    /// Starts every estimate at `pages_per_sec` instead of the kernel's 100 MB/s (a known
    /// device; see `BackendConfig::initial_write_bandwidth`).
    pub(crate) fn seed(&mut self, pages_per_sec: u64) {
        let bw = pages_per_sec.max(1);
        self.write_bandwidth = bw;
        self.avg_write_bandwidth = bw;
        self.dirty_ratelimit = bw;
        self.balanced_dirty_ratelimit = bw;
    }

    /// Resets the stamps without producing a sample (the kernel's
    /// `wb_bandwidth_estimate_start` after more than 1 s of idleness), so idle time does not
    /// count as zero bandwidth.
    pub(crate) fn restart(&mut self, now_jiffies: u64, written: u64, dirtied: u64) {
        self.bw_time_stamp = now_jiffies;
        self.written_stamp = written;
        self.dirtied_stamp = dirtied;
    }

    /// Folds a new bandwidth sample in (kernel `wb_update_write_bandwidth`).
    pub(crate) fn update_write_bandwidth(&mut self, elapsed: u64, written: u64, hz: u64) {
        let period = roundup_pow_of_two(3 * hz);
        let elapsed = elapsed.max(1);
        let inst = u128::from(written.saturating_sub(self.written_stamp)) * u128::from(hz);
        let mut avg = self.avg_write_bandwidth;
        let old = self.write_bandwidth;
        let bw;
        if elapsed > period {
            bw = (inst / u128::from(elapsed)) as u64;
            avg = bw;
        } else {
            bw = ((inst + u128::from(old) * u128::from(period - elapsed)) / u128::from(period))
                as u64;
            if avg > old && old >= bw {
                avg -= (avg - old) >> 3;
            }
            if avg < old && old <= bw {
                avg += (old - avg) >> 3;
            }
        }
        self.write_bandwidth = bw;
        self.avg_write_bandwidth = avg.max(1);
    }

    /// Updates `dirty_ratelimit` (kernel `wb_update_dirty_ratelimit`). `pos_ratio` is in
    /// 1/1024; `dirty_cmp`/`setpoint_cmp` are the dirty count and setpoint the direction
    /// filter compares (global ones, or the backend's own under strictlimit). Uses the previous
    /// `write_bandwidth`, so call it before [`Rates::update_write_bandwidth`].
    pub(crate) fn update_dirty_ratelimit(
        &mut self,
        elapsed: u64,
        dirtied: u64,
        pos_ratio: u64,
        dirty_cmp: u64,
        setpoint_cmp: u64,
        hz: u64,
    ) {
        let elapsed = elapsed.max(1);
        let write_bw = self.avg_write_bandwidth;
        let dirty_rate = (u128::from(dirtied.saturating_sub(self.dirtied_stamp)) * u128::from(hz)
            / u128::from(elapsed)) as u64;
        self.dirty_rate = dirty_rate;
        let dirty_ratelimit = self.dirty_ratelimit;
        let task_ratelimit = ((u128::from(dirty_ratelimit) * u128::from(pos_ratio))
            >> RATELIMIT_CALC_SHIFT) as u64
            + 1;
        let mut balanced =
            (u128::from(task_ratelimit) * u128::from(write_bw) / u128::from(dirty_rate | 1)) as u64;
        balanced = balanced.min(write_bw);

        let prev_balanced = self.balanced_dirty_ratelimit;
        let mut step = 0u64;
        if dirty_cmp < setpoint_cmp {
            let x = prev_balanced.min(balanced).min(task_ratelimit);
            if dirty_ratelimit < x {
                step = x - dirty_ratelimit;
            }
        } else {
            let x = prev_balanced.max(balanced).max(task_ratelimit);
            if dirty_ratelimit > x {
                step = dirty_ratelimit - x;
            }
        }
        let shift = dirty_ratelimit / (2 * step + 1);
        step = if shift < 64 { (step >> shift).div_ceil(8) } else { 0 };
        let mut rate = if dirty_ratelimit < balanced {
            dirty_ratelimit + step
        } else {
            dirty_ratelimit.saturating_sub(step)
        };
        rate = rate.max(1);
        self.dirty_ratelimit = rate;
        self.balanced_dirty_ratelimit = balanced;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HZ: u64 = 1000;

    /// A constant completion rate of 15,000 pages/s (~60 MB/s) drives the estimate there from
    /// the 100 MB/s initial value within a few seconds of 200 ms samples.
    #[test]
    fn bandwidth_converges_to_a_constant_rate() {
        let mut r = Rates::new(0);
        let mut written = 0;
        for _ in 0..100 {
            written += 3_000; // 15,000 pages/s over 200 ms
            r.update_write_bandwidth(200, written, HZ);
            r.written_stamp = written;
        }
        assert!(r.write_bandwidth.abs_diff(15_000) < 150, "bw {}", r.write_bandwidth);
        assert!(r.avg_write_bandwidth.abs_diff(15_000) < 1_500, "avg {}", r.avg_write_bandwidth);
    }

    /// After a long idle gap the estimate restarts from the new sample alone.
    #[test]
    fn long_gap_restarts_the_estimate() {
        let mut r = Rates::new(0);
        r.update_write_bandwidth(10_000, 50_000, HZ);
        assert_eq!(r.write_bandwidth, 5_000);
        assert_eq!(r.avg_write_bandwidth, 5_000);
    }

    /// One sample of the blend, by hand: elapsed 200 of a 4096-jiffy period.
    #[test]
    fn bandwidth_blend_by_hand() {
        let mut r = Rates::new(0);
        r.update_write_bandwidth(200, 3_000, HZ);
        // (3000 * 1000 + 25600 * 3896) / 4096 = (3_000_000 + 99_737_600) / 4096 = 25082.
        assert_eq!(r.write_bandwidth, 25_082);
    }

    /// Closed loop: two equal writers, a device completing 10,000 pages/s, dirty pages
    /// integrating the rate error and the cubic setting the position ratio. The base rate
    /// converges to write_bw / 2 and the dirty count stays near the setpoint.
    #[test]
    fn ratelimit_converges_to_bw_over_writers() {
        use crate::position::pos_ratio_polynom;
        let (setpoint, limit) = (150_000u64, 200_000u64);
        let mut r = Rates::new(0);
        r.write_bandwidth = 10_000;
        r.avg_write_bandwidth = 10_000;
        let (mut dirty, mut dirtied) = (120_000i64, 0u64);
        for _ in 0..1_500 {
            let pos = pos_ratio_polynom(setpoint, dirty as u64, limit);
            let task_rate = r.dirty_ratelimit * pos / 1024;
            let step_dirtied = 2 * task_rate / 5; // two writers, 200 ms
            dirtied += step_dirtied;
            dirty = (dirty + step_dirtied as i64 - 2_000).max(0);
            r.update_dirty_ratelimit(200, dirtied, pos, dirty as u64, setpoint, HZ);
            r.dirtied_stamp = dirtied;
        }
        assert!(r.dirty_ratelimit.abs_diff(5_000) < 500, "ratelimit {}", r.dirty_ratelimit);
        // The step filter gives up exact matching; the flat cubic absorbs the remaining rate
        // error with a position offset, which stays within half the setpoint-limit span.
        let half_span = (limit - setpoint) as i64 / 2;
        assert!((dirty - setpoint as i64).abs() < half_span, "dirty {dirty}");
    }

    /// The ratelimit never moves against the position error.
    #[test]
    fn ratelimit_moves_only_when_signals_agree() {
        let mut r = Rates::new(0);
        r.avg_write_bandwidth = 10_000;
        r.dirty_ratelimit = 5_000;
        r.balanced_dirty_ratelimit = 5_000;
        // Dirtying slower than bandwidth suggests raising the rate, but dirty is above the
        // setpoint: only decreases are allowed, so nothing moves.
        r.update_dirty_ratelimit(200, 200, 1024, 10, 5, HZ);
        assert_eq!(r.dirty_ratelimit, 5_000);
    }
}
