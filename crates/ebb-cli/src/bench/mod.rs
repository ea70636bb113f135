//! `ebb bench`: what ebb costs and gives on this machine, measured beside the kernel's own paths
//! in the same run.
//!
//! * [`stream`]: a streaming writer through ebb into a directory beside raw `O_DIRECT`
//!   sequential writes to the same filesystem (the ceiling ebb's writeback can reach); or,
//!   with `--backend nfs://...`, through ebb to an NFSv3 export beside a raw NFS client.
//! * [`read_under_write`]: a random 4 KiB `O_DIRECT` reader of one file while a streaming
//!   writer writes another, in five modes: the reader alone, ebb with wbt on, ebb and off,
//!   and the kernel's path (the writer's buffered writes through the page cache); on an NFS
//!   export the reader sends READs and there is no kernel mode (this machine has no kernel
//!   NFS client).
//! * [`nfs::commit_batching`]: the 2020 NFS posting's dd on a real server, once per
//!   unstable-page accounting: writepages calls and pages per call.
//! * [`write_path`]: nanoseconds per 4 KiB write into the cache with no throttling, from 1 to N
//!   threads, and the shared-counter reads per throttle check.
//!
//! Results are plain numbers printed as JSON (the keys are the contract scripts/ and
//! BENCHMARKS.md use); nothing here asserts a speed. The benches drive the runtime only
//! through its public API, as an application would.

mod blocktrace;
mod diskstats;
mod frontier_chart;
mod nfs;
mod pace;
mod read_under_write;
mod stream;
mod write_path;

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use ebb_backend::{Backend, DirBackend, NfsBackend, OpenOptions};
use ebb_core::config::Setting;
use ebb_runtime::Builder;
use serde::Serialize;

use crate::{Usage, knob_texts, size_arg};
use nfs::{CommitBatchingOptions, commit_batching};
use read_under_write::{ReadUnderWriteOptions, read_under_write};
use stream::{StreamOptions, stream};
use write_path::{WritePathOptions, write_path};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: true };
const MIB: f64 = 1024.0 * 1024.0;

