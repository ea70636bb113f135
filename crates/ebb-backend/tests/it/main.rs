//! Integration tests of ebb-backend, one binary: the conformance suite against every backend
//! this crate ships, then the parts of the contract the suite cannot see (fault schedules,
//! error codes, `O_DIRECT` refusal, `AlignedBuf`).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ebb_backend::conformance::{self, CHECK_NAMES};
use ebb_backend::{
    AlignedBuf, Backend, DirBackend, FaultOp, FaultyBackend, MemBackend, OpenOptions, PAGE_SIZE,
    Stability,
};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };

/// A fresh, existing subdirectory of `root` for each call (each conformance check gets one).
fn fresh_dir(root: &Path) -> std::path::PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = root.join(format!("b{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir(&dir).expect("create backend directory");
    dir
}

/// A directory for backends under `/tmp` (ext4 on this machine: `O_DIRECT` works), removed at
/// the end of the test.
fn tmp_root() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("ebb-backend-it").tempdir_in("/tmp").unwrap()
}

ebb_backend::backend_conformance! {
    /// The plain memory backend passes every check; only the two-phase check does not apply.
    mod conformance_mem {
        backend: MemBackend::new(),
        skipped: [two_phase_commit_and_restart],
    }
}

ebb_backend::backend_conformance! {
    /// The two-phase memory backend passes everything, including the restart part.
    mod conformance_mem_two_phase {
        backend: MemBackend::two_phase(),
    }
}

ebb_backend::backend_conformance! {
    /// The default backend, `O_DIRECT` on ext4 under /tmp.
    mod conformance_dir_tmp {
        setup: {
            let root = tmp_root();
            assert!(DirBackend::open(fresh_dir(root.path())).unwrap().capabilities().direct_io);
        },
        backend: DirBackend::open(fresh_dir(root.path())).expect("O_DIRECT on /tmp"),
        skipped: [two_phase_commit_and_restart],
    }
}

ebb_backend::backend_conformance! {
    /// The fault wrapper with nothing armed is transparent over a stable backend.
    mod conformance_faulty_mem {
        backend: FaultyBackend::new(MemBackend::new()),
        skipped: [two_phase_commit_and_restart],
    }
}

ebb_backend::backend_conformance! {
    /// The fault wrapper forwards a two-phase backend's restart hook.
    mod conformance_faulty_mem_two_phase {
        backend: FaultyBackend::new(MemBackend::two_phase()),
    }
}

ebb_backend::backend_conformance! {
    /// The fault wrapper over the directory backend.
    mod conformance_faulty_dir {
        setup: { let root = tmp_root(); },
        backend: FaultyBackend::new(DirBackend::open(fresh_dir(root.path())).unwrap()),
        skipped: [two_phase_commit_and_restart],
    }
}

// /dev/shm is tmpfs: kernels from 6.6 accept O_DIRECT there, older ones refuse it. Either way
// the backend must work: direct if accepted, else `open` says so and the explicit fallback works
// (the suite runs on it below).
#[test]
fn dir_dev_shm_direct_or_fallback() {
    let Ok(root) = tempfile::Builder::new().prefix("ebb-backend-it").tempdir_in("/dev/shm") else {
        return; // No /dev/shm on this machine: nothing to test.
    };
    let direct = match DirBackend::open(fresh_dir(root.path())) {
        Ok(_) => true,
        Err(error) => {
            assert_eq!(error.kind(), io::ErrorKind::Unsupported, "{error}");
            assert!(error.to_string().contains("open_buffered_fallback"), "{error}");
            false
        }
    };
    let make = || Box::new(DirBackend::open_buffered_fallback(fresh_dir(root.path())).unwrap());
    assert_eq!(make().capabilities().direct_io, direct);
}

ebb_backend::backend_conformance! {
    /// The directory backend on /dev/shm, direct or through the explicit buffered fallback.
    mod conformance_dir_dev_shm {
        setup: {
            // No /dev/shm on this machine: nothing to test.
            let root =
                tempfile::Builder::new().prefix("ebb-backend-it").tempdir_in("/dev/shm").ok()?;
        },
        backend: DirBackend::open_buffered_fallback(fresh_dir(root.path())).unwrap(),
        skipped: [two_phase_commit_and_restart],
    }
}

// Trait objects are backends too: the runtime holds `Arc<dyn Backend>`.
#[test]
fn conformance_through_trait_objects() {
    let make = || -> Box<dyn Backend> { Box::new(MemBackend::two_phase()) };
    let report = conformance::assert_conformance(&make);
    assert_eq!(report.passed.len(), CHECK_NAMES.len(), "{report}");
}

