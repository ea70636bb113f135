//! A minimal deterministic driver: dd-like writers, a FIFO device of fixed bandwidth, virtual
//! time. It exercises the same calls the simulator and runtime make.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::hash::{DefaultHasher, Hash, Hasher};

use ebb_core::*;

/// A device that serves requests one after another at `pages_per_sec`, after `latency`.
pub struct FifoDevice {
    pub pages_per_sec: u64,
    pub latency: Duration,
    pub busy_until: Instant,
    pub pages_done: u64,
}

impl FifoDevice {
    fn complete_at(&mut self, now: Instant, pages: u64) -> Instant {
        let start = now.max(self.busy_until);
        let end = start + Duration::from_nanos(pages * 1_000_000_000 / self.pages_per_sec);
        self.busy_until = end;
        self.pages_done += pages;
        end + self.latency
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Step(usize),
    Resume(usize),
    /// A non-blocking writer back before its sleep ended (`Harness::poll_early`).
    EarlyPoll(usize, Instant),
    WriteDone(IoId),
    ReadDone(IoId),
    CommitDone(IoId),
    Timer,
}

/// One dd: writes `total_pages` sequentially in `request_pages` requests.
pub struct Dd {
    pub w: Writer,
    pub inode: InodeId,
    pub handle: HandleId,
    pub pos: u64,
    pub end: u64,
    pub request_pages: u64,
    pub request_left: u64,
    pub start_at: Instant,
    pub done_at: Option<Instant>,
    /// (time, stall) of every throttle call that went past freerun.
    pub stalls: Vec<(Instant, Duration)>,
    pub checks: u64,
    /// Pages dirtied by time, sampled per request.
    pub progress: Vec<(Instant, u64)>,
    waiting: bool,
}

pub struct Harness {
    pub engine: Engine,
    pub maps: MapStore,
    pub dev: Vec<FifoDevice>,
    pub dds: Vec<Dd>,
    pub now: Instant,
    queue: BinaryHeap<Reverse<(Instant, u64, Ev)>>,
    seq: u64,
    timer_at: Option<Instant>,
    pub log: DefaultHasher,
    pub actions: u64,
    pub max_dirty: u64,
    pub max_limit: u64,
    /// ns of CPU per page dirtied (memcpy), so an unthrottled dd is fast but not infinite.
    pub ns_per_page: u64,
    pub done_requests: BTreeMap<RequestId, Result<(), IoError>>,
    pub check_every: u64,
    pub unstable_backend: Option<u64>,
    /// Every write asked for: (file, first page, pages).
    pub writes: Vec<(InodeId, u64, u64)>,
    /// Every write action's runs (a granule's scattered dirty pages are one action).
    pub write_actions: Vec<Vec<ebb_core::Run>>,
    /// Writers also come back halfway through each sleep, as a non-blocking writer polling
    /// early does (and continue only if `Writer::paused_until` says the pause is over).
    pub poll_early: bool,
    /// Every sleep a verdict asked for: (writer, from, until).
    pub sleeps: Vec<(usize, Instant, Instant)>,
    /// Files the engine forgot ([`Action::Forget`]).
    pub forgotten: u64,
    /// Files whose backend sync the engine asked for ([`Action::SyncFile`]), in order.
    pub synced_files: Vec<InodeId>,
}

impl Harness {
    pub fn new(config: Config, pages_per_sec: &[u64]) -> Harness {
        let engine = Engine::new(config, Instant::ZERO).expect("valid config");
        Harness {
            engine,
            maps: MapStore::new(),
            dev: pages_per_sec
                .iter()
                .map(|&p| FifoDevice {
                    pages_per_sec: p,
                    latency: Duration::from_micros(100),
                    busy_until: Instant::ZERO,
                    pages_done: 0,
                })
                .collect(),
            dds: Vec::new(),
            now: Instant::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            timer_at: None,
            log: DefaultHasher::new(),
            actions: 0,
            max_dirty: 0,
            max_limit: 0,
            ns_per_page: 250,
            done_requests: BTreeMap::new(),
            check_every: 0,
            unstable_backend: None,
            writes: Vec::new(),
            write_actions: Vec::new(),
            poll_early: false,
            sleeps: Vec::new(),
            forgotten: 0,
            synced_files: Vec::new(),
        }
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, ev)));
    }

    /// Adds a dd of `total_pages` on `backend`, starting at `start_at`.
    pub fn add_dd(
        &mut self,
        backend: u32,
        total_pages: u64,
        request_pages: u64,
        start_at: Instant,
    ) -> usize {
        let i = self.dds.len();
        let inode = InodeId(1000 + i as u64);
        let handle = HandleId(i as u64 + 1);
        self.engine.handle(
            self.now,
            Event::Open { handle, inode, backend: BackendId(backend) },
            &mut self.maps,
        );
        self.dds.push(Dd {
            w: Writer::new(WriterId(i as u32 + 1), GroupId(i as u32 % 2)),
            inode,
            handle,
            pos: 0,
            end: total_pages,
            request_pages,
            request_left: 0,
            start_at,
            done_at: None,
            stalls: Vec::new(),
            checks: 0,
            progress: Vec::new(),
            waiting: false,
        });
        self.push(start_at, Ev::Step(i));
        i
    }

    pub fn request(&mut self, event: Event) {
        self.engine.handle(self.now, event, &mut self.maps);
        self.drain();
    }

    /// Carries out every pending action.
    pub fn drain(&mut self) {
        while let Some(action) = self.engine.poll_action() {
            self.actions += 1;
            format!("{action:?}").hash(&mut self.log);
            match action {
                Action::Write { io, backend, inode, runs, .. } => {
                    let pages = runs.iter().map(|run| run.count).sum();
                    self.write_actions.push(runs.clone());
                    self.writes.extend(runs.iter().map(|run| (inode, run.first, run.count)));
                    let at = self.dev[backend.index()].complete_at(self.now, pages);
                    self.push(at, Ev::WriteDone(io));
                }
                Action::Read { io, backend, pages, .. } => {
                    let at = self.dev[backend.index()].complete_at(self.now, pages);
                    self.push(at, Ev::ReadDone(io));
                }
                Action::Commit { io, backend, pages, .. } => {
                    let at = self.dev[backend.index()].complete_at(self.now, pages / 16 + 1);
                    self.push(at, Ev::CommitDone(io));
                }
                Action::Resume { writer } => {
                    let i = writer.0 as usize - 1;
                    self.push(self.now, Ev::Resume(i));
                }
                Action::FsyncDone { request, result }
                | Action::SyncDone { request, result }
                | Action::CloseDone { request, result }
                | Action::ReadDone { request, result } => {
                    self.done_requests.insert(request, result);
                }
                Action::SyncFile { inode, .. } => {
                    // The backend sync at once, never failing (as the simulator's devices).
                    self.synced_files.push(inode);
                    let mark = self.engine.durable_mark(inode);
                    self.engine.handle(self.now, Event::FileSynced { inode, mark }, &mut self.maps);
                }
                Action::Forget { inode } => {
                    self.maps.remove(inode);
                    self.forgotten += 1;
                }
                Action::ReturnReserves => {
                    let writers = self.dds.iter_mut().map(|dd| &mut dd.w);
                    self.engine.return_reserves(self.now, writers, &mut self.maps);
                }
            }
        }
        if let Some(t) = self.engine.poll_timeout()
            && self.timer_at.is_none_or(|cur| t < cur)
        {
            self.timer_at = Some(t);
            self.push(t.max(self.now), Ev::Timer);
        }
        let info = self.engine.meminfo();
        self.max_dirty = self.max_dirty.max(info.dirty + info.writeback + info.unstable);
        self.max_limit = self.max_limit.max(info.limit);
    }

    /// Runs until `until` or until nothing is left to do.
    pub fn run_until(&mut self, until: Instant) {
        let mut steps = 0u64;
        while let Some(Reverse((at, _, ev))) = self.queue.pop() {
            if at > until {
                self.queue.push(Reverse((at, 0, ev)));
                break;
            }
            self.now = at;
            match ev {
                Ev::Step(i) => self.step(i),
                Ev::Resume(i) => {
                    let w = &mut self.dds[i].w;
                    let v =
                        self.engine.writer_step(self.now, w, WriterInput::Continue, &mut self.maps);
                    self.obey(i, v);
                }
                Ev::EarlyPoll(i, until) => {
                    // What a polling writer does before its pause ends: it asks the writer
                    // when the pause ends, and continues only after that.
                    let owed = self.dds[i].w.paused_until();
                    assert_eq!(owed, Some(until), "the pause owed is the verdict's");
                    if owed.is_none_or(|t| t <= self.now) {
                        let w = &mut self.dds[i].w;
                        let v = self.engine.writer_step(
                            self.now,
                            w,
                            WriterInput::Continue,
                            &mut self.maps,
                        );
                        self.obey(i, v);
                    }
                }
                Ev::WriteDone(io) => {
                    let result = match self.unstable_backend {
                        Some(v) => Ok(Stability::Unstable { verifier: v }),
                        None => Ok(Stability::Stable),
                    };
                    self.engine.handle(self.now, Event::WriteDone { io, result }, &mut self.maps);
                }
                Ev::ReadDone(io) => self.engine.handle(
                    self.now,
                    Event::ReadDone { io, result: Ok(()) },
                    &mut self.maps,
                ),
                Ev::CommitDone(io) => {
                    let v = self.unstable_backend.unwrap_or(0);
                    self.engine.handle(
                        self.now,
                        Event::CommitDone { io, result: Ok(v) },
                        &mut self.maps,
                    )
                }
                Ev::Timer => {
                    if self.timer_at == Some(at) {
                        self.timer_at = None;
                        self.engine.handle(self.now, Event::Timer, &mut self.maps);
                    }
                }
            }
            self.drain();
            steps += 1;
            if self.check_every > 0 && steps.is_multiple_of(self.check_every) {
                let writers: Vec<&Writer> = self.dds.iter().map(|d| &d.w).collect();
                if let Err(e) = self.engine.check_accounting(&self.maps, &writers) {
                    panic!("accounting broken at {}: {e}", self.now);
                }
            }
        }
    }

    /// Runs until every dd finished and all IO completed.
    pub fn run(&mut self) {
        self.run_until(Instant::from_nanos(u64::MAX));
    }

    fn step(&mut self, i: usize) {
        let dd = &mut self.dds[i];
        if dd.waiting || dd.done_at.is_some() {
            return;
        }
        if dd.request_left == 0 {
            if dd.pos >= dd.end {
                dd.done_at = Some(self.now);
                let mut w = std::mem::replace(&mut dd.w, Writer::new(WriterId(0), GroupId(0)));
                self.engine.writer_exit(self.now, &mut w, &mut self.maps);
                self.dds[i].w = w;
                return;
            }
            dd.request_left = dd.request_pages.min(dd.end - dd.pos);
            let dirtied = dd.w.total_dirtied();
            dd.progress.push((self.now, dirtied));
        }
        let (inode, pos, left) = (dd.inode, dd.pos, dd.request_left);
        let step = self.maps.with(inode, |m| write_pages(&mut self.dds[i].w, inode, m, pos, left));
        let dd = &mut self.dds[i];
        dd.pos += step.consumed;
        dd.request_left -= step.consumed;
        let cpu = Duration::from_nanos(step.consumed * self.ns_per_page);
        if step.next == NextStep::Check {
            dd.checks += 1;
        }
        let w = &mut self.dds[i].w;
        let v = self.engine.writer_step(
            self.now,
            w,
            WriterInput::Wrote { inode, step },
            &mut self.maps,
        );
        if v == WriterNext::Done {
            let at = self.now + cpu;
            self.push(at, Ev::Step(i));
        } else {
            self.obey(i, v);
        }
    }

    fn obey(&mut self, i: usize, v: WriterNext) {
        let dd = &mut self.dds[i];
        match v {
            WriterNext::Done => self.push(self.now, Ev::Step(i)),
            WriterNext::Proceed { stalled, throttled } => {
                dd.waiting = false;
                if throttled {
                    dd.stalls.push((self.now, stalled));
                }
                self.push(self.now, Ev::Step(i));
            }
            WriterNext::Sleep { until } => {
                dd.waiting = true;
                self.sleeps.push((i, self.now, until));
                self.push(until, Ev::Resume(i));
                if self.poll_early && until > self.now {
                    let half =
                        Duration::from_nanos(until.saturating_since(self.now).as_nanos() / 2);
                    self.push(self.now + half, Ev::EarlyPoll(i, until));
                }
            }
            WriterNext::Wait { .. } => dd.waiting = true,
            WriterNext::Fail { error } => {
                panic!("dd {i} failed with {error}: no harness run fails")
            }
        }
    }

    /// Stall samples (ms) of writer `i` between `from` and `to` seconds.
    pub fn stalls_ms(&self, i: usize, from_s: f64, to_s: f64) -> Vec<f64> {
        self.dds[i]
            .stalls
            .iter()
            .filter(|(t, _)| t.as_secs_f64() >= from_s && t.as_secs_f64() < to_s)
            .map(|(_, d)| d.as_millis_f64())
            .collect()
    }

    /// Pages per second writer `i` dirtied between `from` and `to` seconds.
    pub fn rate(&self, i: usize, from_s: f64, to_s: f64) -> f64 {
        let p = &self.dds[i].progress;
        let at = |s: f64| p.iter().rev().find(|(t, _)| t.as_secs_f64() <= s).map_or(0, |&(_, d)| d);
        (at(to_s) - at(from_s)) as f64 / (to_s - from_s)
    }

    pub fn hash(&self) -> u64 {
        self.log.finish()
    }
}

pub fn mean_stddev(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

pub fn config(memory_mib: u64, policy: ThrottlePolicy) -> Config {
    let mut backend = BackendConfig::new("sda");
    backend.rotational = true;
    // The dynamics reproduced here predate writeback throttling.
    backend.wbt = WbtMode::Off;
    let mut c = Config::new(memory_mib << 20, backend);
    c.throttle = policy;
    c
}

/// A throttle check of `w`, which writes `inode`, as the writer protocol makes it when
/// `write_pages` stops for one having dirtied nothing (a test's way to hand a writer frames).
pub fn check<M: PageMaps>(
    engine: &mut Engine,
    now: Instant,
    w: &mut Writer,
    inode: InodeId,
    maps: &mut M,
) -> WriterNext {
    let step = WriteStep { consumed: 0, inode_became_dirty: false, next: NextStep::Check };
    engine.writer_step(now, w, WriterInput::Wrote { inode, step }, maps)
}

pub fn secs(s: u64) -> Instant {
    Instant::ZERO + Duration::from_secs(s)
}
