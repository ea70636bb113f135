//! The write path: a write's bytes copied into the cache step by step, each step's pages
//! dirtied in the engine under the file's page-map lock, with the throttle's check between
//! steps, and a partial page's old bytes read from the backend first where the cache lacks them.

use std::io;
use std::sync::atomic::Ordering;

use ebb_backend::AlignedBuf;
use ebb_core::{PAGE_SIZE, Writer, write_pages};

use super::{File, Obey, Owed, STEP_PAGES, Throttled, WriterState, interrupted_error};
use crate::shared::{PAGE, read_page_direct};

/// Whether a write may read a partial page's old bytes from the backend, blocking, or declines
/// where it would ([`File::try_poll_write_at`], on a loop that must not block).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OldBytes {
    /// Read them (the blocking write paths).
    Read,
    /// Write nothing of the step that would need them.
    Decline,
}

/// One step of a write: at most `STEP_PAGES` pages from byte `pos`, covering the bytes up to
/// `covered_end`; a partial first or last page keeps bytes the write does not cover.
struct StepSpan {
    pos: u64,
    first: u64,
    count: u64,
    last: u64,
    covered_end: u64,
    head_partial: bool,
    tail_partial: bool,
}

impl StepSpan {
    /// The step of a write with `rest` bytes left from `pos`.
    fn new(pos: u64, rest: usize) -> StepSpan {
        let first = pos / PAGE_SIZE;
        let in_page = (pos % PAGE_SIZE) as usize;
        let count = ((in_page + rest).div_ceil(PAGE) as u64).min(STEP_PAGES);
        let last = first + count - 1;
        let covered_end = (pos + rest as u64).min((first + count) * PAGE_SIZE);
        StepSpan {
            pos,
            first,
            count,
            last,
            covered_end,
            head_partial: in_page != 0 || covered_end < (first + 1) * PAGE_SIZE,
            tail_partial: last != first && !covered_end.is_multiple_of(PAGE_SIZE),
        }
    }
}

impl File {
    /// The write path of [`File::write_at`] and [`File::try_write_at`]: the bytes written, and
    /// what the writer owes before it writes on (only under [`Obey::Poll`]).
    pub(crate) fn write_inner(
        &self,
        buf: &[u8],
        offset: u64,
        mode: Obey<'_>,
    ) -> io::Result<(usize, Option<Owed>)> {
        if buf.is_empty() {
            return Ok((0, None));
        }
        self.check_writable(buf.len(), offset)?;
        match self.write_locked(self.writer.lock(), buf, offset, mode, OldBytes::Read)? {
            Some(written) => Ok(written),
            None => unreachable!("a write that may read old bytes never declines"),
        }
    }

    /// [`File::write_inner`] once the handle's writer state is held. `None`, having written
    /// nothing, where `old` is [`OldBytes::Decline`] and the first step would read a partial
    /// page's old bytes from the backend; a later step that would returns the bytes written
    /// before it.
    pub(crate) fn write_locked(
        &self,
        mut ws: parking_lot::MutexGuard<'_, WriterState>,
        buf: &[u8],
        offset: u64,
        mode: Obey<'_>,
        old: OldBytes,
    ) -> io::Result<Option<(usize, Option<Owed>)>> {
        let written = self.write_steps(&mut ws, buf, offset, mode, old);
        self.answer_reserve_sweep(&mut ws);
        written
    }

    /// The steps of [`File::write_locked`].
    fn write_steps(
        &self,
        ws: &mut WriterState,
        buf: &[u8],
        offset: u64,
        mode: Obey<'_>,
        old: OldBytes,
    ) -> io::Result<Option<(usize, Option<Owed>)>> {
        match self.pay_owed(ws, mode) {
            Throttled::Go => {}
            Throttled::Owes(owed) => return Ok(Some((0, Some(owed)))),
            Throttled::Interrupted => return Err(interrupted_error("write")),
            Throttled::Failed(error) => return Err(error),
        }
        let mut done = 0usize;
        while done < buf.len() {
            let span = StepSpan::new(offset + done as u64, buf.len() - done);
            let Some(bases) = self.old_bytes(&span, old)? else {
                return Ok((done > 0).then_some((done, None)));
            };
            // None: a partial page was evicted after `old_bytes` found it cached; read it now.
            let Some((copied, step)) = self.copy_step(&mut ws.writer, &buf[done..], &span, bases)
            else {
                continue;
            };
            done += copied;
            // The cheap path: a step with nothing for the engine takes no shared lock.
            let outcome =
                if step.needs_engine() { self.throttle(ws, step, mode) } else { Throttled::Go };
            match outcome {
                Throttled::Go => {}
                Throttled::Owes(owed) => return Ok(Some((done, Some(owed)))),
                // What was copied stays in the cache: a short write, as write(2) returns.
                _ if done > 0 => return Ok(Some((done, None))),
                Throttled::Interrupted => return Err(interrupted_error("write")),
                Throttled::Failed(error) => return Err(error),
            }
        }
        Ok(Some((buf.len(), None)))
    }

