//! The IO threads' work for the engine's `Write` and `Read` actions: a write's pages copied out
//! of their frames into a buffer of the pool and sent to the backend (whole, as a whole unit
//! filled in place when the backend writes units such as S3 parts, or through the file's lane
//! when the backend runs one file's writes one at a time), then the logical size restored; a
//! read's pieces read into a pool buffer and copied into the frames the engine assigned.

use std::sync::atomic::Ordering;

use ebb_backend::AlignedBuf;
use ebb_core::{Event, FrameId, InodeId, IoError, IoId, PAGE_SIZE, Stability};

use super::{FileState, Job, PAGE, Shared, to_io_error};

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
        let len = pages as usize * PAGE;
        let offset = first * PAGE_SIZE;
        if !self.backends[fs.backend.index()].caps.serial_writes {
            if let Some(unit) = self.part_of_unit(&fs, offset, len) {
                // Less than a unit the backend writes whole (an S3 part): a buffer of the whole
                // unit, which the backend fills around the pages and writes as it is.
                let mut buf = self.bufs.take(unit.len, false);
                let valid = unit.at..unit.at + len;
                self.gather(&fs, first, pages, &mut buf[valid.clone()]);
                let buf_len = unit.len;
                let result = self.wrote(&fs, offset + len as u64, |file| {
                    file.write_unit_in_place(&mut buf[..buf_len], unit.start, valid)
                });
                self.bufs.give(buf);
                return self.write_done(io, result);
            }
            let mut buf = self.bufs.take(len, false);
            self.gather(&fs, first, pages, &mut buf);
            let result = self.write_out(&fs, offset, &buf[..len]);
            self.bufs.give(buf);
            return self.write_done(io, result);
        }
        // Huge-page backed: one scatter-gather segment per write (`AlignedBuf::huge`).
        let mut own = self.bufs.take(len, true);
        self.gather(&fs, first, pages, &mut own);
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

    /// Copies pages `first..first + pages` out of their frames into `buf` (holes as zeros).
    fn gather(&self, fs: &FileState, first: u64, pages: u64, buf: &mut [u8]) {
        let frames: Vec<Option<FrameId>> = {
            let map = fs.map.lock();
            (first..first + pages).map(|i| map.page(i).map(|p| p.frame)).collect()
        };
        for (i, frame) in frames.iter().enumerate() {
            let dst = &mut buf[i * PAGE..(i + 1) * PAGE];
            match frame {
                Some(f) => self.frames.read(*f, 0, dst),
                None => dst.fill(0),
            }
        }
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

    /// Runs `write` on the backend file (bytes up to `end`), then notes that the file needs a
    /// sync and trims what lies past the logical size (writeback writes whole pages).
    fn wrote(
        &self,
        fs: &FileState,
        end: u64,
        write: impl FnOnce(&dyn ebb_backend::BackendFile) -> std::io::Result<ebb_backend::WriteReply>,
    ) -> Result<Stability, IoError> {
        let stability = write(&*fs.file).map_err(|e| to_io_error(&e))?.stability;
        fs.needs_sync.store(true, Ordering::Release);
        if end > fs.size.load(Ordering::Acquire) {
            let _g = fs.size_lock.lock();
            let size = fs.size.load(Ordering::Acquire);
            if end > size {
                fs.file.set_size(size).map_err(|e| to_io_error(&e))?;
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
