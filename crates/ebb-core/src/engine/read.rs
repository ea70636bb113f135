//! Reads: cache misses, readahead, reads in flight shared by later readers, and their
//! completions.
//!
//! The backend-change rule: a page a read brings in is never installed if a change of its
//! range in the backend behind the cache (a punch, a zeroed range, a trimmed end: the driver's
//! [`Event::Invalidate`] .. [`Event::InvalidateDone`]) began after the read was issued or was
//! still going on when it was issued, since the read may hold the bytes from before the
//! change. Writes need no such rule: a written page is resident, and a read never replaces a
//! resident page (one evicted while the read was in flight is marked stale, `page_evicted`).

use std::collections::BTreeSet;

use super::{CoreBug, Counters, Engine, InodeMeta, IoKind, IoRecord, PageMaps, ReadState};
use crate::event::{Action, IoError, errno};
use crate::ids::{BackendId, FrameId, InodeId, IoId, RequestId};
use crate::pagemap::Run;

/// The first readahead window on a sequential read, in pages (16 KiB).
pub(crate) const READAHEAD_MIN_PAGES: u64 = 4;
/// The largest readahead window, in pages: the kernel's default `read_ahead_kb` of 128.
pub(crate) const READAHEAD_MAX_PAGES: u64 = 32;

impl Engine {
    pub(super) fn read_start<M: PageMaps>(
        &mut self,
        inode: InodeId,
        first: u64,
        pages: u64,
        request: RequestId,
        maps: &mut M,
    ) {
        let Some(meta) = self.inodes.get_mut(&inode) else {
            self.emit(Action::ReadDone { request, result: Err(IoError { errno: errno::EBADF }) });
            return;
        };
        let span = pages + readahead(meta, first, pages);
        let b = meta.backend;
        let wanted = Run { first, count: pages };
        let mut missing = Vec::new();
        maps.with(inode, |m| m.lookup(first, span, &mut missing));
        let mut waiting = BTreeSet::new();
        for run in missing {
            for gap in self.not_in_flight(inode, run, wanted, &mut waiting) {
                let Some(io) = self.issue_read(b, inode, gap, maps) else { continue };
                if gap.first < wanted.end() {
                    waiting.insert(io);
                }
            }
        }
        if waiting.is_empty() {
            self.emit(Action::ReadDone { request, result: Ok(()) });
        } else {
            self.reads.insert(request, ReadState { waiting, error: None });
        }
    }

    /// The parts of `run` no read in flight covers; the reads in flight over pages of the
    /// request (`wanted`) join `waiting`, so nothing is read twice.
    fn not_in_flight(
        &self,
        inode: InodeId,
        run: Run,
        wanted: Run,
        waiting: &mut BTreeSet<IoId>,
    ) -> Vec<Run> {
        let mut cursor = run.first;
        let mut gaps = Vec::new();
        let in_flight = self.inodes[&inode].reading.range(..run.end());
        for (&f, &(e, io)) in in_flight.filter(|(_, (e, _))| *e > run.first) {
            if f > cursor {
                gaps.push(Run { first: cursor, count: f - cursor });
            }
            if f < wanted.end() && e > wanted.first {
                waiting.insert(io);
            }
            cursor = cursor.max(e);
        }
        if cursor < run.end() {
            gaps.push(Run { first: cursor, count: run.end() - cursor });
        }
        gaps
    }

