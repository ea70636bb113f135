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
//! result = "pause per throttle call, after"
//! published = "~32 ms, steady"
//! ours = "{sata/ioless:pause_ms_mean} ms +- {sata/ioless:pause_ms_stddev} ms"
//! checks = ["ioless-steady"]
//! ```
//!
//! # Values
//!
//! Sizes are TOML integers (bytes) or strings with a unit, read by `ebb_core::config::size`
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

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use ebb_core::config::{self, Kind, Knob, Scope, Setting};
use ebb_core::{BackendConfig, Config, ConfigError, Duration};
use serde::Deserialize;

use crate::device::{self, DeviceParams};
use crate::memload::MemoryWorkload;
use crate::run::{DeviceSpec, RunSpec, Workload};

/// Seed used when the file names none.
const DEFAULT_SEED: u64 = 1;
/// Time series interval when the case names none.
const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Errors

/// Why an experiment file was refused: the file, the key and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExperimentError {
    /// The experiment file.
    pub file: PathBuf,
    /// The offending key, e.g. `case[0].workload[1].size`; empty when the file is not TOML.
    pub key: String,
    /// The line of the key in the file, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

impl ExperimentError {
    fn new(file: &Path, key: impl Into<String>, reason: impl Into<String>) -> ExperimentError {
        ExperimentError {
            file: file.to_owned(),
            key: key.into(),
            line: None,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ExperimentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ExperimentError {}

// ---------------------------------------------------------------------------------------------
// The file as written

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: Option<String>,
    title: String,
    description: String,
    reproduces: String,
    compare: String,
    variants: Vec<toml::Value>,
    seed: Option<u64>,
    #[serde(rename = "case")]
    cases: Vec<RawCase>,
    quick: Option<RawQuick>,
    #[serde(default, rename = "published")]
    published: Vec<RawPublished>,
    #[serde(default, rename = "check")]
    checks: Vec<RawCheck>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    memory: toml::Value,
    time_limit: toml::Value,
    steady_from: Option<toml::Value>,
    sample_interval: Option<toml::Value>,
    #[serde(default)]
    knobs: toml::Table,
    #[serde(rename = "backend")]
    backends: Vec<RawBackend>,
    #[serde(rename = "workload")]
    workloads: Vec<RawWorkload>,
}

/// A `[[case.backend]]`: its device, and per-backend knobs by name (checked against the
/// registry when the case is built, so an unknown key is refused there).
#[derive(Deserialize)]
struct RawBackend {
    name: String,
    device: String,
    #[serde(default)]
    device_overrides: toml::Table,
    /// Anonymous memory is swapped out to this backend (at most one per case).
    swap: Option<bool>,
    #[serde(flatten)]
    knobs: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    kind: String,
    backend: Option<String>,
    size: toml::Value,
    bs: Option<toml::Value>,
    start: Option<toml::Value>,
    fsync: Option<bool>,
    think: Option<toml::Value>,
    /// fsmark: writer threads.
    threads: Option<u32>,
    /// fsmark: bytes per file.
    file_size: Option<toml::Value>,
    /// mmap-strm: bytes of the mixed phase; `chunk`: bytes per switch.
    mix: Option<toml::Value>,
    chunk: Option<toml::Value>,
    /// anon-churn: how long each program holds its memory, and the start-to-start period.
    hold: Option<toml::Value>,
    period: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuick {
    size_scale: Option<f64>,
    memory: Option<toml::Value>,
    time_limit: Option<toml::Value>,
    steady_from: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPublished {
    result: String,
    published: String,
    ours: String,
    checks: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    id: Option<String>,
    what: String,
    left: toml::Value,
    op: String,
    right: toml::Value,
}

// ---------------------------------------------------------------------------------------------
// The loaded experiment

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

/// A published result and how ours is shown beside it.
#[derive(Clone, Debug)]
pub struct Published {
    /// What was published, e.g. "pause per throttle call, before".
    pub result: String,
    /// The published figure as text.
    pub published: String,
    /// Our figure: text with `{expression}` holes.
    pub ours: Template,
    /// Ids of the checks that decide whether the result holds in ours.
    pub checks: Vec<String>,
}

/// A published row evaluated on our results.
#[derive(Clone, Debug, PartialEq)]
pub struct PublishedOutcome {
    /// What was published.
    pub result: String,
    /// The published figure.
    pub published: String,
    /// Our figure, rendered.
    pub ours: String,
    /// Whether every check the row names passed.
    pub holds: bool,
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
        let raw = deserialize(path, text)?;
        let mut experiment = build(path, raw)?;
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
                    trace_dir,
                    faults: Vec::new(),
                });
            }
        }
        specs
    }

    /// Evaluates every check on `metrics`, in file order.
    pub fn evaluate_checks(&self, metrics: &RunMetrics) -> Vec<CheckOutcome> {
        self.checks.iter().map(|check| check.evaluate(metrics)).collect()
    }

    /// Renders the published rows with our figures; `checks` are the outcomes of
    /// [`Experiment::evaluate_checks`].
    pub fn evaluate_published(
        &self,
        metrics: &RunMetrics,
        checks: &[CheckOutcome],
    ) -> Vec<PublishedOutcome> {
        self.published
            .iter()
            .map(|row| {
                let holds = row.checks.iter().all(|id| {
                    checks.iter().any(|outcome| outcome.id.as_deref() == Some(id) && outcome.pass)
                });
                PublishedOutcome {
                    result: row.result.clone(),
                    published: row.published.clone(),
                    ours: row.ours.render(metrics),
                    holds,
                }
            })
            .collect()
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

// ---------------------------------------------------------------------------------------------
// Loading

fn deserialize(path: &Path, text: &str) -> Result<RawExperiment, ExperimentError> {
    let table: toml::Table = toml::from_str(text).map_err(|error| {
        let mut e = ExperimentError::new(path, "", format!("not valid TOML: {}", error.message()));
        e.line = error.span().map(|span| line_of(text, span.start));
        e
    })?;
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|error| {
        let key = error.path().to_string();
        let key = if key == "." { String::new() } else { key };
        let message = error.inner().to_string();
        // toml appends "in `a.b`" on its own line; the key says that already.
        let reason = message.lines().next().unwrap_or_default().to_owned();
        let mut e = ExperimentError::new(path, key, reason);
        // Parsing the text directly once more gives the line, which the table has lost.
        if let Err(direct) = toml::from_str::<RawExperiment>(text) {
            e.line = direct.span().map(|span| line_of(text, span.start));
        }
        e
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Turns the raw file into an experiment, checking everything that does not need a run.
fn build(path: &Path, raw: RawExperiment) -> Result<Experiment, ExperimentError> {
    let err = |key: &str, reason: String| Err(ExperimentError::new(path, key, reason));
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
    let name = match raw.name {
        Some(name) if name != stem => {
            return err(
                "name",
                format!("{name:?} differs from the file name {stem:?}; the name is the file stem"),
            );
        }
        Some(name) => name,
        None => stem,
    };
    if !is_plain_name(&name) {
        return err("name", format!("{name:?} is not made of letters, digits, '.', '_' and '-'"));
    }
    let compare = config::knob(&raw.compare).map_err(|error| {
        ExperimentError::new(path, "compare", format!("{:?}: {}", raw.compare, error.reason))
    })?;
    if raw.variants.is_empty() {
        return err("variants", "at least one variant is needed".to_owned());
    }
    let mut variants: Vec<Variant> = Vec::new();
    for (i, value) in raw.variants.iter().enumerate() {
        let variant = Variant::parse(compare, value)
            .map_err(|reason| ExperimentError::new(path, format!("variants[{i}]"), reason))?;
        if variants.iter().any(|v| v.label == variant.label) {
            return err(&format!("variants[{i}]"), format!("{} is listed twice", variant.label));
        }
        variants.push(variant);
    }
    if raw.cases.is_empty() {
        return err("case", "at least one [[case]] is needed".to_owned());
    }
    let mut cases: Vec<Case> = Vec::new();
    for (i, raw_case) in raw.cases.into_iter().enumerate() {
        let case = build_case(path, i, compare, raw_case)?;
        if cases.iter().any(|c| c.name == case.name) {
            return err(&format!("case[{i}].name"), format!("{:?} is used twice", case.name));
        }
        cases.push(case);
    }
    let quick = build_quick(path, raw.quick)?;

    let run_names: Vec<String> = cases
        .iter()
        .flat_map(|case| variants.iter().map(move |v| run_name(&case.name, &v.label)))
        .collect();
    let mut checks: Vec<Check> = Vec::new();
    for (i, raw_check) in raw.checks.into_iter().enumerate() {
        let key = format!("check[{i}]");
        let check = build_check(path, &key, raw_check, &run_names)?;
        if let Some(id) = &check.id
            && checks.iter().any(|c| c.id.as_ref() == Some(id))
        {
            return err(&format!("{key}.id"), format!("{id:?} is used twice"));
        }
        checks.push(check);
    }
    let mut published = Vec::new();
    for (i, row) in raw.published.into_iter().enumerate() {
        let key = format!("published[{i}]");
        let ours = Template::parse(&row.ours)
            .map_err(|reason| ExperimentError::new(path, format!("{key}.ours"), reason))?;
        check_references(path, &format!("{key}.ours"), ours.references(), &run_names)?;
        if row.checks.is_empty() {
            return err(&format!("{key}.checks"), "name at least one check id".to_owned());
        }
        for (j, id) in row.checks.iter().enumerate() {
            if !checks.iter().any(|c| c.id.as_ref() == Some(id)) {
                return err(&format!("{key}.checks[{j}]"), format!("no check has id {id:?}"));
            }
        }
        published.push(Published {
            result: row.result,
            published: row.published,
            ours,
            checks: row.checks,
        });
    }
    Ok(Experiment {
        path: path.to_owned(),
        name,
        title: raw.title,
        description: raw.description,
        reproduces: raw.reproduces,
        compare,
        variants,
        seed: raw.seed.unwrap_or(DEFAULT_SEED),
        cases,
        quick,
        published,
        checks,
    })
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !name.starts_with('.')
}

fn build_case(
    path: &Path,
    index: usize,
    compare: &Knob,
    raw: RawCase,
) -> Result<Case, ExperimentError> {
    let case_key = format!("case[{index}]");
    let key = |field: &str| format!("{case_key}.{field}");
    let fail = |field: &str, reason: String| ExperimentError::new(path, key(field), reason);
    if !is_plain_name(&raw.name) {
        return Err(fail(
            "name",
            format!("{:?} is not made of letters, digits, '.', '_' and '-'", raw.name),
        ));
    }
    let memory_bytes = size_value(&raw.memory).map_err(|reason| fail("memory", reason))?;
    let time_limit = duration_value(&raw.time_limit).map_err(|r| fail("time_limit", r))?;
    let steady_from = match &raw.steady_from {
        Some(value) => duration_value(value).map_err(|r| fail("steady_from", r))?,
        None => Duration::ZERO,
    };
    let sample_interval = match &raw.sample_interval {
        Some(value) => duration_value(value).map_err(|r| fail("sample_interval", r))?,
        None => DEFAULT_SAMPLE_INTERVAL,
    };
    if time_limit == Duration::ZERO {
        return Err(fail("time_limit", "must be positive".to_owned()));
    }
    if sample_interval == Duration::ZERO {
        return Err(fail("sample_interval", "must be positive".to_owned()));
    }
    if raw.backends.is_empty() {
        return Err(fail("backend", "at least one [[case.backend]] is needed".to_owned()));
    }
    if raw.workloads.is_empty() {
        return Err(fail("workload", "at least one [[case.workload]] is needed".to_owned()));
    }

    let mut backends = Vec::new();
    let mut devices = Vec::new();
    for (b, raw_backend) in raw.backends.iter().enumerate() {
        let bkey = |field: &str| format!("backend[{b}].{field}");
        if backends.iter().any(|existing: &BackendConfig| existing.name == raw_backend.name) {
            return Err(fail(&bkey("name"), format!("{:?} is used twice", raw_backend.name)));
        }
        let model = &raw_backend.device;
        let built = device::by_name_with_overrides(model, 0, &raw_backend.device_overrides)
            .map_err(|error| {
                let field = match error {
                    device::DeviceError::UnknownModel { .. } => "device",
                    _ => "device_overrides",
                };
                fail(&bkey(field), error.to_string())
            })?;
        // The device's own command queue depth sizes writeback throttling (blk_queue_depth).
        let (rotational, write_cache, hw_queue_depth) = match built.params() {
            DeviceParams::Disk(p) => (true, p.write_cache_bytes > 0, p.queue_depth),
            DeviceParams::Raid0(p) => {
                (true, p.member.write_cache_bytes > 0, p.member.queue_depth * p.member_count)
            }
            DeviceParams::Flash(p) => (false, p.write_cache_bytes > 0, p.queue_depth),
            // Server memory is no device write cache: the client never flushes it.
            DeviceParams::Nfs(_) => (false, false, 32),
        };
        let mut backend = BackendConfig::new(raw_backend.name.clone());
        if let DeviceParams::Nfs(p) = built.params() {
            // The NFS client assembles WRITE RPCs of up to wsize. It has no block request
            // queue: a writepages call hands every request to the RPC layer at once, whose TCP
            // slot table grows on demand up to 65536 entries (sunrpc's
            // tcp_max_slot_table_entries default), and requests beyond what the link carries
            // wait in the client's transmit queue. Its congestion flag (nfs_congestion_kb) did
            // not end a writepages call in the 2020 kernels (only reclaim looked at it), so it
            // is not modelled.
            backend.max_write_pages = (p.wsize_bytes / ebb_core::PAGE_SIZE) as u32;
            backend.queue_depth = 65_536;
        }
        backend.rotational = rotational;
        backend.write_cache = write_cache;
        backend.hw_queue_depth = hw_queue_depth.max(1);
        for setting in knob_settings(&raw_backend.knobs, Scope::Backend, compare)
            .map_err(|(key, reason)| fail(&bkey(&key), reason))?
        {
            setting.apply_backend(&mut backend).map_err(|e| fail(&bkey(&e.knob), e.reason))?;
        }
        backends.push(backend);
        devices.push(DeviceSpec {
            model: model.clone(),
            overrides: raw_backend.device_overrides.clone(),
        });
    }

    let swaps: Vec<usize> =
        (0..raw.backends.len()).filter(|&b| raw.backends[b].swap == Some(true)).collect();
    if swaps.len() > 1 {
        return Err(fail(&format!("backend[{}].swap", swaps[1]), "a second swap backend".into()));
    }
    let mut backends_iter = backends.into_iter();
    let first = backends_iter.next().expect("at least one backend, checked above");
    let mut config = Config::new(memory_bytes, first);
    config.backends.extend(backends_iter);
    config.swap_backend = swaps.first().copied();
    for setting in knob_settings(&raw.knobs, Scope::Global, compare)
        .map_err(|(key, reason)| fail(&format!("knobs.{key}"), reason))?
    {
        setting.apply(&mut config);
    }

    let mut workloads = Vec::new();
    for (w, raw_workload) in raw.workloads.iter().enumerate() {
        let wkey = format!("workload[{w}]");
        workloads.push(build_workload(
            &raw_workload_ctx(path, &case_key, &wkey),
            raw_workload,
            &config,
        )?);
    }
    Ok(Case {
        name: raw.name,
        config,
        devices,
        workloads,
        time_limit,
        steady_from,
        sample_interval,
    })
}

/// The knobs of a table (a case's `knobs`, or a backend's keys besides its device), parsed by
/// the registry; every key must be a knob of `scope` other than the compared one. Errors give
/// the key and the reason.
fn knob_settings(
    table: &toml::Table,
    scope: Scope,
    compare: &Knob,
) -> Result<Vec<Setting>, (String, String)> {
    let mut settings = Vec::new();
    for (name, value) in table {
        let fail = |reason: String| (name.clone(), reason);
        let knob = config::knob(name).map_err(|error| fail(error.reason))?;
        if knob.scope != scope {
            return Err(fail(match scope {
                Scope::Global => "a per-backend knob: set it in [[case.backend]]".to_owned(),
                Scope::Backend => "a cache knob: set it in the case's knobs".to_owned(),
            }));
        }
        if knob == compare {
            return Err(fail(format!(
                "`{name}` is the compared knob (`compare`); its values come from `variants`"
            )));
        }
        let text = knob_text(value).map_err(fail)?;
        settings.push(knob.parse(&text).map_err(|error| fail(error.reason))?);
    }
    Ok(settings)
}

/// A knob's value as written in TOML, as the text the registry parses.
fn knob_text(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) => {
            let texts = items.iter().map(knob_text).collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join(","))
        }
        other => Err(format!(
            "expected an integer, a boolean, a string or an array, found {}",
            other.type_str()
        )),
    }
}

