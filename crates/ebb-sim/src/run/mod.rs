//! One simulated run: the engine, device models and workloads in virtual time.
//!
//! [`run`] takes a [`RunSpec`] (an engine configuration, one device model per backend, the
//! workloads, a seed, faults) and drives `ebb_core::Engine` with a single-threaded
//! discrete-event loop exactly as the runtime would drive it: writers dirty pages through the
//! writer protocol (`write_pages`, `Engine::writer_step`) and sleep or wait as it says, and the engine's write, read and
//! commit actions become device requests whose completions come back as events. It returns
//! metrics (the names of product.md's summary.json), time series for plots, and optionally
//! writes trace files.
//!
//! The loop is here; the rest by concern: `spec.rs` (what a run is asked to do), `setup.rs`
//! (the world built from the spec), `writers.rs` (dd, cp and the memory workloads' plans),
//! `readers.rs` (O_DIRECT readers), `io.rs` (actions to devices, completions to the engine),
//! `faults.rs` (fault windows), `metrics.rs` (series and metrics), `trace.rs` (trace files).

mod checks;
mod faults;
mod io;
mod metrics;
mod readers;
mod restart;
mod setup;
mod spec;
mod trace;
mod writers;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;

use ebb_core::{Duration, Engine, Event, InodeId, Instant, MapStore, RequestId, WriterInput};

pub use checks::{CheckReport, PlantedBug};
pub use faults::Fault;
pub use spec::{Crash, DeviceSpec, RunSpec, Workload};

use crate::device::Device;
use crate::output::hist::LatencyHistogram;
use crate::prng::Prng;
use crate::queue::EventQueue;
use checks::Checker;
use io::IoPending;
use readers::Reader;
use trace::Tracer;
use writers::{SimWriter, WriterState};

/// One named time series, for plots: (seconds, value).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimeSeries {
    /// Name, e.g. `dirty`, `setpoint`, `limit`, `dirty_ratelimit`.
    pub name: String,
    /// Unit of the values, e.g. `pages`, `KB/s`.
    pub unit: String,
    /// Samples.
    pub points: Vec<(f64, f64)>,
}

/// What a run produced.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// The run's name.
    pub name: String,
    /// Metrics with product.md's names (`elapsed_s`, `write_mb_s`, `pause_ms_*`, ...).
    pub metrics: BTreeMap<String, f64>,
    /// Time series: `dirty`, `writeback`, `setpoint`, `limit`, `thresh`, `bg_thresh`,
    /// `dirty_ratelimit`, `write_bw`, `avg_write_bw`, and `writer<N>_dirtied` per writer.
    pub series: Vec<TimeSeries>,
    /// Every throttle call past freerun: (time s, stall ms, writer index).
    pub pauses: Vec<(f64, f64, u32)>,
    /// Writes the engine failed (held pages filled the cache, or the backend stayed
    /// unreachable past its retry timeout): (time s, writer index, errno).
    pub write_failures: Vec<(f64, u32, i32)>,
    /// Simulated pages written to devices, for the speed benchmark.
    pub simulated_pages: u64,
    /// The distribution of read latencies: (latency us, fraction of reads at most that),
    /// increasing; empty when nothing was read.
    pub read_latency_cdf: Vec<(f64, f64)>,
    /// Writepages calls by pages written: entry `i` counts calls that wrote `[2^(i-1), 2^i)`
    /// pages, entry 0 those that wrote none (`Engine::writepages_sizes`).
    pub writepages_sizes: Vec<u64>,
}

impl RunResult {
    /// A series by name.
    pub fn series(&self, name: &str) -> Option<&TimeSeries> {
        self.series.iter().find(|s| s.name == name)
    }
}

/// Why a run could not be carried out.
#[derive(Debug)]
pub enum SimError {
    /// The engine configuration was rejected.
    Config(ebb_core::ConfigError),
    /// A device model name or override was rejected.
    Device(crate::device::DeviceError),
    /// The spec is inconsistent (e.g. a workload names a backend that does not exist).
    Spec(String),
    /// Writing trace files failed.
    Io(std::io::Error),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Config(e) => write!(f, "engine configuration: {e}"),
            SimError::Device(e) => write!(f, "device: {e}"),
            SimError::Spec(s) => write!(f, "run spec: {s}"),
            SimError::Io(e) => write!(f, "trace output: {e}"),
        }
    }
}

impl std::error::Error for SimError {}

