//! Experiment files: the TOML that describes one published result to reproduce, and its
//! expansion into [`RunSpec`]s.
//!
//! An experiment compares the values of one knob (`compare`, its `variants`; any knob of the
//! registry, `ebb_core::config::knobs`) on one or more cases (memory, devices, engine knobs,
//! workloads). Every case runs once per variant, and
//! each run is named `<case>/<variant>` (product brief, "summary.json"). The file also carries
//! what the posting published (`[[published]]`) and what must hold in ours (`[[check]]`), as
//! data, so the report and the test suite judge every experiment the same way.
//!
//! ```toml
//! title = "IO-less dirty throttling"
//! description = "dd 10 GiB to a 2010 SATA disk with 4 GiB of memory."
//! reproduces = "000_43a84c2805ae2347.txt: Wu Fengguang, IO-less balance_dirty_pages(), 2010"
//! compare = "throttle"                      # any knob: throttle, wbt, dirty_ratio, ...
//! variants = ["legacy", "bandwidth-2010", "ioless"]
//! seed = 1                                  # optional; `ebb sim --seed` replaces it
//!
//! [[case]]
//! name = "sata"
//! memory = "4GiB"
//! time_limit = "400s"
//! steady_from = "20s"                       # optional, default 0s
//! sample_interval = "100ms"                 # optional, default 100ms
//! settle_within = 0.1                       # optional: report bw_settle_s, ratelimit_settle_s
//! knobs = { hz = 250, nr_cpus = 4, dirty_ratio = 20 }   # any global knob of the registry,
//! # e.g. zone_bounds_bytes = ["16MiB", "4GiB"], kswapd_scan_ns = 2000
//!
//! [[case.backend]]
//! name = "sda"
//! device = "sata-2010"                      # a device::MODEL_NAMES entry
//! device_overrides = { transfer_mb_per_s = 80.0 }   # optional
//! # optional: any per-backend knob of the registry (max_ratio, wbt_lat_usec, queue_depth, ...)
//!
//! [[case.workload]]
//! kind = "dd"                               # dd | cp | randread | fsmark | mmap-strm | anon-churn
//! backend = "sda"                           # optional when the case has one backend
//! size = "10GiB"
//! bs = "1MiB"
//! start = "0s"                              # optional; dd also takes fsync and think
//! # fsmark: threads, file_size; mmap-strm: mix, chunk; anon-churn: hold, period
//! # (crate::memload). A backend with `swap = true` receives swapped-out anonymous pages.
//!
//! [quick]                                   # what --quick and the tests change
//! size_scale = 0.2
//! time_limit = "120s"
//!
//! [[check]]
//! id = "ioless-steady"
//! what = "ioless pauses are steady"
//! left = "sata/ioless:pause_ms_stddev"
//! op = "<="
//! right = "0.25 * sata/ioless:pause_ms_mean"
//!
//! [[published]]
//! claim = "pause per throttle call, after"
//! published = "~32 ms, steady"
//! ours = "{sata/ioless:pause_ms_mean} ms +- {sata/ioless:pause_ms_stddev} ms"
//! value = 32                                # optional: without it, not compared
//! kind = "level"                            # "level", or "change" with neutral = 1 or 0
//! ours_value = "sata/ioless:pause_ms_mean"
//! tolerance = "x2"                          # "+-3"; a [low, high] value takes none
//! checks = ["ioless-steady"]
//! ```
//!
//! The rules of the verdict are in `verdict.rs` and docs/verdicts.md.
//!
//! # Values
//!
//! Sizes are TOML integers (bytes) or strings with a unit, read by `ebb_core::config::parse_size`
//! (coreutils' convention): `K`, `M`, `G`, `T` in either case, optionally followed by `iB`,
//! are powers of 1024; `KB` (or `kB`), `MB`, `GB`, `TB` powers of 1000; no unit is bytes
//! (`"4GiB"`, `"512M"`, `"1.5GiB"`, `"1000MB"`). Durations are strings with a unit: `ns`,
//! `us`, `ms`, `s`, `min` (`"10s"`, `"500ms"`). Knobs keep the kernel's names and units; a
//! knob's value is written as TOML (an integer, a boolean, a string, an array of sizes) or as
//! the text `--knob` takes.
//!
//! # Variants
//!
//! Each variant is a value of the compared knob, applied to every case (a per-backend knob to
//! every backend). Its run-name label is the value itself for a policy (`ioless`,
//! `legacy-2020`), and `<knob>-<value>` otherwise (`wbt-on`, `dirty_ratio-10`); a variant may
//! be written with that prefix. The compared knob cannot also be set by a case.
//!
//! # Faults
//!
//! A case may declare fault windows and a crash (what the swarm's reproducers use):
//!
//! ```toml
//! [[case.fault]]
//! backend = "sda"                           # optional when the case has one backend
//! from = "200ms"
//! until = "2s"                              # optional: the fault lasts forever
//! errno = "EIO"                             # optional: writes completing in the window fail
//! delay = "1500ms"                          # optional: completions arrive this much later
//!
//! [case.crash]                              # optional: the runs end here
//! at = "3s"
//! power_cut = true                          # volatile write caches are lost too
//! ```
//!
//! `errno` is a number or one of the names `faults.rs` lists (EIO, ENOSPC, EROFS, EDQUOT,
//! ETIMEDOUT, ECONNREFUSED, ...).
//!
//! # Check expressions
//!
//! ```text
//! expr    := term (('+' | '-') term)*
//! term    := unary (('*' | '/') unary)*
//! unary   := '-' unary | primary
//! primary := NUMBER | REF | FUNC '(' expr (',' expr)* ')' | '(' expr ')'
//! REF     := RUN ':' METRIC          e.g. sata/ioless:pause_ms_mean
//! FUNC    := min | max | abs
//! ```
//!
//! A check compares two expressions with one of `<`, `<=`, `>`, `>=`, `==`, `!=`. Expressions
//! are parsed into a tree once, at load time, and evaluated over the runs' metrics: there is no
//! way to call anything else. A reference to a run the experiment does not have is a load
//! error; a metric a run did not report, a division by zero or any non-finite value makes the
//! check fail with the reason.
//!
//! # Errors
//!
//! Everything is checked at load time, in both full and quick form: unknown keys, values of
//! the wrong type, bad sizes and durations, knob values [`Config::validate`] refuses, device
//! models and overrides the device module refuses, and checks naming unknown runs. The
//! [`ExperimentError`] names the file, the key (`case[0].workload[1].size`) and the reason.
//!
//! # Code
//!
//! `schema.rs` is the file as written (serde structs); `build.rs` turns it into an
//! [`Experiment`] (variants, published rows, checks), `case.rs` the cases (devices, knobs through
//! the registry) and `workload.rs` their workloads; `units.rs` reads durations (sizes are the
//! core's `ebb_core::config::parse_size`); `expr.rs` is the expression language of checks and
//! `check.rs` the checks, their outcomes and the `ours` templates. A new kind of check is a new
//! field of `RawCheck` and a variant of [`Check`]'s evaluation; a new workload kind is a branch
//! of `workload.rs` and a `Workload` of the run.

