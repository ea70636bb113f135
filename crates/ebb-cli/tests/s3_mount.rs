//! `ebb mount --backend s3://...` against a real versitygw, as a user runs it: files written,
//! renamed and fsync'ed through the mount land in the bucket; SIGTERM drains every object
//! before unmounting; SIGKILL after fsync keeps what was fsync'ed, shows nothing partial, and
//! the next start leaves no multipart upload behind.

mod support;
use support::{EBB, Running, fuse_available};

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ebb_backend::s3::test_server::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, TestServer};
use ebb_backend::{Backend, OpenOptions, S3Backend};

const MIB: usize = 1 << 20;

/// `ebb mount` of `server`'s bucket at `mnt` (state in `state`) with a 64 MiB budget.
fn mount_s3(server: &TestServer, state: &Path, mnt: &Path) -> Running {
    mount_s3_with(server, state, mnt, "64MiB")
}

fn mount_s3_with(server: &TestServer, state: &Path, mnt: &Path, memory: &str) -> Running {
    mount_s3_args(server, state, mnt, &["--memory", memory])
}

fn mount_s3_args(server: &TestServer, state: &Path, mnt: &Path, args: &[&str]) -> Running {
    let mut command = Command::new(EBB);
    command
        .args(["mount", "--backend", &format!("s3://{}/m", server.bucket())])
        .args(["--endpoint", &server.endpoint()])
        .args(args)
        .arg(mnt)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
        .env("XDG_STATE_HOME", state);
    Running::spawn(&mut command, mnt)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(31) ^ (i >> 12) as u8).wrapping_add(seed) | 1)
        .collect()
}

/// The object `m/path` as the server holds it.
fn on_server(server: &TestServer, state: &Path, path: &str) -> Option<Vec<u8>> {
    let (directory, name) =
        path.rsplit_once('/').map_or(("m/".to_owned(), path), |(d, n)| (format!("m/{d}/"), n));
    let mut options = server.options(&directory);
    options.state_dir = Some(state.join("observer"));
    let backend = S3Backend::open(options).unwrap();
    let file = match backend.open(name, OpenOptions { create: false, truncate: false }) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => panic!("{error}"),
    };
    let size = file.size().unwrap() as usize;
    let mut data = vec![0; size];
    for start in (0..size).step_by(8 * MIB) {
        let end = (start + 8 * MIB).min(size);
        file.read_at(&mut data[start..end], start as u64).unwrap();
    }
    Some(data)
}

fn setup(bucket: &str) -> Option<(TestServer, tempfile::TempDir, PathBuf)> {
    if !fuse_available() {
        return None;
    }
    let server = TestServer::start(bucket)?;
    let root = tempfile::Builder::new().prefix("ebb-cli-s3").tempdir_in("/tmp").unwrap();
    let mnt = root.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    Some((server, root, mnt))
}

