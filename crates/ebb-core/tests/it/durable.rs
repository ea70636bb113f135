//! Durability watermarks: pages are durable once a stable write and a later sync of the file,
//! or a matching COMMIT, have put them on stable storage.

use ebb_core::*;

use crate::harness::{Harness, config};

const PAGES: u64 = 4096;

fn written(unstable: Option<u64>) -> Harness {
    let mut h = Harness::new(config(64, ThrottlePolicy::Ioless), &[25_600]);
    h.unstable_backend = unstable;
    h.add_dd(0, PAGES, 256, Instant::ZERO);
    h.run();
    h
}

fn durable(h: &mut Harness) -> Vec<std::ops::Range<u64>> {
    let inode = h.dds[0].inode;
    h.engine.durable_ranges(inode, PAGES * PAGE_SIZE, &mut h.maps)
}

/// Stable writes leave pages clean but not durable until the file is synced after them; a
/// sync whose mark was taken before a write completed does not cover that write.
#[test]
fn stable_writes_are_durable_after_a_sync() {
    let mut h = written(None);
    let inode = h.dds[0].inode;
    assert_eq!(h.engine.meminfo().dirty, 0, "all written back");
    assert_eq!(durable(&mut h), vec![], "written but never synced");
    let mark = h.engine.durable_mark(inode);
    h.request(Event::FileSynced { inode, mark });
    assert_eq!(durable(&mut h), vec![0..PAGES * PAGE_SIZE]);

    // Rewrite the first 16 pages after a mark: a sync with that mark does not cover them.
    let early = h.engine.durable_mark(inode);
    let mut w = Writer::new(WriterId(99), GroupId(0));
    let step = h.maps.with(inode, |m| write_pages(&mut w, inode, m, 0, 16));
    assert_eq!(step.consumed, 16);
    h.engine.flush_writer(h.now, &mut w, &mut h.maps);
    assert_eq!(durable(&mut h), vec![16 * PAGE_SIZE..PAGES * PAGE_SIZE], "dirty pages");
    // The engine's part of the step: the file, clean since the sync, is dirty again.
    assert!(step.inode_became_dirty);
    let next = h.engine.writer_step(h.now, &mut w, WriterInput::Wrote { inode, step }, &mut h.maps);
    assert_eq!(next, WriterNext::Done);
    h.request(Event::Sync { request: RequestId(1) });
    h.run();
    h.request(Event::FileSynced { inode, mark: early });
    assert_eq!(durable(&mut h), vec![16 * PAGE_SIZE..PAGES * PAGE_SIZE], "synced too early");
    let mark = h.engine.durable_mark(inode);
    h.request(Event::FileSynced { inode, mark });
    assert_eq!(durable(&mut h), vec![0..PAGES * PAGE_SIZE]);
}

/// On a two-phase backend a matching COMMIT makes pages durable: no sync of the file needed.
#[test]
fn committed_pages_are_durable() {
    let mut h = written(Some(7));
    assert_eq!(h.engine.meminfo().unstable, 0, "all committed");
    assert_eq!(durable(&mut h), vec![0..PAGES * PAGE_SIZE]);
}
