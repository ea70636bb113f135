//! The IO threads' buffers, inside the memory budget.
//!
//! A write copies its run out of the cache's frames into a buffer before it goes to the backend
//! (and a read fills one before its bytes go into frames), so the bytes of the writes in flight
//! are held twice. Those buffers are part of `--memory`: at `build` the runtime sets aside
//! [`reserve`] bytes of the budget for them and gives the engine the rest (its frames, so its
//! dirtyable memory and thresholds, derive from that, as the kernel's exclude memory it cannot
//! use for the page cache). This pool never holds more than the reserve: buffers in use plus
//! spare ones kept for reuse (a large aligned allocation is otherwise mapped, faulted in and
//! unmapped for every write). A thread that needs a buffer the reserve has no room for first
//! frees spare ones, then waits for one in use to come back; every buffer in use belongs to a
//! write or read in progress (or queued in a lane whose driver is writing), so it comes back.
//! Reads have a pool of their own when the budget has room for one ([`read_reserve`], up to
//! 1 MiB in page-sized buffers), so a read never waits for a write to give a buffer back (with
//! S3's 8 MiB parts, eight uploads hold the whole writes' pool for as long as they take).
//! Reads are cut to their pool and writes are at most the largest write, which the reserve
//! covers, with one exception: an S3 file's parts double in size every 1000 parts (past 8 GB
//! of one file with 8 MiB parts), and a part is one write. A buffer larger than the reserve is
//! taken once every other buffer has come back and the spares are freed: it is the only one,
//! and the budget is exceeded by its size less the reserve while it lives (not yet bounded).

use ebb_backend::{AlignedBuf, HUGE_PAGE_SIZE};
use parking_lot::{Condvar, Mutex};

/// Granularity of ordinary buffers, bytes (512 KiB: the default largest write, so a thread's
/// buffer rarely needs replacing).
pub(crate) const GRAIN: usize = 128 * 4096;

/// The reserve's share of the budget when the largest writes fit several times: a quarter
/// (ebb's own choice: 8 writes of 8 MiB S3 parts in flight in a 256 MiB budget), never less
/// than one largest buffer nor more than one per IO thread.
const RESERVE_DIVISOR: u64 = 4;

/// The reads' own pool, at most this share of the budget: 1/64 (ebb's own: 4 MiB of 256).
const READ_RESERVE_DIVISOR: u64 = 64;
/// The reads' own pool, at most (one largest NFS READ, or eight 128 KiB readahead windows).
const READ_RESERVE_MAX: u64 = 1 << 20;

/// The bytes of the budget set aside for the reads' own buffers, beside the writes' `reserve`:
/// `budget / 64`, at most 1 MiB, and no more than the budget leaves above the writes' buffers
/// and the smallest cache (`min_cache`); whole pages. 0 when there is no room: then reads take
/// their buffers from the writes' pool, and may wait for a write to give one back.
pub(crate) fn read_reserve(budget: u64, reserve: u64, min_cache: u64) -> u64 {
    let room = budget.saturating_sub(reserve + min_cache);
    let page = ebb_core::PAGE_SIZE;
    (budget / READ_RESERVE_DIVISOR).min(READ_RESERVE_MAX).min(room) / page * page
}

/// The bytes of the budget set aside for IO buffers: `budget / 4`, at least the largest buffer
/// (`largest`, bytes, as allocated), at most `io_threads` of them; whole pages.
pub(crate) fn reserve(budget: u64, largest: u64, io_threads: usize) -> u64 {
    let most = largest.saturating_mul(io_threads.max(1) as u64);
    let page = ebb_core::PAGE_SIZE;
    ((budget / RESERVE_DIVISOR).clamp(largest, most.max(largest))).next_multiple_of(page)
}

/// The bytes a buffer for `len` bytes takes (huge-page buffers round to 2 MiB).
pub(crate) fn alloc_size(len: usize, huge: bool) -> usize {
    if huge {
        len.max(1).next_multiple_of(HUGE_PAGE_SIZE)
    } else {
        len.max(1).next_multiple_of(GRAIN)
    }
}

pub(crate) struct BufPool {
    limit: usize,
    /// Ordinary buffers are allocated in multiples of this ([`GRAIN`], or a page for reads).
    grain: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

struct PoolState {
    /// Bytes of every buffer allocated and not dropped (in use or spare).
    held: usize,
    /// The most `held` has been.
    peak: usize,
    spare: Vec<AlignedBuf>,
}

impl BufPool {
    /// A pool of at most `limit` bytes.
    pub(crate) fn new(limit: usize) -> BufPool {
        BufPool::with_grain(limit, GRAIN)
    }