mod build;
mod case;
mod check;
mod embedded;
mod error;
mod expr;
mod faults;
mod schema;
#[cfg(test)]
mod tests;
mod units;
pub mod verdict;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ebb_core::config::{Kind, Knob, Setting};
use ebb_core::{Config, ConfigError, Duration};

pub use check::{Check, CheckOutcome, CompareOp, Template, format_number};
pub use embedded::FILES as EMBEDDED_FILES;
pub use error::ExperimentError;
pub use expr::{EvalError, Expr};
pub use faults::{ERRNO_NAMES, errno_name};
pub use units::parse_duration;
pub use verdict::{PublishedValue, Rule, Tolerance, Verdict, judge};

use crate::run::{Crash, DeviceSpec, Fault, RunSpec, Workload};
use case::is_plain_name;
use case::knob_text;

/// Seed used when the file names none.
const DEFAULT_SEED: u64 = 1;
/// Time series interval when the case names none.
const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// A loaded, fully validated experiment.
#[derive(Clone, Debug)]
pub struct Experiment {
    /// The file it was read from.
    pub path: PathBuf,
    /// The experiment's name: the file stem (`ioless-throttling`).
    pub name: String,
    /// One-line title for the report.
    pub title: String,
    /// What is run and why.
    pub description: String,
    /// The posting it reproduces.
    pub reproduces: String,
    /// ebb's own experiment (file `origin = "ebb"`): its rows are not a posting's numbers and
    /// are tallied apart.
    pub own: bool,
    /// The knob whose values are compared.
    pub compare: &'static Knob,
    /// The values compared, in file order.
    pub variants: Vec<Variant>,
    /// The global seed (file `seed`, default 1).
    pub seed: u64,
    /// The cases, in file order.
    pub cases: Vec<Case>,
    /// How `--quick` shortens the runs.
    pub quick: Quick,
    /// Published results shown beside ours.
    pub published: Vec<Published>,
    /// What must hold.
    pub checks: Vec<Check>,
    /// The posting's percentile points, drawn beside ours.
    pub references: Vec<Reference>,
}

