//! The data of the cache: one 4 KiB buffer per frame of the memory budget.
//!
//! The core hands out [`FrameId`]s; this pool holds the bytes behind them. Each frame has its
//! own lock, held only for a copy, so the pool needs no unsafe code and a wrong access pattern
//! could at worst copy stale bytes, never corrupt memory. Who may touch a frame follows from the
//! page states the core keeps:
//!
//! * a writer copies into the frames of pages it just dirtied, under the file's page-map lock,
//!   so the flusher cannot start writeback of those pages before the bytes are in;
//! * a page under writeback is never dirtied again until the write completes (writers wait for
//!   it: stable pages), so an IO thread copies its frame out without the page-map lock;
//! * a read's frames belong to the read alone until [`ebb_core::Event::ReadDone`] links them into
//!   the page map.
//!
//! Buffers are allocated on first use, so an idle cache costs only the table (24 bytes a frame).

use ebb_core::{FrameId, PAGE_SIZE};
use parking_lot::Mutex;

const PAGE: usize = PAGE_SIZE as usize;

/// A frame's bytes, allocated on first use.
type Frame = Mutex<Option<Box<[u8]>>>;

pub(crate) struct FramePool {
    frames: Box<[Frame]>,
}

impl FramePool {
    pub(crate) fn new(count: u64) -> FramePool {
        FramePool { frames: (0..count).map(|_| Mutex::new(None)).collect() }
    }

    /// Runs `f` on the frame's bytes (zeroed when first used).
    pub(crate) fn with<R>(&self, frame: FrameId, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut slot = self.frames[frame.0 as usize].lock();
        let buf = slot.get_or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
        f(buf)
    }

    /// Copies `src` into the frame at byte `offset`.
    pub(crate) fn write(&self, frame: FrameId, offset: usize, src: &[u8]) {
        self.with(frame, |buf| buf[offset..offset + src.len()].copy_from_slice(src));
    }

    /// Copies the frame's bytes from `offset` into `dst`.
    pub(crate) fn read(&self, frame: FrameId, offset: usize, dst: &mut [u8]) {
        let slot = self.frames[frame.0 as usize].lock();
        match slot.as_deref() {
            Some(buf) => dst.copy_from_slice(&buf[offset..offset + dst.len()]),
            None => dst.fill(0),
        }
    }
}