// A test the macro makes fails when its check fails, when its check is skipped but not listed
// as such, when a check listed as skipped or failing passes, and for a name that is no check;
// it passes when a listed check does what the list says.
#[test]
fn conformance_tests_fail_when_they_should() {
    use ebb_backend::conformance::{Expected, assert_check};
    let broken = || {
        let backend = FaultyBackend::new(MemBackend::new());
        backend.plan().fail_always(FaultOp::Sync, libc::EIO);
        backend
    };
    let fails =
        |test: &dyn Fn()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(test)).is_err();
    let none = Expected::default();
    let skipped = Expected { skipped: &["overwrite"], failing: &[] };
    let failing = Expected { skipped: &[], failing: &["sync_after_write"] };
    assert!(fails(&|| assert_check("sync_after_write", none, &broken)));
    assert!(fails(&|| assert_check("two_phase_commit_and_restart", none, &MemBackend::new)));
    assert!(fails(&|| assert_check("overwrite", skipped, &MemBackend::new)));
    assert!(fails(&|| assert_check("sync_after_write", failing, &MemBackend::new)));
    assert!(fails(&|| assert_check("no_such_check", none, &MemBackend::new)));
    assert_check("sync_after_write", failing, &broken);
    let two_phase = Expected { skipped: &["two_phase_commit_and_restart"], failing: &[] };
    assert_check("two_phase_commit_and_restart", two_phase, &MemBackend::new);
}

// A backend that breaks the contract is reported by check name, and other checks still run.
#[test]
fn conformance_reports_failures_by_name() {
    let make = || {
        let backend = FaultyBackend::new(MemBackend::new());
        backend.plan().fail_always(FaultOp::Sync, libc::EIO);
        Box::new(backend)
    };
    let report = conformance::run_all(&make);
    let failed: Vec<_> = report.failed.iter().map(|failure| failure.check).collect();
    assert_eq!(failed, ["reopen_and_truncate", "sync_after_write", "large_run"], "{report}");
    assert!(report.failed[1].message.contains("Input/output error"), "{report}");
    assert!(report.passed.contains(&"concurrent_writers"));
}

fn page(byte: u8) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(PAGE_SIZE);
    buf.fill(byte);
    buf
}

// fail_next fails exactly N calls of one operation, with the errno intact, and nothing reaches
// the wrapped backend; other operations are untouched.
#[test]
fn fault_fail_next_count() {
    let backend = FaultyBackend::new(MemBackend::new());
    let file = backend.open("f", CREATE).unwrap();
    backend.plan().fail_next(FaultOp::Write, libc::ENOSPC, 2);
    for _ in 0..2 {
        let error = file.write_at(&page(1), 0).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(error.kind(), io::ErrorKind::StorageFull);
    }
    assert_eq!(file.size().unwrap(), 0, "a failed write reached the backend");
    file.sync().unwrap();
    file.write_at(&page(1), 0).unwrap();
    assert_eq!(file.size().unwrap(), PAGE_SIZE as u64);
    assert_eq!(backend.plan().injected_count(), 2);
}

// fail_for fails every call in the window and none after it. Each call is judged by when it
// surely ran: inside the window if it returned before the window could end, after it if it
// began once the window had surely ended; a call that straddles the end may go either way (a
// loaded machine can stall any call, so the test never assumes how long one takes).
#[test]
fn fault_fail_for_window() {
    let backend = FaultyBackend::new(MemBackend::new());
    let file = backend.open("f", CREATE).unwrap();
    let window = Duration::from_millis(100);
    let armed = Instant::now();
    backend.plan().fail_for(FaultOp::Write, libc::EIO, window);
    let surely_armed = Instant::now();
    let (mut inside, mut after) = (0, 0);
    while after < 3 {
        let begun = Instant::now();
        let result = file.write_at(&page(2), 0);
        let ended = Instant::now();
        if ended < armed + window {
            assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EIO), "inside the window");
            inside += 1;
        } else if begun > surely_armed + window {
            result.expect("after the window");
            after += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if inside == 0 {
        eprintln!("fault_fail_for_window: no call ran inside the window (machine stalled)");
    }
}

