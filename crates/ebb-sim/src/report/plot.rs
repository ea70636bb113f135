//! PNG charts of the controller signals: the plots kernel developers read in Wu Fengguang's
//! writeback postings (dirty pages over time against setpoint and limit, dirty ratelimit and
//! write bandwidth over time, pause times over time as points).
//!
//! Charts are drawn with plotters' bitmap backend and text goes through ab_glyph with DejaVu
//! Sans embedded from `assets/` (license beside it), so rendering needs no system font
//! library and the same input gives a byte-identical PNG on every machine, which golden
//! tests rely on.
//!
//! A simulated run has millions of samples and a chart a thousand pixel columns, so series
//! are reduced before drawing, deterministically and without visible change:
//!
//! - lines (x non-decreasing) keep, per pixel column, the first, lowest, highest and last
//!   point in their original order (the "M4" reduction), which draws the same pixels as the
//!   full series, spikes included; a line with unsorted x is thinned by a fixed stride;
//! - points keep the first point landing in each 2x2-pixel cell, in input order; a marker is
//!   5 pixels wide, so the dropped ones would be hidden anyway, and a lone outlier (a 300 ms
//!   pause among 1 ms ones) is never dropped.
//!
//! Axes: x spans the data; y spans from `min(0, data minimum)` to the data maximum plus 5%
//! headroom unless [`Chart::y_min`] / [`Chart::y_max`] say otherwise. Line values outside
//! the y range are drawn pinned to its edge; points outside it are not drawn. NaN and
//! infinite coordinates are skipped. With [`Chart::x_log`] the x axis is logarithmic
//! (base 10; points at x <= 0 are skipped), for latency distributions.
//!
//! The legend sits in a column right of the plot, so it never covers data. Lines are drawn
//! segment by segment: a thick polyline that reverses within a pixel (a limit that steps up
//! and back down) would otherwise be joined with a miter spike far outside the plot.

use std::error::Error;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::ReportError;

/// DejaVu Sans (Bitstream Vera license, see `assets/DejaVuSans-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
/// The family name plotters looks fonts up by.
const FONT_FAMILY: &str = "sans-serif";

/// Tableau 10: distinguishable on white and for common color blindness. A series' color is
/// `PALETTE[color.unwrap_or(series index) % 10]`.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7), // blue
    RGBColor(0xf2, 0x8e, 0x2b), // orange
    RGBColor(0xe1, 0x57, 0x59), // red
    RGBColor(0x76, 0xb7, 0xb2), // teal
    RGBColor(0x59, 0xa1, 0x4f), // green
    RGBColor(0xed, 0xc9, 0x48), // yellow
    RGBColor(0xb0, 0x7a, 0xa1), // purple
    RGBColor(0xff, 0x9d, 0xa7), // pink
    RGBColor(0x9c, 0x75, 0x5f), // brown
    RGBColor(0xba, 0xb0, 0xac), // grey
];

/// Smallest image accepted; below this the axes and legend do not fit.
const WIDTH_MIN: u32 = 240;
const HEIGHT_MIN: u32 = 160;
/// Side of the square cell in which only one point of a point series is drawn, in pixels.
const POINT_CELL_PX: u32 = 2;
const POINT_RADIUS_PX: i32 = 2;
const LINE_WIDTH_PX: u32 = 2;
/// The most x labels of a chart whose x counts things ([`Chart::x_integer`]).
const X_INTEGER_LABELS_MAX: usize = 25;
/// A line with unsorted x is thinned to at most this many points.
const UNSORTED_LINE_POINTS_MAX: usize = 20_000;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesKind {
    /// Points joined in the given order (dirty pages, setpoint, limit, bandwidth).
    Line,
    /// Separate markers (one per pause).
    Points,
}

/// One named series of (x, y) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend entry; an empty name leaves the series out of the legend.
    pub name: String,
    /// The data; for [`SeriesKind::Line`] normally in increasing x (time).
    pub points: Vec<(f64, f64)>,
    /// Line or points.
    pub kind: SeriesKind,
    /// Palette index (modulo 10); `None` uses the series' position in the chart.
    pub color: Option<usize>,
}

