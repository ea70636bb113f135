//! The backend's one outage clock for the requests a mount's callers wait on (lookups,
//! creates, reads that miss the cache): the request guard of ebb-fuse reports each failure
//! and success here, and the engine answers on the clock its write-back runs too
//! (`ebb_core::outage`; `Engine::request_failed`), so a backend has one notion of "down
//! since" for data and requests alike.

use std::io;

use ebb_core::IoError;
use ebb_core::outage::Next;

use crate::Ebb;

impl Ebb {
    /// A request to `backend` that a caller waits on failed with `error`: whether to try it
    /// again after a wait or answer (`EIO` once the backend has been unreachable for its
    /// `retry_timeout_secs`, counted on the clock its write-back also runs). `first` is when
    /// the request's first failed try began, `started` when this one did, `failures` how many
    /// of its tries failed before this one.
    pub fn request_failed(
        &self,
        backend: &str,
        error: IoError,
        first: std::time::Instant,
        started: std::time::Instant,
        failures: u32,
    ) -> io::Result<Next> {
        let b = self.backend_id(backend)?;
        let shared = self.shared();
        let (first, started) = (shared.instant(first), shared.instant(started));
        Ok(shared.enter(|core, _, now| {
            core.engine.request_failed(now, b, error, first, started, failures)
        }))
    }

    /// A request to `backend` begun at `started` still waits for its answer (a driver's
    /// report of a call that has waited a while): the backend's outage counts from then,
    /// or from its last answer if that came later (`ebb_core::outage::OutageClock::waiting`).
    pub fn request_waiting(&self, backend: &str, started: std::time::Instant) -> io::Result<()> {
        let b = self.backend_id(backend)?;
        let shared = self.shared();
        let started = shared.instant(started);
        shared.enter(|core, _, now| core.engine.request_waiting(now, b, started));
        Ok(())
    }

    /// Whether `backend` has been unreachable for its `retry_timeout_secs` (its IOs in
    /// flight counted from their issue): every request waiting on it, and every new one, is
    /// answered `EIO` until it answers again.
    pub fn backend_unreachable(&self, backend: &str) -> io::Result<bool> {
        let b = self.backend_id(backend)?;
        Ok(self.shared().enter(|core, _, now| core.engine.backend_unreachable(now, b)))
    }

    /// A request to `backend` succeeded: any outage of it is over, for its write-back too.
    /// Costs an atomic load unless the backend's clock runs.
    pub fn request_succeeded(&self, backend: &str) {
        let Ok(b) = self.backend_id(backend) else { return };
        let shared = self.shared();
        if !shared.backend_down(b) {
            return;
        }
        shared.enter(|core, _, now| core.engine.request_succeeded(now, b));
    }
}
