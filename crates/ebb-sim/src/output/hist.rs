//! Latency and pause statistics, turned into the metric names of `summary.json`.
//!
//! Read latencies are many (millions per run) and only their distribution matters, so they go
//! into an HDR histogram: constant memory, 3.5 ns per record, and every value reported within
//! 0.1% (3 significant digits) across the range 1 ns to 60 s. Throttle pauses are few (one per
//! throttled write burst) and their spread is itself a published result (Wu 2010: pause
//! standard deviation against the mean), so [`SampleStats`] keeps every sample and gives exact
//! figures.
//!
//! Both use the nearest-rank definition of a percentile: the smallest recorded value such that
//! at least p% of the samples are less than or equal to it. The rank is computed with a small
//! tolerance because `99.9 / 100.0` is `0.9990000000000001` in binary floating point, which
//! would otherwise move p99.9 of 1000 samples from the 999th to the 1000th value.

use hdrhistogram::Histogram;

/// Lowest value the histogram distinguishes, in nanoseconds.
const VALUE_NS_MIN: u64 = 1;
/// Highest value the histogram tracks, in nanoseconds (60 s); larger values are recorded as
/// this.
const VALUE_NS_MAX: u64 = 60_000_000_000;
/// Significant decimal digits kept for every value.
const SIGNIFICANT_DIGITS: u8 = 3;

/// The standard percentiles of a latency metric: suffix of the metric name and percentile.
const STANDARD_PERCENTILES: [(&str, f64); 6] = [
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p99_9", 99.9),
    ("p99_99", 99.99),
    ("p99_9999", 99.9999),
];

/// A distribution of latencies recorded in nanoseconds and reported in microseconds.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    histogram: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram covering 1 ns to 60 s at 3 significant digits.
    pub fn new() -> LatencyHistogram {
        let histogram = Histogram::new_with_bounds(VALUE_NS_MIN, VALUE_NS_MAX, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        LatencyHistogram { histogram }
    }

    /// Records one latency. Values above 60 s are recorded as 60 s; 0 is recorded as 0.
    pub fn record(&mut self, latency_ns: u64) {
        self.histogram.saturating_record(latency_ns);
    }

    /// The distribution as (latency in microseconds, fraction of samples at most that), one
    /// point per distinct recorded value, thinned evenly to at most `points_max` (the last
    /// point, fraction 1, always kept); empty when nothing was recorded.
    pub fn cdf_us(&self, points_max: usize) -> Vec<(f64, f64)> {
        let total = self.histogram.len();
        if total == 0 {
            return Vec::new();
        }
        let mut seen = 0u64;
        let all: Vec<(f64, f64)> = self
            .histogram
            .iter_recorded()
            .map(|step| {
                seen += step.count_at_value();
                let value_us =
                    self.histogram.highest_equivalent(step.value_iterated_to()) as f64 / 1e3;
                (value_us, seen as f64 / total as f64)
            })
            .collect();
        let stride = all.len().div_ceil(points_max.max(1));
        let mut thinned: Vec<(f64, f64)> = all.iter().copied().step_by(stride.max(1)).collect();
        if thinned.last() != all.last() {
            thinned.extend(all.last());
        }
        thinned
    }

    /// Adds every sample of `other` to this histogram (e.g. per-reader histograms into one).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms with identical bounds always merge");
    }

    /// Number of recorded samples.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// Whether nothing was recorded; every statistic of an empty histogram is 0.
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The nearest-rank `percentile` (0 to 100, e.g. 99.9) in microseconds; within 0.1% of
    /// the exact sample value. 0 for an empty histogram.
    pub fn percentile_us(&self, percentile: f64) -> f64 {
        assert!((0.0..=100.0).contains(&percentile), "percentile {percentile} not in 0..=100");
        if self.is_empty() {
            return 0.0;
        }
        let rank = nearest_rank(percentile, self.count());
        // Ask for a quantile half a sample below the rank, so the histogram's own
        // `ceil(quantile * count)` lands on `rank` whatever the rounding.
        let quantile = (rank as f64 - 0.5) / self.count() as f64;
        ns_to_us(self.histogram.value_at_quantile(quantile))
    }

    /// The largest recorded latency in microseconds (within 0.1%); 0 when empty.
    pub fn max_us(&self) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        ns_to_us(self.histogram.max())
    }

    /// The mean latency in microseconds (from bucket midpoints); 0 when empty.
    pub fn mean_us(&self) -> f64 {
        self.histogram.mean() / 1000.0
    }

    /// The standard set of latency metrics, named `<prefix>_p50`, `_p90`, `_p99`, `_p99_9`,
    /// `_p99_99`, `_p99_9999` and `_max`, in that order, in microseconds.
    ///
    /// With `prefix = "read_lat_us"` these are the `read_lat_us_*` metrics of the product
    /// brief, ready for `metrics.extend(histogram.percentiles_us("read_lat_us"))`.
    pub fn percentiles_us(&self, prefix: &str) -> Vec<(String, f64)> {
        let mut metrics: Vec<(String, f64)> = STANDARD_PERCENTILES
            .iter()
            .map(|&(suffix, percentile)| {
                (format!("{prefix}_{suffix}"), self.percentile_us(percentile))
            })
            .collect();
        metrics.push((format!("{prefix}_max"), self.max_us()));
        metrics
    }
}

