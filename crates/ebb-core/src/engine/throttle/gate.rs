//! The granule gate (ebb's own, for backends with write granules such as S3 multipart parts):
//! how many files may be filling a granule at once, so that a small cache with many
//! sequential writers writes every part once, whole.
//!
//! # Goal
//! A part can only be replaced whole, so a file's last granule waits in the cache until it
//! fills (`crate::flusher::granules`). With more writers than granules fit in the cache, the
//! kernel's fair throttle lets all of them advance together: no granule ever fills, the tails
//! are written short, and every later write into a short part costs the backend a commit and
//! a copy (measured through S3, 64 writers of 32 MiB in a 256 MiB mount: 526 completed
//! uploads and 715 part copies for 64 objects, 2.0 bytes uploaded per byte written). The gate
//! lets a bounded set of files fill their granules while the other writers wait their turn.
//!
//! # Signals
//! The writer's file and that file's last dirty page (its tail), at each throttle check; the
//! granule size; the global background threshold; when each admitted file was last dirtied.
//!
//! # Control law
//! ```text
//! slots      = max(1, bg_thresh / 2 / granule)   (the tails of the admitted files fit in half
//!              the background threshold, as `tail_budget` requires of deferred tails)
//! check of a writer of file F on a granular backend:
//!   F admitted, turn not used up, or nobody waits
//!                                  -> go on; the next check is due at the end of the granule
//!                                     the writer's next page falls in (it stops there)
//!   F admitted, others wait, turn used up at a granule's end (or a granule past its end)
//!                                  -> F leaves; the writer waits at the end of the queue
//!   F not admitted, a slot free, nobody waits
//!                                  -> admit F (a turn starts)
//!   otherwise                      -> the writer waits (first come, first served)
//! turn       = pages dirtied in F since its turn began; used up at TURN_GRANULES granules
//! F leaves   : its turn ends at a check, it is closed with no dirty page left, it is gone,
//!              its writer exits, or nobody dirtied it for GATE_IDLE while others wait
//! a place frees -> the longest-waiting writers are admitted and resumed
//! ```
//! A writer that reaches its granule's end with its turn used up leaves a whole granule
//! behind, which writeback takes in one write. Admitted files' tails wait for their granule
//! to fill (`Engine::tail_budget`); the others' tails are small (what a writer dirtied before
//! its first check) and follow the usual tail rule.
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | TURN_GRANULES | 1 | granules | ebb: the smallest turn that leaves no part short |
//! | GATE_IDLE | 1 s | s | ebb: a file whose writer stopped (or went elsewhere) gives up its place |
//!
//! # Insufficient data
//! No estimate is involved. While the files being written fit the slots nobody waits: the
//! gate costs one map lookup per throttle check of a granular backend's writer.

use std::collections::{BTreeMap, VecDeque};

use crate::engine::{Engine, PageMaps, WaitReason};
use crate::event::{Action, Verdict};
use crate::ids::{InodeId, WriterId};
use crate::time::{Duration, Instant};
use crate::writer::{CallState, Writer};

/// Granules a file may start in one turn while others wait.
pub(crate) const TURN_GRANULES: u64 = 1;
/// How long an admitted file may go undirtied before it gives up its place to a waiter.
pub(crate) const GATE_IDLE: Duration = Duration::from_secs(1);

/// An admitted file's current turn.
#[derive(Debug, Clone, Copy)]
struct Turn {
    /// Pages dirtied in it.
    pages: u64,
    /// When it began: a file admitted after a wait counts as active from then.
    since: Instant,
    /// The end of the granule its writer is filling (where it stops next), 0 before the
    /// writer's first check in this turn.
    filling: u64,
}

/// The admitted files and the writers waiting for a place.
#[derive(Debug, Default)]
pub(crate) struct GranuleGate {
    /// Admitted files.
    admitted: BTreeMap<InodeId, Turn>,
    /// Waiting writers with the file each wants to write, oldest first.
    queue: VecDeque<(WriterId, InodeId)>,
}

impl GranuleGate {
    /// If `inode` is admitted, the end of the granule its writer is filling (0: not known
    /// yet): the file's tail, and that granule, wait for the writer.
    pub(crate) fn filling(&self, inode: InodeId) -> Option<u64> {
        self.admitted.get(&inode).map(|turn| turn.filling)
    }

    /// How many files are admitted.
    pub(crate) fn admitted_count(&self) -> usize {
        self.admitted.len()
    }

