//! `dirty_seconds`: a slow backend beside a fast one holds no more unwritten data than it
//! writes in that many seconds of its measured bandwidth; without the cap its writer fills the
//! cache's freerun room.

use std::sync::Arc;
use std::time::Duration;

use ebb_backend::{Backend, FaultOp, FaultyBackend, MemBackend, OpenOptions};
use ebb_core::{BackendConfig, InitialBandwidth, PAGE_SIZE};
use ebb_runtime::Builder;

const CREATE: OpenOptions = OpenOptions { create: true, truncate: true };
const FILE: usize = 8 << 20;
/// The slow backend writes 128 KiB per 40 ms, one at a time: about 3.3 MB/s.
const SLOW_BW: u64 = (128 << 10) * 25;

/// Writes `FILE` bytes to the slow backend and returns the most pages it held unwritten (dirty,
/// under writeback) at a sample, with the cap `dirty_seconds` x its bandwidth estimate then.
fn slow_writer(dirty_seconds: u64) -> (u64, u64) {
    let slow = Arc::new(FaultyBackend::new(MemBackend::new()));
    slow.plan().delay(FaultOp::Write, Duration::from_millis(40));
    let slow: Arc<dyn Backend> = slow;
    let mut config = BackendConfig::new("slow");
    config.max_write_pages = 32;
    config.queue_depth = 1;
    config.dirty_seconds = dirty_seconds;
    config.initial_write_bandwidth = InitialBandwidth::Rate(SLOW_BW);
    let ebb = Builder::new()
        .memory(64 << 20)
        .backend("fast", Arc::new(MemBackend::new()))
        .backend_with("slow", slow, config)
        .build()
        .unwrap();
    let file = Arc::new(ebb.open_in("slow", "f", CREATE).unwrap());
    let writer = {
        let file = file.clone();
        std::thread::spawn(move || file.write_at(&vec![3u8; FILE], 0).unwrap())
    };
    let (mut held_max, mut cap_at_max) = (0, 0);
    // Sampled once more after the writer returns: without the cap it may finish before the
    // first sample (its 8 MiB fit the freerun room), and what it left unwritten is still
    // held then (the slow backend needs seconds for it).
    loop {
        let finished = writer.is_finished();
        let stats = ebb.stats();
        let bdi = &stats.bdi[1];
        let held = bdi.dirty + bdi.writeback;
        if held > held_max {
            held_max = held;
            cap_at_max = dirty_seconds * bdi.avg_write_bandwidth;
        }
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(writer.join().unwrap(), FILE);
    (held_max, cap_at_max)
}

#[test]
fn dirty_seconds_bounds_a_slow_backends_unwritten_data() {
    let (kernel, _) = slow_writer(0);
    let (capped, cap) = slow_writer(1);
    let mib = |pages: u64| pages as f64 * PAGE_SIZE as f64 / f64::from(1 << 20);
    // The bound, and what a writer may dirty past it before its next check (its batch) plus
    // the writes in flight.
    let slack = 256;
    assert!(
        capped <= cap + slack,
        "the slow backend held {:.1} MiB against a cap of {:.1} MiB",
        mib(capped),
        mib(cap)
    );
    // The precondition: without the cap the same writer holds much more.
    assert!(
        kernel >= 2 * capped,
        "without the cap {:.1} MiB, with it {:.1} MiB",
        mib(kernel),
        mib(capped)
    );
}
