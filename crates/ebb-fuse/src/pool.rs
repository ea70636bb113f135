//! A fixed set of threads running jobs from a bounded queue.
//!
//! The FUSE request loops hand data operations to pools so that one operation that sleeps (an
//! fsync, a read that misses the cache) holds one pool thread, not a request loop. The queue is
//! bounded: at most `threads + queue` jobs exist at once, and [`Pool::run`] waits for room
//! beyond that. Jobs that were parked and are woken again (a throttled write whose pause ended,
//! [`Pool::resume`]) go on a second queue that never blocks its sender (a waker may run under
//! the cache's lock or on its alarm thread); it holds at most one job per parked request, and
//! the threads take from it first.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;

use crossbeam::channel::{Receiver, Sender, bounded, select, unbounded};

type Job = Box<dyn FnOnce() + Send>;

/// Threads running jobs; dropping the pool lets them finish the queued jobs and exit.
pub(crate) struct Pool {
    sender: Sender<Job>,
    resumed: Sender<Job>,
    /// Threads waiting for a job.
    idle: Arc<AtomicUsize>,
    /// Jobs given to the pool so far (`RequestCounts`' hand-offs).
    jobs: Arc<AtomicU64>,
}

impl Pool {
    /// `threads` threads named `name-N`, `queue` jobs queued at most beyond them; `jobs`
    /// counts the jobs given.
    pub(crate) fn new(
        name: &str,
        threads: usize,
        queue: usize,
        jobs: Arc<AtomicU64>,
    ) -> io::Result<Pool> {
        let (sender, receiver) = bounded::<Job>(queue);
        let (resumed, resumed_rx) = unbounded::<Job>();
        let idle = Arc::new(AtomicUsize::new(threads));
        for index in 0..threads {
            let (receiver, resumed_rx) = (receiver.clone(), resumed_rx.clone());
            let idle = Arc::clone(&idle);
            thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || work(&receiver, &resumed_rx, &idle))?;
        }
        Ok(Pool { sender, resumed, idle, jobs })
    }

    /// Whether a job given now would wait for a thread (every thread busy, or jobs queued).
    /// A hint: it may change as soon as it is read.
    pub(crate) fn would_wait(&self) -> bool {
        self.idle.load(Ordering::Relaxed) == 0 || !self.sender.is_empty()
    }

    /// Runs `job` on a pool thread, waiting while the queue is full.
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.jobs.fetch_add(1, Ordering::Relaxed);
        // The receivers live as long as their threads, which only end when the pool is dropped.
        if let Err(unsent) = self.sender.send(Box::new(job)) {
            (unsent.into_inner())();
        }
    }

    /// Runs a woken job on a pool thread before new ones, without waiting.
    pub(crate) fn resume(&self, job: impl FnOnce() + Send + 'static) {
        self.jobs.fetch_add(1, Ordering::Relaxed);
        if let Err(unsent) = self.resumed.send(Box::new(job)) {
            (unsent.into_inner())();
        }
    }
}

/// A pool thread: woken jobs first, until both queues are closed.
fn work(receiver: &Receiver<Job>, resumed: &Receiver<Job>, idle: &AtomicUsize) {
    let busy = |job: Job| {
        idle.fetch_sub(1, Ordering::Relaxed);
        job();
        idle.fetch_add(1, Ordering::Relaxed);
    };
    loop {
        if let Ok(job) = resumed.try_recv() {
            busy(job);
            continue;
        }
        let job = select! {
            recv(resumed) -> job => job,
            recv(receiver) -> job => job,
        };
        match job {
            Ok(job) => busy(job),
            // One queue is closed: the pool is gone; finish what the other holds.
            Err(_) => {
                for job in resumed.try_iter().chain(receiver.try_iter()) {
                    job();
                }
                return;
            }
        }
    }
}

