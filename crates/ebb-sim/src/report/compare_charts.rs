//! Charts that put the variants of one case side by side, and the verdicts of one experiment:
//!
//! - the read-latency distribution of each variant on a log latency axis, with the posting's
//!   percentile points (`[[reference]]`) in the same color. The y axis counts *nines*
//!   (`-log10(1 - fraction)`: 1 is p90, 2 is p99, 3 is p99.9, 4 is p99.99), so the tail, where
//!   writeback shows, takes as much room as the body;
//! - the distribution of throttle pauses of each variant (share of pauses per bin, bins a
//!   quarter decade wide on a log axis; a zero pause is counted in the lowest bin, 0.1 ms);
//! - the verdict chart: each compared published number of the experiment at its distance from
//!   the posting's, in tolerances (0: equal; 1: at the edge of the tolerance; a factor
//!   tolerance is measured in log ratio; outside a range, 1 plus the log2 ratio to its nearest
//!   bound), colored by verdict, clamped to +-4.

use crate::experiment::verdict::{PublishedValue, Tolerance};
use crate::experiment::{PublishedOutcome, Reference, Verdict};
use crate::report::plot::{Chart, Series, SeriesKind};
use crate::run::RunResult;

/// The lowest pause bin, in milliseconds; zero pauses are counted in it.
const PAUSE_BIN_MS_MIN: f64 = 0.1;
/// Bins per decade of the pause distribution.
const PAUSE_BINS_PER_DECADE: f64 = 4.0;
/// Nines drawn at most (a fraction of 1 is drawn at this height).
const NINES_MAX: f64 = 6.0;
/// Distances beyond this many tolerances are drawn at it.
const DISTANCE_MAX: f64 = 4.0;
/// The verdict chart's markers, in pixels of its 640 x 340 image: one per row, shown at about
/// 570 px wide in the page's two columns, so each must read at a glance.
const VERDICT_POINT_RADIUS_PX: i32 = 6;

/// `-log10(1 - fraction)`, at most [`NINES_MAX`].
fn nines(fraction: f64) -> f64 {
    (-(1.0 - fraction).max(10f64.powf(-NINES_MAX)).log10()).min(NINES_MAX)
}

/// The read-latency distributions of `runs` (variant label, result) with `references` drawn
/// as points; `None` when no run read anything.
pub fn latency_cdf_chart(
    case: &str,
    runs: &[(&str, &RunResult)],
    references: &[&Reference],
) -> Option<Chart> {
    let mut series = Vec::new();
    for (index, (variant, result)) in runs.iter().enumerate() {
        if result.read_latency_cdf.is_empty() {
            continue;
        }
        let points = result.read_latency_cdf.iter().map(|&(us, f)| (us, nines(f))).collect();
        series.push(Series {
            name: (*variant).to_owned(),
            points,
            kind: SeriesKind::Line,
            color: Some(index),
        });
        for reference in references.iter().filter(|r| r.run.ends_with(&format!("/{variant}"))) {
            let points =
                reference.read_latency_us.iter().map(|&(p, us)| (us, nines(p / 100.0))).collect();
            series.push(Series {
                name: reference.label.clone(),
                points,
                kind: SeriesKind::Points,
                color: Some(index),
            });
        }
    }
    if series.is_empty() {
        return None;
    }
    let mut chart = Chart::new(
        &format!("{case}: read latency distribution (points: the posting)"),
        "read latency (us, log)",
        "nines: 1 = p90, 2 = p99, 3 = p99.9, 4 = p99.99",
        series,
    );
    chart.x_log = true;
    chart.y_max = Some(NINES_MAX);
    Some(chart)
}

/// The pause distributions of `runs`; `None` unless at least two runs paused.
pub fn pause_histogram_chart(case: &str, runs: &[(&str, &RunResult)]) -> Option<Chart> {
    let paused: Vec<_> = runs.iter().filter(|(_, result)| !result.pauses.is_empty()).collect();
    if paused.len() < 2 {
        return None;
    }
    let bin = |ms: f64| {
        ((ms.max(PAUSE_BIN_MS_MIN) / PAUSE_BIN_MS_MIN).log10() * PAUSE_BINS_PER_DECADE).floor()
    };
    let edge = |bin: f64| PAUSE_BIN_MS_MIN * 10f64.powf(bin / PAUSE_BINS_PER_DECADE);
    let bins_max = runs
        .iter()
        .flat_map(|(_, result)| result.pauses.iter().map(|&(_, ms, _)| bin(ms)))
        .fold(0.0, f64::max);
    let series = runs
        .iter()
        .enumerate()
        .filter(|(_, (_, result))| !result.pauses.is_empty())
        .map(|(index, (variant, result))| {
            let count = result.pauses.len() as f64;
            let mut shares = vec![0.0; bins_max as usize + 1];
            for &(_, ms, _) in &result.pauses {
                shares[bin(ms) as usize] += 100.0 / count;
            }
            // A step outline: up at each bin's left edge, across, down at its right edge.
            let mut points = Vec::with_capacity(shares.len() * 2 + 2);
            points.push((edge(0.0), 0.0));
            for (b, share) in shares.iter().enumerate() {
                points.push((edge(b as f64), *share));
                points.push((edge(b as f64 + 1.0), *share));
            }
            points.push((edge(shares.len() as f64), 0.0));
            Series {
                name: (*variant).to_owned(),
                points,
                kind: SeriesKind::Line,
                color: Some(index),
            }
        })
        .collect();
    let mut chart = Chart::new(
        &format!("{case}: pauses per throttle call (0 ms counted at 0.1 ms)"),
        "pause (ms, log)",
        "share of pauses (%)",
        series,
    );
    chart.x_log = true;
    Some(chart)
}

