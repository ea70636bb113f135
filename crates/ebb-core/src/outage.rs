//! The outage rule for requests a caller waits on (a lookup, a create, a read that misses
//! the cache): whether a backend call that failed because the backend could not be reached
//! is tried again, when, or answered `EIO`; and the backend's one outage clock, which the
//! engine's write-back runs too (`Engine::request_failed`, `Engine::request_succeeded`). The
//! drivers (ebb-fuse's request guard) run the calls and sleep; this module decides.
//!
//! # Goal
//! An outage is a wait, never an error, for as long as the backend's `retry_timeout_secs`
//! allows (a hard NFS mount), then `EIO` (a soft one): no socket errno reaches a caller.
//!
//! # Signals
//! Each call's outcome, with the time its try started and the time it failed: a failure of
//! the [`ErrorClass::Outage`] class ([`IoError::class`]), an answer, or an error that says
//! nothing of the server. No window; no samples are kept. An answer is a success or any
//! other error ([`is_answer`]): `ENOENT`, `EACCES`, `ENOSPC` or `EIO` from the server mean
//! it was reached, so they end the outage as a success does, and pass to the caller. An error
//! the caller or the mount made itself leaves the clock alone: `EINTR` and `ECANCELED` (the
//! caller gave up, the server was not heard to the end), `EBADF`, `EROFS` (a stopping mount
//! refuses changes itself; a server's `NFS3ERR_ROFS` is then not counted as an answer, which
//! only delays the outage's end to the next one), `ENOMEM`, `EMFILE`, `ENFILE` (local
//! resources).
//!
//! # Control law
//! ```text
//! answered = the last answer from the backend (a success, or an error the server gave)
//! since    = start of the first failed try after the last success, over every request of
//!            the backend and every write and COMMIT the engine wrote back to it (a write's
//!            failure counts from its completion; one clock per backend, the engine's);
//!            a call still unanswered once its try has outlived the backend's own per-try
//!            timeout (NFS: `timeo`; S3: the per-read timeout) counts as failed from
//!            max(its start, answered): the engine's oldest IO in flight, a request its
//!            driver reports waiting; before that timeout, or on a backend without one (a
//!            local device), a call in flight is in service and counts for nothing
//! expired  = now - since >= deadline: every call waiting, and every new one whose try
//!            outlives the per-try timeout, fails with EIO (the driver answers it; its
//!            backend call goes on as a probe), fsync and close of a file with unwritten
//!            data answer EIO, until the backend answers
//! first    = start of this request's first failed try
//! start    = min(since, first)
//! failure at `now`, the request's n-th failure (n = 0, 1, ...):
//!     now - start >= deadline   ->  EIO
//!     otherwise                 ->  try again after min(PROBE_MIN * 2^n, PROBE_MAX,
//!                                                       start + deadline - now)
//! an answer (a success, or an error the server gave: `is_answer`)
//!                               ->  since = none (the outage is over)
//! `EINTR` and the mount's own errors
//!                               ->  nothing (the clock runs on)
//! ```
//! A server that accepts and never answers fails nothing until a client's retries give up
//! (NFS: `timeo` times `retrans + 1`; S3: a minute per read, times its retries): counting a
//! call whose try outlived the per-try timeout from its start makes the outage start when
//! the first unanswered call was made, so `EIO` comes at the deadline (or at the per-try
//! timeout, if that is longer), not after the clients' retries. Only evidence starts the
//! clock: a failure, or a try given up unanswered. An IO merely in flight on a slow device
//! is not one (the release swarm's seed 397 of `bandwidth-2010`, a USB stick with
//! `retry_timeout_secs = 2`, reported `EIO` at a close when a slow write counted from its
//! issue).
//! A success may be the mount's own (a read of cached data, `ebb stat`) while the server is
//! still away: it resets `since`, and `first` still bounds each request to one deadline of
//! its own failures, the rule's weaker form.
//! The clock is the backend's, not the request's: the kernel runs the creates and lookups
//! of one directory one after another (its directory lock), so with a per-request clock nine
//! calls queued behind each other in one directory took nine deadlines to fail. With the
//! backend's clock, once the outage has lasted the deadline every call fails after one try
//! (which is also a probe: the first answer ends the outage for all). The engine's rule for
//! written-back data ("failed for `retry_timeout_secs` without a success", then `EIO` at
//! fsync and close) reads the same clock: a request that fails starts it for write-back, a
//! write that succeeds stops it for requests, so a backend has one notion of "down since"
//! (the engine keeps one [`OutageClock`] per backend; a driver without an engine, ebb-fuse's
//! passthrough, keeps its own).
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | [`PROBE_MIN`] | 50 | ms | derived: a refused connection fails in well under a millisecond on a LAN; 50 ms keeps a short blip to a few tries |
//! | [`PROBE_MAX`] | 500 | ms | derived: a waiting call goes on within 0.5 s plus one round trip of the server's return (issue 34 asks for 5 s); two tries a second against a down server cost nothing |
//!
//! # Insufficient data
//! None needed: the first failure starts the clock, the first answer stops it.
//!
//! # Stability
//! The wait doubles per request up to [`PROBE_MAX`]; a zero deadline fails at the first
//! failure (no patience, as the engine's `retry_timeout_secs = 0`), a try given up unanswered
//! included.
//!
//! # Observability
//! Unit tests below; through the mount, `crates/ebb-cli/tests/outage/`.

