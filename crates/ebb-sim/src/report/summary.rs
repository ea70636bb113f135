//! `summary.json`: the numbers of one experiment, one entry per run.
//!
//! The shape is a contract that checks and the report rely on (product brief, "summary.json"):
//!
//! ```text
//! {"experiment": "<name>",
//!  "runs": [{"name": "<run>", "config": {...}, "metrics": {"<metric>": <number>, ...}}],
//!  "published": [{"claim": "...", "published": "...", "ours": "...", "ratio": <number|null>,
//!                 "tolerance": "...", "verdict": "reproduced" | "direction-only" |
//!                 "not-reproduced" | "not-compared", "why": "...", ...}],
//!  "verdicts": {"reproduced": <integer>, "direction-only": <integer>, ...}}
//! ```
//!
//! Each `published` entry also carries everything the verdict was computed from
//! (`published_value`: a number or `[low, high]`; `ours_value`; `tolerance`; `kind`, `change`
//! or `level`; a change's `neutral`; the posting's `noise` when it states one; the `checks`
//! the row names and the `failed_checks` among them) and, when there is one, the `analysis` it
//! links to, so a reader (or a test, [`PublishedSummary::rejudge`]) can recompute every verdict
//! from the file alone. `origin` says whose numbers the rows are: `posting` or `ebb` (ebb's own
//! experiment, tallied apart); `quick` whether the runs were shortened.
//!
//! Seeds: every case runs once per seed of `seeds` (the experiment's seed and the ones after
//! it; `ebb reproduce` runs three by default). A run's `metrics` are then each metric's mean
//! over the seeds that measured it, and `metrics_by_seed` lists each seed's own, in `seeds`
//! order; a row's `ours_value` is the median of `ours_values`, ours per seed, which the verdict
//! is computed from (docs/verdicts.md). A one-seed summary has no `metrics_by_seed` and a
//! one-element `ours_values`.
//!
//! Run names are `<case>/<variant>`; metric names carry their unit last (`write_mb_s`,
//! `pause_ms_p99`). Metrics are kept in a `BTreeMap` so the file lists them sorted and two runs
//! with the same numbers give the same bytes.
//!
//! Non-finite metrics: JSON has no NaN or infinity, and serde_json would silently turn them
//! into `null`, which then fails to read back as a number. [`Summary::write_json`] therefore
//! refuses the whole file with [`ReportError::NonFinite`], naming the run and metric. A metric
//! that is undefined for a run (a pause mean with no pauses) should be left out of the map.
//!
//! Reading ignores fields it does not know, so files from a newer ebb with extra fields
//! still load.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::experiment::verdict::Judgement;
use crate::experiment::{PublishedValue, Rule, Tolerance, Verdict, judge};
use crate::report::ReportError;

/// The contents of one experiment's `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The experiment's name, the file stem of its TOML (`ioless-throttling`).
    pub experiment: String,
    /// `posting` (the rows are a posting's numbers) or `ebb` (ebb's own experiment).
    #[serde(default = "posting")]
    pub origin: String,
    /// Whether the runs were shortened (`--quick`).
    #[serde(default)]
    pub quick: bool,
    /// The global seeds every case ran with, in order (absent in older files: one seed).
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// One entry per run, in the order the experiment ran them.
    pub runs: Vec<RunSummary>,
    /// The posting's numbers, ours, and the verdict on each.
    #[serde(default)]
    pub published: Vec<PublishedSummary>,
    /// How many published rows got each verdict (every verdict listed, zeros included).
    #[serde(default)]
    pub verdicts: BTreeMap<Verdict, u64>,
}

/// One published number beside ours, with its verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishedSummary {
    /// What the posting claims.
    pub claim: String,
    /// The posting's figure, as text.
    pub published: String,
    /// The posting's line it is read from, verbatim, when the experiment gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<String>,
    /// Ours, as text.
    pub ours: String,
    /// The posting's number compared (absent: not compared).
    pub published_value: Option<PublishedValue>,
    /// Our number compared: the median of `ours_values`.
    pub ours_value: Option<f64>,
    /// Ours per seed, in the order of the summary's `seeds` (absent in older files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ours_values: Vec<f64>,
    /// Ours over the posting's (nearest bound of a range).
    pub ratio: Option<f64>,
    /// `x2` (a factor), `+-3` (a distance) or `range`, empty when not compared.
    pub tolerance: String,
    /// `change` (with `neutral`) or `level`; absent when not compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A change's neutral point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neutral: Option<f64>,
    /// The posting's own noise on the number, when it states one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<f64>,
    /// The checks the row names.
    #[serde(default)]
    pub checks: Vec<String>,
    /// Those of them that failed.
    #[serde(default)]
    pub failed_checks: Vec<String>,
    /// The computed verdict.
    pub verdict: Verdict,
    /// Why, when not reproduced.
    pub why: String,
    /// Where the analysis is, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<String>,
}

fn posting() -> String {
    "posting".to_owned()
}

