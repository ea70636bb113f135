//! The backend conformance suite: named checks of the [`Backend`] contract that every backend,
//! real or simulated, must pass.
//!
//! It is ordinary library code (not `cfg(test)`) so that other crates, such as the
//! simulator's backends, run the very same checks. Each check gets a fresh backend from the
//! caller's `make` function, works on files named `conformance-<check>`, and either passes,
//! is skipped (it does not apply to this backend's [`Capabilities`](crate::Capabilities)) or fails with a message.
//! A check that panics is reported as failed, so one broken check does not hide the others.
//!
//! ```no_run
//! let report = ebb_backend::conformance::run_all(&|| Box::new(ebb_backend::MemBackend::new()));
//! assert!(report.is_ok(), "{report}");
//! ```
//!
//! The checks, in order, are listed in [`CHECK_NAMES`]. A backend's tests get one `#[test]` per
//! check from [`backend_conformance!`](crate::backend_conformance).

use std::fmt;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use crate::aligned::{AlignedBuf, PAGE_SIZE};
use crate::backend::{Backend, BackendFile, OpenOptions, Stability};

/// Names of all checks, in the order [`run_all`] runs them (the list of
/// [`backend_conformance!`](crate::backend_conformance), which makes one test of each).
pub const CHECK_NAMES: &[&str] = crate::backend_conformance!(@names);

/// One failed check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The check's name, one of [`CHECK_NAMES`].
    pub check: &'static str,
    /// What went wrong.
    pub message: String,
}

/// The outcome of [`run_all`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Checks that passed.
    pub passed: Vec<&'static str>,
    /// Checks (or their parts) that do not apply to this backend, with the reason.
    pub skipped: Vec<(&'static str, String)>,
    /// Checks that failed.
    pub failed: Vec<Failure>,
}

impl Report {
    /// True when no check failed.
    pub fn is_ok(&self) -> bool {
        self.failed.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conformance: {} passed, {} skipped, {} failed",
            self.passed.len(),
            self.skipped.len(),
            self.failed.len()
        )?;
        for (check, reason) in &self.skipped {
            write!(f, "\n  skipped {check}: {reason}")?;
        }
        for failure in &self.failed {
            write!(f, "\n  FAILED {}: {}", failure.check, failure.message)?;
        }
        Ok(())
    }
}

/// Runs every check against fresh backends from `make` and reports each one's outcome.
pub fn run_all<B: Backend + ?Sized>(make: &dyn Fn() -> Box<B>) -> Report {
    let mut report = Report::default();
    for &check in CHECK_NAMES {
        match run_check(check, make) {
            CheckOutcome::Passed => report.passed.push(check),
            CheckOutcome::Skipped(reason) => report.skipped.push((check, reason)),
            CheckOutcome::Failed(message) => report.failed.push(Failure { check, message }),
        }
    }
    report
}

/// Runs [`run_all`] and panics with the report if any check failed.
pub fn assert_conformance<B: Backend + ?Sized>(make: &dyn Fn() -> Box<B>) -> Report {
    let report = run_all(make);
    assert!(report.is_ok(), "{report}");
    report
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// The backend did what the contract says.
    Passed,
    /// The check does not apply to this backend (its capabilities), for this reason.
    Skipped(String),
    /// The backend broke the contract (or the check panicked): what went wrong.
    Failed(String),
}

/// Runs the check named `check` (one of [`CHECK_NAMES`]) against a fresh backend from `make`.
/// A check that panics is reported as failed; an unknown name fails too.
pub fn run_check<B: Backend + ?Sized>(check: &str, make: &dyn Fn() -> Box<B>) -> CheckOutcome {
    let Some(run) = crate::backend_conformance!(@dispatch check, B, fn(&B) -> CheckResult) else {
        return CheckOutcome::Failed(format!("no check named {check:?} (see CHECK_NAMES)"));
    };
    let backend = make();
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| run(&backend)));
    match outcome {
        Ok(Ok(Outcome::Pass)) => CheckOutcome::Passed,
        Ok(Ok(Outcome::Skip(reason))) => CheckOutcome::Skipped(reason),
        Ok(Err(message)) => CheckOutcome::Failed(message),
        Err(payload) => CheckOutcome::Failed(format!("panicked: {}", panic_message(&*payload))),
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// What a backend's tests expect of the checks that do not simply pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Expected<'a> {
    /// Checks that do not apply to the backend (they must say so).
    pub skipped: &'a [&'a str],
    /// Checks the backend is known to fail today (they must fail).
    pub failing: &'a [&'a str],
}