use crate::event::{ErrorClass, IoError, errno};
use crate::time::{Duration, Instant};

/// Whether a failed call's `error` is the server's answer (it was reached: the outage, if
/// any, is over), rather than an outage or an error the caller or the mount made itself
/// (module doc, Signals).
pub fn is_answer(error: IoError) -> bool {
    error.class() != ErrorClass::Outage
        && !matches!(
            error.errno,
            errno::EINTR
                | errno::ECANCELED
                | errno::EBADF
                | errno::EROFS
                | errno::ENOMEM
                | errno::EMFILE
                | errno::ENFILE
        )
}

/// The first wait before a failed call is tried again.
pub const PROBE_MIN: Duration = Duration::from_millis(50);
/// The longest wait between two tries (the probe interval once the outage lasts).
pub const PROBE_MAX: Duration = Duration::from_millis(500);

/// What to do after a call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Try again after this wait.
    Retry(Duration),
    /// Answer the caller with this error (`EIO` past the deadline, or the call's own error
    /// when it was not an outage).
    Fail(IoError),
}

/// One backend's outage clock: the requests callers wait on and the engine's write-back.
#[derive(Clone, Copy, Debug)]
pub struct OutageClock {
    deadline: Duration,
    /// The backend's own per-try timeout (`None`: it has none, a local device).
    try_timeout: Option<Duration>,
    since: Option<Instant>,
    /// When the backend last answered (`None`: not since the clock was made).
    answered: Option<Instant>,
}

impl OutageClock {
    /// A clock for a backend whose `retry_timeout_secs` is `deadline` and whose client gives
    /// up a try unanswered for `try_timeout` (NFS: `timeo`; S3: the per-read timeout; `None`
    /// for a backend without one, a local device, whose slow IO is still in service).
    pub fn new(deadline: Duration, try_timeout: Option<Duration>) -> OutageClock {
        OutageClock { deadline, try_timeout, since: None, answered: None }
    }

    /// The backend's `retry_timeout_secs`.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The backend's own per-try timeout (`None`: none).
    pub fn try_timeout(&self) -> Option<Duration> {
        self.try_timeout
    }

    /// Since when the backend could not be reached (`None`: it answered last).
    pub fn since(&self) -> Option<Instant> {
        self.since
    }

