//! How a handle obeys the throttle: by sleeping in the calling thread ([`File::write_at`]), or
//! by returning at once with the pause it owes ([`File::try_write_at`], [`File::write_at_async`]).
//!
//! Both take the same steps of the writer protocol (`ebb_core::Engine::writer_step`) in the
//! same order: the step of `write_pages` that needs the engine (a check due, a page under
//! writeback, the file newly dirty), then, once the sleep it asked for has ended or the wait
//! has been answered, `WriterInput::Continue` until the engine says proceed. A
//! non-blocking writer keeps what it owes ([`Owed`]) in its handle and pays it at its next
//! write: called again before the sleep's end (`ebb_core::Writer::paused_until`) it is told to
//! wait on, with no engine call and no state changed. So an event loop that polls is throttled
//! exactly as a thread that sleeps: the same pauses, the same share of the bandwidth.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ebb_core::{WriteStep, WriterInput, WriterNext};

use super::{File, Interrupt, OldBytes, WriterState, sleep_for, wait_slot};
use crate::shared::{Slot, from_io_error};

/// The retry hint of a non-blocking write that waits for an event rather than a time (memory
/// being freed, a page's write ending): how soon [`File::try_write_at`] suggests asking again.
/// The future ([`WriteAt`]) is woken by the event itself.
const WAIT_RETRY: Duration = Duration::from_millis(1);

/// How a write obeys its throttle verdicts.
#[derive(Clone, Copy)]
pub(crate) enum Obey<'a> {
    /// Sleep and wait in the calling thread, giving up when the [`Interrupt`] says so.
    Block(Interrupt<'a>),
    /// Return at once with what is owed.
    Poll,
}

/// What a non-blocking writer owes before it writes on.
#[derive(Clone)]
pub(crate) enum Owed {
    /// The rest of a pause, which ends at this time.
    Sleep(Instant),
    /// The answer to a wait (memory, a page under writeback).
    Wait(Arc<Slot>),
}

impl Owed {
    /// Whether it is paid: the pause has ended or the wait has been answered.
    fn paid(&self) -> bool {
        match self {
            Owed::Sleep(end) => Instant::now() >= *end,
            Owed::Wait(slot) => slot.wait_for(Duration::ZERO).is_some(),
        }
    }

    fn retry_after(&self) -> Duration {
        match self {
            Owed::Sleep(end) => end.saturating_duration_since(Instant::now()),
            Owed::Wait(_) => WAIT_RETRY,
        }
    }
}

/// How a writer's throttle call ended.
pub(crate) enum Throttled {
    /// Write on.
    Go,
    /// The caller gave up while it waited.
    Interrupted,
    /// The engine failed the write ([`WriterNext::Fail`]).
    Failed(io::Error),
    /// A non-blocking writer owes this before it writes on.
    Owes(Owed),
}

/// What [`File::try_write_at`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TryWrite {
    /// This many bytes are in the cache (from the start of the buffer). Fewer than asked when
    /// the throttle asked for a pause midway: the next call returns [`TryWrite::WouldBlock`]
    /// until it has passed.
    Written(usize),
    /// Nothing was written: the writer owes a pause (dirty throttling) or waits for memory or
    /// for a page under writeback. Call again after `retry_after` (the rest of the pause the
    /// engine decided; 1 ms for a wait, which ends on an event rather than at a time).
    WouldBlock {
        /// How long to wait before calling again.
        retry_after: Duration,
    },
}

impl File {
    /// [`File::write_at`] without blocking: copies as much of `buf` as the throttle allows
    /// now into the cache, or, when this handle owes a pause, writes nothing and says how long
    /// it is. An event loop waits on its own timer instead of a blocked thread; the handle's
    /// throttling is exactly that of a blocking writer (the same pauses in the same order, the
    /// same fairness against other writers), only paid between calls.
    ///
    /// ```
    /// use ebb_runtime::TryWrite;
    /// # let ebb = ebb_runtime::Builder::new().memory(64 << 20)
    /// #     .backend("mem", std::sync::Arc::new(ebb_backend::MemBackend::new())).build()?;
    /// # let f = ebb.open("log", ebb_backend::OpenOptions { create: true, truncate: false })?;
    /// let record = b"one record";
    /// let mut done = 0;
    /// while done < record.len() {
    ///     match f.try_write_at(&record[done..], done as u64)? {
    ///         TryWrite::Written(n) => done += n,
    ///         // An event loop arms a timer here and serves other work meanwhile.
    ///         TryWrite::WouldBlock { retry_after } => std::thread::sleep(retry_after),
    ///     }
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// Errors are [`File::write_at`]'s.
    pub fn try_write_at(&self, buf: &[u8], offset: u64) -> io::Result<TryWrite> {
        Ok(match self.write_inner(buf, offset, Obey::Poll)? {
            (0, Some(owed)) if !buf.is_empty() => {
                TryWrite::WouldBlock { retry_after: owed.retry_after() }
            }
            (n, _) => TryWrite::Written(n),
        })
    }

