//! The namespace conformance suite: named checks of the [`Namespace`] contract that every
//! namespace (a local directory, an NFS export, a bucket) runs, so that a mount over it
//! behaves as the contract says.
//!
//! Each check works in a fresh directory `conformance-<check>` under the root and passes,
//! is skipped (the namespace refuses the operation with the errno the contract allows for a
//! backend that cannot do it, such as `EPERM` for hard links) or fails with a message. A
//! panicking check is reported as failed. The report type is the backend suite's. A
//! namespace's tests get one `#[test]` per check from
//! [`namespace_conformance!`](crate::namespace_conformance).
//!
//! ```no_run
//! let namespace = ebb_backend::DirNamespace::open("/tmp/scratch")?;
//! let report = ebb_backend::namespace_conformance::run_all(&namespace);
//! assert!(report.is_ok(), "{report}");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::ffi::{OsStr, OsString};
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, UNIX_EPOCH};

use crate::conformance::{CheckOutcome, Expected, Failure, Report, assert_outcome, panic_message};
use crate::namespace::{
    Attr, Credentials, FileKind, Namespace, RenameFlags, SetAttr, SetTime, unsupported,
};

/// Names of all checks, in the order [`run_all`] runs them (the list of
/// [`namespace_conformance!`](crate::namespace_conformance), which makes one test of each).
pub const CHECK_NAMES: &[&str] = crate::namespace_conformance!(@names);

/// The outcome of one check: `Ok(None)` passed, `Ok(Some(reason))` skipped.
type Outcome = Result<Option<String>, String>;

/// Runs every check against `namespace`.
pub fn run_all<N: Namespace>(namespace: &N) -> Report {
    let mut report = Report::default();
    for &check in CHECK_NAMES {
        match run_check(check, namespace) {
            CheckOutcome::Passed => report.passed.push(check),
            CheckOutcome::Skipped(reason) => report.skipped.push((check, reason)),
            CheckOutcome::Failed(message) => report.failed.push(Failure { check, message }),
        }
    }
    report
}

/// Runs the check named `check` (one of [`CHECK_NAMES`]) in a fresh directory
/// `conformance-<check>` under the namespace's root. A check that panics is reported as
/// failed; an unknown name fails too.
pub fn run_check<N: Namespace>(check: &str, namespace: &N) -> CheckOutcome {
    let Some(run) = crate::namespace_conformance!(@dispatch check, N, fn(&N, &N::Node) -> Outcome)
    else {
        return CheckOutcome::Failed(format!("no check named {check:?} (see CHECK_NAMES)"));
    };
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let dir = scratch(namespace, check)?;
        run(namespace, &dir)
    }));
    match outcome {
        Ok(Ok(None)) => CheckOutcome::Passed,
        Ok(Ok(Some(reason))) => CheckOutcome::Skipped(reason),
        Ok(Err(message)) => CheckOutcome::Failed(message),
        Err(payload) => CheckOutcome::Failed(format!("panicked: {}", panic_message(&*payload))),
    }
}

/// The test [`namespace_conformance!`](crate::namespace_conformance) makes of one check: runs
/// it against the namespace `make` gives and panics unless it passed, or did what `expected`
/// lists for it (the reason or the failure goes to stderr).
pub fn assert_check<N: Namespace>(check: &str, expected: Expected<'_>, make: &dyn Fn() -> N) {
    let outcome = run_check(check, &make());
    assert_outcome(CHECK_NAMES, check, expected, outcome);
}

/// The caller every check uses: root, as the mount runs.
fn root_caller() -> Credentials {
    Credentials::default()
}

/// A fresh directory for `check` under the root.
fn scratch<N: Namespace>(namespace: &N, check: &str) -> Result<N::Node, String> {
    let (root, _) = namespace.root().map_err(|e| format!("root: {e}"))?;
    let name = OsString::from(format!("conformance-{check}"));
    let (dir, attr) =
        namespace.mkdir(&root, &name, 0o755, &root_caller()).map_err(|e| format!("mkdir: {e}"))?;
    expect(attr.kind == FileKind::Directory, "mkdir made no directory")?;
    Ok(dir)
}

fn expect(condition: bool, message: impl Into<String>) -> Result<(), String> {
    if condition { Ok(()) } else { Err(message.into()) }
}

/// The errno of `result`'s error, or a message if it succeeded.
fn errno_of<T>(result: io::Result<T>, what: &str) -> Result<i32, String> {
    match result {
        Ok(_) => Err(format!("{what} succeeded and must fail")),
        Err(error) => Ok(error.raw_os_error().unwrap_or(-1)),
    }
}

fn ok<T>(result: io::Result<T>, what: &str) -> Result<T, String> {
    result.map_err(|error| format!("{what}: {error}"))
}

/// Whether `error` is one a namespace may answer for an operation it cannot do.
fn cannot(error: &io::Error, allowed: &[i32]) -> bool {
    let raw = error.raw_os_error();
    raw == unsupported().raw_os_error() || allowed.iter().any(|&errno| raw == Some(errno))
}

fn os(name: &str) -> &OsStr {
    OsStr::new(name)
}

