//! What a request that needs the backend does while the backend cannot be reached, and how
//! the process that made it can still be killed.
//!
//! # The outage rule (docs/outages.md)
//!
//! A backend call that fails with an error of the core's `Outage` class (connection refused,
//! reset or timed out, `EAGAIN`, ...: `ebb_core::event::IoError::class`) is tried again or
//! answered `EIO` as `ebb_core::outage` decides: tries `ebb_core::outage::PROBE_MIN` apart at first, the wait
//! doubling to [`PROBE_MAX`] (the next try is the probe, so a request goes on within
//! [`PROBE_MAX`] plus one round trip of the server's return), until the backend has failed
//! for its `retry_timeout_secs` without an answer (one clock for the mount's backend, not one
//! per request, and the one the engine's write-back runs for data, `Clock::of`); then `EIO`.
//! No socket errno reaches the application. A server that accepts and never answers fails
//! nothing: the watcher tells the clock of the oldest request waiting longer than the
//! backend's own per-try timeout (NFS `timeo`, S3's per-read timeout: evidence of an outage,
//! whose silence counts from that request's start, [`Clock::waiting`]; a backend without one
//! never), and once the backend has been unreachable for the deadline
//! ([`Clock::unreachable`], which counts the engine's IOs in flight the same way) it answers
//! `EIO` to every waiting request (reads, fsync and flush included), a new one after one try
//! of [`WATCH_EVERY`] or more (a probe: its backend call goes on, and its answer ends the
//! outage), until the backend answers.
//!
//! # Killability
//!
//! The kernel waits uninterruptibly for the answer to a request that has reached us, and
//! fuser answers `FUSE_INTERRUPT` itself ([`super::io_ops::killed`]). So every request that
//! may wait on the backend is answered through a [`Guard`]: the request runs on the guard's
//! pool, its reply kept in a slot; the guard's watcher looks every [`WATCH_EVERY`] at the
//! callers of the requests not yet answered, and answers `EINTR` for a caller being killed.
//! The call itself goes on and its result is thrown away, with what it opened or counted
//! undone (`answer` gets `None`). `fsync` and the `flush` of a close run on the write pool
//! under the same watcher ([`Guard::run_killable_on`]): even one with nothing to write asks
//! the backend (the file's size for its trim, a COMMIT), and a killed process's close on its
//! way out waits for its FLUSH's answer whatever signal comes.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ebb_core::event::{ErrorClass, IoError};
use ebb_core::outage::{Next, OutageClock};
use ebb_core::{Duration as CoreDuration, Instant as CoreInstant};
use fuser::{
    Errno, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyXattr,
};
use parking_lot::Mutex;

use super::io_ops::killed;
use crate::data::DataPath;
use crate::pool::Pool;

pub(crate) use ebb_core::outage::PROBE_MAX;
/// How often the callers of unanswered requests are checked for a fatal signal.
const WATCH_EVERY: Duration = Duration::from_millis(50);
/// Slices of a wait between tries, each followed by a look at the caller.
const SLICE: Duration = Duration::from_millis(20);

/// Threads running guarded requests, and requests queued beyond them.
const THREADS: usize = 16;
const QUEUE: usize = 64;

/// Whether `errno` says the backend could not be reached (retried until the deadline).
pub(crate) fn is_outage(errno: Errno) -> bool {
    IoError { errno: errno.code() }.class() == ErrorClass::Outage
}

/// The outage clock of the mount's backend: the data path's where it keeps one (ebb's
/// engine, whose write-back runs the same clock: [`DataPath::request_failed`]), else one of
/// the mount's own ([`OutageClock`]) on the OS's monotonic clock.
pub(crate) struct Clock {
    origin: Instant,
    state: Mutex<OutageClock>,
    data: Option<Arc<dyn DataPath>>,
}

