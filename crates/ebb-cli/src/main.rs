//! The `ebb` command.
//!
//! `ebb reproduce` runs every experiment in `experiments/` and `ebb sim` one experiment file,
//! both through `ebb_sim::reproduce`; they print each published figure beside ours and the
//! path of `report.html`. `ebb mount` serves a directory through ebb with FUSE until SIGINT or
//! SIGTERM (`ebb_fuse::run`), and `ebb stat` prints a running mount's stats (JSON, read from
//! the `user.ebb.stats` extended attribute of the mount's root).
//!
//! Exit codes: 0 when everything ran and every check held; 1 when a check failed or a run or
//! report could not be completed; 2 for usage and configuration errors (bad arguments, an
//! experiment file that does not load, a command not available yet).
#![expect(clippy::print_stdout, reason = "the CLI prints its results to stdout")]

use std::io::IsTerminal;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;

use clap::{Args, Parser, Subcommand};
use ebb_sim::reproduce::{self, Options, Outcome, Progress, ReproduceError};
use indicatif::{ProgressBar, ProgressStyle};

/// ebb: a userspace writeback engine, its simulator and its reports.
#[derive(Parser, Debug)]
#[command(name = "ebb", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every experiment in a directory and write report.html and summary.json files.
    Reproduce(ReproduceArgs),
    /// Run one experiment file.
    Sim(SimArgs),
    /// Mount the FUSE filesystem over a backend directory.
    Mount(Box<MountArgs>),
    /// Benchmarks of the real runtime.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Show the live stats of a mount.
    Stat(StatArgs),
}

