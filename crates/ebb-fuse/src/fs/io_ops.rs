//! The file data operations of the filesystem: open and create, read, write, flush, release,
//! fsync, fallocate. They run on the pools' threads (see the module doc of [`super`]).

use std::ffi::OsStr;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use ebb_backend::{Credentials, Fallocate, FileKind, Namespace, SetAttr};
use fuser::{Errno, FileAttr, FileHandle, FopenFlags, INodeNo, OpenFlags};

use super::ops::file_id;
use super::{Inner, to_errno};
use crate::data::{DataFile, Interrupt};

/// How every regular file is opened: the kernel keeps no copy of the data.
pub(super) fn open_flags() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
}

impl<N: Namespace> Inner<N> {
    /// Before a write by `uid` other than root: as the kernel's own filesystems do on a write
    /// by a caller without `CAP_FSETID`, the file loses its setuid bit, and its setgid bit if
    /// group execute is set (without it the bit marks mandatory locking, and stays). With
    /// direct IO the kernel leaves this to the filesystem. Checked at the first such write of
    /// each handle (a getattr), not at every write; a `chmod u+s` between two writes of one
    /// descriptor by another user is cleared at the next descriptor's first write.
    pub(super) fn kill_suid_on_write(&self, id: INodeNo, fh: FileHandle, uid: u32) {
        use std::sync::atomic::Ordering;
        if uid == 0 {
            return;
        }
        let Ok(handle) = self.files.handle(fh) else { return };
        if handle.suid_checked.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(node) = self.node(id) else { return };
        let Ok(attr) = self.ns.getattr(&node) else { return };
        let mode = u32::from(attr.perm);
        let mut kill = libc::S_ISUID;
        if mode & libc::S_IXGRP != 0 {
            kill |= libc::S_ISGID;
        }
        if mode & kill == 0 {
            return;
        }
        // The filesystem changes the mode, not the caller (who may not own the file).
        let root = Credentials { uid: 0, gid: 0, groups: Vec::new() };
        let set = SetAttr { mode: Some(mode & 0o7777 & !kill), ..SetAttr::default() };
        if self.ns.setattr(&node, &set, &root).is_ok() {
            self.files.status_changed(handle.id);
        }
    }