/// The test [`backend_conformance!`](crate::backend_conformance) makes of one check: runs it
/// against a fresh backend from `make` and panics unless it passed, or did what `expected`
/// lists for it (the reason or the failure goes to stderr).
pub fn assert_check<B: Backend>(check: &str, expected: Expected<'_>, make: &dyn Fn() -> B) {
    let outcome = run_check(check, &|| Box::new(make()));
    assert_outcome(CHECK_NAMES, check, expected, outcome);
}

/// Panics unless `outcome` is what a test of `check` expects: passed, skipped when `check` is
/// listed as skipped, failed when it is listed as failing (every listed name must be one of
/// `names`).
pub(crate) fn assert_outcome(
    names: &[&str],
    check: &str,
    expected: Expected<'_>,
    outcome: CheckOutcome,
) {
    for name in expected.skipped.iter().chain(expected.failing) {
        assert!(names.contains(name), "{name:?} is listed, but is no check: {names:?}");
    }
    let expect_skip = expected.skipped.contains(&check);
    let expect_failure = expected.failing.contains(&check);
    match outcome {
        CheckOutcome::Passed if expect_skip || expect_failure => {
            panic!("{check} passed, but is listed as skipped or failing: take it off the list")
        }
        CheckOutcome::Passed => {}
        CheckOutcome::Skipped(reason) if expect_skip => {
            eprintln!("{check}: does not apply, as listed: {reason}");
        }
        CheckOutcome::Skipped(reason) => panic!(
            "{check} was skipped ({reason}); list it under `skipped` if this backend cannot do it"
        ),
        CheckOutcome::Failed(message) if expect_failure => {
            eprintln!("{check}: fails, as listed: {message}");
        }
        CheckOutcome::Failed(message) => panic!("{check} failed: {message}"),
    }
}

enum Outcome {
    Pass,
    Skip(String),
}

type CheckResult = Result<Outcome, String>;

const PAGE: u64 = PAGE_SIZE as u64;

/// Fails the check with a formatted message unless `condition` holds.
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}

/// Attaches what was being done to an IO error.
fn io<T>(what: &str, result: io::Result<T>) -> Result<T, String> {
    result.map_err(|error| format!("{what}: {error} (kind {:?})", error.kind()))
}

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };
const EXISTING: OpenOptions = OpenOptions { create: false, truncate: false };

fn create<B: Backend + ?Sized>(backend: &B, name: &str) -> Result<Arc<dyn BackendFile>, String> {
    io(&format!("open {name} with create"), backend.open(name, CREATE))
}

/// `len` bytes of a pattern that depends on `seed` and the position and is never zero, so a
/// hole, a stale page and a page from another write are all told apart.
fn pattern(seed: u64, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len);
    for (index, byte) in buf.iter_mut().enumerate() {
        let index = index as u64;
        let value = seed.wrapping_mul(0x9e37_79b9) ^ (index >> 12).wrapping_mul(131) ^ index;
        *byte = (value % 251) as u8 + 1;
    }
    buf
}

fn write<F: BackendFile + ?Sized>(file: &F, buf: &[u8], offset: u64) -> Result<Stability, String> {
    let reply =
        io(&format!("write_at({} bytes, offset {offset})", buf.len()), file.write_at(buf, offset))?;
    Ok(reply.stability)
}

/// Reads `len` bytes at `offset` into an aligned buffer, returning it cut to the count read.
fn read<F: BackendFile + ?Sized>(file: &F, len: usize, offset: u64) -> Result<Vec<u8>, String> {
    let mut buf = AlignedBuf::zeroed(len);
    let count = io(
        &format!("read_at({len} bytes, offset {offset})"),
        file.read_at(&mut buf[..len], offset),
    )?;
    ensure!(count <= len, "read_at returned {count} for a {len}-byte buffer");
    Ok(buf[..count].to_vec())
}

