//! The engine's work per event does not depend on how many files it knows, and files that are
//! closed with nothing cached leave it.

use ebb_core::*;

use crate::harness::*;

/// Files visited and events handled while one writer writes a file, fsyncs and syncs it on a
/// two-phase backend (COMMITs, unstable pages), with `known` other files open and idle.
fn visits_with_known_files(known: u64) -> (u64, u64) {
    let mut h = Harness::new(config(256, ThrottlePolicy::Ioless), &[15_000]);
    h.unstable_backend = Some(7);
    for i in 0..known {
        let handle = HandleId(1_000_000 + i);
        h.request(Event::Open { handle, inode: InodeId(1_000_000 + i), backend: BackendId(0) });
    }
    let before = h.engine.stats().clone();
    h.add_dd(0, 4_000, 64, Instant::ZERO);
    h.run_until(secs(2));
    h.request(Event::Fsync { handle: HandleId(1), request: RequestId(1) });
    h.request(Event::Sync { request: RequestId(2) });
    h.run_until(secs(60));
    assert_eq!(h.done_requests.get(&RequestId(1)), Some(&Ok(())), "fsync not answered");
    assert_eq!(h.done_requests.get(&RequestId(2)), Some(&Ok(())), "sync not answered");
    let after = h.engine.stats();
    (after.files_visited - before.files_visited, after.events - before.events)
}

/// The same events visit the same number of files with 10 and with 100,000 files known: timers
/// and unstable files are kept in indexes, not found by scanning every file. (The scanning
/// engine visited every known file at each timer, sync and poll for the next timer.)
#[test]
fn files_visited_per_event_do_not_grow_with_the_files_known() {
    let (few_visits, few_events) = visits_with_known_files(10);
    let (many_visits, many_events) = visits_with_known_files(100_000);
    assert!(few_events > 20, "the workload handled only {few_events} events");
    assert_eq!(few_events, many_events, "the same workload, the same events");
    assert_eq!(
        few_visits, many_visits,
        "files visited: {few_visits} with 10 files known, {many_visits} with 100,000"
    );
}

/// A file closed with nothing cached, and one whose pages were truncated away after it was
/// written back and closed, leave the engine ([`Action::Forget`]); an open file and a closed
/// file with cached pages stay.
#[test]
fn closed_files_with_nothing_cached_are_forgotten() {
    let mut h = Harness::new(config(256, ThrottlePolicy::Ioless), &[15_000]);
    for i in 0..1_000 {
        h.request(Event::Open {
            handle: HandleId(100 + i),
            inode: InodeId(100 + i),
            backend: BackendId(0),
        });
        h.request(Event::Close { handle: HandleId(100 + i), request: RequestId(100 + i) });
    }
    assert_eq!(h.forgotten, 1_000, "closed empty files forgotten");
    assert!(!h.engine.knows_inode(InodeId(100)));
    // A written file: cached after close, forgotten once its pages are truncated away.
    let dd = h.add_dd(0, 100, 10, Instant::ZERO);
    h.run_until(secs(1));
    let (inode, handle) = (h.dds[dd].inode, h.dds[dd].handle);
    h.request(Event::Fsync { handle, request: RequestId(1) });
    h.run_until(secs(5));
    h.request(Event::Close { handle, request: RequestId(2) });
    h.run_until(secs(6));
    assert!(h.engine.knows_inode(inode), "a closed file with cached pages stays");
    h.request(Event::Truncate { inode, first_page: 0 });
    assert!(!h.engine.knows_inode(inode), "a deleted file leaves");
    assert_eq!(h.engine.stats().files_forgotten, 1_001);
    // Known again when reopened.
    h.request(Event::Open { handle: HandleId(9), inode, backend: BackendId(0) });
    assert!(h.engine.knows_inode(inode));
}

/// The state of the files the engine knows is charged against memory
/// (`Config::file_state_bytes`, as the kernel counts its inode slab): opening 2,000 files beside
/// a cache full of clean pages makes kswapd evict enough of them that frames and the charge fit
/// in memory, and the dirty threshold falls with the free memory; the charge stops at half of
/// memory, and goes with the files once they are closed and forgotten. Without the charge the
/// 2,000 files' 4,000 pages of state came on top of about 15,000 cached pages in 16,384.
#[test]
fn the_files_state_is_charged_against_memory() {
    let mut c = config(64, ThrottlePolicy::Ioless);
    c.file_state_bytes = 8192;
    let mut h = Harness::new(c, &[15_000]);
    // 15,000 pages written and synced: clean, and cached as long as memory has room.
    let dd = h.add_dd(0, 15_000, 64, Instant::ZERO);
    h.run_until(secs(10));
    h.request(Event::Sync { request: RequestId(1) });
    h.run_until(secs(30));
    assert_eq!(h.done_requests.get(&RequestId(1)), Some(&Ok(())), "sync not answered");
    let full = h.engine.meminfo();
    assert!(full.slab <= 2, "at most the written file known, two pages of state: {full:?}");
    assert!(full.cached > 14_000 && full.dirty == 0, "not a full clean cache: {full:?}");
    for i in 0..2_000 {
        let (handle, inode) = (HandleId(100_000 + i), InodeId(100_000 + i));
        h.request(Event::Open { handle, inode, backend: BackendId(0) });
    }
    let charged = h.engine.meminfo();
    assert_eq!(charged.slab, full.slab + 2 * 2_000, "{charged:?}");
    // kswapd balanced memory back above the watermarks (min: 256 pages of 64 MiB), so the
    // frames and the state fit in it (overcommitted, there would be no free page).
    assert!(charged.free >= 256, "memory not balanced: {charged:?}");
    assert!(charged.cached + charged.slab + charged.free <= charged.total, "{charged:?}");
    assert!(charged.cached < full.cached - 2_500, "clean pages not evicted: {charged:?}");
    assert!(charged.thresh < full.thresh, "the dirty threshold did not fall: {charged:?}");
    let writers = [&h.dds[dd].w];
    h.engine.check_accounting(&h.maps, &writers).unwrap();
    // Files held open beyond half of memory: the charge stops there.
    for i in 2_000..10_000 {
        let (handle, inode) = (HandleId(100_000 + i), InodeId(100_000 + i));
        h.request(Event::Open { handle, inode, backend: BackendId(0) });
    }
    assert_eq!(h.engine.meminfo().slab, charged.total / 2);
    // Closed with nothing cached, the files are forgotten and their charge goes.
    let forgotten_before = h.forgotten;
    for i in 0..10_000 {
        h.request(Event::Close { handle: HandleId(100_000 + i), request: RequestId(100 + i) });
    }
    assert_eq!(h.forgotten - forgotten_before, 10_000);
    assert_eq!(h.engine.meminfo().slab, full.slab);
}