/// CPU time to copy one page into the cache: an unthrottled writer dirties ~16 GB/s.
const NS_PER_PAGE: u64 = 250;
const PAGE: u64 = ebb_core::PAGE_SIZE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    Step(usize),
    Resume(usize),
    Device(usize),
    Timer,
    Sample,
    ReaderStep(usize),
    /// A completion a latency spike held back (key into `Sim::delayed`).
    Delayed(u64),
    /// `RunSpec::crash`: the run ends.
    Crash,
}

struct Sim<'a> {
    spec: &'a RunSpec,
    engine: Engine,
    maps: MapStore,
    devices: Vec<Box<dyn Device>>,
    scheduled: Vec<Option<Instant>>,
    queue: EventQueue<Ev>,
    writers: Vec<SimWriter>,
    base: BTreeMap<InodeId, u64>,
    ios: BTreeMap<u64, IoPending>,
    next_request: u64,
    timer_at: Option<Instant>,
    now: Instant,
    pauses: Vec<(f64, f64, u32)>,
    write_failures: Vec<(f64, u32, i32)>,
    series: BTreeMap<&'static str, Vec<(f64, f64)>>,
    writer_series: Vec<Vec<(f64, f64)>>,
    pages_done: u64,
    pages_total: u64,
    device_pages: u64,
    read_pages: u64,
    max_dirty: u64,
    max_limit: u64,
    /// Each backend's most dirty + writeback + unstable pages at a sample.
    backend_dirty_max: Vec<u64>,
    trace: Option<Tracer>,
    readers: Vec<Reader>,
    fsync_errors: u64,
    /// Backend syncs the engine asked for (`Action::SyncFile`: commits owed to files whose
    /// close failed).
    owed_syncs: u64,
    fsync_errno: i32,
    read_latency: LatencyHistogram,
    read_started: BTreeMap<RequestId, (usize, Instant)>,
    rng: Prng,
    /// Address space and identities for files created during the run.
    next_base: u64,
    next_file: u64,
    /// Per device: completions and their summed latency (iostat's await).
    device_waits: Vec<(u64, Duration)>,
    /// Writepages calls and pages when the last writer finished: what a user reading the
    /// counters right after the workload sees (the posting `004_*` reads NFS mountstats after
    /// dd exits), without the flusher's later passes over files it still lists.
    writepages_at_end: Option<(u64, u64)>,
    /// Completions held back by a latency spike, by key.
    delayed: BTreeMap<u64, Event>,
    next_delayed: u64,
    /// The checkers of a checked run.
    check: Option<Box<Checker>>,
    /// Driver flushes of a checked run by id: the file and the engine's durable mark taken
    /// before it (`Engine::durable_mark`), reported as `Event::FileSynced` when it completes.
    file_syncs: BTreeMap<u64, (InodeId, u64)>,
    /// The epoch bits of device request ids (`Sim::dev_id`): 0, then bumped at each restart
    /// of ebb after a crash.
    io_epoch: u64,
}

/// Runs one simulation. `progress` receives the fraction of the workload done, now and then.
pub fn run(spec: &RunSpec, progress: &mut dyn FnMut(f64)) -> Result<RunResult, SimError> {
    let mut sim = Sim::new(spec)?;
    sim.run(progress)?;
    Ok(sim.finish())
}

/// Runs one simulation under the checkers of `checks.rs` (the swarm's): the engine's
/// accounting after every event, the durability of what fsync acknowledged after a crash and
/// at the end, errseq, and the pause bound of the `ioless` throttle. The first violation ends
/// the run. Each writer that finishes closes its file, so the close's error report is checked
/// too. `planted` plants a driver bug (the swarm's own tests).
pub fn run_checked(
    spec: &RunSpec,
    planted: Option<PlantedBug>,
) -> Result<(RunResult, CheckReport), SimError> {
    let mut sim = Sim::new(spec)?;
    let max_sleep = spec
        .config
        .throttle
        .has_position_control()
        .then(|| ebb_core::MAX_PAUSE + Duration::from_nanos(1_000_000_000 / spec.config.hz));
    if let Some(PlantedBug::Core(bug)) = planted
        && !sim.engine.plant(bug)
    {
        return Err(SimError::Spec(format!(
            "cannot plant {bug:?}: ebb-core was built without its `planted-bugs` feature"
        )));
    }
    sim.check = Some(Box::new(Checker::new(max_sleep, planted)));
    sim.run(&mut |_| {})?;
    let check = sim.check.as_deref_mut().expect("set above");
    if !check.failed() && !check.report.crashed {
        check.check_durable(sim.now, false, "at the end");
        // Every fault over and the cache drained by the final sync: nothing may be missing.
        let faults_end = spec.faults.iter().all(|f| f.until.is_some() || f.errno == 0);
        let mi = sim.engine.meminfo();
        if faults_end && check.report.synced && mi.dirty + mi.writeback + mi.unstable == 0 {
            check.check_nothing_lost(sim.now);
        }
        sim.check_durable_claims(None, "at the end");
    }
    let report = sim.check.take().expect("set above").finish();
    Ok((sim.finish(), report))
}

