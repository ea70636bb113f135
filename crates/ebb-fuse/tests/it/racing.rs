//! The stale-page checker through the mount (issue 33, defect 1's class): a writer makes
//! random writes, `fallocate` punches and zeroed ranges, truncates and fsyncs on one file
//! larger than the cache, reading back after each change a range it touched and checking it
//! against a model, while two readers read the same file in short sequential runs (so reads
//! and readahead are in flight across every change) with a cache of a few times the largest
//! operation (pages are evicted and read again all the time). A page read from DIR before a
//! punch, zero or truncate of its range landed must never be installed: the checker finds it
//! when that rule is planted off (`CoreBug::StaleRead`).
//!
//! The same over NFS and S3 mounts, whose backends cannot punch or zero a range (NFSv3 and
//! S3 have no fallocate: `EOPNOTSUPP`): there the writer's punches are a shrink of the file
//! and a regrow to its old size (the same hole, made by two truncates), with smaller
//! operations and file (the network makes each operation slower).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use ebb_core::CoreBug;
use ebb_fuse::DataMode;
use rustix::fs::FallocateFlags;

use super::Fixture;

/// The largest operation, and the largest the file grows.
const OP_MAX: u64 = 1 << 20;
const FILE_MAX: u64 = 12 << 20;
/// The mount's `--memory`: with its fixed reserves this leaves a cache of about 8 MiB, eight
/// times the largest operation and two thirds of the file.
const MEMORY: u64 = 32 << 20;
/// Over NFS and S3, whose every operation crosses the network: smaller operations and file,
/// with the smallest `--memory` these mounts take (a cache of at least 4 MiB, sixteen times
/// the largest operation and the file's size).
const OP_MAX_NET: u64 = 256 << 10;
const FILE_MAX_NET: u64 = 4 << 20;
const MEMORY_NET: u64 = 34 << 20;

/// The sizes of one run.
#[derive(Clone, Copy)]
struct Shape {
    op_max: u64,
    file_max: u64,
    /// Whether the backend punches and zeroes ranges; without, a shrink then a regrow of the
    /// file to its old size makes the same hole.
    fallocate: bool,
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// The backend under the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Over {
    Dir,
    Nfs,
    S3,
}

/// Runs `ops` operations on a fresh mount over `over` (with `bug` planted); the first read
/// that differs from the model, as an error. `None` when the machine cannot mount.
fn check(over: Over, seed: u64, ops: u32, bug: Option<CoreBug>) -> Option<Result<(), String>> {
    let fx = match over {
        Over::Dir => Fixture::new(DataMode::Ebb, Some(MEMORY), &[])?,
        Over::Nfs => Fixture::nfs(Some(MEMORY_NET))?,
        Over::S3 => Fixture::s3(Some(MEMORY_NET))?,
    };
    let shape = match over {
        Over::Dir => Shape { op_max: OP_MAX, file_max: FILE_MAX, fallocate: true },
        _ => Shape { op_max: OP_MAX_NET, file_max: FILE_MAX_NET, fallocate: false },
    };
    if let Some(bug) = bug {
        let planted = fx.mount.as_ref().expect("mounted").plant(bug);
        assert!(planted, "ebb-core's planted-bugs feature is on for these tests");
    }
    let path = fx.mnt.join("data");
    let mut options = OpenOptions::new();
    let file = options.read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    let stop = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        for r in 0..2u64 {
            let reader = std::fs::File::open(&path).unwrap();
            let stop = &stop;
            s.spawn(move || {
                let mut rng = Rng(seed ^ (r + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let mut buf = vec![0u8; 128 << 10];
                while !stop.load(Ordering::Relaxed) {
                    let mut at = rng.below(shape.file_max) & !4095;
                    for _ in 0..1 + rng.below(6) {
                        let len = 4096 * (1 + rng.below(32)) as usize;
                        let _ = reader.read_at(&mut buf[..len], at);
                        at += len as u64;
                    }
                }
            });
        }
        let result = mutate(&file, seed, ops, shape);
        stop.store(true, Ordering::Relaxed);
        result
    });
    drop(file);
    Some(result)
}

