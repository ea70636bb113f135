//! The random-operation checker: random writes, reads (through the cache and `O_DIRECT`),
//! truncates, fsyncs, renames, hard links, unlinks, chmods, utimes, fallocates, reopens and
//! stats on a few files through the mount, each checked against an in-memory model of names,
//! files, contents, modes, mtimes and inode numbers, with the kernel's inode cache dropped now
//! and then (so the mount looks the files up again); then DIR, after the unmount, must equal
//! the model: names, bytes, modes and the mtimes utimes set.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ebb_fuse::DataMode;

use super::{Fixture, read_range};
use crate::posix::drop_kernel_inode_cache;

/// splitmix64: a small seeded generator (the sequence only has to be reproducible).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A size that is often tiny, often page-sized, sometimes large.
    fn size(&mut self, max: u64) -> u64 {
        match self.below(4) {
            0 => 1 + self.below(100),
            1 => 4096 * (1 + self.below(4)),
            _ => 1 + self.below(max),
        }
    }

    /// An offset that is often page-aligned, often arbitrary, sometimes near `end`.
    fn offset(&mut self, end: u64, max: u64) -> u64 {
        match self.below(4) {
            0 => 4096 * self.below(max / 4096),
            1 => end.saturating_sub(self.below(5000)),
            _ => self.below(max),
        }
    }

    fn name(&mut self) -> String {
        FILES[self.below(FILES.len() as u64) as usize].to_owned()
    }
}

const FILES: [&str; 4] = ["a", "b", "c", "d"];
const MAX_OFFSET: u64 = 3 << 20;
const MAX_IO: u64 = 300 << 10;
/// Operations between two drops of the kernel's inode cache.
const DROP_EVERY: usize = 250;

/// One file of the model.
struct FileModel {
    content: Vec<u8>,
    mode: u32,
    /// The mtime utimes set, until a write or truncate changes it (then unknown: "now").
    mtime: Option<SystemTime>,
    /// The inode number the mount showed first; it must never change.
    ino: Option<u64>,
}

/// Names, the files they name, and the open handles (by name).
struct Checker<'a> {
    fx: &'a Fixture,
    rng: Rng,
    names: BTreeMap<String, usize>,
    files: BTreeMap<usize, FileModel>,
    next_file: usize,
    open: BTreeMap<String, File>,
    context: String,
    /// Whether the namespace can allocate (NFSv3 cannot: fallocate is `EOPNOTSUPP`).
    fallocate_supported: bool,
}

