//! A write request as a task that holds no thread while it waits.
//!
//! A request is first served on the request loop that read it, straight from the loop's
//! buffer ([`serve`]): a write that the throttle lets through (most of a stream's) is copied
//! into the cache and answered there, with no copy of the request and no hand-off to a pool
//! thread. Its partial pages need no read when they are cached or past the end of the file,
//! as in a stream written from a buffer that is not page-aligned (the kernel then cuts the
//! requests at the buffer's page boundaries, so every one begins and ends inside a page). The
//! loop never blocks for it: where the cache would (another thread writing through the
//! handle, a partial page's old bytes to read from the backend), the request goes to the write
//! pool with a copy of its data, as one that must wait does. Measured on a 4 GiB stream
//! through an S3 mount from Python's 1 MiB writes (unaligned), in three rounds alternating
//! with the build that served only whole pages on the loop: the mount's CPU time 3.9-4.3 s
//! against 4.9-5.9 s.
//!
//! A throttled write must not answer the kernel before its pause or wait is over, but it need
//! not hold a pool thread meanwhile: it copies what the throttle allows, and when the cache
//! says wait ([`DataFile::poll_write_at`] returns `Pending`), the request is parked in its
//! waker, which puts it back on the write pool when the pause ends or the wait is answered.
//! So a mount with more throttled writers than write threads still serves the writers that
//! may go on (the granule gate lets a few files fill their parts while the others wait their
//! turn: with waits holding threads, those few would queue behind them).
//!
//! Each task holds a copy of its request's data, and the copies' bytes are bounded
//! ([`DataBufs`], the budget's part for them): a loop that needs one beyond the bound waits
//! for one to come back before it reads another request, the writer's data waiting in the
//! kernel meanwhile, so many paused writers do not take the mount past `--memory`.
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
use crate::pool::{DataBuf, DataBufs, Pool};
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

/// A write request as it arrives, its data still in the request loop's buffer.
pub(super) struct WriteRequest<'a> {
    pub(super) fh: FileHandle,
    pub(super) offset: u64,
    pub(super) data: &'a [u8],
    pub(super) pid: u32,
    pub(super) reply: ReplyWrite,
}

/// Serves `request` on the request loop as far as the cache takes it now, straight from the
/// loop's buffer: a write the throttle lets through (the usual case) is answered there,
/// with no copy of its data and no hand-off to a pool thread. One that must wait becomes a
/// task with a copy of its data (`bufs`, which may make the loop wait for room), parked until
/// woken and then run on `pool`.
pub(super) fn serve<N: Namespace + 'static>(
    inner: &Arc<Inner<N>>,
    request: WriteRequest<'_>,
    bufs: &Arc<DataBufs>,
    pool: &Arc<Pool>,
) {
    let WriteRequest { fh, offset, data, pid, reply } = request;
    let handle = match inner.files.handle(fh) {
        Ok(handle) => handle,
        Err(error) => return reply.error(error),
    };
    let parking =
        Arc::new(Parking { state: Mutex::new(State::Running), pool: Arc::downgrade(pool) });
    let waker = Waker::from(Arc::clone(&parking));
    let mut done = 0;
    let mut cx = Context::from_waker(&waker);
    let poll = copy_in(handle, data, offset, &mut done, || false, Poller::Loop, &mut cx);
    if let Some(Poll::Ready(result)) = poll {
        *parking.state.lock() = State::Done;
        inner.files.counts.write_on_loop();
        return answer(reply, result);
    }
    let task = WriteTask {
        inner: Arc::clone(inner),
        fh,
        offset,
        data: bufs.copy(data),
        pid,
        reply,
        done,
        waited: false,
    };
    match poll {
        // Declined (it would block): on with the task on a pool thread.
        None => pool.run(move || run(task, &parking)),
        _ => park(task, &parking),
    }
}

/// Answers a write with the bytes written or the error.
fn answer(reply: ReplyWrite, result: Result<usize, Errno>) {
    match result {
        Ok(done) => reply.written(u32::try_from(done).unwrap_or(u32::MAX)),
        Err(error) => reply.error(error),
    }
}

/// Parks `task`, which could not go on, in its waker; if it was woken meanwhile, it runs on
/// the pool at once.
fn park<N: Namespace + 'static>(mut task: WriteTask<N>, parking: &Arc<Parking<N>>) {
    let mut state = parking.state.lock();
    task.waited = true;
    if matches!(*state, State::Woken) {
        *state = State::Running;
        drop(state);
        let Some(pool) = parking.pool.upgrade() else { return run(task, parking) };
        let parking = Arc::clone(parking);
        return pool.resume(move || run(task, &parking));
    }
    *state = State::Parked(task, Instant::now());
    drop(state);
    sweeper().register(parking);
}

/// Runs `task` until it is answered or parks.
fn run<N: Namespace + 'static>(mut task: WriteTask<N>, parking: &Arc<Parking<N>>) {
    let waker = Waker::from(Arc::clone(parking));
    loop {
        match step(&mut task, &waker) {
            Poll::Ready(result) => {
                *parking.state.lock() = State::Done;
                return answer(task.reply, result);
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
        let result = if task.done > 0 { Ok(task.done) } else { Err(Errno::EINTR) };
        answer(task.reply, result);
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
    let (data, offset, pid, waited) = (&task.data[..], task.offset, task.pid, task.waited);
    let killed = || waited && super::io_ops::killed(pid);
    match copy_in(handle, data, offset, &mut task.done, killed, Poller::Pool, &mut cx) {
        Some(poll) => poll,
        None => unreachable!("a pool thread's poll never declines"),
    }
}

/// How [`copy_in`] polls the cache: on a pool thread, which may block briefly; on a request
/// loop, which must not ([`super::DataFile::try_poll_write_at`]).
#[derive(Clone, Copy)]
enum Poller {
    Pool,
    Loop,
}

/// Copies `data[*done..]` (the bytes of the file from `offset`) into the cache as far as it
/// takes them now, counting them in `done`; `Ready` with the bytes to answer, or `Pending`;
/// `None` where a request loop's poll declined. `killed` is asked before each step whether
/// the writer is being killed.
fn copy_in(
    handle: Arc<Handle>,
    data: &[u8],
    offset: u64,
    done: &mut usize,
    killed: impl Fn() -> bool,
    poller: Poller,
    cx: &mut Context<'_>,
) -> Option<Poll<Result<usize, Errno>>> {
    while *done < data.len() {
        if killed() {
            return Some(Poll::Ready(if *done > 0 { Ok(*done) } else { Err(Errno::EINTR) }));
        }
        let (rest, at) = (&data[*done..], offset + *done as u64);
        let poll = match poller {
            Poller::Pool => handle.file.poll_write_at(rest, at, cx),
            Poller::Loop => handle.file.try_poll_write_at(rest, at, cx)?,
        };
        match poll {
            Poll::Pending => return Some(Poll::Pending),
            Poll::Ready(Ok(0)) => return Some(Poll::Ready(Err(Errno::EIO))),
            Poll::Ready(Ok(n)) => *done += n,
            Poll::Ready(Err(_)) if *done > 0 => break,
            Poll::Ready(Err(error)) => return Some(Poll::Ready(Err(to_errno(error)))),
        }
    }
    handle.times.written();
    // The handle is dropped before the answer: a release that follows it must find the
    // handle's last reference (`Files::release`).
    drop(handle);
    Some(Poll::Ready(Ok(*done)))
}
