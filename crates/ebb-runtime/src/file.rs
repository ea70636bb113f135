//! An open file: positional and streaming read and write through the cache, fsync, truncate,
//! close.
//!
//! Writes follow ebb-core's writer path: under the file's page-map lock alone, `write_pages`
//! dirties pages against this handle's [`Writer`] and the bytes are copied into their frames;
//! the engine is entered only when the writer owes a throttle check (every `nr_dirtied_pause`
//! pages), and the calling thread then sleeps for the pause the engine decides (a non-blocking
//! write returns it instead, `file/throttle.rs`). A page under
//! writeback is never modified: the writer waits for its write to end (stable pages), which is
//! what lets IO threads copy frames out without a lock.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ebb_core::{Event, GroupId, HandleId, InodeId, PAGE_SIZE, Run, Writer, WriterId};
use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::Ebb;
use crate::shared::{FileState, PAGE, ReserveHolder, from_io_error, read_page_direct};

mod durable;
mod throttle;
mod write;

pub(crate) use throttle::{Obey, Owed, Throttled};
pub use throttle::{TryWrite, WriteAt};
pub(crate) use write::OldBytes;

/// Pages one step of a write or read covers at most (bounds the time a page map is locked).
const STEP_PAGES: u64 = 1024;
/// One step of a read from `offset`: pages `first..first + count` from byte `pos` up to byte
/// `end`.
struct ReadStep {
    offset: u64,
    pos: u64,
    first: u64,
    count: u64,
    end: u64,
}

/// Direct-read events queued before a reader delivers them to the engine itself.
const DIRECT_READ_BATCH: usize = 256;
/// How often a waiting call asks whether its caller gave up (see [`Interrupt`]).
const INTERRUPT_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Whether the caller of a blocking call gave up (a FUSE request whose process was killed).
/// The `_interruptible` calls ask it at least every 50 ms while they wait (a throttle pause, a
/// wait for memory or for a page under writeback, an fsync, a read from the backend) and then
/// return `ErrorKind::Interrupted`, leaving the cache consistent: what a write copied stays
/// dirty, an fsync or read abandoned completes in the background unseen.
pub type Interrupt<'a> = &'a (dyn Fn() -> bool + Sync);

/// The [`Interrupt`] of calls that wait until done.
fn never() -> bool {
    false
}

/// Waits for `slot`'s answer; `None` if `interrupted` said so first.
pub(crate) fn wait_slot(
    slot: &crate::shared::Slot,
    interrupted: Interrupt<'_>,
) -> Option<Result<(), ebb_core::IoError>> {
    loop {
        if let Some(result) = slot.wait_for(INTERRUPT_POLL) {
            return Some(result);
        }
        if interrupted() {
            return None;
        }
    }
}

/// Sleeps for `pause`; `false` if `interrupted` said so first.
fn sleep_for(pause: std::time::Duration, interrupted: Interrupt<'_>) -> bool {
    let end = std::time::Instant::now() + pause;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(INTERRUPT_POLL));
        if interrupted() {
            return false;
        }
    }
}

fn interrupted_error(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, format!("{what} interrupted: the caller gave up"))
}

/// A histogram of microseconds (1 us to an hour, 1 significant figure, 32-bit counts: about
/// 2 KiB) made at its first value. With 2 significant figures and 64-bit counts one took
/// 26 KiB: two per handle took 53 KiB for each of the thousands of files a mount keeps
/// attached (a mount of 64 MiB reached 330 MiB after 10,000 files were created), and one per
/// throttled handle still 6.5 MiB for 256 writers at once; a handle's quantiles are within
/// 10% this way, which is enough for its stats (the mount's own pause histogram keeps 2
/// figures).
/// `max` is kept exactly beside it (the histogram's own is rounded to its precision).
#[derive(Default)]
pub(crate) struct LazyHistogram(Option<Box<Histogram<u32>>>, u64);

impl LazyHistogram {
    pub(crate) fn record(&mut self, us: u64) {
        let histogram = self.0.get_or_insert_with(|| {
            Box::new(Histogram::new_with_bounds(1, 3_600_000_000, 1).expect("valid bounds"))
        });
        histogram.saturating_record(us.max(1));
        self.1 = self.1.max(us.max(1));
    }

