//! Unit tests of the page map's range operations and counts.

use super::*;

fn frames(n: u32) -> Vec<FrameId> {
    (0..n).rev().map(FrameId).collect()
}

/// Writing new pages takes frames, dirties them, and keeps counts equal to a recount.
#[test]
fn dirty_new_pages_takes_frames_and_counts() {
    let mut map = PageMap::new();
    let mut reserve = frames(1000);
    let mut added = Vec::new();
    let out = map.dirty_range(10, 600, u64::MAX, &mut reserve, &mut added);
    assert_eq!(out.stop, DirtyStop::Done);
    assert_eq!(out.consumed, 600);
    assert_eq!(out.dirtied, 600);
    assert_eq!(out.new_pages, 600);
    assert!(out.inode_became_dirty);
    assert_eq!(added.len(), 600);
    assert_eq!(reserve.len(), 400);
    assert_eq!(map.counts().dirty, 600);
    assert_eq!(map.counts(), map.recount());
    // Rewriting dirty pages is not a new dirtying.
    let again = map.dirty_range(10, 600, u64::MAX, &mut reserve, &mut added);
    assert_eq!(again.dirtied, 0);
    assert!(!again.inode_became_dirty);
}

/// The writer stops exactly when it has dirtied `max_dirtied` pages, as the kernel's check does.
#[test]
fn dirty_range_stops_at_the_limit_and_when_frames_run_out() {
    let mut map = PageMap::new();
    let mut reserve = frames(100);
    let mut added = Vec::new();
    let out = map.dirty_range(0, 1000, 32, &mut reserve, &mut added);
    assert_eq!((out.consumed, out.dirtied, out.stop), (32, 32, DirtyStop::Limit));
    let out = map.dirty_range(32, 1000, u64::MAX, &mut reserve, &mut added);
    assert_eq!((out.consumed, out.stop), (68, DirtyStop::NeedFrames));
    assert_eq!(map.counts().resident, 100);
}

/// Writeback takes contiguous dirty runs up to the cap, and a write to a page under writeback
/// waits for it.
#[test]
fn writeback_runs_are_contiguous_and_capped() {
    let mut map = PageMap::new();
    let mut reserve = frames(2000);
    let mut added = Vec::new();
    map.dirty_range(0, 300, u64::MAX, &mut reserve, &mut added);
    map.dirty_range(400, 100, u64::MAX, &mut reserve, &mut added);
    let a = map.start_writeback(0, 128, false, true).unwrap();
    assert_eq!(a, Run { first: 0, count: 128 });
    let b = map.start_writeback(a.end(), 1000, false, true).unwrap();
    assert_eq!(b, Run { first: 128, count: 172 });
    let c = map.start_writeback(b.end(), 1000, false, true).unwrap();
    assert_eq!(c, Run { first: 400, count: 100 });
    assert_eq!(map.start_writeback(c.end(), 1000, false, true), None);
    assert_eq!(map.counts().writeback, 400);
    let out = map.dirty_range(5, 1, u64::MAX, &mut reserve, &mut added);
    assert_eq!(out.stop, DirtyStop::Busy(5));
    let end = map.end_writeback(a, WriteEnd::Stable);
    assert_eq!(end.cleaned, 128);
    assert_eq!(map.counts().clean, 128);
    assert_eq!(map.counts(), map.recount());
}

/// Tagged writeback writes only the pages dirty when the sync started (livelock avoidance).
#[test]
fn tagged_writeback_ignores_later_dirtying() {
    let mut map = PageMap::new();
    let mut reserve = frames(2000);
    let mut added = Vec::new();
    map.dirty_range(0, 10, u64::MAX, &mut reserve, &mut added);
    assert_eq!(map.tag_dirty(), 10);
    map.dirty_range(10, 10, u64::MAX, &mut reserve, &mut added);
    let run = map.start_writeback(0, 1000, true, false).unwrap();
    assert_eq!(run, Run { first: 0, count: 10 });
    assert_eq!(map.counts().tagged, 0);
    assert_eq!(map.start_writeback(0, 1000, true, false), None);
    assert_eq!(map.counts().dirty, 10);
}

/// Unstable pages are cleaned by a matching commit and redirtied by a mismatching one; a page
/// rewritten during the commit stays dirty.
#[test]
fn commit_resolution_follows_the_verifier() {
    let mut map = PageMap::new();
    let mut reserve = frames(100);
    let mut added = Vec::new();
    map.dirty_range(0, 20, u64::MAX, &mut reserve, &mut added);
    let run = map.start_writeback(0, 100, false, true).unwrap();
    map.end_writeback(Run { first: 0, count: 10 }, WriteEnd::Unstable(1));
    map.end_writeback(Run { first: 10, count: 10 }, WriteEnd::Unstable(2));
    assert_eq!(run.count, 20);
    let batch = map.begin_commit();
    assert_eq!(batch.runs, vec![Run { first: 0, count: 20 }]);
    map.dirty_range(0, 1, u64::MAX, &mut reserve, &mut added);
    let out = map.resolve_commit(&batch, |v| v == 2);
    assert_eq!(out.cleaned, 10);
    assert_eq!(out.redirtied, 9);
    assert_eq!(map.counts().dirty, 10);
    assert_eq!(map.counts().clean, 10);
    assert_eq!(map.counts(), map.recount());
}