/// The posting's read-latency percentiles for one run of ours (`<case>/<variant>`).
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    /// The run they are drawn beside.
    pub run: String,
    /// Legend text, e.g. "posting, wbt off".
    pub label: String,
    /// (percentile, microseconds), as published.
    pub read_latency_us: Vec<(f64, f64)>,
}

/// One value of the compared knob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    /// The run-name component (`ioless`, `wbt-on`, `dirty_ratio-10`).
    pub label: String,
    /// The setting it applies to every case.
    pub setting: Setting,
}

impl Variant {
    /// Parses one variant as written in the file into its label and setting.
    fn parse(knob: &'static Knob, value: &toml::Value) -> Result<Variant, String> {
        let text = knob_text(value)?;
        let prefix = format!("{}-", knob.name);
        let bare = text.strip_prefix(&prefix).unwrap_or(&text);
        let setting = knob.parse(bare).map_err(|error| error.reason)?;
        let names_itself = matches!(knob.kind, Kind::Choice(_)) && !matches!(bare, "on" | "off");
        let label = if names_itself { bare.to_owned() } else { format!("{prefix}{bare}") };
        if !is_plain_name(&label) {
            return Err(format!(
                "{text:?} cannot name a run; variants of {} are single values",
                knob.name
            ));
        }
        Ok(Variant { label, setting })
    }
}

/// One case: everything but the compared knob.
#[derive(Clone, Debug)]
pub struct Case {
    /// The run-name prefix (`sata`).
    pub name: String,
    /// The engine configuration, before the variant is applied.
    pub config: Config,
    /// One device per backend.
    pub devices: Vec<DeviceSpec>,
    /// The workloads, full size.
    pub workloads: Vec<Workload>,
    /// Virtual-time limit.
    pub time_limit: Duration,
    /// Start of the steady state.
    pub steady_from: Duration,
    /// Time series interval.
    pub sample_interval: Duration,
    /// Report the settling of the first backend's estimates within this fraction of its
    /// device's rate (`RunSpec::settle_within`).
    pub settle_within: Option<f64>,
    /// Fault windows (`[[case.fault]]`).
    pub faults: Vec<Fault>,
    /// The crash that ends the runs, if any (`crash`).
    pub crash: Option<Crash>,
}

/// How `--quick` (and the test suite) shortens an experiment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Quick {
    /// Workload sizes are multiplied by this (rounded to whole blocks, at least one block).
    pub size_scale: Option<f64>,
    /// Memory of every case, if replaced.
    pub memory_bytes: Option<u64>,
    /// Time limit of every case, if replaced.
    pub time_limit: Option<Duration>,
    /// Steady-state start of every case, if replaced.
    pub steady_from: Option<Duration>,
}

/// A published result, how ours is shown beside it and how the two are compared.
#[derive(Clone, Debug)]
pub struct Published {
    /// What was published, e.g. "pause per throttle call, before".
    pub claim: String,
    /// The published figure as text.
    pub published: String,
    /// The posting's line the number is read from, verbatim, when the file gives it.
    pub line: Option<String>,
    /// Our figure: text with `{expression}` holes.
    pub ours: Template,
    /// How the row is judged (the posting's number, tolerance, neutral point, noise);
    /// `None`: the row is not compared (the posting gives no number, or `why` says why ours
    /// cannot be set beside it).
    pub rule: Option<Rule>,
    /// Ours, the number compared with the rule's value.
    pub ours_value: Option<Expr>,
    /// Ids of checks that must also hold for `reproduced`.
    pub checks: Vec<String>,
    /// Why ours differs, shown when the row is not reproduced.
    pub why: Option<String>,
    /// Where the analysis is (under `docs/`).
    pub analysis: Option<String>,
}