const ENOENT: i32 = 2;
const EPERM: i32 = 1;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOTEMPTY: i32 = 39;
const EXDEV: i32 = 18;

fn lookup_missing<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let errno = errno_of(ns.lookup(dir, os("missing")), "lookup of a missing name")?;
    expect(errno == ENOENT, format!("lookup of a missing name: errno {errno}, not ENOENT"))?;
    Ok(None)
}

fn create_lookup_getattr<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let (node, created) = ok(ns.create(dir, os("f"), 0o640, &root_caller()), "create")?;
    expect(created.kind == FileKind::Regular, "create made no regular file")?;
    expect(created.perm == 0o640, format!("create with 0640 gave {:o}", created.perm))?;
    expect(created.size == 0, "a new file is not empty")?;
    expect(created.ino > 1, format!("ino {} of a new file", created.ino))?;
    let (_, looked) = ok(ns.lookup(dir, os("f")), "lookup")?;
    let attr = ok(ns.getattr(&node), "getattr")?;
    expect(looked.ino == created.ino && attr.ino == created.ino, "ino differs across calls")?;
    let errno =
        errno_of(ns.create(dir, os("f"), 0o644, &root_caller()), "create of an existing name")?;
    expect(errno == EEXIST, format!("create of an existing name: errno {errno}, not EEXIST"))?;
    Ok(None)
}

fn mkdir_readdir<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let (sub, _) = ok(ns.mkdir(dir, os("d"), 0o750, &root_caller()), "mkdir")?;
    let (_, a) = ok(ns.create(&sub, os("a"), 0o644, &root_caller()), "create a")?;
    let (_, b) = ok(ns.mkdir(&sub, os("b"), 0o755, &root_caller()), "mkdir b")?;
    let mut entries: Vec<(OsString, u64, FileKind)> = Vec::new();
    for entry in ok(ns.readdir(&sub), "readdir")? {
        let entry = ok(entry, "readdir entry")?;
        entries.push((entry.name, entry.ino, entry.kind));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let wanted = vec![
        (OsString::from("a"), a.ino, FileKind::Regular),
        (OsString::from("b"), b.ino, FileKind::Directory),
    ];
    expect(entries == wanted, format!("readdir listed {entries:?}, not {wanted:?}"))?;
    let errno =
        errno_of(ns.mkdir(dir, os("d"), 0o755, &root_caller()), "mkdir of an existing name")?;
    expect(errno == EEXIST, format!("mkdir of an existing name: errno {errno}"))?;
    Ok(None)
}

fn remove<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let caller = root_caller();
    let (sub, _) = ok(ns.mkdir(dir, os("d"), 0o755, &caller), "mkdir")?;
    ok(ns.create(&sub, os("f"), 0o644, &caller), "create")?;
    let errno = errno_of(ns.rmdir(dir, os("d"), &caller), "rmdir of a non-empty directory")?;
    expect(
        errno == ENOTEMPTY || errno == EEXIST,
        format!("rmdir of a non-empty directory: {errno}"),
    )?;
    let errno = errno_of(ns.rmdir(&sub, os("f"), &caller), "rmdir of a file")?;
    expect(errno == ENOTDIR, format!("rmdir of a file: errno {errno}, not ENOTDIR"))?;
    let errno = errno_of(ns.unlink(dir, os("d"), &caller), "unlink of a directory")?;
    expect(errno == EISDIR || errno == EPERM, format!("unlink of a directory: errno {errno}"))?;
    ok(ns.unlink(&sub, os("f"), &caller), "unlink")?;
    let errno = errno_of(ns.lookup(&sub, os("f")), "lookup after unlink")?;
    expect(errno == ENOENT, format!("lookup after unlink: errno {errno}"))?;
    ok(ns.rmdir(dir, os("d"), &caller), "rmdir")?;
    let errno = errno_of(ns.unlink(dir, os("f"), &caller), "unlink of a missing name")?;
    expect(errno == ENOENT, format!("unlink of a missing name: errno {errno}"))?;
    Ok(None)
}

