//! `read-under-write --chart DIR`: the frontier drawn, one PNG per read percentile
//! (`frontier-p99.png`, `frontier-p99_99.png`): each writer mode's points, x its write rate and
//! y its reads' percentile, with ebb's frontier (p99.99) as a line, drawn by the same chart
//! code as `ebb reproduce`'s.

use std::io;
use std::path::Path;

use ebb_sim::report::plot::{Chart, Series, SeriesKind, render_png};

use super::pace::{Frontier, Point};

const WIDTH: u32 = 900;
const HEIGHT: u32 = 480;

/// Draws the charts of `points` into `dir` (created if missing).
pub(crate) fn draw(dir: &Path, points: &[Point]) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let frontier = Frontier::of(points);
    for (file, what, y) in [
        ("frontier-p99.png", "p99", (|p: &Point| p.read_lat_us_p99) as fn(&Point) -> u64),
        ("frontier-p99_99.png", "p99.99", |p: &Point| p.read_lat_us_p99_99),
    ] {
        let mut modes: Vec<&str> = points.iter().map(|p| p.mode.as_str()).collect();
        modes.sort_unstable();
        modes.dedup();
        let mut series: Vec<Series> = modes
            .iter()
            .enumerate()
            .map(|(i, mode)| Series {
                name: (*mode).to_owned(),
                points: points
                    .iter()
                    .filter(|p| p.mode == *mode)
                    .map(|p| (p.write_mb_s, y(p) as f64 / 1e3))
                    .collect(),
                kind: SeriesKind::Points,
                color: Some(i),
            })
            .collect();
        if what == "p99.99" && frontier.ebb.len() > 1 {
            series.insert(
                0,
                Series {
                    name: "ebb's frontier".to_owned(),
                    points: frontier
                        .ebb
                        .iter()
                        .map(|p| (p.write_mb_s, y(p) as f64 / 1e3))
                        .collect(),
                    kind: SeriesKind::Line,
                    color: Some(9),
                },
            );
        }
        let mut chart = Chart::new(
            &format!("Random 4 KiB reads beside a writer: {what} against the write rate"),
            "writer (MiB/s, to the end of its sync)",
            &format!("read {what} (ms)"),
            series,
        );
        chart.point_radius_px = 5;
        render_png(&chart, &dir.join(file), WIDTH, HEIGHT)
            .map_err(|error| io::Error::other(error.to_string()))?;
    }
    Ok(())
}
