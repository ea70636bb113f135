//! File handles (`name_to_handle_at(2)`, `open_by_handle_at(2)`): a name for an object that
//! stays valid across renames and opens the object again without a path, which the [`FdCache`]
//! of a [`crate::DirNamespace`] needs to close descriptors and reopen them later.
//!
//! Neither call has a wrapper in rustix, so they are made with `libc::syscall`; this module
//! and [`crate::AlignedBuf`] hold the crate's `unsafe`. Opening by handle needs
//! `CAP_DAC_READ_SEARCH`; a filesystem without handles answers `EOPNOTSUPP`.
//!
//! [`FdCache`]: crate::fd_cache::FdCache

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use rustix::fs::OFlags;

/// `MAX_HANDLE_SZ`: the most bytes a handle has.
const MAX_HANDLE_BYTES: usize = 128;

/// A file handle: `struct file_handle` as the kernel fills it (its byte count, its type, then
/// its bytes), in 4-byte words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileHandle(Box<[u32]>);

impl FileHandle {
    /// The handle of the object `fd` (any descriptor of it, `O_PATH` too) and the id of the
    /// mount it is on.
    pub(crate) fn of(fd: BorrowedFd<'_>) -> io::Result<(FileHandle, i32)> {
        let mut words = vec![0u32; 2 + MAX_HANDLE_BYTES / 4];
        words[0] = MAX_HANDLE_BYTES as u32;
        let mut mount_id: libc::c_int = 0;
        // SAFETY: `words` is a `struct file_handle` with room for MAX_HANDLE_BYTES bytes, as its
        // first field says; the path is an empty C string, used with AT_EMPTY_PATH; the kernel
        // writes only into those and into `mount_id`.
        #[expect(unsafe_code, reason = "name_to_handle_at has no safe binding")]
        let result = unsafe {
            libc::syscall(
                libc::SYS_name_to_handle_at,
                fd.as_raw_fd(),
                c"".as_ptr(),
                words.as_mut_ptr(),
                &raw mut mount_id,
                libc::AT_EMPTY_PATH,
            )
        };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
        let bytes = (words[0] as usize).min(MAX_HANDLE_BYTES);
        words.truncate(2 + bytes.div_ceil(4));
        Ok((FileHandle(words.into_boxed_slice()), mount_id))
    }

    /// Opens the object the handle names, on the filesystem of `mount` (any descriptor on the
    /// same mount but an `O_PATH` one, which the call refuses with `EBADF`), with `flags`.
    /// `ESTALE` if the object no longer exists.
    pub(crate) fn open(&self, mount: BorrowedFd<'_>, flags: OFlags) -> io::Result<OwnedFd> {
        let flags = flags | OFlags::CLOEXEC;
        // SAFETY: `self.0` is a `struct file_handle` the kernel filled, which it only reads.
        #[expect(unsafe_code, reason = "open_by_handle_at has no safe binding")]
        let result = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                mount.as_raw_fd(),
                self.0.as_ptr(),
                flags.bits() as libc::c_int,
            )
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = libc::c_int::try_from(result).map_err(|_| io::Error::other("bad descriptor"))?;
        // SAFETY: the kernel just returned this descriptor, which nothing else owns.
        #[expect(unsafe_code, reason = "taking ownership of a new descriptor")]
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// A number that tells handles apart (FNV-1a of the type and bytes): the same for the life
    /// of the object, and in practice different for an object that reuses its inode number.
    pub(crate) fn digest(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for word in &self.0[1..] {
            for byte in word.to_ne_bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::Mode;

    #[test]
    fn a_handle_opens_its_file_after_a_rename() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"x").unwrap();
        let fd = rustix::fs::open(&a, OFlags::PATH, Mode::empty()).unwrap();
        let handle = match FileHandle::of(rustix::fd::AsFd::as_fd(&fd)) {
            Ok((handle, _)) => handle,
            Err(error) => {
                eprintln!("SKIPPED: no file handles here: {error}");
                return;
            }
        };
        drop(fd);
        std::fs::rename(&a, &b).unwrap();
        let root = rustix::fs::open(dir.path(), OFlags::RDONLY, Mode::empty()).unwrap();
        let opened = match handle.open(rustix::fd::AsFd::as_fd(&root), OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(error) if error.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("SKIPPED: opening by handle needs CAP_DAC_READ_SEARCH: {error}");
                return;
            }
            Err(error) => panic!("{error}"),
        };
        let stat = rustix::fs::fstat(&opened).unwrap();
        assert_eq!(stat.st_ino, rustix::fs::stat(&b).unwrap().st_ino);
        std::fs::remove_file(&b).unwrap();
        drop(opened);
        let error = handle.open(rustix::fd::AsFd::as_fd(&root), OFlags::RDONLY).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ESTALE));
    }
}
