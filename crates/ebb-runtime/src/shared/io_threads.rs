//! The IO threads' work for the engine's `Write` and `Read` actions: a write's pages sent to
//! the backend straight from their frames when it can take them so (a whole S3 part), else
//! copied out into a buffer of the pool (sent whole, as a whole unit filled in place when the
//! backend writes units such as S3 parts, or through the file's lane when the backend runs one
//! file's writes one at a time), then the logical size restored; a
//! read's pieces read into a pool buffer and copied into the frames the engine assigned.

use std::sync::atomic::Ordering;

use ebb_backend::{AlignedBuf, WriteSource};
use ebb_core::{Event, FrameId, InodeId, IoError, IoId, PAGE_SIZE, Stability};

use super::{FileState, Job, PAGE, Shared, to_io_error};

/// A write's pages in their frames (`None`: a hole, zeros), copied out as the backend reads
/// them. The frames stay the write's until it completes: a page under writeback is not
/// dirtied again, and a truncated one is freed only when its write ends (see `crate::frames`).
struct FrameSource<'a> {
    pool: &'a crate::frames::FramePool,
    pages: &'a [Option<FrameId>],
    /// Bytes of the pages the write covers (all of them, or up to the logical size:
    /// `Shared::clipped_len`).
    len: usize,
}

impl WriteSource for FrameSource<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_to(&self, at: usize, dst: &mut [u8]) {
        let mut done = 0;
        while done < dst.len() {
            let (page, within) = ((at + done) / PAGE, (at + done) % PAGE);
            let n = (PAGE - within).min(dst.len() - done);
            let piece = &mut dst[done..done + n];
            match self.pages[page] {
                Some(frame) => self.pool.read(frame, within, piece),
                None => piece.fill(0),
            }
            done += n;
        }
    }
}

/// A unit the backend writes whole (`BackendFile::write_unit`) around a shorter write.
struct Unit {
    /// Its first byte in the file.
    start: u64,
    /// Its length, bytes.
    len: usize,
    /// Where the write's bytes begin in it.
    at: usize,
}

/// One file's writes, issued back to back by one thread at a time.
///
/// When the backend runs a file's writes one at a time (ext4 holds the inode lock exclusively
/// through an `O_DIRECT` write that extends the file), IO threads writing one file in parallel
/// take turns, and every turn waits for a sleeping thread to wake. Measured on this project's
/// VM (BENCHMARKS.md, "Runtime"): 8 threads kept the disk busy about 70% of the time where one
/// thread writing in a loop kept it 85-90% busy. So any IO thread copies a write's pages out of
/// the cache and queues the buffer here; the first to find the lane idle drives it, writing the
/// queued buffers in turn until none is left, and hands each completion but the last to another
/// thread so that its next write goes out at once. Other files' writes, reads and commits keep
/// the other threads.
#[derive(Default)]
pub(crate) struct Lane {
    queue: std::collections::VecDeque<LaneWrite>,
    driving: bool,
}

/// A write waiting in a [`Lane`].
struct LaneWrite {
    io: IoId,
    offset: u64,
    len: usize,
    buf: AlignedBuf,
}

impl Shared {
    pub(crate) fn write_done(&self, io: IoId, result: Result<Stability, IoError>) {
        self.enter(|core, maps, now| {
            core.engine.handle(now, Event::WriteDone { io, result }, maps)
        });
    }