/// A published row evaluated on our results.
#[derive(Clone, Debug, PartialEq)]
pub struct PublishedOutcome {
    /// What was published.
    pub claim: String,
    /// The published figure.
    pub published: String,
    /// The posting's line the number is read from, when the file gives it.
    pub line: Option<String>,
    /// Our figure, rendered.
    pub ours: String,
    /// The posting's number.
    pub value: Option<PublishedValue>,
    /// Ours, the number compared: the median of [`PublishedOutcome::ours_values`].
    pub ours_value: Option<f64>,
    /// Ours per seed, in seed order (empty when ours has no value).
    pub ours_values: Vec<f64>,
    /// Ours over the value's nearest point.
    pub ratio: Option<f64>,
    /// The tolerance as written (`x2`, `+-3`, `range`), empty when not compared.
    pub tolerance: String,
    /// How the row was judged (`None`: not compared).
    pub rule: Option<Rule>,
    /// The ids of the checks the row names.
    pub checks: Vec<String>,
    /// Those of them that do not hold.
    pub failed_checks: Vec<String>,
    /// The computed verdict.
    pub verdict: Verdict,
    /// Why: the computed reason, then the file's explanation (empty when reproduced).
    pub why: String,
    /// The file's explanation alone, when the row is not reproduced.
    pub explanation: Option<String>,
    /// Where the analysis is.
    pub analysis: Option<String>,
}

impl Published {
    /// Renders ours and judges it against the value, for one seed's runs.
    pub fn evaluate(&self, metrics: &RunMetrics, checks: &[CheckOutcome]) -> PublishedOutcome {
        self.evaluate_seeds(std::slice::from_ref(metrics), metrics, checks)
    }

    /// Renders ours on `mean` (each run's metrics averaged over the seeds) and judges ours
    /// computed on each seed's metrics (`seeds`, one map per seed) on their median, as
    /// [`judge`] says; the rendered text ends with the seeds' spread and median.
    pub fn evaluate_seeds(
        &self,
        seeds: &[RunMetrics],
        mean: &RunMetrics,
        checks: &[CheckOutcome],
    ) -> PublishedOutcome {
        let failed: Vec<String> = self
            .checks
            .iter()
            .filter(|id| {
                !checks.iter().any(|outcome| outcome.id.as_deref() == Some(id) && outcome.pass)
            })
            .cloned()
            .collect();
        let ours_values: Option<Result<Vec<f64>, String>> = self
            .ours_value
            .as_ref()
            .map(|expr| seeds.iter().map(|metrics| expr.eval(metrics).map_err(|e| e.0)).collect());
        let ours_values = ours_values.unwrap_or(Err("no ours_value".to_owned()));
        let judgement =
            judge(self.rule.as_ref(), ours_values.as_deref().map_err(Clone::clone), &failed);
        let ours_values = ours_values.unwrap_or_default();
        let spread = verdict::median_and_spread(&ours_values);
        let mut ours = self.ours.render(mean);
        if let (Some((median, [low, high])), true) = (spread, seeds.len() > 1) {
            ours.push_str(&format!(
                " [{} seeds: {} to {}, median {}]",
                seeds.len(),
                format_number(low),
                format_number(high),
                format_number(median)
            ));
        }
        let mut why = judgement.reason;
        if judgement.verdict != Verdict::Reproduced
            && let Some(explanation) = &self.why
        {
            // A row with no rule but an explanation is not compared for the reason the file
            // gives (the posting may well give a number: a column no case of ours runs).
            if why.is_empty() || self.rule.is_none() {
                why.clear();
                why.push_str(explanation.trim());
            } else {
                // A new sentence after the computed reason.
                why.push_str(". ");
                let mut chars = explanation.trim().chars();
                why.extend(chars.next().map(|first| first.to_ascii_uppercase()));
                why.extend(chars);
            }
        }
        PublishedOutcome {
            claim: self.claim.clone(),
            published: self.published.clone(),
            line: self.line.clone(),
            ours,
            value: self.rule.map(|rule| rule.value),
            ours_value: spread.map(|(median, _)| median),
            ours_values,
            ratio: judgement.ratio,
            tolerance: self.rule.map_or(String::new(), |rule| rule.tolerance.to_string()),
            rule: self.rule,
            checks: self.checks.clone(),
            failed_checks: failed,
            verdict: judgement.verdict,
            why,
            explanation: self
                .why
                .as_ref()
                .filter(|_| judgement.verdict != Verdict::Reproduced)
                .map(|text| text.trim().to_owned()),
            analysis: self.analysis.clone(),
        }
    }
}

