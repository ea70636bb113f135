//! What the mount test binaries share (`mod support;`, or `#[path]` from a test directory).
#![allow(dead_code, reason = "each test binary that includes this uses part of it")]

use std::path::Path;

/// Whether FUSE can be mounted here; if not, the test says SKIPPED and returns early, except
/// under CI (the environment variable `CI` set), where a skip would count as a pass: it fails.
pub(crate) fn fuse_available() -> bool {
    let available = Path::new("/dev/fuse").exists();
    if !available {
        assert!(std::env::var_os("CI").is_none(), "/dev/fuse is missing, and CI is set");
        eprintln!("SKIPPED: /dev/fuse is missing, so FUSE cannot be mounted here");
    }
    available
}

/// Whether `mnt` is a mountpoint of this process's mount namespace.
pub(crate) fn is_mounted(mnt: &Path) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let target = mnt.to_str().unwrap();
    mountinfo.lines().any(|line| line.split(' ').nth(4) == Some(target))
}