fn rename<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let caller = root_caller();
    let (_, f) = ok(ns.create(dir, os("f"), 0o644, &caller), "create f")?;
    let (_, g) = ok(ns.create(dir, os("g"), 0o644, &caller), "create g")?;
    let (sub, _) = ok(ns.mkdir(dir, os("d"), 0o755, &caller), "mkdir")?;
    ok(ns.rename(dir, os("f"), &sub, os("f2"), RenameFlags::default(), &caller), "rename")?;
    let (_, moved) = ok(ns.lookup(&sub, os("f2")), "lookup of the new name")?;
    expect(moved.ino == f.ino, "a renamed file changed its ino")?;
    let errno = errno_of(ns.lookup(dir, os("f")), "lookup of the old name")?;
    expect(errno == ENOENT, format!("lookup of the old name: errno {errno}"))?;
    // Replacing an existing file, atomically.
    ok(ns.rename(&sub, os("f2"), dir, os("g"), RenameFlags::default(), &caller), "rename over")?;
    let (_, replaced) = ok(ns.lookup(dir, os("g")), "lookup of the replaced name")?;
    expect(replaced.ino == f.ino && replaced.ino != g.ino, "rename did not replace the target")?;
    let no_replace = RenameFlags { no_replace: true, exchange: false };
    ok(ns.create(dir, os("h"), 0o644, &caller), "create h")?;
    match ns.rename(dir, os("g"), dir, os("h"), no_replace, &caller) {
        Err(error) if error.raw_os_error() == Some(EEXIST) => {}
        Err(error) if cannot(&error, &[EINVAL]) => {
            return Ok(Some(format!("RENAME_NOREPLACE refused: {error}")));
        }
        other => return Err(format!("rename with NOREPLACE onto a name: {other:?}")),
    }
    // A directory, where the backend can (else EXDEV: tools copy instead).
    match ns.rename(dir, os("d"), dir, os("e"), RenameFlags::default(), &caller) {
        Ok(()) => ok(ns.lookup(dir, os("e")), "lookup of a renamed directory").map(drop),
        Err(error) if error.raw_os_error() == Some(EXDEV) => Ok(()),
        Err(error) => Err(format!("rename of a directory: {error}")),
    }?;
    Ok(None)
}

fn setattr<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let caller = root_caller();
    let (node, _) = ok(ns.create(dir, os("f"), 0o600, &caller), "create")?;
    let set = SetAttr { mode: Some(0o4755), ..SetAttr::default() };
    let attr = match ns.setattr(&node, &set, &caller) {
        Ok(attr) => attr,
        Err(error) if cannot(&error, &[EPERM]) => {
            return Ok(Some(format!("mode cannot be set: {error}")));
        }
        Err(error) => return Err(format!("setattr mode: {error}")),
    };
    expect(attr.perm == 0o4755, format!("mode 4755 set as {:o}", attr.perm))?;
    let when = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let set = SetAttr { mtime: Some(SetTime::At(when)), ..SetAttr::default() };
    let attr: Attr = ok(ns.setattr(&node, &set, &caller), "setattr mtime")?;
    expect(attr.mtime == when, format!("mtime set to {when:?} reads {:?}", attr.mtime))?;
    let set = SetAttr { size: Some(10_000), ..SetAttr::default() };
    let attr = ok(ns.setattr(&node, &set, &caller), "setattr size")?;
    expect(attr.size == 10_000, format!("size set to 10000 reads {}", attr.size))?;
    Ok(None)
}

fn hard_link<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let caller = root_caller();
    let (node, f) = ok(ns.create(dir, os("f"), 0o644, &caller), "create")?;
    let (_, linked) = match ns.link(&node, dir, os("h"), &caller) {
        Ok(linked) => linked,
        Err(error) if cannot(&error, &[EPERM]) => {
            return Ok(Some(format!("no hard links: {error}")));
        }
        Err(error) => return Err(format!("link: {error}")),
    };
    expect(linked.ino == f.ino, "a hard link has another ino")?;
    expect(linked.nlink == 2, format!("nlink {} after a link", linked.nlink))?;
    ok(ns.unlink(dir, os("f"), &caller), "unlink of the first name")?;
    let attr = ok(ns.getattr(&node), "getattr after unlinking a name")?;
    expect(attr.nlink == 1, format!("nlink {} after unlinking one of two names", attr.nlink))?;
    Ok(None)
}

fn symlink<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let caller = root_caller();
    let (node, attr) = match ns.symlink(dir, os("l"), os("../some/target"), &caller) {
        Ok(created) => created,
        Err(error) if cannot(&error, &[EPERM]) => {
            return Ok(Some(format!("no symlinks: {error}")));
        }
        Err(error) => return Err(format!("symlink: {error}")),
    };
    expect(attr.kind == FileKind::Symlink, "symlink made no symlink")?;
    let target = ok(ns.readlink(&node), "readlink")?;
    expect(target == "../some/target", format!("readlink gave {target:?}"))?;
    let (file, _) = ok(ns.create(dir, os("f"), 0o644, &caller), "create")?;
    let errno = errno_of(ns.readlink(&file), "readlink of a file")?;
    expect(errno == EINVAL, format!("readlink of a file: errno {errno}, not EINVAL"))?;
    Ok(None)
}

fn file_data<N: Namespace>(ns: &N, dir: &N::Node) -> Outcome {
    let (node, _) = ok(ns.create(dir, os("f"), 0o644, &root_caller()), "create")?;
    let file = ok(ns.open_file(&node), "open_file")?;
    let page: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    ok(file.write_at(&page, 4096), "write")?;
    ok(file.sync(), "sync")?;
    let mut back = vec![0u8; 8192];
    let read = ok(file.read_at(&mut back, 0), "read")?;
    expect(read == 8192, format!("read {read} of 8192 bytes"))?;
    expect(back[..4096].iter().all(|&b| b == 0), "the hole before the write is not zeros")?;
    expect(back[4096..] == page[..], "read back differs from what was written")?;
    let attr = ok(ns.getattr(&node), "getattr")?;
    expect(attr.size == 8192, format!("size {} after writing up to 8192", attr.size))?;
    Ok(None)
}