/// Writepages calls by the pages each wrote, one outline per variant (share of calls per
/// power-of-two bin, log axis; a call that wrote nothing is drawn in the lowest bin, at 0.5
/// pages); `None` unless at least two runs made calls to a two-phase backend (the chart is
/// the 2020 NFS posting's measure: runs that sent no COMMIT are left out).
pub fn writepages_histogram_chart(case: &str, runs: &[(&str, &RunResult)]) -> Option<Chart> {
    let total = |result: &RunResult| result.writepages_sizes.iter().sum::<u64>();
    let with_calls = runs.iter().filter(|(_, result)| total(result) > 0).count();
    let two_phase = runs.iter().any(|(_, r)| r.metrics.get("commits").is_some_and(|&c| c > 0.0));
    if with_calls < 2 || !two_phase {
        return None;
    }
    let series = runs
        .iter()
        .enumerate()
        .filter(|(_, (_, result))| total(result) > 0)
        .map(|(index, (variant, result))| {
            let calls = total(result) as f64;
            let edge = |bucket: usize| if bucket == 0 { 0.5 } else { 2f64.powi(bucket as i32 - 1) };
            let mut points = vec![(edge(0), 0.0)];
            for (bucket, &count) in result.writepages_sizes.iter().enumerate() {
                let share = 100.0 * count as f64 / calls;
                points.push((edge(bucket), share));
                points.push((edge(bucket + 1), share));
            }
            points.push((edge(result.writepages_sizes.len()), 0.0));
            // Trim the empty tail so the axis ends at the largest call.
            while points.len() > 2 && points[points.len() - 2].1 == 0.0 {
                points.pop();
            }
            Series {
                name: (*variant).to_owned(),
                points,
                kind: SeriesKind::Line,
                color: Some(index),
            }
        })
        .collect();
    let mut chart = Chart::new(
        &format!("{case}: pages per writepages call"),
        "pages written by the call (log; 0 drawn at 0.5)",
        "share of calls (%)",
        series,
    );
    chart.x_log = true;
    Some(chart)
}

/// How far ours is from the posting's number, in tolerances (see the module doc); `None` for
/// a row that is not compared or has no number of ours.
pub fn distance_in_tolerances(row: &PublishedOutcome) -> Option<f64> {
    let value: PublishedValue = row.value?;
    let ours = row.ours_value?;
    let nearest = value.nearest(ours);
    let distance = match Tolerance::parse(&row.tolerance).ok()? {
        Tolerance::Factor(factor) => {
            if nearest == ours {
                0.0
            } else if nearest <= 0.0 || ours <= 0.0 || factor <= 1.0 {
                // No ratio to take: opposite signs, or no room at all.
                DISTANCE_MAX * (ours - nearest).signum()
            } else {
                (ours / nearest).ln() / factor.ln()
            }
        }
        // Inside the range is 0; outside, 1 at its edge plus the log ratio in octaves.
        Tolerance::Range if ours == nearest => 0.0,
        Tolerance::Range if nearest > 0.0 && ours > 0.0 => {
            let octaves = (ours / nearest).log2();
            octaves.signum() * (1.0 + octaves.abs())
        }
        Tolerance::Range => DISTANCE_MAX * (ours - nearest).signum(),
        Tolerance::Absolute(width) if width > 0.0 => (ours - nearest) / width,
        Tolerance::Absolute(_) => {
            if ours == nearest {
                0.0
            } else {
                DISTANCE_MAX * (ours - nearest).signum()
            }
        }
    };
    Some(distance.clamp(-DISTANCE_MAX, DISTANCE_MAX))
}