/// A chart: title, axis labels and series, drawn in order (later series on top).
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Shown above the plot.
    pub title: String,
    /// X axis description, with unit (e.g. "time (s)").
    pub x_label: String,
    /// Y axis description, with unit (e.g. "dirty pages").
    pub y_label: String,
    /// The series.
    pub series: Vec<Series>,
    /// Bottom of the y axis; `None` means `min(0, data minimum)`.
    pub y_min: Option<f64>,
    /// Top of the y axis; `None` means the data maximum plus 5% headroom.
    pub y_max: Option<f64>,
    /// A logarithmic x axis (base 10).
    pub x_log: bool,
    /// x counts things (rows of a table): ticks and labels at whole numbers only.
    pub x_integer: bool,
    /// Radius of the markers of point series, in pixels.
    pub point_radius_px: i32,
}

impl Chart {
    /// A chart with linear axes fitted to the data.
    pub fn new(title: &str, x_label: &str, y_label: &str, series: Vec<Series>) -> Chart {
        Chart {
            title: title.to_owned(),
            x_label: x_label.to_owned(),
            y_label: y_label.to_owned(),
            series,
            y_min: None,
            y_max: None,
            x_log: false,
            x_integer: false,
            point_radius_px: POINT_RADIUS_PX,
        }
    }
}

/// Width of the legend column right of the plot, in pixels.
const LEGEND_WIDTH_PX: u32 = 190;

/// The data window shown by a chart.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Bounds {
    x_min: f64,
    x_max: f64,
    y_min: f64,
    y_max: f64,
}

type PlotContext<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Renders `chart` as a `width` x `height` PNG at `path` (which must end in `.png`).
pub fn render_png(chart: &Chart, path: &Path, width: u32, height: u32) -> Result<(), ReportError> {
    let plot_error = |message: String| ReportError::Plot { path: path.to_owned(), message };
    if width < WIDTH_MIN || height < HEIGHT_MIN {
        return Err(plot_error(format!(
            "{width}x{height} pixels is smaller than the minimum {WIDTH_MIN}x{HEIGHT_MIN}"
        )));
    }
    if !path.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("png")) {
        return Err(plot_error("the file name must end in .png".to_owned()));
    }
    if !font_registered() {
        return Err(plot_error("the embedded font could not be loaded".to_owned()));
    }
    let chart = &to_drawn_x(&merge_identical(chart));
    let bounds = bounds(chart).map_err(plot_error)?;
    draw(chart, bounds, path, (width, height)).map_err(|error| plot_error(error.to_string()))
}

/// `chart` with each series whose kind and points equal an earlier named one's drawn once,
/// its legend entry naming both (`legacy = reordered`): two variants that behave the same
/// would otherwise draw one line over the other and the legend would show a line the chart
/// does not. Colors stay what they were (a series' position is its default color).
fn merge_identical(chart: &Chart) -> Chart {
    let mut series: Vec<Series> = Vec::with_capacity(chart.series.len());
    for (index, s) in chart.series.iter().enumerate() {
        let same = series.iter_mut().find(|kept| {
            !kept.name.is_empty()
                && !s.name.is_empty()
                && kept.kind == s.kind
                && kept.points == s.points
        });
        match same {
            Some(kept) => kept.name = format!("{} = {}", kept.name, s.name),
            None => series.push(Series { color: Some(s.color.unwrap_or(index)), ..s.clone() }),
        }
    }
    Chart { series, ..chart.clone() }
}

/// Registers the embedded font with plotters once per process; whether it succeeded.
fn font_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT).is_ok()
    })
}

/// The chart with x as drawn: log10(x) on a logarithmic axis (dropping x <= 0).
fn to_drawn_x(chart: &Chart) -> Chart {
    let mut drawn = chart.clone();
    if chart.x_log {
        for series in &mut drawn.series {
            series.points = series
                .points
                .iter()
                .filter(|(x, _)| *x > 0.0)
                .map(|&(x, y)| (x.log10(), y))
                .collect();
        }
    }
    drawn
}