    pub(crate) fn len(&self) -> u64 {
        self.0.as_ref().map_or(0, |h| h.len())
    }

    /// The value at `quantile`, 0 when empty.
    pub(crate) fn quantile(&self, quantile: f64) -> u64 {
        self.0.as_ref().filter(|h| !h.is_empty()).map_or(0, |h| h.value_at_quantile(quantile))
    }

    /// The largest value, exactly; 0 when empty.
    pub(crate) fn max(&self) -> u64 {
        self.1
    }
}

/// How many waits a handle had and the longest, in microseconds (all its stats tell of them).
#[derive(Default)]
pub(crate) struct Waits {
    count: u64,
    max_us: u64,
}

impl Waits {
    pub(crate) fn record(&mut self, us: u64) {
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }
}

/// The throttling state of one handle: the kernel keeps it per task; ebb keeps it per handle.
pub(crate) struct WriterState {
    pub(crate) writer: Writer,
    /// Pauses (sleeps the engine asked for), microseconds.
    pub(crate) pauses: LazyHistogram,
    /// Time spent waiting for pages under writeback or for memory, microseconds.
    pub(crate) waits: Waits,
    /// What a non-blocking write left owed: the rest of its throttle call.
    pub(crate) owed: Option<Owed>,
    /// The last request for writers' reserves (`Shared::reserve_sweeps`) this writer answered:
    /// one that came while it was writing, it answers when its write ends.
    pub(crate) sweeps_seen: u64,
}

impl ReserveHolder for Mutex<WriterState> {
    fn try_writer(&self, sweep: u64) -> Option<parking_lot::MappedMutexGuard<'_, Writer>> {
        let mut ws = self.try_lock()?;
        ws.sweeps_seen = sweep;
        Some(parking_lot::MutexGuard::map(ws, |ws| &mut ws.writer))
    }

    fn peek_writer(&self) -> Option<parking_lot::MappedMutexGuard<'_, Writer>> {
        Some(parking_lot::MutexGuard::map(self.try_lock()?, |ws| &mut ws.writer))
    }
}

impl File {
    /// At the end of a write: if reserves were asked for while this writer was writing
    /// (`Shared::reserve_sweeps`), it gives its own back now.
    pub(crate) fn answer_reserve_sweep(&self, ws: &mut WriterState) {
        let shared = &self.ebb.inner.shared;
        let sweep = shared.reserve_sweeps.load(Ordering::Acquire);
        if ws.sweeps_seen == sweep {
            return;
        }
        ws.sweeps_seen = sweep;
        if ws.writer.reserved_frames() > 0 {
            let writer = &mut ws.writer;
            shared.enter(|core, maps, now| core.engine.return_reserves(now, [writer], maps));
        }
    }
}

/// What a handle's writer has been through: pause percentiles in microseconds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ThrottleStats {
    /// Pages this handle dirtied.
    pub pages_dirtied: u64,
    /// Pauses taken.
    pub pauses: u64,
    /// Pause percentiles, microseconds: 50, 90, 99, 99.9 and the maximum.
    pub pause_us_p50: u64,
    /// 90th percentile.
    pub pause_us_p90: u64,
    /// 99th percentile.
    pub pause_us_p99: u64,
    /// 99.9th percentile.
    pub pause_us_p99_9: u64,
    /// Longest pause.
    pub pause_us_max: u64,
    /// Total time paused or waiting, microseconds.
    pub stalled_us: u64,
    /// Waits for a page under writeback or for memory.
    pub waits: u64,
    /// Longest such wait, microseconds.
    pub wait_us_max: u64,
}

/// An open file of an [`Ebb`] cache. `Send + Sync`: positional calls take `&self`; the
/// `std::io` traits use the handle's own cursor.
pub struct File {
    pub(crate) ebb: Ebb,
    pub(crate) fs: Arc<FileState>,
    pub(crate) handle: HandleId,
    /// Shared with the runtime's list of open writers, which takes an idle writer's frame
    /// reserve back when another waits for memory (`Shared::return_reserves`).
    pub(crate) writer: Arc<Mutex<WriterState>>,
    pub(crate) pos: u64,
    pub(crate) closed: bool,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("inode", &self.fs.inode)
            .field("handle", &self.handle)
            .field("len", &self.len())
            .finish()
    }
}

