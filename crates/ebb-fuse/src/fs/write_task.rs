//! A write request as a task that holds no thread while it waits.
//!
//! A throttled write must not answer the kernel before its pause or wait is over, but it need
//! not hold a pool thread meanwhile: it copies what the throttle allows, and when the cache
//! says wait ([`DataFile::poll_write_at`] returns `Pending`), the request is parked in its
//! waker, which puts it back on the write pool when the pause ends or the wait is answered.
//! So a mount with more throttled writers than write threads still serves the writers that
//! may go on (the granule gate lets a few files fill their parts while the others wait their
//! turn: with waits holding threads, those few would queue behind them).
//!
//! A writer being killed must not stay in the kernel waiting for an answer that comes only when
//! its wait ends (for memory, behind a backend that hangs, that may be never): a task parked for
//! longer than [`SWEEP_AFTER`] is checked every [`SWEEP_EVERY`] by a sweeper thread, which answers
//! it (the bytes copied so far, or `EINTR`) once its writer has a `SIGKILL` pending.

use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use fuser::{Errno, FileHandle, ReplyWrite};
use parking_lot::Mutex;

use super::files::Handle;
use super::{Inner, to_errno};
use crate::pool::{DataBuf, Pool};
use ebb_backend::Namespace;

/// How long a task may stay parked before the sweeper checks its writer (a throttle pause is
/// at most 200 ms and ends by itself).
const SWEEP_AFTER: Duration = Duration::from_millis(200);
/// How often the sweeper looks at the parked tasks.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// One write request being served.
pub(super) struct WriteTask<N: Namespace> {
    pub(super) inner: Arc<Inner<N>>,
    pub(super) fh: FileHandle,
    pub(super) offset: u64,
    pub(super) data: DataBuf,
    pub(super) pid: u32,
    pub(super) reply: ReplyWrite,
    /// Bytes copied into the cache so far.
    pub(super) done: usize,
    /// The task waited at least once: check whether its writer is being killed.
    pub(super) waited: bool,
}

/// Where a task is, for its waker.
enum State<N: Namespace> {
    /// On a pool thread.
    Running,
    /// Woken while running: poll again instead of parking.
    Woken,
    /// Parked until woken, since then.
    Parked(WriteTask<N>, Instant),
    /// Answered.
    Done,
}

/// A task's waker: it holds the parked task and the pool to run it on.
struct Parking<N: Namespace> {
    state: Mutex<State<N>>,
    pool: Weak<Pool>,
}

impl<N: Namespace + 'static> Wake for Parking<N> {
    fn wake(self: Arc<Self>) {
        let task = {
            let mut state = self.state.lock();
            match std::mem::replace(&mut *state, State::Running) {
                State::Parked(task, _) => task,
                State::Running | State::Woken => {
                    *state = State::Woken;
                    return;
                }
                State::Done => {
                    *state = State::Done;
                    return;
                }
            }
        };
        match self.pool.upgrade() {
            Some(pool) => {
                let parking = Arc::clone(&self);
                pool.resume(move || run(task, &parking));
            }
            // The mount is going away: answer on this thread.
            None => run(task, &self),
        }
    }
}

impl<N: Namespace + 'static> WriteTask<N> {
    /// Starts the task on `pool`.
    pub(super) fn start(self, pool: &Arc<Pool>) {
        let parking =
            Arc::new(Parking { state: Mutex::new(State::Running), pool: Arc::downgrade(pool) });
        pool.run(move || run(self, &parking));
    }
}

/// Runs `task` until it is answered or parks.
fn run<N: Namespace + 'static>(mut task: WriteTask<N>, parking: &Arc<Parking<N>>) {
    let waker = Waker::from(Arc::clone(parking));
    loop {
        match step(&mut task, &waker) {
            Poll::Ready(result) => {
                *parking.state.lock() = State::Done;
                match result {
                    Ok(done) => task.reply.written(u32::try_from(done).unwrap_or(u32::MAX)),
                    Err(error) => task.reply.error(error),
                }
                return;
            }
            Poll::Pending => {
                let mut state = parking.state.lock();
                if matches!(*state, State::Woken) {
                    *state = State::Running;
                    continue;
                }
                task.waited = true;
                *state = State::Parked(task, Instant::now());
                drop(state);
                sweeper().register(parking);
                return;
            }
        }
    }
}