// fail_always models a full or read-only device: every call fails until clear().
#[test]
fn fault_fail_always_until_clear() {
    let backend = FaultyBackend::new(MemBackend::new());
    let file = backend.open("f", CREATE).unwrap();
    backend.plan().fail_always(FaultOp::Write, libc::EROFS);
    backend.plan().fail_always(FaultOp::SetSize, libc::EROFS);
    for _ in 0..100 {
        let error = file.write_at(&page(3), 0).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ReadOnlyFilesystem);
    }
    assert_eq!(file.set_size(10).unwrap_err().raw_os_error(), Some(libc::EROFS));
    file.read_at(&mut page(0), 0).unwrap();
    backend.plan().clear();
    file.write_at(&page(3), 0).unwrap();
    assert_eq!(backend.plan().injected_count(), 101);
}

// Commit faults leave the data unstable; the engine retries and gets the same verifier.
#[test]
fn fault_commit() {
    let backend = FaultyBackend::new(MemBackend::two_phase());
    let file = backend.open("f", CREATE).unwrap();
    let Stability::Unstable { verifier } = file.write_at(&page(4), 0).unwrap().stability else {
        panic!("two-phase write was stable");
    };
    backend.plan().fail_next(FaultOp::Commit, libc::EIO, 1);
    assert_eq!(file.commit(0, 0).unwrap_err().raw_os_error(), Some(libc::EIO));
    assert_eq!(file.commit(0, 0).unwrap().verifier, verifier);
}

// Open and sync faults.
#[test]
fn fault_open_and_sync() {
    let backend = FaultyBackend::new(MemBackend::new());
    backend.plan().fail_next(FaultOp::Open, libc::EMFILE, 1);
    assert_eq!(backend.open("f", CREATE).unwrap_err().raw_os_error(), Some(libc::EMFILE));
    let file = backend.open("f", CREATE).unwrap();
    backend.plan().fail_next(FaultOp::Sync, libc::EIO, 1);
    assert_eq!(file.sync().unwrap_err().raw_os_error(), Some(libc::EIO));
    file.sync().unwrap();
}

// Latency rules add (at least) their delay to each call of their operation. Only lower bounds
// are checked: a loaded machine can stall any call; that a rule applies to its own operation
// only is what the failure rules' tests show.
#[test]
fn fault_latency() {
    let backend = FaultyBackend::new(MemBackend::new());
    let file = backend.open("f", CREATE).unwrap();
    backend.plan().delay(FaultOp::Write, Duration::from_millis(20));
    backend.plan().delay(FaultOp::Read, Duration::from_millis(5));
    let start = Instant::now();
    file.write_at(&page(5), 0).unwrap();
    file.write_at(&page(5), 0).unwrap();
    assert!(Duration::from_millis(40) <= start.elapsed());
    let start = Instant::now();
    file.read_at(&mut page(0), 0).unwrap();
    assert!(Duration::from_millis(5) <= start.elapsed());
    file.sync().unwrap();
    assert_eq!(backend.plan().injected_count(), 0, "delays are not failures");
}

// A latency rule and a failure rule on the same op: the call is slow and then fails.
#[test]
fn fault_latency_then_failure() {
    let backend = FaultyBackend::new(MemBackend::new());
    let file = backend.open("f", CREATE).unwrap();
    backend.plan().delay(FaultOp::Write, Duration::from_millis(10));
    backend.plan().fail_next(FaultOp::Write, libc::EIO, 1);
    let start = Instant::now();
    assert!(file.write_at(&page(6), 0).is_err());
    assert!(Duration::from_millis(10) <= start.elapsed());
}

// OS errors reach the caller unchanged (raw errno kept), and misaligned O_DIRECT requests are
// InvalidInput naming the rule rather than a kernel EINVAL.
#[test]
fn dir_errors() {
    let root = tempfile::Builder::new().prefix("ebb-backend-it").tempdir_in("/tmp").unwrap();
    let backend = DirBackend::open(root.path()).unwrap();
    let missing = backend.open("missing", OpenOptions { create: false, truncate: false });
    assert_eq!(missing.unwrap_err().raw_os_error(), Some(libc::ENOENT));
    let error = DirBackend::open(root.path().join("no-such-dir")).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENOENT));
    let file = backend.open("f", CREATE).unwrap();
    let error = file.write_at(&page(7)[..512], 0).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("multiples of 4096"), "{error}");
    let error = file.write_at(&page(7), u64::MAX - 10).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(file.set_size(u64::MAX).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    assert_eq!(backend.remove("missing").unwrap_err().raw_os_error(), Some(libc::ENOENT));
    // No probe file is left behind.
    let names: Vec<_> =
        std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["f"]);
}