#[derive(Args, Debug)]
struct ReproduceArgs {
    /// Output directory.
    #[arg(long, default_value = "ebb-report")]
    out: PathBuf,
    /// Shortened runs (each experiment's [quick] section).
    #[arg(long)]
    quick: bool,
    /// Directory of experiment files.
    #[arg(long, default_value = "experiments")]
    experiments: PathBuf,
    /// Replace each experiment's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Runs carried out at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

#[derive(Args, Debug)]
struct SimArgs {
    /// The experiment file.
    experiment: PathBuf,
    /// Output directory.
    #[arg(long, default_value = "ebb-report")]
    out: PathBuf,
    /// Replace the experiment's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Also write trace.txt (kernel tracepoint format) and trace.json (Chrome trace events)
    /// for every run.
    #[arg(long)]
    trace: bool,
    /// Shortened runs (the experiment's [quick] section).
    #[arg(long)]
    quick: bool,
    /// Runs carried out at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

#[derive(Args, Debug)]
struct MountArgs {
    /// Directory the data is written to, or an S3 bucket `s3://BUCKET[/PREFIX]` (with
    /// --endpoint; credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).
    #[arg(long)]
    backend: PathBuf,
    /// The S3 server's URL, for an `s3://` backend (`http://127.0.0.1:7070`).
    #[arg(long)]
    endpoint: Option<String>,
    /// Where to mount.
    mountpoint: PathBuf,
    /// Memory budget of the cache, e.g. 4GiB.
    #[arg(long)]
    memory: Option<String>,
    /// Hard dirty threshold, % of dirtyable memory.
    #[arg(long = "dirty_ratio", alias = "dirty-ratio")]
    dirty_ratio: Option<u32>,
    /// Hard dirty threshold in bytes (takes precedence over dirty_ratio).
    #[arg(long = "dirty_bytes", alias = "dirty-bytes")]
    dirty_bytes: Option<String>,
    /// Background writeback threshold, %.
    #[arg(long = "dirty_background_ratio", alias = "dirty-background-ratio")]
    dirty_background_ratio: Option<u32>,
    /// Background writeback threshold in bytes.
    #[arg(long = "dirty_background_bytes", alias = "dirty-background-bytes")]
    dirty_background_bytes: Option<String>,
    /// Age at which dirty data is written by periodic writeback, 1/100 s.
    #[arg(long = "dirty_expire_centisecs", alias = "dirty-expire-centisecs")]
    dirty_expire_centisecs: Option<u32>,
    /// Periodic flusher wakeup interval, 1/100 s.
    #[arg(long = "dirty_writeback_centisecs", alias = "dirty-writeback-centisecs")]
    dirty_writeback_centisecs: Option<u32>,
    /// Guaranteed share of the dirty threshold, %.
    #[arg(long = "min_ratio", alias = "min-ratio")]
    min_ratio: Option<u32>,
    /// Cap on the share of the dirty threshold, %.
    #[arg(long = "max_ratio", alias = "max-ratio")]
    max_ratio: Option<u32>,
    /// Throttle on the backend's own share.
    #[arg(long = "strict_limit", alias = "strict-limit")]
    strict_limit: bool,
    /// wbt read-latency target, microseconds.
    #[arg(long = "wbt_lat_usec", alias = "wbt-lat-usec")]
    wbt_lat_usec: Option<u64>,
    /// Writer throttling: legacy | bandwidth-2010 | ioless.
    #[arg(long)]
    throttle: Option<String>,
    /// Writeback throttling: off | on.
    #[arg(long)]
    wbt: Option<String>,
    /// Reclaim: legacy | flusher-only.
    #[arg(long)]
    reclaim: Option<String>,
    /// Unstable page accounting: legacy-2020 | fixed.
    #[arg(long = "unstable_accounting", alias = "unstable-accounting")]
    unstable_accounting: Option<String>,
    /// Any knob by its kernel name, e.g. `--knob dirty_ratio=10` (repeatable; applied after
    /// the named options above).
    #[arg(long, value_name = "NAME=VALUE")]
    knob: Vec<String>,
    /// Serve file data with plain buffered IO on DIR instead of through ebb (for comparisons).
    #[arg(long, hide = true)]
    passthrough: bool,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// A streaming writer through ebb beside raw O_DIRECT writes to the same filesystem.
    Stream {
        /// Directory on the filesystem to test.
        #[arg(long)]
        dir: PathBuf,
        /// Bytes each run writes, e.g. 4GiB.
        #[arg(long, default_value = "2GiB")]
        size: String,
        /// ebb's memory budget.
        #[arg(long, default_value = "256MiB")]
        memory: String,
        /// Rounds of (raw, ebb); the means are reported.
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// At most this many bytes are streamed through the cache before each timed run, until
        /// its bandwidth estimate settles (it converges over several seconds).
        #[arg(long, default_value = "16GiB")]
        warmup: String,
        /// A knob by its kernel name, e.g. `--knob dirty_background_bytes=64M`, or ebb's
        /// `initial_write_bandwidth=2G` (repeatable).
        #[arg(long)]
        knob: Vec<String>,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A random 4 KiB reader beside a streaming writer: idle, ebb with wbt on and off, and
    /// the kernel's buffered path.
    ReadUnderWrite {
        /// Directory on the filesystem to test.
        #[arg(long)]
        dir: PathBuf,
        /// Seconds per mode and round.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Rounds: the modes take turns and each mode's reads of every round are merged.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        /// Size of the file read at random.
        #[arg(long, default_value = "1GiB")]
        read_size: String,
        /// ebb's memory budget.
        #[arg(long, default_value = "256MiB")]
        memory: String,
        /// A knob for the ebb modes by its kernel name, e.g. `--knob wbt_lat_usec=2000`
        /// (repeatable; `wbt` itself is set by each mode).
        #[arg(long)]
        knob: Vec<String>,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The cost of the per-write path into the cache (no throttling), 1 to N threads.
    WritePath {
        /// Largest thread count; 1, 2, 4, ... up to it are measured.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Size of each thread's file, rewritten by every pass. The default fits a core's own
        /// cache, so that the figures are the path's cost; larger files (8MiB) measure how the
        /// cores share the L3 and memory as well.
        #[arg(long, default_value = "1MiB")]
        size: String,
        /// Passes per measurement.
        #[arg(long, default_value_t = 2048)]
        passes: u32,
        /// Measurements per thread count, the counts taking turns; the fastest of each count is
        /// reported, and the median of the repeats' 2-over-1 ratios as the scaling.
        #[arg(long, default_value_t = 5)]
        repeats: u32,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(Args, Debug)]
struct StatArgs {
    /// The mount to query.
    mountpoint: PathBuf,
}

/// A command that belongs to later work.
#[derive(Debug)]
struct NotAvailable(&'static str);

impl std::fmt::Display for NotAvailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`ebb {}` is not available yet", self.0)
    }
}

impl std::error::Error for NotAvailable {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("ebb: {error:#}");
            ExitCode::from(exit_code(&error))
        }
    }
}

/// 2 for configuration and usage errors, 1 for everything else.
fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<NotAvailable>().is_some() || error.downcast_ref::<Usage>().is_some() {
        return 2;
    }
    // `ebb mount` reports impossible settings (a bad knob value) as InvalidInput.
    if error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::InvalidInput)
    {
        return 2;
    }
    match error.downcast_ref::<ReproduceError>() {
        Some(ReproduceError::Experiment(_)) => 2,
        _ => 1,
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Reproduce(args) => {
            let options = Options {
                out_dir: args.out,
                quick: args.quick,
                seed: args.seed,
                trace: false,
                threads: args.jobs.max(1),
            };
            let outcome = with_progress(|progress| {
                reproduce::reproduce(&args.experiments, &options, progress)
            })?;
            Ok(finish(&outcome))
        }
        Command::Sim(args) => {
            let options = Options {
                out_dir: args.out,
                quick: args.quick,
                seed: args.seed,
                trace: args.trace,
                threads: args.jobs.max(1),
            };
            let outcome =
                with_progress(|progress| reproduce::sim(&args.experiment, &options, progress))?;
            Ok(finish(&outcome))
        }
        Command::Mount(args) => {
            let backend = args.backend.clone();
            if let Some(url) = backend.to_str().filter(|text| text.starts_with("s3://")) {
                let Some(endpoint) = args.endpoint.clone() else {
                    return Err(Usage(format!("--backend {url} needs --endpoint URL")).into());
                };
                let options = ebb_backend::S3Options::from_env(url, &endpoint)?;
                let config = mount_config(*args)?;
                let namespace =
                    ebb_backend::S3Namespace::new(ebb_backend::S3Backend::open(options)?);
                ebb_fuse::run(&config, namespace)?;
                return Ok(ExitCode::SUCCESS);
            }
            let config = mount_config(*args)?;
            let namespace = match config.data {
                ebb_fuse::DataMode::Ebb => ebb_fuse::DirNamespace::open(&backend),
                ebb_fuse::DataMode::Passthrough => ebb_fuse::DirNamespace::open_buffered(&backend),
            }
            .map_err(|error| {
                std::io::Error::new(error.kind(), format!("backend directory {error}"))
            })?;
            ebb_fuse::run(&config, namespace)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(command) => bench(command),
        Command::Stat(args) => {
            let stats = ebb_fuse::read_stats(&args.mountpoint)?;
            // A reader that stops early (`ebb stat | head`) is not an error.
            match writeln!(std::io::stdout().lock(), "{stats}") {
                Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
                _ => Ok(ExitCode::SUCCESS),
            }
        }
    }
}

/// A size argument (`4GiB`, `512M`, `1048576`).
fn size_arg(flag: &str, value: &str) -> anyhow::Result<u64> {
    ebb_core::config::parse_bytes(flag, value).map_err(|e| Usage(e.to_string()).into())
}

/// A usage error (exit code 2).
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn print_json(value: &impl serde::Serialize, path: Option<&std::path::Path>) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    ebb_runtime::bench::write_json(path, value)?;
    Ok(())
}

