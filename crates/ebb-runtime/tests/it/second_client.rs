//! A second client through the library (issue 33): random writes, reads, truncates, fsyncs
//! and closes through ebb on a few files of a small cache, and between opens another client
//! (a handle of its own on the same backend, as another process or NFS client has) changes,
//! grows (past ebb's last page or inside it), truncates or deletes a file that ebb has
//! fsync'ed and closed. The application then tells ebb, as the mount does when it sees the
//! backend's mtime or size moved: `File::backend_changed` at the next open, `Ebb::remove` for
//! a deletion. Every read through ebb must match a model that takes the other's changes, and
//! after ebb's last fsyncs and closes (whose trims must not cut the other's bytes) and a sync
//! the backend must equal the model. Over a memory backend, a directory (`O_DIRECT`), an NFS
//! export (the other client is a second NFS client of the same export, as another machine
//! would be) and an S3 bucket (the other replaces whole objects, as S3 clients do).

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ebb_backend::s3::test_server::TestServer;
use ebb_backend::{Backend, MemBackend, NfsBackend, NfsServer, OpenOptions, S3Backend, S3Options};
use ebb_runtime::{Builder, Ebb, File};

use crate::io::{Rng, backend_bytes};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };
const OPEN: OpenOptions = OpenOptions { create: false, truncate: false };
const NAMES: [&str; 3] = ["a", "b", "c"];
/// The largest offset and operation: files of up to about 1 MiB through an 8 MiB cache.
const MAX_OFFSET: u64 = 1 << 20;
const MAX_IO: u64 = 64 << 10;

/// The other client: its own handles on the backend ebb writes to.
enum Other {
    /// A client of the backend's own kind (the memory backend ebb writes to, or a second NFS
    /// client), changing files in place.
    Mem(Arc<dyn Backend>),
    /// An S3 client: a change replaces the whole object.
    Whole(Arc<dyn Backend>),
    Dir(PathBuf),
}

impl Other {
    fn write(&self, name: &str, bytes: &[u8], offset: u64) {
        match self {
            Other::Mem(backend) => {
                let file = backend.open(name, OPEN).unwrap();
                file.write_at(bytes, offset).unwrap();
                file.sync().unwrap();
            }
            Other::Whole(backend) => {
                let mut content = backend_bytes(&**backend, name);
                let end = offset as usize + bytes.len();
                content.resize(content.len().max(end), 0);
                content[offset as usize..end].copy_from_slice(bytes);
                Self::replace(&**backend, name, &content);
            }
            Other::Dir(dir) => {
                let file = std::fs::OpenOptions::new().write(true).open(dir.join(name)).unwrap();
                file.write_all_at(bytes, offset).unwrap();
            }
        }
    }

    fn set_len(&self, name: &str, len: u64) {
        match self {
            Other::Mem(backend) => {
                let file = backend.open(name, OPEN).unwrap();
                file.set_size(len).unwrap();
                file.sync().unwrap();
            }
            Other::Whole(backend) => {
                let mut content = backend_bytes(&**backend, name);
                content.resize(len as usize, 0);
                Self::replace(&**backend, name, &content);
            }
            Other::Dir(dir) => {
                let file = std::fs::OpenOptions::new().write(true).open(dir.join(name)).unwrap();
                file.set_len(len).unwrap();
            }
        }
    }

    fn remove(&self, name: &str) {
        match self {
            Other::Mem(backend) | Other::Whole(backend) => backend.remove(name).unwrap(),
            Other::Dir(dir) => std::fs::remove_file(dir.join(name)).unwrap(),
        }
    }

    /// Replaces `name`'s whole content (a new object over S3).
    fn replace(backend: &dyn Backend, name: &str, content: &[u8]) {
        let file = backend.open(name, OpenOptions { create: false, truncate: true }).unwrap();
        if !content.is_empty() {
            file.write_at(content, 0).unwrap();
        }
        file.sync().unwrap();
    }

    /// The file's bytes, `None` if it does not exist.
    fn read(&self, name: &str) -> Option<Vec<u8>> {
        match self {
            Other::Mem(backend) | Other::Whole(backend) => {
                backend.open(name, OPEN).ok()?;
                Some(backend_bytes(&**backend, name))
            }
            Other::Dir(dir) => std::fs::read(dir.join(name)).ok(),
        }
    }
}

/// The checker's state: the model, ebb's open handles, the files changed by the other client
/// since ebb's last open of them.
struct Checker {
    ebb: Ebb,
    other: Other,
    rng: Rng,
    model: BTreeMap<&'static str, Vec<u8>>,
    open: BTreeMap<&'static str, File>,
    changed: BTreeSet<&'static str>,
    context: String,
}

