//! The `ebb` command.
//!
//! `ebb reproduce` runs every experiment built into the binary (the repository's
//! `experiments/`, or `--experiments DIR`) and `ebb sim` one experiment file,
//! both through `ebb_sim::reproduce`; they print each published figure beside ours and the
//! path of `report.html`. `ebb mount` serves a directory through ebb with FUSE until SIGINT or
//! SIGTERM (`ebb_fuse::run`), and `ebb stat` prints a running mount's stats (JSON, read from
//! the mount's stats socket, `ebb_fuse::read_stats_listing`); `ebb top` shows them live.
//! `ebb swarm` runs seeded simulated worlds with random faults under the simulator's checkers
//! (`ebb_sim::swarm`).
//! `ebb report` draws a trace file (`ebb mount --trace`) with the simulator's report code.
//! Started through a link named `mount.ebb` or `umount.fuse.ebb`, the binary is mount(8)'s and
//! umount(8)'s helper for ebb mounts (`mount_helper`).
//!
//! Exit codes: 0 when everything ran and every check held; 1 when a check failed or a run or
//! report could not be completed; 2 for usage and configuration errors (bad arguments, an
//! experiment file that does not load, a command not available yet).

use std::io::IsTerminal;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;

mod bench;
mod mount_helper;
mod swarm;
mod top;

use clap::{Args, Parser, Subcommand};
use ebb_core::config::{self, Knob, Setting};
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
    Bench(bench::BenchCommand),
    /// Show the live stats of a mount.
    Stat(StatArgs),
    /// Many seeded simulated runs with random faults, checked for safety and liveness.
    Swarm(swarm::SwarmArgs),
    /// A live view of a mount (q quits): pages against the limits, bandwidth, pauses, wbt.
    Top(TopArgs),
    /// Draw a trace file (`ebb mount --trace`, or a simulated run's trace.txt): the
    /// simulator's charts, report.html and trace.json for ui.perfetto.dev.
    Report(ReportArgs),
}

