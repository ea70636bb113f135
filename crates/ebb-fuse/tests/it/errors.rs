//! Write errors as a user meets them (a backing filesystem that fills up: a small tmpfs), and
//! files deleted or changed in the backing directory by another process.

use std::fs::{File, OpenOptions};
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
    // ebb stat shows the file, its error and its unwritten pages.
    let stats: serde_json::Value =
        serde_json::from_str(&ebb_fuse::read_stats(&fx.mnt).unwrap()).unwrap();
    let files = stats["files"].as_array().expect("a files list");
    assert_eq!(files.len(), 1, "{stats}");
    assert!(files[0]["error"].as_str().unwrap().contains("No space left"), "{stats}");
    assert!(files[0]["errors"].as_u64().unwrap() >= 1, "{stats}");
    assert!(files[0]["dirty_pages"].as_u64().unwrap() > 0, "{stats}");
    assert!(files[0]["pause_us_p99"].is_u64(), "{stats}");
    std::fs::remove_file(filler).unwrap();
    file.sync_all().expect("with space freed, fsync writes the held pages");
    drop(file);
    let mount = fx.mount.as_ref().unwrap();
    mount.drain(Duration::from_secs(600), &mut |_, _| {}).expect("drain");
    fx.unmount();
    assert!(std::fs::read(fx.dir.join("f")).unwrap() == data, "f differs in DIR");
}