fn draw(
    chart: &Chart,
    bounds: Bounds,
    path: &Path,
    size: (u32, u32),
) -> Result<(), Box<dyn Error>> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let named = chart.series.iter().any(|series| !series.name.is_empty());
    let (plot, legend) = if named {
        root.split_horizontally(size.0.saturating_sub(LEGEND_WIDTH_PX))
    } else {
        root.split_horizontally(size.0)
    };
    let (x_log, x_integer) = (chart.x_log, chart.x_integer);
    let x_formatter = move |value: &f64| {
        if x_log {
            tick_label(two_significant(10f64.powf(*value)))
        } else if x_integer && (value - value.round()).abs() > 1e-9 {
            String::new()
        } else {
            tick_label(*value)
        }
    };
    let mut context = ChartBuilder::on(&plot)
        .caption(&chart.title, (FONT_FAMILY, 22))
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(bounds.x_min..bounds.x_max, bounds.y_min..bounds.y_max)?;
    let mut mesh = context.configure_mesh();
    if x_integer {
        // At most one label per whole number: plotters then picks a step of 1, 2 or 5.
        let whole_numbers = (bounds.x_max.floor() - bounds.x_min.ceil()).max(0.0) as usize + 1;
        mesh.x_labels(whole_numbers.clamp(2, X_INTEGER_LABELS_MAX));
    }
    mesh.x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&x_formatter)
        .y_label_formatter(&|value| tick_label(*value))
        .label_style((FONT_FAMILY, 14))
        .axis_desc_style((FONT_FAMILY, 16))
        .bold_line_style(RGBColor(0xd8, 0xdc, 0xe0))
        .light_line_style(RGBColor(0xf0, 0xf2, 0xf4))
        .max_light_lines(2)
        .draw()?;
    let pixels = context.plotting_area().dim_in_pixel();
    for (index, series) in chart.series.iter().enumerate() {
        let color = PALETTE[series.color.unwrap_or(index) % PALETTE.len()];
        draw_series(&mut context, series, color, bounds, pixels, chart.point_radius_px)?;
    }
    if named {
        draw_legend(&legend, chart)?;
    }
    root.present()?;
    Ok(())
}

/// The legend column: a sample of each named series' line or marker and its name, from the
/// top of the plot down.
fn draw_legend(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    chart: &Chart,
) -> Result<(), Box<dyn Error>> {
    let mut y = 56;
    for (index, series) in chart.series.iter().enumerate() {
        if series.name.is_empty() {
            continue;
        }
        let color = PALETTE[series.color.unwrap_or(index) % PALETTE.len()];
        match series.kind {
            SeriesKind::Line => {
                area.draw(&PathElement::new([(4, y), (28, y)], color.stroke_width(LINE_WIDTH_PX)))?;
            }
            SeriesKind::Points => {
                area.draw(&Circle::new((16, y), chart.point_radius_px + 1, color.filled()))?;
            }
        }
        let name: String = series.name.chars().take(22).collect();
        area.draw_text(&name, &(FONT_FAMILY, 14).into_text_style(area), (36, y - 8))?;
        y += 22;
    }
    Ok(())
}

fn draw_series(
    context: &mut PlotContext<'_, '_>,
    series: &Series,
    color: RGBColor,
    bounds: Bounds,
    pixels: (u32, u32),
    series_radius: i32,
) -> Result<(), Box<dyn Error>> {
    let annotation = match series.kind {
        SeriesKind::Line => {
            let style = color.stroke_width(LINE_WIDTH_PX);
            let points = reduce_line(&series.points, bounds, pixels.0.max(1) as usize);
            let clamped: Vec<(f64, f64)> =
                points.into_iter().map(|(x, y)| (x, y.clamp(bounds.y_min, bounds.y_max))).collect();
            let segments =
                clamped.windows(2).map(|pair| PathElement::new([pair[0], pair[1]], style));
            let annotation = context.draw_series(segments)?;
            annotation.legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style))
        }
        SeriesKind::Points => {
            let style = color.filled();
            let points = reduce_points(&series.points, bounds, pixels);
            let radius = series_radius;
            let markers = points.into_iter().map(|point| Circle::new(point, radius, style));
            let annotation = context.draw_series(markers)?;
            annotation.legend(move |(x, y)| Circle::new((x + 10, y), radius + 1, style))
        }
    };
    if !series.name.is_empty() {
        annotation.label(series.name.as_str());
    }
    Ok(())
}

