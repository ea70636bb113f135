//! Anonymous memory and swap through the engine's public calls: faults take frames, reclaim
//! swaps out to the swap backend when memory is short, completed swap-outs free memory, and the
//! budget always holds.

use ebb_core::SWAP_INODE;
use ebb_core::*;

fn config(swap: bool) -> Config {
    let mut c = Config::new(16 << 20, BackendConfig::new("data"));
    c.backends.push(BackendConfig::new("swap"));
    c.swap_backend = swap.then_some(1);
    c
}

/// Faults in `pages` anonymous pages 256 at a time, 1 ms apart; each fault's swap-out writes
/// complete at the next fault. Returns the engine, the pages granted and the waits.
fn fault_all(swap: bool, pages: u64) -> (Engine, u64, u64) {
    let mut engine = Engine::new(config(swap), Instant::ZERO).expect("valid");
    let mut maps = MapStore::new();
    let mut w = Writer::new(WriterId(0), GroupId(0));
    let mut now = Instant::ZERO;
    let (mut granted, mut waits) = (0, 0);
    let mut pending: Vec<IoId> = Vec::new();
    let total = engine.meminfo().total;
    for _ in 0..10_000 {
        if granted >= pages {
            break;
        }
        now += Duration::from_millis(1);
        let (got, next) = engine.anon_fault(now, &mut w, 256.min(pages - granted), &mut maps);
        granted += got;
        if matches!(next, WriterNext::Wait { .. }) {
            waits += 1;
        }
        let mi = engine.meminfo();
        assert!(mi.anon + mi.cached <= total, "budget: {mi:?}");
        // Complete the swap-outs issued before this fault, then collect the new ones.
        for io in pending.drain(..) {
            engine.handle(now, Event::WriteDone { io, result: Ok(Stability::Stable) }, &mut maps);
        }
        while let Some(action) = engine.poll_action() {
            match action {
                Action::Write { io, backend, inode, runs, .. } => {
                    let pages: u64 = runs.iter().map(|run| run.count).sum();
                    assert_eq!((backend, inode), (BackendId(1), SWAP_INODE), "only swap-outs");
                    assert!((1..=32).contains(&pages), "clusters of at most 32: {pages}");
                    pending.push(io);
                }
                Action::Resume { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        if matches!(next, WriterNext::Wait { .. }) && pending.is_empty() && !swap {
            break;
        }
    }
    (engine, granted, waits)
}

/// With swap, a program may touch three times the memory: reclaim swaps the oldest pages out in
/// clusters to the swap backend, and the memory of each completed swap-out is reused.
#[test]
fn anonymous_memory_larger_than_memory_swaps() {
    let pages = 3 * 4096;
    let (engine, granted, _) = fault_all(true, pages);
    assert_eq!(granted, pages, "every page was faulted in");
    let s = engine.stats();
    let swapped = s.kswapd_swapped + s.direct_swapped;
    assert!(swapped >= pages - 4096, "at least what did not fit went to swap: {s:?}");
    assert_eq!(s.direct_written + s.kswapd_written, 0, "no file page was written: {s:?}");
    assert!(engine.meminfo().anon <= 4096);
}

/// Without swap, anonymous memory is not reclaimable: the faulting writer stalls once memory
/// is down to the min watermark, and the stall is counted.
#[test]
fn without_swap_anonymous_memory_stalls() {
    let (engine, granted, waits) = fault_all(false, 2 * 4096);
    assert!(granted < 4096, "{granted}");
    assert!(granted > 4096 - 256, "all but the reserve below min: {granted}");
    assert!(waits >= 1);
    assert!(engine.stats().reclaim_stalls >= 1);
    assert_eq!(engine.stats().kswapd_swapped + engine.stats().direct_swapped, 0);
}

/// Writes `pages` pages of a new file (below the background threshold, so no writeback starts),
/// then faults in anonymous memory until reclaim must take the dirty file pages. Returns the
/// engine and the page counts of the writes issued meanwhile (never completed).
fn dirty_file_then_anon_burst(policy: ReclaimPolicy, pages: u64) -> (Engine, Vec<u64>) {
    let mut c = config(false);
    c.reclaim = policy;
    c.dirty_ratio = 90;
    c.dirty_background_ratio = 80;
    let mut engine = Engine::new(c, Instant::ZERO).expect("valid");
    let mut maps = MapStore::new();
    let inode = InodeId(7);
    let open = Event::Open { handle: HandleId(1), inode, backend: BackendId(0) };
    engine.handle(Instant::ZERO, open, &mut maps);
    let now = Instant::ZERO + Duration::from_millis(1);
    let mut w = Writer::new(WriterId(0), GroupId(0));
    let mut pos = 0;
    while pos < pages {
        let (consumed, next) =
            engine.writer_write(now, &mut w, inode, (pos, pages - pos), &mut maps);
        pos += consumed;
        assert!(matches!(next, WriterNext::Done | WriterNext::Proceed { .. }), "{next:?}");
    }
    engine.flush_writer(now, &mut w, &mut maps);
    let mut writes = Vec::new();
    let mut program = Writer::new(WriterId(1), GroupId(0));
    for _ in 0..8 {
        engine.anon_fault(now, &mut program, 1024, &mut maps);
        while let Some(action) = engine.poll_action() {
            if let Action::Write { runs, .. } = action {
                writes.push(runs.iter().map(|run| run.count).sum::<u64>());
            }
        }
    }
    (engine, writes)
}

/// A burst of anonymous faults over a file dirtied once and not yet written: `legacy` reclaim
/// keeps each dirty page for one more trip (it was referenced by its write), then writes the
/// pages it meets again one page at a time; its direct reclaim, having scanned more than 1.5
/// times what it wanted, also wakes the flusher for as many pages as it scanned.
/// `flusher-only` direct reclaim writes none and wakes the flusher, which writes them in large
/// requests.
#[test]
fn legacy_reclaim_writes_dirty_pages_on_their_second_trip() {
    let (old, writes) = dirty_file_then_anon_burst(ReclaimPolicy::Legacy, 2048);
    let s = old.stats();
    assert!(s.reclaim_kept_referenced > 0, "first trip kept them: {s:?}");
    assert!(s.kswapd_written + s.direct_written > 0, "second trip wrote them: {s:?}");
    let single = writes.iter().filter(|&&p| p == 1).count() as u64;
    assert!(single >= s.kswapd_written + s.direct_written, "{writes:?}");
    assert!(s.reclaim_flusher_wakeups > 0, "direct reclaim's scan woke the flusher: {s:?}");
    assert!(writes.iter().any(|&p| p > 1), "the flusher wrote: {writes:?}");
    let (new, writes) = dirty_file_then_anon_burst(ReclaimPolicy::FlusherOnly, 2048);
    let s = new.stats();
    assert_eq!(s.direct_written, 0, "{s:?}");
    assert!(s.reclaim_flusher_wakeups > 0, "{s:?}");
    assert!(writes.iter().any(|&p| p > 1), "the flusher wrote: {writes:?}");
}
