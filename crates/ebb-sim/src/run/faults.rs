//! Faults the environment injects into a run (never the engine): windows per backend in which
//! writes or reads fail with an errno, or completions arrive late.
//!
//! A fault is data in [`RunSpec::faults`](super::RunSpec); the run loop asks this module what
//! holds at the time of each completion (`io.rs`, `Sim::device_events`). To add a kind of
//! fault, add its fields or variant here, answer it in a query like [`write_errno`], and apply
//! the answer where the run loop handles the completion or event it changes.

use ebb_core::Duration;

/// A fault window on `backend` over `[from, until)` (`until: None` = forever), whatever the
/// device did: writes that complete in it fail with `errno` unless it is 0, reads the engine
/// asked for fail with `read_errno` unless it is 0, and every
/// completion of a write, read or COMMIT in it reaches the engine `delay` later (a latency
/// spike: a stalled controller, a network partition that heals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Backend index.
    pub backend: usize,
    /// The errno writes fail with (5 EIO, 28 ENOSPC, 30 EROFS, ...); 0: they succeed.
    pub errno: i32,
    /// The errno the engine's reads (cache misses, readahead) fail with; 0: they succeed.
    pub read_errno: i32,
    /// Start of the window.
    pub from: Duration,
    /// End of the window, if it ends.
    pub until: Option<Duration>,
    /// Extra latency of completions in the window.
    pub delay: Duration,
}

impl Fault {
    /// Whether the window covers virtual time `t` on backend `backend`.
    pub fn covers(&self, backend: usize, t: Duration) -> bool {
        self.backend == backend && self.from <= t && self.until.is_none_or(|until| t < until)
    }
}

/// The errno writes completing at `t` on `backend` fail with, if any.
pub(super) fn write_errno(faults: &[Fault], backend: usize, t: Duration) -> Option<i32> {
    faults.iter().filter(|f| f.covers(backend, t)).map(|f| f.errno).find(|&errno| errno != 0)
}

/// The errno reads completing at `t` on `backend` fail with, if any.
pub(super) fn read_errno(faults: &[Fault], backend: usize, t: Duration) -> Option<i32> {
    faults.iter().filter(|f| f.covers(backend, t)).map(|f| f.read_errno).find(|&errno| errno != 0)
}

/// The extra latency of completions at `t` on `backend`: the longest spike covering it.
pub(super) fn completion_delay(faults: &[Fault], backend: usize, t: Duration) -> Duration {
    faults.iter().filter(|f| f.covers(backend, t)).map(|f| f.delay).max().unwrap_or(Duration::ZERO)
}
