//! Integration tests of ebb-fuse: real mounts (we run as root), driven through the kernel with
//! ordinary file system calls.
//!
//! Every test mounts on a fresh temporary directory and holds the [`Mount`] until it ends; if
//! the test fails, dropping the `Mount` detaches it, so no mount is left behind. A machine
//! without `/dev/fuse` skips these tests with a message saying SKIPPED, unless the environment
//! variable `CI` is set: then a missing precondition fails the test (see [`precondition`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ebb_backend::s3::test_server::TestServer;
use ebb_backend::{DirNamespace, NfsNamespace, NfsServer, S3Backend, S3Namespace};
use ebb_fuse::{DataMode, Mount, MountConfig};

mod ending;
mod errors;
mod posix;
mod racing;
mod random;
mod requests;
mod uring;

use random::{random_operations, random_operations_over_nfs, random_operations_over_s3};

/// A mount on fresh directories; `dir` is the backend, `mnt` the mountpoint. The mount is
/// the first field so that it is dropped (detached) before the directories are removed.
struct Fixture {
    mount: Option<Mount>,
    dir: PathBuf,
    mnt: PathBuf,
    _root: tempfile::TempDir,
    /// The NFS server behind the mount, if any (stopped after the mount is gone).
    _server: Option<NfsServer>,
    /// The S3 server behind the mount, if any (stopped after the mount is gone).
    s3: Option<TestServer>,
}

impl Fixture {
    /// `None` (with a message) when this machine cannot mount FUSE.
    fn new(data: DataMode, memory: Option<u64>, knobs: &[(&str, &str)]) -> Option<Fixture> {
        Fixture::with_kept(data, memory, knobs, None)
    }

    fn with_kept(
        data: DataMode,
        memory: Option<u64>,
        knobs: &[(&str, &str)],
        kept_closed_files: Option<usize>,
    ) -> Option<Fixture> {
        if !precondition(Path::new("/dev/fuse").exists(), "/dev/fuse is missing") {
            return None;
        }
        let root = tempfile::Builder::new().prefix("ebb-fuse-it").tempdir_in("/tmp").unwrap();
        let dir = root.path().join("dir");
        let mnt = root.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        let config = MountConfig {
            mountpoint: mnt.clone(),
            memory,
            knobs: knobs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            data,
            metrics: None,
            trace: None,
            fuse_loop: None,
        };
        let namespace = namespace(data, &dir);
        let mount = match kept_closed_files {
            Some(kept) => Mount::start_keeping(&config, namespace, kept),
            None => Mount::start(&config, namespace),
        }
        .expect("mount");
        Some(Fixture { mount: Some(mount), dir, mnt, _root: root, _server: None, s3: None })
    }

    /// A mount of ebb's data path on `dir` (an existing directory) at a fresh mountpoint.
    fn on(dir: &Path, memory: Option<u64>) -> Option<Fixture> {
        if !precondition(Path::new("/dev/fuse").exists(), "/dev/fuse is missing") {
            return None;
        }
        let root = tempfile::Builder::new().prefix("ebb-fuse-it").tempdir_in("/tmp").unwrap();
        let mnt = root.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let config = MountConfig { mountpoint: mnt.clone(), memory, ..MountConfig::default() };
        let mount = Mount::start(&config, namespace(DataMode::Ebb, dir)).expect("mount");
        Some(Fixture {
            mount: Some(mount),
            dir: dir.to_path_buf(),
            mnt,
            _root: root,
            _server: None,
            s3: None,
        })
    }

    /// A mount of a fresh NFS export (nfs-ganesha through `scripts/nfs-server`) at a fresh
    /// mountpoint; `dir` is the exported directory as this machine sees it.
    fn nfs(memory: Option<u64>) -> Option<Fixture> {
        if !precondition(Path::new("/dev/fuse").exists(), "/dev/fuse is missing")
            || !precondition(NfsServer::available(), "nfs-ganesha is not installed")
        {
            return None;
        }
        let server = NfsServer::start().expect("start nfs-ganesha");
        let root = tempfile::Builder::new().prefix("ebb-fuse-it").tempdir_in("/tmp").unwrap();
        let mnt = root.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let config = MountConfig { mountpoint: mnt.clone(), memory, ..MountConfig::default() };
        let namespace = NfsNamespace::connect(server.url()).expect("mount the export");
        let mount = Mount::start(&config, namespace).expect("mount");
        let dir = server.export_dir();
        Some(Fixture { mount: Some(mount), dir, mnt, _root: root, _server: Some(server), s3: None })
    }

