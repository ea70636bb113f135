//! One simulated run: the engine, device models and workloads in virtual time.
//!
//! [`run`] takes a [`RunSpec`] (an engine configuration, one device model per backend, the
//! workloads, a seed) and drives `ebb_core::Engine` with a single-threaded discrete-event loop
//! exactly as the runtime would drive it: writers dirty pages through `write_pages`, obey the
//! engine's verdicts (sleep, wait), and the engine's write, read and commit actions become
//! device requests whose completions come back as events. It returns metrics (the names of
//! product.md's summary.json), time series for plots, and optionally writes trace files.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use ebb_core::{
    Action, BackendId, Config, Duration, Engine, Event, GroupId, HandleId, InodeId, Instant,
    IoClass, IoError, IoId, MapStore, NextStep, PageMaps, RequestId, Stability, TraceEvent,
    Verdict, Writer, WriterId, write_pages,
};

use crate::device::{Device, DeviceRequest, IoOp};
use crate::memload::{NS_PER_FAULT, Plan, Seg};
use crate::prng::Prng;
use crate::queue::EventQueue;
use crate::report::chrome_trace::ChromeTrace;
use crate::report::hist::{LatencyHistogram, SampleStats};

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
    /// Where to write `trace.txt` and `trace.json`, if anywhere.
    pub trace_dir: Option<PathBuf>,
    /// Faults injected by the environment (never by the engine).
    pub faults: Vec<Fault>,
}

/// A fault window on `backend` over `[from, until)` (`until: None` = forever), whatever the
/// device did: writes that complete in it fail with `errno` unless it is 0, and every
/// completion of a write, read or COMMIT in it reaches the engine `delay` later (a latency
/// spike: a stalled controller, a network partition that heals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Backend index.
    pub backend: usize,
    /// The errno writes fail with (5 EIO, 28 ENOSPC, 30 EROFS, ...); 0: they succeed.
    pub errno: i32,
    /// Start of the window.
    pub from: Duration,
    /// End of the window, if it ends.
    pub until: Option<Duration>,
    /// Extra latency of completions in the window.
    pub delay: Duration,
}

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
    /// Simulated pages written to devices, for the speed benchmark.
    pub simulated_pages: u64,
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriterState {
    NotStarted,
    Running,
    Blocked,
    Reading(RequestId),
    Fsyncing(RequestId),
    Done,
}

struct SimWriter {
    w: Writer,
    inode: InodeId,
    handle: HandleId,
    src: Option<InodeId>,
    pos: u64,
    end: u64,
    bs: u64,
    left: u64,
    think: Duration,
    fsync: bool,
    state: WriterState,
    started: Option<Instant>,
    finished: Option<Instant>,
    /// Memory workloads (`Workload::Memory`): what follows the current segment.
    plan: std::collections::VecDeque<Seg>,
    /// Repeated while foreground writers run; a writer with a cycle is in the background.
    cycle: Vec<Seg>,
    cycle_start: Instant,
    backend: usize,
    /// The current segment faults in anonymous memory rather than writing a file.
    anon: bool,
    anon_held: u64,
    /// Follows a plan (`Workload::Memory`).
    planned: bool,
    /// Where the current segment began in its file (`Seg::Append` continues a file).
    seg_start: u64,
    /// Pages done in finished segments.
    done_before: u64,
    files_done: u64,
    count_files: bool,
    /// The second file of `Seg::Append`: inode, handle, next page.
    append: Option<(InodeId, HandleId, u64)>,
}

enum IoPending {
    Write(IoId),
    Read(IoId),
    Commit(IoId),
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
    series: BTreeMap<&'static str, Vec<(f64, f64)>>,
    writer_series: Vec<Vec<(f64, f64)>>,
    pages_done: u64,
    pages_total: u64,
    device_pages: u64,
    read_pages: u64,
    max_dirty: u64,
    max_limit: u64,
    trace: Option<Tracer>,
    readers: Vec<Reader>,
    fsync_errors: u64,
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
}

/// An O_DIRECT random reader.
struct Reader {
    backend: usize,
    base: u64,
    pages: u64,
    bs_pages: u64,
    start: Duration,
    issued: Option<(u64, Instant)>,
    reads: u64,
}

/// Identities of direct reads, apart from the engine's IO identities.
const DIRECT_READ_BIT: u64 = 1 << 62;

/// Writes trace.txt and trace.json as the run goes.
struct Tracer {
    txt: BufWriter<File>,
    json: ChromeTrace<File>,
    names: Vec<String>,
}

/// Runs one simulation. `progress` receives the fraction of the workload done, now and then.
pub fn run(spec: &RunSpec, progress: &mut dyn FnMut(f64)) -> Result<RunResult, SimError> {
    let mut sim = Sim::new(spec)?;
    sim.run(progress)?;
    Ok(sim.finish())
}

