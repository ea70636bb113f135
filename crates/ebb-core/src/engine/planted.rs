//! Bugs the fault swarm's tests plant in the engine, to show its checkers find each within
//! the CI seed budget (ebb-sim's `tests/it/swarm.rs`). They are compiled in only with the
//! `planted-bugs` feature, which only ebb-sim's tests enable: without it [`Engine::plant`]
//! refuses and every hook is a constant `false` the compiler removes.

use super::Engine;

/// A bug to plant in the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreBug {
    /// A write that fails with a hold-class error (ENOSPC, EROFS) holds its pages but skips
    /// the `held` counter update: the accounting check finds the counters off a recount.
    SkipHeldCount,
    /// A write that fails with a hold-class error frees its pages as if written: data the
    /// device never stored is dropped from the cache.
    DropHeldPage,
    /// A stable write's pages are not recorded as waiting for a sync of their file: the
    /// durability watermarks call them durable while they sit in a volatile write cache.
    ForgetUnsyncedRun,
    /// The backend-change rule of reads is off ([`crate::Event::Invalidate`] does nothing): a
    /// read in flight across a punch, zeroed range or truncate installs the bytes from before.
    StaleRead,
}

impl Engine {
    /// Plants `bug` for the rest of this engine's life. Returns false, planting nothing, when
    /// ebb-core was built without the `planted-bugs` feature.
    pub fn plant(&mut self, bug: CoreBug) -> bool {
        if cfg!(feature = "planted-bugs") {
            self.planted = Some(bug);
            return true;
        }
        false
    }

    /// Whether `bug` is planted (always false without the feature).
    pub(super) fn planted(&self, bug: CoreBug) -> bool {
        cfg!(feature = "planted-bugs") && self.planted == Some(bug)
    }
}