/// The parked tasks the sweeper watches, of every mount in the process.
struct Sweeper {
    parked: Mutex<Vec<Weak<dyn Sweep>>>,
}

/// A parked task as the sweeper sees it.
trait Sweep: Send + Sync {
    /// Answers the task if it has been parked for a while and its writer is being killed.
    fn sweep(&self, now: Instant);
    /// Whether the task is parked (false once answered or running).
    fn parked(&self) -> bool;
}

impl<N: Namespace + 'static> Sweep for Parking<N> {
    fn sweep(&self, now: Instant) {
        let task = {
            let mut state = self.state.lock();
            match &*state {
                State::Parked(task, since)
                    if now.duration_since(*since) >= SWEEP_AFTER
                        && super::io_ops::killed(task.pid) => {}
                _ => return,
            }
            match std::mem::replace(&mut *state, State::Done) {
                State::Parked(task, _) => task,
                _ => unreachable!("checked above"),
            }
        };
        let reply = if task.done > 0 { Ok(task.done) } else { Err(Errno::EINTR) };
        match reply {
            Ok(done) => task.reply.written(u32::try_from(done).unwrap_or(u32::MAX)),
            Err(error) => task.reply.error(error),
        }
    }

    fn parked(&self) -> bool {
        matches!(*self.state.lock(), State::Parked(..))
    }
}

impl Sweeper {
    fn register<N: Namespace + 'static>(&self, parking: &Arc<Parking<N>>) {
        let parking: Arc<dyn Sweep> = Arc::clone(parking) as Arc<dyn Sweep>;
        self.parked.lock().push(Arc::downgrade(&parking));
    }

    fn run(&self) {
        loop {
            std::thread::sleep(SWEEP_EVERY);
            let now = Instant::now();
            let parked: Vec<Arc<dyn Sweep>> = {
                let mut list = self.parked.lock();
                list.retain(|weak| weak.upgrade().is_some_and(|task| task.parked()));
                list.iter().filter_map(Weak::upgrade).collect()
            };
            for task in parked {
                task.sweep(now);
            }
        }
    }
}

/// The process's sweeper, started with the first parked task.
fn sweeper() -> &'static Sweeper {
    static SWEEPER: OnceLock<&'static Sweeper> = OnceLock::new();
    SWEEPER.get_or_init(|| {
        let sweeper: &'static Sweeper =
            Box::leak(Box::new(Sweeper { parked: Mutex::new(Vec::new()) }));
        // Without the thread, a killed writer's parked write is answered when its wait ends.
        let _ =
            std::thread::Builder::new().name("ebb-fuse-sweep".into()).spawn(move || sweeper.run());
        sweeper
    })
}

/// Copies as much as the cache takes now; `Ready` with the bytes to answer, or `Pending`.
/// A write of a process being killed is cut short (the count copied, or `EINTR`), as a
/// blocking one is, once it has waited.
fn step<N: Namespace>(task: &mut WriteTask<N>, waker: &Waker) -> Poll<Result<usize, Errno>> {
    let handle: Arc<Handle> = match task.inner.files.handle(task.fh) {
        Ok(handle) => handle,
        Err(error) => return Poll::Ready(Err(error)),
    };
    let mut cx = Context::from_waker(waker);
    while task.done < task.data.len() {
        if task.waited && super::io_ops::killed(task.pid) {
            return Poll::Ready(if task.done > 0 { Ok(task.done) } else { Err(Errno::EINTR) });
        }
        let at = task.offset + task.done as u64;
        match handle.file.poll_write_at(&task.data[task.done..], at, &mut cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(Errno::EIO)),
            Poll::Ready(Ok(n)) => task.done += n,
            Poll::Ready(Err(_)) if task.done > 0 => break,
            Poll::Ready(Err(error)) => return Poll::Ready(Err(to_errno(error))),
        }
    }
    handle.times.written();
    // The handle is dropped before the answer: a release that follows it must find the
    // handle's last reference (`Files::release`).
    drop(handle);
    Poll::Ready(Ok(task.done))
}