/// Where a workload sits in the file, for its errors.
struct WorkloadCtx<'a> {
    path: &'a Path,
    key: String,
}

fn raw_workload_ctx<'a>(path: &'a Path, case_key: &str, workload_key: &str) -> WorkloadCtx<'a> {
    WorkloadCtx { path, key: format!("{case_key}.{workload_key}") }
}

fn build_workload(
    ctx: &WorkloadCtx<'_>,
    raw: &RawWorkload,
    config: &Config,
) -> Result<Workload, ExperimentError> {
    let fail = |field: &str, reason: String| {
        ExperimentError::new(ctx.path, format!("{}.{field}", ctx.key), reason)
    };
    let backend = match &raw.backend {
        Some(name) => config.backends.iter().position(|b| &b.name == name).ok_or_else(|| {
            let known: Vec<&str> = config.backends.iter().map(|b| b.name.as_str()).collect();
            fail("backend", format!("no backend named {name:?}; the case has {}", known.join(", ")))
        })?,
        None if config.backends.len() == 1 => 0,
        None => {
            return Err(fail("backend", "the case has several backends; name one".to_owned()));
        }
    };
    let size_bytes = size_value(&raw.size).map_err(|r| fail("size", r))?;
    let bs_bytes = match &raw.bs {
        Some(value) => size_value(value).map_err(|r| fail("bs", r))?,
        None => 1 << 20,
    };
    if size_bytes == 0 {
        return Err(fail("size", "must be positive".to_owned()));
    }
    if bs_bytes == 0 || bs_bytes > 1 << 30 {
        return Err(fail("bs", format!("{bs_bytes} bytes is outside 1 byte..1 GiB")));
    }
    let start = match &raw.start {
        Some(value) => duration_value(value).map_err(|r| fail("start", r))?,
        None => Duration::ZERO,
    };
    match raw.kind.as_str() {
        "dd" => {
            let think = match &raw.think {
                Some(value) => duration_value(value).map_err(|r| fail("think", r))?,
                None => Duration::ZERO,
            };
            Ok(Workload::Dd {
                backend,
                size_bytes,
                bs_bytes,
                start,
                fsync: raw.fsync.unwrap_or(false),
                think,
            })
        }
        "cp" => {
            if raw.fsync.is_some() {
                return Err(fail("fsync", "cp takes no fsync; use a dd workload".to_owned()));
            }
            if raw.think.is_some() {
                return Err(fail("think", "cp takes no think time".to_owned()));
            }
            Ok(Workload::Cp { backend, size_bytes, bs_bytes, start })
        }
        "randread" => {
            if raw.fsync.is_some() || raw.think.is_some() {
                return Err(fail("kind", "randread takes no fsync or think time".to_owned()));
            }
            if bs_bytes % 4096 != 0 || size_bytes < bs_bytes {
                return Err(fail(
                    "bs",
                    "randread needs a multiple of 4 KiB no larger than size".to_owned(),
                ));
            }
            Ok(Workload::RandomReader { backend, size_bytes, bs_bytes, start })
        }
        "fsmark" | "mmap-strm" | "anon-churn" => {
            if raw.fsync.is_some() || raw.think.is_some() {
                return Err(fail("kind", format!("{} takes no fsync or think time", raw.kind)));
            }
            let size_of = |field: &str, value: &Option<toml::Value>| match value {
                Some(value) => size_value(value).map_err(|r| fail(field, r)),
                None => Err(fail(field, format!("{} needs {field}", raw.kind))),
            };
            let duration_of = |field: &str, value: &Option<toml::Value>| match value {
                Some(value) => duration_value(value).map_err(|r| fail(field, r)),
                None => Err(fail(field, format!("{} needs {field}", raw.kind))),
            };
            let memory = match raw.kind.as_str() {
                "fsmark" => MemoryWorkload::FsMark {
                    backend,
                    size_bytes,
                    file_bytes: size_of("file_size", &raw.file_size)?,
                    bs_bytes,
                    threads: raw.threads.unwrap_or(1),
                    start,
                },
                "mmap-strm" => MemoryWorkload::MmapStrm {
                    backend,
                    size_bytes,
                    mix_bytes: size_of("mix", &raw.mix)?,
                    chunk_bytes: size_of("chunk", &raw.chunk)?,
                    bs_bytes,
                    start,
                },
                _ => MemoryWorkload::AnonChurn {
                    size_bytes,
                    hold: duration_of("hold", &raw.hold)?,
                    period: duration_of("period", &raw.period)?,
                    start,
                },
            };
            memory.validate().map_err(|(field, reason)| fail(field, reason))?;
            Ok(Workload::Memory(memory))
        }
        other => Err(fail(
            "kind",
            format!(
                "unknown workload kind {other:?}; expected dd, cp, randread, fsmark, mmap-strm \
                 or anon-churn"
            ),
        )),
    }
}