impl Sim<'_> {
    fn run(&mut self, progress: &mut dyn FnMut(f64)) -> Result<(), SimError> {
        let limit = Instant::ZERO + self.spec.time_limit;
        let mut last_progress = 0.0;
        // The only unbounded loop of the simulator: it ends when the event queue drains (every
        // writer done and every IO complete) or at the time limit.
        while let Some((at, ev)) = self.queue.pop() {
            if at > limit {
                break;
            }
            self.now = at;
            match ev {
                Ev::Step(i) => self.step(i),
                Ev::Resume(i) => {
                    // A sleep ended or a wait was answered: the writer continues its call.
                    let w = &mut self.writers[i].w;
                    let v =
                        self.engine.writer_step(self.now, w, WriterInput::Continue, &mut self.maps);
                    self.obey(i, v);
                }
                Ev::Device(b) => {
                    if self.scheduled[b] != Some(at) {
                        continue;
                    }
                    self.scheduled[b] = None;
                    self.device_events(b);
                }
                Ev::Timer => {
                    if self.timer_at != Some(at) {
                        continue;
                    }
                    self.timer_at = None;
                    self.engine.handle(self.now, Event::Timer, &mut self.maps);
                }
                Ev::ReaderStep(r) => self.reader_step(r),
                Ev::Delayed(key) => {
                    if let Some(event) = self.delayed.remove(&key) {
                        self.deliver(event);
                    }
                }
                Ev::Crash => {
                    self.crash();
                    if !self.spec.crash.is_some_and(|c| c.restart) {
                        break;
                    }
                    self.restart()?;
                }
                Ev::Sample => {
                    self.sample();
                    self.end_background();
                    if self.writers.iter().any(|w| w.state != WriterState::Done) {
                        self.queue.push(self.now + self.spec.sample_interval, Ev::Sample);
                    }
                    let done = self.pages_done as f64 / self.pages_total.max(1) as f64;
                    if done - last_progress >= 0.01 {
                        last_progress = done;
                        progress(done);
                    }
                }
            }
            self.drain()?;
            if self.check_event() {
                break;
            }
        }
        progress(1.0);
        if let Some(t) = &mut self.trace {
            t.txt.flush().map_err(SimError::Io)?;
        }
        Ok(())
    }

    /// The checkers after an event: true if the run must end (a violation).
    fn check_event(&mut self) -> bool {
        let Some(check) = self.check.as_deref_mut() else { return false };
        check.report.events += 1;
        let writers: Vec<&ebb_core::Writer> = self.writers.iter().map(|w| &w.w).collect();
        if let Err(e) = self.engine.check_accounting(&self.maps, &writers) {
            check.fail(self.now, "accounting", e);
        }
        check.failed()
    }

    /// `RunSpec::crash`: ebb stops here; the checkers look at the durable image.
    fn crash(&mut self) {
        let power_cut = self.spec.crash.is_some_and(|c| c.power_cut);
        let restart = self.spec.crash.is_some_and(|c| c.restart);
        if let Some(check) = self.check.as_deref_mut() {
            check.report.crashed = !restart;
            let when = if power_cut { "after a power cut" } else { "after ebb crashed" };
            check.check_durable(self.now, !power_cut, when);
            self.check_durable_claims(None, when);
        }
    }

    /// The durability watermarks' claim (`Engine::durable_ranges`, what `File::durable_len`
    /// reports): every page of `inode` (every file written, for `None`) the engine calls
    /// durable holds its last application write in the durable image (volatile caches
    /// excluded: the claim is about a crash of the backend).
    fn check_durable_claims(&mut self, inode: Option<InodeId>, when: &str) {
        let Some(check) = self.check.as_deref_mut() else { return };
        for (inode, pages) in check.written_files(inode) {
            let ranges = self.engine.durable_ranges(inode, pages * PAGE, &mut self.maps);
            check.check_claim(self.now, inode, &ranges, when);
        }
    }

    fn request(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }
}