    /// A pool of at most `limit` bytes whose ordinary buffers are multiples of `grain` bytes.
    pub(crate) fn with_grain(limit: usize, grain: usize) -> BufPool {
        BufPool {
            limit,
            grain: grain.max(1),
            state: Mutex::new(PoolState { held: 0, peak: 0, spare: Vec::new() }),
            freed: Condvar::new(),
        }
    }

    /// The most bytes one buffer may have.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// The most bytes the pool has held at once.
    pub(crate) fn peak(&self) -> usize {
        self.state.lock().peak
    }

    /// A buffer of at least `len` bytes (at most [`BufPool::limit`]): a spare one, or a new one
    /// (huge-page backed if `huge`) once the pool has room, waiting for one to come back if not.
    pub(crate) fn take(&self, len: usize, huge: bool) -> AlignedBuf {
        // A huge-page buffer the pool has no room for is an ordinary one.
        let huge = huge && alloc_size(len, true) <= self.limit;
        let size =
            if huge { alloc_size(len, true) } else { len.max(1).next_multiple_of(self.grain) };
        let size = size.min(self.limit.max(len));
        let mut st = self.state.lock();
        loop {
            if let Some(i) = st.spare.iter().position(|b| b.len() >= len) {
                return st.spare.swap_remove(i);
            }
            while st.held + size > self.limit && !st.spare.is_empty() {
                let b = st.spare.pop().expect("not empty");
                st.held -= b.len();
            }
            // Larger than the whole pool (a grown S3 part): alone (see the module doc).
            if st.held + size <= self.limit || st.held == 0 {
                st.held += size;
                st.peak = st.peak.max(st.held);
                drop(st);
                return if huge { AlignedBuf::huge(size) } else { AlignedBuf::zeroed(size) };
            }
            self.freed.wait(&mut st);
        }
    }

    /// Gives a buffer back; it is kept as a spare (its bytes stay counted until a thread that
    /// needs room frees it).
    pub(crate) fn give(&self, buf: AlignedBuf) {
        self.state.lock().spare.push(buf);
        self.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_is_a_quarter_within_one_and_all_threads_buffers() {
        let mib = 1 << 20;
        assert_eq!(reserve(256 * mib, 8 * mib, 8), 64 * mib);
        assert_eq!(reserve(16 * mib, 8 * mib, 8), 8 * mib, "at least one largest buffer");
        assert_eq!(reserve(1 << 40, 2 * mib, 8), 16 * mib, "at most one per thread");
    }

    #[test]
    fn the_reads_pool_fits_beside_the_smallest_cache() {
        let mib = 1 << 20;
        assert_eq!(read_reserve(256 * mib, 64 * mib, 4 * mib), mib, "1 MiB at most");
        assert_eq!(read_reserve(32 * mib, 8 * mib, 4 * mib), mib / 2, "a 64th of the budget");
        assert_eq!(read_reserve(6 * mib, 2 * mib, 4 * mib), 0, "no room: the writes' pool");
        let pool = BufPool::with_grain(64 << 10, 4096);
        assert_eq!(pool.take(4096, false).len(), 4096, "page-sized read buffers");
    }

    #[test]
    fn spares_make_room_and_the_pool_stays_within_its_limit() {
        let pool = BufPool::new(4 * GRAIN);
        let a = pool.take(GRAIN, false);
        let b = pool.take(GRAIN, false);
        pool.give(a);
        pool.give(b);
        // Two spares of one grain cannot serve three grains: they are freed to make room.
        let c = pool.take(3 * GRAIN, false);
        assert!(c.len() >= 3 * GRAIN);
        pool.give(c);
        let d = pool.take(GRAIN, false);
        assert!(d.len() >= GRAIN, "a larger spare serves a smaller need");
        assert!(pool.peak() <= 4 * GRAIN, "peak {}", pool.peak());
    }

    #[test]
    fn a_taker_waits_for_a_buffer_to_come_back() {
        let pool = std::sync::Arc::new(BufPool::new(2 * GRAIN));
        let held = pool.take(2 * GRAIN, false);
        let p = pool.clone();
        let t = std::thread::spawn(move || p.take(GRAIN, false).len());
        std::thread::sleep(std::time::Duration::from_millis(20));
        pool.give(held);
        assert!(t.join().expect("taker") >= GRAIN);
        assert!(pool.peak() <= 2 * GRAIN);
    }
}