fn build_quick(path: &Path, raw: Option<RawQuick>) -> Result<Quick, ExperimentError> {
    let Some(raw) = raw else { return Ok(Quick::default()) };
    let fail =
        |field: &str, reason: String| ExperimentError::new(path, format!("quick.{field}"), reason);
    if let Some(scale) = raw.size_scale
        && !(scale > 0.0 && scale <= 1.0)
    {
        return Err(fail("size_scale", format!("{scale} is outside (0, 1]")));
    }
    let memory_bytes = match &raw.memory {
        Some(value) => Some(size_value(value).map_err(|r| fail("memory", r))?),
        None => None,
    };
    let time_limit = match &raw.time_limit {
        Some(value) => Some(duration_value(value).map_err(|r| fail("time_limit", r))?),
        None => None,
    };
    let steady_from = match &raw.steady_from {
        Some(value) => Some(duration_value(value).map_err(|r| fail("steady_from", r))?),
        None => None,
    };
    if time_limit == Some(Duration::ZERO) {
        return Err(fail("time_limit", "must be positive".to_owned()));
    }
    Ok(Quick { size_scale: raw.size_scale, memory_bytes, time_limit, steady_from })
}

fn build_check(
    path: &Path,
    key: &str,
    raw: RawCheck,
    run_names: &[String],
) -> Result<Check, ExperimentError> {
    let fail =
        |field: &str, reason: String| ExperimentError::new(path, format!("{key}.{field}"), reason);
    if let Some(id) = &raw.id
        && !is_plain_name(id)
    {
        return Err(fail("id", format!("{id:?} is not made of letters, digits, '.', '_' and '-'")));
    }
    let op = CompareOp::parse(&raw.op).ok_or_else(|| {
        fail("op", format!("unknown operator {:?}; expected <, <=, >, >=, == or !=", raw.op))
    })?;
    let expr = |field: &str, value: &toml::Value| -> Result<Expr, ExperimentError> {
        let source = match value {
            toml::Value::String(text) => text.clone(),
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(x) => x.to_string(),
            other => {
                return Err(fail(
                    field,
                    format!(
                        "expected an expression (string) or a number, found {}",
                        other.type_str()
                    ),
                ));
            }
        };
        let expr = Expr::parse(&source).map_err(|reason| fail(field, reason))?;
        check_references(path, &format!("{key}.{field}"), expr.references(), run_names)?;
        Ok(expr)
    };
    let left = expr("left", &raw.left)?;
    let right = expr("right", &raw.right)?;
    Ok(Check { id: raw.id, what: raw.what, left, op, right })
}

