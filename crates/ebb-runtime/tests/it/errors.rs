//! Write errors are never lost: reported once per handle, data retried or held.

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::Duration;

use ebb_backend::{Backend, FaultOp, FaultPlan, FaultyBackend, MemBackend, OpenOptions};
use ebb_runtime::{Builder, Ebb};

use crate::io::backend_bytes;

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };

/// A cache of `memory` bytes over a memory backend whose faults the test injects.
fn faulty_cache(memory: u64) -> (Ebb, Arc<FaultPlan>, Arc<dyn Backend>) {
    let faulty = Arc::new(FaultyBackend::new(MemBackend::new()));
    let plan = faulty.plan().clone();
    let backend: Arc<dyn Backend> = faulty;
    let ebb = Builder::new().memory(memory).backend("f", backend.clone()).build().unwrap();
    (ebb, plan, backend)
}

/// The next writes fail with EIO: fsync reports the error once to each handle (even one that
/// did not write), the pages are written again, and every byte reaches the backend.
#[test]
fn failed_writes_are_reported_once_per_handle_and_lose_nothing() {
    // 2 MiB stays below the 64 MiB cache's background threshold: only fsync writes it.
    let (ebb, plan, backend) = faulty_cache(64 << 20);
    let a = ebb.open("x", CREATE).unwrap();
    let b = ebb.open("x", CREATE).unwrap();
    plan.fail_next(FaultOp::Write, libc::EIO, 2);
    let data: Vec<u8> = (0..(2 << 20)).map(|i: u32| (i % 249) as u8).collect();
    a.write_at(&data, 0).unwrap();
    assert_eq!(a.fsync().unwrap_err().raw_os_error(), Some(libc::EIO), "fsync must see it");
    assert_eq!(b.fsync().unwrap_err().raw_os_error(), Some(libc::EIO), "each handle sees it");
    a.fsync().unwrap();
    b.fsync().unwrap();
    assert_eq!(plan.injected_count(), 2);
    assert!(backend_bytes(&*backend, "x") == data, "data lost after EIO");
    a.close().unwrap();
    b.close().unwrap();
}

/// A flush-style check reports a write-back error once to the handle, without closing it.
#[test]
fn check_error_reports_once_without_closing() {
    let (ebb, plan, backend) = faulty_cache(64 << 20);
    let a = ebb.open("c", CREATE).unwrap();
    let b = ebb.open("c", CREATE).unwrap();
    plan.fail_next(FaultOp::Write, libc::EIO, 1);
    a.write_at(&[1u8; 8192], 0).unwrap();
    assert_eq!(a.fsync().unwrap_err().raw_os_error(), Some(libc::EIO));
    assert_eq!(b.check_error().unwrap_err().raw_os_error(), Some(libc::EIO), "b sees it once");
    b.check_error().unwrap();
    b.fsync().unwrap();
    assert_eq!(backend_bytes(&*backend, "c"), vec![1u8; 8192]);
}

/// Writes fail with EIO for 300 ms while a writer keeps fsyncing: once the window passes, all
/// the data is on the backend, and a handle that checks only afterwards sees the error once.
#[test]
fn eio_for_a_while_loses_nothing() {
    let (ebb, plan, backend) = faulty_cache(16 << 20);
    let a = ebb.open("x", CREATE).unwrap();
    let late = ebb.open("x", CREATE).unwrap();
    plan.fail_for(FaultOp::Write, libc::EIO, Duration::from_millis(300));
    let data: Vec<u8> = (0..(6 << 20)).map(|i: u32| (i % 247) as u8).collect();
    a.write_at(&data, 0).unwrap();
    let start = std::time::Instant::now();
    let mut errors = 0;
    while a.fsync().is_err() {
        errors += 1;
        assert!(start.elapsed() < Duration::from_secs(30), "fsync never succeeded");
    }
    assert!(errors >= 1 && plan.injected_count() >= 1);
    assert!(backend_bytes(&*backend, "x") == data, "data lost after transient EIO");
    assert_eq!(late.fsync().unwrap_err().raw_os_error(), Some(libc::EIO));
    late.fsync().unwrap();
}

