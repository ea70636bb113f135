//! `AlignedBuf`: an owned byte buffer whose address is 4096-aligned and whose capacity is a
//! whole number of pages, as `O_DIRECT` IO requires.
//!
//! `Vec<u8>` cannot promise its alignment, so this is allocated with `std::alloc` and a
//! `Layout`; it is the only `unsafe` in the crate (with the `madvise` of [`AlignedBuf::huge`]).

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The page size of the ebb cache, and the alignment of [`AlignedBuf`].
pub const PAGE_SIZE: usize = 4096;

/// The size and alignment of a transparent huge page with 4 KiB base pages (x86-64, arm64).
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// An owned, zero-initialised byte buffer aligned to [`PAGE_SIZE`], whose length is a multiple
/// of [`PAGE_SIZE`]. Dereferences to `[u8]`.
pub struct AlignedBuf {
    pointer: NonNull<u8>,
    len: usize,
    layout: Layout,
}

#[expect(unsafe_code, reason = "AlignedBuf owns its bytes like Box<[u8]>, which is Send")]
// SAFETY: the buffer is uniquely owned; no interior mutability, no thread-bound state.
unsafe impl Send for AlignedBuf {}
#[expect(unsafe_code, reason = "AlignedBuf owns its bytes like Box<[u8]>, which is Sync")]
// SAFETY: `&AlignedBuf` only gives `&[u8]`, which is Sync.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to a multiple of [`PAGE_SIZE`] (0 stays 0).
    ///
    /// # Panics
    ///
    /// If the rounded length exceeds `isize::MAX` (like `Vec`). Aborts if the allocator fails.
    pub fn zeroed(len: usize) -> AlignedBuf {
        match AlignedBuf::try_zeroed(len) {
            Some(buf) => buf,
            None => panic!("AlignedBuf of {len} bytes is larger than isize::MAX"),
        }
    }

    /// Like [`AlignedBuf::zeroed`], but `None` when the rounded length exceeds `isize::MAX`.
    pub fn try_zeroed(len: usize) -> Option<AlignedBuf> {
        let len = len.checked_next_multiple_of(PAGE_SIZE)?;
        // A zero-sized allocation is not allowed; an empty buffer still owns one page.
        let layout = Layout::from_size_align(len.max(PAGE_SIZE), PAGE_SIZE).ok()?;
        #[expect(unsafe_code, reason = "std::alloc is the only way to get an aligned block")]
        // SAFETY: `layout` has a non-zero size (at least one page).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(pointer) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        Some(AlignedBuf { pointer, len, layout })
    }

    /// A zeroed buffer of `len` bytes rounded up to a multiple of [`HUGE_PAGE_SIZE`], aligned to
    /// it, whose memory the kernel is asked to back with transparent huge pages before it is
    /// first touched (`madvise(MADV_HUGEPAGE)`; an advice: without THP the buffer is an ordinary
    /// one). An `O_DIRECT` write from a huge page is one physically contiguous scatter-gather
    /// segment instead of one per 4 KiB page: measured on this project's virtio disk
    /// (BENCHMARKS.md, "Runtime"), 1 MiB writes from a huge page ran at 2.2-2.8 GB/s against
    /// 1.7-2.0 from ordinary pages.
    ///
    /// # Panics
    ///
    /// If the rounded length exceeds `isize::MAX`. Aborts if the allocator fails.
    pub fn huge(len: usize) -> AlignedBuf {
        let len = len.max(1).next_multiple_of(HUGE_PAGE_SIZE);
        let layout = match Layout::from_size_align(len, HUGE_PAGE_SIZE) {
            Ok(layout) => layout,
            Err(_) => panic!("AlignedBuf of {len} bytes is larger than isize::MAX"),
        };
        #[expect(unsafe_code, reason = "std::alloc is the only way to get an aligned block")]
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(pointer) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        #[expect(unsafe_code, reason = "madvise takes the address of memory we own")]
        // SAFETY: `raw` is a live allocation of `len` bytes owned here; the advice changes how
        // the kernel backs it, not its contents or validity. Its result is ignored: without
        // THP the buffer is an ordinary one.
        let _ = unsafe { rustix::mm::madvise(raw.cast(), len, rustix::mm::Advice::LinuxHugepage) };
        #[expect(unsafe_code, reason = "initialise the fresh allocation")]
        // SAFETY: `raw` points to `len` writable bytes owned here.
        unsafe {
            std::ptr::write_bytes(raw, 0, len)
        };
        AlignedBuf { pointer, len, layout }
    }

    /// A buffer holding a copy of `bytes`, zero-padded to a page multiple.
    pub fn copy_from(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf[..bytes.len()].copy_from_slice(bytes);
        buf
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        #[expect(unsafe_code, reason = "view of the owned allocation as a slice")]
        // SAFETY: `pointer` is a live allocation of `layout.size() >= len` bytes, zero-initialised
        // at allocation, owned by `self`, and borrowed immutably for the slice's lifetime.
        unsafe {
            std::slice::from_raw_parts(self.pointer.as_ptr(), self.len)
        }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        #[expect(unsafe_code, reason = "view of the owned allocation as a mutable slice")]
        // SAFETY: as in `deref`, and `&mut self` guarantees the slice is the only reference.
        unsafe {
            std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.len)
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        #[expect(unsafe_code, reason = "free the block allocated in try_zeroed or huge")]
        // SAFETY: `pointer` came from `alloc_zeroed` or `alloc` with `self.layout` and is freed
        // only here.
        unsafe {
            alloc::dealloc(self.pointer.as_ptr(), self.layout)
        };
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish_non_exhaustive()
    }
}

/// Whether `bytes` starts at a [`PAGE_SIZE`]-aligned address.
pub(crate) fn is_page_aligned(bytes: &[u8]) -> bool {
    bytes.as_ptr().addr().is_multiple_of(PAGE_SIZE)
}
