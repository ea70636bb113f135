//! The accounting check: the engine's counters against a recount of the page maps, and the
//! frames against the memory budget. The simulator runs it after every event, the runtime's
//! swarm at the end of each seed (`Ebb::check_accounting`), the core's test drivers as they go.

use super::{Counters, Engine, IoKind, MapStore};
use crate::ids::InodeId;
use crate::pagemap::PageMap;
use crate::writer::Writer;

/// The page counts [`Engine::check_accounting`] compares, in its order.
const COUNTED: [&str; 5] = ["dirty", "writeback", "unstable", "resident", "held"];

impl Engine {
    /// Verifies that the counters agree with the page maps, given every writer's pending
    /// batch: per backend and in total, dirty, writeback, unstable and resident pages match a
    /// recount, nothing is negative, and `clean + dirty + writeback + unstable = resident`.
    /// Also checks the frame budget. For tests and the simulator's checkers (O(pages)).
    pub fn check_accounting(&self, maps: &MapStore, writers: &[&Writer]) -> Result<(), String> {
        self.check_accounting_of(maps.iter(), writers)
    }

    /// [`Engine::check_accounting`] over page maps a driver keeps its own way (the runtime keeps
    /// each behind its file's lock): every map the engine may have lent pages to, by inode.
    pub fn check_accounting_of<'a>(
        &self,
        maps: impl IntoIterator<Item = (InodeId, &'a PageMap)>,
        writers: &[&Writer],
    ) -> Result<(), String> {
        let (per_backend, total) = self.recount(maps)?;
        let pending = self.pending_counts(writers);
        self.check_counters(&per_backend, &total, &pending)?;
        self.check_frames(total[3] as u64, writers)
    }

    /// Every page map recounted, checked against its own counts, and summed per backend and in
    /// total, in the order of [`COUNTED`].
    fn recount<'a>(
        &self,
        maps: impl IntoIterator<Item = (InodeId, &'a PageMap)>,
    ) -> Result<(Vec<[i64; 5]>, [i64; 5]), String> {
        let mut per_backend = vec![[0i64; 5]; self.wbs.len()];
        let mut total = [0i64; 5];
        for (inode, map) in maps {
            let c = map.recount();
            if c != map.counts() {
                return Err(format!(
                    "inode {inode}: counts {:?} but recount {:?}",
                    map.counts(),
                    c
                ));
            }
            if c.clean + c.dirty + c.writeback + c.unstable != c.resident {
                return Err(format!("inode {inode}: states do not add up: {c:?}"));
            }
            let Some(meta) = self.inodes.get(&inode) else {
                if c.resident > 0 {
                    return Err(format!("inode {inode} has pages but was never opened"));
                }
                continue;
            };
            let v = [
                c.dirty as i64,
                c.writeback as i64,
                c.unstable as i64,
                c.resident as i64,
                c.held as i64,
            ];
            for k in 0..5 {
                per_backend[meta.backend.index()][k] += v[k];
                total[k] += v[k];
            }
        }
        Ok((per_backend, total))
    }

    /// The writers' pending batches per backend: dirtying not yet folded into the counters.
    fn pending_counts(&self, writers: &[&Writer]) -> Vec<[i64; 5]> {
        let mut pending = vec![[0i64; 5]; self.wbs.len()];
        for w in writers {
            for p in &w.pending {
                let b = self.inodes[&p.inode].backend.index();
                pending[b][0] += p.dirtied as i64;
                pending[b][2] -= p.from_unstable as i64;
                pending[b][3] += p.new_pages as i64;
                pending[b][4] -= p.unheld as i64;
            }
        }
        pending
    }

    /// Each backend's counters and the global ones, plus what is pending, against the pages.
    fn check_counters(
        &self,
        per_backend: &[[i64; 5]],
        total: &[i64; 5],
        pending: &[[i64; 5]],
    ) -> Result<(), String> {
        let values = |c: &Counters| [c.dirty, c.writeback, c.unstable, c.resident, c.held];
        for (b, wb) in self.wbs.iter().enumerate() {
            let have = values(&wb.counters);
            for k in 0..5 {
                let exact = have[k] + pending[b][k];
                if exact != per_backend[b][k] {
                    return Err(format!(
                        "backend {b}: {} counter {} + pending {} != pages {}",
                        COUNTED[k], have[k], pending[b][k], per_backend[b][k]
                    ));
                }
                if exact < 0 {
                    return Err(format!("backend {b}: {} is negative", COUNTED[k]));
                }
            }
        }
        let g = values(&self.global);
        for k in 0..5 {
            let pending_total: i64 = pending.iter().map(|p| p[k]).sum();
            if g[k] + pending_total != total[k] {
                return Err(format!(
                    "global {} counter {} + pending {} != pages {}",
                    COUNTED[k], g[k], pending_total, total[k]
                ));
            }
        }
        Ok(())
    }

    /// Frames: the allocated ones are the `resident` pages', the writers' reserves and the
    /// reads' in flight, and they and anonymous memory fit in the budget.
    fn check_frames(&self, resident: u64, writers: &[&Writer]) -> Result<(), String> {
        let reserved: u64 = writers.iter().map(|w| w.frames.len() as u64).sum();
        let read_frames: u64 = self
            .ios
            .values()
            .map(
                |r| if let IoKind::Read { frames, .. } = &r.kind { frames.len() as u64 } else { 0 },
            )
            .sum();
        if self.mem.allocated() != resident + reserved + read_frames {
            return Err(format!(
                "frames: allocated {} != resident {resident} + reserved {reserved} + reading {read_frames}",
                self.mem.allocated()
            ));
        }
        if self.mem.allocated() > self.mem.total()
            || (self.mem.allocated() + self.mem.anon() + self.mem.files() > self.mem.total()
                && !self.mem.overcommitted())
        {
            return Err(format!(
                "memory budget exceeded: {} frames + {} anonymous + {} file state > {}",
                self.mem.allocated(),
                self.mem.anon(),
                self.mem.files(),
                self.mem.total()
            ));
        }
        Ok(())
    }
}