impl File {
    pub(crate) fn new(ebb: Ebb, fs: Arc<FileState>, handle: HandleId, writer: WriterId) -> File {
        let state = Arc::new(Mutex::new(WriterState {
            writer: Writer::new(writer, GroupId(0)),
            pauses: LazyHistogram::default(),
            waits: Waits::default(),
            owed: None,
            sweeps_seen: ebb.inner.shared.reserve_sweeps.load(Ordering::Acquire),
        }));
        let holder: Arc<dyn ReserveHolder> = state.clone();
        ebb.inner.shared.writer_opened(writer, Arc::downgrade(&holder));
        File { ebb, fs, handle, writer: state, pos: 0, closed: false }
    }

    fn inode(&self) -> InodeId {
        self.fs.inode
    }

    /// The file's logical size, including data not yet written back.
    pub fn len(&self) -> u64 {
        self.fs.size.load(Ordering::Acquire)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the cache holds nothing of this file the backend lacks: no page dirty (held
    /// ones included), under writeback or unstable. A clean file's cached pages are copies of
    /// the backend's, which a caller that sees the backend file changed may then drop.
    pub fn is_clean(&self) -> bool {
        let counts = self.fs.map.lock().counts();
        counts.dirty + counts.held + counts.writeback + counts.unstable == 0
    }

    /// Writes all of `buf` at `offset` into the cache and returns `buf.len()`. The calling
    /// thread may sleep: that is dirty throttling, sized by the engine to keep dirty data near
    /// its setpoint. Errors: `ReadOnlyFilesystem` once the cache is draining, `InvalidInput` for
    /// a range past the largest file offset; write-back errors come later, from `fsync`/`close`.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.write_at_interruptible(buf, offset, &never)
    }

    /// [`File::write_at`], giving up when `interrupted` says so while it waits (see
    /// [`Interrupt`]): then the bytes copied so far are in the cache and their count is
    /// returned, or `ErrorKind::Interrupted` if there are none.
    pub fn write_at_interruptible(
        &self,
        buf: &[u8],
        offset: u64,
        interrupted: Interrupt<'_>,
    ) -> io::Result<usize> {
        self.write_inner(buf, offset, Obey::Block(interrupted)).map(|(n, _)| n)
    }

    /// Reads into `buf` from `offset`; returns fewer bytes only at the end of the file. Pages not
    /// in the cache are read through it (with readahead for sequential readers).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_at_interruptible(buf, offset, &never)
    }

    /// [`File::read_at`], giving up when `interrupted` says so while it waits for the backend
    /// (see [`Interrupt`]): then the bytes read so far, or `ErrorKind::Interrupted`.
    pub fn read_at_interruptible(
        &self,
        buf: &mut [u8],
        offset: u64,
        interrupted: Interrupt<'_>,
    ) -> io::Result<usize> {
        let size = self.len();
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len().min((size - offset) as usize);
        let shared = &self.ebb.inner.shared;
        let mut done = 0usize;
        let mut missing = Vec::new();
        let mut misses_in_a_row = 0;
        while done < len {
            let pos = offset + done as u64;
            let first = pos / PAGE_SIZE;
            let in_page = (pos % PAGE_SIZE) as usize;
            let count = ((in_page + len - done).div_ceil(PAGE) as u64).min(STEP_PAGES);
            let end = (offset + len as u64).min((first + count) * PAGE_SIZE);
            let step = ReadStep { offset, pos, first, count, end };
            let (copied, gap) = self.copy_resident(buf, &step, &mut missing);
            if let Some(copied) = copied {
                misses_in_a_row = 0;
                done = copied;
            }
            let Some(gap) = gap else { continue };
            if misses_in_a_row >= 3 {
                // The cache could not keep the page (memory is short): read it straight from
                // the backend; a page not in the cache is not dirty, so the backend is current.
                done = self.copy_direct(buf, &step, gap.first)?;
                misses_in_a_row = 0;
                continue;
            }
            let inode = self.inode();
            let slot = shared.request(|request| Event::Read {
                inode,
                first_page: gap.first,
                pages: gap.count,
                request,
            });
            let answer = wait_slot(&slot, interrupted);
            if let Some(Err(e)) = answer {
                if done > 0 {
                    return Ok(done);
                }
                return Err(from_io_error(e));
            }
            if answer.is_none() {
                return if done > 0 { Ok(done) } else { Err(interrupted_error("read")) };
            }
            misses_in_a_row += 1;
        }
        Ok(len)
    }