    /// Reads `gap` of `inode` into new frames (as many as can be had, from its start); `None`
    /// if not one frame could be had.
    fn issue_read<M: PageMaps>(
        &mut self,
        b: BackendId,
        inode: InodeId,
        gap: Run,
        maps: &mut M,
    ) -> Option<IoId> {
        let mut frames = Vec::new();
        self.alloc_frames(gap.count as usize, &mut frames, maps);
        if frames.is_empty() {
            return None;
        }
        let gap = Run { first: gap.first, count: frames.len() as u64 };
        let io = self.new_io();
        let mut stale = Vec::new();
        if !self.planted(CoreBug::StaleRead) {
            for &changing in &self.inodes[&inode].invalidating {
                stale.extend(overlap(gap, changing));
            }
        }
        let kind = IoKind::Read { run: gap, frames, keep_below: u64::MAX, stale };
        self.ios.insert(io, IoRecord { backend: b, inode, kind, issued: self.now });
        self.inode_mut(inode).reading.insert(gap.first, (gap.end(), io));
        self.wbs[b.index()].inflight += 1;
        self.wbs[b.index()].wbt.on_read_issue(self.now, io.0);
        self.stats.reads += 1;
        self.stats.read_pages += gap.count;
        self.emit(Action::Read { io, backend: b, inode, first_page: gap.first, pages: gap.count });
        Some(io)
    }

    /// [`Event::Invalidate`]: the reads in flight over `range` keep none of its pages, nor
    /// do reads issued until [`Engine::invalidate_done`] of it (module doc).
    pub(super) fn invalidate(&mut self, inode: InodeId, range: Run) {
        if self.planted(CoreBug::StaleRead) {
            return;
        }
        let Some(meta) = self.inodes.get_mut(&inode) else { return };
        meta.invalidating.push(range);
        let reads: Vec<IoId> = meta
            .reading
            .range(..range.first.saturating_add(range.count))
            .filter(|&(_, &(end, _))| end > range.first)
            .map(|(_, &(_, io))| io)
            .collect();
        for io in reads {
            if let Some(IoRecord { kind: IoKind::Read { run, stale, .. }, .. }) =
                self.ios.get_mut(&io)
            {
                stale.extend(overlap(*run, range));
            }
        }
    }

    /// [`Event::InvalidateDone`]: the change of `range` announced by [`Engine::invalidate`] is
    /// in the backend; reads issued from now on read it.
    pub(super) fn invalidate_done(&mut self, inode: InodeId, range: Run) {
        let Some(meta) = self.inodes.get_mut(&inode) else { return };
        if let Some(at) = meta.invalidating.iter().position(|&r| r == range) {
            meta.invalidating.swap_remove(at);
        }
    }

    /// [`Event::BackendChanged`]: the file's clean pages leave the cache and the reads in
    /// flight keep none of theirs (they may hold the bytes from before the change); pages the
    /// backend lacks stay. Reads issued from now on read the changed file.
    pub(super) fn backend_changed<M: PageMaps>(&mut self, inode: InodeId, maps: &mut M) {
        let Some(meta) = self.inodes.get(&inode) else { return };
        let reads: Vec<IoId> = meta.reading.values().map(|&(_, io)| io).collect();
        for io in reads {
            if let Some(IoRecord { kind: IoKind::Read { run, stale, .. }, .. }) =
                self.ios.get_mut(&io)
            {
                stale.extend(run.first..run.end());
            }
        }
        let clean: Vec<u64> = maps.with(inode, |m| {
            m.pages().filter(|(_, p)| p.state == crate::PageState::Clean).map(|(i, _)| i).collect()
        });
        for index in clean {
            // A writer may have dirtied it since (under the page map's lock alone): it stays.
            let Some(frame) = maps.with(inode, |m| m.evict(index)) else { continue };
            self.mem.unlink(frame);
            self.mem.release(frame);
            self.account(inode, Counters { resident: -1, ..Counters::default() });
        }
    }

