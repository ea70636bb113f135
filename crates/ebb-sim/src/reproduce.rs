//! Running experiments and writing their reports: the library side of `ebb sim` and
//! `ebb reproduce`.
//!
//! [`reproduce_embedded`] runs the experiments compiled into the binary, [`reproduce`] every
//! experiment file of a directory, [`sim`] one file; all go through
//! [`run_experiments`], which
//!
//! 1. expands every experiment into its runs (quick or full, with the seed and trace options),
//!    once per seed of [`Options::seeds`] (the experiment's seed and the ones after it);
//! 2. runs them with [`crate::run::run`] on up to [`Options::threads`] threads; each run is
//!    deterministic and its result is stored by index, so nothing depends on thread timing;
//! 3. writes, under the output directory, `<experiment>/summary.json`, three or four PNG
//!    charts per run under `<experiment>/<case>/<variant>/` (dirty pages against setpoint and
//!    limit; dirty ratelimit and write bandwidth; pauses as points; pages dirtied per writer),
//!    and `report.html` with one section per experiment;
//! 4. evaluates the checks and renders the published rows with our figures.
//!
//! The returned [`Outcome`] says which checks failed, and [`Outcome::text`] renders the
//! published figures beside ours as a plain-text table for the CLI to print. Nothing here
//! prints: progress goes to a callback.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ebb_core::Config;
use serde_json::{Value, json};

use crate::experiment::{
    CheckOutcome, ExpandOptions, Experiment, ExperimentError, PublishedOutcome, RunMetrics,
    Verdict, format_number,
};
use crate::report::ReportError;
use crate::report::compare_charts;
use crate::report::html::{Comparison, ExperimentSection, PlotRef, ReportPage, Table, write_html};
use crate::report::plot::render_png;
use crate::report::run_charts::charts;
use crate::report::summary::{PublishedSummary, RunSummary, Summary, count_verdicts};
use crate::report::text::{format_wrapped_table, wrap};
use crate::run::{self, RunResult, RunSpec, SimError, Workload};

mod section;

use section::report_experiment;

/// Chart size in pixels.
const CHART_WIDTH: u32 = 960;
const CHART_HEIGHT: u32 = 420;

/// Metrics shown in each experiment's table when any run has them, in this order; metrics
/// that checks or published rows read are added after them.
const KEY_METRICS: [&str; 12] = [
    "elapsed_s",
    "write_mb_s",
    "pause_count",
    "pause_ms_min",
    "pause_ms_mean",
    "pause_ms_stddev",
    "pause_ms_p99",
    "pause_ms_max",
    "dirty_pages_max",
    "dirty_limit_pages",
    "writer_writeback_pages",
    "writer_rate_ratio",
];

/// What to run and where to write.
#[derive(Clone, Debug)]
pub struct Options {
    /// The output directory (created if missing).
    pub out_dir: PathBuf,
    /// Apply each experiment's `[quick]` section.
    pub quick: bool,
    /// Replaces each experiment's global seed.
    pub seed: Option<u64>,
    /// Every case runs once per seed, from the global seed on (at least 1): the verdicts are
    /// judged over them (docs/verdicts.md). `ebb reproduce` uses [`DEFAULT_SEEDS`].
    pub seeds: u64,
    /// Write `trace.txt` and `trace.json` for every run, beside its charts.
    pub trace: bool,
    /// Runs carried out at once (at least 1).
    pub threads: usize,
}

impl Options {
    /// Full runs into `out_dir`, the files' seeds, one seed, no trace, two threads.
    pub fn new(out_dir: impl Into<PathBuf>) -> Options {
        Options {
            out_dir: out_dir.into(),
            quick: false,
            seed: None,
            seeds: 1,
            trace: false,
            threads: 2,
        }
    }
}

/// Seeds per case of a full `ebb reproduce`: three, so that a change every seed shows can be
/// told from one inside the seeds' spread, while the full run stays under two minutes on two
/// cores (about 31 s a seed, release build; measured in the commit that set it).
pub const DEFAULT_SEEDS: u64 = 3;

