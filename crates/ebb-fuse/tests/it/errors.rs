//! Write errors as a user meets them: a backing filesystem that fills up (a small tmpfs).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Fixture, precondition};

/// A tmpfs of `size_mib` MiB mounted on a fresh directory, unmounted (lazily) on drop.
struct Tmpfs {
    path: PathBuf,
    _root: tempfile::TempDir,
}

impl Tmpfs {
    fn new(size_mib: u64) -> Option<Tmpfs> {
        if !precondition(rustix::process::geteuid().is_root(), "not root, cannot mount a tmpfs") {
            return None;
        }
        let root = tempfile::Builder::new().prefix("ebb-fuse-tmpfs").tempdir_in("/tmp").unwrap();
        let path = root.path().join("dir");
        std::fs::create_dir(&path).unwrap();
        let options = format!("size={size_mib}m");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs");
        Some(Tmpfs { path, _root: root })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.path, rustix::mount::UnmountFlags::DETACH);
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Fills `dir` with a file of `mib` MiB, written directly (not through the mount).
fn filler(dir: &Path, mib: usize) -> PathBuf {
    let path = dir.join("filler");
    std::fs::write(&path, vec![1u8; mib << 20]).unwrap();
    path
}

// An error that passed does not fail the drain: the backend runs out of space, fsync reports
// ENOSPC, space is freed, the next fsync writes everything and so does the drain, and the
// unmount then succeeds (`ebb mount` exits 0) with every byte in DIR.
#[test]
fn a_drain_after_a_recovered_error_succeeds() {
    let Some(tmpfs) = Tmpfs::new(16) else { return };
    let Some(mut fx) = Fixture::on(&tmpfs.path, Some(64 << 20)) else { return };
    let filler = filler(&fx.dir, 12);
    let data = pattern(8 << 20);
    let mut file = OpenOptions::new().write(true).create_new(true).open(fx.mnt.join("f")).unwrap();
    file.write_all(&data).unwrap();
    let error = file.sync_all().expect_err("8 MiB cannot fit in 4 MiB");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    std::fs::remove_file(filler).unwrap();
    file.sync_all().expect("with space freed, fsync writes the held pages");
    drop(file);
    let mount = fx.mount.as_ref().unwrap();
    mount.drain(Duration::from_secs(600), &mut |_, _| {}).expect("drain");
    fx.unmount();
    assert!(std::fs::read(fx.dir.join("f")).unwrap() == data, "f differs in DIR");
}
