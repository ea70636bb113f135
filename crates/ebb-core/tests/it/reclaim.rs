//! Anonymous memory and swap through the engine's public calls: faults take frames, reclaim
//! swaps out to the swap backend when memory is short, completed swap-outs free memory, and the
//! budget always holds.

use ebb_core::reclaim::SWAP_INODE;
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
        let (got, verdict) = engine.anon_fault(now, &mut w, 256.min(pages - granted), &mut maps);
        granted += got;
        if verdict == Verdict::Wait {
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
                Action::Write { io, backend, inode, pages, .. } => {
                    assert_eq!((backend, inode), (BackendId(1), SWAP_INODE), "only swap-outs");
                    assert!((1..=32).contains(&pages), "clusters of at most 32: {pages}");
                    pending.push(io);
                }
                Action::Resume { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        if verdict == Verdict::Wait && pending.is_empty() && !swap {
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