// Files written, renamed into a directory and read back through the mount; SIGTERM drains,
// unmounts, and every object is complete in the bucket, with no upload left.
#[test]
fn s3_mount_writes_renames_and_drains_at_sigterm() {
    let Some((server, root, mnt)) = setup("ebb-mount-drain") else { return };
    let state = root.path().join("state");
    let mut running = mount_s3(&server, &state, &mnt);
    let big = pattern(20 * MIB + 123, 1);
    std::fs::write(mnt.join("big"), &big).unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("small"), b"small file").unwrap();
    std::fs::rename(mnt.join("small"), mnt.join("dir/renamed")).unwrap();
    assert_eq!(std::fs::read(mnt.join("dir/renamed")).unwrap(), b"small file");
    assert!(std::fs::read(mnt.join("big")).unwrap() == big);
    let names: Vec<String> = std::fs::read_dir(mnt.join("dir"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["renamed"]);
    running.signal("-TERM");
    let (status, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    assert!(on_server(&server, &state, "big").unwrap() == big, "big is not complete in the bucket");
    assert_eq!(on_server(&server, &state, "dir/renamed").unwrap(), b"small file");
    assert_eq!(on_server(&server, &state, "small"), None, "the rename left the old key");
    let backend = S3Backend::open(server.options("m/")).unwrap();
    assert_eq!(backend.multipart_uploads().unwrap(), []);
}

// Sixteen writers of 32 MiB each through a 128 MiB mount, whose cache holds far fewer than
// sixteen 8 MiB parts being filled: the granule gate has them take turns, so each part goes
// out about once (measured: 1.02 bytes uploaded per byte written, 17 completed uploads for 16
// objects; 3.2 before the gate, when every writer advanced together and the short tails went
// out again and again, each rewrite of a part costing a commit and a copy). Every object is
// whole; no upload is left.
#[test]
fn s3_mount_many_writers_in_a_small_cache_upload_each_part_about_once() {
    let Some((server, root, mnt)) = setup("ebb-mount-writers") else { return };
    let state = root.path().join("state");
    let mut running = mount_s3_with(&server, &state, &mnt, "128MiB");
    const WRITERS: u8 = 16;
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            let path = mnt.join(format!("f{i}"));
            std::thread::spawn(move || {
                let data = pattern(32 * MIB, i);
                let mut file = std::fs::File::create(&path).unwrap();
                for chunk in data.chunks(MIB) {
                    std::io::Write::write_all(&mut file, chunk).unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let stats: serde_json::Value =
        serde_json::from_str(&ebb_fuse::read_stats(&mnt).unwrap()).unwrap();
    let uploaded = stats["bdi"][0]["backend"]["bytes_uploaded"].as_u64().unwrap();
    let written = u64::from(WRITERS) * 32 * MIB as u64;
    running.signal("-TERM");
    let (status, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    for i in 0..WRITERS {
        let object = on_server(&server, &state, &format!("f{i}")).unwrap();
        assert!(object == pattern(32 * MIB, i), "f{i} is not whole in the bucket");
    }
    assert!(
        uploaded * 2 <= written * 3,
        "{uploaded} bytes uploaded for {written} written: parts went out short and again"
    );
    let backend = S3Backend::open(server.options("m/")).unwrap();
    assert_eq!(backend.multipart_uploads().unwrap(), []);
}

// SIGKILL after fsync: the fsync'ed file is whole in the bucket, a file being written is not
// visible beyond bytes written, and the next start aborts the dead mount's uploads.
#[test]
fn s3_mount_sigkill_after_fsync_keeps_what_was_fsynced() {
    let Some((server, root, mnt)) = setup("ebb-mount-kill") else { return };
    let state = root.path().join("state");
    let mut running = mount_s3(&server, &state, &mnt);
    let synced = pattern(12 * MIB, 2);
    let mut file = std::fs::File::create(mnt.join("synced")).unwrap();
    file.write_all(&synced).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let mut open = std::fs::File::create(mnt.join("unsynced")).unwrap();
    let unsynced = pattern(96 * MIB, 3);
    open.write_all(&unsynced).unwrap();
    running.kill();
    running.wait();
    drop(open);
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    assert!(on_server(&server, &state, "synced").unwrap() == synced, "fsync'ed data lost");
    if let Some(visible) = on_server(&server, &state, "unsynced") {
        let never_written =
            visible.iter().enumerate().position(|(i, b)| *b != 0 && *b != unsynced[i]);
        assert_eq!(never_written, None, "the unsynced object shows bytes never written");
    }
    let mut options = server.options("m/");
    options.state_dir = Some(state.join("observer"));
    let left = S3Backend::open(options).unwrap().multipart_uploads().unwrap();
    assert!(!left.is_empty(), "no upload was open at the kill: no crash mid-upload was tested");
    // The next mount (its start) aborts what the killed one left.
    let restarted = mount_s3(&server, &state, &mnt);
    let backend = S3Backend::open({
        let mut options = server.options("m/");
        options.state_dir = Some(state.join("check"));
        options
    })
    .unwrap();
    assert_eq!(backend.multipart_uploads().unwrap(), [], "uploads left after the restart");
    drop(restarted);
}

// A file removed (or replaced by a rename) while open stays usable through its descriptor, as
// on a local filesystem: the mount hides its key until the last close. Its writes, fsync and
// reads succeed, and after the close and a drain the bucket holds no trace of it.
#[test]
fn s3_mount_keeps_a_removed_open_file_usable() {
    use std::os::unix::fs::FileExt;
    let Some((server, root, mnt)) = setup("ebb-mount-removed") else { return };
    let state = root.path().join("state");
    let mut running = mount_s3(&server, &state, &mnt);
    let data = pattern(3 * MIB, 4);
    for replace in [false, true] {
        let path = mnt.join("f");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.write_all_at(&data, 0).unwrap();
        file.sync_all().unwrap();
        if replace {
            std::fs::write(mnt.join("g"), b"new").unwrap();
            std::fs::rename(mnt.join("g"), &path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
        file.write_all_at(&data[..MIB], 2 * MIB as u64).unwrap();
        file.sync_all().expect("fsync of the removed file");
        let mut back = vec![0; 3 * MIB];
        file.read_exact_at(&mut back, 0).unwrap();
        let mut expected = data.clone();
        expected[2 * MIB..].copy_from_slice(&data[..MIB]);
        assert!(back == expected, "the removed file reads what was written");
        drop(file);
    }
    std::fs::remove_file(mnt.join("f")).unwrap();
    running.signal("-TERM");
    let (status, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("error"), "errors reported: {stderr}");
    let backend = S3Backend::open(server.options("m/")).unwrap();
    assert_eq!(backend.multipart_uploads().unwrap(), []);
    let mut objects = Vec::new();
    let mut dirs = vec![server.root().join(server.bucket()).join("m")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten() {
            let entry = entry.unwrap();
            match entry.file_type().unwrap().is_dir() {
                true => dirs.push(entry.path()),
                false => objects.push(entry.path()),
            }
        }
    }
    assert_eq!(objects, Vec::<PathBuf>::new(), "objects left in the bucket");
}

/// `truncate(2)` of `path` (no descriptor: coreutils' `truncate` opens the file), by a child
/// process, killed if it has not ended within a minute.
fn truncate_path(path: &Path, size: u64) {
    let mut child = Command::new("perl")
        .args(["-e", "truncate($ARGV[0], $ARGV[1]) or die \"truncate: $!\\n\""])
        .arg(path)
        .arg(size.to_string())
        .spawn()
        .expect("perl runs truncate(2)");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("truncate of {} did not end within a minute", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "truncate of {} to {size}", path.display());
}

// `truncate(path, size)` without a descriptor (issue 33, defect 5): the size shows at once,
// through stat and a read, for a file cached after its close and for one never opened by this
// mount, and the object holds it once the file is closed again. Before the fix the setattr's
// answer carried the object's old size, which the kernel kept for its attribute timeout.
#[test]
fn s3_mount_truncate_by_path_shows_the_new_size_at_once() {
    let Some((server, root, mnt)) = setup("ebb-mount-truncate") else { return };
    let state = root.path().join("state");
    let data = pattern(3 * MIB, 5);
    // "old": written through an earlier mount, so this one never opened it.
    let mut earlier = mount_s3(&server, &state, &mnt);
    std::fs::write(mnt.join("old"), &data).unwrap();
    earlier.signal("-TERM");
    let (status, stderr) = earlier.wait();
    assert!(status.success(), "{stderr}");
    let mut running = mount_s3(&server, &state, &mnt);
    std::fs::write(mnt.join("cached"), &data).unwrap();
    // The last size grows "old" again: zeros past 5000 bytes.
    let mut old = data[..5000].to_vec();
    old.resize(MIB, 0);
    let steps = [("cached", MIB + 100), ("old", 5000), ("cached", 0), ("old", MIB)];
    for (i, (name, size)) in steps.into_iter().enumerate() {
        let path = mnt.join(name);
        truncate_path(&path, size as u64);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size as u64, "stat of {name}");
        let read = std::fs::read(&path).unwrap();
        assert_eq!(read.len(), size, "read of {name}");
        let want = if i == 3 { &old[..] } else { &data[..size] };
        assert!(read[..] == want[..], "{name} after its truncate to {size} bytes");
    }
    // Past the kernel's attribute timeout (1 s) the sizes come from getattr, still right.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(std::fs::metadata(mnt.join("cached")).unwrap().len(), 0, "getattr of cached");
    assert_eq!(std::fs::metadata(mnt.join("old")).unwrap().len(), MIB as u64, "getattr of old");
    running.signal("-TERM");
    let (status, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    assert_eq!(on_server(&server, &state, "cached").unwrap(), Vec::<u8>::new());
    assert!(on_server(&server, &state, "old").unwrap() == old, "the object old");
}

/// Runs `command`, killing it (by its PID) if it has not exited within `deadline`: its
/// status, stdout and stderr.
fn run_with_deadline(
    command: &mut Command,
    deadline: Duration,
) -> (std::process::ExitStatus, String) {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if deadline < start.elapsed() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not exit within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    (status, stderr)
}

/// The content of the `index`th file of a renamed directory.
fn numbered(index: usize) -> Vec<u8> {
    format!("file {index} ").repeat(index + 1).into_bytes()
}

/// The names of the files versitygw holds in the directory `m/path` of the bucket.
fn server_names(server: &TestServer, path: &str) -> Vec<String> {
    let dir = server.root().join(server.bucket()).join("m").join(path);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_type().unwrap().is_file())
        .map(|entry| entry.file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A counter of the mount's backend, from `ebb stat`.
fn backend_counter(mnt: &Path, name: &str) -> u64 {
    let stats: serde_json::Value =
        serde_json::from_str(&ebb_fuse::read_stats(mnt).unwrap()).unwrap();
    stats["bdi"][0]["backend"][name].as_u64().unwrap_or_else(|| panic!("no counter {name}"))
}

const RENAMED_FILES: usize = 100;

/// Puts `RENAMED_FILES` files and a subdirectory with one more into `m/d/` of the bucket.
fn fill_directory(server: &TestServer, state: &Path) {
    let mut options = server.options("m/d/");
    options.state_dir = Some(state.join("filler"));
    let backend = S3Backend::open(options).unwrap();
    let create = OpenOptions { create: true, truncate: true };
    for index in 0..RENAMED_FILES {
        let file = backend.open(&format!("f{index}"), create).unwrap();
        file.write_at(&numbered(index), 0).unwrap();
        file.sync().unwrap();
    }
    let mut options = server.options("m/d/sub/");
    options.state_dir = Some(state.join("filler"));
    let backend = S3Backend::open(options).unwrap();
    let file = backend.open("inner", create).unwrap();
    file.write_at(b"inner", 0).unwrap();
    file.sync().unwrap();
}

// `mv` of a directory of 100 files (and a subdirectory) is one rename on the server: no
// EXDEV, so mv copies nothing through the mount (it said "preserving times ... Operation not
// supported" per file before, and uploaded every byte again); each object is copied by
// CopyObject; the files are under the new name, none under the old, with their contents.
#[test]
fn s3_mount_mv_of_a_directory_copies_on_the_server() {
    let Some((server, root, mnt)) = setup("ebb-mount-mvdir") else { return };
    let state = root.path().join("state");
    fill_directory(&server, &state);
    let running = mount_s3(&server, &state, &mnt);
    std::fs::create_dir(mnt.join("d/empty")).unwrap();
    let (copies, uploaded) =
        (backend_counter(&mnt, "copy_object_requests"), backend_counter(&mnt, "bytes_uploaded"));
    let (status, stderr) = run_with_deadline(
        Command::new("mv").arg(mnt.join("d")).arg(mnt.join("e")),
        Duration::from_secs(60),
    );
    assert!(status.success() && stderr.is_empty(), "mv: {status}: {stderr}");
    let copied = backend_counter(&mnt, "copy_object_requests") - copies;
    assert!(copied > RENAMED_FILES as u64, "{copied} CopyObject requests for the rename");
    assert_eq!(backend_counter(&mnt, "bytes_uploaded"), uploaded, "mv copied through the mount");
    assert!(!mnt.join("d").exists(), "the old name is still there");
    for index in 0..RENAMED_FILES {
        assert_eq!(std::fs::read(mnt.join(format!("e/f{index}"))).unwrap(), numbered(index));
    }
    assert_eq!(std::fs::read(mnt.join("e/sub/inner")).unwrap(), b"inner");
    assert!(mnt.join("e/empty").is_dir(), "the empty subdirectory (a marker) did not follow");
    assert_eq!(server_names(&server, "d").len(), 0, "keys left under the old name");
    assert_eq!(server_names(&server, "e").len(), RENAMED_FILES);
    drop(running);
}

// ebb killed with SIGKILL in the middle of a directory rename: every file is under its old
// name or its new one (or both), never neither; the next start finishes the rename from the
// journal, so every file is under the new name alone, with its contents.
#[test]
fn s3_mount_sigkill_mid_directory_rename_then_restart_finishes_it() {
    let Some((server, root, mnt)) = setup("ebb-mount-mvkill") else { return };
    let state = root.path().join("state");
    fill_directory(&server, &state);
    let mut running = mount_s3(&server, &state, &mnt);
    let mut mv = Command::new("mv")
        .arg(mnt.join("d"))
        .arg(mnt.join("e"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while server_names(&server, "e").len() < RENAMED_FILES / 4 {
        if start.elapsed() > Duration::from_secs(60) || mv.try_wait().unwrap().is_some() {
            let _ = mv.kill();
            let _ = mv.wait();
            panic!("the rename did not get a quarter done while mv ran");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    running.kill();
    running.wait();
    let (old, new) = (server_names(&server, "d"), server_names(&server, "e"));
    // mv's rename fails once the mount is gone; it must not hang.
    let start = Instant::now();
    while mv.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = mv.kill();
            let _ = mv.wait();
            panic!("mv hung after the mount died");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    assert!(
        !old.is_empty(),
        "the kill did not come in the middle of the rename: {} old, {} new",
        old.len(),
        new.len()
    );
    for index in 0..RENAMED_FILES {
        let name = format!("f{index}");
        let bucket = server.root().join(server.bucket()).join("m");
        let found: Vec<Vec<u8>> = ["d", "e"]
            .iter()
            .filter_map(|dir| std::fs::read(bucket.join(dir).join(&name)).ok())
            .collect();
        assert!(!found.is_empty(), "{name} is under neither name after the kill");
        assert!(found.iter().all(|data| *data == numbered(index)), "{name} changed");
    }
    let restarted = mount_s3(&server, &state, &mnt);
    assert_eq!(backend_counter(&mnt, "renames_finished_at_start"), 1);
    assert!(!mnt.join("d").exists(), "the old name is still there after the restart");
    for index in 0..RENAMED_FILES {
        assert_eq!(std::fs::read(mnt.join(format!("e/f{index}"))).unwrap(), numbered(index));
    }
    assert_eq!(std::fs::read(mnt.join("e/sub/inner")).unwrap(), b"inner");
    assert_eq!(server_names(&server, "d").len(), 0, "keys left under the old name");
    drop(restarted);
}

/// The mount's S3 requests by kind (the counters ending in `_requests`), nonzero ones only.
fn requests(mnt: &Path) -> std::collections::BTreeMap<String, u64> {
    let stats: serde_json::Value =
        serde_json::from_str(&ebb_fuse::read_stats(mnt).unwrap()).unwrap();
    let backend = stats["bdi"][0]["backend"].as_object().unwrap();
    backend
        .iter()
        .filter_map(|(name, value)| {
            Some((name.strip_suffix("_requests")?.to_owned(), value.as_u64()?))
        })
        .filter(|(_, count)| *count > 0)
        .collect()
}

/// What `after` has more of than `before`, by kind.
fn delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .map(|(kind, count)| (kind.clone(), count - before.get(kind).copied().unwrap_or(0)))
        .filter(|(_, count)| *count > 0)
        .collect()
}

// The S3 requests one small file costs, per operation through the mount (docs/library.md
// gives each operation's minimum): create, write, close, stat, readdir and unlink of a
// 10,000-byte file in a directory, with a metadata lifetime long enough that the machine's
// pauses cannot expire it between steps. Before the metadata cache: 8, 0, 5, 1, 1 and 5
// (20 in all); with it 3, 0, 4, 0, 1 and 1 (9); with small files committed by one PutObject
// 3, 0, 1, 0, 1 and 1 (6); with a directory's whole listing answering for missing names
// (the mount made `d`, so it knows it empty) 1, 0, 1, 0, 1 and 1 (4).
#[test]
fn s3_mount_requests_per_small_file() {
    let Some((server, root, mnt)) = setup("ebb-mount-requests") else { return };
    let state = root.path().join("state");
    let running = mount_s3_args(&server, &state, &mnt, &["--metadata-ttl", "600"]);
    std::fs::create_dir(mnt.join("d")).unwrap();
    let path = mnt.join("d/small");
    let mut counts = Vec::new();
    let mut step = |name: &str, action: &mut dyn FnMut()| {
        let before = requests(&mnt);
        action();
        counts.push((name.to_owned(), delta(&before, &requests(&mnt))));
    };
    let mut file = None;
    step("create", &mut || file = Some(std::fs::File::create(&path).unwrap()));
    step("write", &mut || file.as_mut().unwrap().write_all(&pattern(10_000, 5)).unwrap());
    step("close", &mut || drop(file.take()));
    step("stat", &mut || assert_eq!(std::fs::metadata(&path).unwrap().len(), 10_000));
    step("readdir", &mut || {
        let names: Vec<_> =
            std::fs::read_dir(mnt.join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["small"]);
    });
    step("unlink", &mut || std::fs::remove_file(&path).unwrap());
    // A file another client made: `ls -l` of its directory is the listing alone, whose
    // entries carry the sizes and times.
    let mut options = server.options("m/d/");
    options.state_dir = Some(state.join("other"));
    let other = S3Backend::open(options).unwrap();
    let file = other.open("other", OpenOptions { create: true, truncate: true }).unwrap();
    file.write_at(b"from another client", 0).unwrap();
    file.sync().unwrap();
    step("ls -l", &mut || {
        let entries: Vec<_> =
            std::fs::read_dir(mnt.join("d")).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].metadata().unwrap().len(), 19);
    });
    for (name, count) in &counts {
        eprintln!("{name}: {count:?}");
    }
    let expected: [(&str, &[(&str, u64)]); 7] = [
        // The empty object that makes the file exist at once, as open(O_CREAT) promises. The
        // kernel's lookup of the new name (a file? a directory?) is answered by what the mount
        // knows of `d`'s whole listing: it made `d`, empty (a HeadObject and a ListObjectsV2
        // otherwise).
        ("create", &[("put_object", 1)]),
        ("write", &[]),
        // Written back into memory (a file under 1 MiB) and committed by one PutObject: the
        // protocol's minimum. It was CreateMultipartUpload, UploadPart, CompleteMultipartUpload
        // and a HeadObject checking the completion.
        ("close", &[("put_object", 1)]),
        // The PutObject's size (and the time it was made) answer it.
        ("stat", &[]),
        ("readdir", &[("list_objects", 1)]),
        ("unlink", &[("delete_object", 1)]),
        ("ls -l", &[("list_objects", 1)]),
    ];
    for ((name, count), (expected_name, expected)) in counts.iter().zip(expected) {
        assert_eq!(name, expected_name);
        let expected: std::collections::BTreeMap<String, u64> =
            expected.iter().map(|(kind, n)| ((*kind).to_owned(), *n)).collect();
        assert_eq!(*count, expected, "S3 requests of {name}");
    }
    assert_eq!(on_server(&server, &state, "d/small"), None);
    drop(running);
}