/// Exact statistics of a modest number of samples (pause times, per-writer rates).
#[derive(Clone, Debug, PartialEq)]
pub struct SampleStats {
    /// The samples in ascending order.
    sorted: Vec<f64>,
    mean: f64,
    stddev: f64,
}

impl SampleStats {
    /// Sorts `samples` and computes their statistics. Panics if a sample is NaN or infinite,
    /// because statistics of such samples are meaningless and the caller computed them.
    pub fn new(mut samples: Vec<f64>) -> SampleStats {
        for (index, sample) in samples.iter().enumerate() {
            assert!(sample.is_finite(), "sample {index} is {sample}");
        }
        samples.sort_by(f64::total_cmp);
        let count = samples.len() as f64;
        let (mean, stddev) = if samples.is_empty() {
            (0.0, 0.0)
        } else {
            let mean = samples.iter().sum::<f64>() / count;
            let variance = samples.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / count;
            (mean, variance.sqrt())
        };
        SampleStats { sorted: samples, mean, stddev }
    }

    /// Number of samples.
    pub fn count(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are no samples; every statistic is then 0.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// Arithmetic mean.
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// Population standard deviation (divides by the count, not count - 1): the spread of
    /// exactly these pauses, not an estimate for a larger population.
    pub fn stddev(&self) -> f64 {
        self.stddev
    }

    /// Smallest sample.
    pub fn min(&self) -> f64 {
        self.sorted.first().copied().unwrap_or(0.0)
    }

    /// Largest sample.
    pub fn max(&self) -> f64 {
        self.sorted.last().copied().unwrap_or(0.0)
    }

    /// The exact nearest-rank `percentile` (0 to 100): always one of the samples.
    pub fn percentile(&self, percentile: f64) -> f64 {
        assert!((0.0..=100.0).contains(&percentile), "percentile {percentile} not in 0..=100");
        if self.is_empty() {
            return 0.0;
        }
        let rank = nearest_rank(percentile, self.sorted.len() as u64);
        self.sorted[usize::try_from(rank - 1).expect("rank fits the sample count")]
    }

    /// The samples in ascending order.
    pub fn sorted(&self) -> &[f64] {
        &self.sorted
    }

    /// Metrics named `<prefix>_p50`, `_p90`, `_p99`, `_max`, `_min`, `_mean`, `_stddev`, in
    /// the unit of the samples. With `prefix = "pause_ms"` and samples in milliseconds these
    /// are the `pause_ms_*` metrics of the product brief (`pause_count` is [`Self::count`]).
    pub fn metrics(&self, prefix: &str) -> Vec<(String, f64)> {
        vec![
            (format!("{prefix}_p50"), self.percentile(50.0)),
            (format!("{prefix}_p90"), self.percentile(90.0)),
            (format!("{prefix}_p99"), self.percentile(99.0)),
            (format!("{prefix}_max"), self.max()),
            (format!("{prefix}_min"), self.min()),
            (format!("{prefix}_mean"), self.mean()),
            (format!("{prefix}_stddev"), self.stddev()),
        ]
    }
}

/// The 1-based nearest rank of `percentile` among `count` samples: `ceil(p / 100 * count)`,
/// at least 1, where a product within a billionth of an integer counts as that integer.
fn nearest_rank(percentile: f64, count: u64) -> u64 {
    assert!(count > 0);
    let exact = percentile / 100.0 * count as f64;
    let nearest = exact.round();
    let rank =
        if (exact - nearest).abs() <= 1e-9 * exact.max(1.0) { nearest } else { exact.ceil() };
    // The float-to-int cast saturates; rank is in 0..=count by construction.
    (rank as u64).clamp(1, count)
}

fn ns_to_us(value_ns: u64) -> f64 {
    value_ns as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `actual` is within the histogram's 0.1% resolution of `expected`.
    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.001 + 1e-9
    }

    #[test]
    fn cdf_rises_to_one_through_the_recorded_values() {
        // Goal: the distribution's points are increasing, end at fraction 1 at the maximum,
        // and match the percentiles (half the samples at most 500 us).
        let mut histogram = LatencyHistogram::new();
        for us in 1..=1000u64 {
            histogram.record(us * 1000);
        }
        let cdf = histogram.cdf_us(100);
        assert!(cdf.len() <= 101, "{}", cdf.len());
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert_eq!(cdf.last().map(|p| p.1), Some(1.0));
        let half = cdf.iter().find(|(_, fraction)| *fraction >= 0.5).expect("median");
        assert!((half.0 - 500.0).abs() < 15.0, "{half:?}");
        assert!(LatencyHistogram::new().cdf_us(10).is_empty());
    }

