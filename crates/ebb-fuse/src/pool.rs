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

/// Copies of write requests' data, recycled.
///
/// A write request's bytes live in the request loop's receive buffer, so the loop copies them
/// before handing the write to a pool thread. A fresh 1 MiB allocation per request (the size
/// requests had then) is mapped,
/// faulted in and unmapped each time, and once glibc has freed one such mapping it serves the
/// next ones from its arenas instead, which keep freed memory: with 16 writers at once the
/// mount's resident memory grew past its budget by about 80 MiB that way (measured: peak RSS
/// 391-403 MiB for a 256 MiB budget, 313 MiB with a fixed mmap threshold). Buffers come back
/// here when their write ends; at most `keep` spares are kept, as many as writes can be in
/// flight at once, so the copies cost a bounded, steady amount of memory.
pub(crate) struct DataBufs {
    spare: parking_lot::Mutex<Vec<Vec<u8>>>,
    size: usize,
    keep: usize,
}

impl DataBufs {
    /// Buffers of `size` bytes (a larger copy gets its own, not kept), `keep` spares at most.
    pub(crate) fn new(size: usize, keep: usize) -> std::sync::Arc<DataBufs> {
        std::sync::Arc::new(DataBufs { spare: parking_lot::Mutex::new(Vec::new()), size, keep })
    }

    /// A copy of `data`.
    pub(crate) fn copy(self: &std::sync::Arc<Self>, data: &[u8]) -> DataBuf {
        let spare = if data.len() <= self.size { self.spare.lock().pop() } else { None };
        let mut buf = spare.unwrap_or_else(|| Vec::with_capacity(self.size.max(data.len())));
        buf.clear();
        buf.extend_from_slice(data);
        DataBuf { buf, home: std::sync::Arc::clone(self) }
    }
}

/// A write request's data ([`DataBufs::copy`]); its buffer goes back when dropped.
pub(crate) struct DataBuf {
    buf: Vec<u8>,
    home: std::sync::Arc<DataBufs>,
}

impl std::ops::Deref for DataBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for DataBuf {
    fn drop(&mut self) {
        if self.buf.capacity() == self.home.size {
            let mut spare = self.home.spare.lock();
            if spare.len() < self.home.keep {
                spare.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_buffers_are_reused_and_bounded() {
        let bufs = DataBufs::new(1024, 2);
        let a = bufs.copy(b"abc");
        let first = a.as_ptr();
        assert_eq!(&*a, b"abc");
        drop(a);
        let b = bufs.copy(b"defg");
        assert_eq!((&*b, b.as_ptr()), (&b"defg"[..], first), "the spare is reused");
        let c = bufs.copy(b"x");
        let d = bufs.copy(b"y");
        let big = bufs.copy(&[7u8; 2048]);
        assert_eq!(big.len(), 2048);
        drop((b, c, d, big));
        assert_eq!(bufs.spare.lock().len(), 2, "at most `keep` spares, none of another size");
    }
}