// A file opened by path (how ebb-fuse opens its backing files) follows DirBackend's rules:
// O_DIRECT with 4096-aligned requests, data visible in the file, sync works, a directory or a
// missing path is refused with a clear error.
#[test]
fn open_direct_path_rules() {
    let root = tempfile::Builder::new().prefix("ebb-backend-it").tempdir_in("/tmp").unwrap();
    let path = root.path().join("by-path");
    std::fs::write(&path, b"").unwrap();
    let file = ebb_backend::open_direct_path(&path).unwrap();
    let error = file.write_at(&page(3)[..100], 0).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    file.write_at(&page(5), PAGE_SIZE as u64).unwrap();
    file.sync().unwrap();
    assert_eq!(file.size().unwrap(), 2 * PAGE_SIZE as u64);
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk[..PAGE_SIZE].iter().all(|&b| b == 0));
    assert!(on_disk[PAGE_SIZE..].iter().all(|&b| b == 5));
    let error = ebb_backend::open_direct_path(&root.path().join("missing")).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENOENT));
    let error = ebb_backend::open_direct_path(root.path()).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EISDIR));
}

// The memory backend's errors carry Linux errnos too, and huge sizes fail instead of aborting.
#[test]
fn mem_errors() {
    let backend = MemBackend::new();
    let missing = backend.open("missing", OpenOptions { create: false, truncate: false });
    assert_eq!(missing.unwrap_err().raw_os_error(), Some(libc::ENOENT));
    let file = backend.open("f", CREATE).unwrap();
    assert_eq!(file.write_at(&page(8), 1 << 50).unwrap_err().raw_os_error(), Some(libc::EFBIG));
    assert_eq!(file.set_size(1 << 50).unwrap_err().raw_os_error(), Some(libc::EFBIG));
    assert_eq!(file.size().unwrap(), 0);
}

// A restart also reverts files that were removed while open (their handles still work).
#[test]
fn mem_restart_reaches_removed_open_files() {
    let backend = MemBackend::two_phase();
    let file = backend.open("f", CREATE).unwrap();
    file.write_at(&page(9), 0).unwrap();
    backend.remove("f").unwrap();
    backend.server_restart().unwrap().restart();
    assert_eq!(file.size().unwrap(), 0);
    assert!(MemBackend::new().server_restart().is_none());
}

// AlignedBuf: aligned, page-multiple, zeroed, Send + Sync.
#[test]
fn aligned_buf() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<AlignedBuf>();
    for len in [0, 1, 4095, 4096, 4097, 3 << 20] {
        let buf = AlignedBuf::zeroed(len);
        assert_eq!(buf.len(), len.next_multiple_of(PAGE_SIZE));
        assert_eq!(buf.as_ptr().addr() % PAGE_SIZE, 0);
        assert!(buf.iter().all(|byte| *byte == 0));
    }
    assert!(AlignedBuf::try_zeroed(usize::MAX).is_none());
    let copy = AlignedBuf::copy_from(b"abc");
    assert_eq!(&copy[..4], b"abc\0");
}

// AlignedBuf::huge: huge-page aligned, a huge-page multiple, zeroed, writable, and usable for
// O_DIRECT (a round trip through a real directory).
#[test]
fn huge_aligned_buf() {
    for len in [0, 1, 1 << 20, ebb_backend::HUGE_PAGE_SIZE + 1] {
        let mut buf = AlignedBuf::huge(len);
        assert_eq!(buf.len(), len.max(1).next_multiple_of(ebb_backend::HUGE_PAGE_SIZE));
        assert_eq!(buf.as_ptr().addr() % ebb_backend::HUGE_PAGE_SIZE, 0);
        assert!(buf.iter().all(|byte| *byte == 0));
        buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        assert_eq!(buf[buf.len() - 1], (buf.len() - 1) as u8);
    }
    let dir = tempfile::tempdir().unwrap();
    let backend = DirBackend::open(dir.path()).unwrap();
    let file = backend.open("h", OpenOptions { create: true, truncate: true }).unwrap();
    let mut buf = AlignedBuf::huge(1 << 20);
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
    file.write_at(&buf[..1 << 20], 0).unwrap();
    let mut back = AlignedBuf::zeroed(1 << 20);
    assert_eq!(file.read_at(&mut back, 0).unwrap(), 1 << 20);
    assert!(back[..] == buf[..1 << 20]);
}