#[derive(Args, Debug)]
struct TopArgs {
    /// The mount to watch.
    mountpoint: PathBuf,
    /// Seconds between refreshes (at least 0.1).
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// The trace file (the kernel's tracepoint text format).
    trace: PathBuf,
    /// Output directory.
    #[arg(long, default_value = "ebb-trace-report")]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct ReproduceArgs {
    /// Output directory.
    #[arg(long, default_value = "ebb-report")]
    out: PathBuf,
    /// Shortened runs (each experiment's [quick] section).
    #[arg(long)]
    quick: bool,
    /// Directory of experiment files (default: the experiments built into ebb).
    #[arg(long)]
    experiments: Option<PathBuf>,
    /// Replace each experiment's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run every case over this many seeds, from the experiment's seed on; the verdicts are
    /// judged over them (default 3, or 1 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100))]
    seeds: Option<u64>,
    /// Runs carried out at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

#[derive(Args, Debug)]
struct SimArgs {
    /// The experiment file.
    experiment: PathBuf,
    /// Output directory (not `ebb reproduce`'s, so a single run never replaces its report).
    #[arg(long, default_value = "ebb-sim")]
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
    /// Run every case over this many seeds, from the experiment's seed on; the verdicts are
    /// judged over them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    seeds: u64,
    /// Runs carried out at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

#[derive(Args, Debug)]
struct MountArgs {
    /// Directory the data is written to, an S3 bucket `s3://BUCKET[/PREFIX]` (with
    /// --endpoint; credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), or
    /// an NFSv3 export `nfs://HOST[:PORT]/EXPORT[?mountport=N&timeo=100&retrans=2&nconnect=1]`.
    #[arg(long)]
    backend: PathBuf,
    /// The S3 server's URL, for an `s3://` backend (`http://127.0.0.1:7070`).
    #[arg(long)]
    endpoint: Option<String>,
    /// For an `s3://` backend: seconds what the server said of a key (size, time, existence,
    /// a directory's entries) is used without asking again; the mount's own changes are seen
    /// at once, other clients' up to this late; 0 asks every time.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    metadata_ttl: f64,
    /// For an `s3://` backend: seconds one read or write on a connection waits before the
    /// request is given up and tried again (its per-try timeout, as NFS's `timeo`); a request
    /// unanswered this long counts as the server being unreachable (docs/outages.md).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    s3_timeout: f64,
    /// Where to mount.
    mountpoint: PathBuf,
    /// Memory budget of the mount process, e.g. 4GiB (default 256MiB): its own code, heap and
    /// stacks (the code it maps, about 12 MiB, plus 8 MiB and 1/64 of the budget are set aside
    /// for them), its copies of write requests (an eighth of the budget, 0.5 to 20.5 MiB), the
    /// IO threads' buffers and the cache together. A quarter of what is left (at least one largest write, at most one per IO
    /// thread) goes to the buffers, the cache gets the rest, at least 4 MiB.
    #[arg(long)]
    memory: Option<String>,
    /// One flag per knob of the registry (`--dirty_ratio 10`, `--wbt off`, `--strict_limit`),
    /// also spelled with dashes (`--dirty-ratio`).
    #[command(flatten)]
    knob_flags: KnobFlags,
    /// Any knob by its kernel name, e.g. `--knob dirty_ratio=10` (repeatable; applied after
    /// the knob flags). Sizes: 64M or 64MiB is 64 MiB, 64MB is 64,000,000 bytes.
    #[arg(long, value_name = "NAME=VALUE", value_parser = knob_setting)]
    knob: Vec<Setting>,
    /// Serve the stats as Prometheus metrics at http://ADDR/metrics: `PORT` (on 127.0.0.1)
    /// or `HOST:PORT` (e.g. `127.0.0.1:9187`; another host's address exposes them to it).
    #[arg(long, value_name = "[HOST:]PORT", value_parser = metrics_addr)]
    metrics: Option<std::net::SocketAddr>,
    /// Write the engine's tracepoint events (balance_dirty_pages, bdi_dirty_ratelimit,
    /// writeback_*, wbt_*) to FILE in the kernel's text format; `ebb report FILE` draws them.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// The most the trace file may hold (default 1GiB); later events are counted, not written.
    #[arg(long, value_name = "SIZE", requires = "trace")]
    trace_max: Option<String>,
    /// Serve file data with plain buffered IO on DIR instead of through ebb (for comparisons).
    #[arg(long, hide = true)]
    passthrough: bool,
    /// How the kernel's requests reach the mount: `uring` (FUSE over io_uring: Linux 6.14+ with
    /// /sys/module/fuse/parameters/enable_uring Y, else the mount fails), `classic` (read and
    /// write on /dev/fuse), or `auto` (io_uring where the kernel offers it). Default: the
    /// environment variable EBB_FUSE_LOOP, else auto.
    #[arg(long, value_name = "auto|uring|classic")]
    fuse_loop: Option<ebb_fuse::FuseLoop>,
}

/// `--metrics`: a port on the loopback address, or an address and port.
fn metrics_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().map_err(|_| format!("{text:?} is neither a port nor HOST:PORT (127.0.0.1:9187)"))
}

#[derive(Args, Debug)]
struct StatArgs {
    /// The mount to query.
    mountpoint: PathBuf,
    /// List at most N files (those with the most dirty data); `files_not_listed` counts the
    /// others.
    #[arg(long, value_name = "N", default_value_t = ebb_fuse::DEFAULT_LISTED_FILES)]
    files: usize,
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
    if let Some(code) = mount_helper::run_if_helper() {
        return code;
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("ebb: {}", error_text(&error));
            ExitCode::from(exit_code(&error))
        }
    }
}

/// Makes glibc serve every allocation of at least 128 KiB (its default threshold) with a
/// mapping of its own for the whole life of the mount process, which returns it to the system
/// when freed. By default glibc raises that threshold to the size of each large block freed, up
/// to 32 MiB, after which the mount's large buffers (the cache's frame slabs, IO buffers,
/// request copies) come from its arenas, which keep freed memory: with 16 files written at
/// once through a 256 MiB budget the mount's resident memory peaked at 377-403 MiB that way,
/// and at 313-316 MiB with the threshold fixed (BENCHMARKS.md, S3).
fn fixed_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const THRESHOLD: libc::c_int = 128 << 10;
        // SAFETY: mallopt takes two integers and only changes malloc's tuning; called before
        // the mount starts its threads.
        #[expect(unsafe_code, reason = "mallopt has no safe binding")]
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD) };
        if set != 1 {
            eprintln!(
                "ebb mount: could not fix malloc's mmap threshold; memory may exceed --memory"
            );
        }
    }
}