    /// A mount of a fresh bucket of a local versitygw (`scripts/s3-server`) under the prefix
    /// `m/`, with no metadata lifetime (`--metadata-ttl 0`: every open asks the server, so
    /// another client's change is seen at the next open); `dir` is the prefix's directory in
    /// versitygw's posix store (each object a plain file).
    fn s3(memory: Option<u64>) -> Option<Fixture> {
        if !precondition(Path::new("/dev/fuse").exists(), "/dev/fuse is missing") {
            return None;
        }
        let server = TestServer::start("ebb-fuse-it")?;
        let root = tempfile::Builder::new().prefix("ebb-fuse-it").tempdir_in("/tmp").unwrap();
        let mnt = root.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let config = MountConfig { mountpoint: mnt.clone(), memory, ..MountConfig::default() };
        let mut options = server.options("m/");
        options.metadata_ttl = std::time::Duration::ZERO;
        let namespace = S3Namespace::new(S3Backend::open(options).expect("open the bucket"));
        let mount = Mount::start(&config, namespace).expect("mount");
        let dir = server.root().join(server.bucket()).join("m");
        Some(Fixture { mount: Some(mount), dir, mnt, _root: root, _server: None, s3: Some(server) })
    }

    fn unmount(&mut self) {
        self.mount.take().expect("mounted").unmount().expect("unmount");
    }
}