    /// A write of `len` bytes at `offset` may go ahead: the cache is not draining and the
    /// write ends within the largest offset.
    pub(super) fn check_writable(&self, len: usize, offset: u64) -> io::Result<()> {
        if self.ebb.inner.shared.draining.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                "the ebb cache is draining and accepts no more writes",
            ));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= i64::MAX as u64 => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("write of {len} bytes at {offset} ends past the largest offset"),
            )),
        }
    }

    /// The old bytes of a step's partial first and last pages that are not cached but hold
    /// data (the kernel's write_begin read), read outside the page-map lock. Whole-page steps
    /// (the common case) skip this and take the lock once. `None` where `old` declines a read
    /// that is needed.
    fn old_bytes(
        &self,
        span: &StepSpan,
        old: OldBytes,
    ) -> io::Result<Option<[Option<AlignedBuf>; 2]>> {
        if !span.head_partial && !span.tail_partial {
            return Ok(Some([None, None]));
        }
        let size = self.fs.size.load(Ordering::Acquire);
        let (need_head, need_tail) = {
            let map = self.fs.map.lock();
            let need = |p: u64| map.page(p).is_none() && p * PAGE_SIZE < size;
            (span.head_partial && need(span.first), span.tail_partial && need(span.last))
        };
        if (need_head || need_tail) && old == OldBytes::Decline {
            return Ok(None);
        }
        let head = if need_head { Some(read_page_direct(&self.fs, span.first)?) } else { None };
        let tail = if need_tail { Some(read_page_direct(&self.fs, span.last)?) } else { None };
        Ok(Some([head, tail]))
    }

    /// Dirties the step's pages under the page-map lock (`write_pages`, which may take fewer)
    /// and copies `data` into their frames; a partial page new to the cache starts from its
    /// old bytes (`bases`) or zeros. Returns the bytes copied and the step; `None`, having
    /// dirtied nothing, where a partial page holding data is no longer cached and its old bytes
    /// were not read (it was evicted after [`File::old_bytes`] looked): the caller reads them.
    fn copy_step(
        &self,
        writer: &mut Writer,
        data: &[u8],
        span: &StepSpan,
        bases: [Option<AlignedBuf>; 2],
    ) -> Option<(usize, ebb_core::WriteStep)> {
        let (first, last, pos) = (span.first, span.last, span.pos);
        let mut map = self.fs.map.lock();
        let fresh_head = span.head_partial && map.page(first).is_none();
        let fresh_tail = span.tail_partial && map.page(last).is_none();
        let size = self.fs.size.load(Ordering::Acquire);
        let unread = |fresh: bool, base: &Option<AlignedBuf>, page: u64| {
            fresh && base.is_none() && page * PAGE_SIZE < size
        };
        if unread(fresh_head, &bases[0], first) || unread(fresh_tail, &bases[1], last) {
            return None;
        }
        let step = write_pages(writer, self.inode(), &mut map, first, span.count);
        let frames = &self.ebb.inner.shared.frames;
        let mut copied = 0usize;
        for page in first..first + step.consumed {
            let frame = map.page(page).expect("a page just dirtied is resident").frame;
            let page_start = page * PAGE_SIZE;
            let from = pos.max(page_start);
            let to = span.covered_end.min(page_start + PAGE_SIZE);
            let src = &data[(from - pos) as usize..(to - pos) as usize];
            let base = if page == first && fresh_head {
                Some(bases[0].as_deref())
            } else if page == last && fresh_tail {
                Some(bases[1].as_deref())
            } else {
                None
            };
            frames.with(frame, |bytes| {
                if let Some(base) = base {
                    match base {
                        Some(old) => bytes.copy_from_slice(old),
                        None => bytes.fill(0),
                    }
                }
                let at = (from - page_start) as usize;
                bytes[at..at + src.len()].copy_from_slice(src);
            });
            copied = (to - pos) as usize;
        }
        if copied > 0 {
            self.fs.size.fetch_max(pos + copied as u64, Ordering::AcqRel);
        }
        Some((copied, step))
    }
}