fn size<F: BackendFile + ?Sized>(file: &F) -> Result<u64, String> {
    io("size", file.size())
}

/// The first differing byte, for readable failure messages.
fn compare(what: &str, actual: &[u8], expected: &[u8]) -> Result<(), String> {
    ensure!(
        actual.len() == expected.len(),
        "{what}: {} bytes, expected {}",
        actual.len(),
        expected.len()
    );
    if let Some(index) = actual.iter().zip(expected).position(|(a, e)| a != e) {
        return Err(format!(
            "{what}: byte {index} (page {}) is {}, expected {}",
            index / PAGE_SIZE,
            actual[index],
            expected[index]
        ));
    }
    Ok(())
}

fn namespace<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let name = "conformance-namespace";
    ensure!(!io("exists before create", backend.exists(name))?, "exists before create");
    match backend.open(name, EXISTING) {
        Err(error) => ensure!(
            error.kind() == io::ErrorKind::NotFound,
            "open of a missing file without create: {error}, expected NotFound"
        ),
        Ok(_) => return Err("open of a missing file without create succeeded".to_owned()),
    }
    let file = create(backend, name)?;
    ensure!(size(&*file)? == 0, "new file is not empty");
    ensure!(io("exists after create", backend.exists(name))?, "missing after create");
    io("remove", backend.remove(name))?;
    ensure!(!io("exists after remove", backend.exists(name))?, "exists after remove");
    match backend.remove(name) {
        Err(error) => ensure!(error.kind() == io::ErrorKind::NotFound, "second remove: {error}"),
        Ok(()) => return Err("second remove succeeded".to_owned()),
    }
    for bad in ["", ".", "..", "a/b", "nul\0"] {
        match backend.open(bad, CREATE) {
            Err(error) => ensure!(
                error.kind() == io::ErrorKind::InvalidInput,
                "open {bad:?}: {error}, expected InvalidInput"
            ),
            Ok(_) => return Err(format!("open of the invalid name {bad:?} succeeded")),
        }
    }
    Ok(Outcome::Pass)
}

fn write_read_pages<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-write-read")?;
    let data = pattern(1, 3 * PAGE_SIZE);
    write(&*file, &data, 0)?;
    compare("read back", &read(&*file, 3 * PAGE_SIZE, 0)?, &data)?;
    compare(
        "read of the middle page",
        &read(&*file, PAGE_SIZE, PAGE)?,
        &data[PAGE_SIZE..2 * PAGE_SIZE],
    )?;
    ensure!(size(&*file)? == 3 * PAGE, "size {} after writing 3 pages", size(&*file)?);
    Ok(Outcome::Pass)
}

fn read_past_eof_is_short<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-eof")?;
    let data = pattern(2, 2 * PAGE_SIZE);
    write(&*file, &data, 0)?;
    compare("read across the end", &read(&*file, 4 * PAGE_SIZE, 0)?, &data)?;
    ensure!(read(&*file, PAGE_SIZE, 2 * PAGE)?.is_empty(), "read at the end is not empty");
    ensure!(read(&*file, PAGE_SIZE, 1 << 30)?.is_empty(), "read far past the end is not empty");
    Ok(Outcome::Pass)
}

fn overwrite<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-overwrite")?;
    let first = pattern(3, 4 * PAGE_SIZE);
    let second = pattern(4, 2 * PAGE_SIZE);
    write(&*file, &first, 0)?;
    write(&*file, &second, PAGE)?;
    let mut expected = first.to_vec();
    expected[PAGE_SIZE..3 * PAGE_SIZE].copy_from_slice(&second);
    compare("after overwrite", &read(&*file, 4 * PAGE_SIZE, 0)?, &expected)?;
    ensure!(size(&*file)? == 4 * PAGE, "overwrite changed the size to {}", size(&*file)?);
    Ok(Outcome::Pass)
}