/// The window shown: x over the finite data, y per [`Chart::y_min`] and [`Chart::y_max`].
fn bounds(chart: &Chart) -> Result<Bounds, String> {
    let finite = chart
        .series
        .iter()
        .flat_map(|series| series.points.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let mut data: Option<Bounds> = None;
    for &(x, y) in finite {
        let b = data.get_or_insert(Bounds { x_min: x, x_max: x, y_min: y, y_max: y });
        b.x_min = b.x_min.min(x);
        b.x_max = b.x_max.max(x);
        b.y_min = b.y_min.min(y);
        b.y_max = b.y_max.max(y);
    }
    let data = data.unwrap_or(Bounds { x_min: 0.0, x_max: 1.0, y_min: 0.0, y_max: 1.0 });
    let (x_min, x_max) = widen_if_empty(data.x_min, data.x_max);
    let y_min = chart.y_min.unwrap_or(data.y_min.min(0.0));
    let y_max = chart.y_max.unwrap_or(data.y_max + 0.05 * (data.y_max - y_min).abs());
    if !(y_min.is_finite() && y_max.is_finite()) {
        return Err(format!("y range {y_min}..{y_max} is not finite"));
    }
    if chart.y_min.is_some() && chart.y_max.is_some() && y_min >= y_max {
        return Err(format!("y_min {y_min} is not below y_max {y_max}"));
    }
    let (y_min, y_max) = widen_if_empty(y_min, y_max.max(y_min));
    Ok(Bounds { x_min, x_max, y_min, y_max })
}

/// Widens a range of zero width so the axis can be drawn, keeping `min` where it is.
fn widen_if_empty(min: f64, max: f64) -> (f64, f64) {
    if max > min { (min, max) } else { (min, min + min.abs().max(1.0)) }
}

/// M4 reduction of a line to at most four points per pixel column (see the module doc).
fn reduce_line(points: &[(f64, f64)], bounds: Bounds, columns: usize) -> Vec<(f64, f64)> {
    let finite = || points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite());
    if points.len() <= 4 * columns {
        return finite().collect();
    }
    let sorted = finite().zip(finite().skip(1)).all(|(a, b)| a.0 <= b.0);
    if !sorted {
        let stride = points.len().div_ceil(UNSORTED_LINE_POINTS_MAX);
        return finite().step_by(stride).collect();
    }
    let scale = columns as f64 / (bounds.x_max - bounds.x_min);
    let mut out = Vec::with_capacity(4 * columns + 4);
    let mut column: Option<Column> = None;
    for (index, point) in finite().enumerate() {
        // The float-to-int cast saturates, so x below x_min lands in column 0.
        let bucket = (((point.0 - bounds.x_min) * scale) as usize).min(columns - 1);
        match &mut column {
            Some(current) if current.bucket == bucket => current.add(index, point),
            _ => {
                if let Some(done) = column.take() {
                    done.emit(&mut out);
                }
                column = Some(Column::new(bucket, index, point));
            }
        }
    }
    if let Some(done) = column {
        done.emit(&mut out);
    }
    out
}

/// The four points one pixel column of a line keeps, with their input positions.
struct Column {
    bucket: usize,
    first: (usize, (f64, f64)),
    lowest: (usize, (f64, f64)),
    highest: (usize, (f64, f64)),
    last: (usize, (f64, f64)),
}

impl Column {
    fn new(bucket: usize, index: usize, point: (f64, f64)) -> Column {
        let entry = (index, point);
        Column { bucket, first: entry, lowest: entry, highest: entry, last: entry }
    }

    fn add(&mut self, index: usize, point: (f64, f64)) {
        if point.1 < self.lowest.1.1 {
            self.lowest = (index, point);
        }
        if point.1 > self.highest.1.1 {
            self.highest = (index, point);
        }
        self.last = (index, point);
    }

    /// Appends the kept points in input order, each once.
    fn emit(self, out: &mut Vec<(f64, f64)>) {
        let mut kept = [self.first, self.lowest, self.highest, self.last];
        kept.sort_by_key(|&(index, _)| index);
        let mut previous = None;
        for (index, point) in kept {
            if previous != Some(index) {
                out.push(point);
                previous = Some(index);
            }
        }
    }
}

/// Keeps the first point in each `POINT_CELL_PX`-square cell of the plotting area, in input
/// order, dropping points outside the window.
fn reduce_points(points: &[(f64, f64)], bounds: Bounds, pixels: (u32, u32)) -> Vec<(f64, f64)> {
    let columns = pixels.0.div_ceil(POINT_CELL_PX).max(1) as usize;
    let rows = pixels.1.div_ceil(POINT_CELL_PX).max(1) as usize;
    let x_scale = columns as f64 / (bounds.x_max - bounds.x_min);
    let y_scale = rows as f64 / (bounds.y_max - bounds.y_min);
    let mut occupied = vec![0u64; (columns * rows).div_ceil(64)];
    let mut out = Vec::new();
    for &(x, y) in points {
        let inside = (bounds.x_min..=bounds.x_max).contains(&x)
            && (bounds.y_min..=bounds.y_max).contains(&y);
        if !inside {
            continue; // Also drops NaN, which no range contains.
        }
        let column = (((x - bounds.x_min) * x_scale) as usize).min(columns - 1);
        let row = (((y - bounds.y_min) * y_scale) as usize).min(rows - 1);
        let cell = row * columns + column;
        let (word, bit) = (cell / 64, 1u64 << (cell % 64));
        if occupied[word] & bit == 0 {
            occupied[word] |= bit;
            out.push((x, y));
        }
    }
    out
}

