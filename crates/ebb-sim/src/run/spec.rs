//! What a run is asked to do: the engine configuration, one device per backend, the
//! workloads and the faults ([`RunSpec`]).

use std::path::PathBuf;

use ebb_core::{Config, Duration};

use super::Fault;

/// A device model for one backend: a name known to [`crate::device::by_name`] and field
/// overrides from the experiment file.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSpec {
    /// Model name, e.g. `sata-2010`.
    pub model: String,
    /// Parameter overrides (same keys as the model's parameter struct).
    pub overrides: toml::Table,
}

/// A workload of a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// `dd if=/dev/zero of=FILE bs=BS count=SIZE/BS [conv=fsync]`: sequential buffered writes.
    Dd {
        /// Backend index (into `Config::backends`).
        backend: usize,
        /// Bytes to write.
        size_bytes: u64,
        /// Bytes per write call.
        bs_bytes: u64,
        /// When it starts.
        start: Duration,
        /// fsync at the end.
        fsync: bool,
        /// Time between write calls (application think time).
        think: Duration,
        /// Once this many bytes are written, the file is truncated to `.1` bytes and the
        /// writing goes on from there (a log rolled back), if set.
        truncate: Option<(u64, u64)>,
        /// After its close, the file is unlinked (its cached pages dropped).
        unlink: bool,
    },
    /// A random 4 KiB reader with O_DIRECT (fio `rw=randread direct=1 iodepth=1`): reads
    /// `bs_bytes` at random aligned offsets of a `size_bytes` file, one at a time, bypassing
    /// the cache, until every writer has finished.
    RandomReader {
        /// Backend index.
        backend: usize,
        /// Size of the file it reads.
        size_bytes: u64,
        /// Bytes per read.
        bs_bytes: u64,
        /// When it starts.
        start: Duration,
    },
    /// `cp SRC DST`: reads a file already on the device (not cached) and writes a copy.
    Cp {
        /// Backend index.
        backend: usize,
        /// Bytes to copy.
        size_bytes: u64,
        /// Bytes per read and write call.
        bs_bytes: u64,
        /// When it starts.
        start: Duration,
    },
    /// Workloads that make reclaim work: fs_mark, mmap-strm, anonymous churn
    /// ([`crate::memload`]).
    Memory(crate::memload::MemoryWorkload),
}

impl Workload {
    /// When it starts.
    pub fn start(&self) -> Duration {
        match self {
            Workload::Dd { start, .. }
            | Workload::Cp { start, .. }
            | Workload::RandomReader { start, .. } => *start,
            Workload::Memory(memory) => memory.start(),
        }
    }
}

/// Everything one run needs.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// `<case>/<variant>`.
    pub name: String,
    /// The engine configuration (memory, knobs, policies, backends).
    pub config: Config,
    /// One device per entry of `config.backends`.
    pub devices: Vec<DeviceSpec>,
    /// What the applications do.
    pub workloads: Vec<Workload>,
    /// Seed of the run's only random number generator.
    pub seed: u64,
    /// Stop after this much virtual time even if work remains.
    pub time_limit: Duration,
    /// Interval of the time series.
    pub sample_interval: Duration,
    /// Steady-state metrics (rates, pause statistics) ignore the time before this.
    pub steady_from: Duration,
    /// Report how long the first backend's bandwidth estimate and dirty ratelimit take to
    /// settle within this fraction of the rate its device achieves (`bw_settle_s`,
    /// `ratelimit_settle_s`, `device_write_mb_s`); `None`: not reported.
    pub settle_within: Option<f64>,
    /// Where to write `trace.txt` and `trace.json`, if anywhere.
    pub trace_dir: Option<PathBuf>,
    /// Faults injected by the environment (never by the engine).
    pub faults: Vec<Fault>,
    /// The run ends at this crash, or ebb restarts after it, if any.
    pub crash: Option<Crash>,
}

/// A crash that ends a run (or restarts ebb): ebb and its applications stop at `at`, with all cached state;
/// the devices keep what they hold durably. A checked run ([`super::run_checked`]) verifies
/// there that every byte an fsync acknowledged is in the durable image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crash {
    /// When, from the start of the run.
    pub at: Duration,
    /// The machine loses power: the devices' volatile write caches are lost too (an NFS
    /// server's memory is not, the server is another machine, but only what it committed
    /// counts as durable). Otherwise only ebb's process dies and the devices destage their
    /// caches.
    pub power_cut: bool,
    /// ebb starts again at once over what the devices kept (a new engine, the applications'
    /// files reopened, unfinished writers going on from where they were) instead of the run
    /// ending.
    pub restart: bool,
}
