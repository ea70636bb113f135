//! Commits of files whose close failed on a `flush_on_close` backend, once their data is
//! written back (issue 34: an S3 upload stranded after an outage).
//!
//! On a `flush_on_close` backend the file's data written back is not the file until the
//! backend's own commit (`BackendFile::sync`; on S3 the CompleteMultipartUpload), which only
//! fsync and close run ([`crate::file::sync_backend_file`]). A close that failed during an
//! outage past the retry deadline leaves the data held; the write-back retries upload it once
//! the server is back, and nothing committed it until the drain at unmount: the object kept
//! its old contents with the new parts on the server. Such a file is remembered here, and
//! once nothing of it is dirty, held or under writeback an IO worker commits it, again after
//! a backoff if that fails.
//!
//! Why here and not in the engine: the backend commit of a flush-on-close backend is already
//! the runtime's (the engine answers a close once the file is written back; the commit after
//! it is `sync_backend_file`, which the engine has no action for), so this adds no policy the
//! engine decides, only when to run that same commit again for a close that could not.
//!
//! Control law: a remembered file is looked at every [`FIRST`] while it still has unwritten
//! pages (the engine's retries write them); once clean it is committed; a failed commit is
//! tried again after [`FIRST`], doubling to [`MOST`]. A file that leaves the cache meanwhile
//! is forgotten here (its backend handle's last drop commits what was written back).

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::Ordering;

use ebb_core::{Duration, InodeId, Instant};
use parking_lot::Mutex;

use super::{Job, Shared};

/// The first retry of a failed commit, and how often a file not yet written back is looked
/// at: the engine's first retry of held pages (`HOLD_BACKOFF_MIN`, 1 s), as a failed commit
/// fails for the same reasons (an outage, a full server).
const FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two commits of one file: the engine's `RETRY_BACKOFF_MAX`.
const MOST: Duration = Duration::from_secs(30);

/// Files waiting for their commit.
#[derive(Default)]
pub(crate) struct Recommits {
    pending: Mutex<BTreeMap<InodeId, Pending>>,
}

struct Pending {
    /// When to look at the file next.
    at: Instant,
    /// The wait after the last failed commit (zero before one failed).
    backoff: Duration,
    /// A commit of it is queued or running.
    running: bool,
}

impl Recommits {
    /// The close of `inode` failed: commit it once it is written back.
    pub(crate) fn add(&self, shared: &Shared, inode: InodeId) {
        let at = shared.now();
        self.pending.lock().entry(inode).or_insert(Pending {
            at,
            backoff: Duration::from_nanos(0),
            running: false,
        });
        shared.wake_timer();
    }

    /// Queues the commit of every file due and written back; the next time to look again.
    /// Called by the timer thread.
    pub(crate) fn start_due(&self, shared: &Shared, now: Instant) -> Option<Instant> {
        let mut pending = self.pending.lock();
        let mut next: Option<Instant> = None;
        pending.retain(|&inode, p| {
            if p.running {
                return true;
            }
            if p.at <= now {
                let Some(fs) = shared.file(inode) else { return false };
                if fs.discarded.load(Ordering::Acquire) {
                    return false;
                }
                let c = fs.map.lock().counts();
                if c.dirty + c.writeback + c.unstable > 0 {
                    p.at = now + FIRST;
                } else {
                    p.running = true;
                    let _ = shared.jobs.send(Job::Recommit { inode });
                    return true;
                }
            }
            next = Some(next.map_or(p.at, |t| t.min(p.at)));
            true
        });
        next
    }

    /// The commit of `inode` ended with `result`: forgotten if it succeeded, else tried again
    /// after the backoff.
    pub(crate) fn done(&self, shared: &Shared, inode: InodeId, result: io::Result<()>) {
        {
            let mut pending = self.pending.lock();
            if result.is_ok() {
                pending.remove(&inode);
                return;
            }
            let Some(p) = pending.get_mut(&inode) else { return };
            let doubled = p.backoff.as_nanos().saturating_mul(2);
            p.backoff = Duration::from_nanos(doubled.clamp(FIRST.as_nanos(), MOST.as_nanos()));
            p.at = shared.now() + p.backoff;
            p.running = false;
        }
        shared.wake_timer();
    }
}