/// `--knob NAME=VALUE` arguments.
fn parse_knobs(args: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut knobs = Vec::new();
    for k in args {
        let Some((name, value)) = k.split_once('=') else {
            return Err(Usage(format!("--knob {k:?}: expected NAME=VALUE")).into());
        };
        knobs.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(knobs)
}

fn bench(command: BenchCommand) -> anyhow::Result<ExitCode> {
    use ebb_runtime::bench;
    match command {
        BenchCommand::Stream { dir, size, memory, rounds, warmup, knob, json } => {
            let opts = bench::StreamOptions {
                dir,
                size: size_arg("--size", &size)?,
                memory: size_arg("--memory", &memory)?,
                block: 1 << 20,
                rounds,
                warmup: size_arg("--warmup", &warmup)?,
                knobs: parse_knobs(&knob)?,
            };
            let result = bench::stream(&opts)?;
            print_json(&result, json.as_deref())?;
        }
        BenchCommand::ReadUnderWrite { dir, seconds, rounds, read_size, memory, knob, json } => {
            let opts = bench::ReadUnderWriteOptions {
                knobs: parse_knobs(&knob)?,
                dir,
                seconds: seconds.max(1) as f64,
                read_file_size: size_arg("--read-size", &read_size)?,
                write_file_size: 4 << 30,
                memory: size_arg("--memory", &memory)?,
                rounds,
            };
            let result =
                bench::read_under_write(&opts, &mut |what| eprintln!("ebb bench: {what}"))?;
            print_json(&result, json.as_deref())?;
        }
        BenchCommand::WritePath { threads, size, passes, repeats, json } => {
            let mut counts = vec![1];
            while counts.last().is_some_and(|&n| n * 2 <= threads.max(1)) {
                counts.push(counts.last().copied().unwrap_or(1) * 2);
            }
            let opts = bench::WritePathOptions {
                threads: counts,
                bytes_per_thread: size_arg("--size", &size)?,
                passes,
                repeats,
            };
            let result = bench::write_path(&opts)?;
            print_json(&result, json.as_deref())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the comparison and the report's path; the exit code says whether all checks held.
fn finish(outcome: &Outcome) -> ExitCode {
    print!("{}", outcome.text());
    println!();
    println!("report: {}", outcome.report_html.display());
    let failed = outcome.failed_checks();
    if failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    eprintln!("ebb: {} check(s) failed:", failed.len());
    for (experiment, check) in failed {
        eprintln!("  {experiment}: {} ({}): {}", check.what, check.expression, check.values());
    }
    ExitCode::from(1)
}

/// Runs `work` with a progress bar on stderr (hidden when stderr is not a terminal).
fn with_progress<T>(
    work: impl FnOnce(&(dyn Fn(Progress<'_>) + Sync)) -> Result<T, ReproduceError>,
) -> anyhow::Result<T> {
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {percent:>3}% runs {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    // Per run: fraction done and, while running, its name.
    let state: Mutex<Vec<(f64, Option<String>)>> = Mutex::new(Vec::new());
    let callback = |event: Progress<'_>| {
        let mut runs = state.lock().unwrap_or_else(|poison| poison.into_inner());
        match event {
            Progress::Started { index, total, experiment, run } => {
                if runs.len() < total {
                    runs.resize(total, (0.0, None));
                    bar.set_length(total as u64 * 1000);
                }
                runs[index].1 = Some(format!("{experiment}:{run}"));
            }
            Progress::Advanced { index, fraction } => {
                if let Some(entry) = runs.get_mut(index) {
                    entry.0 = fraction.clamp(0.0, 1.0);
                }
            }
            Progress::Finished { index } => {
                if let Some(entry) = runs.get_mut(index) {
                    *entry = (1.0, None);
                }
            }
        }
        let done: f64 = runs.iter().map(|(fraction, _)| fraction).sum();
        bar.set_position((done * 1000.0) as u64);
        let running: Vec<&str> = runs.iter().filter_map(|(_, name)| name.as_deref()).collect();
        bar.set_message(running.join(", "));
    };
    let result = work(&callback);
    bar.finish_and_clear();
    Ok(result?)
}

/// The mount's configuration from its arguments; knobs keep their kernel names.
fn mount_config(args: MountArgs) -> anyhow::Result<ebb_fuse::MountConfig> {
    let memory = match &args.memory {
        Some(text) => Some(size_arg("--memory", text)?),
        None => None,
    };
    let mut knobs: Vec<(String, String)> = Vec::new();
    let mut named = |name: &str, value: Option<String>| {
        if let Some(value) = value {
            knobs.push((name.to_owned(), value));
        }
    };
    named("dirty_ratio", args.dirty_ratio.map(|v| v.to_string()));
    named("dirty_bytes", args.dirty_bytes);
    named("dirty_background_ratio", args.dirty_background_ratio.map(|v| v.to_string()));
    named("dirty_background_bytes", args.dirty_background_bytes);
    named("dirty_expire_centisecs", args.dirty_expire_centisecs.map(|v| v.to_string()));
    named("dirty_writeback_centisecs", args.dirty_writeback_centisecs.map(|v| v.to_string()));
    named("min_ratio", args.min_ratio.map(|v| v.to_string()));
    named("max_ratio", args.max_ratio.map(|v| v.to_string()));
    named("strict_limit", args.strict_limit.then(|| "1".to_owned()));
    named("wbt_lat_usec", args.wbt_lat_usec.map(|v| v.to_string()));
    named("throttle", args.throttle);
    named("wbt", args.wbt);
    named("reclaim", args.reclaim);
    named("unstable_accounting", args.unstable_accounting);
    for knob in &args.knob {
        let Some((name, value)) = knob.split_once('=') else {
            return Err(Usage(format!("--knob {knob:?}: expected NAME=VALUE")).into());
        };
        knobs.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(ebb_fuse::MountConfig {
        mountpoint: args.mountpoint,
        memory,
        knobs,
        data: if args.passthrough {
            ebb_fuse::DataMode::Passthrough
        } else {
            ebb_fuse::DataMode::Ebb
        },
    })
}
