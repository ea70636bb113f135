//! The memory budget holds the cache's frames and the IO threads' buffers together.

use std::sync::Arc;

use ebb_backend::{Backend, MemBackend, OpenOptions};
use ebb_runtime::{Builder, Ebb};

use crate::io::backend_bytes;

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };
const MIB: u64 = 1 << 20;

/// Four writers stream 24 MiB each and read it back while the cache, far smaller, writes back
/// and reclaims all along; afterwards the backend holds every byte.
fn stream_and_check(ebb: &Ebb, backend: Option<&dyn Backend>) {
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                let name = format!("f{t}");
                let f = ebb.open(&name, CREATE).unwrap();
                let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8 ^ t).collect();
                for i in 0..24u64 {
                    f.write_at(&chunk, i * MIB).unwrap();
                }
                let mut back = vec![0u8; MIB as usize];
                for i in 0..24u64 {
                    assert_eq!(f.read_at(&mut back, i * MIB).unwrap(), MIB as usize);
                    assert!(back == chunk, "{name}: MiB {i} read back wrong");
                }
                f.fsync().unwrap();
                f.close().unwrap();
            });
        }
    });
    if let Some(backend) = backend {
        for t in 0..4u8 {
            let data = backend_bytes(backend, &format!("f{t}"));
            assert_eq!(data.len() as u64, 24 * MIB);
            assert!(
                data.chunks(MIB as usize)
                    .all(|c| c.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8 ^ t))
            );
        }
    }
}

/// The engine's frames plus the most IO buffer bytes ever held stay within `budget`, and the
/// buffers were used (so the check saw them).
fn assert_within(ebb: &Ebb, budget: u64) {
    let cache = ebb.config().memory_bytes;
    let bufs = ebb.io_buffers();
    eprintln!(
        "budget {budget}: cache {cache}, buffers reserved {}, peak {}",
        bufs.reserved, bufs.peak
    );
    assert!(bufs.peak > 0, "no IO buffer was counted");
    assert!(bufs.peak <= bufs.reserved, "{bufs:?}");
    assert!(cache + bufs.reserved <= budget, "cache {cache} + {bufs:?} above {budget}");
}

/// Writes of 8 MiB (S3's parts) through a 16 MiB budget and 8 IO threads: the buffers take
/// their share of the budget (one part, not eight), nothing hangs, nothing is lost.
#[test]
fn large_writes_stay_within_a_small_budget() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let ebb = Builder::new()
        .memory(16 * MIB)
        .knob("max_write_pages", "2048")
        .unwrap()
        .backend("mem", backend.clone())
        .build()
        .unwrap();
    stream_and_check(&ebb, Some(&*backend));
    assert_within(&ebb, 16 * MIB);
}

/// A directory's lanes (huge-page buffers queued per file) through the smallest budget that
/// leaves a 4 MiB cache.
#[test]
fn lane_buffers_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ebb = Builder::new().memory(6 * MIB).directory(dir.path()).unwrap().build().unwrap();
    stream_and_check(&ebb, None);
    assert_within(&ebb, 6 * MIB);
    for t in 0..4u8 {
        assert_eq!(std::fs::metadata(dir.path().join(format!("f{t}"))).unwrap().len(), 24 * MIB);
    }
}

/// A budget with no room for a cache beside the IO buffers is refused, naming the numbers.
#[test]
fn a_budget_too_small_for_the_buffers_is_refused() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let err = Builder::new()
        .memory(8 * MIB)
        .knob("max_write_pages", "2048")
        .unwrap()
        .backend("mem", backend)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let text = err.to_string();
    assert!(text.contains("memory_bytes") && text.contains("8388608"), "{text}");
    assert!(text.contains(&(12 * MIB).to_string()), "names the smallest budget: {text}");
}

/// A cache whose backend writes in granules (an object store's parts) stages its writes:
/// `dirty_ratio` 60 and `dirty_background_ratio` 50 by default, still overridden by the
/// user's knobs; other backends keep the kernel's 20 and 10.
#[test]
fn a_granular_backend_gets_the_staging_ratios_unless_knobs_say_otherwise() {
    let granular = || {
        let mut config = ebb_core::BackendConfig::new("parts");
        config.write_granule_bytes = Some(8 * MIB);
        config
    };
    let ratios = |ebb: &Ebb| (ebb.config().dirty_ratio, ebb.config().dirty_background_ratio);
    let staged = Builder::new()
        .backend_with("parts", Arc::new(MemBackend::new()), granular())
        .build()
        .unwrap();
    assert_eq!(ratios(&staged), (60, 50));
    let told = Builder::new()
        .knob("dirty_ratio", "30")
        .unwrap()
        .backend_with("parts", Arc::new(MemBackend::new()), granular())
        .build()
        .unwrap();
    assert_eq!(ratios(&told), (30, 50));
    let plain = Builder::new().backend("mem", Arc::new(MemBackend::new())).build().unwrap();
    assert_eq!(ratios(&plain), (20, 10));
}

/// Open handles that wrote a page each do not keep the cache in their writers' frame reserves
/// (up to 1 MiB each): a writer that finds no memory gets the idle ones' reserves back. Before
/// they were given back, the 13th handle here waited for memory forever (each of the first
/// took a full reserve); the writing thread has a deadline, so a hang fails the test.
#[test]
fn open_handles_reserves_do_not_starve_a_writer() {
    const FILES: usize = 400;
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let ebb = Builder::new().memory(16 * MIB).backend("mem", backend.clone()).build().unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let writer = ebb.clone();
    std::thread::spawn(move || {
        let files: Vec<_> = (0..FILES)
            .map(|i| {
                let f = writer.open(&format!("f{i}"), CREATE).unwrap();
                f.write_at(&[i as u8; 4096], 0).unwrap();
                f
            })
            .collect();
        for f in files {
            f.close().unwrap();
        }
        let _ = done.send(());
    });
    let deadline = std::time::Duration::from_secs(60);
    assert!(
        finished.recv_timeout(deadline).is_ok(),
        "{FILES} open handles writing a page each did not finish within {deadline:?}: {:?}",
        ebb.stats().counters
    );
    let counters = ebb.stats().counters;
    assert!(counters.reserve_sweeps > 0, "the reserves were never short: {counters:?}");
    ebb.sync().unwrap();
    for i in [0, 17, FILES - 1] {
        assert_eq!(backend_bytes(&*backend, &format!("f{i}")), vec![i as u8; 4096]);
    }
}