fn core_duration(duration: Duration) -> CoreDuration {
    CoreDuration::from_nanos(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
}

impl Clock {
    /// A clock of the mount's own, for a backend whose `retry_timeout_secs` is `deadline`
    /// and whose client gives up a try unanswered for `try_timeout` (`None`: never).
    pub(crate) fn new(deadline: Duration, try_timeout: Option<Duration>) -> Clock {
        let clock = OutageClock::new(core_duration(deadline), try_timeout.map(core_duration));
        Clock { origin: Instant::now(), state: Mutex::new(clock), data: None }
    }

    /// The clock `data` keeps, if it keeps one (else the mount's own).
    pub(crate) fn of(data: Arc<dyn DataPath>) -> Clock {
        let own = Clock::new(data.retry_timeout(), data.try_timeout());
        Clock { data: Some(Arc::clone(&data)), ..own }
    }

    /// The backend's own per-try timeout (`None`: it has none; a request in service is
    /// never evidence of an outage).
    pub(crate) fn try_timeout(&self) -> Option<Duration> {
        self.state.lock().try_timeout().map(|t| Duration::from_nanos(t.as_nanos()))
    }

    fn succeeded(&self) {
        if let Some(data) = &self.data {
            data.request_succeeded();
        }
        let now = self.at(Instant::now());
        self.state.lock().succeeded(now);
    }

    /// A request begun at `started` still waits for the backend: once its try outlived the
    /// per-try timeout, the backend's silence counts from then, or from its last answer
    /// ([`OutageClock::waiting`]).
    fn waiting(&self, started: Instant) {
        if self.data.as_ref().is_some_and(|data| data.request_waiting(started)) {
            return;
        }
        let (started, now) = (self.at(started), self.at(Instant::now()));
        self.state.lock().waiting(started, now);
    }

    /// Whether the backend has been unreachable for its deadline: every request waiting on
    /// it, and every new one, is answered `EIO` until it answers again
    /// ([`OutageClock::expired`]; the engine's clock counts its IOs in flight too).
    pub(crate) fn unreachable(&self) -> bool {
        if let Some(unreachable) = self.data.as_ref().and_then(|data| data.backend_unreachable()) {
            return unreachable;
        }
        let now = self.at(Instant::now());
        self.state.lock().expired(now, None)
    }

    fn failed(&self, error: IoError, first: Instant, started: Instant, failures: u32) -> Next {
        let kept =
            self.data.as_ref().and_then(|d| d.request_failed(error, first, started, failures));
        if let Some(next) = kept {
            return next;
        }
        let (first, started, now) = (self.at(first), self.at(started), self.at(Instant::now()));
        self.state.lock().failed(error, first, started, now, failures)
    }

    /// The backend's `retry_timeout_secs`.
    pub(crate) fn deadline(&self) -> Duration {
        Duration::from_nanos(self.state.lock().deadline().as_nanos())
    }

    fn at(&self, instant: Instant) -> CoreInstant {
        let nanos = instant.saturating_duration_since(self.origin).as_nanos();
        CoreInstant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// `call` tried once, on a thread that must not wait through an outage (a request loop):
    /// its result as [`Clock::through_outage`] would give it, or `None` after an outage error,
    /// which the caller tries again through [`Clock::through_outage`] on a thread that may wait.
    pub(crate) fn once<T>(
        &self,
        call: impl FnOnce() -> Result<T, Errno>,
    ) -> Option<Result<T, Errno>> {
        let started = Instant::now();
        let errno = match call() {
            Ok(value) => {
                self.succeeded();
                return Some(Ok(value));
            }
            Err(errno) if is_outage(errno) => return None,
            Err(errno) => errno,
        };
        let error = IoError { errno: errno.code() };
        match self.failed(error, started, started, 0) {
            Next::Fail(failed) if failed == error => Some(Err(errno)),
            Next::Fail(failed) => Some(Err(Errno::from_i32(failed.errno))),
            Next::Retry(_) => None,
        }
    }

    /// Runs `call` until it gives something else than an outage error, or `EIO` once the
    /// backend has failed for the deadline (`ebb_core::outage`); `EINTR` when `interrupted`
    /// says so between tries.
    pub(crate) fn through_outage<T>(
        &self,
        interrupted: &dyn Fn() -> bool,
        mut call: impl FnMut() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let (mut failures, mut first) = (0, None);
        loop {
            let started = Instant::now();
            let errno = match call() {
                Ok(value) => {
                    self.succeeded();
                    return Ok(value);
                }
                Err(errno) => errno,
            };
            let error = IoError { errno: errno.code() };
            let first_at = *first.get_or_insert(started);
            let next = self.failed(error, first_at, started, failures);
            let wait = match next {
                // The call's own error, as it came (an outage's is EIO, the core's mapping).
                Next::Fail(failed) if failed == error => return Err(errno),
                Next::Fail(failed) => return Err(Errno::from_i32(failed.errno)),
                Next::Retry(wait) => Duration::from_nanos(wait.as_nanos()),
            };
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if interrupted() {
                    return Err(Errno::EINTR);
                }
                std::thread::sleep(SLICE.min(until.saturating_duration_since(Instant::now())));
            }
            failures += 1;
        }
    }
}

/// A fuser reply that can be answered with an error.
pub(crate) trait Reply: Send + 'static {
    fn fail(self, errno: Errno);
}

macro_rules! replies {
    ($($reply:ty),*) => {$(
        impl Reply for $reply {
            fn fail(self, errno: Errno) {
                self.error(errno);
            }
        }
    )*};
}
replies!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyEmpty,
    ReplyEntry,
    ReplyOpen,
    ReplyStatfs,
    ReplyXattr
);