/// `value` rounded to two significant digits (log-axis ticks fall between round numbers).
fn two_significant(value: f64) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let scale = 10f64.powi(value.abs().log10().floor() as i32 - 1);
    (value / scale).round() * scale
}

/// A short axis label: up to three decimals without trailing zeros, or scientific notation
/// for very large and very small magnitudes.
fn tick_label(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-3..1e7).contains(&magnitude) {
        return format!("{value:.2e}");
    }
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" { "0".to_owned() } else { text.to_owned() }
}

#[cfg(test)]
mod tests {
    use std::hash::{DefaultHasher, Hash, Hasher};

    #[test]
    fn identical_series_are_drawn_once_and_named_together() {
        let line = |name: &str, y: f64| Series {
            name: name.to_owned(),
            points: vec![(0.0, y), (1.0, y)],
            kind: SeriesKind::Line,
            color: None,
        };
        let chart = Chart::new("t", "x", "y", vec![line("a", 1.0), line("b", 2.0), line("c", 1.0)]);
        let merged = super::merge_identical(&chart);
        let names: Vec<&str> = merged.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a = c", "b"]);
        assert_eq!(merged.series[1].color, Some(1), "b keeps its own color");
    }

    use super::*;

    /// Dirty pages over time with setpoint and limit, as in Wu's throttling plots, plus pause
    /// times as points; `samples` points per data series, all from fixed formulas.
    fn writeback_chart(samples: usize) -> Chart {
        let time = |i: usize| i as f64 * 100.0 / samples as f64;
        let dirty = (0..samples)
            .map(|i| {
                let t = time(i);
                (t, 1000.0 + 150.0 * (t * 0.7).sin() + 40.0 * ((i * 7919 % 101) as f64 / 101.0))
            })
            .collect();
        let pauses = (0..samples)
            .map(|i| (time(i), if i % 997 == 0 { 180.0 } else { 8.0 + (i % 13) as f64 }))
            .collect();
        Chart {
            title: "dirty pages (ioless)".to_owned(),
            x_label: "time (s)".to_owned(),
            y_label: "pages".to_owned(),
            series: vec![
                Series {
                    name: "dirty".to_owned(),
                    points: dirty,
                    kind: SeriesKind::Line,
                    color: None,
                },
                Series {
                    name: "setpoint".to_owned(),
                    points: vec![(0.0, 1000.0), (100.0, 1000.0)],
                    kind: SeriesKind::Line,
                    color: None,
                },
                Series {
                    name: "limit".to_owned(),
                    points: vec![(0.0, 1200.0), (100.0, 1200.0)],
                    kind: SeriesKind::Line,
                    color: None,
                },
                Series {
                    name: "pause (ms)".to_owned(),
                    points: pauses,
                    kind: SeriesKind::Points,
                    color: Some(4),
                },
            ],
            y_min: None,
            y_max: Some(1400.0),
            x_log: false,
            x_integer: false,
            point_radius_px: POINT_RADIUS_PX,
        }
    }