impl<'a> Sim<'a> {
    fn new(spec: &'a RunSpec) -> Result<Sim<'a>, SimError> {
        if spec.devices.len() != spec.config.backends.len() {
            return Err(SimError::Spec(format!(
                "{}: {} devices for {} backends",
                spec.name,
                spec.devices.len(),
                spec.config.backends.len()
            )));
        }
        let mut config = spec.config.clone();
        config.trace = spec.trace_dir.is_some();
        let mut engine = Engine::new(config, Instant::ZERO).map_err(SimError::Config)?;
        let mut rng = Prng::new(spec.seed);
        let devices = spec
            .devices
            .iter()
            .map(|d| crate::device::by_name_with_overrides(&d.model, rng.next_u64(), &d.overrides))
            .collect::<Result<Vec<_>, _>>()
            .map_err(SimError::Device)?;
        let mut maps = MapStore::new();
        let mut writers = Vec::new();
        let mut base = BTreeMap::new();
        let mut next_base = 1u64 << 30;
        let mut queue = EventQueue::new();
        let mut pages_total = 0;
        let mut readers = Vec::new();
        for (i, wl) in spec.workloads.iter().enumerate() {
            if let Workload::RandomReader { backend, size_bytes, bs_bytes, start } = *wl {
                if backend >= spec.config.backends.len() {
                    return Err(SimError::Spec(format!(
                        "workload {i} names backend {backend}, which does not exist"
                    )));
                }
                if bs_bytes < PAGE || size_bytes < bs_bytes {
                    return Err(SimError::Spec(format!(
                        "workload {i}: reader block size {bs_bytes} or size {size_bytes} too small"
                    )));
                }
                readers.push(Reader {
                    backend,
                    base: next_base,
                    pages: size_bytes / PAGE,
                    bs_pages: bs_bytes / PAGE,
                    start,
                    issued: None,
                    reads: 0,
                });
                next_base += size_bytes.next_multiple_of(1 << 30);
                continue;
            }
            if let Workload::Memory(mw) = wl {
                mw.validate().map_err(|(field, reason)| {
                    SimError::Spec(format!("workload {i}: {field}: {reason}"))
                })?;
                for plan in mw.plans() {
                    if plan.backend >= spec.config.backends.len() {
                        return Err(SimError::Spec(format!(
                            "workload {i} names backend {}, which does not exist",
                            plan.backend
                        )));
                    }
                    if plan.cycle.is_empty() {
                        pages_total += plan_pages(&plan);
                    }
                    let w = writers.len();
                    queue.push(Instant::ZERO + plan.start, Ev::Step(w));
                    writers.push(SimWriter::planned(w, plan));
                }
                continue;
            }
            let (backend, size, bs, start, fsync, think, cp) = match *wl {
                Workload::Dd { backend, size_bytes, bs_bytes, start, fsync, think } => {
                    (backend, size_bytes, bs_bytes, start, fsync, think, false)
                }
                Workload::Cp { backend, size_bytes, bs_bytes, start } => {
                    (backend, size_bytes, bs_bytes, start, false, Duration::ZERO, true)
                }
                Workload::RandomReader { .. } | Workload::Memory(_) => {
                    unreachable!("handled above")
                }
            };
            if backend >= spec.config.backends.len() {
                return Err(SimError::Spec(format!(
                    "workload {i} names backend {backend}, which does not exist"
                )));
            }
            if bs < PAGE || size == 0 {
                return Err(SimError::Spec(format!(
                    "workload {i}: block size {bs} or size {size} too small"
                )));
            }
            let pages = size.div_ceil(PAGE);
            pages_total += pages;
            let mut place = |inode: InodeId| {
                base.insert(inode, next_base);
                next_base += (pages * PAGE).next_multiple_of(1 << 30);
            };
            let w = writers.len();
            let inode = InodeId(2 * i as u64 + 1);
            let handle = HandleId(i as u64 + 1);
            place(inode);
            let src = cp.then(|| InodeId(2 * i as u64 + 2));
            if let Some(src) = src {
                place(src);
                engine.handle(
                    Instant::ZERO,
                    Event::Open {
                        handle: HandleId(1000 + i as u64),
                        inode: src,
                        backend: BackendId(backend as u32),
                    },
                    &mut maps,
                );
            }
            engine.handle(
                Instant::ZERO,
                Event::Open { handle, inode, backend: BackendId(backend as u32) },
                &mut maps,
            );
            writers.push(SimWriter {
                w: Writer::new(WriterId(w as u32), GroupId(w as u32)),
                inode,
                handle,
                src,
                pos: 0,
                end: pages,
                bs: bs / PAGE,
                left: 0,
                think,
                fsync,
                state: WriterState::NotStarted,
                started: None,
                finished: None,
                plan: Default::default(),
                cycle: Vec::new(),
                cycle_start: Instant::ZERO,
                backend,
                anon: false,
                anon_held: 0,
                planned: false,
                seg_start: 0,
                done_before: 0,
                files_done: 0,
                count_files: false,
                append: None,
            });
            queue.push(Instant::ZERO + start, Ev::Step(w));
        }
        for (r, reader) in readers.iter().enumerate() {
            queue.push(Instant::ZERO + reader.start, Ev::ReaderStep(r));
        }
        queue.push(Instant::ZERO, Ev::Sample);
        let trace = match &spec.trace_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(SimError::Io)?;
                let txt =
                    BufWriter::new(File::create(dir.join("trace.txt")).map_err(SimError::Io)?);
                let mut json = ChromeTrace::create(&dir.join("trace.json"))
                    .map_err(|e| SimError::Spec(e.to_string()))?;
                let _ = json.process_name(1, &spec.name);
                let names = spec.config.backends.iter().map(|b| b.name.clone()).collect();
                Some(Tracer { txt, json, names })
            }
            None => None,
        };
        let n = writers.len();
        Ok(Sim {
            spec,
            engine,
            maps,
            scheduled: vec![None; devices.len()],
            devices,
            queue,
            writers,
            base,
            ios: BTreeMap::new(),
            next_request: 1,
            timer_at: None,
            now: Instant::ZERO,
            pauses: Vec::new(),
            series: BTreeMap::new(),
            writer_series: vec![Vec::new(); n],
            pages_done: 0,
            pages_total,
            device_pages: 0,
            read_pages: 0,
            max_dirty: 0,
            max_limit: 0,
            trace,
            readers,
            fsync_errors: 0,
            fsync_errno: 0,
            read_latency: LatencyHistogram::new(),
            read_started: BTreeMap::new(),
            rng: rng.fork(),
            next_base,
            next_file: 1 << 32,
            device_waits: vec![(0, Duration::ZERO); spec.devices.len()],
            writepages_at_end: None,
            delayed: BTreeMap::new(),
            next_delayed: 0,
        })
    }

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
                    let v = self.engine.throttle_continue(
                        self.now,
                        &mut self.writers[i].w,
                        &mut self.maps,
                    );
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
                        self.engine.handle(self.now, event, &mut self.maps);
                    }
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
        }
        progress(1.0);
        if let Some(t) = &mut self.trace {
            t.txt.flush().map_err(SimError::Io)?;
        }
        Ok(())
    }

    /// Carries out the engine's actions and keeps the timers scheduled.
    fn drain(&mut self) -> Result<(), SimError> {
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::Write { io, backend, inode, first_page, pages, class, .. } => {
                    self.submit(
                        backend,
                        io.0,
                        IoOp::Write,
                        inode,
                        first_page,
                        pages,
                        class == IoClass::Sync,
                    );
                    self.ios.insert(io.0, IoPending::Write(io));
                    self.device_pages += pages;
                }
                Action::Read { io, backend, inode, first_page, pages } => {
                    self.submit(backend, io.0, IoOp::Read, inode, first_page, pages, true);
                    self.ios.insert(io.0, IoPending::Read(io));
                    self.read_pages += pages;
                }
                Action::Commit { io, backend, inode, .. } => {
                    // A local disk makes written data durable with a cache flush; to the
                    // nfs-server model a flush is a COMMIT.
                    self.submit(backend, io.0, IoOp::Flush, inode, 0, 0, true);
                    self.ios.insert(io.0, IoPending::Commit(io));
                }
                Action::Resume { writer } => {
                    let i = writer.0 as usize;
                    self.queue.push(self.now, Ev::Resume(i));
                }
                Action::FsyncDone { request, result } => {
                    if let Err(e) = result {
                        self.fsync_errors += 1;
                        self.fsync_errno = e.errno;
                    }
                    if let Some(i) =
                        self.writers.iter().position(|w| w.state == WriterState::Fsyncing(request))
                    {
                        self.finish_writer(i);
                    }
                }
                Action::ReadDone { request, .. } => {
                    if let Some((_, started)) = self.read_started.remove(&request) {
                        // Each read call's latency, cache hits included (read-to-pipe-async).
                        let ns = self.now.saturating_since(started).as_nanos().max(1_000);
                        self.read_latency.record(ns);
                    }
                    if let Some(i) =
                        self.writers.iter().position(|w| w.state == WriterState::Reading(request))
                    {
                        self.writers[i].state = WriterState::Running;
                        self.queue.push(self.now, Ev::Step(i));
                    }
                }
                Action::SyncDone { .. } | Action::CloseDone { .. } => {}
            }
        }
        if let Some(t) = self.engine.poll_timeout()
            && self.timer_at.is_none_or(|cur| t < cur)
        {
            let t = t.max(self.now);
            self.timer_at = Some(t);
            self.queue.push(t, Ev::Timer);
        }
        if self.trace.is_some() {
            self.write_trace()?;
        }
        Ok(())
    }

    #[expect(clippy::too_many_arguments, reason = "one device request")]
    fn submit(
        &mut self,
        backend: BackendId,
        id: u64,
        op: IoOp,
        inode: InodeId,
        first_page: u64,
        pages: u64,
        sync: bool,
    ) {
        let b = backend.index();
        let offset = self.base.get(&inode).copied().unwrap_or(0) + first_page * PAGE;
        self.devices[b].submit(self.now, DeviceRequest { id, op, offset, len: pages * PAGE, sync });
        self.reschedule(b);
    }

    /// The fault windows covering `now` on backend `b`.
    fn faults_now(&self, b: usize) -> impl Iterator<Item = &Fault> {
        let t = self.now.saturating_since(Instant::ZERO);
        self.spec
            .faults
            .iter()
            .filter(move |f| f.backend == b && f.from <= t && f.until.is_none_or(|u| t < u))
    }

    /// The errno writes completing now on backend `b` fail with, if any.
    fn fault(&self, b: usize) -> Option<i32> {
        self.faults_now(b).map(|f| f.errno).find(|&e| e != 0)
    }

    /// The extra latency of completions now on backend `b` (the longest spike covering now).
    fn spike(&self, b: usize) -> Duration {
        self.faults_now(b).map(|f| f.delay).max().unwrap_or(Duration::ZERO)
    }

    fn reschedule(&mut self, b: usize) {
        if let Some(t) = self.devices[b].next_event_time()
            && self.scheduled[b].is_none_or(|cur| t < cur)
        {
            self.scheduled[b] = Some(t);
            self.queue.push(t, Ev::Device(b));
        }
    }

    fn device_events(&mut self, b: usize) {
        let mut done = Vec::new();
        self.devices[b].advance(self.now, &mut done);
        for c in done {
            self.device_waits[b].0 += 1;
            self.device_waits[b].1 += c.latency;
            if c.id & DIRECT_READ_BIT != 0 {
                self.direct_read_done(c.id, c.latency);
                continue;
            }
            // A two-phase backend (NFS) reports the verifier; a local device reports none.
            let event = match self.ios.remove(&c.id) {
                Some(IoPending::Write(io)) => {
                    let stability = match c.verifier {
                        Some(verifier) => Stability::Unstable { verifier },
                        None => Stability::Stable,
                    };
                    let result = match self.fault(b) {
                        Some(errno) => Err(IoError { errno }),
                        None => Ok(stability),
                    };
                    Event::WriteDone { io, result }
                }
                Some(IoPending::Read(io)) => Event::ReadDone { io, result: Ok(()) },
                Some(IoPending::Commit(io)) => {
                    Event::CommitDone { io, result: Ok(c.verifier.unwrap_or(0)) }
                }
                None => continue,
            };
            let spike = self.spike(b);
            if spike > Duration::ZERO {
                self.next_delayed += 1;
                self.delayed.insert(self.next_delayed, event);
                self.queue.push(self.now + spike, Ev::Delayed(self.next_delayed));
                continue;
            }
            self.engine.handle(self.now, event, &mut self.maps);
        }
        self.reschedule(b);
    }

    /// Advances writer `i` through its workload until it must wait.
    fn step(&mut self, i: usize) {
        // Bounded: each turn consumes pages, starts a request, or stops the writer.
        for _ in 0..100_000 {
            let sw = &mut self.writers[i];
            match sw.state {
                WriterState::NotStarted => {
                    sw.state = WriterState::Running;
                    sw.started = Some(self.now);
                }
                WriterState::Running => {}
                _ => return,
            }
            if sw.left == 0 {
                if sw.pos >= sw.end && sw.planned {
                    if self.next_segment(i) {
                        continue;
                    }
                    return;
                }
                if sw.anon {
                    self.anon_step(i);
                    return;
                }
                if sw.pos >= sw.end {
                    if sw.fsync {
                        let request = self.request();
                        let sw = &mut self.writers[i];
                        self.engine.flush_writer(self.now, &mut sw.w, &mut self.maps);
                        sw.state = WriterState::Fsyncing(request);
                        let handle = sw.handle;
                        self.engine.handle(
                            self.now,
                            Event::Fsync { handle, request },
                            &mut self.maps,
                        );
                    } else {
                        self.finish_writer(i);
                    }
                    return;
                }
                sw.left = sw.bs.min(sw.end - sw.pos);
                if let Some(src) = sw.src {
                    let (first, pages) = (sw.pos, sw.left);
                    let request = self.request();
                    self.writers[i].state = WriterState::Reading(request);
                    self.read_started.insert(request, (i, self.now));
                    self.engine.handle(
                        self.now,
                        Event::Read { inode: src, first_page: first, pages, request },
                        &mut self.maps,
                    );
                    return;
                }
            }
            let sw = &mut self.writers[i];
            let (inode, pos, left) = (sw.inode, sw.pos, sw.left);
            let step = self.maps.with(inode, |m| write_pages(&mut sw.w, inode, m, pos, left));
            sw.pos += step.consumed;
            sw.left -= step.consumed;
            self.pages_done += step.consumed;
            if step.inode_became_dirty {
                self.engine.inode_dirtied(self.now, inode);
            }
            let verdict = match step.next {
                NextStep::Done => {
                    // The write call is done: the copy took CPU time, then the application thinks.
                    let sw = &self.writers[i];
                    let at = self.now + Duration::from_nanos(sw.bs * NS_PER_PAGE) + sw.think;
                    self.queue.push(at, Ev::Step(i));
                    return;
                }
                NextStep::Check => self.engine.balance_dirty_pages(
                    self.now,
                    &mut self.writers[i].w,
                    &mut self.maps,
                ),
                NextStep::Busy(page) => self.engine.wait_for_page(
                    self.now,
                    &mut self.writers[i].w,
                    inode,
                    page,
                    &mut self.maps,
                ),
            };
            if !self.obey_inline(i, verdict) {
                return;
            }
        }
        panic!("writer {i} makes no progress at {}", self.now);
    }

    /// Applies a verdict; true if the writer may go on at once.
    fn obey_inline(&mut self, i: usize, v: Verdict) -> bool {
        match v {
            Verdict::Proceed { stalled, throttled } => {
                if throttled {
                    self.pauses.push((self.now.as_secs_f64(), stalled.as_millis_f64(), i as u32));
                }
                self.writers[i].state = WriterState::Running;
                true
            }
            Verdict::Sleep { until } => {
                self.writers[i].state = WriterState::Blocked;
                self.queue.push(until, Ev::Resume(i));
                false
            }
            Verdict::Wait => {
                self.writers[i].state = WriterState::Blocked;
                false
            }
        }
    }

    fn obey(&mut self, i: usize, v: Verdict) {
        if self.obey_inline(i, v) {
            self.step(i);
        }
    }

    fn finish_writer(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        sw.state = WriterState::Done;
        sw.finished = Some(self.now);
        self.engine.writer_exit(self.now, &mut sw.w, &mut self.maps);
        if self.writers.iter().all(|w| w.state == WriterState::Done) {
            let stats = self.engine.stats();
            self.writepages_at_end = Some((stats.writepages_calls, stats.writepages_pages));
        }
    }

    fn request(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }

    fn sample(&mut self) {
        let t = self.now.as_secs_f64();
        let m = self.engine.meminfo();
        let bdi = self.engine.bdi_stats(BackendId(0));
        let freerun = (m.thresh + m.bg_thresh) / 2;
        let setpoint = (freerun + m.limit) / 2;
        let dirty = m.dirty + m.writeback + m.unstable;
        self.max_dirty = self.max_dirty.max(dirty);
        self.max_limit = self.max_limit.max(m.limit);
        let values: [(&'static str, f64); 10] = [
            ("dirty", dirty as f64),
            ("writeback", m.writeback as f64),
            ("setpoint", setpoint as f64),
            ("limit", m.limit as f64),
            ("thresh", m.thresh as f64),
            ("bg_thresh", m.bg_thresh as f64),
            ("freerun", freerun as f64),
            ("dirty_ratelimit", (bdi.dirty_ratelimit * 4) as f64),
            ("write_bw", (bdi.write_bandwidth * 4) as f64),
            ("avg_write_bw", (bdi.avg_write_bandwidth * 4) as f64),
        ];
        for (name, v) in values {
            self.series.entry(name).or_default().push((t, v));
        }
        if bdi.wbt_target_us > 0 {
            // Writeback throttling on the first backend: its limits and the latency it saw.
            let wbt: [(&'static str, f64); 3] = [
                ("wbt_max_depth", f64::from(bdi.wbt_max_depth)),
                ("wbt_background", f64::from(bdi.wbt_background)),
                ("wbt_read_min_us", bdi.wbt_read_min_us as f64),
            ];
            for (name, v) in wbt {
                self.series.entry(name).or_default().push((t, v));
            }
        }
        for (i, sw) in self.writers.iter().enumerate() {
            self.writer_series[i].push((t, sw.w.total_dirtied() as f64));
        }
        if let Some(tr) = &mut self.trace {
            let ts = t * 1e6;
            let _ = tr.json.counter(
                1,
                "pages",
                ts,
                &[
                    ("dirty", dirty as f64),
                    ("setpoint", setpoint as f64),
                    ("limit", m.limit as f64),
                ],
            );
            let _ = tr.json.counter(
                1,
                "KB/s",
                ts,
                &[
                    ("dirty_ratelimit", (bdi.dirty_ratelimit * 4) as f64),
                    ("write_bw", (bdi.write_bandwidth * 4) as f64),
                ],
            );
        }
    }

    fn write_trace(&mut self) -> Result<(), SimError> {
        let events = self.engine.drain_trace();
        let Some(tr) = &mut self.trace else { return Ok(()) };
        for (at, ev) in events {
            let task = match ev.writer() {
                Some(w) => format!("dd-{}", w.0 + 1),
                None => "kworker/u8:0-1".to_string(),
            };
            writeln!(
                tr.txt,
                "{task:>16} [000] {:>13.6}: {}",
                at.as_secs_f64(),
                ev.render(&tr.names)
            )
            .map_err(SimError::Io)?;
            if let TraceEvent::BalanceDirtyPages { writer, pause_ms, .. } = ev
                && pause_ms > 0
            {
                let _ = tr.json.complete(
                    1,
                    writer.0 + 2,
                    "pause",
                    "balance_dirty_pages",
                    at.as_secs_f64() * 1e6,
                    pause_ms as f64 * 1e3,
                    &[],
                );
            }
        }
        Ok(())
    }

    /// Issues the next O_DIRECT read of reader `r`, unless every writer is done.
    fn reader_step(&mut self, r: usize) {
        if self.writers.iter().all(|w| w.state == WriterState::Done) {
            return;
        }
        let reader = &self.readers[r];
        let slots = (reader.pages / reader.bs_pages).max(1);
        let page = self.rng.below(slots) * reader.bs_pages;
        let (b, offset, len) = (reader.backend, reader.base + page * PAGE, reader.bs_pages * PAGE);
        let id = DIRECT_READ_BIT | ((r as u64) << 40) | (reader.reads & ((1 << 40) - 1));
        self.readers[r].issued = Some((id, self.now));
        self.readers[r].reads += 1;
        self.engine.handle(
            self.now,
            Event::DirectReadStart { backend: BackendId(b as u32), id },
            &mut self.maps,
        );
        self.devices[b]
            .submit(self.now, DeviceRequest { id, op: IoOp::Read, offset, len, sync: true });
        self.reschedule(b);
    }

    fn direct_read_done(&mut self, id: u64, latency: Duration) {
        let r = ((id & !DIRECT_READ_BIT) >> 40) as usize;
        let b = self.readers[r].backend;
        self.readers[r].issued = None;
        self.read_latency.record(latency.as_nanos().max(1));
        self.read_pages += self.readers[r].bs_pages;
        self.engine.handle(
            self.now,
            Event::DirectRead { backend: BackendId(b as u32), id, latency },
            &mut self.maps,
        );
        self.queue.push(self.now, Ev::ReaderStep(r));
    }

    fn finish(mut self) -> RunResult {
        let spec = self.spec;
        let stats = self.engine.stats().clone();
        let fg = || self.writers.iter().filter(|w| w.cycle.is_empty());
        let start = fg().filter_map(|w| w.started).min().unwrap_or(Instant::ZERO);
        let end = fg().filter_map(|w| w.finished).max().unwrap_or(self.now);
        let elapsed = end.saturating_since(start).as_secs_f64().max(1e-9);
        let bytes: u64 = fg().map(|w| (w.done_before + w.pos - w.seg_start) * PAGE).sum();
        let files: u64 = fg().map(|w| w.files_done).sum();
        let unfinished = fg().filter(|w| w.state != WriterState::Done).count();
        let mut m = BTreeMap::new();
        m.insert("elapsed_s".to_string(), elapsed);
        m.insert("writers_unfinished".to_string(), unfinished as f64);
        m.insert("write_mb_s".to_string(), bytes as f64 / 1e6 / elapsed);
        m.insert("read_mb_s".to_string(), (self.read_pages * PAGE) as f64 / 1e6 / elapsed);
        let steady = spec.steady_from.as_secs_f64();
        let steady_pauses: Vec<f64> =
            self.pauses.iter().filter(|p| p.0 >= steady).map(|p| p.1).collect();
        let stats_p = SampleStats::new(steady_pauses);
        if !stats_p.is_empty() {
            m.insert("pause_ms_p50".into(), stats_p.percentile(50.0));
            m.insert("pause_ms_p99".into(), stats_p.percentile(99.0));
            m.insert("pause_ms_max".into(), stats_p.max());
            m.insert("pause_ms_min".into(), stats_p.min());
            m.insert("pause_ms_mean".into(), stats_p.mean());
            m.insert("pause_ms_stddev".into(), stats_p.stddev());
        }
        m.insert("pause_count".into(), stats_p.count() as f64);
        m.insert("dirty_pages_max".into(), self.max_dirty as f64);
        m.insert("dirty_limit_pages".into(), self.max_limit as f64);
        m.insert("writer_writeback_pages".into(), stats.writer_writeback_pages as f64);
        m.insert("throttle_checks".into(), stats.throttle_checks as f64);
        m.insert(
            "global_counter_reads_per_check".into(),
            stats.global_counter_reads as f64 / stats.throttle_checks.max(1) as f64,
        );
        let (calls, pages) =
            self.writepages_at_end.unwrap_or((stats.writepages_calls, stats.writepages_pages));
        m.insert("writepages_calls".into(), calls as f64);
        m.insert("pages_per_writepages_mean".into(), pages as f64 / calls.max(1) as f64);
        m.insert("commits".into(), stats.commits as f64);
        if stats.commits > 0 {
            m.insert(
                "pages_per_commit_mean".into(),
                stats.commit_pages as f64 / stats.commits as f64,
            );
        }
        m.insert("kswapd_pages_written".into(), stats.kswapd_written as f64);
        m.insert("direct_reclaim_pages_written".into(), stats.direct_written as f64);
        m.insert("direct_reclaim_scanned".into(), stats.direct_scanned as f64);
        crate::memload::reclaim_metrics(&mut m, &stats, elapsed, files, &self.device_waits);
        m.insert(
            "kswapd_efficiency".into(),
            if stats.kswapd_scanned == 0 {
                1.0
            } else {
                stats.kswapd_reclaimed as f64 / stats.kswapd_scanned as f64
            },
        );
        if self.writers.len() > 1 {
            m.insert("writer_rate_ratio".into(), self.rate_ratio());
        }
        let servers: Vec<_> = self.devices.iter().filter_map(|d| d.nfs_stats()).collect();
        if !servers.is_empty() {
            // Only runs against an NFS server: what the server holds durably at the end, and
            // the client's pages that are not clean (the crash-safety checker's inputs).
            let sum = |f: fn(&crate::device::NfsStats) -> u64| -> f64 {
                servers.iter().map(f).sum::<u64>() as f64
            };
            m.insert("server_durable_bytes".into(), sum(|s| s.durable_bytes));
            m.insert("server_uncommitted_bytes".into(), sum(|s| s.uncommitted_bytes));
            m.insert("server_lost_bytes".into(), sum(|s| s.lost_bytes));
            m.insert("server_restarts".into(), sum(|s| s.restarts));
            m.insert("verifier_redirtied".into(), stats.verifier_redirtied as f64);
        }
        let mi = self.engine.meminfo();
        m.insert("end_unclean_pages".into(), (mi.dirty + mi.writeback + mi.unstable) as f64);
        m.insert("write_errors".into(), stats.write_errors as f64);
        m.insert("fsync_errors".into(), self.fsync_errors as f64);
        m.insert("fsync_errno".into(), f64::from(self.fsync_errno));
        if !self.read_latency.is_empty() {
            for (name, value) in self.read_latency.percentiles_us("read_lat_us") {
                m.insert(name, value);
            }
            m.insert("read_count".into(), self.read_latency.count() as f64);
        }
        let mut series: Vec<TimeSeries> = std::mem::take(&mut self.series)
            .into_iter()
            .map(|(name, points)| TimeSeries {
                unit: if name.contains("bw") || name.contains("ratelimit") {
                    "KB/s"
                } else if name.ends_with("_us") {
                    "us"
                } else if name.starts_with("wbt_") {
                    "requests"
                } else {
                    "pages"
                }
                .into(),
                name: name.into(),
                points,
            })
            .collect();
        for (i, points) in std::mem::take(&mut self.writer_series).into_iter().enumerate() {
            series.push(TimeSeries {
                name: format!("writer{i}_dirtied"),
                unit: "pages".into(),
                points,
            });
        }
        if let Some(mut tr) = self.trace.take() {
            let _ = tr.txt.flush();
            let _ = tr.json.finish();
        }
        RunResult {
            name: spec.name.clone(),
            metrics: m,
            series,
            pauses: std::mem::take(&mut self.pauses),
            simulated_pages: self.device_pages + self.read_pages,
        }
    }

    /// Fastest over slowest dirtying rate among writers, over the window where all of them
    /// run in steady state: from `steady_from` after the last one started to when the first
    /// one finished.
    fn rate_ratio(&self) -> f64 {
        let last_start =
            self.writers.iter().filter_map(|w| w.started).max().unwrap_or(Instant::ZERO);
        let first_end =
            self.writers.iter().map(|w| w.finished.unwrap_or(self.now)).min().unwrap_or(self.now);
        let from = (last_start + self.spec.steady_from).as_secs_f64();
        let to = first_end.as_secs_f64();
        if to <= from {
            return f64::NAN;
        }
        let rates: Vec<f64> = self
            .writer_series
            .iter()
            .map(|s| {
                let at = |t: f64| s.iter().rev().find(|p| p.0 <= t).map_or(0.0, |p| p.1);
                (at(to) - at(from)) / (to - from)
            })
            .collect();
        let max = rates.iter().cloned().fold(f64::MIN, f64::max);
        let min = rates.iter().cloned().fold(f64::MAX, f64::min);
        if min <= 0.0 { f64::INFINITY } else { max / min }
    }
}

/// Pages a plan writes or faults in (for progress).
fn plan_pages(plan: &Plan) -> u64 {
    plan.segs
        .iter()
        .map(|s| match *s {
            Seg::File(n) | Seg::Append(n) | Seg::Anon(n) => n,
            _ => 0,
        })
        .sum()
}

impl SimWriter {
    /// A writer following a memory workload's plan (it starts with no segment).
    fn planned(w: usize, plan: Plan) -> SimWriter {
        SimWriter {
            w: Writer::new(WriterId(w as u32), GroupId(w as u32)),
            inode: InodeId(0),
            handle: HandleId(0),
            src: None,
            pos: 0,
            end: 0,
            bs: plan.bs_pages.max(1),
            left: 0,
            think: Duration::ZERO,
            fsync: false,
            state: WriterState::NotStarted,
            started: None,
            finished: None,
            plan: plan.segs.into(),
            cycle: plan.cycle,
            cycle_start: Instant::ZERO,
            backend: plan.backend,
            anon: false,
            anon_held: 0,
            planned: true,
            seg_start: 0,
            done_before: 0,
            files_done: 0,
            count_files: plan.count_files,
            append: None,
        }
    }
}

impl Sim<'_> {
    /// Ends writer `i`'s current segment and starts the next: true if the writer goes on at
    /// once, false if it sleeps or has finished.
    fn next_segment(&mut self, i: usize) -> bool {
        self.end_segment(i);
        let sw = &mut self.writers[i];
        if sw.plan.is_empty() {
            let foreground_running =
                self.writers.iter().any(|w| w.cycle.is_empty() && w.state != WriterState::Done);
            let sw = &mut self.writers[i];
            if sw.cycle.is_empty() || !foreground_running {
                self.free_anon(i);
                self.finish_writer(i);
                return false;
            }
            sw.plan = sw.cycle.clone().into();
            sw.cycle_start = self.now;
        }
        let sw = &mut self.writers[i];
        let seg = sw.plan.pop_front().expect("refilled above");
        sw.done_before += sw.pos - sw.seg_start;
        sw.pos = 0;
        sw.seg_start = 0;
        sw.end = 0;
        sw.anon = false;
        match seg {
            Seg::File(n) => {
                let (inode, handle) = self.new_file(i, n);
                let sw = &mut self.writers[i];
                sw.inode = inode;
                sw.handle = handle;
                sw.end = n;
                true
            }
            Seg::Append(n) => {
                let (inode, handle, at) = match self.writers[i].append {
                    Some(a) => a,
                    None => {
                        let (inode, handle) = self.new_file(i, 1 << 20);
                        (inode, handle, 0)
                    }
                };
                let sw = &mut self.writers[i];
                sw.inode = inode;
                sw.handle = handle;
                sw.append = Some((inode, handle, at));
                sw.pos = at;
                sw.seg_start = at;
                sw.end = at + n;
                true
            }
            Seg::Anon(n) => {
                sw.anon = true;
                sw.end = n;
                true
            }
            Seg::FreeAnon => {
                self.free_anon(i);
                true
            }
            Seg::Sleep(d) => {
                self.queue.push(self.now + d, Ev::Step(i));
                false
            }
            Seg::SleepUntilNext(period) => {
                let at = (sw.cycle_start + period).max(self.now);
                self.queue.push(at, Ev::Step(i));
                false
            }
        }
    }

    /// Closes the file of a finished file segment.
    fn end_segment(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        if sw.anon || sw.end == 0 {
            return;
        }
        if let Some((inode, handle, at)) = sw.append
            && inode == sw.inode
        {
            sw.append = Some((inode, handle, at.max(sw.pos)));
            return;
        }
        if sw.count_files {
            sw.files_done += 1;
        }
        self.engine.flush_writer(self.now, &mut sw.w, &mut self.maps);
        let request = self.request();
        let handle = self.writers[i].handle;
        self.engine.handle(self.now, Event::Close { handle, request }, &mut self.maps);
    }

    /// Opens a new file of up to `pages` for writer `i`.
    fn new_file(&mut self, i: usize, pages: u64) -> (InodeId, HandleId) {
        self.next_file += 1;
        let inode = InodeId(self.next_file);
        let handle = HandleId(self.next_file);
        self.base.insert(inode, self.next_base);
        self.next_base += (pages * PAGE).next_multiple_of(1 << 30);
        let backend = BackendId(self.writers[i].backend as u32);
        self.engine.handle(self.now, Event::Open { handle, inode, backend }, &mut self.maps);
        (inode, handle)
    }

    /// Background writers (anon-churn) end once every foreground writer has finished, even in
    /// the middle of a sleep.
    fn end_background(&mut self) {
        if self.writers.iter().any(|w| w.cycle.is_empty() && w.state != WriterState::Done) {
            return;
        }
        for i in 0..self.writers.len() {
            if !self.writers[i].cycle.is_empty() && self.writers[i].state != WriterState::Done {
                self.free_anon(i);
                self.finish_writer(i);
            }
        }
    }

    fn free_anon(&mut self, i: usize) {
        let pages = std::mem::take(&mut self.writers[i].anon_held);
        if pages > 0 {
            self.engine.handle(self.now, Event::AnonFree { pages }, &mut self.maps);
        }
    }

    /// Faults in the next batch of the writer's anonymous segment.
    fn anon_step(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        let want = sw.bs.min(sw.end - sw.pos);
        let (got, verdict) = self.engine.anon_fault(self.now, &mut sw.w, want, &mut self.maps);
        sw.pos += got;
        sw.anon_held += got;
        if sw.cycle.is_empty() {
            self.pages_done += got;
        }
        if got > 0 {
            let at = self.now + Duration::from_nanos(got * NS_PER_FAULT);
            self.queue.push(at, Ev::Step(i));
        } else {
            self.obey_inline(i, verdict);
        }
    }
}