/// Raises the soft limit on open descriptors to the hard one: a directory mount keeps up to
/// half the soft limit open (descriptors of the files it serves, in a cache that closes and
/// reopens them), and more is fewer reopens. Failing leaves the limit as it was.
fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            eprintln!("ebb mount: could not raise the limit on open files: {error}");
        }
    }
}

/// The error and its causes, each said once: a cause whose text the message before it already
/// holds (`cannot read F: No such file` and then `No such file`) is left out.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let said = cause.to_string();
        if !text.contains(&said) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&said);
        }
    }
    text
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
                seeds: args.seeds.unwrap_or(if args.quick { 1 } else { reproduce::DEFAULT_SEEDS }),
                trace: false,
                threads: args.jobs.max(1),
            };
            let outcome = with_progress(|progress| match &args.experiments {
                Some(dir) => reproduce::reproduce(dir, &options, progress),
                None => reproduce::reproduce_embedded(&options, progress),
            })?;
            Ok(finish(&outcome, args.quick))
        }
        Command::Sim(args) => {
            let options = Options {
                out_dir: args.out,
                quick: args.quick,
                seed: args.seed,
                seeds: args.seeds,
                trace: args.trace,
                threads: args.jobs.max(1),
            };
            let outcome =
                with_progress(|progress| reproduce::sim(&args.experiment, &options, progress))?;
            Ok(finish(&outcome, args.quick))
        }
        Command::Mount(args) => mount(*args),
        Command::Bench(command) => bench::run(command),
        Command::Swarm(args) => swarm::run(args),
        Command::Top(args) => {
            let interval = std::time::Duration::from_secs_f64(args.interval.clamp(0.1, 3600.0));
            top::top(&args.mountpoint, interval)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Report(args) => report(&args),
        Command::Stat(args) => {
            let stats = ebb_fuse::read_stats_listing(&args.mountpoint, args.files)?;
            print_out(&format!("{stats}\n"))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `ebb mount`: an S3 bucket (`s3://`, with `--endpoint`), an NFS export (`nfs://`) or a
/// local directory, mounted until a signal.
fn mount(args: MountArgs) -> anyhow::Result<ExitCode> {
    fixed_mmap_threshold();
    raise_fd_limit();
    let backend = args.backend.clone();
    if let Some(url) = backend.to_str().filter(|text| text.starts_with("s3://")) {
        let Some(endpoint) = args.endpoint.clone() else {
            return Err(Usage(format!("--backend {url} needs --endpoint URL")).into());
        };
        let mut options = ebb_backend::S3Options::from_env(url, &endpoint)?;
        options.metadata_ttl =
            std::time::Duration::try_from_secs_f64(args.metadata_ttl).map_err(|_| {
                Usage(format!(
                    "--metadata-ttl {}: not a number of seconds from 0 up",
                    args.metadata_ttl
                ))
            })?;
        options.timeout = std::time::Duration::try_from_secs_f64(args.s3_timeout)
            .ok()
            .filter(|timeout| !timeout.is_zero())
            .ok_or_else(|| {
                Usage(format!("--s3-timeout {}: not a number of seconds above 0", args.s3_timeout))
            })?;
        let config = mount_config(args)?;
        let namespace = ebb_backend::S3Namespace::new(ebb_backend::S3Backend::open(options)?);
        ebb_fuse::run(&config, namespace)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(url) = backend.to_str().filter(|text| text.starts_with("nfs://")) {
        let config = mount_config(args)?;
        let namespace = ebb_backend::NfsNamespace::connect(url)?;
        ebb_fuse::run(&config, namespace)?;
        return Ok(ExitCode::SUCCESS);
    }
    let config = mount_config(args)?;
    let namespace = match config.data {
        ebb_fuse::DataMode::Ebb => ebb_fuse::DirNamespace::open(&backend),
        ebb_fuse::DataMode::Passthrough => ebb_fuse::DirNamespace::open_buffered(&backend),
    }
    .map_err(|error| {
        // A backend directory that is not there is a bad setting (exit 2), not a failed mount.
        let kind = match error.kind() {
            std::io::ErrorKind::NotFound => std::io::ErrorKind::InvalidInput,
            kind => kind,
        };
        std::io::Error::new(kind, format!("backend directory {error}"))
    })?;
    ebb_fuse::run(&config, namespace)?;
    Ok(ExitCode::SUCCESS)
}

/// `ebb report`: the report of a trace file, and a line of its figures.
fn report(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    if !args.trace.is_file() {
        let what = if args.trace.exists() { "not a file" } else { "no such file" };
        return Err(Usage(format!("{}: {what}", args.trace.display())).into());
    }
    let report = ebb_sim::report::trace_file::write_trace_report(&args.trace, &args.out)?;
    let metrics = &report.result.metrics;
    let figure = |name: &str| metrics.get(name).copied().unwrap_or(0.0);
    print_out(&format!(
        "{} tracepoints over {:.1} s, {} writers, {} pauses (p99 {:.1} ms)\nreport: {}\n",
        figure("tracepoints"),
        figure("elapsed_s"),
        figure("writers"),
        figure("pause_count"),
        figure("pause_ms_p99"),
        report.files[0].display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// A size argument (`4GiB`, `512M`, `1048576`; `ebb_core::config::parse_size` says the units).
fn size_arg(flag: &str, value: &str) -> anyhow::Result<u64> {
    config::parse_size(value).map_err(|reason| Usage(format!("{flag}: {reason}")).into())
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

/// `--knob NAME=VALUE`, parsed and checked by the knob registry.
fn knob_setting(text: &str) -> Result<Setting, String> {
    config::parse_setting(text).map_err(|error| error.to_string())
}

/// Settings as the name and value texts the runtime's `Builder::knob` takes.
fn knob_texts(settings: &[Setting]) -> Vec<(String, String)> {
    settings
        .iter()
        .map(|setting| {
            let knob = setting.knob();
            (knob.name.to_owned(), knob.render(setting.value()))
        })
        .collect()
}

/// One `--<knob>` flag per knob of the registry (but `memory_bytes`, which is `--memory`),
/// generated at start, with the knob's doc as help; the settings in registry order.
#[derive(Debug, Default)]
struct KnobFlags(Vec<Setting>);

impl KnobFlags {
    fn knobs() -> impl Iterator<Item = &'static Knob> {
        config::knobs().iter().filter(|knob| knob.name != "memory_bytes")
    }
}

impl clap::FromArgMatches for KnobFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let settings = KnobFlags::knobs()
            .filter_map(|knob| matches.get_one::<Setting>(knob.name).cloned())
            .collect();
        Ok(KnobFlags(settings))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = KnobFlags::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for KnobFlags {
    fn augment_args(mut command: clap::Command) -> clap::Command {
        for knob in KnobFlags::knobs() {
            let value_name = match knob.kind {
                config::Kind::Number { .. } => "N",
                config::Kind::Bytes { .. } => "SIZE",
                config::Kind::Bool => "BOOL",
                config::Kind::Choice(_) => "NAME",
                config::Kind::Sizes { .. } => "SIZE,...",
                config::Kind::ChoiceOrBytes { .. } => "NAME|SIZE",
            };
            let range = match knob.unit {
                "" => knob.kind.range_text(),
                unit => format!("{unit}; {}", knob.kind.range_text()),
            };
            let mut arg = clap::Arg::new(knob.name)
                .long(knob.name)
                .help_heading("Knobs (ebb_core::config's table)")
                .help(format!("{} [{range}]", knob.summary()))
                .value_name(value_name)
                .value_parser(move |text: &str| knob.parse(text).map_err(|e| e.to_string()));
            if knob.name.contains('_') {
                arg = arg.alias(knob.name.replace('_', "-").leak() as &'static str);
            }
            if knob.kind == config::Kind::Bool {
                // `--strict_limit` alone turns it on; a value needs `=` so that the
                // mountpoint after it is not taken for one.
                arg = arg.num_args(0..=1).require_equals(true).default_missing_value("1");
            }
            command = command.arg(arg);
        }
        command
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        KnobFlags::augment_args(command)
    }
}

/// Writes `text` to stdout; a reader that stops early (`ebb ... | head`) is not an error.
pub(crate) fn print_out(text: &str) -> anyhow::Result<()> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
}

/// Prints the comparison and the report's path; the exit code says whether all checks held.
fn finish(outcome: &Outcome, quick: bool) -> ExitCode {
    let mut text = format!("{}\nreport: {}\n", outcome.text(), outcome.report_html.display());
    if quick {
        text.push_str(QUICK_NOTE);
    }
    if let Err(error) = print_out(&text) {
        eprintln!("ebb: {error:#}");
        return ExitCode::FAILURE;
    }
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

/// What `--quick` output ends with (the report's title says it too).
const QUICK_NOTE: &str = "QUICK runs (each experiment's [quick] section): shortened, so the \
                          verdicts differ from the full runs'; run without --quick for those.\n";

/// Runs `work` with a progress bar on stderr; when stderr is not a terminal, a line per tenth
/// of the runs instead (`ebb reproduce: 12/48 runs done, 95 s`).
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
    let lines = !std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
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
                let finished = runs.iter().filter(|(f, name)| *f >= 1.0 && name.is_none()).count();
                let total = runs.len();
                if lines
                    && finished > 0
                    && (finished * 10 / total.max(1) != (finished - 1) * 10 / total.max(1))
                {
                    let elapsed = started.elapsed().as_secs_f64();
                    eprintln!("ebb: {finished}/{total} runs done, {elapsed:.0} s");
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
    let mut memory = memory;
    let mut settings = args.knob_flags.0;
    for setting in args.knob {
        // `memory_bytes` is the mount's `--memory`, which the mount checks against the machine.
        match (setting.knob().name, setting.value()) {
            ("memory_bytes", config::Value::Number(bytes)) => memory = Some(*bytes),
            _ => settings.push(setting),
        }
    }
    let knobs = knob_texts(&settings);
    Ok(ebb_fuse::MountConfig {
        mountpoint: args.mountpoint,
        memory,
        knobs,
        data: if args.passthrough {
            ebb_fuse::DataMode::Passthrough
        } else {
            ebb_fuse::DataMode::Ebb
        },
        metrics: args.metrics,
        fuse_loop: args.fuse_loop,
        trace: match args.trace {
            Some(path) => {
                let max = args.trace_max.as_deref().unwrap_or("1GiB");
                Some((path, size_arg("--trace-max", max)?))
            }
            None => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount_args(args: &[&str]) -> MountArgs {
        let argv = ["ebb", "mount", "--backend", "/srv"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}")).command {
            Command::Mount(args) => *args,
            other => panic!("{other:?}"),
        }
    }

    /// `ebb --help`'s first line (what `ebb` alone shows first) names every command.
    #[test]
    fn help_names_every_command_on_its_first_line() {
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        let first = help.lines().next().unwrap_or_default();
        for command in Cli::command().get_subcommands() {
            assert!(first.contains(command.get_name()), "{first:?} lacks {}", command.get_name());
        }
    }

    /// `ebb sim`, `ebb reproduce`, `ebb report` and `ebb swarm` write to folders of their own
    /// by default, so none replaces another's report.
    #[test]
    fn sim_never_replaces_the_reproduce_report() {
        let parse = |args: &[&str]| Cli::try_parse_from(["ebb"].iter().chain(args).copied());
        let out = |args: &[&str]| match parse(args).unwrap_or_else(|e| panic!("{e}")).command {
            Command::Reproduce(args) => args.out,
            Command::Sim(args) => args.out,
            Command::Report(args) => args.out,
            Command::Swarm(args) => args.out().to_owned(),
            other => panic!("{other:?}"),
        };
        let folders = [
            out(&["reproduce"]),
            out(&["sim", "x.toml", "--trace"]),
            out(&["report", "trace.txt"]),
            out(&["swarm"]),
        ];
        let unique: std::collections::BTreeSet<&PathBuf> = folders.iter().collect();
        assert_eq!(unique.len(), folders.len(), "{folders:?}");
    }

    /// Every knob has its flag (dashes or underscores), a flag alone turns a boolean on, the
    /// `--knob` list comes after the flags, and sizes follow the one convention (64MB is
    /// 64,000,000 bytes, 64M is 64 MiB).
    /// `--metrics PORT` listens on the loopback address only; other addresses are explicit.
    #[test]
    fn metrics_port_alone_is_loopback() {
        let args = mount_args(&["/mnt", "--metrics", "9187"]);
        assert_eq!(args.metrics, Some(([127, 0, 0, 1], 9187).into()));
        let args = mount_args(&["/mnt", "--metrics", "[::1]:9100"]);
        assert_eq!(args.metrics.map(|a| a.to_string()), Some("[::1]:9100".to_owned()));
        let argv = ["ebb", "mount", "--backend", "/srv", "/mnt", "--metrics", "localhost"];
        let error = Cli::try_parse_from(argv).expect_err("a host name is refused").to_string();
        assert!(error.contains("neither a port nor HOST:PORT"), "{error}");
    }

    #[test]
    fn knob_flags_come_from_the_registry() {
        let args = mount_args(&[
            "--strict-limit",
            "/mnt",
            "--dirty_bytes",
            "64MB",
            "--wbt-lat-usec",
            "5000",
            "--knob",
            "dirty_background_bytes=64M",
            "--knob",
            "memory_bytes=1GiB",
        ]);
        let config = mount_config(args).expect("valid");
        assert_eq!(config.memory, Some(1 << 30));
        let knobs: Vec<(&str, &str)> =
            config.knobs.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(
            knobs,
            [
                ("dirty_bytes", "64000000"),
                ("strict_limit", "1"),
                ("wbt_lat_usec", "5000"),
                ("dirty_background_bytes", "64MiB"),
            ]
        );
        for knob in config::knobs().iter().filter(|knob| knob.name != "memory_bytes") {
            let value = match (knob.default_value(), knob.kind) {
                (Some(value), _) => knob.render(&value),
                (None, config::Kind::Number { min, .. } | config::Kind::Bytes { min, .. }) => {
                    min.to_string()
                }
                (None, kind) => panic!("{} has no default and a {kind:?}", knob.name),
            };
            let flag = format!("--{}={value}", knob.name);
            mount_args(&[&flag, "/mnt"]);
        }
    }

    /// A bad value or an unknown knob is a usage error naming the knob and what it takes.
    #[test]
    fn bad_knobs_are_usage_errors() {
        let argv = ["ebb", "mount", "--backend", "/srv", "/mnt", "--knob", "dirty_bytes=64mb"];
        let error = Cli::try_parse_from(argv).expect_err("64mb is refused");
        assert!(error.to_string().contains("powers of 1000"), "{error}");
        let argv = ["ebb", "mount", "--backend", "/srv", "/mnt", "--dirty_ratio", "150"];
        let error = Cli::try_parse_from(argv).expect_err("150% is refused");
        assert!(error.to_string().contains("0..=100"), "{error}");
        let argv = ["ebb", "mount", "--backend", "/srv", "/mnt", "--knob", "dirty_ration=5"];
        let error = Cli::try_parse_from(argv).expect_err("unknown knob");
        assert!(error.to_string().contains("unknown knob"), "{error}");
    }

    /// The benches take a directory or an NFS export, one of them, and name what is wrong
    /// with anything else.
    #[test]
    fn bench_targets_are_a_directory_or_an_nfs_export() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["ebb", "bench"].iter().chain(args).copied())
                .map(|cli| matches!(cli.command, Command::Bench(_)))
        };
        assert!(parse(&["stream", "--dir", "/srv"]).unwrap());
        assert!(parse(&["read-under-write", "--backend", "nfs://h/x"]).unwrap());
        let error = parse(&["stream"]).expect_err("no target");
        assert!(error.to_string().contains("--dir"), "{error}");
        let error =
            parse(&["stream", "--dir", "/srv", "--backend", "nfs://h/x"]).expect_err("two targets");
        assert!(error.to_string().contains("cannot be used with"), "{error}");
        let Command::Bench(command) =
            Cli::try_parse_from(["ebb", "bench", "stream", "--backend", "s3://bucket"])
                .unwrap()
                .command
        else {
            panic!("not a bench")
        };
        let error = bench::run(command).expect_err("an S3 URL is refused");
        assert!(error.downcast_ref::<Usage>().is_some(), "{error}");
        assert!(error.to_string().contains("s3://bucket"), "{error}");
        assert!(error.to_string().contains("nfs://"), "{error}");
    }
}
