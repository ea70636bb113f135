//! The driver: the engine behind one lock, page maps behind per-file locks, and the threads that
//! carry out the engine's actions.
//!
//! # Locks and their order
//!
//! `Shared::core` (the engine and the driver's request tables) is entered once per throttle
//! check, per IO completion, per timer and per request; never per page. Each file's page map has
//! its own lock: writers dirty pages and copy bytes under it alone (ebb-core's writer path), and
//! the engine takes it through [`PageMaps`] while it holds `core`. The order is always
//! `core` -> `files` (read) -> one page map -> one frame; a thread holding a page map never asks
//! for `core`. The per-file `size_lock` (shared by backend writes, exclusive for trims) is
//! taken with no other lock held, and nothing is waited for under it but the backend call.
//!
//! # Threads
//!
//! * IO workers (`io_threads`, default 8, at nice `io_thread_nice`) take jobs from one queue: a
//!   write gathers the frames of its run into an aligned buffer and writes it at once (the
//!   core sized the run; the backend's request slots pace it), a commit commits; each reports
//!   its completion to the engine.
//! * Read workers ([`crate::READ_THREADS`], at the caller's priority) take the reads from a
//!   queue of their own and fill the frames the core assigned, from buffers of their own pool
//!   where the budget has room for one: a read never waits for a writer's thread or buffer. For a backend whose writes to one
//!   file run one at a time anyway (`Capabilities::serial_writes`, a local filesystem), a
//!   write's buffer goes to the file's [`Lane`] instead, whose driver writes back to back.
//! * The timer thread sleeps until the engine's `poll_timeout` (flusher periods, wbt windows,
//!   retries) and delivers `Event::Timer`. Any entry that brings the timeout forward wakes it.
//! * The alarm thread (`alarm.rs`) wakes futures whose throttle pause has ended.
//! * Callers' threads are the writers and readers: they sleep for the pauses the engine decides
//!   (or return them, non-blocking writers) and wait for the answers to their requests.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam::channel::{Receiver, Sender};
use ebb_backend::{AlignedBuf, Backend, BackendFile, Capabilities};
use ebb_core::{
    Action, BackendId, Engine, Event, FrameId, HandleId, InodeId, IoError, IoId, PAGE_SIZE,
    PageMap, PageMaps, RequestId, Stability, Writer, WriterId, WriterInput, WriterNext,
};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::bufpool::BufPool;
use crate::frames::FramePool;
pub(crate) mod durable;
mod io_threads;

pub(crate) use io_threads::Lane;

pub(crate) const PAGE: usize = PAGE_SIZE as usize;

/// How a cached file is named: by a backend file name (`Ebb::open`) or by the caller's key
/// (`Ebb::attach`, e.g. a FUSE inode number).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FileKey {
    Name(String),
    Id(u64),
}

/// One backend the runtime writes to.
pub(crate) struct BackendSlot {
    pub(crate) name: String,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) caps: Capabilities,
}

/// A cached file: its pages, its backend file and its logical size.
pub(crate) struct FileState {
    pub(crate) inode: InodeId,
    pub(crate) backend: BackendId,
    pub(crate) file: Arc<dyn BackendFile>,
    pub(crate) map: Mutex<PageMap>,
    /// The logical size: the backend's size at open, moved by writes and `set_len`. Writeback
    /// writes whole pages and trims the backend file back to this.
    pub(crate) size: AtomicU64,
    /// Trims of the backend file against writes to it: every backend write of the file's pages
    /// holds it shared for the write's duration, every trim (`set_size` to the logical size)
    /// holds it exclusive and reads the size inside. A trim that read the size before a write
    /// past it landed would otherwise cut that write's bytes off after it was reported done.
    pub(crate) size_lock: RwLock<()>,
    /// Serialises `set_len` calls.
    pub(crate) truncate_lock: Mutex<()>,
    /// A write-back left the backend file longer than the logical size (its last page written
    /// whole) and the trim right after it has not happened (it failed). The only excess a
    /// later trim cuts: any other was made by someone else (issue 33), whose bytes are theirs
    /// even when they end inside ebb's last page. Set and cleared under `size_lock` exclusive.
    pub(crate) padded: AtomicBool,
    /// Written since the backend file was last synced.
    pub(crate) needs_sync: AtomicBool,
    /// How it is named (to forget it when it leaves the cache).
    pub(crate) key: (BackendId, FileKey),
    /// Open handles.
    pub(crate) handles: std::sync::atomic::AtomicU32,
    /// Writes copied out of the cache, waiting for this file's writing thread (backends with
    /// `serial_writes`).
    pub(crate) lane: Mutex<Lane>,
    /// Serialises syncs of the backend file, so each reports what it covers.
    pub(crate) sync_lock: Mutex<()>,
    /// Who is told when the durable length grows (`file/durable.rs`).
    pub(crate) durable: durable::DurableWatch,
    /// Discarded (`Ebb::discard`, the last handle closed): its cached pages are dropped, and
    /// a sync of everything no longer syncs its backend file, which may be gone.
    pub(crate) discarded: AtomicBool,
}

