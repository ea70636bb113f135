//! Durability watermarks: which bytes of a file a crash would keep.
//!
//! A page is durable when the backend holds it so that a crash of the backend keeps it: it was
//! written by a stable write and the backend file was synced after that write completed
//! ([`Event::FileSynced`]), or written unstable and covered by a COMMIT whose verifier matched
//! (the server's own sync). A page dirty, held, under writeback or unstable is not durable,
//! whatever its past; a page this cache never wrote counts as the backend holds it.
//!
//! The engine keeps, per file, the page runs cleaned by stable writes and not yet synced, each
//! with the epoch of its completion. A driver about to sync a backend file takes a mark
//! ([`Engine::durable_mark`], which starts a new epoch) and reports the sync with it: every run
//! of an epoch up to the mark is then durable. Runs of one epoch that touch are merged, so a
//! stream keeps one run per sync.

use std::collections::VecDeque;
use std::ops::Range;

use super::{Engine, PageMaps};
use crate::ids::InodeId;

/// One file's runs written but not yet synced.
#[derive(Clone, Debug, Default)]
pub(crate) struct Durability {
    /// The epoch of completions now; a mark hands out the current one and starts the next.
    epoch: u64,
    /// `(epoch, first page, end page)`, oldest epoch first.
    unsynced: VecDeque<(u64, u64, u64)>,
}

impl Durability {
    /// Whether no stable write waits for a sync of the file.
    pub(crate) fn is_empty(&self) -> bool {
        self.unsynced.is_empty()
    }

    /// Pages `first..end` were cleaned by a stable write.
    pub(crate) fn cleaned(&mut self, first: u64, end: u64) {
        if let Some(last) = self.unsynced.back_mut()
            && last.0 == self.epoch
            && first <= last.2
            && end >= last.1
        {
            last.1 = last.1.min(first);
            last.2 = last.2.max(end);
            return;
        }
        self.unsynced.push_back((self.epoch, first, end));
    }
}

impl Engine {
    /// Before a driver syncs `inode`'s backend file: the mark to report with
    /// [`Event::FileSynced`](crate::Event::FileSynced) once the sync has succeeded. Writes completed before this call
    /// are durable then.
    pub fn durable_mark(&mut self, inode: InodeId) -> u64 {
        let Some(meta) = self.inodes.get_mut(&inode) else { return 0 };
        let mark = meta.durability.epoch;
        meta.durability.epoch += 1;
        mark
    }

    /// [`Event::FileSynced`]: the runs up to `mark` are durable, and a commit owed to the
    /// file may be paid (`recommit.rs`).
    pub(super) fn file_synced<M: PageMaps>(&mut self, inode: InodeId, mark: u64, maps: &mut M) {
        let Some(meta) = self.inodes.get_mut(&inode) else { return };
        let unsynced = &mut meta.durability.unsynced;
        while unsynced.front().is_some_and(|r| r.0 <= mark) {
            unsynced.pop_front();
        }
        self.file_sync_done(inode, Ok(()), maps);
    }

    /// The byte ranges of `inode`'s first `size` bytes that are durable (module doc), in order.
    pub fn durable_ranges<M: PageMaps>(
        &self,
        inode: InodeId,
        size: u64,
        maps: &mut M,
    ) -> Vec<Range<u64>> {
        let pages = size.div_ceil(crate::PAGE_SIZE);
        let mut not: Vec<(u64, u64)> = maps.with(inode, |m| {
            m.pages()
                .filter(|(i, p)| *i < pages && p.state != crate::PageState::Clean)
                .map(|(i, _)| (i, i + 1))
                .collect()
        });
        if let Some(meta) = self.inodes.get(&inode) {
            not.extend(meta.durability.unsynced.iter().map(|&(_, a, b)| (a, b.min(pages))));
        }
        not.sort_unstable();
        let mut out = Vec::new();
        let mut at = 0;
        for (a, b) in not {
            if a > at {
                out.push(at * crate::PAGE_SIZE..(a * crate::PAGE_SIZE).min(size));
            }
            at = at.max(b);
        }
        if at < pages {
            out.push(at * crate::PAGE_SIZE..size);
        }
        out
    }
}