/// Whether a test's precondition holds. When it does not, the test says SKIPPED on stderr and
/// returns early, except under CI (the environment variable `CI` set), where the machine is
/// supposed to have everything and a missing precondition fails the test instead of passing it.
fn precondition(holds: bool, missing: &str) -> bool {
    if holds {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{missing}, and CI is set: this test must run");
    eprintln!("SKIPPED: {missing}");
    false
}

/// The namespace of `dir` a mount with the data path `data` needs: files with direct IO for
/// ebb's cache, buffered for the passthrough.
fn namespace(data: DataMode, dir: &Path) -> DirNamespace {
    match data {
        DataMode::Ebb => DirNamespace::open(dir),
        DataMode::Passthrough => DirNamespace::open_buffered(dir),
    }
    .expect("namespace")
}

/// The data paths to test: ebb's (the product) and the plain passthrough.
fn modes() -> [DataMode; 2] {
    [DataMode::Passthrough, DataMode::Ebb]
}

/// Reads `len` bytes at `offset` (fewer at end of file).
pub(crate) fn read_range(file: &File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    let mut done = 0;
    while done < len {
        let read = file.read_at(&mut buf[done..], offset + done as u64).expect("read");
        if read == 0 {
            break;
        }
        done += read;
    }
    buf.truncate(done);
    buf
}

#[test]
fn random_operations_match_the_model_through_ebb() {
    for seed in [1, 2] {
        random_operations(DataMode::Ebb, seed, 3000, None);
    }
    // No closed file kept attached: stat and truncate of closed files attach for the call.
    random_operations(DataMode::Ebb, 4, 3000, Some(0));
}

// The same checker on a mount of an NFS export: names, bytes, modes, links, times and inode
// numbers through the mount, and the export's directory equal to the model after the unmount.
#[test]
fn random_operations_match_the_model_over_nfs() {
    random_operations_over_nfs(5, 2000);
}

// A mount of an NFS export gives the engine the writeback settings the library's
// `Builder::nfs` gives it: the backend declares them (the RPC layer's queue depth included,
// which the builder once set only on its own NFS path, capping a mount's at the IO threads).
#[test]
fn an_nfs_mount_and_the_library_give_the_engine_the_same_backend_settings() {
    let Some(mut fx) = Fixture::nfs(None) else { return };
    let mounted = fx.mount.as_ref().unwrap().engine_config().expect("ebb's data path");
    let url = fx._server.as_ref().unwrap().url().to_owned();
    let library = ebb_runtime::Builder::new().nfs(&url).unwrap().build().unwrap();
    let mut expected = library.config().backends[0].clone();
    let mut got = mounted.backends[0].clone();
    assert!(got.client_queue && got.queue_depth > 8, "the RPC layer's queue: {got:?}");
    expected.name = String::new();
    got.name = String::new();
    // The speed a backend declares is measured at connect; each connection measures its own.
    expected.declared_write_bandwidth = None;
    got.declared_write_bandwidth = None;
    assert_eq!(got, expected);
    drop(library);
    fx.unmount();
}

// The same checker on a mount of an S3 bucket (versitygw), with the operations S3 refuses
// checked as refused: hard links (EPERM), chmod, utimes and fallocate (EOPNOTSUPP).
#[test]
fn random_operations_match_the_model_over_s3() {
    random_operations_over_s3(6, 600);
}

#[test]
fn random_operations_match_the_model_through_passthrough() {
    random_operations(DataMode::Passthrough, 3, 2000, None);
}

fn raw_error<T: std::fmt::Debug>(result: io::Result<T>) -> Option<i32> {
    result.expect_err("the call must fail").raw_os_error()
}

// Each failing call reports the errno a local filesystem would.
#[test]
fn errors_map_to_the_right_errno() {
    for data in modes() {
        let Some(mut fx) = Fixture::new(data, None, &[]) else { return };
        let m = |name: &str| fx.mnt.join(name);
        std::fs::create_dir(m("d")).unwrap();
        std::fs::write(m("d/f"), b"x").unwrap();
        std::fs::write(m("f"), b"y").unwrap();
        assert_eq!(raw_error(File::open(m("missing"))), Some(libc::ENOENT));
        assert_eq!(raw_error(std::fs::create_dir(m("d"))), Some(libc::EEXIST));
        assert_eq!(raw_error(std::fs::remove_dir(m("d"))), Some(libc::ENOTEMPTY));
        assert_eq!(raw_error(std::fs::remove_dir(m("f"))), Some(libc::ENOTDIR));
        assert_eq!(raw_error(std::fs::remove_file(m("d"))), Some(libc::EISDIR));
        assert_eq!(raw_error(std::fs::remove_file(m("missing"))), Some(libc::ENOENT));
        assert_eq!(raw_error(std::fs::read_link(m("f"))), Some(libc::EINVAL));
        assert_eq!(raw_error(File::create(m("nodir/x"))), Some(libc::ENOENT));
        assert_eq!(raw_error(File::create(m("f/x"))), Some(libc::ENOTDIR));
        assert_eq!(raw_error(OpenOptions::new().write(true).open(m("d"))), Some(libc::EISDIR));
        assert_eq!(raw_error(std::fs::hard_link(m("d"), m("d2"))), Some(libc::EPERM));
        assert_eq!(
            raw_error(OpenOptions::new().write(true).create_new(true).open(m("f"))),
            Some(libc::EEXIST)
        );
        std::fs::create_dir(m("e")).unwrap();
        assert_eq!(raw_error(std::fs::rename(m("e"), m("d/f"))), Some(libc::ENOTDIR));
        assert_eq!(raw_error(std::fs::rename(m("f"), m("d"))), Some(libc::EISDIR));
        assert_eq!(raw_error(std::fs::rename(m("e"), m("d"))), Some(libc::ENOTEMPTY));
        assert_eq!(raw_error(std::fs::rename(m("d"), m("d/sub"))), Some(libc::EINVAL));
        let long = "n".repeat(300);
        assert_eq!(raw_error(File::create(m(&long))), Some(libc::ENAMETOOLONG));
        // Permissions are checked by the kernel against the caller (default_permissions).
        std::fs::set_permissions(m("f"), std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(std::fs::metadata(fx.dir.join("f")).unwrap().mode() & 0o777, 0o400);
        // Writes after the drain started are refused as on a read-only filesystem.
        let file = OpenOptions::new().write(true).open(m("d/f")).unwrap();
        fx.mount.as_ref().unwrap().stop_writes();
        assert_eq!(raw_error(file.write_at(b"z", 0)), Some(libc::EROFS));
        assert_eq!(raw_error(File::create(m("new"))), Some(libc::EROFS));
        assert_eq!(raw_error(std::fs::remove_file(m("f"))), Some(libc::EROFS));
        assert_eq!(raw_error(std::fs::create_dir(m("new"))), Some(libc::EROFS));
        drop(file);
        fx.unmount();
        assert_eq!(std::fs::read(fx.dir.join("d/f")).unwrap(), b"x");
    }
}

// Namespace operations a user expects: directories, symlinks, hard links, renames across
// directories, chmod, utimes, mknod of a fifo, readdir, statfs, fsyncdir; each visible in DIR.
#[test]
fn metadata_operations_pass_through_to_dir() {
    for data in modes() {
        let Some(mut fx) = Fixture::new(data, None, &[]) else { return };
        let m = |name: &str| fx.mnt.join(name);
        std::fs::create_dir_all(m("x/y")).unwrap();
        std::fs::write(m("x/y/file"), b"content").unwrap();
        std::os::unix::fs::symlink("y/file", m("x/link")).unwrap();
        assert_eq!(std::fs::read_link(m("x/link")).unwrap(), Path::new("y/file"));
        assert_eq!(std::fs::read(m("x/link")).unwrap(), b"content");
        std::fs::hard_link(m("x/y/file"), m("hard")).unwrap();
        assert_eq!(std::fs::metadata(m("hard")).unwrap().nlink(), 2);
        std::fs::rename(m("x/y"), m("z")).unwrap();
        assert_eq!(std::fs::read(m("z/file")).unwrap(), b"content");
        std::fs::set_permissions(m("z/file"), std::fs::Permissions::from_mode(0o640)).unwrap();
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        File::options().write(true).open(m("z/file")).unwrap().set_modified(when).unwrap();
        let meta = std::fs::metadata(fx.dir.join("z/file")).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o640);
        assert_eq!(meta.modified().unwrap(), when);
        assert_eq!(std::fs::metadata(m("z/file")).unwrap().modified().unwrap(), when);
        let status = std::process::Command::new("mkfifo").arg(m("fifo")).status().unwrap();
        assert!(status.success());
        assert!(std::fs::metadata(fx.dir.join("fifo")).unwrap().file_type().is_fifo_like());
        let mut names: Vec<String> = std::fs::read_dir(fx.mnt.as_path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["fifo", "hard", "x", "z"]);
        let statfs = rustix::fs::statvfs(fx.mnt.as_path()).unwrap();
        assert!(statfs.f_blocks > 0 && statfs.f_bsize > 0);
        File::open(m("z")).unwrap().sync_all().unwrap();
        std::fs::remove_file(m("hard")).unwrap();
        std::fs::remove_file(m("x/link")).unwrap();
        std::fs::remove_dir(m("x")).unwrap();
        fx.unmount();
        assert_eq!(std::fs::read(fx.dir.join("z/file")).unwrap(), b"content");
        assert!(!fx.dir.join("x").exists());
    }
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}

impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_fifo(self)
    }
}