/// A writer whose frame reserve [`Action::ReturnReserves`] may take back (an open handle's).
pub(crate) trait ReserveHolder: Send + Sync {
    /// The writer, if it is not writing now (its lock is free), marked as having answered
    /// request `sweep`.
    fn try_writer(&self, sweep: u64) -> Option<parking_lot::MappedMutexGuard<'_, Writer>>;
    /// The writer, if it is not writing now, as it is (for the accounting check).
    fn peek_writer(&self) -> Option<parking_lot::MappedMutexGuard<'_, Writer>>;
}

/// A one-shot answer a thread waits for.
pub(crate) struct Slot {
    done: Mutex<Option<Result<(), IoError>>>,
    cv: Condvar,
    /// Futures waiting for the answer.
    wakers: Mutex<Vec<std::task::Waker>>,
}

impl Slot {
    pub(crate) fn new() -> Arc<Slot> {
        Arc::new(Slot {
            done: Mutex::new(None),
            cv: Condvar::new(),
            wakers: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn set(&self, result: Result<(), IoError>) {
        let wakers = {
            let mut done = self.done.lock();
            *done = Some(result);
            std::mem::take(&mut *self.wakers.lock())
        };
        self.cv.notify_all();
        wakers.into_iter().for_each(std::task::Waker::wake);
    }

    /// The answer if there is one, else `waker` is woken when it comes.
    pub(crate) fn poll(&self, waker: &std::task::Waker) -> Option<Result<(), IoError>> {
        let done = self.done.lock();
        if done.is_none() {
            self.wakers.lock().push(waker.clone());
        }
        *done
    }

    pub(crate) fn wait(&self) -> Result<(), IoError> {
        let mut done = self.done.lock();
        loop {
            if let Some(r) = *done {
                return r;
            }
            self.cv.wait(&mut done);
        }
    }

    /// Waits at most `d`; `None` if no answer came.
    pub(crate) fn wait_for(&self, d: std::time::Duration) -> Option<Result<(), IoError>> {
        let mut done = self.done.lock();
        if done.is_none() {
            self.cv.wait_for(&mut done, d);
        }
        *done
    }
}

/// State under the engine lock.
pub(crate) struct Core {
    pub(crate) engine: Engine,
    next_request: u64,
    requests: BTreeMap<RequestId, Arc<Slot>>,
    writers: BTreeMap<WriterId, Arc<Slot>>,
    /// When the timer thread plans to wake (`None` while it is awake).
    timer_wake: Option<ebb_core::Instant>,
    pub(crate) keys: BTreeMap<(BackendId, FileKey), InodeId>,
    pub(crate) next_inode: u64,
    /// Files with no open handle, oldest first; beyond [`CLOSED_CACHED`] the oldest clean ones
    /// leave the cache (their pages are dropped and their backend file closed).
    pub(crate) closed: std::collections::VecDeque<InodeId>,
    /// How many closed files stay cached: [`CLOSED_CACHED`], or fewer when the share of memory
    /// the files' state may take holds fewer ([`closed_cached`]).
    pub(crate) closed_max: usize,
}

/// Closed files kept cached (with their backend file descriptors) before the oldest clean one is
/// forgotten. The kernel keeps closed files' pages until reclaim; ebb bounds the open
/// descriptors instead.
pub(crate) const CLOSED_CACHED: usize = 512;

/// Closed files that cannot leave yet (dirty, in flight, with an error) looked at, at most,
/// each time a file joins the closed list, so a close costs the same however many closed files
/// are still dirty; the clean ones found meanwhile all leave. (Looking at
/// every file past the bound, which is what ebb did, cost one look per dirty closed file at
/// every close: thousands per close while a few thousand small files written and closed
/// waited for write-back, under the engine lock.)
pub(crate) const CLOSED_LOOKS: usize = 4;

/// Closed files kept cached by a cache whose files' state fits `kept_max` files
/// (`Engine::files_kept_max`): [`CLOSED_CACHED`], at most an eighth of them (the rest are for
/// the files open and those a caller keeps attached, see `Ebb::files_kept_max`), at least one.
pub(crate) fn closed_cached(kept_max: u64) -> usize {
    usize::try_from(kept_max / 8).unwrap_or(usize::MAX).clamp(1, CLOSED_CACHED)
}

pub(crate) enum Job {
    /// Pages of ascending, disjoint runs (`Action::Write`), written as one write.
    Write {
        io: IoId,
        inode: InodeId,
        runs: Vec<ebb_core::Run>,
    },
    /// A write a lane's driver finished, for another thread to report.
    WriteDone {
        io: IoId,
        result: Result<Stability, IoError>,
    },
    Read {
        io: IoId,
        inode: InodeId,
        first: u64,
        frames: Vec<FrameId>,
    },
    Commit {
        io: IoId,
        inode: InodeId,
    },
    /// The sync of a backend file the engine asked for (`Action::SyncFile`: the commit it
    /// owes a file whose close failed, now written back).
    SyncFile {
        inode: InodeId,
    },
    Stop,
}

/// Everything the threads share.
pub(crate) struct Shared {
    pub(crate) core: Mutex<Core>,
    timer_cv: Condvar,
    pub(crate) files: RwLock<BTreeMap<InodeId, Arc<FileState>>>,
    pub(crate) frames: FramePool,
    clock: std::time::Instant,
    pub(crate) jobs: Sender<Job>,
    /// The read workers' queue.
    reads: Sender<Job>,
    pub(crate) backends: Vec<BackendSlot>,
    pub(crate) draining: AtomicBool,
    /// Backend files synced by `sync` and `drain` (`Ebb::inner_files_synced`).
    pub(crate) files_synced: AtomicU64,
    /// Closed files looked at for leaving the cache (`Ebb::inner_closed_looks`).
    pub(crate) closed_looks: AtomicU64,
    shutdown: AtomicBool,
    ids: AtomicU64,
    /// Serialises opens so two opens of one file share one cache entry.
    pub(crate) open_lock: Mutex<()>,
    /// Direct reads' start and end events, delivered to the engine at its next entry, so a
    /// reader never waits for the engine lock (its latency is what wbt protects).
    pub(crate) direct_reads: crossbeam::queue::SegQueue<Event>,
    /// The IO buffers, within the part of the memory budget set aside for them.
    pub(crate) bufs: BufPool,
    /// The reads' own buffers (an empty pool when the budget has no room: reads then take the
    /// writes' buffers).
    pub(crate) read_bufs: BufPool,
    /// Every writer's throttle pauses (for the stats), recorded as a writer goes to sleep.
    pub(crate) pauses: Mutex<crate::pauses::Pauses>,
    /// Where the engine's trace events go, if the cache is traced.
    trace: Option<crate::trace::Tracer>,
    /// Wakers of futures waiting out a pause (the alarm thread's).
    pub(crate) alarms: crate::alarm::Alarms,
    /// Every open handle's writer, for [`Action::ReturnReserves`].
    writers_open: Mutex<BTreeMap<WriterId, Weak<dyn ReserveHolder>>>,
    /// Requests for writers' reserves so far ([`Shared::return_reserves`]).
    pub(crate) reserve_sweeps: AtomicU64,
    /// The backends whose outage clock runs, a bit each (the 64th for the rest), as of the
    /// engine's last entry: a request's success is reported to the engine only then.
    backends_down: AtomicU64,
}

/// The page maps as the engine sees them: one lock per file.
pub(crate) struct Maps<'a> {
    files: &'a RwLock<BTreeMap<InodeId, Arc<FileState>>>,
}

impl PageMaps for Maps<'_> {
    fn with<R>(&mut self, inode: InodeId, f: impl FnOnce(&mut PageMap) -> R) -> R {
        let files = self.files.read();
        match files.get(&inode) {
            Some(fs) => f(&mut fs.map.lock()),
            // The engine only asks for files the runtime registered; an unknown one has no pages.
            None => f(&mut PageMap::new()),
        }
    }
}

/// Converts an OS error to the errno the engine records.
pub(crate) fn to_io_error(e: &io::Error) -> IoError {
    IoError { errno: ebb_backend::errno_of(e).unwrap_or(ebb_core::event::errno::EIO) }
}

/// Converts an engine error to `std::io::Error` (the kind follows from the errno).
pub(crate) fn from_io_error(e: IoError) -> io::Error {
    io::Error::from_raw_os_error(e.errno)
}

impl Shared {
    pub(crate) fn start(
        engine: Engine,
        backends: Vec<BackendSlot>,
        io_threads: usize,
        (buf_bytes, read_buf_bytes): (usize, usize),
        clock: std::time::Instant,
        trace: Option<(crate::trace::Tracer, crate::trace::TraceFile)>,
    ) -> (Arc<Shared>, Vec<std::thread::JoinHandle<()>>) {
        let (tracer, trace_file) = trace.unzip();
        let (tx, rx) = crossbeam::channel::unbounded();
        let (reads_tx, reads_rx) = crossbeam::channel::unbounded();
        let frames = FramePool::new(engine.config().memory_pages());
        let closed_max = closed_cached(engine.files_kept_max());
        let nice = (engine.config().io_thread_nice, engine.config().io_thread_ioprio);
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                next_request: 1,
                requests: BTreeMap::new(),
                writers: BTreeMap::new(),
                timer_wake: None,
                keys: BTreeMap::new(),
                next_inode: 1,
                closed: std::collections::VecDeque::new(),
                closed_max,
            }),
            timer_cv: Condvar::new(),
            files: RwLock::new(BTreeMap::new()),
            frames,
            clock,
            jobs: tx,
            reads: reads_tx,
            backends,
            draining: AtomicBool::new(false),
            files_synced: AtomicU64::new(0),
            closed_looks: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            ids: AtomicU64::new(1),
            open_lock: Mutex::new(()),
            direct_reads: crossbeam::queue::SegQueue::new(),
            bufs: BufPool::new(buf_bytes),
            read_bufs: BufPool::with_grain(read_buf_bytes, PAGE),
            pauses: Mutex::new(crate::pauses::Pauses::new(clock)),
            trace: tracer,
            alarms: Default::default(),
            writers_open: Mutex::new(BTreeMap::new()),
            reserve_sweeps: AtomicU64::new(0),
            backends_down: AtomicU64::new(0),
        });
        let threads = shared.start_threads((rx, reads_rx), io_threads, nice, trace_file);
        (shared, threads)
    }

    /// The threads behind the engine: the trace writer and sampler (with a trace file), the IO
    /// workers at nice `nice` (jobs from `rx`), the read workers (from `reads_rx`), the timer
    /// and the alarm thread.
    fn start_threads(
        self: &Arc<Shared>,
        (rx, reads_rx): (Receiver<Job>, Receiver<Job>),
        io_threads: usize,
        (nice, ioprio): (u32, ebb_core::config::IoPriority),
        trace_file: Option<crate::trace::TraceFile>,
    ) -> Vec<std::thread::JoinHandle<()>> {
        let mut threads = Vec::new();
        if let Some(file) = trace_file {
            threads.push(spawn_named("ebb-trace".into(), move || file.run()));
            let s = self.clone();
            threads.push(spawn_named("ebb-trace-sample".into(), move || s.sample_loop()));
        }
        for i in 0..io_threads.max(1) {
            let (s, rx) = (self.clone(), rx.clone());
            threads.push(spawn_named(format!("ebb-io-{i}"), move || {
                lower_priority(nice);
                set_io_priority(ioprio);
                s.io_worker(&rx);
            }));
        }
        for i in 0..crate::READ_THREADS {
            let (s, rx) = (self.clone(), reads_rx.clone());
            threads.push(spawn_named(format!("ebb-read-{i}"), move || s.io_worker(&rx)));
        }
        let s = self.clone();
        threads.push(spawn_named("ebb-timer".into(), move || s.timer_loop()));
        let s = self.clone();
        threads.push(spawn_named("ebb-alarm".into(), move || s.alarms.run()));
        threads
    }

    /// Stops the threads (after the last user handle is gone).
    pub(crate) fn stop(&self, threads: usize) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.alarms.stop();
        for _ in 0..threads {
            let _ = self.jobs.send(Job::Stop);
        }
        for _ in 0..crate::READ_THREADS {
            let _ = self.reads.send(Job::Stop);
        }
        let _core = self.core.lock();
        self.timer_cv.notify_all();
        if let Some(trace) = &self.trace {
            trace.stop();
        }
    }

    pub(crate) fn now(&self) -> ebb_core::Instant {
        ebb_core::Instant::from_nanos(self.clock.elapsed().as_nanos() as u64)
    }

    pub(crate) fn deadline(&self, t: ebb_core::Instant) -> std::time::Instant {
        self.clock + std::time::Duration::from_nanos(t.as_nanos())
    }

    /// The engine's instant of `t` ([`Shared::deadline`]'s inverse).
    pub(crate) fn instant(&self, t: std::time::Instant) -> ebb_core::Instant {
        ebb_core::Instant::from_nanos(t.saturating_duration_since(self.clock).as_nanos() as u64)
    }

    /// Whether backend `b`'s outage clock ran after the engine's last entry
    /// (`Engine::backend_down`).
    pub(crate) fn backend_down(&self, b: BackendId) -> bool {
        self.backends_down.load(Ordering::Acquire) & (1 << b.0.min(63)) != 0
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// A handle of `fs` closed; if it was the last, the file joins the closed list, and the
    /// oldest closed files beyond [`Core::closed_max`] that hold nothing unwritten and no unseen
    /// error leave the cache; one that cannot leave yet goes to the back of the list, at most
    /// [`CLOSED_LOOKS`] of them per close (each file leaves once, so a close costs a bounded
    /// number of looks on average). A file whose key was forgotten leaves at once.
    pub(crate) fn handle_closed(&self, fs: &FileState) {
        if fs.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let mut core = self.core.lock();
        // A file whose key was forgotten (discarded while this handle was open) can never be
        // attached again: its pages are dropped, and it leaves now, closing its backend file,
        // unless IO of it is in flight (then the closed-file list forgets it once idle).
        if core.keys.get(&fs.key) != Some(&fs.inode) {
            fs.discarded.store(true, Ordering::Release);
            let now = self.now();
            let mut maps = Maps { files: &self.files };
            core.engine.handle(now, Event::Truncate { inode: fs.inode, first_page: 0 }, &mut maps);
            self.dispatch(&mut core);
            if core.engine.inode_idle(fs.inode) {
                self.files.write().remove(&fs.inode);
                return;
            }
        }
        core.closed.push_back(fs.inode);
        let mut kept = 0;
        while core.closed.len() > core.closed_max && kept < CLOSED_LOOKS {
            let Some(inode) = core.closed.pop_front() else { break };
            self.closed_looks.fetch_add(1, Ordering::Relaxed);
            let Some(victim) = self.file(inode) else { continue };
            if victim.handles.load(Ordering::Acquire) > 0 {
                continue; // reopened: no longer closed
            }
            let c = victim.map.lock().counts();
            if c.dirty + c.writeback + c.unstable > 0
                || core.engine.inode_error(inode).is_some()
                || !core.engine.inode_idle(inode)
            {
                // Looked at again after the files closed since (by then likely written).
                core.closed.push_back(inode);
                kept += 1;
                continue;
            }
            let now = self.now();
            let mut maps = Maps { files: &self.files };
            core.engine.handle(now, Event::Truncate { inode, first_page: 0 }, &mut maps);
            self.dispatch(&mut core);
            if core.keys.get(&victim.key) == Some(&inode) {
                core.keys.remove(&victim.key);
            }
            self.files.write().remove(&inode);
        }
    }

    /// The engine forgot `inode` (nothing of it cached, open or in flight): unless a handle is
    /// being opened on it meanwhile, the file leaves the file table and its key, which closes
    /// its backend file. Attaching the key again opens the backend file afresh.
    fn forgotten(&self, core: &mut Core, inode: InodeId) {
        let mut files = self.files.write();
        let Some(fs) = files.get(&inode) else { return };
        if fs.handles.load(Ordering::Acquire) > 0 {
            return;
        }
        if core.keys.get(&fs.key) == Some(&inode) {
            core.keys.remove(&fs.key);
        }
        files.remove(&inode);
    }

    pub(crate) fn file(&self, inode: InodeId) -> Option<Arc<FileState>> {
        self.files.read().get(&inode).cloned()
    }

    /// Enters the engine: runs `f` with the current time, then carries out every action.
    pub(crate) fn enter<R>(
        &self,
        f: impl FnOnce(&mut Core, &mut Maps<'_>, ebb_core::Instant) -> R,
    ) -> R {
        let mut core = self.core.lock();
        let now = self.now();
        let mut maps = Maps { files: &self.files };
        while let Some(event) = self.direct_reads.pop() {
            core.engine.handle(now, event, &mut maps);
        }
        let r = f(&mut core, &mut maps, now);
        self.dispatch(&mut core);
        r
    }

    /// Sends `event` (built with a fresh request id) and returns the slot its answer fills.
    pub(crate) fn request(&self, event: impl FnOnce(RequestId) -> Event) -> Arc<Slot> {
        self.enter(|core, maps, now| {
            let request = RequestId(core.next_request);
            core.next_request += 1;
            let slot = Slot::new();
            core.requests.insert(request, slot.clone());
            core.engine.handle(now, event(request), maps);
            slot
        })
    }

    /// Takes one step of a writer's call under the engine lock (the writer protocol,
    /// `Engine::writer_step`); on `Wait`, registers the slot the `Resume` will fill before the
    /// engine lock is released.
    pub(crate) fn writer_step(
        &self,
        w: &mut Writer,
        input: WriterInput,
    ) -> (WriterNext, Option<Arc<Slot>>) {
        self.enter(|core, maps, now| {
            let next = core.engine.writer_step(now, w, input, maps);
            let slot = matches!(next, WriterNext::Wait { .. }).then(|| {
                let s = Slot::new();
                core.writers.insert(w.id, s.clone());
                s
            });
            (next, slot)
        })
    }

    fn dispatch(&self, core: &mut Core) {
        if let Some(trace) = &self.trace {
            trace.push(core.engine.drain_trace());
        }
        while let Some(action) = core.engine.poll_action() {
            match action {
                Action::Write { io, inode, runs, .. } => {
                    let _ = self.jobs.send(Job::Write { io, inode, runs });
                }
                Action::Read { io, inode, first_page, .. } => {
                    let frames = core.engine.read_frames(io).map(<[_]>::to_vec).unwrap_or_default();
                    let _ = self.reads.send(Job::Read { io, inode, first: first_page, frames });
                }
                Action::Commit { io, inode, .. } => {
                    let _ = self.jobs.send(Job::Commit { io, inode });
                }
                Action::SyncFile { inode, .. } => {
                    let _ = self.jobs.send(Job::SyncFile { inode });
                }
                Action::Resume { writer } => {
                    if let Some(slot) = core.writers.remove(&writer) {
                        slot.set(Ok(()));
                    }
                }
                Action::FsyncDone { request, result }
                | Action::SyncDone { request, result }
                | Action::CloseDone { request, result }
                | Action::ReadDone { request, result } => {
                    if let Some(slot) = core.requests.remove(&request) {
                        slot.set(result);
                    }
                }
                Action::Forget { inode } => self.forgotten(core, inode),
                Action::ReturnReserves => self.return_reserves(core),
            }
        }
        if let Some(t) = core.engine.poll_timeout()
            && core.timer_wake.is_some_and(|w| t < w)
        {
            self.timer_cv.notify_all();
        }
        let down = (0..self.backends.len() as u32)
            .filter(|&b| core.engine.backend_down(BackendId(b)))
            .fold(0u64, |mask, b| mask | 1 << b.min(63));
        self.backends_down.store(down, Ordering::Release);
    }

    /// A handle's writer joins the writers whose reserves [`Action::ReturnReserves`] reaches.
    pub(crate) fn writer_opened(&self, id: WriterId, holder: Weak<dyn ReserveHolder>) {
        self.writers_open.lock().insert(id, holder);
    }

    /// The engine's counters against a recount of every file's page map, and its frames
    /// against the budget, given the open writers' reserves and pending batches
    /// ([`Engine::check_accounting_of`]). A writer in the middle of a write is an error, not
    /// waited for: call it when the writers are quiet. Takes each writer's lock (tried), then
    /// `core`, `files` and every page map, in the usual order.
    pub(crate) fn check_accounting(&self) -> Result<(), String> {
        let open: Vec<_> = self.writers_open.lock().values().filter_map(Weak::upgrade).collect();
        let writers = open
            .iter()
            .map(|holder| holder.peek_writer())
            .collect::<Option<Vec<_>>>()
            .ok_or("a writer is writing: check the accounting when the writers are quiet")?;
        let writers: Vec<&Writer> = writers.iter().map(|w| &**w).collect();
        let core = self.core.lock();
        let files = self.files.read();
        let maps: Vec<_> = files.values().map(|f| (f.inode, f.map.lock())).collect();
        core.engine.check_accounting_of(maps.iter().map(|(inode, map)| (*inode, &**map)), &writers)
    }

    /// A handle's writer exited (its reserve went back with it).
    pub(crate) fn writer_closed(&self, id: WriterId) {
        self.writers_open.lock().remove(&id);
    }

    /// [`Action::ReturnReserves`]: the reserves of the writers not writing now (their lock is
    /// free) go back to the engine at once; a writer that is writing gives its own back when
    /// its write ends (`File::answer_reserve_sweep`). Called under `core`, so it only tries
    /// the writers' locks (a writer takes its own lock before `core`).
    fn return_reserves(&self, core: &mut Core) {
        let sweep = self.reserve_sweeps.fetch_add(1, Ordering::AcqRel) + 1;
        let open: Vec<_> = self.writers_open.lock().values().filter_map(Weak::upgrade).collect();
        let mut idle: Vec<_> = open.iter().filter_map(|holder| holder.try_writer(sweep)).collect();
        let now = self.now();
        let mut maps = Maps { files: &self.files };
        core.engine.return_reserves(now, idle.iter_mut().map(|w| &mut **w), &mut maps);
    }

    /// While traced: the cache's state (`global_dirty_state`) every `SAMPLE_INTERVAL`.
    fn sample_loop(&self) {
        while !self.shutdown.load(Ordering::SeqCst) {
            std::thread::sleep(crate::trace::SAMPLE_INTERVAL);
            self.enter(|core, _, now| core.engine.trace_dirty_state(now));
        }
    }

    fn timer_loop(&self) {
        let mut core = self.core.lock();
        while !self.shutdown.load(Ordering::SeqCst) {
            let now = self.now();
            match core.engine.poll_timeout() {
                Some(t) if t <= now => {
                    let mut maps = Maps { files: &self.files };
                    while let Some(event) = self.direct_reads.pop() {
                        core.engine.handle(now, event, &mut maps);
                    }
                    core.engine.handle(now, Event::Timer, &mut maps);
                    self.dispatch(&mut core);
                    // A timeout the engine could not act on yet must not spin the thread.
                    if core.engine.poll_timeout().is_some_and(|t| t <= now) {
                        core.timer_wake = Some(now);
                        self.timer_cv.wait_for(&mut core, std::time::Duration::from_millis(1));
                    }
                }
                Some(t) => {
                    core.timer_wake = Some(t);
                    let deadline = self.deadline(t);
                    self.timer_cv.wait_until(&mut core, deadline);
                }
                None => {
                    core.timer_wake = Some(ebb_core::Instant::from_nanos(u64::MAX));
                    self.timer_cv.wait_for(&mut core, std::time::Duration::from_secs(1));
                }
            }
            core.timer_wake = None;
        }
    }

    fn io_worker(&self, rx: &Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            match job {
                Job::Stop => break,
                Job::Write { io, inode, runs } => match runs[..] {
                    [run] => self.write_job(io, inode, run.first, run.count),
                    _ => self.write_runs_job(io, inode, &runs),
                },
                Job::WriteDone { io, result } => self.write_done(io, result),
                Job::Read { io, inode, first, frames } => {
                    let result = self.do_read(inode, first, &frames);
                    self.enter(|core, maps, now| {
                        core.engine.handle(now, Event::ReadDone { io, result }, maps)
                    });
                }
                Job::Commit { io, inode } => {
                    let fs = self.file(inode);
                    let result = match &fs {
                        Some(fs) => {
                            fs.file.commit(0, 0).map(|r| r.verifier).map_err(|e| to_io_error(&e))
                        }
                        None => Ok(0),
                    };
                    self.enter(|core, maps, now| {
                        core.engine.handle(now, Event::CommitDone { io, result }, maps)
                    });
                    if let Some(fs) = fs {
                        durable::durable_changed(self, &fs);
                    }
                }
                Job::SyncFile { inode } => match self.file(inode) {
                    // Its outcome goes to the engine as for any sync (`FileSynced`, or
                    // `FileSyncFailed`), which is the answer the engine waits for.
                    Some(fs) if !fs.discarded.load(Ordering::Acquire) => {
                        let _ = durable::sync_backend_file(self, &fs);
                    }
                    // Deleted: nothing of it is left to commit.
                    _ => self.enter(|core, maps, now| {
                        let mark = core.engine.durable_mark(inode);
                        core.engine.handle(now, Event::FileSynced { inode, mark }, maps)
                    }),
                },
            }
        }
    }
}

