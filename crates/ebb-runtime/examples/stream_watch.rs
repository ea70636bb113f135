//! Streams into a directory through ebb and prints the cache's state every 100 ms, to see
//! where a streaming writer's time goes: `cargo run --release -p ebb-runtime --example
//! stream_watch -- DIR [GiB [MiB]]`.
#![expect(clippy::print_stdout, reason = "an example that prints what it sees")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: stream_watch DIR [GiB]");
    let gib: u64 = args.next().map_or(2, |s| s.parse().expect("GiB"));
    let mem_mib: u64 = args.next().map_or(256, |s| s.parse().expect("MiB"));
    let threads: usize =
        std::env::var("EBB_IO_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let mut builder = ebb_runtime::Builder::new().memory(mem_mib << 20).io_threads(threads);
    // EBB_KNOBS="name=value,name=value" sets knobs by name.
    for kv in std::env::var("EBB_KNOBS").unwrap_or_default().split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').expect("EBB_KNOBS entries are name=value");
        builder = builder.knob(k, v).map_err(std::io::Error::other)?;
    }
    let ebb = builder.directory(&dir)?.build()?;
    let file = ebb.open("watch", ebb_backend::OpenOptions { create: true, truncate: true })?;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (ebb, stop) = (ebb.clone(), stop.clone());
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let s = ebb.stats();
                let b = &s.bdi[0];
                // Pages (or pages per second) in MiB.
                let mib = |pages: u64| (pages * ebb_core::PAGE_SIZE) >> 20;
                println!(
                    "{:6.1}s dirty {:6} MB wb {:5} MB thresh {} bg {} written {:6} MB (+{:5} MB/s) bw {:5} MB/s avg {:5} MB/s ratelimit {:5} MB/s balanced {:5} MB/s inflight {} wbt {}/{} step {}",
                    start.elapsed().as_secs_f64(),
                    mib(s.meminfo.dirty),
                    mib(s.meminfo.writeback),
                    mib(s.meminfo.thresh),
                    mib(s.meminfo.bg_thresh),
                    mib(b.written),
                    mib(b.written - last) * 10,
                    mib(b.write_bandwidth),
                    mib(b.avg_write_bandwidth),
                    mib(b.dirty_ratelimit),
                    mib(b.balanced_dirty_ratelimit),
                    b.inflight,
                    b.wbt_background,
                    b.wbt_max_depth,
                    b.wbt_step,
                );
                last = b.written;
            }
        })
    };
    let block = vec![7u8; 1 << 20];
    for i in 0..gib * 1024 {
        file.write_at(&block, i << 20)?;
    }
    file.fsync()?;
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("watcher");
    println!("{:?}", file.throttle_stats());
    // The stream is scratch data: leave no multi-GiB file behind.
    file.close()?;
    ebb.remove("watch")
}