impl PublishedSummary {
    /// The rule the row was judged by, rebuilt from the file's fields (`None`: not compared).
    pub fn rule(&self) -> Result<Option<Rule>, String> {
        let Some(value) = self.published_value else { return Ok(None) };
        let tolerance = Tolerance::parse(&self.tolerance)?;
        let neutral = match self.kind.as_deref() {
            Some("change") => Some(self.neutral.ok_or("a change without neutral")?),
            Some("level") => None,
            other => return Err(format!("kind {other:?}")),
        };
        Ok(Some(Rule { value, tolerance, neutral, noise: self.noise }))
    }

    /// Judges the row again from the file's fields alone: ours per seed (`ours_values`, or
    /// `ours_value` alone in a file without them).
    pub fn rejudge(&self) -> Result<Judgement, String> {
        let rule = self.rule()?;
        let single: Vec<f64> = self.ours_value.into_iter().collect();
        let values = if self.ours_values.is_empty() { &single } else { &self.ours_values };
        let ours =
            if values.is_empty() { Err("no ours_value".to_owned()) } else { Ok(values.as_slice()) };
        Ok(judge(rule.as_ref(), ours, &self.failed_checks))
    }
}

/// Counts of each verdict over `rows`, every verdict present.
pub fn count_verdicts<'a>(rows: impl IntoIterator<Item = &'a Verdict>) -> BTreeMap<Verdict, u64> {
    let mut counts: BTreeMap<Verdict, u64> = Verdict::ALL.iter().map(|v| (*v, 0)).collect();
    for verdict in rows {
        *counts.entry(*verdict).or_default() += 1;
    }
    counts
}

/// One run of an experiment: its configuration and what it measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// `<case>/<variant>`, e.g. `sata/ioless`.
    pub name: String,
    /// The effective configuration of the run, as the experiment wants to show it.
    pub config: serde_json::Value,
    /// Metric name (unit last) to value; every value must be finite. Over several seeds, each
    /// metric's mean over the seeds that measured it.
    pub metrics: BTreeMap<String, f64>,
    /// Each seed's metrics, in the order of the summary's `seeds`, when there are several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics_by_seed: Vec<BTreeMap<String, f64>>,
}

impl Summary {
    /// Writes the summary as pretty-printed JSON followed by a newline, replacing `path`.
    ///
    /// Fails with [`ReportError::NonFinite`] before touching the file if any metric is NaN
    /// or infinite.
    pub fn write_json(&self, path: &Path) -> Result<(), ReportError> {
        self.check_finite(path)?;
        let file = File::create(path)
            .map_err(|source| ReportError::Write { path: path.to_owned(), source })?;
        let mut out = BufWriter::new(file);
        serde_json::to_writer_pretty(&mut out, self).map_err(|source| {
            if source.is_io() {
                ReportError::Write { path: path.to_owned(), source: source.into() }
            } else {
                ReportError::Json { path: path.to_owned(), source }
            }
        })?;
        out.write_all(b"\n")
            .and_then(|()| out.flush())
            .map_err(|source| ReportError::Write { path: path.to_owned(), source })
    }

    /// Reads a summary written by [`Summary::write_json`] (or by hand in the same shape).
    pub fn read_json(path: &Path) -> Result<Summary, ReportError> {
        let file = File::open(path)
            .map_err(|source| ReportError::Read { path: path.to_owned(), source })?;
        serde_json::from_reader(BufReader::new(file)).map_err(|source| {
            if source.is_io() {
                ReportError::Read { path: path.to_owned(), source: source.into() }
            } else {
                ReportError::Json { path: path.to_owned(), source }
            }
        })
    }

    /// The run named `name`, if the experiment has one.
    pub fn run(&self, name: &str) -> Option<&RunSummary> {
        self.runs.iter().find(|run| run.name == name)
    }

    fn check_finite(&self, path: &Path) -> Result<(), ReportError> {
        for run in &self.runs {
            for (metric, &value) in run.metrics.iter().chain(run.metrics_by_seed.iter().flatten()) {
                if !value.is_finite() {
                    return Err(ReportError::NonFinite {
                        path: path.to_owned(),
                        field: format!("runs[{:?}].metrics[{metric:?}]", run.name),
                        value,
                    });
                }
            }
        }
        Ok(())
    }
}