    fn hash_file(path: &Path) -> u64 {
        let bytes = std::fs::read(path).expect("read png");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        let mut hasher = DefaultHasher::new();
        bytes.hash(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn same_input_gives_identical_png() {
        // Goal: rendering the same chart twice gives the same bytes (golden tests rely on it).
        let dir = crate::report::test_dir("plot-determinism");
        let chart = writeback_chart(5000);
        let (first, second) = (dir.join("a.png"), dir.join("b.png"));
        render_png(&chart, &first, 900, 500).expect("first render");
        render_png(&chart, &second, 900, 500).expect("second render");
        assert_eq!(hash_file(&first), hash_file(&second));
        let mut other = chart.clone();
        other.title.push_str(" (changed)");
        let third = dir.join("c.png");
        render_png(&other, &third, 900, 500).expect("third render");
        assert_ne!(hash_file(&first), hash_file(&third), "text must reach the image");
    }

    #[test]
    fn million_point_series_render() {
        // Goal: a chart with a 1M-point line and 1M points renders (reduction keeps it fast);
        // no time is asserted.
        let dir = crate::report::test_dir("plot-million");
        let path = dir.join("million.png");
        render_png(&writeback_chart(1_000_000), &path, 1200, 700).expect("render");
        hash_file(&path);
    }

    #[test]
    fn log_ticks_are_rounded() {
        // Goal: half-decade ticks read as round numbers.
        assert_eq!(tick_label(two_significant(10f64.powf(3.5))), "3200");
        assert_eq!(tick_label(two_significant(10f64.powf(-0.5))), "0.32");
        assert_eq!(two_significant(0.0), 0.0);
    }

    #[test]
    fn line_reduction_keeps_extremes_in_order() {
        // Goal: M4 keeps each column's first, lowest, highest and last points in input order,
        // so a one-sample spike survives.
        let mut points: Vec<(f64, f64)> = (0..10_000).map(|i| (i as f64, 1.0)).collect();
        points[5_003].1 = 99.0;
        points[7_001].1 = -5.0;
        let bounds = Bounds { x_min: 0.0, x_max: 10_000.0, y_min: -10.0, y_max: 100.0 };
        let reduced = reduce_line(&points, bounds, 100);
        assert!(reduced.len() <= 400, "{} points", reduced.len());
        assert!(reduced.contains(&(5_003.0, 99.0)));
        assert!(reduced.contains(&(7_001.0, -5.0)));
        assert_eq!(reduced.first(), Some(&(0.0, 1.0)));
        assert_eq!(reduced.last(), Some(&(9_999.0, 1.0)));
        assert!(reduced.windows(2).all(|pair| pair[0].0 < pair[1].0));
    }

    #[test]
    fn point_reduction_keeps_one_per_cell_and_outliers() {
        // Goal: points on the same cell collapse to the first, a lone outlier stays, and
        // points outside the window or non-finite are dropped.
        let mut points = vec![(1.0, 1.0); 1000];
        points.push((50.0, 300.0));
        points.push((f64::NAN, 1.0));
        points.push((50.0, 1e9));
        let bounds = Bounds { x_min: 0.0, x_max: 100.0, y_min: 0.0, y_max: 400.0 };
        let reduced = reduce_points(&points, bounds, (200, 100));
        assert_eq!(reduced, [(1.0, 1.0), (50.0, 300.0)]);
    }

    #[test]
    fn bad_input_is_reported_with_the_path() {
        // Goal: an empty y range, a tiny image or a non-PNG name is an error naming the file.
        let dir = crate::report::test_dir("plot-errors");
        let mut chart = writeback_chart(10);
        chart.y_min = Some(5.0);
        chart.y_max = Some(5.0);
        let path = dir.join("bad.png");
        let error = render_png(&chart, &path, 800, 400).expect_err("empty y range");
        assert!(error.to_string().contains("bad.png"), "{error}");
        render_png(&writeback_chart(10), &path, 100, 100).expect_err("too small");
        render_png(&writeback_chart(10), &dir.join("x.svg"), 800, 400).expect_err("not png");
    }

    #[test]
    fn empty_and_flat_charts_render() {
        // Goal: no series, or one constant point, still draws axes instead of failing.
        let dir = crate::report::test_dir("plot-degenerate");
        let mut chart = writeback_chart(0);
        chart.series.clear();
        chart.y_max = None;
        render_png(&chart, &dir.join("empty.png"), 400, 300).expect("empty");
        chart.series.push(Series {
            name: String::new(),
            points: vec![(3.0, 7.0)],
            kind: SeriesKind::Points,
            color: None,
        });
        render_png(&chart, &dir.join("flat.png"), 400, 300).expect("flat");
    }

    #[test]
    fn tick_labels_are_short() {
        // Goal: axis labels drop float noise and switch to scientific notation at extremes.
        assert_eq!(tick_label(0.30000000000000004), "0.3");
        assert_eq!(tick_label(1200.0), "1200");
        assert_eq!(tick_label(-0.0), "0");
        assert_eq!(tick_label(25_000_000.0), "2.50e7");
        assert_eq!(tick_label(0.0001), "1.00e-4");
    }
}
