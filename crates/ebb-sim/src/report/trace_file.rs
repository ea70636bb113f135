//! The report of a trace file (`ebb report FILE --out DIR`): a real run's tracepoint lines
//! (`ebb mount --trace`, `ebb_runtime::Builder::trace`), or a simulated run's `trace.txt`,
//! drawn with the charts of a simulated run, in `report.html`, and as `trace.json` for
//! ui.perfetto.dev.
//!
//! The lines are the kernel's text format (`TASK [CPU] SECONDS: tracepoint: key=value ...`),
//! read by name, so the report needs nothing but the file. From each tracepoint:
//!
//! | tracepoint | series |
//! |---|---|
//! | `global_dirty_state` | `dirty` (with writeback and unstable), `writeback`, `bg_thresh`, `limit` (pages) |
//! | `balance_dirty_pages` (IO-less) | `dirty`, `setpoint`, `limit` (pages), each writer's pauses |
//! | `balance_dirty_pages` (legacy, 2010) | pauses |
//! | `bdi_dirty_ratelimit` | `dirty_ratelimit`, `write_bw`, `avg_write_bw` (KB/s) |
//! | `wbt_step`, `wbt_stat` | `wbt_max_depth`, `wbt_background`, `wbt_read_min_us` |
//! | `writeback_single_inode` | the writepages sizes |
//!
//! The pages each writer dirtied are not drawn: `balance_dirty_pages` fires only past freerun,
//! so its `dirtied` counts miss what a writer dirtied below it.
//!
//! A line that is not a tracepoint line (a comment, a line of another tool) is skipped and
//! counted; a file with no tracepoint at all is an error.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use ebb_core::ThrottlePolicy;

use crate::experiment::format_number;
use crate::report::ReportError;
use crate::report::chrome_trace::{ArgValue, ChromeTrace};
use crate::report::hist::SampleStats;
use crate::report::html::{ExperimentSection, PlotRef, ReportPage, Table, write_html};
use crate::report::plot::render_png;
use crate::report::run_charts::charts;
use crate::run::{RunResult, TimeSeries};

/// Chart size in pixels (the simulator's).
const CHART_WIDTH: u32 = 960;
const CHART_HEIGHT: u32 = 420;
/// Most points drawn per series (every n-th sample beyond).
const POINTS_MAX: usize = 4000;

/// One tracepoint line: the task, the time, the tracepoint and its `key=value` fields.
#[derive(Debug, PartialEq)]
struct Line<'a> {
    task: &'a str,
    seconds: f64,
    name: &'a str,
    fields: BTreeMap<&'a str, f64>,
}

/// Parses `TASK [CPU] SECONDS: name: fields`; `None` for any other line.
fn parse_line(line: &str) -> Option<Line<'_>> {
    let (task, rest) = line.split_once(" [")?;
    let (_, rest) = rest.split_once("] ")?;
    let (seconds, rest) = rest.split_once(": ")?;
    let seconds: f64 = seconds.trim().parse().ok()?;
    let (name, rest) = rest.split_once(':')?;
    if name.contains(' ') || !seconds.is_finite() {
        return None;
    }
    let fields = rest
        .split([' ', ','])
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(key, value)| Some((key, value.trim_end_matches('%').parse().ok()?)))
        .collect();
    Some(Line { task: task.trim(), seconds, name, fields })
}