impl Checker {
    /// ebb's handle of `name` (created if new); an open after the other's change tells ebb.
    fn handle(&mut self, name: &'static str) -> &File {
        if !self.open.contains_key(name) {
            let file = self.ebb.open(name, CREATE).unwrap();
            if self.changed.remove(name) {
                file.backend_changed().unwrap();
            }
            self.model.entry(name).or_default();
            self.open.insert(name, file);
        }
        &self.open[name]
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let fill = self.rng.next();
        (0..len).map(|i| (fill.wrapping_add(i as u64 * 7) >> 3) as u8).collect()
    }

    fn write(&mut self, name: &'static str) {
        let (offset, len) = (self.rng.below(MAX_OFFSET), 1 + self.rng.below(MAX_IO) as usize);
        let bytes = self.bytes(len);
        let context = self.context.clone();
        let written = self.handle(name).write_at(&bytes, offset);
        assert_eq!(written.unwrap_or_else(|e| panic!("{context}: {e}")), len, "{context}");
        let content = self.model.get_mut(name).unwrap();
        let end = offset as usize + len;
        if content.len() < end {
            content.resize(end, 0);
        }
        content[offset as usize..end].copy_from_slice(&bytes);
    }

    fn read(&mut self, name: &'static str) {
        let (offset, len) = (self.rng.below(MAX_OFFSET), 1 + self.rng.below(MAX_IO) as usize);
        let mut got = vec![0u8; len];
        let context = self.context.clone();
        let n = self.handle(name).read_at(&mut got, offset).unwrap();
        let content = &self.model[name];
        let want = content.get(offset as usize..(offset as usize + len).min(content.len()));
        let want = want.unwrap_or(&[]);
        assert_eq!(n, want.len(), "{context}: read length at {offset}");
        if got[..n] != *want {
            let at = got.iter().zip(want).position(|(a, b)| a != b);
            panic!("{context}: {len} bytes at {offset} differ, first at {at:?}");
        }
    }

    fn truncate(&mut self, name: &'static str) {
        let size = self.rng.below(MAX_OFFSET);
        let context = self.context.clone();
        self.handle(name).set_len(size).unwrap_or_else(|e| panic!("{context}: {e}"));
        self.model.get_mut(name).unwrap().resize(size as usize, 0);
    }

    fn close(&mut self, name: &'static str) {
        if let Some(file) = self.open.remove(name) {
            file.close().unwrap_or_else(|e| panic!("{}: close: {e}", self.context));
        }
    }

    /// The other client changes `name` after ebb fsync'ed and closed it (nothing unwritten).
    fn outside(&mut self, name: &'static str) {
        if !self.model.contains_key(name) {
            return;
        }
        let context = self.context.clone();
        self.handle(name).fsync().unwrap_or_else(|e| panic!("{context}: fsync: {e}"));
        self.close(name);
        let old_len = self.model[name].len() as u64;
        match self.rng.below(8) {
            0..=2 => {
                let offset = self.rng.below(old_len + MAX_IO);
                let len = 1 + self.rng.below(MAX_IO) as usize;
                let bytes = self.bytes(len);
                self.other.write(name, &bytes, offset);
                let content = self.model.get_mut(name).unwrap();
                let end = offset as usize + len;
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[offset as usize..end].copy_from_slice(&bytes);
            }
            3 => {
                // A growth that ends inside ebb's last page (the rest of it, if any).
                let room = old_len.next_multiple_of(4096) - old_len;
                let len = 1 + self.rng.below(room.max(1)) as usize;
                let bytes = self.bytes(len);
                self.other.write(name, &bytes, old_len);
                self.model.get_mut(name).unwrap().extend_from_slice(&bytes);
            }
            4..=6 => {
                let size = self.rng.below(old_len + MAX_IO);
                self.other.set_len(name, size);
                self.model.get_mut(name).unwrap().resize(size as usize, 0);
            }
            _ => {
                self.other.remove(name);
                // The application tells ebb: its cached copy is forgotten; the file is gone.
                // Over S3 removing a missing object succeeds (DeleteObject does); elsewhere
                // the name is gone.
                match (self.ebb.remove(name), &self.other) {
                    (Ok(()), Other::Whole(_)) => {}
                    (Ok(()), _) => panic!("{context}: the other removed it"),
                    (Err(e), _) => assert_eq!(e.kind(), ErrorKind::NotFound, "{context}: {e}"),
                }
                self.model.remove(name);
                return;
            }
        }
        self.changed.insert(name);
    }
}