/// ENOSPC forever: the data stays in the cache (nothing dirty is freed silently), fsync,
/// close and drain report it; once space is back an fsync writes it.
#[test]
fn enospc_keeps_the_data_and_reports_it() {
    let (ebb, plan, backend) = faulty_cache(16 << 20);
    let a = ebb.open("full", CREATE).unwrap();
    plan.fail_always(FaultOp::Write, libc::ENOSPC);
    a.write_at(&vec![5u8; 1 << 20], 0).unwrap();
    let err = a.fsync().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StorageFull, "{err}");
    assert!(ebb.stats().meminfo.dirty >= 256, "held pages must stay dirty");
    let err = ebb.drain(Duration::from_millis(500), &mut |_| {}).unwrap_err();
    assert!(
        err.kind() == ErrorKind::StorageFull || err.kind() == ErrorKind::TimedOut,
        "drain must not claim success: {err}"
    );
    assert!(ebb.stats().meminfo.dirty >= 256);
    plan.clear();
    // The drain's failed attempt is a new error this handle has not seen yet.
    if let Err(e) = a.fsync() {
        assert_eq!(e.kind(), ErrorKind::StorageFull);
        a.fsync().unwrap();
    }
    assert_eq!(backend_bytes(&*backend, "full"), vec![5u8; 1 << 20]);
    assert_eq!(ebb.stats().meminfo.dirty, 0);
}

/// A two-phase backend that restarts between WRITE and COMMIT: the engine sees the new
/// verifier, writes the pages again, and after sync the backend holds everything.
#[test]
fn two_phase_restart_loses_nothing() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::two_phase());
    let ebb = Builder::new().memory(16 << 20).backend("nfs", backend.clone()).build().unwrap();
    let f = ebb.open("u", CREATE).unwrap();
    let data: Vec<u8> = (0..(4 << 20)).map(|i: u32| (i % 241) as u8).collect();
    f.write_at(&data, 0).unwrap();
    // Let some writes land unstable, then restart the server.
    std::thread::sleep(Duration::from_millis(50));
    backend.server_restart().expect("MemBackend::two_phase simulates restarts").restart();
    f.fsync().unwrap();
    ebb.sync().unwrap();
    backend.server_restart().unwrap().restart();
    assert!(backend_bytes(&*backend, "u") == data, "committed data lost by a restart");
    assert!(ebb.stats().counters.commits > 0);
}

/// A write far past what the filesystem allows: the write-back error (EFBIG) reaches fsync,
/// the data is held, not dropped, and dropping the cache does not hang on it.
#[test]
fn a_write_past_the_filesystem_limit_is_reported_and_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let ebb = Builder::new().memory(16 << 20).directory(dir.path()).unwrap().build().unwrap();
    let f = ebb.open("huge", CREATE).unwrap();
    f.write_at(b"far", 1 << 50).unwrap();
    assert_eq!(f.len(), (1 << 50) + 3);
    let err = f.fsync().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFBIG), "{err}");
    assert!(ebb.stats().meminfo.dirty > 0, "the held page is kept");
    let mut got = [0u8; 3];
    assert_eq!(f.read_at(&mut got, 1 << 50).unwrap(), 3);
    assert_eq!(&got, b"far");
    let start = std::time::Instant::now();
    drop(f);
    drop(ebb);
    assert!(start.elapsed() < Duration::from_secs(30), "dropping the cache hung on held pages");
}

