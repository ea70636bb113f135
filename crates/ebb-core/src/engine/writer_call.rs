//! The engine's side of the writer protocol (`crate::writer::call`): one step function that
//! turns what just happened to a writer into the engine calls it needs and the writer's next
//! move.

use crate::engine::{Engine, PageMaps, WaitReason};
use crate::event::{IoError, Verdict, errno};
use crate::ids::InodeId;
use crate::time::Instant;
use crate::writer::{CallState, NextStep, WaitOn, Writer, WriterInput, WriterNext, write_pages};

impl Engine {
    /// One step of a writer's write call (the writer protocol, `ebb_core::writer::call`):
    /// `input` says what just happened (pages dirtied by `write_pages`, a sleep ended or a
    /// wait answered), the result what the writer does next. A [`WriterInput::Wrote`] step
    /// that does not [`need the engine`](crate::WriteStep::needs_engine) is
    /// [`WriterNext::Done`] and touches nothing.
    pub fn writer_step<M: PageMaps>(
        &mut self,
        now: Instant,
        w: &mut Writer,
        input: WriterInput,
        maps: &mut M,
    ) -> WriterNext {
        let verdict = match input {
            WriterInput::Wrote { step, .. } if !step.needs_engine() => return WriterNext::Done,
            WriterInput::Wrote { inode, step } => {
                if step.inode_became_dirty {
                    self.inode_dirtied(now, inode);
                }
                match step.next {
                    NextStep::Done => return WriterNext::Done,
                    NextStep::Check => self.balance_dirty_pages(now, w, maps),
                    NextStep::Busy(page) => self.wait_for_page(now, w, inode, page, maps),
                }
            }
            WriterInput::Continue => self.throttle_continue(now, w, maps),
        };
        let verdict = self.fail_wait_past_outage(w, verdict);
        self.writer_next(w, verdict)
    }

    /// A writer that would wait (for memory, a page under writeback, a place in the granule
    /// gate, its own writeback) while its backend is past its outage deadline fails with `EIO`
    /// instead, as one that would pause does (`Engine::finish_verdict`): what it waits for
    /// comes only when the server answers, and a server that accepts and never answers held
    /// it until the client's own timeout (a throttled writer over NFS and S3 waited 20 s
    /// and more past a 3 s deadline). The pages it wrote stay in the cache.
    fn fail_wait_past_outage(&mut self, w: &mut Writer, verdict: Verdict) -> Verdict {
        if !matches!(verdict, Verdict::Wait) {
            return verdict;
        }
        let backend = w.last_inode.and_then(|inode| self.inodes.get(&inode)).map(|m| m.backend);
        if !backend.is_some_and(|b| self.wbs[b.index()].outage_reported) {
            return verdict;
        }
        // Every queue of waiters (the granule gate's, a page's) skips one no longer waiting.
        if self.waiters.remove(&w.id) == Some(WaitReason::Memory) {
            self.reclaim_forget(w.id);
        }
        w.call = CallState::Idle;
        w.total_stalled += self.now.saturating_since(w.call_start);
        self.stats.writes_failed += 1;
        Verdict::Fail { error: IoError { errno: errno::EIO } }
    }

    /// Dirties pages `[first, first + count)` of `inode` for `w` ([`write_pages`], on the map
    /// `maps` lends) and takes the step ([`Engine::writer_step`]): the pages dirtied, from
    /// `first`, and the writer's next move. For a driver that owns its page maps in one
    /// thread (the simulator, tests); the runtime dirties under the file's page-map lock
    /// alone and enters the engine only when the step needs it.
    pub fn writer_write<M: PageMaps>(
        &mut self,
        now: Instant,
        w: &mut Writer,
        inode: InodeId,
        (first, count): (u64, u64),
        maps: &mut M,
    ) -> (u64, WriterNext) {
        let step = maps.with(inode, |m| write_pages(w, inode, m, first, count));
        (step.consumed, self.writer_step(now, w, WriterInput::Wrote { inode, step }, maps))
    }

    /// A throttle verdict as the writer's next move: a wait says what it waits for.
    pub(crate) fn writer_next(&self, w: &Writer, verdict: Verdict) -> WriterNext {
        match verdict {
            Verdict::Proceed { stalled, throttled } => WriterNext::Proceed { stalled, throttled },
            Verdict::Sleep { until } => WriterNext::Sleep { until },
            Verdict::Wait => WriterNext::Wait {
                on: match self.waiters.get(&w.id) {
                    Some(WaitReason::OwnWriteback) => WaitOn::OwnWriteback,
                    Some(&WaitReason::Page(inode)) => WaitOn::Page { inode },
                    Some(WaitReason::Granule) => WaitOn::Granule,
                    // Every wait registers its reason; none left means the call's own work
                    // answered it already (its `Resume` is among the actions), as the reclaim
                    // a memory wait starts can.
                    Some(WaitReason::Memory) | None => WaitOn::Memory,
                },
            },
            Verdict::Fail { error } => WriterNext::Fail { error },
        }
    }
}