/// Runs `ops` operations with `seed`; the backend ends equal to the model.
fn check(ebb: Ebb, other: Other, seed: u64, ops: usize) {
    let mut checker = Checker {
        ebb,
        other,
        rng: Rng(seed),
        model: BTreeMap::new(),
        open: BTreeMap::new(),
        changed: BTreeSet::new(),
        context: String::new(),
    };
    let mut outside = 0;
    for step in 0..ops {
        let name = NAMES[checker.rng.below(NAMES.len() as u64) as usize];
        let op = checker.rng.below(20);
        checker.context = format!("seed {seed} step {step}: op {op} on {name}");
        match op {
            0..=6 => checker.write(name),
            7..=10 if checker.model.contains_key(name) => checker.read(name),
            11..=12 if checker.model.contains_key(name) => checker.truncate(name),
            13 if checker.open.contains_key(name) => checker.handle(name).fsync().unwrap(),
            14..=15 => checker.close(name),
            16..=18 => {
                outside += usize::from(checker.model.contains_key(name));
                checker.outside(name);
            }
            _ => {}
        }
    }
    for name in NAMES {
        checker.close(name);
    }
    checker.ebb.sync().unwrap();
    for name in NAMES {
        let on_backend = checker.other.read(name);
        assert_eq!(
            on_backend.as_ref().map(Vec::len),
            checker.model.get(name).map(Vec::len),
            "seed {seed}: size of {name} on the backend"
        );
        assert!(on_backend.as_ref() == checker.model.get(name), "seed {seed}: {name} differs");
    }
    assert!(outside > ops / 20, "seed {seed}: only {outside} changes by the other client");
}

// Over a memory backend: 3,000 operations, about 400 of them the other client's changes.
#[test]
fn a_second_clients_changes_between_opens_are_read_and_kept() {
    for seed in [0x9e37_79b9_7f4a_7c15, 33] {
        let backend = Arc::new(MemBackend::new());
        let ebb = Builder::new().memory(8 << 20).backend("mem", backend.clone()).build().unwrap();
        check(ebb, Other::Mem(backend), seed, 3000);
    }
}

// Over a directory (ebb writes with O_DIRECT, the other client through the page cache).
#[test]
fn a_second_clients_changes_in_a_directory_are_read_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ebb = Builder::new().memory(8 << 20).directory(dir.path()).unwrap().build().unwrap();
    check(ebb, Other::Dir(dir.path().to_path_buf()), 0x5eed_0033, 2000);
}

// Over an NFS export (ganesha): ebb is one NFS client, the other a second client of the same
// export, changing files in place (WRITE, SETATTR size, COMMIT, REMOVE).
#[test]
fn a_second_nfs_clients_changes_are_read_and_kept() {
    let test = "a_second_nfs_clients_changes_are_read_and_kept";
    if !NfsServer::available() {
        assert!(std::env::var_os("CI").is_none(), "{test}: nfs-ganesha is not installed");
        eprintln!("SKIPPED {test}: nfs-ganesha is not installed (scripts/setup installs it)");
        return;
    }
    let server = NfsServer::start().expect("start nfs-ganesha");
    let backend = NfsBackend::connect(server.url()).unwrap();
    let ebb = Builder::new().memory(8 << 20).nfs_backend("nfs", backend).build().unwrap();
    let other = NfsBackend::connect(server.url()).unwrap();
    check(ebb, Other::Mem(Arc::new(other)), 0x4e46_5333, 600);
}

// Over an S3 bucket (versitygw): the other client replaces whole objects (PutObject) or deletes
// them; ebb's application tells it at the next open, so S3's whole-second Last-Modified, which
// limits what the mount can notice by itself, does not matter here.
#[test]
fn a_second_s3_clients_changes_are_read_and_kept() {
    let Some(server) = TestServer::start("ebb-second-client") else { return };
    let options = server.options("files/");
    let backend = S3Backend::open(options.clone()).unwrap();
    let ebb = Builder::new().memory(16 << 20).s3_backend("s3", backend).build().unwrap();
    // The other client keeps no metadata cache: with one, it would not see ebb's new objects
    // for its time to live, as any caching S3 client would not.
    let other = S3Backend::open(S3Options { metadata_ttl: Duration::ZERO, ..options }).unwrap();
    check(ebb, Other::Whole(Arc::new(other)), 0x5333_0033, 400);
}