/// Write errors through a lane (a directory backend, whose writes of one file one thread issues
/// back to back): writes that fail among others queued behind them are each reported, fsync
/// sees the error once, and the pages written again reach the disk.
#[test]
fn lane_write_errors_are_reported_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyBackend::new(ebb_backend::DirBackend::open(dir.path()).unwrap()));
    assert!(faulty.capabilities().serial_writes, "a directory backend writes through a lane");
    let plan = faulty.plan().clone();
    let backend: Arc<dyn Backend> = faulty;
    // 6 MiB: 2 MiB of IO buffers (one huge-page write buffer) and 4 MiB of cache.
    let ebb = Builder::new().memory(6 << 20).io_threads(4).backend("d", backend).build().unwrap();
    let f = ebb.open("x", CREATE).unwrap();
    plan.fail_next(FaultOp::Write, libc::EIO, 5);
    let data: Vec<u8> = (0..(12u32 << 20)).map(|i| (i % 253) as u8).collect();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        f.write_at(chunk, (i as u64) << 20).unwrap();
    }
    assert_eq!(f.fsync().unwrap_err().raw_os_error(), Some(libc::EIO), "fsync must see it");
    f.fsync().unwrap();
    assert_eq!(plan.injected_count(), 5);
    assert!(std::fs::read(dir.path().join("x")).unwrap() == data, "data lost after EIO");
}

/// A file's error state is queryable: the last error and how many happened, and whether a
/// handle saw it.
#[test]
fn a_files_errors_are_queryable() {
    let (ebb, plan, _backend) = faulty_cache(64 << 20);
    let file = ebb.open("q", CREATE).unwrap();
    assert_eq!(file.errors().map(|e| e.count), Some(0));
    plan.fail_next(FaultOp::Write, libc::EIO, 1);
    file.write_at(&[1u8; 8192], 0).unwrap();
    assert!(file.fsync().is_err());
    let errors = file.errors().unwrap();
    assert_eq!(errors.error.map(|e| e.errno), Some(libc::EIO));
    assert_eq!(errors.count, 1);
    assert!(!errors.unseen, "fsync reported it");
    file.fsync().unwrap();
    assert_eq!(file.errors().unwrap().dirty_pages, 0);
}

/// A file discarded (deleted underneath: an NFS server then answers `ESTALE`) while its
/// writes are in flight: neither the sync running then nor a later one reports an error of it,
/// whether its writes fail (they carried nothing anyone can read) or succeed and the backend
/// file's own sync then fails, and nothing of the file is left dirty.
#[test]
fn a_discarded_file_in_writeback_is_not_reported() {
    discard_during_writeback(true);
    discard_during_writeback(false);
}

fn discard_during_writeback(writes_fail: bool) {
    let (ebb, plan, backend) = faulty_cache(64 << 20);
    let file = ebb.attach("f", 7, backend.open("gone", CREATE).unwrap()).unwrap();
    file.write_at(&[3u8; 256 << 10], 0).unwrap();
    file.close().unwrap();
    plan.delay(FaultOp::Write, std::time::Duration::from_millis(300));
    if writes_fail {
        plan.fail_always(FaultOp::Write, libc::ESTALE);
    }
    plan.fail_always(FaultOp::Sync, libc::ESTALE);
    plan.fail_always(FaultOp::Commit, libc::ESTALE);
    let syncing = {
        let ebb = ebb.clone();
        std::thread::spawn(move || ebb.sync())
    };
    while ebb.stats().meminfo.writeback == 0 {
        assert!(!syncing.is_finished(), "the sync ended before any write went out");
        std::thread::yield_now();
    }
    ebb.discard("f", 7).unwrap();
    let during = syncing.join().unwrap();
    let after = ebb.sync();
    plan.clear();
    let case = if writes_fail { "failing writes" } else { "failing syncs" };
    assert!(during.is_ok(), "{case}: the sync running at the discard reported {during:?}");
    assert!(after.is_ok(), "{case}: a later sync reported {after:?}");
    let s = ebb.stats();
    assert_eq!((s.meminfo.dirty, s.meminfo.writeback), (0, 0), "{case}: {:?}", s.meminfo);
}
