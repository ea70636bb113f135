//! The modification and change times of files ebb caches, kept by ebb because the backing
//! file's own move when ebb writes the data back, later than the write that changed it.
//!
//! POSIX sets a file's mtime and ctime when `write(2)` or `truncate(2)` returns, keeps an
//! mtime set by `utimes(2)`, and knows nothing of writeback. The backing filesystem sets its
//! file's mtime and ctime whenever ebb writes back to it (seconds later, or at `fsync`), which
//! would overwrite an mtime that `cp -p`, `tar x` or `touch -d` set. So for a file written
//! through the mount, ebb keeps both times itself ([`FileTimes`]): a write or truncate through
//! the mount sets them to now, a `utimes` to the time asked for (ctime to the backing file's
//! after the call), and any other change of the file's status (chmod, chown, link, unlink,
//! rename, xattr) moves ctime forward to the backing file's. The mount reports these times, and
//! after every write-back to the backing file (and every trim of its size) ebb sets the backing
//! file's mtime back to the one it keeps, so DIR shows the right mtime once written (its ctime
//! is the time of that last write-back: ctime cannot be set).
//!
//! A [`FileTimes`] lives as long as anything holds it: the cached file's backing file (so as
//! long as the runtime caches the file) and the filesystem's open handles and anchors. A file
//! never written through the mount has none, and reports the backing file's times.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use parking_lot::Mutex;
use rustix::fs::{AtFlags, Stat, Timespec, Timestamps};

/// A file's modification and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Times {
    pub(crate) mtime: Timespec,
    pub(crate) ctime: Timespec,
}

/// The times ebb keeps for one cached file (`None` until it is written through the mount).
#[derive(Debug, Default)]
pub(crate) struct FileTimes {
    times: Mutex<Option<Times>>,
}

/// The current time as file timestamps use it.
fn now() -> Timespec {
    let since =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timespec {
        tv_sec: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: since.subsec_nanos().into(),
    }
}

fn mtime_of(stat: &Stat) -> Timespec {
    Timespec { tv_sec: stat.st_mtime, tv_nsec: stat.st_mtime_nsec as _ }
}

fn ctime_of(stat: &Stat) -> Timespec {
    Timespec { tv_sec: stat.st_ctime, tv_nsec: stat.st_ctime_nsec as _ }
}

impl FileTimes {
    /// The times to report, if ebb keeps them.
    pub(crate) fn get(&self) -> Option<Times> {
        *self.times.lock()
    }

    /// The file's data or size changed through the mount just now.
    pub(crate) fn written(&self) {
        let now = now();
        *self.times.lock() = Some(Times { mtime: now, ctime: now });
    }

    /// The file's status changed through the mount just now (chmod, link, rename, ...): ctime
    /// moves forward, if ebb keeps times.
    pub(crate) fn status_changed(&self) {
        if let Some(times) = self.times.lock().as_mut() {
            times.ctime = times.ctime.max(now());
        }
    }

    /// Runs `set` (a `utimes` of the backing file returning its status after) under the lock
    /// the write-back side takes, and keeps the times it set if ebb keeps times.
    pub(crate) fn set_with(&self, set: impl FnOnce() -> io::Result<Stat>) -> io::Result<()> {
        let mut times = self.times.lock();
        let stat = set()?;
        if times.is_some() {
            *times = Some(Times { mtime: mtime_of(&stat), ctime: ctime_of(&stat) });
        }
        Ok(())
    }

    /// After a write-back or trim of the backing file `fd` (any descriptor of it, `O_PATH`
    /// included): sets its mtime back to the one ebb keeps. The data is written either way,
    /// so a failure here is not the write's; the mount's times stay right regardless.
    pub(crate) fn restore(&self, fd: &OwnedFd) {
        let times = self.times.lock();
        let Some(times) = *times else { return };
        let omit = Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT };
        let stamps = Timestamps { last_access: omit, last_modification: times.mtime };
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let _ = rustix::fs::utimensat(rustix::fs::CWD, path, &stamps, AtFlags::empty());
    }
}