/// Metrics of each run: run name to metric name to value.
pub type RunMetrics = BTreeMap<String, BTreeMap<String, f64>>;

/// Options of [`Experiment::runs`].
#[derive(Clone, Debug, Default)]
pub struct ExpandOptions {
    /// Apply the `[quick]` section.
    pub quick: bool,
    /// Replaces the file's global seed.
    pub seed: Option<u64>,
    /// When set, each run traces into `<trace_dir>/<case>/<variant>/` and `config.trace` is on.
    pub trace_dir: Option<PathBuf>,
}

impl Experiment {
    /// Reads and validates the experiment file at `path`.
    pub fn load(path: &Path) -> Result<Experiment, ExperimentError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| ExperimentError::new(path, "", format!("cannot read: {error}")))?;
        Experiment::parse(path, &text)
    }

    /// Reads every `*.toml` file of `dir`, sorted by file name.
    pub fn load_dir(dir: &Path) -> Result<Vec<Experiment>, ExperimentError> {
        let entries = std::fs::read_dir(dir).map_err(|error| {
            ExperimentError::new(dir, "", format!("cannot read the directory: {error}"))
        })?;
        let mut paths = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|error| {
                ExperimentError::new(dir, "", format!("cannot read the directory: {error}"))
            })?;
            let path = entry.path();
            if path.extension().is_some_and(|extension| extension == "toml") && path.is_file() {
                paths.push(path);
            }
        }
        paths.sort();
        if paths.is_empty() {
            return Err(ExperimentError::new(dir, "", "no *.toml experiment files"));
        }
        paths.iter().map(|path| Experiment::load(path)).collect()
    }

    /// Parses and validates `text`; `path` names the file in errors and gives the name.
    pub fn parse(path: &Path, text: &str) -> Result<Experiment, ExperimentError> {
        let raw = schema::deserialize(path, text)?;
        let mut experiment = build::build(path, raw)?;
        experiment.validate_runs()?;
        Ok(experiment)
    }

    /// The run names, `<case>/<variant>`, in run order (cases, then variants, as in the file).
    pub fn run_names(&self) -> Vec<String> {
        self.cases
            .iter()
            .flat_map(|case| self.variants.iter().map(move |v| run_name(&case.name, &v.label)))
            .collect()
    }

    /// The runs of the experiment, in [`Experiment::run_names`] order.
    pub fn runs(&self, options: &ExpandOptions) -> Vec<RunSpec> {
        let seed = options.seed.unwrap_or(self.seed);
        let mut specs = Vec::new();
        for case in &self.cases {
            for variant in &self.variants {
                let name = run_name(&case.name, &variant.label);
                let mut config = case.config.clone();
                variant.setting.apply(&mut config);
                let mut workloads = case.workloads.clone();
                let mut time_limit = case.time_limit;
                let mut steady_from = case.steady_from;
                if options.quick {
                    let quick = &self.quick;
                    if let Some(scale) = quick.size_scale {
                        workloads.iter_mut().for_each(|w| scale_workload(w, scale));
                    }
                    if let Some(memory) = quick.memory_bytes {
                        config.memory_bytes = memory;
                    }
                    time_limit = quick.time_limit.unwrap_or(time_limit);
                    steady_from = quick.steady_from.unwrap_or(steady_from);
                }
                let trace_dir =
                    options.trace_dir.as_ref().map(|dir| dir.join(&case.name).join(&variant.label));
                config.trace = trace_dir.is_some();
                specs.push(RunSpec {
                    seed: run_seed(seed, &case.name),
                    name,
                    config,
                    devices: case.devices.clone(),
                    workloads,
                    time_limit,
                    sample_interval: case.sample_interval,
                    steady_from,
                    settle_within: case.settle_within,
                    trace_dir,
                    faults: case.faults.clone(),
                    crash: case.crash,
                });
            }
        }
        specs
    }

    /// Evaluates every check on `metrics` (one seed's runs), in file order.
    pub fn evaluate_checks(&self, metrics: &RunMetrics) -> Vec<CheckOutcome> {
        self.checks.iter().map(|check| check.evaluate(metrics)).collect()
    }

    /// Evaluates every check on each seed's metrics, in file order: a check holds when it
    /// holds for every seed ([`Check::evaluate_seeds`]).
    pub fn evaluate_checks_seeds(&self, seeds: &[RunMetrics]) -> Vec<CheckOutcome> {
        self.checks.iter().map(|check| check.evaluate_seeds(seeds)).collect()
    }

    /// Renders and judges the published rows over several seeds' metrics
    /// ([`Published::evaluate_seeds`]); `checks` are those of
    /// [`Experiment::evaluate_checks_seeds`].
    pub fn evaluate_published_seeds(
        &self,
        seeds: &[RunMetrics],
        mean: &RunMetrics,
        checks: &[CheckOutcome],
    ) -> Vec<PublishedOutcome> {
        self.published.iter().map(|row| row.evaluate_seeds(seeds, mean, checks)).collect()
    }

    /// Renders the published rows with our figures and judges each; `checks` are the outcomes
    /// of [`Experiment::evaluate_checks`].
    pub fn evaluate_published(
        &self,
        metrics: &RunMetrics,
        checks: &[CheckOutcome],
    ) -> Vec<PublishedOutcome> {
        self.published.iter().map(|row| row.evaluate(metrics, checks)).collect()
    }

    /// Checks every run of both the full and the quick form: the configuration, the devices,
    /// the workloads' backends and the times.
    fn validate_runs(&mut self) -> Result<(), ExperimentError> {
        for quick in [false, true] {
            let prefix = if quick { "quick: " } else { "" };
            let specs = self.runs(&ExpandOptions { quick, seed: None, trace_dir: None });
            for (index, spec) in specs.iter().enumerate() {
                let case_index = index / self.variants.len();
                let variant_index = index % self.variants.len();
                let case_key = format!("case[{case_index}]");
                let error = |key: String, reason: String| {
                    ExperimentError::new(
                        &self.path,
                        key,
                        format!("{prefix}{}: {reason}", spec.name),
                    )
                };
                if let Err(config_error) = spec.config.validate() {
                    let key = config_key(&case_key, variant_index, self.compare, &config_error);
                    return Err(error(key, config_error.reason));
                }
                if spec.steady_from >= spec.time_limit {
                    return Err(error(
                        format!("{case_key}.steady_from"),
                        format!(
                            "steady_from {} s is not before time_limit {} s",
                            spec.steady_from.as_secs_f64(),
                            spec.time_limit.as_secs_f64()
                        ),
                    ));
                }
                for (w, workload) in spec.workloads.iter().enumerate() {
                    if workload.start() >= spec.time_limit {
                        return Err(error(
                            format!("{case_key}.workload[{w}].start"),
                            "starts at or after the time limit".to_owned(),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// `<case>/<variant>`.
pub fn run_name(case: &str, variant: &str) -> String {
    format!("{case}/{variant}")
}

/// The seed of the runs of case `name` under global seed `seed`: FNV-1a of the case name mixed
/// with the seed by splitmix64. Every variant of a case gets the same seed, so the variants see
/// the same device jitter and workload randomness and differ only by the compared knob (a fair
/// before/after comparison). It depends on nothing else, so a case's seed does not change when
/// cases or variants are added, removed or reordered.
pub fn run_seed(seed: u64, name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = seed ^ hash;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Maps a [`ConfigError`]'s knob to the key of the file that set it.
fn config_key(case_key: &str, variant_index: usize, compare: &Knob, error: &ConfigError) -> String {
    let knob = error.knob.as_str();
    if knob == compare.name
        || knob
            .strip_prefix("backends[")
            .is_some_and(|rest| rest.split_once("].").is_some_and(|(_, name)| name == compare.name))
    {
        return format!("variants[{variant_index}]");
    }
    if let Some(rest) = knob.strip_prefix("backends[") {
        return format!("{case_key}.backend[{rest}");
    }
    match knob {
        "memory_bytes" => format!("{case_key}.memory"),
        "backends" => format!("{case_key}.backend"),
        "min_ratio" => format!("{case_key}.backend"),
        _ => format!("{case_key}.knobs.{knob}"),
    }
}

fn scale_workload(workload: &mut Workload, scale: f64) {
    if let Workload::Memory(memory) = workload {
        memory.scale(scale);
        return;
    }
    let (Workload::Dd { size_bytes, bs_bytes, .. } | Workload::Cp { size_bytes, bs_bytes, .. }) =
        workload
    else {
        // A reader's file size does not shorten the run: it reads until the writers finish.
        return;
    };
    let blocks = (*size_bytes as f64 * scale / *bs_bytes as f64).round().max(1.0);
    *size_bytes = blocks as u64 * *bs_bytes;
}