fn check_references<'a>(
    path: &Path,
    key: &str,
    references: impl IntoIterator<Item = (&'a str, &'a str)>,
    run_names: &[String],
) -> Result<(), ExperimentError> {
    for (run, _metric) in references {
        if !run_names.iter().any(|name| name == run) {
            return Err(ExperimentError::new(
                path,
                key,
                format!("unknown run {run:?}; the runs are {}", run_names.join(", ")),
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sizes and durations

/// A size: a TOML integer (bytes) or a string with a dd-style unit.
fn size_value(value: &toml::Value) -> Result<u64, String> {
    match value {
        toml::Value::Integer(n) => {
            u64::try_from(*n).map_err(|_| format!("{n} is negative; a size must be at least 0"))
        }
        toml::Value::String(text) => config::parse_size(text),
        other => Err(format!(
            "expected a size (bytes, or a string like \"4GiB\"), found {}",
            other.type_str()
        )),
    }
}

fn duration_value(value: &toml::Value) -> Result<Duration, String> {
    match value {
        toml::Value::String(text) => parse_duration(text),
        other => Err(format!(
            "expected a duration string with a unit like \"10s\" or \"500ms\", found {}",
            other.type_str()
        )),
    }
}

/// Splits `"1.5GiB"` into `(1.5, "GiB")`.
fn split_number(text: &str) -> Result<(f64, &str), String> {
    let text = text.trim();
    let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    let value: f64 =
        number.parse().map_err(|_| format!("{text:?} does not start with a number"))?;
    Ok((value, unit.trim()))
}

/// Parses a duration like `10s`, `500ms`, `2min` into a [`Duration`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (value, unit) = split_number(text)?;
    let nanos_per_unit: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "min" => 60e9,
        "" => return Err(format!("{text:?} has no unit; write e.g. \"10s\" or \"500ms\"")),
        _ => {
            return Err(format!(
                "unknown duration unit {unit:?} in {text:?}; use ns, us, ms, s, min"
            ));
        }
    };
    let nanos = value * nanos_per_unit;
    if !nanos.is_finite() || nanos > 1e18 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

// ---------------------------------------------------------------------------------------------
// Expressions

/// A parsed check expression over run metrics; see the module doc for the grammar.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    source: String,
    node: Node,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Number(f64),
    Metric { run: String, metric: String },
    Neg(Box<Node>),
    Binary(BinaryOp, Box<Node>, Box<Node>),
    Call(Func, Vec<Node>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Func {
    Min,
    Max,
    Abs,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Number(f64),
    Metric(String, String),
    Func(Func),
    Op(char),
    Open,
    Close,
    Comma,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

fn tokenize(source: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            if i < chars.len() && matches!(chars[i], 'e' | 'E') {
                let mut j = i + 1;
                if j < chars.len() && matches!(chars[j], '+' | '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let text: String = chars[start..i].iter().collect();
            let value = text.parse().map_err(|_| format!("bad number {text:?}"))?;
            tokens.push(Token::Number(value));
            if i < chars.len() && (chars[i].is_ascii_alphabetic() || chars[i] == ':') {
                return Err(format!(
                    "a number is followed by {:?} at character {}; run names start with a letter",
                    chars[i],
                    i + 1
                ));
            }
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if chars.get(i) == Some(&':') {
                i += 1;
                let metric_start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let metric: String = chars[metric_start..i].iter().collect();
                if metric.is_empty() {
                    return Err(format!("{word}: has no metric name after ':'"));
                }
                if !word.contains('/') {
                    return Err(format!("{word:?} is not a run name <case>/<variant>"));
                }
                tokens.push(Token::Metric(word, metric));
            } else {
                let func = match word.as_str() {
                    "min" => Func::Min,
                    "max" => Func::Max,
                    "abs" => Func::Abs,
                    _ => {
                        return Err(format!(
                            "{word:?} is neither a reference <case>/<variant>:<metric> nor one of \
                             the functions min, max, abs"
                        ));
                    }
                };
                tokens.push(Token::Func(func));
            }
        } else {
            tokens.push(match c {
                '+' | '-' | '*' | '/' => Token::Op(c),
                '(' => Token::Open,
                ')' => Token::Close,
                ',' => Token::Comma,
                _ => return Err(format!("unexpected {c:?} at character {}", i + 1)),
            });
            i += 1;
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn expr(&mut self, depth: usize) -> Result<Node, String> {
        if depth > 64 {
            return Err("expression nested too deeply".to_owned());
        }
        let mut node = self.term(depth)?;
        while let Some(Token::Op(op @ ('+' | '-'))) = self.peek() {
            let op = if *op == '+' { BinaryOp::Add } else { BinaryOp::Sub };
            self.at += 1;
            let right = self.term(depth)?;
            node = Node::Binary(op, Box::new(node), Box::new(right));
        }
        Ok(node)
    }

    fn term(&mut self, depth: usize) -> Result<Node, String> {
        let mut node = self.unary(depth)?;
        while let Some(Token::Op(op @ ('*' | '/'))) = self.peek() {
            let op = if *op == '*' { BinaryOp::Mul } else { BinaryOp::Div };
            self.at += 1;
            let right = self.unary(depth)?;
            node = Node::Binary(op, Box::new(node), Box::new(right));
        }
        Ok(node)
    }

    fn unary(&mut self, depth: usize) -> Result<Node, String> {
        if self.peek() == Some(&Token::Op('-')) {
            self.at += 1;
            if depth > 64 {
                return Err("expression nested too deeply".to_owned());
            }
            return Ok(Node::Neg(Box::new(self.unary(depth + 1)?)));
        }
        self.primary(depth)
    }

    fn primary(&mut self, depth: usize) -> Result<Node, String> {
        match self.next() {
            Some(Token::Number(value)) => Ok(Node::Number(value)),
            Some(Token::Metric(run, metric)) => Ok(Node::Metric { run, metric }),
            Some(Token::Open) => {
                let node = self.expr(depth + 1)?;
                self.expect_close()?;
                Ok(node)
            }
            Some(Token::Func(func)) => {
                if self.next() != Some(Token::Open) {
                    return Err("a function name must be followed by '('".to_owned());
                }
                let mut args = vec![self.expr(depth + 1)?];
                while self.peek() == Some(&Token::Comma) {
                    self.at += 1;
                    args.push(self.expr(depth + 1)?);
                }
                self.expect_close()?;
                if func == Func::Abs && args.len() != 1 {
                    return Err(format!("abs takes one argument, not {}", args.len()));
                }
                Ok(Node::Call(func, args))
            }
            Some(token) => Err(format!("unexpected {}", describe(&token))),
            None => Err("the expression ends too early".to_owned()),
        }
    }

    fn expect_close(&mut self) -> Result<(), String> {
        match self.next() {
            Some(Token::Close) => Ok(()),
            Some(token) => Err(format!("expected ')', found {}", describe(&token))),
            None => Err("missing ')'".to_owned()),
        }
    }
}

fn describe(token: &Token) -> String {
    match token {
        Token::Number(value) => format!("number {value}"),
        Token::Metric(run, metric) => format!("reference {run}:{metric}"),
        Token::Func(_) => "function name".to_owned(),
        Token::Op(op) => format!("'{op}'"),
        Token::Open => "'('".to_owned(),
        Token::Close => "')'".to_owned(),
        Token::Comma => "','".to_owned(),
    }
}

/// Why an expression has no value on a set of results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalError(pub String);

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EvalError {}

impl Expr {
    /// Parses `source`; the error says what is wrong.
    pub fn parse(source: &str) -> Result<Expr, String> {
        let tokens = tokenize(source).map_err(|reason| format!("in {source:?}: {reason}"))?;
        if tokens.is_empty() {
            return Err("empty expression".to_owned());
        }
        let mut parser = Parser { tokens, at: 0 };
        let node = parser.expr(0).map_err(|reason| format!("in {source:?}: {reason}"))?;
        if let Some(token) = parser.peek() {
            return Err(format!(
                "in {source:?}: unexpected {} after the expression",
                describe(token)
            ));
        }
        let source = source.split_whitespace().collect::<Vec<_>>().join(" ");
        Ok(Expr { source, node })
    }

    /// The text it was parsed from, with each run of white space made one space.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every `(run, metric)` the expression reads, in order of appearance.
    pub fn references(&self) -> Vec<(&str, &str)> {
        fn walk<'a>(node: &'a Node, out: &mut Vec<(&'a str, &'a str)>) {
            match node {
                Node::Number(_) => {}
                Node::Metric { run, metric } => out.push((run, metric)),
                Node::Neg(inner) => walk(inner, out),
                Node::Binary(_, left, right) => {
                    walk(left, out);
                    walk(right, out);
                }
                Node::Call(_, args) => args.iter().for_each(|arg| walk(arg, out)),
            }
        }
        let mut out = Vec::new();
        walk(&self.node, &mut out);
        out
    }

    /// The value on `metrics`; a missing run or metric, or a non-finite intermediate value
    /// (division by zero), is an error.
    pub fn eval(&self, metrics: &RunMetrics) -> Result<f64, EvalError> {
        eval_node(&self.node, metrics)
    }
}

fn eval_node(node: &Node, metrics: &RunMetrics) -> Result<f64, EvalError> {
    let value = match node {
        Node::Number(value) => *value,
        Node::Metric { run, metric } => {
            let run_metrics =
                metrics.get(run).ok_or_else(|| EvalError(format!("no results for run {run}")))?;
            *run_metrics
                .get(metric)
                .ok_or_else(|| EvalError(format!("run {run} has no metric {metric}")))?
        }
        Node::Neg(inner) => -eval_node(inner, metrics)?,
        Node::Binary(op, left, right) => {
            let left = eval_node(left, metrics)?;
            let right = eval_node(right, metrics)?;
            match op {
                BinaryOp::Add => left + right,
                BinaryOp::Sub => left - right,
                BinaryOp::Mul => left * right,
                BinaryOp::Div => {
                    if right == 0.0 {
                        return Err(EvalError(format!("division of {left} by zero")));
                    }
                    left / right
                }
            }
        }
        Node::Call(func, args) => {
            let values =
                args.iter().map(|arg| eval_node(arg, metrics)).collect::<Result<Vec<_>, _>>()?;
            match func {
                Func::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
                Func::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                Func::Abs => values[0].abs(),
            }
        }
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(EvalError(format!("a value is not finite ({value})")))
    }
}

/// A comparison operator of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==` (exact)
    Eq,
    /// `!=`
    Ne,
}

impl CompareOp {
    /// Parses `<`, `<=`, `>`, `>=`, `==`, `!=`.
    pub fn parse(text: &str) -> Option<CompareOp> {
        Some(match text.trim() {
            "<" => CompareOp::Lt,
            "<=" => CompareOp::Le,
            ">" => CompareOp::Gt,
            ">=" => CompareOp::Ge,
            "==" => CompareOp::Eq,
            "!=" => CompareOp::Ne,
            _ => return None,
        })
    }

    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
        }
    }

    /// Whether `left op right`.
    pub fn holds(self, left: f64, right: f64) -> bool {
        match self {
            CompareOp::Lt => left < right,
            CompareOp::Le => left <= right,
            CompareOp::Gt => left > right,
            CompareOp::Ge => left >= right,
            CompareOp::Eq => left == right,
            CompareOp::Ne => left != right,
        }
    }
}

impl fmt::Display for CompareOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// Something that must hold in our results: `left op right`.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// Name for `[[published]]` rows to refer to.
    pub id: Option<String>,
    /// What it means, in words.
    pub what: String,
    /// Left side.
    pub left: Expr,
    /// The comparison.
    pub op: CompareOp,
    /// Right side.
    pub right: Expr,
}

/// A check evaluated on results.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckOutcome {
    /// The check's id.
    pub id: Option<String>,
    /// What it means.
    pub what: String,
    /// `left op right` as written.
    pub expression: String,
    /// The comparison.
    pub op: CompareOp,
    /// The left side's value, if it has one.
    pub left: Option<f64>,
    /// The right side's value, if it has one.
    pub right: Option<f64>,
    /// Whether it holds; false when a side has no value.
    pub pass: bool,
    /// Why a side has no value.
    pub error: Option<String>,
}

impl CheckOutcome {
    /// `left op right` with the values, e.g. `312 > 200`, or the error.
    pub fn values(&self) -> String {
        match (self.left, self.right, &self.error) {
            (Some(left), Some(right), _) => {
                format!("{} {} {}", format_number(left), self.op, format_number(right))
            }
            (_, _, Some(error)) => error.clone(),
            _ => "no value".to_owned(),
        }
    }
}

impl Check {
    /// Evaluates both sides on `metrics` and compares them.
    pub fn evaluate(&self, metrics: &RunMetrics) -> CheckOutcome {
        let left = self.left.eval(metrics);
        let right = self.right.eval(metrics);
        let error = match (&left, &right) {
            (Err(error), _) | (_, Err(error)) => Some(error.0.clone()),
            _ => None,
        };
        let left = left.ok();
        let right = right.ok();
        let pass = match (left, right) {
            (Some(l), Some(r)) => self.op.holds(l, r),
            _ => false,
        };
        CheckOutcome {
            id: self.id.clone(),
            what: self.what.clone(),
            expression: format!("{} {} {}", self.left.source(), self.op, self.right.source()),
            op: self.op,
            left,
            right,
            pass,
            error,
        }
    }
}

/// Text with `{expression}` holes, e.g. `"{sata/legacy:pause_ms_max} ms"`.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    parts: Vec<TemplatePart>,
}

#[derive(Clone, Debug, PartialEq)]
enum TemplatePart {
    Text(String),
    Expr(Expr),
}

impl Template {
    /// Parses `text`; `{` opens an expression that `}` closes; braces do not nest.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest[open..].starts_with('}') {
                return Err(format!("unmatched '}}' in {text:?}"));
            }
            if open > 0 {
                parts.push(TemplatePart::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| format!("unclosed '{{' in {text:?}"))?;
            let inner = &after[..close];
            if inner.contains('{') {
                return Err(format!("nested '{{' in {text:?}"));
            }
            parts.push(TemplatePart::Expr(Expr::parse(inner)?));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Text(rest.to_owned()));
        }
        Ok(Template { parts })
    }

    /// Every `(run, metric)` the holes read.
    pub fn references(&self) -> Vec<(&str, &str)> {
        self.parts
            .iter()
            .flat_map(|part| match part {
                TemplatePart::Text(_) => Vec::new(),
                TemplatePart::Expr(expr) => expr.references(),
            })
            .collect()
    }

    /// The text with each hole replaced by its value ([`format_number`]), or `n/a`.
    pub fn render(&self, metrics: &RunMetrics) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                TemplatePart::Text(text) => out.push_str(text),
                TemplatePart::Expr(expr) => match expr.eval(metrics) {
                    Ok(value) => out.push_str(&format_number(value)),
                    Err(_) => out.push_str("n/a"),
                },
            }
        }
        out
    }
}