impl Checker<'_> {
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.fx.mnt.join(name)
    }

    fn file(&mut self, name: &str) -> &mut FileModel {
        let id = self.names[name];
        self.files.get_mut(&id).expect("a named file exists")
    }

    /// The open handle of `name`, creating the file (and the model's) if needed.
    fn handle(&mut self, name: &str) -> &File {
        if !self.names.contains_key(name) {
            self.names.insert(name.to_owned(), self.next_file);
            let file = FileModel { content: Vec::new(), mode: 0o644, mtime: None, ino: None };
            self.files.insert(self.next_file, file);
            self.next_file += 1;
        }
        let path = self.path(name);
        self.open.entry(name.to_owned()).or_insert_with(|| {
            let mut options = OpenOptions::new();
            options.read(true).write(true).create(true).truncate(false).mode(0o644);
            options.open(path).unwrap()
        })
    }

    /// `name` stops naming its file; the file goes with its last name.
    fn drop_name(&mut self, name: &str) {
        self.open.remove(name);
        if let Some(id) = self.names.remove(name)
            && !self.names.values().any(|&other| other == id)
        {
            self.files.remove(&id);
        }
    }

    fn write(&mut self, name: &str) {
        let end = self.names.get(name).map_or(0, |&id| self.files[&id].content.len() as u64);
        let offset = self.rng.offset(end, MAX_OFFSET);
        let len = self.rng.size(MAX_IO) as usize;
        let fill = self.rng.next();
        let bytes: Vec<u8> =
            (0..len).map(|i| (fill.wrapping_add(i as u64 * 7) >> 3) as u8).collect();
        let context = self.context.clone();
        self.handle(name).write_all_at(&bytes, offset).unwrap_or_else(|e| panic!("{context}: {e}"));
        let file = self.file(name);
        let end = offset as usize + len;
        if file.content.len() < end {
            file.content.resize(end, 0);
        }
        file.content[offset as usize..end].copy_from_slice(&bytes);
        file.mtime = None;
    }

    fn read(&mut self, name: &str) {
        let expected = self.files[&self.names[name]].content.clone();
        let mut offset = self.rng.offset(expected.len() as u64, expected.len() as u64 + 65536);
        let mut len = self.rng.size(MAX_IO) as usize;
        // Sometimes through a fresh handle, sometimes as an O_DIRECT reader (aligned), which
        // reads around the cache unless the cache holds the range.
        let fresh = match self.rng.below(4) {
            0 => Some(File::open(self.path(name)).unwrap()),
            1 => {
                offset -= offset % 4096;
                len = len.div_ceil(4096) * 4096;
                let mut options = OpenOptions::new();
                options.read(true).custom_flags(libc::O_DIRECT);
                Some(options.open(self.path(name)).unwrap())
            }
            _ => None,
        };
        let got = match &fresh {
            Some(file) => read_range(file, offset, len),
            None => read_range(self.handle(name), offset, len),
        };
        let start = (offset as usize).min(expected.len());
        let end = (offset as usize + len).min(expected.len());
        assert!(got == expected[start..end], "{}: {len} bytes at {offset} differ", self.context);
    }

    fn truncate(&mut self, name: &str) {
        let end = self.names.get(name).map_or(0, |&id| self.files[&id].content.len() as u64);
        let size = self.rng.offset(end, MAX_OFFSET);
        if self.names.contains_key(name) && !self.open.contains_key(name) && self.rng.below(2) == 0
        {
            // truncate(2) by path: a setattr without a file handle.
            let status = std::process::Command::new("truncate")
                .arg("-s")
                .arg(size.to_string())
                .arg(self.path(name))
                .status()
                .unwrap();
            assert!(status.success(), "{}", self.context);
        } else {
            let context = self.context.clone();
            self.handle(name).set_len(size).unwrap_or_else(|e| panic!("{context}: {e}"));
        }
        let file = self.file(name);
        file.content.resize(size as usize, 0);
        file.mtime = None;
    }

    fn rename(&mut self, name: &str) {
        let target = self.rng.name();
        std::fs::rename(self.path(name), self.path(&target))
            .unwrap_or_else(|e| panic!("{} -> {target}: {e}", self.context));
        if target == name || self.names.get(&target) == self.names.get(name) {
            // Renaming a name onto itself or onto another name of the same file: nothing.
            return;
        }
        self.drop_name(&target);
        let id = self.names.remove(name).unwrap();
        self.names.insert(target.clone(), id);
        // The open handle follows the file.
        if let Some(file) = self.open.remove(name) {
            self.open.insert(target, file);
        }
    }

    fn link(&mut self, name: &str) {
        let target = self.rng.name();
        if self.names.contains_key(&target) {
            let error = std::fs::hard_link(self.path(name), self.path(&target)).unwrap_err();
            assert_eq!(error.raw_os_error(), Some(libc::EEXIST), "{}: link", self.context);
            return;
        }
        std::fs::hard_link(self.path(name), self.path(&target))
            .unwrap_or_else(|e| panic!("{} -> {target}: {e}", self.context));
        let id = self.names[name];
        self.names.insert(target, id);
    }

    fn chmod(&mut self, name: &str) {
        let mode = [0o600, 0o644, 0o640, 0o755, 0o4755, 0o2750, 0o1777][self.rng.below(7) as usize];
        std::fs::set_permissions(self.path(name), std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("{}: {e}", self.context));
        self.file(name).mode = mode;
    }

    fn utimes(&mut self, name: &str) {
        let when = UNIX_EPOCH
            + Duration::new(1_000_000_000 + self.rng.below(1 << 30), 0)
            + Duration::from_nanos(self.rng.below(1_000_000_000));
        let file = File::options().write(true).open(self.path(name)).unwrap();
        file.set_modified(when).unwrap_or_else(|e| panic!("{}: {e}", self.context));
        self.file(name).mtime = Some(when);
    }

    fn fallocate(&mut self, name: &str) {
        use rustix::fs::FallocateFlags;
        let keep = self.rng.below(2) == 0;
        let end = self.files[&self.names[name]].content.len() as u64;
        let offset = self.rng.offset(end, MAX_OFFSET);
        let len = self.rng.size(MAX_IO);
        let mode = if keep { FallocateFlags::KEEP_SIZE } else { FallocateFlags::empty() };
        let context = self.context.clone();
        if !self.fallocate_supported {
            let result = rustix::fs::fallocate(self.handle(name), mode, offset, len);
            assert_eq!(result, Err(rustix::io::Errno::OPNOTSUPP), "{context}: fallocate");
            return;
        }
        rustix::fs::fallocate(self.handle(name), mode, offset, len)
            .unwrap_or_else(|e| panic!("{context}: {e}"));
        let file = self.file(name);
        if !keep && file.content.len() < (offset + len) as usize {
            file.content.resize((offset + len) as usize, 0);
        }
        // Any fallocate moves the mtime, as on ext4.
        file.mtime = None;
    }

    /// stat agrees with the model: size, mode, links, the mtime utimes set, the inode number.
    fn stat(&mut self, name: &str) {
        let meta = std::fs::metadata(self.path(name)).unwrap();
        let links = self.names.values().filter(|&&id| id == self.names[name]).count() as u64;
        let context = self.context.clone();
        let file = self.file(name);
        assert_eq!(meta.len(), file.content.len() as u64, "{context}: size");
        assert_eq!(meta.mode() & 0o7777, file.mode, "{context}: mode");
        assert_eq!(meta.nlink(), links, "{context}: links");
        if let Some(mtime) = file.mtime {
            assert_eq!(meta.modified().unwrap(), mtime, "{context}: mtime");
        }
        assert_eq!(*file.ino.get_or_insert(meta.ino()), meta.ino(), "{context}: inode number");
    }

    fn step(&mut self, op: &str, name: &str) {
        match op {
            "write" => self.write(name),
            "read" => self.read(name),
            "truncate" => self.truncate(name),
            "fsync" => self.handle(name).sync_all().unwrap(),
            "rename" => self.rename(name),
            "link" => self.link(name),
            "close" => drop(self.open.remove(name)),
            "unlink" => {
                std::fs::remove_file(self.path(name)).unwrap();
                self.drop_name(name);
            }
            "chmod" => self.chmod(name),
            "utimes" => self.utimes(name),
            "fallocate" => self.fallocate(name),
            _ => self.stat(name),
        }
    }
}