    /// [`File::write_at`] as a future: writes all of `buf` at `offset`, waiting out the
    /// throttle's pauses without blocking a thread. It needs no async runtime: a pause is
    /// waited out on the cache's own alarm thread, which wakes the task when it ends, and a
    /// wait for memory or a page under writeback is woken by its answer.
    ///
    /// ```
    /// # let ebb = ebb_runtime::Builder::new().memory(64 << 20)
    /// #     .backend("mem", std::sync::Arc::new(ebb_backend::MemBackend::new())).build()?;
    /// # let f = ebb.open("log", ebb_backend::OpenOptions { create: true, truncate: false })?;
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct W(std::thread::Thread);
    /// #     impl std::task::Wake for W { fn wake(self: std::sync::Arc<Self>) { self.0.unpark() } }
    /// #     let waker = std::sync::Arc::new(W(std::thread::current())).into();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; }
    /// #         std::thread::park();
    /// #     }
    /// # }
    /// // Inside an async fn, with any executor (`block_on` is a ten-line one here):
    /// let n = block_on(f.write_at_async(b"one record", 0))?;
    /// assert_eq!(n, 10);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write_at_async<'a>(&'a self, buf: &'a [u8], offset: u64) -> WriteAt<'a> {
        WriteAt { file: self, buf, offset, done: 0 }
    }

    /// The engine's part of a write step that needs it ([`WriteStep::needs_engine`]: a
    /// throttle check, a wait for a page under writeback, a file newly dirty), obeyed as
    /// `mode` says.
    pub(crate) fn throttle(
        &self,
        ws: &mut WriterState,
        step: WriteStep,
        mode: Obey<'_>,
    ) -> Throttled {
        let input = WriterInput::Wrote { inode: self.inode(), step };
        let (next, slot) = self.ebb.inner.shared.writer_step(&mut ws.writer, input);
        self.obey(ws, next, slot, mode)
    }

    /// Pays what a non-blocking write left owed (a blocking write sleeps it out), then
    /// continues the throttle call it belongs to.
    pub(crate) fn pay_owed(&self, ws: &mut WriterState, mode: Obey<'_>) -> Throttled {
        let Some(owed) = ws.owed.take() else { return Throttled::Go };
        match (mode, &owed) {
            (Obey::Poll, _) if !owed.paid() => {
                ws.owed = Some(owed.clone());
                return Throttled::Owes(owed);
            }
            (Obey::Block(interrupted), Owed::Sleep(end)) => {
                if !sleep_for(end.saturating_duration_since(Instant::now()), interrupted) {
                    ws.owed = Some(owed);
                    return Throttled::Interrupted;
                }
            }
            (Obey::Block(interrupted), Owed::Wait(slot)) => {
                if wait_slot(slot, interrupted).is_none() {
                    ws.owed = Some(owed);
                    return Throttled::Interrupted;
                }
            }
            (Obey::Poll, _) => {}
        }
        self.continue_call(ws, mode)
    }

    fn continue_call(&self, ws: &mut WriterState, mode: Obey<'_>) -> Throttled {
        let (next, slot) = self.ebb.inner.shared.writer_step(&mut ws.writer, WriterInput::Continue);
        self.obey(ws, next, slot, mode)
    }

    /// Carries out `next` (and the moves after it) until the engine says write on, unless the
    /// caller gives up, the engine fails the write, or a non-blocking writer must wait.
    fn obey(
        &self,
        ws: &mut WriterState,
        mut next: WriterNext,
        mut slot: Option<Arc<Slot>>,
        mode: Obey<'_>,
    ) -> Throttled {
        let shared = &self.ebb.inner.shared;
        loop {
            match next {
                WriterNext::Done | WriterNext::Proceed { .. } => return Throttled::Go,
                WriterNext::Fail { error } => return Throttled::Failed(from_io_error(error)),
                WriterNext::Sleep { until } => {
                    let pause = until.saturating_since(shared.now());
                    ws.pauses.record(pause.as_micros());
                    shared.pauses.lock().record(Instant::now(), pause.as_micros());
                    let end = shared.deadline(until);
                    match mode {
                        Obey::Poll => {
                            let owed = Owed::Sleep(end);
                            ws.owed = Some(owed.clone());
                            return Throttled::Owes(owed);
                        }
                        Obey::Block(interrupted) => {
                            let pause = end.saturating_duration_since(Instant::now());
                            if !sleep_for(pause, interrupted) {
                                return Throttled::Interrupted;
                            }
                        }
                    }
                }
                WriterNext::Wait { .. } => {
                    let slot = slot.take().unwrap_or_else(|| {
                        let answered = Slot::new();
                        answered.set(Ok(()));
                        answered
                    });
                    match mode {
                        Obey::Poll => {
                            let owed = Owed::Wait(slot);
                            ws.owed = Some(owed.clone());
                            return Throttled::Owes(owed);
                        }
                        Obey::Block(interrupted) => {
                            let start = Instant::now();
                            let answered = wait_slot(&slot, interrupted).is_some();
                            ws.waits.record(start.elapsed().as_micros() as u64);
                            if !answered {
                                return Throttled::Interrupted;
                            }
                        }
                    }
                }
            }
            (next, slot) = shared.writer_step(&mut ws.writer, WriterInput::Continue);
        }
    }
}