    pub(super) fn read_done<M: PageMaps>(
        &mut self,
        io: IoId,
        result: Result<(), IoError>,
        maps: &mut M,
    ) {
        let record =
            self.ios.remove(&io).unwrap_or_else(|| panic!("completion of unknown io {io}"));
        let IoKind::Read { run, mut frames, keep_below, stale } = record.kind else {
            panic!("io {io} is not a read")
        };
        let (b, inode) = (record.backend, record.inode);
        self.wbs[b.index()].inflight -= 1;
        if result.map_or_else(crate::outage::is_answer, |()| true) {
            // The backend answered: any outage is over (a read is an IO it counts in flight).
            self.backend_reached(b);
        }
        let latency = self.now.saturating_since(record.issued);
        self.wbs[b.index()].wbt.on_read_done(self.now, latency, Some(io.0));
        // Pages a truncate dropped while the read was in flight hold stale bytes.
        let fresh = keep_below.saturating_sub(run.first).min(frames.len() as u64) as usize;
        let mut unused = frames.split_off(fresh);
        if result.is_ok() {
            unused.extend(self.insert_read(inode, run.first, &frames, stale, maps));
        } else {
            unused.extend(frames);
        }
        for frame in unused {
            self.mem.release(frame);
        }
        if let Some(meta) = self.inodes.get_mut(&inode) {
            meta.reading.remove(&run.first);
        }
        self.answer_reads(io, result);
        self.wake_memory_waiters(maps);
    }

    /// Inserts the pages a read from `first` brought into `frames`, as clean pages, in the
    /// runs between stale pages (evicted while it was in flight, `stale`); returns the frames
    /// not used (a stale page's, or one whose page is resident again).
    fn insert_read<M: PageMaps>(
        &mut self,
        inode: InodeId,
        first: u64,
        frames: &[FrameId],
        mut stale: Vec<u64>,
        maps: &mut M,
    ) -> Vec<FrameId> {
        let fresh = frames.len();
        stale.sort_unstable();
        stale.dedup();
        let mut inserted = Vec::new();
        let mut unused = Vec::new();
        let mut start = 0usize;
        let cuts: Vec<usize> = stale
            .iter()
            .filter(|&&p| p >= first)
            .map(|&p| (p - first) as usize)
            .filter(|&c| c < fresh)
            .chain(std::iter::once(fresh))
            .collect();
        for cut in cuts {
            let segment_first = first + start as u64;
            let segment = &frames[start..cut];
            let (ins, rest) = maps.with(inode, |m| m.insert_clean(segment_first, segment));
            inserted.extend(ins);
            unused.extend(rest);
            if cut < fresh {
                unused.push(frames[cut]);
            }
            start = cut + 1;
        }
        let n = inserted.len() as i64;
        for (frame, index) in inserted {
            self.mem.add_to_lru(frame, inode, index);
        }
        self.account(inode, Counters { resident: n, ..Counters::default() });
        unused
    }

    /// Answers the requests that waited for read `io` and nothing else (with its error, if it
    /// failed).
    fn answer_reads(&mut self, io: IoId, result: Result<(), IoError>) {
        let done: Vec<RequestId> = self
            .reads
            .iter_mut()
            .filter_map(|(&req, r)| {
                if !r.waiting.remove(&io) {
                    return None;
                }
                if let Err(e) = result {
                    r.error = Some(e);
                }
                r.waiting.is_empty().then_some(req)
            })
            .collect();
        for request in done {
            let state = self.reads.remove(&request).expect("read");
            self.emit(Action::ReadDone { request, result: state.error.map_or(Ok(()), Err) });
        }
    }
}

/// The pages of `read` inside `range`.
fn overlap(read: Run, range: Run) -> std::ops::Range<u64> {
    let end = range.first.saturating_add(range.count).min(read.end());
    read.first.max(range.first)..end.max(read.first.max(range.first))
}

/// Readahead (the kernel's on-demand readahead, simplified): on sequential reads keep a
/// window, doubling up to `READAHEAD_MAX_PAGES`, in flight beyond the request, so the next read
/// usually finds its pages resident or on their way; a seek resets it. Returns the window for
/// a read of `pages` pages from `first`.
fn readahead(meta: &mut InodeMeta, first: u64, pages: u64) -> u64 {
    let sequential = meta.last_read_end == first;
    meta.readahead = if sequential {
        (meta.readahead * 2).clamp(READAHEAD_MIN_PAGES, READAHEAD_MAX_PAGES)
    } else {
        0
    };
    meta.last_read_end = first + pages;
    meta.readahead
}