/// Progress of a batch of runs, for a progress bar. Indexes count runs across all
/// experiments, in run order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Progress<'a> {
    /// A run began.
    Started {
        /// The run's index.
        index: usize,
        /// Runs in the batch.
        total: usize,
        /// The experiment's name.
        experiment: &'a str,
        /// The run's name.
        run: &'a str,
    },
    /// A run reports the fraction of its workload done.
    Advanced {
        /// The run's index.
        index: usize,
        /// Fraction done, 0 to 1.
        fraction: f64,
    },
    /// A run ended (successfully or not).
    Finished {
        /// The run's index.
        index: usize,
    },
}

/// Why experiments could not be run or reported.
#[derive(Debug)]
pub enum ReproduceError {
    /// An experiment file was refused.
    Experiment(ExperimentError),
    /// A run failed.
    Run {
        /// The experiment.
        experiment: String,
        /// The run.
        run: String,
        /// What the simulator said.
        source: SimError,
    },
    /// A report file could not be written.
    Report(ReportError),
    /// A directory could not be created.
    Io {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl fmt::Display for ReproduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReproduceError::Experiment(error) => write!(f, "{error}"),
            ReproduceError::Run { experiment, run, source } => {
                write!(f, "experiment {experiment}, run {run}: {source}")
            }
            ReproduceError::Report(error) => write!(f, "{error}"),
            ReproduceError::Io { path, source } => {
                write!(f, "cannot create {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for ReproduceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // The wrapped errors' messages are this error's message, so their causes come
            // next in the chain, not the errors themselves.
            ReproduceError::Experiment(error) => error.source(),
            ReproduceError::Run { source, .. } => Some(source),
            ReproduceError::Report(error) => error.source(),
            ReproduceError::Io { source, .. } => Some(source),
        }
    }
}

impl From<ExperimentError> for ReproduceError {
    fn from(error: ExperimentError) -> ReproduceError {
        ReproduceError::Experiment(error)
    }
}

impl From<ReportError> for ReproduceError {
    fn from(error: ReportError) -> ReproduceError {
        ReproduceError::Report(error)
    }
}

/// What one experiment gave.
#[derive(Clone, Debug)]
pub struct ExperimentOutcome {
    /// The experiment's name.
    pub name: String,
    /// Its title.
    pub title: String,
    /// ebb's own experiment (its rows are tallied apart from the postings' numbers).
    pub own: bool,
    /// Where its `summary.json` is.
    pub summary_path: PathBuf,
    /// Metrics of each run.
    pub metrics: RunMetrics,
    /// Every check, in file order.
    pub checks: Vec<CheckOutcome>,
    /// Every published row with our figure.
    pub published: Vec<PublishedOutcome>,
}

impl ExperimentOutcome {
    /// Whether every check passed (level checks are reported, not required).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|check| check.pass || check.level)
    }
}

/// What a batch of experiments gave.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// One entry per experiment, in the order run.
    pub experiments: Vec<ExperimentOutcome>,
    /// Where `report.html` is.
    pub report_html: PathBuf,
    /// Whether the runs were shortened (`--quick`): the verdicts are then not the report's.
    pub quick: bool,
    /// Seeds every case ran over.
    pub seeds: u64,
}

impl Outcome {
    /// Whether every check of every experiment passed.
    pub fn passed(&self) -> bool {
        self.experiments.iter().all(ExperimentOutcome::passed)
    }

    /// Every failed check, with its experiment's name.
    pub fn failed_checks(&self) -> Vec<(&str, &CheckOutcome)> {
        self.experiments
            .iter()
            .flat_map(|e| {
                e.checks.iter().filter(|c| !c.pass && !c.level).map(move |c| (e.name.as_str(), c))
            })
            .collect()
    }

    /// How many rows got each verdict: over the postings' experiments (`own` false) or over
    /// ebb's own (`own` true).
    pub fn verdict_counts(&self, own: bool) -> BTreeMap<Verdict, u64> {
        count_verdicts(
            self.experiments
                .iter()
                .filter(|e| e.own == own)
                .flat_map(|e| e.published.iter().map(|r| &r.verdict)),
        )
    }

