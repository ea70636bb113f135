//! The modification and change times of files ebb caches, kept by ebb because the backend's
//! own move when ebb writes the data back, later than the write that changed it.
//!
//! POSIX sets a file's mtime and ctime when `write(2)` or `truncate(2)` returns, keeps an
//! mtime set by `utimes(2)`, and knows nothing of writeback. A backend sets its file's mtime
//! and ctime whenever ebb writes back to it (seconds later, or at `fsync`), which would
//! overwrite an mtime that `cp -p`, `tar x` or `touch -d` set. So for a file written through
//! the mount, ebb keeps both times itself ([`FileTimes`]): a write or truncate through the
//! mount sets them to now, a `utimes` to the time asked for (ctime to the backend's after the
//! call), and any other change of the file's status (chmod, chown, link, unlink, rename, xattr)
//! moves ctime forward to now. The mount reports these times, and after every write-back to
//! the backend's file (and every trim of its size) ebb sets the backend's mtime back to the one
//! it keeps ([`TimedFile`], through the namespace's `setattr`), so the backend shows the right
//! mtime once written (its ctime is the time of that last write-back: ctime cannot be set).
//!
//! Putting the mtime back hides a change made by someone else between two write-backs (the
//! backend's mtime moved, then ebb set it back), which the next open must see (close-to-open:
//! `Files::drop_if_changed`, `Files::revalidate`). So, as an NFS client compares a WRITE's
//! pre-operation attributes with the ones it cached, a write-back that no other write-back of
//! the file overlaps first reads the backend's mtime and compares it with the one ebb last left
//! there; a difference marks the file changed underneath ([`FileTimes::changed_underneath`]),
//! which the next open answers by dropping the file's clean pages. That costs one `getattr` of
//! the backend's file per write-back of a file written through the mount (a local `stat`, an
//! NFS GETATTR). An open compares the backend's mtime with the one ebb left there too
//! ([`FileTimes::baseline_mtime`]), which catches a change made between write-backs.
//!
//! What this cannot see: a change made after a write-back's check and before its mtime is put
//! back, which the putting back hides (microseconds on a local disk; on NFS the length of a
//! WRITE). A backend offers no way to set a time only if the file is unchanged (ctime does not
//! help: ebb's own setting of the mtime moves it after the other writer's change). A size
//! changed meanwhile is still seen at the next open once the file is clean.
//!
//! A [`FileTimes`] lives as long as anything holds it: the cached file's [`TimedFile`] (so as
//! long as the runtime caches the file) and the filesystem's open handles and anchors. A file
//! never written through the mount keeps none and reports the backend's times.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::SystemTime;

use ebb_backend::{Attr, BackendFile, CommitReply, WriteReply};
use parking_lot::Mutex;

/// A file's modification and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Times {
    pub(crate) mtime: SystemTime,
    pub(crate) ctime: SystemTime,
}

/// The times ebb keeps for one cached file (`None` until it is written through the mount),
/// and the backend's mtime as ebb last saw or left it (to notice a change by someone else).
#[derive(Debug, Default)]
pub(crate) struct FileTimes {
    /// Held across the backend calls that read or set the backend's mtime (the write-back's
    /// check and restore, a `utimes`), so that they do not overlap; the other fields' locks
    /// are held only to read or set them. A write through the mount (which sets `times`)
    /// must never wait for the backend: over a server that stalls, a writer on a pool thread
    /// waiting for a lock held across its call could not be answered when it is killed (a
    /// killed writer over S3 stayed alive until the server answered again).
    backend: Mutex<()>,
    times: Mutex<Option<Times>>,
    seen: Mutex<Option<SystemTime>>,
    /// The backend's mtime as ebb last left it (seen, or put back after a write-back);
    /// `None` when unknown (a backend that could not set it).
    left: Mutex<Option<SystemTime>>,
    /// A write-back found the backend's mtime moved since ebb last left it: someone else
    /// changed the file.
    changed: AtomicBool,
}

impl FileTimes {
    /// The times to report, if ebb keeps them.
    pub(crate) fn get(&self) -> Option<Times> {
        *self.times.lock()
    }

    /// The backend's mtime should it be unchanged since ebb cached the file: the kept one
    /// (put back after each write-back), else the one seen when the file was cached.
    pub(crate) fn expected_mtime(&self) -> Option<SystemTime> {
        self.get().map(|times| times.mtime).or(*self.seen.lock())
    }

    /// The backend's mtime should nobody else have changed the file: the one ebb last left
    /// there (seen, or put back after a write-back), else [`FileTimes::expected_mtime`];
    /// `None` before ebb first saw the file.
    pub(crate) fn baseline_mtime(&self) -> Option<SystemTime> {
        (*self.left.lock()).or_else(|| self.expected_mtime())
    }

    /// ebb dropped the pages of the file that a change underneath made stale, keeping its
    /// own data and times: the backend's `mtime` is the one to compare with from now.
    pub(crate) fn change_seen(&self, mtime: SystemTime) {
        let _backend = self.backend.lock();
        *self.left.lock() = Some(mtime);
        self.changed.store(false, Ordering::Release);
    }

    /// The backend's file has `mtime` and ebb caches nothing of it yet, or ebb dropped what
    /// it cached because the file changed underneath: its times are the backend's from now.
    pub(crate) fn saw(&self, mtime: SystemTime) {
        *self.times.lock() = None;
        *self.seen.lock() = Some(mtime);
        *self.left.lock() = Some(mtime);
        self.changed.store(false, Ordering::Release);
    }