/// A request's reply until someone answers it.
struct Slot<R>(Mutex<Option<R>>);

/// A request not yet answered: its caller, when it came, the slot of its reply, and whether
/// it is answered `EIO` once it has waited longer than the deadline allows (`bounded`).
struct Waiting {
    pid: u32,
    since: Instant,
    bounded: bool,
    slot: Arc<dyn Pending>,
}

/// A slot of any reply type, as the watcher sees it.
trait Pending: Send + Sync {
    fn answered(&self) -> bool;
    /// Answers `errno` unless already answered.
    fn interrupt(&self, errno: Errno);
}

impl<R: Reply> Pending for Slot<R> {
    fn answered(&self) -> bool {
        self.0.lock().is_none()
    }

    fn interrupt(&self, errno: Errno) {
        if let Some(reply) = self.0.lock().take() {
            reply.fail(errno);
        }
    }
}

/// The pool guarded requests run on and the list of their callers the watcher checks.
pub(crate) struct Guard {
    pool: Pool,
    pending: Mutex<Vec<Waiting>>,
    /// The outage clock of the mount's backend (its `retry_timeout_secs` inside).
    pub(crate) clock: Arc<Clock>,
}

impl Guard {
    /// The guard of a mount whose file data goes through `data` (which may keep the backend's
    /// outage clock, [`Clock::of`]); `jobs` counts the requests it runs.
    pub(crate) fn new(
        data: Arc<dyn DataPath>,
        jobs: Arc<std::sync::atomic::AtomicU64>,
    ) -> std::io::Result<Arc<Guard>> {
        let guard = Arc::new(Guard {
            pool: Pool::new("ebb-fuse-meta", THREADS, QUEUE, jobs)?,
            pending: Mutex::new(Vec::new()),
            clock: Arc::new(Clock::of(data)),
        });
        let weak = Arc::downgrade(&guard);
        std::thread::Builder::new()
            .name("ebb-fuse-watch".to_owned())
            .spawn(move || watch(&weak))?;
        Ok(guard)
    }

    /// Runs `op` on the pool for the caller `pid` (`op` gets whether the caller is being
    /// killed), then `answer` with the reply, or with `None` when the caller was answered
    /// `EINTR` meanwhile (then `answer` undoes what the result holds).
    pub(crate) fn run<R: Reply, T: Send + 'static>(
        &self,
        pid: u32,
        reply: R,
        op: impl FnOnce(&dyn Fn() -> bool) -> T + Send + 'static,
        answer: impl FnOnce(Option<R>, T) + Send + 'static,
    ) {
        self.run_watched(&self.pool, true, pid, reply, op, answer);
    }

    /// [`Guard::run`] on `pool` (a read, on the read pool).
    pub(crate) fn run_on<R: Reply, T: Send + 'static>(
        &self,
        pool: &Pool,
        pid: u32,
        reply: R,
        op: impl FnOnce(&dyn Fn() -> bool) -> T + Send + 'static,
        answer: impl FnOnce(Option<R>, T) + Send + 'static,
    ) {
        self.run_watched(pool, true, pid, reply, op, answer);
    }

    /// [`Guard::run`] on `pool`, for a request that may rightly wait longer than the deadline
    /// while the backend answers (an fsync or a close writing a large file back): answered
    /// `EINTR` when its caller is killed, never `EIO` for its time. A flush or an fsync that
    /// found nothing to write still asks the backend (its size, a COMMIT, an S3 completion),
    /// and the caller's close or exit waits for that answer whatever signal comes.
    pub(crate) fn run_killable_on<R: Reply, T: Send + 'static>(
        &self,
        pool: &Pool,
        pid: u32,
        reply: R,
        op: impl FnOnce(&dyn Fn() -> bool) -> T + Send + 'static,
        answer: impl FnOnce(Option<R>, T) + Send + 'static,
    ) {
        self.run_watched(pool, false, pid, reply, op, answer);
    }

    /// Past the deadline of a backend that does not answer, a request the pool cannot start
    /// at once is answered `EIO` without a try: the pool's threads may all be held by calls
    /// that wait for the clients' own timeouts, and the request loop would wait for room.
    fn run_watched<R: Reply, T: Send + 'static>(
        &self,
        pool: &Pool,
        bounded: bool,
        pid: u32,
        reply: R,
        op: impl FnOnce(&dyn Fn() -> bool) -> T + Send + 'static,
        answer: impl FnOnce(Option<R>, T) + Send + 'static,
    ) {
        if pool.would_wait() && self.clock.unreachable() {
            reply.fail(Errno::EIO);
            return;
        }
        let slot = Arc::new(Slot(Mutex::new(Some(reply))));
        let since = Instant::now();
        let waiting = Waiting { pid, since, bounded, slot: Arc::clone(&slot) as _ };
        self.pending.lock().push(waiting);
        pool.run(move || {
            if slot.answered() {
                return; // the caller was killed while the request was queued
            }
            let result = op(&|| killed(pid));
            let reply = slot.0.lock().take();
            answer(reply, result);
        });
    }
}