fn sparse_hole_reads_zeros<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-sparse")?;
    let data = pattern(5, PAGE_SIZE);
    write(&*file, &data, 8 * PAGE)?;
    ensure!(size(&*file)? == 9 * PAGE, "size {} after a write at page 8", size(&*file)?);
    let mut expected = vec![0; 9 * PAGE_SIZE];
    expected[8 * PAGE_SIZE..].copy_from_slice(&data);
    compare("hole then data", &read(&*file, 9 * PAGE_SIZE, 0)?, &expected)?;
    Ok(Outcome::Pass)
}

fn set_size_smaller_and_larger<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-set-size")?;
    let data = pattern(6, 4 * PAGE_SIZE);
    write(&*file, &data, 0)?;
    let logical = PAGE + 100;
    io("set_size smaller", file.set_size(logical))?;
    ensure!(size(&*file)? == logical, "size {} after set_size({logical})", size(&*file)?);
    compare("after shrinking", &read(&*file, 2 * PAGE_SIZE, 0)?, &data[..logical as usize])?;
    io("set_size larger", file.set_size(3 * PAGE))?;
    ensure!(size(&*file)? == 3 * PAGE, "size {} after growing", size(&*file)?);
    let mut expected = vec![0; 3 * PAGE_SIZE];
    expected[..logical as usize].copy_from_slice(&data[..logical as usize]);
    compare(
        "after growing (trimmed bytes must read as zeros)",
        &read(&*file, 3 * PAGE_SIZE, 0)?,
        &expected,
    )?;
    // The engine's way to store a size that is not a page multiple: last page whole, then trim.
    let tail = pattern(7, PAGE_SIZE);
    write(&*file, &tail, 3 * PAGE)?;
    io("set_size to trim the tail page", file.set_size(3 * PAGE + 10))?;
    ensure!(size(&*file)? == 3 * PAGE + 10, "size {} after trimming", size(&*file)?);
    compare("trimmed tail page", &read(&*file, PAGE_SIZE, 3 * PAGE)?, &tail[..10])?;
    Ok(Outcome::Pass)
}

fn reopen_and_truncate<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let name = "conformance-reopen";
    let file = create(backend, name)?;
    let data = pattern(8, 2 * PAGE_SIZE);
    write(&*file, &data, 0)?;
    io("sync", file.sync())?;
    let again = io("reopen without create", backend.open(name, EXISTING))?;
    ensure!(size(&*again)? == 2 * PAGE, "reopened size {}", size(&*again)?);
    compare("through a second handle", &read(&*again, 2 * PAGE_SIZE, 0)?, &data)?;
    let truncated = io(
        "open with truncate",
        backend.open(name, OpenOptions { create: false, truncate: true }),
    )?;
    ensure!(size(&*truncated)? == 0, "size {} after open with truncate", size(&*truncated)?);
    ensure!(size(&*file)? == 0, "the first handle sees size {} after truncate", size(&*file)?);
    Ok(Outcome::Pass)
}

fn sync_after_write<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-sync")?;
    io("sync of an empty file", file.sync())?;
    let stability = write(&*file, &pattern(9, 2 * PAGE_SIZE), 0)?;
    io("sync after write", file.sync())?;
    io("second sync", file.sync())?;
    let commit = io("commit", file.commit(0, 2 * PAGE))?;
    match stability {
        Stability::Stable => {
            ensure!(commit.verifier == 0, "one-phase commit verifier {}", commit.verifier)
        }
        Stability::Unstable { verifier } => ensure!(
            commit.verifier == verifier,
            "commit verifier {} differs from the write's {verifier}",
            commit.verifier
        ),
    }
    compare("after sync", &read(&*file, 2 * PAGE_SIZE, 0)?, &pattern(9, 2 * PAGE_SIZE))?;
    Ok(Outcome::Pass)
}

fn zero_length_requests<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-zero-length")?;
    ensure!(io("empty read", file.read_at(&mut [], 0))? == 0, "empty read returned bytes");
    io("empty write", file.write_at(&[], PAGE))?;
    ensure!(size(&*file)? == 0, "an empty write changed the size to {}", size(&*file)?);
    Ok(Outcome::Pass)
}