    pub(super) fn open(&self, id: INodeNo, flags: OpenFlags) -> Result<u64, Errno> {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            self.files.check_writable()?;
        }
        let node = self.node(id)?;
        let attr = self.ns.getattr(&node).map_err(to_errno)?;
        self.open_node(&node, &attr)
    }

    /// Opens a handle on the regular file `node` with `attr`.
    fn open_node(&self, node: &N::Node, attr: &ebb_backend::Attr) -> Result<u64, Errno> {
        let file = file_id(attr).ok_or(match attr.kind {
            FileKind::Directory => Errno::EISDIR,
            _ => Errno::EINVAL,
        })?;
        let times = self.files.file_times(file);
        let open = self.opener(node, &times);
        let dropped = self.files.drop_if_changed(file, &times, attr.size, attr.mtime, &open);
        let fh = self.files.open_handle(file, times.clone(), &open).map_err(to_errno)?;
        if !dropped && let Err(error) = self.files.revalidate(fh, &times, attr.size, attr.mtime) {
            let _ = self.files.release(FileHandle(fh));
            return Err(to_errno(error));
        }
        Ok(fh)
    }

    /// Creates (or with `flags` lacking `O_EXCL`, opens an existing) regular file and opens a
    /// handle on it: its attributes, generation and handle.
    pub(super) fn create(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: &Credentials,
    ) -> Result<(FileAttr, u64, u64), Errno> {
        self.files.check_writable()?;
        let dir = self.node(parent)?;
        let (node, attr) = match self.ns.create(&dir, name, mode & 0o7777, caller) {
            Ok(created) => created,
            Err(error)
                if error.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 =>
            {
                self.ns.lookup(&dir, name).map_err(to_errno)?
            }
            Err(error) => return Err(to_errno(error)),
        };
        let fh = self.open_node(&node, &attr)?;
        if flags & libc::O_TRUNC != 0
            && let Err(error) = self.truncate_open(FileHandle(fh))
        {
            let _ = self.files.release(FileHandle(fh));
            return Err(error);
        }
        let (file_attr, generation) = self.entry(node, &attr);
        Ok((file_attr, generation, fh))
    }

    fn truncate_open(&self, fh: FileHandle) -> Result<(), Errno> {
        let handle = self.files.handle(fh)?;
        handle.file.set_len(0).map_err(to_errno)?;
        handle.times.written();
        Ok(())
    }

    pub(super) fn read(
        &self,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        pid: u32,
    ) -> Result<Vec<u8>, Errno> {
        let direct = is_direct(flags, offset, size);
        let handle = self.files.handle(fh)?;
        let mut buf = vec![0; size as usize];
        let done = if direct {
            read_direct(handle.file.as_ref(), &mut buf, offset)
        } else {
            read_cached(handle.file.as_ref(), &mut buf, offset, &|| killed(pid))
        };
        buf.truncate(done.map_err(to_errno)?);
        Ok(buf)
    }

    /// A read the cache holds whole, without waiting ([`crate::data::DataFile::try_read_at`]):
    /// what [`Inner::read`] would answer, with any flags (an `O_DIRECT` read of cached pages
    /// reads the cache too); `None` where it would wait, or fail.
    pub(super) fn try_read(&self, fh: FileHandle, offset: u64, size: u32) -> Option<Vec<u8>> {
        let handle = self.files.handle(fh).ok()?;
        let mut buf = vec![0; size as usize];
        let done = handle.file.try_read_at(&mut buf, offset)?;
        buf.truncate(done);
        Some(buf)
    }

    /// close(2) does not write the data (as on a local filesystem; fsync does), but it
    /// reports a write-back error this handle has not seen yet, once, as close(2) on NFS
    /// does: the release that follows cannot reach the caller.
    /// `close(2)` of one descriptor: reports a write error the handle has not seen, and on a
    /// flush-on-close backend (NFS, S3) first writes the file back and commits it.
    pub(super) fn flush(&self, fh: FileHandle, pid: u32) -> Result<(), Errno> {
        let handle = self.files.handle(fh)?;
        handle.file.flush(&|| killed(pid)).map_err(to_errno)
    }

    /// Whether closing the open file `fh` writes nothing back ([`DataFile::close_writes_back`]):
    /// its flush only reports an error not yet seen, and its release waits for no backend.
    pub(super) fn close_writes_nothing(&self, fh: FileHandle) -> bool {
        self.files.handle(fh).is_ok_and(|handle| !handle.file.close_writes_back())
    }

    pub(super) fn release(&self, fh: FileHandle) -> Result<(), Errno> {
        self.files.release(fh).map_err(|error| {
            // The kernel does not pass release errors on to close(2); say it here.
            eprintln!("ebb mount: a write error was reported at close: {error}");
            to_errno(error)
        })
    }

    pub(super) fn fsync(&self, fh: FileHandle, pid: u32) -> Result<(), Errno> {
        let handle = self.files.handle(fh)?;
        handle.file.fsync_interruptible(&|| killed(pid)).map_err(to_errno)
    }

    /// `fallocate(2)` of the open file `fh`. The plain mode (allocate, growing the size ebb
    /// knows if the range ends past it) and `KEEP_SIZE` reserve space in the backend. A hole
    /// (`PUNCH_HOLE | KEEP_SIZE`) and a zeroed range (`ZERO_RANGE`, growing the size unless
    /// `KEEP_SIZE`) are made in the cache first (its pages of the range zeroed) and then in
    /// the backend. Collapsing and inserting ranges are `EOPNOTSUPP`.
    pub(super) fn fallocate(
        &self,
        id: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let how = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => Fallocate::Reserve,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Fallocate::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => Fallocate::ZeroRange,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        self.files.check_writable()?;
        let end = offset.checked_add(length).filter(|&end| end <= i64::MAX as u64);
        let end = end.ok_or(Errno::EFBIG)?;
        let handle = self.files.handle(fh)?;
        let node = self.node(id)?;
        // The backend keeps its size: the size is ebb's to change, through the cache.
        let mut in_backend = || self.ns.fallocate(&node, offset, length, how);
        if how == Fallocate::Reserve {
            in_backend().map_err(to_errno)?;
        } else {
            // No read in flight until the backend's range is changed may install its old bytes.
            handle.file.zero_range(offset, length, &mut in_backend).map_err(to_errno)?;
        }
        // The kernel holds the file's inode lock through a fallocate and through every write
        // that extends the file, so the size cannot grow between this check and the set.
        if !keep_size && end > handle.file.len().map_err(to_errno)? {
            handle.file.set_len(end).map_err(to_errno)?;
        }
        // As ext4 does, any fallocate moves the mtime and ctime (the backend's fallocate moved
        // its own, which the mount does not report for a file whose times ebb keeps).
        handle.times.written();
        Ok(())
    }
}