    /// Per experiment, the published figures beside ours with the ratio and verdict (and why,
    /// under a row that is not reproduced); then every check with its values; then the count
    /// of each verdict. Lines fit [`TEXT_WIDTH`] columns.
    pub fn text(&self) -> String {
        let mut text = String::new();
        if self.quick {
            text.push_str(QUICK_NOTE);
            text.push_str("\n\n");
        }
        if self.seeds > 1 {
            let note = format!(
                "Every case ran over {} seeds: the verdict judges the seeds' median, shown \
                 in brackets with their range; a change not every seed shows is not the posting's.",
                self.seeds
            );
            for line in wrap(&note, TEXT_WIDTH) {
                text.push_str(&line);
                text.push('\n');
            }
            text.push('\n');
        }
        for experiment in &self.experiments {
            let origin = if experiment.own { " (ebb's own experiment)" } else { "" };
            text.push_str(&format!("{}: {}{origin}\n", experiment.name, experiment.title));
            let rows: Vec<Vec<String>> =
                experiment.published.iter().enumerate().map(published_text_row).collect();
            text.push_str(&format_wrapped_table(
                &["claim", "published", "ours", "ratio", "tol.", "verdict"],
                &rows,
                &[28, 24, 30, 6, 6, 14],
            ));
            for line in notes(&experiment.published) {
                text.push_str(&line);
                text.push('\n');
            }
            text.push('\n');
        }
        let checks: Vec<Vec<String>> = self
            .experiments
            .iter()
            .flat_map(|e| {
                e.checks.iter().map(move |check| {
                    vec![
                        e.name.clone(),
                        check.what.clone(),
                        check.values(),
                        match (check.pass, check.level) {
                            (true, _) => "pass",
                            (false, false) => "FAIL",
                            (false, true) => "off",
                        }
                        .to_owned(),
                    ]
                })
            })
            .collect();
        text.push_str(&format_wrapped_table(
            &["experiment", "check", "values", "result"],
            &checks,
            &[20, 56, 34, 6],
        ));
        text.push('\n');
        text.push_str(&self.counts_line());
        text.push('\n');
        text
    }

    /// Three lines, `N postings' numbers: N reproduced, ...`, `M rows of ebb's own
    /// experiments: ...` and `checks: K of L hold`, after a `QUICK RUN` line when the runs were
    /// shortened.
    pub fn counts_line(&self) -> String {
        let postings = self.verdict_counts(false);
        let own = self.verdict_counts(true);
        let all: Vec<&CheckOutcome> = self.experiments.iter().flat_map(|e| &e.checks).collect();
        let (levels, checks): (Vec<&CheckOutcome>, Vec<&CheckOutcome>) =
            all.into_iter().partition(|check| check.level);
        let passed = checks.iter().filter(|check| check.pass).count();
        let levels_held = levels.iter().filter(|check| check.pass).count();
        format!(
            "{}{} postings' numbers: {}\n{} rows of ebb's own experiments: {}\nchecks: {passed} \
             of {} hold; level checks (regime figures): {levels_held} of {} hold",
            if self.quick { "QUICK RUN (not the full run's verdicts)\n" } else { "" },
            postings.values().sum::<u64>(),
            counts_text(&postings),
            own.values().sum::<u64>(),
            counts_text(&own),
            checks.len(),
            levels.len()
        )
    }
}

/// Said at the top of the terminal output and the report of a `--quick` run.
pub const QUICK_NOTE: &str = "QUICK RUN: workloads are shortened as each experiment's [quick] \
                              says; the verdicts below are not the full run's.";

