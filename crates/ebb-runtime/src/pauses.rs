//! The writers' throttle pauses over the whole cache: how long `balance_dirty_pages` made them
//! sleep, as percentiles since the start, over the last seconds, and as cumulative buckets (the
//! Prometheus histogram `ebb_balance_dirty_pages_pause_seconds`).
//!
//! The engine decides each pause ([`ebb_core::WriterNext::Sleep`]); the runtime sleeps it and
//! records it here, once per pause (a writer about to sleep, never the per-page path). The
//! memory is fixed: two histograms of 2 significant digits (1 µs to an hour) for the whole run
//! and for each of the last two windows, and one counter per bucket bound.
//!
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | `WINDOW` | 5 | s | the "last seconds" are the current window and the one before it (5 to 10 s) |
//! | `BUCKETS_US` | 0.5 ms to 5 s | µs | spans the kernel's pauses: up to `MAX_PAUSE` (200 ms), more for a writer that waits out a stalled backend |
//!
//! With no pause yet, every figure is 0.

use hdrhistogram::Histogram;
use serde::Serialize;

/// How long one window of recent pauses lasts.
pub(crate) const WINDOW: std::time::Duration = std::time::Duration::from_secs(5);

/// Upper bounds of the cumulative buckets, microseconds (the last bucket, `+Inf`, is the count).
pub const BUCKETS_US: [u64; 11] =
    [500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 1_000_000, 5_000_000];

/// The pauses of every writer of the cache, microseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PauseStats {
    /// Pauses taken since the cache started.
    pub count: u64,
    /// Their total, microseconds.
    pub sum_us: u64,
    /// Percentiles since the start: 50, 90, 99, 99.9, and the longest pause.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p99_9_us: u64,
    /// The longest pause.
    pub max_us: u64,
    /// The pauses of the last seconds only (what a live view shows).
    pub recent: RecentPauses,
    /// Pauses no longer than each bound of [`BUCKETS_US`], in its order (cumulative).
    pub buckets: Vec<u64>,
}

/// The pauses of the last `window_ms`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecentPauses {
    /// The span these figures cover, milliseconds (5 to 10 s).
    pub window_ms: u64,
    /// Pauses in it.
    pub count: u64,
    /// Median, microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// The longest.
    pub max_us: u64,
}

/// Records pauses (see the module doc).
pub(crate) struct Pauses {
    all: Histogram<u64>,
    sum_us: u64,
    buckets: [u64; BUCKETS_US.len()],
    /// The window being filled and the one before it.
    current: Histogram<u64>,
    previous: Histogram<u64>,
    /// When `current` began.
    current_start: std::time::Instant,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("valid bounds")
}

fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() { 0 } else { h.value_at_quantile(q) }
}

impl Pauses {
    pub(crate) fn new(now: std::time::Instant) -> Pauses {
        Pauses {
            all: histogram(),
            sum_us: 0,
            buckets: [0; BUCKETS_US.len()],
            current: histogram(),
            previous: histogram(),
            current_start: now,
        }
    }

    /// Moves the windows on to `now`.
    fn rotate(&mut self, now: std::time::Instant) {
        let age = now.saturating_duration_since(self.current_start);
        if age < WINDOW {
            return;
        }
        if age < 2 * WINDOW {
            std::mem::swap(&mut self.previous, &mut self.current);
        } else {
            self.previous.reset();
        }
        self.current.reset();
        // Windows stay aligned to the start, so the span reported stays within 5 to 10 s.
        let windows = (age.as_nanos() / WINDOW.as_nanos()) as u32;
        self.current_start += WINDOW * windows;
    }

    /// Records one pause of `us` microseconds, taken at `now`.
    pub(crate) fn record(&mut self, now: std::time::Instant, us: u64) {
        self.rotate(now);
        let us = us.max(1);
        let _ = self.all.record(us);
        let _ = self.current.record(us);
        self.sum_us = self.sum_us.saturating_add(us);
        for (count, bound) in self.buckets.iter_mut().zip(BUCKETS_US) {
            if us <= bound {
                *count += 1;
            }
        }
    }

    /// The figures as of `now`.
    pub(crate) fn stats(&mut self, now: std::time::Instant) -> PauseStats {
        self.rotate(now);
        let mut recent = self.previous.clone();
        let _ = recent.add(&self.current);
        let window = now.saturating_duration_since(self.current_start) + WINDOW;
        PauseStats {
            count: self.all.len(),
            sum_us: self.sum_us,
            p50_us: quantile(&self.all, 0.5),
            p90_us: quantile(&self.all, 0.9),
            p99_us: quantile(&self.all, 0.99),
            p99_9_us: quantile(&self.all, 0.999),
            max_us: if self.all.is_empty() { 0 } else { self.all.max() },
            recent: RecentPauses {
                window_ms: window.as_millis() as u64,
                count: recent.len(),
                p50_us: quantile(&recent, 0.5),
                p99_us: quantile(&recent, 0.99),
                max_us: if recent.is_empty() { 0 } else { recent.max() },
            },
            buckets: self.buckets.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Percentiles, buckets and the recent window a user reads: a burst of long pauses shows in
    /// the recent figures while it lasts and leaves them once it is 10 s old, but stays in the
    /// figures since the start.
    #[test]
    fn recent_pauses_forget_old_ones_and_the_totals_keep_them() {
        let t0 = Instant::now();
        let mut p = Pauses::new(t0);
        for _ in 0..99 {
            p.record(t0, 1_000);
        }
        p.record(t0, 150_000);
        let s = p.stats(t0 + Duration::from_secs(1));
        assert_eq!((s.count, s.sum_us), (100, 99 * 1_000 + 150_000));
        // Percentiles are within the histograms' 1%.
        assert!((1_000..=1_010).contains(&s.p50_us), "{s:?}");
        assert!((150_000..=151_500).contains(&s.max_us), "{s:?}");
        assert_eq!(s.recent.count, 100);
        // 500 µs holds none, 1 ms all but the long one, 200 ms all.
        assert_eq!(s.buckets[0], 0);
        assert_eq!(s.buckets[1], 99);
        assert_eq!(s.buckets[8], 100);
        // 7 s later the burst is in the previous window, still recent.
        p.record(t0 + Duration::from_secs(7), 2_000);
        let s = p.stats(t0 + Duration::from_secs(7));
        assert_eq!(s.recent.count, 101);
        assert!((7_000..=7_001).contains(&s.recent.window_ms), "{s:?}");
        // 12 s later only the 2 ms pause is recent; the totals keep all.
        let s = p.stats(t0 + Duration::from_secs(12));
        assert_eq!(s.recent.count, 1);
        assert!((2_000..=2_020).contains(&s.recent.max_us), "{s:?}");
        assert_eq!(s.count, 101);
        // Long after, nothing is recent.
        let s = p.stats(t0 + Duration::from_secs(60));
        assert_eq!(s.recent, RecentPauses { window_ms: 5_000, ..RecentPauses::default() });
    }
}