/// COMMITs may overlap: each covers only the unstable pages no earlier COMMIT in flight
/// covers, and resolves only those; a page rewritten and written again after a COMMIT was sent
/// is not cleaned by that COMMIT.
#[test]
fn overlapping_commits_cover_disjoint_pages() {
    let mut map = PageMap::new();
    let mut reserve = frames(100);
    let mut added = Vec::new();
    map.dirty_range(0, 30, u64::MAX, &mut reserve, &mut added);
    let first = map.start_writeback(0, 10, false, true).unwrap();
    map.end_writeback(first, WriteEnd::Unstable(0));
    let a = map.begin_commit();
    assert_eq!(a.runs, vec![Run { first: 0, count: 10 }]);
    assert_eq!(map.begin_commit().pages(), 0, "nothing new to commit");
    let second = map.start_writeback(10, 20, false, true).unwrap();
    map.end_writeback(second, WriteEnd::Unstable(0));
    // Page 5 is rewritten and written again while COMMIT a is in flight.
    map.dirty_range(5, 1, u64::MAX, &mut reserve, &mut added);
    let again = map.start_writeback(5, 1, false, true).unwrap();
    map.end_writeback(again, WriteEnd::Unstable(0));
    let b = map.begin_commit();
    assert_eq!(b.runs, vec![Run { first: 5, count: 1 }, Run { first: 10, count: 20 }]);
    let out = map.resolve_commit(&a, |_| true);
    assert_eq!((out.cleaned, out.redirtied), (9, 0));
    assert_eq!(map.counts().unstable, 21);
    let out = map.resolve_commit(&b, |_| true);
    assert_eq!((out.cleaned, out.redirtied), (21, 0));
    assert_eq!(map.counts().clean, 30);
    assert_eq!(map.counts(), map.recount());
}

/// Truncate frees clean and dirty pages at once and frees pages under writeback when their
/// write completes.
#[test]
fn truncate_dooms_pages_in_flight() {
    let mut map = PageMap::new();
    let mut reserve = frames(100);
    let mut added = Vec::new();
    map.dirty_range(0, 30, u64::MAX, &mut reserve, &mut added);
    let run = map.start_writeback(10, 10, false, true).unwrap();
    let out = map.truncate(5);
    assert_eq!((out.dirty, out.doomed), (15, 10));
    assert_eq!(out.freed_frames.len(), 15);
    let end = map.end_writeback(run, WriteEnd::Stable);
    assert_eq!(end.freed, 10);
    assert_eq!(map.counts().resident, 5);
    assert_eq!(map.counts(), map.recount());
}

/// Reads report missing runs and mark hits referenced; eviction takes only clean pages.
#[test]
fn lookup_insert_and_evict() {
    let mut map = PageMap::new();
    let mut reserve = frames(100);
    let mut added = Vec::new();
    map.dirty_range(4, 2, u64::MAX, &mut reserve, &mut added);
    let mut missing = Vec::new();
    assert_eq!(map.lookup(0, 10, &mut missing), 2);
    assert_eq!(missing, vec![Run { first: 0, count: 4 }, Run { first: 6, count: 4 }]);
    let batch: Vec<FrameId> = reserve.drain(..10).collect();
    let (inserted, unused) = map.insert_clean(0, &batch);
    assert_eq!(inserted.len(), 8);
    assert_eq!(unused, vec![batch[4], batch[5]]);
    assert!(inserted.contains(&(batch[7], 7)), "page first + i gets frames[i]");
    assert!(map.page(4).unwrap().flags & flag::REFERENCED != 0);
    assert_eq!(map.evict(4), None);
    assert!(map.evict(0).is_some());
    assert_eq!(map.counts().resident, 9);
}

/// The transitions every operation makes are legal ones, and the states a page may not jump
/// between are not (under writeback only through the write's end).
#[test]
fn legal_transitions_by_hand() {
    use PageState::{Clean, Dirty, Unstable, Writeback};
    assert!(legal_transition(None, Some(Dirty)));
    assert!(legal_transition(Some(Dirty), Some(Writeback)));
    assert!(legal_transition(Some(Writeback), Some(Unstable)));
    assert!(legal_transition(Some(Unstable), Some(Clean)));
    assert!(!legal_transition(None, Some(Writeback)));
    assert!(!legal_transition(Some(Clean), Some(Writeback)));
    assert!(!legal_transition(Some(Dirty), Some(Clean)));
    assert!(!legal_transition(Some(Writeback), Some(Writeback)));
}

/// Planted: a clean page moved straight to writeback (no operation does this; the test calls
/// the bookkeeping by hand) is caught where it happens.
#[test]
#[should_panic(expected = "page state Some(Clean) -> Some(Writeback) is no legal transition")]
fn an_illegal_transition_is_caught() {
    let mut map = PageMap::new();
    let (inserted, _) = map.insert_clean(0, &frames(1));
    assert_eq!(inserted.len(), 1);
    let chunk = map.chunk_for(0, false).expect("resident");
    map.transition(chunk, 0, PageState::Writeback as u8);
}