/// Starts `dd` writing `mib` MiB of zeros to `path`.
fn dd(path: &Path, mib: usize) -> std::process::Child {
    std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", path.display()))
        .args(["bs=1M", &format!("count={mib}"), "status=none"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits (a hang detector, not a speed check) until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(120), "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A mount over a 64 MiB tmpfs with 4 MiB free and a 17 MiB cache (a 44 MiB budget: 16.7 MiB
/// are the process's own, 5 MiB go to the mount's copies of write requests, 5.6 MiB to the IO
/// buffers), and `dd` writing `mib` MiB into it: write-backs fail with ENOSPC and the pages
/// they could not write are held.
fn full_backend_with_a_writer(mib: usize) -> Option<(Tmpfs, Fixture, std::process::Child)> {
    let tmpfs = Tmpfs::new(64)?;
    let fx = Fixture::on(&tmpfs.path, Some(44 << 20))?;
    filler(&fx.dir, 60);
    let writer = dd(&fx.mnt.join("big"), mib);
    let mount = fx.mount.as_ref().unwrap();
    wait_until("a failed write-back", || mount.write_errors() > 0);
    Some((tmpfs, fx, writer))
}

// Once space is freed, the held pages drain by themselves (retried with backoff), with no
// fsync from anyone: the writer of 12 MiB (8 MiB of them held, which fit in the cache)
// finishes (its close may report the ENOSPC that happened, once, as on a local filesystem),
// and the unmount finds everything written.
#[test]
fn freeing_space_lets_held_pages_drain() {
    let Some((_tmpfs, mut fx, mut writer)) = full_backend_with_a_writer(12) else { return };
    wait_until("the writer's exit", || writer.try_wait().unwrap().is_some());
    let stats: serde_json::Value =
        serde_json::from_str(&ebb_fuse::read_stats(&fx.mnt).unwrap()).unwrap();
    let held = stats["files"][0]["held_pages"].as_u64().unwrap_or(0);
    assert!(held > 0, "the pages that did not fit must be held: {stats}");
    std::fs::remove_file(fx.dir.join("filler")).unwrap();
    let big = fx.dir.join("big");
    wait_until("the held pages' write-back", || {
        std::fs::metadata(&big).is_ok_and(|meta| meta.len() == 12 << 20)
            && fx.mount.as_ref().unwrap().unwritten().starts_with("0 KiB dirty")
    });
    fx.unmount();
    assert!(std::fs::read(&big).unwrap().iter().all(|&byte| byte == 0));
}

// A writer that cannot make progress because the cache is full of held pages (48 MiB into a
// 16 MiB cache over a backend with 4 MiB free) gets the held error (ENOSPC) promptly instead
// of waiting for space forever, and nothing it wrote is dropped: freeing space drains it.
#[test]
fn a_writer_held_by_a_full_backend_gets_enospc() {
    let Some((_tmpfs, mut fx, mut writer)) = full_backend_with_a_writer(48) else { return };
    let mut status = None;
    wait_until("dd's exit", || {
        status = writer.try_wait().unwrap();
        status.is_some()
    });
    assert!(!status.unwrap().success(), "dd must fail with ENOSPC");
    let cached = std::fs::metadata(fx.mnt.join("big")).unwrap().len();
    assert!(cached >= 16 << 20, "dd failed only once the cache was full: {cached} bytes");
    std::fs::remove_file(fx.dir.join("filler")).unwrap();
    let big = fx.dir.join("big");
    wait_until("the held pages' write-back", || {
        std::fs::metadata(&big).is_ok_and(|meta| meta.len() == cached)
            && fx.mount.as_ref().unwrap().unwritten().starts_with("0 KiB dirty")
    });
    fx.unmount();
}

// The writer of the case above is SIGKILLed while write-backs fail and its pages are held:
// it exits (no FUSE request of it is stuck in an uninterruptible wait), and what it wrote
// into the cache is still written once space is freed.
#[test]
fn a_writer_killed_while_its_pages_are_held_exits_and_its_data_drains() {
    let Some((_tmpfs, mut fx, mut writer)) = full_backend_with_a_writer(48) else { return };
    writer.kill().unwrap();
    let mut status = None;
    wait_until("the killed dd's exit", || {
        status = writer.try_wait().unwrap();
        status.is_some()
    });
    use std::os::unix::process::ExitStatusExt;
    // dd dies of the SIGKILL, or, on a slow run, had already failed with the held ENOSPC when
    // the signal came (a writer blocked by a cache full of held pages fails): either way it
    // is not stuck.
    let status = status.unwrap();
    assert!(status.signal() == Some(9) || status.code() == Some(1), "dd's end: {status}");
    let cached = std::fs::metadata(fx.mnt.join("big")).unwrap().len();
    std::fs::remove_file(fx.dir.join("filler")).unwrap();
    let big = fx.dir.join("big");
    wait_until("the held pages' write-back", || {
        std::fs::metadata(&big).is_ok_and(|meta| meta.len() == cached)
            && fx.mount.as_ref().unwrap().unwritten().starts_with("0 KiB dirty")
    });
    fx.unmount();
    assert!(std::fs::read(&big).unwrap().iter().all(|&byte| byte == 0));
}

/// Free bytes of the filesystem holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let stat = rustix::fs::statvfs(path).unwrap();
    stat.f_bfree * stat.f_frsize
}

// A file that another process deletes in DIR does not keep its space while ebb runs: once
// nothing has it open through the mount, ebb closes its descriptors (the tmpfs gets the space
// back) and the next write has room.
#[test]
fn a_file_deleted_in_dir_gives_its_space_back() {
    let Some(tmpfs) = Tmpfs::new(64) else { return };
    let Some(mut fx) = Fixture::on(&tmpfs.path, Some(64 << 20)) else { return };
    let data = pattern(32 << 20);
    let mut file = OpenOptions::new().write(true).create_new(true).open(fx.mnt.join("f")).unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert_eq!(std::fs::metadata(fx.mnt.join("f")).unwrap().len(), data.len() as u64);
    let before = free_bytes(&fx.dir);
    std::fs::remove_file(fx.dir.join("f")).unwrap();
    wait_until("the deleted file's space coming back", || {
        free_bytes(&fx.dir) >= before + (30 << 20)
    });
    std::fs::write(fx.mnt.join("g"), &data).unwrap();
    fx.unmount();
    assert!(std::fs::read(fx.dir.join("g")).unwrap() == data);
}

// A file changed in DIR by another process is read anew at the next open through the mount
// (close-to-open, as on NFS), not served from the stale cached copy; stat shows its new size.
#[test]
fn a_file_changed_in_dir_is_read_anew() {
    let Some(mut fx) = Fixture::new(super::DataMode::Ebb, None, &[]) else { return };
    let path = fx.mnt.join("f");
    std::fs::write(&path, vec![b'a'; 8192]).unwrap();
    File::open(&path).unwrap().sync_all().unwrap();
    assert!(std::fs::read(&path).unwrap() == vec![b'a'; 8192]);
    std::thread::sleep(Duration::from_millis(20)); // another mtime than ebb's write
    std::fs::write(fx.dir.join("f"), vec![b'b'; 8192]).unwrap();
    assert!(std::fs::read(&path).unwrap() == vec![b'b'; 8192], "same size, new content");
    std::fs::write(fx.dir.join("f"), vec![b'c'; 100]).unwrap();
    std::thread::sleep(Duration::from_millis(1100)); // past the kernel's attribute cache
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 100);
    assert_eq!(std::fs::read(&path).unwrap(), vec![b'c'; 100]);
    fx.unmount();
    assert_eq!(std::fs::read(fx.dir.join("f")).unwrap(), vec![b'c'; 100]);
}