// SQLite in WAL mode (shared mappings of its -shm file, FUSE_DIRECT_IO_ALLOW_MMAP) runs on
// the mount: the sqlite3 CLI, in a child process (the mapping faults on the mount, which this
// process serves), makes a WAL database, inserts 5,000 rows, and a second run reads them back.
#[test]
fn sqlite_in_wal_mode_runs_on_the_mount() {
    let sqlite = Path::new("/usr/bin/sqlite3");
    if !precondition(sqlite.exists(), "sqlite3 is not installed (scripts/setup installs it)") {
        return;
    }
    let Some(mut fx) = Fixture::new(DataMode::Ebb, None, &[]) else { return };
    let db = fx.mnt.join("wal.db");
    let create = "PRAGMA journal_mode=WAL; CREATE TABLE t(n INTEGER, s TEXT); \
        WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 5000) \
        INSERT INTO t SELECT n, printf('row %d', n) FROM c; SELECT count(*) FROM t;";
    let out = run_with_deadline(sqlite, &db, create);
    assert_eq!(out.trim(), "wal\n5000", "sqlite3 in WAL mode on the mount");
    let check = "PRAGMA journal_mode; SELECT count(*), sum(n), max(s) FROM t;";
    let out = run_with_deadline(sqlite, &db, check);
    assert_eq!(out.trim(), "wal\n5000|12502500|row 999", "the rows after reopening");
    fx.unmount();
}

/// Runs `sqlite3 DB SQL` in a child process, killed (by its PID) after 60 s; its stdout.
fn run_with_deadline(sqlite: &Path, db: &Path, sql: &str) -> String {
    let mut child = std::process::Command::new(sqlite)
        .arg(db)
        .arg(sql)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start sqlite3");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if child.try_wait().expect("wait for sqlite3").is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sqlite3 did not finish within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("sqlite3 output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sqlite3 failed: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8")
}