#[derive(Subcommand, Debug)]
pub(crate) enum BenchCommand {
    /// A streaming writer through ebb beside raw O_DIRECT writes to the same filesystem, or
    /// beside a raw NFS client on an NFS export.
    Stream {
        /// Directory on the filesystem to test.
        #[arg(long, required_unless_present = "backend", conflicts_with = "backend")]
        dir: Option<PathBuf>,
        /// An NFSv3 export to test instead of a directory,
        /// `nfs://HOST[:PORT]/EXPORT[?mountport=N&...]` (`scripts/nfs-server` starts one).
        #[arg(long)]
        backend: Option<String>,
        /// Bytes each run writes, e.g. 4GiB.
        #[arg(long, default_value = "2GiB")]
        size: String,
        /// ebb's memory budget.
        #[arg(long, default_value = "256MiB")]
        memory: String,
        /// Rounds of (raw, ebb); the means are reported.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
        rounds: u32,
        /// At most this many bytes are streamed through the cache before each timed run, until
        /// its bandwidth estimate settles (it converges over several seconds).
        #[arg(long, default_value = "16GiB")]
        warmup: String,
        /// A knob by its kernel name, e.g. `--knob dirty_background_bytes=64M`, or ebb's
        /// `initial_write_bandwidth=2G` (repeatable).
        #[arg(long, value_name = "NAME=VALUE", value_parser = crate::knob_setting)]
        knob: Vec<Setting>,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also stream through ebb traced into FILE (`ebb mount --trace`) each round, and
        /// report the cost of tracing (`trace_cost`, the median of traced/untraced - 1).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
    },
    /// A random 4 KiB reader beside a streaming writer: idle, ebb with wbt on (the kernel's
    /// algorithm), ebb (ebb's variant) and off, and the kernel's buffered path.
    ReadUnderWrite {
        /// Directory on the filesystem to test.
        #[arg(long, required_unless_present = "backend", conflicts_with = "backend")]
        dir: Option<PathBuf>,
        /// An NFSv3 export to test instead of a directory, `nfs://HOST[:PORT]/EXPORT[?...]`:
        /// the reader sends READs, and there is no kernel mode.
        #[arg(long)]
        backend: Option<String>,
        /// Seconds per mode and round.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Rounds: the modes take turns and each mode's reads of every round are merged.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        rounds: u32,
        /// Size of the file read at random.
        #[arg(long, default_value = "1GiB")]
        read_size: String,
        /// Keep the read file (`ebb-bench-read` in the directory) for the next run, which
        /// reuses it if its size matches, instead of removing it at the end.
        #[arg(long)]
        keep_read_file: bool,
        /// ebb's memory budget, or `kernel`: ebb's dirty thresholds set to the kernel's
        /// current ones in bytes (`nr_dirty_threshold` and `nr_dirty_background_threshold` of
        /// `/proc/vmstat`) and a budget of twice the threshold, so that both writers may
        /// hold as much dirty data.
        #[arg(long, default_value = "256MiB")]
        memory: String,
        /// A knob for the ebb modes by its kernel name, e.g. `--knob wbt_lat_usec=2000`
        /// (repeatable; `wbt` itself is set by each mode).
        #[arg(long, value_name = "NAME=VALUE", value_parser = crate::knob_setting)]
        knob: Vec<Setting>,
        /// One more ebb mode, `ebb_LABEL`, with these knobs on top of `--knob` (its `wbt`
        /// included, else `ebb`), taking its turn in every round: `--variant
        /// old:io_thread_nice=0,wbt_min_depth=1` (repeatable).
        #[arg(long, value_name = "LABEL:NAME=VALUE,...", value_parser = variant)]
        variant: Vec<(String, Vec<Setting>)>,
        /// Where the reads' time went, per mode, for the reads up to p90, from p90 to p99 and
        /// above p99: the reader's wait for a CPU, the IO scheduler, the device, and the
        /// writes in service beside each read (traces the device's requests: root, tracefs;
        /// a directory only).
        #[arg(long)]
        breakdown: bool,
        /// The writers' rates, each run in every round: a share of the device's raw write rate
        /// measured at the start (`25%`), MiB/s (`200`), or `unpaced`; e.g.
        /// `--write-rate 25%,50%,75%,unpaced`. Reads are then compared at equal write work, and
        /// the result judges `wbt = ebb` against the kernel's writer at each paced rate.
        #[arg(long, value_name = "RATE[,RATE...]", default_value = "unpaced",
              value_delimiter = ',', value_parser = pace::WriteRate::parse)]
        write_rate: Vec<pace::WriteRate>,
        /// Draw the frontier (each writer mode's write rate against its reads' p99 and p99.99)
        /// as PNGs in this directory.
        #[arg(long, value_name = "DIR")]
        chart: Option<PathBuf>,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The 2020 NFS posting's experiment on a real NFS server: a dd (1 MiB writes, fsync at
    /// the end) through ebb once per unstable-page accounting, legacy-2020 and fixed;
    /// writepages calls and pages per call, with the simulator's checks.
    NfsCommitBatching {
        /// The NFSv3 export, `nfs://HOST[:PORT]/EXPORT[?mountport=N&...]`.
        #[arg(long)]
        backend: String,
        /// Bytes the dd writes (the posting's 1000 MB).
        #[arg(long, default_value = "1000MB")]
        size: String,
        /// ebb's memory budget (the simulated client's 2 GiB: its dirty threshold is well
        /// below the dd's size).
        #[arg(long, default_value = "2GiB")]
        memory: String,
        /// Rounds; the variants take turns and each variant's figures are averaged.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        rounds: u32,
        /// A knob for both variants by its kernel name (repeatable; `unstable_accounting` is
        /// set by each variant).
        #[arg(long, value_name = "NAME=VALUE", value_parser = crate::knob_setting)]
        knob: Vec<Setting>,
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

/// Runs one bench and prints its result as JSON (also written to `--json`).
pub(crate) fn run(command: BenchCommand) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Stream { dir, backend, size, memory, rounds, warmup, knob, json, trace } => {
            let json = JsonOut::create(json)?;
            let opts = StreamOptions {
                target: Target::new(dir, backend)?,
                size: at_least("--size", size_arg("--size", &size)?, 1 << 20, "one 1 MiB write")?,
                memory: size_arg("--memory", &memory)?,
                block: 1 << 20,
                rounds,
                warmup: size_arg("--warmup", &warmup)?,
                knobs: knob_texts(&knob),
                trace,
            };
            let result = stream(&opts)?;
            json.write(&result)?;
        }
        BenchCommand::ReadUnderWrite {
            dir,
            backend,
            seconds,
            rounds,
            read_size,
            memory,
            knob,
            variant,
            keep_read_file,
            breakdown,
            write_rate,
            chart,
            json,
        } => {
            let json = JsonOut::create(json)?;
            let (memory, knobs, kernel_thresholds) = memory_and_knobs(&memory, &knob)?;
            let opts = ReadUnderWriteOptions {
                knobs,
                kernel_thresholds,
                variants: variant.iter().map(|(label, s)| (label.clone(), knob_texts(s))).collect(),
                target: Target::new(dir, backend)?,
                seconds: seconds.max(1) as f64,
                read_file_size: at_least(
                    "--read-size",
                    size_arg("--read-size", &read_size)?,
                    1 << 20,
                    "1 MiB",
                )?,
                keep_read_file,
                write_file_size: 4 << 30,
                memory,
                rounds,
                breakdown,
                write_rates: pace::WriteRate::distinct(write_rate).map_err(Usage)?,
                chart,
            };
            let result = read_under_write(&opts, &mut |what| eprintln!("ebb bench: {what}"))?;
            json.write(&result)?;
        }
        BenchCommand::NfsCommitBatching { backend, size, memory, rounds, knob, json } => {
            let json = JsonOut::create(json)?;
            let opts = CommitBatchingOptions {
                backend: nfs_export(&backend)?,
                size: at_least("--size", size_arg("--size", &size)?, 1 << 20, "one 1 MiB write")?,
                memory: size_arg("--memory", &memory)?,
                rounds,
                knobs: knob_texts(&knob),
            };
            let result = commit_batching(&opts, &mut |what| eprintln!("ebb bench: {what}"))?;
            json.write(&result)?;
        }
        BenchCommand::WritePath { threads, size, passes, repeats, json } => {
            let json = JsonOut::create(json)?;
            let opts = WritePathOptions {
                threads: thread_counts(threads),
                bytes_per_thread: at_least("--size", size_arg("--size", &size)?, 4096, "one page")?,
                passes,
                repeats,
            };
            let result = write_path(&opts)?;
            json.write(&result)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--variant LABEL:NAME=VALUE,...`: a label and its knobs, each checked by the registry.
fn variant(text: &str) -> Result<(String, Vec<Setting>), String> {
    let (label, knobs) = text
        .split_once(':')
        .ok_or_else(|| format!("--variant {text:?}: expected LABEL:NAME=VALUE,..."))?;
    if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("--variant {text:?}: the label must be letters, digits or _"));
    }
    let settings = knobs.split(',').map(crate::knob_setting).collect::<Result<_, _>>()?;
    Ok((label.to_owned(), settings))
}

/// Writes and reads in flight to an NFS server, ebb's and the raw client's alike: the runtime's
/// default IO threads, set explicitly so that the two compare at the same depth.
const NFS_IN_FLIGHT: usize = 8;

/// What a bench writes to: a directory on the filesystem under test (files with `O_DIRECT`),
/// or an NFSv3 export, connected once and shared by the raw client and every ebb of the run.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// A directory.
    Dir(PathBuf),
    /// An NFS export.
    Nfs(NfsBackend),
}

impl Target {
    /// `--dir DIR` or `--backend nfs://...` (clap makes sure of one of them).
    fn new(dir: Option<PathBuf>, backend: Option<String>) -> anyhow::Result<Target> {
        match (dir, backend) {
            (Some(dir), None) => match std::fs::metadata(&dir) {
                Ok(meta) if meta.is_dir() => {
                    // A directory files cannot be made in (`/proc`) is refused now, by name,
                    // rather than by the first write's bare errno.
                    let probe = dir.join(".ebb-bench-probe");
                    std::fs::File::create(&probe).map_err(|error| {
                        Usage(format!(
                            "--dir {}: cannot create a file there: {error}",
                            dir.display()
                        ))
                    })?;
                    let _ = std::fs::remove_file(&probe);
                    Ok(Target::Dir(dir))
                }
                Ok(_) => Err(Usage(format!("--dir {}: not a directory", dir.display())).into()),
                Err(error) => Err(Usage(format!("--dir {}: {error}", dir.display())).into()),
            },
            (None, Some(url)) => Ok(Target::Nfs(nfs_export(&url)?)),
            _ => Err(Usage("give --dir DIR or --backend nfs://HOST[:PORT]/EXPORT".into()).into()),
        }
    }

    /// The target's files, without ebb.
    fn raw(&self) -> io::Result<Arc<dyn Backend>> {
        Ok(match self {
            Target::Dir(dir) => Arc::new(dir_backend(dir)?),
            Target::Nfs(backend) => Arc::new(backend.clone()),
        })
    }

    /// `builder` with the target as its backend, with the settings the kernel would give it.
    fn add_to(&self, builder: Builder) -> io::Result<Builder> {
        match self {
            Target::Dir(dir) => builder.directory(dir),
            Target::Nfs(backend) => {
                Ok(builder.io_threads(NFS_IN_FLIGHT).nfs_backend(backend.url(), backend.clone()))
            }
        }
    }
}

/// Connects to the NFS export of `--backend URL`; anything but an `nfs://` URL is a usage
/// error.
fn nfs_export(url: &str) -> anyhow::Result<NfsBackend> {
    if !url.starts_with("nfs://") {
        return Err(Usage(format!(
            "--backend {url:?}: the benches take an NFS export, nfs://HOST[:PORT]/EXPORT \
             (use --dir DIR for a directory)"
        ))
        .into());
    }
    NfsBackend::connect(url)
        .map_err(|error| io::Error::new(error.kind(), format!("--backend {url}: {error}")).into())
}

fn dir_backend(dir: &Path) -> io::Result<DirBackend> {
    DirBackend::open(dir)
}

/// Lets the filesystem finish what the last run left (freeing a deleted file's extents, the
/// journal commit), so it does not land in the next run's timed window: runs order-dependent
/// otherwise (measured: the device 100% busy at 10-15% of its write rate for about half a
/// second after a 4 GiB file is removed).
fn settle() {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(Duration::from_secs(1));
}

/// `read-under-write`'s memory and knobs: `--memory kernel` gives ebb twice the kernel's dirty
/// threshold and the kernel's two thresholds in bytes (returned too), then the `--knob`s.
#[expect(clippy::type_complexity, reason = "three results of one choice, used once")]
fn memory_and_knobs(
    memory: &str,
    knob: &[Setting],
) -> anyhow::Result<(u64, Vec<(String, String)>, Option<(u64, u64)>)> {
    let (memory, mut knobs, kernel_thresholds) = if memory == "kernel" {
        let (thresh, bg) = kernel_dirty_thresholds()?;
        let knobs = vec![
            ("dirty_bytes".to_owned(), thresh.to_string()),
            ("dirty_background_bytes".to_owned(), bg.to_string()),
        ];
        (2 * thresh, knobs, Some((thresh, bg)))
    } else {
        (size_arg("--memory", memory)?, Vec::new(), None)
    };
    knobs.extend(knob_texts(knob));
    Ok((memory, knobs, kernel_thresholds))
}

/// The thread counts `write-path` measures: 1, 2, 4, ... up to `threads`.
fn thread_counts(threads: usize) -> Vec<usize> {
    let mut counts = vec![1];
    while counts.last().is_some_and(|&n| n * 2 <= threads.max(1)) {
        counts.push(counts.last().copied().unwrap_or(1) * 2);
    }
    counts
}

/// The kernel's dirty and background thresholds now, bytes (`/proc/vmstat`).
fn kernel_dirty_thresholds() -> anyhow::Result<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/vmstat")
        .map_err(|e| anyhow::anyhow!("--memory kernel: reading /proc/vmstat: {e}"))?;
    dirty_thresholds_of(&text)
}