/// The verdict chart of one experiment; `None` when no row is compared. Rows are numbered
/// as in the experiment's table.
pub fn verdict_chart(experiment: &str, rows: &[PublishedOutcome]) -> Option<Chart> {
    let placed: Vec<(f64, f64, Verdict)> = rows
        .iter()
        .enumerate()
        .filter_map(|(index, row)| {
            distance_in_tolerances(row).map(|d| ((index + 1) as f64, d, row.verdict))
        })
        .collect();
    if placed.is_empty() {
        return None;
    }
    let last = rows.len() as f64 + 0.5;
    let edge = |y: f64| Series {
        name: String::new(),
        points: vec![(0.5, y), (last, y)],
        kind: SeriesKind::Line,
        color: Some(9),
    };
    let mut series = vec![edge(1.0), edge(-1.0)];
    for (verdict, color) in
        [(Verdict::Reproduced, 4), (Verdict::DirectionOnly, 5), (Verdict::NotReproduced, 2)]
    {
        let points: Vec<(f64, f64)> =
            placed.iter().filter(|p| p.2 == verdict).map(|p| (p.0, p.1)).collect();
        if !points.is_empty() {
            series.push(Series {
                name: verdict.name().to_owned(),
                points,
                kind: SeriesKind::Points,
                color: Some(color),
            });
        }
    }
    // A row not compared has no distance: a grey dot on the bottom edge marks it, so its place
    // on the axis reads as "not compared", not as a gap.
    let not_compared: Vec<(f64, f64)> = rows
        .iter()
        .enumerate()
        .filter(|(_, row)| row.verdict == Verdict::NotCompared)
        .map(|(index, _)| ((index + 1) as f64, -DISTANCE_MAX - 0.15))
        .collect();
    if !not_compared.is_empty() {
        series.push(Series {
            name: Verdict::NotCompared.name().to_owned(),
            points: not_compared,
            kind: SeriesKind::Points,
            color: Some(9),
        });
    }
    let mut chart = Chart::new(
        experiment,
        "published number (row of the table)",
        "distance in tolerances",
        series,
    );
    chart.y_min = Some(-DISTANCE_MAX - 0.3);
    chart.y_max = Some(DISTANCE_MAX + 0.3);
    chart.x_integer = true;
    chart.point_radius_px = VERDICT_POINT_RADIUS_PX;
    Some(chart)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(value: f64, ours: f64, tolerance: &str, verdict: Verdict) -> PublishedOutcome {
        PublishedOutcome {
            claim: "c".to_owned(),
            published: String::new(),
            line: None,
            ours: String::new(),
            value: Some(PublishedValue::Single(value)),
            ours_value: Some(ours),
            ours_values: vec![ours],
            ratio: Some(ours / value),
            tolerance: tolerance.to_owned(),
            rule: None,
            checks: Vec::new(),
            failed_checks: Vec::new(),
            verdict,
            why: String::new(),
            explanation: None,
            analysis: None,
        }
    }

    #[test]
    fn distances_are_in_tolerances() {
        // Goal: the tolerance's edge is at 1 for both kinds, equal is 0, far is clamped.
        let at_edge = row(100.0, 200.0, "x2", Verdict::Reproduced);
        assert!((distance_in_tolerances(&at_edge).unwrap() - 1.0).abs() < 1e-9);
        let below = row(100.0, 50.0, "x2", Verdict::Reproduced);
        assert!((distance_in_tolerances(&below).unwrap() + 1.0).abs() < 1e-9);
        let points = row(4.0, 1.0, "+-10", Verdict::Reproduced);
        assert!((distance_in_tolerances(&points).unwrap() + 0.3).abs() < 1e-9);
        let far = row(1.0, 1e9, "x2", Verdict::NotReproduced);
        assert_eq!(distance_in_tolerances(&far), Some(DISTANCE_MAX));
        let mut uncompared = row(1.0, 1.0, "", Verdict::NotCompared);
        uncompared.value = None;
        assert_eq!(distance_in_tolerances(&uncompared), None);
    }

    #[test]
    fn verdict_charts_number_rows_with_whole_numbers_and_large_dots() {
        // Goal: the x axis counts table rows (no 1.5), and each row's dot reads at the size
        // the page shows the chart (about 570 px wide).
        let rows = [
            row(100.0, 150.0, "x2", Verdict::Reproduced),
            row(1.0, 9.0, "x2", Verdict::NotReproduced),
        ];
        let chart = verdict_chart("e", &rows).expect("compared rows");
        assert!(chart.x_integer);
        // A row not compared is marked on the bottom edge, not left as a gap.
        let mut with_gap = rows.to_vec();
        with_gap.insert(1, row(1.0, 1.0, "x2", Verdict::NotCompared));
        with_gap[1].rule = None;
        let chart = verdict_chart("e", &with_gap).expect("compared rows");
        let marked = chart.series.iter().find(|s| s.name == "not-compared").expect("marked");
        assert_eq!(marked.points, [(2.0, -DISTANCE_MAX - 0.15)]);
        assert!(chart.point_radius_px >= 5, "{}", chart.point_radius_px);
    }

    #[test]
    fn nines_spread_the_tail() {
        // Goal: p90 is one nine, p99.99 four, everything capped.
        assert!((nines(0.9) - 1.0).abs() < 1e-9);
        assert!((nines(0.9999) - 4.0).abs() < 1e-6);
        assert_eq!(nines(1.0), NINES_MAX);
    }
}