/// A number for people: integers as integers, otherwise three significant digits at most
/// one decimal place for values of 10 or more.
pub fn format_number(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    let magnitude = value.abs();
    let text = if (value.fract() == 0.0 && magnitude < 1e15) || magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else if magnitude >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    };
    if text == "-0" { "0".to_owned() } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> RunMetrics {
        let mut runs = RunMetrics::new();
        runs.entry("sata/legacy".into()).or_default().insert("pause_ms_max".into(), 300.0);
        runs.entry("sata/ioless".into()).or_default().insert("pause_ms_mean".into(), 32.0);
        runs.entry("sata/ioless".into()).or_default().insert("pause_ms_stddev".into(), 4.0);
        runs.entry("sata/ioless".into()).or_default().insert("zero".into(), 0.0);
        runs
    }

    #[test]
    fn precedence_and_functions() {
        // Goal: * and / bind tighter than + and -, unary minus, parentheses, min/max/abs.
        let m = metrics();
        let eval = |s: &str| Expr::parse(s).expect(s).eval(&m).expect(s);
        assert_eq!(eval("1 + 2 * 3"), 7.0);
        assert_eq!(eval("(1 + 2) * 3"), 9.0);
        assert_eq!(eval("8 / 4 / 2"), 1.0);
        assert_eq!(eval("-2 - -3"), 1.0);
        assert_eq!(eval("1e-3 * 1000"), 1.0);
        assert_eq!(eval("0.25 * sata/ioless:pause_ms_mean"), 8.0);
        assert_eq!(
            eval("max(sata/legacy:pause_ms_max, 1, 2) / min(4, sata/ioless:pause_ms_stddev)"),
            75.0
        );
        assert_eq!(eval("abs(1 - 3)"), 2.0);
        assert_eq!(eval("sata/legacy:pause_ms_max-sata/ioless:pause_ms_mean"), 268.0);
    }

    #[test]
    fn malformed_expressions_are_refused() {
        // Goal: each mistake gives an error rather than a silent value.
        for bad in [
            "",
            "1 +",
            "(1",
            "1)",
            "foo",
            "sata:x",
            "sata/a:",
            "eval(1)",
            "2x",
            "1 ; 2",
            "abs(1, 2)",
            "max 1",
        ] {
            assert!(Expr::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn evaluation_errors_name_the_cause() {
        // Goal: a missing run, a missing metric and a division by zero are errors.
        let m = metrics();
        let err = |s: &str| Expr::parse(s).expect(s).eval(&m).expect_err(s).0;
        assert!(err("x/y:pause_ms_max").contains("no results for run x/y"));
        assert!(err("sata/legacy:nope").contains("no metric nope"));
        assert!(err("1 / sata/ioless:zero").contains("zero"));
    }

    #[test]
    fn durations() {
        // Goal: the duration units parse to the right numbers (sizes: ebb_core::config::size).
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("10h").is_err());
    }

    #[test]
    fn templates_render_values_and_refuse_bad_braces() {
        // Goal: holes are replaced by formatted values; a failing hole shows n/a.
        let m = metrics();
        let t = Template::parse("0 .. {sata/legacy:pause_ms_max} ms, {x/y:z}").expect("parse");
        assert_eq!(t.render(&m), "0 .. 300 ms, n/a");
        assert!(Template::parse("{1").is_err());
        assert!(Template::parse("1}").is_err());
        assert!(Template::parse("{{1}}").is_err());
        assert_eq!(format_number(32.456), "32.5");
        assert_eq!(format_number(1.0345), "1.03");
        assert_eq!(format_number(0.01234), "0.012");
        assert_eq!(format_number(324.4), "324");
    }

    #[test]
    fn run_seeds_depend_on_seed_and_name_only() {
        // Goal: deterministic, distinct per case name and per global seed.
        assert_eq!(run_seed(1, "sata"), run_seed(1, "sata"));
        assert_ne!(run_seed(1, "sata"), run_seed(1, "ssd"));
        assert_ne!(run_seed(1, "sata"), run_seed(2, "sata"));
    }
}