    /// [`File::read_at`] for a caller that must not block (a FUSE request loop): `Some` with
    /// the bytes read when every page of the range up to the end of the file is in the cache
    /// (copied under the file's page-map lock, as a write's are; the engine is not entered,
    /// as for any read that finds its pages), `None` when one is missing or the range spans
    /// more than one step of [`File::read_at`] (`buf` may then hold some of the bytes; the
    /// caller reads with [`File::read_at`], which brings them in).
    pub fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<usize> {
        let size = self.len();
        if offset >= size || buf.is_empty() {
            return Some(0);
        }
        let len = buf.len().min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let first = offset / PAGE_SIZE;
        let count = ((offset % PAGE_SIZE) as usize + len).div_ceil(PAGE) as u64;
        if count > STEP_PAGES {
            return None;
        }
        let step = ReadStep { offset, pos: offset, first, count, end: offset + len as u64 };
        match self.copy_resident(buf, &step, &mut Vec::new()) {
            (Some(done), None) if done == len => Some(len),
            _ => None,
        }
    }

    /// Copies the step's resident pages up to its first missing one into `buf`; returns how far
    /// into the read that got (`None` if the first page is missing) and the first missing run.
    fn copy_resident(
        &self,
        buf: &mut [u8],
        step: &ReadStep,
        missing: &mut Vec<Run>,
    ) -> (Option<usize>, Option<Run>) {
        let frames = &self.ebb.inner.shared.frames;
        let mut map = self.fs.map.lock();
        missing.clear();
        map.lookup(step.first, step.count, missing);
        let upto = missing.first().map_or(step.first + step.count, |r| r.first);
        let mut done = None;
        for page in step.first..upto {
            let frame = map.page(page).expect("lookup said resident").frame;
            let page_start = page * PAGE_SIZE;
            let from = step.pos.max(page_start);
            let to = step.end.min(page_start + PAGE_SIZE);
            let dst = &mut buf[(from - step.offset) as usize..(to - step.offset) as usize];
            frames.read(frame, (from - page_start) as usize, dst);
            done = Some((to - step.offset) as usize);
        }
        (done, missing.first().copied())
    }

    /// Reads `page` straight from the backend into `buf` (the part of it the step covers);
    /// returns how far into the read that got.
    fn copy_direct(&self, buf: &mut [u8], step: &ReadStep, page: u64) -> io::Result<usize> {
        let bytes = read_page_direct(&self.fs, page)?;
        let page_start = page * PAGE_SIZE;
        let from = step.pos.max(page_start);
        let to = step.end.min(page_start + PAGE_SIZE);
        buf[(from - step.offset) as usize..(to - step.offset) as usize]
            .copy_from_slice(&bytes[(from - page_start) as usize..(to - page_start) as usize]);
        Ok((to - step.offset) as usize)
    }