    /// Whether writers wait for a place.
    pub(crate) fn saturated(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Writer `w` leaves: it no longer waits, and while others wait the file it wrote last
    /// gives up its place (another writer of it takes one again at its next check).
    pub(crate) fn forget(&mut self, w: WriterId, last: Option<InodeId>) {
        self.queue.retain(|&(waiting, _)| waiting != w);
        if let Some(inode) = last
            && self.saturated()
        {
            self.admitted.remove(&inode);
        }
    }
}

impl Engine {
    /// The gate's part of a throttle check (module doc): `Some(Wait)` when the writer waits
    /// for a place, `None` when the check goes on as usual. Call it after the writer's batch
    /// is folded in (`apply_pending` counts the admitted files' pages).
    pub(crate) fn granule_gate<M: PageMaps>(
        &mut self,
        w: &mut Writer,
        maps: &mut M,
    ) -> Option<Verdict> {
        w.granule_stop = None;
        let at_boundary = std::mem::take(&mut w.at_stop);
        let inode = w.last_inode?;
        let b = self.inodes.get(&inode)?.backend;
        let backend = &self.cfg.backends[b.index()];
        backend.write_granule_bytes?;
        // Where the writer is: the granule it filled last, and where it stops next: the end
        // of that granule, or, once it stood at that end, the end of the next one. (A check
        // for another reason just before the end leaves the stop at the end, so the turn ends
        // there and not a granule later, mid-granule.)
        let last = w.last_page?;
        let tail = backend.granule_of(last)?;
        let stop = if at_boundary { backend.granule_of(last + 1)?.end } else { tail.end };
        let granule = tail.end - tail.start;
        self.gate_sweep(maps);
        if at_boundary && self.whole_granules_dirty(b) && !self.writeback_in_progress(b) {
            // The writer just filled a granule: write it behind (`whole_granules_dirty`).
            self.wake_flusher(b);
        }
        let slots = self.gate_slots();
        let gate = &mut self.gate;
        let now = self.now;
        if let Some(turn) = gate.admitted.get(&inode).map(|t| t.pages) {
            let used = turn >= TURN_GRANULES * granule;
            // A sequential writer leaves at a granule's end; one that never reaches an end
            // (random writes) after a granule more.
            let leaves = gate.saturated()
                && ((at_boundary && used) || turn >= (TURN_GRANULES + 1) * granule);
            if !leaves {
                let turn = gate.admitted.get_mut(&inode).expect("admitted");
                if used && at_boundary {
                    *turn = Turn { pages: 0, since: now, filling: stop };
                }
                turn.filling = stop;
                w.granule_stop = Some((inode, stop));
                return None;
            }
            gate.admitted.remove(&inode);
        } else if gate.admitted.len() < slots && !gate.saturated() {
            gate.admitted.insert(inode, Turn { pages: 0, since: now, filling: stop });
            w.granule_stop = Some((inode, stop));
            return None;
        }
        // As a check that goes on would, start background writeback if it is due.
        let g = self.read_global();
        if g.reclaimable > g.bg_thresh && !self.writeback_in_progress(b) {
            self.wake_flusher(b);
        }
        w.call = CallState::Blocked;
        w.call_start = self.now;
        // The wait pays for the pages dirtied since the last check, as a pause would.
        w.nr_dirtied = 0;
        self.waiters.insert(w.id, WaitReason::Granule);
        self.gate.queue.push_back((w.id, inode));
        self.stats.granule_gate_waits += 1;
        // The turn that just ended may have freed a place for an older waiter.
        self.gate_admit();
        Some(Verdict::Wait)
    }

    /// Writer `w` exits (its batch folded in): it leaves the gate, and, as a check would,
    /// starts background writeback if it is due. Its last pages may have crossed the
    /// threshold after its last check, which the gate's waits make more likely: the flusher
    /// is woken by checks only.
    pub(crate) fn gate_writer_exit<M: PageMaps>(&mut self, w: &Writer, maps: &mut M) {
        self.gate.forget(w.id, w.last_inode);
        let granular = w.last_inode.and_then(|inode| self.inodes.get(&inode)).map(|meta| {
            (meta.backend, self.cfg.backends[meta.backend.index()].write_granule_bytes.is_some())
        });
        if let Some((b, true)) = granular {
            let g = self.read_global();
            if g.reclaimable > g.bg_thresh && !self.writeback_in_progress(b) {
                self.wake_flusher(b);
            }
        }
        self.gate_sweep(maps);
    }

    /// Pages a writer's batch dirtied in `inode`, folded in: an admitted file's turn.
    pub(crate) fn gate_dirtied(&mut self, inode: InodeId, pages: u64) {
        if let Some(turn) = self.gate.admitted.get_mut(&inode) {
            turn.pages += pages;
        }
    }

    /// Admitted files that no longer fill a granule leave (module doc); then waiters take the
    /// free places. Cheap while nobody waits.
    pub(crate) fn gate_sweep<M: PageMaps>(&mut self, maps: &mut M) {
        if !self.gate.saturated() {
            return;
        }
        let now = self.now;
        let leaving: Vec<InodeId> = self
            .gate
            .admitted
            .iter()
            .filter(|&(&inode, turn)| match self.inodes.get(&inode) {
                None => true,
                Some(meta) => {
                    meta.last_dirtied.max(turn.since) + GATE_IDLE <= now
                        || (meta.handles == 0 && maps.with(inode, |m| m.last_dirty()).is_none())
                }
            })
            .map(|(&inode, _)| inode)
            .collect();
        for inode in leaving {
            self.gate.admitted.remove(&inode);
        }
        self.gate_admit();
    }

    /// Admits the longest-waiting writers while places are free and resumes them.
    fn gate_admit(&mut self) {
        let slots = self.gate_slots();
        while self.gate.admitted.len() < slots {
            let Some((w, inode)) = self.gate.queue.pop_front() else { break };
            if self.waiters.get(&w) != Some(&WaitReason::Granule) {
                continue;
            }
            self.waiters.remove(&w);
            let now = self.now;
            self.gate.admitted.entry(inode).or_insert(Turn { pages: 0, since: now, filling: 0 });
            self.emit(Action::Resume { writer: w });
        }
    }

    /// The places, from the smallest granule of the granular backends.
    fn gate_slots(&self) -> usize {
        let granule = self
            .cfg
            .backends
            .iter()
            .filter_map(|b| b.write_granule_bytes)
            .min()
            .map_or(1, |bytes| (bytes / crate::config::PAGE_SIZE).max(1));
        (self.global_thresholds().bg_thresh / 2 / granule).max(1) as usize
    }

    /// When an admitted file would leave for being idle, while writers wait.
    pub(crate) fn gate_timer(&self) -> Option<Instant> {
        if !self.gate.saturated() {
            return None;
        }
        self.gate
            .admitted
            .iter()
            .filter_map(|(inode, turn)| Some(self.inodes.get(inode)?.last_dirtied.max(turn.since)))
            .map(|active| active + GATE_IDLE)
            .min()
    }
}