/// The writer: writes, punched and zeroed ranges (truncates without `fallocate`), truncates
/// and fsyncs, each followed by a checked read of a range it changed.
fn mutate(file: &std::fs::File, seed: u64, ops: u32, shape: Shape) -> Result<(), String> {
    let Shape { op_max, file_max, fallocate } = shape;
    let mut rng = Rng(seed);
    let mut model: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; op_max as usize];
    // (step, what, start, end) of each change, to say which last touched a differing byte.
    let mut log: Vec<(u32, &str, u64, u64)> = Vec::new();
    for step in 0..ops {
        let off = rng.below(file_max - op_max);
        let len = 1 + rng.below(op_max);
        let (what, check_at) = match rng.below(10) {
            4..=6 if !fallocate => {
                // A hole without fallocate: cut the file at `off`, then grow it back.
                let old = (model.len() as u64).max(off);
                file.set_len(off).map_err(|e| format!("step {step}: shrink: {e}"))?;
                file.set_len(old).map_err(|e| format!("step {step}: regrow: {e}"))?;
                model.resize(off as usize, 0);
                model.resize(old as usize, 0);
                log.push((step, "shrink and regrow", off, old));
                ("shrink and regrow", off)
            }
            0..=3 => {
                let byte = (step % 251) as u8 + 1;
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                file.write_all_at(&data, off).map_err(|e| format!("step {step}: write: {e}"))?;
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
                log.push((step, "write", off, off + len));
                ("write", off)
            }
            4..=6 => {
                let (what, mode) = if rng.below(2) == 0 {
                    ("punch", FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE)
                } else {
                    ("zero", FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE)
                };
                rustix::fs::fallocate(file, mode, off, len)
                    .map_err(|e| format!("step {step}: {what}: {e}"))?;
                let end = ((off + len) as usize).min(model.len());
                if (off as usize) < end {
                    model[off as usize..end].fill(0);
                }
                log.push((step, what, off, off + len));
                (what, off)
            }
            7 => {
                let size = rng.below(file_max);
                file.set_len(size).map_err(|e| format!("step {step}: truncate: {e}"))?;
                log.push((step, "truncate", size.min(model.len() as u64), u64::MAX));
                model.resize(size as usize, 0);
                ("truncate", size.saturating_sub(op_max / 2))
            }
            8 => {
                file.sync_all().map_err(|e| format!("step {step}: fsync: {e}"))?;
                ("fsync", off)
            }
            _ => ("read", off),
        };
        let want_end = (check_at + op_max).min(model.len() as u64).max(check_at);
        let want = model.get(check_at as usize..want_end as usize).unwrap_or(&[]);
        let mut n = 0;
        while n < want.len() {
            match file.read_at(&mut buf[n..want.len()], check_at + n as u64) {
                Ok(0) => break,
                Ok(got) => n += got,
                Err(e) => return Err(format!("step {step}: read: {e}")),
            }
        }
        if n != want.len() || buf[..n] != *want {
            let at = buf[..n].iter().zip(want).position(|(a, b)| a != b).unwrap_or(n);
            let offset = check_at + at as u64;
            let last: Vec<_> =
                log.iter().rev().filter(|c| c.2 <= offset && offset < c.3).take(3).collect();
            return Err(format!(
                "step {step} (after a {what}): read at {check_at} differs from the model at \
                 byte {at} (read {n} of {} bytes; got {:?}, want {:?}; the last changes there, \
                 newest first: {last:?})",
                want.len(),
                buf.get(at),
                want.get(at),
            ));
        }
    }
    Ok(())
}

/// Operations with the rule planted off: the run stops at the first stale read, which came at
/// operations 23, 190 and 284 in three runs here (0.5-1.6 s), and 50 and 720 on 2026-11-29
/// (load 18), so 1,500 leave a wide margin. With the rule on the same seed runs `OPS`, about
/// 400 punched or zeroed ranges and 100 truncates raced by reads in flight (3.8-6 s here).
/// Issue 33's single-threaded checker met defect 1 first at operations 40,977 and 42,879: a
/// single thread races a punch only with what its earlier reads left in flight (readahead).
/// Here two readers keep reads in flight across every change, so this class is found within
/// hundreds of operations, as the planted bug shows at every run.
const OPS_PLANTED: u32 = 1500;
const OPS: u32 = 1000;
/// Over NFS and S3 each operation crosses the network (about 100 ms over NFS, 50 ms over S3
/// here at load 19, with the two readers' requests): 100 operations, about 30 shrinks and
/// regrows and 10 truncates raced by reads in flight, 5-10 s each. The planted stale read is
/// not looked for there: it switches off the rule of punched and zeroed ranges, which these
/// backends cannot make, and leaves the truncate's own (a read in flight across a truncate
/// keeps no page at or past the new end: ebb-core's `keep_below`).
const OPS_NFS: u32 = 100;
const OPS_S3: u32 = 100;

// The checker finds the planted stale read through the mount, and passes with the rule on.
#[test]
fn reads_racing_punches_zeroes_and_truncates_through_the_mount() {
    found_planted_then_clean(Over::Dir, OPS_PLANTED, OPS);
}

/// The planted stale read is found within `planted` operations over `over`; then `ops` pass
/// with the rule on.
fn found_planted_then_clean(over: Over, planted: u32, ops: u32) {
    let start = std::time::Instant::now();
    let Some(found) = check(over, 0x5eed_0002, planted, Some(CoreBug::StaleRead)) else {
        return;
    };
    eprintln!("{over:?} with the bug: {:?}: {found:?}", start.elapsed());
    assert!(
        found.is_err(),
        "{over:?}: the checker must find the planted stale read in {planted} ops"
    );
    let start = std::time::Instant::now();
    check(over, 0x5eed_0002, ops, None).expect("one check").unwrap();
    eprintln!("{over:?} without: {:?}", start.elapsed());
}

// Over NFS: reads racing truncates and writes (NFSv3 cannot punch or zero).
#[test]
fn reads_racing_truncates_over_nfs() {
    let start = std::time::Instant::now();
    check(Over::Nfs, 0x5eed_0003, OPS_NFS, None).map(Result::unwrap);
    eprintln!("Nfs: {OPS_NFS} ops in {:?}", start.elapsed());
}

// Over S3: reads racing truncates and writes (S3 cannot punch or zero).
#[test]
fn reads_racing_truncates_over_s3() {
    let start = std::time::Instant::now();
    check(Over::S3, 0x5eed_0004, OPS_S3, None).map(Result::unwrap);
    eprintln!("S3: {OPS_S3} ops in {:?}", start.elapsed());
}