    /// Reads straight from the backend, bypassing the cache, like an `O_DIRECT` read: for
    /// callers that keep their own buffers. The read counts for writeback throttling (its
    /// latency is what wbt protects). Pages of the range that are in the cache are newer than
    /// the backend, so a range touching one is served by [`File::read_at`] instead. Offsets and
    /// lengths must meet the backend's alignment (4 KiB for a directory), else `InvalidInput`.
    pub fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let first = offset / PAGE_SIZE;
        let last = (offset + buf.len() as u64 - 1) / PAGE_SIZE;
        let cached = {
            let map = self.fs.map.lock();
            map.counts().resident > 0 && (first..=last).any(|p| map.page(p).is_some())
        };
        if cached {
            return self.read_at(buf, offset);
        }
        let shared = &self.ebb.inner.shared;
        let backend = self.fs.backend;
        let id = shared.next_id();
        // Reported without taking the engine lock; the engine sees them at its next entry.
        shared.direct_reads.push(Event::DirectReadStart { backend, id });
        let start = std::time::Instant::now();
        let result = self.fs.file.read_at(buf, offset);
        let latency = ebb_core::Duration::from_nanos(start.elapsed().as_nanos() as u64);
        shared.direct_reads.push(Event::DirectRead { backend, id, latency });
        // Nothing else may be entering the engine (a reader alone): bound the queue.
        if shared.direct_reads.len() >= DIRECT_READ_BATCH {
            shared.enter(|_, _, _| ());
        }
        result
    }

    /// Sets the file's size. Shrinking drops cached pages past the end (waiting for any write of
    /// them in flight) and trims the backend file; growing adds a hole that reads as zeros.
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        if size > i64::MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("size {size} is past the largest file offset"),
            ));
        }
        let fs = &self.fs;
        let _t = fs.truncate_lock.lock();
        // Pending dirtying of this handle goes to the engine first, so the truncate sees it.
        {
            let mut ws = self.writer.lock();
            self.ebb
                .inner
                .shared
                .enter(|core, maps, now| core.engine.flush_writer(now, &mut ws.writer, maps));
        }
        let old = fs.size.swap(size, Ordering::AcqRel);
        // Ends (announcing the trimmed backend to the engine) after the backend's set_size.
        let mut changing = None;
        if size < old {
            let keep = size.div_ceil(PAGE_SIZE);
            // From the partial last page on, before its cached copy is zeroed: a read of it in
            // flight holds the bytes past the new end, which must not come back when the file
            // grows again (seen through the mount by tests/it/racing.rs in ebb-fuse).
            let first = size / PAGE_SIZE;
            changing = Some(self.invalidating(first, u64::MAX - first));
            if !size.is_multiple_of(PAGE_SIZE) {
                let map = fs.map.lock();
                if let Some(p) = map.page(size / PAGE_SIZE) {
                    let at = (size % PAGE_SIZE) as usize;
                    self.ebb.inner.shared.frames.with(p.frame, |b| b[at..].fill(0));
                }
            }
            let inode = self.inode();
            self.ebb.inner.shared.enter(|core, maps, now| {
                core.engine.handle(now, Event::Truncate { inode, first_page: keep }, maps)
            });
            // Writes of dropped pages already in flight must end before the backend is trimmed,
            // or they would extend it again with stale bytes.
            loop {
                let busy = {
                    let map = fs.map.lock();
                    map.counts().writeback > 0
                        && map
                            .pages()
                            .any(|(i, p)| i >= keep && p.state == ebb_core::PageState::Writeback)
                };
                if !busy {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        let _g = fs.size_lock.write();
        fs.file.set_size(fs.size.load(Ordering::Acquire))?;
        fs.padded.store(false, Ordering::Release);
        drop(changing);
        fs.needs_sync.store(true, Ordering::Release);
        Ok(())
    }

    /// Makes `offset..offset + len` (within the file's size) read as zeros in the cache, for a
    /// caller that punches or zeroes the same range of the backend file right after (the
    /// `fallocate` modes): cached pages of the range are zeroed in place, keeping their state
    /// (a dirty page writes zeros back later), and pages not cached read the backend's zeros.
    /// A page under writeback is waited for first, so no write in flight carries old bytes
    /// after the backend's range is zeroed. The size does not change. Prefer
    /// [`File::zero_range_with`], which also keeps reads in flight from bringing back the bytes
    /// from before.
    pub fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero_range_with(offset, len, || Ok(()))
    }

    /// [`File::zero_range`], then `backend` (which punches or zeroes the backend file's range):
    /// from before the cache is zeroed until `backend` returns, no page of the range that a read
    /// brings from the backend enters the cache (it may hold the bytes from before; the
    /// engine's backend-change rule), so no stale page outlives the change.
    pub fn zero_range_with(
        &self,
        offset: u64,
        len: u64,
        backend: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let end = offset.saturating_add(len).min(self.len());
        if offset >= end {
            return backend();
        }
        let (first, last) = (offset / PAGE_SIZE, (end - 1) / PAGE_SIZE);
        let fs = &self.fs;
        let _t = fs.truncate_lock.lock();
        let _changing = self.invalidating(first, last + 1 - first);
        loop {
            // Page states change only under the page-map lock, so none in the range can start
            // a write-back while it is held.
            let map = fs.map.lock();
            let busy = map.pages().any(|(index, page)| {
                (first..=last).contains(&index) && page.state == ebb_core::PageState::Writeback
            });
            if busy {
                drop(map);
                std::thread::sleep(std::time::Duration::from_micros(200));
                continue;
            }
            for (index, page) in map.pages().filter(|(index, _)| (first..=last).contains(index)) {
                let page_start = index * PAGE_SIZE;
                let from = (offset.max(page_start) - page_start) as usize;
                let to = (end.min(page_start + PAGE_SIZE) - page_start) as usize;
                self.ebb.inner.shared.frames.with(page.frame, |bytes| bytes[from..to].fill(0));
            }
            break;
        }
        backend()
    }

    /// Someone else changed the backend's file (a caller that found it changed at an open:
    /// close-to-open): its clean pages leave the cache and reads in flight keep none of theirs
    /// ([`Event::BackendChanged`]), so reads bring the new bytes; pages holding data the
    /// backend lacks stay (the cache's data wins). With no such page left, the file's size
    /// becomes the backend's, unless the backend's is longer by the whole last page a
    /// write-back of ebb's wrote and could not trim yet (`padded`; someone else's growth is
    /// theirs, also inside ebb's last page). The backend first forgets what it cached of the
    /// file (`BackendFile::forget_metadata`: S3's metadata cache), so the size is the server's.
    pub fn backend_changed(&self) -> io::Result<()> {
        let fs = &self.fs;
        let _t = fs.truncate_lock.lock();
        fs.file.forget_metadata();
        let backend = fs.file.size()?;
        let inode = self.inode();
        let event = Event::BackendChanged { inode };
        self.ebb.inner.shared.enter(|core, maps, now| core.engine.handle(now, event, maps));
        // Writers dirty pages and grow the size under the page-map lock.
        let map = fs.map.lock();
        let counts = map.counts();
        let size = fs.size.load(Ordering::Acquire);
        let padded = fs.padded.load(Ordering::Acquire)
            && backend > size
            && backend <= size.next_multiple_of(PAGE_SIZE);
        if counts.dirty + counts.held + counts.writeback + counts.unstable == 0 && !padded {
            fs.size.store(backend, Ordering::Release);
        }
        Ok(())
    }

    /// Announces a change of `pages` pages from `first` in the backend behind the cache
    /// ([`Event::Invalidate`]); the guard announces its end when dropped.
    fn invalidating(&self, first: u64, pages: u64) -> Invalidating<'_> {
        let inode = self.inode();
        let event = Event::Invalidate { inode, first_page: first, pages };
        self.ebb.inner.shared.enter(|core, maps, now| core.engine.handle(now, event, maps));
        Invalidating { file: self, first, pages }
    }

    /// Makes everything written to this file durable: writes its dirty pages, waits for them
    /// (and a COMMIT on two-phase backends), trims and syncs the backend file. Reports a write
    /// error once per handle (errseq), even one from writeback long ago.
    pub fn fsync(&self) -> io::Result<()> {
        self.fsync_interruptible(&never)
    }

    /// [`File::fsync`], giving up with `ErrorKind::Interrupted` when `interrupted` says so
    /// while it waits (see [`Interrupt`]); the writes it started go on.
    pub fn fsync_interruptible(&self, interrupted: Interrupt<'_>) -> io::Result<()> {
        let shared = &self.ebb.inner.shared;
        {
            let mut ws = self.writer.lock();
            shared.enter(|core, maps, now| core.engine.flush_writer(now, &mut ws.writer, maps));
        }
        let handle = self.handle;
        let slot = shared.request(|request| Event::Fsync { handle, request });
        wait_slot(&slot, interrupted)
            .ok_or_else(|| interrupted_error("fsync"))?
            .map_err(from_io_error)?;
        crate::shared::durable::sync_backend_file(&self.ebb.inner.shared, &self.fs)
    }

    /// What `close(2)` of one descriptor does (a FUSE flush): on a backend with
    /// `flush_on_close` (NFS, S3: close-to-open consistency) the file is written back and
    /// committed as by [`File::fsync`]; elsewhere only a write error this handle has not seen
    /// is reported ([`File::check_error`]).
    pub fn flush_interruptible(&self, interrupted: Interrupt<'_>) -> io::Result<()> {
        if self.flushes_on_close() {
            self.fsync_interruptible(interrupted)
        } else {
            self.check_error()
        }
    }

    /// Whether the file's backend has `flush_on_close` (NFS, S3): then
    /// [`File::flush_interruptible`] and [`File::close`] write the file back and commit it,
    /// and may wait for the backend; elsewhere they only report an error not yet seen.
    pub fn flushes_on_close(&self) -> bool {
        let backend = self.fs.backend;
        self.ebb
            .inner
            .shared
            .enter(|core, _, _| core.engine.config().backends[backend.index()].flush_on_close)
    }

    /// Reports a write error of this file that this handle has not seen yet, once, without
    /// writing anything or closing (what `close(2)` reports on a local filesystem).
    pub fn check_error(&self) -> io::Result<()> {
        let handle = self.handle;
        self.ebb
            .inner
            .shared
            .enter(|core, _, _| core.engine.check_handle_error(handle))
            .map_err(from_io_error)
    }

    /// [`File::errors`] of each of `files` (all of this cache), under one take of the engine
    /// lock rather than one each: a busy mount listing its thousands of attached files waited
    /// behind other requests once per file.
    pub fn errors_of(files: &[&File]) -> Vec<Option<ebb_core::FileErrors>> {
        let Some(first) = files.first() else { return Vec::new() };
        first.ebb.inner.shared.enter(|core, maps, _| {
            files.iter().map(|file| core.engine.file_errors(file.inode(), maps)).collect()
        })
    }

    /// The file's write errors and the pages they hold (`ebb_core::Engine::file_errors`):
    /// the last error, how many happened, whether a handle has seen it, held and dirty pages.
    pub fn errors(&self) -> Option<ebb_core::FileErrors> {
        let inode = self.inode();
        self.ebb.inner.shared.enter(|core, maps, _| core.engine.file_errors(inode, maps))
    }

    /// What this handle's writer has been through (pauses, waits).
    pub fn throttle_stats(&self) -> ThrottleStats {
        let ws = self.writer.lock();
        let p = &ws.pauses;
        let q = |x: f64| p.quantile(x);
        ThrottleStats {
            pages_dirtied: ws.writer.total_dirtied(),
            pauses: p.len(),
            pause_us_p50: q(0.5),
            pause_us_p90: q(0.9),
            pause_us_p99: q(0.99),
            pause_us_p99_9: q(0.999),
            pause_us_max: p.max(),
            stalled_us: ws.writer.total_stalled().as_micros(),
            waits: ws.waits.count,
            wait_us_max: ws.waits.max_us,
        }
    }

    /// Closes the handle, reporting a write error this handle has not seen yet. On a backend
    /// with `flush_on_close` (NFS, S3) the file is first written back and committed, as
    /// [`File::fsync`] does, and an error of that is reported.
    pub fn close(mut self) -> io::Result<()> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let shared = &self.ebb.inner.shared;
        {
            let mut ws = self.writer.lock();
            shared.enter(|core, maps, now| core.engine.writer_exit(now, &mut ws.writer, maps));
            shared.writer_closed(ws.writer.id);
        }
        let flush = self.flushes_on_close();
        let handle = self.handle;
        let slot = shared.request(|request| Event::Close { handle, request });
        let mut result = slot.wait().map_err(from_io_error);
        if flush && result.is_ok() {
            // The engine wrote the file back; the backend's own commit (an S3 completion).
            result = crate::shared::durable::sync_backend_file(&self.ebb.inner.shared, &self.fs);
        }
        shared.handle_closed(&self.fs);
        result
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // A handle dropped without `close` loses only the chance to see an error (as close(2)
        // ignored); its data stays in the cache and is written back.
        let _ = self.close_inner();
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.write_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }

    /// The data is in the cache already; durability is `fsync`'s job.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let pos = base.filter(|&p| p <= i64::MAX as u64).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "seek to a negative or too large offset")
        })?;
        self.pos = pos;
        Ok(pos)
    }
}

/// The end of a change of the backend behind the cache ([`File::zero_range_with`],
/// [`File::set_len`]): tells the engine when dropped ([`Event::InvalidateDone`]).
struct Invalidating<'a> {
    file: &'a File,
    first: u64,
    pages: u64,
}

impl Drop for Invalidating<'_> {
    fn drop(&mut self) {
        let inode = self.file.inode();
        let event = Event::InvalidateDone { inode, first_page: self.first, pages: self.pages };
        self.file.ebb.inner.shared.enter(|core, maps, now| core.engine.handle(now, event, maps));
    }
}