/// After the unmount: DIR holds the model's names, bytes, modes and set mtimes.
fn check_dir(dir: &Path, names: &BTreeMap<String, usize>, files: &BTreeMap<usize, FileModel>) {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    found.sort();
    assert_eq!(found, names.keys().cloned().collect::<Vec<_>>(), "names in DIR");
    for (name, id) in names {
        let file = &files[id];
        let on_disk = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(on_disk.len(), file.content.len(), "size of {name} in DIR");
        assert!(on_disk == file.content, "{name} in DIR differs from the model");
        let meta = std::fs::metadata(dir.join(name)).unwrap();
        assert_eq!(meta.mode() & 0o7777, file.mode, "mode of {name} in DIR");
        if let Some(mtime) = file.mtime {
            assert_eq!(meta.modified().unwrap(), mtime, "mtime of {name} in DIR");
        }
    }
}

/// Picks an operation (`roll` in 0..100).
fn operation(roll: u64) -> &'static str {
    match roll {
        0..28 => "write",
        28..46 => "read",
        46..54 => "truncate",
        54..58 => "fsync",
        58..64 => "rename",
        64..68 => "link",
        68..72 => "close",
        72..75 => "unlink",
        75..80 => "chmod",
        80..85 => "utimes",
        85..90 => "fallocate",
        _ => "stat",
    }
}

/// Runs the checker; `kept`: closed files kept attached (see `Mount::start_keeping`).
pub(crate) fn random_operations(data: DataMode, seed: u64, operations: usize, kept: Option<usize>) {
    let Some(fx) = Fixture::with_kept(data, Some(64 << 20), &[], kept) else { return };
    run_checker(fx, &format!("{data:?}"), seed, operations, true);
}

/// Runs the checker on a mount of a fresh NFS export (nfs-ganesha), whose directory on this
/// machine must equal the model after the unmount.
pub(crate) fn random_operations_over_nfs(seed: u64, operations: usize) {
    let Some(fx) = Fixture::nfs(Some(64 << 20)) else { return };
    run_checker(fx, "NFS", seed, operations, false);
}

fn run_checker(mut fx: Fixture, label: &str, seed: u64, operations: usize, fallocate: bool) {
    let root = rustix::process::geteuid().is_root();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut checker = Checker {
        fx: &fx,
        rng: Rng(seed),
        names: BTreeMap::new(),
        files: BTreeMap::new(),
        next_file: 0,
        open: BTreeMap::new(),
        context: String::new(),
        fallocate_supported: fallocate,
    };
    for step in 0..operations {
        if root && step % DROP_EVERY == DROP_EVERY - 1 {
            drop_kernel_inode_cache();
        }
        let name = checker.rng.name();
        let op = operation(checker.rng.below(100));
        *counts.entry(op).or_default() += 1;
        if !matches!(op, "write" | "truncate") && !checker.names.contains_key(&name) {
            continue;
        }
        checker.context = format!("{label} seed {seed} step {step}: {op} {name}");
        checker.step(op, &name);
    }
    checker.open.clear();
    let Checker { names, files, .. } = checker;
    for (name, id) in &names {
        let mut got = Vec::new();
        File::open(fx.mnt.join(name)).unwrap().read_to_end(&mut got).unwrap();
        assert!(got == files[id].content, "{label} seed {seed}: {name} differs at the end");
    }
    fx.unmount();
    check_dir(&fx.dir, &names, &files);
    for op in ["write", "read", "truncate", "rename", "link", "chmod", "utimes", "fallocate"] {
        assert!(counts.get(op).copied().unwrap_or(0) > operations / 50, "{op}: {counts:?}");
    }
}
