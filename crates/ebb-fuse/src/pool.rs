//! A fixed set of threads running jobs from a bounded queue.
//!
//! The FUSE request loops hand data operations to pools so that one operation that sleeps (a
//! throttled write, an fsync) holds one pool thread, not a request loop. The queue is bounded:
//! at most `threads + queue` jobs exist at once, and [`Pool::run`] waits for room beyond that.

use std::io;
use std::thread;

use crossbeam::channel::{Sender, bounded};

type Job = Box<dyn FnOnce() + Send>;

/// Threads running jobs; dropping the pool lets them finish the queued jobs and exit.
pub(crate) struct Pool {
    sender: Sender<Job>,
}

impl Pool {
    pub(crate) fn new(name: &str, threads: usize, queue: usize) -> io::Result<Pool> {
        let (sender, receiver) = bounded::<Job>(queue);
        for index in 0..threads {
            let receiver = receiver.clone();
            thread::Builder::new().name(format!("{name}-{index}")).spawn(move || {
                for job in receiver {
                    job();
                }
            })?;
        }
        Ok(Pool { sender })
    }

    /// Runs `job` on a pool thread, waiting while the queue is full.
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) {
        // The receivers live as long as their threads, which only end when the pool is dropped.
        if let Err(unsent) = self.sender.send(Box::new(job)) {
            (unsent.into_inner())();
        }
    }
}