/// Every [`WATCH_EVERY`]: forgets the answered requests, tells the backend's clock since
/// when the oldest bounded one has waited once that outlived the backend's per-try timeout
/// (a server that accepts and never answers fails nothing, [`Clock::waiting`]), answers
/// `EINTR` to the killed callers of the others, `EIO` to every one (after one try of
/// [`WATCH_EVERY`] or more) once the backend has been unreachable for its deadline
/// ([`Clock::unreachable`]), and `EIO` to the bounded ones ([`Guard::run`]) waiting longer
/// than the deadline (plus [`PROBE_MAX`]) in all: a backend call that hangs may itself
/// outlast the deadline before it fails. Until the guard is dropped.
fn watch(guard: &Weak<Guard>) {
    while let Some(guard) = guard.upgrade() {
        let pending: Vec<(u32, Instant, bool, Arc<dyn Pending>)> = {
            let mut pending = guard.pending.lock();
            pending.retain(|waiting| !waiting.slot.answered());
            pending.iter().map(|w| (w.pid, w.since, w.bounded, Arc::clone(&w.slot))).collect()
        };
        let longest = guard.clock.deadline() + Duration::from_nanos(PROBE_MAX.as_nanos());
        // A try unanswered past the backend's own per-try timeout: evidence of an outage (a
        // request merely in service, on a backend without one, is none).
        let try_timeout = guard.clock.try_timeout();
        let given_up = |since: &Instant| try_timeout.is_some_and(|limit| since.elapsed() >= limit);
        let waiting = pending.iter().filter(|(_, since, bounded, _)| *bounded && given_up(since));
        if let Some(oldest) = waiting.map(|(_, since, _, _)| *since).min() {
            guard.clock.waiting(oldest);
        }
        // Past the deadline a request's one try is a probe of WATCH_EVERY or more: the
        // kernel sends the lookups of one directory one at a time (FUSE without parallel
        // directory operations), so a longer probe makes a queue of calls fail one probe
        // apart (a probe of 0.5 s: the calls on paths of a 3 s stall failed 3.0 to 8.7 s into
        // it). A server that is back hears the probe all the same: the request's backend
        // call goes on, and its answer ends the outage for the next ones.
        let unreachable = !pending.is_empty() && guard.clock.unreachable();
        drop(guard);
        for (pid, since, bounded, slot) in pending {
            if slot.answered() {
                continue;
            }
            if killed(pid) {
                slot.interrupt(Errno::EINTR);
            } else if unreachable && since.elapsed() >= WATCH_EVERY {
                // The backend has been unreachable for the deadline and this request's try,
                // its probe, went unanswered too.
                slot.interrupt(Errno::EIO);
            } else if bounded && since.elapsed() > longest {
                slot.interrupt(Errno::EIO);
            }
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outage_errors_are_retried_until_the_deadline_then_eio() {
        let mut tries = 0;
        let result: Result<(), Errno> = Clock::new(Duration::from_millis(300), None)
            .through_outage(&|| false, || {
                tries += 1;
                Err(Errno::from_i32(libc::ECONNREFUSED))
            });
        assert_eq!(result, Err(Errno::EIO));
        assert!(3 <= tries, "{tries} tries");
    }

    #[test]
    fn a_call_that_recovers_succeeds_and_other_errors_pass_at_once() {
        let mut tries = 0;
        let result = Clock::new(Duration::from_secs(10), None).through_outage(&|| false, || {
            tries += 1;
            if tries < 3 { Err(Errno::from_i32(libc::ECONNRESET)) } else { Ok(tries) }
        });
        assert_eq!(result, Ok(3));
        let mut tries = 0;
        let result: Result<(), Errno> =
            Clock::new(Duration::from_secs(10), None).through_outage(&|| false, || {
                tries += 1;
                Err(Errno::ENOENT)
            });
        assert_eq!((result, tries), (Err(Errno::ENOENT), 1));
    }

    #[test]
    fn an_interrupted_caller_stops_waiting() {
        let result: Result<(), Errno> = Clock::new(Duration::from_secs(10), None)
            .through_outage(&|| true, || Err(Errno::from_i32(libc::ETIMEDOUT)));
        assert_eq!(result, Err(Errno::EINTR));
    }
}
