//! `AlignedBuf`: an owned byte buffer whose address is 4096-aligned and whose capacity is a
//! whole number of pages, as `O_DIRECT` IO requires.
//!
//! `Vec<u8>` cannot promise its alignment, so this is allocated with `std::alloc` and a
//! `Layout`, or (a huge-page buffer, [`AlignedBuf::huge`]) as a mapping of its own; it holds
//! most of the crate's `unsafe`.

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
    /// Where the bytes came from, so that `Drop` gives them back there.
    source: Source,
}

/// How an [`AlignedBuf`]'s bytes were allocated.
enum Source {
    /// `std::alloc` with this layout.
    Heap(Layout),
    /// An anonymous mapping of exactly the buffer's bytes ([`AlignedBuf::huge`]).
    Mapped,
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
        Some(AlignedBuf { pointer, len, source: Source::Heap(layout) })
    }

    /// A zeroed buffer of `len` bytes rounded up to a multiple of [`HUGE_PAGE_SIZE`], aligned to
    /// it, whose memory the kernel is asked to back with transparent huge pages
    /// (`madvise(MADV_HUGEPAGE)`; an advice: without THP the buffer is an ordinary one). An
    /// `O_DIRECT` write from a huge page is one physically contiguous scatter-gather segment
    /// instead of one per 4 KiB page: measured on this project's virtio disk (BENCHMARKS.md,
    /// "Runtime"), 1 MiB writes from a huge page ran at 2.2-2.8 GB/s against 1.7-2.0 from
    /// ordinary pages, and a device that takes at most 254 segments a request (virtio's
    /// usual limit) gets a write from ordinary pages in requests of 1016 KiB, whatever its
    /// `max_sectors_kb`.
    ///
    /// The buffer is a fresh anonymous mapping of its own, advised before any of its pages
    /// exists, then populated (`MADV_POPULATE_WRITE`; without it, Linux before 5.14, the
    /// pages fault in at first use). The kernel gives a huge page only to a 2 MiB range none
    /// of whose pages are present yet, so memory from `malloc` does not do: glibc serves a
    /// large request from an arena once a freed block has raised its mapping threshold
    /// (up to 32 MiB), and an arena's memory has usually been touched already, in 4 KiB
    /// pages (by its earlier blocks or its own bookkeeping), which the advice leaves as they
    /// are.
    ///
    /// # Panics
    ///
    /// If the rounded length exceeds `isize::MAX`. Aborts if the memory cannot be mapped.
    pub fn huge(len: usize) -> AlignedBuf {
        let len = len.max(1).next_multiple_of(HUGE_PAGE_SIZE);
        let layout = match Layout::from_size_align(len, HUGE_PAGE_SIZE) {
            Ok(layout) => layout,
            Err(_) => panic!("AlignedBuf of {len} bytes is larger than isize::MAX"),
        };
        // Map a huge page more than needed, keep the aligned `len` bytes inside, unmap the rest.
        let Some(span) = len.checked_add(HUGE_PAGE_SIZE) else { alloc::handle_alloc_error(layout) };
        let prot = rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE;
        #[expect(unsafe_code, reason = "a new anonymous mapping, at an address the kernel picks")]
        // SAFETY: a null hint lets the kernel choose the address, so no existing memory is
        // replaced.
        let mapped = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                span,
                prot,
                rustix::mm::MapFlags::PRIVATE,
            )
        };
        let Ok(raw) = mapped else { alloc::handle_alloc_error(layout) };
        let raw = raw.cast::<u8>();
        let head = raw.addr().next_multiple_of(HUGE_PAGE_SIZE) - raw.addr();
        #[expect(unsafe_code, reason = "unmap the parts of our own mapping outside the buffer")]
        // SAFETY: `raw..raw + span` is the mapping made above, used by nothing yet; `head` and
        // `span - head - len` are whole pages (the mapping is page-aligned) and lie inside it.
        // A failure to unmap only leaves those bytes mapped.
        let start = unsafe {
            if head > 0 {
                let _ = rustix::mm::munmap(raw.cast(), head);
            }
            let start = raw.add(head);
            if span - head > len {
                let _ = rustix::mm::munmap(start.add(len).cast(), span - head - len);
            }
            start
        };
        #[expect(unsafe_code, reason = "madvise takes the address of memory we own")]
        // SAFETY: `start..start + len` is mapped and owned here; the advice changes how the
        // kernel backs it (huge pages, present), not its contents (zeros) or validity. Their
        // results are ignored: without THP the buffer is an ordinary one, and without
        // MADV_POPULATE_WRITE its pages fault in at first use.
        unsafe {
            let _ = rustix::mm::madvise(start.cast(), len, rustix::mm::Advice::LinuxHugepage);
            let _ = rustix::mm::madvise(start.cast(), len, rustix::mm::Advice::LinuxPopulateWrite);
        }
        let Some(pointer) = NonNull::new(start) else { alloc::handle_alloc_error(layout) };
        AlignedBuf { pointer, len, source: Source::Mapped }
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
        // SAFETY: `pointer` is a live allocation (or mapping) of at least `len` bytes,
        // zero-initialised at allocation, owned by `self`, and borrowed immutably for the
        // slice's lifetime.
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
        match self.source {
            #[expect(unsafe_code, reason = "free the block allocated in try_zeroed")]
            // SAFETY: `pointer` came from `alloc_zeroed` with this layout and is freed only here.
            Source::Heap(layout) => unsafe { alloc::dealloc(self.pointer.as_ptr(), layout) },
            #[expect(unsafe_code, reason = "unmap the mapping made in huge")]
            // SAFETY: `pointer..pointer + len` is the mapping kept in `huge`, unmapped only
            // here; no reference into it outlives `self`. A failure leaves it mapped.
            Source::Mapped => unsafe {
                let _ = rustix::mm::munmap(self.pointer.as_ptr().cast(), self.len);
            },
        }
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