    #[test]
    fn histogram_percentiles_of_1_to_1000_us() {
        // Goal: with 1..=1000 µs recorded once each, every standard percentile is the
        // nearest-rank sample, including p99.9 where naive float math is off by one sample.
        let mut histogram = LatencyHistogram::new();
        for us in 1..=1000u64 {
            histogram.record(us * 1000);
        }
        assert_eq!(histogram.count(), 1000);
        let expected = [
            ("lat_us_p50", 500.0),
            ("lat_us_p90", 900.0),
            ("lat_us_p99", 990.0),
            ("lat_us_p99_9", 999.0),
            ("lat_us_p99_99", 1000.0),
            ("lat_us_p99_9999", 1000.0),
            ("lat_us_max", 1000.0),
        ];
        let metrics = histogram.percentiles_us("lat_us");
        assert_eq!(metrics.len(), expected.len());
        for ((name, value), (expected_name, expected_value)) in metrics.iter().zip(expected) {
            assert_eq!(name, expected_name);
            assert!(close(*value, expected_value), "{name} = {value}, want {expected_value}");
        }
        assert!(close(histogram.mean_us(), 500.5), "mean {}", histogram.mean_us());
    }

    #[test]
    fn histogram_names_match_the_product_brief() {
        // Goal: the read latency keys are exactly the ones summary.json consumers look up.
        let names: Vec<String> = LatencyHistogram::new()
            .percentiles_us("read_lat_us")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            [
                "read_lat_us_p50",
                "read_lat_us_p90",
                "read_lat_us_p99",
                "read_lat_us_p99_9",
                "read_lat_us_p99_99",
                "read_lat_us_p99_9999",
                "read_lat_us_max"
            ]
        );
    }

    #[test]
    fn histogram_tail_and_merge() {
        // Goal: a rare long latency shows in the far tail only, survives a merge, and values
        // above 60 s saturate instead of being lost.
        let mut fast = LatencyHistogram::new();
        for _ in 0..9_999 {
            fast.record(100_000); // 100 µs
        }
        let mut slow = LatencyHistogram::new();
        slow.record(358_000_000); // 358 ms, Axboe's "before" maximum
        fast.merge(&slow);
        assert_eq!(fast.count(), 10_000);
        assert!(close(fast.percentile_us(99.99), 100.0));
        assert!(close(fast.percentile_us(99.9999), 358_000.0));
        assert!(close(fast.max_us(), 358_000.0));
        let mut huge = LatencyHistogram::new();
        huge.record(u64::MAX);
        assert!(close(huge.max_us(), 60_000_000.0), "{}", huge.max_us());
    }

    #[test]
    fn empty_histogram_reports_zero() {
        // Goal: an empty histogram gives zeros instead of the crate's undefined maximum.
        let histogram = LatencyHistogram::new();
        assert!(histogram.is_empty());
        assert_eq!(histogram.percentile_us(99.0), 0.0);
        assert_eq!(histogram.max_us(), 0.0);
        assert_eq!(histogram.mean_us(), 0.0);
    }

    #[test]
    fn sample_stats_exact_values() {
        // Goal: mean, population stddev, min, max and nearest-rank percentiles of a known set,
        // given unsorted.
        let stats = SampleStats::new(vec![4.0, 2.0, 9.0, 5.0, 4.0, 7.0, 4.0, 5.0]);
        assert_eq!(stats.count(), 8);
        assert_eq!(stats.mean(), 5.0);
        assert_eq!(stats.stddev(), 2.0);
        assert_eq!(stats.min(), 2.0);
        assert_eq!(stats.max(), 9.0);
        assert_eq!(stats.sorted(), [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(stats.percentile(0.0), 2.0);
        assert_eq!(stats.percentile(50.0), 4.0); // rank 4
        assert_eq!(stats.percentile(62.5), 5.0); // rank 5 exactly
        assert_eq!(stats.percentile(90.0), 9.0); // rank ceil(7.2) = 8
        assert_eq!(stats.percentile(100.0), 9.0);
        let metrics = stats.metrics("pause_ms");
        assert_eq!(metrics[0], ("pause_ms_p50".to_owned(), 4.0));
        assert_eq!(metrics[6], ("pause_ms_stddev".to_owned(), 2.0));
    }

    #[test]
    fn sample_stats_rank_survives_float_noise() {
        // Goal: p99.9 of 1..=1000 is 999, not 1000 (0.999 is not exact in binary).
        let stats = SampleStats::new((1..=1000).map(f64::from).collect());
        assert_eq!(stats.percentile(99.9), 999.0);
        assert_eq!(stats.percentile(99.99), 1000.0);
        assert_eq!(stats.percentile(99.0), 990.0);
        let empty = SampleStats::new(Vec::new());
        assert_eq!((empty.mean(), empty.max(), empty.percentile(50.0)), (0.0, 0.0, 0.0));
    }
}