    /// A write job: pages `first..first + pages` (all under writeback) go to the backend, from
    /// a buffer of the pool, or through the file's lane when the backend serialises writes.
    pub(crate) fn write_job(&self, io: IoId, inode: InodeId, first: u64, pages: u64) {
        let Some(fs) = self.file(inode) else {
            return self.write_done(io, Err(IoError { errno: ebb_core::event::errno::EIO }));
        };
        let offset = first * PAGE_SIZE;
        let len = self.clipped_len(&fs, offset, pages as usize * PAGE);
        if len == 0 {
            // Every page lies past the logical size (truncated meanwhile): nothing to write.
            return self.write_done(io, Ok(Stability::Stable));
        }
        if !self.backends[fs.backend.index()].caps.serial_writes {
            let frames = self.frames_of(&fs, first, pages);
            let source = FrameSource { pool: &self.frames, pages: &frames, len };
            // Straight from the frames, when the backend can (a whole S3 part): no buffer.
            let sent = {
                let _w = fs.size_lock.read();
                fs.file.write_from(offset, &source)
            };
            if let Some(reply) = sent {
                let result = self.wrote_reply(&fs, offset + len as u64, reply);
                return self.write_done(io, result);
            }
            if let Some(unit) = self.part_of_unit(&fs, offset, len) {
                // Less than a unit the backend writes whole (an S3 part): a buffer of the whole
                // unit, which the backend fills around the pages and writes as it is.
                let mut buf = self.bufs.take(unit.len, false);
                let valid = unit.at..unit.at + len;
                source.copy_to(0, &mut buf[valid.clone()]);
                let buf_len = unit.len;
                let result = self.wrote(&fs, offset + len as u64, |file| {
                    file.write_unit_in_place(&mut buf[..buf_len], unit.start, valid)
                });
                self.bufs.give(buf);
                return self.write_done(io, result);
            }
            let mut buf = self.bufs.take(len, false);
            source.copy_to(0, &mut buf[..len]);
            let result = self.write_out(&fs, offset, &buf[..len]);
            self.bufs.give(buf);
            return self.write_done(io, result);
        }
        // Huge-page backed: one scatter-gather segment per 2 MiB (`AlignedBuf::huge`), so a write
        // reaches the device in requests of its `max_sectors_kb`.
        let mut own = self.bufs.take(len, true);
        let frames = self.frames_of(&fs, first, pages);
        FrameSource { pool: &self.frames, pages: &frames, len }.copy_to(0, &mut own[..len]);
        {
            let mut lane = fs.lane.lock();
            lane.queue.push_back(LaneWrite { io, offset, len, buf: own });
            if lane.driving {
                return;
            }
            lane.driving = true;
        }
        loop {
            let (w, more) = {
                let mut lane = fs.lane.lock();
                let Some(w) = lane.queue.pop_front() else {
                    lane.driving = false;
                    return;
                };
                let more = !lane.queue.is_empty();
                (w, more)
            };
            let result = self.write_out(&fs, w.offset, &w.buf[..w.len]);
            self.bufs.give(w.buf);
            // With more queued another thread reports this write; the last is reported here
            // (so a lone driver, io_threads = 1, never waits on itself).
            if !(more && self.jobs.send(Job::WriteDone { io: w.io, result }).is_ok()) {
                self.write_done(w.io, result);
            }
        }
    }