/// The future of [`File::write_at_async`]: resolves to the bytes written (all of the buffer,
/// or fewer if an error came after some were written, as [`File::write_at`] returns).
#[must_use = "a future does nothing unless polled"]
pub struct WriteAt<'a> {
    file: &'a File,
    buf: &'a [u8],
    offset: u64,
    done: usize,
}

impl Future for WriteAt<'_> {
    type Output = io::Result<usize>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        while this.done < this.buf.len() {
            let at = this.offset + this.done as u64;
            match this.file.poll_write_at(&this.buf[this.done..], at, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(n)) => this.done += n,
                // What was written stays in the cache: a short write, as `write_at` returns.
                Poll::Ready(Err(_)) if this.done > 0 => break,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(this.done))
    }
}

impl File {
    /// One step of a write that does not block: copies as much of `buf` as the throttle
    /// allows now into the cache and returns how much (at least one byte of a non-empty
    /// buffer), or, when this handle owes a pause or waits for memory, a page under
    /// writeback or its turn to fill a write granule, returns `Pending` and has `cx`'s waker
    /// woken when it may go on (by the cache's alarm thread for a pause, by the event
    /// otherwise). [`File::write_at_async`] is a loop over it; a driver with its own task
    /// machinery (the FUSE mount parks a throttled request this way, holding no thread) can
    /// call it directly. Errors are [`File::write_at`]'s.
    pub fn poll_write_at(
        &self,
        buf: &[u8],
        offset: u64,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let step = || Some(self.write_inner(buf, offset, Obey::Poll));
        self.poll_write_with(step, cx).expect("the step never declines")
    }

    /// [`File::poll_write_at`] for a caller that must not block at all (a FUSE request loop,
    /// which must go on reading requests): `None`, having written nothing more, where it would
    /// wait for another thread writing through this handle, or would read a partial page's old
    /// bytes from the backend (a partial page already cached, or past the end of the file, is
    /// written: a stream from a buffer that is not page-aligned, whose requests begin and end
    /// inside pages, goes through here).
    pub fn try_poll_write_at(
        &self,
        buf: &[u8],
        offset: u64,
        cx: &mut Context<'_>,
    ) -> Option<Poll<io::Result<usize>>> {
        let step = || {
            if buf.is_empty() {
                return Some(Ok((0, None)));
            }
            if let Err(error) = self.check_writable(buf.len(), offset) {
                return Some(Err(error));
            }
            let ws = self.writer.try_lock()?;
            self.write_locked(ws, buf, offset, Obey::Poll, OldBytes::Decline).transpose()
        };
        self.poll_write_with(step, cx)
    }

    /// A poll of a write whose steps are `step` (`None`: the step declined, writing nothing).
    fn poll_write_with(
        &self,
        step: impl Fn() -> Option<io::Result<(usize, Option<Owed>)>>,
        cx: &mut Context<'_>,
    ) -> Option<Poll<io::Result<usize>>> {
        loop {
            let owed = match step()? {
                Err(e) => return Some(Poll::Ready(Err(e))),
                Ok((n, _)) if n > 0 => return Some(Poll::Ready(Ok(n))),
                Ok((_, owed)) => owed,
            };
            match owed {
                Some(Owed::Sleep(end)) => {
                    self.ebb.inner.shared.alarms.wake_at(end, cx.waker().clone());
                    return Some(Poll::Pending);
                }
                Some(Owed::Wait(slot)) => {
                    if slot.poll(cx.waker()).is_none() {
                        return Some(Poll::Pending);
                    }
                }
                // Nothing written and nothing owed: an empty buffer.
                None => return Some(Poll::Ready(Ok(0))),
            }
        }
    }
}
