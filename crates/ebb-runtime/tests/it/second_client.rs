//! A second client through the library (issue 33): random writes, reads, truncates, fsyncs
//! and closes through ebb on a few files of a small cache, and between opens another client
//! (a handle of its own on the same backend, as another process or NFS client has) changes,
//! grows (past ebb's last page or inside it), truncates or deletes a file that ebb has
//! fsync'ed and closed. The application then tells ebb, as the mount does when it sees the
//! backend's mtime or size moved: `File::backend_changed` at the next open, `Ebb::remove` for
//! a deletion. Every read through ebb must match a model that takes the other's changes, and
//! after ebb's last fsyncs and closes (whose trims must not cut the other's bytes) and a sync
//! the backend must equal the model. Over a memory backend and a directory (`O_DIRECT`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use ebb_backend::{Backend, MemBackend, OpenOptions};
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
    Mem(Arc<MemBackend>),
    Dir(PathBuf),
}

impl Other {
    fn write(&self, name: &str, bytes: &[u8], offset: u64) {
        match self {
            Other::Mem(backend) => {
                backend.open(name, OPEN).unwrap().write_at(bytes, offset).unwrap();
            }
            Other::Dir(dir) => {
                let file = std::fs::OpenOptions::new().write(true).open(dir.join(name)).unwrap();
                file.write_all_at(bytes, offset).unwrap();
            }
        }
    }

    fn set_len(&self, name: &str, len: u64) {
        match self {
            Other::Mem(backend) => backend.open(name, OPEN).unwrap().set_size(len).unwrap(),
            Other::Dir(dir) => {
                let file = std::fs::OpenOptions::new().write(true).open(dir.join(name)).unwrap();
                file.set_len(len).unwrap();
            }
        }
    }

    fn remove(&self, name: &str) {
        match self {
            Other::Mem(backend) => backend.remove(name).unwrap(),
            Other::Dir(dir) => std::fs::remove_file(dir.join(name)).unwrap(),
        }
    }

    /// The file's bytes, `None` if it does not exist.
    fn read(&self, name: &str) -> Option<Vec<u8>> {
        match self {
            Other::Mem(backend) => {
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
                let error = self.ebb.remove(name).expect_err("the other removed it");
                assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{context}: {error}");
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