/// Copies of write requests' data, within a bound in bytes.
///
/// A write request's bytes live in the request loop's receive buffer, so the loop copies them
/// before a write that must wait (a throttled writer's pause, memory, a page under writeback)
/// leaves the loop. Every such writer holds one copy until its wait ends: with 256 writers
/// throttled at once, 263 copies of 64 KiB were alive (heaptrack, a `--memory 64MiB` mount:
/// about 16 MB beside the 8 MiB the budget sets aside for them, VmHWM 71.4 MB). So the bytes
/// of copies alive, spare ones included, are bounded (`limit`, the budget's part for them): a
/// loop that needs a copy beyond it waits until one comes back, and the writer's data stays in
/// the kernel's request meanwhile (the kernel holds it until answered, and drops the request of
/// a writer killed while it is unread).
///
/// Why the wait ends. A copy is held by a write on a pool thread or parked in its waker, and
/// none of those waits for a request the loops have not read yet: a throttle pause ends at its
/// time (the cache's alarm thread), memory and pages under writeback are freed by writeback
/// (the IO threads) and reclaim, the granule gate gives an idle file's place away after
/// `GATE_IDLE` (1 s), and a parked writer being killed is answered by the sweeper. Only a
/// backend that accepts nothing keeps them all: a loop that has waited [`COPY_WAIT_MS`] takes a
/// copy beyond the bound rather than stop serving every other request of the mount (counted
/// in `beyond`, shown by `ebb stat` under `fuse.copies`).
///
/// Buffers come back here when their write ends and are kept as spares while they fit the
/// bound: a fresh large allocation is mapped, faulted in and unmapped each time, and once glibc
/// has freed one such mapping it serves the next ones from its arenas instead, which keep freed
/// memory (measured with 1 MiB copies and 16 writers: peak RSS 391-403 MiB for a 256 MiB
/// budget, 313 MiB with a fixed mmap threshold).
pub(crate) struct DataBufs {
    state: parking_lot::Mutex<CopyState>,
    freed: parking_lot::Condvar,
    /// Largest request, bytes.
    size: usize,
    /// Bytes of copies alive and spare at most.
    limit: usize,
    /// How long a copy waits for room before it is taken beyond `limit`.
    wait: std::time::Duration,
    /// What the copies did, for `ebb stat`.
    pub(crate) stats: CopyStats,
}

struct CopyState {
    /// Bytes of the copies alive and the spares (within `limit`, but for copies beyond it).
    held: usize,
    spare: Vec<Vec<u8>>,
}

/// How long a request loop waits for a copy to come back before it takes one beyond the bound,
/// ms (ebb's choice: ten of the throttle's longest pauses, 200 ms, so a pause always ends
/// first). A test that must see a wait end by itself sets it longer.
static COPY_WAIT_MS: AtomicU64 = AtomicU64::new(2000);

/// [`COPY_WAIT_MS`] for the mounts started from now on.
#[cfg(test)]
pub(crate) fn set_copy_wait(wait: std::time::Duration) {
    COPY_WAIT_MS.store(wait.as_millis() as u64, Ordering::Relaxed);
}

/// The copies' counters.
#[derive(Default)]
pub(crate) struct CopyStats {
    /// The most bytes held at once (alive and spare).
    peak: AtomicU64,
    /// Copies a loop waited for.
    waits: AtomicU64,
    /// Copies taken beyond the bound after [`COPY_WAIT_MS`].
    beyond: AtomicU64,
}

/// A buffer's bytes as the bound counts them: its length in whole pages.
fn bytes_for(len: usize) -> usize {
    len.max(1).next_multiple_of(4096)
}

impl DataBufs {
    /// Copies of requests of up to `size` bytes, `limit` bytes of them at most (at least one
    /// copy of `size`).
    pub(crate) fn new(size: usize, limit: usize) -> Arc<DataBufs> {
        Arc::new(DataBufs {
            state: parking_lot::Mutex::new(CopyState { held: 0, spare: Vec::new() }),
            freed: parking_lot::Condvar::new(),
            size,
            limit: limit.max(bytes_for(size)),
            wait: std::time::Duration::from_millis(COPY_WAIT_MS.load(Ordering::Relaxed)),
            stats: CopyStats::default(),
        })
    }

    /// A copy of `data`: a spare buffer that holds it, or a new one once the bound has room
    /// (spares that are too small are freed for it), waiting for one to come back if not, and
    /// for at most [`COPY_WAIT_MS`].
    pub(crate) fn copy(self: &Arc<Self>, data: &[u8]) -> DataBuf {
        let need = bytes_for(data.len());
        let mut waited = None;
        let mut st = self.state.lock();
        // A spare, or `None`: a new buffer, allocated once the lock is let go.
        let (spare, counted) = loop {
            // The smallest spare that holds it.
            let fit = st
                .spare
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= data.len())
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = fit {
                break (Some(st.spare.swap_remove(i)), true);
            }
            while st.held + need > self.limit && !st.spare.is_empty() {
                let buf = st.spare.pop().expect("not empty");
                st.held -= bytes_for(buf.capacity());
            }
            // A request larger than the bound (none is: the kernel's are at most `size`)
            // goes alone.
            if st.held + need <= self.limit || st.held == 0 {
                st.held += need;
                self.stats.peak.fetch_max(st.held as u64, Ordering::Relaxed);
                break (None, true);
            }
            let deadline = *waited.get_or_insert_with(|| {
                self.stats.waits.fetch_add(1, Ordering::Relaxed);
                std::time::Instant::now() + self.wait
            });
            if self.freed.wait_until(&mut st, deadline).timed_out() {
                self.stats.beyond.fetch_add(1, Ordering::Relaxed);
                break (None, false);
            }
        };
        drop(st);
        let mut buf = spare.unwrap_or_else(|| Vec::with_capacity(need));
        buf.clear();
        buf.extend_from_slice(data);
        DataBuf { buf, counted, home: Arc::clone(self) }
    }

    /// Bytes of copies alive and spare now.
    pub(crate) fn held(&self) -> usize {
        self.state.lock().held
    }

    /// `{"limit": BYTES, "held": BYTES, "peak": BYTES, "waits": N, "beyond": N}`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let load = |count: &AtomicU64| count.load(Ordering::Relaxed);
        serde_json::json!({
            "limit": self.limit,
            "held": self.held(),
            "peak": load(&self.stats.peak),
            "waits": load(&self.stats.waits),
            "beyond": load(&self.stats.beyond),
        })
    }
}

