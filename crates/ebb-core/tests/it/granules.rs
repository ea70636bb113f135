//! Write granules (the flusher's module doc): on a backend that can only replace its pieces
//! whole (an S3 upload's parts), each piece goes out in one write and is written once, and the
//! piece a writer is still filling waits for it, but never so long or so much that data stays
//! unwritten past what the kernel's rules allow.

use std::collections::BTreeMap;

use ebb_core::*;

use crate::harness::*;

/// Pages per granule (256 KiB).
const GRANULE: u64 = 64;

/// A cache of 2 MiB background threshold and 4 MiB limit, writing to a backend of 256 KiB
/// granules whose largest write (16 pages) is smaller than a granule.
fn granular() -> Config {
    let mut c = config(256, ThrottlePolicy::Ioless);
    c.dirty_background_bytes = 2 << 20;
    c.dirty_bytes = 4 << 20;
    c.backends[0].write_granule_bytes = Some(GRANULE * PAGE_SIZE);
    c.backends[0].max_write_pages = 16;
    c
}

/// How many writes (actions, of one run or several) touched each (file, granule); panics on a
/// write that crosses a granule.
fn writes_per_granule(h: &Harness) -> BTreeMap<(InodeId, u64), u32> {
    let mut count = BTreeMap::new();
    let mut runs = h.writes.iter();
    for action in &h.write_actions {
        let mut granule = None;
        for _ in action {
            let &(inode, first, pages) = runs.next().expect("one entry of writes per run");
            let g = first / GRANULE;
            assert_eq!(
                (first + pages - 1) / GRANULE,
                g,
                "the write of pages {first}..{} crosses a granule end",
                first + pages
            );
            assert!(granule.is_none_or(|x| x == (inode, g)), "one write, one granule");
            granule = Some((inode, g));
        }
        *count.entry(granule.expect("a write has runs")).or_insert(0) += 1;
    }
    count
}

/// A dd of 1000 pages (15 granules and 40 pages) on a device slower than it: the flusher's
/// chunks reach the end of what the dd has written again and again, yet every granule,
/// including the last one fsync writes, goes out in exactly one write, each as large as the
/// granule however small `max_write_pages` is.
#[test]
fn a_sequential_writer_writes_each_granule_once_in_one_write() {
    let mut h = Harness::new(granular(), &[2_000]);
    let dd = h.add_dd(0, 1000, 8, Instant::ZERO);
    h.run_until(secs(10));
    assert!(h.dds[dd].done_at.is_some(), "the dd finished");
    assert!(h.writes.len() > 3, "background writeback ran while the dd wrote");
    let inode = h.dds[dd].inode;
    h.request(Event::Fsync { handle: h.dds[dd].handle, request: RequestId(1) });
    h.run_until(secs(20));
    assert_eq!(h.done_requests.get(&RequestId(1)), Some(&Ok(())));
    let counts = writes_per_granule(&h);
    let expected: BTreeMap<(InodeId, u64), u32> = (0..16).map(|g| ((inode, g), 1)).collect();
    assert_eq!(counts, expected, "writes per granule");
    for &(_, first, pages) in &h.writes {
        assert_eq!(pages, if first == 960 { 40 } else { GRANULE }, "the write at page {first}");
    }
    assert_eq!(h.maps.get(inode).unwrap().counts().dirty, 0);
}

/// The last, partly written granule of a file nobody writes any more is written by periodic
/// writeback once the file has been idle for the expire interval (30 s), without fsync.
#[test]
fn the_tail_of_an_idle_file_is_written_after_the_expire_interval() {
    let mut h = Harness::new(granular(), &[2_000]);
    let dd = h.add_dd(0, 1000, 8, Instant::ZERO);
    h.run_until(secs(20));
    let inode = h.dds[dd].inode;
    let dirty = h.maps.get(inode).unwrap().counts().dirty;
    assert!(dirty >= 40, "the tail waits while the file is young ({dirty} pages dirty)");
    h.run_until(secs(60));
    assert_eq!(h.maps.get(inode).unwrap().counts().dirty, 0, "written once idle");
    assert!(writes_per_granule(&h).values().all(|&n| n == 1));
}

/// Sixteen files whose tails (36 pages each, 576 in all) would hold more than the background
/// threshold (512 pages): tails are deferred only while all of them fit in half of it, so
/// background writeback still brings the dirty pages under the threshold.
#[test]
fn many_files_tails_never_hold_the_cache_over_the_background_threshold() {
    let mut h = Harness::new(granular(), &[2_000]);
    for _ in 0..16 {
        h.add_dd(0, 100, 4, Instant::ZERO);
    }
    h.run_until(secs(20));
    assert!(h.dds.iter().all(|dd| dd.done_at.is_some()), "every dd finished");
    let info = h.engine.meminfo();
    assert!(
        info.dirty <= info.bg_thresh,
        "{} dirty pages over the background threshold {}",
        info.dirty,
        info.bg_thresh
    );
    writes_per_granule(&h);
}