/// A series as it is read: its unit and its points.
type Points = (&'static str, Vec<(f64, f64)>);

/// What the lines add up to, as they are read.
#[derive(Default)]
struct Collector {
    series: BTreeMap<&'static str, Points>,
    writers: Vec<String>,
    pauses: Vec<(f64, f64, u32)>,
    writepages_sizes: Vec<u64>,
    lines: u64,
    skipped: u64,
    last_seconds: f64,
}

impl Collector {
    fn push(&mut self, name: &'static str, unit: &'static str, at: f64, value: Option<f64>) {
        if let Some(value) = value {
            self.series.entry(name).or_insert((unit, Vec::new())).1.push((at, value));
        }
    }

    fn writer(&mut self, task: &str) -> u32 {
        match self.writers.iter().position(|w| w == task) {
            Some(index) => index as u32,
            None => {
                self.writers.push(task.to_owned());
                (self.writers.len() - 1) as u32
            }
        }
    }

    /// Takes one line into the series; its Perfetto events into `json`.
    fn take(
        &mut self,
        line: &Line<'_>,
        json: &mut ChromeTrace<std::fs::File>,
    ) -> Result<(), ReportError> {
        let (t, f) = (line.seconds, &line.fields);
        let ts_us = t * 1e6;
        self.lines += 1;
        self.last_seconds = self.last_seconds.max(t);
        match line.name {
            "balance_dirty_pages" => {
                let writer = self.writer(line.task);
                if f.contains_key("limit") {
                    self.push("dirty", "pages", t, f.get("dirty").copied());
                    self.push("setpoint", "pages", t, f.get("setpoint").copied());
                    self.push("limit", "pages", t, f.get("limit").copied());
                    let values: Vec<(&str, f64)> = ["dirty", "setpoint", "limit"]
                        .into_iter()
                        .filter_map(|key| Some((key, *f.get(key)?)))
                        .collect();
                    json.counter(1, "dirty pages", ts_us, &values)?;
                }
                let pause_ms = f.get("pause").copied().unwrap_or(0.0);
                if pause_ms > 0.0 {
                    self.pauses.push((t, pause_ms, writer));
                    json.complete(
                        1,
                        writer + 2,
                        "pause",
                        "balance_dirty_pages",
                        ts_us,
                        pause_ms * 1e3,
                        &[],
                    )?;
                }
            }
            "global_dirty_state" => {
                let page = |key| f.get(key).copied().unwrap_or(0.0);
                let dirty = page("dirty") + page("writeback") + page("unstable");
                self.push("dirty", "pages", t, Some(dirty));
                self.push("writeback", "pages", t, f.get("writeback").copied());
                self.push("bg_thresh", "pages", t, f.get("bg_thresh").copied());
                self.push("limit", "pages", t, f.get("limit").copied());
                json.counter(
                    1,
                    "dirty pages",
                    ts_us,
                    &[("dirty", dirty), ("limit", page("limit"))],
                )?;
            }
            "bdi_dirty_ratelimit" => {
                self.push("dirty_ratelimit", "KB/s", t, f.get("dirty_ratelimit").copied());
                self.push("write_bw", "KB/s", t, f.get("write_bw").copied());
                self.push("avg_write_bw", "KB/s", t, f.get("awrite_bw").copied());
            }
            "wbt_step" => {
                self.push("wbt_max_depth", "requests", t, f.get("max").copied());
                self.push("wbt_background", "requests", t, f.get("background").copied());
            }
            "wbt_stat" if f.get("rsamples").is_some_and(|&n| n > 0.0) => {
                self.push("wbt_read_min_us", "us", t, f.get("rmin").map(|ns| ns / 1e3));
            }
            "writeback_single_inode" => {
                let wrote = f.get("wrote").copied().unwrap_or(0.0) as u64;
                let bucket = (u64::BITS - wrote.leading_zeros()) as usize;
                if self.writepages_sizes.len() <= bucket {
                    self.writepages_sizes.resize(bucket + 1, 0);
                }
                self.writepages_sizes[bucket] += 1;
                json.instant(
                    1,
                    1,
                    "writepages",
                    "writeback",
                    ts_us,
                    &[("wrote", ArgValue::UInt(wrote))],
                )?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The run, as the simulator's charts take it.
    fn result(self, name: &str) -> RunResult {
        let thin = |points: Vec<(f64, f64)>| {
            let step = points.len().div_ceil(POINTS_MAX).max(1);
            points.into_iter().step_by(step).collect::<Vec<_>>()
        };
        // A tracepoint says when a value changed (wbt's limits, the ratelimit): it holds until
        // the next one, so each series is drawn on to the end of the trace.
        let end = self.last_seconds;
        let held = |mut points: Vec<(f64, f64)>| {
            if let Some(&(at, value)) = points.last()
                && at < end
            {
                points.push((end, value));
            }
            points
        };
        let series: Vec<TimeSeries> = self
            .series
            .into_iter()
            .map(|(name, (unit, points))| TimeSeries {
                name: name.into(),
                unit: unit.into(),
                points: held(thin(points)),
            })
            .collect();
        let pauses = SampleStats::new(self.pauses.iter().map(|&(_, ms, _)| ms).collect());
        let mut metrics = BTreeMap::from([
            ("tracepoints".to_owned(), self.lines as f64),
            ("lines_skipped".to_owned(), self.skipped as f64),
            ("elapsed_s".to_owned(), self.last_seconds),
            ("writers".to_owned(), self.writers.len() as f64),
            ("pause_count".to_owned(), pauses.count() as f64),
        ]);
        if !pauses.is_empty() {
            metrics.extend(pauses.metrics("pause_ms"));
        }
        RunResult {
            name: name.to_owned(),
            metrics,
            series,
            pauses: self.pauses,
            writepages_sizes: self.writepages_sizes,
            ..RunResult::default()
        }
    }
}

/// What [`write_trace_report`] wrote.
#[derive(Debug)]
pub struct TraceReport {
    /// The run as read from the trace (its series, pauses and metrics).
    pub result: RunResult,
    /// The files written, `report.html` first.
    pub files: Vec<PathBuf>,
}

/// Reads the trace at `trace` and writes `report.html`, its charts and `trace.json` into `out`
/// (created if missing). Errors: the trace cannot be read or holds no tracepoint line, or a
/// file cannot be written.
pub fn write_trace_report(trace: &Path, out: &Path) -> Result<TraceReport, ReportError> {
    let read_error = |source| ReportError::Read { path: trace.to_owned(), source };
    let file = std::fs::File::open(trace).map_err(read_error)?;
    std::fs::create_dir_all(out)
        .map_err(|source| ReportError::Write { path: out.to_owned(), source })?;
    let json_path = out.join("trace.json");
    let mut json = ChromeTrace::create(&json_path)?;
    json.process_name(1, &trace.display().to_string())?;
    json.thread_name(1, 1, "flusher")?;
    let mut collector = Collector::default();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(read_error)?;
        match parse_line(&line) {
            Some(parsed) => collector.take(&parsed, &mut json)?,
            None => collector.skipped += 1,
        }
    }
    if collector.lines == 0 {
        let message = format!(
            "no tracepoint line (TASK [CPU] SECONDS: tracepoint: fields) among {} lines",
            collector.skipped
        );
        return Err(ReportError::Read {
            path: trace.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, message),
        });
    }
    for (index, writer) in collector.writers.clone().iter().enumerate() {
        json.thread_name(1, index as u32 + 2, writer)?;
    }
    json.finish()?;
    let name = trace.file_name().map_or("trace".into(), |n| n.to_string_lossy().into_owned());
    let result = collector.result(&name);
    let mut files = vec![out.join("report.html"), json_path];
    let mut plots = Vec::new();
    for (file, chart) in charts(&result, ThrottlePolicy::Ioless) {
        render_png(&chart, &out.join(file), CHART_WIDTH, CHART_HEIGHT)?;
        plots.push(PlotRef { caption: chart.title.clone(), path: file.to_owned() });
        files.push(out.join(file));
    }
    write_html(&page(&name, &result, plots), &files[0])?;
    Ok(TraceReport { result, files })
}

/// The report page of one traced run: its metrics and its charts.
fn page(name: &str, result: &RunResult, plots: Vec<PlotRef>) -> ReportPage {
    // Counts as whole numbers, other figures to three significant digits or so (not `9.000`).
    let rows = result.metrics.iter().map(|(k, v)| vec![k.clone(), format_number(*v)]).collect();
    ReportPage {
        title: format!("ebb trace report: {name}"),
        intro: "The tracepoints of one run (ebb mount --trace, Builder::trace, or a simulated \
                run's trace.txt), drawn as the simulator draws its runs. trace.json beside this \
                page opens in ui.perfetto.dev."
            .to_owned(),
        experiments: vec![ExperimentSection {
            name: name.to_owned(),
            description: "Reading the bandwidth chart: its points come from the \
                          bdi_dirty_ratelimit tracepoint, which ebb (as the kernel) emits only \
                          when a writer's throttle check updates the ratelimit, that is while \
                          dirty data is above the freerun point. While writes only trickle in \
                          there are no such points, and the line joins the last busy figure to \
                          the next one: it shows what the backend could complete when it was \
                          busy, not the rate of the moment (ebb top's written rate shows that)."
                .to_owned(),
            comparisons: Vec::new(),
            tables: vec![Table {
                caption: "figures".into(),
                columns: vec!["metric".into(), "value".into()],
                rows,
            }],
            plots,
            verdict_plot: None,
            reproduces: String::new(),
            own: false,
            shortfall: String::new(),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's lines (the runtime's, the simulator's, trace_pipe's) parse by name; other
    /// lines do not.
    #[test]
    fn tracepoint_lines_parse_by_name() {
        let line = "        writer-3 [000]      1.250000: balance_dirty_pages: bdi=/d limit=900 \
                    setpoint=700 dirty=650 dirtied=32 pause=12 think=-1 cgroup_ino=1";
        let parsed = parse_line(line).expect("a tracepoint line");
        assert_eq!(
            (parsed.task, parsed.seconds, parsed.name),
            ("writer-3", 1.25, "balance_dirty_pages")
        );
        assert_eq!(parsed.fields["limit"], 900.0);
        assert_eq!(parsed.fields["think"], -1.0);
        let wbt = "ebb-flush-0 [000] 2.0: wbt_stat: sda: rmean=1, rmin=5000, rmax=9, rsamples=3, wmean=1, wsamples=2";
        assert_eq!(parse_line(wbt).expect("wbt").fields["rmin"], 5000.0);
        for other in ["# ebb: 3 events not recorded", "", "hello: world", "x [0] nan: a: b=1"] {
            assert_eq!(parse_line(other), None, "{other:?}");
        }
    }

    /// A trace's lines become the simulator's charts, trace.json and report.html; a file with
    /// no tracepoint is refused with its name.
    #[test]
    fn a_trace_file_becomes_a_report() {
        let dir = crate::report::test_dir("trace-file-report");
        let trace = dir.join("run.trace");
        let mut text = String::from("# a comment\n");
        for i in 0..200 {
            let t = i as f64 * 0.01;
            text.push_str(&format!(
                "writer-{w} [000] {t:.6}: balance_dirty_pages: bdi=d limit=1000 setpoint=800 \
                 dirty={d} dirtied=32 pause={p}\n",
                w = i % 2,
                d = 500 + i,
                p = i % 3
            ));
            text.push_str(&format!(
                "ebb-flush-0 [000] {t:.6}: bdi_dirty_ratelimit: bdi=d write_bw=100000 awrite_bw=90000 \
                 dirty_rate=1 dirty_ratelimit=50000 task_ratelimit=1 balanced_dirty_ratelimit=1\n"
            ));
        }
        text.push_str(
            "ebb-flush-0 [000] 2.5: global_dirty_state: dirty=10 writeback=5 unstable=1 \
             bg_thresh=250 thresh=500 limit=600 dirtied=7 written=6\n",
        );
        std::fs::write(&trace, text).expect("write");
        let out = dir.join("out");
        let report = write_trace_report(&trace, &out).expect("report");
        let r = &report.result;
        assert_eq!(r.metrics["tracepoints"], 401.0);
        assert_eq!(r.series("dirty").expect("dirty").points.last(), Some(&(2.5, 16.0)));
        assert_eq!(r.series("bg_thresh").expect("bg_thresh").points, [(2.5, 250.0)]);
        // Values hold until the trace's end (the last line, at 2.5 s).
        assert_eq!(r.series("write_bw").expect("write_bw").points.last(), Some(&(2.5, 100000.0)));
        assert_eq!(r.metrics["lines_skipped"], 1.0);
        assert_eq!(r.metrics["writers"], 2.0);
        assert_eq!(r.pauses.len(), 133, "pauses of 1 and 2 ms, not 0");
        assert_eq!(r.series("limit").expect("limit").points.len(), 201, "200 throttles, 1 sample");
        for file in ["report.html", "trace.json", "dirty.png", "bandwidth.png", "pauses.png"] {
            assert!(out.join(file).exists(), "no {file}: {:?}", report.files);
        }
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("trace.json")).expect("read"))
                .expect("json");
        assert!(json["traceEvents"].as_array().expect("events").len() > 300);
        // Names wrap at underscores (`<wbr>`).
        let html =
            std::fs::read_to_string(out.join("report.html")).expect("html").replace("<wbr>", "");
        assert!(html.contains("dirty.png") && html.contains("pause_ms_p99"), "{html}");
        // Counts read as whole numbers: 133 pauses, not `133.000`.
        assert!(html.contains(">133<") && !html.contains("133.000"), "{html}");
        std::fs::write(&trace, "nothing here\n").expect("write");
        let error = write_trace_report(&trace, &out).expect_err("no tracepoint").to_string();
        assert!(error.contains("run.trace") && error.contains("no tracepoint line"), "{error}");
    }
}
