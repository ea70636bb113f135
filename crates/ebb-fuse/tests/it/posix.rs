//! POSIX semantics a local filesystem has and the mount must keep: modes and owners of new
//! objects, stable inode numbers, timestamps.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use super::{Fixture, modes};

/// Runs `script` with `sh` in `dir`, prefixed by `as_user` (a command such as `setpriv ...`).
fn sh(dir: &Path, as_user: &[&str], script: &str) {
    let (program, prefix) = match as_user.split_first() {
        Some((program, rest)) => (*program, rest.to_vec()),
        None => ("sh", Vec::new()),
    };
    let mut command = Command::new(program);
    command.args(prefix);
    if !as_user.is_empty() {
        command.arg("sh");
    }
    let output = command.arg("-c").arg(script).current_dir(dir).output().unwrap();
    assert!(output.status.success(), "{script}: {}", String::from_utf8_lossy(&output.stderr));
}

/// `(mode & 0o7777, uid, gid)` of `path`, not following a symlink.
fn mode_owner(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.mode() & 0o7777, meta.uid(), meta.gid())
}

/// This process's umask (from `/proc/self/status`; setting it to read it would race with the
/// other tests' threads).
fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|line| line.strip_prefix("Umask:")).unwrap();
    u32::from_str_radix(line.trim(), 8).unwrap()
}

/// What `nobody` (uid and gid 65534, no other group) runs commands as.
const NOBODY: [&str; 4] = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];

// New objects get exactly the mode asked for (the caller's umask applied once, by the kernel,
// not ebb's own on top), keep setuid and setgid, belong to the caller, and inherit a setgid
// directory's group (and, for directories, its setgid bit), in the mount and in DIR alike.
#[test]
fn new_objects_get_the_mode_and_owner_asked_for() {
    for data in modes() {
        let Some(mut fx) = Fixture::new(data, None, &[]) else { return };
        sh(&fx.mnt, &[], "umask 0 && : > f666 && mkdir d777 && mkfifo p666 && ln -s f666 l");
        let mut expected = vec![
            ("f666", (0o666, 0, 0)),
            ("d777", (0o777, 0, 0)),
            ("p666", (0o666, 0, 0)),
            ("l", (0o777, 0, 0)),
        ];
        for (name, mode) in [("suid", 0o4777), ("sgid", 0o2777), ("sticky", 0o1777)] {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(fx.mnt.join(name))
                .unwrap();
            expected.push((name, (mode & !umask(), 0, 0)));
        }
        // Another user's objects are its own, with its modes.
        sh(&fx.mnt.join("d777"), &NOBODY, "umask 0 && : > f && mkdir d && chmod 4755 f");
        expected.push(("d777/f", (0o4755, 65534, 65534)));
        expected.push(("d777/d", (0o777, 65534, 65534)));
        // A setgid directory of a group the creator is not in passes on its group, and its
        // setgid bit to new directories.
        std::fs::create_dir(fx.mnt.join("sg")).unwrap();
        std::os::unix::fs::chown(fx.mnt.join("sg"), None, Some(4242)).unwrap();
        std::fs::set_permissions(fx.mnt.join("sg"), std::fs::Permissions::from_mode(0o2777))
            .unwrap();
        sh(&fx.mnt.join("sg"), &NOBODY, "umask 022 && : > f && mkdir d");
        expected.push(("sg/f", (0o644, 65534, 4242)));
        expected.push(("sg/d", (0o2755, 65534, 4242)));
        for (name, wanted) in &expected {
            assert_eq!(mode_owner(&fx.mnt.join(name)), *wanted, "{data:?}: {name} in the mount");
            assert_eq!(mode_owner(&fx.dir.join(name)), *wanted, "{data:?}: {name} in DIR");
        }
        fx.unmount();
    }
}

/// Makes the kernel forget every unused inode and dentry (`echo 2 > drop_caches`), so the next
/// access to a file through the mount looks it up again.
pub(crate) fn drop_kernel_inode_cache() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