    /// A call succeeded (or the server answered it with an error) at `at`: the outage, if
    /// any, is over.
    pub fn succeeded(&mut self, at: Instant) {
        self.since = None;
        self.answered = Some(self.answered.map_or(at, |answered| answered.max(at)));
    }

    /// Whether a call begun at `started` and still unanswered at `now` is evidence of an
    /// outage: its try has outlived the backend's own per-try timeout (the client gave it up,
    /// or is about to). A backend without one never: a slow IO is still in service.
    pub fn unanswered(&self, started: Instant, now: Instant) -> bool {
        self.try_timeout.is_some_and(|limit| limit <= now.saturating_since(started))
    }

    /// A call begun at `started` has had no answer by `now` (a call a driver saw waiting,
    /// the engine's oldest IO in flight): once its try has outlived the per-try timeout
    /// ([`OutageClock::unanswered`]) the backend counts as silent since the call's start, or
    /// since its last answer if that came later (a server that accepts and never answers
    /// fails nothing, so without this its outage would start only when a client's retries
    /// give up). Before then it counts for nothing. Module doc, Control law.
    pub fn waiting(&mut self, started: Instant, now: Instant) {
        if !self.unanswered(started, now) {
            return;
        }
        let from = self.silent_from(started);
        self.since = Some(self.since.map_or(from, |since| since.min(from)));
    }

    fn silent_from(&self, started: Instant) -> Instant {
        self.answered.map_or(started, |answered| answered.max(started))
    }

    /// When the backend turns unreachable (the outage reaches its deadline), a call in
    /// flight since `oldest` and not answered counted as by [`OutageClock::waiting`]: from
    /// its start once its try outlived the per-try timeout, so not before that; `None`: no
    /// outage, and no call that may become one.
    pub fn expires_at(&self, oldest: Option<Instant>) -> Option<Instant> {
        let failed = self.since.map(|since| since + self.deadline);
        let waiting = oldest
            .zip(self.try_timeout)
            .map(|(oldest, limit)| (self.silent_from(oldest) + self.deadline).max(oldest + limit));
        match (failed, waiting) {
            (Some(failed), Some(waiting)) => Some(failed.min(waiting)),
            (failed, waiting) => failed.or(waiting),
        }
    }

    /// Whether the backend has been unreachable for its deadline at `now` (counting a call
    /// in flight since `oldest`, as [`OutageClock::expires_at`]): every call fails with `EIO`
    /// once its own try is given up, until the backend answers again.
    pub fn expired(&self, now: Instant, oldest: Option<Instant>) -> bool {
        self.expires_at(oldest).is_some_and(|at| at <= now)
    }

    /// A backend call failed with an outage error at `at` (the engine's write-back: a write
    /// or COMMIT, at its completion): the outage runs from then if it was not running.
    pub fn down(&mut self, at: Instant) {
        self.since.get_or_insert(at);
    }