fn alignment_rule<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let capabilities = backend.capabilities();
    let file = create(backend, "conformance-alignment")?;
    let data = pattern(10, 2 * PAGE_SIZE);
    if capabilities.alignment <= 1 {
        write(&*file, &data[..100], 100)?;
        ensure!(size(&*file)? == 200, "size {} after 100 bytes at offset 100", size(&*file)?);
        let mut expected = vec![0; 200];
        expected[100..].copy_from_slice(&data[..100]);
        compare("unaligned write", &read(&*file, 200, 0)?, &expected)?;
        return Ok(Outcome::Pass);
    }
    ensure!(capabilities.alignment.is_power_of_two(), "alignment {}", capabilities.alignment);
    let offset_error = file.write_at(&data[..PAGE_SIZE], 100);
    let length_error = file.write_at(&data[..100], 0);
    let mut buf = AlignedBuf::zeroed(PAGE_SIZE);
    let read_error = file.read_at(&mut buf, 1).map(|_| ());
    for (what, result) in [
        ("write at offset 100", offset_error.map(|_| ())),
        ("write of 100 bytes", length_error.map(|_| ())),
        ("read at offset 1", read_error),
    ] {
        match result {
            Err(error) => ensure!(
                error.kind() == io::ErrorKind::InvalidInput,
                "{what}: {error} (kind {:?}), expected InvalidInput",
                error.kind()
            ),
            Ok(()) => {
                return Err(format!(
                    "{what} succeeded on a backend with alignment {}",
                    capabilities.alignment
                ));
            }
        }
    }
    ensure!(size(&*file)? == 0, "a rejected write changed the size to {}", size(&*file)?);
    Ok(Outcome::Pass)
}

fn unaligned_user_buffer<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-unaligned-buffer")?;
    let max = request_bytes_max(backend);
    // Larger than DirBackend's 1 MiB bounce buffer, so chunking is exercised too.
    let len = (1 << 20) + 2 * PAGE_SIZE;
    let data = pattern(11, len);
    let mut source = vec![0u8; len + 1];
    source[1..].copy_from_slice(&data);
    // One page first: DirBackend's bounce buffer then grows from a page to a whole chunk.
    write_in_requests(&*file, max, &source[1..1 + PAGE_SIZE], PAGE)?;
    write_in_requests(&*file, max, &source[1..], PAGE)?;
    let mut target = vec![0u8; len + 1];
    let count = read_in_requests(&*file, max, &mut target[1..], PAGE)?;
    ensure!(count == len, "read {count} of {len} bytes");
    compare("through unaligned buffers", &target[1..], &data)?;
    let mut aligned = AlignedBuf::zeroed(len);
    let count = read_in_requests(&*file, max, &mut aligned, PAGE)?;
    compare("read back aligned", &aligned[..count], &data)?;
    // A short read at the end of the file into an unaligned buffer.
    let count = read_in_requests(&*file, max, &mut target[1..], 2 * PAGE)?;
    ensure!(count == len - PAGE_SIZE, "short unaligned read returned {count}");
    Ok(Outcome::Pass)
}

fn large_run<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-large-run")?;
    let max = request_bytes_max(backend);
    let len = 4 << 20;
    let data = pattern(12, len);
    write_in_requests(&*file, max, &data, 0)?;
    io("sync", file.sync())?;
    let mut contents = AlignedBuf::zeroed(len);
    let count = read_in_requests(&*file, max, &mut contents, 0)?;
    compare("4 MiB run", &contents[..count], &data)?;
    Ok(Outcome::Pass)
}

/// The largest request the backend takes (`max_io_bytes`); larger runs go out in pieces of
/// this size, as the engine sends them.
fn request_bytes_max<B: Backend + ?Sized>(backend: &B) -> usize {
    usize::try_from(backend.capabilities().max_io_bytes).unwrap_or(usize::MAX).max(1)
}

/// Writes `buf` at `offset` in requests of at most `max` bytes.
fn write_in_requests<F: BackendFile + ?Sized>(
    file: &F,
    max: usize,
    buf: &[u8],
    offset: u64,
) -> Result<(), String> {
    for (index, piece) in buf.chunks(max).enumerate() {
        write(file, piece, offset + (index * max) as u64)?;
    }
    Ok(())
}