// A file's inode number stays the same for its whole life: across the kernel dropping its inode
// cache (which makes the mount look the file up again) and across mounts. It is the backing
// file's, as in DIR; hard links share it.
#[test]
fn inode_numbers_are_stable() {
    let Some(mut fx) = Fixture::new(super::DataMode::Ebb, None, &[]) else { return };
    std::fs::create_dir(fx.mnt.join("d")).unwrap();
    std::fs::write(fx.mnt.join("d/f"), b"x").unwrap();
    std::fs::hard_link(fx.mnt.join("d/f"), fx.mnt.join("h")).unwrap();
    let ino = |path: &Path| std::fs::symlink_metadata(path).unwrap().ino();
    let before = [ino(&fx.mnt.join("d")), ino(&fx.mnt.join("d/f"))];
    assert_eq!(before, [ino(&fx.dir.join("d")), ino(&fx.dir.join("d/f"))]);
    for _ in 0..3 {
        drop_kernel_inode_cache();
        assert_eq!([ino(&fx.mnt.join("d")), ino(&fx.mnt.join("d/f"))], before);
        assert_eq!(ino(&fx.mnt.join("h")), before[1]);
    }
    fx.unmount();
}

/// Waits (up to a minute, a hang detector) until `path` in DIR has `len` bytes and the cache
/// holds nothing unwritten: ebb wrote the file back (a write-back ends after the mtime is put
/// back, so the page is clean only then).
fn wait_written_back(mount: &ebb_fuse::Mount, path: &Path, len: u64) {
    let start = std::time::Instant::now();
    while std::fs::metadata(path).map_or(0, |meta| meta.len()) != len
        || !mount.unwritten().starts_with("0 KiB dirty, 0 KiB under writeback")
    {
        assert!(start.elapsed() < Duration::from_secs(60), "{} never written back", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

// Times are POSIX's: a write sets mtime and ctime when it returns, `utimes` (what `cp -p`,
// `tar x` and `touch -d` do after writing) keeps the mtime it set, and writing the data back to
// DIR (in the background, at fsync, at unmount) moves neither: not in the mount, and not the
// mtime in DIR.
#[test]
fn writeback_keeps_the_times_posix_gives() {
    let knobs = [("dirty_expire_centisecs", "10"), ("dirty_writeback_centisecs", "10")];
    let Some(mut fx) = Fixture::new(super::DataMode::Ebb, None, &knobs) else { return };
    let (mnt, dir) = (fx.mnt.clone(), fx.dir.clone());
    let (m, d) = (|name: &str| mnt.join(name), |name: &str| dir.join(name));
    let data = vec![7u8; 1 << 20];
    let preserved = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let mtime = |path: &Path| std::fs::metadata(path).unwrap().modified().unwrap();
    // cp -p: the data, then the source's mtime, then close; background writeback comes later.
    let mut copied = File::create(m("copied")).unwrap();
    copied.write_all(&data).unwrap();
    copied.set_modified(preserved).unwrap();
    drop(copied);
    wait_written_back(fx.mount.as_ref().unwrap(), &d("copied"), data.len() as u64);
    assert_eq!(mtime(&m("copied")), preserved);
    assert_eq!(mtime(&d("copied")), preserved);
    // A plain write: mtime and ctime are the write's, and stay so through an fsync later.
    let mut written = File::create(m("written")).unwrap();
    written.write_all(&data).unwrap();
    let before = std::fs::metadata(m("written")).unwrap();
    std::thread::sleep(Duration::from_millis(50)); // a write-back now has a later time
    written.sync_all().unwrap();
    let after = std::fs::metadata(m("written")).unwrap();
    assert_eq!(after.modified().unwrap(), before.modified().unwrap());
    assert_eq!((after.ctime(), after.ctime_nsec()), (before.ctime(), before.ctime_nsec()));
    assert_eq!(mtime(&d("written")), before.modified().unwrap());
    // touch -d after a write, then an fsync and the unmount's drain.
    written.write_all(b"more").unwrap();
    let status = Command::new("touch").args(["-m", "-d", "@1000000000"]).arg(m("written")).status();
    assert!(status.unwrap().success());
    written.sync_all().unwrap();
    assert_eq!(mtime(&m("written")), preserved);
    drop(written);
    fx.unmount();
    assert_eq!(mtime(&d("written")), preserved);
    assert_eq!(mtime(&d("copied")), preserved);
}

// Extended attributes pass through: set, replace, list, get and remove, as in DIR; the stats
// attribute of the root cannot be set. fallocate reserves space in DIR: the plain mode grows
// the file's size, KEEP_SIZE does not.
#[test]
fn xattrs_and_fallocate_pass_through() {
    use rustix::fs::{FallocateFlags, XattrFlags};
    for data in modes() {
        let Some(mut fx) = Fixture::new(data, None, &[]) else { return };
        let path = fx.mnt.join("f");
        std::fs::write(&path, b"x").unwrap();
        rustix::fs::setxattr(&path, "user.a", b"1", XattrFlags::CREATE).unwrap();
        let again = rustix::fs::setxattr(&path, "user.a", b"2", XattrFlags::CREATE);
        assert_eq!(again, Err(rustix::io::Errno::EXIST));
        rustix::fs::setxattr(&path, "user.a", b"22", XattrFlags::REPLACE).unwrap();
        rustix::fs::setxattr(&path, "user.b", b"", XattrFlags::empty()).unwrap();
        let mut value = [0u8; 16];
        let len = rustix::fs::getxattr(fx.dir.join("f"), "user.a", &mut value).unwrap();
        assert_eq!(&value[..len], b"22");
        let mut list = [0u8; 64];
        let len = rustix::fs::listxattr(&path, &mut list).unwrap();
        assert_eq!(&list[..len], b"user.a\0user.b\0");
        rustix::fs::removexattr(&path, "user.a").unwrap();
        assert_eq!(
            rustix::fs::getxattr(&path, "user.a", &mut value),
            Err(rustix::io::Errno::NODATA)
        );
        let stats =
            rustix::fs::setxattr(&fx.mnt, ebb_fuse::STATS_XATTR, b"{}", XattrFlags::empty());
        assert_eq!(stats, Err(rustix::io::Errno::PERM));

        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        rustix::fs::fallocate(&file, FallocateFlags::KEEP_SIZE, 0, 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1);
        assert!(std::fs::metadata(fx.dir.join("f")).unwrap().blocks() >= 2048);
        rustix::fs::fallocate(&file, FallocateFlags::empty(), 4096, 2 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096 + (2 << 20));
        drop(file);
        fx.unmount();
        let meta = std::fs::metadata(fx.dir.join("f")).unwrap();
        assert_eq!(meta.len(), 4096 + (2 << 20), "{data:?}");
        assert_eq!(std::fs::read(fx.dir.join("f")).unwrap()[..2], [b'x', 0]);
    }
}

// fallocate's hole and zero modes through the cache: a punched or zeroed range reads as zeros
// at once, whether the cache held it clean (written back) or dirty, partial pages included; a
// hole frees space in DIR; ZERO_RANGE without KEEP_SIZE grows the file; the rest is intact.
#[test]
fn punched_and_zeroed_ranges_read_as_zeros() {
    use rustix::fs::FallocateFlags as F;
    for data in modes() {
        let Some(mut fx) = Fixture::new(data, None, &[]) else { return };
        let path = fx.mnt.join("f");
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        let mut model = vec![b'x'; 1 << 20];
        std::os::unix::fs::FileExt::write_all_at(&file, &model, 0).unwrap();
        file.sync_all().unwrap(); // clean in the cache
        std::os::unix::fs::FileExt::write_all_at(&file, &[b'y'; 8192], 65536).unwrap(); // dirty
        model[65536..73728].fill(b'y');
        rustix::fs::fallocate(&file, F::PUNCH_HOLE | F::KEEP_SIZE, 1000, 600_000).unwrap();
        model[1000..601_000].fill(0);
        rustix::fs::fallocate(&file, F::ZERO_RANGE, 900_000, 300_000).unwrap();
        model[900_000..].fill(0);
        model.resize(1_200_000, 0);
        let read = std::fs::read(&path).unwrap();
        assert!(read == model, "{data:?}: the mount must read the model");
        drop(file);
        fx.unmount();
        assert!(std::fs::read(fx.dir.join("f")).unwrap() == model, "{data:?}: DIR differs");
        let blocks = std::fs::metadata(fx.dir.join("f")).unwrap().blocks();
        assert!(blocks * 512 < 1_000_000, "{data:?}: the hole must free space ({blocks} blocks)");
    }
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

// A file removed (or replaced by a rename) while open stays usable through its descriptor, as
// on a local filesystem, also over NFS, whose server destroys a removed file at once: the
// mount hides its name until the last close, as the kernel's NFS client does. Writes, reads,
// fsync and close of the removed file report nothing, and no hidden name outlives the close.
#[test]
fn a_removed_open_file_stays_usable_over_nfs() {
    use std::os::unix::fs::FileExt;
    let Some(mut fx) = Fixture::nfs(Some(64 << 20)) else { return };
    let data: Vec<u8> = (0..(3 << 20) as u32).map(|i| (i % 251) as u8).collect();
    for replace in [false, true] {
        let path = fx.mnt.join("f");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.write_all_at(&data, 0).unwrap();
        if replace {
            std::fs::write(fx.mnt.join("g"), b"new").unwrap();
            std::fs::rename(fx.mnt.join("g"), &path).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"new", "the rename's result");
        } else {
            std::fs::remove_file(&path).unwrap();
            assert!(!path.exists(), "the name is gone");
        }
        let hidden = names_in(&fx.dir);
        assert!(hidden.iter().any(|n| n.starts_with(".ebb-removed-")), "hidden: {hidden:?}");
        file.write_all_at(&data[..4096], 1 << 20).unwrap();
        file.sync_all().expect("fsync of the removed file");
        let mut back = vec![0; data.len()];
        file.read_exact_at(&mut back, 0).unwrap();
        let mut expected = data.clone();
        expected[1 << 20..(1 << 20) + 4096].copy_from_slice(&data[..4096]);
        assert!(back == expected, "the removed file reads what was written");
        drop(file);
        let names = names_in(&fx.dir);
        let want: Vec<String> = if replace { vec!["f".into()] } else { vec![] };
        // The release that removes the hidden name may follow close(2) by a moment.
        for _ in 0..500 {
            if names_in(&fx.dir) == want {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(names_in(&fx.dir), want, "after the close (before: {names:?})");
        let _ = std::fs::remove_file(&path);
    }
    fx.unmount();
}

// A write by another user clears setuid, and setgid where group execute is set (ext4's rule;
// with direct IO the kernel leaves it to the filesystem): over a directory (ebb's cache and the
// passthrough) and over NFS. A setgid file without group execute keeps its bit.
#[test]
fn writes_by_another_user_clear_setuid_and_setgid() {
    let mut fixtures: Vec<Fixture> =
        modes().into_iter().filter_map(|data| Fixture::new(data, None, &[])).collect();
    fixtures.extend(Fixture::nfs(None));
    for mut fx in fixtures {
        for (name, mode, after) in [
            ("u", 0o4777, 0o777),
            ("g", 0o2777, 0o777),
            ("ug", 0o6777, 0o777),
            ("l", 0o2766, 0o2766),
        ] {
            let path = fx.mnt.join(name);
            std::fs::write(&path, b"root\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(mode_owner(&path).0, mode, "{name}: the mode as set");
            sh(&fx.mnt, &NOBODY, &format!("echo x >> {name}"));
            assert_eq!(mode_owner(&path).0, after, "{name} ({mode:o}) after nobody's write");
            assert_eq!(std::fs::read(&path).unwrap(), b"root\nx\n");
            // The same for a truncate and an open with O_TRUNC (the kernel's setattr).
            for change in [format!("truncate -s 1 {name}"), format!(": > {name}")] {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
                sh(&fx.mnt, &NOBODY, &change);
                assert_eq!(mode_owner(&path).0, after, "{name} ({mode:o}) after {change}");
            }
        }
        fx.unmount();
    }
}

// Over NFS a file unlinked while its last descriptor's RELEASE is still on its way is hidden
// (renamed to `.ebb-removed-*`): an rmdir of its directory right after must not fail.
#[test]
fn rmdir_right_after_unlink_over_nfs() {
    let Some(mut fx) = Fixture::nfs(None) else { return };
    for i in 0..200 {
        let dir = fx.mnt.join(format!("d{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("f"), b"x").unwrap();
        std::fs::remove_file(dir.join("f")).unwrap();
        if let Err(error) = std::fs::remove_dir(&dir) {
            panic!("loop {i}: rmdir right after unlink: {error}");
        }
    }
    fx.unmount();
}
