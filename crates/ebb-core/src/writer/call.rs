//! The writer protocol: the one sequence of calls every driver's writer makes, its inputs and
//! outputs. The engine's side is [`crate::Engine::writer_step`].
//!
//! ```text
//!          write_pages (page-map lock only: writer and one file's pages)
//!   ┌──────────▶ WriteStep ── needs_engine()? ──no──▶ Done
//!   │                 │ yes
//!   │                 ▼
//!   │   writer_step(Wrote { inode, step })  (engine: marks the file dirty, throttle check or
//!   │                 │                      wait for a page under writeback)
//!   │                 ▼
//!   │     ┌──── WriterNext ─────────────────────────────────────────────┐
//!   │   Done / Proceed      Sleep { until }         Wait { on }        Fail { error }
//!   │     │                    │                       │                  │
//!   └─────┘          sleep until `until`     wait for Action::Resume   the write fails
//!                              └──── writer_step(Continue) ─┘
//!                                  (engine: continues the call: Proceed, Sleep, Wait, Fail)
//! ```
//!
//! A driver only executes: it dirties pages with [`super::write_pages`] under the file's
//! page-map lock (copying its bytes into the frames there), hands the step to the engine when
//! [`WriteStep::needs_engine`] says so, sleeps or waits as told, continues with
//! [`WriterInput::Continue`], and writes on at `Done` or `Proceed` or fails the write at
//! `Fail`. Which engine function a step calls (`inode_dirtied`, `balance_dirty_pages`,
//! `wait_for_page`, `throttle_continue`) is the engine's business; no other crate calls them
//! (`crates/ebb-cli/tests/tidy.rs`).
//!
//! Locking: `write_pages` touches no shared state (docs/mechanisms.md, section 8), so a step
//! that does not need the engine never takes its lock; [`crate::Engine::writer_step`] runs
//! under the engine's lock and borrows page maps through [`crate::PageMaps`] as every entry
//! point does, so a driver keeps its lock order (the runtime: page-map lock released before
//! the engine lock is taken; the engine lock, then a page-map lock, inside).

use crate::event::IoError;
use crate::ids::InodeId;
use crate::time::{Duration, Instant};

use super::{NextStep, WriteStep};

/// What just happened to a writer: the input of [`crate::Engine::writer_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterInput {
    /// [`super::write_pages`] dirtied pages of `inode` and returned `step`.
    Wrote {
        /// The file written.
        inode: InodeId,
        /// What `write_pages` returned.
        step: WriteStep,
    },
    /// The sleep of a [`WriterNext::Sleep`] has ended (its `until` has passed), or the wait of
    /// a [`WriterNext::Wait`] has been answered ([`crate::Action::Resume`]): continue the call.
    Continue,
}

/// What a writer does next: the output of [`crate::Engine::writer_step`] (and of
/// [`crate::Engine::anon_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterNext {
    /// The step's pages are dirtied and no throttle call was due: the request is complete
    /// (`write_pages` stops short of it only for a check or a busy page).
    Done,
    /// A throttle call ended: write on at once (the rest of the request, or the next one).
    Proceed {
        /// Time spent in the call, from its first check to now (the kernel trace's `paused`).
        stalled: Duration,
        /// The call went past the freerun point (a throttling decision, even if it ended
        /// without a pause); false for checks that found the writer in freerun.
        throttled: bool,
    },
    /// Sleep until `until`, then step with [`WriterInput::Continue`].
    Sleep {
        /// Wake-up time.
        until: Instant,
    },
    /// Wait for [`crate::Action::Resume`] for this writer, then step with
    /// [`WriterInput::Continue`].
    Wait {
        /// What the writer waits for.
        on: WaitOn,
    },
    /// The write fails with `error`; the call has ended, and what the writer dirtied before
    /// stays cached: the cache is full of pages held by `error` (the backend is full or
    /// read-only) so no memory will come, or the writer's backend has been unreachable past
    /// its `retry_timeout_secs` (`error` is EIO).
    Fail {
        /// The errno the write fails with.
        error: IoError,
    },
}

/// What a waiting writer waits for (each ends with [`crate::Action::Resume`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOn {
    /// The writeback IO it issued itself (the legacy throttle policy).
    OwnWriteback,
    /// A page of `inode` under writeback, which it must change.
    Page {
        /// The file.
        inode: InodeId,
    },
    /// Free memory.
    Memory,
    /// Its turn to fill a write granule (the granule gate).
    Granule,
}

impl WriteStep {
    /// Whether the engine must hear of this step ([`WriterInput::Wrote`]): the file became
    /// dirty, a throttle check is due or a page is under writeback. When not, the step is
    /// [`WriterNext::Done`] and the writer writes on without touching anything shared.
    pub fn needs_engine(&self) -> bool {
        self.inode_became_dirty || self.next != NextStep::Done
    }
}