/// A write request's data ([`DataBufs::copy`]); its buffer goes back when dropped.
pub(crate) struct DataBuf {
    buf: Vec<u8>,
    /// Inside the bound (false: taken beyond it, freed when dropped).
    counted: bool,
    home: Arc<DataBufs>,
}

impl std::ops::Deref for DataBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for DataBuf {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        let mut st = self.home.state.lock();
        if buf.capacity() <= self.home.size.max(4096) {
            st.spare.push(buf);
        } else {
            st.held -= bytes_for(buf.capacity());
        }
        drop(st);
        self.home.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn data_buffers_are_reused_and_bounded() {
        let bufs = DataBufs::new(8192, 3 * 4096);
        let a = bufs.copy(b"abc");
        let first = a.as_ptr();
        assert_eq!(&*a, b"abc");
        drop(a);
        let b = bufs.copy(b"defg");
        assert_eq!((&*b, b.as_ptr()), (&b"defg"[..], first), "the spare is reused");
        let c = bufs.copy(&[7u8; 8192]);
        assert_eq!(bufs.held(), 3 * 4096, "one page and two");
        drop(c);
        // Two pages spare and one alive: a request of two pages takes the spare.
        let d = bufs.copy(&[8u8; 5000]);
        assert_eq!((d.len(), bufs.held()), (5000, 3 * 4096));
        drop((b, d));
        // The smallest spare that holds it.
        let e = bufs.copy(b"x");
        assert_eq!((e.as_ptr(), bufs.held()), (first, 3 * 4096));
        drop(e);
        assert_eq!(bufs.to_json()["beyond"], 0);
    }

    // A copy beyond the bound waits until one comes back, and gets that one's room. Before the
    // bound every waiting writer held a copy of its own however many there were.
    #[test]
    fn a_copy_beyond_the_bound_waits_for_one_to_come_back() {
        let bufs = DataBufs::new(4096, 2 * 4096);
        let bufs = Arc::new(DataBufs { wait: Duration::from_secs(3600), ..into_inner(bufs) });
        let (a, b) = (bufs.copy(&[1; 4096]), bufs.copy(&[2; 4096]));
        let waiter = {
            let bufs = Arc::clone(&bufs);
            std::thread::spawn(move || bufs.copy(&[3; 4096])[0])
        };
        let start = Instant::now();
        while bufs.stats.waits.load(Ordering::Relaxed) == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "the third copy never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(bufs.held(), 2 * 4096);
        drop(a);
        assert_eq!(waiter.join().unwrap(), 3);
        drop(b);
        let json = bufs.to_json();
        assert_eq!((json["waits"].as_u64(), json["beyond"].as_u64()), (Some(1), Some(0)));
        assert_eq!(json["peak"].as_u64(), Some(2 * 4096), "never above the bound");
    }

    // A copy that found no room for its whole wait is taken beyond the bound, and counted, so a
    // backend that accepts nothing never stops the loops for good.
    #[test]
    fn a_copy_that_waited_too_long_is_taken_beyond_the_bound() {
        let bufs = DataBufs::new(4096, 4096);
        let bufs = Arc::new(DataBufs { wait: Duration::from_millis(10), ..into_inner(bufs) });
        let held = bufs.copy(b"held");
        let beyond = bufs.copy(b"beyond");
        assert_eq!((&*held, &*beyond), (&b"held"[..], &b"beyond"[..]));
        assert_eq!(bufs.to_json()["beyond"], 1);
        drop(beyond);
        assert_eq!(bufs.held(), 4096, "the one beyond is freed, not kept");
    }

    fn into_inner(bufs: Arc<DataBufs>) -> DataBufs {
        Arc::into_inner(bufs).expect("only one")
    }

    // A spare too small for a request is freed to make room for it.
    #[test]
    fn small_spares_are_freed_for_a_larger_copy() {
        let bufs = DataBufs::new(8192, 2 * 4096);
        drop((bufs.copy(b"a"), bufs.copy(b"b")));
        assert_eq!(bufs.held(), 2 * 4096, "two spares of one page");
        let big = bufs.copy(&[9; 8192]);
        assert_eq!((big.len(), bufs.held()), (8192, 2 * 4096));
    }
}