// stat through the mount reports the size ebb knows, and ebb stat's source (the root's xattr)
// answers with the runtime's fields.
#[test]
fn size_and_stats_come_from_ebb() {
    let Some(mut fx) = Fixture::new(DataMode::Ebb, Some(256 << 20), &[]) else { return };
    let path = fx.mnt.join("s");
    let file = File::create(&path).unwrap();
    file.write_all_at(&vec![1u8; 5 << 20], 0).unwrap();
    file.write_all_at(b"tail", 5 << 20).unwrap();
    let expected = (5 << 20) + 4;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), expected);
    assert_eq!(file.metadata().unwrap().len(), expected);
    let stats = ebb_fuse::read_stats(&fx.mnt).unwrap();
    let value: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert!(value.is_object(), "{stats}");
    // The two reads are a moment apart: the length of the recent-pauses window (ms since its
    // start) may differ by one, and the mount's request counts by the requests between them
    // (a child another test forks closes its inherited copy of this file's descriptor at its
    // exec: a FLUSH); the rest is the same.
    let without_clock = |json: &str| {
        let mut value: serde_json::Value = serde_json::from_str(json).unwrap();
        value["pauses"]["recent"]["window_ms"] = serde_json::Value::Null;
        value["fuse"] = serde_json::Value::Null;
        value
    };
    let direct = fx.mount.as_ref().unwrap().stats_json();
    assert_eq!(without_clock(&stats), without_clock(&direct), "{stats}\n{direct}");
    drop(file);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), expected);
    fx.unmount();
    assert_eq!(std::fs::metadata(fx.dir.join("s")).unwrap().len(), expected);
    let error = ebb_fuse::read_stats(&fx.dir).unwrap_err();
    assert!(error.to_string().contains("not the root of an ebb mount"), "{error}");
}

// The kernel keeps no copy of the data: after writing and reading a file through the mount
// (and fsync, so ebb wrote it to DIR), none of the backing file's pages are in the kernel's
// page cache (ebb writes it with O_DIRECT; the FUSE side is direct IO, so it has none either,
// which the shared mmap test shows). Uses util-linux's fincore; skipped without it.
#[test]
fn the_kernel_caches_no_copy_of_the_data() {
    let probe = std::process::Command::new("fincore").arg("--version").output();
    if !precondition(probe.is_ok_and(|p| p.status.success()), "fincore (util-linux) is missing") {
        return;
    }
    let Some(mut fx) = Fixture::new(DataMode::Ebb, Some(128 << 20), &[]) else { return };
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut options = OpenOptions::new();
    let file = options.read(true).write(true).create_new(true).open(fx.mnt.join("f")).unwrap();
    file.write_all_at(&data, 0).unwrap();
    file.sync_all().unwrap();
    assert!(read_range(&file, 0, data.len()) == data);
    drop(file);
    let resident = |path: &Path| {
        let output = std::process::Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().parse::<u64>().unwrap()
    };
    assert_eq!(resident(&fx.dir.join("f")), 0);
    fx.unmount();
    assert_eq!(resident(&fx.dir.join("f")), 0);
    assert!(std::fs::read(fx.dir.join("f")).unwrap() == data);
}

/// `Mount::start`'s error for a mount of `backend` on `mountpoint` with `memory`, which must
/// be refused (at the namespace or at the mount).
fn start_error(backend: &Path, mountpoint: &Path, memory: Option<u64>) -> io::Error {
    let config = MountConfig {
        mountpoint: mountpoint.to_path_buf(),
        memory,
        knobs: Vec::new(),
        data: DataMode::Ebb,
        metrics: None,
        trace: None,
        fuse_loop: None,
    };
    match DirNamespace::open(backend).and_then(|namespace| Mount::start(&config, namespace)) {
        Ok(mount) => {
            drop(mount);
            panic!("{} on {} must be refused", backend.display(), mountpoint.display());
        }
        Err(error) => error,
    }
}

// Places and budgets that cannot work are refused at start with a message naming the problem:
// a mountpoint inside the backend (the mount would contain itself and deadlock), a mountpoint
// that is a regular file, a memory budget past the machine's available memory, and a backend
// directory ebb cannot write to (named in the error).
#[test]
fn impossible_mounts_are_refused_at_start() {
    let root = tempfile::Builder::new().prefix("ebb-fuse-refuse").tempdir_in("/tmp").unwrap();
    let (dir, mnt) = (root.path().join("dir"), root.path().join("mnt"));
    std::fs::create_dir_all(dir.join("inner")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(root.path().join("file"), b"x").unwrap();
    for inside in [dir.join("inner"), dir.clone()] {
        let error = start_error(&dir, &inside, None);
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
        assert!(error.to_string().contains("inside the backend directory"), "{error}");
    }
    let error = start_error(&dir, &root.path().join("file"), None);
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
    assert!(error.to_string().contains("is not a directory"), "{error}");
    let error = start_error(&dir, &mnt, Some(1 << 40));
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
    assert!(error.to_string().contains("available"), "{error}");
    let error = start_error(Path::new("/proc"), &mnt, None);
    assert!(error.to_string().contains("/proc"), "{error}");
}
