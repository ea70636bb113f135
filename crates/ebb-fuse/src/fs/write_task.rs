//! A write request as a task that holds no thread while it waits.
//!
//! A throttled write must not answer the kernel before its pause or wait is over, but it need
//! not hold a pool thread meanwhile: it copies what the throttle allows, and when the cache
//! says wait ([`DataFile::poll_write_at`] returns `Pending`), the request is parked in its
//! waker, which puts it back on the write pool when the pause ends or the wait is answered.
//! So a mount with more throttled writers than write threads still serves the writers that
//! may go on (the granule gate lets a few files fill their parts while the others wait their
//! turn: with waits holding threads, those few would queue behind them).

use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};

use fuser::{Errno, FileHandle, ReplyWrite};
use parking_lot::Mutex;

use super::files::Handle;
use super::{Inner, to_errno};
use crate::pool::{DataBuf, Pool};
use ebb_backend::Namespace;

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
    /// Parked until woken.
    Parked(WriteTask<N>),
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
                State::Parked(task) => task,
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
                *state = State::Parked(task);
                return;
            }
        }
    }
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