    /// Whether a write-back found that someone else changed the backend's file since ebb
    /// last left it (module doc).
    pub(crate) fn changed_underneath(&self) -> bool {
        self.changed.load(Ordering::Acquire)
    }

    /// Before a write-back or trim that no other overlaps: compares the backend's mtime
    /// (`stat`) with the one ebb left there, if ebb puts it back after its writes.
    fn check(&self, stat: &Stat) {
        let _backend = self.backend.lock();
        let kept = self.times.lock().is_some();
        let left = *self.left.lock();
        if kept
            && let Some(left) = left
            && stat().is_ok_and(|mtime| mtime != left)
        {
            self.changed.store(true, Ordering::Release);
        }
    }

    /// The file's data or size changed through the mount just now.
    pub(crate) fn written(&self) {
        let now = SystemTime::now();
        *self.times.lock() = Some(Times { mtime: now, ctime: now });
    }

    /// The file's status changed through the mount just now (chmod, link, rename, ...): ctime
    /// moves forward, if ebb keeps times.
    pub(crate) fn status_changed(&self) {
        if let Some(times) = self.times.lock().as_mut() {
            times.ctime = times.ctime.max(SystemTime::now());
        }
    }

    /// Runs `set` (a `utimes` on the backend returning the attributes after) under the lock
    /// the write-back side takes, and keeps the times it set if ebb keeps times.
    pub(crate) fn set_with(&self, set: impl FnOnce() -> io::Result<Attr>) -> io::Result<Attr> {
        let _backend = self.backend.lock();
        let attr = set()?;
        let mut times = self.times.lock();
        if times.is_some() {
            *times = Some(Times { mtime: attr.mtime, ctime: attr.ctime });
        } else {
            *self.seen.lock() = Some(attr.mtime);
        }
        *self.left.lock() = Some(attr.mtime);
        Ok(attr)
    }

    /// After a write-back or trim of the backend's file: sets its mtime back to the one ebb
    /// keeps with `restore`. The data is written either way, so a failure here is not the
    /// write's (a backend that cannot set times refuses); the mount's times stay right.
    fn restore(&self, restore: &Restore) {
        let _backend = self.backend.lock();
        let kept = *self.times.lock();
        if let Some(times) = kept {
            *self.left.lock() = restore(times.mtime).ok();
        }
    }
}

/// Sets the backend file's mtime (the namespace's `setattr`), returning the mtime it has then.
pub(crate) type Restore = dyn Fn(SystemTime) -> io::Result<SystemTime> + Send + Sync;

/// The backend file's mtime now (the namespace's `getattr`).
pub(crate) type Stat = dyn Fn() -> io::Result<SystemTime> + Send + Sync;

/// A backend file whose mtime is set back to the kept one after each write and trim.
pub(crate) struct TimedFile {
    pub(crate) inner: Arc<dyn BackendFile>,
    pub(crate) times: Arc<FileTimes>,
    pub(crate) restore: Box<Restore>,
    pub(crate) stat: Box<Stat>,
    /// Write-backs and trims of the file in flight (only one alone checks the mtime).
    pub(crate) inflight: AtomicU32,
}

/// One write-back or trim in flight through a [`TimedFile`].
struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TimedFile {
    /// Before a write-back or trim: the mtime check (module doc) if no other is in flight.
    fn begin(&self) -> InFlight<'_> {
        if self.inflight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.times.check(&*self.stat);
        }
        InFlight(&self.inflight)
    }
}

impl fmt::Debug for TimedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimedFile").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl BackendFile for TimedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        let _busy = self.begin();
        let reply = self.inner.write_at(buf, offset)?;
        self.times.restore(&self.restore);
        Ok(reply)
    }

    fn write_extent(&self, offset: u64, len: u64, runs: &[(u64, &[u8])]) -> io::Result<WriteReply> {
        let _busy = self.begin();
        let reply = self.inner.write_extent(offset, len, runs)?;
        self.times.restore(&self.restore);
        Ok(reply)
    }

    fn write_unit(&self, offset: u64, end: u64) -> Option<std::ops::Range<u64>> {
        self.inner.write_unit(offset, end)
    }

    fn write_unit_in_place(
        &self,
        buf: &mut [u8],
        offset: u64,
        valid: std::ops::Range<usize>,
    ) -> io::Result<WriteReply> {
        let _busy = self.begin();
        let reply = self.inner.write_unit_in_place(buf, offset, valid)?;
        self.times.restore(&self.restore);
        Ok(reply)
    }

    fn write_from(
        &self,
        offset: u64,
        source: &dyn ebb_backend::WriteSource,
    ) -> Option<io::Result<WriteReply>> {
        if self.inner.write_unit(offset, offset + source.len() as u64).is_none() {
            // Only a backend that writes units (S3 parts) writes from the frames; the others
            // answer `None` and the write comes again as `write_at`, checked there.
            return self.inner.write_from(offset, source);
        }
        let _busy = self.begin();
        let reply = self.inner.write_from(offset, source)?;
        if reply.is_ok() {
            self.times.restore(&self.restore);
        }
        Some(reply)
    }

    fn commit(&self, offset: u64, len: u64) -> io::Result<CommitReply> {
        self.inner.commit(offset, len)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        let _busy = self.begin();
        self.inner.set_size(size)?;
        self.times.restore(&self.restore);
        Ok(())
    }

    fn forget_metadata(&self) {
        self.inner.forget_metadata();
    }
}