/// Twenty-four sequential writers whose filling granules (24 x 64 pages) would need three
/// times the background threshold: the granule gate lets four files fill theirs at a time
/// (half the threshold), the others wait their turn, and every granule but the first of each
/// file is written once, whole. The first may go out in up to three writes: a writer's pages
/// before its first check (32) are not yet the gate's, and this small cache's tail rule
/// (half the threshold over 25 files, 10 pages) does not keep them. Without the gate every writer advances together, no granule fills,
/// and the tails go out short again and again.
#[test]
fn many_writers_take_turns_so_that_each_granule_is_written_once() {
    let mut h = Harness::new(granular(), &[2_000]);
    for _ in 0..24 {
        h.add_dd(0, 5 * GRANULE, 8, Instant::ZERO);
    }
    h.run_until(secs(60));
    assert!(h.dds.iter().all(|dd| dd.done_at.is_some()), "every writer finished");
    assert!(h.engine.stats().granule_gate_waits >= 20, "writers waited for their turn");
    for i in 0..h.dds.len() {
        let request = RequestId(i as u64 + 1);
        h.request(Event::Fsync { handle: h.dds[i].handle, request });
    }
    h.run_until(secs(120));
    let counts = writes_per_granule(&h);
    for dd in &h.dds {
        for granule in 0..5 {
            let writes = counts.get(&(dd.inode, granule)).copied().unwrap_or(0);
            let most = if granule == 0 { 3 } else { 1 };
            assert!(
                (1..=most).contains(&writes),
                "granule {granule} of {:?} was written {writes} times",
                dd.inode
            );
        }
        assert_eq!(h.maps.get(dd.inode).unwrap().counts().dirty, 0);
    }
}

/// A writer that jumps to the very page where the gate asked it to stop for a check (the end
/// of the granule it was filling) gets its check and then writes on: the stop moves past the
/// granule it stands at, however it got there.
#[test]
fn a_writer_that_jumps_to_its_stop_writes_on_after_one_check() {
    let mut h = Harness::new(granular(), &[2_000]);
    let dd = h.add_dd(0, 1, 1, Instant::from_nanos(u64::MAX));
    let (inode, now) = (h.dds[dd].inode, Instant::ZERO);
    let mut w = Writer::new(WriterId(99), GroupId(0));
    // Its first check hands it frames.
    check(&mut h.engine, now, &mut w, inode, &mut h.maps);
    let step = h.maps.with(inode, |m| write_pages(&mut w, inode, m, 0, 40));
    assert_eq!((step.consumed, step.next), (32, NextStep::Check));
    let next = h.engine.writer_step(now, &mut w, WriterInput::Wrote { inode, step }, &mut h.maps);
    assert!(matches!(next, WriterNext::Proceed { .. }), "{next:?}");
    // The stop is at the granule's end, page 64: a write there stops first.
    let step = h.maps.with(inode, |m| write_pages(&mut w, inode, m, GRANULE, 8));
    assert_eq!((step.consumed, step.next), (0, NextStep::Check));
    let next = h.engine.writer_step(now, &mut w, WriterInput::Wrote { inode, step }, &mut h.maps);
    assert!(matches!(next, WriterNext::Proceed { .. }), "{next:?}");
    let step = h.maps.with(inode, |m| write_pages(&mut w, inode, m, GRANULE, 8));
    assert_eq!(step.consumed, 8, "the writer goes on after its check");
}

/// Scattered dirty pages of one granule (a random overwrite) go out as ONE write of several
/// runs at fsync, not one write per stretch of dirty pages: on S3 each further write of a part
/// forced a commit that copied every other part of the object (issue 39).
#[test]
fn an_fsync_writes_a_granule_with_scattered_dirty_pages_in_one_write() {
    let mut h = Harness::new(granular(), &[2_000]);
    let dd = h.add_dd(0, 1, 1, Instant::from_nanos(u64::MAX));
    let (inode, now) = (h.dds[dd].inode, Instant::ZERO);
    let mut w = Writer::new(WriterId(99), GroupId(0));
    for page in [3, 10, 11, 40, GRANULE + 6] {
        let next = check(&mut h.engine, now, &mut w, inode, &mut h.maps);
        assert!(matches!(next, WriterNext::Proceed { .. }), "{next:?}");
        let step = h.maps.with(inode, |m| write_pages(&mut w, inode, m, page, 1));
        assert_eq!(step.consumed, 1, "page {page}");
    }
    h.request(Event::Fsync { handle: h.dds[dd].handle, request: RequestId(1) });
    h.run_until(secs(5));
    assert_eq!(h.done_requests.get(&RequestId(1)), Some(&Ok(())));
    let run = |first, count| Run { first, count };
    assert_eq!(
        h.write_actions,
        vec![vec![run(3, 1), run(10, 2), run(40, 1)], vec![run(GRANULE + 6, 1)]],
        "one write per granule, of its dirty runs"
    );
    assert_eq!(h.maps.get(inode).unwrap().counts().dirty, 0);
}