    /// A request's try that began at `started` failed at `now` with `error`; `first` is when
    /// the request's first failed try began (`started` for the first), `failures` how many of
    /// its tries failed before this one. Errors other than an outage are the caller's answer
    /// at once; one the server gave ([`is_answer`]) ends the outage as a success does.
    pub fn failed(
        &mut self,
        error: IoError,
        first: Instant,
        started: Instant,
        now: Instant,
        failures: u32,
    ) -> Next {
        if error.class() != ErrorClass::Outage {
            if is_answer(error) {
                self.succeeded(now);
            }
            return Next::Fail(error);
        }
        let since = (*self.since.get_or_insert(started)).min(first);
        let waited = now.saturating_since(since);
        if self.deadline <= waited {
            return Next::Fail(IoError { errno: errno::EIO });
        }
        let backoff = Duration::from_nanos(
            PROBE_MIN.as_nanos().saturating_mul(1u64 << failures.min(16)).min(PROBE_MAX.as_nanos()),
        );
        let left = Duration::from_nanos(self.deadline.as_nanos() - waited.as_nanos());
        Next::Retry(backoff.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: IoError = IoError { errno: errno::ECONNREFUSED };

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn outage_failures_wait_doubling_to_the_probe_interval_then_eio_at_the_deadline() {
        let mut clock = OutageClock::new(Duration::from_secs(3), None);
        assert_eq!(clock.failed(REFUSED, at(0), at(0), at(1), 0), Next::Retry(PROBE_MIN));
        assert_eq!(
            clock.failed(REFUSED, at(0), at(60), at(61), 1),
            Next::Retry(Duration::from_millis(100))
        );
        assert_eq!(clock.failed(REFUSED, at(0), at(200), at(201), 9), Next::Retry(PROBE_MAX));
        // Never past the deadline.
        assert_eq!(
            clock.failed(REFUSED, at(0), at(2_800), at(2_900), 9),
            Next::Retry(Duration::from_millis(100))
        );
        assert_eq!(
            clock.failed(REFUSED, at(0), at(2_990), at(3_000), 9),
            Next::Fail(IoError { errno: errno::EIO })
        );
    }

    #[test]
    fn the_clock_is_the_backends_a_request_coming_late_in_an_outage_fails_after_one_try() {
        let mut clock = OutageClock::new(Duration::from_secs(3), None);
        assert!(matches!(clock.failed(REFUSED, at(0), at(0), at(1), 0), Next::Retry(_)));
        // Another request, its first try, 3.5 s into the outage.
        assert_eq!(
            clock.failed(REFUSED, at(3_500), at(3_500), at(3_501), 0),
            Next::Fail(IoError { errno: errno::EIO })
        );
        // The server answers: a new outage starts a new clock.
        clock.succeeded(at(3_900));
        assert_eq!(clock.since(), None);
        let next = clock.failed(REFUSED, at(4_000), at(4_000), at(4_001), 0);
        assert!(matches!(next, Next::Retry(_)));
        assert_eq!(clock.since(), Some(at(4_000)));
    }

    #[test]
    fn a_success_of_the_mounts_own_meanwhile_still_leaves_each_request_one_deadline() {
        let mut clock = OutageClock::new(Duration::from_secs(3), None);
        assert!(matches!(clock.failed(REFUSED, at(0), at(0), at(1), 0), Next::Retry(_)));
        clock.succeeded(at(1)); // a read of cached data, say
        let next = clock.failed(REFUSED, at(0), at(3_000), at(3_001), 9);
        assert_eq!(next, Next::Fail(IoError { errno: errno::EIO }));
    }

    #[test]
    fn other_errors_are_passed_at_once_and_the_servers_end_the_outage() {
        let mut clock = OutageClock::new(Duration::from_secs(3), None);
        let _ = clock.failed(REFUSED, at(0), at(0), at(1), 0);
        // The caller's signal and the mount's own errors say nothing of the server.
        for own in [errno::EINTR, errno::EBADF, errno::EROFS, errno::EMFILE] {
            let own = IoError { errno: own };
            assert_eq!(clock.failed(own, at(10), at(10), at(11), 0), Next::Fail(own));
            assert_eq!(clock.since(), Some(at(0)), "errno {}", own.errno);
        }
        // The server answers, with an error: it is reached, the outage is over.
        let enoent = IoError { errno: errno::ENOENT };
        assert_eq!(clock.failed(enoent, at(20), at(20), at(21), 0), Next::Fail(enoent));
        assert_eq!(clock.since(), None);
        // So a failure 3.5 s after the first one starts a new outage, with its own deadline,
        // rather than EIO at once on the clock of the old one.
        let next = clock.failed(REFUSED, at(3_500), at(3_500), at(3_501), 0);
        assert_eq!(next, Next::Retry(PROBE_MIN));
        assert_eq!(clock.since(), Some(at(3_500)));
    }

    #[test]
    fn only_outages_and_the_callers_or_mounts_own_errors_are_not_answers() {
        for answer in [errno::ENOENT, errno::EACCES, errno::ENOSPC, errno::EIO, errno::ESTALE] {
            assert!(is_answer(IoError { errno: answer }), "errno {answer}");
        }
        for not in [errno::ECONNREFUSED, errno::ETIMEDOUT, errno::EAGAIN, errno::EINTR] {
            assert!(!is_answer(IoError { errno: not }), "errno {not}");
        }
    }

    #[test]
    fn a_call_unanswered_past_the_try_timeout_starts_the_outage_from_its_start() {
        let mut clock = OutageClock::new(Duration::from_secs(3), Some(Duration::from_secs(1)));
        // A server that accepts and never answers: nothing failed, one call in flight since
        // 1 s. Evidence once its try is given up (2 s), counted from its start: EIO at 4 s.
        assert_eq!(clock.expires_at(None), None);
        assert_eq!(clock.expires_at(Some(at(1_000))), Some(at(4_000)));
        assert!(!clock.expired(at(3_999), Some(at(1_000))));
        assert!(clock.expired(at(4_000), Some(at(1_000))));
        clock.waiting(at(1_000), at(1_999));
        assert_eq!(clock.since(), None, "a try within its timeout is no evidence");
        // An answer after the call began: silent only since that answer.
        clock.succeeded(at(2_000));
        assert_eq!(clock.expires_at(Some(at(1_000))), Some(at(5_000)));
        assert!(!clock.expired(at(4_500), Some(at(1_000))));
        // A driver's report keeps the start until the next answer, and the requests' rule
        // reads it: a request failing at 5.1 s gets EIO after one try.
        clock.waiting(at(1_000), at(2_500));
        assert_eq!(clock.since(), Some(at(2_000)));
        assert!(clock.expired(at(5_000), None));
        let next = clock.failed(REFUSED, at(5_100), at(5_100), at(5_101), 0);
        assert_eq!(next, Next::Fail(IoError { errno: errno::EIO }));
        clock.succeeded(at(6_000));
        assert!(!clock.expired(at(6_001), None));
        // An earlier failure stays the start.
        clock.down(at(7_000));
        clock.waiting(at(7_500), at(9_000));
        assert_eq!(clock.since(), Some(at(7_000)));
        assert_eq!(clock.expires_at(Some(at(7_500))), Some(at(10_000)));
        // A call waiting since before it counts from its own start (the last answer, 6 s).
        clock.waiting(at(6_500), at(9_000));
        assert_eq!(clock.since(), Some(at(6_500)));
        // A per-try timeout longer than the deadline: EIO when the try is given up.
        let slow = OutageClock::new(Duration::from_secs(2), Some(Duration::from_secs(10)));
        assert_eq!(slow.expires_at(Some(at(0))), Some(at(10_000)));
    }

    /// A backend without a per-try timeout (a local device): an IO in flight is in service,
    /// however long; only failures start the clock. The reverted rule (every call in flight
    /// an outage from its issue) reported EIO at a close in the release swarm (seed 397).
    #[test]
    fn a_slow_call_in_flight_without_a_try_timeout_is_no_outage() {
        let mut clock = OutageClock::new(Duration::from_secs(2), None);
        assert_eq!(clock.expires_at(Some(at(0))), None);
        assert!(!clock.expired(at(60_000), Some(at(0))));
        clock.waiting(at(0), at(60_000));
        assert_eq!(clock.since(), None);
        // A failure still starts it.
        clock.down(at(60_000));
        assert!(clock.expired(at(62_000), Some(at(0))));
    }

    #[test]
    fn no_patience_fails_at_the_first_outage_error() {
        let mut clock = OutageClock::new(Duration::ZERO, None);
        assert_eq!(
            clock.failed(REFUSED, at(0), at(0), at(1), 0),
            Next::Fail(IoError { errno: errno::EIO })
        );
    }
}