// AlignedBuf::huge is backed by huge pages even where malloc's memory was touched before, so
// that an O_DIRECT write from it is one segment per 2 MiB: an 8 MiB write reaches a device of
// 254 segments and max_sectors_kb 4096 (virtio on the development machine) as two requests of
// 4 MiB, not as eight of 1016 KiB and one of 64. This sets up what served the buffer from
// touched 4 KiB pages before (issue 22): a freed 16 MiB block raises glibc's mapping threshold,
// so the buffer comes from an arena, and the buffer's thread takes over the arena of a thread
// that filled it with ordinary blocks and exited. Needs THP (`enabled` not `never`); when the
// kernel had no huge page to give (a THP fault fell back meanwhile) the test is skipped.
#[test]
fn huge_aligned_buf_gets_huge_pages_where_malloc_had_touched_the_memory() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    let thp = thp.unwrap_or_default();
    if !thp.contains("[always]") && !thp.contains("[madvise]") {
        eprintln!("SKIPPED: transparent huge pages are off ({})", thp.trim());
        return;
    }
    drop(std::hint::black_box(vec![1u8; 16 << 20]));
    std::thread::spawn(|| {
        let blocks: Vec<Vec<u8>> = (0..400).map(|i| vec![i as u8; 64 << 10]).collect();
        drop(std::hint::black_box(blocks));
    })
    .join()
    .unwrap();
    let fallbacks = vmstat("thp_fault_fallback");
    let (len, huge_kib) = std::thread::spawn(|| {
        let mut buf = AlignedBuf::huge(8 << 20);
        buf.fill(1);
        (buf.len() as u64, anon_huge_kib(&buf))
    })
    .join()
    .unwrap();
    if huge_kib * 1024 < len && vmstat("thp_fault_fallback") > fallbacks {
        eprintln!("SKIPPED: the kernel had no huge page to give (thp_fault_fallback rose)");
        return;
    }
    assert!(huge_kib * 1024 >= len, "{huge_kib} KiB of huge pages under a {len}-byte buffer");
}

/// `AnonHugePages` (KiB) of the mapping that holds `buf`'s first byte, from `/proc/self/smaps`.
fn anon_huge_kib(buf: &[u8]) -> u64 {
    let at = buf.as_ptr().addr();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = lo <= at && at < hi;
        } else if inside && first == "AnonHugePages:" {
            return line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).unwrap_or(0);
        }
    }
    0
}

/// A counter of `/proc/vmstat` (0 if absent).
fn vmstat(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let value = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok());
    value.unwrap_or(0)
}

// A filesystem that refuses O_DIRECT (ramfs; tmpfs before Linux 6.6): `open` fails with a clear
// Unsupported error, the explicit fallback works buffered, and no probe file is left behind.
// Mounts ramfs, so it runs only with EBB_RUN_SLOW_TESTS set (as root).
#[test]
fn dir_refused_direct_io_ramfs() {
    if std::env::var_os("EBB_RUN_SLOW_TESTS").is_none() {
        return;
    }
    let root = tempfile::Builder::new().prefix("ebb-backend-ramfs").tempdir_in("/tmp").unwrap();
    let mount = |args: &[&str]| std::process::Command::new(args[0]).args(&args[1..]).status();
    let path = root.path().to_str().unwrap();
    assert!(mount(&["mount", "-t", "ramfs", "ramfs", path]).unwrap().success());
    let error = DirBackend::open(root.path()).unwrap_err();
    let fallback = DirBackend::open_buffered_fallback(root.path()).map(|backend| {
        assert!(!backend.capabilities().direct_io);
        assert_eq!(backend.capabilities().alignment, 1);
    });
    let leftovers = std::fs::read_dir(root.path()).unwrap().count();
    let make = || Box::new(DirBackend::open_buffered_fallback(fresh_dir(root.path())).unwrap());
    let report = conformance::run_all(&make);
    assert!(mount(&["umount", path]).unwrap().success());
    assert_eq!(error.kind(), io::ErrorKind::Unsupported, "{error}");
    assert!(error.to_string().contains("refuses O_DIRECT"), "{error}");
    fallback.unwrap();
    assert_eq!(leftovers, 0, "the O_DIRECT probe left a file behind");
    assert!(report.is_ok(), "{report}");
}

mod nfs;
mod s3;

ebb_backend::namespace_conformance! {
    /// A local directory passes every check of the namespace contract, with direct file data.
    mod namespace_conformance_dir {
        setup: { let root = tmp_root(); },
        namespace: ebb_backend::DirNamespace::open(root.path()).unwrap(),
    }
}

ebb_backend::namespace_conformance! {
    /// ... and with buffered file data.
    mod namespace_conformance_dir_buffered {
        setup: { let root = tmp_root(); },
        namespace: ebb_backend::DirNamespace::open_buffered(root.path()).unwrap(),
    }
}