/// The dirty and background thresholds (bytes) in the text of `/proc/vmstat`.
fn dirty_thresholds_of(text: &str) -> anyhow::Result<(u64, u64)> {
    let pages = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
            .ok_or_else(|| anyhow::anyhow!("--memory kernel: /proc/vmstat has no {name}"))
    };
    let page = 4096;
    Ok((pages("nr_dirty_threshold")? * page, pages("nr_dirty_background_threshold")? * page))
}

/// A builder with ebb's memory budget and the given knobs.
fn builder_with(memory: u64, knobs: &[(String, String)]) -> io::Result<Builder> {
    let mut builder = Builder::new().memory(memory);
    for (name, value) in knobs {
        builder = builder.knob(name, value).map_err(config_error)?;
    }
    Ok(builder)
}

/// A configuration error of the runtime's builder, as the IO error the benches return.
fn config_error(error: ebb_core::ConfigError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("ebb configuration: {error}"))
}

/// A size option below its smallest sensible value is a usage error naming it.
fn at_least(flag: &str, value: u64, min: u64, what: &str) -> anyhow::Result<u64> {
    if value < min {
        return Err(Usage(format!("{flag} {value}: at least {what} ({min} bytes)")).into());
    }
    Ok(value)
}

/// Where a bench's JSON goes: stdout, and the `--json` file, created before the bench runs so
/// that a path that cannot be written fails at once, naming it, not after the measurement.
struct JsonOut {
    file: Option<(PathBuf, std::fs::File)>,
}

