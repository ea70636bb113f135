//! Wall-clock cost of the simulator's event queue and device models.
//!
//! The simulator must replay hours of device time quickly, so the per-request cost of the
//! device models and the per-event cost of the queue are budgets, not details. This example
//! measures both in release mode and prints, per model and workload, how many simulated
//! requests it processes per wall-clock second and the simulated throughput they represent.
//!
//! Run: `cargo run --release -p ebb-sim --example device_bench`

#![expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::time::Instant as WallInstant;

use ebb_core::time::{Duration, Instant};
use ebb_sim::device::{Completion, Device, DeviceRequest, IoOp, MODEL_NAMES, by_name};
use ebb_sim::prng::Prng;
use ebb_sim::queue::EventQueue;

fn main() {
    bench_queue();
    println!();
    println!(
        "{:<20} {:<26} {:>9} {:>9} {:>12} {:>12}",
        "model", "workload", "requests", "wall ms", "requests/s", "sim MB/s"
    );
    for name in MODEL_NAMES {
        for workload in WORKLOADS {
            bench_device(name, workload);
        }
    }
}

/// Push+pop pairs on a queue holding about 1000 events, the size of a busy simulation.
fn bench_queue() {
    let mut prng = Prng::new(1);
    let mut queue = EventQueue::with_capacity(2048);
    let mut now = 0u64;
    for _ in 0..1000 {
        queue.push(Instant::from_nanos(prng.below(1_000_000)), 0u64);
    }
    let operations = 20_000_000u64;
    let start = WallInstant::now();
    for index in 0..operations {
        let (at, _) = queue.pop().expect("queue stays full");
        now = now.max(at.as_nanos());
        queue.push(Instant::from_nanos(now + prng.below(1_000_000)), index);
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "event queue: {} push+pop pairs (1000 queued) in {:.0} ms = {:.1} M pairs/s",
        operations,
        seconds * 1e3,
        operations as f64 / seconds / 1e6
    );
}

#[derive(Clone, Copy)]
struct Workload {
    label: &'static str,
    op: IoOp,
    len: u64,
    depth: usize,
    random: bool,
    count: u64,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        label: "seq write 4KiB QD64",
        op: IoOp::Write,
        len: 4096,
        depth: 64,
        random: false,
        count: 400_000,
    },
    Workload {
        label: "seq write 512KiB QD32",
        op: IoOp::Write,
        len: 512 * 1024,
        depth: 32,
        random: false,
        count: 20_000,
    },
    Workload {
        label: "rand read 4KiB QD32",
        op: IoOp::Read,
        len: 4096,
        depth: 32,
        random: true,
        count: 20_000,
    },
];

/// Runs one closed-loop workload and prints its wall-clock and simulated rates.
fn bench_device(name: &str, workload: Workload) {
    let mut device = by_name(name, 1).expect("known model");
    let mut prng = Prng::new(2);
    // Random reads stay within the smallest model's capacity.
    let span_pages = 16_000_000_000 / workload.len;
    let mut next = |index: u64| {
        (index < workload.count).then(|| {
            let page = if workload.random { prng.below(span_pages) } else { index };
            DeviceRequest {
                id: index,
                op: workload.op,
                offset: page * workload.len,
                len: workload.len,
                sync: workload.op == IoOp::Read,
            }
        })
    };
    let start = WallInstant::now();
    let end = closed_loop(device.as_mut(), workload.depth, &mut next);
    let seconds = start.elapsed().as_secs_f64();
    let megabytes = (workload.count * workload.len) as f64 / 1e6;
    println!(
        "{:<20} {:<26} {:>9} {:>9.1} {:>12.0} {:>12.1}",
        name,
        workload.label,
        workload.count,
        seconds * 1e3,
        workload.count as f64 / seconds,
        megabytes / end.as_secs_f64()
    );
}

/// Keeps `depth` requests outstanding until `next` runs dry; returns the simulated end time.
fn closed_loop(
    device: &mut dyn Device,
    depth: usize,
    next: &mut dyn FnMut(u64) -> Option<DeviceRequest>,
) -> Duration {
    let mut now = Instant::ZERO;
    let mut issued = 0;
    let mut outstanding = 0;
    let mut done: Vec<Completion> = Vec::new();
    loop {
        while outstanding < depth {
            let Some(request) = next(issued) else { break };
            device.submit(now, request);
            issued += 1;
            outstanding += 1;
        }
        let Some(at) = device.next_event_time() else { break };
        now = at;
        done.clear();
        device.advance(now, &mut done);
        outstanding -= done.len();
    }
    now.saturating_since(Instant::ZERO)
}
