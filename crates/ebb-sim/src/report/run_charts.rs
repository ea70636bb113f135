//! The charts drawn for each run of an experiment: dirty pages against the limits; write
//! bandwidth (and the dirty ratelimit); wbt's limits and read latency; pauses as points;
//! pages dirtied per writer. Only charts with data are returned. The setpoint and the dirty
//! ratelimit belong to the IO-less design: they are drawn only for runs throttled by it.

use ebb_core::ThrottlePolicy;

use crate::report::plot::{Chart, Series, SeriesKind};
use crate::run::RunResult;

/// The legend name of a series: `dirty` counts writeback (wb) and unstable pages too.
fn shown_name(name: &str) -> String {
    match name {
        "dirty" => "dirty+wb+unstable".to_owned(),
        other => other.to_owned(),
    }
}

/// The charts of one run that have data: (file name, chart). `throttle` is the run's writer
/// throttling policy.
pub fn charts(result: &RunResult, throttle: ThrottlePolicy) -> Vec<(&'static str, Chart)> {
    let ioless = throttle.has_position_control();
    let line_chart = |title: &str, y_label: Option<&str>, names: &[&str]| {
        line_chart(result, ioless, title, y_label, names)
    };
    let writer_names: Vec<&str> = result
        .series
        .iter()
        .map(|series| series.name.as_str())
        .filter(|name| name.starts_with("writer") && name.ends_with("_dirtied"))
        .collect();
    let mut charts = vec![
        (
            "dirty.png",
            line_chart(
                if ioless { "dirty pages, setpoint and limits" } else { "dirty pages and limits" },
                Some("pages"),
                &["dirty", "writeback", "setpoint", "limit", "bg_thresh"],
            ),
        ),
        (
            "bandwidth.png",
            line_chart(
                if ioless { "dirty ratelimit and write bandwidth" } else { "write bandwidth" },
                None,
                &["dirty_ratelimit", "write_bw", "avg_write_bw"],
            ),
        ),
        (
            "wbt.png",
            line_chart(
                "writeback throttling: in-flight limits",
                Some("requests"),
                &["wbt_max_depth", "wbt_background"],
            ),
        ),
        (
            "wbt-latency.png",
            line_chart(
                "writeback throttling: minimum read latency per window",
                Some("us"),
                &["wbt_read_min_us"],
            ),
        ),
        ("pauses.png", pauses_chart(result)),
        ("writers.png", line_chart("dirtied by each writer", None, &writer_names)),
    ];
    charts.retain(|(_, chart)| chart.series.iter().any(|series| !series.points.is_empty()));
    charts
}

/// A chart of the run's time series `names` that have points, in the unit of the first
/// unless `y_label` says; the setpoint and ratelimit only under `ioless`, which has them.
fn line_chart(
    result: &RunResult,
    ioless: bool,
    title: &str,
    y_label: Option<&str>,
    names: &[&str],
) -> Chart {
    let present: Vec<_> = names
        .iter()
        .filter_map(|name| result.series(name))
        .filter(|series| !series.points.is_empty())
        .collect();
    let unit = present.first().map(|series| series.unit.clone()).unwrap_or_default();
    let series = present
        .iter()
        .filter(|series| ioless || !matches!(series.name.as_str(), "setpoint" | "dirty_ratelimit"))
        .map(|series| Series {
            name: shown_name(&series.name),
            points: series.points.clone(),
            kind: SeriesKind::Line,
            color: None,
        })
        .collect::<Vec<_>>();
    Chart::new(
        &format!("{}: {title}", result.name),
        "time (s)",
        &y_label.map_or(unit, str::to_owned),
        series,
    )
}

/// Every throttle pause of the run, a series of points per writer.
fn pauses_chart(result: &RunResult) -> Chart {
    let mut writers: Vec<u32> = result.pauses.iter().map(|&(_, _, writer)| writer).collect();
    writers.sort_unstable();
    writers.dedup();
    let series = writers
        .iter()
        .map(|&writer| Series {
            name: format!("writer {writer}"),
            points: result
                .pauses
                .iter()
                .filter(|&&(_, _, w)| w == writer)
                .map(|&(t, ms, _)| (t, ms))
                .collect(),
            kind: SeriesKind::Points,
            color: Some(writer as usize),
        })
        .collect();
    Chart::new(
        &format!("{}: pause per throttle call", result.name),
        "time (s)",
        "pause (ms)",
        series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::TimeSeries;

    #[test]
    fn charts_skip_missing_series_and_group_pauses_by_writer() {
        // Goal: only charts with data are drawn; each writer's pauses are one point series.
        let result = RunResult {
            name: "sata/ioless".to_owned(),
            series: vec![
                TimeSeries { name: "dirty".into(), unit: "pages".into(), points: vec![(0.0, 1.0)] },
                TimeSeries { name: "limit".into(), unit: "pages".into(), points: vec![(0.0, 2.0)] },
            ],
            pauses: vec![(0.1, 8.0, 0), (0.2, 9.0, 1), (0.3, 8.0, 0)],
            ..RunResult::default()
        };
        let charts = charts(&result, ThrottlePolicy::Ioless);
        let files: Vec<&str> = charts.iter().map(|(file, _)| *file).collect();
        assert_eq!(files, ["dirty.png", "pauses.png"]);
        assert_eq!(charts[0].1.series.len(), 2);
        let pauses = &charts[1].1.series;
        assert_eq!(pauses.len(), 2);
        assert_eq!(pauses[0].points, [(0.1, 8.0), (0.3, 8.0)]);
    }
}
