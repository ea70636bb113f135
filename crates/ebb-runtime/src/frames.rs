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
//! Buffers are allocated on first use, a slab of 256 frames (1 MiB) at a time: one allocation
//! per frame would cost a heap-growing system call per 4 KiB write (measured: 20 us per write
//! with per-frame allocation, see BENCHMARKS.md). An idle cache costs only the slab table.

use std::sync::OnceLock;

use ebb_core::{FrameId, PAGE_SIZE};
use parking_lot::Mutex;

const PAGE: usize = PAGE_SIZE as usize;
const SLAB_FRAMES: usize = 256;

/// 256 frames, each behind its own lock.
type Slab = Box<[Mutex<[u8; PAGE]>]>;

pub(crate) struct FramePool {
    slabs: Box<[OnceLock<Slab>]>,
}

impl FramePool {
    pub(crate) fn new(count: u64) -> FramePool {
        let slabs = (count as usize).div_ceil(SLAB_FRAMES);
        FramePool { slabs: (0..slabs).map(|_| OnceLock::new()).collect() }
    }

    fn frame(&self, frame: FrameId) -> &Mutex<[u8; PAGE]> {
        let i = frame.index();
        let slab = self.slabs[i / SLAB_FRAMES]
            .get_or_init(|| (0..SLAB_FRAMES).map(|_| Mutex::new([0u8; PAGE])).collect());
        &slab[i % SLAB_FRAMES]
    }

    /// Runs `f` on the frame's bytes.
    pub(crate) fn with<R>(&self, frame: FrameId, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.frame(frame).lock()[..])
    }

    /// Copies `src` into the frame at byte `offset`.
    pub(crate) fn write(&self, frame: FrameId, offset: usize, src: &[u8]) {
        self.frame(frame).lock()[offset..offset + src.len()].copy_from_slice(src);
    }

    /// Copies the frame's bytes from `offset` into `dst`.
    pub(crate) fn read(&self, frame: FrameId, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.frame(frame).lock()[offset..offset + dst.len()]);
    }
}
