//! Where a mount may go and what it may take, checked before mounting: the mountpoint (a
//! directory, not inside the backend directory, no dead mount left there by a crash), the
//! memory budget, the descriptor limit.

use std::io;
use std::path::{Path, PathBuf};

/// Refuses a mountpoint that is not a directory, and one inside the backend directory (the
/// mount would serve itself: a lookup of the mountpoint through the mount waits for the mount,
/// and both request loops deadlock). `mountpoint` is canonical.
pub(crate) fn check_places(backend: Option<&Path>, mountpoint: &Path) -> io::Result<()> {
    if !mountpoint.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("mountpoint {} is not a directory", mountpoint.display()),
        ));
    }
    let Some(backend) = backend else { return Ok(()) };
    let backend = backend.canonicalize()?;
    if mountpoint.starts_with(&backend) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "mountpoint {} is inside the backend directory {}: the mount would contain \
                 itself; mount outside the backend",
                mountpoint.display(),
                backend.display()
            ),
        ));
    }
    Ok(())
}

/// Refuses a cache budget larger than the memory this machine has available now
/// (`MemAvailable` in `/proc/meminfo`): the cache fills its budget before it reclaims, so a
/// budget past that ends with the OOM killer. Without `/proc/meminfo` nothing is checked.
pub(crate) fn check_memory(memory: u64) -> io::Result<()> {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else { return Ok(()) };
    let Some(available) = meminfo_bytes(&meminfo, "MemAvailable") else { return Ok(()) };
    if memory > available {
        let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a memory budget of {:.1} GiB (--memory, or the knob memory_bytes) is more than this machine has \
                 available ({:.1} GiB, MemAvailable in /proc/meminfo); give at most that",
                gib(memory),
                gib(available)
            ),
        ));
    }
    Ok(())
}

/// The value of the `/proc/meminfo` line `field` in bytes (the file says kB, meaning KiB).
fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    })
}

/// If `mountpoint` holds a FUSE mount whose server is gone (`ENOTCONN`), detaches it and
/// returns `true`. A live FUSE mount there is an error (`AlreadyExists`); no mount, `false`.
pub fn clear_stale_mount(mountpoint: &Path) -> io::Result<bool> {
    let absolute = absolute_without_following(mountpoint)?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let fuse_here = mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(separator) = fields.iter().position(|&field| field == "-") else {
            return false;
        };
        fields.get(4).is_some_and(|&at| unescape_mountinfo(at) == absolute.as_os_str())
            && fields.get(separator + 1).is_some_and(|fstype| fstype.starts_with("fuse"))
    });
    if !fuse_here {
        return Ok(false);
    }
    match std::fs::metadata(&absolute) {
        Err(error) if error.raw_os_error() == Some(libc::ENOTCONN) => {
            rustix::mount::unmount(&absolute, rustix::mount::UnmountFlags::DETACH)?;
            Ok(true)
        }
        _ => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} is already a live FUSE mount; unmount it first (umount {0})",
                absolute.display()
            ),
        )),
    }
}

/// `path` made absolute with its parent canonicalized but its last component not followed
/// (a stale mountpoint cannot be resolved).
pub(crate) fn absolute_without_following(path: &Path) -> io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => Ok(parent.canonicalize()?.join(name)),
        _ => Ok(absolute),
    }
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
pub(crate) fn unescape_mountinfo(field: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\'
            && index + 3 < bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[index + 1..index + 4], 8)
        {
            out.push(value);
            index += 4;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// Open files hold a descriptor each (plus one per cached file): take the hard limit.
pub(crate) fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}