/// Reads into `buf` from `offset` in requests of at most `max` bytes, stopping at the end of
/// the file; returns the count read.
fn read_in_requests<F: BackendFile + ?Sized>(
    file: &F,
    max: usize,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize, String> {
    let mut done = 0;
    for piece in buf.chunks_mut(max) {
        let want = piece.len();
        let at = offset + done as u64;
        let count = io(&format!("read_at({want} bytes, offset {at})"), file.read_at(piece, at))?;
        ensure!(count <= want, "read_at returned {count} for a {want}-byte buffer");
        done += count;
        if count < want {
            break;
        }
    }
    Ok(done)
}

fn two_phase_commit_and_restart<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    let file = create(backend, "conformance-two-phase")?;
    let committed = pattern(13, PAGE_SIZE);
    let uncommitted = pattern(14, PAGE_SIZE);
    let stability = write(&*file, &committed, 0)?;
    if !backend.capabilities().two_phase {
        ensure!(stability == Stability::Stable, "one-phase backend returned {stability:?}");
        return Ok(Outcome::Skip("backend is not two-phase".to_owned()));
    }
    let Stability::Unstable { verifier } = stability else {
        return Err("two-phase backend returned a Stable write".to_owned());
    };
    let commit = io("commit page 0", file.commit(0, PAGE))?;
    ensure!(
        commit.verifier == verifier,
        "commit verifier {} != write's {verifier}",
        commit.verifier
    );
    let second = write(&*file, &uncommitted, PAGE)?;
    ensure!(second == stability, "second write returned {second:?}, expected {stability:?}");
    let mut both = committed.to_vec();
    both.extend_from_slice(&uncommitted);
    compare("uncommitted data is readable", &read(&*file, 2 * PAGE_SIZE, 0)?, &both)?;
    let Some(hook) = backend.server_restart() else {
        return Ok(Outcome::Skip("no server_restart hook: restart part not run".to_owned()));
    };
    hook.restart();
    let after = io("commit after restart", file.commit(0, 0))?;
    ensure!(after.verifier != verifier, "verifier {verifier} unchanged by a restart");
    let contents = read(&*file, 2 * PAGE_SIZE, 0)?;
    ensure!(PAGE_SIZE <= contents.len(), "committed page lost: {} bytes left", contents.len());
    compare("committed page after restart", &contents[..PAGE_SIZE], &committed)?;
    ensure!(
        contents[PAGE_SIZE..].iter().all(|byte| *byte == 0),
        "uncommitted page survived the restart"
    );
    let rewrite = write(&*file, &uncommitted, PAGE)?;
    ensure!(
        rewrite == Stability::Unstable { verifier: after.verifier },
        "write after restart returned {rewrite:?}, expected the new verifier {}",
        after.verifier
    );
    Ok(Outcome::Pass)
}

fn concurrent_writers<B: Backend + ?Sized>(backend: &B) -> CheckResult {
    const THREADS: u64 = 4;
    const PAGES_PER_THREAD: u64 = 32;
    let file = create(backend, "conformance-concurrent")?;
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let file = Arc::clone(&file);
                scope.spawn(move || {
                    // Interleaved pages: thread t owns pages t, t + 4, t + 8, ...
                    for index in 0..PAGES_PER_THREAD {
                        let page = index * THREADS + thread;
                        write(&*file, &pattern(100 + page, PAGE_SIZE), page * PAGE)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap_or_else(|_| Err("writer panicked".to_owned())))
            .collect()
    });
    for result in results {
        result?;
    }
    let total = (THREADS * PAGES_PER_THREAD) as usize;
    let contents = read(&*file, total * PAGE_SIZE, 0)?;
    ensure!(
        contents.len() == total * PAGE_SIZE,
        "read {} bytes of {}",
        contents.len(),
        total * PAGE_SIZE
    );
    for (page, bytes) in contents.chunks(PAGE_SIZE).enumerate() {
        compare(&format!("page {page}"), bytes, &pattern(100 + page as u64, PAGE_SIZE))?;
    }
    Ok(Outcome::Pass)
}