/// Reads one page straight from the backend (for a partial write of a page not in the cache).
/// Starts a thread named `name` running `f`.
fn spawn_named(name: String, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .unwrap_or_else(|e| panic!("spawning the thread {name}: {e}"))
}

pub(crate) fn read_page_direct(fs: &FileState, page: u64) -> io::Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(PAGE);
    let n = fs.file.read_at(&mut buf, page * PAGE_SIZE)?;
    buf[n..].fill(0);
    Ok(buf)
}

/// Gives the calling thread the nice value `nice` (`io_thread_nice`; 0 leaves it). A refusal
/// (a sandbox without the call) leaves the thread as it is: its priority is a preference.
fn lower_priority(nice: u32) {
    if nice > 0 {
        let nice = i32::try_from(nice).unwrap_or(19);
        let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice);
    }
}

/// Gives the calling thread the IO priority `ioprio` (`io_thread_ioprio`; `inherit` leaves
/// it). A refusal leaves the thread as it is, as for its nice value.
fn set_io_priority(ioprio: ebb_core::config::IoPriority) {
    use ebb_core::config::IoPriority;
    // ioprio_set(2): the class in the bits from 13 up, the level below; `who` 1 is one
    // thread (IOPRIO_WHO_PROCESS with a thread id).
    let (class, level) = match ioprio {
        IoPriority::Inherit => return,
        IoPriority::BestEffortLow => (2, 7),
        IoPriority::Idle => (3, 0),
    };
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    #[expect(unsafe_code, reason = "ioprio_set has no safe wrapper; it takes three integers")]
    let _ = unsafe { libc::syscall(libc::SYS_ioprio_set, 1, tid, (class << 13) | level) };
}

/// Allocates an id for a handle.
pub(crate) fn handle_id(shared: &Shared) -> HandleId {
    HandleId(shared.next_id())
}
