//! A mount's FUSE connection, and how a mount that stops serving ends it.
//!
//! A FUSE connection lives while any descriptor of it (`/dev/fuse`, and the clones each
//! request loop reads) is open anywhere, and every process forked while the mount is served
//! holds copies of them until its `execve` is over: fuser opens them close-on-exec, but the
//! kernel lets go of the files an exec closes only when the exec has finished. The same child
//! closes during that exec every file of the mount it inherited, and each such close is a
//! FLUSH request the kernel waits for without limit (not even SIGKILL ends that wait). If by
//! then no thread serves the connection (the [`crate::Mount`] was dropped, its process exited)
//! or the threads left wait on a backend that is gone, nobody answers: the child hangs for
//! good, and with it every `ps` that reads its `/proc` entry (seen in ebb-fuse's tests, whose
//! children inherit the other tests' mounts; an application that embeds a mount and starts
//! programs has the same exposure). Closing our own descriptors does not end the connection
//! while such a copy lives, so a mount that stops serving while its connection is up ends it
//! through the FUSE control filesystem (`/sys/fs/fuse/connections/N/abort`): every request
//! waiting and every one after fails at once (`ECONNABORTED`, `ENOTCONN`).
//!
//! A connection number is reused once its superblock is gone, so the abort file is opened
//! first and the connection checked to be still up after (it never comes back up): the file
//! opened was then ours.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Where systemd (and `modprobe fuse`'s scripts) mount the FUSE control filesystem.
const CONTROL_DIR: &str = "/sys/fs/fuse/connections";

/// The connection of one mount.
#[derive(Debug)]
pub(crate) struct Connection {
    /// A duplicate of the mount's `/dev/fuse` descriptor: polled, it says whether the
    /// connection is still up (`POLLERR` once it has ended).
    device: OwnedFd,
    /// Its number in the control filesystem (the superblock's device number), if known.
    number: Option<u64>,
}

impl Connection {
    /// The connection `device` serves, mounted at `mountpoint` (which must be mounted now).
    pub(crate) fn new(device: OwnedFd, mountpoint: &Path) -> Connection {
        Connection { device, number: connection_number(mountpoint).ok() }
    }

    /// Whether the connection is still up: not aborted, its superblock not gone.
    pub(crate) fn is_up(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        loop {
            let mut fds = [PollFd::new(self.device.as_fd(), PollFlags::empty())];
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(0) => return true,
                Ok(_) => {
                    return !fds[0]
                        .revents()
                        .is_some_and(|events| events.contains(PollFlags::POLLERR));
                }
                Err(nix::errno::Errno::EINTR) => continue,
                // Not a state a descriptor we own can be in; take it as ended.
                Err(_) => return false,
            }
        }
    }

    /// Ends the connection if it is still up (see the module doc); says on stderr when it
    /// cannot, naming `mountpoint`.
    pub(crate) fn end(&self, mountpoint: &Path) {
        if let Err(error) = self.abort() {
            eprintln!(
                "ebb mount: could not end the FUSE connection of {} ({error}); a process still \
                 using that mount may wait for ever (mount -t fusectl none {CONTROL_DIR}, then \
                 echo 1 > {CONTROL_DIR}/N/abort ends it)",
                mountpoint.display()
            );
        }
    }

    fn abort(&self) -> io::Result<()> {
        if !self.is_up() {
            return Ok(());
        }
        let number = self.number.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "its connection number is not known")
        })?;
        let path = control_dir()?.join(number.to_string()).join("abort");
        let mut abort = std::fs::OpenOptions::new().write(true).open(&path).map_err(|error| {
            io::Error::new(error.kind(), format!("{}: {error}", path.display()))
        })?;
        if !self.is_up() {
            // Ended meanwhile: the number may name another connection by now.
            return Ok(());
        }
        abort.write_all(b"1")
    }
}

/// The connection number of the FUSE mount at `mountpoint`: the kernel's encoding of its
/// device number (major in the bits from 20 up, minor below), read without a request to the
/// mount (`AT_STATX_DONT_SYNC`).
fn connection_number(mountpoint: &Path) -> io::Result<u64> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let stat = statx(CWD, mountpoint, AtFlags::STATX_DONT_SYNC, StatxFlags::empty())?;
    Ok((u64::from(stat.stx_dev_major) << 20) | u64::from(stat.stx_dev_minor))
}

/// Where the FUSE control filesystem is mounted; mounted at [`CONTROL_DIR`] first if it is
/// nowhere (which only root may do).
fn control_dir() -> io::Result<PathBuf> {
    if let Some(dir) = control_mount()? {
        return Ok(dir);
    }
    let flags = rustix::mount::MountFlags::empty();
    rustix::mount::mount("fusectl", CONTROL_DIR, "fusectl", flags, None::<&std::ffi::CStr>)
        .map_err(|errno| {
            io::Error::new(
                io::Error::from(errno).kind(),
                format!(
                    "the FUSE control filesystem is mounted nowhere, and mounting it at \
                 {CONTROL_DIR} failed: {errno}"
                ),
            )
        })?;
    Ok(PathBuf::from(CONTROL_DIR))
}

/// The mount point of the FUSE control filesystem (`fusectl`), from `/proc/self/mountinfo`.
fn control_mount() -> io::Result<Option<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let separator = fields.iter().position(|&field| field == "-")?;
        (fields.get(separator + 1) == Some(&"fusectl"))
            .then(|| fields.get(4).map(|at| PathBuf::from(crate::places::unescape_mountinfo(at))))
            .flatten()
    }))
}