/// `N reproduced, N direction-only, N not-reproduced, N not-compared`.
pub fn counts_text(counts: &BTreeMap<Verdict, u64>) -> String {
    Verdict::ALL
        .iter()
        .map(|verdict| format!("{} {verdict}", counts.get(verdict).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Width of the terminal table, in columns.
pub const TEXT_WIDTH: usize = 120;

/// The notes under an experiment's table: each explanation once, with the numbers of the
/// rows it explains (`[1, 4]`), wrapped to [`TEXT_WIDTH`]; a row without one that is not
/// reproduced shows its computed reason.
fn notes(rows: &[PublishedOutcome]) -> Vec<String> {
    let mut grouped: Vec<(Vec<usize>, String)> = Vec::new();
    for (index, row) in rows.iter().enumerate() {
        let mut note = match &row.explanation {
            Some(explanation) => explanation.clone(),
            None if row.verdict != Verdict::Reproduced => row.why.clone(),
            None => continue,
        };
        if let Some(analysis) = &row.analysis {
            note.push_str(&format!(" (see {analysis})"));
        }
        match grouped.iter_mut().find(|(_, text)| *text == note) {
            Some((numbers, _)) => numbers.push(index + 1),
            None => grouped.push((vec![index + 1], note)),
        }
    }
    grouped
        .into_iter()
        .flat_map(|(numbers, note)| {
            let numbers: Vec<String> = numbers.iter().map(usize::to_string).collect();
            wrap(&format!("[{}] {note}", numbers.join(", ")), TEXT_WIDTH - 2)
                .into_iter()
                .map(|line| format!("  {line}"))
        })
        .collect()
}

fn published_text_row((index, row): (usize, &PublishedOutcome)) -> Vec<String> {
    vec![
        format!("{}. {}", index + 1, row.claim),
        row.published.clone(),
        row.ours.clone(),
        row.ratio.map_or(String::new(), format_number),
        row.tolerance.clone(),
        row.verdict.name().to_owned(),
    ]
}

/// Runs every experiment compiled into the binary (the repository's `experiments/`).
pub fn reproduce_embedded(
    options: &Options,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Outcome, ReproduceError> {
    let experiments = Experiment::embedded()?;
    run_experiments(&experiments, options, progress)
}

/// Runs every `*.toml` experiment of `dir`; see the module doc.
pub fn reproduce(
    dir: &Path,
    options: &Options,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Outcome, ReproduceError> {
    let experiments = Experiment::load_dir(dir)?;
    run_experiments(&experiments, options, progress)
}

/// Runs the experiment file `file`; see the module doc.
pub fn sim(
    file: &Path,
    options: &Options,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Outcome, ReproduceError> {
    let experiment = Experiment::load(file)?;
    run_experiments(std::slice::from_ref(&experiment), options, progress)
}

/// Runs `experiments`, writes their reports under `options.out_dir` and evaluates their checks.
pub fn run_experiments(
    experiments: &[Experiment],
    options: &Options,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Outcome, ReproduceError> {
    create_dir(&options.out_dir)?;
    let seeds = options.seeds.max(1) as usize;
    // Seed by seed, so a progress bar's first tenth is the first seed's runs.
    let mut jobs: Vec<(usize, RunSpec)> = Vec::new();
    for seed in 0..seeds {
        for (index, experiment) in experiments.iter().enumerate() {
            for spec in experiment.runs(&expand_options(experiment, options, seed)) {
                if let Some(dir) = &spec.trace_dir {
                    create_dir(dir)?;
                }
                jobs.push((index, spec));
            }
        }
    }
    let mut results: Vec<Vec<Vec<RunResult>>> =
        experiments.iter().map(|_| vec![Vec::new(); seeds]).collect();
    let mut seen = vec![0usize; experiments.len()];
    for ((index, spec), result) in
        jobs.iter().zip(run_all(experiments, &jobs, options.threads, progress))
    {
        let result = result.map_err(|source| ReproduceError::Run {
            experiment: experiments[*index].name.clone(),
            run: spec.name.clone(),
            source,
        })?;
        let per_seed = experiments[*index].cases.len() * experiments[*index].variants.len();
        results[*index][seen[*index] / per_seed].push(result);
        seen[*index] += 1;
    }
    write_reports(experiments, results, options)
}

/// Writes the reports of runs already carried out and evaluates the checks: `results[i][s]`
/// holds the results of `experiments[i]` under its `s`-th seed ([`Options::seeds`]), in
/// [`Experiment::run_names`] order, run with `options`. This is the second half of
/// [`run_experiments`], public so reports can be produced from results made elsewhere (tests,
/// saved runs).
pub fn write_reports(
    experiments: &[Experiment],
    results: Vec<Vec<Vec<RunResult>>>,
    options: &Options,
) -> Result<Outcome, ReproduceError> {
    assert_eq!(experiments.len(), results.len(), "one result list per experiment");
    create_dir(&options.out_dir)?;
    let mut outcomes = Vec::new();
    let mut sections = Vec::new();
    for (experiment, results) in experiments.iter().zip(results) {
        create_dir(&options.out_dir.join(&experiment.name))?;
        assert!(!results.is_empty(), "{}: at least one seed", experiment.name);
        let specs: Vec<Vec<RunSpec>> = (0..results.len())
            .map(|seed| experiment.runs(&expand_options(experiment, options, seed)))
            .collect();
        let global_seeds: Vec<u64> =
            (0..results.len()).map(|seed| global_seed(experiment, options, seed)).collect();
        let seeds: Vec<Vec<(&RunSpec, RunResult)>> = specs
            .iter()
            .zip(results)
            .map(|(specs, results)| {
                assert_eq!(specs.len(), results.len(), "{}: one result per run", experiment.name);
                specs.iter().zip(results).collect()
            })
            .collect();
        let (outcome, section) = report_experiment(experiment, &seeds, &global_seeds, options)?;
        outcomes.push(outcome);
        sections.push(section);
    }
    let report_html = options.out_dir.join("report.html");
    let page = ReportPage {
        title: if options.quick {
            "ebb: published results reproduced (QUICK runs: shortened, so the verdicts differ \
             from the full runs')"
                .to_owned()
        } else {
            "ebb: published results reproduced".to_owned()
        },
        intro: intro(options),
        experiments: sections,
    };
    write_html(&page, &report_html)?;
    Ok(Outcome { experiments: outcomes, report_html, quick: options.quick, seeds: options.seeds })
}

/// The runs of `experiment` under its `seed`-th seed; only the first seed's are traced.
fn expand_options(experiment: &Experiment, options: &Options, seed: usize) -> ExpandOptions {
    ExpandOptions {
        quick: options.quick,
        seed: Some(global_seed(experiment, options, seed)),
        trace_dir: (options.trace && seed == 0).then(|| options.out_dir.join(&experiment.name)),
    }
}

/// The `index`-th global seed of `experiment`: its seed (or `--seed`'s), then the ones after.
fn global_seed(experiment: &Experiment, options: &Options, index: usize) -> u64 {
    options.seed.unwrap_or(experiment.seed).wrapping_add(index as u64)
}

fn create_dir(path: &Path) -> Result<(), ReproduceError> {
    std::fs::create_dir_all(path)
        .map_err(|source| ReproduceError::Io { path: path.to_owned(), source })
}

fn intro(options: &Options) -> String {
    let mut intro = "Each experiment runs the same engine in virtual time against our device \
                     models, once per value of the policy it compares. Every number a posting \
                     published is compared with ours and given a computed verdict: reproduced \
                     (within the stated tolerance), direction-only, not-reproduced (with the \
                     reason, and where the analysis is in docs/) or not-compared (the posting \
                     gave no number, or the row says why ours cannot be set beside it). Device models are ours, so absolute figures often differ; \
                     rows that compare an effect use its factor or change. The checks below \
                     each table are what must hold in ours."
        .to_owned();
    if options.quick {
        intro.push('\n');
        intro.push_str(QUICK_NOTE);
    }
    if options.seeds > 1 {
        intro.push_str(&format!(
            "\nEvery case ran over {} seeds (the experiment's seed and the ones after it{}): the \
             tables show each metric's mean over them, the charts the first seed's runs, and \
             a published number is judged on the seeds' median, shown with their range; a \
             change that not every seed shows is not counted as the posting's.",
            options.seeds,
            options.seed.map_or(String::new(), |seed| format!(", from {seed}"))
        ));
    } else if let Some(seed) = options.seed {
        intro.push_str(&format!("\nSeed {seed}."));
    }
    intro
}

/// Runs every job on up to `threads` threads; results come back in job order.
fn run_all(
    experiments: &[Experiment],
    jobs: &[(usize, RunSpec)],
    threads: usize,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Vec<Result<RunResult, SimError>> {
    let total = jobs.len();
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<Result<RunResult, SimError>>>> =
        Mutex::new((0..total).map(|_| None).collect());
    let worker = || {
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some((experiment, spec)) = jobs.get(index) else { break };
            progress(Progress::Started {
                index,
                total,
                experiment: &experiments[*experiment].name,
                run: &spec.name,
            });
            let result =
                run::run(spec, &mut |fraction| progress(Progress::Advanced { index, fraction }));
            progress(Progress::Finished { index });
            slots.lock().unwrap_or_else(|poison| poison.into_inner())[index] = Some(result);
        }
    };
    let threads = threads.clamp(1, total.max(1));
    if threads == 1 {
        worker();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(worker);
            }
        });
    }
    slots
        .into_inner()
        .unwrap_or_else(|poison| poison.into_inner())
        .into_iter()
        .map(|slot| slot.expect("every job ran"))
        .collect()
}