    /// A write of several runs (a granule's scattered dirty pages, `Action::Write`): their
    /// pages copied into one buffer and handed to the backend as one extent
    /// (`BackendFile::write_extent`), which an S3 backend writes as one upload of each part it
    /// touches, filling the bytes between the runs from the object, and any other backend as
    /// one write per run.
    pub(crate) fn write_runs_job(&self, io: IoId, inode: InodeId, runs: &[ebb_core::Run]) {
        let Some(fs) = self.file(inode) else {
            return self.write_done(io, Err(IoError { errno: ebb_core::event::errno::EIO }));
        };
        let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
            return self.write_done(io, Ok(Stability::Stable));
        };
        let len: usize = runs.iter().map(|run| run.count as usize * PAGE).sum();
        let mut buf = self.bufs.take(len, false);
        let mut at = 0;
        for run in runs {
            let frames = self.frames_of(&fs, run.first, run.count);
            let n = run.count as usize * PAGE;
            let source = FrameSource { pool: &self.frames, pages: &frames, len: n };
            source.copy_to(0, &mut buf[at..at + n]);
            at += n;
        }
        let start = first.first * PAGE_SIZE;
        let clipped = self.clipped_len(&fs, start, (last.end() - first.first) as usize * PAGE);
        let end = start + clipped as u64;
        let mut pieces = Vec::with_capacity(runs.len());
        let mut at = 0;
        for run in runs {
            let n = run.count as usize * PAGE;
            let offset = run.first * PAGE_SIZE;
            let kept = (end.saturating_sub(offset) as usize).min(n);
            if kept > 0 {
                pieces.push((offset, &buf[at..at + kept]));
            }
            at += n;
        }
        let result = self.wrote(&fs, end, |file| file.write_extent(start, end - start, &pieces));
        drop(pieces);
        self.bufs.give(buf);
        self.write_done(io, result)
    }

    /// How many of the `len` bytes of a write from `offset` go to the backend: all, except on
    /// a backend that writes whole units (S3 parts), where the write stops at the logical
    /// size. Writeback writes whole pages and then trims the file to its size, but a unit
    /// uploaded at its page-rounded length would then have to be written again at its true
    /// length, which on S3 costs a commit copying the whole object (issue 39: a second commit
    /// for a size not a multiple of 4096). A page under writeback is not written into, so the
    /// bytes past the size are zeros nobody needs.
    fn clipped_len(&self, fs: &FileState, offset: u64, len: usize) -> usize {
        let end = offset + len as u64;
        if fs.file.write_unit(offset, end).is_none() {
            return len;
        }
        let size = fs.size.load(Ordering::Acquire);
        (size.saturating_sub(offset) as usize).min(len)
    }

    /// The unit the backend writes whole around `offset..offset + len`, when that range is less
    /// than it and the pool can hold the whole unit (see `BackendFile::write_unit`).
    fn part_of_unit(&self, fs: &FileState, offset: u64, len: usize) -> Option<Unit> {
        let end = offset + len as u64;
        let unit = fs.file.write_unit(offset, end)?;
        let unit_len = usize::try_from(unit.end - unit.start).ok()?;
        let inside = unit.start <= offset && end <= unit.end;
        let partial = unit_len > len;
        (inside && partial && unit_len <= self.bufs.limit()).then_some(Unit {
            start: unit.start,
            len: unit_len,
            at: (offset - unit.start) as usize,
        })
    }

    /// The frames of pages `first..first + pages` (`None`: a hole).
    fn frames_of(&self, fs: &FileState, first: u64, pages: u64) -> Vec<Option<FrameId>> {
        let map = fs.map.lock();
        (first..first + pages).map(|i| map.page(i).map(|p| p.frame)).collect()
    }

    /// Writes `bytes` at `offset`, in pieces of at most the backend's largest IO, then trims
    /// what lies past the logical size (writeback writes whole pages).
    fn write_out(&self, fs: &FileState, offset: u64, bytes: &[u8]) -> Result<Stability, IoError> {
        let len = bytes.len();
        let max = self.backends[fs.backend.index()].caps.max_io_bytes.max(PAGE_SIZE) as usize;
        self.wrote(fs, offset + len as u64, |file| {
            let mut stability = Stability::Stable;
            let mut at = 0;
            while at < len {
                let end = (at + max).min(len);
                let reply = file.write_at(&bytes[at..end], offset + at as u64)?;
                if let Stability::Unstable { .. } = reply.stability {
                    stability = reply.stability;
                }
                at = end;
            }
            Ok(ebb_backend::WriteReply { stability })
        })
    }

    /// Runs `write` on the backend file (bytes up to `end`) under the file's `size_lock` held
    /// shared, then notes that the file needs a sync and trims what lies past the logical size
    /// (writeback writes whole pages).
    fn wrote(
        &self,
        fs: &FileState,
        end: u64,
        write: impl FnOnce(&dyn ebb_backend::BackendFile) -> std::io::Result<ebb_backend::WriteReply>,
    ) -> Result<Stability, IoError> {
        let reply = {
            let _w = fs.size_lock.read();
            write(&*fs.file)
        };
        self.wrote_reply(fs, end, reply)
    }

    /// [`Shared::wrote`] for a write already done (under `size_lock` held shared), with
    /// `reply`. The trim holds `size_lock` exclusive, so no write of the file is in flight
    /// between its look at the size and the backend's `set_size`: a write past that size
    /// either ended before (and is cut only where it lies past the size) or starts after.
    fn wrote_reply(
        &self,
        fs: &FileState,
        end: u64,
        reply: std::io::Result<ebb_backend::WriteReply>,
    ) -> Result<Stability, IoError> {
        let stability = reply.map_err(|e| to_io_error(&e))?.stability;
        fs.needs_sync.store(true, Ordering::Release);
        if end > fs.size.load(Ordering::Acquire) {
            let _g = fs.size_lock.write();
            let size = fs.size.load(Ordering::Acquire);
            if end > size {
                // Ours to trim later if this trim fails (`FileState::padded`).
                fs.padded.store(true, Ordering::Release);
                fs.file.set_size(size).map_err(|e| to_io_error(&e))?;
                fs.padded.store(false, Ordering::Release);
            }
        }
        Ok(stability)
    }

    /// Reads pages from `first` into the frames the engine assigned (page `first + i` into
    /// `frames[i]`), through a buffer of the reads' pool (the writes', when the budget left no
    /// room for one); bytes past the end of the backend file read as zeros.
    /// A page of the range written, written back and evicted while the read is in flight, or
    /// truncated meanwhile, does not get these (older) bytes: the engine leaves it out.
    pub(crate) fn do_read(
        &self,
        inode: InodeId,
        first: u64,
        frames: &[FrameId],
    ) -> Result<(), IoError> {
        let Some(fs) = self.file(inode) else { return Ok(()) };
        let max = self.backends[fs.backend.index()].caps.max_io_bytes.max(PAGE_SIZE) as usize;
        // Pieces of whole pages, none larger than the backend's largest IO or the pool allows.
        let pool = if self.read_bufs.limit() > 0 { &self.read_bufs } else { &self.bufs };
        let piece = (max.min(pool.limit()) / PAGE).max(1);
        let mut buf = pool.take(frames.len().min(piece) * PAGE, false);
        let result = self.read_pieces(&fs, first, frames, piece, &mut buf);
        pool.give(buf);
        result
    }

    /// [`Shared::do_read`]'s reads, `piece` pages at a time through `buf`; past a short read
    /// the frames get zeros.
    fn read_pieces(
        &self,
        fs: &FileState,
        first: u64,
        frames: &[FrameId],
        piece: usize,
        buf: &mut AlignedBuf,
    ) -> Result<(), IoError> {
        let mut short = false;
        for (k, chunk) in frames.chunks(piece).enumerate() {
            let len = chunk.len() * PAGE;
            if short {
                buf[..len].fill(0);
            } else {
                let offset = (first + (k * piece) as u64) * PAGE_SIZE;
                let n = fs.file.read_at(&mut buf[..len], offset).map_err(|e| to_io_error(&e))?;
                if n < len {
                    buf[n..len].fill(0);
                    short = true;
                }
            }
            for (i, &frame) in chunk.iter().enumerate() {
                self.frames.write(frame, 0, &buf[i * PAGE..(i + 1) * PAGE]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::FramePool;

    // A backend reads a write's bytes in pieces of any size and offset: each piece is the
    // pages' bytes at that place, across page boundaries, and zeros for a hole.
    #[test]
    fn a_frame_source_copies_any_piece_of_its_pages() {
        let pool = FramePool::new(4);
        let frames = [FrameId(2), FrameId(0)];
        for (n, frame) in frames.iter().enumerate() {
            let bytes: Vec<u8> = (0..PAGE).map(|i| (i % 250) as u8 + n as u8 + 1).collect();
            pool.write(*frame, 0, &bytes);
        }
        let pages = [Some(frames[0]), None, Some(frames[1])];
        let source = FrameSource { pool: &pool, pages: &pages, len: 3 * PAGE };
        let mut model = vec![0u8; 3 * PAGE];
        pool.read(frames[0], 0, &mut model[..PAGE]);
        pool.read(frames[1], 0, &mut model[2 * PAGE..]);
        assert_eq!(source.len(), 3 * PAGE);
        for (at, len) in
            [(0, 3 * PAGE), (100, PAGE), (PAGE - 1, 2), (PAGE + 5, PAGE), (3 * PAGE - 7, 7)]
        {
            let mut piece = vec![0xEEu8; len];
            source.copy_to(at, &mut piece);
            assert!(piece == model[at..at + len], "{len} bytes at {at}");
        }
    }
}
