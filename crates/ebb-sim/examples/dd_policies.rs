//! Runs the ioless-throttling setup (4 GiB, sata-2010, one dd with bs=1M) under each throttle
//! policy and prints the headline metrics and the simulator's speed.
//!
//! `cargo run --release -p ebb-sim --example dd_policies -- [GiB]`
#![expect(clippy::print_stdout, reason = "an example that reports numbers")]

use std::time::Instant as WallClock;

use ebb_core::{BackendConfig, Config, Duration, ThrottlePolicy};
use ebb_sim::run::{DeviceSpec, RunSpec, Workload, run};

fn main() {
    let gib: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let started = WallClock::now();
    let mut pages = 0;
    for policy in [ThrottlePolicy::Legacy, ThrottlePolicy::Bandwidth2010, ThrottlePolicy::Ioless] {
        let mut backend = BackendConfig::new("sda");
        backend.rotational = true;
        backend.write_cache = true;
        let mut config = Config::new(4 << 30, backend);
        config.throttle = policy;
        config.hz = std::env::var("HZ").ok().and_then(|s| s.parse().ok()).unwrap_or(250);
        let spec = RunSpec {
            name: format!("sata/{}", policy.name()),
            config,
            devices: vec![DeviceSpec { model: "sata-2010".into(), overrides: Default::default() }],
            workloads: vec![Workload::Dd {
                backend: 0,
                size_bytes: gib << 30,
                bs_bytes: 1 << 20,
                start: Duration::ZERO,
                fsync: true,
                think: Duration::ZERO,
                truncate: None,
                unlink: false,
            }],
            seed: 1,
            time_limit: Duration::from_secs(3600),
            sample_interval: Duration::from_millis(100),
            steady_from: Duration::from_secs(20),
            settle_within: None,
            trace_dir: None,
            faults: Vec::new(),
            crash: None,
        };
        let t = WallClock::now();
        let r = run(&spec, &mut |_| {}).expect("run");
        pages += r.simulated_pages;
        let m = &r.metrics;
        println!(
            "{:22} {:6.2}s wall  elapsed {:7.1}s  write {:5.1} MB/s  pauses n={} min {:.1} p50 {:.1} mean {:.1} sd {:.1} max {:.1} ms  writer_wb {}  dirty_max {} limit {}  reads/check {:.2}",
            r.name,
            t.elapsed().as_secs_f64(),
            m["elapsed_s"],
            m["write_mb_s"],
            m["pause_count"],
            m.get("pause_ms_min").copied().unwrap_or(0.0),
            m.get("pause_ms_p50").copied().unwrap_or(0.0),
            m.get("pause_ms_mean").copied().unwrap_or(0.0),
            m.get("pause_ms_stddev").copied().unwrap_or(0.0),
            m.get("pause_ms_max").copied().unwrap_or(0.0),
            m["writer_writeback_pages"],
            m["dirty_pages_max"],
            m["dirty_limit_pages"],
            m["global_counter_reads_per_check"],
        );
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "total {wall:.2}s wall, {pages} simulated pages, {:.2} M pages/s",
        pages as f64 / wall / 1e6
    );
}