impl JsonOut {
    fn create(path: Option<PathBuf>) -> anyhow::Result<JsonOut> {
        let file = match path {
            Some(path) => match std::fs::File::create(&path) {
                Ok(file) => Some((path, file)),
                Err(error) => {
                    return Err(Usage(format!("--json {}: {error}", path.display())).into());
                }
            },
            None => None,
        };
        Ok(JsonOut { file })
    }

    /// Prints `value` as pretty JSON (a reader that stops early, `| head`, is not an error) and
    /// writes it to the file.
    fn write(self, value: &impl Serialize) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(value)?;
        crate::print_out(&format!("{text}\n"))?;
        if let Some((path, mut file)) = self.file {
            writeln!(file, "{text}")
                .map_err(|error| anyhow::anyhow!("--json {}: {error}", path.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_thresholds_come_from_vmstat_in_bytes() {
        let text =
            "nr_dirty 12\nnr_dirty_threshold 1143884\nnr_dirty_background_threshold 571240\n";
        let (thresh, bg) = super::dirty_thresholds_of(text).unwrap();
        assert_eq!((thresh, bg), (1_143_884 * 4096, 571_240 * 4096));
        let missing = super::dirty_thresholds_of("nr_dirty_threshold 5\n").unwrap_err();
        assert!(missing.to_string().contains("nr_dirty_background_threshold"), "{missing}");
    }
}
