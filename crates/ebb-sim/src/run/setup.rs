//! The world of a run built from its spec: the engine, one device per backend, a writer per
//! stream and per memory-workload plan, the readers, and the first events.

use std::collections::BTreeMap;

use ebb_core::{BackendId, Duration, Engine, Event, HandleId, InodeId, Instant, MapStore};

use super::readers::Reader;
use super::writers::{SimWriter, plan_pages};
use super::{Ev, PAGE, RunSpec, Sim, SimError, Tracer, Workload};
use crate::memload::MemoryWorkload;
use crate::output::hist::LatencyHistogram;
use crate::prng::Prng;
use crate::queue::EventQueue;

/// Each file gets its own gigabyte-aligned region of the device's address space.
const FILE_REGION_ALIGN: u64 = 1 << 30;

impl<'a> Sim<'a> {
    pub(super) fn new(spec: &'a RunSpec) -> Result<Sim<'a>, SimError> {
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
        let engine = Engine::new(config, Instant::ZERO).map_err(SimError::Config)?;
        let mut rng = Prng::new(spec.seed);
        let devices = spec
            .devices
            .iter()
            .map(|d| crate::device::by_name_with_overrides(&d.model, rng.next_u64(), &d.overrides))
            .collect::<Result<Vec<_>, _>>()
            .map_err(SimError::Device)?;
        let mut sim = Sim {
            spec,
            engine,
            maps: MapStore::new(),
            scheduled: vec![None; devices.len()],
            devices,
            queue: EventQueue::new(),
            writers: Vec::new(),
            base: BTreeMap::new(),
            ios: BTreeMap::new(),
            next_request: 1,
            timer_at: None,
            now: Instant::ZERO,
            pauses: Vec::new(),
            write_failures: Vec::new(),
            series: BTreeMap::new(),
            writer_series: Vec::new(),
            pages_done: 0,
            pages_total: 0,
            device_pages: 0,
            read_pages: 0,
            max_dirty: 0,
            max_limit: 0,
            backend_dirty_max: vec![0; spec.devices.len()],
            trace: None,
            readers: Vec::new(),
            fsync_errors: 0,
            owed_syncs: 0,
            fsync_errno: 0,
            read_latency: LatencyHistogram::new(),
            read_started: BTreeMap::new(),
            rng: rng.fork(),
            next_base: 1 << 30,
            next_file: 1 << 32,
            device_waits: vec![(0, Duration::ZERO); spec.devices.len()],
            writepages_at_end: None,
            delayed: BTreeMap::new(),
            next_delayed: 0,
            check: None,
            file_syncs: BTreeMap::new(),
            io_epoch: 0,
        };
        for (i, workload) in spec.workloads.iter().enumerate() {
            sim.add_workload(i, workload)?;
        }
        for (r, reader) in sim.readers.iter().enumerate() {
            sim.queue.push(Instant::ZERO + reader.start, Ev::ReaderStep(r));
        }
        sim.queue.push(Instant::ZERO, Ev::Sample);
        if let Some(crash) = spec.crash {
            sim.queue.push(Instant::ZERO + crash.at, Ev::Crash);
        }
        sim.trace = Tracer::create(spec)?;
        sim.writer_series = vec![Vec::new(); sim.writers.len()];
        Ok(sim)
    }

    fn add_workload(&mut self, i: usize, workload: &Workload) -> Result<(), SimError> {
        let (mut truncate, mut unlink) = (None, false);
        let (backend, size, bs, start, fsync, think, cp) = match *workload {
            Workload::RandomReader { backend, size_bytes, bs_bytes, start } => {
                return self.add_reader(i, backend, size_bytes, bs_bytes, start);
            }
            Workload::Memory(ref memory) => return self.add_plans(i, memory),
            Workload::Dd {
                backend,
                size_bytes,
                bs_bytes,
                start,
                fsync,
                think,
                truncate: cut,
                unlink: gone,
            } => {
                truncate = cut.map(|(at, to)| (at.div_ceil(PAGE), to / PAGE));
                unlink = gone;
                (backend, size_bytes, bs_bytes, start, fsync, think, false)
            }
            Workload::Cp { backend, size_bytes, bs_bytes, start } => {
                (backend, size_bytes, bs_bytes, start, false, Duration::ZERO, true)
            }
        };
        self.check_backend(i, backend)?;
        if bs < PAGE || size == 0 {
            return Err(SimError::Spec(format!(
                "workload {i}: block size {bs} or size {size} too small"
            )));
        }
        let pages = size.div_ceil(PAGE);
        self.pages_total += pages;
        let w = self.writers.len();
        let inode = InodeId(2 * i as u64 + 1);
        let handle = HandleId(i as u64 + 1);
        self.place(inode, pages);
        let src = cp.then(|| InodeId(2 * i as u64 + 2));
        let backend_id = BackendId(backend as u32);
        if let Some(src) = src {
            self.place(src, pages);
            let event =
                Event::Open { handle: HandleId(1000 + i as u64), inode: src, backend: backend_id };
            self.engine.handle(Instant::ZERO, event, &mut self.maps);
        }
        let event = Event::Open { handle, inode, backend: backend_id };
        self.engine.handle(Instant::ZERO, event, &mut self.maps);
        self.writers.push(SimWriter {
            inode,
            handle,
            src,
            end: pages,
            bs: bs / PAGE,
            think,
            fsync,
            truncate,
            unlink,
            ..SimWriter::idle(w, backend)
        });
        self.queue.push(Instant::ZERO + start, Ev::Step(w));
        Ok(())
    }

    /// Gives `inode` the next free region of the device address space, for `pages`.
    fn place(&mut self, inode: InodeId, pages: u64) {
        self.base.insert(inode, self.next_base);
        self.next_base += (pages * PAGE).next_multiple_of(FILE_REGION_ALIGN);
    }

    fn check_backend(&self, i: usize, backend: usize) -> Result<(), SimError> {
        if backend >= self.spec.config.backends.len() {
            return Err(SimError::Spec(format!(
                "workload {i} names backend {backend}, which does not exist"
            )));
        }
        Ok(())
    }

    fn add_reader(
        &mut self,
        i: usize,
        backend: usize,
        size_bytes: u64,
        bs_bytes: u64,
        start: Duration,
    ) -> Result<(), SimError> {
        self.check_backend(i, backend)?;
        if bs_bytes < PAGE || size_bytes < bs_bytes {
            return Err(SimError::Spec(format!(
                "workload {i}: reader block size {bs_bytes} or size {size_bytes} too small"
            )));
        }
        self.readers.push(Reader {
            backend,
            base: self.next_base,
            pages: size_bytes / PAGE,
            bs_pages: bs_bytes / PAGE,
            start,
            issued: None,
            reads: 0,
        });
        self.next_base += size_bytes.next_multiple_of(FILE_REGION_ALIGN);
        Ok(())
    }

    fn add_plans(&mut self, i: usize, memory: &MemoryWorkload) -> Result<(), SimError> {
        memory.validate().map_err(|(field, reason)| {
            SimError::Spec(format!("workload {i}: {field}: {reason}"))
        })?;
        for plan in memory.plans() {
            self.check_backend(i, plan.backend)?;
            if plan.cycle.is_empty() {
                self.pages_total += plan_pages(&plan);
            }
            let w = self.writers.len();
            self.queue.push(Instant::ZERO + plan.start, Ev::Step(w));
            self.writers.push(SimWriter::planned(w, plan));
        }
        Ok(())
    }
}