/// Whether a read of `size` bytes at `offset` of a file opened with `flags` reads around the
/// cache: as in the kernel, a reader that opened the file with `O_DIRECT` (and reads whole
/// pages) reads around the cache, and its latency is what wbt protects; others read through
/// it.
pub(super) fn is_direct(flags: OpenFlags, offset: u64, size: u32) -> bool {
    flags.0 & libc::O_DIRECT != 0
        && offset.is_multiple_of(4096)
        && u64::from(size).is_multiple_of(4096)
}

/// A request loop's turn to serve a request itself that waits for a local disk (an `O_DIRECT`
/// read, a local directory's namespace call, a release): at most [`super::LOOP_THREADS`] - 1
/// at once (so one loop always reads new requests); given back when dropped.
pub(super) struct Inline<'a>(&'a AtomicUsize);

impl<'a> Inline<'a> {
    pub(super) fn take(serving: &'a AtomicUsize) -> Option<Inline<'a>> {
        let most = super::LOOP_THREADS - 1;
        serving
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < most).then_some(n + 1))
            .ok()
            .map(|_| Inline(serving))
    }
}

impl Drop for Inline<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads through the cache until `buf` is full or the file ends (or the caller is killed).
fn read_cached(
    file: &dyn DataFile,
    buf: &mut [u8],
    offset: u64,
    interrupted: Interrupt<'_>,
) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at_interruptible(&mut buf[done..], offset + done as u64, interrupted) {
            Ok(0) => break,
            Ok(read) => done += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted && done > 0 => break,
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}

/// Whether the process whose thread `pid` made a request is being killed (or is gone).
///
/// The kernel waits for the answer to a FUSE request its process is blocked in, and a fatal
/// signal does not end that wait once the request has reached us: the process stays in `D`
/// state until we answer. The kernel would tell us with a FUSE_INTERRUPT request, but fuser
/// (0.18) answers those with `ENOSYS` itself, after which the kernel sends no more. So the
/// calls that wait ask here instead: a fatal signal (SIGKILL, or any signal whose default
/// action kills the process) is queued on every thread of the process as SIGKILL, which
/// `/proc/PID/status` shows in `SigPnd` (the thread's) or `ShdPnd` (the process's).
pub(super) fn killed(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let sigkill = 1u64 << (libc::SIGKILL - 1);
    let pending = status.lines().any(|line| {
        let pending = line.strip_prefix("SigPnd:").or_else(|| line.strip_prefix("ShdPnd:"));
        pending
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & sigkill != 0)
    });
    pending || exiting(pid)
}

/// Whether the process `pid` is on its way out: a killed process closes its files on the way
/// out, after its SIGKILL was taken, and each close of a file on a flush-on-close backend is a
/// flush that would otherwise wait for the backend (the process sat in `D` state until it
/// answered). Its data stays in the cache and is written back as any other.
///
/// An exiting process has released its memory before it closes its files, so its
/// `/proc/PID/status` has no `VmSize` line (as a zombie's, or one gone). `/proc/PID/stat`,
/// which shows `PF_EXITING` directly, must not be read here: on this kernel its read waits
/// for a lock that a process in `execve` holds while it closes its close-on-exec files, and
/// such a close is a FLUSH this very thread may be serving (a deadlock seen with a child
/// started from a descriptor open on the mount).
fn exiting(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return true };
    !status.lines().any(|line| line.starts_with("VmSize:"))
}

/// An aligned read around the cache, cut at the size ebb knows. The backend's file may end
/// before that size (a hole the cache added by growing the file, never written) or after it
/// (its last page is written whole): the first reads as zeros, the second is cut.
fn read_direct(file: &dyn DataFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let size = file.len()?;
    let valid = usize::try_from(size.saturating_sub(offset)).unwrap_or(usize::MAX).min(buf.len());
    if valid == 0 {
        return Ok(0);
    }
    let read = file.read_direct_at(buf, offset)?;
    if read < valid {
        buf[read..valid].fill(0);
    }
    Ok(valid)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_live_process_is_not_exiting_and_a_zombie_or_a_gone_one_is() {
        assert!(!super::exiting(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        // Not reaped yet: a zombie once it has exited.
        while std::fs::read_to_string(format!("/proc/{pid}/status"))
            .is_ok_and(|s| !s.lines().any(|l| l.starts_with("State:") && l.contains('Z')))
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(super::exiting(pid));
        child.wait().expect("reap");
        assert!(super::exiting(pid));
    }
}
