//! Which requests the request loops answer themselves (docs/fuse-requests.md), seen in
//! `ebb stat`'s `fuse` object: requests by kind, answered on the loop, handed to a pool.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use ebb_fuse::DataMode;

use crate::{Fixture, read_range};

/// The mount's `fuse` counters now.
fn counts(fx: &Fixture) -> serde_json::Value {
    let stats = fx.mount.as_ref().expect("mounted").stats_json();
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats are JSON");
    stats["fuse"].clone()
}

/// How much the counter at `path` grew from `before` to `after` (absent counts as 0).
fn grew(before: &serde_json::Value, after: &serde_json::Value, path: [&str; 2]) -> u64 {
    let at = |v: &serde_json::Value| v[path[0]][path[1]].as_u64().unwrap_or(0);
    at(after) - at(before)
}

// A read of pages the cache does not hold goes to the read pool; the same pages read again
// are answered on the request loop, with the same bytes; a small write the throttle lets
// through is answered on the loop too, and a cached read after it sees its bytes; an O_DIRECT
// read of a local directory's file is answered on the loop. (Before, every read was a
// read-pool job.)
#[test]
fn reads_of_cached_pages_are_answered_on_the_request_loop() {
    let Some(fx) = Fixture::new(DataMode::Ebb, Some(64 << 20), &[]) else { return };
    let mut data: Vec<u8> = (0..64u32 << 10).map(|i| (i % 251) as u8).collect();
    // Written to the backend's directory, so none of it is in ebb's cache.
    std::fs::write(fx.dir.join("r"), &data).unwrap();
    let file = File::open(fx.mnt.join("r")).unwrap();
    let start = counts(&fx);
    assert!(read_range(&file, 4096, 8192) == data[4096..12288], "the first read's bytes");
    let missed = counts(&fx);
    assert_eq!(grew(&start, &missed, ["requests", "read"]), 1, "{missed}");
    assert_eq!(grew(&start, &missed, ["pool_jobs", "read"]), 1, "a miss is a pool job: {missed}");
    assert_eq!(grew(&start, &missed, ["on_loop", "read"]), 0, "{missed}");

    assert!(read_range(&file, 4196, 8000) == data[4196..12196], "the cached read's bytes");
    let hit = counts(&fx);
    assert_eq!(grew(&missed, &hit, ["requests", "read"]), 1, "{hit}");
    assert_eq!(grew(&missed, &hit, ["on_loop", "read"]), 1, "a hit is answered on the loop");
    assert_eq!(grew(&missed, &hit, ["pool_jobs", "read"]), 0, "{hit}");

    let writer = OpenOptions::new().write(true).open(fx.mnt.join("r")).unwrap();
    let written = counts(&fx);
    writer.write_all_at(b"new bytes", 5000).unwrap();
    data[5000..5009].copy_from_slice(b"new bytes");
    let after_write = counts(&fx);
    assert_eq!(grew(&written, &after_write, ["requests", "write"]), 1, "{after_write}");
    assert_eq!(grew(&written, &after_write, ["on_loop", "write"]), 1, "{after_write}");
    assert!(read_range(&file, 4096, 8192) == data[4096..12288], "the write's bytes are read");
    let reread = counts(&fx);
    assert_eq!(grew(&after_write, &reread, ["on_loop", "read"]), 1, "{reread}");

    // An O_DIRECT read of pages the cache does not hold, from a local directory: a pread of
    // the backend file, on the loop too.
    let direct =
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(fx.mnt.join("r")).unwrap();
    let opened = counts(&fx);
    let mut raw = vec![0u8; 8192 + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let aligned = &mut raw[start..start + 8192];
    assert_eq!(direct.read_at(aligned, 32 << 10).unwrap(), 8192);
    assert!(*aligned == data[32 << 10..40 << 10], "the direct read's bytes");
    let direct_read = counts(&fx);
    assert_eq!(grew(&opened, &direct_read, ["requests", "read"]), 1, "{direct_read}");
    assert_eq!(grew(&opened, &direct_read, ["on_loop", "read"]), 1, "{direct_read}");
    assert_eq!(grew(&opened, &direct_read, ["pool_jobs", "read"]), 0, "{direct_read}");
    let reread = counts(&fx);

    // Past the end of the file: nothing, answered on the loop if the kernel asks at all.
    assert!(read_range(&file, 1 << 20, 4096).is_empty());
    let past = counts(&fx);
    let asked = grew(&reread, &past, ["requests", "read"]);
    assert_eq!(grew(&reread, &past, ["on_loop", "read"]), asked, "{past}");
}

/// The requests of every kind that grew from `before` to `after`, summed.
fn all_requests(before: &serde_json::Value, after: &serde_json::Value) -> u64 {
    let kinds = after["requests"].as_object().expect("requests by kind");
    kinds.keys().map(|kind| grew(before, after, ["requests", kind])).sum()
}

// A small file's life on a local directory (create, write 4 KiB, close, stat, unlink: the
// files-per-second bench, `scripts/bench-files`) is answered on the request loops: no
// hand-off to a pool thread per file, where there were six (lookup, create, getattr and
// unlink on the guard's pool, flush and release on the write pool: each a thread's wake-up
// and two context switches, which on a loaded machine made a file cost milliseconds), and
// no more requests per file than the kernel sends for it.
#[test]
fn a_small_file_s_life_is_answered_on_the_request_loops() {
    let Some(fx) = Fixture::new(DataMode::Ebb, Some(64 << 20), &[]) else { return };
    const FILES: u64 = 200;
    let dir = fx.mnt.join("small");
    std::fs::create_dir(&dir).unwrap();
    let before = counts(&fx);
    for i in 0..FILES {
        let path = dir.join(format!("f{i}"));
        std::fs::write(&path, [7u8; 4096]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096, "{}", path.display());
        std::fs::remove_file(&path).unwrap();
    }
    let after = counts(&fx);
    let jobs = grew(&before, &after, ["pool_jobs", "meta"])
        + grew(&before, &after, ["pool_jobs", "write"]);
    assert!(jobs <= FILES / 20, "{jobs} pool jobs for {FILES} files: {after}");
    for kind in ["create", "unlink"] {
        assert_eq!(grew(&before, &after, ["requests", kind]), FILES, "{kind}: {after}");
    }
    // A child that another test of this process forks while a file here is open inherits its
    // descriptor and closes it at its exec: one FLUSH more, not this file's cost.
    let flushes = grew(&before, &after, ["requests", "flush"]);
    assert!(flushes >= FILES, "{flushes} flushes: {after}");
    let on_loop = grew(&before, &after, ["on_loop", "meta"]);
    assert!(on_loop >= 3 * FILES, "{on_loop} namespace requests on the loop: {after}");
    assert!(grew(&before, &after, ["on_loop", "flush"]) >= FILES, "{after}");
    // What the kernel sends for one: lookup, create, write, flush, release, unlink, forget and
    // three getattr (the file's after its write, the directory's before the create and the
    // unlink, which changed it); one more lookup where the name's entry expired meanwhile.
    let requests = all_requests(&before, &after) - (flushes - FILES);
    assert!(requests <= 11 * FILES, "{requests} requests for {FILES} files: {after}");
}