impl RunSummary {
    /// The value of `metric`, if this run measured it.
    pub fn metric(&self, metric: &str) -> Option<f64> {
        self.metrics.get(metric).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Summary {
        let mut metrics = BTreeMap::new();
        metrics.insert("write_mb_s".to_owned(), 97.25);
        metrics.insert("pause_count".to_owned(), 1200.0);
        metrics.insert("pause_ms_p99".to_owned(), 0.1);
        Summary {
            experiment: "ioless-throttling".to_owned(),
            origin: "posting".to_owned(),
            quick: false,
            seeds: vec![1],
            runs: vec![
                RunSummary {
                    name: "sata/ioless".to_owned(),
                    config: serde_json::json!({"throttle": "ioless", "memory_mb": 4096}),
                    metrics: metrics.clone(),
                    metrics_by_seed: Vec::new(),
                },
                RunSummary {
                    name: "sata/legacy".to_owned(),
                    config: serde_json::json!({"throttle": "legacy"}),
                    metrics: BTreeMap::new(),
                    metrics_by_seed: Vec::new(),
                },
            ],
            published: vec![PublishedSummary {
                claim: "pause, before".to_owned(),
                published: "0 .. 324 ms".to_owned(),
                line: None,
                ours: "0 .. 1219 ms".to_owned(),
                published_value: Some(PublishedValue::Single(324.0)),
                ours_value: Some(1219.0),
                ours_values: vec![1219.0],
                ratio: Some(1219.0 / 324.0),
                tolerance: "x2".to_owned(),
                kind: Some("level".to_owned()),
                neutral: None,
                noise: None,
                checks: Vec::new(),
                failed_checks: Vec::new(),
                verdict: Verdict::NotReproduced,
                why: "outside x2".to_owned(),
                analysis: Some("docs/throttling.md#pauses".to_owned()),
            }],
            verdicts: count_verdicts(&[Verdict::NotReproduced]),
        }
    }

    #[test]
    fn round_trip_preserves_everything() {
        // Goal: what write_json writes, read_json gives back unchanged, floats included.
        let dir = crate::report::test_dir("summary-round-trip");
        let path = dir.join("summary.json");
        let summary = example();
        summary.write_json(&path).expect("write");
        let back = Summary::read_json(&path).expect("read");
        assert_eq!(back, summary);
        assert_eq!(back.run("sata/ioless").and_then(|r| r.metric("pause_ms_p99")), Some(0.1));
        assert_eq!(back.run("nope"), None);
        // The row is judged again from the file alone, to the same verdict.
        assert_eq!(back.published[0].rejudge().expect("rule").verdict, Verdict::NotReproduced);
    }

    #[test]
    fn file_has_the_contract_shape() {
        // Goal: the file is exactly {"experiment", "runs": [{"name", "config", "metrics"}]},
        // checked by parsing it as untyped JSON.
        let dir = crate::report::test_dir("summary-shape");
        let path = dir.join("summary.json");
        example().write_json(&path).expect("write");
        let text = std::fs::read_to_string(&path).expect("read back");
        assert!(text.ends_with("}\n"));
        let value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let top = value.as_object().expect("object");
        assert_eq!(
            top.keys().collect::<Vec<_>>(),
            ["experiment", "origin", "published", "quick", "runs", "seeds", "verdicts"]
        );
        assert_eq!(top["published"][0]["kind"], "level");
        assert_eq!(top["verdicts"]["not-reproduced"].as_u64(), Some(1));
        assert_eq!(top["verdicts"]["reproduced"].as_u64(), Some(0));
        assert_eq!(top["published"][0]["verdict"], "not-reproduced");
        assert_eq!(top["published"][0]["published_value"].as_f64(), Some(324.0));
        assert_eq!(top["experiment"], "ioless-throttling");
        let run = &top["runs"][0];
        let keys: Vec<_> = run.as_object().expect("run object").keys().collect();
        assert_eq!(keys, ["config", "metrics", "name"]); // serde_json::Map sorts keys.
        assert_eq!(run["name"], "sata/ioless");
        assert_eq!(run["config"]["memory_mb"], 4096);
        assert_eq!(run["metrics"]["write_mb_s"].as_f64(), Some(97.25));
        assert!(run["metrics"]["pause_count"].is_number());
        // Field order in the file follows the contract, not the alphabet.
        let experiment_at = text.find("\"experiment\"").expect("experiment key");
        let runs_at = text.find("\"runs\"").expect("runs key");
        assert!(experiment_at < runs_at);
    }

    #[test]
    fn non_finite_metric_is_an_error_naming_it() {
        // Goal: a NaN metric is refused (not written as null), and no file is created.
        let dir = crate::report::test_dir("summary-non-finite");
        let path = dir.join("summary.json");
        let mut summary = example();
        summary.runs[1].metrics.insert("read_lat_us_max".to_owned(), f64::INFINITY);
        let error = summary.write_json(&path).expect_err("must refuse");
        let text = error.to_string();
        assert!(text.contains("sata/legacy"), "{text}");
        assert!(text.contains("read_lat_us_max"), "{text}");
        assert!(!path.exists());
    }

    #[test]
    fn read_errors_name_the_file() {
        // Goal: reading a missing or malformed file reports the path.
        let dir = crate::report::test_dir("summary-read-errors");
        let missing = dir.join("missing.json");
        let error = Summary::read_json(&missing).expect_err("missing");
        assert!(matches!(error, ReportError::Read { .. }));
        assert!(error.to_string().contains("missing.json"));
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{\"experiment\": 3}").expect("write bad");
        let error = Summary::read_json(&bad).expect_err("malformed");
        assert!(matches!(error, ReportError::Json { .. }));
        assert!(error.to_string().contains("bad.json"));
        let extra = dir.join("extra.json");
        std::fs::write(&extra, r#"{"experiment": "e", "seed": 7, "runs": []}"#).expect("write");
        assert_eq!(Summary::read_json(&extra).expect("extra field ignored").experiment, "e");
    }
}
